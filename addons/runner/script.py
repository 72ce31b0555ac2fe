"""What a stock `mitmdump -s addons/<file>.py` does with a tapfix addon: refuse, loudly.

Decided: not supported. Every tapfix addon shares one runtime (settings, upstream targets, the
capture writer, the request policy) that `tapfix run` builds before mitmproxy starts; an addon
loaded alone would have none of it and would silently do nothing, which is worse than an error.

Each addon module re-exports `load` from here. mitmproxy calls a module-level hook only when it
registers the module itself as an addon, which happens only under `-s` (tapfix registers
instances of the addon classes), so this never runs inside `tapfix run`. An error logged during
start-up makes mitmdump print "Error logged during startup, exiting..." and exit with status 1.
"""

from __future__ import annotations

import logging

MESSAGE = (
    "tapfix addons run inside `tapfix run`, which builds the runtime they share (settings, upstreams, "
    "the capture store); a stock `mitmdump -s` cannot load them. Use `tapfix run --upstream URL` "
    "(or `--config FILE`)."
)


def load(loader: object) -> None:
    logging.getLogger("tapfix").error(MESSAGE)
