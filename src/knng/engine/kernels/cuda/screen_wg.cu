// Fused float16 screen on Hopper's warpgroup MMA (wgmma, sm_90a). Same contract as screen.cu,
// whose header says what a screen computes (keys, tests, the excluded diagonal, the lists and
// their counters); knng/engine/kernels/cuda_screen.py launches either with the same arguments.
//
// Why a second kernel. screen.cu's mma.sync tiles run a tile's products, then its epilogue, in
// the same warps: on an H200 (28,672² block, K = 128, nothing kept) its tensor pipe was busy 54 %
// of the time in a non-symmetric block and 41 % in a symmetric one (ncu), with two warps a
// scheduler and none eligible 58-62 % of the cycles. Here the products are asynchronous: a
// warpgroup issues tile t's wgmma into one set of accumulators and, while the tensor cores run
// them, computes tile t − 1's keys and tests from the other set. mma.sync also reaches only
// about two thirds of the tensor cores' wgmma rate.
//
// Design.
//  * Row-stationary persistent blocks as in screen.cu (block (x, y): rows x·128 … x·128 + 127,
//    the contiguous range y of 128-column tiles). Two consumer warpgroups, 64 rows each
//    (wgmma m64n128k16, A and B from shared memory).
//  * Two ways to keep the tensor cores busy during the epilogues (SCREEN_SETS):
//     - one accumulator set (K ≤ 128, the default there): a warpgroup multiplies a tile, waits,
//       then screens it; two blocks share a multiprocessor (≤ 128 registers a thread, ≤ 113 KB
//       of shared memory a block), so that one block's products run while the other's warps
//       screen, and each scheduler has four warps to pick from instead of two. H200, 28,672²
//       block at K = 128: 14–18 % faster than two sets with nothing kept (a triangle 3–4 %),
//       21–31 % with ~2 and ~36 survivors a row (docs/FINDINGS.md, "Screen precision and kernels");
//     - two sets (K ≤ 256; at K > 128 A and two B tiles are 192 KB, so one block a
//       multiprocessor): a warpgroup issues tile t's wgmma into one set of accumulators and,
//       while the tensor cores run them, computes tile t − 1's keys and tests from the other.
//  * A's block is resident in shared memory (K ≤ 256: its panels of 64 columns); B's tiles
//    stream through a ring of SCREEN_BSTAGES tiles by cp.async (16-byte copies by every thread,
//    rows past n zero-filled), their column vectors through one of SCREEN_STAGES: the tile
//    being multiplied (and, with two sets, the tile in its epilogue: its vectors only), and
//    STAGES − SETS tiles loading (one set: two of each, one tile loading; two sets at K ≤ 128:
//    four of each, two loading; at K = 256 three vector slots and two B tiles, one loading).
//    Rows are stored 128 bytes a chunk with 16-byte units XOR-swizzled by (row & 7): exactly the
//    128-byte-swizzle layout wgmma's descriptors read, on 1024-byte aligned panels (the kernel
//    aligns its shared memory itself).
//  * Each accumulator set is 64 floats a thread (its warp's 16 rows × 128 columns in the
//    mma.m16n8 fragment order); with two, the tile loop is unrolled by two so that the sets are
//    named at compile time.
//  * The epilogue is screen.cu's (the same key roundings, pre-test and tests, the same warp
//    votes and survivor buffers, from screen_common.cuh), on two 64-column halves of a warp's
//    16 × 128 strip (a lane's entries of a half fit a 32-bit mask).
//  * Strip minima (SCREEN_MIN): the same products and keys; per row and 64-column half, the
//    smallest key and its column, as screen.cu's minima (cuda_screen.launch_strip_minima).
//  * A triangle (SCREEN_TRI, symmetric): a graph part's own block, only its tiles on or right
//    of the diagonal (see TRI below).
//  * Tile minima (SCREEN_MIN=2): per row and 128-column tile the smallest key only, no column
//    (a search's thresholds when its tiles go first: knng/engine/search.py).
//  * Gathered rows (SCREEN_GATHER): persistent blocks screen work items of one column tile and
//    up to 128 rows gathered from a list, the (row, tile) pairs a search's tiles first left (see
//    GATHER below).
// Only float16 (and bfloat16 for comparison) rows with K ≤ 256; larger K stays in screen.cu.

#include "screen_common.cuh"

