"""What the stub answers, and when: the script, the options, and the state they draw from.

Latency (`latency_dist`): `fixed`; `uniform` in latency +- jitter (the default; jitter 0 is
fixed); `lognormal` with median = latency and shape `sigma`, the heavy tail of real generation
lengths, where a few slow samples hold up a whole GRPO step. Every draw (latency, random
replies, injected errors) comes from one generator seeded by `seed`.

Replies (`pick`): `scripted` answers a completion with the first token reply not yet inside the
prompt; `random` with any token reply, drawn by `weights` (default equal), so an environment that
grades them gives rewards that vary within a group (and some groups get all-equal rewards, as
GRPO's zero-variance groups). Chat and Responses replies follow the assistant turns either way.
With `filler_tokens` N, a token reply starts with N ids drawn from the script's `filler` (a short
"thought"), so the G samples of one prompt differ as sampled completions do, and a prefix cache
cannot serve one sample's next turn from another's; the scripted order still holds.

Prefill (`prefix_cache_tokens`, `prefill_s_per_token`): each process is one replica with a prefix
cache of that many tokens (prefix.py, vLLM's automatic prefix caching; 0, the default, is off),
and a completion is answered prefill_s_per_token x its uncached prompt tokens later than the
latency drawn. Only /v1/completions (token ids) has a cache: chat and Responses requests carry
text, so they are never cached or charged. The reply's `usage.prompt_tokens_details.cached_tokens`
says what was found, as vLLM's does.

The HTTP side (server.py) keeps, per connection, the requests not yet answered; `pending` and
`aborts` here are their totals.
"""

from __future__ import annotations

import math
import random
import time
from array import array
from collections import Counter, deque
from typing import Any, Optional

import msgspec

from workers.policy.stub.prefix import PrefixCache

_json = msgspec.json
DISTS = ("fixed", "uniform", "lognormal")
PICKS = ("scripted", "random")
MAX_ABORTS = 100_000
CONTINUED = "stub_continued"  # a completion's reply: how many of its ids the prompt already held
CONTINUE_MIN = 4  # a prompt ending with this many of a reply's first ids continues that reply


