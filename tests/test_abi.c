/* test_abi.c — the version and struct-layout queries that bindings check
 * their mirrors against (runtime/abi.c): the version is gen/version.h's, and
 * each struct's listed fields tile it in declaration order, so a field added
 * to moe.h but not to the table is caught here. No GPU. */
#include "check.h"
#include "moe.h"
#include "version.h"

#include <stdint.h>

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

int main(void) {
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
    return check_report("test_abi");
}
