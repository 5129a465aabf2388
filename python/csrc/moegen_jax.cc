// moegen_jax.cc — the layer as an XLA FFI custom call: the handler
// MoegenMoe (registered by moegen.jax as the target "moegen_moe" on the CUDA
// platform) runs moe_forward on XLA's stream of the device it runs on.
//
// A plan is bound before use (moegen_jax_bind, from Python): the handler's
// table keeps the plan pointer, its device and the tensors it expects
// (moe_plan_tensor), under a 64-bit id that is never reused; the call names
// the id in its attribute `plan`, so a call on an unbound plan is an error,
// never a use of a freed one. Built against the FFI headers jaxlib ships
// (jax.ffi.include_dir(); header-only, versioned by XLA_FFI_API_MAJOR and
// _MINOR, which XLA checks at registration); links libmoegen (the same
// instance moegen._lib loaded: it is loaded first, and its SONAME matches).
//
// The call: operands x [tokens, H], router_w, w1p, w2, then the optional
// tensors present, in the order router_bias, router_logit_bias, b1p, b2,
// shared_gate, w1s, w2s, with bit i of the attribute `present` set for each
// (w1s, w2s: bits 5 and 6, the fp8 weights' fp32 scales, w1p and w2 then
// f8e4m3fn; required by an fp8 plan, refused by another);
// results y [tokens, H] and the workspace, uint8
// [moe_plan_workspace_size(tokens) + 256] (XLA owns it; the handler aligns it
// to the 256 bytes moe_forward needs).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "moe.h"
#include "version.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kTensors = 11;  // router_w, w1p, w2, then the optional ones (kOptional of them), then x
constexpr int kOptional = 7;
const char *const kNames[kTensors] = {"router_w", "w1p", "w2", "router_bias", "router_logit_bias",
                                      "b1p", "b2", "shared_gate", "w1s", "w2s", "x"};

struct Expect {   // one tensor as the plan takes it; rank 0: the spec takes none
    int rank;
    int64_t dims[4];
    ffi::DataType dtype;
};

struct Bound {
    const moe_plan *plan;
    int device;
    Expect t[kTensors];   // kNames' order; x's dims[0] is the spec's tokens
};

std::mutex table_lock;
std::unordered_map<uint64_t, std::shared_ptr<const Bound>> table;
uint64_t next_id = 1;

ffi::DataType dtype_of(const char *name) {
    if (!strcmp(name, "bf16"))
        return ffi::DataType::BF16;
    if (!strcmp(name, "fp16"))
        return ffi::DataType::F16;
    if (!strcmp(name, "fp8_e4m3"))
        return ffi::DataType::F8E4M3FN;
    return ffi::DataType::F32;
}

const char *dtype_name(ffi::DataType d) {
    switch (d) {
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::F16: return "fp16";
    case ffi::DataType::F32: return "fp32";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::F8E4M3FN: return "float8_e4m3fn";
    default: return "another dtype";
    }
}

std::string dims_text(ffi::AnyBuffer::Dimensions d) {
    std::string s = "[";
    for (size_t i = 0; i < d.size(); i++)
        s += (i ? ", " : "") + std::to_string(d[i]);
    return s + "]";
}

ffi::Error bad(const std::string &what) { return ffi::Error::InvalidArgument("moegen_moe: " + what); }

// Whether buffer b is tensor e (dims[0] of x is not compared: tokens vary).
ffi::Error check(const char *name, const Expect &e, const ffi::AnyBuffer &b) {
    auto d = b.dimensions();
    bool ok = b.element_type() == e.dtype && (int)d.size() == e.rank;
    for (int i = (name[0] == 'x' ? 1 : 0); ok && i < e.rank; i++)
        ok = d[i] == e.dims[i];
    if (ok)
        return ffi::Error::Success();
    std::string want = "[";
    for (int i = 0; i < e.rank; i++)
        want += (i ? ", " : "") + (name[0] == 'x' && i == 0 ? std::string("tokens") : std::to_string(e.dims[i]));
    return bad(std::string(name) + " must be " + dtype_name(e.dtype) + " " + want + "], not " +
               dtype_name(b.element_type()) + " " + dims_text(d));
}

// A call's inputs checked against its plan: the plan, the token count and
// the tensors' addresses in kNames' order (the optional ones NULL where
// absent).
struct Call {
    std::shared_ptr<const Bound> b;
    int64_t tokens;
    const void *ptr[kTensors - 1];
};

