/* moe.h — the moegen runtime: plan a Mixture-of-Experts layer from a spec,
 * generate and compile its kernels (NVRTC, disk cache) or load them from a
 * folder written by `moegen compile`, and run the forward pass.
 *
 * Linking: libmoegen links Lua and jansson only. The CUDA driver is loaded
 * with dlopen("libcuda.so.1") on first use, so a program linked against
 * libmoegen starts on a machine without a GPU, and moe_plan_create answers
 * MOE_ERR_NO_DRIVER or MOE_ERR_NO_GPU there. NVRTC is loaded the same way
 * when moe_plan_create first needs it (MOE_ERR_UNSUPPORTED, naming the
 * library, without it); moe_plan_create_from_dir needs none.
 *
 * Threads: a plan is immutable once created; moe_forward may be called on
 * one plan from several threads at once, each with its own workspace.
 * moe_last_error() is per thread.
 *
 * Streams: moe_forward enqueues all its work on the given stream (a
 * CUstream or cudaStream_t; NULL = the legacy default stream) and returns
 * without synchronizing; there is no host synchronization between routing
 * and the last kernel, so a forward can be captured in a CUDA graph.
 * Device pointers must belong to the plan's device and context (the
 * device's primary context). */
#ifndef MOEGEN_MOE_H
#define MOEGEN_MOE_H

#include <stddef.h>
#include <stdint.h>

/* The version of this header: compare with moe_version() (the library's)
 * to find a header and library of different releases. test_abi holds
 * these equal to MOEGEN_VERSION (gen/version.h, the string's one home). */
#define MOE_VERSION_MAJOR 0
#define MOE_VERSION_MINOR 1
#define MOE_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MOE_OK = 0,
    MOE_ERR_INVALID_ARG,   /* a NULL or out-of-range argument */
    MOE_ERR_SPEC,          /* the spec did not load or validate (message has FILE:LINE) */
    MOE_ERR_NO_DRIVER,     /* libcuda.so.1 could not be loaded */
    MOE_ERR_NO_GPU,        /* the driver loaded but reports no usable GPU */
    MOE_ERR_ARCH,          /* the GPU's architecture has no kernels (sm_80 or sm_90 family needed) */
    MOE_ERR_COMPILE,       /* template expansion or NVRTC failed (message has the log) */
    MOE_ERR_CUDA,          /* a CUDA driver call failed (message names it) */
    MOE_ERR_CAPACITY,      /* more tokens than the spec's `tokens` */
    MOE_ERR_IO,            /* reading a compiled folder failed */
    MOE_ERR_NO_MEMORY,
    MOE_ERR_UNSUPPORTED,   /* the spec needs something this build or machine lacks (e.g. a mesh > 1 without NCCL) */
    MOE_ERR_NCCL,          /* an NCCL call failed (message names it) */
    MOE_ERR_OVERFLOW       /* capacity mode: a rank had more rows for a peer than dispatch.capacity */
} moe_status;

/* Growable structs: moe_options and moe_plan_info start with struct_size,
 * the size of the struct as the caller's moe.h declares it, so fields can
 * be added at their end without breaking programs built against an older
 * header. Set it to sizeof the struct (MOE_OPTIONS_INIT, MOE_PLAN_INFO_INIT),
 * or leave it 0 in a zero-initialized struct: 0 means the first layout
 * with struct_size (moe.h 0.1.0: moe_options up to tuning_path, moe_plan_info
 * up to cudnn_version), which the library always understands. The library
 * reads (moe_options) or writes (moe_plan_info) only struct_size bytes;
 * fields past them take their defaults, or are left alone. A struct_size
 * larger than the library's struct is accepted when the fields it does not
 * know are all zero (moe_options; else MOE_ERR_INVALID_ARG) and zeroed
 * (moe_plan_info). An uninitialized struct_size is a caller bug. */
typedef struct {
    size_t struct_size;         /* sizeof(moe_options), or 0 (see above) */
    const char *templates_dir;  /* NULL = the embedded templates */
    const char *cache_dir;      /* NULL = $MOEGEN_CACHE_DIR, $XDG_CACHE_HOME/moegen, ~/.cache/moegen */
    int device;                 /* CUDA device ordinal; default 0 */
    int rank;                   /* global rank in the mesh; default 0; with nccl_comm, the communicator's
                                   rank (a different non-zero value is an error) */
    void *nccl_comm;            /* ncclComm_t over the whole mesh (world ranks, this rank's device), required
                                   when the mesh has more than one device; the plan splits its EP and FSDP
                                   groups off it (collective: every rank creates its plan, in the same order).
                                   NULL on a mesh of one device. */
    int cudnn;                  /* the cuDNN switch: MOE_CUDNN_DEFAULT (0: $MOEGEN_CUDNN, else auto), _AUTO,
                                   _ON or _OFF; see moe_plan_stage_path and README, "cuDNN" */
    const char *cudnn_path;     /* libcudnn to load: a file, or the folder holding libcudnn_graph.so.9;
                                   NULL = $MOEGEN_CUDNN_PATH, else dlopen("libcudnn.so.9") */
    const char *tuning_path;    /* a tuning table file (format: tuning/h200.tune) for the sm_90a GEMM tiles;
                                   NULL = $MOEGEN_TUNING, else the table embedded at build time */
} moe_options;
#ifdef __cplusplus /* designated initializers: C, and C++ only from C++20 */
#define MOE_OPTIONS_INIT {sizeof(moe_options)}
#else
#define MOE_OPTIONS_INIT {.struct_size = sizeof(moe_options)}
#endif

/* moe_options.cudnn. auto: a stage takes cuDNN when the loaded version is
 * known to run its graph on this GPU, a plan-time self-check against the
 * generated kernel passes, and cuDNN is not known to be slower there; else
 * the generated kernel, silently. on: the first two, or the plan fails with
 * the reason. off: cuDNN is never loaded. */
