"""The bridge: a harness's chat history back to the token ids the policy sampled, never re-rendered.

A harness sends its whole conversation on every call, as text: the model's earlier replies come
back as messages (content, tool calls), not as the ids that were sampled. Rendering that text
through the chat template again would give other ids than the sampled ones (SmolLM2's template
cannot even render an assistant message whose content is null), so the gateway never does it.
Each reply it gives ends a *chain*: the ids through that reply, kept under a key of the history
that led to it plus the reply itself. A call's prompt is then the ids of the longest chain its
history extends, plus the template's rendering of the new tail only (tool results, a user
message), found as ChatTokenizer.append_ids finds the environment's ids in the native loop.

Matching. Messages are compared in a canonical form: role (developer as system), content as text
(None equals "", a list of text parts joined), tool-call ids, names and arguments as canonical
JSON (sorted keys), a tool message's call id. The tools offered (canonical JSON) seed the key, so a
call with other tools or another system prompt matches nothing. Keys are rolling hashes
(blake2b), one per prefix of the history, so finding the longest chain costs one pass over the
history, whatever the number of chains.

Segments. A rollout's trace is one or more segments, each a prompt and the ids after it (sampled:
env_mask 1; inserted by the template: env_mask 0). A call that extends the newest chain of a
segment appends to it. A call that extends an older chain (the harness retried a call, or ran
two from one point concurrently) forks: a new segment whose prompt holds the chain's ids, so
those sampled tokens are trained once, in the segment that sampled them. A history that extends
no chain (the harness edited or dropped messages) starts a new segment from the template's
rendering of the whole history.

A reply that ended without the model's EOS (cut at max_tokens, or at a stop string) can still be
extended: the EOS is then inserted as an environment token (env_mask 0, never trained) before the
tail, and counted (`unterminated_turns`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import msgspec

from farm.schema import TokenTrace
from workers.policy.chat import ChatTokenizer, chat_tools

_encode = msgspec.json.Encoder().encode
ROLES = ("system", "user", "assistant", "tool")


class BadHistory(ValueError):
    """A message the gateway cannot read (its text says which and why): an OpenAI 400."""


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON (sorted keys, no spaces); text that is not JSON as it is."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def text_of(content: Any) -> str:
    """A message's content as text: None is "", a list of parts is their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in ("refusal",):
                out.append(str(part.get("refusal", "")))
            else:
                raise BadHistory(f"content part {str(part)[:80]!r} is not text (only text parts are supported)")
        return "".join(out)
    raise BadHistory(f"content must be a string or a list of text parts, not {type(content).__name__}")


@dataclass(frozen=True)
class Message:
    """One chat message in canonical form (what matching compares)."""

    role: str
    content: str
    calls: tuple[tuple[str, str, str], ...] = ()  # (call id, name, canonical arguments)
    call_id: str = ""  # a tool message's tool_call_id

    def key(self) -> bytes:
        return _encode((self.role, self.content, self.calls, self.call_id))


def chat_message(m: Any, index: int) -> Message:
    """A Chat Completions message as a canonical Message; BadHistory names what cannot be read."""
    if not isinstance(m, dict):
        raise BadHistory(f"messages[{index}] must be an object")
    role = m.get("role")
    role = "system" if role == "developer" else role
    if role not in ROLES:
        raise BadHistory(f"messages[{index}].role must be one of {', '.join(ROLES)}, got {str(role)[:40]!r}")
    calls = []
    for j, c in enumerate(m.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadHistory(f"messages[{index}].tool_calls[{j}] must have a function with a name")
        calls.append((str(c.get("id", "")), fn["name"], canonical_arguments(fn.get("arguments", "{}"))))
    if m.get("function_call"):
        raise BadHistory(f"messages[{index}].function_call (the legacy form) is not supported; use tool_calls")
    return Message(role, text_of(m.get("content")), tuple(calls), str(m.get("tool_call_id") or ""))


def template_message(m: Message, native_tools: bool) -> dict:
    """A message as the chat template renders it (tool calls as Hermes text unless the template has tools)."""
    if m.role != "assistant" or not m.calls:
        return {"role": m.role, "content": m.content}
    if native_tools:
        calls = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": json.loads(args)}}
            for cid, name, args in m.calls
        ]
        return {"role": "assistant", "content": m.content, "tool_calls": calls}
    blocks = [
        f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>' for _, name, args in m.calls
    ]
    return {"role": "assistant", "content": "\n".join(([m.content] if m.content else []) + blocks)}


@dataclass
class Segment:
    """A prompt and the ids after it: sampled (mask 1, with logprobs) or inserted by the template (mask 0)."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)

    def add(self, ids: list[int], logprobs: list[float], sampled: bool) -> None:
        if sampled:
            self.turns.append((len(self.ids), len(self.ids) + len(ids)))
        self.ids += ids
        self.logprobs += logprobs if sampled else [0.0] * len(ids)
        self.mask += [int(sampled)] * len(ids)

    def trace(self) -> TokenTrace:
        return TokenTrace.build(self.prompt, self.ids, self.logprobs, self.mask, self.turns)


@dataclass
class Chain:
    """The end of a reply the gateway gave: where its ids end in their segment, and the template's view."""

    segment: Segment
    end: int  # len(segment.ids) right after the reply's sampled ids
    history: list[dict]  # template-form messages through the reply (tools in the system prompt if need be)
    tools: Optional[list[dict]]  # the tools as the template takes them
    ended: bool  # the reply ended with the model's EOS


