/* gemv_host.cc — one spec's emitted gemv GEMMs (templates/gemm_gemv.lua) run
 * on the CPU through tests/support/cuda_host.h, against a double-precision
 * reference. test_gemv_host builds it per case: the kernels' text (cut from
 * the emitted source) is force-included, and -D gives the shape and names:
 *   GV_UP, GV_DOWN  the kernels;  GV_ACT  the activation (in GV_UP's namespace)
 *   GV_E, GV_H, GV_F, GV_BM, GV_BN, GV_BIAS (0/1), GV_TRAIN (0/1: the up kernel's U store)
 *   GV_SHARED0, GV_ACT_SHARED, GV_ACT_BWD_SHARED: a shared expert with an activation of its own
 *   (shared.limit, shared.unclamped): slots from GV_SHARED0 on (of GV_E) run GV_ACT_SHARED
 *   GV_SMEM_UP, GV_SMEM_DN  their shared memory (the plan's)
 *   GV_KE (entries per token), GV_INPUT (router.apply = "input": the combine's weight is 1)
 *   GV_STREAM: the stream grid's CTAs (a 1D grid; its kernels split the items themselves), 0 otherwise;
 *   GV_CHAIN (1: the chain grid, bf16 / fp16: GV_UP runs the up GEMM, the down GEMM and the combine in one
 *   grid of GV_STREAM blocks run together; its counter of blocks done with their up items ends at GV_STREAM);
 *   GV_THREADS the kernels' block (the plan's: 256, the stream grid's 288)
 *   GV_FP8 (fp8 weights: e4m3 operands with scales, docs/DESIGN.md "FP8"), GV_BLOCK (1: 128 x 128
 *   block scales, 0: per row), GV_CLUSTER (the up kernel's cluster of blocks); linked with
 *   runtime/fp8.c, the host's e4m3 rules, for the reference
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
 * and every slice's ticket is back at 0. With GV_FP8 the up output is e4m3
 * with a scale per 128 columns: every scale within 1e-4 of the reference's
 * amax / 448 (the reference's fp32 activation, its amax floored at 1e-4),
 * every code within half an e4m3 step (plus 1%) of the reference's value
 * over that scale, so the rounding is to nearest; the down output is
 * checked from the kernel's own e4m3 activation, as the 16-bit one.
 * usage: gemv_host act SCALE — the emitted activation GV_ACT on a 81 x 81 grid
 * of (gate, up) in [-SCALE, SCALE]^2, printed as "gate up value" lines (hex
 * floats) for test_gemv_host to hold to the C reference's (its kernel
 * checks above take GV_ACT as given); with GV_ACT_BWD (a training spec: the
 * backward's activation gradient, cut from the emitted source) each line
 * also has its d gate and d up for d = 1; gemv_host act_shared SCALE the
 * same of GV_ACT_SHARED (and GV_ACT_BWD_SHARED). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#ifndef GV_SHARED0   /* no shared expert with its own activation: every slot runs GV_ACT */
#define GV_SHARED0 GV_E
#define GV_ACT_SHARED GV_ACT
#ifdef GV_ACT_BWD
#define GV_ACT_BWD_SHARED GV_ACT_BWD
#endif
#endif

#if GV_FP8
extern "C" float moe_e4m3_to_float(uint8_t v);
extern "C" float moe_fp8_quantize_block(const float *v, size_t n, uint8_t *q);
typedef unsigned char wt_t; /* the weights' and the GEMM inputs' element */
/* a random finite e4m3 code, not NaN (0x7f, 0xff) */
static unsigned char rand_e4m3(std::mt19937 &rng) {
    for (;;) {
        const unsigned char c = (unsigned char)(rng() & 255u);
        if ((c & 0x7f) != 0x7f)
            return c;
    }
}
/* half the e4m3 step at |t| (scaled to the format's range) */
static double half_step(double t) {
    const double a = fabs(t);
    return a < 0.015625 ? 0.5 * 0x1p-9 : 0.5 * ldexp(1.0, (int)floor(log2(a)) - 3);
}
#else
typedef moe_half_t wt_t;
#endif

