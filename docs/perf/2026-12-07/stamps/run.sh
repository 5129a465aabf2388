#!/usr/bin/env bash
# The route's timeline and the down gemv's L2 prefetch under PDL (run 121): binaries built here from the vendored
# sources of main 251dc8b by build.sh (build/sb); carry ["build/sb"]. Writes $OUT/stamps.log.
set -u
L="$OUT/stamps.log"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$L"
cd build/sb
for b in h_base h_acq h_pf; do echo "=== $b (PDL off)"; timeout 60 ./$b 40 1 8 64; done >> "$L" 2>&1
for b in h_base h_pf h_acq; do echo "=== $b MOEGEN_PDL=on"; MOEGEN_PDL=on timeout 60 ./$b 40 1 8; done >> "$L" 2>&1
for b in h_base h_acq; do echo "=== $b (PDL off, again)"; timeout 60 ./$b 40 1 8 64; done >> "$L" 2>&1
echo "=== h_mix (PDL off)" >> "$L"; timeout 60 ./h_mix 40 1 8 64 >> "$L" 2>&1
echo "=== h_mix MOEGEN_PDL=on" >> "$L"; MOEGEN_PDL=on timeout 60 ./h_mix 40 1 8 >> "$L" 2>&1
