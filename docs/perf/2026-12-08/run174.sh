#!/usr/bin/env bash
# Run 174 (2026-12-08, thirty-first session), on whichever GPU comes, in one call (END s, default 560), in this
# order (each part tarred as it ends, so a call cut short keeps the parts before):
#   a/  run 171: the test cases of bwd_W.lines' tiles (~70 s);
#   f/  the fp8 consumer with every scale of a k tile loaded before its waits (build r174, branch fp8-hoist
#       c4265fc) against r173, EP8 rank and Qwen3 fp8 (block scales), 4096 and 16384 tokens, alternated twice;
#       and (build r175, branch fp8-ra) with A from registers as well (ldmatrix once a k tile, wgmma RS; one B scale
#       pointer per half pair); r174's and r175's test_quant_gpu beside run 171 (cut at 110 s);
#   n/  Nsight Compute (--set full) of Mixtral's fp8 up and down GEMMs and its bf16 up GEMM at 16384 tokens
#       (issue #20: what limits the fp8 main loop);
#   s/  run 172's measurements: moe_bench --backward (dtype, fp32) and compare_torch --backward at 4096 tokens.
# carry ["build/r173", "build/r174", "build/r175"] (bench/pack_device.sh --only ... r173 on main 4c31408, r174 on fp8-hoist
# c4265fc, r175 on fp8-ra: docs/perf/2026-12-08/README.md names the programs each keeps).
set -u
END=${1:-560}  # seconds: nothing starts that could run past it
ABEND=${2:-$((END - 200))}  # seconds: no A/B run starts after it
ln -sfn r173 build/r171
top=$OUT B=build/r173
mkdir -p "$top/a" "$top/n" "$top/f" "$top/s"
. bench/gpu_env.sh
L0=$LD_LIBRARY_PATH
for r in r174 r175; do
    ( MOEGEN_CACHE_DIR=/tmp/moegen_cache_$r LD_LIBRARY_PATH=$PWD/build/$r:$L0 timeout 110 stdbuf -oL -eL \
        build/$r/test_quant_gpu > "$top/f/test_quant_gpu_$r.log" 2>&1
      echo "test_quant_gpu $r: exit $? ($SECONDS s)" >> "$top/f/rc.txt" ) &
done
OUT=$top/a bash docs/perf/2026-12-07/run171.sh
wait
(cd "$top" && tar czf run171.tgz --remove-files a)
export MOEGEN_CACHE_DIR=/tmp/moegen_cache NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/build:$PWD/build/r173:$L0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$top/gpu.txt"
for rep in 1 2; do
    for sp in deepseek-v3-ep8-fp8 qwen3-30b-a3b-fp8; do
        for v in base hoist ra; do
            [ $SECONDS -le $ABEND ] || break 3
            b=build/r173; [ $v = hoist ] && b=build/r174; [ $v = ra ] && b=build/r175
            echo "== $v $sp rep $rep" >> "$top/f/ab.log"
            LD_LIBRARY_PATH=$PWD/$b:$L0 timeout 40 $b/moe_bench examples/specs/fp8/$sp.moe --tokens 4096 --tokens 16384 \
                --iters 10 >> "$top/f/ab.log" 2>&1
            echo "ab $v $sp $rep: exit $? ($SECONDS s)" >> "$top/f/rc.txt"
        done
    done
done
(cd "$top" && tar czf ab174.tgz f)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for job in fp8:gemm_up:examples/specs/fp8/mixtral-8x7b-fp8.moe fp8:gemm_down:examples/specs/fp8/mixtral-8x7b-fp8.moe \
           bf16:gemm_up:examples/specs/mixtral-8x7b.moe; do
    IFS=: read -r dt k spec <<< "$job"
    [ $((SECONDS + 90)) -le $END ] || break
    r="$top/n/${dt}_$k"
    start=$SECONDS
    timeout 50 $NCU --clock-control none --set full --import-source no -k "regex:$k" --launch-skip 2 --launch-count 1 \
        -o "$r" $B/moe_bench "$spec" --tokens 16384 --iters 3 > "$r.run.log" 2>&1
    echo "ncu $dt $k: exit $? ($((SECONDS - start)) s)" >> "$top/n/rc.txt"
    if [ -f "$r.ncu-rep" ]; then
        timeout 20 $NCU -i "$r.ncu-rep" --page details > "$r.details.txt" 2>&1
        timeout 20 $NCU -i "$r.ncu-rep" --page source --print-source sass --csv > "$r.sass.csv" 2>&1
        gzip -9 "$r.sass.csv"; rm -f "$r.ncu-rep"
    fi
done
(cd "$top" && tar czf ncu174.tgz n)
for sp in qwen3-30b-a3b mixtral-8x7b deepseek-v3-ep8; do
    { cat examples/specs/$sp.moe; echo "training = true"; } > /tmp/train_$sp.moe
    { cat /tmp/train_$sp.moe; echo 'weight_grads = "dtype"'; } > /tmp/trainh_$sp.moe
    for v in trainh train; do
        [ $((SECONDS + 35)) -le $END ] || break 2
        echo "== $v $sp" >> "$top/s/backward.log"
        timeout 35 $B/moe_bench /tmp/${v}_$sp.moe --backward --tokens 4096 --iters 10 >> "$top/s/backward.log" 2>&1
        echo "backward $v $sp: exit $? ($SECONDS s)" >> "$top/s/rc.txt"
    done
    [ $((SECONDS + 30)) -le $END ] || break
    echo "== torch $sp" >> "$top/s/backward.log"
    timeout 30 python3 bench/compare_torch.py examples/specs/$sp.moe --backward --tokens 4096 --iters 10 \
        >> "$top/s/backward.log" 2>&1
    echo "compare backward $sp: exit $? ($SECONDS s)" >> "$top/s/rc.txt"
done
for r in r174 r175; do tail -1 "$top/f/test_quant_gpu_$r.log"; grep -m5 FAIL "$top/f/test_quant_gpu_$r.log"; done
cat "$top/gpu.txt" "$top"/n/rc.txt "$top"/f/rc.txt "$top"/s/rc.txt
grep -hE "^  [a-z_0-9]+_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|Shared Memory|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occ" \
    "$top"/n/*.details.txt | head -60
grep -E "^== |^(4096|16384) +gemm" "$top/f/ab.log"
grep -E "^== |^4096 +(0|1) |^4096 +[dw]grad|autograd (fwd|bwd)" "$top/s/backward.log"
cd "$top" && tar czf run174.tgz --remove-files s && rm -rf n f
