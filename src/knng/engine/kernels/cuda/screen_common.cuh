// Device code both fused float16 screens share (screen.cu: mma.sync; screen_wg.cu: wgmma): the
// asynchronous copies, the warps' survivor buffers and how entries reach the global lists, and
// the non-symmetric pre-test's bound. knng._cuda.source_kernel pastes this file in place
// of its #include line (so that the kernel's cache key covers it).

typedef unsigned short half_t;  // raw 16-bit storage: the tensor cores read the bits

namespace screen_common {

#ifndef SCREEN_WBUF
#define SCREEN_WBUF 64
#endif
// Survivors a warp buffers per side before one global atomic (32 in the wgmma kernel's
// one-set variant, whose two blocks a multiprocessor must fit in its shared memory).
constexpr int WBUF = SCREEN_WBUF;
constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ unsigned smem_u32(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool ok) {
  // src-size 0 writes 16 zero bytes and reads nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// One warp's survivor buffers: per side, WBUF (owner, other, key) entries in shared memory.
template <bool V>
struct Bool {
  static constexpr bool value = V;
};

struct Lists {
  int* owner[2];
  int* other[2];
  float* keys[2];
  int* counters;
  int capacity;
};

// Move a warp's buffered entries of `side` to the global list: one atomicAdd reserves them.
template <int SIDE>
__device__ __forceinline__ void flush(const Lists& out, int* buf, int& count, int lane) {
  __syncwarp();
  int base = 0;
  if (lane == 0) base = atomicAdd(out.counters + SIDE, count);
  base = __shfl_sync(FULL, base, 0);
#pragma unroll 1
  for (int e = lane; e < count; e += 32) {
    const int slot = base + e;
    if (slot >= 0 && slot < out.capacity) {
      out.owner[SIDE][slot] = buf[e];
      out.other[SIDE][slot] = buf[WBUF + e];
      out.keys[SIDE][slot] = __int_as_float(buf[2 * WBUF + e]);
    }
  }
  __syncwarp();
  count = 0;
}

// Where a warp's new entries go (`cnt` of them in this lane): its buffer when they fit (after
// flushing it if need be), else, more than a buffer's worth at once, the global list directly
// (one atomicAdd). `start` is this lane's first slot; slots outside [0, limit) are not written.
struct Dest {
  int* owner;
  int* other;
  float* keys;
  int start, limit;
};

template <int SIDE>
__device__ __forceinline__ Dest reserve(int cnt, const Lists& out, int* buf, int& count, int lane) {
  int total, excl;
  if (__all_sync(FULL, cnt <= 1)) {  // the common case: a vote gives the offsets
    const unsigned vote = __ballot_sync(FULL, cnt != 0);
    total = __popc(vote);
    excl = __popc(vote & ((1u << lane) - 1u));
  } else {
    int incl = cnt;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int t = __shfl_up_sync(FULL, incl, off);
      if (lane >= off) incl += t;
    }
    total = __shfl_sync(FULL, incl, 31);
    excl = incl - cnt;
  }
  if (count + total > WBUF && count > 0) flush<SIDE>(out, buf, count, lane);
  Dest d;
  if (count + total <= WBUF) {
    d = Dest{buf, buf + WBUF, reinterpret_cast<float*>(buf + 2 * WBUF), count + excl, WBUF};
    count += total;
  } else {
    int base = 0;
    if (lane == 0) base = atomicAdd(out.counters + SIDE, total);
    base = __shfl_sync(FULL, base, 0);
    d = Dest{out.owner[SIDE], out.other[SIDE], out.keys[SIDE], base + excl, out.capacity};
  }
  return d;
}

// x[e >> 2][e & 3] for a run-time e < 4·NI without local memory: a tree of selects on e's bits.
template <int NI>
__device__ __forceinline__ float pick(const float (&x)[NI][4], int e) {
  constexpr int LEVELS = NI == 8 ? 5 : NI == 4 ? 4 : NI == 2 ? 3 : 2;
  static_assert((NI * 4) == (1 << LEVELS), "4·NI entries, a power of two");
  float t[NI * 4];
#pragma unroll
  for (int q = 0; q < NI * 4; ++q) t[q] = x[q >> 2][q & 3];
#pragma unroll
  for (int lvl = 0; lvl < LEVELS; ++lvl) {
    const bool hi = (e >> lvl) & 1;
#pragma unroll
    for (int p = 0; p < (NI * 4) / 2; ++p)
      if (p < ((NI * 4) >> lvl) / 2) t[p] = hi ? t[2 * p + 1] : t[2 * p];
  }
  return t[0];
}

// A row's number in the lists: itself (contiguous rows).
struct SameRow {
  __device__ __forceinline__ int operator()(int r) const { return r; }
};

// Write the entries whose bits are set (bit 4j + v: row rbase + 8·(v >> 1), column cbase + 8j + (v & 1)
// of the 16-row group x) to d, one loop trip per entry: the rarely run code stays small. `row_of`
// maps the row to its number in the lists (a gathered block's rows: their indices).
template <int SIDE, int NI, typename KeyOf, typename RowOf = SameRow>
__device__ __forceinline__ void emit(unsigned bits, const float (&x)[NI][4], Dest d, int rbase, int cbase,
                                     KeyOf key_of, RowOf row_of = RowOf()) {
  while (bits) {
    const int e = __ffs(bits) - 1;
    bits &= bits - 1;
    const float key = key_of(pick(x, e), e);
    const int r = row_of(rbase + 8 * ((e >> 1) & 1)), c = cbase + 8 * (e >> 2) + (e & 1);
    if (d.start >= 0 && d.start < d.limit) {
      d.owner[d.start] = SIDE ? c : r;
      d.other[d.start] = SIDE ? r : c;
      d.keys[d.start] = key;
    }
    ++d.start;
  }
  __syncwarp();
}

// The pre-test's bound T on q = fma(z, cs, ct) for a row with threshold thr and term rt, where
// C >= |ct| for every column: key <= thr implies q <= T (the key's three roundings and q's one
// differ by at most 15·2^-24·(|thr| + |rt| + C) near the threshold; T adds twice that and more).
// An infinite or NaN term, bound or threshold sends every entry to the exact test (T = +inf),
// except a NaN threshold, which keeps nothing; T >= -FLT_MAX covers keys that overflow to -inf.
__device__ __forceinline__ float pretest_bound(float thr, float rt, float C) {
  if (thr != thr) return thr;
  const float m = __fadd_rn(__fmul_rn(__fadd_rn(__fadd_rn(fabsf(thr), fabsf(rt)), C), 0x1p-19f), 0x1p-120f);
  const float T = __fadd_rn(__fsub_rn(thr, rt), m);
  if (T != T) return __int_as_float(0x7f800000);
  return fmaxf(T, -3.402823466e38f);
}

// The block's row vectors in shared memory, BM each: factor, threshold, term (0 without) and,
// with the pre-test, its bound; rows past m get a NaN factor and threshold, so that their keys
// fail every test with no extra compare. `gathered`: the block's rows are gathered[0 … count − 1]
// (the others past m), not row0 … row0 + BM − 1.
template <int BM, int THREADS, bool HAS_RT, bool HAS_CT, bool PRE>
__device__ __forceinline__ void load_row_vectors(float* s_row, int row0, int m, const float* __restrict__ row_factor,
                                                 const float* __restrict__ row_thr,
                                                 const float* __restrict__ row_terms,
                                                 const float* __restrict__ term_bound,
                                                 const int* __restrict__ gathered = nullptr, int count = 0) {
  const float nan = __int_as_float(0x7fc00000);
  const int tid = threadIdx.x;
  for (int r = tid; r < BM; r += THREADS) {
    const int gr = gathered ? (r < count ? gathered[r] : m) : row0 + r;
    const bool ok = gr >= 0 && gr < m;
    const float thr = ok ? row_thr[gr] : nan, rt = (ok && HAS_RT) ? row_terms[gr] : 0.f;
    s_row[r] = ok ? row_factor[gr] : nan;
    s_row[BM + r] = thr;
    s_row[2 * BM + r] = rt;
    if (PRE) s_row[3 * BM + r] = pretest_bound(thr, rt, (HAS_CT && term_bound) ? *term_bound : 0.f);
  }
}

}  // namespace screen_common

// Both kernels' parameters (knng/engine/kernels/cuda_screen.py passes the same arguments to either; the
// strip minima's last three only screen.cu's SCREEN_MIN variant reads) and their survivor lists.
#define SCREEN_PARAMS                                                                                              \
  const half_t *__restrict__ A, const half_t *__restrict__ B, int m, int n, int K, int lda, int ldb,               \
      const float *__restrict__ row_factor, const float *__restrict__ col_scale,                                   \
      const float *__restrict__ row_terms, const float *__restrict__ col_terms,                                    \
      const float *__restrict__ row_thr, const float *__restrict__ col_thr, const float *__restrict__ term_bound,   \
      int *row_owner, int *row_other,                                                                              \
      float *row_keys, int *col_owner, int *col_other, float *col_keys, int *counters, int capacity, int diag,     \
      int exclude_diag, float *strip_keys, int *strip_cols, int strips
#define SCREEN_LISTS \
  screen_common::Lists out { {row_owner, col_owner}, {row_other, col_other}, {row_keys, col_keys}, counters, capacity }
