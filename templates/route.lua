@ -- route.lua — the router: logits x·Wrᵀ on tensor cores, scores (softmax,
@ -- sigmoid or sqrt(softplus), fp32), optional selection bias and group-limited top-k, the
@ -- top-k, weights (renormalized, scaled) and per-expert counts
@ -- (docs/DESIGN.md, "Routing, exactly").
@ --
@ -- One block routes p.per_block tokens. Phase 1 computes their logits
@ -- [T, E] with mma.sync m16n8k16 as a small GEMM whose tiling comes from
@ -- gen/family_route.c (route_tiling, its one home: p.wn, p.nt, p.npass,
@ -- p.bk, p.stages, p.ldl, p.smem). A stage holds the block's T x rows and
@ -- one pass's EP = WN*NT*8 router rows, BK columns each (rows of BK + 8
@ -- halves, so the eight 16-byte rows of an ldmatrix hit distinct banks),
@ -- filled by cp.async in a ring of S stages (out-of-range rows and columns
@ -- read as zeros); every warp reads its fragments from there with
@ -- ldmatrix, so one load of a router row serves all T tokens and many
@ -- bytes are in flight per SM whatever the token count. Warp (wn, wk)
@ -- owns NT n8 tiles of the pass's columns for all T rows and the k16 steps
@ -- wk, wk + WK, ... of each stage (split-K when E is small, summed in smem
@ -- in wk order: the same sum on every run). Experts beyond EP are done in
@ -- further passes over H. The logits land in smem (fp32, [T, LDL]); with
@ -- one pass they reuse the stage ring.
@ -- For few tokens the grid splits H across gridDim.y blocks per token block
@ -- (gen/launch_geom.h, moe_route_split): block y runs chunks
@ -- [y*NCH/Y, (y+1)*NCH/Y), writes its partial logits to route_part, and
@ -- takes a ticket (counts[E + M + blockIdx.x], after every weight slot's
@ -- count, zeroed with them); the last block of the token block sums the
@ -- partials, G threads per logit when the logits alone would leave threads
@ -- idle, in a fixed order (the same sum whichever block is last), and goes
@ -- on to phase 2 alone. With more logits than threads and the columns a
@ -- multiple of 4, partials move as float4s (four logits of one token): the
@ -- split blocks write them 16 bytes at a time, and the last block's
@ -- threads issue four splits' loads of their float4s together (the sum per
@ -- logit still over the splits in order from 0).
@ --
@ -- Few tokens (a block with at most 8 of them, the call's choice at run time:
@ -- decode): phase 1 stages nothing. A warp's mma.sync reads its operands
@ -- from registers: for a k32 step of an n8 tile lane (g, tq) loads 16
@ -- bytes of router row n0 + g and of x row g, columns k + 8tq .. k + 8tq
@ -- + 7, and the mma's k order is a permutation of the step's 32 columns
@ -- (pairs 0, 1 the first k16's, pairs 2, 3 the second's; the same for A
@ -- and B), so the products summed are the dot product's. Warp (wn, wk)
@ -- takes n8 tiles wn, wn + DWN, ... and k32 steps wk, wk + DWK, ... of
@ -- the block's columns with two tiles' and eight steps' loads in flight;
@ -- k-split warps (DWK > 1: fewer tiles than warps) leave their sums in
@ -- scratch, added in wk order. The sums' order differs from the staged
@ -- path's, so a token's logits can differ in the last bits with the
@ -- number of tokens in its block of T (at most 8, or more: a decode call,
@ -- or a larger call's last block); each is the same on every run.
@ -- Not emitted with fp32 router weights (their three parts need the
@ -- staged split) or given weights (no logits).
@ --
@ -- Phase 2: a warp per token. Lane l holds experts l + 32i (i < VPL) as
@ -- order-preserving keys; every selection round is a warp max over
@ -- 64-bit keys (score bits << 32 | ~expert), so ties go to the lower
@ -- expert (or group) index; over the whole warp that max is two redux
@ -- instructions (the high words' max, then the low words' among the
@ -- lanes that hold it) instead of a ten-shuffle tree. Group scores use
@ -- one of three layouts, chosen from the group size: a group spans whole
@ -- 32-expert slots, a
@ -- group is a lane segment within a slot, or the general case. Counts
@ -- are gathered per block in smem, then added to counts[] once per expert.
@ --
@ -- A shared expert (p.shared_slots = M > 0, docs/DESIGN.md, "Shared
@ -- experts"): every token also gets entries K .. K+M-1, the shared
@ -- expert's weight slots E .. E+M-1, with weight g(x): 1, or, with
@ -- p.shared_gate, sigmoid of one more logit column (column E, whose mma
@ -- row reads w_gate instead of a router row). topk_idx/topk_w are then
@ -- [T, K+M]; a block adds its token count to each shared slot's count.
@ --
@ -- Fused (fuse.mode > 0: calls of few tokens, gen/launch_geom.h,
@ -- moe_route_fuse_mode; the host's choice by the call's token count): after
@ -- its counts, the last block of each token block takes one more ticket
@ -- (counts[slots + p.fuse_ticket]); the last of them to finish runs the
@ -- permute plan (the prelude's moe_plan_block, what permute_plan runs) with
@ -- all its threads on the dynamic shared memory, which phase 2 is done
@ -- with; with mode 2 it then scatters the x rows as permute_scatter does:
@ -- each entry's row (the expert's offset + a shared-memory cursor) to
@ -- row_of, then a warp per routed row copies the token's x row (x·w with
@ -- router.apply = "input"), and cursor[] ends as the scatter leaves it
@ -- (each slot's count). With fp8 weights mode 2 is a 1-token call's alone
@ -- (gen/launch_geom.h, moe_route_fuse_scatter; not with router.apply =
@ -- "input" or given ids): its row quantized, as permute_scatter does, by
@ -- the warps phase 2 leaves idle, into fuse.xs (e4m3 bytes) and fuse.xsc.
@ -- permute_plan (and permute_scatter)
@ -- are then not launched. A call of one token (not with given ids, which
@ -- may repeat) plans without a scan: its selected slots (s_sel, distinct)
@ -- take one row block each in slot order; and with mode 2 (not with
@ -- router.apply = "input") its x row is copied to rows r * align, r <
@ -- ENTRIES, by the warps phase 2 leaves idle, so the tail writes the row
@ -- map only.
@ --
@ -- Zero-computation experts (p.spec.zero_experts = Z > 0, docs/DESIGN.md,
@ -- "Zero experts"): the router scores NS = E + Z experts (logit columns,
@ -- router rows, biases and selection over all NS); a selected index >= E
@ -- is written to topk_idx as it is, with its weight, and counts no slot.
@ -- The fused scatter gives such an entry the row offsets[SLOTS] + t and
@ -- copies x[t] there once per token (permute_scatter's rule), which
@ -- combine reads as the entry's output.
@ --
@ -- Given routing (p.given: router.select = "given", docs/DESIGN.md "Given
@ -- routing"): the kernel takes given_ids (int32 [T, K], the caller's) after
@ -- its other parameters, and phase 2 reads lane r's expert from there in
@ -- place of the selection; an id outside 0..E-1 is dropped: the entry goes
@ -- to expert 0 with weight 0 (renormalization sums the others), and the
@ -- warp adds the number of such ids to counts[SLOTS + p.bad_ids]. The
@ -- weight is the score at the id, as for a selected expert; with score
@ -- "given" the kernel also takes given_w (fp32 [T, K]) and the weight is
@ -- its value (then renormalized, scaled), and phase 1 and the H split are
@ -- not emitted: no logits, router_w never read (the grid has no split).
@ --
@ -- The router's own input (router.input = "separate", docs/DESIGN.md "The
@ -- router's own input"): the kernel takes router_x (the dtype, [T, HR]) after
@ -- the parameters above, and phase 1 reads it in place of x (the fused
@ -- scatter still copies x); HR, the router's width, is router.hidden where
@ -- it is set (a latent MoE: x is the experts' latent, router_x the model's
@ -- hidden states, router_w [E, HR]), else H. A per-expert scale (router.expert_scale): it
@ -- takes expert_scale (fp32 [E]) after that, and each routed entry's final
@ -- weight (renormalized, scaled) is multiplied by expert_scale[expert].
@ --
@ -- fp32 router weights (router.weight_dtype = "fp32", docs/DESIGN.md "fp32
@ -- router weights"): wr is fp32, and each weight is split when its stage
@ -- is loaded into three dtype parts, hi = R(w), mid = R(w - hi), lo =
@ -- R(w - hi - mid) (R: rounded to the dtype), whose sum is w (bf16: 8 bits
@ -- each, the fp32 mantissa's 24); the mma runs over MC = 3·EL columns,
@ -- part j of logit column e in column j·EL + e, every product x·part exact
@ -- and summed in fp32, and the three columns are added (hi + mid, then lo)
@ -- before phase 2. The router rows are loaded through registers (the split
@ -- needs them); the x rows still by cp.async.
@ --
@ -- A training spec (p.spec.training) takes one more parameter, logits_out
@ -- (fp32 [T, E], NULL in a plain forward): phase 2 stores each token's
@ -- logits there (logit_bias included, and capped where
@ -- router.logit_softcap = c: c·tanh(l / c), the logit every score reads),
@ -- which the backward's router gradient reads (templates/bwd.lua).
@ local M = {}
@
@ local function cdiv(a, b) return (a + b - 1) // b end
@
@ -- Check p and derive the route kernel's constants. Returns a table. The
@ -- logit phase's tiling is p's (gen/family_route.c); the stage ring and
@ -- the logits must fit p.smem, the dynamic shared memory the plan gives.
@ function M.config(p)
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 0) end
@   end
@   local c = {}
@   c.E, c.K, c.H = p.E, p.K, p.H
@   c.HR = p.router_hidden                 -- the logits' k: router_x's width (router.hidden), else H
@   c.Z = p.spec.zero_experts or 0         -- zero experts: scored as E .. NS-1, no weight slot
@   c.NS = c.E + c.Z                       -- scored experts
@   c.T, c.threads = p.per_block, p.threads
@   need(c.T >= 16 and c.T % 16 == 0, "per_block must be a multiple of 16 (m16 tiles)")
@   need(c.threads >= 32 and c.threads % 32 == 0, "threads must be a multiple of 32")
@   need(c.E >= 1 and c.NS <= 1024, "routing supports 1 to 1024 experts (the zero experts included)")
@   need(c.K >= 1 and c.K <= 32 and c.K <= c.E, "top_k must be 1..32 and at most experts")
@   need(c.H >= 8 and c.H % 8 == 0, "hidden must be a multiple of 8")
@   need(c.HR >= 8 and c.HR % 8 == 0 and (c.HR == c.H or p.spec.router.input == "separate"),
@        "router.hidden must be a multiple of 8, and other than hidden only with router.input = separate")
@   c.ptx_type = ({ bf16 = "bf16", fp16 = "f16" })[p.dtype] or error(p.kernel .. ": unknown dtype " .. tostring(p.dtype), 0)
@   c.NW = c.threads // 32
@   c.MT = c.T // 16                       -- m16 tiles (all in every warp)
@   c.M = p.shared_slots or 0              -- the shared expert's slots E .. E+M-1
@   c.gate = p.shared_gate and true or false -- its gate logit: column E
@   c.KE = c.K + c.M                       -- entries per token
@   need(c.KE <= 32, "top_k + shared slots must be at most 32 (a lane each)")
@   c.EL = p.router_columns                -- logit columns: the scored experts, and the shared gate's
@   c.fp32w = p.spec.router.weight_dtype == "fp32"   -- fp32 router weights: three dtype parts a weight
@   c.MC = p.mma_columns                   -- the mma's columns: EL, or 3·EL with fp32 router weights
@   need(c.MC == c.EL * (c.fp32w and 3 or 1), "mma_columns must be the logit columns (x3 with fp32 weights)")
@   need(not c.fp32w or (not c.gate and not p.spec.training), "fp32 router weights: no shared gate, no training")
@   need(c.EL == c.NS + (c.gate and 1 or 0), "router_columns must be the scored experts and the shared gate")
@   need(c.Z == 0 or (c.M == 0 and not p.spec.training and p.spec.router.apply ~= "input"),
@        "zero experts: no shared expert, training or apply = input (gen/spec_check.c)")
@   -- the tiling (gen/family_route.c, route_tiling)
@   c.WN, c.NT, c.NPASS, c.BK, c.S, c.LDL = p.wn, p.nt, p.npass, p.bk, p.stages, p.ldl
@   need(c.WN and c.NT and c.NPASS and c.BK and c.S and c.LDL, "the plan gives no route tiling")
@   need(c.NW % c.WN == 0, "wn must divide the warps")
@   c.WK = c.NW // c.WN                    -- the rest split each stage's k16 steps
@   need(c.BK % 16 == 0 and (c.BK // 16) % c.WK == 0, "bk must be k16 steps the warps split evenly")
@   need(c.S >= 2, "stages must be at least 2")
@   c.EP = c.WN * c.NT * 8                 -- logit columns per pass
@   need(c.NPASS * c.EP >= c.MC, "the passes must cover every mma column")
@   need(c.LDL >= c.NPASS * c.EP and c.LDL % 4 == 0, "ldl must hold every pass's columns")
@   c.STR = c.BK + 8                       -- smem row stride, halves
@   c.stage = (c.T + c.EP) * c.STR * 2     -- bytes
@   c.ring = c.S * c.stage
@   c.lbytes = c.T * c.LDL * 4
@   if c.NPASS == 1 then
@     c.loff, c.smem = 0, math.max(c.ring, c.lbytes)
@   else
@     c.loff, c.smem = c.ring, c.ring + c.lbytes
@   end
@   need(p.smem == c.smem, string.format("the plan gives %d bytes of shared memory; the tiling needs %d", p.smem, c.smem))
@   -- the k-split warps' fragments summed in one step (WK > 1): slices 1..WK-1 of [T][EP] floats past the
@   -- logits (one pass) or at the ring's start (more passes: the ring is free by then), where they fit
@   c.WKS = c.WK > 1 and (c.NPASS == 1 and c.lbytes + (c.WK - 1) * c.T * c.EP * 4 <= c.smem or
@                         c.NPASS > 1 and (c.WK - 1) * c.T * c.EP * 4 <= c.ring)
@   c.soff = c.NPASS == 1 and c.lbytes or 0
@   -- a block of at most 8 tokens: the logits from mma fed straight from registers ("Few tokens"); n8 tiles
@   -- over the logit columns split over DWN warps, the block's k32 steps over DWK = NW / DWN, whose sums meet in
@   -- scratch past the logits' 8 rows (one pass: the logits start the smem) or at the ring's start
@   c.DNT = cdiv(c.EL, 8)
@   c.DWN = math.min(c.NW, c.DNT)
@   while c.NW % c.DWN ~= 0 do c.DWN = c.DWN - 1 end
@   c.DWK = c.NW // c.DWN
@   c.dscr = c.loff == 0 and 8 * c.LDL * 4 or 0
@   c.dot = not c.fp32w and p.score ~= "given" and (c.DWK == 1 or
@                            c.dscr + c.DWK * 8 * c.DNT * 8 * 4 <= (c.loff == 0 and c.smem or c.loff))
@   -- routing
@   c.softmax = p.score == "softmax"
@   need(c.softmax or p.score == "sigmoid" or p.score == "sqrtsoftplus" or p.score == "sparsemixer" or
@        p.score == "given", "unknown router score " .. tostring(p.score))
@   -- given routing: the caller's ids (p.given), and with score "given" its weights (no logits)
@   c.given, c.given_w = p.given and true or false, p.score == "given"
@   need(c.given or not c.given_w, "score \"given\" needs the caller's ids (router.select = \"given\")")
@   need(not c.given or (not p.bias and (p.groups or 1) <= 1 and p.score ~= "sparsemixer" and c.Z == 0 and
@                        p.spec.router.apply ~= "input"),
@        "given routing: no selection bias, groups, sparsemixer, zero experts or apply = input (gen/spec_check.c)")
@   need(not c.given_w or (not c.gate and not p.logit_bias and not p.softcap and not p.spec.training),
@        "given weights: no logits (no shared gate, logit_bias, softcap or training; gen/spec_check.c)")
@   -- the router's own input and the per-expert scale (Gemma 4)
@   c.own_input, c.escale = p.spec.router.input == "separate", p.spec.router.expert_scale and true or false
@   need(not c.own_input or not c.given_w, "router.input = separate needs logits (not score \"given\")")
@   need(not c.escale or (not c.given_w and c.Z == 0), "expert_scale: not with given weights or zero experts")
@   need(not (c.escale and c.given and p.spec.training), "expert_scale with given ids: inference only")
@   c.bad_ids = p.bad_ids
@   need(not c.given or c.bad_ids, "the plan gives no place for the dropped ids' count")
@   c.sparsemixer = p.score == "sparsemixer"
@   need(not c.sparsemixer or (p.K == 2 and not p.renormalize and not p.bias and not p.logit_bias),
@        "sparsemixer: top-2 of the plain logits, not renormalized (gen/spec_check.c)")
@   c.VPL = cdiv(c.NS, 32)                 -- scored experts per lane
@   c.G = (p.groups or 1) > 1 and p.groups or 1
@   if c.G > 1 then
@     c.KG = p.topk_groups
@     need(c.E % c.G == 0, "groups must divide experts")
@     c.PG = c.E // c.G                    -- experts per group
@     need(c.KG >= 1 and c.KG <= c.G, "topk_groups must be 1..groups")
@     c.TAKE = p.group_topk                -- a group's score sums its top TAKE scores
@     need(c.TAKE and c.TAKE >= 1 and c.TAKE <= c.PG, "group_topk must be 1..experts/groups")
@     need(c.K <= c.KG * c.PG, "top_k does not fit in the kept groups")
@     if c.PG % 32 == 0 then c.glayout = "slots"
@     elseif 32 % c.PG == 0 then c.glayout = "segments"
@     else c.glayout = "general" end
@   end
@   c.scale = p.scale or 1
@   -- the fused tail: its ticket's place after the slots' counts (gen/family_route.c)
@   c.fuse_ticket = p.fuse_ticket
@   need(c.fuse_ticket, "the plan gives no fused ticket")
@   c.slots, c.entries = p.slots, p.entries
@   need(c.slots == c.E + c.M and c.entries == c.KE, "slots and entries must be the experts' and the shared slots'")
@   -- fp8 weights: the scatter quantizes; fused (mode 2) at one token alone, the row quantized by phase 2's idle
@   -- warps (gen/launch_geom.h, moe_route_fuse_scatter: not with router.apply = "input" or given ids)
@   c.fp8 = p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3"
@   c.fuse_scatter = not c.fp8 or (p.spec.router.apply ~= "input" and not c.given)
@   return c
@ end
@
@ function M.emit(p)
@ local c = M.config(p)
@ local ns = p.kernel .. "_impl"
@ local SE = c.Z > 0 and "NS" or "E"  -- scored experts (the zero experts' included)
@ local LC = c.fp32w and "MC" or c.gate and "EL" or SE  -- columns of the partial logits (the gate's, the parts')
@ local LCN = c.fp32w and c.MC or c.gate and c.EL or c.NS  -- their number
@ local V4 = LCN % 4 == 0                -- the partials move as float4s (four logits of one token)
@ local TKT = c.M > 0 and "ES" or "E" -- the counts of every weight slot come before the tickets
@ local input = p.spec.router.apply == "input"
@ -- router.logit_softcap = c: a logit (logit_bias included) becomes c·tanh(l / c), in fp32
@ local function cap(l)
@   if not p.softcap then return l end
@   return "tanhf((" .. l .. ") / " .. f32(p.softcap) .. ") * " .. f32(p.softcap)
@ end
namespace ${ns} {
constexpr int E = ${c.E}, K = ${c.K}, H = ${c.H};
constexpr int HR = ${c.HR == c.H and "H" or c.HR};   // the router's width (router.hidden, else H): router_x, router_w
@ if c.Z > 0 then
constexpr int NS = ${c.NS};          // scored experts: E routed, then ${c.Z} zero experts (no weight slot)
@ end
constexpr int T = ${c.T}, THREADS = ${c.threads}, NW = ${c.NW};
constexpr int MT = ${c.MT};          // m16 tiles: every warp covers all T tokens
constexpr int WN = ${c.WN}, WK = ${c.WK};     // warps along the pass's columns, along each stage's k16 steps
constexpr int NT = ${c.NT};          // n8 column tiles per warp per pass
constexpr int NPASS = ${c.NPASS};    // passes over H, EP columns each
constexpr int EP = WN * NT * 8;      // logit columns per pass (router rows per stage)
constexpr int BK = ${c.BK};          // H columns per stage
constexpr int S = ${c.S};            // stages in the ring
constexpr int STR = BK + 8;          // smem row stride, halves
constexpr int RS = T + EP;           // rows per stage: T x rows, then EP router rows
constexpr int STAGE = RS * STR;      // halves per stage
constexpr int KSTEPS = BK / 16;      // k16 steps per stage
constexpr int LDL = ${c.LDL};        // logits smem row stride, floats
constexpr int LOFF = ${c.loff};      // logits offset in smem, bytes
constexpr int SMEM = ${c.smem};
constexpr int NCH = (HR + BK - 1) / BK;
constexpr int LCOLS = ${c.EL};       // logit columns: the scored experts (and the shared gate)
constexpr int MC = ${c.MC};          // mma columns: LCOLS${c.fp32w and ", three times: fp32 router weights' hi, mid, lo parts" or ""}
constexpr int VPL = ${c.VPL};        // experts per lane in the top-k phase
constexpr unsigned FULL = 0xffffffffu;
constexpr int SLOTS = ${c.slots}, ENTRIES = ${c.entries};   // weight slots (counts), entries per token
constexpr int FUSE_TICKET = SLOTS + ${c.fuse_ticket};      // the fused calls' ticket in counts[]
static_assert(SMEM >= (3 * SLOTS + 1) * 4, "the fused plan's s_off, s_first, s_cur in the dynamic smem");
static_assert(KSTEPS % WK == 0 && NPASS * EP >= MC && LDL >= NPASS * EP, "tiling");
static_assert(SMEM == (NPASS == 1 ? (S * STAGE * 2 > T * LDL * 4 ? S * STAGE * 2 : T * LDL * 4)
                                  : S * STAGE * 2 + T * LDL * 4), "shared memory: gen/family_route.c's tiling");
static_assert((STR * 2) % 16 == 0 && LOFF % 16 == 0, "smem alignment");
@ if c.G > 1 then
constexpr int G = ${c.G}, KG = ${c.KG}, PG = ${c.PG}, TAKE = ${c.TAKE};
@ end
@ if c.M > 0 then
constexpr int M = ${c.M}, KE = ${c.KE};   // shared expert slots E .. E+M-1; entries per token
constexpr int ES = E + M, EL = ${c.EL};   // weight slots (counts); logit columns (column E: the gate, if any)
@ end

/* D = A(16x16, row) * B(16x8, col) + D, fp32 accumulate. */
static __device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.${c.ptx_type}.${c.ptx_type}.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* Stage columns [chunk*BK, +BK) of the block's T x rows (rows 0..T-1) and
 * of the logit columns [nbase, nbase + EP) of the router (rows T..RS-1:
 * router rows, ${c.gate and "w_gate for column E, " or ""}zeros past the last column); x rows past
 * `tokens` and columns past H are zero-filled and read nothing. */
static __device__ __forceinline__ void load_stage(moe_half_t *dst, const moe_half_t *__restrict__ x,
                                                  const ${c.fp32w and "float" or "moe_half_t"} *__restrict__ wr,
                                                  ${c.gate and "const moe_half_t *__restrict__ wg, " or ""}int tok0, int tokens,
                                                  int chunk, int nbase, int tid) {
    constexpr int VR = BK / 8, NV = RS * VR;
#pragma unroll
    for (int it = 0; it < (NV + THREADS - 1) / THREADS; ++it) {
        const int v = tid + it * THREADS;
        if (NV % THREADS == 0 || v < NV) {
            const int r = v / VR, q = v % VR;
            const int k = chunk * BK + q * 8;
            const moe_half_t *src;
            bool ok;
            if (r < T) {
                const int tok = tok0 + r;
                ok = tok < tokens && k < HR;
                src = x + (long long)tok * HR + k;
            } else {
                const int col = nbase + r - T;
@ if c.fp32w then
                /* fp32 weights: part col / LCOLS of router row col % LCOLS, split here (8 floats -> 8 halves) */
                uint4 h = make_uint4(0u, 0u, 0u, 0u);
                if (col < MC && k < HR) {
                    const int part = col / LCOLS;
                    const float4 *w4 = reinterpret_cast<const float4 *>(wr + (long long)(col % LCOLS) * HR + k);
                    const float4 a = __ldg(w4), b = __ldg(w4 + 1);
                    const float w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    float p[8];
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const float hi = moe_round(w[j]), mid = moe_round(w[j] - hi);
                        p[j] = part == 0 ? hi : part == 1 ? mid : moe_round(w[j] - hi - mid);
                    }
                    h = make_uint4(moe_pack2(p[0], p[1]), moe_pack2(p[2], p[3]), moe_pack2(p[4], p[5]),
                                   moe_pack2(p[6], p[7]));
                }
                *reinterpret_cast<uint4 *>(dst + r * STR + q * 8) = h;
                continue;
@ else
                ok = col < LCOLS && k < HR;
@   if c.gate then
                src = (col < E ? wr + (long long)col * HR : wg) + k;
@   else
                src = wr + (long long)col * HR + k;
@   end
@ end
            }
            moe_cp_async16(dst + r * STR + q * 8, ok ? src : x, ok ? 16 : 0);
        }
    }
}

@ if c.dot then
constexpr int DNT = ${c.DNT}, DWN = ${c.DWN}, DWK = ${c.DWK};   // few tokens: n8 tiles; warps along them, along k
constexpr int DSCR = ${c.dscr};      // few tokens: the k-split sums' scratch, bytes into smem

/* Few tokens ("Few tokens" above): the logits of the block's nvalid <= 8 tokens over columns [k0, k1) of HR, into
 * lsm rows 0 .. nvalid-1 (columns 0 .. DNT*8-1; past LCOLS zeros); every thread of the block calls it. */
static __device__ __forceinline__ void logits_few(float *lsm, float *scr, const moe_half_t *__restrict__ xr,
                                                  const moe_half_t *__restrict__ wr, ${c.gate and "const moe_half_t *__restrict__ wg, " or ""}int tok0,
                                                  int nvalid, int k0, int k1, int tid) {
    constexpr int TB = 2, KB = 8;   // tiles and k32 steps whose loads are in flight together
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const int wn = warp % DWN, wk = warp / DWN;
    const int nks = (k1 - k0 + 31) / 32;
    const bool xrow = g < nvalid;   // rows g + 8 (a1, a3) are never tokens
    const moe_half_t *xg = xr + (long long)(tok0 + (xrow ? g : 0)) * HR + k0 + 8 * tq;
#pragma unroll 1
    for (int j0 = wn; j0 < DNT; j0 += DWN * TB) {
        float acc[TB][4];
        const moe_half_t *wrow[TB];
        bool wok[TB];
#pragma unroll
        for (int b = 0; b < TB; ++b) {
            const int n = (j0 + b * DWN) * 8 + g;
            wok[b] = j0 + b * DWN < DNT && n < LCOLS;
@   if c.gate then
            wrow[b] = (wok[b] && n == E ? wg : wr + (long long)(wok[b] ? n : 0) * HR) + k0 + 8 * tq;
@   else
            wrow[b] = wr + (long long)(wok[b] ? n : 0) * HR + k0 + 8 * tq;
@   end
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[b][r] = 0.f;
        }
#pragma unroll 1
        for (int s0 = wk; s0 < nks; s0 += DWK * KB) {
            uint4 xv[KB], wv[TB][KB];
#pragma unroll
            for (int i = 0; i < KB; ++i) {
                const int s = s0 + i * DWK;
                const bool in = s < nks && k0 + s * 32 + 8 * tq < k1;   // HR % 8 == 0: a 16-byte run is in or out
                xv[i] = in && xrow ? __ldg(reinterpret_cast<const uint4 *>(xg + s * 32)) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int b = 0; b < TB; ++b)
                    wv[b][i] = in && wok[b] ? __ldg(reinterpret_cast<const uint4 *>(wrow[b] + s * 32))
                                            : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int i = 0; i < KB; ++i) {
                const unsigned a0[4] = {xv[i].x, 0u, xv[i].y, 0u}, a1[4] = {xv[i].z, 0u, xv[i].w, 0u};
#pragma unroll
                for (int b = 0; b < TB; ++b) {
                    const unsigned b0[2] = {wv[b][i].x, wv[b][i].y}, b1[2] = {wv[b][i].z, wv[b][i].w};
                    mma(acc[b], a0, b0);
                    mma(acc[b], a1, b1);
                }
            }
        }
        /* d0, d1: token g, columns 2tq, 2tq + 1 of the tile (d2, d3: rows g + 8, none) */
#pragma unroll
        for (int b = 0; b < TB; ++b) {
            const int j = j0 + b * DWN;
            if (j < DNT && xrow)
                *reinterpret_cast<float2 *>((DWK == 1 ? lsm + g * LDL : scr + (wk * 8 + g) * (DNT * 8)) + j * 8 + 2 * tq) =
                    make_float2(acc[b][0], acc[b][1]);
        }
    }
    if (DWK > 1) {
        __syncthreads();
        for (int i = tid; i < nvalid * DNT * 8; i += THREADS) {
            const int t = i / (DNT * 8), col = i % (DNT * 8);
            float v = scr[t * (DNT * 8) + col];
#pragma unroll
            for (int w = 1; w < DWK; ++w) v += scr[(w * 8 + t) * (DNT * 8) + col];
            lsm[t * LDL + col] = v;
        }
    }
}

@ end
/* A ticket: atomically add 1 at p (gpu scope) and return the old value, as a release of every write the block made
 * before its barrier and an acquire of every write released before the tickets taken earlier (a block's threads
 * meet at a barrier, then thread 0 takes it: the barrier orders their writes before its release, and the barrier
 * after it orders its acquire before their reads). No fence.sc: the split and fused tails' one round trip. */
static __device__ __forceinline__ int take_ticket(int *p) {
#if defined(__CUDA_ARCH__)
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(p) : "memory");
    return old;
#else
    return atomicAdd(p, 1);
#endif
}

/* One int copied from global to shared memory by cp.async (4 bytes, .ca): the thread goes on; the copy is complete
 * after its moe_cp_async_wait<0>() (the host build copies at once). */
static __device__ __forceinline__ void slot_async(int *s, const int *g) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(moe_smem_addr(s)), "l"(g) : "memory");
#else
    *s = *g;
#endif
}

/* Order-preserving float bits (larger float, larger unsigned), and back. */
static __device__ __forceinline__ unsigned ord_of(float f) {
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float float_of(unsigned o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

/* Selection keys: larger is better; equal scores prefer the lower index.
 * 0 means "no candidate". */
static __device__ __forceinline__ unsigned long long make_key(unsigned ord, int idx) {
    return ((unsigned long long)ord << 32) | (unsigned)~idx;
}
static __device__ __forceinline__ int key_idx(unsigned long long k) { return (int)~(unsigned)k; }
static __device__ __forceinline__ float key_val(unsigned long long k) { return float_of((unsigned)(k >> 32)); }

/* Max of k over aligned groups of W lanes (W = 32: the whole warp). */
template <int W> static __device__ __forceinline__ unsigned long long key_max(unsigned long long k) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
        const unsigned long long other = __shfl_xor_sync(FULL, k, o);
        k = other > k ? other : k;
    }
    return k;
}
/* The whole warp: two redux instructions, the high words' max, then the
 * low words' max among the lanes that hold it. */
template <> __device__ __forceinline__ unsigned long long key_max<32>(unsigned long long k) {
    const unsigned hi = __reduce_max_sync(FULL, (unsigned)(k >> 32));
    const unsigned lo = __reduce_max_sync(FULL, (unsigned)(k >> 32) == hi ? (unsigned)k : 0u);
    return ((unsigned long long)hi << 32) | lo;
}

/* This lane's best key among slots i with bit i of mask set; slot i is index lane + 32i. */
template <int N>
static __device__ __forceinline__ unsigned long long lane_best(const unsigned (&ord)[N], unsigned mask, int lane) {
    unsigned long long best = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const unsigned long long k = ((mask >> i) & 1u) ? make_key(ord[i], lane + 32 * i) : 0ull;
        best = k > best ? k : best;
    }
    return best;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}
@ if c.fp8 and c.fuse_scatter then
/* fp8: a one-token call's row quantized here (mode 2), by permute_scatter's rule (templates/permute.lua) */
@   import("permute").quantizer(p)
@ end
}  // namespace ${ns}

extern "C" __global__ void __launch_bounds__(${c.threads})
${p.kernel}(const moe_half_t *__restrict__ x, const ${c.fp32w and "float" or "moe_half_t"} *__restrict__ wr, const float *__restrict__ sel_bias,
            const float *__restrict__ logit_bias, int tokens, int *__restrict__ topk_idx, float *__restrict__ topk_w,
            int *__restrict__ counts, float *__restrict__ route_part, const moe_route_fuse_t fuse${c.gate and ", const moe_half_t *__restrict__ shared_gate" or ""}${p.spec.training and ", float *__restrict__ logits_out" or ""}${c.given and ", const int *__restrict__ given_ids" or ""}${c.given_w and ", const float *__restrict__ given_w" or ""}${c.own_input and ", const moe_half_t *__restrict__ router_x" or ""}${c.escale and ", const float *__restrict__ expert_scale" or ""}) {
    moe_pdl_begin();
    using namespace ${ns};
    extern __shared__ __align__(16) unsigned char moe_route_smem[];
    unsigned char *smem = moe_route_smem;
    __shared__ int s_count[SLOTS];   // this block's selections per weight slot (the plan's counts: one token block)
    __shared__ int s_slot[SLOTS];    // fused: the plan's slot_of (cp.async at the start)
@ if c.fuse_scatter then
@   if c.fp8 then
    __shared__ int s_ent[NW * ENTRIES];   // the fused scatter's entries (fp8: their rows are quantized apart)
@   else
    __shared__ int s_ent[NW * ENTRIES], s_row[NW * ENTRIES];   // the fused scatter's entries and their rows
@   end
@ end
@ if not c.given then
    __shared__ int s_sel[ENTRIES];   // the block's first token's slots (a zero expert: INT_MAX), for a 1-token plan
@ end
@ if not p.bias then
    (void)sel_bias;
@ end
@ if not p.logit_bias then
    (void)logit_bias;
@ end
@ if not c.given_w then
    moe_half_t *ring = reinterpret_cast<moe_half_t *>(smem);
    float *lsm = reinterpret_cast<float *>(smem + LOFF);
@ end
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tok0 = blockIdx.x * T;
    if (tok0 >= tokens)
        return;
    /* fused: the plan's slot_of copied into s_slot by cp.async at the start (no thread waits on it until the fused
     * tail, whose wait finds it long arrived; the staged ring's first wait may cover it too) */
    if (fuse.mode != 0)
        for (int e = tid; e < SLOTS; e += THREADS) slot_async(s_slot + e, fuse.slot_of + e);
@ if c.given_w then
    for (int e = tid; e < SLOTS; e += THREADS) s_count[e] = 0;
    __syncthreads();
    (void)wr, (void)route_part;   // the caller's weights: no logits (no phase 1, no split)
@ else
    for (int e = tid; e < SLOTS; e += THREADS) s_count[e] = 0;   // ordered before use by phase 1's barriers

    /* ---- phase 1: logits[T, E] = x[T, HR] . wr[E, HR]^T (x: router_x where the router has its own input) ---- */
    const int g = lane >> 2, tq = lane & 3;
    const int wn = warp % WN, wk = warp / WN;
    /* this block's chunks of H: all of them unless the grid splits H */
    const int c0 = (int)((long long)blockIdx.y * NCH / gridDim.y), c1 = (int)((long long)(blockIdx.y + 1) * NCH / gridDim.y);
    /* ldmatrix rows of this lane: A (x) row mt*16 + (lane & 15), column +8 for lanes 16..31; B (router) row
     * j*8 + (lane & 7) (+8 for lanes 16..31: the pair's second n8 tile), column +8 for lanes 8..15 and 24..31 */
    const int a_off = (lane & 15) * STR + (lane >> 4) * 8;
    const int b_off = (T + wn * NT * 8 + (lane & 7) + ((lane >> 4) << 3)) * STR + ((lane >> 3) & 1) * 8;
@ if c.dot then
    if (tokens - tok0 <= 8) {   // block-uniform: few tokens, no staging ("Few tokens")
        logits_few(lsm, reinterpret_cast<float *>(smem + DSCR), ${c.own_input and "router_x" or "x"}, wr, ${c.gate and "shared_gate, " or ""}tok0, tokens - tok0, c0 * BK,
                   min(c1 * BK, HR), tid);
        __syncthreads();
    } else
@ end
#pragma unroll 1
    for (int pass = 0; pass < NPASS; ++pass) {
        const int nbase = pass * EP;   // the pass's first logit column
        float acc[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int r = 0; r < 4; ++r) acc[mt][j][r] = 0.f;

#pragma unroll
        for (int s = 0; s < S - 1; ++s) {
            if (c0 + s < c1)
                load_stage(ring + s * STAGE, ${c.own_input and "router_x" or "x"}, wr, ${c.gate and "shared_gate, " or ""}tok0, tokens, c0 + s, nbase, tid);
            moe_cp_async_commit();
        }
#pragma unroll 1
        for (int c = c0; c < c1; ++c) {
            moe_cp_async_wait<S - 2>();
            __syncthreads();   // stage c is in; every warp is done with the stage refilled next
            {
                const int cn = c + S - 1;
                if (cn < c1)
                    load_stage(ring + ((cn - c0) % S) * STAGE, ${c.own_input and "router_x" or "x"}, wr, ${c.gate and "shared_gate, " or ""}tok0, tokens, cn, nbase, tid);
                moe_cp_async_commit();
            }
            const moe_half_t *st = ring + ((c - c0) % S) * STAGE;
#pragma unroll
            for (int kk = 0; kk < KSTEPS / WK; ++kk) {
                const int ks = kk * WK + wk;   // this warp's k16 step of the stage
                if (c * BK + ks * 16 < HR) {   // warp-uniform: a step wholly past HR is zeros
                    unsigned a[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
                        moe_ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3], st + a_off + mt * 16 * STR + ks * 16);
#pragma unroll
                    for (int j = 0; j + 1 < NT; j += 2) {
                        unsigned b0[2], b1[2];
                        moe_ldmatrix_x4(b0[0], b0[1], b1[0], b1[1], st + b_off + j * 8 * STR + ks * 16);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            mma(acc[mt][j], a[mt], b0);
                            mma(acc[mt][j + 1], a[mt], b1);
                        }
                    }
                    if (NT % 2) {   // the last n8 tile alone: lanes 0..15 give its rows
                        unsigned b0[2];
                        moe_ldmatrix_x2(b0[0], b0[1], st + b_off + (NT - 1) * 8 * STR + ks * 16);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) mma(acc[mt][NT - 1], a[mt], b0);
                    }
                }
            }
        }
        moe_cp_async_wait<0>();
        __syncthreads();   // the ring is free (it may hold the logits)

@ if c.WKS then
        /* fragment (mt, j): rows mt*16 + g (+8), columns wn*NT*8 + j*8 + 2tq (+1) of the pass. Warp wk's
         * fragments to slice wk (slice 0: the logits' own place; slice s > 0: [T][EP] floats at
         * smem + ${c.soff} + (s - 1) T EP 4), one barrier, then each thread adds a float4's slices in wk order
         * (slice 0 + slice 1 + ...: the order of the turn-by-turn sum, -0 + slice 0 being slice 0 itself) */
        {
            constexpr int SOFF = ${c.soff};
            float *scr = reinterpret_cast<float *>(smem + SOFF);
            float *slice = wk == 0 ? lsm + nbase : scr + (wk - 1) * (T * EP);
            const int ld = wk == 0 ? LDL : EP;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    float2 *p0 = reinterpret_cast<float2 *>(slice + (mt * 16 + g) * ld + (wn * NT + j) * 8 + 2 * tq);
                    p0[0] = make_float2(acc[mt][j][0], acc[mt][j][1]);
                    *reinterpret_cast<float2 *>(reinterpret_cast<float *>(p0) + 8 * ld) = make_float2(acc[mt][j][2], acc[mt][j][3]);
                }
            __syncthreads();
            static_assert(EP % 4 == 0 && LDL % 4 == 0 && SOFF % 16 == 0, "float4 slices");
            for (int i = 4 * tid; i < T * EP; i += 4 * THREADS) {
                float4 *dst = reinterpret_cast<float4 *>(lsm + (i / EP) * LDL + nbase + i % EP);
                float4 v = *dst;
#pragma unroll
                for (int s = 1; s < WK; ++s) {
                    const float4 q = *reinterpret_cast<const float4 *>(scr + (s - 1) * (T * EP) + i);
                    v.x += q.x, v.y += q.y, v.z += q.z, v.w += q.w;
                }
                *dst = v;
            }
            __syncthreads();
        }
