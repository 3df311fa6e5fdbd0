"""Screenshots of every dashboard page at 1,400 and 1,024 px, into docs/dashboard/ (docs/dashboard.md shows them).

A small farm is run for them: Redis (the one at --redis-url, or an embedded one), two noop
worker processes, a training run (groups of 4, rewards that grow with the policy version), an
evaluation run with a lower share, a collection, and a few tasks that always fail (dead
letters after their attempts); then `farm dashboard` and a real headless Chromium
(Debian's chromium-headless-shell, driven by Playwright with executable_path).

    .venv/bin/python scripts/screenshots.py [--redis-url URL] [--out docs/dashboard]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from bench.common import WorkerPool, answers, delete_namespace  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.embedded import EmbeddedRedis  # noqa: E402
from farm.keys import text  # noqa: E402
from farm.settings import load_settings  # noqa: E402

WIDTHS = (1400, 1024)
SETTINGS = {"FARM_MAX_ATTEMPTS": "2", "FARM_RETRY_BACKOFF_S": "0.1", "FARM_SAMPLE_EVERY": "1"}


def row(i: int, **noop) -> dict:
    prompt = [
        {"role": "system", "content": "Answer with one number."},
        {"role": "user", "content": f"What is {i} + {i}? <b>not bold</b>"},
    ]
    return {
        "responses_create_params": {"input": prompt},
        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
        "noop": noop,
    }


async def fill(settings) -> None:
    """The runs the pages show: their rollouts settle while this waits."""
    client = FarmClient(settings)
    tasks = []
    for version in range(3):
        for g in range(4):
            group = f"train-v{version}-g{g}"
            for i in range(4):
                reward = 1.0 if (i + g + version) % 4 < version + 1 else 0.0
                spec = row(g * 4 + i, sleep_s=0.05 * (1 + i), reward=reward, tokens=24)
                tasks.append(
                    client.task(
                        run_id="train-demo",
                        agent="noop",
                        row=spec,
                        group_id=group,
                        sample_index=i,
                        policy_version=version,
                    )
                )
    await client.submit(tasks, share=3)
    evals = [client.task(run_id="eval-demo", agent="noop", row=row(i, sleep_s=0.1)) for i in range(24)]
    await client.submit(evals, share=1, max_in_flight=4)
    failing = [client.task(run_id="collect-demo", agent="noop", row=row(i, fail="always")) for i in range(3)]
    flaky = [client.task(run_id="collect-demo", agent="noop", row=row(i, fail=1)) for i in range(3)]
    await client.submit(failing + flaky)
    await client.collect(tasks + evals + failing + flaky, timeout_s=120)
    later = [client.task(run_id="collect-demo", agent="noop", row=row(i, sleep_s=30)) for i in range(40)]
    await client.submit(later)  # a backlog and rollouts in flight while the pictures are taken
    await client.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pages(url: str, r: redis.Redis, settings) -> list[tuple[str, str]]:
    k = settings.keys
    samples = r.xrevrange(k.samples("noop"), count=200)
    first_id = text(samples[0][0]) if samples else ""
    dead = r.xrevrange(k.dead("noop"), count=1)
    prefix = k.worker("")
    worker = next(iter(sorted(text(w)[len(prefix) :] for w in r.scan_iter(match=k.worker_pattern()))), "")
    from farm import schema

    task_id = ""
    for _, fields in samples:
        ro = schema.decode_rollout(fields)
        if ro.run_id == "collect-demo" and ro.attempt > 1:
            task_id = ro.task_id
    return [
        ("overview", "/"),
        ("agent", "/agents/noop?minutes=30"),
        ("runs", "/runs"),
        ("run", "/runs/train-demo"),
        ("workers", "/workers"),
        ("worker", f"/workers/{worker}"),
        ("rollouts", "/rollouts/noop"),
        ("rollout", f"/rollouts/noop/{first_id}"),
        ("dead", "/dead/noop"),
        ("letter", f"/dead/noop/{text(dead[0][0])}" if dead else "/dead/noop"),
        ("find", "/find?q=train-v2-g1"),
        ("task", f"/tasks/{task_id}"),
        ("group", "/groups/train-v2-g1"),
    ]


def browser() -> str:
    for name in ("chromium-headless-shell", "chromium"):
        if shutil.which(name):
            return shutil.which(name) or name
    raise SystemExit("no chromium: apt-get install chromium-headless-shell")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--out", default=str(ROOT / "docs" / "dashboard"))
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="farm-shots-")))
        url = args.redis_url
        if not answers(url):
            url = stack.enter_context(EmbeddedRedis(tmp / "redis", appendfsync="no")).url
        ns = f"shots-{uuid.uuid4().hex[:8]}"  # its own namespace, deleted afterwards
        stack.callback(delete_namespace, url, ns)
        settings = load_settings(env=SETTINGS, overrides={"redis_url": url, "namespace": ns})
        stack.enter_context(WorkerPool(url, ns, "noop", 2, 8, tmp, "shots", **SETTINGS))
        asyncio.run(fill(settings))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        env.update(FARM_REDIS_URL=url, FARM_NAMESPACE=ns, FARM_DASHBOARD_TOKEN="demo", PYTHONPATH=str(ROOT))
        dash = subprocess.Popen([sys.executable, "-m", "farm", "dashboard", "--port", str(port)], env=env, cwd=ROOT)
        stack.callback(dash.terminate)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the dashboard did not come up") from None
                time.sleep(0.2)
        r = redis.Redis.from_url(url)
        with sync_playwright() as pw:
            chromium = pw.chromium.launch(executable_path=browser())
            for width in WIDTHS:
                page = chromium.new_page(viewport={"width": width, "height": 900})
                for name, path in pages(base, r, settings):
                    resp = page.goto(base + path)
                    if resp is None or resp.status != 200:
                        print(f"{path}: {resp.status if resp else 'no answer'}", file=sys.stderr)
                    page.wait_for_timeout(300)
                    page.screenshot(path=str(out / f"{name}-{width}.png"), full_page=True)
                    print(f"{out / f'{name}-{width}.png'}  {path}")
                page.close()
            chromium.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
