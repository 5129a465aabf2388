/* test_gemv_host.c — the gemv grid's emitted kernels (templates/gemm_gemv.lua)
 * run on the CPU: for each case a spec planned under tests/tune/gemv.tune
 * (fp8 specs: tests/tune/gemv8.tune, the fp8 device code with its
 * clusters, linked with runtime/fp8.c for the reference's e4m3 rules)
 * is emitted, its two gemv kernels are cut out of the source and built with
 * the host C++ compiler into tests/gemv_host.cc (the CUDA subset they use
 * emulated by tests/support/cuda_host.h: a fiber per CUDA thread, barriers
 * for __syncthreads and the warp shuffles), which runs them on a
 * ragged tile table and checks them against a double-precision reference.
 * So the kernels' indexing (the gate/up groups, the row chunks, the
 * staging passes, the spread reduction, the epilogues) is checked where
 * there is no GPU; test_gpu checks them on one. Skipped without a C++17
 * compiler with <ucontext.h> (c++, or $CXX). Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include "gen_fixture.h"
#include "ref.h"
#include "spec_schema.h"
#include "tuning.h"

#include <math.h>

typedef struct {
    const char *label, *spec; /* spec text; its shape has an entry in tests/tune/gemv.tune */
    int max_rows;              /* cap on an expert's rows (the reference's time) */
    int ctas;                  /* the stream grid's CTAs (its kernels split the items among them); 0 otherwise */
} gemv_case_t;

/* The emitted activation (the kernels' GV_ACT, which their own checks take
 * as given) against the C reference's moe_ref_activation on a grid of
 * (gate, up) over twice the limit (or 8), in fp32 against double: within
 * 2e-6 of the value's size plus 1e-6 of the grid's. mode "act": the routed
 * experts'; "act_shared": the shared expert's own (GV_ACT_SHARED), held to
 * the reference of s with the shared expert's activation. */
static void check_activation(const moe_spec_t *spec, const char *bin, const char *mode) {
    moe_spec_t sh = *spec;
    const int shared = !strcmp(mode, "act_shared");
    if (shared)
        sh.activation = moe_spec_shared_activation(spec);
    const moe_spec_t *s = &sh;
    const double lim = s->activation.limit > 0 ? s->activation.limit : spec->activation.limit;
    const double scale = lim > 0 ? 2.0173 * lim : 8;   /* no grid point on the limits (fp32 vs double there) */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s %s %.9g", bin, mode, scale);
    fflush(NULL);
    FILE *f = popen(cmd, "r");
    int n = 0, bad = 0, first = -1;
    char first_line[200] = "";
    float g, u, v, dg = 0.f, du = 0.f;
    const int nf = s->training ? 5 : 3;   /* training: the backward's d gate and d up too */
    while (f && (nf == 5 ? fscanf(f, "%a %a %a %a %a", &g, &u, &v, &dg, &du) : fscanf(f, "%a %a %a", &g, &u, &v)) == nf) {
        const double want = moe_ref_activation(s, g, u);
        double wg = 0, wu = 0;
        moe_ref_activation_grad(s, g, u, &wg, &wu);
        const int grads_ok = nf == 3 || (fabs(dg - wg) <= 2e-6 * fabs(wg) + 1e-6 && fabs(du - wu) <= 2e-6 * fabs(wu) + 1e-6 * scale);
        if (!(fabs(v - want) <= 2e-6 * fabs(want) + 1e-6 * scale) || !grads_ok) {
            if (first < 0) {
                first = n;
                snprintf(first_line, sizeof first_line, "act(%g, %g) = %g d %g %g, want %g d %g %g", g, u, v, dg, du,
                         want, wg, wu);
            }
            bad++;
        }
        n++;
    }
    const int rc = f ? pclose(f) : -1;
    CHECKF(rc == 0 && n == 81 * 81 && bad == 0, "%s %s: the emitted activation differs from the reference at %d of "
           "%d points (the first: %d: %s)", bin, mode, bad, n, first, first_line);
}

