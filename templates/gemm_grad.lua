@ -- gemm_grad.lua — the backward grouped GEMMs (runtime/bgemm.h has their
@ -- operands; docs/DESIGN.md "Backward GEMMs"), one kernel per kind
@ -- (p.kind), on mma.sync m16n8k16 with a cp.async pipeline for sm_80; on
@ -- sm_90a (p.tile.consumers > 0) gemm_sm90.lua's TMA + wgmma kernels
@ -- (M.dgrad: B N-major; M.wgrad: both operands M/N-major).
@ --
@ --   dgrad_down  dU [rows, 2F] = act'(Ur) . (dys [rows, H] . W2[slot] [H, F]),
@ --               the activation backward in the epilogue (dA stays in registers)
@ --   dgrad_up    dXs [rows, H] = dU [rows, 2F] . W1p[slot] [2F, H]
@ --   wgrad_up    dW1p[slot] [2F, H] (+)= dU_gᵀ . xs_g      (fp32 or p.grad_dtype, K = slot g's rows)
@ --   wgrad_down  dW2[slot]  [H, F]  (+)= dys_gᵀ . A_g      (fp32 or p.grad_dtype)
@ --
@ -- Operand layouts: B is N-major in every kind (the weights [K, N] of the
@ -- dgrads; the rows [K = rows, N] of the wgrads), so its smem tile is
@ -- [BK][BN + 8] and ldmatrix.trans gives the mma's "col" B fragments. A is
@ -- K-major for the dgrads (rows of dys or dU: smem [BM][BK + 8], plain
@ -- ldmatrix, as the forward) and M-major for the wgrads (the rows are K:
@ -- smem [BK][BM + 8], ldmatrix.trans). The 8-half row padding keeps the
@ -- 8 row addresses of an ldmatrix in distinct banks (a row stride of 4 mod
@ -- 32 words). The dgrads walk the tile table (M tile = the table's entry,
@ -- rows past its `rows` zero-filled and not stored); the wgrads walk
@ -- (M tile, N tile) of the output on gridDim.x/y and the slot on
@ -- gridDim.z, reducing over rows offsets[g] .. offsets[g] + counts[g] - 1
@ -- only (rows past the count zero-filled, so pad rows never contribute).
@ if (p.tile.consumers or 0) > 0 then  -- sm_90a: TMA + wgmma (gemm_sm90.lua's M.dgrad, M.wgrad)
@   local G90 = import("gemm_sm90")
@   if p.kind == "wgrad_up" or p.kind == "wgrad_down" then G90.wgrad(p) else G90.dgrad(p) end
@   return
@ end
@ local G = import("gemm_sm80")
@ local t = p.tile
@ local kind = p.kind
@ local wgrad = kind == "wgrad_up" or kind == "wgrad_down"
@ local function need(ok, what)
@   if not ok then error(p.kernel .. ": " .. what, 2) end
@ end
@ need(kind == "dgrad_down" or kind == "dgrad_up" or wgrad, "unknown backward GEMM kind " .. tostring(kind))
@ local F, H = p.F, p.H
@ -- output columns N, A's and B's global row strides, and the output rows
@ -- M (wgrads) or the fixed reduction length K (dgrads)
@ local N, LDA, LDB, M, K
@ if kind == "dgrad_down" then N, K, LDA, LDB = F, H, H, F
@ elseif kind == "dgrad_up" then N, K, LDA, LDB = H, 2 * F, 2 * F, H
@ elseif kind == "wgrad_up" then M, N, LDA, LDB = 2 * F, H, 2 * F, H
@ else M, N, LDA, LDB = H, F, H, F end
@ need(t.warps_m >= 1 and t.warps_n >= 1 and t.stages >= 2, "need warps_m, warps_n >= 1 and stages >= 2")
@ need(t.bm % (16 * t.warps_m) == 0, "bm / warps_m must be a multiple of 16")
@ need(t.bn % (16 * t.warps_n) == 0, "bn / warps_n must be a multiple of 16 (B fragments load in pairs)")
@ need(t.bk % 16 == 0, "bk must be a multiple of 16")
@ need(H % 8 == 0 and F % 8 == 0, "H and F must be multiples of 8 (16-byte copies)")
@ need(kind ~= "dgrad_down" or p.pair_granule % 2 == 0, "the activation backward reads gate/up column pairs")
@ local ptx = ({ bf16 = "bf16", fp16 = "f16" })[p.dtype] or error(p.kernel .. ": unknown dtype " .. tostring(p.dtype))
@ -- the wgrads' output type (spec weight_grads): fp32, or the dtype (the fp32 sum rounded once, or old + sum rounded)
@ need(p.grad_dtype == nil or p.grad_dtype == "fp32" or p.grad_dtype == p.dtype,
@      "grad_dtype must be fp32 or the dtype, not " .. tostring(p.grad_dtype))
@ local grad_half = wgrad and p.grad_dtype ~= nil and p.grad_dtype ~= "fp32"
@ local out_t = grad_half and "moe_half_t" or "float"
@ local act
namespace ${p.kernel}_impl {
constexpr int BM = ${t.bm}, BN = ${t.bn}, BK = ${t.bk}, STAGES = ${t.stages};
constexpr int WARPS_M = ${t.warps_m}, WARPS_N = ${t.warps_n}, THREADS = ${p.threads};
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
constexpr int MI = WTM / 16, NI = WTN / 8;
constexpr int N = ${N};                 /* output columns */
constexpr int LDA = ${LDA}, LDB = ${LDB};  /* global row strides of A and B, halves */
@ if wgrad then
constexpr int M = ${M};                 /* output rows */
constexpr bool A_KMAJOR = false;        /* A = the rows, transposed: [K = rows][M] */
@ else
constexpr int K = ${K};                 /* reduction length */
constexpr bool A_KMAJOR = true;         /* A = the rows: [M = rows][K] */
@ end
constexpr int LDSA = A_KMAJOR ? BK + 8 : BM + 8;   /* smem row strides, halves */
constexpr int LDSB = BN + 8;
constexpr int A_BYTES = (A_KMAJOR ? BM : BK) * LDSA * 2;   /* one stage: A tile, then B tile */
constexpr int STAGE_BYTES = A_BYTES + BK * LDSB * 2;
/* the plan's numbers (gen/family_bgemm.c) */
static_assert(THREADS == 32 * WARPS_M * WARPS_N, "threads: one warp per warp tile");
static_assert(STAGES * STAGE_BYTES == ${p.smem}, "the cp.async pipeline is the plan's shared memory");
static_assert(NI % 2 == 0, "B fragments load two n8 fragments at a time");

static __device__ __forceinline__ void cp_async16(unsigned s, const void *g, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void ldsm_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
}
/* The transposing load: lane l receives, of each 8x8 matrix as stored
 * (rows at the 8 addresses), the elements (row 2 (l % 4), column l / 4)
 * and (row 2 (l % 4) + 1, column l / 4), the first in the low half. */
static __device__ __forceinline__ void ldsm_x4_t(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
}
/* D += A(16x16, row) . B(16x8, col), fp32 accumulate. */
static __device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.${ptx}.${ptx}.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

@ G.tile_coords(t.group_m)

/* cp.async of a K-major tile: ROWS rows of BK halves from k0, of an
 * operand with row stride LDG at g (the tile's row 0, k 0), into smem s
 * (row stride LDS_). Rows >= nrows and k >= klen are zero-filled (src-size
 * 0 reads nothing; the address is clamped to g anyway). klen % 8 == 0. */
template <int ROWS, int LDG, int LDS_>
static __device__ __forceinline__ void load_kmajor(unsigned s, const moe_half_t *__restrict__ g, int nrows, int k0,
                                                   int klen) {
    constexpr int CPR = BK / 8, CHUNKS = ROWS * CPR, ITERS = (CHUNKS + THREADS - 1) / THREADS;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
        const int idx = (int)threadIdx.x + i * THREADS;
        if (CHUNKS % THREADS == 0 || idx < CHUNKS) {
            const int r = idx / CPR, col = (idx % CPR) * 8;
            const bool ok = r < nrows && k0 + col < klen;
            cp_async16(s + (r * LDS_ + col) * 2, ok ? g + ((long long)r * LDG + k0 + col) : g, ok ? 16 : 0);
        }
    }
}

/* cp.async of an MN-major tile: BK rows (k0 .. k0 + BK - 1) of COLS halves
 * of an operand with row stride LDG at g (its row 0 = k 0, the tile's
 * column 0), into smem s (row stride LDS_). Rows k >= klen and columns >=
 * ncols are zero-filled. ncols % 8 == 0. */
template <int COLS, int LDG, int LDS_>
static __device__ __forceinline__ void load_mnmajor(unsigned s, const moe_half_t *__restrict__ g, int ncols, int k0,
                                                    int klen) {
    constexpr int CPR = COLS / 8, CHUNKS = BK * CPR, ITERS = (CHUNKS + THREADS - 1) / THREADS;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
        const int idx = (int)threadIdx.x + i * THREADS;
        if (CHUNKS % THREADS == 0 || idx < CHUNKS) {
            const int r = idx / CPR, col = (idx % CPR) * 8;
            const bool ok = k0 + r < klen && col < ncols;
            cp_async16(s + (r * LDS_ + col) * 2, ok ? g + ((long long)(k0 + r) * LDG + col) : g, ok ? 16 : 0);
        }
    }
}

/* One k tile (from k0) of A and B into the stage at smem s; a_lim: A's
 * valid rows (K-major) or columns (M-major) in the tile, b_lim: B's valid
 * columns. */
static __device__ __forceinline__ void load_stage(unsigned s, const moe_half_t *__restrict__ ga, int a_lim,
                                                  const moe_half_t *__restrict__ gb, int b_lim, int k0, int klen) {
    if (A_KMAJOR)
        load_kmajor<BM, LDA, LDSA>(s, ga, a_lim, k0, klen);
    else
        load_mnmajor<BM, LDA, LDSA>(s, ga, a_lim, k0, klen);
    load_mnmajor<BN, LDB, LDSB>(s + A_BYTES, gb, b_lim, k0, klen);
}

/* acc += A . B over k in [0, klen) for the CTA tile. ga: A at the tile's
 * (m 0, k 0); gb: B at (k 0, the tile's n 0); a_lim, b_lim as load_stage.
 * active = false: the warp only helps load (its rows are all past the
 * tile's). Ends with every copy landed and the smem free.
 *
 * Pipeline: k tile kt sits in stage kt % STAGES. Iteration kt waits for
 * its tile, syncs (so every warp is done with iteration kt - 1's stage),
 * issues the copy of k tile kt + STAGES - 1 into that stage, then runs its
 * k16 steps. Fragments (per m16n8k16, g = lane / 4, t = lane % 4):
 * A regs (row g | g + 8, k 2t..2t+1 | 2t+8..2t+9) in the order (g, k lo),
 * (g + 8, k lo), (g, k hi), (g + 8, k hi); B regs (k 2t..2t+1 | 2t+8.., n g).
 * K-major A: the four 8x8 matrices (m 0-7 | 8-15) x (k 0-7 | 8-15) in that
 * order, lanes 8i..8i+7 addressing rows of matrix i, plain ldmatrix. M-major
 * A (smem [k][m]): matrix i stored as k rows 8 (i / 2) .. + 7 at m 8 (i % 2),
 * transposed by ldmatrix.trans into the same registers. N-major B (smem
 * [k][n]): matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
 * (k 8-15, n 8-15) = b0, b1 of two n8 fragments, transposed likewise. */
static __device__ __forceinline__ void mainloop(float (&acc)[MI][NI][4], unsigned sbase,
                                                const moe_half_t *__restrict__ ga, int a_lim,
                                                const moe_half_t *__restrict__ gb, int b_lim, int klen, bool active) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int ktiles = (klen + BK - 1) / BK;
    /* this lane's ldmatrix row address in a stage at k step 0 (bytes), and
     * the byte steps per k16 step and per m16 / n16 fragment */
    const unsigned a_lane = A_KMAJOR ? ((wm * WTM + (lane & 15)) * LDSA + (lane >> 4) * 8) * 2
                                     : (((lane & 7) + (lane >> 4) * 8) * LDSA + wm * WTM + ((lane >> 3) & 1) * 8) * 2;
    constexpr unsigned A_KSTEP = A_KMAJOR ? 16 * 2 : 16 * LDSA * 2, A_MSTEP = A_KMAJOR ? 16 * LDSA * 2 : 16 * 2;
    const unsigned b_lane = A_BYTES + (((lane & 7) + ((lane >> 3) & 1) * 8) * LDSB + wn * WTN + (lane >> 4) * 8) * 2;
    constexpr unsigned B_KSTEP = 16 * LDSB * 2, B_NSTEP = 16 * 2;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles)
            load_stage(sbase + s * STAGE_BYTES, ga, a_lim, gb, b_lim, s * BK, klen);
        moe_cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
        moe_cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < ktiles)
            load_stage(sbase + (next % STAGES) * STAGE_BYTES, ga, a_lim, gb, b_lim, next * BK, klen);
        moe_cp_async_commit();
        const unsigned st = sbase + (kt % STAGES) * STAGE_BYTES;
        if (!active)
            continue;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            unsigned af[MI][4], bf[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
                const unsigned a = st + a_lane + ks * A_KSTEP + mi * A_MSTEP;
                if (A_KMAJOR)
                    ldsm_x4(af[mi][0], af[mi][1], af[mi][2], af[mi][3], a);
                else
                    ldsm_x4_t(af[mi][0], af[mi][1], af[mi][2], af[mi][3], a);
            }
