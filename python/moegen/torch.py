"""moegen.torch — the layer as a PyTorch op and module.

    from moegen.torch import MoE
    moe = MoE("examples/specs/qwen3-30b-a3b.moe", device="cuda")
    moe.load_plain(router_w=wr, w1=w1, w2=w2)      # plain layouts, packed on the GPU
    y = moe(x)                                     # x [..., H], bf16 on cuda

The op is torch.ops.moegen.moe(x, router_w, w1p, w2, router_bias,
router_logit_bias, b1p, b2, shared_gate, plan) -> y, with tensors in moegen's packed
layouts (README.md, "Tensors") and `plan` the id of a registered Plan
(register_plan). It runs moe_forward on torch's current stream of x's
device with a workspace from torch's caching allocator, so it is
capturable in a CUDA graph, and has a fake (shape-only) implementation, so
torch.compile traces it without running it. It is differentiable when the
plan trains (spec key training = true): under grad it runs
moegen::moe_train (moe_forward_train: y and the saved region) and its
backward moegen::moe_backward (moe_backward: every gradient); for another
plan a backward through it raises.

The ops are C++ (python/csrc/moegen_torch.cpp, libmoegen_torch.so, built
by setup.py or python/build_torch.py against the installed torch) where
that library is found: $MOEGEN_TORCH_LIBRARY ("none": not loaded), else
the package's, else the clone's build/libmoegen_torch.so. Without it they
are defined here in Python through ctypes, with the same schemas, checks
and messages (NATIVE says which). The Python op's per-call host path is
kept short (test_torch_gpu.py measures both against a direct moe_forward):
an Autograd kernel that calls the CUDA kernel itself when it can
(autograd_kernel), one quick pass over the tensors' metadata (_fits), the
plan's workspace sizes cached, and moe_forward_args packed into a
per-thread buffer (_lib.packer)."""
import ctypes
import itertools
import os
import threading
import warnings
import weakref

import torch

from . import _lib
from .plan import Plan

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
           "fp8_e4m3": torch.float8_e4m3fn, "int32": torch.int32}
# the op's optional tensors, in its argument order
_OPTIONAL = ("router_bias", "router_logit_bias", "b1p", "b2", "shared_gate")
# the fp8 weights' scales, the op's trailing arguments (after plan)
_SCALES = ("w1s", "w2s")
# every tensor the op takes but x, in its argument order
ORDER = ("router_w", "w1p", "w2") + _OPTIONAL + _SCALES

_plans = {}
_ids = itertools.count(1)
_plans_lock = threading.Lock()


class _Entry:
    """What a call needs of a registered plan, looked up once."""

    def __init__(self, plan, recompute_u):
        self.plan, self.handle, self.lib = plan, plan.handle, plan._lib
        self.recompute_u = int(bool(recompute_u))
        self.training = self.lib.moe_plan_saved_size(self.handle, 1, 0) > 0
        self.capacity, self.hidden = plan.info.tokens, plan.info.hidden
        self.device, self.index = torch.device("cuda", plan.device), plan.device
        self.fp8 = plan.tensors["w1s"] is not None
        self.expect = {n: (torch.Size(t[0]), _DTYPES[t[1]]) if t else None for n, t in plan.tensors.items()}
        self.dtype = self.expect["x"][1]
        # moe_backward's dw1p and dw2: fp32, or the dtype (spec weight_grads = "dtype")
        self.wgrad_dtype = self.dtype if plan.info.weight_grad_bytes == 2 else torch.float32
        # the fast path's expectations, in the op's argument order: (shape, dtype) or None
        self.want = tuple(self.expect[n] for n in ORDER)
        self.ws = {}  # tokens -> workspace bytes

    def saved_size(self, tokens):
        return self.lib.moe_plan_saved_size(self.handle, tokens, self.recompute_u)


def register_plan(plan, recompute_u=False):
    """Make `plan` callable through the op; returns its id (the op's `plan`
    argument). recompute_u: a training plan's forward saves no U and its
    backward computes it again (moe_train_forward_args.recompute_u).
    unregister_plan(id) drops it (MoE does both; closing the plan does too)."""
    if not isinstance(plan, Plan):
        raise TypeError("register_plan takes a moegen.Plan, not %s" % type(plan).__name__)
    e = _Entry(plan, recompute_u)
    with _plans_lock:
        pid = next(_ids)
        if NATIVE is not None:
            err = ctypes.create_string_buffer(512)
            st = NATIVE.moegen_torch_register(pid, e.handle, e.index, e.recompute_u, err, len(err))
            if st != 0:
                raise _lib.MoegenError(st, "moegen_torch_register: %s" % err.value.decode(errors="replace"))
        _plans[pid] = e
    plan.on_close(lambda: unregister_plan(pid))
    return pid


def unregister_plan(pid):
    with _plans_lock:
        if NATIVE is not None:
            NATIVE.moegen_torch_unregister(pid)
        _plans.pop(pid, None)


def check_args(expect, capacity, device, x, tensors):
    """Raise a clear exception unless the op's tensors fit the plan: expect
    maps each name to (torch.Size, dtype) or None (the spec takes no such
    tensor), capacity is the most tokens, device the plan's torch.device;
    tensors maps the names other than x and y to a tensor or None. First
    x [tokens, H] with 0 <= tokens <= capacity, then every tensor's
    presence, dtype and shape, then its device and contiguity. An fp8
    plan's w1p and w2 are torch.float8_e4m3fn and its w1s and w2s float32
    scales (README.md, "FP8 weights")."""
    hx = expect["x"]
    if not isinstance(x, torch.Tensor):
        raise TypeError("moegen: x must be a tensor, not %s" % type(x).__name__)
    if x.dim() != 2 or x.shape[1] != hx[0][1]:
        raise ValueError("moegen: x must be [tokens, %d], not %s" % (hx[0][1], list(x.shape)))
    if x.shape[0] > capacity:
        raise ValueError("moegen: %d tokens; the plan takes 0 to %d (spec key tokens)" % (x.shape[0], capacity))
    given = [("x", x)] + list(tensors.items())
    for name, t in given:
        want = expect[name]
        if t is None:
            if want is not None:
                raise ValueError("moegen: the spec needs %s %s %s" % (name, str(want[1])[6:], list(want[0])))
            continue
        if want is None:
            raise ValueError("moegen: the spec takes no %s; pass None" % name)
        if not isinstance(t, torch.Tensor):
            raise TypeError("moegen: %s must be a tensor, not %s" % (name, type(t).__name__))
        if t.dtype != want[1]:
            raise TypeError("moegen: %s must be %s, not %s" % (name, want[1], t.dtype))
        if name != "x" and t.shape != want[0]:
            raise ValueError("moegen: %s must be %s, not %s" % (name, list(want[0]), list(t.shape)))
    for name, t in given:
        if t is None:
            continue
        if t.device != device:
            raise ValueError("moegen: %s is on %s; the plan runs on %s" % (name, t.device, device))
        if not t.is_contiguous():
            raise ValueError("moegen: %s must be contiguous" % name)


def _entry(plan):
    e = _plans.get(plan)
    if e is None:
        raise ValueError("moegen: no plan with id %r is registered (moegen.torch.register_plan)" % (plan,))
    return e


