// moegen_torch.cpp — the layer as PyTorch ops in C++ (libmoegen_torch.so,
// loaded by moegen.torch with torch.ops.load_library):
//
//   moegen::moe(x, router_w, w1p, w2, router_bias?, router_logit_bias?, b1p?,
//               b2?, shared_gate?, int plan, w1s?, w2s?) -> y
//     (w1s, w2s: the fp8 weights' float32 scales; w1p and w2 then
//     float8_e4m3fn. Only moegen::moe takes them: fp8 plans never train.)
//   moegen::moe_train(<the same>) -> (y, saved)
//   moegen::moe_backward(dy, saved, <the same>) -> (dx, d_router_w,
//               d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate)
//
// Their CUDA kernels call moe_forward, moe_forward_train and moe_backward
// with the tensors' data pointers on torch's current stream of the plan's
// device; workspaces and the saved region come from torch's caching
// allocator. moegen::moe's Autograd kernel makes the op differentiable when
// its plan trains (spec key training = true): under grad it runs moe_train
// through the dispatcher and records a node whose backward runs
// moe_backward; without training the node's backward raises. Shapes are
// checked here with the messages moegen.torch.check_args gives (ValueError,
// TypeError); the fake (shape-only) kernels are moegen.torch's, in Python.
//
// `plan` is an id in this library's table, filled from Python through the
// C functions at the end (moegen_torch_register, _unregister), so a call on
// an unregistered plan is an error, never a use of a freed one. Links
// libmoegen (SONAME libmoegen.so.0, the instance moegen._lib loaded first).
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "moe.h"
#include "version.h"

namespace {

using at::Tensor;
using OptT = std::optional<Tensor>;

// The op's tensors other than x, in its argument order, then x.
constexpr int kTensors = 11;
const char *const kNames[kTensors] = {"router_w", "w1p", "w2", "router_bias", "router_logit_bias",
                                      "b1p", "b2", "shared_gate", "w1s", "w2s", "x"};
enum { T_ROUTER_W, T_W1P, T_W2, T_ROUTER_BIAS, T_LOGIT_BIAS, T_B1P, T_B2, T_SHARED_GATE, T_W1S, T_W2S, T_X };

struct Expect {   // one tensor as the plan takes it; present = false: the spec takes none
    bool present;
    std::vector<int64_t> dims;
    at::ScalarType dtype;
};

struct Entry {
    const moe_plan *plan;
    int device;
    int recompute_u;
    bool training;
    bool wgrad_half;   // moe_backward's dw1p and dw2 in x's dtype (spec weight_grads = "dtype"), else fp32
    int64_t capacity, hidden;
    Expect t[kTensors];
};

std::mutex table_lock;
std::unordered_map<int64_t, std::shared_ptr<const Entry>> table;

std::shared_ptr<const Entry> find(int64_t id) {
    std::lock_guard<std::mutex> g(table_lock);
    auto it = table.find(id);
    return it == table.end() ? nullptr : it->second;
}

std::shared_ptr<const Entry> entry(int64_t id) {
    auto e = find(id);
    TORCH_CHECK_VALUE(e && e->plan, "moegen: no plan with id ", id, " is registered (moegen.torch.register_plan)");
    return e;
}

// Python's names of dtypes (str(torch.float32)), as check_args prints them.
std::string py_dtype(at::ScalarType s) {
    switch (s) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    default: return std::string("torch.") + c10::toString(s);
    }
}

std::string py_shape(at::IntArrayRef s) { return c10::str(s); }   // [4, 64], as a Python list prints

