#!/usr/bin/env bash
# Run 117 (twenty-first session): where the 1-token route spends its cycles, instruction by instruction. Carry
# ["build/r116"] (run116's build: moe_bench, moegen, libmoegen.so). Nsight Compute on Qwen3's and gpt-oss-20b's route
# kernel at 1 token and Qwen3's at 64 (--set full: the warp-state and source counters), each report's SASS with its
# per-instruction stall samples as CSV (--page source), the summary pages as text. For issue #16's route tail: the
# eleventh session's ncu (stall reasons only) put ~14 k of 27 k cycles in the last block's tail.
set -u
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
B=build/r116
cp $B/moegen build/moegen
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for job in "qwen3-30b-a3b 1" "gpt-oss-20b 1" "qwen3-30b-a3b 64"; do
    set -- $job
    r="$OUT/w/route_$1_$2"
    timeout 120 $NCU --clock-control none --set full --import-source no -k "regex:route" --launch-skip 3 \
        --launch-count 1 -o "$r" $B/moe_bench examples/specs/$1.moe --tokens $2 --iters 2 > "$r.run.log" 2>&1
    echo "ncu $job: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    [ -f "$r.ncu-rep" ] || continue
    timeout 60 $NCU -i "$r.ncu-rep" --page details > "$r.details.txt" 2>&1
    timeout 60 $NCU -i "$r.ncu-rep" --page source --print-source sass --csv > "$r.sass.csv" 2>&1
    echo "import $job: exit $? ($SECONDS s), $(wc -l < "$r.sass.csv") SASS lines" >> "$OUT/w/rc.txt"
    gzip -9 "$r.sass.csv" "$r.details.txt"
    rm -f "$r.ncu-rep"
done
cat "$OUT/w/rc.txt"
