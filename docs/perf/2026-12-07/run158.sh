#!/usr/bin/env bash
# Run 158 (twenty-eighth session): the weight gradients in the dtype (spec weight_grads = "dtype"; r158 = main
# 11c4a31), then run156's fp8 one-token route A/B (r152 vs r151) and Qwen3's 4096 bucket on row blocks, for what
# is left of ~570 s. Carry ["build/r151", "build/r152", "build/r158"].
#   hg/   test_bwd_gpu hgrad cases + train_gptoss (fp32) cases (cut at 120 s), its fsdp and ep meshes (cut at
#         120 s); moe_bench --backward at 4096 tokens, Qwen3 and Mixtral, weight_grads fp32 / dtype, twice.
set -u
ROOT=$OUT
mkdir -p "$ROOT/hg"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0 MOEGEN_TEST_PROGRESS=1
. bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$ROOT/gpu.txt"
cp build/r158/moegen build/r158/libmoegen.so build/r158/libmoegen_ref.so build/r158/liblua5.4.so.0 \
    build/r158/libjansson.so.4 build/
LDP0=${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH=$PWD/build/r158${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 120 stdbuf -oL -eL build/r158/test_bwd_gpu hgrad train_gptoss.moe > "$ROOT/hg/test_bwd_gpu_cases.log" 2>&1
echo "test_bwd_gpu cases: exit $? ($SECONDS s)" >> "$ROOT/hg/rc.txt"
timeout 120 stdbuf -oL -eL build/r158/test_bwd_gpu fsdp ep > "$ROOT/hg/test_bwd_gpu_mesh.log" 2>&1
echo "test_bwd_gpu fsdp ep: exit $? ($SECONDS s)" >> "$ROOT/hg/rc.txt"
for s in qwen3-30b-a3b mixtral-8x7b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
done
for rep in 1 2; do
    for s in qwen3-30b-a3b mixtral-8x7b; do
        for v in train trainh; do
            echo "== $v $s rep=$rep" >> "$ROOT/hg/backward.log"
            timeout 30 build/r158/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --iters 10 \
                >> "$ROOT/hg/backward.log" 2>&1
            echo "backward $v $s: exit $? ($SECONDS s)" >> "$ROOT/hg/rc.txt"
        done
    done
done
cat "$ROOT/hg/rc.txt"
for f in "$ROOT"/hg/test_*.log; do echo "$f: $(tail -1 "$f")"; grep -h -m8 FAIL "$f"; done
grep -E "^== |^4096 +[01] |^4096 +(wgrad|dgrad)" "$ROOT/hg/backward.log"
export LD_LIBRARY_PATH=$LDP0  # the A/B scripts set their own
left=$((560 - SECONDS))
[ $left -gt 150 ] && OUT=$ROOT/fp8route NEW=r152 BASE=r151 QT=90 TG=50 bash docs/perf/2026-12-07/run144.sh $((left - 60))
left=$((570 - SECONDS))
[ $left -gt 40 ] && OUT=$ROOT/q bash docs/perf/2026-12-07/q4096.sh build/r151 $((left - 10))
cd "$ROOT" && tar czf run158.tgz --remove-files hg fp8route q 2>/dev/null
ls "$ROOT"
