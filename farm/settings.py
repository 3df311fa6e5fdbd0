"""One typed settings object per process, from a YAML file plus FARM_* environment variables.

Precedence, lowest first: defaults, the YAML file (`--config` or FARM_CONFIG), environment
variables (FARM_ + the field name in upper case, e.g. FARM_REDIS_URL, FARM_MAX_ATTEMPTS),
then explicit overrides from the command line. A bad value fails at start-up with a
ConfigError naming where it came from.

The YAML file also takes NeMo Gym's env.yaml keys for the policy (`policy_base_url`,
`policy_api_key`, `policy_model_name`), so one env.yaml serves both. Policy URLs are kept as
the server root (a trailing `/v1` is dropped): each client appends its own path.

`policy_api_key` and `dashboard_token` are secrets: they come only from the file, their FARM_*
variable, a file named on the command line (`farm dashboard --token-file`) or (for the openai
kinds) OPENAI_API_KEY, never from a command-line value, and Settings' repr masks them.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping, Optional
from urllib.parse import urlsplit

import msgspec
import yaml

from farm.agent_config import AgentConfig
from farm.errors import ConfigError
from farm.judge_config import JudgeConfig
from farm.keys import Keys, check_name

__all__ = [
    "ENV_PREFIX",
    "FIELDS",
    "JudgeConfig",
    "Settings",
    "load_settings",
    "read_password",
    "read_secret",
    "read_yaml_mapping",
    "server_root",
]


ENV_PREFIX = "FARM_"


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Where the queue lives. None: start an embedded Redis with AOF in data_dir.
    redis_url: Optional[str] = None
    namespace: str = "farm"
    data_dir: str = "~/.cache/rollout-farm"
    embedded_port: int = 6390  # where the embedded Redis listens (127.0.0.1 only)
    # Delivery.
    max_attempts: int = 3
    visibility_timeout_s: float = 60.0  # a pending task idle this long is reclaimed
    lease_renew_s: float = 15.0  # in-flight tasks are renewed this often
    reclaim_interval_s: float = 5.0
    retry_backoff_s: float = 1.0  # first retry delay; doubles, jittered, capped
    retry_backoff_max_s: float = 60.0
    task_timeout_s: float = 600.0  # one attempt of one rollout
    # Worker.
    concurrency: int = 32
    grace_period_s: float = 30.0
    heartbeat_ttl_s: float = 15.0
    block_ms: int = 500
    health_port: Optional[int] = None  # `farm worker` serves /healthz and /readyz here (+ slot); `farm health` asks
    listen_host: str = "127.0.0.1"  # where `farm worker` serves its health and metrics ports (0.0.0.0 in a container)
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"  # a worker's loop: auto is uvloop where installed
    restart_max: int = 5  # `--processes P`: a child is restarted at most this often...
    restart_window_s: float = 60.0  # ...within this window; more crashes stop the pool
    # Connection: one retry layer (farm.transport.Outage), jittered exponential backoff bounded by time.
    connect_backoff_s: float = 0.1
    connect_backoff_max_s: float = 5.0
    socket_timeout_s: float = 30.0
    redis_down_max_s: float = 120.0  # any process gives up after Redis is gone this long
    redis_wait_replicas: int = 0  # submits, settles and dead letters wait (WAIT) for this many replicas; 0: off
    redis_wait_timeout_ms: int = 1000  # the longest such a WAIT blocks
    stop_settle_timeout_s: float = 1.0  # a stopping worker's one try to settle or hand back what it holds
    max_entry_bytes: int = 32 * 1024 * 1024  # larger task or result entries are dead-lettered, not decoded
    # What workers record for the dashboards (farm.history), in the settle's own round trip.
    history: bool = True  # per-minute buckets per agent
    history_ttl_s: int = 6 * 3600  # how long a minute's bucket is kept
    pass_threshold: float = 1.0  # a reward at least this counts as a pass
    sample_every: int = 10  # 1 rollout in N is kept in the agent's sample stream (0: none)
    sample_keep: int = 200  # rollouts kept in each sample stream
    dead_maxlen: int = 100_000  # dead letters kept per agent; older ones are dropped and counted
    consumer_idle_s: float = 300.0  # a group consumer with nothing pending, idle this long, is removed
    summary_every_s: float = 60.0  # a worker logs a one-line summary this often
    cancel_ttl_s: float = 86400.0  # a cancel is kept this long: a task fetched later still ends `cancelled`
    no_workers_timeout_s: float = 300.0  # `farm collect` gives up on an agent that has had no live worker this long
    # Policy: the OpenAI-compatible servers (vLLM) the agent loops call.
    policy_urls: list[str] = []  # FARM_POLICY_URLS: comma-separated base URLs
    policy_model: str = "smollm2-135m-instruct"  # the served model name
    policy_tokenizer: Optional[str] = None  # tokenizer dir or name (default: the prepared embedded model)
    policy_timeout_s: float = 300.0  # one request to the policy
    policy_retry_budget_s: float = 120.0  # one model call keeps trying (and waiting for a replica) this long
    policy_max_retries: int = 4
    # Placement over replicas (workers/policy/rotation.py): "group" starts a GRPO group's samples on
    # one replica (its prompt prefilled once); "least_outstanding" places each rollout on its own.
    policy_routing: Literal["group", "least_outstanding"] = "group"
    policy_spill_ratio: float = 1.5  # a group's samples spill off a home holding more than this x the mean
    # Headers for a router in front of the servers: name -> "group" or "session" (the task id);
    # FARM_POLICY_ROUTE_HEADERS="X-SMG-Routing-Key=group,x-session-id=session".
    policy_route_headers: dict[str, Literal["group", "session"]] = {}
    # tokens: token-in/token-out against vLLM's /v1/completions (trainable traces);
    # chat / responses: any OpenAI-compatible server through the openai client (text only, not trainable).
    policy_kind: Literal["tokens", "chat", "responses"] = "tokens"
    policy_stream: bool = False  # tokens backend: stream completions, so an interrupted rollout keeps its tokens
    policy_adaptive_load: bool = False  # hold each replica's in-flight requests where its throughput peaks
    policy_load_poll_s: float = 0.5  # how often each replica's /metrics is read while requests are in flight
    policy_load_floor: int = 4  # a replica's in-flight limit never drops below this
    policy_load_kv_high: float = 0.9  # no growth while a replica's KV cache is this full
    policy_api_key: Optional[str] = None  # file or FARM_POLICY_API_KEY; OPENAI_API_KEY for chat/responses
    dashboard_token: Optional[str] = (
        None  # FARM_DASHBOARD_TOKEN or `farm dashboard --token-file`: enables requeue/purge
    )
    # Agents: name -> environment and loop settings (from the YAML file).
    agents: dict[str, AgentConfig] = {}
    # Judges: name -> a model endpoint environments grade with (`ctx.judge`), apart from the policy.
    judges: dict[str, JudgeConfig] = {}
    # The model gateway harness agents call (workers/gateway): one server per worker process.
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 0  # 0: a free port (one per process; `--processes P` needs 0)
    # Sandboxes: a rollout of a sandboxed environment (harbor) runs in one of its own (envs/boxes).
    sandbox_backend: Literal["docker", "local"] = "docker"  # FARM_SANDBOX_BACKEND
    sandbox_slack_s: float = 120.0  # a sandbox lives its task's agent + verifier timeouts plus this
    sandbox_sweep_s: float = 30.0  # how often a worker removes sandboxes whose worker is gone
    # Dockerfile FROM names built on the farm's base image instead (image name or glob -> base).
    sandbox_base_aliases: dict[str, str] = {}
    # Logging.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"

    def __post_init__(self) -> None:
        check_name(self.namespace, "namespace")
        for judge in self.judges:
            check_name(judge, "judge name")
        positive = (
            "embedded_port",
            "max_attempts",
            "visibility_timeout_s",
            "lease_renew_s",
            "reclaim_interval_s",
            "retry_backoff_s",
            "retry_backoff_max_s",
            "task_timeout_s",
            "concurrency",
            "grace_period_s",
            "heartbeat_ttl_s",
            "block_ms",
            "connect_backoff_s",
            "connect_backoff_max_s",
            "socket_timeout_s",
            "redis_down_max_s",
            "redis_wait_timeout_ms",
            "stop_settle_timeout_s",
            "policy_timeout_s",
            "policy_load_poll_s",
            "policy_load_floor",
            "policy_retry_budget_s",
            "restart_max",
            "restart_window_s",
            "max_entry_bytes",
            "no_workers_timeout_s",
            "cancel_ttl_s",
            "history_ttl_s",
            "sample_keep",
            "dead_maxlen",
            "consumer_idle_s",
            "summary_every_s",
            "sandbox_slack_s",
            "sandbox_sweep_s",
        )
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.health_port is not None and not 1 <= self.health_port <= 65535:
            raise ValueError(f"health_port must be a port number (1-65535), got {self.health_port}")
        if self.redis_wait_replicas < 0:
            raise ValueError("redis_wait_replicas must be >= 0 (0: no WAIT)")
        if self.policy_max_retries < 0:
            raise ValueError("policy_max_retries must be >= 0")
        if not 0 < self.policy_load_kv_high <= 1:
            raise ValueError(f"policy_load_kv_high must be in (0, 1], got {self.policy_load_kv_high}")
        if self.policy_spill_ratio < 1:
            raise ValueError(f"policy_spill_ratio must be >= 1, got {self.policy_spill_ratio}")
        for name in self.policy_route_headers:
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"policy_route_headers: {name!r} is not an HTTP header name")
        if self.sample_every < 0:
            raise ValueError("sample_every must be >= 0 (0: no samples)")
        for url in self.policy_urls:
            if urlsplit(url).scheme not in ("http", "https"):
                raise ValueError(f"policy URL {url!r} must start with http:// or https://")
        self.policy_urls = [server_root(url) for url in self.policy_urls]
        if self.lease_renew_s >= self.visibility_timeout_s:
            raise ValueError(
                "lease_renew_s must be shorter than visibility_timeout_s, or live workers lose their tasks to reclaim"
            )
        if self.block_ms / 1000 >= self.socket_timeout_s:
            raise ValueError("block_ms must be shorter than socket_timeout_s")
        if self.redis_url is not None:
            scheme = urlsplit(self.redis_url).scheme
            if scheme not in ("redis", "rediss", "unix", "redis+sentinel"):
                raise ValueError(
                    "redis_url must start with redis://, rediss://, unix:// or redis+sentinel://, "
                    f"got {scheme or 'no scheme'!r}"
                )

    @property
    def tokenizer_path(self) -> str:
        return self.policy_tokenizer or str(self.data_path / "models" / self.policy_model)

    @property
    def keys(self) -> Keys:
        return Keys(self.namespace)

    @property
    def data_path(self) -> Path:
        return Path(os.path.expanduser(self.data_dir))

    def replace(self, **changes: Any) -> "Settings":
        return load_settings(env={}, base=self, overrides=changes)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{name}={value!r}' for name, value in self.__rich_repr__())})"

    def __rich_repr__(self):
        for name in self.__struct_fields__:
            value = getattr(self, name)
            yield name, (MASKED if name in SECRETS and value is not None else value)


MASKED = "<hidden>"
SECRETS = frozenset({"policy_api_key", "dashboard_token"})
# NeMo Gym env.yaml keys accepted in the settings file -> the farm's own names.
NEMO_GYM_ALIASES = {"policy_base_url": "policy_urls", "policy_model_name": "policy_model"}


def read_secret(path: str, what: str) -> str:
    """The first line of a secret's file (a password, a token); never a value from argv."""
    try:
        text = Path(path).expanduser().read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not text or not text[0].strip():
        raise ConfigError(f"the {what} file {path} is empty")
    return text[0].strip()


