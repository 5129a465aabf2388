#!/usr/bin/env python3
"""xfloor.py LOG: the median "x floor" of each (spec, tokens, build) LAYER graph row of moe_bench blocks headed '== SPEC BUILD'."""
import re,sys,statistics
from collections import defaultdict
d=defaultdict(list); spec=build=None
for l in open(sys.argv[1]):
    m=re.match(r"== (\S+) (\S+)",l)
    if m: spec,build=m.groups(); continue
    m=re.match(r"(\d+)\s+LAYER graph\s+([\d.]+)\s+\S+\s+\S+\s+([\d.]+)\s+([\d.]+)",l)
    if m: d[(spec,int(m.group(1)),build)].append(float(m.group(4)))
for k in sorted(d): print(*k, "x floor %.3f"%statistics.median(d[k]), len(d[k]))
