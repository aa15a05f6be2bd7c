// Fused float16 screen (knng/engine/kernels/cuda_screen.py launches it; contract: knng/engine/kernels/fused.py).
//
// What it computes. For every pair (i < m, j < n) of rows of A and B (float16, first K columns,
// K a multiple of 16): acc = A[i]·B[j] on the tensor cores (float32 accumulation), then
//   key = (acc × row_factor[i]) × col_scale[j] (+ col_terms[j]) (+ row_terms[i])
// each step rounded to nearest (no FMA contraction: the torch reference rounds so), and the
// tests key <= row_thr[i] and, for a symmetric block (col_thr), key <= col_thr[j]; the diagonal
// i == j + diag is dropped when exclude_diag is set. Each side's survivors are appended to a
// compact list (owner, other, key) whose int32 counter (counters[side]) counts every survivor,
// those past the capacity too (the host relaunches with a list large enough). NaN keys fail
// every test. The score block never reaches global memory.
//
// Design (mma.sync, no sm_90a features; the -D SCREEN_* defines pick a variant, see cuda_screen.py).
//  * Row-stationary persistent blocks: block (x, y) owns row block x (BM rows of A) and sweeps
//    the contiguous range y of column tiles (BN columns each); the grid's x runs fastest, so the
//    blocks resident together share their column ranges and B streams once from memory, then
//    from L2. With SCREEN_ARES (K small enough) A's whole BM × K block is loaded into shared
//    memory once; otherwise A's chunks stream with B's.
//  * B (and A without ARES) streams in chunks of 64 columns (128 bytes a row) through a
//    SCREEN_STAGES-deep cp.async ring (16-byte copies; rows past m / n zero-filled, units past
//    K never copied nor read), one __syncthreads a chunk; the ring runs across tile boundaries,
//    so the next tiles' copies are in flight during a tile's epilogue. Shared rows are
//    XOR-swizzled in 16-byte units (unit ^ (row & 7)): ldmatrix.x4 and the copies are
//    bank-conflict free. Each tile's first k-step runs the mma with C = 0 (no zeroing).
//  * Warps of 64 × 64 (or 64 × 32): ldmatrix.x4 fragments, mma.sync.m16n8k16 (f16 or bf16
//    inputs, f32 accumulators in registers).
//  * Epilogue in registers. The tile's column vectors (col_scale, col_terms, col_thr) ride in
//    the ring with its last chunk, the block's row vectors sit in shared memory; rows and
//    columns past m / n get a NaN factor, so their keys fail every test with no extra compare.
//    Symmetric blocks (and SCREEN_PRE=0) compute every key exactly and OR the tests into one
//    predicate per 16 rows and side. Non-symmetric blocks (SCREEN_PRE) keep z = acc·α·s_a and
//    test q = fma(z, s_b, ct) <= T_i, T_i = thr_i − rt_i + 2^-19·(|thr_i| + |rt_i| + max|ct|)
//    (pretest_bound): every key <= thr_i passes, and the 3 or 4 rounded operations an entry
//    become 2; the candidates' exact keys then decide, so the lists are those of the exact test
//    bit for bit (bench/cuda_screen_kernel.py compares the two on ties and non-finite values).
//  * Survivors: a warp votes (__any_sync) once per 16 rows and side; only a warp with a
//    candidate there builds its lanes' bit masks, reserves slots (a ballot, or a warp scan when
//    a lane has several) and writes the entries one loop trip each (a select tree picks the
//    register): the rarely run code is small, which matters because its instruction fetches
//    are cold. Entries go to a per-warp buffer in shared memory; a full buffer (64 entries)
//    goes to the global list with one atomicAdd, so no warp waits on a global atomic per tile,
//    and each warp's last buffer is flushed when its block ends. The excluded diagonal is
//    tested only in that path.
//
//  * Strip minima (SCREEN_MIN, cuda_screen.launch_strip_minima): the same products and keys, but
//    the epilogue keeps, per row, the smallest key of each warp's 64 columns and its column (ties
//    to the smaller column, NaN never the smallest) and writes those: the seeds of τ from a
//    sample without writing its score block.
//
// Registers (NVRTC for sm_90 through CuPy): 210–219 a thread for 64 × 64 warps, <= 128 for
// 64 × 32; no local memory (nvcc 13.0 -Xptxas -v: 0 spill, 0 stack). Shared memory at K = 128,
// 128 × 128 (A resident, 4 stages): 105–110 KB, two blocks a multiprocessor.
//
// Measured on an H100 (bench/cuda_screen_kernel.py, 2026-11-24; float16 rows, column terms,
// thresholds keeping ~0 / ~15 / ~194 pairs per row; the Triton kernel in bfloat16 on the same keys):
//   10,000 × 2^20, K = 128, 128 × 128 resident:  7.64 / 8.29 / 10.10 ms (351 / 324 / 266 TFLOP/s);
//       Triton 19.75 / 22.38 / 40.95 ms. (64 × 32 warps: 8.09 / 8.52 / 9.66; without the
//       pre-test: 8.52 / 9.06 / 10.75; bf16 inputs: 7.56 / 8.50 / 10.11.)
//   K = 64: 4.90 / 5.38 / 7.40 ms (Triton 18.01 / 20.48 / 39.98).
//   K = 256, 256 × 128 resident: 14.47 / 14.84 / 16.72 ms (Triton 24.46 / 26.82 / 44.87).
//   K = 960, 128 × 128 streamed: 54.26 / 56.73 / 57.59 ms (Triton 53.70 / 55.87 / 70.51): here the
//       reads of A and B from L2 (64 flop a byte) bound it; a wgmma main loop is the next step.
//   16,384² symmetric block, K = 128, both thresholds and terms, diagonal excluded, ~0 / ~13 /
//       ~199 kept per row and column: 256 × 128 resident 0.42 / 0.65 / 0.90 ms, 128 × 128
//       0.40 / 0.78 / 0.93 (Triton 1.05 / 3.15 / 6.80).

