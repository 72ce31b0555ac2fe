"""The read side of a store, what every backend shares: the captures list's filters and columns, a row
as the CLI shows it, and `CaptureReader`, the reader's logic over a backend's SQL.

Why one logic over two dialects: `captures list`, `show` and `export` must give the same rows and
bytes for the same exchanges on every backend (tests/unit/test_store_reader_backends.py). The queries
differ where the databases do (JSON arrays are `json_each` on SQLite and `json_array_elements_text`
on PostgreSQL; timestamps are text there and timestamptz here); what is done with their rows (an
attempt listed under its parent, an id prefix resolved, a body told missing) is here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.store.bodies import FALLBACK_KIND
from tapfix.proxy.store.errors import CaptureNotFound, StoreError
from tapfix.proxy.store.volume import token_volume, volume_by_hour

if TYPE_CHECKING:
    from tapfix.proxy.store.filters import Filters
    from tapfix.proxy.store.volume import Dialect

LIST_COLUMNS = (
    "id, started_at, method, path, model, status, user_agent, stream, changes_count, flags, tags, "
    "first_token_ms, duration_ms, finish_reason, error, session_id, source_id"
)
# A client request, or an attempt listed on its own because its parent isn't in the store.
ORPHAN_OR_CLIENT = (
    "attempt_of is null or not exists (select 1 from exchanges parent where parent.id = exchanges.attempt_of)"
)
CHUNK = 500  # parents per look-up of their attempts


@dataclass(frozen=True, slots=True)
class CaptureFilter:
    """What `captures list` and `captures tail` select by: client requests with this flag, tag, session
    or trace id (None: any). An attempt goes with its client request (see `CaptureReader.list_captures`)."""

    flag: str | None = None
    tag: str | None = None
    session: str | None = None
    trace: str | None = None
    route: str | None = None  # issue 38: the route taken, as the route decision names it

    def asked(self) -> str:
        """The filters as the command line spells them: `--flag F, --trace T`."""
        return ", ".join(f"--{key} {value}" for key, value in self.given())

    def given(self) -> list[tuple[str, str]]:
        """(key, value) of each filter given, as given."""
        given = (
            ("flag", self.flag),
            ("tag", self.tag),
            ("session", self.session),
            ("trace", self.trace),
            ("route", self.route),
        )
        return [(key, value) for key, value in given if value]

    def sought(self) -> list[tuple[str, str]]:
        """`given`, each value as the store holds it: a trace id in lower case."""
        return [(key, value.lower() if key == "trace" else value) for key, value in self.given()]

    def clauses(self, condition: Callable[[str], str | None]) -> tuple[list[str], list[Any]]:
        """The filters as SQL conditions (qmark) with their arguments; `condition` is a backend's SQL for a
        key (`flag`, `tag`, `session`, `trace`, `route`), its value a `?`; None: the store has no column
        for it, so nothing matches."""
        where: list[str] = []
        args: list[Any] = []
        for key, value in self.sought():
            sql = condition(key)
            where.append("0" if sql is None else sql)
            if sql is not None:
                args.append(value)
        return where, args


def with_parent(own: list[str], of_parent: list[str]) -> str:
    """A condition (SQL) on `exchanges` that takes an attempt with its client request: a client request
    (or an orphan) that matches `own`, or an attempt whose parent matches `of_parent` (the same
    conditions on the alias `parent`). `captures tail` filters so."""
    return (
        f"((({ORPHAN_OR_CLIENT}) and {' and '.join(own)}) or exists (select 1 from exchanges parent"
        f" where parent.id = exchanges.attempt_of and {' and '.join(of_parent)}))"
    )


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the CLI shows it: JSON columns parsed, `stream` a bool, `changes` the count."""
    for key in (
        "route_decision",
        "flags",
        "tags",
        "request_headers",
        "forwarded_headers",
        "response_headers",
        "tool_calls",
        "usage",
        "prefix_break",
    ):
        if key in row and isinstance(row[key], str):
            row[key] = orjson.loads(row[key])
    if "stream" in row and row["stream"] is not None:
        row["stream"] = bool(row["stream"])
    row["changes"] = row.pop("changes_count", 0)
    return row


def body_id_of(capture: dict[str, Any], which: str) -> int | None:
    """The stored body behind `which` (request | forwarded | response | client_response), or None."""
    body_id: int | None = capture[f"{which}_body_id"]  # indexed, not .get(): sqlite3.Row rows come here too
    if body_id is None and which in FALLBACK_KIND:
        body_id = capture[f"{FALLBACK_KIND[which]}_body_id"]
    return body_id


