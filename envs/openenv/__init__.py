"""OpenEnv environments through TRL's `environment_factory` contract (docs/openenv.md).

The environment runs in an OpenEnv server of its own (openenv-core's FastAPI app, in
.venv-openenv: scripts/openenv-venv, scripts/openenv_serve.py); the farm's side is a TRL class
per environment whose tools step an OpenEnv session, the same class GRPOTrainer takes.

- `echo`: EchoToolEnv, TRL's OpenEnv echo example (the `echo` tool; the environment's reward);
- `client`: OpenEnv's WebSocket protocol, synchronous, with `websockets` only;
- `server`: the local server's start and stop (`echo_server`, `python -m envs.openenv`).

Errors: OpenEnvError (client: unreachable, session closed or refused, an error answer) and
OpenEnvServerError (server: cannot start), each one line naming the URL or what to do.
"""

from envs.openenv.client import OpenEnvClient, OpenEnvError, SessionClosed, StepResult
from envs.openenv.echo import DEFAULT_URL, URL_VARIABLE, EchoToolEnv
from envs.openenv.server import OpenEnvServer, OpenEnvServerError, ServerSettings, echo_server

__all__ = [
    "DEFAULT_URL",
    "URL_VARIABLE",
    "EchoToolEnv",
    "OpenEnvClient",
    "OpenEnvError",
    "OpenEnvServer",
    "OpenEnvServerError",
    "ServerSettings",
    "SessionClosed",
    "StepResult",
    "echo_server",
]
