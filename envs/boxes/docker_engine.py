"""The Docker Engine API over its socket, for the docker sandbox backend (envs/boxes/docker.py).

Why the API and not the `docker` command: an agentic batch runs thousands of execs, and each
`docker exec` is a Go client process (tens of milliseconds of CPU, tens of MB); an HTTP request
over a kept-open Unix socket is neither. aiohttp is already a dependency of the policy client.

Where the daemon is: the `host` argument, else DOCKER_HOST, else unix:///var/run/docker.sock
(`unix://PATH` or a bare path; `tcp://HOST:PORT` without TLS). Paths are unversioned, so the
daemon answers in its own API version (the fields used here are in every version since 1.40).

Errors at this boundary: a daemon that does not answer (no socket, refused, timed out) is
SandboxUnavailable naming the address; an HTTP error status is `ApiError` (a SandboxError with
the status and the daemon's message). Callers turn these into start errors where the protocol
asks for them.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Mapping, Optional

import aiohttp

from envs.sdk.sandbox import SandboxError, SandboxUnavailable

__all__ = ["ApiError", "Engine", "Output", "default_host", "first_member", "tar_bytes", "tar_dir", "untar_into"]

DEFAULT_SOCKET = "/var/run/docker.sock"
STDOUT, STDERR = 1, 2


class ApiError(SandboxError):
    """The daemon answered with an error status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def default_host(env: Optional[Mapping[str, str]] = None) -> str:
    return (os.environ if env is None else env).get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Engine:
    """One connection pool to one daemon, made in the event loop that first uses it."""

    def __init__(self, host: Optional[str] = None, connect_timeout_s: float = 5.0, request_timeout_s: float = 120.0):
        self.host = host or default_host()
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._session: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._features: Optional[dict] = None

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector: aiohttp.BaseConnector
            if self.host.startswith("tcp://"):
                connector, base = aiohttp.TCPConnector(limit=0), "http://" + self.host[len("tcp://") :]
            else:
                path = self.host[len("unix://") :] if self.host.startswith("unix://") else self.host
                connector, base = aiohttp.UnixConnector(path=path, limit=0), "http://docker"
            # limit=0: every running exec holds a connection while it streams; the sandbox count bounds them.
            self._session = aiohttp.ClientSession(base_url=base, connector=connector)
            self._loop = loop
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def features(self) -> dict:
        """Once per engine: the host's CPUs, whether the daemon has docker-init, and whether its
        storage driver enforces a size (overlay2 on xfs with project quotas, btrfs, zfs)."""
        if self._features is None:
            info = await self.call("GET", "/info")
            version = await self.call("GET", "/version")
            parts = {c.get("Name"): c.get("Version") for c in version.get("Components") or []}
            status = {k: v for k, v in info.get("DriverStatus") or [] if isinstance(k, str)}
            xfs = info.get("Driver") == "overlay2" and status.get("Backing Filesystem") == "xfs"
            self._features = {
                "ncpu": info.get("NCPU") or os.cpu_count() or 1,
                "init": parts.get("docker-init") not in (None, "", "N/A") and bool(info.get("InitBinary")),
                "size": xfs or info.get("Driver") in ("btrfs", "zfs"),
            }
        return self._features

    def _timeout(self, total: Optional[float]) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=total, sock_connect=self.connect_timeout_s)

    def down(self, reason: object) -> SandboxUnavailable:
        why = _one_line(str(reason)) or type(reason).__name__
        return SandboxUnavailable(
            f"docker daemon at {self.host} does not answer ({why}): start dockerd or set DOCKER_HOST"
        )

    async def open(
        self,
        method: str,
        path: str,
        *,
        params: Optional[Mapping[str, str]] = None,
        body: Any = None,
        data: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout_s: Optional[float] = -1.0,
    ) -> aiohttp.ClientResponse:
        """The response, its status checked (ApiError otherwise); the caller reads and releases it."""
        total = self.request_timeout_s if timeout_s == -1.0 else timeout_s
        try:
            resp = await self._client().request(
                method, path, params=params, json=body, data=data, headers=headers, timeout=self._timeout(total)
            )
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError, asyncio.TimeoutError) as e:
            raise self.down(e) from None
        if resp.status >= 400:
            text = await resp.text(errors="replace")
            resp.release()
            try:
                message = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                message = text
            raise ApiError(resp.status, _one_line(message) or f"HTTP {resp.status}")
        return resp

    async def call(self, method: str, path: str, **kw: Any) -> Any:
        """A request whose whole answer is read: JSON decoded when it is JSON, else bytes."""
        resp = await self.open(method, path, **kw)
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise self.down(e) from None
        finally:
            resp.release()
        if resp.content_type == "application/json" and raw:
            return json.loads(raw)
        return raw

    async def lines(self, resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
        """A JSON-lines stream (build progress), one object at a time."""
        try:
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
        except (aiohttp.ClientError, OSError) as e:
            raise self.down(e) from None
        finally:
            resp.release()


class Output:
    """An exec's two streams, each kept up to `limit` bytes, the rest counted; the first stdout line
    is the wrapper's pid (read off before the command's output)."""

    def __init__(self, limit: int, expect_pid: bool = True):
        self.limit = limit
        self.kept = {STDOUT: bytearray(), STDERR: bytearray()}
        self.dropped = {STDOUT: 0, STDERR: 0}
        self.head = bytearray()
        self.pid: Optional[int] = None if expect_pid else 0

    def add(self, stream: int, chunk: bytes) -> None:
        if stream == STDOUT and self.pid is None:
            self.head += chunk
            if b"\n" not in self.head:
                return
            line, _, rest = bytes(self.head).partition(b"\n")
            # Not a pid: the wrapper never ran and this is the runtime's reason (e.g. no such cwd).
            if line.strip().isdigit():
                self.pid, chunk = int(line), rest
            else:
                self.pid, chunk, stream = 0, bytes(self.head), STDERR
        if stream not in self.kept:
            stream = STDERR
        room = self.limit - len(self.kept[stream])
        self.kept[stream] += chunk[: max(room, 0)]
        self.dropped[stream] += max(len(chunk) - max(room, 0), 0)

    async def read(self, resp: aiohttp.ClientResponse) -> None:
        """Demultiplex Docker's raw stream (8-byte frame headers: stream, 0, 0, 0, big-endian size)."""
        content = resp.content
        try:
            while True:
                header = await content.readexactly(8)
                self.add(header[0], await content.readexactly(int.from_bytes(header[4:8], "big")))
        except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            return  # the stream ends when the daemon closes it: the command and its pipes are done

    def text(self, stream: int) -> str:
        return bytes(self.kept[stream]).decode("utf-8", errors="replace")


def tar_bytes(name: str, data: bytes, mode: int) -> bytes:
    """A tar of one regular file at `name` (relative; the daemon makes its missing parents)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_dir(src: Path, arcname: str, replace: Optional[Mapping[str, bytes]] = None) -> bytes:
    """A tar of `src`'s tree under `arcname` (`.` for the root); `replace` swaps the content of
    some files (by path relative to src), the way the build sends its rewritten Dockerfile."""
    replace = replace or {}
    buf = io.BytesIO()

    def swap(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted([src, *src.rglob("*")]):
            rel = path.relative_to(src).as_posix()
            if rel == "." and arcname == ".":
                continue
            name = arcname if rel == "." else f"{arcname}/{rel}" if arcname != "." else rel
            if rel in replace:
                info = swap(tar.gettarinfo(str(path), arcname=name))
                info.size = len(replace[rel])
                tar.addfile(info, io.BytesIO(replace[rel]))
            else:
                tar.add(str(path), arcname=name, recursive=False, filter=swap)
    return buf.getvalue()


def first_member(data: bytes, max_bytes: int) -> tuple[str, bytes]:
    """The first member of a tar the daemon sent for one path: ("file", its first max_bytes),
    ("link", its target), ("dir", b""), or ("torn", b"") when the tar ends early (the file was
    rewritten while the daemon sent it: its header promised more bytes than followed)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            member = tar.next()
            if member is None or member.isdir():
                return "dir", b""
            if member.issym():
                return "link", member.linkname.encode()
            f = tar.extractfile(member)
            return "file", f.read(max_bytes) if f else b""
    except tarfile.ReadError:
        return "torn", b""


def untar_into(data: bytes, dest: Path) -> None:
    """Extract a tar the daemon sent for a directory into `dest`, dropping its top directory.
    The sandbox wrote it, so every member goes through tarfile's `data` filter, and one it
    refuses is left out: nothing lands outside `dest`, no device files, no absolute or escaping
    links (a link to /etc/passwd inside the sandbox is not copied)."""

    def safe(member: tarfile.TarInfo, path: str) -> Optional[tarfile.TarInfo]:
        try:
            return tarfile.data_filter(member, path)
        except tarfile.FilterError:
            return None

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        members = []
        for m in tar.getmembers():
            _, _, rest = m.name.partition("/")
            if rest:
                m.name = rest
                members.append(m)
        tar.extractall(dest, members=members, filter=safe)
