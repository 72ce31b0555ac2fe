"""The in-process tier's fixtures (tests/support/inproc.py): the module's mock and proxy, served by threads of
the test process, and the session's CA folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.inproc import InprocMock, InprocProxy, start_mock, start_proxy


@pytest.fixture(scope="session", autouse=True)
def tapfix_ca_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One mitmproxy CA for the session's in-process proxies, made by the first one (a `tapfix run` process
    makes its own under the user's config folder). XDG_CONFIG_HOME is where tapfix looks for it."""
    home = tmp_path_factory.mktemp("config")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def one_proxy_left_behind_at_most() -> Iterator[None]:
    """A proxy a test started and left running would make every later start in this worker fail (one at a
    time): it is stopped here, and the test fails for it. Module fixtures start theirs before this runs, and
    a module's (shared) proxy that comes back during a test, after an earlier test's proxy made it step
    aside, is still the module's."""
    before = InprocProxy.running
    yield
    left = InprocProxy.running
    if left is not None and left is not before and not left.shared:
        left.stop()
        pytest.fail(f"the test left an in-process proxy running ({left.url}, {left.args}): stop it in a finally")


@pytest.fixture(scope="module")
def mock(module_tmp: Path) -> Iterator[InprocMock]:
    handle = start_mock(module_tmp)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def proxy(module_tmp: Path, mock: InprocMock) -> Iterator[InprocProxy]:
    """The module's proxy in front of its mock; stopped (and its capture writer drained) when the module ends."""
    handle = start_proxy(module_tmp, mock.url, shared=True)
    yield handle
    handle.stop()
