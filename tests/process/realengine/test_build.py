"""The real engine's parts are what they claim to be: the tiny model rebuilds to the recorded bytes,
the cached server is the llama.cpp the sdist vendors, and the build script reuses its cache."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.process.engine_suite import check_a_warm_run_reuses_the_cache, run_with_only
from tests.process.realengine import tiny_model
from tests.process.realengine.engine import (
    BUILD_SCRIPT,
    MISSING_TOOLCHAIN,
    QWEN_TEMPLATE,
    Build,
    cache_root,
    file_sha256,
)

pytestmark = [pytest.mark.realengine]

SDIST_VERSION = "0.3.36"  # scripts/build-llama-server's VERSION


def test_tiny_model_rebuilds_to_the_recorded_sha256(llama_build: Build, tmp_path: Path) -> None:
    """The generator is the source of the model: the same gguf and numpy give the same bytes."""
    path = tmp_path / "tiny.gguf"
    tiny_model.write_model(path, chat_template=llama_build.template(QWEN_TEMPLATE).read_text())
    assert file_sha256(path) == tiny_model.MODEL_SHA256


def _vendored_llama_cpp_version() -> str:
    """LLAMA_VERSION as the vendored CMakeLists.txt sets it (read from the cached sdist)."""
    tarball = cache_root() / "llama-server" / "sdist" / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    with tarfile.open(tarball) as tar:
        member = tar.extractfile(f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/CMakeLists.txt")
        assert member is not None
        text = member.read().decode()
    parts = [re.search(rf"set\(LLAMA_VERSION_{p} (\d+)\)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    assert all(parts), "the vendored CMakeLists.txt no longer sets LLAMA_VERSION_MAJOR/MINOR/PATCH"
    dev = re.search(r'option\(LLAMA_BUILD_IS_DEV "[^"]*" ON\)', text) is not None
    return ".".join(m.group(1) for m in parts if m) + ("-dev" if dev else "")


def test_cached_server_is_the_vendored_llama_cpp(llama_build: Build) -> None:
    if os.environ.get("TAPFIX_LLAMA_SERVER"):
        pytest.skip("TAPFIX_LLAMA_SERVER names a binary of its own: not the vendored build")
    result = subprocess.run([str(llama_build.server), "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    # The sdist has no git history, so the build number is llama.cpp's fallback, 0.
    assert f"version: {_vendored_llama_cpp_version()} (build 0, commit unknown)" in result.stdout + result.stderr


def test_build_script_reuses_its_cache(llama_build: Build) -> None:
    kept = llama_build.server.resolve()
    check_a_warm_run_reuses_the_cache(BUILD_SCRIPT, llama_build, kept, 10, 120, "llama-server/.work-*")


def test_build_script_names_a_missing_cmake(tmp_path: Path) -> None:
    """Without cmake the script exits 3 and says so (the fixture's skip locally, failure in CI),
    before it downloads anything."""
    tools = ("bash", "dirname", "mkdir", "flock", "sha256sum", "cut", "printf", "readlink", "c++")
    result = run_with_only(BUILD_SCRIPT, tools, tmp_path)
    assert result.returncode == MISSING_TOOLCHAIN, result.stderr
    assert "cmake" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "cache" / "llama-server" / "sdist").exists()
