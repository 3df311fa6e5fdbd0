"""mcqa: NeMo Gym's row fields, the three grading modes, custom regexes, offline questions by seed."""

import json

import pytest
from helpers.workers import run_through_worker

from envs.mcqa import LETTERS, MCQA, MODES, generate, grade
from envs.sdk import Transcript
from farm.schema import Sampling

ENV = MCQA()
OPTIONS = [{"A": "Paris"}, {"B": "Lima"}, {"C": "Oslo"}, {"D": "Cairo"}]


def said(text: str) -> Transcript:
    return Transcript(final_text=text, output=[], tool_calls=[])


def row(mode="strict_single_letter_boxed", expected="B", **extra) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "What is the capital of Peru?"}]},
        "options": OPTIONS,
        "expected_answer": expected,
        "grading_mode": mode,
        **extra,
    }


async def reward(r: dict, text: str) -> float:
    return (await ENV.score(r, None, said(text))).reward


def test_an_easy_setting_generates_fewer_options_and_chosen_kinds():
    env = MCQA(grading_mode="lenient_answer_colon", options=2, kinds=["capital"])
    rows = env.generate(100, seed=3)
    assert rows == env.generate(100, seed=3)
    assert all(len(r["options"]) == 2 and r["metadata"]["kind"] == "capital" for r in rows)
    assert {r["expected_answer"] for r in rows} == {"A", "B"}
    assert all(r["grading_mode"] == "lenient_answer_colon" for r in rows)
    ranged = MCQA(options=[2, 3]).generate(100, seed=3)
    assert {len(r["options"]) for r in ranged} == {2, 3}
    assert MCQA().generate(20, seed=5) == generate(20, seed=5)  # the default is the shipped generator
    with pytest.raises(ValueError, match="options must be between 2 and 10"):
        MCQA(options=1)
    with pytest.raises(ValueError, match="unknown question kind"):
        MCQA(kinds=["poetry"])
    with pytest.raises(ValueError, match="unknown answer_format"):
        MCQA(answer_format="essay")


async def test_the_line_format_reads_the_letter_that_starts_the_answer():
    env = MCQA(options=3, kinds=["capital"], answer_format="line")
    rows = env.generate(30, seed=2)
    assert all(
        "Reply with the line of the correct option" in r["responses_create_params"]["input"][0]["content"] for r in rows
    )
    r = rows[0]
    right = r["expected_answer"]
    wrong = next(k for o in r["options"] for k in o if k != right)
    text = dict(next(iter(o.items())) for o in r["options"])[right]
    assert (await env.score(r, None, said(f"{right}: {text}"))).reward == 1.0
    assert (await env.score(r, None, said(f"**{right}.** {text}"))).reward == 1.0
    assert (await env.score(r, None, said(f"{wrong}: {text}"))).reward == 0.0  # the letter counts, not the text
    assert (await env.score(r, None, said(f"I think {right}: {text}"))).reward == 0.0  # it must start the answer


async def test_the_text_format_reads_the_option_text_on_the_answer_line():
    env = MCQA(options=3, kinds=["capital"], answer_format="text")
    r = env.generate(30, seed=2)[0]
    right = r["expected_answer"]
    by_letter = {k: v for o in r["options"] for k, v in o.items()}
    wrong = next(k for k in by_letter if k != right)
    assert r["template_metadata"]["template_id"] == "farm_mcqa_text"
    assert (await env.score(r, None, said(f"{wrong}: {by_letter[right]}"))).reward == 1.0  # the text counts
    assert (await env.score(r, None, said(f"{right}: {by_letter[right]}.\nBecause."))).reward == 1.0
    assert (await env.score(r, None, said(f"{right}: {by_letter[wrong]}"))).reward == 0.0
    assert (await env.score(r, None, said(f"{right}:"))).reward == 0.0  # no option named
    assert (await env.score(r, None, said(f"{right}: Atlantis"))).reward == 0.0  # not an option