@ else
        /* fragment (mt, j): rows mt*16 + g (+8), columns nbase + wn*NT*8 + j*8 + 2tq (+1); the k-split warps
         * add theirs in wk order, one at a time (one copy of the code: warp wk == kk's turn; the first adds its
         * fragments to -0, which leaves every value as it is, -0 included) */
#pragma unroll 1
        for (int kk = 0; kk < WK; ++kk) {
            if (wk == kk) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int j = 0; j < NT; ++j) {
                        float2 *p0 =
                            reinterpret_cast<float2 *>(lsm + (mt * 16 + g) * LDL + nbase + (wn * NT + j) * 8 + 2 * tq);
                        float2 *p1 = p0 + 4 * LDL;   // row + 8
                        const float2 v0 = kk ? *p0 : make_float2(-0.f, -0.f), v1 = kk ? *p1 : make_float2(-0.f, -0.f);
                        *p0 = make_float2(v0.x + acc[mt][j][0], v0.y + acc[mt][j][1]);
                        *p1 = make_float2(v1.x + acc[mt][j][2], v1.y + acc[mt][j][3]);
                    }
            }
            __syncthreads();
        }
@ end
    }

    /* ---- split H: partial logits out, and the last block sums them ---- */
    if (gridDim.y > 1) {
        __shared__ int s_last;
        const int nv = min(T, tokens - tok0) * ${LC};   // the block's tokens' logits only
        float *part = route_part + ((long long)blockIdx.y * gridDim.x + blockIdx.x) * (T * ${LC});
@ if V4 then
        for (int i = 4 * tid; i < nv; i += 4 * THREADS)   // LDL and ${LC} multiples of 4: a float4 of one token's row
            *reinterpret_cast<float4 *>(part + i) = *reinterpret_cast<const float4 *>(lsm + (i / ${LC}) * LDL + i % ${LC});
@ else
        for (int i = tid; i < nv; i += THREADS) part[i] = lsm[(i / ${LC}) * LDL + i % ${LC}];
@ end
        __syncthreads();   // the block's partials are written: thread 0's ticket releases them
        if (tid == 0)
            s_last = take_ticket(counts + ${TKT} + blockIdx.x) == (int)gridDim.y - 1;
        __syncthreads();   // the last block's reads come after the ticket's acquire
        if (!s_last)
            return;
        /* G lanes per logit (a power of two, G | 32, while the logits leave
         * threads idle): lane p of a group sums splits p, p + G, ..., then
         * the group adds its lanes in a fixed xor tree: the same sum whichever
         * block is last. A pass takes NB logits a thread (j = base + b *
         * THREADS + tid) and issues their loads split by split across the NB,
         * so a block's T * E logits take a few L2 round trips, not one per
         * THREADS logits (at 32 tokens and 128 experts: 16 of them) */
        const int Y = (int)gridDim.y;
        int G = 1;
        while (G < 32 && G < Y && 2 * G * nv <= THREADS) G *= 2;
        const long long ystride = (long long)gridDim.x * (T * ${LC});
        const float *part0 = route_part + (long long)blockIdx.x * (T * ${LC});
        if (nv * G <= THREADS) {   // few tokens: a logit a group, as the first pass below: the same sums, less code
            const int j = tid / G;
            float v = 0.f;
            if (j < nv && Y <= G) {   // at most one split a lane (few logits: Mixtral's 8 over 16 splits)
                if (tid % G < Y)
                    v += __ldcg(part0 + j + (tid % G) * ystride);
            } else if (j < nv) {
                /* eight splits' loads issued before their adds (one L2 round trip, not one a split), the adds
                 * in split order */
#pragma unroll 1
                for (int y0 = tid % G; y0 < Y; y0 += 8 * G) {
                    float q[8];
#pragma unroll
                    for (int b = 0; b < 8; ++b)
                        q[b] = y0 + b * G < Y ? __ldcg(part0 + j + (y0 + b * G) * ystride) : 0.f;
#pragma unroll
                    for (int b = 0; b < 8; ++b)
                        if (y0 + b * G < Y)
                            v += q[b];
                }
            }
            for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
            if (j < nv && tid % G == 0)
                lsm[(j / ${LC}) * LDL + j % ${LC}] = v;
            __syncthreads();
        } else {   // G is 1 here (G > 1 only while G * nv <= THREADS)
@ if V4 then
            /* four logits a float4: a thread's NB float4s of every split, four splits' loads issued together
             * (the sum over y in split order from 0, as above: the same bits) */
            constexpr int NB = 4;
            const int n4 = nv / 4;
#pragma unroll 1
            for (int base = 0; base < n4; base += NB * THREADS) {
                float4 v[NB];
#pragma unroll
                for (int b = 0; b < NB; ++b) v[b] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
                for (int y = 0; y < Y; ++y) {
                    const float4 *py = reinterpret_cast<const float4 *>(part0 + y * ystride);
#pragma unroll
                    for (int b = 0; b < NB; ++b) {
                        const int j = base + b * THREADS + tid;
                        if (j < n4) {
                            const float4 q = __ldcg(py + j);
                            v[b].x += q.x, v[b].y += q.y, v[b].z += q.z, v[b].w += q.w;
                        }
                    }
                }
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    const int i = 4 * (base + b * THREADS + tid);
                    if (i < nv)
                        *reinterpret_cast<float4 *>(lsm + (i / ${LC}) * LDL + i % ${LC}) = v[b];
                }
            }
            __syncthreads();
@ else
            constexpr int NB = 8;
#pragma unroll 1
            for (int base = 0; base < nv * G; base += NB * THREADS) {   // uniform: every lane shuffles
                float v[NB];
                int iv[NB];
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    v[b] = 0.f;
                    iv[b] = (base + b * THREADS + tid) / G;
                }
                /* j % G is tid % G for every b: THREADS and base are multiples of G */
#pragma unroll 2
                for (int y = tid % G; y < Y; y += G)
#pragma unroll
                    for (int b = 0; b < NB; ++b)
                        if (iv[b] < nv) v[b] += __ldcg(part0 + iv[b] + y * ystride);
#pragma unroll
                for (int b = 0; b < NB; ++b) {
                    for (int o = G / 2; o > 0; o >>= 1) v[b] += __shfl_xor_sync(FULL, v[b], o);
                    if (iv[b] < nv && tid % G == 0)
                        lsm[(iv[b] / ${LC}) * LDL + iv[b] % ${LC}] = v[b];
                }
            }
            __syncthreads();
