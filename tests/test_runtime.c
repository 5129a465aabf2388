#define _POSIX_C_SOURCE 200809L
/* test_runtime.c — the runtime's contract where no GPU is needed: status
 * codes and messages, argument checks, spec errors before any driver use,
 * and, on a machine without a driver or GPU, the clear status instead of a
 * failure to start. (The GPU half is test_gpu.) */
#include "check.h"
#include "cudnn.h"
#include "driver.h"
#include "ep.h"
#include "ep_plan.h"
#include "plan.h"
#include "moe.h"
#include "moe_impl.h"
#include "spec.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The cuDNN switch and tables, where no GPU is needed: a bad value fails
 * the plan before any driver use; the version table answers from what was
 * measured; specs the graph cannot express are named. */
static void test_cudnn_switch(void) {
    moe_plan *plan = NULL;
    CASE("cudnn: modes parse");
    CHECK(moe_cudnn_parse_mode("auto") == MOE_CUDNN_AUTO && moe_cudnn_parse_mode("on") == MOE_CUDNN_ON &&
          moe_cudnn_parse_mode("off") == MOE_CUDNN_OFF);
    CHECK(moe_cudnn_parse_mode("ON") == -1 && moe_cudnn_parse_mode("") == -1 && moe_cudnn_parse_mode(NULL) == -1);
    CASE("cudnn: a bad MOEGEN_CUDNN fails the plan before the driver, naming the value");
    setenv("MOEGEN_CUDNN", "sometimes", 1);
    moe_status st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "MOEGEN_CUDNN=sometimes") &&
               strstr(moe_last_error(), "auto, on or off"),
           "got %s: %s", moe_status_string(st), moe_last_error());
    CHECK(plan == NULL);
    CASE("cudnn: moe_options.cudnn overrides the environment");
    moe_options off = {.cudnn = MOE_CUDNN_OFF};
    st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", &off);
    CHECKF(st != MOE_ERR_INVALID_ARG, "got %s: %s", moe_status_string(st), moe_last_error());
    moe_plan_destroy(plan);
    plan = NULL;
    unsetenv("MOEGEN_CUDNN");
    CASE("cudnn: a bad moe_options.cudnn is refused");
    moe_options bad = {.cudnn = 9};
    st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", &bad);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "moe_options.cudnn = 9"), "got %s: %s",
           moe_status_string(st), moe_last_error());
    CASE("cudnn: the version table");
    char why[512];
    CHECK(moe_cudnn_graph_known(MOE_STAGE_UP, MOE_ARCH_SM90A, MOE_DTYPE_BF16, 91900, why, sizeof why) == 1);
    CHECK(moe_cudnn_graph_known(MOE_STAGE_DOWN, MOE_ARCH_SM90A, MOE_DTYPE_BF16, 92100, why, sizeof why) == 1);
    CHECK(moe_cudnn_graph_known(MOE_STAGE_UP, MOE_ARCH_SM90A, MOE_DTYPE_BF16, 91400, why, sizeof why) == 0);
    CHECKF(strstr(why, "cuDNN 9.14.0") && strstr(why, "from 9.19.0"), "why: %s", why);
    CHECK(moe_cudnn_graph_known(MOE_STAGE_UP, MOE_ARCH_SM90A, MOE_DTYPE_FP16, 91900, why, sizeof why) == 0);
    CHECKF(strstr(why, "never measured for fp16"), "why: %s", why);
    CHECK(moe_cudnn_graph_known(MOE_STAGE_DOWN, MOE_ARCH_SM80, MOE_DTYPE_BF16, 91900, why, sizeof why) == 0);
    CHECK(moe_cudnn_known_slower(MOE_STAGE_UP, MOE_ARCH_SM90A, why, sizeof why) == 1 && strstr(why, "TFLOP/s"));
    CHECK(moe_cudnn_known_slower(MOE_STAGE_UP, MOE_ARCH_SM80, why, sizeof why) == 0);
    CASE("cudnn: specs the graph cannot express");
    moe_spec_t s;
    moe_diag_t d;
    CHECK(moe_spec_load(&s, "b.moe", "name = 'b' experts = 4 top_k = 1 hidden = 64 ffn = 32 ffn_bias = true\n", NULL,
                        0, &d) == 0);
    CHECK(moe_cudnn_spec_fits(&s, 1, MOE_STAGE_UP, why, sizeof why) == 0 && strstr(why, "ffn_bias"));
    s.ffn_bias = false;
    CHECK(moe_cudnn_spec_fits(&s, 1, MOE_STAGE_DOWN, why, sizeof why) == 1);
    CHECK(moe_cudnn_spec_fits(&s, 8, MOE_STAGE_DOWN, why, sizeof why) == 0 && strstr(why, "mesh of 8"));
    CASE("cudnn: a missing path does not load, and says so");
    int v = -1;
    CHECK(moe_cudnn_load("/no/such/cudnn", &v, why, sizeof why) == -1);
    CHECKF(strstr(why, "/no/such/cudnn") || strstr(why, "without <cudnn_graph.h>"), "why: %s", why);
    char vs[32];
    moe_cudnn_version_string(91900, vs, sizeof vs);
    CHECK_STREQ(vs, "9.19.0");
}

/* The EP plan's sizes follow the mode: exact mode's receive side is sized
 * for every peer sending all its rows here, capacity mode's for C per peer;
 * too many tiles or positions are refused with the reason. */
/* MOEGEN_TUNING / moe_options.tuning_path: another tuning table for the
 * JIT, read before any driver use; its errors name the file and line. */
/* An on/off switch read when a plan is created (MOEGEN_ROUTE_FUSE: the
 * fused route; MOEGEN_PDL: launch overlap; MOEGEN_COMBINE_FUSE: the combine
 * folded into a gemv down GEMM): any other value fails the plan
 * before any driver use, naming the value (on a GPU test_gpu checks
 * moe_plan_info.route_fuse / .pdl and runs the cases under on and off). */
static void test_switch_refused(const char *label, const char *var, const char *value, const char *values) {
    moe_plan *plan = NULL;
    char want[96];
    CASE(label);
    snprintf(want, sizeof want, "%s=%s: expected %s", var, value, values);
    setenv(var, value, 1);
    moe_status st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), want),
           "got %s: %s", moe_status_string(st), moe_last_error());
    CHECK(plan == NULL);
    unsetenv(var);
}