// check_args (moegen/torch.py), message for message: x [tokens, H] with
// 0 <= tokens <= capacity, then every tensor's presence, dtype and shape,
// then its device and contiguity.
void check_args(const Entry &e, const Tensor &x, const Tensor *const t[kTensors - 1]) {
    const Expect &hx = e.t[T_X];
    TORCH_CHECK_VALUE(x.dim() == 2 && x.size(1) == hx.dims[1], "moegen: x must be [tokens, ", hx.dims[1], "], not ",
                      py_shape(x.sizes()));
    TORCH_CHECK_VALUE(x.size(0) <= e.capacity, "moegen: ", x.size(0), " tokens; the plan takes 0 to ", e.capacity,
                      " (spec key tokens)");
    const Tensor *given[kTensors];
    for (int i = 0; i < kTensors - 1; i++)
        given[i] = t[i];
    given[T_X] = &x;
    for (int k = 0; k < kTensors; k++) {   // x first, then the op's order
        int i = k == 0 ? T_X : k - 1;
        const Expect &want = e.t[i];
        const Tensor *p = given[i];
        if (!p) {
            TORCH_CHECK_VALUE(!want.present, "moegen: the spec needs ", kNames[i], " ", py_dtype(want.dtype).substr(6),
                              " ", py_shape(want.dims));
            continue;
        }
        TORCH_CHECK_VALUE(want.present, "moegen: the spec takes no ", kNames[i], "; pass None");
        TORCH_CHECK_TYPE(p->scalar_type() == want.dtype, "moegen: ", kNames[i], " must be ", py_dtype(want.dtype),
                         ", not ", py_dtype(p->scalar_type()));
        TORCH_CHECK_VALUE(i == T_X || p->sizes() == at::IntArrayRef(want.dims), "moegen: ", kNames[i], " must be ",
                          py_shape(want.dims), ", not ", py_shape(p->sizes()));
    }
    const c10::Device dev(c10::kCUDA, static_cast<c10::DeviceIndex>(e.device));
    for (int k = 0; k < kTensors; k++) {
        int i = k == 0 ? T_X : k - 1;
        const Tensor *p = given[i];
        if (!p)
            continue;
        TORCH_CHECK_VALUE(p->device() == dev, "moegen: ", kNames[i], " is on ", p->device().str(), "; the plan runs on ",
                          dev.str());
        TORCH_CHECK_VALUE(p->is_contiguous(), "moegen: ", kNames[i], " must be contiguous");
    }
}

// The per-call check: check_args's conditions as one pass over the metadata;
// check_args says what does not fit.
void check(const Entry &e, const Tensor &x, const Tensor *const t[kTensors - 1]) {
    const c10::Device dev(c10::kCUDA, static_cast<c10::DeviceIndex>(e.device));
    bool ok = x.scalar_type() == e.t[T_X].dtype && x.dim() == 2 && x.size(1) == e.hidden &&
              x.size(0) <= e.capacity && x.device() == dev && x.is_contiguous();
    for (int i = 0; ok && i < kTensors - 1; i++) {
        const Expect &want = e.t[i];
        const Tensor *p = t[i];
        ok = p ? want.present && p->scalar_type() == want.dtype && p->device() == dev &&
                     p->sizes() == at::IntArrayRef(want.dims) && p->is_contiguous()
               : !want.present;
    }
    if (!ok)
        check_args(e, x, t);
}

const Tensor *opt(const OptT &t) { return t.has_value() && t->defined() ? &*t : nullptr; }
const void *ptr(const OptT &t) { return opt(t) ? t->data_ptr() : nullptr; }

struct Args {   // the op's tensors, checked against a plan (w1s, w2s: moegen::moe's alone)
    std::shared_ptr<const Entry> e;
    const Tensor *t[kTensors - 1];
    Args(const Tensor &x, const Tensor &router_w, const Tensor &w1p, const Tensor &w2, const OptT &router_bias,
         const OptT &router_logit_bias, const OptT &b1p, const OptT &b2, const OptT &shared_gate, int64_t plan,
         const OptT &w1s = OptT(), const OptT &w2s = OptT())
        : e(entry(plan)), t{&router_w, &w1p, &w2, opt(router_bias), opt(router_logit_bias), opt(b1p), opt(b2),
                            opt(shared_gate), opt(w1s), opt(w2s)} {
        check(*e, x, t);
    }
};

