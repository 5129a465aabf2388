#!/usr/bin/env python3
"""check_models.py — moegen's layer against the models themselves (issue 18, item 6).

usage: python3 bench/check_models.py [--backend gpu|cpu] [--families a,b,...]
                                     [--tokens 1,37,512] [--log FILE] [--list]

For each model family, build that model's MoE block from Hugging Face
transformers with a small random config of the same class (seeded, eval
mode), convert its parameters into moegen's layout, write the matching moegen
spec, run moegen's layer and compare with the block's output, twice:
  * against the block in bf16, as the model runs (several of these models
    round the router logits to bf16, so near-ties flip between them and us);
  * against an fp32 copy of the same block (the same bf16 weight values),
    which is what moegen's routing computes (fp32 logits from bf16 inputs).
Per family and token count it prints: the max abs error, the max error over
the output's RMS (on the tokens both sides routed alike), and how many tokens
chose a different expert set (moegen's route against the block's router).

Backends for the moegen side:
  gpu  build/libmoegen.so through ctypes (the generated kernels; needs CUDA);
  cpu  build/libmoegen_ref.so (`make ref-lib`): the project's C CPU
       reference (tests/support/ref.c) behind tests/support/ref_lib.c; checks
       moegen's semantics here and now, without a GPU.
Neither needs Lua on PATH or a network (build/ carries libmoegen's Lua).

A family whose spec needs a key this build does not know (the load fails
with "unknown key") is reported "skipped: needs KEY". Where only the shared
expert's key is missing, the routed part is still checked against the
block's routed experts alone (marked "routed part").

Exit status: 0 when every family that ran is within tolerance, 1 when one
is not (or failed to run), 2 for bad usage.

What each block computes, and how it maps to moegen's keys, is written beside
each family below and in docs/models.md.
"""
import argparse
import copy
import ctypes
import datetime
import os
import re
import subprocess
import sys
import tempfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from moegen import _lib  # noqa: E402  (the package's loader and checked ctypes mirrors of moe.h)

# Tolerances, as max |moegen - block| / RMS(block output), over the tokens
# whose expert set agrees. Against the fp32 copy the difference is moegen's
# own bf16 rounding (the SwiGLU intermediate, each expert's output and y are
# stored in bf16) and nothing else; against the bf16 block both sides round,
# at different points (the block rounds logits, routing weights, and sums
# the experts in bf16 one index_add at a time).
# For scale: the bf16 block itself lands up to ~8e-2 from its fp32 copy on
# these configs (the last column of the report). The RMS of the error over
# RMS(block) is the sensitive one: bf16 rounding keeps it near 3e-3, while
# a wrong rule (a missing renormalization, a wrong weight) moves it to 1e-1
# and more.
TOL_FP32 = 5e-2
TOL_BF16 = 1e-1
TOL_RMS_FP32 = 1e-2
# Tokens allowed to choose a different expert set from the fp32 copy: both
# compute fp32-or-better logits from the same bf16 values, so only exact
# near-ties may flip. A wrong rule flips a large fraction.
FLIPS_FP32 = lambda T: max(1, T // 256)


# ---- families ----------------------------------------------------------------
#
# Each family: the transformers block class and its small config, the moegen
# spec keys, and the conversion of the block's parameters. Sizes: hidden and
# ffn multiples of 64 (moegen's GEMM tiles), experts >= 8, top_k as the model.
# `shared` is the shared expert's intermediate size F_s (0 = none); moegen
# runs it as m = F_s / F always-on slots E .. E+m-1 of w1p/w2, which the
# library's moe_plan_pack_shared fills from the unsplit weights.

class Family:
    """A model family. Where its block names its parts otherwise than the
    DeepSeek/Qwen convention (block.gate(x) -> (logits, weights, indices),
    block.gate.weight, block.gate.e_score_correction_bias,
    block.shared_experts.{gate,up,down}_proj), `route`, `router` and
    `shared_of` say where they are (see the defaults below); `keep` names
    the buffers and parameters the model class keeps in fp32
    (_keep_in_fp32_modules_strict);
    `sel_bias_std` the spread of the random selection bias (near the
    scores' own spread, so that both decide the selection); `top_k` reads
    k from the config where it is not num_experts_per_tok; `in_dtype`: the
    spec's routing follows the model in its dtype (Phi-3.5-MoE's
    sparsemixer: bf16 logits and band arithmetic), so the bf16 block is held
    to the fp32 copy's gates and the fp32 copy is reported, not gated;
    `zero` the zero-computation experts the router also scores (LongCat-Flash:
    spec zero_experts; the block's indices >= E are the identity) and
    `experts` the routed experts E of a block whose experts module does not
    call them num_experts."""

    def __init__(self, name, model, make, spec, layout, shared=0, shared_gate=None, note="",
                 route=None, router=None, shared_of=None, keep=("e_score_correction_bias",), sel_bias_std=0.05,
                 top_k=None, in_dtype=False, zero=0, experts=None, ffn_bias_of=None, hash=False, inputs=None,
                 post_init=None, copy32=None, shared_keys="", latent=None, outputs=None):
        self.name, self.model, self.make, self.spec = name, model, make, spec
        self.layout, self.shared, self.shared_gate, self.note = layout, shared, shared_gate, note
        self.route = route or (hash_route(self) if hash else gate_route)
        self.router = router or gate_router
        self.shared_of = shared_of or (lambda b: mlp_parts(b.shared_experts))
        self.keep, self.sel_bias_std = keep, sel_bias_std
        self.top_k = top_k or (lambda cfg: cfg.num_experts_per_tok)
        self.in_dtype = in_dtype
        self.zero = zero
        self.experts = experts
        self.ffn_bias_of = ffn_bias_of  # (block, E, F) -> (b1 [E, 2F], b2 [E, H]) where the block's biases
                                        # are not the experts' own (JetMoE's one output bias)
        # hash: the block's experts come from the token ids (DeepSeek-V4's hash_moe layers: gate.tid2eid
        # [vocab, K]); check_family draws the table and the ids, passes input_ids to the block and
        # tid2eid[input_ids] to moegen as the caller's ids (spec router.select = "given")
        self.hash = hash
        self.ids = None
        # inputs: (block, r) -> (x, router_x) for a block whose router reads another tensor than its experts
        # (Gemma 4: the residual r, normalized and scaled, vs pre_feedforward_layernorm_2(r)); the block is
        # called with r, moegen with x and router_x (spec router.input = "separate")
        self.inputs = inputs
        # post_init: (block, generator) -> None, after init_params: magnitudes the generic fill gets wrong
        # (Gemma 4's norm weights and router scale multiply directly, and ~0.1 would leave the logits flat)
        self.post_init = post_init
        # copy32: (fp32 copy) -> None: where the bf16 model hands a rounded intermediate to a part moegen is
        # given (Gemma 4's router input), the fp32 copy reads it rounded alike
        self.copy32 = copy32
        # shared_keys: more keys of the spec's shared table (`limit = 1.2`: the shared expert's own clamp)
        self.shared_keys = shared_keys
        # latent: the experts' width where it is not the model's (a latent MoE: the spec's hidden; its router
        # reads the model's width, router.hidden); outputs: (block, h, y) -> the block's output from moegen's
        # y, computed by the fp32 copy (a latent MoE's fc2_latent_proj and its shared expert, outside moegen)
        self.latent, self.outputs = latent, outputs


def gate_route(block, x):
    """(weights [T, K], indices [T, K]) from block.gate(x) -> (logits, weights, indices)."""
    _, w, idx = block.gate(x)
    return w, idx


def hash_route(fam):
    """gate_route for a hash layer's gate, which takes the token ids too (fam.ids, drawn by check_family)."""
    def route(block, x):
        _, w, idx = block.gate(x, fam.ids[:x.shape[0]])
        return w, idx
    return route


def gate_route_bias(block, x, bias):
    """gate_route for a gate that takes the block's selection bias as an argument."""
    _, w, idx = block.gate(x, bias)
    return w, idx


def gate_router(block):
    """The router's tensors: block.gate.weight, and the selection bias where
    the gate holds one (e_score_correction_bias)."""
    r = {"wr": block.gate.weight}
    if hasattr(block.gate, "e_score_correction_bias"):
        r["sel_bias"] = block.gate.e_score_correction_bias.float()
    return r


def mlp_parts(mlp, gate_vec=None):
    """(gate [F_s, H], up [F_s, H], down [H, F_s], the shared gate's [H] row or
    None) of a SwiGLU MLP with gate_proj, up_proj, down_proj Linears."""
    return mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, gate_vec


def tf_import(module, *names):
    mod = __import__("transformers.models.%s" % module, fromlist=list(names))
    return [getattr(mod, n) for n in names]


def eager(cfg):
    """Pin the experts' eager loop (no grouped_mm/kernels-hub dispatch)."""
    cfg._experts_implementation = "eager"
    return cfg


def mk_mixtral():
    # MixtralSparseMoeBlock: logits = x·Wrᵀ in the model dtype (bf16-rounded),
    # p = softmax(logits.float()), top-k of p, renormalized (always), fp32
    # weights; experts.gate_up_proj [E, 2F, H] gate rows then up rows,
    # down_proj [E, H, F]; y += (w · expert(x)).to(bf16) one expert at a time.
    import transformers as tf
    Block, = tf_import("mixtral.modeling_mixtral", "MixtralSparseMoeBlock")
    cfg = eager(tf.MixtralConfig(hidden_size=256, intermediate_size=512, num_local_experts=8,
                                 num_experts_per_tok=2, router_jitter_noise=0.0))
    return Block(cfg), cfg


def mk_qwen3():
    # Qwen3MoeSparseMoeBlock: as Mixtral, but renormalization follows
    # norm_topk_prob (true for the released Qwen3-MoE checkpoints) and the
    # weights are cast to the model dtype (bf16) before they scale the
    # experts' outputs.
    import transformers as tf
    Block, = tf_import("qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock")
    cfg = eager(tf.Qwen3MoeConfig(hidden_size=256, moe_intermediate_size=128, num_experts=32,
                                  num_experts_per_tok=8, norm_topk_prob=True))
    return Block(cfg), cfg


def mk_olmoe():
    # OlmoeSparseMoeBlock: Qwen3's router with norm_topk_prob false (OLMoE's
    # checkpoints): the top-k softmax probabilities are used as they are.
    import transformers as tf
    Block, = tf_import("olmoe.modeling_olmoe", "OlmoeSparseMoeBlock")
    cfg = eager(tf.OlmoeConfig(hidden_size=256, intermediate_size=128, num_experts=16,
                               num_experts_per_tok=8, norm_topk_prob=False))
    return Block(cfg), cfg


def mk_gpt_oss():
    # GptOssMLP: logits = x·Wrᵀ + b_r (bf16), top-k of the logits, softmax
    # over the k selected logits (in bf16) = softmax-then-renormalize;
    # experts.gate_up_proj [E, H, 2F] transposed AND interleaved (gate =
    # columns 0,2,4..., up = 1,3,5...), gate_up_proj_bias [E, 2F] likewise;
    # gate = min(gate, 7), up = clamp(up, -7, 7), out = (up + 1)·gate·σ(1.702·gate);
    # down_proj [E, F, H] transposed, down_proj_bias [E, H].
    import transformers as tf
    Block, = tf_import("gpt_oss.modeling_gpt_oss", "GptOssMLP")
    cfg = eager(tf.GptOssConfig(hidden_size=256, intermediate_size=256, num_local_experts=16,
                                num_experts_per_tok=4))
    return Block(cfg), cfg


def mk_deepseek_v3(kimi=False):
    # DeepseekV3MoE: logits = x·Wrᵀ in fp32 (x and Wr cast to fp32), s =
    # sigmoid(logits), selection score s + e_score_correction_bias; groups:
    # a group scores the sum of its top 2 selection scores (fixed 2), keep
    # topk_group groups, top-k among their experts; weight = s (no bias),
    # / (sum + 1e-20) when norm_topk_prob, × routed_scaling_factor;
    # + shared_experts(x), an ungated SwiGLU MLP of intermediate
    # moe_intermediate_size · n_shared_experts, added in bf16.
    # Kimi K2 is this class with n_group = topk_group = 1.
    import transformers as tf
    Block, = tf_import("deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE")
    if kimi:
        cfg = tf.DeepseekV3Config(hidden_size=256, moe_intermediate_size=128, n_routed_experts=32,
                                  num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
                                  routed_scaling_factor=2.827, norm_topk_prob=True)
    else:
        cfg = tf.DeepseekV3Config(hidden_size=256, moe_intermediate_size=128, n_routed_experts=32,
                                  num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
                                  routed_scaling_factor=2.5, norm_topk_prob=True)
    return Block(eager(cfg)), cfg


def mk_glm4():
    # Glm4MoeMoE: DeepSeek-V3's router and shared expert, line for line
    # (GLM-4.5 and GLM-4.5-Air ship n_group = topk_group = 1, so the group
    # rule is off); routed_scaling_factor as the checkpoint sets it.
    import transformers as tf
    Block, = tf_import("glm4_moe.modeling_glm4_moe", "Glm4MoeMoE")
    cfg = eager(tf.Glm4MoeConfig(hidden_size=256, moe_intermediate_size=128, n_routed_experts=32,
                                 num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1,
                                 routed_scaling_factor=1.0, norm_topk_prob=True))
    return Block(cfg), cfg


def mk_deepseek_v2():
    # DeepseekV2Moe: logits in fp32, p = softmax(logits); topk_method
    # "group_limited_greedy": a group scores its MAXIMUM p, keep topk_group
    # groups (the others' p set to 0), top-k of p; weight = p × scaling, NO
    # renormalization (HF ignores norm_topk_prob here; DeepSeek-V2's
    # checkpoints set it false); + shared_experts(x), intermediate
    # moe_intermediate_size · n_shared_experts, ungated.
    import transformers as tf
    Block, = tf_import("deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe")
    cfg = eager(tf.DeepseekV2Config(hidden_size=256, moe_intermediate_size=128, n_routed_experts=32,
                                    num_experts_per_tok=6, n_group=8, topk_group=3, n_shared_experts=2,
                                    topk_method="group_limited_greedy", routed_scaling_factor=16.0,
                                    norm_topk_prob=False))
    return Block(cfg), cfg


def mk_qwen2():
    # Qwen2MoeSparseMoeBlock: Qwen3's router (norm_topk_prob false in the
    # Qwen1.5/Qwen2 MoE checkpoints); + sigmoid(x·w_g)·shared_expert(x), w_g
    # a [1, H] Linear (bf16 logit), shared intermediate
    # shared_expert_intermediate_size (8 × moe_intermediate_size in
    # Qwen2-57B-A14B; 4 × here).
    import transformers as tf
    Block, = tf_import("qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock")
    cfg = eager(tf.Qwen2MoeConfig(hidden_size=256, moe_intermediate_size=128, num_experts=16,
                                  num_experts_per_tok=4, shared_expert_intermediate_size=512,
                                  norm_topk_prob=False))
    return Block(cfg), cfg


def mk_llama4():
    # Llama4TextMoe: logits = x·Wrᵀ (bf16), top-1 of the logits, weight =
    # sigmoid(logit) (computed in fp32, rounded to bf16), applied to the
    # expert's INPUT: expert(x·w) (rounded to bf16), not w·expert(x);
    # experts.gate_up_proj [E, H, 2F] transposed, gate columns then up
    # (not interleaved), down_proj [E, F, H]; + shared_expert(x), ungated,
    # intermediate = intermediate_size (m = 1).
    import transformers as tf
    Block, = tf_import("llama4.modeling_llama4", "Llama4TextMoe")
    cfg = tf.Llama4TextConfig(hidden_size=256, intermediate_size=256, num_local_experts=16,
                              num_experts_per_tok=1)
    return Block(cfg), cfg


def mk_qwen3_next(cls_module="qwen3_next.modeling_qwen3_next", block="Qwen3NextSparseMoeBlock",
                  config="Qwen3NextConfig"):
    # Qwen3NextSparseMoeBlock: Qwen3's router (bf16 logits, fp32 softmax,
    # top-k, renormalized iff norm_topk_prob, true in Qwen3-Next-80B-A3B;
    # weights cast to bf16) + sigmoid(x·w_g)·shared_expert(x) as Qwen2-MoE,
    # shared intermediate shared_expert_intermediate_size (= F in the
    # released checkpoint: m = 1).
    # Qwen3_5MoeSparseMoeBlock (Qwen3.5-MoE) is this block line for line,
    # except that it renormalizes always (it has no norm_topk_prob).
    import transformers as tf
    Block, = tf_import(cls_module, block)
    kw = dict(hidden_size=256, moe_intermediate_size=128, num_experts=32, num_experts_per_tok=8,
              shared_expert_intermediate_size=128)
    if config in ("Qwen3NextConfig", "Qwen4ExpTextConfig"):
        kw["norm_topk_prob"] = True
    cfg = eager(getattr(tf, config)(**kw))
    return Block(cfg), cfg


def mk_qwen3_vl():
    # Qwen3VLMoeTextSparseMoeBlock (Qwen3-VL-30B-A3B / 235B-A22B, the text
    # model): Qwen3-MoE's block with the renormalization always on; no
    # shared expert.
    import transformers as tf
    Block, = tf_import("qwen3_vl_moe.modeling_qwen3_vl_moe", "Qwen3VLMoeTextSparseMoeBlock")
    cfg = eager(tf.Qwen3VLMoeTextConfig(hidden_size=256, moe_intermediate_size=128, num_experts=32,
                                        num_experts_per_tok=8))
    return Block(cfg), cfg


def mk_minimax_m2():
    # MiniMaxM2SparseMoeBlock: logits = x·Wrᵀ (bf16), s = sigmoid(logits.float()),
    # selection on s + e_score_correction_bias (a buffer of the block, not of
    # the gate; the class keeps nothing in fp32, so in a bf16 model it is
    # bf16), top-k, no groups; weight = s / Σ_k s (always), fp32; no
    # scaling, no shared expert; experts as Mixtral.
    import transformers as tf
    Block, = tf_import("minimax_m2.modeling_minimax_m2", "MiniMaxM2SparseMoeBlock")
    cfg = eager(tf.MiniMaxM2Config(hidden_size=256, intermediate_size=128, num_local_experts=32,
                                   num_experts_per_tok=8, router_jitter_noise=0.0))
    return Block(cfg), cfg


def mk_ernie45():
    # Ernie4_5_MoeSparseMoeBlock: logits in fp32 (x and the router weight,
    # which the class keeps in fp32), p = softmax(logits); selection on p +
    # e_score_correction_bias (moe_statics, fp32 [1, E]), top-k; weight = p
    # (no bias) / max(Σ_k p, moe_norm_min = 1e-12), cast to bf16; no scaling;
    # + shared_experts(x), ungated, intermediate moe_intermediate_size ·
    # moe_num_shared_experts (ERNIE-4.5-21B-A3B: 64 experts, k = 6, 2 shared).
    import transformers as tf
    Block, = tf_import("ernie4_5_moe.modeling_ernie4_5_moe", "Ernie4_5_MoeSparseMoeBlock")
    cfg = eager(tf.Ernie4_5_MoeConfig(hidden_size=256, moe_intermediate_size=128, moe_num_experts=64, moe_k=6,
                                      moe_num_shared_experts=2, use_bias=False))
    return Block(cfg), cfg


def mk_hunyuan():
    # HunYuanMoEV1Moe (Hunyuan-A13B): logits = x·Wgᵀ with the gate's wg built
    # in fp32 (x cast to fp32 when wg is fp32; bf16 logits in a model cast
    # whole to bf16, as here), p = softmax(logits) in fp32, top-k,
    # renormalized always, cast to the logits' dtype; + shared_mlp(x),
    # ungated, of intermediate intermediate_size = the experts' F (m = 1).
    import transformers as tf
    Block, = tf_import("hunyuan_v1_moe.modeling_hunyuan_v1_moe", "HunYuanMoEV1Moe")
    cfg = eager(tf.HunYuanMoEV1Config(hidden_size=256, intermediate_size=128, num_experts=32, moe_topk=8))
    return Block(cfg, layer_idx=0), cfg


def mk_deepseek_like(module, block, config, **kw):
    # DeepSeek-V3's router and shared expert, line for line (Dots1MoE,
    # DeepseekV32MoE, Glm4MoeLiteMoE, ExaoneMoeSparseMoEBlock): fp32 logits,
    # sigmoid, selection on s + e_score_correction_bias (kept fp32), groups
    # scoring their top 2, s / (Σ + 1e-20) iff norm_topk_prob, ×
    # routed_scaling_factor; + shared_experts(x), ungated.
    import transformers as tf
    Block, = tf_import(module, block)
    cfg = eager(getattr(tf, config)(hidden_size=256, moe_intermediate_size=128, **kw))
    return Block(cfg), cfg


def mk_gemma4():
    # Gemma 4's MoE branch (Gemma4TextDecoderLayer with enable_moe_block):
    # Gemma4TextRouter reads the residual r: logits = proj(rmsnorm(r) ⊙ scale
    # · H^-½) (rmsnorm without a weight, in fp32, cast back; the products in
    # the model dtype), p = softmax (fp32), top-k, renormalized, × the
    # model-dtype per_expert_scale[e]; Gemma4TextExperts runs on
    # pre_feedforward_layernorm_2(r), GeGLU with the tanh gelu
    # (gelu_pytorch_tanh), y += (w · expert(x)).to(bf16) one expert at a time.
    # The wrapper is the decoder layer's three lines (its dense MLP and the
    # post-feedforward norms stay outside the branch); inputs() gives moegen
    # the experts' x and the router's input as the block computes them.
    import torch
    import transformers as tf
    Router, Experts, Norm = tf_import("gemma4.modeling_gemma4", "Gemma4TextRouter", "Gemma4TextExperts",
                                      "Gemma4RMSNorm")
    cfg = eager(tf.Gemma4TextConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                                    num_experts=32, top_k_experts=4, enable_moe_block=True, num_hidden_layers=1))

    class Gemma4Moe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router, self.experts = Router(cfg), Experts(cfg)
            self.pre_feedforward_layernorm_2 = Norm(cfg.hidden_size, eps=cfg.rms_norm_eps)

        def forward(self, r):
            shape = r.shape
            r = r.reshape(-1, shape[-1])
            _, w, idx = self.router(r)
            return self.experts(self.pre_feedforward_layernorm_2(r), idx, w).reshape(shape)

    return Gemma4Moe(), cfg


