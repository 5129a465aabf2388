#!/usr/bin/env bash
# Run 173 (2026-12-08, thirty-first session), on whichever GPU comes, in one call:
#   run 171 (the test cases of bwd_W.lines' tiles, ~70 s);
#   Nsight Compute (--set full) of Mixtral's fp8 up and down GEMMs and its bf16 up GEMM at 16384 tokens
#     (issue #20: what limits the fp8 main loop: tensor pipe, shared-memory bandwidth, the promotion's waits);
#   run 172 (issue #19's done-when: test_bwd_gpu whole as four processes, moe_bench --backward and
#     compare_torch --backward at 4096 tokens) with what is left.
# carry ["build/r173"] (bench/pack_device.sh r173 on main).
# usage: bash docs/perf/2026-12-08/run173.sh [BUDGET]   (BUDGET: seconds for run 172's part, default 340)
set -u
ln -sfn r173 build/r171; ln -sfn r173 build/r172
top=$OUT
mkdir -p "$top/a" "$top/n"
OUT=$top/a bash docs/perf/2026-12-07/run171.sh
(cd "$top" && tar czf run171.tgz --remove-files a)
. bench/gpu_env.sh
export MOEGEN_CACHE_DIR=/tmp/moegen_cache LD_LIBRARY_PATH=$PWD/build:$PWD/build/r173
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for job in fp8:gemm_up:examples/specs/fp8/mixtral-8x7b-fp8.moe fp8:gemm_down:examples/specs/fp8/mixtral-8x7b-fp8.moe \
           bf16:gemm_up:examples/specs/mixtral-8x7b.moe; do
    IFS=: read -r dt k spec <<< "$job"
    r="$top/n/${dt}_$k"
    start=$SECONDS
    timeout 50 $NCU --clock-control none --set full --import-source no -k "regex:$k" --launch-skip 2 --launch-count 1 \
        -o "$r" build/r173/moe_bench "$spec" --tokens 16384 --iters 3 > "$r.run.log" 2>&1
    echo "ncu $dt $k: exit $? ($((SECONDS - start)) s)" >> "$top/n/rc.txt"
    if [ -f "$r.ncu-rep" ]; then
        timeout 20 $NCU -i "$r.ncu-rep" --page details > "$r.details.txt" 2>&1
        timeout 20 $NCU -i "$r.ncu-rep" --page source --print-source sass --csv > "$r.sass.csv" 2>&1
        gzip -9 "$r.sass.csv"; rm -f "$r.ncu-rep"
    fi
done
cat "$top/n/rc.txt"
grep -hE "^  [a-z_0-9]+_gemm|Duration|Compute \(SM\) Throughput|Memory Throughput|Shared Memory|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occ|Stall" \
    "$top"/n/*.details.txt | head -80
(cd "$top" && tar czf ncu173.tgz --remove-files n)
OUT=$top bash docs/perf/2026-12-07/run172.sh "${1:-340}"
