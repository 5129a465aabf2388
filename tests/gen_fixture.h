/* gen_fixture.h — what the generator's test programs share (test_emit,
 * test_write, test_nvrtc, test_cache): file helpers, running build/moegen,
 * loading a plan, and template folders with stubs for the machinery cases.
 *
 * Each program calls gen_fixture_setup() first: it makes the program's own
 * temporary folder (tmp_root) and notes whether every kernel template is in
 * templates/. Until every kernel template exists (route, permute,
 * gemm_up_swiglu, gemm_down, combine, swiglu), the cases that need the real kernels
 * are skipped; the machinery cases use a copy of templates/ in which absent
 * kernel templates are replaced by small stubs (make_templates). Run from the
 * repository root. */
#ifndef MOEGEN_GEN_FIXTURE_H
#define MOEGEN_GEN_FIXTURE_H

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "emit.h"
#include "plan.h"
#include "spec.h"

#define MOEGEN MOEGEN_BUILD "/moegen"
#define SMALL "tests/specs/small.moe"
#define GOLDEN_DIR "tests/golden/small"

static char tmp_root[256];
static int have_templates;        /* every kernel template is in templates/ */
static char missing_template[64]; /* the first absent one, for skip reasons */

static const char *const kernel_templates[] = {"route", "permute", "gemm_up_swiglu", "gemm_down", "combine", "swiglu"};
#define NKT (sizeof kernel_templates / sizeof *kernel_templates)

/* ---- helpers -------------------------------------------------------------- */

static inline char *read_bytes(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 65536, n = 0, r;
    char *s = malloc(cap);
    while (s && (r = fread(s + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            char *t = realloc(s, cap *= 2);
            if (!t)
                free(s);
            s = t;
        }
    }
    fclose(f);
    if (!s)
        return NULL;
    s[n] = '\0';
    if (len)
        *len = n;
    return s;
}

static inline int write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static inline int write_text(const char *path, const char *text) { return write_bytes(path, text, strlen(text)); }

static inline int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline int rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd);
}

static inline const char *find_bytes(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; m && i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0)
            return hay + i;
    return NULL;
}

static inline int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted entry names of dir (no . and ..); returns the count, -1 if unreadable. */
static inline int list_dir(const char *dir, char names[][256], int max) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    char *tmp[512];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max && n < 512)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            tmp[n++] = strdup(e->d_name);
    closedir(d);
    qsort(tmp, (size_t)n, sizeof *tmp, by_name);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 256, "%s", tmp[i]);
        free(tmp[i]);
    }
    return n;
}

/* 0 when folders a and b hold the same file names with the same bytes;
 * else 1 with the first difference in why. */
