"""The docker sandbox backend (envs/boxes/docker.py) against a real daemon and the farm's base image.

What a user relies on: the limits and labels are on the container (as `docker inspect` shows
them); an exec's timeout ends what the command started inside, not only the client; kill_all and
close leave nothing running; a lifetime ends a sandbox nobody closes; one sandbox's fork bomb or
OOM does not touch another; a broken Dockerfile, an absent image and an absent daemon are one line.
A process that keeps writing a file is the probe: it stops changing once its writer is dead, and
each kill test first shows the file changing (the negative control).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from helpers.docker import containers_of, docker, inspect, need_base_image, new_namespace, remove_namespace

from envs.boxes.aliases import DEFAULT_ALIASES, load_aliases, map_base
from envs.boxes.docker import DockerBackend
from envs.boxes.docker_build import rewrite_from
from envs.sdk.sandbox import (
    LABEL_EXPIRES,
    LABEL_NAMESPACE,
    LABEL_TASK,
    LABEL_WORKER,
    ImageSpec,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailable,
)

BASE = "rollout-farm/base:bookworm"
WRITER = "while :; do date +%s%N > {f}; sleep 0.05; done"


@pytest.fixture
async def backend():
    need_base_image()
    namespace = new_namespace()
    b = DockerBackend(namespace=namespace, worker="test-worker")
    yield b
    await b.aclose()
    remove_namespace(namespace)


def spec(**kw) -> SandboxSpec:
    return SandboxSpec(**{"image": BASE, "lifetime_s": 120, **kw})


async def changing(box, path: str, within_s: float = 10.0) -> bool:
    """Whether the file's content changes within within_s (a live writer); it must exist.

    Polled, so a live writer answers as soon as it writes (on a loaded machine its 0.05 s sleep can
    take a second); a dead one is read for the whole window: the negative checks pass a short one.
    """
    r = await box.exec(f"for i in $(seq 100); do [ -e {path} ] && exit 0; sleep 0.05; done; exit 1", timeout_s=10)
    assert r.ok, f"{path} was never written"
    first = await box.read_file(path)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if await box.read_file(path) != first:
            return True
    return False


async def processes(box) -> list[str]:
    """The sandbox's processes other than PID 1, the lifetime sleep and the `ps` itself."""
    r = await box.exec(["ps", "-eo", "pid=,args="], timeout_s=10)
    rows = [line.split(None, 1) for line in r.stdout.strip().splitlines()]
    return [
        args for pid, args in rows if pid != "1" and not args.startswith("sleep 120") and not args.startswith("ps ")
    ]


@pytest.mark.slow
async def test_labels_and_limits_are_on_the_container(backend):
    labels = {LABEL_NAMESPACE: backend.namespace, LABEL_TASK: "task-7", "extra": "x"}
    box = await backend.start(spec(cpus=0.5, memory_mb=256, pids=64, lifetime_s=90, labels=labels))
    c = inspect(box.id)
    host, config = c["HostConfig"], c["Config"]
    assert config["Labels"][LABEL_NAMESPACE] == backend.namespace
    assert config["Labels"][LABEL_WORKER] == "test-worker"
    assert config["Labels"][LABEL_TASK] == "task-7" and config["Labels"]["extra"] == "x"
    assert abs(int(config["Labels"][LABEL_EXPIRES]) - (time.time() + 90)) < 10
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == host["MemorySwap"] == 256 << 20
    assert host["PidsLimit"] == 64
    assert host["NetworkMode"] == "none"
    assert host["AutoRemove"] is True and host["Init"] is True
    assert config["Cmd"] == ["sleep", "90"]
    assert [i.id for i in await backend.list(backend.namespace)] == [box.id]
    await box.close()


