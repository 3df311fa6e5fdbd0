"""The `farm` command tree as a new user meets it: bad input, terminals, pipes, `farm up`.

Every bad invocation must end in one line that names the bad value, a non-zero exit code, no
traceback, and nothing left behind in Redis. The terminal tests run `farm collect` and
`farm status --watch` under a real 80-column pseudo-terminal and in a pipe.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from helpers import ROOT
from helpers.processes import processes_of, stop
from helpers.waiting import wait_for
from helpers.workers import spawn_worker, worker_env

from farm.cli import main
from farm.embedded import free_port

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


@pytest.fixture
def files(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": f"q{i}"}, "agent_ref": {"name": "noop"}, "noop": {}})
            + "\n"
            for i in range(3)
        )
    )
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"responses_create_params": {"input": "caf\xe9"}}\n')
    (tmp_path / "invalid.jsonl").write_text("{not json\n[1, 2]\n")
    (tmp_path / "badrow.jsonl").write_text(
        json.dumps({"responses_create_params": {"input": ""}, "agent_ref": {"name": "noop"}}) + "\n"
    )
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "ghost.jsonl").write_text(
        json.dumps({"responses_create_params": {"input": "x"}, "agent_ref": {"name": "ghost_agent"}}) + "\n"
    )
    (tmp_path / "bad.yaml").write_text("a: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "unknown.yaml").write_text("bogus_key: 1\n")
    (tmp_path / "noup.yaml").write_text("namespace: x\n")
    (tmp_path / "badup.yaml").write_text("up:\n  workers:\n    noop: 0\n")
    (tmp_path / "train_missing.yaml").write_text("dataset_path: rows.jsonl\n")
    (tmp_path / "train_bad.yaml").write_text("model_name: m\ndataset_path: d\nmax_steps: 0\n")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "adir").mkdir()
    return tmp_path


def P(name: str) -> str:
    return f"{{tmp}}/{name}"


# (argv with {tmp} for the files' directory, environment, a text the message must hold)
BAD = [
    (["--config", "/nonexistent/farm.yaml", "status"], {}, "/nonexistent/farm.yaml"),
    (["--config", P("adir"), "status"], {}, "adir"),
    (["--config", P("bad.yaml"), "status"], {}, "not valid YAML"),
    (["--config", P("list.yaml"), "status"], {}, "mapping"),
    (["--config", P("unknown.yaml"), "status"], {}, "bogus_key"),
    (["--log-level", "LOUD", "status"], {}, "LOUD"),
    (["--redis-url", "http://example.com", "status"], {}, "redis_url"),
    (["--namespace", "bad ns!", "status"], {}, "bad ns!"),
    (["--bogus"], {}, "--bogus"),
    (["nosuchcommand"], {}, "nosuchcommand"),
    (["status"], {"FARM_MAX_ATTEMPTS": "many"}, "FARM_MAX_ATTEMPTS"),
    (["status"], {"FARM_TASK_TIMEOUT_S": "nan"}, "task_timeout_s"),
    (["status"], {"FARM_REDIS_DOWN_MAX_S": "inf"}, "redis_down_max_s"),
    (["status"], {"FARM_CONCURRENCY": "0"}, "concurrency"),
    (["redis", "--port", "70000"], {}, "70000"),
    (["redis", "--port", "abc"], {}, "abc"),
    (["redis", "--password-file", "/nonexistent/pw"], {}, "/nonexistent/pw"),
    (["redis", "--appendfsync", "sometimes"], {}, "sometimes"),
    (["redis", "--data-dir", P("a_file")], {}, "a_file"),
    (["worker"], {}, "--agent"),
    (["worker", "--agent", "noop", "--concurrency", "-1"], {}, "-1"),
    (["worker", "--agent", "noop", "--concurrency", "0"], {}, "0"),
    (["worker", "--agent", "noop", "--processes", "0"], {}, "0"),
    (["worker", "--agent", "noop", "--processes", "x"], {}, "'x'"),
    (["worker", "--agent", "noop", "--concurrency", "1e9"], {}, "1e9"),
    (["worker", "--agent", "no_such_agent"], {}, "no_such_agent"),
    (
        ["--redis-url", "redis://127.0.0.1:1/0", "worker", "--agent", "noop"],
        {"FARM_REDIS_DOWN_MAX_S": "1"},
        "127.0.0.1:1",
    ),
    (["--redis-url", "redis://127.0.0.1:1/0", "status"], {}, "127.0.0.1:1"),
    (["status", "--watch", "-1"], {}, "-1"),
    (["status", "--watch", "nan"], {}, "nan"),
    (["policy", "serve", "--port", "70000"], {}, "70000"),
    (["policy", "serve", "--max-model-len", "0"], {}, "0"),
    (["policy", "serve", "--ready-timeout", "nan"], {}, "nan"),
    (["policy", "serve", "--model", "/nonexistent/model"], {}, "/nonexistent/model"),
    (["policy", "nothing"], {}, "nothing"),
    (["demo", "--tasks", "0"], {}, "0"),
    (["demo", "--timeout", "-5"], {}, "-5"),
    (["demo", "--timeout", "inf"], {}, "inf"),
    (["demo", "--concurrency", "abc"], {}, "abc"),
    (["collect", "--input", "/nonexistent/rows.jsonl", "--output", P("o.jsonl")], {}, "/nonexistent/rows.jsonl"),
    (["collect", "--input", P("adir"), "--output", P("o.jsonl")], {}, "adir"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--limit", "-1"], {}, "-1"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--timeout", "-5"], {}, "-5"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--timeout", "nan"], {}, "nan"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--concurrency", "0"], {}, "0"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--num-repeats", "x"], {}, "'x'"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--num-repeats", "math=0"], {}, "math=0"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--format", "xml"], {}, "xml"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--top-p", "2"], {}, "2"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--temperature", "-1"], {}, "-1"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--run-id", "bad id!"], {}, "bad id!"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--max-tokens", "0"], {}, "0"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--workers", "0"], {}, "0"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--progress-every", "0"], {}, "0"),
    (["collect", "--input", P("empty.jsonl"), "--output", P("o.jsonl")], {}, "empty"),
    (["collect", "--input", P("latin1.jsonl"), "--output", P("o.jsonl")], {}, "latin1.jsonl"),
    (["collect", "--input", P("invalid.jsonl"), "--output", P("o.jsonl")], {}, "no valid row"),
    (["collect", "--input", P("ghost.jsonl"), "--output", P("o.jsonl")], {}, "ghost_agent"),
    (["collect", "--input", P("rows.jsonl"), "--output", "/nonexistent/dir/out.jsonl"], {}, "/nonexistent/dir"),
    (["collect", "--input", P("rows.jsonl"), "--output", P("adir")], {}, "adir"),
    (["data", "generate", "nosuchenv", "--size", "3", "-o", P("g.jsonl")], {}, "nosuchenv"),
    (["data", "generate", "mcqa", "--size", "-3", "-o", P("g.jsonl")], {}, "-3"),
    (["data", "generate", "mcqa", "--size", "nan", "-o", P("g.jsonl")], {}, "nan"),
    (["data", "generate", "mcqa", "--size", "3"], {}, "--output"),
    (["data", "generate", "mcqa", "--size", "3", "-o", P("g.jsonl"), "--option", "novalue"], {}, "novalue"),
    (["data", "generate", "mcqa", "--size", "3", "-o", P("g.jsonl"), "--option", "bogus_opt=1"], {}, "bogus_opt"),
    (["data", "generate", "mcqa", "--size", "3", "-o", "/nonexistent/dir/g.jsonl"], {}, "/nonexistent/dir"),
    (["data", "prepare", "/nonexistent/rows.jsonl"], {}, "/nonexistent/rows.jsonl"),
    (["data", "prepare", P("latin1.jsonl"), "-o", P("p.jsonl")], {}, "latin1.jsonl"),
    (["data", "blend", "-o", P("b.jsonl")], {}, "INPUTS"),
    (["data", "blend", "/nonexistent/a.jsonl", "-o", P("b.jsonl")], {}, "/nonexistent/a.jsonl"),
    (["train"], {}, "--config"),
    (["train", "--config", "/nonexistent/train.yaml"], {}, "/nonexistent/train.yaml"),
    (["train", "--config", P("adir")], {}, "adir"),
    (["train", "--config", P("train_missing.yaml")], {}, "model_name"),
    (["train", "--config", P("train_bad.yaml")], {}, "max_steps"),
    (["up"], {}, "config file"),
    (["--config", P("noup.yaml"), "up"], {}, "up:"),
    (["--config", P("badup.yaml"), "up"], {}, "processes"),
    (["completion", "powershell"], {}, "powershell"),
    (["dead", "list"], {}, "--agent"),
    (["dead", "list", "--agent", "noop", "--count", "0"], {}, "--count"),
    (["dead", "requeue", "--agent", "noop"], {}, "give the letter ids to requeue, or --all"),
    (["dead", "purge", "--agent", "noop", "1-0", "--all"], {}, "give the letter ids to purge, or --all"),
    (["dead", "show", "--agent", "noop", "1-0"], {}, "no dead letter '1-0' for agent 'noop'"),
    (["dead", "list", "--agent", "bad name"], {}, "agent name 'bad name'"),
]


def _run(argv: list[str], env: dict[str, str], redis_url: str, namespace: str, tmp: Path) -> tuple[int, str]:
    proc = _exec(argv, env, redis_url, namespace, tmp)
    return proc.returncode, proc.stdout + proc.stderr


def _exec(
    argv: list[str], env: dict[str, str], redis_url: str, namespace: str, tmp: Path
) -> subprocess.CompletedProcess:
    full = (
        ["--namespace", namespace] + [a.replace("{tmp}", str(tmp)) for a in argv]
        if "--namespace" not in argv
        else [a.replace("{tmp}", str(tmp)) for a in argv]
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "farm", *full],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "FARM_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT), **env},
    )
    return proc


def test_the_table_is_large_and_spans_every_subcommand():
    commands = {
        next(a for a in argv if not a.startswith("-") and "{tmp}" not in a and "/" not in a)
        for argv, _, _ in BAD
        if any(not a.startswith("-") for a in argv)
    }
    assert len(BAD) >= 60
    assert {
        "redis",
        "worker",
        "status",
        "policy",
        "demo",
        "collect",
        "data",
        "train",
        "up",
        "completion",
        "dead",
    } <= commands


@pytest.mark.parametrize("argv,env,expected", BAD, ids=[" ".join(a)[:60] for a, _, _ in BAD])
@pytest.mark.slow
def test_bad_invocation_ends_in_one_clear_line(argv, env, expected, files, redis_url, namespace, sync_redis):
    code, out = _run(argv, env, redis_url, namespace, files)
    assert code != 0, out
    assert "Traceback" not in out, out
    assert expected.replace("{tmp}", str(files)) in out, out
    errors = [line for line in out.splitlines() if line.startswith("farm")]
    assert len(errors) == 1, out
    assert not list(sync_redis.scan_iter(match=f"{namespace}:*")), "keys left behind"


@pytest.mark.slow
def test_debug_shows_the_traceback(files, redis_url, namespace):
    code, out = _run(["--debug", "--config", str(files / "bad.yaml"), "status"], {}, redis_url, namespace, files)
    assert code == 2 and "Traceback" in out and "not valid YAML" in out


# -- exit codes: bad input is a usage error (2), never a crash (1) -----------------------------


def _the_one_line(proc: subprocess.CompletedProcess) -> str:
    """stderr is exactly one line, `farm...: <what>`, with no traceback anywhere."""
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("farm"), proc.stderr
    return lines[0]


# (argv with {tmp}, a text the one line must hold): each exited 1, as a crash would, before.
USAGE = [
    (["data", "prepare", P("badrow.jsonl"), "-o", P("p.jsonl")], "line 1: `responses_create_params.input`"),
    (["data", "prepare", P("invalid.jsonl"), "-o", P("p.jsonl")], "invalid JSON"),
    (["data", "prepare", P("empty.jsonl"), "-o", P("p.jsonl")], "no rows"),
    (["data", "prepare", P("latin1.jsonl"), "-o", P("p.jsonl")], "not UTF-8"),
    (["data", "prepare", P("binary.bin"), "-o", P("p.jsonl")], "binary.bin"),
    (["data", "prepare", P("rows.jsonl"), "-o", "/nonexistent/dir/p.jsonl"], "/nonexistent/dir"),
    (["data", "prepare", P("rows.jsonl"), "-o", P("adir")], "is a directory"),
    (["data", "prepare", P("empty.jsonl"), "--replace-agent", "-o", P("p.jsonl")], "--agent"),
    (["data", "blend", P("rows.jsonl"), P("badrow.jsonl"), "-o", P("b.jsonl")], "line 1"),
    (["data", "blend", P("rows.jsonl"), P("invalid.jsonl"), "-o", P("b.jsonl")], "invalid JSON"),
    (["data", "blend", P("rows.jsonl"), P("empty.jsonl"), "-o", P("b.jsonl")], "no rows"),
    (["data", "blend", P("rows.jsonl"), P("latin1.jsonl"), "-o", P("b.jsonl")], "not UTF-8"),
    (["data", "blend", P("rows.jsonl"), P("binary.bin"), "-o", P("b.jsonl")], "binary.bin"),
    (["data", "blend", P("rows.jsonl"), "-o", "/nonexistent/dir/b.jsonl"], "/nonexistent/dir"),
    (["data", "blend", P("rows.jsonl"), "-o", P("adir")], "is a directory"),
    (["data", "generate", "mcqa", "--size", "3", "-o", "/nonexistent/dir/g.jsonl"], "/nonexistent/dir"),
    (["data", "generate", "mcqa", "--size", "3", "-o", P("adir")], "is a directory"),
]


@pytest.mark.parametrize("argv,expected", USAGE, ids=[" ".join(a)[:60] for a, _ in USAGE])
@pytest.mark.slow
def test_bad_data_input_exits_2_in_one_line(argv, expected, files, redis_url, namespace):
    """One `farm: ...` line, after (for `data prepare`) one line per invalid row naming its line."""
    proc = _exec(argv, {}, redis_url, namespace, files)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    *rows, last = proc.stderr.splitlines()
    assert last.startswith("farm") and all(re.search(r": line \d+: ", r) for r in rows), proc.stderr
    assert not rows or argv[:2] == ["data", "prepare"], proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert not list((files / "adir").iterdir()), "written into a directory given as the output"
    assert not [p.name for p in files.iterdir() if p.name.endswith(".tmp")], "a temporary file left behind"


# The same kinds of bad input to collect and eval, which already exited 2: kept that way. Skipped lines
# are reported one per line before the error, so only the last line is the error.
COLLECT = [
    (["--input", P("empty.jsonl")], "empty"),
    (["--input", P("latin1.jsonl")], "no valid row"),
    (["--input", P("binary.bin")], "no valid row"),
    (["--input", P("invalid.jsonl")], "no valid row"),
    (["--input", "/nonexistent/rows.jsonl"], "/nonexistent/rows.jsonl"),
    (["--input", P("adir")], "adir"),
    (["--input", P("rows.jsonl"), "--output", "/nonexistent/dir/o.jsonl"], "the directory /nonexistent/dir does not"),
    (["--input", P("rows.jsonl"), "--output", P("adir")], "adir"),
]


@pytest.mark.parametrize("command", ["collect", "eval"])
@pytest.mark.parametrize("args,expected", COLLECT, ids=[" ".join(a)[:50] for a, _ in COLLECT])
@pytest.mark.slow
def test_bad_input_to_collect_and_eval_exits_2(command, args, expected, files, redis_url, namespace, sync_redis):
    argv = [command, *args] + ([] if "--output" in args else ["--output", P("o.jsonl")])
    proc = _exec(argv, {}, redis_url, namespace, files)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("farm")]
    assert errors == proc.stderr.splitlines()[-1:] and expected in errors[0], proc.stderr
    assert not list(sync_redis.scan_iter(match=f"{namespace}:*")), "keys left behind"


@pytest.mark.parametrize("holder", ["a socket", "another Redis"])
@pytest.mark.slow
def test_redis_on_a_taken_port_exits_2_in_one_line(holder, tmp_path, redis_url, namespace):
    import socket
    from urllib.parse import urlparse

    with socket.socket() as sock:
        if holder == "a socket":
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            port = sock.getsockname()[1]
        else:
            url = urlparse(redis_url)
            if url.hostname not in ("127.0.0.1", "localhost"):
                pytest.skip(f"the test Redis is not on this machine: {url.hostname}")
            port = url.port or 6379
        proc = _exec(["redis", "--port", str(port), "--data-dir", str(tmp_path)], {}, redis_url, namespace, tmp_path)
    line = _the_one_line(proc)
    assert proc.returncode == 2, proc.stderr
    assert str(port) in line and "in use" in line and "--port" in line, line


@pytest.mark.slow
def test_dashboard_on_a_taken_port_exits_2_in_one_line_and_announces_nothing(tmp_path, redis_url, namespace):
    """It announced its URL, then printed uvicorn's errno and exited 3 ("Redis unavailable")."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = _exec(["--redis-url", redis_url, "dashboard", "--port", str(port)], {}, redis_url, namespace, tmp_path)
    line = _the_one_line(proc)
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout)
    assert f"127.0.0.1:{port}" in line and "--port" in line, line


