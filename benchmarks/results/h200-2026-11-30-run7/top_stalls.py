"""The SASS lines with the most warp-stall samples per kernel, from `ncu --page source --csv --print-source sass`."""
import csv
import sys

lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
header, rows, sections = None, [], []
title = "?"
for line in lines:
    fields = next(csv.reader([line])) if line.strip() else []
    if fields and any("Stall Sampling" in f for f in fields) and any(f in ("Source", "# Source") for f in fields):
        if header is not None:
            sections.append((title, header, rows))
        header, rows = fields, []
    elif header is not None and len(fields) == len(header):
        rows.append(fields)
    elif fields:
        if header is not None:
            sections.append((title, header, rows))
            header, rows = None, []
        title = line.strip()[:200]
if header is not None:
    sections.append((title, header, rows))
if not sections:
    print("no source table found; the first lines:")
    print("\n".join(lines[:60]))
for title, header, rows in sections:
    stall = next(i for i, f in enumerate(header) if "Stall Sampling (All" in f or "Stall Sampling" in f)
    src = next(i for i, f in enumerate(header) if f in ("Source", "# Source"))
    extra = [i for i, f in enumerate(header) if f in ("Address", "Instructions Executed")]

    def value(r):
        try:
            return float(r[stall].replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(value(r) for r in rows) or 1.0
    print(f"== {title}  ({len(rows)} SASS lines, {total:.0f} stall samples; columns: {header})")
    for r in sorted(rows, key=value, reverse=True)[:30]:
        print(f"{100 * value(r) / total:5.1f}%  {' '.join(r[i] for i in extra)}  {r[src]}")
