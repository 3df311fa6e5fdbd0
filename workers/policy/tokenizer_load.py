"""The tokenizer `AutoTokenizer` gives for a model directory, without importing torch where it can.

transformers' `AutoTokenizer` imports torch (through its config classes) to decide which tokenizer
class a model uses: about 4 s of a core on the farm's 2-core machine, in every worker and policy
stub that starts, where the whole load takes 1.7 s without it (`bench/tokenizer_load.py`). The
class it decides on is the only thing it adds: whichever branch it takes ends in
`that_class.from_pretrained(path)`. So the class it chose for a directory is remembered, and later
loads call that class's `from_pretrained` directly.

The memo is keyed by the directory's real path, transformers' version and the size and
modification time of the files the choice reads (`tokenizer_config.json`, `config.json`,
`tokenizer.json`): a change to any of them, or a new transformers, decides again. Only classes
transformers exports are remembered (not a repository's own code), and only for local
directories. It lives in `$XDG_CACHE_HOME/rollout-farm/tokenizer-classes.json` (by default under
`~/.cache`), written whole and renamed into place; an unreadable or foreign memo is ignored.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

# The files AutoTokenizer reads to choose a class (tokenizer.json: whether a fast backend exists).
_CHOICE_FILES = ("tokenizer_config.json", "config.json", "tokenizer.json")
_MAX_ENTRIES = 256  # model directories remembered; the oldest go first


def memo_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rollout-farm" / "tokenizer-classes.json"


def load_tokenizer(path: str) -> Any:
    """`AutoTokenizer.from_pretrained(path)`, through the class it chose before for this directory."""
    key = _key(path)
    name = _read().get(key) if key else None
    if name:
        import transformers

        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedTokenizerBase):
            return cls.from_pretrained(path)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if key:
        _remember(key, type(tok))
    return tok


def _key(path: str) -> Optional[str]:
    """The directory and what its class choice depends on; None for a hub name or an unreadable directory."""
    if not os.path.isdir(path):
        return None
    real = os.path.realpath(path)
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None
    stats = []
    for name in _CHOICE_FILES:
        try:
            st = os.stat(os.path.join(real, name))
        except FileNotFoundError:
            stats.append(None)
        except OSError:
            return None
        else:
            stats.append([st.st_size, st.st_mtime_ns])
    return json.dumps([real, version, stats])


def _read() -> dict[str, str]:
    try:
        data = json.loads(memo_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def _remember(key: str, cls: type) -> None:
    import transformers

    if not cls.__module__.startswith("transformers.") or getattr(transformers, cls.__name__, None) is not cls:
        return  # a repository's own class (trust_remote_code), or one transformers does not export
    memo = _read()
    memo.pop(key, None)
    memo[key] = cls.__name__
    while len(memo) > _MAX_ENTRIES:
        memo.pop(next(iter(memo)))
    from envs.data import DataError, atomic_output

    target = memo_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(target) as f:
            f.write(json.dumps(memo))
    except (OSError, DataError):  # a read-only home: every load decides again, as AutoTokenizer does
        pass
