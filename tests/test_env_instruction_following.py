"""instruction_following: every check with a known-passing and a known-failing answer, grading,
the row formats NeMo Gym and IFEval use, the offline generator, and rollouts against real vLLM."""

import asyncio
import json

import pytest
from helpers.workers import run_through_worker

from envs.ifeval import (
    GENERATABLE,
    REGISTRY,
    InstructionError,
    check_instruction,
    guess_language,
    split_sentences,
)
from envs.instruction_following import InstructionFollowing, generate, grade
from envs.sdk import Transcript
from farm.schema import Sampling

PARAS3 = "First part here.\n***\nSecond part here.\n***\nThird part here."
# (id, kwargs, an answer that follows it, an answer that does not)
CASES = [
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "one two three four five",
        "one two three four",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "one two three four",
        "one two three four five",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 4, "relation": "at most"},
        "one two three four",
        "one two three four five",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 3, "relation": "exactly"},
        "Don't stop",
        "one two three four",
    ),  # "Don't" is two words, as IFEval counts
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "at least"},
        "Dr. Smith came home. It was late! Was he tired? Yes.",
        "Dr. Smith came home at 3.5 p.m. today. It was late.",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "exactly"},
        "I live in the U.S. now. It is great.",
        "One. Two. Three.",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "less than"},
        "Just one sentence, at 5 p.m. today.",
        "One sentence. Another one.",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 3},
        PARAS3,
        "First part here.\n***\n***\nThird part here.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "crash"},
        'Intro.\n\n"Crash, went the wave."\n\nThe end.',
        "Intro.\n\nThe crash came.\n\nThe end.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "today"},
        "Hello.\n\nToday we rest.",
        "Hello.\n\nToday we rest.\n\nMore.",
    ),
    ("keywords:existence", {"keywords": ["river", "Storm"]}, "The storm flooded the River.", "The river was calm."),
    ("keywords:existence", {"keywords": ["c++"]}, "I like C++ a lot.", "I like C a lot."),  # literal, not a regex
    (
        "keywords:frequency",
        {"keyword": "orbit", "frequency": 2, "relation": "at least"},
        "Orbit after orbit.",
        "One orbit only.",
    ),
    (
        "keywords:frequency",
        {"keyword": "orbit", "frequency": 2, "relation": "less than"},
        "One orbit only.",
        "Orbit after orbit.",
    ),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["very", "thing"]},
        "Everything is quite fine.",
        "It is a very nice day.",
    ),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zig zag", "Zag"),
    (
        "keywords:letter_frequency",
        {"letter": "A", "let_frequency": 3, "let_relation": "less than"},
        "a cat",
        "A banana",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Send it to [name] at [address].",
        "Send it to [name].",
    ),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\n\nP.S. Call me.", "Bye. Call me."),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\nP.P.S. Again.", "Bye.\nP.S. Once."),
    ("detectable_content:postscript", {"postscript_marker": "Note:"}, "Bye.\nNote: later.", "Bye."),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "List:\n* one\n- two", "* one\n* two\n* three"),
    ("detectable_format:constrained_response", {}, "Hmm. My answer is maybe.", "Maybe."),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "This is *key* and **bold** text.",
        "Only *one* highlight and an empty ** one.",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nIntro\nSection 2\nBody",
        "Section 1\nEverything",
    ),
    ("detectable_format:json_format", None, '```json\n{"a": [1, 2]}\n```', "{'a': 1}"),
    ("detectable_format:json_format", {}, '  {"a": 1}  ', 'Here: {"a": 1}'),
    ("detectable_format:title", None, "<<Poem of Joy>>\nLa la.", "<< >>\nNo title here."),
    ("combination:two_responses", {}, "First take.\n******\nSecond take.", "Same.\n******\nSame."),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Explain rain."},
        "explain rain. Rain is water falling.",
        "Rain is water falling. Explain rain.",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        'Done. Any other questions?"',
        "Any other questions? Bye.",
    ),
    ("startend:quotation", {}, '"All of it is quoted."', '"Only the start is quoted.'),
    ("change_case:english_capital", {}, "THE SKY IS BLUE AND IT IS NICE.", "THE SKY is BLUE."),
    ("change_case:english_capital", {}, "THE SKY IS BLUE AND IT IS NICE.", "LE CIEL EST BLEU ET IL EST DANS LA RUE."),
    ("change_case:english_lowercase", {}, "the sky is blue and it is nice.", "The sky is blue."),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "The NASA and ESA teams met.",
        "The NASA team met.",
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 3, "capital_relation": "less than"},
        "The NASA team met a WELL-KNOWN pilot.",
        "NASA, ESA and JAXA met.",
    ),  # hyphenated words count once
    ("punctuation:no_comma", {}, "No commas at all.", "Well, one comma."),
    (
        "language:response_language",
        {"language": "fr"},
        "Le chat est sur la table et il dort.",
        "The cat is on the table and it sleeps.",
    ),
    ("language:response_language", {"language": "ja"}, "これは日本語の文です。", "这是中文句子。"),
    ("language:response_language", {"language": "hi"}, "यह एक हिंदी वाक्य है।", "This is English."),
    ("first_word:first_word_answer", {"first_word": "Today"}, "today is fine.", "Yes, today is fine."),
    (
        "first_word:first_word_sent",
        {"first_word": "relationship"},
        "Relationship is key. Relationship matters!",
        "Relationship is key. Trust matters.",
    ),
    ("last_word:last_word_answer", {"last_word": "contest"}, "We won the Contest!", "The contest was won."),
    ("punctuation:punctuation_dot", {}, "No dots here!", "A dot."),
    ("punctuation:punctuation_exclamation", {}, "Calm.", "Wow!"),
    ("count:lowercase_counting", {"N": 3}, "SQL Is Fast and so", "this has too many lowercase words"),
    ("letters:letter_counting", {"N": 5, "relation": "at least"}, "abcde", "ab 12"),
    ("letters:letter_counting", {"N": 5, "relation": "less than"}, "ab 12", "abcde"),
    ("paragraphs:paragraphs", {}, "One.\n***\nTwo.", PARAS3),
    ("paragraphs:paragraphs2", {}, "One.\n\nTwo.\n", "One.\n\n\n\nTwo."),
]


