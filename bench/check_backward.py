#!/usr/bin/env python3
"""check_backward.py — the CPU reference's backward against torch autograd (issue 19, item 5).

usage: python3 bench/check_backward.py [--cases a,b,...] [--sizes tiny,small] [--list]

For each case (a spec variant) at each size, draw seeded random inputs with
values in the spec's dtype (bf16 or fp16; never zero), and compute the
gradients of L = sum(dy * y) twice:
  * moegen's CPU reference, moe_ref_backward (tests/support/ref_backward.c),
    through build/libmoegen_ref.so (`make ref-lib`), in its exact mode (no
    rounding, double) and its rounded mode (the GPU backward's rounding
    points);
  * torch autograd of an eager layer written here from the semantics in
    docs/DESIGN.md ("Routing, exactly", "Shared experts"): softmax, sigmoid or sqrt(softplus)
    scores, selection bias, group-limited top-k, renormalize, scale, logit
    bias, expert biases, SwiGLU/GeGLU with the clamp, router.apply = "input",
    the shared expert with or without its sigmoid gate — on the same values
    upcast to float64 and to float32.
It prints, per gradient, max |ref - torch| / max |torch| for the exact mode
against torch float64 and float32, and the normwise relative difference of
the rounded mode against torch float64. The selection is each side's own
and must agree (the top-k is a constant of the backward).

Tolerances: the exact mode is computed in double and stored in float32, so
against torch float64 it agrees to float32 storage (~1e-7; TOL_F64 = 1e-5);
torch float32 adds its own float32 sums (TOL_F32 = 1e-4). The rounded mode
differs from the exact gradient by the dtype roundings: measured worst
5e-3 normwise in bf16 and 5e-4 in fp16; with a clamp, a pre-activation
that rounds across the limit keeps (or loses) a whole dU element (the
contract decides on the rounded U), up to 4e-2 in bf16 here: TOL_ROUNDED,
TOL_ROUNDED_CLAMP. A wrong rule moves gradients by far more: leaving out
renormalization's term (the schema's default is renormalize = true, and an
early version of this script forgot it) showed 0.35 to 1.1 on every one.

Runs on the CPU (torch's CPU build is enough; on a GPU machine it still
runs on the CPU). Not part of `make test` (CI has no torch). Exit status:
0 when every case is within tolerance, 1 when one is not, 2 for bad usage.
"""
import argparse
import ctypes
import os
import subprocess
import sys

import torch
import torch.nn.functional as Fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOL_F64 = 1e-5
TOL_F32 = 1e-4
TOL_ROUNDED = {"bf16": 1.5e-2, "fp16": 2e-3}
TOL_ROUNDED_CLAMP = {"bf16": 1e-1, "fp16": 2e-3}

