"""The vLLM suite's parts are what they claim to be: the tiny model rebuilds to its recorded digest, the
install script reuses its cache, names a missing Python 3.11, and takes an existing venv. The forcing rules,
pure, are tested in tests/unit/test_vllm_forcing_plan.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.process.realengine.engine import cache_root
from tests.process.vllm import tiny_qwen3
from tests.process.vllm.engine import INSTALL_SCRIPT, NO_PYTHON, Install


@pytest.mark.vllm
def test_tiny_model_rebuilds_to_the_recorded_digest(vllm_install: Install, tmp_path: Path) -> None:
    """The generator is the source of the model: the same numpy and template give the same bytes."""
    assert tiny_qwen3.write_model(tmp_path, vllm_install.template.read_text()) == tiny_qwen3.MODEL_SHA256
    assert tiny_qwen3.digest_of(tmp_path) == tiny_qwen3.MODEL_SHA256


@pytest.mark.vllm
def test_install_script_reuses_its_cache(vllm_install: Install) -> None:
    marker = vllm_install.dir / "venv" / "pyvenv.cfg"
    before = marker.stat().st_mtime_ns
    started = time.monotonic()
    result = subprocess.run([str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(vllm_install.dir)]
    assert seconds < 30, f"a warm run took {seconds:.1f}s: {result.stderr}"
    assert marker.stat().st_mtime_ns == before, "the warm run replaced the venv"
    assert vllm_install.route in ("cpu", "cuda", "external")
    assert not list((cache_root() / "vllm").glob(".sdist-*")), "a run left its download behind"


@pytest.mark.vllm
def test_an_existing_venv_is_used_as_it_is(vllm_install: Install, tmp_path: Path) -> None:
    """TAPFIX_VLLM names a venv: the script links it (no install) and adds only the template beside it."""
    venv = (vllm_install.dir / "venv").resolve()
    # the sdist the template comes from, as a cache that has it holds it (no second download)
    sdists = sorted(cache_root().glob("*/sdist/llama_cpp_python-*.tar.gz"))
    assert sdists, "the install took its template from a cached sdist"
    (tmp_path / "cache" / "vllm" / "sdist").mkdir(parents=True)
    (tmp_path / "cache" / "vllm" / "sdist" / sdists[0].name).symlink_to(sdists[0])
    env = {**os.environ, "TAPFIX_VLLM": str(venv), "TAPFIX_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([str(INSTALL_SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    out = Path(line)
    assert (out / "venv").resolve() == venv and (out / "route").read_text().strip() == "external"
    assert (out / "templates" / tiny_qwen3.TEMPLATE_NAME).read_text() == vllm_install.template.read_text()


def test_install_script_names_a_missing_python_311(tmp_path: Path) -> None:
    """Without a Python 3.11 the script exits 3 and says how to give one (the fixture's skip locally, a
    failure in CI), before it downloads anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mkdir", "flock", "sha256sum", "cut", "sed", "cat", "printf", "readlink"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TAPFIX_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        [str(bin_dir / "bash"), str(INSTALL_SCRIPT)], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == NO_PYTHON, result.stderr
    assert "Python 3.11" in result.stderr and "TAPFIX_VLLM_PYTHON" in result.stderr
    assert result.stdout == ""
    assert not list((tmp_path / "cache" / "vllm").glob("0.*"))
