#!/usr/bin/env python3
"""tune_backward.py — choose a training spec's backward GEMM tiles on the GPU.

    bench/tune_backward.py SPEC [--tokens T] [--iters N] [--table FILE] [--min-gain PCT] [--rounds R]
                                [--moegen PATH] [--bench PATH] [--log FILE]

SPEC is a training spec (training = true). The backward GEMMs (dgrad_down,
dgrad_up, wgrad_up, wgrad_down) take their sm_90a tiles from tuning-table
lines led by the GEMM's name that complete the forward entry of the spec's
tokens (docs/tuning.md, "Backward entries"). This script finds that forward
entry (`moegen plan`), then runs `moe_bench SPEC --backward` once under the
table as it is (round 0: its backward entries, else the heuristics' tiles)
and once per round under the table plus one candidate tile per backward GEMM
(round i: each GEMM's i-th candidate; a GEMM with fewer candidates runs its
round-0 tile), and prints, for every GEMM whose best round beat round 0 by
--min-gain percent (default 2) at T tokens (recompute_u 0), the table line
that picks it: its time and round 0's as best_us and runner_up_us, today's
date and the GPU moe_bench names. Append those lines to the table (after
removing the key's older backward lines). Candidates the planner refuses
for this shape (`moegen plan --tuning`) are dropped before any GPU time is
spent. Run from the repository root with the build's moegen and moe_bench
(the defaults: build/moegen, build/moe_bench).

Times are one moe_bench run each (medians of --iters after an L2 flush):
gains under ~2 % are within run-to-run noise (docs/PERF.md, thirtieth
session), so repeat a close call before shipping it.
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

STAGES = ("dgrad_down", "dgrad_up", "wgrad_up", "wgrad_down")


def dgrad_candidates(bm):
    """The dgrads' candidates (bm is the forward entry's row block): ping-pong with bn 128 and 6 stages, one CTA
    per tile and the persist grid (bm / 64 consumers; 256 rows on two), ping-pong with 3 stages and group_m 16
    (the fields from bm on)."""
    c, bn = (bm // 64 if bm <= 192 else 2), (256 if bm <= 128 else 128)
    out = []
    if bm <= 128:
        out.append("%d 128 64 6 2 8 pingpong" % bm)
    out.append("%d %d 64 4 %d 8 tile" % (bm, bn, c))
    out.append("%d %d 64 4 %d 8 persist" % (bm, bn, c))
    if bm <= 128:
        out.append("%d %d 64 3 2 16 pingpong" % (bm, 256 if bm == 64 else 128))
    return out


# the wgrads' (run 169's sets, the persist grid): 256 x 128 on two consumers, 128 x 128 with 5 and 6 stages,
# 192 x 128 on three, 64 x 256 on one
WGRAD_CANDIDATES = ("256 128 64 3 2 8 persist", "128 128 64 5 2 8 persist", "192 128 64 4 3 8 persist",
                    "64 256 64 4 1 8 persist", "128 128 64 6 2 8 persist")


def parse_bench(text):
    """moe_bench --backward's output: {"gpu", "kernels" (the backward GEMMs' names, or None for a moe_bench without
    that line), "runs": {tokens: {"bwd": ms, stage: ms}} for recompute_u 0}."""
    out = {"gpu": None, "kernels": None, "runs": {}}
    m = re.search(r"^moe_bench \S+ \(hash \w+\) on (.+?), kernels for", text, re.M)
    if m:
        out["gpu"] = m.group(1)
    m = re.search(r"^backward gemms: (.+)$", text, re.M)
    if m:
        out["kernels"] = [k.strip() for k in m.group(1).split(",")]
    for line in text.splitlines():
        p = line.split()
        if len(p) >= 5 and p[0].isdigit() and p[1] == "0":
            out["runs"].setdefault(int(p[0]), {})["bwd"] = float(p[4])
        elif len(p) >= 3 and p[0].isdigit() and p[1] in STAGES:
            out["runs"].setdefault(int(p[0]), {})[p[1]] = float(p[2])
    return out


def choose(rounds, tokens, min_gain):
    """rounds[i]: parse_bench of round i (round 0 the table as it is). Returns {stage: (round, ms, round-0 ms)} for
    the stages whose fastest round beats round 0 by min_gain percent."""
    base = rounds[0]["runs"].get(tokens, {})
    picks = {}
    for st in STAGES:
        if st not in base:
            continue
        best, best_ms = 0, base[st]
        for i, r in enumerate(rounds[1:], 1):
            ms = r["runs"].get(tokens, {}).get(st)
            if ms is not None and ms < best_ms:
                best, best_ms = i, ms
        if best and best_ms * (1 + min_gain / 100.0) <= base[st]:
            picks[st] = (best, best_ms, base[st])
    return picks


def forward_entry(plan_text, table_lines):
    """The forward entry the plan's backward GEMMs complete: the table's entry of the spec's shape (moegen plan's
    first line) with the largest bucket <= its tokens (gen/plan.c; not always the line moegen plan's "sm_90a GEMM
    tiles" names, which is the capacity variant's and may be an earlier bucket with the same tiles). Returns
    {"key": its first 7 fields, "bm": its row block}, or None when the table has none (the heuristics chose)."""
    m = re.search(r"^plan \S+ \(hash \w+\), (\w+), E=(\d+) top_k=(\d+) H=(\d+) F=(\d+), up to (\d+) tokens",
                  plan_text, re.M)
    if not m:
        return None
    shape = "%s %s %s %s %s sm_90a" % (m.group(2), m.group(3), m.group(4), m.group(5), m.group(1))
    tokens, best = int(m.group(6)), None
    for line in table_lines:
        p = line.split("#")[0].split()
        if len(p) >= 8 and p[0].isdigit() and " ".join(p[:6]) == shape and int(p[6]) <= tokens:
            if best is None or int(p[6]) > int(best[6]):
                best = p
    return {"key": " ".join(best[:7]), "bm": int(best[7])} if best else None


def without_key(table_lines, key):
    """The table's lines but for the backward entries of key (the rounds bring their own)."""
    out = []
    for line in table_lines:
        p = line.split("#")[0].split()
        if p and p[0] in STAGES and " ".join(p[1:8]) == key:
            continue
        out.append(line)
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--table", default="tuning/h200.tune")
    ap.add_argument("--min-gain", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=0, help="at most this many candidate rounds (0: all)")
    ap.add_argument("--moegen", default="build/moegen")
    ap.add_argument("--bench", default="build/moe_bench")
    ap.add_argument("--log", help="append every moe_bench output here")
    a = ap.parse_args(argv)
    with open(a.table) as f:
        table = f.read().splitlines()
    plan = subprocess.run([a.moegen, "plan", a.spec, "--tuning", a.table], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    if plan.returncode != 0:
        sys.stderr.write(plan.stderr)
        return 2
    if "backward GEMMs (training = true" not in plan.stdout:
        sys.stderr.write("%s: error: not a training spec (training = true)\n" % a.spec)
        return 2
    fe = forward_entry(plan.stdout, table)
    if fe is None:
        sys.stderr.write("%s: error: %s has no entry for the spec's shape and tokens: backward entries complete "
                         "one (moegen tune SPEC -o %s first)\n" % (a.spec, a.table, a.table))
        return 2
    base = without_key(table, fe["key"])
    tmp = tempfile.mkdtemp(prefix="tune_backward.")

    def table_with(lines, name):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write("\n".join(base + lines) + "\n")
        return path

    def line_of(stage, tile, best="1", runner="2", date="2000-01-01", gpu="candidate"):
        return "%s %s  %s  %s %s %s %s" % (stage, fe["key"], tile, best, runner, date, gpu)

    cands = {}
    for st in STAGES:
        tiles = dgrad_candidates(fe["bm"]) if st.startswith("dgrad") else list(WGRAD_CANDIDATES)
        ok = []
        for t in tiles:  # the planner's checks, before any GPU time
            r = subprocess.run([a.moegen, "plan", a.spec, "--tuning", table_with([line_of(st, t)], "check.tune")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
            if r.returncode == 0:
                ok.append(t)
            else:
                sys.stderr.write("tune_backward: %s %s dropped: %s" % (st, t, r.stderr))
        cands[st] = ok
    nrounds = max(len(c) for c in cands.values())
    if a.rounds:
        nrounds = min(nrounds, a.rounds)
    rounds = []
    for i in range(nrounds + 1):
        lines = [] if i == 0 else [line_of(st, cands[st][i - 1]) for st in STAGES if i <= len(cands[st])]
        path = table_with(lines, "round%d.tune" % i)
        r = subprocess.run([a.bench, a.spec, "--backward", "--tokens", str(a.tokens), "--iters", str(a.iters)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                           env=dict(os.environ, MOEGEN_TUNING=path))
        if a.log:
            with open(a.log, "a") as f:
                f.write("== round %d: %s\n%s" % (i, "; ".join(lines) or "the table as it is", r.stdout))
        if r.returncode != 0:
            sys.stderr.write("tune_backward: round %d: moe_bench exit %d\n%s" % (i, r.returncode, r.stdout))
            if i == 0:
                return 1
        rounds.append(parse_bench(r.stdout))
        sys.stderr.write("tune_backward: round %d of %d: backward %s ms\n" % (
            i, nrounds, rounds[-1]["runs"].get(a.tokens, {}).get("bwd")))
    picks = choose(rounds, a.tokens, a.min_gain)
    today = datetime.date.today().isoformat()
    gpu = rounds[0]["gpu"] or "unknown GPU"
    for st in STAGES:
        if st in picks:
            i, ms, base_ms = picks[st]
            print(line_of(st, cands[st][i - 1], "%.1f" % (ms * 1000), "%.1f" % (base_ms * 1000), today, gpu) +
                  "  # tune_backward.py at %d tokens" % a.tokens)
        else:
            sys.stderr.write("tune_backward: %s: round 0's tile stays (no candidate %.1f %% faster)\n" % (
                st, a.min_gain))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
