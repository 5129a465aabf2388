/* test_abi.c — the version and struct-layout queries that bindings check
 * their mirrors against (runtime/abi.c): the version is gen/version.h's, and
 * each struct's listed fields tile it in declaration order, so a field added
 * to moe.h but not to the table is caught here. No GPU. */
#define _POSIX_C_SOURCE 200809L   /* popen */
#include "check.h"
#include "moe.h"
#include "moe_impl.h"
#include "version.h"

#include <stdint.h>
#include <stdlib.h>

/* moe_options and moe_plan_info as callers built against other headers pass
 * them: 0 (zero-initialized), older (smaller struct_size: the library reads
 * or writes no byte past it), newer (larger: unknown options must be 0,
 * unknown info fields are zeroed). */
static void test_growable(void) {
    CASE("growable structs: struct_size leads moe_options and moe_plan_info");
    size_t off = 1, sz = 0;
    CHECK_STREQ(moe_abi_field("moe_options", 0, &off, &sz), "struct_size");
    CHECK(off == 0 && sz == sizeof(size_t));
    CHECK_STREQ(moe_abi_field("moe_plan_info", 0, &off, &sz), "struct_size");
    CHECK(off == 0 && sz == sizeof(size_t));
    moe_options init = MOE_OPTIONS_INIT;
    moe_plan_info iinit = MOE_PLAN_INFO_INIT;
    CHECK(init.struct_size == sizeof(moe_options) && iinit.struct_size == sizeof(moe_plan_info));

    CASE("growable structs: moe_options with struct_size 0 reads the first layout");
    moe_options in = {.device = 3, .cudnn = MOE_CUDNN_OFF, .tuning_path = "t.tune"}, out;
    CHECK(moe_struct_in(&out, sizeof out, MOE_OPTIONS_V1_SIZE, &in, "moe_options") == MOE_OK);
    CHECK(out.struct_size == sizeof out && out.device == 3 && out.cudnn == MOE_CUDNN_OFF && out.tuning_path == in.tuning_path);

    CASE("growable structs: an older moe_options (up to cudnn) is read no further");
    moe_options old = {.device = 1, .cudnn_path = "/planted/libcudnn.so", .tuning_path = "/planted.tune"};
    old.struct_size = offsetof(moe_options, cudnn) + sizeof(int);
    CHECK(moe_struct_in(&out, sizeof out, MOE_OPTIONS_V1_SIZE, &old, "moe_options") == MOE_OK);
    CHECK(out.device == 1 && out.cudnn_path == NULL && out.tuning_path == NULL);

    CASE("growable structs: a newer moe_options: unknown fields 0 accepted, else refused");
    unsigned char *big = calloc(1, sizeof(moe_options) + 32);
    ((moe_options *)big)->struct_size = sizeof(moe_options) + 32;
    ((moe_options *)big)->device = 2;
    CHECK(moe_struct_in(&out, sizeof out, MOE_OPTIONS_V1_SIZE, big, "moe_options") == MOE_OK && out.device == 2);
    big[sizeof(moe_options) + 9] = 1;
    CHECK(moe_struct_in(&out, sizeof out, MOE_OPTIONS_V1_SIZE, big, "moe_options") == MOE_ERR_INVALID_ARG);
    CHECKF(strstr(moe_last_error(), "moe_options.struct_size is") && strstr(moe_last_error(), "newer"), "%s",
           moe_last_error());
    CASE("growable structs: through moe_plan_create, before the spec is read");
    moe_plan *plan = (moe_plan *)1;
    CHECK(moe_plan_create(&plan, "no/such/spec.moe", (moe_options *)big) == MOE_ERR_INVALID_ARG && plan == NULL);
    CHECK(moe_plan_create_from_dir(&plan, "no/such/dir", (moe_options *)big) == MOE_ERR_INVALID_ARG);
    CHECK(strstr(moe_last_error(), "newer") != NULL);
    free(big);
    moe_options tiny = {.struct_size = 3};
    CHECK(moe_struct_in(&out, sizeof out, MOE_OPTIONS_V1_SIZE, &tiny, "moe_options") == MOE_ERR_INVALID_ARG);

    CASE("growable structs: moe_plan_info written only up to the caller's struct_size");
    moe_plan_info full = {.struct_size = sizeof full, .name = "n", .experts = 8, .world = 2, .cudnn_version = 91900};
    unsigned char buf[sizeof(moe_plan_info) + 32];
    memset(buf, 0xAB, sizeof buf);
    size_t older = offsetof(moe_plan_info, world); /* a header before the mesh fields */
    *(size_t *)buf = older;
    CHECK(moe_struct_out(buf, &full, sizeof full, MOE_PLAN_INFO_V1_SIZE, "moe_plan_info") == MOE_OK);
    moe_plan_info got;
    memcpy(&got, buf, sizeof got);
    CHECK(got.struct_size == older && got.experts == 8 && strcmp(got.name, "n") == 0);
    int untouched = 1;
    for (size_t i = older; i < sizeof buf; i++)
        untouched &= buf[i] == 0xAB;
    CHECKF(untouched, "bytes past struct_size %zu were written", older);

    CASE("growable structs: moe_plan_info with 0 gets the first layout; a newer one its unknown tail zeroed");
    memset(buf, 0xAB, sizeof buf);
    *(size_t *)buf = 0;
    CHECK(moe_struct_out(buf, &full, sizeof full, MOE_PLAN_INFO_V1_SIZE, "moe_plan_info") == MOE_OK);
    memcpy(&got, buf, sizeof got);
    CHECK(got.struct_size == 0 && got.world == 2 && got.cudnn_version == 91900);
    CHECK(buf[MOE_PLAN_INFO_V1_SIZE] == 0xAB || MOE_PLAN_INFO_V1_SIZE == sizeof buf);
    memset(buf, 0xAB, sizeof buf);
    *(size_t *)buf = sizeof buf;
    CHECK(moe_struct_out(buf, &full, sizeof full, MOE_PLAN_INFO_V1_SIZE, "moe_plan_info") == MOE_OK);
    int zeroed = 1;
    for (size_t i = sizeof full; i < sizeof buf; i++)
        zeroed &= buf[i] == 0;
    CHECK(zeroed && *(size_t *)buf == sizeof buf);
    *(size_t *)buf = 5;
    CHECK(moe_struct_out(buf, &full, sizeof full, MOE_PLAN_INFO_V1_SIZE, "moe_plan_info") == MOE_ERR_INVALID_ARG);
}

