@ -- gemm_sm90.lua — the grouped expert GEMMs for Hopper (sm_90a): wgmma
@ -- with both operands in shared memory, fp32 accumulators in registers,
@ -- one producer warpgroup feeding a multi-stage ring and CONSUMERS
@ -- consumer warpgroups. M.up(p) emits the up projection with the SwiGLU
@ -- fused in, M.down(p) the down projection; both keep the ABI and the
@ -- semantics of gemm_up_swiglu.lua / gemm_down.lua (read their headers).
@ --
@ -- Tile (p.tile): bm x bn x bk, stages, consumers, group_m. Consumer
@ -- warpgroup w owns rows [w * bm / consumers, (w + 1) * bm / consumers) of
@ -- the CTA tile, as bm / consumers / 64 wgmma m64nBNk16 blocks, so each
@ -- thread holds bm / consumers / 64 * bn / 2 fp32 accumulators.
@ -- p.threads = 128 * (consumers + 1): warpgroup 0 produces (setmaxnreg
@ -- moves its registers to the consumers). ptxas still allocates the whole
@ -- kernel under the launch cap (168 registers at 384 threads, 128 at 512),
@ -- so the accumulators plus ~40 must fit that cap: m64n256 per consumer
@ -- works with 2 consumers, not with 3.
@ --
@ -- Shared memory (1024-byte aligned): STAGES stages, each the A tile (bm
@ -- rows) then the B tile (bn rows), both K-major in the 128-byte swizzle
@ -- that wgmma reads: bk / 64 atoms along k, each ROWS x 128 bytes, the
@ -- 16-byte chunk c of row r stored at chunk c ^ (r % 8); then 2 * STAGES
@ -- mbarriers (full[s], empty[s]). So
@ --   smem >= stages * (bm + bn) * bk * 2 + 16 * stages.
@ -- The output tile is staged through the same memory after the main loop
@ -- (bm x (bn_out + 8) halves, which must fit in the stages).
@ --
@ -- Operands: per-thread 16-byte cp.async (zero-filled past rows, N and K)
@ -- from the producer into the swizzled layout; each producer thread's
@ -- cp.async.mbarrier.arrive.noinc completes full[s] (count 128); consumers
@ -- fence.proxy.async before wgmma reads the stage and arrive on empty[s]
@ -- once their wgmma of that stage retired. TMA (cp.async.bulk.tensor) is
@ -- the next step; it needs host-made tensor maps the ABI does not pass yet.
@ --
@ -- The kernel body exists only in the sm_90a pass; other targets get a body
@ -- that traps (the launcher calls this kernel only on compute capability 9).
@ local M = {}
@
@ local PRODUCER_REGS = 72
@
@ -- Check p's tile for a GEMM of this kind and derive the kernel's
@ -- constants. kind = "up": B is the packed [2F, H] W1 and the output is
@ -- [rows, F]; kind = "down": B is [H, F] W2 and the output is [rows, H].
@ local function config(p, kind)
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 3) end
@   end
@   local t = p.tile
@   need(type(t) == "table", "p.tile is missing")
@   local c = { bm = t.bm, bn = t.bn, bk = t.bk, stages = t.stages, consumers = t.consumers, group_m = t.group_m or 1 }
@   for _, k in ipairs({ "bm", "bn", "bk", "stages", "consumers" }) do
@     need(math.type(c[k]) == "integer" and c[k] > 0, "tile." .. k .. " must be a positive integer")
@   end
@   if kind == "up" then
@     c.K, c.N, c.bno, c.nout = p.H, 2 * p.F, c.bn // 2, p.F
@   else
@     c.K, c.N, c.bno, c.nout = p.F, p.H, c.bn, p.H
@   end
@   need(c.stages >= 2, "need stages >= 2")
@   need(p.threads == 128 * (c.consumers + 1), "threads must be 128 * (consumers + 1): one producer warpgroup")
@   need(c.bm % (64 * c.consumers) == 0, "bm must be a multiple of 64 * consumers (m64 wgmma blocks per consumer)")
@   need(c.bn % 8 == 0 and c.bn <= 256, "bn must be a multiple of 8, at most 256 (one wgmma n)")
@   need(c.bk % 64 == 0 and c.bk <= 128, "bk must be 64 or 128 (128-byte swizzle atoms of 64 halves)")
@   need(c.K % 8 == 0 and c.N % 8 == 0, "K and N must be multiples of 8")
@   if kind == "up" then
@     need(c.bn % 16 == 0, "bn must be a multiple of 16 (gate/up pairs)")
@     need(p.pair_granule == 8, "the SwiGLU epilogue pairs gate/up in granules of 8 (one n8 accumulator block)")
@   end
@   c.ptx_type = ({ bf16 = "bf16", fp16 = "f16" })[p.dtype] or error(p.kernel .. ": unknown dtype " .. tostring(p.dtype), 2)
@   c.wg_rows = c.bm // c.consumers
@   c.wm = c.wg_rows // 64                              -- m64 blocks per consumer
@   c.nacc = c.bn // 2                                  -- fp32 accumulators per thread per m64 block
@   -- ptxas allocates the whole kernel under the launch cap (65536 / threads), setmaxnreg or not
@   c.reg_cap = math.min(255, (65536 // p.threads) // 8 * 8)
@   need(c.wm * c.nacc + 40 <= c.reg_cap, string.format("%d accumulators per consumer thread (bm / consumers / 64 * "
@        .. "bn / 2) do not fit the %d-register cap of %d threads", c.wm * c.nacc, c.reg_cap, p.threads))
@   c.cpr = c.bk // 8                                   -- 16-byte chunks per operand row
@   c.rstep = 128 // c.cpr                              -- rows one producer pass covers
@   need(c.bm % c.rstep == 0 and c.bn % c.rstep == 0, "bm and bn must be multiples of 128 / (bk / 8)")
@   c.a_bytes, c.b_bytes = c.bm * c.bk * 2, c.bn * c.bk * 2
@   c.stage_bytes = c.a_bytes + c.b_bytes
@   c.bar_off = c.stages * c.stage_bytes
@   c.smem = c.bar_off + 16 * c.stages
@   need(c.smem <= p.smem, string.format("the %d-stage pipeline needs %d bytes of smem (stages * (bm + bn) * bk * 2 + "
@        .. "16 * stages), the plan gives %d", c.stages, c.smem, p.smem))
@   need(c.smem <= 232448, string.format("%d bytes of smem exceed the 227 KB a Hopper CTA can have", c.smem))
@   c.ldc = c.bno + 8                                   -- staged output row stride, halves
@   need(c.bm * c.ldc * 2 <= c.bar_off, "the staged output tile does not fit in the pipeline stages")
@   c.n_tail = c.N % c.bn ~= 0
@   c.k_tail = c.K % c.bk ~= 0
@   c.out_tail = c.nout % c.bno ~= 0
@   -- registers: the launch cap, then the producer gives all but PRODUCER_REGS to the consumers
@   if c.consumers >= 2 then
@     c.consumer_regs = math.min(240, ((c.reg_cap * p.threads - 128 * PRODUCER_REGS) // (128 * c.consumers)) // 8 * 8)
@     need(c.consumer_regs > c.reg_cap, "setmaxnreg cannot give the consumers more registers")
@   end
@   return c
@ end
@
@ -- A comma-separated list of fmt with i = lo..hi substituted, split over
@ -- lines of per items (each but the last line ending in a comma).
@ local function operand_lines(fmt, n, per)
@   local lines = {}
@   for i = 0, n - 1, per do
@     local l = {}
@     for j = i, math.min(i + per, n) - 1 do l[#l + 1] = string.format(fmt, j) end
@     lines[#lines + 1] = table.concat(l, ", ") .. (i + per < n and "," or "")
@   end
@   return lines
@ end
@
@ local ARCH_GUARD = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)"
@
@ -- The device code both kernels share, inside the kernel's namespace.
@ local function device_code(p, c)
constexpr int BM = ${c.bm}, BN = ${c.bn}, BK = ${c.bk}, STAGES = ${c.stages}, CONSUMERS = ${c.consumers};
constexpr int K = ${c.K};        /* reduction length */
constexpr int N = ${c.N};        /* rows of B */
constexpr int NOUT = ${c.nout};  /* output row length */
constexpr int BNO = ${c.bno};    /* output columns per CTA */
constexpr int WG_ROWS = BM / CONSUMERS;  /* rows per consumer warpgroup */
constexpr int WM = WG_ROWS / 64;         /* m64 wgmma blocks per consumer */
constexpr int NACC = BN / 2;             /* fp32 accumulators per thread and m64 block */
constexpr int A_BYTES = ${c.a_bytes}, STAGE_BYTES = ${c.stage_bytes};
constexpr int BAR_OFF = ${c.bar_off};    /* full[STAGES], then empty[STAGES] */
constexpr int CPR = BK / 8, RSTEP = 128 / CPR;  /* producer: chunks per row, rows per pass */
constexpr int KTILES = (K + BK - 1) / BK, KSTEPS = BK / 16;
constexpr int LDC = ${c.ldc};            /* staged output row stride, halves */
constexpr int CTHREADS = 128 * CONSUMERS;
constexpr bool N_TAIL = ${c.n_tail and "true" or "false"};
constexpr bool K_TAIL = ${c.k_tail and "true" or "false"};
constexpr bool OUT_TAIL = ${c.out_tail and "true" or "false"};
static_assert(STAGE_BYTES % 1024 == 0 && A_BYTES % 1024 == 0 && (WG_ROWS * 128) % 1024 == 0, "swizzle atoms");

static __device__ __forceinline__ void cp_async16(unsigned s, const void *g, int bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" :: "r"(s), "l"(g), "r"(bytes) : "memory");
}
/* Arrive on the mbarrier at b once this thread's earlier cp.async landed
 * (noinc: the arrival counts against the barrier's expected count). */
static __device__ __forceinline__ void cp_async_arrive(unsigned b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(b) : "memory");
}
static __device__ __forceinline__ void bar_init(unsigned b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(b), "r"(count) : "memory");
}
static __device__ __forceinline__ void bar_arrive(unsigned b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(b) : "memory");
}
/* Wait until the phase of parity `parity` of the mbarrier at b completed. */
static __device__ __forceinline__ void bar_wait(unsigned b, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" :: "r"(b), "r"(parity) : "memory");
}
static __device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" :: "n"(CTHREADS) : "memory");
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

/* wgmma smem matrix descriptor: K-major, 128-byte swizzle, 8-row groups
 * 1024 bytes apart (the leading offset is unused for this layout). */
static __device__ __forceinline__ unsigned long long sdesc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
/* d (64 x BN fp32, this thread's part) += A(64 x 16) . B(BN x 16)^T. */
static __device__ __forceinline__ void wgmma(float (&d)[NACC], unsigned long long da, unsigned long long db) {
@   local regs = {}
@   for i = 0, c.nacc - 1 do regs[#regs + 1] = "%" .. i end
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %${c.nacc + 2}, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n${c.bn}k16.f32.${c.ptx_type}.${c.ptx_type}\n"
                 "{${table.concat(regs, ", ")}},\n"
                 "%${c.nacc}, %${c.nacc + 1}, p, 1, 1, 0, 0;\n"
                 "}\n"
@   local outs = operand_lines('"+f"(d[%d])', c.nacc, 8)
@   for i, l in ipairs(outs) do
                 ${i == 1 and ": " or "  "}${l}
@   end
                 : "l"(da), "l"(db), "r"(1));
}
/* Keep the compiler from moving accumulator accesses across a wgmma wait. */
static __device__ __forceinline__ void fence_acc(float (&d)[NACC]) {
    asm volatile(""
@   for i, l in ipairs(outs) do
                 ${i == 1 and ": " or "  "}${l}
@   end
                 :: "memory");
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING> static __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory");
}

@   import("gemm_common").tile_coords(c.group_m)

/* The producer warpgroup (tid 0..127): every k tile of A (rows < a_rows
 * of ga) and B (rows < b_rows of gb) into the ring. Thread tid copies
 * 16-byte column ch = tid % CPR of rows tid / CPR + i * RSTEP, so all its
 * rows share r % 8 and one swizzled slot; a warp writes 4 (or 2) whole
 * 128-byte rows, conflict-free. Stage s is refilled once empty[s] says
 * every active consumer's wgmma of its previous round retired. */
static __device__ __forceinline__ void produce(unsigned sbase, const moe_half_t *__restrict__ ga, int a_rows,
                                               const moe_half_t *__restrict__ gb, int b_rows, int tid) {
    const int ch = tid % CPR, r0 = tid / CPR;
    const unsigned sw = (unsigned)(r0 * 128 + (((ch & 7) ^ (r0 & 7)) << 4));
    const unsigned sa = sbase + (unsigned)(ch >> 3) * (BM * 128) + sw;
    const unsigned sb = sbase + A_BYTES + (unsigned)(ch >> 3) * (BN * 128) + sw;
    ga += (long long)r0 * K + ch * 8;
    gb += (long long)r0 * K + ch * 8;
    a_rows -= r0;
    b_rows -= r0;
    int s = 0;
    unsigned phase = 0;
    for (int kt = 0; kt < KTILES; ++kt) {
        bar_wait(sbase + BAR_OFF + (STAGES + s) * 8, phase ^ 1);
        const bool kok = !K_TAIL || kt * BK + ch * 8 < K;
        const unsigned so = (unsigned)s * STAGE_BYTES;
#pragma unroll
        for (int i = 0; i < BM / RSTEP; ++i)
            cp_async16(sa + so + i * RSTEP * 128, ga + i * RSTEP * K, kok && i * RSTEP < a_rows ? 16 : 0);
#pragma unroll
        for (int i = 0; i < BN / RSTEP; ++i)
            cp_async16(sb + so + i * RSTEP * 128, gb + i * RSTEP * K, kok && (!N_TAIL || i * RSTEP < b_rows) ? 16 : 0);
        cp_async_arrive(sbase + BAR_OFF + s * 8);
        ga += BK;
        gb += BK;
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* A consumer warpgroup (cw): acc (its WG_ROWS x BN fp32 tile) = A . B^T
 * over all k tiles. The wgmma of k tile kt stay in flight while the
 * warpgroup waits for tile kt + 1; a stage is released once the wgmma
 * that read it retired (wait_group 1 after the next commit). */
static __device__ __forceinline__ void consume(float (&acc)[WM][NACC], unsigned sbase, int cw) {
    const unsigned long long da0 = sdesc(sbase + (unsigned)cw * (WG_ROWS * 128));
    const unsigned long long db0 = sdesc(sbase + A_BYTES);
    int s = 0, prev = 0;
    unsigned phase = 0;
    for (int kt = 0; kt < KTILES; ++kt) {
        bar_wait(sbase + BAR_OFF + s * 8, phase);
        fence_proxy_async();
        wgmma_fence();
        const unsigned long long so = (unsigned long long)(s * (STAGE_BYTES >> 4));
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int m = 0; m < WM; ++m)
                wgmma(acc[m], da0 + so + (unsigned)(((ks / 4) * (BM * 128) + m * (64 * 128) + (ks % 4) * 32) >> 4),
                      db0 + so + (unsigned)(((ks / 4) * (BN * 128) + (ks % 4) * 32) >> 4));
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > 0)
            bar_arrive(sbase + BAR_OFF + (STAGES + prev) * 8);
        prev = s;
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < WM; ++m)
        fence_acc(acc[m]);
}

/* Copy the staged output tile (BM x BNO halves at smem sc, row stride LDC)
 * to out (row 0, column 0 of the tile; row stride NOUT) in 16-byte pieces:
 * rows < rows, columns < cols. ct: consumer thread 0..CTHREADS-1. */
static __device__ __forceinline__ void store_staged(moe_half_t *__restrict__ out, unsigned sc, int rows, int cols,
                                                    int ct) {
    constexpr int OCPR = BNO / 8;
    constexpr int CHUNKS = BM * OCPR;
    constexpr int ITERS = (CHUNKS + CTHREADS - 1) / CTHREADS;
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
        const int idx = ct + i * CTHREADS;
        const int r = idx / OCPR, ch = idx % OCPR;
        if ((CHUNKS % CTHREADS == 0 || idx < CHUNKS) && r < rows && (!OUT_TAIL || ch * 8 < cols))
            copy16_s2g(out + ((long long)r * NOUT + ch * 8), sc + (r * LDC + ch * 8) * 2);
    }
}
@ end
@
@ -- The kernel: signature, guard, tile lookup, barrier setup, the role
@ -- split; epilogue(p, c) emits the consumer's staging of acc (names in
@ -- scope: acc, sbase, cw, w, g, q, expert, n0, rows; the staged tile
@ -- starts at sbase with row stride LDC); out/oc0 name the output.
@ local function kernel(p, c, args, a, b, out, bias_arg, oc0, preamble, epilogue)
${ARCH_GUARD}
namespace ${p.kernel}_impl {
@   device_code(p, c)
@   if preamble then preamble() end
}  // namespace ${p.kernel}_impl
#endif