@ end
        }
    }
@   if c.fp32w then
    /* fp32 router weights: a logit is its three parts' columns added, hi + mid, then lo (each thread one
     * (token, column): it reads its own column of the first block and writes only that) */
    for (int i = tid; i < T * LCOLS; i += THREADS) {
        float *row = lsm + (i / LCOLS) * LDL;
        const int e = i % LCOLS;
        row[e] = (row[e] + row[LCOLS + e]) + row[2 * LCOLS + e];
    }
    __syncthreads();
@   end
@ end

@ local early = c.fuse_scatter and not input and not c.given
@ if early then
    /* one token, scattered (mode 2): its rows are r * align for r < ENTRIES whatever the experts, since every
     * entry has a slot of its own (top-k picks distinct experts, slot_of is a permutation, the shared slots
     * are their own) and a zero expert's row is where the routed rows end; so the warps phase 2 leaves idle
     * copy x[0] there while warp 0 selects, and the scatter writes the row map only (rows no entry takes
     * get the copy too: xs holds ENTRIES * align rows for one token, moe_max_rows) */
    if (fuse.mode == 2 && tokens == 1 && warp > 0) {
@   if c.fp8 then
        /* fp8: quantized as permute_scatter does, a warp per pair of 128-column blocks, e4m3 into fuse.xs (bytes)
         * and a scale per block into fuse.xsc */
        constexpr int HB = H / 128, PAIRS = (HB + 1) / 2;
        unsigned char *__restrict__ xq = reinterpret_cast<unsigned char *>(fuse.xs);
        for (int it = warp - 1; it < PAIRS; it += NW - 1) {
            const int b = it * 2 + (lane >> 4), c = lane & 15;
            uint2 code;
            const float m = quantize8(b < HB ? __ldg(reinterpret_cast<const uint4 *>(x) + b * 16 + c)
                                             : make_uint4(0u, 0u, 0u, 0u), 1.0f, code);
            if (b < HB)
#pragma unroll
                for (int r = 0; r < ENTRIES; ++r) {
                    const long long row = (long long)r * fuse.align;
                    *reinterpret_cast<uint2 *>(xq + row * H + b * 128 + c * 8) = code;
                    if (c == 0)
                        fuse.xsc[row * HB + b] = m / 448.0f;
                }
        }
@   else
        constexpr int HV = H / 8;
        const uint4 *__restrict__ src = reinterpret_cast<const uint4 *>(x);
        for (int v = tid - 32; v < HV; v += THREADS - 32) {
            const uint4 xv = __ldg(src + v);
#pragma unroll
            for (int r = 0; r < ENTRIES; ++r)
                reinterpret_cast<uint4 *>(fuse.xs + (long long)r * fuse.align * H)[v] = xv;
        }
@   end
    }
