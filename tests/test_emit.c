/* test_emit.c — what moegen emits: the emitted-file goldens of
 * tests/specs/small.moe, determinism and the stamp (no paths, no dates), and
 * kernels_out/ against a fresh emit of every example spec.
 *
 * Goldens: tests/golden/small/{small.cu, small.h, manifest.json, small.moe}
 * are a snapshot of the embedded templates' output. Whenever a template
 * changes, regenerate them with
 *     MOEGEN_UPDATE_GOLDENS=1 make test-cpu
 * and review the diff. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L
#include <pwd.h>

#include "gen_fixture.h"

/* ---- goldens of the small spec ------------------------------------------- */

static void report_first_diff(const char *name, const char *got, size_t gl, const char *want, size_t wl) {
    size_t i = 0;
    int line = 1;
    while (i < gl && i < wl && got[i] == want[i])
        line += got[i++] == '\n';
    char g[200], w[200];
    size_t gs = i, ws = i;
    while (gs > 0 && got[gs - 1] != '\n')
        gs--;
    while (ws > 0 && want[ws - 1] != '\n')
        ws--;
    first_line(got + (gs < gl ? gs : gl), g, sizeof g);
    first_line(want + (ws < wl ? ws : wl), w, sizeof w);
    fprintf(stderr, "  %s: first difference at line %d\n    emitted: %s\n    golden:  %s\n", name, line, g, w);
}

/* The emitted files fs against the goldens in dir, or (MOEGEN_UPDATE_GOLDENS=1)
 * written there. */
static void compare_goldens(const char *dir, const moe_fileset_t *fs) {
    const char *upd = getenv("MOEGEN_UPDATE_GOLDENS");
    if (upd && strcmp(upd, "1") == 0) {
        char err[256];
        CHECKF(moe_mkdirs(dir, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < fs->nfiles; i++) {
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, fs->files[i].path);
            CHECKF(write_bytes(p, fs->files[i].data.data, fs->files[i].data.len) == 0, "cannot write %s", p);
            fprintf(stderr, "test_emit: MOEGEN_UPDATE_GOLDENS=1: wrote %s\n", p);
        }
        return;
    }
    for (int i = 0; i < fs->nfiles; i++) {
        char p[600], label[300];
        snprintf(p, sizeof p, "%s/%s", dir, fs->files[i].path);
        snprintf(label, sizeof label, "golden %s", p);
        CASE(label);
        size_t wl;
        char *want = read_bytes(p, &wl);
        CHECKF(want != NULL, "%s is missing: run MOEGEN_UPDATE_GOLDENS=1 make test-cpu", p);
        if (!want)
            continue;
        const moe_buf_t *b = &fs->files[i].data;
        int same = wl == b->len && memcmp(want, b->data, wl) == 0;
        CHECKF(same, "%s differs from the emitted file; if a template changed on purpose, regenerate with "
                     "MOEGEN_UPDATE_GOLDENS=1 make test-cpu and review the diff", p);
        if (!same)
            report_first_diff(p, b->data, b->len, want, wl);
        free(want);
    }
}

/* The small spec (odd's shape) under tests/tune/gemv.tune: both sm_90a
 * GEMMs on the gemv grid (templates/gemm_gemv.lua) and the vendored
 * launcher's 2D launch of them, in tests/golden/small_gemv. */
static void test_golden_gemv(void) {
    CASE("golden small under tests/tune/gemv.tune");
    moe_tuning_t t;
    moe_diag_t d;
    CHECKF(moe_tuning_load(&t, "tests/tune/gemv.tune", &d) == 0, "%s", d.msg);
    moe_spec_t s;
    CHECKF(moe_spec_load(&s, SMALL, NULL, NULL, 0, &d) == 0, "%s", d.msg);
    moe_plan_desc_t pd;
    char err[512];
    CHECKF(moe_plan_desc_build(&pd, &s, &t, err, sizeof err) == 0, "%s", err);
    CHECK(moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_UP].tile.gemv &&
          moe_plan_kernels(&pd, MOE_ARCH_SM90A)[MOE_K_GEMM_DOWN].tile.gemv);
    moe_fileset_t fs = {0};
    CHECKF(moe_emit_files(&pd, NULL, &fs, &d) == 0, "%s", d.msg);
    compare_goldens("tests/golden/small_gemv", &fs);
    moe_fileset_free(&fs);
    moe_plan_desc_free(&pd);
    moe_tuning_free(&t);
}