_SCHEMA_ARGS = ("Tensor x, Tensor router_w, Tensor w1p, Tensor w2, Tensor? router_bias, Tensor? router_logit_bias, "
                "Tensor? b1p, Tensor? b2, Tensor? shared_gate, int plan")
# moegen::moe alone takes the fp8 scales (fp8 plans never train)
SCHEMAS = {"moe": "moe(%s, Tensor? w1s=None, Tensor? w2s=None) -> Tensor" % _SCHEMA_ARGS,
           "moe_train": "moe_train(%s) -> (Tensor, Tensor)" % _SCHEMA_ARGS,
           "moe_backward": "moe_backward(Tensor dy, Tensor saved, %s) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
                           "Tensor, Tensor, Tensor)" % _SCHEMA_ARGS}


def native_path():
    """The C++ ops' library to load, or None: $MOEGEN_TORCH_LIBRARY ("none"
    = none), else the package's libmoegen_torch.so, else the clone's
    build/libmoegen_torch.so, where they exist."""
    env = os.environ.get("MOEGEN_TORCH_LIBRARY")
    if env:
        return None if env == "none" else env
    for p in (os.path.join(_lib.HERE, "libmoegen_torch.so"),
              os.path.join(os.path.dirname(_lib.REPO_LIBRARY), "libmoegen_torch.so")):
        if os.path.isfile(p):
            return p
    return None


def _load_native():
    """Load the C++ ops (after libmoegen, which they link) and return the
    library for its plan table's C functions; None when there is none to
    load, or (with a warning) when the one found does not load (built for
    another torch: unresolved symbols). One named in $MOEGEN_TORCH_LIBRARY
    must load. Loading registers the ops, so one that loads and is of
    another version, or links another libmoegen, is an error (LibraryError),
    never a fallback."""
    path = native_path()
    if path is None:
        return None
    lib = _lib.library()
    try:
        torch.ops.load_library(path)
    except OSError as e:
        if os.environ.get("MOEGEN_TORCH_LIBRARY"):
            raise _lib.LibraryError("$MOEGEN_TORCH_LIBRARY=%s did not load: %s" % (path, e)) from None
        warnings.warn("moegen: the C++ ops at %s did not load (%s); the Python ops are used (rebuild it against "
                      "this torch with python/build_torch.py)" % (path, e))
        return None
    native = ctypes.CDLL(path)
    for name in ("moegen_torch_version", "moegen_torch_moe_forward", "moegen_torch_register",
                 "moegen_torch_unregister"):
        if not hasattr(native, name):
            raise _lib.LibraryError("%s lacks %s: it is not this package's C++ ops library" % (path, name))
    native.moegen_torch_version.restype = ctypes.c_char_p
    native.moegen_torch_moe_forward.restype = ctypes.c_void_p
    version = native.moegen_torch_version().decode()
    if version != lib.moe_version().decode():
        raise _lib.LibraryError("%s is version %s, libmoegen (%s) %s: rebuild it (python/build_torch.py)"
                                % (path, version, lib.path, lib.moe_version().decode()))
    if native.moegen_torch_moe_forward() != ctypes.cast(lib.moe_forward, ctypes.c_void_p).value:
        raise _lib.LibraryError("%s uses another libmoegen than %s (the library it links, libmoegen.so.0, must be "
                                "the one moegen loaded)" % (path, lib.path))
    native.moegen_torch_register.restype = ctypes.c_int
    native.moegen_torch_register.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                             ctypes.c_char_p, ctypes.c_size_t]
    native.moegen_torch_unregister.restype = None
    native.moegen_torch_unregister.argtypes = [ctypes.c_int64]
    native.path = path
    return native


# NATIVE: the C++ ops' library (its plan table's functions; .path), or None
# where the ops are the Python ones below.
NATIVE = _load_native()
_lib_def = torch.library.Library("moegen", "FRAGMENT" if NATIVE is not None else "DEF")
if NATIVE is None:
    for _s in SCHEMAS.values():
        _lib_def.define(_s)

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream   # the fast path, no Stream object
except AttributeError:  # pragma: no cover
    _raw_stream = lambda index: torch.cuda.current_stream(index).cuda_stream


_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _fits(e, x, ts):
    """Whether the op's tensors fit the plan: check_args's conditions as one
    quick pass over the metadata (the per-call path); check_args says what
    does not fit."""
    if x.dtype != e.dtype or x.dim() != 2 or x.device != e.device or not x.is_contiguous():
        return False
    T, H = x.shape
    if H != e.hidden or T > e.capacity:
        return False
    for t, want in zip(ts, e.want):
        if t is None:
            if want is not None:
                return False
        elif (want is None or t.dtype != want[1] or t.device != e.device or t.shape != want[0]
              or not t.is_contiguous()):
            return False
    return True


_args = threading.local()   # each thread's moe_forward_args, filled per call (moe_forward reads it at once)


def _forward_args():
    """This thread's (ForwardArgs, pack): pack(tokens, x, router_w, ...,
    shared_gate), addresses as ints (0 = none), fills it (_lib.packer)."""
    try:
        return _args.v
    except AttributeError:
        _args.v = _lib.packer(_lib.ForwardArgs)
        return _args.v


def _moe_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s=None, w2s=None,
              topk_ids=None, topk_weights=None, router_x=None, router_expert_scale=None):
    """moegen::moe's CUDA kernel; also moegen::moe_given's and moegen::moe_ext's (topk_ids, topk_weights: given
    routing's, checked there by check_given; router_x, router_expert_scale: checked by check_ext)."""
    e = _plans.get(plan) or _entry(plan)
    ts = (router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, w1s, w2s)
    if not _fits(e, x, ts):
        check_args(e.expect, e.capacity, e.device, x, dict(zip(ORDER, ts)))
    tokens = x.shape[0]
    ws_bytes = e.ws.get(tokens)
    if ws_bytes is None:
        ws_bytes = e.ws[tokens] = e.lib.moe_plan_workspace_size(e.handle, tokens)
    y = torch.empty_like(x)
    if tokens == 0:  # nothing to enqueue (moe_forward would enqueue nothing either)
        return y
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=e.device)  # caching allocator: 512-byte aligned
    a, pack = _forward_args()
    pack(tokens, x.data_ptr(), 0 if router_w is None else router_w.data_ptr(),
         0 if router_bias is None else router_bias.data_ptr(),
         0 if router_logit_bias is None else router_logit_bias.data_ptr(), w1p.data_ptr(),
         0 if b1p is None else b1p.data_ptr(), w2.data_ptr(), 0 if b2 is None else b2.data_ptr(), y.data_ptr(),
         ws.data_ptr(), 0 if shared_gate is None else shared_gate.data_ptr(), 0 if w1s is None else w1s.data_ptr(),
         0 if w2s is None else w2s.data_ptr(), 0 if topk_ids is None else topk_ids.data_ptr(),
         0 if topk_weights is None else topk_weights.data_ptr(), 0 if router_x is None else router_x.data_ptr(),
         0 if router_expert_scale is None else router_expert_scale.data_ptr())
    index = e.index
    if _current_device() == index:
        st = e.lib.moe_forward(e.handle, a, _raw_stream(index))
    else:  # moe_forward makes the plan's device's context current; torch's current device is put back after
        with torch.cuda.device(index):
            st = e.lib.moe_forward(e.handle, a, _raw_stream(index))
    if st != 0:
        raise _lib.fail(e.lib, st, "moe_forward")
    return y


