"""OpenAI Chat Completions (`/v1/chat/completions`): the shape the defaults in `base.py` describe."""

from __future__ import annotations

from tapfix.proxy.surfaces.base import ALL_SAMPLING, ApiSurface

CHAT = ApiSurface(
    name="chat",
    path="chat/completions",
    conversation="messages",  # system and developer messages lead the turns: no field of their own
    max_tokens_fields=("max_completion_tokens", "max_tokens"),
    sampling_params=ALL_SAMPLING,
    seeded=True,
    continuable=True,
    reasoning_fields=True,
    asks_stream_usage=True,
    answer_field="choices",
    operation="chat",
    provider="openai",
)
