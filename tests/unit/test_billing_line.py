"""Claude Code's billing block: which blocks are it, the cut in the client's bytes, the policy that decides."""

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.config.file import Config, from_dict
from tapfix.proxy.jsonsplice import remove_items
from tapfix.proxy.request.billing_line import billing_blocks, is_billing_line, strip_billing_blocks
from tapfix.proxy.request.policy import RequestPolicy

LINE = "x-anthropic-billing-header: cc_version=2.1.332.4e6; cc_entrypoint=sdk-cli; cch=1a2b3;"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude."
CLAUDE_CODE = {
    "model": "qwen",
    "max_tokens": 32000,
    "system": [
        {"type": "text", "text": LINE},
        {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nYou are an interactive agent…", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}],
    "stream": True,
}


def _policy(engine, **model):
    return RequestPolicy(
        from_dict(
            {
                "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1", "engine": engine}},
                "models": {"qwen": {"upstream": "u", **model}},
            }
        )
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (LINE, True),
        (LINE + "\n", True),
        ("x-anthropic-billing-header: cc_version=2.1.29.abc; cc_entrypoint=cli;", True),
        (LINE + "\n" + PROMPT, False),  # the line and the prompt in one block: more than the line
        ("Why does my proxy see x-anthropic-billing-header: cc_version=…?", False),  # a user's mention
        (" " + LINE, False),
        ("X-Anthropic-Billing-Header: cc_version=1", False),
        (None, False),
    ],
)
def test_only_a_block_that_is_the_one_header_line_is_it(text, expected):
    assert is_billing_line(text) is expected


def test_claude_code_body_loses_exactly_its_first_system_block_byte_for_byte():
    for dumps in (orjson.dumps, lambda o: json.dumps(o, indent=2, ensure_ascii=True).encode()):
        body = dumps(CLAUDE_CODE)
        out = _policy("vllm").apply("/v1/messages", body, {})
        assert [(c.stage, c.kind, c.path, c.before, c.after) for c in out.changes] == [
            ("request", "strip_billing_line", "$.system[0]", LINE, None)
        ]
        expected = {**CLAUDE_CODE, "system": CLAUDE_CODE["system"][1:]}
        assert orjson.loads(out.body) == expected
        assert "request_reserialized" not in out.flags
        # Nothing but the block and its separator went: what is left is the client's own bytes.
        block = body.index(LINE.encode()) - body[: body.index(LINE.encode())].rindex(b"{")
        assert len(body) - len(out.body) > len(LINE) and block > 0
        cut_start = body.index(b"[", body.index(b'"system"')) + 1
        assert out.body[:cut_start] == body[:cut_start]
        assert body.endswith(out.body[cut_start:])


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "ollama", "tabbyapi"])
def test_every_local_engine_gets_it_stripped(engine):
    out = _policy(engine).apply("/v1/messages", orjson.dumps(CLAUDE_CODE), {})
    assert LINE not in out.body.decode()


@pytest.mark.parametrize("engine", ["openai", "anthropic"])
def test_hosted_engines_keep_it(engine):
    body = orjson.dumps(CLAUDE_CODE)
    out = _policy(engine).apply("/v1/messages", body, {})
    assert out.body is body
    assert not [c for c in out.changes if c.kind == "strip_billing_line"]


def test_keep_billing_line_keeps_it_and_an_unknown_engine_keeps_it():
    body = orjson.dumps(CLAUDE_CODE)
    assert _policy("vllm", keep_billing_line=True).apply("/v1/messages", body, {}).body is body
    quick = RequestPolicy(Config.quick("http://127.0.0.1:9"))  # no --engine: unknown
    assert quick.apply("/v1/messages", body, {}).body is body
    kept = RequestPolicy(Config.quick("http://127.0.0.1:9", engine="vllm", keep_billing_line=True))
    assert kept.apply("/v1/messages", body, {}).body is body
    stripped = RequestPolicy(Config.quick("http://127.0.0.1:9", engine="vllm"))
    assert LINE not in stripped.apply("/v1/messages", body, {}).body.decode()


