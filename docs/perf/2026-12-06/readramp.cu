// readramp.cu — how fast can one kernel read N MB of weights once, from a cold L2, on this GPU? (issue #16)
// The 1-token layer's floor is "the touched weights once at the copy bandwidth"; this asks what a read-only kernel
// of that size really takes (launch, DRAM ramp, tail), eagerly and replayed from a CUDA graph, and what the
// boundary between two such kernels costs: A (50 MB) then B (25 MB) against one 75 MB kernel, plain and with B a
// programmatic dependent that prefetches its bytes into L2 (cp.async.bulk.prefetch.L2) before griddepcontrol.wait.
// Build: nvcc -O3 -arch=sm_90a -o readramp readramp.cu; run: ./readramp (prints a table; no arguments).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

static __device__ __forceinline__ void fold(uint4 &a, uint4 v) { a.x ^= v.x; a.y += v.y; a.z ^= v.z; a.w += v.w; }

// every thread reads 16-byte vectors strided by the grid, U of them in flight; `tbl` adds a dependent load first
template <int U, bool PDL>
__global__ void rd(const uint4 *__restrict__ p, size_t n16, const int *__restrict__ tbl, unsigned *out) {
    if (PDL) {
        // prefetch this block's share into L2 before the wait (addresses do not depend on the kernel ahead)
        const size_t per = (n16 + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per;
        const size_t b1 = b0 + per < n16 ? b0 + per : n16;
        for (size_t c = b0 + (size_t)threadIdx.x * 256; c < b1; c += (size_t)blockDim.x * 256) {
            const size_t m = (b1 - c < 256 ? b1 - c : 256) * 16;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + c), "r"((unsigned)m) : "memory");
        }
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    asm volatile("griddepcontrol.launch_dependents;");
    const size_t off = tbl ? (size_t)__ldg(tbl) : 0;
    uint4 acc = make_uint4(0, 0, 0, 0);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = off + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (PDL) {  // read the block's own share, as it was prefetched
        const size_t per = (n16 + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per;
        const size_t b1 = b0 + per < n16 ? b0 + per : n16;
        for (size_t c = b0 + threadIdx.x; c < b1; c += blockDim.x) fold(acc, __ldg(p + c));
    } else {
        for (; i + (U - 1) * stride < n16; i += U * stride) {
            uint4 v[U];
#pragma unroll
            for (int u = 0; u < U; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
            for (int u = 0; u < U; ++u) fold(acc, v[u]);
        }
        for (; i < n16; i += stride) fold(acc, __ldg(p + i));
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) out[0] = acc.x;   // keeps the loads
}

__global__ void flush(uint4 *q, size_t n16, unsigned s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x)
        q[i] = make_uint4(s, s, s, s);
}

static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t MB = 1 << 20, big = 1024 * MB, fl = 256 * MB;
    uint4 *buf, *fbuf;
    unsigned *out;
    int *tbl;
    CK(cudaMalloc(&buf, big));
    CK(cudaMalloc(&fbuf, fl));
    CK(cudaMalloc(&out, 16));
    CK(cudaMalloc(&tbl, 16));
    CK(cudaMemset(buf, 1, big));
    CK(cudaMemset(tbl, 0, 16));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 25;
    // FLUSH=read: after the write, read a second 256 MiB so the L2 ends full of clean lines (what a decode step
    // leaves: weights and KV cache read, little written); default: the write alone (L2 full of dirty lines)
    const bool rflush = getenv("FLUSH") && getenv("FLUSH")[0] == 'r';
    auto doflush = [&](int r) {
        flush<<<sms * 4, 512, 0, st>>>(fbuf, fl / 16, r);
        if (rflush) rd<4, false><<<sms * 4, 512, 0, st>>>(buf + big / 32, fl / 16, nullptr, out);
    };
    // the copy ceiling as moe_bench measures it: a 1 GiB device-to-device copy
    std::vector<float> t;
    for (int r = 0; r < 10; ++r) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(buf, buf + big / 32, big / 2, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    const double copy = 2.0 * (big / 2) / (median(t) * 1e-3) / 1e9;
    printf("readramp on %s, %d SMs, L2 %d MB; copy (512 MiB d2d) %.0f GB/s; L2 flush: %s\n", prop.name, sms,
           prop.l2CacheSize >> 20, copy, rflush ? "write 256 MiB, then read another 256 MiB (clean lines)" : "write 256 MiB");
    printf("%-34s %8s %10s %10s %8s\n", "kernel", "MB", "us", "GB/s", "x copy");
    struct Cfg { const char *name; int blocks, threads; bool tb; };
    const Cfg cfgs[] = {{"rd 2x512/SM U4", 2, 512, false}, {"rd 4x256/SM U4", 4, 256, false},
                        {"rd 8x256/SM U4", 8, 256, false}, {"rd 2x512/SM U4 +table load", 2, 512, true}};
    const int sizes[] = {4, 8, 16, 25, 32, 50, 64, 100, 200, 512};
    for (const Cfg &c : cfgs)
        for (int s : sizes) {
            for (int graph = 0; graph < 2; ++graph) {
                if (graph && s != 25 && s != 50 && s != 100) continue;
                const size_t n16 = (size_t)s * MB / 16;
                cudaGraphExec_t ge = nullptr;
                if (graph) {
                    cudaGraph_t g;
                    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                    rd<4, false><<<sms * c.blocks, c.threads, 0, st>>>(buf, n16, c.tb ? tbl : nullptr, out);
                    CK(cudaStreamEndCapture(st, &g));
                    CK(cudaGraphInstantiate(&ge, g, 0));
                }
                t.clear();
                for (int r = 0; r < reps; ++r) {
                    doflush(r);
                    CK(cudaEventRecord(e0, st));
                    if (graph) CK(cudaGraphLaunch(ge, st));
                    else rd<4, false><<<sms * c.blocks, c.threads, 0, st>>>(buf, n16, c.tb ? tbl : nullptr, out);
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    t.push_back(ms);
                }
                const double us = median(t) * 1e3, gbs = s * (double)MB / (us * 1e-6) / 1e9;
                printf("%-28s %5s %8d %10.2f %10.0f %8.3f\n", c.name, graph ? "graph" : "eager", s, us, gbs, gbs / copy);
                fflush(stdout);
            }
        }
    // the boundary: A (50 MB) then B (25 MB), in one graph, against one 75 MB kernel; B plain or a programmatic
    // dependent prefetching its bytes into L2 before its wait
    for (int mode = 0; mode < 3; ++mode) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        const size_t nA = 50 * MB / 16, nB = 25 * MB / 16;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        if (mode == 0) {
            rd<4, false><<<sms * 2, 512, 0, st>>>(buf, nA + nB, nullptr, out);
        } else {
            rd<4, false><<<sms * 2, 512, 0, st>>>(buf, nA, nullptr, out);
            if (mode == 1) {
                rd<4, false><<<sms * 2, 512, 0, st>>>(buf + nA, nB, nullptr, out);
            } else {
                cudaLaunchConfig_t lc = {};
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                lc.gridDim = dim3(sms * 2);
                lc.blockDim = dim3(512);
                lc.stream = st;
                lc.attrs = at;
                lc.numAttrs = 1;
                CK(cudaLaunchKernelEx(&lc, rd<4, true>, (const uint4 *)(buf + nA), nB, (const int *)nullptr, out));
            }
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        t.clear();
        for (int r = 0; r < reps; ++r) {
            doflush(r);
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms);
        }
        const double us = median(t) * 1e3, gbs = 75.0 * MB / (us * 1e-6) / 1e9;
        const char *nm[] = {"one 75 MB kernel", "A 50 MB then B 25 MB", "A then B (PDL, L2 prefetch)"};
        printf("%-28s %5s %8d %10.2f %10.0f %8.3f\n", nm[mode], "graph", 75, us, gbs, gbs / copy);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