ffi::Error gather(uint64_t plan_id, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer router_w, ffi::AnyBuffer w1p,
                  ffi::AnyBuffer w2, ffi::RemainingArgs optional, int32_t present, Call *c) {
    {
        std::lock_guard<std::mutex> g(table_lock);
        auto it = table.find(plan_id);
        if (it != table.end())
            c->b = it->second;
    }
    const Bound *b = c->b.get();
    if (!b)
        return bad("no plan is bound with id " + std::to_string(plan_id) + " (moegen.jax.bind; closed plans are "
                   "unbound)");
    if (device != b->device)
        return bad("the call runs on device " + std::to_string(device) + "; the plan is on device " +
                   std::to_string(b->device));
    const Expect &ex = b->t[kTensors - 1];
    if (ffi::Error e = check("x", ex, x); e.failure())
        return e;
    c->tokens = x.dimensions()[0];
    if (c->tokens > ex.dims[0])
        return bad(std::to_string(c->tokens) + " tokens; the plan takes 0 to " + std::to_string(ex.dims[0]) +
                   " (spec key tokens)");
    const ffi::AnyBuffer req[3] = {router_w, w1p, w2};
    for (int i = 0; i < 3; i++) {
        if (ffi::Error e = check(kNames[i], b->t[i], req[i]); e.failure())
            return e;
        c->ptr[i] = req[i].untyped_data();
    }
    size_t next = 0;
    for (int i = 0; i < kOptional; i++) {
        const char *name = kNames[3 + i];
        const Expect &e = b->t[3 + i];
        bool given = present >> i & 1;
        if (given != (e.rank > 0))
            return bad(given ? std::string("the spec takes no ") + name
                             : std::string("the spec needs ") + name + " (dtype " + dtype_name(e.dtype) + ")");
        if (!given) {
            c->ptr[3 + i] = nullptr;
            continue;
        }
        auto arg = optional.get<ffi::AnyBuffer>(next++);
        if (!arg.has_value())
            return bad(std::string("a buffer for ") + name + ": " + arg.error().message());
        if (ffi::Error err = check(name, e, *arg); err.failure())
            return err;
        c->ptr[3 + i] = arg->untyped_data();
    }
    if (next != optional.size())
        return bad(std::to_string(optional.size() - next) + " operands more than the attribute present names");
    if (present >> kOptional)
        return bad("present has bits past the " + std::to_string(kOptional) + " optional tensors");
    return ffi::Error::Success();
}

// How many workspaces and saved regions XLA gave the handlers, and how many
// of them did not start on a 256-byte boundary (moegen_jax_alignment).
std::atomic<uint64_t> buffers_seen[2], buffers_unaligned[2];

// A uint8 buffer of `need` bytes and room to align it to 256 (the
// workspace, the saved region): its aligned start in *out. The workspace
// is scratch, so an unaligned one is padded; the saved region is refused
// unless it starts on a boundary: the training forward writes it at its
// result's address and the backward reads it at its operand's, and a
// residual XLA moved to another address modulo 256 would otherwise be read
// shifted. XLA's GPU buffers were all aligned on the H200 (1075 workspaces,
// 16 saved regions, 0 unaligned: docs/perf/2026-12-04/run18), so the
// refusal guards against a wrong answer rather than limiting a use.
ffi::Error aligned(const char *what, ffi::AnyBuffer buf, size_t need, int64_t tokens, void **out) {
    if (buf.element_type() != ffi::DataType::U8 || buf.dimensions().size() != 1)
        return bad(std::string(what) + " must be uint8 [bytes]");
    uintptr_t base = (uintptr_t)buf.untyped_data();
    const int saved = std::strcmp(what, "the saved region") == 0;
    buffers_seen[saved]++;
    if (base % 256) {
        buffers_unaligned[saved]++;
        if (saved)
            return bad("the saved region XLA gave is not 256-byte aligned (address % 256 = " +
                       std::to_string(base % 256) + "): the forward and the backward would disagree on where it "
                       "starts, so moegen refuses it");
    }
    uintptr_t at = (base + 255) & ~(uintptr_t)255;
    if (at - base + need > buf.size_bytes())
        return bad(std::string(what) + " has " + std::to_string(buf.size_bytes()) + " bytes; " +
                   std::to_string(tokens) + " tokens need " + std::to_string(need) + " + 256");
    *out = (void *)at;
    return ffi::Error::Success();
}

