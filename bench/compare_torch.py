#!/usr/bin/env python3
"""compare_torch.py — moegen against PyTorch on the same inputs, in one process.

usage: python3 bench/compare_torch.py SPEC [--tokens N]... [--iters N] [--graph] [--backward]
                                     [--flush write|clean|none]

For each token count:
  * moegen: the whole layer through libmoegen (build/libmoegen.so, via ctypes
    with the moegen package's mirrors of moe.h, python/moegen/_lib.py),
    with per-kernel times from CUDA events recorded between its kernels;
  * the peer GEMMs: torch._grouped_mm for the up projection followed by a
    separate SiLU*mul, and torch._grouped_mm for the down projection, on the
    same expert-sorted rows (from the same routing counts);
  * the peer layer: an eager PyTorch MoE layer (router matmul, softmax or
    sigmoid top-k, sort, grouped GEMMs, SiLU*mul, weighted scatter-add);
  * ceilings: dense bf16 torch.matmul 8192^3 and a device copy.
Each time is the median of --iters runs after warm-up, with an L2 flush
before each run (--flush, below). Inputs are random (never zeros). Prints
a table of times and ratios; only PyTorch-supported router kinds are
reproduced in the eager peer (softmax/sigmoid top-k, no groups:
group-limited specs are timed with plain top-k in the peer, which is
cheaper, and marked so).

--graph adds, per token count, the layers replayed from CUDA graphs as
servers run decode steps: moegen's moe_forward captured on torch's stream,
and the eager peer layer captured likewise (its counts through index_add_,
which needs no host synchronization, instead of bincount), beside the
roofline floor: the touched experts' weights, x, router weights and y read
or written once at the copy bandwidth measured here, or the FLOPs at the
dense matmul rate, whichever is longer.

An fp8 spec (quant.weights = "fp8_e4m3", examples/specs/fp8/) is compared
instead against torch._scaled_grouped_mm (e4m3 in, bf16 out, rowwise
scales: one per token row over all of K and one per weight output row, the
peer's recipe, coarser than moegen's 1x128 / 128x128 blocks) on the same
expert-sorted rows, the peer's inputs quantized beforehand (its GEMM alone)
or in the row (its up projection with SiLU*mul and the re-quantization of
h, as moegen's fused epilogue does); moegen's weights are the same random
bf16 weights quantized by moe_plan_pack_quantize_async. Both layers'
errors are printed against a bf16 layer in fp32 (torch, h and the down
output rounded to bf16 as moegen's bf16 layer does) on moegen's own
routing (read from its workspace), so routing ties do not count.

--flush picks the L2 flush before each timed run, as moe_bench's does:
clean (the default) writes 256 MiB, then reads another 256 MiB
(torch.sum), so the write's dirty lines are written back during the flush
and L2 ends holding clean lines, as a decode step leaves it; write writes
512 MiB (the only flush before --flush: L2 left full of dirty lines,
whose write-backs the next kernel's first reads pay for); none drops it.

--backward adds, per token count, torch autograd of the eager peer layer
(x, router weights, w1 and w2 requiring grad): its forward under autograd
and its backward from a random dy, each after the flush — the peer of
`moe_bench SPEC --backward` (the spec with training = true), which times
moegen's training forward and backward.
"""
import argparse
import ctypes
import os
import re
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


sys.path.insert(0, os.path.join(ROOT, "python"))
from moegen import _lib  # noqa: E402  (the package's checked ctypes mirrors of moe.h and its loader)

Args, Info = _lib.ForwardArgs, _lib.PlanInfo


def spec_value(text, key, default=None):
    m = re.search(r"\b%s\s*=\s*([^,}\n]+)" % key, text)
    return m.group(1).strip().strip('"\'') if m else default


def make_flush(mode, dev):
    """The L2 flush before each timed run (--flush), as a function of no
    arguments: write fills 512 MiB; clean fills the first 256 MiB of that
    buffer, then sums the second 256 MiB as int32 (a read-only pass: the
    dirty lines are written back here, and L2 ends holding clean lines);
    none does nothing."""
    if mode == "none":
        return lambda: None
    buf = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    written, read = buf[:256 << 20], buf[256 << 20:].view(torch.int32)

    def flush():
        if mode == "write":
            buf.fill_(1)
        else:
            written.fill_(1)
            torch.sum(read)
    return flush


