@ -- gemm_gemv.lua — the grouped expert GEMMs for few rows per expert (the
@ -- "gemv" grid, docs/DESIGN.md "The GEMM ABI"): decode-sized calls,
@ -- where the layer is bound by reading the touched experts' weights once.
@ -- M.up(p) emits the up projection with the activation fused in, M.down(p)
@ -- the down projection; both keep the semantics of gemm_up_swiglu.lua /
@ -- gemm_down.lua (read their headers) and their arguments (raw pointers,
@ -- as the sm_80 kernels: no tensor maps), so every launcher runs them on
@ -- the sm_80 kernels' 2D grid: blockIdx.x the N slice (BN weight rows of
@ -- one expert), blockIdx.y the M tile of the tile table. A CTA whose tile
@ -- is past *num_tiles, or has no rows, returns.
@ --
@ -- Tile (p.tile): bm (the tile table's row block), bn (the weight rows of
@ -- W1p / W2 a CTA owns: 8, 16, 32, 64, 128 or 256), stages = U (the K loop's
@ -- unroll: 16-byte loads in flight per weight row and lane: 1, 2 or 4),
@ -- kc (the activation columns staged at a time, gen/family_gemm.c). 256
@ -- threads, 8 warps; a warp owns groups of 4 weight rows (group gi =
@ -- warp, warp + 8, ... < BN / 4) and reads them whole: its 32 lanes
@ -- stride the rows' K in 16-byte vectors, U vectors of each of the 4 rows
@ -- in flight per lane. Up: group gi of a 16-row pair block holds gate
@ -- rows 2q, 2q + 1 and the matching up rows 8 + 2q, 9 + 2q (q = gi % 4,
@ -- gen/pack_geom.h), so one group yields 2 output columns; down: 4
@ -- consecutive rows, 4 output columns. Groups are numbered across the
@ -- expert's rows (group g = n0 / 4 + gi), so a CTA of 8 up rows holds half
@ -- a pair block: gate 2q, 2q + 1 of q = g % 4 and their up rows.
@ -- With bn 8 or 16 (2 or 4 groups, fewer than the warps) WPG = 8 / groups
@ -- warps share a group: warp w takes group w % groups and the K loop's
@ -- batches w / groups, + WPG, ... (each a U x 32-vector batch), so a
@ -- lane's loads of the CTA's whole slab are in flight in fewer round trips
@ -- (one at bn 8 with K <= 2048 and U = 2); after the in-warp reduction the
@ -- warps write their sums to shared memory and the group's first warp adds
@ -- them in warp order (the same sum on every run) and stores.
@ --
@ -- Rows: the tile's rows run in chunks of at most 8 (R = 1, 2, 4 or 8 by
@ -- what is left: R rows' accumulators, R x 4 per lane), so any row count
@ -- is correct; past 8 rows a CTA reads its weights once per chunk (from
@ -- L2), which is why the grid is for few rows. "gemv3" (p.tile.gemv = 3,
@ -- bf16 / fp16, bn >= 32, unroll <= 2): chunks of at most 2 rows (R = 1
@ -- or 2) under __launch_bounds__(256, 3), so three CTAs share an SM and a
@ -- grid of up to 3 x 132 CTAs is one wave (more weight streams in flight
@ -- an SM; a third of the registers left for rows, so 3 or more rows read
@ -- the weights again from L2). "gemv4" (p.tile.gemv = 6, the same
@ -- limits): rows one at a time (R = 1) under __launch_bounds__(256, 4),
@ -- four CTAs an SM (64 registers: unroll 2 fits without spilling), a
@ -- grid of up to 4 x 132 CTAs one wave; every further row of a tile reads
@ -- the CTA's weights again from L2. A chunk's R rows x KC
@ -- columns of A (xs or hbuf) are staged in shared memory (rows past the
@ -- tile's zero-filled), once when K <= KC, else once per KC columns and
@ -- group pass; each warp issues its first batch of weight loads before the
@ -- staging barrier, so they are in flight while A is staged. fp32
@ -- accumulators; after the K loop a warp's 4R sums per lane are reduced
@ -- across the lanes by halving (lane l keeps the sums of value
@ -- l >> (5 - log2 4R)), then the epilogue rounds once as the
@ -- other kernels do: act(gate + bias, up + bias) to the dtype (training:
@ -- the pre-activation gate + bias and up + bias rounded into ubuf at
@ -- their packed columns), or acc + bias to the dtype.
@ --
@ -- Shared memory: 8 * KC halves (gemv3: 2 * KC, gemv4: KC), then with WPG > 1 the 8 warps' 32 sums
@ -- (fp32) (p.smem, gen/family_gemm.c; static_assert).
@ --
@ -- The combine, folded into the down GEMM (gen/launch_geom.h,
@ -- moe_combine_fuse: one device, calls of at most MOE_COMBINE_FUSE_TOKENS
@ -- tokens): given y, every CTA of a tile below *num_tiles (empty tiles
@ -- too) takes its column slice's ticket (combine_tickets[blockIdx.x],
@ -- zeroed with the counts) once its output rows are stored; the slice's
@ -- last CTA resets the ticket and writes y over the slice's columns for
@ -- every token: Σ_k topk_w[t, k] · obuf[row_of[t, k]] (weight 1 with
@ -- router.apply = "input"), fp32 in increasing k, rounded once —
@ -- combine.lua's sum, so y is the bits the combine kernel writes. With y
@ -- NULL (an expert-parallel or training path, larger calls,
@ -- MOEGEN_COMBINE_FUSE=off) the kernel is the plain down GEMM.
@ local M = {}
@
@ local THREADS, WARPS, ROWS = 256, 8, 8
@
@ -- Check p's tile and derive the kernel's constants for kind "up" or "down".
@ local function config(p, kind)
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 3) end
@   end
@   local t = p.tile
@   need(type(t) == "table" and (t.gemv or 0) > 0, "p.tile is not a gemv tile")
@   local c = { bm = t.bm, bn = t.bn, unroll = t.stages, kc = t.kc }
@   need(c.bn == 8 or c.bn == 16 or c.bn == 32 or c.bn == 64 or c.bn == 128 or c.bn == 256,
@        "tile.bn must be 8, 16, 32, 64, 128 or 256")
@   local stream = t.gemv == 4 or t.gemv == 5   -- "stream", or "chain" (stream, the up kernel chaining the down's)
@   need(stream or c.unroll == 1 or c.unroll == 2 or c.unroll == 4, "tile.stages (the unroll) must be 1, 2 or 4")
@   need(p.threads == (stream and THREADS + 32 or THREADS), "p.threads must be " .. THREADS .. " (stream: " .. THREADS + 32 .. ")")
@   if kind == "up" then
@     c.K, c.N, c.nout, c.up = p.H, 2 * p.F, p.F, true
@     need(p.F % 8 == 0, "F must be a multiple of 8 (the gate/up pairing granule)")
@   else
@     c.K, c.N, c.nout = p.F, p.H, p.H
@     need(p.H % 4 == 0, "H must be a multiple of 4 (whole groups of 4 output columns)")
@   end
@   need(c.K % 8 == 0, "K must be a multiple of 8 (16-byte rows)")
@   need(math.type(c.kc) == "integer" and c.kc > 0 and c.kc % 8 == 0, "tile.kc must be a positive multiple of 8")
@   c.fp8 = p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3"
@   c.rows = ROWS
@   c.occ = 2      -- CTAs an SM (__launch_bounds__'s second argument where it is given)
@   if stream then   -- "stream": a persistent grid, the weights streamed by bulk copies (stream_code)
@     need(c.bn == 16, "stream: tile.bn must be 16 (a work item: one pairing block of the up GEMM)")
@     need(t.stages >= 2 and t.stages <= 8, "stream: tile.stages (the ring's stages) must be 2 .. 8")
@     need(c.N % 16 == 0, "stream: the weight rows (2F up, H down) must be a multiple of 16")
@     need(p.spec.quant == nil or p.spec.quant.weights ~= "fp8_e4m3", "stream: bf16 and fp16 weights only")
@     c.stream, c.stages = true, t.stages
@     c.slot = 16 * c.kc * 2   -- a ring slot: 16 rows x KC halves
@     -- "chain" (gen/family_gemm.c, moe_gemm_chains): the up kernel runs the down GEMM and the combine after
@     -- it in the same grid; its ring slots hold either GEMM's stage (tile.kc_down: the down GEMM's KC)
@     c.chain = kind == "up" and t.chain == 1
@     if c.chain then
@       need(math.type(t.kc_down) == "integer" and t.kc_down > 0 and t.kc_down % 8 == 0, "chain: tile.kc_down must be a positive multiple of 8")
@       need(p.H % 16 == 0, "chain: H (the down GEMM's weight rows) must be a multiple of 16")
@       c.slot = 16 * math.max(c.kc, t.kc_down) * 2
@     end
@     return c
@   end
@   -- "gemv3": rows in chunks of 2, three CTAs an SM (80 registers); "gemv4": rows one at a time, four (64)
@   local few = ({ [3] = { "gemv3", 2, 3, 80, "three" }, [6] = { "gemv4", 1, 4, 64, "four" } })[t.gemv]
@   if few then
@     need(c.bn >= 32 and c.unroll <= 2, few[1] .. ": tile.bn must be 32 .. 256 and tile.stages 1 or 2")
@     need(not c.fp8, few[1] .. ": bf16 and fp16 weights only")
@     c.rows, c.occ = few[2], few[3]
@     c.bounds = string.format("<= %d registers: %s CTAs an SM (%s)", few[4], few[5], few[1])
@   end
@   if c.fp8 then   -- e4m3 operands: 16 of them a vector, scale blocks of 128 along K
@     c.rows = 4    -- rows a chunk: within 128 registers (two CTAs an SM) without spills
@     c.block = p.spec.quant.scaling == "block"
@     need(c.K % 128 == 0 and c.kc % 128 == 0, "fp8: K and tile.kc must be multiples of 128 (the scale block)")
@     -- the up GEMM's output is quantized per 128 columns (256 packed rows): a cluster of 256 / bn CTAs
@     c.cluster = kind == "up" and 256 // c.bn or 1
@     need(kind ~= "up" or c.bn >= 32, "fp8: the up GEMM's tile.bn must be 32 .. 256 (a cluster of at most 8 CTAs)")
@   end
@   return c
@ end
@
@ -- acc += w's 8 halves times x's 8 floats (the gemv and stream kernels' multiply).
@ local function dot8_code()
/* acc += the 8 products of w's and x's halves, in fp32. */
static __device__ __forceinline__ float dot8(const uint4 &w, const float (&x)[8], float acc) {
    acc = fmaf(moe_lo_float(w.x), x[0], acc);
    acc = fmaf(moe_hi_float(w.x), x[1], acc);
    acc = fmaf(moe_lo_float(w.y), x[2], acc);
    acc = fmaf(moe_hi_float(w.y), x[3], acc);
    acc = fmaf(moe_lo_float(w.z), x[4], acc);
    acc = fmaf(moe_hi_float(w.z), x[5], acc);
    acc = fmaf(moe_lo_float(w.w), x[6], acc);
    return fmaf(moe_hi_float(w.w), x[7], acc);
}
@ end
@
@ -- The pieces both element types share: a group's weight rows, the
@ -- warp's spread sum, a batch of weight loads (16-byte vectors).
@ local function group_row_code(c)
/* Row j (0..3) of group gi: the expert's weight row, in the slice from n0. */
static __device__ __forceinline__ int group_row(int n0, int gi, int j) {
@ if c.up then
    if constexpr (BN >= 16) {  /* n0 starts a pairing block */
        return n0 + (gi >> 2) * 16 + (j >> 1) * 8 + 2 * (gi & 3) + (j & 1);  /* gate 2q, 2q+1; up 8+2q, 9+2q */
    } else {
        const int g = (n0 >> 2) + gi;  /* the expert's group: pairing block g / 4, q = g % 4 */
        return (g >> 2) * 16 + (j >> 1) * 8 + 2 * (g & 3) + (j & 1);
    }
@ else
    return n0 + 4 * gi + j;
@ end
}
@ end
@
@ local function spread_sum_code()
/* Sum each of v[0..V) over the warp, spread: halving steps exchange half
 * the values (the lane with bit OFF set keeps the upper half), then the
 * last value is summed across the remaining lane bits. Afterwards v[0] of
 * lane l is the warp's sum of value l >> (5 - log2 V). */
template <int V, int OFF, int SZ>
static __device__ __forceinline__ void spread_sum(float (&v)[SZ], int lane) {
    if constexpr (OFF > 0) {
        if constexpr (V > 1) {
            const bool hi = (lane & OFF) != 0;
#pragma unroll
            for (int i = 0; i < V / 2; ++i) {
                const float send = hi ? v[i] : v[i + V / 2], keep = hi ? v[i + V / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
            }
            spread_sum<V / 2, OFF / 2>(v, lane);
        } else {
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], OFF);
            spread_sum<1, OFF / 2>(v, lane);
        }
    }
}
@ end
@
@ local function load_batch_code()
/* The U vectors v0, v0 + 32, ... (those below kv; zeros past it) of the 4
 * weight rows wr, from vector kv0 on: U x 4 16-byte loads in flight. */
static __device__ __forceinline__ void load_batch(uint4 (&wv)[U][4], const uint4 *const (&wr)[4], int kv0, int v0,
                                                  int kv) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            wv[u][j] = v0 + 32 * u < kv ? __ldg(wr[j] + kv0 + v0 + 32 * u) : make_uint4(0u, 0u, 0u, 0u);
}
@ end
@
@ -- After a group pass's K loop (inside run_rows' group loop): the warp's
@ -- 4R sums spread over its lanes, then with WPG > 1 the group's warps'
@ -- sums added in shared memory at `red` (an expression) by its first warp;
@ -- leaves s, r, j for the epilogue (or continues past a dead group).
@ local function reduce_code(red)
        if constexpr (WPG == 1) {
            if (!live)
                continue;
        }
        spread_sum<V, 16>(acc, lane);
        /* this lane's sum: value idx = 4 r + j (all lanes of one idx hold it; the first stores) */
        const int idx = lane >> SHIFT, r = idx >> 2, j = idx & 3;
        float s = acc[0];
        if constexpr (WPG > 1) {  /* the group's warps' sums, added by its first warp in warp order */
            float *red = reinterpret_cast<float *>(${red});
            red[warp * 32 + lane] = s;
            __syncthreads();
            if (kp != 0 || !live)
                continue;
#pragma unroll
            for (int w = 1; w < WPG; ++w)
                s += red[(warp + w * GROUPS) * 32 + lane];
        }
