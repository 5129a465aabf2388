#!/usr/bin/env python3
"""build_torch.py — build the PyTorch ops in C++, build/libmoegen_torch.so
(python/csrc/moegen_torch.cpp: moegen::moe, moe_train, moe_backward with
CUDA kernels calling libmoegen), against the torch this Python imports: its
headers, its C++ ABI and libraries, and the CUDA headers it was built with
(torch.utils.cpp_extension finds them: $CUDA_HOME, else nvcc's folder, else
/usr/local/cuda). No nvcc is run: the file is plain C++.

usage (from the repository root, after `make`):
    PYTHON_WITH_TORCH python/build_torch.py [--cxx CXX] [--out FILE]

The library links build/libmoegen.so (its SONAME, libmoegen.so.0, which
moegen._lib has loaded before it) through $ORIGIN, and torch's libraries,
which `import torch` has loaded. It is built for one torch version: the
C++ ABI of torch changes between releases, so rebuild it with torch. setup.py
runs this when torch (with CUDA) is importable at build time. Exit status 2
with the reason when torch, the CUDA headers or the compiler are missing."""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_cxx  # noqa: E402

FLAGS = ["-std=c++17", "-O2", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fPIC", "-shared",
         "-fvisibility=hidden"]


BuildError = build_cxx.BuildError


def torch_flags():
    """(include folders, library folders, defines) of the torch this Python
    imports, CUDA's headers included."""
    try:
        import torch
        import torch.utils.cpp_extension as ext
    except Exception as e:
        raise BuildError("%s cannot import torch (%s: %s); run this with a Python that has it"
                         % (sys.executable, type(e).__name__, e)) from None
    if torch.version.cuda is None:
        raise BuildError("torch %s is a build without CUDA; the ops need a CUDA torch" % torch.__version__)
    try:
        inc, lib = ext.include_paths(device_type="cuda"), ext.library_paths(device_type="cuda")
    except TypeError:   # torch < 2.6: a bool
        inc, lib = ext.include_paths(cuda=True), ext.library_paths(cuda=True)
    if not any(os.path.isfile(os.path.join(d, "cuda_runtime_api.h")) for d in inc):
        raise BuildError("no cuda_runtime_api.h under %s (torch %s was built with CUDA %s; install its toolkit's "
                         "headers or set CUDA_HOME)" % (", ".join(inc), torch.__version__, torch.version.cuda))
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    return inc, [d for d in lib if os.path.isdir(d)], ["-D_GLIBCXX_USE_CXX11_ABI=%d" % abi]


def build(root, cxx=None, out=None):
    """Compile the ops; returns the library's path. Raises BuildError."""
    inc, lib, defs = torch_flags()
    build_dir = os.path.join(root, "build")
    if not os.path.isfile(os.path.join(build_dir, "libmoegen.so")):
        raise BuildError("%s/libmoegen.so is missing: run `make` first" % build_dir)
    out = out or os.path.join(build_dir, "libmoegen_torch.so")
    cxx = cxx or os.environ.get("CXX", "g++")
    cmd = ([cxx] + FLAGS + defs + ["-I" + os.path.join(root, d) for d in ("gen", "runtime")]
           + [a for d in inc for a in ("-isystem", d)]
           + [os.path.join(root, "python", "csrc", "moegen_torch.cpp"), "-L" + build_dir, "-l:libmoegen.so"]
           + ["-L" + d for d in lib] + ["-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch"] + build_cxx.LINK
           + ["-Wl,-rpath,$ORIGIN"])
    return build_cxx.compile(cmd, out, cxx)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cxx", help="the C++ compiler (default: $CXX, else g++)")
    ap.add_argument("--out", help="the library's path (default: build/libmoegen_torch.so)")
    opt = ap.parse_args()
    try:
        print("build_torch: %s" % build(os.path.dirname(HERE), opt.cxx, opt.out))
    except BuildError as e:
        print("build_torch: error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
