@ -- gemm_sm90.lua — the grouped expert GEMMs for Hopper (sm_90a): wgmma
@ -- with both operands in shared memory, staged by TMA, fp32 accumulators
@ -- in registers, one producer warpgroup and CONSUMERS consumer
@ -- warpgroups, one CTA per tile or on a persistent grid. M.up(p) emits
@ -- the up projection with the SwiGLU fused in, M.down(p) the down
@ -- projection; both keep the semantics of gemm_up_swiglu.lua /
@ -- gemm_down.lua (read their headers), but take their operands A and B
@ -- as TMA tensor maps (below).
@ --
@ -- Tile (p.tile): bm x bn x bk, stages, consumers, group_m. Consumer
@ -- warpgroup w owns rows [w * bm / consumers, (w + 1) * bm / consumers) of
@ -- the CTA tile, as bm / consumers / 64 wgmma m64nBNk16 blocks, so each
@ -- thread holds bm / consumers / 64 * bn / 2 fp32 accumulators.
@ -- p.threads = 128 * (consumers + 1): warpgroup 0 produces (setmaxnreg
@ -- moves its registers to the consumers). ptxas still allocates the whole
@ -- kernel under the launch cap (168 registers at 384 threads, 128 at 512),
@ -- so the accumulators plus ~40 must fit that cap: m64n256 per consumer
@ -- works with 2 consumers, not with 3.
@ --
@ -- The grid is 1D (tile.persistent chooses its size): CTA b walks the
@ -- linear tile ids b, b + gridDim.x, ... below *num_tiles x NTILES (N
@ -- tiles), each mapped to (M tile, N tile) by the group_m raster; M tile
@ -- mt is tiles[mt] of the device-side tile table. With one CTA per tile
@ -- (persistent 0, the default) the grid covers the plan's whole tile
@ -- space and each CTA runs at most one tile. On a persistent grid (about
@ -- one CTA per SM) producer and consumers walk the same sequence and the
@ -- stage ring runs on across tiles, so the producer loads the next tile
@ -- while the consumers run the epilogue of this one.
@ --
@ -- Ping-pong (tile.pingpong, on the persistent grid, CONSUMERS = 2): the
@ -- consumer warpgroups take alternate tiles instead of sharing each one.
@ -- Counting the CTA's tiles with rows j = 0, 1, ..., tile j is warpgroup
@ -- j % 2's, all BM rows of it (WG_ROWS = BM); the producer fills the ring
@ -- in tile order as always, and each warpgroup steps its ring position
@ -- over the other's KTILES stages. Two named barriers order the main
@ -- loops: a warpgroup starts tile j's main loop only once the other one
@ -- has issued tile j - 1's (waited for every stage of it), and arrives
@ -- for the other once it has issued its own, then runs its epilogue
@ -- (each warpgroup stages through its own tile) while the other one's
@ -- wgmma run. That order is also what keeps the parity waits sound: when
@ -- a warpgroup waits on full[s] for ring position P, every position
@ -- before its tile was filled, so full[s] is in the phase of P, not of
@ -- P - STAGES. empty[s] counts the 128 threads of the one warpgroup that
@ -- read the stage. With BM = 128 a tile of at most 64 rows (an expert's
@ -- last) computes its first m64 block alone, as the shared schedules leave
@ -- a warpgroup without rows idle. The arrival after the CTA's last tile is taken by the
@ -- warpgroup that would have run the next one, so no barrier is left
@ -- half-arrived at exit.
@ --
@ -- Split-K (tile.splitk = S, 2..16, one CTA per tile otherwise): the
@ -- grid has S CTAs per tile, CTA b running split b % S of tile b / S, k
@ -- tiles [s * KTILES / S, (s + 1) * KTILES / S) (each at least one: the
@ -- plan keeps S <= KTILES). Every split stores its fp32 accumulators to
@ -- its partial tile in the splitk workspace (splitk_part: BM x BN floats
@ -- per tile and split, in the accumulators' own thread order; the tile's
@ -- rows only) and takes
@ -- a ticket of its tile (splitk_tickets[tile], zeroed before route with
@ -- the counts); the CTA that takes the last one resets it to 0, sums the
@ -- S partials in split order (the same sum whichever CTA is last) and
@ -- runs the usual epilogue (splitk_reduce). A tile without rows does
@ -- nothing, as on the other grids.
@ --
@ -- Shared memory (1024-byte aligned): STAGES stages, each the A tile (bm
@ -- rows) then the B tile (bn rows), both K-major in the 128-byte swizzle
@ -- that TMA writes and wgmma reads: bk / 64 atoms along k, each ROWS x 128
@ -- bytes, the 16-byte chunk c of row r stored at chunk c ^ (r % 8); on a
@ -- persistent grid then the epilogue's staging tile (bm x (EPI_COLS + 8)
@ -- halves, EPI_COLS = min(output columns per tile, 128): wider tiles are
@ -- stored in passes; two of them, one per consumer warpgroup, on the
@ -- ping-pong grid; with one CTA per tile the whole output tile, EPI_COLS
@ -- = its output columns, is staged over the stages instead); then 2 *
@ -- STAGES mbarriers (full[s], empty[s]). So
@ --   smem >= stages * (bm + bn) * bk * 2 [+ (1 or 2) * bm * (EPI_COLS + 8) * 2] + 16 * stages
@ -- The plan computes it (gen/family_gemm.c, moe_gemm_sm90_smem); the
@ -- kernel static_asserts that its layout ends exactly there.
@ --
@ -- Operands: A is a 2D tensor map over [rows, K] halves (xs or hbuf; rows
@ -- >= every tile's row_start + bm, or TMA zero-fills), B over [slots * N, K]
@ -- (the weights, expert-major), both with 64 x ROWS boxes (bm rows for A,
@ -- bn for B) in SWIZZLE_128B; the host encodes them per call and passes
@ -- them as __grid_constant__ parameters (moe_tmap_t, the prelude's 128
@ -- bytes). Out-of-bounds parts of a box (K tails, N past the last slot, A
@ -- past rows) arrive as zeros; rows past a tile's `rows` and N past an
@ -- expert's N are over-reads masked at the store. One elected producer
@ -- thread arms full[s] with expect_tx(STAGE_BYTES) (a box always counts
@ -- whole, zero-filled parts included) and issues 2 * bk / 64 boxes into
@ -- stage s once empty[s] says every consumer thread released it; every
@ -- consumer thread arrives on empty[s] once its wgmma of that stage
@ -- retired (a warpgroup with no rows in the tile arrives without
@ -- computing, so the count is always 128 * CONSUMERS).
@ --
@ -- CTA pairs (p.tile.cluster, the tuning table's "+mc"; the persistent
@ -- grids of the forward's bf16/fp16 GEMMs, never gathering): the kernel
@ -- runs in 2-CTA clusters (__cluster_dims__), the grid's gridDim.x / 2
@ -- pairs walking items (pair of M tiles 2i, 2i + 1; N tile) by the same
@ -- raster over (mtiles + 1) / 2 pair rows; the CTA of cluster rank r takes
@ -- M tile 2i + r. Both CTAs run every stage of an item one of them has
@ -- rows in, in step (a CTA without rows releases its stages unread, as a
@ -- consumer warpgroup without rows does). When both tiles have rows of one
@ -- expert (share) they need the same B tile, so each loads it for alternate
@ -- k tiles (r = kt % 2) by TMA multicast into both CTAs' stage (the same
@ -- offset and full barrier in each); otherwise each loads its own. So a
@ -- stage may be refilled only once both CTAs' consumers are done with it:
@ -- empty[s] counts the CTA's own releasing threads plus one arrival per
@ -- releasing warp of the other CTA (lane 0's, through mapa, after the
@ -- warp's wgmma retired), and full[s] expects the bytes that will land in
@ -- this CTA (its A if it has rows, B if it has rows or shares; the peer's
@ -- multicast may complete before this CTA's expect_tx, which the
@ -- transaction count allows). A cluster barrier after the barriers' init
@ -- and one before exit keep every remote arrival and copy within the
@ -- other CTA's lifetime.
@ --
@ -- Gather (p.tile.gather, the up GEMM of a spec with gen/spec.h's
@ -- moe_spec_gather; docs/DESIGN.md, "The gathered up GEMM"): the kernel takes
@ -- x and src_of last. Given src_of, the whole producer warpgroup loads A
@ -- from x through it by cp.async (produce_gather) and B by TMA, the full
@ -- barriers count 1 + 128 arrivals, and the consumers fence the async
@ -- proxy after each full wait; given NULL it runs as without.
@ --
@ -- fp8 (p.spec.quant.weights = "fp8_e4m3", docs/DESIGN.md "FP8"): A and B
@ -- are e4m3 (one byte each, TMA boxes of 128 elements, the same 128-byte
@ -- swizzle rows), wgmma m64n128k32.f32.e4m3.e4m3 (K-major both, as fp8
@ -- requires); each k tile (bk = 128) is one scale block: the wgmma of a
@ -- 128-column half of the tile accumulate its 4 k32 steps into `part`,
@ -- then part is promoted into the fp32 accumulators times the A row's and
@ -- the B block's scales (the fp8 wgmma accumulates with reduced
@ -- precision, so nothing longer than 128 K stays in it). The up GEMM's
@ -- epilogue quantizes the activation's output per row per 128 columns
@ -- (the tile's 128 output columns) into e4m3 + one fp32 scale; the down
@ -- GEMM's writes bf16. "channel" scales multiply in the epilogue (the up
@ -- GEMM's, on the persistent grid, copied into shared memory while the
@ -- main loop runs: cs_smem). Tile:
@ -- 64 x 256 x 128 per consumer, one consumer (the default) or two (a tuning
@ -- entry of dtype e4m3), one CTA per tile or (an entry's persist grid) on
@ -- the persistent grid, where the producer loads the next tile while the
@ -- consumers quantize or stage this one's output (the down GEMM through its
@ -- own staging tile after the ring, as the bf16 kernels; the up GEMM's
@ -- epilogue stores from registers) (gen/family_gemm.c).
@ --
@ -- The kernel body exists only in the sm_90a pass; other targets get a body
@ -- that traps (the launcher calls this kernel only on compute capability 9).
@ local M = {}
@
@ local PRODUCER_REGS = 72
@ -- split-K's two arguments after the output: the partial tiles, the tickets
@ -- (not __restrict__: other CTAs write the partials that the last one reads
@ -- once its ticket and barrier say so, and no load may move above them)
@ local SPLITK_ARGS = ", float *splitk_part, int *splitk_tickets"
@
@ -- Check p's tile for a GEMM of this kind and derive the kernel's
@ -- constants. kind = "up": B is the packed [2F, H] W1 and the output is
@ -- [rows, F]; kind = "down": B is [H, F] W2 and the output is [rows, H].
@ local function config(p, kind)
@   local function need(ok, what)
@     if not ok then error(p.kernel .. ": " .. what, 3) end
@   end
@   local t = p.tile
@   need(type(t) == "table", "p.tile is missing")
@   local c = { bm = t.bm, bn = t.bn, bk = t.bk, stages = t.stages, consumers = t.consumers, group_m = t.group_m or 1 }
@   for _, k in ipairs({ "bm", "bn", "bk", "stages", "consumers" }) do
@     need(math.type(c[k]) == "integer" and c[k] > 0, "tile." .. k .. " must be a positive integer")
@   end
@   if kind == "up" then
@     c.K, c.N, c.bno, c.nout = p.H, 2 * p.F, c.bn // 2, p.F
@   elseif kind == "dgrad_up" then    -- dXs [rows, H] = dU [rows, 2F] . W1p[slot] [2F, H], B N-major
@     c.K, c.N, c.bno, c.nout, c.b_mn = 2 * p.F, p.H, c.bn, p.H, true
@   elseif kind == "dgrad_down" then  -- dA [rows, F] = dys [rows, H] . W2[slot] [H, F], B N-major
@     c.K, c.N, c.bno, c.nout, c.b_mn = p.H, p.F, c.bn, p.F, true
@   elseif kind == "wgrad_up" or kind == "wgrad_down" then
@     -- dW [M, N] (+)= A_gᵀ . B_g over slot g's rows: A [rows, M] and B [rows, N], both M/N-major;
@     -- K (the slot's rows) is read on the device, so the K constant is 0
@     c.M = kind == "wgrad_up" and 2 * p.F or p.H
@     c.K, c.N, c.a_mn, c.b_mn, c.wgrad = 0, kind == "wgrad_up" and p.H or p.F, true, true, true
@     c.bno, c.nout = c.bn, c.N
@     need(c.bm % 64 == 0 and c.M % 8 == 0, "A M-major: bm a multiple of 64, M of 8")
@     -- the gradient's type (spec weight_grads): fp32, or the dtype (2-byte elements, boxes of 64 columns)
@     need(p.grad_dtype == nil or p.grad_dtype == "fp32" or p.grad_dtype == p.dtype,
@          "grad_dtype must be fp32 or the dtype, not " .. tostring(p.grad_dtype))
@     c.grad_half = p.grad_dtype ~= nil and p.grad_dtype ~= "fp32"
@   else
@     c.K, c.N, c.bno, c.nout = p.F, p.H, c.bn, p.H
@   end
@   if c.b_mn then
@     need(c.bn % 64 == 0, "B N-major: bn must be a multiple of 64 (TMA boxes of 64 columns)")
@   end
@   -- B's wgmma descriptor and the byte offset of k16 step ks in a stage's B tile
@   c.bdesc = c.b_mn and "sdesc_mn" or "sdesc"
@   c.b_koff = c.b_mn and "ks * (16 * 128)" or "(ks / 4) * (BN * 128) + (ks % 4) * 32"
@   need(c.stages >= 2, "need stages >= 2")
@   need(t.pingpong == nil or t.pingpong == 0 or t.pingpong == 1, "tile.pingpong must be 0 or 1")
@   c.pingpong = t.pingpong == 1
@   if c.pingpong then   -- each consumer warpgroup runs whole tiles
@     need(t.persistent == 1 and c.consumers == 2, "pingpong: 2 consumer warpgroups on the persistent grid")
@     need(c.bm % 64 == 0, "bm must be a multiple of 64 (m64 wgmma blocks)")
@   else
@     need(c.bm % (64 * c.consumers) == 0, "bm must be a multiple of 64 * consumers (m64 wgmma blocks per consumer)")
@     need(c.bm // c.consumers <= 128, "at most two m64 blocks a consumer warpgroup")
@   end
@   need(c.bm <= 256, "bm must be at most 256 (one TMA box of rows)")
@   need(c.bn % 8 == 0 and c.bn <= 256, "bn must be a multiple of 8, at most 256 (one wgmma n, one TMA box)")
@   need(c.bk % 64 == 0 and c.bk <= 128, "bk must be 64 or 128 (128-byte swizzle atoms of 64 halves)")
@   need(c.K % 8 == 0 and c.N % 8 == 0, "K and N must be multiples of 8 (16-byte TMA row strides)")
@   if kind == "up" then
@     need(c.bn % 16 == 0, "bn must be a multiple of 16 (gate/up pairs)")
@     need(p.pair_granule == 8, "the SwiGLU epilogue pairs gate/up in granules of 8 (one n8 accumulator block)")
@   end
@   c.fp8 = p.spec.quant ~= nil and p.spec.quant.weights == "fp8_e4m3"
@   c.esize = c.fp8 and 1 or 2                          -- bytes per operand element
@   c.atom_elems = 128 // c.esize                        -- elements per 128-byte swizzle row
@   if c.fp8 then
@     need(c.bk == 128 and c.bn == 256 and (c.consumers == 1 or c.consumers == 2) and c.bm == 64 * c.consumers
@          and t.pingpong ~= 1, "the fp8 GEMM runs 64 x 256 x 128 tiles per consumer (one or two), one CTA per tile "
@          .. "or on the persistent grid")
@     need(c.K % 128 == 0 and c.N % 128 == 0, "fp8: K and N must be multiples of 128 (the scale blocks)")
@     c.block = p.spec.quant.scaling == "block"
@     c.ptx_type = "e4m3"
@   else
@     c.ptx_type = ({ bf16 = "bf16", fp16 = "f16" })[p.dtype] or error(p.kernel .. ": unknown dtype " .. tostring(p.dtype), 2)
@   end
@   c.wg_rows = c.pingpong and c.bm or c.bm // c.consumers
@   c.wm = c.wg_rows // 64                              -- m64 blocks per consumer
@   c.nacc = c.bn // 2                                  -- fp32 accumulators per thread per m64 block
@   -- ptxas allocates the whole kernel under the launch cap (65536 / threads), setmaxnreg or not
@   c.reg_cap = math.min(255, (65536 // p.threads) // 8 * 8)
@   -- fp8 with two consumers: 128 accumulators + a 64-register part a thread, over the 168 launch cap; ptxas
@   -- (CUDA 13) allocates the consumers' code after setmaxnreg.inc at the raised count: 216 (PRODUCER_REGS 72, not
@   -- the 232 assumed here); the persistent kernels fit, the tile grid's down GEMM spills 52-60 bytes (PERF.md 2026-12-08)
@   local cap = (c.fp8 and c.consumers == 2) and 232 or c.reg_cap
@   need(c.wm * c.nacc + (c.fp8 and 64 or 0) + 40 <= cap, string.format("%d accumulators per consumer thread (bm / consumers / 64 * "
@        .. "bn / 2) do not fit the %d-register cap of %d threads", c.wm * c.nacc, cap, p.threads))
@   c.a_bytes, c.b_bytes = c.bm * c.bk * c.esize, c.bn * c.bk * c.esize
@   c.stage_bytes = c.a_bytes + c.b_bytes
@   c.persistent = t.persistent == 1
@   -- the gathered up GEMM (gen/family.h, moe_gemm_gathers): A's rows from x through src_of, by cp.async
@   c.gather = t.gather == 1
@   -- "+ef" (gen/tuning.h): the up GEMM's weight boxes loaded with an L2 evict_first policy
@   c.evict = t.evict == 1
@   need(not c.evict or kind == "up", "tile.evict: the up GEMM only")
@   need(not c.gather or (kind == "up" and not c.fp8), "tile.gather: the bf16/fp16 up GEMM only")
@   -- "+mc" (gen/tuning.h): CTA pairs, the shared B tile multicast
@   c.mc = t.cluster == 1
@   need(not c.mc or (t.persistent == 1 and not c.gather and not c.evict and (t.splitk or 0) == 0
@                     and (kind == "up" or kind == "down")),
@        "tile.cluster: the forward's GEMMs on a persistent grid, not gathering, without evict")
@   need(t.persistent == nil or t.persistent == 0 or t.persistent == 1, "tile.persistent must be 0 or 1")
@   -- split-K (tile.splitk = S > 0): S CTAs per tile, CTA b the split b % S of
@   -- tile b / S, over k tiles [split_kt(split), split_kt(split + 1))
@   c.splitk = t.splitk or 0
@   need(math.type(c.splitk) == "integer" and (c.splitk == 0 or (c.splitk >= 2 and c.splitk <= 16)),
@        "tile.splitk must be 0 or 2..16")
@   if c.splitk > 0 then
@     need(not c.persistent and not c.pingpong and not c.fp8 and (kind == "up" or kind == "down"),
@          "split-K: the forward's bf16/fp16 GEMMs on the one-CTA-per-tile grid")
@     c.lin0, c.lstep = "(int)blockIdx.x / SPLITK", "(int)gridDim.x / SPLITK"
@     c.kt_lo, c.kt_hi = "split_kt(split_of())", "split_kt(split_of() + 1)"
@   elseif c.mc then  -- the cluster's items (pair of M tiles, N tile): pair_of
@     c.lin0, c.lstep, c.kt_lo, c.kt_hi = "((int)blockIdx.x >> 1)", "((int)gridDim.x >> 1)", "0", "KTILES"
@   else
@     c.lin0, c.lstep, c.kt_lo, c.kt_hi = "(int)blockIdx.x", "(int)gridDim.x", "0", "KTILES"
@   end
@   -- a consumer's release of a stage: its own arrival, in CTA pairs the other CTA's too
@   c.release = c.mc and "release" or "bar_arrive"
@   -- one CTA per tile stages its whole output tile in the ring once the
@   -- main loop is done; a persistent CTA keeps loading the next tile into
@   -- the ring meanwhile, so it stages through its own tile, in passes
@   c.epi_cols = c.persistent and math.min(c.bno, 128) or c.bno  -- output columns per staging pass
@   need(c.bno % c.epi_cols == 0 and c.epi_cols % 8 == 0, "output columns per tile must be a multiple of 8 and of "
@        .. "the staging width")
@   c.ldc = c.epi_cols + 8                              -- staged output row stride, halves
@   -- what the ping-pong changes in the shared code: the threads that release
@   -- a stage and store a staging tile (one warpgroup), a warpgroup's first row
@   c.releasers = c.pingpong and "128" or "CTHREADS"
@   c.row0 = c.pingpong and "" or "cw * WG_ROWS + "
@   -- the shared-memory layout is checked against the plan's (p.smem) by
@   -- static_asserts in device_code, not recomputed here
@   c.n_tail = c.N % c.bn ~= 0
@   c.out_tail = c.nout % c.bno ~= 0
@   -- registers: the launch cap, then the producer gives all but PRODUCER_REGS to the consumers
@   if c.consumers >= 2 then
@     c.producer_regs = (c.gather and c.bm >= 256) and 88 or PRODUCER_REGS  -- 16 gathered rows a thread: 72 spill
@     c.consumer_regs = math.min(240, ((c.reg_cap * p.threads - 128 * c.producer_regs) // (128 * c.consumers)) // 8 * 8)
@     if c.consumer_regs <= c.reg_cap then c.consumer_regs = nil end  -- 4 consumers (640 threads): none to move
@   end
@   return c
@ end
@
@ -- A comma-separated list of fmt with i = lo..hi substituted, split over
@ -- lines of per items (each but the last line ending in a comma).
@ local function operand_lines(fmt, n, per)
@   local lines = {}
@   for i = 0, n - 1, per do
@     local l = {}
@     for j = i, math.min(i + per, n) - 1 do l[#l + 1] = string.format(fmt, j) end
@     lines[#lines + 1] = table.concat(l, ", ") .. (i + per < n and "," or "")
@   end
@   return lines
@ end
@
@ -- CTA pairs: the kernel's cluster shape (the prelude's MOE_CTA_PAIR: sm_90 targets only)
@ local CLUSTER_DIMS = " MOE_CTA_PAIR"
@ local ARCH_GUARD = "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)"
@
@ -- The device code both kernels share, inside the kernel's namespace.
@ local function device_code(p, c)
constexpr int BM = ${c.bm}, BN = ${c.bn}, BK = ${c.bk}, STAGES = ${c.stages}, CONSUMERS = ${c.consumers};
constexpr int K = ${c.K};        /* reduction length */
constexpr int N = ${c.N};        /* rows of B per expert */
constexpr int NOUT = ${c.nout};  /* output row length */
constexpr int BNO = ${c.bno};    /* output columns per tile */
@ if c.pingpong then
constexpr int WG_ROWS = BM;              /* rows per consumer warpgroup: the whole tile (ping-pong) */
@ else
constexpr int WG_ROWS = BM / CONSUMERS;  /* rows per consumer warpgroup */
@ end
constexpr int WM = WG_ROWS / 64;         /* m64 wgmma blocks per consumer */
constexpr int NACC = BN / 2;             /* fp32 accumulators per thread and m64 block */
constexpr int A_BYTES = ${c.a_bytes}, STAGE_BYTES = ${c.stage_bytes};
constexpr int EPI_COLS = ${c.epi_cols};  /* output columns per staging pass */
constexpr int LDC = ${c.ldc};            /* staged output row stride, halves */
constexpr bool PERSISTENT = ${c.persistent and "true" or "false"};
constexpr int RING = STAGES * STAGE_BYTES;
/* the staging tile: its own after the ring on a persistent grid; with one
 * CTA per tile, the ring itself once the main loop is done */
@ if c.pingpong then
constexpr int EPI_BYTES = (BM * LDC * 2 + 15) / 16 * 16;  /* one staging tile; consumer warpgroup w's at EPI_OFF + w * EPI_BYTES */
constexpr int EPI_OFF = RING;
constexpr int BAR_OFF = RING + 2 * EPI_BYTES;  /* full[STAGES], then empty[STAGES] */
constexpr int ORDER_BAR = 2;  /* named barriers ORDER_BAR + w: warpgroup w may start its next main loop */
constexpr int EPI_BAR = 4;    /* named barriers EPI_BAR + w: warpgroup w's own (its staging passes) */
@ elseif c.wgrad then
/* the wgrad's output tile (${c.grad_half and "the dtype" or "fp32"}), staged in EPI_PASSES passes of
 * PASS_COLS columns: PASS_COLS / OUT_COLS boxes of BM rows x OUT_COLS
 * columns (128 bytes) in the 128-byte swizzle, which TMA stores (the last
 * pass while the next tile's main loop runs) */
constexpr int EPI_PASSES = 2, PASS_COLS = BN / EPI_PASSES;
constexpr bool OUT_HALF = ${c.grad_half and "true" or "false"};  /* 2-byte gradient elements */
constexpr int OUT_COLS = OUT_HALF ? 64 : 32;                     /* columns of a 128-byte box row */
constexpr int OUT_BOX = BM * 128;
constexpr int EPI_OFF = RING;
constexpr int BAR_OFF = RING + PASS_COLS / OUT_COLS * OUT_BOX;  /* full[STAGES], then empty[STAGES] */
static_assert(PASS_COLS % OUT_COLS == 0 && EPI_PASSES == 2,
              "whole 128-byte boxes per pass; the epilogue stages passes 0 and 1");
@ else
constexpr int EPI_OFF = PERSISTENT ? RING : 0;
constexpr int BAR_OFF = PERSISTENT ? RING + (BM * LDC * 2 + 15) / 16 * 16 : RING;  /* full[STAGES], then empty[STAGES] */
@ end
static_assert(PERSISTENT || BM * LDC * 2 <= RING, "the output tile (BM x LDC halves) fits in the stages");
/* the plan's numbers (gen/family_gemm.c): this layout must be its shared
 * memory exactly (moe_gemm_sm90_smem), the block one producer and
 * CONSUMERS consumer warpgroups */
static_assert(BAR_OFF + 16 * STAGES == ${p.smem}, "the shared-memory layout is the plan's (moe_gemm_sm90_smem)");
static_assert(${p.threads} == 128 * (CONSUMERS + 1), "threads: one producer and CONSUMERS consumer warpgroups");
@ if c.fp8 then
constexpr int KTILES = K / BK, KSTEPS = BK / 32, KATOMS = 1;  /* k32 steps of 32 bytes; a k tile is one scale block */
constexpr int HALVES = BN / 128;                               /* m64n128 wgmma per k32 step */
constexpr int SB_ROWS = N / 128;                               /* B scale rows per expert ("block") */
static_assert(K % 128 == 0 && BK == 128 && WM == 1, "fp8: one 128-wide scale block per k tile, 64-row consumers");
@ else
constexpr int KTILES = (K + BK - 1) / BK, KSTEPS = BK / 16, KATOMS = BK / 64;
@ end
constexpr int NTILES = (N + BN - 1) / BN;  /* N tiles per M tile */
@ if c.splitk > 0 then
constexpr int SPLITK = ${c.splitk};  /* CTAs per tile, each over its share of the k tiles */
static_assert(SPLITK >= 2 && SPLITK <= KTILES, "every split has a k tile (gen/family_gemm.c, sm90_splits)");
/* This CTA's split among its tile's SPLITK CTAs; the first k tile of split sp. */
static __device__ __forceinline__ int split_of() { return (int)blockIdx.x % SPLITK; }
static __device__ __forceinline__ int split_kt(int sp) { return sp * KTILES / SPLITK; }
@ end
constexpr int CTHREADS = 128 * CONSUMERS;
constexpr bool N_TAIL = ${c.n_tail and "true" or "false"};
constexpr bool OUT_TAIL = ${c.out_tail and "true" or "false"};
static_assert(STAGE_BYTES % 1024 == 0 && A_BYTES % 1024 == 0 && (WG_ROWS * 128) % 1024 == 0 && (BN * 128) % 1024 == 0,
              "swizzle atoms");
static_assert(BNO % EPI_COLS == 0, "staging passes");

static __device__ __forceinline__ void bar_init(unsigned b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(b), "r"(count) : "memory");
}
static __device__ __forceinline__ void bar_arrive(unsigned b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(b) : "memory");
}
/* Arrive on the mbarrier at b and add bytes to the transaction count its
 * current phase waits for (the TMA copies complete them). */
static __device__ __forceinline__ void bar_arrive_expect_tx(unsigned b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(b), "r"(bytes) : "memory");
}
/* Wait until the phase of parity `parity` of the mbarrier at b completed. */
static __device__ __forceinline__ void bar_wait(unsigned b, unsigned parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" :: "r"(b), "r"(parity) : "memory");
}
/* One TMA box of the 2D tensor map at map (64 halves of k from k0, its box
 * rows from row) into smem s; completes its bytes on the mbarrier at b. */
static __device__ __forceinline__ void tma_load(unsigned s, const moe_tmap_t *map, int k0, int row, unsigned b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(s), "l"((unsigned long long)map), "r"(k0), "r"(row), "r"(b) : "memory");
}
@ if c.evict then
/* tma_load with an L2 cache policy (pol: createpolicy's). */
static __device__ __forceinline__ void tma_load_pol(unsigned s, const moe_tmap_t *map, int k0, int row, unsigned b,
                                                    unsigned long long pol) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(s), "l"((unsigned long long)map), "r"(k0), "r"(row), "r"(b), "l"(pol) : "memory");
}
/* The weights' L2 policy ("+ef"): evict first, so the activation rows that every N tile reads again stay. */
static __device__ __forceinline__ unsigned long long l2_evict_first() {
    unsigned long long p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
@ end
static __device__ __forceinline__ void tma_prefetch_map(const moe_tmap_t *map) {
    asm volatile("prefetch.tensormap [%0];\n" :: "l"((unsigned long long)map) : "memory");
}
static __device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" :: "n"(CTHREADS) : "memory");
}
@ if c.mc then
/* CTA pairs: this CTA's rank in its cluster (0 or 1). */
static __device__ __forceinline__ int pair_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return (int)r;
}
/* tma_load into both CTAs of the pair: the same smem offset s and
 * mbarrier b in each, which the box's bytes complete. */
