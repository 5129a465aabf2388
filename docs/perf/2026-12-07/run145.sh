#!/usr/bin/env bash
# Run 145 (twenty-sixth session): run144.sh (the fp8 1-token route scatter, r144 against r143 = main 071de38)
# then run143.sh (+ef at the 512-token buckets) in one call; the logs tarred (the device returns few files).
# Carry ["build/r143", "build/r144"].
set -u
bash docs/perf/2026-12-07/run144.sh 300
bash docs/perf/2026-12-07/run143.sh 240
tar czf "$OUT/w.tgz" -C "$OUT" w && rm -rf "$OUT/w"
