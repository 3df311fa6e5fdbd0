"""The stub in a process of its own (so its CPU is not the client's), restartable on one port.

Keyword options beyond latency_s and jitter_s are the server's command-line options by name
(`latency_dist="lognormal"`, `sigma=1.0`, `seed=0`, `pick="random"`, `weights=[3, 1]`,
`fault=503`, `prefix_cache_tokens=65536`, `prefill_s_per_token=2e-5`, `engine=True`, ...); the same names
change them at run time through `control()`. `prefix_cache()` reads the replica's prefix-cache
counters.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import msgspec

from farm.embedded import free_port
from workers.policy.stub.model import Script

ROOT = Path(__file__).resolve().parents[3]
_json = msgspec.json


class StubProcess:
    """The stub in a process of its own (so its CPU is not the client's), restartable on one port."""

    def __init__(
        self,
        script: Script,
        *,
        latency_s: float = 0.05,
        jitter_s: float = 0.0,
        port: int = 0,
        log_path: Optional[Path] = None,
        workdir: Optional[Path] = None,
        **options: Any,
    ):
        self.port = port or free_port()
        self.served_model_name = script.model  # the name its /v1/models lists, as vLLM's served name
        self.workdir = Path(workdir or os.environ.get("TMPDIR", "/tmp"))
        self.script_path = self.workdir / f"policy-stub-{self.port}.json"
        self.script_path.write_bytes(_json.encode(script))
        self.log_path = log_path or self.workdir / f"policy-stub-{self.port}.log"
        self.args = ["--latency", str(latency_s), "--jitter", str(jitter_s)]
        for key, value in options.items():
            if isinstance(value, bool):  # a flag (engine=True): named or left out
                self.args += [f"--{key.replace('_', '-')}"] if value else []
                continue
            if isinstance(value, (list, tuple)):
                value = ",".join(map(str, value))
            if value is not None:
                self.args += [f"--{key.replace('_', '-')}", str(value)]
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "StubProcess":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "workers.policy.stub",
                    "--port",
                    str(self.port),
                    "--replies",
                    str(self.script_path),
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"policy stub exited with {self.proc.returncode}: "
                    f"{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            try:
                self.get("/stats")
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"policy stub did not answer on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        """SIGKILL: every open connection drops at once, as when a replica dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as resp:
            return _json.decode(resp.read())

    def control(self, **change: Any) -> dict:
        req = urllib.request.Request(
            self.url + "/control",
            data=_json.encode(change),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return _json.decode(resp.read())

    def stats(self) -> dict:
        return self.get("/stats")

    def prefix_cache(self) -> dict:
        """The prefix cache's counters: requests, prompt_tokens, cached_tokens, prefilled_tokens, ..."""
        return self.stats()["prefix_cache"]

    def aborts(self) -> list[dict]:
        """The requests whose clients closed their connections unanswered: {"received", "closed"} epoch s."""
        return self.get("/aborts")

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> "StubProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
