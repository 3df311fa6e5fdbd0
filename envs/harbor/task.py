"""A Harbor task directory, read natively: its `task.toml` (schema 1.4), instruction and scripts.

Harbor (harborframework.com) ships a task as a directory:

    instruction.md          the prompt
    task.toml               timeouts, resources, network, metadata
    environment/Dockerfile  the sandbox image (optional when [environment] docker_image is set)
    tests/test.sh           the verifier, run in the sandbox after the agent; it writes
                            /logs/verifier/reward.txt or reward.json
    solution/solve.sh       a reference solution (optional)

Read here with no dependency on Harbor's runtime (its own stack, Python 3.12); Harbor's parser
agrees on the project's suite (tests/test_harbor_parser.py). Defaults are Harbor's. Where Harbor is
lenient this reader is strict, so that a mistake stops `farm data generate`, not hundreds of
rollouts: an unknown key, a wrong type, a non-positive timeout, a Harbor feature the farm does not
run (steps, a separate verifier container, MCP servers...) is a TaskError naming file and key.
`[metadata]` stays free-form as in Harbor: the usual keys typed, the others kept in `extra`.

    TaskError(ValueError)   one task that cannot be used: `str()` is one line, path first
      SuiteError            a suite with broken tasks: `.errors` holds every one of them
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import msgspec

__all__ = [
    "SUITE_DIR",
    "AgentConfig",
    "EnvironmentConfig",
    "HarborTask",
    "Metadata",
    "SuiteError",
    "TaskConfig",
    "TaskError",
    "VerifierConfig",
    "content_id",
    "load_suite",
    "load_task",
    "parse_config",
    "scan_suite",
]

SUITE_DIR = Path(__file__).parent / "suite"  # the project's own suite, shipped as package data
CONFIG, INSTRUCTION, DOCKERFILE = "task.toml", "instruction.md", "environment/Dockerfile"
TEST_SCRIPT, SOLVE_SCRIPT = "tests/test.sh", "solution/solve.sh"
SKIPPED = frozenset({"__pycache__", ".pytest_cache", ".git"})  # never part of a task's content

Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
NetworkMode = Literal["no-network", "public", "allowlist"]


class TaskError(ValueError):
    """A task directory or task.toml the farm cannot use; one line: `path: key: what is wrong`."""

    def __init__(self, path: Union[str, Path], message: str):
        self.path = Path(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")


class SuiteError(TaskError):
    """A suite with broken tasks; `.errors` lists each (all of them, not the first)."""

    def __init__(self, path: Union[str, Path], errors: list[TaskError]):
        self.errors = errors
        super().__init__(path, f"{len(errors)} broken task{'s' if len(errors) != 1 else ''}")


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A table of task.toml: typed, immutable, no key it does not declare."""


class Author(_Section, frozen=True):
    name: str
    email: Optional[str] = None


class PackageInfo(_Section, frozen=True):
    """[task]: the task's name in Harbor's registry (org/name) and who wrote it."""

    name: str
    version: Optional[str] = None
    description: str = ""
    authors: tuple[Author, ...] = ()
    keywords: tuple[str, ...] = ()


class Metadata(_Section, frozen=True):
    """[metadata]: free-form in Harbor; the keys suites use (Terminal-Bench's) are typed here."""

    author_name: Optional[str] = None
    author_email: Optional[str] = None
    difficulty: Optional[str] = None
    category: Optional[str] = None
    tags: tuple[str, ...] = ()
    expert_time_estimate_min: Optional[float] = None
    junior_time_estimate_min: Optional[float] = None
    extra: dict[str, Any] = {}  # every other key, as written


class VerifierConfig(_Section, frozen=True):
    timeout_sec: Positive = 600.0
    env: dict[str, str] = {}
    user: Union[str, int, None] = None
    network_mode: Optional[NetworkMode] = None  # a phase override of [environment]'s
    allowed_hosts: Optional[tuple[str, ...]] = None


class AgentConfig(_Section, frozen=True):
    timeout_sec: Optional[Positive] = None  # Harbor: no limit of the task's own
    user: Union[str, int, None] = None
    network_mode: Optional[NetworkMode] = None
    allowed_hosts: Optional[tuple[str, ...]] = None


class EnvironmentConfig(_Section, frozen=True):
    build_timeout_sec: Positive = 600.0
    docker_image: Optional[str] = None
    os: Literal["linux"] = "linux"
    cpus: Optional[Positive] = None
    memory_mb: Optional[PositiveInt] = None
    storage_mb: Optional[PositiveInt] = None
    gpus: Optional[Annotated[int, msgspec.Meta(ge=0)]] = None
    env: dict[str, str] = {}
    workdir: Optional[str] = None
    network_mode: NetworkMode = "public"
    allowed_hosts: Optional[tuple[str, ...]] = None

    @property
    def allows_internet(self) -> bool:
        return self.network_mode != "no-network"


class SolutionConfig(_Section, frozen=True):
    env: dict[str, str] = {}