int main(int argc, char **argv) {
    if (argc == 3 && (!strcmp(argv[1], "act") || !strcmp(argv[1], "act_shared"))) {
        const bool sh = !strcmp(argv[1], "act_shared");
        const float scale = strtof(argv[2], NULL);
        for (int i = 0; i <= 80; i++)
            for (int j = 0; j <= 80; j++) {
                const float g = scale * (float)(i - 40) / 40.0f, u = scale * (float)(j - 40) / 40.0f;
                const float v = sh ? GV_ACT_SHARED(g, u) : GV_ACT(g, u);
#ifdef GV_ACT_BWD
                float dg = 0.f, du = 0.f;
                if (sh)
                    GV_ACT_BWD_SHARED(g, u, 1.0f, dg, du);
                else
                    GV_ACT_BWD(g, u, 1.0f, dg, du);
                printf("%a %a %a %a %a\n", g, u, v, dg, du);
#else
                printf("%a %a %a\n", g, u, v);
#endif
            }
        return 0;
    }
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
    std::vector<wt_t> xs((size_t)rows * GV_H + 16), w1((size_t)GV_E * N1 * GV_H), w2((size_t)GV_E * GV_H * GV_F);
    std::vector<moe_half_t> b1((size_t)GV_E * N1), b2((size_t)GV_E * GV_H);
    for (auto &v : b1)
        v = moe_from_float(u(rng));
    for (auto &v : b2)
        v = moe_from_float(u(rng));
#if GV_FP8
    /* the rows quantized per 128 columns as the scatter does; random codes and scales for the weights */
    const int HB = GV_H / 128, FB = GV_F / 128;
    std::vector<float> xsc((size_t)rows * HB + 4), w1s(GV_BLOCK ? (size_t)GV_E * (N1 / 128) * HB : (size_t)GV_E * N1),
        w2s(GV_BLOCK ? (size_t)GV_E * HB * FB : (size_t)GV_E * GV_H);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < HB; b++) {
            float v[128];
            for (auto &x : v)
                x = u(rng) * (1.0f + (float)(b % 3));
            xsc[(size_t)r * HB + b] = moe_fp8_quantize_block(v, 128, xs.data() + (size_t)r * GV_H + b * 128);
        }
    for (auto &v : w1)
        v = rand_e4m3(rng);
    for (auto &v : w2)
        v = rand_e4m3(rng);
    for (auto &v : w1s)
        v = 1e-3f * (1.0f + 0.5f * u(rng));
    for (auto &v : w2s)
        v = 2e-3f * (1.0f + 0.5f * u(rng));
    /* plain row of packed W1 row pr (gen/pack_geom.h): gate f or up F + f, f = 8 (pr / 16) + pr % 8 */
    auto plain1 = [](long long pr) { return (pr & 8 ? GV_F : 0) + (pr >> 4) * 8 + (pr & 7); };
    /* W1 row pr's weight (e4m3 times its scale) at k, W2 row c's at k */
    auto w1v = [&](int e, long long pr, int k) {
        const long long q = plain1(pr);
        const float s = GV_BLOCK ? w1s[((size_t)e * (N1 / 128) + q / 128) * HB + k / 128] : w1s[(size_t)e * N1 + q];
        return (double)moe_e4m3_to_float(w1[((size_t)e * N1 + pr) * GV_H + k]) * s;
    };
    auto w2v = [&](int e, int c, int k) {
        const float s = GV_BLOCK ? w2s[((size_t)e * HB + c / 128) * FB + k / 128] : w2s[(size_t)e * GV_H + c];
        return (double)moe_e4m3_to_float(w2[((size_t)e * GV_H + c) * GV_F + k]) * s;
    };
    auto xv = [&](int r, int k) {
        return (double)moe_e4m3_to_float(xs[(size_t)r * GV_H + k]) * xsc[(size_t)r * HB + k / 128];
    };
    const unsigned char poison8 = 0xff;
    std::vector<unsigned char> hb((size_t)rows * GV_F + 16, poison8);
    std::vector<float> hsc((size_t)rows * FB + 4, -1.0f);
    host_launch((unsigned)(N1 / GV_BN), (unsigned)cap, GV_SMEM_UP, [&] {
        GV_UP(xs.data(), w1.data(), xsc.data(), w1s.data(), b1.data(), tiles.data(), &nt, hb.data(), hsc.data());
    }, GV_CLUSTER);
    auto hv = [&](int r, int k) {
        return (double)moe_e4m3_to_float(hb[(size_t)r * GV_F + k]) * hsc[(size_t)r * FB + k / 128];
    };
