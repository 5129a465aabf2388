"""moegen.jax without a GPU: importing it without jax, the argument checks
(on shape-and-dtype stand-ins, so they run without jax too), and with jax
installed: shapes under jax.eval_shape and jax.jit tracing, the lowered
custom call (target, attributes, the workspace result), and loading and
registering the handler library when it is built (python/build_jax.py), and a
training plan's custom_vjp traced and lowered. The plan is a stand-in
Binding: creating a real one needs a GPU."""
import os
import sys
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import moegen  # noqa: E402
import moegen.jax as mj  # noqa: E402  (imports without jax)

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = None

E, H, F, S, CAP = 8, 64, 32, 10, 16
H8, F8 = 256, 128   # an fp8 plan's (multiples of 128)


def expect(biases=False):
    """A plan's expectations as Binding keeps them (moe_plan_tensor's)."""
    return {"x": ((CAP, H), "bfloat16"), "y": ((CAP, H), "bfloat16"), "router_w": ((E, H), "bfloat16"),
            "router_bias": ((E,), "float32") if biases else None, "router_logit_bias": None,
            "w1p": ((S, 2 * F, H), "bfloat16"), "b1p": ((S, 2 * F), "bfloat16") if biases else None,
            "w2": ((S, H, F), "bfloat16"), "b2": ((S, H), "bfloat16") if biases else None, "shared_gate": None,
            "w1s": None, "w2s": None}


