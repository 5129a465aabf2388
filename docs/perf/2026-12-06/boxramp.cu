// boxramp.cu — does the sm_90a GEMMs' B operand layout limit how fast they stream the weights? (issues #16, #17)
// At 128 rows an expert (Mixtral, the EP8 rank at 512 tokens) the up and down GEMMs read the weights at ~70 % of
// the copy rate with the tensor pipes ~34 % busy (docs/PERF.md): neither saturated. Each stage of their ring takes
// B as one TMA box of 256 weight rows x 64 k (128 bytes of each row, rows K * 2 bytes apart), so a stage asks DRAM
// for 256 separate 128-byte pieces; a plain read kernel streams contiguous memory. This stand-in runs the GEMM's
// ring (one producer thread, STAGES stages, full / empty mbarriers, 256 consumer threads that read every byte of a
// stage from shared memory, then wait SPIN cycles for the math they stand for) over E experts' [N, K] bf16 weights,
// each (expert, 256-row N tile) once, its K / 64 stages in order, CTAs walking tiles b, b + grid, ...:
//   read:    no ring: every thread reads 16-byte vectors strided by the grid (the read ceiling of these bytes)
//   box:     B by one TMA box {64, 256} a stage (the GEMMs' layout and order), 32 KB stages
//   box2:    the same, each tile read by two neighbouring CTAs at once (two 64-row M tiles of one expert: the
//            second's bytes from L2); the figure counts each byte once
//   boxk128: two boxes a stage (k 128: 256 bytes of each row), 64 KB stages, STAGES / 2 + 1 of them
//   bulk:    the same bytes as if packed tile by tile: one 32 KB cp.async.bulk a stage from contiguous memory
// Checked: every mode's XOR of the 32-bit words it read (each word once; box2 one CTA of each pair) equals the
// read mode's. Timed: median of 9 after a 256 MiB write, GB/s of the weights' bytes, against cudaMemcpy's
// device-to-device rate (bytes read + written) measured here.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o boxramp boxramp.cu -lcuda; run: ./boxramp [E N K] (default Mixtral's
// up projection: 8 28672 4096).
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int BN = 256, BK = 64, THREADS = 384, STAGES = 4, BOX_BYTES = BN * BK * 2;
enum { READ, BOX, BOX2, BOXK128, BULK, NMODES };
static const char *const names[NMODES] = {"read", "box", "box2", "boxk128", "bulk"};

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
static __device__ __forceinline__ void bulk(unsigned s, const void *g, unsigned bytes, unsigned b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(s), "l"(g), "r"(bytes), "r"(b) : "memory");
}

__global__ void fill(uint4 *w, size_t n16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = (i + 1) * 0x9e3779b97f4a7c15ull;
        z ^= z >> 29; z *= 0xbf58476d1ce4e5b9ull; z ^= z >> 32;
        w[i] = make_uint4((unsigned)z, (unsigned)(z >> 32), (unsigned)(z * 3), (unsigned)(z >> 17));
    }
}

