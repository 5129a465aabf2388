/* test_bwd_host.c — the backward's dx and d router_w kernels
 * (templates/bwd.lua's bwd_dx, bwd_dwr) run on the CPU: for each case a
 * training spec is planned and emitted, the backward's helper namespace and
 * the two kernels are cut out of the source and built with the host C++
 * compiler into tests/bwd_host.cc (the CUDA subset they use emulated by
 * tests/support/cuda_host.h), which runs them on random rows, d logits, x
 * and router weights and requires every element to be the fp32 sum in the
 * documented order, bit for bit (fp16: the CUDA-core loops), or, where the
 * router products run on tensor cores (bf16; the host's mma and ldmatrix
 * emulate their fragments), the rows' sum bit for bit and the products
 * within tests/bwd_host.cc's tolerance of the exact ones. So dx's token and
 * column tiling, the shared-memory tables, the shared gate's and
 * router.apply = "input"'s terms, and d router_w's chunks (loaded a chunk
 * ahead), its d logit_bias column and d w_gate row and its beta are
 * checked where there is no GPU;
 * test_bwd_gpu checks the whole backward on one. Skipped without
 * a C++17 compiler with <ucontext.h> (c++, or $CXX). Run from the
 * repository root. */
#define _POSIX_C_SOURCE 200809L

#include "gen_fixture.h"


static const host_case_t cases[] = {
    {"softmax top-2, H 264 (33 vectors: one partial block column), a token, a partial token block, 300 tokens "
     "(d router_w in 1, 2, 3 and 16 token splits: the last split short, some empty)",
     "tests/specs/train_softmax.moe", {1, 13, 300}, 3},
    {"fp16, a sigmoid-gated shared expert (d logits column E, dz · w_gate)", "tests/specs/train_shared.moe", {9, 70}, 2},
    {"fp16, logit_bias (d router_w's ones column), top-4", "tests/specs/train_gptoss.moe", {33}, 1},
    {"router.apply = \"input\": each row weighted by round(w)", "tests/specs/train_input.moe", {8}, 1},
    {"40 experts, top-6, H 2064 (258 vectors: two block columns, the second of 2)",
     "name = 'wide' experts = 40 top_k = 6 hidden = 2064 ffn = 64 tokens = 64 training = true\n", {19}, 1},
    {"Gemma 4's router: dx the rows alone, d router_x the router's term; d expert_scale's per-expert sums",
     "tests/specs/train_own_input.moe", {1, 13, 70}, 3},
    {"bf16, a sigmoid-gated shared expert: the gate's row E of dx's router rows and d w_gate on tensor cores",
     "name = 'shared_bf16' experts = 8 top_k = 2 hidden = 136 ffn = 40 tokens = 1024\n"
     "router = { score = 'softmax', renormalize = false } shared = { ffn = 80, gate = 'sigmoid' } training = true\n",
     {9, 70}, 2},
    {"bf16, logit_bias: d router_w's ones column on tensor cores (H 256: a block of the ones column alone)",
     "name = 'bias_bf16' experts = 8 top_k = 4 hidden = 256 ffn = 128 tokens = 1024\n"
     "router = { score = 'softmax', renormalize = true, logit_bias = true } training = true\n", {33, 300}, 2},
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
    const moe_kernel_desc_t *dys = &pd.bwd[MOE_K_BWD_DYS - MOE_K_BWD_FIRST], *dx = &pd.bwd[MOE_K_BWD_DX - MOE_K_BWD_FIRST],
                            *dwr = &pd.bwd[MOE_K_BWD_DWR - MOE_K_BWD_FIRST],
                            *esc = &pd.bwd[MOE_K_BWD_ESCALE - MOE_K_BWD_FIRST];
    moe_buf_t src = {0}, inc = {0};
    if (moe_emit_source(&pd, NULL, &src, &d)) {
        CHECKF(0, "%s", d.msg);
        moe_plan_desc_free(&pd);
        return;
    }
    char ns_open[200], ns_close[200], head[200], head2[200], head3[200];
    snprintf(ns_open, sizeof ns_open, "namespace %s_impl {", dys->name);
    snprintf(ns_close, sizeof ns_close, "}  // namespace %s_impl", dys->name);
    snprintf(head, sizeof head, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", dx->threads, dx->name);
    snprintf(head2, sizeof head2, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", dwr->threads, dwr->name);
    snprintf(head3, sizeof head3, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(", esc->threads, esc->name);
    const int cut = host_cut_span(src.data, ns_open, ns_close, &inc) || host_cut_span(src.data, head, "\n}\n", &inc) ||
                    host_cut_span(src.data, head2, "\n}\n", &inc) || host_cut_span(src.data, head3, "\n}\n", &inc);
    CHECKF(!cut, "%s's namespace, %s or %s not found whole in the emitted source", dys->name, dx->name, dwr->name);
    char inc_path[400], bin[400], cmd[3000];
    snprintf(inc_path, sizeof inc_path, "%s/%s.inc", tmp_root, s.name);
    snprintf(bin, sizeof bin, "%s/%s_host", tmp_root, s.name);
    CHECKF(!cut && write_bytes(inc_path, inc.data, inc.len) == 0, "cannot write %s", inc_path);
    if (!cut) {
        const int shared_gate = s.shared.ffn && s.shared.gate == MOE_SHARED_GATE_SIGMOID;
        snprintf(cmd, sizeof cmd,
                 "%s -std=c++17 -O2 -w -Itests/support -include cuda_host.h -include %s %s -DBX_DX=%s -DBX_DWR=%s "
                 "-DBX_E=%d -DBX_EL=%d -DBX_K=%d -DBX_H=%d -DBX_TB=%d -DBX_DXC=%d -DBX_MMA=%d -DBX_INPUT=%d -DBX_SG=%d "
                 "-DBX_LB=%d -DBX_DWR_COLS=%d -DBX_DWR_EXPERTS=%d -DBX_OWN=%d -DBX_ESCALE=%s -DBX_ES=%d -DBX_KR=%d "
                 "tests/bwd_host.cc -o %s 2>&1",
                 cxx, inc_path, s.dtype == MOE_DTYPE_FP16 ? "-DMOE_HOST_FP16" : "", dx->name, dwr->name, s.experts,
                 moe_spec_router_columns(&s), moe_spec_entries(&s), s.hidden, dx->per_block, moe_bwd_dx_cols(&s, dx),
                 moe_bwd_router_mma(&s),
                 s.router.apply == MOE_APPLY_INPUT, shared_gate, s.router.logit_bias, MOE_BWD_DWR_COLS,
                 MOE_BWD_DWR_EXPERTS, s.router.input == MOE_ROUTER_INPUT_SEPARATE, esc->name, s.router.expert_scale,
                 s.top_k, bin);
        CHECKF(system(cmd) == 0, "the host build failed: %s", cmd);
        host_run_seeds(bin, c->tokens, c->ntokens, "the kernel disagrees with the ordered sum");
    }
    moe_buf_free(&inc);
    moe_buf_free(&src);
    moe_plan_desc_free(&pd);
}

int main(void) { return host_main("test_bwd_host", "the dx kernel on the host", cases, NCASES, run_case); }
