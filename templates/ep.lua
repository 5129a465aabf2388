@ -- ep.lua — expert-parallel dispatch: the kernels that lay rows out for the
@ -- exchange between EP ranks and back (runtime/dispatch.h holds the same
@ -- layouts in plain C; README "Expert parallelism"). Emitted only when
@ -- mesh.ep > 1. Four kernels:
@ --
@ -- p.send_plan (one block): per-expert counts -> the send layout. Positions
@ --   are (destination EP rank, its slot) = owner[g]*S + slot[g] from the
@ --   routing table, never g itself. Writes slot_counts [P*S], the first send
@ --   row of each expert (offsets [E]) and zeroed cursors, send_counts [P]
@ --   and send_off [P + 1]. Capacity mode (C > 0): destination d's block
@ --   starts at d*C; rows past C are counted into *overflow.
@ -- p.scatter (a warp per (t, k) slot): as permute's scatter (x·w rounded
@ --   with router.apply = "input"), into the send buffer; in capacity mode a row past its destination's C goes nowhere
@ --   and its row_of is the null row P*C (kept zero by the runtime).
@ -- p.recv_plan (one block): the all-to-all of slot_counts (recv_counts
@ --   [P*S], source-major) -> chunk_src / chunk_dst / chunk_rows [P*S],
@ --   src_base [P + 1] (where each source's rows sit in the staging buffer),
@ --   slot_off [S + 1] (slot-major blocks, each aligned to p.align) and the
@ --   tile table {slot, row_start, rows, 0} the grouped GEMMs read.
@ -- p.rows (a warp per staging row): copies between the staging buffer
@ --   (source-major, as received) and the slot-major GEMM buffer; dir 0
@ --   gathers after dispatch, dir 1 scatters the results back before return.
@ --
@ -- fp8 weights (quant.weights = "fp8_e4m3", docs/DESIGN.md "FP8"): the
@ -- rows travel quantized. The scatter writes each row as the single-device
@ -- quantizing scatter does (templates/permute.lua's quantize_row, bit for
@ -- bit): e4m3 into send [rows, H] (one byte each) and one fp32 scale per
@ -- 128 columns into send_sc [rows, H/128]; rows dir 0 copies the e4m3 rows
@ -- and their scales (stage, stage_sc -> xr, xsc: what the fp8 up GEMM
@ -- reads); dir 1 moves the bf16 results as without fp8.
@ local M = {}
@
@ function M.config(p)
@   local function need(ok, what)
@     if not ok then error(p.send_plan .. ": " .. what, 0) end
@   end
@   need(p.H % 8 == 0, "hidden must be a multiple of 8")
@   need(p.P >= 1 and p.S >= 1, "the EP group and its slots must not be empty")
@   need(p.P * p.S <= 4096, "more than 4096 (rank, slot) positions in an EP group")
@   need(p.threads == 1024, "the plan kernels run one block of 1024 threads")
@   return {}
@ end
@
@ function M.emit(p)
@ M.config(p)
@ local ns = p.send_plan .. "_impl"
@ local input = p.spec.router.apply == "input"
@ local fp8 = p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3"
namespace ${ns} {
constexpr int E = ${p.E}, K = ${p.K}, H = ${p.H}, P = ${p.P}, S = ${p.S}, N = P * S;
constexpr int C = ${p.C};           // rows per (source, destination) pair; 0 = exact mode
constexpr int ALIGN = ${p.align};
constexpr int THREADS = ${p.threads}, WARPS = THREADS / 32;
constexpr int ROWS = ${p.rows_per_block};   // rows per block of the scatter and rows kernels
constexpr int HV = H / 8;
constexpr unsigned FULL = 0xffffffffu;

static __device__ __forceinline__ int padded(int n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }
static __device__ __forceinline__ int ntiles(int n) { return (n + ALIGN - 1) / ALIGN; }

/* Exclusive scan of v[0..n) into out[0..n], out[n] = the total; every thread
 * of the block calls it; v and out are shared arrays (they may alias). */
static __device__ void scan(const int *v, int *out, int n, int *s_warp) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int per = (n + THREADS - 1) / THREADS, lo = tid * per, hi = min(n, lo + per);
    int sum = 0;
    for (int i = lo; i < hi; ++i) sum += v[i];
    int inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(FULL, inc, o);
        if (lane >= o) inc += a;
    }
    if (lane == 31) s_warp[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int w = lane < WARPS ? s_warp[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a = __shfl_up_sync(FULL, w, o);
            if (lane >= o) w += a;
        }
        if (lane < WARPS) s_warp[lane] = w;
    }
    __syncthreads();
    int run = inc - sum + (warp ? s_warp[warp - 1] : 0);
    const int total = s_warp[WARPS - 1];
    __syncthreads();   // every thread has read its inputs and s_warp
    for (int i = lo; i < hi; ++i) {
        const int c = v[i];
        out[i] = run;
        run += c;
    }
    if (tid == 0) out[n] = total;
    __syncthreads();
}

