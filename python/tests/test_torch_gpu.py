#!/usr/bin/env python3
"""moegen.torch on a GPU: the op and the module against an eager PyTorch
reference, under torch.compile and under CUDA-graph capture; a training
plan's gradients (autograd through moe_forward_train and moe_backward)
against torch autograd of the eager reference in fp32; and the per-call
host overhead of the op against a C loop of moe_forward, the C++ op called
from C++, and moe_forward through ctypes.

usage (from the repository root, after `make`):
    python3 python/tests/test_torch_gpu.py [--iters N] [--python-ops]
The package is taken from python/ and libmoegen from $MOEGEN_LIBRARY, else
build/libmoegen.so; no install is needed. The C++ ops are built first
(python/build_torch.py, into a temporary folder) unless
$MOEGEN_TORCH_LIBRARY names them; --python-ops tests the Python ops
instead ($MOEGEN_TORCH_LIBRARY=none). Prints one line per check and
"test_torch_gpu: N passed, N failed"; exit status 1 when any failed.

Specs (small, real routing): mixtral-shaped (8 experts, top-2, softmax,
renormalize), qwen3-shaped (128 experts, top-8, softmax, renormalize) and
one with every optional tensor (sigmoid scores, router.bias,
router.logit_bias, ffn_bias). Inputs are random (never zeros); y is poisoned
(NaN in the block the allocator hands back) before each eager call; the
tolerance is tests/test_gpu.c's: normalized L2 error <= 1.5e-2 (bf16).

Training specs (training = true): mixtral-shaped, one with sigmoid scores,
both router biases and ffn_bias, and one with a sigmoid-gated shared
expert. The loss is sum(y * dy) for a random dy; every gradient (x,
router_w, router_logit_bias, W1 and b1 unpacked with moe_plan_unpack_grad,
W2, b2, the shared expert's slots joined, shared_gate) is compared by
normalized L2 error with torch autograd of the eager layer computed in
fp32 from the same bf16 values (routing chosen in float64, as the forward
reference): TOL_GRAD = 2.5e-2, the C test's 1.5e-2 against the rounded CPU
reference plus the bf16 rounding points the fp32 reference does not have
(bench/check_backward.py measured those at up to 5e-3) and the gradients'
rounding to the parameters' bf16. Then 20 Adam steps (fp32 master
weights, lr 5e-4) of the module and of the eager fp32 layer from the same
weights on the same data: both losses fall below 0.8 of the first, and
the curves agree within TOL_CURVE = 5e-2 relative at every step (on the
CPU, the eager layer with bf16 parameters and output tracks the fp32 one
within 8e-3 over these steps).

fp8 specs (quant.weights = "fp8_e4m3", sm_90a): 128 x 128 block scales,
per-channel scales with every optional tensor, and block scales with a
sigmoid-gated shared expert. MoE.load_plain quantizes bf16 weights on the
GPU (moe_plan_pack_quantize_async): its e4m3 bytes and scales must equal
this file's quantizer of the library's rule (amax per block or row, at
least 1e-4; scale amax / 448; e4m3 of w * (448 / amax), round to nearest
even) exactly, rows in the packed order; MoE.load_fp8 from those e4m3
weights and scales as a checkpoint ships them (DeepSeek-V3's
weight_scale_inv; also as separate gate/up and column-major views) must
pack the same bytes. The layer is checked against the quantized math in
eager PyTorch (routing as above; x quantized per 128 columns, the
dequantized fp32 GEMMs, the activation's output quantized per 128 columns,
each expert's output rounded to bf16) with TOL_FP8 = 1.5e-2 (normalized
L2, tests/test_quant_gpu.c's LAYER_TOL), and its error against the bf16
layer on the unquantized weights printed and held inside FP8_VS_BF16 =
(0.005, 0.09) (the format's own ~6%; docs/DESIGN.md, "FP8"); eager, under
torch.compile and CUDA-graph replay, y poisoned before each eager call;
calls without the scales, or with bf16 weights, are refused."""
import argparse
import faulthandler
import ctypes
import os
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))


def _ops_library():
    """Before moegen.torch is imported: build the C++ ops into a temporary
    folder unless $MOEGEN_TORCH_LIBRARY names a library (or "none")."""
    if "--python-ops" in sys.argv:
        os.environ["MOEGEN_TORCH_LIBRARY"] = "none"
    if os.environ.get("MOEGEN_TORCH_LIBRARY"):
        return
    import build_torch
    out = os.path.join(tempfile.mkdtemp(prefix="moegen_torch_"), "libmoegen_torch.so")
    try:
        build_torch.build(ROOT, out=out)
    except build_torch.BuildError as e:
        print("FAIL the C++ ops did not build: %s" % e)
        sys.exit(1)
    # $ORIGIN finds no libmoegen.so.0 there; moegen._lib loads libmoegen first and the SONAME matches
    os.environ["MOEGEN_TORCH_LIBRARY"] = out


_ops_library()

import torch  # noqa: E402

import moegen  # noqa: E402
from moegen import _lib  # noqa: E402
import moegen.torch  # noqa: E402
from moegen.torch import MoE  # noqa: E402

TOL = 1.5e-2
SPECS = {
    "mixtral_small": dict(name="mixtral_small", experts=8, top_k=2, hidden=1024, ffn=1024, tokens=512,
                          router=dict(score="softmax", renormalize=True)),
    "qwen3_small": dict(name="qwen3_small", experts=128, top_k=8, hidden=1024, ffn=768, tokens=256,
                        router=dict(score="softmax", renormalize=True)),
    "biased_small": dict(name="biased_small", experts=16, top_k=4, hidden=512, ffn=512, tokens=128,
                         router=dict(score="sigmoid", renormalize=True, bias=True, logit_bias=True), ffn_bias=True),
    # Qwen2-MoE-shaped: a shared expert of 2·ffn behind sigmoid(x·w_gate)
    "shared_small": dict(name="shared_small", experts=16, top_k=4, hidden=512, ffn=256, tokens=128,
                         router=dict(score="softmax", renormalize=False), shared=dict(ffn=512, gate="sigmoid")),
    # ERNIE 4.5-shaped: fp32 router weights (router.weight_dtype = "fp32"), a selection bias
    "fp32_router_small": dict(name="fp32_router_small", experts=64, top_k=6, hidden=512, ffn=256, tokens=128,
                              router=dict(score="softmax", renormalize=True, bias=True, weight_dtype="fp32")),
}

