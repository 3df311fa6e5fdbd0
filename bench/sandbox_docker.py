"""What a docker sandbox costs on this machine: start latency, exec round trip, memory, capacity.

Against the local daemon and the farm's base image (envs/boxes/docker.py), every container in a
namespace of its own, all removed at the end (and on Ctrl-C):

  start       `--starts` starts one after another, then the same count 8 at a time: p50 / p99 of
              `start()` (create + start; the container is running when it returns);
  exec        `--execs` round trips of `true` on one idle sandbox, p50 / p99, beside 50
              `docker exec` commands (a client process each) for comparison; then `--execs` execs
              32 at a time over 8 sandboxes, both ways: execs/s and the client side's CPU per exec;
  memory      `--idle` idle sandboxes: the cgroup's memory usage per container, and the host's
              cost beside it (each container's containerd-shim RSS, dockerd + containerd growth);
  capacity    keep 4, 8, 16, ... alive (idle) and start the next batch 8 at a time; the level at
              which start p99 passes 5 s, or `--cap` if none does.

    python bench/sandbox_docker.py [--starts 30] [--execs 200] [--idle 16] [--cap 128]

Wrap it in `flock /tmp/farm-quiet` so no other benchmark shares the CPUs. Prints a table, then
one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envs.boxes.base import BASE_IMAGE  # noqa: E402
from envs.boxes.docker import DockerBackend  # noqa: E402
from envs.sdk.sandbox import SandboxBackend, SandboxSpec  # noqa: E402

SLOW_S = 5.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": round(pct(values, 0.5) * 1000, 1), "p99_ms": round(pct(values, 0.99) * 1000, 1)}


async def timed_starts(backend: SandboxBackend, spec: SandboxSpec, n: int, parallel: int, keep: list) -> list[float]:
    gate = asyncio.Semaphore(parallel)

    async def one() -> float:
        async with gate:
            t = time.monotonic()
            box = await backend.start(spec)
            took = time.monotonic() - t
            keep.append(box)
            return took

    return list(await asyncio.gather(*(one() for _ in range(n))))


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def pids_named(*names: str, containing: str = "") -> list[int]:
    """Host processes by name (`comm`), optionally only those whose command line holds `containing`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace") if containing else ""
            except OSError:
                continue
            if comm in names and containing in cmdline:
                found.append(int(entry.name))
    return found


def cgroup_memory(container: str) -> int:
    for path in (
        f"/sys/fs/cgroup/memory/docker/{container}/memory.usage_in_bytes",  # v1, cgroupfs
        f"/sys/fs/cgroup/system.slice/docker-{container}.scope/memory.current",  # v2, systemd
        f"/sys/fs/cgroup/docker/{container}/memory.current",  # v2, cgroupfs
    ):
        if os.path.exists(path):
            return int(Path(path).read_text())
    return 0


async def bench_exec(backend: DockerBackend, spec: SandboxSpec, n: int, keep: list) -> dict:
    box = await backend.start(spec)
    keep.append(box)
    api = []
    for _ in range(n):
        t = time.monotonic()
        r = await box.exec(["true"], timeout_s=30)
        api.append(time.monotonic() - t)
        assert r.ok, r
    cli = []
    for _ in range(min(n, 50)):
        t = time.monotonic()
        subprocess.run(["docker", "exec", box.id, "true"], check=True)
        cli.append(time.monotonic() - t)
    return {"api": summary(api), "docker_exec_cli": summary(cli)}


async def bench_exec_concurrent(backend: DockerBackend, spec: SandboxSpec, n: int, parallel: int, keep: list) -> dict:
    """n execs of `true` over 8 sandboxes, `parallel` at a time: the API beside `docker exec` processes
    (wall time, and this side's CPU per exec: this process for the API, the children for the CLI)."""
    boxes: list = []
    await timed_starts(backend, spec, 8, 8, boxes)
    keep.extend(boxes)
    gate = asyncio.Semaphore(parallel)

    async def api(i: int) -> None:
        async with gate:
            assert (await boxes[i % 8].exec(["true"], timeout_s=120)).ok

    async def cli(i: int) -> None:
        async with gate:
            proc = await asyncio.create_subprocess_exec("docker", "exec", boxes[i % 8].id, "true")
            assert await proc.wait() == 0

    out = {}
    for name, one in (("api", api), ("docker_exec_cli", cli)):
        cpu, t = os.times(), time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall, after = time.monotonic() - t, os.times()
        used = (after.user + after.system - cpu.user - cpu.system) + (
            after.children_user + after.children_system - cpu.children_user - cpu.children_system
        )
        out[name] = {
            "execs": n,
            "parallel": parallel,
            "wall_s": round(wall, 2),
            "execs_per_s": round(n / wall, 1),
            "client_cpu_ms_per_exec": round(used / n * 1000, 2),
        }
    return out


