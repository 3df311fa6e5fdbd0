"""`farm reverify`: stored rollouts scored again by a changed verifier, never by the policy.

The environments below stand for one verifier before and after a fix: `Exact` (version 1)
compares the answer to the expected one as written, `Lenient` (version 2) ignores case and
spaces, so a stored "PARIS" for "paris" goes from 0 to 1. They are named as `test_reverify:Class`
(this module), as a user names an environment not installed as a package.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.policies import stub_processes
from helpers.waiting import wait_for
from helpers.workers import run_through_worker

from envs.sdk import Environment, Row, Transcript, Verdict
from farm.cli import main as farm_main
from farm.errors import UnknownAgent
from farm.schema import AgentRef, Rollout, RolloutError, Status
from farm.settings import Settings, load_settings
from producer.output import InputError, Paths, read_records, rollout_record
from producer.rescore import transcript_of
from producer.reverify import ReverifyOptions, render, run_reverify

TESTS = str(Path(__file__).resolve().parent)


class AnswerRow(Row):
    expected: str


class Exact(Environment):
    """The verifier as first shipped: the answer exactly as expected."""

    name = "exact"
    verifier_version = "1"
    row_type = AnswerRow

    async def verify(self, row: AnswerRow, state, transcript: Transcript) -> Verdict:
        if row.expected == "boom":
            raise ValueError("cannot read the expected answer")
        return Verdict(reward=float(transcript.final_text == row.expected), components={"exact": 1.0})

    def new_state(self, row: AnswerRow):
        if row.expected == "stateless":
            raise RuntimeError("no state for this row")
        return None


class Lenient(Exact):
    """The fixed verifier: case and surrounding spaces no longer matter."""

    verifier_version = "2"

    async def verify(self, row: AnswerRow, state, transcript: Transcript) -> Verdict:
        if row.expected == "boom":
            raise ValueError("cannot read the expected answer")
        same = transcript.final_text.strip().casefold() == row.expected.casefold()
        return Verdict(reward=float(same), metrics={"lenient": True})


class SlowLenient(Lenient):
    """Slow enough that a run can be killed halfway."""

    async def verify(self, row: AnswerRow, state, transcript: Transcript) -> Verdict:
        await asyncio.sleep(0.02)
        return await super().verify(row, state, transcript)


def record(i: int, answer: str, expected: str, *, agent: str = "exact", version: str = "1", status=Status.ok) -> dict:
    """A line as `farm collect` writes it, scored by Exact (version `version`)."""
    error = None if status is Status.ok else RolloutError(kind="policy", message="policy unreachable")
    rollout = Rollout(
        task_id=f"run:{i}:0",
        run_id="run",
        group_id=f"run:{i}",
        agent_ref=AgentRef(name=agent),
        status=status,
        error=error,
        reward=float(answer == expected) if status is Status.ok else None,
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}],
        verifier_version=version,
    )
    row = {"responses_create_params": {"input": f"capital {i}?"}, "expected": expected}
    return {
        "row_index": i,
        "repeat_index": 0,
        "num_repeats": 1,
        "line": i + 1,
        "agent": agent,
        "run_id": "run",
        "task_id": rollout.task_id,
        "submitted_at": 0.0,
        "row": row,
        "rollout": rollout_record(rollout),
    }


def answers(n: int) -> list[dict]:
    """n lines: a third right as written, a third right but for case (0 before the fix, 1 after), a third wrong."""
    kinds = [("paris", "paris"), ("PARIS ", "paris"), ("lyon", "paris")]
    return [record(i, *kinds[i % 3]) for i in range(n)]


def write(path: Path, records: list, raw: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in records]
    for number, text in sorted((raw or {}).items()):
        lines.insert(number - 1, text)
    path.write_text("\n".join(lines) + "\n")
    return path


def opts(tmp_path: Path, inp: Path, **kw) -> ReverifyOptions:
    kw.setdefault("progress", False)
    kw.setdefault("output", tmp_path / "new.jsonl")
    return ReverifyOptions(input=inp, **kw)


def offline(**agents: str) -> Settings:
    """Settings for re-scoring: no Redis, no policy."""
    return load_settings(env={}, overrides={"agents": {k: {"env": v} for k, v in agents.items()}})


def lines_of(*paths: Path) -> Counter:
    return Counter(rec["reverify"]["input_line"] for p in paths for rec in read_records(p))


def test_a_bumped_verifier_changes_rewards_and_keeps_the_old_ones(tmp_path):
    inp = write(tmp_path / "rollouts.jsonl", answers(30))
    summary = run_reverify(offline(), opts(tmp_path, inp, agent="test_reverify:Lenient"))
    assert summary["exit_code"] == 0 and summary["written_now"] == 30
    out = sorted(read_records(tmp_path / "new.jsonl"), key=lambda r: r["row_index"])
    assert len(out) == 30 and not (tmp_path / "new_failures.jsonl").read_bytes()
    for rec in out:
        kind = rec["row_index"] % 3
        assert rec["reward_before"] == (1.0 if kind == 0 else 0.0)
        assert rec["reward_components_before"] == {}
        assert rec["verifier_version_before"] == "1"
        assert rec["rollout"]["reward"] == (0.0 if kind == 2 else 1.0)
        assert rec["rollout"]["verifier_version"] == "2"
        assert rec["rollout"]["metrics"]["lenient"] is True
        assert rec["reverify"]["changed"] is (kind == 1)
        assert rec["reverify"]["input_line"] == rec["row_index"] + 1
        assert rec["row"]["expected"] == "paris" and rec["task_id"] == f"run:{rec['row_index']}:0"
    a = summary["agents"]["test_reverify:Lenient"]
    assert (a["lines"], a["rescored"], a["changed"], a["failed"]) == (30, 30, 10, 0)
    assert a["mean_reward_before"] == pytest.approx(1 / 3) and a["mean_reward_after"] == pytest.approx(2 / 3)
    assert a["versions_before"] == {"1": 30} and a["version_after"] == "2"
    table = render(summary["agents"])
    assert "1->2" in table and "0.333" in table and "0.667" in table
    assert json.loads(Paths.for_output(tmp_path / "new.jsonl").metrics.read_text())["agents"] == summary["agents"]


def test_the_unchanged_verifier_reproduces_every_reward(tmp_path):
    """The negative control: the verifier that gave the stored rewards gives them again."""
    inp = write(tmp_path / "rollouts.jsonl", answers(12))
    summary = run_reverify(offline(), opts(tmp_path, inp, agent="test_reverify:Exact"))
    a = summary["agents"]["test_reverify:Exact"]
    assert (a["rescored"], a["changed"]) == (12, 0)
    assert a["mean_reward_before"] == a["mean_reward_after"]


def test_unknown_environments_unversioned_and_unanswered_lines_are_reported(tmp_path, capsys):
    recs = answers(6)
    recs += [record(6, "paris", "paris", agent="gone"), record(7, "x", "paris", agent="gone")]
    recs += [record(8, "Paris", "paris", version=""), record(9, "", "paris", status=Status.failed)]
    inp = write(tmp_path / "rollouts.jsonl", recs)
    summary = run_reverify(offline(exact="test_reverify:Lenient"), opts(tmp_path, inp, progress=True))
    assert summary["exit_code"] == 1  # two lines could not be re-scored
    failures = {r["reverify"]["input_line"]: r for r in read_records(tmp_path / "new_failures.jsonl")}
    assert sorted(failures) == [7, 8, 10]
    assert failures[7]["reverify"]["outcome"] == "unknown_environment"
    assert "unknown environment 'gone'" in failures[7]["reason"]
    assert failures[7]["rollout"]["reward"] == 1.0 and failures[7]["reward_before"] == 1.0  # kept as it was
    assert failures[10]["reverify"]["outcome"] == "no_answer" and "policy unreachable" in failures[10]["reason"]
    assert lines_of(tmp_path / "new.jsonl") == Counter({n: 1 for n in (1, 2, 3, 4, 5, 6, 9)})
    exact, gone = summary["agents"]["exact"], summary["agents"]["gone"]
    assert (exact["rescored"], exact["unversioned"], exact["no_answer"]) == (7, 1, 1)
    assert exact["versions_before"] == {"1": 7, "-": 1}
    assert gone["unknown_environment"] == 2 and gone["rescored"] == 0
    err = capsys.readouterr().err
    assert "exact: 1 line(s) recorded no verifier_version" in err
    assert "gone: 2 line(s) not re-scored: the environment is unknown" in err
    assert "3 rollout(s) not re-scored" not in err and "2 rollout(s) not re-scored" in err


def test_a_verifier_that_fails_is_recorded_never_scored(tmp_path):
    recs = answers(4) + [record(4, "paris", "boom"), record(5, "paris", "stateless")]
    inp = write(tmp_path / "rollouts.jsonl", recs)
    summary = run_reverify(offline(), opts(tmp_path, inp, agent="test_reverify:Lenient"))
    assert summary["exit_code"] == 1
    failed, stateless = sorted(read_records(tmp_path / "new_failures.jsonl"), key=lambda r: r["row_index"])
    assert failed["reverify"]["outcome"] == "verifier"
    assert failed["reason"].startswith("verifier: verifier raised ValueError: cannot read the expected answer")
    assert failed["rollout"]["reward"] == 0.0 and failed["rollout"]["verifier_version"] == "1"  # untouched
    assert stateless["reverify"]["outcome"] == "error"
    assert stateless["reason"].startswith("error: RuntimeError: no state for this row")
    assert summary["agents"]["test_reverify:Lenient"]["failed"] == 2
    assert len(list(read_records(tmp_path / "new.jsonl"))) == 4


def test_torn_and_foreign_lines_are_reported_or_refused(tmp_path, capsys):
    torn = json.dumps(record(3, "paris", "paris"))[:40]
    foreign = json.dumps({"responses_create_params": {"input": "a row, not a rollout"}})
    inp = write(tmp_path / "rollouts.jsonl", answers(3), raw={2: foreign, 5: torn})
    summary = run_reverify(offline(), opts(tmp_path, inp, agent="test_reverify:Lenient"))
    assert summary["skipped_lines"] == 2 and summary["written_now"] == 3 and summary["exit_code"] == 0
    err = capsys.readouterr().err
    assert f"{inp}:2: skipped: not a rollout line of `farm collect`" in err
    assert f"{inp}:5: skipped: not valid JSON, e.g. a line torn by a crash" in err
    with pytest.raises(InputError, match=r"2 line\(s\) .* are not rollouts \(first: line 2"):
        run_reverify(offline(), opts(tmp_path, inp, output=tmp_path / "strict.jsonl", strict=True))
    assert not (tmp_path / "strict.jsonl").exists()
    only_bad = write(tmp_path / "bad.jsonl", [], raw={1: torn})
    with pytest.raises(InputError, match="no rollout line"):
        run_reverify(offline(), ReverifyOptions(input=only_bad, output=tmp_path / "b.jsonl", progress=False))


def test_no_environment_for_any_line_is_one_error(tmp_path):
    inp = write(tmp_path / "rollouts.jsonl", [record(0, "a", "a", agent="gone")])
    with pytest.raises(UnknownAgent, match="unknown environment 'gone'"):
        run_reverify(offline(), opts(tmp_path, inp))
    assert not (tmp_path / "new.jsonl").exists()


def test_transcript_from_the_output_items():
    rollout = {
        "status": "truncated",
        "metrics": {"reported_reward": 0.5},
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "first"}]},
            {"type": "function_call", "call_id": "c1", "name": "look", "arguments": '{"q": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "found"},
            {"type": "function_call", "call_id": "c2", "name": "", "arguments": "{bad", "status": "incomplete"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "last"}]},
        ],
    }
    t = transcript_of(rollout)
    assert t.final_text == "last" and t.truncated and t.reported is not None and t.reported.reward == 0.5
    assert t.tool_calls == [{"name": "look", "arguments": {"q": 1}}]


def test_cli_exit_codes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    inp = write(tmp_path / "rollouts.jsonl", answers(3))
    out = tmp_path / "new.jsonl"

    def farm(*args: str) -> int:
        return farm_main(["reverify", "--input", str(inp), "--output", str(out), "--no-progress", *args])

    assert farm("--agent", "test_reverify:Lenient") == 0 and len(list(read_records(out))) == 3
    assert farm("--agent", "test_reverify:Lenient") == 2  # the output exists: --resume or --overwrite
    assert "already holds rollouts: pass --resume" in capsys.readouterr().err
    assert farm("--agent", "test_reverify:Lenient", "--resume") == 0 and len(list(read_records(out))) == 3
    assert farm("--agent", "test_reverify:Lenient", "--overwrite") == 0 and len(list(read_records(out))) == 3
    assert farm("--agent", "nowhere", "--overwrite") == 5
    assert "unknown environment 'nowhere'" in capsys.readouterr().err
    assert farm("--agent", "no_such_module:Env", "--overwrite") == 2
    assert farm_main(["reverify", "--input", str(tmp_path / "missing.jsonl"), "--output", str(out)]) == 2
    assert farm_main(["reverify", "--input", str(inp), "--output", str(inp)]) == 2
    assert "is the input" in capsys.readouterr().err
    torn = write(tmp_path / "torn.jsonl", [], raw={1: '{"row_index": 0, "rollo'})
    assert farm_main(["reverify", "--input", str(torn), "--output", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "farm: no rollout line" in err and "Traceback" not in err


@pytest.mark.slow
def test_killed_halfway_then_resume_writes_every_line_exactly_once(tmp_path):
    n = 400
    inp = write(tmp_path / "rollouts.jsonl", answers(n))
    out = tmp_path / "new.jsonl"
    args = ["--input", str(inp), "--output", str(out), "--agent", "test_reverify:SlowLenient", "--concurrency", "4"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), TESTS]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "reverify", *args, "--no-progress"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 60, timeout=60, what="60 lines")
    finally:
        proc.kill()
        proc.wait()
    first = sum(lines_of(out).values())
    assert 60 <= first < n, "killed halfway"
    with open(out, "ab") as f:
        f.write(b'{"row_index": 399, "reverify": {"input_')  # a torn last line, as a crash may leave
    summary = run_reverify(
        offline(), opts(tmp_path, inp, agent="test_reverify:SlowLenient", concurrency=8, resume=True)
    )
    got = lines_of(out, Paths.for_output(out).failures)
    assert set(got.values()) == {1} and set(got) == set(range(1, n + 1))
    assert summary["already_done"] == first and summary["written_now"] == n - first
    assert summary["agents"]["test_reverify:SlowLenient"]["changed"] == n // 3 + (n % 3 > 1)
    again = run_reverify(offline(), opts(tmp_path, inp, agent="test_reverify:SlowLenient", resume=True))
    assert again["written_now"] == 0 and sum(lines_of(out).values()) == n


def _model_requests(stub) -> int:
    return sum(v for k, v in stub.stats().items() if k.startswith("POST /v1/"))


@pytest.mark.slow
def test_a_worker_records_the_version_and_reverify_never_calls_the_policy(tmp_path, settings, model_dir, tokenizer):
    """Rollouts from a real worker and the policy stub carry the environment's verifier_version;
    scoring them again replays their tool calls (the weather lookups the verifier reads) and
    sends the stub, still configured as the policy, not one request."""
    from envs.single_tool_call import SingleToolCall, generate
    from workers.policy.stub import weather_script

    rows = generate(4, seed=3)
    for r in rows[:2]:
        r["expected_city"] = "Paris"
        r["responses_create_params"]["input"][-1]["content"] = "What is the weather in Paris?"
    with stub_processes(weather_script(tokenizer), tmp_path, latency_s=0.01) as start:
        stub = start()
        got = run_through_worker(settings, stub, model_dir, "single_tool_call", rows)
        assert [r.verifier_version for r in got] == [SingleToolCall.verifier_version] * 4
        assert [r.reward for r in got] == [1.0, 1.0, 0.0, 0.0]
        lines = [
            {
                "row_index": i,
                "repeat_index": 0,
                "num_repeats": 1,
                "line": i + 1,
                "agent": "single_tool_call",
                "run_id": r.run_id,
                "task_id": r.task_id,
                "submitted_at": 0.0,
                "row": rows[i],
                "rollout": rollout_record(r),
            }
            for i, r in enumerate(got)
        ]
        inp = write(tmp_path / "rollouts.jsonl", lines)
        before = _model_requests(stub)
        assert before >= 8  # two model turns per rollout went to the stub
        policy = settings.replace(policy_urls=[stub.url])
        summary = run_reverify(policy, opts(tmp_path, inp))
        assert _model_requests(stub) == before
    a = summary["agents"]["single_tool_call"]
    assert (a["rescored"], a["changed"], a["mean_reward_after"]) == (4, 0, 0.5)
    rescored = list(read_records(tmp_path / "new.jsonl"))
    assert all(rec["rollout"]["reward_components"]["called_tool"] == 1.0 for rec in rescored)
