"""The settings of one judge (`judges: {NAME: ...}` in farm.settings; docs/judges.md).

A module of its own so that farm/settings.py stays one screenful of the farm's own settings;
`farm.settings` re-exports JudgeConfig.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

import msgspec

__all__ = ["JudgeConfig"]


class JudgeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One judge: a model endpoint that grades rollouts and is never trained (vLLM, the embedded
    CPU server, a hosted OpenAI-compatible API), asked through `ctx.judge(name, messages)`.

    `max_concurrency` bounds the judge's requests in flight across every rollout of a worker
    process; `deadline_s` bounds one call, waiting for a slot included (past it the rollout fails
    as `verifier`). `api_key` names where the key is (a file path, or an environment variable's
    name), never the key itself. URLs are kept as the server root, as the policy's are."""

    urls: list[str]
    model: str
    sampling: dict[str, Any] = {}
    max_concurrency: int = 32
    deadline_s: float = 60.0
    api_key: Optional[str] = None
    max_retries: int = 2

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a judge needs urls (one or more http(s) URLs)")
        bad = [u for u in self.urls if not re.match(r"^https?://[^/\s]+", u)]
        if bad:
            raise ValueError(f"judge URL {bad[0]!r} must start with http:// or https://")
        self.urls = [re.sub(r"/v1$", "", u.strip().rstrip("/")).rstrip("/") for u in self.urls]
        if not self.model:
            raise ValueError("a judge needs model (the model name its server serves)")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if not (self.deadline_s > 0 and math.isfinite(self.deadline_s)):
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
