"""Needle-in-a-haystack text for the long-context check.

A passphrase is planted at a relative depth in varied filler prose, then asked for. A server that
silently truncates the prompt (a small `--max-model-len`, a context shift in llama.cpp, a broken
rope scaling) loses the needle and answers something else. The filler is generated, not repeated:
a prompt of one sentence copied a thousand times invites loops and tells nothing about real text.
Token counts are estimated at ~4 characters per token (English prose on BPE tokenizers); the
server's own `usage.prompt_tokens` is reported beside the result.
"""

from __future__ import annotations

import random
import re

CHARS_PER_TOKEN = 4

_SUBJECTS = (
    "The harbour office",
    "A small bakery",
    "The night train",
    "The old library",
    "A river barge",
    "The town council",
    "A weather station",
    "The mountain hut",
    "A village school",
    "The ferry crew",
)
_VERBS = (
    "opened",
    "recorded",
    "delivered",
    "repaired",
    "counted",
    "painted",
    "measured",
    "listed",
    "inspected",
    "moved",
)
_OBJECTS = (
    "forty crates of apples",
    "the new timetable",
    "a shipment of blue tiles",
    "the winter accounts",
    "three broken lanterns",
    "the eastern fence",
    "a box of maps",
    "the rainfall figures",
    "two hundred letters",
    "the spare oars",
)
_TAILS = (
    "before the morning bell.",
    "after a long delay.",
    "without any fuss.",
    "on the second attempt.",
    "while the square was quiet.",
    "as the fog lifted.",
    "for the autumn fair.",
    "by the north gate.",
    "under a grey sky.",
    "in record time.",
)
_WORDS = (
    "amber",
    "falcon",
    "cobalt",
    "lantern",
    "meadow",
    "quartz",
    "harbor",
    "willow",
    "ember",
    "tundra",
    "saffron",
    "orbit",
    "pebble",
    "juniper",
    "glacier",
    "violet",
)


def new_passphrase(rng: random.Random | None = None) -> str:
    """Two words and four digits: unguessable, and one token sequence any tokenizer keeps intact."""
    r = rng or random.Random()
    return f"{r.choice(_WORDS)}-{r.choice(_WORDS)}-{r.randrange(1000, 10000)}"


def needle_sentence(passphrase: str) -> str:
    return f'The passphrase is "{passphrase}".'


def haystack(tokens: int, depth: float, passphrase: str, seed: int = 7) -> str:
    """About `tokens` tokens of filler with the needle at `depth` (0 = start, 1 = end)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError("depth must be within 0..1")
    rng = random.Random(seed)
    budget = max(1, tokens) * CHARS_PER_TOKEN
    sentences: list[str] = []
    size = 0
    n = 1
    while size < budget:
        parts = (rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS), rng.choice(_TAILS))
        s = f"Entry {n}: " + " ".join(parts)
        sentences.append(s)
        size += len(s) + 1
        n += 1
    sentences.insert(round(depth * len(sentences)), needle_sentence(passphrase))
    return " ".join(sentences)


def question(text: str) -> str:
    """The user message: the document, then the question (after it, where instructions work best)."""
    return (
        "Read the following notes carefully.\n\n<notes>\n" + text + "\n</notes>\n\n"
        "What is the passphrase stated in the notes? Reply with the passphrase only."
    )


def recalled(answer: str, passphrase: str) -> bool:
    """The answer contains the passphrase (case and separators as planted; quotes may differ)."""
    return passphrase.lower() in answer.lower() or re.sub(r"[\s\-]", "", passphrase.lower()) in re.sub(
        r"[\s\-]", "", answer.lower()
    )
