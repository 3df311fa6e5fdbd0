"""The tokens backend: token ids in and out of the policy, through the model's own chat template.

The conversation is the token trace. It keeps the first prompt's ids, then every sampled id
(env_mask 1, with its logprob) and every id the environment inserted (env_mask 0, logprob
0.0). Before each call the new prompt is checked to extend the previous prompt + completion
exactly, and the environment's ids are appended without re-tokenizing the sampled ones
(ChatTokenizer.append_ids); a broken invariant fails the rollout (kind `invariant`) rather
than feeding the trainer wrong tokens. A turn that does not end with the model's EOS ends the
conversation (`Turn.ended` false), and one cut at max_tokens is `truncated`.

The client is workers/policy/tokens.py's PolicyClient (the rotation, retries, parsing), or
any stand-in with its `complete` and `max_model_len` (tests' scripted policies, always ready).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

from farm.errors import RolloutFailure
from farm.schema import ErrorKind, TokenTrace, pack_i32
from workers.policy.chat import ChatTokenizer, parse_tool_calls
from workers.policy.protocol import ContextOverflow, Turn
from workers.policy.rotation import Session
from workers.policy.tokens import Completion, Sink


class CompletionClient(Protocol):
    async def complete(self, prompt_ids: list[int], sampling: dict[str, Any], session: Session) -> Completion: ...

    async def max_model_len(self, session: Session) -> Optional[int]: ...

    async def aclose(self) -> None: ...


class TokenConversation:
    def __init__(self, tok: ChatTokenizer, messages: list[dict], tools: list[dict]):
        self.tok = tok
        self.history, self.template_tools = tok.with_tools(messages, tools)
        self.prompt = tok.prompt_ids(self.history, self.template_tools)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.mask: list[int] = []
        self.turns: list[tuple[int, int]] = []
        self.sent: Optional[list[int]] = None  # the last request plus its completion
        self._request: list[int] = []
        self.versions: list[int] = []  # the policy version of each completion id
        self.version_of: Callable[[], int] = lambda: 0  # the policy version served now (the loop sets it)
        # The turn being sampled: ids received so far (streamed), or carried over from an
        # interrupted rollout (`restore`), which the next request continues instead of re-sampling.
        self.open = Sink(stamp=lambda: self.version_of())
        self.carried = Sink()

    def request(self, step: int) -> list[int]:
        """The next prompt: the first one, then every id since; it must extend the last one sent."""
        request = self.prompt + self.ids + self.carried.ids
        if self.sent is not None and request[: len(self.sent)] != self.sent:
            raise RolloutFailure(ErrorKind.invariant, f"turn {step}: prompt does not extend the previous one")
        self._request = request
        return request

    def add_reply(self, turn: Turn) -> None:
        """The turn's ids (the carried ones first, when the turn went on from an interrupted one)."""
        carried = self.carried
        new = turn.ids[len(carried.ids) :]
        self.sent = self._request + new
        self.turns.append((len(self.ids), len(self.ids) + len(turn.ids)))
        self.ids += turn.ids
        self.logprobs += turn.logprobs
        self.mask += [1] * len(turn.ids)
        stamped = self.open.versions if len(self.open.versions) == len(new) else [self.version_of()] * len(new)
        self.versions += carried.versions + stamped
        self.carried, self.open = Sink(), Sink(stamp=lambda: self.version_of())
        self.history.append({"role": "assistant", "content": turn.text})

    def extend(self, messages: list[dict]) -> None:
        """The environment's messages as ids (env_mask 0), rendered by the template after the last turn."""
        new = [{"role": m["role"], "content": m["content"]} for m in messages]  # what the template sees
        try:
            env_ids = self.tok.append_ids(self.history, self.template_tools, new)
        except ValueError as exc:
            raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
        self.history += new
        self.ids += env_ids
        self.logprobs += [0.0] * len(env_ids)
        self.mask += [0] * len(env_ids)
        self.versions += [self.version_of()] * len(env_ids)

    def token_metrics(self) -> dict[str, Any]:
        completion = sum(self.mask)
        return {
            "prompt_tokens": len(self.prompt),
            "completion_tokens": completion,
            "env_tokens": len(self.mask) - completion,
        }

    def rollout_fields(self) -> dict[str, Any]:
        try:
            trace = TokenTrace.build(self.prompt, self.ids, self.logprobs, self.mask, self.turns)
        except ValueError as exc:
            raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
        if len(set(self.versions)) > 1:  # one version throughout: the rollout's policy_version says it
            trace.versions = pack_i32(self.versions)
        return {"trace": trace}

    def snapshot(self) -> tuple[TokenTrace, int, list[dict]]:
        """Where it stands, the open turn included: the trace (every id with its logprob and version),
        how many of its last ids are the open turn, and the messages the template renders."""
        open_ids = self.carried.ids + self.open.ids
        open_lps = self.carried.logprobs + self.open.logprobs[: len(self.open.ids)]
        open_versions = self.carried.versions + self.open.versions[: len(self.open.ids)]
        open_versions += [self.version_of()] * (len(open_ids) - len(open_versions))
        ids, n = self.ids + open_ids, len(open_ids)
        turns = self.turns + ([(len(self.ids), len(ids))] if n else [])
        trace = TokenTrace.build(self.prompt, ids, self.logprobs + open_lps, self.mask + [1] * n, turns)
        trace.versions = pack_i32(self.versions + open_versions)
        return trace, n, list(self.history)

    def restore(self, trace: TokenTrace, open_turn: int, messages: list[dict]) -> None:
        """Go on from a snapshot: its ids as they were sampled (never re-tokenized), its open turn
        carried into the next request."""
        ids, lps, mask = list(trace.completion()), list(trace.completion_logprobs()), trace.mask()
        versions = list(trace.token_versions(self.version_of()))
        cut = len(ids) - open_turn
        self.prompt = list(trace.prompt())
        self.ids, self.logprobs, self.mask, self.versions = ids[:cut], lps[:cut], mask[:cut], versions[:cut]
        self.turns = [t for t in trace.turns if t[1] <= cut]
        self.history = list(messages)
        self.sent = self.prompt + self.ids if self.ids else None
        self.carried = Sink(ids[cut:], lps[cut:], versions[cut:])


