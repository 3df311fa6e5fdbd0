"""The openai backend (policy_kind chat / responses): one client per replica, errors mapped once.

Evaluation and offline collection against hosted APIs, or against vLLM's chat endpoint, need
neither vLLM's /v1/completions nor the model's tokenizer: they speak chat completions or the
Responses API and return text (the conversations are workers/policy/openai_convo.py's).

One AsyncOpenAI client per base URL serves every agent loop of the worker process, made on
first use, over aiohttp (`openai.DefaultAioHttpClient`: httpx's own pool collapses past ~1000
concurrent requests) with at most `concurrency` connections. Replicas are chosen by the one
rotation (workers/policy/rotation.py): a rollout takes the replica with the fewest requests
outstanding (one whose request just failed goes last for COOLDOWN_S) and keeps it for its whole
conversation, and `ready()` is the rotation's. Hosted APIs have no /health, so this backend's
rotation runs no health probes, and errors never take a replica out of it. The client itself
retries connection errors, 408/409/429 and 5xx `policy_max_retries` times, honouring
Retry-After; what still fails is mapped here, the one place openai's exceptions are caught:

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

import logging
import time
from typing import Optional

import openai

from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from farm.settings import MASKED
from workers.policy.config import PolicyConfig
from workers.policy.openai_convo import ChatConversation, OpenAIConversation, ResponsesConversation
from workers.policy.protocol import ContextOverflow, PolicyUnavailable, Turn
from workers.policy.rotation import Replica, Rotation, Session

log = logging.getLogger("farm.hosted")

COOLDOWN_S = 10.0
_OVERFLOW = ("maximum context length", "context length", "max_model_len", "prompt is too long")
_NO_TOOL_PARSER = "--enable-auto-tool-choice"


class OpenAIPolicy:
    """One AsyncOpenAI client per replica (made on first use); `kind` chat or responses."""

    def __init__(self, config: PolicyConfig, kind: str):
        if kind not in ("chat", "responses"):
            raise ValueError(f"the openai backend serves policy_kind chat or responses, not {kind!r}")
        if not config.urls:
            raise ValueError("no policy_urls")
        self.config = config
        self.kind = kind
        self.rotation = Rotation(config, probes=False, failure_penalty_s=COOLDOWN_S)
        self.replicas = self.rotation.replicas
        self._index = {id(r): i for i, r in enumerate(self.replicas)}
        n = len(self.replicas)
        self.clients: list[Optional[openai.AsyncOpenAI]] = [None] * n
        self.prompted = [False] * n  # the server took no `tools`: describe them in the prompt

    def conversation(self, messages: list[dict], tools: list[dict]) -> OpenAIConversation:
        return (ChatConversation if self.kind == "chat" else ResponsesConversation)(messages, tools)

    def ready(self) -> bool:
        return self.rotation.ready()

    async def wait_ready(self) -> None:
        await self.rotation.wait_ready()

    def client(self, i: int) -> openai.AsyncOpenAI:
        client = self.clients[i]
        if client is None:
            cfg = self.config
            client = self.clients[i] = openai.AsyncOpenAI(
                base_url=f"{self.replicas[i].url}/v1",
                api_key=cfg.api_key or "EMPTY",
                timeout=cfg.timeout_s,
                max_retries=cfg.max_retries,
                http_client=_http_client(cfg.max_connections),
            )
        return client

    async def turn(self, convo: OpenAIConversation, sampling: dict, session: Session, step: int) -> Turn:
        replica = self.rotation.pick(session) or await self._wait_for_replica(session)
        i = self._index[id(replica)]
        headers = self.rotation.headers(session)
        replica.outstanding += 1
        try:
            if self.prompted[i]:
                convo.prompt_tools()
            try:
                turn = await convo.turn(self.client(i), self.config.model, sampling, step, headers)
            except openai.BadRequestError as exc:
                if _NO_TOOL_PARSER not in _server_message(exc) or not convo.tools:
                    raise
                if not self.prompted[i]:
                    log.warning(
                        "the policy at %s/v1 takes no tools (no --enable-auto-tool-choice); "
                        "describing them in the system prompt",
                        replica.url,
                    )
                self.prompted[i] = True
                convo.prompt_tools()
                turn = await convo.turn(self.client(i), self.config.model, sampling, step, headers)
        except openai.OpenAIError as exc:
            failure = self.failure(exc, replica)
            if isinstance(failure, RolloutFailure) and failure.retryable:
                self.rotation.failed(replica, failure.message)
            raise failure from None
        finally:
            replica.outstanding -= 1
        self.rotation.ok(replica)
        session.requests += 1
        return turn

    async def _wait_for_replica(self, session: Session) -> Replica:
        """A replica once one is back in rotation, within the retry budget."""
        budget = self.config.retry_budget_s
        replica = await self.rotation.take(session, time.monotonic() + budget)
        if replica is None:
            raise PolicyUnavailable(
                f"no policy replica could take work within the {budget:g}s retry budget (policy_retry_budget_s)"
            )
        return replica

    def failure(self, exc: openai.OpenAIError, replica: Replica) -> Exception:
        """openai's exception as a RolloutFailure (or ContextOverflow); the one place they are mapped."""
        cfg, where = self.config, f"the policy at {replica.url}/v1"
        tries = f"after {cfg.max_retries + 1} tries"
        if isinstance(exc, openai.APIConnectionError):
            # The aiohttp transport reports a refused connection as a connect *timeout*: look at the root cause.
            root: BaseException = exc
            while root.__cause__ is not None:
                root = root.__cause__
            if isinstance(root, TimeoutError) or "Timeout" in type(root).__name__:
                message = f"{where} did not answer within {cfg.timeout_s:g}s ({tries})"
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
        key = self.config.api_key
        text = " ".join(text.split())
        return text.replace(key, MASKED) if key else text

    async def aclose(self) -> None:
        await self.rotation.aclose()
        for client in self.clients:
            if client is not None:
                await client.close()
        self.clients = [None] * len(self.replicas)


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
