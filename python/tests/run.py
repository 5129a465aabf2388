#!/usr/bin/env python3
"""Run the package's CPU tests (test_core, test_torch_cpu, test_jax_cpu; the
torch and jax ones skip without torch or jax) and close with the house's summary line,
"test_python: N passed, N failed, N skipped", as tests/run.sh reads it.
`make test` runs it with $MOEGEN_LIBRARY naming the build's libmoegen.so."""
import io
import os
import sys
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
suite = unittest.defaultTestLoader.loadTestsFromNames(["test_core", "test_torch_cpu", "test_jax_cpu"])
log = io.StringIO()
result = unittest.TextTestRunner(stream=log, verbosity=2).run(suite)
failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
skipped = len(result.skipped)
passed = result.testsRun - failed - skipped
if failed:
    sys.stderr.write(log.getvalue())
print("test_python: %d passed, %d failed%s" % (passed, failed, ", %d skipped" % skipped if skipped else ""))
sys.exit(1 if failed else 0)
