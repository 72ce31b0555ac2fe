"""The vLLM suite's parts are what they claim to be: the tiny model rebuilds to its recorded digest; the
install script reuses its cache, names a missing Python 3.11, takes an existing venv, fails cleanly and waits
for another run's lock. The forcing rules, pure, are tested in tests/unit/test_vllm_forcing_plan.py."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from tests.process.engine_suite import cache_root, check_a_warm_run_reuses_the_cache, run_with_only
from tests.process.vllm import tiny_qwen3
from tests.process.vllm.engine import INSTALL_SCRIPT, NO_PYTHON, Install
from tests.support.ci import unavailable


@pytest.mark.vllm
def test_tiny_model_rebuilds_to_the_recorded_digest(vllm_install: Install, tmp_path: Path) -> None:
    """The generator is the source of the model: the same numpy and template give the same bytes."""
    assert tiny_qwen3.write_model(tmp_path, vllm_install.template.read_text()) == tiny_qwen3.MODEL_SHA256
    assert tiny_qwen3.digest_of(tmp_path) == tiny_qwen3.MODEL_SHA256


@pytest.mark.vllm
def test_install_script_reuses_its_cache(vllm_install: Install) -> None:
    kept = vllm_install.dir / "venv" / "pyvenv.cfg"
    check_a_warm_run_reuses_the_cache(INSTALL_SCRIPT, vllm_install, kept, 30, 300, "vllm/.sdist-*")
    assert vllm_install.route in ("cpu", "cuda", "external")


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
    tools = ("bash", "dirname", "mkdir", "flock", "sha256sum", "cut", "sed", "cat", "printf", "readlink")
    result = run_with_only(INSTALL_SCRIPT, tools, tmp_path)
    assert result.returncode == NO_PYTHON, result.stderr
    assert "Python 3.11" in result.stderr and "TAPFIX_VLLM_PYTHON" in result.stderr
    assert result.stdout == ""
    assert not list((tmp_path / "cache" / "vllm").glob("0.*"))


def test_a_failed_install_prints_its_log_and_leaves_nothing_a_later_run_would_use(tmp_path: Path) -> None:
    """pip can't find torch (no index, an empty wheel folder): the script exits 1 with the log's tail on stderr,
    prints no directory, and the half-built venv has no `.complete`, so a later run installs again."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "TAPFIX_VLLM"))}
    env |= {
        "TAPFIX_CACHE": str(tmp_path / "cache"),
        "TAPFIX_VLLM_ROUTE": "cpu",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(empty),
    }
    result = subprocess.run([str(INSTALL_SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    if result.returncode == NO_PYTHON:
        unavailable(f"vLLM suite: {result.stderr.strip()}")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "the install failed; the last 60 lines of" in result.stderr
    assert "torch==2.13.0" in result.stderr.split("the install failed", 1)[1]  # pip's own words, from the log
    [half_built] = (tmp_path / "cache" / "vllm").glob("0.*")
    assert not (half_built / ".complete").exists()


@pytest.mark.vllm
def test_a_second_run_waits_for_the_first_ones_lock(vllm_install: Install, tmp_path: Path) -> None:
    """Two runs never share a half-built venv: while one holds the cache's lock, another prints nothing and
    makes nothing; it goes on once the lock is free."""
    venv = (vllm_install.dir / "venv").resolve()
    sdists = sorted(cache_root().glob("*/sdist/llama_cpp_python-*.tar.gz"))
    (tmp_path / "cache" / "vllm" / "sdist").mkdir(parents=True)
    (tmp_path / "cache" / "vllm" / "sdist" / sdists[0].name).symlink_to(sdists[0])
    env = {**os.environ, "TAPFIX_VLLM": str(venv), "TAPFIX_CACHE": str(tmp_path / "cache")}
    with open(tmp_path / "cache" / "vllm" / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a first run holds it
        waiting = subprocess.Popen(
            [str(INSTALL_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                waiting.wait(3)
            assert not list((tmp_path / "cache" / "vllm").glob("external-*"))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0, err
    [line] = out.splitlines()
    assert (Path(line) / "venv").resolve() == venv