static void test_golden_small(void) {
    CASE("golden small");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent: the kernel templates are not all written yet", missing_template);
        return;
    }
    moe_plan_desc_t pd;
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    moe_fileset_t fs = {0};
    moe_diag_t d;
    int rc = moe_emit_files(&pd, NULL, &fs, &d);
    CHECKF(rc == 0, "%s", d.msg);
    if (rc) {
        moe_fileset_free(&fs);
        moe_plan_desc_free(&pd);
        return;
    }
    static const char *const want_files[] = {"small.cu", "small.h", "manifest.json", "small.moe"};
    CHECK(fs.nfiles == 4);
    for (int i = 0; i < fs.nfiles && i < 4; i++)
        CHECK_STREQ(fs.files[i].path, want_files[i]);

    compare_goldens(GOLDEN_DIR, &fs);

    CASE("golden small: moegen emit writes the same files");
    char out[300], args[700];
    snprintf(out, sizeof out, "%s/cmd_small", tmp_root);
    snprintf(args, sizeof args, "emit %s -o %s", SMALL, out);
    char *err;
    rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(err);
    for (int i = 0; i < fs.nfiles; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", out, fs.files[i].path);
        size_t l;
        char *data = read_bytes(p, &l);
        CHECKF(data && l == fs.files[i].data.len && memcmp(data, fs.files[i].data.data, l) == 0, "%s", p);
        free(data);
    }

    CASE("golden small: the emitted spec loads back to the same hash");
    moe_spec_t s;
    CHECKF(moe_spec_load(&s, "small.moe", fs.files[3].data.data, NULL, 0, &d) == 0, "%s", d.msg);
    CHECK_STREQ(s.hash, pd.spec.hash);

    CASE("golden small: #line names the repo-relative templates");
    const char *cu = fs.files[0].data.data;
    for (size_t i = 0; i < NKT; i++) {
        char want[128];
        snprintf(want, sizeof want, "\"templates/%s.lua\"\n", kernel_templates[i]);
        CHECKF(strstr(cu, want) != NULL, "no #line for templates/%s.lua", kernel_templates[i]);
    }
    CHECK(strstr(cu, "#line 1 \"/") == NULL && strstr(cu, " \"/") == NULL);
    moe_fileset_free(&fs);
    moe_plan_desc_free(&pd);
}

/* ---- determinism and the stamp ---------------------------------------------- */

static int isalnum_c(char c) { return isalnum((unsigned char)c) || c == '_'; }
static int tolower_c(char c) { return tolower((unsigned char)c); }

static int has_word(const char *s, size_t n, const char *w) {
    size_t m = strlen(w);
    for (const char *p = s; (p = find_bytes(p, n - (size_t)(p - s), w)); p++) {
        int before = p > s && (isalnum_c(p[-1]));
        int after = (size_t)(p + m - s) < n && isalnum_c(p[m]);
        if (!before && !after)
            return 1;
    }
    return 0;
}

