/* spec_schema.c — the spec's keys (one row each) and what is written from
 * them: defaults, the canonical form, README's key table. */
#include "spec_schema.h"

#include "util.h"

#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* List and enum values are stored through int pointers. */
_Static_assert(sizeof(moe_arch_t) == sizeof(int) && sizeof(moe_dtype_t) == sizeof(int) &&
                   sizeof(moe_score_t) == sizeof(int) && sizeof(moe_select_t) == sizeof(int) &&
                   sizeof(moe_router_input_t) == sizeof(int) && sizeof(moe_router_weight_t) == sizeof(int) &&
                   sizeof(moe_act_clamp_t) == sizeof(int) && sizeof(moe_act_kind_t) == sizeof(int) &&
                   sizeof(moe_dispatch_mode_t) == sizeof(int) && sizeof(moe_apply_t) == sizeof(int) &&
                   sizeof(moe_shared_gate_t) == sizeof(int) && sizeof(moe_quant_weights_t) == sizeof(int) &&
                   sizeof(moe_quant_scaling_t) == sizeof(int) && sizeof(moe_weight_grads_t) == sizeof(int),
               "enum fields are int-sized");

#define AT(field) offsetof(moe_spec_t, field)

static const char *const dtypes[] = {"bf16", "fp16", NULL};
static const char *const scores[] = {"softmax", "sigmoid", "sqrtsoftplus", "sparsemixer", "given", NULL};
static const char *const selects[] = {"topk", "given", NULL};
static const char *const router_inputs[] = {"x", "separate", NULL};
static const char *const router_weights[] = {"dtype", "fp32", NULL};
static const char *const act_clamps[] = {"before", "after", NULL};
static const char *const applies[] = {"output", "input", NULL};
static const char *const act_kinds[] = {"swiglu", "geglu", "relu2", NULL};
static const char *const shared_gates[] = {"none", "sigmoid", NULL};
static const char *const weight_grads[] = {"fp32", "dtype", NULL};
static const char *const quant_weights[] = {"none", "fp8_e4m3", NULL};
static const int quant_weights_ids[] = {MOE_QUANT_NONE, MOE_QUANT_FP8_E4M3};
static const char *const quant_scalings[] = {"block", "channel", NULL};
static const char *const axes[] = {"dp", "fsdp", "ep", NULL};
static const char *const shard_axes[] = {"ep", "fsdp", NULL};
static const int shard_axis_ids[] = {MOE_AXIS_EP, MOE_AXIS_FSDP};
static const char *const modes[] = {"exact", "capacity", NULL};
static const char *const arches[] = {"sm_90a", "sm_80", NULL};

/* The table. Its order is the order keys are read and checked (the first
 * error wins), the order "did you mean" weighs names in, and README's order;
 * the canonical form sorts the keys. */
