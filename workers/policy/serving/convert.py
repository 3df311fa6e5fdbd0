"""Dequantize SmolLM2's GGUF file into a plain float32 Hugging Face directory.

Run by the serving virtualenv's python (it has torch, transformers and gguf; the farm's own
environment need not): `python convert.py GGUF_FILE OUTPUT_DIR`. It dequantizes the GGUF
(GgufConfig(dequantize=True)) and saves a plain float32 checkpoint. transformers refuses to save a
model that still carries its GGUF quantizer ("quantized with gguf and is not serializable"), so
the quantizer reference and the config's quantization_config are dropped first: after
dequantizing they describe nothing that is left in the weights. A short greedy generation checks
the weights before they are saved, and the tokenizer config names a class that transformers 4
and 5 both load.

Lines starting with `farm: ` are echoed by the caller as progress.
"""

import json
import sys
import time
from pathlib import Path


def portable_tokenizer_config(settings: dict) -> dict:
    """transformers 5 names its own backend class and loading flags; name the class version 4 knows too."""
    settings = dict(settings)
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        settings.pop(key, None)
    return settings


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from transformers import GgufConfig

        quant = {"quantization_config": GgufConfig(dequantize=True)}
    except ImportError:
        quant = {}

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
    print(
        f"farm: loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in "
        f"{time.monotonic() - started:.0f}s",
        flush=True,
    )

    # Smoke test before saving: a dequantization gone wrong shows up as gibberish here.
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        reply = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    print(
        "farm: smoke test:",
        repr(tokenizer.decode(reply[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)),
        flush=True,
    )

    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    path = out / "tokenizer_config.json"
    path.write_text(json.dumps(portable_tokenizer_config(json.loads(path.read_text())), indent=2) + "\n")
    for file in out.iterdir():
        file.chmod(0o644)  # safetensors writes 0600; a server running as another user must read it


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