@dataclass
class Plan:
    """What one call sends: the prompt ids, and what recording its reply needs."""

    prompt: list[int]
    chain: Optional[Chain]
    inserted: list[int]  # ids the template adds after the chain (mask 0)
    history: list[dict]
    tools: Optional[list[dict]]
    key: bytes  # of the history the call sent


class Bridge:
    """One rollout's chains and segments, over the policy's tokenizer."""

    def __init__(self, tok: ChatTokenizer):
        self.tok = tok
        self.chains: dict[bytes, Chain] = {}
        self.segments: list[Segment] = []
        self.counts: Counter = Counter()
        # every reply's ids as the model returned them, and where they went (the exactness check)
        self.replies: list[tuple[Segment, int, list[int]]] = []
        self._last: tuple[bytes, list[Message], list[bytes]] = (b"", [], [])  # the last call's tools, history, keys

    @staticmethod
    def keys(messages: list[Message], tools: list[dict], start: Optional[bytes] = None) -> list[bytes]:
        """The rolling key of each prefix of `messages` (tools seed it), or of what follows the prefix
        whose key is `start`."""
        h = hashlib.blake2b(_encode(tools), digest_size=16).digest() if start is None else start
        out = []
        for m in messages:
            h = hashlib.blake2b(h + m.key(), digest_size=16).digest()
            out.append(h)
        return out

    def _keys(self, messages: list[Message], tools: list[dict]) -> list[bytes]:
        """Bridge.keys, reusing the last call's keys for the messages it shares with this one: a harness
        resends its whole history, and hashing all of it on every call grew with the square of the turns."""
        seed = _encode(tools)
        last_seed, last, last_keys = self._last
        n, limit = 0, min(len(messages), len(last)) if seed == last_seed else 0
        while n < limit and messages[n] == last[n]:
            n += 1
        keys = last_keys[:n] + self.keys(messages[n:], tools, last_keys[n - 1] if n else None)
        self._last = (seed, messages, keys)
        return keys

    def plan(self, messages: list[Message], tools: list[dict]) -> Plan:
        """The prompt for a call with this history and these (chat-form) tools."""
        tools = chat_tools(tools)
        keys = self._keys(messages, tools)
        native = self.tok.native_tools
        for i in range(len(messages) - 1, -1, -1):
            chain = self.chains.get(keys[i])
            if chain is None:
                continue
            tail = [template_message(m, native) for m in messages[i + 1 :]]
            try:
                inserted = self.tok.append_ids(chain.history, chain.tools, tail)
            except ValueError as exc:
                raise BadHistory(f"the chat template cannot extend this conversation: {exc}") from None
            if not chain.ended:
                inserted = [self.tok.eos_id, *inserted]
            seg = chain.segment
            prompt = seg.prompt + seg.ids[: chain.end] + inserted
            return Plan(prompt, chain, inserted, chain.history + tail, chain.tools, keys[-1])
        history, template_tools = self.tok.with_tools([template_message(m, native) for m in messages], tools)
        prompt = self.tok.prompt_ids(history, template_tools)
        return Plan(prompt, None, [], history, template_tools, keys[-1] if keys else b"")

    def record(self, plan: Plan, ids: list[int], logprobs: list[float], text: str, reply: Message) -> None:
        """A reply to `plan`'s call: its ids into a segment, and the chain it ends."""
        chain = plan.chain
        if chain is not None and chain.end == len(chain.segment.ids):
            seg = chain.segment
            seg.add(plan.inserted, [], sampled=False)
            self.counts["extended"] += 1
            if not chain.ended:
                self.counts["unterminated_turns"] += 1
        else:
            seg = Segment(list(plan.prompt))
            self.segments.append(seg)
            self.counts["forks" if chain is not None else "new_segments"] += 1
        self.replies.append((seg, len(seg.ids), list(ids)))
        seg.add(ids, logprobs, sampled=True)
        ended = bool(ids) and ids[-1] == self.tok.eos_id
        history = [*plan.history, {"role": "assistant", "content": text}]
        key = hashlib.blake2b(plan.key + reply.key(), digest_size=16).digest()
        self.chains[key] = Chain(seg, len(seg.ids), history, plan.tools, ended)

    def retokenized(self) -> int:
        """Sampled ids in the trace that differ from what the model returned (0, or the bridge is broken)."""
        wrong = 0
        for seg, start, ids in self.replies:
            traced = seg.ids[start : start + len(ids)]
            wrong += sum(x != y for x, y in zip(traced, ids)) + len(ids) - len(traced)
            wrong += sum(1 for m in seg.mask[start : start + len(ids)] if m != 1)
        return wrong

    def metrics(self) -> dict[str, Any]:
        completion = sum(sum(s.mask) for s in self.segments)
        inserted = sum(len(s.mask) for s in self.segments) - completion
        return {
            "prompt_tokens": len(self.segments[0].prompt) if self.segments else 0,
            "completion_tokens": completion,
            "env_tokens": inserted,
            "segments": len(self.segments),
            "forks": self.counts["forks"],
            "unterminated_turns": self.counts["unterminated_turns"],
            "retokenized_tokens": self.retokenized(),
        }