#include "screen_common.cuh"

#ifndef SCREEN_BM
#define SCREEN_BM 128
#endif
#ifndef SCREEN_BN
#define SCREEN_BN 128
#endif
#ifndef SCREEN_WM
#define SCREEN_WM 2  // warps along M
#endif
#ifndef SCREEN_WN
#define SCREEN_WN 2  // warps along N
#endif
#ifndef SCREEN_STAGES
#define SCREEN_STAGES 4
#endif
#ifndef SCREEN_ARES
#define SCREEN_ARES 1  // A's block resident in shared memory (else streamed with B)
#endif
#ifndef SCREEN_MINB
#define SCREEN_MINB 2  // blocks per SM the register allocation must allow
#endif
#ifndef SCREEN_RT
#define SCREEN_RT 0  // row_terms present
#endif
#ifndef SCREEN_CT
#define SCREEN_CT 1  // col_terms present
#endif
#ifndef SCREEN_SYM
#define SCREEN_SYM 0  // col_thr present (symmetric block)
#endif
#ifndef SCREEN_PRE
#define SCREEN_PRE 1  // non-symmetric blocks: fused pre-test, exact keys only for its candidates
#endif
#ifndef SCREEN_WITH_BF16
#define SCREEN_WITH_BF16 0
#endif
#ifndef SCREEN_MIN
#define SCREEN_MIN 0  // strip minima instead of survivors (non-symmetric, no pre-test; see below)
#endif

