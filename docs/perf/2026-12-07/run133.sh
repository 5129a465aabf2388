#!/usr/bin/env bash
# Run 133 (twenty-fourth session): the vendored launcher of main 6856a75 on a GPU (test_vendored on Qwen3-30B's
# emitted source: its 1- and 8-token calls launch with overlap by the table's +pdl under MOEGEN_PDL unset, none
# with off), and test_gpu of r132 (run 132's build) at <= 8 tokens on the specs whose route takes other branches
# of the 1-token tail (given ids and weights: the scan plan; router.apply = "input": the tail's copy; groups;
# training); then MOEGEN_PDL off / on at 2 / 4 / 16 / 32 tokens (the buckets run 130 did not measure). Carry ["build/r132", "build/r133"].
set -u
mkdir -p "$OUT/w"
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
timeout 100 build/r133/test_vendored examples/specs/qwen3-30b-a3b.moe > "$OUT/w/test_vendored.log" 2>&1
echo "test_vendored (MOEGEN_PDL unset): exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
MOEGEN_PDL=off timeout 100 build/r133/test_vendored examples/specs/qwen3-30b-a3b.moe > "$OUT/w/test_vendored_off.log" 2>&1
echo "test_vendored (MOEGEN_PDL=off): exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
cp build/r132/moegen build/r132/libmoegen.so build/r132/libmoegen_ref.so build/r132/liblua5.4.so.0 build/r132/libjansson.so.4 build/
timeout 120 stdbuf -oL -eL build/r132/test_gpu --tokens-max 8 given_ids given_weights apply_input group_12e \
    training deepseek-v3-ep8 > "$OUT/w/test_gpu_r132_other8.log" 2>&1
echo "test_gpu r132 other specs <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
# launch overlap at the unmeasured sizes (the tuning buckets 2, 4, 16-47 of the one-GPU decode specs), two repeats
for rep in 1 2; do
    for s in qwen3-30b-a3b olmoe-1b-7b gpt-oss-20b deepseek-v3-ep8; do
        for pdl in off on; do
            [ $SECONDS -le 250 ] || break 3
            echo "== $s pdl=$pdl rep=$rep" >> "$OUT/w/pdl.log"
            MOEGEN_PDL=$pdl timeout 20 build/r132/moe_bench examples/specs/$s.moe --graph --tokens 2 --tokens 4 \
                --tokens 16 --tokens 32 --iters 20 >> "$OUT/w/pdl.log" 2>&1
        done
    done
    echo "pdl rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |LAYER graph" "$OUT/w/pdl.log" | head -100
