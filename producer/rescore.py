"""One stored rollout scored again: the lines of a `farm collect` output, the transcript rebuilt
from them, the recorded tool calls replayed, and the output line that keeps the old verdict.

How a stored rollout is scored again: the row is checked as the worker checks it (read_row),
a fresh state is built and the rollout's recorded tool calls are replayed on it in order (a
verifier that reads the state, e.g. which cities were looked up, sees what the worker's did),
and the transcript is rebuilt from the output items (the final text is the last assistant
message; a harness's own grade comes back from `metrics.reported_reward`). Then the worker's
own verify step (workers/loops/env_calls.verify) runs: the environment's `verify`, its CPU pool
and the judges the settings name (`ctx.judge`) included, under its `verify_timeout_s`; a
verifier that raises is a recorded failure, never a 0. Nothing here builds a policy client.

Each output line is the input line with the new reward, components and verifier_version in
`rollout`, the old ones beside it (`reward_before`, `reward_components_before`,
`verifier_version_before`), and `reverify` (the input line number, the outcome, whether the
reward changed). A line that cannot be scored again keeps its rollout as it was and says why
(`reason`); producer/reverify.py sends it to the failures file.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import msgspec

from envs.sdk import Environment, Transcript, Verdict
from farm.errors import RolloutFailure, where
from producer.output import BadLine
from workers.loops.env_calls import call_tool, read_row, verify

__all__ = ["Stored", "one_line", "read_stored", "rescore", "transcript_of"]

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()

ANSWERED = ("ok", "truncated")


@dataclass
class Stored:
    line: int  # 1-based line number in the input: the line's identity
    agent: str
    record: dict


def read_stored(path: Path, agent: Optional[str] = None) -> Iterator[Stored | BadLine]:
    """The collect rows and the bad lines of a rollouts file, in order, one line in memory at a time."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                yield _parse(raw, number, agent)


def _parse(raw: bytes, number: int, agent: Optional[str]) -> Stored | BadLine:
    try:
        rec = _decode.decode(raw)
    except msgspec.DecodeError as exc:
        return BadLine(number, f"not valid JSON, e.g. a line torn by a crash ({exc})")
    except UnicodeDecodeError as exc:
        return BadLine(number, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    if not isinstance(rec, dict) or not isinstance(rec.get("rollout"), dict) or not isinstance(rec.get("row"), dict):
        return BadLine(number, "not a rollout line of `farm collect` (it needs `row` and `rollout` objects)")
    if not isinstance(rec["rollout"].get("status"), str):
        return BadLine(number, "its `rollout` has no `status`")
    name = agent or rec.get("agent")
    if not isinstance(name, str) or not name:
        return BadLine(number, "no `agent` (pass --agent to name the environment for every line)")
    return Stored(line=number, agent=name, record=rec)


def transcript_of(rollout: dict) -> Transcript:
    """What the verifier saw, rebuilt from the stored rollout's output items."""
    output = rollout.get("output") or []
    final, calls = "", []
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message" and item.get("role") == "assistant":
            content = item.get("content")
            parts = content if isinstance(content, list) else [{"text": content}]
            final = "".join(str(p.get("text") or "") for p in parts if isinstance(p, dict))
        elif item.get("type") == "function_call" and item.get("name"):
            calls.append({"name": item["name"], "arguments": _arguments(item)})
    metrics = rollout.get("metrics") or {}
    reported = metrics.get("reported_reward")
    return Transcript(
        final_text=final,
        output=output,
        tool_calls=calls,
        truncated=rollout.get("status") == "truncated",
        reported=Verdict(float(reported)) if isinstance(reported, (int, float)) else None,
    )


def _arguments(item: dict) -> Any:
    try:
        return json.loads(item.get("arguments") or "{}")
    except ValueError:
        return item.get("arguments")


async def replay_tools(env: Environment, state: Any, output: list, timeout_s: float) -> None:
    """The recorded tool calls run again, in order, on the fresh state (their results are not
    needed: the output items hold what the model saw)."""
    tools = {t.name: t for t in env.tools()}
    if not tools:
        return
    counts = {"bad_tool_calls": 0, "tool_errors": 0, "tool_calls": 0}
    for item in output:
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("name"):
            args = _arguments(item)
            if item.get("status") != "incomplete" and isinstance(args, dict):
                await call_tool(tools, item["name"], args, state, timeout_s, counts)


async def rescore(env: Environment, row: dict, rollout: dict) -> Verdict:
    """The environment's verdict on a stored rollout; RolloutFailure when the row does not fit
    (malformed) or the verifier fails (verifier), as in the worker."""
    typed, _params, _messages, _followups = read_row(env, row)
    state = env.new_state(typed)
    await replay_tools(env, state, rollout.get("output") or [], env.agent.tool_timeout_s)
    return await verify(env, typed, state, transcript_of(rollout), env.agent.verify_timeout_s)


def reward_of(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


async def one_line(env: Environment | str, stored: Stored) -> tuple[bytes, Optional[Verdict]]:
    """The output line for `stored` (`env`: its environment, or why there is none) and the new
    verdict (None: not scored again; the line belongs in the failures file, with its reason)."""
    rec = dict(stored.record)
    before = rec["rollout"]
    rec["reward_before"] = before.get("reward")
    rec["reward_components_before"] = before.get("reward_components") or {}
    rec["verifier_version_before"] = before.get("verifier_version") or ""
    meta: dict[str, Any] = {"input_line": stored.line}
    rec["reverify"] = meta
    verdict: Optional[Verdict] = None
    if isinstance(env, str):
        meta["outcome"], rec["reason"] = "unknown_environment", env
    elif before["status"] not in ANSWERED:
        error = before.get("error") or {}
        meta["outcome"] = "no_answer"
        what = f"{error.get('kind')}: {error.get('message')}"
        rec["reason"] = f"nothing to score: the stored rollout is {before['status']} ({what})"
    else:
        start = time.perf_counter()
        try:
            verdict = await rescore(env, rec["row"], before)
        except RolloutFailure as exc:
            meta["outcome"], rec["reason"] = exc.kind.value, f"{exc.kind.value}: {exc.message}"
        except Exception as exc:  # noqa: BLE001 - the environment's new_state failing fails this line, not the run
            meta["outcome"], rec["reason"] = "error", f"error: {type(exc).__name__}: {exc}{where(exc)}"
        else:
            old = reward_of(before.get("reward"))
            meta.update(
                outcome="rescored",
                changed=old is None or abs(old - verdict.reward) > 1e-9,
                verify_s=round(time.perf_counter() - start, 6),
            )
            rec["rollout"] = {
                **before,
                "reward": verdict.reward,
                "reward_components": verdict.components,
                "metrics": {**(before.get("metrics") or {}), **verdict.metrics},
                "verifier_version": env.verifier_version,
            }
    return _encode.encode(rec) + b"\n", verdict
