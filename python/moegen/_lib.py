"""_lib.py — finding and loading libmoegen, checking it, and the ctypes
mirrors of moe.h's structs.

The library is, in order: $MOEGEN_LIBRARY; the libmoegen.so installed inside
this package (pip install); the repository's build/libmoegen.so when the
package is used from a clone (python/ on sys.path). Loading it checks its
version against the package's and every ctypes structure below, field by
field, against the library's own layout table (moe_abi_sizeof,
moe_abi_field: runtime/abi.c), so a struct changed in moe.h and not here is
an error naming the field, never a wrong offset."""
import ctypes
import functools
import os
import struct
import threading

from ._version import __version__

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_LIBRARY = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "libmoegen.so")

c_int, c_void_p, c_char_p, c_size_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t


class MoegenError(RuntimeError):
    """A libmoegen call failed; .status is the moe_status code, str() has
    the library's detailed message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class LibraryError(ImportError):
    """libmoegen could not be found or loaded, or does not match this package."""


# ---- the mirrors (moe.h), checked against the library at load ------------
class Options(ctypes.Structure):
    # struct_size 0 (as ctypes zero-fills) is moe.h's first layout, the one mirrored here
    _fields_ = [("struct_size", c_size_t), ("templates_dir", c_char_p), ("cache_dir", c_char_p), ("device", c_int),
                ("rank", c_int), ("nccl_comm", c_void_p), ("cudnn", c_int), ("cudnn_path", c_char_p), ("tuning_path", c_char_p)]


class ForwardArgs(ctypes.Structure):
    _fields_ = [("tokens", c_int), ("x", c_void_p), ("router_w", c_void_p), ("router_bias", c_void_p),
                ("router_logit_bias", c_void_p), ("w1p", c_void_p), ("b1p", c_void_p), ("w2", c_void_p),
                ("b2", c_void_p), ("y", c_void_p), ("workspace", c_void_p), ("shared_gate", c_void_p),
                ("w1s", c_void_p), ("w2s", c_void_p), ("topk_ids", c_void_p), ("topk_weights", c_void_p),
                ("router_x", c_void_p), ("router_expert_scale", c_void_p)]


class TrainForwardArgs(ctypes.Structure):
    _fields_ = [("fwd", ForwardArgs), ("saved", c_void_p), ("recompute_u", c_int)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [("tokens", c_int), ("recompute_u", c_int), ("saved", c_void_p), ("x", c_void_p),
                ("router_w", c_void_p), ("w1p", c_void_p), ("b1p", c_void_p), ("w2", c_void_p), ("b2", c_void_p),
                ("dy", c_void_p), ("workspace", c_void_p), ("accumulate", c_int), ("dx", c_void_p),
                ("d_router_w", c_void_p), ("d_logit_bias", c_void_p), ("dw1p", c_void_p), ("db1p", c_void_p),
                ("dw2", c_void_p), ("db2", c_void_p), ("shared_gate", c_void_p), ("d_shared_gate", c_void_p),
                ("router_x", c_void_p), ("router_expert_scale", c_void_p), ("d_router_x", c_void_p),
                ("d_expert_scale", c_void_p)]


class PlanInfo(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("hash", c_char_p), ("arch", c_char_p),
                ("experts", c_int), ("top_k", c_int),
                ("hidden", c_int), ("ffn", c_int), ("tokens", c_int), ("dtype_bytes", c_int), ("align", c_int),
                ("cache_hit", c_int), ("kernels", c_char_p * 6), ("world", c_int), ("rank", c_int), ("ep", c_int),
                ("ep_rank", c_int), ("fsdp", c_int), ("fsdp_rank", c_int), ("stored", c_int), ("held", c_int),
                ("dispatch_capacity", c_int), ("cudnn_version", c_int), ("gather_bytes", ctypes.c_longlong),
                ("route_fuse", c_int), ("pdl", c_int), ("gather", c_int), ("pair_clusters", c_int),
                ("weight_grad_bytes", c_int), ("backward_kernels", c_char_p * 4)]


class PackSrc(ctypes.Structure):
    _fields_ = [("ptr", c_void_p), ("expert", ctypes.c_int64), ("row", ctypes.c_int64), ("col", ctypes.c_int64)]


class PackArgs(ctypes.Structure):
    _fields_ = [("tensor", c_int), ("src", PackSrc * 2), ("first", c_int), ("count", c_int)]


def packer(mirror):
    """(args, pack): an instance of the ctypes structure `mirror` over its own
    buffer, and pack(*values) that writes its fields in order with one
    struct.pack_into (ints for int and pointer fields, 0 for NULL): the
    per-call way to fill it, about four times quicker than the constructor.
    The format comes from the mirror's own offsets and sizes, which
    check_layout holds to the library's."""
    codes = {ctypes.sizeof(c_int): "i", 8: "Q"}
    fmt, at = "=", 0
    for name, ctype in mirror._fields_:
        f = getattr(mirror, name)
        if ctype not in (c_int, c_void_p) or f.size not in codes:
            raise TypeError("packer: %s.%s is not an int or a pointer" % (mirror.__name__, name))
        fmt += "%dx" % (f.offset - at) if f.offset > at else ""
        fmt += codes[f.size] if ctype is c_void_p else "i"
        at = f.offset + f.size
    buf = bytearray(ctypes.sizeof(mirror))
    args = mirror.from_buffer(buf)
    return args, functools.partial(struct.Struct(fmt).pack_into, buf, 0)


