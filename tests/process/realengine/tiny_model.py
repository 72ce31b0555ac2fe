"""A tiny llama-architecture GGUF whose behaviour is set by hand, so a real llama-server can be tested.

Random weights ramble to `max_tokens` and never call a tool. This model instead behaves like a
small instruction-tuned one, deterministically, with every weight chosen on purpose:

- with tools offered and no tool result yet, it calls `write` once (Hermes `<tool_call>` markup,
  which llama.cpp picks for the Qwen2.5 template) and stops;
- after a tool result, or with no tools, it answers with a short fixed text and stops;
- with a reasoning template (QwQ's prompt ends in `<think>`) it reasons briefly first, closes with
  `</think>`, then answers.

How: one layer. Every token's embedding is a constant channel plus a one-hot identity channel.
Four attention heads in layer 0 each detect one marker in the context (`<tools>`,
`<tool_response>`, `<think>`, `</think>`): a constant query meets a key only the marker has, so
the head's output is ~1 when the marker is present anywhere and exactly 0 when it is absent.
`rope_freqs` freezes every rope pair, so detection does not depend on position. Two FFN units
threshold "generation starts here and tools are pending" and "... and thinking is open"; the
output matrix then reads a successor table over the identity channels (each emitted piece is its
own vocabulary token, so a bigram table spells whole strings) and lets the units override the
first piece. The rest of the vocabulary gets logit 0: a prompt the tables don't cover degenerates
into byte noise, which is what a broken model does too.

`python -m tests.process.realengine.tiny_model --template FILE OUT` writes the model; `generate` is the
numpy forward pass the tests compare llama-server against. gguf and numpy are pinned in
pyproject.toml, so the bytes (and `MODEL_SHA256`) are reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import numpy as np

from tests.support.builders import message_tool_call, tool

CALL_NAME = "write"
CALL_ARGUMENTS = {"content": "Hello from the tiny model.", "filePath": "hello.txt"}
ANSWER = "Hello from the tiny model."
REASONING = "The user wants a greeting, so I answer:"
CONTEXT_LENGTH = 65536
# The tool the model calls, as a client offers it. The schema lists the arguments in the order the model
# writes them: llama.cpp's tool-call grammar keeps the schema's property order and refuses any other.
WRITE_TOOL = tool(
    CALL_NAME, {name: {"type": "string"} for name in CALL_ARGUMENTS}, list(CALL_ARGUMENTS), description="Write a file"
)
TOOL_RESULT = "Wrote file successfully."


def after_the_call(question: str = "hi", call_id: str = "call_1") -> list[dict]:
    """A conversation in which the model's call has run: the question, the call, its result."""
    call = message_tool_call(json.dumps(CALL_ARGUMENTS), call_id, CALL_NAME)
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": TOOL_RESULT},
    ]


# The model as write_model writes it with the Qwen2.5 template of llama-cpp-python 0.3.36.
MODEL_SHA256 = "c49e0bb7c7f52f87d7c61c4b8f36cca192c435e7feb1575aa6768476c51ef276"

SPECIALS = {
    "<|endoftext|>": "control",
    "<|im_start|>": "control",
    "<|im_end|>": "control",
    "<tools>": "user",
    "</tools>": "user",
    "<tool_call>": "user",
    "</tool_call>": "user",
    "<tool_response>": "user",
    "</tool_response>": "user",
    "<think>": "user",
    "</think>": "user",
}
# Each piece the model emits is one token; the pieces of a string concatenate to it exactly.
CALL_PIECES = [
    '\n{"name": "' + CALL_NAME + '", "arguments": {"content": "',
    CALL_ARGUMENTS["content"],
    '", "filePath": "',
    CALL_ARGUMENTS["filePath"],
    '"}}\n',
]
# The answer and the reasoning are cut where llama.cpp's qwen2 pre-tokenizer cuts them, and the merges reach
# each piece, so a prefix of them (an assistant prefill: "Hello from") tokenizes into the model's own pieces
# and it continues from there (" the tiny model.") as it would have.
ANSWER_PIECES = ["Hello", " from", " the", " tiny", " model", "."]
REASONING_PIECES = ["The", " user", " wants", " a", " greeting", ",", " so", " I", " answer", ":"]
MARKERS = ["<tools>", "<tool_response>", "<think>", "</think>"]  # one attention head each
NEWLINE = "\n"
END = "<|im_end|>"

