// gatherramp.cu — can the up GEMM's producer gather its A rows through the row map instead of reading the permuted
// copy xs (issue #17 item 2: the scatter kernel is 7 % of Qwen3-30B-A3B's layer at 4096 tokens)? A stand-in for the
// sm_90a GEMM's ring (templates/gemm_sm90.lua: a producer, STAGES stages of A (BM rows x 64 halves, 128-byte
// swizzle) and B (256 rows x 64 halves), full/empty mbarriers, two consumer warpgroups), with the consumers' wgmma
// replaced by a wait of SPIN cycles a stage (0: how fast the producer alone fills the ring). A per stage comes by:
//   box:     one TMA box {64, BM} of xs, rows row_start.. (what the GEMM does today; xs = x[src[r]], as the scatter
//            writes it)
//   rows:    the producer thread issues BM TMA boxes {64, 1} of x, row src[row_start + i] into row i of the stage
//   rows32:  the same spread over the producer warp: lane l issues rows l, l + 32, ..; lane 0 arrives with the bytes
//   cpasync: the producer warpgroup (128 threads) copies the 16-byte chunks with cp.async, placing chunk j of row i at
//            i * 128 + ((j ^ (i & 7)) << 4) (the swizzle TMA applies), each thread then cp.async.mbarrier.arrive.noinc
// B comes by one TMA box {64, 256} a stage in every mode. Checked: the first stage of the first tile of block 0, as
// the consumers see it, is copied out and compared byte for byte with box's (the wgmma descriptors read that
// layout). Timed: each mode's kernel alone, median of 9 after a 512 MiB write; ratio to box at the same SPIN.
// Build: nvcc -O3 -arch=sm_90a -o gatherramp gatherramp.cu; run: ./gatherramp [tokens] (default 4096; top-8 rows).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int H = 2048, K = 8, BN = 256, STAGES = 4, KT = H / 64, THREADS = 384;
enum { BOX, ROWS, ROWS32, CPASYNC, NMODES };
static const char *const names[NMODES] = {"box", "rows", "rows32", "cpasync"};

struct Maps { CUtensorMap xs, x, w; };

static __device__ __forceinline__ unsigned saddr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void bar_init(unsigned b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(b), "r"(n) : "memory");
}
static __device__ __forceinline__ void bar_arrive(unsigned b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(b) : "memory");
}
static __device__ __forceinline__ void bar_expect(unsigned b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void bar_wait(unsigned b, unsigned parity) {
    asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}"
                 :: "r"(b), "r"(parity) : "memory");
}
static __device__ __forceinline__ void tma(unsigned s, const CUtensorMap *m, int c0, int c1, unsigned b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(s), "l"((unsigned long long)m), "r"(c0), "r"(c1), "r"(b) : "memory");
}

template <int BM, int MODE>
__global__ void __launch_bounds__(THREADS, 1) ring(const __grid_constant__ Maps m, const unsigned short *__restrict__ x,
                                                    const int *__restrict__ src, int tiles, int spin,
                                                    unsigned *dump, unsigned *out) {
    constexpr unsigned A_BYTES = BM * 128, B_BYTES = BN * 128, STAGE = A_BYTES + B_BYTES;
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[2 * STAGES];
    const unsigned base = (saddr(smem) + 1023u) & ~1023u, bar0 = saddr(bars);
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(bar0 + 8 * s, MODE == CPASYNC ? 1 + 128 : 1);   // full: the producer (+ 128 cp.async arrivals)
            bar_init(bar0 + 8 * (STAGES + s), 256);                  // empty: every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid < 128) {   // the producer warpgroup
        int s = 0;
        unsigned ph = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int row_start = t * BM;
            int my[BM / 32 > 0 ? BM / 32 : 1];   // rows32: lane l's rows l, l + 32, ..
            if (MODE == ROWS32 && tid < 32)
                for (int i = 0; i < BM / 32; ++i) my[i] = src[row_start + tid + 32 * i];
            for (int kt = 0; kt < KT; ++kt) {
                const unsigned full = bar0 + 8 * s, so = base + s * STAGE;
                if (MODE == CPASYNC || tid < 32)
                    bar_wait(bar0 + 8 * (STAGES + s), ph ^ 1);
                if (MODE == BOX && tid == 0) {
                    bar_expect(full, STAGE);
                    tma(so, &m.xs, kt * 64, row_start, full);
                } else if (MODE == ROWS && tid == 0) {
                    bar_expect(full, STAGE);
                    for (int i = 0; i < BM; ++i) tma(so + i * 128, &m.x, kt * 64, __ldg(src + row_start + i), full);
                } else if (MODE == ROWS32 && tid < 32) {
                    if (tid == 0) bar_expect(full, STAGE);
                    __syncwarp();
                    for (int i = 0; i < BM / 32; ++i) tma(so + (tid + 32 * i) * 128, &m.x, kt * 64, my[i], full);
                } else if (MODE == CPASYNC) {
                    if (tid == 0) bar_expect(full, B_BYTES);   // B by TMA; A by the 128 threads' cp.async
                    for (int c = tid; c < BM * 8; c += 128) {
                        const int i = c >> 3, j = c & 7;
                        const unsigned short *g = x + (size_t)__ldg(src + row_start + i) * H + kt * 64 + j * 8;
                        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(so + i * 128 + ((j ^ (i & 7)) << 4)),
                                     "l"(g) : "memory");
                    }
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(full) : "memory");
                }
                if (tid == 0)
                    tma(so + A_BYTES, &m.w, kt * 64, (t % 48) * BN, full);
                if (++s == STAGES) s = 0, ph ^= 1;
            }
        }
        if (MODE == CPASYNC) asm volatile("cp.async.wait_all;" ::: "memory");
    } else {           // two consumer warpgroups: wait, touch the stage, wait SPIN cycles, release
        const int ct = tid - 128;
        int s = 0;
        unsigned ph = 0, acc = 0;
        bool first = blockIdx.x == 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            for (int kt = 0; kt < KT; ++kt) {
                const unsigned so = base + s * STAGE;
                bar_wait(bar0 + 8 * s, ph);
                for (unsigned o = ct * 16; o < A_BYTES; o += 256 * 16) {
                    unsigned a, b, c, d;
                    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(so + o));
                    acc ^= a + b * 3 + c * 5 + d * 7;
                    if (first) {
                        dump[o / 4] = a, dump[o / 4 + 1] = b, dump[o / 4 + 2] = c, dump[o / 4 + 3] = d;
                    }
                }
                first = false;
                if (spin) {
                    const long long t0 = clock64();
                    while (clock64() - t0 < spin) {}
                }
                bar_arrive(bar0 + 8 * (STAGES + s));
                if (++s == STAGES) s = 0, ph ^= 1;
            }
        }
        if (acc == 0x9e3779b9u) out[0] = acc;
    }
}

