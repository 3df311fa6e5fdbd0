"""The gateway server: one OpenAI-compatible aiohttp server per worker process, a secret per rollout.

Routes (every model route under both prefixes):

  POST {base}/chat/completions    Chat Completions (tools, tool_calls; stream or not)
  POST {base}/responses           the Responses API (function calls; stream or not)
  GET  {base}/models              the one model a rollout may name
  POST /t/{secret}/tools/{name}   a command harness's tool call: the JSON arguments -> {"output": text}
  POST /t/{secret}/report         a command harness's own grade: {"reward", "components"}
  GET  /t/{secret}/task           the task, as the command got it on stdin

`{base}` is `/r/{secret}/v1` (the rollout's base URL) or `/v1` with the secret as the bearer key;
either one is enough, so SDKs that build their own client from OPENAI_BASE_URL or OPENAI_API_KEY
alone both work. A secret is 32 random URL-safe characters made per rollout and forgotten when it
ends; a harness cannot reach another rollout, and the tool endpoint has a secret of its own (a
command's model calls never carry it). Nothing logs a secret.

Each call goes through workers/gateway/calls.py's `model_call`: the bridge's prompt, the rollout's
limits, the token path every native loop uses.

The server binds to 127.0.0.1 and a free port unless `gateway_host` / `gateway_port` say otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Optional

import msgspec
from aiohttp import web

from workers.gateway.bridge import Message
from workers.gateway.calls import RolloutCalls, model_call
from workers.gateway.shapes import (
    GatewayError,
    bad,
    chat_answer,
    chat_chunks,
    new_id,
    read_chat,
    read_responses,
    response_answer,
    response_events,
    response_items,
)
from workers.policy.chat import ChatTokenizer
from workers.policy.token_policy import CompletionClient

log = logging.getLogger("farm.gateway")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder()
MAX_BODY_BYTES = 64 * 1024 * 1024


class Gateway:
    """The process's gateway: the aiohttp server and the rollouts it serves, by secret."""

    def __init__(self, client: CompletionClient, tok: ChatTokenizer, host: str = "127.0.0.1", port: int = 0):
        self.client, self.tok = client, tok
        self.host, self.port = host, port
        self.rollouts: dict[str, RolloutCalls] = {}
        self.tasks: dict[str, RolloutCalls] = {}
        self._runner: Optional[web.AppRunner] = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> "Gateway":
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
        for base in ("/r/{secret}/v1", "/v1"):
            app.router.add_post(base + "/chat/completions", self._chat)
            app.router.add_post(base + "/responses", self._responses)
            app.router.add_get(base + "/models", self._models)
        app.router.add_post("/t/{secret}/tools/{name}", self._tool)
        app.router.add_post("/t/{secret}/report", self._report)
        app.router.add_get("/t/{secret}/task", self._task)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        if self.port == 0 and server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("gateway listening on %s", self.url)
        return self

    async def aclose(self) -> None:
        for rollout in list(self.rollouts.values()):
            self.close(rollout)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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

    # -- routes -------------------------------------------------------------------------------
    def _rollout(self, request: web.Request) -> RolloutCalls:
        secret = request.match_info.get("secret")
        if secret is None:
            auth = request.headers.get("Authorization", "")
            secret = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        rollout = self.rollouts.get(secret) if secret else None
        if rollout is None:
            raise GatewayError(
                401,
                "unknown or missing API key: use the rollout's base_url or api_key (task.base_url, task.api_key); "
                "a rollout's key stops working when it ends",
                "invalid_api_key",
            )
        return rollout

    async def _body(self, request: web.Request) -> dict:
        try:
            body = _decode.decode(await request.read())
        except msgspec.DecodeError as exc:
            raise bad(f"the body is not JSON: {exc}", code="invalid_json") from None
        if not isinstance(body, dict):
            raise bad("the body must be a JSON object", code="invalid_json")
        return body

    async def _models(self, request: web.Request) -> web.Response:
        rollout = self._rollout(request)
        data = [{"id": rollout.model, "object": "model", "created": 0, "owned_by": "farm"}]
        return _json({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        rollout = self._rollout(request)
        body = await self._body(request)
        req = read_chat(body)
        reply = await model_call(self.client, self.tok, rollout, req)
        call_id = new_id("chatcmpl-")
        if req.stream:
            chunks = chat_chunks(reply, rollout.model, call_id, req.include_usage)
            return await _events(request, [b"data: " + _encode(c) for c in chunks] + [b"data: [DONE]"])
        return _json(chat_answer(reply, rollout.model, call_id))

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        rollout = self._rollout(request)
        body = await self._body(request)
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
            events = response_events(answer)
            return await _events(request, [f"event: {e['type']}\n".encode() + b"data: " + _encode(e) for e in events])
        return _json(answer)

    async def _tool(self, request: web.Request) -> web.Response:
        rollout = self._task_rollout(request)
        arguments = await self._body(request)
        output = await rollout.run_tool(request.match_info["name"], arguments)
        return _json({"output": output})

    async def _report(self, request: web.Request) -> web.Response:
        rollout = self._task_rollout(request)
        body = await self._body(request)
        try:
            rollout.report(body.get("reward"), body.get("components"))
        except ValueError as exc:
            raise bad(str(exc), "reward") from None
        return _json({"ok": True})

    async def _task(self, request: web.Request) -> web.Response:
        return _json(self._task_rollout(request).task_json)

    def _task_rollout(self, request: web.Request) -> RolloutCalls:
        rollout = self.tasks.get(request.match_info["secret"])
        if rollout is None:
            raise GatewayError(
                404, "unknown task URL (FARM_TASK_URL); it stops working when the rollout ends", "not_found"
            )
        return rollout


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(obj), status=status, content_type="application/json")


async def _events(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    """Server-sent events, all at once (the answer is whole before the first byte goes out)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(b"\n\n".join(events) + b"\n\n")
    await resp.write_eof()
    return resp


@web.middleware
async def _errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Every error in OpenAI's shape: the gateway's own, aiohttp's (404, 405, 413), and crashes (500)."""
    try:
        return await handler(request)
    except GatewayError as exc:
        return _json(exc.body(), exc.status)
    except web.HTTPException as exc:
        kind = "not_found" if exc.status == 404 else "invalid_request"
        return _json(
            GatewayError(exc.status, f"{request.method} {request.path}: {exc.reason}", kind).body(), exc.status
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.error(
            "gateway: %s %s failed: %s: %s", request.method, request.rel_url.path.split("/")[1], type(exc).__name__, exc
        )
        log.debug("gateway crash", exc_info=True)
        error = GatewayError(
            500, f"internal error in the farm's gateway: {type(exc).__name__}", "internal_error", "server_error"
        )
        return _json(error.body(), 500)