static void test_tuning_switch(void) {
    moe_plan *plan = NULL;
    const char *spec = "examples/specs/mixtral-8x7b.moe";
    CASE("tuning: a missing MOEGEN_TUNING file fails the plan before the driver, naming it");
    setenv("MOEGEN_TUNING", "/nonexistent/h200.tune", 1);
    moe_status st = moe_plan_create(&plan, spec, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "/nonexistent/h200.tune") &&
               strstr(moe_last_error(), "MOEGEN_TUNING"),
           "got %s: %s", moe_status_string(st), moe_last_error());
    CHECK(plan == NULL);
    CASE("tuning: a bad table names its file and line");
    char bad[] = "/tmp/moegen-test-tune-XXXXXX";
    int fd = mkstemp(bad);
    const char *text = "# a table\n8 2 4096 14336 bf16 sm_90a 4096  128 256 64 4 2 8 sometimes  1 2 2026-12-03 H200\n";
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    moe_options o = {.tuning_path = bad};
    st = moe_plan_create(&plan, spec, &o);
    char want[128];
    snprintf(want, sizeof want, "%s:2: error: grid must be tile", bad);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), want) &&
               strstr(moe_last_error(), "moe_options.tuning_path"),
           "got %s: %s", moe_status_string(st), moe_last_error());
    CASE("tuning: a folder compiled under another table is refused before the driver, naming the kernel");
    char dir[] = "/tmp/moegen-test-dir-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cmd[256];
    snprintf(cmd, sizeof cmd, MOEGEN_BUILD "/moegen emit %s -o %s/out --tuning tests/tune/tile.tune", spec, dir);
    unsetenv("MOEGEN_TUNING");
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/out", dir);
    moe_options other = {.tuning_path = "tests/tune/persist.tune"};
    st = moe_plan_create_from_dir(&plan, cmd, &other);
    CHECKF(st == MOE_ERR_IO && strstr(moe_last_error(), "mixtral_8x7b_gemm_up_swiglu_bf16_sm90a_tma_persist_") &&
               strstr(moe_last_error(), "tuning table decides"),
           "got %s: %s", moe_status_string(st), moe_last_error());
    moe_options same = {.tuning_path = "tests/tune/tile.tune"};
    st = moe_plan_create_from_dir(&plan, cmd, &same);
    CHECKF(st != MOE_ERR_IO || !strstr(moe_last_error(), "tuning table decides"), "got %s: %s",
           moe_status_string(st), moe_last_error());
    moe_plan_destroy(plan);
    plan = NULL;
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    setenv("MOEGEN_TUNING", "/nonexistent/h200.tune", 1);
    CASE("tuning: an empty MOEGEN_TUNING is unset (as moegen reads it)");
    setenv("MOEGEN_TUNING", "", 1);
    st = moe_plan_create(&plan, spec, NULL);
    CHECKF(st != MOE_ERR_INVALID_ARG, "got %s: %s", moe_status_string(st), moe_last_error());
    moe_plan_destroy(plan);
    plan = NULL;
    setenv("MOEGEN_TUNING", "/nonexistent/h200.tune", 1);
    CASE("tuning: moe_options.tuning_path overrides MOEGEN_TUNING");
    o.tuning_path = "tuning/h200.tune";
    st = moe_plan_create(&plan, spec, &o);
    CHECKF(st != MOE_ERR_INVALID_ARG, "got %s: %s", moe_status_string(st), moe_last_error());
    moe_plan_destroy(plan);
    plan = NULL;
    unsetenv("MOEGEN_TUNING");
    unlink(bad);
}

static void test_ep_plan(void) {
    moe_spec_t s;
    moe_diag_t d;
    moe_plan_desc_t pd;
    moe_ep_desc_t ed;
    char err[256];
    const char *base = "name = 'e' experts = 64 top_k = 4 hidden = 128 ffn = 64 tokens = 1000 mesh = { ep = 4 }\n";
    CASE("ep plan: exact mode sizes");
    CHECK(moe_spec_load(&s, "e.moe", base, NULL, 0, &d) == 0 &&
          moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) == 0);
    CHECK(moe_ep_wanted(&s));
    CHECK(moe_ep_desc_build(&ed, &pd, 16, err, sizeof err) == 0);
    CHECK(ed.ep == 4 && ed.nheld == 16 && ed.capacity == 0 && ed.send_rows == 4000 && ed.stage_rows == 16000);
    CHECK(ed.recv_rows == 16000 + 16 * (pd.align - 1) && ed.max_tiles == ed.recv_rows / pd.align);
    CHECK(ed.ws[MOE_EW_SEND].bytes == 2 * 4001 * 128 && ed.ws[MOE_EW_HBUF].bytes == 2 * (size_t)ed.recv_rows * 64);
    CHECK(strstr(ed.k[MOE_EK_SEND_PLAN].name, "p4s16c0") != NULL);
    for (int i = 1; i < MOE_EW_COUNT; i++)
        CHECK(ed.ws[i].offset >= ed.ws[i - 1].offset + ed.ws[i - 1].bytes && ed.ws[i].offset % 256 == 0);
    CASE("ep plan: capacity mode sizes");
    moe_override_t o[2] = {{"dispatch.mode=capacity"}, {"dispatch.capacity=300"}};
    moe_plan_desc_free(&pd);
    CHECK(moe_spec_load(&s, "e.moe", base, o, 2, &d) == 0 &&
          moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) == 0);
    CHECK(moe_ep_desc_build(&ed, &pd, 16, err, sizeof err) == 0);
    CHECK(moe_plan_ep_desc(&pd)->capacity == 300 && moe_plan_ep_desc(&pd)->nheld == 16);
    CHECK(ed.capacity == 300 && ed.send_rows == 1200 && ed.stage_rows == 1200);
    CASE("ep plan: too many (rank, slot) positions is refused");
    CHECK(moe_ep_desc_build(&ed, &pd, 2048, err, sizeof err) != 0 && strstr(err, "at most 4096"));
    CASE("ep plan: too many receive tiles is refused, naming the fix");
    moe_override_t big = {"tokens=1000000"};
    moe_plan_desc_free(&pd);
    CHECK(moe_spec_load(&s, "e.moe", base, &big, 1, &d) == 0);
    CHECKF(moe_plan_desc_build(&pd, &s, moe_tuning_default(), err, sizeof err) != 0 && strstr(err, "capacity"), "%s",
           err);
    CASE("ep plan: a mesh of one has none");
    CHECK(moe_spec_load(&s, "e.moe", "name = 'e' experts = 8 top_k = 2 hidden = 64 ffn = 64", NULL, 0, &d) == 0);
    CHECK(!moe_ep_wanted(&s));
}

/* Run a shell command built like printf; its exit status (0 ok). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* moe_plan_create_from_dir on DIR/sub; MOE_ERR_IO expected when `refused`,
 * with `want` in the message; otherwise a plan, or (no GPU here) the
 * driver's status, after every file check passed. */
static void from_dir_case(const char *dir, const char *sub, int refused, const char *want) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    moe_plan *plan = NULL;
    moe_status st = moe_plan_create_from_dir(&plan, path, NULL);
    if (refused)
        CHECKF(st == MOE_ERR_IO && plan == NULL && strstr(moe_last_error(), want), "%s: got %s: %s", sub,
               moe_status_string(st), moe_last_error());
    else
        CHECKF(st == MOE_OK || st == MOE_ERR_NO_DRIVER || st == MOE_ERR_NO_GPU, "%s: got %s: %s", sub,
               moe_status_string(st), moe_last_error());
    moe_plan_destroy(plan);
}

