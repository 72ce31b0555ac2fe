"""What the forced model writes: the directive a test puts in its prompt, and the part of it still to write.

The one home of the directive's format. Both sides import it: the tests (which write directives) and the
logits processor vLLM loads (tests/process/vllm/served/tapfix_forcing.py, which reads them), so it imports nothing
beyond the standard library: vLLM's venv and the project's share no packages.

A directive is `[[force:B64,B64,...]]` anywhere in the prompt: base64 of the UTF-8 text of the model's
answers, one per assistant turn. Turn n (the number of assistant messages the prompt already holds) gets
the n-th text; a prompt past the last one gets no forcing (the model's own chain). Only the prompt's last
directive counts, so a conversation keeps its script across turns and a later message can replace it.

The open assistant message at the end of the prompt may already hold the start of the text: a continuation
(`continue_final_message`), or the template's own opening (Qwen3's `<think>\\n\\n</think>\\n\\n` when thinking
is off). The model writes on from where that text leaves off: after the whole open message when the text
starts with it, else after the longest tail of it (at least `MIN_OVERLAP` characters) that the text holds,
since a template may render the message differently from the text (Qwen3's puts an empty think block before
a continued answer, and the cut drops the answer's trailing whitespace); else from the start.
"""

from __future__ import annotations

import base64
import re

DIRECTIVE = re.compile(r"\[\[force:([A-Za-z0-9+/=,]*)\]\]")
ASSISTANT = "<|im_start|>assistant\n"  # Qwen's header of an assistant message (generation prompt included)
MIN_OVERLAP = 4


def directive(*texts: str) -> str:
    """The directive that makes the model answer `texts[0]`, then `texts[1]` on the next turn, ..."""
    return "[[force:" + ",".join(base64.b64encode(t.encode()).decode() for t in texts) + "]]"


def script(prompt: str) -> list[str] | None:
    """The texts of the prompt's last directive, or None without one."""
    found = DIRECTIVE.findall(prompt)
    if not found:
        return None
    return [base64.b64decode(part).decode() for part in found[-1].split(",")]


def already_written(open_message: str, text: str) -> int:
    """How many characters of `text` the open assistant message already holds."""
    if text.startswith(open_message):
        return len(open_message)
    for size in range(len(open_message), MIN_OVERLAP - 1, -1):
        at = text.find(open_message[-size:])
        if at >= 0:
            return at + size
    return 0


def remaining(prompt: str) -> str | None:
    """The text the model still has to write for this prompt, or None when nothing is forced."""
    texts = script(prompt)
    if texts is None:
        return None
    turn = max(prompt.count(ASSISTANT) - 1, 0)  # the generation prompt (or the open message) is one of them
    if turn >= len(texts):
        return None
    text = texts[turn]
    open_message = prompt.rsplit(ASSISTANT, 1)[1] if ASSISTANT in prompt else ""
    return text[already_written(open_message, text) :]
