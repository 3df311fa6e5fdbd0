"""A latency-injecting OpenAI-compatible server: the policy stand-in of the benchmarks and the tests.

It answers after a set latency with scripted replies, so a benchmark measures the client and
never the model. Nothing framework-shaped sits in its request path: an asyncio Protocol parses
HTTP/1.1 with keep-alive, msgspec decodes and encodes the JSON, and each answer is one
`call_later`, so thousands of requests in flight cost a timer each (it serves well over 5,000
requests/s on one core of this 2-core machine).

Latency (`--latency-dist` fixed, uniform or lognormal with `--sigma`) and replies (`--pick`
scripted or random, by `--weights`, each after `--filler-tokens` random ids) are model.py's;
every draw is seeded by `--seed`. With `--prefix-cache-tokens N` the process is a replica with a
prefix cache of N tokens (prefix.py) and a completion waits `--prefill-s-per-token` more per
prompt token it missed.

A request whose client closes its connection before the answer is an abort: its timer is
cancelled, it is counted (`aborted` in /stats) and listed in /aborts with the epoch seconds
it was received and its connection closed, so a benchmark can time "cancel -> server sees it".

Endpoints:
  GET  /health, GET /v1/models         (max_model_len as vLLM reports it)
  POST /v1/completions                 token ids in, token ids + logprobs out (vLLM's
                                       `return_tokens_as_token_ids` shape); the reply is the
                                       first scripted token reply not yet inside the prompt
                                       (--pick scripted) or a random one (--pick random)
  POST /v1/chat/completions            the reply after as many assistant turns as the messages hold
  POST /v1/responses                   the same, in the Responses API's output items
  POST /control                        change latency, replies, faults at run time (JSON keys
                                       as the options: latency_s, jitter_s, latency_dist, sigma,
                                       seed, pick, weights, fault, error_rate, retry_after,
                                       filler_tokens, prefix_cache_tokens, prefill_s_per_token)
  GET  /stats                          requests by path and status since start, `aborted`,
                                       `pending` (model requests not yet answered) and
                                       `prefix_cache` (completions: requests, prompt_tokens,
                                       cached_tokens, prefilled_tokens, blocks, evicted_blocks)
  GET  /aborts                         the last 100,000 aborts: [{"received", "closed"}, ...]

Faults (command line or /control): `fault` = "429" | "500" | "503" answers every model
request (and /health for 5xx) with that status at once, with `Retry-After: <retry_after>`
when retry_after is set; `error_rate` answers only that fraction of model requests so.
A full outage is the process stopped: `StubProcess.stop()` then `.start()` on the same port.

    python -m workers.policy.stub --port 8100 --latency 2 --replies replies.json
    python -m workers.policy.stub --port 8100 --reply '<tool_call>{"name": "get_stock"}</tool_call>' --reply done
    python -m workers.policy.stub --latency 2 --latency-dist lognormal --sigma 1 --pick random --seed 0
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path
from typing import Any, Optional

import msgspec

from workers.policy.stub.model import DISTS, PICKS, Options, Script, State

_json = msgspec.json
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


_MODEL_PATHS = {
    "/v1/completions": State.completion,
    "/v1/chat/completions": State.chat,
    "/v1/responses": State.responses,
}


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies: what the clients under test send.

    `waiting` holds this connection's unanswered model requests (their timer and the epoch second
    each was received): when the connection is lost they become aborts and their timers end."""

    def __init__(self, state: State):
        self.state = state
        self.buf = b""
        self.transport: Optional[asyncio.Transport] = None
        self.waiting: dict[int, tuple[asyncio.TimerHandle, float]] = {}
        self.next_id = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self.waiting:
            closed, st = time.time(), self.state
            for timer, received in self.waiting.values():
                timer.cancel()
                st.aborts.append((received, closed))
            st.stats["aborted"] += len(self.waiting)
            st.pending -= len(self.waiting)
            self.waiting.clear()

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
            fault = st.o.fault if st.o.fault and st.o.fault >= 500 and not st.o.error_rate else None
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
            self._send(
                200,
                {**st.stats, "aborted": st.stats["aborted"], "pending": st.pending, "prefix_cache": st.cache.stats()},
            )
        elif path == "/aborts":
            self._send(200, [{"received": r, "closed": c} for r, c in st.aborts])
        elif path == "/control" and method == "POST":
            self._control(body)
        elif path in _MODEL_PATHS and method == "POST":
            fault = st.injected()
            if fault is not None:
                st.stats[f"status {fault}"] += 1
                headers = {} if st.o.retry_after is None else {"Retry-After": f"{st.o.retry_after:g}"}
                self._send(fault, {"error": {"message": f"injected HTTP {fault}", "type": "stub"}}, headers)
                return
            try:
                reply = _MODEL_PATHS[path](st, _json.decode(body))
            except (msgspec.DecodeError, ValueError, TypeError, AttributeError) as exc:
                st.stats["status 400"] += 1
                self._send(400, {"error": {"message": str(exc), "type": "BadRequestError"}})
                return
            st.stats["status 200"] += 1
            self.next_id += 1
            timer = asyncio.get_running_loop().call_later(
                st.delay() + st.prefill_s(reply), self._answer, self.next_id, reply
            )
            self.waiting[self.next_id] = (timer, time.time())
            st.pending += 1
            st.stats["max_pending"] = max(st.stats["max_pending"], st.pending)  # the most at once (/stats)
        else:
            self._send(404, {"error": f"no route {method} {path}"})

    def _answer(self, request: int, reply: dict) -> None:
        del self.waiting[request]
        self.state.pending -= 1
        self._send(200, reply)

    def _control(self, body: bytes) -> None:
        try:
            change = _json.decode(body, type=dict) if body else {}
            self.state.change(change)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            self._send(400, {"error": str(exc)})
            return
        self._send(200, self.state.o)

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


