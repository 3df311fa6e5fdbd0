"""A command agent inside its rollout's sandbox (`command_in_sandbox`): its only way out is the gateway.

The worker runs examples/harnesses/terminal_agent inside each Harbor rollout's sandbox, on both
backends; its model is a workers/policy/stub process scripted to answer with one `bash` call that
solves the suite's tier-1 `create-file` task and probes the network, then a final answer. Checked:
create-file earns 1 and, as the negative control, make-directory (which the same command does not
solve) earns 0; each trace holds the stub's own ids (0 re-tokenized); inside, the agent reached
the gateway while 1.1.1.1, the host's address and the 127.0.0.1 port where the test's Redis
answers on the host were all out of reach; no sandbox is left. Also: the config checks, the
gateway's Unix socket, and a worker refusing command_in_sandbox for an environment without
sandboxes in one line, exit 2.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
from urllib.parse import urlparse

import msgspec
import pytest
import yaml
from helpers import ROOT
from helpers.harbor import sandboxes_left
from helpers.policies import stub_processes
from helpers.processes import stop
from helpers.workers import run_through_worker, spawn_worker

from envs.harbor.rows import task_row
from envs.harbor.task import SUITE_DIR, load_task
from farm.agent_config import AgentConfig
from farm.schema import Status
from workers.gateway.server import SOCKET_NAME, Gateway
from workers.policy.stub import Script
from workers.supervise.stack import policy_env

AGENT = "terminal"
ANSWER = "Done: the file is there."


def probe_command(redis_port: int, host_ip: str) -> str:
    """Solves create-file; then tries three ways out and the gateway, one line each."""
    targets = " ".join(f"{h}/{p}" for h, p in (("1.1.1.1", 80), ("127.0.0.1", redis_port), (host_ip, redis_port)))
    return (
        'echo "hello world" > /app/hello.txt; '
        f'for t in {targets}; do timeout 5 bash -c "exec 3<>/dev/tcp/$t" 2>/dev/null '
        '&& echo "reached $t" || echo "blocked $t"; done; '
        "python3 -c 'import os, urllib.request as u; "
        'print("gateway", u.urlopen(os.environ["OPENAI_BASE_URL"] + "/models").status)\''
    )


def host_ip() -> str:
    """The host's own non-loopback address (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            return s.getsockname()[0]
        except OSError:
            return "172.17.0.1"


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.fixture
def agents_config(tmp_path) -> str:
    path = tmp_path / "workers.yaml"
    agents = {
        AGENT: {
            "env": "harbor",
            "command": ["python3", "/opt/agent/agent.py"],
            "command_in_sandbox": True,
            "command_upload": "examples/harnesses/terminal_agent",
        },
        "misplaced": {"env": "single_tool_call", "command": ["true"], "command_in_sandbox": True},
    }
    path.write_text(yaml.safe_dump({"agents": agents}))
    return str(path)


def test_command_in_sandbox_and_command_upload_need_a_command():
    with pytest.raises(msgspec.ValidationError, match="go with `command`"):
        msgspec.convert({"env": "harbor", "command_in_sandbox": True}, AgentConfig)
    with pytest.raises(msgspec.ValidationError, match="set command_in_sandbox"):
        msgspec.convert({"env": "harbor", "command": ["x"], "command_upload": "d"}, AgentConfig)
    cfg = msgspec.convert({"env": "harbor", "command": ["x"], "command_in_sandbox": True}, AgentConfig)
    assert cfg.command_in_sandbox and cfg.command_upload is None


@pytest.mark.slow
async def test_the_gateway_serves_on_a_unix_socket_it_removes_at_close():
    """The socket a sandbox gets: reachable by any user (the secret guards every route), gone at close."""
    import aiohttp

    gateway = await Gateway(client=None, tok=None).start()  # type: ignore[arg-type]  # no model call is made
    try:
        directory = await gateway.listen_unix()
        assert await gateway.listen_unix() == directory  # once per process
        path = directory / SOCKET_NAME
        assert stat.S_IMODE(directory.stat().st_mode) == 0o711 and stat.S_IMODE(path.stat().st_mode) == 0o666
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as http:
            async with http.get("http://gateway/v1/models") as answer:
                assert answer.status == 401 and "unknown or missing API key" in await answer.text()
    finally:
        await gateway.aclose()
    assert not directory.exists()