# (name, spec keys, options). Options: E, K, shared F_s, dtype. Sizes
# scale H, F and T; H and F stay multiples of 8.
CASES = [
    ("mixtral", 'router = { score = "softmax", renormalize = true }', dict(E=8, K=2)),
    ("softmax-scale-logit-bias",
     'router = { score = "softmax", renormalize = false, scale = 1.7, logit_bias = true }',
     dict(E=6, K=2, dtype="fp16")),
    ("deepseek-v3", 'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5, '
     'groups = 4, topk_groups = 2, group_topk = 2 }', dict(E=16, K=4)),
    ("deepseek-v2-groups", 'router = { score = "softmax", renormalize = false, groups = 4, topk_groups = 2, '
     'group_topk = 1 }', dict(E=8, K=2)),
    ("gpt-oss", 'router = { score = "softmax", renormalize = true, logit_bias = true }\n'
     'activation = { kind = "swiglu", alpha = 1.702, limit = 0.8, up_offset = 1 }\nffn_bias = true',
     dict(E=8, K=4)),
    ("geglu-clamp", 'router = { score = "softmax", renormalize = true }\n'
     'activation = { kind = "geglu", limit = 0.7, up_offset = 0.5 }', dict(E=4, K=2, dtype="fp16")),
    ("llama4", 'router = { score = "sigmoid", renormalize = false, apply = "input" }', dict(E=8, K=1, shared=2)),
    ("apply-input-k2", 'router = { score = "softmax", renormalize = true, apply = "input", '
     'logit_bias = true }\n'
     'activation = { alpha = 1.702, limit = 0.8, up_offset = 1 }\nffn_bias = true', dict(E=6, K=2)),
    ("qwen2-shared-gated", 'router = { score = "softmax", renormalize = false }',
     dict(E=8, K=2, shared=2, gate="sigmoid")),
    ("deepseek-v4-sqrtsoftplus", 'router = { score = "sqrtsoftplus", bias = true, renormalize = true, scale = 1.5 }\n'
     'activation = { kind = "swiglu", limit = 10.0 }', dict(E=12, K=3, shared=1)),
    ("sqrtsoftplus-no-renorm", 'router = { score = "sqrtsoftplus", renormalize = false, logit_bias = true }',
     dict(E=8, K=2)),
    ("laguna-softcap", 'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0, '
     'logit_softcap = 0.5 }', dict(E=8, K=2, shared=1)),
    ("softmax-softcap-logit-bias", 'router = { score = "softmax", renormalize = true, logit_bias = true, '
     'logit_softcap = 0.4 }', dict(E=6, K=2, dtype="fp16")),
    # given routing (DeepSeek-V4's hash layers): the caller's ids, a repeat and two out of range (dropped)
    ("deepseek-v4-hash", 'router = { select = "given", score = "sqrtsoftplus", renormalize = true, scale = 1.5 }\n'
     'activation = { kind = "swiglu", limit = 10.0 }', dict(E=12, K=3, shared=1)),
    ("given-softmax-logit-bias", 'router = { select = "given", score = "softmax", renormalize = false, '
     'logit_bias = true }', dict(E=8, K=2, dtype="fp16")),
    # Step-3.7-Flash's clamped layers: min(silu(gate), L), up in [-L, L] (a limit that bites)
    ("step3.7-clamp-after", 'router = { score = "sigmoid", renormalize = true, scale = 2.0 }\n'
     'activation = { kind = "swiglu", limit = 0.5, clamp = "after" }', dict(E=8, K=2, shared=1)),
    # and the shared expert's own limit (Step-3.7's 16 against 7), or none (HY-V4)
    ("step3.7-shared-limit", 'router = { score = "sigmoid", renormalize = true, scale = 2.0 }\n'
     'activation = { kind = "swiglu", limit = 0.5, clamp = "after" }', dict(E=8, K=2, shared=1, shared_limit=1.1)),
    ("hy-v4-shared-unclamped", 'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5, '
     'groups = 4, topk_groups = 2, group_topk = 2 }\n'
     'activation = { kind = "swiglu", limit = 0.5 }', dict(E=16, K=4, shared=2, shared_limit=0)),
    # NemotronH's non-gated experts: relu(gate)^2 (the up rows' gradient 0), its relu2 shared expert
    ("nemotron-h-relu2", 'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5 }\n'
     'activation = { kind = "relu2" }', dict(E=8, K=3, shared=2)),
    ("geglu-clamp-after", 'router = { score = "softmax", renormalize = true }\n'
     'activation = { kind = "geglu", limit = 0.4, clamp = "after", up_offset = 0.5 }', dict(E=4, K=2, dtype="fp16")),
    # Gemma 4's router: its own input (router_x) and per-expert scales; GeGLU experts
    ("gemma4", 'router = { score = "softmax", renormalize = true, input = "separate", expert_scale = true }\n'
     'activation = { kind = "geglu" }', dict(E=8, K=2)),
    ("given-own-input-scales", 'router = { select = "given", score = "sigmoid", renormalize = false, scale = 1.5, '
     'input = "separate", expert_scale = true }', dict(E=8, K=3, shared=1, dtype="fp16")),
]
SIZES = {"tiny": dict(H=16, F=8, T=5), "small": dict(H=64, F=32, T=48)}

GRADS = ["dx", "dwr", "dw1", "db1", "dw2", "db2", "dlogit_bias", "dws1", "dws2", "dwsg", "drouter_x", "dexpert_scale"]


