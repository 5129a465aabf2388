/* test_gen.c — emission and compilation: the emitted-file goldens of
 * tests/specs/small.moe, determinism and the stamp, all-or-nothing writes
 * (template errors, NVRTC errors, unchanged files), NVRTC compiles of every
 * kernel of every example spec for each arch, kernels_out/ against a fresh
 * emit, and the JIT disk cache.
 *
 * Goldens: tests/golden/small/{small.cu, small.h, manifest.json, small.moe}
 * are a snapshot of the embedded templates' output. Whenever a template
 * changes, regenerate them with
 *     MOEGEN_UPDATE_GOLDENS=1 make test-cpu
 * and review the diff.
 *
 * Until every kernel template exists in templates/ (route, permute,
 * gemm_up_swiglu, gemm_down, combine), the cases that need the real kernels
 * are skipped. The machinery cases (template and NVRTC errors, unchanged
 * files, determinism) always run: they use a copy of templates/ in which
 * absent kernel templates are replaced by small stubs. The cache cases run
 * once on a copy whose prelude and kernel templates are all stubs (fast
 * compiles: they test the cache, not the kernels) and once more on the
 * embedded templates when those are complete. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "check.h"
#include "compile.h"
#include "emit.h"
#include "plan.h"
#include "spec.h"

#define MOEGEN "build/moegen"
#define SMALL "tests/specs/small.moe"
#define GOLDEN_DIR "tests/golden/small"

static char tmp_root[256];
static int have_templates;        /* every kernel template is in templates/ */
static char missing_template[64]; /* the first absent one, for skip reasons */

static const char *const kernel_templates[] = {"route", "permute", "gemm_up_swiglu", "gemm_down", "combine"};
#define NKT (sizeof kernel_templates / sizeof *kernel_templates)

/* ---- helpers -------------------------------------------------------------- */

static char *read_bytes(const char *path, size_t *len) {
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

static int write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int write_text(const char *path, const char *text) { return write_bytes(path, text, strlen(text)); }

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int rm_rf(const char *path) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    return system(cmd);
}

static const char *find_bytes(const char *hay, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = 0; m && i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0)
            return hay + i;
    return NULL;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted entry names of dir (no . and ..); returns the count, -1 if unreadable. */
