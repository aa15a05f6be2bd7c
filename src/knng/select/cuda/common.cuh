// Shared pieces of knng's selection kernels: the total order, the pivot hash, block sorts.
//
// Every kernel orders a row by the 64-bit composite key (ordered float bits << 32) | column,
// where the ordered bits are those of a radix sort (NaN above +inf, -0.0 below +0.0); see
// src/knng/select/keys.py. Composite keys are distinct within a row, so the k smallest are
// one well-defined set whatever the algorithm, and a pivot taken from the row always splits
// it into "less", "equal" (the pivot itself) and "greater" with at least one element removed.

typedef unsigned int u32;
typedef unsigned long long u64;

#define FULL_MASK 0xFFFFFFFFu
#define NAN_BITS 0xFFFFFFFFu
#define SENTINEL 0xFFFFFFFFFFFFFFFFull

__device__ __forceinline__ u32 ordered_bits(float v) {
    u32 u = __float_as_uint(v);
    if (v != v) return NAN_BITS;
    return u ^ ((u & 0x80000000u) ? 0xFFFFFFFFu : 0x80000000u);
}

__device__ __forceinline__ float decode_bits(u32 key) {
    if (key == NAN_BITS) return __int_as_float(0x7FC00000);
    return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

__device__ __forceinline__ u64 composite(float v, u32 column) {
    return ((u64)ordered_bits(v) << 32) | column;
}

// murmur3's finaliser: the pivot positions and sample offsets; mirrored in reference/qms.py.
__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16; x *= 0x85EBCA6Bu;
    x ^= x >> 13; x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

#define ROW_MIX 0x9E3779B1u
#define PASS_MIX 0x7FEB352Du
#define SAMPLE_MIX 0x68E31DA4u

__device__ __forceinline__ u32 lanemask_lt() {
    u32 m; asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m)); return m;
}

__device__ __forceinline__ void write_out(float* out_v, long long* out_i, long long pos, u64 c) {
    out_v[pos] = decode_bits((u32)(c >> 32));
    out_i[pos] = (long long)(c & 0xFFFFFFFFull);
}

// Ascending bitonic sort of a[0:N) in shared memory by all threads of the block (N a power of 2).
__device__ void block_bitonic_sort(u64* a, int N) {
    const int T = blockDim.x, tid = threadIdx.x;
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < (N >> 1); i += T) {
                int lo = 2 * i - (i & (stride - 1));
                int hi = lo + stride;
                bool up = (lo & size) == 0;
                u64 x = a[lo], y = a[hi];
                if ((x > y) == up) { a[lo] = y; a[hi] = x; }
            }
            __syncthreads();
        }
    }
}

// The same network with the strides below 256 in registers: each of the first N/8 threads holds
// 8 consecutive keys, strides 1-4 are exchanges between its registers and strides 8-128 are
// warp shuffles, so only the strides of 256 and up touch shared memory and need a barrier
// (18 barriers for N = 4096 instead of 78). For 256 <= N <= 8 * blockDim.x.
#define SORT_EPT 8

__device__ __forceinline__ u64 shfl_xor_u64(u64 v, int mask) {
    u32 lo = __shfl_xor_sync(FULL_MASK, (u32)v, mask), hi = __shfl_xor_sync(FULL_MASK, (u32)(v >> 32), mask);
    return ((u64)hi << 32) | lo;
}

__device__ void block_bitonic_sort_registers(u64* a, int N) {
    const int T = blockDim.x, tid = threadIdx.x, lane = tid & 31;
    const bool holds = tid < N / SORT_EPT;  // whole warps: N / 8 is a multiple of 32
    const int e0 = tid * SORT_EPT;
    u64 x[SORT_EPT];
    if (holds) {
#pragma unroll
        for (int j = 0; j < SORT_EPT; ++j) x[j] = a[e0 + j];
    }
    for (int size = 2; size <= N; size <<= 1) {
        if (size > 256) {  // strides size/2 .. 256 across warps, through shared memory
            if (holds) {
#pragma unroll
                for (int j = 0; j < SORT_EPT; ++j) a[e0 + j] = x[j];
            }
            __syncthreads();
            for (int stride = size >> 1; stride >= 256; stride >>= 1) {
                for (int i = tid; i < (N >> 1); i += T) {
                    int lo = 2 * i - (i & (stride - 1));
                    int hi = lo + stride;
                    bool up = (lo & size) == 0;
                    u64 p = a[lo], q = a[hi];
                    if ((p > q) == up) { a[lo] = q; a[hi] = p; }
                }
                __syncthreads();
            }
            if (holds) {
#pragma unroll
                for (int j = 0; j < SORT_EPT; ++j) x[j] = a[e0 + j];
            }
        }
        if (holds) {
#pragma unroll
            for (int lanes = 16; lanes >= 1; lanes >>= 1) {  // strides 128 .. 8: other lanes
                const int stride = lanes * SORT_EPT;
                if (stride < size) {
                    const bool lower = (lane & lanes) == 0;
#pragma unroll
                    for (int j = 0; j < SORT_EPT; ++j) {
                        const u64 y = shfl_xor_u64(x[j], lanes);
                        const bool up = ((e0 + j) & size) == 0;
                        const u64 mn = x[j] < y ? x[j] : y, mx = x[j] < y ? y : x[j];
                        x[j] = (lower == up) ? mn : mx;
                    }
                }
            }
#pragma unroll
            for (int stride = SORT_EPT / 2; stride >= 1; stride >>= 1) {  // strides 4 .. 1: own registers
                if (stride < size) {
#pragma unroll
                    for (int j = 0; j < SORT_EPT; ++j) {
                        if ((j & stride) == 0) {
                            const bool up = ((e0 + j) & size) == 0;
                            const u64 p = x[j], q = x[j + stride];
                            if ((p > q) == up) { x[j] = q; x[j + stride] = p; }
                        }
                    }
                }
            }
        }
    }
    if (holds) {
#pragma unroll
        for (int j = 0; j < SORT_EPT; ++j) a[e0 + j] = x[j];
    }
    __syncthreads();
}