def read_password(path: Optional[str], env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """A Redis password from a file (first line), else $FARM_REDIS_PASSWORD, else the file named by
    $FARM_REDIS_PASSWORD_FILE (a Docker or Kubernetes secret mounted as a file); never from argv."""
    env = os.environ if env is None else env
    if path:
        return read_secret(path, "password")
    if env.get("FARM_REDIS_PASSWORD"):
        return env["FARM_REDIS_PASSWORD"]
    if env.get("FARM_REDIS_PASSWORD_FILE"):
        return read_secret(env["FARM_REDIS_PASSWORD_FILE"], "password (FARM_REDIS_PASSWORD_FILE)")
    return None


def server_root(url: str) -> str:
    """A policy base URL without trailing slashes or `/v1`: the clients append their own paths."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3].rstrip("/")
    return url


FIELDS = tuple(Settings.__struct_fields__)


def load_settings(
    path: str | os.PathLike | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: Settings | None = None,
) -> Settings:
    """Build Settings from defaults < YAML file < FARM_* variables < overrides (None values skipped)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = msgspec.structs.asdict(base) if base else {}
    sources: dict[str, str] = {}
    path = path or env.get("FARM_CONFIG")
    if path:
        raw.update(_read_yaml(Path(path)))
        sources.update({k: f"{path}: {k}" for k in raw})
        if isinstance(raw.get("policy_urls"), str):  # NeMo Gym's policy_base_url may be one string
            raw["policy_urls"] = [u.strip() for u in raw["policy_urls"].split(",") if u.strip()]
    for name in FIELDS:
        var = ENV_PREFIX + name.upper()
        if var in env and env[var] != "":
            raw[name] = env[var]
            if name == "policy_urls":
                raw[name] = [u.strip() for u in env[var].split(",") if u.strip()]
            elif name == "policy_route_headers":
                raw[name] = _pairs(env[var], var)
            sources[name] = f"environment variable {var}"
    for name, value in (overrides or {}).items():
        if value is not None:
            raw[name] = value
            sources[name] = f"option {name}"
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)} in {path}; known: {', '.join(FIELDS)}")
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(exc, sources)) from None
    if settings.policy_kind != "tokens" and settings.policy_api_key is None and env.get("OPENAI_API_KEY"):
        settings.policy_api_key = env["OPENAI_API_KEY"]
    return settings


