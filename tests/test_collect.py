"""`farm collect` against real Redis and real `farm worker --agent noop` processes.

The noop agent reads its reward from the row, so every figure in the metrics is known in
advance; its `sleep_s` slows rollouts down enough to kill a collection halfway or to watch
the window of outstanding tasks.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.redis import make_settings
from helpers.waiting import wait_for
from helpers.workers import spawn_worker, worker_env

from farm.errors import UnknownAgent
from producer.collect import CollectOptions, parse_repeats, run_collect
from producer.metrics import aggregate
from producer.output import InputError, Paths, read_records, repair_tail

pytestmark = pytest.mark.slow


def noop_row(i: int, agent: str = "noop", **spec) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "noop": spec,
    }


def write_rows(path: Path, rows: list, raw_lines: dict[int, str] | None = None) -> Path:
    """Rows as JSONL; `raw_lines` puts literal (broken) text at given 1-based line numbers."""
    lines = [json.dumps(r) for r in rows]
    for number, text in sorted((raw_lines or {}).items()):
        lines.insert(number - 1, text)
    path.write_text("\n".join(lines) + "\n")
    return path


def pairs(*paths: Path) -> Counter:
    return Counter((rec["row_index"], rec["repeat_index"]) for p in paths for rec in read_records(p))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


@pytest.fixture
def worker(settings):
    procs = []

    def start(*args: str) -> subprocess.Popen:
        procs.append(spawn_worker(settings, *args))
        return procs[-1]

    yield start
    for p in procs:
        stop(p)


def opts(tmp_path: Path, inp: Path, **kw) -> CollectOptions:
    kw.setdefault("progress", False)
    return CollectOptions(input=inp, output=tmp_path / "out.jsonl", **kw)


def test_parse_repeats():
    assert parse_repeats("4") == {"default": 4}
    assert parse_repeats("math=8,default=4") == {"default": 4, "math": 8}
    assert parse_repeats("math=8") == {"default": 1, "math": 8}
    with pytest.raises(Exception, match="must be >= 1"):
        parse_repeats("math=0")


def test_collects_every_pair_with_per_agent_repeats_and_metrics(tmp_path, redis_url, namespace, worker):
    # "other" is a configured agent name served by a worker running the noop implementation.
    settings = make_settings(redis_url, namespace, agents={"other": {"env": "single_tool_call"}})
    rows = [noop_row(i, reward=1.0 if i % 4 else 0.0, tokens=8) for i in range(40)]
    rows += [noop_row(i, agent="other", reward=0.5) for i in range(40, 50)]
    inp = write_rows(tmp_path / "rows.jsonl", rows)
    worker("--agent", "noop", "--concurrency", "16")
    worker_other = spawn_worker(settings, "--agent", "other", "--impl", "noop")
    try:
        summary = run_collect(
            settings, opts(tmp_path, inp, num_repeats=parse_repeats("other=3,default=2"), concurrency=20)
        )
    finally:
        stop(worker_other)
    out = tmp_path / "out.jsonl"
    got = pairs(out)
    assert set(got.values()) == {1}
    assert len(got) == 40 * 2 + 10 * 3
    assert summary["exit_code"] == 0 and summary["complete"]
    rec = next(read_records(out))
    assert rec["row"]["noop"] and rec["rollout"]["status"] == "ok"
    assert rec["rollout"]["trace"]["completion_ids"] == list(range(8))  # plain lists, not packed bytes
    assert rec["task_id"] == f"{summary['run_id']}:{rec['row_index']}:{rec['repeat_index']}"
    m = json.loads((tmp_path / "out_metrics.json").read_text())["agents"]
    assert m["noop"]["count"] == 80 and m["noop"]["k"] == 2 and m["noop"]["rows"] == 40
    assert m["noop"]["pass_at_k"] == pytest.approx(0.75) and m["noop"]["majority_at_k"] == pytest.approx(0.75)
    assert m["noop"]["mean_reward"] == pytest.approx(0.75)
    assert m["noop"]["completion_tokens"] == 80 * 8 and m["noop"]["prompt_tokens"] == 80 * 16
    assert m["noop"]["latency_p50_s"] is not None and m["noop"]["tokens_per_s"] > 0
    assert m["other"]["count"] == 30 and m["other"]["k"] == 3
    assert m["other"]["pass_at_k"] == 0.0 and m["other"]["mean_reward"] == pytest.approx(0.5)


def test_pass_and_majority_at_k_from_known_rewards():
    def rec(row, rep, reward, answer, status="ok", kind=None):
        r = {
            "status": status,
            "reward": reward,
            "metrics": {"extracted_answer": answer},
            "timings": {"total_s": 1.0 + rep},
            "finished_at": 10.0,
        }
        if status == "failed":
            r.update(reward=None, error={"kind": kind, "message": "x"})
        return {
            "agent": "math",
            "row_index": row,
            "repeat_index": rep,
            "num_repeats": 4,
            "rollout": r,
            "submitted_at": 5.0,
        }

    records = [
        # row 0: one of four right, the majority wrong -> pass yes, majority no
        rec(0, 0, 0.0, "3"),
        rec(0, 1, 1.0, "4"),
        rec(0, 2, 0.0, "3"),
        rec(0, 3, 0.0, "5"),
        # row 1: three right -> both
        rec(1, 0, 1.0, "7"),
        rec(1, 1, 1.0, "7"),
        rec(1, 2, 0.0, "1"),
        rec(1, 3, 1.0, "7"),
        # row 2: a 2-2 tie, first seen (repeat 0) is wrong -> pass yes, majority no
        rec(2, 3, 1.0, "9"),
        rec(2, 0, 0.0, "8"),
        rec(2, 1, 0.0, "8"),
        rec(2, 2, 1.0, "9"),
        # row 3: a failure counts as a sample that did not pass, never as a reward of 0
        rec(3, 0, None, None, "failed", "verifier"),
        rec(3, 1, 0.0, "2"),
        rec(3, 2, 0.0, "2"),
        rec(3, 3, None, None, "failed", "timeout"),
    ]
    m = aggregate(records)["math"]
    assert m["rows"] == 4 and m["count"] == 16 and m["k"] == 4
    assert m["pass@4"] == pytest.approx(3 / 4)
    assert m["majority@4"] == pytest.approx(1 / 4)
    assert m["failures"] == {"verifier": 1, "timeout": 1} and m["failed"] == 2
    assert m["mean_reward"] == pytest.approx(6 / 14)
    assert m["latency_p50_s"] == 3.0 and m["latency_p99_s"] == 4.0
    # A row whose samples a client interrupted counts them as cancelled, not as failures, and is not rated.
    stopped = [rec(4, i, None, None, "interrupted") for i in range(4)]
    m = aggregate(records + stopped)["math"]
    assert m["rows"] == 4 and m["failed"] == 2 and m["cancelled"] == 4 and "unknown" not in m["failures"]


def test_malformed_lines_reported_with_line_numbers(tmp_path, settings, sync_redis, worker):
    rows = [noop_row(i) for i in range(6)]
    inp = write_rows(
        tmp_path / "rows.jsonl", rows, {2: "{not json", 5: '["a list"]', 7: '{"agent_ref": {"name": "noop"}}'}
    )
    env = worker_env(settings)
    strict = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "collect",
            "--input",
            str(inp),
            "--output",
            str(tmp_path / "strict.jsonl"),
            "--strict",
            "--no-progress",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert strict.returncode == 2
    for number in (2, 5, 7):
        assert f"rows.jsonl:{number}: skipped" in strict.stderr
    assert "nothing was enqueued" in strict.stderr
    assert sync_redis.xlen(settings.keys.tasks("noop")) == 0

    worker("--agent", "noop")
    lenient = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "collect",
            "--input",
            str(inp),
            "--output",
            str(tmp_path / "out.jsonl"),
            "--no-progress",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lenient.returncode == 0, lenient.stderr
    assert "rows.jsonl:2: skipped: not valid JSON" in lenient.stderr
    assert "rows.jsonl:7: skipped: missing `responses_create_params.input`" in lenient.stderr
    recs = list(read_records(tmp_path / "out.jsonl"))
    assert sorted(r["row_index"] for r in recs) == list(range(6))
    assert sorted(r["line"] for r in recs) == [1, 3, 4, 6, 8, 9]


def test_unknown_agent_is_reported_before_anything_is_enqueued(tmp_path, settings, sync_redis):
    rows = [noop_row(i) for i in range(5)] + [noop_row(5, agent="no_such_agent")]
    inp = write_rows(tmp_path / "rows.jsonl", rows)
    with pytest.raises(UnknownAgent, match="unknown agent.*no_such_agent"):
        run_collect(settings, opts(tmp_path, inp))
    assert sync_redis.xlen(settings.keys.tasks("noop")) == 0
    assert sync_redis.xlen(settings.keys.tasks("no_such_agent")) == 0
    assert not sync_redis.exists(settings.keys.agents())
    with pytest.raises(UnknownAgent, match="unknown agent.*nope"):
        run_collect(settings, opts(tmp_path, write_rows(tmp_path / "ok.jsonl", rows[:5]), agent="nope"))
    assert sync_redis.xlen(settings.keys.tasks("noop")) == 0


def test_collect_ends_when_a_redis_read_absorbs_its_cancellation(tmp_path, redis_url, namespace, monkeypatch):
    """Under CPU load redis-py's asyncio client can lose the cancellation of a read in flight and
    read again; `farm collect` cancelled its result reader once and waited for it forever (it gave
    up on an agent without workers and never exited). Here the reader absorbs the first one."""
    import asyncio

    from farm.client import ResultReader
    from farm.errors import FarmError

    absorbed = []

    async def pull(self, block_ms: int) -> int:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            absorbed.append(True)  # lost, as in the client...
        await asyncio.sleep(3600)  # ...which reads again
        return 0

    monkeypatch.setattr(ResultReader, "pull", pull)
    settings = make_settings(redis_url, namespace, no_workers_timeout_s=1.0)
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i) for i in range(3)])
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_collect(settings, opts(tmp_path, inp))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "farm collect did not end: the reader's cancellation was lost and never repeated"
    assert absorbed == [True]
    assert len(outcome) == 1 and isinstance(outcome[0], FarmError), outcome
    assert "no live worker for agent 'noop'" in str(outcome[0])


def test_outstanding_tasks_never_exceed_concurrency(tmp_path, settings, sync_redis, worker):
    worker("--agent", "noop", "--concurrency", "16")
    worker("--agent", "noop", "--concurrency", "16")
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i, sleep_s=0.02) for i in range(150)])
    stream = settings.keys.tasks("noop")
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        # Entries stay in the task stream until settled (the settle step XDELs them): pending +
        # undelivered; with the tasks still queued per run (farm.fairness) and the retries
        # waiting, everything outstanding in Redis for this agent.
        while not done.is_set():
            pipe = sync_redis.pipeline(transaction=True)
            pipe.xlen(stream).zcard(settings.keys.delayed("noop")).llen(settings.keys.backlog("noop"))
            seen.append(sum(pipe.execute()))
            time.sleep(0.002)

    t = threading.Thread(target=watch)
    t.start()
    try:
        summary = run_collect(settings, opts(tmp_path, inp, concurrency=6))
    finally:
        done.set()
        t.join()
    assert len(pairs(tmp_path / "out.jsonl")) == 150
    assert summary["peak_outstanding"] == 6
    assert max(seen) <= 6, max(seen)
    assert max(seen) >= 3, "the window should actually fill"


def test_sigkill_halfway_then_resume_writes_every_pair_exactly_once(tmp_path, settings, worker):
    rows = [noop_row(i, sleep_s=0.05, reward=float(i % 2)) for i in range(150)]
    rows[17]["noop"] = {"fail": "fatal"}
    inp = write_rows(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out.jsonl"
    worker("--agent", "noop", "--concurrency", "16")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "farm",
            "collect",
            "--input",
            str(inp),
            "--output",
            str(out),
            "--num-repeats",
            "2",
            "--concurrency",
            "16",
            "--no-progress",
        ],
        env=worker_env(settings),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 80, timeout=60, what="80 lines")
    finally:
        proc.kill()
        proc.wait()
    first = pairs(out, Paths.for_output(out).failures)
    assert 80 <= sum(first.values()) < 300, "killed halfway"
    with open(out, "ab") as f:
        f.write(b'{"row_index": 149, "repeat_ind')  # a torn last line, as a crash may leave
    summary = run_collect(settings, opts(tmp_path, inp, num_repeats={"default": 2}, concurrency=16, resume=True))
    failures = Paths.for_output(out).failures
    got = pairs(out, failures)
    assert set(got.values()) == {1}, [k for k, v in got.items() if v > 1]
    assert set(got) == {(i, r) for i in range(150) for r in range(2)}
    assert summary["already_done"] == sum(first.values())
    assert summary["written_now"] == 300 - sum(first.values())
    assert [(r["row_index"], r["rollout"]["error"]["kind"]) for r in read_records(failures)] == [(17, "verifier")] * 2
    m = summary["agents"]["noop"]
    assert m["count"] == 300 and m["failed"] == 2 and m["pass_at_k"] == pytest.approx(74 / 150)
    again = run_collect(settings, opts(tmp_path, inp, num_repeats={"default": 2}, resume=True))
    assert again["written_now"] == 0 and sum(pairs(out, failures).values()) == 300


def test_failures_go_to_the_sidecar_with_the_reason(tmp_path, settings, worker):
    worker("--agent", "noop", "--concurrency", "8")
    rows = [noop_row(0), noop_row(1, fail="fatal"), noop_row(2, fail="always"), noop_row(3, fail=1)]
    summary = run_collect(settings, opts(tmp_path, write_rows(tmp_path / "rows.jsonl", rows)))
    ok = {r["row_index"]: r for r in read_records(tmp_path / "out.jsonl")}
    bad = {r["row_index"]: r for r in read_records(tmp_path / "out_failures.jsonl")}
    assert set(ok) == {0, 3} and ok[3]["rollout"]["attempt"] == 2
    assert set(bad) == {1, 2}
    assert bad[1]["reason"] == "verifier: noop told to fail without retry"
    assert bad[2]["rollout"]["attempt"] == settings.max_attempts and "noop told to fail" in bad[2]["reason"]
    kind = bad[2]["rollout"]["error"]["kind"]
    assert summary["agents"]["noop"]["failures"] == {"verifier": 1, kind: 1}
    assert summary["agents"]["noop"]["mean_reward"] == 1.0  # failures carry no reward, not a 0

    slow = write_rows(tmp_path / "slow.jsonl", [noop_row(0, sleep_s=3.0)])
    summary = run_collect(
        settings, CollectOptions(input=slow, output=tmp_path / "slow_out.jsonl", timeout_s=0.5, progress=False)
    )
    (late,) = read_records(tmp_path / "slow_out_failures.jsonl")
    assert late["rollout"]["error"]["kind"] == "deadline" and late["reason"].startswith("deadline:")
    assert summary["agents"]["noop"]["failures"] == {"deadline": 1}


def test_refuses_to_clobber_and_limit(tmp_path, settings, worker):
    worker("--agent", "noop")
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i) for i in range(10)])
    run_collect(settings, opts(tmp_path, inp, limit=4))
    assert len(pairs(tmp_path / "out.jsonl")) == 4
    with pytest.raises(InputError, match="--resume"):
        run_collect(settings, opts(tmp_path, inp))
    run_collect(settings, opts(tmp_path, inp, overwrite=True, num_repeats={"default": 2}))
    assert len(pairs(tmp_path / "out.jsonl")) == 20


def test_repair_tail(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a"')
    assert repair_tail(p) == 4 and p.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    assert repair_tail(p) == 0
    p.write_bytes(b"no newline at all")
    assert repair_tail(p) == 17 and p.read_bytes() == b""


def test_embedded_starts_its_own_workers(tmp_path, settings, sync_redis):
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i, reward=1.0) for i in range(30)])
    env = worker_env(settings, FARM_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "collect",
            "--input",
            str(inp),
            "--output",
            str(tmp_path / "out.jsonl"),
            "--embedded",
            "--num-repeats",
            "2",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(pairs(tmp_path / "out.jsonl")) == 60
    assert "reward" in proc.stdout and "pass@k" in proc.stdout and "noop" in proc.stdout  # the metrics table
    assert (tmp_path / "data" / "logs" / "collect-worker-noop.log").exists()
    wait_for(
        lambda: not list(sync_redis.scan_iter(match=settings.keys.worker_pattern())),
        timeout=10,
        what="the embedded workers to stop",
    )


def test_ctrl_c_stops_cleanly_and_resume_completes(tmp_path, settings, worker):
    worker("--agent", "noop", "--concurrency", "8")
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i, sleep_s=0.05) for i in range(200)])
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "collect", "--input", str(inp), "--output", str(out), "--concurrency", "8"],
        env=worker_env(settings),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 20, timeout=60, what="20 lines")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "run again with --resume" in stderr
    data = out.read_bytes()
    assert data.endswith(b"\n") and all(json.loads(line) for line in data.splitlines())
    assert 20 <= data.count(b"\n") < 200
    summary = run_collect(settings, opts(tmp_path, inp, concurrency=8, resume=True))
    assert summary["complete"] and set(pairs(out).values()) == {1} and len(pairs(out)) == 200


def test_parquet_output(tmp_path, settings, worker):
    pa = pytest.importorskip("pyarrow", reason="--format parquet needs pyarrow")
    import pyarrow.parquet as pq

    worker("--agent", "noop")
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i, reward=0.5, tokens=4) for i in range(12)])
    pq_out = tmp_path / "rollouts.parquet"
    s = run_collect(
        settings, CollectOptions(input=inp, output=pq_out, format="parquet", num_repeats={"default": 2}, progress=False)
    )
    assert s["parquet_rows"] == 24 and not Path(f"{pq_out}.journal.jsonl").exists()
    table = pq.read_table(pq_out)
    assert table.num_rows == 24 and table.schema.field("completion_ids").type == pa.list_(pa.int32())
    assert table.column("completion_ids").to_pylist()[0] == [0, 1, 2, 3]
    assert sorted(zip(table.column("row_index").to_pylist(), table.column("repeat_index").to_pylist())) == [
        (i, r) for i in range(12) for r in range(2)
    ]
    assert json.loads(table.column("row").to_pylist()[0])["noop"]["reward"] == 0.5
    assert (tmp_path / "rollouts_metrics.json").exists()
    try:
        import datasets
    except ImportError:
        return
    dp = datasets.load_dataset("parquet", data_files=str(pq_out), split="train")
    assert len(dp) == 24 and dp[0]["completion_ids"] == [0, 1, 2, 3]


def test_output_loads_with_datasets(tmp_path, settings, worker):
    datasets = pytest.importorskip("datasets", reason="`datasets` is not installed (it belongs in the test extra)")
    worker("--agent", "noop")
    inp = write_rows(tmp_path / "rows.jsonl", [noop_row(i, reward=0.5, tokens=4) for i in range(12)])
    run_collect(settings, opts(tmp_path, inp, num_repeats={"default": 2}))
    ds = datasets.load_dataset("json", data_files=str(tmp_path / "out.jsonl"), split="train")
    assert len(ds) == 24 and ds[0]["rollout"]["reward"] == 0.5 and ds[0]["rollout"]["trace"]["env_mask"] == [1] * 4
    assert {"row_index", "repeat_index", "row", "rollout"} <= set(ds.column_names)


@pytest.mark.vllm
def test_embedded_collects_two_environments_against_real_vllm(tmp_path, settings, vllm, model_dir):
    """The README's main command in small: two environments, embedded worker pools, real vLLM."""
    from envs.sdk import load_env

    rows = load_env("single_tool_call").generate(2, seed=1) + load_env("mcqa").generate(2, seed=1)
    inp = write_rows(tmp_path / "rows.jsonl", rows)
    env = worker_env(
        settings,
        FARM_DATA_DIR=str(tmp_path / "data"),
        FARM_POLICY_URLS=vllm.url,
        FARM_POLICY_MODEL=vllm.served_model_name,
        FARM_POLICY_TOKENIZER=str(model_dir),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "collect",
            "--input",
            str(inp),
            "--output",
            str(tmp_path / "out.jsonl"),
            "--embedded",
            "--num-repeats",
            "mcqa=3,default=2",
            "--max-tokens",
            "48",
            "--worker-concurrency",
            "8",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = list(read_records(tmp_path / "out.jsonl")) + list(read_records(tmp_path / "out_failures.jsonl"))
    assert Counter(r["agent"] for r in recs) == {"single_tool_call": 4, "mcqa": 6}
    for r in recs:
        ro = r["rollout"]
        assert ro["status"] in ("ok", "truncated"), ro["error"]
        assert 0.0 <= ro["reward"] <= 1.0
        assert len(ro["trace"]["completion_ids"]) == len(ro["trace"]["logprobs"]) > 0
    m = json.loads((tmp_path / "out_metrics.json").read_text())["agents"]
    assert m["mcqa"]["k"] == 3 and m["single_tool_call"]["k"] == 2
    assert m["mcqa"]["completion_tokens"] > 0 and m["mcqa"]["tokens_per_s"] > 0
    assert "single_tool_call" in proc.stdout and "mcqa" in proc.stdout  # the metrics table


def test_the_table_counts_truncations_and_slow_rates_keep_a_decimal(capsys):
    """An LLM run truncated 33 of 64 rollouts and ran at under 1 rollout/s: the table says how many
    were truncated, and the progress line says 0.8/s, not 0/s."""
    from producer.metrics import render
    from producer.progress import Live, _line, per_second

    m = dict(rows=8, k=4, count=32, truncated=17, failures={"policy": 1}, mean_reward=0.031)
    m |= dict(pass_at_k=0.25, majority_at_k=0.125, latency_p50_s=37.61, tokens_per_s=12.3)
    render({"single_tool_call": m})
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("agent"))
    row = next(line for line in lines if line.startswith("single_tool_call"))
    cells = dict(zip(header.split(), row.split()))
    assert cells["trunc"] == "17" and cells["rollouts"] == "32" and cells["failed"] == "1", lines
    assert all(len(line) <= 80 for line in lines), lines
    assert per_second(8, 10.0) == "0.8/s" and per_second(95, 10.0) == "9.5/s" and per_second(1234, 10.0) == "123/s"
    assert per_second(1, 28.0) == "0.036/s" and per_second(0, 5.0) == "0/s"
    assert "0.8/s" in _line("mcqa", Live(done=8), 8, 32, 10.0)