@pytest.mark.slow
def test_command_in_sandbox_without_sandboxes_is_one_line_at_start_exit_2(settings, agents_config, model_dir):
    env = policy_env("http://127.0.0.1:9/v1", "stub", model_dir)
    proc = spawn_worker(settings, "--agent", "misplaced", FARM_CONFIG=agents_config, **env)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise AssertionError("the worker did not refuse the agent at start") from None
    assert proc.returncode == 2, out
    assert "command_in_sandbox needs an environment that runs in sandboxes" in out and "Traceback" not in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_agent_in_the_sandbox_solves_its_task_through_the_gateway_alone(
    settings, backend, agents_config, model_dir, tokenizer, tmp_path
):
    redis_port = urlparse(settings.redis_url).port or 6379
    assert reachable("127.0.0.1", redis_port)  # on the host the probed port answers: the probe can succeed
    call = json.dumps({"name": "bash", "arguments": {"command": probe_command(redis_port, host_ip())}})
    sampled = [tokenizer.encode(f"<tool_call>\n{call}\n</tool_call>") + [tokenizer.eos_id]]
    sampled.append(tokenizer.encode(ANSWER) + [tokenizer.eos_id])
    script = Script(token_replies=sampled, model="stub", max_model_len=4096)
    rows = [task_row(load_task(SUITE_DIR / "tier1" / name), AGENT) for name in ("create-file", "make-directory")]
    with stub_processes(script, tmp_path, latency_s=0.01) as start:
        stub = start()
        got = run_through_worker(
            settings, stub, model_dir, AGENT, rows, FARM_CONFIG=agents_config, FARM_SANDBOX_BACKEND=backend
        )
    assert [(r.status, r.reward) for r in got] == [(Status.ok, 1.0), (Status.ok, 0.0)], [r.error for r in got]
    for r in got:
        assert r.metrics["turns"] == 2 and r.metrics["retokenized_tokens"] == 0
        ids, mask = r.trace.completion(), r.trace.mask()
        assert [i for i, m in zip(ids, mask) if m] == sampled[0] + sampled[1]  # the stub's ids, as sampled
        inserted = tokenizer.decode([i for i, m in zip(ids, mask) if not m])  # the tool result the agent sent
        assert "gateway 200" in inserted, inserted
        assert "reached" not in inserted and inserted.count("blocked") == 3, inserted
    assert sandboxes_left(backend, settings.namespace) == []


def test_the_example_agent_is_standard_library_only():
    """It runs in sandboxes where nothing can be installed."""
    import ast
    import sys

    source = (ROOT / "examples" / "harnesses" / "terminal_agent" / "agent.py").read_text()
    names = {
        n.names[0].name.split(".")[0] if isinstance(n, ast.Import) else (n.module or "").split(".")[0]
        for n in ast.walk(ast.parse(source))
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_agent_past_its_time_is_killed_and_graded_on_what_it_did(
    settings, backend, agents_config, model_dir, tokenizer, tmp_path
):
    """The agent's command sleeps past the task's 3 s agent timeout: the exec kills it and all it
    started, and the tests grade what it left (the file it wrote first): 1, with `agent_timeout`."""
    from test_harbor_farm import make_task

    call = json.dumps({"name": "bash", "arguments": {"command": "touch /app/done; sleep 100"}})
    replies = [tokenizer.encode(f"<tool_call>\n{call}\n</tool_call>") + [tokenizer.eos_id]]
    script = Script(token_replies=replies, model="stub", max_model_len=4096)
    rows = [task_row(load_task(make_task(tmp_path / "suite", "slow-agent", "true\n", agent=3)), AGENT)]
    with stub_processes(script, tmp_path, latency_s=0.01) as start:
        got = run_through_worker(
            settings, start(), model_dir, AGENT, rows, FARM_CONFIG=agents_config, FARM_SANDBOX_BACKEND=backend
        )
    (r,) = got
    assert (r.status, r.reward) == (Status.ok, 1.0), r.error
    assert r.metrics["agent_timeout"] is True and r.metrics["harness_s"] < 30
    assert sandboxes_left(backend, settings.namespace) == []
