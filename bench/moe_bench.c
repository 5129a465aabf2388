/* moe_bench.c — time every kernel and the whole layer on the GPU.
 *
 * usage: moe_bench SPEC [--tokens N]... [--iters N] [--cudnn auto|on|off|both] [--graph] [--backward]
 *                  [--templates DIR] [--flush write|clean|none]
 *
 * --templates DIR expands the kernels from DIR's templates instead of the
 * embedded ones (moe_options.templates_dir): a template change timed
 * against the build's own in one call, before it lands.
 * --cudnn sets moe_options.cudnn (default: $MOEGEN_CUDNN, else auto); both
 * times a plan with cuDNN off and one with it on, side by side on the same
 * inputs in this process (README, "cuDNN").
 *
 * Random inputs (never zeros); CUDA events around each kernel of a forward;
 * 5 warm-up forwards, then --iters timed ones (default 30), each preceded by
 * an L2 flush (--flush, below) that evicts the 50-60 MB L2; the median is
 * reported.
 * Ceilings are measured in the same run: a 2 GiB device-to-device copy
 * (bytes read + written) and a dense 8192^3 bf16 cuBLAS GEMM (cuBLAS is
 * loaded with dlopen by this program only). The floor of a kernel is
 * max(FLOP / GEMM rate, bytes / copy rate), bytes counting each input once
 * and each output once (the weights of the experts that got tokens). A
 * shared expert counts as what it runs as: m = shared.ffn/ffn more slots
 * every token visits (top_k + m rows per token, their weights read once)
 * and, gated, one more router column.
 *
 * --graph adds two rows per token count: the layer launched eagerly with no
 * per-kernel events ("eager"), and the layer captured once into a CUDA
 * graph and replayed ("graph"), as servers run decode steps; both with the
 * same L2 flush before each run. The graph's output is checked bit for bit
 * against the eager forward's (exit status 1 if they differ).
 *
 * --flush picks the L2 flush before each timed run (l2_flush; the flush
 * buffer is 768 MiB):
 *   clean (the default): a 256 MiB write of [0, 256 MiB), then the read
 *     kernel (read_ptx) over [256, 512 MiB): the write's dirty lines are
 *     written back during the untimed flush, and L2 ends full of clean
 *     lines, as a decode step leaves it (attention reads the KV cache and
 *     weights and writes little);
 *   write: a 512 MiB write of [0, 512 MiB), the only flush before --flush:
 *     L2 ends full of dirty lines, and the first ~50 MB the timed kernels
 *     read pay for their write-backs (on an H100 a 50 MB read-only kernel
 *     took 26.9 us after it against 20.3 us after clean;
 *     docs/perf/2026-12-06/readramp.cu), which dominates decode-sized
 *     layers;
 *   none (also --no-flush): no flush: what stays in L2 between runs (the
 *     router weights, the kernels' code, the tables) shows as the
 *     difference from the flushed figures.
 *
 * After the LAYER rows of each token count, a "weights read" row: the read
 * kernel alone over the layer floor's bytes (rounded up to 16), read from
 * [512, 768 MiB) of the flush buffer after the same flush as the layer,
 * CUDA events around its one launch, the median of --iters runs. It is
 * the device-copy ceiling at the layer's own size: what a kernel that only
 * streams the layer's bytes once takes from the flushed L2 (launch, DRAM
 * ramp and tail included), against the same floor (bytes at the copy
 * rate; its TFLOP/s is 0). Skipped when those bytes exceed 256 MiB; with
 * --cudnn both, printed once, after the second plan's rows.
 *
 * An fp8 spec (quant.weights = "fp8_e4m3") runs on random bf16 weights
 * quantized by moe_plan_pack_quantize_async; its GEMM floors take the fp8
 * rate as twice the measured bf16 rate (said in the output), and its bytes
 * one per weight and per e4m3 row element.
 *
 * --backward (a spec with training = true) times instead, per token count,
 * moe_forward (once for both rows: it does not depend on recompute_u; timed
 * twice and the second kept: in run 63 the first median at 16384 tokens
 * read 19-26 % slower than the second, which flattered the ratio), and
 * for recompute_u 0 and 1 moe_forward_train and moe_backward (each after the
 * flush; the backward after an untimed training forward), the backward's
 * ratio to the forward and its GEMM
 * TFLOP/s (twice the forward's GEMM FLOPs) against the dense rate, then the
 * median of each backward stage (moe_backward_timed: recomputed U, dys, the
 * four grouped GEMMs, bias gradients, the router's step), each GEMM's
 * TFLOP/s and its floor (FLOPs at the dense rate or its bytes once at the
 * copy bandwidth: operands, weights and the weight gradient written in the
 * plan's type, fp32 or the dtype), and its time over that floor. */
#define _POSIX_C_SOURCE 200809L
#include "driver.h"
#include "moe.h"
#include "moe_internal.h"
#include "cudnn.h"
#include "plan.h"
#include "ref.h"

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                 \
    do {                                                                                         \
        CUresult r_ = (call);                                                                    \
        if (r_ != CUDA_SUCCESS) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, moe_cu_error_string(r_)); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rs = 88172645463325252ULL;
static void fill(uint16_t *d, size_t n, float scale, moe_dtype_t dt) {
    /* a cheap generator: the benchmark needs non-zero, non-repeating data,
     * not statistical quality */
    for (size_t i = 0; i < n; i++) {
        rs ^= rs << 13;
        rs ^= rs >> 7;
        rs ^= rs << 17;
        d[i] = moe_float_to_half(((float)(rs >> 40) / 16777216.0f * 2.0f - 1.0f) * scale, dt);
    }
}

/* n random values on the device. One 32 Mi-element block of random data is
 * generated per dtype and scale and repeated (at a rotating offset) to fill
 * large tensors: far larger than L2, never zeros, and quick to set up. */
static CUdeviceptr upload_random(size_t n, float scale, moe_dtype_t dt) {
    size_t chunk = (size_t)1 << 25;
    size_t m0 = n < chunk ? n : chunk;
    uint16_t *h = malloc(m0 * 2);
    fill(h, m0, scale, dt);
    CUdeviceptr d;
    CK(moe_cu.cuMemAlloc(&d, n * 2));
    CK(moe_cu.cuMemcpyHtoD(d, h, m0 * 2));
    for (size_t off = m0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        size_t shift = (off / chunk * 7919) % (m0 - m + 1);
        CK(moe_cu.cuMemcpyDtoDAsync(d + off * 2, d + shift * 2, m * 2, NULL));
    }
    CK(moe_cu.cuCtxSynchronize());
    free(h);
    return d;
}

/* ---- ceilings ----------------------------------------------------------- */

