"""Async client for the policy: one or more OpenAI-compatible servers (vLLM in production).

Requests are token-in, token-out: `/v1/completions` with the prompt as token ids, asking
for the sampled ids (`return_tokens_as_token_ids`) and their logprobs. With several base
URLs the client spreads rollouts over them by least outstanding requests, and keeps one
rollout on one replica (a `Session`) for its whole conversation so the prefix cache is
reused.

Why aiohttp, one session per replica. This client carries thousands of concurrent agent
loops per process. Measured on this project's 2-core machine against the policy stub
(workers/policy/stub; 50 ms latency, 5,000 requests, CPU per request in the client process):

    aiohttp, TCPConnector(limit=C)            C=64: 292 us   C=512: 236 us (211 us on uvloop)
    httpx over httpx-aiohttp's transport      C=64: 530 us   C=512: 467 us
    httpx 0.28 (httpcore pool)                C=64: 9.3 ms   C=512: 10 ms, 100 requests/s

httpcore's pool assigns waiting requests to connections in time quadratic in the number
waiting, which livelocked a worker past ~1,000 loops; httpx-aiohttp removes that but doubles
the CPU per request. So the hot path speaks aiohttp directly: one ClientSession per replica
whose connector allows as many connections as the worker has loops, idle connections kept
for a minute (a loop's next turn reuses its connection instead of reconnecting), and a
separate small session for health checks, so a saturated pool never fails a health check.

Faults, and backpressure (the rotation itself lives in workers/policy/rotation.py). A replica
answering 429 or 503 is *cooling*: it takes no request
until its Retry-After (or a doubling backoff) has passed, then comes back on its next good
answer. A replica that errors `unhealthy_after` times in a row (connection refused, 5xx,
timeouts) or fails its health check leaves the rotation and is probed until it answers.
While no replica can take work, `wait_ready()` blocks (the worker stops fetching tasks) and
model calls in flight wait for one to come back instead of burning attempts. A model call
keeps trying for `retry_budget_s` seconds (a time, not a count, so an outage shorter than
the budget costs nothing), then raises PolicyUnavailable with the last reason: a recorded
`policy` failure, not retried by the worker, since the whole budget was already spent.
A prompt that does not fit the context raises ContextOverflow (the loop's `truncated`); the
errors are workers/policy/protocol.py's, the same for both backends. The backend the agent loop
drives (chat template, budget, token trace) is workers/policy/token_policy.py, over this client.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import aiohttp
import aiohttp.payload
import msgspec

from farm.transport import backoff_delay
from workers.policy.config import PolicyConfig
from workers.policy.protocol import ContextOverflow, PolicyRejected, PolicyUnavailable
from workers.policy.rotation import Replica, Rotation, Session, retry_after_s

__all__ = [
    "Completion",
    "ContextOverflow",
    "PolicyClient",
    "PolicyConfig",
    "PolicyRejected",
    "PolicyUnavailable",
    "Session",
    "Sink",
    "retry_after_s",
]

log = logging.getLogger("farm.policy")

_OVERFLOW = ("maximum context length", "context length", "too long", "max_model_len", "longer than the maximum")
_COOLING = (429, 503)
_TOKEN_PREFIX = "token_id:"
_json_encode = msgspec.json.Encoder().encode


def _refusal(url: str, status: int, raw: bytes, request: bytes) -> str:
    """A 4xx answer in words: vLLM's message, and the parameter it refused (the error's `param`, else
    the first request key its message names), so a bad sampling value reads as one, not as a crash."""
    try:
        body = msgspec.json.decode(raw)
        error = body.get("error", body) if isinstance(body, dict) else {}
        message = str(error.get("message") or raw[:500].decode(errors="replace")) if isinstance(error, dict) else ""
        param = error.get("param") if isinstance(error, dict) else None
    except msgspec.DecodeError:
        message, param = raw[:500].decode(errors="replace"), None
    if not param:
        keys = sorted(msgspec.json.decode(request), key=len, reverse=True)  # `top_p` before `p`
        param = next((k for k in keys if k not in ("model", "prompt") and k in message), None)
    named = f" over its parameter `{param}`:" if param else ":"
    return f"the policy refused the request (HTTP {status}){named} {message[:500]} ({url})"


class _Logprobs(msgspec.Struct):
    tokens: list[str | int]
    token_logprobs: list[Optional[float]]


class _Choice(msgspec.Struct):
    logprobs: _Logprobs
    text: str = ""
    finish_reason: Optional[str] = None
    token_ids: Optional[list[int]] = None


class _CompletionBody(msgspec.Struct):
    choices: list[_Choice]


_completion_decoder = msgspec.json.Decoder(_CompletionBody)


class _StreamChunk(msgspec.Struct):
    choices: list[_Choice]


_chunk_decoder = msgspec.json.Decoder(_StreamChunk)


@dataclass
class Sink:
    """Where a streamed completion's tokens land as they arrive: what an interrupted turn had
    generated when it stopped (workers/policy/token_policy.py keeps it; a retry starts it over)."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version current as each id arrived
    stamp: Callable[[], int] = lambda: 0  # that version, read once per event

    def clear(self) -> None:
        self.ids.clear()
        self.logprobs.clear()
        self.versions.clear()