moe_forward_args forward_args(int tokens, const Tensor &x, const Tensor &router_w, const Tensor &w1p, const Tensor &w2,
                              const OptT &router_bias, const OptT &router_logit_bias, const OptT &b1p, const OptT &b2,
                              const OptT &shared_gate, const Tensor &y, const Tensor &ws, const OptT &w1s = OptT(),
                              const OptT &w2s = OptT()) {
    moe_forward_args a{};
    a.tokens = tokens;
    a.x = x.data_ptr();
    a.router_w = router_w.data_ptr();
    a.router_bias = static_cast<const float *>(ptr(router_bias));
    a.router_logit_bias = static_cast<const float *>(ptr(router_logit_bias));
    a.w1p = w1p.data_ptr();
    a.b1p = ptr(b1p);
    a.w2 = w2.data_ptr();
    a.b2 = ptr(b2);
    a.y = y.data_ptr();
    a.workspace = ws.data_ptr();
    a.shared_gate = ptr(shared_gate);
    a.w1s = static_cast<const float *>(ptr(w1s));
    a.w2s = static_cast<const float *>(ptr(w2s));
    return a;
}

[[noreturn]] void fail(moe_status st, const char *what) {
    const char *detail = moe_last_error();
    TORCH_CHECK(false, what, ": ", moe_status_string(st), *detail ? ": " : "", detail);
}

// Run fn (a libmoegen call) with the plan's device current for torch too:
// libmoegen makes the plan's context current, and torch's current device is
// put back afterwards when it was another.
template <class F>
moe_status on_device(const Entry &e, F fn) {
    if (c10::cuda::current_device() == e.device)
        return fn(c10::cuda::getCurrentCUDAStream(e.device).stream());
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(e.device));
    return fn(c10::cuda::getCurrentCUDAStream(e.device).stream());
}

Tensor bytes(const Tensor &like, size_t n) { return at::empty({static_cast<int64_t>(n)}, like.options().dtype(at::kByte)); }

Tensor moe_cuda(const Tensor &x, const Tensor &router_w, const Tensor &w1p, const Tensor &w2, const OptT &router_bias,
                const OptT &router_logit_bias, const OptT &b1p, const OptT &b2, const OptT &shared_gate, int64_t plan,
                const OptT &w1s, const OptT &w2s) {
    Args c(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s, w2s);
    const int tokens = static_cast<int>(x.size(0));
    Tensor y = at::empty_like(x);
    if (tokens == 0)   // nothing to enqueue (moe_forward would enqueue nothing either)
        return y;
    Tensor ws = bytes(x, moe_plan_workspace_size(c.e->plan, tokens));   // caching allocator: 512-byte aligned
    moe_forward_args a = forward_args(tokens, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2,
                                      shared_gate, y, ws, w1s, w2s);
    moe_status st = on_device(*c.e, [&](cudaStream_t s) { return moe_forward(c.e->plan, &a, s); });
    if (st != MOE_OK)
        fail(st, "moe_forward");
    return y;
}

std::tuple<Tensor, Tensor> train_cuda(const Tensor &x, const Tensor &router_w, const Tensor &w1p, const Tensor &w2,
                                      const OptT &router_bias, const OptT &router_logit_bias, const OptT &b1p,
                                      const OptT &b2, const OptT &shared_gate, int64_t plan) {
    Args c(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan);
    const Entry &e = *c.e;
    TORCH_CHECK_VALUE(e.training, "moegen: moe_train needs a plan whose spec has training = true");
    const int tokens = static_cast<int>(x.size(0));
    Tensor y = at::empty_like(x);
    Tensor saved = bytes(x, moe_plan_saved_size(e.plan, tokens, e.recompute_u));
    if (tokens == 0)
        return {y, saved};
    Tensor ws = bytes(x, moe_plan_train_workspace_size(e.plan, tokens));   // the routing scratch alone
    moe_train_forward_args a{};
    a.fwd = forward_args(tokens, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, y, ws);
    a.saved = saved.data_ptr();
    a.recompute_u = e.recompute_u;
    moe_status st = on_device(e, [&](cudaStream_t s) { return moe_forward_train(e.plan, &a, s); });
    if (st != MOE_OK)
        fail(st, "moe_forward_train");
    return {y, saved};
}

using Grads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

