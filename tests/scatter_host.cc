/* scatter_host.cc — one spec's emitted permute_scatter (templates/permute.lua)
 * run on the CPU through tests/support/cuda_host.h. test_scatter_host builds
 * it per case: the plan kernel's namespace and the scatter kernel (cut from
 * the emitted source) are force-included, and -D gives the shape and name:
 *   SH_SCATTER  the kernel;  SH_E  the weight slots;  SH_Z  the zero experts;
 *   SH_K  entries per token;  SH_H  hidden;  SH_ROWS  tokens per block;
 *   SH_GATHER  1: the kernel takes src_of last (the gathered up GEMM's
 *   scatter, gen/spec.h moe_spec_gather), so it runs twice: with NULL
 *   (the rows copied, checked as below) and with src_of, where it must
 *   write row_of and src_of[row] = t for every routed entry and no row of
 *   xs at all, nor an src_of entry of a padding row
 *   SH_FP8  1: fp8 weights' quantizing scatter (rows written as e4m3 into
 *   xq [rows, H] and one fp32 scale per 128 columns into xsc): each
 *   routed row must equal runtime/fp8.c's moe_fp8_quantize_block of its
 *   token's row per 128 columns (linked in), bytes and scales bit for bit;
 *   SH_INPUT 1 (router.apply = "input"): the weights random, the row
 *   quantized is x·w rounded to the dtype (w rounded first)
 * usage: scatter_host SEED T — T tokens, each with SH_K distinct random
 * experts of the SH_E + SH_Z scored ones (a zero expert: index >= SH_E),
 * their slots' rows laid out at offsets aligned to 8 as permute_plan lays
 * them, xs and row_of poisoned. Prints one line; exit 0 when row_of maps
 * the routed entries one to one into their experts' rows, each zero entry
 * to row offsets[E] + t, every such row holds x[t] bit for bit, the
 * cursors end at the counts, and no other row of xs was written (the
 * padding rows, and the zero row of a token without a zero expert). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#ifndef SH_FP8
#define SH_FP8 0
#endif
#ifndef SH_INPUT
#define SH_INPUT 0
#endif
#if SH_FP8
extern "C" float moe_fp8_quantize_block(const float *v, size_t n, uint8_t *q); /* runtime/fp8.c: the host's rule */

