/* test_write.c — all or nothing: a template error (Lua errors, an unclosed
 * ${, a sandbox escape, an endless loop) or an NVRTC error writes nothing and
 * leaves an existing folder alone, with the message naming the template line;
 * re-running emit leaves unchanged files alone; compile writes its whole
 * output set. The cases use a copy of templates/ (gen_fixture.h). Run from
 * the repository root. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>

#include "compile.h"
#include "gen_fixture.h"

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
        CHECKF(t < 30.0, "took %.1f s", t); /* a hang guard, not a timing: 200M instructions take ~2 s */
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
        moe_plan_desc_free(&pd);
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
    moe_plan_desc_free(&pd);

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


/* ---- planted links ------------------------------------------------------------ */

/* Another local user can plant links in a shared output folder at the names
 * a writer's temporaries would take (they used to be .NAME.tmp.PID). The
 * writer must create its temporaries exclusively, never opening or following
 * what is there: the link's target stays untouched, the file is written, and
 * new files are not world-writable. */
static void test_planted_links(void) {
    CASE("emit: a link planted at the temporary name is not followed");
    char dir[400], victim[400], link[600], dst[600];
    snprintf(dir, sizeof dir, "%s/shared_out", tmp_root);
    snprintf(victim, sizeof victim, "%s/victim.txt", tmp_root);
    char merr[256];
    CHECKF(moe_mkdirs(dir, merr, sizeof merr) == 0, "%s", merr);
    FILE *v = fopen(victim, "w");
    CHECK(v != NULL);
    if (!v)
        return;
    fputs("the victim's own file\n", v);
    fclose(v);
    snprintf(link, sizeof link, "%s/.planted.cu.tmp.%ld", dir, (long)getpid());
    CHECK(symlink(victim, link) == 0);
    moe_fileset_t fs = {0};
    moe_buf_t *b = moe_fileset_add(&fs, "planted.cu");
    CHECK(b != NULL);
    if (!b)
        return;
    moe_buf_printf(b, "// written by the test\n");
    char err[512] = "";
    CHECKF(moe_fileset_write(&fs, dir, err, sizeof err) == 0, "%s", err);
    moe_fileset_free(&fs);
    size_t n;
    char e2[64];
    char *vt = moe_read_file(victim, 4096, &n, e2, sizeof e2);
    CHECKF(vt && strcmp(vt, "the victim's own file\n") == 0, "the victim now reads '%s'", vt ? vt : "(unreadable)");
    free(vt);
    snprintf(dst, sizeof dst, "%s/planted.cu", dir);
    char *out = moe_read_file(dst, 4096, &n, e2, sizeof e2);
    CHECKF(out && strcmp(out, "// written by the test\n") == 0, "planted.cu reads '%s'", out ? out : "(missing)");
    free(out);
    struct stat st;
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode)); /* left as it was */
    CHECK(stat(dst, &st) == 0 && !(st.st_mode & S_IWOTH));
}

/* An empty output folder name is a usage error (exit 2), not a walk over
 * uninitialized memory after the name's end. */
/* emit is all or nothing also when a destination is a folder: the rename
 * over it fails, and before, NAME.cu and NAME.h had already been replaced */
static void test_folder_in_the_way(void) {
    CASE("emit: DIR/manifest.json a folder: refused, nothing replaced");
    char dir[400], args[800], p[600], *err;
    snprintf(dir, sizeof dir, "%s/in_the_way", tmp_root);
    snprintf(args, sizeof args, "emit %s -o %s", SMALL, dir);
    int rc = run_moegen(args, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(err);
    snprintf(p, sizeof p, "%s/small.cu", dir);
    CHECK(write_text(p, "old") == 0);
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    CHECK(unlink(p) == 0 && mkdir(p, 0700) == 0);
    rc = run_moegen(args, &err);
    CHECKF(rc == 1 && strstr(err, "manifest.json': it is a folder"), "exit %d: %s", rc, err);
    free(err);
    snprintf(p, sizeof p, "%s/small.cu", dir);
    char *cu = read_bytes(p, NULL);
    CHECKF(cu && strcmp(cu, "old") == 0, "small.cu was replaced");
    free(cu);
    static char names[16][256];
    int n = list_dir(dir, names, 16), temps = 0;
    for (int i = 0; i < n; i++)
        temps += strstr(names[i], ".tmp") != NULL;
    CHECKF(temps == 0, "%d temporaries left", temps);
}

static void test_empty_out(void) {
    CASE("emit -o '': refused");
    char args[600], *err;
    snprintf(args, sizeof args, "emit %s -o ''", SMALL);
    int rc = run_moegen(args, &err);
    CHECKF(rc == 2, "exit %d: %s", rc, err);
    CHECKF(strstr(err, "needs -o DIR") != NULL, "%s", err);
    free(err);
    char e[256] = "";
    CHECK(moe_mkdirs("", e, sizeof e) == -1 && strstr(e, "empty") != NULL);
}

int main(void) {
    if (gen_fixture_setup("test_write"))
        return 1;
    double t = now();
    test_all_or_nothing();
    test_planted_links();
    test_empty_out();
    test_folder_in_the_way();
    fprintf(stderr, "test_write: cases in %.1f s\n", now() - t);
    rm_rf(tmp_root);
    return check_report("test_write");
}
