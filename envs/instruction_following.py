"""instruction_following: IFEval-style verifiable instructions, single turn.

Data: a writing task ("Write a short story about a lighthouse keeper.") followed by one to
three verifiable instructions ("Answer with at least 60 words.", "Include keywords river,
storm in the response."), generated offline from topics x instruction combinations,
deterministic by seed. Instructions that cannot hold together (all capitals and all
lowercase, JSON and a title, two end phrases) are never drawn into one prompt.

Rows are NeMo Gym's instruction_following rows: `id`, `instruction_id_list`, `kwargs` (one
object per instruction, IFEval's names), `prompt`, and optionally `grading_mode`, at the top
level or under `verifier_metadata` (NeMo Gym's newer layout; its values win), so a row
exported by NeMo Gym or taken from IFEval loads unchanged.

Verifier: every instruction is checked against the model's final answer (envs/ifeval/,
no downloads at run time). The reward is 1 when all are followed (`binary`) or the share
followed (`fraction`); the environment's `grading` sets the default and a row's
`grading_mode` overrides it. Each instruction's result is a reward component named by its id.
An instruction the verifier does not know, or kwargs it cannot use, raise InstructionError:
the rollout fails as a `verifier` error with the reason instead of scoring 0. The checks are
literal string and regex scans over one answer (no row-supplied regex), microseconds each on an
ordinary answer; but a few scans are quadratic on a degenerate one (16,000 words of "The The
The ..." take `copy:repeat_phrase` about 5 s, a long run of spaces takes
`detectable_content:postscript` as long), which inline would stall every rollout of the worker.
So grading runs in a CpuPool process, stopped past `grade_timeout_s` of CPU time (a `verifier`
failure, not a 0), its processes warmed by setup() (`warm`: every generatable instruction checked once).
"""

from __future__ import annotations

import random
from typing import Any, Optional

from envs.cpu import CpuPool
from envs.ifeval import GENERATABLE, REGISTRY, Instruction, InstructionError, check_instruction
from envs.sdk import AgentSettings, Environment, Row, Transcript, Verdict, parse_row

GRADING_MODES = ("binary", "fraction")

TOPICS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how vaccines train the immune system.",
    "Write a product description for a solar-powered backpack.",
    "Describe a typical day in the life of a honeybee.",
    "Write a letter to a friend recommending your favourite book.",
    "Explain why the sky looks blue during the day.",
    "Give advice to a student preparing for their first job interview.",
    "Write a poem about the first snowfall of winter.",
    "Summarize the causes of the French Revolution.",
    "Describe how to make a cup of tea for someone who has never made one.",
    "Write a review of an imaginary restaurant on the moon.",
    "Explain what a computer network is to a ten-year-old.",
    "Write a speech for the opening of a new public library.",
    "Describe the water cycle.",
    "Write a diary entry of a sailor crossing the Atlantic in 1850.",
    "Explain the rules of chess in simple terms.",
    "Write an advertisement for a bicycle repair shop.",
    "Describe the benefits of learning a second language.",
    "Write a fairy tale about a fox and a clever crow.",
    "Explain how a bill becomes a law.",
    "Write a travel guide entry for a small mountain village.",
    "Describe what makes a good team leader.",
    "Write a short biography of an invented inventor.",
    "Explain how plants turn sunlight into food.",
]


class IFRow(Row):
    """An IFEval row: the verifier's fields at the top level (NeMo Gym's legacy layout) or under
    `verifier_metadata` (its newer one, whose values win)."""

    instruction_id_list: Optional[list[str]] = None
    kwargs: Optional[list[Optional[dict[str, Any]]]] = None
    prompt: Optional[str] = None
    grading_mode: Optional[str] = None
    verifier_metadata: Optional[dict[str, Any]] = None
    id: Any = None


class InstructionFollowing(Environment):
    name = "instruction_following"
    verifier_version = "1"
    agent = AgentSettings(loop="single_turn", max_steps=1)
    row_type = IFRow

    def __init__(
        self,
        grading: str = "binary",
        min_instructions: int = 1,
        max_instructions: int = 3,
        grade_timeout_s: float = 10.0,
    ):
        if grading not in GRADING_MODES:
            raise ValueError(f"grading must be one of {GRADING_MODES}, got {grading!r}")
        if not 1 <= min_instructions <= max_instructions:
            raise ValueError("need 1 <= min_instructions <= max_instructions")
        self.grading = grading
        self.min_instructions = min_instructions
        self.max_instructions = max_instructions
        self.grade_timeout_s = grade_timeout_s  # CPU seconds per answer
        self.pool = CpuPool(warmup=warm)

    async def setup(self) -> None:
        await self.pool.start()

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def verify(self, row: IFRow, state: Any, transcript: Transcript) -> Verdict:
        return await self.pool.run(grade, row, transcript.final_text, self.grading, cpu_s=self.grade_timeout_s)

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed, self.min_instructions, self.max_instructions)