@ end
@
@ -- The device code before the kernel: constants, the staging, the
@ -- reduction and the chunk loop with the epilogue `epilogue` (a function
@ -- emitting the lines that store value `s` of row r, group row j).
@ local function device_code(p, c, epilogue_args, epilogue)
constexpr int K = ${c.K}, N = ${c.N}, NOUT = ${c.nout}, BN = ${c.bn}, KC = ${c.kc}, U = ${c.unroll};
constexpr int THREADS = ${THREADS}, WARPS = ${WARPS}, ROWS = ${c.rows}, GROUPS = BN / 4;
constexpr int WPG = GROUPS < WARPS ? WARPS / GROUPS : 1;  /* warps sharing a group's K (bn 8, 16) */
constexpr int NKC = (K + KC - 1) / KC;  /* staged column chunks */
static_assert(${p.smem} == ROWS * KC * 2 + (WPG > 1 ? WARPS * 32 * 4 : 0),
              "the plan's shared memory (gen/family_gemm.c): ROWS rows x KC halves, then the warps' sums");
static_assert(GROUPS % WARPS == 0 || WARPS % GROUPS == 0,
              "every warp runs the same group passes (they meet at the staging barriers)");

@ group_row_code(c)
@ dot8_code()

@ spread_sum_code()
/* Stage A's rows [0, R) of the chunk (nrows real, the rest zeros), columns
 * [k0, k0 + KC) (past K: zeros), into sx: row r at sx + r * KC / 8. */
template <int R>
static __device__ __forceinline__ void stage(const moe_half_t *__restrict__ a, int nrows, int k0, uint4 *sx) {
    constexpr int KV = KC / 8;
    for (int i = (int)threadIdx.x; i < R * KV; i += THREADS) {
        const int r = i / KV, k = k0 + (i - r * KV) * 8;
        sx[i] = r < nrows && k < K ? __ldg(reinterpret_cast<const uint4 *>(a + (long long)r * K + k))
                                   : make_uint4(0u, 0u, 0u, 0u);
    }
}