// moe_backward's outputs: dx [tokens, H] (x's dtype), then fp32 d_router_w
// [E, H], d_logit_bias [E], dw1p [S, 2F, H] (packed rows), db1p [S, 2F],
// dw2 [S, H, F], db2 [S, H], d_shared_gate [H] (dw1p and dw2 in x's dtype
// with spec weight_grads = "dtype"); each of the optional ones [0] where
// the spec has no such tensor.
Grads backward_cuda(const Tensor &dy, const Tensor &saved, const Tensor &x, const Tensor &router_w, const Tensor &w1p,
                    const Tensor &w2, const OptT &router_bias, const OptT &router_logit_bias, const OptT &b1p,
                    const OptT &b2, const OptT &shared_gate, int64_t plan) {
    Args c(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan);
    const Entry &e = *c.e;
    TORCH_CHECK_VALUE(e.training, "moegen: moe_backward needs a plan whose spec has training = true");
    const int tokens = static_cast<int>(x.size(0));
    TORCH_CHECK_VALUE(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() && dy.device() == x.device() &&
                          dy.is_contiguous(),
                      "moegen: dy must be contiguous ", py_dtype(x.scalar_type()).substr(6), " ", py_shape(x.sizes()),
                      " on ", x.device().str(), ", not ", py_dtype(dy.scalar_type()).substr(6), " ",
                      py_shape(dy.sizes()), " on ", dy.device().str());
    const size_t need = moe_plan_saved_size(e.plan, tokens, e.recompute_u);
    TORCH_CHECK_VALUE(saved.scalar_type() == at::kByte && saved.dim() == 1 && saved.device() == x.device() &&
                          static_cast<size_t>(saved.numel()) >= need && saved.is_contiguous(),
                      "moegen: saved must be moe_train's uint8 [", need, "] for ", tokens, " tokens");
    auto f32 = x.options().dtype(at::kFloat), wt = e.wgrad_half ? x.options() : f32;
    auto grad = [&](const Expect &w, const at::TensorOptions &o) {
        return at::empty(w.present ? at::IntArrayRef(w.dims) : at::IntArrayRef{0}, o);
    };
    Tensor dx = at::empty_like(x), d_router_w = grad(e.t[T_ROUTER_W], f32), d_logit_bias = grad(e.t[T_LOGIT_BIAS], f32);
    Tensor dw1p = grad(e.t[T_W1P], wt), db1p = grad(e.t[T_B1P], f32), dw2 = grad(e.t[T_W2], wt),
           db2 = grad(e.t[T_B2], f32);
    Tensor d_shared_gate = grad(e.t[T_SHARED_GATE], f32);
    if (tokens == 0) {   // nothing enqueued: the gradients of an empty batch are zeros
        for (Tensor *g : {&d_router_w, &d_logit_bias, &dw1p, &db1p, &dw2, &db2, &d_shared_gate})
            g->zero_();
        return {dx, d_router_w, d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate};
    }
    Tensor ws = bytes(x, moe_plan_backward_workspace_size(e.plan, tokens, e.recompute_u));
    auto out = [](const Expect &w, Tensor &g) { return w.present ? g.data_ptr<float>() : nullptr; };
    moe_backward_args a{};
    a.tokens = tokens;
    a.recompute_u = e.recompute_u;
    a.saved = saved.data_ptr();
    a.x = x.data_ptr();
    a.router_w = router_w.data_ptr();
    a.w1p = w1p.data_ptr();
    a.b1p = ptr(b1p);
    a.w2 = w2.data_ptr();
    a.b2 = ptr(b2);
    a.dy = dy.data_ptr();
    a.workspace = ws.data_ptr();
    a.accumulate = 0;
    a.dx = dx.data_ptr();
    a.d_router_w = d_router_w.data_ptr<float>();
    a.d_logit_bias = out(e.t[T_LOGIT_BIAS], d_logit_bias);
    a.dw1p = dw1p.data_ptr();
    a.db1p = out(e.t[T_B1P], db1p);
    a.dw2 = dw2.data_ptr();
    a.db2 = out(e.t[T_B2], db2);
    a.shared_gate = ptr(shared_gate);
    a.d_shared_gate = out(e.t[T_SHARED_GATE], d_shared_gate);
    moe_status st = on_device(e, [&](cudaStream_t s) { return moe_backward(e.plan, &a, s); });
    if (st != MOE_OK)
        fail(st, "moe_backward");
    return {dx, d_router_w, d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate};
}

[[noreturn]] void not_cuda(const Tensor &x) {
    TORCH_CHECK_VALUE(false, "moegen: the layer runs on CUDA tensors; x is on ", x.device().str());
}

