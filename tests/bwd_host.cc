/* bwd_host.cc — one training spec's emitted dx and d router_w kernels
 * (templates/bwd.lua's bwd_dx, bwd_dwr) run on the CPU through
 * tests/support/cuda_host.h, against their documented sum orders.
 * test_bwd_host builds it per case: the backward's helper namespace and
 * the kernels (cut from the emitted source) are force-included, and -D
 * gives the shape and the names:
 *   BX_DX, BX_DWR  the kernels;  BX_E, BX_EL (d logits columns), BX_K (entries a token), BX_H
 *   BX_TB, BX_DXC  dx's tokens and columns a block (the plan's per_block, gen/family.h's moe_bwd_dx_cols)
 *   BX_MMA  the router products on tensor cores (bf16: gen/family.h's moe_bwd_router_mma)
 *   BX_INPUT (router.apply = "input": rows weighted by round(w)), BX_SG (a sigmoid shared gate),
 *   BX_LB (router.logit_bias: d logit_bias as d router_w's column H), BX_DWR_COLS, BX_DWR_EXPERTS (its block tile)
 *   BX_OWN (router.input = "separate": dx takes the rows alone, d router_x the router's term),
 *   BX_ESCALE (the escale kernel, run when BX_ES: d expert_scale's per-expert sums), BX_KR (top_k)
 * usage: bwd_host SEED T — T tokens, their rows a shuffle of T·K + 5 rows.
 * Prints one line; exit 0 when the row past T was not written and, on CUDA
 * cores (fp16), every dx element is, bit for bit, the fp32 sum in the order
 * docs/DESIGN.md states (k increasing, then e, then the shared gate's term,
 * one rounding) and every d router_w (d logit_bias, d w_gate) element is
 * the fp32 sum over the tokens in order, or with the tokens in 2, 3 or 16
 * splits each split's sum in order, then the splits' in order
 * (templates/bwd.lua's phases 0 and 1), written (beta 0) and added to a
 * prior (beta 1). With BX_MMA the router products run through the host's
 * ldmatrix and mma (tests/support/cuda_host.h: each mma's 16 products
 * summed in fp32 in k order), whose order the test does not restate: dx
 * must be the rows' fp32 sum in k order plus a router term within
 * TOL · Σ_e |dlogits · Wr| of the exact one, rounded once (with BX_OWN
 * dx the rows' sum bit for bit, d router_x the router term so), and each
 * d router_w element within TOL · Σ_t |dlogits · x| (+ the fp32 rounding
 * of the prior's add) of the exact sum, for every split count and beta;
 * the worst error over Σ |terms| is printed. With BX_ES, every d
 * expert_scale element the escale kernel's documented order (thread j:
 * entries j, j + 256, ...; then the halving tree). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

/* the tensor-core products' tolerance, over the sum of the terms' magnitudes: fp32's accumulation error, with
 * room (a missing mid part of d logits is ~2^-9 off) */
static const double TOL = 1.0 / (1 << 20);
/* v rounded to the dtype as a float */
static float host_round(double v) { return moe_to_float(moe_from_float((float)v)); }

