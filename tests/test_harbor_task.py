"""Harbor task directories read natively (envs/harbor/task.py), the project's suite, and its rows.

The suite runs for real (nop 0, solution 1) in tests/test_harbor_farm.py and is read by Harbor's
own parser in tests/test_harbor_parser.py; here it is checked as files: every task loads, with
the tiers, limits and Dockerfile subset the farm's backends need. Broken tasks are made in tmp_path.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from envs.data import check_row
from envs.harbor.rows import HarborRow, suite_rows
from envs.harbor.task import (
    SUITE_DIR,
    SuiteError,
    TaskError,
    content_id,
    load_suite,
    load_task,
    parse_config,
    scan_suite,
)
from envs.sdk import parse_row
from farm.cli import main

DOCKERFILE_SUBSET = {"FROM", "RUN", "COPY", "WORKDIR", "ENV"}  # what the local backend runs
TIERS = {"tier1": "easy", "tier2": "medium", "tier3": "hard"}


def make_task(root: Path, toml: str = "", *, skip: tuple[str, ...] = ()) -> Path:
    files = {
        "task.toml": toml,
        "instruction.md": "Create /app/x.\n",
        "tests/test.sh": "#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n",
        "environment/Dockerfile": "FROM rollout-farm/base:bookworm\n",
        "solution/solve.sh": "#!/bin/bash\ntouch /app/x\n",
    }
    for rel, text in files.items():
        if rel not in skip:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    return root


# -- the project's suite ----------------------------------------------------------------------
def test_the_suite_has_at_least_24_tasks_in_three_tiers():
    tasks = load_suite()
    assert len(tasks) >= 24
    tiers = Counter(t.tier for t in tasks)
    assert set(tiers) == set(TIERS) and min(tiers.values()) >= 8, tiers
    assert [(t.tier, t.name) for t in tasks] == sorted((t.tier, t.name) for t in tasks)
    assert len({t.name for t in tasks}) == len({t.content_id for t in tasks}) == len(tasks)


@pytest.mark.parametrize("task", load_suite(), ids=lambda t: f"{t.tier}/{t.name}")
def test_every_suite_task_fits_the_farm(task):
    config = task.config
    assert config.schema_version == "1.4"
    assert config.metadata.difficulty == TIERS[task.tier] and task.tier in config.metadata.tags
    assert 120 <= config.agent.timeout_sec <= 300 and 30 <= config.verifier.timeout_sec <= 60
    env = config.environment
    assert (env.cpus, env.network_mode, env.workdir) == (1, "no-network", "/app")
    assert 512 <= env.memory_mb <= 1024 and not env.allows_internet
    lines = [ln for ln in task.dockerfile.read_text().splitlines() if ln.strip() and not ln.startswith((" ", "#"))]
    assert lines[0] == "FROM rollout-farm/base:bookworm"
    assert {ln.split()[0] for ln in lines} <= DOCKERFILE_SUBSET
    assert "apt" not in task.dockerfile.read_text() and "pip" not in task.dockerfile.read_text()
    test = task.test_script.read_text()
    assert test.startswith("#!/bin/bash") and "mkdir -p /logs/verifier" in test and "/logs/verifier/reward." in test
    assert task.solve_script is not None and task.instruction.strip()


# -- task.toml -------------------------------------------------------------------------------
def test_defaults_are_harbors():
    config = parse_config("")
    assert config.schema_version == "1.4"
    assert (config.verifier.timeout_sec, config.agent.timeout_sec) == (600.0, None)
    env = config.environment
    assert (env.build_timeout_sec, env.cpus, env.memory_mb, env.storage_mb) == (600.0, None, None, None)
    assert (env.network_mode, env.workdir, env.docker_image, env.os) == ("public", None, None, "linux")


def test_older_spellings_are_read_as_harbor_reads_them():
    config = parse_config(
        'version = "1.0"\n[metadata]\nauthor_name = "a"\nexpert_time_estimate_min = 5\nowner = "x"\n'
        '[environment]\nmemory = "2G"\nstorage = "512M"\nallow_internet = false\ncpus = 2\n'
    )
    assert config.schema_version == "1.0"
    env = config.environment
    assert (env.memory_mb, env.storage_mb, env.network_mode, env.cpus) == (2048, 512, "no-network", 2)
    assert config.metadata.author_name == "a" and config.metadata.extra == {"owner": "x"}
    explicit = parse_config('[environment]\nallow_internet = false\nnetwork_mode = "public"\n')
    assert explicit.environment.network_mode == "public"


@pytest.mark.parametrize(
    "toml, key, problem",
    [
        ("[environment]\ncpu = 1\n", "environment.cpu", "unknown key"),
        ("colour = 1\n", "colour", "unknown key"),
        ("[agent]\ntimeout_sec = -5\n", "agent.timeout_sec", "> 0.0, got -5"),
        ("[verifier]\ntimeout_sec = 0\n", "verifier.timeout_sec", "> 0.0"),
        ('[verifier]\ntimeout_sec = "60"\n', "verifier.timeout_sec", "expected float, got str"),
        ("[environment]\nmemory_mb = 1.5\n", "environment.memory_mb", "got float"),
        ("[environment]\ncpus = true\n", "environment.cpus", "got bool"),
        ('[environment]\nnetwork_mode = "none"\n', "environment.network_mode", "'none'"),
        ('[environment]\nmemory = "lots"\n', "environment.memory", "a size such as"),
        ('[environment]\nmemory = "1G"\nmemory_mb = 512\n', "environment.memory", "1024 MB"),
        ('[environment]\nworkdir = "app"\n', "environment.workdir", "absolute"),
        ('[environment]\nhealthcheck = {command = "true"}\n', "environment.healthcheck", "does not support"),
        ('[[steps]]\nname = "a"\n', "steps", "does not support"),
        ('[task]\ndescription = "d"\n', "task.name", "required key missing"),
        ("[agent\n", "not valid TOML", ""),
    ],
)
def test_a_bad_task_toml_is_one_line_naming_the_file_and_the_key(tmp_path, toml, key, problem):
    task = make_task(tmp_path / "t", toml)
    with pytest.raises(TaskError) as caught:
        load_task(task)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(task))
    assert "task.toml" in message and f": {key}" in message and problem in message, message


@pytest.mark.parametrize("missing", ["instruction.md", "tests/test.sh", "environment/Dockerfile", "task.toml"])
def test_a_missing_file_is_named(tmp_path, missing):
    task = make_task(tmp_path / "t", skip=(missing,))
    with pytest.raises(TaskError, match=f"^{task}: missing {missing}$"):
        load_task(task)


def test_a_docker_image_stands_in_for_the_dockerfile_and_solution_is_optional(tmp_path):
    toml = '[environment]\ndocker_image = "rollout-farm/base:bookworm"\n'
    task = load_task(make_task(tmp_path / "t", toml, skip=("environment/Dockerfile", "solution/solve.sh")))
    assert task.dockerfile is None and task.solve_script is None
    assert task.config.environment.docker_image == "rollout-farm/base:bookworm"


def test_a_task_reads_its_instruction_name_and_paths(tmp_path):
    root = make_task(tmp_path / "hello", '[task]\nname = "farm/hello"\n[metadata]\ndifficulty = "easy"\n')
    (root / "instruction.md").write_text("<!-- canary GUID 123 -->\n\nSay hi.\n")
    task = load_task(root)
    assert (task.name, task.tier, task.instruction) == ("farm/hello", "easy", "Say hi.\n")
    assert task.path == root.resolve() and task.test_script == root.resolve() / "tests/test.sh"
    assert task.solve_script == root.resolve() / "solution/solve.sh"


def test_the_content_id_follows_every_file(tmp_path):
    root = tmp_path / "t"
    shutil.copytree(SUITE_DIR / "tier1" / "count-lines", root)
    before = content_id(root)
    assert before == load_task(SUITE_DIR / "tier1" / "count-lines").content_id
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"x")
    assert content_id(root) == before
    (root / "environment" / "app" / "data.txt").write_text("1\n")
    changed = content_id(root)
    assert changed != before
    (root / "solution" / "solve.sh").chmod(0o644)
    assert content_id(root) != changed


# -- suites ----------------------------------------------------------------------------------
def test_a_suite_reports_every_broken_task_with_its_path(tmp_path):
    suite = tmp_path / "suite"
    make_task(suite / "tier1" / "good")
    make_task(suite / "tier1" / "no-tests", skip=("tests/test.sh",))
    make_task(suite / "tier2" / "bad-key", "[agent]\ntimeout = 3\n")
    make_task(suite / "tier2" / "negative", "[verifier]\ntimeout_sec = -1\n")
    make_task(suite / "tier2" / "fine")
    tasks, errors = scan_suite(suite)
    assert [(t.tier, t.name) for t in tasks] == [("tier1", "good"), ("tier2", "fine")]
    assert sorted(e.path.name for e in errors) == ["no-tests", "task.toml", "task.toml"]
    with pytest.raises(SuiteError) as caught:
        load_suite(suite)
    assert str(caught.value) == f"{suite}: 3 broken tasks" and len(caught.value.errors) == 3


def test_a_flat_suite_a_single_task_and_duplicate_names(tmp_path):
    make_task(tmp_path / "flat" / "a", '[metadata]\ndifficulty = "hard"\n')
    make_task(tmp_path / "flat" / "b")
    assert [(t.name, t.tier) for t in load_suite(tmp_path / "flat")] == [("b", ""), ("a", "hard")]
    assert [t.name for t in load_suite(tmp_path / "flat" / "a")] == ["a"]
    make_task(tmp_path / "dup" / "x" / "same", '[task]\nname = "org/same"\n')
    make_task(tmp_path / "dup" / "y" / "other", '[task]\nname = "org/same"\n')
    with pytest.raises(SuiteError, match="1 broken task$"):
        load_suite(tmp_path / "dup")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SuiteError):
        load_suite(tmp_path / "empty")


# -- rows ------------------------------------------------------------------------------------
def test_the_suite_makes_one_valid_row_per_task():
    rows = suite_rows()
    tasks = load_suite()
    assert len(rows) == len(tasks)
    for row, task in zip(rows, tasks):
        assert check_row(row) == []
        parsed = parse_row(row, HarborRow)
        assert (parsed.task_dir, parsed.task_name, parsed.tier) == (str(task.path), task.name, task.tier)
        system, user = row["responses_create_params"]["input"]
        assert system["role"] == "system" and "bash" in system["content"] and "/app" in system["content"]
        assert user == {"role": "user", "content": task.instruction}
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "harbor"}
    picked = suite_rows(agent="harbor_oracle", size=5, seed=1)
    assert len(picked) == 5 and {r["agent_ref"]["name"] for r in picked} == {"harbor_oracle"}
    assert picked == suite_rows(agent="harbor_oracle", size=5, seed=1)


def test_farm_data_generate_harbor_writes_a_row_per_task(tmp_path, capsys):
    suite = tmp_path / "suite"
    make_task(suite / "one")
    make_task(suite / "two")
    out = tmp_path / "rows.jsonl"
    assert main(["data", "generate", "harbor", "--tasks", str(suite), "-o", str(out), "--agent", "harbor_nop"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_name"] for r in rows] == ["one", "two"]
    assert {r["agent_ref"]["name"] for r in rows} == {"harbor_nop"}
    assert "generated 2 rows" in capsys.readouterr().err


def test_farm_data_generate_harbor_names_each_broken_task_and_exits_2(tmp_path, capsys):
    suite = tmp_path / "suite"
    make_task(suite / "good")
    make_task(suite / "no-instruction", skip=("instruction.md",))
    make_task(suite / "bad-value", '[environment]\ncpus = "two"\n')
    out = tmp_path / "rows.jsonl"
    assert main(["data", "generate", "harbor", "--tasks", str(suite), "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{suite / 'bad-value' / 'task.toml'}: environment.cpus: expected float, got str",
        f"{suite / 'no-instruction'}: missing instruction.md",
        f"farm: {suite}: 2 broken tasks; nothing written",
    ]
    assert not out.exists()
    assert main(["data", "generate", "mcqa", "--tasks", str(suite), "-o", str(out)]) == 2
    assert main(["data", "generate", "mcqa", "-o", str(out)]) == 2
    assert "--size" in capsys.readouterr().err
