"""setup.py — the build step pyproject.toml's setuptools backend runs:
`make build/libmoegen.so` in the repository (the folder above this one, or
$MOEGEN_SOURCE_DIR), then libmoegen.so and the Lua library beside it go
into the package, with the version read from gen/version.h
(_build_version.py). The wheel is platform-specific (it holds a .so).

The JAX handler (libmoegen_jax.so, python/build_jax.py) is built too when jax is
importable by the building Python (pip's build isolation hides the
environment's jax: `pip install --no-build-isolation ./python`) or
$MOEGEN_JAX_INCLUDE names the FFI headers' folder. $MOEGEN_JAX: 1 = the
handler is required (the build fails without it), 0 = never built; unset =
built when possible, else a notice and the package without it.

The PyTorch ops in C++ (libmoegen_torch.so, python/build_torch.py) likewise,
when a CUDA torch is importable by the building Python (again
--no-build-isolation) and its CUDA headers are found; $MOEGEN_TORCH: 1 =
required, 0 = never built, unset = when possible. Without them moegen.torch
defines the same ops in Python. The library is built for the torch it was
compiled against: reinstall the package after changing torch."""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def source_dir():
    root = os.environ.get("MOEGEN_SOURCE_DIR") or os.path.dirname(HERE)
    if not os.path.isfile(os.path.join(root, "gen", "version.h")) or not os.path.isfile(
            os.path.join(root, "Makefile")):
        raise SystemExit("moegen: the package is built from the moegen repository (python/ inside it); %s is not "
                         "one (set MOEGEN_SOURCE_DIR to the repository)" % root)
    return root


def version():
    with open(os.path.join(source_dir(), "gen", "version.h")) as f:
        return re.search(r'#define MOEGEN_VERSION "([^"]+)"', f.read()).group(1)


class BuildWithMake(build_py):
    """build_py, then make's libmoegen.so (and its Lua) into the package."""

    def run(self):
        super().run()
        root = source_dir()
        jobs = os.environ.get("MOEGEN_MAKE_JOBS", "2")
        subprocess.check_call(["make", "-C", root, "-j" + jobs, "deps", "build/libmoegen.so"])
        dest = os.path.join(self.build_lib, "moegen")
        os.makedirs(dest, exist_ok=True)
        for name in ("libmoegen.so", "liblua5.4.so.0", "libjansson.so.4"):   # found through $ORIGIN
            shutil.copy2(os.path.join(root, "build", name), os.path.join(dest, name))
        handler = os.path.join(dest, "libmoegen_jax.so")
        if self.build_jax(root):
            shutil.copy2(os.path.join(root, "build", "libmoegen_jax.so"), handler)
        elif os.path.exists(handler):   # an earlier build's, left in build_lib
            os.remove(handler)
        ops = os.path.join(dest, "libmoegen_torch.so")
        if self.build_torch(root):
            shutil.copy2(os.path.join(root, "build", "libmoegen_torch.so"), ops)
        elif os.path.exists(ops):
            os.remove(ops)
        with open(os.path.join(dest, "_build_version.py"), "w") as f:
            f.write("__version__ = %r\n" % version())

    def build_jax(self, root):
        """python/build_jax.py's build when the FFI headers are at hand;
        whether the handler was built."""
        mode = os.environ.get("MOEGEN_JAX", "")
        if mode == "0":
            return False
        sys.path.insert(0, HERE)
        import build_jax
        try:
            build_jax.build(root, os.environ.get("MOEGEN_JAX_INCLUDE"))
        except build_jax.BuildError as e:
            if mode == "1":
                raise SystemExit("moegen: MOEGEN_JAX=1 but the JAX handler was not built: %s (pip hides the "
                                 "environment's jax from an isolated build: pip install --no-build-isolation, "
                                 "or set MOEGEN_JAX_INCLUDE)" % e)
            print("moegen: the JAX handler is not built: %s. moegen.jax needs it: install with jax importable "
                  "(pip install --no-build-isolation ./python) or set MOEGEN_JAX_INCLUDE" % e)
            return False
        return True


    def build_torch(self, root):
        """python/build_torch.py's build when a CUDA torch is importable;
        whether the library was built."""
        mode = os.environ.get("MOEGEN_TORCH", "")
        if mode == "0":
            return False
        sys.path.insert(0, HERE)
        import build_torch
        try:
            build_torch.build(root)
        except build_torch.BuildError as e:
            if mode == "1":
                raise SystemExit("moegen: MOEGEN_TORCH=1 but the PyTorch ops were not built: %s (pip hides the "
                                 "environment's torch from an isolated build: pip install --no-build-isolation)" % e)
            print("moegen: the PyTorch ops in C++ are not built: %s. moegen.torch uses its Python ops (install with "
                  "a CUDA torch importable: pip install --no-build-isolation ./python)" % e)
            return False
        return True


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithMake}, distclass=BinaryDistribution)
