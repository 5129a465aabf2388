"""moegen.jax — the layer as an XLA FFI custom call, jit-able.

    import jax, moegen, moegen.jax as mj
    plan = moegen.Plan("examples/specs/qwen3-30b-a3b.moe")
    p = mj.pack_plain(plan, w1=w1, w2=w2)          # plain layouts -> packed (jnp indexing)
    f = jax.jit(lambda x, rw, w1p, w2: mj.moe(x, rw, w1p, w2, plan=plan))
    y = f(x, router_w, p["w1p"], p["w2"])          # x [..., H], bf16 on the plan's GPU

moe() lowers to the custom call "moegen_moe", whose handler (the C++
library libmoegen_jax.so, python/csrc/moegen_jax.cc) runs moe_forward on
XLA's stream; its workspace is a second result of the call, so XLA
allocates and owns it. The plan is bound to the handler on first use (bind:
an id in the handler's table, the call's attribute); a bound plan is kept
alive until it is unbound or closed. Shapes and dtypes are checked against
the plan when the call is traced (a clear TypeError or ValueError), and
again by the handler. There is no batching rule (jax.vmap raises).

A plan whose spec has training = true is differentiable (jax.grad,
jax.vjp): moe() is a jax.custom_vjp whose forward rule is the custom call
"moegen_moe_train" (moe_forward_train: y and the saved region, a result
XLA owns) and whose backward rule is "moegen_moe_backward" (moe_backward:
every gradient, cast to the primals' dtypes; w1p's and b1p's in their
packed row order, as the primals are; none for router_bias). Evaluated
without differentiation it is the plain forward. recompute_u=True saves
less and computes the up projection again in the backward. Another plan's
moe() has no differentiation rule (JAX says so).

This module imports without jax; moe() and bind() import it. The handler
library is, in order: $MOEGEN_JAX_LIBRARY; libmoegen_jax.so inside the
package; the clone's build/libmoegen_jax.so (python/build_jax.py)."""
import ctypes
import os
import threading

from . import _lib
from .plan import Plan

TARGET = "moegen_moe"
TRAIN_TARGET = "moegen_moe_train"
BACKWARD_TARGET = "moegen_moe_backward"
# the operands after x, in the call's order (the optional ones only when given)
# (w1s, w2s: the fp8 weights' scales, bits 5 and 6 of the attribute present)
ORDER = ("router_w", "w1p", "w2", "router_bias", "router_logit_bias", "b1p", "b2", "shared_gate", "w1s", "w2s")
OPTIONAL = ORDER[3:]
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "float8_e4m3fn", "int32": "int32"}
WORKSPACE_ALIGN = 256   # moe_forward's workspace alignment; the handler aligns XLA's buffer up to it

_lock = threading.Lock()
_handler = None
_bound = {}   # id -> the Plan, kept alive while bound


def _import_jax():
    try:
        import jax
        import jax.ffi  # noqa: F401  (jax >= 0.4.31)
    except ImportError as e:
        raise ImportError("moegen.jax needs jax (>= 0.4.31, with jax.ffi): pip install jax (%s)" % e) from None
    return jax


def candidates():
    """The paths tried for the handler library, in order."""
    env = os.environ.get("MOEGEN_JAX_LIBRARY")
    if env:
        return [env]
    return [os.path.join(_lib.HERE, "libmoegen_jax.so"),
            os.path.join(os.path.dirname(_lib.REPO_LIBRARY), "libmoegen_jax.so")]


