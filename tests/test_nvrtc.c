/* test_nvrtc.c — every kernel of every example spec (and of the test specs listed below,
 * some for sm_90a alone), with training = true where the mesh is one device (the backward
 * GEMMs too), compiles under NVRTC for each arch with no warnings, and each kernel the
 * plan names (and the cuDNN path's swiglu kernel) is in the cubin. Compiles run in child processes, a few at a
 * time. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include "compile.h"
#include "gen_fixture.h"

/* ---- NVRTC: every kernel of every example spec, each arch ------------------- */

typedef struct {
    int rc;               /* 0 compiled */
    size_t cubin, log;    /* bytes */
    char missing[128];    /* a kernel name not found in the cubin */
    char msg[3000];       /* diag or log */
} job_result_t;

static void compile_job(const char *spec, moe_arch_t arch, job_result_t *r) {
    memset(r, 0, sizeof *r);
    /* with training = true where the spec allows it (one device, not fp8),
     * so the same compile also covers the backward GEMMs (the forward's
     * kernels are the same either way) */
    moe_plan_desc_t pd;
    const moe_override_t train = {"training=true"};
    if (load_plan(spec, NULL, 0, &pd)) {
        r->rc = 1;
        snprintf(r->msg, sizeof r->msg, "%s does not load", spec);
        return;
    }
    if (!pd.spec.training && moe_spec_world(&pd.spec) == 1 && !moe_spec_fp8(&pd.spec)) {
        moe_plan_desc_free(&pd);
        if (load_plan(spec, &train, 1, &pd)) {
            r->rc = 1;
            snprintf(r->msg, sizeof r->msg, "%s does not load with training = true", spec);
            return;
        }
    }
    moe_buf_t src = {0}, cubin = {0}, log = {0};
    moe_diag_t d;
    if (moe_emit_source(&pd, NULL, &src, &d)) {
        r->rc = 1;
        snprintf(r->msg, sizeof r->msg, "%s", d.msg);
        moe_buf_free(&src);
        return;
    }
    char name[128];
    snprintf(name, sizeof name, "%s.cu", pd.spec.name);
    r->rc = moe_nvrtc_compile(src.data, name, arch, &cubin, NULL, &log, &d);
    r->cubin = cubin.len;
    r->log = log.len;
    if (r->rc)
        snprintf(r->msg, sizeof r->msg, "%s", d.msg);
    else if (log.len)
        snprintf(r->msg, sizeof r->msg, "%s", log.data);
    for (int k = 0; !r->rc && k < MOE_K_COUNT; k++) {
        const char *kname = moe_plan_kernels(&pd, arch)[k].name;
        if (!find_bytes(cubin.data, cubin.len, kname)) {
            snprintf(r->missing, sizeof r->missing, "%s", kname);
            break;
        }
    }
    /* and the cuDNN path's standalone activation, which every source carries */
    moe_kernel_desc_t act;
    const moe_family_ctx_t ctx = {.spec = &pd.spec, .arch = arch, .align = pd.align, .tuned = pd.tuned};
    char e[256];
    if (!r->rc && !r->missing[0]) {
        if (moe_family_build(&act, MOE_K_SWIGLU, &ctx, e, sizeof e))
            snprintf(r->missing, sizeof r->missing, "swiglu (%s)", e);
        else if (!find_bytes(cubin.data, cubin.len, act.name))
            snprintf(r->missing, sizeof r->missing, "%s", act.name);
    }
    /* and the device-side weight pack, which every source carries too */
    if (!r->rc && !r->missing[0] && !find_bytes(cubin.data, cubin.len, pd.pack.name))
        snprintf(r->missing, sizeof r->missing, "%s", pd.pack.name);
    /* and a training spec's backward kernels */
    for (int i = 0; pd.has_bwd && i < MOE_BK_COUNT && !r->rc && !r->missing[0]; i++)
        if (!find_bytes(cubin.data, cubin.len, pd.bwd[i].name))
            snprintf(r->missing, sizeof r->missing, "%s", pd.bwd[i].name);
    /* and the backward GEMMs of a training spec */
    const moe_kernel_desc_t *bg = moe_plan_bgemm(&pd, arch);
    for (int i = 0; bg && !r->rc && !r->missing[0] && i < MOE_BGEMM_COUNT; i++)
        if (!find_bytes(cubin.data, cubin.len, bg[i].name))
            snprintf(r->missing, sizeof r->missing, "%s", bg[i].name);
    moe_buf_free(&src);
    moe_buf_free(&cubin);
    moe_buf_free(&log);
}