/* The last i in [0, n) with a[i] <= x (a non-decreasing, a[0] <= x). */
static __device__ __forceinline__ int last_le(const int *a, int n, int x) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (a[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}
@ if fp8 then
@   import("permute").quantizer(p)
@ end
}  // namespace ${ns}

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.send_plan}(const int *__restrict__ counts, const int *__restrict__ owner, const int *__restrict__ slot,
            int *__restrict__ slot_counts, int *__restrict__ offsets, int *__restrict__ cursor,
            int *__restrict__ send_counts, int *__restrict__ send_off, int *__restrict__ overflow) {
    moe_pdl_begin();
    using namespace ${ns};
    __shared__ int s_cnt[N], s_off[N + 1], s_warp[WARPS];
    const int tid = threadIdx.x;
    for (int i = tid; i < N; i += THREADS) s_cnt[i] = 0;
    __syncthreads();
    for (int g = tid; g < E; g += THREADS) s_cnt[owner[g] * S + slot[g]] = counts[g];
    __syncthreads();
    scan(s_cnt, s_off, N, s_warp);
    for (int i = tid; i < N; i += THREADS) slot_counts[i] = s_cnt[i];
    for (int d = tid; d < P; d += THREADS) {
        const int n = s_off[(d + 1) * S] - s_off[d * S];
        send_counts[d] = n;
        send_off[d] = C ? d * C : s_off[d * S];
        if (C && n > C) atomicAdd(overflow, n - C);
    }
    if (tid == 0) send_off[P] = C ? P * C : s_off[N];
    for (int g = tid; g < E; g += THREADS) {
        const int d = owner[g], pos = d * S + slot[g];
        offsets[g] = C ? d * C + s_off[pos] - s_off[d * S] : s_off[pos];
        cursor[g] = 0;
    }
}

extern "C" __global__ void __launch_bounds__(${p.scatter_threads})
@ if fp8 then
${p.scatter}(const moe_half_t *__restrict__ x, const int *__restrict__ topk_idx, const float *__restrict__ topk_w,
            const int *__restrict__ offsets, int *__restrict__ cursor, const int *__restrict__ owner, int tokens,
            unsigned char *__restrict__ send, int *__restrict__ row_of, float *__restrict__ send_sc) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int HB = H / 128;  // scale blocks per row
@ else
${p.scatter}(const moe_half_t *__restrict__ x, const int *__restrict__ topk_idx, const float *__restrict__ topk_w,
            const int *__restrict__ offsets, int *__restrict__ cursor, const int *__restrict__ owner, int tokens,
            moe_half_t *__restrict__ send, int *__restrict__ row_of) {
    moe_pdl_begin();
    using namespace ${ns};
@ end
@ if not input then
    (void)topk_w;
@ end
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long slots = (long long)tokens * K;
#pragma unroll 1
    for (int r = warp; r < ROWS; r += ${p.scatter_threads} / 32) {
        const long long i = (long long)blockIdx.x * ROWS + r;
        if (i >= slots)
            return;
        int row = 0;
        if (lane == 0) {
            const int e = topk_idx[i];
            row = offsets[e] + atomicAdd(cursor + e, 1);
            if (C && row - owner[e] * C >= C)
                row = -1;   // past capacity: counted by send_plan, sent nowhere
            row_of[i] = row < 0 ? P * C : row;
        }
        row = __shfl_sync(FULL, row, 0);
        if (row < 0)
            continue;
        const uint4 *__restrict__ src = reinterpret_cast<const uint4 *>(x + (i / K) * H);
@ if fp8 then
@   if input then
        const float w = moe_round(__ldg(topk_w + i));   // the weight in the dtype
@   else
        const float w = 1.0f;   // not read
@   end
        quantize_row(src, w, send + (long long)row * H, send_sc + (long long)row * HB);
@ else
        uint4 *__restrict__ dst = reinterpret_cast<uint4 *>(send + (long long)row * H);
@ if input then
        const float w = moe_round(__ldg(topk_w + i));   // the weight in the dtype
#pragma unroll 4
        for (int v = lane; v < HV; v += 32) dst[v] = moe_scale8(__ldg(src + v), w);
@ else
#pragma unroll 4
        for (int v = lane; v < HV; v += 32) dst[v] = __ldg(src + v);
@ end
@ end -- fp8
    }
}

