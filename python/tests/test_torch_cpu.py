"""moegen.torch without a GPU: the argument checks, the fake (shape-only)
implementations under tracing, the autograd wiring on meta tensors (a
training plan's forward and backward ops, the gradients' shapes and
dtypes; another plan's backward raising), and which ops are loaded (the C++
ones of libmoegen_torch.so, or the Python ones, with the same schemas).
Skipped when torch is not installed. run.py runs this file once more with
$MOEGEN_TORCH_LIBRARY=none when the C++ ops were loaded, so both kinds
are tested."""
import ctypes
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import torch
except ImportError:
    torch = None

E, H, F, S, CAP = 8, 64, 32, 8, 16


def expect(biases=False):
    """A plan's expectations as moegen.torch keeps them (_Entry.expect)."""
    bf, f32 = torch.bfloat16, torch.float32
    return {"x": (torch.Size([CAP, H]), bf), "y": (torch.Size([CAP, H]), bf), "router_w": (torch.Size([E, H]), bf),
            "router_bias": (torch.Size([E]), f32) if biases else None, "router_logit_bias": None,
            "w1p": (torch.Size([S, 2 * F, H]), bf), "b1p": (torch.Size([S, 2 * F]), bf) if biases else None,
            "w2": (torch.Size([S, H, F]), bf), "b2": (torch.Size([S, H]), bf) if biases else None,
            "shared_gate": None, "w1s": None, "w2s": None}


H8, F8 = 256, 128   # an fp8 plan's (multiples of 128)