extern "C" __global__ void __launch_bounds__(${p.threads}, 1)
${p.kernel}(${args}) {
${ARCH_GUARD}
    using namespace ${p.kernel}_impl;
    extern __shared__ __align__(1024) unsigned char ${p.kernel}_smem[];
    int mt, nt;
    tile_coords(mt, nt);
    if (mt >= *num_tiles)
        return;
    const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
    if (rows <= 0)
        return;
    const int n0 = nt * BN;
    const unsigned sbase = moe_smem_addr(${p.kernel}_smem);
    if (sbase & 1023u)
        __trap();  /* the swizzle atoms need 1024-byte alignment */
    const int tid = (int)threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    /* consumer warpgroups with rows of the tile; the others skip the main loop */
    const int n_active = ((rows < BM ? rows : BM) + WG_ROWS - 1) / WG_ROWS;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            bar_init(sbase + BAR_OFF + s * 8, 128);
            bar_init(sbase + BAR_OFF + (STAGES + s) * 8, 128 * n_active);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
@   if c.consumer_regs then
        asm volatile("setmaxnreg.dec.sync.aligned.u32 ${PRODUCER_REGS};\n" ::: "memory");
@   end
        produce(sbase, ${a} + (long long)row_start * K, rows,
                ${b} + (long long)expert * ((long long)N * K) + (long long)n0 * K, N - n0, tid);
    } else {
@   if c.consumer_regs then
        asm volatile("setmaxnreg.inc.sync.aligned.u32 ${c.consumer_regs};\n" ::: "memory");
@   end
        const int ct = tid - 128, cw = wg - 1, w = (ct >> 5) & 3, lane = ct & 31, g = lane >> 2, q = lane & 3;
        float acc[WM][NACC];
#pragma unroll
        for (int m = 0; m < WM; ++m)
#pragma unroll
            for (int i = 0; i < NACC; ++i)
                acc[m][i] = 0.0f;
        if (cw < n_active)
            consume(acc, sbase, cw);
        /* every consumer's wgmma retired: the stages are free for the output tile */
        fence_proxy_async();
        consumers_sync();
@   if not p.ffn_bias then
        (void)${bias_arg};
@   end
        if (cw < n_active) {
@   epilogue()
        }
        consumers_sync();
        store_staged(${out} + ((long long)row_start * NOUT + ${oc0}), sbase, rows, NOUT - ${oc0}, ct);
    }
