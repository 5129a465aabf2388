/* test_spec.c — spec loading: the golden message of every class of spec
 * error, the sandbox, --set overrides, the canonical form and its hash, the
 * example specs, and the exit codes of the moegen command.
 *
 * Bad specs live in tests/specs/bad/NAME.moe, each beside its exact expected
 * message in tests/golden/errors/NAME.txt (what `moegen check` prints on
 * stderr). Those goldens are written by hand: they say what the message must
 * be, so there is no switch that regenerates them. Run from the repository
 * root; the command tests run build/moegen.
 *
 * The schema (gen/spec_schema.c) is checked as data (names, defaults,
 * choices), row by row through the loader (each row's type and range
 * errors), and against README's spec-key table, which must be exactly what
 * moe_spec_keys_markdown() prints (`test_spec --keys` prints it). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

#include "check.h"
#include "driver.h"
#include "plan.h"
#include "spec.h"
#include "spec_schema.h"

#define MOEGEN MOEGEN_BUILD "/moegen"
#define BAD_DIR "tests/specs/bad"
#define ERR_DIR "tests/golden/errors"
#define PWNED "/tmp/moegen_pwned"
#define README "README.md"
#define KEYS_BEGIN "<!-- The spec-key table is generated from gen/spec_schema.c"
#define KEYS_END "<!-- end of the spec-key table -->"

static char tmp_root[256];

/* ---- helpers -------------------------------------------------------------- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    size_t n;
    while (s && (n = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *t = realloc(s, cap *= 2);
            if (!t)
                free(s);
            s = t;
        }
    }
    fclose(f);
    if (s)
        s[len] = '\0';
    return s;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fputs(text, f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Entries of dir other than . and .., or -1 when it cannot be read. */
