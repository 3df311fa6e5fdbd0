"""Weight sync: put the trainer's weights into the farm's vLLM servers and publish a policy version.

Why it works this way on the farm: the workers' vLLM servers are separate processes (often
on other machines), so the trainer cannot hand them tensors. vLLM 0.32 can reload a running
server's weights in place from a directory: `POST /collective_rpc` with
`{"method": "reload_weights", "kwargs": {"weights_path": DIR}}` calls every worker's
`reload_weights` (vllm/v1/worker/gpu_worker.py, inherited by the CPU worker), which re-reads
the checkpoint and copies it into the live parameters. The endpoint exists only when the
server runs with `VLLM_SERVER_DEV_MODE=1`; afterwards `POST /reset_prefix_cache` drops KV
blocks computed with the old weights. `DIR` must be readable by the server (same machine or
a shared filesystem); each sync writes a fresh `v<N>` directory (whole or absent: it is written
as `v<N>.partial` and renamed) and deletes older ones. Version 0 is the trainer's start: the
weights it holds when training begins, pushed before the first rollout, so a run never samples
from what an earlier run left on the servers.

Cost measured on the 2-core CPU box with SmolLM2-135M (float32, 540 MB): save_pretrained
~1-2 s, reload_weights ~2.4 s, reset_prefix_cache ~0.03 s; no restart (a restart costs ~40 s).
With a GPU, TRL's own server mode (`use_vllm: true`, NCCL) is the faster path.

The policy version is an integer the trainer bumps after every successful sync. Every Task
carries the version current when it was submitted; around each sync the trainer announces the
new version on Redis (`loading N` before, `live N` after: farm/policy_version.py), so every
rollout records the version its generation started on, and the one it ended on when weights
changed in between. `{ns}:policy_version` holds the live version for operators (`farm status`).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

import httpx

from farm.errors import FarmError

__all__ = [
    "NoSync",
    "SyncResult",
    "VllmReload",
    "WeightSync",
    "WeightSyncError",
    "save_full_weights",
    "save_whole",
]

log = logging.getLogger("farm.trainer.weights")


class WeightSyncError(FarmError):
    """A server refused or failed to load the new weights."""


@dataclass
class SyncResult:
    version: int
    save_s: float = 0.0
    reload_s: float = 0.0
    path: Optional[str] = None


class WeightSync(Protocol):
    def sync(self, model, tokenizer, version: int) -> SyncResult: ...


def save_full_weights(model, path: Path) -> None:
    """The model's full weights as a plain checkpoint the servers can load. A peft (LoRA) model is
    saved with its adapters merged in, under the base model's parameter names, then unmerged."""
    if not hasattr(model, "merge_adapter"):
        model.save_pretrained(path, safe_serialization=True)
        return
    model.merge_adapter()
    try:
        base = model.get_base_model()
        state = {
            name.replace(".base_layer.", "."): tensor
            for name, tensor in base.state_dict().items()
            if ".lora_" not in name
        }
        base.save_pretrained(path, state_dict=state, safe_serialization=True)
    finally:
        model.unmerge_adapter()


def save_whole(model, tokenizer, path: Path) -> None:
    """Save into `<path>.partial`, then rename it to `path`: a directory named v<N> is always whole,
    whatever stops the save (a full disk, Ctrl-C). A `path` left by an earlier run is replaced."""
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        save_full_weights(model, partial)
        if tokenizer is not None:
            tokenizer.save_pretrained(partial)
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


@dataclass
class NoSync:
    """Bump the version only (the servers keep their weights): for tests and rollout-only runs."""

    def sync(self, model, tokenizer, version: int) -> SyncResult:
        return SyncResult(version=version)


@dataclass
class VllmReload:
    """Save to `weights_dir/v<N>`, then ask every server to reload from there."""

    urls: list[str]
    weights_dir: Path
    timeout_s: float = 300.0
    keep: int = 1
    history: list[SyncResult] = field(default_factory=list)

    def sync(self, model, tokenizer, version: int) -> SyncResult:
        path = Path(self.weights_dir) / f"v{version}"
        t0 = time.perf_counter()
        save_whole(model, tokenizer, path)
        t1 = time.perf_counter()
        for url in self.urls:
            self._reload(url.rstrip("/").removesuffix("/v1"), str(path.resolve()))
        t2 = time.perf_counter()
        result = SyncResult(version=version, save_s=t1 - t0, reload_s=t2 - t1, path=str(path))
        self.history.append(result)
        self._prune(version)
        log.info(
            "policy v%d live on %d server(s): save %.1fs, reload %.1fs",
            version,
            len(self.urls),
            result.save_s,
            result.reload_s,
        )
        return result

    def _reload(self, base: str, path: str) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": path}, "timeout": self.timeout_s}
        try:
            resp = httpx.post(f"{base}/collective_rpc", json=body, timeout=self.timeout_s)
            if resp.status_code == 404:
                raise WeightSyncError(f"{base} has no /collective_rpc: start vLLM with VLLM_SERVER_DEV_MODE=1")
            if resp.status_code != 200:
                raise WeightSyncError(f"{base} refused reload_weights ({resp.status_code}): {resp.text[:300]}")
            httpx.post(f"{base}/reset_prefix_cache", timeout=60).raise_for_status()
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"could not reload weights on {base}: {exc}") from None

    def _prune(self, version: int) -> None:
        """Keep the last `keep` versions this run wrote; older ones, and any an earlier run left, go."""
        kept = {r.version for r in self.history[-self.keep :]}
        for old in Path(self.weights_dir).glob("v*"):
            suffix = old.name[1:]
            if suffix.isdigit() and int(suffix) not in kept:
                shutil.rmtree(old, ignore_errors=True)