@ end
    /* ---- phase 2: a warp per token: scores, top-k, weights, counts ---- */
#pragma unroll 1
    for (int tt = warp; tt < T; tt += NW) {
        const int tok = tok0 + tt;
        if (tok >= tokens)
            break;
@ if not c.given_w then
        const float *lrow = lsm + tt * LDL;
        float pv[VPL];
        unsigned valid = 0;
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            const int e = lane + 32 * i;
            if (e < ${SE}) {
@ if p.logit_bias then
                pv[i] = ${cap("lrow[e] + __ldg(logit_bias + e)")};
@ else
                pv[i] = ${cap("lrow[e]")};
@ end
                valid |= 1u << i;
            } else {
                pv[i] = 0.f;
            }
        }
@ if p.spec.training then
        /* a training forward keeps the logits (logit_bias included, capped) for the
         * router's gradient (templates/bwd.lua); NULL in a plain forward */
        if (logits_out) {
#pragma unroll
            for (int i = 0; i < VPL; ++i)
                if ((valid >> i) & 1u) logits_out[(long long)tok * E + lane + 32 * i] = pv[i];
        }
@ end
@ if c.softmax then
        float m = -__int_as_float(0x7f800000);
#pragma unroll
        for (int i = 0; i < VPL; ++i)
            if ((valid >> i) & 1u) m = fmaxf(m, pv[i]);
        m = warp_max(m);
        float z = 0.f;
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            pv[i] = ((valid >> i) & 1u) ? expf(pv[i] - m) : 0.f;
            z += pv[i];
        }
        z = warp_sum(z);