# moe_tensor: the packed tensors
TENSOR_W1, TENSOR_B1, TENSOR_W2, TENSOR_B2 = 0, 1, 2, 3

MIRRORS = {"moe_options": Options, "moe_forward_args": ForwardArgs, "moe_plan_info": PlanInfo,
           "moe_pack_src": PackSrc, "moe_pack_args": PackArgs, "moe_train_forward_args": TrainForwardArgs,
           "moe_backward_args": BackwardArgs}

# The forward's tensors, moe_forward_args' names, in its order (w1s, w2s: the
# fp8 weights' scales, absent from other plans; topk_ids, topk_weights: given
# routing's, likewise; router_x, router_expert_scale: router.input =
# "separate"'s and router.expert_scale's).
TENSORS = ("x", "router_w", "router_bias", "router_logit_bias", "w1p", "b1p", "w2", "b2", "y", "shared_gate", "w1s",
           "w2s", "topk_ids", "topk_weights", "router_x", "router_expert_scale")

# ---- the functions used, with their C types -------------------------------
_SIGNATURES = {
    "moe_version": (c_char_p, []),
    "moe_abi_sizeof": (c_size_t, [c_char_p]),
    "moe_abi_field": (c_char_p, [c_char_p, c_int, ctypes.POINTER(c_size_t), ctypes.POINTER(c_size_t)]),
    "moe_plan_create": (c_int, [ctypes.POINTER(c_void_p), c_char_p, ctypes.POINTER(Options)]),
    "moe_plan_create_from_dir": (c_int, [ctypes.POINTER(c_void_p), c_char_p, ctypes.POINTER(Options)]),
    "moe_plan_destroy": (None, [c_void_p]),
    "moe_plan_workspace_size": (c_size_t, [c_void_p, c_int]),
    "moe_plan_get_info": (c_int, [c_void_p, ctypes.POINTER(PlanInfo)]),
    "moe_plan_variant_count": (c_int, [c_void_p]),
    "moe_plan_variant": (c_int, [c_void_p, c_int, ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                 ctypes.POINTER(c_char_p), ctypes.POINTER(c_char_p)]),
    "moe_plan_variant_for": (c_int, [c_void_p, c_int]),
    "moe_plan_route_fuse": (c_int, [c_void_p, c_int]),
    "moe_plan_pdl": (c_int, [c_void_p, c_int]),
    "moe_plan_routing_errors": (c_int, [c_void_p, c_void_p, c_void_p, ctypes.POINTER(ctypes.c_longlong)]),
    "moe_plan_tensor": (c_int, [c_void_p, c_char_p, ctypes.POINTER(c_int), ctypes.POINTER(ctypes.c_int64),
                                ctypes.POINTER(c_char_p)]),
    "moe_plan_pack_b1": (c_int, [c_void_p, c_void_p, c_void_p]),
    "moe_plan_pack_async": (c_int, [c_void_p, ctypes.POINTER(PackArgs), c_void_p, c_void_p]),
    "moe_plan_pack_fp8_async": (c_int, [c_void_p, ctypes.POINTER(PackArgs), ctypes.POINTER(PackArgs), c_void_p,
                                        c_void_p, c_void_p]),
    "moe_plan_pack_quantize_async": (c_int, [c_void_p, ctypes.POINTER(PackArgs), c_void_p, c_void_p, c_void_p]),
    "moe_forward": (c_int, [c_void_p, ctypes.POINTER(ForwardArgs), c_void_p]),
    "moe_forward_train": (c_int, [c_void_p, ctypes.POINTER(TrainForwardArgs), c_void_p]),
    "moe_backward": (c_int, [c_void_p, ctypes.POINTER(BackwardArgs), c_void_p]),
    "moe_plan_saved_size": (c_size_t, [c_void_p, c_int, c_int]),
    "moe_plan_backward_workspace_size": (c_size_t, [c_void_p, c_int, c_int]),
    "moe_plan_train_workspace_size": (c_size_t, [c_void_p, c_int]),
    "moe_plan_unpack_grad": (c_int, [c_void_p, c_int, c_void_p, c_void_p, c_int, c_void_p]),
    "moe_status_string": (c_char_p, [c_int]),
    "moe_last_error": (c_char_p, []),
}


