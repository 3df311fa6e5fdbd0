"""The farm's exceptions, typed by the boundary they cross.

    FarmError
    ├── ConfigError            bad settings value, file or environment variable
    ├── TransportError         Redis failed in a way the caller cannot fix by itself
    │   ├── RedisUnavailable   unreachable past redis_down_max_s (the one retry layer's bound)
    │   ├── RedisAuthError     wrong password / ACL user, or a command the user may not run
    │   ├── RedisOutOfMemory   maxmemory reached with a noeviction policy
    │   ├── RedisWrongType     a farm key holds another type (a foreign or damaged key)
    │   └── RedisScriptError   a settle script failed inside Redis
    ├── SchemaError            a stream entry that cannot be turned into a Task/Rollout
    │   ├── MalformedEntry     missing fields, bad msgpack, wrong types
    │   └── UnknownSchemaVersion
    ├── UnknownAgent           no agent registered under that name
    ├── NotFound               a run (or task) this namespace has never seen
    └── RolloutFailure         a rollout that failed for a reason the agent knows;
                               carries an ErrorKind and whether another attempt may help

Each class carries the exit code a command ends with when it stops on that error (`exit_code`),
so a supervisor can tell a configuration mistake (never restarted) from a crash (restarted):

    0 ok · 1 crash or other FarmError · 2 ConfigError / usage · 3 TransportError (Redis)
    4 RedisAuthError · 5 UnknownAgent · 6 NotFound (a run or task that does not exist) · 130 interrupted

A bad rollout is data, not a crash: the worker turns a RolloutFailure (or any other
exception, or a timeout) into a `failed` Rollout with the reason, after bounded retries.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "EXIT_AUTH",
    "EXIT_CONFIG",
    "EXIT_CRASH",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_TRANSPORT",
    "EXIT_UNKNOWN_AGENT",
    "NOT_RESTARTABLE",
    "ConfigError",
    "ErrorKind",
    "FarmError",
    "MalformedEntry",
    "NotFound",
    "RedisAuthError",
    "RedisOutOfMemory",
    "RedisScriptError",
    "RedisUnavailable",
    "RedisWrongType",
    "RolloutFailure",
    "SchemaError",
    "TransportError",
    "UnknownAgent",
    "UnknownSchemaVersion",
    "where",
]


EXIT_OK, EXIT_CRASH, EXIT_CONFIG, EXIT_TRANSPORT, EXIT_AUTH, EXIT_UNKNOWN_AGENT = 0, 1, 2, 3, 4, 5
EXIT_NOT_FOUND = 6
EXIT_INTERRUPTED = 130
# Exit codes a supervisor must not restart on: the same start would fail the same way.
NOT_RESTARTABLE = frozenset({EXIT_CONFIG, EXIT_AUTH, EXIT_UNKNOWN_AGENT})


class ErrorKind(str, Enum):
    """Why a rollout failed; counted per kind by consumers."""

    def __str__(self) -> str:
        return self.value

    malformed = "malformed"  # the task entry could not be decoded
    schema_version = "schema_version"  # the task was written by another schema version
    unknown_agent = "unknown_agent"  # no agent registered under agent_ref.name
    agent_error = "agent_error"  # the agent loop raised something unexpected
    policy = "policy"  # the model server failed or returned garbage
    tool = "tool"  # a tool crashed
    verifier = "verifier"  # the verifier crashed or timed out
    timeout = "timeout"  # the attempt ran past its time limit
    deadline = "deadline"  # the task's deadline passed before it finished
    max_attempts = "max_attempts"  # delivered max_attempts times without finishing
    invariant = "invariant"  # token trace invariants broken
    bad_reply_to = "bad_reply_to"  # reply_to is not a result stream of the farm's namespace
    too_large = "too_large"  # the rollout is bigger than max_entry_bytes
    sandbox_error = "sandbox_error"  # the code sandbox's machinery failed (never the program's 0)
    infrastructure = "infrastructure"  # a rollout's sandbox did not start, twice (masked, never a 0)
    cancelled = "cancelled"  # a client cancelled the task (farm.cancel): never run, or stopped in flight


class FarmError(Exception):
    """Base class of every error the farm raises on purpose."""

    exit_code = EXIT_CRASH


class ConfigError(FarmError):
    """A setting has a bad value; the message names the file or variable it came from."""

    exit_code = EXIT_CONFIG


class TransportError(FarmError):
    """Redis failed; raised only by farm.transport, which maps every redis-py exception once."""

    exit_code = EXIT_TRANSPORT


class RedisUnavailable(TransportError):
    """Redis stayed unreachable for longer than redis_down_max_s."""


class RedisAuthError(TransportError):
    """Authentication or permission denied: retrying cannot help, so it is raised at once."""

    exit_code = EXIT_AUTH


class RedisOutOfMemory(TransportError):
    """Redis refuses writes at its maxmemory limit."""


class RedisWrongType(TransportError):
    """A key the farm writes holds a value of another type."""


class RedisScriptError(TransportError):
    """A Lua script failed inside Redis."""


class SchemaError(FarmError):
    """A stream entry could not be decoded; `kind` is recorded on the dead letter."""

    kind = "malformed"


class MalformedEntry(SchemaError):
    kind = "malformed"


class UnknownSchemaVersion(SchemaError):
    kind = "schema_version"


class UnknownAgent(FarmError):
    """No agent is registered under the requested name."""

    exit_code = EXIT_UNKNOWN_AGENT


class NotFound(FarmError):
    """A run or task this namespace has never seen (a mistyped id, another --namespace)."""

    exit_code = EXIT_NOT_FOUND


class RolloutFailure(FarmError):
    """An agent gives up on a rollout for a known reason.

    `kind` is one of schema.ErrorKind; `retryable` says whether a fresh attempt
    (on any worker) might succeed, e.g. a policy server that was down.
    """

    def __init__(self, kind: ErrorKind | str, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.kind = ErrorKind(kind)  # ValueError for a kind that is not one of ErrorKind
        self.message = message
        self.retryable = retryable


def where(exc: BaseException) -> str:
    """Where `exc` was raised, for a one-line error about the user's own code: " at FILE:LINE in
    FUNCTION" of the innermost frame outside the standard library and installed packages (a
    SyntaxError's own file and line), or "" when unknown."""
    import sysconfig

    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    libs = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
    found = None
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if found is None or not (name.startswith(libs) or name.startswith("<")):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    code = found.tb_frame.f_code
    return f" at {code.co_filename}:{found.tb_lineno} in {code.co_name}"
