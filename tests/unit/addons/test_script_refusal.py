"""Every tapfix addon file, loaded as a stock `mitmdump -s` loads it, refuses with the message
(addons/runner/script.py): its module-level `load` is the one that logs it. What that does to a real
mitmdump (exit status 1) is tests/process/test_mitmdump_script.py's."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mitmproxy.addons.script import load_script
from tapfix.addons.runner import script

ROOT = Path(__file__).resolve().parents[3]
ADDON_FILES = sorted(p for p in (ROOT / "addons").glob("*.py") if p.name != "__init__.py")


def test_every_addon_file_is_covered() -> None:
    assert {p.stem for p in ADDON_FILES} >= {"auth", "health", "recorder", "router", "stream"}


@pytest.mark.parametrize("addon", ADDON_FILES, ids=lambda p: p.stem)
def test_an_addon_file_loaded_alone_logs_the_refusal(addon: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = load_script(str(addon))
    assert module is not None, f"mitmproxy could not load {addon}"
    assert module.load is script.load
    with caplog.at_level(logging.ERROR):
        module.load(object())
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, script.MESSAGE)]
