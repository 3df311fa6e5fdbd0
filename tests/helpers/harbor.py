"""Harbor workers and what their sandboxes leave behind, for the sweeper and chaos tests.

A `harbor_oracle` worker process with a sandbox backend and a short sweep; a task of the project's
suite whose solution first sleeps (a rollout that is surely in flight when its worker is killed);
and the sandboxes a namespace still has, as each backend shows them: Docker containers by label,
or the `local` backend's metadata files and the cgroups they name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from envs.harbor.rows import task_row
from envs.harbor.task import SUITE_DIR, load_task
from envs.sdk.sandbox import LABEL_NAMESPACE, LABEL_WORKER
from farm.settings import Settings
from helpers.docker import containers_of, docker
from helpers.workers import spawn_worker

AGENT = "harbor_oracle"


def harbor_worker(settings: Settings, backend: str, concurrency: int = 4, **env: str) -> subprocess.Popen:
    """`farm worker --agent harbor_oracle` on `backend`, sweeping every settings.sandbox_sweep_s."""
    return spawn_worker(
        settings,
        "--agent",
        AGENT,
        "--concurrency",
        str(concurrency),
        FARM_SANDBOX_BACKEND=backend,
        FARM_SANDBOX_SWEEP_S=str(settings.sandbox_sweep_s),
        FARM_HEARTBEAT_TTL_S=str(settings.heartbeat_ttl_s),
        FARM_VISIBILITY_TIMEOUT_S=str(settings.visibility_timeout_s),
        FARM_REDIS_DOWN_MAX_S=str(settings.redis_down_max_s),
        FARM_MAX_ATTEMPTS=str(settings.max_attempts),
        **env,
    )


def sleepy_row(tmp_path: Path, sleep_s: float, name: str = "sleepy") -> dict:
    """The row of a copy of the suite's `count-errors` task whose solution sleeps `sleep_s` first."""
    task_dir = tmp_path / name
    shutil.copytree(SUITE_DIR / "tier1" / "count-errors", task_dir)
    solve = task_dir / "solution" / "solve.sh"
    lines = solve.read_text().splitlines(keepends=True)
    solve.write_text(lines[0] + f"sleep {sleep_s:g}\n" + "".join(lines[1:]))
    return task_row(load_task(task_dir), AGENT)


def worker_pid(worker_id: str) -> int:
    """The pid in a worker id (`agent@host:pid:suffix`, workers/delivery/runtime.py)."""
    return int(worker_id.rsplit(":", 2)[1])


def _local_metadata(namespace: str) -> dict[Path, dict]:
    from envs.boxes.local import STATE_DIR

    found = {}
    for meta in sorted((STATE_DIR / "sandboxes").glob("*.json")):
        try:
            data = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        if (data.get("labels") or {}).get(LABEL_NAMESPACE) == namespace:
            found[meta] = data
    return found


def sandbox_owners(backend: str, namespace: str) -> dict[str, str]:
    """The namespace's sandboxes (running or not): id -> its worker label; one `docker ps`, or the
    `local` backend's metadata files."""
    if backend == "local":
        return {
            d.get("id", m.stem): (d.get("labels") or {}).get(LABEL_WORKER, "")
            for m, d in _local_metadata(namespace).items()
        }
    found = docker(
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        f"label={LABEL_NAMESPACE}={namespace}",
        "--format",
        f'{{{{.ID}}}} {{{{.Label "{LABEL_WORKER}"}}}}',
    )
    return dict((line.split() + [""])[:2] for line in found.stdout.splitlines() if line.strip())


def local_left(namespace: str) -> list[str]:
    """The `local` backend's sandboxes of `namespace` still there: metadata files and live cgroups."""
    left = []
    for meta, data in _local_metadata(namespace).items():
        left.append(f"metadata {meta.name}")
        left += [f"cgroup {d}" for d in data.get("cgroups", []) if Path(d).exists()]
    return left


def sandboxes_left(backend: str, namespace: str) -> list[str]:
    """What of `namespace`'s sandboxes is still there (empty: nothing)."""
    return containers_of(namespace) if backend == "docker" else local_left(namespace)
