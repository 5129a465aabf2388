@ -- bwd.lua — the backward's row and router kernels (families bwd_dys,
@ -- bwd_router, bwd_dx, bwd_dwr, bwd_colsum, bwd_unpack, bwd_accum, bwd_slot_rows; gen/family_bwd.c),
@ -- emitted once into a training spec's .cu after the pack kernel (whose
@ -- gen/pack_geom.h bwd_unpack calls). The math and its rounding points are
@ -- docs/DESIGN.md's "Backward" (rows r are the forward's expert-major rows,
@ -- row_of[t, k]; K = p.entries entries per token):
@ --   dys     dys[r] = round(w[t,k] · dy[t]); dw[t,k] = Σ_h dy[t,h]·O[r,h] (fp32);
@ --           with router.apply = "input" dys[r] = dy[t], and the same kernel,
@ --           launched again on (x, dXs), gives dw[t,k] = Σ_h x[t,h]·dXs[r,h]
@ --   router  dw -> d logits [T, E] (fp32) through scale, renormalization and
@ --           softmax over all E, sigmoid or sqrt(softplus), from the saved logits
@ --   dx      dx[t] = round(Σ_k dXs[row_of[t,k]] + Σ_e dlogits[t,e]·Wr[e]),
@ --           fp32, k in increasing order, then the router term
@ --           (router.apply = "input": each dXs row times round(w[t,k]));
@ --           a block of tokens shares each Wr vector it reads
@ --   dwr     d router_w[e] (+)= Σ_t dlogits[t,e]·x[t] and, with
@ --           router.logit_bias, d logit_bias[e] (+)= Σ_t dlogits[t,e]
@ --   colsum  out[slot, c] (+)= Σ over the slot's rows of src[row, c] (the
@ --           bias gradients db1p from dU, db2 from dys)
@ --   unpack  a packed dW1 (fp32 or the dtype) / db1 (fp32) to the plain row order
@ --   accum   dst[i] += src[i], fp32 or the dtype (moe_reduce_scatter_grads' accumulate)
@ --   slot_rows  an EP rank's rows per held slot, from its receive layout's
@ --           chunk rows (the EP backward's counts; runtime/ep_bwd.c)
@ --   escale  d expert_scale[e] (+)= Σ over the routed entries of expert e of
@ --           dw·w' (router.expert_scale: the router kernel leaves dw·w' in
@ --           dw's routed entries, w' the weight before the scale)
@ --
@ -- The router's own input (router.input = "separate"): the logits read
@ -- router_x, so dwr runs on router_x (the runtime passes it for x) and the
@ -- router's term of the input gradient, Σ_e dlogits·Wr, goes to d router_x
@ -- (dx's second output), not dx. Per-expert scales (router.expert_scale):
@ -- the final weight is w = w'·c_e, so the router kernel takes dw·c_e into
@ -- the chain of w' and leaves dw·w' for escale.
@ -- Every sum runs in a fixed order (no atomics), so results are
@ -- deterministic.
@ --
@ -- The two router products (dx's Σ_e dlogits·Wr, T x EL times EL x H, and
@ -- dwr's dlogitsᵀ·x, EL x T times T x H) run on tensor cores for bf16
@ -- specs (p.router_mma, gen/family.h's moe_bwd_router_mma): mma.sync
@ -- m16n8k16, bf16 operands, fp32 accumulation. d logits is fp32, so each
@ -- value d is split as it is staged into three bf16 parts, hi = R(d),
@ -- mid = R(d − hi), lo = R(d − hi − mid) (R: round to bf16), whose sum is d
@ -- (8 + 8 + 8 bits, as route.lua's fp32 router weights); every product of a
@ -- part and a bf16 value (Wr, x) is exact in fp32, and each k16 step adds
@ -- its lo part's products, then mid's, then hi's, to one fp32 accumulator.
@ -- The result is the fp32 product up to the accumulation's rounding (the
@ -- tensor cores' order, not the CUDA-core loops' bit for bit). fp16 specs
@ -- keep the CUDA-core loops (fp16 parts of a small d logit would fall
@ -- below fp16's range; no scaling is done), the sums in the order stated
@ -- at each kernel. The host tests (tests/bwd_host.cc) run the same code,
@ -- ldmatrix and mma emulated by tests/support/cuda_host.h.
@ --
@ -- A shared expert (p.shared_slots = M > 0) adds entries K..K+M-1 per token
@ -- (weight g) that the row kernels treat as any other; with a sigmoid gate
@ -- (p.shared_gate) g = sigmoid(x·w_gate) is logit column E: the router
@ -- kernel writes dz = g(1 - g)·Σ_j dw[t, K+j] as d logits column E
@ -- (d logits is [T, EL], EL = p.router_columns), dx adds dz·w_gate and dwr
@ -- gives d w_gate = Σ_t dz·x[t] as its row E.
@ local M = {}
@
@ function M.config(p)
@   local function need(ok, what)
@     if not ok then error(p.dys_kernel .. ": " .. what, 0) end
@   end
@   for _, k in ipairs({ "dys", "router", "dx", "dwr", "colsum", "unpack", "accum", "slot_rows", "escale" }) do
@     need(p[k .. "_threads"] >= 32 and p[k .. "_threads"] % 32 == 0, k .. " threads must be a multiple of 32")
@   end
@   for _, k in ipairs({ "dys", "router" }) do
@     need(p[k .. "_per_block"] * 32 == p[k .. "_threads"], k .. ": one warp per row or token")
@   end
@   if p.router_mma then
@     need(p.dtype == "bf16", "the router products on tensor cores take bf16")
@     need(p.dx_threads == 256 and p.dx_per_block == 32 and p.dx_cols == 256,
@          "dx on tensor cores: 256 threads over 32 tokens x 256 columns")
@   else
@     need(p.dx_per_block >= 1 and p.dx_per_block <= 16, "dx: 1..16 tokens a block (a thread's accumulators)")
@     need(p.dx_cols == 8 * p.dx_threads, "dx on CUDA cores: 8 columns a thread")
@     need(p.dx_per_block * (p.router_columns + 2 * p.entries) * 4 <= 32 * 1024,
@          "dx: the block's d logits, rows and factors must fit 32 KB of shared memory")
@   end
@   need(p.dwr_threads == 256 and p.dwr_cols == 256 and p.dwr_experts == 32, "dwr: 256 threads over a 32 x 256 tile")
@   need(p.colsum_threads == 256, "colsum: 8 warps of 32 columns")
@   need(p.escale_threads == 256, "escale: 256 threads (a power of two for its tree)")
@   need(p.H % 8 == 0, "hidden must be a multiple of 8")
@   need(p.entries >= 1 and p.entries <= 32, "top_k + shared slots must be 1..32")
@   need(p.E <= 1024, "at most 1024 experts")
@   return {}
@ end
@
@ function M.emit(p)
@ M.config(p)
@ local ns = p.dys_kernel .. "_impl"
@ local softmax = p.score == "softmax"
@ local sqrtsp = p.score == "sqrtsoftplus"   -- s = sqrt(softplus(l)): ds/dl = sigmoid(l) / (2 s)
@ local input = p.spec.router.apply == "input"
@ local own = p.spec.router.input == "separate"       -- the router's own input: dx's router term to d router_x
@ local escale = p.spec.router.expert_scale and true or false   -- per-expert scales: w = w'·c
@ -- router.logit_softcap = c: the saved logits are capped (L = c·tanh(l / c)); dL/dl = 1 − (L / c)²
@ local capd = p.softcap and (" * (1.f - (l[e] / " .. f32(p.softcap) .. ") * (l[e] / " .. f32(p.softcap) .. "))") or ""
@ -- bwd_dwr's signature and constants (both kernels)
@ local function dwr_head()
extern "C" __global__ void __launch_bounds__(${p.dwr_threads})
${p.dwr_kernel}(const float *__restrict__ dlogits, const moe_half_t *__restrict__ x, int tokens, int beta,
            float *__restrict__ dwr, float *__restrict__ dlb, float *__restrict__ dsg, float *__restrict__ part,
            int splits, int phase) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int BC = ${p.dwr_cols}, BE = ${p.dwr_experts}, TT = 32, NT = ${p.dwr_threads};
    constexpr int HL = H + ${p.logit_bias and 1 or 0};   /* part's columns: x's, and the ones column */
@ end
@ -- bwd_dwr's output of value `v` at expert e, column h (both kernels):
@ -- d router_w's row e (the shared gate's d w_gate: row E), or with
@ -- router.logit_bias d logit_bias[e] at the ones column h = H
@ local function dwr_store(v)
                if (h < H) {   /* row e of d router_w, or the shared gate's d w_gate (row E) */
                    float *o = e < E ? dwr + (long long)e * H + h : dsg + h;
                    *o = beta ? *o + ${v} : ${v};
                }
@   if p.logit_bias then
                else if (h == H && e < E) {
                    dlb[e] = beta ? dlb[e] + ${v} : ${v};
                }
@   end
@ end
@ -- bwd_dwr's phase 0 (both kernels): split blockIdx.z's token range
@ -- [tb, te), and `load(t0)`, which brings the d logits of experts `e0` ..
@ -- +BE and the x vectors of columns `c0` .. +BC of tokens t0 .. +TT into
@ -- registers (zeros past them; x's column H, the ones column, as 1), then
@ -- the first chunk's loads
@ local function dwr_loads(e0, c0)
    } else {
        const int per = ((tokens + splits - 1) / splits + TT - 1) / TT * TT;
        const int tb = (int)blockIdx.z * per, te = tb + per < tokens ? tb + per : tokens;
        constexpr int NDL = TT * BE / NT, NX = TT * (BC / 8) / NT;
        float pdl[NDL];   /* a chunk's d logits and x (8-column vectors; the ones column H), in registers */
        uint4 px[NX];
        auto load = [&](int t0) {
#pragma unroll
            for (int j = 0; j < NDL; ++j) {
                const int idx = tid + j * NT, tt = idx / BE, ee = idx % BE;
                pdl[j] = t0 + tt < te && ${e0} + ee < EL ? dlogits[(long long)(t0 + tt) * EL + ${e0} + ee] : 0.f;
            }
#pragma unroll
            for (int j = 0; j < NX; ++j) {
                const int idx = tid + j * NT, tt = idx / (BC / 8), cc = ${c0} + 8 * (idx % (BC / 8));
                /* H % 8 == 0: a vector is all of x's columns or all past them (the first of those the ones) */
                px[j] = t0 + tt < te && cc < H ? __ldg(reinterpret_cast<const uint4 *>(x + (long long)(t0 + tt) * H + cc))
                        : make_uint4(t0 + tt < te && cc == H && HL > H ? moe_pack2(1.f, 0.f) : 0u, 0u, 0u, 0u);
            }
        };
        load(tb);
@ end
@ -- dx's staging of its block's rows and factors (both dx kernels): the
@ -- threads from `first` on, `step` apart, fill s_row[TB][K] and s_wk[TB][K]
@ local function stage_rows(first, step)
    for (int i = ${first}; i < TB * K; i += ${step}) {
        const int tt = i / K, k = i % K;
        s_row[tt][k] = tt < nt ? row_of[(long long)t0 * K + i] : 0;
@   if input then
        s_wk[tt][k] = tt < nt ? moe_round(topk_w[(long long)t0 * K + i]) : 0.f;
@   else
        s_wk[tt][k] = 1.f;
@   end
    }
@   if not input then
    (void)topk_w;
@   end
@ end
namespace ${ns} {
constexpr int K = ${p.entries};    /* entries per token */
constexpr int KR = ${p.K};         /* the routed ones (top_k): the router's gradient */
constexpr int E = ${p.E}, H = ${p.H}, F = ${p.F}, HV = H / 8;
constexpr int EL = ${p.router_columns};   /* d logits columns: the experts, then the shared gate's (if any) */
constexpr int M = ${p.shared_slots};      /* the shared expert's entries KR .. KR + M - 1 */
constexpr int VPL = (E + 31) / 32; /* experts per lane */
constexpr unsigned FULL = 0xffffffffu;

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
/* Σ of the 8 products of two 16-byte vectors of halves, in order */
static __device__ __forceinline__ float dot8(const uint4 &a, const uint4 &b) {
    float s = moe_lo_float(a.x) * moe_lo_float(b.x);
    s = fmaf(moe_hi_float(a.x), moe_hi_float(b.x), s);
    s = fmaf(moe_lo_float(a.y), moe_lo_float(b.y), s);
    s = fmaf(moe_hi_float(a.y), moe_hi_float(b.y), s);
    s = fmaf(moe_lo_float(a.z), moe_lo_float(b.z), s);
    s = fmaf(moe_hi_float(a.z), moe_hi_float(b.z), s);
    s = fmaf(moe_lo_float(a.w), moe_lo_float(b.w), s);
    return fmaf(moe_hi_float(a.w), moe_hi_float(b.w), s);
}
/* acc[0..8) += w * the 8 halves of v */
static __device__ __forceinline__ void axpy8(float (&acc)[8], float w, const uint4 &v) {
    acc[0] = fmaf(w, moe_lo_float(v.x), acc[0]);
    acc[1] = fmaf(w, moe_hi_float(v.x), acc[1]);
    acc[2] = fmaf(w, moe_lo_float(v.y), acc[2]);
    acc[3] = fmaf(w, moe_hi_float(v.y), acc[3]);
    acc[4] = fmaf(w, moe_lo_float(v.z), acc[4]);
    acc[5] = fmaf(w, moe_hi_float(v.z), acc[5]);
    acc[6] = fmaf(w, moe_lo_float(v.w), acc[6]);
    acc[7] = fmaf(w, moe_hi_float(v.w), acc[7]);
}
@ if p.router_mma then
/* The router products' staging (dx, dwr): a 32 x 32 tile of d logits
 * [token][expert] as its three bf16 parts (s_a[0] hi, [1] mid, [2] lo), and
 * a 32 x 256 tile of the bf16 operand [k][column] (Wr's rows, or x's
 * tokens); rows padded by 8 halves, so the eight 16-byte rows of an
 * ldmatrix fall in distinct banks. */
constexpr int LDA = 32 + 8, LDB = 256 + 8;
/* d = hi + mid + lo: hi = R(d), mid = R(d - hi), lo = R(d - hi - mid), R rounding to bf16 (each difference
 * exact in fp32), stored at s_a[0..2][tt][ee] */
static __device__ __forceinline__ void split3(float d, moe_half_t (*s_a)[32][LDA], int tt, int ee) {
    const moe_half_t hi = moe_from_float(d);
    const float r = d - moe_to_float(hi);
    const moe_half_t mid = moe_from_float(r);
    s_a[0][tt][ee] = hi;
    s_a[1][tt][ee] = mid;
    s_a[2][tt][ee] = moe_from_float(r - moe_to_float(mid));
}
/* A warp's 32 x 32 output tile over one staged chunk of 32 k: acc[mt][j] is
 * m16 tile mt (rows 16 mt ..) by n8 tile j (columns n0 + 8 j ..), fragment
 * layout (d0 d1: row g, columns 2q, 2q + 1; d2 d3: row g + 8; g = lane / 4,
 * q = lane % 4). B = s_b [k][n], loaded transposed. A = the d logits parts:
 * TRANS_A (dwr: m = expert, k = token) from [k][m] transposed, else (dx:
 * m = token, k = expert) from [m][k]. Each k16 step adds, per (mt, j), the
 * lo part's products, then mid's, then hi's. */
template <bool TRANS_A>
static __device__ __forceinline__ void mma_chunk(float (&acc)[2][4][4], const moe_half_t (*s_a)[32][LDA],
                                                 const moe_half_t (*s_b)[LDB], int n0, int lane) {
#pragma unroll
    for (int ks = 0; ks < 32; ks += 16) {
        unsigned b[4][2];
#pragma unroll
        for (int j = 0; j < 4; j += 2)
            moe_ldmatrix_x4_trans(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1],
                                  &s_b[ks + (lane & 7) + 8 * (lane >> 3 & 1)][n0 + 8 * j + 8 * (lane >> 4)]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int part = 2; part >= 0; --part) {
                unsigned a[4];
                if (TRANS_A)
                    moe_ldmatrix_x4_trans(a[0], a[1], a[2], a[3],
                                          &s_a[part][ks + (lane & 7) + 8 * (lane >> 4)][16 * mt + 8 * (lane >> 3 & 1)]);
                else
                    moe_ldmatrix_x4(a[0], a[1], a[2], a[3], &s_a[part][16 * mt + (lane & 15)][ks + 8 * (lane >> 4)]);
#pragma unroll
                for (int j = 0; j < 4; ++j) moe_mma_16816(acc[mt][j], a, b[j]);
            }
    }
}
@ end
}  // namespace ${ns}

/* For each (t, k), row = row_of[t, k]: dys[row] = ${input and "dy[t] (the weight is in the expert's input)" or "round(w · dy[t])"} when
 * dys is not NULL, and dw[t, k] = <dy[t], obuf[row]> (fp32) when dw is not
 * NULL${input and " (the second launch: dy = x, obuf = dXs)" or ""}. A warp per (t, k), dys_per_block per block. */
extern "C" __global__ void __launch_bounds__(${p.dys_threads})
${p.dys_kernel}(const moe_half_t *__restrict__ dy, const moe_half_t *__restrict__ obuf, const int *__restrict__ row_of,
            const float *__restrict__ topk_w, int tokens, moe_half_t *__restrict__ dys, float *__restrict__ dw) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int PER_BLOCK = ${p.dys_per_block};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long i = (long long)blockIdx.x * PER_BLOCK + warp;
    if (i >= (long long)tokens * K)
        return;
    const long long row = row_of[i];
@ if input then
    (void)topk_w;
@ else
    const float w = topk_w[i];
@ end
    const uint4 *__restrict__ src = reinterpret_cast<const uint4 *>(dy + (i / K) * H);
    const uint4 *__restrict__ o = reinterpret_cast<const uint4 *>(obuf + row * H);
    uint4 *__restrict__ dst = reinterpret_cast<uint4 *>(dys + row * H);
    float acc = 0.f;
#pragma unroll 4
    for (int v = lane; v < HV; v += 32) {
        const uint4 a = __ldg(src + v);
        if (dw)
            acc += dot8(a, __ldg(o + v));
        if (dys)
@ if input then
            dst[v] = a;
@ else
            dst[v] = moe_scale8(a, w);
@ end
    }
    acc = warp_sum(acc);
    if (dw && lane == 0)
        dw[i] = acc;
}

/* d logits[t, :] from dw[t, 0..KR) and the saved logits (logit_bias
 * included${p.softcap and ", capped: the result times 1 − (l / c)², the cap's derivative" or ""}): p = ${softmax and "softmax(l) over all E" or sqrtsp and "sqrt(softplus(l))" or "sigmoid(l)"}; selected
 * weight w_k = scale · p_k${p.renormalize and " / Z, Z = Σ_selected p" or ""}, so
 * dp_j = ${p.renormalize and "scale / Z · (dw_j − Σ_k dw_k p_k / Z)" or "scale · dw_j"} at the selected experts (0 elsewhere),
 * then dl = ${softmax and "p ⊙ (dp − Σ_j p_j dp_j)" or sqrtsp and "dp ⊙ sigmoid(l) / (2p)" or "dp ⊙ p(1 − p)"}. A warp per token, all in fp32.${p.given and " Given routing: an entry of saved weight 0 (a dropped id) takes no part." or ""} */
extern "C" __global__ void __launch_bounds__(${p.router_threads})
${p.router_kernel}(const float *__restrict__ logits, const int *__restrict__ topk_idx, const float *__restrict__ topk_w,
            ${escale and "float" or "const float"} *__restrict__ dw, int tokens, float *__restrict__ dlogits${escale and ", const float *__restrict__ expert_scale" or ""}) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int PER_BLOCK = ${p.router_per_block};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t = blockIdx.x * PER_BLOCK + warp;
    if (t >= tokens)
        return;
    const float *__restrict__ l = logits + (long long)t * E;
    float pv[VPL];
@ if softmax then
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int e = lane + 32 * i;
        pv[i] = e < E ? l[e] : -__int_as_float(0x7f800000);
        m = fmaxf(m, pv[i]);
    }
    m = warp_max(m);
    float z = 0.f;
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        pv[i] = lane + 32 * i < E ? expf(pv[i] - m) : 0.f;
        z += pv[i];
    }
    z = warp_sum(z);
#pragma unroll
    for (int i = 0; i < VPL; ++i) pv[i] /= z;
@ elseif sqrtsp then
#pragma unroll
    for (int i = 0; i < VPL; ++i) {   /* ds/dl, which is all the scores' part needs */
        const int e = lane + 32 * i;
        pv[i] = e < E ? moe_sqrt_softplus_grad(l[e]) : 0.f;
    }
@ else
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int e = lane + 32 * i;
        pv[i] = e < E ? 1.f / (1.f + expf(-l[e])) : 0.f;
    }
