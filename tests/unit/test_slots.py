"""Issue 38: llama.cpp slot pinning (request/slots.py): the allocator, the main-thread rule, which surfaces are
pinned, and the `slots` / `reserve_main_slot` config."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.config.file import ConfigError, from_dict
from tapfix.proxy.request.slots import (
    SESSIONS_KEPT,
    SlotPins,
    SlotPlanner,
    slot_count_problem,
    slot_request,
    with_slot,
)

from tests.support.depth import examples

TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


def chat(task: str, *, tools: bool = True, system: str = "you code", **extra) -> dict:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": task}]}
    return {**body, **({"tools": TOOLS} if tools else {}), **extra}


# -- the allocator ------------------------------------------------------------------------------------------


def test_a_thread_keeps_its_slot_and_a_new_one_gets_a_free_slot_else_the_least_recently_used():
    pins = SlotPins(2)
    assert (pins.pin("a", False, 1).slot, pins.pin("b", False, 2).slot) == (0, 1)
    for slot in (0, 1):
        pins.release(slot, 3)
    assert pins.pin("a", False, 4).how == "kept" and pins.pin("a", False, 4).slot == 0
    pins.release(0, 5)
    pins.release(0, 5)
    taken = pins.pin("c", False, 6)  # b's slot was used least recently
    assert (taken.slot, taken.how, taken.evicted) == (1, "evicted", "b")
    assert pins.pin("b", False, 7).evicted == "a", "the evicted thread lost its pin: its next turn takes another slot"


def test_an_idle_slot_is_taken_before_one_whose_request_is_still_running():
    pins = SlotPins(2)
    pins.pin("long", False, 1)  # never released: a long generation still running
    pins.pin("done", False, 2)
    pins.release(1, 3)
    assert pins.pin("new", False, 4).slot == 1


def test_with_a_reserved_main_slot_subagents_share_the_others():
    pins = SlotPins(3, reserve_main=True)
    main = pins.pin("main", True, 0).slot
    pins.release(main, 0)
    for t, name in enumerate(["sub1", "sub2", "sub3", "sub4", "sub5"], start=1):
        got = pins.pin(name, False, t)
        pins.release(got.slot, t)
        assert got.slot != main and got.evicted != "main"
    assert pins.pin("main", True, 10).how == "kept", "the main agent's cache survived the fan-out"


def test_without_the_reserve_a_fan_out_evicts_the_idle_main_thread():
    pins = SlotPins(2)
    pins.release(pins.pin("main", False, 0).slot, 0)
    pins.release(pins.pin("sub1", False, 1).slot, 1)
    assert pins.pin("sub2", False, 2).evicted == "main"


def test_mains_of_many_sessions_leave_one_slot_for_the_rest():
    pins = SlotPins(3, reserve_main=True)
    for t, name in enumerate(["m1", "m2", "m3"]):
        pins.release(pins.pin(name, True, t).slot, t)
    assert pins.pin("m3", True, 5).how == "kept"
    assert pins.pin("m1", True, 6).how == "evicted", "m3 took the least recently used main's slot"
    assert sum(s.main for s in pins.slots) == 2
    assert not pins.slots[pins.pin("sub", False, 7).slot].main


@st.composite
def turns(draw):
    """A sequence of (thread, is_main, release_after) over a few threads, time increasing."""
    threads = draw(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=60))
    mains = draw(st.sets(st.sampled_from("abcdefg"), max_size=3))
    releases = draw(st.lists(st.booleans(), min_size=len(threads), max_size=len(threads)))
    return [(t, t in mains, r) for t, r in zip(threads, releases, strict=True)]


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 5), st.booleans(), turns())
def test_pins_stay_consistent(slots, reserve, sequence):
    pins = SlotPins(slots, reserve_main=reserve)
    for now, (thread, main, release) in enumerate(sequence):
        before = dict(pins.pins)
        free_before = [i for i, s in enumerate(pins.slots) if s.thread is None]
        mains_before = {s.thread for s in pins.slots if s.main}
        got = pins.pin(thread, main, float(now))
        assert 0 <= got.slot < slots
        if thread in before:  # a thread keeps its slot across turns while it holds it
            assert (got.slot, got.how) == (before[thread], "kept")
        elif free_before and (not reserve or slots < 2 or not main or len(mains_before) < slots - 1):
            assert got.how == "free" and got.slot == free_before[0]
        if got.evicted is not None:
            assert got.evicted not in pins.pins
            if reserve and slots >= 2 and not main:
                assert got.evicted not in mains_before, "a subagent never takes a main thread's slot"
        # one thread per slot, and the map agrees with the slots
        assert {t: i for i, s in enumerate(pins.slots) if s.thread for t in [s.thread]} == pins.pins
        if reserve and slots >= 2:
            assert sum(s.main for s in pins.slots) <= slots - 1
        if release:
            pins.release(got.slot, float(now))


# -- which thread is a session's main one --------------------------------------------------------------------


def test_the_first_thread_of_a_session_that_offers_tools_is_its_main_one():
    planner = SlotPlanner()
    title = slot_request("chat", chat("title this", tools=False), {"x-session-id": "ses_1"})
    main = slot_request("chat", chat("build it"), {"x-session-id": "ses_1"})
    sub = slot_request("chat", chat("subtask", system="you explore"), {"X-Claude-Code-Session-Id": "ses_1"})
    assert planner.role(title) == ("subagent", None), "opencode's title request, sent with turn 1, is a side request"
    assert planner.role(main) == ("main", None)
    assert planner.role(sub) == ("subagent", None), "a subagent has a system prompt of its own"
    assert planner.role(main) == ("main", None)


def test_a_compacted_main_conversation_stays_the_main_thread_on_its_slot():
    planner = SlotPlanner()
    session = {"x-session-id": "ses_1"}
    main = slot_request("chat", chat("build it"), session)
    first = planner.plan("gpu", 3, True, "chat", main, 0)
    sub = planner.plan("gpu", 3, True, "chat", slot_request("chat", chat("look", system="you explore"), session), 1)
    compacted = slot_request("chat", chat("summary of the work so far"), session)  # same system prompt and tools
    again = planner.plan("gpu", 3, True, "chat", compacted, 2)
    assert (again.role, again.slot, again.how, again.continues) == ("main", first.slot, "kept", main.thread)
    assert sub.slot != first.slot
    other_tools = slot_request("chat", {**chat("x"), "tools": []}, session)
    assert planner.role(other_tools) == ("subagent", None)


def test_opencodes_child_session_is_a_subagent_of_its_parent():
    planner = SlotPlanner()
    main = slot_request("chat", chat("build it"), {"x-session-id": "ses_parent"})
    child = slot_request("chat", chat("explore"), {"x-session-id": "ses_child", "x-parent-session-id": "ses_parent"})
    assert planner.role(child) == ("subagent", None) and child.session == "ses_parent"
    assert planner.role(main) == ("main", None), "a child session that came first doesn't take its parent's main"


def test_a_request_without_a_session_is_unnamed_and_sessions_are_bounded():
    planner = SlotPlanner()
    assert planner.role(slot_request("chat", chat("x"), {})) == ("unnamed", None)
    for i in range(SESSIONS_KEPT + 5):
        planner.role(slot_request("chat", chat(f"t{i}"), {"x-session-id": f"s{i}"}))
    assert len(planner.mains) == SESSIONS_KEPT and "s0" not in planner.mains


# -- what is pinned -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("surface", ["chat", "responses"])
def test_chat_and_responses_are_pinned_messages_is_not(surface):
    planner = SlotPlanner()
    body = chat("x") if surface == "chat" else {"model": "m", "input": "x", "instructions": "you code"}
    plan = planner.plan("gpu", 2, False, surface, slot_request(surface, body, {}), 0)
    assert plan is not None and plan.slot == 0
    messages = {"model": "m", "system": "you code", "messages": [{"role": "user", "content": "x"}]}
    assert planner.plan("gpu", 2, False, "messages", slot_request("messages", messages, {}), 0) is None


def test_a_legacy_completion_is_pinned_by_its_session_only():
    planner = SlotPlanner()
    body = {"model": "m", "prompt": "def f():"}
    assert planner.plan("gpu", 2, False, "completions", slot_request("completions", body, {}), 0) is None
    named = slot_request("completions", body, {"x-session-id": "s"})
    assert planner.plan("gpu", 2, False, "completions", named, 0).slot == 0


def test_the_clients_own_id_slot_stands_and_slot_id_is_flagged():
    planner = SlotPlanner()
    own = planner.plan("gpu", 2, False, "chat", slot_request("chat", chat("x", id_slot=1), {}), 0)
    assert (own.slot, own.how, own.client_slot, own.change()) == (None, "client", 1, None)
    assert slot_request("chat", chat("x", slot_id=1), {}).misspelt
    change = planner.plan("gpu", 2, False, "chat", slot_request("chat", chat("y"), {}), 0).change()
    assert (change.path, change.after) == ("$.id_slot", 0)


def test_affinity_and_slots_agree_a_thread_has_a_pin_per_upstream():
    planner = SlotPlanner()
    request = slot_request("chat", chat("x"), {})
    planner.plan("gpu0", 2, False, "chat", slot_request("chat", chat("other"), {}), 0)
    assert planner.plan("gpu0", 2, False, "chat", request, 1).slot == 1
    assert planner.plan("gpu1", 2, False, "chat", request, 2).slot == 0, "its pin on gpu1 is its own"
    assert planner.plan("gpu0", 2, False, "chat", request, 3).how == "kept"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.dictionaries(st.text(max_size=6).filter(lambda k: k != "id_slot"), JSON_VALUES, max_size=5),
    st.sampled_from([None, 2]),
    st.sampled_from([(",", ":"), (", ", ": ")]),
    st.sampled_from(["", "\n", "  \r\n"]),
    st.integers(0, 4095),
)
def test_id_slot_is_written_into_any_object_the_rest_byte_for_byte(obj, indent, separators, trailing, slot):
    body = (json.dumps(obj, indent=indent, separators=separators) + trailing).encode()
    pinned = with_slot(body, slot)
    assert json.loads(pinned) == {**obj, "id_slot": slot}
    inserted = (b"," if obj else b"") + b'"id_slot":%d' % slot
    at = pinned.rfind(inserted)
    assert pinned[:at] + pinned[at + len(inserted) :] == body, "nothing but the member was written"


def test_bytes_that_are_no_objects_are_not_pinned():
    assert with_slot(gzip.compress(b'{"model": "m"}'), 0) is None
    assert with_slot(b'["not", "an", "object"]', 0) is None


# -- config ---------------------------------------------------------------------------------------------------


def upstream_config(**upstream) -> dict:
    base = {"base_url": "http://127.0.0.1:8080/v1", "engine": "llamacpp", **upstream}
    return {"upstreams": {"local": base}, "models": {"m": {"upstream": "local"}}}


def test_slots_load_on_a_llamacpp_upstream():
    u = from_dict(upstream_config(slots=4, reserve_main_slot=True)).upstreams["local"]
    assert (u.slots, u.reserve_main_slot) == (4, True)
    assert from_dict(upstream_config()).upstreams["local"].slots is None


@pytest.mark.parametrize(
    ("upstream", "said"),
    [
        ({"engine": "vllm", "slots": 4}, "upstreams.local.slots: only a llama.cpp upstream"),
        ({"slots": 1, "reserve_main_slot": True}, "upstreams.local.reserve_main_slot: needs slots = 2 or more"),
        ({"reserve_main_slot": True}, "found no slots"),
        ({"slots": 0}, "upstreams.local.slots"),
    ],
)
def test_slots_that_could_do_nothing_are_refused(upstream, said):
    with pytest.raises(ConfigError) as raised:
        from_dict(upstream_config(**upstream))
    assert said in str(raised.value)


def test_the_slot_count_is_checked_against_what_llama_server_runs():
    assert slot_count_problem("local", 2, {"total_slots": 2}) is None
    assert slot_count_problem("local", 2, None) is None, "a server that doesn't say: nothing to compare"
    more = slot_count_problem("local", 4, {"total_slots": 2})
    assert (more.severity, more.where) == ("error", "upstreams.local.slots") and "share slots" in more.message
    assert slot_count_problem("local", 2, {"total_slots": 4}).severity == "warning"