#pragma unroll
            for (int nj = 0; nj < NI / 2; ++nj)
                ldsm_x4_t(bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1],
                          st + b_lane + ks * B_KSTEP + nj * B_NSTEP);
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < NI; ++ni)
                    mma16816(acc[mi][ni], af[mi], bf[ni]);
        }
    }
    moe_cp_async_wait<0>();
    __syncthreads();
}
@ if kind == "dgrad_down" then
@   act = import("activation").backward(p)
@ end
}  // namespace ${p.kernel}_impl

@ if kind == "dgrad_down" then
/* u and du may be the same buffer: each element of Ur is read, then its
 * gradient written, by one thread. */
extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ dys, const moe_half_t *__restrict__ w2, const moe_half_t *u,
            const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, moe_half_t *du) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    const moe_half_t *__restrict__ a = dys;
    const moe_half_t *__restrict__ b = w2;
@ elseif kind == "dgrad_up" then
extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ du, const moe_half_t *__restrict__ w1p,
            const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, moe_half_t *__restrict__ dxs) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    const moe_half_t *__restrict__ a = du;
    const moe_half_t *__restrict__ b = w1p;
@ else
/* beta 0: out = the product; beta 1: out += it (a slot with no rows keeps
 * its out). */
extern "C" __global__ void __launch_bounds__(${p.threads})
${p.kernel}(const moe_half_t *__restrict__ a, const moe_half_t *__restrict__ b, const int *__restrict__ offsets,
            const int *__restrict__ counts, const int *__restrict__ slot_of, ${out_t} *__restrict__ out, int beta,
            int nslots) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    (void)nslots;  /* the grid's z (the sm_90a kernel's persistent grid walks the slots itself) */