async def bench_memory(backend: DockerBackend, spec: SandboxSpec, n: int, keep: list) -> dict:
    daemons = pids_named("dockerd", "containerd")
    before = sum(rss_kb(p) for p in daemons)
    boxes: list = []
    await timed_starts(backend, spec, n, 4, boxes)
    keep.extend(boxes)
    await asyncio.sleep(3)
    cgroup = [cgroup_memory(b.id) for b in boxes]
    shim = ("containerd-shim", "containerd-shim-runc-v2")  # comm is cut at 15 characters
    shims = [p for b in boxes for p in pids_named(*shim, containing=b.id)]
    growth = sum(rss_kb(p) for p in daemons) - before
    return {
        "containers": n,
        "cgroup_mib_each": round(statistics.mean(cgroup) / 2**20, 2),
        "shim_mib_each": round(sum(rss_kb(p) for p in shims) / max(len(shims), 1) / 1024, 2),
        "shims_found": len(shims),
        "daemons_growth_mib_each": round(growth / n / 1024, 2),
    }


async def bench_capacity(backend: SandboxBackend, spec: SandboxSpec, cap: int, keep: list) -> dict:
    levels = []
    alive: list = []
    level = 4
    while True:
        lat = await timed_starts(backend, spec, level - len(alive), 8, alive)
        row = {"alive": level, **summary(lat)}
        levels.append(row)
        print(
            f"  capacity: {level:4d} alive, start p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms", flush=True
        )
        if row["p99_ms"] > SLOW_S * 1000 or level >= cap:
            break
        level = min(level * 2, cap)
    keep.extend(alive)
    under = [r["alive"] for r in levels if r["p99_ms"] <= SLOW_S * 1000]
    return {
        "levels": levels,
        "max_alive_with_p99_under_5s": max(under) if under else 0,
        "capped": levels[-1]["p99_ms"] <= SLOW_S * 1000,
    }


async def close_all(backend: DockerBackend, boxes: list) -> None:
    for i in range(0, len(boxes), 16):
        await asyncio.gather(*(b.close() for b in boxes[i : i + 16]))
    boxes.clear()


async def main(args: argparse.Namespace) -> dict:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    backend = DockerBackend(namespace=namespace, worker="bench")
    await backend.check()
    spec = SandboxSpec(image=args.image, lifetime_s=900, cpus=1, memory_mb=512, pids=256)
    keep: list = []
    out: dict = {"image": args.image, "cpus": os.cpu_count()}
    try:
        await close_all(backend, [await backend.start(spec)])  # warm: the image's layers, the connection
        seq = await timed_starts(backend, spec, args.starts, 1, keep)
        await close_all(backend, keep)
        par = await timed_starts(backend, spec, args.starts, 8, keep)
        await close_all(backend, keep)
        out["start_sequential"], out["start_8_concurrent"] = summary(seq), summary(par)
        print(f"start, one at a time:  {out['start_sequential']}", flush=True)
        print(f"start, 8 at a time:    {out['start_8_concurrent']}", flush=True)
        out["exec"] = await bench_exec(backend, spec, args.execs, keep)
        await close_all(backend, keep)
        print(
            f"exec round trip (API): {out['exec']['api']}; docker exec CLI: {out['exec']['docker_exec_cli']}",
            flush=True,
        )
        out["exec_concurrent"] = await bench_exec_concurrent(backend, spec, args.execs, 32, keep)
        await close_all(backend, keep)
        print(f"exec, 32 at a time over 8 sandboxes: {out['exec_concurrent']}", flush=True)
        out["memory"] = await bench_memory(backend, spec, args.idle, keep)
        await close_all(backend, keep)
        print(f"memory per idle sandbox: {out['memory']}", flush=True)
        out["capacity"] = await bench_capacity(backend, spec, args.cap, keep)
        cap = out["capacity"]
        print(f"capacity: {cap['max_alive_with_p99_under_5s']} alive with start p99 <= 5 s (capped: {cap['capped']})")
    finally:
        await close_all(backend, keep)
        for info in await backend.list(namespace):
            await backend.remove(info.id)
        await backend.aclose()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--idle", type=int, default=16)
    parser.add_argument("--cap", type=int, default=128)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