@ load_batch_code()
/* One chunk of R (1, 2, 4 or 8) rows: a is its first row of A, nrows <= R
 * of them real, orow the first one's row in the output; w the expert's
 * weights [N, K], n0 the CTA's first weight row. */
template <int R>
static __device__ __forceinline__ void run_rows(const moe_half_t *__restrict__ a, int nrows, long long orow,
                                                const moe_half_t *__restrict__ w, int n0, uint4 *sx${epilogue_args}) {
    constexpr int V = 4 * R, SHIFT = R == 1 ? 3 : R == 2 ? 2 : R == 4 ? 1 : 0;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int kp = WPG > 1 ? warp / GROUPS : 0;  /* this warp's share of the group's K batches */
    constexpr int VSTEP = 32 * U * WPG;   /* vectors between a lane's batches */
    __syncthreads();  /* the previous chunk's readers are done with sx (and with the warps' sums) */
    for (int gb = 0; gb < GROUPS; gb += WARPS) {
        const int gi = WPG > 1 ? warp % GROUPS : gb + warp;
        const bool live = group_row(n0, gi, 0) < N;  /* whole groups: N's granule holds them */
        const uint4 *wr[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            wr[j] = reinterpret_cast<const uint4 *>(w + (long long)(live ? group_row(n0, gi, j) : 0) * K);
        float acc[V];
#pragma unroll
        for (int i = 0; i < V; ++i)
            acc[i] = 0.0f;
        for (int kc = 0; kc < NKC; ++kc) {
            const int kv = ((K - kc * KC) < KC ? (K - kc * KC) : KC) / 8, kv0 = kc * (KC / 8);
            const int vfirst = lane + kp * 32 * U;
            uint4 wv[U][4];  /* the first batch of weight vectors: in flight while A is staged */
            if (live)
                load_batch(wv, wr, kv0, vfirst, kv);
            if (NKC > 1 || gb == 0) {  /* block-uniform; with one pass, staged once per chunk */
                if (NKC > 1)
                    __syncthreads();  /* the last pass's readers are done with sx */
                stage<R>(a, nrows, kc * KC, sx);
                __syncthreads();
            }
            if (!live)
                continue;
            for (int v0 = vfirst; v0 < kv; v0 += VSTEP) {
                if (v0 != vfirst)
                    load_batch(wv, wr, kv0, v0, kv);
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    if (v0 + 32 * u >= kv)
                        break;
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const uint4 xv = sx[r * (KC / 8) + v0 + 32 * u];
                        const float x[8] = {moe_lo_float(xv.x), moe_hi_float(xv.x), moe_lo_float(xv.y),
                                            moe_hi_float(xv.y), moe_lo_float(xv.z), moe_hi_float(xv.z),
                                            moe_lo_float(xv.w), moe_hi_float(xv.w)};
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            acc[4 * r + j] = dot8(wv[u][j], x, acc[4 * r + j]);
                    }
                }
            }
        }
@ reduce_code("sx + ROWS * KC / 8")
@ epilogue()
    }
}
@ end
@
@ -- The fp8 device code (quant.weights = "fp8_e4m3", docs/DESIGN.md "FP8"):
@ -- A is e4m3 rows with an fp32 scale per 128 columns (xs / xsc for up,
@ -- hbuf / hsc for down), W e4m3 with w1s / w2s ("block": one per 128 x 128
@ -- block, [slot, N / 128, K / 128], plain row order, gate blocks then up;
@ -- "channel": one per row, [slot, N], applied in the epilogue). A vector is
@ -- 16 e4m3 of one scale block (8 vectors a block): a lane's partial sum of
@ -- its 16 products, in fp32 from the exact values, enters the accumulator
@ -- times the A row's scale and the weight block's, so no sum longer than
@ -- 16 products runs at the blocks' mixed scales (the recipe's per-block
@ -- promotion, at a finer grain). The chunk's R rows x KC columns of A are
@ -- staged as e4m3 bytes (KC up to 8192: every example's K in one pass)
@ -- with their KC / 128 scales per row. The up GEMM's epilogue keeps
@ -- act(gate, up) in fp32 in shared memory; once every group is done, the
@ -- row's amax over the quantization block (128 output columns = 256
@ -- packed rows = the cluster's 256 / bn CTAs, whose amaxes each CTA reads
@ -- through distributed shared memory) gives scale amax / 448, and each CTA
@ -- stores its columns as e4m3(v * (448 / amax)) (the tile kernel's rule);
@ -- the cluster's rank 0 the scale. Two cluster barriers a chunk: the
@ -- amaxes written, then read (before they are overwritten or the CTA
@ -- exits). The down GEMM's epilogue stores bf16 as the 16-bit kernel.
@ -- Rows run in chunks of at most 4 (R = 1, 2 or 4: within 128 registers,
@ -- so two CTAs an SM, without spills). Shared memory (bytes): 4 x KC
@ -- e4m3, 4 x KC / 128 scales (fp32), then up: 4 x bn / 2 activations and
@ -- 4 amaxes (fp32); with WPG > 1 the warps' sums (p.smem,
@ -- gen/family_gemm.c; static_assert).
@ local function device_code8(p, c, epilogue_args, epilogue, after)
constexpr int K = ${c.K}, N = ${c.N}, NOUT = ${c.nout}, BN = ${c.bn}, KC = ${c.kc}, U = ${c.unroll};
constexpr int THREADS = ${THREADS}, WARPS = ${WARPS}, ROWS = ${c.rows}, GROUPS = BN / 4;
constexpr int WPG = GROUPS < WARPS ? WARPS / GROUPS : 1;  /* warps sharing a group's K (bn 8, 16) */
constexpr int NKC = (K + KC - 1) / KC;  /* staged column chunks */
constexpr int KB = K / 128, KBC = KC / 128, KV16 = KC / 16;  /* scale blocks of K and of a chunk; its vectors */
constexpr int CLUSTER = ${c.cluster};  /* CTAs sharing the up GEMM's 128-column quantization blocks */
constexpr int OFF_SA = ROWS * KC, OFF_ACT = OFF_SA + ROWS * KBC * 4;  /* byte offsets in shared memory */
constexpr int OFF_AMAX = OFF_ACT + ${c.up and "ROWS * (BN / 2) * 4" or "0"}, OFF_RED = OFF_AMAX + ${c.up and "ROWS * 4" or "0"};
static_assert(${p.smem} == OFF_RED + (WPG > 1 ? WARPS * 32 * 4 : 0),
              "the plan's shared memory (gen/family_gemm.c): 4 rows x KC e4m3 and their scales, then (up) the "
              "activations and amaxes, then the warps' sums");
static_assert(GROUPS % WARPS == 0 || WARPS % GROUPS == 0,
              "every warp runs the same group passes (they meet at the staging barriers)");
static_assert(K % 128 == 0 && KC % 128 == 0 && CLUSTER * BN == ${c.up and "256" or "BN"}, "whole scale blocks");

@ group_row_code(c)
@ spread_sum_code()
/* The 16 e4m3 of v as floats (exact): e4m3 pairs to f16 pairs, then fp32. */
static __device__ __forceinline__ void e4m3x16(const uint4 &v, float (&f)[16]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned lo, hi;
        moe_e4m3x4_h2(w[i], lo, hi);
        f[4 * i] = moe_h2_lo(lo);
        f[4 * i + 1] = moe_h2_hi(lo);
        f[4 * i + 2] = moe_h2_lo(hi);
        f[4 * i + 3] = moe_h2_hi(hi);
    }
}

/* Stage A's rows [0, R) of the chunk (nrows real, the rest zeros), columns
 * [k0, k0 + KC) (past K: zeros), e4m3 into sm (row r at r * KC bytes), and
 * their scales (row r's KBC at OFF_SA + r * KBC * 4; 0 past the rows). */
template <int R>
static __device__ __forceinline__ void stage(const unsigned char *__restrict__ a, const float *__restrict__ asc,
                                             int nrows, int k0, unsigned char *sm) {
    uint4 *sx = reinterpret_cast<uint4 *>(sm);
    float *ssa = reinterpret_cast<float *>(sm + OFF_SA);
    for (int i = (int)threadIdx.x; i < R * KV16; i += THREADS) {
        const int r = i / KV16, k = k0 + (i - r * KV16) * 16;
        sx[i] = r < nrows && k < K ? __ldg(reinterpret_cast<const uint4 *>(a + (long long)r * K + k))
                                   : make_uint4(0u, 0u, 0u, 0u);
    }
    for (int i = (int)threadIdx.x; i < R * KBC; i += THREADS) {
        const int r = i / KBC, kb = k0 / 128 + (i - r * KBC);
        ssa[i] = r < nrows && kb < KB ? __ldg(asc + (long long)r * KB + kb) : 0.0f;
    }
}