static inline int compare_dirs(const char *a, const char *b, char *why, size_t wn) {
    static char na[64][256], nb[64][256];
    int ca = list_dir(a, na, 64), cb = list_dir(b, nb, 64);
    if (ca < 0 || cb < 0) {
        snprintf(why, wn, "cannot read %s", ca < 0 ? a : b);
        return 1;
    }
    for (int i = 0; i < ca || i < cb; i++) {
        if (i >= ca || i >= cb || strcmp(na[i], nb[i]) != 0) {
            snprintf(why, wn, "%s has '%s' where %s has '%s'", a, i < ca ? na[i] : "(nothing)", b,
                     i < cb ? nb[i] : "(nothing)");
            return 1;
        }
        char pa[600], pb[600];
        snprintf(pa, sizeof pa, "%s/%s", a, na[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, nb[i]);
        size_t la = 0, lb = 0;
        char *da = read_bytes(pa, &la), *db = read_bytes(pb, &lb);
        int same = da && db && la == lb && memcmp(da, db, la) == 0;
        free(da);
        free(db);
        if (!same) {
            snprintf(why, wn, "%s and %s differ", pa, pb);
            return 1;
        }
    }
    return 0;
}

/* Run `build/moegen ARGS`; *err receives stderr (caller frees; may be NULL).
 * Returns the exit status, -1 when it did not exit normally. */
static inline int run_moegen(const char *args, char **err) {
    char cmd[4096], e[300];
    snprintf(e, sizeof e, "%s/stderr", tmp_root);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>%s </dev/null", MOEGEN, args, e);
    int st = system(cmd);
    char *se = read_bytes(e, NULL);
    if (err)
        *err = se ? se : calloc(1, 1);
    else
        free(se);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline int load_plan(const char *path, const moe_override_t *o, int no, moe_plan_desc_t *pd) {
    moe_spec_t s;
    moe_diag_t d;
    if (moe_spec_load(&s, path, NULL, o, no, &d)) {
        fprintf(stderr, "%s\n", d.msg);
        return 1;
    }
    char err[512];
    if (moe_plan_desc_build(pd, &s, moe_tuning_default(), err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", path, err);
        return 1;
    }
    return 0;
}

/* The first line of s (without the newline), into out. */
static inline const char *first_line(const char *s, char *out, size_t n) {
    const char *e = strchr(s, '\n');
    snprintf(out, n, "%.*s", (int)(e ? e - s : (long)strlen(s)), s);
    return out;
}

/* ---- template folders for the machinery cases ------------------------------ */

static const char *const stub_prelude =
    "@ -- test stub: the prelude\n"
    "@ local M = {}\n"
    "@ function M.prelude(p)\n"
    "typedef unsigned short moe_half_t;   /* ${p.dtype} bits */\n"
    "typedef struct { int expert, row_start, rows, pad; } moe_tile_t;\n"
    "static __device__ __forceinline__ void moe_pdl_begin() {}  /* the real kernels' first statement */\n"
    "@ end\n"
    "@ return M\n";
static const char *const stub_route =
    "@ -- test stub: route\n"
    "extern \"C\" __global__ void ${p.kernel}(int *counts) { if (counts) counts[0] = ${p.E}; }\n";
static const char *const stub_permute =
    "@ -- test stub: permute\n"
    "extern \"C\" __global__ void ${p.plan_kernel}(int *offsets) { if (offsets) offsets[0] = ${p.align}; }\n"
    "extern \"C\" __global__ void ${p.scatter_kernel}(int *rows) { if (rows) rows[0] = ${p.K}; }\n";
static const char *const stub_kernel =
    "@ -- test stub: a kernel family\n"
    "extern \"C\" __global__ void ${p.kernel}(int *x) { if (x) x[0] = ${p.threads}; }\n";

static inline const char *stub_for(const char *name) {
    if (strcmp(name, "prelude") == 0)
        return stub_prelude;
    if (strcmp(name, "route") == 0)
        return stub_route;
    if (strcmp(name, "permute") == 0)
        return stub_permute;
    return stub_kernel;
}

static inline int put_template(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s.lua", dir, name);
    return write_text(p, text);
}

/* Make dir a copy of the .lua files of templates/. all_stubs: replace the prelude and
 * every kernel template by a stub (a fast compile); else stub only the
 * kernel templates templates/ lacks. Returns 0 or -1. */
static inline int make_templates(const char *dir, int all_stubs) {
    if (mkdir(dir, 0777) && errno != EEXIST)
        return -1;
    static char names[128][256];
    int n = list_dir("templates", names, 128);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        if (l < 5 || strcmp(names[i] + l - 4, ".lua"))
            continue;
        char src[600], dst[600];
        snprintf(src, sizeof src, "templates/%s", names[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, names[i]);
        size_t len;
        char *data = read_bytes(src, &len);
        if (!data || write_bytes(dst, data, len)) {
            free(data);
            return -1;
        }
        free(data);
    }
    if (all_stubs && put_template(dir, "prelude", stub_prelude))
        return -1;
    for (size_t i = 0; i < NKT; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s.lua", dir, kernel_templates[i]);
        if ((all_stubs || !exists(p)) && put_template(dir, kernel_templates[i], stub_for(kernel_templates[i])))
            return -1;
    }
    return 0;
}

/* Put `prefix` in front of dir/NAME.lua. */
static inline int prepend_template(const char *dir, const char *name, const char *prefix) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s.lua", dir, name);
    size_t len;
    char *old = read_bytes(p, &len);
    if (!old)
        return -1;
    size_t pl = strlen(prefix);
    char *s = malloc(pl + len + 1);
    memcpy(s, prefix, pl);
    memcpy(s + pl, old, len + 1);
    int rc = write_bytes(p, s, pl + len);
    free(s);
    free(old);
    return rc;
}


/* Make this program's temporary folder (TMPDIR or /tmp, named after prog),
 * note whether the kernel templates are all there, and check build/moegen
 * exists. Returns 0, or 1 when no folder could be made. */
static inline int gen_fixture_setup(const char *prog) {
    const char *td = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/moegen_%s.XXXXXX", td && *td ? td : "/tmp", prog);
    if (!mkdtemp(tmp_root)) {
        perror(tmp_root);
        return 1;
    }
    have_templates = 1;
    for (size_t i = 0; i < NKT; i++) {
        char p[128];
        snprintf(p, sizeof p, "templates/%s.lua", kernel_templates[i]);
        if (!exists(p)) {
            have_templates = 0;
            snprintf(missing_template, sizeof missing_template, "%s", kernel_templates[i]);
            break;
        }
    }
    CASE("setup");
    CHECKF(access(MOEGEN, X_OK) == 0, "%s is missing (run make)", MOEGEN);
    return 0;
}

/* The host C++ compiler that builds emitted kernels against
 * tests/support/cuda_host.h (test_gemv_host, test_bwd_host): $CXX, else c++;
 * 1 when it compiles C++17 with <ucontext.h> (the fibers), else 0. Call
 * after gen_fixture_setup. */
static inline int host_cxx(const char **cxx) {
    *cxx = getenv("CXX") && *getenv("CXX") ? getenv("CXX") : "c++";
    char probe[700];
    snprintf(probe, sizeof probe, "printf '#include <ucontext.h>\\nint main(){ucontext_t c; return getcontext(&c);}\\n' | "
             "%s -std=c++17 -x c++ - -o %s/probe >/dev/null 2>&1", *cxx, tmp_root);
    return system(probe) == 0;
}

/* A host test's case (test_scatter_host, test_bwd_host, test_route_host):
 * a spec and the token counts its built program runs. */
typedef struct {
    const char *label, *spec; /* a spec file, or a spec's text */
    int tokens[3], ntokens;
} host_case_t;

/* A host test's whole main: the fixture, then run(case, cxx) for each of
 * cases[0..n), or one skip (`what`) without a C++17 compiler with
 * <ucontext.h>; the report under prog's name. */
static inline int host_main(const char *prog, const char *what, const host_case_t *cases, int n,
                            void (*run)(const host_case_t *, const char *)) {
    if (gen_fixture_setup(prog))
        return 1;
    const char *cxx;
    if (!host_cxx(&cxx)) {
        CASE(what);
        SKIP("no C++17 compiler with <ucontext.h> (%s; set CXX)", cxx);
    } else {
        for (int i = 0; i < n; i++)
            run(&cases[i], cxx);
    }
    rm_rf(tmp_root);
    return check_report(prog);
}

/* Kernel `name` out of src into b: its namespace NAME_impl through the
 * kernel's closing brace, the dynamic shared memory array `smem` declared
 * as host_smem() instead. 0, or 1 when it is not there whole. */
static inline int host_cut_kernel(const char *src, const char *name, const char *smem, moe_buf_t *b) {
    char open[200], head[200], shared[240];
    snprintf(open, sizeof open, "namespace %s_impl {", name);
    snprintf(head, sizeof head, "\n%s(", name);
    snprintf(shared, sizeof shared, "extern __shared__ __align__(16) unsigned char %s[];", smem);
    const char *from = strstr(src, open), *k = from ? strstr(from, head) : NULL, *end = k ? strstr(k, "\n}\n") : NULL;
    const char *sm = k ? strstr(k, shared) : NULL;
    if (!end || !sm || sm > end)
        return 1;
    moe_buf_printf(b, "%.*s", (int)(sm - from), from);
    moe_buf_printf(b, "unsigned char *%s = host_smem();", smem);
    sm += strlen(shared);
    moe_buf_printf(b, "%.*s\n", (int)(end + 3 - sm), sm);
    return 0;
}

/* A host test's case planned: spec is a path when it has no newline, else
 * the spec's text (named case.moe), with overrides o[0..no), under table
 * (NULL: none). 0, or 1 after a failed check saying why. */
static inline int host_case_plan(const char *spec, const moe_override_t *o, int no, const moe_tuning_t *table,
                                 moe_spec_t *s, moe_plan_desc_t *pd) {
    moe_diag_t d;
    const int file = strchr(spec, '\n') == NULL;
    if (moe_spec_load(s, file ? spec : "case.moe", file ? NULL : spec, o, no, &d)) {
        CHECKF(0, "%s", d.msg);
        return 1;
    }
    char err[512];
    if (moe_plan_desc_build(pd, s, table, err, sizeof err)) {
        CHECKF(0, "%s", err);
        return 1;
    }
    return 0;
}

/* Run a host test's built program bin as `bin SEED ARG` for seeds 0 and 1
 * and each of args[0..nargs), each pair of seeds a check (what: its
 * failure). The two seeds run at once (the emulated kernels run on one
 * core each; CI has two). */
static inline void host_run_seeds(const char *bin, const int *args, int nargs, const char *what) {
    char cmd[1400];
    for (int i = 0; i < nargs; i++) {
        snprintf(cmd, sizeof cmd, "'%s' 0 %d & p=$!; '%s' 1 %d; b=$?; wait $p; a=$?; [ $a -eq 0 ] && [ $b -eq 0 ]", bin,
                 args[i], bin, args[i]);
        fflush(NULL);
        CHECKF(system(cmd) == 0, "seeds 0 and 1: %s: %s", cmd, what);
    }
}

/* The text from `from` through the end of `to` (both in src, in order)
 * into b, for a host test's force-included kernels; 1 when either is not
 * there. */
/* runtime/fp8.c and half.c (fp8.c's dependency) as objects for the fp8
 * cases' reference, built once into tmp_root; the link arguments, or NULL. */
static inline const char *fp8_objects(void) {
    static char objs[900];
    static int state; /* 0 not built, 1 built, -1 failed */
    if (state == 0) {
        char cmd[2000];
        snprintf(cmd, sizeof cmd,
                 "cc -std=c11 -O2 -Iruntime -Igen -c runtime/fp8.c -o %s/fp8.o && "
                 "cc -std=c11 -O2 -Iruntime -Igen -c runtime/half.c -o %s/half.o", tmp_root, tmp_root);
        snprintf(objs, sizeof objs, "%s/fp8.o %s/half.o", tmp_root, tmp_root);
        state = system(cmd) == 0 ? 1 : -1;
    }
    return state == 1 ? objs : NULL;
}

static inline int host_cut_span(const char *src, const char *from, const char *to, moe_buf_t *b) {
    const char *a = strstr(src, from), *z = a ? strstr(a, to) : NULL;
    if (!z)
        return 1;
    moe_buf_printf(b, "%.*s\n", (int)(z + strlen(to) - a), a);
    return 0;
}

#endif
