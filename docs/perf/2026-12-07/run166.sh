#!/usr/bin/env bash
# Run 166 (twenty-ninth session; ~520 s): where main stands on the card the issues name, right after run165 on
# the same warm machine (carry ["build/r165"]): the backward fp32 / dtype at 4096 / 16384 for Qwen3, Mixtral, the
# EP8 rank with torch autograd beside it (#19; run164's b/ part), moe_bench --graph at 1 .. 512 tokens (#16's table) for
# the example specs, then compare_torch.py (torch._grouped_mm, the eager layer, dense cuBLAS and
# copy ceilings) at 4096 / 16384, then the fp8 examples against torch._scaled_grouped_mm (#20).
set -u
mkdir -p "$OUT/s"
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0
. bench/gpu_env.sh
B=build/r165
cp $B/moegen $B/libmoegen.so $B/libmoegen_ref.so $B/liblua5.4.so.0 $B/libjansson.so.4 build/
export LD_LIBRARY_PATH=$PWD/build:$PWD/$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/s/gpu.txt"
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$s.moe; echo "training = true"; } > /tmp/train_$s.moe
    { cat examples/specs/$s.moe; echo "training = true"; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$s.moe
    for v in train trainh; do
        [ $SECONDS -le 150 ] || break 2
        echo "== $v $s" >> "$OUT/s/backward.log"
        timeout 50 $B/moe_bench /tmp/${v}_$s.moe --backward --tokens 4096 --tokens 16384 --iters 10 \
            >> "$OUT/s/backward.log" 2>&1
        echo "backward $v $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
    done
    echo "== torch $s" >> "$OUT/s/backward.log"
    timeout 50 python3 bench/compare_torch.py examples/specs/$s.moe --backward --tokens 4096 --tokens 16384 \
        --iters 10 >> "$OUT/s/backward.log" 2>&1
    echo "compare backward $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8 gpt-oss-20b gpt-oss-120b; do
    [ $SECONDS -le 300 ] || break
    echo "== $s" >> "$OUT/s/small.log"
    timeout 45 $B/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --tokens 512 --iters 20 >> "$OUT/s/small.log" 2>&1
    echo "small $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $SECONDS -le 400 ] || break
    echo "== $s" >> "$OUT/s/large.log"
    timeout 40 python3 bench/compare_torch.py examples/specs/$s.moe --tokens 4096 --tokens 16384 --iters 10 \
        >> "$OUT/s/large.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
for s in mixtral-8x7b deepseek-v3-ep8 qwen3-30b-a3b; do
    f=examples/specs/fp8/$s-fp8.moe; [ -f $f ] || continue
    [ $SECONDS -le 480 ] || break
    echo "== fp8 $s" >> "$OUT/s/fp8.log"
    timeout 40 python3 bench/compare_torch.py $f --tokens 4096 --tokens 16384 --iters 10 >> "$OUT/s/fp8.log" 2>&1
    echo "fp8 $s: exit $? ($SECONDS s)" >> "$OUT/s/rc.txt"
done
cat "$OUT/s/gpu.txt" "$OUT/s/rc.txt"
grep -E "^== |^(4096|16384) +[01] |autograd (fwd|bwd)" "$OUT/s/backward.log"
grep -E "^== |LAYER graph" "$OUT/s/small.log" | head -60
cd "$OUT" && tar czf run166.tgz --remove-files s