@ end
    /* lane k < KR: the k-th selected expert, its dw and p */
    int idx = -1;
    float dwk = 0.f;
@ local needp = softmax or p.renormalize or escale
@ if needp then
    float pk = 0.f;   /* (sigmoid, sqrt(softplus) without renormalize or scales: dp needs no p of the selected) */
@ end
@ if escale then
    float ck = 0.f;   /* the entry's expert scale */
@ end
    if (lane < KR) {
        idx = topk_idx[(long long)t * K + lane];
        dwk = dw[(long long)t * K + lane];
@ if softmax then
        pk = expf(l[idx] - m) / z;
@ elseif needp and sqrtsp then
        pk = moe_sqrt_softplus(l[idx]);
@ elseif needp then
        pk = 1.f / (1.f + expf(-l[idx]));
@ end
@ if escale then
        ck = __ldg(expert_scale + idx);
@ end
    }
@ local live = "lane < KR"
@ if p.given then
    /* given routing: a dropped id's entry (weight 0, not p: templates/route.lua) takes no part; a weight
     * that is 0 otherwise has p = 0 and no gradient either way */
    const bool live = lane < KR && topk_w[(long long)t * K + lane] != 0.f;
    if (!live) {
        dwk = 0.f;
@   if needp then
        pk = 0.f;
@   end
    }