def gemma4_init(block, g):
    """Gemma 4's multiplicative parameters near their working sizes: the
    norm weight and the router's scale multiply directly (1 + noise, and
    sqrt(H) for the scale, which the router divides back out, so its input
    has unit-size entries and the logits the spread init_params aims at),
    per_expert_scale positive around 1."""
    import torch
    H = block.router.scale.shape[0]
    with torch.no_grad():
        ln = block.pre_feedforward_layernorm_2.weight
        ln.copy_(1 + 0.1 * torch.randn(ln.shape, generator=g))
        sc = block.router.scale
        sc.copy_(H ** 0.5 * (1 + 0.25 * torch.randn(sc.shape, generator=g)))
        pe = block.router.per_expert_scale
        pe.copy_(0.5 + torch.rand(pe.shape, generator=g))


def gemma4_copy32(b32):
    """The fp32 copy's router input made as the bf16 branch makes it: the
    norm's output cast to bf16, times the bf16 scale and H^-½ in bf16 (each
    product rounded), then read by the fp32 proj. That tensor is the
    router_x moegen is given; computed in fp32 instead, a quarter of its
    entries land a bf16 step away and the fp32 copy flips near-ties that
    neither the model nor moegen has."""
    import torch
    r = b32.router
    r.norm.register_forward_hook(lambda m, a, out: out.to(torch.bfloat16))
    r.scale = torch.nn.Parameter(r.scale.detach().to(torch.bfloat16), requires_grad=False)
    r.proj.register_forward_pre_hook(lambda m, a: (a[0].float(),))


def gemma4_inputs(block, r):
    """(x, router_x): the experts' input and the router's, as the branch computes them from r."""
    rt = block.router
    return block.pre_feedforward_layernorm_2(r), rt.norm(r) * rt.scale * rt.scalar_root_size


def mk_deepseek_v4(layer=3):
    # DeepseekV4SparseMoeBlock, a "moe" layer (not the first hash_moe ones,
    # whose experts come from the token id): logits = x·Wrᵀ (bf16), s =
    # sqrt(softplus(logits)) (scoring_func "sqrtsoftplus", in bf16), selection
    # on s + e_score_correction_bias, top-k; weight s / (Σ_k s + 1e-20) ×
    # routed_scaling_factor; experts and the shared expert (DeepseekV4MLP,
    # intermediate moe_intermediate_size, ungated) clamp gate <= L, up in
    # [-L, L] before silu(gate) · up (L = swiglu_limit, 10; 1.5 here so that
    # it bites).
    import transformers as tf
    Block, = tf_import("deepseek_v4.modeling_deepseek_v4", "DeepseekV4SparseMoeBlock")
    cfg = eager(tf.DeepseekV4Config(hidden_size=256, moe_intermediate_size=128, n_routed_experts=32,
                                    num_experts_per_tok=6, num_hidden_layers=4, routed_scaling_factor=1.5,
                                    swiglu_limit=1.5))
    assert cfg.mlp_layer_types[layer] == ("moe" if layer == 3 else "hash_moe"), cfg.mlp_layer_types
    return Block(cfg, layer_idx=layer), cfg


def mk_phimoe():
    # PhimoeSparseMoeBlock (Phi-3.5-MoE) in eval: logits = router(x) (bf16),
    # sparsemixer with eps = router_jitter_noise (0.01): e1 = argmax l, its
    # weight the softmax at l1 over the logits l_j with (l1 - l_j) /
    # max(|l_j|, l1) <= 2 eps; e2 = argmax of l without e1, its weight the
    # same band's softmax at l2 without e1; no renormalization, weights in
    # bf16; experts as Mixtral (gate_up_proj [E, 2F, H]); no shared expert.
    import transformers as tf
    Block, = tf_import("phimoe.modeling_phimoe", "PhimoeSparseMoeBlock")
    cfg = eager(tf.PhimoeConfig(hidden_size=256, intermediate_size=128, num_local_experts=16,
                                num_experts_per_tok=2, router_jitter_noise=0.01, input_jitter_noise=0.0))
    return Block(cfg), cfg


