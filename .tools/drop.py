"""Drop top-level definitions (functions, classes, assignments) by name from a file."""
import ast, subprocess, sys
from pathlib import Path
f, *names = sys.argv[1:]
text = Path(f).read_text(); lines = text.splitlines(keepends=True)
tree = ast.parse(text)
keep = [True]*len(lines)
for node in tree.body:
    name = getattr(node, "name", None)
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        name = node.targets[0].id
    if name in names:
        s = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        for i in range(s, node.end_lineno): keep[i] = False
        i = node.end_lineno
        while i < len(lines) and lines[i].strip() == "": keep[i] = False; i += 1
Path(f).write_text("".join(l for l, k in zip(lines, keep) if k))
subprocess.run([".venv/bin/ruff", "check", "--fix", "-q", "--select", "F401,I", f])
subprocess.run([".venv/bin/ruff", "format", "-q", f])
