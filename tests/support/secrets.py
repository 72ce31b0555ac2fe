"""The secrets the security tests plant (shaped like real keys and tokens, so the redaction rules see them as
such) and the file mode they check stores and keys are written with."""

from __future__ import annotations

import stat
from pathlib import Path

SECRET = "sk-live-SECRETSECRET0123456789"
SECRET2 = "tok_ANOTHERSECRET987654321"


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)
