#!/usr/bin/env python3
"""Run the package's CPU tests (test_core, test_torch_cpu, test_jax_cpu, and
test_tune_backward for bench/tune_backward.py; the
torch and jax ones skip without torch or jax) and close with the house's summary line,
"test_python: N passed, N failed, N skipped", as tests/run.sh reads it.
`make test` runs it with $MOEGEN_LIBRARY naming the build's libmoegen.so.
When moegen.torch loaded the C++ ops (libmoegen_torch.so), test_torch_cpu
runs once more in a child with $MOEGEN_TORCH_LIBRARY=none, on the Python
ops (`run.py test_torch_cpu` runs those names only), and its counts are
added."""
import io
import os
import re
import subprocess
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
names = sys.argv[1:] or ["test_core", "test_torch_cpu", "test_jax_cpu", "test_tune_backward"]
suite = unittest.defaultTestLoader.loadTestsFromNames(names)
log = io.StringIO()
result = unittest.TextTestRunner(stream=log, verbosity=2).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)
passed = result.testsRun - failed - skipped
if failed:
    sys.stderr.write(log.getvalue())
mt = sys.modules.get("moegen.torch")
if "test_torch_cpu" in names and mt is not None and mt.NATIVE is not None:
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "test_torch_cpu"],
                           env=dict(os.environ, MOEGEN_TORCH_LIBRARY="none"), stdout=subprocess.PIPE,
                           universal_newlines=True)
    m = re.search(r"test_python: (\d+) passed, (\d+) failed(?:, (\d+) skipped)?", child.stdout)
    if m is None or child.returncode not in (0, 1):
        sys.stderr.write("run.py: the Python ops' run ended with status %d:\n%s" % (child.returncode, child.stdout))
        failed += 1
    else:
        passed, failed, skipped = passed + int(m.group(1)), failed + int(m.group(2)), skipped + int(m.group(3) or 0)
print("test_python: %d passed, %d failed%s" % (passed, failed, ", %d skipped" % skipped if skipped else ""))
sys.exit(1 if failed else 0)
