/* cudnn.h — the optional cuDNN path of the FFN stages (README, "cuDNN").
 *
 * libcudnn is loaded with dlopen when a plan is created (never linked; only
 * the types come from <cudnn_graph.h>). For each FFN stage the plan builds a
 * cuDNN backend graph, CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR
 * in mode NONE over the plan's own buffers:
 *   up    tokens xs [1, M, H], weights w1p [E, H, 2F] with strides
 *         [2F·H, 1, H] (our K-major [E, 2F, H]), first_token_offset
 *         offsets [E, 1, 1] int32 -> u [1, M, 2F] (packed gate/up columns),
 *         then the plan's swiglu kernel (templates/swiglu.lua, the
 *         activation of templates/activation.lua) -> hbuf
 *   down  hbuf [1, M, F], w2 [E, F, H] strides [H·F, 1, F] -> out [1, M, H]
 * with M = the plan's max_rows at the spec's tokens: cuDNN always computes
 * all M rows (the rows past the routed ones are padding nobody reads).
 *
 * A stage takes cuDNN only when (a) the version table (cudnn_policy.c) lists its
 * graph as working for the loaded version, this arch and dtype, (b) a
 * plan-time self-check — cuDNN against the generated kernel on a small
 * ragged case with empty experts, outputs poisoned — agrees within
 * MOE_CUDNN_CHECK_TOL, and (c), in auto mode only, the stage is not known to
 * be slower through cuDNN on this arch. Internal to libmoegen and its tests. */
#ifndef MOEGEN_CUDNN_H
#define MOEGEN_CUDNN_H

#include "driver.h"
#include "launch.h"
#include "moe.h"
#include "spec.h"

#include <stddef.h>

typedef struct moe_cudnn moe_cudnn_t;

/* Self-check tolerance: normalized L2 error of cuDNN vs the generated kernel
 * on the routed rows (bf16, fp16). */
#define MOE_CUDNN_CHECK_TOL_BF16 1e-2
#define MOE_CUDNN_CHECK_TOL_FP16 3e-3

/* "auto", "on", "off" -> MOE_CUDNN_AUTO/_ON/_OFF; anything else (NULL and ""
 * included) -> -1. */
int moe_cudnn_parse_mode(const char *s);
const char *moe_cudnn_mode_name(int mode);

/* The mode in force: moe_options.cudnn when set, else $MOEGEN_CUDNN, else
 * auto; src (may be NULL) gets where it came from, as a phrase.
 * MOE_ERR_INVALID_ARG, naming the bad value, for anything else. */
moe_status moe_cudnn_resolve_mode(const moe_options *o, int *mode, char *src, size_t n);

/* The version table. Whether the graph of `stage` is known to work with
 * cuDNN `version` (cudnnGetVersion) on arch for dtype: 1, or 0 with the
 * reason (naming the versions measured) in why. */
int moe_cudnn_graph_known(int stage, moe_arch_t arch, moe_dtype_t dt, int version, char *why, size_t n);

/* Whether stage is known to be slower through cuDNN than the generated
 * kernel on arch: 1 with the measurement in why, or 0. */
int moe_cudnn_known_slower(int stage, moe_arch_t arch, char *why, size_t n);

/* Whether the spec's stage can use the cuDNN graph at all (no ffn_bias, a
 * mesh of one device, gate/up granules of 8): 1, or 0 with why. */
int moe_cudnn_spec_fits(const moe_spec_t *s, int world, int stage, char *why, size_t n);

/* "9.19.0" from 91900. */
void moe_cudnn_version_string(int version, char *out, size_t n);

/* Load libcudnn (once per process; a failed load is not remembered). path:
 * a file or a folder (its libcudnn_graph.so.9 and engine libraries are
 * loaded by full path first, so another cuDNN on the search path cannot
 * mix in), NULL = dlopen("libcudnn.so.9"). Returns 0 with the version, or -1
 * with the reason in why. A process holds one cuDNN: asking for another
 * path after a load is an error naming both. */
int moe_cudnn_load(const char *path, int *version, char *why, size_t n);

/* Decide the path of every FFN stage of the plan whose kernels `l` launches
 * (loaded, not yet using cuDNN; l must outlive the part) on a mesh of
 * `world` devices for the options and environment; build the graphs and run
 * the self-check (through l) where needed. *out is set (never NULL on MOE_OK)
 * and owned by the plan. MOE_ERR_UNSUPPORTED with the reason when the mode
 * is on and a stage cannot take cuDNN; MOE_ERR_INVALID_ARG for a bad
 * MOEGEN_CUDNN value or moe_options.cudnn. */
moe_status moe_cudnn_setup(moe_cudnn_t **out, const moe_launcher_t *l, int world, const moe_options *o);
void moe_cudnn_destroy(moe_cudnn_t *c);

/* Extra workspace bytes the cuDNN path needs after the plan's own regions
 * (cuDNN's workspace, and u [M, 2F] when the up stage takes cuDNN); 0 when no
 * stage does. */
size_t moe_cudnn_workspace(const moe_cudnn_t *c);

/* The plan-time decision of a stage: MOE_PATH_* and the sentence why. */
int moe_cudnn_stage_path(const moe_cudnn_t *c, int stage, const char **why);
int moe_cudnn_version(const moe_cudnn_t *c);

/* Whether this call of stage can take cuDNN: the stage decided for it, a
 * scratch area given, and the weights 16-byte aligned. */
int moe_cudnn_applies(const moe_cudnn_t *c, int stage, const moe_ffn_args_t *f);

/* Enqueue stage on stream through cuDNN (the up stage: the matmul, then the
 * SwiGLU kernel). */
moe_status moe_cudnn_run(const moe_cudnn_t *c, int stage, const moe_ffn_args_t *f, CUstream st);

/* For tests and the probe in the notes: build (not run) the mode-NONE graph
 * of stage for the plan tables' shape (sm_90a) with the cuDNN at path, whatever the version
 * table says, and describe the outcome ("finalized: engine 7, workspace 0
 * bytes" or the cuDNN error) in report. Returns 0 when an execution plan
 * finalized. */
int moe_cudnn_probe(const moe_plan_desc_t *pd, int stage, const char *path, char *report, size_t n);

#endif
