"""bench/store_scale.py at a tiny size, on the suite's PostgreSQL: both stores filled through the
writer, every browse query answering what the filler planted, the fleet's cases measured (turns that
hop between instances cost more bytes than sessions that stay), the report's tables printed."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer

pytestmark = [pytest.mark.postgres]
BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_store_scale_fills_both_stores_and_browses_them(
    postgres: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(BENCH))
    scale = importlib.import_module("store_scale")
    argv = ["--sizes", "120", "--fleet", "30", "--proxy", "0", "--repeat", "1", "--turns", "3", "--active", "4"]
    results = scale.main([*argv, "--work", str(tmp_path)], server=postgres)
    fills = {f["store"]: f for f in results["fills"]}
    assert set(fills) == {"sqlite", "postgresql"}
    for fill in fills.values():
        assert (fill["n"], fill["failures"]) == (120, 0) and fill["per_s"] > 0 and fill["size"]["database"] > 0
    assert fills["postgresql"]["server_cpu_s"] > 0  # read from the server's processes, not guessed
    for store in ("sqlite 120", "postgresql 120"):
        rows = {label: measured[3] for label, measured in results["browse"][store]["queries"].items()}
        assert rows["list, first page"] == 50 and rows["list, deep page (keyset, 90% down)"] == 11
        assert rows["filter by flag (0.2%)"] == 1 and rows["search a word (0.1%)"] == 1  # planted at 3 and 7
        assert rows["filter by session"] == 3 and rows["id prefix look-up (14 of 16 chars)"] == 1
    pg_rows = {label: m[3] for label, m in results["browse"]["postgresql 120"]["queries"].items()}
    assert pg_rows["search a substring (0.1%)"] == 1 and pg_rows["search CJK text (0.1%)"] == 1  # pg_trgm
    fleet = results["fleet"]
    one, own, hop = (fleet[k]["bodies"] for k in fleet)
    assert hop > own and all(v["failures"] == 0 for v in fleet.values())
    assert one > 0
    out = capsys.readouterr().out
    assert "| sqlite | 120 |" in out and "| postgresql | 120 |" in out and "every turn on the next one" in out
