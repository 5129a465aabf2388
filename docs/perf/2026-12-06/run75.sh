#!/usr/bin/env bash
# Run 75 (twelfth session, 2026-12-06): profiles for #16 (the 1-token route per template line, the gemvs' memory
# and stall figures), the backward at 4096 tokens on main's router-tc kernels (#19), and the whole test_bwd_gpu
# (ep and fsdp included) on main. Carry: ["build/cur"] (main's moe_bench, test_bwd_gpu, moegen, stripped).
# Each step is skipped once the call has run past its share of the budget B (seconds), so the logs come back whole.
set -u
B=${1:-420}
mkdir -p "$OUT" /tmp/mc_li && chmod 700 /tmp/mc_li
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$OUT/gpu.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# 1. Nsight Compute, Qwen3 at 1 token: route, up and down gemv, with line tables (the cubin that ran comes back)
( export MOEGEN_CACHE_DIR=/tmp/mc_li MOEGEN_LINEINFO=on
  timeout $((B * 25 / 100)) $NCU --set full --import-source yes -k 'regex:_route_|_gemv_' --launch-count 6 \
      -o "$OUT/q1" build/cur/moe_bench examples/specs/qwen3-30b-a3b.moe --tokens 1 --iters 1 > "$OUT/ncu_run.log" 2>&1
  echo "ncu: exit $? ($SECONDS s)" >> "$OUT/rc.txt" )
if [ -f "$OUT/q1.ncu-rep" ]; then
    timeout 60 $NCU --import "$OUT/q1.ncu-rep" --page source --csv --print-source sass > "$OUT/q1_sass.csv" 2>&1
    timeout 60 $NCU --import "$OUT/q1.ncu-rep" --print-details all > "$OUT/q1_details.log" 2>&1
    rm -f "$OUT/q1.ncu-rep"
    cp /tmp/mc_li/*.cubin "$OUT/" 2>/dev/null
    gzip -9 "$OUT/q1_sass.csv" "$OUT/q1_details.log" "$OUT"/*.cubin
fi
# 2. the backward at 4096 tokens (and Qwen3 at 16384): Qwen3, Mixtral, the EP8 rank
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $SECONDS -gt $((B * 45 / 100)) ] && break
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    echo "== $s" >> "$OUT/backward.log"
    toks="--tokens 4096"; [ $s = qwen3-30b-a3b ] && toks="--tokens 4096 --tokens 16384"
    timeout 40 build/cur/moe_bench /tmp/train_$s.moe --backward $toks --iters 10 >> "$OUT/backward.log" 2>&1
    echo "bench backward $s: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
# 3. the whole test_bwd_gpu on main (examples, fsdp, ep included)
[ $SECONDS -lt $((B * 55 / 100)) ] && { timeout $((B - SECONDS - 10)) build/cur/test_bwd_gpu > "$OUT/test_bwd_gpu.log" 2>&1;
    echo "test_bwd_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"; }
cat "$OUT/rc.txt"; tail -n 2 "$OUT/test_bwd_gpu.log" 2>/dev/null; grep -m5 FAIL "$OUT/test_bwd_gpu.log" 2>/dev/null
grep -E "^== |router|^4096 |^16384 " "$OUT/backward.log" 2>/dev/null | head -40
ls -la "$OUT"
