#!/usr/bin/env bash
# Run 173 (2026-12-08, thirty-first session): run 171 (the test cases of bwd_W.lines' tiles) then run 172 (issue
# #19's done-when: test_bwd_gpu whole as four processes, moe_bench --backward and compare_torch --backward at 4096
# tokens) in one call, on whichever GPU comes. carry ["build/r173"] (bench/pack_device.sh r173 on main).
# usage: bash docs/perf/2026-12-08/run173.sh [BUDGET]   (BUDGET: seconds for run 172's part, default 480)
set -u
ln -sfn r173 build/r171; ln -sfn r173 build/r172
top=$OUT
mkdir -p "$top/a"
OUT=$top/a bash docs/perf/2026-12-07/run171.sh
(cd "$top" && tar czf run171.tgz --remove-files a)
OUT=$top bash docs/perf/2026-12-07/run172.sh "${1:-480}"