extern "C" __global__ void __launch_bounds__(${p.threads})
${p.recv_plan}(const int *__restrict__ recv_counts, int *__restrict__ chunk_src, int *__restrict__ chunk_dst,
            int *__restrict__ chunk_rows, int *__restrict__ src_base, int *__restrict__ slot_off,
            moe_tile_t *__restrict__ tiles, int *__restrict__ num_tiles, int *__restrict__ overflow) {
    moe_pdl_begin();
    using namespace ${ns};
    __shared__ int s_kept[N], s_n[S], s_a[S + 1], s_first[S + 1], s_rows[P + 1], s_warp[WARPS];
    const int tid = threadIdx.x;
    /* per source: chunk offsets within its block (as the sender laid them
     * out), and what fits its capacity */
    for (int s = tid; s < P; s += THREADS) {
        int run = 0;
        for (int j = 0; j < S; ++j) {
            const int n = recv_counts[s * S + j];
            chunk_src[s * S + j] = run;
            s_kept[s * S + j] = C ? max(0, min(n, C - run)) : n;
            run += n;
        }
        s_rows[s] = run;
        if (C && run > C) atomicAdd(overflow, run - C);
    }
    __syncthreads();
    if (C) {
        for (int s = tid; s <= P; s += THREADS) src_base[s] = s * C;
    } else {
        scan(s_rows, s_rows, P, s_warp);
        for (int s = tid; s <= P; s += THREADS) src_base[s] = s_rows[s];
    }
    /* per slot: rows (all sources), padded block, tiles */
    for (int j = tid; j < S; j += THREADS) {
        int n = 0;
        for (int s = 0; s < P; ++s) n += s_kept[s * S + j];
        s_n[j] = n;
        s_a[j] = padded(n);
        s_first[j] = ntiles(n);
    }
    __syncthreads();
    scan(s_a, s_a, S, s_warp);           // first row of each slot
    scan(s_first, s_first, S, s_warp);   // first tile of each slot
    for (int j = tid; j < S; j += THREADS) {
        int row = s_a[j];
        slot_off[j] = row;
        for (int s = 0; s < P; ++s) {
            chunk_dst[s * S + j] = row;
            chunk_rows[s * S + j] = s_kept[s * S + j];
            row += s_kept[s * S + j];
        }
    }
    const int total_tiles = s_first[S];
    if (tid == 0) {
        slot_off[S] = s_a[S];
        *num_tiles = total_tiles;
    }
    for (int i = tid; i < total_tiles; i += THREADS) {
        const int j = last_le(s_first, S, i);   // empty slots share their successor's first tile
        const int t = i - s_first[j];
        const int left = s_n[j] - t * ALIGN;
        reinterpret_cast<int4 *>(tiles)[i] = make_int4(j, s_a[j] + t * ALIGN, left < ALIGN ? left : ALIGN, 0);
    }
}

extern "C" __global__ void __launch_bounds__(${p.rows_threads})
@ if fp8 then
${p.rows}(int dir, moe_half_t *__restrict__ stage, moe_half_t *__restrict__ xr, const int *__restrict__ src_base,
            const int *__restrict__ chunk_src, const int *__restrict__ chunk_dst, const int *__restrict__ chunk_rows,
            const float *__restrict__ stage_sc, float *__restrict__ xsc) {
    moe_pdl_begin();
    using namespace ${ns};
    constexpr int HB = H / 128, HQ = H / 16;  // scales and 16-byte vectors of an e4m3 row
@ else
${p.rows}(int dir, moe_half_t *__restrict__ stage, moe_half_t *__restrict__ xr, const int *__restrict__ src_base,
            const int *__restrict__ chunk_src, const int *__restrict__ chunk_dst, const int *__restrict__ chunk_rows) {
    moe_pdl_begin();
    using namespace ${ns};
@ end
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 1
    for (int w = warp; w < ROWS; w += ${p.rows_threads} / 32) {
        const int r = blockIdx.x * ROWS + w;
        if (r >= src_base[P])
            return;
        const int s = last_le(src_base, P + 1, r);
        const int o = r - src_base[s];
        const int j = last_le(chunk_src + s * S, S, o);
        const int in = o - chunk_src[s * S + j];
        if (in >= chunk_rows[s * S + j])
            continue;   // capacity mode: a row of the block nobody sent
@ if fp8 then
        if (dir == 0) {   // the e4m3 rows (one byte an element) and their scales
            const long long d = chunk_dst[s * S + j] + in;
            const uint4 *qa = reinterpret_cast<const uint4 *>(reinterpret_cast<const unsigned char *>(stage) + (long long)r * H);
            uint4 *qb = reinterpret_cast<uint4 *>(reinterpret_cast<unsigned char *>(xr) + d * H);
#pragma unroll 4
            for (int v = lane; v < HQ; v += 32) qb[v] = qa[v];
            for (int v = lane; v < HB; v += 32) xsc[d * HB + v] = stage_sc[(long long)r * HB + v];
            continue;
        }
@ end
        uint4 *a = reinterpret_cast<uint4 *>(stage + (long long)r * H);
        uint4 *b = reinterpret_cast<uint4 *>(xr + (long long)(chunk_dst[s * S + j] + in) * H);
@ if fp8 then
#pragma unroll 4
        for (int v = lane; v < HV; v += 32) a[v] = b[v];   // dir 1: the bf16 results back
@ else
        if (dir == 0) {
#pragma unroll 4
            for (int v = lane; v < HV; v += 32) b[v] = a[v];
        } else {
#pragma unroll 4
            for (int v = lane; v < HV; v += 32) a[v] = b[v];
        }
@ end
    }
}
@ end
@
@ if p then M.emit(p) end
@ return M
