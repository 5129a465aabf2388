/* tune.h — the `moegen tune` command (cli/tune.c). */
#ifndef MOEGEN_TUNE_H
#define MOEGEN_TUNE_H

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

/* Its --help text. */
extern const char *const moe_tune_usage;

#endif
