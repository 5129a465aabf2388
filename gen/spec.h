/* spec.h — the shape of one MoE layer and its mesh, loaded from a spec file.
 *
 * A spec is a Lua table constructor read as data (docs/DESIGN.md, "The spec").
 * moe_spec_load() reads, sandboxes, validates and canonicalizes it; every
 * later stage (planning, expansion, emission) takes a validated moe_spec_t
 * and never re-checks what validation already proved. */
#ifndef MOEGEN_SPEC_H
#define MOEGEN_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOE_NAME_MAX 64
#define MOE_ARCH_MAX 4

typedef enum { MOE_DTYPE_BF16 = 0, MOE_DTYPE_FP16 = 1 } moe_dtype_t;
typedef enum {
    MOE_SCORE_SOFTMAX = 0,
    MOE_SCORE_SIGMOID = 1,
    MOE_SCORE_SQRTSOFTPLUS = 2,
    MOE_SCORE_SPARSEMIXER = 3,
    MOE_SCORE_GIVEN = 4      /* the caller's topk_weights (router.select = "given"); no router weight */
} moe_score_t;
/* Who picks each token's experts: the router's top-k, or the caller
 * (topk_ids, int32 [T, top_k]: DeepSeek-V4's hash layers, a server's own
 * router); docs/DESIGN.md, "Given routing". */
typedef enum { MOE_SELECT_TOPK = 0, MOE_SELECT_GIVEN = 1 } moe_select_t;
/* What the router's logits read: the experts' input x, or a tensor of its
 * own (router_x [T, H], the dtype; Gemma 4's router reads the residual
 * stream, normalized and scaled, while its experts read another norm of
 * it); docs/DESIGN.md, "The router's own input". */
typedef enum { MOE_ROUTER_INPUT_X = 0, MOE_ROUTER_INPUT_SEPARATE = 1 } moe_router_input_t;
/* The router weight's type: the spec's dtype, or fp32 (ERNIE 4.5,
 * Hunyuan-A13B and LongCat-Flash keep their router in fp32); docs/DESIGN.md,
 * "fp32 router weights". */
typedef enum { MOE_ROUTER_WEIGHT_DTYPE = 0, MOE_ROUTER_WEIGHT_FP32 = 1 } moe_router_weight_t;
/* Where the routing weight multiplies: the expert's output (y = Σ w·E(x)),
 * or its input (y = Σ E(round(x·round(w))), Llama 4). */
typedef enum { MOE_APPLY_OUTPUT = 0, MOE_APPLY_INPUT = 1 } moe_apply_t;
typedef enum { MOE_ARCH_SM90A = 0, MOE_ARCH_SM80 = 1 } moe_arch_t;
typedef enum { MOE_SHARED_GATE_NONE = 0, MOE_SHARED_GATE_SIGMOID = 1 } moe_shared_gate_t;
/* The backward's weight gradients dw1p and dw2: fp32, or the spec's dtype
 * (what torch autograd and TransformerEngine return for bf16 weights; half
 * the bytes written), accumulated in fp32 either way; docs/DESIGN.md,
 * "Weight gradients in the spec's dtype". */
typedef enum { MOE_WGRADS_FP32 = 0, MOE_WGRADS_DTYPE = 1 } moe_weight_grads_t;

/* Expert weights in fp8 (docs/DESIGN.md, "FP8"): none (the weights are
 * dtype), or e4m3 with fp32 scales, one per MOE_FP8_BLOCK x MOE_FP8_BLOCK
 * weight block (DeepSeek-V3's weight_scale_inv) or one per output row;
 * activations are quantized per token per MOE_FP8_BLOCK columns. */
typedef enum { MOE_QUANT_NONE = 0, MOE_QUANT_FP8_E4M3 = 1 } moe_quant_weights_t;
typedef enum { MOE_SCALING_BLOCK = 0, MOE_SCALING_CHANNEL = 1 } moe_quant_scaling_t;
#define MOE_FP8_BLOCK 128

typedef struct {
    moe_quant_weights_t weights;
    moe_quant_scaling_t scaling;  /* with weights = fp8_e4m3 */
} moe_quant_t;

/* Mesh axes. Sizes are indexed by axis id; order[] lists axis ids outermost
 * first (default dp, fsdp, ep). */
typedef enum { MOE_AXIS_DP = 0, MOE_AXIS_FSDP = 1, MOE_AXIS_EP = 2, MOE_AXIS_COUNT = 3 } moe_axis_t;

