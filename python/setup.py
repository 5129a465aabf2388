"""setup.py — the build step pyproject.toml's setuptools backend runs:
`make build/libmoegen.so` in the repository (the folder above this one, or
$MOEGEN_SOURCE_DIR), then libmoegen.so and the Lua library beside it go
into the package, with the version read from gen/version.h
(_build_version.py). The wheel is platform-specific (it holds a .so)."""
import os
import re
import shutil
import subprocess

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
        for name in ("libmoegen.so", "liblua5.4.so.0"):   # libmoegen finds its Lua through $ORIGIN
            shutil.copy2(os.path.join(root, "build", name), os.path.join(dest, name))
        with open(os.path.join(dest, "_build_version.py"), "w") as f:
            f.write("__version__ = %r\n" % version())


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithMake}, distclass=BinaryDistribution)
