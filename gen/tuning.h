/* tuning.h — the tuning table: measured sm_90a GEMM tile choices per shape
 * and token bucket, which the planner prefers over its heuristics.
 *
 * The text format is described at the top of tuning/h200.tune, the table
 * embedded at build time. */
#ifndef MOEGEN_TUNING_H
#define MOEGEN_TUNING_H

#include "spec.h"
#include "util.h"

typedef struct moe_tuning_entry {
    int stage;                           /* 0: the forward GEMMs' entry; else a backward GEMM's (the line starts
                                          * with its name: MOE_K_DGRAD_DOWN .. MOE_K_WGRAD_DOWN, gen/family.h),
                                          * which completes the forward entry of the same shape and tokens */
    int experts, top_k, hidden, ffn;
    moe_dtype_t dtype;
    moe_arch_t arch;
    int tokens;                          /* the bucket: applies to specs with at least this many tokens */
    int bm, bn, bk, stages, consumers, group_m;
    int persistent;                      /* the grid: 0 = one CTA per tile ("tile"), 1 = persistent ("persist"
                                          * or "pingpong") */
    int pingpong;                        /* 1: "pingpong", the consumer warpgroups on alternate tiles */
    int splitk;                          /* S of "splitkS" (2..16): S CTAs per tile split K; 0 = none */
    int gemv;                            /* 1: "gemv", a CTA per bn weight rows of an M tile, for few rows
                                          * per expert (templates/gemm_gemv.lua); bm the row block, stages
                                          * the K loop's unroll; 3: "gemv3", the same with three CTAs an SM
                                          * (rows in chunks of 2); 6: "gemv4", four CTAs an SM (rows one at
                                          * a time); 4: "stream", a persistent grid streaming
                                          * the weights through a ring of `stages` stages (bn 16); 5:
                                          * "chain", stream whose up GEMM's grid runs the down GEMM and the
                                          * combine too (moe_gemm_chains) */
    int pdl;                             /* 1: the grid word ends in "+pdl": the variant's calls launch their
                                          * kernels as programmatic dependents unless MOEGEN_PDL says
                                          * otherwise (docs/DESIGN.md, "Launch overlap"); chosen from the whole
                                          * layer's time (moe_bench with MOEGEN_PDL=on against off), not by
                                          * moegen tune */
    int evict;                           /* 1: the grid word ends in "+ef" (also "+pdl+ef"): the up GEMM loads its
                                          * weight boxes with an L2 evict_first policy (the TMA grids; the
                                          * down GEMM unchanged); chosen from moe_bench, not by moegen tune */
    int cluster;                         /* 1: the grid word ends in "+mc": CTA pairs (2-CTA clusters) on
                                          * the persistent grids, the pair's shared weight tile loaded once
                                          * and multicast to both (bf16/fp16; not with +ef) */
    int fp8;                             /* 1: dtype "e4m3": an fp8 spec's entry (quant.weights = "fp8_e4m3",
                                          * the layer's dtype bf16); it applies to fp8 specs alone, and they
                                          * to no other entry */
    double best_us, runner_up_us;        /* measured up + down GEMM time of the winner and the runner-up */
    char date[16], gpu[64];
    int line;                            /* where it was read */
} moe_tuning_entry_t;

typedef struct moe_tuning {
    char file[256];
    moe_tuning_entry_t *e;
    int n;
} moe_tuning_t;

/* Parse table text; `file` names it in errors. Returns 0, or non-zero with
 * diag->msg = "FILE:LINE: error: MESSAGE". The caller frees with
 * moe_tuning_free (also after a failure). */
int moe_tuning_parse(moe_tuning_t *t, const char *file, const char *text, size_t len, moe_diag_t *diag);
int moe_tuning_load(moe_tuning_t *t, const char *path, moe_diag_t *diag);
void moe_tuning_free(moe_tuning_t *t);

/* Non-zero (the reason in why) when an entry of shape H x F with k tile
 * bk cannot run grid splitkS: more splits than the longer GEMM's k tiles
 * (each GEMM splits min(S, its k tiles) ways: gen/family_gemm.c). */
int moe_tuning_splitk_check(int splitk, int hidden, int ffn, int bk, char *why, size_t n);

/* The embedded table (tuning/h200.tune), parsed once; NULL if it does not
 * parse (a build error: a test holds it parsing). There is no process-wide
 * table: callers that want this one pass it to moe_plan_desc_build. */
const moe_tuning_t *moe_tuning_default(void);

/* The (forward) entry for spec s on arch: same shape, dtype and arch, the
 * largest bucket <= s->tokens; NULL when none. */
const moe_tuning_entry_t *moe_tuning_find(const moe_tuning_t *t, const moe_spec_t *s, moe_arch_t arch);

/* As moe_tuning_find for a call of `tokens` tokens: the entry of s's shape
 * with the largest bucket <= tokens; NULL when none. */
const moe_tuning_entry_t *moe_tuning_find_tokens(const moe_tuning_t *t, const moe_spec_t *s, moe_arch_t arch,
                                                 int tokens);

/* The backward entry of stage `family` (MOE_K_DGRAD_DOWN .. MOE_K_WGRAD_DOWN)
 * that completes forward entry fwd (same shape and tokens); NULL when none
 * or fwd is NULL. */
const moe_tuning_entry_t *moe_tuning_find_bgemm(const moe_tuning_t *t, const moe_tuning_entry_t *fwd, int family);

/* The token buckets of s's shape in t on arch that are <= s->tokens,
 * ascending and distinct, into out; the largest `max` of them when there
 * are more. Returns how many (0: the table has nothing for the shape). */
int moe_tuning_buckets(const moe_tuning_t *t, const moe_spec_t *s, moe_arch_t arch, int *out, int max);

#endif
