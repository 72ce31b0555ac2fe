"""Strip the prefix a continuation's response repeats, per field, whole or delta by delta.

Engines differ on whether the answer to a continued assistant message starts with the prefix:
llama.cpp's non-streamed `message` (and its implicit prefill's stream) repeats it, its explicit
`continue_final_message` stream and vLLM with `echo: false` don't (docs/regenerate.md). So nothing is
assumed: a leading copy is stripped only when it is really there, byte for byte. Text that only starts
like the prefix is held until it either completes the copy (dropped) or departs from it (released
whole), so a prefix split across deltas, and a delta holding the prefix and new text, come out right.

The one case text can't tell apart: a model whose new text begins with the whole prefix again. It is
stripped too, which is what the client should see (it already has that text once).
"""

from __future__ import annotations

from collections.abc import Mapping


def strip_echo(prefix: str, text: str) -> str:
    """A whole field's text (a non-streamed attempt) without a leading copy of `prefix`."""
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text


class EchoStrip:
    """One field's deltas, in order: `feed` returns what to forward now, `flush` what was still held
    (a partial match the field ended in, or before another kind of event goes out)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._held = ""
        self._decided = not prefix
        self.echoed = False  # the attempt repeated the prefix (and it was dropped)

    def feed(self, text: str) -> str:
        if self._decided or not text:
            return text
        want = self.prefix[len(self._held) :]
        if text.startswith(want):  # the copy is complete: drop it, forward what follows
            self._decided = self.echoed = True
            self._held = ""
            return text[len(want) :]
        if want.startswith(text):  # still a possible copy: hold it
            self._held += text
            return ""
        self._decided = True  # not a copy: everything held was the attempt's own text
        out, self._held = self._held + text, ""
        return out

    def whole(self, text: str) -> str:
        """A whole field's text (a non-streamed attempt) without a leading copy of the prefix."""
        out = strip_echo(self.prefix, text)
        self.echoed = self.echoed or len(out) != len(text)
        return out

    def flush(self) -> str:
        """Give up waiting for the rest of the prefix: the held text is the attempt's own."""
        self._decided = True
        out, self._held = self._held, ""
        return out


class PrefixEcho:
    """The strippers of one choice, one per field the prefix has text for (`NextAttempt.prefix`)."""

    def __init__(self, prefix: Mapping[str, str]) -> None:
        self._fields = {name: EchoStrip(text) for name, text in prefix.items() if text}

    def feed(self, name: str, text: str) -> str:
        strip = self._fields.get(name)
        return text if strip is None else strip.feed(text)

    def flush(self) -> dict[str, str]:
        """Every field's held text (empty ones left out), before the choice's next non-text event or its end."""
        out = {name: strip.flush() for name, strip in self._fields.items()}
        return {name: text for name, text in out.items() if text}

    def strip(self, fields: Mapping[str, str]) -> dict[str, str]:
        """A whole message's fields (a non-streamed attempt), each without a leading copy of its prefix."""
        return {name: self._fields[name].whole(t) if name in self._fields else t for name, t in fields.items()}

    @property
    def echoed(self) -> frozenset[str]:
        """The fields whose prefix the attempt repeated, for the record."""
        return frozenset(name for name, strip in self._fields.items() if strip.echoed)