static __device__ __forceinline__ void tma_load_pair(unsigned s, const moe_tmap_t *map, int k0, int row, unsigned b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 :: "r"(s), "l"((unsigned long long)map), "r"(k0), "r"(row), "r"(b), "h"((unsigned short)3)
                 : "memory");
}
/* A consumer thread's release of the stage whose empty barrier is at b:
 * its own arrival, and for its warp (lane 0, once the warp's wgmma that
 * read the stage retired) one on the other CTA's barrier at the same
 * offset, whose multicast writes this CTA's stage too. The remote arrival
 * keeps mbarrier.arrive's default semantics (release at CTA scope), as
 * the local one: with .release.cluster ptxas adds a fence to every
 * release (56 instructions more per kernel), and the pairs ran 1.6-2.2x
 * slower than the kernels without them (run 146, an H100; 1.1-1.4x with
 * this form, run 151). */
static __device__ __forceinline__ void release(unsigned b) {
    bar_arrive(b);
    if ((threadIdx.x & 31) == 0)
        asm volatile("{\n"
                     ".reg .b32 ra;\n"
                     "mapa.shared::cluster.u32 ra, %0, %1;\n"
                     "mbarrier.arrive.shared::cluster.b64 _, [ra];\n"
                     "}\n" :: "r"(b), "r"(pair_rank() ^ 1) : "memory");
}
/* Every thread of both CTAs (release / acquire at cluster scope). */
static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n"
                 "barrier.cluster.wait.acquire;\n" ::: "memory");
}
@ end
static __device__ __forceinline__ void st_shared_u32(unsigned s, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(s), "r"(v) : "memory");
}
/* 16 bytes smem -> global. */
static __device__ __forceinline__ void copy16_s2g(void *g, unsigned s) {
    unsigned a, b, c, d;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(s) : "memory");
    asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};\n" :: "l"(g), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

