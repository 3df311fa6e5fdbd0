"""Serve one of NeMo Gym's own example resource servers, from the installed nemo-gym package, on
127.0.0.1 at a free port; prints `PORT <n>` once the socket is bound, then serves until killed.

Run by .venv-nemo-gym's python (scripts/nemo-gym-venv builds it), never by the farm's:

    .venv-nemo-gym/bin/python tests/nemo_gym_serve.py example_session_state_mgmt

The server is built as NeMo Gym's `run_webserver` builds it (its `setup_webserver`: the session
middleware, /seed_session, /verify, the tools' routes; then the liveness routes, the exception
middleware that hands a tool's exception to the model, FastAPI's validation handler), minus what
only a full NeMo Gym deployment has: the head server and its global config. The examples called
here use no other server, so their server client is a stub, as in NeMo Gym's own tests.
"""

from __future__ import annotations

import importlib
import socket
import sys
from unittest.mock import MagicMock

import uvicorn
from fastapi.exceptions import RequestValidationError
from nemo_gym.server_utils import ServerClient, _validation_exception_handler

EXAMPLES = {
    "example_session_state_mgmt": ("StatefulCounterResourcesServer", "StatefulCounterResourcesServerConfig"),
    "example_single_tool_call": ("SimpleWeatherResourcesServer", "SimpleWeatherResourcesServerConfig"),
}


def main(example: str) -> None:
    module = importlib.import_module(f"resources_servers.{example}.app")
    server_name, config_name = EXAMPLES[example]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = getattr(module, config_name)(host="127.0.0.1", port=port, entrypoint="app.py", name=example)
    server = getattr(module, server_name)(config=config, server_client=MagicMock(spec=ServerClient))
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_exception_middleware(app)
    app.exception_handler(RequestValidationError)(_validation_exception_handler)
    print(f"PORT {port}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1])