N_EMBD, N_HEAD, N_FF = 64, 4, 8
HEAD_DIM = N_EMBD // N_HEAD
RMS_EPS = 1e-5
SCORE = 30.0  # a marker's attention score: e^30 outweighs any context length by far
LOGIT = 12.0  # chain logit per unit of normalized identity; the units override by 3x and 5x
UNIT_GAIN = 20.0


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the text of the 256 byte tokens, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


BYTES = _byte_symbols()


def encode_piece(text: str) -> str:
    """A normal token's stored text: its UTF-8 bytes in GPT-2's byte symbols."""
    return "".join(BYTES[b] for b in text.encode())


class Vocab:
    """Token texts as the model emits them (plain text), in id order, and the BPE that reaches them."""

    def __init__(self) -> None:
        self.texts: list[str] = [bytes([b]).decode("latin-1") for b in range(256)]
        self.stored: list[str] = list(BYTES)
        self.kinds: list[str] = ["normal"] * 256
        self.merges: list[str] = []
        self._merge("Ġ", "Ġ")  # two spaces: llama.cpp refuses a BPE vocabulary without merges
        for text, kind in SPECIALS.items():
            self._add(text, text, kind)
        for text in CALL_PIECES:  # emitted whole, never reached from text (the client never sends them)
            self._add(text, encode_piece(text), "normal")
        for text in [*ANSWER_PIECES, *REASONING_PIECES]:
            stored = encode_piece(text)
            for end in range(2, len(stored) + 1):  # left to right: H+e, He+l, Hel+l, Hell+o
                self._merge(stored[: end - 1], stored[end - 1])
        self.ids = {text: i for i, text in enumerate(self.texts)}
        self._by_stored = {stored: i for i, stored in enumerate(self.stored)}
        self._ranks = {tuple(m.split(" ")): rank for rank, m in enumerate(self.merges)}

    def _merge(self, left: str, right: str) -> None:
        if f"{left} {right}" not in self.merges:
            self.merges.append(f"{left} {right}")
        if left + right not in self.stored:
            self._add(bytes(BYTES.index(c) for c in left + right).decode(), left + right, "normal")

    def _add(self, text: str, stored: str, kind: str) -> None:
        assert stored not in self.stored, f"duplicate token {text!r}"
        self.texts.append(text)
        self.stored.append(stored)
        self.kinds.append(kind)

    def __len__(self) -> int:
        return len(self.texts)

    def tokenize(self, prompt: str) -> list[int]:
        """Specials first, then qwen2's pre-tokenizer and byte-level BPE, as llama.cpp does it."""
        out: list[int] = []
        for part in re.split("(" + "|".join(re.escape(s) for s in SPECIALS) + ")", prompt):
            if part in SPECIALS:
                out.append(self.ids[part])
                continue
            for word in PRE_TOKEN.findall(part):
                out.extend(self._by_stored[symbol] for symbol in self._bpe(encode_piece(word)))
        return out

    def _bpe(self, word: str) -> list[str]:
        symbols = list(word)
        while len(symbols) > 1:
            pairs = [(self._ranks.get((a, b)), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:], strict=False))]
            ranked = [(rank, i) for rank, i in pairs if rank is not None]
            if not ranked:
                break
            _, i = min(ranked)
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        return symbols