/* The fp8 scatter: rows quantized (e4m3 + a scale per 128 columns); no zero experts with fp8 weights. */
static int run_fp8(int seed, int T, const std::vector<moe_half_t> &x, const std::vector<int> &idx,
                   const std::vector<float> &w, const std::vector<int> &off, const std::vector<int> &cnt) {
    const int S = SH_E, K = SH_K, H = SH_H, HB = SH_H / 128;
    const long rows = off[S] + 1; /* the routed rows and one past them */
    std::vector<unsigned char> xq((size_t)rows * H, 0xff);
    std::vector<float> xsc((size_t)rows * HB, -7.0f);
    std::vector<int> row_of((size_t)T * K, -1), cursor(S, 0);
    host_launch((unsigned)((T + SH_ROWS - 1) / SH_ROWS), 1, 0, [&] {
        SH_SCATTER(x.data(), idx.data(), w.data(), off.data(), cursor.data(), T, xq.data(), xsc.data(), row_of.data());
    });
    std::vector<char> used((size_t)rows, 0);
    std::vector<float> v(128);
    std::vector<unsigned char> q(128);
    long bad_map = 0, bad_row = 0, bad_cursor = 0, stray = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            const int e = idx[(size_t)t * K + k], r = row_of[(size_t)t * K + k];
            if (r < off[e] || r >= off[e] + cnt[e] || used[r]) {
                bad_map++;
                continue;
            }
            used[r] = 1;
            bool same = true;
            for (int b = 0; b < HB; b++) {
                for (int i = 0; i < 128; i++) {
                    const float xv = moe_to_float(x[(size_t)t * H + b * 128 + i]);
                    v[i] = SH_INPUT ? moe_round(xv * moe_round(w[(size_t)t * K + k])) : xv;
                }
                const float sc = moe_fp8_quantize_block(v.data(), 128, q.data());
                same = same && memcmp(&xq[(size_t)r * H + b * 128], q.data(), 128) == 0 &&
                       memcmp(&xsc[(size_t)r * HB + b], &sc, 4) == 0;
            }
            bad_row += !same;
        }
    for (int e = 0; e < S; e++)
        bad_cursor += cursor[e] != cnt[e];
    for (long r = 0; r < rows; r++)
        if (!used[r]) {
            for (int h = 0; h < H; h++)
                stray += xq[(size_t)r * H + h] != 0xff;
            for (int b = 0; b < HB; b++)
                stray += xsc[(size_t)r * HB + b] != -7.0f;
        }
    const bool ok = !bad_map && !bad_row && !bad_cursor && !stray;
    printf("  scatter_host (fp8%s) seed %d, T %d: bad row_of %ld, rows not the host's quantization %ld, cursors %ld, "
           "stray writes %ld: %s\n", SH_INPUT ? ", x·w" : "", seed, T, bad_map, bad_row, bad_cursor, stray,
           ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
#endif

int main(int argc, char **argv) {
    const int seed = argc > 1 ? atoi(argv[1]) : 0, T = argc > 2 ? atoi(argv[2]) : 1;
    const int S = SH_E, NS = SH_E + SH_Z, K = SH_K, H = SH_H, ALIGN = 8;
    std::mt19937 rng(4321u + (unsigned)seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<moe_half_t> x((size_t)T * H);
    for (auto &v : x)
        v = moe_from_float(u(rng));
    std::vector<int> idx((size_t)T * K), cnt(S, 0), off(S + 1, 0), cursor(S, 0);
    std::vector<float> w((size_t)T * K, 1.0f);
    std::vector<int> all(NS);
    for (int e = 0; e < NS; e++)
        all[e] = e;
    long zeros = 0;
    for (int t = 0; t < T; t++) {
        std::shuffle(all.begin(), all.end(), rng);
        if (t % 5 == 4) /* every fifth token routed experts only (its zero row must stay unwritten) */
            std::stable_partition(all.begin(), all.end(), [&](int e) { return e < S; });
        for (int k = 0; k < K; k++) {
            const int e = all[k];
            idx[(size_t)t * K + k] = e;
            if (e < S)
                cnt[e]++;
            else
                zeros++;
        }
    }
    for (int e = 0; e < S; e++)
        off[e + 1] = off[e] + (cnt[e] + ALIGN - 1) / ALIGN * ALIGN;
#if SH_FP8
    if (SH_INPUT) /* the weights the rows are scaled by */
        for (auto &v : w)
            v = 0.25f + 0.5f * std::fabs(u(rng));
    (void)zeros;
    return run_fp8(seed, T, x, idx, w, off, cnt);
#endif
#if !SH_FP8
    const moe_half_t poison = 0xffff;
    const long rows = off[S] + T + 1; /* the routed rows, one per token for the zero experts, one past them */
    bool all_ok = true;
    for (int gather = 0; gather <= SH_GATHER; gather++) {
        std::vector<moe_half_t> xs((size_t)rows * H, poison);
        std::vector<int> row_of((size_t)T * K, -1), src_of((size_t)rows, -7);
        std::fill(cursor.begin(), cursor.end(), 0);
        host_launch((unsigned)((T + SH_ROWS - 1) / SH_ROWS), 1, 0, [&] {
#if SH_GATHER
            SH_SCATTER(x.data(), idx.data(), w.data(), off.data(), cursor.data(), T, xs.data(), row_of.data(),
                       gather ? src_of.data() : nullptr);
#else
            SH_SCATTER(x.data(), idx.data(), w.data(), off.data(), cursor.data(), T, xs.data(), row_of.data());
#endif
        });
        std::vector<char> used((size_t)rows, 0);
        long bad_map = 0, bad_row = 0, bad_cursor = 0, stray = 0, bad_src = 0;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++) {
                const int e = idx[(size_t)t * K + k], r = row_of[(size_t)t * K + k];
                const bool ok = e < S ? r >= off[e] && r < off[e] + cnt[e] && !used[r] : r == off[S] + t;
                if (!ok) {
                    bad_map++;
                    continue;
                }
                used[r] = 1;
                if (gather) /* maps only: the row's token, and the row itself never written */
                    bad_src += src_of[r] != t;
                else
                    bad_row += memcmp(&xs[(size_t)r * H], &x[(size_t)t * H], (size_t)H * 2) != 0;
            }
        for (int e = 0; e < S; e++)
            bad_cursor += cursor[e] != cnt[e];
        for (long r = 0; r < rows; r++) {
            if (gather && !used[r])
                bad_src += src_of[r] != -7;
            if (!used[r] || gather)
                for (int h = 0; h < H; h++)
                    stray += xs[(size_t)r * H + h] != poison;
        }
        const bool ok = !bad_map && !bad_row && !bad_cursor && !stray && !bad_src;
        printf("  scatter_host seed %d, T %d%s: %ld of %ld entries to zero experts; bad row_of %ld, rows not x %ld, "
               "src_of %ld, cursors %ld, stray writes %ld: %s\n",
               seed, T, gather ? " (src_of: maps only)" : "", zeros, (long)T * K, bad_map, bad_row, bad_src,
               bad_cursor, stray, ok ? "ok" : "FAIL");
        all_ok &= ok;
    }
    return all_ok ? 0 : 1;
#endif
}