namespace screen {

using namespace screen_common;

constexpr int BM = SCREEN_BM, BN = SCREEN_BN, WARPS_M = SCREEN_WM, WARPS_N = SCREEN_WN;
constexpr int STAGES = SCREEN_STAGES;
constexpr bool ARES = SCREEN_ARES != 0, HAS_RT = SCREEN_RT != 0, HAS_CT = SCREEN_CT != 0, SYM = SCREEN_SYM != 0;
constexpr bool MINIMA = SCREEN_MIN != 0 && !SYM;
constexpr bool PRE = SCREEN_PRE != 0 && !SYM && !MINIMA;
constexpr int NWARPS = WARPS_M * WARPS_N, THREADS = 32 * NWARPS;
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;  // a warp's tile
constexpr int MI = WTM / 16, NI = WTN / 8;               // its m16 and n8 fragments
constexpr int BK = 64;                                   // halves of a chunk row
constexpr int ROWB = 128;                                // bytes of a chunk row
constexpr int RSTEP = THREADS / 8;                       // rows one pass of 16-byte copies covers
constexpr int NCOLV = 1 + (HAS_CT ? 1 : 0) + (SYM ? 1 : 0);  // col_scale, [col_terms], [col_thr]
constexpr int NROWV = 4;  // row_factor, row_thr, row_terms (or 0), the pre-test's bound
constexpr int SIDES = SYM ? 2 : 1;

static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile: multiples of 16");
static_assert(THREADS % 64 == 0, "copies assume 8 | THREADS / 8 (swizzle phase per thread)");
static_assert(BM % RSTEP == 0 && BN % RSTEP == 0, "rows per copy pass");
static_assert(STAGES >= 2, "ring");
static_assert(NI * 4 <= 32, "a lane's entries of 16 rows fit a 32-bit mask");


__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// First k-step of a tile: C = 0 (the accumulators need no zeroing between tiles).
template <bool BF16>
__device__ __forceinline__ void mma16816_zero(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const float z = 0.f;
  if (BF16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(z));
  }
}