@pytest.mark.slow
async def test_exec_round_trip(backend):
    box = await backend.start(spec(env={"FROM_SPEC": "spec"}, workdir="/srv"))
    r = await box.exec("echo out; echo err >&2; exit 3", timeout_s=10)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.ok) == (3, "out\n", "err\n", False, False)
    r = await box.exec("echo $BASH_VERSION; pwd; echo $FROM_SPEC", timeout_s=10)
    assert r.ok and r.stdout.split("\n")[1:3] == ["/srv", "spec"] and r.stdout[0].isdigit()  # bash, in the workdir
    r = await box.exec(
        ["python3", "-c", "import os, sys; print(os.getcwd(), os.environ['X'], os.getuid()); sys.exit(4)"],
        timeout_s=10,
        cwd="/tmp",
        env={"X": "y"},
        user="nobody",
    )
    assert (r.exit_code, r.stdout) == (4, "/tmp y 65534\n")
    r = await box.exec(
        "head -c 100000 /dev/zero | tr '\\0' a; head -c 5000 /dev/zero >&2", timeout_s=10, max_output=1000
    )
    assert (r.stdout, r.stdout_dropped) == ("a" * 1000, 99_000)
    assert (len(r.stderr), r.stderr_dropped) == (1000, 4000)
    r = await box.exec(["no-such-command"], timeout_s=10)
    assert r.exit_code == 127 and "not found" in r.stderr
    r = await box.exec("sleep 60 & echo started", timeout_s=30)  # returns when bash does, the sleep holding stdout
    assert r.ok and r.stdout == "started\n" and r.duration_s < 5
    assert any(p.startswith("sleep 60") for p in await processes(box))  # left running, as asked
    r = await box.exec("pwd", timeout_s=10, cwd="/no/such/dir")
    assert r.exit_code == 126 and "/no/such/dir" in r.stderr and r.stdout == ""  # the runtime's reason
    r = await box.exec("kill -TERM $$", timeout_s=10)
    assert r.exit_code == 128 + 15
    await box.close()


@pytest.mark.slow
async def test_files_and_directories(backend, tmp_path):
    box = await backend.start(spec())
    await box.write_file("/work/deep/a.txt", b"hello\n", mode=0o600)
    assert await box.read_file("/work/deep/a.txt") == b"hello\n"
    assert await box.read_file("/work/deep/a.txt", max_bytes=3) == b"hel"
    r = await box.exec("stat -c %a /work/deep/a.txt", timeout_s=10)
    assert r.stdout.strip() == "600"
    with pytest.raises(SandboxError, match="No such file"):
        await box.read_file("/work/missing")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "b.txt").write_text("b")
    (src / "top.txt").write_text("top")
    await box.upload_dir(src, "/up/here")
    r = await box.exec("cat /up/here/top.txt /up/here/sub/b.txt", timeout_s=10)
    assert r.stdout == "topb"
    await box.exec("mkdir -p /out/x && echo made > /out/x/m.txt && ln -s /etc/passwd /out/link", timeout_s=10)
    await box.download_dir("/out", tmp_path / "down")
    assert (tmp_path / "down" / "x" / "m.txt").read_text() == "made\n"
    assert not (tmp_path / "down" / "link").is_symlink()  # a link out of the tree stays behind
    await box.close()


@pytest.mark.slow
async def test_exec_timeout_ends_what_the_command_started(backend):
    box = await backend.start(spec())
    # Negative control: a writer left running by a command that returned keeps writing.
    await box.exec(f"({WRITER.format(f='/tmp/left')}) >/dev/null 2>&1 &", timeout_s=10)
    assert await changing(box, "/tmp/left")
    # A command that starts writers (one in a session of its own) and never returns.
    started = "until [ -s /tmp/a ] && [ -s /tmp/b ]; do sleep 0.05; done; echo running"
    cmd = f"({WRITER.format(f='/tmp/a')}) & setsid bash -c '{WRITER.format(f='/tmp/b')}' & {started}; sleep 1000"
    r = await box.exec(cmd, timeout_s=4)
    assert r.timed_out and r.exit_code == -1 and 4 <= r.duration_s < 9 and r.stdout == "running\n"
    assert not await changing(box, "/tmp/a", within_s=1.0) and not await changing(box, "/tmp/b", within_s=1.0)
    assert await changing(box, "/tmp/left")  # another exec's process is not this one's to kill
    assert [p for p in await processes(box) if "sleep 1000" in p or "/tmp/a" in p or "/tmp/b" in p] == []
    # A cancelled exec ends its command too.
    task = asyncio.ensure_future(box.exec(f"{WRITER.format(f='/tmp/c')}", timeout_s=60))
    assert await changing(box, "/tmp/c")  # running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await changing(box, "/tmp/c", within_s=1.0)
    await box.close()


@pytest.mark.slow
async def test_kill_all_ends_everything_but_the_sandbox(backend):
    box = await backend.start(spec())
    # A daemon: double fork, its own session, its parent gone.
    await box.exec(f"setsid bash -c '({WRITER.format(f='/tmp/d')}) &' </dev/null >/dev/null 2>&1", timeout_s=10)
    assert await changing(box, "/tmp/d")
    assert await processes(box)
    await box.kill_all()
    assert not await changing(box, "/tmp/d", within_s=1.0)
    assert await processes(box) == []
    assert (await box.exec("echo alive", timeout_s=10)).stdout == "alive\n"
    assert inspect(box.id)["State"]["Running"]
    await box.close()