/* A compiled folder is bound to its spec and kernels: its cubins load
 * only as `moegen compile` wrote them with that NAME.moe and manifest.
 * Every refusal comes before the driver, so it is checked here. */
static void test_compiled_folder(void) {
    char dir[] = "/tmp/moegen-test-folder-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const char *spec = "tests/specs/small.moe";
    CASE("compiled folder: as compile wrote it, it passes every file check");
    CHECK(sh(MOEGEN_BUILD "/moegen compile %s -o %s/ok", spec, dir) == 0);
    from_dir_case(dir, "ok", 0, NULL);
    CASE("compiled folder: its GEMM variants must be the ones this runtime plans");
    {
        /* small's heuristic tile at 512 tokens as the 256 bucket, and a 64-row variant below it: the folder
         * compiled without the table has the capacity's kernels but not the variant's */
        char tune[600], vdir[600];
        snprintf(tune, sizeof tune, "%s/variants.tune", dir);
        CHECK(sh("printf '12 3 1536 640 bf16 sm_90a 1 64 128 64 6 1 8 tile 1 2 2026-12-04 none\n"
                 "12 3 1536 640 bf16 sm_90a 256 128 256 64 4 2 8 tile 1 2 2026-12-04 none\n' > %s", tune) == 0);
        CHECK(sh(MOEGEN_BUILD "/moegen compile %s -o %s/variants --tuning %s", spec, dir, tune) == 0);
        CHECK(sh("grep -q '\"variants\": \\[' %s/variants/manifest.json && "
                 "grep -q 'small_gemm_up_swiglu_bf16_sm90a_tma_m64n128k64s6c1g8' %s/variants/manifest.json",
                 dir, dir) == 0);
        moe_options o = {.tuning_path = tune};
        moe_plan *plan = NULL;
        snprintf(vdir, sizeof vdir, "%s/ok", dir);
        moe_status st = moe_plan_create_from_dir(&plan, vdir, &o);
        CHECKF(st == MOE_ERR_IO && strstr(moe_last_error(), "small_permute_plan_e12_a64") &&
                   strstr(moe_last_error(), "a GEMM variant for calls of 1 tokens"),
               "got %s: %s", moe_status_string(st), moe_last_error());
        moe_plan_destroy(plan);
        plan = NULL;
        snprintf(vdir, sizeof vdir, "%s/variants", dir);
        st = moe_plan_create_from_dir(&plan, vdir, &o);
        CHECKF(st == MOE_OK || st == MOE_ERR_NO_DRIVER || st == MOE_ERR_NO_GPU, "got %s: %s", moe_status_string(st),
               moe_last_error());
        moe_plan_destroy(plan);
    }
    CASE("compiled folder: a compacted manifest reads the same");
    CHECK(sh("cp -r %s/ok %s/compact && tr -d '\\n' < %s/ok/manifest.json | sed 's/\": /\":/g' > "
             "%s/compact/manifest.json", dir, dir, dir, dir) == 0);
    from_dir_case(dir, "compact", 0, NULL);
    CASE("compiled folder: the manifest compile wrote is valid JSON; keys sorted and compacted, it reads the same");
    char mpath[512], rpath[512];
    snprintf(mpath, sizeof mpath, "%s/ok/manifest.json", dir);
    json_error_t je;
    json_t *m = json_load_file(mpath, JSON_REJECT_DUPLICATES, &je);
    CHECKF(m && json_is_object(m), "%s:%d: %s", mpath, je.line, je.text);
    CHECK(sh("cp -r %s/ok %s/sorted", dir, dir) == 0);
    snprintf(rpath, sizeof rpath, "%s/sorted/manifest.json", dir);
    CHECK(m && json_dump_file(m, rpath, JSON_SORT_KEYS | JSON_COMPACT) == 0);
    CHECK(sh("head -c 60 %s | grep -q '^{\"SPDX-License-Identifier\":\"MIT\",\"align\":'", rpath) == 0);
    from_dir_case(dir, "sorted", 0, NULL);
    CASE("compiled folder: a manifest whose keys come in another order (name and hash last) reads the same");
    CHECK(sh("cp -r %s/ok %s/reorder", dir, dir) == 0);
    snprintf(rpath, sizeof rpath, "%s/reorder/manifest.json", dir);
    json_t *r = json_object();
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) /* everything but the name and hash, then those */
        if (strcmp(key, "name") != 0 && strcmp(key, "hash") != 0)
            json_object_set(r, key, v);
    json_object_set(r, "name", json_object_get(m, "name"));
    json_object_set(r, "hash", json_object_get(m, "hash"));
    CHECK(json_dump_file(r, rpath, JSON_INDENT(1)) == 0);
    json_decref(r);
    from_dir_case(dir, "reorder", 0, NULL);
    CASE("compiled folder: a cubin hash of the wrong type is refused");
    CHECK(sh("cp -r %s/ok %s/wrongtype", dir, dir) == 0);
    snprintf(rpath, sizeof rpath, "%s/wrongtype/manifest.json", dir);
    json_t *w = json_deep_copy(m);
    json_object_set_new(json_object_get(json_object_get(w, "cubins"), "sm_80"), "bytes", json_string("12"));
    CHECK(json_dump_file(w, rpath, JSON_INDENT(2)) == 0);
    json_decref(w);
    from_dir_case(dir, "wrongtype", 1, "the cubin entry for sm_80 has no \"bytes\" or \"xxh3\"");
    json_decref(m);
    CASE("compiled folder: a truncated manifest is refused as JSON, naming the file, line and column");
    CHECK(sh("cp -r %s/ok %s/cut && head -c -3 %s/ok/manifest.json > %s/cut/manifest.json", dir, dir, dir, dir) == 0);
    from_dir_case(dir, "cut", 1, "cut/manifest.json:");
    CHECK(strstr(moe_last_error(), "error: the manifest is not valid JSON") != NULL);
    CASE("compiled folder: a manifest with a key given twice is refused");
    CHECK(sh("cp -r %s/ok %s/twice && sed 's/^{$/{\"name\": \"other\",/' %s/ok/manifest.json > "
             "%s/twice/manifest.json && grep -q other %s/twice/manifest.json", dir, dir, dir, dir, dir) == 0);
    from_dir_case(dir, "twice", 1, "is not valid JSON: duplicate object key");
    CASE("compiled folder: a manifest that is not an object, or names a path, is refused");
    CHECK(sh("cp -r %s/ok %s/array && echo '[1]' > %s/array/manifest.json", dir, dir, dir) == 0);
    from_dir_case(dir, "array", 1, "the manifest is not a JSON object");
    CHECK(sh("cp -r %s/ok %s/path && sed -i 's/\"name\": \"small\"/\"name\": \"..\\/small\"/' "
             "%s/path/manifest.json && grep -q '\"\\.\\./small' %s/path/manifest.json", dir, dir, dir, dir) == 0);
    from_dir_case(dir, "path", 1, "no \"name\" in the manifest");
    CASE("every committed kernels_out manifest is valid JSON");
    FILE *ls = popen("ls kernels_out/*/manifest.json", "r");
    char line[512];
    int nman = 0;
    while (ls && fgets(line, sizeof line, ls)) {
        line[strcspn(line, "\n")] = '\0';
        json_t *k = json_load_file(line, JSON_REJECT_DUPLICATES, &je);
        CHECKF(k && json_is_object(k) && json_is_object(json_object_get(k, "kernels")), "%s:%d: %s", line, je.line,
               je.text);
        json_decref(k);
        nman++;
    }
    if (ls)
        pclose(ls);
    CHECK(nman >= 10);
    CASE("compiled folder: emit with router.score = sigmoid over it leaves the softmax cubins unlisted");
    CHECK(sh("cp -r %s/ok %s/sigmoid && " MOEGEN_BUILD "/moegen emit %s --set router.score=sigmoid -o %s/sigmoid",
             dir, dir, spec, dir) == 0);
    from_dir_case(dir, "sigmoid", 1, "lists no compiled cubin for sm_90a");
    CASE("compiled folder: NAME.moe edited (ffn) is refused, naming both files");
    CHECK(sh("cp -r %s/ok %s/edited && sed -i 's/^ffn = 640$/ffn = 512/' %s/edited/small.moe && "
             "grep -q '^ffn = 512$' %s/edited/small.moe", dir, dir, dir, dir) == 0);
    from_dir_case(dir, "edited", 1, "edited/small.moe: the spec (hash");
    CHECK(strstr(moe_last_error(), "manifest.json records") != NULL);
    CASE("compiled folder: NAME.moe and the manifest's spec hash edited together: the cubin holds the old spec");
    CHECK(sh("cp -r %s/edited %s/both && "
             "h=$(" MOEGEN_BUILD "/moegen check %s/both/small.moe | sed -n 's/^-- hash //p') && "
             "sed -i \"s/\\\"hash\\\": \\\"[0-9a-f]*\\\"/\\\"hash\\\": \\\"$h\\\"/\" %s/both/manifest.json && "
             "grep -q \"$h\" %s/both/manifest.json", dir, dir, dir, dir, dir) == 0);
    from_dir_case(dir, "both", 1, "both/small.sm_90a.cubin: the cubin was not compiled from this spec");
    CASE("compiled folder: a truncated cubin is refused, naming it");
    CHECK(sh("cp -r %s/ok %s/short && truncate -s 4096 %s/short/small.sm_80.cubin", dir, dir, dir) == 0);
    from_dir_case(dir, "short", 1, "short/small.sm_80.cubin: the cubin is not the one the manifest records (4096 bytes");
    CASE("compiled folder: a cubin with one byte changed is refused, naming it");
    CHECK(sh("cp -r %s/ok %s/flip && printf 'Z' | dd of=%s/flip/small.sm_90a.cubin bs=1 seek=5000 conv=notrunc "
             "status=none", dir, dir, dir) == 0);
    from_dir_case(dir, "flip", 1, "flip/small.sm_90a.cubin: the cubin is not the one");
    CASE("compiled folder: a missing cubin is refused, naming it");
    CHECK(sh("cp -r %s/ok %s/gone && rm %s/gone/small.sm_80.cubin", dir, dir, dir) == 0);
    from_dir_case(dir, "gone", 1, "gone/small.sm_80.cubin");
    CASE("compiled folder, tuning table: a FIFO is refused at once, not waited on");
    CHECK(sh("mkdir %s/fifo && mkfifo %s/fifo/manifest.json %s/fifo/t.tune", dir, dir, dir) == 0);
    alarm(20);
    from_dir_case(dir, "fifo", 1, "fifo/manifest.json' is not a regular file");
    char tune[512];
    snprintf(tune, sizeof tune, "%s/fifo/t.tune", dir);
    moe_options o = {.tuning_path = tune};
    moe_plan *plan = NULL;
    moe_status st = moe_plan_create(&plan, spec, &o);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "t.tune' is not a regular file"), "got %s: %s",
           moe_status_string(st), moe_last_error());
    alarm(0);
    CHECK(sh("rm -rf %s", dir) == 0);
}

