"""Content and format instructions (placeholders, bullets, sections, JSON, titles), combinations,
starts and ends."""

from __future__ import annotations

import json
import re

from envs.ifeval.registry import END_PHRASES, instruction

# content and format


@instruction(
    "detectable_content:number_placeholders",
    required=("num_placeholders",),
    describe=lambda k: (
        f"The response must contain at least {k['num_placeholders']} placeholders "
        "represented by square brackets, such as [address]."
    ),
    sample=lambda r, t: {"num_placeholders": r.randint(1, 4)},
    groups={"json"},
)
def _placeholders(text, num_placeholders):
    return len(re.findall(r"\[.*?\]", text)) >= int(num_placeholders)


@instruction(
    "detectable_content:postscript",
    required=("postscript_marker",),
    describe=lambda k: (
        f"At the end of your response, please explicitly add a postscript starting with {k['postscript_marker']}"
    ),
    sample=lambda r, t: {"postscript_marker": r.choice(["P.S.", "P.P.S"])},
    groups={"end", "json", "case"},
)
def _postscript(text, postscript_marker):
    marker = postscript_marker.strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))


@instruction(
    "detectable_format:number_bullet_lists",
    required=("num_bullets",),
    describe=lambda k: (
        f"Your answer must contain exactly {k['num_bullets']} bullet points. "
        "Use the markdown bullet points such as:\n* This is point 1.\n* This is point 2"
    ),
    sample=lambda r, t: {"num_bullets": r.randint(2, 5)},
    groups={"json", "bullets"},
)
def _bullets(text, num_bullets):
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == int(num_bullets)


CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@instruction(
    "detectable_format:constrained_response",
    describe=lambda k: f"Answer with one of the following options: {', '.join(CONSTRAINED_OPTIONS)}",
    sample=lambda r, t: {},
    groups={"shape", "json", "case"},
)
def _constrained(text):
    return any(option in text for option in CONSTRAINED_OPTIONS)


@instruction(
    "detectable_format:number_highlighted_sections",
    required=("num_highlights",),
    describe=lambda k: (
        f"Highlight at least {k['num_highlights']} sections in your answer with markdown, i.e. *highlighted section*."
    ),
    sample=lambda r, t: {"num_highlights": r.randint(1, 3)},
    groups={"json", "bullets"},
)
def _highlights(text, num_highlights):
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h[2:-2].strip()]
    return len(single) + len(double) >= int(num_highlights)


@instruction(
    "detectable_format:multiple_sections",
    required=("section_spliter", "num_sections"),
    describe=lambda k: (
        f"Your response must have {k['num_sections']} sections. Mark the beginning of each "
        f"section with {k['section_spliter']} X, such as:\n{k['section_spliter']} 1\n"
        f"[content of section 1]\n{k['section_spliter']} 2\n[content of section 2]"
    ),
    sample=lambda r, t: {"section_spliter": r.choice(["Section", "SECTION"]), "num_sections": r.randint(2, 4)},
    groups={"paragraphs", "json", "case"},
)
def _sections(text, section_spliter, num_sections):
    found = re.findall(r"\s?" + re.escape(section_spliter.strip()) + r"\s?\d+\s?", text)
    return len(found) >= int(num_sections)


@instruction(
    "detectable_format:json_format",
    describe=lambda k: "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```.",
    sample=lambda r, t: {},
    groups={"json", "shape", "start", "end", "case", "paragraphs", "bullets", "title"},
)
def _json(text):
    value = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        if value.startswith(prefix):
            value = value[len(prefix) :]
            break
    value = value.removesuffix("```").strip()
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


@instruction(
    "detectable_format:title",
    describe=lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>.",
    sample=lambda r, t: {},
    groups={"title", "json"},
)
def _title(text):
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", text))


# combinations, start and end


@instruction(
    "combination:two_responses",
    describe=lambda k: (
        "Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: ******."
    ),
    sample=lambda r, t: {},
    groups={"shape", "paragraphs", "json"},
)
def _two_responses(text):
    parts = text.split("******")
    kept = []
    for i, part in enumerate(parts):
        if part.strip():
            kept.append(part.strip())
        elif i not in (0, len(parts) - 1):
            return False
    return len(kept) == 2 and kept[0] != kept[1]


@instruction(
    "combination:repeat_prompt",
    required=("prompt_to_repeat",),
    describe=lambda k: (
        "First repeat the request word for word without change, then give your answer "
        "(1. do not say any words or characters before repeating the request; 2. the request "
        "you need to repeat does not include this sentence)"
    ),
    sample=lambda r, t: {"prompt_to_repeat": t},
    groups={"start", "shape", "json", "case"},
)
def _repeat_prompt(text, prompt_to_repeat):
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


@instruction(
    "startend:end_checker",
    required=("end_phrase",),
    describe=lambda k: (
        f"Finish your response with this exact phrase {k['end_phrase']} No other words should follow this phrase."
    ),
    sample=lambda r, t: {"end_phrase": r.choice(END_PHRASES)},
    groups={"end", "json", "case"},
)
def _end_checker(text, end_phrase):
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@instruction(
    "startend:quotation",
    describe=lambda k: "Wrap your entire response with double quotation marks.",
    sample=lambda r, t: {},
    groups={"start", "end", "json"},
)
def _quotation(text):
    value = text.strip()
    return len(value) > 1 and value[0] == '"' and value[-1] == '"'
