@ -- activation.lua — the FFN activation's device math, its one home: the
@ -- GEMM epilogues (gemm_up_swiglu.lua on sm_80, gemm_sm90.lua) and the
@ -- cuDNN path's standalone kernel (swiglu.lua) emit it with M.device(p)
@ -- and call the function it defines (named M.name(p)) on each (gate, up)
@ -- pair in fp32. The CPU reference (tests/support/ref.c) is the other
@ -- statement of the same math.
@ --
@ -- p.spec.activation.kind picks the activation (the spec schema's row,
@ -- gen/spec_schema.c); p.alpha, p.limit (absent: no clamp) and
@ -- p.up_offset are its parameters.
@ local M = {}
@
@ -- The name of the __device__ function M.device(p) defines: the kind's.
@ function M.name(p)
@   local kind = p.spec and p.spec.activation and p.spec.activation.kind or "swiglu"
@   if kind ~= "swiglu" and kind ~= "geglu" then
@     error("activation.kind = \"" .. tostring(kind) .. "\" has no device math in templates/activation.lua", 2)
@   end
@   return kind
@ end
@
@ -- Emit the activation of p's spec as a __device__ function of (gate,
@ -- up) in fp32 and return its name (M.name(p)); callers call it by that
@ -- name, so a new kind needs no change outside this file.
@ function M.device(p)
@   if M.name(p) == "geglu" then return M.geglu(p) end
@   local gate_arg = p.alpha == 1 and "gate" or f32(p.alpha) .. " * gate"
@   local up_term = p.up_offset == 0 and "up" or "(up + " .. f32(p.up_offset) .. ")"

/* (up + up_offset) * gate * sigmoid(alpha * gate), on the clamped pair. */
static __device__ __forceinline__ float swiglu(float gate, float up) {
@   if p.limit then
    gate = fminf(gate, ${f32(p.limit)});
    up = fminf(fmaxf(up, ${f32(-p.limit)}), ${f32(p.limit)});
@   end
    return ${up_term} * gate * moe_sigmoid(${gate_arg});
}
@   return "swiglu"
@ end
@
@ -- geglu: gelu is the tanh approximation, as PyTorch's
@ -- gelu(approximate='tanh'); limit and up_offset as for swiglu.
@ function M.geglu(p)
@   local up_term = p.up_offset == 0 and "up" or "(up + " .. f32(p.up_offset) .. ")"

/* (up + up_offset) * gelu(gate), on the clamped pair; gelu(x) =
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
static __device__ __forceinline__ float geglu(float gate, float up) {
@   if p.limit then
    gate = fminf(gate, ${f32(p.limit)});
    up = fminf(fmaxf(up, ${f32(-p.limit)}), ${f32(p.limit)});
@   end
    const float inner = 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);
    return ${up_term} * (0.5f * gate * (1.0f + tanhf(inner)));
}
@   return "geglu"
@ end
@
@ return M