/* A plan object as far as the training calls read it before any driver
 * use (the spec, the plan tables, the launcher's backward set and slots):
 * their argument checks run on a machine without a GPU. Not a working plan. */
static moe_plan *paper_plan(const char *text) {
    moe_spec_t s;
    moe_diag_t d;
    char err[256];
    moe_plan *p = calloc(1, sizeof *p);
    if (!p || moe_spec_load(&s, "t.moe", text, NULL, 0, &d) ||
        moe_plan_desc_build(&p->pd, &s, moe_tuning_default(), err, sizeof err)) {
        free(p);
        return NULL;
    }
    p->launcher.pd = &p->pd;
    p->launcher.bwd = p->pd.has_bwd ? p->pd.bwd : NULL;
    p->launcher.slot_identity = 1;
    p->launcher.slots = moe_spec_slots(&s);
    return p;
}

static void paper_free(moe_plan *p) {
    if (p)
        moe_plan_desc_free(&p->pd);
    free(p);
}

/* The training API's refusals and sizes, before any driver use. */
static void test_training_api(void) {
    CASE("variants: NULL plan");
    CHECK(moe_plan_variant_count(NULL) == 0 && moe_plan_variant_for(NULL, 1) == -1);
    CHECK(moe_plan_route_fuse(NULL, 1) == -1);
    CHECK(moe_plan_variant(NULL, 0, NULL, NULL, NULL, NULL) == MOE_ERR_INVALID_ARG);
    CASE("training: NULL arguments");
    CHECK(moe_forward_train(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "NULL"));
    CHECK(moe_backward(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "NULL"));
    CHECK(moe_plan_saved_size(NULL, 1, 0) == 0 && moe_plan_backward_workspace_size(NULL, 1, 0) == 0);
    CHECK(moe_plan_train_workspace_size(NULL, 1) == 0);
    CHECK(moe_plan_saved_per_token(NULL, 0) == 0);
    CHECK(moe_plan_unpack_grad(NULL, MOE_TENSOR_W1, NULL, NULL, 1, NULL) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_saved_region(NULL, 0, 1, 0, "xs", NULL, NULL) == MOE_ERR_INVALID_ARG);

    const char *base = "name = 't' experts = 8 hidden = 64 ffn = 32 tokens = 100 ";
    char text[512];
    snprintf(text, sizeof text, "%s top_k = 2", base);
    moe_plan *plain = paper_plan(text);
    snprintf(text, sizeof text, "%s top_k = 2 training = true router = { logit_bias = true } ffn_bias = true", base);
    moe_plan *tr = paper_plan(text);
    snprintf(text, sizeof text, "%s top_k = 2 training = true shared = { ffn = 64, gate = 'sigmoid' }", base);
    moe_plan *shared = paper_plan(text), *ep = NULL;
    CHECK(plain && tr && shared);
    if (!plain || !tr || !shared)
        goto out;
    int dummy[64] __attribute__((aligned(256)));
    float g[4];
    moe_train_forward_args ta = {.fwd = {.tokens = 10, .x = dummy, .router_w = dummy, .router_logit_bias = g,
                                         .w1p = dummy, .b1p = dummy, .w2 = dummy, .b2 = dummy, .y = dummy,
                                         .workspace = dummy},
                                 .saved = dummy};
    moe_backward_args ba = {.tokens = 10, .saved = dummy, .x = dummy, .router_w = dummy, .w1p = dummy, .b1p = dummy,
                            .w2 = dummy, .b2 = dummy, .dy = dummy, .workspace = dummy, .dx = dummy,
                            .d_router_w = g, .d_logit_bias = g, .dw1p = g, .db1p = g, .dw2 = g, .db2 = g};
    moe_status st;

    CASE("training: a plan without training = true refuses both calls, naming the key");
    st = moe_forward_train(plain, &ta, NULL);
    CHECKF(st == MOE_ERR_UNSUPPORTED && strstr(moe_last_error(), "training = true") &&
               strstr(moe_last_error(), "spec key training"), "%s: %s", moe_status_string(st), moe_last_error());
    st = moe_backward(plain, &ba, NULL);
    CHECKF(st == MOE_ERR_UNSUPPORTED && strstr(moe_last_error(), "moe_backward") &&
               strstr(moe_last_error(), "spec key training"), "%s: %s", moe_status_string(st), moe_last_error());
    CHECK(moe_plan_unpack_grad(plain, MOE_TENSOR_W1, g, g + 1, 1, NULL) == MOE_ERR_UNSUPPORTED);
    CHECK(moe_plan_saved_size(plain, 10, 0) == 0 && moe_plan_saved_per_token(plain, 0) == 0);
    CHECK(moe_plan_saved_region(plain, 0, 10, 0, "xs", NULL, NULL) == MOE_ERR_UNSUPPORTED);
    CHECK(moe_reduce_scatter_grads(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "NULL"));
    moe_grad_scatter_args ga = {g, g, g, g, g + 1, g + 1, g + 1, g + 1, 0};
    st = moe_reduce_scatter_grads(plain, &ga, NULL);
    CHECKF(st == MOE_ERR_UNSUPPORTED && strstr(moe_last_error(), "moe_reduce_scatter_grads") &&
               strstr(moe_last_error(), "spec key training"), "%s: %s", moe_status_string(st), moe_last_error());

    CASE("training: a gated shared expert needs its gate and the gate's gradient");
    st = moe_backward(shared, &ba, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "d_shared_gate"), "%s", moe_last_error());
    st = moe_forward_train(shared, &ta, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "shared_gate is required"), "%s", moe_last_error());

    CASE("training: the router's own input and per-expert scales need router_x / the scales and their gradients");
    {
        snprintf(text, sizeof text, "%s top_k = 2 training = true router = { input = 'separate', expert_scale = true }",
                 base);
        moe_plan *own = paper_plan(text);
        CHECK(own != NULL);
        if (own) {
            moe_backward_args bo = ba;
            bo.d_logit_bias = bo.db1p = bo.db2 = NULL;
            st = moe_backward(own, &bo, NULL);
            CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router.input = \"separate\"") &&
                       strstr(moe_last_error(), "d_router_x are required"), "%s", moe_last_error());
            bo.router_x = dummy, bo.d_router_x = dummy;
            st = moe_backward(own, &bo, NULL);
            CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router.expert_scale") &&
                       strstr(moe_last_error(), "d_expert_scale are required"), "%s", moe_last_error());
            moe_train_forward_args to = ta;
            to.fwd.router_logit_bias = NULL, to.fwd.b1p = to.fwd.b2 = NULL;
            st = moe_forward_train(own, &to, NULL);
            CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router_x ([tokens, H]"), "%s",
                   moe_last_error());
            paper_free(own);
        }
    }

    CASE("training: the training forward's checks");
    moe_train_forward_args t2 = ta;
    t2.saved = NULL;
    CHECK(moe_forward_train(tr, &t2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "saved is required"));
    t2.saved = (char *)dummy + 16;
    CHECK(moe_forward_train(tr, &t2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "256-byte"));
    t2 = ta;
    t2.fwd.tokens = 101;
    CHECK(moe_forward_train(tr, &t2, NULL) == MOE_ERR_CAPACITY && strstr(moe_last_error(), "moe_forward_train"));
    t2 = ta;
    t2.fwd.b2 = NULL;
    CHECK(moe_forward_train(tr, &t2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "ffn_bias"));

    CASE("training: the backward's checks");
    moe_backward_args b2 = ba;
    b2.tokens = 101;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_CAPACITY && strstr(moe_last_error(), "spec key tokens"));
    b2 = ba;
    b2.tokens = -1;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG);
    b2 = ba;
    b2.recompute_u = 2;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "recompute_u = 2"));
    b2 = ba;
    b2.accumulate = 5;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "accumulate = 5"));
    b2 = ba;
    b2.dy = NULL;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "dy"));
    b2 = ba;
    b2.d_logit_bias = NULL;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "d_logit_bias"));
    b2 = ba;
    b2.db2 = NULL;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "ffn_bias"));
    b2 = ba;
    b2.dw1p = NULL;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "dw1p"));
    b2 = ba;
    b2.workspace = (char *)dummy + 8;
    CHECK(moe_backward(tr, &b2, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "256-byte"));

    CASE("training: the unpack's checks");
    CHECK(moe_plan_unpack_grad(tr, MOE_TENSOR_W2, g, g + 1, 1, NULL) == MOE_ERR_INVALID_ARG &&
          strstr(moe_last_error(), "plain already"));
    CHECK(moe_plan_unpack_grad(tr, MOE_TENSOR_B1, g, g + 1, 9, NULL) == MOE_ERR_INVALID_ARG &&
          strstr(moe_last_error(), "1..8"));
    CHECK(moe_plan_unpack_grad(tr, MOE_TENSOR_B1, g, g + 1, 1, NULL) == MOE_ERR_INVALID_ARG &&
          strstr(moe_last_error(), "overlaps"));

    CASE("training: saved sizes and regions");
    size_t save = moe_plan_saved_size(tr, 100, 0), rec = moe_plan_saved_size(tr, 100, 1);
    CHECK(save > rec && rec > 0 && moe_plan_saved_size(tr, 101, 0) == 0 && moe_plan_saved_size(tr, -1, 0) == 0);
    CHECK(moe_plan_saved_per_token(tr, 0) - moe_plan_saved_per_token(tr, 1) == (size_t)(2 * 4 * 32));
    CHECK(moe_plan_backward_workspace_size(tr, 100, 1) > moe_plan_backward_workspace_size(tr, 100, 0));
    CASE("training: the training forward's workspace is the routing scratch alone");
    {
        moe_ws_region_t w[MOE_WS_COUNT], f[MOE_WS_COUNT];
        const size_t tw = moe_plan_train_workspace_size(tr, 100), fw = moe_fwd_ws_layout(&tr->pd, 100, 0, f);
        CHECK(tw == moe_train_ws_layout(&tr->pd, 100, w) && tw > 0 && tw < fw);
        CHECK(w[MOE_WS_CURSOR].bytes == f[MOE_WS_CURSOR].bytes && w[MOE_WS_ROUTE_PART].bytes == f[MOE_WS_ROUTE_PART].bytes);
        CHECK(w[MOE_WS_XS].bytes == 0 && w[MOE_WS_HBUF].bytes == 0 && w[MOE_WS_TILES].bytes == 0);
        CHECK(w[MOE_WS_ROUTE_PART].offset + w[MOE_WS_ROUTE_PART].bytes <= tw && w[MOE_WS_ROUTE_PART].offset % 256 == 0);
        CHECK(moe_plan_train_workspace_size(tr, 101) == 0 && moe_plan_train_workspace_size(tr, -1) == 0);
        CHECK(moe_plan_train_workspace_size(plain, 100) == 0);
        CHECK(moe_plan_train_workspace_size(tr, 1) <= tw);
    }
    size_t off = 1, bytes = 1;
    CHECK(moe_plan_saved_region(tr, 0, 100, 1, "u", &off, &bytes) == MOE_OK && bytes == 0);
    CHECK(moe_plan_saved_region(tr, 0, 100, 0, "u", &off, &bytes) == MOE_OK && bytes > 0 && off % 256 == 0 &&
          off + bytes <= save);
    CHECK(moe_plan_saved_region(tr, 1, 100, 0, "dlogits", &off, &bytes) == MOE_OK && bytes == 4 * 100 * 8);
    CHECK(moe_plan_saved_region(tr, 0, 100, 0, "dlogits", &off, &bytes) == MOE_ERR_INVALID_ARG &&
          strstr(moe_last_error(), "no saved region 'dlogits'"));

    CASE("training on an EP rank: the saved region and the backward's workspace are the EP layouts");
    snprintf(text, sizeof text, "%s top_k = 2 training = true mesh = { ep = 2 }", base);
    ep = paper_plan(text);
    char err[256] = "";
    CHECKF(ep && moe_ep_create(&ep->ep, &ep->pd, 1, err, sizeof err) == MOE_OK, "%s", err);
    if (ep && ep->ep) {
        const moe_ep_desc_t *ed = moe_plan_ep_desc(&ep->pd);
        moe_ws_region_t r[MOE_ES_COUNT], b[MOE_EB_COUNT];
        const size_t es = moe_ep_saved_layout(ed, &ep->pd, 60, 0, r);
        CHECK(moe_plan_saved_size(ep, 60, 0) == es && moe_plan_saved_size(ep, 60, 1) < es);
        CHECK(moe_plan_backward_workspace_size(ep, 60, 1) == moe_ep_bwd_ws_layout(ed, &ep->pd, 60, 1, b));
        moe_ws_region_t wt[MOE_EW_COUNT], wf[MOE_EW_COUNT];
        const size_t et = moe_ep_train_ws_layout(ed, &ep->pd, 60, wt), ef = moe_ep_ws_layout(ed, &ep->pd, 60, wf);
        CHECK(moe_plan_train_workspace_size(ep, 60) == et && et < ef);
        for (int i = 0; i < MOE_EW_COUNT; i++) /* what the saved region holds takes no bytes; the rest as before */
            CHECKF(wt[i].bytes == (moe_ep_saved_of(i) >= 0 ? 0 : wf[i].bytes), "region %s: %zu bytes", wt[i].name,
                   wt[i].bytes);
        /* moe_plan_overflow reads the count at the plan's forward layout (ed->ws) whichever forward wrote it */
        CHECKF(wt[MOE_EW_OVERFLOW].offset == ed->ws[MOE_EW_OVERFLOW].offset &&
                   wf[MOE_EW_OVERFLOW].offset == ed->ws[MOE_EW_OVERFLOW].offset,
               "overflow count at %zu (training), %zu (forward at 60 tokens), %zu (the plan's)", wt[MOE_EW_OVERFLOW].offset,
               wf[MOE_EW_OVERFLOW].offset, ed->ws[MOE_EW_OVERFLOW].offset);
        CHECK(moe_plan_saved_region(ep, 0, 60, 0, "xr", &off, &bytes) == MOE_OK && off == r[MOE_ES_XR].offset &&
              bytes == r[MOE_ES_XR].bytes);
        CHECK(moe_plan_saved_region(ep, 1, 60, 1, "home", &off, &bytes) == MOE_OK && off == b[MOE_EB_HOME].offset &&
              bytes == b[MOE_EB_HOME].bytes);
        CHECK(moe_plan_saved_region(ep, 0, 60, 0, "xs", &off, &bytes) == MOE_ERR_INVALID_ARG);
        CHECK(moe_plan_saved_per_token(ep, 0) == moe_ep_saved_per_token(ed, &ep->pd, 0) &&
              moe_plan_saved_per_token(ep, 0) > 0);
        moe_train_forward_args te = ta;
        te.fwd.router_logit_bias = NULL;
        te.saved = (char *)dummy + 8;
        CHECK(moe_forward_train(ep, &te, NULL) == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "256-byte"));
        moe_ep_destroy(ep->ep);
        ep->ep = NULL;
    }