@ load_batch_code()
/* One chunk of R (1, 2, 4 or 8) rows: a is its first row of A (e4m3), asc
 * that row's scales, nrows <= R of them real, orow the first one's row in
 * the output; w the expert's e4m3 weights [N, K], ws its scales, n0 the
 * CTA's first weight row. */
template <int R>
static __device__ __forceinline__ void run_rows(const unsigned char *__restrict__ a, const float *__restrict__ asc,
                                                int nrows, long long orow, const unsigned char *__restrict__ w,
                                                const float *__restrict__ ws, int n0, unsigned char *sm${epilogue_args}) {
    constexpr int V = 4 * R, SHIFT = R == 1 ? 3 : R == 2 ? 2 : R == 4 ? 1 : 0;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int kp = WPG > 1 ? warp / GROUPS : 0;  /* this warp's share of the group's K batches */
    constexpr int VSTEP = 32 * U * WPG;   /* vectors between a lane's batches */
    const uint4 *sx = reinterpret_cast<const uint4 *>(sm);
    const float *ssa = reinterpret_cast<const float *>(sm + OFF_SA);
    __syncthreads();  /* the previous chunk's readers are done with sm (and with the warps' sums) */
    for (int gb = 0; gb < GROUPS; gb += WARPS) {
        const int gi = WPG > 1 ? warp % GROUPS : gb + warp;
        const bool live = group_row(n0, gi, 0) < N;  /* whole groups: N's granule holds them */
        const uint4 *wr[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            wr[j] = reinterpret_cast<const uint4 *>(w + (long long)(live ? group_row(n0, gi, j) : 0) * K);
@ if c.block and c.up then
        /* the group's gate rows' scale block (a pairing block's 8 gate rows are plain rows 8 (pr >> 4) ..,
         * so packed row pr's is pr >> 8) and its up rows' (N / 256 blocks further) */
        const float *__restrict__ sbg = ws + (long long)(group_row(n0, gi, 0) >> 8) * KB;
        const float *__restrict__ sbu = sbg + (long long)(N / 256) * KB;
@ elseif c.block then
        const float *__restrict__ sbd = ws + (long long)(group_row(n0, gi, 0) >> 7) * KB;  /* the 4 rows' block */
@ end
        float acc[V];
#pragma unroll
        for (int i = 0; i < V; ++i)
            acc[i] = 0.0f;
        for (int kc = 0; kc < NKC; ++kc) {
            const int kv = ((K - kc * KC) < KC ? (K - kc * KC) : KC) / 16, kv0 = kc * KV16;
            const int vfirst = lane + kp * 32 * U;
            uint4 wv[U][4];  /* the first batch of weight vectors: in flight while A is staged */
            if (live)
                load_batch(wv, wr, kv0, vfirst, kv);
            if (NKC > 1 || gb == 0) {  /* block-uniform; with one pass, staged once per chunk */
                if (NKC > 1)
                    __syncthreads();  /* the last pass's readers are done with sm */
                stage<R>(a, asc, nrows, kc * KC, sm);
                __syncthreads();
            }
            if (!live)
                continue;
            for (int v0 = vfirst; v0 < kv; v0 += VSTEP) {
                if (v0 != vfirst)
                    load_batch(wv, wr, kv0, v0, kv);
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int v = v0 + 32 * u;  /* the vector in the chunk; its scale block v / 8 */
                    if (v >= kv)
                        break;
@ if c.block and c.up then
                    const float bg = __ldg(sbg + kc * KBC + (v >> 3)), bu = __ldg(sbu + kc * KBC + (v >> 3));
@ elseif c.block then
                    const float bd = __ldg(sbd + kc * KBC + (v >> 3));
@ end
                    unsigned wh[4][8];  /* the 4 rows' 16 weights as f16 pairs (exact), widened at each use */
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        const unsigned wj[4] = {wv[u][j].x, wv[u][j].y, wv[u][j].z, wv[u][j].w};
#pragma unroll
                        for (int i = 0; i < 4; ++i)
                            moe_e4m3x4_h2(wj[i], wh[j][2 * i], wh[j][2 * i + 1]);
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        float x[16];
                        e4m3x16(sx[r * KV16 + v], x);
                        const float sa = ssa[r * KBC + (v >> 3)];
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            float part = moe_h2_lo(wh[j][0]) * x[0];
                            part = fmaf(moe_h2_hi(wh[j][0]), x[1], part);
#pragma unroll
                            for (int e = 1; e < 8; ++e) {
                                part = fmaf(moe_h2_lo(wh[j][e]), x[2 * e], part);
                                part = fmaf(moe_h2_hi(wh[j][e]), x[2 * e + 1], part);
                            }
@ if c.block and c.up then
                            acc[4 * r + j] = fmaf(part, sa * (j < 2 ? bg : bu), acc[4 * r + j]);
@ elseif c.block then
                            acc[4 * r + j] = fmaf(part, sa * bd, acc[4 * r + j]);
@ else
                            acc[4 * r + j] = fmaf(part, sa, acc[4 * r + j]);  /* the row's scale: the epilogue's */
@ end
                        }
                    }
                }
            }
        }
@ reduce_code("sm + OFF_RED")
@ epilogue()
    }