enum { MOE_CUDNN_DEFAULT = 0, MOE_CUDNN_AUTO, MOE_CUDNN_ON, MOE_CUDNN_OFF };

/* The FFN stages a plan can route to another implementation, and the paths. */
enum { MOE_STAGE_UP = 0,      /* [rows, H]·w1p -> SwiGLU -> [rows, F] */
       MOE_STAGE_DOWN,        /* [rows, F]·w2 -> [rows, H] */
       MOE_STAGE_COUNT };
enum { MOE_PATH_GENERATED = 0, MOE_PATH_CUDNN };

typedef struct moe_plan moe_plan;

/* Arguments of one forward pass. Device pointers; layouts as in README.md,
 * "Tensors": x, y [tokens, H]; router_w [E, H]; w1p [E, 2F, H] packed
 * (moe_plan_pack_w1); w2 [E, H, F]; optional router_bias / router_logit_bias
 * fp32 [E] and b1p [E, 2F] packed / b2 [E, H] as the spec requires.
 * On a mesh of several devices the expert weights are the rank's held
 * experts after the FSDP gather (moe_gather_weights): moe_plan_info.held
 * slots in slot order, e.g. w1p [held, 2F, H]; router_w stays [E, H].
 * With a shared expert (spec shared.ffn = m·F) w1p and w2 hold E + m slots:
 * the routed experts, then the shared expert split into m slots of size F
 * (moe_plan_pack_shared writes them); shared_gate is its w_gate [H]
 * (dtype), required iff shared.gate = "sigmoid".
 * With zero-computation experts (spec zero_experts = Z) the router scores
 * E + Z experts: router_w is [E + Z, H] and router_bias / router_logit_bias
 * [E + Z]; w1p and w2 stay the E routed experts'.
 * With fp8 expert weights (spec quant.weights = "fp8_e4m3") w1p and w2 are
 * the e4m3 tensors w1q and w2q, and w1s and w2s their fp32 scales, as
 * moe_plan_pack_fp8 and moe_plan_pack_quantize write them (below, "fp8
 * weights"); x, y and the biases stay bf16. Without fp8 weights w1s and w2s
 * are ignored.
 * With given routing (spec router.select = "given", README "Given
 * routing") topk_ids is the caller's choice of experts, int32 [tokens,
 * top_k] (an id outside 0..E-1 drops its entry: moe_plan_routing_errors
 * counts them); with router.score = "given" also topk_weights, fp32
 * [tokens, top_k], and router_w may be NULL (no logits). Otherwise both are
 * ignored.
 * With router.input = "separate" (README, "The router's own input") the
 * logits read router_x [tokens, HR] (dtype) instead of x, HR = router.hidden
 * where it is set (router_w is then [E, HR]: a latent MoE), else H; with
 * router.expert_scale each routed weight is multiplied by
 * router_expert_scale[e] (fp32 [E]) last. Otherwise both are ignored.
 * With router.weight_dtype = "fp32" router_w is fp32 (README, "fp32 router
 * weights"). */
typedef struct {
    int tokens;                   /* 0 .. the spec's tokens (0: an empty batch) */
    const void *x;                /* x and y may be NULL when tokens = 0; x, y and router_x 16-byte aligned (the
                                   * kernels move their rows 16 bytes at a time) */
    const void *router_w;
    const float *router_bias;     /* spec router.bias */
    const float *router_logit_bias; /* spec router.logit_bias */
    const void *w1p, *b1p;        /* b1p: spec ffn_bias */
    const void *w2, *b2;          /* b2: spec ffn_bias */
    void *y;
    void *workspace;              /* moe_plan_workspace_size(plan, tokens) bytes, 256-byte aligned */
    const void *shared_gate;      /* spec shared.gate = "sigmoid": w_gate [H] */
    const float *w1s, *w2s;       /* spec quant.weights = "fp8_e4m3": the scales of w1p and w2 */
    const int *topk_ids;          /* spec router.select = "given": int32 [tokens, top_k] */
    const float *topk_weights;    /* spec router.score = "given": fp32 [tokens, top_k] */
    const void *router_x;         /* spec router.input = "separate": [tokens, HR], the logits' input (HR:
                                   * router.hidden, else H) */
    const float *router_expert_scale; /* spec router.expert_scale: fp32 [E] */
} moe_forward_args;

/* One rank's expert weights, device pointers (b1p and b2 only with ffn_bias). */
typedef struct {
    const void *w1p, *b1p, *w2, *b2;
} moe_weights;

/* The FSDP all-gather of one rank's stored experts into the experts it
 * holds (moe_gather_weights). With fp8 weights (quant.weights = "fp8_e4m3")
 * w1p and w2 are the e4m3 tensors and the scales move too: stored_w1s,
 * stored_w2s [stored, ...] into held_w1s, held_w2s [held, ...] (shapes: "fp8
 * weights" below); without fp8 those four are ignored. */
typedef struct {
    moe_weights stored;           /* moe_plan_info.stored experts each: w1p [stored, 2F, H], ... */
    void *held_w1p, *held_b1p, *held_w2, *held_b2;   /* out: [held, ...] in slot order */
    /* Optional hook: called once per tensor (0 w1p, 1 b1p, 2 w2, 3 b2, and
     * with fp8 4 w1s, 5 w2s) to write this rank's shard, in the form to be
     * gathered, to `dst` (its place in the held buffer, `bytes` long) from
     * `src` (the stored shard), on `stream`. NULL = gather the stored bytes.
     * (moe_gather_weights_fp8 is the quantize step: bf16 in, fp8 gathered.) */
    moe_status (*pack)(void *user, int tensor, const void *src, void *dst, size_t bytes, void *stream);
    void *user;
    const float *stored_w1s, *stored_w2s;   /* fp8: the scales of stored.w1p and stored.w2 */
    float *held_w1s, *held_w2s;             /* fp8, out: the scales of held_w1p and held_w2 */
} moe_gather_args;