/* wgmma smem matrix descriptor: K-major, 128-byte swizzle, 8-row groups
 * 1024 bytes apart (the leading offset is unused for this layout). */
static __device__ __forceinline__ unsigned long long sdesc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
@ if c.b_mn then
/* wgmma smem matrix descriptor of the N-major B tile (read with the
 * instruction's transposed-B bit): 128-byte swizzle atoms of 64 columns x
 * 8 k rows (1024 bytes, TMA's box rows of 128 bytes); the leading offset
 * steps 64 columns (one box: BK k rows of 128 bytes), the stride offset 8
 * k rows. */
static __device__ __forceinline__ unsigned long long sdesc_mn(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(BK * 128 / 16) << 16) | (64ull << 32) |
           (1ull << 62);
}
@ end
/* d (64 x BN fp32, this thread's part) += A(64 x 16) . B(BN x 16)^T. */
static __device__ __forceinline__ void wgmma(float (&d)[NACC], unsigned long long da, unsigned long long db) {
@   local regs = {}
@   for i = 0, c.nacc - 1 do regs[#regs + 1] = "%" .. i end
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %${c.nacc + 2}, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n${c.bn}k16.f32.${c.ptx_type}.${c.ptx_type}\n"
                 "{${table.concat(regs, ", ")}},\n"
                 "%${c.nacc}, %${c.nacc + 1}, p, 1, 1, ${c.a_mn and 1 or 0}, ${c.b_mn and 1 or 0};\n"
                 "}\n"
@   local outs = operand_lines('"+f"(d[%d])', c.nacc, 8)
@   for i, l in ipairs(outs) do
                 ${i == 1 and ": " or "  "}${l}
@   end
                 : "l"(da), "l"(db), "r"(1));
}
/* Keep the compiler from moving accumulator accesses across a wgmma wait. */
static __device__ __forceinline__ void fence_acc(float (&d)[NACC]) {
    asm volatile(""
@   for i, l in ipairs(outs) do
                 ${i == 1 and ": " or "  "}${l}
@   end
                 :: "memory");
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int PENDING> static __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory");
}
@ if c.fp8 then
@   local pregs = {}
@   for i = 0, 63 do pregs[#pregs + 1] = "%" .. i end
@   local pouts = operand_lines('"+f"(d[%d])', 64, 8)
/* d (64 x 128 fp32, this thread's part) = (accumulate ? d : 0) + A(64 x 32) . B(128 x 32)^T, e4m3. */
static __device__ __forceinline__ void wgmma_fp8(float (&d)[64], unsigned long long da, unsigned long long db,
                                                 int accumulate) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3\n"
                 "{${table.concat(pregs, ", ")}},\n"
                 "%64, %65, p, 1, 1;\n"
                 "}\n"
@   for i, l in ipairs(pouts) do
                 ${i == 1 and ": " or "  "}${l}
@   end
                 : "l"(da), "l"(db), "r"(accumulate));
}
static __device__ __forceinline__ void fence_part(float (&d)[64]) {
    asm volatile(""
@   for i, l in ipairs(pouts) do
                 ${i == 1 and ": " or "  "}${l}
@   end
                 :: "memory");
}
/* Two floats to two e4m3 (lo in the low byte), round to nearest even,
 * saturating (runtime/fp8.c's moe_float_to_e4m3 on the host). */
static __device__ __forceinline__ unsigned short e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

@   if c.cs_smem then
/* The up GEMM's "channel" scales on the persistent grid: each consumer
 * warpgroup copies a tile's 256 (gate, then up) into its 1 KB at CS_OFF
 * + cw * 1024, in the staging tile's room (the up GEMM stores from
 * registers), while the tile's main loop runs; its epilogue reads them
 * there instead of from global memory. */
constexpr int CS_OFF = EPI_OFF;
static_assert(PERSISTENT && CONSUMERS * 1024 <= BAR_OFF - EPI_OFF, "the scale buffers fit the staging tile's room");
static __device__ __forceinline__ void cp_async4(unsigned dst, const float *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(dst), "l"(src) : "memory");
}
static __device__ __forceinline__ float2 ld_shared_f2(unsigned a) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a) : "memory");
    return v;
}
/* Consumer warpgroup cw's 128 threads (named barrier 2 + cw). */
static __device__ __forceinline__ void cs_sync(int cw) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(2 + cw) : "memory");
}
@   end

/* The fp8 consumer on one tile: for every k tile (one scale block), each
 * 128-column half of B: part = A . B_half^T over the block's 4 k32 steps,
 * then acc += part * (a scale of the row * b scale of the half's gate or
 * up columns). sa0, sa1: the A scales (KTILES each) of this thread's rows
 * g and g + 8; sbg[h], sbu[h]: the B scales of half h's gate and up
 * columns (the same for the down GEMM), NULL for 1 ("channel": applied in
 * the epilogue). Releases each stage once its last wgmma retired. */