@pytest.mark.parametrize("instruction_id,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_instruction_passes_a_following_answer_and_fails_another(instruction_id, kwargs, good, bad):
    assert check_instruction(instruction_id, kwargs, good) is True
    assert check_instruction(instruction_id, kwargs, bad) is False


def test_every_instruction_here_is_registered():
    # The ids added from NeMo Gym's registry have their cases in test_ifeval_reference.py, which
    # checks that every registered id has cases in one file or the other.
    assert {c[0] for c in CASES} <= set(REGISTRY)
    assert len(REGISTRY) >= 25


def test_sentence_splitter_handles_abbreviations_initials_and_decimals():
    text = 'Mr. J. R. Smith paid $3.50 at 5 p.m. yesterday. "Really?" she asked. Yes!\n\nA heading without a stop'
    assert split_sentences(text) == [
        "Mr. J. R. Smith paid $3.50 at 5 p.m. yesterday.",
        '"Really?"',
        "she asked.",
        "Yes!",
        "A heading without a stop",
    ]
    assert split_sentences("") == [] and split_sentences(" ... ") == []


def test_language_guess_is_offline_and_coarse():
    assert guess_language("The weather is nice and the sun is out") == {"en"}
    assert guess_language("El perro come la comida de los gatos") == {"es"}
    assert guess_language("Der Hund ist nicht im Haus und die Katze schläft") == {"de"}
    assert guess_language("Привет, как у тебя дела?") == {"ru", "bg"}
    assert guess_language("안녕하세요") == {"ko"}
    assert guess_language("12345 !!!") is None


@pytest.mark.parametrize(
    "instruction_id,kwargs,match",
    [
        ("keywords:nonexistent", {}, "unknown instruction id"),
        ("length_constraints:number_words", {"num_words": 5}, "missing kwargs"),
        ("detectable_format:title", {"bogus": 1}, "unexpected kwargs"),
        ("length_constraints:number_words", {"num_words": 5, "relation": "around"}, "unknown relation"),
        ("length_constraints:number_words", {"num_words": "many", "relation": "at least"}, "bad kwargs"),
        (
            "keywords:letter_frequency",
            {"letter": "ab", "let_frequency": 1, "let_relation": "at least"},
            "one character",
        ),
    ],
)
def test_instructions_that_cannot_be_checked_raise(instruction_id, kwargs, match):
    with pytest.raises(InstructionError, match=match):
        check_instruction(instruction_id, kwargs, "some answer")


def test_null_kwargs_are_ignored_as_in_nemo_gym_rows():
    kwargs = {"num_words": 3, "relation": "at least", "keywords": None, "num_sentences": None}
    assert check_instruction("length_constraints:number_words", kwargs, "one two three")


ROW = {  # NeMo Gym's legacy layout: verifier fields at the top level, a null kwargs entry
    "id": 7,
    "instruction_id_list": ["detectable_format:title", "length_constraints:number_words", "punctuation:no_comma"],
    "kwargs": [None, {"num_words": 10, "relation": "less than"}, {}],
    "prompt": "Write a haiku. Give it a title. Answer with less than 10 words. No commas.",
    "responses_create_params": {
        "input": [{"role": "user", "content": "Write a haiku..."}],
        "tools": [],
        "parallel_tool_calls": False,
    },
}


def verify(env, row, text):
    """`env`'s verdict (graded in its CpuPool), the pool closed again (a later call starts another)."""

    async def scored():
        try:
            return await env.score(row, None, Transcript(final_text=text, output=[], tool_calls=[]))
        finally:
            await env.aclose()

    return asyncio.run(scored())


@pytest.mark.slow
def test_binary_and_fraction_grading():
    all_ok, two_of_three = "<<Rain>>\nSoft rain falls", "<<Rain>>\nSoft rain, falls"
    binary, fraction = InstructionFollowing(), InstructionFollowing(grading="fraction")
    v = verify(binary, ROW, all_ok)
    assert v.reward == 1.0 and v.metrics["follow_all_instructions"] is True
    v = verify(binary, ROW, two_of_three)
    assert v.reward == 0.0
    assert v.components == {
        "detectable_format:title": 1.0,
        "length_constraints:number_words": 1.0,
        "punctuation:no_comma": 0.0,
    }
    assert v.metrics["follow_instruction_list"] == [True, True, False] and v.metrics["grading_mode"] == "binary"
    v = verify(fraction, ROW, two_of_three)
    assert v.reward == pytest.approx(2 / 3) and v.metrics["instructions_followed"] == 2
    assert verify(fraction, ROW, "nothing right, at all, in this long answer of more than ten words").reward == 0.0


@pytest.mark.slow
def test_a_rows_grading_mode_overrides_the_environments():
    row = {**ROW, "grading_mode": "fraction"}
    assert verify(InstructionFollowing(), row, "<<Rain>>\nSoft rain, falls").reward == pytest.approx(2 / 3)
    with pytest.raises(InstructionError, match="grading_mode"):
        verify(InstructionFollowing(), {**ROW, "grading_mode": "partial"}, "x")
    with pytest.raises(ValueError):
        InstructionFollowing(grading="partial")


@pytest.mark.slow
def test_verifier_metadata_layout_wins_over_top_level_fields():
    row = {
        "id": 1,
        "responses_create_params": ROW["responses_create_params"],
        "instruction_id_list": ["punctuation:no_comma"],
        "kwargs": [{}],
        "verifier_metadata": {
            "instruction_id_list": ["startend:quotation"],
            "kwargs": [{}],
            "prompt": "p",
            "grading_mode": "binary",
        },
    }
    v = verify(InstructionFollowing(), row, '"a, b"')
    assert v.reward == 1.0 and set(v.components) == {"startend:quotation"}


@pytest.mark.slow
def test_repeated_instruction_ids_get_distinct_components():
    row = {
        "instruction_id_list": ["keywords:existence", "keywords:existence"],
        "kwargs": [{"keywords": ["sun"]}, {"keywords": ["moon"]}],
        "responses_create_params": {"input": "Write."},
    }
    v = verify(InstructionFollowing(grading="fraction"), row, "The sun rose.")
    assert v.components == {"keywords:existence": 1.0, "keywords:existence#2": 0.0} and v.reward == 0.5


@pytest.mark.parametrize(
    "row,match",
    [
        (
            {**ROW, "instruction_id_list": ["detectable_format:title", "no_such:instruction", "punctuation:no_comma"]},
            "unknown instruction id 'no_such:instruction'",
        ),
        ({**ROW, "kwargs": [{}]}, "kwargs"),
        ({"responses_create_params": {"input": "hi"}}, "instruction_id_list"),
        ({**ROW, "instruction_id_list": []}, "instruction_id_list"),
    ],
)
@pytest.mark.slow
def test_rows_that_cannot_be_verified_raise_rather_than_score_zero(row, match):
    with pytest.raises(InstructionError, match=match):
        verify(InstructionFollowing(), row, "anything")


def test_generation_is_deterministic_by_seed_and_nemo_gym_shaped():
    a, b, c = generate(50, seed=5), generate(50, seed=5), generate(50, seed=6)
    assert a == b and a != c
    assert json.loads(json.dumps(a)) == a
    for i, row in enumerate(a):
        assert row["id"] == i and row["agent_ref"] == {"type": "responses_api_agents", "name": "instruction_following"}
        assert row["responses_create_params"]["input"] == [{"role": "user", "content": row["prompt"]}]
        assert 1 <= len(row["instruction_id_list"]) <= 3 and len(row["kwargs"]) == len(row["instruction_id_list"])
        grade(InstructionFollowing().check_row(row), "")  # every generated instruction is checkable (raises otherwise)
        specs = [REGISTRY[i] for i in row["instruction_id_list"]]
        for x in range(len(specs)):  # no two instructions of one conflict group in a prompt
            for y in range(x + 1, len(specs)):
                assert not specs[x].groups & specs[y].groups, row["instruction_id_list"]


def test_generation_covers_every_generatable_instruction_and_respects_counts():
    rows = InstructionFollowing(min_instructions=2, max_instructions=2).generate(400, seed=0)
    assert {i for r in rows for i in r["instruction_id_list"]} == {s.id for s in GENERATABLE}
    assert len(GENERATABLE) >= 15 and all(len(r["instruction_id_list"]) == 2 for r in rows)
    assert all(r["grading_mode"] == "fraction" for r in generate(3, grading_mode="fraction"))


def test_repeat_prompt_asks_for_everything_before_it():
    row = next(r for r in generate(300, seed=1) if "combination:repeat_prompt" in r["instruction_id_list"])
    assert row["instruction_id_list"][-1] == "combination:repeat_prompt"
    request = row["kwargs"][-1]["prompt_to_repeat"]
    assert row["prompt"].startswith(request)
    assert (
        grade(InstructionFollowing().check_row(row), request + "\nHere is my answer.").components[
            "combination:repeat_prompt"
        ]
        == 1.0
    )


@pytest.mark.vllm
@pytest.mark.slow
def test_rollouts_through_redis_a_worker_and_real_vllm(settings, vllm, model_dir):
    """A few real rollouts via a `farm worker` process; one row with an unknown id fails as `verifier`."""
    rows = generate(3, seed=11)
    rows.append({**generate(1, seed=12)[0], "instruction_id_list": ["made_up:instruction"], "kwargs": [{}]})
    got = run_through_worker(settings, vllm, model_dir, "instruction_following", rows, sampling=Sampling(max_tokens=32))
    for row, r in zip(rows[:3], got[:3]):
        assert r.status.value in ("ok", "truncated"), r.error
        assert 0.0 <= r.reward <= 1.0
        assert set(r.reward_components) == set(row["instruction_id_list"])
        assert r.metrics["grading_mode"] == "binary" and len(r.metrics["follow_instruction_list"]) == len(row["kwargs"])
        n = len(r.trace.completion())
        assert n > 0 and len(r.trace.completion_logprobs()) == n
        assert r.worker_id.startswith("instruction_following@")
    bad = got[3]
    assert bad.status.value == "failed" and bad.error.kind == "verifier"
    assert "unknown instruction id 'made_up:instruction'" in bad.error.message