/* Create a plan from a spec file: load and validate the spec, plan the
 * kernels and the mesh, check the driver and GPU, then generate, compile
 * (NVRTC, cached on disk) and load the kernels. opts may be NULL. On
 * failure *plan is NULL and moe_last_error() says why. */
moe_status moe_plan_create(moe_plan **plan, const char *spec_path, const moe_options *opts);

/* Create a plan from a folder written by `moegen compile` (NAME.moe and
 * NAME.ARCH.cubin): no NVRTC needed at run time (only cuDNN's plan-time
 * self-check compiles with it, where it is present). */
moe_status moe_plan_create_from_dir(moe_plan **plan, const char *dir, const moe_options *opts);

void moe_plan_destroy(moe_plan *plan);

/* Workspace bytes of a call of `tokens` tokens (0 .. the spec's tokens),
 * laid out for that call: the routing tables and expert rows grow with
 * tokens, so a workspace of moe_plan_workspace_size(plan, T) bytes serves
 * any call of up to T tokens, and a call never touches a byte past what
 * this returns for its own tokens. An expert-parallel rank with 0 tokens
 * still needs the receive side for its peers' rows, which is sized by the
 * spec's tokens on every peer whatever this rank's own. 0 when tokens is
 * out of range or plan is NULL. */
size_t moe_plan_workspace_size(const moe_plan *plan, int tokens);

/* Byte offset and size of a workspace region by name ("topk_idx",
 * "topk_w", "counts", "offsets", "num_tiles", "tiles", "row_of", "xs",
 * "hbuf", "route_part", and with fp8 weights "xsc" and "hsc", the e4m3
 * rows' scales, 0 bytes otherwise; "splitk", the split-K GEMMs' partial
 * tiles, 0 bytes without them; "src_of", each row's token for the gathered
 * up GEMM, 0 bytes where the spec does not allow it, written only by calls
 * that gather; an expert-parallel plan's own names), in the layout
 * of a call of `tokens` tokens, for tests and tools that inspect
 * intermediate results. MOE_ERR_INVALID_ARG for an unknown name or tokens
 * out of range. */
moe_status moe_plan_workspace_region_at(const moe_plan *plan, int tokens, const char *name, size_t *offset,
                                        size_t *bytes);

/* moe_plan_workspace_region_at for a call of the spec's tokens (the plan's
 * capacity). */
moe_status moe_plan_workspace_region(const moe_plan *plan, const char *name, size_t *offset, size_t *bytes);

/* ---- weight packing: checkpoint layouts -> the kernels' tensors ---------
 *
 * The forward reads w1p [slots, 2F, H] and b1p [slots, 2F] with gate and up
 * rows paired in granules of 8 (README.md, "Tensors"), w2 [slots, H, F] and
 * b2 [slots, H]. A pack writes `count` consecutive slots of one of them,
 * first .. first + count - 1, from a checkpoint tensor described by its
 * element strides, so every layout a checkpoint uses (separate gate and up,
 * fused, transposed, interleaved, one tensor per expert) is a choice of
 * pointers and strides; moe_plan_pack_layout fills them for the common
 * layouts (README.md, "Weight layouts"). */

/* The packed tensors. */
typedef enum { MOE_TENSOR_W1 = 0, MOE_TENSOR_B1, MOE_TENSOR_W2, MOE_TENSOR_B2 } moe_tensor;

/* One source tensor: element (e, row, col) is at
 * ((const uint16_t *)ptr)[e * expert + row * row_stride + col * col_stride]
 * (strides in elements, none negative), for e < count and
 *   W1 gate, up: row f < F, col h < H       W2: row h < H, col f < F
 *   b1 gate, up: row f < F, col 0           b2: row h < H, col 0
 * so W1's element (e, f, h) multiplies x[h] into gate unit f of expert e. */
typedef struct {
    const void *ptr;
    int64_t expert, row, col;
} moe_pack_src;

typedef struct {
    moe_tensor tensor;
    moe_pack_src src[2];          /* W1, b1: gate, up; W2, b2: src[0] (src[1] unused) */
    int first, count;             /* source expert i goes to slot first + i, i < count */
} moe_pack_args;

/* The checkpoint layouts moe_plan_pack_layout knows (E experts of one
 * tensor; a tensor per expert is count 1 with its own pointer). */
typedef enum {
    MOE_LAYOUT_W1_FUSED = 0,      /* [E, 2F, H]: gate rows 0..F-1, then up (transformers 5 gate_up_proj) */
    MOE_LAYOUT_W1_FUSED_T,        /* [E, H, 2F]: gate columns, then up (Llama 4 gate_up_proj) */
    MOE_LAYOUT_W1_INTERLEAVED,    /* [E, 2F, H]: gate at even rows, up at odd (gpt-oss original mlp1) */
    MOE_LAYOUT_W1_INTERLEAVED_T,  /* [E, H, 2F]: gate at even columns, up at odd (gpt-oss gate_up_proj) */
    MOE_LAYOUT_W1_SEPARATE,       /* gate [E, F, H] and up [E, F, H] (Mixtral w1/w3, DeepSeek gate/up_proj) */
    MOE_LAYOUT_W1_SEPARATE_T,     /* gate [E, H, F] and up [E, H, F] */
    MOE_LAYOUT_B1_FUSED,          /* [E, 2F]: gate, then up */
    MOE_LAYOUT_B1_INTERLEAVED,    /* [E, 2F]: gate at even, up at odd (gpt-oss gate_up_proj_bias) */
    MOE_LAYOUT_B1_SEPARATE,       /* gate [E, F] and up [E, F] */
    MOE_LAYOUT_W2,                /* [E, H, F] (Linear: Mixtral w2, DeepSeek down_proj) */
    MOE_LAYOUT_W2_T,              /* [E, F, H] (gpt-oss and Llama 4 down_proj) */
    MOE_LAYOUT_B2,                /* [E, H] */
    MOE_LAYOUT_COUNT
} moe_layout;

