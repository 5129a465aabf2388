/* bwd_host.cc — one training spec's emitted dx kernel (templates/bwd.lua's
 * bwd_dx) run on the CPU through tests/support/cuda_host.h, against its
 * documented sum order. test_bwd_host builds it per case: the backward's
 * helper namespace and the kernel (cut from the emitted source) are
 * force-included, and -D gives the shape and the name:
 *   BX_DX  the kernel;  BX_E, BX_EL (d logits columns), BX_K (entries a token), BX_H
 *   BX_TB, BX_VB  tokens and 8-column vectors a block (the plan's per_block, threads)
 *   BX_INPUT (router.apply = "input": rows weighted by round(w)), BX_SG (a sigmoid shared gate)
 * usage: bwd_host SEED T — T tokens, their rows a shuffle of T·K + 5 rows.
 * Prints one line; exit 0 when every dx element is, bit for bit, the fp32
 * sum in the order docs/DESIGN.md states (k increasing, then e, then the
 * shared gate's term, one rounding) and the row past T was not written. */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

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
    std::vector<moe_half_t> dx((size_t)(T + 1) * BX_H, poison);
    host_launch((unsigned)((T + BX_TB - 1) / BX_TB), (unsigned)((BX_H / 8 + BX_VB - 1) / BX_VB), 0,
                [&] { BX_DX(dxs.data(), row_of.data(), topk_w.data(), dl.data(), wr.data(), sg.data(), T, dx.data()); });
    long bad = 0, written = 0;
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < BX_H; c++) {
            float acc = 0.f;
            for (int k = 0; k < BX_K; k++) {
                const float wk = BX_INPUT ? moe_to_float(moe_from_float(topk_w[(size_t)t * BX_K + k])) : 1.f;
                acc = fmaf(wk, moe_to_float(dxs[(size_t)row_of[(size_t)t * BX_K + k] * BX_H + c]), acc);
            }
            for (int e = 0; e < BX_E; e++)
                acc = fmaf(dl[(size_t)t * BX_EL + e], moe_to_float(wr[(size_t)e * BX_H + c]), acc);
            if (BX_SG)
                acc = fmaf(dl[(size_t)t * BX_EL + BX_E], moe_to_float(sg[c]), acc);
            const moe_half_t want = moe_from_float(acc), got = dx[(size_t)t * BX_H + c];
            if (got != want) {
                bad++;
                worst = std::max(worst, (double)fabsf(moe_to_float(got) - moe_to_float(want)));
            }
        }
    for (int c = 0; c < BX_H; c++)
        written += dx[(size_t)T * BX_H + c] != poison;
    const int ok = bad == 0 && written == 0;
    printf("%s: T %d: %ld of %ld elements differ from the ordered sum (worst %.3g), %ld past T written: %s\n",
           argv[0], T, bad, (long)T * BX_H, worst, written, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
