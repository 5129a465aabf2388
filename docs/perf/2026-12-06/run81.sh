#!/usr/bin/env bash
# Run 81 (thirteenth session, 2026-12-06): decode as served, on main after the clean L2 flush (066cffc+; the kernels
# are main 03d8b5f's): (1) the layer replayed from a CUDA graph at 1..512 tokens with the 'weights read' ceiling,
# every decode spec; (2) the launch switches at 1..8 tokens with that flush: MOEGEN_COMBINE_FUSE=on, MOEGEN_PDL=on,
# both; (3) compare_torch --graph (torch._grouped_mm layer captured likewise) at 1/64/512 tokens.
# Build: build/rc = main's moe_bench, moegen, libmoegen.so (stripped); carry ["build/rc"].
set -u
B=${1:-400}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
cp build/rc/moegen build/moegen; cp build/rc/libmoegen.so build/libmoegen.so
for s in qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b gpt-oss-120b; do
    echo "== $s main" >> "$OUT/table.log"
    timeout 60 build/rc/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 8 --tokens 64 --tokens 128 \
        --tokens 512 --iters 20 >> "$OUT/table.log" 2>&1
    echo "table $s: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
for s in qwen3-30b-a3b gpt-oss-20b deepseek-v3-ep8 mixtral-8x7b; do
    for b in main comb pdl both; do
        [ $SECONDS -gt $((B * 55 / 100)) ] && break 2
        echo "== $s $b" >> "$OUT/switch.log"
        case $b in
            main) E="" ;; comb) E="MOEGEN_COMBINE_FUSE=on" ;; pdl) E="MOEGEN_PDL=on" ;;
            both) E="MOEGEN_COMBINE_FUSE=on MOEGEN_PDL=on" ;;
        esac
        env $E timeout 40 build/rc/moe_bench examples/specs/$s.moe --graph --tokens 1 --tokens 2 --tokens 4 \
            --tokens 8 --iters 20 >> "$OUT/switch.log" 2>&1
        echo "switch $s $b: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
    done
done
for s in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    [ $SECONDS -gt $((B * 85 / 100)) ] && break
    echo "== $s" >> "$OUT/compare.log"
    timeout 70 python3 bench/compare_torch.py examples/specs/$s.moe --graph --tokens 1 --tokens 64 --tokens 512 \
        --iters 20 >> "$OUT/compare.log" 2>&1
    echo "compare $s: exit $? ($SECONDS s)" >> "$OUT/rc.txt"
done
cat "$OUT/rc.txt"
awk '/^== /{b=$2} /LAYER graph|weights read/{print b, $1, $2, $3, $4, $NF}' "$OUT/table.log"
python3 docs/perf/2026-12-06/ab.py "$OUT/switch.log" "LAYER graph"
grep -E 'graph|^compare|flush' "$OUT/compare.log" | head -40
