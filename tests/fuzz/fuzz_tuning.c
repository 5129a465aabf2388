/* fuzz_tuning.c — libFuzzer harness over the tuning-table parser (`make
 * fuzz`). Every byte is table text (NULs included: the parser takes a
 * length). Asserts besides the sanitizers: an error has the FILE:LINE:
 * error: form; a table that parses answers lookups for a few specs
 * without crashing, and frees cleanly. */
#include "spec.h"
#include "tuning.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static moe_spec_t specs[3];
static int nspecs;

static void load_specs(void) {
    static const char *const texts[] = {
        "name='a' experts=8 top_k=2 hidden=4096 ffn=14336 tokens=16384",
        "name='b' experts=128 top_k=8 hidden=2048 ffn=768 tokens=4096 dtype='fp16'",
        "name='c' experts=32 top_k=8 hidden=7168 ffn=2048 tokens=128",
    };
    for (int i = 0; i < 3; i++) {
        moe_diag_t d;
        if (moe_spec_load(&specs[nspecs], "fuzz.moe", texts[i], NULL, 0, &d) == 0)
            nspecs++;
        else
            fprintf(stderr, "fuzz_tuning: seed spec %d: %s\n", i, d.msg);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!nspecs)
        load_specs();
    if (size > (1 << 16))
        return 0;
    moe_tuning_t t;
    moe_diag_t d;
    if (moe_tuning_parse(&t, "fuzz.tune", (const char *)data, size, &d) != 0) {
        if (!strstr(d.msg, ": error: ")) {
            fprintf(stderr, "fuzz_tuning: an error without FILE:LINE: error:\n%s\n", d.msg);
            __builtin_trap();
        }
        moe_tuning_free(&t); /* the parser's contract: free after a failure too */
        return 0;
    }
    for (int i = 0; i < nspecs; i++)
        for (int a = MOE_ARCH_SM90A; a <= MOE_ARCH_SM80; a++)
            (void)moe_tuning_find(&t, &specs[i], (moe_arch_t)a);
    moe_tuning_free(&t);
    return 0;
}