#ifndef SCREEN_SETS
#define SCREEN_SETS 2  // accumulator sets a warpgroup alternates between (see the design above)
#endif
#ifndef SCREEN_STAGES
#define SCREEN_STAGES 4
#endif
#ifndef SCREEN_BSTAGES
#define SCREEN_BSTAGES SCREEN_STAGES
#endif
#ifndef SCREEN_KC
#define SCREEN_KC 2  // chunks of 64 columns: K ≤ 64·SCREEN_KC, the rest of the last chunk zeros
#endif
#ifndef SCREEN_RT
#define SCREEN_RT 0
#endif
#ifndef SCREEN_CT
#define SCREEN_CT 1
#endif
#ifndef SCREEN_SYM
#define SCREEN_SYM 0
#endif
#ifndef SCREEN_PRE
#define SCREEN_PRE 1
#endif
#ifndef SCREEN_WITH_BF16
#define SCREEN_WITH_BF16 0
#endif
#ifndef SCREEN_MIN
#define SCREEN_MIN 0  // strip minima instead of survivors (non-symmetric, no pre-test; see screen.cu)
#endif
#ifndef SCREEN_TRI
#define SCREEN_TRI 0  // symmetric: the upper triangle of a square block of one set of points
#endif
#ifndef SCREEN_MARK
#define SCREEN_MARK 1  // the pre-test marks its candidates as it goes (see MARK below)
#endif
#ifndef SCREEN_GATHER
#define SCREEN_GATHER 0  // work items of one column tile and gathered rows (see GATHER below)
#endif