class Inputs(ctypes.Structure):  # moe_reflib_inputs_t (tests/support/ref_lib.c)
    _fields_ = [("tokens", ctypes.c_int), ("x", ctypes.c_void_p), ("wr", ctypes.c_void_p),
                ("sel_bias", ctypes.c_void_p), ("logit_bias", ctypes.c_void_p),
                ("w1", ctypes.c_void_p), ("w2", ctypes.c_void_p), ("b1", ctypes.c_void_p),
                ("b2", ctypes.c_void_p), ("ws1", ctypes.c_void_p), ("ws2", ctypes.c_void_p),
                ("wsg", ctypes.c_void_p), ("given_ids", ctypes.c_void_p), ("given_w", ctypes.c_void_p),
                ("router_x", ctypes.c_void_p), ("expert_scale", ctypes.c_void_p), ("wr32", ctypes.c_void_p)]


class Grads(ctypes.Structure):  # moe_reflib_grads_t
    _fields_ = [(g, ctypes.c_void_p) for g in GRADS]


def load_lib():
    path = os.path.join(ROOT, "build", "libmoegen_ref.so")
    r = subprocess.run(["make", "-C", ROOT, "build/libmoegen_ref.so"], capture_output=True, text=True)
    if r.returncode and not os.path.exists(path):
        raise RuntimeError("make build/libmoegen_ref.so failed:\n" + r.stdout + r.stderr)
    lib = ctypes.CDLL(path)
    if not hasattr(lib, "moe_reflib_backward"):
        raise RuntimeError(path + " has no moe_reflib_backward: rebuild it (make ref-lib)")
    return lib


class Case:
    def __init__(self, name, keys, opt, size, sname):
        self.name, self.keys, self.sname = name, keys, sname
        self.E, self.K = opt["E"], opt["K"]
        self.H, self.F, self.T = size["H"], size["F"], size["T"]
        self.FS = opt.get("shared", 0) * self.F
        self.gate = opt.get("gate", "none")
        self.dtype = opt.get("dtype", "bf16")
        self.tdtype = torch.bfloat16 if self.dtype == "bf16" else torch.float16
        self.spec = ('name = "check_backward"\nexperts = %d\ntop_k = %d\nhidden = %d\nffn = %d\n'
                     'tokens = %d\ndtype = "%s"\n%s\n' % (self.E, self.K, self.H, self.F, self.T,
                                                         self.dtype, keys))
        # the shared expert's own limit (shared.limit), or none (shared.unclamped)
        self.shared_limit = opt.get("shared_limit")
        shared_keys = ""
        if self.shared_limit == 0:
            shared_keys = ", unclamped = true"
        elif self.shared_limit:
            shared_keys = ", limit = %g" % self.shared_limit
        if self.FS:
            self.spec += 'shared = { ffn = %d, gate = "%s"%s }\n' % (self.FS, self.gate, shared_keys)
        # The semantics the eager layer needs, read back from the keys.
        def key(k, default=None):
            import re
            m = re.search(r"\b%s\s*=\s*(\"[^\"]*\"|[^,}\s]+)" % k, keys)
            return m.group(1).strip('"') if m else default
        self.score = key("score", "softmax")
        self.renorm = key("renormalize", "true") == "true"  # the schema's defaults (gen/spec_schema.c)
        self.scale = float(key("scale", "1"))
        self.sel_bias = key("bias", "false") == "true"
        self.logit_bias = key("logit_bias", "false") == "true"
        self.softcap = float(key("logit_softcap", "0"))
        self.groups = int(key("groups", "1"))
        self.topk_groups = int(key("topk_groups", "1"))
        self.group_topk = int(key("group_topk", "2"))
        self.apply_input = key("apply", "output") == "input"
        self.act = key("kind", "swiglu")
        self.alpha = float(key("alpha", "1"))
        self.limit = float(key("limit", "0"))
        self.up_offset = float(key("up_offset", "0"))
        self.clamp_after = key("clamp", "before") == "after"   # min(act(gate), limit): Step-3.7-Flash
        self.ffn_bias = key("ffn_bias", "false") == "true"
        self.given = key("select", "topk") == "given"
        self.own = key("input", "x") == "separate"           # the router's own input, router_x
        self.escale = key("expert_scale", "false") == "true"   # per-expert weight scales