def _moe_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s=None, w2s=None):
    e = _plans.get(plan)
    if e is not None and (x.dim() != 2 or x.shape[1] != e.hidden or x.dtype != e.dtype):
        raise ValueError("moegen: x must be %s [tokens, %d], not %s %s" % (e.dtype, e.hidden, x.dtype,
                                                                           list(x.shape)))
    return torch.empty_like(x)


def _train_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan):
    """y and the saved region, moe_plan_saved_size(tokens) bytes: the token
    count is made concrete (a symbolic one is specialized)."""
    y = _moe_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan)
    return y, x.new_empty(_entry(plan).saved_size(int(x.shape[0])), dtype=torch.uint8)


def _grads_like(x, router_w, w1p, w2, router_logit_bias, b1p, b2, shared_gate, wgrad_dtype=torch.float32):
    """moe_backward's outputs, empty: dx like x, gradients shaped like the
    tensors given, [0] for those absent: dw1p and dw2 of wgrad_dtype (the
    plan's: fp32, or x's dtype with spec weight_grads = "dtype"), the others
    fp32."""
    g = lambda t, dt=torch.float32: x.new_empty(t.shape if t is not None else (0,), dtype=dt)
    return (torch.empty_like(x), g(router_w), g(router_logit_bias), g(w1p, wgrad_dtype), g(b1p), g(w2, wgrad_dtype),
            g(b2), g(shared_gate))


def _backward_fake(dy, saved, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan):
    e = _plans.get(plan) or _entry(plan)
    return _grads_like(x, router_w, w1p, w2, router_logit_bias, b1p, b2, shared_gate, e.wgrad_dtype)


def _not_cuda(x):
    raise ValueError("moegen: the layer runs on CUDA tensors; x is on %s" % x.device)


def _checked(x, ts, plan):
    """The plan's entry once the op's tensors (x, ts in the op's order, no
    scales: the training ops') fit it."""
    e = _plans.get(plan) or _entry(plan)
    ts = tuple(ts) + (None, None)
    if not _fits(e, x, ts):
        check_args(e.expect, e.capacity, e.device, x, dict(zip(ORDER, ts)))
    return e


def _on_device(e, fn):
    """fn(stream) with the plan's device current for torch too (libmoegen
    makes the plan's context current; torch's device is put back)."""
    if _current_device() == e.index:
        return fn(_raw_stream(e.index))
    with torch.cuda.device(e.index):
        return fn(_raw_stream(e.index))


def _addr(t):
    return None if t is None else t.data_ptr()


def _train_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, router_x=None,
                router_expert_scale=None):
    """moegen::moe_train's CUDA kernel; router_x, router_expert_scale: router.input = "separate"'s and
    router.expert_scale's (_TrainExt, checked there by check_ext)."""
    ts = (router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate)
    e = _checked(x, ts, plan)
    if not e.training:
        raise ValueError("moegen: moe_train needs a plan whose spec has training = true")
    tokens = x.shape[0]
    y = torch.empty_like(x)
    saved = torch.empty(e.saved_size(tokens), dtype=torch.uint8, device=e.device)
    if tokens == 0:
        return y, saved
    ws = torch.empty(e.lib.moe_plan_train_workspace_size(e.handle, tokens), dtype=torch.uint8, device=e.device)
    a = _lib.TrainForwardArgs(fwd=_lib.ForwardArgs(
        tokens, _addr(x), _addr(router_w), _addr(router_bias), _addr(router_logit_bias), _addr(w1p), _addr(b1p),
        _addr(w2), _addr(b2), _addr(y), _addr(ws), _addr(shared_gate), router_x=_addr(router_x),
        router_expert_scale=_addr(router_expert_scale)), saved=_addr(saved), recompute_u=e.recompute_u)
    st = _on_device(e, lambda s: e.lib.moe_forward_train(e.handle, ctypes.byref(a), s))
    if st != 0:
        raise _lib.fail(e.lib, st, "moe_forward_train")
    return y, saved


def _backward_cuda(dy, saved, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan,
                   router_x=None, router_expert_scale=None):
    """moegen::moe_backward's CUDA kernel: its eight gradients; given router_x or router_expert_scale
    (_TrainExt) two more, d router_x (x's dtype and shape, or None) and d router_expert_scale (or None)."""
    ts = (router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate)
    e = _checked(x, ts, plan)
    if not e.training:
        raise ValueError("moegen: moe_backward needs a plan whose spec has training = true")
    tokens = x.shape[0]
    if dy.shape != x.shape or dy.dtype != x.dtype or dy.device != x.device or not dy.is_contiguous():
        raise ValueError("moegen: dy must be contiguous %s %s on %s, not %s %s on %s" % (
            str(x.dtype)[6:], list(x.shape), x.device, str(dy.dtype)[6:], list(dy.shape), dy.device))
    need = e.saved_size(tokens)
    if (saved.dtype != torch.uint8 or saved.dim() != 1 or saved.device != x.device or saved.numel() < need
            or not saved.is_contiguous()):
        raise ValueError("moegen: saved must be moe_train's uint8 [%d] for %d tokens" % (need, tokens))
    g = _grads_like(x, router_w, w1p, w2, router_logit_bias, b1p, b2, shared_gate, e.wgrad_dtype)
    ext = router_x is not None or router_expert_scale is not None
    drx = None if router_x is None else torch.empty_like(router_x)
    des = None if router_expert_scale is None else torch.empty_like(router_expert_scale)
    if ext:
        g = tuple(g) + (drx, des)
    if tokens == 0:  # nothing enqueued: the gradients of an empty batch are zeros
        for t in g[1:]:
            if t is not None:
                t.zero_()
        return g
    ws = torch.empty(e.lib.moe_plan_backward_workspace_size(e.handle, tokens, e.recompute_u), dtype=torch.uint8,
                     device=e.device)
    dx, d_router_w, d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate = g[:8]
    opt = lambda t, present: t.data_ptr() if present is not None else None
    a = _lib.BackwardArgs(
        tokens=tokens, recompute_u=e.recompute_u, saved=_addr(saved), x=_addr(x), router_w=_addr(router_w),
        w1p=_addr(w1p), b1p=_addr(b1p), w2=_addr(w2), b2=_addr(b2), dy=_addr(dy), workspace=_addr(ws), accumulate=0,
        dx=_addr(dx), d_router_w=_addr(d_router_w), d_logit_bias=opt(d_logit_bias, router_logit_bias),
        dw1p=_addr(dw1p), db1p=opt(db1p, b1p), dw2=_addr(dw2), db2=opt(db2, b2), shared_gate=_addr(shared_gate),
        d_shared_gate=opt(d_shared_gate, shared_gate), router_x=_addr(router_x),
        router_expert_scale=_addr(router_expert_scale), d_router_x=_addr(drx), d_expert_scale=_addr(des))
    st = _on_device(e, lambda s: e.lib.moe_backward(e.handle, ctypes.byref(a), s))
    if st != 0:
        raise _lib.fail(e.lib, st, "moe_backward")
    return g


_NO_BACKWARD = ("moegen: this plan has no backward (its spec lacks training = true): run the layer under "
                "torch.no_grad(), with parameters that do not require grad, or plan it with training = true")


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset


def autograd_kernel(op, backend, kernel, with_grad):
    """An Autograd kernel for `op` (an OpOverload) whose kernel for dispatch
    key `backend` is the Python function `kernel`. Where no gradient is
    wanted and nothing sits between autograd and that kernel (no fake or
    proxy tensors, no dispatch mode, no functionalization: below autograd
    the keyset's first key, past the ADInplaceOrView fallthrough, is
    `backend`), it calls `kernel` itself: one trip into Python per call
    instead of torch.library.register_autograd's wrapper and a redispatch.
    Otherwise it redispatches below autograd, and where a gradient is wanted
    it returns with_grad(redispatch, *args), redispatch(*args) being the op
    below autograd."""
    def redispatch(keyset):
        def call(*args):
            with torch._C._AutoDispatchBelowAutograd():
                return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)
        return call

    direct = set()   # raw keysets below autograd seen to lead straight to `backend`

    def autograd(keyset, *args):
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return with_grad(redispatch(keyset), *args)
        below = keyset & _AFTER_AUTOGRAD
        raw = below.raw_repr()
        if raw in direct:
            return kernel(*args)
        if below.remove(torch._C.DispatchKey.ADInplaceOrView).highestPriorityTypeId() == backend:
            direct.add(raw)
            return kernel(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(below, *args)

    return autograd


class _NoBackward(torch.autograd.Function):
    """The layer under autograd for a plan without training: the forward,
    and a backward that raises."""

    @staticmethod
    def forward(ctx, below, *args):
        return below(*args)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(_NO_BACKWARD)


class _Train(torch.autograd.Function):
    """The layer under autograd for a training plan: moegen::moe_train's y,
    and a backward through moegen::moe_backward. Gradients come back in the
    parameters' dtypes (moe_backward's weight gradients are fp32, or with
    spec weight_grads = "dtype" the parameters' own, which need no cast);
    router_bias gets none (the routing choice is a constant of the
    backward). The C++ ops' Train in moegen_torch.cpp is the same."""

    @staticmethod
    def forward(ctx, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan):
        y, saved = torch.ops.moegen.moe_train.default(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2,
                                                      shared_gate, plan)
        ctx.save_for_backward(saved, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate)
        ctx.plan = plan
        return y

    @staticmethod
    def backward(ctx, dy):
        saved, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate = ctx.saved_tensors
        dx, d_router_w, d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate = torch.ops.moegen.moe_backward.default(
            dy.to(x.dtype).contiguous(), saved, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2,
            shared_gate, ctx.plan)
        as_ = lambda g, like: None if like is None else g.to(like.dtype)
        return (dx, as_(d_router_w, router_w), as_(dw1p, w1p), as_(dw2, w2), None, as_(d_logit_bias, router_logit_bias),
                as_(db1p, b1p), as_(db2, b2), as_(d_shared_gate, shared_gate), None)


class _TrainExt(torch.autograd.Function):
    """_Train for a plan with the router's own input or per-expert scales
    (router.input = "separate", router.expert_scale: Gemma 4's router),
    which the fixed-schema training ops do not carry: the same training
    forward and backward through libmoegen, called from Python directly
    (eager; not an op torch.compile traces), with router_x's and the
    scales' gradients too."""

    @staticmethod
    def forward(ctx, x, router_x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate,
                router_expert_scale, plan):
        e = _plans.get(plan) or _entry(plan)
        check_ext(e, x, router_x, router_expert_scale)
        y, saved = _train_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan,
                               router_x, router_expert_scale)
        ctx.save_for_backward(saved, x, router_x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2,
                              shared_gate, router_expert_scale)
        ctx.plan = plan
        return y

    @staticmethod
    def backward(ctx, dy):
        saved, x, rx, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, es = ctx.saved_tensors
        g = _backward_cuda(dy.to(x.dtype).contiguous(), saved, x, router_w, w1p, w2, router_bias, router_logit_bias,
                           b1p, b2, shared_gate, ctx.plan, rx, es)
        dx, d_router_w, d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate, drx, des = g
        as_ = lambda g, like: None if like is None else g.to(like.dtype)
        return (dx, drx, as_(d_router_w, router_w), as_(dw1p, w1p), as_(dw2, w2), None,
                as_(d_logit_bias, router_logit_bias), as_(db1p, b1p), as_(db2, b2), as_(d_shared_gate, shared_gate),
                as_(des, es), None)


def _with_grad(below, *args):
    e = _plans.get(args[9])   # plan (w1s and w2s after it)
    if e is not None and e.training:
        return _Train.apply(*args[:10])   # a training plan has no fp8 scales
    return _NoBackward.apply(below, *args)


if NATIVE is None:
    _lib_def.impl("moe", _moe_cuda, "CUDA")
    _lib_def.impl("moe_train", _train_cuda, "CUDA")
    _lib_def.impl("moe_backward", _backward_cuda, "CUDA")
    for _name in ("moe", "moe_train"):
        _lib_def.impl(_name, lambda x, *args: _not_cuda(x), "CPU")
    _lib_def.impl("moe_backward", lambda dy, saved, x, *args: _not_cuda(x), "CPU")
    _lib_def.impl("moe", autograd_kernel(torch.ops.moegen.moe.default, torch._C.DispatchKey.CUDA, _moe_cuda,
                                         _with_grad), "Autograd", with_keyset=True)
for _name, _fake in (("moe", _moe_fake), ("moe_train", _train_fake), ("moe_backward", _backward_fake)):
    torch.library.register_fake("moegen::" + _name, _fake, lib=_lib_def)

moe = torch.ops.moegen.moe


# ---- given routing (router.select = "given"): moegen::moe_given ------------------
# The caller's experts (topk_ids, int32 [tokens, top_k]) and, with router.score
# = "given", their weights (topk_weights, fp32 [tokens, top_k]; router_w then
# None). A Python op in either mode (the C++ library does not define it), with
# the fake for torch.compile; the plans it runs are inference-only.
_GIVEN_SCHEMA = ("moe_given(Tensor x, Tensor? router_w, Tensor w1p, Tensor w2, Tensor? router_bias, "
                 "Tensor? router_logit_bias, Tensor? b1p, Tensor? b2, Tensor? shared_gate, int plan, Tensor topk_ids, "
                 "Tensor? topk_weights=None, Tensor? w1s=None, Tensor? w2s=None) -> Tensor")
_lib_def.define(_GIVEN_SCHEMA)