static void check_clean(const char *fname, const char *data, size_t n, const char *tdir) {
    char label[300];
    snprintf(label, sizeof label, "no paths or dates in %s", fname);
    CASE(label);
    /* a --templates folder is named in #line on purpose; drop those lines */
    char *copy = malloc(n + 1);
    size_t o = 0;
    for (const char *p = data; p < data + n;) {
        const char *e = memchr(p, '\n', (size_t)(data + n - p));
        size_t l = e ? (size_t)(e - p) + 1 : (size_t)(data + n - p);
        int skip = tdir && l > 6 && strncmp(p, "#line ", 6) == 0 && find_bytes(p, l, tdir);
        if (!skip) {
            memcpy(copy + o, p, l);
            o += l;
        }
        p += l;
    }
    copy[o] = '\0';
    char cwd[1024] = "";
    if (!getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    const char *home = getenv("HOME");
    const char *paths[] = {"/work", "/tmp", "/home/", "/root", "/usr/", cwd[0] ? cwd : NULL,
                           home && strlen(home) > 1 ? home : NULL, tmp_root};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (paths[i])
            CHECKF(find_bytes(copy, o, paths[i]) == NULL, "%s names '%s'", fname, paths[i]);
    /* user names (skipped when they are ordinary words) */
    const char *users[3] = {getenv("USER"), getenv("LOGNAME"), NULL};
    struct passwd *pw = getpwuid(getuid());
    users[2] = pw ? pw->pw_name : NULL;
    for (int i = 0; i < 3; i++)
        if (users[i] && strlen(users[i]) >= 3 && strcmp(users[i], "root") != 0)
            CHECKF(!has_word(copy, o, users[i]), "%s names the user '%s'", fname, users[i]);
    /* dates: this year (and the next, around New Year) as a word, ISO dates, clock times */
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    for (int y = tm.tm_year + 1900 - 1; y <= tm.tm_year + 1900 + 1; y++) {
        char ys[8];
        snprintf(ys, sizeof ys, "%d", y);
        CHECKF(!has_word(copy, o, ys), "%s carries the year %s", fname, ys);
    }
    for (size_t i = 0; i + 10 <= o; i++) {
        const char *p = copy + i;
#define D(k) (p[k] >= '0' && p[k] <= '9')
        int iso = p[0] == '2' && p[1] == '0' && D(2) && D(3) && p[4] == '-' && D(5) && D(6) && p[7] == '-' && D(8) && D(9);
        int clock = i + 8 <= o && D(0) && D(1) && p[2] == ':' && D(3) && D(4) && p[5] == ':' && D(6) && D(7);
#undef D
        if (iso || clock) {
            CHECKF(0, "%s carries a date or time: '%.10s'", fname, p);
            break;
        }
    }
    free(copy);
}

static int contains_ci(const char *s, size_t n, const char *w) {
    size_t m = strlen(w);
    for (size_t i = 0; i + m <= n; i++) {
        size_t j = 0;
        while (j < m && tolower_c(s[i + j]) == tolower_c(w[j]))
            j++;
        if (j == m)
            return 1;
    }
    return 0;
}

/* The stamp: generator version, where the file came from, the spec hash and
 * "do not edit", all in the file's first lines. */
static void check_stamp(const char *fname, const char *data, size_t n, const moe_spec_t *s) {
    char label[300];
    snprintf(label, sizeof label, "stamp of %s", fname);
    CASE(label);
    size_t head = 0;
    for (int lines = 0; head < n && lines < 6; head++)
        lines += data[head] == '\n';
    CHECKF(find_bytes(data, head, "moegen " MOEGEN_VERSION) != NULL, "%s: no generator version in its first lines",
           fname);
    CHECKF(find_bytes(data, head, s->hash) != NULL, "%s: no spec hash in its first lines", fname);
    CHECKF(contains_ci(data, head, "do not edit"), "%s: no \"Do not edit\" in its first lines", fname);
    /* the command that regenerates a user's folder (not `make kernels`) */
    char regen[160];
    snprintf(regen, sizeof regen, "moegen emit %s.moe -o DIR", s->name);
    CHECKF(find_bytes(data, head, regen) != NULL && !find_bytes(data, head, "make kernels"),
           "%s: the stamp does not say `%s`", fname, regen);
    size_t l = strlen(fname);
    const char *spdx = l > 4 && strcmp(fname + l - 4, ".moe") == 0 ? "-- SPDX-License-Identifier: MIT\n"
                       : strcmp(fname, "manifest.json") == 0  ? "{\n  \"SPDX-License-Identifier\": \"MIT\",\n"
                                                              : "// SPDX-License-Identifier: MIT\n";
    CHECKF(strncmp(data, spdx, strlen(spdx)) == 0, "%s does not open with its SPDX line", fname);
    const char *after = strchr(data, '\n') ? strchr(data, '\n') + 1 : data;
    if (l > 3 && strcmp(fname + l - 3, ".cu") == 0) {
        CHECKF(strncmp(after, "/* Generated by moegen " MOEGEN_VERSION " from ", 27) == 0, "%s", fname);
        for (size_t i = 0; i < NKT; i++) {
            char w[96];
            snprintf(w, sizeof w, "templates/%s.lua", kernel_templates[i]);
            CHECKF(find_bytes(data, head, w) != NULL, "%s: the stamp does not name %s", fname, w);
        }
        CHECKF(find_bytes(data, head, "templates/prelude.lua") != NULL, "%s", fname);
        /* every template that contributed lines (#line names it) is in the stamp */
        for (const char *p = data; (p = find_bytes(p, n - (size_t)(p - data), "\n#line ")); p++) {
            const char *q = memchr(p + 1, '"', (size_t)(data + n - p - 1));
            const char *e = q ? memchr(q + 1, '"', (size_t)(data + n - q - 1)) : NULL;
            if (!q || !e || e - q < 5 || memcmp(e - 4, ".lua", 4) != 0)
                continue;
            char name[300];
            snprintf(name, sizeof name, "%.*s", (int)(e - q - 1), q + 1);
            if (strchr(name, '/') && strncmp(name, "templates/", 10) != 0)
                continue; /* a --templates folder */
            CHECKF(find_bytes(data, head, name) != NULL, "%s: lines come from %s, which the stamp does not name", fname,
                   name);
            if (!find_bytes(data, head, name))
                break;
        }
    } else if (l > 2 && strcmp(fname + l - 2, ".h") == 0) {
        CHECKF(strncmp(after, "/* Generated by moegen " MOEGEN_VERSION " from ", 27) == 0, "%s", fname);
    }
}

/* The vendored files outside moegen: NAME.h compiles as C (NAME_forward is
 * declared for plain C and C++ host files, not only under nvcc), and
 * NAME.cu built for sm_90 instead of sm_90a stops at compile time with the
 * flags to use (it compiled and trapped in every forward). Both with the
 * CUDA toolkit's headers and nvcc; skipped where they are absent. */
static void test_vendored_build(void) {
    const char *cuda = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
    const char *dir = "kernels_out/qwen3-30b-a3b", *name = "qwen3_30b_a3b";
    char path[600], cmd[2048];
    snprintf(path, sizeof path, "%s/include/cuda_runtime_api.h", cuda);
    CASE("vendored: NAME.h compiles as C and declares NAME_forward");
    if (!exists(path)) {
        SKIP("no %s", path);
        return;
    }
    char src[400];
    snprintf(src, sizeof src, "%s/vendored_c.c", tmp_root);
    snprintf(cmd, sizeof cmd,
             "#include \"%s.h\"\n"
             "cudaError_t run(const %s_args_t *a, cudaStream_t s) { return %s_forward(a, s); }\n"
             "void pack(const unsigned short *w, unsigned short *p) { %s_pack_w1(w, p); }\n",
             name, name, name, name);
    CHECK(write_text(src, cmd) == 0);
    snprintf(cmd, sizeof cmd, "cc -std=c11 -Wall -Wextra -Werror -pedantic -c %s -I%s -I%s/include -o %s.o 2>&1", src,
             dir, cuda, src);
    CHECKF(system(cmd) == 0, "%s failed", cmd);
    CASE("vendored: NAME.cu built for sm_90 (not sm_90a) stops with the flags to use");
    snprintf(path, sizeof path, "%s/bin/nvcc", cuda);
    if (!exists(path)) {
        SKIP("no %s", path);
        return;
    }
    snprintf(cmd, sizeof cmd, "%s -std=c++17 -c -gencode arch=compute_90,code=sm_90 -I%s %s/%s.cu -o %s/v90.o 2>&1",
             path, dir, dir, name, tmp_root);
    FILE *f = popen(cmd, "r");
    char out[8192] = "";
    size_t got = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[got] = '\0';
    int st = f ? pclose(f) : -1;
    CHECKF(st != 0 && strstr(out, "#error") && strstr(out, "-gencode arch=compute_90a,code=sm_90a"),
           "status %d: %s", st, out);
}

/* An fp8 spec's vendored files (quant.weights = "fp8_e4m3"): NAME_args_t
 * carries the scales, NAME.h declares NAME_quantize and NAME_pack_fp8, and
 * NAME_forward launches the quantizing scatter and the fp8 GEMMs on
 * one-byte tensor maps with their scales instead of refusing; a bf16
 * spec's header has none of it. (make test-vendored-fp8 runs them.) */
static void test_vendored_fp8(void) {
    static const char *const specs[] = {"examples/specs/fp8/qwen3-30b-a3b-fp8.moe",
                                        "examples/specs/fp8/mixtral-8x7b-fp8.moe", "examples/specs/qwen3-30b-a3b.moe"};
    if (!have_templates)
        return;
    for (size_t si = 0; si < sizeof specs / sizeof *specs; si++) {
        char label[300];
        snprintf(label, sizeof label, "vendored fp8 API: %s", specs[si]);
        CASE(label);
        moe_plan_desc_t pd;
        if (load_plan(specs[si], NULL, 0, &pd)) {
            CHECKF(0, "%s does not load", specs[si]);
            continue;
        }
        const int fp8 = moe_spec_fp8(&pd.spec);
        moe_fileset_t fs = {0};
        moe_diag_t d;
        if (moe_emit_files(&pd, NULL, &fs, &d)) {
            CHECKF(0, "%s", d.msg);
            moe_fileset_free(&fs);
            moe_plan_desc_free(&pd);
            continue;
        }
        const char *h = NULL, *cu = NULL;
        for (int i = 0; i < fs.nfiles; i++) {
            const size_t n = strlen(fs.files[i].path);
            if (n > 2 && !strcmp(fs.files[i].path + n - 2, ".h"))
                h = fs.files[i].data.data;
            if (n > 3 && !strcmp(fs.files[i].path + n - 3, ".cu"))
                cu = fs.files[i].data.data;
        }
        CHECK(h && cu);
        if (h && cu) {
            const char *n = pd.spec.name;
            char want[4][200];
            snprintf(want[0], sizeof want[0], "const float *w1s;");
            snprintf(want[1], sizeof want[1], "cudaError_t %s_quantize(int tensor,", n);
            snprintf(want[2], sizeof want[2], "cudaError_t %s_pack_fp8(int tensor,", n);
            snprintf(want[3], sizeof want[3], "extern \"C\" cudaError_t %s_quantize(", n);
            for (int i = 0; i < 3; i++)
                CHECKF((strstr(h, want[i]) != NULL) == fp8, "%s: NAME.h %s \"%s\"", specs[si],
                       fp8 ? "lacks" : "has", want[i]);
            CHECKF((strstr(cu, want[3]) != NULL) == fp8, "%s: NAME.cu %s NAME_quantize", specs[si], fp8 ? "lacks" : "has");
            const char *fwd = strstr(cu, "_forward(const ");
            const char *end = fwd ? strstr(fwd, "\n}\n") : NULL;
            CHECK(fwd && end);
            char *body = fwd && end ? strndup(fwd, (size_t)(end - fwd)) : NULL;   /* NAME_forward alone */
            if (body) {
                const int scales = strstr(body, "xsc, a->w1s, (const moe_half_t *)a->b1p") != NULL &&
                                   strstr(body, "hsc, a->w2s, (const moe_half_t *)a->b2") != NULL;
                CHECKF(strstr(body, "cudaErrorNotSupported") == NULL, "%s: NAME_forward refuses", specs[si]);
                CHECKF(scales == fp8, "%s: NAME_forward %s the fp8 GEMMs' scales", specs[si], fp8 ? "lacks" : "has");
                free(body);
            }
            if (fp8)
                CHECKF(strstr(cu, "moe_tmap_geom8(rows, k, box_rows)") != NULL, "%s: no one-byte tensor maps", specs[si]);
            /* "channel" scales on the persistent grid (the Mixtral spec's 4096-token bucket): the up GEMM
             * copies its tile's scales into shared memory (templates/gemm_sm90.lua's cs_smem); the block-scaled
             * Qwen3 spec's kernels never do */
            const char *persist_up = strstr(cu, "_gemm_up_swiglu_e4m3_channel_sm90a_tma_persist_");
            const int channel = fp8 && pd.spec.quant.scaling == MOE_SCALING_CHANNEL;
            CHECKF((persist_up != NULL) == channel, "%s: a persistent channel-scaled up GEMM %s", specs[si],
                   channel ? "missing" : "emitted");
            CHECKF((strstr(cu, "cp_async4(csb + (ct & 127) * 4, src);") != NULL) == channel,
                   "%s: the up GEMM's channel scales %s staged in shared memory", specs[si],
                   channel ? "not" : "unexpectedly");
        }
        moe_fileset_free(&fs);
        moe_plan_desc_free(&pd);
    }
}

static void test_determinism(void) {
    CASE("determinism");
    char tdir[300];
    const char *templates = NULL;
    if (!have_templates) {
        snprintf(tdir, sizeof tdir, "%s/tpl_det", tmp_root);
        CHECK(make_templates(tdir, 0) == 0);
        templates = tdir;
        fprintf(stderr, "test_emit: determinism and stamps use stubs for the absent kernel templates\n");
    }
    static const char *const specs[] = {SMALL, "examples/specs/deepseek-v3.moe", "examples/specs/gpt-oss-120b.moe"};
    for (size_t si = 0; si < sizeof specs / sizeof *specs; si++) {
        char label[300];
        snprintf(label, sizeof label, "determinism %s", specs[si]);
        CASE(label);
        moe_plan_desc_t pd;
        if (load_plan(specs[si], NULL, 0, &pd)) {
            CHECKF(0, "%s does not load", specs[si]);
            continue;
        }
        moe_fileset_t a = {0}, b = {0};
        moe_diag_t d;
        int rc = moe_emit_files(&pd, templates, &a, &d);
        CHECKF(rc == 0, "%s", d.msg);
        rc |= moe_emit_files(&pd, templates, &b, &d);
        CHECKF(rc == 0, "%s", d.msg);
        if (!rc) {
            CHECK(a.nfiles == b.nfiles && a.nfiles == 4);
            for (int i = 0; i < a.nfiles && i < b.nfiles; i++) {
                CASE(label);
                CHECKF(a.files[i].data.len == b.files[i].data.len &&
                           memcmp(a.files[i].data.data, b.files[i].data.data, a.files[i].data.len) == 0,
                       "%s differs between two emits", a.files[i].path);
                check_clean(a.files[i].path, a.files[i].data.data, a.files[i].data.len, templates);
                check_stamp(a.files[i].path, a.files[i].data.data, a.files[i].data.len, &pd.spec);
            }
        }
        moe_fileset_free(&a);
        moe_fileset_free(&b);
        moe_plan_desc_free(&pd);
    }

    CASE("determinism: two runs of moegen emit");
    char o1[300], o2[300], args[1200], why[1400], *err;
    snprintf(o1, sizeof o1, "%s/det1", tmp_root);
    snprintf(o2, sizeof o2, "%s/det2", tmp_root);
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "emit %s -o %s%s%s", SMALL, i ? o2 : o1, templates ? " --templates " : "",
                 templates ? templates : "");
        int rc = run_moegen(args, &err);
        CHECKF(rc == 0, "exit %d: %s", rc, err);
        free(err);
    }
    CHECKF(compare_dirs(o1, o2, why, sizeof why) == 0, "%s", why);
}


