#!/usr/bin/env python3
"""moegen.jax on a GPU: the custom call under jax.jit (and eagerly) against
a NumPy reference of the layer, the packed weights against the library's
own host pack, the handler's own checks (calls that bypass moegen.jax's),
a closed plan, a training plan's jax.grad (the custom_vjp's
moegen_moe_train and moegen_moe_backward) against jax.grad of an eager
jnp layer in fp32 (tolerance 2.5e-2, test_torch_gpu.py's TOL_GRAD), and
the per-call time of a jitted layer.

usage (from the repository root, after `make` and python/build_jax.py):
    python3 python/tests/test_jax_gpu.py [--iters N]
The package is taken from python/, libmoegen from $MOEGEN_LIBRARY, else
build/libmoegen.so, and the handler from $MOEGEN_JAX_LIBRARY, else
build/libmoegen_jax.so; no install is needed. Prints one line per check
and "test_jax_gpu: N passed, N failed"; exit status 1 when any failed.

Specs: those of test_torch_gpu.py (mixtral-, qwen3-shaped, every optional
tensor, a gated shared expert). Inputs are random (never zeros); XLA
allocates y, so it cannot be poisoned directly: a NaN array of y's size is
freed just before each call so the allocator's next block of that size
holds NaN (best effort). Tolerance: normalized L2 error <= 1.5e-2 (bf16),
tests/test_gpu.c's.

fp8 specs (test_torch_gpu.py's FP8_SPECS: block scales, channel scales
with every optional tensor, block scales with a gated shared expert):
quantize_plain's e4m3 bytes and scales (jnp) against the library's own
host quantizer (moe_plan_pack_quantize), exactly; the call with w1s and
w2s under jax.jit and eagerly against a NumPy reference of the quantized
math (x and the activation's output quantized per 128 columns, dequantized
fp32 GEMMs) with TOL_FP8 = 1.5e-2 (tests/test_quant_gpu.c's LAYER_TOL),
its error against the bf16 layer inside FP8_VS_BF16; the handler refusing
a call without the scales and bf16 weights."""
import argparse
import faulthandler
import ctypes
import os
import re
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # leave memory to the plans
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402

import moegen  # noqa: E402
import moegen.jax as mj  # noqa: E402

TOL = 1.5e-2
SPECS = {
    "mixtral_small": dict(name="mixtral_small", experts=8, top_k=2, hidden=1024, ffn=1024, tokens=512,
                          router=dict(score="softmax", renormalize=True)),
    "qwen3_small": dict(name="qwen3_small", experts=128, top_k=8, hidden=1024, ffn=768, tokens=256,
                        router=dict(score="softmax", renormalize=True)),
    "biased_small": dict(name="biased_small", experts=16, top_k=4, hidden=512, ffn=512, tokens=128,
                         router=dict(score="sigmoid", renormalize=True, bias=True, logit_bias=True), ffn_bias=True),
    "shared_small": dict(name="shared_small", experts=16, top_k=4, hidden=512, ffn=256, tokens=128,
                         router=dict(score="softmax", renormalize=False), shared=dict(ffn=512, gate="sigmoid")),
}
BF16 = jnp.bfloat16
# fp8 expert weights: test_torch_gpu.py's FP8_SPECS and tolerances (the reasoning is there)
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
# training = true: test_torch_gpu.py's training specs, and its gradient tolerance (the reasoning is there)
TRAIN_SPECS = {
    "train_mixtral": dict(name="train_mixtral", experts=8, top_k=2, hidden=512, ffn=256, tokens=256,
                          router=dict(score="softmax", renormalize=True), training=True),
    "train_biased": dict(name="train_biased", experts=16, top_k=4, hidden=256, ffn=128, tokens=128,
                         router=dict(score="sigmoid", renormalize=True, bias=True, logit_bias=True), ffn_bias=True,
                         training=True),
    "train_shared": dict(name="train_shared", experts=8, top_k=2, hidden=256, ffn=128, tokens=128,
                         router=dict(score="softmax", renormalize=False), shared=dict(ffn=256, gate="sigmoid"),
                         training=True),
    # the weight gradients in the dtype (weight_grads = "dtype": the handler's dw1p, dw2 results are bf16)
    "train_hgrad": dict(name="train_hgrad", experts=8, top_k=2, hidden=512, ffn=256, tokens=256,
                        router=dict(score="softmax", renormalize=True), ffn_bias=True, training=True,
                        weight_grads="dtype"),
}
TOL_GRAD = 2.5e-2

passed = failed = 0


def report(ok, what):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)


rng = np.random.default_rng(0)


