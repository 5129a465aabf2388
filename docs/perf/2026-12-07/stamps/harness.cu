// The route kernel's timeline at few tokens, through a vendored forward whose route is stamped by instrument.py.
// Build: nvcc -O2 -arch=sm_90a -DSPEC=qwen3_30b_a3b -I DIR harness.cu DIR/inst.cu -o h -lcuda
// Run:   ./h [runs] [tokens...]   (every run: L2 flushed, stamps cleared, one forward; medians over the runs)
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)
#include STR(SPEC.h)
extern "C" void route_stamps_read(unsigned long long *h);
extern "C" void route_stamps_clear(void);
extern "C" void route_w2pf_set(const void *w2, int mode);
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); return 1; } } while (0)

__global__ void fill(unsigned short *p, long long n, unsigned seed, float scale) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        float f = ((h & 0xffffff) / 16777216.f - 0.5f) * scale;
        p[i] = (unsigned short)(__float_as_uint(f) >> 16);
    }
}
__global__ void readall(const int4 *p, long long n, int *sink) {
    int4 a = make_int4(0, 0, 0, 0);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int4 v = p[i]; a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678) *sink = 1;
}
static double med(std::vector<double> v) { if (v.empty()) return -1; std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 30;
    std::vector<int> toks;
    for (int i = 2; i < argc; ++i) toks.push_back(atoi(argv[i]));
    if (toks.empty()) toks.push_back(1);
    const long long E = CAT(SPEC, _EXPERTS), H = CAT(SPEC, _HIDDEN), F = CAT(SPEC, _FFN), MT = 4096;
    unsigned short *x, *wr, *w1, *w2, *y; void *ws; int4 *fl; int *sink;
    const long long fln = 512ll << 20;
    CK(cudaMalloc(&x, MT * H * 2)); CK(cudaMalloc(&y, MT * H * 2)); CK(cudaMalloc(&wr, E * H * 2));
    CK(cudaMalloc(&w1, E * 2 * F * H * 2)); CK(cudaMalloc(&w2, E * H * F * 2));
    CK(cudaMalloc(&ws, CAT(SPEC, _WORKSPACE_BYTES))); CK(cudaMalloc(&fl, fln)); CK(cudaMalloc(&sink, 4));
    fill<<<1024, 256>>>(x, MT * H, 1, 2.f); fill<<<1024, 256>>>(wr, E * H, 2, 0.2f);
    fill<<<1024, 256>>>(w1, E * 2 * F * H, 3, 0.05f); fill<<<1024, 256>>>(w2, E * H * F, 4, 0.05f);
    CK(cudaDeviceSynchronize());
    CAT(SPEC, _args_t) a = {};
    /* PF_MODE (instrument.py w2pf): the up gemv asks L2 for its expert's W2, 1 at a CTA's start, 2 after its rows */
    const int pfm = getenv("PF_MODE") ? atoi(getenv("PF_MODE")) : 0;
    route_w2pf_set(w2, pfm);
    a.x = x; a.router_w = wr; a.w1p = w1; a.w2 = w2; a.y = y; a.workspace = ws;
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    int clk = 0; CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));
    printf("%s on %s (SM clock %d MHz), %d runs a size; up gemv W2 prefetch mode %d\n", STR(SPEC), prop.name,
           clk / 1000, runs, pfm);
    static unsigned long long st[64][2][10];
    const char *nm[10] = {"entry", "phase1", "ticket", "partsum", "phase2", "counts", "fticket", "plan", "rows", "end"};
    for (int T : toks) {
        a.tokens = T;
        for (int w = 0; w < 3; ++w) CK(CAT(SPEC, _forward)(&a, 0));
        CK(cudaDeviceSynchronize());
        std::vector<double> fwd, span, s0spread, lastlag, p1med, p1max, ticket_last, d[10], gtl[10], nblk;
        for (int r = 0; r < runs; ++r) {
            CK(cudaMemsetAsync(fl, r & 0xff, fln)); readall<<<1024, 512>>>(fl, fln / 16, sink);
            CK(cudaDeviceSynchronize());
            route_stamps_clear();
            CK(cudaEventRecord(e0)); CK(CAT(SPEC, _forward)(&a, 0)); CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
            float ms; cudaEventElapsedTime(&ms, e0, e1); fwd.push_back(ms * 1000);
            route_stamps_read(&st[0][0][0]);
            int Y = 0, last = -1;
            unsigned long long g0 = ~0ull, g1 = 0;
            std::vector<double> p1;
            for (int b = 0; b < 64; ++b) {
                if (!st[b][0][0]) continue;
                ++Y; g0 = std::min(g0, st[b][0][0]);
                p1.push_back((double)(st[b][1][1] - st[b][1][0]));
                if (st[b][0][3]) last = b;
            }
            if (last < 0) { printf("T %d run %d: no last block stamped\n", T, r); continue; }
            unsigned long long mx0 = 0;
            for (int b = 0; b < 64; ++b) if (st[b][0][0]) mx0 = std::max(mx0, st[b][0][0]);
            for (int i = 0; i < 10; ++i) if (st[last][0][i]) g1 = std::max(g1, st[last][0][i]);
            nblk.push_back(Y); span.push_back((double)(g1 - g0)); s0spread.push_back((double)(mx0 - g0));
            lastlag.push_back((double)(st[last][0][0] - g0));
            p1med.push_back(med(p1)); p1max.push_back(*std::max_element(p1.begin(), p1.end()));
            for (int i = 1; i < 10; ++i) {
                int j = i - 1;
                while (j > 0 && !st[last][1][j]) --j;
                if (st[last][1][i]) { d[i].push_back((double)(st[last][1][i] - st[last][1][j])); gtl[i].push_back((double)(st[last][0][i] - g0)); }
            }
        }
        printf("\ntokens %d: route blocks %.0f; forward (events, eager) %.1f us; route span (first entry to last block's "
               "last stamp, globaltimer) %.0f ns\n", T, med(nblk), med(fwd), med(span));
        printf("  entries spread over %.0f ns; the last block entered at +%.0f ns; phase 1 clock cycles: median block %.0f, "
               "slowest %.0f\n", med(s0spread), med(lastlag), med(p1med), med(p1max));
        printf("  the last block, step by step (cycles since the previous stamp; ns since the first entry):\n");
        for (int i = 1; i < 10; ++i)
            if (!d[i].empty()) printf("    %-8s %8.0f cycles   at +%7.0f ns   (%zu runs)\n", nm[i], med(d[i]), med(gtl[i]), d[i].size());
        /* the layer replayed from a CUDA graph captured at T, L2 flushed before each replay (outside the graph) */
        cudaStream_t sg; CK(cudaStreamCreateWithFlags(&sg, cudaStreamNonBlocking));
        cudaGraph_t gr; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(sg, cudaStreamCaptureModeGlobal));
        CK(CAT(SPEC, _forward)(&a, sg));
        CK(cudaStreamEndCapture(sg, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, sg));
        std::vector<double> gt, et;
        for (int r = 0; r < runs; ++r) {
            CK(cudaMemsetAsync(fl, r & 0xff, fln, sg)); readall<<<1024, 512, 0, sg>>>(fl, fln / 16, sink);
            CK(cudaEventRecord(e0, sg)); CK(cudaGraphLaunch(ge, sg)); CK(cudaEventRecord(e1, sg));
            CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1); gt.push_back(ms * 1000);
            CK(cudaMemsetAsync(fl, r & 0xff, fln, sg)); readall<<<1024, 512, 0, sg>>>(fl, fln / 16, sink);
            CK(cudaEventRecord(e0, sg)); CK(CAT(SPEC, _forward)(&a, sg)); CK(cudaEventRecord(e1, sg));
            CK(cudaEventSynchronize(e1));
            cudaEventElapsedTime(&ms, e0, e1); et.push_back(ms * 1000);
        }
        printf("  layer: graph replay %.2f us, eager %.2f us (medians of %d, L2 flushed; MOEGEN_PDL=%s)\n", med(gt), med(et),
               runs, getenv("MOEGEN_PDL") ? getenv("MOEGEN_PDL") : "unset");
        CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(gr)); CK(cudaStreamDestroy(sg));
    }
    return 0;
}