def check_given(e, x, topk_ids, topk_weights):
    """Raise unless the plan routes by the caller's ids and topk_ids (and
    topk_weights, where its score is "given") are [tokens, top_k] of x's
    tokens, int32 (float32), contiguous on the plan's device."""
    if e.expect.get("topk_ids") is None:
        raise ValueError("moegen: the plan picks its own experts (spec router.select = \"topk\"): call moegen::moe, "
                         "without topk_ids")
    K = e.expect["topk_ids"][0][1]
    for name, t, dt, needed in (("topk_ids", topk_ids, torch.int32, True),
                                ("topk_weights", topk_weights, torch.float32, e.expect.get("topk_weights") is not None)):
        if t is None:
            if needed:
                raise ValueError("moegen: the spec has router.score = \"given\": topk_weights float32 [tokens, %d] "
                                 "is required" % K)
            continue
        if not needed:
            raise ValueError("moegen: the spec weights the given experts by its router (router.score is not "
                             "\"given\"): pass topk_weights=None")
        if not isinstance(t, torch.Tensor):
            raise TypeError("moegen: %s must be a tensor, not %s" % (name, type(t).__name__))
        if t.dtype != dt:
            raise TypeError("moegen: %s must be %s, not %s" % (name, dt, t.dtype))
        if t.dim() != 2 or t.shape[0] != x.shape[0] or t.shape[1] != K:
            raise ValueError("moegen: %s must be [tokens, %d] = %s, not %s" % (name, K, [x.shape[0], K],
                                                                             list(t.shape)))
        if t.device != e.device:
            raise ValueError("moegen: %s is on %s; the plan runs on %s" % (name, t.device, e.device))
        if not t.is_contiguous():
            raise ValueError("moegen: %s must be contiguous" % name)


def _given_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, topk_ids,
                topk_weights=None, w1s=None, w2s=None):
    check_given(_plans.get(plan) or _entry(plan), x, topk_ids, topk_weights)
    return _moe_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s, w2s,
                     topk_ids, topk_weights)


def _given_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, topk_ids,
                topk_weights=None, w1s=None, w2s=None):
    return _moe_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan)


_lib_def.impl("moe_given", _given_cuda, "CUDA")
_lib_def.impl("moe_given", lambda x, *args, **kw: _not_cuda(x), "CPU")
_lib_def.impl("moe_given", autograd_kernel(torch.ops.moegen.moe_given.default, torch._C.DispatchKey.CUDA,
                                           _given_cuda, lambda below, *args: _NoBackward.apply(below, *args)),
              "Autograd", with_keyset=True)
torch.library.register_fake("moegen::moe_given", _given_fake, lib=_lib_def)
moe_given = torch.ops.moegen.moe_given


# ---- the router's own input and per-expert scales: moegen::moe_ext ----------------
# router.input = "separate" (router_x [tokens, HR], x's dtype: what the logits
# read) and router.expert_scale (router_expert_scale float32 [E], the final
# weights' per-expert factor): Gemma 4's router. moe_ext takes every optional
# input of the forward, given routing's too; a Python op in either mode, with
# the fake for torch.compile; the plans it runs are inference-only.
_EXT_SCHEMA = ("moe_ext(Tensor x, Tensor? router_w, Tensor w1p, Tensor w2, Tensor? router_bias, "
               "Tensor? router_logit_bias, Tensor? b1p, Tensor? b2, Tensor? shared_gate, int plan, "
               "Tensor? topk_ids=None, Tensor? topk_weights=None, Tensor? router_x=None, "
               "Tensor? router_expert_scale=None, Tensor? w1s=None, Tensor? w2s=None) -> Tensor")
_lib_def.define(_EXT_SCHEMA)


def check_ext(e, x, router_x, router_expert_scale):
    """Raise unless router_x (x's dtype, x's rows at the router's width) and router_expert_scale
    (float32 [E]) are given exactly where the plan's spec takes them,
    contiguous on the plan's device."""
    for name, t, key in (("router_x", router_x, "router.input = \"separate\""),
                         ("router_expert_scale", router_expert_scale, "router.expert_scale")):
        want = e.expect.get(name)
        if t is None:
            if want is not None:
                raise ValueError("moegen: the spec has %s: %s %s is required" % (
                    key, name, "[tokens, %d]" % want[0][1] if name == "router_x" else list(want[0])))
            continue
        if want is None:
            raise ValueError("moegen: the spec takes no %s (it has no %s); pass None" % (name, key))
        if not isinstance(t, torch.Tensor):
            raise TypeError("moegen: %s must be a tensor, not %s" % (name, type(t).__name__))
        if t.dtype != want[1]:
            raise TypeError("moegen: %s must be %s, not %s" % (name, want[1], t.dtype))
        # router_x: x's rows at the router's width (router.hidden, else x's own: the plan's [tokens, HR])
        shape = list(x.shape[:-1]) + [want[0][1]] if name == "router_x" else list(want[0])
        if list(t.shape) != shape:
            raise ValueError("moegen: %s must be %s, not %s" % (name, shape, list(t.shape)))
        if t.device != e.device:
            raise ValueError("moegen: %s is on %s; the plan runs on %s" % (name, t.device, e.device))
        if not t.is_contiguous():
            raise ValueError("moegen: %s must be contiguous" % name)


def _ext_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, topk_ids=None,
              topk_weights=None, router_x=None, router_expert_scale=None, w1s=None, w2s=None):
    e = _plans.get(plan) or _entry(plan)
    if e.expect.get("topk_ids") is not None or topk_ids is not None or topk_weights is not None:
        check_given(e, x, topk_ids, topk_weights)
    check_ext(e, x, router_x, router_expert_scale)
    return _moe_cuda(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s, w2s,
                     topk_ids, topk_weights, router_x, router_expert_scale)


def _ext_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, topk_ids=None,
              topk_weights=None, router_x=None, router_expert_scale=None, w1s=None, w2s=None):
    return _moe_fake(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan)


_lib_def.impl("moe_ext", _ext_cuda, "CUDA")
_lib_def.impl("moe_ext", lambda x, *args, **kw: _not_cuda(x), "CPU")
_lib_def.impl("moe_ext", autograd_kernel(torch.ops.moegen.moe_ext.default, torch._C.DispatchKey.CUDA,
                                         _ext_cuda, lambda below, *args: _NoBackward.apply(below, *args)),
              "Autograd", with_keyset=True)
torch.library.register_fake("moegen::moe_ext", _ext_fake, lib=_lib_def)
moe_ext = torch.ops.moegen.moe_ext


def _cuda_index(device):
    d = torch.device(device if device is not None else "cuda")
    if d.type != "cuda":
        raise ValueError("moegen: the layer runs on a CUDA device, not %s" % d)
    return d.index if d.index is not None else torch.cuda.current_device()


def pack_jobs(E, F, m, gate, up, w2, b1=None, b2=None, shared_w1=None, shared_w2=None):
    """The moe_plan_pack_async calls that pack the plain tensors, as
    (tensor, sources, first slot, count): each source (address, expert,
    row, col strides in elements) as moe_pack_src reads it, from the
    tensors' own strides. gate, up [E, F, H]; w2 [E, H, F]; b1 [E, 2F] and
    b2 [E, H] or None; m > 0: shared_w1 [2mF, H] and shared_w2 [H, mF]
    go to slots E..E+m-1 (slot E+j: gate and up rows jF.., down columns
    jF..)."""
    s3 = lambda t: (t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))
    s2 = lambda t: (t.data_ptr(), t.stride(0), t.stride(1), 0)
    jobs = [(_lib.TENSOR_W1, [s3(gate), s3(up)], 0, E), (_lib.TENSOR_W2, [s3(w2)], 0, E)]
    if m > 0:
        r, c = shared_w1.stride()
        jobs.append((_lib.TENSOR_W1, [(shared_w1.data_ptr(), F * r, r, c),
                                      (shared_w1[m * F:].data_ptr(), F * r, r, c)], E, m))
        r, c = shared_w2.stride()
        jobs.append((_lib.TENSOR_W2, [(shared_w2.data_ptr(), F * c, r, c)], E, m))
    if b1 is not None:
        jobs += [(_lib.TENSOR_B1, [s2(b1[:, :F]), s2(b1[:, F:])], 0, E), (_lib.TENSOR_B2, [s2(b2)], 0, E)]
    return jobs