static void test_nvrtc_all(void) {
    CASE("NVRTC: every example spec, each arch");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent: the kernel templates are not all written yet", missing_template);
        return;
    }
    static char names[64][256];
    int n = list_dir("examples/specs", names, 64);
    /* the jobs: (spec, arch) pairs; every example spec on both arches */
    static const moe_arch_t arches[] = {MOE_ARCH_SM90A, MOE_ARCH_SM80};
    enum { MAXJOBS = 2 * (64 + 20) };
    static char specs[64 + 20][300];
    int job_spec[MAXJOBS], job_arch[MAXJOBS];
    int ns = 0, njobs = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        if (l > 4 && strcmp(names[i] + l - 4, ".moe") == 0) {
            snprintf(specs[ns], sizeof specs[0], "examples/specs/%s", names[i]);
            for (int a = 0; a < 2; a++)
                job_spec[njobs] = ns, job_arch[njobs++] = a;
            ns++;
        }
    }
    CHECK(ns >= 5);
    /* and the test specs that stand for a feature no example spec has (test_gpu
     * runs each); those whose feature lives only in the arch-independent
     * kernels (route, permute, combine: one template for both arches) compile
     * for sm_90a alone */
    static const struct {
        const char *path;
        int both_arches;
    } test_specs[] = {
        {SMALL, 1},
        {"tests/specs/geglu.moe", 1},          /* activation.kind = "geglu" (the GEMM epilogues) */
        {"tests/specs/group_top1.moe", 0},     /* router.group_topk = 1, general group layout */
        {"tests/specs/group_nondiv.moe", 0},   /* topk_groups does not divide top_k, lane-segment groups */
        {"tests/specs/group_slots.moe", 0},    /* group_topk = 1, whole-slot groups, top_k not a multiple */
        {"tests/specs/group_12e.moe", 0},      /* 12 experts, top-3, 4 groups keeping 2 */
        {"tests/specs/apply_input.moe", 0},    /* router.apply = "input", Llama 4's top-1 sigmoid */
        {"tests/specs/apply_input_k2.moe", 0}, /* router.apply = "input", top-2, biases, clamped SwiGLU */
        {"examples/specs/fp8/deepseek-v3-ep8-fp8.moe", 0}, /* fp8 GEMMs (sm_90a only), block scales */
        {"examples/specs/fp8/mixtral-8x7b-fp8.moe", 0},    /* fp8 GEMMs, channel scales */
        {"tests/specs/train_softmax.moe", 1},  /* training: the backward's kernels (bwd_upre is a GEMM) */
        {"tests/specs/train_gptoss.moe", 1},   /* training, fp16, logit_bias, ffn_bias, clamped SwiGLU */
        {"tests/specs/train_sigmoid_groups.moe", 0}, /* training, sigmoid, groups, scale */
        {"tests/specs/train_input.moe", 0},    /* training, router.apply = "input", biases, clamp */
        {"tests/specs/train_shared.moe", 0},   /* training, a sigmoid-gated shared expert, fp16 */
    };
    _Static_assert(sizeof test_specs / sizeof *test_specs <= 20, "specs[] has room for 20 test specs");
    for (size_t i = 0; i < sizeof test_specs / sizeof *test_specs; i++) {
        snprintf(specs[ns], sizeof specs[0], "%s", test_specs[i].path);
        for (int a = 0; a < (test_specs[i].both_arches ? 2 : 1); a++)
            job_spec[njobs] = ns, job_arch[njobs++] = a;
        ns++;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int workers = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    double t0 = now();

    /* one child per compile, `workers` at a time; results come back in pipes */
    pid_t pid[MAXJOBS];
    int fd[MAXJOBS];
    int next = 0, running = 0, done = 0;
    job_result_t res;
    while (done < njobs) {
        while (running < workers && next < njobs) {
            int p[2];
            if (pipe(p)) {
                CHECKF(0, "pipe: %s", strerror(errno));
                return;
            }
            fflush(NULL);
            pid_t c = fork();
            if (c == 0) {
                close(p[0]);
                compile_job(specs[job_spec[next]], arches[job_arch[next]], &res);
                ssize_t w = write(p[1], &res, sizeof res);
                _exit(w == (ssize_t)sizeof res ? 0 : 3);
            }
            close(p[1]);
            pid[next] = c;
            fd[next] = p[0];
            next++;
            running++;
        }
        /* collect the oldest running job (results are read in job order) */
        int j = done;
        job_result_t r;
        memset(&r, 0, sizeof r);
        size_t got = 0;
        while (got < sizeof r) {
            ssize_t k = read(fd[j], (char *)&r + got, sizeof r - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        close(fd[j]);
        int st = 0;
        waitpid(pid[j], &st, 0);
        running--;
        done++;
        char label[400];
        snprintf(label, sizeof label, "NVRTC %s %s", specs[job_spec[j]], moe_arch_name(arches[job_arch[j]]));
        CASE(label);
        CHECKF(got == sizeof r && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the compile process failed (status %d)",
               st);
        if (got != sizeof r)
            continue;
        CHECKF(r.rc == 0, "\n%s", r.msg);
        CHECKF(r.log == 0, "NVRTC warnings:\n%s", r.msg);
        CHECK(r.cubin > 0);
        CHECKF(r.missing[0] == 0, "kernel %s is not in the cubin", r.missing);
    }
    fprintf(stderr, "test_nvrtc: NVRTC: %d compiles (%d specs, each arch or sm_90a alone) on %d workers in %.1f s\n",
            njobs, ns, workers, now() - t0);
}


int main(void) {
    if (gen_fixture_setup("test_nvrtc"))
        return 1;
    test_nvrtc_all();
    rm_rf(tmp_root);
    return check_report("test_nvrtc");
}