def test_generation_is_deterministic_by_seed():
    a, b, c = generate(30, seed=1), generate(30, seed=1), generate(30, seed=2)
    assert a == b and a != c and json.loads(json.dumps(a)) == a
    rows = generate(200, seed=0)
    assert {r["grading_mode"] for r in rows} == set(MODES)
    assert any("template_metadata" in r for r in rows)
    for r in rows:
        letters = [next(iter(o)) for o in r["options"]]
        assert letters == list(LETTERS[: len(letters)]) and 4 <= len(letters) <= 10
        texts = [next(iter(o.values())) for o in r["options"]]
        assert len(set(texts)) == len(texts), r  # no duplicate options
        assert r["expected_answer"] in letters
        prompt = r["responses_create_params"]["input"][0]["content"]
        assert all(f"{k}: {v}" in prompt for o in r["options"] for k, v in o.items())
    assert {r["grading_mode"] for r in MCQA(grading_mode="lenient_boxed").generate(20, seed=3)} == {"lenient_boxed"}


@pytest.mark.parametrize(
    "mode, text",
    [
        ("strict_single_letter_boxed", "Lima is the capital. \\boxed{B}"),
        ("strict_single_letter_boxed", "\\boxed{A} hmm, no: \\boxed{\\text{B}}"),
        ("strict_single_letter_boxed", "Final: \\boxed{ (B) }"),
        ("strict_single_letter_boxed", "\\boxed{B: Lima}"),
        ("lenient_boxed", "\\boxed{B}"),
        ("lenient_boxed", "\\boxed{lima}"),
        ("lenient_boxed", "\\boxed{\\text{The answer is Lima}}"),
        ("lenient_answer_colon", "Peru's capital is Lima.\nAnswer: B"),
        ("lenient_answer_colon", "answer: b"),
        ("lenient_answer_colon", "Answer: Lima\nWait, no.\nAnswer: A"),  # the first Answer: counts
        ("lenient_answer_colon_md", "answer: **b**"),
        ("lenient_answer_colon_md", "Answer: A\nWait, I was wrong.\n**Answer: B**"),  # the last one counts
        ("lenient_answer_colon_md", "Answer: $B$"),
        ("lenient_answer_colon_md", "Answer: (B) Lima"),
        ("lenient_answer_colon_md", "Answer: B\nAnswer: A/C"),  # a list is no answer; the one before is
    ],
)
async def test_known_correct_answers_get_full_reward(mode, text):
    v = await ENV.score(row(mode), None, said(text))
    assert v.reward == 1.0 and v.components == {"correct": 1.0} and v.metrics["extracted_answer"] == "B"


@pytest.mark.parametrize(
    "mode, text",
    [
        ("strict_single_letter_boxed", "\\boxed{C}"),
        ("strict_single_letter_boxed", "\\boxed{B} at first, then \\boxed{C}"),
        ("strict_single_letter_boxed", "\\boxed{Lima}"),  # option text is lenient_boxed's job
        ("strict_single_letter_boxed", "The answer is B."),  # not boxed
        ("strict_single_letter_boxed", "\\boxed{E}"),  # not an option
        ("lenient_boxed", "\\boxed{Lima or Oslo}"),  # two options named: ambiguous
        ("lenient_boxed", "Answer: B"),
        ("lenient_answer_colon", "Answer: C"),
        ("lenient_answer_colon", "\\boxed{B}"),
        ("lenient_answer_colon", "Answer: I think it is Lima"),  # not exactly an option's text
        ("lenient_answer_colon", "**Answer: B**"),  # markdown is the _md mode's
        ("lenient_answer_colon", ""),
        ("lenient_answer_colon_md", "Answer: B or C"),
        ("lenient_answer_colon_md", "Answer: unknown"),
        ("lenient_answer_colon_md", "I think it might be B"),
    ],
)
async def test_known_wrong_answers_get_none(mode, text):
    v = await ENV.score(row(mode), None, said(text))
    assert v.reward == 0.0 and v.components == {"correct": 0.0}