TRAIN_SPECS = {
    "train_mixtral": dict(name="train_mixtral", experts=8, top_k=2, hidden=512, ffn=256, tokens=256,
                          router=dict(score="softmax", renormalize=True), training=True),
    "train_biased": dict(name="train_biased", experts=16, top_k=4, hidden=256, ffn=128, tokens=128,
                         router=dict(score="sigmoid", renormalize=True, bias=True, logit_bias=True), ffn_bias=True,
                         training=True),
    "train_shared": dict(name="train_shared", experts=8, top_k=2, hidden=256, ffn=128, tokens=128,
                         router=dict(score="softmax", renormalize=False), shared=dict(ffn=256, gate="sigmoid"),
                         training=True),
    # the weight gradients in the parameters' dtype (weight_grads = "dtype": no fp32 buffers, no cast)
    "train_hgrad": dict(name="train_hgrad", experts=8, top_k=2, hidden=512, ffn=256, tokens=256,
                        router=dict(score="softmax", renormalize=True), ffn_bias=True, training=True,
                        weight_grads="dtype"),
}
TOL_GRAD = 2.5e-2

_FP8 = dict(quant=dict(weights="fp8_e4m3", scaling="block"), arch=["sm_90a"])
FP8_SPECS = {
    "fp8_block": dict(name="fp8_block", experts=16, top_k=4, hidden=512, ffn=256, tokens=256,
                      router=dict(score="softmax", renormalize=True), **_FP8),
    "fp8_channel": dict(name="fp8_channel", experts=8, top_k=2, hidden=384, ffn=512, tokens=128,
                        router=dict(score="sigmoid", renormalize=True, bias=True, logit_bias=True), ffn_bias=True,
                        **dict(_FP8, quant=dict(weights="fp8_e4m3", scaling="channel"))),
    "fp8_shared": dict(name="fp8_shared", experts=8, top_k=2, hidden=256, ffn=128, tokens=128,
                       router=dict(score="softmax", renormalize=False), shared=dict(ffn=256, gate="sigmoid"), **_FP8),
}
TOL_FP8 = 1.5e-2
FP8_VS_BF16 = (0.005, 0.09)

passed = failed = 0


def report(ok, what):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)


def rand(*shape, scale=1.0, dtype=torch.bfloat16):
    return ((torch.rand(*shape, device="cuda") * 2 - 1) * scale).to(dtype)


def weights(keys):
    E, H, F = keys["experts"], keys["hidden"], keys["ffn"]
    r = keys.get("router", {})
    w32 = r.get("weight_dtype") == "fp32"   # fp32 router weights: values a bf16 cannot hold
    w = dict(router_w=rand(E, H, scale=4 / H ** 0.5, dtype=torch.float32 if w32 else torch.bfloat16),
             w1=rand(E, 2 * F, H, scale=2 / H ** 0.5),
             w2=rand(E, H, F, scale=2 / F ** 0.5))
    if keys.get("ffn_bias"):
        w.update(b1=rand(E, 2 * F, scale=0.1), b2=rand(E, H, scale=0.1))
    if r.get("bias"):
        w["router_bias"] = rand(E, scale=0.5, dtype=torch.float32)
    if r.get("logit_bias"):
        w["router_logit_bias"] = rand(E, scale=0.5, dtype=torch.float32)
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        w.update(shared_w1=rand(2 * Fs, H, scale=2 / H ** 0.5), shared_w2=rand(H, Fs, scale=2 / Fs ** 0.5))
        if sh.get("gate") == "sigmoid":
            w["shared_gate"] = rand(H, scale=4 / H ** 0.5)
    return w