def rand(*shape, scale=1.0, dtype=BF16):
    """Uniform in [-scale, scale), as a host array of dtype (bf16 through ml_dtypes)."""
    return ((rng.random(shape, dtype=np.float32) * 2 - 1) * scale).astype(dtype)


def weights(keys):
    E, H, F = keys["experts"], keys["hidden"], keys["ffn"]
    r = keys.get("router", {})
    w = dict(router_w=rand(E, H, scale=4 / H ** 0.5), w1=rand(E, 2 * F, H, scale=2 / H ** 0.5),
             w2=rand(E, H, F, scale=2 / F ** 0.5))
    if keys.get("ffn_bias"):
        w.update(b1=rand(E, 2 * F, scale=0.1), b2=rand(E, H, scale=0.1))
    if r.get("bias"):
        w["router_bias"] = rand(E, scale=0.5, dtype=np.float32)
    if r.get("logit_bias"):
        w["router_logit_bias"] = rand(E, scale=0.5, dtype=np.float32)
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        w.update(shared_w1=rand(2 * Fs, H, scale=2 / H ** 0.5), shared_w2=rand(H, Fs, scale=2 / Fs ** 0.5))
        if sh.get("gate") == "sigmoid":
            w["shared_gate"] = rand(H, scale=4 / H ** 0.5)
    return w


def bf(a):
    """a rounded to bf16, back in fp32 (where the kernels store bf16)."""
    return a.astype(BF16).astype(np.float32)


def silu(a):
    return a / (1 + np.exp(-a))


def reference(keys, w, x):
    """The layer in NumPy from the plain weights, as test_torch_gpu.py's
    torch reference: routing in float64 (selection scores rounded to fp32),
    FFN in fp32 with the intermediate and each expert's output rounded to
    bf16; a shared expert as its m slots of ffn columns, each rounded
    likewise, weighted by 1 or sigmoid(x·w_gate)."""
    r = keys.get("router", {})
    K, F = keys["top_k"], keys["ffn"]
    f32 = lambda a: a.astype(np.float32)
    x64 = x.astype(np.float64)
    logits = x64 @ w["router_w"].astype(np.float64).T
    if "router_logit_bias" in w:
        logits = logits + w["router_logit_bias"].astype(np.float64)
    if r.get("score") == "sigmoid":
        score = 1 / (1 + np.exp(-logits))
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        score = e / e.sum(-1, keepdims=True)
    sel = score.astype(np.float32)
    if "router_bias" in w:
        sel = sel + w["router_bias"]
    idx = np.argsort(-sel, axis=-1, kind="stable")[:, :K]
    wt = np.take_along_axis(score, idx, -1)
    if r.get("renormalize"):
        wt = wt / wt.sum(-1, keepdims=True)
    y = np.zeros((x.shape[0], x.shape[1]), np.float32)
    xf = f32(x)
    for e in np.unique(idx):
        tok, slot = np.nonzero(idx == e)
        h = xf[tok] @ f32(w["w1"][e]).T
        if "b1" in w:
            h = h + f32(w["b1"][e])
        a = bf(silu(h[:, :F]) * h[:, F:])
        o = a @ f32(w["w2"][e]).T
        if "b2" in w:
            o = o + f32(w["b2"][e])
        y[tok] += bf(o) * wt[tok, slot][:, None].astype(np.float32)
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        g = 1.0
        if "shared_gate" in w:
            g = (1 / (1 + np.exp(-(x64 @ w["shared_gate"].astype(np.float64))))).astype(np.float32)[:, None]
        for j in range(Fs // F):
            cols = np.arange(j * F, (j + 1) * F)
            h = xf @ f32(np.concatenate([w["shared_w1"][cols], w["shared_w1"][Fs + cols]])).T
            a = bf(silu(h[:, :F]) * h[:, F:])
            o = a @ f32(w["shared_w2"][:, cols]).T
            y += bf(o) * g
    return y.astype(BF16)


def nerr(y, ref):
    y, ref = np.asarray(y, np.float32), np.asarray(ref, np.float32)
    if not np.isfinite(y).all():
        return float("inf")
    return float(np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-30))


def poison(shape):
    """Free a NaN array of y's size so the allocator's next block of that
    size holds NaN (best effort: XLA's allocator decides)."""
    p = jnp.full(shape, jnp.nan, BF16)
    p.block_until_ready()
    p.delete()


