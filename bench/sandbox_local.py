"""The `local` sandbox backend's costs: start latency, exec round trip, memory per sandbox.

  start     N sandboxes started one after another from the base tree (spawn of PID 1, namespaces,
            overlay on a tmpfs, pivot_root, back to the caller), p50 / p99 / max;
  exec      M `true` commands in one sandbox (nsenter + setpriv + the cd wrapper + the command,
            output collected), p50 / p99;
  concurrent K sandboxes started at once, wall time;
  capacity  keep 4, 8, 16, ... alive (idle), starting each batch 8 at a time, up to --cap: the level at
            which start p99 passes 5 s (bench/sandbox_docker.py's ramp, on this backend);
  memory    with K idle sandboxes up: each one's cgroup memory usage (PID 1's interpreter, its
            page tables, the tmpfs and overlay metadata: what the sandbox costs inside its
            limit) and PID 1's RSS as the host sees it (shared pages of the interpreter counted
            in each).

    python -m bench.sandbox_local [--starts 30] [--execs 100] [--concurrent 8] [--cap 128]

Needs root and the base tree (`farm sandbox base`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.sandbox_docker import bench_capacity
from envs.boxes.local import LocalBackend
from envs.sdk.sandbox import SandboxSpec

BASE = "rollout-farm/base:bookworm"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: list[float]) -> str:
    p50, p99, top = statistics.median(values) * 1000, _pct(values, 0.99) * 1000, max(values) * 1000
    return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {top:.1f} ms"


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def run(starts: int, execs: int, concurrent: int, cap: int) -> None:
    with tempfile.TemporaryDirectory() as state:
        backend = LocalBackend(state_dir=Path(state))
        await backend.check()
        spec = SandboxSpec(image=BASE, lifetime_s=300)
        start_s = []
        for _ in range(starts):
            t = time.monotonic()
            box = await backend.start(spec)
            start_s.append(time.monotonic() - t)
            await box.close()
        print(f"start ({starts} sandboxes, one at a time): {_ms(start_s)}")
        box = await backend.start(spec)
        exec_s = []
        for _ in range(execs):
            t = time.monotonic()
            await box.exec(["true"], timeout_s=10)
            exec_s.append(time.monotonic() - t)
        print(f"exec round trip ({execs} x `true`): {_ms(exec_s)}")
        shell_s = [(await box.exec("echo hi", timeout_s=10)).duration_s for _ in range(20)]
        print(f"exec under bash -lc (20 x `echo hi`): {_ms(shell_s)}")
        await box.close()
        t = time.monotonic()
        boxes = await asyncio.gather(*(backend.start(spec) for _ in range(concurrent)))
        print(f"concurrent start ({concurrent} at once): {(time.monotonic() - t) * 1000:.0f} ms wall")
        await asyncio.sleep(1.0)
        cg_mb = [(b.cg.memory_bytes() or 0) / 2**20 for b in boxes]
        rss_mb = [_rss_kb(b.pid) / 1024 for b in boxes]
        print(
            f"memory per idle sandbox: cgroup usage mean {statistics.mean(cg_mb):.1f} MiB "
            f"(max {max(cg_mb):.1f}); PID 1 RSS mean {statistics.mean(rss_mb):.1f} MiB"
        )
        await asyncio.gather(*(b.close() for b in boxes))
        if cap:
            alive: list = []
            try:
                found = await bench_capacity(backend, spec, cap, alive)
            finally:
                await asyncio.gather(*(b.close() for b in alive))
            most, capped = found["max_alive_with_p99_under_5s"], found["capped"]
            print(f"capacity: {most} alive with start p99 <= 5 s (capped: {capped})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--cap", type=int, default=128, help="capacity ramp up to this many alive (0: skip)")
    args = parser.parse_args()
    asyncio.run(run(args.starts, args.execs, args.concurrent, args.cap))


if __name__ == "__main__":
    main()
