"""A worker's health probe: `farm worker --health-port PORT` serves /healthz and /readyz, `farm health` asks.

What "healthy" means is what the rest of the farm already trusts: the worker's heartbeat key
(`{ns}:worker:{id}`, written by the maintenance loop every heartbeat_ttl_s / 3, expiring after
heartbeat_ttl_s). Each probe reads that key from Redis over a fresh connection with a short
timeout, so one answer covers both ways a worker silently stops working:

- Redis unreachable, or refusing the credentials: `redis unreachable: ...`;
- the heartbeat missing or older than heartbeat_ttl_s: the event loop is blocked (a verifier
  that never yields), or the maintenance loop is stuck.

/healthz (liveness) is ok while both hold. /readyz (readiness) also needs the worker to be
taking work: not stopping (draining after SIGTERM) and its agent able to (some policy replica
up). The answer is 200 or 503 with a JSON body saying why. The server runs in a thread of its
own (stdlib only, no extra needed), so it still answers, with 503, while the event loop is stuck.

`farm health` is the client for places that cannot send HTTP themselves (Docker's HEALTHCHECK,
an exec probe): exit 0 with one line when ok, exit 1 with the reason otherwise (Docker reads 1
as unhealthy), whatever the failure, a 503 or no answer at all.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from farm.connection import connect_sync
from farm.errors import ConfigError, FarmError, TransportError
from farm.settings import Settings
from farm.transport import errors

log = logging.getLogger("farm.health")

PROBE_TIMEOUT_S = 2.0  # one probe's Redis round trip; the kubelet's default probe timeout is 1 s, ours 3 s


class Unhealthy(FarmError):
    """`farm health` found the worker not ok (exit 1: what Docker's HEALTHCHECK reads as unhealthy)."""


@dataclass
class Health:
    ok: bool
    reason: str
    worker: str
    agent: str
    heartbeat_age_s: Optional[float] = None
    inflight: int = 0
    checks: dict[str, bool] = field(default_factory=dict)


def heartbeat_age(settings: Settings, worker_id: str, now: Optional[float] = None) -> Optional[float]:
    """Seconds since the worker's last heartbeat as Redis holds it; None when there is none.
    Raises the farm's TransportError when Redis cannot be asked."""
    probe = settings.replace(socket_timeout_s=max(PROBE_TIMEOUT_S, settings.block_ms / 1000 + 1.0))
    r = connect_sync(probe)
    try:
        with errors(settings.redis_url):
            raw = r.get(settings.keys.worker(worker_id))
    finally:
        r.close()
    if raw is None:
        return None
    try:
        ts = float(json.loads(raw)["ts"])
    except (ValueError, KeyError, TypeError):
        return None
    return max(0.0, (time.time() if now is None else now) - ts)


def check(worker: Any, ready: bool) -> Health:
    """The worker's health now (liveness), or whether it takes work (readiness, `ready=True`)."""
    s: Settings = worker.settings
    h = Health(False, "", worker.worker_id, worker.agent_name, inflight=len(worker.inflight))
    try:
        h.heartbeat_age_s = heartbeat_age(s, worker.worker_id)
        h.checks["redis"] = True
    except TransportError as exc:
        h.checks["redis"] = False
        h.reason = f"redis unreachable: {exc}"
        return h
    h.checks["heartbeat"] = h.heartbeat_age_s is not None and h.heartbeat_age_s <= s.heartbeat_ttl_s
    if h.heartbeat_age_s is None:
        h.reason = (
            f"heartbeat stale: none in Redis (not written yet, or expired after heartbeat_ttl_s = "
            f"{s.heartbeat_ttl_s:g}s)"
        )
        return h
    if not h.checks["heartbeat"]:
        h.reason = f"heartbeat stale: last beat {h.heartbeat_age_s:.1f}s ago (heartbeat_ttl_s = {s.heartbeat_ttl_s:g}s)"
        return h
    if ready:
        h.checks["running"] = not worker.stopping
        h.checks["agent_ready"] = worker.agent_ready()
        if worker.stopping:
            h.reason = "stopping: draining in-flight rollouts, fetching no new tasks"
            return h
        if not h.checks["agent_ready"]:
            h.reason = "the agent cannot take work (no policy replica available)"
            return h
    h.ok, h.reason = True, f"heartbeat {h.heartbeat_age_s:.1f}s ago"
    return h


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        path = self.path.split("?", 1)[0]
        if path not in ("/healthz", "/readyz"):
            self._send(404, {"ok": False, "reason": f"no such path {path}: /healthz or /readyz"})
            return
        h = check(self.server.worker, ready=path == "/readyz")
        self._send(200 if h.ok else 503, {"status": "ok" if h.ok else "not ok", **asdict(h)})

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug("health probe: " + format, *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    worker: Any


class HealthServer:
    """/healthz and /readyz of one worker on host:port, from a daemon thread; `close()` stops it."""

    def __init__(self, worker: Any, port: int, host: str = "127.0.0.1"):
        try:
            self.httpd = _Server((host, port), _Handler)  # binds now: a port in use fails the worker at start
        except OSError as exc:
            raise ConfigError(
                f"cannot serve the health port {host}:{port} ({exc.strerror}): pick another --health-port "
                "(FARM_HEALTH_PORT)"
            ) from None
        self.httpd.worker = worker
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="health", daemon=True)

    def start(self) -> "HealthServer":
        self.thread.start()
        host, port = self.httpd.server_address[:2]
        log.info("worker health on http://%s:%d/healthz and /readyz", host, port)
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def probe_host(listen_host: str) -> str:
    """Where a local client reaches a server bound to listen_host (every interface: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(listen_host, listen_host)


def run_health(url: str, timeout_s: float) -> str:
    """Ask a health endpoint; its one-line verdict when ok, else Unhealthy with the reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            code, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        raise Unhealthy(f"not healthy: {url} answered {exc.code}{_reason(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        raise Unhealthy(
            f"not healthy: no answer from {url} ({why}): is the worker running with --health-port "
            "(FARM_HEALTH_PORT) on that port?"
        ) from None
    return f"ok: {url} answered {code}{_reason(body)}"


def _reason(body: bytes) -> str:
    """`: worker-id reason` from a worker's JSON answer; nothing for other bodies (vLLM, the dashboard)."""
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if isinstance(data, dict) and "reason" in data:
        return f": {data.get('worker', '')} {data['reason']}".rstrip()
    return ""