def mk_longcat():
    # LongcatFlashMoE (LongCat-Flash): the router scores E + Z experts
    # (Z = zero_expert_num), logits = F.linear(x.float(), W.float()) in
    # fp32, p = softmax over all E + Z, selection on p +
    # e_score_correction_bias (a buffer, bf16 in a bf16 model), top-k,
    # weight = p · routed_scaling_factor, not renormalized, kept fp32; an
    # index >= E is nn.Identity: x · w (bf16 x times the fp32 weight, in
    # fp32) rounded to bf16 and index_add'ed into the bf16 output, as each
    # real expert's output is. experts.gate_up_proj is [E + Z, 2F, H] (the
    # zero experts' rows unused), down_proj [E, H, F]; no shared expert
    # (the layer's dense MLPs sit beside the block, outside it).
    Block, = tf_import("longcat_flash.modeling_longcat_flash", "LongcatFlashMoE")
    Cfg, = tf_import("longcat_flash.configuration_longcat_flash", "LongcatFlashConfig")
    cfg = eager(Cfg(hidden_size=256, expert_ffn_hidden_size=128, n_routed_experts=32, zero_expert_num=16,
                    moe_topk=6, routed_scaling_factor=6.0))
    return Block(cfg), cfg


def mk_granite():
    # GraniteMoeMoE (Granite-3.x MoE): logits = x·Wrᵀ (bf16) then .float(),
    # top-k of the logits, weight = softmax over the k selected logits in
    # fp32 (= softmax then renormalize), cast to bf16; no shared expert;
    # experts as Mixtral. (The decoder layer's residual_multiplier is
    # outside the block.)
    import transformers as tf
    Block, = tf_import("granitemoe.modeling_granitemoe", "GraniteMoeMoE")
    cfg = eager(tf.GraniteMoeConfig(hidden_size=256, intermediate_size=128, num_local_experts=32,
                                    num_experts_per_tok=8))
    return Block(cfg), cfg


def mk_granite_shared(module="granitemoeshared.modeling_granitemoeshared", moe="GraniteMoeSharedMoE",
                      mlp="GraniteMoeSharedMLP", config="GraniteMoeSharedConfig"):
    # GraniteMoeSharedMoE is GraniteMoeMoE; its shared expert is not in the
    # block but in the decoder layer: out = block_sparse_moe(h) +
    # shared_mlp(h), shared_mlp a SwiGLU MLP, ungated, whose input_linear
    # [2F_s, H] holds the gate rows then the up rows (chunk(2)) and
    # output_linear [H, F_s]; F_s = shared_intermediate_size. The two are
    # put together here as the layer does. Granite 4.0
    # (GraniteMoeHybridMoE, GraniteMoeHybridMLP) is the same pair.
    import torch
    import transformers as tf
    Moe, Mlp = tf_import(module, moe, mlp)
    cfg = eager(getattr(tf, config)(hidden_size=256, intermediate_size=128, num_local_experts=32,
                                    num_experts_per_tok=8, shared_intermediate_size=256))

    class MoeAndShared(torch.nn.Module):  # GraniteMoeSharedDecoderLayer's two lines
        def __init__(self):
            super().__init__()
            self.block_sparse_moe, self.shared_mlp = Moe(cfg), Mlp(cfg)
            self.router, self.experts = self.block_sparse_moe.router, self.block_sparse_moe.experts

        def forward(self, h):
            return self.block_sparse_moe(h) + self.shared_mlp(h)

    return MoeAndShared(), cfg


def granite_route(block, x):
    idx, w, _ = block.router(x)
    return w, idx


def granite_shared(block):
    w = block.shared_mlp.input_linear.weight
    fs = w.shape[0] // 2
    return w[:fs], w[fs:], block.shared_mlp.output_linear.weight, None


def mk_jetmoe():
    # JetMoeMoE (JetMoE-8B): logits = router.layer(x) (a bf16 Linear) then
    # .float(), top-k of the logits, weight = softmax over the k (fp32, =
    # softmax then renormalize), cast to bf16 (Granite's rule); experts
    # input_linear [E, 2F, H] (chunk(2): the activated half, then the linear
    # one) and output_linear [E, H, F], SwiGLU (activation_function "silu");
    # the weighted outputs index_add'ed in bf16, then ONE bias [H] added to
    # the sum. moegen says it with ffn_bias: b1 = 0 and every expert's b2 =
    # that bias, since Σ_k w_k (o_k + b) = Σ_k w_k o_k + b when the weights
    # sum to 1 (up to each expert's output being rounded with b in it).
    # The wrapper names the parts as the checks expect (router, experts).
    import torch
    import transformers as tf
    Block, = tf_import("jetmoe.modeling_jetmoe", "JetMoeMoE")
    cfg = tf.JetMoeConfig(hidden_size=256, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2)

    class Experts:  # the stored tensors under the names convert() reads
        def __init__(self, b):
            self.gate_up_proj, self.down_proj = b.input_linear.weight, b.output_linear.weight
            self.num_experts = b.input_linear.num_experts

    class JetMoe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block(cfg)
            self.router, self.experts = self.block.router, Experts(self.block)

        def forward(self, h):
            return self.block(h)

    return JetMoe(), cfg


def jetmoe_route(block, x):
    """JetMoeTopKGating's choice, as its forward computes it (that returns
    it sorted by expert): top-k of the fp32 logits, softmax over the k."""
    import torch
    top, idx = block.router.layer(x).float().topk(block.router.top_k, dim=1)
    return torch.softmax(top, dim=1).to(x.dtype), idx


def jetmoe_bias(block, E, F):
    """JetMoE's one output bias as moegen's ffn biases: b1 = 0, each expert's b2 = the bias."""
    import torch
    b = block.block.bias.detach()
    return torch.zeros(E, 2 * F, dtype=b.dtype), b.reshape(1, -1).repeat(E, 1)


def mk_jamba():
    # JambaSparseMoeBlock: logits = router(x) (bf16 Linear), p = softmax in
    # fp32, top-k (Jamba: 16 experts, k = 2), NOT renormalized, cast to bf16;
    # no shared expert; experts as Mixtral.
    import transformers as tf
    Block, = tf_import("jamba.modeling_jamba", "JambaSparseMoeBlock")
    cfg = eager(tf.JambaConfig(hidden_size=256, intermediate_size=128, num_experts=16, num_experts_per_tok=2))
    return Block(cfg), cfg


def afmoe_route(block, x):
    _, w, idx = block.router(x.unsqueeze(0), block.expert_bias)
    return w, idx


def jamba_route(block, x):
    idx, w = block.route_tokens_to_experts(x, block.router(x))
    return w, idx


def mk_mistral4():
    # Mistral4MoE: logits = x·Wrᵀ (bf16), p = softmax(logits) IN BF16 (no
    # dtype argument); groups: a group scores the sum of its top 2 p, keep
    # topk_group groups (the others' p set to 0), top-k; weight = p /
    # (Σ + 1e-20) iff norm_topk_prob, × routed_scaling_factor, in bf16; +
    # shared_experts(x), ungated. The config's defaults have one group
    # (n_group = topk_group = 1); 4 groups keeping 2 here, to check the
    # group rule on a softmax score.
    import transformers as tf
    Block, = tf_import("mistral4.modeling_mistral4", "Mistral4MoE")
    cfg = eager(tf.Mistral4Config(hidden_size=256, moe_intermediate_size=128, n_routed_experts=32,
                                  num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                                  routed_scaling_factor=1.0, norm_topk_prob=True))
    return Block(cfg), cfg


def mk_lfm2():
    # Lfm2MoeSparseMoeBlock (LFM2-8B-A1B): logits = x·Wrᵀ (bf16), s =
    # sigmoid(logits) IN BF16; selection on s + expert_bias (a buffer of the
    # block, created fp32), top-k; weight = s / (Σ_k s + 1e-6) iff
    # norm_topk_prob, × routed_scaling_factor, in bf16; no shared expert.
    import transformers as tf
    Block, = tf_import("lfm2_moe.modeling_lfm2_moe", "Lfm2MoeSparseMoeBlock")
    cfg = eager(tf.Lfm2MoeConfig(hidden_size=256, moe_intermediate_size=128, num_experts=32, num_experts_per_tok=4,
                                 use_expert_bias=True, routed_scaling_factor=1.0, norm_topk_prob=True))
    return Block(cfg), cfg


def mk_minimax():
    # MiniMaxSparseMoeBlock (MiniMax-Text-01, MiniMax-M1): Mixtral's router:
    # bf16 logits, p = softmax(logits.float()), top-k, renormalized always,
    # fp32 weights; no shared expert; experts as Mixtral.
    import transformers as tf
    Block, = tf_import("minimax.modeling_minimax", "MiniMaxSparseMoeBlock")
    cfg = eager(tf.MiniMaxConfig(hidden_size=256, intermediate_size=128, num_local_experts=32, num_experts_per_tok=2,
                                 router_jitter_noise=0.0))
    return Block(cfg), cfg


def mk_afmoe():
    # AfmoeSparseMoeBlock (Arcee Trinity): logits = x·Wrᵀ (bf16) then
    # .float(), s = sigmoid; selection on s + expert_bias (a parameter of the
    # block, kept fp32 by the class), top-k; weight = s / (Σ_k s + 1e-20)
    # (always), × route_scale, fp32; + shared_experts(x), ungated,
    # intermediate moe_intermediate_size · num_shared_experts. The router
    # wants x as [B, S, H].
    import transformers as tf
    Block, = tf_import("afmoe.modeling_afmoe", "AfmoeSparseMoeBlock")
    cfg = eager(tf.AfmoeConfig(hidden_size=256, moe_intermediate_size=128, num_experts=32, num_experts_per_tok=6,
                               num_shared_experts=1, route_scale=2.0))
    return Block(cfg), cfg


def mk_flex_olmo():
    # FlexOlmoSparseMoeBlock (FlexOlmo-7x7B): OLMoE's router (bf16 logits,
    # fp32 softmax, top-k, renormalized iff norm_topk_prob, false by
    # default; weights cast to bf16); no shared expert.
    import transformers as tf
    Block, = tf_import("flex_olmo.modeling_flex_olmo", "FlexOlmoSparseMoeBlock")
    cfg = eager(tf.FlexOlmoConfig(hidden_size=256, intermediate_size=128, num_experts=8, num_experts_per_tok=5,
                                  norm_topk_prob=False))
    return Block(cfg), cfg


def mk_cohere2():
    # Cohere2MoeSparseMoeBlock: logits = x·Wrᵀ (bf16), top-k of the logits;
    # expert_selection_fn "softmax" (the default): weight = softmax over
    # the k selected logits in fp32 (= softmax then renormalize), cast to
    # bf16; + shared_experts(x), ungated, intermediate intermediate_size ·
    # num_shared_experts, combined by shared_expert_combination_strategy:
    # "average" (the default) y = (routed + shared) / 2, "sum" y = routed +
    # shared. "average" is router.scale = 0.5 and the shared down_proj
    # times 0.5 (a power of two: exact in bf16) — a conversion, not a key.
    import transformers as tf
    Block, = tf_import("cohere2_moe.modeling_cohere2_moe", "Cohere2MoeSparseMoeBlock")
    cfg = eager(tf.Cohere2MoeConfig(hidden_size=256, intermediate_size=128, num_experts=16, num_experts_per_tok=4,
                                    num_shared_experts=1, shared_expert_combination_strategy="average",
                                    expert_selection_fn="softmax"))
    return Block(cfg), cfg


def cohere2_shared(block):
    g, u, d, _ = mlp_parts(block.shared_experts)
    return g, u, d * 0.5, None  # "average": (routed + shared) / 2, the shared half folded into its down_proj


def mk_step3p7(limit=None, shared_limit=None):
    # Step3p7SparseMoeBlock (Step-3.7-Flash): logits = x·Wrᵀ (bf16), s =
    # sigmoid(logits.float()); selection on s + e_score_correction_bias,
    # top-k; weight = s / Σ_k s (always), fp32; the routed SUM is then
    # multiplied by moe_router_scaling_factor (in bf16, after the experts
    # were added: moegen scales the weights, the same up to rounding); +
    # shared_experts(x), ungated, intermediate share_expert_dim. Layers
    # listed in swiglu_limits / swiglu_limits_shared clamp silu(gate) (after
    # the activation) and up: activation.clamp = "after"; with limit the
    # layer built here is such a layer, its shared limit `shared_limit` (the
    # checkpoint's are 7 and 16: spec shared.limit) or the routed one;
    # without, it has no clamp.
    Block, = tf_import("step3p7.modeling_step3p7", "Step3p7SparseMoeBlock")
    Cfg, = tf_import("step3p7.configuration_step3p7", "Step3p7TextConfig")
    cfg = eager(Cfg(hidden_size=256, moe_intermediate_size=128, num_local_experts=32, num_experts_per_tok=8,
                    share_expert_dim=128, moe_router_scaling_factor=2.0,
                    swiglu_limits=None if limit is None else [limit],
                    swiglu_limits_shared=None if limit is None else [shared_limit or limit]))
    return Block(cfg, 0), cfg


def mk_nemotron_h(latent=None):
    # NemotronHMoE (the MoE layers of NemotronH: Nemotron 3 Nano): DeepSeek-V3's
    # router line for line (fp32 logits, sigmoid, selection on s +
    # e_score_correction_bias, groups, s / (Σ + 1e-20) iff norm_topk_prob, ×
    # routed_scaling_factor); NON-GATED experts down(relu(up(x))²)
    # (mlp_hidden_act "relu2", up_proj [E, F, H]), the routed sum in fp32
    # (the weights' dtype), then + shared_experts(x) (NemotronHMLP: up_proj,
    # down_proj, relu2) in bf16. No latent projection (moe_latent_size None,
    # as Nemotron 3 Nano). moegen: activation.kind = "relu2" with up_proj as
    # the gate rows (and again as the unused up rows).
    Block, = tf_import("nemotron_h.modeling_nemotron_h", "NemotronHMoE")
    Cfg, = tf_import("nemotron_h.configuration_nemotron_h", "NemotronHConfig")
    cfg = eager(Cfg(hidden_size=256, moe_intermediate_size=128, moe_shared_expert_intermediate_size=256,
                    n_routed_experts=32, num_experts_per_tok=6, routed_scaling_factor=2.5, n_group=1, topk_group=1,
                    norm_topk_prob=True, mlp_hidden_act="relu2", moe_latent_size=latent))
    return Block(cfg, 0), cfg