def timed(fn, iters, flush):
    """Median milliseconds of fn() over iters runs, L2 flushed (flush())
    before each."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        flush()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_rows(lib, plan, a, eager, T, flush, iters, dense_tf, copy_gbs, d):
    """Print the moegen layer and the peer layer replayed from CUDA graphs,
    against the roofline floor (touched weights once + activations at the
    measured copy bandwidth, or FLOPs at the dense rate)."""
    E, K, H, F = d["E"], d["K"], d["H"], d["F"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g_moe, g_peer = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):  # warm the peer's allocations outside capture
        for _ in range(2):
            eager()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g_moe):
        st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if lib.moe_forward(plan, ctypes.byref(a), st) != 0:
            sys.exit("moe_forward under capture: %s" % lib.moe_last_error().decode())
    with torch.cuda.graph(g_peer):
        eager()
    t_moe = timed(g_moe.replay, iters, flush)
    t_peer = timed(g_peer.replay, iters, flush)
    rows = T * K
    flop = 2.0 * T * H * E + 2.0 * rows * H * 2 * F + 2.0 * rows * F * H
    bytes_ = 2.0 * T * H * 2 + 2.0 * E * H + d["active"] * 3.0 * F * H * 2
    floor = max(flop / dense_tf / 1e9, bytes_ / copy_gbs / 1e6)
    print("%-6d %-22s %9.4f %9.4f %8.2fx   floor %.4f ms: moegen %.2fx floor, peer %.2fx floor" % (
        T, "layer (CUDA graph)", t_moe, t_peer, t_peer / t_moe, floor, t_moe / floor, t_peer / floor))


def autograd_rows(T, x, wr, w1, w2, K, sigmoid, up_fn, iters, flush, dense_tf):
    """Print torch autograd of the eager layer: the forward under autograd
    and the backward from a random dy, median ms each after the flush."""
    E, F2, H = w1.shape
    F = F2 // 2
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, wr, w1, w2)]
    xl, wrl, w1l, w2l = leaves
    dy = torch.randn(T, H, device=x.device, dtype=x.dtype) / T ** 0.5

    def layer():
        lg = xl @ wrl.t()
        pp = lg.float().sigmoid() if sigmoid else lg.float().softmax(-1)
        ww, ii = pp.topk(K, dim=-1)
        ww = ww / ww.sum(-1, keepdim=True)
        fl = ii.flatten()
        od = fl.argsort(stable=True)
        cnt = torch.zeros(E, device=x.device, dtype=torch.int64).index_add_(0, fl, torch.ones_like(fl))
        of = cnt.cumsum(0).to(torch.int32)
        hh = up_fn(torch._grouped_mm(xl[od // K], w1l.transpose(-2, -1), offs=of))
        oo = torch._grouped_mm(hh, w2l.transpose(-2, -1), offs=of)
        out = torch.zeros(T, H, device=x.device, dtype=torch.float32)
        out = out.index_add(0, od // K, oo.float() * ww.flatten()[od, None].to(oo.dtype).float())
        return out.to(x.dtype)

    try:
        layer().backward(dy)
    except RuntimeError as e:
        print("%-6d torch autograd of the eager layer failed: %s" % (T, str(e).splitlines()[0]))
        return
    t_fwd = timed(layer, iters, flush)
    times = []
    for it in range(3 + iters):
        for t in leaves:
            t.grad = None
        out = layer()
        flush()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out.backward(dy)
        b.record()
        b.synchronize()
        if it >= 3:
            times.append(a.elapsed_time(b))
    t_bwd = statistics.median(times)
    rows = T * K
    flop = 2 * (2.0 * rows * H * 2 * F + 2.0 * rows * F * H)
    print("%-6d %-22s %9s %9.4f            forward under autograd" % (T, "autograd fwd (peer)", "", t_fwd))
    print("%-6d %-22s %9s %9.4f            backward: %.0f TFLOP/s of its GEMMs (%.2fx dense), %.2fx its forward" % (
        T, "autograd bwd (peer)", "", t_bwd, flop / t_bwd / 1e9, flop / t_bwd / 1e9 / dense_tf, t_bwd / t_fwd))


E4M3 = torch.float8_e4m3fn


def q_rows(t):
    """Rowwise e4m3 (the peer's recipe): (codes, fp32 scale per row)."""
    s = t.abs().amax(-1, keepdim=True).float().clamp(min=1e-4) / 448.0
    return (t.float() / s).clamp(-448.0, 448.0).to(E4M3), s.squeeze(-1)


def fp8_pack(lib, plan, w1, w2, block):
    """moegen's fp8 weights: w1 [E, 2F, H] and w2 [E, H, F] bf16 (plain)
    quantized by moe_plan_pack_quantize_async: (w1q, w1s, w2q, w2s)."""
    E, F2, H = w1.shape
    F = F2 // 2
    dev = w1.device
    w1q = torch.empty(E, F2, H, dtype=torch.uint8, device=dev)
    w2q = torch.empty(E, H, F, dtype=torch.uint8, device=dev)
    w1s = torch.empty(E * (F2 // 128) * (H // 128) if block else E * F2, dtype=torch.float32, device=dev)
    w2s = torch.empty(E * (H // 128) * (F // 128) if block else E * H, dtype=torch.float32, device=dev)
    fn = lib.moe_plan_pack_quantize_async
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(_lib.PackArgs), ctypes.c_void_p,
                                             ctypes.c_void_p, ctypes.c_void_p]
    st = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    a1 = _lib.PackArgs(_lib.TENSOR_W1, (_lib.PackSrc * 2)(_lib.PackSrc(w1.data_ptr(), F2 * H, H, 1),
                                                         _lib.PackSrc(w1.data_ptr() + F * H * 2, F2 * H, H, 1)), 0, E)
    a2 = _lib.PackArgs(_lib.TENSOR_W2, (_lib.PackSrc * 2)(_lib.PackSrc(w2.data_ptr(), H * F, F, 1),
                                                         _lib.PackSrc(None, 0, 0, 0)), 0, E)
    for a, q, sc in ((a1, w1q, w1s), (a2, w2q, w2s)):
        if fn(plan, ctypes.byref(a), q.data_ptr(), sc.data_ptr(), st) != 0:
            sys.exit("moe_plan_pack_quantize_async: %s" % lib.moe_last_error().decode())
    torch.cuda.synchronize()
    return w1q, w1s, w2q, w2s


def region(lib, plan, ws, T, name, n, dtype):
    """n values of dtype in moegen's workspace region `name`, as a call of
    T tokens lays the workspace out."""
    fn = lib.moe_plan_workspace_region_at
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                             ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    if fn(plan, T, name.encode(), ctypes.byref(off), ctypes.byref(size)) != 0:
        sys.exit("moe_plan_workspace_region(%s): %s" % (name, lib.moe_last_error().decode()))
    nbytes = n * torch.empty(0, dtype=dtype).element_size()
    return ws[off.value:off.value + nbytes].view(dtype)


def fp8_peer_weights(w1, w2):
    """The peer's fp8 weights from the plain bf16 ones, rowwise over K:
    (w1 codes [E, H, 2F] column-major, scales [E, 2F], w2 codes, scales)."""
    q1, s1 = q_rows(w1)
    q2, s2 = q_rows(w2)
    return q1.transpose(-2, -1), s1, q2.transpose(-2, -1), s2


def fp8_rows(lib, plan, ws, T, x, y, w1, w2, peer_w, K, up_fn, iters, flush, m_up, m_down, m_after_route):
    """The fp8 comparison at T tokens (see the module's doc): times, then the
    errors of both layers against the bf16 layer on moegen's routing.
    m_after_route: moegen's permute, GEMMs and combine (its layer less route),
    what the peer layer here does on moegen's routing."""
    E, F2, H = w1.shape
    F = F2 // 2
    b1, s1, b2, s2 = peer_w
    idx = region(lib, plan, ws, T, "topk_idx", T * K, torch.int32).view(T, K).long()
    w = region(lib, plan, ws, T, "topk_w", T * K, torch.float32).view(T, K)
    flat = idx.flatten()
    order = flat.argsort(stable=True)
    counts = torch.zeros(E, device=x.device, dtype=torch.int64).index_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    xq, xsc = q_rows(x[order // K])

    def up_mm(aq, asc):
        return torch._scaled_grouped_mm(aq, b1, asc, s1, offs=offs, out_dtype=torch.bfloat16)

    def down_mm(hq, hsc):
        return torch._scaled_grouped_mm(hq, b2, hsc, s2, offs=offs, out_dtype=torch.bfloat16)

    try:
        hq, hsc = q_rows(up_fn(up_mm(xq, xsc)))
        o = down_mm(hq, hsc)
    except (RuntimeError, TypeError) as e:
        print("%-6d torch._scaled_grouped_mm refused these inputs: %s" % (T, str(e).splitlines()[0]))
        return
    t_up = timed(lambda: q_rows(up_fn(up_mm(xq, xsc))), iters, flush)
    t_up_mm = timed(lambda: up_mm(xq, xsc), iters, flush)
    t_down = timed(lambda: down_mm(hq, hsc), iters, flush)

    def peer_layer():  # on moegen's routing, so the layers differ only in the FFN
        xq_, xsc_ = q_rows(x[order // K])
        hq_, hsc_ = q_rows(up_fn(up_mm(xq_, xsc_)))
        o_ = down_mm(hq_, hsc_)
        out = torch.zeros(T, H, device=x.device, dtype=torch.float32)
        out.index_add_(0, order // K, o_.float() * w.flatten()[order, None])
        return out.to(torch.bfloat16)
    t_layer = timed(peer_layer, iters, flush)
    rows = T * K
    fl_up, fl_down = 2.0 * rows * H * 2 * F, 2.0 * rows * F * H
    for name, mine, peer, flop in (("fp8 up+SwiGLU+quant", m_up, t_up, fl_up),
                                   ("  (scaled_grouped_mm)", m_up, t_up_mm, fl_up),
                                   ("fp8 down", m_down, t_down, fl_down),
                                   ("fp8 layer after route", m_after_route, t_layer, fl_up + fl_down)):
        print("%-6d %-22s %9.4f %9.4f %8.2fx   moegen %.0f TFLOP/s, torch %.0f" % (
            T, name, mine, peer, peer / mine, flop / mine / 1e9, flop / peer / 1e9))
    # the bf16 layer in fp32 on the same routing: h and o rounded to bf16
    ref = torch.zeros(T, H, device=x.device, dtype=torch.float32)
    for e in range(E):
        sel = (order[int(offs[e - 1]) if e else 0:int(offs[e])])
        if sel.numel() == 0:
            continue
        a = x[sel // K].float() @ w1[e].float().t()
        h = up_fn(a).to(torch.bfloat16).float()
        oe = (h @ w2[e].float().t()).to(torch.bfloat16).float()
        ref.index_add_(0, sel // K, oe * w.flatten()[sel, None])
    ref = ref.to(torch.bfloat16).float()
    yp = peer_layer().float()
    den = ref.norm().item()
    print("%-6d %-22s moegen %.4f, torch %.4f   ||y - y_bf16|| / ||y_bf16||, same routing" % (
        T, "fp8 error vs bf16", (y[:T].float() - ref).norm().item() / den, (yp - ref).norm().item() / den))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--tokens", type=int, action="append")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--flush", choices=("write", "clean", "none"), default="clean")
    opt = ap.parse_args()
    lib = _lib.load(os.path.join(ROOT, "build", "libmoegen.so"))   # version and struct layouts checked
    plan = ctypes.c_void_p()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context, which libmoegen shares
    st = lib.moe_plan_create(ctypes.byref(plan), opt.spec.encode(), None)
    if st != 0:
        sys.exit("moe_plan_create: %s" % lib.moe_last_error().decode())
    info = Info()
    lib.moe_plan_get_info(plan, ctypes.byref(info))
    text = open(opt.spec).read()
    E, K, H, F, T_max = info.experts, info.top_k, info.hidden, info.ffn, info.tokens
    score = spec_value(text, "score", "softmax")
    if score not in ("softmax", "sigmoid"):  # the peers' routing below knows these two
        sys.exit("compare_torch: router.score = %s: the peer layers here route by softmax or sigmoid" % score)
    sigmoid = score == "sigmoid"
    if re.search(r"\bshared\s*=", text):  # its weights would be E + m slots, and no peer has it
        sys.exit("compare_torch: %s has a shared expert, which the peers here do not reproduce" % opt.spec)
    grouped = int(spec_value(text, "groups", "1")) > 1
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    x_all = torch.randn(T_max, H, device=dev).to(dt)
    wr = (torch.rand(E, H, device=dev) * 2 - 1).mul_(4 / H ** 0.5).to(dt)
    w1 = (torch.rand(E, 2 * F, H, device=dev) * 2 - 1).mul_(2 / H ** 0.5).to(dt)  # plain [gate; up]
    w2 = (torch.rand(E, H, F, device=dev) * 2 - 1).mul_(2 / F ** 0.5).to(dt)
    b1 = torch.zeros(E, 2 * F, device=dev, dtype=dt) + 0.01
    b2 = torch.zeros(E, H, device=dev, dtype=dt) + 0.01
    bias = torch.zeros(E, device=dev, dtype=torch.float32)
    # the kernel layout: gate/up interleaved in granules of 8
    g = 8
    f = torch.arange(F, device=dev)
    perm = torch.empty(2 * F, dtype=torch.long, device=dev)
    perm[(f // g) * 2 * g + f % g] = f
    perm[(f // g) * 2 * g + g + f % g] = F + f
    w1p = w1[:, perm, :].contiguous()
    b1p = b1[:, perm].contiguous()
    fp8 = spec_value(text, "weights", "none") == "fp8_e4m3"
    w1s = w2s = w2k = peer_w = None
    if fp8:  # moegen's weights: the same bf16 quantized by its device pack (w1p becomes e4m3 [E, 2F, H], paired)
        w1p, w1s, w2k, w2s = fp8_pack(lib, plan, w1, w2, spec_value(text, "scaling", "block") == "block")
        peer_w = fp8_peer_weights(w1, w2)
    ws = torch.empty(lib.moe_plan_workspace_size(plan, T_max), dtype=torch.uint8, device=dev)
    y = torch.empty(T_max, H, device=dev, dtype=dt)
    flush = make_flush(opt.flush, dev)
    mm = torch.randn(8192, 8192, device=dev).to(dt)
    dense_ms = timed(lambda: mm @ mm, 10, flush)
    dense_tf = 2 * 8192 ** 3 / dense_ms / 1e9
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    big2 = torch.empty_like(big)
    copy_ms = timed(lambda: big2.copy_(big), 10, flush)
    copy_gbs = 2 * big.numel() / copy_ms / 1e6
    del mm, big, big2
    print("compare_torch %s on %s (moegen kernels for %s, torch %s)" % (
        info.name.decode(), torch.cuda.get_device_name(), info.arch.decode(), torch.__version__))
    print("ceilings: dense bf16 matmul 8192^3 %.0f TFLOP/s, device copy %.0f GB/s" % (dense_tf, copy_gbs))
    print("L2 flush before each run: %s" % {
        "write": "write (write 512 MiB: L2 left with dirty lines)",
        "clean": "clean (write 256 MiB, then read 256 MiB: L2 left with clean lines)",
        "none": "none (--flush none)"}[opt.flush])
    print("%-6s %-22s %9s %9s %9s" % ("tokens", "stage", "moegen ms", "torch ms", "speedup"))
    up_fn = lambda h: torch.nn.functional.silu(h[:, :F]) * h[:, F:]
    events = (ctypes.c_void_p * 7)()
    for T in opt.tokens or [128, 4096]:
        x = x_all[:T]
        a = Args(T, x.data_ptr(), wr.data_ptr(), bias.data_ptr(), bias.data_ptr(), w1p.data_ptr(),
                 b1p.data_ptr(), (w2k if fp8 else w2).data_ptr(), b2.data_ptr(), y.data_ptr(), ws.data_ptr(), None,
                 w1s.data_ptr() if fp8 else None, w2s.data_ptr() if fp8 else None)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(7)]
        for e in evs:
            e.record()
        torch.cuda.synchronize()
        for i, e in enumerate(evs):
            events[i] = e.cuda_event  # the CUevent handle behind torch's event
        per = [[] for _ in range(7)]
        for it in range(3 + opt.iters):
            flush()
            if lib.moe_forward_timed(plan, ctypes.byref(a), stream, events) != 0:
                sys.exit("moe_forward: %s" % lib.moe_last_error().decode())
            torch.cuda.synchronize()
            if it >= 3:
                for k in range(6):
                    per[k].append(evs[k].elapsed_time(evs[k + 1]))
                per[6].append(evs[0].elapsed_time(evs[6]))
        m_up, m_down, m_layer = (statistics.median(per[k]) for k in (3, 4, 6))
        if fp8:  # y and the workspace hold the last timed forward's results
            fp8_rows(lib, plan, ws, T, x, y, w1, w2, peer_w, K, up_fn, opt.iters, flush, m_up, m_down,
                     sum(statistics.median(per[k]) for k in range(1, 6)))
            continue
        # the peers, on rows sorted by the same kind of routing
        logits = (x.float() @ wr.float().t())
        p = logits.sigmoid() if sigmoid else logits.softmax(-1)
        w, idx = p.topk(K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        flat = idx.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=E)
        offs = counts.cumsum(0).to(torch.int32)
        xs = x[order // K]
        w1t = w1.transpose(-2, -1)  # [E, H, 2F], K-major storage as nn.Linear keeps it
        w2t = w2.transpose(-2, -1)
        h = torch._grouped_mm(xs, w1t, offs=offs)
        act = up_fn(h)
        try:
            h = torch._grouped_mm(xs, w1t, offs=offs)
        except RuntimeError as e:  # report and go on: the other peers still say something
            print("%-6d torch._grouped_mm refused these inputs: %s" % (T, str(e).splitlines()[0]))
            continue
        t_up = timed(lambda: up_fn(torch._grouped_mm(xs, w1t, offs=offs)), opt.iters, flush)
        t_up_mm = timed(lambda: torch._grouped_mm(xs, w1t, offs=offs), opt.iters, flush)
        t_down = timed(lambda: torch._grouped_mm(act, w2t, offs=offs), opt.iters, flush)

        def eager():
            lg = x @ wr.t()
            pp = lg.float().sigmoid() if sigmoid else lg.float().softmax(-1)
            ww, ii = pp.topk(K, dim=-1)
            ww = ww / ww.sum(-1, keepdim=True)
            fl = ii.flatten()
            od = fl.argsort(stable=True)
            # counts without bincount's host synchronization, so the layer can be captured
            cnt = torch.zeros(E, device=dev, dtype=torch.int64).index_add_(0, fl, torch.ones_like(fl))
            of = cnt.cumsum(0).to(torch.int32)
            hh = up_fn(torch._grouped_mm(x[od // K], w1t, offs=of))
            oo = torch._grouped_mm(hh, w2t, offs=of)
            out = torch.zeros(T, H, device=dev, dtype=torch.float32)
            out.index_add_(0, od // K, oo.float() * ww.flatten()[od, None])
            return out.to(dt)
        t_layer = timed(eager, opt.iters, flush)
        if opt.graph:
            graph_rows(lib, plan, a, eager, T, flush, opt.iters, dense_tf, copy_gbs,
                       dict(E=E, K=K, H=H, F=F, active=int((counts > 0).sum())))
        if opt.backward:
            autograd_rows(T, x, wr, w1, w2, K, sigmoid, up_fn, opt.iters, flush, dense_tf)
        rows = T * K
        fl_up, fl_down = 2.0 * rows * H * 2 * F, 2.0 * rows * F * H
        for name, mine, peer, flop in (("up+SwiGLU", m_up, t_up, fl_up), ("  (grouped_mm alone)", m_up, t_up_mm, fl_up),
                                       ("down", m_down, t_down, fl_down),
                                       ("layer%s" % (" (peer: plain top-k)" if grouped else ""), m_layer, t_layer,
                                        fl_up + fl_down)):
            print("%-6d %-22s %9.4f %9.4f %8.2fx   moegen %.0f TFLOP/s, torch %.0f" % (
                T, name, mine, peer, peer / mine, flop / mine / 1e9, flop / peer / 1e9))
    lib.moe_plan_destroy(plan)


if __name__ == "__main__":
    main()