/* the alignment a field of `size` bytes has in these structs: the largest
 * power of two dividing it, at most 8 (pointers, ints, arrays of them) */
static size_t field_align(size_t size) {
    size_t a = 1;
    while (a < 8 && size % (a * 2) == 0)
        a *= 2;
    return a;
}

/* The fields tile the struct: each starts at the previous one's end rounded
 * up to its own alignment, and the struct ends at the last one's end rounded
 * up to the largest alignment. */
static void check_tiles(const char *name, size_t size) {
    CASE(name);
    CHECKF(moe_abi_sizeof(name) == size, "%zu vs sizeof %zu", moe_abi_sizeof(name), size);
    size_t end = 0, max_align = 1, off, sz;
    int n = 0;
    const char *f;
    for (; (f = moe_abi_field(name, n, &off, &sz)); n++) {
        size_t a = field_align(sz);
        size_t want = (end + a - 1) / a * a;
        CHECKF(off == want, "field %s at %zu, expected %zu: a field before it is missing from runtime/abi.c", f, off,
               want);
        end = off + sz;
        if (a > max_align)
            max_align = a;
    }
    CHECKF(n > 0, "no fields");
    size_t want = (end + max_align - 1) / max_align * max_align;
    CHECKF(want == size, "fields end at %zu (padded %zu) but sizeof is %zu: a field at the end is missing from "
           "runtime/abi.c", end, want, size);
}

/* check.h's MOEGEN_TEST_CASE, on this program run again: the closing line of
 * `MOEGEN_TEST_CASE=filter self`, and its exit status. */
static int rerun(const char *self, const char *filter, char *line, size_t len) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "MOEGEN_TEST_CASE='%s' '%s' 2>/dev/null", filter, self);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    line[0] = 0;
    char buf[256];
    while (fgets(buf, sizeof buf, f))
        snprintf(line, len, "%s", buf);
    return pclose(f);
}