static __device__ __forceinline__ void consume_fp8(float (&acc)[WM][NACC], unsigned sbase, int cw, int &s,
                                                   unsigned &phase, const float *__restrict__ sa0,
                                                   const float *__restrict__ sa1, const float *const (&sbg)[HALVES],
                                                   const float *const (&sbu)[HALVES]) {
    const unsigned long long da0 = sdesc(sbase + (unsigned)cw * (WG_ROWS * 128));
    const unsigned long long db0 = sdesc(sbase + A_BYTES);
    float part[64];
#pragma unroll
    for (int i = 0; i < 64; ++i)
        part[i] = 0.0f;
    for (int kt = 0; kt < KTILES; ++kt) {
        const float a0 = sa0[kt], a1 = sa1[kt];
        bar_wait(sbase + BAR_OFF + s * 8, phase);
        const unsigned long long so = (unsigned long long)(s * (STAGE_BYTES >> 4));
#pragma unroll
        for (int hh = 0; hh < HALVES; ++hh) {
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks)
                wgmma_fp8(part, da0 + so + (unsigned)((ks * 32) >> 4),
                          db0 + so + (unsigned)((hh * (128 * 128) + ks * 32) >> 4), ks > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_part(part);
            const float g = sbg[hh] ? sbg[hh][kt] : 1.0f, u = sbu[hh] ? sbu[hh][kt] : 1.0f;
#pragma unroll
            for (int i = 0; i < 64; ++i)  /* registers 2h, 2h + 1 of a block: rows g + 8h; blocks 2j gate, 2j + 1 up */
                acc[0][hh * 64 + i] += part[i] * ((i & 2 ? a1 : a0) * (i & 4 ? u : g));
        }
        ${c.release}(sbase + BAR_OFF + (STAGES + s) * 8);
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
}
@ end
@ if c.wgrad then

/* The weight gradient's producer (one thread): one tile, k tiles kt = 0
 * .. ktiles - 1 of slot rows first + kt * BK ..: A's BM / 64 boxes (64
 * columns of M from m0, BK rows) and B's BN / 64 (64 columns of N from n0),
 * both N-major in the 128-byte swizzle, from ring position (s, phase),
 * which it advances (the CTA's tiles follow each other in the ring). */
static __device__ __forceinline__ void produce_rows(unsigned sbase, const moe_tmap_t *ma, const moe_tmap_t *mb,
                                                    int first, int ktiles, int m0, int n0, int &s, unsigned &phase) {
    for (int kt = 0; kt < ktiles; ++kt) {
        const unsigned full = sbase + BAR_OFF + s * 8, so = sbase + (unsigned)s * STAGE_BYTES;
        bar_wait(sbase + BAR_OFF + (STAGES + s) * 8, phase ^ 1);
        bar_arrive_expect_tx(full, STAGE_BYTES);
#pragma unroll
        for (int a = 0; a < BM / 64; ++a)
            tma_load(so + a * (BK * 128), ma, m0 + a * 64, first + kt * BK, full);
#pragma unroll
        for (int b = 0; b < BN / 64; ++b)
            tma_load(so + A_BYTES + b * (BK * 128), mb, n0 + b * 64, first + kt * BK, full);
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
}

/* The weight gradient's consumer warpgroup cw: acc (its WG_ROWS x BN fp32
 * tile) = A^T . B over ktiles k tiles of the slot's rows from ring position
 * (s, phase), which it advances, stages released as in consume. The last k
 * tile, when the slot's rows end inside it (tail > 0 rows of it are the
 * slot's), runs once every earlier wgmma retired: rows tail .. BK - 1 of
 * each of its boxes (pad rows or the next slot's, whatever they hold) are
 * zeroed by the CTHREADS consumer threads (ct), made visible to wgmma
 * (fence.proxy.async) and waited for by both warpgroups before its wgmma. */
static __device__ __forceinline__ void consume_rows(float (&acc)[WM][NACC], unsigned sbase, int cw, int ct,
                                                    int ktiles, int tail, int &s, unsigned &phase) {
    const unsigned long long da0 = sdesc_mn(sbase + (unsigned)cw * (WG_ROWS * BK * 2));
    const unsigned long long db0 = sdesc_mn(sbase + A_BYTES);
    const int full_tiles = tail > 0 ? ktiles - 1 : ktiles;  /* k tiles of BK rows of the slot */
    int prev = 0;
    for (int kt = 0; kt < ktiles; ++kt) {
        bar_wait(sbase + BAR_OFF + s * 8, phase);
        if (kt == full_tiles) {  /* the tail tile */
            wgmma_wait<0>();
#pragma unroll
            for (int m = 0; m < WM; ++m)
                fence_acc(acc[m]);
            const unsigned so = sbase + (unsigned)s * STAGE_BYTES;
            const int per_box = (BK - tail) * 8;  /* 16-byte pieces past the rows (the swizzle moves pieces within a row) */
            for (int i = ct; i < (BM + BN) / 64 * per_box; i += CTHREADS)
                asm volatile("st.shared.v4.u32 [%0], {%1,%1,%1,%1};\n"
                             :: "r"(so + (unsigned)((i / per_box) * (BK * 128) + tail * 128 + (i % per_box) * 16)),
                                "r"(0u) : "memory");
            fence_proxy_async();
            consumers_sync();
        }
        wgmma_fence();
        const unsigned long long so = (unsigned long long)(s * (STAGE_BYTES >> 4));
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int m = 0; m < WM; ++m)
                wgmma(acc[m], da0 + so + (unsigned)((m * (64 * BK * 2) + ks * (16 * 128)) >> 4),
                      db0 + so + (unsigned)((ks * (16 * 128)) >> 4));
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > 0)
            bar_arrive(sbase + BAR_OFF + (STAGES + prev) * 8);
        prev = s;
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();  /* on every path (nothing pending without k tiles), so ptxas sees acc settled */
    if (ktiles > 0)
        bar_arrive(sbase + BAR_OFF + (STAGES + prev) * 8);
#pragma unroll
    for (int m = 0; m < WM; ++m)
        fence_acc(acc[m]);
}
@ end
@ if c.pingpong then

/* The ping-pong order: consumer warpgroup cw waits until the other one
 * arrived (having issued the main loop of the tile before cw's), and
 * arrives for the other once it has issued its own; 128 threads each side. */
static __device__ __forceinline__ void order_wait(int cw) {
    asm volatile("bar.sync %0, 256;\n" :: "r"(ORDER_BAR + cw) : "memory");
}
static __device__ __forceinline__ void order_arrive(int cw) {
    asm volatile("bar.arrive %0, 256;\n" :: "r"(ORDER_BAR + 1 - cw) : "memory");
}
/* Consumer warpgroup cw alone (its staging tile's passes). */
static __device__ __forceinline__ void wg_sync(int cw) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(EPI_BAR + cw) : "memory");
}
/* Step ring position (s, phase) over one tile's KTILES stages: the tile
 * the other warpgroup runs. */
static __device__ __forceinline__ void ring_skip(int &s, unsigned &phase) {
    const int p = s + KTILES;
    s = p % STAGES;
    phase ^= (unsigned)(p / STAGES) & 1u;
}
@ end

@   import("gemm_sm80").tile_of(c.group_m)
@ if c.mc then
/* CTA pairs: item lin of the pair grid (pair row i = M tiles 2i and 2i +
 * 1, N tile nt, by the raster over the (mtiles + 1) / 2 pair rows): this
 * CTA's M tile mt (2i + rank), whether it has rows (mine), whether either
 * has (any: both CTAs run the item's stages), and whether both have rows
 * of one expert (share: one B tile, multicast). */
struct pair_item {
    int mt, nt;
    bool mine, any, share;
};
static __device__ __forceinline__ pair_item pair_of(int lin, int mtiles, const moe_tile_t *__restrict__ tiles,
                                                    int rank) {
    pair_item it;
    int pi;
    tile_of(lin, (mtiles + 1) >> 1, NTILES, pi, it.nt);
    const int m0 = 2 * pi;
    const bool v0 = tiles[m0].rows > 0, v1 = m0 + 1 < mtiles && tiles[m0 + 1].rows > 0;
    it.mt = m0 + rank;
    it.mine = rank ? v1 : v0;
    it.any = v0 || v1;
    it.share = v0 && v1 && tiles[m0].expert == tiles[m0 + 1].expert;
    return it;
}
@ end

/* The producer (one thread): for every tile of this CTA, every k tile of
 * A (rows from row_start, map ma) and B (rows from expert * N + n0, map
 * mb) into the ring. Stage s is refilled once empty[s] completed the
 * phase of its previous round (the first round passes at once: a fresh
 * barrier counts its phase of parity 1 as complete). */
static __device__ __forceinline__ void produce(unsigned sbase, const moe_tmap_t *ma, const moe_tmap_t *mb,
                                               const moe_tile_t *__restrict__ tiles, int mtiles) {
    int s = 0;
    unsigned phase = 0;
@ if c.evict then
    const unsigned long long pol_b = l2_evict_first();
@ end
@ if c.mc then
    const int rank = pair_rank();
    for (int lin = ${c.lin0}; lin < ((mtiles + 1) >> 1) * NTILES; lin += ${c.lstep}) {
        const pair_item it = pair_of(lin, mtiles, tiles, rank);
        if (!it.any)
            continue;
        const int expert = it.mine ? tiles[it.mt].expert : 0, row_start = it.mine ? tiles[it.mt].row_start : 0;
        const int brow = expert * N + it.nt * BN;
        /* what lands here: A if this CTA has rows, B if it has or the pair shares it */
        const unsigned bytes = (it.mine ? A_BYTES : 0) + (it.mine || it.share ? STAGE_BYTES - A_BYTES : 0);
        for (int kt = 0; kt < KTILES; ++kt) {
            const unsigned full = sbase + BAR_OFF + s * 8, so = sbase + (unsigned)s * STAGE_BYTES;
            bar_wait(sbase + BAR_OFF + (STAGES + s) * 8, phase ^ 1);  /* both CTAs' consumers released it */
            bar_arrive_expect_tx(full, bytes);
            if (it.mine) {
#pragma unroll
                for (int a = 0; a < KATOMS; ++a)
                    tma_load(so + a * (BM * 128), ma, kt * BK + a * ${c.atom_elems}, row_start, full);
            }
            if (it.share) {  /* the CTA of rank kt % 2 loads B into both */
                if ((kt & 1) == rank) {
#pragma unroll
                    for (int a = 0; a < KATOMS; ++a)
                        tma_load_pair(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * ${c.atom_elems}, brow, full);
                }
            } else if (it.mine) {
#pragma unroll
                for (int a = 0; a < KATOMS; ++a)
                    tma_load(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * ${c.atom_elems}, brow, full);
            }
            if (++s == STAGES) {
                s = 0;
                phase ^= 1;
            }
        }
    }
@ else
    for (int lin = ${c.lin0}; lin < mtiles * NTILES; lin += ${c.lstep}) {
        int mt, nt;
        tile_of(lin, mtiles, NTILES, mt, nt);
        const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
        if (rows <= 0)
            continue;
@ if c.b_mn then
        const int brow = expert * K;  /* B N-major: the slot's [K, N] rows, boxes of 64 columns x BK k rows */
@ else
        const int brow = expert * N + nt * BN;
@ end
        for (int kt = ${c.kt_lo}; kt < ${c.kt_hi}; ++kt) {
            const unsigned full = sbase + BAR_OFF + s * 8, so = sbase + (unsigned)s * STAGE_BYTES;
            bar_wait(sbase + BAR_OFF + (STAGES + s) * 8, phase ^ 1);
            bar_arrive_expect_tx(full, STAGE_BYTES);
#pragma unroll
            for (int a = 0; a < KATOMS; ++a) {
                tma_load(so + a * (BM * 128), ma, kt * BK + a * ${c.atom_elems}, row_start, full);
@ if c.b_mn then
            }
#pragma unroll
            for (int b = 0; b < BN / 64; ++b) {
                tma_load(so + A_BYTES + b * (BK * 128), mb, nt * BN + b * 64, brow + kt * BK, full);
@ elseif c.evict then
                tma_load_pol(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * ${c.atom_elems}, brow, full, pol_b);
@ else
                tma_load(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * ${c.atom_elems}, brow, full);
@ end
            }
            if (++s == STAGES) {
                s = 0;
                phase ^= 1;
            }
        }
    }
@ end
}

@ if c.gather then
/* The gathering producer (the call's src_of given; docs/DESIGN.md, "The
 * gathered up GEMM"): the 128 threads of warpgroup 0. Row i of a tile's A
 * is x[src_of[row_start + i]]; thread pt copies 16-byte chunk j = pt % 8 of
 * rows pt / 8 + 16 m by cp.async to where TMA's 128-byte swizzle puts it
 * (chunk j of row r at r * 128 + ((j ^ (r % 8)) << 4) of each 64-column
 * atom; r % 8 = pt / 8 % 8 for all of a thread's rows); rows past the
 * tile's and columns past K arrive as zeros (a copy of 0 source bytes), as
 * TMA's would. Each copy asks L2 to fetch 256 bytes (.L2::256B: this
 * chunk's sector and the row's next stages'; without it Mixtral's up GEMM
 * read 1.8x the DRAM bytes of the TMA-fed one and ran up to 1.6x slower,
 * with 128 bytes no better). Each thread's copies complete on full[s] by
 * cp.async.mbarrier.arrive.noinc (full then counts 1 + 128 arrivals), so
 * no thread waits for its own loads; the consumers fence the async proxy
 * after each full wait (consume). Thread 0 also arms full[s] with B's bytes
 * and loads B by TMA as produce does. */
