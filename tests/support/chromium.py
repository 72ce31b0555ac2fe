"""Debian's headless Chromium as the browser tests and the README screenshot start it.

Without the background-networking flags Chromium keeps dialing Google's hosts, which this machine's
closed network refuses; a fresh --user-data-dir is added by each caller.
"""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--hide-scrollbars",
]
