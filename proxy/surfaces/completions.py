"""OpenAI's legacy Completions (`/v1/completions`): a prompt, no conversation; chat-shaped streams."""

from __future__ import annotations

from tapfix.proxy.surfaces.base import ALL_SAMPLING, ApiSurface

COMPLETIONS = ApiSurface(
    name="completions",
    path="completions",
    max_tokens_fields=("max_tokens",),
    sampling_params=ALL_SAMPLING,
    reasoning_fields=True,
    operation="text_completion",
    provider="openai",
)