namespace screen_wg {

using namespace screen_common;

constexpr int BM = 128, BN = 128;  // two warpgroups of 64 rows; wgmma's n
constexpr int NWARPS = 8, THREADS = 32 * NWARPS;
constexpr int SETS = SCREEN_SETS;
constexpr int STAGES = SCREEN_STAGES;  // tiles of column vectors in their ring
// Tiles loading while one is multiplied and (two sets) another screened.
constexpr int LOOKAHEAD = STAGES - SETS;
// B's tiles in theirs: a tile's epilogue reads its column vectors but not its B, so B's ring
// needs no slot for the tile screened (LOOKAHEAD + 1: the tile multiplied and those loading).
// At K = 256 that is what fits: A (64 KB) and two B tiles of 64 KB, with one tile loading.
constexpr int BSTAGES = SCREEN_BSTAGES;
constexpr bool HAS_RT = SCREEN_RT != 0, HAS_CT = SCREEN_CT != 0, SYM = SCREEN_SYM != 0;
constexpr bool MINIMA = SCREEN_MIN != 0 && !SYM;
// Tile minima (SCREEN_MIN=2): per row and 128-column tile only the smallest key, no column
// (a graph by rows takes its thresholds and the tiles it screens from them: search.py).
constexpr bool TILEMIN = SCREEN_MIN == 2 && MINIMA;
// The upper triangle (SCREEN_TRI) of a square block whose rows and columns are the same points
// in the same order (a graph part's own block S(J, J)): every pair i ≤ j is scored once, as
// entry (i, j), and tested against both points' thresholds, so the block costs half its tiles
// (a rows screen of the whole block scores each pair twice). Row block x sweeps tiles x … in
// chunks of ⌈tiles / gridDim.y⌉; in the diagonal tile x itself the row side keeps entries on or
// right of the diagonal (the diagonal unless excluded) and the column side those right of it,
// so that no pair is listed twice on one side.
constexpr bool TRI = SCREEN_TRI != 0 && SYM;
constexpr bool PRE = SCREEN_PRE != 0 && !SYM && !MINIMA;
// With the pre-test, each entry that passes it sets its bit in a 32-bit mask of the warp's
// half-tile as the entry is tested (one predicated OR), so that a half-tile with a survivor
// does not run the pre-test again for its 32 entries to find them. At k = 100 by rows (~391
// survivors a row of 200,000) ~86 % of the half-tiles hold one.
constexpr bool MARK = SCREEN_MARK != 0 && PRE;
// Gathered rows (SCREEN_GATHER, non-symmetric with the pre-test): the screen of only the
// (row, tile) pairs a search needs (each row's tiles whose minimum is within its threshold:
// search.py), grouped by tile. Work item i is column tile t = item_tile[i] against up to BM of
// its rows, gathered from gather_rows, and lists its survivors under those rows' numbers. For
// the T = `strips` tiles, tile_index holds each tile's pairs (counts), the first of them in
// gather_rows (first) and the inclusive running sum of its work items of BM rows (ends): items
// past ends[T − 1] are none. Blocks are persistent (block b takes items b, b + gridDim.x, …), so
// that the host launches without reading how many items there are.
constexpr bool GATHER = SCREEN_GATHER != 0 && PRE;
constexpr int BK = 64;       // halves of a chunk row
constexpr int ROWB = 128;    // bytes of a chunk row
constexpr int RSTEP = THREADS / 8;
constexpr int HALF = 8;      // n8 blocks of a 64-column half
constexpr int NCOLV = 1 + (HAS_CT ? 1 : 0) + (SYM ? 1 : 0);
constexpr int NROWV = GATHER ? 5 : 4;  // factor, threshold, term, bound (and the gathered row numbers)
constexpr int SIDES = SYM ? 2 : 1;
constexpr int ALIGN = 1024;  // the 128-byte swizzle's atom: 8 rows of 128 bytes
constexpr int KC = SCREEN_KC;

static_assert(KC >= 1 && KC <= 4, "A resident in shared memory: K ≤ 256");
static_assert(SETS == 1 || SETS == 2, "one accumulator set or two");
static_assert(STAGES >= SETS + 1, "a tile multiplied (and, two sets, one screened), one loading");
static_assert(BSTAGES >= LOOKAHEAD + 1 && BSTAGES <= STAGES, "B's slot is free once its tile's products are");
static_assert(BN % RSTEP == 0 && BM % RSTEP == 0, "rows per copy pass");
static_assert(!TRI || BM == BN, "the triangle's row block x is column tile x");

// Shared memory of one block, in bytes, from a 1024-byte aligned base (cuda_screen.shared_bytes
// mirrors it, with the ALIGN the kernel may skip to reach that base).
__host__ __device__ constexpr int off_b(int K) { return KC * BM * ROWB; }
__host__ __device__ constexpr int off_col(int K) { return off_b(K) + BSTAGES * KC * BN * ROWB; }
__host__ __device__ constexpr int off_row(int K) { return off_col(K) + STAGES * NCOLV * BN * 4; }
__host__ __device__ constexpr int off_buf(int K) { return off_row(K) + NROWV * BM * 4; }
__host__ __device__ constexpr int smem_bytes(int K) { return off_buf(K) + SIDES * NWARPS * WBUF * 12 + ALIGN; }
static_assert(smem_bytes(0) <= 227 * 1024, "one block's shared memory (H100, H200: 227 KB)");

// A shared-memory matrix descriptor: K-major rows of 128 bytes, 128-byte swizzle, 8-row groups
// 1024 bytes apart (the leading offset is unused by this layout).
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
         (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// cp.async writes shared memory through the generic proxy; wgmma reads it through the async one.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Reads of an accumulator set stay after the wait that completes it.
__device__ __forceinline__ void settle(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_REGS                                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "     \
  "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
  "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_O8(b)                                                                                                   \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]),        \
      "+f"(d[b + 7])
#define WG_OUTS WG_O8(0), WG_O8(8), WG_O8(16), WG_O8(24), WG_O8(32), WG_O8(40), WG_O8(48), WG_O8(56)

// d (+)= A·Bᵀ for a warpgroup's 64 rows and 128 columns, one k16 step; accumulate == 0 starts a sum.
template <bool BF16>
__device__ __forceinline__ void mma_k16(float (&d)[64], unsigned long long a, unsigned long long b, int accumulate) {
  if (BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_OUTS
                 : "l"(a), "l"(b), "r"(accumulate));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WG_REGS ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_OUTS
                 : "l"(a), "l"(b), "r"(accumulate));
  }
}

// Half h (columns 64h … 64h + 63) of an accumulator set as screen_common's [n8 block][entry].
__device__ __forceinline__ float (&half_of(float (&d)[64], int h))[HALF][4] {
  return *reinterpret_cast<float(*)[HALF][4]>(&d[32 * h]);
}

template <bool BF16>
__device__ __forceinline__ void body(const half_t* __restrict__ A, const half_t* __restrict__ B, int m, int n, int K,
                                     int lda, int ldb, const float* __restrict__ row_factor,
                                     const float* __restrict__ col_scale, const float* __restrict__ row_terms,
                                     const float* __restrict__ col_terms, const float* __restrict__ row_thr,
                                     const float* __restrict__ col_thr, const float* __restrict__ term_bound,
                                     const Lists& out, int diag, int exclude_diag, float* __restrict__ strip_keys,
                                     int* __restrict__ strip_cols, int strips, const int* __restrict__ gather_rows,
                                     const int* __restrict__ item_tile, const int* __restrict__ tile_index) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const float nan = __int_as_float(0x7fc00000);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup: rows 64·wg … of the block
  const int row0 = GATHER ? 0 : blockIdx.x * BM;
  const int tiles = (n + BN - 1) / BN;
  int t_begin = 0, t_end = 0, g_start = 0, g_count = 0;
  const int items = GATHER ? tile_index[3 * strips - 1] : 1;  // GATHER: every tile's work items
  if (GATHER) {
    if ((int)blockIdx.x >= items) return;
  } else if (TRI) {
    const int chunk = (tiles + gridDim.y - 1) / gridDim.y;
    t_begin = blockIdx.x + blockIdx.y * chunk;
    t_end = min(t_begin + chunk, tiles);
  } else {
    t_begin = (int)((long long)blockIdx.y * tiles / gridDim.y);
    t_end = (int)((long long)(blockIdx.y + 1) * tiles / gridDim.y);
  }
  if (!GATHER && t_begin >= t_end) return;