static const gemv_case_t cases[] = {
    /* tuning/h200.tune's gemv tiles on their specs' H and F (two experts: the kernels' code is the same) */
    {"Mixtral's shipped gemv tile: K 4096 and 14336 in staging passes, bn 32, unroll 4",
     "name = 'mx' experts = 2 top_k = 1 hidden = 4096 ffn = 14336 tokens = 64\n", 2, 0},
    {"gpt-oss-20b's: K 2880 with a tail, the clamped SwiGLU with biases, bn 64, chunks of 8 + 1 rows", "name = 'go' experts = 2 top_k = 1 hidden = 2880 ffn = 2880 tokens = 64 ffn_bias = true\n"
     "activation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", 9, 0},
    {"the DeepSeek-V3 EP8 rank's: K 7168 in two passes, bn 64", "name = 'e8' experts = 2 top_k = 1 hidden = 7168 ffn = 2048 tokens = 64\n", 2, 0},
    /* bn 16 and 8: two and four warps share a group's K, their sums added in shared memory */
    {"bn 16 on Qwen3's H and F: two warps a group, chunks of 8 + 1 rows; top-2 (the combine's k order)",
     "name = 'q16' experts = 3 top_k = 2 hidden = 2048 ffn = 768 tokens = 64\n", 9, 0},
    {"bn 8, unroll 4: K 4360 in two staging passes with tails, half pairing blocks", "name = 'b8' experts = 2 top_k = 1 hidden = 4360 ffn = 296 tokens = 64\n", 3, 0},
    {"bn 8, geglu clamped after its unit, up_offset, training (the backward's activation gradient checked too)",
     "name = 'cg' experts = 2 top_k = 1 hidden = 4360 ffn = 296 tokens = 64 training = true\n"
     "activation = { kind = 'geglu', limit = 0.3, clamp = 'after', up_offset = 0.5 }\n", 3, 0},
    {"bn 8, unroll 4, Step-3.7-Flash's clamped layer: the gate's clamp after its unit at a limit the values pass, "
     "a shared expert with a limit of its own (slots 2 and 3 run it), training (both activations' gradients)",
     "name = 'sl' experts = 2 top_k = 1 hidden = 4360 ffn = 296 tokens = 64 training = true\n"
     "activation = { limit = 0.3, clamp = 'after' }\nshared = { ffn = 592, limit = 0.9 }\n", 3, 0},
    {"bn 8, NemotronH's relu2 experts (relu(gate)^2, up unused) and its relu2 shared expert, training",
     "name = 'r2' experts = 2 top_k = 1 hidden = 4360 ffn = 296 tokens = 64 training = true\n"
     "activation = { kind = 'relu2' }\nshared = { ffn = 296 }\n", 3, 0},
    {"bn 8, the clamped SwiGLU before its unit (gpt-oss's), training: the backward's activation gradient; a "
     "shared expert unclamped (HY-V4's: slot 2)",
     "name = 'cb' experts = 2 top_k = 1 hidden = 4360 ffn = 296 tokens = 64 training = true\n"
     "activation = { alpha = 1.702, limit = 0.3, up_offset = 1 }\nshared = { ffn = 296, unclamped = true }\n", 3, 0},
    {"bn 16 on gpt-oss-20b's H and F: K 2880's 360 vectors split unevenly between the two warps, clamp and biases",
     "name = 'g16' experts = 3 top_k = 1 hidden = 2880 ffn = 2880 tokens = 64 ffn_bias = true\n"
     "activation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", 2, 0},
    {"bn 8, unroll 1, fp16: the clamped SwiGLU with biases, K shorter than a batch's warps; router.apply = "
     "\"input\" (the combine's weight 1)", "name = 'h8' experts = 2 top_k = 1 hidden = 200 ffn = 88 tokens = 64 "
     "dtype = 'fp16' ffn_bias = true\nactivation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n"
     "router = { score = 'sigmoid', renormalize = false, apply = 'input' }\n", 9, 0},
    /* gemv3: three CTAs an SM, rows in chunks of 2 (R = 1, 2) */
    {"gemv3 on Qwen3's H and F, bn 32, unroll 2: top-2, chunks of 2 + 2 + 2 + 2 + 1 rows",
     "name = 'q3' experts = 4 top_k = 2 hidden = 2048 ffn = 768 tokens = 64\n", 9, 0},
    {"gemv3, fp16, bm 128, bn 64, unroll 1: K 2880 with a tail, the clamped SwiGLU with biases, chunks of 2 + 1",
     "name = 'g3' experts = 4 top_k = 1 hidden = 2880 ffn = 2880 tokens = 64 dtype = 'fp16' ffn_bias = true\n"
     "activation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", 3, 0},
    /* gemv4: four CTAs an SM, rows one at a time (R = 1: a tile's every row reads the weights again) */
    {"gemv4 on Qwen3's H and F, bn 32, unroll 2: top-2, rows one at a time (up to 5 a tile)",
     "name = 'q4' experts = 7 top_k = 2 hidden = 2048 ffn = 768 tokens = 64\n", 9, 0},
    {"gemv4, fp16, bm 128, bn 64, unroll 1: K 2880 with a tail, the clamped SwiGLU with biases",
     "name = 'g4' experts = 7 top_k = 1 hidden = 2880 ffn = 2880 tokens = 64 dtype = 'fp16' ffn_bias = true\n"
     "activation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", 3, 0},
    /* the stream grid: a persistent grid of `ctas` CTAs splitting the (tile, 16-row block) items, a ring of
     * bulk copies (the host's mbarriers and copies: tests/support/cuda_host.h) */
    {"stream on Qwen3's H and F, 3 stages, 5 CTAs: top-2, up in two K chunks, down's 16 rows in one copy, "
     "passes of 8 + 1 rows", "name = 'qs' experts = 5 top_k = 2 hidden = 2048 ffn = 768 tokens = 64\n", 9, 5},
    {"stream, fp16, bm 128, 2 stages, 3 CTAs: K 2880 in chunks of 1024 + 1024 + 832, the clamped SwiGLU with "
     "biases, passes of 8 + 8 + 1 rows", "name = 'gs' experts = 5 top_k = 1 hidden = 2880 ffn = 2880 tokens = 64 "
     "dtype = 'fp16' ffn_bias = true\nactivation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", 17, 3},
    {"stream, 4 stages, 7 CTAs: training (U stored), the gate's clamp after its unit, a shared expert with a "
     "limit of its own (slots 3 and 4 run it)", "name = 'ss' experts = 3 top_k = 1 hidden = 4368 ffn = 296 "
     "tokens = 64 training = true\nactivation = { limit = 0.3, clamp = 'after' }\nshared = { ffn = 592, limit = 0.9 }\n",
     3, 7},
    {"stream, fp16, 2 stages, 2 CTAs: K 208 and 88 (fewer vectors than lanes), router.apply = \"input\"",
     "name = 'hs' experts = 2 top_k = 1 hidden = 208 ffn = 88 tokens = 64 dtype = 'fp16'\n"
     "router = { score = 'sigmoid', renormalize = false, apply = 'input' }\n", 9, 2},
    /* the chain: the stream grid's up GEMM running the down GEMM and the combine in its grid, every block
     * together (they wait for each other's up items) */
    {"chain on Qwen3's H and F, 3 stages, 5 CTAs: top-2, up stages of 1024 columns and down stages of 768 in "
     "one ring, passes of 8 + 1 rows", "name = 'qc' experts = 6 top_k = 2 hidden = 2048 ffn = 768 tokens = 64\n", 9, 5},
    {"chain, fp16, 2 stages, 3 CTAs: K 2880 in chunks of 1024 + 1024 + 832 (down 1024 + 1024 + 832), the clamped "
     "SwiGLU with biases, passes of 8 + 8 + 1 rows", "name = 'gc' experts = 6 top_k = 1 hidden = 2880 ffn = 2880 "
     "tokens = 64 dtype = 'fp16' ffn_bias = true\nactivation = { alpha = 1.702, limit = 7.0, up_offset = 1 }\n", 17, 3},
    {"chain, 2 stages, 7 CTAs: H 208 and F 88 (fewer vectors than lanes, down's stages narrower than up's), "
     "router.apply = \"input\", a shared expert (slot 2)", "name = 'hc' experts = 2 top_k = 1 hidden = 208 ffn = 88 "
     "tokens = 64\nrouter = { score = 'sigmoid', renormalize = false, apply = 'input' }\nshared = { ffn = 88 }\n", 9, 7},
    /* fp8 (tests/tune/gemv8.tune): e4m3 operands, the up GEMM's clusters sharing a quantization block */
    {"fp8 block scales on Qwen3's H and F, bn 32: clusters of 8 CTAs; top-2, chunks of 8 + 1 rows",
     "name = 'f32' experts = 3 top_k = 2 hidden = 2048 ffn = 768 tokens = 64\n"
     "quant = { weights = 'fp8_e4m3', scaling = 'block' }\n", 9, 0},
    {"fp8 channel scales, biases, bn 64 (clusters of 4), unroll 1: K 640, 5 scale blocks; H 640 in 2.5 slices",
     "name = 'f64' experts = 2 top_k = 1 hidden = 640 ffn = 256 tokens = 64 ffn_bias = true\n"
     "quant = { weights = 'fp8_e4m3', scaling = 'channel' }\n", 3, 0},
    {"fp8 block, bn 128 (clusters of 2), unroll 4: K 7168 staged in one pass",
     "name = 'f128' experts = 2 top_k = 1 hidden = 7168 ffn = 256 tokens = 64\n"
     "quant = { weights = 'fp8_e4m3', scaling = 'block' }\n", 2, 0},
    {"fp8 block, bn 256 (no cluster), bm 128: K 9216 in two staging passes, chunks of 8 + 1 rows",
     "name = 'f256' experts = 2 top_k = 1 hidden = 9216 ffn = 128 tokens = 64\n"
     "quant = { weights = 'fp8_e4m3', scaling = 'block' }\n", 9, 0},
};
#define NCASES ((int)(sizeof cases / sizeof *cases))