def expect_fp8(block=True):
    """An fp8 plan's expectations (quant.weights = "fp8_e4m3"): e4m3 w1p and
    w2, float32 scales per 128 x 128 block or per row (H, F multiples of 128)."""
    e = {"x": ((CAP, H8), "bfloat16"), "y": ((CAP, H8), "bfloat16"), "router_w": ((E, H8), "bfloat16"),
         "router_bias": None, "router_logit_bias": None, "b1p": None, "b2": None, "shared_gate": None,
         "w1p": ((E, 2 * F8, H8), "float8_e4m3fn"), "w2": ((E, H8, F8), "float8_e4m3fn"),
         "w1s": ((E, 2 * F8 // 128, H8 // 128) if block else (E, 2 * F8), "float32"),
         "w2s": ((E, H8 // 128, F8 // 128) if block else (E, H8), "float32")}
    return e


def spec(shape, dtype="bfloat16"):
    """An array stand-in: what check_args reads."""
    return SimpleNamespace(shape=shape, dtype=SimpleNamespace(name=dtype))


class Checks(unittest.TestCase):
    def tensors(self, **changes):
        t = {"router_w": spec((E, H)), "w1p": spec((S, 2 * F, H)), "w2": spec((S, H, F)), "router_bias": None,
             "router_logit_bias": None, "b1p": None, "b2": None, "shared_gate": None}
        t.update(changes)
        return t

    def test_fitting_arrays_pass(self):
        for T in (0, 4, CAP):
            mj.check_args(expect(), spec((T, H)), self.tensors())
        mj.check_args(expect(True), spec((3, H)), self.tensors(router_bias=spec((E,), "float32"),
                                                                b1p=spec((S, 2 * F)), b2=spec((S, H))))

    def test_refusals(self):
        cases = ((dict(x=spec((4, H + 1))), ValueError, r"x must be \[tokens, 64\], not \[4, 65\]"),
                 (dict(x=spec((2, 2, H))), ValueError, r"x must be \[tokens, 64\]"),
                 (dict(x=spec((CAP + 1, H))), ValueError, r"17 tokens; the plan takes 0 to 16 \(spec key tokens\)"),
                 (dict(x=spec((4, H), "float16")), TypeError, r"x must be bfloat16, not float16"),
                 (dict(x=[1.0]), TypeError, r"x must be an array, not list"),
                 (dict(w2=spec((S, F, H))), ValueError, r"w2 must be \[10, 64, 32\], not \[10, 32, 64\]"),
                 (dict(w1p=spec((S, 2 * F, H), "float32")), TypeError, r"w1p must be bfloat16, not float32"),
                 (dict(b2=spec((S, H))), ValueError, r"the spec takes no b2; pass None"),
                 (dict(w1p=None), ValueError, r"the spec needs w1p bfloat16 \[10, 64, 64\]"))
        for change, exc, pattern in cases:
            with self.subTest(change=list(change)):
                x = change.pop("x", spec((4, H)))
                with self.assertRaisesRegex(exc, "^moegen: " + pattern):
                    mj.check_args(expect(), x, self.tensors(**change))
        with self.assertRaisesRegex(ValueError, r"the spec needs router_bias float32 \[8\]"):
            mj.check_args(expect(True), spec((4, H)), self.tensors(b1p=spec((S, 2 * F)), b2=spec((S, H))))

    def test_bind_takes_a_plan(self):
        with self.assertRaisesRegex(TypeError, r"plan must be a moegen.Plan, not dict"):
            mj.bind({})


class Fp8Checks(unittest.TestCase):
    """An fp8 plan's arrays: e4m3 w1p and w2, and the scales w1s and w2s
    (the call's operands after shared_gate) required; another plan refuses
    the scales."""

    def tensors(self, block=True, **changes):
        f8, f32 = "float8_e4m3fn", "float32"
        t = {"router_w": spec((E, H8)), "w1p": spec((E, 2 * F8, H8), f8), "w2": spec((E, H8, F8), f8),
             "router_bias": None, "router_logit_bias": None, "b1p": None, "b2": None, "shared_gate": None,
             "w1s": spec((E, 2 * F8 // 128, H8 // 128) if block else (E, 2 * F8), f32),
             "w2s": spec((E, H8 // 128, F8 // 128) if block else (E, H8), f32)}
        t.update(changes)
        return t

    def test_fitting_arrays_pass(self):
        for block in (True, False):
            mj.check_args(expect_fp8(block), spec((4, H8)), self.tensors(block))

    def test_refusals(self):
        cases = ((dict(w1p=spec((E, 2 * F8, H8))), TypeError, r"w1p must be float8_e4m3fn, not bfloat16"),
                 (dict(w2=spec((E, H8, F8), "float8_e5m2")), TypeError, r"w2 must be float8_e4m3fn, not float8_e5m2"),
                 (dict(w1s=None), ValueError, r"the spec needs w1s float32 \[8, 2, 2\]"),
                 (dict(w2s=spec((E, H8 // 128, F8 // 128), "bfloat16")), TypeError, r"w2s must be float32, not bfloat16"),
                 (dict(w2s=spec((E, H8), "float32")), ValueError, r"w2s must be \[8, 2, 1\], not \[8, 256\]"),
                 (dict(w1s=spec((E, 2 * F8, H8 // 128), "float32")), ValueError,
                  r"w1s must be \[8, 2, 2\], not \[8, 256, 2\]"))
        for change, exc, pattern in cases:
            with self.subTest(change=list(change)), self.assertRaisesRegex(exc, "^moegen: " + pattern):
                mj.check_args(expect_fp8(), spec((4, H8)), self.tensors(**change))
        with self.assertRaisesRegex(ValueError, r"^moegen: w2s must be \[8, 256\], not \[8, 2, 1\]"):
            mj.check_args(expect_fp8(False), spec((4, H8)), self.tensors(False, w2s=spec((E, 2, 1), "float32")))
        with self.assertRaisesRegex(ValueError, r"^moegen: the spec takes no w1s; pass None"):
            mj.check_args(expect(), spec((4, H)), Checks.tensors(self, w1s=spec((S, 1, 1), "float32")))


@unittest.skipIf(jax is not None, "jax is installed")
class WithoutJax(unittest.TestCase):
    def test_a_call_says_jax_is_needed(self):
        b = mj.Binding(1, expect(), lambda t: 1024)
        with self.assertRaisesRegex(ImportError, r"moegen.jax needs jax .*pip install jax"):
            mj.moe(spec((4, H)), spec((E, H)), spec((S, 2 * F, H)), spec((S, H, F)), plan=b)


@unittest.skipIf(jax is None, "jax is not installed")
class Tracing(unittest.TestCase):
    def setUp(self):
        self.ws = {}
        self.b = mj.Binding(7, expect(), lambda t: self.ws.setdefault(t, 4096 + 1000 * t))
        bf = jnp.bfloat16
        self.w = [jax.ShapeDtypeStruct((E, H), bf), jax.ShapeDtypeStruct((S, 2 * F, H), bf),
                  jax.ShapeDtypeStruct((S, H, F), bf)]

    def f(self, b=None):
        b = b or self.b
        return lambda x, rw, w1p, w2, *opt: mj.moe(x, rw, w1p, w2, *opt, plan=b)

    def test_eval_shape(self):
        for shape in ((5, H), (3, 4, H), (H,), (0, H), (2, 0, H)):
            with self.subTest(shape=shape):
                y = jax.eval_shape(self.f(), jax.ShapeDtypeStruct(shape, jnp.bfloat16), *self.w)
                self.assertEqual((y.shape, y.dtype), (shape, jnp.bfloat16))

    def test_refused_when_traced(self):
        with self.assertRaisesRegex(TypeError, r"x must be bfloat16, not float32"):
            jax.jit(self.f()).trace(jax.ShapeDtypeStruct((4, H), jnp.float32), *self.w)
        with self.assertRaisesRegex(ValueError, r"20 tokens; the plan takes 0 to 16"):
            jax.eval_shape(self.f(), jax.ShapeDtypeStruct((4, 5, H), jnp.bfloat16), *self.w)
        with self.assertRaisesRegex(ValueError, r"x must be \[\.\.\., 64\], not \[4, 32\]"):
            jax.eval_shape(self.f(), jax.ShapeDtypeStruct((4, 32), jnp.bfloat16), *self.w)

    def test_the_lowered_custom_call(self):
        text = jax.jit(self.f()).lower(jax.ShapeDtypeStruct((5, H), jnp.bfloat16), *self.w).as_text()
        self.assertIn('@moegen_moe', text)
        self.assertRegex(text, r"plan = 7 : ui64")
        self.assertRegex(text, r"present = 0 : i32")
        self.assertIn("tensor<%dxui8>" % (4096 + 5000 + mj.WORKSPACE_ALIGN), text)   # the workspace result
        self.assertIn("tensor<5x64xbf16>", text)
        # the optional tensors given are operands after w2, named in `present`
        b = mj.Binding(9, expect(True), lambda t: 100)
        extra = [jax.ShapeDtypeStruct((E,), jnp.float32), jax.ShapeDtypeStruct((S, 2 * F), jnp.bfloat16),
                 jax.ShapeDtypeStruct((S, H), jnp.bfloat16)]
        g = lambda x, rw, w1p, w2, rb, b1p, b2: mj.moe(x, rw, w1p, w2, router_bias=rb, b1p=b1p, b2=b2, plan=b)
        text = jax.jit(g).lower(jax.ShapeDtypeStruct((2, H), jnp.bfloat16), *self.w, *extra).as_text()
        self.assertRegex(text, r"present = 13 : i32")   # bits 0 (router_bias), 2 (b1p), 3 (b2)
        self.assertRegex(text, r"plan = 9 : ui64")
        call = [line for line in text.splitlines() if "moegen_moe" in line and "custom_call" in line][0]
        self.assertEqual(call.count("%"), 8, call)   # 7 operands (x, 3 weights, 3 optional) + the result

    def test_zero_tokens_need_no_call(self):
        text = jax.jit(self.f()).lower(jax.ShapeDtypeStruct((0, H), jnp.bfloat16), *self.w).as_text()
        self.assertNotIn("moegen_moe", text)


@unittest.skipIf(jax is None, "jax is not installed")
class Fp8Tracing(unittest.TestCase):
    """An fp8 plan's call lowered (the scales as operands, bits 5 and 6 of
    present), the jnp quantizer against the library's rule, and pack_plain
    of fp8 weights on a stand-in plan."""

    def test_the_lowered_custom_call(self):
        b = mj.Binding(11, expect_fp8(), lambda t: 100)
        f8, f32 = jnp.float8_e4m3fn, jnp.float32
        w = [jax.ShapeDtypeStruct((E, H8), jnp.bfloat16), jax.ShapeDtypeStruct((E, 2 * F8, H8), f8),
             jax.ShapeDtypeStruct((E, H8, F8), f8), jax.ShapeDtypeStruct((E, 2 * F8 // 128, H8 // 128), f32),
             jax.ShapeDtypeStruct((E, H8 // 128, F8 // 128), f32)]
        g = lambda x, rw, w1p, w2, w1s, w2s: mj.moe(x, rw, w1p, w2, w1s=w1s, w2s=w2s, plan=b)
        text = jax.jit(g).lower(jax.ShapeDtypeStruct((3, H8), jnp.bfloat16), *w).as_text()
        self.assertRegex(text, r"present = 96 : i32")   # bits 5 (w1s) and 6 (w2s)
        self.assertIn("tensor<8x256x256xf8E4M3FN>", text)
        call = [line for line in text.splitlines() if "moegen_moe" in line and "custom_call" in line][0]
        self.assertEqual(call.count("%"), 7, call)   # 6 operands (x, 3 weights, 2 scales) + the result
        with self.assertRaisesRegex(ValueError, r"the spec needs w1s float32"):
            jax.eval_shape(lambda x, rw, w1p, w2: mj.moe(x, rw, w1p, w2, plan=b),
                           jax.ShapeDtypeStruct((3, H8), jnp.bfloat16), *w[:3])

    def rule(self, v):
        """The library's rule for one block (runtime/fp8.h,
        moe_fp8_quantize_block), element by element in float64 from the
        e4m3 values' own grid: (e4m3 values, scale)."""
        import numpy as np
        amax = max(float(np.max(np.abs(v))), 1e-4)
        mul = np.float32(448.0) / np.float32(amax)
        grid = np.array(sorted({float(x) for x in np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(
            np.float64) if np.isfinite(x)}))
        out = []
        for x in (v.astype(np.float32) * mul).astype(np.float64).ravel():
            x = min(max(x, -448.0), 448.0)
            i = np.searchsorted(grid, x)
            lo, hi = grid[max(i - 1, 0)], grid[min(i, len(grid) - 1)]
            c = lo if abs(x - lo) < abs(hi - x) else hi if abs(hi - x) < abs(x - lo) else \
                (lo if (np.array(lo, np.float64).astype(jnp.float8_e4m3fn).view(np.uint8) & 1) == 0 else hi)
            out.append(c)
        return np.array(out).reshape(v.shape), np.float32(amax) / np.float32(448.0)

    def test_quantize_weight_is_the_librarys_rule(self):
        import numpy as np
        rng = np.random.default_rng(5)
        w = (rng.standard_normal((2, 256, 128)) * rng.uniform(0.01, 3.0, (2, 256, 1))).astype(np.float32)
        w[0, :128, :] *= 1e-6   # a block below the amax floor
        wb = jnp.asarray(w, jnp.bfloat16)
        wf = np.asarray(wb.astype(jnp.float32))
        for block in (True, False):
            q, sc = jax.jit(lambda t: mj.quantize_weight(t, block))(wb)
            q = np.asarray(q.astype(jnp.float32)).astype(np.float64)
            sc = np.asarray(sc)
            self.assertEqual(sc.shape, (2, 2, 1) if block else (2, 256))
            for e in range(2):
                for rb in range(2 if block else 256):
                    rows = slice(rb * 128, rb * 128 + 128) if block else slice(rb, rb + 1)
                    want_q, want_s = self.rule(wf[e, rows])
                    got_s = sc[e, rb, 0] if block else sc[e, rb]
                    self.assertEqual(got_s, want_s, (block, e, rb))
                    np.testing.assert_array_equal(q[e, rows], want_q, err_msg=str((block, e, rb)))

    def test_pack_plain_of_fp8_weights(self):
        import numpy as np
        En, Fn, Hn, m = 2, 128, 256, 1
        order = list(np.random.default_rng(1).permutation(2 * Fn))
        for block in (True, False):
            B = 128 if block else 1
            w1s_shape = (En + m, 2 * Fn // B, Hn // B) if block else (En + m, 2 * Fn)
            plan = SimpleNamespace(info=SimpleNamespace(experts=En, ffn=Fn, hidden=Hn), w1_row_order=lambda: order,
                                   tensors={"x": ((4, Hn), "bf16"), "w1p": ((En + m, 2 * Fn, Hn), "fp8_e4m3"),
                                            "w1s": (w1s_shape, "fp32"), "b1p": None})
            rng = np.random.default_rng(2)
            w1 = jnp.asarray(rng.standard_normal((En, 2 * Fn, Hn)), jnp.bfloat16)
            w2 = jnp.asarray(rng.standard_normal((En, Hn, Fn)), jnp.bfloat16)
            sw1 = jnp.asarray(rng.standard_normal((2 * m * Fn, Hn)), jnp.bfloat16)
            sw2 = jnp.asarray(rng.standard_normal((Hn, m * Fn)), jnp.bfloat16)
            p = mj.quantize_plain(plan, w1=w1, w2=w2, shared_w1=sw1, shared_w2=sw2)
            q1, s1 = mj.quantize_weight(w1, block)
            self.assertEqual((p["w1p"].dtype, p["w1s"].shape), (jnp.float8_e4m3fn, w1s_shape))
            f = lambda t: np.asarray(t.astype(jnp.float32))
            np.testing.assert_array_equal(f(p["w1p"][:En]), f(q1)[:, order])   # rows packed, scales not
            np.testing.assert_array_equal(f(p["w1s"][:En]), f(s1))
            qs, ss = mj.quantize_weight(sw1, block)
            np.testing.assert_array_equal(f(p["w1p"][En]), f(qs)[order])
            np.testing.assert_array_equal(f(p["w1s"][En]), f(ss))
            q2, s2 = mj.quantize_weight(sw2, block)
            np.testing.assert_array_equal(f(p["w2"][En]), f(q2))
            np.testing.assert_array_equal(f(p["w2s"][En]), f(s2))
            with self.assertRaisesRegex(TypeError, r"w1 must be float8_e4m3fn, not bfloat16"):
                mj.pack_plain(plan, w1=w1, w2=q1, shared_w1=qs, shared_w2=q2, w1_scale=s1, w2_scale=s1,
                              shared_w1_scale=ss, shared_w2_scale=s2)


@unittest.skipIf(jax is None, "jax is not installed")
class TrainingTracing(unittest.TestCase):
    """A training plan's custom_vjp, traced and lowered (a stand-in
    Binding with training sizes): the primal is moegen_moe, a gradient
    lowers to moegen_moe_train and moegen_moe_backward with their results
    sized by the plan, and the cotangents have the primals' shapes and
    dtypes."""

    def setUp(self):
        self.b = mj.Binding(11, expect(True), lambda t: 4096 + 1000 * t,
                            saved_size=lambda t, r: 700 * t + (0 if r else 5000) + 3,
                            backward_workspace_size=lambda t, r: 300 * t + 1,
                            train_workspace_size=lambda t: 40 * t + 9)
        bf, f32 = jnp.bfloat16, jnp.float32
        self.args = [jax.ShapeDtypeStruct((5, H), bf), jax.ShapeDtypeStruct((E, H), bf),
                     jax.ShapeDtypeStruct((S, 2 * F, H), bf), jax.ShapeDtypeStruct((S, H, F), bf),
                     jax.ShapeDtypeStruct((E,), f32), jax.ShapeDtypeStruct((S, 2 * F), bf),
                     jax.ShapeDtypeStruct((S, H), bf)]

    def loss(self, recompute_u=False):
        def f(x, rw, w1p, w2, rb, b1p, b2):
            y = mj.moe(x, rw, w1p, w2, router_bias=rb, b1p=b1p, b2=b2, plan=self.b, recompute_u=recompute_u)
            return (y.astype(jnp.float32) ** 2).sum()
        return f

    def test_the_binding_trains(self):
        self.assertTrue(self.b.training)
        self.assertFalse(mj.Binding(1, expect(), lambda t: 1).training)
        self.assertFalse(mj.Binding(1, expect(), lambda t: 1, saved_size=lambda t, r: 0).training)

    def test_the_primal_is_the_plain_forward(self):
        text = jax.jit(self.loss()).lower(*self.args).as_text()
        self.assertIn("@moegen_moe(", text)
        self.assertNotIn("moegen_moe_train", text)

    def test_gradients_lower_to_train_and_backward(self):
        for recompute_u in (False, True):
            with self.subTest(recompute_u=recompute_u):
                grad = jax.grad(self.loss(recompute_u), argnums=tuple(range(7)))
                text = jax.jit(grad).lower(*self.args).as_text()
                self.assertIn("@moegen_moe_train", text)
                self.assertIn("@moegen_moe_backward", text)
                self.assertNotIn("@moegen_moe(", text)
                self.assertRegex(text, r"recompute_u = %d : i32" % recompute_u)
                self.assertRegex(text, r"present = 13 : i32")
                saved = 700 * 5 + (0 if recompute_u else 5000) + 3 + mj.WORKSPACE_ALIGN
                self.assertIn("tensor<%dxui8>" % saved, text)                          # the saved region
                self.assertIn("tensor<%dxui8>" % (300 * 5 + 1 + mj.WORKSPACE_ALIGN), text)   # backward workspace
                self.assertIn("tensor<%dxui8>" % (40 * 5 + 9 + mj.WORKSPACE_ALIGN), text)    # the training forward's
                self.assertNotIn("tensor<%dxui8>" % (4096 + 5000 + mj.WORKSPACE_ALIGN), text)  # not the forward's
                self.assertIn("tensor<%dx%dx%dxf32>" % (S, 2 * F, H), text)              # dw1p in fp32
                self.assertIn("tensor<0xf32>", text)                                    # d_logit_bias: none

    def test_cotangents_have_the_primals_shapes_and_dtypes(self):
        grad = jax.grad(self.loss(), argnums=tuple(range(7)))
        out = jax.eval_shape(grad, *self.args)
        self.assertEqual([(g.shape, g.dtype) for g in out], [(a.shape, a.dtype) for a in self.args])

    def test_vjp_of_leading_dimensions(self):
        x = jax.ShapeDtypeStruct((3, 2, H), jnp.bfloat16)
        f = lambda x, *w: mj.moe(x, *w[:3], router_bias=w[3], b1p=w[4], b2=w[5], plan=self.b)
        out = jax.eval_shape(lambda *a: jax.vjp(f, *a)[1](jnp.ones((3, 2, H), jnp.bfloat16)), x, *self.args[1:])
        self.assertEqual((out[0].shape, out[0].dtype), ((3, 2, H), jnp.bfloat16))


def handler_built():
    return any(os.path.isfile(p) for p in mj.candidates())


@unittest.skipIf(jax is None, "jax is not installed")
class Handler(unittest.TestCase):
    @unittest.skipUnless(handler_built(), "the JAX handler is not built (python/build_jax.py)")
    def test_loads_checks_and_registers(self):
        h = mj.handler()
        self.assertEqual(h.moegen_jax_version().decode(), moegen.__version__)
        self.assertIs(mj.handler(), h)
        # registered for CUDA: a second registration of the same target is accepted by XLA as a no-op or
        # refused; either way the first one stood
        self.assertTrue(os.path.isfile(h.path))
        h.moegen_jax_unbind(123456)   # an unknown id is nothing
        a = mj.buffer_alignment()   # no call ran here: nothing seen
        self.assertEqual(set(a), {"workspace", "saved"})
        self.assertTrue(all(len(v) == 2 and v[1] <= v[0] for v in a.values()), a)

    def test_a_missing_handler_names_the_paths_and_build_jax(self):
        with self.assertRaisesRegex(moegen.LibraryError, r"libmoegen_jax.so not found \(tried /nonexistent/x.so\).*"
                                                         r"python/build_jax.py"):
            mj.load_handler("/nonexistent/x.so")

    def test_another_library_is_refused(self):
        with self.assertRaisesRegex(moegen.LibraryError, r"lacks MoegenMoe: it is not this package's JAX handler"):
            mj.load_handler(moegen.library().path)


if __name__ == "__main__":
    unittest.main()