@ if after then
@   after()
@ end
}
@ end
@
@ -- The "stream" grid (p.tile.gemv = 4, bf16 / fp16): a persistent grid
@ -- (gen/launch_geom.h, moe_gemv_stream_ctas: a few CTAs an SM) whose
@ -- CTAs split the call's work items evenly: item i = tile i / NB, block
@ -- i % NB of 16 weight rows (up: one pairing block, gate rows 0..7 and
@ -- their up rows 8..15, so 8 output columns; down: 16 output columns);
@ -- CTA c takes items [c n / G, (c + 1) n / G) of n = *num_tiles x NB, so
@ -- its weights are a few long runs of consecutive rows. A ninth warp
@ -- (its lane 0; 288 threads) streams them into a ring of S stages (16
@ -- rows x KC columns, one bulk copy a row, or one for all 16 when KC = K)
@ -- that completes on the stage's `full` mbarrier, and refills a stage
@ -- once the 8 consumer warps have arrived on its `empty` one; it runs
@ -- ahead of them by S stages across items, tiles and passes, so the weight
@ -- stream never waits on their math or epilogues (in run 76's first form
@ -- thread 0 of warp 0 did both, and each refill waited on its own
@ -- warp's math). Warp w < 8 owns rows w and w + 8 of the block (up: gate and up
@ -- of column 8 b + w; down: columns 16 b + w, + 8): its lanes stride
@ -- the stage's 16-byte vectors and multiply them with A's rows (xs or
@ -- hbuf, read from L1 / L2), a tile's rows in passes of XR = 8 (a pass
@ -- reads the block's weights again: the grid is for few rows), with 2 x 8
@ -- fp32 sums a lane. After a pass's last stage the sums are added across
@ -- the warp (xor butterfly) and lane r stores row r's outputs, rounded
@ -- once as the other kernels do. Tiles without rows take no stage (their
@ -- items still take the combine's ticket). The combine, folded in as
@ -- the gemv grid's (y non-NULL), runs per block: ticket b after the item
@ -- of every tile, its last CTA writing y's 16 columns (the consumer warps
@ -- meet at named barrier 1, without the producer warp, which has exited).
@ -- Shared memory: S slots of 16 x KC halves, then the 2 S mbarriers and
@ -- 16 bytes (the combine's "last CTA" flag) (p.smem, gen/family_gemm.c).
@ --
@ -- The chain (p.tile.gemv = 5, c.chain: the up kernel of a plan that is
@ -- not a training one; docs/DESIGN.md "The chain"): the up kernel carries
@ -- the down GEMM and the combine. Its namespace holds the stream code twice,
@ -- su (the up GEMM's constants) and sd (the down GEMM's), over one ring
@ -- whose slots hold 16 rows x the wider KC; the producer streams the CTA's
@ -- up stages, then its down stages (stage numbers running on); the
@ -- consumers run the up items, then, with y non-NULL, meet and count the
@ -- CTA done (one release), and run the down items block-major (each warp
@ -- first waiting for every CTA's count, hbuf then read through L2) with
@ -- the folded combine, a CTA's items of a column block taking its ticket
@ -- once.
@ -- With y NULL it is the stream up kernel (the down and combine kernels run
@ -- after it). Every CTA must be resident: a cooperative launch.
@ local function stream_code(p, c)
constexpr int K = ${c.K}, N = ${c.N}, NOUT = ${c.nout}, BN = 16, KC = ${c.kc}, S = ${c.stages};
constexpr int THREADS = ${THREADS}, WARPS = ${WARPS}, XR = 8;  /* the consumers (warp WARPS streams); rows of A a pass */
constexpr int NKC = (K + KC - 1) / KC, NB = N / BN, KCV = KC / 8;  /* stages a pass; items a tile; a row's vectors */
constexpr int NI = (KCV + 31) / 32;  /* a lane's vectors of a stage row */
constexpr int SLOT = ${c.slot}, BAR_OFF = S * SLOT;  /* a ring slot's bytes (16 rows x KC halves, or the chain's wider) */
static_assert(${p.smem} == BAR_OFF + 2 * S * 8 + 16,
              "the plan's shared memory (gen/family_gemm.c): S slots of 16 rows x KC, then the mbarriers");
static_assert(N % BN == 0 && KC % 8 == 0 && SLOT % 128 == 0 && SLOT >= BN * KC * 2,
              "whole blocks of 16 rows, 16-byte vectors");

/* Where the weight stream is: item, pass (of XR rows) and K chunk, with the item's tile. */
struct cursor_t {
    int item, pass, kc, t, expert, rows;
};
/* Item i's tile: i / NB, or with bmt > 0 tiles (the chain's block-major down items) i % bmt; its block
 * i % NB, or i / bmt. */
static __device__ __forceinline__ int item_tile(int i, int bmt) { return bmt ? i % bmt : i / NB; }
static __device__ __forceinline__ int item_block(int i, int bmt) { return bmt ? i / bmt : i % NB; }
/* Move c to the first stage at or after it (tiles without rows have none); false past `end`. */
static __device__ __forceinline__ bool settle(cursor_t &c, int end, const moe_tile_t *__restrict__ tiles, int bmt) {
    for (; c.item < end; ++c.item, c.pass = 0, c.kc = 0) {
        if (item_tile(c.item, bmt) != c.t) {
            c.t = item_tile(c.item, bmt);
            c.expert = tiles[c.t].expert;
            c.rows = tiles[c.t].rows;
        }
        if (c.pass * XR < c.rows)
            return true;
    }
    return false;
}
/* Bulk-copy stage j (c's) of the expert's weights w into its slot and step c past it. */
static __device__ __forceinline__ void produce(cursor_t &c, int j, const moe_half_t *__restrict__ w, unsigned char *sm,
                                               int bmt) {
    void *full = sm + BAR_OFF + (j % S) * 8;
    const int k0 = c.kc * KC, kb = (K - k0 < KC ? K - k0 : KC) * 2;
    const moe_half_t *src = w + ((long long)c.expert * N + (long long)item_block(c.item, bmt) * BN) * K + k0;
    unsigned char *dst = sm + (j % S) * SLOT;
    moe_mbar_expect_tx(full, (unsigned)(BN * kb));
    if constexpr (KC == K) {
        moe_bulk_g2s(dst, src, (unsigned)(BN * kb), full);  /* the block's rows are one run */
    } else {
#pragma unroll 1
        for (int r = 0; r < BN; ++r)
            moe_bulk_g2s(dst + r * (KC * 2), src + (long long)r * K, (unsigned)kb, full);
    }
    if (++c.kc == NKC) {
        c.kc = 0;
        ++c.pass;
    }
}

@ dot8_code()
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The producer (lane 0 of warp WARPS): every stage of items [begin, end) of the weights w into the ring,
 * S ahead of the consumers, numbered from jp; returns the next stage's number. bmt: item_tile's. */
static __device__ __forceinline__ int stream_produce(const moe_half_t *__restrict__ w,
                                                     const moe_tile_t *__restrict__ tiles, int begin, int end,
                                                     int jp, unsigned char *sm, int bmt) {
    cursor_t pc = {begin, 0, 0, -1, 0, 0};
#pragma unroll 1
    for (; settle(pc, end, tiles, bmt); ++jp) {
        if (jp >= S)  /* the stage S earlier in this slot has been read by every consumer warp */
            moe_mbar_wait(sm + BAR_OFF + (S + jp % S) * 8, (unsigned)(jp / S + 1) & 1u);
        produce(pc, jp, w, sm, bmt);
    }
    return jp;
}

/* A consumer warp over items [begin, end), its stages numbered from j (returned past them): A (xs or hbuf)
 * rows, the epilogue storing lane r's row (s0, s1: rows warp and warp + 8 of block b). CHAINED: A was
 * written by this grid (the chain's hbuf): before its first item with rows the warp waits for every
 * CTA's up items (epi.wait) and it reads A through L2. bmt: item_tile's. After each item epi.item_done(t, b, n): n the CTA's items of block b
 * just completed, at its last item of the block (with bmt 0 every item is its block's last), else 0. */
template <bool CHAINED, class Epi>
static __device__ __forceinline__ int stream_consume(const moe_half_t *__restrict__ a,
                                                     const moe_tile_t *__restrict__ tiles, int begin, int end, int j,
                                                     unsigned char *sm, Epi epi, int bmt) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    bool waited = false;  /* CHAINED: hbuf is complete */
#pragma unroll 1
    for (int item = begin; item < end; ++item) {
        const int t = item_tile(item, bmt), b = item_block(item, bmt);
        const int expert = tiles[t].expert, row_start = tiles[t].row_start, rows = tiles[t].rows;
        if constexpr (CHAINED) {
            if (rows > 0 && !waited) {
                epi.wait();
                waited = true;
            }
        }
#pragma unroll 1
        for (int r0 = 0; r0 < rows; r0 += XR) {
            const int nr = rows - r0 < XR ? rows - r0 : XR;
            const moe_half_t *__restrict__ ar = a + (long long)(row_start + r0) * K;
            float a0[XR], a1[XR];
#pragma unroll
            for (int r = 0; r < XR; ++r)
                a0[r] = a1[r] = 0.0f;
#pragma unroll 1
            for (int kc = 0; kc < NKC; ++kc, ++j) {
                moe_mbar_wait(sm + BAR_OFF + (j % S) * 8, (unsigned)(j / S) & 1u);
                const uint4 *sw = reinterpret_cast<const uint4 *>(sm + (j % S) * SLOT);
                const int k0 = kc * KC, kv = (K - k0 < KC ? K - k0 : KC) / 8;
                /* a lane's NI vectors of the stage's two rows, loaded together (zeros past kv) */
                uint4 w0[NI], w1[NI];
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const int v = lane + 32 * i;
                    w0[i] = v < kv ? sw[warp * KCV + v] : make_uint4(0u, 0u, 0u, 0u);
                    w1[i] = v < kv ? sw[(warp + 8) * KCV + v] : make_uint4(0u, 0u, 0u, 0u);
                }
#pragma unroll
                for (int r = 0; r < XR; ++r) {
                    if (r < nr) {
                        const uint4 *xr = reinterpret_cast<const uint4 *>(ar + (long long)r * K + k0);
                        uint4 xv[NI];
#pragma unroll
                        for (int i = 0; i < NI; ++i) {
                            const bool in = lane + 32 * i < kv;
                            if constexpr (CHAINED)
                                xv[i] = in ? __ldcg(xr + lane + 32 * i) : make_uint4(0u, 0u, 0u, 0u);
                            else
                                xv[i] = in ? __ldg(xr + lane + 32 * i) : make_uint4(0u, 0u, 0u, 0u);
                        }
#pragma unroll
                        for (int i = 0; i < NI; ++i) {
                            const float x[8] = {moe_lo_float(xv[i].x), moe_hi_float(xv[i].x), moe_lo_float(xv[i].y),
                                                moe_hi_float(xv[i].y), moe_lo_float(xv[i].z), moe_hi_float(xv[i].z),
                                                moe_lo_float(xv[i].w), moe_hi_float(xv[i].w)};
                            a0[r] = dot8(w0[i], x, a0[r]);
                            a1[r] = dot8(w1[i], x, a1[r]);
                        }
                    }
                }
                __syncwarp();
                if (lane == 0)
                    moe_mbar_arrive(sm + BAR_OFF + (S + j % S) * 8);
            }
            /* the warp's sums on every lane; lane r < nr keeps row r's */
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int r = 0; r < XR; ++r) {
                if (r < nr) {
                    const float t0 = warp_sum(a0[r]), t1 = warp_sum(a1[r]);
                    if (lane == r) {
                        s0 = t0;
                        s1 = t1;
                    }
                }
            }
            if (lane < nr)
                epi(expert, b, (long long)(row_start + r0 + lane), s0, s1);
        }
        const int first = b * bmt > begin ? b * bmt : begin;  /* with bmt: the CTA's first item of block b */
        epi.item_done(t, b, !bmt ? 1 : item + 1 == end || item_block(item + 1, bmt) != b ? item - first + 1 : 0);
    }
    return j;
}