def row_fields(row: IFRow) -> dict:
    """The verifier's fields, from `verifier_metadata` first, then the row's top level."""
    fields = dict(row.verifier_metadata or {})
    for key in ("instruction_id_list", "kwargs", "prompt", "grading_mode"):
        if key not in fields and getattr(row, key) is not None:
            fields[key] = getattr(row, key)
    ids = fields.get("instruction_id_list")
    if not isinstance(ids, list) or not ids:
        raise InstructionError("row has no `instruction_id_list` (a non-empty list of instruction ids)")
    kwargs = fields.get("kwargs")
    if kwargs is None:
        kwargs = [{}] * len(ids)
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise InstructionError(f"row has {len(ids)} instructions but `kwargs` is not a list of {len(ids)}")
    fields["instruction_id_list"], fields["kwargs"] = ids, kwargs
    return fields


def grade(row: IFRow, response: str, default_grading: str = "binary") -> Verdict:
    """Check every instruction of `row` against `response`; raise when one cannot be checked."""
    fields = row_fields(row)
    grading = fields.get("grading_mode") or default_grading
    if grading not in GRADING_MODES:
        raise InstructionError(f"grading_mode must be one of {GRADING_MODES}, got {grading!r}")
    followed = [check_instruction(i, kw, response) for i, kw in zip(fields["instruction_id_list"], fields["kwargs"])]
    components: dict[str, float] = {}
    for instruction_id, ok in zip(fields["instruction_id_list"], followed):
        key, n = instruction_id, 1
        while key in components:  # the same id twice: name the second one id#2
            n += 1
            key = f"{instruction_id}#{n}"
        components[key] = float(ok)
    share = sum(followed) / len(followed)
    reward = float(all(followed)) if grading == "binary" else share
    return Verdict(
        reward=reward,
        components=components,
        metrics={
            "follow_all_instructions": all(followed),
            "follow_instruction_list": followed,
            "instructions": len(followed),
            "instructions_followed": sum(followed),
            "fraction_followed": share,
            "grading_mode": grading,
        },
    )


def warm() -> None:
    """A pool process's first grades: every generatable instruction checked against a short answer,
    so that the limit later measures grading only."""
    rng = random.Random(0)
    answer = "<<Rain>>\nSoft rain falls on the river.\n\n* one\n* two\n\nP.S. It stops."
    for spec in GENERATABLE:
        check_instruction(spec.id, spec.sample(rng, TOPICS[0]) if spec.sample else {}, answer)
    grade(parse_row(generate(1)[0], IFRow), answer)


def _compatible(spec: Instruction, chosen: list[Instruction]) -> bool:
    return all(not (spec.groups & other.groups) for other in chosen)


def generate(
    size: int, seed: int = 0, min_instructions: int = 1, max_instructions: int = 3, grading_mode: Optional[str] = None
) -> list[dict]:
    """`size` NeMo Gym instruction_following rows, deterministic by seed, made offline."""
    rng = random.Random(seed)
    rows = []
    for index in range(size):
        topic = rng.choice(TOPICS)
        want = rng.randint(min_instructions, max_instructions)
        chosen: list[Instruction] = []
        for spec in rng.sample(GENERATABLE, len(GENERATABLE)):
            if len(chosen) == want:
                break
            if _compatible(spec, chosen):
                chosen.append(spec)
        chosen.sort(key=lambda spec: spec.id == "combination:repeat_prompt")  # it repeats what comes before it
        parts, kwargs = [topic], []
        for spec in chosen:
            kwargs.append(spec.sample(rng, "\n".join(parts)))
            parts.append(spec.describe(kwargs[-1]))
        prompt = "\n".join(parts)
        row = {
            "id": index,
            "instruction_id_list": [spec.id for spec in chosen],
            "kwargs": kwargs,
            "prompt": prompt,
            "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
            "agent_ref": {"type": "responses_api_agents", "name": InstructionFollowing.name},
        }
        if grading_mode is not None:
            row["grading_mode"] = grading_mode
        rows.append(row)
    return rows


__all__ = ["IFRow", "InstructionFollowing", "InstructionError", "REGISTRY", "generate", "grade", "row_fields"]