async def serve(script: Script, host: str, port: int, options: Options) -> None:
    state = State(script, options)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttpProtocol(state), host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"policy stub listening on http://{host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


def with_text_replies(script: Script, texts: list[str], tokenizer: Optional[str] = None) -> Script:
    """The script with its text replies tokenized (each + EOS) after its token replies, and as its
    chat replies when it has none: what a new environment's turns look like, without token ids."""
    if not texts:
        return script
    from workers.policy.chat import ChatTokenizer

    if tokenizer is None:
        from workers.policy.serving import default_cache, prepare_model

        tokenizer = str(prepare_model(default_cache()))
    tok = ChatTokenizer(tokenizer)
    tokens = [tok.encode(t) + [tok.eos_id] for t in texts]
    chat = script.chat_replies or [{"content": t} for t in texts]
    return msgspec.structs.replace(
        script, token_replies=[*script.token_replies, *tokens], text_replies=[], chat_replies=chat
    )


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.policy.stub", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--latency", type=float, default=0.05, help="seconds before each model answer (lognormal: median)")
    p.add_argument("--jitter", type=float, default=0.0, help="uniform latency: in latency +- jitter")
    p.add_argument("--latency-dist", choices=DISTS, default="uniform", help="uniform with jitter 0 is fixed")
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal latency: the log's standard deviation")
    p.add_argument("--seed", type=int, help="seed of every random draw (latency, replies, errors)")
    p.add_argument("--pick", choices=PICKS, default="scripted", help="which token reply a completion gets")
    p.add_argument("--weights", help="pick random: comma-separated weights of the token replies (default equal)")
    p.add_argument(
        "--reply",
        action="append",
        default=[],
        metavar="TEXT",
        help="a reply as text (repeatable, in turn order): tokenized with --tokenizer, ending in EOS",
    )
    p.add_argument(
        "--replies", help="JSON file of the script (text_replies, token_replies, chat_replies, model, max_model_len)"
    )
    p.add_argument("--tokenizer", help="model directory whose tokenizer encodes text replies (default: SmolLM2's)")
    p.add_argument("--fault", type=int, choices=(429, 500, 503), help="answer model requests with this status")
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction of model requests that get --fault")
    p.add_argument("--retry-after", type=float, help="Retry-After seconds sent with injected faults")
    p.add_argument("--filler-tokens", type=int, default=0, help="ids from the script's filler before each reply")
    p.add_argument("--prefix-cache-tokens", type=int, default=0, help="this replica's prefix cache (0: off)")
    p.add_argument("--prefill-s-per-token", type=float, default=0.0, help="seconds added per uncached prompt token")
    args = p.parse_args(argv)
    try:
        script = _json.decode(Path(args.replies).read_bytes(), type=Script) if args.replies else Script()
        script = with_text_replies(script, [*script.text_replies, *args.reply], args.tokenizer)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        p.error(f"--replies/--reply: {exc}")
    if not (script.token_replies or script.chat_replies):
        p.error(
            "nothing to answer: give the model's replies as text (--reply TEXT, repeatable, in turn order) "
            "or a script file (--replies FILE with text_replies, token_replies or chat_replies)"
        )
    options = Options(
        latency_s=args.latency,
        jitter_s=args.jitter,
        latency_dist=args.latency_dist,
        sigma=args.sigma,
        seed=args.seed,
        pick=args.pick,
        weights=[float(w) for w in args.weights.split(",")] if args.weights else None,
        fault=args.fault,
        error_rate=args.error_rate,
        retry_after=args.retry_after,
        filler_tokens=args.filler_tokens,
        prefix_cache_tokens=args.prefix_cache_tokens,
        prefill_s_per_token=args.prefill_s_per_token,
    )
    try:
        options.check(script)
    except ValueError as exc:
        p.error(str(exc))
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = uvloop.run if uvloop else asyncio.run
    runner(serve(script, args.host, args.port, options))
    return 0
