@ -- prelude.lua — the device prelude every emitted .cu starts with: the
@ -- element type, conversions, and the tensor-core and async-copy wrappers.
@ -- No CUDA headers are included, so the same text compiles under NVRTC and
@ -- plain nvcc with no include path.
@ local M = {}
@
@ function M.prelude(p)
typedef unsigned short moe_half_t;   /* ${p.dtype} bits */
typedef struct { int expert, row_start, rows, pad; } moe_tile_t;
/* The route kernel's fused tail (templates/route.lua, "Fused"; mode: 0 off,
 * 1 the permute plan, 2 the plan and the row scatter; gen/launch_geom.h,
 * moe_route_fuse_mode): the permute plan's outputs and the scatter's. */
typedef struct {
    int mode, align;
    const int *slot_of;
    int *offsets, *cursor;
    moe_tile_t *tiles;
    int *num_tiles;
    moe_half_t *xs;   /* fp8: the e4m3 rows (bytes) */
    int *row_of;
    float *xsc;       /* fp8: the rows' scales, one per 128 columns (mode 2 at one token) */
} moe_route_fuse_t;
/* A TMA tensor map (the driver's CUtensorMap: 128 opaque bytes, 64-byte
 * aligned), passed by value to the sm_90a GEMMs as __grid_constant__. */
typedef struct __align__(64) { unsigned long long opaque[16]; } moe_tmap_t;

#if defined(__CUDACC_RTC__)
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
#endif

static __device__ __forceinline__ float moe_to_float(moe_half_t h) {
@ if p.dtype == "bf16" then
    return __uint_as_float(((unsigned)h) << 16);
@ else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
@ end
}

static __device__ __forceinline__ moe_half_t moe_from_float(float f) {
    moe_half_t h;
    asm("cvt.rn.${p.dtype == "bf16" and "bf16" or "f16"}.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* Two floats to a packed pair, lo in the low half. */
static __device__ __forceinline__ unsigned moe_pack2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.${p.dtype == "bf16" and "bf16x2" or "f16x2"}.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

static __device__ __forceinline__ float moe_lo_float(unsigned v) { return moe_to_float((moe_half_t)(v & 0xffffu)); }
static __device__ __forceinline__ float moe_hi_float(unsigned v) { return moe_to_float((moe_half_t)(v >> 16)); }
/* x rounded to the dtype (round to nearest even), back as a float */
static __device__ __forceinline__ float moe_round(float x) { return moe_to_float(moe_from_float(x)); }

/* The 8 halves of v times w, each product rounded to the dtype: the expert
 * input round(x·w) of router.apply = "input" (w already in the dtype). */
static __device__ __forceinline__ uint4 moe_scale8(const uint4 &v, float w) {
    return make_uint4(moe_pack2(moe_lo_float(v.x) * w, moe_hi_float(v.x) * w),
                      moe_pack2(moe_lo_float(v.y) * w, moe_hi_float(v.y) * w),
                      moe_pack2(moe_lo_float(v.z) * w, moe_hi_float(v.z) * w),
                      moe_pack2(moe_lo_float(v.w) * w, moe_hi_float(v.w) * w));
}

/* Programmatic dependent launch (docs/DESIGN.md, "Launch overlap"): the
 * first statement of every kernel. griddepcontrol.wait returns once the
 * grids this one depends on have completed and their writes are visible
 * (at once when it was not launched as a dependent); only then does the
 * kernel touch memory. launch_dependents then lets the stream's next
 * kernel, when it was launched as a dependent, put its blocks on the SMs
 * as this grid's blocks finish (they wait at their own first statement).
 * No-op below sm_90. */
static __device__ __forceinline__ void moe_pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

static __device__ __forceinline__ unsigned moe_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

/* The cluster shape of the GEMMs in CTA pairs (a tuning entry's "+mc",
 * templates/gemm_sm90.lua): two CTAs, on the sm_90 targets only (the other
 * targets' bodies of those kernels trap). */
#ifndef MOE_CTA_PAIR
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MOE_CTA_PAIR __cluster_dims__(2, 1, 1)
#else
#define MOE_CTA_PAIR
#endif
#endif

@ if p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3" then
/* fp8 (docs/DESIGN.md, "FP8"; sm_90a only, as fp8 specs are). The 4 e4m3
 * of v as two f16 pairs, exactly (lo: bytes 0, 1; hi: bytes 2, 3; the
 * lower byte in the lower half), and an f16 of a pair as a float. */
static __device__ __forceinline__ void moe_e4m3x4_h2(unsigned v, unsigned &lo, unsigned &hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi) : "r"(v));
}
static __device__ __forceinline__ float moe_h2_lo(unsigned h2) {
    float f;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.f32.f16 %0, l;\n\t}" : "=f"(f) : "r"(h2));
    return f;
}
static __device__ __forceinline__ float moe_h2_hi(unsigned h2) {
    float f;
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %1;\n\tcvt.f32.f16 %0, h;\n\t}" : "=f"(f) : "r"(h2));
    return f;
}
/* Two floats to two e4m3 (lo in the low byte): round to nearest even,
 * saturating at +-448 (runtime/fp8.c's moe_float_to_e4m3 on the host). */
