// Quick multi-select (Komarov, Dashti & D'Souza 2014) and knng's single-pass variant.
//
//   qms_warp   the paper's algorithm, one warp per row
//   qms_block  the paper's algorithm, one thread block per row (inter-warp prefix sum);
//              with sampled_rank >= 0 the first pivot comes from a sample (knng's change)
//   qms_filter knng's single-pass variant: a sampled pivot that should keep about k(1+eps)
//              entries, one read of the row that gathers them in shared memory, a bitonic
//              sort there; rows whose candidates do not fit are flagged for qms_block
//
// The partition pass is the paper's: 32 entries per warp step, a ballot on "below the
// pivot" and one on "above", each thread's slot from popc of the ballot masked to the lanes
// before it, the entries staged in shared memory (left side from the left end, right side
// from the right end) and written out with two coalesced stores: the left side grows up from
// the segment's start, the right side down from its end. So after a pass the segment holds
// the "less" entries in their old order, one hole if the pivot was an entry, then the
// "greater" entries in reverse order — whatever the width of the step (see
// reference/qms.py, which replays this exactly). Kept left sides are not copied back: a
// stack of (buffer, start, end, output offset) references records them, and they are copied
// to the output once, at the end or when the stack is full.
//
// Buffers: 0 is the score row itself (read as composite keys), 1 and 2 are the row's two
// auxiliary arrays of composite keys; a pass reads one and writes the other (1 after 0).

#include "common.cuh"

#define STACK_SIZE 32

struct Segment { int buf, start, end, out; };

__device__ __forceinline__ u64 load_key(int buf, const float* __restrict__ rowp, const u64* a1,
                                        const u64* a2, int i) {
    if (buf == 0) return composite(rowp[i], (u32)i);
    return buf == 1 ? a1[i] : a2[i];
}

// Copy stacked segments to the output, `step` threads from `first` (a warp or the block).
__device__ void copy_segments(const Segment* stack, int top, const float* __restrict__ rowp,
                              const u64* a1, const u64* a2, float* out_v, long long* out_i,
                              int first, int step) {
    for (int e = 0; e < top; ++e) {
        Segment s = stack[e];
        for (int i = s.start + first; i < s.end; i += step)
            write_out(out_v, out_i, s.out + (i - s.start), load_key(s.buf, rowp, a1, a2, i));
    }
}

// ---------------------------------------------------------------------------------------
// One thread block per row.
// ---------------------------------------------------------------------------------------
struct BlockState {
    int buf, l, r, kk, out, top, done, flush;
    u64 pivot;
    int TL, TR;
};