@ end
    extern __shared__ __align__(16) unsigned char ${p.kernel}_smem[];
    const unsigned sbase = moe_smem_addr(${p.kernel}_smem);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int g = lane >> 2, t = lane & 3;
    int mt, nt;
    tile_coords(mt, nt);
    const int n0 = nt * BN;
@ if wgrad then
    const int gi = (int)blockIdx.z;
    const int rows = counts[gi], first = offsets[gi];
    if (rows <= 0 && beta)
        return;
    const int m0 = mt * BM;
@ else
    if (mt >= *num_tiles)
        return;
    const int slot = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
    if (rows <= 0)
        return;
@ end

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                acc[mi][ni][j] = 0.0f;
@ if wgrad then
    if (rows > 0)
        mainloop(acc, sbase, a + ((long long)first * LDA + m0), M - m0, b + ((long long)first * LDB + n0), N - n0,
                 rows, true);

    /* fragment (mi, ni): rows m, m + 8 and columns n, n + 1 of the output */
    ${out_t} *__restrict__ o = out + (long long)slot_of[gi] * ((long long)M * N);
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        const int n = n0 + wn * WTN + ni * 8 + 2 * t;
        if (n >= N)  /* N % 8 == 0: the whole n8 fragment is in or out */
            continue;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm * WTM + mi * 16 + g + 8 * h;
                if (m >= M)
                    continue;