static double measure_copy_gbs(CUstream st, CUevent a, CUevent b) {
    size_t bytes = (size_t)2 << 30;
    CUdeviceptr src, dst;
    CK(moe_cu.cuMemAlloc(&src, bytes));
    CK(moe_cu.cuMemAlloc(&dst, bytes));
    CK(moe_cu.cuMemsetD8(src, 0x5a, bytes));
    float t[10];
    for (int i = 0; i < 13; i++) {
        CK(moe_cu.cuEventRecord(a, st));
        CK(moe_cu.cuMemcpyDtoDAsync(dst, src, bytes, st));
        CK(moe_cu.cuEventRecord(b, st));
        CK(moe_cu.cuEventSynchronize(b));
        if (i >= 3)
            CK(moe_cu.cuEventElapsedTime(&t[i - 3], a, b));
    }
    moe_cu.cuMemFree(src);
    moe_cu.cuMemFree(dst);
    return 2.0 * bytes / (median(t, 10) * 1e-3) / 1e9;
}

typedef int (*cublas_create_t)(void **);
typedef int (*cublas_destroy_t)(void *);
typedef int (*cublas_set_stream_t)(void *, CUstream);
typedef int (*cublas_gemm_ex_t)(void *, int, int, int, int, int, const void *, const void *, int, int,
                                const void *, int, int, const void *, void *, int, int, int, int);

/* Dense bf16 GEMM rate through cuBLAS, TFLOP/s; 0 when cuBLAS is absent. */
static double measure_gemm_tflops(CUstream st, CUevent a, CUevent b, char *why, size_t nwhy) {
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *h = NULL;
    for (size_t i = 0; i < 3 && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, nwhy, "no cuBLAS: %s", dlerror());
        return 0;
    }
    cublas_create_t create = (cublas_create_t)dlsym(h, "cublasCreate_v2");
    cublas_destroy_t destroy = (cublas_destroy_t)dlsym(h, "cublasDestroy_v2");
    cublas_set_stream_t set_stream = (cublas_set_stream_t)dlsym(h, "cublasSetStream_v2");
    cublas_gemm_ex_t gemm = (cublas_gemm_ex_t)dlsym(h, "cublasGemmEx");
    void *handle = NULL;
    if (!create || !gemm || !set_stream || create(&handle) != 0) {
        snprintf(why, nwhy, "cuBLAS did not initialize");
        return 0;
    }
    set_stream(handle, st);
    const int n = 8192;
    CUdeviceptr A = upload_random((size_t)n * n, 1.0f, MOE_DTYPE_BF16);
    CUdeviceptr B = upload_random((size_t)n * n, 1.0f, MOE_DTYPE_BF16);
    CUdeviceptr C;
    CK(moe_cu.cuMemAlloc(&C, (size_t)n * n * 2));
    float one = 1.0f, zero = 0.0f, t[10];
    /* CUBLAS_OP_T = 1, CUBLAS_OP_N = 0; CUDA_R_16BF = 14; CUBLAS_COMPUTE_32F = 68; default algo = -1 */
    int bad = 0;
    for (int i = 0; i < 13 && !bad; i++) {
        CK(moe_cu.cuEventRecord(a, st));
        bad = gemm(handle, 1, 0, n, n, n, &one, (void *)A, 14, n, (void *)B, 14, n, &zero, (void *)C, 14, n, 68, -1);
        CK(moe_cu.cuEventRecord(b, st));
        CK(moe_cu.cuEventSynchronize(b));
        if (i >= 3)
            CK(moe_cu.cuEventElapsedTime(&t[i - 3], a, b));
    }
    destroy(handle);
    moe_cu.cuMemFree(A);
    moe_cu.cuMemFree(B);
    moe_cu.cuMemFree(C);
    if (bad) {
        snprintf(why, nwhy, "cublasGemmEx failed (%d)", bad);
        return 0;
    }
    return 2.0 * n * n * (double)n / (median(t, 10) * 1e-3) / 1e12;
}

/* ---- the L2 flush and the read kernel ----------------------------------- */

/* The read kernel: n16 16-byte vectors from src, grid-stride, four loads
 * in flight per thread (i, i+s, i+2s, i+3s), then a tail; every word is
 * xor-folded into one register, stored to out only when the fold equals
 * 0x9e3779b9, so the loads stay. PTX for sm_70 up, JIT-compiled by the
 * driver (cuModuleLoadData). */
static const char read_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry moe_bench_read(.param .u64 src, .param .u64 n16, .param .u64 out)\n"
    "{\n"
    "    .reg .pred %p<4>;\n"
    "    .reg .b32 %r<24>;\n"
    "    .reg .b64 %rd<16>;\n"
    "\n"
    "    ld.param.u64 %rd1, [src];\n"
    "    ld.param.u64 %rd2, [n16];\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    mov.u32 %r1, %ctaid.x;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mov.u32 %r3, %tid.x;\n"
    "    mov.u32 %r4, %nctaid.x;\n"
    "    mul.wide.u32 %rd3, %r1, %r2;\n"    /* i = block * blockDim + thread */
    "    cvt.u64.u32 %rd4, %r3;\n"
    "    add.u64 %rd3, %rd3, %rd4;\n"
    "    mul.wide.u32 %rd4, %r4, %r2;\n"    /* s, the grid stride in vectors */
    "    shl.b64 %rd5, %rd4, 4;\n"          /* s in bytes */
    "    mul.lo.u64 %rd6, %rd4, 3;\n"       /* 3s */
    "    shl.b64 %rd7, %rd4, 2;\n"          /* 4s */
    "    mov.b32 %r5, 0;\n"                 /* the fold */
    "LOOP4:\n"
    "    add.u64 %rd8, %rd3, %rd6;\n"
    "    setp.ge.u64 %p1, %rd8, %rd2;\n"    /* i + 3s >= n16: to the tail */
    "    @%p1 bra TAIL;\n"
    "    shl.b64 %rd9, %rd3, 4;\n"
    "    add.u64 %rd9, %rd1, %rd9;\n"
    "    add.u64 %rd10, %rd9, %rd5;\n"
    "    add.u64 %rd11, %rd10, %rd5;\n"
    "    add.u64 %rd12, %rd11, %rd5;\n"
    "    ld.global.nc.v4.u32 {%r6, %r7, %r8, %r9}, [%rd9];\n"
    "    ld.global.nc.v4.u32 {%r10, %r11, %r12, %r13}, [%rd10];\n"
    "    ld.global.nc.v4.u32 {%r14, %r15, %r16, %r17}, [%rd11];\n"
    "    ld.global.nc.v4.u32 {%r18, %r19, %r20, %r21}, [%rd12];\n"
    "    xor.b32 %r5, %r5, %r6;\n"
    "    xor.b32 %r5, %r5, %r7;\n"
    "    xor.b32 %r5, %r5, %r8;\n"
    "    xor.b32 %r5, %r5, %r9;\n"
    "    xor.b32 %r5, %r5, %r10;\n"
    "    xor.b32 %r5, %r5, %r11;\n"
    "    xor.b32 %r5, %r5, %r12;\n"
    "    xor.b32 %r5, %r5, %r13;\n"
    "    xor.b32 %r5, %r5, %r14;\n"
    "    xor.b32 %r5, %r5, %r15;\n"
    "    xor.b32 %r5, %r5, %r16;\n"
    "    xor.b32 %r5, %r5, %r17;\n"
    "    xor.b32 %r5, %r5, %r18;\n"
    "    xor.b32 %r5, %r5, %r19;\n"
    "    xor.b32 %r5, %r5, %r20;\n"
    "    xor.b32 %r5, %r5, %r21;\n"
    "    add.u64 %rd3, %rd3, %rd7;\n"
    "    bra.uni LOOP4;\n"
    "TAIL:\n"
    "    setp.ge.u64 %p2, %rd3, %rd2;\n"
    "    @%p2 bra DONE;\n"
    "    shl.b64 %rd9, %rd3, 4;\n"
    "    add.u64 %rd9, %rd1, %rd9;\n"
    "    ld.global.nc.v4.u32 {%r6, %r7, %r8, %r9}, [%rd9];\n"
    "    xor.b32 %r5, %r5, %r6;\n"
    "    xor.b32 %r5, %r5, %r7;\n"
    "    xor.b32 %r5, %r5, %r8;\n"
    "    xor.b32 %r5, %r5, %r9;\n"
    "    add.u64 %rd3, %rd3, %rd4;\n"
    "    bra.uni TAIL;\n"
    "DONE:\n"
    "    setp.ne.u32 %p3, %r5, 0x9e3779b9;\n"
    "    @%p3 bra END;\n"
    "    ld.param.u64 %rd13, [out];\n"
    "    cvta.to.global.u64 %rd13, %rd13;\n"
    "    st.global.u32 [%rd13], %r5;\n"
    "END:\n"
    "    ret;\n"
    "}\n";