extern "C" __global__ void __launch_bounds__(1024)
qms_block(const float* __restrict__ scores, long long ld, int n, int k, const int* __restrict__ rows,
          int row0, u64* aux1, u64* aux2, long long aux_ld, float* out_v, long long* out_i,
          long long out_ld, u32 seed, int sampled_rank) {
    extern __shared__ u64 stage[];  // blockDim.x entries
    __shared__ Segment stack[STACK_SIZE];
    __shared__ int warp_left[32], warp_right[32];
    __shared__ BlockState st;
    __shared__ int counters[3];
    const int T = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warps = T >> 5;
    const u32 row = rows ? (u32)rows[blockIdx.x] : (u32)(row0 + blockIdx.x);
    const float* rowp = scores + (long long)row * ld;
    u64* a1 = aux1 + (long long)blockIdx.x * aux_ld;
    u64* a2 = aux2 + (long long)blockIdx.x * aux_ld;
    out_v += (long long)blockIdx.x * out_ld;
    out_i += (long long)blockIdx.x * out_ld;
    if (tid == 0) { st.buf = 0; st.l = 0; st.r = n; st.kk = k; st.out = 0; st.top = 0; st.done = k == 0; }
    __syncthreads();
    for (u32 pass = 0; !st.done; ++pass) {
        const int buf = st.buf, l = st.l, r = st.r, S = r - l;
        if (st.kk == S) {  // the whole segment is wanted
            __syncthreads();
            if (tid == 0) { stack[st.top++] = Segment{buf, l, r, st.out}; st.done = 1; }
            __syncthreads();
            break;
        }
        u64 pivot;
        if (pass == 0 && sampled_rank >= 0) {
            // knng: a pivot no entry equals, below which about k(1+eps) entries should lie.
            u32 P = sample_pivot(rowp, n, row, seed, sampled_rank, counters);
            pivot = ((u64)P << 32) | 0xFFFFFFFFull;
        } else {
            u32 h = mix32(seed ^ (row * ROW_MIX) ^ (pass * PASS_MIX));
            pivot = load_key(buf, rowp, a1, a2, l + (int)(h % (u32)S));
        }
        const int dst = buf == 1 ? 2 : 1;
        u64* D = dst == 1 ? a1 : a2;
        int gl = l, gr = r;
        for (int base = l; base < r; base += T) {
            const int i = base + tid;
            const bool valid = i < r;
            const u64 c = valid ? load_key(buf, rowp, a1, a2, i) : 0ull;
            const bool is_left = valid && c < pivot, is_right = valid && c > pivot;
            const u32 bl = __ballot_sync(FULL_MASK, is_left), br = __ballot_sync(FULL_MASK, is_right);
            const u32 before = lanemask_lt();
            if (lane == 0) { warp_left[warp] = __popc(bl); warp_right[warp] = __popc(br); }
            __syncthreads();
            if (tid == 0) {  // inter-warp exclusive prefix sum by one thread, as in the paper
                int sl = 0, sr = 0;
                for (int w = 0; w < warps; ++w) {
                    int a = warp_left[w], b = warp_right[w];
                    warp_left[w] = sl; warp_right[w] = sr; sl += a; sr += b;
                }
                st.TL = sl; st.TR = sr;
            }
            __syncthreads();
            const int TL = st.TL, TR = st.TR;
            if (is_left) stage[warp_left[warp] + __popc(bl & before)] = c;
            if (is_right) stage[T - 1 - (warp_right[warp] + __popc(br & before))] = c;
            __syncthreads();
            if (tid < TL) D[gl + tid] = stage[tid];
            if (tid >= T - TR) D[gr - TR + (tid - (T - TR))] = stage[tid];
            gl += TL; gr -= TR;
            __syncthreads();
        }
        if (tid == 0) {
            const int L = gl - l, R = r - gr, E = S - L - R;
            int kk = st.kk;
            if (kk <= L) {
                if (kk == L) { stack[st.top++] = Segment{dst, l, l + L, st.out}; st.done = 1; }
                else { st.buf = dst; st.r = l + L; }
            } else {
                if (L > 0) stack[st.top++] = Segment{dst, l, l + L, st.out};
                st.out += L;
                if (E) { write_out(out_v, out_i, st.out, pivot); st.out += 1; }
                kk -= L + E;
                st.kk = kk;
                if (kk == 0) st.done = 1;
                else { st.buf = dst; st.l = r - R; }
            }
            st.flush = st.top == STACK_SIZE;
        }
        __syncthreads();
        if (st.flush) {
            copy_segments(stack, st.top, rowp, a1, a2, out_v, out_i, tid, T);
            __syncthreads();
            if (tid == 0) st.top = 0;
            __syncthreads();
        }
    }
    copy_segments(stack, st.top, rowp, a1, a2, out_v, out_i, tid, T);
}

// ---------------------------------------------------------------------------------------
// One warp per row: `blockDim.x / 32` rows per block, no block-wide barriers.
// ---------------------------------------------------------------------------------------
#define WARP_ROWS 8  // rows (warps) per block: blockDim.x must be 32 * WARP_ROWS