# NemotronHMoE with moe_latent_size (Nemotron 3 Super / Ultra's LatentMoE): the router reads h at the model's
# width, the experts fc1_latent_proj(h), the routed sum goes through fc2_latent_proj, then + shared_experts(h)
# at the model's width. moegen runs the part between the projections: the layer at hidden = the latent width,
# router.input = "separate" with router.hidden = the model's, x = fc1_latent_proj(h) as the bf16 block makes it,
# router_x = h; the shared expert stays outside with the projections (latent_outputs).
NEMOTRON_LATENT = 128


def latent_inputs(block, h):
    """(x, router_x): the experts' latent input and the router's, from h as the block makes them."""
    return block.fc1_latent_proj(h), h


def latent_outputs(block, h, y):
    """The block's output from moegen's routed sum y [T, latent]: fc2_latent_proj(y) + shared_experts(h)."""
    return block.fc2_latent_proj(y.to(h.dtype)) + block.shared_experts(h)


def nongated_shared(block):
    m = block.shared_experts   # relu2's gate rows are its up_proj; the up rows unused (given the same)
    return m.up_proj.weight, m.up_proj.weight, m.down_proj.weight, None


def mk_qwen3_omni_talker():
    # Qwen3OmniMoeTalkerTextSparseMoeBlock (Qwen3-Omni's talker): Qwen2-MoE's
    # block: norm_topk_prob false by default, sigmoid-gated shared expert of
    # intermediate shared_expert_intermediate_size. (The thinker's block is
    # Qwen3-MoE's with norm_topk_prob true.)
    Block, = tf_import("qwen3_omni_moe.modeling_qwen3_omni_moe", "Qwen3OmniMoeTalkerTextSparseMoeBlock")
    Cfg, = tf_import("qwen3_omni_moe.configuration_qwen3_omni_moe", "Qwen3OmniMoeTalkerTextConfig")
    cfg = eager(Cfg(hidden_size=256, moe_intermediate_size=128, num_experts=32, num_experts_per_tok=8,
                    shared_expert_intermediate_size=256, norm_topk_prob=False))
    return Block(cfg), cfg


def mk_dbrx():
    # DbrxFFN (DBRX): logits = router.layer(x) (bf16), p = softmax(logits)
    # IN BF16 (dtype = the logits' dtype), top-k (DBRX: 16 experts, k = 4);
    # weight = p / ‖p_topk‖_q with q = moe_normalize_expert_weights (1 in
    # DBRX: the sum, i.e. renormalize; None: no normalization), bf16; no
    # shared expert. Experts stored flat and separate: mlp.w1 (gate) and
    # mlp.v1 (up) [E·F, H], mlp.w2 [E·F, H] = each expert's down_proj
    # transposed (out = (silu(x·w1ᵀ) · x·v1ᵀ)·w2).
    import transformers as tf
    Block, = tf_import("dbrx.modeling_dbrx", "DbrxFFN")
    cfg = tf.DbrxConfig(d_model=256, ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 16, "moe_top_k": 4,
                                                 "moe_normalize_expert_weights": 1.0})
    return Block(cfg), cfg


def dbrx_route(block, x):
    return block.route_tokens_to_experts(block.router(x))


def mk_hy_v3():
    # HYV3MoE: logits in fp32 (x and Wr cast), s = sigmoid; selection on
    # s + e_score_correction_bias (a buffer of the block, passed to the gate;
    # kept fp32), top-k, no groups; weight = s / (Σ_k s + 1e-20) (always) ×
    # router_scaling_factor, fp32; + shared_experts(x), ungated, intermediate
    # moe_intermediate_size · num_shared_experts; with
    # enable_moe_fp32_combine (the default) routed + shared are added in
    # fp32 and rounded once.
    Block, = tf_import("hy_v3.modeling_hy_v3", "HYV3MoE")
    Cfg, = tf_import("hy_v3.configuration_hy_v3", "HYV3Config")
    cfg = eager(Cfg(hidden_size=256, moe_intermediate_size=128, num_local_experts=32, num_experts_per_tok=8,
                    num_shared_experts=1, router_scaling_factor=2.826))
    return Block(cfg), cfg


def mk_minimax_m3():
    # MiniMaxM3VLSparseMoeBlock (MiniMax-M3-VL's text model): MiniMax-M2's
    # router (bf16 logits, s = sigmoid(logits.float()), selection on s +
    # the gate's e_score_correction_bias, s / Σ_k s, fp32; the class keeps
    # nothing in fp32); the routed SUM × routed_scaling_factor (as
    # Step-3.7); + shared_experts(x), ungated, intermediate
    # shared_intermediate_size, its gate_up_proj a [2F_s, H] Linear (gate
    # rows then up rows). Experts and shared expert alike: gpt-oss's unit
    # without the interleaving, gate = min(gate, L), up = clamp(up, ±L),
    # (up + 1)·gate·σ(1.702·gate); L = swiglu_limit (7; 1.5 here, so that
    # the clamp bites on these inputs).
    Block, = tf_import("minimax_m3_vl.modeling_minimax_m3_vl", "MiniMaxM3VLSparseMoeBlock")
    Cfg, = tf_import("minimax_m3_vl.configuration_minimax_m3_vl", "MiniMaxM3VLTextConfig")
    cfg = eager(Cfg(hidden_size=256, intermediate_size=128, num_local_experts=32, num_experts_per_tok=4,
                    shared_intermediate_size=128, routed_scaling_factor=2.0, swiglu_alpha=1.702, swiglu_limit=1.5))
    return Block(cfg), cfg


def fused_shared(mlp):
    """mlp_parts of a shared MLP whose gate_up_proj Linear is [2F_s, H], gate rows then up rows."""
    w = mlp.gate_up_proj.weight
    fs = w.shape[0] // 2
    return w[:fs], w[fs:], mlp.down_proj.weight, None


def mk_qwen3_like(module, block, config):
    # A block that is Qwen3-MoE's line for line under another name.
    import transformers as tf
    Block, = tf_import(module, block)
    cfg = eager(getattr(tf, config)(hidden_size=256, moe_intermediate_size=128, num_experts=32, num_experts_per_tok=8,
                                    norm_topk_prob=True))
    return Block(cfg), cfg


def mk_privacy_filter():
    # OpenAIPrivacyFilterMLP (OpenAI's privacy filter, an encoder): logits =
    # x·Wrᵀ + b_r in fp32 (x, Wr, b_r cast), top-k of the logits, weight =
    # softmax over the k (fp32) / top_k, and the block's output × top_k
    # again (net: softmax then renormalize); experts computed in fp32 from
    # the bf16 weights, summed in fp32 and rounded once: gate_up_proj [E, H,
    # 2F] transposed, gate columns then up (concatenated, not interleaved),
    # gate_up_proj_bias [E, 2F] likewise, down_proj [E, F, H] transposed,
    # down_proj_bias [E, H]; gpt-oss's unit, alpha 1.702, limit 7 (a
    # constant of the class; set to 1.5 here, so that the clamp bites).
    Block, = tf_import("openai_privacy_filter.modeling_openai_privacy_filter", "OpenAIPrivacyFilterMLP")
    Cfg, = tf_import("openai_privacy_filter.configuration_openai_privacy_filter", "OpenAIPrivacyFilterConfig")
    cfg = eager(Cfg(hidden_size=256, intermediate_size=128, num_local_experts=16, num_experts_per_tok=4))
    block = Block(cfg)
    block.experts.limit = 1.5
    return block, cfg


def router_route(block, x):
    """gate_route for a router at block.router returning (logits, weights, indices)."""
    _, w, idx = block.router(x)
    return w, idx


def mk_aria():
    # AriaTextMoELayer (Aria): logits = router(x) (bf16), top-k of the
    # logits, weight = softmax over the k IN BF16 (no dtype), so softmax
    # then renormalize; the k outputs weighted and summed at once in bf16;
    # + shared_experts(x), ungated, intermediate intermediate_size ·
    # moe_num_shared_experts. Experts: fc1.weight [E, H, 2F] (transposed),
    # the first F columns through silu, the last F the linear half; fc2.weight
    # [E, F, H] (transposed).
    import transformers as tf
    Block, = tf_import("aria.modeling_aria", "AriaTextMoELayer")
    cfg = tf.AriaTextConfig(hidden_size=256, intermediate_size=128, moe_num_experts=16, moe_topk=4,
                            moe_num_shared_experts=1)
    return Block(cfg), cfg


def aria_route(block, x):
    idx, w = block.experts.route_tokens_to_experts(block.router(x))
    return w, idx


def mk_laguna(softcap=0.0):
    # LagunaSparseMoeBlock with moe_router_logit_softcapping = 0 (the
    # default), or c > 0: the fp32 logits become c·tanh(l / c) first
    # (router.logit_softcap): bf16 logits,
    # .float(), s = sigmoid, selection on s + the gate's
    # e_score_correction_bias (a parameter the class keeps in the model
    # dtype), top-k; weight = s / Σ_k s, cast to bf16; the routed sum ×
    # moe_routed_scaling_factor; + shared_experts(x), ungated, intermediate
    # shared_expert_intermediate_size.
    Block, = tf_import("laguna.modeling_laguna", "LagunaSparseMoeBlock")
    Cfg, = tf_import("laguna.configuration_laguna", "LagunaConfig")
    cfg = eager(Cfg(hidden_size=256, moe_intermediate_size=128, num_experts=32, num_experts_per_tok=8,
                    shared_expert_intermediate_size=128, moe_routed_scaling_factor=2.0,
                    moe_router_logit_softcapping=softcap))
    return Block(cfg), cfg