template <bool BF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if (BF16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Shared memory of one block, in bytes (cuda_screen.shared_bytes mirrors it).
__host__ __device__ constexpr int a_panels(int K) { return ARES ? (K + BK - 1) / BK : STAGES; }
__host__ __device__ constexpr int off_b(int K) { return a_panels(K) * BM * ROWB; }
__host__ __device__ constexpr int off_col(int K) { return off_b(K) + STAGES * BN * ROWB; }
__host__ __device__ constexpr int off_row(int K) { return off_col(K) + STAGES * NCOLV * BN * 4; }
__host__ __device__ constexpr int off_buf(int K) { return off_row(K) + NROWV * BM * 4; }
__host__ __device__ constexpr int smem_bytes(int K) { return off_buf(K) + SIDES * NWARPS * WBUF * 12; }


template <bool BF16>
__device__ __forceinline__ void body(const half_t* __restrict__ A, const half_t* __restrict__ B, int m, int n, int K,
                                     int lda, int ldb, const float* __restrict__ row_factor,
                                     const float* __restrict__ col_scale, const float* __restrict__ row_terms,
                                     const float* __restrict__ col_terms, const float* __restrict__ row_thr,
                                     const float* __restrict__ col_thr, const float* __restrict__ term_bound,
                                     const Lists& out, int diag, int exclude_diag, float* __restrict__ strip_keys,
                                     int* __restrict__ strip_cols, int strips) {
  extern __shared__ __align__(128) unsigned char smem[];
  const float nan = __int_as_float(0x7fc00000);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int row0 = blockIdx.x * BM;
  const int tiles = (n + BN - 1) / BN;
  const int t_begin = (int)((long long)blockIdx.y * tiles / gridDim.y);
  const int t_end = (int)((long long)(blockIdx.y + 1) * tiles / gridDim.y);
  if (t_begin >= t_end) return;  // more column ranges than tiles (the launcher avoids it)
  const int KC = (K + BK - 1) / BK;

  {  // the launcher's shared-memory size must match this layout
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (unsigned)smem_bytes(K)) __trap();
  }
  const unsigned sA = smem_u32(smem), sB = sA + off_b(K);
  float* s_col = reinterpret_cast<float*>(smem + off_col(K));
  float* s_row = reinterpret_cast<float*>(smem + off_row(K));
  int* s_buf = reinterpret_cast<int*>(smem + off_buf(K)) + warp * 3 * WBUF;  // this warp's, side 0

  // The block's row vectors (visible after the main loop's first barrier). Rows past m: NaN.
  load_row_vectors<BM, THREADS, HAS_RT, HAS_CT, PRE>(s_row, row0, m, row_factor, row_thr, row_terms, term_bound);

  // Copies: this thread moves 16-byte unit lc of rows lr, lr + RSTEP, ... of each chunk.
  const int lc = tid & 7, lr = tid >> 3;
  const unsigned dst0 = lr * ROWB + ((lc ^ (lr & 7)) << 4);

  if (ARES) {  // A's whole block, once (in the first commit group)
    for (int p = 0; p < KC; ++p) {
      const int kk = p * BK + lc * 8;
      if (kk >= K) continue;  // never read (see issue below)
#pragma unroll 4
      for (int t = 0; t < BM / RSTEP; ++t) {
        const int gr = row0 + lr + t * RSTEP;
        const bool ok = gr < m;
        cp_async16(sA + p * BM * ROWB + dst0 + t * RSTEP * ROWB, ok ? A + (long long)gr * lda + kk : A, ok);
      }
    }
  }

  // The ring's producer: chunk (tile, kc) into slot. Units past K are never read by the
  // fragments (the last chunk runs only its k-steps below K), so they are not copied; rows past
  // m or n are zero-filled (their keys are NaN anyway).
  const long long bstep = (long long)RSTEP * ldb, astep = (long long)RSTEP * lda;
  auto issue = [&](int tile, int kc, int slot) {
    const int col0 = tile * BN;
    const int kk = kc * BK + lc * 8;
    if (kk < K) {
      const half_t* src = B + (long long)(col0 + lr) * ldb + kk;
      const unsigned dst = sB + slot * BN * ROWB + dst0;
      if (col0 + BN <= n) {
#pragma unroll
        for (int t = 0; t < BN / RSTEP; ++t) cp_async16(dst + t * RSTEP * ROWB, src + t * bstep, true);
      } else {
#pragma unroll
        for (int t = 0; t < BN / RSTEP; ++t) {
          const bool ok = col0 + lr + t * RSTEP < n;
          cp_async16(dst + t * RSTEP * ROWB, ok ? src + t * bstep : B, ok);
        }
      }
      if (!ARES) {
        const half_t* asrc = A + (long long)(row0 + lr) * lda + kk;
        const unsigned adst = sA + slot * BM * ROWB + dst0;
#pragma unroll
        for (int t = 0; t < BM / RSTEP; ++t) {
          const bool ok = row0 + lr + t * RSTEP < m;
          cp_async16(adst + t * RSTEP * ROWB, ok ? asrc + t * astep : A, ok);
        }
      }
    }
    if (kc == KC - 1) {  // the tile's column vectors ride with its last chunk; columns past n: NaN
      float* cv = s_col + slot * NCOLV * BN;
#pragma unroll
      for (int t = 0; t < (BN + THREADS - 1) / THREADS; ++t) {
        const int c = tid + t * THREADS, gc = col0 + c;
        if (c < BN) {
          if (gc < n) {
            cp_async4(smem_u32(cv + c), col_scale + gc);
            if (HAS_CT) cp_async4(smem_u32(cv + BN + c), col_terms + gc);
            if (SYM) cp_async4(smem_u32(cv + (NCOLV - 1) * BN + c), col_thr + gc);
          } else {
            cv[c] = nan;
            if (HAS_CT) cv[BN + c] = 0.f;
            if (SYM) cv[(NCOLV - 1) * BN + c] = nan;
          }
        }
      }
    }
  };

  const int chunks = (t_end - t_begin) * KC;
  int is_tile = t_begin, is_kc = 0, is_slot = 0, issued = 0;
  auto issue_next = [&]() {
    if (issued < chunks) {
      issue(is_tile, is_kc, is_slot);
      if (++is_kc == KC) { is_kc = 0; ++is_tile; }
      if (++is_slot == STAGES) is_slot = 0;
      ++issued;
    }
    cp_commit();  // one group per step, empty or not: wait_group counts them
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) issue_next();

  // ldmatrix addresses: rows of this lane's 8 × 8 matrix; 16-byte unit (2·ks + hi) ^ (row & 7),
  // written (32·ks) ^ x with x = (hi ^ (lane & 7)) << 4 since row & 7 == lane & 7.
  const unsigned a_lane = (wm * WTM + (lane & 15)) * ROWB;
  const unsigned b_lane = (wn * WTN + ((lane >> 4) & 1) * 8 + (lane & 7)) * ROWB;
  const unsigned xa = ((((unsigned)lane >> 4) & 1u) ^ ((unsigned)lane & 7u)) << 4;
  const unsigned xb = ((((unsigned)lane >> 3) & 1u) ^ ((unsigned)lane & 7u)) << 4;

  float acc[MI][NI][4];  // set by each tile's first k-step (C = 0)

  auto kstep = [&](unsigned a_base, unsigned b_base, int ks, auto zero) {
    unsigned af[MI][4], bf[NI / 2][4];
    const unsigned ka = ((unsigned)ks * 32u) ^ xa, kb = ((unsigned)ks * 32u) ^ xb;
#pragma unroll
    for (int i = 0; i < MI; ++i) ldsm_x4(a_base + i * 16 * ROWB + ka, af[i]);
#pragma unroll
    for (int jj = 0; jj < NI / 2; ++jj) ldsm_x4(b_base + jj * 16 * ROWB + kb, bf[jj]);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        if (decltype(zero)::value)
          mma16816_zero<BF16>(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
        else
          mma16816<BF16>(acc[i][j], af[i], bf[j / 2][(j & 1) * 2], bf[j / 2][(j & 1) * 2 + 1]);
      }
  };
  const Bool<true> first{};
  const Bool<false> next{};

  int count0 = 0, count1 = 0;  // entries in this warp's buffers (warp-uniform)
  const int g = lane >> 2, tig = lane & 3;
  int slot = 0;
  for (int tile = t_begin; tile < t_end; ++tile) {
    for (int kc = 0; kc < KC; ++kc) {
      cp_wait<STAGES - 2>();
      __syncthreads();
      issue_next();
      const unsigned a_base = sA + (ARES ? kc : slot) * BM * ROWB + a_lane;
      const unsigned b_base = sB + slot * BN * ROWB + b_lane;
      const int krem = K - kc * BK;
      if (krem >= BK) {
        if (kc == 0)
          kstep(a_base, b_base, 0, first);
        else
          kstep(a_base, b_base, 0, next);
#pragma unroll
        for (int ks = 1; ks < BK / 16; ++ks) kstep(a_base, b_base, ks, next);
      } else {  // K's last, partial chunk (K % 64 in {16, 32, 48})
        if (kc == 0)
          kstep(a_base, b_base, 0, first);
        else
          kstep(a_base, b_base, 0, next);
#pragma unroll 1
        for (int ks = 1; ks < krem / 16; ++ks) kstep(a_base, b_base, ks, next);
      }
      if (kc < KC - 1 && ++slot == STAGES) slot = 0;
    }

    // ---- epilogue of the tile: keys, tests, survivors
    const int col0 = tile * BN;
    const float* cv = s_col + slot * NCOLV * BN;
    // The excluded diagonal (row == col + diag) is tested only where a warp found a survivor:
    // dl is the local (row − col) offset of this thread's entries' diagonal, or 2^30 (none).
    int dl = 1 << 30;
    if (exclude_diag) {
      const long long dd = (long long)col0 + diag - row0;  // local row == local col + dd
      if (dd > -BN && dd < BM) dl = (int)dd - (wm * WTM + g - wn * WTN - 2 * tig);
    }
    float rf[MI][2], rthr[MI][2], rt[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * WTM + i * 16 + h * 8 + g;
        rf[i][h] = s_row[r];
        rthr[i][h] = s_row[PRE ? 3 * BM + r : BM + r];  // PRE: the pre-test's bound
        rt[i][h] = HAS_RT ? s_row[2 * BM + r] : 0.f;
      }
    bool hit_r[MI], hit_c[MI];
#pragma unroll
    for (int i = 0; i < MI; ++i) hit_r[i] = hit_c[i] = false;
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int c = wn * WTN + j * 8 + 2 * tig;
      const float2 cs = *reinterpret_cast<const float2*>(cv + c);
      const float2 ct = HAS_CT ? *reinterpret_cast<const float2*>(cv + BN + c) : float2{0.f, 0.f};
      const float2 cth = SYM ? *reinterpret_cast<const float2*>(cv + (NCOLV - 1) * BN + c) : float2{0.f, 0.f};
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int h = v >> 1;
          if (PRE) {  // acc keeps z = acc·α·s_a; the test takes q = z·s_b + ct in one rounding
            const float z = __fmul_rn(acc[i][j][v], rf[i][h]);
            acc[i][j][v] = z;
            const float q = HAS_CT ? __fmaf_rn(z, (v & 1) ? cs.y : cs.x, (v & 1) ? ct.y : ct.x)
                                   : __fmul_rn(z, (v & 1) ? cs.y : cs.x);
            hit_r[i] |= q <= rthr[i][h];
          } else {
            float key = __fmul_rn(__fmul_rn(acc[i][j][v], rf[i][h]), (v & 1) ? cs.y : cs.x);
            if (HAS_CT) key = __fadd_rn(key, (v & 1) ? ct.y : ct.x);
            if (HAS_RT) key = __fadd_rn(key, rt[i][h]);
            acc[i][j][v] = key;
            hit_r[i] |= key <= rthr[i][h];
            if (SYM) hit_c[i] |= key <= ((v & 1) ? cth.y : cth.x);
          }
        }
    }
    if (MINIMA) {
      // Each row's smallest key in this warp's strip of WTN columns (ties: the smaller column;
      // NaN keys, rows and columns past m / n included, are never smaller): a thread's own
      // entries, then the four lanes of its row (tig) by shuffles; lane tig == 0 writes.
      const int strip = (col0 + wn * WTN) / WTN;
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float best = __int_as_float(0x7f800000);
          int bcol = col0 + wn * WTN;  // the strip's first column: a valid one when every key is +inf or NaN
#pragma unroll
          for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int w = 0; w < 2; ++w) {
              const float key = acc[i][j][2 * h + w];
              const int c = col0 + wn * WTN + j * 8 + 2 * tig + w;
              if (key < best || (key == best && c < bcol)) { best = key; bcol = c; }
            }
