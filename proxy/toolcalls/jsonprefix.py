"""An incremental check that streamed text is still the start of some valid JSON object.

The prefix-streaming mode forwards an argument fragment only while the arguments so far can still be
completed into valid JSON; the first fragment that makes that impossible stops the streaming. Tool
arguments reach megabytes (whole files in `write` calls) and arrive in fragments of a few bytes, so the
check keeps its state between fragments and scans each fragment once: linear in the total size. Runs
of string characters, whitespace and digits are skipped with one regex match each, so a long string
costs a few regex calls rather than a Python step per character.

The grammar is RFC 8259 (what `json.loads` accepts minus NaN/Infinity) with the top-level value
restricted to an object, as tool arguments must be one. Rejecting more than json.loads (NaN) only
means a valid stream is held instead of streamed, never that a wrong call goes out. For the same
reason an optional `expect(key, first_char)` hook may refuse a top-level value as soon as it starts
(the schema says a boolean and a `"` comes: a value the repair would change once it is complete).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

# States.
_START, _OBJ_FIRST, _OBJ_KEY, _COLON, _VALUE, _ARR_FIRST, _AFTER, _DONE = range(8)
_STRING, _ESCAPE, _UHEX, _NUMBER, _LITERAL, _FAILED = range(8, 14)
# Number sub-states; the ones in _NUM_END may end the number.
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_NUM_END = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP))

_WS = re.compile(r"[ \t\r\n]*")
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_DIGITS = re.compile(r"[0-9]*")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_CLOSE = {"{": "}", "[": "]"}


def _end(pattern: re.Pattern[str], text: str, i: int) -> int:
    """End of a run: the patterns match the empty string, so there is always a match."""
    return cast("re.Match[str]", pattern.match(text, i)).end()


class JsonPrefix:
    """Feed text piece by piece; `ok` stays True while the text so far is a valid JSON-object prefix."""

    __slots__ = ("state", "stack", "key", "num", "rest", "hex_left", "size", "expect", "keybuf", "top_key")

    def __init__(self, expect: Callable[[str, str], bool] | None = None) -> None:
        self.state = _START
        self.stack: list[str] = []  # open containers, "{" or "["
        self.key = False  # the open string is an object key
        self.num = _N_INT
        self.rest = ""  # what a started literal (true/false/null) still needs
        self.hex_left = 0
        self.size = 0  # characters fed, for callers that report how much was checked
        self.expect = expect
        self.keybuf: list[str] | None = None  # raw text of a top-level key being read
        self.top_key = ""  # raw text (escapes kept) of the last top-level key

    @property
    def ok(self) -> bool:
        return self.state != _FAILED

    @property
    def complete(self) -> bool:
        """The top-level object is closed (only whitespace may follow)."""
        return self.state == _DONE

    def closers(self) -> str | None:
        """The brackets that would complete the text here, or None if more than brackets is missing.

        Only offered between values (or right after an opening bracket): a text that stops inside a
        string, a number or a literal, or after a colon or comma, was cut, and is not completed.
        """
        if (self.state == _NUMBER and self.num in _NUM_END) or self.state in (_AFTER, _OBJ_FIRST, _ARR_FIRST):
            return "".join(_CLOSE[c] for c in reversed(self.stack))
        return "" if self.state == _DONE else None

    def feed(self, text: str) -> bool:
        """Scan only `text`, continuing from the previous state; returns `ok`."""
        if self.state == _FAILED:
            return False
        self.size += len(text)
        i, n = 0, len(text)
        while i < n:
            state = self.state
            if state == _STRING:
                j = _end(_STRING_RUN, text, i)
                if self.keybuf is not None:
                    self.keybuf.append(text[i : j + 1])
                i = j
                if i >= n:
                    break
                c = text[i]
                i += 1
                if c == '"':
                    if self.key:
                        self.state = _COLON
                        if self.keybuf is not None:
                            self.top_key, self.keybuf = "".join(self.keybuf)[:-1], None
                    else:
                        self._value_done()
                elif c == "\\":
                    self.state = _ESCAPE
                else:  # a raw control character: json.loads (strict) refuses it
                    return self._fail()
                continue
            if state == _NUMBER:
                i = self._number(text, i, n)
                if self.state == _FAILED:
                    return False
                continue
            c = text[i]
            if c in " \t\r\n" and state < _STRING:  # whitespace only between tokens
                i = _end(_WS, text, i)
                continue
            i += 1
            if self.keybuf is not None and state in (_ESCAPE, _UHEX):
                self.keybuf.append(c)
            if state == _ESCAPE:
                if c not in _ESCAPES:
                    return self._fail()
                if c == "u":
                    self.state, self.hex_left = _UHEX, 4
                else:
                    self.state = _STRING
            elif state == _UHEX:
                if c not in _HEX:
                    return self._fail()
                self.hex_left -= 1
                if not self.hex_left:
                    self.state = _STRING
            elif state == _LITERAL:
                if c != self.rest[0]:
                    return self._fail()
                self.rest = self.rest[1:]
                if not self.rest:
                    self._value_done()
            elif state == _START:
                if c != "{":
                    return self._fail()
                self.stack.append("{")
                self.state = _OBJ_FIRST
            elif state in (_OBJ_FIRST, _OBJ_KEY):
                if c == '"':
                    self.state, self.key = _STRING, True
                    if len(self.stack) == 1 and self.expect is not None:
                        self.keybuf = []
                elif c == "}" and state == _OBJ_FIRST:
                    self.stack.pop()
                    self._value_done()
                else:
                    return self._fail()
            elif state == _COLON:
                if c != ":":
                    return self._fail()
                self.state = _VALUE
            elif state in (_VALUE, _ARR_FIRST):
                if c == "]" and state == _ARR_FIRST:
                    self.stack.pop()
                    self._value_done()
                elif not self._start_value(c):
                    return False
            elif state == _AFTER:
                top = self.stack[-1]
                if c == ",":
                    self.state = _OBJ_KEY if top == "{" else _VALUE
                elif c == _CLOSE[top]:
                    self.stack.pop()
                    self._value_done()
                else:
                    return self._fail()
            else:  # _DONE: anything but whitespace after the object
                return self._fail()
        return True

    def _start_value(self, c: str) -> bool:
        if self.expect is not None and self.stack == ["{"] and not self.expect(self.top_key, c):
            return self._fail()
        if c == "{" or c == "[":
            self.stack.append(c)
            self.state = _OBJ_FIRST if c == "{" else _ARR_FIRST
        elif c == '"':
            self.state, self.key = _STRING, False
        elif c == "-":
            self.state, self.num = _NUMBER, _N_MINUS
        elif c == "0":
            self.state, self.num = _NUMBER, _N_ZERO
        elif "1" <= c <= "9":
            self.state, self.num = _NUMBER, _N_INT
        elif c in _LITERALS:
            self.state, self.rest = _LITERAL, _LITERALS[c]
        else:
            return self._fail()
        return True

    def _number(self, text: str, i: int, n: int) -> int:
        """Advance through a number; on its first non-number character hand back to the main loop."""
        while i < n:
            c = text[i]
            num = self.num
            if "0" <= c <= "9":
                if num == _N_ZERO:
                    self._fail()  # a leading zero followed by a digit
                    return i
                end = _end(_DIGITS, text, i)
                if num == _N_MINUS:
                    if c == "0" and end - i > 1:
                        self._fail()  # "-01"
                        return i
                    self.num = _N_ZERO if c == "0" else _N_INT
                    i = end
                    continue
                i = end
                if num in (_N_DOT, _N_FRAC):
                    self.num = _N_FRAC
                elif num != _N_INT:
                    self.num = _N_EXP
                continue
            if c == "." and num in (_N_ZERO, _N_INT):
                self.num = _N_DOT
            elif c in "eE" and num in (_N_ZERO, _N_INT, _N_FRAC):
                self.num = _N_E
            elif c in "+-" and num == _N_E:
                self.num = _N_ESIGN
            elif num in _NUM_END:
                self._value_done()
                return i  # the main loop reads `c` as what follows the value
            else:
                self._fail()
                return i
            i += 1
        return i

    def _value_done(self) -> None:
        self.state = _AFTER if self.stack else _DONE

    def _fail(self) -> bool:
        self.state = _FAILED
        return False