  {
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (unsigned)smem_bytes(K) || (K + BK - 1) / BK != KC) __trap();
  }
  const unsigned raw = smem_u32(smem_raw);
  const unsigned sA = (raw + ALIGN - 1) & ~(unsigned)(ALIGN - 1), sB = sA + off_b(K);
  unsigned char* smem = smem_raw + (sA - raw);
  float* s_col = reinterpret_cast<float*>(smem + off_col(K));
  float* s_row = reinterpret_cast<float*>(smem + off_row(K));
  int* s_buf = reinterpret_cast<int*>(smem + off_buf(K)) + warp * 3 * WBUF;
  // GATHER: each block row's number in the lists (read by the survivors' writes, after barriers).
  int* s_rowid = reinterpret_cast<int*>(s_row + 4 * BM);
  float acc[SETS][64];
  const int g = lane >> 2, tig = lane & 3;
  const int lrow = wg * 64 + (warp & 3) * 16 + g;  // the block row of this lane's entries 0 and 1
  int count0 = 0, count1 = 0;

  // One sweep (GATHER: one for each of this block's work items; their survivors stay in the
  // warps' buffers across items, under their rows' numbers).
  auto sweep = [&]() {
  load_row_vectors<BM, THREADS, HAS_RT, HAS_CT, PRE>(s_row, row0, m, row_factor, row_thr, row_terms, term_bound,
                                                     GATHER ? gather_rows + g_start : nullptr, g_count);
  if (GATHER)
    for (int r = tid; r < BM; r += THREADS) s_rowid[r] = r < g_count ? gather_rows[g_start + r] : -1;

  const int lc = tid & 7, lr = tid >> 3;
  const unsigned dst0 = lr * ROWB + ((lc ^ (lr & 7)) << 4);
  // A's block (in the first tile's commit group). Units past K are zero-filled, not read
  // (src-size 0), so that every chunk's four k-steps run.
#pragma unroll
  for (int p = 0; p < KC; ++p) {
    const int kk = p * BK + lc * 8;
#pragma unroll
    for (int t = 0; t < BM / RSTEP; ++t) {
      const int lr_t = lr + t * RSTEP;
      const int gr = GATHER ? (lr_t < g_count ? gather_rows[g_start + lr_t] : m) : row0 + lr_t;
      const bool ok = gr >= 0 && gr < m && kk < K;
      cp_async16(sA + p * BM * ROWB + dst0 + t * RSTEP * ROWB, ok ? A + (long long)gr * lda + kk : A, ok);
    }
  }

  // Tile `tile` (step i of the sweep): its chunks into B's slot i % BSTAGES and its column
  // vectors into theirs, i % STAGES (nothing past t_end), then one commit group, empty or not:
  // wait_group counts them.
  const long long bstep = (long long)RSTEP * ldb;
  auto issue = [&](int tile, int i) {
    if (tile < t_end) {
      const int bslot = i % BSTAGES, slot = i % STAGES;
      const int col0 = tile * BN;
#pragma unroll
      for (int kc = 0; kc < KC; ++kc) {
        const int kk = kc * BK + lc * 8;
        const half_t* src = B + (long long)(col0 + lr) * ldb + kk;
        const unsigned dst = sB + (bslot * KC + kc) * BN * ROWB + dst0;
        if (kk >= K) {  // zeros past K
#pragma unroll
          for (int t = 0; t < BN / RSTEP; ++t) cp_async16(dst + t * RSTEP * ROWB, B, false);
        } else if (col0 + BN <= n) {
#pragma unroll
          for (int t = 0; t < BN / RSTEP; ++t) cp_async16(dst + t * RSTEP * ROWB, src + t * bstep, true);
        } else {
#pragma unroll
          for (int t = 0; t < BN / RSTEP; ++t) {
            const bool ok = col0 + lr + t * RSTEP < n;
            cp_async16(dst + t * RSTEP * ROWB, ok ? src + t * bstep : B, ok);
          }
        }
      }
      float* cv = s_col + slot * NCOLV * BN;
      for (int c = tid; c < BN; c += THREADS) {
        const int gc = col0 + c;
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
    cp_commit();
  };
#pragma unroll 1
  for (int s = 0; s < LOOKAHEAD; ++s) issue(t_begin + s, s);

  // Tile `tile`'s products into accumulator set P: KC·4 wgmma of 64 × 128 × 16 each (units past K
  // are zeros, so the last chunk runs whole; the steps are known at compile time, so that no
  // other instruction touches the accumulators while they are in flight).
  auto multiply = [&](auto set, int bslot) {
    constexpr int P = decltype(set)::value ? 1 : 0;
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
      const unsigned a0 = sA + kc * BM * ROWB + wg * 64 * ROWB, b0 = sB + (bslot * KC + kc) * BN * ROWB;
#pragma unroll
      for (int ks = 0; ks < BK / 16; ++ks)
        mma_k16<BF16>(acc[P], sw128_desc(a0 + ks * 32), sw128_desc(b0 + ks * 32), kc + ks);
    }
    wg_commit();
  };

  // Tile `tile`'s keys, tests and survivors from accumulator set P (screen.cu's epilogue, on
  // a warp's 16 rows and two 64-column halves).
  auto screen_tile = [&](auto set, int tile, int slot) {
    constexpr int P = decltype(set)::value ? 1 : 0;
    const int col0 = tile * BN;
    const float* cv = s_col + slot * NCOLV * BN;
    int dl = 1 << 30;  // the excluded diagonal: local (row − col) offset of this lane's entries, or none
    if (exclude_diag) {
      const long long dd = (long long)col0 + diag - row0;
      if (dd > -BN && dd < BM) dl = (int)dd - (lrow - 2 * tig);
    }
    // TRI: entry (j, v) of half hf sits 64·hf + 8j + (v & 1) − 8·(v >> 1) − tri columns right of
    // the diagonal in the diagonal tile; every entry of another tile passes both tests below.
    const int tri = (TRI && tile == (int)blockIdx.x) ? lrow - 2 * tig : -(1 << 30);
    float rf[2], rthr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rf[h] = s_row[lrow + 8 * h];
      rthr[h] = s_row[PRE ? 3 * BM + lrow + 8 * h : BM + lrow + 8 * h];
    }
    const float rt0 = HAS_RT ? s_row[2 * BM + lrow] : 0.f, rt1 = HAS_RT ? s_row[2 * BM + lrow + 8] : 0.f;
    const int rbase = row0 + lrow;
    // TILEMIN: this lane's smallest key of each of its two rows in the tile (NaN never smaller:
    // fminf returns the other operand; a row of NaN and +inf keys reports +inf).
    float tmin[2] = {__int_as_float(0x7f800000), __int_as_float(0x7f800000)};
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float(&x)[HALF][4] = half_of(acc[P], hf);
      const int cbase = col0 + 64 * hf + 2 * tig;
      bool hit_r = false, hit_c = false;
      unsigned mark = 0;  // MARK: the entries that passed the pre-test (bit 4j + v)
#pragma unroll
      for (int j = 0; j < HALF; ++j) {
        const int c = 64 * hf + j * 8 + 2 * tig;
        const float2 cs = *reinterpret_cast<const float2*>(cv + c);
        const float2 ct = HAS_CT ? *reinterpret_cast<const float2*>(cv + BN + c) : float2{0.f, 0.f};
        const float2 cth = SYM ? *reinterpret_cast<const float2*>(cv + (NCOLV - 1) * BN + c) : float2{0.f, 0.f};
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int h = v >> 1;
          if (PRE) {
            const float z = __fmul_rn(x[j][v], rf[h]);
            x[j][v] = z;
            const float q = HAS_CT ? __fmaf_rn(z, (v & 1) ? cs.y : cs.x, (v & 1) ? ct.y : ct.x)
                                   : __fmul_rn(z, (v & 1) ? cs.y : cs.x);
            if (MARK) {
              if (q <= rthr[h]) mark |= 1u << (j * 4 + v);
            } else {
              hit_r |= q <= rthr[h];
            }
          } else {
            float key = __fmul_rn(__fmul_rn(x[j][v], rf[h]), (v & 1) ? cs.y : cs.x);
            if (HAS_CT) key = __fadd_rn(key, (v & 1) ? ct.y : ct.x);
            if (HAS_RT) key = __fadd_rn(key, h ? rt1 : rt0);
            x[j][v] = key;
            if (!MINIMA) hit_r |= key <= rthr[h];
            if (SYM) hit_c |= key <= ((v & 1) ? cth.y : cth.x);
          }
        }
      }
      if (TILEMIN) {
#pragma unroll
        for (int j = 0; j < HALF; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) tmin[v >> 1] = fminf(tmin[v >> 1], x[j][v]);
        continue;
      }
      if (MINIMA) {
        // Each row's smallest key in this half (strip col0 / 64 + hf: 64 columns; ties to the
        // smaller column; NaN keys, rows and columns past m / n included, are never smaller):
        // a lane's own 16 entries of the row by a tree of depth 4 (their columns increase with
        // the entry, so a tie keeps the left one; NaN counts as +inf), then the four lanes of the
        // row (tig) by shuffles; lane tig == 0 writes. A strip of +inf and NaN keys reports +inf
        // and its first column. As screen.cu's minima, whose strips are also 64 columns.
        const int strip = col0 / 64 + hf;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float kv[2 * HALF];
          int kc[2 * HALF];
#pragma unroll
          for (int j = 0; j < HALF; ++j)
#pragma unroll
            for (int w = 0; w < 2; ++w) {
              const float key = x[j][2 * h + w];
              kv[2 * j + w] = key != key ? __int_as_float(0x7f800000) : key;
              kc[2 * j + w] = cbase + 8 * j + w;
            }
#pragma unroll
          for (int step = 1; step < 2 * HALF; step *= 2)
#pragma unroll
            for (int e = 0; e < 2 * HALF; e += 2 * step)
              if (kv[e + step] < kv[e]) {
                kv[e] = kv[e + step];
                kc[e] = kc[e + step];
              }
          float best = kv[0];
          int bcol = kc[0];
#pragma unroll
          for (int off = 1; off < 4; off *= 2) {
            const float ob = __shfl_xor_sync(FULL, best, off);
            const int oc = __shfl_xor_sync(FULL, bcol, off);
            if (ob < best || (ob == best && oc < bcol)) {
              best = ob;
              bcol = oc;
            }
          }
          const int r = rbase + 8 * h;
          if (tig == 0 && r < m && strip < strips) {
            strip_keys[(long long)r * strips + strip] = best;
            strip_cols[(long long)r * strips + strip] = bcol;
          }
        }
        continue;
      }
      // The exact key of entry e (bit 4j + v) of this half from its z = acc·α·s_a (PRE).
      auto exact_key = [&](float z, int e) {
        const int r = lrow + 8 * ((e >> 1) & 1), c = 64 * hf + 2 * tig + 8 * (e >> 2) + (e & 1);
        float key = __fmul_rn(z, cv[c]);
        if (HAS_CT) key = __fadd_rn(key, cv[BN + c]);
        if (HAS_RT) key = __fadd_rn(key, s_row[2 * BM + r]);
        return key;
      };
      if (__any_sync(FULL, MARK ? mark != 0u : hit_r)) {
        unsigned bits = 0;
        if (MARK) {
          unsigned cand = mark;
          if (dl != (1 << 30)) {  // a tile on the excluded diagonal: not its entry there
#pragma unroll
            for (int j = 0; j < HALF; ++j)
#pragma unroll
              for (int v = 0; v < 4; ++v)
                if (8 * (v >> 1) - (8 * HALF * hf + j * 8) - (v & 1) == dl) cand &= ~(1u << (j * 4 + v));
          }
          while (cand) {
            const int e = __ffs(cand) - 1;
            cand &= cand - 1;
            const int r = lrow + 8 * ((e >> 1) & 1);
            if (exact_key(pick(x, e), e) <= s_row[BM + r]) bits |= 1u << e;
          }
        } else if (PRE) {
          unsigned cand = 0;
#pragma unroll
          for (int j = 0; j < HALF; ++j) {
            const int c = 64 * hf + j * 8 + 2 * tig;
            const float2 cs = *reinterpret_cast<const float2*>(cv + c);
            const float2 ct = HAS_CT ? *reinterpret_cast<const float2*>(cv + BN + c) : float2{0.f, 0.f};
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              const float z = x[j][v];
              const float q = HAS_CT ? __fmaf_rn(z, (v & 1) ? cs.y : cs.x, (v & 1) ? ct.y : ct.x)
                                     : __fmul_rn(z, (v & 1) ? cs.y : cs.x);
              if (q <= rthr[v >> 1] && 8 * (v >> 1) - (8 * HALF * hf + j * 8) - (v & 1) != dl)
                cand |= 1u << (j * 4 + v);
            }
          }
          while (cand) {
            const int e = __ffs(cand) - 1;
            cand &= cand - 1;
            const int r = lrow + 8 * ((e >> 1) & 1);
            if (exact_key(pick(x, e), e) <= s_row[BM + r]) bits |= 1u << e;
          }
        } else {
#pragma unroll
          for (int j = 0; j < HALF; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v)
              if (x[j][v] <= rthr[v >> 1] && 8 * (v >> 1) - (8 * HALF * hf + j * 8) - (v & 1) != dl &&
                  (!TRI || 8 * HALF * hf + 8 * j + (v & 1) - 8 * (v >> 1) >= tri))
                bits |= 1u << (j * 4 + v);
        }
        const Dest d = reserve<0>(__popc(bits), out, s_buf, count0, lane);
        if (GATHER)
          emit<0>(bits, x, d, lrow, cbase, [&](float z, int e) { return exact_key(z, e); },
                  [&](int r) { return s_rowid[r]; });
        else if (PRE)
          emit<0>(bits, x, d, rbase, cbase, [&](float z, int e) { return exact_key(z, e); });
        else
          emit<0>(bits, x, d, rbase, cbase, [](float key, int) { return key; });
      }
      if (SYM && __any_sync(FULL, hit_c)) {
        unsigned bits = 0;
#pragma unroll
        for (int j = 0; j < HALF; ++j) {
          const float2 cth = *reinterpret_cast<const float2*>(cv + (NCOLV - 1) * BN + 64 * hf + j * 8 + 2 * tig);
#pragma unroll
          for (int v = 0; v < 4; ++v)
            if (x[j][v] <= ((v & 1) ? cth.y : cth.x) && 8 * (v >> 1) - (8 * HALF * hf + j * 8) - (v & 1) != dl &&
                (!TRI || 8 * HALF * hf + 8 * j + (v & 1) - 8 * (v >> 1) > tri))
              bits |= 1u << (j * 4 + v);
        }
        const Dest d = reserve<1>(__popc(bits), out, s_buf + NWARPS * 3 * WBUF, count1, lane);
        emit<1>(bits, x, d, rbase, cbase, [](float key, int) { return key; });
      }
    }
    if (TILEMIN) {
      // The row's smallest over the four lanes (tig) that hold its 128 columns; lane tig == 0
      // writes it as the row's key of this tile.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = tmin[h];
        v = fminf(v, __shfl_xor_sync(FULL, v, 1));
        v = fminf(v, __shfl_xor_sync(FULL, v, 2));
        const int r = rbase + 8 * h;
        if (tig == 0 && r < m && tile < strips) strip_keys[(long long)r * strips + tile] = v;
      }
    }
  };

  // One set: step i waits for tile i, multiplies it, starts loading tile i + LOOKAHEAD into the
  // slots of tile i − 1 (its products and epilogue ended before this barrier), waits for the
  // products and screens them.
  auto step_one_set = [&](int i) {
    const int tile = t_begin + i;
    cp_wait<LOOKAHEAD - 1>();
    fence_async_shared();
    __syncthreads();
    multiply(Bool<false>{}, i % BSTAGES);
    issue(tile + LOOKAHEAD, i + LOOKAHEAD);
    wg_wait<0>();
    settle(acc[0]);
    screen_tile(Bool<false>{}, tile, i % STAGES);
  };

  // Two sets: step i of the sweep (tile t_begin + i, accumulator set i & 1): wait for its tile, issue its
  // products, start loading tile i + LOOKAHEAD into the vectors' slot of tile i − 2 (free: its
  // epilogue ended before this barrier, and tile i's products do not read it) and B's slot of
  // tile i − BSTAGES + LOOKAHEAD (at most i − 1: its products ended before it), screen tile
  // i − 1 while the products run, then wait for them. (Waiting for every group but the newest instead, so
  // that the tensor cores never drain between tiles, made ptxas serialise every wgmma: C7514.)
  auto step = [&](auto set, int i) {
    constexpr bool ODD = decltype(set)::value;
    const int tile = t_begin + i;
    cp_wait<LOOKAHEAD - 1>();
    fence_async_shared();
    __syncthreads();
    multiply(set, i % BSTAGES);
    issue(tile + LOOKAHEAD, i + LOOKAHEAD);
    if (i > 0) {
      // Tile i − 1's products completed at the end of the last step; this wait (of every group
      // but the newest, so it costs nothing) tells the assembler so, which would otherwise wait
      // for tile i's products too before the epilogue reads the other set (C7517).
      wg_wait<1>();
      settle(acc[ODD ? 0 : 1]);
      screen_tile(Bool<!ODD>{}, tile - 1, (i + STAGES - 1) % STAGES);
    }
    wg_wait<0>();
    settle(acc[ODD ? 1 : 0]);
  };
  const int count = t_end - t_begin;
  if constexpr (SETS == 1) {
#pragma unroll 1
    for (int i = 0; i < count; ++i) step_one_set(i);
  } else {
#pragma unroll 1
    for (int i = 0; i < count; i += 2) {
      step(Bool<false>{}, i);
      if (i + 1 < count) step(Bool<true>{}, i + 1);
    }
    if ((count - 1) & 1)
      screen_tile(Bool<true>{}, t_end - 1, (count - 1) % STAGES);
    else
      screen_tile(Bool<false>{}, t_end - 1, (count - 1) % STAGES);
  }
  cp_wait<0>();
  };  // sweep
  if constexpr (GATHER) {
#pragma unroll 1
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int t = item_tile[item], pairs = tile_index[t], ends = tile_index[2 * strips + t];
      const int j = item - (ends - (pairs + BM - 1) / BM);  // this item's place among its tile's
      t_begin = t;
      t_end = t + 1;
      g_start = tile_index[strips + t] + j * BM;
      g_count = min(BM, pairs - j * BM);
      __syncthreads();  // the last item's epilogue has read every shared vector and tile
      sweep();
    }
  } else {
    sweep();
  }
  if (count0) flush<0>(out, s_buf, count0, lane);
  if (SYM && count1) flush<1>(out, s_buf + NWARPS * 3 * WBUF, count1, lane);
}

}  // namespace screen_wg