class BadParameter(ValueError):
    """A sampling value vLLM refuses (its SamplingParams checks): answered 400 with the parameter named."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def check_sampling(body: dict) -> None:
    """vLLM's checks of the sampling values the farm sends, with its messages; unknown keys are
    ignored, as vLLM ignores them."""
    t, p, k, m = (body.get(key) for key in ("temperature", "top_p", "top_k", "max_tokens"))
    number = (int, float)
    if t is not None and (not isinstance(t, number) or t < 0):
        raise BadParameter("temperature", f"temperature must be non-negative, got {t}.")
    if p is not None and (not isinstance(p, number) or not 0 < p <= 1):
        raise BadParameter("top_p", f"top_p must be in (0, 1], got {p}.")
    if k is not None and (not isinstance(k, int) or (k < 1 and k not in (0, -1))):
        raise BadParameter("top_k", f"top_k must be 0 (disable), or at least 1, got {k}.")
    if m is not None and (not isinstance(m, int) or m < 1):
        raise BadParameter("max_tokens", f"max_tokens must be at least 1, got {m}.")


class Script(msgspec.Struct, kw_only=True):
    """What the server answers: token replies (completions) and message replies (chat / responses)."""

    token_replies: list[list[int]] = []  # each ends with the model's EOS id
    text_replies: list[str] = []  # the same as text: the stub tokenizes each (+ EOS) at start-up
    token_logprob: float = -0.25
    filler: list[int] = []  # ids a token reply may start with (Options.filler_tokens): plain words
    chat_replies: list[dict[str, Any]] = []  # {"content": str, "tool_calls": [{"name", "arguments"}]}
    model: str = "stub"
    max_model_len: int = 4096


class Options(msgspec.Struct, kw_only=True):
    """How the server answers: latency, replies, faults. The command line's options, and the keys
    POST /control changes (so the two cannot drift apart)."""

    latency_s: float = 0.05
    jitter_s: float = 0.0
    latency_dist: str = "uniform"  # see DISTS
    sigma: float = 1.0  # lognormal shape: p90 = median x e^(1.28 sigma)
    seed: Optional[int] = None
    pick: str = "scripted"  # see PICKS
    weights: Optional[list[float]] = None  # of the token replies, for pick "random"
    fault: Optional[int] = None
    error_rate: float = 0.0
    retry_after: Optional[float] = None
    prefix_cache_tokens: int = 0  # the replica's prefix cache, in tokens (0: off)
    prefill_s_per_token: float = 0.0  # added to a completion's latency per uncached prompt token
    filler_tokens: int = 0  # ids drawn from the script's filler at the start of each token reply
    # Token by token (generate.py, engine.py): a streamed reply's pace, and the engine mode.
    per_token_s: Optional[float] = None  # seconds per generated token (None: the drawn latency, spread)
    engine: bool = False  # continuous batching in decode steps, with KV capacity and preemption
    step_s: float = 0.02  # engine: one decode step's fixed time ...
    step_s_per_seq: float = 0.0002  # ... plus this per running sequence
    max_num_seqs: int = 256  # engine: running sequences at most (vLLM's --max-num-seqs)
    kv_capacity_tokens: int = 0  # engine: KV cache in tokens over running sequences (0: unbounded)

    def check(self, script: Script) -> None:
        if self.latency_dist not in DISTS:
            raise ValueError(f"latency_dist must be one of {DISTS}")
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {PICKS}")
        if self.weights is not None and len(self.weights) != len(script.token_replies):
            raise ValueError(f"weights: {len(self.weights)} for {len(script.token_replies)} token replies")
        if self.latency_s < 0 or self.sigma < 0:
            raise ValueError("latency_s and sigma must be >= 0")
        if self.prefix_cache_tokens < 0 or self.prefill_s_per_token < 0:
            raise ValueError("prefix_cache_tokens and prefill_s_per_token must be >= 0")
        if self.filler_tokens < 0 or (self.filler_tokens and not script.filler):
            raise ValueError("filler_tokens must be >= 0, and needs the script's filler ids")
        if (self.per_token_s is not None and self.per_token_s < 0) or self.step_s < 0 or self.step_s_per_seq < 0:
            raise ValueError("per_token_s, step_s and step_s_per_seq must be >= 0")
        if self.max_num_seqs < 1 or self.kv_capacity_tokens < 0:
            raise ValueError("max_num_seqs must be >= 1 and kv_capacity_tokens >= 0")
        if self.engine and self.step_s + self.step_s_per_seq <= 0:
            raise ValueError("engine mode needs step_s or step_s_per_seq > 0")


class State:
    def __init__(self, script: Script, options: Options):
        options.check(script)
        self.script, self.o = script, options
        self.rng = random.Random(options.seed)
        self.stats: Counter = Counter()
        self.pending = 0
        self.aborts: deque[tuple[float, float]] = deque(maxlen=MAX_ABORTS)
        self.packed = [array("i", r).tobytes() for r in script.token_replies]
        self.cache = PrefixCache(options.prefix_cache_tokens)

    def change(self, change: dict) -> None:
        """Apply a /control body: only the keys it names change; a new seed restarts the draws."""
        if "fault" in change and change["fault"] in ("none", 0):
            change = {**change, "fault": None}
        # Lax: a value sent as text ("503", "0.5") is taken as the number it spells, as it always was.
        merged = msgspec.convert({**msgspec.structs.asdict(self.o), **change}, Options, strict=False)
        merged.check(self.script)
        self.o = merged
        if "seed" in change:
            self.rng = random.Random(merged.seed)
        self.cache.resize(merged.prefix_cache_tokens)

    def delay(self) -> float:
        o = self.o
        if o.latency_dist == "lognormal":
            return o.latency_s and self.rng.lognormvariate(math.log(o.latency_s), o.sigma)
        if o.latency_dist == "uniform" and o.jitter_s:
            return max(0.0, o.latency_s + self.rng.uniform(-o.jitter_s, o.jitter_s))
        return o.latency_s

    def prefill_s(self, reply: dict) -> float:
        """The prefill time of a reply: its uncached prompt tokens' (a completion's only)."""
        usage = reply.get("usage") or {}
        details = usage.get("prompt_tokens_details")
        if not details or not self.o.prefill_s_per_token:
            return 0.0
        return self.o.prefill_s_per_token * (usage["prompt_tokens"] - details["cached_tokens"])

    def injected(self) -> Optional[int]:
        if self.o.fault is None:
            return None
        if self.o.error_rate and self.rng.random() >= self.o.error_rate:
            return None
        return self.o.fault

    # -- replies --------------------------------------------------------------------------
    def completion(self, body: dict) -> dict:
        check_sampling(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("prompt must be a non-empty list of token ids")
        if len(prompt) >= self.script.max_model_len:
            raise ValueError(f"This model's maximum context length is {self.script.max_model_len} tokens")
        continued = self._continued(prompt)
        if continued is not None:  # an interrupted turn sent back: the rest of the same reply
            done, ids = continued
        else:
            done, ids = 0, self._token_reply(prompt)
            if self.o.filler_tokens:
                ids = self.rng.choices(self.script.filler, k=self.o.filler_tokens) + ids
        finish = "stop"
        limit = body.get("max_tokens")
        if isinstance(limit, int) and limit < len(ids):
            ids, finish = ids[:limit], "length"
        cached = self.cache.admit(prompt, ids)
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
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
            CONTINUED: done,  # taken off by the server: a continuation takes the rest of the time only
        }

    def _continued(self, prompt: list[int]) -> Optional[tuple[int, list[int]]]:
        """(k, the rest) when the prompt ends with the first k >= CONTINUE_MIN ids of a token reply,
        as the prompt of a continuation does (an interrupted rollout's ids sent back): the model
        goes on with the same reply, as a greedy model would, instead of starting a new one. Fewer
        ids than that start a new reply, so a prompt that merely ends like a reply is not taken."""
        for reply in self.script.token_replies:
            for k in range(min(len(reply) - 1, len(prompt)), CONTINUE_MIN - 1, -1):
                if prompt[-k:] == reply[:k]:
                    return k, reply[k:]
        return None

    def _token_reply(self, prompt: list[int]) -> list[int]:
        replies = self.script.token_replies
        if not replies:
            raise ValueError("the script has no token replies")
        if self.o.pick == "random":
            return self.rng.choices(replies, self.o.weights)[0]
        packed = array("i", prompt).tobytes()
        return next((r for r, p in zip(replies, self.packed) if p not in packed), replies[-1])

    def _chat_reply(self, turn: int) -> dict:
        replies = self.script.chat_replies or [{"content": "ok"}]
        return replies[min(turn, len(replies) - 1)]

    def chat(self, body: dict) -> dict:
        check_sampling(body)
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
