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
// shared_gate, with bit i of the attribute `present` set for each;
// results y [tokens, H] and the workspace, uint8
// [moe_plan_workspace_size(tokens) + 256] (XLA owns it; the handler aligns it
// to the 256 bytes moe_forward needs).
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

constexpr int kTensors = 9;  // router_w, w1p, w2, then the optional ones (kOptional of them)
constexpr int kOptional = 5;
const char *const kNames[kTensors] = {"router_w", "w1p", "w2", "router_bias", "router_logit_bias",
                                      "b1p", "b2", "shared_gate", "x"};

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
    return ffi::DataType::F32;
}

const char *dtype_name(ffi::DataType d) {
    switch (d) {
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::F16: return "fp16";
    case ffi::DataType::F32: return "fp32";
    case ffi::DataType::U8: return "uint8";
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

ffi::Error moe_impl(void *stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer router_w, ffi::AnyBuffer w1p,
                    ffi::AnyBuffer w2, ffi::RemainingArgs optional, ffi::Result<ffi::AnyBuffer> y,
                    ffi::Result<ffi::AnyBuffer> workspace, uint64_t plan_id, int32_t present) {
    std::shared_ptr<const Bound> b;
    {
        std::lock_guard<std::mutex> g(table_lock);
        auto it = table.find(plan_id);
        if (it != table.end())
            b = it->second;
    }
    if (!b)
        return bad("no plan is bound with id " + std::to_string(plan_id) + " (moegen.jax.bind; closed plans are "
                   "unbound)");
    if (device != b->device)
        return bad("the call runs on device " + std::to_string(device) + "; the plan is on device " +
                   std::to_string(b->device));
    const Expect &ex = b->t[kTensors - 1];
    if (ffi::Error e = check("x", ex, x); e.failure())
        return e;
    int64_t tokens = x.dimensions()[0];
    if (tokens > ex.dims[0])
        return bad(std::to_string(tokens) + " tokens; the plan takes 0 to " + std::to_string(ex.dims[0]) +
                   " (spec key tokens)");
    if (y->element_type() != x.element_type() || y->dimensions().size() != 2 ||
        y->dimensions()[0] != tokens || y->dimensions()[1] != ex.dims[1])
        return bad("y must be like x, not " + std::string(dtype_name(y->element_type())) + " " +
                   dims_text(y->dimensions()));
    const void *ptr[kTensors - 1] = {router_w.untyped_data(), w1p.untyped_data(), w2.untyped_data()};
    const ffi::AnyBuffer req[3] = {router_w, w1p, w2};
    for (int i = 0; i < 3; i++)
        if (ffi::Error e = check(kNames[i], b->t[i], req[i]); e.failure())
            return e;
    size_t next = 0;
    for (int i = 0; i < kOptional; i++) {
        const char *name = kNames[3 + i];
        const Expect &e = b->t[3 + i];
        bool given = present >> i & 1;
        if (given != (e.rank > 0))
            return bad(given ? std::string("the spec takes no ") + name
                             : std::string("the spec needs ") + name + " (dtype " + dtype_name(e.dtype) + ")");
        if (!given) {
            ptr[3 + i] = nullptr;
            continue;
        }
        auto arg = optional.get<ffi::AnyBuffer>(next++);
        if (!arg.has_value())
            return bad(std::string("a buffer for ") + name + ": " + arg.error().message());
        if (ffi::Error err = check(name, e, *arg); err.failure())
            return err;
        ptr[3 + i] = arg->untyped_data();
    }
    if (next != optional.size())
        return bad(std::to_string(optional.size() - next) + " operands more than the attribute present names");
    if (present >> kOptional)
        return bad("present has bits past the " + std::to_string(kOptional) + " optional tensors");
    if (workspace->element_type() != ffi::DataType::U8 || workspace->dimensions().size() != 1)
        return bad("the workspace must be uint8 [bytes]");
    size_t need = moe_plan_workspace_size(b->plan, (int)tokens);
    uintptr_t base = (uintptr_t)workspace->untyped_data();
    uintptr_t aligned = (base + 255) & ~(uintptr_t)255;
    if (aligned - base + need > workspace->size_bytes())
        return bad("the workspace has " + std::to_string(workspace->size_bytes()) + " bytes; " +
                   std::to_string(tokens) + " tokens need " + std::to_string(need) + " + 256");

    moe_forward_args a;
    memset(&a, 0, sizeof a);
    a.tokens = (int)tokens;
    a.x = x.untyped_data();
    a.router_w = ptr[0];
    a.w1p = ptr[1];
    a.w2 = ptr[2];
    a.router_bias = (const float *)ptr[3];
    a.router_logit_bias = (const float *)ptr[4];
    a.b1p = ptr[5];
    a.b2 = ptr[6];
    a.shared_gate = ptr[7];
    a.y = y->untyped_data();
    a.workspace = (void *)aligned;
    moe_status st = moe_forward(b->plan, &a, stream);
    if (st != MOE_OK)
        return ffi::Error::Internal(std::string("moegen_moe: moe_forward: ") + moe_status_string(st) + ": " +
                                    moe_last_error());
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

// Forget the plan bound as id (nothing for an unknown id); calls naming it
// fail from now on. The plan itself is the caller's to destroy.
__attribute__((visibility("default"))) void moegen_jax_unbind(uint64_t id) {
    std::lock_guard<std::mutex> g(table_lock);
    table.erase(id);
}

}  // extern "C"
