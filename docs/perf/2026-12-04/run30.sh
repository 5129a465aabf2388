#!/usr/bin/env bash
# Run 30 (after runs 27 and 28; written in the seventh 2026-12-04 session, which had no GPU): the backward, ~250 s:
#   - moe_bench --backward at 4096 tokens, recompute_u 0 / 1, Mixtral and Qwen3-30B-A3B: U is recomputed by the
#     training forward's own up GEMM since 477b0b1 (run 5: Mixtral 12.23 / 19.29 ms, the old sm_80 recompute twice
#     the up GEMM it repeats), and bwd_dx reads Wr once per 8 tokens since b4f6531
#   - ncu of every kernel of Qwen3's backward at 4096 tokens (2.59 ms in run 5, 3.35x its forward): where it goes
set -u
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in mixtral-8x7b qwen3-30b-a3b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > "$OUT/train_$s.moe"
    timeout 60 build/moe_bench "$OUT/train_$s.moe" --backward --tokens 4096 --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench $s: exit $?" >> "$OUT/rc.txt"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $NCU --clock-control none --metrics gpu__time_duration.sum --csv -k regex:qwen3_30b_a3b \
    build/moe_bench "$OUT/train_qwen3-30b-a3b.moe" --backward --tokens 4096 --iters 1 > "$OUT/ncu_qwen3_bwd.csv" 2>&1
echo "ncu qwen3 backward: exit $?" >> "$OUT/rc.txt"
rm -f "$OUT"/train_*.moe
cat "$OUT/rc.txt"
grep -vE '^(plan|gemms)' "$OUT/backward.log"
python3 - "$OUT/ncu_qwen3_bwd.csv" <<'PY' || true
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; name = head.index("Kernel Name"); val = head.index("Metric Value")
tot = collections.OrderedDict()
for r in rows[1:]:
    k = r[name].split("(")[0]
    tot.setdefault(k, []).append(float(r[val].replace(",", "")))
for k, v in tot.items():
    print(f"{k[:90]:90s} n {len(v):3d}  median {sorted(v)[len(v)//2]/1e3:9.1f} us")
PY
(cd "$OUT" && tar -czf logs.tar.gz --remove-files $(ls | grep -E '\.(log|txt|csv)$'))
