"""Warp-stall samples per SASS line from `ncu --page source --csv --print-source sass` output (SourceCounters
section): for each kernel, the columns whose names mention samples, their totals, and the 40 lines with the most
samples in the first such column, each with its executed count. Columns are found by name, so the script does not
depend on one Nsight Compute version's exact headers."""
import csv
import sys

tables, header, title = [], None, "?"
for line in open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines():
    fields = next(csv.reader([line])) if line.strip() else []
    if fields and "Source" in fields and any("Sampl" in f for f in fields):
        header = fields
        tables.append((title, header, rows := []))
    elif header is not None and len(fields) == len(header):
        rows.append(fields)
    elif fields:
        header = None
        title = line.strip()[:200]


def number(text: str) -> float:
    try:
        return float(text.replace(",", "") or 0)
    except ValueError:
        return 0.0


for title, header, rows in tables:
    src = header.index("Source")
    executed = header.index("Instructions Executed") if "Instructions Executed" in header else None
    sampled = [i for i, name in enumerate(header) if "Sampl" in name]
    print(f"== {title}")
    for i in sampled:
        print(f"   total {header[i]}: {sum(number(r[i]) for r in rows):.0f}")
    key = sampled[0]
    print(f"-- top lines by {header[key]}")
    for r in sorted(rows, key=lambda r: -number(r[key]))[:40]:
        extra = " ".join(f"{number(r[i]):.0f}" for i in sampled)
        count = f"{number(r[executed]):.0f}" if executed is not None else "?"
        print(f"{extra:>24}  exec {count:>10}  {r[src]}")
