"""The package without a GPU and without torch: the version, the struct
mirrors against the library's layout table, loading errors, spec dicts and
argument checks that come before any GPU work. Runs in `make test`."""
import ctypes
import ctypes.util
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

import moegen  # noqa: E402
from moegen import _lib  # noqa: E402


def header_version():
    with open(os.path.join(ROOT, "gen", "version.h")) as f:
        return re.search(r'#define MOEGEN_VERSION "([^"]+)"', f.read()).group(1)


class SharedCxxRuntime(unittest.TestCase):
    """build_cxx (build_torch.py, build_jax.py): the C++ runtime linked shared
    by a compiler whose -lstdc++ finds only libstdc++.a (the H200 machine has
    libstdc++.so.6 but no libstdc++.so link; the ops then crashed formatting a
    number) and by one that adds -static-libstdc++; a library without it
    refused, and the output left alone."""

    def test_static_runtime(self):
        import shutil
        import subprocess
        import build_cxx
        if not shutil.which("g++"):
            self.skipTest("no g++")
        static = subprocess.check_output(["g++", "-print-file-name=libstdc++.a"], text=True).strip()
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "t.cpp")
            with open(src, "w") as f:
                f.write('#include <sstream>\n#include <string>\nstd::string f(long v) '
                        '{ std::ostringstream o; o << v; return o.str(); }\n')
            # a folder holding only libstdc++.a, searched first: -lstdc++ finds the archive
            only_a = os.path.join(d, "only_a")
            os.mkdir(only_a)
            wrappers = {"static": 'exec g++ "$@" -static-libstdc++'}
            if os.path.isabs(static):
                os.symlink(static, os.path.join(only_a, "libstdc++.a"))
                wrappers["archive first"] = 'exec g++ -L%s "$@"' % only_a
            for name, body in wrappers.items():
                cxx = os.path.join(d, "cxx_" + name.replace(" ", "_"))
                with open(cxx, "w") as f:
                    f.write("#!/bin/sh\n%s\n" % body)
                os.chmod(cxx, 0o755)
                out = os.path.join(d, "t.so")
                with open(out, "w") as f:
                    f.write("the previous library\n")
                with self.assertRaises(build_cxx.BuildError, msg=name) as e:
                    build_cxx.compile([cxx, "-fPIC", "-shared", src], out, cxx)
                self.assertIn("links the C++ runtime statically", str(e.exception))
                self.assertIn(out, str(e.exception))
                with open(out) as f:   # a refused library replaces nothing and leaves no temporary
                    self.assertEqual(f.read(), "the previous library\n", name)
                self.assertEqual(sorted(os.listdir(d)), sorted(["t.cpp", "t.so", "only_a"] + [
                    os.path.basename(w) for w in os.listdir(d) if w.startswith("cxx_")]), name)
                self.assertEqual(build_cxx.compile([cxx, "-fPIC", "-shared", src] + build_cxx.LINK, out, cxx), out)
                self.assertIn("libstdc++.so.6", build_cxx.needed(out), name)
            self.assertIn("archive first", wrappers, "no libstdc++.a to stand for the H200 machine's")
            with self.assertRaises(build_cxx.BuildError) as e:   # a failing compile: its status, no output
                # the linker's complaint about the missing file is expected: keep it out of the test log
                build_cxx.compile(["sh", "-c", 'exec "$0" "$@" 2>/dev/null', os.path.join(d, "cxx_static"), "-fPIC",
                                   "-shared", src + ".missing"], out, "cxx")
            self.assertIn("failed with status", str(e.exception))
            with open(src, "rb") as f:   # not an ELF file: a sentence, no exception
                self.assertIn("cannot read", build_cxx.check_shared_runtime(src, "cxx"))


class Version(unittest.TestCase):
    def test_package_and_library_versions_are_gen_version_h(self):
        self.assertEqual(moegen.__version__, header_version())
        self.assertEqual(moegen.library().moe_version().decode(), header_version())

    def test_another_version_is_refused(self):
        saved = _lib.__version__
        _lib.__version__ = "0.0.0-other"
        try:
            with self.assertRaisesRegex(moegen.LibraryError, r"is version .* this package 0\.0\.0-other"):
                _lib.load(moegen.library().path)
        finally:
            _lib.__version__ = saved


