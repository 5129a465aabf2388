#!/usr/bin/env bash
# Run test programs from the repository root; sum their "N passed, N
# failed[, N skipped]" lines into one closing line. Exit 1 if any failed.
build=$1; shift
pass=0; fail=0; skip=0; status=0
for t in "$@"; do
    out=$("$build/tests/$t" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -vE '^[a-z_]+: [0-9]+ passed' >&2
    line=$(printf '%s\n' "$out" | grep -E '^[a-z_]+: [0-9]+ passed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "$t: crashed or printed no summary (exit $rc)"; fail=$((fail + 1)); status=1; continue
    fi
    echo "$line"
    p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
    s=$(grep -oE '[0-9]+ skipped' <<<"$line" | grep -oE '[0-9]+' || echo 0)
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    [ "$rc" -ne 0 ] && status=1
done
echo "total: $pass passed, $fail failed, $skip skipped"
exit $status
