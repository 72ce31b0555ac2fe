"""A `--db` that looks like a URL but isn't a store URL is refused, never a SQLite file (issue 31 item 2).

`--db 'postgressql://tapfix:sekret@host/tapfix'` (one extra s) used to start, print the password in the
banner and create `./postgressql:/tapfix:sekret@host/tapfix`; `check --db 'postgresql:/tapfix'` said
"store ok". A value with an unknown scheme, or a known scheme written wrong, is now a usage error that
names the scheme, with the password masked, wherever a locator is taken: --db, $TAPFIX_DB, the config's
`db`; and nothing is created on disk. Here the real processes; the rest in the test process:
tests/inproc/cli/test_store_locator_typos.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.procs import cli

TYPO = "postgressql://tapfix:sekret@host/tapfix"


@pytest.mark.parametrize("command", [["run", "--upstream", "http://127.0.0.1:9"], ["demo"]])
def test_the_real_process_exits_2_without_a_banner_or_a_file(command: list[str], tmp_path: Path) -> None:
    result = cli(*command, "--listen", "127.0.0.1:0", "--db", TYPO, cwd=tmp_path, timeout=20)
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "'postgressql'" in err and "sekret" not in err + result.stdout.decode()
    assert "captures in" not in err and os.listdir(tmp_path) == []