typedef struct {
    moe_score_t score;
    moe_select_t select;
    bool renormalize;
    int groups;       /* expert groups for group-limited routing; 1 = off */
    int topk_groups;  /* groups kept; 1 when groups == 1 */
    int group_topk;   /* a group scores the sum of its top group_topk selection scores; 2 when groups == 1 */
    bool bias;        /* per-expert selection bias (fp32 [E]), selection only */
    bool logit_bias;  /* per-expert bias added to the logits (fp32 [E]) */
    double scale;     /* routed weights are multiplied by this */
    moe_apply_t apply;  /* where the weights multiply: the expert's output or its input */
    double jitter_eps;  /* score "sparsemixer": the relative band 2·jitter_eps of a slot's softmax */
    double logit_softcap; /* > 0: each logit (logit_bias included) becomes c·tanh(l / c) before the score
                           * (Laguna's moe_router_logit_softcapping); 0 = off */
    moe_router_input_t input; /* the logits' input: x, or the caller's router_x */
    int hidden;         /* router.hidden: router_x's width with router.input = "separate" (a latent MoE's
                         * router reads the model's width, its experts the latent); 0 = the spec's hidden */
    bool expert_scale;  /* the final weights × a per-expert fp32 [E] (router_expert_scale; Gemma 4's
                         * per_expert_scale), after renormalization and scale */
    moe_router_weight_t weight_dtype; /* router_w in the spec's dtype, or fp32 */
} moe_router_t;

/* The gated unit applied between the expert GEMMs, on (gate, up) after the
 * limit clamps:
 *   swiglu: out = (up + up_offset) * gate * sigmoid(alpha * gate)
 *   geglu:  out = (up + up_offset) * gelu(gate), gelu the tanh approximation
 *           (PyTorch's gelu(approximate='tanh')):
 *           0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) */
/*   relu2:  out = relu(gate)^2, up unused: NemotronH's non-gated experts
 *           down(relu(up_proj(x))^2), run as a gated pair whose gate rows are
 *           up_proj (README, "Non-gated relu2 experts") */
typedef enum { MOE_ACT_SWIGLU = 0, MOE_ACT_GEGLU = 1, MOE_ACT_RELU2 = 2 } moe_act_kind_t;
/* Where activation.limit clamps the gate: before the unit (gate = min(gate,
 * limit), then act(gate): gpt-oss, DeepSeek-V4) or after it (min(act(gate),
 * limit): Step-3.7-Flash's clamped layers); up is clamped to [-limit,
 * limit] either way. */
typedef enum { MOE_CLAMP_BEFORE = 0, MOE_CLAMP_AFTER = 1 } moe_act_clamp_t;

typedef struct {
    moe_act_kind_t kind;
    double alpha;     /* swiglu only (see above) */
    double limit;     /* gate = min(gate, limit), up = clamp(up, -limit, limit); 0 = no limit */
    double up_offset;
    moe_act_clamp_t clamp; /* with a limit: the gate's clamp before the unit or on its output */
} moe_activation_t;

/* The shared expert: y = routed(x) + g(x) * FFN_shared(x), an FFN of
 * intermediate size ffn (a multiple of the routed ffn; 0 = none) with the
 * spec's activation, g = 1 (gate none) or sigmoid(x . w_gate) (gate
 * sigmoid, w_gate a learned [H] vector). */
typedef struct {
    int ffn;                      /* F_s; 0 = no shared expert */
    moe_shared_gate_t gate;
    double limit;                 /* its own activation limit (Step-3.7-Flash); 0 = activation.limit's */
    bool unclamped;               /* no limit at all (HY-V4's shared expert) */
} moe_shared_t;

typedef struct {
    int size[MOE_AXIS_COUNT];     /* dp, fsdp, ep */
    int order[MOE_AXIS_COUNT];    /* axis ids, outermost first */
    int nsharding;                /* 1 or 2 */
    int sharding[2];              /* expert_sharding axes, first axis major */
} moe_mesh_t;

/* Expert-parallel dispatch (docs/DESIGN.md, "Kernels"). */
typedef enum { MOE_DISPATCH_EXACT = 0, MOE_DISPATCH_CAPACITY = 1 } moe_dispatch_mode_t;
typedef struct {
    moe_dispatch_mode_t mode;     /* exact: counts exchanged first, one host sync */
    int capacity;                 /* capacity mode: rows per (source, destination) pair */
} moe_dispatch_t;