out:
    paper_free(ep);
    paper_free(plain);
    paper_free(tr);
    paper_free(shared);
}

/* Given routing's argument checks and tensors, before any driver use. */
static void test_given_api(void) {
    const char *base = "name = 't' experts = 8 top_k = 2 hidden = 64 ffn = 32 tokens = 100 ";
    char text[512];
    snprintf(text, sizeof text, "%s router = { select = 'given', score = 'sigmoid' }", base);
    moe_plan *ids = paper_plan(text);
    snprintf(text, sizeof text, "%s router = { select = 'given', score = 'given', renormalize = false }", base);
    moe_plan *both = paper_plan(text);
    moe_plan *plain = paper_plan(base);
    CHECK(ids && both && plain);
    if (!ids || !both || !plain)
        goto out;
    int dummy[64] __attribute__((aligned(256)));
    const moe_forward_args a = {.tokens = 10, .x = dummy, .router_w = dummy, .w1p = dummy, .w2 = dummy, .y = dummy,
                                .workspace = dummy};
    CASE("given routing: the caller's ids are required, naming the spec key and the tensor");
    moe_status st = moe_forward(ids, &a, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router.select = \"given\"") &&
               strstr(moe_last_error(), "topk_ids (int32 [tokens, top_k]) is required"), "%s: %s",
           moe_status_string(st), moe_last_error());
    CASE("given weights: topk_weights too, and router_w may be NULL");
    moe_forward_args b = a;
    b.router_w = NULL;
    b.topk_ids = dummy;
    st = moe_forward(both, &b, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "topk_weights (fp32 [tokens, top_k])") &&
               !strstr(moe_last_error(), "router_w"), "%s: %s", moe_status_string(st), moe_last_error());
    CASE("the router's own selection still needs router_w");
    b = a;
    b.router_w = NULL;
    st = moe_forward(plain, &b, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router_w, w1p, w2 and workspace are required"),
           "%s: %s", moe_status_string(st), moe_last_error());
    CASE("given routing: the tensors the plan names (moe_plan_tensor)");
    int rank = -1;
    int64_t dims[4];
    const char *dt = NULL;
    CHECK(moe_plan_tensor(ids, "topk_ids", &rank, dims, &dt) == MOE_OK && rank == 2 && dims[0] == 100 &&
          dims[1] == 2 && !strcmp(dt, "int32"));
    CHECK(moe_plan_tensor(ids, "topk_weights", &rank, dims, &dt) == MOE_OK && rank == 0);
    CHECK(moe_plan_tensor(ids, "router_w", &rank, dims, &dt) == MOE_OK && rank == 2);
    CHECK(moe_plan_tensor(both, "topk_weights", &rank, dims, &dt) == MOE_OK && rank == 2 && !strcmp(dt, "fp32"));
    CHECK(moe_plan_tensor(both, "router_w", &rank, dims, &dt) == MOE_OK && rank == 0);
    CHECK(moe_plan_tensor(plain, "topk_ids", &rank, dims, &dt) == MOE_OK && rank == 0);
    CASE("moe_plan_routing_errors: nothing to read without given routing; NULL refused");
    long long n = -1;
    CHECK(moe_plan_routing_errors(plain, dummy, NULL, &n) == MOE_OK && n == 0);
    CHECK(moe_plan_routing_errors(NULL, dummy, NULL, &n) == MOE_ERR_INVALID_ARG && n == 0);
    CHECK(moe_plan_routing_errors(ids, NULL, NULL, NULL) == MOE_ERR_INVALID_ARG);
