/* fuzz_input.h — the input format fuzz_spec.c and fuzz_emit.c share: the
 * first byte, then the spec's bytes up to the first "\n--set\n" line, then
 * one KEY=VALUE override per line (at most FUZZ_MAX_OVR). The first byte's
 * bit 0 is fuzz_spec's read mode (clear: as text, set: from a file) and
 * bits 1-5 the tuning table the spec is planned under: 0 the embedded one,
 * 1..FUZZ_TABLES tests/tune's tables (FUZZ_TUNE_DIR, the Makefile's path to
 * them; the values above it the embedded one too), so the variant, split-K,
 * gemv, gemv4, stream, chain, row-block, CTA-pair, fp8 (fp8's tile,
 * persistent, pair and gemv grids) and backward-entry planning paths are
 * reached too. */
#ifndef MOEGEN_FUZZ_INPUT_H
#define MOEGEN_FUZZ_INPUT_H

#define _GNU_SOURCE /* memmem */
#include "spec.h"
#include "tuning.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_OVR 8

#ifndef FUZZ_TUNE_DIR
#define FUZZ_TUNE_DIR "tests/tune"
#endif

typedef struct {
    char *buf;       /* the input after its first byte, NUL-terminated (owned) */
    const char *spec; /* = buf: the spec text (the overrides cut off by a NUL) */
    size_t spec_len; /* the spec's bytes (NULs included), its closing newline kept */
    int from_file;   /* bit 0 */
    int table;       /* bits 1-4 */
    moe_override_t ovr[FUZZ_MAX_OVR];
    int novr;
} fuzz_input_t;

/* Split data into *in; 0, or 1 for an input to skip (empty, over 64 KiB,
 * out of memory). The caller frees a split input with fuzz_input_free. */
static inline int fuzz_input_split(fuzz_input_t *in, const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 16))
        return 1;
    in->from_file = data[0] & 1;
    in->table = (data[0] >> 1) & 31;
    data++, size--;
    in->buf = malloc(size + 1);
    if (!in->buf)
        return 1;
    memcpy(in->buf, data, size);
    in->buf[size] = 0;
    in->spec = in->buf;
    in->spec_len = size;
    in->novr = 0;
    /* the overrides are C strings: a NUL ends one early */
    char *mark = memmem(in->buf, size, "\n--set\n", 7);
    if (mark) {
        in->spec_len = (size_t)(mark - in->buf) + 1;
        char *line = mark + 7, *end = in->buf + size;
        *mark = 0;
        while (in->novr < FUZZ_MAX_OVR && line < end) {
            char *nl = memchr(line, '\n', (size_t)(end - line));
            if (nl)
                *nl = 0;
            in->ovr[in->novr++].text = line;
            if (!nl)
                break;
            line = nl + 1;
        }
    }
    return 0;
}

static inline void fuzz_input_free(fuzz_input_t *in) {
    free(in->buf);
    in->buf = NULL;
}

/* Table i (0: the embedded one; 1..FUZZ_TABLES tests/tune's, loaded once); a
 * table that does not load falls back to the embedded one, said once on
 * stderr. The Makefile's fuzz target reads FUZZ_TABLES from this line to seed
 * a corpus entry per table, so the count has one home: here (at most 31: the
 * first byte's bits 1-5). */
#define FUZZ_TABLES 17
static inline const moe_tuning_t *fuzz_tuning_of(int i) {
    static const char *const names[] = {"fp8", "gemv", "persist", "pingpong", "splitk", "tile", "variants", "fp8p",
                                        "gemv8", "stream", "chain", "gemv4", "rowblock", "pairs", "fp8pairs", "bwd",
                                        "bwd2"};
    enum { N = sizeof names / sizeof *names };
    _Static_assert(N == FUZZ_TABLES, "FUZZ_TABLES counts the names");
    _Static_assert(FUZZ_TABLES <= 31, "the first byte's bits 1-5 name the table");
    static moe_tuning_t tables[N];
    static int ok[N], loaded;
    if (!loaded) {
        loaded = 1;
        for (int k = 0; k < N; k++) {
            char path[512];
            moe_diag_t d;
            snprintf(path, sizeof path, "%s/%s.tune", FUZZ_TUNE_DIR, names[k]);
            ok[k] = moe_tuning_load(&tables[k], path, &d) == 0;
            if (!ok[k])
                fprintf(stderr, "fuzz: %s (planning under the embedded table instead)\n", d.msg);
        }
    }
    return i >= 1 && i <= N && ok[i - 1] ? &tables[i - 1] : moe_tuning_default();
}

#endif
