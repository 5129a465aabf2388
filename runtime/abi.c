/* abi.c — the library's version and the layout of the public structs, for
 * bindings that mirror moe.h without a C compiler (the Python package's
 * ctypes structures are checked against this table at import), and the
 * shapes of the forward's tensors, which bindings check arguments against.
 *
 * Every field of every struct below is listed in declaration order; a field
 * added to moe.h is added here too (test_abi fails when a struct's listed
 * fields no longer tile it). */
#include "error.h"
#include "moe.h"
#include "moe_impl.h"
#include "version.h"

#include <stddef.h>
#include <string.h>

typedef struct {
    const char *name;
    size_t offset, size;
} abi_field;

#define FIELD(T, f) {#f, offsetof(T, f), sizeof(((T *)0)->f)}

static const abi_field options_fields[] = {
    FIELD(moe_options, struct_size),   FIELD(moe_options, templates_dir), FIELD(moe_options, cache_dir),  FIELD(moe_options, device),
    FIELD(moe_options, rank),          FIELD(moe_options, nccl_comm),  FIELD(moe_options, cudnn),
    FIELD(moe_options, cudnn_path),    FIELD(moe_options, tuning_path), {0}};

static const abi_field forward_fields[] = {
    FIELD(moe_forward_args, tokens),      FIELD(moe_forward_args, x),
    FIELD(moe_forward_args, router_w),    FIELD(moe_forward_args, router_bias),
    FIELD(moe_forward_args, router_logit_bias), FIELD(moe_forward_args, w1p),
    FIELD(moe_forward_args, b1p),         FIELD(moe_forward_args, w2),
    FIELD(moe_forward_args, b2),          FIELD(moe_forward_args, y),
    FIELD(moe_forward_args, workspace),   FIELD(moe_forward_args, shared_gate),
    FIELD(moe_forward_args, w1s),         FIELD(moe_forward_args, w2s),
    FIELD(moe_forward_args, topk_ids),    FIELD(moe_forward_args, topk_weights),
    FIELD(moe_forward_args, router_x),    FIELD(moe_forward_args, router_expert_scale), {0}};

static const abi_field weights_fields[] = {
    FIELD(moe_weights, w1p), FIELD(moe_weights, b1p), FIELD(moe_weights, w2), FIELD(moe_weights, b2), {0}};

static const abi_field gather_fields[] = {
    FIELD(moe_gather_args, stored),   FIELD(moe_gather_args, held_w1p), FIELD(moe_gather_args, held_b1p),
    FIELD(moe_gather_args, held_w2),  FIELD(moe_gather_args, held_b2),  FIELD(moe_gather_args, pack),
    FIELD(moe_gather_args, user),     FIELD(moe_gather_args, stored_w1s), FIELD(moe_gather_args, stored_w2s),
    FIELD(moe_gather_args, held_w1s), FIELD(moe_gather_args, held_w2s), {0}};

static const abi_field info_fields[] = {
    FIELD(moe_plan_info, struct_size), FIELD(moe_plan_info, name),        FIELD(moe_plan_info, hash),      FIELD(moe_plan_info, arch),
    FIELD(moe_plan_info, experts),     FIELD(moe_plan_info, top_k),     FIELD(moe_plan_info, hidden),
    FIELD(moe_plan_info, ffn),         FIELD(moe_plan_info, tokens),    FIELD(moe_plan_info, dtype_bytes),
    FIELD(moe_plan_info, align),       FIELD(moe_plan_info, cache_hit), FIELD(moe_plan_info, kernels),
    FIELD(moe_plan_info, world),       FIELD(moe_plan_info, rank),      FIELD(moe_plan_info, ep),
    FIELD(moe_plan_info, ep_rank),     FIELD(moe_plan_info, fsdp),      FIELD(moe_plan_info, fsdp_rank),
    FIELD(moe_plan_info, stored),      FIELD(moe_plan_info, held),      FIELD(moe_plan_info, dispatch_capacity),
    FIELD(moe_plan_info, cudnn_version), FIELD(moe_plan_info, gather_bytes),
    FIELD(moe_plan_info, route_fuse),  FIELD(moe_plan_info, pdl),
    FIELD(moe_plan_info, gather),      FIELD(moe_plan_info, pair_clusters),
    FIELD(moe_plan_info, weight_grad_bytes), FIELD(moe_plan_info, backward_kernels), {0}};

static const abi_field pack_src_fields[] = {
    FIELD(moe_pack_src, ptr), FIELD(moe_pack_src, expert), FIELD(moe_pack_src, row), FIELD(moe_pack_src, col), {0}};