static __device__ __forceinline__ void produce_gather(unsigned sbase, const moe_tmap_t *mb,
                                                      const moe_tile_t *__restrict__ tiles, int mtiles,
                                                      const moe_half_t *__restrict__ gx,
                                                      const int *__restrict__ src_of, int pt) {
    constexpr int RPT = BM / 16;  /* rows per thread */
    const int j = pt & 7, r0 = pt >> 3;
    const unsigned my = (unsigned)r0 * 128u + ((unsigned)(j ^ (r0 & 7)) << 4);  /* in a stage's A atom */
@ if c.evict then
    const unsigned long long pol_b = l2_evict_first();
@ end
    int s = 0;
    unsigned phase = 0;
    for (int lin = ${c.lin0}; lin < mtiles * NTILES; lin += ${c.lstep}) {
        int mt, nt;
        tile_of(lin, mtiles, NTILES, mt, nt);
        const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
        if (rows <= 0)
            continue;
        const int brow = expert * N + nt * BN;
        int tok[RPT];  /* the token of each of this thread's rows; -1 past the tile's rows */
#pragma unroll
        for (int m = 0; m < RPT; ++m)
            tok[m] = r0 + 16 * m < rows ? src_of[row_start + r0 + 16 * m] : -1;
        for (int kt = ${c.kt_lo}; kt < ${c.kt_hi}; ++kt) {
            const unsigned full = sbase + BAR_OFF + s * 8, so = sbase + (unsigned)s * STAGE_BYTES;
            bar_wait(sbase + BAR_OFF + (STAGES + s) * 8, phase ^ 1);
            if (pt == 0) {
                bar_arrive_expect_tx(full, STAGE_BYTES - A_BYTES);
#pragma unroll
                for (int a = 0; a < KATOMS; ++a)
@ if c.evict then
                    tma_load_pol(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * ${c.atom_elems}, brow, full, pol_b);
@ else
                    tma_load(so + A_BYTES + a * (BN * 128), mb, kt * BK + a * ${c.atom_elems}, brow, full);
@ end
            }
#pragma unroll
            for (int a = 0; a < KATOMS; ++a) {
                const int col = kt * BK + a * 64 + j * 8;
#pragma unroll
                for (int m = 0; m < RPT; ++m) {
                    const bool on = tok[m] >= 0 && col < K;
                    const moe_half_t *src = on ? gx + ((long long)tok[m] * K + col) : gx;
                    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n"
                                 :: "r"(so + a * (BM * 128) + my + m * (16 * 128)), "l"(src), "r"(on ? 16 : 0)
                                 : "memory");
                }
            }
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(full) : "memory");
            if (++s == STAGES) {
                s = 0;
                phase ^= 1;
            }
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

@ end
/* A consumer warpgroup (cw) on one tile: acc (its WG_ROWS x BN fp32 tile)
 * = A . B^T over all k tiles, from ring position (s, phase), which it
 * advances. The wgmma of k tile kt stay in flight while the warpgroup
 * waits for tile kt + 1; a stage is released once the wgmma that read it
 * retired (wait_group 1 after the next commit; the last one after
 * wait_group 0), so the producer refills it during the epilogue. */
@ if c.pingpong then
/* Ping-pong: the warpgroup's rows are the whole tile, of which the first
 * ACT m64 blocks are computed (a short tile's others stay 0: a compile-time
 * count, since a branch among the wgmma makes ptxas wait on them), and it
 * arrives for the other warpgroup once its last stage's wgmma are issued. */
template <int ACT>
static __device__ __forceinline__ void consume(float (&acc)[WM][NACC], unsigned sbase, int cw, int &s,
                                               unsigned &phase${c.gather and ", bool gathered" or ""}) {
    const unsigned long long da0 = sdesc(sbase);
@ else
@   if c.wm > 1 then
/* Two m64 blocks a consumer warpgroup (bm 256 on two consumers): the
 * first ACT are computed, as on the ping-pong (a compile-time count) */
template <int ACT>
@   end
static __device__ __forceinline__ void consume(float (&acc)[WM][NACC], unsigned sbase, int cw, int &s,
                                               unsigned &phase${c.gather and ", bool gathered" or ""}) {
    const unsigned long long da0 = sdesc(sbase + (unsigned)cw * (WG_ROWS * 128));
@ end
    const unsigned long long db0 = ${c.bdesc}(sbase + A_BYTES);
    int prev = 0;
    for (int kt = ${c.kt_lo}; kt < ${c.kt_hi}; ++kt) {
        bar_wait(sbase + BAR_OFF + s * 8, phase);
@ if c.gather then
        if (gathered)  /* A came by cp.async (generic proxy); wgmma reads by the async proxy */
            fence_proxy_async();
@ end
        wgmma_fence();
        const unsigned long long so = (unsigned long long)(s * (STAGE_BYTES >> 4));
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int m = 0; m < ${(c.pingpong or c.wm > 1) and "ACT" or "WM"}; ++m)
                wgmma(acc[m], da0 + so + (unsigned)(((ks / 4) * (BM * 128) + m * (64 * 128) + (ks % 4) * 32) >> 4),
                      db0 + so + (unsigned)((${c.b_koff}) >> 4));
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > ${c.kt_lo})
            ${c.release}(sbase + BAR_OFF + (STAGES + prev) * 8);
        prev = s;
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
@ if c.pingpong then
    order_arrive(cw);
@ end
    wgmma_wait<0>();
    ${c.release}(sbase + BAR_OFF + (STAGES + prev) * 8);
#pragma unroll
    for (int m = 0; m < WM; ++m)
        fence_acc(acc[m]);
}

/* A consumer warpgroup with no rows in the tile: release every stage of
 * the tile without computing, in ring order (waiting for each to fill, so
 * it never arrives twice in one phase). */
static __device__ __forceinline__ void skip_tile(unsigned sbase, int &s, unsigned &phase) {
    for (int kt = ${c.kt_lo}; kt < ${c.kt_hi}; ++kt) {
        bar_wait(sbase + BAR_OFF + s * 8, phase);
        ${c.release}(sbase + BAR_OFF + (STAGES + s) * 8);
        if (++s == STAGES) {
            s = 0;
            phase ^= 1;
        }
    }
}

/* Copy the staged output (BM x EPI_COLS halves at smem sc, row stride
 * LDC) to out (row 0, column 0 of the pass; row stride NOUT) in 16-byte
 * pieces: rows < rows, columns < cols. ct: consumer thread 0..${c.releasers}-1. */
static __device__ __forceinline__ void store_staged(moe_half_t *__restrict__ out, unsigned sc, int rows, int cols,
                                                    int ct) {
    constexpr int OCPR = EPI_COLS / 8;
    constexpr int CHUNKS = BM * OCPR;
    constexpr int ITERS = (CHUNKS + ${c.releasers} - 1) / ${c.releasers};
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
        const int idx = ct + i * ${c.releasers};
        const int r = idx / OCPR, ch = idx % OCPR;
        if ((CHUNKS % ${c.releasers} == 0 || idx < CHUNKS) && r < rows && (!OUT_TAIL || ch * 8 < cols))
            copy16_s2g(out + ((long long)r * NOUT + ch * 8), sc + (r * LDC + ch * 8) * 2);
    }
}
@ if c.splitk > 0 then

/* Whether v is set in any consumer thread (bar.red.or on the consumers'
 * named barrier 1, as consumers_sync: a barrier too). */
static __device__ __forceinline__ bool consumers_any(bool v) {
    unsigned r;
    asm volatile("{\n"
                 ".reg .pred p, q;\n"
                 "setp.ne.u32 p, %1, 0;\n"
                 "bar.red.or.pred q, 1, %2, p;\n"
                 "selp.u32 %0, 1, 0, q;\n"
                 "}\n" : "=r"(r) : "r"((unsigned)v), "n"(CTHREADS) : "memory");
    return r != 0;
}

/* Split-K, once this CTA's main loop of tile lin retired: each consumer
 * thread ct stores its accumulators of the tile's rows (rows of it; the
 * others are never stored, so neither saved nor summed) to this split's
 * partial tile (part + (lin * SPLITK + split) * BM * BN floats, [m][i][ct]:
 * every store and load coalesced), then thread 0 takes
 * the tile's ticket (tickets[lin]). The CTA holding the last one resets it
 * to 0 (the next launch, or graph replay, starts clean even without the
 * memset), sums the SPLITK partials into acc in split order, its own from
 * registers (the same values), and returns true: it runs the epilogue.
 * The others return false. Order: each thread's stores, its fence, the
 * consumers' barrier, thread 0's fence and atomic (release); in the last
 * CTA thread 0's atomic, its fence, the barrier (acquire), then the loads,
 * through L2 (ld.global.cg). */
