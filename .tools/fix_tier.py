"""In files already in a tier folder: drop e2e markers; in tests/inproc also point process helpers at inproc."""
import re, subprocess, sys
from pathlib import Path
INPROC = {"start_mock", "start_proxy", "cli", "mock_and_proxy", "start"}
for arg in sys.argv[1:]:
    dest = Path(arg); text = dest.read_text()
    if "tests/inproc" in str(dest):
        def fix(m):
            indent, names = m.group(1), [n.strip() for n in m.group(2).split(",") if n.strip()]
            moved = [n for n in names if n.split(" as ")[0] in INPROC]
            kept = [n for n in names if n not in moved]
            out = []
            if kept: out.append(f"{indent}from tests.support.procs import {', '.join(kept)}")
            if moved: out.append(f"{indent}from tests.support.inproc import {', '.join(moved)}")
            return "\n".join(out)
        text = re.sub(r"^([ \t]*)from tests\.support\.procs import ([^\n(]+)$", fix, text, flags=re.M)
    text = re.sub(r"^pytestmark = pytest\.mark\.e2e\n", "", text, flags=re.M)
    text = re.sub(r"^[ \t]*@pytest\.mark\.e2e\n", "", text, flags=re.M)
    text = re.sub(r"pytest\.mark\.e2e, ", "", text)
    text = re.sub(r", pytest\.mark\.e2e", "", text)
    dest.write_text(text)
    subprocess.run([".venv/bin/ruff", "check", "--fix", "-q", "--select", "F401,I", str(dest)])
    subprocess.run([".venv/bin/ruff", "format", "-q", str(dest)])
