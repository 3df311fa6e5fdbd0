"""The wire schema: versioned msgspec Structs for Task and Rollout, msgpack on the wire.

A stream entry carries two fields: `v` (the schema version, checked before anything else)
and `d` (the msgpack body). Token ids travel as packed little-endian int32 bytes and
logprobs as float32 bytes, so an 8K-token rollout is three memcpy-sized blobs rather than
16K msgpack numbers. Decoding is strict: wrong types, missing fields or inconsistent
token traces raise MalformedEntry; another version raises UnknownSchemaVersion. Both end
up dead-lettered with the reason, never in a crashed worker. No pickle anywhere.

Schema note: fields added with a default (`history`, `segments`) keep SCHEMA_VERSION 1, but an
older reader rejects an entry that carries them (forbid_unknown_fields), and a writer encodes them
even when empty: upgrade the consumers (trainers, producers) before the workers.
"""

from __future__ import annotations

import time
import uuid
from enum import Enum
from typing import Any, Optional

import msgspec

from farm.errors import ErrorKind, MalformedEntry, UnknownSchemaVersion
from farm.keys import text
from farm.trace import TokenTrace, pack_f32, pack_i32, unpack_f32, unpack_i32

__all__ = [
    "SCHEMA_VERSION",
    "MAX_ENTRY_BYTES",
    "AgentRef",
    "Attempt",
    "Rollout",
    "RolloutError",
    "Sampling",
    "Status",
    "Task",
    "Timings",
    "TokenTrace",
    "decode_rollout",
    "decode_task",
    "decode_task_body",
    "encode",
    "Partial",
    "entry",
    "pack_f32",
    "pack_i32",
    "salvage",
    "salvaged_failure",
    "unpack_f32",
    "unpack_i32",
]


SCHEMA_VERSION = 1


class Status(str, Enum):
    def __str__(self) -> str:
        return self.value

    ok = "ok"
    truncated = "truncated"
    failed = "failed"
    cancelled = "cancelled"  # a client cancelled it (farm.cancel); carries an error of kind `cancelled`
    # A client interrupted it (farm.cancel, mode interrupt): what was generated so far is in
    # `Rollout.partial`, for `FarmClient.resume` to go on from; never trained on as it is.
    interrupted = "interrupted"


class AgentRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    type: str = "responses_api_agents"


class Sampling(msgspec.Struct, forbid_unknown_fields=True):
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: Optional[int] = None
    seed: Optional[int] = None
    stop: Optional[list[str]] = None


class Attempt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One earlier attempt of a task that failed: which attempt, the worker that ran it, when it
    ended (epoch seconds), the failure kind and its message (the worker keeps the first 500 chars)."""

    attempt: int
    worker: str = ""
    at: float = 0.0
    kind: str = ""
    error: str = ""


class Task(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    task_id: str
    run_id: str
    agent_ref: AgentRef
    group_id: str
    sample_index: int = 0
    row: dict[str, Any]
    sampling: Sampling = msgspec.field(default_factory=Sampling)
    policy_version: int = 0
    reply_to: str
    attempt: int = 1
    created_at: float
    deadline: Optional[float] = None
    # The attempts that failed before this one, oldest first (a worker appends one as it retries the
    # task or dead-letters it; at most max_attempts are kept). Absent in entries older than it.
    history: list[Attempt] = []
    # A continuation of an interrupted rollout (FarmClient.resume): where it stopped.
    resume: Optional[Partial] = None

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ValueError("attempt must be >= 1")

    @classmethod
    def new(
        cls,
        *,
        run_id: str,
        agent: str,
        row: dict,
        reply_to: str,
        group_id: str | None = None,
        sample_index: int = 0,
        sampling: Sampling | None = None,
        policy_version: int = 0,
        timeout_s: float | None = None,
        agent_type: str = "responses_api_agents",
    ) -> "Task":
        now = time.time()
        return cls(
            task_id=uuid.uuid4().hex,
            run_id=run_id,
            agent_ref=AgentRef(name=agent, type=agent_type),
            group_id=group_id or uuid.uuid4().hex,
            sample_index=sample_index,
            row=row,
            sampling=sampling or Sampling(),
            policy_version=policy_version,
            reply_to=reply_to,
            created_at=now,
            deadline=(now + timeout_s) if timeout_s else None,
        )


class Partial(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where an interrupted rollout stopped: enough for a continuation task to go on token-exactly.

    `trace` holds the prompt and every completion token so far with its logprob and version; its
    last `open_turn` completion ids are the turn that was being sampled when it stopped (continued,
    not re-sampled). `output`, `tool_calls` and `metrics` are the loop's record so far (the tool
    calls are run again on resume to rebuild the environment's state, and must answer as before).
    `model` is the served model that sampled it: a resume on another model is refused."""

    trace: TokenTrace
    open_turn: int = 0
    steps: int = 0  # model turns completed before the open one
    messages: list[dict[str, Any]] = []  # the conversation as the chat template renders it
    output: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    followups_left: int = 0
    metrics: dict[str, Any] = {}
    model: str = ""
    resumes: int = 0  # how many times this rollout was interrupted and resumed before
    origin: str = ""  # the first task's id of the chain
    # The task's row and sampling, so that the rollout alone can be resumed (FarmClient.resume); a
    # continuation task carries them as its own and leaves these empty.
    row: dict[str, Any] = {}
    sampling: Optional[Sampling] = None

    @classmethod
    def for_task(cls, task: Task, trace: TokenTrace, **where: Any) -> Partial:
        """The partial of `task`'s interrupted run: `trace` and `where` it stopped (open_turn, steps,
        ...), in the chain the task continues (resumes, origin), with the task's row and sampling."""
        prior = task.resume
        return cls(
            trace=trace,
            resumes=prior.resumes if prior is not None else 0,
            origin=prior.origin if prior is not None and prior.origin else task.task_id,
            row=task.row,
            sampling=task.sampling,
            **where,
        )