@   live = "live"
@ end
@ if escale then
    {   /* w = w'·c: d c gets dw·w' (left in dw for escale), w' gets dw·c; w' as the route makes it */
@   if p.renormalize then
        const float zw = warp_sum(pk);
        const float wpre = zw > 0.f ? pk / zw * ${f32(p.scale)} : 0.f;
@   else
        const float wpre = pk * ${f32(p.scale)};
@   end
        if (lane < KR)
            dw[(long long)t * K + lane] = ${live} ? dwk * wpre : 0.f;
        dwk *= ck;
    }
@ end
@ if p.renormalize then
    const float zs = warp_sum(pk), c1 = warp_sum(dwk * pk);
    const float dp = ${live} ? ${f32(p.scale)} / zs * (dwk - c1 / zs) : 0.f;
@ else
    const float dp = ${live} ? ${f32(p.scale)} * dwk : 0.f;
@ end

    float dpe[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) dpe[i] = 0.f;
#pragma unroll 1
    for (int k = 0; k < KR; ++k) {
        const int ik = __shfl_sync(FULL, idx, k);
        const float dk = __shfl_sync(FULL, dp, k);
#pragma unroll
        for (int i = 0; i < VPL; ++i)
            if (lane + 32 * i == ik) dpe[i] += dk;
    }