static __device__ __forceinline__ bool splitk_reduce(float (&acc)[WM][NACC], float *part, int *tickets, int lin,
                                                     int ct, int rows) {
    const int split = split_of();
    float *tile = part + (long long)lin * SPLITK * (BM * BN);
    /* registers 2h, 2h + 1 of each n8 block are row r0 + m * 64 + 8h of the tile (warpgroup ct / 128, its
     * warp, the lane's group) */
    const int r0 = (ct >> 7) * WG_ROWS + ((ct >> 5) & 3) * 16 + ((ct & 31) >> 2);
#pragma unroll
    for (int m = 0; m < WM; ++m)
#pragma unroll
        for (int i = 0; i < NACC; ++i)
            if (r0 + m * 64 + 8 * ((i >> 1) & 1) < rows)
                __stcg(tile + (long long)split * (BM * BN) + (m * NACC + i) * CTHREADS + ct, acc[m][i]);
    __threadfence();
    consumers_sync();
    bool last = false;
    if (ct == 0) {
        __threadfence();
        last = atomicAdd(tickets + lin, 1) == SPLITK - 1;
        if (last)
            atomicExch(tickets + lin, 0);
        __threadfence();
    }
    if (!consumers_any(last))
        return false;
#pragma unroll
    for (int m = 0; m < WM; ++m)
#pragma unroll
        for (int i = 0; i < NACC; ++i)
            if (r0 + m * 64 + 8 * ((i >> 1) & 1) < rows) {
                float sum = 0.0f;
                for (int sp = 0; sp < SPLITK; ++sp)
                    sum += sp == split ? acc[m][i]
                                       : __ldcg(tile + (long long)sp * (BM * BN) + (m * NACC + i) * CTHREADS + ct);
                acc[m][i] = sum;
            }
    return true;
}
@ end
@ end
@
@ -- CTA pairs: the consumers' loop over the pair grid's items, opened with
@ -- the names the tile loop gives its body (nt, expert, row_start, rows: 0
@ -- where this CTA's tile has none, its stages released unread); ind: the
@ -- loop's indentation.
@ local function pair_loop(c, ind)
${ind}for (int lin = ${c.lin0}; lin < ((mtiles + 1) >> 1) * NTILES; lin += ${c.lstep}) {
${ind}    const pair_item it = pair_of(lin, mtiles, tiles, rank);
${ind}    if (!it.any)
${ind}        continue;
${ind}    const int nt = it.nt, expert = it.mine ? tiles[it.mt].expert : 0;
${ind}    const int row_start = it.mine ? tiles[it.mt].row_start : 0, rows = it.mine ? tiles[it.mt].rows : 0;
@ end
@
@ -- The ping-pong consumers' tile loop (in place of the shared one in
@ -- kernel; the same names in scope for epilogue, with cw the warpgroup
@ -- running the whole tile and sst its own staging tile).
@ local function pingpong_consumers(p, c, out, bias_arg, oc0, epilogue)
        /* tile jt (counting this CTA's tiles with rows) is warpgroup jt % 2's */
        const int cw = wg - 1, ct = tid & 127, w = ct >> 5, lane = ct & 31, g = lane >> 2, q = lane & 3;
        const unsigned sst = sbase + EPI_OFF + (unsigned)cw * EPI_BYTES;
@   if c.direct then
        (void)sst;  /* stored from registers, no staging */
@   end
        int s = 0, jt = 0;
        unsigned phase = 0;
@   if bias_arg and not p.ffn_bias then
        (void)${bias_arg};
@   end
@   if c.mc then
@     pair_loop(c, "        ")
@   else
        for (int lin = (int)blockIdx.x; lin < mtiles * NTILES; lin += (int)gridDim.x) {
            int mt, nt;
            tile_of(lin, mtiles, NTILES, mt, nt);
            const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
            if (rows <= 0)
                continue;
@   end
            if ((jt++ & 1) != cw) {  /* the other warpgroup's tile: step over its stages */
                ring_skip(s, phase);
                continue;
            }
            if (jt > 1)
                order_wait(cw);  /* the other warpgroup issued the main loop of tile jt - 2 */
@   if c.mc then
            if (rows <= 0) {  /* the pair's other CTA's tile alone: release the stages unread */
                skip_tile(sbase, s, phase);
                order_arrive(cw);
                continue;
            }
@   end
            const int n0 = nt * BN;
            (void)expert;
            float acc[WM][NACC];
#pragma unroll
            for (int m = 0; m < WM; ++m)
#pragma unroll
                for (int i = 0; i < NACC; ++i)
                    acc[m][i] = 0.0f;
#pragma unroll
            for (int m = 0; m < WM; ++m)
                fence_acc(acc[m]);  /* the zeros are written before the main loop's wgmma.fence */
            /* consume arrives for the other warpgroup once its main loop is issued */
@   if c.wm == 2 then
            if (rows > 64)
                consume<2>(acc, sbase, cw, s, phase${c.gather and ", src_of != nullptr" or ""});
            else  /* a short tile (an expert's last): the m64 block with rows alone */
                consume<1>(acc, sbase, cw, s, phase${c.gather and ", src_of != nullptr" or ""});
@   else
            consume<${c.wm}>(acc, sbase, cw, s, phase${c.gather and ", src_of != nullptr" or ""});
@   end
@   if c.direct then
            {  /* stored from registers (dgrad_down): under the other warpgroup's main loop */
@     epilogue()
            }
@   else
#pragma unroll
            for (int pass = 0; pass < BNO / EPI_COLS; ++pass) {
                wg_sync(cw);  /* this warpgroup's staging tile: its last pass (or tile) is stored */
                {
@   epilogue()
                }
                wg_sync(cw);
                store_staged(${out} + ((long long)row_start * NOUT + ${oc0} + pass * EPI_COLS), sst, rows,
                             NOUT - ${oc0} - pass * EPI_COLS, ct);
            }
@   end
        }
        /* the arrival after the CTA's last tile (jt - 1) is for warpgroup jt % 2 */
        if (jt > 0 && (jt & 1) == cw)
            order_wait(cw);
@ end
@
@ -- The kernel: signature, guard, barrier setup, the role split, the
@ -- consumers' tile loop; epilogue(p, c) emits the consumer's staging of
@ -- acc for output columns [pass * EPI_COLS, (pass + 1) * EPI_COLS) of
@ -- the tile (names in scope: acc, sst (the staging tile, row stride LDC),
@ -- pass, cw, w, g, q, expert, n0, rows); out/oc0 name the output.
@ local function kernel(p, c, args, ma, mb, out, bias_arg, oc0, preamble, epilogue)
${ARCH_GUARD}
namespace ${p.kernel}_impl {
@   device_code(p, c)
@   if preamble then preamble() end
}  // namespace ${p.kernel}_impl
#endif

extern "C" __global__ void __launch_bounds__(${p.threads}, 1)${c.mc and CLUSTER_DIMS or ""}
${p.kernel}(${args}) {
${ARCH_GUARD}
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    extern __shared__ __align__(1024) unsigned char ${p.kernel}_smem[];
    const unsigned sbase = moe_smem_addr(${p.kernel}_smem);
    if (sbase & 1023u)
        __trap();  /* the swizzle atoms need 1024-byte alignment */
    const int mtiles = *num_tiles;
    const int tid = (int)threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    if (tid == 0) {
        tma_prefetch_map(&${ma});
        tma_prefetch_map(&${mb});
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            bar_init(sbase + BAR_OFF + s * 8, ${c.gather and "src_of ? 1 + 128 : 1" or "1"});
@   if c.mc then
            /* and one arrival per releasing warp of the other CTA */
            bar_init(sbase + BAR_OFF + (STAGES + s) * 8, ${c.releasers} + ${c.releasers} / 32);
@   else
            bar_init(sbase + BAR_OFF + (STAGES + s) * 8, ${c.releasers});
@   end
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
@   if c.mc then
    cluster_sync();  /* both CTAs' barriers initialized before any copy or arrival reaches them */
    const int rank = pair_rank();
    (void)rank;
@   end
    if (wg == 0) {
@   if c.consumer_regs then
        asm volatile("setmaxnreg.dec.sync.aligned.u32 ${c.producer_regs};\n" ::: "memory");
@   end
@   if c.gather then
        if (src_of)  /* the rows gathered from x (the call's scatter wrote only the maps) */
            produce_gather(sbase, &${mb}, tiles, mtiles, gx, src_of, tid);
        else if (tid == 0)
            produce(sbase, &${ma}, &${mb}, tiles, mtiles);
@   else
        if (tid == 0)
            produce(sbase, &${ma}, &${mb}, tiles, mtiles);
@   end
    } else {
@   if c.consumer_regs then
        asm volatile("setmaxnreg.inc.sync.aligned.u32 ${c.consumer_regs};\n" ::: "memory");
@   end
@   if c.pingpong then
@     pingpong_consumers(p, c, out, bias_arg, oc0, epilogue)
@   else
        const int ct = tid - 128, cw = wg - 1, w = (ct >> 5) & 3, lane = ct & 31, g = lane >> 2, q = lane & 3;
        const unsigned sst = sbase + EPI_OFF;
@   if c.direct then
        (void)sst;  /* the fp8 up GEMM stores from registers */
@   end
        int s = 0;
        unsigned phase = 0;
@   if bias_arg and not p.ffn_bias then
        (void)${bias_arg};
@   end
@   if c.mc then
@     pair_loop(c, "        ")
@   else
        for (int lin = ${c.lin0}; lin < mtiles * NTILES; lin += ${c.lstep}) {
            int mt, nt;
            tile_of(lin, mtiles, NTILES, mt, nt);
            const int expert = tiles[mt].expert, row_start = tiles[mt].row_start, rows = tiles[mt].rows;
            if (rows <= 0)
                continue;
@   end
            const int n0 = nt * BN;
            (void)expert;
            /* consumer warpgroups with rows of the tile; the others only release the stages */
            const int n_active = ((rows < BM ? rows : BM) + WG_ROWS - 1) / WG_ROWS;
@   if c.cs_smem then
            const unsigned csb = sbase + CS_OFF + (unsigned)cw * 1024;  /* this warpgroup's tile scales: 256 fp32 */
@   end
            float acc[WM][NACC];
#pragma unroll
            for (int m = 0; m < WM; ++m)
#pragma unroll
                for (int i = 0; i < NACC; ++i)
                    acc[m][i] = 0.0f;
@   if c.fp8 then
            if (cw < n_active) {
                /* the A scales of this thread's rows, the B scales of each half (gen/pack_geom.h's w1s/w2s:
                 * [slot, N/128, K/128] "block", plain row order: gate blocks, then up) */
                const float *__restrict__ sa0 = ${c.asc} + (long long)(row_start + cw * WG_ROWS + w * 16 + g) * KTILES;
                const float *__restrict__ sa1 = sa0 + 8 * KTILES;
                const float *sbg[HALVES], *sbu[HALVES];
#pragma unroll
                for (int hh = 0; hh < HALVES; ++hh) {
@     if not c.block then
                    sbg[hh] = sbu[hh] = nullptr;
@     elseif c.up then
                    const long long f0 = (n0 + hh * 128) / 2;  /* the half's first output column */
                    sbg[hh] = ${c.bsc} + ((long long)expert * SB_ROWS + f0 / 128) * KTILES;
                    sbu[hh] = ${c.bsc} + ((long long)expert * SB_ROWS + SB_ROWS / 2 + f0 / 128) * KTILES;
@     else
                    sbg[hh] = sbu[hh] = n0 + hh * 128 < N
                        ? ${c.bsc} + ((long long)expert * SB_ROWS + (n0 + hh * 128) / 128) * KTILES : nullptr;
@     end
                }
@     if c.cs_smem then
                /* the tile's channel scales of W1 (gate columns n0 / 2 .. + 127, then up) into this warpgroup's
                 * buffer by cp.async, landing during the main loop; the barrier first: every thread of the
                 * warpgroup is done reading the last tile's */
                cs_sync(cw);
                {
                    const float *__restrict__ src = w1s + (long long)expert * N + n0 / 2 + (ct & 127);
                    cp_async4(csb + (ct & 127) * 4, src);
                    cp_async4(csb + (128 + (ct & 127)) * 4, src + NOUT);
                    moe_cp_async_commit();
                }
@     end
                consume_fp8(acc, sbase, cw, s, phase, sa0, sa1, sbg, sbu);
            } else {
                skip_tile(sbase, s, phase);
            }
@   else
            if (cw >= n_active)
                skip_tile(sbase, s, phase);
@     if c.wm > 1 then
            else if (rows - cw * WG_ROWS > 64)
                consume<2>(acc, sbase, cw, s, phase${c.gather and ", src_of != nullptr" or ""});
            else  /* the warpgroup's first m64 block alone has rows */
                consume<1>(acc, sbase, cw, s, phase${c.gather and ", src_of != nullptr" or ""});
@     else
            else
                consume(acc, sbase, cw, s, phase${c.gather and ", src_of != nullptr" or ""});
@     end
@   end
@   if c.splitk > 0 then
            if (!splitk_reduce(acc, splitk_part, splitk_tickets, lin, ct, rows))
                continue;  /* another split's CTA finishes the tile */
@   end
@   if not c.persistent then
            /* the output is staged in the ring: order this warpgroup's wgmma
             * reads of it (async proxy) before the stores below */
            fence_proxy_async();
@   end
@   if c.direct then
            if (cw < n_active) {  /* stored from registers, no staging */
@     epilogue()
            }
@   else
#pragma unroll
            for (int pass = 0; pass < BNO / EPI_COLS; ++pass) {
                consumers_sync();  /* the staging tile's last pass (or tile) is stored, every wgmma retired */
                if (cw < n_active) {
@   epilogue()
                }
                consumers_sync();
                store_staged(${out} + ((long long)row_start * NOUT + ${oc0} + pass * EPI_COLS), sst, rows,
                             NOUT - ${oc0} - pass * EPI_COLS, ct);
            }
@   end
        }
@   end
    }
@   if c.mc then
    cluster_sync();  /* no CTA leaves while the other may still arrive on its barriers */
@   end
#else
@   for v in args:gmatch("([%w_]+),") do
    (void)${v};
@   end
    (void)${args:match("([%w_]+)$")};
    __trap();
#endif
}
@ end
@
@ -- The call of the activation function fn on args in an epilogue, which
@ -- has its tile's weight slot as `expert` (templates/activation.lua,
@ -- M.call_slot: the shared expert's slots may run their own).
@ local function act_call(p, fn, args)
@   return import("activation").call_slot(p, fn, "expert", args)
@ end
@
@ function M.up(p)
@   local c = config(p, "up")
@   local function call(fn, args) return act_call(p, fn, args) end
@   local act = import("activation").name(p)  -- the activation's function (its shared twin: act_call)
@   local args = "const __grid_constant__ moe_tmap_t xs_map, const __grid_constant__ moe_tmap_t w1p_map, " ..
@                "const moe_half_t *__restrict__ b1p, const moe_tile_t *__restrict__ tiles, " ..
@                "const int *__restrict__ num_tiles, moe_half_t *__restrict__ hbuf"
@   if p.spec.training then   -- the pre-activation U for the backward (gemm_up_swiglu.lua's header)
@     args = args .. ", moe_half_t *__restrict__ ubuf"
@   end
@   if c.splitk > 0 then
@     args = args .. SPLITK_ARGS
@   end
@   if c.gather then   -- last: x and the rows' tokens (NULL: A from xs_map, as without)
@     args = args .. ", const moe_half_t *__restrict__ gx, const int *__restrict__ src_of"
@   end
@   local function preamble()
@     import("activation").device(p)
@   end
@   if c.fp8 then
@     c.up, c.direct, c.asc, c.bsc = true, true, "xsc", "w1s"
@     args = "const __grid_constant__ moe_tmap_t xs_map, const __grid_constant__ moe_tmap_t w1p_map, " ..
@            "const float *__restrict__ xsc, const float *__restrict__ w1s, " ..
@            "const moe_half_t *__restrict__ b1p, const moe_tile_t *__restrict__ tiles, " ..
@            "const int *__restrict__ num_tiles, unsigned char *__restrict__ hq, float *__restrict__ hsc"
@     -- "channel" scales on the persistent grid: staged in shared memory per tile (kernel's cs_smem)
@     c.cs_smem = not c.block and c.persistent
@     local function epilogue_fp8()
                /* The activation of gate and up (packed columns 16j + r, r < 8 gate: accumulator
                 * registers 8j..8j+3 gate, 8j+4..8j+7 up; 2h, 2h + 1: row 16w + g + 8h, columns
                 * 2q, 2q + 1), quantized per row over the tile's 128 output columns: the quad
                 * (q = 0..3) holds a row's 128 values. The first pass computes each value once,
                 * keeps it in its gate register (8j + 2h, + 1) and takes the row's amax; the
                 * second quantizes them, lanes q and q ^ 1 trading halves so that each stores 4
                 * codes of one row (q even: row g, columns 2q .. 2q + 3; q odd: row g + 8,
                 * columns 2q - 2 .. 2q + 1). */
@       if p.ffn_bias then
                const moe_half_t *__restrict__ bias = b1p + (long long)expert * N + n0;
@       end
@       if c.cs_smem then
                moe_cp_async_wait<0>();
                cs_sync(cw);  /* every thread's copies of the tile's scales landed */
@       elseif not c.block then
                const float *__restrict__ cg = w1s + (long long)expert * N + n0 / 2;  /* plain rows: gate f, up F + f */
                const float *__restrict__ cu = cg + NOUT;
@       end
                float amax[2] = {0.0f, 0.0f};
#pragma unroll
                for (int j = 0; j < BNO / 8; ++j) {
                    const int lf = 8 * j + 2 * q;  /* the tile's output column of registers 2h */
@       local sg0, sg1, su0, su1 = "", "", "", ""
@       if c.cs_smem then
@         sg0, sg1, su0, su1 = " * sg.x", " * sg.y", " * su.x", " * su.y"
                    const float2 sg = ld_shared_f2(csb + lf * 4), su = ld_shared_f2(csb + (128 + lf) * 4);
@       elseif not c.block then
@         sg0, sg1, su0, su1 = " * cg[lf]", " * cg[lf + 1]", " * cu[lf]", " * cu[lf + 1]"
@       end
@       local bg0, bg1, bu0, bu1 = "", "", "", ""
@       if p.ffn_bias then
@         bg0, bg1, bu0, bu1 = " + moe_lo_float(bgv)", " + moe_hi_float(bgv)", " + moe_lo_float(buv)", " + moe_hi_float(buv)"
                    const unsigned bgv = *(const unsigned *)(bias + j * 16 + 2 * q);
                    const unsigned buv = *(const unsigned *)(bias + j * 16 + 8 + 2 * q);
@       end
@       if c.block then
                    (void)lf;
@       end
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        float &o0 = acc[0][8 * j + 2 * h], &o1 = acc[0][8 * j + 2 * h + 1];
                        o0 = ${call(act, "acc[0][8 * j + 2 * h]" .. sg0 .. bg0 .. ", acc[0][8 * j + 4 + 2 * h]" .. su0 .. bu0)};
                        o1 = ${call(act, "acc[0][8 * j + 2 * h + 1]" .. sg1 .. bg1 .. ", acc[0][8 * j + 5 + 2 * h]" .. su1 .. bu1)};
                        amax[h] = fmaxf(amax[h], fmaxf(fabsf(o0), fabsf(o1)));
                    }
                }
                float mul[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float m = amax[h];
                    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
                    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
                    m = fmaxf(m, 1e-4f);
                    mul[h] = 448.0f / m;
                    const int r = cw * WG_ROWS + w * 16 + g + 8 * h;
                    if (q == 0 && r < rows)
                        hsc[(long long)(row_start + r) * (NOUT / 128) + n0 / 256] = m / 448.0f;
                }
                const int hs = q & 1;  /* the row this lane stores: g + 8 hs */
                const int rs = cw * WG_ROWS + w * 16 + g + 8 * hs;
                unsigned char *__restrict__ dst = hq + (long long)(row_start + rs) * NOUT + n0 / 2 + 2 * q - 2 * hs;
#pragma unroll
                for (int j = 0; j < BNO / 8; ++j) {
                    const unsigned c0 = e4m3x2(acc[0][8 * j] * mul[0], acc[0][8 * j + 1] * mul[0]);
                    const unsigned c1 = e4m3x2(acc[0][8 * j + 2] * mul[1], acc[0][8 * j + 3] * mul[1]);
                    const unsigned got = __shfl_xor_sync(0xffffffffu, hs ? c0 : c1, 1);
                    if (rs < rows)
                        *(unsigned *)(dst + 8 * j) = hs ? got | c1 << 16 : c0 | got << 16;
                }
@     end
@     kernel(p, c, args, "xs_map", "w1p_map", "hq", "b1p", "n0 / 2", preamble, epilogue_fp8)
@     return
@   end
@   local function epilogue()
                    /* Packed column 16j + r is gate (r < 8) or up (r >= 8) of output
                     * column 8j + r % 8: accumulator block 2j (registers 8j..8j+3) is
                     * gate and 2j + 1 (8j+4..8j+7) up; registers 2h, 2h + 1 of a block
                     * are row 16w + g + 8h, columns 2q, 2q + 1. */
@     if p.ffn_bias then
                    const moe_half_t *__restrict__ bias = b1p + (long long)expert * N + n0;
@     end
#pragma unroll
                    for (int j = pass * (EPI_COLS / 8); j < (pass + 1) * (EPI_COLS / 8); ++j) {
@     local bg0, bg1, bu0, bu1 = "", "", "", ""
@     if p.ffn_bias then
@       bg0, bg1, bu0, bu1 = " + bg0", " + bg1", " + bu0", " + bu1"
                        float bg0 = 0.0f, bg1 = 0.0f, bu0 = 0.0f, bu1 = 0.0f;
                        if (!N_TAIL || n0 + j * 16 < N) {
                            const unsigned bg = *(const unsigned *)(bias + j * 16 + 2 * q);
                            const unsigned bu = *(const unsigned *)(bias + j * 16 + 8 + 2 * q);
                            bg0 = moe_lo_float(bg);
                            bg1 = moe_hi_float(bg);
                            bu0 = moe_lo_float(bu);
                            bu1 = moe_hi_float(bu);
                        }
@     end
#pragma unroll
                        for (int m = 0; m < WM; ++m)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int r = ${c.row0}m * 64 + w * 16 + g + 8 * h;
                                const float o0 = ${call(act, "acc[m][8 * j + 2 * h]" .. bg0 .. ", acc[m][8 * j + 4 + 2 * h]" .. bu0)};
                                const float o1 = ${call(act, "acc[m][8 * j + 2 * h + 1]" .. bg1 .. ", acc[m][8 * j + 5 + 2 * h]" .. bu1)};
                                st_shared_u32(sst + (r * LDC + 8 * j - pass * EPI_COLS + 2 * q) * 2, moe_pack2(o0, o1));
@     if p.spec.training then
                                if (ubuf && r < rows && (!N_TAIL || n0 + j * 16 < N)) {  /* U, packed columns */
                                    moe_half_t *__restrict__ ur = ubuf + ((long long)(row_start + r) * N + n0 + j * 16 + 2 * q);
                                    *(unsigned *)ur = moe_pack2(acc[m][8 * j + 2 * h]${bg0}, acc[m][8 * j + 2 * h + 1]${bg1});
                                    *(unsigned *)(ur + 8) = moe_pack2(acc[m][8 * j + 4 + 2 * h]${bu0}, acc[m][8 * j + 5 + 2 * h]${bu1});
                                }
@     end
                            }
                    }
@   end
@   kernel(p, c, args, "xs_map", "w1p_map", "hbuf", "b1p", "n0 / 2", preamble, epilogue)
@ end
@
@ function M.down(p)
@   local c = config(p, "down")
@   local args = "const __grid_constant__ moe_tmap_t hbuf_map, const __grid_constant__ moe_tmap_t w2_map, " ..
@                "const moe_half_t *__restrict__ b2, const moe_tile_t *__restrict__ tiles, " ..
@                "const int *__restrict__ num_tiles, moe_half_t *__restrict__ obuf"
@   if c.splitk > 0 then
@     args = args .. SPLITK_ARGS
@   end
@   if c.fp8 then
@     c.asc, c.bsc = "hsc", "w2s"
@     args = "const __grid_constant__ moe_tmap_t hbuf_map, const __grid_constant__ moe_tmap_t w2_map, " ..
@            "const float *__restrict__ hsc, const float *__restrict__ w2s, " ..
@            "const moe_half_t *__restrict__ b2, const moe_tile_t *__restrict__ tiles, " ..
@            "const int *__restrict__ num_tiles, moe_half_t *__restrict__ obuf"
@   end
@   local function epilogue()
                    /* Accumulator block j (registers 4j..4j+3): rows 16w + g + 8h,
                     * columns 8j + 2q, 8j + 2q + 1. */
@     if p.ffn_bias then
                    const moe_half_t *__restrict__ bias = b2 + (long long)expert * N + n0;
@     end
#pragma unroll
                    for (int j = pass * (EPI_COLS / 8); j < (pass + 1) * (EPI_COLS / 8); ++j) {
@     local b0, b1 = "", ""
@     if p.ffn_bias then
@       b0, b1 = " + b0", " + b1"
                        float b0 = 0.0f, b1 = 0.0f;
                        if (!N_TAIL || n0 + j * 8 < N) {
                            const unsigned bv = *(const unsigned *)(bias + j * 8 + 2 * q);
                            b0 = moe_lo_float(bv);
                            b1 = moe_hi_float(bv);
                        }
@     end
@     if c.fp8 and not c.block then  -- one scale per output row of W2 (the output column here)
@       b0, b1 = " * c0" .. b0, " * c1" .. b1
                        float c0 = 0.0f, c1 = 0.0f;
                        if (!N_TAIL || n0 + j * 8 < N) {
                            c0 = w2s[(long long)expert * N + n0 + j * 8 + 2 * q];
                            c1 = w2s[(long long)expert * N + n0 + j * 8 + 2 * q + 1];
                        }
@     end
#pragma unroll
                        for (int m = 0; m < WM; ++m)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int r = ${c.row0}m * 64 + w * 16 + g + 8 * h;
                                st_shared_u32(sst + (r * LDC + 8 * j - pass * EPI_COLS + 2 * q) * 2,
                                              moe_pack2(acc[m][4 * j + 2 * h]${b0}, acc[m][4 * j + 2 * h + 1]${b1}));
                            }
                    }
@   end
@   kernel(p, c, args, "hbuf_map", "w2_map", "obuf", "b2", "n0", nil, epilogue)
@ end
@
@ -- The backward's dgrads (runtime/bgemm.h states their operands; DESIGN
@ -- "Backward GEMMs"), p.kind = "dgrad_up" or "dgrad_down": the forward's
@ -- kernel with B N-major (the weights [slots, K, N] as stored, c.b_mn: a
@ -- tensor map over [slots * K, N], boxes of 64 columns x bk k rows,
@ -- read by wgmma with the transposed-B bit). A's K tail past K reads as
@ -- zeros, so B's rows there (the next slot's, finite) add nothing; B's
@ -- columns past N read as zeros and are not stored.
@ --   dgrad_up    dXs [rows, H] = dU [rows, 2F] . W1p[slot], staged stores
@ --   dgrad_down  dU [rows, 2F] = act'(Ur) . (dys [rows, H] . W2[slot]): dA
@ --               stays in registers; its epilogue reads Ur at the packed
@ --               gate and up columns of each dA column pair and writes dU
@ --               there (du may be u: each element is read, then written,
@ --               by one thread)
@ function M.dgrad(p)
@   local function call(fn, args) return act_call(p, fn, args) end
@   local c = config(p, p.kind)
@   if p.kind == "dgrad_up" then
@     local args = "const __grid_constant__ moe_tmap_t du_map, const __grid_constant__ moe_tmap_t w1p_map, " ..
@                  "const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, " ..
@                  "moe_half_t *__restrict__ dxs"
@     local function epilogue()
                    /* Accumulator block j (registers 4j..4j+3): rows 16w + g + 8h,
                     * columns 8j + 2q, 8j + 2q + 1. */