def mk_ernie45_vl():
    # Ernie4_5_VLMoeMoeBlock (ERNIE-4.5-VL) on text tokens (no
    # moe_mm_token_type_ids): its text_moe, ERNIE 4.5's router and experts
    # (F = moe_intermediate_size[0]), + shared_experts(x), ungated,
    # moe_intermediate_size[0] · moe_num_shared_experts. Vision tokens go
    # to vision_moe instead: a second layer (docs/models.md, "Not
    # expressible yet"). The wrapper names the text path's parts as the
    # check reads them.
    import torch
    Block, = tf_import("ernie4_5_vl_moe.modeling_ernie4_5_vl_moe", "Ernie4_5_VLMoeMoeBlock")
    Cfg, = tf_import("ernie4_5_vl_moe.configuration_ernie4_5_vl_moe", "Ernie4_5_VLMoeTextConfig")
    cfg = eager(Cfg(hidden_size=256, moe_intermediate_size=[128, 64], moe_num_experts=64, moe_k=6,
                    moe_num_shared_experts=2))

    class TextTokens(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block(cfg)
            self.gate, self.experts = self.block.text_moe.gate, self.block.text_moe.experts
            self.shared_experts = self.block.shared_experts

        def forward(self, h):
            return self.block(h)[0]

    return TextTokens(), cfg


def llama4_route(block, x):
    import torch
    scores, logits = block.router(x)
    idx = torch.topk(logits, block.top_k, dim=1)[1]
    return scores.gather(1, idx), idx


FAMILIES = [
    Family("mixtral", "Mixtral-8x7B", mk_mixtral, 'router = { score = "softmax", renormalize = true }',
           "fused"),
    Family("qwen3-moe", "Qwen3-30B-A3B / 235B-A22B", mk_qwen3,
           'router = { score = "softmax", renormalize = true }', "fused"),
    Family("olmoe", "OLMoE-1B-7B", mk_olmoe, 'router = { score = "softmax", renormalize = false }', "fused"),
    Family("gpt-oss", "gpt-oss-20b / 120b", mk_gpt_oss,
           'router = { score = "softmax", renormalize = true, logit_bias = true }\nffn_bias = true\n'
           'activation = { kind = "swiglu", alpha = 1.702, limit = 7.0, up_offset = 1 }', "interleaved_t",
           route=router_route, router=lambda b: {"wr": b.router.weight, "logit_bias": b.router.bias.float()}),
    Family("deepseek-v3", "DeepSeek-V3 / R1", lambda: mk_deepseek_v3(False),
           'router = { score = "sigmoid", bias = true, groups = 8, topk_groups = 4, group_topk = 2, '
           'renormalize = true, scale = 2.5 }', "fused", shared=128, shared_gate="none"),
    Family("kimi-k2", "Kimi K2 (DeepseekV3 class)", lambda: mk_deepseek_v3(True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.827 }', "fused",
           shared=128, shared_gate="none"),
    Family("glm4-moe", "GLM-4.5 / GLM-4.5-Air", mk_glm4,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 1.0 }', "fused",
           shared=128, shared_gate="none"),
    Family("deepseek-v2", "DeepSeek-V2 (group_limited_greedy)", mk_deepseek_v2,
           'router = { score = "softmax", groups = 8, topk_groups = 3, group_topk = 1, '
           'renormalize = false, scale = 16.0 }', "fused", shared=256, shared_gate="none"),
    Family("qwen2-moe", "Qwen2-57B-A14B / Qwen1.5-MoE", mk_qwen2,
           'router = { score = "softmax", renormalize = false }', "fused", shared=512, shared_gate="sigmoid",
           shared_of=lambda b: mlp_parts(b.shared_expert, b.shared_expert_gate.weight)),
    Family("llama4", "Llama-4-Scout / Maverick", mk_llama4,
           'router = { score = "sigmoid", renormalize = false, apply = "input" }', "concat_t",
           shared=256, shared_gate="none", route=llama4_route, router=lambda b: {"wr": b.router.weight},
           shared_of=lambda b: mlp_parts(b.shared_expert)),
    Family("qwen3-next", "Qwen3-Next-80B-A3B", mk_qwen3_next, 'router = { score = "softmax", renormalize = true }',
           "fused", shared=128, shared_gate="sigmoid",
           shared_of=lambda b: mlp_parts(b.shared_expert, b.shared_expert_gate.weight)),
    Family("qwen3.5-moe", "Qwen3.5-MoE", lambda: mk_qwen3_next("qwen3_5_moe.modeling_qwen3_5_moe",
                                                               "Qwen3_5MoeSparseMoeBlock", "Qwen3_5MoeTextConfig"),
           'router = { score = "softmax", renormalize = true }', "fused", shared=128, shared_gate="sigmoid",
           shared_of=lambda b: mlp_parts(b.shared_expert, b.shared_expert_gate.weight)),
    Family("qwen3-vl-moe", "Qwen3-VL-30B-A3B / 235B-A22B", mk_qwen3_vl,
           'router = { score = "softmax", renormalize = true }', "fused"),
    Family("minimax-m2", "MiniMax-M2", mk_minimax_m2,
           'router = { score = "sigmoid", bias = true, renormalize = true }', "fused",
           route=lambda b, x: gate_route_bias(b, x, b.e_score_correction_bias),
           router=lambda b: {"wr": b.gate.weight, "sel_bias": b.e_score_correction_bias.float()}, keep=()),
    Family("ernie4.5-moe", "ERNIE-4.5-21B-A3B / 300B-A47B", mk_ernie45,
           'router = { score = "softmax", bias = true, renormalize = true }', "fused", shared=256, shared_gate="none",
           router=lambda b: {"wr": b.gate.weight,
                             "sel_bias": b.gate.moe_statics.e_score_correction_bias.reshape(-1).float()},
           sel_bias_std=0.005),
    # ERNIE 4.5 as checkpoints ship it: gate.weight in fp32 (_keep_in_fp32_modules_strict) with values a
    # bf16 cannot hold; moegen takes it as it is (router.weight_dtype = "fp32")
    Family("ernie4.5-fp32router", "ERNIE-4.5 (gate.weight fp32, full precision)", mk_ernie45,
           'router = { score = "softmax", bias = true, renormalize = true, weight_dtype = "fp32" }', "fused",
           shared=256, shared_gate="none",
           router=lambda b: {"wr32": b.gate.weight.float(),
                             "sel_bias": b.gate.moe_statics.e_score_correction_bias.reshape(-1).float()},
           sel_bias_std=0.005, keep=("e_score_correction_bias", "gate.weight")),
    Family("hunyuan-moe", "Hunyuan-A13B", mk_hunyuan, 'router = { score = "softmax", renormalize = true }', "fused",
           shared=128, shared_gate="none", router=lambda b: {"wr": b.gate.wg.weight},
           shared_of=lambda b: mlp_parts(b.shared_mlp)),
    Family("dots1", "dots.llm1", lambda: mk_deepseek_like(
               "dots1.modeling_dots1", "Dots1MoE", "Dots1Config", n_routed_experts=32, num_experts_per_tok=6,
               n_group=1, topk_group=1, n_shared_experts=2, routed_scaling_factor=2.5, norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5 }', "fused",
           shared=256, shared_gate="none"),
    Family("deepseek-v3.2", "DeepSeek-V3.2", lambda: mk_deepseek_like(
               "deepseek_v32.modeling_deepseek_v32", "DeepseekV32MoE", "DeepseekV32Config", n_routed_experts=32,
               num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1, routed_scaling_factor=2.5,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, groups = 8, topk_groups = 4, group_topk = 2, '
           'renormalize = true, scale = 2.5 }', "fused", shared=128, shared_gate="none"),
    Family("glm4-moe-lite", "GLM-4.7-Flash (Glm4MoeLite)", lambda: mk_deepseek_like(
               "glm4_moe_lite.modeling_glm4_moe_lite", "Glm4MoeLiteMoE", "Glm4MoeLiteConfig", n_routed_experts=64,
               num_experts_per_tok=4, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.8,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 1.8 }', "fused",
           shared=128, shared_gate="none"),
    Family("exaone-moe", "K-EXAONE (ExaoneMoe)", lambda: mk_deepseek_like(
               "exaone_moe.modeling_exaone_moe", "ExaoneMoeSparseMoEBlock", "ExaoneMoeConfig", num_experts=64,
               num_experts_per_tok=8, n_group=1, topk_group=1, num_shared_experts=1, routed_scaling_factor=2.5,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5 }', "fused",
           shared=128, shared_gate="none"),
    Family("mistral4", "Mistral 4 (Mistral4MoE)", mk_mistral4,
           'router = { score = "softmax", groups = 4, topk_groups = 2, group_topk = 2, renormalize = true, '
           'scale = 1.0 }', "fused", shared=128, shared_gate="none"),
    Family("phimoe", "Phi-3.5-MoE (PhimoeSparseMoeBlock, sparsemixer)", mk_phimoe,
           'router = { score = "sparsemixer", renormalize = false, jitter_eps = 0.01 }', "fused",
           route=router_route, router=lambda b: {"wr": b.router.weight}, in_dtype=True),
    Family("longcat", "LongCat-Flash (LongcatFlashMoE, zero experts)", mk_longcat,
           'router = { score = "softmax", bias = true, renormalize = false, scale = 6.0 }', "fused",
           route=lambda b, x: b.router(x),
           router=lambda b: {"wr": b.router.classifier.weight, "sel_bias": b.router.e_score_correction_bias.float()},
           keep=(), sel_bias_std=0.01, zero=16, experts=lambda b: b.experts.num_routed_experts),
    # LongCat-Flash as it ships: the classifier kept in fp32 (_keep_in_fp32_modules), full precision
    Family("longcat-fp32router", "LongCat-Flash (classifier fp32, full precision)", mk_longcat,
           'router = { score = "softmax", bias = true, renormalize = false, scale = 6.0, weight_dtype = "fp32" }',
           "fused", route=lambda b, x: b.router(x),
           router=lambda b: {"wr32": b.router.classifier.weight.float(),
                             "sel_bias": b.router.e_score_correction_bias.float()},
           keep=("router.classifier.weight",), sel_bias_std=0.01, zero=16,
           experts=lambda b: b.experts.num_routed_experts),
    Family("granitemoe", "Granite-3.x MoE (1B-A400M, 3B-A800M)", mk_granite,
           'router = { score = "softmax", renormalize = true }', "fused", route=granite_route,
           router=lambda b: {"wr": b.router.weight}),
    Family("jetmoe", "JetMoE-8B (one output bias)", mk_jetmoe,
           'router = { score = "softmax", renormalize = true }\nffn_bias = true', "fused", route=jetmoe_route,
           router=lambda b: {"wr": b.router.layer.weight}, ffn_bias_of=jetmoe_bias),
    Family("granitemoeshared", "Granite MoE with a shared expert", mk_granite_shared,
           'router = { score = "softmax", renormalize = true }', "fused", shared=256, shared_gate="none",
           route=granite_route, router=lambda b: {"wr": b.router.weight}, shared_of=granite_shared),
    Family("jamba", "Jamba (v0.1, 1.5 Mini / Large)", mk_jamba, 'router = { score = "softmax", renormalize = false }',
           "fused", route=jamba_route, router=lambda b: {"wr": b.router.weight}),
    Family("lfm2-moe", "LFM2-8B-A1B", mk_lfm2,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 1.0 }', "fused",
           route=lambda b, x: gate_route_bias(b, x, b.expert_bias),
           router=lambda b: {"wr": b.gate.weight, "sel_bias": b.expert_bias.float()}, keep=("expert_bias",)),
    Family("granite4", "Granite 4.0 (GraniteMoeHybrid)", lambda: mk_granite_shared(
               "granitemoehybrid.modeling_granitemoehybrid", "GraniteMoeHybridMoE", "GraniteMoeHybridMLP",
               "GraniteMoeHybridConfig"),
           'router = { score = "softmax", renormalize = true }', "fused", shared=256, shared_gate="none",
           route=granite_route, router=lambda b: {"wr": b.router.weight}, shared_of=granite_shared),
    Family("minimax", "MiniMax-Text-01 / M1", mk_minimax, 'router = { score = "softmax", renormalize = true }',
           "fused"),
    Family("mimo-v2-flash", "MiMo-V2-Flash", lambda: mk_deepseek_like(
               "mimo_v2_flash.modeling_mimo_v2_flash", "MiMoV2FlashMoE", "MiMoV2FlashConfig", n_routed_experts=32,
               num_experts_per_tok=8, n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 1.0 }', "fused"),
    Family("solar-open", "Solar Open", lambda: mk_deepseek_like(
               "solar_open.modeling_solar_open", "SolarOpenMoE", "SolarOpenConfig", n_routed_experts=32,
               num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.0,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 1.0 }', "fused",
           shared=128, shared_gate="none"),
    Family("glm4v-moe", "GLM-4.5V (Glm4vMoeText)", lambda: mk_deepseek_like(
               "glm4v_moe.modeling_glm4v_moe", "Glm4vMoeTextMoE", "Glm4vMoeTextConfig", n_routed_experts=32,
               num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.0,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 1.0 }', "fused",
           shared=128, shared_gate="none"),
    Family("afmoe", "Arcee Trinity (Afmoe)", mk_afmoe,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0 }', "fused",
           shared=128, shared_gate="none", route=lambda b, x: afmoe_route(b, x),
           router=lambda b: {"wr": b.router.gate.weight, "sel_bias": b.expert_bias.float()}, keep=("expert_bias",)),
    Family("flex-olmo", "FlexOlmo-7x7B", mk_flex_olmo, 'router = { score = "softmax", renormalize = false }', "fused"),
    Family("cohere2-moe", "Cohere2-MoE (average)", mk_cohere2,
           'router = { score = "softmax", renormalize = true, scale = 0.5 }', "fused", shared=128,
           shared_gate="none", shared_of=cohere2_shared),
    Family("step3.7", "Step-3.7-Flash (an unclamped layer)", mk_step3p7,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0 }', "fused",
           shared=128, shared_gate="none"),
    # its clamped layers (43-44 of Step-3.7-Flash): min(silu(gate), L) · clamp(up, ±L), L small enough to bite
    Family("step3.7-clamped", "Step-3.7-Flash (a clamped layer, routed and shared limit 0.6)",
           lambda: mk_step3p7(limit=0.6),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0 }\n'
           'activation = { kind = "swiglu", limit = 0.6, clamp = "after" }', "fused", shared=128, shared_gate="none"),
    # and its own limit for the shared expert (the checkpoint's 16 against 7): spec shared.limit
    Family("step3.7-shared-limit", "Step-3.7-Flash (a clamped layer, routed limit 0.6, shared 1.4)",
           lambda: mk_step3p7(limit=0.6, shared_limit=1.4),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0 }\n'
           'activation = { kind = "swiglu", limit = 0.6, clamp = "after" }', "fused", shared=128, shared_gate="none",
           shared_keys="limit = 1.4"),
    # NemotronH (Nemotron 3 Nano): non-gated relu2 experts and shared expert, DeepSeek-V3's router
    Family("nemotron-h", "NemotronH (NemotronHMoE), relu2 experts", mk_nemotron_h,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5 }\n'
           'activation = { kind = "relu2" }', "nongated", shared=256, shared_gate="none",
           shared_of=nongated_shared),
    Family("nemotron-h-latent", "NemotronH with moe_latent_size (Nemotron 3 Super / Ultra's LatentMoE)",
           lambda: mk_nemotron_h(NEMOTRON_LATENT),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5, input = "separate", '
           'hidden = 256 }\nactivation = { kind = "relu2" }', "nongated", inputs=latent_inputs,
           outputs=latent_outputs, latent=NEMOTRON_LATENT),
    Family("qwen3omni-talker", "Qwen3-Omni talker", mk_qwen3_omni_talker,
           'router = { score = "softmax", renormalize = false }', "fused", shared=256, shared_gate="sigmoid",
           shared_of=lambda b: mlp_parts(b.shared_expert, b.shared_expert_gate.weight)),
    Family("dbrx", "DBRX", mk_dbrx, 'router = { score = "softmax", renormalize = true }', "separate_flat",
           route=dbrx_route, router=lambda b: {"wr": b.router.layer.weight},
           top_k=lambda cfg: cfg.ffn_config.moe_top_k),
    Family("kimi-linear", "Kimi Linear (KimiLinearMoE)", lambda: mk_deepseek_like(
               "kimi_linear.modeling_kimi_linear", "KimiLinearMoE", "KimiLinearConfig", num_local_experts=32,
               num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.446,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.446 }', "fused",
           shared=128, shared_gate="none"),
    Family("glm-moe-dsa", "GLM-5 (GlmMoeDsaMoE)", lambda: mk_deepseek_like(
               "glm_moe_dsa.modeling_glm_moe_dsa", "GlmMoeDsaMoE", "GlmMoeDsaConfig", n_routed_experts=32,
               num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5,
               norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5 }', "fused",
           shared=128, shared_gate="none"),
    # Glm5NextTextMoE: DeepSeek-V3's block whose experts AND shared expert
    # clamp gate <= swiglu_limit and up to ±swiglu_limit before silu(gate)·up
    # (10 by default; 1.5 here, so that the clamp bites on these inputs).
    Family("glm5-next", "GLM-5-Next (Glm5NextTextMoE), limit 1.5", lambda: mk_deepseek_like(
               "glm5_next.modeling_glm5_next", "Glm5NextTextMoE", "Glm5NextTextConfig", n_routed_experts=32,
               num_experts_per_tok=8, n_group=1, topk_group=1, n_shared_experts=1, routed_scaling_factor=2.5,
               norm_topk_prob=True, swiglu_limit=1.5),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.5 }\n'
           'activation = { kind = "swiglu", limit = 1.5 }', "fused", shared=128, shared_gate="none"),
    Family("deepseek-v4", "DeepSeek-V4 (DeepseekV4SparseMoeBlock, a moe layer), limit 1.5", mk_deepseek_v4,
           'router = { score = "sqrtsoftplus", bias = true, renormalize = true, scale = 1.5 }\n'
           'activation = { kind = "swiglu", limit = 1.5 }', "fused", shared=128, shared_gate="none"),
    # DeepSeek-V4's first layers (mlp_layer_types "hash_moe"): the experts tid2eid[input_ids], each
    # weighted by sqrt(softplus(logit)) at it, renormalized, x routed_scaling_factor; no selection bias.
    Family("deepseek-v4-hash", "DeepSeek-V4 (DeepseekV4SparseMoeBlock, a hash_moe layer), limit 1.5",
           lambda: mk_deepseek_v4(layer=0),
           'router = { select = "given", score = "sqrtsoftplus", renormalize = true, scale = 1.5 }\n'
           'activation = { kind = "swiglu", limit = 1.5 }', "fused", shared=128, shared_gate="none", hash=True),
    # HYV4MoE: DeepSeek-V3's block (fp32 router, groups), its experts clamped as GLM-5-Next's
    # (swiglu_limit 10; 1.5 here, so that the clamp bites), its shared expert (HYV4MLP) not: shared.unclamped
    Family("hy-v4", "HY-V4 (HYV4MoE), routed limit 1.5, shared unclamped", lambda: mk_deepseek_like(
               "hy_v4.modeling_hy_v4", "HYV4MoE", "HYV4Config", n_routed_experts=32, num_experts_per_tok=8,
               n_group=4, topk_group=2, n_shared_experts=1, routed_scaling_factor=2.827, norm_topk_prob=True,
               swiglu_limit=1.5),
           'router = { score = "sigmoid", bias = true, groups = 4, topk_groups = 2, group_topk = 2, '
           'renormalize = true, scale = 2.827 }\n'
           'activation = { kind = "swiglu", limit = 1.5 }', "fused", shared=128, shared_gate="none",
           shared_keys="unclamped = true"),
    Family("hy-v3", "HY-V3 (HYV3MoE)", mk_hy_v3,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.826 }', "fused",
           shared=128, shared_gate="none", route=lambda b, x: gate_route_bias(b, x, b.e_score_correction_bias),
           router=lambda b: {"wr": b.gate.weight, "sel_bias": b.e_score_correction_bias.float()}),
    Family("qwen4-exp", "Qwen4-Exp (Qwen4ExpTextSparseMoeBlock)", lambda: mk_qwen3_next(
               "qwen4_exp.modeling_qwen4_exp", "Qwen4ExpTextSparseMoeBlock", "Qwen4ExpTextConfig"),
           'router = { score = "softmax", renormalize = true }', "fused", shared=128, shared_gate="sigmoid",
           shared_of=lambda b: mlp_parts(b.shared_expert, b.shared_expert_gate.weight)),
    Family("minimax-m3-vl", "MiniMax-M3-VL (text), limit 1.5", mk_minimax_m3,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0 }\n'
           'activation = { kind = "swiglu", alpha = 1.702, limit = 1.5, up_offset = 1 }', "fused",
           shared=128, shared_gate="none", shared_of=lambda b: fused_shared(b.shared_experts), keep=()),
    # MellumSparseMoeBlock: Qwen3-MoE's block (norm_topk_prob true by default).
    Family("mellum", "Mellum (MellumSparseMoeBlock)", lambda: mk_qwen3_like(
               "mellum.modeling_mellum", "MellumSparseMoeBlock", "MellumConfig"),
           'router = { score = "softmax", renormalize = true }', "fused"),
    # AXK2MoE: DeepSeek-V3's block, except that the groups left out get
    # selection score 0 (masked_fill 0.0), not -inf; the same selection while
    # the kept groups' s + bias stay positive (sigmoid + a small bias).
    Family("axk2", "A.X K2 (AXK2MoE)", lambda: mk_deepseek_like(
               "axk2.modeling_axk2", "AXK2MoE", "AXK2Config", n_routed_experts=32, num_experts_per_tok=8,
               n_group=8, topk_group=4, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True),
           'router = { score = "sigmoid", bias = true, groups = 8, topk_groups = 4, group_topk = 2, '
           'renormalize = true, scale = 2.5 }', "fused", shared=128, shared_gate="none"),
    Family("granitemoe-swa", "Granite MoE SWA (GraniteMoeSWA)", lambda: mk_granite_shared(
               "granitemoe_swa.modeling_granitemoe_swa", "GraniteMoeSWAMoE", "GraniteMoeSWAMLP",
               "GraniteMoeSWAConfig"),
           'router = { score = "softmax", renormalize = true }', "fused", shared=256, shared_gate="none",
           route=router_route, router=lambda b: {"wr": b.router.weight}, shared_of=granite_shared),
    # DeepseekOcr2TextMoe (DeepSeek-OCR 2's language model): DeepSeek-V2's
    # block (softmax, "greedy" or "group_limited_greedy", never renormalized).
    Family("deepseek-ocr2", "DeepSeek-OCR 2 (text)", lambda: mk_deepseek_like(
               "deepseek_ocr2.modeling_deepseek_ocr2", "DeepseekOcr2TextMoe", "DeepseekOcr2TextConfig",
               n_routed_experts=32, num_experts_per_tok=6, n_group=8, topk_group=3, n_shared_experts=2,
               topk_method="group_limited_greedy", routed_scaling_factor=16.0),
           'router = { score = "softmax", groups = 8, topk_groups = 3, group_topk = 1, '
           'renormalize = false, scale = 16.0 }', "fused", shared=256, shared_gate="none"),
    Family("privacy-filter", "OpenAI privacy filter, limit 1.5", mk_privacy_filter,
           'router = { score = "softmax", renormalize = true, logit_bias = true }\nffn_bias = true\n'
           'activation = { kind = "swiglu", alpha = 1.702, limit = 1.5, up_offset = 1 }', "concat_t",
           route=router_route, router=lambda b: {"wr": b.router.weight, "logit_bias": b.router.bias.float()}),
    Family("aria", "Aria (AriaTextMoELayer)", mk_aria, 'router = { score = "softmax", renormalize = true }',
           "concat_t_fc", shared=128, shared_gate="none", route=aria_route, router=lambda b: {"wr": b.router.weight},
           top_k=lambda cfg: cfg.moe_topk),
    Family("laguna", "Laguna (no logit softcap)", mk_laguna,
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0 }', "fused",
           shared=128, shared_gate="none", keep=()),
    Family("laguna-softcap", "Laguna (moe_router_logit_softcapping = 0.5)", lambda: mk_laguna(0.5),
           'router = { score = "sigmoid", bias = true, renormalize = true, scale = 2.0, logit_softcap = 0.5 }',
           "fused", shared=128, shared_gate="none", keep=()),
    Family("ernie4.5-vl", "ERNIE-4.5-VL (text tokens)", mk_ernie45_vl,
           'router = { score = "softmax", bias = true, renormalize = true }', "fused", shared=256, shared_gate="none",
           router=lambda b: {"wr": b.gate.weight,
                             "sel_bias": b.gate.moe_statics.e_score_correction_bias.reshape(-1).float()},
           sel_bias_std=0.005),
    Family("gemma4", "Gemma 4 (Gemma4TextRouter, Gemma4TextExperts)", mk_gemma4,
           'router = { score = "softmax", renormalize = true, input = "separate", expert_scale = true }\n'
           'activation = { kind = "geglu" }', "fused", route=lambda b, r: b.router(r)[1:],
           router=lambda b: {"wr": b.router.proj.weight, "expert_scale": b.router.per_expert_scale.float()},
           inputs=gemma4_inputs, keep=(), top_k=lambda cfg: cfg.top_k_experts, post_init=gemma4_init,
           copy32=gemma4_copy32),
]