def load_handler(path=None):
    """Load the handler library (libmoegen after moegen._lib has loaded it,
    so both use one libmoegen), check it and register its handler as the
    CUDA target "moegen_moe". Returns the ctypes library; raises
    moegen.LibraryError with the reason."""
    jax = _import_jax()
    lib = _lib.library()
    paths = [path] if path else candidates()
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        raise _lib.LibraryError(
            "libmoegen_jax.so not found (tried %s): build it in the repository with `python3 python/build_jax.py` "
            "(a Python with jax: the FFI headers come from jaxlib), or install the package with jax importable "
            "at build time (pip install --no-build-isolation ./python), or name it in $MOEGEN_JAX_LIBRARY"
            % ", ".join(paths))
    try:
        h = ctypes.CDLL(found[0])
    except OSError as e:
        raise _lib.LibraryError("the JAX handler at %s did not load: %s" % (found[0], e)) from None
    for name in ("MoegenMoe", "MoegenMoeTrain", "MoegenMoeBackward", "moegen_jax_version", "moegen_jax_moe_forward",
                 "moegen_jax_bind", "moegen_jax_unbind", "moegen_jax_alignment"):
        if not hasattr(h, name):
            raise _lib.LibraryError("%s lacks %s: it is not this package's JAX handler" % (found[0], name))
    h.moegen_jax_version.restype = ctypes.c_char_p
    h.moegen_jax_moe_forward.restype = ctypes.c_void_p
    h.moegen_jax_bind.restype = ctypes.c_int
    h.moegen_jax_bind.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    h.moegen_jax_unbind.restype = None
    h.moegen_jax_unbind.argtypes = [ctypes.c_uint64]
    h.moegen_jax_alignment.restype = None
    h.moegen_jax_alignment.argtypes = [ctypes.POINTER(ctypes.c_uint64 * 4)]
    version = h.moegen_jax_version().decode()
    if version != lib.moe_version().decode():
        raise _lib.LibraryError("%s is version %s, libmoegen (%s) %s: rebuild it (python/build_jax.py)"
                                % (found[0], version, lib.path, lib.moe_version().decode()))
    ours = ctypes.cast(lib.moe_forward, ctypes.c_void_p).value
    if h.moegen_jax_moe_forward() != ours:
        raise _lib.LibraryError("%s uses another libmoegen than %s (the library it links, libmoegen.so.0, must "
                                "be the one moegen loaded)" % (found[0], lib.path))
    for target, fn in ((TARGET, h.MoegenMoe), (TRAIN_TARGET, h.MoegenMoeTrain),
                       (BACKWARD_TARGET, h.MoegenMoeBackward)):
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(fn), platform="CUDA")
    h.path = found[0]
    return h


def buffer_alignment():
    """What the handlers saw of XLA's buffers since the handler loaded:
    {"workspace": (seen, not 256-byte aligned), "saved": (seen, not
    aligned)}. A workspace not on a 256-byte boundary is padded; a saved
    region not on one is refused (the forward and the backward would
    disagree on where it starts; README, JAX)."""
    out = (ctypes.c_uint64 * 4)()
    handler().moegen_jax_alignment(ctypes.byref(out))
    return {"workspace": (out[0], out[1]), "saved": (out[2], out[3])}


def handler():
    """The process's handler library, loaded and registered on first use."""
    global _handler
    if _handler is None:
        with _lock:
            if _handler is None:
                _handler = load_handler()
    return _handler


class Binding:
    """What a call needs of a plan: its id in the handler's table (the
    call's attribute `plan`), the tensors it expects (name -> (shape,
    dtype name) or None, moe_plan_tensor's; x's first dimension is the most
    tokens) and its workspace bytes per token count."""

    def __init__(self, pid, expect, workspace_size, saved_size=None, backward_workspace_size=None,
                 train_workspace_size=None):
        self.id, self.expect, self.workspace_size = pid, expect, workspace_size
        self.capacity, self.hidden = expect["x"][0]
        self._ws = {}
        # a training plan's sizes: (tokens, recompute_u) -> bytes (moe_plan_saved_size, _backward_workspace_size),
        # tokens -> bytes (moe_plan_train_workspace_size: the training forward's workspace; the forward's without it)
        self.saved_size, self.backward_workspace_size = saved_size, backward_workspace_size
        self.train_workspace_size = train_workspace_size or workspace_size
        self.training = saved_size is not None and saved_size(1, 0) > 0

    def workspace(self, tokens):
        """The workspace result's bytes for `tokens` tokens (with room to align it)."""
        n = self._ws.get(tokens)
        if n is None:
            n = self._ws[tokens] = self.workspace_size(tokens) + WORKSPACE_ALIGN
        return n


