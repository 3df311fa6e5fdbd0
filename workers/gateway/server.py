"""The gateway server: one OpenAI-compatible aiohttp server per worker process, a secret per rollout.

Routes (every model route under both prefixes):

  POST {base}/chat/completions    Chat Completions (tools, tool_calls; stream or not)
  POST {base}/responses           the Responses API (function calls; stream or not)
  GET  {base}/models              the one model a rollout may name
  POST /t/{secret}/tools/{name}   a command harness's tool call: the JSON arguments -> {"output": text}
  POST /t/{secret}/report         a command harness's own grade: {"reward", "components"}, or
                                  {"error": "..."}: its grader failed (a `verifier` failure)
  GET  /t/{secret}/task           the task, as the command got it on stdin

`{base}` is `/r/{secret}/v1` (the rollout's base URL) or `/v1` with the secret as the bearer key;
either one is enough, so SDKs that build their own client from OPENAI_BASE_URL or OPENAI_API_KEY
alone both work. A secret is 32 random URL-safe characters made per rollout and forgotten when it
ends; a harness cannot reach another rollout, and the tool endpoint has a secret of its own (a
command's model calls never carry it). Nothing logs a secret.

`Gateway.handle` answers one request whichever way it came: the aiohttp server hands it every
request, and an in-process harness's client (workers/loops/harness.py) calls it directly through
an httpx transport, with no socket and no HTTP parsing on either side; both get the same answers.

Each call goes through workers/gateway/calls.py's `model_call`: the bridge's prompt, the rollout's
limits, the token path every native loop uses.

The server binds to 127.0.0.1 and a free port unless `gateway_host` / `gateway_port` say otherwise.
An agent whose program runs inside its rollout's sandbox (workers/loops/sandbox_command.py) also
needs `listen_unix()`: the same routes on a Unix socket, `gateway.sock` in a directory of the
process's own (SOCKET_ROOT/<pid>, else under the temporary directory), which the sandbox gets
bound read-only: its one way out. The directory is traversable by all and the socket writable by
all (a sandbox's user may be anyone), which opens nothing the loopback port does not: every route
wants a rollout's secret. Both go at `aclose()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import msgspec
from aiohttp import web

from farm.schema import Task
from workers.gateway.answers import chat_answer, chat_chunks, new_id, response_answer, response_events, response_items
from workers.gateway.bridge import Bridge, Message
from workers.gateway.calls import Limits, RolloutCalls, ToolRunner, model_call
from workers.gateway.shapes import GatewayError, bad, read_chat, read_responses
from workers.policy.chat import ChatTokenizer
from workers.policy.token_policy import CompletionClient

log = logging.getLogger("farm.gateway")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder()
MAX_BODY_BYTES = 64 * 1024 * 1024
SOCKET_ROOT = Path("/run/rollout-farm/gateway")
SOCKET_NAME = "gateway.sock"


class Gateway:
    """The process's gateway: the aiohttp server and the rollouts it serves, by secret."""

    def __init__(self, client: CompletionClient, tok: ChatTokenizer, host: str = "127.0.0.1", port: int = 0):
        self.client, self.tok = client, tok
        self.host, self.port = host, port
        self.rollouts: dict[str, RolloutCalls] = {}
        self.tasks: dict[str, RolloutCalls] = {}
        self._runner: Optional[web.AppRunner] = None
        self.socket_dir: Optional[Path] = None  # set by listen_unix

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> "Gateway":
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
        app.router.add_route("*", "/{tail:.*}", self._http)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("gateway listening on %s", self.url)
        return self

    async def listen_unix(self) -> Path:
        """Serve on a Unix socket too (once); the directory that holds it (SOCKET_NAME inside)."""
        if self.socket_dir is not None:
            return self.socket_dir
        assert self._runner is not None, "start() first"
        directory = _socket_dir()
        path = directory / SOCKET_NAME
        site = web.UnixSite(self._runner, str(path))
        try:
            await site.start()
            os.chmod(path, 0o666)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.socket_dir = directory
        log.info("gateway listening on %s", path)
        return directory

    async def aclose(self) -> None:
        for rollout in list(self.rollouts.values()):
            self.close(rollout)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None

    def open_rollout(
        self,
        task: Task,
        model: str,
        messages: list[dict],
        tools: list[dict],
        sampling: dict[str, Any],
        limits: Limits,
        run_tool: ToolRunner,
    ) -> RolloutCalls:
        """`task`'s rollout at the gateway, registered: its secrets work until `close()`."""
        bridge = Bridge(self.tok)
        return self.open(RolloutCalls.for_task(task, model, messages, tools, sampling, limits, run_tool, bridge))

    def open(self, rollout: RolloutCalls) -> RolloutCalls:
        self.rollouts[rollout.secret] = rollout
        self.tasks[rollout.task_secret] = rollout
        return rollout

    def close(self, rollout: RolloutCalls) -> None:
        """The rollout is over: its secrets stop working and its open model calls are cancelled."""
        rollout.ended = True
        self.rollouts.pop(rollout.secret, None)
        self.tasks.pop(rollout.task_secret, None)
        for t in list(rollout.upstream):
            t.cancel()

    def base_url(self, rollout: RolloutCalls) -> str:
        return f"{self.url}/r/{rollout.secret}/v1"

    def task_url(self, rollout: RolloutCalls) -> str:
        return f"{self.url}/t/{rollout.task_secret}"

    # -- one request, whichever way it came ----------------------------------------------------
    async def handle(self, method: str, path: str, authorization: str, body: bytes) -> Answer:
        """The answer to one request: the aiohttp server and the in-process transport both call this."""
        try:
            return await self._route(method, path, authorization, body)
        except GatewayError as exc:
            return _json(exc.body(), exc.status)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _crash(method, path, exc)

    async def _route(self, method: str, path: str, authorization: str, body: bytes) -> Answer:
        parts = path.split("/")
        if len(parts) > 4 and parts[1] == "r" and parts[3] == "v1":  # /r/SECRET/v1/...
            secret, endpoint = parts[2], "/".join(parts[4:])
        elif len(parts) > 2 and parts[1] == "v1":  # /v1/... with the secret as the bearer key
            bearer = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
            secret, endpoint = bearer, "/".join(parts[2:])
        elif len(parts) > 3 and parts[1] == "t":  # /t/TASK_SECRET/...
            return await self._task_route(method, parts[2], parts[3:], body)
        else:
            raise GatewayError(404, f"{method} {path[:80]}: no such route", "not_found")
        want = _MODEL_ROUTES.get(endpoint)
        if want is None:
            raise GatewayError(404, f"{method} /v1/{endpoint[:60]}: no such route", "not_found")
        if method != want:
            raise GatewayError(405, f"{method} /v1/{endpoint}: use {want}", "method_not_allowed")
        rollout = self._rollout(secret)
        if endpoint == "models":
            data = [{"id": rollout.model, "object": "model", "created": 0, "owned_by": "farm"}]
            return _json({"object": "list", "data": data})
        try:
            if endpoint == "chat/completions":
                return await self._chat(rollout, _body(body))
            return await self._responses(rollout, _body(body))
        except GatewayError as exc:
            if exc.status == 400 and exc.type == "invalid_request_error" and exc.code != "rollout_limit":
                rollout.refused = exc  # a harness that gives up on it fails naming the parameter (harness.py)
            raise

    def _rollout(self, secret: str) -> RolloutCalls:
        rollout = self.rollouts.get(secret) if secret else None
        if rollout is None:
            raise GatewayError(
                401,
                "unknown or missing API key: use the rollout's base_url or api_key (task.base_url, task.api_key); "
                "a rollout's key stops working when it ends",
                "invalid_api_key",
            )
        return rollout

    async def _chat(self, rollout: RolloutCalls, body: dict) -> Answer:
        req = read_chat(body)
        reply = await model_call(self.client, self.tok, rollout, req)
        call_id = new_id("chatcmpl-")
        if req.stream:
            chunks = chat_chunks(reply, rollout.model, call_id, req.include_usage)
            return _events([b"data: " + _encode(c) for c in chunks] + [b"data: [DONE]"])
        return _json(chat_answer(reply, rollout.model, call_id))

    async def _responses(self, rollout: RolloutCalls, body: dict) -> Answer:
        earlier: list[Message] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in rollout.responses:
                raise GatewayError(
                    404, f"previous_response_id {str(previous)[:60]!r} is no response of this rollout", "not_found"
                )
            earlier = rollout.responses[previous]
        req = read_responses(body, earlier)
        reply = await model_call(self.client, self.tok, rollout, req)
        response_id = new_id("resp_")
        answer = response_answer(reply, rollout.model, response_id, response_items(reply), body)
        rollout.responses[response_id] = [*req.messages, reply.message()]
        if req.stream:
            return _events([f"event: {e['type']}\n".encode() + b"data: " + _encode(e) for e in response_events(answer)])
        return _json(answer)

    async def _task_route(self, method: str, secret: str, rest: list[str], body: bytes) -> Answer:
        """A command harness's tools, grade and task, on the task secret."""
        rollout = self.tasks.get(secret)
        if rollout is None:
            raise GatewayError(
                404, "unknown task URL (FARM_TASK_URL); it stops working when the rollout ends", "not_found"
            )
        if rest == ["task"] and method == "GET":
            return _json(rollout.task_json)
        if len(rest) == 2 and rest[0] == "tools" and method == "POST":
            return _json({"output": await rollout.call_tool(rest[1], _body(body))})
        if rest == ["report"] and method == "POST":
            report = _body(body)
            if isinstance(report, dict) and report.get("error") is not None:
                rollout.report_failure(report["error"])
                return _json({"ok": True})
            try:
                rollout.report(report.get("reward"), report.get("components"))
            except ValueError as exc:
                raise bad(str(exc), "reward") from None
            return _json({"ok": True})
        raise GatewayError(404, f"{method} {'/'.join(rest)[:60]}: no such task route", "not_found")

    async def _http(self, request: web.Request) -> web.Response:
        answer = await self.handle(
            request.method, request.path, request.headers.get("Authorization", ""), await request.read()
        )
        return _response(answer)


