"""A tool-call parser name for vLLM that hands each request to one of vLLM's own parsers, chosen per request.

The tests drive five of vLLM's tool-call parsers (the seed's families and the mismatched `pythonic`), and a
vLLM start costs a minute on two busy cores, so one server serves them all: started with
`--tool-parser-plugin <this file> --tool-call-parser tapfix_switch`, it builds, for each request, the parser
that `chat_template_kwargs.tool_parser` names (`hermes` when it names none), exactly as vLLM builds a parser
configured by name (the same class, the same arguments). The object vLLM then holds is that parser itself,
not a wrapper: `__new__` returns it, so its parsing, its request adjustments and every attribute the serving
layer reads (engine-based streaming, structural tags, `supports_required_and_named`) are the real parser's.
Qwen3's chat template ignores the unknown template variable.
"""

from __future__ import annotations

from typing import Any

from vllm.parser.engine.adapters import ParserEngineToolAdapter
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

DEFAULT = "hermes"
KWARG = "tool_parser"


@ToolParserManager.register_module("tapfix_switch")
class ParserSwitch(ParserEngineToolAdapter):
    """A subclass of the engine adapter only so that vLLM hands it the construction kwargs
    (`chat_template_kwargs`, `model_config`) it hands engine-based parsers; it is never instantiated."""

    def __new__(cls, tokenizer: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        name = (kwargs.get("chat_template_kwargs") or {}).get(KWARG) or DEFAULT
        chosen = ToolParserManager.get_tool_parser(name)
        if issubclass(chosen, ParserEngineToolAdapter):  # as vllm/parser/abstract_parser.py Parser.__init__
            return chosen(tokenizer, tools, *args, **kwargs)
        return chosen(tokenizer, tools)