@   if grad_half then
                unsigned *p = (unsigned *)(o + ((long long)m * N + n));
                float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
                if (beta) {
                    const unsigned old = *p;
                    v0 += moe_lo_float(old);
                    v1 += moe_hi_float(old);
                }
                *p = moe_pack2(v0, v1);
@   else
                float2 *p = (float2 *)(o + ((long long)m * N + n));
                float2 v = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
                if (beta) {
                    const float2 old = *p;
                    v.x += old.x;
                    v.y += old.y;
                }
                *p = v;
@   end
            }
    }
}
@ else
    mainloop(acc, sbase, a + (long long)row_start * LDA, rows, b + ((long long)slot * K * N + n0), N - n0, K,
             wm * WTM < rows);

@   if kind == "dgrad_down" then
    /* The activation backward: fragment (mi, ni) holds dA at rows r, r + 8
     * and columns f, f + 1 (of F); their gate and up columns in the packed
     * order (gen/pack_geom.h) are pairs too, since f is even and the
     * granule is. Fragments go in chunks of DN: the chunk's U loads are all
     * issued before its first dU store (du may alias u, so no load may move
     * above a store; each element is read, then written, by one thread). */
    const long long F2 = 2LL * N;
    constexpr int DN = NI < 2 ? NI : 2;
    static_assert(NI % DN == 0, "dgrad_down epilogue chunks");
