/* cuda_host.h — just enough of CUDA to run the emitted gemv kernels
 * (templates/gemm_gemv.lua), the backward's dx and d router_w
 * (templates/bwd.lua, their mma.sync and ldmatrix included) and the
 * permute scatter (templates/permute.lua) on the CPU, for test_gemv_host,
 * test_bwd_host and test_scatter_host: every CUDA
 * thread of a block is a fiber (ucontext) on the one host thread, run in
 * turn until it waits at a barrier: __syncthreads is a barrier of the
 * block's 256, a warp shuffle two barriers of its 32 lanes around a slot
 * per lane. Blocks run one after the other, or a cluster's blocks together
 * (host_launch's cluster argument: the fp8 gemv up GEMM's __cluster_dims__,
 * or the chain's whole grid, whose blocks wait for each other;
 * a cluster barrier of all their threads, each block's shared memory its
 * own; static __shared__ arrays are one copy, so kernels with those run
 * with clusters of 1). The prelude's conversions are restated here for the
 * host (round to nearest even), with MOE_HOST_FP16 for fp16, bf16
 * otherwise, and the fp8 ones (e4m3 <-> f16 pairs, float -> e4m3). */
#ifndef MOEGEN_CUDA_HOST_H
#define MOEGEN_CUDA_HOST_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <ucontext.h>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define __align__(x)
#define __cluster_dims__(...)
/* a block's static shared arrays: one copy that all its fibers see (blocks
 * run one after the other) */
#define __shared__ static

/* the prelude's first statement of every kernel: on the host there is no
 * grid before this one to wait for */
static inline void moe_pdl_begin() {}

struct uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct uint2 {
    unsigned x, y;
};
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct host_dim3 {
    unsigned x, y, z;
};
static host_dim3 threadIdx, blockIdx, gridDim;

/* blocks of 256 threads (host_launch3's `threads`: up to 288, the stream grid's 8 warps and its producer warp) */
enum { HOST_THREADS = 288, HOST_WARPS = HOST_THREADS / 32, HOST_STACK = 128 * 1024, HOST_MAX_CLUSTER = 8,
       HOST_FIBERS = HOST_THREADS * HOST_MAX_CLUSTER, HOST_NAMED = 4 };
struct host_barrier {
    int count, need;
    unsigned gen;
};
static struct {
    ucontext_t main, fiber[HOST_FIBERS];
    bool done[HOST_FIBERS];
    int cur, cta, cluster;           /* the running fiber, its block in the cluster, the cluster's blocks */
    host_barrier block[HOST_MAX_CLUSTER], warp[HOST_MAX_CLUSTER][HOST_WARPS], clusterb;
    host_barrier named[HOST_MAX_CLUSTER][HOST_NAMED]; /* bar.sync id, count (moe_bar_sync) */
    int threads;                     /* a block's threads (host_launch3) */
    float lane_val[HOST_MAX_CLUSTER][HOST_WARPS][32];
    const void *lane_ptr[HOST_MAX_CLUSTER][HOST_WARPS][32]; /* ldmatrix's row addresses */
    unsigned lane_frag[HOST_MAX_CLUSTER][HOST_WARPS][32][6]; /* mma's A and B fragments */
    unsigned char *smem;             /* block b's shared memory at smem + b * smem_stride */
    size_t smem_stride;
    const std::function<void()> *fn;
} host;

/* back to the scheduler; it runs the other fibers and comes back */
static inline void host_yield() { swapcontext(&host.fiber[host.cur], &host.main); }
static inline void host_wait(host_barrier &b) {
    const unsigned g = b.gen;
    if (++b.count == b.need) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == g)
        host_yield();
}
static inline void __syncthreads() { host_wait(host.block[host.cta]); }
/* the prelude's named barrier: `count` threads of the block meet at barrier id (1 .. 3) */
static inline void moe_bar_sync(int id, int count) {
    host_barrier &b = host.named[host.cta][id];
    b.need = count;
    host_wait(b);
}
/* v of lane src (src out of the warp: the caller's own, as __shfl_down_sync) */
static inline float host_shfl(float v, int src) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, b = host.cta;
    host.lane_val[b][w][lane] = v;
    host_wait(host.warp[b][w]);
    const float r = src >= 0 && src < 32 ? host.lane_val[b][w][src] : v;
    host_wait(host.warp[b][w]);
    return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int m) { return host_shfl(v, (int)(threadIdx.x & 31) ^ m); }