#define FLUSH_REGION ((size_t)256 << 20)

typedef enum { FLUSH_NONE, FLUSH_WRITE, FLUSH_CLEAN } flush_mode_t;
static const char *const flush_modes[] = {"none", "write", "clean"};

/* The flush buffer, 3 regions of FLUSH_REGION: [0, 1) written by clean
 * ([0, 2) by write), [1, 2) read by clean, [2, 3) read by the "weights
 * read" row; and the read kernel, launched with `grid` blocks of 512. */
typedef struct {
    flush_mode_t mode;
    CUdeviceptr buf;
    CUfunction read;
    unsigned grid;
} flush_t;

/* Allocates the buffer (set to 0x5a) and loads the read kernel, in the
 * current context; exits when the driver refuses. */
static void flush_init(flush_t *fl, flush_mode_t mode, CUdevice dev) {
    CUmodule mod; /* kept for the process's life */
    int sms = 0;
    fl->mode = mode;
    CK(moe_cu.cuModuleLoadData(&mod, read_ptx));
    CK(moe_cu.cuModuleGetFunction(&fl->read, mod, "moe_bench_read"));
    if (moe_cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || sms < 1)
        sms = 132;
    fl->grid = 4 * (unsigned)sms;
    CK(moe_cu.cuMemAlloc(&fl->buf, 3 * FLUSH_REGION));
    CK(moe_cu.cuMemsetD8(fl->buf, 0x5a, 3 * FLUSH_REGION));
}

/* The read kernel over n16 16-byte vectors at src, on st; its out word is
 * the buffer's first (written only if the fold hits the constant). */
static void read_launch(const flush_t *fl, CUdeviceptr src, uint64_t n16, CUstream st) {
    CUdeviceptr out = fl->buf;
    void *params[] = {&src, &n16, &out};
    CK(moe_cu.cuLaunchKernel(fl->read, fl->grid, 1, 1, 512, 1, 1, 0, st, params, NULL));
}

/* The L2 flush before each timed run (--flush; the header says what each
 * mode does), on st; `it` varies the written value. With none the router
 * weights, the kernels' code and the small tables stay in L2 between runs,
 * as they may between a server's layers, while the experts' weights still
 * stream from DRAM when they do not fit. */
static void l2_flush(const flush_t *fl, int it, CUstream st) {
    if (fl->mode == FLUSH_NONE)
        return;
    CK(moe_cu.cuMemsetD8Async(fl->buf, (unsigned char)it, (fl->mode == FLUSH_WRITE ? 2 : 1) * FLUSH_REGION, st));
    if (fl->mode == FLUSH_CLEAN)
        read_launch(fl, fl->buf + FLUSH_REGION, FLUSH_REGION / 16, st);
}

/* Median ms of `iters` launches of the read kernel over `bytes` (rounded
 * up to 16) of the buffer's third region, each after the L2 flush. */
static float time_read(const flush_t *fl, double bytes, CUstream st, CUevent ea, CUevent eb, int iters) {
    float *t = malloc(sizeof(float) * (size_t)iters), ms;
    const uint64_t n16 = (uint64_t)ceil(bytes / 16);
    for (int it = -5; it < iters; it++) {
        l2_flush(fl, it, st);
        CK(moe_cu.cuEventRecord(ea, st));
        read_launch(fl, fl->buf + 2 * FLUSH_REGION, n16, st);
        CK(moe_cu.cuEventRecord(eb, st));
        CK(moe_cu.cuStreamSynchronize(st));
        if (it >= 0)
            CK(moe_cu.cuEventElapsedTime(&t[it], ea, eb));
    }
    ms = median(t, iters);
    free(t);
    return ms;
}

/* ---- the layer ---------------------------------------------------------- */

static const char usage[] =
    "usage: moe_bench SPEC [--tokens N]... [--iters N] [--cudnn auto|on|off|both] [--graph] [--backward] "
    "[--templates DIR] [--flush write|clean|none] [--no-flush]\n";

/* Median time of `iters` runs of the layer, ms, each after an L2 flush:
 * eager moe_forward calls, or launches of the instantiated graph `ge` when
 * it is non-NULL. Returns a negative value when a forward fails. */
static float time_layer(const moe_plan *plan, const moe_forward_args *a, CUgraphExec ge, CUstream st, CUevent ea,
                        CUevent eb, const flush_t *fl, int iters) {
    float *t = malloc(sizeof(float) * (size_t)iters), ms;
    for (int it = -5; it < iters; it++) {
        l2_flush(fl, it, st);
        CK(moe_cu.cuEventRecord(ea, st));
        if (ge)
            CK(moe_cu.cuGraphLaunch(ge, st));
        else if (moe_forward(plan, a, st) != MOE_OK) {
            free(t);
            return -1;
        }
        CK(moe_cu.cuEventRecord(eb, st));
        CK(moe_cu.cuStreamSynchronize(st));
        if (it >= 0)
            CK(moe_cu.cuEventElapsedTime(&t[it], ea, eb));
    }
    ms = median(t, iters);
    free(t);
    return ms;
}