def bind(plan):
    """Bind `plan` (a moegen.Plan) to the handler, once; returns its
    Binding. The plan is kept alive until unbind(plan) or plan.close()."""
    b = getattr(plan, "_jax_binding", None)
    if b is not None:
        return b
    if not isinstance(plan, Plan):
        raise TypeError("moegen.jax: plan must be a moegen.Plan, not %s" % type(plan).__name__)
    h = handler()
    with _lock:
        b = getattr(plan, "_jax_binding", None)
        if b is not None:
            return b
        pid = ctypes.c_uint64()
        st = h.moegen_jax_bind(plan.handle, plan.device, ctypes.byref(pid))
        if st != 0:
            raise _lib.fail(plan._lib, st, "moegen_jax_bind")
        expect = {n: None if t is None else (t[0], _DTYPES[t[1]]) for n, t in plan.tensors.items()}
        lib, handle = plan._lib, plan.handle
        b = Binding(pid.value, expect, plan.workspace_size,
                    lambda t, r: lib.moe_plan_saved_size(handle, t, r),
                    lambda t, r: lib.moe_plan_backward_workspace_size(handle, t, r),
                    lambda t: lib.moe_plan_train_workspace_size(handle, t))
        b.wgrad_half = plan.info.weight_grad_bytes == 2  # spec weight_grads = "dtype"
        _bound[b.id] = plan
        plan._jax_binding = b
        plan.on_close(lambda: unbind(plan))
    return b


def unbind(plan):
    """Undo bind(plan): calls traced for it fail from now on (a clear error
    from the handler), and the plan is no longer kept alive here."""
    with _lock:
        b = getattr(plan, "_jax_binding", None)
        if b is None:
            return
        plan._jax_binding = None
        _bound.pop(b.id, None)
        if _handler is not None:
            _handler.moegen_jax_unbind(b.id)


def _dtype_name(t):
    dt = t.dtype
    return getattr(dt, "name", str(dt))


def check_args(expect, x, tensors):
    """Raise a clear exception unless the call's arrays fit the plan: expect
    maps each name to (shape, dtype name) or None (Binding.expect); x is
    [tokens, H] with 0 <= tokens <= the plan's tokens; tensors maps the
    names of ORDER to an array or None. Reads only .shape and .dtype, so it
    runs on tracers and jax.ShapeDtypeStruct."""
    capacity, hidden = expect["x"][0]
    for name, t in (("x", x),) + tuple(tensors.items()):
        want = expect[name]
        if t is None:
            if want is not None:
                raise ValueError("moegen: the spec needs %s %s %s" % (name, want[1], list(want[0])))
            continue
        if want is None:
            raise ValueError("moegen: the spec takes no %s; pass None" % name)
        if not hasattr(t, "shape") or not hasattr(t, "dtype"):
            raise TypeError("moegen: %s must be an array, not %s" % (name, type(t).__name__))
        if _dtype_name(t) != want[1]:
            raise TypeError("moegen: %s must be %s, not %s" % (name, want[1], _dtype_name(t)))
        shape = tuple(t.shape)
        if name == "x":
            if len(shape) != 2 or shape[1] != hidden:
                raise ValueError("moegen: x must be [tokens, %d], not %s" % (hidden, list(shape)))
            if shape[0] > capacity:
                raise ValueError("moegen: %d tokens; the plan takes 0 to %d (spec key tokens)"
                                 % (shape[0], capacity))
        elif shape != tuple(want[0]):
            raise ValueError("moegen: %s must be %s, not %s" % (name, list(want[0]), list(shape)))


def _forward(b, x2, ts):
    """The custom call moegen_moe on x2 [tokens, H] and ts (ORDER's, None
    where absent): y."""
    jax = _import_jax()
    import numpy as np
    present = sum(1 << i for i, t in enumerate(ts[3:]) if t is not None)
    call = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct(x2.shape, x2.dtype),
                                     jax.ShapeDtypeStruct((b.workspace(x2.shape[0]),), np.uint8)))
    y, _ = call(x2, *(t for t in ts if t is not None), plan=np.uint64(b.id), present=np.int32(present))
    return y


