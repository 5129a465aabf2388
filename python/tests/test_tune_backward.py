"""bench/tune_backward.py on the CPU: moe_bench's backward output parsed (from run 170's log, an H100), the choice
of each backward GEMM's tile, the forward entry a training plan's backward entries complete, and a whole run with
the build's moegen and a stand-in moe_bench that answers from the round's table, whose printed lines must plan."""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import tune_backward as tb  # noqa: E402

LIB = os.environ.get("MOEGEN_LIBRARY", os.path.join(ROOT, "build", "libmoegen.so"))
MOEGEN = os.path.join(os.path.dirname(LIB), "moegen")


def chunks(path):
    """A sweep log's runs: {header: text} split at its "== " lines."""
    out, head = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("== "):
                head = line[3:].strip()
                out[head] = ""
            elif head:
                out[head] += line
    return out


class TuneBackward(unittest.TestCase):
    def test_parse_run170(self):
        runs = chunks(os.path.join(ROOT, "docs/perf/2026-12-07/r170/sweep.log"))
        r = tb.parse_bench(runs["default qwen3-30b-a3b rep1"])
        self.assertEqual(r["gpu"], "NVIDIA H100 80GB HBM3")
        self.assertIsNone(r["kernels"])  # r169's moe_bench predates the "backward gemms:" line
        self.assertEqual(r["runs"][4096], {"bwd": 1.7516, "dgrad_down": 0.3022, "dgrad_up": 0.4412,
                                           "wgrad_up": 0.4954, "wgrad_down": 0.2648})
        w = tb.parse_bench(runs["W qwen3-30b-a3b rep1"])
        picks = tb.choose([r, w], 4096, 2.0)  # wgrad_up 5.2 % faster, wgrad_down 4.6 %; the dgrads within 2 %
        self.assertEqual(sorted(picks), ["wgrad_down", "wgrad_up"])
        self.assertEqual(picks["wgrad_up"], (1, 0.4708, 0.4954))
        self.assertEqual(tb.choose([r, w], 4096, 6.0), {})
        self.assertEqual(tb.choose([r, w], 512, 2.0), {})  # no run at that count

    def test_parse_kernels_line(self):
        r = tb.parse_bench("moe_bench m (hash ab12) on NVIDIA H200, kernels for sm_90a\n"
                           "backward gemms: a_dgrad_down_x, a_dgrad_up_x, a_wgrad_up_x, a_wgrad_down_x\n"
                           "4096    0    1.0    1.1    2.0    2.0    300.0    0.4\n"
                           "4096    1    1.0    1.0    2.5    2.5    250.0    0.3\n"
                           "4096    dgrad_down      0.30    0.31     343.5    0.2430    1.23\n")
        self.assertEqual(r["kernels"][3], "a_wgrad_down_x")
        self.assertEqual(r["runs"][4096], {"bwd": 2.0, "dgrad_down": 0.30})  # recompute_u 0's
        self.assertEqual(r["gpu"], "NVIDIA H200")

    def test_choose_ties_and_missing(self):
        base = {"runs": {64: {"dgrad_down": 1.0, "wgrad_up": 1.0}}}
        rounds = [base, {"runs": {64: {"dgrad_down": 0.97, "wgrad_up": 1.0}}}, {"runs": {}},
                  {"runs": {64: {"dgrad_down": 0.95}}}]
        self.assertEqual(tb.choose(rounds, 64, 2.0), {"dgrad_down": (3, 0.95, 1.0)})

    def test_forward_entry(self):
        plan = "plan m (hash 0c65), bf16, E=12 top_k=2 H=264 F=136, up to 1024 tokens\n"
        table = ["# c", "12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G",
                 "12 2 264 136 bf16 sm_90a 512  128 256 64 4 2 8 tile  1 2 2026-12-07 G  # x",
                 "dgrad_down 12 2 264 136 bf16 sm_90a 512  128 128 64 4 2 8 tile  1 2 2026-12-07 G",
                 "12 2 264 136 bf16 sm_90a 2048  64 256 64 4 2 8 tile  1 2 2026-12-07 G",
                 "12 2 264 136 fp16 sm_90a 1  64 256 64 4 2 8 tile  1 2 2026-12-07 G"]
        self.assertEqual(tb.forward_entry(plan, table), {"key": "12 2 264 136 bf16 sm_90a 512", "bm": 128})
        self.assertIsNone(tb.forward_entry(plan.replace("E=12", "E=13"), table))
        self.assertEqual(tb.without_key(table, "12 2 264 136 bf16 sm_90a 512"), table[:3] + table[4:])

    @unittest.skipUnless(os.access(MOEGEN, os.X_OK), "no build/moegen")
    def test_whole_run(self):
        """Candidates checked by the planner, a round per candidate, the winners printed as lines that plan: a
        stand-in moe_bench times each stage from its round's table (the dgrads faster with bn 128, wgrad_up with
        192 rows), so the answer is known."""
        d = tempfile.mkdtemp(prefix="test_tune_backward.")
        fake = os.path.join(d, "moe_bench")
        with open(fake, "w") as f:
            f.write(textwrap.dedent("""\
                #!/usr/bin/env python3
                import os, re
                lines = open(os.environ["MOEGEN_TUNING"]).read().splitlines()
                ms = {"dgrad_down": 0.5, "dgrad_up": 0.6, "wgrad_up": 0.7, "wgrad_down": 0.8}
                for l in lines:
                    p = l.split("#")[0].split()
                    if p and p[0] in ms:
                        bm, bn = int(p[8]), int(p[9])
                        if p[0].startswith("dgrad") and bn == 128 and p[-5] == "pingpong":
                            ms[p[0]] *= 0.9
                        elif p[0] == "wgrad_up" and bm == 192:
                            ms[p[0]] *= 0.95
                        else:
                            ms[p[0]] *= 1.1
                print("moe_bench t (hash 00) on Test GPU, kernels for sm_90a")
                print("1024    0            0.5    0.5    %.4f   2.0   1.0   0.1" % sum(ms.values()))
                for k, v in ms.items():
                    print("1024    %s   %.4f   %.4f" % (k, v, v))
                """))
        os.chmod(fake, 0o755)
        table = os.path.join(d, "t.tune")
        with open(table, "w") as f:
            f.write("12 2 264 136 bf16 sm_90a 1  64 256 64 4 2 8 pingpong  1 2 2026-12-07 G\n"
                    "dgrad_down 12 2 264 136 bf16 sm_90a 1  64 256 64 3 2 8 pingpong  1 2 2026-12-07 G\n")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench/tune_backward.py"), "tests/specs/train_softmax.moe",
                            "--tokens", "1024", "--table", table, "--moegen", MOEGEN, "--bench", fake],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout.splitlines()
        self.assertEqual([l.split()[0] for l in out], ["dgrad_down", "dgrad_up", "wgrad_up"], r.stdout + r.stderr)
        self.assertTrue(out[0].startswith("dgrad_down 12 2 264 136 bf16 sm_90a 1  64 128 64 6 2 8 pingpong  450.0 "
                                          "500.0 "), out[0])
        self.assertIn("Test GPU", out[0])
        self.assertTrue(out[2].startswith("wgrad_up 12 2 264 136 bf16 sm_90a 1  192 128 64 4 3 8 persist  665.0 "
                                          "700.0 "), out[2])
        self.assertIn("wgrad_down: round 0's tile stays", r.stderr)
        # the printed lines plan, appended to the table without the key's older backward entry
        with open(table) as f:
            kept = tb.without_key(f.read().splitlines(), "12 2 264 136 bf16 sm_90a 1")
        with open(table, "w") as f:
            f.write("\n".join(kept + out) + "\n")
        p = subprocess.run([MOEGEN, "plan", "tests/specs/train_softmax.moe", "--tuning", table], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(re.search(r"backward GEMM tiles: dgrad_down \S+:2, dgrad_up \S+:3, wgrad_up \S+:4, "
                                  r"wgrad_down heuristics", p.stdout), p.stdout)
        # not a training spec: exit 2 and an error
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench/tune_backward.py"), "tests/specs/small.moe",
                            "--table", table, "--moegen", MOEGEN, "--bench", fake], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a training spec", r.stderr)


if __name__ == "__main__":
    unittest.main()