@   local A = import("activation")
@   local function call(args) return A.call_slot(p, act, "slot", args) end
#pragma unroll
    for (int n0c = 0; n0c < NI; n0c += DN) {
        unsigned ug[DN][MI][2], uu[DN][MI][2];
#pragma unroll
        for (int nn = 0; nn < DN; ++nn) {
            const int f = n0 + wn * WTN + (n0c + nn) * 8 + 2 * t;
            const long long pg = moe_pack_row(f, N), pu = moe_pack_row(N + f, N);
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = wm * WTM + mi * 16 + g + 8 * h;
                    const bool in = f < N && r < rows;
                    const long long row = (long long)(row_start + r) * F2;
                    ug[nn][mi][h] = in ? *(const unsigned *)(u + row + pg) : 0u;
                    uu[nn][mi][h] = in ? *(const unsigned *)(u + row + pu) : 0u;
                }
        }
#pragma unroll
        for (int nn = 0; nn < DN; ++nn) {
            const int ni = n0c + nn, f = n0 + wn * WTN + ni * 8 + 2 * t;
            if (f >= N)
                continue;
            const long long pg = moe_pack_row(f, N), pu = moe_pack_row(N + f, N);
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = wm * WTM + mi * 16 + g + 8 * h;
                    if (r >= rows)
                        continue;
                    const long long row = (long long)(row_start + r) * F2;
                    const unsigned vg = ug[nn][mi][h], vu = uu[nn][mi][h];
                    float dg0, du0, dg1, du1;
                    ${call("moe_lo_float(vg), moe_lo_float(vu), acc[mi][ni][2 * h], dg0, du0")};
                    ${call("moe_hi_float(vg), moe_hi_float(vu), acc[mi][ni][2 * h + 1], dg1, du1")};
                    *(unsigned *)(du + row + pg) = moe_pack2(dg0, dg1);
                    *(unsigned *)(du + row + pu) = moe_pack2(du0, du1);
                }
        }
    }
}
@   else
    /* fragment (mi, ni): rows r, r + 8 and columns c, c + 1 of dXs */
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        const int c = n0 + wn * WTN + ni * 8 + 2 * t;
        if (c >= N)
            continue;
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * WTM + mi * 16 + g + 8 * h;
                if (r < rows)
                    *(unsigned *)(dxs + ((long long)(row_start + r) * N + c)) =
                        moe_pack2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
    }
}
@   end
@ end