#pragma unroll
                    for (int j = pass * (EPI_COLS / 8); j < (pass + 1) * (EPI_COLS / 8); ++j)
#pragma unroll
                        for (int m = 0; m < WM; ++m)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int r = ${c.row0}m * 64 + w * 16 + g + 8 * h;
                                st_shared_u32(sst + (r * LDC + 8 * j - pass * EPI_COLS + 2 * q) * 2,
                                              moe_pack2(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]));
                            }
@     end
@     kernel(p, c, args, "du_map", "w1p_map", "dxs", nil, "n0", nil, epilogue)
@     return
@   end
@   if p.kind ~= "dgrad_down" then error(p.kernel .. ": unknown dgrad kind " .. tostring(p.kind), 2) end
@   if p.pair_granule % 2 ~= 0 then error(p.kernel .. ": the activation backward reads gate/up column pairs", 2) end
@   c.direct = true  -- stored from registers
@   local args = "const __grid_constant__ moe_tmap_t dys_map, const __grid_constant__ moe_tmap_t w2_map, " ..
@                "const moe_half_t *u, const moe_tile_t *__restrict__ tiles, const int *__restrict__ num_tiles, " ..
@                "moe_half_t *du"
@   local act
@   local function preamble()
@     act = import("activation").backward(p)
@   end
@   local function epilogue()
                /* dA, accumulator block j (registers 4j..4j+3): rows 16w + g + 8h, columns
                 * f = n0 + 8j + 2q, f + 1 of F; their gate and up columns in the packed order
                 * (gen/pack_geom.h) are pairs too, since f is even and the granule is. The
                 * blocks go in chunks of DJ: the chunk's U loads are all issued before its
                 * first dU store (du may alias u, so the compiler may not move a load above a
                 * store; one load-then-store chain per block left every load's latency
                 * exposed, 2 x BN / 8 x WM round trips a tile). Each element is still read,
                 * then written, by the one thread. */
                constexpr int DJ = 8;
                static_assert((BN / 8) % DJ == 0, "dgrad_down epilogue chunks");
