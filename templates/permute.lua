@ -- permute.lua — dispatch: the tile plan and the row scatter (docs/DESIGN.md,
@ -- "Kernels"). Emits two kernels (p.plan_only: the plan kernel alone, for a
@ -- GEMM variant of another row block, gen/plan.h):
@ --
@ -- p.plan_kernel (one block of p.plan_threads; its body is the prelude's
@ --   moe_plan_block, which the route kernel's fused tail runs too): per-expert counts ->
@ --   offsets[E + 1], each expert's rows starting on a multiple of p.align
@ --   (an exclusive scan of the counts rounded up to p.align), cursors reset
@ --   to 0, and the tile table the grouped GEMMs read: one entry
@ --   {slot, row_start, rows, 0} per p.align rows of each expert, in expert
@ --   order, and its length in *num_tiles; slot = slot_of[expert], the
@ --   routing table's local slot of the expert's weights (the identity on a
@ --   mesh of one device). Empty experts get no tiles.
@ -- p.scatter_kernel (p.scatter_rows tokens per block, a warp per token):
@ --   lane k < K takes entry (t, k)'s row, offsets[e] + a cursor bump, and
@ --   writes it to row_of; the token's x row is then read once, 16 bytes a
@ --   lane at a time, and each 16 bytes stored to all K rows (with
@ --   router.apply = "input", x·w rounded to the dtype, w = topk_w[t, k]
@ --   rounded first; topk_w is not read otherwise). The order of rows within
@ --   an expert is whatever the atomics give; nothing downstream depends on it.
@ --   With p.gather (gen/spec.h, moe_spec_gather) it takes src_of last; given
@ --   one (the call's up GEMM gathers: runtime/moe_forward.c), each lane
@ --   writes src_of[row] = t instead, and nothing is copied. fp8 weights
@ --   (the quantizing scatter, gen/family_permute.c: a block per token):
@ --   the rows as above, then the block's warps share the rows' pairs of
@ --   128-column blocks, each pair read once and quantized once (once per
@ --   entry with router.apply = "input"), its codes stored to all K rows.
@ --   Zero experts (p.spec.zero_experts > 0, docs/DESIGN.md, "Zero experts"):
@ --   an entry of index >= p.slots has no slot; its row is offsets[slots] + t,
@ --   past every slot's rows, and the token's first such entry stores x[t]
@ --   there (the workspace's xs has the T rows, gen/plan.c), so combine reads
@ --   x[t] as the entry's output; its later ones share the row.
@ local M = {}
@
@ function M.config(p)
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 0) end
@   end
@   need(p.plan_threads >= 32 and p.plan_threads % 32 == 0 and p.plan_threads <= 1024,
@        "plan_threads must be a multiple of 32, at most 1024")
@   need(p.scatter_threads >= 32 and p.scatter_threads % 32 == 0, "scatter_threads must be a multiple of 32")
@   need(p.scatter_rows >= 1, "scatter_rows must be at least 1")
@   need(p.align >= 1, "align must be at least 1")
@   need(p.H % 8 == 0, "hidden must be a multiple of 8")
@   local c = {}
@   -- E and K here are the weight slots and entries per token (p.slots,
@   -- p.entries: the routed experts and top_k, then the shared expert's slots)
@   need((2 * p.slots + 1) * 4 <= 48 * 1024, "too many experts for the plan kernel's shared memory")
@   return c
@ end
@
@ function M.emit(p)
@ local c = M.config(p)
@ local ns = p.plan_kernel .. "_impl"
@ local input = p.spec.router.apply == "input"
@ local zero = (p.spec.zero_experts or 0) > 0
@ if zero and (input or (p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3")) then
@   error(p.kernel .. ": zero experts with router.apply = \"input\" or fp8 weights (gen/spec_check.c)", 0)
@ end
namespace ${ns} {
constexpr int E = ${p.slots}, K = ${p.entries}, H = ${p.H}, ALIGN = ${p.align};
constexpr int PLAN_THREADS = ${p.plan_threads}, PLAN_WARPS = PLAN_THREADS / 32;
constexpr int SCATTER_THREADS = ${p.scatter_threads}, SCATTER_WARPS = SCATTER_THREADS / 32;
constexpr int SCATTER_ROWS = ${p.scatter_rows};   // tokens per scatter block
constexpr int HV = H / 8;   // 16-byte vectors per row
constexpr unsigned FULL = 0xffffffffu;
}  // namespace ${ns}

extern "C" __global__ void __launch_bounds__(${p.plan_threads})
${p.plan_kernel}(const int *__restrict__ counts, const int *__restrict__ slot_of, int *__restrict__ offsets,
            int *__restrict__ cursor, moe_tile_t *__restrict__ tiles, int *__restrict__ num_tiles) {
    moe_pdl_begin();
    using namespace ${ns};
    __shared__ int s_rows[PLAN_WARPS], s_tiles[PLAN_WARPS];   // per-warp sums, then their inclusive scan
    __shared__ int s_off[E];        // first row of each expert
    __shared__ int s_first[E + 1];  // first tile of each expert; [E] = the tile count
    moe_plan_block<PLAN_THREADS, E>(counts, nullptr, slot_of, ALIGN, offsets, cursor, tiles, num_tiles, s_off, s_first,
                                    s_rows, s_tiles);
}

@ if not p.plan_only then -- p.plan_only: another GEMM variant's row block, the plan kernel alone
@ local fp8 = p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3"
@ if fp8 then
/* fp8 (docs/DESIGN.md, "FP8"): the row is written quantized for the fp8 up
 * GEMM, e4m3 into xq [rows, H] and one fp32 scale per 128 columns into xsc
 * [rows, H / 128] (quantize_row, M.quantizer below). */
namespace ${ns} {
@   M.quantizer(p)
}  // namespace ${ns}

extern "C" __global__ void __launch_bounds__(${p.scatter_threads})
${p.scatter_kernel}(const moe_half_t *__restrict__ x, const int *__restrict__ topk_idx, const float *__restrict__ topk_w,
            const int *__restrict__ offsets, int *__restrict__ cursor, int tokens, unsigned char *__restrict__ xq,
            float *__restrict__ xsc, int *__restrict__ row_of) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int HB = H / 128;           // scale blocks per row
    constexpr int PAIRS = (HB + 1) / 2;   // a warp's item: two blocks of one token (a half warp each)
    __shared__ int s_row[SCATTER_ROWS][K];
@   if not input then
    (void)topk_w;
@   end
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = (int)blockIdx.x * SCATTER_ROWS;
    const int nt = tokens - t0 < SCATTER_ROWS ? tokens - t0 : SCATTER_ROWS;   // this block's tokens
    // the rows: a warp per token, lane k < K takes entry (t, k)'s row (as the plain scatter)
    for (int r = warp; r < nt; r += SCATTER_WARPS)
        if (lane < K) {
            const long long i = (long long)(t0 + r) * K + lane;
            const int e = topk_idx[i];
            const int row = offsets[e] + atomicAdd(cursor + e, 1);
            row_of[i] = row;
            s_row[r][lane] = row;
        }
    __syncthreads();
    // the quantization: a warp per (token, block pair) over the block's warps, the pair read once and its codes
    // stored to each of the token's K rows (with apply = "input" quantized once per row: x·w differs by k)
#pragma unroll 1
    for (int it = warp; it < nt * PAIRS; it += SCATTER_WARPS) {
        const int r = it / PAIRS, b = (it - r * PAIRS) * 2 + (lane >> 4), c = lane & 15;
        const long long t = t0 + r;
        const uint4 v = b < HB ? __ldg(reinterpret_cast<const uint4 *>(x + t * H) + b * 16 + c)
                               : make_uint4(0u, 0u, 0u, 0u);
@   if input then
#pragma unroll 1
        for (int k = 0; k < K; ++k) {
            const float w = moe_round(__ldg(topk_w + t * K + k));   // the weight in the dtype
            uint2 code;
            const float m = quantize8(v, w, code);
            const long long row = s_row[r][k];
            if (b < HB) {
                *reinterpret_cast<uint2 *>(xq + row * H + b * 128 + c * 8) = code;
                if (c == 0)
                    xsc[row * HB + b] = m / 448.0f;
            }
        }
@   else
        uint2 code;
        const float m = quantize8(v, 1.0f, code);
        if (b < HB)
#pragma unroll 4
            for (int k = 0; k < K; ++k) {
                const long long row = s_row[r][k];
                *reinterpret_cast<uint2 *>(xq + row * H + b * 128 + c * 8) = code;
                if (c == 0)
                    xsc[row * HB + b] = m / 448.0f;
            }
@   end
    }
}
@ else
extern "C" __global__ void __launch_bounds__(${p.scatter_threads})
${p.scatter_kernel}(const moe_half_t *__restrict__ x, const int *__restrict__ topk_idx, const float *__restrict__ topk_w,
            const int *__restrict__ offsets, int *__restrict__ cursor, int tokens, moe_half_t *__restrict__ xs,
            int *__restrict__ row_of${p.gather == 1 and ", int *__restrict__ src_of" or ""}) {
    moe_pdl_begin();
    using namespace ${ns};
@ if not input then
    (void)topk_w;
@ end
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
    for (int r = warp; r < SCATTER_ROWS; r += SCATTER_WARPS) {
        const int t = blockIdx.x * SCATTER_ROWS + r;
        if (t >= tokens)
            return;
        int my_row = 0;
@ if input then
        float my_w = 0.f;
@ end
@ if zero then
        bool my_zero = false;
@ end
        if (lane < K) {
            const long long i = (long long)t * K + lane;
            const int e = topk_idx[i];
@ if zero then
            my_zero = e >= E;   // a zero expert: x[t] at row offsets[E] + t, no slot
            my_row = my_zero ? offsets[E] + t : offsets[e] + atomicAdd(cursor + e, 1);
@ else
            my_row = offsets[e] + atomicAdd(cursor + e, 1);
@ end
            row_of[i] = my_row;
@ if p.gather == 1 then
            if (src_of)
                src_of[my_row] = t;   // the gathered up GEMM reads x[t] for the row itself
@ end
@ if input then
            my_w = moe_round(__ldg(topk_w + i));   // the weight in the dtype
@ end
        }
@ if p.gather == 1 then
        if (src_of)
            continue;   // no copy: xs is not read (moe_spec_gather)
@ end
        uint4 *__restrict__ dst[K];
@ if input then
        float w[K];
@ end
@ if zero then
        /* the token's zero entries after its first share that row: stored once */
        const unsigned zm = __ballot_sync(FULL, my_zero), dup = zm & (zm - 1u);
@ end
#pragma unroll
        for (int k = 0; k < K; ++k) {
            dst[k] = reinterpret_cast<uint4 *>(xs + (long long)__shfl_sync(FULL, my_row, k) * H);
@ if input then
            w[k] = __shfl_sync(FULL, my_w, k);
@ end
        }
        const uint4 *__restrict__ src = reinterpret_cast<const uint4 *>(x + (long long)t * H);
#pragma unroll ${p.entries <= 8 and 4 or 1}
        for (int v = lane; v < HV; v += 32) {
            const uint4 val = __ldg(src + v);
@ if input then
#pragma unroll
            for (int k = 0; k < K; ++k) dst[k][v] = moe_scale8(val, w[k]);
@ elseif zero then
#pragma unroll
            for (int k = 0; k < K; ++k)
                if (!((dup >> k) & 1u)) dst[k][v] = val;
@ else
#pragma unroll
            for (int k = 0; k < K; ++k) dst[k][v] = val;
@ end
        }
    }
}
@ end
@ end -- plan_only
@ end
@
@ -- The fp8 activation quantizer (docs/DESIGN.md, "FP8"), emitted into the
@ -- namespace (which defines H) of each kernel that writes quantized rows:
@ -- this scatter and templates/ep.lua's, so both are runtime/fp8.c's rule
@ -- bit for bit. quantize_row, called by a whole warp, quantizes the row of
@ -- H halves at src (with router.apply = "input" first scaled by w, the
@ -- weight already in the dtype: x·w rounded to the dtype is what is
@ -- quantized; w is not read otherwise) into e4m3 at q [H] and one fp32
@ -- scale per 128 columns at sc [H/128]: half a warp per 128-column block
@ -- (16 lanes x 8 halves), the block's amax (at least 1e-4) reduced over
@ -- the half warp, scale amax / 448, e4m3(v * (448 / amax)) round to
@ -- nearest even, saturating.
@ function M.quantizer(p)
@ local input = p.spec.router.apply == "input"
/* This lane's 8 columns v of a 128-column block (a half warp's 16 lanes x 8
 * halves; the whole warp calls, each half warp on its own block), with
 * router.apply = "input" scaled by w first (w unread otherwise), quantized:
 * their e4m3 codes into code; returns the block's amax (at least 1e-4). */
static __device__ __forceinline__ float quantize8(uint4 v, float w, uint2 &code) {
@ if input then
    v = moe_scale8(v, w);  // the scaled row, rounded to the dtype, is what is quantized
@ else
    (void)w;
@ end
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
    float f[8];
#pragma unroll
    for (int j = 0; j < 4; ++j)
        f[2 * j] = moe_lo_float(u[j]), f[2 * j + 1] = moe_hi_float(u[j]);
    float m = 1e-4f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
        m = fmaxf(m, fabsf(f[j]));
#pragma unroll
    for (int o = 8; o; o >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float mul = 448.0f / m;
    unsigned r[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {  /* the prelude's moe_e4m3x2 (cvt.rn.satfinite): the host harness runs it too */
        const float h0 = f[4 * j + 1] * mul, l0 = f[4 * j] * mul;
        const unsigned short lo = moe_e4m3x2(l0, h0);
        const float h1 = f[4 * j + 3] * mul, l1 = f[4 * j + 2] * mul;
        const unsigned short hi = moe_e4m3x2(l1, h1);
        r[j] = (unsigned)lo | ((unsigned)hi << 16);
    }
    code = make_uint2(r[0], r[1]);
    return m;
}
static __device__ __forceinline__ void quantize_row(const uint4 *__restrict__ src, float w, unsigned char *__restrict__ q,
                                                    float *__restrict__ sc) {
    static_assert(H % 128 == 0, "fp8: H is a multiple of the 128-column scale block");
    constexpr int HB = H / 128;  // scale blocks per row
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (int b0 = 0; b0 < HB; b0 += 2) {
        const int b = b0 + (lane >> 4), c = lane & 15;  // this half warp's block, this lane's 8 columns
        uint2 code;
        const float m = quantize8(b < HB ? __ldg(src + b * 16 + c) : make_uint4(0u, 0u, 0u, 0u), w, code);
        if (b < HB) {
            *reinterpret_cast<uint2 *>(q + b * 128 + c * 8) = code;
            if (c == 0)
                sc[b] = m / 448.0f;
        }
    }
}
@ end
@
@ if p then M.emit(p) end
@ return M