# ---- the block's side ----------------------------------------------------------

def init_params(block, H, seed, sel_bias_std=0.05):
    """Fill every parameter and float buffer with seeded random values (never
    zeros: HF initializes some routers to zero and the experts to garbage).
    Weights are uniform(-1, 1)·2/sqrt(fan_in); the router's rows make logits
    of spread ~1; biases are small normals."""
    import torch
    g = torch.Generator().manual_seed(seed)
    named = list(block.named_parameters()) + [(n, b) for n, b in block.named_buffers() if b.is_floating_point()]
    for name, p in named:
        shape = tuple(p.shape)
        with torch.no_grad():
            if name.endswith("e_score_correction_bias") or name == "expert_bias":
                v = torch.randn(shape, generator=g) * sel_bias_std
            elif len(shape) == 1 or name.endswith("bias"):
                v = torch.randn(shape, generator=g) * (0.5 if "router" in name else 0.1)
            else:
                dims = shape[-2:]
                if "down" in name:
                    fan = dims[0] if dims[1] == H else dims[1]
                else:
                    fan = H
                v = (torch.rand(shape, generator=g) * 2 - 1) * (2.0 / fan ** 0.5)
            p.copy_(v.to(p.dtype))


def block_forward(fam, block, x):
    """The block's output [T, H] for x [T, H]; the routed part alone when
    the shared expert is left out (routed_only)."""
    out = block(x.unsqueeze(0), input_ids=fam.ids[:x.shape[0]].unsqueeze(0)) if fam.hash else block(x.unsqueeze(0))
    if isinstance(out, tuple):
        out = out[0]
    return out.reshape(x.shape[0], -1)


def block_routed(fam, block, x):
    """The block's routed experts alone: the block's forward without its
    shared expert (for families whose shared key this build lacks)."""
    w, idx = block_route(fam, block, x)
    if fam.name == "llama4":  # every expert on every token, its input scaled (by 0 when not chosen)
        scores = block.router(x)[0]
        routed_in = x.repeat(scores.shape[1], 1) * scores.transpose(0, 1).reshape(-1, 1)
        return block.experts(routed_in).reshape(scores.shape[1], x.shape[0], -1).sum(dim=0)
    return block.experts(x, idx, w)


def block_route(fam, block, x):
    """(weights [T, K], expert indices [T, K]) from the block's own router."""
    return fam.route(block, x)


# ---- conversion into moegen's layout ---------------------------------------------

def expert_ffn(fam, block):
    """The experts' intermediate size F, from the stored expert weights."""
    ex = block.experts
    if fam.layout == "separate_flat":
        return ex.ffn_hidden_size
    if fam.layout == "concat_t_fc":
        return ex.fc2.weight.shape[1]
    if fam.layout == "nongated":
        return ex.up_proj.shape[1]
    return ex.gate_up_proj.shape[1 if fam.layout == "fused" else 2] // 2


