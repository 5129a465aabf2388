@ -- gemm_sm80.lua — the sm_80 grouped expert GEMM that gemm_up_swiglu.lua
@ -- and gemm_down.lua build their sm_80 kernels from: the tile checks, the
@ -- cp.async pipeline feeding mma.sync m16n8k16 through ldmatrix, the CTA
@ -- raster and the staged, vectorized tile store. The tile raster
@ -- (tile_of) is shared with gemm_sm90.lua; the activation is
@ -- templates/activation.lua's.
@ --
@ -- Layout: A (activations) and B (weights) are both K-major, so one smem
@ -- stage is BM rows and BN rows of BK halves, each row padded by 8 halves
@ -- (a row stride of 4 mod 8 words keeps ldmatrix and cp.async writes free
@ -- of bank conflicts); stage s holds its A tile then its B tile. After the
@ -- main loop the same smem holds the output tile, so the global stores are
@ -- 16-byte pieces of whole rows.
@ local M = {}
@
@ -- The tile raster, shared with gemm_sm90.lua.
@ function M.tile_of(group_m)
/* Linear tile id lin -> (M tile mt, N tile nt) over mtiles x ntiles. M
 * tiles are rastered in groups of GROUP_M, M fastest inside a group, so
 * the CTAs working at the same time read the same B (weight) tiles and
 * those come from L2. A bijection on [0, mtiles * ntiles). */
static __device__ __forceinline__ void tile_of(int lin, int mtiles, int ntiles, int &mt, int &nt) {
@   if group_m <= 1 then
    (void)mtiles;
    mt = lin / ntiles;
    nt = lin % ntiles;
@   else
    constexpr int GROUP_M = ${group_m};
    const int group = lin / (GROUP_M * ntiles);
    const int first = group * GROUP_M;
    const int size = mtiles - first < GROUP_M ? mtiles - first : GROUP_M;
    const int within = lin - group * (GROUP_M * ntiles);
    mt = first + within % size;
    nt = within / size;
@   end
}
@ end
@
@ function M.tile_coords(group_m)
@   M.tile_of(group_m)