class CaptureReader:
    """What `captures list`, `show` and `export` (and the browser's capture page, replay, the mock's
    `--capture`) read through, on every backend (`StoreBackend.reader()`). A backend supplies the
    methods that raise `NotImplementedError` (each returning rows as `decode_row` made them), and
    `known_flags` and `read_choices`; the rest is here, once."""

    backend: str

    def list_captures(
        self,
        *,
        limit: int = 20,
        flag: str | None = None,
        tag: str | None = None,
        session: str | None = None,
        trace: str | None = None,
        route: str | None = None,
    ) -> list[dict[str, Any]]:
        """Client requests newest first, each followed by its regeneration attempts (issue 19) in order.

        The filters and `limit` are about client requests: an attempt is listed under its parent, whatever
        it carries itself (it has no session; its flags say what went wrong upstream, and the parent
        carries `regenerated`). An attempt whose parent isn't in the store is listed on its own."""
        rows = self._clients(CaptureFilter(flag, tag, session, trace, route), limit)
        parents = [row["id"] for row in rows if row["attempt_of"] is None]
        children: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(parents), CHUNK):
            for child in self._attempts(parents[start : start + CHUNK]):
                children.setdefault(child["attempt_of"], []).append(child)
        if not children:
            return rows
        out: list[dict[str, Any]] = []
        for row in rows:
            out.append(row)
            out.extend(children.get(row["id"], ()) if row["attempt_of"] is None else ())
        return out

    def resolve_id(self, prefix: str) -> str:
        """The capture id a prefix names; `CaptureNotFound` for none or several."""
        prefix = prefix.strip().lower()
        if not prefix:
            raise CaptureNotFound("empty capture id")
        ids = self._ids_from(prefix)
        if not ids:
            raise CaptureNotFound(f"no capture with id {prefix!r} (see `tapfix captures list`)")
        if len(ids) > 1 and ids[0] != prefix:
            raise CaptureNotFound(f"capture id {prefix!r} is ambiguous: {', '.join(ids)}, ...")
        return ids[0]

    def load_capture(self, capture_id: str) -> dict[str, Any]:
        """The capture's row (`captures show`) with its change rows (`change_rows`), by id or prefix."""
        capture_id = self.resolve_id(capture_id)
        capture = self._capture(capture_id)
        capture["change_rows"] = [
            {
                **c,
                "before": orjson.loads(c["before"]) if c["before"] else None,
                "after": orjson.loads(c["after"]) if c["after"] else None,
            }
            for c in self._changes(capture_id)
        ]
        return capture

    def capture_body(self, capture: dict[str, Any], which: str) -> bytes:
        """which: request | forwarded | response | client_response — exact bytes."""
        body_id = body_id_of(capture, which)
        if body_id is None:
            if capture.get("request_body_id") is None and capture.get("request_size"):
                raise StoreError(f"capture {capture['id']} was stored without bodies (privacy mode)")
            return b""
        return self._body(capture, body_id) or b""

    def token_volume(self, f: Filters, by: Sequence[str]) -> list[dict[str, Any]]:
        """`captures stats`: requests, tokens, errors, repairs and timings per group (store/volume.py)."""
        return token_volume(self._dict_rows, self._values, self._volume_dialect(), f, by)

    def volume_by_hour(self, f: Filters) -> list[dict[str, Any]]:
        """Requests and tokens per hour, route and upstream (the stats page's charts; store/volume.py)."""
        return volume_by_hour(self._dict_rows, self._volume_dialect(), f)

    def close(self) -> None:
        raise NotImplementedError

    def known_flags(self) -> list[str]:
        """Every flag some capture in the store carries (what `captures list --flag` can match)."""
        raise NotImplementedError

    def read_choices(self, exchange_id: str) -> list[dict[str, Any]]:
        """Every choice of an `n > 1` answer, by index; [] for a one-choice answer."""
        raise NotImplementedError

    def answered_turns(self, chains: list[str]) -> list[tuple[Any, ...]]:
        """Reasoning replay's lookup (store/replay_turns.py `ANSWERED_SQL`): the exchanges with reasoning
        whose `chain_hash` is one of `chains` (an indexed column on every backend)."""
        raise NotImplementedError

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The backend's part.

    def _clients(self, filters: CaptureFilter, limit: int) -> list[dict[str, Any]]:
        """Client requests (and orphaned attempts) matching `filters`, newest first, at most `limit` (0: all)."""
        raise NotImplementedError

    def _attempts(self, parents: list[str]) -> list[dict[str, Any]]:
        """The attempts made for these client requests, by parent, then attempt number."""
        raise NotImplementedError

    def _ids_from(self, prefix: str) -> list[str]:
        """Up to three capture ids starting with `prefix`, in order."""
        raise NotImplementedError

    def _capture(self, capture_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def _changes(self, capture_id: str) -> list[dict[str, Any]]:
        """stage, kind, path, before, after, reason of each change row, in order."""
        raise NotImplementedError

    def _body(self, capture: dict[str, Any], body_id: int) -> bytes | None:
        raise NotImplementedError

    def _dict_rows(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows of a qmark statement as dicts; a database error as a `StoreError`."""
        raise NotImplementedError

    def _values(self, sql: str, args: Sequence[Any]) -> Iterable[Sequence[Any]]:
        """The rows of a qmark statement as tuples, read as they are used (a report's millions of numbers)."""
        raise NotImplementedError

    def _volume_dialect(self) -> Dialect:
        raise NotImplementedError
