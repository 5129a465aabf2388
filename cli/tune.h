/* tune.h — the `moegen tune` command (cli/tune.c). */
#ifndef MOEGEN_TUNE_H
#define MOEGEN_TUNE_H

/* argv[0] is "tune". Returns the exit status: 0, 1 (no GPU, I/O), 2 (bad input). */
int moe_tune_command(int argc, char **argv);

/* Its --help text. */
extern const char *const moe_tune_usage;

#endif
