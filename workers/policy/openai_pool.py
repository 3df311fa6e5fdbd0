"""The openai client boundary of the hosted policy kinds: one client per replica, errors mapped once.

One AsyncOpenAI client per base URL serves every agent loop of the worker process, made on
first use, over aiohttp (`openai.DefaultAioHttpClient`: httpx's own pool collapses past ~1000
concurrent requests) with at most `concurrency` connections. A rollout takes the replica with
the fewest requests outstanding (one whose request just failed goes last for COOLDOWN_S) and
keeps it for its whole conversation. The client itself retries connection errors,
408/409/429 and 5xx `policy_max_retries` times, honouring Retry-After; what still fails is
mapped here, the one place openai's exceptions are caught:

    connection error, timeout, 408/409/429, 5xx   -> RolloutFailure(policy, retryable=True)
    a 4xx about the context length                -> ContextOverflow (the rollout ends `truncated`)
    any other 4xx                                 -> RolloutFailure(policy, retryable=False),
                                                     with the status and the server's message
    an answer the client cannot read              -> RolloutFailure(policy, retryable=False)

No message carries the API key: it is scrubbed from the server's messages too.

vLLM started without `--enable-auto-tool-choice` rejects requests that carry tools. After that
answer the replica is marked, and its conversations describe the tools in the system prompt
instead (the tokens path's convention for chat templates without tool support); the model's
Hermes `<tool_call>` tags are then parsed from the text.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import TYPE_CHECKING, Optional

import openai

from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from farm.settings import MASKED, Settings

if TYPE_CHECKING:
    from workers.loops.hosted import Conversation, Turn

log = logging.getLogger("farm.hosted")

COOLDOWN_S = 10.0
_OVERFLOW = ("maximum context length", "context length", "max_model_len", "prompt is too long")
_NO_TOOL_PARSER = "--enable-auto-tool-choice"


class ContextOverflow(Exception):
    """The conversation no longer fits the model's context: the rollout ends `truncated`."""


class Replicas:
    """One AsyncOpenAI client per base URL (made on first use), picked by least outstanding requests."""

    def __init__(self, settings: Settings):
        if not settings.policy_urls:
            raise ValueError("no policy_urls")
        self.settings = settings
        self.urls = [f"{root}/v1" for root in settings.policy_urls]
        n = len(self.urls)
        self.clients: list[Optional[openai.AsyncOpenAI]] = [None] * n
        self.outstanding = [0] * n
        self.failed_at = [float("-inf")] * n
        self.prompted = [False] * n  # the server took no `tools`: describe them in the prompt
        self._start = itertools.count()

    def pick(self) -> int:
        n, now, start = len(self.urls), time.monotonic(), next(self._start)
        return min(
            ((start + k) % n for k in range(n)),
            key=lambda i: (now - self.failed_at[i] < COOLDOWN_S, self.outstanding[i]),
        )

    def client(self, i: int) -> openai.AsyncOpenAI:
        if self.clients[i] is None:
            s = self.settings
            self.clients[i] = openai.AsyncOpenAI(
                base_url=self.urls[i],
                api_key=s.policy_api_key or "EMPTY",
                timeout=s.policy_timeout_s,
                max_retries=s.policy_max_retries,
                http_client=_http_client(max(8, s.concurrency)),
            )
        return self.clients[i]

    async def ask(self, i: int, convo: Conversation, sampling: dict, step: int) -> Turn:
        self.outstanding[i] += 1
        try:
            if self.prompted[i]:
                convo.prompt_tools()
            try:
                return await convo.turn(self.client(i), self.settings.policy_model, sampling, step)
            except openai.BadRequestError as exc:
                if _NO_TOOL_PARSER not in _server_message(exc) or not convo.tools:
                    raise
                if not self.prompted[i]:
                    log.warning(
                        "the policy at %s takes no tools (no --enable-auto-tool-choice); "
                        "describing them in the system prompt",
                        self.urls[i],
                    )
                self.prompted[i] = True
                convo.prompt_tools()
                return await convo.turn(self.client(i), self.settings.policy_model, sampling, step)
        except openai.OpenAIError as exc:
            failure = self.failure(exc, i)
            if isinstance(failure, RolloutFailure) and failure.retryable:
                self.failed_at[i] = time.monotonic()
            raise failure from None
        finally:
            self.outstanding[i] -= 1

    def failure(self, exc: openai.OpenAIError, i: int) -> Exception:
        """openai's exception as a RolloutFailure (or ContextOverflow); the one place they are mapped."""
        s, where = self.settings, f"the policy at {self.urls[i]}"
        tries = f"after {s.policy_max_retries + 1} tries"
        if isinstance(exc, openai.APIConnectionError):
            # The aiohttp transport reports a refused connection as a connect *timeout*: look at the root cause.
            root: BaseException = exc
            while root.__cause__ is not None:
                root = root.__cause__
            if isinstance(root, TimeoutError) or "Timeout" in type(root).__name__:
                message = f"{where} did not answer within {s.policy_timeout_s:g}s ({tries})"
            else:
                message = f"cannot reach {where} ({tries}): {type(root).__name__}: {root}"
            retryable = True
        elif isinstance(exc, openai.APIStatusError):
            status, text = exc.status_code, _server_message(exc)
            if status in (400, 413, 422) and (
                exc.code == "context_length_exceeded" or any(m in text.lower() for m in _OVERFLOW)
            ):
                return ContextOverflow(self.scrub(text))
            retryable = status in (408, 409, 429) or status >= 500
            message = f"{where} answered HTTP {status}" + (f" ({tries})" if retryable else "") + f": {text}"
        else:
            message, retryable = f"{where} sent an answer the client cannot read: {type(exc).__name__}: {exc}", False
        return RolloutFailure(ErrorKind.policy, self.scrub(message), retryable=retryable)

    def scrub(self, text: str) -> str:
        key = self.settings.policy_api_key
        text = " ".join(text.split())
        return text.replace(key, MASKED) if key else text

    async def aclose(self) -> None:
        for client in self.clients:
            if client is not None:
                await client.close()
        self.clients = [None] * len(self.urls)


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:1000]
    return str(body if body is not None else exc.message)[:1000]


def _http_client(max_connections: int):
    """aiohttp under the openai client when this openai provides it; None: openai's own httpx pool."""
    factory = getattr(openai, "DefaultAioHttpClient", None)
    if factory is None:
        log.warning(
            "openai %s has no DefaultAioHttpClient; the policy client falls back to httpx's pool", openai.__version__
        )
        return None
    limits = type(openai.DEFAULT_CONNECTION_LIMITS)(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    try:
        return factory(limits=limits)
    except RuntimeError:  # openai without its aiohttp extra
        log.warning("openai[aiohttp] is not installed; the policy client falls back to httpx's pool")
        return None
