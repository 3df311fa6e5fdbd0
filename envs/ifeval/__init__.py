"""IFEval's verifiable instructions, checked offline with no downloads.

Modules: text (words, sentences, paragraphs, a language guess), registry (the ids, their
kwargs, descriptions and samplers), and the checks by family: length_keywords, formats, case.

Each instruction is registered under IFEval's id (`length_constraints:number_words`, ...) with
IFEval's keyword-argument names (`relation`, `num_words`, ...), so a NeMo Gym / IFEval row is
checked unchanged. Next to the check sit the two things the offline prompt generator needs:
a description of the instruction (the sentence the model reads) and a sampler of its kwargs.
A few ids from open-instruct's IFEvalG / IFBench extension (`last_word:last_word_answer`,
`count:lowercase_counting`, ...) are here too, because NeMo Gym's example rows use them.

Why not IFEval's own code: it needs nltk's punkt data and langdetect, both downloads or heavy
dependencies at run time. Sentences are split by a small rule-based splitter (punctuation
followed by space, with common abbreviations, initials and a lower-case continuation not
counted as ends), words are `\\w+` runs as IFEval counts them, and the language checks use a
script-and-stopword guess (`guess_language`) that is good enough for "is this English / Hindi
/ Japanese", not a general-purpose detector.

Deliberate differences from the reference: a missing or unexpected kwarg raises
InstructionError instead of being filled in at random (a verifier must never invent its own
target); relations accept `at most`, `more than` and `exactly` besides IFEval's `less than`
and `at least`; keywords are matched literally (escaped), never as regular expressions, so a
row cannot make a check backtrack for minutes.
"""

# isort: off
# Imported for their registrations, in this order: the registry's order is the generator's.
from envs.ifeval import length_keywords, formats, case  # noqa: F401

# isort: on
from envs.ifeval.registry import REGISTRY, Instruction, check_instruction
from envs.ifeval.text import InstructionError, compare, guess_language, split_sentences, words

GENERATABLE = [spec for spec in REGISTRY.values() if spec.sample is not None]
__all__ = [
    "InstructionError",
    "Instruction",
    "REGISTRY",
    "GENERATABLE",
    "check_instruction",
    "compare",
    "guess_language",
    "split_sentences",
    "words",
]
