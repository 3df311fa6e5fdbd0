"""A synchronous client of OpenEnv's WebSocket protocol, for the farm's side of an OpenEnv server.

Why not openenv-core's own client: openenv-core 0.3.0 requires gradio, whose pins (pillow<13,
huggingface-hub<2) pip's resolver cannot fit beside the farm's transformers 5, so the server runs
in .venv-openenv (scripts/openenv-venv) and this side speaks the protocol with `websockets` only.
It is openenv-core's EnvClient protocol, message for message (env_client.py, http_server.py):

    connect  ws://HOST:PORT/ws                      one connection = one session = one environment
    {"type": "reset", "data": {kwargs}}             -> {"type": "observation", "data": RESULT}
    {"type": "step", "data": {action fields}}       -> {"type": "observation", "data": RESULT}
    {"type": "state"}                               -> {"type": "state", "data": {episode_id, ...}}
    {"type": "close"}                               the server ends the session
    RESULT = {"observation": {fields}, "reward": float | None, "done": bool}
    any of them -> {"type": "error", "data": {"message", "code"}}

A server at its session limit accepts the connection, answers CAPACITY_REACHED and closes it.

Synchronous on purpose: TRL calls an environment's `reset` without awaiting it, and its OpenEnv
examples call `client.step(...)` as a plain call (openenv-core 0.3.0's EnvClient is async; its
`.sync()` wrapper runs a thread with an event loop per client).

Errors: every failure, transport or server, is an OpenEnvError whose one line names the URL. A
failed connection is dropped, and the episode with it: `step` and `state` then refuse to run (a
new session would be a new episode, not the same one) until a `reset` opens a new session. A
reset retries once on a connection the server closed since its last use (it restarted, or dropped
an idle session): a reset loses nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

__all__ = ["OpenEnvClient", "OpenEnvError", "SessionClosed", "StepResult", "ws_url"]

# Error codes after which openenv-core's server closes the connection.
SESSION_ENDING = frozenset({"CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR"})


class OpenEnvError(Exception):
    """The server could not be reached, closed the session, or answered an error."""


class SessionClosed(OpenEnvError):
    """The connection ended under a request; `stale`: it had answered before (the server closed an
    idle session, or restarted), so a reset may open a new one."""

    def __init__(self, message: str, stale: bool):
        super().__init__(message)
        self.stale = stale


@dataclass(frozen=True)
class StepResult:
    """What a reset or a step returned, as openenv-core's StepResult holds it."""

    observation: dict[str, Any]
    reward: Optional[float]
    done: bool


def ws_url(base_url: str) -> str:
    """The session endpoint of a server given as http(s):// or ws(s):// (openenv's convert_to_ws_url)."""
    url = base_url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    if not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return url + "/ws"


class OpenEnvClient:
    """One session with an OpenEnv server, opened by the first reset and kept until `close`."""

    def __init__(self, base_url: str, connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0):
        self.url = ws_url(base_url)
        self.connect_timeout_s = connect_timeout_s
        self.message_timeout_s = message_timeout_s
        self._ws: Optional[ClientConnection] = None
        self._used = False  # the connection has answered at least once

    def reset(self, **kwargs: Any) -> StepResult:
        message = {"type": "reset", "data": kwargs}
        try:
            return _result(self._request(message))
        except SessionClosed as exc:
            if not exc.stale:
                raise
        return _result(self._request(message))  # a new session, once

    def step(self, action: dict[str, Any]) -> StepResult:
        return _result(self._request({"type": "step", "data": action}, opens=False))

    def state(self) -> dict[str, Any]:
        return dict(self._request({"type": "state"}, opens=False).get("data") or {})

    @property
    def connected(self) -> bool:
        """A session is open: the episode that the last reset started goes on."""
        return self._ws is not None

    def close(self) -> None:
        """End the session (the server frees its environment instance)."""
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                ws.send(json.dumps({"type": "close"}))
            except ConnectionClosed:
                pass
            ws.close()

    def __enter__(self) -> OpenEnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the wire -----------------------------------------------------------------------------
    def _connect(self) -> ClientConnection:
        if self._ws is None:
            try:
                self._ws = connect(self.url, open_timeout=self.connect_timeout_s, max_size=100 * 2**20)
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
                raise OpenEnvError(f"cannot connect to the OpenEnv server at {self.url}: {_why(exc)}") from exc
            self._used = False
        return self._ws

    def _request(self, message: dict[str, Any], opens: bool = True) -> dict[str, Any]:
        if not opens and self._ws is None:  # a new session would be a new episode, not this one
            raise OpenEnvError(f"no session with the OpenEnv server at {self.url} ({message['type']}): reset first")
        ws = self._connect()
        stale = self._used
        try:
            try:
                ws.send(json.dumps(message))
            except ConnectionClosed:
                pass  # a refused session's error is waiting to be read; recv says what it was
            raw = ws.recv(timeout=self.message_timeout_s)
        except TimeoutError as exc:
            self._drop()
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} did not answer {message['type']} in {self.message_timeout_s:g}s"
            ) from exc
        except (ConnectionClosed, OSError) as exc:
            self._drop()
            why = f"the OpenEnv server at {self.url} closed the session ({message['type']}): {_why(exc)}"
            raise SessionClosed(why, stale=stale) from exc
        self._used = True
        try:
            answer = json.loads(raw)
        except (TypeError, ValueError):
            answer = None
        if not isinstance(answer, dict):
            self._drop()
            raise OpenEnvError(f"the OpenEnv server at {self.url} answered {message['type']} with no JSON object")
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            code = data.get("code", "UNKNOWN")
            if code in SESSION_ENDING:
                self._drop()
            raise OpenEnvError(
                f"the OpenEnv server at {self.url} refused {message['type']}: {code}: {data.get('message')}"
            )
        return answer

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()


def _result(answer: dict[str, Any]) -> StepResult:
    data = answer.get("data") or {}
    reward = data.get("reward")
    return StepResult(
        dict(data.get("observation") or {}), None if reward is None else float(reward), bool(data.get("done"))
    )


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
