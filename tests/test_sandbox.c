/* test_sandbox.c — a --templates folder (the runtime's templates_dir) is
 * code the generator runs, so its sandbox must hold whatever a template
 * does: each case puts one template of tests/sandbox/ in front of route.lua
 * in a copy of templates/ and runs `moegen emit` under a time limit. The
 * template must fail with exit status 2 and its message, within seconds,
 * writing nothing and printing nothing to stdout. Then a folder whose name
 * holds a quote and a newline: the #line directives escape it. Run from the
 * repository root. */
#define _GNU_SOURCE /* memmem */
#include "gen_fixture.h"

/* `build/moegen ARGS` under `timeout 60`: exit status (124: timed out),
 * stdout and stderr into *out and *err (caller frees). */
static int run_limited(const char *args, char **out, char **err) {
    char cmd[4096], o[300], e[300];
    snprintf(o, sizeof o, "%s/stdout", tmp_root);
    snprintf(e, sizeof e, "%s/stderr", tmp_root);
    snprintf(cmd, sizeof cmd, "timeout -s KILL 60 %s %s >%s 2>%s </dev/null", MOEGEN, args, o, e);
    int st = system(cmd);
    char *so = read_bytes(o, NULL), *se = read_bytes(e, NULL);
    *out = so ? so : calloc(1, 1);
    *err = se ? se : calloc(1, 1);
    if (st == -1)
        return -1;
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return WEXITSTATUS(st) == 137 ? 124 : WEXITSTATUS(st);
}

static void test_holes(void) {
    static const struct {
        const char *file, *want;
    } cases[] = {
        {"pcall_loop", "instruction limit exceeded (200000000 instructions)"},
        {"xpcall_loop", "instruction limit exceeded (200000000 instructions)"},
        {"gc_endless", "__gc metamethods are not allowed in templates"},
        {"pattern_backtrack", "instruction limit exceeded"},
        {"import_escape", "import: '../outside' is not a template name"},
        {"import_absolute", "import: '/tmp/outside' is not a template name"},
        {"print_stdout", "attempt to call a nil value (global 'print')"},
        {"out_table", "template output: argument 2 is a table, not text"},
        {"out_flood", "template output over 256 MiB"},
        {"unfinished_if", "'then' expected at this text line (the Lua statement of the '@' lines above it is "
                          "unfinished)"},
        {"unfinished_value", "unexpected symbol at this text line"},
    };
    char t[300], outside[300], out[300], src[300], args[1400];
    snprintf(t, sizeof t, "%s/t", tmp_root);
    /* what import("../outside") would reach: a template beside the folder */
    snprintf(outside, sizeof outside, "%s/outside.lua", tmp_root);
    CHECK(write_text(outside, "@ error(\"read outside the templates folder\")\n") == 0);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char label[200];
        snprintf(label, sizeof label, "sandbox: tests/sandbox/%s.lua", cases[i].file);
        CASE(label);
        rm_rf(t);
        CHECK(make_templates(t, 0) == 0);
        snprintf(src, sizeof src, "tests/sandbox/%s.lua", cases[i].file);
        char *snippet = read_bytes(src, NULL);
        CHECKF(snippet != NULL, "no %s", src);
        if (!snippet)
            continue;
        CHECK(prepend_template(t, "route", snippet) == 0);
        free(snippet);
        snprintf(out, sizeof out, "%s/out_%zu", tmp_root, i);
        snprintf(args, sizeof args, "emit %s -o %s --templates %s", SMALL, out, t);
        char *so, *se;
        double t0 = now();
        int rc = run_limited(args, &so, &se);
        double took = now() - t0;
        CHECKF(rc == 2, "exit %d (124: still running after 60 s): %s", rc, se);
        CHECKF(took < 30.0, "took %.1f s", took); /* a hang guard: the limit ends a template in ~2 s */
        CHECKF(strstr(se, cases[i].want) != NULL, "stderr: %s", se);
        CHECKF(strstr(se, "route.lua:") != NULL, "the message names no template line: %s", se);
        /* the message line (the template line echoed after it may be the template's own __out call) */
        const char *nl = strchr(se, '\n');
        int msg_len = nl ? (int)(nl - se) : (int)strlen(se);
        CHECKF(!memmem(se, (size_t)msg_len, "__out", 5) && !memmem(se, (size_t)msg_len, "__s", 3),
               "the message names an internal function: %.*s", msg_len, se);
        CHECKF(*so == '\0', "stdout: %s", so);
        CHECKF(!exists(out), "%s was created", out);
        free(so);
        free(se);
    }
}

/* A --templates folder without a template: the message names the file
 * where it was looked for (it said templates/prelude.lua). */
static void test_missing(void) {
    CASE("sandbox: a --templates folder without the template names the real path");
    char t[300], args[1400], want[400];
    snprintf(t, sizeof t, "%s/no_such_folder", tmp_root);
    snprintf(args, sizeof args, "emit %s -o %s/missing_out --templates %s", SMALL, tmp_root, t);
    char *so, *se;
    int rc = run_limited(args, &so, &se);
    snprintf(want, sizeof want, "%s/prelude.lua:1: error: cannot open", t);
    CHECKF(rc == 2 && strstr(se, want) == se, "exit %d: %s", rc, se);
    free(so);
    free(se);
}

/* The folder's name in #line as a C string literal: '"' and '\' escaped,
 * control characters as octal escapes; no directive breaks across lines. */
static void test_line_names(void) {
    CASE("sandbox: a templates folder named with a quote and a newline is escaped in #line");
    char t[300], out[300], args[1400], want[400], raw[400], cu[400];
    snprintf(t, sizeof t, "%s/q\"uo\nte\\s", tmp_root);
    CHECK(make_templates(t, 0) == 0);
    snprintf(out, sizeof out, "%s/line_out", tmp_root);
    snprintf(args, sizeof args, "emit %s -o %s --templates '%s'", SMALL, out, t);
    char *so, *se;
    int rc = run_limited(args, &so, &se);
    CHECKF(rc == 0, "exit %d: %s", rc, se);
    free(so);
    free(se);
    snprintf(cu, sizeof cu, "%s/small.cu", out);
    char *text = read_bytes(cu, NULL);
    CHECKF(text != NULL, "no %s", cu);
    if (!text)
        return;
    snprintf(want, sizeof want, "\"%s/q\\\"uo\\012te\\\\s/route.lua\"\n", tmp_root);
    snprintf(raw, sizeof raw, "q\"uo\nte");
    CHECKF(strstr(text, want) != NULL, "no #line naming %s", want);
    CHECK(strstr(text, raw) == NULL);
    /* every directive is one line: #line N "..." with only escaped quotes inside */
    int bad = 0, n = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, "#line ", 6) != 0)
            continue;
        n++;
        const char *q = strchr(p, '"');
        const char *e = strchr(p, '\n');
        if (!q || !e || e[-1] != '"') {
            bad++;
            continue;
        }
        for (q++; q < e - 1; q++)
            if (*q == '\\')
                q++;
            else if (*q == '"')
                bad++;
    }
    CHECKF(n > 10 && bad == 0, "%d of %d #line directives malformed", bad, n);
    free(text);
}

int main(void) {
    if (gen_fixture_setup("test_sandbox"))
        return 1;
    test_holes();
    test_line_names();
    test_missing();
    rm_rf(tmp_root);
    return check_report("test_sandbox");
}