#pragma unroll
        for (int i = 0; i < VPL; ++i) pv[i] = pv[i] / z;
@ elseif p.score == "sigmoid" then
#pragma unroll
        for (int i = 0; i < VPL; ++i) pv[i] = ((valid >> i) & 1u) ? 1.0f / (1.0f + expf(-pv[i])) : 0.f;
@ elseif p.score == "sqrtsoftplus" then
#pragma unroll
        for (int i = 0; i < VPL; ++i) pv[i] = ((valid >> i) & 1u) ? moe_sqrt_softplus(pv[i]) : 0.f;
@ else
        /* sparsemixer: the selection is the top-2 of the logits themselves, in the dtype (the model's) */
#pragma unroll
        for (int i = 0; i < VPL; ++i)
            pv[i] = ((valid >> i) & 1u) ? moe_round(pv[i]) : -__int_as_float(0x7f800000);
@ end
@ end
@ if c.given then
        /* the caller's ids: lane r < K holds entry r's; one outside 0..E-1 is dropped (expert 0, weight 0)
         * and counted */
        int mine = 0;
        bool drop = false;
        if (lane < K) {
            const int id = __ldg(given_ids + (long long)tok * K + lane);
            drop = id < 0 || id >= E;
            mine = drop ? 0 : id;
        }
        {
            const unsigned nd = __popc(__ballot_sync(FULL, drop));
            if (lane == 0 && nd)
                atomicAdd(counts + ${TKT} + ${c.bad_ids}, (int)nd);
        }