ffi::Error like_x(const char *what, ffi::AnyBuffer x, ffi::AnyBuffer y) {
    if (y.element_type() != x.element_type() || y.dimensions().size() != 2 ||
        y.dimensions()[0] != x.dimensions()[0] || y.dimensions()[1] != x.dimensions()[1])
        return bad(std::string(what) + " must be like x, not " + dtype_name(y.element_type()) + " " +
                   dims_text(y.dimensions()));
    return ffi::Error::Success();
}

moe_forward_args forward_args(const Call &c, ffi::AnyBuffer x, void *y, void *ws) {
    moe_forward_args a;
    memset(&a, 0, sizeof a);
    a.tokens = (int)c.tokens;
    a.x = x.untyped_data();
    a.router_w = c.ptr[0];
    a.w1p = c.ptr[1];
    a.w2 = c.ptr[2];
    a.router_bias = (const float *)c.ptr[3];
    a.router_logit_bias = (const float *)c.ptr[4];
    a.b1p = c.ptr[5];
    a.b2 = c.ptr[6];
    a.shared_gate = c.ptr[7];
    a.w1s = (const float *)c.ptr[8];
    a.w2s = (const float *)c.ptr[9];
    a.y = y;
    a.workspace = ws;
    return a;
}

ffi::Error failed(const char *what, moe_status st) {
    return ffi::Error::Internal(std::string("moegen_moe: ") + what + ": " + moe_status_string(st) + ": " +
                                moe_last_error());
}

ffi::Error moe_impl(void *stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer router_w, ffi::AnyBuffer w1p,
                    ffi::AnyBuffer w2, ffi::RemainingArgs optional, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::AnyBuffer> workspace, uint64_t plan_id, int32_t present) {
    Call c;
    if (ffi::Error e = gather(plan_id, device, x, router_w, w1p, w2, optional, present, &c); e.failure())
        return e;
    if (ffi::Error e = like_x("y", x, *y); e.failure())
        return e;
    void *ws;
    if (ffi::Error e = aligned("the workspace", *workspace, moe_plan_workspace_size(c.b->plan, (int)c.tokens),
                               c.tokens, &ws);
        e.failure())
        return e;
    moe_forward_args a = forward_args(c, x, y->untyped_data(), ws);
    moe_status st = moe_forward(c.b->plan, &a, stream);
    if (st != MOE_OK)
        return failed("moe_forward", st);
    return ffi::Error::Success();
}

// The training forward (moegen_moe_train): moegen_moe's operands; results
// y, the saved region (uint8 [moe_plan_saved_size + 256], aligned as the
// workspace; the backward reads it at the same alignment) and the
// workspace. Attributes plan, present, recompute_u.
ffi::Error train_impl(void *stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer router_w, ffi::AnyBuffer w1p,
                      ffi::AnyBuffer w2, ffi::RemainingArgs optional, ffi::Result<ffi::AnyBuffer> y,
                      ffi::Result<ffi::AnyBuffer> saved, ffi::Result<ffi::AnyBuffer> workspace, uint64_t plan_id,
                      int32_t present, int32_t recompute_u) {
    Call c;
    if (ffi::Error e = gather(plan_id, device, x, router_w, w1p, w2, optional, present, &c); e.failure())
        return e;
    if (ffi::Error e = like_x("y", x, *y); e.failure())
        return e;
    const moe_plan *p = c.b->plan;
    const int T = (int)c.tokens;
    void *ws, *sv;
    if (ffi::Error e = aligned("the workspace", *workspace, moe_plan_train_workspace_size(p, T), c.tokens, &ws);
        e.failure())
        return e;
    if (ffi::Error e = aligned("the saved region", *saved, moe_plan_saved_size(p, T, recompute_u), c.tokens, &sv);
        e.failure())
        return e;
    moe_train_forward_args a;
    memset(&a, 0, sizeof a);
    a.fwd = forward_args(c, x, y->untyped_data(), ws);
    a.saved = sv;
    a.recompute_u = recompute_u;
    moe_status st = moe_forward_train(p, &a, stream);
    if (st != MOE_OK)
        return failed("moe_forward_train", st);
    return ffi::Error::Success();
}