UNKNOWN_AGENT = [
    ["data", "prepare", P("rows.jsonl"), "--agent", "no_such_agent", "-o", P("p.jsonl")],
    ["collect", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--agent", "no_such_agent"],
    ["eval", "--input", P("rows.jsonl"), "--output", P("o.jsonl"), "--agent", "no_such_agent"],
]


@pytest.mark.parametrize("argv", UNKNOWN_AGENT, ids=[" ".join(a[:2]) for a in UNKNOWN_AGENT])
@pytest.mark.slow
def test_an_unknown_agent_exits_5_in_every_command(argv, files, redis_url, namespace, sync_redis):
    proc = _exec(argv, {}, redis_url, namespace, files)
    line = _the_one_line(proc)
    assert proc.returncode == 5, proc.stderr  # EXIT_UNKNOWN_AGENT, as `farm worker` and `farm dead`
    assert "no_such_agent" in line and "noop" in line, line
    assert not list(sync_redis.scan_iter(match=f"{namespace}:*")), "keys left behind"


DEAD_UNKNOWN = [
    ["list"],
    ["list", "--json"],
    ["show", "1-0"],
    ["requeue", "--all"],
    ["purge", "--all"],
    ["requeue", "1-0"],
]


@pytest.mark.parametrize("args", DEAD_UNKNOWN, ids=[" ".join(a) for a in DEAD_UNKNOWN])
@pytest.mark.slow
def test_dead_names_the_known_agents_and_exits_5_for_an_unknown_one(args, files, redis_url, namespace, sync_redis):
    proc = _exec(["dead", args[0], "--agent", "no_such_agent", *args[1:]], {}, redis_url, namespace, files)
    line = _the_one_line(proc)
    assert proc.returncode == 5, proc.stderr  # EXIT_UNKNOWN_AGENT, as `farm worker --agent no_such_agent`
    assert "unknown agent 'no_such_agent'" in line and "noop" in line, line
    assert proc.stdout == ""
    assert not list(sync_redis.scan_iter(match=f"{namespace}:*")), "keys left behind"


@pytest.mark.slow
def test_dead_reads_an_agent_the_namespace_knows_though_nothing_defines_it_here(
    files, redis_url, namespace, sync_redis
):
    """A stream served by `farm worker --agent weather --impl ...` on another host: known to Redis, not here."""
    sync_redis.sadd(f"{namespace}:agents", "weather")
    sync_redis.xadd(f"{namespace}:dead:orphan", {"kind": "malformed", "reason": "bad entry", "attempts": "0"})
    for agent, letters in (("weather", 0), ("orphan", 1)):
        proc = _exec(["dead", "list", "--agent", agent, "--json"], {}, redis_url, namespace, files)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stdout.splitlines()) == letters, proc.stdout
    proc = _exec(["dead", "purge", "--agent", "orphan", "--all"], {}, redis_url, namespace, files)
    assert proc.returncode == 0 and "purged 1 dead letter(s) for 'orphan'" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_version_and_help_with_examples():
    out = subprocess.run([sys.executable, "-m", "farm", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and re.search(r"farm, version \d", out.stdout)
    for cmd in (["collect"], ["worker"], ["status"], ["up"], ["data", "generate"], ["train"], ["policy", "serve"]):
        out = subprocess.run([sys.executable, "-m", "farm", *cmd, "--help"], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0 and "Example" in out.stdout, cmd
    out = subprocess.run([sys.executable, "-m", "farm", "completion", "bash"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "_FARM_COMPLETE" in out.stdout


@pytest.mark.slow
def test_status_names_its_redis_and_namespace_and_prints_zeros(settings, redis_url, namespace):
    import asyncio

    from farm.client import FarmClient

    async def submit():
        client = FarmClient(settings)
        await client.submit([client.task(run_id="z", agent="noop", row={})])
        await client.aclose()

    asyncio.run(submit())
    out = subprocess.run(
        [sys.executable, "-m", "farm", "status"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=worker_env(settings),
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert f"namespace {namespace!r}" in out.stdout and redis_url.split("@")[-1] in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("noop"))
    assert row.split()[1:6] == ["1", "0", "1", "0", "0"], row  # queued, pending, lag, delayed, dead


def test_data_generate_honours_environment_options(tmp_path):
    out = tmp_path / "rg.jsonl"
    code = main(["data", "generate", "reasoning_gym", "--size", "4", "-o", str(out), "--option", 'task="leg_counting"'])
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["metadata"]["source_dataset"] if "metadata" in r else r.get("task") for r in rows} != {"mini_sudoku"}
    assert "leg_counting" in out.read_text() and "mini_sudoku" not in out.read_text()


def test_train_takes_the_reference_config_and_passes_trl_keys_through(tmp_path, monkeypatch):
    """The reference keys of TRL's NeMo Gym example load as they are; a GRPOConfig key the farm does not
    know goes to TRL. run_train is replaced: this checks the parsing, the trainer tests train."""
    import trainer.train as train_mod
    from trainer import preflight

    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        'model_name: "Qwen/Qwen2.5-1.5B-Instruct"\ndataset_path: "/path/train_mini_sudoku.jsonl"\n'
        'eval_dataset_path: "/path/val.jsonl"\ntask: "mini-sudoku"\noutput_dir: "outputs/x"\n'
        "learning_rate: 1.0e-5\nnum_generations: 16\nper_device_train_batch_size: 8\n"
        "gradient_accumulation_steps: 1\nmax_completion_length: 10000\n"
        "vllm_importance_sampling_correction: true\ntemperature: 1.0\ntop_p: 0.999\nmax_grad_norm: 0.5\n"
    )
    seen = {}
    monkeypatch.setattr(train_mod, "run_train", lambda settings, c: seen.update(settings=settings, cfg=c) or {"ok": 1})
    monkeypatch.setattr(preflight, "check", lambda settings, c: [])  # no farm here: the parsing only
    assert main(["train", "--config", str(cfg)]) == 0
    assert seen["cfg"].dataset_path == "/path/train_mini_sudoku.jsonl" and seen["cfg"].trl == {"max_grad_norm": 0.5}
    from trainer.config import grpo_args

    args = grpo_args(seen["cfg"], use_cpu=True, per_device_train_batch_size=16)  # TRL checks the batch shape
    assert args.max_grad_norm == 0.5
    from farm.errors import ConfigError

    seen["cfg"].trl["no_such_trl_key"] = 1
    with pytest.raises(ConfigError, match="no_such_trl_key"):
        grpo_args(seen["cfg"], use_cpu=True, per_device_train_batch_size=16)


@pytest.mark.slow
def test_collect_says_when_an_agent_has_no_worker_and_gives_up(files, settings):
    env = worker_env(settings, FARM_NO_WORKERS_TIMEOUT_S="3")
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "farm",
            "collect",
            "--input",
            str(files / "rows.jsonl"),
            "--output",
            str(files / "o.jsonl"),
            "--no-progress",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and time.monotonic() - t0 < 30
    assert "no live worker for agent 'noop'" in proc.stderr and "farm worker --agent noop" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- terminals -----------------------------------------------------------------------------


def _pty_run(cmd: list[str], env: dict, seconds: float, interrupt_after: float | None = None) -> str:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**env, "COLUMNS": "80", "LINES": "24", "TERM": "xterm"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    sent = False
    while time.monotonic() < deadline:
        if interrupt_after is not None and not sent and time.monotonic() - started > interrupt_after:
            proc.send_signal(signal.SIGINT)
            sent = True
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    os.close(master)
    return out.decode("utf-8", "replace")


def _lines(text: str) -> list[str]:
    """What the terminal showed, line by line: a carriage return starts the line over (a redraw)."""
    return [ANSI.sub("", line) for line in re.split(r"\r\n|\n|\r", text)]


@pytest.mark.slow
def test_collect_under_an_80_column_terminal_fits_and_shows_progress(files, settings):
    rows = files / "slow.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {"responses_create_params": {"input": f"q{i}"}, "agent_ref": {"name": "noop"}, "noop": {"sleep_s": 0.2}}
            )
            + "\n"
            for i in range(40)
        )
    )
    worker = spawn_worker(settings, "--agent", "noop", "--concurrency", "4")
    try:
        out = _pty_run(
            [sys.executable, "-m", "farm", "collect", "--input", str(rows), "--output", str(files / "tty.jsonl")],
            worker_env(settings),
            60,
        )
    finally:
        stop(worker)
    lines = [line for line in _lines(out) if " farm." not in line]  # the bar and the table, not log records
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert any("noop" in line and "/40" in line for line in lines), out[-2000:]  # the bar
    assert any("pass@k" in line for line in lines)  # the table


@pytest.mark.slow
def test_collect_in_a_pipe_prints_progress_lines_as_it_goes(files, settings):
    rows = files / "slow.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {"responses_create_params": {"input": f"q{i}"}, "agent_ref": {"name": "noop"}, "noop": {"sleep_s": 0.5}}
            )
            + "\n"
            for i in range(24)
        )
    )
    worker = spawn_worker(settings, "--agent", "noop", "--concurrency", "4")
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "farm",
                "collect",
                "--input",
                str(rows),
                "--output",
                str(files / "pipe.jsonl"),
                "--progress-every",
                "1",
            ],
            cwd=ROOT,
            env=worker_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stamped = []
        for line in proc.stdout:
            stamped.append((time.monotonic(), line.rstrip("\n")))
        proc.wait(60)
    finally:
        stop(worker)
    assert proc.returncode == 0
    progress = [(t, line) for t, line in stamped if line.startswith("progress noop")]
    assert len(progress) >= 2 and progress[-1][0] - progress[0][0] >= 1.0, (
        stamped
    )  # during the run, not only at the end
    assert "24/24" in progress[-1][1].replace(" ", "") or "24/24" in progress[-1][1]
    shown = [line for _, line in stamped if " farm." not in line]  # progress and the table, not log records
    assert all(len(line) <= 80 for line in shown), max(shown, key=len)


