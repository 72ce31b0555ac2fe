"""Llama-Nemotron / Nemotron Nano v2: `<TOOLCALL>[{"name": N, "arguments": {…}}, …]</TOOLCALL>`.

As NVIDIA-Nemotron-Nano-v2.jinja renders it: one JSON list of calls (arguments an object, or the JSON
text the client sent) after the content and a newline. Nemotron 3 Nano writes Qwen3-Coder XML instead
(`qwen3_coder`).
"""

from __future__ import annotations

from tapfix.proxy.toolcalls.formats.tagged import TaggedJson

NEMOTRON = TaggedJson("nemotron", "Llama-Nemotron, Nemotron Nano v2", "<TOOLCALL>", "</TOOLCALL>")
