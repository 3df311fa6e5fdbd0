"""The policy's tokenizer is AutoTokenizer's, without AutoTokenizer's torch import once the class is
known (workers/policy/tokenizer_load.py): every worker and stub that starts paid about 4 s of a core for it.

What a user relies on: the tokenizer is of the class AutoTokenizer gives and encodes and renders the
same, in a fresh process that no longer imports torch; a changed tokenizer file or a corrupt memo
decides again; a class transformers does not export is never remembered.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

from workers.policy import tokenizer_load

PROBE = """
import json, sys
from workers.policy.chat import ChatTokenizer
tok = ChatTokenizer(sys.argv[1])
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
print(json.dumps({
    "class": type(tok.tok).__name__,
    "torch": "torch" in sys.modules,
    "prompt": tok.prompt_ids(messages, None),
    "encode": tok.encode("  Hello <|im_end|> wörld\\n\\n"),
    "eos": [tok.eos, tok.eos_id],
}))
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def tokenizer_dir(tmp_path, model_dir):
    """The prepared model's tokenizer files, without its weights: a directory a test may change."""
    d = tmp_path / "model"
    d.mkdir()
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, d / f.name)
    return d


def probe(path, cache) -> dict:
    env = {"XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_a_second_process_loads_the_class_autotokenizer_chose_without_torch(tokenizer_dir, cache):
    first = probe(tokenizer_dir, cache)
    assert first["torch"] is True  # AutoTokenizer decided: transformers' config classes import torch
    assert tokenizer_load.memo_path().exists()
    second = probe(tokenizer_dir, cache)
    assert second["torch"] is False
    assert second == {**first, "torch": False}
    assert second["class"] == "TokenizersBackend"  # SmolLM2's, as AutoTokenizer gives it


@pytest.mark.slow
def test_a_changed_tokenizer_file_decides_again(tokenizer_dir, cache):
    from transformers import AutoTokenizer

    assert type(tokenizer_load.load_tokenizer(str(tokenizer_dir))).__name__ == "TokenizersBackend"
    config = tokenizer_dir / "tokenizer_config.json"
    data = json.loads(config.read_text())
    config.write_text(json.dumps({**data, "tokenizer_class": "GPT2Tokenizer"}, indent=1))
    expected = type(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    assert expected.__name__ == "GPT2Tokenizer"  # the change matters to AutoTokenizer's choice
    assert type(tokenizer_load.load_tokenizer(str(tokenizer_dir))) is expected
    assert type(tokenizer_load.load_tokenizer(str(tokenizer_dir))) is expected  # and is remembered
    # Under the file's new signature; the old one's entry stays until the memo's oldest are dropped.
    assert sorted(json.loads(tokenizer_load.memo_path().read_text()).values()) == ["GPT2Tokenizer", "TokenizersBackend"]


@pytest.mark.slow
def test_a_corrupt_memo_is_ignored_and_replaced(tokenizer_dir, cache):
    memo = tokenizer_load.memo_path()
    memo.parent.mkdir(parents=True)
    memo.write_text("{not json")
    assert type(tokenizer_load.load_tokenizer(str(tokenizer_dir))).__name__ == "TokenizersBackend"
    assert list(json.loads(memo.read_text()).values()) == ["TokenizersBackend"]
    key = next(iter(json.loads(memo.read_text())))
    for foreign in ("NoSuchTokenizerClass", "AutoConfig"):  # not in transformers; not a tokenizer
        memo.write_text(json.dumps({key: foreign}))
        assert type(tokenizer_load.load_tokenizer(str(tokenizer_dir))).__name__ == "TokenizersBackend"
        assert json.loads(memo.read_text()) == {key: "TokenizersBackend"}


def test_only_classes_transformers_exports_are_remembered(tmp_path, cache):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    key = tokenizer_load._key(str(tmp_path))
    assert key is not None and tokenizer_load._key("HuggingFaceTB/SmolLM2-135M-Instruct") is None

    class OwnTokenizer:  # a repository's own code (trust_remote_code)
        pass

    tokenizer_load._remember(key, OwnTokenizer)
    assert not tokenizer_load.memo_path().exists()
    from transformers import PreTrainedTokenizerFast

    tokenizer_load._remember(key, PreTrainedTokenizerFast)
    assert json.loads(tokenizer_load.memo_path().read_text()) == {key: PreTrainedTokenizerFast.__name__}