class RolloutError(msgspec.Struct, forbid_unknown_fields=True):
    kind: ErrorKind  # one enum for the worker, the client, the producer and the dashboard
    message: str


class Timings(msgspec.Struct, forbid_unknown_fields=True):
    queue_wait_s: float = 0.0
    model_s: float = 0.0
    tools_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0


class Rollout(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    task_id: str
    run_id: str
    group_id: str
    sample_index: int = 0
    agent_ref: AgentRef
    status: Status
    error: Optional[RolloutError] = None
    reward: Optional[float] = None
    reward_components: dict[str, float] = {}
    metrics: dict[str, Any] = {}
    output: list[dict[str, Any]] = []
    trace: Optional[TokenTrace] = None
    # The rollout's further token segments after `trace` (a harness rollout whose history did not
    # extend one chain: workers/gateway), each trained as a sample of its own sharing the rollout's
    # reward; empty for every other rollout.
    segments: list[TokenTrace] = []
    # False for rollouts that carry text but no token ids (policy_kind chat/responses): the
    # trainer refuses them instead of training on re-tokenized text.
    trainable: bool = True
    # The policy version generation started on (the task's, unless a trainer announces versions:
    # farm/policy_version.py), and the version it ended on when weights may have changed in between.
    policy_version: int = 0
    policy_version_end: Optional[int] = None
    timings: Timings = msgspec.field(default_factory=Timings)
    worker_id: str = ""
    attempt: int = 1
    finished_at: float = 0.0
    history: list[Attempt] = []  # the task's failed attempts before this rollout (Task.history)
    # The version of the verifier that gave `reward` (the environment's `verifier_version`): a
    # re-scoring (`farm reverify`) knows which rollouts an improved verifier would score differently.
    verifier_version: str = ""
    # An interrupted rollout's state (status `interrupted`; None when it had not started).
    partial: Optional[Partial] = None

    def __post_init__(self) -> None:
        if self.status in (Status.failed, Status.cancelled) and self.error is None:
            raise ValueError(f"a {self.status} rollout must carry an error")

    @classmethod
    def for_task(cls, task: Task, **fields: Any) -> "Rollout":
        """A rollout answering `task`, with the identifying fields copied over."""
        fields.setdefault("policy_version", task.policy_version)
        fields.setdefault("attempt", task.attempt)
        fields.setdefault("history", task.history)
        fields.setdefault("finished_at", time.time())
        return cls(
            task_id=task.task_id,
            run_id=task.run_id,
            group_id=task.group_id,
            sample_index=task.sample_index,
            agent_ref=task.agent_ref,
            **fields,
        )

    @classmethod
    def failure(cls, task: Task, kind: str, message: str, **fields: Any) -> "Rollout":
        return cls.for_task(
            task, status=Status.failed, error=RolloutError(kind=ErrorKind(kind), message=message), **fields
        )

    @classmethod
    def cancelled(cls, task: Task, message: str, **fields: Any) -> "Rollout":
        """The one rollout of a task a client cancelled (never retried, never dead-lettered)."""
        error = RolloutError(kind=ErrorKind.cancelled, message=message)
        return cls.for_task(task, status=Status.cancelled, error=error, **fields)

    @property
    def ok(self) -> bool:
        """Answered: `ok` or `truncated`; a `failed` or `cancelled` rollout carries an error instead."""
        return self.status is Status.ok or self.status is Status.truncated


_encoder = msgspec.msgpack.Encoder()
_task_decoder = msgspec.msgpack.Decoder(Task)
_rollout_decoder = msgspec.msgpack.Decoder(Rollout)
_loose_decoder = msgspec.msgpack.Decoder()
_VERSION = str(SCHEMA_VERSION).encode()


def encode(obj: Task | Rollout) -> bytes:
    return _encoder.encode(obj)


def entry(obj: Task | Rollout) -> dict[bytes, bytes]:
    """The stream entry fields for one Task or Rollout."""
    return {b"v": _VERSION, b"d": _encoder.encode(obj)}


# The largest entry body decoded by default (settings.max_entry_bytes overrides it per process).
MAX_ENTRY_BYTES = 32 * 1024 * 1024


def _body(fields: dict, max_bytes: int) -> bytes:
    if not isinstance(fields, dict):
        raise MalformedEntry(f"entry is a {type(fields).__name__}, not a mapping of fields")
    version = fields.get(b"v", fields.get("v"))
    body = fields.get(b"d", fields.get("d"))
    if version is None or body is None:
        raise MalformedEntry(f"entry lacks the 'v' and 'd' fields (has {sorted(map(text, fields))[:8]})")
    if isinstance(version, str):
        version = version.encode()
    if version != _VERSION:
        raise UnknownSchemaVersion(f"schema version {text(version)[:32]!r}; this farm reads version {SCHEMA_VERSION}")
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes):
        raise MalformedEntry(f"entry body is a {type(body).__name__}, not bytes")
    if len(body) > max_bytes:
        raise MalformedEntry(f"entry body is {len(body):,} bytes, over max_entry_bytes={max_bytes:,}")
    return body


