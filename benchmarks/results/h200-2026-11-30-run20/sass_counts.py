"""Every SASS line of each kernel in `ncu --page source --csv --print-source sass` output, in address order, with
its warp-level executed count, and a histogram of opcodes weighted by that count."""
import collections
import csv
import sys

rows, header, title = [], None, "?"
out = []
for line in open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines():
    fields = next(csv.reader([line])) if line.strip() else []
    if fields and "Source" in fields and "Instructions Executed" in fields:
        header = fields
        out.append((title, header, rows := []))
    elif header is not None and len(fields) == len(header):
        rows.append(fields)
    elif fields:
        header = None
        title = line.strip()[:200]
for title, header, rows in out:
    src, ex = header.index("Source"), header.index("Instructions Executed")
    total = 0
    hist = collections.Counter()
    print(f"== {title}")
    for r in rows:
        n = int(float(r[ex].replace(",", "") or 0))
        total += n
        op = r[src].split()
        op = [o for o in op if not o.startswith("@")]
        hist[op[0].split(".")[0] if op else "?"] += n
        if n:
            print(f"{n:>10} {r[src]}")
    print(f"-- total {total}")
    for k, v in hist.most_common(40):
        print(f"{k:>16} {v:>12} {100 * v / max(total, 1):5.1f}%")