def reference(keys, w, x, ids=None, gw=None, rx=None):
    """The layer in eager PyTorch from the plain weights: routing in float64
    (selection scores rounded to fp32), FFN in fp32 with the intermediate and
    each expert's output rounded to bf16 where the kernels store them; a
    shared expert as its m slots of ffn columns, each rounded likewise,
    weighted by 1 or sigmoid(x·w_gate). Given routing: ids [T, K] are the
    experts (those outside 0..E-1 dropped: expert 0, weight 0), weighted by
    the score at them or by gw [T, K] (router.score = "given"). rx: the
    router's own input (router.input = "separate"), the logits' rows in
    place of x; w["router_expert_scale"] multiplies the final weights."""
    r = keys.get("router", {})
    K, F = keys["top_k"], keys["ffn"]
    if gw is None:
        logits = (x if rx is None else rx).double() @ w["router_w"].double().t()
        if "router_logit_bias" in w:
            logits = logits + w["router_logit_bias"].double()
        score = logits.sigmoid() if r.get("score") == "sigmoid" else logits.softmax(-1)
    if ids is not None:
        drop = (ids < 0) | (ids >= keys["experts"])
        idx = torch.where(drop, 0, ids).long()
        wt = (gw.double() if gw is not None else score.gather(1, idx)).masked_fill(drop, 0.0)
    else:
        sel = score.float()
        if "router_bias" in w:
            sel = sel + w["router_bias"]
        idx = sel.topk(K, dim=-1).indices
        wt = score.gather(1, idx)
    if r.get("renormalize"):   # a token whose every id was dropped keeps its zeros
        total = wt.sum(-1, keepdim=True)
        wt = torch.where(total > 0, wt / total, wt)
    if "router_expert_scale" in w:
        wt = wt * w["router_expert_scale"].double()[idx]
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in idx.unique().tolist():
        tok, slot = (idx == e).nonzero(as_tuple=True)
        h = xf[tok] @ w["w1"][e].float().t()
        if "b1" in w:
            h = h + w["b1"][e].float()
        a = (torch.nn.functional.silu(h[:, :F]) * h[:, F:]).to(torch.bfloat16).float()
        o = a @ w["w2"][e].float().t()
        if "b2" in w:
            o = o + w["b2"][e].float()
        y.index_add_(0, tok, o.to(torch.bfloat16).float() * wt[tok, slot, None].float())
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        g = (x.double() @ w["shared_gate"].double()).sigmoid().float()[:, None] if "shared_gate" in w else 1.0
        for j in range(Fs // F):
            cols = torch.arange(j * F, (j + 1) * F, device=x.device)
            h = xf @ torch.cat([w["shared_w1"][cols], w["shared_w1"][Fs + cols]]).float().t()
            a = (torch.nn.functional.silu(h[:, :F]) * h[:, F:]).to(torch.bfloat16).float()
            o = a @ w["shared_w2"][:, cols].float().t()
            y += o.to(torch.bfloat16).float() * g
    return y.to(torch.bfloat16)


def nerr(y, ref):
    y, ref = y.float(), ref.float()
    if not torch.isfinite(y).all():
        return float("inf")
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poison(like):
    """Leave NaN in the block the caching allocator hands out next for a
    tensor like `like` (y's block)."""
    torch.empty_like(like).fill_(float("nan"))


def check_spec(name, keys):
    moe = MoE(keys, device="cuda")
    w = weights(keys)
    moe.load_plain(**w)
    plan = moe.plan
    T_max, H = plan.info.tokens, plan.info.hidden
    # the W1 packed on the GPU against the library's own host pack, every expert
    host = w["w1"].view(torch.int16).cpu().contiguous()
    packed = torch.empty_like(host)
    pack = plan._lib.moe_plan_pack_w1
    pack.argtypes, pack.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    rc = pack(plan.handle, host.data_ptr(), packed.data_ptr())
    report(rc == 0 and torch.equal(packed.cuda(), moe.w1p.detach()[:keys["experts"]].view(torch.int16)),
           "%s: w1p packed on the GPU equals moe_plan_pack_w1's host pack" % name)
    # other strides (column-major copies, read through transposed views) and the indexing fallback give the
    # same packed bytes as the device pack of the plain tensors
    F = keys["ffn"]
    packed = [moe.w1p.detach().clone(), moe.w2.detach().clone()]
    cm = lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)
    wv = dict(w, w1=None, gate=cm(w["w1"][:, :F]), up=cm(w["w1"][:, F:]), w2=cm(w["w2"]))
    if "shared_w1" in w:
        wv.update(shared_w1=cm(w["shared_w1"]), shared_w2=cm(w["shared_w2"]))
    for t in (moe.w1p, moe.w2):
        t.detach().view(torch.int16).fill_(-1)
    moe.load_plain(**wv)
    report(torch.equal(moe.w1p, packed[0]) and torch.equal(moe.w2, packed[1]),
           "%s: load_plain from separate gate/up and column-major views packs the same bytes" % name)
    for t in (moe.w1p, moe.w2):
        t.detach().view(torch.int16).fill_(-1)
    with torch.no_grad():
        moe._pack_by_indexing(w["w1"][:, :F], w["w1"][:, F:], w["w2"], w.get("b1"), w.get("b2"),
                              w.get("shared_w1"), w.get("shared_w2"))
    report(torch.equal(moe.w1p, packed[0]) and torch.equal(moe.w2, packed[1]),
           "%s: the indexing fallback packs the same bytes as moe_plan_pack_async" % name)
    if "shared" in keys:  # the shared expert's slots against the library's own split, moe_plan_pack_shared
        E = keys["experts"]
        S = moe.w1p.shape[0]
        h1 = torch.zeros(S, *moe.w1p.shape[1:], dtype=torch.int16)
        h2 = torch.zeros(S, *moe.w2.shape[1:], dtype=torch.int16)
        sw1, sw2 = (w[k].view(torch.int16).cpu().contiguous() for k in ("shared_w1", "shared_w2"))
        fn = plan._lib.moe_plan_pack_shared
        fn.argtypes, fn.restype = [ctypes.c_void_p] * 5, ctypes.c_int
        rc = fn(plan.handle, sw1.data_ptr(), sw2.data_ptr(), h1.data_ptr(), h2.data_ptr())
        report(rc == 0 and torch.equal(h1[E:].cuda(), moe.w1p.detach()[E:].view(torch.int16))
               and torch.equal(h2[E:].cuda(), moe.w2.detach()[E:].view(torch.int16)),
               "%s: the shared expert's %d slots equal moe_plan_pack_shared's" % (name, S - E))
    x_all = rand(T_max, H)
    with torch.no_grad():
        y0 = moe(x_all[:0])
        report(y0.shape == (0, H), "%s: 0 tokens: y [0, H], nothing enqueued" % name)
        for T in sorted({1, 7, T_max // 2 + 3, T_max}):
            x = x_all[:T]
            ref = reference(keys, w, x)
            poison(x)
            y = moe(x)
            torch.cuda.synchronize()
            err = nerr(y, ref)
            report(err <= TOL, "%s: eager, %d tokens: error %.2e (tolerance %.1e)" % (name, T, err, TOL))
        # leading dimensions
        x3 = x_all[:12].reshape(3, 4, H)
        err = nerr(moe(x3).reshape(12, H), reference(keys, w, x_all[:12]))
        report(err <= TOL, "%s: x [3, 4, H]: error %.2e" % (name, err))

        # torch.compile: the op inside a compiled block, no graph break
        def block(x):
            n = x.float().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().mul(x.float()).to(x.dtype)
            return x + moe(n)

        x = x_all[:33]
        n = x.float().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().mul(x.float()).to(x.dtype)
        ref = (x.float() + reference(keys, w, n).float()).to(torch.bfloat16)
        for backend in ("aot_eager", "inductor"):  # aot_eager: the fake implementation without inductor
            try:
                torch._dynamo.reset()
                yc = torch.compile(block, backend=backend, fullgraph=True)(x)
                err = nerr(yc, ref)
                report(err <= TOL, "%s: torch.compile(backend=%r, fullgraph=True): error %.2e" % (name, backend, err))
            except Exception as e:
                traceback.print_exc()
                report(False, "%s: torch.compile(backend=%r): %s" % (name, backend, str(e).splitlines()[0]))
        try:
            torch._dynamo.reset()
            f = torch.compile(block, mode="reduce-overhead", fullgraph=True)
            for _ in range(3):
                yc = f(x)
            err = nerr(yc, ref)
            report(err <= TOL, "%s: torch.compile(mode='reduce-overhead') (CUDA graphs): error %.2e" % (name, err))
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: torch.compile(mode='reduce-overhead'): %s" % (name, str(e).splitlines()[0]))

        # CUDA graph capture of the op; replayed on new inputs written into the captured x
        T = min(64, T_max)
        xs = x_all[:T].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            moe(xs)  # warm the allocator outside capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = moe(xs)
        for i in range(2):
            xn = rand(T, H)
            xs.copy_(xn)
            yg.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            err = nerr(yg, reference(keys, w, xn))
            report(err <= TOL, "%s: CUDA graph replay %d, %d tokens: error %.2e" % (name, i, T, err))

        # bad calls: clear exceptions, no crash
        for what, call, exc in (
                ("too many tokens", lambda: moe(rand(T_max + 1, H)), ValueError),
                ("wrong dtype", lambda: moe(x_all[:4].half()), TypeError),
                ("a CPU x", lambda: moe(x_all[:4].cpu()), ValueError),
                ("a strided w2", lambda: torch.ops.moegen.moe(
                    x_all[:4], moe.router_w, moe.w1p, moe.w2.transpose(1, 2).contiguous().transpose(1, 2),
                    moe.router_bias, moe.router_logit_bias, moe.b1p, moe.b2, moe.shared_gate, moe.plan_id),
                 ValueError)):
            try:
                call()
                report(False, "%s: %s was accepted" % (name, what))
            except exc as e:
                report(True, "%s: %s refused: %s" % (name, what, e))
    return moe, w


def e4m3_round(v):
    """float32 v rounded to the nearest e4m3 value, ties to even, saturating
    at +-448 (the library's rule, PTX's cvt.rn.satfinite), as float32: done
    here with torch.round (half to even) on the value's quantum, since
    torch's own float8 cast does not round ties to even, so the cast that
    follows is exact."""
    _, ex = torch.frexp(v)
    quantum = torch.ldexp(torch.ones_like(v), (ex - 1).clamp_min(-6) - 3)
    return (torch.round(v / quantum) * quantum).clamp(-448, 448)


def _div(a, b):
    """a / b correctly rounded, as the library divides: tensor by tensor
    (torch turns a division by a scalar, or of one, into a product with a
    reciprocal, which differs in the last bit)."""
    like = a if isinstance(a, torch.Tensor) else b
    full = lambda t: t if isinstance(t, torch.Tensor) else torch.full_like(like, t)
    return full(a) / full(b)


def quantize(w, block):
    """The library's weight quantization (moe_plan_pack_quantize) of w [...,
    N, K] in PyTorch: (float8_e4m3fn [..., N, K], float32 scales [..., N/128,
    K/128] for block, [..., N] for channel)."""
    wf = w.float()
    *lead, N, K = wf.shape
    if block:
        b = wf.reshape(*lead, N // 128, 128, K // 128, 128)
        amax = b.abs().amax(dim=(-3, -1)).clamp_min(1e-4)
        q = e4m3_round(b * _div(448.0, amax)[..., :, None, :, None]).reshape(*lead, N, K)
    else:
        amax = wf.abs().amax(-1).clamp_min(1e-4)
        q = e4m3_round(wf * _div(448.0, amax)[..., None])
    return q.to(torch.float8_e4m3fn), _div(amax, 448.0)


def dequantize(q, sc, block):
    """w = e4m3 * scale, fp32."""
    if not block:
        return q.float() * sc[..., None]
    *lead, N, K = q.shape
    b = q.float().reshape(*lead, N // 128, 128, K // 128, 128) * sc[..., :, None, :, None]
    return b.reshape(*lead, N, K)


def quantize_rows(v):
    """Activations as the fp8 layer quantizes them, per row per 128 columns,
    returned dequantized (fp32)."""
    P, K = v.shape
    b = v.float().reshape(P, K // 128, 128)
    amax = b.abs().amax(-1).clamp_min(1e-4)
    q = e4m3_round(b * _div(448.0, amax)[..., None])
    return (q * (_div(amax, 448.0))[..., None]).reshape(P, K)


def reference_fp8(keys, w, q, x):
    """The fp8 layer's quantized math in eager PyTorch (tests/support/ref.h,
    "the fp8 layer"): routing as reference(); per expert x quantized per 128
    columns, a = x_q · W1_q^T in fp32 (+ b1), the activation in fp32,
    quantized per 128 columns, o = h_q · W2_q^T (+ b2) rounded to bf16; the
    shared expert's slots likewise. q: the dequantized weights w1 [E, 2F,
    H], w2 [E, H, F] (and shared_w1, shared_w2)."""
    r = keys.get("router", {})
    K, F = keys["top_k"], keys["ffn"]
    logits = x.double() @ w["router_w"].double().t()
    if "router_logit_bias" in w:
        logits = logits + w["router_logit_bias"].double()
    score = logits.sigmoid() if r.get("score") == "sigmoid" else logits.softmax(-1)
    sel = score.float()
    if "router_bias" in w:
        sel = sel + w["router_bias"]
    idx = sel.topk(K, dim=-1).indices
    wt = score.gather(1, idx)
    if r.get("renormalize"):
        wt = wt / wt.sum(-1, keepdim=True)
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    xq = quantize_rows(x)

    def ffn(xr, w1, w2, b1=None, b2=None):
        h = xr @ w1.t()
        if b1 is not None:
            h = h + b1.float()
        a = quantize_rows(torch.nn.functional.silu(h[:, :F]) * h[:, F:])
        o = a @ w2.t()
        if b2 is not None:
            o = o + b2.float()
        return o.to(torch.bfloat16).float()

    for e in idx.unique().tolist():
        tok, slot = (idx == e).nonzero(as_tuple=True)
        o = ffn(xq[tok], q["w1"][e], q["w2"][e], w["b1"][e] if "b1" in w else None, w["b2"][e] if "b2" in w else None)
        y.index_add_(0, tok, o * wt[tok, slot, None].float())
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        g = (x.double() @ w["shared_gate"].double()).sigmoid().float()[:, None] if "shared_gate" in w else 1.0
        for j in range(Fs // F):
            cols = torch.arange(j * F, (j + 1) * F, device=x.device)
            w1 = torch.cat([q["shared_w1"][cols], q["shared_w1"][Fs + cols]])
            y += ffn(xq, w1, q["shared_w2"][:, cols]) * g
    return y.to(torch.bfloat16)


def check_fp8(name, keys):
    """An fp8 spec through MoE: the device quantization and the checkpoint
    pack against this file's quantizer, then the layer against the
    quantized math (module docstring)."""
    block = keys["quant"]["scaling"] == "block"
    moe = MoE(keys, device="cuda")
    w = weights(keys)
    E, F = keys["experts"], keys["ffn"]
    report(moe.w1p.dtype == torch.float8_e4m3fn and moe.w1s.dtype == torch.float32 and moe.w2s is not None,
           "%s: w1p %s %s, w1s %s, w2s %s" % (name, moe.w1p.dtype, list(moe.w1p.shape), list(moe.w1s.shape),
                                              list(moe.w2s.shape)))
    for t in (moe.w1p, moe.w2, moe.w1s, moe.w2s):   # poisoned: an unwritten byte or scale shows
        t.detach().view(torch.uint8).fill_(0x7F)
    moe.load_plain(**w)
    order = moe.w1_order()
    q1, s1 = quantize(w["w1"], block)
    q2, s2 = quantize(w["w2"], block)
    same = lambda a, b: torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    ok = same(moe.w1p[:E], q1[:, order]) and same(moe.w1s[:E], s1) and same(moe.w2[:E], q2) and same(moe.w2s[:E], s2)
    if not ok:
        print("  w1 bytes differing: %d of %d, w1 scales %d, w2 bytes %d, w2 scales %d" % (
            (moe.w1p[:E].view(torch.uint8) != q1[:, order].view(torch.uint8)).sum().item(), q1.numel(),
            (moe.w1s[:E] != s1).sum().item(), (moe.w2[:E].view(torch.uint8) != q2.view(torch.uint8)).sum().item(),
            (moe.w2s[:E] != s2).sum().item()))
    report(ok, "%s: load_plain quantized on the GPU: e4m3 and scales equal the library's rule, rows packed" % name)
    deq = dict(w1=dequantize(q1, s1, block), w2=dequantize(q2, s2, block))
    ck = dict(w1=q1, w1_scale=s1, w2=q2, w2_scale=s2)   # a checkpoint's e4m3 and weight_scale_inv
    if "shared" in keys:
        qs1, ss1 = quantize(w["shared_w1"], block)
        qs2, ss2 = quantize(w["shared_w2"], block)
        deq.update(shared_w1=dequantize(qs1, ss1, block), shared_w2=dequantize(qs2, ss2, block))
        ck.update(shared_w1=qs1, shared_w1_scale=ss1, shared_w2=qs2, shared_w2_scale=ss2)
    packed = [t.detach().clone() for t in (moe.w1p, moe.w2, moe.w1s, moe.w2s)]
    other = {k: v for k, v in w.items() if k not in ("w1", "w2", "shared_w1", "shared_w2")}
    cm = lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)
    B = 128 if block else 1
    for how, kw in (("w1 [E, 2F, H] and w1_scale", ck),
                    ("separate gate/up and column-major views",
                     dict(ck, w1=None, w1_scale=None, gate=cm(q1[:, :F]), up=cm(q1[:, F:]), w2=cm(q2),
                          gate_scale=s1[:, :F // B].contiguous(), up_scale=s1[:, F // B:].contiguous()))):
        for t in (moe.w1p, moe.w2, moe.w1s, moe.w2s):
            t.detach().view(torch.uint8).fill_(0x7F)
        moe.load_fp8(**dict(other, **kw))
        report(all(same(a, b) for a, b in zip((moe.w1p, moe.w2, moe.w1s, moe.w2s), packed)),
               "%s: load_fp8 (%s) packs the bytes load_plain quantized" % (name, how))
    T_max, H = moe.plan.info.tokens, moe.plan.info.hidden
    x_all = rand(T_max, H)
    with torch.no_grad():
        for T in sorted({1, 7, T_max // 2 + 3, T_max}):
            x = x_all[:T]
            ref = reference_fp8(keys, w, deq, x)
            poison(x)
            y = moe(x)
            torch.cuda.synchronize()
            err, ebf = nerr(y, ref), nerr(y, reference(keys, w, x))
            report(err <= TOL_FP8 and FP8_VS_BF16[0] < ebf < FP8_VS_BF16[1],
                   "%s: eager, %d tokens: error %.2e against the quantized math (tolerance %.1e), %.4f against the "
                   "bf16 layer (inside %s)" % (name, T, err, TOL_FP8, ebf, FP8_VS_BF16))
        x = x_all[:33]
        ref = reference_fp8(keys, w, deq, x)
        try:
            torch._dynamo.reset()
            yc = torch.compile(lambda t: moe(t) * 1, backend="inductor", fullgraph=True)(x)
            err = nerr(yc, ref)
            report(err <= TOL_FP8, "%s: torch.compile(fullgraph=True): error %.2e" % (name, err))
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: torch.compile: %s" % (name, str(e).splitlines()[0]))
        T = min(64, T_max)
        xs = x_all[:T].clone()
        moe(xs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = moe(xs)
        xn = rand(T, H)
        xs.copy_(xn)
        yg.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        err = nerr(yg, reference_fp8(keys, w, deq, xn))
        report(err <= TOL_FP8, "%s: CUDA graph replay, %d tokens: error %.2e" % (name, T, err))
        a = (x_all[:4], moe.router_w, moe.w1p, moe.w2, moe.router_bias, moe.router_logit_bias, moe.b1p, moe.b2,
             moe.shared_gate, moe.plan_id)
        for what, call, exc in (
                ("no scales", lambda: torch.ops.moegen.moe(*a), ValueError),
                ("bf16 w1p", lambda: torch.ops.moegen.moe(*a[:2], torch.zeros(moe.w1p.shape, dtype=torch.bfloat16,
                                                                                 device="cuda"), *a[3:],
                                                            moe.w1s, moe.w2s), TypeError),
                ("w2s of w1s's shape", lambda: torch.ops.moegen.moe(*a, moe.w1s, moe.w1s), ValueError)):
            try:
                call()
                report(False, "%s: %s was accepted" % (name, what))
            except exc as e:
                report(True, "%s: %s refused: %s" % (name, what, e))


def reference_layer(keys, leaf, xf, router_bias=None, rxf=None):
    """The eager layer in fp32, differentiable, from fp32 weights in the
    plain layouts (names as weights() gives them) and x: the top-k choice
    made in float64 from the same values, as reference() makes it (a
    constant); router_bias only shifts the choice. rxf: the router's own
    input (router.input = "separate"); leaf["router_expert_scale"]
    multiplies the final weights."""
    rin = xf if rxf is None else rxf
    r = keys.get("router", {})
    K, F = keys["top_k"], keys["ffn"]
    with torch.no_grad():
        ld = rin.double() @ leaf["router_w"].double().t()
        if "router_logit_bias" in leaf:
            ld = ld + leaf["router_logit_bias"].double()
        sel = (ld.sigmoid() if r.get("score") == "sigmoid" else ld.softmax(-1)).float()
        if router_bias is not None:
            sel = sel + router_bias
        idx = sel.topk(K, dim=-1).indices
    logits = rin @ leaf["router_w"].t()
    if "router_logit_bias" in leaf:
        logits = logits + leaf["router_logit_bias"]
    score = logits.sigmoid() if r.get("score") == "sigmoid" else logits.softmax(-1)
    wt = score.gather(1, idx)
    if r.get("renormalize"):
        wt = wt / wt.sum(-1, keepdim=True)
    if "router_expert_scale" in leaf:
        wt = wt * leaf["router_expert_scale"][idx]
    y = torch.zeros_like(xf)
    silu = torch.nn.functional.silu
    for e in idx.unique().tolist():
        tok, slot = (idx == e).nonzero(as_tuple=True)
        h = xf[tok] @ leaf["w1"][e].t()
        if "b1" in leaf:
            h = h + leaf["b1"][e]
        o = (silu(h[:, :F]) * h[:, F:]) @ leaf["w2"][e].t()
        if "b2" in leaf:
            o = o + leaf["b2"][e]
        y = y.index_add(0, tok, o * wt[tok, slot, None])
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        g = (xf @ leaf["shared_gate"]).sigmoid()[:, None] if "shared_gate" in leaf else 1.0
        h = xf @ leaf["shared_w1"].t()
        y = y + ((silu(h[:, :Fs]) * h[:, Fs:]) @ leaf["shared_w2"].t()) * g
    return y


def reference_grads(keys, w, x, dy, rx=None):
    """torch autograd of the eager layer in fp32 from the same values: the
    gradients of sum(y * dy) for x and every weight (plain layouts; names
    as weights() gives them, dx as "x"). router_bias gets no gradient."""
    leaf = {k: v.detach().float().requires_grad_() for k, v in w.items() if k != "router_bias"}
    xf = x.detach().float().requires_grad_()
    rxf = None if rx is None else rx.detach().float().requires_grad_()
    y = reference_layer(keys, leaf, xf, w.get("router_bias"), rxf)
    names = ["x"] + (["router_x"] if rx is not None else []) + list(leaf)
    grads = torch.autograd.grad((y * dy.float()).sum(), [xf] + ([rxf] if rx is not None else []) + list(leaf.values()))
    return dict(zip(names, grads))


def joined_grads(moe, keys, w1, w2):
    """The module's W1 and W2 gradients as the plain tensors' (fp32): the
    routed experts' [E, 2F, H] and [E, H, F], and with a shared expert its
    [2F_s, H] and [H, F_s], its m slots joined (slot E+j: gate rows jF..,
    up rows F_s + jF.., down columns jF..)."""
    E, F = keys["experts"], keys["ffn"]
    out = {"w1": w1[:E], "w2": w2[:E]}
    sh = keys.get("shared")
    if sh:
        m = sh["ffn"] // F
        s1, s2 = w1[E:E + m], w2[E:E + m]
        out["shared_w1"] = torch.cat([s1[:, :F].reshape(m * F, -1), s1[:, F:].reshape(m * F, -1)])
        out["shared_w2"] = s2.permute(1, 0, 2).reshape(s2.shape[1], m * F)
    return out


def check_training(name, keys, recompute_u=False):
    """A training plan's gradients through the module (autograd: the op's
    moe_train and moe_backward) against reference_grads, then the same
    through torch.compile."""
    tag = "%s%s" % (name, ", recompute_u" if recompute_u else "")
    moe = MoE(keys, device="cuda", recompute_u=recompute_u)
    report(moe.trains and moe.w1p.requires_grad and (moe.router_bias is None or not moe.router_bias.requires_grad),
           "%s: a training plan's parameters require grad (router_bias not)" % tag)
    wgb = 2 if keys.get("weight_grads") == "dtype" else 4   # the info's later fields reach Python (struct_size)
    report(moe.plan.info.weight_grad_bytes == wgb, "%s: plan.info.weight_grad_bytes %d (want %d)" % (
        tag, moe.plan.info.weight_grad_bytes, wgb))
    w = weights(keys)
    moe.load_plain(**w)
    T, H = min(keys["tokens"], 97), keys["hidden"]
    x = rand(T, H)
    dy = rand(T, H)
    ref = reference_grads(keys, w, x, dy)
    params = [p for p in moe.parameters() if p.requires_grad]

    def run(fn):
        for p in params:
            p.grad = None
        xg = x.clone().requires_grad_()
        for p in params:   # NaN in the blocks the fp32 gradients' allocations may get
            torch.empty(p.shape, dtype=torch.float32, device=p.device).fill_(float("nan"))
        y = fn(xg)
        y.backward(dy)
        torch.cuda.synchronize()
        got = {"x": xg.grad, "router_w": moe.router_w.grad}
        g1 = moe.w1p.grad.contiguous()   # unpack_grad takes the plan's weight-gradient type
        w1 = moe.unpack_grad(g1 if moe.plan.info.weight_grad_bytes == 2 else g1.float()).float()
        got.update(joined_grads(moe, keys, w1, moe.w2.grad.float()))
        if moe.b1p is not None:
            got["b1"] = moe.unpack_grad(moe.b1p.grad.float().contiguous(), "b1p")[:keys["experts"]]
            got["b2"] = moe.b2.grad[:keys["experts"]]
        if moe.router_logit_bias is not None:
            got["router_logit_bias"] = moe.router_logit_bias.grad
        if moe.shared_gate is not None:
            got["shared_gate"] = moe.shared_gate.grad
        return y, got

    modes = [("eager", moe)]
    if not recompute_u:   # inductor on one spec only: its compile of the backward takes a while
        modes.append(("torch.compile(backend='aot_eager')", None))
        if name == "train_mixtral":
            modes.append(("torch.compile(backend='inductor')", None))
    for how, fn in modes:
        try:
            if fn is None:
                torch._dynamo.reset()
                fn = torch.compile(lambda t: moe(t), backend=how.split("'")[1], fullgraph=True)
            y, got = run(fn)
            err_y = nerr(y, reference(keys, w, x))
            report(err_y <= TOL, "%s: %s training forward: error %.2e" % (tag, how, err_y))
            for g in sorted(ref):
                if g not in got or got[g] is None:
                    report(False, "%s: %s: no gradient for %s" % (tag, how, g))
                    continue
                err = nerr(got[g], ref[g])
                report(err <= TOL_GRAD, "%s: %s: d%s error %.2e (tolerance %.1e)" % (tag, how, g, err, TOL_GRAD))
            if moe.router_bias is not None:
                report(moe.router_bias.grad is None, "%s: %s: router_bias has no gradient" % (tag, how))
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (tag, how, str(e).splitlines()[0] if str(e) else type(e).__name__))
    # the ops themselves: moe_backward's fp32 dW1 against the reference, and a dy of another dtype refused
    args = [moe.router_w, moe.w1p, moe.w2, moe.router_bias, moe.router_logit_bias, moe.b1p, moe.b2, moe.shared_gate]
    with torch.no_grad():
        y, saved = torch.ops.moegen.moe_train(x, *args, moe.plan_id)
        g = torch.ops.moegen.moe_backward(dy, saved, x, *args, moe.plan_id)
        torch.cuda.synchronize()
        wdt = moe.w1p.dtype if keys.get("weight_grads") == "dtype" else torch.float32
        report(g[3].dtype == wdt and g[5].dtype == wdt and g[4].dtype in (torch.float32,),
               "%s: moe_backward's dw1p, dw2 are %s, %s (want %s); db1p %s" % (tag, g[3].dtype, g[5].dtype, wdt,
                                                                            g[4].dtype))
        err = nerr(joined_grads(moe, keys, moe.unpack_grad(g[3]), g[5])["w1"], ref["w1"])
        report(err <= TOL_GRAD, "%s: moegen::moe_backward's %s dW1 (unpacked): error %.2e" % (tag, wdt, err))
        try:
            torch.ops.moegen.moe_backward(dy.float(), saved, x, *args, moe.plan_id)
            report(False, "%s: an fp32 dy was accepted" % tag)
        except ValueError as e:
            report(True, "%s: an fp32 dy refused: %s" % (tag, e))


STEPS, LR, TOL_CURVE = 20, 5e-4, 0.05


def train_curve(keys, w, x, t, step_fn):
    """Losses of STEPS Adam steps (lr LR) on mean((y - t)^2): step_fn(x)
    returns (y, params) after a forward whose backward fills params' .grad;
    the optimizer holds fp32 master copies of them."""
    losses = []
    masters = opt = None
    for _ in range(STEPS):
        y, params = step_fn(x)
        if masters is None:
            masters = [p.detach().float().clone().requires_grad_() for p in params]
            opt = torch.optim.Adam(masters, lr=LR)
        loss = (y.float() - t).pow(2).mean()
        for p in params:
            p.grad = None
        loss.backward()
        losses.append(loss.item())
        for m, p in zip(masters, params):
            m.grad = p.grad.float()
        opt.step()
        with torch.no_grad():
            for m, p in zip(masters, params):
                p.copy_(m)
    return losses


def check_convergence(name, keys):
    """A few training steps of the module (bf16 parameters, fp32 master
    weights in Adam, gradients through moe_backward) against the same steps
    of the eager layer in fp32 (torch autograd) from the same weights and
    data: both losses fall, and the curves agree within TOL_CURVE
    (relative, at every step)."""
    moe = MoE(keys, device="cuda")
    w = weights(keys)
    moe.load_plain(**w)
    T, H = min(keys["tokens"], 128), keys["hidden"]
    x = rand(T, H)
    leaf = {k: v.detach().float().clone().requires_grad_() for k, v in w.items() if k != "router_bias"}
    with torch.no_grad():
        y0 = reference_layer(keys, leaf, x.float(), w.get("router_bias"))
        t = torch.randn_like(y0) * y0.std()
    params = [p for p in moe.parameters() if p.requires_grad]
    ours = train_curve(keys, w, x, t, lambda x: (moe(x), params))
    ref = train_curve(keys, w, x, t, lambda x: (reference_layer(keys, leaf, x.float(), w.get("router_bias")),
                                                list(leaf.values())))
    worst = max(abs(a - b) / b for a, b in zip(ours, ref))
    print("  %s losses: moegen %s" % (name, " ".join("%.4g" % v for v in ours[::6])))
    print("  %s losses: eager  %s" % (name, " ".join("%.4g" % v for v in ref[::6])))
    report(ours[-1] < 0.8 * ours[0] and ref[-1] < 0.8 * ref[0] and worst <= TOL_CURVE,
           "%s: %d Adam steps: loss %.4g -> %.4g (eager fp32 %.4g -> %.4g), curves within %.1e (tolerance %.1e)"
           % (name, STEPS, ours[0], ours[-1], ref[0], ref[-1], worst, TOL_CURVE))


def overhead(moe, iters):
    """Host microseconds per call to enqueue `iters` forwards of 1 token:
    with the C++ ops, moe_forward in a C loop with one prebuilt args struct
    and the op called through the dispatcher from C++ (moegen::_bench_forward);
    moe_forward through ctypes with a prebuilt args struct, the op, the
    module. The GPU work is the same; what differs is the host path."""
    plan = moe.plan
    H = plan.info.hidden
    x = rand(1, H)
    y = torch.empty_like(x)
    ws = torch.empty(plan.workspace_size(1), dtype=torch.uint8, device="cuda")
    p = lambda t: None if t is None else t.data_ptr()
    args = _lib.ForwardArgs(1, x.data_ptr(), p(moe.router_w), p(moe.router_bias), p(moe.router_logit_bias),
                            p(moe.w1p), p(moe.b1p), p(moe.w2), p(moe.b2), y.data_ptr(), ws.data_ptr(),
                            p(moe.shared_gate))
    lib, handle = plan._lib, plan.handle
    stream = torch.cuda.current_stream().cuda_stream
    byref = ctypes.byref(args)

    def direct():
        lib.moe_forward(handle, byref, stream)

    op = torch.ops.moegen.moe
    rw, w1p, w2, rb, lb, b1p, b2, sg, pid = (moe.router_w, moe.w1p, moe.w2, moe.router_bias, moe.router_logit_bias,
                                             moe.b1p, moe.b2, moe.shared_gate, moe.plan_id)

    def via_op():
        op(x, rw, w1p, w2, rb, lb, b1p, b2, sg, pid)

    def via_module():
        moe(x)

    res = {}
    ts = (x, rw, w1p, w2, rb, lb, b1p, b2, sg, pid)
    if hasattr(torch.ops.moegen, "_bench_forward"):
        with torch.no_grad():
            for name, mode in (("C loop moe_forward", 0), ("C++ op from C++", 1)):
                best = float("inf")
                for rep in range(7):
                    torch.cuda.synchronize()
                    best = min(best, torch.ops.moegen._bench_forward(*ts, iters, mode))
                    torch.cuda.synchronize()
                res[name] = best
    # under no_grad the op passes its Autograd kernel (moegen.torch.autograd_kernel); inference_mode excludes
    # the autograd keys, so the dispatcher goes straight to the CUDA kernel
    for name, fn, mode in (("ctypes moe_forward", direct, torch.no_grad), ("torch.ops.moegen.moe", via_op, torch.no_grad),
                           ("MoE module", via_module, torch.no_grad),
                           ("op in inference_mode", via_op, torch.inference_mode)):
        best = float("inf")
        with mode():
            for rep in range(7):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                best = min(best, (t1 - t0) / iters * 1e6)
        res[name] = best
    base = res["ctypes moe_forward"]
    c = res.get("C loop moe_forward")
    print("overhead: the %s ops (%s)" % ("C++" if moegen.torch.NATIVE else "Python",
                                         moegen.torch.NATIVE.path if moegen.torch.NATIVE else "no libmoegen_torch.so"))
    for name, us in res.items():
        print("overhead: %-22s %7.2f us/call host (%+.2f us against ctypes%s)"
              % (name, us, us - base, "" if c is None else ", %+.2f against the C loop" % (us - c)))
    return res


def check_given(name, keys):
    """Given routing through moegen::moe_given (MoE.forward's topk_ids /
    topk_weights): the caller's ids with some out of range (dropped, and
    counted: Plan.routing_errors on a direct call), against the reference,
    y poisoned first; eager and replayed from a CUDA graph."""
    moe = MoE(keys, device="cuda")
    w = weights(keys)
    given_w = keys["router"].get("score") == "given"
    if given_w:   # no router: the caller's weights
        w.pop("router_w")
        moe.load_plain(router_w=None, **w)
    else:
        moe.load_plain(**w)
    E, K, H = keys["experts"], keys["top_k"], keys["hidden"]
    for T in (1, 7, 300):
        x = rand(T, H)
        ids = torch.randint(0, E, (T, K), device="cuda", dtype=torch.int32)
        ids[torch.rand(T, K, device="cuda") < 0.08] = E    # out of range: dropped
        ids.view(-1)[0] = -1
        gw = torch.rand(T, K, device="cuda", dtype=torch.float32) + 1e-3 if given_w else None
        poison(x)
        with torch.no_grad():
            y = moe(x, topk_ids=ids, topk_weights=gw)
        ref = reference(keys, w, x, ids, gw)
        e = nerr(y, ref)
        report(e < 2e-2, "%s: moe_given, %d tokens (%d ids dropped): normalized error %.2e" % (
            name, T, int(((ids < 0) | (ids >= E)).sum()), e))
        g = torch.cuda.CUDAGraph()
        with torch.no_grad():
            moe(x, topk_ids=ids, topk_weights=gw)   # warm
            with torch.cuda.graph(g):
                yg = moe(x, topk_ids=ids, topk_weights=gw)
        g.replay()
        torch.cuda.synchronize()
        report(torch.equal(yg, y), "%s: moe_given, %d tokens, replayed from a CUDA graph: the eager bits" % (name, T))
    # the dropped ids, counted (Plan.forward on raw pointers, then Plan.routing_errors)
    plan, T = moe.plan, 9
    x, y = rand(T, H), torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, E, (T, K), device="cuda", dtype=torch.int32)
    ids[0, 0], ids[3, K - 1] = -5, E + 2
    gw = torch.rand(T, K, device="cuda", dtype=torch.float32) if given_w else None
    ws = torch.empty(plan.workspace_size(T) + 256, dtype=torch.uint8, device="cuda")
    wsp = (ws.data_ptr() + 255) // 256 * 256
    ptrs = dict(x=x.data_ptr(), y=y.data_ptr(), w1p=moe.w1p.data_ptr(), w2=moe.w2.data_ptr(), topk_ids=ids.data_ptr())
    if not given_w:
        ptrs["router_w"] = moe.router_w.data_ptr()
    else:
        ptrs["topk_weights"] = gw.data_ptr()
    if moe.b1p is not None:
        ptrs.update(b1p=moe.b1p.data_ptr(), b2=moe.b2.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    plan.forward(T, ptrs, wsp, stream)
    report(plan.routing_errors(wsp, stream) == 2, "%s: Plan.routing_errors counts the 2 dropped ids" % name)


def check_router_extras(name, keys):
    """The router's own input and per-expert scales (router.input =
    "separate", router.expert_scale: Gemma 4's router) through moegen::moe_ext
    (MoE.forward's router_x): against the reference, y poisoned first; eager
    and replayed from a CUDA graph; router_x required."""
    moe = MoE(keys, device="cuda")
    w = weights(keys)
    E, H = keys["experts"], keys["hidden"]
    w["router_expert_scale"] = torch.rand(E, device="cuda", dtype=torch.float32) * 1.5 + 0.25
    moe.load_plain(**w)
    for T in (1, 7, 300):
        x, rx = rand(T, H), rand(T, H)
        poison(x)
        with torch.no_grad():
            y = moe(x, router_x=rx)
        ref = reference(keys, w, x, rx=rx)
        e = nerr(y, ref)
        report(e < 2e-2, "%s: moe_ext, %d tokens: normalized error %.2e" % (name, T, e))
        wrong = nerr(y, reference(keys, w, x))   # the logits of x instead: another layer
        report(wrong > 1e-1, "%s: moe_ext, %d tokens: routed on x instead, the error would be %.2e" % (name, T, wrong))
        g = torch.cuda.CUDAGraph()
        with torch.no_grad():
            moe(x, router_x=rx)   # warm
            with torch.cuda.graph(g):
                yg = moe(x, router_x=rx)
        g.replay()
        torch.cuda.synchronize()
        report(torch.equal(yg, y), "%s: moe_ext, %d tokens, replayed from a CUDA graph: the eager bits" % (name, T))
    try:
        moe(rand(3, H))
        report(False, "%s: a call without router_x is refused" % name)
    except ValueError as ex:
        report("router_x" in str(ex), "%s: a call without router_x is refused: %s" % (name, ex))


def check_training_ext(name, keys):
    """Training with the router's own input and per-expert scales through
    MoE.forward(x, router_x=) under autograd (_TrainExt: moe_forward_train,
    moe_backward): every gradient, router_x's and the scales' included,
    against torch autograd of the eager layer."""
    moe = MoE(keys, device="cuda")
    w = weights(keys)
    E, H = keys["experts"], keys["hidden"]
    w["router_expert_scale"] = torch.rand(E, device="cuda", dtype=torch.float32) * 1.5 + 0.25
    moe.load_plain(**w)
    T = min(keys["tokens"], 97)
    x, rx, dy = rand(T, H), rand(T, H), rand(T, H)
    ref = reference_grads(keys, w, x, dy, rx)
    xg, rxg = x.clone().requires_grad_(), rx.clone().requires_grad_()
    y = moe(xg, router_x=rxg)
    y.backward(dy)
    torch.cuda.synchronize()
    got = {"x": xg.grad, "router_x": rxg.grad, "router_w": moe.router_w.grad,
           "router_expert_scale": moe.router_expert_scale.grad}
    got.update(joined_grads(moe, keys, moe.unpack_grad(moe.w1p.grad.float().contiguous()), moe.w2.grad.float()))
    for g in sorted(ref):
        if got.get(g) is None:
            report(False, "%s: training: no gradient for %s" % (name, g))
            continue
        err = nerr(got[g], ref[g])
        report(err <= TOL_GRAD, "%s: training: d%s error %.2e (tolerance %.1e)" % (name, g, err, TOL_GRAD))


EXT_SPECS = {
    "router_own_input": dict(name="router_own_input", experts=32, top_k=4, hidden=256, ffn=128, tokens=512,
                             router=dict(score="softmax", renormalize=True, input="separate", expert_scale=True)),
}


GIVEN_SPECS = {
    "given_ids": dict(name="given_ids", experts=16, top_k=4, hidden=256, ffn=128, tokens=512,
                      router=dict(select="given", score="softmax", renormalize=True)),
    "given_weights": dict(name="given_weights", experts=16, top_k=4, hidden=256, ffn=128, tokens=512, ffn_bias=True,
                          router=dict(select="given", score="given", renormalize=False)),
}


def main():
    faulthandler.enable()  # a crash in a native call prints the Python stack
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50, help="calls per overhead timing (the GPU queue must hold them)")
    ap.add_argument("--python-ops", action="store_true", help="test the Python ops ($MOEGEN_TORCH_LIBRARY=none)")
    ap.add_argument("--training", metavar="NAME", help="only the training check of TRAIN_SPECS[NAME]")
    opt = ap.parse_args()
    if not torch.cuda.is_available():
        print("test_torch_gpu: 0 passed, 0 failed, 1 skipped (no CUDA device)")
        return 0
    torch.manual_seed(0)
    print("moegen %s (%s), torch %s, %s, the %s ops" % (
        moegen.__version__, moegen.library().path, torch.__version__, torch.cuda.get_device_name(),
        "C++" if moegen.torch.NATIVE else "Python"))
    if opt.training:   # one training spec's check alone (a short GPU call)
        try:
            check_training(opt.training, TRAIN_SPECS[opt.training])
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (opt.training, type(e).__name__, e))
        print("test_torch_gpu: %d passed, %d failed" % (passed, failed))
        return 1 if failed else 0
    layers = {}
    for name, keys in SPECS.items():
        try:
            layers[name] = check_spec(name, keys)
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    for name, keys in TRAIN_SPECS.items():
        for recompute_u in (False, True) if name == "train_mixtral" else (False,):
            try:
                check_training(name, keys, recompute_u)
            except Exception as e:
                traceback.print_exc()
                report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    for name in ("train_mixtral", "train_shared"):
        try:
            check_convergence(name, TRAIN_SPECS[name])
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: training steps: %s: %s" % (name, type(e).__name__, e))
    for name, keys in GIVEN_SPECS.items():
        try:
            check_given(name, keys)
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    try:
        check_training_ext("train_own_input", dict(EXT_SPECS["router_own_input"], name="train_own_input", training=True))
    except Exception as e:
        traceback.print_exc()
        report(False, "train_own_input: %s: %s" % (type(e).__name__, e))
    for name, keys in EXT_SPECS.items():
        try:
            check_router_extras(name, keys)
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    for name, keys in FP8_SPECS.items():
        try:
            check_fp8(name, keys)
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    if "mixtral_small" in layers:
        overhead(layers["mixtral_small"][0], opt.iters)
    print("test_torch_gpu: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
