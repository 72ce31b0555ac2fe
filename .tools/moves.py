"""Map every test id of the old tree to its id(s) now: same test name (and parameters) in the file the old one
became (any tier, same basename, or its renamed folder). Prints the table and what did not map."""
import sys
from collections import defaultdict
before = [l.strip() for l in open(sys.argv[1]) if "::" in l]
after = [l.strip() for l in open(sys.argv[2]) if "::" in l]
by_name = defaultdict(list)
for a in after:
    path, rest = a.split("::", 1)
    by_name[(path.rsplit("/", 1)[1], rest)].append(a)
same, moved, unmapped = [], [], []
after_set = set(after)
for b in before:
    if b in after_set:
        same.append(b); continue
    path, rest = b.split("::", 1)
    cands = by_name.get((path.rsplit("/", 1)[1], rest), [])
    if cands:
        moved.append((b, cands))
    else:
        unmapped.append(b)
new_only = sorted(after_set - set(same) - {c for _, cs in moved for c in cs})
print(f"# {len(before)} before, {len(after)} now: {len(same)} unchanged, {len(moved)} moved, {len(unmapped)} unmapped, {len(new_only)} new ids")
for b in unmapped: print("UNMAPPED", b)
for n in new_only: print("NEW", n)
with open(sys.argv[3], "w") as out:
    for b, cs in moved:
        out.write(f"{b} -> {' + '.join(cs)}\n")