@dataclass
class Completion:
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    replica: str
    latency_s: float


class PolicyClient:
    def __init__(self, config: PolicyConfig):
        if not config.urls:
            raise ValueError("the policy client needs at least one base URL")
        self.config = config
        self.rotation = Rotation(config)
        self.replicas = self.rotation.replicas
        self._model_len: dict[str, asyncio.Future] = {}
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_s, connect=10.0)

    def ready(self) -> bool:
        """Whether some replica can take a request now."""
        return self.rotation.ready()

    async def wait_ready(self) -> None:
        """Until some replica can take work (the worker fetches no task before that)."""
        await self.rotation.wait_ready()

    async def check_health(self) -> dict[str, bool]:
        return await self.rotation.check_health()

    def _session(self, replica: Replica) -> aiohttp.ClientSession:
        if replica.session is None or replica.session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.config.max_connections,
                limit_per_host=0,
                keepalive_timeout=self.config.keepalive_s,
                ttl_dns_cache=None,
            )
            replica.session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, json_serialize=lambda o: _json_encode(o).decode()
            )
        return replica.session

    async def max_model_len(self, session: Session) -> Optional[int]:
        """The replica's context length, looked up once per replica and shared by every loop."""
        # Replicas serve one model: with none placed yet (all at their in-flight limit, adaptive
        # load), any replica's length caps this turn as well.
        replica = session.replica or self.rotation.pick(session) or (self.replicas[0] if self.replicas else None)
        if replica is None:
            return None
        fut = self._model_len.get(replica.url)
        if fut is None:
            fut = self._model_len[replica.url] = asyncio.ensure_future(self._lookup_len(replica))
        value = await asyncio.shield(fut)  # a cancelled loop leaves the shared lookup running
        if value is None and fut.done():
            self._model_len.pop(replica.url, None)  # look again next time: it may have been down
        return value

    async def _lookup_len(self, replica: Replica) -> Optional[int]:
        try:
            async with self._session(replica).get(
                f"{replica.url}/v1/models", timeout=aiohttp.ClientTimeout(total=10.0)
            ) as resp:
                data = await resp.json(content_type=None)
            for m in data.get("data", []):
                if m.get("id") == self.config.model and m.get("max_model_len"):
                    return int(m["max_model_len"])
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, AttributeError, TypeError):
            return None
        return None

    # -- requests ----------------------------------------------------------------------
    @property
    def streams(self) -> bool:
        """Whether completions are streamed into a Sink (policy_stream): what an interrupt keeps."""
        return self.config.stream

    async def complete(
        self, prompt_ids: list[int], sampling: dict[str, Any], session: Session, sink: Optional[Sink] = None
    ) -> Completion:
        """One completion. With a `sink` it is streamed, and the sink holds every token received so
        far whenever the call is cancelled (each retry starts it over)."""
        data = self._request_body(prompt_ids, {**sampling, "stream": True} if sink is not None else sampling)
        cfg = self.config
        self.rotation.ensure_monitor()
        deadline = time.monotonic() + cfg.retry_budget_s
        last, errors, stale = "", 0, 0
        while True:
            replica = self.rotation.pick(session) or await self.rotation.take(session, deadline)
            if replica is None:
                break
            replica.outstanding += 1
            start = time.perf_counter()
            try:
                status, raw, retry_after, streamed = await self._post(replica, data, session, sink, start)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # A kept-alive connection the server closed as we reused it: once, retry at once.
                last = f"{replica.url}: {type(exc).__name__}: {exc}"
                stale += 1
                if isinstance(exc, aiohttp.ClientConnectorError):
                    # Nothing listens there (or it cannot be reached): out of rotation at once, back
                    # when a probe answers, and the call tries another replica without waiting.
                    self.rotation.refused(replica, last)
                    errors += 1
                    if self.rotation.ready():
                        continue
                elif stale > 1:
                    self.rotation.failed(replica, last)
                    errors += 1
                else:
                    continue
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = (
                    f"{replica.url}: {type(exc).__name__}: {exc}"
                    if str(exc)
                    else f"{replica.url}: {type(exc).__name__}"
                )
                self.rotation.failed(replica, last)
                errors += 1
            else:
                if status == 200:
                    self.rotation.ok(replica)
                    session.requests += 1
                    return streamed or self._parse(raw, replica.url, time.perf_counter() - start)
                detail = raw[:500].decode(errors="replace")
                last = f"{replica.url}: HTTP {status}: {detail}"
                if status == 400 and any(s in detail.lower() for s in _OVERFLOW):
                    raise ContextOverflow(detail)
                if status in _COOLING:
                    self.rotation.cool(replica, status, retry_after_s(retry_after))
                    continue
                if status < 500:
                    raise PolicyRejected(_refusal(replica.url, status, raw, data))
                self.rotation.failed(replica, last)
                errors += 1
            finally:
                replica.outstanding -= 1
            left = deadline - time.monotonic()
            if left <= 0:
                break
            delay = backoff_delay(cfg.backoff_s, cfg.backoff_max_s, errors - 1)
            await asyncio.sleep(min(delay, left))
        raise self._unavailable(last)

    async def _post(
        self, replica: Replica, data: bytes, session: Session, sink: Optional[Sink], start: float
    ) -> tuple[int, bytes, Optional[str], Optional[Completion]]:
        """One attempt: the status, the body (empty when streamed), Retry-After, the streamed completion."""
        if sink is not None:
            sink.clear()
        payload = aiohttp.payload.BytesPayload(data, content_type="application/json")
        async with self._session(replica).post(
            f"{replica.url}/v1/completions", data=payload, headers=self.rotation.headers(session)
        ) as resp:
            retry_after = resp.headers.get("Retry-After")
            if resp.status == 200 and sink is not None:
                return resp.status, b"", retry_after, await self._read_stream(resp, sink, replica.url, start)
            return resp.status, await resp.read(), retry_after, None

    @staticmethod
    async def _read_stream(resp: aiohttp.ClientResponse, sink: Sink, url: str, start: float) -> Completion:
        """A streamed completion (server-sent events, one per token or a few), each event's ids and
        logprobs appended to `sink` as it arrives; the whole completion once `[DONE]` came."""
        text: list[str] = []
        finish = ""
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return Completion(
                    list(sink.ids), list(sink.logprobs), "".join(text), finish, url, time.perf_counter() - start
                )
            try:
                chunk = _chunk_decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise PolicyRejected(
                    f"{url}: unreadable stream event ({exc}): {data[:300].decode(errors='replace')}"
                ) from None
            for choice in chunk.choices:
                lp = choice.logprobs
                sink.ids.extend(
                    int(t[9:]) if isinstance(t, str) and t.startswith(_TOKEN_PREFIX) else int(t) for t in lp.tokens
                )
                sink.logprobs.extend(float("nan") if x is None else x for x in lp.token_logprobs)
                sink.versions.extend([sink.stamp()] * (len(sink.ids) - len(sink.versions)))
                text.append(choice.text)
                finish = choice.finish_reason or finish
        raise aiohttp.ClientPayloadError(f"{url}: the stream ended before [DONE]")

    def _request_body(self, prompt_ids: list[int], sampling: dict[str, Any]) -> bytes:
        """The /v1/completions request: token ids in, token ids and their logprobs out."""
        return _json_encode(
            {
                "model": self.config.model,
                "prompt": prompt_ids,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                "skip_special_tokens": False,
                **self.config.extra,
                **{k: v for k, v in sampling.items() if v is not None},
            }
        )

    def _unavailable(self, last: str) -> PolicyUnavailable:
        """The error of a request that ran out of retry budget: the last failure and the replicas down."""
        down = ", ".join(
            f"{r.url} ({r.last_error or 'cooling'})" for r in self.replicas if not r.ready(time.monotonic())
        )
        return PolicyUnavailable(
            f"no policy answer within the {self.config.retry_budget_s:g}s retry budget "
            f"(policy_retry_budget_s); last: {last or 'no replica could take work'}"
            + (f"; unavailable: {down}" if down else "")
        )

    @staticmethod
    def _parse(raw: bytes, url: str, latency: float) -> Completion:
        try:
            choice = _completion_decoder.decode(raw).choices[0]
            lp = choice.logprobs
            ids = [int(t[9:]) if isinstance(t, str) and t.startswith(_TOKEN_PREFIX) else int(t) for t in lp.tokens]
            logprobs = [float("nan") if x is None else x for x in lp.token_logprobs]
            if choice.token_ids is not None and choice.token_ids != ids:
                raise ValueError("token_ids and logprob tokens disagree")
        except (msgspec.DecodeError, msgspec.ValidationError, IndexError, ValueError) as exc:
            raise PolicyRejected(
                f"{url}: unreadable completion ({type(exc).__name__}: {exc}): {raw[:300].decode(errors='replace')}"
            ) from None
        if len(ids) != len(logprobs):
            raise PolicyRejected(f"{url}: {len(ids)} token ids but {len(logprobs)} logprobs")
        return Completion(ids, logprobs, choice.text, choice.finish_reason or "", url, latency)

    async def prompt_logprobs(self, ids: list[int], session: Session) -> list[Optional[float]]:
        """Logprob of each given token under the policy (None for the first): for re-scoring."""
        replica = self.rotation.pick(session) or self.replicas[0]
        async with self._session(replica).post(
            f"{replica.url}/v1/completions",
            json={"model": self.config.model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0},
        ) as resp:
            resp.raise_for_status()
            entries = (await resp.json())["choices"][0]["prompt_logprobs"]
        out: list[Optional[float]] = []
        for tok, entry in zip(ids, entries):
            out.append(None if entry is None else float(entry[str(tok)]["logprob"]))
        return out

    async def aclose(self) -> None:
        await self.rotation.aclose()
        for fut in self._model_len.values():
            fut.cancel()
        for r in self.replicas:
            if r.session is not None and not r.session.closed:
                await r.session.close()
