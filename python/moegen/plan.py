"""plan.py — a moegen plan from Python: the spec (a file, a dict of keys or
a folder from `moegen compile`) planned, its kernels compiled or loaded, and
moe_forward on raw device pointers. No torch here: moegen.torch builds on it."""
import array
import ctypes
import os
import shutil
from types import SimpleNamespace

from . import _lib
from .spec import write_spec

_CUDNN = {None: 0, "default": 0, "auto": 1, "on": 2, "off": 3}


class Plan:
    """A planned and compiled MoE layer.

    spec: a .moe file, a dict of spec keys, or (from_dir=True) a folder
    written by `moegen compile`. device: the CUDA device ordinal. cudnn:
    None (= $MOEGEN_CUDNN, else auto), "auto", "on" or "off". The CUDA
    context is the device's primary context (the one PyTorch uses)."""

    def __init__(self, spec, device=0, from_dir=False, cache_dir=None, tuning_path=None, cudnn=None,
                 templates_dir=None):
        if cudnn not in _CUDNN:
            raise ValueError("cudnn must be one of None, 'auto', 'on', 'off', not %r" % (cudnn,))
        if not isinstance(device, int) or isinstance(device, bool) or device < 0:
            raise ValueError("device must be a CUDA device ordinal (int >= 0), not %r" % (device,))
        if isinstance(spec, dict):
            if from_dir:
                raise ValueError("from_dir takes a folder written by `moegen compile`, not a dict of keys")
        elif not isinstance(spec, (str, os.PathLike)):
            raise TypeError("spec is a path or a dict of keys, not %s" % type(spec).__name__)
        self._handle = None
        self._on_close = []   # callables run by close() before the plan is destroyed (moegen.jax unbinds)
        lib = self._lib = _lib.library()
        enc = lambda s: None if s is None else os.fsencode(s)
        self._keep = opts = _lib.Options(templates_dir=enc(templates_dir), cache_dir=enc(cache_dir), device=device,
                                         cudnn=_CUDNN[cudnn], tuning_path=enc(tuning_path))
        path = write_spec(spec) if isinstance(spec, dict) else os.fspath(spec)
        try:
            handle = ctypes.c_void_p()
            create = lib.moe_plan_create_from_dir if from_dir else lib.moe_plan_create
            st = create(ctypes.byref(handle), os.fsencode(path), ctypes.byref(opts))
        finally:
            if isinstance(spec, dict):
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        if st != 0:
            err = _lib.fail(lib, st, "moe_plan_create(%s)" % ("dict of keys" if isinstance(spec, dict) else path))
            if isinstance(spec, dict):  # name the dict, not the removed file it was written to
                err.args = (str(err).replace(path, "<dict of keys>"),)
            raise err
        self._handle = handle
        self.device = device
        info = _lib.PlanInfo(struct_size=ctypes.sizeof(_lib.PlanInfo))  # every field mirrored, not moe.h's first layout
        st = lib.moe_plan_get_info(handle, ctypes.byref(info))
        if st != 0:
            raise _lib.fail(lib, st, "moe_plan_get_info")
        fields = {}
        for name, _ in info._fields_:
            v = getattr(info, name)
            if name == "kernels":
                v = tuple(k.decode() if k else None for k in v)
            elif isinstance(v, bytes):
                v = v.decode()
            fields[name] = v
        self.info = SimpleNamespace(**fields)
        self.tensors = {name: self._tensor(name) for name in _lib.TENSORS}

    def _tensor(self, name):
        rank, dims, dtype = ctypes.c_int(), (ctypes.c_int64 * 4)(), ctypes.c_char_p()
        st = self._lib.moe_plan_tensor(self._handle, name.encode(), ctypes.byref(rank), dims, ctypes.byref(dtype))
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_plan_tensor(%s)" % name)
        return (tuple(dims[:rank.value]), dtype.value.decode()) if rank.value else None

    @property
    def handle(self):
        if self._handle is None:
            raise ValueError("the plan is closed")
        return self._handle

    def workspace_size(self, tokens):
        """Workspace bytes for a forward of `tokens` tokens."""
        self._check_tokens(tokens)
        return self._lib.moe_plan_workspace_size(self.handle, tokens)

    def variants(self):
        """The plan's GEMM variants (docs/tuning.md, "Variants per call
        size"), by bucket: a list of SimpleNamespace(bucket, align, gemm_up,
        gemm_down) (bucket 0: the heuristics'). A forward of T tokens runs
        the one variant_for(T) names."""
        out = []
        for i in range(self._lib.moe_plan_variant_count(self.handle)):
            bucket, align, up, down = ctypes.c_int(), ctypes.c_int(), ctypes.c_char_p(), ctypes.c_char_p()
            st = self._lib.moe_plan_variant(self.handle, i, ctypes.byref(bucket), ctypes.byref(align),
                                            ctypes.byref(up), ctypes.byref(down))
            if st != 0:
                raise _lib.fail(self._lib, st, "moe_plan_variant")
            out.append(SimpleNamespace(bucket=bucket.value, align=align.value, gemm_up=up.value.decode(),
                                       gemm_down=down.value.decode()))
        return out

    def variant_for(self, tokens):
        """The index (into variants()) of the GEMM variant a forward of
        `tokens` tokens runs."""
        self._check_tokens(tokens)
        return self._lib.moe_plan_variant_for(self.handle, tokens)

    def route_fuse(self, tokens):
        """How a forward of `tokens` tokens routes (moe.h, moe_plan_route_fuse):
        0 route, permute_plan and permute_scatter launched apart; 1 the
        permute plan in route's last block; 2 the plan and the scatter there."""
        self._check_tokens(tokens)
        return self._lib.moe_plan_route_fuse(self.handle, tokens)

    def pdl(self, tokens):
        """Whether a forward of `tokens` tokens launches its kernels with
        launch overlap (moe.h, moe_plan_pdl): 1 yes (MOEGEN_PDL=on, or its
        GEMM variant's tuning entry says +pdl), 0 no."""
        self._check_tokens(tokens)
        return self._lib.moe_plan_pdl(self.handle, tokens)

    def _check_tokens(self, tokens):
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise ValueError("tokens must be an int >= 0, not %r" % (tokens,))
        if tokens > self.info.tokens:
            raise ValueError("%d tokens exceed the plan's capacity of %d (spec key tokens)" % (tokens, self.info.tokens))

    def w1_row_order(self):
        """The packed W1 layout as a row order: packed row j of an expert is
        plain row order[j] (plain: gate rows 0..F-1, then up rows), so
        w1p = w1[:, order, :] and b1p = b1[:, order]. The order is the
        library's own: moe_plan_pack_b1 applied to row numbers."""
        F2, E = 2 * self.info.ffn, self.info.experts
        if F2 > 0xFFFF:
            raise ValueError("2*ffn = %d does not fit the 16-bit row numbers this order is read with" % F2)
        plain = array.array("H", range(F2)) * E
        packed = array.array("H", bytes(2 * F2 * E))
        addr = lambda a: a.buffer_info()[0]
        st = self._lib.moe_plan_pack_b1(self.handle, addr(plain), addr(packed))
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_plan_pack_b1")
        return list(packed[:F2])

    def pack_async(self, tensor, srcs, first, count, dst, stream):
        """moe_plan_pack_async: pack `count` experts into slots first ..
        first + count - 1 of the packed tensor at device address dst, on
        stream. tensor: _lib.TENSOR_W1, _B1, _W2 or _B2; srcs: one (W2, b2)
        or two (W1, b1: gate, up) sources, each (address, expert stride, row
        stride, col stride) in 16-bit elements as moe_pack_src describes.
        Returns False when the plan's module has no pack kernel (a folder
        compiled before moegen emitted it); raises on any other error."""
        a = self._pack_args(tensor, srcs, first, count)
        st = self._lib.moe_plan_pack_async(self.handle, ctypes.byref(a), dst, stream)
        if st == 11:  # MOE_ERR_UNSUPPORTED
            return False
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_plan_pack_async")
        return True

    @staticmethod
    def _pack_args(tensor, srcs, first, count):
        a = _lib.PackArgs(tensor=tensor, first=first, count=count)
        for i, (ptr, e, r, c) in enumerate(srcs):
            a.src[i] = _lib.PackSrc(ptr, e, r, c)
        return a

    def pack_fp8_async(self, tensor, srcs, scale_srcs, first, count, dst, dst_scales, stream):
        """moe_plan_pack_fp8_async: fp8 weights as a checkpoint ships them
        (e4m3 W1 or W2, srcs in one-byte elements as pack_async's) and
        their fp32 scales (scale_srcs, in 4-byte elements: (address,
        expert, row block, column block) strides for "block" scaling,
        (address, expert, row, 0) for "channel") into slots first .. first
        + count - 1 of the packed e4m3 tensor at dst and its scales at
        dst_scales, on stream. Returns False when the plan's module has no
        fp8 pack kernels; raises on any other error."""
        a, s = self._pack_args(tensor, srcs, first, count), self._pack_args(tensor, scale_srcs, first, count)
        st = self._lib.moe_plan_pack_fp8_async(self.handle, ctypes.byref(a), ctypes.byref(s), dst, dst_scales, stream)
        if st == 11:  # MOE_ERR_UNSUPPORTED
            return False
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_plan_pack_fp8_async")
        return True

    def pack_quantize_async(self, tensor, srcs, first, count, dst, dst_scales, stream):
        """moe_plan_pack_quantize_async: bf16 W1 or W2 (srcs as pack_async's)
        quantized on the device into slots first .. first + count - 1 of the
        packed e4m3 tensor at dst and its fp32 scales at dst_scales, on
        stream. Returns False when the plan's module has no quantize kernel;
        raises on any other error."""
        a = self._pack_args(tensor, srcs, first, count)
        st = self._lib.moe_plan_pack_quantize_async(self.handle, ctypes.byref(a), dst, dst_scales, stream)
        if st == 11:  # MOE_ERR_UNSUPPORTED
            return False
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_plan_pack_quantize_async")
        return True

    def unpack_grad(self, tensor, src, dst, count, stream):
        """moe_plan_unpack_grad: the plain layout of the packed gradient at
        device address src (tensor _lib.TENSOR_W1: dw1p [count, 2F, H], fp32
        or, when info.weight_grad_bytes is 2, the dtype; _B1: db1p [count,
        2F], fp32) written to dst, on stream."""
        st = self._lib.moe_plan_unpack_grad(self.handle, tensor, src, dst, count, stream)
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_plan_unpack_grad")

    def forward(self, tokens, ptrs, workspace, stream):
        """moe_forward on raw device pointers (ints): ptrs maps the
        moe_forward_args names (x, router_w, ..., y) to addresses, workspace
        is workspace_size(tokens) bytes, 256-byte aligned; stream a
        CUstream/cudaStream_t as an int (0 = the legacy default stream).
        Enqueued; no synchronization."""
        a = _lib.ForwardArgs(tokens=tokens, workspace=workspace, **ptrs)
        st = self._lib.moe_forward(self.handle, ctypes.byref(a), stream)
        if st != 0:
            raise _lib.fail(self._lib, st, "moe_forward")

    def routing_errors(self, workspace, stream):
        """moe_plan_routing_errors: synchronize with stream and return how
        many of the last forward's topk_ids (router.select = "given") were
        outside 0..E-1 and dropped (0 for other plans). Raises nothing: a
        count above 0 means that forward's y left those entries out."""
        n = ctypes.c_longlong(0)
        self._lib.moe_plan_routing_errors(self.handle, workspace, stream, ctypes.byref(n))
        return n.value

    def close(self):
        """Destroy the plan (also on garbage collection), after running the
        callables given to on_close."""
        if self._handle is not None:
            while self._on_close:
                self._on_close.pop()()
            self._lib.moe_plan_destroy(self._handle)
            self._handle = None

    def on_close(self, fn):
        """Call fn() when the plan is closed, before it is destroyed (the
        bindings that hold its handle let go of it there)."""
        self._on_close.append(fn)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        i = getattr(self, "info", None)
        return "<moegen.Plan %s: E=%d top_k=%d H=%d F=%d tokens<=%d, %s>" % (
            i.name, i.experts, i.top_k, i.hidden, i.ffn, i.tokens, i.arch) if i else "<moegen.Plan (not created)>"
