"""A replicated Redis under Sentinel for the failover tests: one primary, replicas, three Sentinels.

Every server is a real redis-server process on 127.0.0.1 and a free port, configured by a file in
the test's tmp dir (a password goes in that file, never in argv). Sentinel is quick here
(down-after-milliseconds 1000), so a killed primary is replaced in a few seconds.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import redis

from farm.embedded import free_port, redis_server_binary

SERVICE = "farmmaster"


class SentinelCluster:
    def __init__(self, root: Path, *, replicas: int = 1, password: Optional[str] = None, down_after_ms: int = 1000):
        self.root, self.password, self.down_after_ms = Path(root), password, down_after_ms
        self.servers: dict[int, subprocess.Popen] = {}
        self.sentinels: dict[int, subprocess.Popen] = {}
        self.primary = free_port()
        self.replica_ports = [free_port() for _ in range(replicas)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def _server_conf(self, port: int, replica_of: Optional[int]) -> Path:
        d = self.root / f"redis-{port}"
        d.mkdir(parents=True, exist_ok=True)
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {d}",
            "appendonly no",
            'save ""',
            f"logfile {d / 'redis.log'}",
            "repl-diskless-sync yes",
            "repl-diskless-sync-delay 0",
        ]
        if self.password:
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        if replica_of:
            lines.append(f"replicaof 127.0.0.1 {replica_of}")
        path = d / "redis.conf"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path

    def start_server(self, port: int, replica_of: Optional[int] = None) -> None:
        conf = self._server_conf(port, replica_of)
        self.servers[port] = subprocess.Popen([redis_server_binary(), str(conf)], stdout=subprocess.DEVNULL)
        self._wait(port)

    def start_sentinel(self) -> int:
        port = free_port()
        d = self.root / f"sentinel-{port}"
        d.mkdir(parents=True, exist_ok=True)
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {d}",
            f"logfile {d / 'sentinel.log'}",
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary} 2",
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}",
            f"sentinel failover-timeout {SERVICE} 5000",
            f"sentinel parallel-syncs {SERVICE} 1",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {SERVICE} {self.password}")
        conf = d / "sentinel.conf"
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o600)
        self.sentinels[port] = subprocess.Popen(
            [redis_server_binary(), str(conf), "--sentinel"], stdout=subprocess.DEVNULL
        )
        return port

    def start(self) -> "SentinelCluster":
        self.start_server(self.primary)
        for port in self.replica_ports:
            self.start_server(port, replica_of=self.primary)
        for _ in range(3):
            self.start_sentinel()
        for port in self.sentinels:
            self._wait(port, sentinel=True)
        self.wait_replicas(len(self.replica_ports))
        return self

    def client(self, port: int, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, password=self.password, socket_timeout=2, **kw)

    def _wait(self, port: int, sentinel: bool = False, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                c = redis.Redis(
                    host="127.0.0.1", port=port, password=None if sentinel else self.password, socket_timeout=1
                )
                c.ping()
                c.close()
                return True
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError(f"redis on port {port} did not answer within {timeout}s")

    def _named(self) -> list[int]:
        """The master's port as each Sentinel that answers names it, in the Sentinels' order."""
        named = []
        for port in self.sentinels:
            try:
                _, master = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).sentinel_get_master_addr_by_name(
                    SERVICE
                )
                named.append(int(master))
            except (redis.RedisError, TypeError):
                continue
        return named

    def master(self) -> int:
        """The master's port as the Sentinels name it (the first that answers)."""
        named = self._named()
        if not named:
            raise AssertionError("no Sentinel names a master")
        return named[0]

    def settled_master(self, timeout: float = 30.0) -> int:
        """The master's port once every Sentinel that answers names the same one and it answers as a
        master: right after a failover one Sentinel may still name the old master, now a replica."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            named = set(self._named())
            try:
                if len(named) == 1 and self.client(port := named.pop()).info("replication")["role"] == "master":
                    return port
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"the Sentinels did not agree on a master within {timeout}s")

    def wait_replicas(self, n: int, timeout: float = 20.0) -> None:
        """Until the master has `n` replicas online and every Sentinel knows them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = self.client(self.master()).info("replication")
                online = sum(1 for k, v in info.items() if k.startswith("slave") and v.get("state") == "online")
                known = all(
                    sum(
                        1
                        for s in redis.Redis(host="127.0.0.1", port=p, socket_timeout=1).sentinel_slaves(SERVICE)
                        if not (s["is_sdown"] or s["is_odown"] or s["is_disconnected"])
                    )
                    >= n
                    for p in self.sentinels
                )
                if online >= n and known:
                    return
            except (redis.RedisError, AssertionError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"the master did not get {n} replicas within {timeout}s")

    def kill_master(self) -> int:
        """SIGKILL the current master (the one every Sentinel names); its port."""
        port = self.settled_master()
        proc = self.servers.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return port

    def wait_failover(self, old: int, timeout: float = 30.0) -> float:
        """Until the Sentinels name a master other than `old` and it answers as one; seconds waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                port = self.master()
                if port != old and self.client(port).info("replication")["role"] == "master":
                    return time.monotonic() - t0
            except (redis.RedisError, AssertionError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"no failover within {timeout}s")

    def stop(self) -> None:
        for proc in [*self.sentinels.values(), *self.servers.values()]:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.sentinels.clear()
        self.servers.clear()