def convert(fam, block, E, H, F):
    """The block's parameters in moegen's layout (ref.h, "Data conventions";
    README, "Tensors"): wr [E, H]; sel_bias / logit_bias fp32 [E]; w1 [S, 2F, H]
    gate rows then up rows, the plain layout; w2 [E, H, F]; b1 [E, 2F], b2 [E, H].
    Half tensors in the block's dtype, contiguous. The shared expert:
    convert_shared."""
    import torch
    t = dict(fam.router(block))
    ex = block.experts
    # zero experts (LongCat-Flash): gate_up_proj holds E + Z experts, the zero experts' never read
    gate_up = ex.gate_up_proj[:E] if fam.zero else getattr(ex, "gate_up_proj", None)
    if fam.layout == "fused":            # [E, 2F, H] gate then up; down [E, H, F]
        w1, w2 = gate_up, ex.down_proj
    elif fam.layout == "concat_t":       # [E, H, 2F] gate columns then up; down [E, F, H]
        w1, w2 = ex.gate_up_proj.transpose(1, 2), ex.down_proj.transpose(1, 2)
        if getattr(ex, "gate_up_proj_bias", None) is not None:  # [E, 2F] gate then up, [E, H]
            t["b1"], t["b2"] = ex.gate_up_proj_bias, ex.down_proj_bias
    elif fam.layout == "concat_t_fc":    # Aria: fc1.weight [E, H, 2F] silu'd half then the other; fc2 [E, F, H]
        w1, w2 = ex.fc1.weight.transpose(1, 2), ex.fc2.weight.transpose(1, 2)
    elif fam.layout == "separate_flat":  # DBRX: w1 (gate), v1 (up) [E·F, H]; w2 [E·F, H] = down transposed
        gate, up, down_t = (getattr(ex.mlp, n).view(E, F, H) for n in ("w1", "v1", "w2"))
        w1, w2 = torch.cat([gate, up], dim=1), down_t.transpose(1, 2)
    elif fam.layout == "nongated":       # NemotronH: up_proj [E, F, H] (no gate), down [E, H, F]: relu2's gate
        w1, w2 = torch.cat([ex.up_proj, ex.up_proj], dim=1), ex.down_proj   # rows are up_proj, its up rows unused
    elif fam.layout == "interleaved_t":  # [E, H, 2F] gate/up interleaved by column
        wt = ex.gate_up_proj.transpose(1, 2)
        w1 = torch.cat([wt[:, 0::2], wt[:, 1::2]], dim=1)
        w2 = ex.down_proj.transpose(1, 2)
        bt = ex.gate_up_proj_bias
        t["b1"] = torch.cat([bt[:, 0::2], bt[:, 1::2]], dim=1)
        t["b2"] = ex.down_proj_bias
    else:
        raise ValueError(fam.layout)
    assert tuple(w1.shape) == (E, 2 * F, H) and tuple(w2.shape) == (E, H, F), (w1.shape, w2.shape)
    t["w1"], t["w2"] = w1, w2
    if fam.ffn_bias_of:
        t["b1"], t["b2"] = fam.ffn_bias_of(block, E, F)
    t = {k: v.detach().contiguous() for k, v in t.items()}
    # The same tensors as the checkpoint stores them, with moe_layout's name
    # for each (runtime/moe.h), for the library's own packing where it has it.
    if fam.layout == "separate_flat":
        stored = [("W1_SEPARATE", gate, up), ("W2_T", down_t)]
    elif fam.layout == "fused":
        stored = [("W1_FUSED", gate_up), ("W2", ex.down_proj)]
    elif fam.layout == "nongated":       # up_proj as both the gate and the up source
        stored = [("W1_SEPARATE", ex.up_proj, ex.up_proj), ("W2", ex.down_proj)]
    elif fam.layout == "concat_t_fc":
        stored = [("W1_FUSED_T", ex.fc1.weight), ("W2_T", ex.fc2.weight)]
    elif fam.layout == "concat_t":
        stored = [("W1_FUSED_T", ex.gate_up_proj), ("W2_T", ex.down_proj)]
        if "b1" in t:
            stored += [("B1_FUSED", ex.gate_up_proj_bias), ("B2", ex.down_proj_bias)]
    else:  # interleaved_t
        stored = [("W1_INTERLEAVED_T", ex.gate_up_proj), ("B1_INTERLEAVED", ex.gate_up_proj_bias),
                  ("W2_T", ex.down_proj), ("B2", ex.down_proj_bias)]
    if fam.ffn_bias_of:
        stored += [("B1_FUSED", t["b1"]), ("B2", t["b2"])]
    t["stored"] = [(n,) + tuple(v.detach().contiguous() for v in vs) for n, *vs in stored]
    return t


def convert_shared(fam, block, t):
    """The shared expert as checkpoints store it, in the form moegen takes it
    (runtime/moe.h, moe_plan_pack_shared; ref.h, ws1/ws2/wsg): ws1 [2F_s, H]
    = gate_proj rows then up_proj rows, ws2 [H, F_s] = down_proj, and for a
    sigmoid gate wsg [H] = the gate's weight row (Qwen2-MoE's
    shared_expert_gate). The library splits it into the m = F_s / F
    always-on slots E .. E+m-1 itself."""
    import torch
    gate, up, down, gate_vec = fam.shared_of(block)  # [Fs,H] [Fs,H] [H,Fs] [H]
    assert gate.shape[0] == fam.shared, (gate.shape, fam.shared)
    t["ws1"] = torch.cat([gate, up]).detach().contiguous()
    t["ws2"] = down.detach().contiguous()
    if fam.shared_gate == "sigmoid":
        t["wsg"] = gate_vec.detach().reshape(-1).contiguous()
    return t


def spec_text(fam, name, E, K, H, F, tokens, with_shared, drop=()):
    keys = fam.spec
    for k in drop:  # a key left out: `router.group_topk` where the old rule agrees
        keys = re.sub(r"\s*%s = [^,}]+,?" % re.escape(k.split(".")[-1]), "", keys)
    s = ('-- bench/check_models.py: %s (%s), a small random config of the same class\n'
         'name = "%s"\nexperts = %d\ntop_k = %d\nhidden = %d\nffn = %d\ntokens = %d\ndtype = "bf16"\n%s\n'
         % (fam.name, fam.model, name, E, K, H, F, tokens, keys))
    if with_shared and fam.shared:
        s += 'shared = { ffn = %d, gate = "%s"%s }\n' % (fam.shared, fam.shared_gate,
                                                         ", " + fam.shared_keys if fam.shared_keys else "")
    if fam.zero and "zero_experts" not in drop:  # a build without the key: skipped ("needs zero_experts")
        s += 'zero_experts = %d\n' % fam.zero
    return s


def unknown_key(msg):
    m = re.search(r"unknown key '([^']+)'", msg or "")
    return m.group(1) if m else None


# ---- moegen's side -------------------------------------------------------------

class CpuBackend:
    """The C CPU reference (build/libmoegen_ref.so)."""
    name = "cpu (tests/support/ref.c)"

    class Inputs(ctypes.Structure):
        _fields_ = [("tokens", ctypes.c_int), ("x", ctypes.c_void_p), ("wr", ctypes.c_void_p),
                    ("sel_bias", ctypes.c_void_p), ("logit_bias", ctypes.c_void_p),
                    ("w1", ctypes.c_void_p), ("w2", ctypes.c_void_p), ("b1", ctypes.c_void_p),
                    ("b2", ctypes.c_void_p), ("ws1", ctypes.c_void_p), ("ws2", ctypes.c_void_p),
                    ("wsg", ctypes.c_void_p), ("given_ids", ctypes.c_void_p), ("given_w", ctypes.c_void_p),
                    ("router_x", ctypes.c_void_p), ("expert_scale", ctypes.c_void_p), ("wr32", ctypes.c_void_p)]

    def __init__(self, opt):
        path = os.path.join(ROOT, "build", "libmoegen_ref.so")
        if not os.path.exists(path):
            r = subprocess.run(["make", "-C", ROOT, "build/libmoegen_ref.so"], capture_output=True, text=True)
            if r.returncode:
                raise RuntimeError("make build/libmoegen_ref.so failed:\n" + r.stdout + r.stderr)
        self.lib = ctypes.CDLL(path)
        self.err = ctypes.create_string_buffer(2048)

    def load(self, spec_path):
        """None when the spec loads, else the loader's message."""
        shape = (ctypes.c_int * 8)()
        if self.lib.moe_reflib_shape(spec_path.encode(), shape, self.err, len(self.err)):
            return self.err.value.decode()
        return None

    def open(self, spec_path, t, cap):
        self.spec, self.t = spec_path, t

    def close(self):
        pass

    def run(self, x, E, K, given=None, router_x=None):
        """(y [T, H] bf16, topk_idx [T, K]) for x [T, H] bf16; given: the
        caller's expert ids [T, K] (int32, router.select = "given");
        router_x: the router's own input [T, H] (router.input = "separate")."""
        import torch
        T, H = x.shape
        t = self.t
        ptr = lambda k: t[k].data_ptr() if k in t else None
        a = self.Inputs(T, x.data_ptr(), ptr("wr"), ptr("sel_bias"), ptr("logit_bias"), ptr("w1"),
                        ptr("w2"), ptr("b1"), ptr("b2"), ptr("ws1"), ptr("ws2"), ptr("wsg"),
                        None if given is None else given.data_ptr(), None,
                        None if router_x is None else router_x.data_ptr(), ptr("expert_scale"), ptr("wr32"))
        y = torch.empty(T, H, dtype=torch.float32)
        idx = torch.empty(T, K, dtype=torch.int32)
        w = torch.empty(T, K, dtype=torch.float32)
        if self.lib.moe_reflib_forward(self.spec.encode(), ctypes.byref(a), ctypes.c_void_p(y.data_ptr()),
                                       ctypes.c_void_p(idx.data_ptr()), ctypes.c_void_p(w.data_ptr()),
                                       None, self.err, len(self.err)):
            raise RuntimeError(self.err.value.decode())
        return y.to(torch.bfloat16), idx.long()


class GpuBackend:
    """libmoegen.so through ctypes: the generated kernels on the GPU."""
    name = "gpu (build/libmoegen.so)"

    # moe.h's structs: the moegen package's mirrors (python/moegen/_lib.py), checked against the library
    # when _lib.load loads it
    Args, PackSrc, PackArgs = _lib.ForwardArgs, _lib.PackSrc, _lib.PackArgs

    # moe_layout (runtime/moe.h), in its order
    LAYOUTS = ["W1_FUSED", "W1_FUSED_T", "W1_INTERLEAVED", "W1_INTERLEAVED_T", "W1_SEPARATE", "W1_SEPARATE_T",
               "B1_FUSED", "B1_INTERLEAVED", "B1_SEPARATE", "W2", "W2_T", "B2"]

    def __init__(self, opt):
        import torch
        path = os.path.join(ROOT, "build", "libmoegen.so")
        if not os.path.exists(path):
            raise RuntimeError("%s is missing: run `make -j build/libmoegen.so` (or carry build/)" % path)
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device: the gpu backend needs one (--backend cpu runs without)")
        self.lib = _lib.load(path)   # its version and struct layouts against the package's
        torch.zeros(1, device="cuda")  # the primary context, which libmoegen shares
        self.plan = None

    def last_error(self):
        return self.lib.moe_last_error().decode(errors="replace")

    def load(self, spec_path):
        """None when a plan of the spec is created (kept for open()), else why not."""
        self.close()
        plan = ctypes.c_void_p()
        if self.lib.moe_plan_create(ctypes.byref(plan), spec_path.encode(), None) != 0:
            return "moe_plan_create: %s" % self.last_error()
        self.plan = plan
        return None

    def open(self, spec_path, t, cap):
        """Pack and upload the weights for the plan load() created."""
        import torch
        self.cap = cap
        plan = self.plan
        w1, w2 = t["w1"], t["w2"]
        E, F = w1.shape[0], w1.shape[1] // 2
        m = t["ws2"].shape[1] // F if "ws1" in t else 0   # the shared expert's slots E .. E+m-1
        # poisoned (bf16 NaN): a slot the pack functions leave out shows as NaN in y
        w1p = torch.full((E + m,) + tuple(w1.shape[1:]), float("nan"), dtype=w1.dtype)
        w2s = torch.cat([w2, torch.full((m,) + tuple(w2.shape[1:]), float("nan"), dtype=w2.dtype)])
        if self.lib.moe_plan_pack_w1(plan, ctypes.c_void_p(w1.data_ptr()), ctypes.c_void_p(w1p.data_ptr())):
            raise RuntimeError("moe_plan_pack_w1: %s" % self.last_error())
        b1p = None
        if "b1" in t:
            b1p = torch.full_like(t["b1"], float("nan"))
            if self.lib.moe_plan_pack_b1(plan, ctypes.c_void_p(t["b1"].data_ptr()), ctypes.c_void_p(b1p.data_ptr())):
                raise RuntimeError("moe_plan_pack_b1: %s" % self.last_error())
        if m:
            if not hasattr(self.lib, "moe_plan_pack_shared"):
                raise RuntimeError("this libmoegen.so has no moe_plan_pack_shared")
            if self.lib.moe_plan_pack_shared(plan, ctypes.c_void_p(t["ws1"].data_ptr()),
                                             ctypes.c_void_p(t["ws2"].data_ptr()),
                                             ctypes.c_void_p(w1p.data_ptr()), ctypes.c_void_p(w2s.data_ptr())):
                raise RuntimeError("moe_plan_pack_shared: %s" % self.last_error())
        d = {k: t[k].cuda() for k in ("wr", "wr32", "sel_bias", "logit_bias", "b2", "wsg", "expert_scale") if k in t}
        d["w1p"], d["w2"] = w1p.cuda(), w2s.cuda()
        if "b1" in t:
            d["b1p"] = b1p.cuda()
        self.device_pack(t, d, E)
        self.d = d

    def device_pack(self, t, d, E):
        """Where the library has the device pack (moe_plan_pack_layout,
        moe_plan_pack_async): pack the routed experts again on the GPU from
        the tensors as the checkpoint stores them (t["stored"]), and require
        the result equal, bit for bit, to the host packing above (which came
        from this script's own conversion). Then the forward runs on the
        device-packed tensors. Without it, nothing (the host packing stands)."""
        import torch
        if not (hasattr(self.lib, "moe_plan_pack_layout") and hasattr(self.lib, "moe_plan_pack_async")):
            self.packed_on = "host (moe_plan_pack_w1)"
            return
        dst_of = {"W1": "w1p", "B1": "b1p", "W2": "w2", "B2": "b2"}
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for layout, src, *up in t["stored"]:  # (name, tensor) or, for the _SEPARATE layouts, (name, gate, up)
            key = dst_of[layout.split("_")[0]]
            src_d = src.cuda()
            up_d = up[0].cuda() if up else None
            dst = d[key].clone()
            dst[:E] = float("nan")  # the routed slots poisoned; shared slots kept
            a = self.PackArgs()
            if self.lib.moe_plan_pack_layout(self.plan, self.LAYOUTS.index(layout), ctypes.c_void_p(src_d.data_ptr()),
                                             ctypes.c_void_p(up_d.data_ptr()) if up else None, 0, E,
                                             ctypes.byref(a)):
                raise RuntimeError("moe_plan_pack_layout(%s): %s" % (layout, self.last_error()))
            if self.lib.moe_plan_pack_async(self.plan, ctypes.byref(a), ctypes.c_void_p(dst.data_ptr()), stream):
                raise RuntimeError("moe_plan_pack_async(%s): %s" % (layout, self.last_error()))
            torch.cuda.synchronize()
            if not torch.equal(dst.view(torch.int16), d[key].view(torch.int16)):
                bad = int((dst.view(torch.int16) != d[key].view(torch.int16)).sum())
                raise RuntimeError("the device pack from %s differs from the host conversion in %d of %d elements"
                                   % (layout, bad, dst.numel()))
            d[key] = dst
        self.packed_on = "device (moe_plan_pack_async from the stored layouts), equal to the host packing"

    def close(self):
        if self.plan:
            self.lib.moe_plan_destroy(self.plan)
            self.plan = None

    def run(self, x, E, K, given=None, router_x=None):
        import torch
        T, H = x.shape
        d = self.d
        ptr = lambda k: d[k].data_ptr() if k in d else None
        xd = x.cuda()
        y = torch.full((T, H), float("nan"), device="cuda", dtype=x.dtype)  # poisoned
        ws = torch.empty(self.lib.moe_plan_workspace_size(self.plan, T), dtype=torch.uint8, device="cuda")
        if ws.numel() == 0:
            raise RuntimeError("moe_plan_workspace_size: %s" % self.last_error())
        a = self.Args(T, xd.data_ptr(), ptr("wr32") or ptr("wr"), ptr("sel_bias"), ptr("logit_bias"), ptr("w1p"), ptr("b1p"),
                      ptr("w2"), ptr("b2"), y.data_ptr(), ws.data_ptr(), ptr("wsg"))
        if given is not None:  # router.select = "given": the caller's ids
            gd = given.cuda()
            a.topk_ids = gd.data_ptr()
        if router_x is not None:  # router.input = "separate": the router's own input
            rxd = router_x.contiguous().cuda()
            a.router_x = rxd.data_ptr()
        if "expert_scale" in d:  # router.expert_scale
            a.router_expert_scale = d["expert_scale"].data_ptr()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if self.lib.moe_forward(self.plan, ctypes.byref(a), stream) != 0:
            raise RuntimeError("moe_forward: %s" % self.last_error())
        torch.cuda.synchronize()
        off, nb = ctypes.c_size_t(), ctypes.c_size_t()
        idx = None
        if self.lib.moe_plan_workspace_region_at(self.plan, T, b"topk_idx", ctypes.byref(off),
                                                 ctypes.byref(nb)) == 0:
            per = nb.value // 4 // T  # entries per token ([T, K], or more with shared slots)
            raw = ws[off.value:off.value + nb.value].view(torch.int32)
            idx = raw[:T * per].reshape(T, per)[:, :K].long().cpu()
        return y.cpu(), idx