// Sort a[0:N) ascending by the fastest network that applies (N a power of 2).
__device__ void block_sort(u64* a, int N) {
    if (N >= 256 && N <= SORT_EPT * (int)blockDim.x) block_bitonic_sort_registers(a, N);
    else block_bitonic_sort(a, N);
}

// Sort a bitonic sequence a[0:N) ascending (the merge half of the network).
__device__ void block_bitonic_merge(u64* a, int N) {
    const int T = blockDim.x, tid = threadIdx.x;
    for (int stride = N >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < (N >> 1); i += T) {
            int lo = 2 * i - (i & (stride - 1));
            int hi = lo + stride;
            u64 x = a[lo], y = a[hi];
            if (x > y) { a[lo] = y; a[hi] = x; }
        }
        __syncthreads();
    }
}

// The sampled pivot: the rank-th smallest (0-based) of a sample of the row's ordered bits.
//
// The sample is SAMPLE_PER_THREAD * blockDim.x entries: the whole row when it is no longer,
// else chunks of 32 consecutive columns (one coalesced read per warp), one at a hashed offset
// inside each of blockDim.x * SAMPLE_PER_THREAD / 32 equal strata of the row. The rank-th
// smallest is found by a bitwise binary search on the keys held in registers: 32 rounds of a
// block-wide count, no sort and no shared array. Candidates are then the entries whose bits
// are <= the result. `counters` is 3 ints of shared memory (a triple buffer: a counter is
// reset two rounds before it is used again, so no round needs a second barrier).
#define SAMPLE_PER_THREAD 8

__device__ u32 sample_pivot(const float* __restrict__ rowp, int n, u32 row, u32 seed, int rank,
                            int* counters) {
    const int T = blockDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int s = T * SAMPLE_PER_THREAD;
    u32 keys[SAMPLE_PER_THREAD];
    if (n <= s) {
#pragma unroll
        for (int j = 0; j < SAMPLE_PER_THREAD; ++j) {
            int i = tid + j * T;
            keys[j] = i < n ? ordered_bits(rowp[i]) : NAN_BITS;  // pads never count (see below)
        }
    } else {
        const int chunks = s / 32, warps = T / 32;
        const int stratum = n / chunks, span = stratum - 31;  // n > s, so stratum >= 32
#pragma unroll
        for (int j = 0; j < SAMPLE_PER_THREAD; ++j) {
            int chunk = warp + j * warps;
            u32 h = mix32(seed ^ SAMPLE_MIX ^ (row * ROW_MIX) ^ ((u32)chunk * PASS_MIX));
            int start = chunk * stratum + (int)(h % (u32)span);
            keys[j] = ordered_bits(rowp[start + lane]);
        }
    }
    if (tid < 3) counters[tid] = 0;
    __syncthreads();
    // Smallest P with count(keys <= P) >= rank + 1. Trial values never reach NAN_BITS, so
    // pad keys (NAN_BITS) are never counted; P = NAN_BITS means "every entry".
    u32 P = 0;
    for (int b = 31; b >= 0; --b) {
        u32 trial = P | ((1u << b) - 1u);
        int cnt = 0;
#pragma unroll
        for (int j = 0; j < SAMPLE_PER_THREAD; ++j) cnt += keys[j] <= trial;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(FULL_MASK, cnt, o);
        int slot = b % 3;
        if (lane == 0) atomicAdd(&counters[slot], cnt);
        __syncthreads();
        int total = counters[slot];
        if (tid == 0) counters[(b + 1) % 3] = 0;  // the counter round b - 2 will use
        if (total < rank + 1) P |= (1u << b);
    }
    __syncthreads();
    return P;
}


// The k-th smallest ordered bits among the c keys (upper halves) of a shared array, by an
// MSD radix select: 4 rounds of a 256-bin shared histogram, 3 barriers each. Returns the bits
// P_k and sets *ties_ok when exactly k keys are <= P_k (no tie straddles the k-th value).
__device__ u32 block_radix_kth(const u64* keys, int c, int k, int* hist, int* shared_rank,
                               bool* ties_ok) {
    const int T = blockDim.x, tid = threadIdx.x, lane = tid & 31;
    u32 prefix = 0, mask = 0;
    int rank = k;  // 1-based rank still sought among keys matching the prefix
    int in_bin = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += T) hist[b] = 0;
        __syncthreads();
        for (int i = tid; i < c; i += T) {
            const u32 key = (u32)(keys[i] >> 32);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (tid < 32) {  // one warp scans the 256 bins, 8 per lane
            int local[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; ++j) { local[j] = hist[lane * 8 + j]; sum += local[j]; }
            int incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int x = __shfl_up_sync(FULL_MASK, incl, o);
                if (lane >= o) incl += x;
            }
            int below = incl - sum;
            if (below < rank && rank <= incl) {  // exactly one lane holds the bin
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (below < rank && rank <= below + local[j]) {
                        shared_rank[0] = lane * 8 + j;
                        shared_rank[1] = rank - below;
                        shared_rank[2] = local[j];
                    }
                    below += local[j];
                }
            }
        }
        __syncthreads();
        const u32 digit = (u32)shared_rank[0];
        rank = shared_rank[1];
        in_bin = shared_rank[2];
        prefix |= digit << shift;
        mask |= 255u << shift;
        __syncthreads();
    }
    *ties_ok = in_bin == rank;  // the keys equal to P_k are exactly the ones still wanted
    return prefix;
}
