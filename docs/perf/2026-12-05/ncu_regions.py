#!/usr/bin/env python3
"""Warp samples of one sm_90a GEMM kernel by region, from Nsight Compute's source page
(`ncu --import R.ncu-rep --page source --csv --print-source sass > F.csv`, gzip allowed):
setup (before the main loop), the main loop (instructions executed >= 1e6 times), the
consumers' epilogue (up to the first EXIT) and the producer (after it), each with its
top five stall reasons. Used for runs 63 and 64:  python3 ncu_regions.py run63/ncu_fp8up_sass.csv.gz"""
import csv, gzip, io, sys


def num(x):
    try:
        return int(x)
    except ValueError:
        return 0


path = sys.argv[1]
text = gzip.open(path, "rt").read() if path.endswith(".gz") else open(path).read()
rows = list(csv.reader(io.StringIO(text)))
hdr, data = rows[1], rows[2:]
src, samples, executed = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
reasons = [(h, hdr.index(h)) for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
first_exit = min(i for i, r in enumerate(data) if r[src].strip().startswith("EXIT"))
loop = [i for i in range(first_exit) if num(data[i][executed]) >= 1_000_000]
a, b = min(loop), max(loop) + 1
total = sum(num(r[samples]) for r in data)
for name, (x, y) in {"setup": (0, a), "main loop": (a, b), "epilogue": (b, first_exit + 1),
                     "producer": (first_exit + 1, len(data))}.items():
    s = sum(num(r[samples]) for r in data[x:y])
    top = sorted(((sum(num(r[i]) for r in data[x:y]), h) for h, i in reasons), reverse=True)[:5]
    print(f"{name:10s} {s:7d} samples {100 * s / total:5.1f}%  " + ", ".join(f"{h[6:]} {n}" for n, h in top))