#pragma unroll
                for (int j0 = 0; j0 < BN / 8; j0 += DJ) {
                    unsigned ug[DJ][WM][2], uu[DJ][WM][2];
#pragma unroll
                    for (int jj = 0; jj < DJ; ++jj) {
                        const int f = n0 + 8 * (j0 + jj) + 2 * q;
                        const long long pg = moe_pack_row(f, N), pu = moe_pack_row(N + f, N);
#pragma unroll
                        for (int m = 0; m < WM; ++m)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int r = ${c.row0}m * 64 + w * 16 + g + 8 * h;
                                /* F % 8 == 0: an n8 block is wholly in or out of N */
                                const bool in = r < rows && !(N_TAIL && f >= N);
                                const long long row = (long long)(row_start + r) * (2 * N);
                                ug[jj][m][h] = in ? *(const unsigned *)(u + row + pg) : 0u;
                                uu[jj][m][h] = in ? *(const unsigned *)(u + row + pu) : 0u;
                            }
                    }
#pragma unroll
                    for (int jj = 0; jj < DJ; ++jj) {
                        const int j = j0 + jj, f = n0 + 8 * j + 2 * q;
                        if (N_TAIL && f >= N)
                            continue;
                        const long long pg = moe_pack_row(f, N), pu = moe_pack_row(N + f, N);
#pragma unroll
                        for (int m = 0; m < WM; ++m)
#pragma unroll
                            for (int h = 0; h < 2; ++h) {
                                const int r = ${c.row0}m * 64 + w * 16 + g + 8 * h;
                                if (r >= rows)
                                    continue;
                                const long long row = (long long)(row_start + r) * (2 * N);
                                const unsigned vg = ug[jj][m][h], vu = uu[jj][m][h];
                                float dg0, du0, dg1, du1;
                                ${call(act, "moe_lo_float(vg), moe_lo_float(vu), acc[m][4 * j + 2 * h], dg0, du0")};
                                ${call(act, "moe_hi_float(vg), moe_hi_float(vu), acc[m][4 * j + 2 * h + 1], dg1, du1")};
                                *(unsigned *)(du + row + pg) = moe_pack2(dg0, dg1);
                                *(unsigned *)(du + row + pu) = moe_pack2(du0, du1);
                            }
                    }
                }
@   end
@   kernel(p, c, args, "dys_map", "w2_map", "du", nil, "n0", preamble, epilogue)
@ end
@
@ -- The backward's wgrads (runtime/bgemm.h), p.kind = "wgrad_up" or
@ -- "wgrad_down": dW[slot_of[g]] [M, N] (+)= A_gᵀ . B_g, fp32 or the dtype
@ -- (p.grad_dtype: the fp32 sum rounded once, staged as 2-byte pairs), K = slot g's
@ -- rows (offsets[g], counts[g], read on the device). A [rows, M] and B
@ -- [rows, N] are both M/N-major along the rows: tensor maps over the rows
@ -- with boxes of 64 columns x bk rows (moe_wgrad_mn, runtime/launch.c),
@ -- read by wgmma with both transpose bits. A persistent grid (the launcher
@ -- puts about one CTA on each SM) walks the tiles, N fastest, then M, then
@ -- the nslots slots; both consumer warpgroups work on each tile (WG_ROWS
@ -- rows each), the producer loading the next tile's k tiles into the ring
@ -- while they store this one. Rows of the last k tile past the slot's rows
@ -- are zeroed in shared memory before its wgmma, so pad rows never
@ -- contribute; columns past M or N arrive as zeros. The output tile leaves
@ -- through shared memory in two passes of BN / 2 columns, each stored by
@ -- TMA (out_map: a 3D tensor map over [slots][M][N], which clips rows past
@ -- M and columns past N) as one bulk group: beta 0 writes, beta 1 adds
@ -- (TMA's fp32 reduce-add); the second pass's stores run under the next
@ -- tile's main loop. A slot with no rows writes zeros (beta 0) or is
@ -- skipped (beta 1). Stored from registers, the fp32 tiles had kept the
@ -- tensor cores idle and L2 busy with 32-byte writes (run 55's Nsight
@ -- Compute: L2 at 90 % for Qwen3's wgrad_up, tensor pipes 27 %).
@ function M.wgrad(p)
@   local c = config(p, p.kind)
@   if not c.persistent or c.pingpong then error(p.kernel .. ": the wgrads run on the persistent grid", 2) end
@   local args = "const __grid_constant__ moe_tmap_t a_map, const __grid_constant__ moe_tmap_t b_map, " ..
@                "const int *__restrict__ offsets, const int *__restrict__ counts, const int *__restrict__ slot_of, " ..
@                "const __grid_constant__ moe_tmap_t out_map, int beta, int nslots"
${ARCH_GUARD}
namespace ${p.kernel}_impl {
@   device_code(p, c)
constexpr int M = ${c.M};  /* output rows (A's columns) */
constexpr int MT = (M + BM - 1) / BM, NT = (N + BN - 1) / BN;  /* tiles of a slot: N fastest, then M */
/* Tile lin of the walk: slot gi, rows m0 of M, columns n0 of N. */
static __device__ __forceinline__ void wgrad_tile(int lin, int &gi, int &m0, int &n0) {
    gi = lin / (MT * NT);
    m0 = lin % (MT * NT) / NT * BM;
    n0 = lin % NT * BN;
}
/* Stage pass P of consumer warpgroup cw's accumulators (rows cw * WG_ROWS
 * + m * 64 + 16w + g + 8h, columns 8j + 2q, + 1 of the tile, j the pass's
 * n8 blocks) in the output boxes at EPI_OFF, row r of a box at the 16-byte
 * chunk position ^ (r % 8) (the 128-byte swizzle TMA reads): fp32 in box
 * (j % JP) / 4, chunk 2 (j % 4) + q / 2, byte (q % 2) * 8; 2-byte elements
 * (the pair rounded to the dtype) in box (j % JP) / 8, chunk j % 8, byte
 * 4q. */
template <int P>
static __device__ __forceinline__ void stage_out(const float (&acc)[WM][NACC], unsigned sbase, int cw, int w, int g,
                                                 int q) {
    constexpr int JP = PASS_COLS / 8;  /* n8 blocks per pass */
#pragma unroll
    for (int j = P * JP; j < (P + 1) * JP; ++j)
#pragma unroll
        for (int m = 0; m < WM; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = cw * WG_ROWS + m * 64 + w * 16 + g + 8 * h;
                const float v0 = acc[m][4 * j + 2 * h], v1 = acc[m][4 * j + 2 * h + 1];
@   if c.grad_half then
                const unsigned a = sbase + EPI_OFF + (unsigned)(((j % JP) >> 3) * OUT_BOX + r * 128 +
                                                                (((j & 7) ^ (r & 7)) << 4) + q * 4);
                asm volatile("st.shared.b32 [%0], %1;\n" :: "r"(a), "r"(moe_pack2(v0, v1)) : "memory");
@   else
                const unsigned a = sbase + EPI_OFF + (unsigned)(((j % JP) >> 2) * OUT_BOX + r * 128 +
                                                                (((2 * (j & 3) + (q >> 1)) ^ (r & 7)) << 4) + (q & 1) * 8);
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" :: "r"(a), "f"(v0), "f"(v1) : "memory");
@   end
            }
}
/* One thread: the staged pass to slot `slot`'s rows m0.., columns n0.. of
 * the output (TMA clips what lies past M or N), written (beta 0) or added
 * (beta 1), as one bulk group. */
static __device__ __forceinline__ void store_out(const moe_tmap_t *map, unsigned sbase, int slot, int m0, int n0,
                                                 int beta) {
#pragma unroll
    for (int b = 0; b < PASS_COLS / OUT_COLS; ++b) {
        if (N_TAIL && n0 + OUT_COLS * b >= N)
            break;
        const unsigned src = sbase + EPI_OFF + (unsigned)(b * OUT_BOX);
        if (beta)
            asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                         :: "l"((unsigned long long)map), "r"(n0 + OUT_COLS * b), "r"(m0), "r"(slot), "r"(src) : "memory");
        else
            asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                         :: "l"((unsigned long long)map), "r"(n0 + OUT_COLS * b), "r"(m0), "r"(slot), "r"(src) : "memory");
    }
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
}  // namespace ${p.kernel}_impl
#endif

extern "C" __global__ void __launch_bounds__(${p.threads}, 1)
${p.kernel}(${args}) {
${ARCH_GUARD}
    moe_pdl_begin();
    using namespace ${p.kernel}_impl;
    extern __shared__ __align__(1024) unsigned char ${p.kernel}_smem[];
    const unsigned sbase = moe_smem_addr(${p.kernel}_smem);
    if (sbase & 1023u)
        __trap();  /* the swizzle atoms need 1024-byte alignment */
    const int total = nslots * MT * NT;
    const int tid = (int)threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
    if (tid == 0) {
        tma_prefetch_map(&a_map);
        tma_prefetch_map(&b_map);
        tma_prefetch_map(&out_map);
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            bar_init(sbase + BAR_OFF + s * 8, 1);
            bar_init(sbase + BAR_OFF + (STAGES + s) * 8, CTHREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    int s = 0;  /* ring position, carried from tile to tile */
    unsigned phase = 0;
    if (wg == 0) {
@   if c.consumer_regs then
        asm volatile("setmaxnreg.dec.sync.aligned.u32 ${c.producer_regs};\n" ::: "memory");
@   end
        if (tid == 0)
            for (int lin = (int)blockIdx.x; lin < total; lin += (int)gridDim.x) {
                int gi, m0, n0;
                wgrad_tile(lin, gi, m0, n0);
                const int rows = counts[gi];
                if (rows > 0)  /* a slot without rows has no stages (its consumers write zeros or skip it) */
                    produce_rows(sbase, &a_map, &b_map, offsets[gi], (rows + BK - 1) / BK, m0, n0, s, phase);
            }
    } else {
@   if c.consumer_regs then
        asm volatile("setmaxnreg.inc.sync.aligned.u32 ${c.consumer_regs};\n" ::: "memory");
@   end
        const int ct = tid - 128, cw = wg - 1, w = (ct >> 5) & 3, lane = ct & 31, g = lane >> 2, q = lane & 3;
        for (int lin = (int)blockIdx.x; lin < total; lin += (int)gridDim.x) {
            int gi, m0, n0;
            wgrad_tile(lin, gi, m0, n0);
            const int rows = counts[gi];
            if (rows <= 0 && beta)
                continue;  /* nothing to add: every role skips it */
            const int ktiles = rows > 0 ? (rows + BK - 1) / BK : 0, tail = rows > 0 ? rows % BK : 0;
            float acc[WM][NACC];
#pragma unroll
            for (int m = 0; m < WM; ++m)
#pragma unroll
                for (int i = 0; i < NACC; ++i)
                    acc[m][i] = 0.0f;
#pragma unroll
            for (int m = 0; m < WM; ++m)
                fence_acc(acc[m]);  /* the zeros are written before the main loop's wgmma.fence */
            consume_rows(acc, sbase, cw, ct, ktiles, tail, s, phase);
            const int slot = slot_of[gi];
#pragma unroll
            for (int pass = 0; pass < EPI_PASSES; ++pass) {
                /* the stores before (the previous pass's, or the previous tile's last) have read the staging boxes */
                if (ct == 0)
                    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                consumers_sync();
                if (pass == 0)
                    stage_out<0>(acc, sbase, cw, w, g, q);
                else
                    stage_out<1>(acc, sbase, cw, w, g, q);
                fence_proxy_async();  /* this thread's staging writes, before TMA reads them */
                consumers_sync();
                if (ct == 0)
                    store_out(&out_map, sbase, slot, m0, n0 + pass * PASS_COLS, beta);
            }
        }
        if (ct == 0)
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  /* every store done before the CTA ends */
    }
#else
@   for v in args:gmatch("([%w_]+),") do
    (void)${v};
@   end
    (void)${args:match("([%w_]+)$")};
    __trap();
#endif
}
@ end
@
@ return M