def check_spec(name, keys, dev):
    plan = moegen.Plan(keys, device=dev.id)
    w = weights(keys)
    put = lambda a: None if a is None else jax.device_put(a, dev)
    packed = mj.pack_plain(plan, w1=put(w["w1"]), w2=put(w["w2"]), b1=put(w.get("b1")), b2=put(w.get("b2")),
                           shared_w1=put(w.get("shared_w1")), shared_w2=put(w.get("shared_w2")))
    # the W1 packed by jnp indexing against the library's own host pack, every expert
    E = keys["experts"]
    host = np.ascontiguousarray(w["w1"]).view(np.uint16)
    ours = np.empty_like(host)
    fn = plan._lib.moe_plan_pack_w1
    fn.argtypes, fn.restype = [ctypes.c_void_p] * 3, ctypes.c_int
    rc = fn(plan.handle, host.ctypes.data, ours.ctypes.data)
    got = np.asarray(packed["w1p"])[:E].view(np.uint16)
    report(rc == 0 and np.array_equal(got, ours), "%s: pack_plain's w1p equals moe_plan_pack_w1's" % name)
    if "shared" in keys:
        S = packed["w1p"].shape[0]
        h1 = np.zeros((S,) + tuple(packed["w1p"].shape[1:]), np.uint16)
        h2 = np.zeros((S,) + tuple(packed["w2"].shape[1:]), np.uint16)
        sw1, sw2 = (np.ascontiguousarray(w[k]).view(np.uint16) for k in ("shared_w1", "shared_w2"))
        fn = plan._lib.moe_plan_pack_shared
        fn.argtypes, fn.restype = [ctypes.c_void_p] * 5, ctypes.c_int
        rc = fn(plan.handle, sw1.ctypes.data, sw2.ctypes.data, h1.ctypes.data, h2.ctypes.data)
        report(rc == 0 and np.array_equal(np.asarray(packed["w1p"])[E:].view(np.uint16), h1[E:])
               and np.array_equal(np.asarray(packed["w2"])[E:].view(np.uint16), h2[E:]),
               "%s: the shared expert's %d slots equal moe_plan_pack_shared's" % (name, S - E))
    opt = {k: put(w.get(k)) for k in ("router_bias", "router_logit_bias", "shared_gate")}
    opt.update(b1p=packed.get("b1p"), b2=packed.get("b2"))
    rw, w1p, w2 = put(w["router_w"]), packed["w1p"], packed["w2"]
    T_max, H = plan.info.tokens, plan.info.hidden

    @jax.jit
    def layer(x, rw, w1p, w2, opt):
        return mj.moe(x, rw, w1p, w2, **opt, plan=plan)

    x_all = rand(T_max, H)
    for T in sorted({1, 7, T_max // 2 + 3, T_max}):
        x = x_all[:T]
        ref = reference(keys, w, x)
        poison((T, H))
        y = layer(put(x), rw, w1p, w2, opt)
        err = nerr(y, ref)
        report(err <= TOL and y.shape == (T, H) and y.dtype == BF16,
               "%s: jax.jit, %d tokens: error %.2e (tolerance %.1e)" % (name, T, err, TOL))
    y = mj.moe(put(x_all[:5]), rw, w1p, w2, **opt, plan=plan)   # eager: jax compiles the one call
    err = nerr(y, reference(keys, w, x_all[:5]))
    report(err <= TOL, "%s: eager call, 5 tokens: error %.2e" % (name, err))
    y0 = layer(put(x_all[:0]), rw, w1p, w2, opt)
    report(y0.shape == (0, H), "%s: 0 tokens: y [0, H]" % name)
    x3 = put(x_all[:12].reshape(3, 4, H))
    err = nerr(np.asarray(layer(x3, rw, w1p, w2, opt)).reshape(12, H), reference(keys, w, x_all[:12]))
    report(err <= TOL, "%s: x [3, 4, H]: error %.2e" % (name, err))

    # inside a larger jitted block: RMS norm, the layer, the residual
    @jax.jit
    def block(x, rw, w1p, w2, opt):
        xf = x.astype(jnp.float32)
        n = (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype)
        return x + mj.moe(n, rw, w1p, w2, **opt, plan=plan)

    x = x_all[:33]
    xf = x.astype(np.float32)
    n = (xf / np.sqrt(np.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(BF16)
    ref = (xf + reference(keys, w, n).astype(np.float32)).astype(BF16)
    err = nerr(block(put(x), rw, w1p, w2, opt), ref)
    report(err <= TOL, "%s: in a jitted block (norm, layer, residual): error %.2e" % (name, err))

    # bad calls: moegen.jax's checks at trace time, and the handler's own (a raw ffi_call past them)
    xs = put(x_all[:4])
    for what, call, exc in (
            ("too many tokens", lambda: layer(put(rand(T_max + 1, H)), rw, w1p, w2, opt), ValueError),
            ("wrong dtype", lambda: layer(xs.astype(jnp.float16), rw, w1p, w2, opt), TypeError),
            ("w2 transposed", lambda: layer(xs, rw, w1p, jnp.swapaxes(w2, 1, 2), opt),
             ValueError if w2.shape[1] != w2.shape[2] else None)):
        if exc is None:
            continue
        try:
            call()
            report(False, "%s: %s was accepted" % (name, what))
        except exc as e:
            report(True, "%s: %s refused: %s" % (name, what, e))
    b = mj.bind(plan)
    args = [v for v in (opt["router_bias"], opt["router_logit_bias"], opt["b1p"], opt["b2"], opt["shared_gate"])
            if v is not None]
    present = sum(1 << i for i, k in enumerate(mj.OPTIONAL) if opt.get(k) is not None)

    def raw(x, ws_bytes, w2_=w2, present_=present, pid=b.id, extra=()):
        f = jax.ffi.ffi_call(mj.TARGET, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                         jax.ShapeDtypeStruct((ws_bytes,), np.uint8)))
        y, _ = f(x, rw, w1p, w2_, *args, *extra, plan=np.uint64(pid), present=np.int32(present_))
        return np.asarray(y)

    ws = b.workspace(4)
    y = raw(xs, ws)
    report(nerr(y, reference(keys, w, x_all[:4])) <= TOL, "%s: a raw ffi_call through the handler works" % name)
    for what, call, pattern in (
            ("x of another H", lambda: raw(put(rand(4, H + 8)), ws), "x must be bf16 \\[tokens, %d\\]" % H),
            ("too many tokens", lambda: raw(put(rand(T_max + 1, H)), b.workspace(T_max) + 4096),
             "%d tokens; the plan takes 0 to %d" % (T_max + 1, T_max)),
            ("a short workspace", lambda: raw(xs, 64), "the workspace has 64 bytes"),
            ("w2 of another dtype", lambda: raw(xs, ws, w2_=w2.astype(jnp.float32)), "w2 must be bf16"),
            ("an optional tensor not named in present", lambda: raw(xs, ws, extra=(rw,)), "operands more than"),
            ("an unbound plan id", lambda: raw(xs, ws, pid=2 ** 40), "no plan is bound with id")):
        try:
            call()
            report(False, "%s: the handler accepted %s" % (name, what))
        except Exception as e:   # XLA's runtime error type differs between versions
            ok = re.search(pattern, str(e)) is not None
            report(ok, "%s: the handler refused %s: %s" % (name, what, str(e).splitlines()[0][:200]))
    return plan, (layer, rw, w1p, w2, opt, x_all)


def reference_grads(keys, w, x, dy):
    """jax.grad of the eager layer in jnp, fp32 ("highest" matmul
    precision) from the same values: the gradients of sum(y * dy) for x and
    every plain weight but router_bias. The top-k choice is made in float64
    as reference() makes it, and is a constant."""
    r = keys.get("router", {})
    K, F = keys["top_k"], keys["ffn"]
    ld = x.astype(np.float64) @ w["router_w"].astype(np.float64).T
    if "router_logit_bias" in w:
        ld = ld + w["router_logit_bias"].astype(np.float64)
    sc = 1 / (1 + np.exp(-ld)) if r.get("score") == "sigmoid" else np.exp(ld - ld.max(-1, keepdims=True))
    if r.get("score") != "sigmoid":
        sc = sc / sc.sum(-1, keepdims=True)
    sel = sc.astype(np.float32) + (w["router_bias"] if "router_bias" in w else 0)
    idx = np.argsort(-sel, axis=-1, kind="stable")[:, :K]
    names = [k for k in w if k != "router_bias"]

    def loss(xf, p):
        logits = xf @ p["router_w"].T
        if "router_logit_bias" in p:
            logits = logits + p["router_logit_bias"]
        score = jax.nn.sigmoid(logits) if r.get("score") == "sigmoid" else jax.nn.softmax(logits, -1)
        wt = jnp.take_along_axis(score, jnp.asarray(idx), 1)
        if r.get("renormalize"):
            wt = wt / wt.sum(-1, keepdims=True)
        y = jnp.zeros_like(xf)
        for e in np.unique(idx).tolist():
            tok, slot = np.nonzero(idx == e)
            h = xf[tok] @ p["w1"][e].T
            if "b1" in p:
                h = h + p["b1"][e]
            o = (jax.nn.silu(h[:, :F]) * h[:, F:]) @ p["w2"][e].T
            if "b2" in p:
                o = o + p["b2"][e]
            y = y.at[tok].add(o * wt[tok, slot][:, None])
        sh = keys.get("shared")
        if sh:
            Fs = sh["ffn"]
            g = jax.nn.sigmoid(xf @ p["shared_gate"])[:, None] if "shared_gate" in p else 1.0
            h = xf @ p["shared_w1"].T
            y = y + ((jax.nn.silu(h[:, :Fs]) * h[:, Fs:]) @ p["shared_w2"].T) * g
        return (y * jnp.asarray(dy, jnp.float32)).sum()

    with jax.default_matmul_precision("highest"):
        # jitted: eagerly, every op of every expert's row count compiled apart (train_biased's took minutes)
        gx, gp = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x, jnp.float32),
                                                {k: jnp.asarray(w[k], jnp.float32) for k in names})
    return dict(gp, x=gx)


def plain_grads(plan, keys, g1, g2, gb1=None):
    """Packed W1 / W2 (/ b1) gradients as the plain tensors': the row order
    undone (Plan.w1_row_order), the routed experts' and, with a shared
    expert, its slots joined (slot E+j: gate rows jF.., up rows F_s + jF..,
    down columns jF..)."""
    E, F = keys["experts"], keys["ffn"]
    inv = np.argsort(np.asarray(plan.w1_row_order()))
    w1 = np.asarray(g1, np.float32)[:, inv]
    w2 = np.asarray(g2, np.float32)
    out = {"w1": w1[:E], "w2": w2[:E]}
    if gb1 is not None:
        out["b1"] = np.asarray(gb1, np.float32)[:, inv][:E]
    sh = keys.get("shared")
    if sh:
        m = sh["ffn"] // F
        s1, s2 = w1[E:E + m], w2[E:E + m]
        out["shared_w1"] = np.concatenate([s1[:, :F].reshape(m * F, -1), s1[:, F:].reshape(m * F, -1)])
        out["shared_w2"] = s2.transpose(1, 0, 2).reshape(s2.shape[1], m * F)
    return out


def check_training(name, keys, dev, recompute_u=False):
    """A training plan's jax.grad (the custom_vjp: moegen_moe_train and
    moegen_moe_backward), jitted and eager, against reference_grads."""
    tag = "%s%s" % (name, ", recompute_u" if recompute_u else "")
    plan = moegen.Plan(keys, device=dev.id)
    report(mj.bind(plan).training, "%s: the binding trains" % tag)
    report(mj.bind(plan).wgrad_half == (keys.get("weight_grads") == "dtype"),
           "%s: the binding's weight gradients are %s" % (tag, "the dtype" if mj.bind(plan).wgrad_half else "fp32"))
    w = weights(keys)
    put = lambda a: None if a is None else jax.device_put(a, dev)
    packed = mj.pack_plain(plan, w1=put(w["w1"]), w2=put(w["w2"]), b1=put(w.get("b1")), b2=put(w.get("b2")),
                           shared_w1=put(w.get("shared_w1")), shared_w2=put(w.get("shared_w2")))
    opt = {k: put(w.get(k)) for k in ("router_bias", "router_logit_bias", "shared_gate")}
    opt.update(b1p=packed.get("b1p"), b2=packed.get("b2"))
    rw, w1p, w2 = put(w["router_w"]), packed["w1p"], packed["w2"]
    T, H = min(keys["tokens"], 97), keys["hidden"]
    x, dy = rand(T, H), rand(T, H)
    ref = reference_grads(keys, w, x, dy)

    def loss(x, rw, w1p, w2, opt):
        y = mj.moe(x, rw, w1p, w2, **opt, plan=plan, recompute_u=recompute_u)
        return (y.astype(jnp.float32) * jnp.asarray(dy, jnp.float32)).sum()

    grad = jax.grad(loss, argnums=(0, 1, 2, 3, 4))
    for how, fn in (("jax.jit(jax.grad)", jax.jit(grad)), ("eager jax.grad", grad)):
        try:
            gx, grw, gw1p, gw2, gopt = fn(put(x), rw, w1p, w2, opt)
            report(gw1p.dtype == w1p.dtype and gw1p.shape == w1p.shape and gx.dtype == BF16,
                   "%s: %s: cotangents in the primals' shapes and dtypes" % (tag, how))
            got = dict(plain_grads(plan, keys, gw1p, gw2, gopt.get("b1p")), x=gx, router_w=grw)
            if gopt.get("b2") is not None:
                got["b2"] = np.asarray(gopt["b2"])[:keys["experts"]]
            for k in ("router_logit_bias", "shared_gate"):
                if gopt.get(k) is not None:
                    got[k] = gopt[k]
            for g in sorted(ref):
                if g not in got:
                    report(False, "%s: %s: no gradient for %s" % (tag, how, g))
                    continue
                err = nerr(got[g], ref[g])
                report(err <= TOL_GRAD, "%s: %s: d%s error %.2e (tolerance %.1e)" % (tag, how, g, err, TOL_GRAD))
            if gopt.get("router_bias") is not None:
                report(not np.asarray(gopt["router_bias"]).any(), "%s: %s: router_bias's cotangent is zero" % (tag, how))
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (tag, how, str(e).splitlines()[0] if str(e) else type(e).__name__))
    # the primal (no differentiation) is the plain forward, and agrees
    y = jax.jit(lambda *a: mj.moe(*a[:4], **a[4], plan=plan))(put(x), rw, w1p, w2, opt)
    err = nerr(y, reference(keys, w, x))
    report(err <= TOL, "%s: the primal forward: error %.2e" % (tag, err))