const moe_key_t moe_spec_keys[] = {
    {.name = "name", .type = MOE_KEY_IDENT, .offset = AT(name), .required = true, .hi = MOE_LIMIT_NAME,
     .help = "names the files and symbols; not `moe` or `moe_...` (libmoegen's own prefix)"},
    {.name = "experts", .type = MOE_KEY_INT, .offset = AT(experts), .required = true, .lo = 1,
     .hi = MOE_LIMIT_EXPERTS, .help = "routed experts E (over the whole mesh); the route kernel plans at most "
                                      "1024, more is refused at plan time (`moegen check` included)"},
    {.name = "zero_experts", .type = MOE_KEY_INT, .offset = AT(zero_experts), .optional = true, .lo = 0,
     .hi = MOE_LIMIT_EXPERTS,
     .help = "zero-computation experts Z (LongCat-Flash's `zero_expert_num`): the router scores `experts + "
             "zero_experts` experts (`router_w` [E + Z, H], `router_bias` [E + Z]), and a selected index ≥ "
             "`experts` adds `w·x` (the layer's input row), no GEMM; inference without expert parallelism (`mesh.ep` = 1), `router.apply = "
             "\"output\"`, no groups, shared expert or fp8 weights"},
    {.name = "top_k", .type = MOE_KEY_INT, .offset = AT(top_k), .required = true, .lo = 1, .hi = MOE_LIMIT_TOP_K,
     .at_most = "experts", .help = "experts each token is routed to"},
    {.name = "hidden", .type = MOE_KEY_INT, .offset = AT(hidden), .required = true, .lo = 8, .hi = MOE_LIMIT_DIM,
     .multiple = 8, .help = "model dimension H"},
    {.name = "ffn", .type = MOE_KEY_INT, .offset = AT(ffn), .required = true, .lo = 8, .hi = MOE_LIMIT_DIM,
     .multiple = 8, .help = "per-expert intermediate size F"},
    {.name = "tokens", .type = MOE_KEY_INT, .offset = AT(tokens), .def = 16384, .lo = 1, .hi = MOE_LIMIT_TOKENS,
     .help = "most tokens one rank feeds to one call (the workspace capacity)"},
    {.name = "dtype", .type = MOE_KEY_ENUM, .offset = AT(dtype), .choices = dtypes,
     .help = "type of the activations and weights"},

    {.name = "router.score", .type = MOE_KEY_ENUM, .offset = AT(router.score), .choices = scores,
     .help = "how the logits become scores: softmax over the experts, sigmoid, sqrtsoftplus = sqrt(softplus(l)) "
             "(DeepSeek-V4), or sparsemixer (Phi-3.5-MoE: top-2 of the logits, each weight a softmax over the logits "
             "within a relative 2·`router.jitter_eps` of its own), or given: the caller's `topk_weights` (fp32 "
             "[T, `top_k`], with `router.select = \"given\"`; no router weight, no logits)"},
    {.name = "router.select", .type = MOE_KEY_ENUM, .offset = AT(router.select), .choices = selects, .optional = true,
     .help = "who picks each token's experts: `\"topk\"`, the router (the best `top_k` selection scores); "
             "`\"given\"`, the caller: `topk_ids` (int32 [T, `top_k`]; DeepSeek-V4's hash layers, "
             "`tid2eid[input_ids]`, or a server's own router), weighted by the score at each id (or the given "
             "weights); an id outside 0..`experts`-1 drops its entry and is counted (`moe_plan_routing_errors`). "
             "`router.apply = \"output\"`, no selection bias or groups; training with given ids, not given weights; "
             "README, \"Given routing\""},
    {.name = "router.jitter_eps", .type = MOE_KEY_NUM, .offset = AT(router.jitter_eps), .def = 0.01, .lo = 1e-6,
     .hi = 1, .when = "router.score", .when_is = "sparsemixer",
     .help = "sparsemixer's band: slot k's softmax takes the logits l with (l_k - l) / max(abs(l), l_k) not above "
             "2·jitter_eps, in the dtype's arithmetic (Phi-3.5-MoE's router_jitter_noise)"},
    {.name = "router.renormalize", .type = MOE_KEY_BOOL, .offset = AT(router.renormalize), .def = 1,
     .help = "divide the selected weights by their sum"},
    {.name = "router.groups", .type = MOE_KEY_INT, .offset = AT(router.groups), .def = 1, .lo = 1,
     .hi = MOE_LIMIT_EXPERTS, .divides = "experts",
     .help = "group-limited routing: the experts split into this many consecutive groups"},
    {.name = "router.topk_groups", .type = MOE_KEY_INT, .offset = AT(router.topk_groups), .def = 1, .lo = 1,
     .hi = MOE_LIMIT_EXPERTS, .at_most = "router.groups",
     .help = "groups kept (with `router.groups` > 1); `top_k` must fit in them "
             "(`top_k` ≤ `topk_groups`·`experts`/`groups`)"},
    {.name = "router.group_topk", .type = MOE_KEY_INT, .offset = AT(router.group_topk), .def = 2, .lo = 1,
     .hi = MOE_LIMIT_EXPERTS, .when = "router.groups",
     .help = "a group's score is the sum of its top `group_topk` selection scores, at most `experts`/`groups` "
             "(DeepSeek-V3, GLM-4.5, Kimi K2: 2; DeepSeek-V2's group_limited_greedy: 1, the maximum)"},
    {.name = "router.bias", .type = MOE_KEY_BOOL, .offset = AT(router.bias),
     .help = "a per-expert fp32 bias added to the scores for selection only"},
    {.name = "router.logit_bias", .type = MOE_KEY_BOOL, .offset = AT(router.logit_bias),
     .help = "a per-expert fp32 bias added to the logits (moves the weights too)"},
    {.name = "router.logit_softcap", .type = MOE_KEY_NUM, .offset = AT(router.logit_softcap), .optional = true,
     .lo = 1e-3, .hi = 1e6,
     .help = "each logit (`logit_bias` included) becomes `c·tanh(l / c)` before the score, c this value (Laguna's "
             "`moe_router_logit_softcapping`); absent: no cap"},
    {.name = "router.input", .type = MOE_KEY_ENUM, .offset = AT(router.input), .choices = router_inputs,
     .optional = true,
     .help = "what the router's logits read: `\"x\"`, the experts' input; `\"separate\"`, the caller's "
             "`router_x` ([T, `hidden`], `dtype`; Gemma 4's router reads the normalized, scaled residual stream, "
             "its experts another norm of it); not with `router.score = \"given\"` (no logits) or a sigmoid "
             "`shared.gate`; training returns `d_router_x`; README, \"The router's own input\""},
    {.name = "router.hidden", .type = MOE_KEY_INT, .offset = AT(router.hidden), .optional = true, .lo = 8,
     .hi = MOE_LIMIT_DIM, .multiple = 8,
     .help = "the width of `router_x` and `router_w` ([T, this], [E, this]) when it is not `hidden`: a latent MoE "
             "(Nemotron 3 Super / Ultra's LatentMoE) routes on the model's hidden states and runs its experts on "
             "their latent projection, so `hidden` is the latent width and this the model's; needs `router.input = "
             "\"separate\"`; inference only; README, \"The router's own input\""},
    {.name = "router.expert_scale", .type = MOE_KEY_BOOL, .offset = AT(router.expert_scale), .optional = true,
     .help = "the final weights are multiplied by a per-expert fp32 `router_expert_scale` [E], after "
             "renormalization and `router.scale` (Gemma 4's `per_expert_scale`); not with `router.score = "
             "\"given\"` or zero experts; training returns `d_expert_scale` (not with given ids)"},
    {.name = "router.weight_dtype", .type = MOE_KEY_ENUM, .offset = AT(router.weight_dtype), .choices = router_weights,
     .optional = true,
     .help = "the router weight's type: `\"dtype\"` (the spec's), or `\"fp32\"` (ERNIE 4.5, Hunyuan-A13B, "
             "LongCat-Flash keep theirs in fp32): `router_w` fp32, the logits as exact as an fp32 product; not with "
             "`router.score = \"given\"` (no router) or a sigmoid `shared.gate`; inference only; README, "
             "\"fp32 router weights\""},
    {.name = "router.scale", .type = MOE_KEY_NUM, .offset = AT(router.scale), .def = 1, .lo = 1e-6, .hi = 1e6,
     .help = "the weights are multiplied by this"},
    {.name = "router.apply", .type = MOE_KEY_ENUM, .offset = AT(router.apply), .choices = applies,
     .help = "where a routing weight `w` multiplies: `\"output\"`: `y = Σ w·expert(x)`; `\"input\"` "
             "(Llama 4): `y = Σ expert(round(x·round(w)))`, rounded to `dtype`"},

    {.name = "activation.kind", .type = MOE_KEY_ENUM, .offset = AT(activation.kind), .choices = act_kinds,
     .help = "the gated unit between the expert GEMMs; `\"swiglu\"`: "
             "`out = (up + up_offset) · gate · sigmoid(alpha · gate)`; `\"geglu\"`: "
             "`out = (up + up_offset) · gelu(gate)`, gelu the tanh approximation (PyTorch's "
             "`gelu(approximate='tanh')`); `\"relu2\"`: `out = relu(gate)²`, `up` unused (NemotronH's "
             "non-gated experts, their `up_proj` given as the gate rows; README, \"Non-gated relu2 experts\")"},
    {.name = "activation.alpha", .type = MOE_KEY_NUM, .offset = AT(activation.alpha), .def = 1, .lo = 1e-6,
     .hi = 1e6, .when = "activation.kind", .when_is = "swiglu", .help = "the slope inside swiglu's sigmoid"},
    {.name = "activation.limit", .type = MOE_KEY_NUM, .offset = AT(activation.limit), .optional = true,
     .lo = 1e-6, .hi = 1e6, .help = "`gate = min(gate, limit)`, `up = clamp(up, -limit, limit)` before the unit"},
    {.name = "activation.clamp", .type = MOE_KEY_ENUM, .offset = AT(activation.clamp), .choices = act_clamps,
     .optional = true,
     .help = "where `limit` clamps the gate: `\"before\"` the unit (`gate = min(gate, limit)`; gpt-oss, "
             "DeepSeek-V4), or `\"after\"` it (`min(act(gate), limit)`: Step-3.7-Flash's clamped layers); `up` is "
             "clamped to [-limit, limit] either way; needs `activation.limit`"},
    {.name = "activation.up_offset", .type = MOE_KEY_NUM, .offset = AT(activation.up_offset), .lo = -1e6,
     .hi = 1e6, .help = "added to `up` before the product"},
    {.name = "ffn_bias", .type = MOE_KEY_BOOL, .offset = AT(ffn_bias),
     .help = "per-expert biases on both expert GEMMs (before the activation, after the down projection)"},
    {.name = "shared.ffn", .type = MOE_KEY_INT, .offset = AT(shared.ffn), .optional = true, .lo = 8,
     .hi = MOE_LIMIT_DIM,
     .help = "a shared expert every token visits: its intermediate size F_s, a multiple of `ffn` (it runs as "
             "`shared.ffn/ffn` always-on weight slots after the routed experts); `y = routed(x) + "
             "g(x)·FFN_shared(x)` with the spec's activation"},
    {.name = "shared.gate", .type = MOE_KEY_ENUM, .offset = AT(shared.gate), .choices = shared_gates,
     .when = "shared.ffn",
     .help = "the shared expert's weight `g(x)`: `\"none\"`: 1 (DeepSeek, Kimi K2, GLM-4.5, Llama 4); "
             "`\"sigmoid\"`: `sigmoid(x·w_gate)` with a learned `[H]` vector `w_gate` (Qwen2-MoE)"},
    {.name = "shared.limit", .type = MOE_KEY_NUM, .offset = AT(shared.limit), .optional = true, .lo = 1e-6,
     .hi = 1e6,
     .help = "the shared expert's own `activation.limit` (Step-3.7-Flash's clamped layers: 16 against the routed "
             "experts' 7), clamping where `activation.clamp` says; needs `activation.limit`"},
    {.name = "shared.unclamped", .type = MOE_KEY_BOOL, .offset = AT(shared.unclamped), .optional = true,
     .help = "the shared expert's activation has no limit while the routed experts' has `activation.limit` "
             "(HY-V4)"},

    {.name = "training", .type = MOE_KEY_BOOL, .offset = AT(training),
     .help = "the plan also builds the backward kernels (`moe_backward`) and the training forward that saves "
             "what the backward needs; one device or any mesh (`moe_reduce_scatter_grads` over `fsdp`)"},
    {.name = "weight_grads", .type = MOE_KEY_ENUM, .offset = AT(weight_grads), .choices = weight_grads,
     .optional = true,
     .help = "the backward's expert weight gradients `dw1p`, `dw2`: `\"fp32\"`, or `\"dtype\"` (the spec's: what "
             "torch autograd and TransformerEngine return for bf16 weights, half the bytes written), summed in fp32 "
             "either way; the bias and router gradients stay fp32; needs `training = true`; README, \"Training\""},

    {.name = "quant.weights", .type = MOE_KEY_ENUM, .offset = AT(quant.weights), .choices = quant_weights,
     .values = quant_weights_ids, .optional = true,
     .help = "the expert weights' format; `\"fp8_e4m3\"`: e4m3 with fp32 scales (`quant.scaling`), the activations "
             "quantized to e4m3 per token per 128 columns on the way into each expert GEMM, the layer's input and "
             "output bf16 (DeepSeek-V3's recipe); needs `dtype = \"bf16\"`, `hidden` and `ffn` multiples of 128, "
             "`arch = { \"sm_90a\" }`; README, \"FP8 weights\""},
    {.name = "quant.scaling", .type = MOE_KEY_ENUM, .offset = AT(quant.scaling), .choices = quant_scalings,
     .when = "quant.weights", .when_is = "fp8_e4m3",
     .help = "the fp8 weights' scales: `\"block\"`: one fp32 per 128×128 block (DeepSeek-V3's "
             "`weight_scale_inv`); `\"channel\"`: one per output row"},

    {.name = "mesh.dp", .type = MOE_KEY_INT, .offset = AT(mesh.size[MOE_AXIS_DP]), .def = 1, .lo = 1,
     .hi = MOE_LIMIT_AXIS, .help = "data-parallel replicas"},
    {.name = "mesh.fsdp", .type = MOE_KEY_INT, .offset = AT(mesh.size[MOE_AXIS_FSDP]), .def = 1, .lo = 1,
     .hi = MOE_LIMIT_AXIS, .help = "devices that shard the weights and all-gather them before the FFN"},
    {.name = "mesh.ep", .type = MOE_KEY_INT, .offset = AT(mesh.size[MOE_AXIS_EP]), .def = 1, .lo = 1,
     .hi = MOE_LIMIT_AXIS, .help = "expert-parallel devices: tokens are dispatched to the one that holds their expert"},
    {.name = "mesh.order", .type = MOE_KEY_LIST, .offset = AT(mesh.order), .choices = axes,
     .def_list = {MOE_AXIS_DP, MOE_AXIS_FSDP, MOE_AXIS_EP}, .ndef_list = 3,
     .help = "the axes outermost first; a device's global rank is the row-major index of its coordinates in "
             "this order"},
    {.name = "mesh.expert_sharding", .type = MOE_KEY_LIST, .offset = AT(mesh.sharding), .choices = shard_axes,
     .values = shard_axis_ids, .refused = "dp", .count_offset = AT(mesh.nsharding), .def_list = {0, 1},
     .ndef_list = 2, .help = "the axes that split the experts, first axis major"},

    {.name = "dispatch.mode", .type = MOE_KEY_ENUM, .offset = AT(dispatch.mode), .choices = modes,
     .when = "mesh.ep",
     .help = "`\"exact\"`: counts exchanged first, one host synchronization; `\"capacity\"`: fixed rows per "
             "peer, no host synchronization"},
    {.name = "dispatch.capacity", .type = MOE_KEY_INT, .offset = AT(dispatch.capacity), .optional = true,
     .lo = 1, .hi = MOE_LIMIT_ROWS, .when = "mesh.ep",
     .help = "with `mode = \"capacity\"` (and only then): the most rows one rank sends to one EP peer per "
             "call; overflow is reported, never silently dropped"},
    {.name = "arch", .type = MOE_KEY_LIST, .offset = AT(arch), .choices = arches, .count_offset = AT(narch),
     .def_list = {MOE_ARCH_SM90A}, .ndef_list = 1, .help = "targets of `compile`"},
};
const int moe_spec_nkeys = (int)(sizeof moe_spec_keys / sizeof *moe_spec_keys);