async def test_template_regex_comes_first_and_falls_back_to_the_mode():
    r = row(template_metadata={"output_regex": r"Final Choice:\s*([A-Za-z])"})
    assert await reward(r, "final choice: C\n...\nFinal Choice: B") == 1.0  # last match, any case
    assert await reward(r, "Final Choice: C") == 0.0
    assert await reward(r, "no marker, but \\boxed{B}") == 1.0  # falls back to the mode
    r = row(template_metadata={"output_regex": [r"ANSWER IS\s*(\w+)", r"Option:\s*([A-Z])"]})
    assert await reward(r, "ANSWER IS lima") == 1.0  # option text through the regex
    assert await reward(r, "Option: B") == 1.0


async def test_an_invalid_template_regex_falls_back_to_the_mode_and_says_so():
    v = await ENV.score(row(template_metadata={"output_regex": "Answer: ([A-Z"}), None, said("\\boxed{B}"))
    assert v.reward == 1.0 and v.metrics["graded_by"] == "strict_single_letter_boxed"
    assert v.metrics["bad_output_regex"] == ["Answer: ([A-Z"]


async def test_localized_option_letters_through_the_template_regex():
    r = row(template_metadata={"output_regex": r"الإجابة:\s*(\S+)"})
    assert await reward(r, "الإجابة: ب") == 1.0
    r = row(template_metadata={"output_regex": r"Answer:\s*(\S+)"})
    assert await reward(r, "Answer: Ｂ") == 1.0


async def test_the_server_level_grading_mode_overrides_the_rows():
    server = MCQA(grading_mode="lenient_answer_colon_md")
    v = await server.score(row("strict_single_letter_boxed"), None, said("**Answer: B**"))
    assert v.reward == 1.0 and v.metrics["graded_by"] == "lenient_answer_colon_md"
    assert (await ENV.score(row("strict_single_letter_boxed"), None, said("**Answer: B**"))).reward == 0.0


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"grading_mode": "telepathy"}, "unknown grading_mode"),
        ({"expected_answer": "F"}, "not one of the options"),
        ({"options": None}, "lacks `options`"),
        ({"options": [{"A": "x", "B": "y"}]}, "malformed option"),
    ],
)
async def test_malformed_rows_raise_instead_of_scoring_zero(bad, message):
    with pytest.raises(ValueError, match=message):
        await ENV.score({**row(), **bad}, None, said("\\boxed{B}"))


def answer_in_format(r: dict, letter: str) -> str:
    """How a model following the row's own instructions would end its answer."""
    if "template_metadata" in r:
        return ("Final Choice: " if "Final" in r["template_metadata"]["output_regex"] else "ANSWER IS ") + letter
    text = next(v for o in r["options"] for k, v in o.items() if k == letter)
    return {
        "strict_single_letter_boxed": f"\\boxed{{{letter}}}",
        "lenient_boxed": f"\\boxed{{{text}}}",
        "lenient_answer_colon": f"Answer: {letter}",
    }[r["grading_mode"]]


async def test_generated_rows_grade_their_own_format():
    for r in generate(60, seed=9):
        right = r["expected_answer"]
        wrong = next(next(iter(o)) for o in r["options"] if next(iter(o)) != right)
        assert await reward(r, "Thinking...\n" + answer_in_format(r, right)) == 1.0, r
        assert await reward(r, "Thinking...\n" + answer_in_format(r, wrong)) == 0.0, r


@pytest.mark.slow
@pytest.mark.vllm
def test_worker_runs_mcqa_against_real_vllm(settings, vllm, model_dir):
    rows = generate(4, seed=5)
    got = run_through_worker(settings, vllm, model_dir, "mcqa", rows, sampling=Sampling(max_tokens=24, temperature=0.7))
    for r in got:
        assert r.status.value in ("ok", "truncated"), r.error
        assert r.reward in (0.0, 1.0) and set(r.reward_components) == {"correct"}
        assert r.metrics["graded_by"] in (*MODES, "output_regex")
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n and r.worker_id.startswith("mcqa@")