/* This CTA's (M tile, N tile) on a grid of N tiles x M tiles. */
static __device__ __forceinline__ void tile_coords(int &mt, int &nt) {
    tile_of((int)blockIdx.y * (int)gridDim.x + (int)blockIdx.x, (int)gridDim.y, (int)gridDim.x, mt, nt);
}
@ end
@
@ -- Check p's tile for a GEMM of this kind and derive the kernel's
@ -- constants. kind = "up": B is the packed [2F, H] W1 and the output is
@ -- [rows, F]; kind = "down": B is [H, F] W2 and the output is [rows, H].
@ function M.config(p, kind)
@   local t = p.tile
@   local c = { bm = t.bm, bn = t.bn, bk = t.bk, stages = t.stages, wm = t.warps_m, wn = t.warps_n }
@   if kind == "up" then
@     c.K, c.N, c.bno, c.nout = p.H, 2 * p.F, t.bn // 2, p.F
@   else
@     c.K, c.N, c.bno, c.nout = p.F, p.H, t.bn, p.H
@   end
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 3) end
@   end
@   need(c.wm >= 1 and c.wn >= 1 and c.stages >= 2, "need warps_m, warps_n >= 1 and stages >= 2")
@   need(c.bm % (16 * c.wm) == 0, "bm / warps_m must be a multiple of 16")
@   need(c.bn % (16 * c.wn) == 0, "bn / warps_n must be a multiple of 16")
@   need(c.bk % 16 == 0, "bk must be a multiple of 16")
@   need(c.K % 8 == 0 and c.N % 8 == 0, "K and N must be multiples of 8")
@   if kind == "up" then
@     need(p.pair_granule == 8, "the SwiGLU epilogue pairs gate/up in granules of 8 (one n8 fragment)")
@   end
@   c.threads = p.threads
@   c.ptx_type = ({ bf16 = "bf16", fp16 = "f16" })[p.dtype] or error(p.kernel .. ": unknown dtype " .. tostring(p.dtype), 2)
@   c.lds = c.bk + 8                                    -- smem row stride, halves
@   c.a_stage = c.bm * c.lds * 2                        -- bytes of one stage's A tile
@   c.b_stage = c.bn * c.lds * 2                        -- and B tile
@   c.smem = p.smem                                     -- the plan's; device_code checks the pipeline is it
@   c.ldc = c.bno + 8                                   -- staged output row stride, halves
@   c.staged = c.bm * c.ldc * 2 <= p.smem               -- else the epilogue stores straight from registers
@   c.n_tail = c.N % c.bn ~= 0                          -- B rows past N in the last N tile
@   c.k_tail = c.K % c.bk ~= 0
@   c.out_tail = c.nout % c.bno ~= 0
@   c.cpr = c.bk // 8
@   -- every thread copies whole 8-row groups of both operands: chunk i is row r0 + i * threads / cpr
@   c.regular = p.threads % (8 * c.cpr) == 0 and (c.bm * c.cpr) % p.threads == 0 and (c.bn * c.cpr) % p.threads == 0
@   c.group_m = t.group_m                               -- M tiles rastered together so they share B tiles in L2
@   return c
@ end
@
@ -- The device code both kernels share; emitted inside the kernel's own
@ -- namespace, which the caller opens.
@ function M.device_code(p, c)
constexpr int BM = ${c.bm}, BN = ${c.bn}, BK = ${c.bk}, STAGES = ${c.stages};
constexpr int WARPS_M = ${c.wm}, WARPS_N = ${c.wn}, THREADS = ${c.threads};
constexpr int K = ${c.K};        /* reduction length */
constexpr int N = ${c.N};        /* rows of B */
constexpr int NOUT = ${c.nout};  /* output row length */
constexpr int BNO = ${c.bno};    /* output columns per CTA */
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
constexpr int MI = WTM / 16, NI = WTN / 8;
constexpr int LDS = ${c.lds};                     /* smem row stride, halves */
constexpr int A_BYTES = ${c.a_stage};            /* one stage: A tile, then B tile */
constexpr int STAGE_BYTES = ${c.a_stage + c.b_stage};
constexpr int LDC = ${c.ldc};                     /* staged output row stride, halves */
constexpr int CPR = BK / 8;                       /* 16-byte chunks per smem row */
constexpr int KTILES = (K + BK - 1) / BK;
constexpr int KSTEPS = BK / 16;
constexpr bool N_TAIL = ${c.n_tail and "true" or "false"};
constexpr bool K_TAIL = ${c.k_tail and "true" or "false"};
constexpr bool OUT_TAIL = ${c.out_tail and "true" or "false"};
/* the plan's numbers (gen/family_gemm.c): the block is the warp grid, the
 * pipeline is its shared memory */
static_assert(THREADS == 32 * WARPS_M * WARPS_N, "threads: one warp per warp tile");
static_assert(STAGES * STAGE_BYTES == ${c.smem}, "the cp.async pipeline is the plan's shared memory");

static __device__ __forceinline__ void cp_async16(unsigned s, const void *g, int bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
static __device__ __forceinline__ void ldsm_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned s) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
}
/* D += A(16x16, row) . B(16x8, col), fp32 accumulate (moe_mma_16816 on
 * array references, so fragments stay in registers). */
static __device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.${c.ptx_type}.${c.ptx_type}.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ __forceinline__ void st_shared_u32(unsigned s, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(s), "r"(v) : "memory");
}
/* 16 bytes smem -> global. */
static __device__ __forceinline__ void copy16_s2g(void *g, unsigned s) {
    unsigned a, b, c, d;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(s) : "memory");
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" :: "l"(g), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

@   M.tile_coords(c.group_m)

/* The cp.async copies of one k tile (BK halves from k0) of a K-major
 * operand of ROWS rows into one smem stage at s, from g (row 0, k 0).
 * Lanes 8j..8j+7 take one 16-byte column of 8 consecutive rows, so the
 * smem writes are conflict-free. Rows >= nrows (when ROW_TAIL) and chunks
 * past K are zero-filled: src-size 0 reads nothing at its address. */
@   if c.regular then
/* Every thread copies the same column ch0 of rows r0 + i * RSTEP; s and g
 * arrive offset to this thread's chunk 0 (row r0, k ch0 * 8). */
constexpr int RSTEP = THREADS / CPR;
template <int ROWS, bool ROW_TAIL>
static __device__ __forceinline__ void load_rows(unsigned s, const moe_half_t *__restrict__ g, int r0, int ch0,
                                                 int nrows, int k0) {
#pragma unroll
    for (int i = 0; i < ROWS / RSTEP; ++i) {
        const bool ok = (!ROW_TAIL || r0 + i * RSTEP < nrows) && (!K_TAIL || k0 + ch0 * 8 < K);
        cp_async16(s + i * RSTEP * LDS * 2, g + (i * RSTEP * K + k0), ok ? 16 : 0);
    }
}
@   else
/* Chunks are spread over the threads one index at a time (r0, ch0 unused;
 * s and g arrive at row 0, k 0). */
