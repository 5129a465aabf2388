/* gemv_host.cc — one spec's emitted gemv GEMMs (templates/gemm_gemv.lua) run
 * on the CPU through tests/support/cuda_host.h, against a double-precision
 * reference. test_gemv_host builds it per case: the kernels' text (cut from
 * the emitted source) is force-included, and -D gives the shape and names:
 *   GV_UP, GV_DOWN  the kernels;  GV_ACT  the activation (in GV_UP's namespace)
 *   GV_E, GV_H, GV_F, GV_BM, GV_BN, GV_BIAS (0/1), GV_TRAIN (0/1: the up kernel's U store)
 *   GV_SMEM_UP, GV_SMEM_DN  their shared memory (the plan's)
 *   GV_KE (entries per token), GV_INPUT (router.apply = "input": the combine's weight is 1)
 * usage: gemv_host SEED MAXROWS — the experts' row counts come from a list
 * (0, 1, 2, 3, 7, 8, 9, 16, 33, 64, 65, 129: chunks of 1, 2, 4 and 8 rows,
 * tiles of several chunks, several tiles, empty experts) capped at MAXROWS,
 * rotated by SEED; the tile table holds 3 entries past its count (tiles the
 * grid covers but the kernels must skip). The down kernel runs with the
 * combine folded in: T = real rows / GV_KE tokens, each with GV_KE of the
 * real rows (shuffled) and random weights. Prints one line; exit 0 when the
 * hbuf, U and down outputs are within 5e-3 normalized error of the
 * reference (the dtype's rounding is ~1.7e-3), no padding row was
 * written, y is bit for bit the combine's sum (fp32 in k order, one
 * rounding) of the kernel's own down output, the row past T is untouched
 * and every slice's ticket is back at 0. */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

