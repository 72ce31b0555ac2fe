"""A tiny Qwen3-architecture model that vLLM's CPU build serves, written from code (numpy only, no torch).

vLLM needs a Hugging Face model directory: `config.json`, `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json` (with the chat template) and `generation_config.json`. This module writes one.

What the model says on its own: a fixed bigram chain. The generation prompt of Qwen3's template ends in a
newline, and after a newline the model writes `<think>Okay, the user wants a file written</think>`, then
`\n\nHello!` and `<|im_end|>` (its end of sequence). So it closes its reasoning itself, which is what lets
vLLM's structured outputs apply after it (they wait for the reasoning to end), and `enable_thinking: false`
is visible in behaviour: Qwen3's template then ends the prompt in `</think>\n\n`, after which the chain
gives `Hello!` alone. Anything a test needs the model to say beyond that is forced by the project's logits
processor (tests/process/vllm/served/tapfix_forcing.py), which works on token ids of this same tokenizer.

How: the attention and MLP weights are zero, so each layer adds nothing to the residual stream, and the
logits depend on the last token alone. Each token of the chain has an embedding with one channel of its own
set; the output matrix maps that channel to the next token of the chain with a margin of 22 logits. Every
other token shares one more channel, which maps to the newline: so any prompt (a raw completion's too) gets
`\n` and then the chain, and every answer ends on its own, at any temperature.

Constraints from vLLM (../shared/vllm-cpu.md): the CPU attention accepts head sizes 32, 64, 80, ... (32
here); the markers the parsers look for must each be a single token of the vocabulary (several match by
token id), added with `special: false` as the real tokenizers have them; `<|im_end|>` is the end of
sequence. The tokenizer is byte-level BPE with Qwen2's pre-tokenizer split, written as a `tokenizers` JSON
file, with merges for the chain's words first, then pairs (`PAIRS`).

The files are byte for byte reproducible (`MODEL_SHA256`, checked by a test that rebuilds them): numpy
writes the bf16 safetensors, JSON is written with sorted keys, and the chat template is llama.cpp's copy
of Qwen3's (models/templates/Qwen-Qwen3-0.6B.jinja in the llama-cpp-python sdist scripts/install-vllm
takes it from). `python -m tests.process.vllm.tiny_qwen3 TEMPLATE OUT_DIR` writes the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from tests.process.realengine.tiny_model import BYTES, encode_piece

TEMPLATE_NAME = "Qwen-Qwen3-0.6B.jinja"
CONTEXT_LENGTH = 32768  # fits an agent's first turn (opencode's is about 31 KB, a token per byte or so)
# The directory as write_model writes it with the template of llama-cpp-python 0.3.36's llama.cpp.
MODEL_SHA256 = "39e97c98411b0ff7cad6c9c100b26d6a3db2e40365953b913a03f1349358493f"

END = "<|im_end|>"
NEWLINE = "\n"
# What the model writes after a newline (the generation prompt's last token), piece by piece: each piece is
# one token. `REASONING` and `ANSWER` are what vLLM's qwen3 reasoning parser makes of it.
REASONING = "Okay, the user wants a file written"
ANSWER = "\n\nHello!"
CHAIN = ["<think>", "Okay", ",", " the", " user", " wants", " a", " file", " written", "</think>", "\n\n"]
CHAIN += ["Hello", "!", END]

# Added tokens: (text, special). Qwen's own, then the markers of each tool-call format the tests drive.
ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    (END, True),
    ("<think>", False),
    ("</think>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    # GLM-4.5/4.7 (glm45, glm47)
    ("<arg_key>", False),
    ("</arg_key>", False),
    ("<arg_value>", False),
    ("</arg_value>", False),
    # DeepSeek V3.1 (deepseek_v31)
    ("<｜tool▁calls▁begin｜>", False),
    ("<｜tool▁calls▁end｜>", False),
    ("<｜tool▁call▁begin｜>", False),
    ("<｜tool▁call▁end｜>", False),
    ("<｜tool▁sep｜>", False),
    # Kimi K2 (kimi_k2)
    ("<|tool_calls_section_begin|>", False),
    ("<|tool_calls_section_end|>", False),
    ("<|tool_call_begin|>", False),
    ("<|tool_call_end|>", False),
    ("<|tool_call_argument_begin|>", False),
]

# One layer with one attention head of 32 (the smallest head size vLLM's CPU attention takes): the weights
# are zero, but vLLM still computes attention over the whole prompt, and an agent's first turn is ~10,000
# tokens, so each head and layer costs seconds of prefill on a busy core.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 128, 1, 1, 32, 256, 1
LOGIT = 2.0  # times the normalized one-hot's sqrt(HIDDEN) = 11.3: a margin of 22.6 logits
RMS_EPS = 1e-6
# Qwen2's pre-tokenizer (as in Qwen2/Qwen3's tokenizer.json)
PRE_TOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3-0.6B's own sampling defaults (its generation_config.json): what `tapfix run --generation-config` reads.
SAMPLING = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


# Merges of two symbols, as a trained BPE has them by the thousand: letter pairs (a word takes about half its
# length in tokens), a space before a letter, and the punctuation pairs of JSON. Fewer tokens per text make
# every forced answer and every prompt cheaper (a token is a decode step; the prompt's attention is quadratic).
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PAIRS = [(a, b) for a in LETTERS for b in LETTERS] + [(" ", a) for a in LETTERS]
PAIRS += [("{", '"'), ('"', ":"), ('"', ","), (" ", '"'), ('"', "}"), ("}", "}")]


class Tokenizer:
    """The vocabulary: 256 byte tokens (GPT-2's byte symbols), the merges that reach the chain's words, the
    pair merges, then the added tokens. `ids` maps a token's text (as the model writes it) to its id."""

    def __init__(self) -> None:
        self.stored: list[str] = list(BYTES)  # id -> the token's text in byte symbols
        self.merges: list[tuple[str, str]] = []
        for piece in CHAIN:
            if piece in dict(ADDED):
                continue
            symbols = encode_piece(piece)
            for end in range(2, len(symbols) + 1):  # left to right: O+k, Ok+a, Oka+y
                self._merge(symbols[: end - 1], symbols[end - 1])
        for left, right in PAIRS:  # ranked after the chain's, so the chain's words stay whole
            self._merge(encode_piece(left), encode_piece(right))
        self.vocab_size_bpe = len(self.stored)
        self.added = [(len(self.stored) + i, text, special) for i, (text, special) in enumerate(ADDED)]
        # Byte tokens 128-255 alone are no text: only the ones that decode are named.
        self.ids: dict[str, int] = {}
        for i, symbols in enumerate(self.stored):
            raw = bytes(BYTES.index(c) for c in symbols)
            if raw.isascii() or i >= len(BYTES):
                self.ids[raw.decode()] = i
        self.ids.update({text: i for i, text, _ in self.added})

    def _merge(self, left: str, right: str) -> None:
        if (left, right) not in self.merges:
            self.merges.append((left, right))
        if left + right not in self.stored:
            self.stored.append(left + right)

    def __len__(self) -> int:
        return self.vocab_size_bpe + len(self.added)

    def tokenizer_json(self) -> dict:
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
        added = [
            {
                "id": i,
                "content": text,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": special,
            }
            for i, text, special in self.added
        ]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": PRE_TOKENIZER_REGEX},
                        "behavior": "Isolated",
                        "invert": False,
                    },
                    byte_level,
                ],
            },
            "post_processor": byte_level,
            "decoder": byte_level,
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": "",
                "end_of_word_suffix": "",
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": {s: i for i, s in enumerate(self.stored)},
                "merges": [[a, b] for a, b in self.merges],
            },
        }

    def tokenizer_config(self, chat_template: str) -> dict:
        return {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {
                str(i): {
                    "content": text,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": special,
                }
                for i, text, special in self.added
            },
            "bos_token": None,
            "chat_template": chat_template,
            "clean_up_tokenization_spaces": False,
            "eos_token": END,
            "errors": "replace",
            "model_max_length": CONTEXT_LENGTH,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }


def weights(tok: Tokenizer) -> dict[str, np.ndarray]:
    """Every tensor (rows = outputs, as torch's Linear keeps them), float32 before the bf16 cast."""
    f = np.float32
    vocab = len(tok)
    embed = np.zeros((vocab, HIDDEN), f)
    head = np.zeros((vocab, HIDDEN), f)
    chain = [NEWLINE, *CHAIN]
    other = HIDDEN - 1  # the channel of every token that isn't a step of the chain
    assert len(chain) - 1 < other
    embed[:, other] = 1.0
    head[tok.ids[NEWLINE], other] = LOGIT
    for channel, (piece, successor) in enumerate(zip(chain, chain[1:], strict=False)):
        embed[tok.ids[piece]] = 0.0
        embed[tok.ids[piece], channel] = 1.0
        head[tok.ids[successor], channel] = LOGIT
    tensors = {"model.embed_tokens.weight": embed, "lm_head.weight": head, "model.norm.weight": np.ones(HIDDEN, f)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN, f)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, f)
        tensors[p + "self_attn.q_proj.weight"] = np.zeros((HEADS * HEAD_DIM, HIDDEN), f)
        tensors[p + "self_attn.k_proj.weight"] = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN), f)
        tensors[p + "self_attn.v_proj.weight"] = np.zeros((KV_HEADS * HEAD_DIM, HIDDEN), f)
        tensors[p + "self_attn.o_proj.weight"] = np.zeros((HIDDEN, HEADS * HEAD_DIM), f)
        tensors[p + "self_attn.q_norm.weight"] = np.ones(HEAD_DIM, f)
        tensors[p + "self_attn.k_norm.weight"] = np.ones(HEAD_DIM, f)
        tensors[p + "mlp.gate_proj.weight"] = np.zeros((FFN, HIDDEN), f)
        tensors[p + "mlp.up_proj.weight"] = np.zeros((FFN, HIDDEN), f)
        tensors[p + "mlp.down_proj.weight"] = np.zeros((HIDDEN, FFN), f)
    return tensors