def timing(plan, state, iters):
    """Microseconds per call of the jitted layer at 1 token (async dispatch,
    host side) and per call synchronized, against a jitted x + 1 of the same
    size: JAX's own dispatch cost, which any custom call pays."""
    layer, rw, w1p, w2, opt, x_all = state
    x = jax.device_put(x_all[:1])
    plus = jax.jit(lambda x: x + 1)
    res = {}
    for what, fn in (("jax.jit(x + 1)", lambda: plus(x)), ("jax.jit(moe)", lambda: layer(x, rw, w1p, w2, opt))):
        fn().block_until_ready()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(iters):
                y = fn()
            t1 = time.perf_counter()
            y.block_until_ready()
            best = min(best, (t1 - t0) / iters * 1e6)
        res[what] = best
    for what, us in res.items():
        print("timing: %-16s %7.2f us/call host (dispatch)" % (what, us))
    return res


def dequantize(q, sc, block):
    """w = e4m3 * scale in NumPy fp32: q [..., N, K], sc [..., N/128, K/128] or [..., N]."""
    qf = np.asarray(q).astype(np.float32)
    sc = np.asarray(sc, np.float32)
    if not block:
        return qf * sc[..., None]
    *lead, N, K = qf.shape
    lead = tuple(lead)
    return (qf.reshape(lead + (N // 128, 128, K // 128, 128)) * sc[..., :, None, :, None]).reshape(lead + (N, K))


def quantize_rows(v):
    """Activations as the fp8 layer quantizes them (per row per 128 columns),
    dequantized, in NumPy (ml_dtypes' e4m3: round to nearest even)."""
    P, K = v.shape
    b = v.astype(np.float32).reshape(P, K // 128, 128)
    amax = np.maximum(np.abs(b).max(-1), np.float32(1e-4))
    q = np.clip(b * (np.float32(448.0) / amax)[..., None], -448, 448).astype(jnp.float8_e4m3fn).astype(np.float32)
    return (q * (amax / np.float32(448.0))[..., None]).reshape(P, K)


def reference_fp8(keys, w, d, x):
    """The fp8 layer's quantized math in NumPy (test_torch_gpu.py's
    reference_fp8): d holds the dequantized w1, w2 (shared_w1, shared_w2)."""
    r = keys.get("router", {})
    K, F = keys["top_k"], keys["ffn"]
    f32 = lambda a: a.astype(np.float32)
    x64 = x.astype(np.float64)
    logits = x64 @ w["router_w"].astype(np.float64).T
    if "router_logit_bias" in w:
        logits = logits + w["router_logit_bias"].astype(np.float64)
    if r.get("score") == "sigmoid":
        score = 1 / (1 + np.exp(-logits))
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        score = e / e.sum(-1, keepdims=True)
    sel = score.astype(np.float32)
    if "router_bias" in w:
        sel = sel + w["router_bias"]
    idx = np.argsort(-sel, axis=-1, kind="stable")[:, :K]
    wt = np.take_along_axis(score, idx, -1)
    if r.get("renormalize"):
        wt = wt / wt.sum(-1, keepdims=True)
    y = np.zeros((x.shape[0], x.shape[1]), np.float32)
    xq = quantize_rows(f32(x))

    def ffn(xr, w1, w2, b1=None, b2=None):
        h = xr @ w1.T
        if b1 is not None:
            h = h + f32(b1)
        a = quantize_rows(silu(h[:, :F]) * h[:, F:])
        o = a @ w2.T
        if b2 is not None:
            o = o + f32(b2)
        return bf(o)

    for e in np.unique(idx):
        tok, slot = np.nonzero(idx == e)
        o = ffn(xq[tok], d["w1"][e], d["w2"][e], w["b1"][e] if "b1" in w else None, w["b2"][e] if "b2" in w else None)
        y[tok] += o * wt[tok, slot][:, None].astype(np.float32)
    sh = keys.get("shared")
    if sh:
        Fs = sh["ffn"]
        g = 1.0
        if "shared_gate" in w:
            g = (1 / (1 + np.exp(-(x64 @ w["shared_gate"].astype(np.float64))))).astype(np.float32)[:, None]
        for j in range(Fs // F):
            cols = np.arange(j * F, (j + 1) * F)
            w1 = np.concatenate([d["shared_w1"][cols], d["shared_w1"][Fs + cols]])
            y += ffn(xq, w1, d["shared_w2"][:, cols]) * g
    return y.astype(BF16)


def check_fp8(name, keys, dev):
    """An fp8 spec through moegen.jax (module docstring)."""
    block = keys["quant"]["scaling"] == "block"
    plan = moegen.Plan(keys, device=dev.id)
    w = weights(keys)
    put = lambda a: None if a is None else jax.device_put(a, dev)
    packed = mj.quantize_plain(plan, w1=put(w["w1"]), w2=put(w["w2"]), b1=put(w.get("b1")), b2=put(w.get("b2")),
                               shared_w1=put(w.get("shared_w1")), shared_w2=put(w.get("shared_w2")))
    E, F, H = keys["experts"], keys["ffn"], keys["hidden"]
    # the library's own host quantizer (moe_plan_pack_quantize) on the same bf16 weights: packed bytes and scales
    fn = plan._lib.moe_plan_pack_quantize
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.POINTER(moegen._lib.PackArgs), ctypes.c_void_p,
                               ctypes.c_void_p], ctypes.c_int
    w1h, w2h = (np.ascontiguousarray(w[k]).view(np.uint16) for k in ("w1", "w2"))
    ok = True
    for tensor, src, got, gots in ((0, w1h, packed["w1p"], packed["w1s"]), (2, w2h, packed["w2"], packed["w2s"])):
        a = moegen._lib.PackArgs(tensor=tensor, first=0, count=E)
        N, K = src.shape[1:]
        a.src[0] = moegen._lib.PackSrc(src.ctypes.data, N * K, K, 1)
        if tensor == 0:
            a.src[1] = moegen._lib.PackSrc(src.ctypes.data + F * H * 2, N * K, K, 1)
        q = np.zeros((E, N, K), np.uint8)
        sc = np.zeros((E,) + tuple(gots.shape[1:]), np.float32)
        rc = fn(plan.handle, ctypes.byref(a), q.ctypes.data, sc.ctypes.data)
        g, gs = np.asarray(got)[:E].view(np.uint8), np.asarray(gots)[:E]
        same = rc == 0 and np.array_equal(g, q) and np.array_equal(gs.view(np.uint32), sc.view(np.uint32))
        if not same:
            print("  tensor %d: rc %d, bytes differing %d of %d, scales %d" % (tensor, rc, (g != q).sum(), q.size,
                                                                              (gs != sc).sum()))
        ok = ok and same
    report(ok, "%s: quantize_plain's e4m3 and scales equal the library's host quantizer (moe_plan_pack_quantize)"
           % name)
    q1, s1 = mj.quantize_weight(put(w["w1"]), block)
    q2, s2 = mj.quantize_weight(put(w["w2"]), block)
    d = dict(w1=dequantize(q1, s1, block), w2=dequantize(q2, s2, block))
    if "shared" in keys:
        for k in ("shared_w1", "shared_w2"):
            d[k] = dequantize(*mj.quantize_weight(put(w[k]), block), block)
    opt = {k: put(w.get(k)) for k in ("router_bias", "router_logit_bias", "shared_gate")}
    opt.update(b1p=packed.get("b1p"), b2=packed.get("b2"), w1s=packed["w1s"], w2s=packed["w2s"])
    rw, w1p, w2 = put(w["router_w"]), packed["w1p"], packed["w2"]
    T_max = plan.info.tokens

    @jax.jit
    def layer(x, rw, w1p, w2, opt):
        return mj.moe(x, rw, w1p, w2, **opt, plan=plan)

    x_all = rand(T_max, H)
    for T in sorted({1, 7, T_max // 2 + 3, T_max}):
        x = x_all[:T]
        poison((T, H))
        y = layer(put(x), rw, w1p, w2, opt)
        err, ebf = nerr(y, reference_fp8(keys, w, d, x)), nerr(y, reference(keys, w, x))
        report(err <= TOL_FP8 and FP8_VS_BF16[0] < ebf < FP8_VS_BF16[1] and y.dtype == BF16,
               "%s: jax.jit, %d tokens: error %.2e against the quantized math (tolerance %.1e), %.4f against the "
               "bf16 layer (inside %s)" % (name, T, err, TOL_FP8, ebf, FP8_VS_BF16))
    y = mj.moe(put(x_all[:5]), rw, w1p, w2, **opt, plan=plan)
    err = nerr(y, reference_fp8(keys, w, d, x_all[:5]))
    report(err <= TOL_FP8, "%s: eager call, 5 tokens: error %.2e" % (name, err))
    xs = put(x_all[:4])
    try:
        layer(xs, rw, w1p, w2, dict(opt, w1s=None))
        report(False, "%s: a call without w1s was accepted" % name)
    except ValueError as e:
        report(True, "%s: a call without w1s refused: %s" % (name, e))
    # the handler's own checks, past moegen.jax's: no scales, bf16 weights
    b = mj.bind(plan)
    args = [opt[k] for k in mj.OPTIONAL if opt.get(k) is not None]
    present = sum(1 << i for i, k in enumerate(mj.OPTIONAL) if opt.get(k) is not None)

    def raw(w1p_=w1p, present_=present, args_=args):
        f = jax.ffi.ffi_call(mj.TARGET, (jax.ShapeDtypeStruct(xs.shape, xs.dtype),
                                         jax.ShapeDtypeStruct((b.workspace(4),), np.uint8)))
        y, _ = f(xs, rw, w1p_, w2, *args_, plan=np.uint64(b.id), present=np.int32(present_))
        return np.asarray(y)

    report(nerr(raw(), reference_fp8(keys, w, d, x_all[:4])) <= TOL_FP8,
           "%s: a raw ffi_call with the scales (present %d) works" % (name, present))
    for what, call, pattern in (
            ("no scales", lambda: raw(present_=present & 31, args_=args[:-2]), "the spec needs w1s"),
            ("bf16 w1p", lambda: raw(w1p_=w1p.astype(BF16)), "w1p must be float8_e4m3fn")):
        try:
            call()
            report(False, "%s: the handler accepted %s" % (name, what))
        except Exception as e:
            report(re.search(pattern, str(e)) is not None,
                   "%s: the handler refused %s: %s" % (name, what, str(e).splitlines()[0][:200]))


def main():
    faulthandler.enable()  # a crash in a native call prints the Python stack
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    opt = ap.parse_args()
    gpus = [d for d in jax.devices() if d.platform == "gpu"] if jax.default_backend() == "gpu" else []
    if not gpus:
        print("test_jax_gpu: 0 passed, 0 failed, 1 skipped (jax sees no GPU: %s)" % jax.default_backend())
        return 0
    h = mj.handler()
    print("moegen %s (%s; handler %s), jax %s, jaxlib %s, %s" % (
        moegen.__version__, moegen.library().path, h.path, jax.__version__, jaxlib.__version__,
        gpus[0].device_kind))
    layers = {}
    for name, keys in SPECS.items():
        try:
            layers[name] = check_spec(name, keys, gpus[0])
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    # a closed plan: its calls fail with the handler's message, not a crash
    try:
        keys = SPECS["biased_small"]
        plan = moegen.Plan(keys, device=gpus[0].id)
        b = mj.bind(plan)
        plan.close()
        report(b.id not in mj._bound and getattr(plan, "_jax_binding", None) is None,
               "closing a plan unbinds it")
        try:
            mj.moe(jnp.zeros((2, keys["hidden"]), BF16), *[jnp.zeros(b.expect[k][0], BF16) for k in
                                                             ("router_w", "w1p", "w2")], plan=plan)
            report(False, "a call on a closed plan was accepted")
        except Exception as e:
            report("closed" in str(e), "a call on a closed plan refused: %s" % e)
    except Exception as e:
        traceback.print_exc()
        report(False, "closed plan: %s: %s" % (type(e).__name__, e))
    for name, keys in TRAIN_SPECS.items():
        for recompute_u in (False, True) if name == "train_mixtral" else (False,):
            try:
                check_training(name, keys, gpus[0], recompute_u)
            except Exception as e:
                traceback.print_exc()
                report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    for name, keys in FP8_SPECS.items():
        try:
            check_fp8(name, keys, gpus[0])
        except Exception as e:
            traceback.print_exc()
            report(False, "%s: %s: %s" % (name, type(e).__name__, e))
    if "mixtral_small" in layers:
        timing(*layers["mixtral_small"], opt.iters)
    a = mj.buffer_alignment()   # the README's JAX limit: how often XLA's buffers needed the 256-byte padding
    print("alignment: XLA's workspaces %d, %d not 256-byte aligned; saved regions %d, %d not aligned"
          % (a["workspace"] + a["saved"]))
    report(a["workspace"][0] > 0 and a["saved"][0] > 0, "the handlers counted the buffers they were given")
    print("test_jax_gpu: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