/* ---- kernels_out/ ---------------------------------------------------------------- */

/* Every kernel's first statement is the prelude's moe_pdl_begin() (after an
 * arch guard's #if line): a plan launched with MOEGEN_PDL=on starts each
 * kernel before the one ahead of it has finished, and only that wait keeps
 * it from touching memory early (docs/DESIGN.md, "Launch overlap").
 * Returns the kernels seen. */
static int check_pdl_first(const char *fname, const char *data, size_t n) {
    int kernels = 0;
    for (const char *p = data; (p = find_bytes(p, n - (size_t)(p - data), "__global__")); p++) {
        const char *b = memchr(p, '{', n - (size_t)(p - data)); /* signatures hold no braces */
        if (!b)
            break;
        const char *q = b + 1, *end = data + n;
        for (;;) { /* whitespace, then whole preprocessor lines (the arch guard) */
            while (q < end && isspace((unsigned char)*q))
                q++;
            if (q < end && *q == '#') {
                const char *e = memchr(q, '\n', (size_t)(end - q));
                q = e ? e : end;
                continue;
            }
            break;
        }
        static const char first[] = "moe_pdl_begin();";
        CHECKF((size_t)(end - q) >= sizeof first - 1 && !strncmp(q, first, sizeof first - 1),
               "%s: the kernel at '%.100s' does not start with %s", fname, p, first);
        kernels++;
        p = b;
    }
    return kernels;
}

