"""The local OpenEnv echo server, started and stopped from the farm's side: a process running
scripts/openenv_serve.py with .venv-openenv's python (scripts/openenv-venv builds it), bound to
127.0.0.1. No container: OpenEnv's FastAPI app as a plain process.

    with echo_server(ServerSettings(port=0, max_sessions=16)) as server:
        ...  # EchoToolEnv instances made with OPENENV_ECHO_URL=server.url talk to it

    python -m envs.openenv --port 8000 --max-sessions 64      # serves until Ctrl-C

A server that cannot start is an OpenEnvServerError of one line: the virtualenv missing (and the
command that builds it), the port taken, the server exiting or not answering /health in time
(with the last line of its log). The server runs from a checkout of the farm: its program is
scripts/openenv_serve.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["OpenEnvServer", "OpenEnvServerError", "ServerSettings", "echo_server", "main", "start"]

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "scripts" / "openenv_serve.py"
VENV_PYTHON = ROOT / ".venv-openenv" / "bin" / "python"
EXIT_PORT_TAKEN = 2  # scripts/openenv_serve.py's exit code for a port it cannot bind


class OpenEnvServerError(Exception):
    """The OpenEnv server could not be started (one line: what, and what to do)."""


@dataclass(frozen=True)
class ServerSettings:
    port: int = 8000  # 0: a free port
    max_sessions: int = 64  # openenv-core's max_concurrent_envs: one per rollout in flight
    python: Optional[str] = None  # .venv-openenv's python by default
    ready_timeout_s: float = 120.0
    log: Optional[Path] = None  # the server's stdout and stderr; a temporary file by default


@dataclass
class OpenEnvServer:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(settings: ServerSettings) -> OpenEnvServer:
    """Start the server and return once it answers /health; OpenEnvServerError when it cannot."""
    python = Path(settings.python) if settings.python else VENV_PYTHON
    if not (python.is_file() and os.access(python, os.X_OK)):
        raise OpenEnvServerError(f"no OpenEnv virtualenv: {python} is missing (build it with scripts/openenv-venv)")
    if not SERVE.is_file():
        raise OpenEnvServerError(f"{SERVE} is missing: the OpenEnv server runs from a checkout of the farm")
    if settings.port and not _bindable(settings.port):
        raise OpenEnvServerError(f"port {settings.port} on 127.0.0.1 is taken: stop what listens there or pick another")
    log = settings.log or Path(tempfile.mkstemp(prefix="openenv-echo-", suffix=".log")[1])
    command = [str(python), str(SERVE), "--port", str(settings.port), "--max-sessions", str(settings.max_sessions)]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    server = OpenEnvServer(process, settings.port, log)
    try:
        _wait_ready(server, settings.ready_timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


@contextlib.contextmanager
def echo_server(settings: ServerSettings = ServerSettings()) -> Iterator[OpenEnvServer]:
    """The server for the `with` block; stopped (SIGTERM, then SIGKILL) at its end."""
    server = start(settings)
    try:
        yield server
    finally:
        server.stop()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ready(server: OpenEnvServer, timeout_s: float) -> None:
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = server.process.poll()
        if code == EXIT_PORT_TAKEN:
            raise OpenEnvServerError(f"port {server.port} on 127.0.0.1 is taken: {_last_line(server.log)}")
        if code is not None:
            raise OpenEnvServerError(
                f"the OpenEnv server exited ({code}) before it was ready: {_last_line(server.log)}"
            )
        if not server.port:
            found = re.search(r"^PORT (\d+)$", server.log.read_text(errors="replace"), re.M)
            server.port = int(found.group(1)) if found else 0
        if server.port:
            try:
                with no_proxy.open(f"{server.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
        time.sleep(0.2)
    raise OpenEnvServerError(
        f"the OpenEnv server did not answer /health in {timeout_s:g}s (log {server.log}): {_last_line(server.log)}"
    )


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(its log is empty)"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.openenv", description="Serve OpenEnv's echo env.")
    parser.add_argument("--port", type=int, default=ServerSettings.port, help="0: a free port")
    parser.add_argument("--max-sessions", type=int, default=ServerSettings.max_sessions)
    parser.add_argument("--python", default=None, help="the python of the OpenEnv virtualenv")
    args = parser.parse_args(argv)
    settings = ServerSettings(port=args.port, max_sessions=args.max_sessions, python=args.python)
    try:
        with echo_server(settings) as server:
            print(f"OpenEnv echo server at {server.url}, {args.max_sessions} sessions (log {server.log})", flush=True)
            print(f"export OPENENV_ECHO_URL={server.url}", flush=True)
            server.process.wait()
            print(
                f"openenv: the server exited ({server.process.returncode}): {_last_line(server.log)}", file=sys.stderr
            )
            return 1
    except OpenEnvServerError as exc:
        print(f"openenv: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
