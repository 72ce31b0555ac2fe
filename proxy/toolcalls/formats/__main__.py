"""`python -m tapfix.proxy.toolcalls.formats`: the registered formats as docs/formats.md's table."""

from tapfix.proxy.toolcalls.formats import REGISTRY
from tapfix.proxy.toolcalls.formats.registry import markdown_table

print(markdown_table(REGISTRY.values()))