static void test_kernels_out(void) {
    CASE("kernels_out");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent: kernels_out/ cannot be emitted yet", missing_template);
        return;
    }
    static char names[64][256];
    int n = list_dir("examples/specs", names, 64);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        if (l <= 4 || strcmp(names[i] + l - 4, ".moe"))
            continue;
        char base[256], committed[300], fresh[600], args[1400], why[1400], label[300], *err;
        snprintf(base, sizeof base, "%.*s", (int)(l - 4), names[i]);
        snprintf(label, sizeof label, "kernels_out/%s", base);
        CASE(label);
        snprintf(committed, sizeof committed, "kernels_out/%s", base);
        snprintf(fresh, sizeof fresh, "%s/kernels_out/%s", tmp_root, base);
        snprintf(args, sizeof args, "emit examples/specs/%s -o %s", names[i], fresh);
        int rc = run_moegen(args, &err);
        CHECKF(rc == 0, "exit %d: %s", rc, err);
        free(err);
        if (!exists(committed)) {
            CHECKF(0, "%s is missing: run make kernels and commit it", committed);
            continue;
        }
        CHECKF(compare_dirs(committed, fresh, why, sizeof why) == 0, "%s (run make kernels and commit)", why);
    }
}


/* check_pdl_first over the sources of every example spec (the fp8 ones
 * too), the training specs the tests use (the backward's kernels) and the
 * tuning tables that put the GEMMs on the other grids. */
