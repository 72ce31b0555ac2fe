"""In a process-tier file: take `cli` and `start_mock` from tests/support/inproc.py (the process under test stays)."""
import re, subprocess, sys
from pathlib import Path
WANT = set(sys.argv[1].split(","))
for arg in sys.argv[2:]:
    dest = Path(arg); text = dest.read_text()
    def fix(m):
        indent, names = m.group(1), [n.strip() for n in m.group(2).split(",") if n.strip()]
        moved = [n for n in names if n in WANT]
        kept = [n for n in names if n not in moved]
        out = []
        if kept: out.append(f"{indent}from tests.support.procs import {', '.join(kept)}")
        if moved: out.append(f"{indent}from tests.support.inproc import {', '.join(moved)}")
        return "\n".join(out)
    text = re.sub(r"^([ \t]*)from tests\.support\.procs import ([^\n(]+)$", fix, text, flags=re.M)
    dest.write_text(text)
    subprocess.run([".venv/bin/ruff", "check", "--fix", "-q", "--select", "F401,I", str(dest)])
    subprocess.run([".venv/bin/ruff", "format", "-q", str(dest)])