def _train(b, recompute_u, x2, ts):
    """moegen_moe_train: (y, the saved region)."""
    jax = _import_jax()
    import numpy as np
    T = x2.shape[0]
    present = sum(1 << i for i, t in enumerate(ts[3:]) if t is not None)
    call = jax.ffi.ffi_call(TRAIN_TARGET, (
        jax.ShapeDtypeStruct(x2.shape, x2.dtype),
        jax.ShapeDtypeStruct((b.saved_size(T, recompute_u) + WORKSPACE_ALIGN,), np.uint8),
        jax.ShapeDtypeStruct((b.train_workspace_size(T) + WORKSPACE_ALIGN,), np.uint8)))
    y, saved, _ = call(x2, *(t for t in ts if t is not None), plan=np.uint64(b.id), present=np.int32(present),
                       recompute_u=np.int32(recompute_u))
    return y, saved


def _backward(b, recompute_u, dy, saved, x2, ts):
    """moegen_moe_backward: the cotangents of x2 and of ts (ORDER's),
    each in its primal's dtype, None for router_bias and absent ones."""
    jax = _import_jax()
    import numpy as np
    T, f32 = x2.shape[0], np.float32
    present = sum(1 << i for i, t in enumerate(ts[3:]) if t is not None)
    like = lambda t, dt=f32: jax.ShapeDtypeStruct(tuple(t.shape) if t is not None else (0,), dt)
    wt = x2.dtype if getattr(b, "wgrad_half", False) else f32   # dw1p, dw2: spec weight_grads
    rw, w1p, w2, _, lb, b1p, b2, sg = ts[:8]   # a training plan has no fp8 scales
    call = jax.ffi.ffi_call(BACKWARD_TARGET, (
        jax.ShapeDtypeStruct(x2.shape, x2.dtype), like(rw), like(lb), like(w1p, wt), like(b1p), like(w2, wt), like(b2),
        like(sg), jax.ShapeDtypeStruct((b.backward_workspace_size(T, recompute_u) + WORKSPACE_ALIGN,), np.uint8)))
    dx, drw, dlb, dw1p, db1p, dw2, db2, dsg, _ = call(
        dy.astype(x2.dtype), saved, x2, *(t for t in ts if t is not None), plan=np.uint64(b.id),
        present=np.int32(present), recompute_u=np.int32(recompute_u))
    cast = lambda g, t: None if t is None else g.astype(t.dtype)
    return dx, (cast(drw, rw), cast(dw1p, w1p), cast(dw2, w2), None, cast(dlb, lb), cast(db1p, b1p), cast(db2, b2),
                cast(dsg, sg), None, None)


_layer = None


def _trainable():
    """The layer as a jax.custom_vjp over (x2, ts), the binding and
    recompute_u static: its primal is the plain forward, its forward rule
    _train and its backward rule _backward."""
    global _layer
    if _layer is None:
        jax = _import_jax()
        import functools

        @functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
        def layer(b, recompute_u, x2, ts):
            return _forward(b, x2, ts)

        def fwd(b, recompute_u, x2, ts):
            y, saved = _train(b, recompute_u, x2, ts)
            return y, (saved, x2, ts)

        def bwd(b, recompute_u, res, dy):
            saved, x2, ts = res
            dx, dts = _backward(b, recompute_u, dy, saved, x2, ts)
            # router_bias (the choice's bias) gets a zero cotangent
            dts = tuple(jax.numpy.zeros_like(t) if g is None and t is not None else g for g, t in zip(dts, ts))
            return dx, dts

        layer.defvjp(fwd, bwd)
        _layer = layer
    return _layer