@ else
        unsigned ord[VPL];   // selection scores s = p (+ sel_bias), as keys
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
@ if p.bias then
            const int e = lane + 32 * i;
            ord[i] = ord_of(((valid >> i) & 1u) ? pv[i] + __ldg(sel_bias + e) : 0.f);
@ else
            ord[i] = ord_of(pv[i]);
@ end
        }
        unsigned cand = valid;
@ if c.G > 1 and c.glayout == "slots" then
        /* Group-limited, groups of PG = ${c.PG} experts: group q is slots
         * [q*SG, (q+1)*SG) of every lane. */
        {
            constexpr int SG = PG / 32;
            float gsc = 0.f;   // lane q < G: the score of group q
#pragma unroll
            for (int q = 0; q < G; ++q) {
                unsigned mq = cand & (((1u << SG) - 1u) << q * SG);
                float sum = 0.f;
#pragma unroll 1
                for (int r = 0; r < TAKE; ++r) {
                    unsigned long long best = 0;
#pragma unroll
                    for (int i = q * SG; i < (q + 1) * SG; ++i) {
                        const unsigned long long k = ((mq >> i) & 1u) ? make_key(ord[i], lane + 32 * i) : 0ull;
                        best = k > best ? k : best;
                    }
                    best = key_max<32>(best);
                    sum += key_val(best);
                    const int e = key_idx(best);
                    if (lane == (e & 31))
                        mq &= ~(1u << (e >> 5));
                }
                if (lane == q)
                    gsc = sum;
            }
            bool gc = lane < G;
            unsigned kept = 0;   // bit q: group q kept (the same in every lane)
#pragma unroll 1
            for (int r = 0; r < KG; ++r) {
                const int q = key_idx(key_max<32>(gc ? make_key(ord_of(gsc), lane) : 0ull));
                kept |= 1u << q;
                if (lane == q)
                    gc = false;
            }
#pragma unroll
            for (int i = 0; i < VPL; ++i)
                if (!((kept >> (i / SG)) & 1u)) cand &= ~(1u << i);
        }
