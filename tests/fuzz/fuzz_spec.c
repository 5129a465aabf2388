/* fuzz_spec.c — libFuzzer harness over the spec loader and the planner
 * (`make fuzz`; docs/DESIGN.md, "Tests"). One input is a spec and its
 * overrides: the bytes up to the first "\n--set\n" line are the spec,
 * every later line is one KEY=VALUE override. Its first byte picks how the
 * spec is read: bit 0 clear, as text (NUL-terminated: what a program
 * passes); set, from a file (every byte, NULs included: what `moegen check`
 * reads); and bits 1-3 the tuning table it is planned under: 0 the embedded
 * one, 1-7 tests/tune's tables (FUZZ_TUNE_DIR, the Makefile's path to it),
 * so the variant, split-K, gemv and fp8 planning paths are reached too.
 *
 * What it asserts besides "no crash, no leak, no undefined behaviour" (the
 * sanitizers): an error has the FILE:LINE: error: form; an accepted spec's
 * canonical text loads again to the same hash and is a fixed point; the
 * planner either plans it or says why (it never returns an empty reason). */
#define _GNU_SOURCE /* memmem */
#include "plan.h"
#include "spec.h"
#include "tuning.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_OVR 8

#ifndef FUZZ_TUNE_DIR
#define FUZZ_TUNE_DIR "tests/tune"
#endif
static const char *const tune_names[] = {"fp8", "gemv", "persist", "pingpong", "splitk", "tile", "variants"};
#define NTUNE ((int)(sizeof tune_names / sizeof *tune_names))
static moe_tuning_t tunes[NTUNE];
static int tune_ok[NTUNE], tunes_loaded;

/* Table i (0: the embedded one); a table that does not load falls back to
 * the embedded one, said once on stderr. */
static const moe_tuning_t *tuning_of(int i) {
    if (!tunes_loaded) {
        tunes_loaded = 1;
        for (int k = 0; k < NTUNE; k++) {
            char path[512];
            moe_diag_t d;
            snprintf(path, sizeof path, "%s/%s.tune", FUZZ_TUNE_DIR, tune_names[k]);
            tune_ok[k] = moe_tuning_load(&tunes[k], path, &d) == 0;
            if (!tune_ok[k])
                fprintf(stderr, "fuzz_spec: %s (planning under the embedded table instead)\n", d.msg);
        }
    }
    return i >= 1 && i <= NTUNE && tune_ok[i - 1] ? &tunes[i - 1] : moe_tuning_default();
}

static void require(int ok, const char *what, const char *detail) {
    if (!ok) {
        fprintf(stderr, "fuzz_spec: %s\n%s\n", what, detail ? detail : "");
        __builtin_trap();
    }
}

static int is_diag(const char *m) {
    return strstr(m, ": error: ") != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1 << 16))
        return 0;
    int from_file = data[0] & 1;
    const moe_tuning_t *table = tuning_of((data[0] >> 1) & 7);
    data++, size--;
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = 0;

    /* split off the overrides (they are C strings: a NUL ends one early) */
    moe_override_t ovr[MAX_OVR];
    int novr = 0;
    size_t spec_len = size;
    char *mark = memmem(buf, size, "\n--set\n", 7);
    if (mark) {
        spec_len = (size_t)(mark - buf) + 1;
        char *line = mark + 7;
        *mark = 0;
        while (novr < MAX_OVR && line < buf + size) {
            char *nl = memchr(line, '\n', (size_t)(buf + size - line));
            if (nl)
                *nl = 0;
            ovr[novr++].text = line;
            if (!nl)
                break;
            line = nl + 1;
        }
    }

    moe_spec_t s;
    moe_diag_t d;
    int rc;
    if (from_file) {
        char path[] = "/tmp/fuzz_spec.XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) {
            free(buf);
            return 0;
        }
        size_t off = 0;
        while (off < spec_len) {
            ssize_t n = write(fd, buf + off, spec_len - off);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        close(fd);
        rc = moe_spec_load(&s, path, NULL, ovr, novr, &d);
        unlink(path);
    } else {
        rc = moe_spec_load(&s, "fuzz.moe", buf, ovr, novr, &d);
    }
    if (rc) {
        require(is_diag(d.msg), "an error without FILE:LINE: error:", d.msg);
        free(buf);
        return 0;
    }

    /* canonical round trip */
    char *canon = moe_spec_canonical(&s);
    require(canon != NULL, "moe_spec_canonical returned NULL", NULL);
    moe_spec_t t;
    require(moe_spec_load(&t, "canonical.moe", canon, NULL, 0, &d) == 0, "the canonical text does not load", d.msg);
    require(strcmp(t.hash, s.hash) == 0, "the canonical text has another hash", canon);
    char *again = moe_spec_canonical(&t);
    require(again && strcmp(again, canon) == 0, "the canonical text is not a fixed point", canon);
    free(again);
    free(canon);

    /* the planner: plans, or says why */
    moe_plan_desc_t pd;
    char err[512] = "";
    if (moe_plan_desc_build(&pd, &s, table, err, sizeof err) != 0)
        require(err[0] != 0, "the planner refused without a reason", NULL);
    moe_plan_desc_free(&pd);
    free(buf);
    return 0;
}
