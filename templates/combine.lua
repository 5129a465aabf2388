@ -- combine.lua — y[t] = Σ_k topk_w[t, k] · obuf[row_of[t, k]], accumulated in
@ -- fp32 in increasing k, rounded once to the dtype (docs/DESIGN.md, "Kernels").
@ -- With router.apply = "input" the weights went into the expert inputs
@ -- (the scatter) and the rows are summed with weight 1 (topk_w not read).
@ -- k runs over the routed entries, then the shared expert's slots (weight
@ -- g(x) each), p.entries in all.
@ -- A warp per token, p.per_block tokens per block; each lane handles 8
@ -- consecutive columns at a time with 16-byte loads and stores. For few
@ -- tokens the columns are split across gridDim.y blocks
@ -- (gen/launch_geom.h, moe_combine_split): block y does the y-th share of
@ -- every token's columns, so each column is still summed by one lane in
@ -- k order.
@ local M = {}
@
@ function M.config(p)
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 0) end
@   end
@   need(p.threads >= 32 and p.threads % 32 == 0, "threads must be a multiple of 32")
@   need(p.per_block >= 1, "per_block must be at least 1")
@   need(p.H % 8 == 0, "hidden must be a multiple of 8")
@   -- K: the entries per token, top_k then one per shared expert slot (p.entries)
@   need(p.entries >= 1 and p.entries <= 32, "top_k + shared slots must be 1..32")
@   return {}
@ end
@
@ function M.emit(p)
@ M.config(p)
@ local K = p.entries
@ local ns = p.kernel .. "_impl"
@ local input = p.spec.router.apply == "input"
namespace ${ns} {
constexpr int K = ${p.entries}, H = ${p.H}, HV = H / 8;
constexpr int KB = K < 8 ? K : 8;   // rows loaded ahead of their sums
constexpr int PER_BLOCK = ${p.per_block}, THREADS = ${p.threads}, WARPS = THREADS / 32;
constexpr unsigned FULL = 0xffffffffu;

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
}  // namespace ${ns}

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ obuf, const int *__restrict__ row_of, const float *__restrict__ topk_w,
            int tokens, moe_half_t *__restrict__ y) {
    moe_pdl_begin();
    using namespace ${ns};
@ if input then
    (void)topk_w;
@ end
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
    for (int tt = warp; tt < PER_BLOCK; tt += WARPS) {
        const int t = blockIdx.x * PER_BLOCK + tt;
        if (t >= tokens)
            return;
        int my_row = 0;
        float my_w = 0.f;
        if (lane < K) {
            my_row = row_of[(long long)t * K + lane];
@ if input then
            my_w = 1.f;   // the weight is in the expert's input
@ else
            my_w = topk_w[(long long)t * K + lane];
@ end
        }
        int rows[K];
        float w[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            rows[k] = __shfl_sync(FULL, my_row, k);
            w[k] = __shfl_sync(FULL, my_w, k);
        }
        uint4 *__restrict__ dst = reinterpret_cast<uint4 *>(y + (long long)t * H);
        const int v0 = (int)((long long)blockIdx.y * HV / gridDim.y), v1 = (int)((long long)(blockIdx.y + 1) * HV / gridDim.y);
#pragma unroll ${K <= 8 and 2 or 1}
        for (int v = v0 + lane; v < v1; v += 32) {
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int k0 = 0; k0 < K; k0 += KB) {   // KB rows in flight, then their sums, in k order
                uint4 o[KB];
#pragma unroll
                for (int k = 0; k < KB; ++k)
                    if (k0 + k < K) o[k] = __ldg(reinterpret_cast<const uint4 *>(obuf + (long long)rows[k0 + k] * H) + v);
#pragma unroll
                for (int k = 0; k < KB; ++k)
                    if (k0 + k < K) axpy8(acc, w[k0 + k], o[k]);
            }
            dst[v] = make_uint4(moe_pack2(acc[0], acc[1]), moe_pack2(acc[2], acc[3]), moe_pack2(acc[4], acc[5]),
                                moe_pack2(acc[6], acc[7]));
        }
    }
}
@ end
@
@ if p then M.emit(p) end
@ return M
