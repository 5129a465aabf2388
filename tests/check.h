/* check.h — the test harness: one file, no framework.
 *
 * Each tests/test_*.c is its own program. CHECK records a failure with the
 * expression, file and line and goes on; check_report() prints the plain
 * closing line "N passed, N failed" (and ", N skipped") and returns the exit
 * status. SKIP marks a case skipped with its reason. */
#ifndef MOEGEN_CHECK_H
#define MOEGEN_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_passed, check_failed, check_skipped;
static const char *check_case = "";

#define CASE(name) (check_case = (name))

#define CHECK(cond) do { \
    if (cond) { check_passed++; } \
    else { check_failed++; \
           fprintf(stderr, "%s:%d: FAIL [%s]: %s\n", __FILE__, __LINE__, check_case, #cond); } \
} while (0)

/* CHECK with a printf-style explanation on failure. */
#define CHECKF(cond, ...) do { \
    if (cond) { check_passed++; } \
    else { check_failed++; \
           fprintf(stderr, "%s:%d: FAIL [%s]: %s: ", __FILE__, __LINE__, check_case, #cond); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

#define CHECK_STREQ(a, b) CHECKF(strcmp((a), (b)) == 0, "\n  got:      \"%s\"\n  expected: \"%s\"", (a), (b))

#define SKIP(...) do { check_skipped++; fprintf(stderr, "skip [%s]: ", check_case); \
                       fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } while (0)

static int check_report(const char *suite) {
    if (check_skipped)
        printf("%s: %d passed, %d failed, %d skipped\n", suite, check_passed, check_failed, check_skipped);
    else
        printf("%s: %d passed, %d failed\n", suite, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