def _decode(decoder: msgspec.msgpack.Decoder, what: str, body: bytes) -> Any:
    # Any failure at all is a malformed entry: a body nested deeper than the decoder's recursion
    # limit raises RecursionError, and a poison entry must end in a dead letter, never a crash loop.
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEntry(f"bad {what}: {exc}") from None
    except (RecursionError, MemoryError) as exc:
        raise MalformedEntry(
            f"bad {what}: body nested too deeply or too large to decode ({type(exc).__name__})"
        ) from None
    except Exception as exc:
        raise MalformedEntry(f"bad {what}: {type(exc).__name__}: {exc}") from None


def decode_task(fields: dict, max_bytes: int = MAX_ENTRY_BYTES) -> Task:
    return _decode(_task_decoder, "task", _body(fields, max_bytes))


def decode_rollout(fields: dict, max_bytes: int = MAX_ENTRY_BYTES) -> Rollout:
    return _decode(_rollout_decoder, "rollout", _body(fields, max_bytes))


def decode_task_body(body: bytes) -> Task:
    return _decode(_task_decoder, "task", body)


def salvage(fields: dict) -> dict[str, Any]:
    """Best effort: the identifying fields of an entry that failed strict decoding.

    Used only to address a `failed` rollout to whoever waits for the task; returns {}
    when even that cannot be read.
    """
    body = fields.get(b"d", fields.get("d"))
    if not isinstance(body, bytes):
        return {}
    if len(body) > MAX_ENTRY_BYTES:
        return {}
    try:
        loose = _loose_decoder.decode(body)
    except Exception:  # noqa: BLE001 - best effort on a body already known to be bad
        return {}
    if not isinstance(loose, dict):
        return {}
    keep = ("task_id", "run_id", "group_id", "sample_index", "reply_to", "agent_ref", "policy_version")
    out = {k: loose[k] for k in keep if k in loose}
    # Only plain values survive: whatever reads these fields trusts their types.
    return {k: v for k, v in out.items() if isinstance(v, (str, int)) or (k == "agent_ref" and isinstance(v, dict))}


def salvaged_failure(
    info: dict[str, Any], kind: str, message: str, agent: str = "", **fields: Any
) -> Optional[Rollout]:
    """A `failed` rollout for the task `info` (from salvage()) names, or None when it names none.

    Only `task_id` is required: a mistyped optional field (a `sample_index` of "zero", an
    `agent_ref` that is not a table) must never stop the failure from reaching the waiter, so
    each field is read on its own and falls back to a neutral value (the agent to `agent`, the
    stream the entry came from).
    """
    ref = info.get("agent_ref") if isinstance(info.get("agent_ref"), dict) else {}
    text = lambda d, key, default="": d[key] if isinstance(d.get(key), str) and d[key] else default  # noqa: E731
    index = info.get("sample_index")
    if not text(info, "task_id"):
        return None
    return Rollout(
        task_id=info["task_id"],
        run_id=text(info, "run_id"),
        group_id=text(info, "group_id"),
        sample_index=index if isinstance(index, int) and not isinstance(index, bool) else 0,
        agent_ref=AgentRef(name=text(ref, "name", agent), type=text(ref, "type", "responses_api_agents")),
        status=Status.failed,
        error=RolloutError(kind=ErrorKind(kind), message=message),
        finished_at=time.time(),
        **fields,
    )
