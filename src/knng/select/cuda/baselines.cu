// The two historical baselines the papers compare against (see reference/baselines.py).
//
//   insertion_select  one thread per row keeps a sorted list of k keys and inserts every entry
//                     smaller than the list's last one, shifting the larger ones (Garcia et al.
//                     2008; Nolan 2009). The lists live in global memory laid out [k][rows], so
//                     a warp's threads touch consecutive addresses at the same list position.
//   bitonic_select    one block per row keeps its K = 2^ceil(log2 k) smallest keys sorted in
//                     shared memory; each next chunk of K entries is bitonic-sorted, folded into
//                     them (min of best[i] and chunk[K-1-i] is a bitonic sequence holding the K
//                     smallest of both) and merged (truncated bitonic sort, Sismanis et al. 2012).

#include "common.cuh"

extern "C" __global__ void
insertion_select(const float* __restrict__ scores, long long ld, int n, int k, int nrows,
                 u64* lists, float* out_v, long long* out_i, long long out_ld) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= nrows) return;
    const float* rowp = scores + (long long)row * ld;
    u64* list = lists + row;  // list[j * nrows]
    const long long step = nrows;
    for (int j = 0; j < k; ++j) list[j * step] = SENTINEL;
    for (int col = 0; col < n; ++col) {
        const u64 c = composite(rowp[col], (u32)col);
        if (c >= list[(k - 1) * step]) continue;
        int j = k - 1;
        while (j > 0) {
            const u64 prev = list[(j - 1) * step];
            if (prev <= c) break;
            list[j * step] = prev;
            --j;
        }
        list[j * step] = c;
    }
    for (int j = 0; j < k; ++j) write_out(out_v + (long long)row * out_ld, out_i + (long long)row * out_ld, j,
                                          list[j * step]);
}

extern "C" __global__ void __launch_bounds__(1024)
bitonic_select(const float* __restrict__ scores, long long ld, int n, int k, int K,
               float* out_v, long long* out_i, long long out_ld) {
    extern __shared__ u64 smem[];  // best[K], chunk[K]
    u64* best = smem;
    u64* chunk = smem + K;
    const int T = blockDim.x, tid = threadIdx.x;
    const long long row = blockIdx.x;
    const float* rowp = scores + row * ld;
    for (int i = tid; i < K; i += T) best[i] = SENTINEL;
    for (int base = 0; base < n; base += K) {
        for (int i = tid; i < K; i += T) {
            const int col = base + i;
            chunk[i] = col < n ? composite(rowp[col], (u32)col) : SENTINEL;
        }
        __syncthreads();
        block_sort(chunk, K);
        for (int i = tid; i < K; i += T) {
            const u64 other = chunk[K - 1 - i];
            if (other < best[i]) best[i] = other;
        }
        __syncthreads();
        block_bitonic_merge(best, K);
    }
    for (int i = tid; i < k; i += T) write_out(out_v + row * out_ld, out_i + row * out_ld, i, best[i]);
}