def read_yaml_mapping(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML file holding a mapping, or a ConfigError that names the file and the problem."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of setting: value")
    return data


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml_mapping(path)
    farm = data.get("farm", data)  # a shared config file may nest the farm's part under `farm:`
    if not isinstance(farm, dict):
        raise ConfigError(f"config file {path}: `farm:` must be a mapping")
    farm = dict(farm)
    farm.pop("up", None)  # what `farm up` starts: read by farm.up, not a setting
    for alias, name in NEMO_GYM_ALIASES.items():
        if alias in farm:
            if name in farm:
                raise ConfigError(f"config file {path} sets both {alias} (NeMo Gym's name) and {name}; keep one")
            farm[name] = farm.pop(alias)
    return farm


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _pairs(text: str, var: str) -> dict[str, str]:
    """NAME=VALUE,NAME=VALUE from an environment variable, or a ConfigError naming it."""
    out = {}
    for item in (i.strip() for i in text.split(",")):
        name, sep, value = item.partition("=")
        if not item:
            continue
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(f"{var}: {item!r} is not NAME=VALUE (e.g. X-SMG-Routing-Key=group)")
        out[name.strip()] = value.strip()
    return out


def _explain(exc: msgspec.ValidationError, sources: dict[str, str]) -> str:
    message = str(exc)
    marker = "- at `$."
    if marker in message:
        field = message.split(marker, 1)[1].rstrip("`").split(".")[0].split("[")[0]
        where = sources.get(field, f"setting {field}")
        return f"invalid setting {field} (from {where}): {message.split(' - at ', 1)[0]}"
    return f"invalid settings: {message}"
