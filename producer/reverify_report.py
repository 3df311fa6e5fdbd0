"""The report of `farm reverify`: per agent, from its output files, how many rewards changed and
the mean reward before and after; the table it prints and the summary file holds."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from producer.output import Paths, read_records
from producer.rescore import reward_of

__all__ = ["render", "summarize"]


def summarize(paths: Paths, agent: Optional[str] = None) -> dict[str, dict[str, Any]]:
    """Per agent, from the output files (so a resumed run reports all of it): lines, re-scored,
    rewards changed, not re-scored by reason, lines without a recorded version, the versions
    before and after, and the mean reward before and after over the re-scored lines."""
    out: dict[str, dict[str, Any]] = {}
    for p in (paths.journal, paths.failures):
        for rec in read_records(p):
            name = agent or rec["agent"]
            a = out.setdefault(
                name,
                {
                    "lines": 0,
                    "rescored": 0,
                    "changed": 0,
                    "failed": 0,
                    "no_answer": 0,
                    "unknown_environment": 0,
                    "unversioned": 0,
                    "versions_before": Counter(),
                    "version_after": "",
                    "_before": 0.0,
                    "_after": 0.0,
                    "_both": 0,
                },
            )
            meta = rec["reverify"]
            a["lines"] += 1
            a["versions_before"][rec["verifier_version_before"] or "-"] += 1
            a["unversioned"] += not rec["verifier_version_before"]
            outcome = meta["outcome"]
            if outcome == "rescored":
                a["rescored"] += 1
                a["changed"] += bool(meta["changed"])
                a["version_after"] = rec["rollout"]["verifier_version"]
                old = reward_of(rec["reward_before"])
                if old is not None:
                    a["_before"] += old
                    a["_after"] += rec["rollout"]["reward"]
                    a["_both"] += 1
            elif outcome in ("no_answer", "unknown_environment"):
                a[outcome] += 1
            else:
                a["failed"] += 1
    for a in out.values():
        n = a.pop("_both")
        before, after = a.pop("_before"), a.pop("_after")
        a["mean_reward_before"] = before / n if n else None
        a["mean_reward_after"] = after / n if n else None
        a["versions_before"] = dict(a["versions_before"])
    return dict(sorted(out.items()))


def render(agents: dict[str, dict[str, Any]], title: str = "") -> str:
    """The per-agent table: how many rewards changed, and the mean reward before and after."""

    def mean(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.3f}"

    head = (
        f"{'agent':<20} {'lines':>7} {'rescored':>8} {'changed':>7} {'not':>5} {'version':>12} "
        f"{'before':>7} {'after':>7}"
    )
    lines = [title, head] if title else [head]
    for name, a in agents.items():
        before = "/".join(sorted(a["versions_before"]))
        version = f"{before}->{a['version_after'] or '?'}"
        lines.append(
            f"{name[:20]:<20} {a['lines']:>7,} {a['rescored']:>8,} {a['changed']:>7,} "
            f"{a['failed'] + a['no_answer'] + a['unknown_environment']:>5,} {version[:12]:>12} "
            f"{mean(a['mean_reward_before']):>7} {mean(a['mean_reward_after']):>7}"
        )
    notes = []
    for name, a in agents.items():
        if a["unversioned"]:
            notes.append(f"{name}: {a['unversioned']:,} line(s) recorded no verifier_version (scored before versions)")
        if a["unknown_environment"]:
            notes.append(f"{name}: {a['unknown_environment']:,} line(s) not re-scored: the environment is unknown")
        if a["failed"]:
            notes.append(f"{name}: {a['failed']:,} line(s) whose verifier failed (a verifier or malformed failure)")
        if a["no_answer"]:
            notes.append(f"{name}: {a['no_answer']:,} stored rollout(s) without an answer (failed or cancelled)")
    return "\n".join(lines + notes)