class TokenPolicy:
    def __init__(self, client: CompletionClient, tokenizer: ChatTokenizer):
        self.client = client
        self.tok = tokenizer
        # Streamed completions (PolicyClient with policy_stream): an interrupted turn keeps its ids.
        self.streams = bool(getattr(client, "streams", False))

    def conversation(self, messages: list[dict], tools: list[dict]) -> TokenConversation:
        return TokenConversation(self.tok, messages, tools)

    async def turn(self, convo: TokenConversation, sampling: dict[str, Any], session: Session, step: int) -> Turn:
        request = convo.request(step)
        budget = await self.client.max_model_len(session)
        max_tokens = sampling.get("max_tokens")
        if budget is not None:
            room = budget - len(request)
            if room <= 0:
                raise ContextOverflow(f"a {len(request)}-token prompt leaves no room in a {budget}-token context")
            max_tokens = min(max_tokens or room, room)
        carried = convo.carried
        if carried.ids and max_tokens is not None:
            max_tokens -= len(carried.ids)  # the interrupted turn's budget, not a new one
        wanted = {**sampling, "max_tokens": max_tokens}
        if self.streams:
            c = await self.client.complete(request, wanted, session, sink=convo.open)  # type: ignore[call-arg]
        else:
            c = await self.client.complete(request, wanted, session)
        if len(c.ids) != len(c.logprobs):
            raise RolloutFailure(ErrorKind.invariant, f"{len(c.ids)} ids but {len(c.logprobs)} logprobs")
        ids, logprobs = carried.ids + c.ids, carried.logprobs + c.logprobs
        ended = bool(ids) and ids[-1] == self.tok.eos_id
        text = self.tok.decode(ids[:-1] if ended else ids)
        return Turn(
            text,
            parse_tool_calls(text, step) if ended else [],
            truncated=c.finish_reason == "length",
            ended=ended,
            ids=ids,
            logprobs=logprobs,
        )

    def ready(self) -> bool:
        """A stand-in client without replicas (tests' scripted policies) is always ready."""
        ready = getattr(self.client, "ready", None)
        return ready is None or ready()

    async def wait_ready(self) -> None:
        wait = getattr(self.client, "wait_ready", None)
        if wait is not None:
            await wait()

    async def aclose(self) -> None:
        await self.client.aclose()
