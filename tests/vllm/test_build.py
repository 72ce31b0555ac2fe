"""The vLLM suite's parts are what they claim to be: the tiny model rebuilds to its recorded digest, the
install script reuses its cache, names a missing Python 3.11, and takes an existing venv; the forcing rules
(the directive and how much of the text a prompt already holds) do what the logits processor relies on."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.realengine.engine import cache_root
from tests.vllm import tiny_qwen3
from tests.vllm.engine import INSTALL_SCRIPT, NO_PYTHON, Install
from tests.vllm.served.forcing_plan import ASSISTANT, already_written, directive, remaining, script


@pytest.mark.e2e
@pytest.mark.vllm
def test_tiny_model_rebuilds_to_the_recorded_digest(vllm_install: Install, tmp_path: Path) -> None:
    """The generator is the source of the model: the same numpy and template give the same bytes."""
    assert tiny_qwen3.write_model(tmp_path, vllm_install.template.read_text()) == tiny_qwen3.MODEL_SHA256
    assert tiny_qwen3.digest_of(tmp_path) == tiny_qwen3.MODEL_SHA256


@pytest.mark.e2e
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


@pytest.mark.e2e
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


@pytest.mark.e2e
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


# --- the forcing rules (pure: no server) ---------------------------------------------------------------


# Any text but the markup the rules look for (`<` of Qwen's headers, `[` of a directive).
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="<["), max_size=40)


@given(st.lists(TEXT, min_size=1, max_size=4), TEXT, TEXT)
def test_a_directive_carries_its_texts_exactly_and_the_last_one_counts(texts, before, after) -> None:
    prompt = f"{before}{directive('ignored')}{before}{directive(*texts)}{after}"
    assert script(prompt) == texts


@given(st.lists(TEXT, min_size=1, max_size=3), st.integers(0, 3))
def test_each_turn_gets_its_own_text(texts, done) -> None:
    history = "".join(f"{ASSISTANT}answer {n}<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n" for n in range(done))
    prompt = f"<|im_start|>user\nhi {directive(*texts)}<|im_end|>\n{history}{ASSISTANT}"
    assert remaining(prompt) == (texts[done] if done < len(texts) else None)


def test_without_a_directive_nothing_is_forced() -> None:
    assert remaining(f"<|im_start|>user\nhi<|im_end|>\n{ASSISTANT}") is None


@given(TEXT, st.integers(0, 40))
def test_a_continued_prefix_is_not_written_again(text, cut) -> None:
    prefix = text[:cut]
    assert already_written(prefix, text) == len(prefix)
    prompt = f"<|im_start|>user\n{directive(text)}<|im_end|>\n{ASSISTANT}{prefix}"
    assert remaining(prompt) == text[len(prefix) :]


def test_a_template_that_renders_the_open_message_differently_is_followed_by_its_tail() -> None:
    """Qwen3 renders a continued answer after an empty think block, and the cut may drop its trailing
    whitespace: the model writes on after the part of the text the open message ends with."""
    text = "<think>\nI will write it.\n</think>\n\nWriting now.\n<tool_call>\n{}\n</tool_call>"
    assert already_written("<think>\n\n</think>\n\nWriting now.", text) == text.index("Writing now.") + 12
    # Qwen3's own think block for `enable_thinking: false` is not the model's text: it writes it all
    assert already_written("<think>\n\n</think>\n\n", "Hello!") == 0
