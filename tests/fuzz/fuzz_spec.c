/* fuzz_spec.c — libFuzzer harness over the spec loader and the planner
 * (`make fuzz`; docs/DESIGN.md, "Tests"). One input is a spec and its
 * overrides (tests/fuzz/fuzz_input.h: the bytes up to the first "\n--set\n"
 * line are the spec, every later line is one KEY=VALUE override). Its first
 * byte picks how the spec is read: bit 0 clear, as text (NUL-terminated:
 * what a program passes); set, from a file (every byte, NULs included: what
 * `moegen check` reads); bits 1-3 the tuning table it is planned under.
 *
 * What it asserts besides "no crash, no leak, no undefined behaviour" (the
 * sanitizers): an error has the FILE:LINE: error: form; an accepted spec's
 * canonical text loads again to the same hash and is a fixed point; the
 * planner either plans it or says why (it never returns an empty reason). */
#include "fuzz_input.h"
#include "plan.h"

#include <unistd.h>

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
    fuzz_input_t in;
    if (fuzz_input_split(&in, data, size))
        return 0;
    moe_spec_t s;
    moe_diag_t d;
    int rc;
    if (in.from_file) {
        char path[] = "/tmp/fuzz_spec.XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) {
            fuzz_input_free(&in);
            return 0;
        }
        size_t off = 0;
        while (off < in.spec_len) {
            ssize_t n = write(fd, in.buf + off, in.spec_len - off);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        close(fd);
        rc = moe_spec_load(&s, path, NULL, in.ovr, in.novr, &d);
        unlink(path);
    } else {
        rc = moe_spec_load(&s, "fuzz.moe", in.spec, in.ovr, in.novr, &d);
    }
    if (rc) {
        require(is_diag(d.msg), "an error without FILE:LINE: error:", d.msg);
        fuzz_input_free(&in);
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
    if (moe_plan_desc_build(&pd, &s, fuzz_tuning_of(in.table), err, sizeof err) != 0)
        require(err[0] != 0, "the planner refused without a reason", NULL);
    moe_plan_desc_free(&pd);
    fuzz_input_free(&in);
    return 0;
}