static int list_dir(const char *dir, char names[][256], int max) {
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
static int compare_dirs(const char *a, const char *b, char *why, size_t wn) {
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
        size_t la, lb;
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
static int run_moegen(const char *args, char **err) {
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

static int load_plan(const char *path, const moe_override_t *o, int no, moe_plan_desc_t *pd) {
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
static const char *first_line(const char *s, char *out, size_t n) {
    const char *e = strchr(s, '\n');
    snprintf(out, n, "%.*s", (int)(e ? e - s : (long)strlen(s)), s);
    return out;
}

/* ---- template folders for the machinery cases ------------------------------ */

static const char *const stub_common =
    "@ -- test stub: the prelude\n"
    "@ local M = {}\n"
    "@ function M.prelude(p)\n"
    "typedef unsigned short moe_half_t;   /* ${p.dtype} bits */\n"
    "typedef struct { int expert, row_start, rows, pad; } moe_tile_t;\n"
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

static const char *stub_for(const char *name) {
    if (strcmp(name, "common") == 0)
        return stub_common;
    if (strcmp(name, "route") == 0)
        return stub_route;
    if (strcmp(name, "permute") == 0)
        return stub_permute;
    return stub_kernel;
}

static int put_template(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s.lua", dir, name);
    return write_text(p, text);
}

/* Make dir a copy of the .lua files of templates/. all_stubs: replace the prelude and
 * every kernel template by a stub (a fast compile); else stub only the
 * kernel templates templates/ lacks. Returns 0 or -1. */
static int make_templates(const char *dir, int all_stubs) {
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
    if (all_stubs && put_template(dir, "common", stub_common))
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
static int prepend_template(const char *dir, const char *name, const char *prefix) {
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
        return;
    }
    static const char *const want_files[] = {"small.cu", "small.h", "manifest.json", "small.moe"};
    CHECK(fs.nfiles == 4);
    for (int i = 0; i < fs.nfiles && i < 4; i++)
        CHECK_STREQ(fs.files[i].path, want_files[i]);

    const char *upd = getenv("MOEGEN_UPDATE_GOLDENS");
    if (upd && strcmp(upd, "1") == 0) {
        char err[256];
        CHECKF(moe_mkdirs(GOLDEN_DIR, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < fs.nfiles; i++) {
            char p[600];
            snprintf(p, sizeof p, "%s/%s", GOLDEN_DIR, fs.files[i].path);
            CHECKF(write_bytes(p, fs.files[i].data.data, fs.files[i].data.len) == 0, "cannot write %s", p);
            fprintf(stderr, "test_gen: MOEGEN_UPDATE_GOLDENS=1: wrote %s\n", p);
        }
    } else {
        for (int i = 0; i < fs.nfiles; i++) {
            char p[600], label[300];
            snprintf(p, sizeof p, "%s/%s", GOLDEN_DIR, fs.files[i].path);
            snprintf(label, sizeof label, "golden %s", p);
            CASE(label);
            size_t wl;
            char *want = read_bytes(p, &wl);
            CHECKF(want != NULL, "%s is missing: run MOEGEN_UPDATE_GOLDENS=1 make test-cpu", p);
            if (!want)
                continue;
            const moe_buf_t *b = &fs.files[i].data;
            int same = wl == b->len && memcmp(want, b->data, wl) == 0;
            CHECKF(same, "%s differs from the emitted file; if a template changed on purpose, regenerate with "
                         "MOEGEN_UPDATE_GOLDENS=1 make test-cpu and review the diff", p);
            if (!same)
                report_first_diff(p, b->data, b->len, want, wl);
            free(want);
        }
    }

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
    size_t l = strlen(fname);
    if (l > 3 && strcmp(fname + l - 3, ".cu") == 0) {
        CHECKF(strncmp(data, "/* Generated by moegen " MOEGEN_VERSION " from ", 27) == 0, "%s", fname);
        for (size_t i = 0; i < NKT; i++) {
            char w[96];
            snprintf(w, sizeof w, "templates/%s.lua", kernel_templates[i]);
            CHECKF(find_bytes(data, head, w) != NULL, "%s: the stamp does not name %s", fname, w);
        }
        CHECKF(find_bytes(data, head, "templates/common.lua") != NULL, "%s", fname);
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
        CHECKF(strncmp(data, "/* Generated by moegen " MOEGEN_VERSION " from ", 27) == 0, "%s", fname);
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
        fprintf(stderr, "test_gen: determinism and stamps use stubs for the absent kernel templates\n");
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

/* ---- all or nothing ----------------------------------------------------------- */

static void snapshot_mtimes(const char *dir, char names[][256], int n, struct stat *st) {
    for (int i = 0; i < n; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        stat(p, &st[i]);
    }
}

static void set_old_mtime(const char *dir, char names[][256], int n) {
    struct timespec ts[2] = {{978307200, 0}, {978307200, 0}}; /* 2001-01-01 */
    for (int i = 0; i < n; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        utimensat(AT_FDCWD, p, ts, 0);
    }
}

static void test_all_or_nothing(void) {
    char t0[300], t1[300], out[300], args[1400], why[1400], *err, l1[600], want[600];
    int rc;
    snprintf(t0, sizeof t0, "%s/tpl_good", tmp_root);
    snprintf(t1, sizeof t1, "%s/tpl_bad", tmp_root);
    CASE("all or nothing: template folders");
    CHECK(make_templates(t0, 0) == 0);

    /* a Lua error raised in a template line */
    static const struct {
        const char *label, *tmpl, *prefix, *line, *msg, *src;
    } lua_cases[] = {
        {"template error: error() in route.lua", "route", "// test line 1\n// test line 2\n@ error(\"boom\")\n", "3",
         "boom", "    @ error(\"boom\")"},
        {"template error: an undefined variable in route.lua", "route", "// test line 1\n// ${undefined_var.x}\n", "2",
         "attempt to index a nil value (global 'undefined_var')", "    // ${undefined_var.x}"},
        {"template error: a missing parameter in combine.lua", "combine", "// test line 1\n// ${p.no_such_param}\n",
         "2", "cannot interpolate nil (a missing parameter?)", "    // ${p.no_such_param}"},
        {"template error: a Lua syntax error in permute.lua", "permute", "@ local x = = 1\n", "1",
         "unexpected symbol near '='", "    @ local x = = 1"},
        {"template error: an unclosed ${ in gemm_down.lua", "gemm_down", "// ${ 1 +\n", "1", "unclosed ${ in template line",
         "    // ${ 1 +"},
        {"template error: os in gemm_up_swiglu.lua", "gemm_up_swiglu", "@ os.execute(\"touch /tmp/moegen_pwned\")\n", "1",
         "attempt to index a nil value (global 'os')", "    @ os.execute(\"touch /tmp/moegen_pwned\")"},
        {"template error: an endless loop in route.lua", "route", "@ while true do end\n", "1",
         "instruction limit exceeded (200000000 instructions)", "    @ while true do end"},
    };
    for (size_t i = 0; i < sizeof lua_cases / sizeof *lua_cases; i++) {
        CASE(lua_cases[i].label);
        rm_rf(t1);
        CHECK(make_templates(t1, 0) == 0);
        CHECK(prepend_template(t1, lua_cases[i].tmpl, lua_cases[i].prefix) == 0);
        snprintf(out, sizeof out, "%s/out_lua_%zu", tmp_root, i);
        snprintf(args, sizeof args, "emit %s -o %s --templates %s", SMALL, out, t1);
        double t = now();
        rc = run_moegen(args, &err);
        t = now() - t;
        CHECKF(rc == 2, "exit %d", rc);
        CHECKF(t < 5.0, "took %.1f s", t);
        snprintf(want, sizeof want, "%s/%s.lua:%s: error: %s\n%s\n", t1, lua_cases[i].tmpl, lua_cases[i].line,
                 lua_cases[i].msg, lua_cases[i].src);
        CHECK_STREQ(err, want);
        CHECKF(!exists(out), "%s was created", out);
        free(err);

        /* the library says the same */
        moe_plan_desc_t pd;
        CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
        moe_fileset_t fs = {0};
        moe_diag_t d;
        CHECK(moe_emit_files(&pd, t1, &fs, &d) != 0);
        snprintf(l1, sizeof l1, "%s\n", d.msg);
        CHECK_STREQ(l1, want);
        moe_fileset_free(&fs);
    }
    CHECKF(!exists("/tmp/moegen_pwned"), "a template created /tmp/moegen_pwned");

    CASE("all or nothing: a template error leaves an existing folder alone");
    snprintf(out, sizeof out, "%s/out_existing", tmp_root);
    snprintf(args, sizeof args, "emit %s -o %s --templates %s", SMALL, out, t0);
    rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(err);
    char before[300];
    snprintf(before, sizeof before, "%s/out_existing_copy", tmp_root);
    snprintf(args, sizeof args, "cp -rp '%s' '%s'", out, before);
    CHECK(system(args) == 0);
    rm_rf(t1);
    CHECK(make_templates(t1, 0) == 0);
    CHECK(prepend_template(t1, "combine", "@ error(\"boom\")\n") == 0);
    snprintf(args, sizeof args, "emit %s -o %s --templates %s --set top_k=4", SMALL, out, t1);
    rc = run_moegen(args, &err);
    CHECKF(rc == 2, "exit %d", rc);
    free(err);
    CHECKF(compare_dirs(before, out, why, sizeof why) == 0, "%s", why);

    /* an NVRTC error in an output line: the message names the template line */
    CASE("NVRTC error: moegen compile");
    rm_rf(t1);
    CHECK(make_templates(t1, 0) == 0);
    CHECK(prepend_template(t1, "route", "// test line 1\n__device__ int moe_test_broken = ;\n") == 0);
    char out2[300];
    snprintf(out2, sizeof out2, "%s/out_nvrtc", tmp_root);
    snprintf(args, sizeof args, "compile %s -o %s --templates %s", SMALL, out2, t1);
    rc = run_moegen(args, &err);
    CHECKF(rc == 1, "exit %d", rc);
    snprintf(want, sizeof want, "%s/route.lua:2: error: expected an expression", t1);
    CHECKF(strncmp(err, want, strlen(want)) == 0, "stderr:\n%s\nwant it to start with:\n%s", err, want);
    CHECKF(!exists(out2), "%s was created", out2);
    free(err);
    snprintf(args, sizeof args, "compile %s -o %s --templates %s", SMALL, out, t1);
    rc = run_moegen(args, &err);
    CHECKF(rc == 1, "exit %d", rc);
    free(err);
    CHECKF(compare_dirs(before, out, why, sizeof why) == 0, "%s", why);

    CASE("NVRTC error: the library");
    moe_plan_desc_t pd;
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    moe_buf_t src = {0}, cubin = {0}, log = {0};
    moe_diag_t d;
    CHECKF(moe_emit_source(&pd, t1, &src, &d) == 0, "%s", d.msg);
    CHECK(moe_nvrtc_compile(src.data, "small.cu", MOE_ARCH_SM80, &cubin, NULL, &log, &d) != 0);
    CHECKF(strncmp(d.msg, want, strlen(want)) == 0, "%s", d.msg);
    CHECK(cubin.len == 0);
    moe_buf_free(&src);
    moe_buf_free(&cubin);
    moe_buf_free(&log);

    /* re-running emit leaves unchanged files alone */
    CASE("emit: unchanged files keep their mtime");
    const char *tsel = have_templates ? NULL : t0;
    char o3[300];
    snprintf(o3, sizeof o3, "%s/out_mtime", tmp_root);
    snprintf(args, sizeof args, "emit %s -o %s%s%s", SMALL, o3, tsel ? " --templates " : "", tsel ? tsel : "");
    rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(err);
    static char names[16][256];
    int n = list_dir(o3, names, 16);
    CHECKF(n == 4, "%d files after emit", n);
    if (n < 1 || n > 16)
        return;
    set_old_mtime(o3, names, n);
    struct stat st0[16], st1[16];
    snapshot_mtimes(o3, names, n, st0);
    rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(err);
    CHECK(list_dir(o3, names, 16) == n); /* no temporaries left behind */
    snapshot_mtimes(o3, names, n, st1);
    for (int i = 0; i < n; i++) {
        CHECKF(st1[i].st_mtime == 978307200 && st1[i].st_ino == st0[i].st_ino, "%s was rewritten", names[i]);
    }

    CASE("emit: a changed file is rewritten, the others are not");
    char hp[600];
    snprintf(hp, sizeof hp, "%s/small.h", o3);
    size_t hl;
    char *h = read_bytes(hp, &hl);
    CHECK(h != NULL);
    FILE *f = fopen(hp, "ab");
    if (f) {
        fputs("/* a local edit */\n", f);
        fclose(f);
    }
    set_old_mtime(o3, names, n);
    rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(err);
    CHECK(list_dir(o3, names, 16) == n);
    snapshot_mtimes(o3, names, n, st1);
    for (int i = 0; i < n; i++) {
        int is_h = strcmp(names[i], "small.h") == 0;
        CHECKF((st1[i].st_mtime != 978307200) == is_h, "%s: mtime %lld", names[i], (long long)st1[i].st_mtime);
    }
    size_t hl2;
    char *h2 = read_bytes(hp, &hl2);
    CHECK(h && h2 && hl == hl2 && memcmp(h, h2, hl) == 0);
    free(h);
    free(h2);

    CASE("compile: writes cubins and PTX for every arch, with no warnings");
    char o4[300];
    snprintf(o4, sizeof o4, "%s/out_compile", tmp_root);
    snprintf(args, sizeof args, "compile %s -o %s%s%s", SMALL, o4, tsel ? " --templates " : "", tsel ? tsel : "");
    rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    CHECK_STREQ(err, "");
    free(err);
    static const char *const cfiles[] = {"small.sm_90a.cubin", "small.sm_90a.ptx", "small.sm_80.cubin",
                                         "small.sm_80.ptx", "small.cu", "small.h", "manifest.json", "small.moe"};
    for (size_t i = 0; i < sizeof cfiles / sizeof *cfiles; i++) {
        char p[600];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", o4, cfiles[i]);
        CHECKF(stat(p, &st) == 0 && st.st_size > 0, "%s missing or empty", p);
    }
    CHECK(list_dir(o4, names, 16) == 8);
}

/* ---- NVRTC: every kernel of every example spec, each arch ------------------- */

typedef struct {
    int rc;               /* 0 compiled */
    size_t cubin, log;    /* bytes */
    char missing[128];    /* a kernel name not found in the cubin */
    char msg[3000];       /* diag or log */
} job_result_t;

static void compile_job(const char *spec, moe_arch_t arch, job_result_t *r) {
    memset(r, 0, sizeof *r);
    moe_plan_desc_t pd;
    if (load_plan(spec, NULL, 0, &pd)) {
        r->rc = 1;
        snprintf(r->msg, sizeof r->msg, "%s does not load", spec);
        return;
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
    char specs[65][300];
    int ns = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        if (l > 4 && strcmp(names[i] + l - 4, ".moe") == 0)
            snprintf(specs[ns++], sizeof specs[0], "examples/specs/%s", names[i]);
    }
    CHECK(ns >= 5);
    snprintf(specs[ns++], sizeof specs[0], "%s", SMALL);
    static const moe_arch_t arches[] = {MOE_ARCH_SM90A, MOE_ARCH_SM80};
    int njobs = ns * 2;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int workers = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    double t0 = now();

    /* one child per compile, `workers` at a time; results come back in pipes */
    pid_t pid[130];
    int fd[130];
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
                compile_job(specs[next / 2], arches[next % 2], &res);
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
        snprintf(label, sizeof label, "NVRTC %s %s", specs[j / 2], moe_arch_name(arches[j % 2]));
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
    fprintf(stderr, "test_gen: NVRTC: %d compiles (%d specs x 2 arches) on %d workers in %.1f s\n", njobs, ns,
            workers, now() - t0);
}

/* ---- kernels_out/ ---------------------------------------------------------------- */

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

/* ---- the JIT cache ------------------------------------------------------------------ */

/* Set or unset (v == NULL) an environment variable. */
static void env(const char *k, const char *v) {
    if (v)
        setenv(k, v, 1);
    else
        unsetenv(k);
}

static void test_cache_dir(void) {
    CASE("cache dir: MOEGEN_CACHE_DIR, then XDG_CACHE_HOME, then HOME");
    char *saved[3];
    static const char *const vars[3] = {"MOEGEN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    for (int i = 0; i < 3; i++)
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
    char dir[512];
    env("MOEGEN_CACHE_DIR", "/c/moegen_dir");
    env("XDG_CACHE_HOME", "/c/xdg");
    env("HOME", "/c/home");
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/moegen_dir");
    env("MOEGEN_CACHE_DIR", "");
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/xdg/moegen");
    env("MOEGEN_CACHE_DIR", NULL);
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/xdg/moegen");
    env("XDG_CACHE_HOME", NULL);
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "/c/home/.cache/moegen");
    env("HOME", NULL);
    moe_cache_dir(dir, sizeof dir);
    CHECK_STREQ(dir, "");
    for (int i = 0; i < 3; i++) {
        env(vars[i], saved[i]);
        free(saved[i]);
    }
}

/* Files in dir: total and temporaries (names with ".tmp"). */
static void count_entries(const char *dir, int *total, int *temps) {
    static char names[64][256];
    int n = list_dir(dir, names, 64);
    *total = n;
    *temps = 0;
    for (int i = 0; i < n; i++)
        *temps += strstr(names[i], ".tmp") != NULL;
}

static int same_buf(const moe_buf_t *a, const moe_buf_t *b) {
    return a->len == b->len && a->len > 0 && memcmp(a->data, b->data, a->len) == 0;
}

/* Call moe_cache_cubin; *hit and out filled. Returns rc. */
static int cache_get(const moe_plan_desc_t *pd, const char *tdir, const char *cdir, moe_buf_t *out, int *hit) {
    moe_diag_t d;
    out->len = 0;
    int rc = moe_cache_cubin(pd, tdir, MOE_ARCH_SM90A, cdir, out, hit, &d);
    if (rc)
        fprintf(stderr, "  moe_cache_cubin: %s\n", d.msg);
    return rc;
}

/* Miss, hit, corruption and a race, with templates from tdir. */
static void cache_behaviour(const char *what, const char *tdir) {
    char label[300], cdir[300], entry[700], key[33];
    moe_plan_desc_t pd;
    moe_diag_t d;
    snprintf(label, sizeof label, "cache (%s): first call is a miss", what);
    CASE(label);
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    snprintf(cdir, sizeof cdir, "%s/cache_%s", tmp_root, what);
    CHECKF(moe_cache_key(&pd, tdir, MOE_ARCH_SM90A, key, &d) == 0, "%s", d.msg);
    snprintf(entry, sizeof entry, "%s/%s-%s.cubin", cdir, pd.spec.name, key);
    moe_buf_t first = {0}, b = {0};
    int hit = -1, total, temps;
    CHECK(cache_get(&pd, tdir, cdir, &first, &hit) == 0);
    CHECK(hit == 0 && first.len > 0);
    count_entries(cdir, &total, &temps);
    CHECKF(total == 1 && temps == 0, "%d files, %d temporaries", total, temps);
    CHECKF(exists(entry), "no entry %s", entry);

    snprintf(label, sizeof label, "cache (%s): second call is a hit", what);
    CASE(label);
    CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
    CHECK(hit == 1);
    CHECK(same_buf(&b, &first));

    /* corruptions: each must read as a miss, rebuild, and leave a valid entry */
    static const char *const kinds[] = {"a flipped payload byte", "a flipped header byte", "a truncated payload",
                                        "a file shorter than its header", "an empty file", "bad magic"};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        snprintf(label, sizeof label, "cache (%s): %s is a miss and is rebuilt", what, kinds[k]);
        CASE(label);
        size_t len;
        char *data = read_bytes(entry, &len);
        CHECK(data != NULL && len > 64);
        if (!data || len <= 64) {
            free(data);
            continue;
        }
        switch (k) {
        case 0: data[32 + (len - 32) / 2] ^= 0x40; break;
        case 1: data[12] ^= 0x01; break;
        case 2: len = 32 + (len - 32) / 2; break;
        case 3: len = 20; break;
        case 4: len = 0; break;
        default: data[0] = 'X'; break;
        }
        CHECK(write_bytes(entry, data, len) == 0);
        free(data);
        CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
        CHECKF(hit == 0, "a corrupt entry was used");
        CHECK(same_buf(&b, &first));
        CHECK(cache_get(&pd, tdir, cdir, &b, &hit) == 0);
        CHECKF(hit == 1, "the rebuilt entry is not valid");
        CHECK(same_buf(&b, &first));
        count_entries(cdir, &total, &temps);
        CHECKF(total == 1 && temps == 0, "%d files, %d temporaries", total, temps);
    }

    /* two processes compiling the same key at once */
    for (int round = 0; round < 2; round++) {
        snprintf(label, sizeof label, "cache (%s): two processes at once, round %d", what, round + 1);
        CASE(label);
        char rdir[300];
        snprintf(rdir, sizeof rdir, "%s/race_%s_%d", tmp_root, what, round);
        int go[2];
        CHECK(pipe(go) == 0);
        pid_t kid[2];
        fflush(NULL);
        for (int i = 0; i < 2; i++) {
            kid[i] = fork();
            if (kid[i] == 0) {
                close(go[1]);
                char c;
                if (read(go[0], &c, 1) != 1)
                    _exit(4);
                moe_buf_t cb = {0};
                int h = -1;
                moe_diag_t dd;
                int rc = moe_cache_cubin(&pd, tdir, MOE_ARCH_SM90A, rdir, &cb, &h, &dd);
                char p[600];
                snprintf(p, sizeof p, "%s/race_%s_%d_%d.bin", tmp_root, what, round, i);
                /* usually both miss and compile at once; a process that
                 * starts late may find the other's entry, which is fine */
                _exit(rc == 0 && write_bytes(p, cb.data, cb.len) == 0 ? 0 : 6);
            }
        }
        close(go[0]);
        CHECK(write(go[1], "gg", 2) == 2);
        close(go[1]);
        for (int i = 0; i < 2; i++) {
            int st = 0;
            waitpid(kid[i], &st, 0);
            CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d: status %d", i, st);
        }
        moe_buf_t r[2] = {{0}, {0}};
        for (int i = 0; i < 2; i++) {
            char p[600];
            snprintf(p, sizeof p, "%s/race_%s_%d_%d.bin", tmp_root, what, round, i);
            size_t l;
            char *data = read_bytes(p, &l);
            if (data)
                moe_buf_append(&r[i], data, l);
            free(data);
        }
        CHECK(same_buf(&r[0], &first) && same_buf(&r[1], &first));
        count_entries(rdir, &total, &temps);
        CHECKF(total == 1 && temps == 0, "%d files, %d temporaries", total, temps);
        CHECK(cache_get(&pd, tdir, rdir, &b, &hit) == 0);
        CHECKF(hit == 1, "the entry left by the race is not valid");
        CHECK(same_buf(&b, &first));
        moe_buf_free(&r[0]);
        moe_buf_free(&r[1]);
    }

    snprintf(label, sizeof label, "cache (%s): MOEGEN_CACHE_DIR names the folder", what);
    CASE(label);
    char edir[300];
    snprintf(edir, sizeof edir, "%s/cache_env_%s", tmp_root, what);
    char *saved = getenv("MOEGEN_CACHE_DIR") ? strdup(getenv("MOEGEN_CACHE_DIR")) : NULL;
    setenv("MOEGEN_CACHE_DIR", edir, 1);
    CHECK(cache_get(&pd, tdir, NULL, &b, &hit) == 0);
    CHECK(hit == 0 && same_buf(&b, &first));
    count_entries(edir, &total, &temps);
    CHECKF(total == 1 && temps == 0, "%d files, %d temporaries in %s", total, temps, edir);
    CHECK(cache_get(&pd, tdir, NULL, &b, &hit) == 0);
    CHECK(hit == 1);
    env("MOEGEN_CACHE_DIR", saved);
    free(saved);

    snprintf(label, sizeof label, "cache (%s): an unwritable folder still compiles", what);
    CASE(label);
    CHECK(cache_get(&pd, tdir, "/proc/moegen_no_such_dir/cache", &b, &hit) == 0);
    CHECK(hit == 0 && same_buf(&b, &first));
    moe_buf_free(&first);
    moe_buf_free(&b);
}

static void test_cache(void) {
    test_cache_dir();

    char t0[300];
    snprintf(t0, sizeof t0, "%s/tpl_cache", tmp_root);
    CASE("cache: template folder");
    CHECK(make_templates(t0, 1) == 0);
    cache_behaviour("stub templates", t0);

    CASE("cache key: arch, spec and template content");
    moe_plan_desc_t pd, pd2;
    moe_diag_t d;
    char k1[33], k2[33], k3[33], k4[33];
    CHECK(load_plan(SMALL, NULL, 0, &pd) == 0);
    moe_override_t o = {"top_k=4"};
    CHECK(load_plan(SMALL, &o, 1, &pd2) == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k1, &d) == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k2, &d) == 0);
    CHECK_STREQ(k1, k2);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM80, k2, &d) == 0);
    CHECK(strcmp(k1, k2) != 0);
    CHECK(moe_cache_key(&pd2, t0, MOE_ARCH_SM90A, k2, &d) == 0);
    CHECK(strcmp(k1, k2) != 0);
    CHECK(put_template(t0, "gemm_down", "@ -- changed\nextern \"C\" __global__ void ${p.kernel}() {}\n") == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k3, &d) == 0);
    CHECKF(strcmp(k1, k3) != 0, "changing gemm_down.lua kept the key");
    /* A helper imported from the --templates folder is a template in use: a
     * change to it must change the key too, or the cache serves a stale cubin. */
    CHECK(put_template(t0, "zz_test_helper", "@ return { n = 1 }\n") == 0);
    CHECK(put_template(t0, "route", "@ local h = import(\"zz_test_helper\")\n"
                                     "extern \"C\" __global__ void ${p.kernel}(int *c) { if (c) c[0] = ${h.n}; }\n") == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k3, &d) == 0);
    CHECK(put_template(t0, "zz_test_helper", "@ return { n = 2 }\n") == 0);
    CHECK(moe_cache_key(&pd, t0, MOE_ARCH_SM90A, k4, &d) == 0);
    CHECKF(strcmp(k3, k4) != 0, "changing an imported helper in the --templates folder kept the cache key");

    CASE("cache with the embedded templates");
    if (!have_templates) {
        SKIP("templates/%s.lua is absent: the kernel templates are not all written yet", missing_template);
        return;
    }
    cache_behaviour("embedded templates", NULL);
}

int main(void) {
    const char *td = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/moegen_test_gen.XXXXXX", td && *td ? td : "/tmp");
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

    double t = now();
    test_golden_small();
    test_determinism();
    test_all_or_nothing();
    fprintf(stderr, "test_gen: emission cases in %.1f s\n", now() - t);
    t = now();
    test_cache();
    fprintf(stderr, "test_gen: cache cases in %.1f s\n", now() - t);
    test_kernels_out();
    test_nvrtc_all();
    rm_rf(tmp_root);
    return check_report("test_gen");
}