typedef struct {
    char name[MOE_NAME_MAX];      /* C identifier */
    int experts;                  /* E: routed experts (global) */
    int zero_experts;             /* Z: zero-computation experts the router also scores (0: none) */
    int top_k;
    int hidden;                   /* H */
    int ffn;                      /* F: per-expert intermediate size */
    int tokens;                   /* most tokens one rank feeds to one call */
    moe_dtype_t dtype;
    moe_router_t router;
    moe_activation_t activation;
    bool ffn_bias;                /* per-expert bias on both expert GEMMs */
    moe_shared_t shared;          /* the always-on shared expert (shared.ffn = 0: none) */
    bool training;                /* also plan the backward (moe_backward) */
    moe_weight_grads_t weight_grads; /* dw1p and dw2 in fp32 or the dtype (training) */
    moe_quant_t quant;            /* fp8 expert weights (quant.weights = none: dtype) */
    moe_mesh_t mesh;
    moe_dispatch_t dispatch;      /* used when mesh.ep > 1 */
    int narch;
    moe_arch_t arch[MOE_ARCH_MAX];
    char hash[33];                /* XXH3-128 of the canonical text, hex */
    /* where each top-level key was set (not part of the spec's value or
     * hash): its line in the file, or -(i + 1) for the command line's i-th
     * --set; for planner errors (moe_spec_error_at) */
    struct {
        char key[24];
        int line;
    } set_at[32];
    int nset_at;
} moe_spec_t;

/* One key override from the command line: "key=value" or "router.score=x". */
typedef struct {
    const char *text;
} moe_override_t;

/* Error report filled by loaders: "FILE:LINE: error: MESSAGE". */
typedef struct {
    char msg[1024];
} moe_diag_t;

/* Load, validate and canonicalize a spec from file `path` (or from `text`
 * when non-NULL, with `path` used only in messages). Overrides apply after
 * the file is read and before validation. Returns 0 on success; on error
 * returns non-zero and fills diag with "FILE:LINE: error: MESSAGE". */
int moe_spec_load(moe_spec_t *spec, const char *path, const char *text,
                  const moe_override_t *ovr, int novr, moe_diag_t *diag);

/* A planner error about spec `s` (loaded from `path`) as a compiler
 * message into out: "PATH:LINE: error: ERR" when err starts with a
 * top-level key the spec set ("experts (2048): ..."), naming the line that
 * set it ("<command line>:I" for a --set), else "PATH: error: ERR". */
void moe_spec_error_at(const moe_spec_t *s, const char *path, const char *err, char *out, size_t n);

/* The canonical text of a spec (sorted keys, defaults filled in), as a
 * spec file that loads back to the same spec. Caller frees. */
char *moe_spec_canonical(const moe_spec_t *spec);

const char *moe_dtype_name(moe_dtype_t d);   /* "bf16" */
const char *moe_dtype_ctype(moe_dtype_t d);  /* "__nv_bfloat16" */
const char *moe_arch_name(moe_arch_t a);     /* "sm_90a" */
const char *moe_axis_name(int axis);         /* "dp" */

/* Push onto L a table shaped like the canonical form, written from the
 * schema: { experts = 8, router = { score = "softmax", ... }, arch =
 * { "sm_90a" }, ... }; integers, numbers, booleans, strings (enums), lists
 * of strings; a key absent from the canonical form (optional and unset, or
 * not in effect) is nil. Templates read a new key here with no other
 * change. */
struct lua_State;
void moe_spec_push_lua(struct lua_State *L, const moe_spec_t *s);

/* The shared expert runs as shared_slots() always-on weight slots after
 * the routed experts: a gated FFN is separable over its intermediate
 * dimension, so one of size m * ffn is exactly the sum of m experts of size
 * ffn (spec check: shared.ffn is a multiple of ffn). Every token visits
 * slots experts .. experts + m - 1 with weight g(x), so the kernels after
 * routing see entries() = top_k + m (token, slot) entries per token over
 * slots() = experts + m weight slots. The one home of these counts: the
 * planner, the families, the workspace, the runtime and the vendored
 * launcher all read them here (docs/DESIGN.md, "Shared experts"). */