const moe_key_t *moe_spec_key(const char *name) {
    for (int i = 0; i < moe_spec_nkeys; i++)
        if (strcmp(moe_spec_keys[i].name, name) == 0)
            return &moe_spec_keys[i];
    return NULL;
}

int moe_key_nchoices(const moe_key_t *k) {
    int n = 0;
    while (k->choices && k->choices[n])
        n++;
    return n;
}

/* The stored value of choice i. */
static int choice_value(const moe_key_t *k, int i) { return k->values ? k->values[i] : i; }

/* The name of a stored choice value. */
static const char *choice_name(const moe_key_t *k, int value) {
    for (int i = 0; k->choices[i]; i++)
        if (choice_value(k, i) == value)
            return k->choices[i];
    return "?";
}

int moe_spec_key_int(const moe_spec_t *s, const char *name) {
    const moe_key_t *k = moe_spec_key(name);
    return k && k->type == MOE_KEY_INT ? *(const int *)((const char *)s + k->offset) : 0;
}

bool moe_key_in_effect(const moe_key_t *k, const moe_spec_t *s) {
    if (!k->when)
        return true;
    const moe_key_t *w = moe_spec_key(k->when);
    if (!w)
        return true;
    int v = *(const int *)((const char *)s + w->offset);
    return k->when_is ? strcmp(choice_name(w, v), k->when_is) == 0 : v > 1;
}