def expect_fp8(block=True):
    """An fp8 plan's expectations (quant.weights = "fp8_e4m3"): e4m3 w1p and
    w2, float32 scales per 128 x 128 block or per row."""
    bf, f8, f32 = torch.bfloat16, torch.float8_e4m3fn, torch.float32
    return {"x": (torch.Size([CAP, H8]), bf), "y": (torch.Size([CAP, H8]), bf), "router_w": (torch.Size([E, H8]), bf),
            "router_bias": None, "router_logit_bias": None, "b1p": None, "b2": None, "shared_gate": None,
            "w1p": (torch.Size([E, 2 * F8, H8]), f8), "w2": (torch.Size([E, H8, F8]), f8),
            "w1s": (torch.Size([E, 2 * F8 // 128, H8 // 128] if block else [E, 2 * F8]), f32),
            "w2s": (torch.Size([E, H8 // 128, F8 // 128] if block else [E, H8]), f32)}


@unittest.skipIf(torch is None, "torch is not installed")
class Checks(unittest.TestCase):
    def setUp(self):
        from moegen import torch as mt
        self.mt = mt
        bf = torch.bfloat16
        # meta tensors stand in for CUDA ones: the checks read only metadata
        self.t = {"router_w": torch.empty(E, H, dtype=bf, device="meta"),
                  "w1p": torch.empty(S, 2 * F, H, dtype=bf, device="meta"),
                  "w2": torch.empty(S, H, F, dtype=bf, device="meta"), "router_bias": None,
                  "router_logit_bias": None, "b1p": None, "b2": None, "shared_gate": None, "w1s": None, "w2s": None}
        self.x = torch.empty(4, H, dtype=bf, device="meta")

    def check(self, x=None, exp=None, **changes):
        """check_args, and the per-call quick pass (_fits) agreeing with it."""
        from types import SimpleNamespace
        t = dict(self.t, **changes)
        x = self.x if x is None else x
        exp, dev = exp or expect(), torch.device("meta")
        order = self.mt.ORDER
        e = SimpleNamespace(dtype=exp["x"][1], device=dev, hidden=exp["x"][0][1], capacity=CAP,
                            want=tuple(exp[n] for n in order))
        try:
            fits = isinstance(x, torch.Tensor) and all(isinstance(t[n], (torch.Tensor, type(None))) for n in order) \
                and self.mt._fits(e, x, tuple(t[n] for n in order))
        except Exception:
            fits = False
        try:
            self.mt.check_args(exp, CAP, dev, x, t)
        except Exception:
            self.assertFalse(fits, "_fits accepts what check_args refuses")
            raise
        self.assertTrue(fits, "_fits refuses what check_args accepts")

    def test_fitting_tensors_pass(self):
        self.check()
        self.check(x=torch.empty(CAP, H, dtype=torch.bfloat16, device="meta"))
        self.check(x=torch.empty(0, H, dtype=torch.bfloat16, device="meta"))  # moe_forward takes 0 tokens

    def test_refusals(self):
        bf, meta = torch.bfloat16, "meta"
        cases = ((dict(x=torch.empty(4, H + 1, dtype=bf, device=meta)), ValueError, r"x must be \[tokens, 64\]"),
                 (dict(x=torch.empty(4, 2, H, dtype=bf, device=meta)), ValueError, r"x must be \[tokens, 64\]"),
                 (dict(x=torch.empty(CAP + 1, H, dtype=bf, device=meta)), ValueError,
                  r"17 tokens; the plan takes 0 to 16 \(spec key tokens\)"),
                 (dict(x=torch.empty(4, H, dtype=torch.float16, device=meta)), TypeError,
                  r"x must be torch.bfloat16, not torch.float16"),
                 (dict(x=[1.0]), TypeError, r"x must be a tensor"),
                 (dict(w2=torch.empty(S, F, H, dtype=bf, device=meta)), ValueError,
                  r"w2 must be \[8, 64, 32\], not \[8, 32, 64\]"),
                 (dict(w1p=torch.empty(S, 2 * F, H, dtype=torch.float32, device=meta)), TypeError,
                  r"w1p must be torch.bfloat16"),
                 (dict(b2=torch.empty(S, H, dtype=bf, device=meta)), ValueError, r"the spec takes no b2; pass None"),
                 (dict(router_w=3), TypeError, r"router_w must be a tensor, not int"),
                 (dict(exp=expect(biases=True)), ValueError, r"the spec needs router_bias float32 \[8\]"))
        for kw, exc, pattern in cases:
            with self.subTest(pattern=pattern), self.assertRaisesRegex(exc, pattern):
                self.check(**kw)

    def fp8(self, block=True, **changes):
        """The fp8 plan's tensors (meta), with changes."""
        f8, f32, meta = torch.float8_e4m3fn, torch.float32, "meta"
        t = dict(router_w=torch.empty(E, H8, dtype=torch.bfloat16, device=meta),
                 w1p=torch.empty(E, 2 * F8, H8, dtype=f8, device=meta), w2=torch.empty(E, H8, F8, dtype=f8, device=meta),
                 w1s=torch.empty(*((E, 2 * F8 // 128, H8 // 128) if block else (E, 2 * F8)), dtype=f32, device=meta),
                 w2s=torch.empty(*((E, H8 // 128, F8 // 128) if block else (E, H8)), dtype=f32, device=meta))
        t.update(changes)
        return dict(t, x=t.get("x", torch.empty(4, H8, dtype=torch.bfloat16, device=meta)), exp=expect_fp8(block))

    def test_fp8_tensors(self):
        f8, f32, meta = torch.float8_e4m3fn, torch.float32, "meta"
        for block in (True, False):
            self.check(**self.fp8(block))
        cases = ((dict(w1p=torch.empty(E, 2 * F8, H8, dtype=torch.bfloat16, device=meta)), TypeError,
                  r"w1p must be torch.float8_e4m3fn, not torch.bfloat16"),
                 (dict(w2=torch.empty(E, H8, F8, dtype=torch.float8_e5m2, device=meta)), TypeError,
                  r"w2 must be torch.float8_e4m3fn, not torch.float8_e5m2"),
                 (dict(w1s=None), ValueError, r"the spec needs w1s float32 \[8, 2, 2\]"),
                 (dict(w2s=torch.empty(E, H8, dtype=f32, device=meta)), ValueError,
                  r"w2s must be \[8, 2, 1\], not \[8, 256\]"),
                 (dict(w2s=torch.empty(E, 2, 1, dtype=torch.bfloat16, device=meta)), TypeError,
                  r"w2s must be torch.float32, not torch.bfloat16"),
                 (dict(w1s=torch.empty(E, 2, 2, dtype=f32)), ValueError, r"w1s is on cpu; the plan runs on meta"),
                 (dict(w1s=torch.empty(E, 2, 2, dtype=f32, device=meta).transpose(1, 2)), ValueError,
                  r"w1s must be contiguous"),
                 (dict(w1p=torch.empty(E, H8, 2 * F8, dtype=f8, device=meta).transpose(1, 2)), ValueError,
                  r"w1p must be contiguous"))
        for kw, exc, pattern in cases:
            with self.subTest(pattern=pattern), self.assertRaisesRegex(exc, pattern):
                self.check(**self.fp8(**kw))
        with self.assertRaisesRegex(ValueError, r"the spec takes no w1s; pass None"):
            self.check(w1s=torch.empty(S, 1, 1, device="meta"))

    def test_device_and_contiguity(self):
        with self.assertRaisesRegex(ValueError, r"w2 is on cpu; the plan runs on meta"):
            self.check(w2=torch.empty(S, H, F, dtype=torch.bfloat16))
        w2 = torch.empty(S, F, H, dtype=torch.bfloat16, device="meta").transpose(1, 2)
        with self.assertRaisesRegex(ValueError, "w2 must be contiguous"):
            self.check(w2=w2)

    def test_an_unregistered_plan(self):
        with self.assertRaisesRegex(ValueError, r"no plan with id 12345 is registered"):
            self.mt._entry(12345)

    def test_register_takes_a_plan(self):
        with self.assertRaisesRegex(TypeError, "register_plan takes a moegen.Plan"):
            self.mt.register_plan(object())

    def test_module_refuses_a_cpu_device(self):
        with self.assertRaisesRegex(ValueError, "runs on a CUDA device, not cpu"):
            self.mt.MoE({"name": "t"}, device="cpu")


@unittest.skipIf(torch is None, "torch is not installed")
class PackJobs(unittest.TestCase):
    """pack_jobs' sources read back through their strides (as the pack
    kernel reads them, moe_pack_src) give each slot's plain rows."""

    def read(self, base, src, count, rows, cols):
        ptr, e, r, c = src
        off = (ptr - base.data_ptr()) // base.element_size()
        return torch.as_strided(base.reshape(-1), (count, rows, cols), (e, r, c), off)

    def test_sources(self):
        from moegen import torch as mt
        E, F, H, m = 3, 16, 8, 2
        w1 = torch.randn(E, 2 * F, H)
        w1t = torch.randn(E, H, 2 * F)          # a transposed checkpoint layout, read as a view
        w2 = torch.randn(E, F, H)               # w2 stored [E, F, H], passed as the view [E, H, F]
        b1, b2 = torch.randn(E, 2 * F), torch.randn(E, H)
        sw1, sw2 = torch.randn(2 * m * F, H), torch.randn(H, m * F)
        for gate, up, base in ((w1[:, :F], w1[:, F:], w1),
                               (w1t.transpose(1, 2)[:, :F], w1t.transpose(1, 2)[:, F:], w1t)):
            jobs = mt.pack_jobs(E, F, m, gate, up, w2.transpose(1, 2), b1, b2, sw1, sw2)
            (t0, s0, f0, c0), (t1, s1, f1, c1), (t2, s2, f2, c2), (t3, s3, f3, c3), (t4, s4, _, _), (t5, s5, _, _) = jobs
            self.assertEqual([t0, t1, t2, t3, t4, t5], [0, 2, 0, 2, 1, 3])
            self.assertEqual([(f0, c0), (f1, c1), (f2, c2), (f3, c3)], [(0, E), (0, E), (E, m), (E, m)])
            self.assertTrue(torch.equal(self.read(base, s0[0], E, F, H), gate))
            self.assertTrue(torch.equal(self.read(base, s0[1], E, F, H), up))
            self.assertTrue(torch.equal(self.read(w2, s1[0], E, H, F), w2.transpose(1, 2)))
            for j in range(m):  # slot E+j: gate rows jF.., up rows mF + jF.., down columns jF..
                self.assertTrue(torch.equal(self.read(sw1, s2[0], m, F, H)[j], sw1[j * F:(j + 1) * F]))
                self.assertTrue(torch.equal(self.read(sw1, s2[1], m, F, H)[j], sw1[m * F + j * F:m * F + (j + 1) * F]))
                self.assertTrue(torch.equal(self.read(sw2, s3[0], m, H, F)[j], sw2[:, j * F:(j + 1) * F]))
            self.assertTrue(torch.equal(self.read(b1, s4[0], E, F, 1)[..., 0], b1[:, :F]))
            self.assertTrue(torch.equal(self.read(b1, s4[1], E, F, 1)[..., 0], b1[:, F:]))
            self.assertTrue(torch.equal(self.read(b2, s5[0], E, H, 1)[..., 0], b2))


@unittest.skipIf(torch is None, "torch is not installed")
class ScaleJobs(unittest.TestCase):
    """scale_jobs' sources read back through their strides (as the fp8
    scales kernel reads them: (e, row block, column block)) give each
    slot's scales, the shared expert's split as its weights."""

    def read(self, base, src, count, rows, cols):
        ptr, e, r, c = src
        off = (ptr - base.data_ptr()) // base.element_size()
        return torch.as_strided(base.reshape(-1), (count, rows, cols), (e, r, c), off)

    def test_sources(self):
        from moegen import torch as mt
        E, F, H, m = 3, 256, 384, 2
        for block in (True, False):
            B = 128 if block else 1
            shape = lambda n, k, *lead: lead + ((n // B, k // B) if block else (n,))
            w1s = torch.randn(*shape(2 * F, H, E))
            w2s = torch.randn(*shape(H, F, E))
            sw1s, sw2s = torch.randn(*shape(2 * m * F, H)), torch.randn(*shape(H, m * F)) if block else torch.randn(H)
            gate, up = w1s[:, :F // B], w1s[:, F // B:]
            jobs = mt.scale_jobs(E, F, m, block, gate, up, w2s, sw1s, sw2s)
            cols1, cols2 = (H // B, F // B) if block else (1, 1)
            as3 = lambda t: t if block else t.unsqueeze(-1)
            g, u = jobs[(0, 0)]
            self.assertTrue(torch.equal(self.read(w1s, g, E, F // B, cols1), as3(gate)))
            self.assertTrue(torch.equal(self.read(w1s, u, E, F // B, cols1), as3(up)))
            self.assertTrue(torch.equal(self.read(w2s, jobs[(2, 0)][0], E, H // B, cols2), as3(w2s)))
            g, u = jobs[(0, E)]
            d = jobs[(2, E)][0]
            for j in range(m):   # slot E+j: gate row blocks jF/B.., up mF/B + jF/B..; down column blocks jF/B..
                self.assertTrue(torch.equal(self.read(sw1s, g, m, F // B, cols1)[j],
                                            as3(sw1s[j * F // B:(j + 1) * F // B])))
                self.assertTrue(torch.equal(self.read(sw1s, u, m, F // B, cols1)[j],
                                            as3(sw1s[(m + j) * F // B:(m + j + 1) * F // B])))
                want = sw2s[:, j * F // B:(j + 1) * F // B] if block else sw2s.unsqueeze(-1)
                self.assertTrue(torch.equal(self.read(sw2s, d, m, H // B, cols2)[j], want))


@unittest.skipIf(torch is None, "torch is not installed")
class Fake(unittest.TestCase):
    def args(self, device, tokens=5):
        bf = torch.bfloat16
        return (torch.randn(tokens, H, device=device).to(bf), torch.randn(E, H, device=device).to(bf),
                torch.randn(S, 2 * F, H, device=device).to(bf), torch.randn(S, H, F, device=device).to(bf),
                None, None, None, None, None, 999)

    def test_traced_into_a_graph_with_its_shape(self):
        from moegen import torch as mt  # noqa: F401  (registers the op)
        from torch.fx.experimental.proxy_tensor import make_fx

        def layer(x, wr, w1p, w2):
            return torch.ops.moegen.moe(x * 2, wr, w1p, w2, None, None, None, None, None, 999) + 1

        a = self.args("cpu")
        g = make_fx(layer, tracing_mode="fake")(*a[:4])
        self.assertIn("moegen.moe", g.code)
        out = [n for n in g.graph.nodes if n.op == "call_function" and "moegen" in str(n.target)]
        self.assertEqual(len(out), 1)
        val = out[0].meta["val"]
        self.assertEqual((tuple(val.shape), val.dtype), ((5, H), torch.bfloat16))

    def test_meta_tensors(self):
        from moegen import torch as mt
        y = mt.moe(*self.args("meta", tokens=3))
        self.assertEqual((y.shape, y.dtype, y.device.type), (torch.Size([3, H]), torch.bfloat16, "meta"))

    def test_torch_compile_traces_without_a_graph_break(self):
        from moegen import torch as mt
        import torch._dynamo.testing as dt
        cnt = dt.CompileCounter()

        @torch.compile(backend=cnt, fullgraph=True)
        def layer(x, wr, w1p, w2):
            return mt.moe(x, wr, w1p, w2, None, None, None, None, None, 999).float().sum()

        a = self.args("meta")
        layer(*a[:4])
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(cnt.op_count, 3)

    def test_cpu_tensors_are_refused(self):
        from moegen import torch as mt
        with self.assertRaisesRegex(ValueError, "runs on CUDA tensors; x is on cpu"):
            mt.moe(*self.args("cpu"))

    def test_fp8_scales_traced(self):
        """The scales as the op's trailing arguments (keywords too), traced
        by torch.compile into one call whose fake output is y."""
        from moegen import torch as mt
        import torch._dynamo.testing as dt
        f8, meta = torch.float8_e4m3fn, "meta"
        a = (torch.empty(5, H8, dtype=torch.bfloat16, device=meta), torch.empty(E, H8, dtype=torch.bfloat16, device=meta),
             torch.empty(E, 2 * F8, H8, dtype=f8, device=meta), torch.empty(E, H8, F8, dtype=f8, device=meta),
             torch.empty(E, 2, 2, device=meta), torch.empty(E, 2, 1, device=meta))
        y = mt.moe(*a[:4], None, None, None, None, None, 999, a[4], a[5])
        self.assertEqual((y.shape, y.dtype), (torch.Size([5, H8]), torch.bfloat16))
        cnt = dt.CompileCounter()

        @torch.compile(backend=cnt, fullgraph=True)
        def layer(x, wr, w1p, w2, w1s, w2s):
            return mt.moe(x, wr, w1p, w2, None, None, None, None, None, 999, w1s=w1s, w2s=w2s).float().sum()

        layer(*a)
        self.assertEqual((cnt.frame_count, cnt.op_count), (1, 3))
        with self.assertRaisesRegex(ValueError, "runs on CUDA tensors; x is on cpu"):
            mt.moe(*(torch.empty(t.shape, dtype=t.dtype) for t in a[:4]),
                   None, None, None, None, None, 999, torch.empty(E, 2, 2), torch.empty(E, 2, 1))

    def test_a_backward_without_training_says_there_is_none(self):
        from moegen import torch as mt
        a = list(self.args("meta"))
        a[0].requires_grad_(True)
        y = mt.moe(*a)
        self.assertTrue(y.requires_grad)
        with self.assertRaisesRegex(NotImplementedError, r"this plan has no backward \(its spec lacks training"):
            y.float().sum().backward()


def stub_plan(pid, training, saved_per_token=96):
    """A registered id with no plan behind it, for the fake kernels and the
    autograd wiring: moegen.torch's entry (what the fakes read) and, with
    the C++ ops, their table's stub (moegen_torch_register_stub)."""
    from types import SimpleNamespace
    from moegen import torch as mt
    mt._plans[pid] = SimpleNamespace(hidden=H, dtype=torch.bfloat16, training=training,
                                     saved_size=lambda tokens: saved_per_token * tokens + 256)
    if mt.NATIVE is not None:
        mt.NATIVE.moegen_torch_register_stub.argtypes = [ctypes.c_int64, ctypes.c_int]
        mt.NATIVE.moegen_torch_register_stub(pid, int(training))


@unittest.skipIf(torch is None, "torch is not installed")
class Autograd(unittest.TestCase):
    """A training plan's autograd on meta tensors: moegen::moe under grad
    runs moe_train and its backward moe_backward (their fake kernels here),
    gradients come back for every parameter that requires grad in its own
    dtype and shape, router_bias gets none."""
    PID = 4242

    @classmethod
    def setUpClass(cls):
        stub_plan(cls.PID, True)

    @classmethod
    def tearDownClass(cls):
        from moegen import torch as mt
        mt.unregister_plan(cls.PID)

    def params(self, biases):
        bf, f32 = torch.bfloat16, torch.float32
        mk = lambda *s, dtype=bf, grad=True: torch.randn(*s, device="meta").to(dtype).requires_grad_(grad)
        t = dict(router_w=mk(E, H), w1p=mk(S, 2 * F, H), w2=mk(S, H, F), router_bias=None, router_logit_bias=None,
                 b1p=None, b2=None, shared_gate=None)
        if biases:
            t.update(router_bias=mk(E, dtype=f32, grad=False), router_logit_bias=mk(E, dtype=f32), b1p=mk(S, 2 * F),
                     b2=mk(S, H), shared_gate=mk(H))
        return t

    def call(self, x, t):
        return torch.ops.moegen.moe(x, t["router_w"], t["w1p"], t["w2"], t["router_bias"], t["router_logit_bias"],
                                    t["b1p"], t["b2"], t["shared_gate"], self.PID)

    def test_gradients_of_every_parameter(self):
        for biases in (False, True):
            with self.subTest(biases=biases):
                t = self.params(biases)
                x = torch.randn(5, H, device="meta").to(torch.bfloat16).requires_grad_()
                y = self.call(x, t)
                self.assertEqual((tuple(y.shape), y.dtype), ((5, H), torch.bfloat16))
                self.assertIsNotNone(y.grad_fn)
                y.float().sum().backward()
                self.assertEqual((tuple(x.grad.shape), x.grad.dtype), ((5, H), torch.bfloat16))
                for name, p in t.items():
                    if p is None:
                        continue
                    if name == "router_bias":
                        self.assertIsNone(p.grad, "router_bias gets no gradient")
                        continue
                    self.assertIsNotNone(p.grad, name)
                    self.assertEqual((p.grad.shape, p.grad.dtype), (p.shape, p.dtype), name)

    def test_traced_forward_and_backward(self):
        from torch.fx.experimental.proxy_tensor import make_fx
        t = self.params(False)

        def step(x, router_w, w1p, w2):
            y = torch.ops.moegen.moe(x, router_w, w1p, w2, None, None, None, None, None, self.PID)
            return torch.autograd.grad(y.float().pow(2).sum(), (x, router_w, w1p, w2))

        x = torch.randn(7, H).to(torch.bfloat16).requires_grad_()
        cpu = {k: torch.empty(v.shape, dtype=v.dtype).requires_grad_() for k, v in t.items() if v is not None}
        g = make_fx(step, tracing_mode="fake")(x, cpu["router_w"], cpu["w1p"], cpu["w2"])
        self.assertIn("moegen.moe_train", g.code)
        self.assertIn("moegen.moe_backward", g.code)
        outs = [n for n in g.graph.nodes if n.op == "call_function" and "moe_train" in str(n.target)]
        saved = outs[0].meta["val"][1]
        self.assertEqual((tuple(saved.shape), saved.dtype), ((96 * 7 + 256,), torch.uint8))

    def test_torch_compile_forward_and_backward(self):
        import torch._dynamo.testing as dt
        t = self.params(False)
        cnt = dt.CompileCounterWithBackend("aot_eager")

        @torch.compile(backend=cnt, fullgraph=True)
        def loss(x, router_w, w1p, w2):
            return torch.ops.moegen.moe(x, router_w, w1p, w2, None, None, None, None, None, self.PID).float().sum()

        x = torch.randn(6, H, device="meta").to(torch.bfloat16).requires_grad_()
        loss(x, t["router_w"], t["w1p"], t["w2"]).backward()
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual((tuple(t["w1p"].grad.shape), t["w1p"].grad.dtype), ((S, 2 * F, H), torch.bfloat16))
        self.assertEqual(tuple(x.grad.shape), (6, H))

    def test_the_module_compiled_whole(self):
        """MoE.forward (its parameters read from _parameters) under
        torch.compile(fullgraph=True), without and with a gradient."""
        from types import SimpleNamespace
        from moegen import torch as mt
        import torch._dynamo.testing as dt
        m = mt.MoE.__new__(mt.MoE)
        torch.nn.Module.__init__(m)
        m.plan, m.plan_id = SimpleNamespace(info=SimpleNamespace(hidden=H)), self.PID
        for n, p in self.params(False).items():
            m.register_parameter(n, None if p is None else torch.nn.Parameter(p.detach()))
        for grad in (False, True):
            torch._dynamo.reset()
            cnt = dt.CompileCounterWithBackend("aot_eager")
            f = torch.compile(m, backend=cnt, fullgraph=True)
            x = torch.randn(3, 4, H, device="meta").to(torch.bfloat16)
            if grad:
                f(x).float().sum().backward()
                self.assertEqual((m.w1p.grad.shape, m.w1p.grad.dtype), (m.w1p.shape, torch.bfloat16))
            else:
                with torch.no_grad():
                    self.assertEqual(tuple(f(x).shape), (3, 4, H))
            self.assertEqual(cnt.frame_count, 1)

    def test_no_grad_and_inference_stay_out_of_autograd(self):
        t = self.params(False)
        x = torch.randn(3, H, device="meta").to(torch.bfloat16).requires_grad_()
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                y = self.call(x, t)
            self.assertFalse(y.requires_grad)

    def test_training_fakes(self):
        from moegen import torch as mt
        t = self.params(True)
        x = torch.randn(4, H, device="meta").to(torch.bfloat16)
        with torch.no_grad():
            y, saved = torch.ops.moegen.moe_train(x, *[t[n] for n in ("router_w", "w1p", "w2") + mt._OPTIONAL],
                                                  self.PID)
            self.assertEqual((tuple(saved.shape), saved.dtype), ((96 * 4 + 256,), torch.uint8))
            g = torch.ops.moegen.moe_backward(y, saved, x, *[t[n] for n in ("router_w", "w1p", "w2") + mt._OPTIONAL],
                                              self.PID)
            self.assertEqual([(tuple(a.shape), a.dtype) for a in g],
                             [((4, H), torch.bfloat16), ((E, H), torch.float32), ((E,), torch.float32),
                              ((S, 2 * F, H), torch.float32), ((S, 2 * F), torch.float32), ((S, H, F), torch.float32),
                              ((S, H), torch.float32), ((H,), torch.float32)])
            t = self.params(False)
            g = torch.ops.moegen.moe_backward(y, saved, x, *[t[n] for n in ("router_w", "w1p", "w2") + mt._OPTIONAL],
                                              self.PID)
            self.assertEqual([tuple(g[i].shape) for i in (2, 4, 6, 7)], [(0,)] * 4)

    def test_cpu_tensors_are_refused(self):
        t = {k: (None if v is None else torch.empty(v.shape, dtype=v.dtype)) for k, v in self.params(True).items()}
        from moegen import torch as mt
        args = [t[n] for n in ("router_w", "w1p", "w2") + mt._OPTIONAL]
        x = torch.randn(4, H).to(torch.bfloat16)
        for call in (lambda: torch.ops.moegen.moe_train(x, *args, self.PID),
                     lambda: torch.ops.moegen.moe_backward(x, torch.empty(8, dtype=torch.uint8), x, *args, self.PID)):
            with self.assertRaisesRegex(ValueError, "runs on CUDA tensors; x is on cpu"):
                call()


@unittest.skipIf(torch is None, "torch is not installed")
class Given(unittest.TestCase):
    """moegen::moe_given (router.select = "given"): its schema, its fake under
    tracing, the checks of topk_ids / topk_weights, CPU tensors refused."""
    K = 2

    def entry(self, weights=False):
        from types import SimpleNamespace
        exp = dict(expect(), topk_ids=(torch.Size([CAP, self.K]), torch.int32),
                   topk_weights=(torch.Size([CAP, self.K]), torch.float32) if weights else None)
        return SimpleNamespace(expect=exp, device=torch.device("meta"))

    def test_schema(self):
        from moegen import torch as mt
        self.assertEqual(str(torch.ops.moegen.moe_given.default._schema), "moegen::" + mt._GIVEN_SCHEMA)

    def test_checks(self):
        from moegen import torch as mt
        x = torch.empty(4, H, dtype=torch.bfloat16, device="meta")
        ids = torch.empty(4, self.K, dtype=torch.int32, device="meta")
        w = torch.empty(4, self.K, dtype=torch.float32, device="meta")
        mt.check_given(self.entry(), x, ids, None)
        mt.check_given(self.entry(True), x, ids, w)
        for e, i, ww, err, msg in (
                (self.entry(), ids, w, ValueError, "pass topk_weights=None"),
                (self.entry(True), ids, None, ValueError, "topk_weights float32 \\[tokens, 2\\] is required"),
                (self.entry(), ids.long(), None, TypeError, "topk_ids must be torch.int32, not torch.int64"),
                (self.entry(), ids[:3], None, ValueError, "topk_ids must be \\[tokens, 2\\] = \\[4, 2\\], not \\[3, 2\\]"),
                (self.entry(True), ids, w.half(), TypeError, "topk_weights must be torch.float32"),
                (self.entry(), torch.empty(2, 4, dtype=torch.int32, device="meta").t(), None, ValueError,
                 "topk_ids must be contiguous"),
                (self.entry(), torch.empty(4, self.K, dtype=torch.int32), None, ValueError, "topk_ids is on cpu")):
            with self.assertRaisesRegex(err, msg):
                mt.check_given(e, x, i, ww)
        from types import SimpleNamespace
        with self.assertRaisesRegex(ValueError, "picks its own experts"):
            mt.check_given(SimpleNamespace(expect=expect(), device=torch.device("meta")), x, ids, None)

    def test_fake_traced(self):
        from moegen import torch as mt
        import torch._dynamo.testing as dt
        bf, meta = torch.bfloat16, "meta"
        a = (torch.empty(5, H, dtype=bf, device=meta), None, torch.empty(S, 2 * F, H, dtype=bf, device=meta),
             torch.empty(S, H, F, dtype=bf, device=meta))
        ids = torch.empty(5, self.K, dtype=torch.int32, device=meta)
        w = torch.empty(5, self.K, dtype=torch.float32, device=meta)
        y = mt.moe_given(*a, None, None, None, None, None, 999, ids, w)
        self.assertEqual((y.shape, y.dtype), (torch.Size([5, H]), bf))
        cnt = dt.CompileCounter()

        @torch.compile(backend=cnt, fullgraph=True)
        def layer(x, w1p, w2, ids, w):
            return mt.moe_given(x, None, w1p, w2, None, None, None, None, None, 999, ids, topk_weights=w).float().sum()

        layer(a[0], a[2], a[3], ids, w)
        self.assertEqual(cnt.frame_count, 1)

    def test_cpu_tensors_are_refused(self):
        from moegen import torch as mt
        bf = torch.bfloat16
        with self.assertRaisesRegex(ValueError, "runs on CUDA tensors; x is on cpu"):
            mt.moe_given(torch.randn(3, H).to(bf), None, torch.randn(S, 2 * F, H).to(bf), torch.randn(S, H, F).to(bf),
                         None, None, None, None, None, 999, torch.zeros(3, self.K, dtype=torch.int32))


@unittest.skipIf(torch is None, "torch is not installed")
class Ext(unittest.TestCase):
    """moegen::moe_ext (router.input = "separate", router.expert_scale: Gemma
    4's router): its schema, its fake under tracing, the checks of router_x
    and router_expert_scale, CPU tensors refused."""

    def entry(self, own=True, scale=True):
        from types import SimpleNamespace
        exp = dict(expect(), router_x=(torch.Size([CAP, H]), torch.bfloat16) if own else None,
                   router_expert_scale=(torch.Size([E]), torch.float32) if scale else None)
        return SimpleNamespace(expect=exp, device=torch.device("meta"))

    def test_schema(self):
        from moegen import torch as mt
        self.assertEqual(str(torch.ops.moegen.moe_ext.default._schema), "moegen::" + mt._EXT_SCHEMA)

    def test_checks(self):
        from moegen import torch as mt
        meta = "meta"
        x = torch.empty(4, H, dtype=torch.bfloat16, device=meta)
        rx = torch.empty(4, H, dtype=torch.bfloat16, device=meta)
        es = torch.empty(E, dtype=torch.float32, device=meta)
        mt.check_ext(self.entry(), x, rx, es)
        mt.check_ext(self.entry(own=False), x, None, es)
        mt.check_ext(self.entry(scale=False), x, rx, None)
        for e, r, sc, err, msg in (
                (self.entry(), None, es, ValueError, "router.input = \"separate\": router_x \\[tokens, %d\\] is "
                 "required" % H),
                (self.entry(), rx, None, ValueError, "router.expert_scale: router_expert_scale \\[%d\\] is required"
                 % E),
                (self.entry(own=False), rx, es, ValueError, "takes no router_x"),
                (self.entry(scale=False), rx, es, ValueError, "takes no router_expert_scale"),
                (self.entry(), rx.half(), es, TypeError, "router_x must be torch.bfloat16"),
                (self.entry(), rx[:3], es, ValueError, "router_x must be \\[4, %d\\], not \\[3, %d\\]" % (H, H)),
                (self.entry(), rx, es.double(), TypeError, "router_expert_scale must be torch.float32"),
                (self.entry(), rx, es[:-1], ValueError, "router_expert_scale must be \\[%d\\]" % E),
                (self.entry(), torch.empty(H, 4, dtype=torch.bfloat16, device=meta).t(), es, ValueError,
                 "router_x must be contiguous"),
                (self.entry(), torch.empty(4, H, dtype=torch.bfloat16), es, ValueError, "router_x is on cpu")):
            with self.assertRaisesRegex(err, msg):
                mt.check_ext(e, x, r, sc)

    def test_router_width(self):
        # router.hidden (a latent MoE): router_x is x's rows at the router's width, the plan's [tokens, HR]
        from moegen import torch as mt
        from types import SimpleNamespace
        meta, HR = "meta", 3 * H
        e = SimpleNamespace(expect=dict(expect(), router_x=(torch.Size([CAP, HR]), torch.bfloat16),
                                        router_expert_scale=None), device=torch.device(meta))
        x = torch.empty(4, H, dtype=torch.bfloat16, device=meta)
        mt.check_ext(e, x, torch.empty(4, HR, dtype=torch.bfloat16, device=meta), None)
        with self.assertRaisesRegex(ValueError, "router_x must be \\[4, %d\\], not \\[4, %d\\]" % (HR, H)):
            mt.check_ext(e, x, torch.empty(4, H, dtype=torch.bfloat16, device=meta), None)
        with self.assertRaisesRegex(ValueError, "router_x \\[tokens, %d\\] is required" % HR):
            mt.check_ext(e, x, None, None)

    def test_fake_traced(self):
        from moegen import torch as mt
        import torch._dynamo.testing as dt
        bf, meta = torch.bfloat16, "meta"
        x, rx = (torch.empty(5, H, dtype=bf, device=meta) for _ in range(2))
        wr = torch.empty(E, H, dtype=bf, device=meta)
        w1p, w2 = torch.empty(S, 2 * F, H, dtype=bf, device=meta), torch.empty(S, H, F, dtype=bf, device=meta)
        es = torch.empty(E, dtype=torch.float32, device=meta)
        y = mt.moe_ext(x, wr, w1p, w2, None, None, None, None, None, 999, None, None, rx, es)
        self.assertEqual((y.shape, y.dtype), (torch.Size([5, H]), bf))
        cnt = dt.CompileCounter()

        @torch.compile(backend=cnt, fullgraph=True)
        def layer(x, rx, wr, w1p, w2, es):
            return mt.moe_ext(x, wr, w1p, w2, None, None, None, None, None, 999, router_x=rx,
                              router_expert_scale=es).float().sum()

        layer(x, rx, wr, w1p, w2, es)
        self.assertEqual(cnt.frame_count, 1)

    def test_cpu_tensors_are_refused(self):
        from moegen import torch as mt
        bf = torch.bfloat16
        with self.assertRaisesRegex(ValueError, "runs on CUDA tensors; x is on cpu"):
            mt.moe_ext(torch.randn(3, H).to(bf), torch.randn(E, H).to(bf), torch.randn(S, 2 * F, H).to(bf),
                       torch.randn(S, H, F).to(bf), None, None, None, None, None, 999,
                       router_x=torch.randn(3, H).to(bf), router_expert_scale=torch.ones(E))


@unittest.skipIf(torch is None, "torch is not installed")
class Ops(unittest.TestCase):
    """Which ops are loaded, and that they are the ones moegen.torch means."""

    def test_schemas(self):
        from moegen import torch as mt
        for name, schema in mt.SCHEMAS.items():
            self.assertEqual(str(getattr(torch.ops.moegen, name).default._schema), "moegen::" + schema)

    def test_the_native_library(self):
        from moegen import torch as mt
        env = os.environ.get("MOEGEN_TORCH_LIBRARY")
        if env == "none":
            self.assertIsNone(mt.NATIVE)
            self.assertFalse(hasattr(torch.ops.moegen, "_bench_forward"))
            return
        if mt.NATIVE is None:
            self.assertIsNone(mt.native_path(), "a C++ ops library was found and not loaded")
            self.skipTest("no libmoegen_torch.so (python/build_torch.py builds it)")
        import moegen
        mt.NATIVE.moegen_torch_version.restype = ctypes.c_char_p
        self.assertEqual(mt.NATIVE.moegen_torch_version().decode(), moegen.__version__)
        lib = moegen.library()
        self.assertEqual(mt.NATIVE.moegen_torch_moe_forward(), ctypes.cast(lib.moe_forward, ctypes.c_void_p).value,
                         "the C++ ops link the libmoegen moegen loaded")
        self.assertTrue(hasattr(torch.ops.moegen, "_bench_forward"))


@unittest.skipIf(torch is None, "torch is not installed")
class ModuleForward(unittest.TestCase):
    """MoE.forward's shapes, on a module built without __init__ (which needs
    CUDA) and with the op replaced by a recorder: x [tokens, H] goes in as
    it is, other shapes as [-1, H], and y comes back in x's shape."""

    def test_shapes(self):
        from types import SimpleNamespace
        from moegen import torch as mt
        calls = []
        m = mt.MoE.__new__(mt.MoE)
        torch.nn.Module.__init__(m)
        m.plan, m.plan_id = SimpleNamespace(info=SimpleNamespace(hidden=8)), 1
        for n in ("router_w", "router_bias", "router_logit_bias", "w1p", "b1p", "w2", "b2", "shared_gate", "w1s",
                  "w2s"):
            m.register_parameter(n, None)
        saved = mt.moe
        mt.moe = lambda x, *a: calls.append(x) or torch.full_like(x, 2.0)
        try:
            for shape, flat in (((5, 8), (5, 8)), ((3, 4, 8), (12, 8)), ((8,), (1, 8)), ((2, 0, 8), (0, 8))):
                del calls[:]
                x = torch.ones(shape)
                y = m(x)
                self.assertEqual((tuple(calls[0].shape), tuple(y.shape)), (flat, shape))
                self.assertTrue(bool((y == 2).all()))
            x = torch.ones(5, 8)
            m(x)
            self.assertIs(calls[-1], x)   # no reshape for x [tokens, H]
            with self.assertRaisesRegex(ValueError, r"x must be \[\.\.\., 8\], not \[3, 7\]"):
                m(torch.ones(3, 7))
        finally:
            mt.moe = saved


@unittest.skipIf(torch is None, "torch is not installed")
class AutogradKernel(unittest.TestCase):
    """autograd_kernel on an op of the same form with CPU as its backend:
    the plain call reaches the kernel it was given directly (one trip into
    Python), every other call the kernel registered below autograd."""
    calls = []

    @classmethod
    def setUpClass(cls):
        from moegen import torch as mt
        cls.lib = torch.library.Library("moegen_autograd_test", "DEF")
        cls.lib.define("f(Tensor x, Tensor? b, int n) -> Tensor")
        op = torch.ops.moegen_autograd_test.f.default
        cls.lib.impl("f", lambda x, b, n: cls.calls.append("below") or x * n, "CPU")
        cls.lib.impl("f", mt.autograd_kernel(op, torch._C.DispatchKey.CPU,
                                             lambda x, b, n: cls.calls.append("direct") or x * n,
                                             lambda below, *args: mt._NoBackward.apply(below, *args)),
                     "Autograd", with_keyset=True)
        torch.library.register_fake("moegen_autograd_test::f", lambda x, b, n: torch.empty_like(x), lib=cls.lib)
        cls.f = torch.ops.moegen_autograd_test.f

    def call(self, x, b=None):
        del self.calls[:]
        y = self.f(x, b, 3)
        return y, list(self.calls)

    def test_the_plain_call_goes_direct(self):
        x = torch.arange(4.0)
        for _ in range(2):   # the second from the remembered keyset
            y, calls = self.call(x)
            self.assertEqual((calls, y.tolist()), (["direct"], [0.0, 3.0, 6.0, 9.0]))
        with torch.no_grad():
            self.assertEqual(self.call(x.requires_grad_())[1], ["direct"])

    def test_inference_mode_skips_autograd(self):
        with torch.inference_mode():
            self.assertEqual(self.call(torch.arange(4.0))[1], ["below"])

    def test_a_wanted_gradient_redispatches_and_backward_raises(self):
        x = torch.arange(4.0, requires_grad=True)
        y, calls = self.call(x)
        self.assertEqual(calls, ["below"])
        self.assertTrue(y.requires_grad)
        with self.assertRaisesRegex(NotImplementedError, "this plan has no backward"):
            y.sum().backward()

    def test_fake_and_traced_calls_reach_the_fake_kernel(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        with FakeTensorMode() as mode:
            x = mode.from_tensor(torch.arange(4.0))
            y, calls = self.call(x)
        self.assertEqual((calls, tuple(y.shape)), ([], (4,)))
        g = make_fx(lambda x: self.f(x, None, 2) + 1, tracing_mode="fake")(torch.arange(4.0))
        self.assertIn("moegen_autograd_test.f", g.code)
        self.assertEqual(self.call(torch.ones(2, device="meta"))[1], [])   # meta: its own key, the fake kernel


if __name__ == "__main__":
    unittest.main()