class Layout(unittest.TestCase):
    def test_mirrors_match_the_library(self):
        _lib.check_layout(moegen.library())  # raises on any difference

    def check_refused(self, fields, pattern):
        bad = type("Bad", (ctypes.Structure,), {"_fields_": fields})
        with self.assertRaisesRegex(moegen.LibraryError, pattern):
            _lib.check_layout(moegen.library(), {"moe_forward_args": bad})

    def test_a_field_missing_at_the_end(self):
        f = _lib.ForwardArgs._fields_
        self.check_refused(f[:-1], r"moe_forward_args field %d: the package has missing, the library %s"
                           % (len(f) - 1, f[-1][0]))

    def test_a_field_too_many(self):
        f = _lib.ForwardArgs._fields_
        self.check_refused(f + [("extra", ctypes.c_void_p)], r"field %d: the package has extra at offset %d, 8 bytes, "
                           r"the library missing" % (len(f), ctypes.sizeof(_lib.ForwardArgs)))

    def test_two_fields_swapped(self):
        f = list(_lib.ForwardArgs._fields_)
        f[1], f[2] = f[2], f[1]
        self.check_refused(f, r"field 1: the package has router_w at offset 8, 8 bytes, the library x at offset 8")

    def test_a_field_of_another_size(self):
        f = list(_lib.ForwardArgs._fields_)
        f[0] = ("tokens", ctypes.c_int64)
        self.check_refused(f, r"field 0: the package has tokens at offset 0, 8 bytes, the library tokens at offset "
                              r"0, 4 bytes")

    def test_a_struct_the_library_does_not_describe(self):
        with self.assertRaisesRegex(moegen.LibraryError, "moe_nothing: the library does not describe it"):
            _lib.check_layout(moegen.library(), {"moe_nothing": _lib.Options})


class Loading(unittest.TestCase):
    def test_a_missing_library_names_the_path(self):
        with self.assertRaisesRegex(moegen.LibraryError, r"libmoegen.so not found \(tried /nonexistent/libmoegen.so\)"):
            _lib.load("/nonexistent/libmoegen.so")

    def test_another_library_lacks_the_functions(self):
        path = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                                 "/lib64/libc.so.6") if os.path.exists(p)), None)
        if not path:
            self.skipTest("no libc file to load")
        with self.assertRaisesRegex(moegen.LibraryError, r"lacks moe_version"):
            _lib.load(path)

    def test_not_a_library(self):
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(b"not ELF")
            f.flush()
            with self.assertRaisesRegex(moegen.LibraryError, r"did not load"):
                _lib.load(f.name)

    def test_moegen_library_is_the_only_candidate_when_set(self):
        saved = os.environ.get("MOEGEN_LIBRARY")
        os.environ["MOEGEN_LIBRARY"] = "/somewhere/libmoegen.so"
        try:
            self.assertEqual(_lib.candidates(), ["/somewhere/libmoegen.so"])
        finally:
            if saved is None:
                del os.environ["MOEGEN_LIBRARY"]
            else:
                os.environ["MOEGEN_LIBRARY"] = saved


class Packer(unittest.TestCase):
    def test_pack_writes_each_field_at_its_offset(self):
        args, pack = _lib.packer(_lib.ForwardArgs)
        names = [f[0] for f in _lib.ForwardArgs._fields_]
        values = [7] + [(0x1000 * i + 0xdead00000000) if i % 3 else 0 for i in range(1, len(names))]
        pack(*values)
        self.assertEqual([getattr(args, n) or 0 for n in names], values)
        pack(*([3] + [0] * (len(names) - 1)))   # a second call overwrites every field
        self.assertEqual([getattr(args, n) or 0 for n in names], [3] + [0] * (len(names) - 1))

    def test_a_struct_of_other_fields_is_refused(self):
        with self.assertRaisesRegex(TypeError, r"PlanInfo.struct_size is not an int or a pointer"):
            _lib.packer(_lib.PlanInfo)