@ elseif c.G > 1 and c.glayout == "segments" then
        /* Group-limited, groups of PG = ${c.PG} experts: in each slot a group
         * is an aligned segment of PG lanes. */
        {
            unsigned gord[VPL];   // the score of this lane's group in slot i
#pragma unroll
            for (int i = 0; i < VPL; ++i) {
                bool live = (cand >> i) & 1u;
                float sum = 0.f;
#pragma unroll 1
                for (int r = 0; r < TAKE; ++r) {
                    const unsigned long long best = key_max<PG>(live ? make_key(ord[i], lane + 32 * i) : 0ull);
                    sum += key_val(best);
                    if (lane == (key_idx(best) & 31))
                        live = false;
                }
                gord[i] = ord_of(sum);
            }
            /* a group competes through its first lane; its index orders like the group's */
            unsigned gc = (lane % PG) == 0 ? valid : 0u, kept = 0;
#pragma unroll 1
            for (int r = 0; r < KG; ++r) {
                const int lead = key_idx(key_max<32>(lane_best(gord, gc, lane)));
                if (lane == (lead & 31))
                    gc &= ~(1u << (lead >> 5));
                if (lane / PG == (lead & 31) / PG)
                    kept |= 1u << (lead >> 5);
            }
            cand &= kept;
        }
@ elseif c.G > 1 then
        /* Group-limited, groups of PG = ${c.PG} experts, any layout: lane l
         * holds the scores of groups l + 32j. */
        {
            constexpr int GPL = (G + 31) / 32;
            float gs[GPL];
#pragma unroll
            for (int j = 0; j < GPL; ++j) gs[j] = 0.f;
#pragma unroll 1
            for (int q = 0; q < G; ++q) {
                unsigned mq = 0;
#pragma unroll
                for (int i = 0; i < VPL; ++i)
                    if ((unsigned)(lane + 32 * i - q * PG) < (unsigned)PG) mq |= 1u << i;
                mq &= cand;
                float sum = 0.f;
#pragma unroll 1
                for (int r = 0; r < TAKE; ++r) {
                    const unsigned long long best = key_max<32>(lane_best(ord, mq, lane));
                    sum += key_val(best);
                    const int e = key_idx(best);
                    if (lane == (e & 31))
                        mq &= ~(1u << (e >> 5));
                }
#pragma unroll
                for (int j = 0; j < GPL; ++j)
                    if (j == (q >> 5) && lane == (q & 31)) gs[j] = sum;
            }
            unsigned gord[GPL], gc = 0, kept = 0;   // kept bit j: group lane + 32j kept
#pragma unroll
            for (int j = 0; j < GPL; ++j) {
                gord[j] = ord_of(gs[j]);
                if (lane + 32 * j < G) gc |= 1u << j;
            }
#pragma unroll 1
            for (int r = 0; r < KG; ++r) {
                const int q = key_idx(key_max<32>(lane_best(gord, gc, lane)));
                if (lane == (q & 31)) {
                    kept |= 1u << (q >> 5);
                    gc &= ~(1u << (q >> 5));
                }
            }
#pragma unroll
            for (int i = 0; i < VPL; ++i) {
                const int q = (lane + 32 * i) / PG;
                const unsigned w = __shfl_sync(FULL, kept, q & 31);
                if (!((w >> (q >> 5)) & 1u)) cand &= ~(1u << i);
            }
        }
@ end

        /* top-k, best first; lane r keeps the r-th expert */
        int mine = 0;
#pragma unroll 1
        for (int r = 0; r < K; ++r) {
            const int e = key_idx(key_max<32>(lane_best(ord, cand, lane)));
            if (lane == r)
                mine = e;
            if (lane == (e & 31))
                cand &= ~(1u << (e >> 5));
        }
@ end

        /* weights: p at the ${c.given and "given" or "selected"} experts (never the selection bias)${c.given_w and "; here the caller's" or ""} */
        float w = 0.f;
@ if c.sparsemixer then
        const int first = __shfl_sync(FULL, mine, 0);   /* slot 1's softmax leaves slot 0's expert out */
@ end
        if (lane < K) {
@ if c.given_w then
            w = drop ? 0.f : __ldg(given_w + (long long)tok * K + lane);
@ else
@ if p.logit_bias then
            const float l = ${cap("lrow[mine] + __ldg(logit_bias + mine)")};
@ else
            const float l = ${cap("lrow[mine]")};
@ end
@ if c.softmax then
            w = expf(l - m) / z;
@ elseif p.score == "sigmoid" then
            w = 1.0f / (1.0f + expf(-l));
@ elseif p.score == "sqrtsoftplus" then
            w = moe_sqrt_softplus(l);
@ else
            /* sparsemixer, in the dtype's arithmetic as the model runs it (R: rounded to the dtype): the
             * softmax at the slot's logit t over the logits l_j with R(R(t - l_j) / max(|l_j|, t)) not
             * above R(2 jitter_eps) (a 0/0 is kept, as torch keeps it), slot 1's without slot 0's expert;
             * the weight rounded to the dtype */
            const float t = moe_round(l), band = moe_round(${f32(2 * p.jitter_eps)});
            float z = 0.f;
            for (int j = 0; j < E; ++j) {
                const float lj = moe_round(lrow[j]);
                if ((lane == 1 && j == first) ||
                    moe_round(moe_round(t - lj) / fmaxf(fabsf(lj), t)) > band)
                    continue;
                z += expf(lj - t);
            }
            w = moe_round(1.0f / z);
@ end
@ if c.given then
            if (drop)
                w = 0.f;
@ end
@ end
        }
