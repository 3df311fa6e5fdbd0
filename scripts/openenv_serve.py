"""Serve OpenEnv's echo environment on 127.0.0.1: openenv-core's own FastAPI app (`create_app`, the
WebSocket /ws sessions, /health) around the echo_env classes that scripts/openenv-venv installs.

Run by .venv-openenv's python, never by the farm's (envs/openenv/server.py starts it):

    .venv-openenv/bin/python scripts/openenv_serve.py --port 8000 --max-sessions 64

Prints `PORT <n>` once the socket is bound (port 0: a free one), then serves until SIGTERM or
SIGINT. A port it cannot bind is one line on stderr and exit 2, before any import of OpenEnv.
`--max-sessions` is openenv-core's max_concurrent_envs: each WebSocket is one session with an
environment instance of its own, and one more connection is answered CAPACITY_REACHED.
"""

from __future__ import annotations

import argparse
import socket
import sys

EXIT_PORT_TAKEN = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64)
    args = parser.parse_args(argv)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT, not one in use
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as exc:
        print(f"openenv_serve: cannot bind 127.0.0.1:{args.port}: {exc.strerror}", file=sys.stderr)
        return EXIT_PORT_TAKEN

    import uvicorn
    from echo_env.models import EchoAction, EchoObservation
    from echo_env.server.echo_env_environment import EchoEnvironment
    from openenv.core.env_server.http_server import create_app

    app = create_app(
        EchoEnvironment, EchoAction, EchoObservation, env_name="echo_env", max_concurrent_envs=args.max_sessions
    )
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
