"""`farm collect`: offline rollout collection through the queue, resumable and measured.

The farm's answer to NeMo Gym's `ng_collect_rollouts`. Rows stream from a JSONL file;
each (row index, repeat index) becomes one task with a deterministic task id, submitted
to its agent's stream; at most `concurrency` tasks are outstanding at once (a window that
a finished rollout reopens), so memory and Redis stay bounded however large the input.
Rollouts are appended to the output as they arrive; failures go to `*_failures.jsonl`
with the reason; at the end a per-agent aggregate is printed and written to
`*_metrics.json` (see producer.metrics for the definitions).

Why it can resume: a line's identity is (row_index, repeat_index). `--resume` cuts a
partial last line, reads which pairs the output and failures already hold, and submits
only the others under the same run id (kept in `*_run.json`). Results arriving for pairs
this process is not waiting for (copies from the crashed run) are dropped, so no pair is
ever written twice. Ctrl-C sets a flag (no exception can land inside a write); the
collector stops submitting, writes what it has and exits with 130.

The options, the first pass over the input and the output files are producer/plan.py.

Why it reads `ResultReader.batches()` rather than `client.results(tasks)`: `results` awaits
a fixed set of tasks, whereas a sliding window needs "whatever finished next"; both read
through the same reader, which dead-letters unreadable results. The reader's own
deduplication is off here: a crashed run's result for a pair that is resubmitted later must
not hide the new one, so the deduplication is by (row, repeat), which also holds across runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

from farm.client import FarmClient
from farm.errors import ConfigError, FarmError, TransportError
from farm.schema import AgentRef, ErrorKind, Rollout, Status, Task
from farm.settings import Settings
from farm.tasks import cancel_and_wait
from producer import metrics as metrics_mod
from producer.output import (
    InputRow,
    Journal,
    Paths,
    line_for,
    open_journals,
    read_rows,
    to_parquet,
    write_json,
    written_per_agent,
)
from producer.plan import CollectOptions, parse_repeats, plan, prepare_files
from producer.pools import embedded_workers
from producer.progress import Live, live_progress

__all__ = ["CollectOptions", "parse_repeats", "run_collect"]  # the options live in producer.plan

log = logging.getLogger("farm.collect")

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


# -- the run -------------------------------------------------------------------------------


class Collector:
    def __init__(
        self, settings: Settings, options: CollectOptions, paths: Paths, run_id: str, done: set[tuple[int, int]]
    ):
        self.settings, self.options, self.paths, self.run_id = settings, options, paths, run_id
        self.done = done
        self.client = FarmClient(settings)
        self.stream = self.client.results_stream(run_id)
        # task_id -> (task, row_index, repeat_index, num_repeats, line, submitted_at)
        self.outstanding: dict[str, tuple[Task, int, int, int, int, float]] = {}
        self.window = asyncio.Semaphore(options.concurrency)
        self.peak_outstanding = 0
        self.live: dict[str, Live] = defaultdict(Live)
        self.written = 0
        self.dropped = 0
        self.stop = asyncio.Event()
        self.fed = False

    def tasks(self) -> Iterator[tuple[Task, int, int, int, int]]:
        o = self.options
        refs: dict[str, AgentRef] = {}
        for item in read_rows(o.input, o.agent, o.limit):
            if not isinstance(item, InputRow):
                continue
            k = o.repeats_for(item.agent)
            for rep in range(k):
                if (item.index, rep) in self.done:
                    continue
                # The task id names the pair: a crashed run's copy of a task and its resubmission
                # are one task to this reader, which takes the first result and drops the other.
                task = Task(
                    task_id=f"{self.run_id}:{item.index}:{rep}",
                    run_id=self.run_id,
                    agent_ref=refs.setdefault(item.agent, AgentRef(name=item.agent)),
                    group_id=f"{self.run_id}:{item.index}",
                    sample_index=rep,
                    row=item.row,
                    sampling=o.sampling,
                    reply_to=self.stream,
                    created_at=0.0,
                )
                yield task, item.index, rep, k, item.line

    async def feed(self) -> None:
        batch: list[Task] = []
        size = max(1, min(500, self.options.concurrency // 4))
        for task, index, rep, k, line in self.tasks():
            if self.stop.is_set():
                break
            if self.window.locked() and batch:
                await self._submit(batch)
                batch = []
            await self.window.acquire()
            if self.stop.is_set():
                self.window.release()
                break
            # Stamped when it enters the window: --timeout counts from submission, not from the read.
            task.created_at = time.time()
            task.deadline = task.created_at + self.options.timeout_s if self.options.timeout_s else None
            self.outstanding[task.task_id] = (task, index, rep, k, line, task.created_at)
            self.peak_outstanding = max(self.peak_outstanding, len(self.outstanding))
            batch.append(task)
            if len(batch) >= size:
                await self._submit(batch)
                batch = []
        if batch:
            await self._submit(batch)
        self.fed = True

    async def _submit(self, batch: list[Task]) -> None:
        await self.client.submit(batch, share=self.options.share, max_in_flight=self.options.max_in_flight)

    async def drain(self, ok: Journal, failures: Journal, on_batch) -> None:
        next_deadline_check = time.monotonic() + 1.0
        if self.fed and not self.outstanding:
            return
        async for batch in self.client.reader(self.run_id, dedupe=False).batches():
            good: list[bytes] = []
            bad: list[bytes] = []
            for rollout in batch:
                self._settle(rollout, good, bad)
            if time.monotonic() >= next_deadline_check and self.options.timeout_s:
                self._expire(good, bad)
                next_deadline_check = time.monotonic() + 1.0
            ok.write(good)
            failures.write(bad)
            if good or bad:
                on_batch()
            if (self.fed and not self.outstanding) or self.stop.is_set():
                return

    def _settle(self, rollout: Rollout, good: list[bytes], bad: list[bytes]) -> None:
        slot = self.outstanding.pop(rollout.task_id, None)
        if slot is None:
            self.dropped += 1  # a copy from a crashed run, or a late duplicate: already written or resubmitted
            return
        task, index, rep, k, line, submitted = slot
        self.window.release()
        text = line_for(
            task, rollout, row_index=index, repeat_index=rep, num_repeats=k, line=line, submitted_at=submitted
        )
        live = self.live[task.agent_ref.name]
        live.done += 1
        self.written += 1
        if rollout.ok:
            good.append(text)
            if rollout.reward is not None:
                live.reward_sum += rollout.reward
                live.rewarded += 1
        else:
            if rollout.status is Status.cancelled:
                live.cancelled += 1
            else:
                live.failed += 1
            bad.append(text)

    def _expire(self, good: list[bytes], bad: list[bytes]) -> None:
        now = time.time()
        for task_id, (task, *_rest) in list(self.outstanding.items()):
            if task.deadline is not None and now > task.deadline:
                self._settle(
                    Rollout.failure(task, ErrorKind.deadline, f"no rollout within --timeout {self.options.timeout_s}s"),
                    good,
                    bad,
                )

    async def run(self, ok: Journal, failures: Journal, on_batch) -> None:
        feeder = asyncio.create_task(self.feed(), name="feed")
        drainer = asyncio.create_task(self.drain(ok, failures, on_batch), name="drain")
        stopper = asyncio.create_task(self.stop.wait(), name="stop")
        watchdog = asyncio.create_task(self.watch_workers(), name="watch-workers")
        tasks = (feeder, drainer, stopper, watchdog)
        try:
            while True:
                await asyncio.wait([t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED)
                if feeder.done():
                    feeder.result()  # a submit that failed for good ends the run
                if watchdog.done():
                    watchdog.result()  # an agent without workers for too long ends the run
                if drainer.done():
                    drainer.result()
                    return
                if stopper.done():
                    return
        finally:
            await cancel_and_wait(tasks)

    async def watch_workers(self, every_s: float = 5.0) -> None:
        """Say when an agent with work outstanding has no live worker, and give up after no_workers_timeout_s."""
        s = self.settings
        since: dict[str, float] = {}
        while True:
            waiting = {t.agent_ref.name for t, *_ in self.outstanding.values()}
            if waiting:
                live = await self.client.live_agents()
                now = time.monotonic()
                for agent in sorted(waiting):
                    if agent in live:
                        since.pop(agent, None)
                        continue
                    if agent not in since:
                        since[agent] = now
                        log.warning(
                            "no live worker for agent %r: start one (`farm worker --agent %s`); giving up "
                            "in %.0fs (no_workers_timeout_s)",
                            agent,
                            agent,
                            s.no_workers_timeout_s,
                        )
                    elif now - since[agent] > s.no_workers_timeout_s:
                        raise FarmError(
                            f"no live worker for agent {agent!r} for {s.no_workers_timeout_s:.0f}s "
                            f"(no_workers_timeout_s): start `farm worker --agent {agent}`, then run "
                            "again with --resume"
                        )
            await asyncio.sleep(every_s)

    async def aclose(self, finished: bool) -> None:
        if finished:
            try:
                await self.client.outage.once(lambda: self.client.r.delete(self.stream), "deleting the result stream")
            except TransportError as exc:
                log.warning("could not delete %s: %s", self.stream, exc)
        await self.client.aclose()


@contextmanager
def _sigint_as_flag(stop: asyncio.Event, loop: asyncio.AbstractEventLoop):
    """Ctrl-C / SIGTERM set `stop` instead of raising inside whatever runs (a write, say)."""
    sigs = [signal.SIGINT, signal.SIGTERM]
    installed = []
    for sig in sigs:
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_collect(settings: Settings, options: CollectOptions) -> dict[str, Any]:
    """Collect the input's rollouts into the output; returns a summary (exit_code, metrics, ...)."""
    if options.concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    if options.format not in ("jsonl", "parquet"):
        raise ConfigError(f"--format must be jsonl or parquet, got {options.format!r}")
    if options.format == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigError("--format parquet needs pyarrow (pip install pyarrow)") from None
    paths = Paths.for_output(options.output, options.format)
    work = plan(options, settings)  # raises before anything is enqueued
    run_id, done = prepare_files(options, paths)
    already = written_per_agent(paths)
    totals = dict(work.pairs)
    remaining = sum(totals.values()) - len(done)
    log.info(
        "collecting",
        extra={
            "run_id": run_id,
            "rows": work.rows,
            "rollouts": sum(totals.values()),
            "already_done": len(done),
            "malformed_lines": work.bad_count,
        },
    )
    start = time.perf_counter()
    interrupted = False
    with ExitStack() as stack:
        if options.embedded and remaining > 0:
            settings = stack.enter_context(
                embedded_workers(settings, sorted(totals), options.worker_processes, options.worker_concurrency)
            )
        elif not settings.redis_url:
            from farm.embedded import ensure_redis

            settings = stack.enter_context(ensure_redis(settings))
        update = stack.enter_context(live_progress(options.progress, totals, already, every_s=options.progress_every_s))
        ok, failures = open_journals(paths, stack)

        async def main() -> Collector:
            c = Collector(settings, options, paths, run_id, done)
            with _sigint_as_flag(c.stop, asyncio.get_running_loop()):
                try:
                    await c.run(ok, failures, lambda: update(c.live))
                finally:
                    update(c.live)
                    await c.aclose(finished=c.fed and not c.outstanding)
            return c

        collector = asyncio.run(main())
        interrupted = collector.stop.is_set() and bool(collector.outstanding or not collector.fed)
    wall = time.perf_counter() - start
    metrics = metrics_mod.aggregate_files(paths.journal, paths.failures, threshold=options.pass_threshold)
    summary = {
        "run_id": run_id,
        "input": str(options.input),
        "output": str(paths.output),
        "rows": work.rows,
        "malformed_lines": work.bad_count,
        "expected": sum(totals.values()),
        "written_now": collector.written,
        "already_done": len(done),
        "dropped_duplicates": collector.dropped,
        "peak_outstanding": collector.peak_outstanding,
        "concurrency": options.concurrency,
        "share": options.share,
        "max_in_flight": options.max_in_flight,
        "wall_s": wall,
        "rollouts_per_s": collector.written / wall if wall > 0 else 0.0,
        "complete": not interrupted,
        "agents": metrics,
    }
    write_json(paths.metrics, summary)
    if not interrupted and options.format == "parquet":
        summary["parquet_rows"] = to_parquet(paths.journal, paths.output)
        paths.journal.unlink()
    if options.progress:
        metrics_mod.render(metrics, title=f"farm collect {run_id}: {collector.written:,} new rollouts in {wall:,.1f}s")
    if interrupted:
        print(
            f"interrupted: {len(done) + collector.written:,} of {sum(totals.values()):,} rollouts written; "
            "run again with --resume to complete",
            file=sys.stderr,
        )
    summary["exit_code"] = EXIT_INTERRUPTED if interrupted else EXIT_OK
    return summary