@pytest.mark.slow
async def test_close_removes_every_container_of_the_namespace(backend):
    boxes = await asyncio.gather(*(backend.start(spec()) for _ in range(3)))
    assert sorted(containers_of(backend.namespace)) == sorted(b.id for b in boxes)
    await asyncio.gather(*(b.close() for b in boxes))
    await boxes[0].close()  # idempotent
    assert containers_of(backend.namespace) == [] and await backend.list(backend.namespace) == []
    with pytest.raises(SandboxError):
        await boxes[0].exec("true", timeout_s=5)
    await backend.remove(boxes[0].id)  # the sweeper's call on a gone sandbox: no error


@pytest.mark.slow
async def test_lifetime_ends_and_removes_the_sandbox(backend):
    await backend.start(spec(lifetime_s=2))
    assert len(containers_of(backend.namespace)) == 1
    deadline = time.monotonic() + 20
    while containers_of(backend.namespace) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert containers_of(backend.namespace) == []


@pytest.mark.slow
async def test_network_is_off_unless_asked(backend):
    off = await backend.start(spec())
    on = await backend.start(spec(network=True))
    assert (await off.exec("ls /sys/class/net", timeout_s=10)).stdout.split() == ["lo"]
    assert "eth0" in (await on.exec("ls /sys/class/net", timeout_s=10)).stdout.split()  # control
    await asyncio.gather(off.close(), on.close())


@pytest.mark.slow
async def test_a_fork_bomb_hits_its_pids_limit_and_the_neighbour_goes_on(backend):
    bomb_box = await backend.start(spec(pids=64))
    other = await backend.start(spec())
    bomb = asyncio.ensure_future(bomb_box.exec("b() { b | b & }; b; sleep 1000", timeout_s=6))
    await asyncio.sleep(2)
    pids = Path(f"/sys/fs/cgroup/pids/docker/{bomb_box.id}/pids.current")
    if pids.exists():  # cgroup v1 with the cgroupfs driver (this machine's); the limit is in inspect anyway
        assert int(pids.read_text()) >= 60
    for _ in range(5):
        t = time.monotonic()
        assert (await other.exec("echo ok", timeout_s=10)).stdout == "ok\n"
        assert time.monotonic() - t < 3
    r = await bomb
    assert r.timed_out
    # Either the killer ended the bomb, or (no pid to start it with) the sandbox was removed.
    if bomb_box.id in containers_of(backend.namespace):
        assert await processes(bomb_box) == []
        print("fork bomb: ended by the killer")
    else:
        print("fork bomb: no pid left for the killer; the sandbox was removed")
    assert (await other.exec("echo still", timeout_s=10)).stdout == "still\n"


@pytest.mark.slow
async def test_memory_limit_kills_with_an_exit_code(backend):
    box = await backend.start(spec(memory_mb=64))
    r = await box.exec(["python3", "-c", "x = b'x' * (512 << 20)"], timeout_s=30)
    assert r.exit_code == 137 and not r.timed_out  # SIGKILL from the OOM killer
    assert (await box.exec("echo after", timeout_s=10)).stdout == "after\n"
    await box.close()


def _context(tmp_path: Path, dockerfile: str, **files: str) -> ImageSpec:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "Dockerfile").write_text(dockerfile)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return ImageSpec(context=tmp_path)


@pytest.mark.slow
async def test_a_failing_dockerfile_names_its_step(backend, tmp_path):
    image = _context(tmp_path, "FROM ubuntu:22.04\nRUN echo fine\nRUN echo broken-here >&2 && exit 3\nRUN echo never\n")
    with pytest.raises(SandboxStartError) as e:
        await backend.build(image)
    message = str(e.value)
    assert "\n" not in message
    assert "step 3/4 (RUN echo broken-here >&2 && exit 3)" in message and "non-zero code: 3" in message
    assert "broken-here" in message.split("last output:")[1]
    missing = _context(tmp_path / "m", "FROM alpine:3.19\nRUN true\n")
    with pytest.raises(SandboxStartError, match="FROM alpine:3.19: no such image here"):
        await backend.build(missing)


