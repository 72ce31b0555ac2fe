"""One checked validator per distinct tool schema (proxy/toolcalls/schema.py): every request of an agent offers the
same tools, and checking a schema against its metaschema cost more than the rest of a repair stage's setup."""

from __future__ import annotations

from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import tool


def test_requests_offering_the_same_schema_share_its_validator() -> None:
    first = ToolSchemas([tool("f", {"a": {"type": "integer"}})])
    second = ToolSchemas([tool("f", {"a": {"type": "integer"}})])  # equal, not the same objects
    assert first.validator("f") is second.validator("f")
    assert ToolSchemas([tool("f", {"a": {"type": "string"}})]).validator("f") is not first.validator("f")


def test_a_schema_keeps_its_own_property_order() -> None:
    """The order of a schema's properties orders what `fit` reports; equal schemas in another order are not
    conflated."""
    ab = ToolSchemas([tool("f", {"a": {"type": "integer"}, "b": {"type": "boolean"}})])
    ba = ToolSchemas([tool("f", {"b": {"type": "boolean"}, "a": {"type": "integer"}})])
    args = {"a": "1", "b": "true"}
    assert ab.fit("f", args) == ({"a": 1, "b": True}, ["$.a", "$.b"], [])
    assert ba.fit("f", args) == ({"a": 1, "b": True}, ["$.b", "$.a"], [])


def test_a_broken_schema_still_fits_nothing_and_a_required_name_is_still_missing() -> None:
    broken = ToolSchemas([tool("f", {"a": {"type": 12}})])
    assert broken.validator("f") is None
    assert broken.fit("f", {"a": "1"}) == ({"a": "1"}, [], [])
    required = ToolSchemas([tool("f", {"a": {"type": "integer"}}, required=["a", "z"])])
    assert required.fit("f", {"a": "2"}) == ({"a": 2}, ["$.a"], ["z"])