static void set_default(moe_spec_t *s, const moe_key_t *k) {
    char *p = (char *)s + k->offset;
    switch (k->type) {
    case MOE_KEY_IDENT:
        p[0] = '\0';
        break;
    case MOE_KEY_INT:
        *(int *)p = (int)k->def;
        break;
    case MOE_KEY_NUM:
        *(double *)p = k->def;
        break;
    case MOE_KEY_BOOL:
        *(bool *)p = k->def != 0;
        break;
    case MOE_KEY_ENUM:
        *(int *)p = choice_value(k, (int)k->def);
        break;
    case MOE_KEY_LIST:
        for (int i = 0; i < k->ndef_list; i++)
            ((int *)p)[i] = choice_value(k, k->def_list[i]);
        if (k->count_offset)
            *(int *)((char *)s + k->count_offset) = k->ndef_list;
        break;
    }
}

void moe_spec_set_defaults(moe_spec_t *s) {
    for (int i = 0; i < moe_spec_nkeys; i++)
        set_default(s, &moe_spec_keys[i]);
}

void moe_spec_reset_unused(moe_spec_t *s) {
    for (int i = 0; i < moe_spec_nkeys; i++)
        if (!moe_key_in_effect(&moe_spec_keys[i], s))
            set_default(s, &moe_spec_keys[i]);
}