/* Fill *args to pack `count` experts of `layout` (the plan's F and H) into
 * slots first .. first + count - 1: src is the tensor (the gate tensor for
 * the _SEPARATE layouts), up the up tensor for the _SEPARATE layouts and
 * NULL otherwise. The strides can be changed afterwards (a view with other
 * strides, e.g. a shared expert's [H, m*F] down_proj as m experts). */
moe_status moe_plan_pack_layout(const moe_plan *plan, moe_layout layout, const void *src, const void *up, int first,
                                int count, moe_pack_args *args);

/* Pack on the host: host memory, 16-bit elements; dst is the whole packed
 * tensor (its slot 0), of at least first + count slots. Checked: the
 * pointers, first + count <= the plan's weight slots (experts and shared
 * slots; on a mesh the held slots and shared slots when more),
 * strides not negative, and every source offset fits in 64 bits. */
moe_status moe_plan_pack(const moe_plan *plan, const moe_pack_args *args, void *dst);

/* Pack on the device: as moe_plan_pack, with src and dst device pointers of
 * the plan's device, enqueued on stream (a kernel of the plan's module; no
 * host synchronization, capturable in a CUDA graph). A checkpoint tensor
 * already on the GPU is packed there, without crossing PCIe. dst must not
 * overlap the sources. MOE_ERR_UNSUPPORTED when the plan's module has no
 * pack kernel (a folder compiled before moegen emitted it). */
moe_status moe_plan_pack_async(const moe_plan *plan, const moe_pack_args *args, void *dst, void *stream);

/* Pack W1 from the plain layout [E, 2F, H] (MOE_LAYOUT_W1_FUSED) and b1
 * [E, 2F] (MOE_LAYOUT_B1_FUSED), every expert, on the host. */
moe_status moe_plan_pack_w1(const moe_plan *plan, const uint16_t *w1, uint16_t *w1p);
moe_status moe_plan_pack_b1(const moe_plan *plan, const uint16_t *b1, uint16_t *b1p);

/* The shared expert (spec shared.ffn = F_s = m·F) into its m weight slots
 * E .. E+m-1: w1s [2F_s, H] (gate rows 0..F_s-1, then up rows) and w2s
 * [H, F_s] go to w1p [E+m, 2F, H] (packed as moe_plan_pack_w1 packs; slot
 * E+j takes gate rows jF..jF+F-1 and the matching up rows) and w2
 * [E+m, H, F] (slot E+j takes columns jF..jF+F-1). A SwiGLU FFN is a sum
 * over its intermediate dimension, so the m slots together compute the
 * shared FFN exactly. Host memory; MOE_ERR_INVALID_ARG when the spec has no
 * shared expert. */
moe_status moe_plan_pack_shared(const moe_plan *plan, const uint16_t *w1s, const uint16_t *w2s, uint16_t *w1p,
                                uint16_t *w2);

/* ---- fp8 weights (spec quant.weights = "fp8_e4m3"; README.md, "FP8 weights")
 *
 * w1q [slots, 2F, H] and w2q [slots, H, F] hold e4m3 bytes, rows where
 * w1p's and w2's are (gate and up paired in granules of 8); w1s and w2s
 * their fp32 scales (w = e4m3 · scale) in the checkpoint's row order (gate
 * rows or row blocks, then up): quant.scaling "block": w1s [slots, 2F/128,
 * H/128], w2s [slots, H/128, F/128]; "channel": w1s [slots, 2F], w2s
 * [slots, H]. The biases stay bf16 (moe_plan_pack). */

/* Pack fp8 weights as a checkpoint ships them (DeepSeek-V3: e4m3 weight
 * [N, K] and weight_scale_inv fp32 [N/128, K/128] per projection), on the
 * host. args: MOE_TENSOR_W1 or W2 of one-byte elements (strides in
 * elements: moe_plan_pack_layout fills them); scales: the same tensor,
 * first and count, its sources (gate and up for W1) indexed (e, row block,
 * column block) for "block" scaling (a weight_scale_inv [E, N/128, K/128]:
 * strides ((N/128)(K/128), K/128, 1)) or (e, row, 0) for "channel". dst
 * and dst_scales are the whole packed tensors (slot 0). Checked as
 * moe_plan_pack, and MOE_ERR_INVALID_ARG for a spec without fp8 weights. */
moe_status moe_plan_pack_fp8(const moe_plan *plan, const moe_pack_args *args, const moe_pack_args *scales, void *dst,
                             float *dst_scales);

/* Quantize bf16 weights into the fp8 format above, on the host: args as
 * for moe_plan_pack (MOE_TENSOR_W1 or W2, bf16 sources); each block (or
 * row) of each expert gets scale = amax / 448 (amax at least 1e-4) and
 * e4m3(w · 448 / amax), rounded to nearest even. */
moe_status moe_plan_pack_quantize(const moe_plan *plan, const moe_pack_args *args, void *dst, float *dst_scales);

/* The same two on the device: device pointers of the plan's device,
 * enqueued on stream with no host synchronization (capturable in a CUDA
 * graph), checked as on the host; the result is the host pack's byte for
 * byte. MOE_ERR_UNSUPPORTED when the plan's module has no fp8 pack
 * kernels. */