int main(int argc, char **argv) {
    const int seed = argc > 1 ? atoi(argv[1]) : 0, T = argc > 2 ? atoi(argv[2]) : 1;
    const int R = T * BX_K + 5;
    std::mt19937 rng(4321u + (unsigned)seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<int> perm(R), row_of((size_t)T * BX_K);
    for (int r = 0; r < R; r++)
        perm[r] = r;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (size_t i = 0; i < row_of.size(); i++)
        row_of[i] = perm[i];
    std::vector<moe_half_t> dxs((size_t)R * BX_H), wr((size_t)BX_E * BX_H), sg(BX_H);
    std::vector<float> topk_w(row_of.size()), dl((size_t)T * BX_EL);
    for (auto &v : dxs)
        v = moe_from_float(u(rng));
    for (auto &v : wr)
        v = moe_from_float(u(rng) * 0.5f);
    for (auto &v : sg)
        v = moe_from_float(u(rng));
    for (auto &v : topk_w)
        v = 0.5f + 0.5f * u(rng);
    for (auto &v : dl)
        v = u(rng) * 0.25f;
    const moe_half_t poison = 0xffff;
    std::vector<moe_half_t> dx((size_t)(T + 1) * BX_H, poison), drx((size_t)(T + 1) * BX_H, poison);
    host_launch((unsigned)((T + BX_TB - 1) / BX_TB), (unsigned)((BX_H + BX_DXC - 1) / BX_DXC), 0,
                [&] { BX_DX(dxs.data(), row_of.data(), topk_w.data(), dl.data(), wr.data(), sg.data(), T, dx.data()
#if BX_OWN
                            , drx.data()
#endif
                            ); });
    long bad = 0, written = 0;
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < BX_H; c++) {
            float acc = 0.f, racc = 0.f;   /* racc: the router's term, d router_x's with BX_OWN */
            for (int k = 0; k < BX_K; k++) {
                const float wk = BX_INPUT ? moe_to_float(moe_from_float(topk_w[(size_t)t * BX_K + k])) : 1.f;
                acc = fmaf(wk, moe_to_float(dxs[(size_t)row_of[(size_t)t * BX_K + k] * BX_H + c]), acc);
            }
#if BX_MMA
            /* the router term exactly, and its terms' magnitudes; the kernel's is within TOL of their sum */
            double r = 0, mag = 0;
            for (int e = 0; e < BX_EL; e++) {
                const moe_half_t w = e < BX_E ? wr[(size_t)e * BX_H + c] : sg[c];   /* row E: the gate's */
                const double p = (double)dl[(size_t)t * BX_EL + e] * moe_to_float(w);
                r += p;
                mag += fabs(p);
            }
            for (int o = 0; o < 1 + BX_OWN; o++) {
                /* dx: (the rows' fp32 sum + the router term) in fp32, or with BX_OWN the rows' sum alone (exact) and
                 * d router_x the router term, rounded once: between the roundings of the interval's ends */
                const double v = o ? r : BX_OWN ? (double)acc : (double)acc + r;
                const double tol = o || !BX_OWN ? TOL * mag + fabs(v) / (1 << 23) : 0.0;
                const float got = moe_to_float((o ? drx : dx)[(size_t)t * BX_H + c]);
                if (!(got >= host_round(v - tol) && got <= host_round(v + tol))) {
                    bad++;
                    worst = std::max(worst, fabs(got - v));
                }
            }
            (void)racc;
#else
            float &ra = BX_OWN ? racc : acc;
            for (int e = 0; e < BX_E; e++)
                ra = fmaf(dl[(size_t)t * BX_EL + e], moe_to_float(wr[(size_t)e * BX_H + c]), ra);
            if (BX_SG)
                ra = fmaf(dl[(size_t)t * BX_EL + BX_E], moe_to_float(sg[c]), ra);
            for (int o = 0; o < 1 + BX_OWN; o++) {
                const moe_half_t want = moe_from_float(o ? racc : acc), got = (o ? drx : dx)[(size_t)t * BX_H + c];
                if (got != want) {
                    bad++;
                    worst = std::max(worst, (double)fabsf(moe_to_float(got) - moe_to_float(want)));
                }
            }
#endif
        }
    for (int c = 0; c < BX_H; c++)
        written += dx[(size_t)T * BX_H + c] != poison || drx[(size_t)T * BX_H + c] != poison;

    /* d router_w = dlogits^T . x over the tokens (column H: the ones, d logit_bias; row E: d w_gate) */
    std::vector<moe_half_t> x((size_t)T * BX_H);
    for (auto &v : x)
        v = moe_from_float(u(rng));
    std::vector<float> dwr((size_t)BX_E * BX_H), dlb(BX_E), dsg(BX_H);
    long wbad = 0;
    double wworst = 0;   /* BX_MMA: the worst |error| / Σ |terms| when written (beta 0) */
    const int HL = BX_H + BX_LB;
    const unsigned gx = (unsigned)((HL + BX_DWR_COLS - 1) / BX_DWR_COLS),
                   gy = (unsigned)((BX_EL + BX_DWR_EXPERTS - 1) / BX_DWR_EXPERTS);
    /* token splits: one range; two and three (the last one short); 16 (with few tokens, empty ranges) */
    for (const int splits : {1, 2, 3, 16}) {
        std::vector<float> part((size_t)splits * BX_EL * HL, NAN);
        const int per = ((T + splits - 1) / splits + 31) / 32 * 32;
        for (int beta = 0; beta < 2; beta++) {
            std::vector<float> prior_w(dwr.size()), prior_b(dlb.size()), prior_g(dsg.size());
            for (size_t i = 0; i < dwr.size(); i++)
                dwr[i] = prior_w[i] = beta ? u(rng) : NAN;
            for (size_t i = 0; i < dlb.size(); i++)
                dlb[i] = prior_b[i] = beta ? u(rng) : NAN;
            for (size_t i = 0; i < dsg.size(); i++)
                dsg[i] = prior_g[i] = beta ? u(rng) : NAN;
            for (int phase = 0; phase < (splits > 1 ? 2 : 1); phase++)
                host_launch3(gx, gy, phase ? 1u : (unsigned)splits, 0, [&] {
                    BX_DWR(dl.data(), x.data(), T, beta, dwr.data(), dlb.data(), dsg.data(), part.data(), splits,
                           phase);
                });
            for (int e = 0; e < BX_EL; e++)
                for (int h = 0; h < HL; h++) {
                    const float *got = h < BX_H ? (e < BX_E ? &dwr[(size_t)e * BX_H + h] : &dsg[h]) : e < BX_E ? &dlb[e] : nullptr;
                    const float prior = h < BX_H ? (e < BX_E ? prior_w[(size_t)e * BX_H + h] : prior_g[h]) : e < BX_E ? prior_b[e] : 0.f;
#if BX_MMA
                    double r = 0, mag = 0;   /* the exact sum over every token, and its terms' magnitudes */
                    for (int t = 0; t < T; t++) {
                        const float xv = h < BX_H ? moe_to_float(x[(size_t)t * BX_H + h]) : 1.f;   /* H: the ones */
                        const double p = (double)dl[(size_t)t * BX_EL + e] * xv;
                        r += p;
                        mag += fabs(p);
                    }
                    const double want = beta ? prior + r : r, err = got ? fabs(*got - want) : 0.0;
                    if (got && !(err <= TOL * mag + fabs(want) / (1 << 23)))
                        wbad++;
                    if (got && mag > 0 && !beta)   /* (with a prior, its add's rounding would count) */
                        wworst = std::max(wworst, err / mag);
                    (void)per;
#else
                    float acc = 0.f;   /* (0 + s_0) + s_1 + ..., s_z: split z's tokens in order */
                    for (int z = 0; z < splits; z++) {
                        float sz = 0.f;
                        for (int t = z * per; t < std::min(T, (z + 1) * per); t++)
                            sz = fmaf(dl[(size_t)t * BX_EL + e],
                                      h < BX_H ? moe_to_float(x[(size_t)t * BX_H + h]) : 1.f, sz);
                        acc = splits > 1 ? acc + sz : sz;
                    }
                    if (got && memcmp(got, beta ? &(const float &)(prior + acc) : &acc, 4) != 0)
                        wbad++;
#endif
                }
        }
    }
    /* d expert_scale: block e sums part over the routed entries of expert e, thread j entries j, j + 256, ...
     * in order, then the halving tree; written (beta 0), added (beta 1) */
    long ebad = 0;
#if BX_ES
    {
        std::vector<int> idx((size_t)T * BX_K);
        std::vector<float> part((size_t)T * BX_K), des(BX_E);
        for (auto &v : idx)
            v = (int)(rng() % BX_E);
        for (auto &v : part)
            v = u(rng);
        for (int beta = 0; beta < 2; beta++) {
            std::vector<float> prior(BX_E);
            for (int e = 0; e < BX_E; e++)
                des[e] = prior[e] = beta ? u(rng) : NAN;
            host_launch((unsigned)BX_E, 1, 0, [&] { BX_ESCALE(part.data(), idx.data(), T, beta, des.data()); });
            for (int e = 0; e < BX_E; e++) {
                float s[256];
                const long long n = (long long)T * BX_KR;
                for (int j = 0; j < 256; j++) {
                    s[j] = 0.f;
                    for (long long i = j; i < n; i += 256) {
                        const long long t = i / BX_KR, at = t * BX_K + (i - t * BX_KR);
                        if (idx[(size_t)at] == e)
                            s[j] += part[(size_t)at];
                    }
                }
                for (int o = 128; o > 0; o >>= 1)
                    for (int j = 0; j < o; j++)
                        s[j] += s[j + o];
                const float want = beta ? prior[e] + s[0] : s[0];
                ebad += memcmp(&want, &des[e], 4) != 0;
            }
        }
    }
#endif
    const int ok = bad == 0 && written == 0 && wbad == 0 && ebad == 0;
    char wmsg[80] = "";
    if (BX_MMA)
        snprintf(wmsg, sizeof wmsg, " beyond the tolerance (worst error / Σ|terms| %.3g)", wworst);
    printf("%s: T %d: dx%s: %ld of %ld elements differ from the %s (worst %.3g), %ld past T written; "
           "d router_w: %ld elements differ%s; d expert_scale: %ld differ: %s\n",
           argv[0], T, BX_OWN ? " and d router_x" : "", bad, (long)T * BX_H * (1 + BX_OWN),
           BX_MMA ? "sum within the tolerance" : "ordered sum", worst, written, wbad, wmsg, ebad, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