@ if softmax then
    const float c2 = warp_sum(pk * dp);
@ end
    float *__restrict__ out = dlogits + (long long)t * EL;
@ if p.shared_gate then
    if (lane == 0) { /* the shared gate: g = topk_w of its entries, dz = g(1 - g) Σ_j dw[t, KR + j] */
        const float g = topk_w[(long long)t * K + KR];
        float dg = 0.f;
#pragma unroll
        for (int j = 0; j < M; ++j) dg += dw[(long long)t * K + KR + j];
        out[E] = dg * g * (1.f - g);
    }
@ else
    (void)topk_w;
@ end
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
        const int e = lane + 32 * i;
@ if softmax then
        if (e < E) out[e] = pv[i] * (dpe[i] - c2)${capd};
@ elseif sqrtsp then
        if (e < E) out[e] = dpe[i] * pv[i]${capd};
@ else
        if (e < E) out[e] = dpe[i] * pv[i] * (1.f - pv[i])${capd};
@ end
    }
}

@ if p.router_mma then
/* dx[t] = round(Σ_k ${input and "round(w[t, k]) · " or ""}dXs[row_of[t, k]] + R[t]), R[t] = Σ_e dlogits[t, e] · Wr[e]${p.shared_gate and " (e = E: the shared gate's dz[t] · w_gate)" or ""}${own and ";\n * the router read router_x, so dx[t] = round(Σ_k dXs[row_of[t, k]]) and d router_x[t] = round(R[t])" or ""}:
 * block (bx, by) owns tokens TB·bx .. +TB (TB = 32) and columns
 * BN·by .. +BN (BN = 256). R on tensor cores: the EL router rows in chunks
 * of 32 (Wr's rows, row E the gate's, zeros past EL), each chunk's rows and
 * the tokens' d logits (split into bf16 parts, zeros past the tokens)
 * staged in shared memory, loaded a chunk ahead into registers; warp w
 * owns columns 32 w .. +32 for all 32 tokens (namespace mma_chunk). R goes
 * to shared memory in fp32; then a warp per token (8 at a time), a lane
 * per 8 columns, sums the rows in fp32, k increasing, adds R (one fp32
 * add) and rounds once. */