#else
@   for v in args:gmatch("([%w_]+),") do
    (void)${v};
@   end
    (void)${args:match("([%w_]+)$")};
    __trap();
#endif
}
@ end
@
@ function M.up(p)
@   local c = config(p, "up")
@   local args = "const moe_half_t *__restrict__ xs, const moe_half_t *__restrict__ w1p, " ..
@                "const moe_half_t *__restrict__ b1p, const moe_tile_t *__restrict__ tiles, " ..
@                "const int *__restrict__ num_tiles, moe_half_t *__restrict__ hbuf"
@   local function preamble()
@     import("gemm_common").swiglu(p)
@   end
@   local function epilogue()
            /* Packed column 16j + r is gate (r < 8) or up (r >= 8) of output
             * column 8j + r % 8: accumulator block 2j (registers 8j..8j+3) is
             * gate and 2j + 1 (8j+4..8j+7) up; registers 2h, 2h + 1 of a block
             * are row 16w + g + 8h, columns 2q, 2q + 1. */
@     if p.ffn_bias then
            const moe_half_t *__restrict__ bias = b1p + (long long)expert * N + n0;
@     end
#pragma unroll
            for (int j = 0; j < BN / 16; ++j) {
@     local bg0, bg1, bu0, bu1 = "", "", "", ""
@     if p.ffn_bias then
@       bg0, bg1, bu0, bu1 = " + bg0", " + bg1", " + bu0", " + bu1"
                float bg0 = 0.0f, bg1 = 0.0f, bu0 = 0.0f, bu1 = 0.0f;
                if (!N_TAIL || n0 + j * 16 < N) {
                    const unsigned bg = *(const unsigned *)(bias + j * 16 + 2 * q);
                    const unsigned bu = *(const unsigned *)(bias + j * 16 + 8 + 2 * q);
                    bg0 = moe_lo_float(bg);
                    bg1 = moe_hi_float(bg);
                    bu0 = moe_lo_float(bu);
                    bu1 = moe_hi_float(bu);
                }
@     end
#pragma unroll
                for (int m = 0; m < WM; ++m)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = cw * WG_ROWS + m * 64 + w * 16 + g + 8 * h;
                        const float o0 = swiglu(acc[m][8 * j + 2 * h]${bg0}, acc[m][8 * j + 4 + 2 * h]${bu0});
                        const float o1 = swiglu(acc[m][8 * j + 2 * h + 1]${bg1}, acc[m][8 * j + 5 + 2 * h]${bu1});
                        st_shared_u32(sbase + (r * LDC + 8 * j + 2 * q) * 2, moe_pack2(o0, o1));
                    }
            }