moe_status moe_plan_pack_fp8_async(const moe_plan *plan, const moe_pack_args *args, const moe_pack_args *scales,
                                   void *dst, float *dst_scales, void *stream);
moe_status moe_plan_pack_quantize_async(const moe_plan *plan, const moe_pack_args *args, void *dst, float *dst_scales,
                                        void *stream);

/* Enqueue the forward pass on stream. Returns MOE_ERR_CAPACITY when
 * args->tokens exceeds the spec's tokens (nothing is enqueued then). With
 * tokens = 0 a single-device plan enqueues nothing and leaves y alone; an
 * expert-parallel rank still takes part in the exchange (its peers' rows
 * run through its experts), so ranks with empty batches do not stall the
 * others. */
moe_status moe_forward(const moe_plan *plan, const moe_forward_args *args, void *stream);

/* ---- training (spec key training = true; one device, or a dp x fsdp mesh) --
 *
 * A training forward runs the forward and keeps what the backward needs in
 * a region the caller owns (`saved`: the routing indices and weights, the
 * row map, offsets and tile table, the router's fp32 logits, the gathered
 * rows xs, the activation output A, the down output O and, unless
 * recompute_u, the up projection's pre-activation U); moe_backward reads it
 * and writes every gradient. The saved region is laid out for the call's
 * token count: moe_plan_saved_size(plan, tokens, recompute_u) bytes, about
 * moe_plan_saved_per_token(plan, recompute_u) per token. recompute_u = 1
 * saves 4·k'·F bytes per token (k' = top_k + shared slots) and makes the
 * backward run the up projection once more (activation checkpointing).
 * Both calls enqueue on the stream without host synchronization, so a
 * forward and backward pair can be captured in a CUDA graph. A plan whose
 * spec lacks training = true refuses both with MOE_ERR_UNSUPPORTED. */

/* Arguments of a training forward: the forward's (fwd; fwd.workspace
 * moe_plan_train_workspace_size(plan, fwd.tokens) bytes, 256-byte aligned:
 * what the training forward writes lives in `saved`, so its workspace is
 * only the routing scratch; moe_forward's workspace serves too) and the
 * region it saves into, kept untouched until the matching moe_backward has
 * run. */
typedef struct {
    moe_forward_args fwd;
    void *saved;                  /* moe_plan_saved_size(plan, fwd.tokens, recompute_u) bytes, 256-byte aligned */
    int recompute_u;              /* 0: save U; 1: the backward recomputes it */
} moe_train_forward_args;

/* Arguments of one backward pass. Inputs are the training forward's (the
 * same tokens, recompute_u, saved region, x and weights); dy [tokens, H]
 * (dtype) is the gradient of y. Outputs, device pointers:
 *   dx           [tokens, H] dtype, written
 *   d_router_w   fp32 [E, H]
 *   d_logit_bias fp32 [E]          spec router.logit_bias (else NULL)
 *   dw1p         fp32 [S, 2F, H]   in w1p's packed row order (moe_plan_unpack_grad
 *                                  gives the plain [S, 2F, H] layout); dtype with
 *                                  spec weight_grads = "dtype"
 *   db1p         fp32 [S, 2F]      packed like b1p; spec ffn_bias (else NULL)
 *   dw2          fp32 [S, H, F]    dtype with spec weight_grads = "dtype"
 *   db2          fp32 [S, H]       spec ffn_bias (else NULL)
 *   d_shared_gate fp32 [H]         spec shared.gate = "sigmoid" (else NULL)
 *   d_router_x   [tokens, H] dtype spec router.input = "separate" (else NULL): the
 *                                  router's term of the input gradient, which dx
 *                                  then leaves out; written
 *   d_expert_scale fp32 [E]        spec router.expert_scale (else NULL)
 * (S = every weight slot, moe_plan_tensor's w1p dims; dw1p and dw2 16-byte
 * aligned, as cudaMalloc's are; a shared expert's
 * gradients are its m slots E .. E+m-1 of dw1p and dw2, split as
 * moe_plan_pack_shared splits the weights). The weight
 * gradients (all but dx) are written (accumulate = 0) or added into what
 * the buffers hold (accumulate = 1: gradient accumulation); a slot no token
 * chose gets zeros, or is left as it was. dw1p and dw2 are summed in fp32
 * either way; in the dtype they are the sum rounded once (accumulate = 1:
 * the old value plus that, rounded again; on sm_80 the old value plus the
 * unrounded sum, rounded once). The routing choice is a constant
 * (no gradient through the top-k selection; router.bias gets none).
 * router_x and router_expert_scale are the training forward's (spec
 * router.input = "separate", router.expert_scale; else ignored). */
typedef struct {
    int tokens;                   /* the training forward's fwd.tokens */
    int recompute_u;              /* the training forward's recompute_u */
    const void *saved;            /* the training forward's saved region */
    const void *x, *router_w;     /* the training forward's */
    const void *w1p, *b1p, *w2, *b2;
    const void *dy;
    void *workspace;              /* moe_plan_backward_workspace_size(plan, tokens, recompute_u) bytes, 256-byte aligned */
    int accumulate;
    void *dx;
    float *d_router_w, *d_logit_bias;
    void *dw1p;                   /* fp32, or the dtype (spec weight_grads = "dtype") */
    float *db1p;
    void *dw2;                    /* as dw1p */
    float *db2;
    const void *shared_gate;      /* spec shared.gate = "sigmoid": the training forward's w_gate [H] */
    float *d_shared_gate;
    const void *router_x;         /* spec router.input = "separate": the training forward's [tokens, H] */
    const float *router_expert_scale; /* spec router.expert_scale: the training forward's fp32 [E] */
    void *d_router_x;             /* spec router.input = "separate": [tokens, H] dtype, written */
    float *d_expert_scale;        /* spec router.expert_scale: fp32 [E] */
} moe_backward_args;