int main(int argc, char **argv) {
    const int seed = argc > 1 ? atoi(argv[1]) : 0, cmax = argc > 2 ? atoi(argv[2]) : 1000;
    const long long N1 = 2LL * GV_F;
    static const int pattern[] = {0, 1, 7, 64, 129, 2, 8, 9, 3, 0, 65, 16, 33, 1};
    const int np = (int)(sizeof pattern / sizeof *pattern);
    std::vector<int> cnt(GV_E), off(GV_E + 1);
    std::vector<moe_tile_t> tiles;
    int rows = 0;
    for (int e = 0; e < GV_E; e++) {
        cnt[e] = pattern[(e * 5 + seed) % np] < cmax ? pattern[(e * 5 + seed) % np] : cmax;
        off[e] = rows;
        for (int r = 0; r < cnt[e]; r += GV_BM)
            tiles.push_back({e, rows + r, cnt[e] - r < GV_BM ? cnt[e] - r : GV_BM, 0});
        rows += (cnt[e] + GV_BM - 1) / GV_BM * GV_BM;
    }
    off[GV_E] = rows;
    int nt = (int)tiles.size();
    const int cap = nt + 3;
    tiles.resize(cap, moe_tile_t{0, 0, 0, 0});
    std::mt19937 rng(1234u + (unsigned)seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<moe_half_t> xs((size_t)rows * GV_H + 8), w1((size_t)GV_E * N1 * GV_H), b1((size_t)GV_E * N1),
        w2((size_t)GV_E * GV_H * GV_F), b2((size_t)GV_E * GV_H);
    for (auto &v : xs)
        v = moe_from_float(u(rng));
    for (auto &v : w1)
        v = moe_from_float(u(rng) * 0.1f);
    for (auto &v : b1)
        v = moe_from_float(u(rng));
    for (auto &v : w2)
        v = moe_from_float(u(rng) * 0.1f);
    for (auto &v : b2)
        v = moe_from_float(u(rng));
    const moe_half_t poison = 0xffff;
    std::vector<moe_half_t> hb((size_t)rows * GV_F + 8, poison), ub((size_t)rows * N1 + 8, poison),
        ob((size_t)rows * GV_H + 8, poison);
    host_launch((unsigned)((N1 + GV_BN - 1) / GV_BN), (unsigned)cap, GV_SMEM_UP, [&] {
        GV_UP(xs.data(), w1.data(), b1.data(), tiles.data(), &nt, hb.data()
#if GV_TRAIN
           , ub.data()
#endif
        );
    });
    /* the combine's tokens: each takes GV_KE distinct real rows */
    std::vector<int> real;
    for (int e = 0; e < GV_E; e++)
        for (int r = 0; r < cnt[e]; r++)
            real.push_back(off[e] + r);
    std::shuffle(real.begin(), real.end(), rng);
    const int T = (int)real.size() / GV_KE, nslices = (GV_H + GV_BN - 1) / GV_BN;
    std::vector<int> row_of(real.begin(), real.begin() + (size_t)T * GV_KE), tickets(nslices, 0);
    std::vector<float> topk_w((size_t)T * GV_KE + 1);
    for (auto &v : topk_w)
        v = 0.5f + 0.5f * u(rng);
    std::vector<moe_half_t> y((size_t)(T + 1) * GV_H, poison);
    host_launch((unsigned)nslices, (unsigned)cap, GV_SMEM_DN, [&] {
        GV_DOWN(hb.data(), w2.data(), b2.data(), tiles.data(), &nt, ob.data(), row_of.data(), topk_w.data(), T,
                y.data(), tickets.data());
    });
    double e1 = 0, n1 = 0, e2 = 0, n2 = 0, eu = 0, nu = 0;
    long padding = 0, real_rows = 0;
    for (int e = 0; e < GV_E; e++)
        for (int r = off[e]; r < off[e + 1]; r++) {
            const bool real = r - off[e] < cnt[e];
            real_rows += real;
            for (int f = 0; f < GV_F && !real; f++)
                padding += hb[(size_t)r * GV_F + f] != poison;
            for (int c = 0; c < GV_H && !real; c++)
                padding += ob[(size_t)r * GV_H + c] != poison;
            if (!real)
                continue;
            for (int f = 0; f < GV_F; f++) {
                const long long pg = (f / 8) * 16 + f % 8, pu = pg + 8; /* gen/pack_geom.h */
                double g = GV_BIAS ? moe_to_float(b1[e * N1 + pg]) : 0.0, v = GV_BIAS ? moe_to_float(b1[e * N1 + pu]) : 0.0;
                for (int k = 0; k < GV_H; k++) {
                    const double x = moe_to_float(xs[(size_t)r * GV_H + k]);
                    g += x * moe_to_float(w1[((size_t)e * N1 + pg) * GV_H + k]);
                    v += x * moe_to_float(w1[((size_t)e * N1 + pu) * GV_H + k]);
                }
                const double ref = GV_ACT((float)g, (float)v), got = moe_to_float(hb[(size_t)r * GV_F + f]);
                e1 += (got - ref) * (got - ref);
                n1 += ref * ref;
                if (GV_TRAIN) {
                    const double gg = moe_to_float(ub[(size_t)r * N1 + pg]), gu = moe_to_float(ub[(size_t)r * N1 + pu]);
                    eu += (gg - g) * (gg - g) + (gu - v) * (gu - v);
                    nu += g * g + v * v;
                }
            }
            for (int c = 0; c < GV_H; c++) { /* from the kernel's own hbuf */
                double s = GV_BIAS ? moe_to_float(b2[e * GV_H + c]) : 0.0;
                for (int k = 0; k < GV_F; k++)
                    s += (double)moe_to_float(hb[(size_t)r * GV_F + k]) * moe_to_float(w2[((size_t)e * GV_H + c) * GV_F + k]);
                const double got = moe_to_float(ob[(size_t)r * GV_H + c]);
                e2 += (got - s) * (got - s);
                n2 += s * s;
            }
        }
    long ybad = 0, ypast = 0, tleft = 0;
    for (int t = 0; t < T; t++)
        for (int c = 0; c < GV_H; c++) {
            float acc = 0.f;
            for (int k = 0; k < GV_KE; k++)
                acc = fmaf(GV_INPUT ? 1.f : topk_w[(size_t)t * GV_KE + k],
                           moe_to_float(ob[(size_t)row_of[(size_t)t * GV_KE + k] * GV_H + c]), acc);
            ybad += y[(size_t)t * GV_H + c] != moe_from_float(acc);
        }
    for (int c = 0; c < GV_H; c++)
        ypast += y[(size_t)T * GV_H + c] != poison;
    for (int i = 0; i < nslices; i++)
        tleft += tickets[i] != 0;
    const double up = sqrt(e1 / (n1 + 1e-30)), down = sqrt(e2 / (n2 + 1e-30)), ue = GV_TRAIN ? sqrt(eu / (nu + 1e-30)) : 0;
    const int ok = up < 5e-3 && down < 5e-3 && ue < 5e-3 && padding == 0 && real_rows > 0 && ybad == 0 &&
                   ypast == 0 && tleft == 0;
    printf("%s: %ld rows in %d tiles: up %.2e, U %.2e, down %.2e normalized error; %ld padding elements written; "
           "combine of %d tokens: %ld elements off, %ld past T, %ld tickets left: %s\n",
           argv[0], real_rows, nt, up, ue, down, padding, T, ybad, ypast, tleft, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