/* The layer captured from one moe_forward on st, instantiated; NULL (with
 * the reason on stderr) when the forward failed during capture. */
static CUgraphExec capture_layer(const moe_plan *plan, const moe_forward_args *a, CUstream st) {
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    CK(moe_cu.cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    moe_status s = moe_forward(plan, a, st);
    CK(moe_cu.cuStreamEndCapture(st, &g)); /* ends the capture whatever the forward did */
    if (s != MOE_OK) {
        fprintf(stderr, "moe_bench: forward under capture: %s\n", moe_last_error());
        if (g)
            moe_cu.cuGraphDestroy(g);
        return NULL;
    }
    CK(moe_cu.cuGraphInstantiateWithFlags(&ge, g, 0));
    CK(moe_cu.cuGraphDestroy(g));
    return ge;
}

/* ---- the backward (--backward; a spec with training = true) -------------- */

/* What one timed training step needs beyond the forward's arguments. */
typedef struct {
    moe_train_forward_args tf;
    moe_backward_args b;
} train_step_t;

/* Median ms of `iters` runs of what `which` names (0: moe_forward, 1:
 * moe_forward_train, 2: moe_backward after an untimed training forward),
 * each after an L2 flush; negative when a call fails. With stage_ms (which
 * 2) the backward runs as moe_backward_timed and stage_ms[k] gets the
 * median of its stage k in the same runs. */
static float time_train(const moe_plan *plan, train_step_t *ts, int which, CUstream st, CUevent ea, CUevent eb,
                        const flush_t *fl, int iters, float stage_ms[MOE_BWD_STAGES]) {
    float *t = malloc(sizeof(float) * (size_t)iters * (MOE_BWD_STAGES + 1)), ms = -1;
    CUevent ev[MOE_BWD_STAGES + 1];
    for (int i = 0; stage_ms && i <= MOE_BWD_STAGES; i++)
        CK(moe_cu.cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
    for (int it = -3; it < iters; it++) {
        if (which == 2 && moe_forward_train(plan, &ts->tf, st) != MOE_OK)
            goto out;
        l2_flush(fl, it, st);
        CK(moe_cu.cuEventRecord(ea, st));
        moe_status s = which == 0 ? moe_forward(plan, &ts->tf.fwd, st)
                       : which == 1 ? moe_forward_train(plan, &ts->tf, st)
                                    : moe_backward_timed(plan, &ts->b, st, stage_ms ? ev : NULL);
        if (s != MOE_OK)
            goto out;
        CK(moe_cu.cuEventRecord(eb, st));
        CK(moe_cu.cuStreamSynchronize(st));
        if (it >= 0)
            CK(moe_cu.cuEventElapsedTime(&t[it], ea, eb));
        for (int k = 0; stage_ms && it >= 0 && k < MOE_BWD_STAGES; k++)
            CK(moe_cu.cuEventElapsedTime(&t[(k + 1) * iters + it], ev[k], ev[k + 1]));
    }
    ms = median(t, iters);
    for (int k = 0; stage_ms && k < MOE_BWD_STAGES; k++)
        stage_ms[k] = median(t + (k + 1) * iters, iters);
out:
    for (int i = 0; stage_ms && i <= MOE_BWD_STAGES; i++)
        moe_cu.cuEventDestroy(ev[i]);
    free(t);
    return ms;
}

/* The forward, the training forward and the backward at each token count,
 * with recompute_u 0 and 1; FLOPs of the backward's GEMMs are twice the
 * forward's (dgrad and wgrad of each projection). Returns the exit status. */
static int bench_backward(const moe_plan *plan, const moe_forward_args *base, const int *tokens, int ntok,
                          CUstream st, CUevent ea, CUevent eb, const flush_t *fl, int iters, double gemm_tf,
                          double copy_gbs) {
    const moe_spec_t *sp = &moe_plan_desc(plan)->spec;
    const moe_dtype_t dt = sp->dtype;
    const size_t E = sp->experts, H = sp->hidden, F = sp->ffn, Tmax = sp->tokens, S = (size_t)moe_spec_slots(sp);
    /* sized for the larger of the two modes: recompute_u saves less but its
     * backward's workspace holds the recomputed U */
    size_t saved_bytes = 0, bws_bytes = 0;
    for (int rc = 0; rc < 2; rc++) {
        size_t sv = moe_plan_saved_size(plan, (int)Tmax, rc), bw = moe_plan_backward_workspace_size(plan, (int)Tmax, rc);
        saved_bytes = sv > saved_bytes ? sv : saved_bytes;
        bws_bytes = bw > bws_bytes ? bw : bws_bytes;
    }
    if (!saved_bytes || !bws_bytes) {
        fprintf(stderr, "moe_bench: --backward: %s is not a training plan (add training = true to the spec)\n",
                sp->name);
        return 2;
    }
    CUdeviceptr saved, bws, dy = upload_random(Tmax * H, 1.0f / sqrtf((float)Tmax), dt), dx, drw, dlb, dw1, db1, dw2,
                                     db2, dsg;
    CK(moe_cu.cuMemAlloc(&saved, saved_bytes));
    CK(moe_cu.cuMemAlloc(&bws, bws_bytes));
    CK(moe_cu.cuMemAlloc(&dx, Tmax * H * 2));
    CK(moe_cu.cuMemAlloc(&drw, (E + 1) * H * 4));
    CK(moe_cu.cuMemAlloc(&dlb, E * 4));
    CK(moe_cu.cuMemAlloc(&dw1, S * 2 * F * H * 4));
    CK(moe_cu.cuMemAlloc(&db1, S * 2 * F * 4));
    CK(moe_cu.cuMemAlloc(&dw2, S * H * F * 4));
    CK(moe_cu.cuMemAlloc(&db2, S * H * 4));
    CK(moe_cu.cuMemAlloc(&dsg, H * 4));
    const int gated = sp->shared.ffn && sp->shared.gate == MOE_SHARED_GATE_SIGMOID;
    printf("\nbackward: %s, weight gradients %s; forward, training forward, backward (recompute_u 0 / 1); each after "
           "an L2 flush\n", sp->name, sp->weight_grads == MOE_WGRADS_DTYPE ? moe_dtype_name(dt) : "fp32");
    moe_plan_info info = MOE_PLAN_INFO_INIT; /* the weight gradient's element bytes, for the wgrads' floors */
    const double w = (double)S * H * F,
                 gb = moe_plan_get_info(plan, &info) == MOE_OK ? (double)info.weight_grad_bytes : 4;
    if (info.backward_kernels[0]) /* their tiles: the tuning table's backward entries or the heuristics' */
        printf("backward gemms: %s, %s, %s, %s\n", info.backward_kernels[0], info.backward_kernels[1],
               info.backward_kernels[2], info.backward_kernels[3]);
    printf("%-7s %-9s %9s %9s %9s %9s %9s %9s\n", "tokens", "recompute", "fwd ms", "trainfwd", "bwd ms", "bwd/fwd",
           "bwd TF/s", "x dense");
    for (int i = 0; i < ntok; i++) {
        const int T = tokens[i];
        if (T < 1 || (size_t)T > Tmax)
            continue;
        float stage_ms[2][MOE_BWD_STAGES], fwd_ms = -1;
        for (int rc = 0; rc < 2; rc++) {
            train_step_t ts = {.tf = {.fwd = *base, .saved = (void *)saved, .recompute_u = rc}};
            ts.tf.fwd.tokens = T;
            ts.b = (moe_backward_args){.tokens = T, .recompute_u = rc, .saved = (void *)saved, .x = base->x,
                                       .router_w = base->router_w, .w1p = base->w1p, .b1p = base->b1p,
                                       .w2 = base->w2, .b2 = base->b2, .dy = (void *)dy, .workspace = (void *)bws,
                                       .dx = (void *)dx, .d_router_w = (float *)drw,
                                       .d_logit_bias = sp->router.logit_bias ? (float *)dlb : NULL,
                                       .dw1p = (void *)dw1, .db1p = sp->ffn_bias ? (float *)db1 : NULL,
                                       .dw2 = (void *)dw2, .db2 = sp->ffn_bias ? (float *)db2 : NULL,
                                       .shared_gate = gated ? base->shared_gate : NULL,
                                       .d_shared_gate = gated ? (float *)dsg : NULL};
            float ms[3];
            for (int w = rc ? 1 : 0; w < 3; w++)   /* the forward: twice on the first row, the second kept */
                for (int rep = 0; rep < (w == 0 ? 2 : 1); rep++)
                    if ((ms[w] = time_train(plan, &ts, w, st, ea, eb, fl, iters,
                                            w == 2 ? stage_ms[rc] : NULL)) < 0) {
                        fprintf(stderr, "moe_bench: --backward, %d tokens: %s\n", T, moe_last_error());
                        return 1;
                    }
            if (rc == 0)
                fwd_ms = ms[0];
            ms[0] = fwd_ms;
            const double rows = (double)T * moe_spec_entries(sp), flop = 2 * (2.0 * rows * H * 2 * F + 2.0 * rows * F * H);
            const double tf = flop / (ms[2] * 1e-3) / 1e12;
            printf("%-7d %-9d %9.4f %9.4f %9.4f %9.2f %9.1f %9.2f\n", T, rc, ms[0], ms[1], ms[2], ms[2] / ms[0], tf,
                   gemm_tf > 0 ? tf / gemm_tf : 0);
        }
        /* where the backward's time goes: each stage's median (events between stages), and each GEMM's floor:
         * its FLOPs at the dense rate or its bytes once at the copy bandwidth, whichever is longer (every slot's
         * weights taken as touched; a wgrad writes its gradient in the plan's type, so fp32 gradients can make
         * it bound by the write) */
        printf("%-7s %-12s %9s %9s %9s %9s %7s   (stage ms, recompute_u 0 / 1; a GEMM's TFLOP/s and floor at "
               "recompute_u 0)\n", "", "stage", "ms", "ms", "TF/s", "floor ms", "x floor");
        const double rows = (double)T * moe_spec_entries(sp), g = 2.0 * rows * H * F; /* a down-sized GEMM */
        /* stages 2 .. 5, FLOPs and bytes: dgrad_down (H·F a row) reads dY rows, W2, U and writes dU; dgrad_up
         * (2F·H) reads dU, W1 and writes dX rows; wgrad_up (2F·H) reads dU and the x rows and writes dW1;
         * wgrad_down (H·F) reads dY rows and A and writes dW2 */
        const double gemm_flop[MOE_BWD_STAGES] = {[2] = g, [3] = 2 * g, [4] = 2 * g, [5] = g};
        const double gemm_bytes[MOE_BWD_STAGES] = {[2] = 2 * (rows * H + w + 4 * rows * F),
                                                   [3] = 2 * (2 * rows * F + 2 * w + rows * H),
                                                   [4] = 2 * (2 * rows * F + rows * H) + gb * 2 * w,
                                                   [5] = 2 * (rows * H + rows * F) + gb * w};
        for (int k = 0; k < MOE_BWD_STAGES; k++) {
            const double f = gemm_flop[k];
            printf("%-7d %-12s %9.4f %9.4f", T, moe_bwd_stage_names[k], stage_ms[0][k], stage_ms[1][k]);
            if (f > 0 && stage_ms[0][k] > 0) {
                const double floor_ms = 1e3 * fmax(gemm_tf > 0 ? f / (gemm_tf * 1e12) : 0,
                                                   copy_gbs > 0 ? gemm_bytes[k] / (copy_gbs * 1e9) : 0);
                printf(" %9.1f %9.4f %7.2f", f / (stage_ms[0][k] * 1e-3) / 1e12, floor_ms,
                       floor_ms > 0 ? stage_ms[0][k] / floor_ms : 0);
            }
            printf("\n");
        }
    }
    CUdeviceptr all[] = {saved, bws, dy, dx, drw, dlb, dw1, db1, dw2, db2, dsg};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        moe_cu.cuMemFree(all[i]);
    return 0;
}

int main(int argc, char **argv) {
    const char *spec_path = NULL;
    int tokens[16], ntok = 0, iters = 30;
    int modes[2] = {MOE_CUDNN_DEFAULT}, nplans = 1, graph = 0, backward = 0;
    flush_mode_t flush_mode = FLUSH_CLEAN;
    const char *templates_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--graph") == 0)
            graph = 1;
        else if (strcmp(argv[i], "--backward") == 0)
            backward = 1;
        else if (strcmp(argv[i], "--no-flush") == 0)
            flush_mode = FLUSH_NONE;
        else if (strcmp(argv[i], "--flush") == 0 && i + 1 < argc) {
            const char *m = argv[++i];
            int f = 0;
            while (f < 3 && strcmp(m, flush_modes[f]) != 0)
                f++;
            if (f == 3) {
                fprintf(stderr, "moe_bench: --flush %s: expected write, clean or none\n%s", m, usage);
                return 2;
            }
            flush_mode = (flush_mode_t)f;
        }
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc && ntok < 16)
            tokens[ntok++] = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (strcmp(argv[i], "--templates") == 0 && i + 1 < argc)
            templates_dir = argv[++i];
        else if (strcmp(argv[i], "--cudnn") == 0 && i + 1 < argc) {
            const char *m = argv[++i];
            if (strcmp(m, "both") == 0) {
                modes[0] = MOE_CUDNN_OFF;
                modes[1] = MOE_CUDNN_ON;
                nplans = 2;
            } else if ((modes[0] = moe_cudnn_parse_mode(m)) < 0) {
                fprintf(stderr, "moe_bench: --cudnn %s: expected auto, on, off or both\n%s", m, usage);
                return 2;
            }
        } else if (argv[i][0] != '-' && !spec_path)
            spec_path = argv[i];
        else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    if (!spec_path || iters < 1) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    moe_plan *plans[2] = {NULL, NULL};
    for (int pi = 0; pi < nplans; pi++) {
        moe_options o = {.cudnn = modes[pi], .templates_dir = templates_dir};
        moe_status s = moe_plan_create(&plans[pi], spec_path, &o);
        if (s != MOE_OK) {
            fprintf(stderr, "moe_bench: %s: %s\n", moe_status_string(s), moe_last_error());
            return 1; /* nothing measured: a failure, also without a GPU */
        }
    }
    moe_plan *plan = plans[0];
    const moe_plan_desc_t *pd = moe_plan_desc(plan);
    const moe_spec_t *sp = &pd->spec;
    if (!ntok)
        tokens[ntok++] = sp->tokens < 4096 ? sp->tokens : 4096;
    CUstream st;
    CK(moe_cu.cuStreamCreate(&st, 0));
    CUevent ev[MOE_K_COUNT + 1], ea, eb;
    for (int i = 0; i <= MOE_K_COUNT; i++)
        CK(moe_cu.cuEventCreate(&ev[i], 0));
    CK(moe_cu.cuEventCreate(&ea, 0));
    CK(moe_cu.cuEventCreate(&eb, 0));

    char why[256] = "";
    double copy_gbs = measure_copy_gbs(st, ea, eb);
    double gemm_tf = measure_gemm_tflops(st, ea, eb, why, sizeof why);
    moe_plan_info info = MOE_PLAN_INFO_INIT;
    moe_plan_get_info(plan, &info);
    char devname[128] = "?";
    CUdevice dev = 0;
    if (moe_cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS)
        moe_cu.cuDeviceGetName(devname, sizeof devname, dev);
    printf("moe_bench %s (hash %s) on %s, kernels for %s\n", sp->name, sp->hash, devname, info.arch);
    if (templates_dir)
        printf("templates: %s (not the embedded ones)\n", templates_dir);
    printf("ceilings: device copy %.0f GB/s; dense bf16 cuBLAS 8192^3 %.0f TFLOP/s%s%s\n", copy_gbs, gemm_tf,
           why[0] ? " — " : "", why);
    printf("gemms: %s, %s\n", info.kernels[MOE_K_GEMM_UP], info.kernels[MOE_K_GEMM_DOWN]);
    printf("launch overlap (MOEGEN_PDL): %s\n", info.pdl == 2 ? "auto (the tuning table's, per call size below)"
                                                 : info.pdl ? "on" : "off (by MOEGEN_PDL, or no entry asks for it)");
    printf("gathered up GEMM (MOEGEN_GATHER): %s\n",
           info.gather == 2 ? "auto" : info.gather ? "on" : "off (by MOEGEN_GATHER, or not this spec or device)");
    if (info.pair_clusters)
        printf("CTA pairs (+mc): %d resident at once (their GEMMs' grid: %d CTAs at most)\n", info.pair_clusters,
               2 * info.pair_clusters);

    const moe_dtype_t dt = sp->dtype;
    const size_t H = sp->hidden, F = sp->ffn, Tmax = sp->tokens;
    /* the weight slots and entries per token, the shared expert's included */
    const size_t ES = (size_t)moe_spec_slots(sp), KE = (size_t)moe_spec_entries(sp);
    /* the router's rows, biases and scales: every scored expert (zero experts included, docs/DESIGN.md) */
    const size_t NS = (size_t)moe_spec_scored(sp);
    const int gated = sp->shared.ffn && sp->shared.gate == MOE_SHARED_GATE_SIGMOID;
    /* the router's width: router.hidden where it is set (router_x and router_w [., HR]: a latent MoE), else H */
    const size_t HR = (size_t)moe_spec_router_hidden(sp);
    CUdeviceptr x = upload_random(Tmax * H, 1.0f, dt), wr = upload_random(NS * HR, 4.0f / sqrtf((float)HR), dt);
    CUdeviceptr rx = HR != H ? upload_random(Tmax * HR, 1.0f, dt) : x; /* router.input = "separate": its rows */
    CUdeviceptr wg = gated ? upload_random(H, 2.0f / sqrtf((float)H), dt) : 0;
    CUdeviceptr w1p = upload_random(ES * 2 * F * H, 2.0f / sqrtf((float)H), dt);
    CUdeviceptr w2 = upload_random(ES * H * F, 2.0f / sqrtf((float)F), dt);
    CUdeviceptr b1p = upload_random(ES * 2 * F, 0.5f, dt), b2 = upload_random(ES * H, 0.5f, dt);
    /* fp8 weights (quant.weights = "fp8_e4m3"): the random bf16 weights quantized by the device pack into e4m3
     * and their scales, which the forward takes as w1p, w2, w1s and w2s */
    const int fp8 = moe_spec_fp8(sp);
    CUdeviceptr w1s = 0, w2s = 0;
    if (fp8) {
        const size_t B = MOE_FP8_BLOCK, blk = sp->quant.scaling == MOE_SCALING_BLOCK;
        const size_t n1s = ES * (blk ? (2 * F / B) * (H / B) : 2 * F), n2s = ES * (blk ? (H / B) * (F / B) : H);
        CUdeviceptr w1q, w2q;
        CK(moe_cu.cuMemAlloc(&w1q, ES * 2 * F * H));
        CK(moe_cu.cuMemAlloc(&w2q, ES * H * F));
        CK(moe_cu.cuMemAlloc(&w1s, n1s * 4));
        CK(moe_cu.cuMemAlloc(&w2s, n2s * 4));
        moe_pack_args pa1, pa2;
        if (moe_plan_pack_layout(plan, MOE_LAYOUT_W1_FUSED, (void *)w1p, NULL, 0, (int)ES, &pa1) != MOE_OK ||
            moe_plan_pack_layout(plan, MOE_LAYOUT_W2, (void *)w2, NULL, 0, (int)ES, &pa2) != MOE_OK ||
            moe_plan_pack_quantize_async(plan, &pa1, (void *)w1q, (float *)w1s, NULL) != MOE_OK ||
            moe_plan_pack_quantize_async(plan, &pa2, (void *)w2q, (float *)w2s, NULL) != MOE_OK) {
            fprintf(stderr, "moe_bench: the fp8 weights: %s\n", moe_last_error());
            return 1;
        }
        CK(moe_cu.cuCtxSynchronize());
        CK(moe_cu.cuMemFree(w1p));
        CK(moe_cu.cuMemFree(w2));
        w1p = w1q, w2 = w2q;
        printf("fp8: e4m3 weights with %s scales (quantized on the device); the floors take the fp8 GEMM rate as twice "
               "the dense bf16 rate measured above (not measured)\n", blk ? "128x128 block" : "per-channel");
    }
    /* bytes per weight element, and per element of the rows into the GEMMs and of the activation (e4m3 with fp8;
     * the fp32 scales, 1/128 of those bytes, are not counted) */
    const double wb = fp8 ? 1 : 2, ab = fp8 ? 1 : 2, mm_tf = fp8 ? 2 * gemm_tf : gemm_tf;
    CUdeviceptr bias, escale, y, ws, gids = 0, gwts = 0;
    if (sp->router.select == MOE_SELECT_GIVEN) { /* given routing: ids uniform over the experts, weights 1/k */
        const size_t n = Tmax * (size_t)sp->top_k;
        int *hi = malloc(n * sizeof(int));
        float *hw = malloc(n * sizeof(float));
        if (!hi || !hw) {
            fprintf(stderr, "moe_bench: out of memory\n");
            return 1;
        }
        uint64_t r = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            hi[i] = (int)((r >> 33) % (uint64_t)sp->experts);
            hw[i] = 1.0f / (float)sp->top_k;
        }
        CK(moe_cu.cuMemAlloc(&gids, n * sizeof(int)));
        CK(moe_cu.cuMemAlloc(&gwts, n * sizeof(float)));
        CK(moe_cu.cuMemcpyHtoD(gids, hi, n * sizeof(int)));
        CK(moe_cu.cuMemcpyHtoD(gwts, hw, n * sizeof(float)));
        free(hi), free(hw);
        printf("given routing: the caller's ids uniform over the experts%s\n",
               sp->router.score == MOE_SCORE_GIVEN ? ", weights 1/top_k (no router)" : "");
    }
    CK(moe_cu.cuMemAlloc(&bias, NS * 4));
    CK(moe_cu.cuMemsetD8(bias, 0, NS * 4)); /* fp32 zeros: a neutral bias */
    CK(moe_cu.cuMemAlloc(&escale, NS * 4));
    CK(moe_cu.cuMemsetD32Async(escale, 0x3f800000u, NS, NULL)); /* router.expert_scale: ones; router.input = "separate": x */
    CK(moe_cu.cuCtxSynchronize());
    CK(moe_cu.cuMemAlloc(&y, Tmax * H * 2));
    size_t ws_bytes = 0;
    for (int pi = 0; pi < nplans; pi++) {
        size_t b = moe_plan_workspace_size(plans[pi], (int)Tmax);
        ws_bytes = b > ws_bytes ? b : ws_bytes;
        printf("plan %d:", pi);
        for (int stage = 0; stage < MOE_STAGE_COUNT; stage++) {
            int at;
            const char *reason;
            moe_plan_stage_path(plans[pi], stage, &at, &reason);
            printf(" %s %s (%s);", stage == MOE_STAGE_UP ? "up" : "down", at == MOE_PATH_CUDNN ? "cuDNN" : "generated",
                   reason);
        }
        printf("\n");
    }
    CK(moe_cu.cuMemAlloc(&ws, ws_bytes));
    flush_t fl;
    flush_init(&fl, flush_mode, dev);
    static const char *const flush_says[] = {"none (--flush none)", "write (write 512 MiB: L2 left with dirty lines)",
                                             "clean (write 256 MiB, then read 256 MiB: L2 left with clean lines)"};
    printf("L2 flush before each run: %s\n", flush_says[flush_mode]);
    if (backward) {
        moe_forward_args a = {.x = (void *)x, .router_w = (void *)wr, .router_bias = (float *)bias,
                              .router_logit_bias = (float *)bias, .w1p = (void *)w1p, .b1p = (void *)b1p,
                              .w2 = (void *)w2, .b2 = (void *)b2, .y = (void *)y, .workspace = (void *)ws,
                              .shared_gate = (void *)wg};
        int rc = bench_backward(plan, &a, tokens, ntok, st, ea, eb, &fl, iters, gemm_tf, copy_gbs);
        for (int pi = 0; pi < nplans; pi++)
            moe_plan_destroy(plans[pi]);
        return rc;
    }
    static const char *const names[MOE_K_COUNT] = {"route", "permute_plan", "permute_scatter", "gemm_up_swiglu",
                                                   "gemm_down", "combine"};
    printf("\n%-7s %-16s %9s %9s %9s %9s %7s%s\n", "tokens", "kernel", "ms", "TFLOP/s", "GB/s", "floor ms", "x floor",
           nplans > 1 ? "  plan" : "");
    for (int tp = 0; tp < ntok * nplans; tp++) {
        int T = tokens[tp / nplans], pi = tp % nplans;
        plan = plans[pi];
        if (T < 1 || (size_t)T > Tmax) {
            fprintf(stderr, "moe_bench: --tokens %d is outside 1..%zu\n", T, Tmax);
            continue;
        }
        if (moe_plan_variant_count(plan) > 1) { /* the GEMM variant this size runs (docs/tuning.md) */
            const int v = moe_plan_variant_for(plan, T);
            int bucket = 0;
            const char *vu = "", *vd = "";
            moe_plan_variant(plan, v, &bucket, NULL, &vu, &vd);
            printf("gemms at %d tokens: %s, %s (variant %d, bucket %d)\n", T, vu, vd, v, bucket);
        }
        { /* the route path this size takes (moe_plan_route_fuse; MOEGEN_ROUTE_FUSE=off: always separate) */
            static const char *const paths[] = {"route, permute_plan, permute_scatter separate",
                                                "permute plan fused into route (permute_plan row: empty)",
                                                "permute plan and scatter fused into route (their rows: empty)"};
            const int rf = moe_plan_route_fuse(plan, T);
            printf("route at %d tokens: %s\n", T, rf >= 0 && rf <= 2 ? paths[rf] : "?");
            if (info.pdl == 2)
                printf("launch overlap at %d tokens: %s\n", T, moe_plan_pdl(plan, T) == 1 ? "on" : "off");
        }
        moe_forward_args a = {.tokens = T, .x = (void *)x, .router_w = (void *)wr, .router_bias = (float *)bias,
                              .router_logit_bias = (float *)bias, .w1p = (void *)w1p, .b1p = (void *)b1p,
                              .w2 = (void *)w2, .b2 = (void *)b2, .y = (void *)y, .workspace = (void *)ws,
                              .shared_gate = (void *)wg, .w1s = (const float *)w1s, .w2s = (const float *)w2s,
                              .topk_ids = (const int *)gids, .topk_weights = (const float *)gwts,
                              .router_x = (void *)rx, .router_expert_scale = (const float *)escale};
        if (moe_forward_gathers(plan, &a)) /* the gathered up GEMM (docs/DESIGN.md): no copy of x by the scatter */
            printf("up GEMM at %d tokens gathers x (permute_scatter writes the row maps only)\n", T);
        if (moe_forward_chains(plan, &a)) /* the chain (docs/DESIGN.md): gemm_up_swiglu's time is the three stages' */
            printf("the chain at %d tokens: the up GEMM's grid runs the down GEMM and the combine (their rows 0)\n", T);
        float *t[MOE_K_COUNT + 1];
        for (int k = 0; k <= MOE_K_COUNT; k++)
            t[k] = malloc(sizeof(float) * (size_t)iters);
        for (int it = -5; it < iters; it++) {
            l2_flush(&fl, it, st);
            if (moe_forward_timed(plan, &a, st, ev) != MOE_OK) {
                fprintf(stderr, "moe_bench: forward: %s\n", moe_last_error());
                return 1;
            }
            CK(moe_cu.cuStreamSynchronize(st));
            if (it < 0)
                continue;
            for (int k = 0; k < MOE_K_COUNT; k++)
                CK(moe_cu.cuEventElapsedTime(&t[k][it], ev[k], ev[k + 1]));
            CK(moe_cu.cuEventElapsedTime(&t[MOE_K_COUNT][it], ev[0], ev[MOE_K_COUNT]));
        }
        /* experts that receive tokens: all of them once T*K >> E; for small
         * T, read the counts back */
        int *counts = malloc(ES * sizeof(int));
        CK(moe_cu.cuMemcpyDtoH(counts, ws + pd->ws[MOE_WS_COUNTS].offset, ES * sizeof(int)));
        double active = 0, routed = 0; /* the shared expert's slots always are */
        for (size_t e = 0; e < ES; e++)
            active += counts[e] > 0, routed += counts[e];
        free(counts);
        double rows = (double)T * KE, EL = moe_spec_router_columns(sp); /* router columns: experts and the shared gate */
        const double gr = sp->zero_experts ? routed : rows; /* the GEMMs' rows: a zero expert's entries take none */
        double flop[MOE_K_COUNT + 1] = {2.0 * T * H * EL, 0, 0, 2.0 * gr * H * 2 * F, 2.0 * gr * F * H, 2.0 * rows * H};
        double bytes[MOE_K_COUNT + 1] = {
            2.0 * T * H + 2.0 * EL * H + 8.0 * rows,         /* x, router weights (and w_gate), topk out */
            8.0 * ES,                                       /* counts in, offsets out */
            2.0 * T * H + ab * rows * H + 8.0 * rows,       /* x in, gathered rows out */
            ab * gr * H + active * 2 * F * H * wb + ab * gr * F,
            ab * gr * F + active * H * F * wb + 2.0 * gr * H,
            2.0 * rows * H + 2.0 * T * H + 8.0 * rows};
        flop[MOE_K_COUNT] = flop[0] + flop[3] + flop[4] + flop[5];
        /* the layer's floor: x, all active weights and y, each once */
        bytes[MOE_K_COUNT] = 2.0 * T * H + 2.0 * EL * H + active * 3 * F * H * wb + 2.0 * T * H;
        float graph_ms[2] = {0, 0}; /* eager without events, graph replay */
        if (graph) {
            size_t ybytes = (size_t)T * H * 2;
            uint16_t *ye = malloc(ybytes), *yg = malloc(ybytes);
            graph_ms[0] = time_layer(plan, &a, NULL, st, ea, eb, &fl, iters);
            CK(moe_cu.cuMemcpyDtoH(ye, y, ybytes));
            CK(moe_cu.cuMemsetD8(y, 0xff, ybytes)); /* poisoned: the replay must write every value */
            CUgraphExec ge = capture_layer(plan, &a, st);
            if (graph_ms[0] < 0 || !ge) {
                fprintf(stderr, "moe_bench: forward: %s\n", moe_last_error());
                return 1;
            }
            graph_ms[1] = time_layer(plan, &a, ge, st, ea, eb, &fl, iters);
            CK(moe_cu.cuMemcpyDtoH(yg, y, ybytes));
            CK(moe_cu.cuGraphExecDestroy(ge));
            if (memcmp(ye, yg, ybytes) != 0) {
                fprintf(stderr, "moe_bench: %d tokens: the graph replay's output differs from the eager forward's\n", T);
                return 1;
            }
            free(ye);
            free(yg);
        }
        for (int k = 0; k <= MOE_K_COUNT + 2 * graph; k++) {
            int kk = k < MOE_K_COUNT ? k : MOE_K_COUNT; /* the layer rows share the layer's work */
            double ms = k <= MOE_K_COUNT ? median(t[k], iters) : graph_ms[k - MOE_K_COUNT - 1];
            const double rate = kk == 3 || kk == 4 ? mm_tf : gemm_tf; /* the expert GEMMs: fp8 with fp8 weights */
            double floor_ms = 1e3 * fmax(rate > 0 ? flop[kk] / (rate * 1e12) : 0, bytes[kk] / (copy_gbs * 1e9));
            static const char *const layer_rows[3] = {"LAYER", "LAYER eager", "LAYER graph"};
            printf("%-7d %-16s %9.4f %9.1f %9.0f %9.4f", T, k < MOE_K_COUNT ? names[k] : layer_rows[k - MOE_K_COUNT],
                   ms, flop[kk] / (ms * 1e-3) / 1e12, bytes[kk] / (ms * 1e-3) / 1e9, floor_ms);
            if (floor_ms > 0 && isfinite(floor_ms)) /* no floor (no work counted): "-", not inf */
                printf(" %7.2f", ms / floor_ms);
            else
                printf(" %7s", "-");
            if (nplans > 1)
                printf("  %s", moe_cudnn_mode_name(modes[pi]));
            printf("\n");
            if (k <= MOE_K_COUNT)
                free(t[k]);
        }
        if (pi == nplans - 1 && bytes[MOE_K_COUNT] <= (double)FLUSH_REGION) {
            /* the device-copy ceiling at the layer's size: the read kernel alone over the layer floor's bytes */
            const double rb = bytes[MOE_K_COUNT], ms = time_read(&fl, rb, st, ea, eb, iters);
            const double floor_ms = 1e3 * rb / (copy_gbs * 1e9);
            printf("%-7d %-16s %9.4f %9.1f %9.0f %9.4f %7.2f\n", T, "weights read", ms, 0.0, rb / (ms * 1e-3) / 1e9,
                   floor_ms, ms / floor_ms);
        }
    }
    for (int pi = 0; pi < nplans; pi++)
        moe_plan_destroy(plans[pi]);
    return 0;
}
