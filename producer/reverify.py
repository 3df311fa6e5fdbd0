"""`farm reverify`: score stored rollouts again with today's verifiers, never calling the policy.

A verifier gets fixed (a checker that missed `\\frac12`, a judge prompt that was too lenient), and
the rollouts already collected were scored by the old one. Generating them again costs the
policy's time; scoring them again costs only the verifier's, so this reads the JSONL that
`farm collect` wrote and asks each row's environment for a new verdict, as NeMo Gym's
`gym eval reverify` does. How one line is scored again, and what its output line holds, is
producer/rescore.py; the table at the end is producer/reverify_report.py.

Lines that cannot be scored again (an environment that does not load, a verifier that fails, a
stored rollout without an answer) go to `*_failures.jsonl` with their `reason`. Lines that are
not collect rows (torn by a crash, or foreign) are reported by line number and skipped, or
abort the run with `--strict`, before anything is written.

Why it can resume: a line's identity is its line number in the input, which the run file
(`*_run.json`) ties to one input path. `--resume` cuts a partial last line and skips the
lines the output and failures already hold, as `farm collect --resume` does; whole lines are
appended in one write each batch (producer.output.Journal), so a kill never tears one.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from envs.sdk import Environment, load_env
from farm.errors import ConfigError, FarmError
from farm.settings import Settings
from producer.collect import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, _sigint_as_flag
from producer.output import (
    BadLine,
    InputError,
    Journal,
    Paths,
    open_journals,
    read_json,
    read_records,
    start_output,
    write_json,
    written_per_agent,
)
from producer.progress import Live, live_progress
from producer.rescore import Stored, one_line, read_stored
from producer.reverify_report import render, summarize
from workers.policy.judges import JudgePool, serving

__all__ = ["ReverifyOptions", "render", "run_reverify", "summarize"]

log = logging.getLogger("farm.reverify")


@dataclass
class ReverifyOptions:
    input: Path
    output: Path
    agent: Optional[str] = None  # score every line with this agent's environment (or module:Class)
    concurrency: int = 64  # lines being verified at once (the environments' CPU pools run them)
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    progress: bool = True
    progress_every_s: float = 5.0
    max_bad_lines_shown: int = 20


@dataclass
class Plan:
    totals: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # agent -> lines
    bad: list[BadLine] = field(default_factory=list)
    bad_count: int = 0


def plan(options: ReverifyOptions, out=None) -> Plan:
    """Check every line and count the work; InputError (nothing written) when there is none."""
    out = out or sys.stderr
    if Path(options.output).resolve() == Path(options.input).resolve():
        raise InputError(f"--output {options.output} is the input: write the re-scored rollouts to another file")
    target = Path(options.output)
    if target.is_dir() or not target.parent.is_dir():
        raise InputError(f"cannot write {target}: " + ("it is a directory" if target.is_dir() else "no such directory"))
    p = Plan()
    for item in read_stored(options.input, options.agent):
        if isinstance(item, BadLine):
            p.bad_count += 1
            if len(p.bad) < options.max_bad_lines_shown:
                p.bad.append(item)
            continue
        p.totals[item.agent] += 1
    for b in p.bad:
        print(f"{options.input}:{b.line}: skipped: {b.reason}", file=out)
    if p.bad_count > len(p.bad):
        print(f"... and {p.bad_count - len(p.bad)} more lines skipped", file=out)
    if p.bad_count and options.strict:
        raise InputError(
            f"{p.bad_count} line(s) of {options.input} are not rollouts (first: line {p.bad[0].line}: "
            f"{p.bad[0].reason}); nothing was written (--strict)"
        )
    if not p.totals:
        raise InputError(
            f"no rollout line in {options.input}"
            + (f" ({p.bad_count} line(s) skipped)" if p.bad_count else " (the file is empty)")
            + "; nothing was written"
        )
    return p


def environment_for(name: str, settings: Settings) -> Environment:
    """The environment that scores agent `name`'s rollouts, as the worker builds it: a configured
    agent's env and env_options, else a registered environment or `module:Class`."""
    cfg = settings.agents.get(name)
    return load_env(cfg.env if cfg else name, cfg.env_options if cfg else None)


# -- the run --------------------------------------------------------------------------------


def prepare_files(options: ReverifyOptions, paths: Paths) -> set[int]:
    """The input lines already written (with --resume); cuts torn lines, refuses to clobber (start_output)."""
    if options.resume:
        recorded = read_json(paths.run).get("input")
        if recorded and Path(recorded).resolve() != Path(options.input).resolve():
            raise InputError(f"{paths.journal} re-scores {recorded}, not {options.input}: resume with the same --input")
    start_output(paths, options.resume, options.overwrite)
    done: set[int] = set()
    if options.resume:
        for p in (paths.journal, paths.failures):
            for rec in read_records(p):
                done.add(rec["reverify"]["input_line"])
    write_json(paths.run, {"input": str(options.input), "agent": options.agent, "started_at": time.time()})
    return done


