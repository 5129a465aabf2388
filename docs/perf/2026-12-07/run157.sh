#!/usr/bin/env bash
# Run 157 (twenty-eighth session, on whichever card comes; the service offered an H200): run156.sh (the fp8 one-token
# route r152 vs r151, Qwen3's 4096 bucket on row blocks, the pair profile), then run154.sh's backward comparison on
# r153 (wgrads on a second stream, MOEGEN_WGRAD_SMS off / 33 / 66) for Qwen3 and Mixtral at 4096 tokens, for what is
# left of ~570 s. Carry ["build/r151", "build/r152", "build/r153"].
set -u
ROOT=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$ROOT/gpu.txt"
OUT=$ROOT/fp8route NEW=r152 BASE=r151 QT=120 TG=80 bash docs/perf/2026-12-07/run144.sh 260
OUT=$ROOT/q bash docs/perf/2026-12-07/q4096.sh build/r151 60
OUT=$ROOT/ncu B=build/r151 bash docs/perf/2026-12-07/run153.sh 100
mkdir -p "$ROOT/bwd"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
cp build/r153/moegen build/r153/libmoegen.so build/r153/libmoegen_ref.so build/r153/liblua5.4.so.0 \
    build/r153/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build/r153${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for s in qwen3-30b-a3b mixtral-8x7b; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
done
for s in qwen3-30b-a3b mixtral-8x7b; do
    for k in off 33 66; do
        [ $SECONDS -le 540 ] || break 2
        echo "== $s MOEGEN_WGRAD_SMS=$k" >> "$ROOT/bwd/backward.log"
        MOEGEN_WGRAD_SMS=$k timeout 25 build/r153/moe_bench /tmp/train_$s.moe --backward --tokens 4096 --iters 10 \
            >> "$ROOT/bwd/backward.log" 2>&1
        echo "backward $s $k: exit $? ($SECONDS s)" >> "$ROOT/bwd/rc.txt"
    done
done
grep -E "^== |^4096 +0 " "$ROOT/bwd/backward.log"
cd "$ROOT" && tar czf run157.tgz --remove-files fp8route q ncu bwd
