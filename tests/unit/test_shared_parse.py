"""Issue 34: the request body is parsed once and shared. What each step notes as the parse of the body it
forwards is that body's parse, members in the same order (the splice's insert path reads the last one)."""

import json

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.addons.router import Router
from tapfix.proxy.config.file import from_dict
from tapfix.proxy.jsonbody import PARSED_KEY, STORE_PARSE_KEY, STORE_PARSE_MAX, note_parse, shared_parse
from tapfix.proxy.request.policy import RequestPolicy
from tapfix.proxy.window.usage import ask_for_usage, with_usage

from tests.support.depth import examples
from tests.support.flows import flow, reachable, recorded, requested, runtime

keys = st.sampled_from(["model", "messages", "stream", "stream_options", "temperature", "top_k", "é", 'k"q'])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-9, 9) | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(keys, c, max_size=3),
    max_leaves=6,
)
bodies = st.dictionaries(keys, values, max_size=6)
SEPARATORS = st.sampled_from([(",", ":"), (", ", ": ")])


def _in_order(body: bytes) -> list:
    return list(json.loads(body).items())


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(bodies, st.sampled_from([None, True, False]), SEPARATORS)
def test_the_usage_option_and_its_noted_parse_agree(obj, stream, separators):
    if stream is not None:
        obj = {**obj, "stream": stream}
    body = json.dumps(obj, separators=separators, ensure_ascii=False).encode()
    asked = ask_for_usage(body, json.loads(body))
    assert asked == ask_for_usage(body)  # the same whether the caller had the parse or not
    if asked is not None:
        assert _in_order(asked[0]) == list(with_usage(json.loads(body)).items())


CONFIG = {
    "upstreams": {"local": {"base_url": "http://127.0.0.1:9/v1", "engine": "llamacpp", "slots": 2}},
    "models": {
        "qwen": {"upstream": "local", "upstream_model": "Qwen3", "sampling": {"top_k": 20, "temperature": 0.6}},
    },
}


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(bodies, SEPARATORS)
def test_the_policys_parse_of_what_it_forwards_is_that_bodys(obj, separators):
    policy = RequestPolicy(from_dict(CONFIG), environ={})
    body = json.dumps({**obj, "model": "qwen"}, separators=separators).encode()
    out = policy.apply("/v1/chat/completions", body, {})
    if out.error is None and out.sent is not None:
        assert _in_order(out.body) == list(out.sent.items())


def test_the_router_notes_the_parse_of_the_pinned_body_and_the_next_reader_gets_it():
    rt = reachable(runtime(config=CONFIG))
    f = flow(body={"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    ex = recorded(f)
    requested(Router(rt), f)
    sent = f.request.raw_content or b""
    assert b'"id_slot"' in sent and b'"top_k"' in sent  # spliced, then pinned
    noted_body, noted = ex.extra[PARSED_KEY]
    assert noted_body == sent and list(noted.items()) == list(orjson.loads(sent).items())
    assert shared_parse(ex.extra, sent) is noted  # not parsed again
    other = sent.replace(b"hi", b"ho")
    assert shared_parse(ex.extra, other) == orjson.loads(other)  # other bytes: parsed afresh


def test_the_writer_keeps_the_parse_of_a_body_up_to_the_bound_and_not_beyond():
    """Issue 34: the parse kept for the capture writer lives while the exchange streams and is queued; a body past
    STORE_PARSE_MAX keeps none (the writer parses it again), and a pair of earlier bytes kept for it goes too."""
    small = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})
    big = orjson.dumps({"messages": [{"role": "user", "content": "x" * STORE_PARSE_MAX}]})
    extra: dict = {}
    note_parse(extra, small, orjson.loads(small))
    assert extra[STORE_PARSE_KEY][0] is small
    note_parse(extra, big, orjson.loads(big))
    assert extra[PARSED_KEY][0] is big and STORE_PARSE_KEY not in extra
    assert shared_parse(extra, big) is extra[PARSED_KEY][1]  # the request side still reads it once
    extra = {}
    assert shared_parse(extra, big) == orjson.loads(big) and STORE_PARSE_KEY not in extra
    assert shared_parse(extra, small) == orjson.loads(small) and extra[STORE_PARSE_KEY][0] is small
