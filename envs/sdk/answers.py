"""Answer extraction for verifiers: pulling the final answer out of a model's text.

Shared so that environments grading the same answer format read it the same way (math and
mcqa both take the last `\\boxed{...}`). Module-level functions, so a verifier can run them in
a process pool.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["last_boxed"]


def last_boxed(text: str) -> Optional[str]:
    """The content of the last `\\boxed{...}`, braces balanced and stripped; None when there is none
    or it is not closed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None