extern "C" __global__ void
qms_warp(const float* __restrict__ scores, long long ld, int n, int k, int row0, int nrows,
         u64* aux1, u64* aux2, long long aux_ld, float* out_v, long long* out_i, long long out_ld,
         u32 seed) {
    __shared__ u64 stage_all[WARP_ROWS][32];
    __shared__ Segment stack_all[WARP_ROWS][STACK_SIZE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = blockIdx.x * (blockDim.x >> 5) + warp;
    if (slot >= nrows) return;  // the whole warp leaves together
    u64* stage = stage_all[warp];
    Segment* stack = stack_all[warp];
    const u32 row = (u32)(row0 + slot);
    const float* rowp = scores + (long long)row * ld;
    u64* a1 = aux1 + (long long)slot * aux_ld;
    u64* a2 = aux2 + (long long)slot * aux_ld;
    out_v += (long long)slot * out_ld;
    out_i += (long long)slot * out_ld;
    const u32 before = lanemask_lt();
    // Every lane holds the same state: decisions are warp-uniform.
    int buf = 0, l = 0, r = n, kk = k, out = 0, top = 0;
    bool done = k == 0;
    for (u32 pass = 0; !done; ++pass) {
        const int S = r - l;
        if (kk == S) {
            if (lane == 0) stack[top] = Segment{buf, l, r, out};
            ++top;
            break;
        }
        u32 h = mix32(seed ^ (row * ROW_MIX) ^ (pass * PASS_MIX));
        const u64 pivot = load_key(buf, rowp, a1, a2, l + (int)(h % (u32)S));
        const int dst = buf == 1 ? 2 : 1;
        u64* D = dst == 1 ? a1 : a2;
        int gl = l, gr = r;
        for (int base = l; base < r; base += 32) {
            const int i = base + lane;
            const bool valid = i < r;
            const u64 c = valid ? load_key(buf, rowp, a1, a2, i) : 0ull;
            const bool is_left = valid && c < pivot, is_right = valid && c > pivot;
            const u32 bl = __ballot_sync(FULL_MASK, is_left), br = __ballot_sync(FULL_MASK, is_right);
            const int nl = __popc(bl), nr = __popc(br);
            if (is_left) stage[__popc(bl & before)] = c;
            if (is_right) stage[31 - __popc(br & before)] = c;
            __syncwarp();
            if (lane < nl) D[gl + lane] = stage[lane];
            if (lane >= 32 - nr) D[gr - nr + (lane - (32 - nr))] = stage[lane];
            __syncwarp();
            gl += nl; gr -= nr;
        }
        const int L = gl - l, R = r - gr, E = S - L - R;
        if (kk <= L) {
            if (kk == L) {
                if (lane == 0) stack[top] = Segment{dst, l, l + L, out};
                ++top; done = true;
            } else { buf = dst; r = l + L; }
        } else {
            if (L > 0) { if (lane == 0) stack[top] = Segment{dst, l, l + L, out}; ++top; }
            out += L;
            if (E) { if (lane == 0) write_out(out_v, out_i, out, pivot); out += 1; }
            kk -= L + E;
            if (kk == 0) done = true;
            else { buf = dst; l = r - R; }
        }
        __syncwarp();
        if (top == STACK_SIZE) {
            copy_segments(stack, top, rowp, a1, a2, out_v, out_i, lane, 32);
            __syncwarp();
            top = 0;
        }
    }
    __syncwarp();
    copy_segments(stack, top, rowp, a1, a2, out_v, out_i, lane, 32);
}

// ---------------------------------------------------------------------------------------
// knng's single-pass variant: sampled pivot, one filtering read, sort in shared memory.
// ---------------------------------------------------------------------------------------
#define FILTER_UNROLL 4

// Append the entries flagged in `bits` (bit 4u+c: component c of vector u) to the candidates.
__device__ __forceinline__ void append_vectors(u64* cand, int cap, int* count, const float4* v,
                                               u32 bits, int col0, int T) {
    int cnt = __popc(bits);
    if (!__any_sync(FULL_MASK, cnt)) return;
    const int lane = threadIdx.x & 31;
    int incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int x = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += x;
    }
    int base = 0;
    if (lane == 31) base = atomicAdd(count, incl);
    base = __shfl_sync(FULL_MASK, base, 31);
    int pos = base + incl - cnt;
#pragma unroll
    for (int u = 0; u < FILTER_UNROLL; ++u) {
        const float comp[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (bits & (1u << (4 * u + c))) {
                if (pos < cap) cand[pos] = composite(comp[c], (u32)(col0 + 4 * u * T + c));
                ++pos;
            }
        }
    }
}

__device__ __forceinline__ void append_one(u64* cand, int cap, int* count, bool pred, u64 c) {
    const u32 b = __ballot_sync(FULL_MASK, pred);
    if (!b) return;
    const int lane = threadIdx.x & 31;
    int base = 0;
    if (lane == 0) base = atomicAdd(count, __popc(b));
    base = __shfl_sync(FULL_MASK, base, 0);
    if (pred) {
        int pos = base + __popc(b & lanemask_lt());
        if (pos < cap) cand[pos] = c;
    }
}

