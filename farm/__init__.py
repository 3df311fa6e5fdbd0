"""The rollout farm's public face: what a training script or a collection job imports.

    from farm import FarmClient, Task, Rollout, load_settings

    async with FarmClient() as client:          # settings from FARM_CONFIG / FARM_* variables
        tasks = [client.task(run_id="r1", agent="math", row=row) for row in rows]
        await client.submit(tasks)
        rollouts = await client.collect(tasks, timeout_s=600)

The names below are re-exported from the modules that define them (farm.client, farm.schema,
farm.settings, farm.errors) and imported on first use, so `import farm` stays cheap for the
workers. Errors: every farm error is a `FarmError`, whose `exit_code` is what the command line
exits with; `ConfigError` (bad settings or input), `TransportError` (Redis: `RedisUnavailable`,
`RedisAuthError`, ...), `SchemaError` (an entry that is not a task or rollout), `UnknownAgent`,
`NotFound`, and `RolloutFailure` (an agent gives up on one rollout, with an `ErrorKind`).
"""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from farm.lazy import lazy_exports

if TYPE_CHECKING:  # what the lazy names below are, for type checkers and editors
    from farm.agent_config import AgentConfig
    from farm.client import FarmClient
    from farm.errors import (
        ConfigError,
        ErrorKind,
        FarmError,
        NotFound,
        RedisAuthError,
        RedisUnavailable,
        RolloutFailure,
        SchemaError,
        TransportError,
        UnknownAgent,
    )
    from farm.schema import Rollout, RolloutError, Sampling, Status, Task, TokenTrace
    from farm.settings import Settings, load_settings

try:
    __version__ = version("rollout-farm")  # the installed distribution's, as `farm --version` and heartbeats say
except PackageNotFoundError:
    __version__ = "unknown"

_EXPORTS = {
    "FarmClient": "farm.client",
    "Task": "farm.schema",
    "Rollout": "farm.schema",
    "Status": "farm.schema",
    "Sampling": "farm.schema",
    "TokenTrace": "farm.schema",
    "RolloutError": "farm.schema",
    "Settings": "farm.settings",
    "AgentConfig": "farm.agent_config",
    "load_settings": "farm.settings",
    "ErrorKind": "farm.errors",
    "FarmError": "farm.errors",
    "ConfigError": "farm.errors",
    "TransportError": "farm.errors",
    "RedisUnavailable": "farm.errors",
    "RedisAuthError": "farm.errors",
    "SchemaError": "farm.errors",
    "UnknownAgent": "farm.errors",
    "NotFound": "farm.errors",
    "RolloutFailure": "farm.errors",
}

__all__ = [
    "__version__",
    "FarmClient",
    "Task",
    "Rollout",
    "Status",
    "Sampling",
    "TokenTrace",
    "RolloutError",
    "Settings",
    "AgentConfig",
    "load_settings",
    "ErrorKind",
    "FarmError",
    "ConfigError",
    "TransportError",
    "RedisUnavailable",
    "RedisAuthError",
    "SchemaError",
    "UnknownAgent",
    "NotFound",
    "RolloutFailure",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