extern "C" __global__ void __launch_bounds__(${p.dx_threads})
${p.dx_kernel}(const moe_half_t *__restrict__ dxs, const int *__restrict__ row_of, const float *__restrict__ topk_w,
            const float *__restrict__ dlogits, const moe_half_t *__restrict__ wr, const moe_half_t *__restrict__ shared_gate,
            int tokens, moe_half_t *__restrict__ dx${own and ", moe_half_t *__restrict__ drx" or ""}) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int TB = ${p.dx_per_block}, BN = ${p.dx_cols}, NT = ${p.dx_threads}, LDR = BN + 8;
    constexpr int NCH = (EL + 31) / 32;                      /* chunks of 32 router rows */
    constexpr int NDL = TB * 32 / NT, NW = 32 * (BN / 8) / NT; /* a thread's d logits and 16-byte Wr vectors */
    static_assert(TB == 32 && BN == 256 && NT == 256, "8 warps over 32 tokens x 256 columns");
@ if not p.shared_gate then
    (void)shared_gate;
@ end
    __shared__ __align__(16) union {
        struct {
            moe_half_t a[3][32][LDA];   /* the chunk's d logits [token][router row]: hi, mid, lo */
            moe_half_t b[32][LDB];      /* the chunk's router rows [row][column] */
        } in;
        float r[TB][LDR];               /* R, fp32 [token][column] */
    } s;
    __shared__ int s_row[TB][K];
    __shared__ float s_wk[TB][K];       /* each row's factor: 1, or with router.apply = "input" round(w) */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = blockIdx.x * TB, c0 = blockIdx.y * BN;
    const int nt = tokens - t0 < TB ? tokens - t0 : TB;
