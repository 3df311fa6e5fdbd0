"""The `local` sandbox backend: no daemon, just namespaces, a cgroup and an overlay (root only).

Why: a farm host without Docker (or one where a daemon per host is unwelcome) can still give each
rollout its own machine. A sandbox here is a PID-1 process (local_init) in its own mount, PID,
IPC, UTS and network namespaces (loopback only; the host's network when `spec.network`), in a
cgroup with the spec's memory, pids and CPU limits (local_cg), whose root is an overlay of the
image's layers over the base tree (envs.boxes.base), written to a tmpfs of `spec.disk_mb` (a
disk-filling agent hits ENOSPC; what it writes is memory, charged to its own cgroup). Processes
run inside through local_exec (setns + chroot, capabilities cut before anything of the sandbox's
tree runs).

What it guarantees, beyond the protocol (envs.sdk.sandbox):
- the sandbox ends by itself after `spec.lifetime_s` (PID 1 exits; the kernel kills the rest of
  the PID namespace; its mounts vanish with the namespace), and a live LocalSandbox object also
  removes its cgroup and files then;
- `close()` / `remove(id)`: SIGKILL PID 1 and every process in the cgroup until it is empty,
  remove the cgroups, the scratch directory and the metadata file; idempotent, from any process;
- metadata for the sweeper: `<state_dir>/sandboxes/<id>.json` (labels, PID 1's host pid, cgroup
  directories, scratch, expiry), so `list(namespace)` and `remove(id)` work from other workers.

Not isolated (documented, accepted for trusted hosts running model-written code): the sandbox's
root is the host's root with fewer capabilities, not a user-namespaced uid; no seccomp filter;
/sys is not mounted; no /dev/pts.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from envs.boxes.aliases import load_aliases
from envs.boxes.base import DEFAULT_PATH, load_base
from envs.boxes.images import ImageConfig, load_image
from envs.boxes.local_cg import SandboxCgroup
from envs.boxes.local_exec import Identity, Ran, run_inside
from envs.sdk.sandbox import (
    DEFAULT_MAX_OUTPUT,
    LABEL_EXPIRES,
    LABEL_NAMESPACE,
    ExecResult,
    ImageSpec,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailable,
    expired,
)

__all__ = ["LocalBackend", "LocalSandbox", "STATE_DIR"]

STATE_DIR = Path("/run/rollout-farm")
INIT = Path(__file__).with_name("local_init.py")
START_TIMEOUT_S = 30.0
FILE_OP_TIMEOUT_S = 300.0


def default_data_dir() -> Path:
    from farm.settings import load_settings

    return load_settings().data_path


class LocalSandbox:
    def __init__(self, sandbox_id: str, pid: int, cg: SandboxCgroup, spec: SandboxSpec, image: ImageConfig, meta: Path):
        self.id = sandbox_id
        self.pid = pid
        self.cg = cg
        self.spec = spec
        self.image = image
        self._meta = meta
        self._closed = False
        self._users: dict[str, Identity] = {}
        self._expiry: Optional[asyncio.TimerHandle] = None

    # ── running commands ──
    def _env(self, who: Identity, extra: Optional[Mapping[str, str]]) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOME": who.home, "USER": who.name, "LOGNAME": who.name, "TERM": "dumb"}
        env.update(self.image.env)
        env.update(self.spec.env)
        env.update(extra or {})
        return env

    def _cwd(self, cwd: Optional[str]) -> str:
        return cwd or (self.spec.workdir if self.spec.workdir != "/" else self.image.workdir) or "/"

    async def _identity(self, user: Optional[str]) -> Identity:
        user = user if user is not None else self.image.user
        if user in (None, "", "root", "0"):
            return Identity()
        assert user is not None
        if user not in self._users:
            look = ["sh", "-c", 'getent passwd "$1" && id -G "$1"', "sh", user]
            ran = await self._run(look, timeout_s=30, who=Identity(), stdin=None)
            lines = ran.stdout.decode(errors="replace").splitlines()
            fields = lines[0].split(":") if lines else []
            if ran.exit_code == 0 and len(fields) >= 6 and len(lines) > 1:
                groups = tuple(int(g) for g in lines[1].split())
                self._users[user] = Identity(int(fields[2]), int(fields[3]), fields[5] or "/", fields[0], groups)
            elif user.isdigit():
                self._users[user] = Identity(int(user), int(user), "/", user)
            else:
                raise SandboxError(f"no user {user!r} in sandbox {self.id}")
        return self._users[user]

    async def _run(
        self,
        cmd: Sequence[str],
        *,
        timeout_s: float,
        who: Identity,
        stdin: Optional[bytes],
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> Ran:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        if not self.cg.holds(self.pid):  # PID 1 gone (and its pid perhaps another process's now)
            raise SandboxError(f"sandbox {self.id} has ended (its lifetime ran out or it was removed)")
        return await run_inside(
            self.pid,
            self.cg,
            cmd,
            timeout_s=timeout_s,
            cwd=self._cwd(cwd),
            env=self._env(who, env),
            who=who,
            max_output=max_output,
            stdin=stdin,
        )

    async def exec(
        self,
        cmd: Union[str, Sequence[str]],
        timeout_s: float,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        argv = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        who = await self._identity(user)
        ran = await self._run(argv, timeout_s=timeout_s, who=who, stdin=None, cwd=cwd, env=env, max_output=max_output)
        return ExecResult(
            exit_code=ran.exit_code,
            stdout=ran.stdout.decode(errors="replace"),
            stderr=ran.stderr.decode(errors="replace"),
            stdout_dropped=ran.stdout_dropped,
            stderr_dropped=ran.stderr_dropped,
            timed_out=ran.timed_out,
            duration_s=ran.duration_s,
        )

    # ── files: through the same confined path as any command ──
    async def _file_op(self, cmd: Sequence[str], stdin: Optional[bytes], what: str, max_output: int = 1 << 16) -> Ran:
        ran = await self._run(
            cmd, timeout_s=FILE_OP_TIMEOUT_S, who=Identity(), stdin=stdin, cwd="/", max_output=max_output
        )
        if ran.exit_code != 0:
            err = " ".join(ran.stderr.decode(errors="replace").split())
            if "No such file or directory" in err:
                raise SandboxError(f"[Errno 2] No such file or directory: {what!r}")
            raise SandboxError(f"{what}: {err or f'exit {ran.exit_code}'}")
        return ran

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"'
        await self._file_op(["sh", "-c", script, "sh", path, format(mode, "o")], data, path)

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        return (await self._file_op(["head", "-c", str(max_bytes), "--", path], None, path, max_bytes)).stdout

    async def upload_dir(self, src: Path, dest: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(src), arcname=".")
        script = 'mkdir -p -- "$1" && tar -x --no-same-owner -C "$1" -f -'
        await self._file_op(["sh", "-c", script, "sh", dest], buf.getvalue(), dest)

    async def download_dir(self, src: str, dest: Path) -> None:
        ran = await self._file_op(["tar", "-c", "-C", src, "."], None, src, max_output=1 << 31)
        if ran.stdout_dropped:
            raise SandboxError(f"{src}: more than 2 GiB to download")
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(ran.stdout), mode="r:") as tar:
            tar.extractall(dest, filter=_safe_member)

    # ── ending ──
    async def kill_all(self) -> None:
        await asyncio.to_thread(self.cg.kill, None, (self.pid,))

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(asyncio.to_thread(_remove, self._meta))

    def _expire_later(self) -> None:
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(self.spec.lifetime_s + 1.0, lambda: asyncio.ensure_future(self.close()))


def _safe_member(member: tarfile.TarInfo, dest: str) -> Optional[tarfile.TarInfo]:
    """tarfile's `data` filter, but a member it refuses (an absolute link, a link or path out of
    `dest`, a device) is skipped instead of ending the download."""
    try:
        return tarfile.data_filter(member, dest)
    except tarfile.FilterError:
        return None


def _write_meta(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)


def _remove(meta: Path) -> None:
    """Kill and remove the sandbox a metadata file describes (PID 1 first: the rest die with it)."""
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError):
        return
    cg = SandboxCgroup([Path(d) for d in data["cgroups"]], Path(data["track"]))
    if cg.holds(int(data["pid"])):  # never signal a pid that is no longer this sandbox's
        try:
            os.kill(int(data["pid"]), 9)
        except ProcessLookupError:
            pass
    cg.remove()
    shutil.rmtree(data["scratch"], ignore_errors=True)
    meta.unlink(missing_ok=True)


class LocalBackend:
    name = "local"

    def __init__(
        self,
        data_dir: Optional[Path] = None,
        state_dir: Path = STATE_DIR,
        aliases: Optional[Mapping[str, str]] = None,
    ):
        self.data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
        self.state_dir = state_dir
        self.aliases = load_aliases(aliases)

    def _meta(self, sandbox_id: str) -> Path:
        return self.state_dir / "sandboxes" / f"{sandbox_id}.json"

    async def check(self) -> None:
        if os.geteuid() != 0:
            raise SandboxUnavailable("the local sandbox backend needs root (namespaces, cgroups, overlay mounts)")
        if "overlay" not in Path("/proc/filesystems").read_text():
            raise SandboxUnavailable("the local sandbox backend needs overlayfs: modprobe overlay")
        if load_base(self.data_dir) is None:
            raise SandboxUnavailable(f"no sandbox base tree under {self.data_dir}: run `farm sandbox base`")

    async def build(self, image: ImageSpec) -> str:
        from envs.boxes.dockerfile import build_image

        return await build_image(self, image)

    async def start(self, spec: SandboxSpec) -> LocalSandbox:
        base = load_base(self.data_dir)
        if base is None:
            raise SandboxUnavailable(f"no sandbox base tree under {self.data_dir}: run `farm sandbox base`")
        image = load_image(spec.image, self.data_dir, self.aliases)
        return await self.start_on(spec, image, image.lowerdirs(base.rootfs))

    async def start_on(
        self, spec: SandboxSpec, image: ImageConfig, lowerdirs: list[str], upper: Optional[Path] = None
    ) -> LocalSandbox:
        """Start over these layers; `upper` (image builds): write to that host directory instead of
        a tmpfs, so what the sandbox wrote can become a layer."""
        sandbox_id = f"lb-{secrets.token_hex(6)}"
        scratch = self.state_dir / "scratch" / sandbox_id
        scratch.mkdir(parents=True)
        try:
            cg = SandboxCgroup.create(sandbox_id, spec.cpus, spec.memory_mb, spec.pids)
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise SandboxStartError(f"cannot make the sandbox's cgroups: {exc}") from None
        expires = time.time() + spec.lifetime_s
        meta = self._meta(sandbox_id)
        data = {
            "id": sandbox_id,
            "pid": 0,
            "labels": {**spec.labels, LABEL_EXPIRES: f"{expires:.0f}"},
            "cgroups": [str(d) for d in cg.dirs],
            "track": str(cg.track),
            "scratch": str(scratch),
            "expires": expires,
            "image": spec.image,
        }
        _write_meta(meta, data)  # before PID 1 exists: a crash from here on leaves a record to sweep
        try:
            pid = await self._spawn_init(spec, lowerdirs, scratch, cg, upper)
        except BaseException:
            await asyncio.shield(asyncio.to_thread(_remove, meta))
            raise
        data["pid"] = pid
        _write_meta(meta, data)
        box = LocalSandbox(sandbox_id, pid, cg, spec, image, meta)
        box._expire_later()
        return box

    async def _spawn_init(
        self, spec: SandboxSpec, lowerdirs: list[str], scratch: Path, cg: SandboxCgroup, upper: Optional[Path]
    ) -> int:
        cfg = {
            "lowerdirs": lowerdirs,
            "scratch": str(scratch),
            "disk_mb": spec.disk_mb,
            "network": spec.network,
            "lifetime_s": spec.lifetime_s,
            "cgroup_procs": cg.procs,
            "upper": str(upper / "upper") if upper else None,
            "work": str(upper / "work") if upper else None,
            "mounts": [[src, dest] for src, dest in spec.mounts.items()],
        }
        if len(":".join(lowerdirs)) > 3500:
            raise SandboxStartError(f"too many image layers ({len(lowerdirs)}) for one overlay mount")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-S", "-I", str(INIT),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(json.dumps(cfg).encode()), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise SandboxStartError(f"sandbox did not start within {START_TIMEOUT_S:.0f}s") from None
        finally:
            if proc.returncode is None:  # timed out or cancelled: the launcher goes (PID 1 with the cgroup)
                proc.kill()
        lines = out.decode(errors="replace").splitlines()
        pid = next((int(line.split()[1]) for line in lines if line.startswith("pid ")), 0)
        if "ready" not in lines or not pid:
            why = next((line[6:] for line in lines if line.startswith("error ")), " | ".join(lines)[-300:])
            raise SandboxStartError(f"sandbox did not start: {why or f'init exited {proc.returncode}'}")
        return pid

    async def list(self, namespace: str) -> list[SandboxInfo]:
        out = []
        for meta in sorted((self.state_dir / "sandboxes").glob("*.json")):
            try:
                data = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
            cg = SandboxCgroup([Path(d) for d in data["cgroups"]], Path(data["track"]))
            pid = int(data["pid"])
            running = cg.holds(pid)
            ns = data["labels"].get(LABEL_NAMESPACE)
            # An image build's sandbox has no namespace: every sweeper may remove one that is over,
            # its PID 1 gone or its lifetime past. One with no PID 1 recorded yet is starting, not over.
            over = expired(data["labels"], time.time()) or (pid != 0 and not running)
            if ns != namespace and not (ns is None and over):
                continue
            out.append(SandboxInfo(data["id"], data["labels"], running=running))
        return out

    async def remove(self, sandbox_id: str) -> None:
        await asyncio.shield(asyncio.to_thread(_remove, self._meta(sandbox_id)))