def make_inputs(c, seed):
    """The case's tensors: half values (never zero) and fp32 biases."""
    g = torch.Generator().manual_seed(seed)

    def half(shape, scale):
        v = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale
        v = torch.where(v == 0, torch.full_like(v, 0.5 * scale), v)
        return v.to(c.tdtype).contiguous()

    E, H, F, T, FS = c.E, c.H, c.F, c.T, c.FS
    sh, sf = H ** -0.5, F ** -0.5
    t = {"x": half((T, H), 1), "wr": half((E, H), 2 * sh), "w1": half((E, 2 * F, H), 2 * sh),
         "w2": half((E, H, F), 1.5 * sf), "dy": half((T, H), 1)}
    if c.ffn_bias:
        t["b1"], t["b2"] = half((E, 2 * F), 0.5), half((E, H), 0.3)
    if c.sel_bias:
        t["sel_bias"] = ((torch.rand(E, generator=g) * 2 - 1) * 0.1).float()
    if c.logit_bias:
        t["logit_bias"] = ((torch.rand(E, generator=g) * 2 - 1) * 0.5).float()
    if FS:
        t["ws1"], t["ws2"] = half((2 * FS, H), 2 * sh), half((H, FS), 1.5 * (FS ** -0.5))
        if c.gate == "sigmoid":
            t["wsg"] = half((H,), 2 * sh)
    if c.given:  # the caller's ids: token 0's first expert twice, two out of range (dropped, no gradient)
        ids = torch.randint(0, E, (T, c.K), generator=g, dtype=torch.int32)
        ids[0, 1], ids[1, 0], ids[T - 1, c.K - 1] = ids[0, 0], -1, E
        t["given_ids"] = ids.contiguous()
    if c.own:
        t["router_x"] = half((T, H), 1)
    if c.escale:
        t["expert_scale"] = (0.5 + torch.rand(E, generator=g)).float()
    return t


def grad_shapes(c):
    E, H, F, T, FS = c.E, c.H, c.F, c.T, c.FS
    s = {"dx": (T, H), "dwr": (E, H), "dw1": (E, 2 * F, H), "dw2": (E, H, F)}
    if c.ffn_bias:
        s["db1"], s["db2"] = (E, 2 * F), (E, H)
    if c.logit_bias:
        s["dlogit_bias"] = (E,)
    if FS:
        s["dws1"], s["dws2"] = (2 * FS, H), (H, FS)
        if c.gate == "sigmoid":
            s["dwsg"] = (H,)
    if c.own:
        s["drouter_x"] = (T, H)
    if c.escale:
        s["dexpert_scale"] = (E,)
    return s


def ref_backward(lib, c, t, exact):
    """moe_ref_backward's gradients (fp32 tensors) and selection."""
    ptr = lambda k: t[k].data_ptr() if k in t else None
    a = Inputs(c.T, ptr("x"), ptr("wr"), ptr("sel_bias"), ptr("logit_bias"), ptr("w1"), ptr("w2"),
               ptr("b1"), ptr("b2"), ptr("ws1"), ptr("ws2"), ptr("wsg"), ptr("given_ids"), None,
               ptr("router_x"), ptr("expert_scale"))
    out = {k: torch.full(s, float("nan"), dtype=torch.float32) for k, s in grad_shapes(c).items()}
    gr = Grads(*[out[k].data_ptr() if k in out else None for k in GRADS])
    idx = torch.empty(c.T, c.K, dtype=torch.int32)
    err = ctypes.create_string_buffer(2048)
    rc = lib.moe_reflib_backward(b"check_backward.moe", c.spec.encode(), ctypes.byref(a),
                                 ctypes.c_void_p(t["dy"].data_ptr()), ctypes.c_int(1 if exact else 0),
                                 ctypes.byref(gr), ctypes.c_void_p(idx.data_ptr()), None, err, len(err))
    if rc:
        raise RuntimeError(err.value.decode())
    return out, idx.long()