/* Bytes of the saved region of a training forward of `tokens` tokens, and
 * of the backward's workspace; 0 for a plan without training, or tokens out
 * of 0 .. the spec's tokens. */
size_t moe_plan_saved_size(const moe_plan *plan, int tokens, int recompute_u);
size_t moe_plan_backward_workspace_size(const moe_plan *plan, int tokens, int recompute_u);

/* Bytes of a training forward's workspace (moe_train_forward_args.fwd.workspace)
 * of `tokens` tokens: the routing scratch (on an expert-parallel rank also the
 * dispatch's buffers that are not kept for the backward), far less than
 * moe_plan_workspace_size's; 0 for a plan without training, or tokens out
 * of 0 .. the spec's tokens. */
size_t moe_plan_train_workspace_size(const moe_plan *plan, int tokens);

/* Bytes of the saved region each token adds (its k' rows of xs, A, O and,
 * unless recompute_u, U; its routing entries; its logits). The rest of
 * moe_plan_saved_size is the tables and each slot's row padding to the
 * GEMM tile. 0 for a plan without training. */
size_t moe_plan_saved_per_token(const moe_plan *plan, int recompute_u);

/* Byte offset and size of a region of the saved region ("counts",
 * "offsets", "num_tiles", "tiles", "topk_idx", "topk_w", "row_of",
 * "logits", "xs", "hbuf", "out", "u") or, with backward = 1, of the
 * backward's workspace ("dys", "du", "dxs", "u", "dw", "dlogits",
 * "dwr_part": d router_w's token-split sums, 0 bytes below 257 tokens), at
 * `tokens`: for tests and tools that inspect the stages. */
moe_status moe_plan_saved_region(const moe_plan *plan, int backward, int tokens, int recompute_u, const char *name,
                                 size_t *offset, size_t *bytes);

/* The training forward: moe_forward's work and result (y) and the saved
 * region. With tokens = 0 nothing is enqueued. */
moe_status moe_forward_train(const moe_plan *plan, const moe_train_forward_args *args, void *stream);

/* The backward of the training forward whose saved region args->saved is. */
moe_status moe_backward(const moe_plan *plan, const moe_backward_args *args, void *stream);

/* The plain layout of a packed gradient, on the device: tensor
 * MOE_TENSOR_W1 (src dw1p [count, 2F, H] packed -> dst [count, 2F, H], gate
 * rows 0..F-1 then up rows, MOE_LAYOUT_W1_FUSED's order; fp32, or the dtype
 * with spec weight_grads = "dtype") or MOE_TENSOR_B1 (db1p [count, 2F] ->
 * [count, 2F], fp32); count slots (1 .. every slot). Enqueued on stream; dst
 * must not overlap src. W2 and b2 gradients are in the plain layout
 * already. */
moe_status moe_plan_unpack_grad(const moe_plan *plan, moe_tensor tensor, const void *src, void *dst, int count,
                                void *stream);

/* Gather this rank's held expert weights over its FSDP group (an NCCL
 * all-gather; on a mesh where fsdp does not shard experts, a device copy).
 * Enqueued on stream; gate/up pairing is kept (whole packed experts move).
 * For overlap, keep two held buffers: gather layer i+1's weights on a second
 * stream while layer i's forward runs on the first. Collective over the FSDP
 * group: every rank of it calls this. */
moe_status moe_gather_weights(const moe_plan *plan, const moe_gather_args *args, void *stream);

/* The counterpart of moe_gather_weights for training on a mesh with
 * fsdp (with or without ep): after moe_backward has written this rank's weight
 * gradients of the held experts it ran (moe_backward's types and layouts: dw1p
 * and dw2 fp32 or, with spec weight_grads = "dtype", the dtype), sum
 * them over the FSDP group and leave each rank with the summed gradients
 * of the experts it stores, in its stored layout (dw1p [stored, 2F, H]
 * packed, db1p [stored, 2F], dw2 [stored, H, F], db2 [stored, H]).
 * Where fsdp shards the experts this is one ncclReduceScatter (sum) per
 * tensor (the held buffer is the FSDP peers' stored shards in fsdp-rank
 * order, as the gather left the weights); where it does not (held =
 * stored, e.g. expert_sharding = {"ep"}) an ncclAllReduce; on a mesh
 * without an FSDP group (fsdp = 1) a device copy. The gradients' sum over
 * the dp axis (replicas) is the caller's, as a framework's data-parallel
 * reduction is. Enqueued on stream, no host synchronization; collective
 * over the FSDP group. b1p and b2 only with spec ffn_bias. accumulate = 0
 * writes the stored buffers; they must not overlap the held ones, except
 * NCCL's in-place reduce-scatter: stored = held + fsdp_rank * stored's
 * size. accumulate = 1 adds the sums into what the stored buffers hold
 * (gradient accumulation, as moe_backward's accumulate): the collectives
 * then run in place in the held buffers, whose contents are spent (the
 * held gradients of an FSDP step are anyway), and the stored buffers
 * must not overlap them at all. dw1p and dw2 in the dtype (spec
 * weight_grads = "dtype") are summed by NCCL in the dtype (rounded at each
 * step, as a framework's bf16 gradient reduction is), the accumulate's add
 * in fp32 then rounded. MOE_ERR_UNSUPPORTED for a plan without training =
 * true. */
typedef struct {
    void *held_dw1p;                                      /* moe_backward's dw1p, db1p, dw2, db2 [held, ...] */
    float *held_db1p;
    void *held_dw2;
    float *held_db2;
    void *dw1p;                                           /* out: [stored, ...], the held ones' types */
    float *db1p;
    void *dw2;
    float *db2;
    int accumulate;                                       /* 1: add into dw1p .. db2 (the held buffers are spent) */
} moe_grad_scatter_args;