typedef CUresult (*encode_t)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                             const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static encode_t encode;
static void map2d(CUtensorMap *m, void *p, size_t rows, int box_rows) {
    cuuint64_t dims[2] = {H, rows}, strides[1] = {H * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CUresult r = encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) { fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r); exit(1); }
}

template <int BM>
static void run(int tokens, int sms) {
    const int R = tokens * K, tiles = R / BM;
    std::vector<unsigned short> hx((size_t)tokens * H);
    std::vector<int> hs(R);
    unsigned long long z = 88172645463325252ull;
    for (auto &v : hx) { z ^= z << 13; z ^= z >> 7; z ^= z << 17; v = (unsigned short)(0x3c00 + (z & 0x3ff)); }
    for (int r = 0; r < R; ++r) { z ^= z << 13; z ^= z >> 7; z ^= z << 17; hs[r] = (int)(z % tokens); }
    std::vector<unsigned short> hxs((size_t)R * H);
    for (int r = 0; r < R; ++r) memcpy(&hxs[(size_t)r * H], &hx[(size_t)hs[r] * H], H * 2);
    unsigned short *x, *xs, *w;
    int *src;
    unsigned *dump, *out;
    char *flush;
    const size_t wrows = 48 * BN;
    CK(cudaMalloc(&x, hx.size() * 2)); CK(cudaMalloc(&xs, hxs.size() * 2)); CK(cudaMalloc(&w, wrows * H * 2));
    CK(cudaMalloc(&src, R * 4)); CK(cudaMalloc(&dump, BM * 128)); CK(cudaMalloc(&out, 4)); CK(cudaMalloc(&flush, 512 << 20));
    CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xs, hxs.data(), hxs.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(src, hs.data(), R * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(w, 0x3c, wrows * H * 2));
    Maps m;
    map2d(&m.xs, xs, R, BM);
    map2d(&m.x, x, tokens, 1);
    map2d(&m.w, w, wrows, BN);
    void (*k[NMODES])(Maps, const unsigned short *, const int *, int, int, unsigned *, unsigned *) = {
        ring<BM, BOX>, ring<BM, ROWS>, ring<BM, ROWS32>, ring<BM, CPASYNC>};
    const int smem = STAGES * (BM + BN) * 128 + 1024;
    for (int i = 0; i < NMODES; ++i) CK(cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    std::vector<unsigned> ref(BM * 32), got(BM * 32);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    printf("BM %d: %d tokens x top-%d = %d rows, %d tiles x %d k tiles, %d CTAs, stage %d KB\n", BM, tokens, K, R, tiles,
           KT, sms, (BM + BN) * 128 / 1024);
    for (int spin : {0, 400, 800}) {
        float box_ms = 0;
        for (int i = 0; i < NMODES; ++i) {
            std::vector<float> t;
            for (int it = 0; it < 10; ++it) {
                CK(cudaMemset(flush, it, 512 << 20));
                CK(cudaMemset(dump, 0xff, BM * 128));
                CK(cudaEventRecord(e0));
                k[i]<<<sms, THREADS, smem>>>(m, x, src, tiles, spin, dump, out);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (it) t.push_back(ms);
            }
            std::sort(t.begin(), t.end());
            const float ms = t[t.size() / 2];
            if (i == BOX) box_ms = ms;
            CK(cudaMemcpy((i == BOX ? ref : got).data(), dump, BM * 128, cudaMemcpyDeviceToHost));
            const bool same = i == BOX || memcmp(ref.data(), got.data(), BM * 128) == 0;
            printf("  spin %4d  %-8s %9.1f us  %.3f x box  A %6.0f GB/s  first stage %s\n", spin, names[i], ms * 1e3,
                   ms / box_ms, (double)R * H * 2 / (ms * 1e-3) / 1e9, i == BOX ? "(reference)" : same ? "same bytes" : "DIFFERS");
        }
    }
    cudaFree(x); cudaFree(xs); cudaFree(w); cudaFree(src); cudaFree(dump); cudaFree(out); cudaFree(flush);
}

int main(int argc, char **argv) {
    const int tokens = argc > 1 ? atoi(argv[1]) : 4096;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &q));
    if (!encode) { fprintf(stderr, "no cuTensorMapEncodeTiled\n"); return 1; }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("gatherramp on %s, %d SMs, H %d\n", p.name, p.multiProcessorCount, H);
    run<64>(tokens, p.multiProcessorCount);
    run<128>(tokens, p.multiProcessorCount);
    return 0;
}
