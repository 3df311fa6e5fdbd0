"""The plain client of bench/concurrency.py: what the farm's policy path is compared with.

Child processes (so their CPU and memory are their own), each one aiohttp session
(TCPConnector(limit=C/Q)) sending the two /v1/completions bodies of a single_tool_call rollout,
C at a time in all; `python -m bench.plain SPEC` runs one of them from a JSON spec file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.procstat import SocketPeaks, peak_rss_mb
from workers.policy.stub import WEATHER_CALL, Script, weather_rows

ROOT = Path(__file__).resolve().parent.parent


def plain_bodies(tok, script: Script) -> list[bytes]:
    """The two request bodies the worker sends for one rollout (first prompt; prompt after the tool call)."""
    from envs.single_tool_call import SingleToolCall
    from workers.policy.chat import chat_tools, input_messages

    row = weather_rows(1)[0]
    env = SingleToolCall()
    history, tools = tok.with_tools(
        input_messages(row["responses_create_params"]), chat_tools([t.schema() for t in env.tools()])
    )
    first = tok.prompt_ids(history, tools)
    history.append({"role": "assistant", "content": WEATHER_CALL})
    env_ids = tok.append_ids(history, tools, [{"role": "tool", "content": json.dumps({"city": "Paris"})}])
    second = first + script.token_replies[0] + env_ids
    base = {
        "model": "stub",
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 96,
    }
    return [json.dumps({**base, "prompt": p}).encode() for p in (first, second)]


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` near-equal shares (the concurrency or the rollouts of each process)."""
    return [total // parts + (i < total % parts) for i in range(parts)]


async def plain_main(url: str, bodies: list[bytes], concurrency: int, n: int) -> dict:
    import aiohttp

    gate = asyncio.Semaphore(concurrency)
    fails: Counter = Counter()
    latencies: list[float] = []
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency), timeout=aiohttp.ClientTimeout(total=600)
    ) as http:

        async def one() -> None:
            async with gate:
                start = time.perf_counter()
                for body in bodies:
                    try:
                        async with http.post(url + "/v1/completions", data=body, headers=headers) as resp:
                            await resp.read()
                            if resp.status != 200:
                                fails[f"HTTP {resp.status}"] += 1
                                return
                    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                        fails[type(exc).__name__] += 1
                        return
                latencies.append(time.perf_counter() - start)

        cpu0, start = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {
        "wall_s": wall,
        "latencies": [round(x, 4) for x in latencies],
        "failures": dict(fails),
        "cpu_s": cpu,
        "peak_rss_mb": peak_rss_mb(os.getpid()),
    }


def plain_round(url: str, bodies: list[bytes], concurrency: int, n: int, tmp: Path, processes: int) -> dict:
    """`processes` plain clients at once, the concurrency and the rollouts split between them."""
    children = []
    for i, (c, k) in enumerate(zip(split(concurrency, processes), split(n, processes))):
        spec = tmp / f"plain-{i}.json"
        spec.write_text(json.dumps({"url": url, "bodies": [b.decode() for b in bodies], "concurrency": c, "n": k}))
        cmd = [sys.executable, "-m", "bench.plain", str(spec)]
        children.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
    outs = []
    with SocketPeaks([c.pid for c in children]) as socks:
        for child in children:
            out, err = child.communicate(timeout=3600)
            if child.returncode != 0:
                raise SystemExit(f"plain client failed:\n{err[-2000:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    fails: Counter = Counter()
    for o in outs:
        fails.update(o["failures"])
    return {
        "wall_s": max(o["wall_s"] for o in outs),
        "latencies": [x for o in outs for x in o["latencies"]],
        "failures": dict(fails),
        "cpu_s": [o["cpu_s"] for o in outs],
        "rss_mb": [o["peak_rss_mb"] for o in outs],
        "sockets": [socks.peak[c.pid] for c in children],
    }


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    bodies = [b.encode() for b in spec["bodies"]]
    print(json.dumps(asyncio.run(plain_main(spec["url"], bodies, spec["concurrency"], spec["n"]))))