moe_status moe_reduce_scatter_grads(const moe_plan *plan, const moe_grad_scatter_args *args, void *stream);

/* Quantize before gather (fp8 specs): this rank's stored experts in bf16,
 * w1 and w2 as for moe_plan_pack_quantize_async (MOE_TENSOR_W1 and W2,
 * first = 0, count = moe_plan_info.stored, the sources indexed from the
 * rank's first stored expert: moe_plan_pack_layout over its shard), are
 * quantized on the device straight into this rank's place in
 * held_w1p/held_w1s and held_w2/held_w2s; then the e4m3 weights and their
 * scales (and the bf16 biases, stored.b1p/b2 as for moe_gather_weights)
 * are gathered over the FSDP group: half the bytes of the bf16 gather. The
 * held weights equal moe_plan_pack_quantize of the whole checkpoint's held
 * experts byte for byte. args->stored.w1p/w2, stored_w1s/w2s and pack must
 * be NULL (the sources are w1 and w2). Collective as moe_gather_weights. */
moe_status moe_gather_weights_fp8(const moe_plan *plan, const moe_pack_args *w1, const moe_pack_args *w2,
                                  const moe_gather_args *args, void *stream);

/* Capacity mode: synchronize with stream and read how many rows the last
 * forward that used `workspace` could not send or receive within
 * dispatch.capacity. MOE_OK when none (and always in exact mode);
 * MOE_ERR_OVERFLOW (rows in *rows, message with the count) when some were
 * left out: that forward's y is wrong and must not be used. rows may be NULL. */
moe_status moe_plan_overflow(const moe_plan *plan, const void *workspace, void *stream, long long *rows);

/* Given routing (router.select = "given"): synchronize with stream and read
 * how many of the caller's topk_ids the last forward that used `workspace`
 * found outside 0..E-1 (after a one-device moe_forward_train pass its
 * `saved` region as `workspace`: the count sits there, at the same place;
 * on an expert-parallel rank the training forward's workspace). Such an entry is dropped (weight 0; renormalization
 * sums the others); MOE_OK when none (and always without given routing),
 * MOE_ERR_INVALID_ARG (the count in *entries, and a message) when some were:
 * that forward left them out of y. entries may be NULL. */
moe_status moe_plan_routing_errors(const moe_plan *plan, const void *workspace, void *stream, long long *entries);

/* What the plan is: spec name, hash, the arch its kernels were built for,
 * whether they came from the cache, and each kernel's name (align and the
 * kernels: those of the GEMM variant a call of the spec's tokens runs;
 * moe_plan_variant gives the others). */
typedef struct {
    size_t struct_size;           /* set by the caller: sizeof(moe_plan_info), or 0 (see moe_options) */
    const char *name, *hash, *arch;
    int experts, top_k, hidden, ffn, tokens;
    int dtype_bytes;
    int align;                    /* each expert's rows start at a multiple of this (the GEMM M tile) */
    int cache_hit;                /* 1: the cubin came from the disk cache */
    const char *kernels[6];       /* route, permute_plan, permute_scatter, gemm_up, gemm_down, combine */
    int world, rank;              /* the mesh and this plan's global rank */
    int ep, ep_rank, fsdp, fsdp_rank;
    int stored, held;             /* experts this rank stores, and holds after the gather (its slots) */
    int dispatch_capacity;        /* rows per peer; 0 = exact mode (or no dispatch, ep = 1) */
    int cudnn_version;            /* cudnnGetVersion() of the cuDNN the plan loaded (91900 = 9.19.0); 0 = none */
    long long gather_bytes;       /* bytes one moe_gather_weights moves into this rank over its FSDP group
                                     (weights, fp8 scales, biases; 0 when the gather is a local copy) */
    int route_fuse;               /* 1: calls of few tokens fuse the permute plan into route (moe_plan_route_fuse
                                     says which calls); 0: off (MOEGEN_ROUTE_FUSE=off, or mesh.ep > 1) */
    int pdl;                      /* launch overlap (docs/DESIGN.md, "Launch overlap"; sm_90a): 1 every call
                                     launches its kernels as programmatic dependents of the stream's previous
                                     kernel (MOEGEN_PDL=on); 2 the calls whose GEMM variant's tuning entry says
                                     so (MOEGEN_PDL unset or auto; moe_plan_pdl says which); 0 none */
    int gather;                   /* the gathered up GEMM (docs/DESIGN.md, "The gathered up GEMM"): 2 auto (the
                                     calls moe_gather_tokens admits), 1 on (every call its kernels allow), as
                                     MOEGEN_GATHER says; 0 off, or no call can (the spec: fp8 weights, training,
                                     router.apply = "input", zero experts, mesh.ep > 1; or an sm_80 device). Calls
                                     whose route fuses the scatter, or whose up stage cuDNN takes, never gather */
    int pair_clusters;            /* CTA pairs ("+mc" tuning entries: 2-CTA clusters) the device keeps resident
                                     at once for the plan's pair GEMMs (the driver's occupancy answer; their grid
                                     is twice it at most); 0 = the plan has none */
    int weight_grad_bytes;        /* bytes of an element of moe_backward's dw1p and dw2: 4 (fp32) or 2 (the
                                     dtype: spec weight_grads = "dtype"); 0 for a plan without training */
    const char *backward_kernels[4]; /* the backward GEMMs on the plan's arch: dgrad_down, dgrad_up, wgrad_up,
                                        wgrad_down (their names spell the tiles: the tuning table's backward
                                        entries or the heuristics'); NULL for a plan without training */
} moe_plan_info;
#ifdef __cplusplus
#define MOE_PLAN_INFO_INIT {sizeof(moe_plan_info)}
#else
#define MOE_PLAN_INFO_INIT {.struct_size = sizeof(moe_plan_info)}
#endif
moe_status moe_plan_get_info(const moe_plan *plan, moe_plan_info *info);

