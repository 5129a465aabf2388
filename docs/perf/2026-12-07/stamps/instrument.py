#!/usr/bin/env python3
"""Stamp the route kernel of a vendored .cu (moegen emit's output) for a per-phase timeline.

instrument.py IN.cu OUT.cu [acqrel] [dnpf] [w2pf] [skips]: thread 0 of every route block records %globaltimer and clock64 at ten points
(entry, phase 1 done, split ticket taken, partials summed, phase 2 done, counts added, fused ticket, plan done,
scatter rows done, end) into moe_st[blockIdx.y][{0: ns, 1: clock}][point]; route_stamps_read() copies them out and
route_stamps_clear() zeroes them. With `acqrel` the route's __threadfence() calls become fence.acq_rel.gpu (the
release/acquire pattern the split and fused tickets need) instead of the sequentially consistent fence.
A measurement aid for docs/perf only: nothing here goes into the project's kernels."""
import re, sys

src = open(sys.argv[1]).read()
opts = sys.argv[3:]
acqrel = "acqrel" in opts
def route_span(s):
    """The route kernel's text in s: [start, end) from its declaration to its closing brace's line."""
    m = re.search(r'extern "C" __global__ void __launch_bounds__\(\d+\)\n\w+_route_\w+\(', s)
    return m.start(), s.index("\n}\n", m.start()) + 3

start, end = route_span(src)
k = src[start:end]

def put(pat, stamp, after=True, count=1):
    global k
    i = k.find(pat)
    assert i >= 0, pat
    j = i + len(pat) if after else i
    k = k[:j] + f"MOE_ST({stamp});" + k[j:]

put("unsigned char *smem = moe_route_smem;", 0)
put("    /* ---- split H", 1, after=False)
if "moe_cluster_sync();   // every block's partial logits" in k:   # 4c02183 on: the split as a cluster, or the ticket
    put("moe_cluster_sync();   // every block's partial logits are in its lsm, visible to the cluster", 2)
    put("== (int)gridDim.y - 1;\n            __syncthreads();", 2)
else:
    put("== (int)gridDim.y - 1;\n        __syncthreads();", 2)
put("    /* ---- phase 2", 3, after=False)
put("    __syncthreads();\n    for (int e = tid; e < E; e += THREADS)\n        if (s_count[e])", 4, after=False)
put("    /* ---- fused", 5, after=False)
put("if (!s_last_all)\n            return;", 6)
i = k.find("moe_plan_block<")
j = k.find(";", i) + 1
k = k[:j] + "MOE_ST(7);" + k[j:]
put("__syncthreads();   // row_of (global, s_row) and s_cur are complete, for the whole block\n", 8)
k = k[:-3] + "MOE_ST(9);\n}\n"
# one token's early x copy (5c805d2 on): the scatter returns after the row map; its end is stamped there too
if "if (tokens == 1)   // phase 2's idle" in k:
    put("        if (tokens == 1)   // phase 2's idle", 9, after=False)
# stamp 4 sits before the barrier: move it after (the barrier ends phase 2)
k = k.replace("MOE_ST(4);    __syncthreads();", "    __syncthreads();MOE_ST(4);")
if acqrel:
    n = k.count("__threadfence();")
    k = k.replace("__threadfence();", 'asm volatile("fence.acq_rel.gpu;" ::: "memory");')
    sys.stderr.write(f"acqrel: {n} fences\n")