#else
    for (auto &v : xs)
        v = moe_from_float(u(rng));
    for (auto &v : w1)
        v = moe_from_float(u(rng) * 0.1f);
    for (auto &v : w2)
        v = moe_from_float(u(rng) * 0.1f);
    auto w1v = [&](int e, long long pr, int k) { return (double)moe_to_float(w1[((size_t)e * N1 + pr) * GV_H + k]); };
    auto w2v = [&](int e, int c, int k) { return (double)moe_to_float(w2[((size_t)e * GV_H + c) * GV_F + k]); };
    auto xv = [&](int r, int k) { return (double)moe_to_float(xs[(size_t)r * GV_H + k]); };
    std::vector<moe_half_t> hb((size_t)rows * GV_F + 8, 0xffff), ub((size_t)rows * N1 + 8, 0xffff);
#if !GV_CHAIN
    host_launch(GV_STREAM ? GV_STREAM : (unsigned)((N1 + GV_BN - 1) / GV_BN), GV_STREAM ? 1u : (unsigned)cap, GV_SMEM_UP, [&] {
        GV_UP(xs.data(), w1.data(), b1.data(), tiles.data(), &nt, hb.data()
#if GV_TRAIN
           , ub.data()
#endif
        );
    }, 1, GV_THREADS);
#endif
    auto hv = [&](int r, int k) { return (double)moe_to_float(hb[(size_t)r * GV_F + k]); };
#endif
    const moe_half_t poison = 0xffff;
    std::vector<moe_half_t> ob((size_t)rows * GV_H + 8, poison);
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
    std::vector<int> done(2, 0); /* the chain's counter of blocks done with their up items, and one past it */
#if GV_CHAIN
    /* the chain: one grid, its blocks together (they wait for each other's items), the up GEMM's items, then
     * the down GEMM's and the combine */
    host_launch(GV_STREAM, 1u, GV_SMEM_UP, [&] {
        GV_UP(xs.data(), w1.data(), b1.data(), tiles.data(), &nt, hb.data(), w2.data(), b2.data(), ob.data(),
              row_of.data(), topk_w.data(), T, y.data(), tickets.data(), done.data());
    }, GV_STREAM, GV_THREADS);
#else
    host_launch(GV_STREAM ? GV_STREAM : (unsigned)nslices, GV_STREAM ? 1u : (unsigned)cap, GV_SMEM_DN, [&] {
#if GV_FP8
        GV_DOWN(hb.data(), w2.data(), hsc.data(), w2s.data(), b2.data(), tiles.data(), &nt, ob.data(), row_of.data(),
                topk_w.data(), T, y.data(), tickets.data());
#else
        GV_DOWN(hb.data(), w2.data(), b2.data(), tiles.data(), &nt, ob.data(), row_of.data(), topk_w.data(), T,
                y.data(), tickets.data());
#endif
    }, 1, GV_THREADS);
