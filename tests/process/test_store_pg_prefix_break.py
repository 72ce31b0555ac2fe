"""The prefix break on PostgreSQL (migration pg007): the writer fills the column as on SQLite, `captures tail`
and the browser's session view read it, `captures show --json` reports it, and another instance's writer
compares its first turn of the session with what the store holds."""

from __future__ import annotations

import json

import pytest
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.pg.reader import PostgresReader
from tapfix.proxy.store.pg.tail import PostgresTail
from tapfix.proxy.store.pg.writer import postgres_writer
from tapfix.proxy.store.reader import CaptureFilter

from tests.support.inproc import cli
from tests.support.postgres import PostgresServer
from tests.unit.test_store_prefix_break import LINE, TURN2, USER, _messages_turn, _text

pytestmark = [pytest.mark.postgres]


def test_the_column_on_postgresql(postgres: PostgresServer) -> None:
    url = postgres.create_database("prefix_break")
    main = [_text(LINE.format("4e6")), _text("You are Claude Code.")]
    turn3 = [*TURN2, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and more"}]
    one, two = _messages_turn(main, [USER]), _messages_turn(main, TURN2)
    three = _messages_turn([_text(LINE.format("a1f")), main[1]], turn3)
    writer = postgres_writer(url)
    for ex in (one, two, three):
        writer.submit(ex)
    writer.close()
    assert not writer.stats.failures, writer.stats.last_error
    with PostgresReader(url) as reader:
        rows = {r["id"]: r for r in PostgresTail(reader, (0, 0), CaptureFilter()).poll()}
    assert rows[one.id]["prefix_break"] is None and rows[two.id]["prefix_break"] is None
    found = rows[three.id]["prefix_break"]
    assert (found["path"], found["cause"], found["previous"]) == ("$.system[0].text", "billing_line", two.id)
    assert three.request[found["offset"] : found["offset"] + 3] == b"a1f"
    shown = json.loads(cli("captures", "show", three.id, "--db", url, "--json").stdout)
    assert shown["prefix_break"] == found
    browse = StoreLocator.resolve(url, postgres=True).backend().browse(search=False)
    try:
        stored = browse.load_session("cc-1")
    finally:
        browse.close()
    assert stored is not None
    assert {r["id"]: r["prefix_break"] for r in stored.rows} == {one.id: None, two.id: None, three.id: found}
    # Another instance (a fleet, or the next `tapfix run`): the session's earlier requests come from the store.
    turn4 = [*turn3, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "last"}]
    four = _messages_turn([_text(LINE.format("a1f")), _text("You are Claude Code. Be brief.")], turn4)
    other = postgres_writer(url)
    other.submit(four)
    other.close()
    assert not other.stats.failures, other.stats.last_error
    shown = json.loads(cli("captures", "show", four.id, "--db", url, "--json").stdout)["prefix_break"]
    assert (shown["path"], shown["cause"], shown["previous"]) == ("$.system[1].text", "system_edited", three.id)