/* ---- values as text ------------------------------------------------------ */

/* Shortest "%.Ng" that reads back to v. */
static void fmt_num(char *buf, size_t n, double v) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static int list_count(const moe_key_t *k, const moe_spec_t *s) {
    return k->count_offset ? *(const int *)((const char *)s + k->count_offset) : moe_key_nchoices(k);
}

/* Append k's value in s as spec text. */
static void put_value(moe_buf_t *b, const moe_key_t *k, const moe_spec_t *s) {
    const char *p = (const char *)s + k->offset;
    char num[32];
    switch (k->type) {
    case MOE_KEY_IDENT:
        moe_buf_printf(b, "\"%s\"", p);
        break;
    case MOE_KEY_INT:
        moe_buf_printf(b, "%d", *(const int *)p);
        break;
    case MOE_KEY_NUM:
        fmt_num(num, sizeof num, *(const double *)p);
        moe_buf_printf(b, "%s", num);
        break;
    case MOE_KEY_BOOL:
        moe_buf_printf(b, "%s", *(const bool *)p ? "true" : "false");
        break;
    case MOE_KEY_ENUM:
        moe_buf_printf(b, "\"%s\"", choice_name(k, *(const int *)p));
        break;
    case MOE_KEY_LIST:
        moe_buf_printf(b, "{");
        for (int i = 0, n = list_count(k, s); i < n; i++)
            moe_buf_printf(b, "%s \"%s\"", i ? "," : "", choice_name(k, ((const int *)p)[i]));
        moe_buf_printf(b, " }");
        break;
    }
}