Tensor moe_not_cuda(const Tensor &x, const Tensor &, const Tensor &, const Tensor &, const OptT &, const OptT &,
                    const OptT &, const OptT &, const OptT &, int64_t, const OptT &, const OptT &) {
    not_cuda(x);
}

std::tuple<Tensor, Tensor> train_not_cuda(const Tensor &x, const Tensor &, const Tensor &, const Tensor &,
                                          const OptT &, const OptT &, const OptT &, const OptT &, const OptT &, int64_t) {
    not_cuda(x);
}

Grads backward_not_cuda(const Tensor &, const Tensor &, const Tensor &x, const Tensor &, const Tensor &,
                        const Tensor &, const OptT &, const OptT &, const OptT &, const OptT &, const OptT &, int64_t) {
    not_cuda(x);
}

// The ops through the dispatcher (so fake tensors, tracing and modes see them).
const c10::TypedOperatorHandle<decltype(moe_cuda)> &moe_op() {
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("moegen::moe", "").typed<decltype(moe_cuda)>();
    return op;
}
const c10::TypedOperatorHandle<decltype(train_cuda)> &train_op() {
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("moegen::moe_train", "").typed<decltype(train_cuda)>();
    return op;
}
const c10::TypedOperatorHandle<decltype(backward_cuda)> &backward_op() {
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("moegen::moe_backward", "").typed<decltype(backward_cuda)>();
    return op;
}

const char kNoBackward[] =
    "moegen: this plan has no backward (its spec lacks training = true): run the layer under torch.no_grad(), "
    "with parameters that do not require grad, or plan it with training = true";

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The layer under autograd for a training plan: moe_train's y, and a
// backward through moe_backward. Gradients come back in the parameters'
// dtypes (moe_backward's weight gradients are fp32); router_bias gets none
// (the routing choice is a constant of the backward).
struct Train : torch::autograd::Function<Train> {
    static variable_list forward(AutogradContext *ctx, const Tensor &x, const Tensor &router_w, const Tensor &w1p,
                                 const Tensor &w2, const OptT &router_bias, const OptT &router_logit_bias,
                                 const OptT &b1p, const OptT &b2, const OptT &shared_gate, int64_t plan) {
        at::AutoDispatchBelowADInplaceOrView guard;
        auto [y, saved] = train_op().call(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate,
                                          plan);
        auto o = [](const OptT &t) { return opt(t) ? *t : Tensor(); };
        ctx->save_for_backward({saved, x, router_w, w1p, w2, o(router_bias), o(router_logit_bias), o(b1p), o(b2),
                                o(shared_gate)});
        ctx->saved_data["plan"] = plan;
        return {y};
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        variable_list none(10);
        if (!grads[0].defined())
            return none;
        auto s = ctx->get_saved_variables();
        auto o = [](const Tensor &t) { return t.defined() ? OptT(t) : OptT(); };
        Tensor dy = grads[0].to(s[1].scalar_type()).contiguous();
        auto [dx, d_router_w, d_logit_bias, dw1p, db1p, dw2, db2, d_shared_gate] =
            backward_op().call(dy, s[0], s[1], s[2], s[3], s[4], o(s[5]), o(s[6]), o(s[7]), o(s[8]), o(s[9]),
                               ctx->saved_data["plan"].toInt());
        auto as = [](const Tensor &g, const Tensor &like) { return like.defined() ? g.to(like.scalar_type()) : Tensor(); };
        return {dx, as(d_router_w, s[2]), as(dw1p, s[3]), as(dw2, s[4]), Tensor(), as(d_logit_bias, s[6]),
                as(db1p, s[7]), as(db2, s[8]), as(d_shared_gate, s[9]), Tensor()};
    }
};

// The layer under autograd for a plan without training: the forward, and a
// backward that raises.
struct NoBackward : torch::autograd::Function<NoBackward> {
    static variable_list forward(AutogradContext *, const Tensor &x, const Tensor &router_w, const Tensor &w1p,
                                 const Tensor &w2, const OptT &router_bias, const OptT &router_logit_bias,
                                 const OptT &b1p, const OptT &b2, const OptT &shared_gate, int64_t plan,
                                 const OptT &w1s, const OptT &w2s) {
        at::AutoDispatchBelowADInplaceOrView guard;
        return {moe_op().call(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s,
                              w2s)};
    }