@ stage_rows("tid", "NT")
    float pdl[NDL];   /* a chunk's d logits (element tid + j NT of [32 tokens][32 rows]) and router rows */
    uint4 pw[NW];     /* (16-byte vector tid + j NT of [32 rows][BN / 8]), in registers */
    auto load = [&](int e0) {
#pragma unroll
        for (int j = 0; j < NDL; ++j) {
            const int idx = tid + j * NT, tt = idx / 32, e = e0 + idx % 32;
            pdl[j] = tt < nt && e < EL ? dlogits[(long long)(t0 + tt) * EL + e] : 0.f;
        }
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int idx = tid + j * NT, e = e0 + idx / (BN / 8), c = c0 + 8 * (idx % (BN / 8));
@ if p.shared_gate then
            const moe_half_t *src = e < E ? wr + (long long)e * H : shared_gate;   /* row E: w_gate */
@ else
            const moe_half_t *src = wr + (long long)e * H;
@ end
            pw[j] = e < EL && c < H ? __ldg(reinterpret_cast<const uint4 *>(src + c)) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.f;
    load(0);
#pragma unroll 1
    for (int ch = 0; ch < NCH; ++ch) {
#pragma unroll
        for (int j = 0; j < NDL; ++j) {
            const int idx = tid + j * NT;
            split3(pdl[j], s.in.a, idx / 32, idx % 32);
        }
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int idx = tid + j * NT;
            *reinterpret_cast<uint4 *>(&s.in.b[idx / (BN / 8)][8 * (idx % (BN / 8))]) = pw[j];
        }
        __syncthreads();
        if (ch + 1 < NCH)
            load(32 * (ch + 1));   /* the next chunk's loads in flight while this one is multiplied */
        mma_chunk<false>(acc, s.in.a, s.in.b, 32 * warp, lane);
        __syncthreads();
    }
    {   /* R to shared memory: fragment (mt, j) holds tokens 16 mt + g (+ 8), columns 32 warp + 8 j + 2 q (+ 1) */
        const int g = lane >> 2, q = lane & 3;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2 *>(&s.r[16 * mt + g + 8 * h][32 * warp + 8 * j + 2 * q]) =
                        make_float2(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
    }
    __syncthreads();
    const int c = c0 + 8 * lane;   /* this lane's 8 columns */
    if (c >= H)
        return;
#pragma unroll
    for (int i = 0; i < TB / 8; ++i) {
        const int tt = warp + 8 * i;
        if (tt >= nt)
            break;
        float a8[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) a8[j] = 0.f;
#pragma unroll
        for (int k = 0; k < K; ++k)
            axpy8(a8, s_wk[tt][k], __ldg(reinterpret_cast<const uint4 *>(dxs + (long long)s_row[tt][k] * H + c)));
        const float4 r0 = *reinterpret_cast<const float4 *>(&s.r[tt][8 * lane]);
        const float4 r1 = *reinterpret_cast<const float4 *>(&s.r[tt][8 * lane + 4]);
        const float r8[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
@ if own then
        /* the router read router_x: R is d router_x's */
        reinterpret_cast<uint4 *>(drx + (long long)(t0 + tt) * H + c)[0] =
            make_uint4(moe_pack2(r8[0], r8[1]), moe_pack2(r8[2], r8[3]), moe_pack2(r8[4], r8[5]),
                       moe_pack2(r8[6], r8[7]));
@ else
#pragma unroll
        for (int j = 0; j < 8; ++j) a8[j] += r8[j];
@ end
        reinterpret_cast<uint4 *>(dx + (long long)(t0 + tt) * H + c)[0] =
            make_uint4(moe_pack2(a8[0], a8[1]), moe_pack2(a8[2], a8[3]), moe_pack2(a8[4], a8[5]),
                       moe_pack2(a8[6], a8[7]));
    }
}
@ else
/* dx[t] = round(Σ_k ${input and "round(w[t, k]) · " or ""}dXs[row_of[t, k]] + Σ_e dlogits[t, e] · Wr[e]${p.shared_gate and " + dz[t] · w_gate" or ""}): block
 * (bx, by) owns tokens TB·bx .. +TB (TB = dx_per_block) and the 8-column
 * vectors VB·by .. +VB of H (VB = dx_threads), a thread one vector for all
 * TB tokens, so a vector of Wr is read once per TB tokens; for every
 * (t, column) the sums run in fp32 in one order, k increasing, then e,
 * rounded once. */
extern "C" __global__ void __launch_bounds__(${p.dx_threads})
${p.dx_kernel}(const moe_half_t *__restrict__ dxs, const int *__restrict__ row_of, const float *__restrict__ topk_w,
            const float *__restrict__ dlogits, const moe_half_t *__restrict__ wr, const moe_half_t *__restrict__ shared_gate,
            int tokens, moe_half_t *__restrict__ dx${own and ", moe_half_t *__restrict__ drx" or ""}) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int TB = ${p.dx_per_block}, VB = ${p.dx_threads};
@ if not p.shared_gate then
    (void)shared_gate;
@ end
    __shared__ __align__(16) float s_dl[EL][TB];   /* the block's tokens' d logits, expert-major */
    __shared__ int s_row[TB][K];
    __shared__ float s_wk[TB][K];                 /* each row's factor: 1, or with router.apply = "input" round(w) */
    const int t0 = blockIdx.x * TB, v = blockIdx.y * VB + threadIdx.x;
    const int nt = tokens - t0 < TB ? tokens - t0 : TB;
    for (int i = threadIdx.x; i < TB * EL; i += VB) {
        const int tt = i / EL, e = i % EL;
        s_dl[e][tt] = tt < nt ? dlogits[(long long)(t0 + tt) * EL + e] : 0.f;
    }
@ stage_rows("threadIdx.x", "VB")
    __syncthreads();
    if (v >= HV)
        return;
    float acc[TB][8];
#pragma unroll
    for (int tt = 0; tt < TB; ++tt) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[tt][j] = 0.f;
        if (tt < nt) {
#pragma unroll
            for (int k = 0; k < K; ++k)
                axpy8(acc[tt], s_wk[tt][k], __ldg(reinterpret_cast<const uint4 *>(dxs + (long long)s_row[tt][k] * H) + v));
        }
    }
    auto store = [&](moe_half_t *__restrict__ dst) {
#pragma unroll
        for (int tt = 0; tt < TB; ++tt)
            if (tt < nt)
                reinterpret_cast<uint4 *>(dst + (long long)(t0 + tt) * H)[v] =
                    make_uint4(moe_pack2(acc[tt][0], acc[tt][1]), moe_pack2(acc[tt][2], acc[tt][3]),
                               moe_pack2(acc[tt][4], acc[tt][5]), moe_pack2(acc[tt][6], acc[tt][7]));
    };
@ if own then
    store(dx);   /* the router read router_x: its term is d router_x's */
#pragma unroll
    for (int tt = 0; tt < TB; ++tt)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[tt][j] = 0.f;
@ end
    const uint4 *__restrict__ wr4 = reinterpret_cast<const uint4 *>(wr);
#pragma unroll 2
    for (int e = 0; e < E; ++e) {
        const uint4 w = __ldg(wr4 + (long long)e * HV + v);
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) axpy8(acc[tt], s_dl[e][tt], w);
    }
@ if p.shared_gate then
    {   /* dz · w_gate */
        const uint4 w = __ldg(reinterpret_cast<const uint4 *>(shared_gate) + v);
#pragma unroll
        for (int tt = 0; tt < TB; ++tt) axpy8(acc[tt], s_dl[E][tt], w);
    }
@ end
    store(${own and "drx" or "dx"});
}
@ end

@ if p.router_mma then
/* d router_w [E, H] (+)= dlogits^T · x over the tokens (with a sigmoid-gated
 * shared expert, d logits column E gives d w_gate [H] the same way), and (with
 * router.logit_bias) d logit_bias [E] (+)= Σ_t dlogits as column H of the
 * same product (x's column H taken as 1). Block (bx, by, bz): columns
 * BC bx .. +BC of [x | 1] (BC = 256), experts BE by .. +BE (BE = 32), the
 * tokens of split bz, on tensor cores: tokens in chunks of 32, each chunk's
 * d logits (split into bf16 parts) and x rows staged in shared memory,
 * loaded a chunk ahead into registers; warp w owns columns 32 w .. +32 for
 * all 32 experts (namespace mma_chunk: m the experts, k the tokens).
 *
 * The tokens are cut into `splits` ranges of PER tokens (PER: the tokens
 * over splits, rounded up to whole chunks; gen/launch_geom.h's
 * moe_dwr_splits picks splits so that none is empty), so that the grid has
 * enough blocks to fill the GPU. phase 0 sums split bz's tokens: with one
 * split into the outputs, else into part [splits, EL, HL] (HL = H + the
 * ones column). phase 1 (a grid of one split) sums part over the splits in
 * order into the outputs. Either way the output is (0 + s_0) + s_1 + ...,
 * each s_z its tokens' product, then added to what the output holds when
 * beta is 1. */