template <int ROWS, bool ROW_TAIL>
static __device__ __forceinline__ void load_rows(unsigned s, const moe_half_t *__restrict__ g, int r0, int ch0,
                                                 int nrows, int k0) {
    constexpr int CHUNKS = ROWS * CPR;
    constexpr int ITERS = (CHUNKS + THREADS - 1) / THREADS;
    const int tid = (int)threadIdx.x;
    (void)r0;
    (void)ch0;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
        const int idx = tid + i * THREADS;
        if (CHUNKS % THREADS == 0 || idx < CHUNKS) {
            const int r = (idx / (8 * CPR)) * 8 + idx % 8;
            const int ch = (idx / 8) % CPR;
            const bool ok = (!ROW_TAIL || r < nrows) && (!K_TAIL || k0 + ch * 8 < K);
            cp_async16(s + (r * LDS + ch * 8) * 2, g + (r * K + ch * 8 + k0), ok ? 16 : 0);
        }
    }
}
@   end

/* One k tile of A and B into the stage at smem offset so; see load_rows. */
static __device__ __forceinline__ void load_stage(unsigned s, unsigned so, const moe_half_t *__restrict__ ga,
                                                  int a_rows, const moe_half_t *__restrict__ gb, int b_rows, int r0,
                                                  int ch0, int k0) {
    load_rows<BM, true>(s + so, ga, r0, ch0, a_rows, k0);
    load_rows<BN, N_TAIL>(s + so + A_BYTES, gb, r0, ch0, b_rows, k0);
}

/* ldmatrix sources. A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7),
 * (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3 of one m16 fragment.
 * B (n-major rows): (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
 * (n 8-15, k 8-15) = b0, b1 of two n8 fragments. a/b: this lane's row
 * address in the stage, at the k step. */
static __device__ __forceinline__ void load_b(unsigned (&bf)[NI][2], unsigned b) {
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj)
        ldsm_x4(bf[2 * nj][0], bf[2 * nj][1], bf[2 * nj + 1][0], bf[2 * nj + 1][1], b + nj * 16 * LDS * 2);
}
static __device__ __forceinline__ void load_a(unsigned (&af)[MI][4], unsigned a) {
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
        ldsm_x4(af[mi], a + mi * 16 * LDS * 2);
}

/* One k16 step of mma on (af, bf), fetching the next step's fragments
 * from (a, b) as it goes: all of B first, then each A fragment as soon as
 * its last mma has issued, so only one A set is live. */
static __device__ __forceinline__ void mma_step(float (&acc)[MI][NI][4], unsigned (&af)[MI][4], unsigned (&bf)[NI][2],
                                                unsigned a, unsigned b) {
    unsigned bn[NI][2];
    load_b(bn, b);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
            mma16816(acc[mi][ni], af[mi], bf[ni]);
        ldsm_x4(af[mi], a + mi * 16 * LDS * 2);
    }
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        bf[ni][0] = bn[ni][0];
        bf[ni][1] = bn[ni][1];
    }
}

/* acc (this warp's WTM x WTN fp32 tile) = A[0:a_rows, :K] . B[0:b_rows, :K]^T
 * over the CTA tile. ga/gb point at row 0, k 0 of the tile. Warps whose
 * rows all lie past a_rows (active = false) only help load. Ends with the
 * smem free for reuse.
 *
 * Pipeline: k tile kt sits in stage kt % STAGES. Iteration kt first issues
 * the copy of k tile kt + STAGES - 1 into the stage k tile kt - 1 used
 * (every warp finished reading it before the barrier of the previous
 * iteration's last k step), then runs its k steps; the last step waits for
 * k tile kt + 1, syncs, and fetches that tile's step-0 fragments while the
 * mma of the current step run (see mma_step). */
