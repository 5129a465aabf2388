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
}