out:
    paper_free(ids);
    paper_free(both);
    paper_free(plain);
}

/* The router's own input and per-expert scales (router.input, router.expert_scale): argument checks and
 * tensors, before any driver use. */
static void test_router_extras_api(void) {
    const char *base = "name = 't' experts = 8 top_k = 2 hidden = 64 ffn = 32 tokens = 100 ";
    char text[512];
    snprintf(text, sizeof text, "%s router = { score = 'softmax', input = 'separate' }", base);
    moe_plan *own = paper_plan(text);
    snprintf(text, sizeof text, "%s router = { score = 'softmax', expert_scale = true }", base);
    moe_plan *es = paper_plan(text);
    moe_plan *plain = paper_plan(base);
    CHECK(own && es && plain);
    if (!own || !es || !plain)
        goto out;
    int dummy[64] __attribute__((aligned(256)));
    const moe_forward_args a = {.tokens = 10, .x = dummy, .router_w = dummy, .w1p = dummy, .w2 = dummy, .y = dummy,
                                .workspace = dummy};
    CASE("router.input = \"separate\": router_x is required, naming the key and the tensor");
    moe_status st = moe_forward(own, &a, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router.input = \"separate\"") &&
               strstr(moe_last_error(), "router_x ([tokens, H]"), "%s: %s", moe_status_string(st), moe_last_error());
    CASE("router.expert_scale: router_expert_scale is required");
    st = moe_forward(es, &a, NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router_expert_scale (fp32 [E]) is required"),
           "%s: %s", moe_status_string(st), moe_last_error());
    CASE("router_x is not needed for an empty batch; router_expert_scale is (a weight, as router_w)");
    moe_forward_args z = a;
    z.tokens = 0;
    z.x = NULL, z.y = NULL;
    st = moe_forward(es, &z, NULL);
    CHECK(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router_expert_scale"));
    CASE("the router's own input and scales: the tensors the plan names (moe_plan_tensor)");
    int rank = -1;
    int64_t dims[4];
    const char *dt = NULL;
    CHECK(moe_plan_tensor(own, "router_x", &rank, dims, &dt) == MOE_OK && rank == 2 && dims[0] == 100 &&
          dims[1] == 64 && !strcmp(dt, "bf16"));
    CHECK(moe_plan_tensor(own, "router_expert_scale", &rank, dims, &dt) == MOE_OK && rank == 0);
    CHECK(moe_plan_tensor(es, "router_expert_scale", &rank, dims, &dt) == MOE_OK && rank == 1 && dims[0] == 8 &&
          !strcmp(dt, "fp32"));
    CHECK(moe_plan_tensor(es, "router_x", &rank, dims, &dt) == MOE_OK && rank == 0);
    CHECK(moe_plan_tensor(plain, "router_x", &rank, dims, &dt) == MOE_OK && rank == 0);
    CASE("router.hidden: router_x and router_w at the router's width (a latent MoE), x and w1p at hidden's");
    {
        snprintf(text, sizeof text, "%s router = { score = 'softmax', input = 'separate', hidden = 192 }", base);
        moe_plan *wide = paper_plan(text);
        CHECK(wide != NULL);
        CHECK(wide && moe_plan_tensor(wide, "router_x", &rank, dims, &dt) == MOE_OK && rank == 2 && dims[0] == 100 &&
              dims[1] == 192);
        CHECK(wide && moe_plan_tensor(wide, "router_w", &rank, dims, &dt) == MOE_OK && rank == 2 && dims[0] == 8 &&
              dims[1] == 192);
        CHECK(wide && moe_plan_tensor(wide, "x", &rank, dims, &dt) == MOE_OK && rank == 2 && dims[1] == 64);
        CHECK(wide && moe_plan_tensor(wide, "w1p", &rank, dims, &dt) == MOE_OK && rank == 3 && dims[2] == 64);
        st = wide ? moe_forward(wide, &a, NULL) : MOE_OK;
        CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "router_x ([tokens, router.hidden]"), "%s: %s",
               moe_status_string(st), moe_last_error());
        paper_free(wide);
    }
    CASE("router.weight_dtype = \"fp32\": router_w is fp32");
    {
        snprintf(text, sizeof text, "%s router = { score = 'softmax', weight_dtype = 'fp32' }", base);
        moe_plan *w32 = paper_plan(text);
        CHECK(w32 != NULL);
        CHECK(w32 && moe_plan_tensor(w32, "router_w", &rank, dims, &dt) == MOE_OK && rank == 2 && dims[0] == 8 &&
              dims[1] == 64 && !strcmp(dt, "fp32"));
        CHECK(moe_plan_tensor(plain, "router_w", &rank, dims, &dt) == MOE_OK && !strcmp(dt, "bf16"));
        paper_free(w32);
    }
