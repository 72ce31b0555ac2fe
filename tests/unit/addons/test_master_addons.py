"""The mitmproxy `tapfix run` builds (addons/runner/master.py) keeps only mitmproxy's addons that act on tapfix's
traffic: the ones it leaves out of mitmdump's defaults act only on their own options, which tapfix never sets."""

from __future__ import annotations

import asyncio

import pytest
from mitmproxy import options
from mitmproxy.tools.dump import DumpMaster
from tapfix.addons.runner.master import _mitmproxy, build_runtime, mitm_options
from tapfix.proxy.config.settings import Settings

MODES = {
    "reverse": Settings(upstream="http://127.0.0.1:9"),
    "regular": Settings(mode="regular", intercept=("gpu-box",), upstream_ca="/dev/null", insecure=True),
}


def declared(make: object) -> set[str]:
    async def build() -> set[str]:
        return set(make(options.Options()).options.keys())  # type: ignore[operator]

    return asyncio.run(build())


@pytest.mark.parametrize("mode", list(MODES))
def test_every_option_tapfix_sets_belongs_to_an_addon_it_keeps(mode: str) -> None:
    settings = MODES[mode]
    wanted = set(mitm_options(settings, build_runtime(settings)))
    kept = declared(_mitmproxy)
    left_out = declared(lambda o: DumpMaster(o, with_termlog=True, with_dumper=False)) - kept
    assert left_out, "mitmdump's defaults declare options of addons tapfix leaves out"
    assert wanted <= kept, wanted - kept
    assert not wanted & left_out, f"tapfix sets an option of an addon it leaves out: {wanted & left_out}"