def test_a_user_text_that_mentions_the_header_stays():
    mention = f"my logs show `{LINE}` on every request: why?"
    body = orjson.dumps(
        {
            **CLAUDE_CODE,
            "system": [{"type": "text", "text": LINE + "\n" + PROMPT}],  # one block, the line and more
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": LINE}]},  # a user's text, not a system block
                {"role": "user", "content": mention},
            ],
        }
    )
    out = _policy("vllm").apply("/v1/messages", body, {})
    assert out.body is body and not out.changes


def test_chat_system_parts_and_a_system_message_that_is_only_the_line():
    body = orjson.dumps(
        {
            "model": "qwen",
            "messages": [
                {"role": "system", "content": LINE},
                {"role": "developer", "content": [{"type": "text", "text": LINE}, {"type": "text", "text": PROMPT}]},
                {"role": "system", "content": [{"type": "text", "text": LINE}]},
                {"role": "user", "content": LINE},
            ],
        }
    )
    out = _policy("sglang").apply("/v1/chat/completions", body, {})
    assert sorted(c.path for c in out.changes if c.kind == "strip_billing_line") == [
        "$.messages[0]",
        "$.messages[1].content[0]",
        "$.messages[2]",
    ]
    assert orjson.loads(out.body)["messages"] == [
        {"role": "developer", "content": [{"type": "text", "text": PROMPT}]},
        {"role": "user", "content": LINE},
    ]


def test_the_strip_and_the_sampling_edits_share_one_body():
    out = _policy("vllm", sampling={"temperature": 0.6}).apply("/v1/messages", orjson.dumps(CLAUDE_CODE), {})
    sent = orjson.loads(out.body)
    assert sent["temperature"] == 0.6 and sent["system"] == CLAUDE_CODE["system"][1:]
    assert {c.kind for c in out.changes} >= {"strip_billing_line"}


def test_other_surfaces_are_left_alone():
    assert billing_blocks({"input": [{"role": "system", "content": LINE}]}, "responses") == []
    assert billing_blocks({"system": LINE}, "messages") == []  # a string system: not a block


JSON_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
ITEM = st.one_of(
    st.just({"type": "text", "text": LINE}),
    st.builds(lambda t: {"type": "text", "text": t}, JSON_TEXT),
    st.integers(),
    st.lists(JSON_TEXT, max_size=2),
)


@given(st.lists(ITEM, max_size=6), st.sampled_from([None, 1, 2]), st.booleans())
def test_removing_items_leaves_every_other_byte(items, indent, ascii_only):
    obj = {"a": 1, "system": items, "z": "\u00e9"}
    body = json.dumps(obj, indent=indent, ensure_ascii=ascii_only).encode()
    parsed = json.loads(body)
    stripped = strip_billing_blocks(body, parsed, "messages")
    kept = [i for i in items if i != {"type": "text", "text": LINE}]
    if len(kept) == len(items):
        assert stripped is None
        return
    assert stripped is not None
    assert json.loads(stripped.body) == stripped.parsed == {**obj, "system": kept}
    assert parsed == obj  # the client's parse stays as it came
    # Byte for byte what the client's own serializer writes for the list without the block: the cut takes
    # the block and one separator, never a byte of what stays.
    assert stripped.body == json.dumps({**obj, "system": kept}, indent=indent, ensure_ascii=ascii_only).encode()
    assert remove_items(body, ("system",), []) is body


@given(st.lists(st.integers(0, 99), max_size=6), st.sets(st.integers(0, 5)), st.sampled_from([",", ", ", ",\n  "]))
def test_remove_items_matches_the_list_without_them(items, gone, sep):
    body = ('{"k": [' + sep.join(str(i) for i in items) + "] }").encode()
    out = remove_items(body, ("k",), gone)
    assert json.loads(out) == {"k": [v for i, v in enumerate(items) if i not in gone]}
    assert out.endswith(b"] }") and out.startswith(b'{"k": [')


def test_the_browser_says_the_change_as_a_sentence():
    from tapfix.proxy.browse.detail import explain

    out = _policy("vllm").apply("/v1/messages", orjson.dumps(CLAUDE_CODE), {})
    sentence = explain(out.changes[0].as_dict())
    assert sentence.startswith("request: removed Claude Code's billing line at $.system[0] (was ")