    static variable_list backward(AutogradContext *, variable_list) { TORCH_CHECK_NOT_IMPLEMENTED(false, kNoBackward); }
};

bool wants_grad(const Tensor &t) { return t.requires_grad(); }
bool wants_grad(const OptT &t) { return opt(t) && t->requires_grad(); }

// moegen::moe's Autograd kernel: straight to the kernel below autograd when
// no gradient is wanted; else Train for a training plan, NoBackward for
// another (or an unregistered id, whose kernel below says so).
Tensor moe_autograd(const Tensor &x, const Tensor &router_w, const Tensor &w1p, const Tensor &w2,
                    const OptT &router_bias, const OptT &router_logit_bias, const OptT &b1p, const OptT &b2,
                    const OptT &shared_gate, int64_t plan, const OptT &w1s, const OptT &w2s) {
    if (!(at::GradMode::is_enabled() &&
          (wants_grad(x) || wants_grad(router_w) || wants_grad(w1p) || wants_grad(w2) || wants_grad(router_bias) ||
           wants_grad(router_logit_bias) || wants_grad(b1p) || wants_grad(b2) || wants_grad(shared_gate) ||
           wants_grad(w1s) || wants_grad(w2s)))) {
        at::AutoDispatchBelowADInplaceOrView guard;
        return moe_op().call(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s,
                             w2s);
    }
    auto e = find(plan);
    if (e && e->training)   // a training plan has no fp8 scales (the spec refuses fp8 with training)
        return Train::apply(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan)[0];
    return NoBackward::apply(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan, w1s,
                             w2s)[0];
}

// moegen::_bench_forward: host microseconds per call to enqueue `iters`
// forwards of x (no synchronization inside the timed loop): mode 0 calls
// moe_forward in a C loop with one prebuilt moe_forward_args (the floor of
// any binding), mode 1 calls moegen::moe through the dispatcher from C++
// (the op without Python). For test_torch_gpu.py's overhead table.
double bench_forward(const Tensor &x, const Tensor &router_w, const Tensor &w1p, const Tensor &w2,
                     const OptT &router_bias, const OptT &router_logit_bias, const OptT &b1p, const OptT &b2,
                     const OptT &shared_gate, int64_t plan, int64_t iters, int64_t mode) {
    Args c(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan);
    TORCH_CHECK_VALUE(iters > 0 && (mode == 0 || mode == 1) && x.size(0) > 0,
                      "moegen: _bench_forward takes iters > 0, mode 0 or 1 and tokens > 0");
    const int tokens = static_cast<int>(x.size(0));
    Tensor y = at::empty_like(x), ws = bytes(x, moe_plan_workspace_size(c.e->plan, tokens));
    moe_forward_args a = forward_args(tokens, x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2,
                                      shared_gate, y, ws);
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(c.e->device));
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(c.e->device).stream();
    at::NoGradGuard no_grad;
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; i++) {
        if (mode == 0) {
            moe_status st = moe_forward(c.e->plan, &a, stream);
            if (st != MOE_OK)
                fail(st, "moe_forward");
        } else {
            moe_op().call(x, router_w, w1p, w2, router_bias, router_logit_bias, b1p, b2, shared_gate, plan,
                          OptT(), OptT());
        }
    }
    auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(t1 - t0).count() / static_cast<double>(iters);
}

}  // namespace

#define MOEGEN_ARGS                                                                                                 \
    "Tensor x, Tensor router_w, Tensor w1p, Tensor w2, Tensor? router_bias, Tensor? router_logit_bias, Tensor? b1p, " \
    "Tensor? b2, Tensor? shared_gate, int plan"