static const abi_field pack_args_fields[] = {
    FIELD(moe_pack_args, tensor), FIELD(moe_pack_args, src), FIELD(moe_pack_args, first),
    FIELD(moe_pack_args, count),  {0}};

static const abi_field train_fields[] = {
    FIELD(moe_train_forward_args, fwd), FIELD(moe_train_forward_args, saved),
    FIELD(moe_train_forward_args, recompute_u), {0}};

static const abi_field backward_fields[] = {
    FIELD(moe_backward_args, tokens),     FIELD(moe_backward_args, recompute_u), FIELD(moe_backward_args, saved),
    FIELD(moe_backward_args, x),          FIELD(moe_backward_args, router_w),    FIELD(moe_backward_args, w1p),
    FIELD(moe_backward_args, b1p),        FIELD(moe_backward_args, w2),          FIELD(moe_backward_args, b2),
    FIELD(moe_backward_args, dy),         FIELD(moe_backward_args, workspace),   FIELD(moe_backward_args, accumulate),
    FIELD(moe_backward_args, dx),         FIELD(moe_backward_args, d_router_w),  FIELD(moe_backward_args, d_logit_bias),
    FIELD(moe_backward_args, dw1p),       FIELD(moe_backward_args, db1p),        FIELD(moe_backward_args, dw2),
    FIELD(moe_backward_args, db2),        FIELD(moe_backward_args, shared_gate), FIELD(moe_backward_args, d_shared_gate),
    FIELD(moe_backward_args, router_x),   FIELD(moe_backward_args, router_expert_scale),
    FIELD(moe_backward_args, d_router_x), FIELD(moe_backward_args, d_expert_scale), {0}};

static const abi_field grad_scatter_fields[] = {
    FIELD(moe_grad_scatter_args, held_dw1p), FIELD(moe_grad_scatter_args, held_db1p),
    FIELD(moe_grad_scatter_args, held_dw2),  FIELD(moe_grad_scatter_args, held_db2),
    FIELD(moe_grad_scatter_args, dw1p),      FIELD(moe_grad_scatter_args, db1p),
    FIELD(moe_grad_scatter_args, dw2),       FIELD(moe_grad_scatter_args, db2),
    FIELD(moe_grad_scatter_args, accumulate), {0}};

static const struct {
    const char *name;
    size_t size;
    const abi_field *fields;
} abi_structs[] = {
    {"moe_options", sizeof(moe_options), options_fields},
    {"moe_forward_args", sizeof(moe_forward_args), forward_fields},
    {"moe_weights", sizeof(moe_weights), weights_fields},
    {"moe_gather_args", sizeof(moe_gather_args), gather_fields},
    {"moe_plan_info", sizeof(moe_plan_info), info_fields},
    {"moe_pack_src", sizeof(moe_pack_src), pack_src_fields},
    {"moe_pack_args", sizeof(moe_pack_args), pack_args_fields},
    {"moe_train_forward_args", sizeof(moe_train_forward_args), train_fields},
    {"moe_backward_args", sizeof(moe_backward_args), backward_fields},
    {"moe_grad_scatter_args", sizeof(moe_grad_scatter_args), grad_scatter_fields},
};

const char *moe_version(void) { return MOEGEN_VERSION; }

/* ---- growable structs (moe.h, "Growable structs") ------------------------ */

moe_status moe_struct_in(void *dst, size_t ours, size_t v1, const void *src, const char *what) {
    memset(dst, 0, ours);
    size_t n = *(const size_t *)src;
    if (n == 0)
        n = v1;
    if (n < sizeof(size_t))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s.struct_size is %zu: not a size of the struct (set it to sizeof, "
                        "or 0)", what, n);
    for (size_t i = ours; i < n; i++)
        if (((const unsigned char *)src)[i])
            return moe_fail(MOE_ERR_INVALID_ARG, "%s.struct_size is %zu: the caller's moe.h is newer than this "
                            "library's (%zu bytes) and sets a field it does not know (byte %zu is not 0)", what, n,
                            ours, i);
    memcpy(dst, src, n < ours ? n : ours);
    *(size_t *)dst = ours;
    return MOE_OK;
}

moe_status moe_struct_out(void *dst, const void *src, size_t ours, size_t v1, const char *what) {
    size_t n = *(const size_t *)dst;
    if (n == 0)
        n = v1;
    if (n < sizeof(size_t))
        return moe_fail(MOE_ERR_INVALID_ARG, "%s.struct_size is %zu: not a size of the struct (set it to sizeof, "
                        "or 0)", what, n);
    /* struct_size itself stays the caller's */
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), (n < ours ? n : ours) - sizeof(size_t));
    if (n > ours)
        memset((char *)dst + ours, 0, n - ours);
    return MOE_OK;
}