def act(c, g, u, limit=None):
    """The activation at the routed experts' limit, or at `limit` (the shared expert's; 0: none)."""
    lim = c.limit if limit is None else limit
    if c.act == "relu2":   # NemotronH's relu(gate)^2, up unused (no limit: the spec refuses one)
        return torch.relu(g) ** 2
    if lim > 0:
        if not c.clamp_after:
            g = g.clamp(max=lim)
        u = u.clamp(-lim, lim)
    v = Fn.gelu(g, approximate="tanh") if c.act == "geglu" else g * torch.sigmoid(c.alpha * g)
    if lim > 0 and c.clamp_after:
        v = v.clamp(max=lim)
    return (u + c.up_offset) * v


def select(c, scores):
    """Top-k of the selection scores, group-limited if asked; ties to the lower index."""
    T, E = scores.shape
    s = scores
    if c.groups > 1:
        per = E // c.groups
        gs = s.view(T, c.groups, per).topk(c.group_topk, dim=-1).values.sum(-1)
        keep = gs.topk(c.topk_groups, dim=-1).indices
        mask = torch.zeros(T, c.groups, dtype=torch.bool).scatter_(1, keep, True)
        s = s.masked_fill(~mask.repeat_interleave(per, dim=1), float("-inf"))
    return s.topk(c.K, dim=-1).indices