# NeMo Gym's mcqa server on the same answers: (grading mode, option letters, answer, the letter it
# extracts), written from the expectations its own tests publish.
NEMO_GYM_CASES = [
    ("lenient_answer_colon_md", "ABCD", "The answer is B.\n\nAnswer: B", "B"),
    ("lenient_answer_colon_md", "ABCD", "Reasoning here.\n\n**Answer: C**", "C"),
    ("lenient_answer_colon_md", "ABCD", "__Answer__: A", "A"),
    ("lenient_answer_colon_md", "ABCD", "Answer: B because C is not valid", "B"),
    ("lenient_answer_colon_md", "ABCD", "Answer: B/B", "B"),
    ("lenient_answer_colon_md", "ABCD", "Answer: $D$", "D"),
    ("lenient_answer_colon_md", "ABCD", "Answer: (D)", "D"),
    ("lenient_answer_colon_md", "ABCDEFGHIJ", "\\boxed{\\text{Answer: G}}", "G"),
    ("lenient_answer_colon_md", "ABCD", "Answer: unknown", None),
    ("lenient_answer_colon_md", "ABCD", "Answer: G", None),
    ("lenient_answer_colon_md", "ABCD", "Answer: A/B/C", None),
    ("lenient_answer_colon_md", "ABCDEFGHIJ", "Answer: B/I", None),
    ("lenient_answer_colon_md", "ABCDEFGHIJ", "**Answer: D/H**", None),
    ("lenient_answer_colon_md", "ABCD", "Answer: A or B", None),
    ("lenient_answer_colon_md", "ABCD", "Answer: A and B", None),
    ("lenient_answer_colon_md", "ABCD", "Answer: A, B", None),
    ("lenient_answer_colon_md", "ABCD", "Answer: A\nAnswer: B", "B"),
    ("lenient_answer_colon_md", "ABCD", "Answer: B\nAnswer: unknown", "B"),
    ("lenient_answer_colon_md", "ABCD", "Answer: B\nAnswer: G", "B"),
    ("lenient_answer_colon_md", "ABCD", "Answer: B\nAnswer: A/B/C", "B"),
    ("lenient_answer_colon_md", "ABCD", "I think it might be B but I'm not sure", None),
    ("lenient_answer_colon", "ABCD", "**Answer: C**", None),
    ("strict_single_letter_boxed", "ABCDEFGHIJ", "\\boxed{\\text{E}}", "E"),
    ("strict_single_letter_boxed", "ABCDEFGHIJ", "\\boxed{\\text{I: NGS can detect both coding regions.}}", "I"),
    ("strict_single_letter_boxed", "ABCDEFGHIJ", "\\[ \\boxed{E: \\text{A polygenic risk score.}} \\]", "E"),
    ("strict_single_letter_boxed", "ABCD", "\\boxed{B}", "B"),
    ("strict_single_letter_boxed", "ABCD", "Final: \\boxed{ [C] }", "C"),
    ("strict_single_letter_boxed", "ABCDEFGHIJ", "\\boxed{A polygenic risk score can provide a probability.}", None),
    ("lenient_boxed", "ABCDEFGHIJ", "\\boxed{\\text{E}}", "E"),
    ("strict_single_letter_boxed", "ABCD", "\\boxed{B", None),
    ("strict_single_letter_boxed", "ABCDEFGHIJ", "Candidate is \\boxed{C}, but on reflection it is \\boxed{E}", "E"),
    ("strict_single_letter_boxed", "ABCDEFGHIJ", "Thinking: \\boxed{\\text{some idea}}. Final answer: \\boxed{E}", "E"),
]


@pytest.mark.parametrize("mode, letters, text, expected", NEMO_GYM_CASES, ids=[c[2][:40] for c in NEMO_GYM_CASES])
def test_extracts_the_letter_nemo_gym_extracts(mode, letters, text, expected):
    options = [{k: f"option {k} text"} for k in letters]
    r = ENV.check_row({"responses_create_params": {"input": "Q?"}, "options": options, "expected_answer": "A"})
    assert grade(text, r, mode)[0] == expected