def scale_jobs(E, F, m, block, gate_s, up_s, w2_s, shared_w1_s=None, shared_w2_s=None):
    """The scale sources of moe_plan_pack_fp8_async for pack_jobs' W1 and
    W2 jobs, keyed (tensor, first slot): each source (address, expert, row
    block, column block strides) in float32 elements from the tensors' own
    strides. block: gate_s, up_s [E, F/128, H/128], w2_s [E, H/128, F/128],
    m > 0: shared_w1_s [2mF/128, H/128], shared_w2_s [H/128, mF/128]; else
    ("channel") gate_s, up_s [E, F], w2_s [E, H], shared_w1_s [2mF],
    shared_w2_s [H] (the m slots share the rows' scales), column stride 0."""
    B = 128 if block else 1
    s = (lambda t: (t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))) if block else \
        (lambda t: (t.data_ptr(), t.stride(0), t.stride(1), 0))
    jobs = {(_lib.TENSOR_W1, 0): [s(gate_s), s(up_s)], (_lib.TENSOR_W2, 0): [s(w2_s)]}
    if m > 0:
        r = shared_w1_s.stride(0)
        c = shared_w1_s.stride(1) if block else 0
        jobs[(_lib.TENSOR_W1, E)] = [(shared_w1_s.data_ptr(), F // B * r, r, c),
                                     (shared_w1_s[m * F // B:].data_ptr(), F // B * r, r, c)]
        if block:   # slot j: column blocks jF/128..
            r, c = shared_w2_s.stride()
            jobs[(_lib.TENSOR_W2, E)] = [(shared_w2_s.data_ptr(), F // B * c, r, c)]
        else:       # one scale per row of H, the same for every slot
            jobs[(_lib.TENSOR_W2, E)] = [(shared_w2_s.data_ptr(), 0, shared_w2_s.stride(0), 0)]
    return jobs


def _take(name, t, shape, dtype, dev):
    """A weight argument of MoE.load_plain / load_fp8: a tensor of exactly
    dtype and shape (never converted), moved to dev."""
    if t is None:
        raise ValueError("moegen: the spec needs %s %s %s" % (name, str(dtype)[6:], list(shape)))
    if not isinstance(t, torch.Tensor):
        raise TypeError("moegen: %s must be a tensor, not %s" % (name, type(t).__name__))
    if t.dtype != dtype:
        raise TypeError("moegen: %s must be %s, not %s" % (name, dtype, t.dtype))
    if tuple(t.shape) != tuple(shape):
        raise ValueError("moegen: %s must be %s, not %s" % (name, list(shape), list(t.shape)))
    return t.to(dev)


def _rows(t, flat):
    """A per-token tensor of MoE.forward ([..., n]) as the op's rows [tokens, n] (None stays None)."""
    return t.reshape(-1, t.shape[-1]) if flat and t is not None else t


def _refuse(**given):
    """Arguments of MoE.load_plain / load_fp8 the spec has no place for."""
    for name, t in given.items():
        if t is not None:
            raise ValueError("moegen: the spec takes no %s" % name)


_NO_FP8_PACK = ("moegen: the plan's module has no fp8 pack kernels (a folder compiled before moegen emitted them): "
                "compile it again")


class MoE(torch.nn.Module):
    """The layer as a module: the plan (from a spec file, a dict of keys or,
    with from_dir=True, a folder from `moegen compile`) and its parameters
    in moegen's packed layouts, uninitialized until load_plain() or
    load_state_dict(). forward(x) takes x [..., H] of up to the spec's
    tokens rows. Plan options (cache_dir, tuning_path, cudnn, ...) pass
    through to moegen.Plan.

    A plan whose spec has training = true makes the layer trainable: its
    parameters require grad (router_bias excepted: the routing choice gets
    no gradient) and forward under grad runs moe_forward_train, its backward
    moe_backward; w1p.grad and b1p.grad are in the packed row order
    (unpack_grad gives the plain one). recompute_u = True saves the up
    projection's output U for less memory and computes it again in the
    backward. Other plans' parameters do not require grad.

    With fp8 expert weights (spec quant.weights = "fp8_e4m3") w1p and w2
    are torch.float8_e4m3fn and w1s, w2s their float32 scales (README.md,
    "FP8 weights"): load_plain quantizes bf16 weights on the GPU, load_fp8
    packs a checkpoint's e4m3 weights with their weight_scale_inv."""

    def __init__(self, spec, device=None, recompute_u=False, **plan_options):
        super().__init__()
        index = _cuda_index(device)
        with torch.cuda.device(index):
            torch.empty(1, device="cuda")   # the device's primary context, which libmoegen shares
            self.plan = Plan(spec, device=index, **plan_options)
        self.plan_id = register_plan(self.plan, recompute_u)
        weakref.finalize(self, unregister_plan, self.plan_id)
        self.trains = _plans[self.plan_id].training
        dev = torch.device("cuda", index)
        for name in ("router_w", "router_bias", "router_logit_bias", "w1p", "b1p", "w2", "b2", "shared_gate", "w1s",
                     "w2s", "router_expert_scale"):
            t = self.plan.tensors[name]
            param = None if t is None else torch.nn.Parameter(
                torch.empty(t[0], dtype=_DTYPES[t[1]], device=dev), requires_grad=self.trains and name != "router_bias")
            self.register_parameter(name, param)
        self._w1_order = None
        self._given = self.plan.tensors["topk_ids"] is not None   # router.select = "given": moegen::moe_given
        # the router's own input or per-expert scales (Gemma 4): moegen::moe_ext
        self._ext = self.plan.tensors["router_x"] is not None or self.plan.tensors["router_expert_scale"] is not None

    def unpack_grad(self, g, name="w1p"):
        """The plain layout of a packed gradient g of w1p [S, 2F, H] (gate
        rows 0..F-1, then up rows; fp32, or the dtype with spec weight_grads
        = "dtype") or b1p [S, 2F] (name "b1p", fp32), through
        moe_plan_unpack_grad on torch's current stream; a new tensor. (w2's
        and b2's gradients are plain already.)"""
        tensor = {"w1p": _lib.TENSOR_W1, "b1p": _lib.TENSOR_B1}.get(name)
        p = getattr(self, name, None) if tensor is not None else None
        if p is None:
            raise ValueError("moegen: unpack_grad takes the gradient of w1p or b1p (of a spec that has it), not %r"
                             % (name,))
        dt = torch.float32
        if name == "w1p" and self.plan.info.weight_grad_bytes == 2:
            dt = p.dtype  # spec weight_grads = "dtype"
        if not isinstance(g, torch.Tensor) or g.dtype != dt or g.shape != p.shape or \
                g.device != p.device or not g.is_contiguous():
            raise ValueError("moegen: unpack_grad takes a contiguous %s %s on %s" % (str(dt)[6:], list(p.shape),
                                                                                      p.device))
        out = torch.empty_like(g)
        with torch.cuda.device(g.device):
            self.plan.unpack_grad(tensor, g.data_ptr(), out.data_ptr(), g.shape[0],
                                  torch.cuda.current_stream(g.device).cuda_stream)
        return out

    def extra_repr(self):
        i = self.plan.info
        return "%s: E=%d, top_k=%d, H=%d, F=%d, tokens<=%d, %s" % (i.name, i.experts, i.top_k, i.hidden, i.ffn,
                                                                   i.tokens, i.arch)

    def forward(self, x, topk_ids=None, topk_weights=None, router_x=None):
        """y for x [..., H]; with given routing (spec router.select =
        "given") topk_ids [..., top_k] int32 are the experts of each token,
        and with router.score = "given" topk_weights [..., top_k] float32
        their weights (moegen::moe_given); with router.input = "separate"
        router_x [..., HR] (x's dtype; HR = the spec's router.hidden, else
        H) is what the router's logits read (moegen::moe_ext, as for
        router.expert_scale)."""
        H = self.plan.info.hidden
        if x.shape[-1] != H:
            raise ValueError("moegen: x must be [..., %d], not %s" % (H, list(x.shape)))
        flat = x.dim() != 2   # x [tokens, H] goes in as it is: no reshape either way
        p = self._parameters  # one dict, not Module.__getattr__ per parameter
        xs = x.reshape(-1, H) if flat else x
        if getattr(self, "_ext", False) and getattr(self, "trains", False) and torch.is_grad_enabled():
            if topk_ids is not None or topk_weights is not None:
                raise NotImplementedError("moegen: training with given ids and the router's own input or scales "
                                          "runs through the C API (moe_forward_train), not MoE.forward")
            y = _TrainExt.apply(xs, _rows(router_x, flat), p["router_w"], p["w1p"], p["w2"], p["router_bias"],
                                p["router_logit_bias"], p["b1p"], p["b2"], p["shared_gate"],
                                p.get("router_expert_scale"), self.plan_id)
        elif router_x is not None or getattr(self, "_ext", False):
            y = moe_ext(xs, p["router_w"], p["w1p"], p["w2"], p["router_bias"], p["router_logit_bias"], p["b1p"],
                        p["b2"], p["shared_gate"], self.plan_id, _rows(topk_ids, flat), _rows(topk_weights, flat),
                        _rows(router_x, flat), p.get("router_expert_scale"), p.get("w1s"), p.get("w2s"))
        elif topk_ids is not None or topk_weights is not None or getattr(self, "_given", False):
            y = moe_given(xs, p["router_w"], p["w1p"], p["w2"], p["router_bias"], p["router_logit_bias"], p["b1p"],
                          p["b2"], p["shared_gate"], self.plan_id, _rows(topk_ids, flat), _rows(topk_weights, flat),
                          p.get("w1s"), p.get("w2s"))
        else:
            y = moe(xs, p["router_w"], p["w1p"], p["w2"], p["router_bias"], p["router_logit_bias"], p["b1p"], p["b2"],
                    p["shared_gate"], self.plan_id, p.get("w1s"), p.get("w2s"))
        return y.reshape(x.shape) if flat else y

    def w1_order(self):
        """The packed row order as a device index tensor (Plan.w1_row_order)."""
        if self._w1_order is None:
            self._w1_order = torch.tensor(self.plan.w1_row_order(), dtype=torch.long, device=self.w1p.device)
        return self._w1_order

    @torch.no_grad()
    def load_plain(self, router_w, w1=None, w2=None, gate=None, up=None, b1=None, b2=None, router_bias=None,
                   router_logit_bias=None, shared_w1=None, shared_w2=None, shared_gate=None, router_expert_scale=None):
        """Set the parameters from the plain layouts, packing on the GPU:
        w1 [E, 2F, H] (gate rows, then up rows) or gate and up [E, F, H]
        each; w2 [E, H, F]; b1 [E, 2F] and b2 [E, H] with ffn_bias;
        router_w [E + Z, H] (or [E + Z, router.hidden]); the router biases fp32 [E + Z] (Z = the spec's
        zero_experts, 0 mostly: the router scores them too); with a shared expert
        (spec shared.ffn = F_s = m·F) shared_w1 [2F_s, H] (gate rows, then
        up), shared_w2 [H, F_s], and shared_gate [H] where shared.gate =
        "sigmoid", split into the m weight slots after the routed experts as
        moe_plan_pack_shared splits them; router_expert_scale float32 [E]
        with router.expert_scale (Gemma 4's per_expert_scale). Any strides (a transposed
        checkpoint tensor is a view, not a copy): the library's device pack
        (moe_plan_pack_async) reads them as they are, on torch's current
        stream. Tensors may be on any device (they are moved to the layer's);
        dtypes are checked, never converted. A single-device plan only."""
        info = self.plan.info
        if info.world != 1:
            raise NotImplementedError("moegen: load_plain packs a single-device plan; on a mesh, pack the held "
                                      "experts with Plan.pack_async")
        E, F, H = info.experts, info.ffn, info.hidden
        m = self.w1p.shape[0] - E                        # the shared expert's slots
        dev, dt = self.w1p.device, _DTYPES[self.plan.tensors["x"][1]]   # fp8 plans: bf16 weights, quantized here

        def take(name, t, shape, dtype=dt):
            return _take(name, t, shape, dtype, dev)

        if (w1 is None) == (gate is None or up is None):
            raise ValueError("moegen: pass w1 [E, 2F, H] or gate and up [E, F, H], one of the two")
        if w1 is not None:
            w1 = take("w1", w1, (E, 2 * F, H))
            gate, up = w1[:, :F], w1[:, F:]
        else:
            gate, up = take("gate", gate, (E, F, H)), take("up", up, (E, F, H))
        w2 = take("w2", w2, (E, H, F))
        if m > 0:
            shared_w1 = take("shared_w1", shared_w1, (2 * m * F, H))
            shared_w2 = take("shared_w2", shared_w2, (H, m * F))
        else:
            _refuse(shared_w1=shared_w1, shared_w2=shared_w2)
        if self.b1p is not None:
            b1, b2 = take("b1", b1, (E, 2 * F)), take("b2", b2, (E, H))
        else:
            _refuse(b1=b1, b2=b2)
        for name, t in (("router_w", router_w), ("router_bias", router_bias),
                        ("router_logit_bias", router_logit_bias), ("shared_gate", shared_gate),
                        ("router_expert_scale", router_expert_scale)):
            p = getattr(self, name)
            if p is None:
                _refuse(**{name: t})
            else:
                p.copy_(take(name, t, p.shape, p.dtype))

        jobs = pack_jobs(E, F, m, gate, up, w2, b1, b2, shared_w1, shared_w2)
        dst = {_lib.TENSOR_W1: self.w1p, _lib.TENSOR_W2: self.w2, _lib.TENSOR_B1: self.b1p, _lib.TENSOR_B2: self.b2}
        scales = {_lib.TENSOR_W1: self.w1s, _lib.TENSOR_W2: self.w2s}
        with torch.cuda.device(dev):
            stream = torch.cuda.current_stream(dev).cuda_stream
            for tensor, srcs, first, count in jobs:
                if self.w1s is not None and tensor in scales:   # fp8: quantized on the device
                    if not self.plan.pack_quantize_async(tensor, srcs, first, count, dst[tensor].data_ptr(),
                                                         scales[tensor].data_ptr(), stream):
                        raise NotImplementedError(_NO_FP8_PACK)
                elif not self.plan.pack_async(tensor, srcs, first, count, dst[tensor].data_ptr(), stream):
                    if self.w1s is not None:
                        raise NotImplementedError(_NO_FP8_PACK)
                    self._pack_by_indexing(gate, up, w2, b1, b2, shared_w1, shared_w2)
                    break
        return self

    @torch.no_grad()
    def load_fp8(self, router_w, w1=None, w1_scale=None, w2=None, w2_scale=None, gate=None, gate_scale=None, up=None,
                 up_scale=None, b1=None, b2=None, router_bias=None, router_logit_bias=None, shared_w1=None,
                 shared_w1_scale=None, shared_w2=None, shared_w2_scale=None, shared_gate=None,
                 router_expert_scale=None):
        """Set the parameters of an fp8 plan from fp8 weights as checkpoints
        ship them (DeepSeek-V3, Qwen3-FP8: torch.float8_e4m3fn weights and
        float32 weight_scale_inv, w = e4m3 * scale), packing on the GPU
        (moe_plan_pack_fp8_async): the weights as load_plain's (w1 [E, 2F,
        H] or gate and up [E, F, H]; w2 [E, H, F]; shared_w1 [2F_s, H],
        shared_w2 [H, F_s]), each with its scales: quant.scaling "block":
        one per 128 x 128 block, w1_scale [E, 2F/128, H/128] (gate_scale,
        up_scale [E, F/128, H/128]), w2_scale [E, H/128, F/128],
        shared_w1_scale [2F_s/128, H/128], shared_w2_scale [H/128, F_s/128];
        "channel": one per output row, w1_scale [E, 2F], gate_scale and
        up_scale [E, F], w2_scale [E, H], shared_w1_scale [2F_s],
        shared_w2_scale [H]. Biases, router and shared_gate as load_plain's
        (bf16 / float32), router_expert_scale as load_plain's. Any strides; tensors may be on any device."""
        info = self.plan.info
        if self.w1s is None:
            raise ValueError("moegen: load_fp8 takes the weights of an fp8 plan (spec quant.weights = \"fp8_e4m3\"); "
                             "this plan's are %s: use load_plain" % self.w1p.dtype)
        if info.world != 1:
            raise NotImplementedError("moegen: load_fp8 packs a single-device plan")
        E, F, H = info.experts, info.ffn, info.hidden
        m = self.w1p.shape[0] - E
        dev, f8, f32 = self.w1p.device, torch.float8_e4m3fn, torch.float32
        block = self.w1s.dim() == 3   # [S, 2F/128, H/128]; "channel": [S, 2F]
        B = 128 if block else 1

        def sshape(n, k, *lead):   # the scales of an [n, k] weight
            return lead + ((n // B, k // B) if block else (n,))

        def take(name, t, shape, dtype):
            return _take(name, t, shape, dtype, dev)

        if (w1 is None) == (gate is None or up is None):
            raise ValueError("moegen: pass w1 [E, 2F, H] or gate and up [E, F, H], one of the two")
        if w1 is not None:
            w1 = take("w1", w1, (E, 2 * F, H), f8)
            w1_scale = take("w1_scale", w1_scale, sshape(2 * F, H, E), f32)
            gate, up = w1[:, :F], w1[:, F:]
            gate_scale, up_scale = w1_scale[:, :F // B], w1_scale[:, F // B:]
        else:
            gate, up = take("gate", gate, (E, F, H), f8), take("up", up, (E, F, H), f8)
            gate_scale = take("gate_scale", gate_scale, sshape(F, H, E), f32)
            up_scale = take("up_scale", up_scale, sshape(F, H, E), f32)
        w2 = take("w2", w2, (E, H, F), f8)
        w2_scale = take("w2_scale", w2_scale, sshape(H, F, E), f32)
        if m > 0:
            shared_w1 = take("shared_w1", shared_w1, (2 * m * F, H), f8)
            shared_w2 = take("shared_w2", shared_w2, (H, m * F), f8)
            shared_w1_scale = take("shared_w1_scale", shared_w1_scale, sshape(2 * m * F, H), f32)
            shared_w2_scale = take("shared_w2_scale", shared_w2_scale, sshape(H, m * F), f32)
        else:
            _refuse(shared_w1=shared_w1, shared_w2=shared_w2, shared_w1_scale=shared_w1_scale,
                   shared_w2_scale=shared_w2_scale)
        bt = _DTYPES[self.plan.tensors["x"][1]]
        if self.b1p is not None:
            b1, b2 = take("b1", b1, (E, 2 * F), bt), take("b2", b2, (E, H), bt)
        else:
            _refuse(b1=b1, b2=b2)
        for name, t in (("router_w", router_w), ("router_bias", router_bias),
                        ("router_logit_bias", router_logit_bias), ("shared_gate", shared_gate),
                        ("router_expert_scale", router_expert_scale)):
            p = getattr(self, name)
            if p is None:
                _refuse(**{name: t})
            else:
                p.copy_(take(name, t, p.shape, p.dtype))

        jobs = pack_jobs(E, F, m, gate, up, w2, b1, b2, shared_w1, shared_w2)
        sjobs = scale_jobs(E, F, m, block, gate_scale, up_scale, w2_scale, shared_w1_scale, shared_w2_scale)
        dst = {_lib.TENSOR_W1: self.w1p, _lib.TENSOR_W2: self.w2, _lib.TENSOR_B1: self.b1p, _lib.TENSOR_B2: self.b2}
        scales = {_lib.TENSOR_W1: self.w1s, _lib.TENSOR_W2: self.w2s}
        with torch.cuda.device(dev):
            stream = torch.cuda.current_stream(dev).cuda_stream
            for tensor, srcs, first, count in jobs:
                if tensor in scales:
                    ok = self.plan.pack_fp8_async(tensor, srcs, sjobs[(tensor, first)], first, count,
                                                  dst[tensor].data_ptr(), scales[tensor].data_ptr(), stream)
                else:
                    ok = self.plan.pack_async(tensor, srcs, first, count, dst[tensor].data_ptr(), stream)
                if not ok:
                    raise NotImplementedError(_NO_FP8_PACK)
        return self

    def _pack_by_indexing(self, gate, up, w2, b1, b2, shared_w1, shared_w2):
        """load_plain's packing where the plan's module has no pack kernel (a
        folder compiled before moegen emitted it): torch indexing in the
        library's row order (Plan.w1_row_order)."""
        E, F, H = self.plan.info.experts, self.plan.info.ffn, self.plan.info.hidden
        m = self.w1p.shape[0] - E
        w1 = torch.cat([gate, up], dim=1)
        if m > 0:  # slot E+j: gate rows jF..jF+F-1 and the matching up rows; w2 columns jF..jF+F-1
            w1 = torch.cat([w1, shared_w1.reshape(2, m, F, H).transpose(0, 1).reshape(m, 2 * F, H)])
            w2 = torch.cat([w2, shared_w2.reshape(H, m, F).permute(1, 0, 2)])
        self.w1p.copy_(w1.index_select(1, self.w1_order()))
        self.w2.copy_(w2)
        if self.b1p is not None:
            self.b1p.copy_(b1.index_select(1, self.w1_order()))
            self.b2.copy_(b2)
