#!/usr/bin/env bash
# Run 136 (twenty-fifth session): run135's tests on main, and L2 eviction hints on the TMA GEMMs' loads measured.
# Builds (each: moegen, moe_bench, tests/test_gpu, libmoegen.so, libmoegen_ref.so stripped, Debian's liblua5.4.so.0
# and libjansson.so.4 beside them): r135 = main 4db0ea5; r136 = r135 + the forward TMA producers' weight (B) loads
# with an L2 evict_first policy (templates/gemm_sm90.lua: L2_B_FIRST); r137 = r136 + the activation (A) loads with
# evict_last (L2_A_LAST). Carry ["build/r135", "build/r136", "build/r137"].
# (1) test_gpu every family <= 8 tokens on Qwen3-30B, gpt-oss-20b, OLMoE on r135 (the run-133 marks, MOEGEN_PDL
# unset); (2) test_gpu gemm families at 100-4096 tokens on r137 (the hinted GEMMs against the reference);
# (3) moe_bench --graph r135 / r136 / r137 interleaved at 128 / 512 / 4096 / 16384 tokens on Mixtral, Qwen3, the EP8
# rank, twice while the budget lasts. $1: budget in seconds (default 560).
set -u
BUDGET=${1:-560}
mkdir -p "$OUT/w" build
export NCCL_NVLS_ENABLE=0 MOEGEN_CACHE_DIR=/tmp/moegen_cache
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/w/gpu.txt"
use() { cp build/$1/moegen build/$1/libmoegen.so build/$1/libmoegen_ref.so build/$1/liblua5.4.so.0 build/$1/libjansson.so.4 build/; }
use r135
timeout 110 stdbuf -oL -eL build/r135/test_gpu --tokens-max 8 qwen3-30b gpt-oss-20b olmoe > "$OUT/w/test_gpu_r135_8.log" 2>&1
echo "test_gpu r135 <= 8: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
use r137
timeout 70 stdbuf -oL -eL build/r137/test_gpu --family gemm --tokens-min 100 --tokens-max 4096 mixtral qwen3-30b \
    deepseek-v3-ep8 > "$OUT/w/test_gpu_r137_gemm.log" 2>&1
echo "test_gpu r137 gemm 100-4096: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
for rep in 1 2; do
    for s in mixtral-8x7b qwen3-30b-a3b deepseek-v3-ep8; do
        for r in r135 r136 r137; do
            [ $((SECONDS + 40)) -le $BUDGET ] || break 3
            use $r
            echo "== $s $r rep=$rep" >> "$OUT/w/ab.log"
            timeout 40 build/$r/moe_bench examples/specs/$s.moe --graph --tokens 128 --tokens 512 --tokens 4096 \
                --tokens 16384 --iters 10 >> "$OUT/w/ab.log" 2>&1
            echo "ab $s $r rep $rep: exit $? ($SECONDS s)" >> "$OUT/w/rc.txt"
        done
    done
done
cat "$OUT/w/rc.txt"
for f in "$OUT"/w/test_gpu_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m5 FAIL "$f"; done
grep -E "^== |gemm_up_swiglu|gemm_down|LAYER graph" "$OUT/w/ab.log" | head -200
