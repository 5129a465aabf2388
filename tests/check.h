/* check.h — the test harness: one file, no framework.
 *
 * Each tests/test_*.c is its own program. CHECK records a failure with the
 * expression, file and line and goes on; check_report() prints the plain
 * closing line "N passed, N failed" (and ", N skipped") and returns the exit
 * status. SKIP marks a case skipped with its reason.
 *
 * MOEGEN_TEST_CASE=TEXT keeps the checks of the cases whose name (CASE)
 * contains TEXT: the others' checks still run (a case's code does the same
 * work either way) but are neither counted nor printed, and a TEXT that no
 * case matches fails the program, so a misspelt filter is never green. The
 * GPU programs' own arguments (test_gpu --family, the spec filters) skip the
 * work as well.
 *
 * MOEGEN_TEST_PROGRESS=1 prints each case's name to stderr as it starts
 * (with the counts so far), so a program killed by a time limit still says
 * how far it got and that nothing before failed (bench/gpu_env.sh sets it). */
#ifndef MOEGEN_CHECK_H
#define MOEGEN_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The build folder whose programs (moegen, the examples) the tests run: the
 * Makefile passes -DMOEGEN_BUILD='"$(BUILD)"' (build-san under `make
 * test-sanitize`), so a sanitized test runs the sanitized command. */
#ifndef MOEGEN_BUILD
#define MOEGEN_BUILD "build"
#endif

static int check_passed, check_failed, check_skipped;
static const char *check_case = "";
static int check_kept = -1, check_matched;   /* this case's checks count (-1: before any case); a case matched */

static inline const char *check_filter(void) {
    const char *only = getenv("MOEGEN_TEST_CASE");
    return only && *only ? only : NULL;
}
/* The case now running; its checks count unless MOEGEN_TEST_CASE leaves it out. */
static inline const char *check_select(const char *name) {
    const char *only = check_filter(), *progress = getenv("MOEGEN_TEST_PROGRESS");
    check_kept = !only || strstr(name, only) != NULL;
    check_matched |= check_kept;
    if (check_kept && progress && *progress && strcmp(progress, "0") != 0)
        fprintf(stderr, "case [%s] (so far %d passed, %d failed)\n", name, check_passed, check_failed);
    return check_case = name;
}
/* Whether a check counts: checks before the first CASE count only without a filter. */
static inline int check_counts(void) {
    if (check_kept < 0)
        check_kept = check_filter() == NULL;
    return check_kept;
}
#define CASE(name) check_select(name)

#define CHECK(cond) do { \
    const int check_ok_ = (cond) ? 1 : 0; \
    if (!check_counts()) {} \
    else if (check_ok_) { check_passed++; } \
    else { check_failed++; \
           fprintf(stderr, "%s:%d: FAIL [%s]: %s\n", __FILE__, __LINE__, check_case, #cond); } \
} while (0)

/* CHECK with a printf-style explanation on failure. */
#define CHECKF(cond, ...) do { \
    const int check_ok_ = (cond) ? 1 : 0; \
    if (!check_counts()) {} \
    else if (check_ok_) { check_passed++; } \
    else { check_failed++; \
           fprintf(stderr, "%s:%d: FAIL [%s]: %s: ", __FILE__, __LINE__, check_case, #cond); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

#define CHECK_STREQ(a, b) CHECKF(strcmp((a), (b)) == 0, "\n  got:      \"%s\"\n  expected: \"%s\"", (a), (b))

#define SKIP(...) do { if (check_counts()) { check_skipped++; fprintf(stderr, "skip [%s]: ", check_case); \
                       fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static int check_report(const char *suite) {
    const char *only = check_filter();
    if (only && !check_matched) {
        printf("%s: 0 passed, 1 failed (MOEGEN_TEST_CASE=\"%s\" matches no case)\n", suite, only);
        return 1;
    }
    if (check_skipped)
        printf("%s: %d passed, %d failed, %d skipped\n", suite, check_passed, check_failed, check_skipped);
    else
        printf("%s: %d passed, %d failed\n", suite, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