head = r'''
__device__ const char *moe_pf_w2; __device__ int moe_pf_mode;
__device__ unsigned long long moe_st[64][2][10];
#define MOE_ST(i) do { if (threadIdx.x == 0) { unsigned long long t_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); \
    moe_st[blockIdx.y][0][i] = t_; moe_st[blockIdx.y][1][i] = clock64(); } } while (0)
'''
tail = r'''
#include <cuda_runtime.h>
extern "C" void route_stamps_read(unsigned long long *h) { cudaMemcpyFromSymbol(h, moe_st, sizeof moe_st); }
extern "C" void route_w2pf_set(const void *w2, int mode) {
    cudaMemcpyToSymbol(moe_pf_w2, &w2, sizeof w2); cudaMemcpyToSymbol(moe_pf_mode, &mode, sizeof mode);
}
extern "C" void route_stamps_clear(void) { static unsigned long long z[64 * 2 * 10]; cudaMemcpyToSymbol(moe_st, z, sizeof z); }
'''
if "dnpf" in opts:
    # the down gemv: before its griddepcontrol.wait, thread 0 asks L2 for the CTA's weight slice (BN rows of the
    # expert's w2, K halves each: contiguous) from the tile the route wrote (two kernels back, complete before the up
    # GEMM's wait returned); only a prefetch: the kernel's own loads are unchanged
    for mm in reversed(list(re.finditer(r'(\w+_gemm_down_\w+_gemv3?_\w+)\(const moe_half_t \*__restrict__ hbuf, const moe_half_t \*__restrict__ w2,', src))):
        name = mm.group(1)
        a = src.index("moe_pdl_begin();", mm.end())
        b = src.index("\n", src.index("using namespace", a)) + 1
        pf = ("using namespace " + name + "_impl;\n"
              "    if ((int)blockIdx.y < __ldcg(num_tiles) && threadIdx.x == 0) {\n"
              "        const int ex_ = __ldcg(&tiles[blockIdx.y].expert);\n"
              "        const moe_half_t *p_ = w2 + ((long long)ex_ * N + (long long)blockIdx.x * BN) * K;\n"
              "        asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"(p_), \"r\"((unsigned)(BN * K * 2)) : \"memory\");\n"
              "    }\n    moe_pdl_begin();\n")
        assert src[a:b].count("using namespace") == 1
        src = src[:a] + pf + src[b:]
        sys.stderr.write("dnpf: " + name + "\n")
if "w2pf" in opts:
    # every up gemv CTA asks L2 for its share of its expert's W2 ([E, H, F], the expert's H x F halves split evenly
    # over gridDim.x CTAs, 16-byte granules), at its start (moe_pf_mode 1) or after its rows (2), + 4: with an L2 evict_last policy; the down gemv then
    # finds the expert's weights in L2 where they fit (Qwen3 at 1 token: 8 x 3 MB). moe_pf_w2 from route_w2pf_set.
    for mm in reversed(list(re.finditer(r'(\w+_gemm_up_swiglu_\w+_gemv3?_\w+)\(const moe_half_t \*__restrict__ xs,', src))):
        a = src.index("const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;\n", mm.end())
        a = src.index("\n", a) + 1
        b = src.index("\n}\n", a) + 1
        pf = ("#define W2PF_(MODE) if ((moe_pf_mode & 3) == MODE && threadIdx.x == 0) { \\\n"
              "        const long long eb_ = (long long)K * NOUT * 2, sh_ = (eb_ / gridDim.x) & ~15ll; \\\n"
              "        const long long o_ = sh_ * blockIdx.x, n_ = blockIdx.x + 1 == gridDim.x ? eb_ - o_ : sh_; \\\n"
              "        if (moe_pf_mode & 4) { unsigned long long pol_; \\\n"
              "            asm volatile(\"createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\" : \"=l\"(pol_)); \\\n"
              "            asm volatile(\"cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\" :: \"l\"(moe_pf_w2 + eb_ * expert + o_), \"r\"((unsigned)n_), \"l\"(pol_) : \"memory\"); \\\n"
              "        } else \\\n"
              "        asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"(moe_pf_w2 + eb_ * expert + o_), \"r\"((unsigned)n_) : \"memory\"); }\n"
              "    W2PF_(1)\n")
        src = src[:a] + pf + src[a:b] + "    W2PF_(2)\n#undef W2PF_\n" + src[b:]
        sys.stderr.write("w2pf: " + mm.group(1) + "\n")
# the stamps' array and macro before every kernel (the file's includes come after them, with the host code)
start, end = route_span(src)   # again: the options above may have edited src
out = head + src[:start] + k + src[end:] + tail
if "skips" in opts:
    # bounds, not a forward: SKIP_ROUTE=1 launches no route kernel after the process's first call (the GEMMs run on the
    # first call's tables, still in the workspace: one token count a process), SKIP_COMBINE=1 no combine kernel (y not written); read by the host code at every call
    import re as _re
    n_r = len(_re.findall(r'\n    (\w+_launch\(dev, \w+_route_\w+,)', out))
    out = _re.sub(r'\n    (\w+_launch\(dev, \w+_route_\w+,)', r'\n    if (!getenv("SKIP_ROUTE") || moe_calls_++ == 0) \1', out)
    out = "static int moe_calls_ = 0;   /* SKIP_ROUTE: the first call routes (the tables the others reuse) */\n" + out
    n_c = out.count("    if (!combined)\n")
    out = out.replace("    if (!combined)\n", '    if (!combined && !getenv("SKIP_COMBINE"))\n')
    sys.stderr.write(f"skips: {n_r} route launch(es), {n_c} combine launch(es)\n")
    assert n_r >= 1 and n_c >= 1
open(sys.argv[2], "w").write(out)
