"""A stand-in NeMo Gym resource server: the counter of NeMo Gym's `example_session_state_mgmt`,
speaking the same HTTP protocol, in the farm's own virtualenv (FastAPI and uvicorn, the dashboard
extra).

Why a stand-in: the real server (tests/nemo_gym_serve.py) needs nemo-gym's own virtualenv, built
with a newer Python; where that cannot be built, these tests still run the protocol, and this one
can also misbehave on request, which a real server will not do: a row's `standin_verify` field
makes /verify answer HTTP 500, 503, non-JSON, JSON without `reward`, a reward that is not a number,
slowly (3 s), or after a pause (0.4 s); `standin_components` adds `reward_components` to the answer.

As NeMo Gym's session middleware does, every response carries the session cookie, a request
without one starts a new session, and the counter lives per session. Everything the server
received is kept in `seen` (route, session, body), for the tests to check.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

COOKIE = "StandInCounterServer___standin"


class Increment(BaseModel):
    count: int


def make_app(seen: list[tuple[str, str, dict]], counters: dict[str, int]) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def session(request: Request, call_next):
        sid = request.cookies.get(COOKIE) or uuid.uuid4().hex
        request.state.sid = sid
        response: Response = await call_next(request)
        response.set_cookie(COOKIE, sid, httponly=True)
        return response

    async def record(request: Request, body: dict) -> str:
        seen.append((request.url.path, request.state.sid, body))
        return request.state.sid

    @app.post("/seed_session")
    async def seed_session(request: Request) -> dict:
        body = await request.json()
        sid = await record(request, body)
        initial = body.get("initial_count", 0)
        if not isinstance(initial, int):
            return JSONResponse({"detail": "initial_count must be an integer"}, status_code=422)
        counters.setdefault(sid, initial)
        return {}

    @app.post("/increment_counter")
    async def increment_counter(request: Request, body: Increment) -> dict:
        sid = await record(request, body.model_dump())
        counters[sid] = counters.get(sid, 0) + body.count
        return {"success": True}

    @app.post("/get_counter_value")
    async def get_counter_value(request: Request) -> dict:
        sid = await record(request, {})
        return {"count": counters.get(sid, 0)}

    @app.post("/broken_tool")
    async def broken_tool(request: Request) -> Response:
        await record(request, {})
        return JSONResponse("ValueError('the tool broke')", status_code=500)  # as NeMo Gym's middleware answers

    @app.post("/verify")
    async def verify(request: Request) -> Response:
        body = await request.json()
        sid = await record(request, body)
        mode = body.get("standin_verify")
        if mode in ("http_500", "http_503"):
            return PlainTextResponse(f"Internal trouble\n{mode}", status_code=int(mode[5:]))
        if mode == "not_json":
            return PlainTextResponse("<html>oops</html>")
        if mode == "slow":
            await asyncio.sleep(3)
        if mode == "pause":  # a verifier that takes its time, well within any limit
            await asyncio.sleep(0.4)
        counter = counters.get(sid)
        reward = float(counter is not None and counter == body.get("expected_count"))
        calls = [i for i in body["response"]["output"] if i.get("type") == "function_call"]
        answer = {**body, "reward": reward, "counter": counter, "function_calls": len(calls), "resolved": reward == 1}
        if mode == "no_reward":
            answer.pop("reward")
        if mode == "reward_string":
            answer["reward"] = "1.0"
        if body.get("standin_components"):
            answer["reward_components"] = {"right_count": reward, "called_tools": float(bool(calls))}
        return JSONResponse(answer)

    return app


class StandIn:
    """The stand-in served by uvicorn on 127.0.0.1 (a free port) in a thread of the test's process."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict]] = []
        self.counters: dict[str, int] = {}
        self.server = uvicorn.Server(uvicorn.Config(make_app(self.seen, self.counters), log_level="warning"))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout_s: float = 10.0) -> "StandIn":
        self.thread.start()
        for _ in range(int(timeout_s / 0.02)):
            if self.server.started:
                return self
            self.thread.join(0.02)
        raise RuntimeError(f"the stand-in did not start within {timeout_s}s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def routes(self, sid: str | None = None) -> list[str]:
        """The routes called, in order (of one session when `sid` is given)."""
        return [route for route, s, _ in self.seen if sid is None or s == sid]
