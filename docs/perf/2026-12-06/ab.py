#!/usr/bin/env python3
"""ab.py LOG ROW [ROW...]: from moe_bench output blocks headed '== SPEC BUILD', the median over repeats of each
(spec, build, tokens, row) time in ms, and each build's ratio to the first build of its spec (run 73's decode.log).
ROW: a row name as moe_bench prints it ('LAYER graph', 'gemm_up_swiglu', 'gemm_down', 'route', 'combine')."""
import re, statistics, sys
from collections import defaultdict

log, rows = sys.argv[1], sys.argv[2:] or ["LAYER graph"]
t = defaultdict(list)
order, spec, build = [], None, None
for line in open(log):
    m = re.match(r"== (\S+) (\S+)", line)
    if m:
        spec, build = m.groups()
        if (spec, build) not in order:
            order.append((spec, build))
        continue
    for r in rows:
        m = re.match(r"(\d+)\s+" + re.escape(r) + r"\s+([\d.]+)", line)
        if m and spec:
            t[(spec, build, int(m.group(1)), r)].append(float(m.group(2)))
for r in rows:
    print(f"# {r}: median ms over repeats; ratio to the spec's first build")
    specs = []
    for s, _ in order:
        if s not in specs:
            specs.append(s)
    for s in specs:
        builds = [b for s2, b in order if s2 == s]
        toks = sorted({k[2] for k in t if k[0] == s and k[3] == r})
        for n in toks:
            base = statistics.median(t[(s, builds[0], n, r)]) if t[(s, builds[0], n, r)] else None
            cells = []
            for b in builds:
                v = t[(s, b, n, r)]
                if v:
                    m = statistics.median(v)
                    cells.append(f"{b} {m:.4f}" + (f" ({m / base:.3f})" if base and b != builds[0] else ""))
            print(f"{s:18s} {n:6d}  " + "   ".join(cells))