static __device__ __forceinline__ unsigned short moe_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
/* Thread block clusters (the fp8 gemv up GEMM's, templates/gemm_gemv.lua):
 * a barrier of every thread of the cluster (release, then acquire: the
 * shared-memory writes before it are visible to the cluster after it),
 * this CTA's rank in its cluster, and the float at p (this CTA's shared
 * memory) in CTA `rank`'s shared memory. */
static __device__ __forceinline__ void moe_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ unsigned moe_cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
static __device__ __forceinline__ float moe_cluster_ld(const float *p, unsigned rank) {
    unsigned remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(moe_smem_addr(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}
@ end

/* 16-byte async copy global -> shared; bytes < 16 zero-fills the rest
 * (bytes = 0 writes zeros and reads nothing). */
static __device__ __forceinline__ void moe_cp_async16(void *smem, const void *gmem, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(moe_smem_addr(smem)), "l"(gmem), "r"(bytes));
}
static __device__ __forceinline__ void moe_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void moe_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

/* mbarriers and 1D bulk copies (sm_90; the gemv "stream" grid, templates/
 * gemm_gemv.lua): an mbarrier of `count` arrivals at shared address bar;
 * arrive; arrive and expect `bytes` more of transactions; wait until the
 * phase of parity `parity` has completed; and a bulk copy of `bytes` (a
 * multiple of 16, both addresses 16-byte aligned) from global src to
 * shared dst that completes its bytes on bar. No-ops below sm_90. */
static __device__ __forceinline__ void moe_mbar_init(void *bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(moe_smem_addr(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void moe_mbar_arrive(void *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(moe_smem_addr(bar)) : "memory");
#endif
}
static __device__ __forceinline__ void moe_mbar_expect_tx(void *bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(moe_smem_addr(bar)), "r"(bytes)
                 : "memory");
#endif
}
static __device__ __forceinline__ void moe_mbar_wait(void *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n}\n" :: "r"(moe_smem_addr(bar)), "r"(parity) : "memory");
#endif
}
/* bar.sync id, count: `count` threads (whole warps) of the block meet at named barrier id (the stream grid's
 * consumer warps, without its producer warp). */
static __device__ __forceinline__ void moe_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
/* The gemv "chain" grid's signals between CTAs (templates/gemm_gemv.lua): add v to *p, ordered after this
 * thread's earlier writes at GPU scope (release); wait until *p >= v, the writes released before the adds
 * that got it there then visible to this thread (acquire). */
static __device__ __forceinline__ void moe_signal_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ void moe_wait_geq(const int *p, int v) {
    for (;;) {
        int cur;
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(cur) : "l"(p) : "memory");
        if (cur >= v)
            return;
        __nanosleep(64);
    }
}
static __device__ __forceinline__ void moe_bulk_g2s(void *dst, const void *src, unsigned bytes, void *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(moe_smem_addr(dst)), "l"(src), "r"(bytes), "r"(moe_smem_addr(bar)) : "memory");
#endif
}

static __device__ __forceinline__ void moe_ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3,
                                                       const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(moe_smem_addr(smem)));
}
static __device__ __forceinline__ void moe_ldmatrix_x2(unsigned &r0, unsigned &r1, const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1) : "r"(moe_smem_addr(smem)));
}
@ if p.spec.training then
/* ldmatrix .trans (the backward's router products, templates/bwd.lua): each
 * 8x8 matrix transposed, so lane i gets its rows 2 (i % 4) and + 1 of
 * column i / 4 (the lower row in the low half): a row-major [k][n] tile as
 * mma's B (col) fragment, or a [k][m] one as its A (row) fragment. */
static __device__ __forceinline__ void moe_ldmatrix_x4_trans(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3,
                                                             const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(moe_smem_addr(smem)));
}
@ end