class Rescorer:
    """Feeds the input's lines to their environments, at most `concurrency` at once, and appends
    the finished lines in batches."""

    def __init__(self, options: ReverifyOptions, envs: dict[str, Environment | str], done: set[int]):
        self.options, self.envs, self.done = options, envs, done
        self.window = asyncio.Semaphore(options.concurrency)
        self.stop = asyncio.Event()
        self.live: dict[str, Live] = defaultdict(Live)
        self.good: list[bytes] = []
        self.bad: list[bytes] = []
        self.written = 0

    async def run(self, ok: Journal, failures: Journal, on_batch) -> None:
        running: set[asyncio.Task] = set()
        last_flush = time.monotonic()

        def flush() -> None:
            ok.write(self.good)
            failures.write(self.bad)
            self.good, self.bad = [], []
            on_batch(self.live)

        try:
            for item in read_stored(self.options.input, self.options.agent):
                if not isinstance(item, Stored) or item.line in self.done:
                    continue
                await self.window.acquire()
                if self.stop.is_set():
                    self.window.release()
                    break
                task = asyncio.create_task(self._one(item))
                running.add(task)
                task.add_done_callback(running.discard)
                if len(self.good) + len(self.bad) >= 256 or time.monotonic() - last_flush >= 0.5:
                    flush()
                    last_flush = time.monotonic()
            if running:
                await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            flush()

    async def _one(self, item: Stored) -> None:
        try:
            text, verdict = await one_line(self.envs[item.agent], item)
        finally:
            self.window.release()
        live = self.live[item.agent]
        live.done += 1
        self.written += 1
        if verdict is not None:
            self.good.append(text)
            live.reward_sum += verdict.reward
            live.rewarded += 1
        else:
            live.failed += 1
            self.bad.append(text)


def resolve_envs(names: list[str], settings: Settings, agent: Optional[str]) -> dict[str, Environment | str]:
    """Each agent's environment, or the reason it has none (its lines go to the failures file).
    The environment --agent names, or the only one the input needs, failing fails the run instead,
    before anything is written (UnknownAgent: exit 5, ConfigError: 2)."""
    envs: dict[str, Environment | str] = {}
    errors: list[FarmError] = []
    for name in names:
        try:
            envs[name] = environment_for(name, settings)
        except FarmError as exc:
            errors.append(exc)
            envs[name] = f"no environment for agent {name!r}: {exc}"
    if errors and (agent is not None or not any(isinstance(e, Environment) for e in envs.values())):
        raise errors[0]
    return envs


async def _set_up(envs: dict[str, Environment | str], agent: Optional[str]) -> None:
    """Each environment's setup (its CPU pool started); one that fails has its lines reported."""
    for name, env in envs.items():
        if isinstance(env, Environment):
            try:
                await env.setup()
            except Exception as exc:  # noqa: BLE001 - an environment's setup failing is reported per agent
                why = f"environment of agent {name!r} failed to set up: {type(exc).__name__}: {exc}"
                if agent is not None:
                    raise ConfigError(why) from None
                envs[name] = why
    for reason in envs.values():
        if isinstance(reason, str):
            log.warning("%s; its lines go to the failures file", reason)


async def _close(envs: dict[str, Environment | str]) -> None:
    for env in envs.values():
        if isinstance(env, Environment):
            try:
                await env.aclose()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's result
                log.warning("environment %s did not close cleanly: %s", env.name, exc)


def run_reverify(settings: Settings, options: ReverifyOptions) -> dict[str, Any]:
    """Score the input's rollouts again into the output; returns a summary (exit_code, agents, ...)."""
    if options.concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    paths = Paths.for_output(options.output)
    work = plan(options)
    envs = resolve_envs(sorted(work.totals), settings, options.agent)
    done = prepare_files(options, paths)
    already = written_per_agent(paths, options.agent)
    start = time.perf_counter()
    with ExitStack() as stack:
        update = stack.enter_context(
            live_progress(options.progress, dict(work.totals), already, every_s=options.progress_every_s)
        )
        ok, failures = open_journals(paths, stack)

        async def main() -> Rescorer:
            r = Rescorer(options, envs, done)
            judges = JudgePool.from_settings(settings)  # `ctx.judge` in a verifier: the pool a worker makes
            try:
                await _set_up(envs, options.agent)
                with _sigint_as_flag(r.stop, asyncio.get_running_loop()), serving(judges):
                    await r.run(ok, failures, update)
            finally:
                await _close(envs)
                await judges.aclose()
            return r

        rescorer = asyncio.run(main())
    wall = time.perf_counter() - start
    interrupted = rescorer.stop.is_set()
    agents = summarize(paths, options.agent)
    expected = sum(work.totals.values())
    summary = {
        "input": str(options.input),
        "output": str(paths.output),
        "lines": expected,
        "skipped_lines": work.bad_count,
        "written_now": rescorer.written,
        "already_done": len(done),
        "wall_s": wall,
        "rollouts_per_s": rescorer.written / wall if wall > 0 else 0.0,
        "complete": not interrupted,
        "agents": agents,
    }
    write_json(paths.metrics, summary)
    if options.progress:
        print(render(agents, title=f"farm reverify: {rescorer.written:,} rollouts in {wall:,.1f}s"), file=sys.stderr)
    not_scored = sum(a["failed"] + a["unknown_environment"] for a in agents.values())
    if interrupted:
        print(
            f"interrupted: {len(done) + rescorer.written:,} of {expected:,} lines written; "
            "run again with --resume to complete",
            file=sys.stderr,
        )
    elif not_scored:
        print(f"{not_scored:,} rollout(s) not re-scored: their reasons are in {paths.failures}", file=sys.stderr)
    summary["exit_code"] = EXIT_INTERRUPTED if interrupted else EXIT_FAILED if not_scored else EXIT_OK
    return summary
