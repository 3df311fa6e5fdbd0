"""What a policy is to the agent loop (workers/loops/loop.py): the `Policy` and `Conversation`
protocols, the `Turn` a model call returns, and the errors every backend raises.

Two backends implement it, and the loop drives both the same way:

  tokens     workers/policy/token_policy.py: token ids in and out of vLLM's /v1/completions
             (workers/policy/tokens.py) through the model's own chat template; the
             conversation is the token trace the trainer gets (ids, logprobs, env_mask, turns).
  chat,      workers/policy/openai_pool.py: the openai client (chat completions or the
  responses  Responses API); the conversation is the messages or items it sends (text only).

A rollout's conversation is made by its policy (`policy.conversation(...)`) and only that
policy reads it; the loop adds to it what the model said (`add_reply`) and what the
environment answered (`extend`, in chat-message form), and asks it at the end for the token
counts and the rollout's trace. Replica choice is the one rotation (workers/policy/rotation.py)
behind both backends, so `ready()` means the same for both.

Errors, by boundary:

    RolloutFailure (kind `policy`)
    ├── PolicyUnavailable   no replica answered within the retry budget
    └── PolicyRejected      a 4xx, or an answer that cannot be read
    ContextOverflow         the prompt does not fit (not a failure: a truncated rollout)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, TypeVar, Union

from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from workers.policy.chat import BadToolCall, ToolCall
from workers.policy.rotation import Session

__all__ = [
    "Call",
    "ContextOverflow",
    "Conversation",
    "Policy",
    "PolicyRejected",
    "PolicyUnavailable",
    "Session",
    "Turn",
]

Call = Union[ToolCall, BadToolCall]


class ContextOverflow(Exception):
    """The conversation (plus at least one new token) no longer fits the model's context: the
    rollout ends `truncated`."""


class PolicyUnavailable(RolloutFailure):
    def __init__(self, message: str):
        super().__init__(ErrorKind.policy, message, retryable=False)


class PolicyRejected(RolloutFailure):
    def __init__(self, message: str):
        super().__init__(ErrorKind.policy, message, retryable=False)


@dataclass
class Turn:
    """One model call's answer."""

    text: str
    calls: list[Call]
    truncated: bool = False  # cut at max_tokens
    ended: bool = True  # the model ended its turn (its EOS): the conversation can go on
    usage: Optional[tuple[int, int]] = None  # prompt and completion tokens, when the server reports them
    ids: list[int] = field(default_factory=list)  # tokens backend: the sampled ids and their logprobs
    logprobs: list[float] = field(default_factory=list)
    reply: Any = None  # openai backend: the message or output items the next request repeats


class Conversation(Protocol):
    """One rollout's conversation as its policy keeps it."""

    def add_reply(self, turn: Turn) -> None:
        """What the model said, as the next request must repeat it (called for every turn)."""

    def extend(self, messages: list[dict]) -> None:
        """The environment's answer: `{"role": "tool", "tool_call_id", "content"}` and
        `{"role": "user", "content"}` messages (called only when another turn follows)."""

    def token_metrics(self) -> dict[str, Any]:
        """The rollout's token counts (prompt_tokens, completion_tokens, ...) as far as known."""

    def rollout_fields(self) -> dict[str, Any]:
        """The rollout's token fields: the trace, or none (and not trainable) for text backends."""


C = TypeVar("C", bound=Conversation)


class Policy(Protocol[C]):
    """A policy backend: a model call per turn, over a rotation of replicas."""

    def conversation(self, messages: list[dict], tools: list[dict]) -> C:
        """A new conversation: the row's chat messages and its chat-style tool schemas."""

    async def turn(self, convo: C, sampling: dict[str, Any], session: Session, step: int) -> Turn:
        """The model's next turn (`step` counts from 0; it names the turn's tool calls). Raises
        ContextOverflow when the conversation no longer fits, a RolloutFailure when it fails."""

    def ready(self) -> bool:
        """Whether some replica can take a request now (the worker fetches only then)."""

    async def wait_ready(self) -> None:
        """Until some replica can take a request."""

    async def aclose(self) -> None: ...
