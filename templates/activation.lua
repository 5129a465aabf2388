@ -- activation.lua — the FFN activation's device math, its one home: the
@ -- GEMM epilogues (gemm_up_swiglu.lua on sm_80, gemm_sm90.lua) and the
@ -- cuDNN path's standalone kernel (swiglu.lua) emit it with M.device(p)
@ -- and call the function it defines (named M.name(p)) on each (gate, up)
@ -- pair in fp32. The CPU reference (tests/support/ref.c) is the other
@ -- statement of the same math.
@ --
@ -- p.spec.activation.kind picks the activation (the spec schema's row,
@ -- gen/spec_schema.c); p.alpha, p.limit (absent: no clamp) and
@ -- p.up_offset are its parameters; p.spec.activation.clamp = "after" moves
@ -- the gate's clamp to the unit's output (min(act(gate), limit),
@ -- Step-3.7-Flash), up's clamp unchanged.
@ --
@ -- A shared expert with a limit of its own (p.shared_act: shared.limit,
@ -- p.shared_limit, or shared.unclamped, no p.shared_limit) gets a second
@ -- function, the name with "_shared", which its slots (E .. slots - 1)
@ -- run: call sites call M.call(p, name, shared, args), which picks by
@ -- `shared` (true on those slots' rows), or M.call_slot with the rows'
@ -- weight slot; either is the plain call when the two are one.
@ local M = {}
@ local emit_device, geglu, emit_backward  -- defined below
@
@ -- The shared expert's parameters: p with its limit (nil: unclamped).
@ local function shared_params(p)
@   local q = {}
@   for k, v in pairs(p) do q[k] = v end
@   q.limit = p.shared_limit
@   return q
@ end
@
@ -- The call of the activation function fn (M.name's, M.backward's) on the
@ -- argument text args, where `shared` (C text, true for rows of the shared
@ -- expert's slots; M.shared_slot) picks the shared expert's variant.
@ function M.call(p, fn, shared, args)
@   if not p.shared_act then return fn .. "(" .. args .. ")" end
@   if not shared then error(fn .. ": the shared expert has its own activation, and this call site cannot tell its rows", 2) end
@   return "((" .. shared .. ") ? " .. fn .. "_shared(" .. args .. ") : " .. fn .. "(" .. args .. "))"
@ end
@
@ -- Is weight slot `slot` (C text) one of the shared expert's?
@ function M.shared_slot(p, slot)
@   return "(" .. slot .. ") >= " .. p.E
@ end
@
@ -- M.call for rows of weight slot `slot` (C text: a GEMM epilogue's tile slot).
@ function M.call_slot(p, fn, slot, args)
@   return M.call(p, fn, M.shared_slot(p, slot), args)
@ end
@
@ -- Is the gate clamped after the unit (activation.clamp = "after", with a limit)?
@ local function after(p)
@   return p.limit and p.spec and p.spec.activation and p.spec.activation.clamp == "after"
@ end
@
@ -- The clamps of the pair before the unit: up always, the gate unless it is clamped after.
@ local function clamps(p)
@   if not p.limit then return "" end
@   local up = "    up = fminf(fmaxf(up, " .. f32(-p.limit) .. "), " .. f32(p.limit) .. ");\n"
@   if after(p) then return up end
@   return "    gate = fminf(gate, " .. f32(p.limit) .. ");\n" .. up
@ end
@
@ -- The unit's value v, clamped at the limit when the clamp comes after.
@ local function out(p, v)
@   if after(p) then return "fminf(" .. v .. ", " .. f32(p.limit) .. ")" end
@   return v
@ end
@
@ -- The name of the __device__ function M.device(p) defines: the kind's.
@ function M.name(p)
@   local kind = p.spec and p.spec.activation and p.spec.activation.kind or "swiglu"
@   if kind ~= "swiglu" and kind ~= "geglu" and kind ~= "relu2" then
@     error("activation.kind = \"" .. tostring(kind) .. "\" has no device math in templates/activation.lua", 2)
@   end
@   return kind
@ end
@
@ -- Emit the activation of p's spec as a __device__ function of (gate,
@ -- up) in fp32 and return its name (M.name(p)); callers call it by that
@ -- name, so a new kind needs no change outside this file.
@ function M.device(p)
@   local name = M.name(p)
@   emit_device(p, name)
@   if p.shared_act then emit_device(shared_params(p), name .. "_shared") end
@   return name
@ end
@
@ -- The forward function of p's activation, named fn.
@ function emit_device(p, fn)
@   if M.name(p) == "geglu" then return geglu(p, fn) end
@   if M.name(p) == "relu2" then
@     if p.limit or p.up_offset ~= 0 then error("relu2 takes no limit and no up_offset (gen/spec_check.c)", 2) end

/* relu(gate)^2: NemotronH's non-gated experts, their up_proj given as the gate rows; up unused. */
static __device__ __forceinline__ float ${fn}(float gate, float up) {
    (void)up;
    const float r = fmaxf(gate, 0.0f);
    return r * r;
}
@     return
@   end
@   local gate_arg = p.alpha == 1 and "gate" or f32(p.alpha) .. " * gate"
@   local up_term = p.up_offset == 0 and "up" or "(up + " .. f32(p.up_offset) .. ")"

/* (up + up_offset) * gate * sigmoid(alpha * gate), on the clamped pair${after(p) and " (the gate's unit clamped after)" or ""}. */
static __device__ __forceinline__ float ${fn}(float gate, float up) {
${clamps(p)}    return ${up_term} * ${out(p, "gate * moe_sigmoid(" .. gate_arg .. ")")};
}
@ end
@
@ -- geglu: gelu is the tanh approximation, as PyTorch's
@ -- gelu(approximate='tanh'); limit and up_offset as for swiglu.
@ function geglu(p, fn)
@   local up_term = p.up_offset == 0 and "up" or "(up + " .. f32(p.up_offset) .. ")"

/* (up + up_offset) * gelu(gate), on the clamped pair; gelu(x) =
 * 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), computed as
 * x sigmoid(2 z) (the same function): 1 + tanh(z) cancels in fp32 for very
 * negative x (a few percent off at x = -6), the sigmoid does not. */
static __device__ __forceinline__ float ${fn}(float gate, float up) {
${clamps(p)}    const float inner = 0.7978845608028654f * (gate + 0.044715f * gate * gate * gate);
    return ${up_term} * ${out(p, "(gate * moe_sigmoid(2.0f * inner))")};
}
@ end
@
@ -- The activation's backward, for the backward GEMM's epilogue
@ -- (gemm_grad.lua): emit a __device__ function NAME_bwd(gate, up, d,
@ -- dgate, dup) of the (gate, up) pair as the forward saw it (before the
@ -- clamp) and the output's gradient d, in fp32, and return its name.
@ -- Where activation.limit clamps, the gradient passes where the value is
@ -- inside the clamp's range, bounds included (gate <= limit, -limit <= up
@ -- <= limit), as torch.clamp's backward, and is 0 where the clamp cut it.
@ function M.backward(p)
@   local fn = M.name(p) .. "_bwd"
@   emit_backward(p, fn)
@   if p.shared_act then emit_backward(shared_params(p), fn .. "_shared") end
@   return fn
@ end
@
@ -- The backward function of p's activation, named fn.
@ function emit_backward(p, fn)
@   local name = M.name(p)
@   local up_term = p.up_offset == 0 and "up" or "(up + " .. f32(p.up_offset) .. ")"
@   if name == "relu2" then

/* d relu(gate)^2 / d gate = 2 relu(gate), times d; up unused: its gradient 0. */
static __device__ __forceinline__ void ${fn}(float gate, float up, float d, float &dgate, float &dup) {
    (void)up;
    dgate = d * 2.0f * fmaxf(gate, 0.0f);
    dup = 0.0f;
}
@     return
@   end

/* d ${name}(gate, up) / d gate and / d up, times d. */
static __device__ __forceinline__ void ${fn}(float gate, float up, float d, float &dgate, float &dup) {
@   if p.limit then
@     if after(p) then
    const bool up_in = up >= ${f32(-p.limit)} && up <= ${f32(p.limit)};   /* the gate's clamp: on act, below */
@     else
    const bool gate_in = gate <= ${f32(p.limit)}, up_in = up >= ${f32(-p.limit)} && up <= ${f32(p.limit)};
@     end
@     local cl = clamps(p)
${cl}
@   end
@   if name == "geglu" then
    /* with s = sigmoid(2 z) = (1 + tanh z) / 2 (see geglu): act = gate s,
     * act' = s + 2 gate s (1 - s) z', z' = c (1 + 3 0.044715 gate^2) */
    const float c = 0.7978845608028654f, inner = c * (gate + 0.044715f * gate * gate * gate);
    const float s = moe_sigmoid(2.0f * inner);
    const float act = gate * s;
    const float dact = s + 2.0f * gate * s * (1.0f - s) * c * (1.0f + 3.0f * 0.044715f * gate * gate);
@   else
@     local ag = p.alpha == 1 and "gate" or f32(p.alpha) .. " * gate"
@     local a = p.alpha == 1 and "" or f32(p.alpha) .. " * "
    /* act(gate) = gate sigmoid(alpha gate); act' = s + alpha gate s (1 - s) */
    const float s = moe_sigmoid(${ag});
    const float act = gate * s;
    const float dact = s + ${a}gate * s * (1.0f - s);
@   end
@   if after(p) then
    /* min(act, limit): act's gradient passes where act <= limit, as torch.clamp's */
    const bool gate_in = act <= ${f32(p.limit)};
    dgate = gate_in ? d * ${up_term} * dact : 0.0f;
    dup = up_in ? d * fminf(act, ${f32(p.limit)}) : 0.0f;
@   elseif p.limit then
    dgate = gate_in ? d * ${up_term} * dact : 0.0f;
    dup = up_in ? d * act : 0.0f;
@   else
    dgate = d * ${up_term} * dact;
    dup = d * act;
@   end
}
@ end
@
@ return M
