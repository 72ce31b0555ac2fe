"""Move a test file to tests/inproc (git mv) and point its process helpers at tests/support/inproc.py."""
import re, subprocess, sys
from pathlib import Path

INPROC = {"start_mock", "start_proxy", "cli", "mock_and_proxy", "start"}
for arg in sys.argv[1:]:
    src = Path(arg)
    dest_dir = Path(sys.argv[0]).resolve().parent.parent / "tests" / "inproc"
    rel = src.relative_to("tests")
    dest = Path("tests/inproc") / (rel.name if len(rel.parts) == 1 else Path(*rel.parts))
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "mv", str(src), str(dest)], check=True)
    text = dest.read_text()

    def fix(m):
        names = [n.strip() for n in m.group(1).replace("(", "").replace(")", "").split(",") if n.strip()]
        moved = [n for n in names if n.split(" as ")[0] in INPROC]
        kept = [n for n in names if n not in moved]
        out = []
        if kept:
            out.append(f"from tests.support.procs import {', '.join(kept)}")
        if moved:
            out.append(f"from tests.support.inproc import {', '.join(moved)}")
        return "\n".join(out)

    text = re.sub(r"^from tests\.support\.procs import ([^\n]+)$", fix, text, flags=re.M)
    text = re.sub(r"^pytestmark = pytest\.mark\.e2e\n", "", text, flags=re.M)
    text = re.sub(r"^@pytest\.mark\.e2e\n", "", text, flags=re.M)
    text = re.sub(r"pytest\.mark\.e2e, ", "", text)
    text = re.sub(r", pytest\.mark\.e2e", "", text)
    dest.write_text(text)
    print(dest)