class TaskConfig(_Section, frozen=True):
    """task.toml, schema 1.4 (`version`, the older name of `schema_version`, is read too)."""

    schema_version: str = "1.4"
    task: Optional[PackageInfo] = None
    source: Optional[str] = None
    metadata: Metadata = Metadata()
    verifier: VerifierConfig = VerifierConfig()
    agent: AgentConfig = AgentConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()


# Harbor settings that this reader knows but the farm does not run: named as such, not "unknown".
UNSUPPORTED = {
    "": {"steps", "multi_step_reward_strategy", "artifacts"},
    "verifier": {"environment_mode", "environment", "collect"},
    "environment": {"gpu_types", "tpu", "mcp_servers", "skills_dir", "healthcheck"},
}
METADATA_KEYS = frozenset(f for f in Metadata.__struct_fields__ if f != "extra")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GMK])\s*$", re.IGNORECASE)
_AT = re.compile(r"^(.*) - at `\$\.?(.*)`$")


@dataclass(frozen=True)
class HarborTask:
    """One task, read and checked. `tier`: the suite's sub-directory it sits in (`tier1`), else its
    metadata difficulty; `content_id`: a hash of every file (an image cached under it is never stale)."""

    name: str
    path: Path
    config: TaskConfig
    instruction: str
    tier: str
    content_id: str

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def dockerfile(self) -> Optional[Path]:
        found = self.path / DOCKERFILE
        return found if found.is_file() else None

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def test_script(self) -> Path:
        return self.path / TEST_SCRIPT

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def solve_script(self) -> Optional[Path]:
        found = self.path / SOLVE_SCRIPT
        return found if found.is_file() else None


def parse_config(text: Union[str, bytes], path: Union[str, Path] = CONFIG) -> TaskConfig:
    """A task.toml's text as a TaskConfig; TaskError (path, key, problem) when it is not one."""
    try:
        raw = msgspec.toml.decode(text.encode() if isinstance(text, str) else text)
    except msgspec.DecodeError as exc:
        raise TaskError(path, f"not valid TOML: {exc}") from None
    data = _normalized(raw, path)
    try:
        return msgspec.convert(data, TaskConfig)
    except msgspec.ValidationError as exc:
        raise TaskError(path, _describe(str(exc), data)) from None


def _normalized(raw: dict[str, Any], path: Union[str, Path]) -> dict[str, Any]:
    """Harbor's older spellings mapped onto schema 1.4's; unsupported settings refused by name."""
    data = dict(raw)
    if "version" in data:
        if "schema_version" in data:
            raise TaskError(path, "version: give schema_version or its older name version, not both")
        data["schema_version"] = data.pop("version")
    for section, keys in UNSUPPORTED.items():
        table = data if not section else data.get(section)
        for key in sorted(keys & set(table) if isinstance(table, dict) else ()):
            where = f"{section}.{key}" if section else key
            raise TaskError(path, f"{where}: a Harbor setting the farm does not support")
    meta = data.get("metadata")
    if isinstance(meta, dict):
        known = {k: v for k, v in meta.items() if k in METADATA_KEYS}
        data["metadata"] = {**known, "extra": {k: v for k, v in meta.items() if k not in METADATA_KEYS}}
    env = data.get("environment")
    if isinstance(env, dict):
        data["environment"] = _legacy_environment(dict(env), path)
    return data


def _legacy_environment(env: dict[str, Any], path: Union[str, Path]) -> dict[str, Any]:
    """`memory`/`storage` as sizes ("2G", "512M") and `allow_internet`, as Harbor still reads them."""
    for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
        if old not in env:
            continue
        value = env.pop(old)
        match = _SIZE.match(value) if isinstance(value, str) else None
        if match is None:
            raise TaskError(path, f"environment.{old}: expected a size such as '2G' or '512M', got {value!r}")
        number, unit = float(match.group(1)), match.group(2).upper()
        mb = int(number * 1024) if unit == "G" else int(number) if unit == "M" else int(number / 1024)
        if new in env and env[new] != mb:
            raise TaskError(path, f"environment.{old}: {value!r} is {mb} MB, but {new} is {env[new]!r}")
        env.setdefault(new, mb)
    allow = env.pop("allow_internet", None)
    if allow is not None:
        if not isinstance(allow, bool):
            raise TaskError(path, f"environment.allow_internet: expected true or false, got {allow!r}")
        if "network_mode" not in env and env.get("allowed_hosts") is None:
            env["network_mode"] = "public" if allow else "no-network"
    return env


