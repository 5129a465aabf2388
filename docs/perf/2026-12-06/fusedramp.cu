// fusedramp.cu — would one persistent kernel for a 1-token layer's up and down GEMMs beat two? (issue #16)
// A 1-token layer streams the up weights (A, e.g. Qwen3's 50 MB), then the down weights (B, 25 MB) whose GEMM needs
// every up output of its expert first. Two kernels pay a boundary and a second DRAM ramp; one persistent kernel
// could stream B into its shared-memory ring while the last A reads finish, and wait on a grid-wide counter only
// before using B. Timed here, each replayed from a CUDA graph after a clean L2 flush (a write, then a read of
// another 256 MiB), medians of 25:
//   one:   one read kernel over A + B (the ideal: no dependency)
//   two:   read A, then read B (two kernels in the graph, as the layer runs today)
//   fused: one persistent kernel: block b reads its share of A, adds 1 to a counter (release), fills its ring with
//          the first RING bytes of its B share (cp.async), waits until the counter reaches gridDim.x (acquire),
//          then reads the ring and streams the rest of its B share
//   fused0: the same without filling the ring before the wait (what the dependency costs by itself)
// Build: nvcc -O3 -arch=sm_90a -o fusedramp fusedramp.cu; run: ./fusedramp [A_MB B_MB] (default 50 25).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int THREADS = 256, RING = 96 * 1024;   // two blocks an SM, 96 KB of ring each (the stream grid's 3 stages)

static __device__ __forceinline__ void fold(uint4 &a, uint4 v) { a.x ^= v.x; a.y += v.y; a.z ^= v.z; a.w += v.w; }

// [b0, b1) of p, 16-byte vectors, four in flight a thread
static __device__ __forceinline__ void stream(const uint4 *__restrict__ p, size_t b0, size_t b1, uint4 &acc) {
    size_t i = b0 + threadIdx.x;
    for (; i + 3 * THREADS < b1; i += 4 * THREADS) {
        const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + THREADS), v2 = __ldg(p + i + 2 * THREADS),
                    v3 = __ldg(p + i + 3 * THREADS);
        fold(acc, v0), fold(acc, v1), fold(acc, v2), fold(acc, v3);
    }
    for (; i < b1; i += THREADS) fold(acc, __ldg(p + i));
}

static __device__ __forceinline__ void share(size_t n, size_t &b0, size_t &b1) {
    const size_t per = (n + gridDim.x - 1) / gridDim.x;
    b0 = blockIdx.x * per < n ? blockIdx.x * per : n;
    b1 = b0 + per < n ? b0 + per : n;
}

__global__ void __launch_bounds__(THREADS) rd(const uint4 *__restrict__ p, size_t n, unsigned *out) {
    size_t b0, b1;
    share(n, b0, b1);
    uint4 acc = make_uint4(0, 0, 0, 0);
    stream(p, b0, b1, acc);
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) out[0] = acc.x;
}

template <bool FILL>
__global__ void __launch_bounds__(THREADS) fused(const uint4 *__restrict__ a, size_t na, const uint4 *__restrict__ b,
                                                 size_t nb, unsigned *counter, unsigned *out) {
    extern __shared__ uint4 ring[];
    uint4 acc = make_uint4(0, 0, 0, 0);
    size_t a0, a1, b0, b1;
    share(na, a0, a1);
    share(nb, b0, b1);
    stream(a, a0, a1, acc);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(counter, 1u);
    }
    const size_t nr = FILL ? (b1 - b0 < RING / 16 ? b1 - b0 : RING / 16) : 0;   // the ring's vectors
    if constexpr (FILL)
        for (size_t i = threadIdx.x; i < nr; i += THREADS) {
            const unsigned s = (unsigned)__cvta_generic_to_shared(ring + i);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(b + b0 + i) : "memory");
        }
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (threadIdx.x == 0) {   // every block's A share done (the down GEMM's dependency)
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
        } while (v < gridDim.x);
    }
    __syncthreads();
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if constexpr (FILL)
        for (size_t i = threadIdx.x; i < nr; i += THREADS) fold(acc, ring[i]);
    stream(b, b0 + nr, b1, acc);
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) out[0] = acc.x;
}

__global__ void wr(uint4 *q, size_t n, unsigned s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q[i] = make_uint4(s, s, s, s);
}

int main(int argc, char **argv) {
    const double amb = argc > 2 ? atof(argv[1]) : 50, bmb = argc > 2 ? atof(argv[2]) : 25;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t MB = 1 << 20, fl = 256 * MB, na = (size_t)(amb * MB) / 16, nb = (size_t)(bmb * MB) / 16;
    uint4 *a, *b, *fw, *fr;
    unsigned *out, *counter;
    CK(cudaMalloc(&a, na * 16 + nb * 16));
    b = a + na;
    CK(cudaMalloc(&fw, fl));
    CK(cudaMalloc(&fr, fl));
    CK(cudaMalloc(&out, 16));
    CK(cudaMalloc(&counter, 4));
    CK(cudaMemset(a, 1, na * 16 + nb * 16));
    CK(cudaMemset(fr, 2, fl));
    CK(cudaFuncSetAttribute(fused<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, RING));
    CK(cudaFuncSetAttribute(fused<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, RING));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused<true>, THREADS, RING));
    const int grid = sms * (per_sm < 2 ? per_sm : 2);   // every block resident: the counter wait cannot deadlock
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("fusedramp on %s, %d SMs, %d blocks (%d an SM) of %d threads, ring %d KB; A %.0f MB, B %.0f MB; "
           "clean L2 flush\n", prop.name, sms, grid, per_sm < 2 ? per_sm : 2, THREADS, RING / 1024, amb, bmb);
    const char *names[] = {"one (A+B, one kernel)", "two (A, then B)", "fused (ring filled before the wait)",
                           "fused0 (no fill before the wait)"};
    double t_one = 0;
    for (int mode = 0; mode < 4; ++mode) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        if (mode == 0) {
            rd<<<grid, THREADS, 0, st>>>(a, na + nb, out);
        } else if (mode == 1) {
            rd<<<grid, THREADS, 0, st>>>(a, na, out);
            rd<<<grid, THREADS, 0, st>>>(b, nb, out);
        } else {
            CK(cudaMemsetAsync(counter, 0, 4, st));
            if (mode == 2)
                fused<true><<<grid, THREADS, RING, st>>>(a, na, b, nb, counter, out);
            else
                fused<false><<<grid, THREADS, RING, st>>>(a, na, b, nb, counter, out);
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        std::vector<float> t;
        for (int r = -3; r < 25; ++r) {
            wr<<<sms * 4, 512, 0, st>>>(fw, fl / 16, (unsigned)r);
            rd<<<sms * 4, THREADS, 0, st>>>(fr, fl / 16, out);   // L2 left with clean lines
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 0)
                t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        const double us = t[t.size() / 2] * 1e3;
        if (mode == 0)
            t_one = us;
        printf("%-38s %9.2f us  %6.3f x one  %6.0f GB/s\n", names[mode], us, us / t_one,
               (na + nb) * 16.0 / (us * 1e-6) / 1e9);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