@ dwr_head()
    static_assert(BC == 256 && BE == 32 && NT == 256, "8 warps over 32 experts x 256 columns");
    __shared__ __align__(16) moe_half_t s_dl[3][TT][LDA];   /* the chunk's d logits [token][expert]: hi, mid, lo */
    __shared__ __align__(16) moe_half_t s_x[TT][LDB];       /* the chunk's [x | 1] [token][column] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int c0 = blockIdx.x * BC, e0 = blockIdx.y * BE;
@ if not p.logit_bias then
    (void)dlb;
@ end
@ if not p.shared_gate then
    (void)dsg;
@ end
    /* fragment (mt, j) element i: expert e0 + 16 mt + g + 8 (i / 2), column c0 + 32 warp + 8 j + 2 q + i % 2 */
    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.f;
    if (phase == 1) {   /* the splits' partial sums, in split order */
        for (int z = 0; z < splits; ++z)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int e = e0 + 16 * mt + g + 8 * (i >> 1), h = c0 + 32 * warp + 8 * j + 2 * q + (i & 1);
                        if (e < EL && h < HL)
                            acc[mt][j][i] += part[((long long)z * EL + e) * HL + h];
                    }
@ dwr_loads("e0", "c0")
#pragma unroll 1
        for (int t0 = tb; t0 < te; t0 += TT) {
#pragma unroll
            for (int j = 0; j < NDL; ++j) {
                const int idx = tid + j * NT;
                split3(pdl[j], s_dl, idx / BE, idx % BE);
            }
#pragma unroll
            for (int j = 0; j < NX; ++j) {
                const int idx = tid + j * NT;
                *reinterpret_cast<uint4 *>(&s_x[idx / (BC / 8)][8 * (idx % (BC / 8))]) = px[j];
            }
            __syncthreads();
            if (t0 + TT < te)
                load(t0 + TT);   /* the next chunk's loads in flight while this one is multiplied */
            mma_chunk<true>(acc, s_dl, s_x, 32 * warp, lane);
            __syncthreads();
        }
        if (splits > 1) {   /* this split's sums, for phase 1 */
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int j = 0; j < 4; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int e = e0 + 16 * mt + g + 8 * (i >> 1), h = c0 + 32 * warp + 8 * j + 2 * q + (i & 1);
                        if (e < EL && h < HL)
                            part[((long long)blockIdx.z * EL + e) * HL + h] = acc[mt][j][i];
                    }
            return;
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = e0 + 16 * mt + g + 8 * (i >> 1), h = c0 + 32 * warp + 8 * j + 2 * q + (i & 1);
                if (e >= EL)
                    continue;
@ dwr_store("acc[mt][j][i]")
            }
}
@ else
/* d router_w [E, H] (+)= dlogits^T · x over the tokens (with a sigmoid-gated
 * shared expert, d logits column E gives d w_gate [H] the same way), and (with
 * router.logit_bias) d logit_bias [E] (+)= Σ_t dlogits as column H of the
 * same product (x's column H taken as 1). Block (bx, by, bz): columns
 * BC bx .. +BC of [x | 1] (BC = 256), experts BE by .. +BE (BE = 32), the
 * tokens of split bz; thread: 8 experts x 4 columns (experts 8 (tid / 64) ..,
 * columns 4 (tid % 64) ..), so each token's step is 32 FMAs on one 16-byte
 * shared load of x (4 columns) and two of d logits (8 experts, the same for
 * the warp). Tokens in chunks of 32 through shared memory (x widened to
 * fp32 as it is stored), summed in token order, each chunk's values loaded
 * into registers (16-byte vectors of x) while the one before is summed.
 *
 * The tokens are cut into `splits` ranges of PER tokens (PER: the tokens
 * over splits, rounded up to whole chunks; gen/launch_geom.h's
 * moe_dwr_splits picks splits so that none is empty), so that the grid has
 * enough blocks to fill the GPU (one range was a serial chain over every
 * token on 32-128 blocks). phase 0 sums split bz's tokens: with one split
 * into the outputs, else into part [splits, EL, HL] (HL = H + the ones
 * column). phase 1 (a grid of one split) sums part over the splits in order
 * into the outputs. Either way the output is (0 + s_0) + s_1 + ..., each s_z
 * its tokens in order, then added to what the output holds when beta is 1. */
@ dwr_head()
    constexpr int CG = BC / 4;                          /* threads along the columns */
    static_assert(CG * (BE / 8) == NT, "8 experts x 4 columns a thread");
    __shared__ __align__(16) float s_dl[TT][BE];
    __shared__ __align__(16) float s_x[TT][BC];
    const int tid = threadIdx.x, cg = tid % CG, eg = tid / CG;   /* columns 4 cg .., experts 8 eg .. of the tile */
    const int hb = blockIdx.x * BC + 4 * cg, e0 = blockIdx.y * BE + 8 * eg;
@ if not p.logit_bias then
    (void)dlb;
@ end
@ if not p.shared_gate then
    (void)dsg;
@ end
    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    if (phase == 1) {   /* the splits' partial sums, in split order */
        for (int z = 0; z < splits; ++z)
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (e0 + j < EL && hb + i < HL)
                        acc[j][i] += part[((long long)z * EL + e0 + j) * HL + hb + i];
@ dwr_loads("blockIdx.y * BE", "blockIdx.x * BC")
#pragma unroll 1
        for (int t0 = tb; t0 < te; t0 += TT) {
#pragma unroll
            for (int j = 0; j < NDL; ++j) {
                const int idx = tid + j * NT;
                s_dl[idx / BE][idx % BE] = pdl[j];
            }
#pragma unroll
            for (int j = 0; j < NX; ++j) {
                const int idx = tid + j * NT;
                float4 *d = reinterpret_cast<float4 *>(&s_x[idx / (BC / 8)][8 * (idx % (BC / 8))]);
                d[0] = make_float4(moe_lo_float(px[j].x), moe_hi_float(px[j].x), moe_lo_float(px[j].y), moe_hi_float(px[j].y));
                d[1] = make_float4(moe_lo_float(px[j].z), moe_hi_float(px[j].z), moe_lo_float(px[j].w), moe_hi_float(px[j].w));
            }
            __syncthreads();
            if (t0 + TT < te)
                load(t0 + TT);   /* the next chunk's loads in flight while this one is summed */
#pragma unroll 2
            for (int tt = 0; tt < TT; ++tt) {
                const float4 xv = *reinterpret_cast<const float4 *>(&s_x[tt][4 * cg]);
                const float4 d0 = *reinterpret_cast<const float4 *>(&s_dl[tt][8 * eg]);
                const float4 d1 = *reinterpret_cast<const float4 *>(&s_dl[tt][8 * eg + 4]);
                const float xs[4] = {xv.x, xv.y, xv.z, xv.w}, ds[8] = {d0.x, d0.y, d0.z, d0.w, d1.x, d1.y, d1.z, d1.w};
#pragma unroll
                for (int j = 0; j < 8; ++j)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[j][i] = fmaf(ds[j], xs[i], acc[j][i]);
            }
            __syncthreads();
        }
        if (splits > 1) {   /* this split's sums, for phase 1 */
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (e0 + j < EL && hb + i < HL)
                        part[((long long)blockIdx.z * EL + e0 + j) * HL + hb + i] = acc[j][i];
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int e = e0 + j;
        if (e >= EL)
            break;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int h = hb + i;
@ dwr_store("acc[j][i]")
        }
    }
}
@ end