def _describe(message: str, data: dict[str, Any]) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.environment.cpus`" as "environment.cpus: ..."."""
    match = _AT.match(message)
    problem, where = (match.group(1), match.group(2)) if match else (message, "")
    unknown = re.match(r"Object contains unknown field `(.+)`", problem)
    if unknown:
        return f"{where + '.' if where else ''}{unknown.group(1)}: unknown key"
    missing = re.match(r"Object missing required field `(.+)`", problem)
    if missing:
        return f"{where + '.' if where else ''}{missing.group(1)}: required key missing"
    problem = problem.replace("`", "").replace(" | null", "")
    problem = problem[:1].lower() + problem[1:]
    value: Any = data
    for part in where.split(".") if where and "got" not in problem else ():
        value = value.get(part) if isinstance(value, dict) else None
    if value is not None and value is not data and repr(value) not in problem:
        problem += f", got {value!r}"
    return f"{where}: {problem}" if where else problem


def _strip_canary(text: str) -> str:
    """The instruction without leading data-provenance ("canary") comment lines, as Harbor shows it."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and re.match(r"^(<!--.*canary.*-->|#.*canary.*)$", lines[i].strip(), re.IGNORECASE):
        i += 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    return "\n".join(lines[i:])


def content_id(path: Union[str, Path]) -> str:
    """A hash of a directory's files: relative names, executable bits and bytes (16 hex digits)."""
    root = Path(path)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED)
        for name in sorted(filenames):
            file = Path(dirpath, name)
            if not file.is_file() or name.endswith(".pyc"):
                continue
            mode = "x" if os.access(file, os.X_OK) else "-"
            digest.update(f"{file.relative_to(root).as_posix()}\0{mode}\0".encode())
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()[:16]


def load_task(path: Union[str, Path], tier: Optional[str] = None) -> HarborTask:
    """The task in directory `path`; TaskError (one line, naming the file) when it cannot be used."""
    root = Path(path).resolve()
    if not root.is_dir():
        raise TaskError(root, "not a directory")
    config_file = root / CONFIG
    if not config_file.is_file():
        missing = [CONFIG] + [f for f in (INSTRUCTION, TEST_SCRIPT) if not (root / f).is_file()]
        raise TaskError(root, f"missing {', '.join(missing)}")
    config = parse_config(config_file.read_bytes(), config_file)
    needed = [INSTRUCTION, TEST_SCRIPT] + ([] if config.environment.docker_image else [DOCKERFILE])
    missing = [f for f in needed if not (root / f).is_file()]
    if missing:
        raise TaskError(root, f"missing {', '.join(missing)}")
    workdir = config.environment.workdir
    if workdir is not None and not workdir.startswith("/"):
        raise TaskError(config_file, f"environment.workdir: must be an absolute path, got {workdir!r}")
    try:
        instruction = _strip_canary((root / INSTRUCTION).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise TaskError(root / INSTRUCTION, "not UTF-8 text") from None
    if not instruction.strip():
        raise TaskError(root / INSTRUCTION, "empty")
    return HarborTask(
        name=config.task.name if config.task else root.name,
        path=root,
        config=config,
        instruction=instruction,
        tier=tier if tier is not None else (config.metadata.difficulty or ""),
        content_id=content_id(root),
    )


def _looks_like_task(path: Path) -> bool:
    return any((path / f).exists() for f in (CONFIG, INSTRUCTION, "tests", "environment"))


def _task_dirs(root: Path) -> list[tuple[Path, Optional[str]]]:
    """Each task directory under a suite with the group (tier) it sits in: the suite's own
    sub-directories are tasks, or groups of tasks one level down."""
    if _looks_like_task(root):
        return [(root, None)]
    found: list[tuple[Path, Optional[str]]] = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))):
        if _looks_like_task(child):
            found.append((child, None))
        else:
            found += [
                (t, child.name) for t in sorted(child.iterdir()) if t.is_dir() and not t.name.startswith((".", "__"))
            ]
    return found


def scan_suite(path: Union[str, Path]) -> tuple[list[HarborTask], list[TaskError]]:
    """Every task under a suite directory, sorted by tier then name, and every error found."""
    root = Path(path).resolve()
    if not root.is_dir():
        return [], [TaskError(root, "not a directory")]
    tasks: list[HarborTask] = []
    errors: list[TaskError] = []
    for task_dir, group in _task_dirs(root):
        try:
            tasks.append(load_task(task_dir, tier=group))
        except TaskError as exc:
            errors.append(exc)
    seen: dict[str, Path] = {}
    for task in tasks:
        if task.name in seen:
            errors.append(TaskError(task.path, f"task name {task.name!r} is also the name of {seen[task.name]}"))
        seen.setdefault(task.name, task.path)
    if not tasks and not errors:
        errors.append(TaskError(root, "no task directories (a task has task.toml, instruction.md, tests/test.sh)"))
    return sorted(tasks, key=lambda t: (t.tier, t.name)), errors


def load_suite(path: Union[str, Path] = SUITE_DIR) -> list[HarborTask]:
    """Every task of a suite (default: the project's own); SuiteError listing every broken one."""
    if not Path(path).is_dir():
        raise TaskError(Path(path).resolve(), "not a directory")
    tasks, errors = scan_suite(path)
    if errors:
        raise SuiteError(Path(path).resolve(), errors)
    return tasks
