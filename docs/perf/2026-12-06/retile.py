#!/usr/bin/env python3
"""retile.py OUT TILE SHAPE:BUCKET...: the shipped table (tuning/h200.tune) with the bf16 entries of the given
(shape, bucket) pairs put on TILE (fields 8-14: "bm bn bk stages consumers group_m grid"), written to OUT.
e.g. retile.py /tmp/c2t.tune "256 128 64 4 2 8 tile" "8 2 4096 14336:768" "128 8 2048 768:4096" """
import sys
out, tile, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
rep = {tuple(p.split(":")) for p in pairs}
lines = []
for l in open("tuning/h200.tune").read().splitlines():
    f = l.split()
    if not l.startswith("#") and len(f) > 14 and f[4] == "bf16" and (" ".join(f[:4]), f[6]) in rep:
        l = " ".join(f[:7]) + "  " + tile + "  " + " ".join(f[14:])
    lines.append(l)
open(out, "w").write("\n".join(lines) + "\n")