@ if p.renormalize then
        {
            const float sum = warp_sum(w);
            if (sum > 0.f)
                w = w / sum;
        }
@ end
@ if c.scale ~= 1 then
        w *= ${f32(c.scale)};
@ end
@ if c.escale then
        if (lane < K)
            w *= __ldg(expert_scale + mine);   /* router.expert_scale: the final weight × its expert's scale */
@ end
@ if c.M > 0 then
        /* entries K .. KE-1: the shared expert's slots E .. E+M-1, weight g(x) */
@   if c.gate then
        const float gsh = 1.0f / (1.0f + expf(-lrow[E]));   // sigmoid(x . w_gate), never renormalized or scaled
@   end
        if (lane < K) {
            topk_idx[(long long)tok * KE + lane] = mine;
            topk_w[(long long)tok * KE + lane] = w;
            atomicAdd(s_count + mine, 1);
        } else if (lane < KE) {
            topk_idx[(long long)tok * KE + lane] = E + lane - K;
            topk_w[(long long)tok * KE + lane] = ${c.gate and "gsh" or "1.0f"};
        }
@ elseif c.Z > 0 then
        if (lane < K) {   // a zero expert (mine >= E) takes no slot: it is counted nowhere
            topk_idx[(long long)tok * K + lane] = mine;
            topk_w[(long long)tok * K + lane] = w;
            if (mine < E)
                atomicAdd(s_count + mine, 1);
        }
@ else
        if (lane < K) {
            topk_idx[(long long)tok * K + lane] = mine;
            topk_w[(long long)tok * K + lane] = w;
            atomicAdd(s_count + mine, 1);
        }
@ end
@ if c.fuse_scatter then
        if (tt < NW && lane < ENTRIES)   // the entries of the fused scatter's tokens (mode 2: at most NW), kept here
            s_ent[tt * ENTRIES + lane] = lane < K ? mine : E + lane - K;
@ end
@ if not c.given then
        if (tt == 0 && lane < ENTRIES)
            s_sel[lane] = lane < K ? (mine < E ? mine : 0x7fffffff) : E + lane - K;
@ end
    }
    __syncthreads();
    for (int e = tid; e < E; e += THREADS)
        if (s_count[e])
            atomicAdd(counts + e, s_count[e]);
@ if c.M > 0 then
    if (tid < M) {   // every token of the block visits each shared slot
        s_count[E + tid] = min(T, tokens - tok0);
        atomicAdd(counts + E + tid, min(T, tokens - tok0));
    }
@ end

    /* ---- fused: the last block to finish plans the permutation (and scatters) ---- */
    if (fuse.mode == 0)
        return;
    {
        __shared__ int s_last_all, s_wr[NW], s_wt[NW];
        /* one token block (gridDim.x 1) is the last without a ticket or fences, and plans from its own counts in
         * s_count: no round trip to L2 (its threads' global stores are ordered by the block's barriers) */
        const bool one = gridDim.x == 1;
        moe_cp_async_commit();
        moe_cp_async_wait<0>();   // this thread's slot_of copies (the barrier below shows them to the block)
        __syncthreads();   // this block's entries and counts are made: thread 0's ticket releases them
        if (tid == 0)
            s_last_all = one || take_ticket(counts + FUSE_TICKET) == (int)gridDim.x - 1;
        __syncthreads();
        if (!s_last_all)
            return;
        /* the dynamic smem is free: phase 2 is done with the logits */
        int *s_off = reinterpret_cast<int *>(smem), *s_first = s_off + SLOTS;
@ if not c.given then
        if (tokens == 1) {
            /* one token: its selected slots (s_sel; distinct: top-k picks distinct experts, the shared slots are
             * their own) take one row block each, in slot order, so a slot's offset is align times the selected
             * slots below it and its tile the one with that index: no scan, no barrier */
            for (int e = tid; e <= SLOTS; e += THREADS) {
                int below = 0;
#pragma unroll
                for (int k = 0; k < ENTRIES; ++k) below += s_sel[k] < e;
                const int off = below * fuse.align;
                fuse.offsets[e] = off;
                if (e == SLOTS) {
                    *fuse.num_tiles = below;
                    break;
                }
                fuse.cursor[e] = 0;
                s_off[e] = off;
                if (s_count[e])
                    reinterpret_cast<int4 *>(fuse.tiles)[below] = make_int4(s_slot[e], off, 1, 0);
            }
        } else
@ end
        moe_plan_block<THREADS, SLOTS>(counts, one ? s_count : nullptr, s_slot, fuse.align, fuse.offsets,
                                       fuse.cursor, fuse.tiles, fuse.num_tiles, s_off, s_first, s_wr, s_wt);
@ if c.fuse_scatter then
        if (fuse.mode != 2)
            return;
@   if c.fp8 then
        /* the scatter: each entry's row (its quantized row: phase 2's idle warps') */
@   else
        /* the scatter: each entry's row, then a warp per routed row copies x (HV 16-byte vectors) */
        constexpr int HV = H / 8;
@   end
        int *s_cur = s_first + SLOTS + 1;   // each slot's rows taken so far
        for (int e = tid; e < SLOTS; e += THREADS) s_cur[e] = 0;
        __syncthreads();
        const int n = tokens * ENTRIES;
        /* entry i's id and row from shared memory where this block made them (one token block, its first NW
         * tokens: every call mode 2 is given), else from L2 */
        const int nk = one ? min(n, NW * ENTRIES) : 0;
@   if c.Z > 0 then
        const int zrow = fuse.offsets[SLOTS];   // x[t] of a token with a zero expert: row zrow + t (the plan wrote it)
        for (int i = tid; i < n; i += THREADS) {
            const int e = i < nk ? s_ent[i] : __ldcg(topk_idx + i);
            const int r = e >= SLOTS ? zrow + i / ENTRIES : s_off[e] + atomicAdd(s_cur + e, 1);
            fuse.row_of[i] = r;
@   if not c.fp8 then
            if (i < nk)
                s_row[i] = r;
@   end
        }
@   else
        for (int i = tid; i < n; i += THREADS) {
            const int e = i < nk ? s_ent[i] : __ldcg(topk_idx + i);
            const int r = s_off[e] + atomicAdd(s_cur + e, 1);
            fuse.row_of[i] = r;
@   if not c.fp8 then
            if (i < nk)
                s_row[i] = r;
@   end
        }
@   end
        __syncthreads();   // row_of (global, s_row) and s_cur are complete, for the whole block
        for (int e = tid; e < SLOTS; e += THREADS) fuse.cursor[e] = s_cur[e];   // as permute_scatter leaves it
@   if c.fp8 then
        /* fp8: mode 2 is one token's alone (moe_route_fuse_scatter), whose row phase 2's idle warps quantized */
@   else
@     if early then
        if (tokens == 1)   // phase 2's idle warps copied x[0] to every row one token can take
            return;
@     end
#pragma unroll 1
        for (int i = warp; i < n; i += NW) {
@   if c.Z > 0 then
            /* warp-uniform: a zero entry; the token's first one copies x */
            if ((i < nk ? s_ent[i] : __ldcg(topk_idx + i)) >= SLOTS) {
                bool first = true;
                for (int j = i - i % ENTRIES; j < i; ++j)
                    first = first && (j < nk ? s_ent[j] : __ldcg(topk_idx + j)) < SLOTS;
                if (!first)
                    continue;
            }
@   end
            const uint4 *__restrict__ src = reinterpret_cast<const uint4 *>(x + (long long)(i / ENTRIES) * H);
            const int row = i < nk ? s_row[i] : __ldcg(fuse.row_of + i);
            uint4 *__restrict__ dst = reinterpret_cast<uint4 *>(fuse.xs + (long long)row * H);
@   if input then
            const float w = moe_round(__ldcg(topk_w + i));   // the weight in the dtype
#pragma unroll 8
            for (int v = lane; v < HV; v += 32) dst[v] = moe_scale8(__ldg(src + v), w);
@   else
#pragma unroll 8
            for (int v = lane; v < HV; v += 32) dst[v] = __ldg(src + v);
@   end
        }
@   end
@ else
        /* fp8 with router.apply = "input" or given ids: permute_scatter quantizes the rows (mode 2 is never
         * passed: moe_route_fuse_scatter) */
@ end
    }
}
@ end
@
@ if p then M.emit(p) end
@ return M
