"""The `local` sandbox backend against the real base tree: real namespaces, cgroups and overlays.

Each test starts real sandboxes (root needed; the base tree is built once when absent, see
helpers.sandboxes) on a state directory of its own, and checks what the protocol promises:
commands and files round-trip, the limits hold (pids, memory, disk, network) without touching
the host or a neighbour, a timed-out command leaves nothing running, and close / lifetime leave
no process, mount, cgroup or file behind. Negative controls: a sandbox with the network sees the
host's interfaces; the same fork loop without a tight pids limit gets further.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

import pytest
from helpers.sandboxes import base_tree, leftovers, metadata

from envs.boxes.local import LocalBackend, LocalSandbox
from envs.sdk.sandbox import (
    LABEL_EXPIRES,
    LABEL_NAMESPACE,
    ImageSpec,
    SandboxError,
    SandboxSpec,
    SandboxStartError,
)

pytestmark = pytest.mark.slow

BASE = "rollout-farm/base:bookworm"


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    """A backend on the real base tree, with its own image cache and state (other builders on this
    host share neither)."""
    tree = base_tree()
    (tmp_path / "data" / "sandbox").mkdir(parents=True)
    (tmp_path / "data" / "sandbox" / "bookworm").symlink_to(tree.rootfs.parent)
    return LocalBackend(data_dir=tmp_path / "data", state_dir=tmp_path / "state")


@pytest.fixture
async def box(backend: LocalBackend):
    sandbox = await backend.start(SandboxSpec(image=BASE, lifetime_s=120, labels={LABEL_NAMESPACE: "t"}))
    yield sandbox
    await sandbox.close()


def _gone(backend: LocalBackend, sandbox: LocalSandbox, cgroups: list[str]) -> list[str]:
    meta = backend.state_dir / "sandboxes" / f"{sandbox.id}.json"
    return leftovers(meta, backend.state_dir / "scratch", sandbox.id, sandbox.pid, cgroups)


async def test_exec_round_trip(box: LocalSandbox) -> None:
    r = await box.exec("echo out; echo err >&2; exit 7", timeout_s=10)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.ok) == (7, "out\n", "err\n", False, False)
    r = await box.exec(["python3", "-c", "print('x' * 1000)"], timeout_s=10, max_output=100)
    assert (r.stdout, r.stdout_dropped, r.exit_code) == ("x" * 100, 901, 0)
    r = await box.exec("head -c 5000 /dev/zero >&2", timeout_s=10, max_output=10)
    assert (len(r.stderr), r.stderr_dropped) == (10, 4990)
    r = await box.exec("kill -TERM $$", timeout_s=10)
    assert r.exit_code == 128 + 15
    r = await box.exec("hostname; cat /proc/1/cmdline | tr '\\0' ' '; ls /dev", timeout_s=10)
    assert r.stdout.startswith("sandbox\n") and "local_init.py" in r.stdout and "urandom" in r.stdout


async def test_capabilities_are_cut(box: LocalSandbox) -> None:
    keep = sum(1 << c for c in (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31))  # Docker's default set
    r = await box.exec("grep -E '^Cap(Bnd|Eff)' /proc/self/status", timeout_s=10)
    assert r.stdout.split() == ["CapEff:", f"{keep:016x}", "CapBnd:", f"{keep:016x}"]
    r = await box.exec("mount -t tmpfs x /mnt && echo mounted; mknod /tmp/disk b 8 0 && echo made; true", 10)
    assert r.stdout == "" and "permitted" in r.stderr  # no mounts, no device nodes
    await box.write_file("/usr/bin/setpriv", b"#!/bin/sh\necho replaced\n", mode=0o755)
    assert (await box.exec("echo still confined", timeout_s=10)).stdout == "still confined\n"


async def test_cwd_env_user(backend: LocalBackend) -> None:
    spec = SandboxSpec(image=BASE, lifetime_s=60, workdir="/srv", env={"A": "spec", "B": "spec"})
    box = await backend.start(spec)
    try:
        r = await box.exec("pwd; echo $A $B", timeout_s=10, env={"B": "exec"})
        assert r.stdout == "/srv\nspec exec\n"
        r = await box.exec("pwd; id -u; echo $HOME; touch /root/x", timeout_s=10, cwd="/tmp", user="nobody")
        assert r.stdout.startswith("/tmp\n65534\n/nonexistent\n") and r.exit_code != 0  # root's files are not its
        r = await box.exec("true", timeout_s=10, cwd="/no/such/dir")
        assert r.exit_code == 125 and "/no/such/dir" in r.stderr
        with pytest.raises(SandboxError, match="no user"):
            await box.exec("true", timeout_s=10, user="nosuchuser")
    finally:
        await box.close()


async def test_files_and_dirs(box: LocalSandbox, tmp_path: Path) -> None:
    await box.write_file("/work/deep/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert (await box.exec("/work/deep/run.sh", timeout_s=10)).stdout == "ran\n"
    assert await box.read_file("/work/deep/run.sh", max_bytes=9) == b"#!/bin/sh"
    with pytest.raises(SandboxError, match="No such file"):
        await box.read_file("/nope")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "top.txt").write_bytes(bytes(range(256)))
    await box.upload_dir(src, "/repo")
    r = await box.exec("cd /repo && find . -type f | sort && stat -c %U pkg/a.py", timeout_s=10)
    assert r.stdout == "./pkg/a.py\n./top.txt\nroot\n"
    await box.exec("echo new > /repo/pkg/b.txt && ln -s /etc/passwd /repo/link", timeout_s=10)
    await box.download_dir("/repo", tmp_path / "back")
    assert (tmp_path / "back" / "top.txt").read_bytes() == bytes(range(256))
    assert (tmp_path / "back" / "pkg" / "b.txt").read_text() == "new\n"
    assert not (tmp_path / "back" / "link").is_symlink()  # a link out of the copy is left out


async def test_network_off_loopback_only(backend: LocalBackend) -> None:
    box = await backend.start(SandboxSpec(image=BASE, lifetime_s=60))
    online = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, network=True))
    try:
        probe = "import socket; s=socket.socket(); s.settimeout(3); s.connect(('1.1.1.1', 53))"
        r = await box.exec(["python3", "-c", probe], timeout_s=10)
        assert r.exit_code != 0 and "unreachable" in r.stderr
        interfaces = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"
        assert (await box.exec(interfaces, timeout_s=10)).stdout == "lo "
        assert (await online.exec(interfaces, timeout_s=10)).stdout != "lo "  # negative control
        loop = (
            "python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 & "
            'for i in $(seq 50); do python3 -c "import urllib.request as u; '
            "u.urlopen('http://127.0.0.1:8123/')\" 2>/dev/null && echo up && break; sleep 0.1; done"
        )
        assert (await box.exec(loop, timeout_s=20)).stdout == "up\n"
    finally:
        await box.close()
        await online.close()


async def test_timeout_kills_everything_the_command_started(box: LocalSandbox) -> None:
    cmd = (
        "sleep 1000 & setsid sleep 1001 & nohup sh -c 'while :; do date +%s%N > /tmp/tick; sleep 0.05; done' "
        ">/dev/null 2>&1 & sleep 30"
    )
    started = time.monotonic()
    r = await box.exec(cmd, timeout_s=1.5)
    assert r.timed_out and r.exit_code == -1 and time.monotonic() - started < 10
    first = await box.read_file("/tmp/tick")
    await asyncio.sleep(0.4)
    assert await box.read_file("/tmp/tick") == first  # nothing touches it any more
    ps = await box.exec(["ps", "-eo", "pid=,stat=,comm="], timeout_s=10)
    live = [line.split() for line in ps.stdout.splitlines()]
    assert [p[0] for p in live if p[2] != "ps" and not p[1].startswith("Z")] == ["1"], ps.stdout
    assert box.cg.pids() == [box.pid]


async def test_kill_all_spares_pid_1(box: LocalSandbox) -> None:
    r = await box.exec("sleep 1000 >/dev/null 2>&1 & setsid sleep 999 >/dev/null 2>&1 & echo started", timeout_s=10)
    assert r.stdout == "started\n"
    assert len(box.cg.pids()) == 3  # PID 1 and two sleeps left running by a finished command
    await box.kill_all()
    assert box.cg.pids() == [box.pid]
    assert (await box.exec("echo alive", timeout_s=10)).stdout == "alive\n"


async def test_close_leaves_nothing(backend: LocalBackend) -> None:
    box = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, labels={LABEL_NAMESPACE: "t"}))
    await box.exec("sleep 1000 >/dev/null 2>&1 & dd if=/dev/zero of=/tmp/f bs=1M count=5 2>/dev/null", timeout_s=10)
    cgroups = metadata(backend.state_dir / "sandboxes" / f"{box.id}.json")["cgroups"]
    assert [i.id for i in await backend.list("t")] == [box.id]
    assert all(Path(d).exists() for d in cgroups) and (backend.state_dir / "scratch" / box.id).exists()
    await box.close()
    assert _gone(backend, box, cgroups) == []
    assert await backend.list("t") == []
    await box.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        await box.exec("true", timeout_s=5)


async def test_another_process_lists_and_removes(backend: LocalBackend) -> None:
    box = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, labels={LABEL_NAMESPACE: "sweep"}))
    cgroups = metadata(backend.state_dir / "sandboxes" / f"{box.id}.json")["cgroups"]
    sweeper = LocalBackend(data_dir=backend.data_dir, state_dir=backend.state_dir)
    found = await sweeper.list("sweep")
    assert [(i.id, i.running) for i in found] == [(box.id, True)] and await sweeper.list("other") == []
    await sweeper.remove(box.id)
    await sweeper.remove(box.id)  # gone: no error
    assert _gone(backend, box, cgroups) == []
    await box.close()


async def test_lifetime_ends_the_sandbox_by_itself(backend: LocalBackend) -> None:
    box = await backend.start(SandboxSpec(image=BASE, lifetime_s=1.5))
    cgroups = metadata(backend.state_dir / "sandboxes" / f"{box.id}.json")["cgroups"]
    await box.exec("sleep 1000 >/dev/null 2>&1 &", timeout_s=5)
    await asyncio.sleep(2.0)
    assert not Path(f"/proc/{box.pid}/ns").exists() or box.cg.pids() == []  # PID 1 and its sleep are gone
    with pytest.raises(SandboxError):
        await box.exec("true", timeout_s=5)
    deadline = time.monotonic() + 5
    while _gone(backend, box, cgroups) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert _gone(backend, box, cgroups) == []  # removed by the backend without a close


FORKS = """
import os, time
n = 0
try:
    for _ in range(300):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