/* D = A(16x16, row) * B(16x8, col) + D, fp32 accumulate. */
static __device__ __forceinline__ void moe_mma_16816(float *d, const unsigned *a, const unsigned *b) {
@ local mt = p.dtype == "bf16" and "bf16" or "f16"
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.${mt}.${mt}.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ float moe_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
/* router.score = "sqrtsoftplus" (DeepSeek-V4): sqrt(softplus(l)), softplus as max(l, 0) + log1p(exp(-|l|))
 * (no overflow), and its derivative sigmoid(l) / (2 s) (0 where s underflows to 0) */
static __device__ __forceinline__ float moe_sqrt_softplus(float l) {
    return sqrtf(fmaxf(l, 0.0f) + log1pf(expf(-fabsf(l))));
}
static __device__ __forceinline__ float moe_sqrt_softplus_grad(float l) {
    const float s = moe_sqrt_softplus(l);
    return s > 0.0f ? 1.0f / (1.0f + expf(-l)) / (2.0f * s) : 0.0f;
}

/* The permute plan, by one block of THREADS threads (the permute_plan
 * kernel, and the route kernel's fused tail): the counts of N weight slots
 * -> offsets[N + 1], each slot's rows starting on a multiple of align (an
 * exclusive scan of the counts rounded up), cursor[] = 0, and the tile
 * table {slot_of[e], row_start, rows, 0}, one entry per align rows of each
 * slot in slot order, its length in *num_tiles. counts are read from L2
 * (other blocks' atomics), or from s_counts when it is not null (shared
 * memory: the counts of a launch whose only block made them, no round
 * trip to L2). Shared memory: s_off[N], s_first[N + 1], s_wr and s_wt
 * [THREADS / 32]; s_off holds each slot's first row after. */
template <int THREADS, int N>
static __device__ __forceinline__ void moe_plan_block(const int *counts, const int *s_counts,
                                                      const int *__restrict__ slot_of, int align,
                                                      int *__restrict__ offsets, int *__restrict__ cursor,
                                                      moe_tile_t *__restrict__ tiles, int *__restrict__ num_tiles,
                                                      int *s_off, int *s_first, int *s_wr, int *s_wt) {
    constexpr int WARPS = THREADS / 32, IPT = (N + THREADS - 1) / THREADS;   // consecutive slots per thread
    static_assert(WARPS <= 32, "one warp scans the warps' sums");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int cnt[IPT], rows = 0, nt = 0;
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
        const int e = tid * IPT + i;
        cnt[i] = e >= N ? 0 : s_counts ? s_counts[e] : __ldcg(counts + e);
        rows += (cnt[i] + align - 1) / align * align;
        nt += (cnt[i] + align - 1) / align;
    }
    /* block-wide exclusive scan of (rows, nt) in slot order */
    int ir = rows, it = nt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, ir, o), b = __shfl_up_sync(0xffffffffu, it, o);
        if (lane >= o) {
            ir += a;
            it += b;
        }
    }
    if (lane == 31) {
        s_wr[warp] = ir;
        s_wt[warp] = it;
    }
    __syncthreads();
    if (warp == 0) {
        int a = lane < WARPS ? s_wr[lane] : 0, b = lane < WARPS ? s_wt[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int a2 = __shfl_up_sync(0xffffffffu, a, o), b2 = __shfl_up_sync(0xffffffffu, b, o);
            if (lane >= o) {
                a += a2;
                b += b2;
            }
        }
        if (lane < WARPS) {
            s_wr[lane] = a;
            s_wt[lane] = b;
        }
    }
    __syncthreads();
    int row0 = ir - rows + (warp ? s_wr[warp - 1] : 0);
    int tile0 = it - nt + (warp ? s_wt[warp - 1] : 0);
#pragma unroll
    for (int i = 0; i < IPT; ++i) {
        const int e = tid * IPT + i;
        if (e < N) {
            offsets[e] = row0;
            cursor[e] = 0;
            s_off[e] = row0;
            s_first[e] = tile0;
        }
        row0 += (cnt[i] + align - 1) / align * align;
        tile0 += (cnt[i] + align - 1) / align;
    }
    const int total_tiles = s_wt[WARPS - 1];
    if (tid == 0) {
        offsets[N] = s_wr[WARPS - 1];
        *num_tiles = total_tiles;
        s_first[N] = total_tiles;
    }
    __syncthreads();

    /* tile i belongs to the slot e with s_first[e] <= i < s_first[e + 1] */
    for (int i = tid; i < total_tiles; i += THREADS) {
        int lo = 0, hi = N;   // s_first[lo] <= i < s_first[hi]
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (s_first[mid] <= i)
                lo = mid;
            else
                hi = mid;
        }
        const int j = i - s_first[lo];
        const int left = (s_counts ? s_counts[lo] : __ldcg(counts + lo)) - j * align;
        /* the GEMMs read slot lo's weights at slot_of[lo]: the routing table
         * says where each expert's weights are, nothing assumes slot == lo */
        reinterpret_cast<int4 *>(tiles)[i] =
            make_int4(slot_of[lo], s_off[lo] + j * align, left < align ? left : align, 0);
    }
}
@ end
@
@ return M