#define SCREEN_WG_CALL(BF16, GATHER_ROWS, ITEM_TILE, TILE_INDEX)                                                    \
  SCREEN_LISTS;                                                                                                    \
  screen_wg::body<BF16>(A, B, m, n, K, lda, ldb, row_factor, col_scale, row_terms, col_terms, row_thr, col_thr,   \
                        term_bound, out, diag, exclude_diag, strip_keys, strip_cols, strips, GATHER_ROWS, ITEM_TILE, \
                        TILE_INDEX)

// One accumulator set: two blocks a multiprocessor (≤ 128 registers a thread).
#define SCREEN_WG_BLOCKS (SCREEN_SETS == 1 ? 2 : 1)

// The parameters are screen.cu's (same launcher).
#if SCREEN_GATHER
// Gathered rows: the parameters are screen.cu's (`strips`: the tiles), then the rows' numbers,
// each work item's tile and the tiles' index of GATHER above.
extern "C" __global__ void __launch_bounds__(screen_wg::THREADS, SCREEN_WG_BLOCKS)
    screen_wg_gather_f16(SCREEN_PARAMS, const int* __restrict__ gather_rows, const int* __restrict__ item_tile,
                         const int* __restrict__ tile_index) {
  SCREEN_WG_CALL(false, gather_rows, item_tile, tile_index);
}
#else
extern "C" __global__ void __launch_bounds__(screen_wg::THREADS, SCREEN_WG_BLOCKS) screen_wg_f16(SCREEN_PARAMS) {
  SCREEN_WG_CALL(false, nullptr, nullptr, nullptr);
}

#if SCREEN_WITH_BF16
extern "C" __global__ void __launch_bounds__(screen_wg::THREADS, SCREEN_WG_BLOCKS) screen_wg_bf16(SCREEN_PARAMS) {
  SCREEN_WG_CALL(true, nullptr, nullptr, nullptr);
}
#endif
#endif