# ---- comparing -----------------------------------------------------------------

def compare(y, idx, ref, ref_idx):
    """(max abs error, max error / RMS(ref), tokens routed differently,
    RMS(error) / RMS(ref)), the errors over the tokens whose expert sets agree."""
    import torch
    y, ref = y.float(), ref.float()
    same = torch.tensor([set(a.tolist()) == set(b.tolist()) for a, b in zip(idx, ref_idx)]) \
        if idx is not None else torch.ones(y.shape[0], dtype=torch.bool)
    flips = int((~same).sum())
    rms = ref.pow(2).mean().sqrt().item()
    d = (y - ref)[same].abs()
    err = d.max().item() if d.numel() else 0.0
    erms = d.pow(2).mean().sqrt().item() if d.numel() else 0.0
    if not torch.isfinite(y).all():
        err = erms = float("inf")
    if rms <= 0:
        return err, float("inf"), flips, float("inf")
    return err, err / rms, flips, erms / rms


def check_family(fam, be, opt, workdir, log):
    import torch
    block, cfg = fam.make()
    block.eval()
    H = cfg.hidden_size
    E = (fam.experts(block) if fam.experts else
         block.experts.fc1.weight.shape[0] if fam.layout == "concat_t_fc" else block.experts.num_experts)
    K = fam.top_k(cfg)
    F = expert_ffn(fam, block)
    tokens = max(opt.tokens)
    seed = opt.seed + zlib.crc32(fam.name.encode())
    init_params(block, H, seed, fam.sel_bias_std)
    if fam.post_init:
        fam.post_init(block, torch.Generator().manual_seed(seed + 3))
    if fam.hash:  # the frozen token -> experts table (repeats within a row allowed) and the tokens' ids
        gh = torch.Generator().manual_seed(seed + 2)
        tid2eid = block.gate.tid2eid
        tid2eid.copy_(torch.randint(0, E, tuple(tid2eid.shape), generator=gh))
        fam.ids = torch.randint(0, tid2eid.shape[0], (tokens,), generator=gh)
    # The model dtype is bf16, except what the model class keeps in fp32 as
    # loaded checkpoints do (DeepSeek-V3's and GLM's e_score_correction_bias,
    # _keep_in_fp32_modules_strict; ERNIE's is a parameter, not a buffer).
    named = list(block.named_buffers()) + list(block.named_parameters())
    # (a keep entry with a dot names one tensor: "gate.weight", the fp32 router weight of the fp32 families)
    kept = {n: b.detach().clone() for n, b in named if n.split(".")[-1] in fam.keep or n in fam.keep}
    b16 = block.to(torch.bfloat16)
    for n, v in kept.items():
        mod = b16.get_submodule(n.rsplit(".", 1)[0]) if "." in n else b16
        leaf = n.split(".")[-1]
        if isinstance(getattr(mod, leaf), torch.nn.Parameter):
            v = torch.nn.Parameter(v, requires_grad=False)
        setattr(mod, leaf, v)
    b32 = copy.deepcopy(b16).float()   # the same bf16 values, computed in fp32
    if fam.copy32:
        fam.copy32(b32)
    name = "hf_" + re.sub(r"\W", "_", fam.name)
    spec_path = os.path.join(workdir, name + ".moe")

    # Which spec this build can load: all the model's keys first; each key
    # the loader calls unknown is left out and the spec tried again, to name
    # them all. Then: without router.group_topk only where the old rule
    # (top_k / topk_groups) is the same number; without `shared`, the routed
    # part alone is checked; any other missing key skips the family.
    drop, missing, with_shared, mode = [], [], True, "full"
    while True:
        with open(spec_path, "w") as f:
            f.write(spec_text(fam, name, E, K, fam.latent or H, F, tokens, with_shared, drop))
        msg = be.load(spec_path)
        if msg is None:
            break
        key = unknown_key(msg)
        if key is None or key in missing:
            return {"status": "FAIL", "why": "the spec did not load: " + msg}
        missing.append(key)
        if key.split(".")[0] == "shared":
            with_shared, mode = False, "routed part"
        else:
            drop.append(key)
    notes = []
    if fam.in_dtype:
        notes.append("routes in the model's dtype: the bf16 block held to the fp32 copy's gates, the fp32 copy "
                     "reported, not gated")
    if "router.group_topk" in missing:
        gk = int(re.search(r"group_topk = (\d+)", fam.spec).group(1))
        tg = int(re.search(r"topk_groups = (\d+)", fam.spec).group(1))
        if K % tg or K // tg != gk:
            return {"status": "skipped", "why": "needs %s (router.group_topk = %d; this build's rule would take "
                    "top_k/topk_groups = %s)" % (", ".join(missing), gk, K // tg if K % tg == 0 else "refused")}
        notes.append("without router.group_topk (this build's rule gives the same number)")
    others = [k for k in missing if k != "router.group_topk" and k.split(".")[0] != "shared"]
    if others:
        return {"status": "skipped", "why": "needs %s" % ", ".join(missing)}
    if not with_shared and fam.shared:
        notes.append("routed part only: the shared expert needs `shared` (not in this build)")

    results = []
    HX = fam.latent or H   # the experts' width (the spec's hidden): a latent MoE's latent
    t = convert(fam, b16, E, HX, F)
    if with_shared and fam.shared:
        t = convert_shared(fam, b16, t)
    be.open(spec_path, t, tokens)
    try:
        g = torch.Generator().manual_seed(seed + 1)
        x_all = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
        with torch.no_grad():
            for T in opt.tokens:
                x = x_all[:T].contiguous()
                fwd = block_forward if with_shared else block_routed
                r16, r32 = fwd(fam, b16, x), fwd(fam, b32, x.float())
                i16, i32 = block_route(fam, b16, x)[1], block_route(fam, b32, x.float())[1]
                given = block.gate.tid2eid[fam.ids[:T]].to(torch.int32).contiguous() if fam.hash else None
                if fam.inputs:  # the experts' x and the router's own input, from r = x as the bf16 block makes them
                    xm, rx = (v.contiguous() for v in fam.inputs(b16, x))
                    y, idx = be.run(xm, E, K, router_x=rx)
                    if fam.outputs:  # the rest of the block around moegen's part, in fp32 on the same values
                        y = fam.outputs(b32, x.float(), y.float()).to(torch.bfloat16)
                else:
                    y, idx = be.run(x, E, K, given) if fam.hash else be.run(x, E, K)
                e32 = compare(y, idx, r32, i32)
                e16 = compare(y, idx, r16, i16)
                # the block's own bf16 rounding, for scale: bf16 block against its fp32 copy
                eb = compare(r16, i16, r32, i32)
                if fam.in_dtype:  # routed as the model runs in bf16: the bf16 block is the one to match
                    ok = e16[1] <= TOL_FP32 and e16[3] <= TOL_RMS_FP32 and e16[2] <= FLIPS_FP32(T)
                else:
                    ok = (e32[1] <= TOL_FP32 and e32[3] <= TOL_RMS_FP32 and e32[2] <= FLIPS_FP32(T)
                          and e16[1] <= TOL_BF16)
                results.append((T, e32, e16, eb, ok))
    finally:
        be.close()
    if getattr(be, "packed_on", None):
        notes.append("weights packed on the " + be.packed_on)
    st = "ok" if all(r[4] for r in results) else "FAIL"
    return {"status": st, "mode": mode, "results": results, "why": "; ".join(notes)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["gpu", "cpu"], default=None,
                    help="gpu (libmoegen.so; the default when torch sees CUDA) or cpu (the C reference)")
    ap.add_argument("--families", default="", help="comma-separated names (default: all; --list shows them)")
    ap.add_argument("--tokens", default="1,37,512")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", default=None, help="also write the report here (default build/check_models.<backend>.log)")
    ap.add_argument("--list", action="store_true")
    opt = ap.parse_args()
    if opt.list:
        for f in FAMILIES:
            print("%-16s %s" % (f.name, f.model))
        return 0
    try:
        opt.tokens = [int(v) for v in opt.tokens.split(",") if v]
        assert opt.tokens and all(v >= 1 for v in opt.tokens)
    except (ValueError, AssertionError):
        ap.error("--tokens: a comma-separated list of positive integers")
    names = [n for n in opt.families.split(",") if n]
    known = [f.name for f in FAMILIES]
    bad = [n for n in names if n not in known]
    if bad:
        ap.error("unknown families %s; known: %s" % (", ".join(bad), ", ".join(known)))
    fams = [f for f in FAMILIES if not names or f.name in names]

    import torch
    import transformers
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    backend = opt.backend or ("gpu" if torch.cuda.is_available() else "cpu")
    log_path = opt.log or os.path.join(ROOT, "build", "check_models.%s.log" % backend)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    logf = open(log_path, "w")

    def log(line=""):
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    try:
        be = (GpuBackend if backend == "gpu" else CpuBackend)(opt)
    except (RuntimeError, OSError) as e:
        log("check_models: %s" % e)
        return 1
    try:  # the GPU machine's copy of the tree may have no git
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = ""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    log("check_models %s: moegen %s (%s) against transformers %s, torch %s; tokens %s; %s UTC" % (
        backend, rev or "?", be.name, transformers.__version__, torch.__version__,
        ",".join(map(str, opt.tokens)), now))
    log("errors are max|moegen - block| and that over RMS(block), on the tokens routed alike; "
        "flips = tokens whose expert set differs")
    log("rel = max error / RMS(block), rms = RMS(error) / RMS(block); tolerance: against the fp32 copy "
        "rel <= %g, rms <= %g, flips <= max(1, T/256); against the bf16 block rel <= %g (its flips are "
        "bf16 near-ties: reported, not gated)" % (TOL_FP32, TOL_RMS_FP32, TOL_BF16))
    log("%-16s %5s | %-33s | %-24s | %-14s |" % ("family", "T", "moegen vs fp32 copy", "moegen vs bf16 block",
                                                 "bf16 blk vs fp32"))
    log("%-16s %5s | %8s %8s %8s %5s | %8s %8s %5s | %8s %5s |" % ("", "", "abs", "rel", "rms", "flips", "abs", "rel",
                                                                "flips", "rel", "flips"))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="check_models.") as workdir:
        for fam in fams:
            try:
                r = check_family(fam, be, opt, workdir, log)
            except Exception as e:  # report, then go on with the other families
                import traceback
                r = {"status": "FAIL", "why": "%s: %s" % (type(e).__name__, e)}
                logf.write(traceback.format_exc())
            if "results" not in r:
                log("%-16s %s: %s" % (fam.name, r["status"], r["why"]))
                failed += r["status"] == "FAIL"
                continue
            for T, e32, e16, eb, ok in r["results"]:
                log("%-16s %5d | %8.2e %8.2e %8.2e %5d | %8.2e %8.2e %5d | %8.2e %5d | %s" % (
                    fam.name, T, e32[0], e32[1], e32[3], e32[2], e16[0], e16[1], e16[2], eb[1], eb[2],
                    "ok" if ok else "FAIL"))
            if r["why"]:
                log("%-16s   (%s)" % ("", r["why"]))
            failed += r["status"] == "FAIL"
    log("check_models: %d of %d families failed; log %s" % (failed, len(fams), log_path))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
