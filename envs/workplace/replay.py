"""Ground truth as calls, and their replay on an office (what the verifier and the generator use)."""

from __future__ import annotations

import json
from typing import Any

from envs.workplace.office import Office, ToolError
from envs.workplace.tools import call


class BadGroundTruth(ValueError):
    """The row's ground truth is not a list of replayable calls (a broken row, not a wrong answer)."""


def ground_truth_calls(truth: Any) -> list[tuple[str, dict]]:
    """A row's `ground_truth` (a list of {name, arguments}, or that list as JSON) as (name, arguments) pairs."""
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except json.JSONDecodeError as exc:
            raise BadGroundTruth(f"ground_truth is a string but not JSON: {exc}") from None
    if not isinstance(truth, list):
        raise BadGroundTruth(f"row lacks a `ground_truth` list of calls (got {type(truth).__name__})")
    return [_parse_call(c, f"ground_truth[{i}]") for i, c in enumerate(truth)]


def _parse_call(item: Any, where: str) -> tuple[str, dict]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise BadGroundTruth(f"{where} is not a {{name, arguments}} object: {item!r:.200}")
    args = item.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise BadGroundTruth(f"{where} arguments are not JSON: {exc}") from None
    if not isinstance(args, dict):
        raise BadGroundTruth(f"{where} arguments are not an object")
    return item["name"], args


def replay(office: Office, calls: list, *, strict: bool) -> Office:
    """Run calls on `office` in order. strict: any failure raises; otherwise failed calls are skipped
    (a refused call changes nothing, as it did for the model)."""
    for i, c in enumerate(calls):
        try:
            name, args = c if isinstance(c, tuple) else _parse_call(c, f"call {i}")
            call(office, name, args)
        except (BadGroundTruth, ToolError, TypeError) as exc:
            if strict:
                raise BadGroundTruth(f"ground-truth call {i} does not replay: {exc}") from None
    return office