static void run_case(const gemv_case_t *c, const moe_tuning_t *table, const char *cxx) {
    CASE(c->label);
    if (!check_counts()) /* left out by MOEGEN_TEST_CASE: not built or run */
        return;
    moe_spec_t s;
    moe_diag_t d;
    moe_plan_desc_t pd;
    moe_override_t arch = {"arch=sm_90a"};
    if (host_case_plan(c->spec, &arch, 1, table, &s, &pd))
        return;
    const moe_kernel_desc_t *up = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP];
    const moe_kernel_desc_t *dn = &moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN];
    CHECKF(up->tile.gemv && dn->tile.gemv && up->tile.bn == dn->tile.bn && up->threads == dn->threads, "%s, %s: not both on the gemv grid",
           up->name, dn->name);
    moe_buf_t src = {0}, inc = {0};
    if (!up->tile.gemv || moe_emit_source(&pd, NULL, &src, &d)) {
        CHECKF(up->tile.gemv == 0, "%s", d.msg);
        moe_plan_desc_free(&pd);
        return;
    }
    char up_smem[200], dn_smem[200];
    snprintf(up_smem, sizeof up_smem, "%s_smem", up->name);
    snprintf(dn_smem, sizeof dn_smem, "%s_smem", dn->name);
    const int cut =
        host_cut_kernel(src.data, up->name, up_smem, &inc) || host_cut_kernel(src.data, dn->name, dn_smem, &inc);
    CHECKF(!cut, "%s or %s not found whole in the emitted source", up->name, dn->name);
    /* the activation's function, named by its kind (templates/activation.lua, M.name: the schema's choice) */
    const char *an = moe_spec_key("activation.kind")->choices[s.activation.kind];
    char head[120];
    snprintf(head, sizeof head, "float %s(float gate, float up)", an);
    CHECKF(strstr(inc.data, head) != NULL, "%s is not in the up kernel's code", head);
    /* a training spec: the backward's activation gradient too (check_activation) */
    char bwd_head[120];
    snprintf(bwd_head, sizeof bwd_head, "static __device__ __forceinline__ void %s_bwd(", an);
    const int cut_bwd = s.training && !cut && host_cut_span(src.data, bwd_head, "\n}\n", &inc) == 0;
    CHECKF(!s.training || cut_bwd, "%s not found whole in the emitted source", bwd_head);
    /* a shared expert with its own activation: its slots (E on) run NAME_shared, its gradient NAME_bwd_shared */
    const int own = moe_spec_shared_act_differs(&s);
    char shared_defs[300] = "";
    if (own) {
        snprintf(bwd_head, sizeof bwd_head, "static __device__ __forceinline__ void %s_bwd_shared(", an);
        const int cut_sb = s.training && !cut && host_cut_span(src.data, bwd_head, "\n}\n", &inc) == 0;
        CHECKF(!s.training || cut_sb, "%s not found whole in the emitted source", bwd_head);
        snprintf(head, sizeof head, "float %s_shared(float gate, float up)", an);
        CHECKF(strstr(inc.data, head) != NULL, "the shared expert's activation is not in the up kernel's code");
        snprintf(shared_defs, sizeof shared_defs, "-DGV_SHARED0=%d -DGV_ACT_SHARED=%s_impl::%s_shared %s%s%s ",
                 s.experts, up->name, an, cut_sb ? "-DGV_ACT_BWD_SHARED=" : "", cut_sb ? an : "",
                 cut_sb ? "_bwd_shared" : "");
    }
    char inc_path[400], bin[400], cmd[3000];
    snprintf(inc_path, sizeof inc_path, "%s/%s.inc", tmp_root, s.name);
    snprintf(bin, sizeof bin, "%s/%s_host", tmp_root, s.name);
    CHECKF(!cut && write_bytes(inc_path, inc.data, inc.len) == 0, "cannot write %s", inc_path);
    const int fp8 = moe_spec_fp8(&s);
    const char *objs = fp8 ? fp8_objects() : "";
    CHECKF(objs != NULL, "cannot build runtime/fp8.c and half.c for the reference");
    if (!cut && objs) {
        snprintf(cmd, sizeof cmd,
                 "%s -std=c++17 -O2 -w -Itests/support -include cuda_host.h -include %s %s "
                 "-DGV_UP=%s -DGV_DOWN=%s -DGV_ACT=%s_impl::%s -DGV_E=%d -DGV_H=%d -DGV_F=%d -DGV_BM=%d -DGV_BN=%d "
                 "-DGV_BIAS=%d -DGV_TRAIN=%d -DGV_SMEM_UP=%d -DGV_SMEM_DN=%d -DGV_KE=%d -DGV_INPUT=%d "
                 "-DGV_FP8=%d -DGV_BLOCK=%d -DGV_CLUSTER=%d -DGV_STREAM=%d -DGV_CHAIN=%d -DGV_THREADS=%d %s%s%s %stests/gemv_host.cc %s -o %s 2>&1",
                 cxx, inc_path, s.dtype == MOE_DTYPE_FP16 ? "-DMOE_HOST_FP16" : "", up->name, dn->name, up->name,
                 an, moe_spec_slots(&s), s.hidden, s.ffn, up->tile.bm, up->tile.bn, s.ffn_bias,
                 s.training, up->smem, dn->smem, moe_spec_entries(&s), s.router.apply == MOE_APPLY_INPUT, fp8,
                 s.quant.scaling == MOE_SCALING_BLOCK, fp8 ? 256 / up->tile.bn : 1, moe_tile_stream(&up->tile) ? c->ctas : 0,
                 moe_gemm_chains(&s, up), up->threads,
                 cut_bwd ? "-DGV_ACT_BWD=" : "", cut_bwd ? an : "", cut_bwd ? "_bwd" : "", shared_defs, objs,
                 bin);
        const int built = system(cmd) == 0;
        CHECKF(built, "the host build failed: %s", cmd);
        host_run_seeds(bin, &c->max_rows, 1, "the kernels disagree with the reference");
        if (built)
            check_activation(&s, bin, "act");
        if (built && own)
            check_activation(&s, bin, "act_shared");
    }
    moe_buf_free(&inc);
    moe_buf_free(&src);
    moe_plan_desc_free(&pd);
}

int main(void) {
    if (gen_fixture_setup("test_gemv_host"))
        return 1;
    const char *cxx;
    const int have_cxx = host_cxx(&cxx);
    moe_tuning_t table, table8;
    moe_diag_t d;
    CASE("tests/tune/gemv.tune and gemv8.tune load");
    CHECKF(moe_tuning_load(&table, "tests/tune/gemv.tune", &d) == 0, "%s", d.msg);
    CHECKF(moe_tuning_load(&table8, "tests/tune/gemv8.tune", &d) == 0, "%s", d.msg);
    if (!have_cxx) {
        CASE("the gemv kernels on the host");
        SKIP("no C++17 compiler with <ucontext.h> (%s; set CXX)", cxx);
    } else {
        for (int i = 0; i < NCASES; i++)
            run_case(&cases[i], strstr(cases[i].spec, "fp8_e4m3") ? &table8 : &table, cxx);
    }
    moe_tuning_free(&table);
    moe_tuning_free(&table8);
    rm_rf(tmp_root);
    return check_report("test_gemv_host");
}