static inline int moe_spec_shared_slots(const moe_spec_t *s) { return s->ffn ? s->shared.ffn / s->ffn : 0; }
static inline int moe_spec_entries(const moe_spec_t *s) { return s->top_k + moe_spec_shared_slots(s); }
static inline int moe_spec_slots(const moe_spec_t *s) { return s->experts + moe_spec_shared_slots(s); }
/* The shared expert's activation: the spec's, at shared.limit when it has
 * its own (Step-3.7-Flash: 16 against the routed experts' 7) or with no
 * limit when shared.unclamped (HY-V4); the clamp's place stays
 * activation.clamp's. Its slots (experts .. slots() - 1) run it. */
static inline moe_activation_t moe_spec_shared_activation(const moe_spec_t *s) {
    moe_activation_t a = s->activation;
    if (s->shared.unclamped)
        a.limit = 0;
    else if (s->shared.limit > 0)
        a.limit = s->shared.limit;
    return a;
}
/* Does the shared expert's activation differ from the routed experts'? */
static inline bool moe_spec_shared_act_differs(const moe_spec_t *s) {
    return s->shared.ffn > 0 && moe_spec_shared_activation(s).limit != s->activation.limit;
}
/* Zero-computation experts (LongCat-Flash; docs/DESIGN.md, "Zero
 * experts"): the router scores scored() = experts + zero_experts experts
 * (router_w [scored, H], the router's biases [scored]); a selected index
 * >= experts is the identity, an entry with no weight slot and no expert
 * row, whose output is the token's x. */
static inline int moe_spec_scored(const moe_spec_t *s) { return s->experts + s->zero_experts; }
/* The router's logit columns: the scored experts, and the sigmoid gate's
 * column E (a spec has one or the other, never both). */
static inline int moe_spec_router_columns(const moe_spec_t *s) {
    return moe_spec_scored(s) + (s->shared.ffn > 0 && s->shared.gate == MOE_SHARED_GATE_SIGMOID);
}
/* d router_w's columns in the backward (bwd_dwr): x's H, and with
 * router.logit_bias the ones column that gives d logit_bias. */
/* The width of what the router's logits read: router.hidden, else hidden */
static inline int moe_spec_router_hidden(const moe_spec_t *s) { return s->router.hidden ? s->router.hidden : s->hidden; }
static inline int moe_spec_dwr_columns(const moe_spec_t *s) { return s->hidden + (s->router.logit_bias ? 1 : 0); }
/* The route kernel's mma columns: the logit columns, three times over with
 * fp32 router weights (each weight the sum of three dtype parts, hi, mid
 * and lo, each part's logits in its own block of columns). */
static inline int moe_spec_route_mma_columns(const moe_spec_t *s) {
    return moe_spec_router_columns(s) * (s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32 ? 3 : 1);
}

/* Are the expert weights fp8 (quant.weights = "fp8_e4m3")? */
static inline int moe_spec_fp8(const moe_spec_t *s) { return s->quant.weights == MOE_QUANT_FP8_E4M3; }
/* The fp32 scales of one slot of the fp8 W1 (w2 = 0: [2F/128, H/128] per
 * block, [2F] per channel) or W2 (w2 = 1: [H/128, F/128], or [H]). */
static inline long long moe_spec_fp8_scales(const moe_spec_t *s, int w2) {
    const long long N = w2 ? s->hidden : 2LL * s->ffn, K = w2 ? s->ffn : s->hidden;
    return s->quant.scaling == MOE_SCALING_BLOCK ? (N / MOE_FP8_BLOCK) * (K / MOE_FP8_BLOCK) : N;
}

/* Does the up GEMM gather its rows from x through the row map (docs/DESIGN.md,
 * "The gathered up GEMM")? The scatter then writes only the maps, not the
 * permuted copy xs. Not with fp8 weights (the scatter quantizes the rows),
 * router.apply = "input" (it scales them), zero experts (combine reads x[t]
 * from xs), training (the backward reads xs) or expert parallelism (the up
 * GEMM's rows arrive from the peers); only the sm_90a TMA GEMMs gather
 * (moe_gemm_gathers), and only calls whose scatter runs apart, as
 * MOEGEN_GATHER and its size rule allow (runtime/moe_forward.c). */
static inline int moe_spec_gather(const moe_spec_t *s) {
    return !moe_spec_fp8(s) && s->router.apply != MOE_APPLY_INPUT && !s->zero_experts && !s->training &&
           s->mesh.size[MOE_AXIS_EP] <= 1;
}

/* World size: dp * fsdp * ep. */
int moe_spec_world(const moe_spec_t *spec);

#endif