static int dir_count(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Run `build/moegen ARGS` (ARGS are pasted into a shell line as they are);
 * *out and *err receive stdout and stderr (caller frees). Returns the exit
 * status, or -1 when it did not exit normally. */
static int run_moegen(const char *args, char **out, char **err) {
    char cmd[4096], o[300], e[300];
    snprintf(o, sizeof o, "%s/stdout", tmp_root);
    snprintf(e, sizeof e, "%s/stderr", tmp_root);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s </dev/null", MOEGEN, args, o, e);
    int st = system(cmd);
    char *so = read_text(o), *se = read_text(e);
    if (out)
        *out = so ? so : calloc(1, 1);
    else
        free(so);
    if (err)
        *err = se ? se : calloc(1, 1);
    else
        free(se);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int load_file(moe_spec_t *s, const char *path, moe_diag_t *d) {
    return moe_spec_load(s, path, NULL, NULL, 0, d);
}

static int load_text(moe_spec_t *s, const char *text, moe_diag_t *d) {
    return moe_spec_load(s, "text.moe", text, NULL, 0, d);
}

/* Field-by-field equality of two loaded specs (hash included). */
static int spec_eq(const moe_spec_t *a, const moe_spec_t *b) {
    int eq = strcmp(a->name, b->name) == 0 && a->experts == b->experts && a->top_k == b->top_k &&
             a->hidden == b->hidden && a->ffn == b->ffn && a->tokens == b->tokens && a->dtype == b->dtype &&
             a->router.score == b->router.score && a->router.renormalize == b->router.renormalize &&
             a->router.groups == b->router.groups && a->router.topk_groups == b->router.topk_groups &&
             a->router.group_topk == b->router.group_topk && a->router.apply == b->router.apply &&
             a->router.bias == b->router.bias && a->router.logit_bias == b->router.logit_bias &&
             a->router.scale == b->router.scale && a->activation.alpha == b->activation.alpha &&
             a->activation.limit == b->activation.limit && a->activation.up_offset == b->activation.up_offset &&
             a->activation.kind == b->activation.kind && a->ffn_bias == b->ffn_bias &&
             a->dispatch.mode == b->dispatch.mode && a->dispatch.capacity == b->dispatch.capacity &&
             a->mesh.nsharding == b->mesh.nsharding && a->narch == b->narch &&
             strcmp(a->hash, b->hash) == 0;
    for (int i = 0; eq && i < MOE_AXIS_COUNT; i++)
        eq = a->mesh.size[i] == b->mesh.size[i] && a->mesh.order[i] == b->mesh.order[i];
    for (int i = 0; eq && i < a->mesh.nsharding; i++)
        eq = a->mesh.sharding[i] == b->mesh.sharding[i];
    for (int i = 0; eq && i < a->narch; i++)
        eq = a->arch[i] == b->arch[i];
    return eq;
}

static int is_hex32(const char *h) {
    if (strlen(h) != 32)
        return 0;
    for (; *h; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f')))
            return 0;
    return 1;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names (without .moe) of the *.moe files in dir; returns the count. */
static int list_specs(const char *dir, char names[][128], int max) {
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char *tmp[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max && n < 256) {
        size_t len = strlen(e->d_name);
        if (len > 4 && len < 120 && strcmp(e->d_name + len - 4, ".moe") == 0) {
            tmp[n] = strdup(e->d_name);
            tmp[n][len - 4] = '\0';
            n++;
        }
    }
    closedir(d);
    qsort(tmp, (size_t)n, sizeof *tmp, by_name);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 128, "%s", tmp[i]);
        free(tmp[i]);
    }
    return n;
}

/* ---- golden error messages ------------------------------------------------ */

/* Every class of error the brief names; each must have a bad spec and a
 * golden (the folder may hold more). */
static const char *const required_bad[] = {
    "type_integer_got_float", "type_string_got_number", "type_boolean_got_string", "type_table_got_number",
    "range_experts_zero", "range_hidden_negative", "range_top_k_over_32", "top_k_exceeds_experts",
    "hidden_not_multiple_of_8", "ffn_not_multiple_of_8", "groups_not_dividing_experts",
    "topk_groups_exceeds_groups", "group_topk_exceeds_group", "mesh_experts_not_divisible",
    "unknown_key_suggestion", "unknown_nested_key_suggestion", "unknown_key", "missing_key", "enum_dtype",
    "enum_router_score", "enum_router_apply", "bad_name", "name_reserved", "nul_in_name", "nul_in_enum", "nul_in_file", "key_set_twice", "arch_duplicate", "mesh_order_incomplete",
    "mesh_sharding_dp", "lua_syntax", "size_weights_overflow", "nested_line_type", "nested_line_unknown",
    "sandbox_infinite_loop", "sandbox_giant_allocation", "sandbox_os_execute", "sandbox_io_open",
    "sandbox_require", "sandbox_load", "sandbox_dofile", "sandbox_string_rep", "shared_ffn_not_multiple",
    "shared_gate_unknown", "shared_gate_without_ffn", "shared_with_ffn_bias", "shared_with_ep", "shared_too_many_slots",
    "quant_fp16", "quant_hidden_not_128", "quant_ffn_not_128", "quant_sm80", "quant_training", "quant_scaling_unknown",
    "quant_weights_unknown", "zero_experts_training", "zero_experts_ep", "zero_experts_apply_input",
    "zero_experts_negative", "zero_experts_over_route", "enum_router_select", "given_bias", "given_groups",
    "given_training", "given_apply_input", "given_weights_without_select", "given_weights_logit_bias",
    "given_weights_shared_gate", "given_zero_experts", "given_sparsemixer", "router_input_given_weights",
    "router_input_shared_gate", "enum_router_input", "expert_scale_given_weights",
    "expert_scale_zero_experts", "expert_scale_given_training", "expert_scale_number", "router_fp32_given_weights",
    "router_fp32_shared_gate", "router_fp32_training", "enum_router_weight_dtype", "activation_clamp_without_limit",
    "enum_activation_clamp", "shared_limit_without_ffn", "shared_limit_without_limit",
    "shared_unclamped_without_limit", "shared_limit_and_unclamped", "shared_limit_zero", "relu2_limit",
    "router_hidden_without_input", "router_hidden_training", "router_hidden_not_multiple",
    "weight_grads_without_training", "enum_weight_grads",
};

static void test_golden_errors(void) {
    static char names[256][128];
    CASE("bad specs: folder");
    int n = list_specs(BAD_DIR, names, 256);
    CHECKF(n >= (int)(sizeof required_bad / sizeof *required_bad), "%d bad specs in %s", n, BAD_DIR);
    for (size_t r = 0; r < sizeof required_bad / sizeof *required_bad; r++) {
        int found = 0;
        for (int i = 0; i < n; i++)
            found |= strcmp(names[i], required_bad[r]) == 0;
        CHECKF(found, "%s/%s.moe is missing", BAD_DIR, required_bad[r]);
    }
    unlink(PWNED);
    for (int i = 0; i < n; i++) {
        char spec[300], golden[300], label[200];
        snprintf(spec, sizeof spec, "%s/%s.moe", BAD_DIR, names[i]);
        snprintf(golden, sizeof golden, "%s/%s.txt", ERR_DIR, names[i]);
        snprintf(label, sizeof label, "bad spec %s", names[i]);
        CASE(label);
        char *want = read_text(golden);
        CHECKF(want != NULL, "no golden %s", golden);
        if (!want)
            continue;

        /* the library */
        moe_spec_t s;
        moe_diag_t d;
        double t0 = now();
        int rc = load_file(&s, spec, &d);
        if (rc == 0) { /* a planner refusal (plan_*): the spec loads, its plan does not */
            moe_plan_desc_t pd;
            char perr[512];
            rc = moe_plan_desc_build(&pd, &s, moe_tuning_default(), perr, sizeof perr);
            if (rc)
                moe_spec_error_at(&s, spec, perr, d.msg, sizeof d.msg);
            else
                moe_plan_desc_free(&pd);
        }
        double dt = now() - t0;
        CHECKF(rc != 0, "%s loaded and planned", spec);
        CHECKF(dt < 2.0, "took %.2f s (the sandbox limits must stop it fast)", dt);
        char got[1100];
        snprintf(got, sizeof got, "%s\n", d.msg);
        CHECK_STREQ(got, want);

        /* the command: same message on stderr, nothing on stdout, exit 2 */
        char args[400], *out, *err;
        snprintf(args, sizeof args, "check %s", spec);
        t0 = now();
        rc = run_moegen(args, &out, &err);
        dt = now() - t0;
        CHECKF(rc == 2, "moegen check exit %d", rc);
        CHECKF(dt < 3.0, "moegen check took %.2f s", dt);
        CHECK_STREQ(err, want);
        CHECK_STREQ(out, "");
        free(out);
        free(err);

        /* emit: exit 2 and no output folder */
        char odir[400];
        snprintf(odir, sizeof odir, "%s/emit_%s", tmp_root, names[i]);
        snprintf(args, sizeof args, "emit %s -o %s", spec, odir);
        rc = run_moegen(args, NULL, &err);
        CHECKF(rc == 2, "moegen emit exit %d", rc);
        CHECK_STREQ(err, want);
        CHECKF(!exists(odir), "emit created %s", odir);
        free(err);
        free(want);
    }
    CASE("sandbox: no side effects");
    CHECKF(!exists(PWNED), "a spec created %s", PWNED);
}

/* ---- the sandbox and spec-language edges, beyond the goldens -------------- */

static const char *const base_text =
    "name    = \"t\"\nexperts = 12\ntop_k   = 3\nhidden  = 1536\nffn     = 640\n";

static int load_base_plus(moe_spec_t *s, const char *extra, moe_diag_t *d) {
    char text[4096];
    snprintf(text, sizeof text, "%s%s", base_text, extra);
    return load_text(s, text, d);
}

static void test_sandbox(void) {
    moe_spec_t s;
    moe_diag_t d;

    CASE("sandbox: later keys may read earlier ones");
    CHECKF(load_text(&s, "name = \"t\" experts = 8 top_k = 2 hidden = 1024 ffn = 4 * hidden\n", &d) == 0, "%s",
           d.msg);
    CHECK(s.ffn == 4096);

    /* Each of these must fail fast, leave no file behind, and name the line. */
    static const struct {
        const char *label, *extra, *want;
    } cases[] = {
        {"sandbox: endless loop", "while true do end\n",
         "text.moe:6: error: instruction limit exceeded (1000000 instructions)"},
        {"sandbox: endless loop in a function", "local function f() while true do end end\nf()\n",
         "text.moe:6: error: instruction limit exceeded (1000000 instructions)"},
        {"sandbox: giant string", "local s = \"xxxxxxxx\" for i = 1, 40 do s = s .. s end\n",
         "text.moe:1: error: the spec exceeds the memory limit (16 MiB)"},
        {"sandbox: giant table", "local t = {} for i = 1, 1 << 30 do t[i] = i end\n", NULL},
        {"sandbox: os.execute", "x = os.execute(\"touch " PWNED "\")\n",
         "text.moe:6: error: 'os' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: io.open", "x = io.open(\"" PWNED "\", \"w\")\n",
         "text.moe:6: error: 'io' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: require", "x = require(\"os\")\n", "text.moe:6: error: 'require' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: load", "x = load(\"return 1\")\n", "text.moe:6: error: 'load' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: dofile", "x = dofile(\"/etc/passwd\")\n",
         "text.moe:6: error: 'dofile' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: loadfile", "x = loadfile(\"/etc/passwd\")\n",
         "text.moe:6: error: 'loadfile' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: string.rep", "x = string.rep(\"x\", 10)\n",
         "text.moe:6: error: 'string' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: setmetatable", "x = setmetatable({}, {})\n",
         "text.moe:6: error: 'setmetatable' is not defined (strings need quotes; booleans are true and false)"},
        {"sandbox: debug", "x = debug.getinfo(1)\n", "text.moe:6: error: 'debug' is not defined (strings need quotes; booleans are true and false)"},
    };
    unlink(PWNED);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CASE(cases[i].label);
        double t0 = now();
        int rc = load_base_plus(&s, cases[i].extra, &d);
        double dt = now() - t0;
        CHECKF(rc != 0, "loaded");
        CHECKF(dt < 2.0, "took %.2f s", dt);
        if (cases[i].want)
            CHECK_STREQ(d.msg, cases[i].want);
        else
            CHECKF(strncmp(d.msg, "text.moe:", 9) == 0 && strstr(d.msg, ": error: "), "%s", d.msg);
    }
    CASE("sandbox: no side effects");
    CHECKF(!exists(PWNED), "a spec created %s", PWNED);

    CASE("sandbox: a binary chunk is refused");
    CHECKF(moe_spec_load(&s, "bin.moe", "\033Lua\x54\x00", NULL, 0, &d) != 0, "loaded");
    CHECK_STREQ(d.msg, "bin.moe:1: error: attempt to load a binary chunk (mode is 't')");

    /* A name that was never set reads as nil, so a typo in a value must be
     * an error, not a silent default: `ffn_bias = ture` would otherwise mean
     * false and `renormalize = flase` true. */
    CASE("spec: an undefined name in a value is an error");
    int rc = load_base_plus(&s, "ffn_bias = ture\n", &d);
    CHECKF(rc != 0 && strstr(d.msg, "ture"), "ffn_bias = ture loaded (ffn_bias = %d): %s", (int)s.ffn_bias, d.msg);
    rc = load_base_plus(&s, "router = { renormalize = flase }\n", &d);
    CHECKF(rc != 0 && strstr(d.msg, "flase"), "renormalize = flase loaded (renormalize = %d): %s",
           (int)s.router.renormalize, d.msg);

    CASE("spec: a missing file");
    CHECK(load_file(&s, "tests/specs/no_such_spec.moe", &d) != 0);
    CHECK_STREQ(d.msg, "tests/specs/no_such_spec.moe:1: error: cannot open 'tests/specs/no_such_spec.moe': No such "
                       "file or directory");

    CASE("spec: a file over the size limit");
    char big[300];
    snprintf(big, sizeof big, "%s/big.moe", tmp_root);
    FILE *f = fopen(big, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(base_text, f);
        for (int i = 0; i < 20000; i++)
            fputs("-- a comment line that pads the spec past its size limit of one mebibyte\n", f);
        fclose(f);
        char want[700];
        snprintf(want, sizeof want, "%s:1: error: '%s' is larger than 1048576 bytes", big, big);
        CHECK(load_file(&s, big, &d) != 0);
        CHECK_STREQ(d.msg, want);
    }

    /* a FIFO would wait for a writer forever, /dev/zero read without end:
     * only regular files are read (the alarm fails a hang) */
    CASE("spec: a FIFO, a device and a folder are refused at once");
    char fifo[300], want2[700];
    snprintf(fifo, sizeof fifo, "%s/fifo.moe", tmp_root);
    CHECK(mkfifo(fifo, 0600) == 0);
    alarm(20);
    CHECK(load_file(&s, fifo, &d) != 0);
    snprintf(want2, sizeof want2, "%s:1: error: '%s' is not a regular file", fifo, fifo);
    CHECK_STREQ(d.msg, want2);
    CHECK(load_file(&s, "/dev/zero", &d) != 0);
    CHECK_STREQ(d.msg, "/dev/zero:1: error: '/dev/zero' is not a regular file");
    CHECK(load_file(&s, "tests/specs", &d) != 0);
    CHECK_STREQ(d.msg, "tests/specs:1: error: 'tests/specs' is not a regular file");
    alarm(0);
    unlink(fifo);

    /* Lua shortens long chunk names: the line of a Lua error in a spec with
     * a long path was lost (reported as line 1) */
    CASE("spec: a Lua error's line in a spec with a long path");
    char longp[400];
    snprintf(longp, sizeof longp, "%s/a_folder_name_long_enough_to_push_the_path_past_sixty_characters.moe",
             tmp_root);
    CHECK(strlen(longp) > 80);
    CHECK(write_text(longp, "name = 'x'\nexperts = 8\ntop_k = = 2\n") == 0);
    CHECK(load_file(&s, longp, &d) != 0);
    snprintf(want2, sizeof want2, "%s:3: error: ", longp);
    CHECKF(strncmp(d.msg, want2, strlen(want2)) == 0, "%s", d.msg);
    CHECK(write_text(longp, "name = 'x'\nexperts = 8\nexperts = 9\n") == 0);
    CHECK(load_file(&s, longp, &d) != 0);
    snprintf(want2, sizeof want2, "%s:3: error: key 'experts' is set twice (first on line 2)", longp);
    CHECK_STREQ(d.msg, want2);
    unlink(longp);

    /* finding an error's line is one pass over the text (it was a scan from
     * the top per line of the statement: minutes for a large spec) */
    CASE("spec: the line of an error in a long statement, found quickly");
    moe_buf_t t = {0};
    moe_buf_printf(&t, "%srouter = {\n", base_text);
    for (int i = 0; i < 12000; i++)
        moe_buf_printf(&t, "  -- a comment line inside the router table, padding it to many lines\n");
    moe_buf_printf(&t, "  score = \"nope\" }\n");
    int lines = 0;
    for (const char *q = t.data; *q; q++)
        lines += *q == '\n';
    double t0 = now();
    CHECK(moe_spec_load(&s, "long.moe", t.data, NULL, 0, &d) != 0);
    double dt = now() - t0;
    snprintf(want2, sizeof want2, "long.moe:%d: error: router.score", lines);
    CHECKF(strncmp(d.msg, want2, strlen(want2)) == 0, "%s (want %s)", d.msg, want2);
    CHECKF(dt < 1.0, "took %.2f s", dt);
    moe_buf_free(&t);
}

/* ---- overrides ------------------------------------------------------------ */

static int load_with(moe_spec_t *s, const char *path, const char *const *sets, int n, moe_diag_t *d) {
    moe_override_t o[16];
    if (n > 16)
        return -1;
    for (int i = 0; i < n; i++)
        o[i].text = sets[i];
    return moe_spec_load(s, path, NULL, o, n, d);
}

#define MINIMAL "tests/specs/minimal.moe"
#define SMALL "tests/specs/small.moe"

static void test_overrides(void) {
    moe_spec_t s, t;
    moe_diag_t d;

    CASE("--set top_k=3");
    const char *o1[] = {"top_k=3"};
    CHECKF(load_with(&s, MINIMAL, o1, 1, &d) == 0, "%s", d.msg);
    CHECK(s.top_k == 3);
    /* an override is the same as editing the file */
    CHECKF(load_text(&t, "name = \"minimal\" experts = 8 top_k = 3 hidden = 1024 ffn = 2048", &d) == 0, "%s", d.msg);
    CHECK(spec_eq(&s, &t));

    CASE("--set router.score=sigmoid");
    const char *o2[] = {"router.score=sigmoid"};
    CHECKF(load_with(&s, MINIMAL, o2, 1, &d) == 0, "%s", d.msg);
    CHECK(s.router.score == MOE_SCORE_SIGMOID);
    CHECK(s.router.renormalize); /* the rest of router keeps its defaults */

    CASE("--set arch=sm_80");
    const char *o3[] = {"arch=sm_80"};
    CHECKF(load_with(&s, SMALL, o3, 1, &d) == 0, "%s", d.msg);
    CHECK(s.narch == 1 && s.arch[0] == MOE_ARCH_SM80);

    CASE("--set arch=sm_90a,sm_80");
    const char *o4[] = {"arch=sm_90a,sm_80"};
    CHECKF(load_with(&s, MINIMAL, o4, 1, &d) == 0, "%s", d.msg);
    CHECK(s.narch == 2 && s.arch[0] == MOE_ARCH_SM90A && s.arch[1] == MOE_ARCH_SM80);

    CASE("--set mesh.ep=2");
    const char *o5[] = {"mesh.ep=2"};
    CHECKF(load_with(&s, SMALL, o5, 1, &d) == 0, "%s", d.msg);
    CHECK(s.mesh.size[MOE_AXIS_EP] == 2 && s.mesh.size[MOE_AXIS_DP] == 1 && s.mesh.size[MOE_AXIS_FSDP] == 1);
    CHECK(moe_spec_world(&s) == 2);

    CASE("--set: several, the later wins");
    const char *o6[] = {"top_k=4", "router.scale=2.5", "top_k=5"};
    CHECKF(load_with(&s, MINIMAL, o6, 3, &d) == 0, "%s", d.msg);
    CHECK(s.top_k == 5 && s.router.scale == 2.5);

    static const struct {
        const char *label, *sets[2], *want;
    } bad[] = {
        {"--set top_k=99", {"top_k=99"}, "<command line>:1: error: --set top_k=99: top_k = 99 is out of range [1, 32]"},
        {"--set nokey=1", {"nokey=1"}, "<command line>:1: error: --set nokey=1: unknown key 'nokey'"},
        {"--set router.scroe=x", {"router.scroe=x"},
         "<command line>:1: error: --set router.scroe=x: unknown key 'router.scroe' (did you mean 'router.score'?)"},
        {"--set foo", {"foo"}, "<command line>:1: error: --set 'foo' is not of the form key=value"},
        {"--set =3", {"=3"}, "<command line>:1: error: --set '=3' is not of the form key=value"},
        {"--set name=42", {"name=42"}, "<command line>:1: error: --set name=42: name must be a string, got an integer"},
        {"--set dtype=fp32", {"dtype=fp32"},
         "<command line>:1: error: --set dtype=fp32: dtype = \"fp32\" is not one of \"bf16\", \"fp16\""},
        {"--set: the second one is bad", {"top_k=4", "hidden=9"},
         "<command line>:2: error: --set hidden=9: hidden (9) must be a multiple of 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CASE(bad[i].label);
        int n = bad[i].sets[1] ? 2 : 1;
        CHECKF(load_with(&s, MINIMAL, bad[i].sets, n, &d) != 0, "loaded");
        CHECK_STREQ(d.msg, bad[i].want);
    }

    CASE("moegen check --set");
    char *out, *err;
    int rc = run_moegen("check " MINIMAL " --set top_k=99", &out, &err);
    CHECKF(rc == 2, "exit %d", rc);
    CHECK_STREQ(err, "<command line>:1: error: --set top_k=99: top_k = 99 is out of range [1, 32]\n");
    CHECK_STREQ(out, "");
    free(out);
    free(err);
    rc = run_moegen("check " MINIMAL " --set foo", NULL, &err);
    CHECKF(rc == 2, "exit %d", rc);
    CHECK_STREQ(err, "<command line>:1: error: --set 'foo' is not of the form key=value\n");
    free(err);
    rc = run_moegen("check " SMALL " --set arch=sm_90a,sm_80 --set mesh.ep=2 --set router.score=sigmoid", &out, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    CHECKF(strstr(out, "score = \"sigmoid\"") && strstr(out, "ep = 2,") && strstr(out, "arch = { \"sm_90a\", \"sm_80\" }"),
           "%s", out);
    free(out);
    free(err);
}

/* ---- the canonical form and its hash ---------------------------------------- */

static void check_roundtrip(const char *label, const moe_spec_t *s) {
    CASE(label);
    char *canon = moe_spec_canonical(s);
    CHECK(canon != NULL);
    if (!canon)
        return;
    moe_spec_t t;
    moe_diag_t d;
    CHECKF(moe_spec_load(&t, "canonical.moe", canon, NULL, 0, &d) == 0, "%s\n%s", d.msg, canon);
    CHECK(spec_eq(s, &t));
    CHECK_STREQ(t.hash, s->hash);
    char *again = moe_spec_canonical(&t);
    CHECK(again && strcmp(again, canon) == 0); /* a fixed point */
    free(again);
    free(canon);
}

static void test_canonical(void) {
    moe_spec_t s, t;
    moe_diag_t d;

    CASE("canonical: defaults filled in");
    CHECKF(load_file(&s, MINIMAL, &d) == 0, "%s", d.msg);
    CHECK(is_hex32(s.hash));
    char *canon = moe_spec_canonical(&s);
    char *want = read_text("tests/golden/canonical/minimal.moe");
    CHECK(canon && want);
    if (canon && want)
        CHECK_STREQ(canon, want);
    CHECK(s.dtype == MOE_DTYPE_BF16 && s.tokens == 16384 && s.narch == 1 && s.arch[0] == MOE_ARCH_SM90A);
    CHECK(s.router.score == MOE_SCORE_SOFTMAX && s.router.renormalize && s.router.groups == 1 &&
          s.router.topk_groups == 1 && !s.router.bias && !s.router.logit_bias && s.router.scale == 1.0 &&
          s.router.group_topk == 2 && s.router.apply == MOE_APPLY_OUTPUT);
    CHECK(s.activation.alpha == 1.0 && s.activation.limit == 0.0 && s.activation.up_offset == 0.0 && !s.ffn_bias);
    CHECK(s.mesh.size[0] == 1 && s.mesh.size[1] == 1 && s.mesh.size[2] == 1);
    CHECK(s.mesh.order[0] == MOE_AXIS_DP && s.mesh.order[1] == MOE_AXIS_FSDP && s.mesh.order[2] == MOE_AXIS_EP);
    CHECK(s.mesh.nsharding == 2 && s.mesh.sharding[0] == MOE_AXIS_EP && s.mesh.sharding[1] == MOE_AXIS_FSDP);
    free(want);

    CASE("canonical: moegen check prints it and the hash");
    char *out, *err;
    int rc = run_moegen("check " MINIMAL, &out, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    char line[600];
    snprintf(line, sizeof line, "%s-- hash %s\n", canon ? canon : "", s.hash);
    CHECK_STREQ(out, line);
    CHECK_STREQ(err, "");
    /* what check prints is itself a spec with the same hash */
    CHECKF(load_text(&t, out, &d) == 0, "%s", d.msg);
    CHECK_STREQ(t.hash, s.hash);
    free(out);
    free(err);
    free(canon);

    CASE("canonical: explicit defaults, other order, comments");
    CHECKF(load_file(&t, "tests/specs/explicit_defaults.moe", &d) == 0, "%s", d.msg);
    CHECK(spec_eq(&s, &t));

    CASE("canonical: key order");
    CHECKF(load_text(&t, "ffn = 2048\nhidden = 1024\ntop_k = 2\nexperts = 8\nname = \"minimal\"\n", &d) == 0, "%s",
           d.msg);
    CHECK_STREQ(t.hash, s.hash);
    CHECKF(load_text(&t, "router = { renormalize = true, score = \"softmax\" }\nname = \"minimal\" ffn = 2048 "
                         "experts = 8 hidden = 1024 top_k = 2",
                     &d) == 0,
           "%s", d.msg);
    CHECK_STREQ(t.hash, s.hash);

    CASE("canonical: comments and whitespace");
    CHECKF(load_text(&t, "--[[ block\ncomment ]]\n\n\tname=\"minimal\";experts=8 ; top_k =\n 2\n"
                         "hidden = 0x400 -- hex is still 1024\nffn = 2048\n\n\n",
                     &d) == 0,
           "%s", d.msg);
    CHECK_STREQ(t.hash, s.hash);

    CASE("canonical: a changed value changes the hash");
    static const char *const changed[] = {
        "name = \"minimal2\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048",
        "name = \"minimal\" experts = 16 top_k = 2 hidden = 1024 ffn = 2048",
        "name = \"minimal\" experts = 8 top_k = 3 hidden = 1024 ffn = 2048",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1032 ffn = 2048",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2056",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 tokens = 16383",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 dtype = \"fp16\"",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 arch = \"sm_80\"",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 router = { scale = 1.5 }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 router = { renormalize = false }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 router = { logit_bias = true }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 router = { groups = 4, topk_groups = 2 }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 router = { apply = \"input\" }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 "
        "router = { groups = 4, topk_groups = 2, group_topk = 1 }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 activation = { limit = 7 }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 activation = { kind = \"geglu\" }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 ffn_bias = true",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 mesh = { ep = 2 }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 mesh = { order = { \"ep\", \"dp\", \"fsdp\" } }",
        "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 mesh = { expert_sharding = { \"fsdp\" } }",
    };
    char seen[sizeof changed / sizeof *changed][33];
    for (size_t i = 0; i < sizeof changed / sizeof *changed; i++) {
        CHECKF(load_text(&t, changed[i], &d) == 0, "%s: %s", changed[i], d.msg);
        CHECKF(strcmp(t.hash, s.hash) != 0, "same hash for %s", changed[i]);
        snprintf(seen[i], sizeof seen[i], "%s", t.hash);
        for (size_t j = 0; j < i; j++)
            CHECKF(strcmp(seen[i], seen[j]) != 0, "'%s' and '%s' hash the same", changed[i], changed[j]);
    }

    check_roundtrip("canonical round trip: minimal", &s);
    CHECKF(load_file(&s, SMALL, &d) == 0, "%s", d.msg);
    check_roundtrip("canonical round trip: small", &s);
    const char *o[] = {"router.score=sigmoid", "router.groups=4",       "router.topk_groups=1",
                       "router.group_topk=1",  "router.bias=true",      "router.scale=2.5",
                       "router.apply=input",   "activation.alpha=1.702", "activation.limit=7",
                       "activation.up_offset=1"};
    CHECKF(load_with(&s, SMALL, o, 10, &d) == 0, "%s", d.msg);
    CHECK(s.router.group_topk == 1 && s.router.apply == MOE_APPLY_INPUT);
    check_roundtrip("canonical round trip: every router and activation key", &s);
    const char *o2[] = {"mesh.dp=2", "mesh.fsdp=2", "mesh.ep=3", "mesh.order=ep,dp,fsdp", "mesh.expert_sharding=fsdp,ep",
                        "dtype=fp16", "ffn_bias=true", "arch=sm_80,sm_90a"};
    CHECKF(load_with(&s, SMALL, o2, 8, &d) == 0, "%s", d.msg);
    check_roundtrip("canonical round trip: mesh, dtype, arch order", &s);
    const char *o3[] = {"mesh.ep=2", "dispatch.mode=capacity", "dispatch.capacity=100"};
    CHECKF(load_with(&s, SMALL, o3, 3, &d) == 0, "%s", d.msg);
    check_roundtrip("canonical round trip: dispatch", &s);
    CHECK(s.dispatch.mode == MOE_DISPATCH_CAPACITY && s.dispatch.capacity == 100);
    const char *o5[] = {"activation.kind=geglu", "activation.limit=7", "activation.up_offset=1"};
    CHECKF(load_with(&s, SMALL, o5, 3, &d) == 0, "%s", d.msg);
    check_roundtrip("canonical round trip: geglu", &s);
    CASE("canonical: geglu has no alpha");
    CHECK(s.activation.kind == MOE_ACT_GEGLU && s.activation.limit == 7 && s.activation.up_offset == 1);
    canon = moe_spec_canonical(&s);
    CHECK(canon && strstr(canon, "activation = { kind = \"geglu\", limit = 7, up_offset = 1 }\n"));
    free(canon);
    const char *o6[] = {"activation.kind=geglu", "activation.limit=7", "activation.up_offset=1",
                        "activation.alpha=1.702"};
    CHECKF(load_with(&t, SMALL, o6, 4, &d) == 0, "%s", d.msg);
    CHECK(t.activation.alpha == 1.0 && strcmp(t.hash, s.hash) == 0); /* alpha is swiglu's: reset, not hashed */
    CASE("canonical: dispatch is reset and left out without EP");
    const char *o4[] = {"dispatch.mode=capacity", "dispatch.capacity=100"};
    CHECKF(load_with(&s, SMALL, o4, 2, &d) == 0, "%s", d.msg);
    CHECK(s.dispatch.mode == MOE_DISPATCH_EXACT && s.dispatch.capacity == 0);
    canon = moe_spec_canonical(&s);
    CHECK(canon && !strstr(canon, "dispatch"));
    free(canon);
}

/* router.select (given routing): "topk" is the default and left out of the
 * canonical form (every spec before the key hashes as it did); "given" and
 * score "given" are written, hashed and read back. */
static void test_given_routing(void) {
    moe_spec_t s, t, u, v;
    moe_diag_t d;
    CASE("router.select: absent and \"topk\" are one spec, left out of the canonical form");
    CHECKF(load_file(&s, MINIMAL, &d) == 0, "%s", d.msg);
    CHECKF(load_text(&t, "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 "
                         "router = { select = \"topk\" }", &d) == 0, "%s", d.msg);
    CHECK(s.router.select == MOE_SELECT_TOPK && t.router.select == MOE_SELECT_TOPK && strcmp(s.hash, t.hash) == 0);
    char *canon = moe_spec_canonical(&t);
    CHECK(canon && !strstr(canon, "select"));
    free(canon);

    CASE("router.select = \"given\", with the router's scores or the caller's weights: written and hashed");
    CHECKF(load_text(&u, "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 "
                         "router = { select = \"given\", score = \"sqrtsoftplus\", scale = 1.5 }", &d) == 0,
           "%s", d.msg);
    CHECKF(load_text(&v, "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 "
                         "router = { select = \"given\", score = \"given\", renormalize = false }", &d) == 0,
           "%s", d.msg);
    CHECK(u.router.select == MOE_SELECT_GIVEN && u.router.score == MOE_SCORE_SQRTSOFTPLUS);
    CHECK(v.router.select == MOE_SELECT_GIVEN && v.router.score == MOE_SCORE_GIVEN);
    CHECK(strcmp(u.hash, s.hash) != 0 && strcmp(v.hash, u.hash) != 0);
    canon = moe_spec_canonical(&v);
    CHECK(canon && strstr(canon, "select = \"given\"") && strstr(canon, "score = \"given\""));
    moe_spec_t w;
    CHECKF(canon && load_text(&w, canon, &d) == 0, "the canonical form reads back: %s", d.msg);
    CHECK(canon && strcmp(w.hash, v.hash) == 0);
    free(canon);
}

/* zero_experts (LongCat-Flash): absent and 0 are the same spec; a count is
 * written, hashed, read back, and widens the router (spec.h, moe_spec_scored). */
static void test_zero_experts(void) {
    moe_spec_t s, t, u;
    moe_diag_t d;
    CASE("zero_experts: absent and 0 are one spec, left out of the canonical form");
    CHECKF(load_file(&s, MINIMAL, &d) == 0, "%s", d.msg);
    CHECKF(load_text(&t, "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 zero_experts = 0", &d) == 0,
           "%s", d.msg);
    CHECK(s.zero_experts == 0 && t.zero_experts == 0 && strcmp(s.hash, t.hash) == 0);
    char *canon = moe_spec_canonical(&t);
    CHECK(canon && !strstr(canon, "zero_experts"));
    free(canon);
    CHECK(moe_spec_scored(&s) == 8 && moe_spec_router_columns(&s) == 8 && moe_spec_slots(&s) == 8 &&
          moe_spec_entries(&s) == 2);

    CASE("zero_experts: a count is written and hashed; the router scores E + Z, the slots stay E");
    CHECKF(load_text(&u, "name = \"minimal\" experts = 8 top_k = 2 hidden = 1024 ffn = 2048 zero_experts = 4 "
                         "router = { bias = true, renormalize = false, scale = 6 }", &d) == 0, "%s", d.msg);
    CHECK(u.zero_experts == 4 && strcmp(u.hash, s.hash) != 0);
    canon = moe_spec_canonical(&u);
    CHECK(canon && strstr(canon, "\nzero_experts = 4\n"));
    free(canon);
    CHECK(moe_spec_scored(&u) == 12 && moe_spec_router_columns(&u) == 12 && moe_spec_slots(&u) == 8 &&
          moe_spec_entries(&u) == 2);
    check_roundtrip("canonical round trip: zero_experts", &u);

    CASE("zero_experts: --set and the top_k bound (at most the routed experts)");
    const char *o[] = {"zero_experts=256"};
    CHECKF(load_with(&t, SMALL, o, 1, &d) == 0, "%s", d.msg);
    CHECK(t.zero_experts == 256);
    CHECK(load_text(&t, "name = \"z\" experts = 4 zero_experts = 8 top_k = 6 hidden = 64 ffn = 64", &d) != 0 &&
          strstr(d.msg, "top_k (6) must not exceed experts (4)"));
}

/* ---- the schema ------------------------------------------------------------ */

static int key_top_len(const char *name) { return (int)strcspn(name, "."); }

/* The table as data: what the loader and the canonical form rely on. */
static void test_schema_rows(void) {
    CASE("schema: size");
    CHECKF(moe_spec_nkeys > 0 && moe_spec_nkeys <= MOE_SPEC_MAX_KEYS, "%d rows", moe_spec_nkeys);
    for (int i = 0; i < moe_spec_nkeys; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        char label[128];
        snprintf(label, sizeof label, "schema row %s", k->name);
        CASE(label);
        CHECK(k->help && k->help[0] && !strchr(k->help, '|') && !strchr(k->help, '\n'));
        CHECK(moe_spec_key(k->name) == k); /* names are unique */
        /* one level of nesting, and a table's keys are consecutive rows */
        const char *dot = strchr(k->name, '.');
        CHECK(!dot || !strchr(dot + 1, '.'));
        int tl = key_top_len(k->name);
        CHECK(tl < 32 && strlen(k->name) < 64);
        for (int j = 0; j + 1 < i; j++)
            if (key_top_len(moe_spec_keys[j].name) == tl && strncmp(moe_spec_keys[j].name, k->name, tl) == 0)
                CHECKF(key_top_len(moe_spec_keys[i - 1].name) == tl &&
                           strncmp(moe_spec_keys[i - 1].name, k->name, tl) == 0,
                       "the keys of %.*s are not consecutive", tl, k->name);
        CHECK(!(k->required && k->optional));
        /* optional: 0 means absent; an ENUM's default choice is that 0 ("none", left out of the canonical form),
         * a BOOL's false */
        CHECK(!k->optional || k->type == MOE_KEY_INT || k->type == MOE_KEY_NUM ||
              (k->type == MOE_KEY_BOOL && k->def == 0) ||
              (k->type == MOE_KEY_ENUM && k->def == 0 && (!k->values || k->values[0] == 0)));
        if (k->type == MOE_KEY_INT || k->type == MOE_KEY_NUM) {
            CHECK(k->lo <= k->hi);
            if (!k->required && !k->optional)
                CHECKF(k->def >= k->lo && k->def <= k->hi, "default %g outside [%g, %g]", k->def, k->lo, k->hi);
            if (k->optional) /* 0 means absent: out of range, or the value that means none (zero_experts = 0) */
                CHECK(k->lo > 0 || k->hi < 0 || (k->type == MOE_KEY_INT && k->lo == 0));
        }
        if (k->type == MOE_KEY_INT)
            CHECK(k->lo == (int)k->lo && k->hi == (int)k->hi);
        if (k->type == MOE_KEY_IDENT)
            CHECK(k->hi >= 1 && k->hi < MOE_NAME_MAX);
        if (k->type == MOE_KEY_ENUM || k->type == MOE_KEY_LIST) {
            int n = moe_key_nchoices(k);
            CHECK(n >= 1 && (k->type == MOE_KEY_ENUM || n <= MOE_KEY_LIST_MAX)); /* a list's choices fit def_list */
            if (k->type == MOE_KEY_ENUM)
                CHECK(k->def >= 0 && k->def < n);
            else
                CHECK(k->ndef_list >= 1 && k->ndef_list <= n && (k->count_offset || k->ndef_list == n));
            for (int j = 0; k->type == MOE_KEY_LIST && j < k->ndef_list; j++)
                CHECK(k->def_list[j] >= 0 && k->def_list[j] < n);
        } else {
            CHECK(k->choices == NULL && k->values == NULL && k->refused == NULL);
        }
        CHECK(k->multiple == 0 || k->type == MOE_KEY_INT);
        if (k->when_is) { /* a choice of an enum key */
            const moe_key_t *o = moe_spec_key(k->when ? k->when : "");
            int known = 0;
            for (int j = 0; o && o->type == MOE_KEY_ENUM && o->choices[j]; j++)
                known |= strcmp(o->choices[j], k->when_is) == 0;
            CHECKF(known, "%s: when %s = \"%s\", not a choice of an enum key", k->name, k->when, k->when_is);
        }
        const char *rel[] = {k->at_most, k->divides, k->when_is ? NULL : k->when};
        for (int j = 0; j < 3; j++)
            if (rel[j]) {
                const moe_key_t *o = moe_spec_key(rel[j]);
                CHECKF(o && o->type == MOE_KEY_INT, "%s names '%s', not an integer key", k->name, rel[j]);
            }
    }
}

/* Every row, through the loader: a value of the wrong type and, for numbers,
 * one just outside the range are refused with the row's message; a spec
 * that leaves the row out gets its default. */
static void test_schema_loader(void) {
    moe_spec_t s, base;
    moe_diag_t d;
    CASE("schema: defaults");
    CHECKF(load_file(&base, MINIMAL, &d) == 0, "%s", d.msg);
    moe_spec_t def;
    memset(&def, 0, sizeof def);
    moe_spec_set_defaults(&def);
    for (int i = 0; i < moe_spec_nkeys; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        if (k->required)
            continue;
        size_t size = k->type == MOE_KEY_NUM ? sizeof(double) : k->type == MOE_KEY_BOOL ? sizeof(bool) : sizeof(int);
        if (k->type == MOE_KEY_LIST)
            size *= (size_t)k->ndef_list;
        CHECKF(memcmp((char *)&base + k->offset, (char *)&def + k->offset, size) == 0, "%s: not its default",
               k->name);
    }

    static const char *const type_words[] = {"a string", "an integer", "a number", "true or false", "a string",
                                             "a list of strings"};
    for (int i = 0; i < moe_spec_nkeys; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        char label[128], set[160], want[400];
        snprintf(label, sizeof label, "schema row %s: wrong type", k->name);
        CASE(label);
        /* a boolean where anything else is expected; a string for a boolean */
        snprintf(set, sizeof set, "%s=%s", k->name, k->type == MOE_KEY_BOOL ? "yes" : "true");
        snprintf(want, sizeof want, "<command line>:1: error: --set %s: %s must be %s, got %s", set, k->name,
                 type_words[k->type], k->type == MOE_KEY_BOOL ? "a string" : "a boolean");
        const char *sets[] = {set};
        CHECKF(load_with(&s, MINIMAL, sets, 1, &d) != 0, "%s loaded", set);
        CHECK_STREQ(d.msg, want);
        if (k->type != MOE_KEY_INT && k->type != MOE_KEY_NUM)
            continue;
        snprintf(label, sizeof label, "schema row %s: out of range", k->name);
        CASE(label);
        if (k->type == MOE_KEY_INT) {
            snprintf(set, sizeof set, "%s=%lld", k->name, (long long)k->hi + 1);
            snprintf(want, sizeof want, "<command line>:1: error: --set %s: %s = %lld is out of range [%lld, %lld]",
                     set, k->name, (long long)k->hi + 1, (long long)k->lo, (long long)k->hi);
        } else {
            snprintf(set, sizeof set, "%s=%.17g", k->name, k->hi * 2);
            snprintf(want, sizeof want, "<command line>:1: error: --set %s: %s = %g is out of range [%g, %g]", set,
                     k->name, k->hi * 2, k->lo, k->hi);
        }
        CHECKF(load_with(&s, MINIMAL, sets, 1, &d) != 0, "%s loaded", set);
        CHECK_STREQ(d.msg, want);
    }
}

/* The value of the Lua expression `expr` over the table at the stack top
 * (named spec), as text. */
static const char *lua_value(lua_State *L, const char *expr, char *buf, size_t n) {
    char chunk[256];
    snprintf(chunk, sizeof chunk, "local spec = ... return tostring(%s)", expr);
    if (luaL_loadstring(L, chunk) != LUA_OK) {
        snprintf(buf, n, "%s", lua_tostring(L, -1));
    } else {
        lua_pushvalue(L, -2);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK)
            snprintf(buf, n, "%s", lua_tostring(L, -1));
        else
            snprintf(buf, n, "%s", lua_tostring(L, -1));
    }
    lua_pop(L, 1);
    return buf;
}

/* moe_spec_push_lua: the templates' view of the spec, from the rows. */
static void test_schema_lua(void) {
    moe_spec_t s;
    moe_diag_t d;
    char buf[200];
    CASE("schema: the spec as a Lua table");
    const char *o[] = {"mesh.ep=2", "dispatch.mode=capacity", "dispatch.capacity=64", "arch=sm_90a,sm_80",
                       "router.scale=2.5", "activation.limit=7"};
    CHECKF(load_with(&s, SMALL, o, 6, &d) == 0, "%s", d.msg);
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    moe_spec_push_lua(L, &s);
    static const struct {
        const char *expr, *want;
    } cases[] = {
        {"spec.name", "small"},
        {"math.type(spec.experts)", "integer"},
        {"spec.activation.kind", "swiglu"},
        {"spec.activation.limit", "7.0"},
        {"spec.router.scale", "2.5"},
        {"spec.router.renormalize", "true"},
        {"spec.router.score", "softmax"},
        {"spec.mesh.ep", "2"},
        {"table.concat(spec.mesh.order, ',')", "dp,fsdp,ep"},
        {"table.concat(spec.mesh.expert_sharding, ',')", "ep,fsdp"},
        {"table.concat(spec.arch, ',')", "sm_90a,sm_80"},
        {"spec.dispatch.mode", "capacity"},
        {"spec.dispatch.capacity", "64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        CHECK_STREQ(lua_value(L, cases[i].expr, buf, sizeof buf), cases[i].want);
    lua_pop(L, 1);
    CASE("schema: the Lua table leaves out what the canonical form leaves out");
    CHECKF(load_file(&s, SMALL, &d) == 0, "%s", d.msg);
    moe_spec_push_lua(L, &s);
    CHECK_STREQ(lua_value(L, "spec.activation.limit", buf, sizeof buf), "nil");
    CHECK_STREQ(lua_value(L, "spec.dispatch.mode", buf, sizeof buf), "nil");
    CHECK_STREQ(lua_value(L, "next(spec.dispatch)", buf, sizeof buf), "nil");
    lua_close(L);
}

/* README's spec-key table between its two marker lines. Caller frees. */
static char *readme_keys(void) {
    char *text = read_text(README);
    if (!text)
        return NULL;
    char *a = strstr(text, KEYS_BEGIN), *b = strstr(text, KEYS_END);
    char *out = NULL;
    if (a && b && (a = strchr(a, '\n')) && a < b) {
        a++;
        while (*a == '\n')
            a++;
        while (b > a && b[-1] == '\n')
            b--;
        out = strndup(a, (size_t)(b - a) + 1); /* with the last row's newline */
    }
    free(text);
    return out;
}

static void test_schema_readme(void) {
    CASE("schema: README's spec-key table is the schema's");
    char *want = moe_spec_keys_markdown();
    char *got = readme_keys();
    CHECKF(got != NULL, "%s has no table between \"%s\" and \"%s\"", README, KEYS_BEGIN, KEYS_END);
    if (got && want && strcmp(got, want) != 0) {
        /* name the first row that differs */
        const char *g = got, *w = want;
        while (*g && *g == *w)
            g++, w++;
        while (g > got && g[-1] != '\n')
            g--, w--;
        CHECKF(0, "README's table differs from the schema (build/tests/test_spec --keys prints it) at:\n"
                  "  README: %.*s\n  schema: %.*s", (int)strcspn(g, "\n"), g, (int)strcspn(w, "\n"), w);
    }
    CASE("schema: the README table names every key once");
    for (int i = 0; want && got && i < moe_spec_nkeys; i++) {
        char cell[96];
        snprintf(cell, sizeof cell, "| `%s` |", moe_spec_keys[i].name);
        const char *at = strstr(got, cell);
        CHECKF(at && !strstr(at + 1, cell), "%s", cell);
    }
    free(got);
    free(want);
}

/* ---- the example specs ------------------------------------------------------ */

static void test_examples(void) {
    static char names[64][128];
    CASE("examples: folder");
    int n = list_specs("examples/specs", names, 64);
    CHECKF(n >= 5, "%d example specs", n);
    for (int i = 0; i < n; i++) {
        char path[300], label[200];
        snprintf(path, sizeof path, "examples/specs/%s.moe", names[i]);
        snprintf(label, sizeof label, "example %s", names[i]);
        CASE(label);
        moe_spec_t s;
        moe_diag_t d;
        CHECKF(load_file(&s, path, &d) == 0, "%s", d.msg);
        moe_plan_desc_t pd;
        char err[512];
        CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) == 0, "%s", err);
        moe_plan_desc_free(&pd);
        check_roundtrip(label, &s);
        CASE(label);
        char args[400], *e;
        snprintf(args, sizeof args, "check %s", path);
        int rc = run_moegen(args, NULL, &e);
        CHECKF(rc == 0, "moegen check exit %d: %s", rc, e);
        free(e);
        snprintf(args, sizeof args, "plan %s", path);
        rc = run_moegen(args, NULL, &e);
        CHECKF(rc == 0, "moegen plan exit %d: %s", rc, e);
        free(e);
    }
    CASE("moegen plan: a training spec lists the backward kernels and the saved bytes per token");
    char *out = NULL, *e = NULL;
    int rc = run_moegen("plan tests/specs/train_softmax.moe", &out, &e);
    /* E 12, k 2, H 264, F 136: 2 (4H + 2F + 12) + 4E saved per token, 4kF more with U */
    CHECKF(rc == 0 && out && strstr(out, "train_softmax_bwd_dys_bf16_h264k2") &&
               strstr(out, "saved region: 3816 bytes per token saving U, 2728 recomputing it"),
           "exit %d: %s%s", rc, out ? out : "", e ? e : "");
    /* the backward GEMMs described as what they are on sm_90a (they once read "0x0 warps, mma.sync") */
    CHECKF(out && strstr(out, "train_softmax_wgrad_up_bf16_sm90a_tma_persist_m128n256k64s3c2g8") &&
               strstr(out, "tile 128x256x64, 3 stages, wgmma + TMA, persistent grid, 2 consumer warpgroups") &&
               !strstr(out, "0x0 warps"),
           "%s", out ? out : "");
    CHECKF(out && strstr(out, "weight gradients fp32;"), "the fp32 weight gradients named: %s", out ? out : "");
    free(out);
    free(e);
    /* weight_grads = "dtype": the wgrads named for their output, half the staging (128 x 128 x 2 bytes less) */
    rc = run_moegen("plan tests/specs/train_softmax_hgrad.moe", &out, &e);
    CHECKF(rc == 0 && out && strstr(out, "weight gradients bf16, weight_grads = \"dtype\";") &&
               strstr(out, "train_softmax_hgrad_wgrad_up_bf16_sm90a_tma_persist_m128n256k64s3c2g8_gbf16 threads  384"
                           "  smem 180272") &&
               strstr(out, "train_softmax_hgrad_dgrad_up_bf16_sm90a_tma_m128n256k64s4c2g8 "),
           "exit %d: %s%s", rc, out ? out : "", e ? e : "");
    /* where each backward GEMM's tile came from: a table's backward entry (FILE:LINE) or the heuristics */
    CHECKF(strstr(out ? out : "", "backward GEMM tiles: dgrad_down heuristics, dgrad_up heuristics, wgrad_up "
                                  "heuristics, wgrad_down heuristics\n"),
           "%s", out ? out : "");
    free(out);
    free(e);
    rc = run_moegen("plan tests/specs/train_softmax.moe --tuning tests/tune/bwd2.tune", &out, &e);
    CHECKF(rc == 0 && out && strstr(out, "backward GEMM tiles: dgrad_down tests/tune/bwd2.tune:8, dgrad_up "
                                         "tests/tune/bwd2.tune:9, wgrad_up tests/tune/bwd2.tune:10, wgrad_down "
                                         "tests/tune/bwd2.tune:11\n") &&
               strstr(out, "train_softmax_dgrad_down_bf16_sm90a_tma_pingpong_m64n128k64s6c2g8 "),
           "exit %d: %s%s", rc, out ? out : "", e ? e : "");
    free(out);
    free(e);
    rc = run_moegen("plan examples/specs/mixtral-8x7b.moe", &out, &e);
    CHECKF(rc == 0 && out && !strstr(out, "saved region") && !strstr(out, "backward GEMM tiles"),
           "a spec without training: %s", out ? out : "");
    free(out);
    free(e);
}

/* The fp8 example specs (examples/specs/fp8/, issue #20): each loads with
 * fp8 weights, round-trips, plans with the fp8 GEMMs (their names say
 * e4m3), and `moegen emit` and `moegen plan` take it. They live apart from
 * examples/specs/ (kernels_out/, test_gpu's example runs) while the fp8
 * forward is not built. */
static void test_examples_fp8(void) {
    static char names[64][128];
    CASE("examples fp8: folder");
    int n = list_specs("examples/specs/fp8", names, 64);
    CHECKF(n >= 3, "%d fp8 example specs", n);
    for (int i = 0; i < n; i++) {
        char path[300], label[200];
        snprintf(path, sizeof path, "examples/specs/fp8/%s.moe", names[i]);
        snprintf(label, sizeof label, "example fp8 %s", names[i]);
        CASE(label);
        moe_spec_t s;
        moe_diag_t d;
        CHECKF(load_file(&s, path, &d) == 0, "%s", d.msg);
        CHECKF(moe_spec_fp8(&s) && s.hidden % MOE_FP8_BLOCK == 0 && s.ffn % MOE_FP8_BLOCK == 0, "%s: not fp8", path);
        moe_plan_desc_t pd;
        char err[512];
        CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) == 0, "%s", err);
        /* every variant (tuning/h200.tune's e4m3 buckets) runs fp8 GEMMs, 64 rows a consumer warpgroup */
        for (int v = 0; v < pd.nvariants; v++) {
            const moe_plan_variant_t *pv = &pd.variants[v];
            CHECKF(strstr(pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_UP].name, "_e4m3_") &&
                       strstr(pv->kernels[MOE_ARCH_SM90A][MOE_K_GEMM_DOWN].name, "_e4m3_") &&
                       (pv->align == 64 || pv->align == 128),
                   "%s: variant %d (bucket %d): the GEMMs are not the fp8 ones", path, v, pv->bucket);
        }
        CHECKF(pd.align == pd.variants[pd.nvariants - 1].align, "%s: align %d", path, pd.align);
        moe_plan_desc_free(&pd);
        check_roundtrip(label, &s);
        CASE(label);
        char args[600], dir[300], *e;
        snprintf(dir, sizeof dir, "%s/fp8_%s", tmp_root, names[i]);
        snprintf(args, sizeof args, "emit %s -o %s", path, dir);
        int rc = run_moegen(args, NULL, &e);
        CHECKF(rc == 0, "moegen emit exit %d: %s", rc, e ? e : "");
        free(e);
        snprintf(args, sizeof args, "plan %s", path);
        rc = run_moegen(args, NULL, &e);
        CHECKF(rc == 0, "moegen plan exit %d: %s", rc, e ? e : "");
        free(e);
    }
}

/* ---- the command ------------------------------------------------------------ */

static void test_command(void) {
    char *out, *err;
    int rc;

    CASE("command: moegen is built");
    CHECKF(access(MOEGEN, X_OK) == 0, "%s is missing (run make)", MOEGEN);

    CASE("command: --help");
    rc = run_moegen("--help", &out, &err);
    CHECKF(rc == 0, "exit %d", rc);
    CHECKF(strncmp(out, "usage: moegen", 13) == 0, "%s", out);
    /* every command the usage lists has its own help */
    char cmds[16][32];
    int ncmds = 0;
    const char *p = strstr(out, "\ncommands:\n");
    for (p = p ? strchr(p + 1, '\n') + 1 : NULL; p && *p == ' ' && ncmds < 16; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *w = p;
        while (*w == ' ')
            w++;
        if (w - p != 2) /* continuation lines are indented further */
            continue;
        size_t l = strcspn(w, " \n");
        if (l > 0 && l < 32)
            snprintf(cmds[ncmds++], 32, "%.*s", (int)l, w);
    }
    free(out);
    free(err);
    CHECKF(ncmds >= 5, "the usage lists %d commands", ncmds);
    int has_emit = 0;
    for (int i = 0; i < ncmds; i++)
        has_emit |= strcmp(cmds[i], "emit") == 0;
    CHECK(has_emit);

    CASE("command: --version");
    rc = run_moegen("--version", &out, &err);
    CHECKF(rc == 0, "exit %d", rc);
    CHECKF(strncmp(out, "moegen 0.1.0 (NVRTC ", 20) == 0, "%s", out);
    free(out);
    free(err);

    for (int i = 0; i < ncmds; i++) {
        char args[64], want[64], label[64];
        snprintf(label, sizeof label, "command: help %s", cmds[i]);
        CASE(label);
        snprintf(args, sizeof args, "help %s", cmds[i]);
        snprintf(want, sizeof want, "usage: moegen %s", cmds[i]);
        rc = run_moegen(args, &out, &err);
        CHECKF(rc == 0, "exit %d", rc);
        CHECKF(strncmp(out, want, strlen(want)) == 0, "%s", out);
        CHECK_STREQ(err, "");
        free(out);
        free(err);
    }

    static const struct {
        const char *label, *args, *err_has;
    } usage[] = {
        {"command: no arguments", "", NULL},
        {"command: unknown command", "frobnicate " SMALL, "unknown command 'frobnicate'"},
        {"command: unknown option", "check " SMALL " --frobnicate", "unknown option '--frobnicate'"},
        {"command: help for no command", "help frobnicate", "no command 'frobnicate'"},
        {"command: check without a spec", "check", "check needs a SPEC file"},
        {"command: emit without -o", "emit " SMALL, "emit needs -o DIR"},
        {"command: -o without a value", "emit " SMALL " -o", "-o needs a value"},
        {"command: --set without a value", "check " SMALL " --set", "--set needs a value"},
        {"command: an extra argument", "check " SMALL " " SMALL, "unexpected argument"},
        {"command: a missing spec file", "check tests/specs/no_such_spec.moe",
         "tests/specs/no_such_spec.moe:1: error: cannot open"},
        {"command: plan --rank out of range", "plan " SMALL " --rank 1", "--rank 1 is out of range"},
        {"command: plan --rank not a number", "plan " SMALL " --rank x", "--rank needs a rank number"},
        {"command: an option of another command (check --templates)", "check " SMALL " --templates x",
         "--templates does not apply to check (only to emit, compile)"},
        {"command: plan -o", "plan " SMALL " -o x", "-o does not apply to plan"},
        {"command: check --json", "check " SMALL " --json", "--json does not apply to check"},
        {"command: --json=1", "plan " SMALL " --json=1", "--json takes no value"},
        {"command: --set= with nothing after", "check " SMALL " --set=", "--set '' is not of the form key=value"},
        {"command: --rank=x", "plan " SMALL " --rank=x", "--rank needs a rank number, got 'x'"},
        {"command: a planner refusal of a --set value names the command line",
         "check examples/specs/deepseek-v3-ep8-mesh.moe --set tokens=131072",
         "<command line>:1: error: tokens: a rank may receive 8388608 rows"},
    };
    for (size_t i = 0; i < sizeof usage / sizeof *usage; i++) {
        CASE(usage[i].label);
        rc = run_moegen(usage[i].args, &out, &err);
        CHECKF(rc == 2, "exit %d", rc);
        if (usage[i].err_has)
            CHECKF(strstr(err, usage[i].err_has) != NULL, "stderr: %s", err);
        free(out);
        free(err);
    }

    /* COMMAND --help is that command's help, listing every option it takes */
    static const struct {
        const char *cmd, *opts[5];
    } takes[] = {{"check", {"--set", "--tuning"}},
                 {"emit", {"-o", "--set", "--tuning", "--templates"}},
                 {"compile", {"-o", "--set", "--tuning", "--templates"}},
                 {"plan", {"--rank", "--json", "--set", "--tuning"}}};
    for (size_t i = 0; i < sizeof takes / sizeof *takes; i++) {
        char args[64], want[64], label[64];
        snprintf(label, sizeof label, "command: %s --help", takes[i].cmd);
        CASE(label);
        snprintf(args, sizeof args, "%s " SMALL " --help", takes[i].cmd);
        snprintf(want, sizeof want, "usage: moegen %s ", takes[i].cmd);
        rc = run_moegen(args, &out, &err);
        CHECKF(rc == 0 && strncmp(out, want, strlen(want)) == 0, "exit %d: %s", rc, out);
        const char *line_end = strchr(out, '\n');
        for (int k = 0; k < 5 && takes[i].opts[k]; k++) {
            const char *at = strstr(out, takes[i].opts[k]);
            CHECKF(at && line_end && at < line_end, "%s's usage line does not list %s: %s", takes[i].cmd,
                   takes[i].opts[k], out);
        }
        free(out);
        free(err);
    }

    CASE("command: --opt=value reads as --opt value");
    char *out2, *err2;
    rc = run_moegen("check " SMALL " --set top_k=4", &out, &err);
    int rc2 = run_moegen("check " SMALL " --set=top_k=4", &out2, &err2);
    CHECKF(rc == 0 && rc2 == 0 && strcmp(out, out2) == 0 && strstr(out, "top_k = 4"), "exit %d, %d: %s%s", rc, rc2,
           err, err2);
    free(out), free(err), free(out2), free(err2);
    rc = run_moegen("plan " SMALL " --rank=0 --json", &out, &err);
    CHECKF(rc == 0 && out[0] == '{', "exit %d: %s", rc, err);
    free(out), free(err);

    CASE("command: check - reads the spec from standard input");
    {
        char cmd[1024], o[300], e[300];
        snprintf(o, sizeof o, "%s/stdin_out", tmp_root);
        snprintf(e, sizeof e, "%s/stdin_err", tmp_root);
        snprintf(cmd, sizeof cmd, "%s check - < " SMALL " > %s 2> %s", MOEGEN, o, e);
        rc = system(cmd);
        char *so = read_text(o);
        rc2 = run_moegen("check " SMALL, &out, &err);
        CHECKF(rc == 0 && rc2 == 0 && so && strcmp(so, out) == 0, "status %d: %s", rc, so ? so : "");
        free(so), free(out), free(err);
        snprintf(cmd, sizeof cmd, "printf 'name = \"s\"\\nexperts = 8\\ntop_k = 9\\nhidden = 256\\nffn = 128\\n' | %s check - > %s 2> %s",
                 MOEGEN, o, e);
        rc = system(cmd);
        char *se = read_text(e);
        CHECKF(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && se && strncmp(se, "<stdin>:3: error: ", 18) == 0, "status %d: %s",
               rc, se ? se : "");
        free(se);
    }

    CASE("command: tune without a GPU fails before any progress line");
    char why[256];
    if (moe_cu_load(why, sizeof why) == 0) {
        SKIP("this machine has a CUDA driver");
    } else {
        rc = run_moegen("tune " SMALL, &out, &err);
        CHECKF(rc == 1 && strncmp(err, "moegen: error: tune needs a GPU: no CUDA driver", 47) == 0 &&
                   !strstr(err, "[1/"),
               "exit %d: %s", rc, err);
        free(out), free(err);
    }

    CASE("command: tune of an fp8 spec gets as far as the GPU check (its e4m3 candidates need the GPU)");
    rc = run_moegen("tune examples/specs/fp8/qwen3-30b-a3b-fp8.moe --tokens 1,64", &out, &err);
    CHECKF((rc == 1 && strstr(err, "tune needs a GPU")) || rc == 0, "exit %d: %s", rc, err);
    free(out), free(err);

    CASE("command: tune --grid with a name that is no grid exits 2 naming it, before the GPU check");
    rc = run_moegen("tune " SMALL " --grid gemv,tiles", &out, &err);
    CHECKF(rc == 2 && strstr(err, "moegen: error: --grid: 'tiles' is not tile, persist, pingpong, splitk, gemv, gemv3, gemv4, stream, chain, persist+mc or pingpong+mc") &&
               !strstr(err, "needs a GPU"),
           "exit %d: %s", rc, err);
    free(out), free(err);
    rc = run_moegen("tune " SMALL " --grid pingpong+mc,tile+mc", &out, &err); /* pairs of the persistent grids alone */
    CHECKF(rc == 2 && strstr(err, "moegen: error: --grid: 'tile+mc' is not tile,"), "exit %d: %s", rc, err);
    free(out), free(err);
    CASE("command: tune --grid persist+mc,pingpong+mc (the CTA pairs' candidates) gets as far as the GPU check");
    rc = run_moegen("tune " SMALL " --grid persist+mc,pingpong+mc --tokens 64", &out, &err);
    CHECKF((rc == 1 && strstr(err, "tune needs a GPU")) || rc == 0, "exit %d: %s", rc, err);
    free(out), free(err);
    rc = run_moegen("tune " SMALL " --grid", &out, &err);
    CHECKF(rc == 2 && strstr(err, "--grid needs a value"), "exit %d: %s", rc, err);
    free(out), free(err);

    CASE("command: check and plan of a good spec");
    rc = run_moegen("check " SMALL, &out, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    CHECK(strstr(out, "-- hash ") != NULL);
    free(out);
    free(err);
    rc = run_moegen("plan " SMALL, &out, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    CHECK(strstr(out, "small_route_") != NULL);
    free(out);
    free(err);
    rc = run_moegen("plan " SMALL " --json --rank 0", &out, &err);
    CHECKF(rc == 0, "exit %d: %s", rc, err);
    free(out);
    free(err);

    CASE("command: emit of a bad spec leaves an existing folder alone");
    char odir[300], keep[350], args[700];
    snprintf(odir, sizeof odir, "%s/existing", tmp_root);
    snprintf(keep, sizeof keep, "%s/keep.txt", odir);
    mkdir(odir, 0777);
    write_text(keep, "keep\n");
    snprintf(args, sizeof args, "emit %s/type_integer_got_float.moe -o %s", BAD_DIR, odir);
    rc = run_moegen(args, NULL, &err);
    CHECKF(rc == 2, "exit %d", rc);
    CHECK(dir_count(odir) == 1);
    char *k = read_text(keep);
    CHECK(k && strcmp(k, "keep\n") == 0);
    free(k);
    free(err);
    snprintf(args, sizeof args, "compile %s/type_integer_got_float.moe -o %s", BAD_DIR, odir);
    rc = run_moegen(args, NULL, &err);
    CHECKF(rc == 2, "exit %d", rc);
    CHECK(dir_count(odir) == 1);
    free(err);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--keys") == 0) { /* README's table, to paste */
        char *md = moe_spec_keys_markdown();
        fputs(md ? md : "", stdout);
        free(md);
        return md ? 0 : 1;
    }
    const char *td = getenv("TMPDIR");
    snprintf(tmp_root, sizeof tmp_root, "%s/moegen_test_spec.XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmp_root)) {
        perror(tmp_root);
        return 1;
    }
    test_command();
    test_golden_errors();
    test_sandbox();
    test_overrides();
    test_canonical();
    test_zero_experts();
    test_given_routing();
    test_schema_rows();
    test_schema_loader();
    test_schema_readme();
    test_schema_lua();
    test_examples();
    test_examples_fp8();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (system(cmd) != 0)
        fprintf(stderr, "test_spec: could not remove %s\n", tmp_root);
    return check_report("test_spec");
}