#endif
    double e1 = 0, n1 = 0, e2 = 0, n2 = 0, eu = 0, nu = 0;
    long padding = 0, real_rows = 0, codes_off = 0, scales_off = 0;
    std::vector<float> act(GV_F);
    for (int e = 0; e < GV_E; e++)
        for (int r = off[e]; r < off[e + 1]; r++) {
            const bool real = r - off[e] < cnt[e];
            real_rows += real;
            for (int f = 0; f < GV_F && !real; f++)
                padding += hb[(size_t)r * GV_F + f] != hb.back();
            for (int c = 0; c < GV_H && !real; c++)
                padding += ob[(size_t)r * GV_H + c] != poison;
#if GV_FP8
            for (int b = 0; b < GV_F / 128 && !real; b++)
                padding += hsc[(size_t)r * (GV_F / 128) + b] != -1.0f;
#endif
            if (!real)
                continue;
            for (int f = 0; f < GV_F; f++) {
                const long long pg = (f / 8) * 16 + f % 8, pu = pg + 8; /* gen/pack_geom.h */
                double g = 0.0, v = 0.0;
                for (int k = 0; k < GV_H; k++) {
                    g += xv(r, k) * w1v(e, pg, k);
                    v += xv(r, k) * w1v(e, pu, k);
                }
                if (GV_BIAS) {
                    g += moe_to_float(b1[e * N1 + pg]);
                    v += moe_to_float(b1[e * N1 + pu]);
                }
                act[f] = e >= GV_SHARED0 ? GV_ACT_SHARED((float)g, (float)v) : GV_ACT((float)g, (float)v);
#if !GV_FP8
                const double ref = act[f], got = moe_to_float(hb[(size_t)r * GV_F + f]);
                e1 += (got - ref) * (got - ref);
                n1 += ref * ref;
                if (GV_TRAIN) {
                    const double gg = moe_to_float(ub[(size_t)r * N1 + pg]), gu = moe_to_float(ub[(size_t)r * N1 + pu]);
                    eu += (gg - g) * (gg - g) + (gu - v) * (gu - v);
                    nu += g * g + v * v;
                }
#endif
            }
#if GV_FP8
            for (int b = 0; b < GV_F / 128; b++) { /* the block's scale, then each code against it */
                float amax = 1e-4f;
                for (int f = b * 128; f < b * 128 + 128; f++)
                    amax = std::max(amax, fabsf(act[f]));
                const double sc = hsc[(size_t)r * (GV_F / 128) + b];
                scales_off += !(fabs(sc - amax / 448.0) <= 1e-4 * amax / 448.0);
                for (int f = b * 128; f < b * 128 + 128; f++) {
                    const double t = act[f] / sc, d = moe_e4m3_to_float(hb[(size_t)r * GV_F + f]);
                    codes_off += !(fabs(d - t) <= half_step(t) * 1.01 + 1e-6);
                    e1 += (d * sc - act[f]) * (d * sc - act[f]);
                    n1 += (double)act[f] * act[f];
                }
            }
#endif
            for (int c = 0; c < GV_H; c++) { /* from the kernel's own hbuf */
                double s = 0.0;
                for (int k = 0; k < GV_F; k++)
                    s += hv(r, k) * w2v(e, c, k);
                if (GV_BIAS)
                    s += moe_to_float(b2[e * GV_H + c]);
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
    long dbad = 0; /* the chain: every block counted once, the int past the counter untouched */
    if (GV_CHAIN)
        dbad = (done[0] != GV_STREAM) + (done[1] != 0);
    /* fp8: the up error is e4m3's own rounding (~2-3%), bounded above by the per-code check */
    const double up_tol = GV_FP8 ? 5e-2 : 5e-3;
    const double up = sqrt(e1 / (n1 + 1e-30)), down = sqrt(e2 / (n2 + 1e-30)), ue = GV_TRAIN ? sqrt(eu / (nu + 1e-30)) : 0;
    const int ok = up < up_tol && down < 5e-3 && ue < 5e-3 && padding == 0 && real_rows > 0 && ybad == 0 &&
                   ypast == 0 && tleft == 0 && codes_off == 0 && scales_off == 0 && dbad == 0;
    printf("%s: %ld rows in %d tiles: up %.2e, U %.2e, down %.2e normalized error; %ld padding elements written; "
           "fp8: %ld scales, %ld codes off; combine of %d tokens: %ld elements off, %ld past T, %ld tickets left; "
           "chain: %ld counters off: %s\n",
           argv[0], real_rows, nt, up, ue, down, padding, scales_off, codes_off, T, ybad, ypast, tleft, dbad,
           ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