def moe(x, router_w, w1p, w2, router_bias=None, router_logit_bias=None, b1p=None, b2=None, shared_gate=None,
        w1s=None, w2s=None, *, plan, recompute_u=False):
    """The layer: y = moe(x), x [..., H] of at most the spec's tokens rows,
    the weights in moegen's packed layouts (README.md, "Tensors"; see
    pack_plain) as JAX arrays on the plan's device. plan: a moegen.Plan (or
    its Binding). Works eagerly and under jax.jit (plan is a static Python
    object: close over it, or pass it through static_argnames).
    Differentiable when the plan trains; recompute_u as
    moe_train_forward_args.recompute_u. With fp8 expert weights (spec
    quant.weights = "fp8_e4m3") w1p and w2 are float8_e4m3fn and w1s, w2s
    their float32 scales (README.md, "FP8 weights"; pack_plain packs them,
    quantize_plain quantizes bf16 weights)."""
    b = plan if isinstance(plan, Binding) else bind(plan)
    jax = _import_jax()
    H = b.hidden
    if not hasattr(x, "shape") or len(x.shape) < 1 or x.shape[-1] != H:
        raise ValueError("moegen: x must be [..., %d], not %s" % (H, list(getattr(x, "shape", [type(x).__name__]))))
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, H) if len(x.shape) != 2 else x
    ts = (router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, w1s, w2s)
    check_args(b.expect, x2, dict(zip(ORDER, ts)))
    tokens = x2.shape[0]
    if tokens == 0:   # moe_forward enqueues nothing for 0 tokens
        return jax.numpy.zeros(lead + (H,), x.dtype)
    if b.training:
        y = _trainable()(b, int(bool(recompute_u)), x2, ts)
    else:
        y = _forward(b, x2, ts)
    return y.reshape(lead + (H,)) if len(lead) != 1 else y