class SpecDict(unittest.TestCase):
    def test_text(self):
        self.assertEqual(moegen.spec_text({"name": "t", "experts": 8, "scale": 2.5, "arch": ["sm_90a", "sm_80"],
                                           "router": {"score": "softmax", "renormalize": True},
                                           "note": 'a "q" \\ b\nc'}),
                         'name = "t"\nexperts = 8\nscale = 2.5\narch = { "sm_90a", "sm_80" }\n'
                         'router = { score = "softmax", renormalize = true }\nnote = "a \\"q\\" \\\\ b\\nc"\n')

    def test_bad_forms(self):
        for keys, exc, pattern in (([1], TypeError, "a spec is a dict"),
                                   ({"a b": 1}, ValueError, "'a b' is not a name"),
                                   ({"1a": 1}, ValueError, "is not a name"),
                                   ({"r": {"x-y": 1}}, ValueError, "'x-y' in r is not a name"),
                                   ({"x": None}, TypeError, "spec key x: NoneType is not a spec value"),
                                   ({"x": float("nan")}, ValueError, "spec key x: nan is not a finite"),
                                   ({"r": {"s": [object()]}}, TypeError, r"spec key r\.s\[0\]: object"),
                                   ({"x": "a\0b"}, ValueError, "NUL")):
            with self.assertRaisesRegex(exc, pattern):
                moegen.spec_text(keys)

    def test_the_library_checks_the_keys_and_the_file_is_removed(self):
        # a private temporary folder, so files other processes put in /tmp meanwhile do not count
        private = tempfile.mkdtemp(prefix="moegen-test-")
        saved, tempfile.tempdir = tempfile.tempdir, private
        try:
            with self.assertRaises(moegen.MoegenError) as cm:
                moegen.Plan({"name": "t", "experts": 8, "top_k": 2, "hidden": 512, "ffn": 256, "tokens": 64,
                             "routr": {"score": "softmax"}})
        finally:
            tempfile.tempdir = saved
        self.assertEqual(os.listdir(private), [])
        os.rmdir(private)
        self.assertEqual(cm.exception.status, 2)  # MOE_ERR_SPEC: the spec is checked before the driver
        self.assertIn("<dict of keys>:7: error: unknown key 'routr' (did you mean 'router'?)", str(cm.exception))

    def test_a_valid_spec_reaches_the_driver_or_plans(self):
        try:
            plan = moegen.Plan({"name": "t", "experts": 8, "top_k": 2, "hidden": 512, "ffn": 256, "tokens": 64})
        except moegen.MoegenError as e:  # no GPU here: the driver or the GPU is what is missing
            self.assertIn(e.status, (3, 4, 5), str(e))
        else:
            self.assertEqual((plan.info.experts, plan.tensors["w1p"][0]), (8, (8, 512, 512)))
            # no tuning entry for the shape: one GEMM variant, the heuristics' (bucket 0), the plan's kernels
            v = plan.variants()
            self.assertEqual((len(v), v[0].bucket, v[0].align, plan.variant_for(1), plan.variant_for(64)),
                             (1, 0, plan.info.align, 0, 0))
            self.assertEqual(v[0].gemm_up, plan.info.kernels[3])
            # no entry, no +pdl: launch overlap only where MOEGEN_PDL=on asks for it
            self.assertEqual(plan.pdl(1), 1 if plan.info.pdl == 1 else 0)
            self.assertEqual(plan.info.weight_grad_bytes, 0)  # no training

            plan.close()


class PlanInfoRead(unittest.TestCase):
    def test_the_whole_struct_is_asked_for(self):
        """Plan asks moe_plan_get_info for the whole moe_plan_info it mirrors (struct_size = its size): with 0 the
        library writes moe.h's first layout only and the later fields (pdl, gather, weight_grad_bytes, ...) read as
        zeros in Python. A stand-in library that fills what struct_size covers, as the real one does."""
        real, seen = _lib.library(), []
        first = ctypes.sizeof(ctypes.c_int) + _lib.PlanInfo.cudnn_version.offset  # moe.h's first layout

        class Stand:
            def __getattr__(self, name):
                return getattr(real, name)

            def moe_plan_create(self, handle, path, opts):
                handle._obj.value = 1
                return 0

            def moe_plan_get_info(self, handle, info):
                i = info._obj
                seen.append(i.struct_size)
                n = i.struct_size or first
                for name, value in (("experts", 8), ("weight_grad_bytes", 2), ("pdl", 2)):
                    if getattr(_lib.PlanInfo, name).offset < n:
                        setattr(i, name, value)
                return 0

            def moe_plan_tensor(self, handle, name, rank, dims, dtype):
                rank._obj.value = 0
                return 0

            def moe_plan_destroy(self, handle):
                pass

        saved = _lib.library
        _lib.library = lambda: Stand()
        try:
            plan = moegen.Plan({"name": "t", "experts": 8, "top_k": 2, "hidden": 512, "ffn": 256, "tokens": 64})
        finally:
            _lib.library = saved
        self.assertEqual(seen, [ctypes.sizeof(_lib.PlanInfo)])
        self.assertEqual((plan.info.experts, plan.info.weight_grad_bytes, plan.info.pdl), (8, 2, 2))
        plan.close()


class PlanArguments(unittest.TestCase):
    def test_refused_before_the_library(self):
        for kw, exc, pattern in (({"cudnn": "maybe"}, ValueError, "cudnn must be one of"),
                                 ({"device": -1}, ValueError, "device must be a CUDA device ordinal"),
                                 ({"device": "cuda:0"}, ValueError, "device must be"),
                                 ({"spec": 3}, TypeError, "spec is a path or a dict of keys, not int"),
                                 ({"spec": {"name": "t"}, "from_dir": True}, ValueError, "from_dir takes a folder")):
            kw.setdefault("spec", "examples/specs/mixtral-8x7b.moe")
            with self.assertRaisesRegex(exc, pattern):
                moegen.Plan(**kw)


if __name__ == "__main__":
    unittest.main()
