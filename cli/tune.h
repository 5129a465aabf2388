/* tune.h — the `moegen tune` command (cli/tune.c). */
#ifndef MOEGEN_TUNE_H
#define MOEGEN_TUNE_H

#include <stddef.h>

#include "spec.h"

/* argv[0] is "tune". Returns the exit status: 0, 1 (no GPU, I/O), 2 (bad input). */
int moe_tune_command(int argc, char **argv);

/* The winner among ncand candidates for the bucket tok[ti] (-1: none ran;
 * *second the runner-up, -1 when fewer than two ran): the lowest sum of
 * time ratios to the fastest, over tok[ti] alone, or with cumulative
 * (a plan that keeps one configuration at every size) over every
 * measured count <= tok[ti]. times[c * stride + t]: candidate c at tok[t];
 * ok[c]: c ran. */
int moe_tune_winner(int ncand, int ntok, const float *times, int stride, const int *ok, const int *tok, int ti,
                    int cumulative, int *second);

/* Every candidate tile of either list (bf16/fp16, fp8) passes the tile
 * checks a tuning table's entry must pass (a candidate that could never
 * be planned would be silently skipped): 0, or 1 with the first that does
 * not and why in why. */
int moe_tune_check_candidates(char *why, size_t n);

/* Merge one spec's entries (lines[i]: the entry of bucket tok[i], "" for
 * none) into the table at path, created when missing: its lines are kept
 * but for entries of the same shape and bucket (forward, and the backward
 * entries that complete them), then the new ones follow.
 * The result goes to a new file beside it (moe_create_temp: never a
 * planted name or link) renamed over path. Returns 0, 1 (I/O; the table
 * untouched) or 2 (the table does not parse). */
int moe_tune_write_table(const char *path, const moe_spec_t *s, const int *tok, int ntok, char lines[][256]);

/* Its --help text. */
extern const char *const moe_tune_usage;

#endif