else:
    print(n, 0)
"""


async def test_fork_bomb_hits_the_pids_limit(backend: LocalBackend) -> None:
    tight = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, pids=40))
    loose = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, pids=1000))
    try:
        forks = await tight.exec(["python3", "-c", FORKS], timeout_s=20)
        count, errno = map(int, forks.stdout.split())
        assert count < 40 and errno == 11  # EAGAIN at the limit
        # The exec ended when its program did, not when its sleeping children let go of its output.
        assert not forks.timed_out and forks.duration_s < 10
        await tight.kill_all()  # they live on until then, as a finished exec's background processes do
        assert (await loose.exec(["python3", "-c", FORKS], timeout_s=20)).stdout.split() == ["300", "0"]
        await loose.kill_all()
        r = await tight.exec(":(){ :|:& };:; sleep 5", timeout_s=3)  # the classic bomb, stopped by the timeout
        assert r.timed_out
        assert tight.cg.pids() == [tight.pid]
        assert (await loose.exec("echo fine", timeout_s=10)).stdout == "fine\n"  # the neighbour carries on
        assert (await tight.exec("echo fine", timeout_s=10)).stdout == "fine\n"
    finally:
        await tight.close()
        await loose.close()


async def test_memory_limit_holds(backend: LocalBackend) -> None:
    box = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, memory_mb=64))
    try:
        r = await box.exec(["python3", "-c", "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"], 30)
        assert r.exit_code == 128 + 9  # the cgroup's OOM killer ended it
        assert (await box.exec("echo alive", timeout_s=10)).stdout == "alive\n"
    finally:
        await box.close()


async def test_disk_fill_hits_enospc(backend: LocalBackend) -> None:
    box = await backend.start(SandboxSpec(image=BASE, lifetime_s=60, disk_mb=16, memory_mb=256))
    try:
        r = await box.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=64", timeout_s=30)
        assert r.exit_code != 0 and "No space left on device" in r.stderr
        await box.exec("rm /tmp/fill", timeout_s=10)
        assert (await box.exec("echo ok > /tmp/small && cat /tmp/small", timeout_s=10)).stdout == "ok\n"
    finally:
        await box.close()


# ── the Dockerfile subset ─────────────────────────────────────────────────────────────────
def _context(tmp_path: Path, dockerfile: str) -> Path:
    ctx = tmp_path / f"ctx-{secrets.token_hex(4)}"
    (ctx / "src").mkdir(parents=True)
    (ctx / "src" / "mod.py").write_text("VALUE = 42\n")
    (ctx / "notes.txt").write_text(f"unique {secrets.token_hex(8)}\n")  # a fresh cache key per test
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


DOCKERFILE = """\
FROM python:3.11-slim
ENV APP=/app GREETING="hello there"
WORKDIR $APP
COPY src/ ./src/
COPY notes.txt .
RUN python3 -c "import sys; sys.path.insert(0, 'src'); import mod; print(mod.VALUE)" > value.txt \\
    && useradd -m agent
