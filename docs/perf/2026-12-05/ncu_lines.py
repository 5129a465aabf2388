#!/usr/bin/env python3
"""Warp samples and executed instructions of one kernel per template line, from Nsight Compute's source page
(`ncu --import R.ncu-rep --page source --csv --print-source sass > F.csv`, gzip allowed) and the cubin that ran
(compiled with MOEGEN_LINEINFO=on; run72.sh brings it back from the JIT cache). The csv's addresses are absolute;
offsets from the kernel's first instruction index `nvdisasm -g -c CUBIN` (the pip package nvidia-cuda-nvdisasm has
one when the toolkit lacks it), whose `//## File` comments name each instruction's line. Prints the lines by
samples, and with --regions A,B,...:N1,N2,... the sums of route.lua's line ranges [..A), [A..B), ... named N1, ...
  python3 ncu_lines.py run72/route1_sass.csv.gz run72/NAME.cubin.gz KERNEL [--regions 470,503,566,880:p1,wk,split,p2,tail]"""
import collections, csv, gzip, io, os, re, subprocess, sys, tempfile


def read(path, mode="rt"):
    return gzip.open(path, mode).read() if path.endswith(".gz") else open(path, mode[0] + ("b" if "b" in mode else "")).read()


def num(x):
    try:
        return int(x)
    except ValueError:
        return 0


csv_path, cubin_path, kernel = sys.argv[1:4]
rows = list(csv.reader(io.StringIO(read(csv_path))))
# the csv may hold several kernels' sections ("Kernel Name" rows): take the first of KERNEL
first = next(i for i, r in enumerate(rows) if r[:1] == ["Kernel Name"] and r[1] == sys.argv[3])
stop = next((i for i in range(first + 1, len(rows)) if rows[i][:1] == ["Kernel Name"]), len(rows))
hdr, data = rows[first + 1], rows[first + 2:stop]
ia, isamp, iex = hdr.index("Address"), hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    blob = read(cubin_path, "rb")
    f.write(blob[blob.find(b"\x7fELF"):])   # the JIT cache's entries start with their own header
sass = subprocess.run(["nvdisasm", "-g", "-c", f.name], capture_output=True, text=True).stdout
os.unlink(f.name)
lines = sass.splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith(".text." + kernel + ":"))
end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("//----")), len(lines))
line_of, cur = {}, None
for l in lines[start:end]:
    m = re.search(r'//## File "([^"]+)", line (\d+)', l)
    if m:
        cur = (os.path.basename(m.group(1)), int(m.group(2)))
        continue
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s", l)
    if m and not l.strip().startswith("//"):
        line_of[int(m.group(1), 16)] = cur
base = int(data[0][ia], 16)
per = collections.defaultdict(lambda: [0, 0])
for r in data:
    k = line_of.get(int(r[ia], 16) - base)
    per[k][0] += num(r[isamp])
    per[k][1] += num(r[iex])
total = sum(v[0] for v in per.values()) or 1
for k, (s, e) in sorted(per.items(), key=lambda x: -x[1][0])[:40]:
    print(f"{str(k):34s} samples {s:6d} ({100 * s / total:5.1f}%)  executed {e}")
if len(sys.argv) > 5 and sys.argv[4] == "--regions":
    cuts, names = sys.argv[5].split(":")
    cuts, names = [int(x) for x in cuts.split(",")], names.split(",")
    reg = collections.Counter()
    for k, (s, e) in per.items():
        if not k or k[0] != "route.lua":
            reg[k[0] if k else "?"] += s
        else:
            reg[next((n for c, n in zip(cuts, names) if k[1] < c), names[-1])] += s
    for n, s in reg.most_common():
        print(f"{n:12s} {s:6d} ({100 * s / total:5.1f}%)")