@   end
@   kernel(p, c, args, "xs", "w1p", "hbuf", "b1p", "n0 / 2", preamble, epilogue)
@ end
@
@ function M.down(p)
@   local c = config(p, "down")
@   local args = "const moe_half_t *__restrict__ hbuf, const moe_half_t *__restrict__ w2, " ..
@                "const moe_half_t *__restrict__ b2, const moe_tile_t *__restrict__ tiles, " ..
@                "const int *__restrict__ num_tiles, moe_half_t *__restrict__ obuf"
@   local function epilogue()
            /* Accumulator block j (registers 4j..4j+3): rows 16w + g + 8h,
             * columns 8j + 2q, 8j + 2q + 1. */
@     if p.ffn_bias then
            const moe_half_t *__restrict__ bias = b2 + (long long)expert * N + n0;
@     end
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
@     local b0, b1 = "", ""
@     if p.ffn_bias then
@       b0, b1 = " + b0", " + b1"
                float b0 = 0.0f, b1 = 0.0f;
                if (!N_TAIL || n0 + j * 8 < N) {
                    const unsigned bv = *(const unsigned *)(bias + j * 8 + 2 * q);
                    b0 = moe_lo_float(bv);
                    b1 = moe_hi_float(bv);
                }
@     end
#pragma unroll
                for (int m = 0; m < WM; ++m)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = cw * WG_ROWS + m * 64 + w * 16 + g + 8 * h;
                        st_shared_u32(sbase + (r * LDC + 8 * j + 2 * q) * 2,
                                      moe_pack2(acc[m][4 * j + 2 * h]${b0}, acc[m][4 * j + 2 * h + 1]${b1}));
                    }
            }
@   end
@   kernel(p, c, args, "hbuf", "w2", "obuf", "b2", "n0", nil, epilogue)
@ end
@
@ return M