def bf16_bytes(array: np.ndarray) -> bytes:
    """float32 to bfloat16 (round to nearest even), little-endian: the top half of each float32."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    """The safetensors format: an 8-byte header length, a JSON header (names sorted, padded with spaces to a
    multiple of 8), then the tensors' bytes in header order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = bytearray()
    for name in sorted(tensors):
        raw = bf16_bytes(tensors[name])
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(data)


def config(tok: Tokenizer) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tok.ids["<|endoftext|>"],
        "eos_token_id": tok.ids[END],
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": FFN,
        "max_position_embeddings": CONTEXT_LENGTH,
        "max_window_layers": LAYERS,
        "model_type": "qwen3",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": RMS_EPS,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": len(tok),
    }


def generation_config(tok: Tokenizer) -> dict:
    return {
        "bos_token_id": tok.ids["<|endoftext|>"],
        "do_sample": True,
        "eos_token_id": [tok.ids[END], tok.ids["<|endoftext|>"]],
        "pad_token_id": tok.ids["<|endoftext|>"],
        **SAMPLING,
    }


def files(chat_template: str) -> dict[str, bytes]:
    """The model directory's files and their bytes."""
    tok = Tokenizer()

    def as_json(value: dict) -> bytes:
        return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()

    return {
        "config.json": as_json(config(tok)),
        "generation_config.json": as_json(generation_config(tok)),
        "model.safetensors": safetensors(weights(tok)),
        "tokenizer.json": as_json(tok.tokenizer_json()),
        "tokenizer_config.json": as_json(tok.tokenizer_config(chat_template)),
    }


def digest(contents: dict[str, bytes]) -> str:
    """One sha256 over the directory: each file's name and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(contents):
        h.update(name.encode() + b"\0" + len(contents[name]).to_bytes(8, "little") + contents[name])
    return h.hexdigest()


FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def digest_of(directory: Path) -> str | None:
    """The digest of a model directory on disk, or None when a file is missing."""
    try:
        return digest({name: (directory / name).read_bytes() for name in FILES})
    except FileNotFoundError:
        return None


def write_model(out: Path, chat_template: str) -> str:
    """Write the model directory; returns its digest."""
    contents = files(chat_template)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        (out / name).write_bytes(data)
    return digest(contents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("template", type=Path, help=f"Qwen3's chat template ({TEMPLATE_NAME})")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    print(write_model(args.out, args.template.read_text()))


if __name__ == "__main__":
    main()