def check_layout(lib, mirrors=MIRRORS):
    """Raise LibraryError unless every mirror matches the library's layout
    of its struct: the same fields in the same order at the same offsets
    with the same sizes, and the same total size."""
    problems = []
    for cname, mirror in mirrors.items():
        size = lib.moe_abi_sizeof(cname.encode())
        if size == 0:
            problems.append("%s: the library does not describe it" % cname)
            continue
        theirs = []
        off, sz = c_size_t(), c_size_t()
        while True:
            name = lib.moe_abi_field(cname.encode(), len(theirs), ctypes.byref(off), ctypes.byref(sz))
            if name is None:
                break
            theirs.append((name.decode(), off.value, sz.value))
        ours = [(f[0], getattr(mirror, f[0]).offset, getattr(mirror, f[0]).size) for f in mirror._fields_]
        for i in range(max(len(ours), len(theirs))):
            a = ours[i] if i < len(ours) else None
            b = theirs[i] if i < len(theirs) else None
            if a != b:
                fmt = lambda f: "missing" if f is None else "%s at offset %d, %d bytes" % f
                problems.append("%s field %d: the package has %s, the library %s" % (cname, i, fmt(a), fmt(b)))
                break
        if ctypes.sizeof(mirror) != size:
            problems.append("%s: %d bytes in the package, %d in the library" % (cname, ctypes.sizeof(mirror), size))
    if problems:
        raise LibraryError("libmoegen's structs differ from this package's mirrors (moe.h changed without "
                           "python/moegen/_lib.py):\n  " + "\n  ".join(problems))


def candidates():
    """The paths tried for libmoegen, in order."""
    env = os.environ.get("MOEGEN_LIBRARY")
    if env:
        return [env]  # named explicitly: nothing else is tried
    return [os.path.join(HERE, "libmoegen.so"), REPO_LIBRARY]


def load(path=None):
    """Load libmoegen from path (else the first of candidates() that
    exists), declare its functions and check its version and struct layouts.
    Raises LibraryError with the reason."""
    paths = [path] if path else candidates()
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        raise LibraryError("libmoegen.so not found (tried %s); build it with `make` in the repository, install "
                           "the package with `pip install ./python`, or name it in $MOEGEN_LIBRARY"
                           % ", ".join(paths))
    try:
        lib = ctypes.CDLL(found[0])
    except OSError as e:
        raise LibraryError("libmoegen at %s did not load: %s" % (found[0], e)) from None
    missing = [n for n in _SIGNATURES if not hasattr(lib, n)]
    if missing:
        raise LibraryError("%s lacks %s: it is older than this package (%s)" % (found[0], ", ".join(missing),
                                                                                __version__))
    for name, (res, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, argtypes
    version = lib.moe_version().decode()
    if version != __version__:
        raise LibraryError("%s is version %s, this package %s: rebuild or reinstall one of them"
                           % (found[0], version, __version__))
    check_layout(lib)
    lib.path = found[0]
    return lib


_lock = threading.Lock()
_lib = None


def library():
    """The process's libmoegen, loaded and checked on first use."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = load()
    return _lib


def fail(lib, status, what):
    """A MoegenError for status from call `what`, with the library's message."""
    detail = lib.moe_last_error().decode(errors="replace")
    return MoegenError(status, "%s: %s%s" % (what, lib.moe_status_string(status).decode(),
                                             ": " + detail if detail else ""))
