/* cudnn_impl.h — what the cuDNN path's files share: the loaded cuDNN
 * functions (cudnn_load.c), the plan's part and its stages, the graph
 * building and execution (cudnn_graph.c), the self-check (cudnn_check.c).
 * The policy (cudnn_policy.c) decides with these. Internal to libmoegen. */
#ifndef MOEGEN_CUDNN_IMPL_H
#define MOEGEN_CUDNN_IMPL_H

#include "cudnn.h"
#include "plan.h"

#include <pthread.h>
#include <stddef.h>

#if defined(__has_include) && !defined(MOE_NO_CUDNN_HEADERS)
#if __has_include(<cudnn_graph.h>)
#include <cudnn_graph.h>
#define MOE_HAVE_CUDNN_H 1
#endif
#endif
#ifndef MOE_HAVE_CUDNN_H
#define MOE_HAVE_CUDNN_H 0
#endif

extern const char *const moe_cudnn_stage_names[MOE_STAGE_COUNT];

/* The cuDNN functions, resolved by moe_cudnn_load. */
#if MOE_HAVE_CUDNN_H
#define MOE_DN_FUNCTIONS(X)                 \
    X(cudnnGetVersion)                      \
    X(cudnnGetErrorString)                  \
    X(cudnnGetLastErrorString)              \
    X(cudnnCreate)                          \
    X(cudnnDestroy)                         \
    X(cudnnSetStream)                       \
    X(cudnnBackendCreateDescriptor)         \
    X(cudnnBackendDestroyDescriptor)        \
    X(cudnnBackendSetAttribute)             \
    X(cudnnBackendGetAttribute)             \
    X(cudnnBackendFinalize)                 \
    X(cudnnBackendExecute)


struct moe_dn_table {
#define MOE_DN_FIELD(fn) __typeof__(fn) *fn;
    MOE_DN_FUNCTIONS(MOE_DN_FIELD)
#undef MOE_DN_FIELD
};
extern struct moe_dn_table moe_dn;
#endif

#define MOE_DN_KEEP 48

typedef struct {
    int path;
    char why[1024];
    long long engine;
    size_t ws;
#if MOE_HAVE_CUDNN_H
    cudnnBackendDescriptor_t exec;
    cudnnBackendDescriptor_t keep[MOE_DN_KEEP];
    int nkeep;
#endif
} dn_stage_t;

struct moe_cudnn {
    int mode, version;
    char mode_src[96];
    const moe_plan_desc_t *pd;
    moe_arch_t arch;
    const moe_launcher_t *l;    /* the plan's kernels (NULL in a probe) */
    long long M;
    dn_stage_t st[MOE_STAGE_COUNT];
#if MOE_HAVE_CUDNN_H
    cudnnHandle_t handle;
#endif
    pthread_mutex_t lock;       /* the handle's stream is per call */
    CUmodule mod;
    CUfunction fill;           /* the self-check's input fill (NVRTC) */
    size_t u_off, cws_off, extra;
};

static inline size_t up256(size_t x) { return (x + 255) & ~(size_t)255; }

/* A plan part for the tables pd on arch, launching through l (NULL: a
 * probe, which launches nothing), nothing decided yet; NULL when out of
 * memory. */
moe_cudnn_t *moe_cudnn_new(const moe_plan_desc_t *pd, moe_arch_t arch, const moe_launcher_t *l);

/* Compile and load the self-check's fill kernel into c->mod. */
moe_status moe_cudnn_load_kernels(moe_cudnn_t *c);

/* h = the activation of u over the rows offsets[E] says (at most cap), on st:
 * the plan's swiglu kernel through the launcher (moe_launch_kernel;
 * c->l->swiglu_fn, never NULL when a stage decided for cuDNN). */
moe_status moe_cudnn_launch_swiglu(const moe_cudnn_t *c, CUdeviceptr u, CUdeviceptr h, CUdeviceptr offsets,
                                   long long cap, CUstream st);

/* p[0..n) = uniform(-scale, scale) from seed, on the null stream; 1 on success. */
int moe_cudnn_fill(const moe_cudnn_t *c, CUdeviceptr p, unsigned long long n, unsigned long long seed, float scale);

#if MOE_HAVE_CUDNN_H
/* cuDNN's failure of `what` as a sentence in why; returns 0 on failure. */
int moe_dn_ok(cudnnStatus_t s, const char *what, char *why, size_t n);

/* Build and finalize the mode-NONE MoE grouped matmul of stage for the
 * plan's shape (M rows): heuristics first, then every engine by index.
 * Returns 1, or 0 with the last cuDNN error in why. */
int moe_dn_build(moe_cudnn_t *c, int stage, char *why, size_t n);

/* Enqueue stage's execution plan on st with these pointers. */
moe_status moe_dn_exec(const moe_cudnn_t *c, int stage, CUdeviceptr tok, const void *w, CUdeviceptr off,
                       CUdeviceptr y, CUdeviceptr ws, CUstream st);

/* Run both candidate stages through cuDNN and the generated kernels on one
 * ragged case; ok[s] = 1 when stage s agrees, with the figures in why[s]. */
moe_status moe_cudnn_self_check(moe_cudnn_t *c, const int cand[MOE_STAGE_COUNT],
                                int ok[MOE_STAGE_COUNT], char why[MOE_STAGE_COUNT][1024]);
#endif

#endif