/* Is k written in the canonical form of s? Not when it is not in effect,
 * nor when it is optional and absent. */
static bool written(const moe_key_t *k, const moe_spec_t *s) {
    if (!moe_key_in_effect(k, s))
        return false;
    if (!k->optional)
        return true;
    const char *p = (const char *)s + k->offset;
    if (k->type == MOE_KEY_NUM)
        return *(const double *)p != 0;
    return k->type == MOE_KEY_BOOL ? *(const bool *)p : *(const int *)p != 0;
}

/* ---- the canonical form -------------------------------------------------- */

/* Length of the top-level part of a key name ("router" of "router.score"). */
static size_t top_len(const char *name) { return strcspn(name, "."); }

static int by_top_then_sub(const void *a, const void *b) {
    const char *x = (*(const moe_key_t *const *)a)->name, *y = (*(const moe_key_t *const *)b)->name;
    size_t lx = top_len(x), ly = top_len(y);
    int c = strncmp(x, y, lx < ly ? lx : ly);
    if (c == 0 && lx != ly)
        c = lx < ly ? -1 : 1;
    return c ? c : strcmp(x, y);
}

char *moe_spec_canonical(const moe_spec_t *s) {
    const moe_key_t *rows[MOE_SPEC_MAX_KEYS];
    int n = moe_spec_nkeys < MOE_SPEC_MAX_KEYS ? moe_spec_nkeys : MOE_SPEC_MAX_KEYS;
    for (int i = 0; i < n; i++)
        rows[i] = &moe_spec_keys[i];
    qsort(rows, (size_t)n, sizeof *rows, by_top_then_sub);
    moe_buf_t b = {0};
    for (int i = 0; i < n;) {
        const char *name = rows[i]->name;
        size_t tl = top_len(name);
        if (!name[tl]) { /* a top-level key (an optional one only when set: zero_experts) */
            if (written(rows[i], s)) {
                moe_buf_printf(&b, "%s = ", name);
                put_value(&b, rows[i], s);
                moe_buf_printf(&b, "\n");
            }
            i++;
            continue;
        }
        /* a table: its written keys on one line; no line when none is written */
        int nw = 0;
        for (; i < n && top_len(rows[i]->name) == tl && strncmp(rows[i]->name, name, tl) == 0; i++) {
            if (!written(rows[i], s))
                continue;
            if (nw++)
                moe_buf_printf(&b, ", ");
            else
                moe_buf_printf(&b, "%.*s = { ", (int)tl, name);
            moe_buf_printf(&b, "%s = ", rows[i]->name + tl + 1);
            put_value(&b, rows[i], s);
        }
        if (nw)
            moe_buf_printf(&b, " }\n");
    }
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* ---- the spec as a Lua table --------------------------------------------- */

static void push_value(lua_State *L, const moe_key_t *k, const moe_spec_t *s) {
    const char *p = (const char *)s + k->offset;
    switch (k->type) {
    case MOE_KEY_IDENT:
        lua_pushstring(L, p);
        break;
    case MOE_KEY_INT:
        lua_pushinteger(L, *(const int *)p);
        break;
    case MOE_KEY_NUM:
        lua_pushnumber(L, *(const double *)p);
        break;
    case MOE_KEY_BOOL:
        lua_pushboolean(L, *(const bool *)p);
        break;
    case MOE_KEY_ENUM:
        lua_pushstring(L, choice_name(k, *(const int *)p));
        break;
    case MOE_KEY_LIST:
        lua_createtable(L, list_count(k, s), 0);
        for (int i = 0, n = list_count(k, s); i < n; i++) {
            lua_pushstring(L, choice_name(k, ((const int *)p)[i]));
            lua_rawseti(L, -2, i + 1);
        }
        break;
    }
}

void moe_spec_push_lua(lua_State *L, const moe_spec_t *s) {
    lua_newtable(L);
    for (int i = 0; i < moe_spec_nkeys; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        size_t tl = top_len(k->name);
        if (!k->name[tl]) {
            push_value(L, k, s);
            lua_setfield(L, -2, k->name);
            continue;
        }
        lua_pushlstring(L, k->name, tl);
        if (lua_rawget(L, -2) != LUA_TTABLE) { /* the table's first key */
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushlstring(L, k->name, tl);
            lua_pushvalue(L, -2);
            lua_rawset(L, -4);
        }
        if (written(k, s)) {
            push_value(L, k, s);
            lua_setfield(L, -2, k->name + tl + 1);
        }
        lua_pop(L, 1);
    }
}

/* ---- README's key table -------------------------------------------------- */

/* A bound as README writes it: 10^6, 2^20, 4096, 0.5. */
static void fmt_bound(char *buf, size_t n, double v) {
    double a = fabs(v);
    const char *sign = v < 0 ? "-" : "";
    if (a > 0 && (a >= 1e5 || a < 1)) {
        int e = (int)lround(log10(a));
        char t[16];
        snprintf(t, sizeof t, "1e%d", e);
        if (strtod(t, NULL) == a) {
            snprintf(buf, n, "%s10^%d", sign, e);
            return;
        }
    }
    if (a == floor(a) && a < 1e15) {
        long long i = (long long)a;
        if (i > 65536 && (i & (i - 1)) == 0) {
            int e = 0;
            while ((1LL << e) < i)
                e++;
            snprintf(buf, n, "%s2^%d", sign, e);
        } else {
            snprintf(buf, n, "%s%lld", sign, i);
        }
        return;
    }
    fmt_num(buf, n, v);
}

static void put_choices(moe_buf_t *b, const moe_key_t *k, const char *sep) {
    for (int i = 0; k->choices[i]; i++)
        moe_buf_printf(b, "%s`\"%s\"`", i ? sep : "", k->choices[i]);
}

static void put_md_default(moe_buf_t *b, const moe_key_t *k) {
    char num[32];
    if (k->required) {
        moe_buf_printf(b, "required");
        return;
    }
    if (k->optional && k->type != MOE_KEY_ENUM && k->type != MOE_KEY_BOOL) { /* absent; an optional choice's
                                                                                * absence is its default */
        moe_buf_printf(b, "none");
        return;
    }
    switch (k->type) {
    case MOE_KEY_IDENT:
        break;
    case MOE_KEY_INT:
        moe_buf_printf(b, "%d", (int)k->def);
        break;
    case MOE_KEY_NUM:
        fmt_num(num, sizeof num, k->def);
        moe_buf_printf(b, "%s", num);
        break;
    case MOE_KEY_BOOL:
        moe_buf_printf(b, "%s", k->def ? "true" : "false");
        break;
    case MOE_KEY_ENUM:
        moe_buf_printf(b, "`\"%s\"`", k->choices[(int)k->def]);
        break;
    case MOE_KEY_LIST:
        moe_buf_printf(b, "`{");
        for (int i = 0; i < k->ndef_list; i++)
            moe_buf_printf(b, "%s\"%s\"", i ? ", " : "", k->choices[k->def_list[i]]);
        moe_buf_printf(b, "}`");
        break;
    }
}

static void put_md_values(moe_buf_t *b, const moe_key_t *k) {
    char lo[32], hi[32];
    fmt_bound(lo, sizeof lo, k->lo);
    fmt_bound(hi, sizeof hi, k->hi);
    switch (k->type) {
    case MOE_KEY_IDENT:
        moe_buf_printf(b, "a C identifier of at most %s characters", hi);
        break;
    case MOE_KEY_INT:
    case MOE_KEY_NUM:
        moe_buf_printf(b, "%s..%s", lo, hi);
        if (k->multiple)
            moe_buf_printf(b, ", a multiple of %d", k->multiple);
        if (k->at_most)
            moe_buf_printf(b, ", at most `%s`", k->at_most);
        if (k->divides)
            moe_buf_printf(b, ", divides `%s`", k->divides);
        break;
    case MOE_KEY_BOOL:
        moe_buf_printf(b, "true, false");
        break;
    case MOE_KEY_ENUM:
        put_choices(b, k, ", ");
        break;
    case MOE_KEY_LIST:
        if (k->count_offset)
            moe_buf_printf(b, "1 to %d of ", moe_key_nchoices(k));
        else
            moe_buf_printf(b, "each of ");
        put_choices(b, k, ", ");
        if (!k->count_offset)
            moe_buf_printf(b, " once");
        break;
    }
}

char *moe_spec_keys_markdown(void) {
    static const char *const type_words[] = {"string", "integer", "number", "boolean", "string", "list"};
    moe_buf_t b = {0};
    moe_buf_printf(&b, "| key | type | default | values | meaning |\n| --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < moe_spec_nkeys; i++) {
        const moe_key_t *k = &moe_spec_keys[i];
        moe_buf_printf(&b, "| `%s` | %s | ", k->name, type_words[k->type]);
        put_md_default(&b, k);
        moe_buf_printf(&b, " | ");
        put_md_values(&b, k);
        moe_buf_printf(&b, " | %s", k->help);
        if (k->when && k->when_is)
            moe_buf_printf(&b, "; in effect only when `%s = \"%s\"`", k->when, k->when_is);
        else if (k->when)
            moe_buf_printf(&b, "; in effect only when `%s` > 1", k->when);
        moe_buf_printf(&b, " |\n");
    }
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* ---- names of choices ---------------------------------------------------- */

const char *moe_dtype_name(moe_dtype_t d) { return (unsigned)d < 2 ? dtypes[d] : "?"; }
const char *moe_arch_name(moe_arch_t a) { return (unsigned)a < 2 ? arches[a] : "?"; }
const char *moe_axis_name(int axis) { return axis >= 0 && axis < MOE_AXIS_COUNT ? axes[axis] : "?"; }
