"""Issue 37: where each engine states its window, and where on its server tapfix asks (one rule for
`tapfix check` and `tapfix run`)."""

from __future__ import annotations

import pytest
from tapfix.proxy.window.sources import engine_url, from_ollama_ps, from_ollama_show, probes_for


@pytest.mark.parametrize(
    ("base", "path", "url"),
    [
        ("http://h:8000", "/v1/models", "http://h:8000/v1/models"),
        ("http://h:8000/v1", "/v1/models", "http://h:8000/v1/models"),  # /v1 never doubled
        ("http://h:8000/v1/", "/props", "http://h:8000/props"),  # llama.cpp's root paths beside /v1
        ("http://h/llm/v1", "/api/ps", "http://h/llm/api/ps"),  # a prefix of its own is kept
        ("http://h/llm", "/v1/model", "http://h/llm/v1/model"),
    ],
)
def test_engine_url(base, path, url):
    assert engine_url(base, path) == url


# The shapes of docs.ollama.com/api/ps (models[].context_length: the window a loaded model runs with) and
# docs.ollama.com/api/show (parameters as Modelfile lines, model_info keyed by the architecture).
PS = {
    "models": [
        {
            "name": "gemma3:latest",
            "model": "gemma3:latest",
            "size": 6591830464,
            "digest": "a2af6cc3eb7fa8be8504abaf9b04e88f17a119ec3f04a3addf55f92841195f5a",
            "details": {"format": "gguf", "family": "gemma3", "parameter_size": "4.3B", "quantization_level": "Q4_K_M"},
            "expires_at": "2025-10-17T16:47:07.93355-07:00",
            "size_vram": 5333539264,
            "context_length": 4096,
        }
    ]
}
SHOW = {
    "parameters": 'num_ctx                        8192\nstop                           "<end_of_turn>"',
    "model_info": {"general.architecture": "gemma3", "gemma3.context_length": 131072},
}


def test_ollama_windows():
    assert from_ollama_ps(PS, "gemma3") == 4096  # `gemma3` is `gemma3:latest`
    assert from_ollama_ps(PS, "qwen3:8b") is None  # not loaded: /api/show says
    assert from_ollama_show(SHOW, "gemma3") == 8192  # the Modelfile's num_ctx wins
    assert from_ollama_show({"model_info": SHOW["model_info"]}, "gemma3") == 131072  # else the model's own
    assert from_ollama_show({"parameters": "stop x"}, "m") is None
    assert [p.label for p in probes_for("ollama")] == ["GET /api/ps", "POST /api/show"]