/* The GEMM variants of a plan (docs/tuning.md, "Variants per call size"): a
 * plan holds one per tuning-table bucket of its shape up to its tokens (one
 * from the heuristics when the table has none), and a forward of T tokens
 * runs the one with the largest bucket <= T, or the first: its permute
 * plan (row block) and GEMM kernels. The pick is a host decision on the
 * call's tokens, so a CUDA graph captured at T replays T's variant.
 * moe_plan_variant_count: how many (0 for a NULL plan). moe_plan_variant:
 * variant i's bucket (0: the heuristics'), row block and GEMM kernel names
 * on the plan's arch (strings owned by the plan); any out pointer may be
 * NULL; MOE_ERR_INVALID_ARG for i out of range. moe_plan_variant_for: the
 * variant a moe_forward of `tokens` tokens runs (-1 for a NULL plan or
 * tokens out of range); with expert parallelism (mesh.ep > 1), or where an FFN
 * stage takes cuDNN, always the last (the capacity's). */
int moe_plan_variant_count(const moe_plan *plan);
moe_status moe_plan_variant(const moe_plan *plan, int i, int *bucket, int *align, const char **gemm_up,
                            const char **gemm_down);
int moe_plan_variant_for(const moe_plan *plan, int tokens);

/* How a moe_forward of `tokens` tokens routes and dispatches (README,
 * "Small calls"): MOE_ROUTE_SEPARATE, the route, permute_plan and
 * permute_scatter kernels launched one after another;
 * MOE_ROUTE_FUSED_PLAN, the permute plan done by the route kernel's last
 * block (calls of at most 64 tokens); MOE_ROUTE_FUSED_SCATTER, the plan and
 * the rows' scatter both there (the smallest calls: at most one token per
 * route warp, at most 128 KB of routed rows; with fp8 weights a call of
 * one token alone, whose row the route's idle warps quantize, and not with
 * router.apply = "input" or given ids). A host
 * decision on the call's tokens, so a CUDA graph captured at T replays T's
 * path. Always MOE_ROUTE_SEPARATE when moe_plan_info.route_fuse is 0
 * (MOEGEN_ROUTE_FUSE=off when the plan was created, or mesh.ep > 1); -1
 * for a NULL plan or tokens out of range. */
enum { MOE_ROUTE_SEPARATE = 0, MOE_ROUTE_FUSED_PLAN = 1, MOE_ROUTE_FUSED_SCATTER = 2 };
int moe_plan_route_fuse(const moe_plan *plan, int tokens);

/* 1 when a moe_forward of `tokens` tokens launches its kernels as
 * programmatic dependents of the stream's previous kernel (docs/DESIGN.md,
 * "Launch overlap": MOEGEN_PDL=on, or unset / auto and the call's GEMM
 * variant's tuning entry says +pdl; sm_90a only), else 0; -1 for a NULL
 * plan or tokens out of range. A host decision on the call's tokens, as
 * moe_plan_route_fuse. */
int moe_plan_pdl(const moe_plan *plan, int tokens);

/* Which path FFN stage `stage` (MOE_STAGE_UP, MOE_STAGE_DOWN) takes in this
 * plan now (MOE_PATH_GENERATED or MOE_PATH_CUDNN) and why, as a sentence
 * owned by the plan (e.g. "cuDNN 9.19.0 is known slower here: ..."). Either
 * out pointer may be NULL. */
moe_status moe_plan_stage_path(const moe_plan *plan, int stage, int *path, const char **why);

/* The shape and element type the plan expects of forward tensor `name`
 * ("x", "y", "router_w", "router_bias", "router_logit_bias", "w1p", "b1p",
 * "w2", "b2", "shared_gate", "w1s", "w2s", "topk_ids", "topk_weights", "router_x", "router_expert_scale";
 * moe_forward_args' names): *rank dims in
 * dims[0..rank-1] (x and y: the spec's tokens, the most a forward takes;
 * w1p and w2: every weight slot, a shared expert's included), *dtype "bf16", "fp16",
 * "fp32", "int32" (topk_ids) or, for w1p and w2 with fp8 weights, "fp8_e4m3" (may be NULL). *rank = 0 when this spec takes no such tensor (pass
 * NULL). MOE_ERR_INVALID_ARG for another name. */
moe_status moe_plan_tensor(const moe_plan *plan, const char *name, int *rank, int64_t dims[4], const char **dtype);

/* The library's version: MOEGEN_VERSION of gen/version.h when it was built. */
const char *moe_version(void);

/* The layout of the public structs, for bindings that mirror them without a
 * C compiler (the Python package checks its ctypes structures against these
 * at import). moe_abi_sizeof: sizeof the struct named `name`
 * ("moe_options", "moe_forward_args", "moe_weights", "moe_gather_args",
 * "moe_plan_info", "moe_pack_src", "moe_pack_args", "moe_train_forward_args",
 * "moe_backward_args", "moe_grad_scatter_args"), 0 for another name. moe_abi_field: the name of its
 * field i in declaration order, with its byte offset and size (either out
 * pointer may be NULL); NULL past the last field or for another name.
 * A field added to one of these structs is listed in runtime/abi.c too. */
size_t moe_abi_sizeof(const char *name);
const char *moe_abi_field(const char *name, int i, size_t *offset, size_t *size);

const char *moe_status_string(moe_status s);

/* The last detailed error of this thread (NVRTC log, driver message, spec
 * error with FILE:LINE), or "" if none. */
const char *moe_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