#pragma unroll
          for (int off = 1; off < 4; off *= 2) {
            const float ob = __shfl_xor_sync(FULL, best, off);
            const int oc = __shfl_xor_sync(FULL, bcol, off);
            if (ob < best || (ob == best && oc < bcol)) { best = ob; bcol = oc; }
          }
          const int r = row0 + wm * WTM + i * 16 + h * 8 + g;
          if (tig == 0 && r < m && strip < strips) {
            strip_keys[(long long)r * strips + strip] = best;
            strip_cols[(long long)r * strips + strip] = bcol;
          }
        }
      if (++slot == STAGES) slot = 0;
      continue;
    }
    // Survivors: a warp votes once per 16 rows and side; only a warp with a survivor there
    // takes its lanes' kept entries (a bit mask each), reserves their slots with one warp scan
    // and writes them one by one.
    const int rbase = row0 + wm * WTM + g, cbase = col0 + wn * WTN + 2 * tig;
    // PRE: the exact key of entry e (bit 4j + v) of 16-row group i from its z = acc·α·s_a.
    auto exact_key = [&](float z, int e, int i) {
      const int lr = wm * WTM + i * 16 + g + 8 * ((e >> 1) & 1), lc = wn * WTN + 2 * tig + 8 * (e >> 2) + (e & 1);
      float key = __fmul_rn(z, cv[lc]);
      if (HAS_CT) key = __fadd_rn(key, cv[BN + lc]);
      if (HAS_RT) key = __fadd_rn(key, s_row[2 * BM + lr]);
      return key;
    };
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      if (__any_sync(FULL, hit_r[i])) {
        unsigned bits = 0;
        if (PRE) {
          // Candidates (the pre-test again), then each one's exact key and test; the keys are
          // computed once more when written (candidates are few).
          unsigned cand = 0;
#pragma unroll
          for (int j = 0; j < NI; ++j) {
            const float2 cs = *reinterpret_cast<const float2*>(cv + wn * WTN + j * 8 + 2 * tig);
            const float2 ct = HAS_CT ? *reinterpret_cast<const float2*>(cv + BN + wn * WTN + j * 8 + 2 * tig)
                                     : float2{0.f, 0.f};
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              const float z = acc[i][j][v];
              const float q = HAS_CT ? __fmaf_rn(z, (v & 1) ? cs.y : cs.x, (v & 1) ? ct.y : ct.x)
                                     : __fmul_rn(z, (v & 1) ? cs.y : cs.x);
              if (q <= rthr[i][v >> 1] && i * 16 + 8 * (v >> 1) - j * 8 - (v & 1) != dl) cand |= 1u << (j * 4 + v);
            }
          }
          while (cand) {
            const int e = __ffs(cand) - 1;
            cand &= cand - 1;
            const int lr = wm * WTM + i * 16 + g + 8 * ((e >> 1) & 1);
            if (exact_key(pick(acc[i], e), e, i) <= s_row[BM + lr]) bits |= 1u << e;
          }
        } else {
#pragma unroll
          for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v)
              if (acc[i][j][v] <= rthr[i][v >> 1] && i * 16 + 8 * (v >> 1) - j * 8 - (v & 1) != dl)
                bits |= 1u << (j * 4 + v);
        }
        const Dest d = reserve<0>(__popc(bits), out, s_buf, count0, lane);
        if (PRE)
          emit<0>(bits, acc[i], d, rbase + i * 16, cbase, [&](float z, int e) { return exact_key(z, e, i); });
        else
          emit<0>(bits, acc[i], d, rbase + i * 16, cbase, [](float key, int) { return key; });
      }
      if (SYM && __any_sync(FULL, hit_c[i])) {
        unsigned bits = 0;
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const float2 cth = *reinterpret_cast<const float2*>(cv + (NCOLV - 1) * BN + wn * WTN + j * 8 + 2 * tig);
#pragma unroll
          for (int v = 0; v < 4; ++v)
            if (acc[i][j][v] <= ((v & 1) ? cth.y : cth.x) && i * 16 + 8 * (v >> 1) - j * 8 - (v & 1) != dl)
              bits |= 1u << (j * 4 + v);
        }
        const Dest d = reserve<1>(__popc(bits), out, s_buf + NWARPS * 3 * WBUF, count1, lane);
        emit<1>(bits, acc[i], d, rbase + i * 16, cbase, [](float key, int) { return key; });
      }
    }
    if (++slot == STAGES) slot = 0;
  }
  cp_wait<0>();
  if (count0) flush<0>(out, s_buf, count0, lane);
  if (SYM && count1) flush<1>(out, s_buf + NWARPS * 3 * WBUF, count1, lane);
}

}  // namespace screen

#define SCREEN_CALL(BF16)                                                                                          \
  SCREEN_LISTS;                                                                                                    \
  screen::body<BF16>(A, B, m, n, K, lda, ldb, row_factor, col_scale, row_terms, col_terms, row_thr, col_thr,      \
                     term_bound, out,                                                                              \
                     diag, exclude_diag, strip_keys, strip_cols, strips)

extern "C" __global__ void __launch_bounds__(screen::THREADS, SCREEN_MINB) screen_f16(SCREEN_PARAMS) {
  SCREEN_CALL(false);
}

#if SCREEN_WITH_BF16
extern "C" __global__ void __launch_bounds__(screen::THREADS, SCREEN_MINB) screen_bf16(SCREEN_PARAMS) {
  SCREEN_CALL(true);
}
#endif
