"""The `docker` sandbox backend: one labelled, limited container per rollout, over the Engine API.

Why: an agentic task runs its agent's commands and its verifier in a container of its own. The
failures other frameworks ship are leaks (no labels, no lifetime), exec timeouts that stop the
client while the command keeps running inside, and a start serialized across a batch; this
backend is written against each. It talks to the daemon's API (envs/boxes/docker_engine.py: the
socket is `host`, else DOCKER_HOST, else /var/run/docker.sock) and builds task images with
envs/boxes/docker_build.py.

What a container gets (`start`):
- labels LABEL_NAMESPACE / LABEL_WORKER (the constructor's, unless the spec's labels name them),
  LABEL_TASK, the spec's other labels, and LABEL_EXPIRES = start time + lifetime (unix seconds);
- `NanoCpus` (the spec's cpus, at most the host's), memory with memory+swap equal (no swap),
  a pids limit, network `none` unless `spec.network` (then the default bridge);
- disk: a size limit only where the storage driver enforces one (overlay2 on xfs with project
  quotas, btrfs, zfs); on overlay2 over ext4, this machine's case, what a sandbox writes is
  bounded only by the host's disk;
- the spec's `mounts` as read-only binds (host directory -> path inside);
- `--init` (the daemon's docker-init as PID 1, which reaps orphaned processes) when the daemon
  has one, and `--rm`; the command is `sleep <lifetime>`, so when the lifetime ends the container
  exits and the daemon removes it, with or without a worker alive to ask.

What is killed, when (by a shell script run as root inside the container, built-ins only in its
scan, repeated until nothing is left):
- exec timeout, or the exec's task cancelled: the command's session (each exec is its own session,
  its leader's pid learned from the wrapper's first output line; before that line arrives,
  everything but PID 1 and the lifetime sleep) and every process descended from
  one of them while its parent lives, even one that called setsid. A process that left the session
  and whose parent has died (a deliberate daemon: double fork + setsid) is not found; `kill_all`
  is what ends those;
- `kill_all`: every process but PID 1 and the lifetime sleep (without an init, PID 1 is the sleep);
- when the killer cannot run or leaves something alive (the command removed /bin/sh; a fork bomb
  holds every pid and the runtime cannot start it), the sandbox is removed instead: nothing the
  command started outlives its timeout either way (later calls raise SandboxError: closed);
- `close` / `remove`: the whole container (`rm -f`), shielded from the caller's cancellation.

The image must have /bin/sh and `sleep`. A string command runs under `bash -lc`, or `sh -c` when
bash is absent; a list runs as given. An exec returns when its program ends, not when the
children it left in the background let go of its output (`docker exec` waits for those): they
keep running, and their later output is not read (a running exec is asked about once a second).
Output: each stream keeps its first `max_output` bytes and counts the rest. A command killed by
signal N exits 128 + N (137: SIGKILL, the OOM killer's).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import aiohttp

from envs.boxes.aliases import load_aliases
from envs.boxes.base import BASE_IMAGE
from envs.boxes.docker_build import Builder
from envs.boxes.docker_engine import (
    STDERR,
    STDOUT,
    ApiError,
    Engine,
    Output,
    first_member,
    tar_bytes,
    tar_dir,
    untar_into,
)
from envs.boxes.docker_scripts import KILL, WRAP_ARGV, WRAP_STRING
from envs.sdk.sandbox import (
    DEFAULT_MAX_OUTPUT,
    LABEL_EXPIRES,
    LABEL_NAMESPACE,
    LABEL_TASK,
    LABEL_WORKER,
    ExecResult,
    ImageSpec,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
    SandboxStartError,
    SandboxUnavailable,
)

__all__ = ["DockerBackend", "DockerSandbox"]

_WATCH_S = 1.0  # at most this long between asking whether a running exec's program has ended
_DRAIN_S = 0.1  # output read after the program ended, while its background children hold the streams
_GRACE_S = 3.0  # how long a killed command's stream may take to end before it is dropped
_KILL_TIMEOUT_S = 20.0
_CANNOT_START = 126  # an exec's status when its process could not start (no pid left to fork)
_KILL_STARTS = 10


class DockerSandbox:
    def __init__(self, backend: "DockerBackend", sandbox_id: str, init: bool, workdir: str):
        self.id = sandbox_id
        self._backend = backend
        self._engine = backend.engine
        self._init = init
        self._workdir = workdir
        self._closed = False

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self._workdir.rstrip('/')}/{path}"

    async def _exec_open(
        self, argv: Sequence[str], cwd: Optional[str], env: Optional[Mapping[str, str]], user: Optional[str]
    ) -> tuple[str, aiohttp.ClientResponse]:
        if self._closed:
            raise SandboxError(f"sandbox {self.id[:12]} is closed")
        body: dict = {"Cmd": list(argv), "AttachStdout": True, "AttachStderr": True, "Tty": False}
        given = {"WorkingDir": cwd, "Env": [f"{k}={v}" for k, v in (env or {}).items()], "User": user}
        body.update({k: v for k, v in given.items() if v})
        exec_id = (await self._engine.call("POST", f"/containers/{self.id}/exec", body=body))["Id"]
        resp = await self._engine.open(
            "POST", f"/exec/{exec_id}/start", body={"Detach": False, "Tty": False}, timeout_s=None
        )
        return exec_id, resp

    async def _exit_code(
        self, exec_id: str, deadline: float, every_s: float = 0.2, delay: float = 0.0
    ) -> Optional[int]:
        """The exec's exit code once it has exited (asked after `delay`, then at doubling intervals
        up to `every_s`); None when it still runs at `deadline`."""
        while True:
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            state = await self._engine.call("GET", f"/exec/{exec_id}/json")
            if not state.get("Running") and state.get("ExitCode") is not None:  # None: not started yet
                return int(state["ExitCode"])
            if time.monotonic() >= deadline:
                return None
            delay = min(max(delay * 2, 0.005), every_s)

    async def exec(
        self,
        cmd: Union[str, Sequence[str]],
        timeout_s: float,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        began = time.monotonic()
        deadline = began + timeout_s
        if isinstance(cmd, str):
            argv = ["/bin/sh", "-c", WRAP_STRING, "sh", cmd]
        else:
            argv = ["/bin/sh", "-c", WRAP_ARGV, "sh", *cmd]
        exec_id, resp = await self._exec_open(argv, cwd, env, user)
        out = Output(max_output)
        reader = asyncio.ensure_future(out.read(resp))
        # The program may end while children it left in the background still hold its output open.
        watcher = asyncio.ensure_future(self._exit_code(exec_id, deadline, _WATCH_S, delay=0.1))
        code: Optional[int] = None
        try:
            await asyncio.wait(
                {reader, watcher}, timeout=max(deadline - time.monotonic(), 0), return_when="FIRST_COMPLETED"
            )
            if reader.done():  # the streams ended; the command may still run with both closed
                watcher.cancel()
                code = await self._exit_code(exec_id, deadline)
            elif watcher.done():  # the program ended: what it wrote is read, its children's is not waited for
                code = watcher.result()
                await asyncio.wait({reader}, timeout=_DRAIN_S)
            if code is None:
                await self._end(out.pid)
                await asyncio.wait({reader}, timeout=_GRACE_S)
        except BaseException:  # cancelled (or the daemon failed): the command must not outlive its caller
            await asyncio.shield(self._end(out.pid))
            raise
        finally:
            reader.cancel()
            watcher.cancel()
            resp.close()
        return ExecResult(
            exit_code=-1 if code is None else code,
            stdout=out.text(STDOUT),
            stderr=out.text(STDERR),
            stdout_dropped=out.dropped[STDOUT],
            stderr_dropped=out.dropped[STDERR],
            timed_out=code is None,
            duration_s=time.monotonic() - began,
        )

    async def _end(self, session: Optional[int]) -> None:
        """End an exec's session (everything but PID 1 when its pid is unknown); remove the sandbox
        when the killer cannot run or leaves something alive."""
        if self._closed:
            return
        try:
            if await self._kill(session or 0) == 0:
                return
        except SandboxError:
            pass
        try:
            await self.close()
        except SandboxError:
            pass  # the daemon is gone too; the container's lifetime still ends it

    async def _kill(self, session: int) -> Optional[int]:
        argv = ["/bin/sh", "-c", KILL, "farm-kill", str(session), "1" if self._init else "0"]
        exec_id, resp = await self._exec_open(argv, "/", None, "0")
        try:
            await asyncio.wait_for(Output(4096, expect_pid=False).read(resp), _KILL_TIMEOUT_S)
        except asyncio.TimeoutError:
            return None
        finally:
            resp.close()
        return await self._exit_code(exec_id, time.monotonic() + _GRACE_S)

    async def kill_all(self) -> None:
        try:
            for attempt in range(_KILL_STARTS):
                code = await self._kill(0)
                if code != _CANNOT_START:
                    break
                # Every pid held (a fork bomb at the pids limit): the killer's own process could not
                # start. The bomb's processes come and go, so a slot frees within moments.
                await asyncio.sleep(0.05 * (attempt + 1))
            if code == 0:
                return
            reasons = {None: "the killer did not end in time", 1: "processes survived 50 passes of SIGKILL"}
            reasons[_CANNOT_START] = f"the killer could not start in {_KILL_STARTS} tries: every pid is held"
            why = reasons.get(code, f"the killer exited {code}")
        except SandboxError as e:
            why = str(e)
        await self.close()
        raise SandboxError(f"sandbox {self.id[:12]}: could not end its processes ({why}); removed it")

    async def close(self) -> None:
        self._closed = True
        await asyncio.shield(self._backend.remove(self.id))

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        path = self._path(path)
        parent, _, name = path.rpartition("/")
        try:
            await self._put(parent or "/", tar_bytes(name, data, mode))
        except ApiError as e:
            if e.status != 404:
                raise
            await self._put("/", tar_bytes(path.lstrip("/"), data, mode))  # the daemon makes the parents

    async def _put(self, where: str, tar: bytes) -> None:
        headers = {"Content-Type": "application/x-tar"}
        await self._engine.call(
            "PUT", f"/containers/{self.id}/archive", params={"path": where}, data=tar, headers=headers
        )

    async def _get(self, path: str) -> bytes:
        try:
            return await self._engine.call("GET", f"/containers/{self.id}/archive", params={"path": path})
        except ApiError as e:
            if e.status == 404:
                raise SandboxError(f"[Errno 2] No such file or directory: '{path}'") from None
            raise

    async def read_file(self, path: str, max_bytes: int = 1 << 20) -> bytes:
        path = self._path(path)
        for _ in range(8):  # a symlink is followed a few levels deep; a file torn by a rewrite is read again
            kind, body = first_member(await self._get(path), max_bytes)
            if kind == "file":
                return body
            if kind == "dir":
                raise SandboxError(f"[Errno 21] Is a directory: '{path}'")
            if kind == "link":
                target = body.decode()
                path = target if target.startswith("/") else f"{path.rpartition('/')[0]}/{target}"
        raise SandboxError(f"cannot read '{path}': too many levels of symbolic links, or rewritten on every read")

    async def upload_dir(self, src: Path, dest: str) -> None:
        dest = self._path(dest).rstrip("/") or "/"
        try:
            await self._put(dest, tar_dir(src, "."))
        except ApiError as e:
            if e.status != 404:
                raise
            await self._put("/", tar_dir(src, dest.lstrip("/")))

    async def download_dir(self, src: str, dest: Path) -> None:
        untar_into(await self._get(self._path(src).rstrip("/") or "/"), dest)


class DockerBackend:
    """Sandboxes in a Docker daemon. `host`: the daemon's address (else DOCKER_HOST, else the
    default socket); `aliases`: FROM patterns to images (else FARM_SANDBOX_BASE_ALIASES, else
    aliases.DEFAULT_ALIASES); `namespace` / `worker`: the labels a spec that names none gets;
    `base_image`: what `check` requires. Call `aclose()` when done (the connection pool)."""

    name = "docker"

    def __init__(
        self,
        host: Optional[str] = None,
        aliases: Optional[Mapping[str, str]] = None,
        namespace: str = "farm",
        worker: Optional[str] = None,
        base_image: str = BASE_IMAGE,
    ):
        self.engine = Engine(host)
        self.builder = Builder(self.engine, load_aliases(aliases))
        self.namespace = namespace
        self.worker = worker or f"{socket.gethostname()}:{os.getpid()}"
        self.base_image = base_image

    async def aclose(self) -> None:
        await self.engine.close()

    async def check(self) -> None:
        try:
            await self.engine.call("GET", "/_ping", timeout_s=self.engine.connect_timeout_s)
        except ApiError as e:
            raise SandboxUnavailable(
                f"docker daemon at {self.engine.host} answered its ping with an error: {e}"
            ) from None
        try:
            await self.engine.call("GET", f"/images/{self.base_image}/json")
        except ApiError as e:
            if e.status != 404:
                raise SandboxUnavailable(f"docker daemon at {self.engine.host}: {e}") from None
            raise SandboxUnavailable(f"the base image {self.base_image} is absent: run `farm sandbox base`") from None

    async def build(self, image: ImageSpec) -> str:
        try:
            return await self.builder.build(image)
        except SandboxStartError:
            raise
        except SandboxError as e:
            raise SandboxStartError(str(e)) from None

    def _create_body(self, spec: SandboxSpec, features: dict) -> dict:
        labels = {LABEL_NAMESPACE: self.namespace, LABEL_WORKER: self.worker, LABEL_TASK: ""}
        labels.update(spec.labels)
        labels[LABEL_EXPIRES] = str(int(time.time() + spec.lifetime_s))
        memory = spec.memory_mb * 1024 * 1024
        host: dict = {
            "NanoCpus": int(min(spec.cpus, features["ncpu"]) * 1e9),
            "Memory": memory,
            "MemorySwap": memory,
            "PidsLimit": spec.pids,
            "NetworkMode": "bridge" if spec.network else "none",
            "AutoRemove": True,
            "Init": features["init"],
        }
        if spec.mounts:
            host["Binds"] = [f"{src}:{dest}:ro" for src, dest in spec.mounts.items()]
        if features["size"]:
            host["StorageOpt"] = {"size": f"{spec.disk_mb}M"}
        return {
            "Image": spec.image,
            "Cmd": ["sleep", str(max(math.ceil(spec.lifetime_s), 1))],
            "Labels": labels,
            "Env": [f"{k}={v}" for k, v in spec.env.items()],
            "WorkingDir": spec.workdir,
            "HostConfig": host,
        }

    async def start(self, spec: SandboxSpec) -> DockerSandbox:
        sandbox_id = ""
        try:
            features = await self.engine.features()
            name = f"rollout-farm-{uuid.uuid4().hex[:12]}"
            created = await self.engine.call(
                "POST", "/containers/create", params={"name": name}, body=self._create_body(spec, features)
            )
            sandbox_id = created["Id"]
            await self.engine.call("POST", f"/containers/{sandbox_id}/start")
            return DockerSandbox(self, sandbox_id, features["init"], spec.workdir)
        except BaseException as e:
            if sandbox_id:
                await asyncio.shield(self.remove(sandbox_id))
            if isinstance(e, ApiError) and e.status == 404 and not sandbox_id:
                raise SandboxStartError(
                    f"image {spec.image} does not exist here (no registry): build it, or run `farm sandbox base`"
                ) from None
            if isinstance(e, SandboxError) and not isinstance(e, SandboxStartError):
                raise SandboxStartError(f"sandbox from {spec.image} did not start: {e}") from None
            raise

    async def list(self, namespace: str) -> list[SandboxInfo]:
        filters = json.dumps({"label": [f"{LABEL_NAMESPACE}={namespace}"]})
        found = await self.engine.call("GET", "/containers/json", params={"all": "1", "filters": filters})
        return [
            SandboxInfo(id=c["Id"], labels=c.get("Labels") or {}, running=c.get("State") == "running") for c in found
        ]

    async def remove(self, sandbox_id: str) -> None:
        try:
            await self.engine.call("DELETE", f"/containers/{sandbox_id}", params={"force": "1"})
        except ApiError as e:
            if e.status not in (404, 409):  # gone, or its removal already under way (--rm at lifetime's end)
                raise