USER agent
RUN whoami > /tmp/built-by
"""


async def test_dockerfile_build_and_cache(backend: LocalBackend, tmp_path: Path) -> None:
    ctx = _context(tmp_path, DOCKERFILE)
    started = time.monotonic()
    refs = await asyncio.gather(backend.build(ImageSpec(ctx)), backend.build(ImageSpec(ctx)))  # concurrent builders
    first = time.monotonic() - started
    assert refs[0] == refs[1] and refs[0].startswith("local:")
    started = time.monotonic()
    assert await backend.build(ImageSpec(ctx)) == refs[0]
    assert time.monotonic() - started < min(0.5, first)  # a cache hit
    images = backend.data_dir / "sandbox" / "images"
    assert not list(images.glob(f".build-{refs[0][6:]}-*"))  # one build, renamed into place
    box = await backend.start(SandboxSpec(image=refs[0], lifetime_s=60))
    try:
        r = await box.exec("pwd; whoami; cat value.txt /tmp/built-by; echo $GREETING; ls src/mod.py", 10)
        assert r.stdout.splitlines() == ["/app", "agent", "42", "agent", "hello there", "src/mod.py"]
    finally:
        await box.close()


async def test_dockerfile_errors_name_the_line(backend: LocalBackend, tmp_path: Path) -> None:
    bad = _context(tmp_path, 'FROM debian:bookworm\nRUN true\nSHELL ["/bin/bash", "-c"]\n')
    with pytest.raises(SandboxStartError, match=r"^Dockerfile line 3: SHELL is not supported"):
        await backend.build(ImageSpec(bad))
    stages = _context(tmp_path, "FROM debian:bookworm AS a\nRUN true\nFROM debian:bookworm\n")
    with pytest.raises(SandboxStartError, match=r"line 3: FROM again: multi-stage"):
        await backend.build(ImageSpec(stages))
    alpine = _context(tmp_path, "FROM alpine:3.19\n")
    with pytest.raises(SandboxStartError, match=r"line 1: FROM alpine:3.19"):
        await backend.build(ImageSpec(alpine))
    failing = _context(tmp_path, "FROM debian:bookworm\nRUN echo fine\nRUN echo broken >&2; exit 3\n")
    with pytest.raises(SandboxStartError, match=r"line 3: RUN echo broken >&2; exit 3 failed \(exit 3\): broken"):
        await backend.build(ImageSpec(failing))
    offline = _context(
        tmp_path,
        "FROM debian:bookworm\nRUN python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\"\n",
    )
    with pytest.raises(SandboxStartError, match=r"line 2: RUN"):
        await backend.build(ImageSpec(offline))  # RUN has no network
    images = backend.data_dir / "sandbox" / "images"
    assert [p.name for p in images.iterdir() if p.is_dir()] == []  # no image, no half-built one


def test_execs_run_under_uvloop_the_workers_loop_even_after_one_leaves_its_output_open(backend: LocalBackend) -> None:
    """A worker's loop is uvloop: an exec spawns through the standard library there too, and a pipe a
    background process keeps open leaves the loop when its exec ends, so the next execs, which get
    the same descriptor numbers, still start (uvloop refused them with EEXIST)."""
    uvloop = pytest.importorskip("uvloop", reason="uvloop is the worker's default loop where it is installed")

    async def main() -> list[str]:
        box = await backend.start(SandboxSpec(image=BASE, lifetime_s=60))
        try:
            held = await box.exec("sleep 30 & echo started", timeout_s=10)  # the sleep keeps stdout open
            said = [held.stdout.strip()]
            for i in range(20):
                said.append((await box.exec(f"echo {i}", timeout_s=10)).stdout.strip())
            return said
        finally:
            await box.close()

    assert uvloop.run(main()) == ["started", *[str(i) for i in range(20)]]


async def test_a_build_sandbox_whose_pid_1_died_is_found_by_any_namespaces_sweep(backend: LocalBackend) -> None:
    """An image build's sandbox carries no namespace; one whose builder died with it half-done (its
    PID 1 gone, its records, cgroups and scratch left) is listed to every namespace's sweep, while a
    live one is not (it is some builder's)."""
    import signal

    from workers.delivery.sweeper import sweep

    dead = await backend.start(SandboxSpec(image=BASE, lifetime_s=300))
    live = await backend.start(SandboxSpec(image=BASE, lifetime_s=300))
    try:
        cgroups = [str(d) for d in dead.cg.dirs]
        os.kill(dead.pid, signal.SIGKILL)
        for _ in range(100):
            if not dead.cg.holds(dead.pid):
                break
            await asyncio.sleep(0.05)

        async def nobody(workers: set[str]) -> set[str]:
            return set()

        listed = {b.id for b in await backend.list("any-namespace")}
        assert dead.id in listed and live.id not in listed
        swept = await sweep(backend, "any-namespace", nobody)
        assert swept.removed == [dead.id]
        assert _gone(backend, dead, cgroups) == []
    finally:
        await live.close()


async def test_a_build_sandbox_still_starting_is_no_other_sweeps(backend: LocalBackend) -> None:
    """A sandbox's record is written before its PID 1 exists (a crash from there on leaves something
    to sweep). A build sandbox in that moment was listed to every namespace's sweep as one whose PID
    1 had died, and a sweeper elsewhere on the machine removed its cgroups under it: its start failed
    (ENODEV writing cgroup.procs), seen as `farm data generate --build` failing beside a worker."""
    from envs.boxes.local import _write_meta

    def record(sandbox_id: str, lifetime_s: float) -> None:
        labels = {LABEL_EXPIRES: f"{time.time() + lifetime_s:.0f}"}
        cgroups = [str(backend.state_dir / "no-cgroup" / sandbox_id)]
        data = {"id": sandbox_id, "pid": 0, "labels": labels, "cgroups": cgroups, "track": cgroups[0]}
        _write_meta(backend.state_dir / "sandboxes" / f"{sandbox_id}.json", data)

    record("lb-starting", 300)
    record("lb-never-started", -1)  # a start that crashed: swept once its lifetime is past
    assert [b.id for b in await backend.list("any-namespace")] == ["lb-never-started"]
