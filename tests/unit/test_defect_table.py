"""The docs' repair claims are the table of truth, not a copy of it that can drift.

`proxy/toolcalls/defects.py` is the one list of defect classes; the property tests
(tests/unit/test_toolcalls_defects.py) check each row's outcome on each surface, and these tests check
that what users read is that same table, rendered.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tapfix.proxy.toolcalls import defects

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "repair.md"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_the_published_table_is_the_table_of_truth(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert defects.README_BEGIN in text, f"{path.name} has no generated defect table"
    assert defects.replace_block(text) == text, (
        f"{path.name}'s defect table differs from proxy/toolcalls/defects.py: "
        f"run .venv/bin/python -m tapfix.proxy.toolcalls.defects --readme {path.relative_to(ROOT)}"
    )


def test_rows_are_unique_and_complete() -> None:
    ids = [d.id for d in defects.DEFECTS]
    assert len(ids) == len(set(ids))
    for d in defects.DEFECTS:
        assert d.outcome, d.id
        assert set(d.outcome) <= set(defects.SURFACES), d.id
        assert d.claim and d.family, d.id
        # A destroying class can't be "repaired": the information to repair it is gone.
        assert d.preserves or set(d.outcome.values()) == {"detected"}, d.id


def test_regenerating_a_stale_table_rewrites_only_the_block(tmp_path: Path) -> None:
    stale = f"# x\n\nbefore\n\n{defects.README_BEGIN}\n| old | table |\n{defects.README_END}\n\nafter\n"
    path = tmp_path / "README.md"
    path.write_text(stale, encoding="utf-8")
    assert defects.main(["defects", "--readme", str(path)]) == 0
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert defects.render_markdown() in text and "| old | table |" not in text