@pytest.mark.slow
def test_status_watch_under_an_80_column_terminal_and_in_a_pipe(settings, namespace):
    env = worker_env(settings)
    worker = spawn_worker(settings, "--agent", "noop", "--concurrency", "2")
    try:
        wait_for(
            lambda: (
                "noop"
                in subprocess.run(
                    [sys.executable, "-m", "farm", "status"], cwd=ROOT, env=env, capture_output=True, text=True
                ).stdout
            ),
            what="a live worker",
        )
        out = _pty_run([sys.executable, "-m", "farm", "status", "--watch", "0.5"], env, 10, interrupt_after=2.5)
        lines = _lines(out)
        assert max(len(line) for line in lines) <= 80, max(lines, key=len)
        assert sum("workers alive: 1" in line for line in lines) >= 2, out[-2000:]  # it refreshed
        assert any(f"namespace {namespace!r}" in line for line in lines)
        piped = subprocess.Popen(
            [sys.executable, "-m", "farm", "status", "--watch", "0.5"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Started with SIGINT ignored, as a shell starts a background job (and as a suite run
            # in the background started it): Ctrl-C still ends the watch (it hung before).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        time.sleep(2.5)
        piped.send_signal(signal.SIGINT)
        text, _ = piped.communicate(timeout=20)
        assert piped.returncode == 0 and text.count("workers alive: 1") >= 2, text
        assert all(len(line) <= 80 for line in text.splitlines())
    finally:
        stop(worker)


# -- farm up -------------------------------------------------------------------------------


def _overview(port: int):
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


@pytest.mark.slow
def test_farm_up_starts_the_config_and_ctrl_c_stops_it_all(settings, namespace, tmp_path):
    import asyncio

    from farm.client import FarmClient

    env = worker_env(settings, FARM_DATA_DIR=str(tmp_path / "data"))
    port = free_port()
    config = tmp_path / "up.yaml"  # the shipped noop farm, plus its dashboard
    config.write_text((ROOT / "configs" / "farm_up_noop.yaml").read_text() + f"  dashboard: {{port: {port}}}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "farm", "--config", str(config), "up"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "Ctrl-C stops everything" in line:
                break
        assert any("noop: 2 process(es)" in line for line in seen), seen

        async def batch():
            client = FarmClient(settings)
            tasks = [client.task(run_id="up", agent="noop", row={}) for _ in range(50)]
            got = await client.run_batch(tasks, timeout_s=60)
            await client.aclose()
            return got

        got = asyncio.run(batch())
        assert len(got) == 50 and all(r.ok for r in got.values())
        assert any(f"dashboard http://127.0.0.1:{port}/" in line for line in seen), seen
        view = wait_for(  # the workers write their history counts within a second of settling
            lambda: (v := _overview(port)) and v["agents"]["noop"]["rollouts"] == 50 and v,
            timeout=30,
            what="the dashboard farm up started to show the batch",
        )
        assert view["agents"]["noop"]["done_per_min"] > 0 and view["agents"]["noop"]["live_workers"] == 2
        children = [p for p in processes_of(namespace) if p != proc.pid]
        assert len(children) >= 3  # the pool supervisor and its two workers
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    wait_for(lambda: not processes_of(namespace), timeout=10, what="every process of the farm gone")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _redis_child(pid: int):
    for c in _children(pid):
        try:
            if b"redis-server" in Path(f"/proc/{c}/cmdline").read_bytes():
                return c
        except OSError:
            pass
    return None


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment",
    ["the commands load", "the agent loads", "the embedded Redis starts"],
)
def test_ctrl_c_while_a_command_starts_says_so_in_one_line_and_exits_130(tmp_path, moment):
    """`farm worker` with an embedded Redis, interrupted as a terminal's Ctrl-C does (SIGINT to its
    process group) at a known moment of its start: `-X importtime` says which modules have loaded,
    /proc when the redis-server child is up. Each time: `farm: interrupted`, exit 130, no traceback,
    and no redis-server left behind (it runs in a session of its own, out of the terminal's reach)."""
    import threading

    env = {k: v for k, v in os.environ.items() if k not in ("FARM_REDIS_URL", "FARM_CONFIG")}
    env.update(HOME=str(tmp_path), FARM_EMBEDDED_PORT=str(free_port()), FARM_NAMESPACE=f"int{os.getpid()}")
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "farm", "worker", "--agent", "noop"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # A terminal's Ctrl-C: Python turns SIGINT into KeyboardInterrupt only when it did not start
        # with SIGINT ignored, as it is under a job started in the background by a non-interactive shell.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    loaded = lambda module: any(ln.startswith("import time:") and ln.split("|")[-1].strip() == module for ln in lines)  # noqa: E731
    redis_pid = None
    try:
        if moment == "the commands load":
            wait_for(lambda: loaded("click"), timeout=30, every=0.001, what="click imported")
        elif moment == "the agent loads":
            wait_for(lambda: loaded("workers.loops.agent"), timeout=30, every=0.001, what="the agent module")
        else:
            redis_pid = wait_for(lambda: _redis_child(proc.pid), timeout=30, every=0.001, what="redis-server")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130, "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    said = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("import time:")]
    assert not any("Traceback" in ln for ln in said) and said[-1:] == ["farm: interrupted"], said
    assert all("INFO" in ln for ln in said[:-1]), said  # log lines of the start, nothing else
    if redis_pid is not None:
        try:
            wait_for(lambda: not Path(f"/proc/{redis_pid}").exists(), timeout=10, what="the embedded redis-server gone")
        finally:
            if Path(f"/proc/{redis_pid}").exists():
                os.kill(redis_pid, signal.SIGKILL)