/* Whether `MOEGEN_TEST_PROGRESS=progress MOEGEN_TEST_CASE=filter self`
 * writes `want` on a line of its standard error. */
static int rerun_stderr_has(const char *self, const char *progress, const char *filter, const char *want) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "MOEGEN_TEST_PROGRESS='%s' MOEGEN_TEST_CASE='%s' '%s' 2>&1 >/dev/null", progress, filter,
             self);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    int found = 0;
    char buf[512];
    while (fgets(buf, sizeof buf, f))
        found |= strstr(buf, want) != NULL;
    pclose(f);
    return found;
}

static void test_case_filter(const char *self) {
    if (getenv("MOEGEN_TEST_CASE") || strchr(self, '\''))
        return;   /* the run below, or a path the shell command cannot quote */
    CASE("MOEGEN_TEST_CASE: one case's checks, counted alone; a filter that matches nothing fails");
    char line[256];
    int st = rerun(self, "growable structs: through moe_plan_create", line, sizeof line);
    CHECKF(st == 0 && strcmp(line, "test_abi: 4 passed, 0 failed\n") == 0, "status %d, %s", st, line);
    st = rerun(self, "no case is named this", line, sizeof line);
    CHECKF(st != 0 && strstr(line, "0 passed, 1 failed (MOEGEN_TEST_CASE=\"no case is named this\" matches no case)"),
           "status %d, %s", st, line);
    CASE("MOEGEN_TEST_PROGRESS: each kept case's name on stderr as it starts, with the counts so far; 0: none");
    const char *want =
        "case [growable structs: through moe_plan_create, before the spec is read] (so far 0 passed, 0 failed)";
    CHECK(rerun_stderr_has(self, "1", "growable structs: through moe_plan_create", want) == 1);
    CHECK(rerun_stderr_has(self, "0", "growable structs: through moe_plan_create", "case [") == 0);
    /* a case the filter leaves out is not printed */
    CHECK(rerun_stderr_has(self, "1", "growable structs: through moe_plan_create", "case [version]") == 0);
}

int main(int argc, char **argv) {
    (void)argc;
    CASE("version");
    CHECK_STREQ(moe_version(), MOEGEN_VERSION);
    char header[32];
    snprintf(header, sizeof header, "%d.%d.%d", MOE_VERSION_MAJOR, MOE_VERSION_MINOR, MOE_VERSION_PATCH);
    CHECK_STREQ(header, MOEGEN_VERSION); /* moe.h's numbers are gen/version.h's string */

    check_tiles("moe_options", sizeof(moe_options));
    check_tiles("moe_forward_args", sizeof(moe_forward_args));
    check_tiles("moe_weights", sizeof(moe_weights));
    check_tiles("moe_gather_args", sizeof(moe_gather_args));
    check_tiles("moe_plan_info", sizeof(moe_plan_info));
    check_tiles("moe_pack_src", sizeof(moe_pack_src));
    check_tiles("moe_pack_args", sizeof(moe_pack_args));
    check_tiles("moe_train_forward_args", sizeof(moe_train_forward_args));
    check_tiles("moe_backward_args", sizeof(moe_backward_args));
    check_tiles("moe_grad_scatter_args", sizeof(moe_grad_scatter_args));

    CASE("named fields");
    size_t off = 1, sz = 0;
    CHECK_STREQ(moe_abi_field("moe_forward_args", 0, &off, &sz), "tokens");
    CHECK(off == 0 && sz == sizeof(int));
    CHECK(moe_abi_field("moe_forward_args", 0, NULL, NULL) != NULL);

    CASE("unknown names and indices");
    CHECK(moe_abi_sizeof("moe_nothing") == 0);
    CHECK(moe_abi_sizeof(NULL) == 0);
    CHECK(moe_abi_field("moe_nothing", 0, &off, &sz) == NULL);
    CHECK(moe_abi_field(NULL, 0, &off, &sz) == NULL);
    CHECK(moe_abi_field("moe_options", -1, &off, &sz) == NULL);
    CHECK(moe_abi_field("moe_options", 1000, &off, &sz) == NULL);
    test_growable();
    test_case_filter(argv[0]);
    return check_report("test_abi");
}