# llama.cpp's qwen2 pre-tokenizer: \p{L} written [^\W\d_], \p{N} \d, [^\s\p{L}\p{N}] (?:[^\s\w]|_).
PRE_TOKEN = re.compile(
    r"'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|(?:[^\r\n\w]|_)?[^\W\d_]+|\d"
    r"| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class Layout:
    """Which residual channel means what."""

    def __init__(self, vocab: Vocab) -> None:
        names = ["const", "other", "p_tools", "p_response", "p_think", "p_endthink", "u_call", "u_think"]
        watched = [NEWLINE, "<tool_call>", "</tool_call>", "</think>", *MARKERS]
        watched += [*CALL_PIECES, *ANSWER_PIECES, *REASONING_PIECES]
        self.channel: dict[str, int] = {}
        for name in names:
            self.channel[name] = len(self.channel)
        for text in dict.fromkeys(watched):
            self.channel["id:" + text] = len(self.channel)
        assert len(self.channel) <= N_EMBD, len(self.channel)
        self.vocab = vocab

    def identity(self, token: int) -> int:
        return self.channel.get("id:" + self.vocab.texts[token], self.channel["other"])


def successors() -> list[tuple[str, str]]:
    """The bigram table: after this piece, that one."""
    pairs = [("<tool_call>", CALL_PIECES[0])]
    pairs += list(zip(CALL_PIECES, CALL_PIECES[1:], strict=False))
    pairs += [(CALL_PIECES[-1], "</tool_call>"), ("</tool_call>", END)]
    pairs += [(NEWLINE, ANSWER_PIECES[0]), ("</think>", ANSWER_PIECES[0])]
    pairs += list(zip(ANSWER_PIECES, ANSWER_PIECES[1:], strict=False)) + [(ANSWER_PIECES[-1], END)]
    pairs += list(zip(REASONING_PIECES, REASONING_PIECES[1:], strict=False)) + [(REASONING_PIECES[-1], "</think>")]
    return pairs


def weights(vocab: Vocab) -> dict[str, np.ndarray]:
    """Every tensor, in gguf's (rows = outputs) layout."""
    lay = Layout(vocab)
    ch = lay.channel
    f = np.float32
    embd = np.zeros((len(vocab), N_EMBD), f)
    for token in range(len(vocab)):
        embd[token, ch["const"]] = 1.0
        embd[token, lay.identity(token)] = 1.0
    # After the input norm every channel a token sets reads sqrt(N_EMBD / 2).
    scale = np.sqrt(N_EMBD / 2)
    q = np.zeros((N_EMBD, N_EMBD), f)
    k = np.zeros((N_EMBD, N_EMBD), f)
    v = np.zeros((N_EMBD, N_EMBD), f)
    o = np.zeros((N_EMBD, N_EMBD), f)
    w = np.sqrt(SCORE * np.sqrt(HEAD_DIM)) / scale
    for head, marker in enumerate(MARKERS):
        row = head * HEAD_DIM
        q[row, ch["const"]] = w
        k[row, ch["id:" + marker]] = w
        v[row, ch["id:" + marker]] = 1.0 / scale
        o[ch[("p_tools", "p_response", "p_think", "p_endthink")[head]], row] = 1.0
    gate = np.zeros((N_FF, N_EMBD), f)
    up = np.zeros((N_FF, N_EMBD), f)
    down = np.zeros((N_EMBD, N_FF), f)
    # unit 0: at a newline, tools offered and no tool result yet -> open a call.
    # unit 1: at a newline, <think> seen and </think> not -> reason. Sign of (sum - 1.5) decides;
    # the norm only scales it, and UNIT_GAIN saturates the SiLU either way.
    for unit, (plus, minus, target) in enumerate(
        [("p_tools", "p_response", "u_call"), ("p_think", "p_endthink", "u_think")]
    ):
        gate[unit, ch[plus]] = UNIT_GAIN
        gate[unit, ch["id:" + NEWLINE]] = UNIT_GAIN
        gate[unit, ch[minus]] = -UNIT_GAIN
        gate[unit, ch["const"]] = -1.5 * UNIT_GAIN
        up[unit, ch["const"]] = 1.0
        down[ch[target], unit] = 1.0 / (UNIT_GAIN * 0.5 * 16.0)  # 0.7 to 1.3 in the residual when on
    out = np.zeros((len(vocab), N_EMBD), f)
    for before, after in successors():
        out[vocab.ids[after], ch["id:" + before]] = LOGIT
    out[vocab.ids["<tool_call>"], ch["u_call"]] = 3 * LOGIT
    out[vocab.ids[REASONING_PIECES[0]], ch["u_think"]] = 5 * LOGIT
    tensors = {
        "token_embd.weight": embd,
        "rope_freqs.weight": np.full(HEAD_DIM // 2, 1e30, f),
        "blk.0.attn_norm.weight": np.ones(N_EMBD, f),
        "blk.0.attn_q.weight": q,
        "blk.0.attn_k.weight": k,
        "blk.0.attn_v.weight": v,
        "blk.0.attn_output.weight": o,
        "blk.0.ffn_norm.weight": np.ones(N_EMBD, f),
        "blk.0.ffn_gate.weight": gate,
        "blk.0.ffn_up.weight": up,
        "blk.0.ffn_down.weight": down,
        "output_norm.weight": np.ones(N_EMBD, f),
        "output.weight": out,
    }
    return tensors


def _rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_EPS)


def logits(tensors: dict[str, np.ndarray], tokens: list[int]) -> np.ndarray:
    """The forward pass llama.cpp computes (rope frozen, so no rotation), for the last position."""
    x = tensors["token_embd.weight"][tokens].astype(np.float64)
    h = _rms(x) * tensors["blk.0.attn_norm.weight"]
    q, k, v = (h @ tensors[f"blk.0.attn_{n}.weight"].T for n in ("q", "k", "v"))
    heads = []
    for i in range(N_HEAD):
        cut = slice(i * HEAD_DIM, (i + 1) * HEAD_DIM)
        s = q[-1, cut] @ k[:, cut].T / np.sqrt(HEAD_DIM)
        p = np.exp(s - s.max())
        heads.append((p / p.sum()) @ v[:, cut])
    x = x[-1] + tensors["blk.0.attn_output.weight"] @ np.concatenate(heads)
    h = _rms(x) * tensors["blk.0.ffn_norm.weight"]
    g = tensors["blk.0.ffn_gate.weight"] @ h
    x = x + tensors["blk.0.ffn_down.weight"] @ (g / (1 + np.exp(-g)) * (tensors["blk.0.ffn_up.weight"] @ h))
    return tensors["output.weight"] @ (_rms(x) * tensors["output_norm.weight"])


def generate(prompt: str, max_tokens: int = 32) -> tuple[str, bool]:
    """Greedy decoding in numpy: (text, stopped at <|im_end|>)."""
    vocab = Vocab()
    tensors = weights(vocab)
    tokens = vocab.tokenize(prompt)
    text = ""
    for _ in range(max_tokens):
        nxt = int(np.argmax(logits(tensors, tokens)))
        if vocab.texts[nxt] == END:
            return text, True
        text += vocab.texts[nxt]
        tokens.append(nxt)
    return text, False


def write_model(path: Path, chat_template: str) -> None:
    import gguf  # a test dependency, pinned

    vocab = Vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tapfix-tiny")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(vocab))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(vocab.stored)
    kinds = {"normal": gguf.TokenType.NORMAL, "control": gguf.TokenType.CONTROL, "user": gguf.TokenType.USER_DEFINED}
    writer.add_token_types([kinds[k] for k in vocab.kinds])
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.ids["<|endoftext|>"])
    writer.add_eos_token_id(vocab.ids[END])
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)
    for name, tensor in weights(vocab).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--template", type=Path, required=True, help="the chat template to embed (Qwen2.5's)")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    write_model(args.out, args.template.read_text())
    print(json.dumps({"path": str(args.out), "sha256": sha256(args.out)}))


if __name__ == "__main__":
    main()
