"""The project's logits processor for vLLM: the model writes exactly the text the prompt's directive names.

vLLM loads it at start with `--logits-processors tapfix_forcing:ForcedText` (this folder on PYTHONPATH) and
runs it for every request of every surface (Chat Completions, Completions, Messages, Responses). It reads
the prompt's token ids when a request joins the batch; with a directive in the prompt (forcing_plan.py has
the format and the rules), it masks every logit but the next token of the text still to write, then the end
of sequence. The text is tokenized with the model's own tokenizer, so the markers the parsers look for come
out as the single tokens a real model writes. Requests without a directive are left alone.

This is vLLM v1's `LogitsProcessor` interface (vllm/v1/sample/logits_processor/interface.py): batch rows
come and go by index (`update_state`: removed, then added, then moved), and each added request hands over a
live reference to its output token list, so the position in the text is that list's length.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from forcing_plan import remaining
from transformers import AutoTokenizer
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class ForcedText(LogitsProcessor):
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        model = vllm_config.model_config
        self.tokenizer = AutoTokenizer.from_pretrained(model.tokenizer, revision=model.tokenizer_revision)
        self.eos = self.tokenizer.eos_token_id
        self.rows: dict[int, tuple[list[int], list[int]]] = {}  # batch row -> (forced ids, output ids so far)

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax: greedy requests are forced too

    def _forced(self, prompt_ids: list[int] | None) -> list[int] | None:
        if not prompt_ids:
            return None
        text = remaining(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if text is None:
            return None
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.eos]

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, prompt_ids, output_ids in batch_update.added:
            forced = self._forced(prompt_ids)
            if forced is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (forced, output_ids)
        for a, b, direction in batch_update.moved:
            row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
            if row_a is not None:
                self.rows[b] = row_a
            if row_b is not None and direction == MoveDirectionality.SWAP:
                self.rows[a] = row_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (forced, output_ids) in self.rows.items():
            done = len(output_ids)
            token = forced[done] if done < len(forced) else self.eos
            logits[index] = float("-inf")
            logits[index, token] = 0.0
        return logits
