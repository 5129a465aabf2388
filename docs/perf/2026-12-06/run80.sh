#!/usr/bin/env bash
# Run 80 (thirteenth session, 2026-12-06): the route's few-token path (tokens <= 8: whole-H logits of 16 columns a
# block, no tensor cores) against main before it, and moe_bench's clean L2 flush against the write flush.
# Builds (carry ["build/st", "build/gv"]): build/st = main 03d8b5f's moe_bench and moegen (the write flush);
# build/gv = this commit's moe_bench, test_gpu, moegen (stripped).
# Blocks: "old" = build/st (write flush), "gvw" = build/gv --flush write, "gvc" = build/gv (clean flush, default).
set -u
B=${1:-420}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
for s in qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b; do
    for b in old gvw gvc; do
        [ $SECONDS -gt $((B * 45 / 100)) ] && break 2
        echo "== $s $b" >> "$OUT/decode.log"
        case $b in
            old) cp build/st/moegen build/moegen; M="build/st/moe_bench" ;;
            gvw) cp build/gv/moegen build/moegen; M="build/gv/moe_bench --flush write" ;;
            gvc) cp build/gv/moegen build/moegen; M="build/gv/moe_bench" ;;
        esac
        timeout 40 $M examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 --tokens 8 --tokens 9 --iters 20 \
            >> "$OUT/decode.log" 2>&1
        echo "decode $s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
cp build/gv/moegen build/moegen
MOEGEN_TEST_PROGRESS=1 timeout $((B - SECONDS - 15)) stdbuf -oL -eL build/gv/test_gpu --tokens-max 64 \
    > "$OUT/test_gpu.log" 2>&1
echo "test_gpu: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
gzip -9 "$OUT/test_gpu.log"
cat "$OUT/rc.txt"; zcat "$OUT/test_gpu.log.gz" | tail -n 2; zcat "$OUT/test_gpu.log.gz" | grep -m8 FAIL
python3 docs/perf/2026-12-06/ab.py "$OUT/decode.log" "LAYER graph" route "weights read"