TORCH_LIBRARY(moegen, m) {
    m.def("moe(" MOEGEN_ARGS ", Tensor? w1s=None, Tensor? w2s=None) -> Tensor");   // fp8 plans' scales
    m.def("moe_train(" MOEGEN_ARGS ") -> (Tensor, Tensor)");
    m.def("moe_backward(Tensor dy, Tensor saved, " MOEGEN_ARGS
          ") -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("_bench_forward(" MOEGEN_ARGS ", int iters, int mode) -> float");
}

TORCH_LIBRARY_IMPL(moegen, CUDA, m) {
    m.impl("moe", moe_cuda);
    m.impl("moe_train", train_cuda);
    m.impl("moe_backward", backward_cuda);
    m.impl("_bench_forward", bench_forward);
}

TORCH_LIBRARY_IMPL(moegen, CPU, m) {
    m.impl("moe", moe_not_cuda);
    m.impl("moe_train", train_not_cuda);
    m.impl("moe_backward", backward_not_cuda);
}

TORCH_LIBRARY_IMPL(moegen, Autograd, m) { m.impl("moe", moe_autograd); }

// ---- the plan table, from Python (ctypes) ---------------------------------
extern "C" {

// The version this library was built from (gen/version.h), which
// moegen.torch compares with libmoegen's before using it.
__attribute__((visibility("default"))) const char *moegen_torch_version(void) { return MOEGEN_VERSION; }

// The address of moe_forward as this library resolved it, so the loader can
// check that the ops and moegen._lib share one libmoegen.
__attribute__((visibility("default"))) void *moegen_torch_moe_forward(void) {
    return reinterpret_cast<void *>(&moe_forward);
}

// Register `plan` (a moe_plan *) under `id` for the ops, on CUDA device
// `device`; recompute_u: the training forward's (moe_train_forward_args).
// The expectations are read from the plan (moe_plan_get_info,
// moe_plan_tensor). Returns 0, or a moe_status with a sentence in err.
__attribute__((visibility("default"))) int moegen_torch_register(int64_t id, const void *plan, int device,
                                                                 int recompute_u, char *err, size_t err_size) {
    const moe_plan *p = static_cast<const moe_plan *>(plan);
    auto e = std::make_shared<Entry>();
    e->plan = p;
    e->device = device;
    e->recompute_u = recompute_u != 0;
    moe_plan_info info{};
    info.struct_size = sizeof info;
    moe_status st = moe_plan_get_info(p, &info);
    if (st != MOE_OK) {
        snprintf(err, err_size, "moe_plan_get_info: %s", moe_status_string(st));
        return st;
    }
    e->capacity = info.tokens;
    e->hidden = info.hidden;
    e->training = moe_plan_saved_size(p, 1, 0) > 0;
    e->wgrad_half = info.weight_grad_bytes == 2;
    for (int i = 0; i < kTensors; i++) {
        int rank = 0;
        int64_t dims[4];
        const char *dtype = nullptr;
        st = moe_plan_tensor(p, kNames[i], &rank, dims, &dtype);
        if (st != MOE_OK) {
            snprintf(err, err_size, "moe_plan_tensor(%s): %s", kNames[i], moe_status_string(st));
            return st;
        }
        Expect &x = e->t[i];
        x.present = rank > 0;
        x.dims.assign(dims, dims + rank);
        x.dtype = at::kFloat;
        if (!x.present)
            continue;
        if (!strcmp(dtype, "bf16"))
            x.dtype = at::kBFloat16;
        else if (!strcmp(dtype, "fp16"))
            x.dtype = at::kHalf;
        else if (!strcmp(dtype, "fp32"))
            x.dtype = at::kFloat;
        else if (!strcmp(dtype, "fp8_e4m3"))
            x.dtype = at::kFloat8_e4m3fn;
        else {
            snprintf(err, err_size, "moegen: %s is %s, which the PyTorch op does not take", kNames[i], dtype);
            return MOE_ERR_UNSUPPORTED;
        }
    }
    std::lock_guard<std::mutex> g(table_lock);
    table[id] = std::move(e);
    return 0;
}

// For the CPU tests of the autograd wiring: an id with no plan behind it
// (the kernels refuse it as unregistered; fake tensors never reach them)
// that moegen::moe's Autograd kernel takes for a training plan or not.
__attribute__((visibility("default"))) void moegen_torch_register_stub(int64_t id, int training) {
    auto e = std::make_shared<Entry>();
    e->plan = nullptr;
    e->training = training != 0;
    std::lock_guard<std::mutex> g(table_lock);
    table[id] = std::move(e);
}

__attribute__((visibility("default"))) void moegen_torch_unregister(int64_t id) {
    std::lock_guard<std::mutex> g(table_lock);
    table.erase(id);
}

}  // extern "C"