def pack_plain(plan, w1=None, w2=None, gate=None, up=None, b1=None, b2=None, shared_w1=None, shared_w2=None,
               w1_scale=None, w2_scale=None, shared_w1_scale=None, shared_w2_scale=None):
    """The packed weights from the plain layouts, with jax.numpy indexing
    (jit-able): w1 [E, 2F, H] (gate rows, then up rows) or gate and up
    [E, F, H]; w2 [E, H, F]; b1 [E, 2F] and b2 [E, H] with ffn_bias; a
    shared expert (spec shared.ffn = m·F) as shared_w1 [2mF, H] and
    shared_w2 [H, mF], split into the m slots after the routed experts as
    moe_plan_pack_shared splits them. Returns {"w1p", "w2"} and, with
    biases, {"b1p", "b2"}; the row order is the library's
    (Plan.w1_row_order).

    An fp8 plan (spec quant.weights = "fp8_e4m3") takes the weights as
    float8_e4m3fn with their float32 scales (w = e4m3 * scale, a
    checkpoint's weight_scale_inv), which stay in the checkpoint's row
    order: quant.scaling "block": w1_scale [E, 2F/128, H/128], w2_scale
    [E, H/128, F/128], shared_w1_scale [2mF/128, H/128], shared_w2_scale
    [H/128, mF/128]; "channel": w1_scale [E, 2F], w2_scale [E, H],
    shared_w1_scale [2mF], shared_w2_scale [H]; and returns "w1s" and
    "w2s" too (with gate and up, w1_scale is theirs concatenated)."""
    jax = _import_jax()
    jnp = jax.numpy
    E, F, H = plan.info.experts, plan.info.ffn, plan.info.hidden
    m = plan.tensors["w1p"][0][0] - E
    fp8 = plan.tensors["w1s"] is not None
    if (w1 is None) == (gate is None or up is None):
        raise ValueError("moegen: pass w1 [E, 2F, H] or gate and up [E, F, H], one of the two")
    if w1 is None:
        w1 = jnp.concatenate([gate, up], axis=1)
    want = {"w1": (w1, (E, 2 * F, H)), "w2": (w2, (E, H, F))}
    if m > 0:
        want.update(shared_w1=(shared_w1, (2 * m * F, H)), shared_w2=(shared_w2, (H, m * F)))
    if plan.tensors["b1p"] is not None:
        want.update(b1=(b1, (E, 2 * F)), b2=(b2, (E, H)))
    block = fp8 and len(plan.tensors["w1s"][0]) == 3
    B = 128 if block else 1
    sshape = lambda n, k, *lead: lead + ((n // B, k // B) if block else (n,))
    if fp8:
        want.update(w1_scale=(w1_scale, sshape(2 * F, H, E)), w2_scale=(w2_scale, sshape(H, F, E)))
        if m > 0:
            want.update(shared_w1_scale=(shared_w1_scale, sshape(2 * m * F, H)),
                        shared_w2_scale=(shared_w2_scale, sshape(H, m * F)))
    else:
        for name, t in (("w1_scale", w1_scale), ("w2_scale", w2_scale), ("shared_w1_scale", shared_w1_scale),
                        ("shared_w2_scale", shared_w2_scale)):
            if t is not None:
                raise ValueError("moegen: the spec takes no %s (its expert weights are not fp8)" % name)
    for name, (t, shape) in want.items():
        if t is None or tuple(t.shape) != shape:
            raise ValueError("moegen: %s must be %s, not %s" % (name, list(shape),
                                                                None if t is None else list(t.shape)))
        wdt = plan.tensors["x"][1] if name in ("b1", "b2") or not fp8 else \
            "fp32" if name.endswith("_scale") else "fp8_e4m3"
        if _dtype_name(t) != _DTYPES[wdt]:
            raise TypeError("moegen: %s must be %s, not %s" % (name, _DTYPES[wdt], _dtype_name(t)))
    order = jnp.asarray(plan.w1_row_order(), dtype=jnp.int32)
    if m > 0:   # slot E+j: gate rows jF..jF+F-1 and the matching up rows; w2 columns jF..jF+F-1
        w1 = jnp.concatenate([w1, shared_w1.reshape(2, m, F, H).transpose(1, 0, 2, 3).reshape(m, 2 * F, H)])
        w2 = jnp.concatenate([w2, shared_w2.reshape(H, m, F).transpose(1, 0, 2)])
    out = {"w1p": jnp.take(w1, order, axis=1), "w2": w2}
    if fp8:   # the scales keep the checkpoint's row order; a shared expert's split as its weights
        w1s, w2s = w1_scale, w2_scale
        if m > 0:
            s1 = shared_w1_scale.reshape((2, m, F // B) + shared_w1_scale.shape[1:])
            w1s = jnp.concatenate([w1s, jnp.swapaxes(s1, 0, 1).reshape((m, 2 * F // B) + shared_w1_scale.shape[1:])])
            if block:
                s2 = shared_w2_scale.reshape(H // B, m, F // B).transpose(1, 0, 2)
            else:   # one scale per row of H, the same for every slot
                s2 = jnp.broadcast_to(shared_w2_scale, (m, H))
            w2s = jnp.concatenate([w2s, s2])
        out.update(w1s=w1s, w2s=w2s)
    if plan.tensors["b1p"] is not None:
        out.update(b1p=jnp.take(b1, order, axis=1), b2=b2)
    return out


def _fp8_tables():
    """The quotients the quantizer needs, correctly rounded (NumPy's IEEE
    fp32 division, as the library's): a bf16 amax is m * 2^k with m = 128 ..
    255, so amax / 448 = (m / 448) * 2^k and 448 / amax = (448 / m) * 2^-k,
    the powers of two exact; and the amax floor's own pair. XLA may divide
    approximately (a reciprocal), so the quantizer never divides."""
    import numpy as np
    m = np.arange(128, 256, dtype=np.float32)
    floor = np.float32(1e-4)
    return (m / np.float32(448.0), np.float32(448.0) / m, floor, floor / np.float32(448.0),
            np.float32(448.0) / floor)


def quantize_weight(w, block):
    """e4m3 quantization of bf16 weights w [..., N, K] (jax.numpy,
    jit-able) by the library's rule (moe_plan_pack_quantize), bit for bit:
    block=True: one scale per 128 x 128 block, [..., N/128, K/128]; False:
    one per row, [..., N]; scale = amax / 448 (amax at least 1e-4),
    e4m3(w * (448 / amax)) rounded to nearest even. Returns
    (float8_e4m3fn [..., N, K], float32 scales)."""
    jax = _import_jax()
    jnp = jax.numpy
    if _dtype_name(w) != "bfloat16":
        raise TypeError("moegen: quantize_weight takes bfloat16 weights (the library's rule), not %s" % _dtype_name(w))
    *lead, N, K = w.shape
    lead = tuple(lead)
    wf = w.astype(jnp.float32)
    if block:
        blocks = wf.reshape(lead + (N // 128, 128, K // 128, 128))
        amax = jnp.max(jnp.abs(blocks), axis=(-3, -1))                          # [..., N/128, K/128]
    else:
        amax = jnp.max(jnp.abs(wf), axis=-1)                                    # [..., N]
    s_tab, m_tab, floor, s_floor, m_floor = _fp8_tables()
    bits = jax.lax.bitcast_convert_type(amax, jnp.uint32)   # a bf16 value: the low 16 bits are 0
    k = (bits >> 23).astype(jnp.int32) - 134                # amax = (128 + mantissa) * 2^k
    i = ((bits >> 16) & 0x7F).astype(jnp.int32)
    two = lambda e: jax.lax.bitcast_convert_type(((e + 127) << 23).astype(jnp.uint32), jnp.float32)
    low = amax < floor
    scale = jnp.where(low, s_floor, jnp.asarray(s_tab)[i] * two(k))
    mul = jnp.where(low, m_floor, jnp.asarray(m_tab)[i] * two(-k))
    if block:
        q = e4m3_round(blocks * mul[..., :, None, :, None]).reshape(lead + (N, K))
    else:
        q = e4m3_round(wf * mul[..., None])
    return q.astype(jnp.float8_e4m3fn), scale


def e4m3_round(v):
    """float32 v rounded to the nearest e4m3 value, ties to even, saturating
    at +-448 (PTX's cvt.rn.satfinite, the library's rule), as float32: the
    rounding done here (jnp.round, half to even, on the value's own
    quantum), so the cast to float8_e4m3fn that follows is exact whatever
    the backend's conversion does with ties."""
    jax = _import_jax()
    jnp = jax.numpy
    _, ex = jnp.frexp(v)                                   # |v| in [2^(ex-1), 2^ex)
    quantum = jnp.ldexp(jnp.float32(1.0), jnp.maximum(ex - 1, -6) - 3)   # 3 mantissa bits; subnormals below 2^-6
    return jnp.clip(jnp.round(v / quantum) * quantum, -448.0, 448.0)


def quantize_plain(plan, w1=None, w2=None, gate=None, up=None, b1=None, b2=None, shared_w1=None, shared_w2=None):
    """pack_plain for an fp8 plan from bf16 weights (its arguments without
    the scales): quantized with quantize_weight (the library's rule, per
    plain block: a shared expert's blocks are its slots' since F is a
    multiple of 128), then packed. Returns {"w1p", "w1s", "w2", "w2s"}
    (and the biases)."""
    jax = _import_jax()
    jnp = jax.numpy
    if plan.tensors["w1s"] is None:
        raise ValueError("moegen: quantize_plain takes an fp8 plan (spec quant.weights = \"fp8_e4m3\"); use pack_plain")
    block = len(plan.tensors["w1s"][0]) == 3
    if w1 is None and gate is not None and up is not None:
        w1 = jnp.concatenate([gate, up], axis=1)
    q = lambda t: (None, None) if t is None else quantize_weight(t, block)
    (w1q, w1s), (w2q, w2s), (sw1q, sw1s), (sw2q, sw2s) = q(w1), q(w2), q(shared_w1), q(shared_w2)
    return pack_plain(plan, w1=w1q, w2=w2q, b1=b1, b2=b2, shared_w1=sw1q, shared_w2=sw2q, w1_scale=w1s,
                      w2_scale=w2s, shared_w1_scale=sw1s, shared_w2_scale=sw2s)