_MODEL_ROUTES = {"chat/completions": "POST", "responses": "POST", "models": "GET"}
_JSON = {"Content-Type": "application/json"}
_SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


def _socket_dir() -> Path:
    """A fresh directory of this process's for its socket: SOCKET_ROOT/<pid>, or one under the
    temporary directory where /run is not writable. Whatever a dead process of the same pid left
    there goes first."""
    try:
        SOCKET_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
        directory = SOCKET_ROOT / str(os.getpid())
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(mode=0o700)
    except PermissionError:
        directory = Path(tempfile.mkdtemp(prefix=f"rollout-farm-gateway-{os.getpid()}-"))
    os.chmod(directory, 0o711)
    return directory


def _body(raw: bytes) -> dict:
    try:
        body = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        raise bad(f"the body is not JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", code="invalid_json")
    return body


def _json(obj: Any, status: int = 200) -> Answer:
    return Answer(status, _JSON, _encode(obj))


def _events(events: list[bytes]) -> Answer:
    """Server-sent events, all at once (the answer is whole before the first byte goes out)."""
    return Answer(200, _SSE, b"\n\n".join(events) + b"\n\n")


@web.middleware
async def _errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """aiohttp's own errors (413: a body past MAX_BODY_BYTES) in OpenAI's shape too."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        error = GatewayError(exc.status, f"{request.method}: {exc.reason}", "invalid_request")
        return _response(_json(error.body(), exc.status))


def _crash(method: str, path: str, exc: Exception) -> Answer:
    log.error("gateway: %s %s failed: %s: %s", method, path.split("/")[1], type(exc).__name__, exc)
    log.debug("gateway crash", exc_info=True)
    error = GatewayError(
        500, f"internal error in the farm's gateway: {type(exc).__name__}", "internal_error", "server_error"
    )
    return _json(error.body(), 500)


def _response(answer: Answer) -> web.Response:
    return web.Response(body=answer.body, status=answer.status, headers=answer.headers)