// The backward (moegen_moe_backward): operands dy, saved (the training
// call's), then moegen_moe's; results dx (like x), fp32 d_router_w [E, H],
// d_logit_bias [E], dw1p [S, 2F, H] (packed rows), db1p [S, 2F], dw2
// [S, H, F], db2 [S, H], d_shared_gate [H] — each optional one [0] where
// the spec has no such tensor — and the workspace. Attributes plan,
// present, recompute_u (the training call's).
ffi::Error backward_impl(void *stream, int32_t device, ffi::AnyBuffer dy, ffi::AnyBuffer saved, ffi::AnyBuffer x,
                         ffi::AnyBuffer router_w, ffi::AnyBuffer w1p, ffi::AnyBuffer w2, ffi::RemainingArgs optional,
                         ffi::Result<ffi::AnyBuffer> dx, ffi::Result<ffi::AnyBuffer> d_router_w,
                         ffi::Result<ffi::AnyBuffer> d_logit_bias, ffi::Result<ffi::AnyBuffer> dw1p,
                         ffi::Result<ffi::AnyBuffer> db1p, ffi::Result<ffi::AnyBuffer> dw2,
                         ffi::Result<ffi::AnyBuffer> db2, ffi::Result<ffi::AnyBuffer> d_shared_gate,
                         ffi::Result<ffi::AnyBuffer> workspace, uint64_t plan_id, int32_t present,
                         int32_t recompute_u) {
    Call c;
    if (ffi::Error e = gather(plan_id, device, x, router_w, w1p, w2, optional, present, &c); e.failure())
        return e;
    if (ffi::Error e = like_x("dy", x, dy); e.failure())
        return e;
    if (ffi::Error e = like_x("dx", x, *dx); e.failure())
        return e;
    const moe_plan *p = c.b->plan;
    const int T = (int)c.tokens;
    void *ws, *sv;
    if (ffi::Error e = aligned("the workspace", *workspace, moe_plan_backward_workspace_size(p, T, recompute_u),
                               c.tokens, &ws);
        e.failure())
        return e;
    if (ffi::Error e = aligned("the saved region", saved, moe_plan_saved_size(p, T, recompute_u), c.tokens, &sv);
        e.failure())
        return e;
    // the gradients: fp32 (dw1p and dw2 x's dtype with spec weight_grads = "dtype"), shaped as their tensors,
    // or [0] for one the spec lacks
    moe_plan_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    const bool wgrad_half = moe_plan_get_info(p, &info) == MOE_OK && info.weight_grad_bytes == 2;
    struct {
        const char *name;
        int t;   // index in kNames
        ffi::Result<ffi::AnyBuffer> *r;
    } g[] = {{"d_router_w", 0, &d_router_w}, {"d_logit_bias", 4, &d_logit_bias}, {"dw1p", 1, &dw1p},
             {"db1p", 5, &db1p},             {"dw2", 2, &dw2},                   {"db2", 6, &db2},
             {"d_shared_gate", 7, &d_shared_gate}};
    void *out[7];
    for (int i = 0; i < 7; i++) {
        const Expect &e = c.b->t[g[i].t];
        ffi::AnyBuffer r = **g[i].r;
        auto d = r.dimensions();
        const ffi::DataType want = wgrad_half && (i == 2 || i == 4) ? x.element_type() : ffi::DataType::F32;
        bool ok = r.element_type() == want && (int)d.size() == (e.rank ? e.rank : 1);
        for (int k = 0; ok && k < (int)d.size(); k++)
            ok = d[k] == (e.rank ? e.dims[k] : 0);
        if (!ok)
            return bad(std::string(g[i].name) + " must be " + dtype_name(want) + " shaped as " + kNames[g[i].t] +
                       " (or [0]), not " + dtype_name(r.element_type()) + " " + dims_text(d));
        out[i] = e.rank ? r.untyped_data() : nullptr;
    }
    if (T == 0)
        return bad("the backward takes at least 1 token (moegen.jax gives 0 tokens zero gradients itself)");
    moe_backward_args a;
    memset(&a, 0, sizeof a);
    a.tokens = T;
    a.recompute_u = recompute_u;
    a.saved = sv;
    a.x = x.untyped_data();
    a.router_w = c.ptr[0];
    a.w1p = c.ptr[1];
    a.w2 = c.ptr[2];
    a.b1p = c.ptr[5];
    a.b2 = c.ptr[6];
    a.shared_gate = c.ptr[7];
    a.dy = dy.untyped_data();
    a.workspace = ws;
    a.accumulate = 0;
    a.dx = dx->untyped_data();
    a.d_router_w = (float *)out[0];
    a.d_logit_bias = (float *)out[1];
    a.dw1p = out[2];
    a.db1p = (float *)out[3];
    a.dw2 = out[4];
    a.db2 = (float *)out[5];
    a.d_shared_gate = (float *)out[6];
    moe_status st = moe_backward(p, &a, stream);
    if (st != MOE_OK)
        return failed("moe_backward", st);
    return ffi::Error::Success();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error *MoegenMoe(XLA_FFI_CallFrame *call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(MoegenMoe, moe_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // router_w
                                  .Arg<ffi::AnyBuffer>()   // w1p
                                  .Arg<ffi::AnyBuffer>()   // w2
                                  .RemainingArgs()         // the optional tensors present
                                  .Ret<ffi::AnyBuffer>()   // y
                                  .Ret<ffi::AnyBuffer>()   // workspace
                                  .Attr<uint64_t>("plan")
                                  .Attr<int32_t>("present"));

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error *MoegenMoeTrain(XLA_FFI_CallFrame *call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(MoegenMoeTrain, train_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // router_w
                                  .Arg<ffi::AnyBuffer>()   // w1p
                                  .Arg<ffi::AnyBuffer>()   // w2
                                  .RemainingArgs()         // the optional tensors present
                                  .Ret<ffi::AnyBuffer>()   // y
                                  .Ret<ffi::AnyBuffer>()   // saved
                                  .Ret<ffi::AnyBuffer>()   // workspace
                                  .Attr<uint64_t>("plan")
                                  .Attr<int32_t>("present")
                                  .Attr<int32_t>("recompute_u"));

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error *MoegenMoeBackward(XLA_FFI_CallFrame *call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(MoegenMoeBackward, backward_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()   // dy
                                  .Arg<ffi::AnyBuffer>()   // saved
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // router_w
                                  .Arg<ffi::AnyBuffer>()   // w1p
                                  .Arg<ffi::AnyBuffer>()   // w2
                                  .RemainingArgs()         // the optional tensors present
                                  .Ret<ffi::AnyBuffer>()   // dx
                                  .Ret<ffi::AnyBuffer>()   // d_router_w
                                  .Ret<ffi::AnyBuffer>()   // d_logit_bias
                                  .Ret<ffi::AnyBuffer>()   // dw1p
                                  .Ret<ffi::AnyBuffer>()   // db1p
                                  .Ret<ffi::AnyBuffer>()   // dw2
                                  .Ret<ffi::AnyBuffer>()   // db2
                                  .Ret<ffi::AnyBuffer>()   // d_shared_gate
                                  .Ret<ffi::AnyBuffer>()   // workspace
                                  .Attr<uint64_t>("plan")
                                  .Attr<int32_t>("present")
                                  .Attr<int32_t>("recompute_u"));

// The C functions moegen.jax calls through ctypes.
extern "C" {

__attribute__((visibility("default"))) const char *moegen_jax_version(void) { return MOEGEN_VERSION; }

// The address of moe_forward as this library resolved it, so the loader can
// check that the handler and moegen._lib share one libmoegen.
__attribute__((visibility("default"))) void *moegen_jax_moe_forward(void) { return (void *)&moe_forward; }

// Bind plan (created on CUDA device `device`) for calls: *id gets its id.
// Returns a moe_status (the reason in moe_last_error()).
__attribute__((visibility("default"))) int moegen_jax_bind(const moe_plan *plan, int device, uint64_t *id) {
    if (!plan || !id || device < 0)
        return MOE_ERR_INVALID_ARG;
    auto b = std::make_shared<Bound>();
    b->plan = plan;
    b->device = device;
    for (int i = 0; i < kTensors; i++) {
        const char *dt = nullptr;
        moe_status st = moe_plan_tensor(plan, kNames[i], &b->t[i].rank, b->t[i].dims, &dt);
        if (st != MOE_OK)
            return st;
        b->t[i].dtype = dtype_of(dt);
    }
    std::lock_guard<std::mutex> g(table_lock);
    *id = next_id++;
    table[*id] = std::move(b);
    return MOE_OK;
}

// out[0], out[1]: workspaces seen and those not 256-byte aligned; out[2],
// out[3]: the same for saved regions (forward and backward), since load.
__attribute__((visibility("default"))) void moegen_jax_alignment(uint64_t out[4]) {
    out[0] = buffers_seen[0], out[1] = buffers_unaligned[0], out[2] = buffers_seen[1], out[3] = buffers_unaligned[1];
}

// Forget the plan bound as id (nothing for an unknown id); calls naming it
// fail from now on. The plan itself is the caller's to destroy.
__attribute__((visibility("default"))) void moegen_jax_unbind(uint64_t id) {
    std::lock_guard<std::mutex> g(table_lock);
    table.erase(id);
}

}  // extern "C"