/* out[slot, c] (+)= Σ_r src[r, c] over the slot's rows offsets[slot] ..
 * + counts[slot] (src [rows, ncols] in the dtype, out fp32 [slots, ncols]):
 * block (bx, slot), 32 columns, 8 warps over the rows, their partial sums
 * added in warp order. A slot with no rows gets 0 (beta 0) or keeps its
 * value (beta 1). */
extern "C" __global__ void __launch_bounds__(${p.colsum_threads})
${p.colsum_kernel}(const moe_half_t *__restrict__ src, int ncols, const int *__restrict__ offsets,
            const int *__restrict__ counts, int beta, float *__restrict__ out) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int WARPS = ${p.colsum_threads} / 32;
    __shared__ float s_part[WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, slot = blockIdx.y;
    const int c = blockIdx.x * 32 + lane;
    const long long r0 = offsets[slot];
    const int n = counts[slot];
    float acc = 0.f;
    if (c < ncols)
        for (int r = warp; r < n; r += WARPS) acc += moe_to_float(src[(r0 + r) * ncols + c]);
    s_part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && c < ncols) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) s += s_part[w][lane];
        float *o = out + (long long)slot * ncols + c;
        *o = beta ? *o + s : s;
    }
}

/* d expert_scale[e] (+)= Σ part[t, k] over the routed entries (k < KR) with
 * topk_idx[t, k] = e (part: dw·w', left in dw by the router kernel with
 * router.expert_scale; 0 for a dropped given id). Block e, thread j sums
 * entries j, j + THREADS, ... in order, then a fixed tree: the same sum on
 * every run. Emitted for every training spec; launched with the scales. */
extern "C" __global__ void __launch_bounds__(${p.escale_threads})
${p.escale_kernel}(const float *__restrict__ part, const int *__restrict__ topk_idx, int tokens, int beta,
            float *__restrict__ des) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int THREADS = ${p.escale_threads};
    __shared__ float s_sum[THREADS];
    const int e = blockIdx.x, tid = threadIdx.x;
    const long long n = (long long)tokens * KR;
    float acc = 0.f;
    for (long long i = tid; i < n; i += THREADS) {
        const long long t = i / KR, at = t * K + (i - t * KR);
        if (topk_idx[at] == e)
            acc += part[at];
    }
    s_sum[tid] = acc;
    __syncthreads();
#pragma unroll
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if (tid < o)
            s_sum[tid] += s_sum[tid + o];
        __syncthreads();
    }
    if (tid == 0)
        des[e] = beta ? des[e] + s_sum[0] : s_sum[0];
}

/* The plain layout of a packed W1 (tensor MOE_PACK_W1: [count, 2F, H], of
 * the weight gradients' type: ${p.grad_dtype}) or b1 (MOE_PACK_B1: [count,
 * 2F], fp32) gradient: plain row r of slot e is packed row moe_pack_row(r,
 * F) (gen/pack_geom.h). One thread per element, grid-stride. */
template <typename T>
static __device__ __forceinline__ void unpack_rows(int tensor, const T *__restrict__ src, T *__restrict__ dst,
                                                   long long count) {
    using namespace ${ns};
    const long long C = tensor == MOE_PACK_W1 ? H : 1, per = 2LL * F * C, total = count * per;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = i / per, rc = i - e * per, r = rc / C, c = rc - r * C;
        dst[i] = src[e * per + moe_pack_row(r, F) * C + c];
    }
}

extern "C" __global__ void __launch_bounds__(${p.unpack_threads})
${p.unpack_kernel}(int tensor, const void *__restrict__ src, void *__restrict__ dst, long long count) {
    moe_pdl_begin();
@ if p.grad_dtype ~= "fp32" then
    if (tensor == MOE_PACK_W1) {
        unpack_rows(tensor, (const moe_half_t *)src, (moe_half_t *)dst, count);
        return;
    }
@ end
    unpack_rows(tensor, (const float *)src, (float *)dst, count);
}

/* dst[i] += src[i] over n elements, fp32 (half = 0) or the dtype (half = 1:
 * summed in fp32, rounded once): a reduced gradient added into the caller's
 * (moe_reduce_scatter_grads with accumulate). One thread per element,
 * grid-stride. */
extern "C" __global__ void __launch_bounds__(${p.accum_threads})
${p.accum_kernel}(const void *__restrict__ src, void *__restrict__ dst, long long n, int half) {
    moe_pdl_begin();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        if (half)
            ((moe_half_t *)dst)[i] = moe_from_float(moe_to_float(((const moe_half_t *)dst)[i]) +
                                                    moe_to_float(((const moe_half_t *)src)[i]));
        else
            ((float *)dst)[i] += ((const float *)src)[i];
}

/* An expert-parallel rank's rows per held slot: out[j] = Σ_s chunk_rows[s·S + j]
 * over the P sources of its receive layout (ep.lua's recv_plan: the rows
 * each source's chunk for slot j kept), the counts the EP backward's wgrads
 * and bias sums reduce over. One thread per slot. */
extern "C" __global__ void __launch_bounds__(${p.slot_rows_threads})
${p.slot_rows_kernel}(const int *__restrict__ chunk_rows, int sources, int slots, int *__restrict__ out) {
    moe_pdl_begin();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= slots)
        return;
    int n = 0;
    for (int s = 0; s < sources; ++s)
        n += chunk_rows[s * slots + j];
    out[j] = n;
}
@ end
@
@ if p then M.emit(p) end
@ return M
