"""Split a test file across tiers: git mv SRC MAIN, then copy the named tests to other files.

usage: split.py SRC MAIN DEST=test_a,test_b [DEST=...]
Each DEST starts as a copy of SRC's module (header, helpers) with only its tests; MAIN keeps the rest.
Then: ruff --fix drops unused imports; unused helpers are reported for a hand to remove.
"""
import ast, subprocess, sys
from pathlib import Path

src, main, *rest = sys.argv[1:]
assign = {}
for spec in rest:
    dest, names = spec.split("=")
    for n in names.split(","):
        assign[n] = dest
text = Path(src).read_text()
tree = ast.parse(text)
lines = text.splitlines(keepends=True)

def spans(tree):
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            out[node.name] = (start, node.end_lineno)
    return out

sp = spans(tree)
missing = set(assign) - set(sp)
assert not missing, missing

def keep_only(names_kept):
    drop = [(s, e) for n, (s, e) in sp.items() if n not in names_kept]
    keep = [True] * len(lines)
    for s, e in drop:
        for i in range(s, e):
            keep[i] = False
        # also drop blank lines right after
        i = e
        while i < len(lines) and lines[i].strip() == "":
            keep[i] = False
            i += 1
    return "".join(l for l, k in zip(lines, keep) if k)

Path(main).parent.mkdir(parents=True, exist_ok=True)
if Path(src) != Path(main):
    subprocess.run(["git", "mv", src, main], check=True)
dests = sorted(set(assign.values()))
main_names = {n for n in sp if n not in assign}
Path(main).write_text(keep_only(main_names))
for d in dests:
    names = {n for n, dd in assign.items() if dd == d}
    Path(d).parent.mkdir(parents=True, exist_ok=True)
    assert not Path(d).exists(), d
    Path(d).write_text(keep_only(names))
    subprocess.run(["git", "add", d], check=True)
for f in [main, *dests]:
    subprocess.run([".venv/bin/ruff", "check", "--fix", "-q", "--select", "F401,I", f])
    subprocess.run([".venv/bin/ruff", "format", "-q", f])
    t = ast.parse(Path(f).read_text())
    defined = {n.name for n in t.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("test_")}
    defined |= {tg.id for n in t.body if isinstance(n, ast.Assign) for tg in n.targets if isinstance(tg, ast.Name)}
    used = {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} | {n.attr for n in ast.walk(t) if isinstance(n, ast.Attribute)}
    src_text = Path(f).read_text()
    unused = [d for d in defined if src_text.count(d) <= 1 and d not in ("pytestmark",)]
    print(f, "tests:", len(spans(t)), "maybe unused:", unused)
