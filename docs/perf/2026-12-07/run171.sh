#!/usr/bin/env bash
# Run 171 (NOT run in the thirtieth session: too little device time left): the test cases of the backward tiles
# that bwd_W.lines would ship (tests/tune/bwd.tune: train_gptoss's dgrad_up on the persist grid with one consumer;
# bwd2.tune: wgrads 192 x 128 in 4 stages and 128 x 128 in 5), and moe_plan_info.backward_kernels' check, ~70 s.
# carry ["build/r171"]: a build of main (make gpu-build build/libmoegen_ref.so && /work/mkr.sh build r171).
# If both pass: append docs/perf/2026-12-07/bwd_W.lines' entries to tuning/h200.tune.
. bench/gpu_env.sh
export MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build:$PWD/build/r171
cp build/r171/libmoegen.so build/r171/moegen build/r171/liblua5.4.so.0 build/r171/libjansson.so.4 build/
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
( timeout 70 stdbuf -oL -eL build/r171/test_bwd_gpu train_softmax_hgrad > "$OUT/hgrad.log" 2>&1
  echo "hgrad exit $? ($SECONDS s)" >> "$OUT/rc.txt" ) &
timeout 70 stdbuf -oL -eL build/r171/test_bwd_gpu train_gptoss > "$OUT/gptoss.log" 2>&1
echo "gptoss exit $? ($SECONDS s)" >> "$OUT/rc.txt"
wait
cat "$OUT/gpu.txt" "$OUT/rc.txt"
for f in "$OUT"/*.log; do echo "$f: $(tail -1 "$f")"; grep -m5 FAIL "$f"; grep "under tests" "$f" | sed 's/ (so far.*//' | sort -u; done