__global__ void __launch_bounds__(THREADS) rd(const uint4 *__restrict__ w, size_t n16, unsigned *out) {
    unsigned a = 0;
    size_t i = blockIdx.x * (size_t)THREADS + threadIdx.x;
    const size_t step = (size_t)gridDim.x * THREADS;
    for (; i + 3 * step < n16; i += 4 * step) {   // four loads in flight a thread
        const uint4 v0 = __ldcs(w + i), v1 = __ldcs(w + i + step), v2 = __ldcs(w + i + 2 * step), v3 = __ldcs(w + i + 3 * step);
        a ^= v0.x ^ v0.y ^ v0.z ^ v0.w ^ v1.x ^ v1.y ^ v1.z ^ v1.w ^ v2.x ^ v2.y ^ v2.z ^ v2.w ^ v3.x ^ v3.y ^ v3.z ^ v3.w;
    }
    for (; i < n16; i += step) {
        const uint4 v = __ldcs(w + i);
        a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    atomicXor(out, a);
}

// the ring: tiles (expert, N tile) of E * N / 256, each K / 64 stages of 256 rows x 64 k (MODE boxk128: x 128)
template <int MODE>
__global__ void __launch_bounds__(THREADS, 1) ring(const __grid_constant__ CUtensorMap map, const unsigned char *w,
                                                    int E, int N, int K, int spin, unsigned *out) {
    constexpr int SB = MODE == BOXK128 ? 2 * BOX_BYTES : BOX_BYTES;   // stage bytes
    constexpr int NS = MODE == BOXK128 ? STAGES / 2 + 1 : STAGES;
    constexpr int KS = MODE == BOXK128 ? 2 * BK : BK;                 // k a stage
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bars[2 * NS];
    const unsigned base = (saddr(smem) + 1023u) & ~1023u, bar0 = saddr(bars);
    const int tid = threadIdx.x, NT = N / BN, KT = K / KS, tiles = E * NT;
    const int walk = MODE == BOX2 ? 2 * tiles : tiles;   // box2: walk index j reads tile j / 2
    if (tid == 0) {
        for (int s = 0; s < NS; ++s) {
            bar_init(bar0 + 8 * s, 1);
            bar_init(bar0 + 8 * (NS + s), THREADS - 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid < 128) {
        if (tid == 0) {
            int s = 0;
            unsigned ph = 0;
            for (int j = blockIdx.x; j < walk; j += gridDim.x) {
                const int t = MODE == BOX2 ? j / 2 : j, e = t / NT, nt = t % NT;
                for (int kt = 0; kt < KT; ++kt) {
                    const unsigned full = bar0 + 8 * s, so = base + s * SB;
                    bar_wait(bar0 + 8 * (NS + s), ph ^ 1);
                    bar_expect(full, SB);
                    if (MODE == BULK) {
                        bulk(so, w + ((size_t)t * KT + kt) * SB, SB, full);
                    } else {
                        for (int a = 0; a < KS / BK; ++a)
                            tma(so + a * BOX_BYTES, &map, kt * KS + a * BK, e * N + nt * BN, full);
                    }
                    if (++s == NS) s = 0, ph ^= 1;
                }
            }
        }
    } else {
        const int ct = tid - 128;
        int s = 0;
        unsigned ph = 0, acc = 0;
        for (int j = blockIdx.x; j < walk; j += gridDim.x) {
            const bool counted = MODE != BOX2 || j % 2 == 0;
            for (int kt = 0; kt < KT; ++kt) {
                const unsigned so = base + s * SB;
                bar_wait(bar0 + 8 * s, ph);
#pragma unroll 4
                for (unsigned o = ct * 16; o < (unsigned)SB; o += (THREADS - 128) * 16) {
                    unsigned a, b, c, d;
                    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(so + o));
                    if (counted) acc ^= a ^ b ^ c ^ d;
                }
                if (spin) {
                    const long long t0 = clock64();
                    while (clock64() - t0 < spin) {}
                }
                bar_arrive(bar0 + 8 * (NS + s));
                if (++s == NS) s = 0, ph ^= 1;
            }
        }
        atomicXor(out, acc);
    }
}

typedef CUresult (*encode_t)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                             const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int main(int argc, char **argv) {
    const int E = argc > 3 ? atoi(argv[1]) : 8, N = argc > 3 ? atoi(argv[2]) : 28672, K = argc > 3 ? atoi(argv[3]) : 4096;
    if (E < 1 || N < BN || N % BN || K < 2 * BK || K % (2 * BK)) {
        fprintf(stderr, "boxramp: E >= 1, N a multiple of %d, K a multiple of %d\n", BN, 2 * BK);
        return 2;
    }
    encode_t encode = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &q));
    if (!encode) { fprintf(stderr, "no cuTensorMapEncodeTiled\n"); return 1; }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    const int sms = p.multiProcessorCount;
    const size_t bytes = (size_t)E * N * K * 2, n16 = bytes / 16;
    unsigned char *w, *flush, *cpy;
    unsigned *out;
    CK(cudaMalloc(&w, bytes)); CK(cudaMalloc(&flush, 256 << 20)); CK(cudaMalloc(&out, 4 * NMODES));
    CK(cudaMalloc(&cpy, 1ull << 30));
    fill<<<4 * sms, 256>>>((uint4 *)w, n16);
    CK(cudaGetLastError());
    CUtensorMap map;
    {
        cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)E * N}, strides[1] = {(cuuint64_t)K * 2};
        cuuint32_t box[2] = {BK, BN}, es[2] = {1, 1};
        CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) { fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r); return 1; }
    }
    void (*k[NMODES])(CUtensorMap, const unsigned char *, int, int, int, int, unsigned *) = {
        nullptr, ring<BOX>, ring<BOX2>, ring<BOXK128>, ring<BULK>};
    const int smem[NMODES] = {0, STAGES * BOX_BYTES + 1024, STAGES * BOX_BYTES + 1024,
                              (STAGES / 2 + 1) * 2 * BOX_BYTES + 1024, STAGES * BOX_BYTES + 1024};
    for (int i = 1; i < NMODES; ++i) CK(cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem[i]));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto median = [](std::vector<float> t) { std::sort(t.begin(), t.end()); return t[t.size() / 2]; };
    std::vector<float> tc;
    for (int it = 0; it < 9; ++it) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(cpy, cpy + (512 << 20), 512 << 20, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tc.push_back(ms);
    }
    const double copy_gbs = 2.0 * (512 << 20) / (median(tc) * 1e-3) / 1e9;
    printf("boxramp on %s, %d SMs: E %d N %d K %d, %.2f GB of weights, %d tiles of %d x %d; copy %.0f GB/s (read + "
           "write)\n", p.name, sms, E, N, K, bytes / 1e9, E * N / BN, BN, K, copy_gbs);
    unsigned ref = 0;
    for (int spin : {0, 700, 1400}) {
        float read_ms = 0;
        for (int i = 0; i < NMODES; ++i) {
            if (i == READ && spin) continue;
            std::vector<float> t;
            unsigned got = 0;
            for (int it = 0; it < 9; ++it) {
                CK(cudaMemset(flush, it, 256 << 20));
                CK(cudaMemset(out + i, 0, 4));
                CK(cudaEventRecord(e0));
                if (i == READ)
                    rd<<<4 * sms, THREADS>>>((const uint4 *)w, n16, out + i);
                else
                    k[i]<<<sms, THREADS, smem[i]>>>(map, w, E, N, K, spin, out + i);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms);
                CK(cudaMemcpy(&got, out + i, 4, cudaMemcpyDeviceToHost));
                if (i == READ) ref = got;
                else if (got != ref) { fprintf(stderr, "boxramp: %s read other bytes (xor %08x, read %08x)\n", names[i], got, ref); return 1; }
            }
            const float ms = median(t);
            if (i == READ) read_ms = ms;
            printf("  spin %4d  %-8s %9.1f us  %6.0f GB/s  %.3f x copy  %.3f x read%s\n", spin, names[i], ms * 1e3,
                   bytes / (ms * 1e-3) / 1e9, bytes / (ms * 1e-3) / 1e9 / copy_gbs, read_ms / ms,
                   i == READ ? "" : "  (same bytes)");
        }
    }
    cudaFree(w); cudaFree(flush); cudaFree(out); cudaFree(cpy);
    return 0;
}
