"""Dataset rows in TRL's shape, read as the farm's.

The farm's rows are NeMo Gym's: what the model sees is `responses_create_params` (`input`, a string
or chat messages; optional `tools`). A TRL dataset row has a `prompt` (chat messages, or a text)
and any other columns beside it. `normalize_row` turns the second into the first by adding
`responses_create_params.input` = the prompt, and keeps every original column, so an environment
that reads them (TRL's `environment_factory` classes get them as `reset(**row)`) finds them where
TRL puts them. It is called wherever rows enter the farm: the client's `task()` (so submit, the
trainer and `farm collect` send farm rows), `farm data prepare` and the trainer's dataset reading,
`farm collect`'s reader, and the worker's `read_row` (a row that came in by another way).

It lives in the core because the client calls it; environments import it from envs.sdk.rows.
"""

from __future__ import annotations

from typing import Any

__all__ = ["normalize_row"]


def normalize_row(row: Any) -> Any:
    """`row` with `responses_create_params.input` set to its TRL `prompt`, every column kept; a row
    that already has `responses_create_params` (or has no `prompt`, or is not a dict) is returned as
    it is, for the row checks to report what is wrong with it."""
    if not isinstance(row, dict) or "responses_create_params" in row or "prompt" not in row:
        return row
    prompt = row["prompt"]
    return {**row, "responses_create_params": {"input": list(prompt) if isinstance(prompt, list) else prompt}}