static int abi_find(const char *name) {
    for (int i = 0; name && i < (int)(sizeof abi_structs / sizeof abi_structs[0]); i++)
        if (!strcmp(abi_structs[i].name, name))
            return i;
    return -1;
}

size_t moe_abi_sizeof(const char *name) {
    int s = abi_find(name);
    return s < 0 ? 0 : abi_structs[s].size;
}

const char *moe_abi_field(const char *name, int i, size_t *offset, size_t *size) {
    int s = abi_find(name);
    if (s < 0 || i < 0)
        return NULL;
    for (int k = 0; k <= i; k++)
        if (!abi_structs[s].fields[k].name)
            return NULL;
    const abi_field *f = &abi_structs[s].fields[i];
    if (offset)
        *offset = f->offset;
    if (size)
        *size = f->size;
    return f->name;
}

/* ---- the forward's tensors as the plan expects them ---------------------- */

moe_status moe_plan_tensor(const moe_plan *p, const char *name, int *rank, int64_t dims[4], const char **dtype) {
    if (!p || !name || !rank || !dims)
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_tensor: NULL argument");
    const moe_spec_t *s = &p->pd.spec;
    int64_t T = s->tokens, H = s->hidden, F = s->ffn, S = p->launcher.slots;
    const char *dt = moe_dtype_name(s->dtype);
    int n = 0;
    int64_t d[4] = {0};
#define SHAPE(...) do { int64_t v_[] = {__VA_ARGS__}; n = (int)(sizeof v_ / sizeof v_[0]); \
                        memcpy(d, v_, sizeof v_); } while (0)
    if (!strcmp(name, "x") || !strcmp(name, "y"))
        SHAPE(T, H);
    else if (!strcmp(name, "router_w")) { /* the scored experts: the zero experts' rows too */
        if (s->router.weight_dtype == MOE_ROUTER_WEIGHT_FP32)
            dt = "fp32";
        if (s->router.score != MOE_SCORE_GIVEN) /* the caller's weights: no router */
            SHAPE(moe_spec_scored(s), moe_spec_router_hidden(s)); /* router.hidden's width where it is set */
    } else if (!strcmp(name, "topk_ids") || !strcmp(name, "topk_weights")) { /* given routing */
        dt = name[5] == 'i' ? "int32" : "fp32";
        if (name[5] == 'i' ? s->router.select == MOE_SELECT_GIVEN : s->router.score == MOE_SCORE_GIVEN)
            SHAPE(T, s->top_k);
    } else if (!strcmp(name, "router_x")) { /* router.input = "separate": the logits' own input */
        if (s->router.input == MOE_ROUTER_INPUT_SEPARATE)
            SHAPE(T, moe_spec_router_hidden(s));
    } else if (!strcmp(name, "router_expert_scale")) {
        dt = "fp32";
        if (s->router.expert_scale)
            SHAPE(s->experts);
    } else if (!strcmp(name, "router_bias") || !strcmp(name, "router_logit_bias")) {
        dt = "fp32";
        if (name[7] == 'b' ? s->router.bias : s->router.logit_bias)
            SHAPE(moe_spec_scored(s));
    } else if (!strcmp(name, "w1p") || !strcmp(name, "w2")) {
        if (name[1] == '1')
            SHAPE(S, 2 * F, H);
        else
            SHAPE(S, H, F);
        if (moe_spec_fp8(s))
            dt = "fp8_e4m3";
    } else if (!strcmp(name, "w1s") || !strcmp(name, "w2s")) { /* fp8 weights' scales (moe.h, "fp8 weights") */
        const int up = name[1] == '1', block = s->quant.scaling == MOE_SCALING_BLOCK;
        const int64_t N = up ? 2 * F : H, K = up ? H : F, B = MOE_FP8_BLOCK;
        dt = "fp32";
        if (moe_spec_fp8(s) && block)
            SHAPE(S, N / B, K / B);
        else if (moe_spec_fp8(s))
            SHAPE(S, N);
    }
    else if (!strcmp(name, "b1p")) {
        if (s->ffn_bias)
            SHAPE(S, 2 * F);
    } else if (!strcmp(name, "b2")) {
        if (s->ffn_bias)
            SHAPE(S, H);
    } else if (!strcmp(name, "shared_gate")) { /* w_gate of a sigmoid-gated shared expert */
        if (s->shared.ffn && s->shared.gate == MOE_SHARED_GATE_SIGMOID)
            SHAPE(H);
    } else
        return moe_fail(MOE_ERR_INVALID_ARG, "moe_plan_tensor: no tensor named \"%s\"", name);
#undef SHAPE
    *rank = n;
    memcpy(dims, d, sizeof d);
    if (dtype)
        *dtype = dt;
    return MOE_OK;
}
