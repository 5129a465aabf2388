/* test_scatter_host.c — the permute_scatter kernel (templates/permute.lua)
 * run on the CPU: for each case a spec is planned and emitted, the plan
 * kernel's namespace (the scatter's constants) and the scatter kernel are
 * cut out of the source and built with the host C++ compiler into
 * tests/scatter_host.cc (the CUDA subset they use emulated by
 * tests/support/cuda_host.h), which runs it on random routing and checks
 * the row map and the rows. So the zero experts' path (docs/DESIGN.md, "Zero
 * experts": a zero entry's row offsets[E] + t holding x[t], stored once per
 * token) is checked where there is no GPU, beside the plain scatter;
 * test_gpu checks both on one. And the fp8 weights' quantizing scatter
 * (a block per token: its rows' 128-column blocks quantized once, stored
 * to the token's K rows), each row against runtime/fp8.c's rule byte for
 * byte (test_quant_gpu checks it on a GPU). Skipped without a C++17 compiler with
 * <ucontext.h> (c++, or $CXX). Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include "gen_fixture.h"


static const host_case_t cases[] = {
    {"zero experts: 48 routed + 24 zero, top-6, H 264 (33 vectors a row); a token, a partial and whole blocks",
     "tests/specs/zero_experts.moe", {1, 7, 40}, 3},
    {"zero experts as LongCat-Flash's share: 64 + 32, top-12, fp16",
     "name = 'lc' experts = 64 zero_experts = 32 top_k = 12 hidden = 128 ffn = 64 tokens = 64 dtype = 'fp16' "
     "router = { bias = true, renormalize = false, scale = 6 }\n", {3, 33}, 2},
    {"no zero experts: the plain scatter, top-2; and maps only (the gathered up GEMM's: moe_spec_gather)",
     "name = 'plain' experts = 8 top_k = 2 hidden = 72 ffn = 40 tokens = 64\n", {1, 17}, 2},
    {"router.apply = \"input\": the rows scaled, no maps-only mode", "name = 'inp' experts = 8 top_k = 2 hidden = 72 "
     "ffn = 40 tokens = 64 router = { apply = 'input' }\n", {1, 17}, 2},
    {"fp8 weights: the quantizing scatter (a block per token), top-4, H 384 (three 128-column blocks: a pair and a "
     "half pair)", "name = 'q8' experts = 16 top_k = 4 hidden = 384 ffn = 128 tokens = 64 "
     "quant = { weights = 'fp8_e4m3' } arch = { 'sm_90a' }\n", {1, 9}, 2},
    {"fp8 weights, router.apply = \"input\": x·w quantized per entry, top-2, H 512",
     "name = 'q8i' experts = 8 top_k = 2 hidden = 512 ffn = 128 tokens = 64 router = { apply = 'input' } "
     "quant = { weights = 'fp8_e4m3', scaling = 'channel' } arch = { 'sm_90a' }\n", {1, 5}, 2},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

static void run_case(const host_case_t *c, const char *cxx) {
    CASE(c->label);
    if (!check_counts()) /* left out by MOEGEN_TEST_CASE: not built or run */
        return;
    moe_spec_t s;
    moe_diag_t d;
    moe_plan_desc_t pd;
    if (host_case_plan(c->spec, NULL, 0, NULL, &s, &pd))
        return;
    const moe_kernel_desc_t *plan = &moe_plan_kernels(&pd, s.arch[0])[MOE_K_PERMUTE_PLAN],
                            *sc = &moe_plan_kernels(&pd, s.arch[0])[MOE_K_PERMUTE_SCATTER];
    moe_buf_t src = {0}, inc = {0};
    if (moe_emit_source(&pd, NULL, &src, &d)) {
        CHECKF(0, "%s", d.msg);
        moe_plan_desc_free(&pd);
        return;
    }
    char ns_open[200], ns_close[200], head[200];
    snprintf(ns_open, sizeof ns_open, "namespace %s_impl {", plan->name);
    snprintf(ns_close, sizeof ns_close, "}  // namespace %s_impl", plan->name);
    snprintf(head, sizeof head, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", sc->threads, sc->name);
    /* fp8: the quantizer's namespace block (the same namespace, opened again before the scatter) too */
    const char *again = strstr(src.data, ns_open) ? strstr(strstr(src.data, ns_open) + 1, ns_open) : NULL;
    const int fp8 = moe_spec_fp8(&s);
    const int cut = host_cut_span(src.data, ns_open, ns_close, &inc) ||
                    (fp8 && (!again || host_cut_span(again, ns_open, ns_close, &inc))) ||
                    host_cut_span(src.data, head, "\n}\n", &inc);
    CHECKF(!cut, "%s's namespace or %s not found whole in the emitted source", plan->name, sc->name);
    char inc_path[400], bin[400], cmd[3000];
    snprintf(inc_path, sizeof inc_path, "%s/%s.inc", tmp_root, s.name);
    snprintf(bin, sizeof bin, "%s/%s_host", tmp_root, s.name);
    CHECKF(!cut && write_bytes(inc_path, inc.data, inc.len) == 0, "cannot write %s", inc_path);
    const char *objs = fp8 ? fp8_objects() : ""; /* fp8: the host's quantization rule (runtime/fp8.c), linked in */
    CHECKF(objs != NULL, "cannot build runtime/fp8.c and half.c for the reference");
    if (!cut && objs) {
        snprintf(cmd, sizeof cmd,
                 "%s -std=c++17 -O2 -w -Itests/support -include cuda_host.h -include %s %s -DSH_SCATTER=%s -DSH_E=%d "
                 "-DSH_Z=%d -DSH_K=%d -DSH_H=%d -DSH_ROWS=%d -DSH_GATHER=%d -DSH_FP8=%d -DSH_INPUT=%d "
                 "tests/scatter_host.cc %s -o %s 2>&1",
                 cxx, inc_path, s.dtype == MOE_DTYPE_FP16 ? "-DMOE_HOST_FP16" : "", sc->name, moe_spec_slots(&s),
                 s.zero_experts, moe_spec_entries(&s), s.hidden, sc->per_block, moe_spec_gather(&s), fp8,
                 s.router.apply == MOE_APPLY_INPUT, objs, bin);
        CHECKF(system(cmd) == 0, "the host build failed: %s", cmd);
        host_run_seeds(bin, c->tokens, c->ntokens, "the scatter's rows or row map are wrong");
    }
    moe_buf_free(&inc);
    moe_buf_free(&src);
    moe_plan_desc_free(&pd);
}

int main(void) { return host_main("test_scatter_host", "the scatter kernel on the host", cases, NCASES, run_case); }
