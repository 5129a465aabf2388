/* route_host.cc — one spec's emitted route kernel (templates/route.lua) run
 * on the CPU through tests/support/cuda_host.h (its cp.async, ldmatrix and
 * mma.sync emulated there). test_route_host builds it per case: the route's
 * namespace and kernel and the prelude pieces they use (cut from the
 * emitted source, the namespace's inline-asm mma replaced by the host one)
 * are force-included, and -D gives the shape and name:
 *   RH_ROUTE  the kernel;  RH_TRAIN  1: it takes logits_out (a training spec)
 *   RH_H  hidden;  RH_NS  router columns (scored experts);  RH_KE  entries per token;
 *   RH_SLOTS  weight slots;  RH_PER_BLOCK  tokens per block;  RH_SMEM  its dynamic shared memory
 * usage: route_host IN OUT — IN (written by test_route_host): T, then x
 * [T, H] and wr [NS, H] (dtype bits), sel_bias and logit_bias [NS]
 * (fp32) (no sigmoid-gated shared expert: its kernel takes one more
 * input); the kernel runs unfused (mode 0) on a grid of ceil(T /
 * per_block) x moe_route_split blocks, topk_idx, topk_w and the logits
 * poisoned first, the counts and tickets zeroed as the runtime zeroes
 * them; OUT gets topk_idx [T, KE], topk_w [T, KE], counts
 * [SLOTS] and (RH_TRAIN) the logits [T, NS]. test_route_host compares
 * them with the C reference. Exit 1 when a file cannot be read or written. */
#include "launch_geom.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

template <class T> static bool get(FILE *f, std::vector<T> &v, size_t n) {
    v.resize(n);
    return fread(v.data(), sizeof(T), n, f) == n;
}
template <class T> static bool put(FILE *f, const std::vector<T> &v) {
    return fwrite(v.data(), sizeof(T), v.size(), f) == v.size();
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 1;
    FILE *in = fopen(argv[1], "rb");
    int T = 0;
    std::vector<moe_half_t> x, wr;
    std::vector<float> sel, lb;
    const int H = RH_H, NS = RH_NS, KE = RH_KE, SLOTS = RH_SLOTS;
    bool ok = in && fread(&T, sizeof T, 1, in) == 1 && T > 0 && get(in, x, (size_t)T * H) &&
              get(in, wr, (size_t)NS * H) && get(in, sel, (size_t)NS) && get(in, lb, (size_t)NS);
    if (in)
        fclose(in);
    if (!ok)
        return 1;
    std::vector<int> idx((size_t)T * KE, -7), counts((size_t)SLOTS + MOE_ROUTE_SPLIT_BLOCKS + 64 + 1, 0);
    std::vector<float> w((size_t)T * KE, -7.0f), logits((size_t)T * NS, -7.0f);
    const long long part = moe_route_scratch_bytes(RH_PER_BLOCK, NS, H);
    std::vector<float> route_part((size_t)(part > 0 ? part / 4 : 1), -7.0f);
    const moe_route_fuse_t fuse = {};
    const unsigned gx = (unsigned)((T + RH_PER_BLOCK - 1) / RH_PER_BLOCK), gy = moe_route_split(T, RH_PER_BLOCK, H);
    host_launch(gx, gy, RH_SMEM, [&] {
        RH_ROUTE(x.data(), wr.data(), sel.data(), lb.data(), T, idx.data(), w.data(), counts.data(),
                 route_part.data(), fuse
#if RH_TRAIN
                 , logits.data()
#endif
        );
    });
    counts.resize((size_t)SLOTS);
    FILE *out = fopen(argv[2], "wb");
    ok = out && put(out, idx) && put(out, w) && put(out, counts) && (!RH_TRAIN || put(out, logits));
    if (out)
        ok = fclose(out) == 0 && ok;
    printf("  route_host: %d tokens, %u x %u blocks\n", T, gx, gy);
    return ok ? 0 : 1;
}