out:
    paper_free(own);
    paper_free(es);
    paper_free(plain);
}

int main(void) {
    test_compiled_folder();
    test_given_api();
    test_router_extras_api();
    test_training_api();
    test_ep_plan();
    CASE("status strings");
    for (int s = MOE_OK; s <= MOE_ERR_UNSUPPORTED; s++)
        CHECKF(strcmp(moe_status_string((moe_status)s), "unknown status") != 0, "status %d has no string", s);
    CHECK_STREQ(moe_status_string(MOE_ERR_NO_DRIVER), "no CUDA driver");
    CHECK_STREQ(moe_status_string(MOE_ERR_NO_GPU), "no GPU");
    CHECK(MOE_OK == 0);

    CASE("NULL arguments");
    moe_plan *plan = (moe_plan *)1;
    CHECK(moe_plan_create(NULL, "x.moe", NULL) == MOE_ERR_INVALID_ARG);
    CHECK(moe_plan_create(&plan, NULL, NULL) == MOE_ERR_INVALID_ARG && plan == NULL);
    CHECK(moe_forward(NULL, NULL, NULL) == MOE_ERR_INVALID_ARG);
    CHECK(strstr(moe_last_error(), "NULL") != NULL);
    CHECK(moe_plan_workspace_size(NULL, 1) == 0);
    moe_plan_destroy(NULL);

    CASE("spec errors come before the driver");
    CHECK(moe_plan_create(&plan, "tests/specs/bad/top_k_gt_experts.moe", NULL) == MOE_ERR_SPEC && plan == NULL);
    CHECKF(strstr(moe_last_error(), "tests/specs/bad/top_k_gt_experts.moe:") == moe_last_error(),
           "message: %s", moe_last_error());
    CHECK(moe_plan_create(&plan, "no/such/file.moe", NULL) == MOE_ERR_SPEC);
    CHECK(strstr(moe_last_error(), "cannot open") != NULL);
    CASE("a planner refusal comes before the driver, naming the key's line");
    CHECK(moe_plan_create(&plan, "tests/specs/bad/plan_experts_over_route.moe", NULL) == MOE_ERR_SPEC && !plan);
    CHECK_STREQ(moe_last_error(), "tests/specs/bad/plan_experts_over_route.moe:4: error: experts (2048): the route "
                                  "kernel handles at most 1024 experts");

    CASE("a mesh larger than one device needs the communicator, checked before the driver");
    moe_status st = moe_plan_create(&plan, "tests/specs/mesh_ep2.moe", NULL);
    CHECKF(st == MOE_ERR_INVALID_ARG && plan == NULL, "got %s", moe_status_string(st));
    CHECKF(strstr(moe_last_error(), "2 devices") && strstr(moe_last_error(), "nccl_comm"), "message: %s",
           moe_last_error());
    CASE("a rank outside the mesh is refused");
    moe_options bad_rank = {.rank = 2};
    st = moe_plan_create(&plan, "tests/specs/mesh_ep2.moe", &bad_rank);
    CHECKF(st == MOE_ERR_INVALID_ARG && strstr(moe_last_error(), "rank 2 is outside the mesh of 2"), "got %s: %s",
           moe_status_string(st), moe_last_error());

    CASE("from_dir errors");
    CHECK(moe_plan_create_from_dir(&plan, "no/such/dir", NULL) == MOE_ERR_IO);
    CHECK(strstr(moe_last_error(), "manifest.json") != NULL);

    CASE("no driver or no GPU");
    char why[256];
    if (moe_cu_load(why, sizeof why) != 0) {
        st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
        CHECKF(st == MOE_ERR_NO_DRIVER, "got %s", moe_status_string(st));
        CHECKF(strncmp(moe_last_error(), "no CUDA driver: ", 16) == 0, "message: %s", moe_last_error());
        CHECK(plan == NULL);
    } else {
        int n = 0;
        if (moe_cu.cuInit(0) != CUDA_SUCCESS || moe_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
            st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
            CHECKF(st == MOE_ERR_NO_GPU, "got %s", moe_status_string(st));
        } else {
            SKIP("this machine has a GPU: the no-driver status is checked where there is none");
        }
    }
    CASE("moe_ep_example without a driver says so once (it printed 'cuInit not found: (null)' per rank)");
    if (moe_cu_load(why, sizeof why) == 0) {
        SKIP("this machine has a CUDA driver");
    } else if (access(MOEGEN_BUILD "/moe_ep_example", X_OK) != 0) {
        SKIP(MOEGEN_BUILD "/moe_ep_example is not built (make)");
    } else {
        FILE *ex = popen(MOEGEN_BUILD "/moe_ep_example 2>&1", "r");
        char out[2048] = "";
        size_t got = ex ? fread(out, 1, sizeof out - 1, ex) : 0;
        out[got] = '\0';
        int est = ex ? pclose(ex) : -1;
        CHECKF(est != 0 && strncmp(out, "moe_ep_example: the CUDA driver did not load: ", 46) == 0 &&
                   !strstr(out, "(null)") && strchr(out, '\n') == out + strlen(out) - 1,
               "status %d: %s", est, out);
    }
    test_cudnn_switch();
    test_switch_refused("route fuse: a bad MOEGEN_ROUTE_FUSE fails the plan before the driver, naming the value",
                        "MOEGEN_ROUTE_FUSE", "sometimes", "on or off");
    test_switch_refused("launch overlap: a bad MOEGEN_PDL fails the plan before the driver, naming the value",
                        "MOEGEN_PDL", "1", "on, off or auto");
    test_switch_refused("folded combine: a bad MOEGEN_COMBINE_FUSE fails the plan before the driver, naming the value",
                        "MOEGEN_COMBINE_FUSE", "maybe", "on or off");
    CASE("launch overlap: MOEGEN_PDL=auto (the tuning table's choice per call size) passes the switch");
    {
        moe_plan *plan = NULL;
        setenv("MOEGEN_PDL", "auto", 1);
        moe_status st = moe_plan_create(&plan, "examples/specs/mixtral-8x7b.moe", NULL);
        CHECKF(st != MOE_ERR_INVALID_ARG && st != MOE_ERR_SPEC, "got %s: %s", moe_status_string(st), moe_last_error());
        moe_plan_destroy(plan);
        unsetenv("MOEGEN_PDL");
        CHECK(moe_plan_pdl(NULL, 1) == -1);
    }
    test_tuning_switch();
    CASE("README's table of switches and the code's getenv calls name the same variables");
    {
        /* both lists, sorted and unique, as one line each */
        FILE *code = popen("grep -rhoE '(getenv|env_switch|env_mode)\\(\"MOEGEN_[A-Z_]+' gen runtime templates tests bench examples "
                           "| sed 's/.*\"//' | sort -u | tr '\\n' ' '", "r");
        FILE *doc = popen("grep -oE '^\\| `MOEGEN_[A-Z_]+`' README.md | sed 's/[|` ]//g' | sort -u | tr '\\n' ' '",
                          "r");
        char a[1024] = "", b[1024] = "";
        if (code) {
            if (!fgets(a, sizeof a, code))
                a[0] = '\0';
            pclose(code);
        }
        if (doc) {
            if (!fgets(b, sizeof b, doc))
                b[0] = '\0';
            pclose(doc);
        }
        CHECKF(a[0] != '\0', "no getenv(\"MOEGEN_...\") found in the code");
        CHECK_STREQ(a, b);
    }
    return check_report("test_runtime");
}