def torch_backward(c, t, dt):
    """Autograd of the eager layer in dtype dt on the same values."""
    P = {k: t[k].to(dt).clone().requires_grad_(k != "sel_bias") for k in t if k not in ("dy", "given_ids")}
    x, dy = P["x"], t["dy"].to(dt)
    E, K, F, T = c.E, c.K, c.F, c.T
    logits = (P["router_x"] if c.own else x) @ P["wr"].T
    if c.logit_bias:
        logits = logits + P["logit_bias"]
    if c.softcap > 0:  # Laguna's moe_router_logit_softcapping
        logits = torch.tanh(logits / c.softcap) * c.softcap
    p = (torch.softmax(logits, -1) if c.score == "softmax" else
         torch.sqrt(torch.nn.functional.softplus(logits)) if c.score == "sqrtsoftplus" else torch.sigmoid(logits))
    sel = p.detach().float()  # moegen selects on fp32 scores
    if c.sel_bias:
        sel = sel + P["sel_bias"].detach().float()
    if c.given:  # the caller's ids; one out of range is dropped: expert 0, weight 0 (not p), no gradient
        ids = t["given_ids"].long()
        drop = (ids < 0) | (ids >= E)
        idx = torch.where(drop, torch.zeros_like(ids), ids)
        w = p.gather(1, idx).masked_fill(drop, 0.0)
    else:
        idx = select(c, sel)
        w = p.gather(1, idx)
    if c.renorm:
        w = w / w.sum(-1, keepdim=True)
    w = w * c.scale
    if c.escale:   # Gemma 4's per_expert_scale, after the renormalization
        w = w * P["expert_scale"][idx]
    y = torch.zeros_like(x)
    stats = [0, 0]  # clamped values, all values (routed experts)
    for e in range(E):
        tok, kk = (idx == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        xs = x[tok]
        if c.apply_input:
            xs = xs * w[tok, kk].unsqueeze(1)
        U = xs @ P["w1"][e].T
        if c.ffn_bias:
            U = U + P["b1"][e]
        if c.limit > 0:
            stats[0] += (U[:, :F] > c.limit).sum().item() + (U[:, F:].abs() > c.limit).sum().item()
            stats[1] += U.numel()
        O = act(c, U[:, :F], U[:, F:]) @ P["w2"][e].T
        if c.ffn_bias:
            O = O + P["b2"][e]
        if not c.apply_input:
            O = O * w[tok, kk].unsqueeze(1)
        y = y.index_add(0, tok, O)
    if c.FS:
        Os = act(c, x @ P["ws1"][:c.FS].T, x @ P["ws1"][c.FS:].T, c.shared_limit) @ P["ws2"].T
        if c.gate == "sigmoid":
            Os = Os * torch.sigmoid(x @ P["wsg"]).unsqueeze(1)
        y = y + Os
    (y * dy).sum().backward()
    name = {"dx": "x", "dwr": "wr", "dw1": "w1", "db1": "b1", "dw2": "w2", "db2": "b2",
            "dlogit_bias": "logit_bias", "dws1": "ws1", "dws2": "ws2", "dwsg": "wsg", "drouter_x": "router_x",
            "dexpert_scale": "expert_scale"}
    return {g: P[name[g]].grad.double() for g in grad_shapes(c)}, idx, stats


def max_rel(a, b):
    return ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def norm_rel(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(n for n, _, _ in CASES))
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--list", action="store_true")
    o = ap.parse_args()
    if o.list:
        for n, keys, opt in CASES:
            print("%-26s %s %s" % (n, opt, keys.replace("\n", "; ")))
        return 0
    names, sizes = o.cases.split(","), o.sizes.split(",")
    known = {n for n, _, _ in CASES}
    if any(n not in known for n in names) or any(s not in SIZES for s in sizes):
        print("check_backward.py: unknown case or size (see --list; sizes: %s)" % ", ".join(SIZES),
              file=sys.stderr)
        return 2
    torch.manual_seed(o.seed)
    lib = load_lib()
    print("check_backward.py: moe_ref_backward (build/libmoegen_ref.so) against torch %s autograd, CPU"
          % torch.__version__)
    print("columns: exact vs torch float64 | exact vs torch float32 (max |diff| / max |torch|), "
          "rounded vs torch float64 (normwise)")
    print("tolerances: %.0e | %.0e | bf16 %.1e (with a clamp %.1e), fp16 %.1e" % (
        TOL_F64, TOL_F32, TOL_ROUNDED["bf16"], TOL_ROUNDED_CLAMP["bf16"], TOL_ROUNDED["fp16"]))
    bad = 0
    for ci, (n, keys, opt) in enumerate(CASES):
        if n not in names:
            continue
        for sname in sizes:
            c = Case(n, keys, opt, SIZES[sname], sname)
            seed = o.seed + 1000 * ci + (7 if sname == "small" else 0)
            t = make_inputs(c, seed)
            head = "%-26s %-5s %s E=%d K=%d H=%d F=%d T=%d%s seed %d" % (
                n, sname, c.dtype, c.E, c.K, c.H, c.F, c.T, " Fs=%d" % c.FS if c.FS else "", seed)
            try:
                ex, idx_ref = ref_backward(lib, c, t, exact=True)
                rd, _ = ref_backward(lib, c, t, exact=False)
                t64, idx64, clamped = torch_backward(c, t, torch.float64)
                t32, idx32, _ = torch_backward(c, t, torch.float32)
            except RuntimeError as e:
                print("%s\n  FAILED: %s" % (head, e))
                bad += 1
                continue
            same = (idx_ref.sort(-1).values == idx64.sort(-1).values).all().item() and \
                   (idx_ref.sort(-1).values == idx32.sort(-1).values).all().item()
            if c.limit > 0:
                head += ", %d of %d gate/up values clamped" % tuple(clamped)
            print(head + ("" if same else "  SELECTION DIFFERS"))
            if not same:
                bad += 1
                continue
            tol_r = (TOL_ROUNDED_CLAMP if c.limit > 0 else TOL_ROUNDED)[c.dtype]
            for g in t64:
                e64, e32, er = max_rel(ex[g], t64[g]), max_rel(ex[g], t32[g]), norm_rel(rd[g], t64[g])
                ok = e64 <= TOL_F64 and e32 <= TOL_F32 and er <= tol_r and t64[g].abs().max() > 0
                bad += not ok
                print("  %-12s %9.2e  %9.2e  %9.2e   max|g| %8.3g%s" % (
                    g, e64, e32, er, t64[g].abs().max().item(), "" if ok else "   FAIL"))
    print("check_backward.py: %s" % ("all within tolerance" if not bad else "%d FAILED" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
