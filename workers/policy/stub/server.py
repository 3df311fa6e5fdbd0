"""A latency-injecting OpenAI-compatible server: the policy stand-in of the benchmarks and the tests.

It answers after a set latency (fixed, or uniform within +-jitter) with scripted replies, so
a benchmark measures the client and never the model. Nothing framework-shaped sits in its
request path: an asyncio Protocol parses HTTP/1.1 with keep-alive, msgspec decodes and
encodes the JSON, and each answer is one `call_later`, so thousands of requests in flight
cost a timer each (it serves well over 5,000 requests/s on one core of this 2-core machine).

Endpoints:
  GET  /health, GET /v1/models         (max_model_len as vLLM reports it)
  POST /v1/completions                 token ids in, token ids + logprobs out (vLLM's
                                       `return_tokens_as_token_ids` shape); the reply is the
                                       first scripted token reply not yet inside the prompt
  POST /v1/chat/completions            the reply after as many assistant turns as the messages hold
  POST /v1/responses                   the same, in the Responses API's output items
  POST /control                        change latency / faults at run time (JSON, see Faults)
  GET  /stats                          requests by path and status since start

Faults (command line or /control): `fault` = "429" | "500" | "503" answers every model
request (and /health for 5xx) with that status at once, with `Retry-After: <retry_after>`
when retry_after is set; `error_rate` answers only that fraction of model requests so.
A full outage is the process stopped: `StubProcess.stop()` then `.start()` on the same port.

    python -m workers.policy.stub --port 8100 --latency 2 --replies replies.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import msgspec

_json = msgspec.json
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Script(msgspec.Struct, kw_only=True):
    """What the server answers: token replies (completions) and message replies (chat / responses)."""

    token_replies: list[list[int]] = []  # each ends with the model's EOS id
    token_logprob: float = -0.25
    chat_replies: list[dict[str, Any]] = []  # {"content": str, "tool_calls": [{"name", "arguments"}]}
    model: str = "stub"
    max_model_len: int = 4096


class State:
    def __init__(self, script: Script, latency_s: float, jitter_s: float):
        self.script = script
        self.latency_s, self.jitter_s = latency_s, jitter_s
        self.fault: Optional[int] = None
        self.error_rate = 0.0
        self.retry_after: Optional[float] = None
        self.stats: Counter = Counter()
        self.packed = [array("i", r).tobytes() for r in script.token_replies]

    def delay(self) -> float:
        if self.jitter_s:
            return max(0.0, self.latency_s + random.uniform(-self.jitter_s, self.jitter_s))
        return self.latency_s

    def injected(self) -> Optional[int]:
        if self.fault is None:
            return None
        if self.error_rate and random.random() >= self.error_rate:
            return None
        return self.fault

    # -- replies --------------------------------------------------------------------------
    def completion(self, body: dict) -> dict:
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("prompt must be a non-empty list of token ids")
        if len(prompt) >= self.script.max_model_len:
            raise ValueError(f"This model's maximum context length is {self.script.max_model_len} tokens")
        packed = array("i", prompt).tobytes()
        ids = self.script.token_replies[-1]
        for reply, p in zip(self.script.token_replies, self.packed):
            if p not in packed:
                ids = reply
                break
        finish = "stop"
        limit = body.get("max_tokens")
        if isinstance(limit, int) and limit < len(ids):
            ids, finish = ids[:limit], "length"
        return {
            "id": "cmpl-stub",
            "object": "text_completion",
            "model": self.script.model,
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "finish_reason": finish,
                    "logprobs": {
                        "tokens": [f"token_id:{i}" for i in ids],
                        "token_logprobs": [self.script.token_logprob] * len(ids),
                    },
                }
            ],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
        }

    def _chat_reply(self, turn: int) -> dict:
        replies = self.script.chat_replies or [{"content": "ok"}]
        return replies[min(turn, len(replies) - 1)]

    def chat(self, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        reply = self._chat_reply(sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant"))
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        calls = reply.get("tool_calls") or []
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": _json.encode(c.get("arguments", {})).decode()},
                }
                for i, c in enumerate(calls)
            ]
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.script.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }

    def responses(self, body: dict) -> dict:
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        if not isinstance(items, list):
            raise ValueError("input must be a string or a list of items")
        turn = sum(
            1
            for i in items
            if isinstance(i, dict) and (i.get("role") == "assistant" or i.get("type") == "function_call_output")
        )
        reply = self._chat_reply(turn)
        output: list[dict] = []
        if reply.get("content"):
            output.append(
                {
                    "type": "message",
                    "id": "msg_stub",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply["content"], "annotations": []}],
                }
            )
        for i, c in enumerate(reply.get("tool_calls") or []):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{i}",
                    "call_id": f"call_{turn}_{i}",
                    "name": c["name"],
                    "arguments": _json.encode(c.get("arguments", {})).decode(),
                    "status": "completed",
                }
            )
        return {
            "id": "resp_stub",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": self.script.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 10,
                "output_tokens": 5,
                "total_tokens": 15,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }


_MODEL_PATHS = {
    "/v1/completions": State.completion,
    "/v1/chat/completions": State.chat,
    "/v1/responses": State.responses,
}


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies: what the clients under test send."""

    def __init__(self, state: State):
        self.state = state
        self.buf = b""
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, _ = lines[0].split(" ", 2)
            except ValueError:
                self._send(400, {"error": "bad request line"}, close=True)
                return
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            end = head_end + 4 + length
            if len(self.buf) < end:
                return
            body, self.buf = self.buf[head_end + 4 : end], self.buf[end:]
            self.handle(method, target.split("?", 1)[0], body)

    def handle(self, method: str, path: str, body: bytes) -> None:
        st = self.state
        st.stats[f"{method} {path}"] += 1
        if path == "/health":
            fault = st.fault if st.fault and st.fault >= 500 and not st.error_rate else None
            self._send(fault or 200, {} if fault is None else {"error": "injected"})
        elif path == "/v1/models":
            self._send(
                200,
                {
                    "object": "list",
                    "data": [{"id": st.script.model, "object": "model", "max_model_len": st.script.max_model_len}],
                },
            )
        elif path == "/stats":
            self._send(200, dict(st.stats))
        elif path == "/control" and method == "POST":
            self._control(body)
        elif path in _MODEL_PATHS and method == "POST":
            fault = st.injected()
            if fault is not None:
                st.stats[f"status {fault}"] += 1
                headers = {} if st.retry_after is None else {"Retry-After": f"{st.retry_after:g}"}
                self._send(fault, {"error": {"message": f"injected HTTP {fault}", "type": "stub"}}, headers)
                return
            try:
                reply = _MODEL_PATHS[path](st, _json.decode(body))
            except (msgspec.DecodeError, ValueError, TypeError, AttributeError) as exc:
                st.stats["status 400"] += 1
                self._send(400, {"error": {"message": str(exc), "type": "BadRequestError"}})
                return
            st.stats["status 200"] += 1
            asyncio.get_running_loop().call_later(st.delay(), self._send, 200, reply)
        else:
            self._send(404, {"error": f"no route {method} {path}"})

    def _control(self, body: bytes) -> None:
        st = self.state
        try:
            change = _json.decode(body) if body else {}
        except msgspec.DecodeError as exc:
            self._send(400, {"error": str(exc)})
            return
        if "latency_s" in change:
            st.latency_s = float(change["latency_s"])
        if "jitter_s" in change:
            st.jitter_s = float(change["jitter_s"])
        if "fault" in change:
            st.fault = int(change["fault"]) if change["fault"] not in (None, "none", 0) else None
        if "error_rate" in change:
            st.error_rate = float(change["error_rate"])
        if "retry_after" in change:
            st.retry_after = None if change["retry_after"] is None else float(change["retry_after"])
        self._send(
            200,
            {
                "latency_s": st.latency_s,
                "jitter_s": st.jitter_s,
                "fault": st.fault,
                "error_rate": st.error_rate,
                "retry_after": st.retry_after,
            },
        )

    def _send(self, status: int, payload: Any, headers: Optional[dict] = None, close: bool = False) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        data = _json.encode(payload)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        if close:
            extra += "Connection: close\r\n"
        self.transport.write(
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{extra}\r\n".encode()
            + data
        )
        if close:
            self.transport.close()


async def serve(
    script: Script,
    host: str,
    port: int,
    latency_s: float,
    jitter_s: float,
    fault: Optional[int] = None,
    error_rate: float = 0.0,
    retry_after: Optional[float] = None,
) -> None:
    state = State(script, latency_s, jitter_s)
    state.fault, state.error_rate, state.retry_after = fault, error_rate, retry_after
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttpProtocol(state), host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"policy stub listening on http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.policy.stub", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--latency", type=float, default=0.05, help="seconds before each model answer")
    p.add_argument("--jitter", type=float, default=0.0, help="answer latency is uniform in latency +- jitter")
    p.add_argument("--replies", help="JSON file of the script (token_replies, chat_replies, model, max_model_len)")
    p.add_argument("--fault", type=int, choices=(429, 500, 503), help="answer model requests with this status")
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction of model requests that get --fault")
    p.add_argument("--retry-after", type=float, help="Retry-After seconds sent with injected faults")
    args = p.parse_args(argv)
    script = _json.decode(Path(args.replies).read_bytes(), type=Script) if args.replies else Script()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = uvloop.run if uvloop else asyncio.run
    runner(
        serve(script, args.host, args.port, args.latency, args.jitter, args.fault, args.error_rate, args.retry_after)
    )
    return 0