static inline float __shfl_down_sync(unsigned, float v, int d) { return host_shfl(v, (int)(threadIdx.x & 31) + d); }
/* any 4-byte value of lane src (the permute scatter's rows and flags), and a
 * warp's vote, one shuffle per lane */
template <class T> static inline T __shfl_sync(unsigned, T v, int src) {
    static_assert(sizeof(T) == 4, "a 4-byte value");
    float f, g;
    memcpy(&f, &v, 4);
    g = host_shfl(f, src & 31);
    T r;
    memcpy(&r, &g, 4);
    return r;
}
/* any other 4- or 8-byte value of lane lane ^ m (the route's 64-bit
 * selection keys): its 4-byte words shuffled one by one */
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "a 4- or 8-byte value");
    float f[2] = {0.0f, 0.0f}, g[2];
    memcpy(f, &v, sizeof(T));
    for (size_t i = 0; i < sizeof(T) / 4; i++)
        g[i] = host_shfl(f[i], (int)(threadIdx.x & 31) ^ m);
    T r;
    memcpy(&r, g, sizeof(T));
    return r;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline unsigned __ballot_sync(unsigned, bool p) {
    unsigned m = 0;
    for (int l = 0; l < 32; l++)
        m |= (unsigned)__shfl_sync(0u, (int)p, l) << l;
    return m;
}
template <class T> static inline T __ldg(const T *p) { return *p; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
/* one fiber runs at a time and blocks run one after the other: plain
 * read-modify-writes, and nothing to fence */
static inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
static inline int atomicExch(int *p, int v) {
    const int old = *p;
    *p = v;
    return old;
}
static inline void __threadfence() {}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* v of lane (lane - d); lanes below d keep their own (the route's and the
 * permute plan's scans) */
template <class T> static inline T __shfl_up_sync(unsigned m, T v, int d) {
    const int lane = (int)(threadIdx.x & 31);
    return __shfl_sync(m, v, lane - d >= 0 ? lane - d : lane);
}
/* redux.sync.max over the warp: every lane's value posted at once */
static inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, b = host.cta;
    memcpy(&host.lane_val[b][w][lane], &v, 4);
    host_wait(host.warp[b][w]);
    unsigned m = 0;
    for (int l = 0; l < 32; l++) {
        unsigned o;
        memcpy(&o, &host.lane_val[b][w][l], 4);
        m = o > m ? o : m;
    }
    host_wait(host.warp[b][w]);
    return m;
}
struct float2 {
    float x, y;
};
static inline float2 make_float2(float a, float b) { return {a, b}; }
struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
struct int4 {
    int x, y, z, w;
};
static inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned host_float_bits(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

/* The chain's signals between blocks (the prelude's moe_signal_add, moe_wait_geq): a plain add, and a wait
 * that lets the other fibers run (the chain's blocks run together: host_launch's cluster of the whole grid). */
static inline void moe_signal_add(int *p, int v) { *p += v; }
static inline void moe_wait_geq(const int *p, int v) {
    while (*p < v)
        host_yield();
}

/* __syncwarp: a barrier of the warp's 32 lanes. */
static inline void __syncwarp(unsigned = 0xffffffffu) { host_wait(host.warp[host.cta][threadIdx.x >> 5]); }

/* The prelude's mbarriers and bulk copies (the gemv stream grid): a
 * barrier's state lives beside its 8 bytes of shared memory (keyed by
 * their address); a phase completes when its arrivals and expected bytes
 * are both done; a bulk copy is done at once, its bytes completing on the
 * barrier; a wait yields to the other fibers until the phase of its
 * parity has completed. */
struct host_mbar {
    int expected, pending;
    long long tx;
    unsigned phase;
};
static inline host_mbar &host_mbar_of(void *bar) {
    static std::vector<std::pair<void *, host_mbar>> bars;
    for (auto &b : bars)
        if (b.first == bar)
            return b.second;
    bars.push_back({bar, host_mbar{}});
    return bars.back().second;
}
static inline void host_mbar_check(host_mbar &m) {
    if (m.pending == 0 && m.tx == 0) {
        m.phase++;
        m.pending = m.expected;
    }
}
static inline void moe_mbar_init(void *bar, int count) { host_mbar_of(bar) = host_mbar{count, count, 0, 0}; }
static inline void moe_mbar_arrive(void *bar) {
    host_mbar &m = host_mbar_of(bar);
    m.pending--;
    host_mbar_check(m);
}
static inline void moe_mbar_expect_tx(void *bar, unsigned bytes) {
    host_mbar &m = host_mbar_of(bar);
    m.tx += bytes;
    m.pending--;
    host_mbar_check(m);
}
static inline void moe_mbar_wait(void *bar, unsigned parity) {
    while ((host_mbar_of(bar).phase & 1u) == parity)
        host_yield();
}
static inline void moe_bulk_g2s(void *dst, const void *src, unsigned bytes, void *bar) {
    if (bytes % 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16) {
        fprintf(stderr, "moe_bulk_g2s: %u bytes from %p to %p: not 16-byte units\n", bytes, src, dst);
        abort();
    }
    memcpy(dst, src, bytes);
    host_mbar &m = host_mbar_of(bar);
    m.tx -= bytes;
    host_mbar_check(m);
}

typedef unsigned short moe_half_t;
typedef struct {
    int expert, row_start, rows, pad;
} moe_tile_t;

#ifdef MOE_HOST_FP16
static inline float moe_to_float(moe_half_t h) {
    const unsigned s = (h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31)
        return __uint_as_float(s | 0x7f800000u | (m << 13));
    if (e == 0) /* zero or subnormal: m * 2^-24 */
        return (s ? -1.0f : 1.0f) * ldexpf((float)m, -24);
    return __uint_as_float(s | ((e + 112) << 23) | (m << 13));
}
static inline moe_half_t moe_from_float(float f) {
    const unsigned u = host_float_bits(f), s = (u >> 16) & 0x8000u;
    const float a = fabsf(f);
    if (std::isnan(f))
        return (moe_half_t)(s | 0x7e00u);
    if (a >= 65520.0f)
        return (moe_half_t)(s | 0x7c00u);
    if (a < 6.103515625e-05f) /* subnormal half: round m = a * 2^24 to an integer, ties to even */
        return (moe_half_t)(s | (unsigned)nearbyintf(a * 16777216.0f));
    const unsigned au = u & 0x7fffffffu, r = au + 0xfffu + ((au >> 13) & 1u); /* round the 13 dropped bits */
    return (moe_half_t)(s | ((r >> 13) - (112u << 10)));
}
#else
static inline float moe_to_float(moe_half_t h) { return __uint_as_float(((unsigned)h) << 16); }
static inline moe_half_t moe_from_float(float f) {
    unsigned u = host_float_bits(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (moe_half_t)(u >> 16);
}
#endif
static inline unsigned moe_pack2(float lo, float hi) { return moe_from_float(lo) | ((unsigned)moe_from_float(hi) << 16); }
static inline float moe_round(float x) { return moe_to_float(moe_from_float(x)); }
static inline float moe_lo_float(unsigned v) { return moe_to_float((moe_half_t)(v & 0xffffu)); }
static inline float moe_hi_float(unsigned v) { return moe_to_float((moe_half_t)(v >> 16)); }
static inline float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* the prelude's expert input of router.apply = "input": each of the 8 halves times w, rounded */
static inline uint4 moe_scale8(const uint4 &v, float w) {
    return make_uint4(moe_pack2(moe_lo_float(v.x) * w, moe_hi_float(v.x) * w),
                      moe_pack2(moe_lo_float(v.y) * w, moe_hi_float(v.y) * w),
                      moe_pack2(moe_lo_float(v.z) * w, moe_hi_float(v.z) * w),
                      moe_pack2(moe_lo_float(v.w) * w, moe_hi_float(v.w) * w));
}
/* the block's dynamic shared memory (the kernels' extern __shared__ array) */
static inline unsigned char *host_smem() { return host.smem + (size_t)host.cta * host.smem_stride; }

/* The prelude's cluster helpers (fp8 specs): the cluster barrier, the
 * block's rank, and the float at p of this block's shared memory in block
 * `rank`'s. */
static inline void moe_cluster_sync() { host_wait(host.clusterb); }
static inline unsigned moe_cluster_rank() { return (unsigned)host.cta; }
static inline float moe_cluster_ld(const float *p, unsigned rank) {
    const unsigned char *q = reinterpret_cast<const unsigned char *>(p);
    float v;
    memcpy(&v, q - (size_t)host.cta * host.smem_stride + (size_t)rank * host.smem_stride, 4);
    return v;
}

/* The prelude's fp8 conversions: e4m3 (OCP e4m3fn: bias 7, 0x7f / 0xff NaN)
 * to float exactly, float to e4m3 (round to nearest even, saturating at
 * +-448, NaN to 0x7f: cvt.rn.satfinite), and f16 pairs. */
static inline float host_e4m3_float(unsigned b) {
    const float sg = b & 0x80u ? -1.0f : 1.0f;
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15 && m == 7)
        return NAN;
    return e == 0 ? sg * ldexpf((float)m, -9) : sg * ldexpf((float)(8 + m), (int)e - 10);
}
static inline unsigned host_float_e4m3(float f) {
    const unsigned s = host_float_bits(f) >> 31 << 7;
    if (std::isnan(f))
        return 0x7fu | s;
    const float a = fabsf(f);
    if (a >= 448.0f)
        return 0x7eu | s;
    if (a < 0.015625f) /* below 2^-6: subnormal steps of 2^-9 (8 steps = the smallest normal, code 8) */
        return s | (unsigned)nearbyintf(a * 512.0f);
    int e;
    const float fr = frexpf(a, &e); /* a = fr * 2^e, fr in [0.5, 1): the code's exponent e - 1 */
    unsigned m = (unsigned)nearbyintf((fr * 2.0f - 1.0f) * 8.0f);
    if (m == 8) {
        m = 0;
        e++;
    }
    const unsigned code = ((unsigned)(e - 1 + 7) << 3) | m; /* <= 0x7e: a < 448 rounds to at most 448 */
    return s | code;
}
/* a float that is an e4m3 value, as f16 bits (exact: e4m3's are f16 normals) */
static inline unsigned host_f16_bits(float f) {
    if (f == 0.0f)
        return host_float_bits(f) >> 16 & 0x8000u;
    const unsigned u = host_float_bits(f);
    return (u >> 16 & 0x8000u) | ((((u >> 23) & 255u) - 112u) << 10) | ((u >> 13) & 1023u);
}
static inline float host_f16_float(unsigned h) {
    const unsigned s = (h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    if (e == 0) /* zero or subnormal: m * 2^-24 */
        return (s ? -1.0f : 1.0f) * ldexpf((float)m, -24);
    return __uint_as_float(s | ((e + 112) << 23) | (m << 13));
}
static inline void moe_e4m3x4_h2(unsigned v, unsigned &lo, unsigned &hi) {
    unsigned h[4];
    for (int i = 0; i < 4; i++)
        h[i] = host_f16_bits(host_e4m3_float(v >> (8 * i) & 255u));
    lo = h[0] | h[1] << 16;
    hi = h[2] | h[3] << 16;
}
static inline float moe_h2_lo(unsigned h2) { return host_f16_float(h2 & 0xffffu); }
static inline float moe_h2_hi(unsigned h2) { return host_f16_float(h2 >> 16); }
static inline unsigned short moe_e4m3x2(float lo, float hi) {
    return (unsigned short)(host_float_e4m3(lo) | host_float_e4m3(hi) << 8);
}

/* The prelude's cp.async (the route's stage ring): a copy of `bytes` (0 or
 * 16) and zeros to 16, done at once, so the commits and waits are empty. */
static inline void moe_cp_async16(void *smem, const void *gmem, int bytes) {
    memcpy(smem, gmem, (size_t)bytes);
    memset((char *)smem + bytes, 0, (size_t)(16 - bytes));
}
static inline void moe_cp_async_commit() {}
template <int N> static inline void moe_cp_async_wait() {}

/* ldmatrix.sync.aligned.m8n8.xN.shared.b16: matrix j's 8 rows are at the
 * addresses lanes 8j .. 8j+7 give; lane i gets, of each matrix, the 32-bit
 * word at row i / 4, columns 2 (i % 4) and + 1 (the lower column in the low
 * half); with TRANS (.trans) each matrix is read transposed. */
template <int N, bool TRANS = false> static inline void host_ldmatrix(unsigned *r, const void *addr) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, b = host.cta;
    const void *const *row = host.lane_ptr[b][w];
    host.lane_ptr[b][w][lane] = addr;
    host_wait(host.warp[b][w]);
    for (int j = 0; j < N; j++) {
        if (TRANS) { /* .trans: rows 2 (i % 4) and + 1 of column i / 4, the lower row in the low half */
            unsigned short lo, hi;
            memcpy(&lo, (const unsigned char *)row[8 * j + 2 * (lane % 4)] + 2 * (lane / 4), 2);
            memcpy(&hi, (const unsigned char *)row[8 * j + 2 * (lane % 4) + 1] + 2 * (lane / 4), 2);
            r[j] = lo | (unsigned)hi << 16;
        } else {
            memcpy(&r[j], (const unsigned char *)row[8 * j + lane / 4] + 4 * (lane % 4), 4);
        }
    }
    host_wait(host.warp[b][w]);
}
static inline void moe_ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const void *smem) {
    unsigned r[4];
    host_ldmatrix<4>(r, smem);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}
static inline void moe_ldmatrix_x2(unsigned &r0, unsigned &r1, const void *smem) {
    unsigned r[2];
    host_ldmatrix<2>(r, smem);
    r0 = r[0], r1 = r[1];
}
/* ldmatrix .trans (the prelude's moe_ldmatrix_x4_trans): lane i gets, of
 * each matrix, rows 2 (i % 4) and + 1 of column i / 4 (the lower row in the
 * low half). */
static inline void moe_ldmatrix_x4_trans(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const void *smem) {
    unsigned r[4];
    host_ldmatrix<4, true>(r, smem);
    r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
}

/* mma.sync.aligned.m16n8k16.row.col.f32 (bf16, or fp16 with MOE_HOST_FP16)
 * D = A B + D: A 16 x 16 (row g: a0 columns 2t, 2t+1 and a2 columns +8;
 * row g + 8: a1, a3), B 16 x 8 (column g: b0 rows 2t, 2t+1, b1 rows +8),
 * D rows g, g + 8, columns 2t, 2t + 1 (d0 d1, d2 d3), g = lane / 4,
 * t = lane % 4. Each output's 16 products (exact in fp32) are summed in k
 * order and added to d: the tensor cores' order and rounding differ, so a
 * test allows for that. */
static inline void host_mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&bf)[2]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, b = host.cta, g = lane / 4, t = lane % 4;
    unsigned *mine = host.lane_frag[b][w][lane];
    for (int i = 0; i < 4; i++)
        mine[i] = a[i];
    mine[4] = bf[0], mine[5] = bf[1];
    host_wait(host.warp[b][w]);
    auto elem = [](unsigned v, int k) { return k & 1 ? moe_hi_float(v) : moe_lo_float(v); };
    auto A = [&](int r, int k) { /* row r, column k */
        return elem(host.lane_frag[b][w][(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k);
    };
    auto B = [&](int k, int n) { return elem(host.lane_frag[b][w][n * 4 + (k % 8) / 2][4 + (k >= 8)], k); };
    for (int i = 0; i < 4; i++) {
        const int r = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        float sum = 0.0f;
        for (int k = 0; k < 16; k++)
            sum += A(r, k) * B(k, n);
        d[i] += sum;
    }
    host_wait(host.warp[b][w]);
}

/* the prelude's moe_mma_16816 (fragments as pointers) */
static inline void moe_mma_16816(float *d, const unsigned *a, const unsigned *b) {
    host_mma_16816(*reinterpret_cast<float(*)[4]>(d), *reinterpret_cast<const unsigned(*)[4]>(a),
                   *reinterpret_cast<const unsigned(*)[2]>(b));
}

static void host_fiber_main() {
    (*host.fn)();
    host.done[host.cur] = true;
}

/* Run fn as every thread of a gx x gy x gz grid of 256-thread blocks, one
 * block at a time (or `cluster` consecutive blocks along x at a time,
 * together: a cluster), with smem bytes of shared memory per block
 * (poisoned); blocks of `threads` threads (a multiple of 32, at most
 * HOST_THREADS). */
static inline void host_launch3(unsigned gx, unsigned gy, unsigned gz, size_t smem, const std::function<void()> &fn,
                                unsigned cluster = 1, int threads = 256) {
    if (cluster < 1 || cluster > HOST_MAX_CLUSTER || gx % cluster || threads % 32 || threads < 32 ||
        threads > HOST_THREADS) {
        fprintf(stderr, "host_launch: a cluster of %u blocks of %d threads over a grid of %u\n", cluster, threads, gx);
        abort();
    }
    host.threads = threads;
    host.smem_stride = (smem + 16 + 15) / 16 * 16;
    std::vector<unsigned char> sm(host.smem_stride * cluster);
    const int nf = threads * (int)cluster;
    std::unique_ptr<char[]> stacks(new char[(size_t)nf * HOST_STACK]); /* untouched pages stay unmapped */
    host.smem = sm.data();
    host.fn = &fn;
    host.cluster = (int)cluster;
    gridDim = {gx, gy, gz};
    for (unsigned byz = 0; byz < gy * gz; byz++) /* y, then z */
        for (unsigned bx = 0, by = byz % gy, bz = byz / gy; bx < gx; bx += cluster) {
            memset(sm.data(), 0xcd, sm.size());
            for (unsigned b = 0; b < cluster; b++) {
                host.block[b] = {0, threads, 0};
                for (auto &n : host.named[b])
                    n = {0, 0, 0};
                for (auto &w : host.warp[b])
                    w = {0, 32, 0};
            }
            host.clusterb = {0, nf, 0};
            for (int t = 0; t < nf; t++) {
                getcontext(&host.fiber[t]);
                host.fiber[t].uc_stack.ss_sp = stacks.get() + (size_t)t * HOST_STACK;
                host.fiber[t].uc_stack.ss_size = HOST_STACK;
                host.fiber[t].uc_link = &host.main;
                makecontext(&host.fiber[t], host_fiber_main, 0);
                host.done[t] = false;
            }
            for (int left = nf; left > 0;) { /* round robin until every fiber returned */
                left = 0;
                for (int t = 0; t < nf; t++)
                    if (!host.done[t]) {
                        host.cur = t;
                        host.cta = t / threads;
                        threadIdx = {(unsigned)(t % threads), 0, 0};
                        blockIdx = {bx + (unsigned)host.cta, by, bz};
                        swapcontext(&host.main, &host.fiber[t]);
                        left += !host.done[t];
                    }
            }
        }
}

/* host_launch3 over one z layer: a gx x gy grid. */
static inline void host_launch(unsigned gx, unsigned gy, size_t smem, const std::function<void()> &fn,
                               unsigned cluster = 1, int threads = 256) {
    host_launch3(gx, gy, 1, smem, fn, cluster, threads);
}

#endif