// Three blocks per multiprocessor (40 registers, a few bytes spilled): while one sorts, the
// others stream their rows. Measured on an H100: 10-13 % faster than two blocks for every k.
extern "C" __global__ void __launch_bounds__(512, 3)
qms_filter(const float* __restrict__ scores, long long ld, int n, int k, float* out_v,
           long long* out_i, long long out_ld, int* failed, u32 seed, int rank, int cap) {
    extern __shared__ u64 cand[];  // cap candidates, then room for the k winners
    __shared__ int counters[3];
    __shared__ int count;
    const int T = blockDim.x, tid = threadIdx.x;
    const u32 row = blockIdx.x;
    const float* rowp = scores + (long long)row * ld;
    // rank < 0: every entry is a candidate (the row fits); else the sample's rank-th smallest.
    const u32 P = rank < 0 ? NAN_BITS : sample_pivot(rowp, n, row, seed, rank, counters);
    // The filter compares floats, not keys: {x <= decode(P)} is a prefix of the order that
    // holds {key <= P} (it may add +0.0 when P is -0.0), so c >= k still means every one of
    // the k smallest is a candidate; NaN fails every comparison, hence take_all.
    const bool take_all = P == NAN_BITS;
    const float pf = decode_bits(P);
    if (tid == 0) count = 0;
    __syncthreads();
    // One read of the row: 16-byte loads when the row is 16-byte aligned, FILTER_UNROLL in flight.
    int done_cols = 0;
    if ((((unsigned long long)rowp) & 15ull) == 0) {
        const float4* rowv = reinterpret_cast<const float4*>(rowp);
        const int nvec = n >> 2;
        for (int base = 0; base < nvec; base += T * FILTER_UNROLL) {
            float4 v[FILTER_UNROLL];
#pragma unroll
            for (int u = 0; u < FILTER_UNROLL; ++u) {
                int idx = base + u * T + tid;
                v[u] = idx < nvec ? __ldg(rowv + idx) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            u32 bits = 0;
#pragma unroll
            for (int u = 0; u < FILTER_UNROLL; ++u) {
                bool in = base + u * T + tid < nvec;
                bits |= (u32)(in && (take_all || v[u].x <= pf)) << (4 * u);
                bits |= (u32)(in && (take_all || v[u].y <= pf)) << (4 * u + 1);
                bits |= (u32)(in && (take_all || v[u].z <= pf)) << (4 * u + 2);
                bits |= (u32)(in && (take_all || v[u].w <= pf)) << (4 * u + 3);
            }
            append_vectors(cand, cap, &count, v, bits, 4 * (base + tid), T);
        }
        done_cols = nvec << 2;
    }
    for (int base = done_cols; base < n; base += T) {
        const int i = base + tid;
        const float x = i < n ? rowp[i] : 0.0f;
        append_one(cand, cap, &count, i < n && (take_all || x <= pf), composite(x, (u32)i));
    }
    __syncthreads();
    const int c = count;
    if (c < k || c > cap) {  // too few (unlucky sample) or too many (ties): qms_block finishes
        if (tid == 0) failed[row] = 1;
        return;
    }
    // Sort the k winners alone when that saves a level of a large sorting network: find the
    // k-th value by a radix select and move the entries at or below it behind the candidates
    // (a tie straddling the k-th value keeps the full sort of all c). Measured on an H100 at
    // 8192 x 65536: k = 2048 2.54 -> 2.06 ms, k = 1024 1.68 -> 1.49 ms; below N = 1024 the
    // select costs more than the smaller sort saves (k = 64: 1.29 -> 1.46 ms).
    u64* keys = cand;
    int m = c, N = 1;
    while (N < c) N <<= 1;
    int Nk = 1;
    while (Nk < k) Nk <<= 1;
    if (Nk < N && N >= 1024) {
        __shared__ int hist[256], found[3];
        bool exact;
        const u32 Pk = block_radix_kth(cand, c, k, hist, found, &exact);
        if (exact) {
            u64* winners = cand + cap;
            if (tid == 0) count = 0;
            __syncthreads();
            for (int base = 0; base < c; base += T) {
                const int i = base + tid;
                const u64 key = i < c ? cand[i] : SENTINEL;
                append_one(winners, k, &count, i < c && (u32)(key >> 32) <= Pk, key);
            }
            __syncthreads();
            keys = winners; m = k; N = Nk;
        }
    }
    for (int i = m + tid; i < N; i += T) keys[i] = SENTINEL;
    __syncthreads();
    block_sort(keys, N);
    out_v += (long long)row * out_ld;
    out_i += (long long)row * out_ld;
    for (int i = tid; i < k; i += T) write_out(out_v, out_i, i, keys[i]);
}