static void test_pdl_first(void) {
    CASE("every emitted kernel starts with moe_pdl_begin()");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent", missing_template);
        return;
    }
    static const char *const runs[][2] = {
        {"examples/specs/qwen3-30b-a3b.moe", NULL},          {"examples/specs/deepseek-v3-ep8-mesh.moe", NULL},
        {"examples/specs/gpt-oss-20b.moe", NULL},            {"examples/specs/kimi-k2.moe", NULL},
        {"examples/specs/fp8/qwen3-30b-a3b-fp8.moe", NULL},  {"examples/specs/fp8/deepseek-v3-ep8-mesh-fp8.moe", NULL},
        {"tests/specs/training.moe", NULL},                  {"tests/specs/train_ep.moe", NULL},
        {"tests/specs/train_gptoss.moe", NULL},              {"tests/specs/train_shared.moe", NULL},
        {"examples/specs/qwen3-30b-a3b.moe", "tests/tune/pingpong.tune"},
        {"examples/specs/qwen3-30b-a3b.moe", "tests/tune/splitk.tune"},
        {"examples/specs/qwen3-30b-a3b.moe", "tests/tune/persist.tune"},
        {"examples/specs/fp8/qwen3-30b-a3b-fp8.moe", "tests/tune/fp8.tune"},
    };
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        char out[600], args[1400], label[400], *err;
        snprintf(label, sizeof label, "moe_pdl_begin() first: %s%s%s", runs[r][0], runs[r][1] ? " under " : "",
                 runs[r][1] ? runs[r][1] : "");
        CASE(label);
        snprintf(out, sizeof out, "%s/pdl%zu", tmp_root, r);
        snprintf(args, sizeof args, "emit %s%s%s -o %s", runs[r][0], runs[r][1] ? " --tuning " : "",
                 runs[r][1] ? runs[r][1] : "", out);
        int rc = run_moegen(args, &err);
        CHECKF(rc == 0, "exit %d: %s", rc, err);
        free(err);
        static char files[16][256];
        int nf = list_dir(out, files, 16), kernels = 0;
        for (int f = 0; f < nf; f++) {
            size_t fl = strlen(files[f]), len;
            if (fl < 3 || strcmp(files[f] + fl - 3, ".cu"))
                continue;
            char path[900];
            snprintf(path, sizeof path, "%s/%s", out, files[f]);
            char *src = read_bytes(path, &len);
            CHECKF(src != NULL, "cannot read %s", path);
            if (src)
                kernels += check_pdl_first(files[f], src, len);
            free(src);
        }
        /* route, permute plan and scatter, the GEMMs' variants, combine at least */
        CHECKF(kernels >= 6, "%s: %d kernels found", out, kernels);
    }
}

int main(void) {
    if (gen_fixture_setup("test_emit"))
        return 1;
    double t = now();
    test_golden_small();
    test_golden_gemv();
    test_vendored_build();
    test_vendored_fp8();
    test_determinism();
    fprintf(stderr, "test_emit: emission cases in %.1f s\n", now() - t);
    test_kernels_out();
    test_pdl_first();
    rm_rf(tmp_root);
    return check_report("test_emit");
}