/* The ring's mbarriers: full (the producer's arrival and the bytes), empty (every consumer warp done). */
static __device__ __forceinline__ void stream_init(unsigned char *sm) {
    if (threadIdx.x == 0) {
#pragma unroll 1
        for (int s = 0; s < S; ++s) {
            moe_mbar_init(sm + BAR_OFF + s * 8, 1);
            moe_mbar_init(sm + BAR_OFF + (S + s) * 8, WARPS);
        }
    }
    __syncthreads();
}

/* The CTA's share of n items: [begin, end). */
static __device__ __forceinline__ void stream_share(int n, int &begin, int &end) {
    begin = (int)((long long)blockIdx.x * n / gridDim.x);
    end = (int)((long long)(blockIdx.x + 1) * n / gridDim.x);
}

/* The CTA's items: A (xs or hbuf) rows, the weights w (every slot's N x K); the
 * epilogue stores lane r's row (s0, s1: rows warp and warp + 8 of block b). */
template <class Epi>
static __device__ __forceinline__ void stream_items(const moe_half_t *__restrict__ a, const moe_half_t *__restrict__ w,
                                                    const moe_tile_t *__restrict__ tiles, int ntiles, unsigned char *sm,
                                                    Epi epi) {
    int begin, end;
    stream_share(ntiles * NB, begin, end);
    stream_init(sm);
    if ((int)threadIdx.x >= WARPS * 32) {  /* the producer warp: its lane 0 streams every stage of the CTA */
        if (threadIdx.x == WARPS * 32)
            stream_produce(w, tiles, begin, end, 0, sm, 0);
        return;
    }
    stream_consume<false>(a, tiles, begin, end, 0, sm, epi, 0);
}
@ end
@
@ -- The stream grid's kernel (stream_code): its epilogue functor `epi`
@ -- (an expression of the kernel's arguments) over the CTA's items.
@ local function stream_kernel(p, c, args, a, w, epi)
extern "C" __global__ void __launch_bounds__(${THREADS + 32}, 2)  /* <= 112 registers: two CTAs an SM */
${p.kernel}(${args}) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    extern __shared__ __align__(16) unsigned char ${p.kernel}_smem[];  /* 16 bytes: the bulk copies' unit */
    stream_items(${a}, ${w}, tiles, *num_tiles, ${p.kernel}_smem, ${epi});
}
@ end
@
@ -- The kernel: the tile and slice, then the row chunks (and, down, the
@ -- combine of the slice when it is the slice's last CTA).
@ local function kernel(p, c, args, a, w, bias, call_args, combine, asc, ws)
@ -- fp8's up GEMM: its cluster of CTAs (consecutive N slices of one tile) shares a quantization block
@ local cl = (c.cluster or 1) > 1 and ("__cluster_dims__(" .. c.cluster .. ", 1, 1) ") or ""
@ -- fp8 with unroll 4: its 16 loads in flight a lane take 64 registers, so one CTA an SM
@ if c.bounds then
extern "C" __global__ void __launch_bounds__(${THREADS}, ${c.occ})  /* ${c.bounds} */
@ elseif c.bn < 32 or (c.fp8 and c.unroll <= 2) then
extern "C" __global__ void ${cl}__launch_bounds__(${THREADS}, 2)  /* <= 128 registers: two CTAs an SM */
@ else
extern "C" __global__ void ${cl}__launch_bounds__(${THREADS})
@ end
${p.kernel}(${args}) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
@   if not p.ffn_bias then
    (void)${bias};
@   end
    extern __shared__ __align__(16) unsigned char ${p.kernel}_smem[];
@ if c.fp8 then
    unsigned char *sm = ${p.kernel}_smem;
@ else
    uint4 *sx = reinterpret_cast<uint4 *>(${p.kernel}_smem);
@ end
    const int mt = (int)blockIdx.y, n0 = (int)blockIdx.x * BN;
    if (mt >= *num_tiles)  /* a cluster's CTAs share the tile: all of them return */
        return;
    const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
@ local head = "ar, nr, orow, we, n0, sx"
@ if c.fp8 then
@   head = "ar, asr, nr, orow, we, wse, n0, sm"
    const unsigned char *__restrict__ we = ${w} + (long long)expert * N * K;
    const float *__restrict__ wse = ${ws} + (long long)expert * ${c.block and "(N / 128) * KB" or "N"};
@ else
    const moe_half_t *__restrict__ we = ${w} + (long long)expert * N * K;
@ end
    for (int r0 = 0; r0 < rows; r0 += ROWS) {  /* block-uniform: every thread takes the same branch */
        const int nr = rows - r0 < ROWS ? rows - r0 : ROWS;
@ if c.fp8 then
        const unsigned char *__restrict__ ar = ${a} + (long long)(row_start + r0) * K;
        const float *__restrict__ asr = ${asc} + (long long)(row_start + r0) * KB;
@ else
        const moe_half_t *__restrict__ ar = ${a} + (long long)(row_start + r0) * K;
@ end
        const long long orow = row_start + r0;
        if (nr == 1)
            run_rows<1>(${head}${call_args});
@ if c.rows >= 2 then
        else if (nr == 2)
            run_rows<2>(${head}${call_args});
@ end
@ if c.rows == 8 then
        else if (nr <= 4)
            run_rows<4>(${head}${call_args});
        else
            run_rows<8>(${head}${call_args});
@ elseif c.rows == 4 then
        else  /* nr <= ROWS = 4 */
            run_rows<4>(${head}${call_args});
@ end
    }
@ if combine then
    if (y) {
        __shared__ int s_last;
        combine_slice(obuf, row_of, topk_w, tokens, y, combine_tickets, *num_tiles, n0, blockIdx.x, &s_last, 1);
    }
@ end
}
@ end
@
@ -- After the down GEMM's device code (in its namespace): the combine over a
@ -- column slice (the folded combine's) and, on the stream grids, the down
@ -- epilogue functor (c.chain_wait: the chain's, which waits for every
@ -- CTA's up items, gemm_gemv.lua's header).
@ local function down_tail_code(p, c)
@   -- the CTA's THREADS threads meet: all of them, or the stream grid's consumer warps (its producer has exited)
@   local sync = c.stream and "moe_bar_sync(1, THREADS);" or "__syncthreads();"
/* The combine over this CTA's column slice [n0, n0 + BN) of y, by the
 * slice's last CTA (the header's "combine"): all of this CTA's stores are
 * made visible before its ticket; the last one reads the rows of every
 * token (written by the slice's other CTAs) from L2. */
static __device__ __forceinline__ void combine_slice(const moe_half_t *obuf, const int *__restrict__ row_of,
                                                     const float *__restrict__ topk_w, int tokens,
                                                     moe_half_t *__restrict__ y, int *tickets, int ntiles, int n0,
                                                     int slice, int *s_last, int n) {
    constexpr int KE = ${p.entries};   /* entries per token: top_k, then the shared expert's slots */
    __threadfence();
    ${sync}
    if (threadIdx.x == 0) {
        __threadfence();
        const int last = atomicAdd(tickets + slice, n) == ntiles - n;  /* n: this CTA's items of the slice */
        if (last)
            atomicExch(tickets + slice, 0);  /* zero again for the next call */
        __threadfence();
        *s_last = last;
    }
    ${sync}
    if (!*s_last)
        return;
    const int nv = ((n0 + BN < NOUT ? n0 + BN : NOUT) - n0) / 8, v0 = n0 / 8;  /* the slice's 16-byte vectors */
    for (int i = (int)threadIdx.x; i < tokens * nv; i += THREADS) {
        const int t = i / nv, v = v0 + (i - t * nv);
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
        for (int k = 0; k < KE; ++k) {
            const uint4 o = __ldcg(reinterpret_cast<const uint4 *>(obuf + (long long)row_of[(long long)t * KE + k] * NOUT) + v);
@   if p.spec.router.apply == "input" then
            const float w = 1.f;  /* the weight went into the expert's input */
@   else
            const float w = topk_w[(long long)t * KE + k];
@   end
            const float xo[8] = {moe_lo_float(o.x), moe_hi_float(o.x), moe_lo_float(o.y), moe_hi_float(o.y),
                                 moe_lo_float(o.z), moe_hi_float(o.z), moe_lo_float(o.w), moe_hi_float(o.w)};
#pragma unroll
            for (int j = 0; j < 8; ++j)
                acc[j] = fmaf(w, xo[j], acc[j]);
        }
        reinterpret_cast<uint4 *>(y + (long long)t * NOUT)[v] =
            make_uint4(moe_pack2(acc[0], acc[1]), moe_pack2(acc[2], acc[3]), moe_pack2(acc[4], acc[5]),
                       moe_pack2(acc[6], acc[7]));
    }
}
@   if c.stream then
/* The down epilogue of the stream grid: lane r's row of block b, columns 16 b + warp (s0) and + 8 (s1);
 * once an item is done on every tile, its block's combine (y non-NULL). */
struct down_epi {
    const moe_half_t *__restrict__ bias;  /* b2: every slot's N */
    moe_half_t *out;
    const int *__restrict__ row_of;
    const float *__restrict__ topk_w;
    int tokens;
    moe_half_t *__restrict__ y;
    int *tickets, ntiles;
    int *flag;  /* the combine's "last CTA" flag: the 16 bytes after the mbarriers */
    __device__ __forceinline__ void operator()(int slot, int b, long long orow, float s0, float s1) const {
        const int col = b * BN + (int)(threadIdx.x >> 5);
@     if p.ffn_bias then
        out[orow * NOUT + col] = moe_from_float(s0 + moe_to_float(bias[(long long)slot * N + col]));
        out[orow * NOUT + col + 8] = moe_from_float(s1 + moe_to_float(bias[(long long)slot * N + col + 8]));
@     else
        (void)slot;
        out[orow * NOUT + col] = moe_from_float(s0);
        out[orow * NOUT + col + 8] = moe_from_float(s1);
@     end
    }
@     if c.chain_wait then
    const int *done;  /* the chain's counter of CTAs done with their up items */
    /* A consumer warp, before its first rows of hbuf: every CTA has stored its up items' rows */
    __device__ __forceinline__ void wait() const {
        if ((threadIdx.x & 31) == 0)
            moe_wait_geq(done, (int)gridDim.x);
        __syncwarp();
    }
@     end
    __device__ __forceinline__ void item_done(int, int b, int n) const {
        if (y && n)  /* block-uniform: every consumer warp takes the same branch */
            combine_slice(out, row_of, topk_w, tokens, y, tickets, ntiles, b * BN, b, flag, n);
    }
};
@   end
@ end
@
@ function M.up(p)
@   local c = config(p, "up")
@   local act = import("activation").name(p)
@   local train = p.spec.training
@   local args = "const moe_half_t *__restrict__ xs, const moe_half_t *__restrict__ w1p, " ..
@                "const moe_half_t *__restrict__ b1p, const moe_tile_t *__restrict__ tiles, " ..
@                "const int *__restrict__ num_tiles, moe_half_t *__restrict__ hbuf"
@   local eargs = ", const moe_half_t *__restrict__ bias, moe_half_t *__restrict__ out"
@   local cargs = ", " .. (p.ffn_bias and "b1p + (long long)expert * N" or "(const moe_half_t *)nullptr") .. ", hbuf"
@   if train then   -- the pre-activation U for the backward (gemm_up_swiglu.lua's header)
@     args = args .. ", moe_half_t *__restrict__ ubuf"
@     eargs = eargs .. ", moe_half_t *__restrict__ ubuf"
@     cargs = cargs .. ", ubuf"
@   end
@   if c.fp8 then   -- e4m3 in, e4m3 out with a scale per 128 columns (device_code8's header); never training
@     args = "const unsigned char *__restrict__ xs, const unsigned char *__restrict__ w1p, " ..
@            "const float *__restrict__ xsc, const float *__restrict__ w1s, " ..
@            "const moe_half_t *__restrict__ b1p, const moe_tile_t *__restrict__ tiles, " ..
@            "const int *__restrict__ num_tiles, unsigned char *__restrict__ hq, float *__restrict__ hsc"
@     eargs = ", const moe_half_t *__restrict__ bias, unsigned char *__restrict__ out, float *__restrict__ osc"
@     cargs = ", " .. (p.ffn_bias and "b1p + (long long)expert * N" or "(const moe_half_t *)nullptr") .. ", hq, hsc"
@   end
@   if p.shared_act then   -- the rows' slot: a shared expert with its own activation (activation.lua, M.call_slot)
@     eargs, cargs = eargs .. ", const int slot", cargs .. ", expert"
@   end
@   local function call(args) return import("activation").call_slot(p, act, "slot", args) end
@   local function epilogue8()
        /* lanes of j = 0, 1 (gate columns 2q, 2q + 1) take the up sum of j + 2, two values further; the
         * activation waits in shared memory for its block's amax (after8) */
        const float su = __shfl_down_sync(0xffffffffu, s, 2 << SHIFT);
        const int pr = group_row(n0, gi, j);  /* the packed gate row (j < 2); its up row is pr + 8 */
        if ((lane & ((1 << SHIFT) - 1)) == 0 && r < nrows && j < 2) {
            const int f = (pr >> 4) * 8 + (pr & 7);  /* the output column; plain rows gate f, up NOUT + f */
@     local cg, cu = "", ""
@     if not c.block then cg, cu = " * ws[f]", " * ws[NOUT + f]" end
@     if p.ffn_bias then
            const float g = s${cg} + moe_to_float(bias[pr]), u = su${cu} + moe_to_float(bias[pr + 8]);
@     else
            const float g = s${cg}, u = su${cu};
@     end
            reinterpret_cast<float *>(sm + OFF_ACT)[r * (BN / 2) + f - n0 / 2] = ${call("g, u")};
        }
@   end
@   local function after8()
    /* the chunk's activations are all in shared memory: each row's amax over the CTA's BN / 2 columns,
     * then over the cluster's (the quantization block of 128), and the codes of this CTA's columns */
    const float *act_s = reinterpret_cast<const float *>(sm + OFF_ACT);
    float *amax_s = reinterpret_cast<float *>(sm + OFF_AMAX);
    __syncthreads();
    if (warp < nrows) {  /* warp r: row r */
        float m = 0.0f;
        for (int i = lane; i < BN / 2; i += 32)
            m = fmaxf(m, fabsf(act_s[warp * (BN / 2) + i]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0)
            amax_s[warp] = m;
    }
    if constexpr (CLUSTER > 1)
        moe_cluster_sync();  /* every CTA's amaxes written and visible to the cluster */
    else
        __syncthreads();
    if (warp < nrows) {
        float m = amax_s[warp];
        if constexpr (CLUSTER > 1) {
#pragma unroll
            for (int q = 0; q < CLUSTER; ++q)
                m = fmaxf(m, moe_cluster_ld(amax_s + warp, q));
        }
        m = fmaxf(m, 1e-4f);
        const float mul = 448.0f / m;
        if (lane == 0 && (CLUSTER == 1 || moe_cluster_rank() == 0))
            osc[(orow + warp) * (NOUT / 128) + n0 / 256] = m / 448.0f;
        for (int i = 2 * lane; i < BN / 2; i += 64)
            *reinterpret_cast<unsigned short *>(out + (orow + warp) * NOUT + n0 / 2 + i) =
                moe_e4m3x2(act_s[warp * (BN / 2) + i] * mul, act_s[warp * (BN / 2) + i + 1] * mul);
    }
    if constexpr (CLUSTER > 1)
        moe_cluster_sync();  /* the peers have read this CTA's amaxes: it may overwrite them, or exit */
@   end
@   local function epilogue()
        /* lanes of j = 0, 1 (gate columns 2q, 2q + 1) take the up sum of j + 2, two values further */
        const float su = __shfl_down_sync(0xffffffffu, s, 2 << SHIFT);
        const int pr = group_row(n0, gi, j);  /* the packed gate row (j < 2); its up row is pr + 8 */
        if ((lane & ((1 << SHIFT) - 1)) == 0 && r < nrows && j < 2) {
@     if p.ffn_bias then
            const float g = s + moe_to_float(bias[pr]), u = su + moe_to_float(bias[pr + 8]);
@     else
            const float g = s, u = su;
@     end
            out[(orow + r) * NOUT + (pr >> 4) * 8 + (pr & 7)] = moe_from_float(${call("g, u")});
@     if train then
            if (ubuf) {  /* U: gate and up at their packed columns */
                ubuf[(orow + r) * N + pr] = moe_from_float(g);
                ubuf[(orow + r) * N + pr + 8] = moe_from_float(u);
            }
@     end
        }
@   end
@   local function up_epi_code()
/* The up epilogue of the stream grid: lane r's row of block b, gate s0 and up s1 of column 8 b + warp. */
struct up_epi {
    const moe_half_t *__restrict__ bias;  /* b1p: every slot's N */
    moe_half_t *__restrict__ out;
@     if train then
    moe_half_t *__restrict__ ubuf;
@     end
    __device__ __forceinline__ void operator()(int slot, int b, long long orow, float s0, float s1) const {
        const int pr = b * BN + (int)(threadIdx.x >> 5);  /* the packed gate row; its up row is pr + 8 */
@     if p.ffn_bias then
        const float g = s0 + moe_to_float(bias[(long long)slot * N + pr]), u = s1 + moe_to_float(bias[(long long)slot * N + pr + 8]);
@     else
        const float g = s0, u = s1;
@     end
        out[orow * NOUT + (pr >> 4) * 8 + (pr & 7)] = moe_from_float(${call("g, u")});
@     if train then
        if (ubuf) {  /* U: gate and up at their packed columns */
            ubuf[orow * N + pr] = moe_from_float(g);
            ubuf[orow * N + pr + 8] = moe_from_float(u);
        }
@     end
    }
    __device__ __forceinline__ void item_done(int, int, int) const {}
};
@   end
@   if c.chain then
@     -- the down GEMM's stream constants and epilogue in namespace sd, the up GEMM's in su (one ring)
@     local cd = config(p, "down")
@     cd.kc, cd.slot, cd.chain_wait = p.tile.kc_down, c.slot, true
namespace ${p.kernel}_impl {
@     import("activation").device(p)
namespace su {
@     stream_code(p, c)
@     up_epi_code()
}  // namespace su
namespace sd {
@     stream_code(p, cd)
@     down_tail_code(p, cd)
}  // namespace sd
}  // namespace ${p.kernel}_impl

/* The chain (gemm_gemv.lua's header): the up GEMM's items, then, with y non-NULL, the down GEMM's and the
 * combine, in one grid (a cooperative launch: every CTA resident, so a wait for another CTA's items ends). */
extern "C" __global__ void __launch_bounds__(${THREADS + 32}, 2)  /* <= 112 registers: two CTAs an SM */
${p.kernel}(const moe_half_t *xs, const moe_half_t *__restrict__ w1p, const moe_half_t *__restrict__ b1p,
        const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, moe_half_t *hbuf,
        const moe_half_t *__restrict__ w2, const moe_half_t *__restrict__ b2, moe_half_t *obuf,
        const int *__restrict__ row_of, const float *__restrict__ topk_w, int tokens, moe_half_t *__restrict__ y,
        int *combine_tickets, int *chain_done) {
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    extern __shared__ __align__(16) unsigned char ${p.kernel}_smem[];  /* 16 bytes: the bulk copies' unit */
    unsigned char *sm = ${p.kernel}_smem;
    const int ntiles = *num_tiles;
    int ub, ue, db = 0, de = 0;
    su::stream_share(ntiles * su::NB, ub, ue);
    if (y)  /* chained: this CTA's share of the down GEMM's items too, block-major (a CTA's items of a column
             * block take its combine ticket once) */
        su::stream_share(ntiles * sd::NB, db, de);
    su::stream_init(sm);
    if ((int)threadIdx.x >= su::WARPS * 32) {  /* the producer warp: the up stages, then the down ones, one ring */
        if (threadIdx.x == su::WARPS * 32)
            sd::stream_produce(w2, tiles, db, de, su::stream_produce(w1p, tiles, ub, ue, 0, sm, 0), sm, ntiles);
        return;
    }
    const int j = su::stream_consume<false>(xs, tiles, ub, ue, 0, sm, su::up_epi{b1p, hbuf}, 0);
    if (!y)
        return;
    /* this CTA's up rows are stored: its consumers meet, then one release at GPU scope (cumulative over what
     * the barrier ordered before it) counts the CTA done */
    moe_bar_sync(2, su::WARPS * 32);
    if (threadIdx.x == 0)
        moe_signal_add(chain_done, 1);
    sd::stream_consume<true>(hbuf, tiles, db, de, j, sm,
                             sd::down_epi{b2, obuf, row_of, topk_w, tokens, y, combine_tickets, ntiles,
                                          reinterpret_cast<int *>(sm + sd::BAR_OFF + 2 * sd::S * 8), chain_done},
                             ntiles);
}
@     return
@   end
@   if c.stream then
namespace ${p.kernel}_impl {
@     import("activation").device(p)
@     stream_code(p, c)
@     up_epi_code()
}  // namespace ${p.kernel}_impl

@     stream_kernel(p, c, args, "xs", "w1p", "up_epi{b1p, hbuf" .. (train and ", ubuf" or "") .. "}")
@     return
@   end
namespace ${p.kernel}_impl {
@   import("activation").device(p)
@   if c.fp8 then
@     device_code8(p, c, eargs, epilogue8, after8)
@   else
@     device_code(p, c, eargs, epilogue)
@   end
}  // namespace ${p.kernel}_impl

@   kernel(p, c, args, "xs", "w1p", "b1p", cargs, false, "xsc", "w1s")
@ end
@
@ function M.down(p)
@   local c = config(p, "down")
@   -- the combine's (y NULL: not folded in): obuf is read back by other CTAs, so not __restrict__
@   local args = "const moe_half_t *__restrict__ hbuf, const moe_half_t *__restrict__ w2, " ..
@                "const moe_half_t *__restrict__ b2, const moe_tile_t *__restrict__ tiles, " ..
@                "const int *__restrict__ num_tiles, moe_half_t *obuf, const int *__restrict__ row_of, " ..
@                "const float *__restrict__ topk_w, int tokens, moe_half_t *__restrict__ y, int *combine_tickets"
@   local eargs = ", const moe_half_t *__restrict__ bias, moe_half_t *__restrict__ out"
@   local cargs = ", " .. (p.ffn_bias and "b2 + (long long)expert * N" or "(const moe_half_t *)nullptr") .. ", obuf"
@   if c.fp8 then   -- e4m3 A (hbuf) with its scales, e4m3 W2 with w2s; bf16 out as the 16-bit kernel
@     args = "const unsigned char *__restrict__ hbuf, const unsigned char *__restrict__ w2, " ..
@            "const float *__restrict__ hsc, const float *__restrict__ w2s, " ..
@            "const moe_half_t *__restrict__ b2, const moe_tile_t *__restrict__ tiles, " ..
@            "const int *__restrict__ num_tiles, moe_half_t *obuf, const int *__restrict__ row_of, " ..
@            "const float *__restrict__ topk_w, int tokens, moe_half_t *__restrict__ y, int *combine_tickets"
@   end
@   local function epilogue()
        const int col = group_row(n0, gi, j);
        if ((lane & ((1 << SHIFT) - 1)) == 0 && r < nrows)
            out[(orow + r) * NOUT + col] = moe_from_float(s${c.fp8 and not c.block and " * ws[col]" or ""}${p.ffn_bias and " + moe_to_float(bias[col])" or ""});
@   end
namespace ${p.kernel}_impl {
@   if c.stream then
@     stream_code(p, c)
@   elseif c.fp8 then
@     device_code8(p, c, eargs, epilogue)
@   else
@     device_code(p, c, eargs, epilogue)
@   end

@   down_tail_code(p, c)
}  // namespace ${p.kernel}_impl

@   if c.stream then
@     stream_kernel(p, c, args, "hbuf", "w2", "down_epi{b2, obuf, row_of, topk_w, tokens, y, combine_tickets, *num_tiles, " ..
@                   "reinterpret_cast<int *>(" .. p.kernel .. "_smem + BAR_OFF + 2 * S * 8)}")
@     return
@   end
@   kernel(p, c, args, "hbuf", "w2", "b2", cargs, true, "hsc", "w2s")
@ end
@
@ return M
