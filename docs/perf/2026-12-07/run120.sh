#!/usr/bin/env bash
# Run 120 (twenty-second session): the peers beside run 119's table, and the 1-token route's per-instruction stall
# samples (dense: --warp-sampling-interval 0, three launches). Build r119 as run119.sh says (main 28d72ea);
# carry ["build/r119"]. Outputs come back as one tarball (a call returns at most 8 files).
set -u
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
B=build/r119
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for s in qwen3-30b-a3b mixtral-8x7b; do
    r="$OUT/w/route1_$s"
    timeout 90 $NCU --clock-control none --set full --import-source no --warp-sampling-interval 0 -k "regex:route" \
        --launch-skip 3 --launch-count 3 -o "$r" $B/moe_bench examples/specs/$s.moe --tokens 1 --iters 2 > "$r.run.log" 2>&1
    echo "ncu route $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
    if [ -f "$r.ncu-rep" ]; then
        timeout 30 $NCU -i "$r.ncu-rep" --page source --print-source sass --csv > "$r.sass.csv" 2>&1
        timeout 30 $NCU -i "$r.ncu-rep" --page details > "$r.details.txt" 2>&1
        rm -f "$r.ncu-rep"
    fi
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    echo "== $s" >> "$OUT/w/compare.log"
    timeout 90 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 \
        --tokens 128 --tokens 512 --tokens 1024 --iters 20 >> "$OUT/w/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
done
cat "$OUT/w/rc.txt"
grep -E 'graph|^compare|flush|^==' "$OUT/w/compare.log" | head -80
tar -C "$OUT" -czf "$OUT/run120.tgz" w && rm -rf "$OUT/w"