static __device__ __forceinline__ void mainloop(float (&acc)[MI][NI][4], unsigned sbase,
                                                const moe_half_t *__restrict__ ga, int a_rows,
                                                const moe_half_t *__restrict__ gb, int b_rows, bool active) {
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    /* this lane's ldmatrix row addresses in stage 0, k step 0 */
    const unsigned a_lane = sbase + ((wm * WTM + (lane & 15)) * LDS + (lane >> 4) * 8) * 2;
    const unsigned b_lane =
        sbase + A_BYTES + ((wn * WTN + (lane & 7) + ((lane >> 4) << 3)) * LDS + ((lane >> 3) & 1) * 8) * 2;
@   if c.regular then
    /* this thread's first copy chunk: row r0, 16-byte column ch0 */
    const int r0 = (tid / (8 * CPR)) * 8 + tid % 8, ch0 = (tid / 8) % CPR;
    const unsigned scopy = sbase + (r0 * LDS + ch0 * 8) * 2;
    ga += r0 * K + ch0 * 8;
    gb += r0 * K + ch0 * 8;
@   else
    const int r0 = 0, ch0 = 0;
    const unsigned scopy = sbase;
@   end

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KTILES)
            load_stage(scopy, s * STAGE_BYTES, ga, a_rows, gb, b_rows, r0, ch0, s * BK);
        moe_cp_async_commit();
    }

    unsigned af[MI][4], bf[NI][2];
    moe_cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (active) {
        load_a(af, a_lane);
        load_b(bf, b_lane);
    }

    unsigned rd = 0;  /* smem offset of the stage being read (k tile kt) */
    for (int kt = 0; kt < KTILES; ++kt) {
        if (kt + STAGES - 1 < KTILES)
            load_stage(scopy, rd == 0 ? (STAGES - 1) * STAGE_BYTES : rd - STAGE_BYTES, ga, a_rows, gb, b_rows, r0,
                       ch0, (kt + STAGES - 1) * BK);
        moe_cp_async_commit();
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            if (ks == KSTEPS - 1) {
                moe_cp_async_wait<STAGES - 2>();
                __syncthreads();
                rd = rd == (STAGES - 1) * STAGE_BYTES ? 0 : rd + STAGE_BYTES;
            }
            /* the last step fetches step 0 of k tile kt + 1 (after the last
             * tile, a harmless read of a stale stage) */
            const unsigned next = ks < KSTEPS - 1 ? rd + (ks + 1) * 32 : rd;
            if (active)
                mma_step(acc, af, bf, a_lane + next, b_lane + next);
        }
    }
    moe_cp_async_wait<0>();
    __syncthreads();
}

/* Copy the staged output tile (BM x BNO halves at smem sc, row stride LDC)
 * to out (row 0, column 0 of the tile; row stride NOUT) in 16-byte pieces:
 * rows < rows, columns < cols. */
static __device__ __forceinline__ void store_staged(moe_half_t *__restrict__ out, unsigned sc, int rows, int cols) {
    constexpr int OCPR = BNO / 8;
    constexpr int CHUNKS = BM * OCPR;
    constexpr int ITERS = (CHUNKS + THREADS - 1) / THREADS;
    const int tid = (int)threadIdx.x;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
        const int idx = tid + i * THREADS;
        const int r = idx / OCPR, ch = idx % OCPR;
        if ((CHUNKS % THREADS == 0 || idx < CHUNKS) && r < rows && (!OUT_TAIL || ch * 8 < cols))
            copy16_s2g(out + ((long long)r * NOUT + ch * 8), sc + (r * LDC + ch * 8) * 2);
    }
}
@ end
@
@ -- Opening lines of a kernel body: the tile lookup and early exit, the
@ -- smem base, the CTA's operand pointers and the accumulators; then the
@ -- main loop. Names the caller's parameters: a (A rows, [*, K]), b (B of
@ -- all experts, [E, N, K]), tiles, num_tiles.
@ function M.body_start(p, c, a, b)
    extern __shared__ __align__(16) unsigned char ${p.kernel}_smem[];
    int mt, nt;
    tile_coords(mt, nt);
    if (mt >= *num_tiles)
        return;
    const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
    if (rows <= 0)
        return;
    const int n0 = nt * BN;
    const unsigned sbase = moe_smem_addr(${p.kernel}_smem);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int g = lane >> 2, t = lane & 3;

    float acc[MI][NI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                acc[mi][ni][j] = 0.0f;
    mainloop(acc, sbase, ${a} + (long long)row_start * K, rows,
             ${b} + (long long)expert * ((long long)N * K) + (long long)n0 * K, N - n0, wm * WTM < rows);
@ end
@
@ return M
