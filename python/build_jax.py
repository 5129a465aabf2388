#!/usr/bin/env python3
"""build_jax.py — build the JAX handler, build/libmoegen_jax.so (the XLA FFI
handler moegen.jax registers, python/csrc/moegen_jax.cc), against the FFI
headers of the jaxlib that this Python imports (jax.ffi.include_dir()).

usage (from the repository root, after `make`):
    PYTHON_WITH_JAX python/build_jax.py [--include DIR] [--cxx CXX] [--out FILE]

--include names the headers' folder (the one holding xla/ffi/api/ffi.h)
instead, so no jax is needed. The handler links build/libmoegen.so (its
SONAME, libmoegen.so.0, which moegen._lib has loaded before it) and finds it
through $ORIGIN. setup.py runs this when jax is importable at build time.
Exit status 2 with the reason when the headers or the compiler are
missing."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_cxx  # noqa: E402

FLAGS = ["-std=c++17", "-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-shared", "-fvisibility=hidden"]


BuildError = build_cxx.BuildError


def jax_include():
    """The FFI headers' folder of the jaxlib this Python imports."""
    try:
        import jax.ffi
        return jax.ffi.include_dir()
    except Exception as e:   # no jax, or one without jax.ffi (< 0.4.31)
        raise BuildError("%s cannot import jax.ffi (jax >= 0.4.31: %s: %s); install jax, run this with a Python "
                         "that has it, or pass --include DIR" % (sys.executable, type(e).__name__, e)) from None


def build(root, include=None, cxx=None, out=None):
    """Compile the handler; returns its path. Raises BuildError."""
    include = include or jax_include()
    if not os.path.isfile(os.path.join(include, "xla", "ffi", "api", "ffi.h")):
        raise BuildError("no xla/ffi/api/ffi.h under %s" % include)
    build_dir = os.path.join(root, "build")
    if not os.path.isfile(os.path.join(build_dir, "libmoegen.so")):
        raise BuildError("%s/libmoegen.so is missing: run `make` first" % build_dir)
    out = out or os.path.join(build_dir, "libmoegen_jax.so")
    cxx = cxx or os.environ.get("CXX", "g++")
    cmd = ([cxx] + FLAGS + ["-I" + os.path.join(root, d) for d in ("gen", "runtime")] + ["-isystem", include]
           + [os.path.join(root, "python", "csrc", "moegen_jax.cc"), "-L" + build_dir, "-l:libmoegen.so"]
           + build_cxx.LINK + ["-Wl,-rpath,$ORIGIN"])
    return build_cxx.compile(cmd, out, cxx)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--include", help="the FFI headers' folder (default: jax.ffi.include_dir())")
    ap.add_argument("--cxx", help="the C++ compiler (default: $CXX, else g++)")
    ap.add_argument("--out", help="the handler's path (default: build/libmoegen_jax.so)")
    opt = ap.parse_args()
    try:
        print("build_jax: %s" % build(os.path.dirname(HERE), opt.include, opt.cxx, opt.out))
    except BuildError as e:
        print("build_jax: error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