@pytest.mark.slow
async def test_a_build_runs_once_per_content(backend, tmp_path):
    image = _context(
        tmp_path / "a",
        "FROM debian:bookworm\nCOPY hello.txt /opt/hello.txt\nRUN cp /opt/hello.txt /opt/copy.txt\n",
        **{"hello.txt": f"hi {time.time()}\n"},
    )
    t = time.monotonic()
    tags = await asyncio.gather(*(backend.build(image) for _ in range(3)))  # concurrent callers
    first_s = time.monotonic() - t
    assert len(set(tags)) == 1 and tags[0].startswith("rollout-farm/task:") and backend.builder.builds_run == 1
    t = time.monotonic()
    other = DockerBackend()
    assert await other.build(image) == tags[0] and other.builder.builds_run == 0  # found by its content
    await other.aclose()
    assert await backend.build(image) == tags[0]
    hit_s = time.monotonic() - t
    assert backend.builder.builds_run == 1
    print(f"build: first {first_s:.2f} s, cache hit {hit_s * 1000:.0f} ms")
    box = await backend.start(spec(image=tags[0]))
    assert (await box.read_file("/opt/copy.txt")).startswith(b"hi ")
    await box.close()
    (tmp_path / "a" / "hello.txt").write_text(f"changed {time.time()}\n")
    changed = await backend.build(image)
    assert changed != tags[0] and backend.builder.builds_run == 2
    docker("rmi", "-f", tags[0], changed, check=False)


@pytest.mark.slow
async def test_an_image_that_does_not_exist_is_a_start_error(backend):
    with pytest.raises(SandboxStartError, match="rollout-farm/nope:1 does not exist") as e:
        await backend.start(spec(image="rollout-farm/nope:1"))
    assert "\n" not in str(e.value)
    assert containers_of(backend.namespace) == []


@pytest.mark.slow
async def test_check_needs_the_base_image(backend):
    await backend.check()
    absent = DockerBackend(base_image="rollout-farm/base:absent")
    with pytest.raises(SandboxUnavailable, match="farm sandbox base"):
        await absent.check()
    await absent.aclose()


async def test_an_unreachable_daemon_is_one_line(tmp_path):
    backend = DockerBackend(host=f"unix://{tmp_path}/no-daemon.sock")
    with pytest.raises(SandboxUnavailable) as e:
        await backend.check()
    assert "\n" not in str(e.value) and "no-daemon.sock does not answer" in str(e.value)
    with pytest.raises(SandboxStartError, match="does not answer"):
        await backend.start(spec())
    await backend.aclose()


def test_aliases_map_common_bases_onto_the_base(monkeypatch):
    aliases = load_aliases(env={})
    assert aliases == dict(DEFAULT_ALIASES) == load_aliases({}, env={})  # an empty setting: the defaults
    assert load_aliases(env={"FARM_SANDBOX_BASE_ALIASES": "{}"}) == {}  # the variable can map nothing
    for name in ("ubuntu:24.04", "docker.io/library/debian:bookworm-slim", "python:3.12-slim", "ubuntu"):
        assert map_base(name, aliases) == BASE, name
    assert map_base("alpine:3.19", aliases) == "alpine:3.19"
    custom = load_aliases(env={"FARM_SANDBOX_BASE_ALIASES": '{"alpine": "my/base:1"}'})
    assert map_base("alpine:latest", custom) == "my/base:1" and map_base("ubuntu:24.04", custom) == "ubuntu:24.04"
    with pytest.raises(SandboxStartError, match="FARM_SANDBOX_BASE_ALIASES"):
        load_aliases(env={"FARM_SANDBOX_BASE_ALIASES": "[1]"})
    text, bases = rewrite_from(
        "FROM --platform=linux/amd64 ubuntu:22.04 AS build\nRUN x\nFROM build\nfrom python:3.11\n", aliases
    )
    assert text == f"FROM --platform=linux/amd64 {BASE} AS build\nRUN x\nFROM build\nfrom {BASE}\n"
    assert bases == [BASE, BASE]


@pytest.mark.slow
async def test_when_the_killer_cannot_run_the_sandbox_is_removed(backend):
    box = await backend.start(spec())
    # The command deletes the shell the killer runs in, then outstays its timeout.
    r = await box.exec(
        ["python3", "-c", "import os, time; os.unlink('/bin/sh'); print('gone', flush=True); time.sleep(1000)"],
        timeout_s=3,
    )
    assert r.timed_out and r.stdout == "gone\n"
    assert box.id not in containers_of(backend.namespace)
    with pytest.raises(SandboxError, match="closed"):
        await box.exec("true", timeout_s=5)
