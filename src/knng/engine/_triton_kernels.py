"""The Triton kernels of :mod:`knng.engine.fused` (imported only where Triton is installed).

Module-level functions, because a ``triton.jit`` function finds the jitted helpers it calls
among its module's globals. Triton reads ``TRITON_INTERPRET`` when this module is imported.

Every kernel ends in :func:`_append`: the entries of its tile that one side's test kept go to
that side's compact list (owner, other, key) in global memory.
"""

import triton
import triton.language as tl

# DATA_SIZES. Triton compiles a kernel again for each new combination of its integer arguments'
# divisibility by 16 (and equality to 1). Sizes that follow the data (pairs held or evaluated, a
# finish's widest row) take new values in every call, so a process could pay a compile, or a
# load from the disk cache, in a call long after its first. Those arguments are not specialised
# (``do_not_specialize``); sizes the plan fixes (parts, blocks, dimensions) still are. H200,
# 2026-11-27, `bench/jit_compiles.py g200k:10:10:fresh` (new points every call, empty caches):
# the seventh call compiled 4 kernels and took 445.5 ms (the others 39.1-40.3); now no call
# after the first compiles (38.9-40.3 ms).


@triton.jit
def _thresholds(row_thr, col_thr, rm, rn, row_ok, col_ok, SYMMETRIC: tl.constexpr):
    """The tile's row thresholds and, in a symmetric block, its column thresholds (else the
    row ones again: unused). Out-of-range rows and columns get −inf, which keeps nothing."""
    t_row = tl.load(row_thr + rm, mask=row_ok, other=float("-inf"))
    if SYMMETRIC:
        t_col = tl.load(col_thr + rn, mask=col_ok, other=float("-inf"))
    else:
        t_col = t_row
    return t_row, t_col


@triton.jit
def _append(keep, acc, row0, col0, out_owner, out_other, out_keys, counter, capacity,
            BY_COLUMN: tl.constexpr, FEW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Append the tile's ``keep`` entries as (row, column, key), or (column, row, key) with
    ``BY_COLUMN``, to one list; the tile's first row and column are ``row0``, ``col0``.

    Most tiles keep nothing once thresholds are tight, and those that keep something mostly
    keep a few. Up to ``FEW`` entries are taken out one at a time (two reductions over the tile
    each, after one atomic reserves their slots); more go through one atomic per kept entry.
    10,000 × 1M × 128 TF32 on an H100 (2026-11-23), against a prefix sum over the flattened
    tile for every tile that keeps something: 15 kept per row 23.6 ms instead of 31.1, 47
    kept 29.6 instead of 48.5 (up to 4 one by one, more by the prefix sum), 206 kept 47.8
    (atomics only) instead of 73.6; nothing kept, 19.9 ms either way. Slots are int32: a list holds fewer than 2³¹ entries (``MAX_LIST``), and
    a slot past the capacity (or a counter that wrapped) writes nothing.
    """
    found = tl.sum(tl.sum(keep.to(tl.int32), axis=1), axis=0)
    if found > 0:
        if found <= FEW:
            base = tl.atomic_add(counter, found)
            flat = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            left = tl.where(keep, flat, BLOCK_M * BLOCK_N)
            for t in range(0, found):
                pos = tl.min(tl.min(left, axis=1), axis=0)
                here = left == pos
                key = tl.sum(tl.sum(tl.where(here, acc, 0.0), axis=1), axis=0)
                row = row0 + pos // BLOCK_N
                col = col0 + pos % BLOCK_N
                slot = base + t
                if (slot < capacity) & (slot >= 0):
                    if BY_COLUMN:
                        tl.store(out_owner + slot, col)
                        tl.store(out_other + slot, row)
                    else:
                        tl.store(out_owner + slot, row)
                        tl.store(out_other + slot, col)
                    tl.store(out_keys + slot, key)
                left = tl.where(here, BLOCK_M * BLOCK_N, left)
        else:
            slot = tl.atomic_add(counter + tl.zeros((BLOCK_M, BLOCK_N), tl.int32),
                                 tl.full((BLOCK_M, BLOCK_N), 1, tl.int32), mask=keep)
            ok = keep & (slot < capacity) & (slot >= 0)
            rows = tl.broadcast_to(row0 + tl.arange(0, BLOCK_M)[:, None], (BLOCK_M, BLOCK_N))
            cols = tl.broadcast_to(col0 + tl.arange(0, BLOCK_N)[None, :], (BLOCK_M, BLOCK_N))
            if BY_COLUMN:
                tl.store(out_owner + slot, cols, mask=ok)
                tl.store(out_other + slot, rows, mask=ok)
            else:
                tl.store(out_owner + slot, rows, mask=ok)
                tl.store(out_other + slot, cols, mask=ok)
            tl.store(out_keys + slot, acc, mask=ok)


@triton.jit
def _test_and_append(acc, valid, row0, col0, rm, rn, row_ok, col_ok, row_thr, col_thr,
                     row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity,
                     SYMMETRIC: tl.constexpr, FEW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Entries ≤ their row's threshold to the first list (counters[0]); in a symmetric block,
    entries ≤ their column's to the second (counters[1]), as (column, row, key)."""
    t_row, t_col = _thresholds(row_thr, col_thr, rm, rn, row_ok, col_ok, SYMMETRIC)
    _append(valid & (acc <= t_row[:, None]), acc, row0, col0, row_owner, row_other, row_keys, counters, capacity,
            False, FEW, BLOCK_M, BLOCK_N)
    if SYMMETRIC:
        _append(valid & (acc <= t_col[None, :]), acc, row0, col0, col_owner, col_other, col_keys, counters + 1,
                capacity, True, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def _tile(m, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile in grouped order (GROUP_M row tiles sweep the columns together, so
    B's tiles are re-read from L2 rather than from memory): its first row and column, its rows
    and columns, and which of them exist."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n, BLOCK_N)
    per_group = GROUP_M * tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    row0 = pid_m * BLOCK_M
    col0 = pid_n * BLOCK_N
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = col0 + tl.arange(0, BLOCK_N)
    return row0, col0, rm, rn, rm < m, rn < n


@triton.jit
def _finish_tile(acc, row0, col0, rm, rn, row_ok, col_ok, row_terms, col_terms, row_thr, col_thr,
                 row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity, diag,
                 HAS_ROW_TERMS: tl.constexpr, HAS_COL_TERMS: tl.constexpr, SYMMETRIC: tl.constexpr,
                 EXCLUDE_DIAG: tl.constexpr, FEW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A product tile's epilogue: the float32 terms added after the product (the bound's c_term),
    the excluded diagonal, then the threshold test and the lists."""
    if HAS_COL_TERMS:
        acc += tl.load(col_terms + rn, mask=col_ok, other=0.0)[None, :]
    if HAS_ROW_TERMS:
        acc += tl.load(row_terms + rm, mask=row_ok, other=0.0)[:, None]
    valid = row_ok[:, None] & col_ok[None, :]
    if EXCLUDE_DIAG:
        valid = valid & (rm[:, None] != rn[None, :] + diag)
    _test_and_append(acc, valid, row0, col0, rm, rn, row_ok, col_ok, row_thr, col_thr,
                     row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity,
                     SYMMETRIC, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def screen_kernel(
    A, B, row_factor, col_scale, row_terms, col_terms, row_thr, col_thr,
    row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters,
    m, n, K, stride_a, stride_b, capacity, diag,
    HAS_ROW_TERMS: tl.constexpr, HAS_COL_TERMS: tl.constexpr, SYMMETRIC: tl.constexpr,
    EXCLUDE_DIAG: tl.constexpr, SCALED: tl.constexpr, PRECISION: tl.constexpr, FEW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    row0, col0, rm, rn, row_ok, col_ok = _tile(m, n, BLOCK_M, BLOCK_N, GROUP_M)
    rk = tl.arange(0, BLOCK_K)
    a_ptr = A + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
    b_ptr = B + rn[None, :].to(tl.int64) * stride_b + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr, mask=row_ok[:, None] & (rk[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptr, mask=col_ok[None, :] & (rk[:, None] + k0 < K), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    if SCALED:
        # Scaled float16 rows (knng.metrics): × α·s_a, then × s_b, as the reference rounds (exact).
        acc = acc * tl.load(row_factor + rm, mask=row_ok, other=0.0)[:, None]
        acc = acc * tl.load(col_scale + rn, mask=col_ok, other=0.0)[None, :]
    _finish_tile(acc, row0, col0, rm, rn, row_ok, col_ok, row_terms, col_terms, row_thr, col_thr,
                 row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity, diag,
                 HAS_ROW_TERMS, HAS_COL_TERMS, SYMMETRIC, EXCLUDE_DIAG, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def select_kernel(
    S, stride_s, row_thr, col_thr, row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters,
    m, n, capacity, SYMMETRIC: tl.constexpr, FEW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # The same test and lists as screen_kernel, on a score block already in memory (a cuBLAS
    # product): one read of the block, no mask and no nonzero.
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(n, BLOCK_N)
    row0 = (pid // tiles_n) * BLOCK_M
    col0 = (pid % tiles_n) * BLOCK_N
    rm = row0 + tl.arange(0, BLOCK_M)
    rn = col0 + tl.arange(0, BLOCK_N)
    row_ok = rm < m
    col_ok = rn < n
    valid = row_ok[:, None] & col_ok[None, :]
    acc = tl.load(S + rm[:, None].to(tl.int64) * stride_s + rn[None, :], mask=valid, other=0.0)
    _test_and_append(acc, valid, row0, col0, rm, rn, row_ok, col_ok, row_thr, col_thr,
                     row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity,
                     SYMMETRIC, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def digit_kernel(
    A, B, row_factor, col_scale, row_terms, col_terms, row_thr, col_thr,
    row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters,
    m, n, W, stride_a, stride_b, capacity, diag,
    HAS_ROW_TERMS: tl.constexpr, HAS_COL_TERMS: tl.constexpr, SYMMETRIC: tl.constexpr,
    EXCLUDE_DIAG: tl.constexpr, FEW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # The digit screen (knng.engine.screen.digit_scores is its reference and contract): rows
    # [h | l | h | s α] of int8 digits, W columns per block; the four integer products go into
    # three int32 accumulators (exact: |sums| < 2³¹ for W ≤ 66,000), then the reference's float32
    # steps, the terms, the test and the lists of screen_kernel.
    row0, col0, rm, rn, row_ok, col_ok = _tile(m, n, BLOCK_M, BLOCK_N, GROUP_M)
    rk = tl.arange(0, BLOCK_K)
    a_ptr = A + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
    b_ptr = B + rn[None, :].to(tl.int64) * stride_b + rk[:, None]
    hh = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    cross = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    ll = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, W, BLOCK_K):
        a_ok = row_ok[:, None] & (rk[None, :] + k0 < W)
        b_ok = col_ok[None, :] & (rk[:, None] + k0 < W)
        h_a = tl.load(a_ptr, mask=a_ok, other=0)
        l_a = tl.load(a_ptr + W, mask=a_ok, other=0)
        h_b = tl.load(b_ptr, mask=b_ok, other=0)
        l_b = tl.load(b_ptr + W, mask=b_ok, other=0)
        hh = tl.dot(h_a, h_b, hh, out_dtype=tl.int32)
        cross = tl.dot(h_a, l_b, cross, out_dtype=tl.int32)
        cross = tl.dot(l_a, h_b, cross, out_dtype=tl.int32)
        ll = tl.dot(l_a, l_b, ll, out_dtype=tl.int32)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    acc = hh.to(tl.float32) * 254.0
    acc = acc + cross.to(tl.float32)
    acc = acc * 254.0
    acc = acc + ll.to(tl.float32)
    acc = acc * tl.load(row_factor + rm, mask=row_ok, other=0.0)[:, None]
    acc = acc * tl.load(col_scale + rn, mask=col_ok, other=0.0)[None, :]
    _finish_tile(acc, row0, col0, rm, rn, row_ok, col_ok, row_terms, col_terms, row_thr, col_thr,
                 row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity, diag,
                 HAS_ROW_TERMS, HAS_COL_TERMS, SYMMETRIC, EXCLUDE_DIAG, FEW, BLOCK_M, BLOCK_N)


# ------------------------------------------------------------------------------- preparation
# The corpus pass and the scaled float16 rows (knng.engine.preparation; references
# knng.engine.common.corpus_stats and Metric.prepare). Values go through float64 exactly as
# the reference's: the shift x − μ rounds once, division by a power of two is exact, and
# float64 → float32 → float16 are the two round-to-nearest-even conversions torch makes.


@triton.jit
def column_sums_kernel(x, partial, nonfinite, m, d, stride, ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """float64 sums of columns over ROWS rows per program (one partial row per program, summed
    by the caller) and a count of non-finite values."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    cols = pid_c * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < d
    acc = tl.zeros((BLOCK_D,), dtype=tl.float64)
    bad = tl.zeros((BLOCK_D,), dtype=tl.int32)
    for r0 in range(0, ROWS, BLOCK_R):
        rows = pid_r * ROWS + r0 + tl.arange(0, BLOCK_R)
        ok = (rows < m)[:, None] & col_ok[None, :]
        v = tl.load(x + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=ok, other=0).to(tl.float64)
        finite = (v == v) & (tl.abs(v) < float("inf"))
        bad += tl.sum((~finite).to(tl.int32), axis=0)
        acc += tl.sum(tl.where(finite, v, 0.0), axis=0)
    tl.store(partial + pid_r * d + cols, acc, mask=col_ok)
    tl.atomic_add(nonfinite + tl.zeros((BLOCK_D,), tl.int32), bad, mask=col_ok & (bad > 0))


@triton.jit
def lattice_extent_kernel(x, low, high, off, err, m, d, stride, unit, ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
                          BLOCK_D: tl.constexpr):
    """Each column's smallest and largest lattice point (in units of ``unit``) over ROWS rows per
    program, and the largest distance of a value from its point, in units and absolutely (one
    partial row or value per program, reduced by the caller), in float64 as
    ``common._LatticeExtent``'s torch reference: a value's point is ⌊x/unit + ½⌋, its nearest
    but at an exact half, where both are half a unit away (and the data off the lattice)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    cols = pid_c * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < d
    lo = tl.full((BLOCK_D,), float("inf"), tl.float64)
    hi = tl.full((BLOCK_D,), float("-inf"), tl.float64)
    worst = tl.zeros((BLOCK_D,), dtype=tl.float64)
    worst_abs = tl.zeros((BLOCK_D,), dtype=tl.float64)
    for r0 in range(0, ROWS, BLOCK_R):
        rows = pid_r * ROWS + r0 + tl.arange(0, BLOCK_R)
        ok = (rows < m)[:, None] & col_ok[None, :]
        v = tl.load(x + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=ok, other=0).to(tl.float64)
        units = v / unit
        points = tl.floor(units + 0.5)
        worst = tl.maximum(worst, tl.max(tl.where(ok, tl.abs(units - points), 0.0), axis=0))
        worst_abs = tl.maximum(worst_abs, tl.max(tl.where(ok, tl.abs(v - points * unit), 0.0), axis=0))
        lo = tl.minimum(lo, tl.min(tl.where(ok, points, float("inf")), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(ok, points, float("-inf")), axis=0))
    tl.store(low + pid_r * d + cols, lo, mask=col_ok)
    tl.store(high + pid_r * d + cols, hi, mask=col_ok)
    tl.store(off + pid_r * tl.num_programs(1) + pid_c, tl.max(worst, axis=0))
    tl.store(err + pid_r * tl.num_programs(1) + pid_c, tl.max(worst_abs, axis=0))


@triton.jit
def row_extent_kernel(x, centre, sumsq, maxabs, m, d, stride, HAS_CENTRE: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    """Per row of x − μ (float64): the sum of squares and the largest |value|."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < m
    ss = tl.zeros((BLOCK_R,), dtype=tl.float64)
    top = tl.zeros((BLOCK_R,), dtype=tl.float64)
    for c0 in range(0, d, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        ok = row_ok[:, None] & (cols < d)[None, :]
        v = tl.load(x + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=ok, other=0).to(tl.float64)
        if HAS_CENTRE:
            v = tl.where(ok, v - tl.load(centre + cols, mask=cols < d, other=0.0)[None, :], 0.0)
        ss += tl.sum(v * v, axis=1)
        top = tl.maximum(top, tl.max(tl.abs(v), axis=1))
    tl.store(sumsq + rows, ss, mask=row_ok)
    tl.store(maxabs + rows, top, mask=row_ok)


@triton.jit
def scaled_rows_kernel(x, centre, scale, out, m, d, width, stride, out_stride, HAS_CENTRE: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[:, :width] = float16((x − μ) / s), zeros past column d: the value block of scaled rows."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < m
    s = tl.load(scale + rows, mask=row_ok, other=1.0)
    for c0 in range(0, width, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        ok = row_ok[:, None] & (cols < d)[None, :]
        v = tl.load(x + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=ok, other=0).to(tl.float64)
        if HAS_CENTRE:
            v = v - tl.load(centre + cols, mask=cols < d, other=0.0)[None, :]
        v = tl.where(ok, v / s[:, None], 0.0)
        tl.store(out + rows[:, None].to(tl.int64) * out_stride + cols[None, :], v.to(tl.float32).to(tl.float16),
                 mask=row_ok[:, None] & (cols < width)[None, :])


@triton.jit
def block_epilogue_kernel(scores, row_factors, col_scales, col_terms, row_terms, m, n, stride,
                          SCALE: tl.constexpr, COL_TERMS: tl.constexpr, ROW_TERMS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """In place on a float32 score block (rows ``stride`` apart): s ← ((s·f_r)·c_c + t_c) + u_r,
    the factor and scale where ``SCALE``, each term where given, every step one IEEE float32
    operation in that order (``screen.block_epilogue``'s torch operations, read and written
    once)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rm < m, rn < n
    ok = row_ok[:, None] & col_ok[None, :]
    at = scores + rm[:, None].to(tl.int64) * stride + rn[None, :]
    v = tl.load(at, mask=ok, other=0.0)
    if SCALE:
        v = v * tl.load(row_factors + rm, mask=row_ok, other=0.0)[:, None]
        v = v * tl.load(col_scales + rn, mask=col_ok, other=0.0)[None, :]
    if COL_TERMS:
        v = v + tl.load(col_terms + rn, mask=col_ok, other=0.0)[None, :]
    if ROW_TERMS:
        v = v + tl.load(row_terms + rm, mask=row_ok, other=0.0)[:, None]
    tl.store(at, v, mask=ok)


# --------------------------------------------------------------------------- exact evaluation
@triton.jit(do_not_specialize=["P"])  # sizes of the data: see DATA_SIZES
def pair_squares_kernel(x, rows, y, cols, out, P, d, stride_x, stride_y, BLOCK_P: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """out[p] = Σ (x[rows[p]] − y[cols[p]])² in float64, by differences (both rows converted to
    float64 exactly first, as ``Metric.exact`` does): the exact evaluation of pairs without the
    gathered float64 copies of their rows."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ok = p < P
    r = tl.load(rows + p, mask=ok, other=0).to(tl.int64)
    c = tl.load(cols + p, mask=ok, other=0).to(tl.int64)
    acc = tl.zeros((BLOCK_P,), dtype=tl.float64)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        m = ok[:, None] & (dims < d)[None, :]
        a = tl.load(x + r[:, None] * stride_x + dims[None, :], mask=m, other=0).to(tl.float64)
        b = tl.load(y + c[:, None] * stride_y + dims[None, :], mask=m, other=0).to(tl.float64)
        diff = a - b
        acc += tl.sum(diff * diff, axis=1)
    tl.store(out + p, acc, mask=ok)


# --------------------------------------------------------------------------- threshold radii
@triton.jit
def _row_radius(a, b, bt, at, t, off, c_dot, c_flush, c_term, slack, gamma, centre_norm, tiny,
                COL_TERMS: tl.constexpr, ROW_TERMS: tl.constexpr, ORACLE: tl.constexpr):
    """The error radius of keys ``t`` of rows with norms ``a`` (terms ``at``) and offsets ``off``
    against columns with norms ``b`` (terms ``bt``): ``PairErrors.block_err``'s float64
    operations one by one, in its order (launched without fused multiply-adds, the values are
    its own, bit for bit). ``ORACLE``: 0 γ·|value|, 1 the constant γ, 2 γ·‖a‖·(‖b‖ + ‖μ‖)
    (``Metric.oracle_error``)."""
    bound = (a * c_dot) * b
    bound = bound + (a + b) * c_flush
    bound = bound + tiny
    if COL_TERMS:
        bound = bound + tl.abs(bt) * c_term
    if ROW_TERMS:
        bound = bound + tl.abs(at) * c_term
    finite = tl.where((t == t) & (tl.abs(t) != float("inf")), t, 0.0)
    value = finite + off
    rad = bound + (tl.abs(finite) + tl.abs(off)) * slack
    if ORACLE == 0:
        rad = rad + tl.abs(value) * gamma
    elif ORACLE == 1:
        rad = rad + gamma
    else:
        rad = rad + (a * gamma) * (b + centre_norm)
    return rad


@triton.jit
def block_radius_kernel(tau, rows, row_norms, row_terms, offsets, col_norms, col_terms, out, m,
                        c_dot: "fp64", c_flush: "fp64", c_term: "fp64", slack: "fp64", gamma: "fp64",
                        centre_norm: "fp64", tiny: "fp64", col_norm: "fp64", col_term: "fp64", col_norm_stride,
                        col_term_stride, INDEXED: tl.constexpr, TAU_INDEXED: tl.constexpr,
                        COL_NORM_TENSOR: tl.constexpr, COL_TERM_TENSOR: tl.constexpr,
                        COL_TERMS: tl.constexpr, ROW_TERMS: tl.constexpr, ORACLE: tl.constexpr,
                        ADD_TAU: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = (τᵢ +) the error radius of row ``rows[i]`` against any column of a block with
    norm ≤ the block's and |term| ≤ the block's (:func:`_row_radius`). The row norms and terms
    are gathered through ``rows`` where ``INDEXED`` (the store's own), else given per position,
    and so is τ (``TAU_INDEXED``); the offsets are always gathered."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < m
    r = tl.load(rows + i, mask=ok, other=0).to(tl.int64)
    where = r if INDEXED else i.to(tl.int64)
    a = tl.load(row_norms + where, mask=ok, other=0.0)
    t = tl.load(tau + (r if TAU_INDEXED else i.to(tl.int64)), mask=ok, other=0.0)
    off = tl.load(offsets + r, mask=ok, other=0.0)
    if COL_NORM_TENSOR:
        b = tl.load(col_norms + i * col_norm_stride, mask=ok, other=0.0)
    else:
        b = tl.zeros((BLOCK,), dtype=tl.float64) + col_norm
    if COL_TERM_TENSOR:
        bt = tl.load(col_terms + i * col_term_stride, mask=ok, other=0.0)
    else:
        bt = tl.zeros((BLOCK,), dtype=tl.float64) + col_term
    if ROW_TERMS:
        at = tl.load(row_terms + where, mask=ok, other=0.0)
    else:
        at = a
    rad = _row_radius(a, b, bt, at, t, off, c_dot, c_flush, c_term, slack, gamma, centre_norm, tiny,
                      COL_TERMS, ROW_TERMS, ORACLE)
    if ADD_TAU:
        rad = t + rad
    tl.store(out + i, rad, mask=ok)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see DATA_SIZES
def pair_radius_kernel(rows, cols, keys, row_norms, col_norms, row_terms, col_terms, offsets, out, p,
                       c_dot: "fp64", c_flush: "fp64", c_term: "fp64", slack: "fp64", gamma: "fp64",
                       centre_norm: "fp64", tiny: "fp64", GATHER: tl.constexpr, COL_TERMS: tl.constexpr,
                       ROW_TERMS: tl.constexpr, ORACLE: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = the error radius of the screened key ``keys[i]`` (float32 or float64) of pair i
    (:func:`_row_radius` with the pair's own norms and terms): given per pair, or, where
    ``GATHER``, the store's gathered through ``rows[i]`` and the global column ``cols[i]``. The
    offsets are always gathered through ``rows``."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0).to(tl.int64)
    if GATHER:
        at_row = r
        at_col = tl.load(cols + i, mask=ok, other=0).to(tl.int64)
    else:
        at_row = i
        at_col = i
    a = tl.load(row_norms + at_row, mask=ok, other=0.0)
    b = tl.load(col_norms + at_col, mask=ok, other=0.0)
    if ROW_TERMS:
        at = tl.load(row_terms + at_row, mask=ok, other=0.0)
    else:
        at = a
    if COL_TERMS:
        bt = tl.load(col_terms + at_col, mask=ok, other=0.0)
    else:
        bt = b
    t = tl.load(keys + i, mask=ok, other=0.0).to(tl.float64)
    off = tl.load(offsets + r, mask=ok, other=0.0)
    rad = _row_radius(a, b, bt, at, t, off, c_dot, c_flush, c_term, slack, gamma, centre_norm, tiny,
                      COL_TERMS, ROW_TERMS, ORACLE)
    tl.store(out + i, rad, mask=ok)


@triton.jit
def _decoded_key(code):
    """The float32 key of an order code of ``row_kth.ordered_code`` (int64 in [0, 2³²)), as float64."""
    bits = tl.where(code < 2147483648, -code - 1, code - 2147483648)
    return bits.to(tl.int32).to(tl.float32, bitcast=True).to(tl.float64)


@triton.jit
def tighten_kernel(firsts, kths, counts, k, tau, tightened, row_norms, row_terms, offsets, n,
                   c_dot: "fp64", c_flush: "fp64", c_term: "fp64", slack: "fp64", gamma: "fp64",
                   centre_norm: "fp64", tiny: "fp64", col_norm: "fp64", col_term: "fp64",
                   COL_TERMS: tl.constexpr, ROW_TERMS: tl.constexpr, ORACLE: tl.constexpr, BLOCK: tl.constexpr):
    """``CandidateStore.tighten`` after its selection, one program per ``BLOCK`` store rows: each
    row's first and k-th key (order codes, ``row_kth.row_ends``), widened by 2⁻²⁰, the radius at
    the end farther from −offset (:func:`_row_radius`), and τ ← min(τ, k-th + radius) where the
    row has k pairs; ``tightened`` counts those rows."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    count = tl.load(counts + i, mask=ok, other=0)
    first = _decoded_key(tl.load(firsts + i, mask=ok, other=2147483648))
    kth = _decoded_key(tl.load(kths + i, mask=ok, other=2147483648))
    first = first - tl.abs(first) * 9.5367431640625e-07
    kth = kth + tl.abs(kth) * 9.5367431640625e-07
    off = tl.load(offsets + i, mask=ok, other=0.0)
    far = tl.where(tl.abs(first + off) > tl.abs(kth + off), first, kth)
    a = tl.load(row_norms + i, mask=ok, other=0.0)
    b = tl.zeros((BLOCK,), dtype=tl.float64) + col_norm
    bt = tl.zeros((BLOCK,), dtype=tl.float64) + col_term
    if ROW_TERMS:
        at = tl.load(row_terms + i, mask=ok, other=0.0)
    else:
        at = a
    rad = _row_radius(a, b, bt, at, far, off, c_dot, c_flush, c_term, slack, gamma, centre_norm, tiny,
                      COL_TERMS, ROW_TERMS, ORACLE)
    full = ok & (count >= k)
    bound = tl.where(full, kth + rad, float("inf"))
    old = tl.load(tau + i, mask=ok, other=0.0)
    tl.store(tau + i, tl.where(bound < old, bound, old), mask=ok)
    tl.atomic_add(tightened, tl.sum(full.to(tl.int64), axis=0))


@triton.jit
def seed_kernel(rows, cols, keys, m, width, tau, row_norms, row_terms, offsets, col_norms, col_terms,
                c_dot: "fp64", c_flush: "fp64", c_term: "fp64", slack: "fp64", gamma: "fp64", centre_norm: "fp64",
                tiny: "fp64", COL_TERMS: tl.constexpr, ROW_TERMS: tl.constexpr, ORACLE: tl.constexpr,
                ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """``CandidateStore.seed`` with the store's own radii, one program per ``ROWS`` rows, their
    seeds ``WIDTH`` at a time: for row ``rows[i]`` the largest key + radius (:func:`_row_radius`,
    the column's own norm and term) among its ``width`` seeds ``cols[i, :]`` (−1: none, which
    leaves the row as it is), and τ ← min(τ, that)."""
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = i < m
    r = tl.load(rows + i, mask=ok, other=0).to(tl.int64)
    a = tl.load(row_norms + r, mask=ok, other=0.0)[:, None]
    off = tl.load(offsets + r, mask=ok, other=0.0)[:, None]
    if ROW_TERMS:
        at = tl.load(row_terms + r, mask=ok, other=0.0)[:, None]
    else:
        at = a
    top = tl.full((ROWS,), float("-inf"), dtype=tl.float64)
    base = i.to(tl.int64)[:, None] * width
    for j0 in range(0, width, WIDTH):
        j = j0 + tl.arange(0, WIDTH)
        here = ok[:, None] & (j < width)[None, :]
        c = tl.load(cols + base + j[None, :], mask=here, other=-1).to(tl.int64)
        key = tl.load(keys + base + j[None, :], mask=here, other=0.0).to(tl.float64)
        safe = tl.where(c >= 0, c, 0)
        b = tl.load(col_norms + safe, mask=here, other=0.0)
        if COL_TERMS:
            bt = tl.load(col_terms + safe, mask=here, other=0.0)
        else:
            bt = b
        rad = _row_radius(a, b, bt, at, key, off, c_dot, c_flush, c_term, slack, gamma, centre_norm, tiny,
                          COL_TERMS, ROW_TERMS, ORACLE)
        # A −1 seed makes the row's bound infinite; positions past the width count for nothing.
        hi = tl.where(here, tl.where(c >= 0, key + rad, float("inf")), float("-inf"))
        top = tl.maximum(top, tl.max(hi, axis=1))
    old = tl.load(tau + r, mask=ok, other=0.0)
    tl.store(tau + r, tl.where(top < old, top, old), mask=ok)


# ------------------------------------------------------------------- order statistics per row
@triton.jit
def _signed_code(keys):
    """float32 keys as int32 codes whose signed order is the keys' (``row_kth.ordered_code`` − 2³¹)."""
    bits = keys.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see DATA_SIZES
def row_count_kernel(rows, p, counts, BLOCK: tl.constexpr):
    """counts[r] += the pairs of row r among ``rows[:p]`` (int32 counters)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0)
    tl.atomic_add(counts + r, tl.full((BLOCK,), 1, tl.int32), mask=ok)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see DATA_SIZES
def row_slots_kernel(rows, p, cursor, slots, BLOCK: tl.constexpr):
    """Each pair's slot within its row: ``cursor`` counts what each row has received (int32
    counters), so a row's slots are 0 … its count − 1 in whatever order the atomics gave."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0)
    slot = tl.atomic_add(cursor + r, tl.full((BLOCK,), 1, tl.int32), mask=ok)
    tl.store(slots + i, slot.to(tl.int64), mask=ok)


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see DATA_SIZES
def group_rows_kernel(rows, keys, p, starts, cursor, out, BLOCK: tl.constexpr):
    """Each pair's key code into its row's segment of ``out`` (row r's segment starts at
    ``starts[r]``; ``cursor`` counts what each row has received, so the order within a row is
    whatever the atomics gave)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < p
    r = tl.load(rows + i, mask=ok, other=0)
    key = tl.load(keys + i, mask=ok, other=0.0)
    slot = tl.atomic_add(cursor + r, tl.full((BLOCK,), 1, tl.int32), mask=ok)
    start = tl.load(starts + r, mask=ok, other=0)
    tl.store(out + start + slot, _signed_code(key), mask=ok)


@triton.jit
def row_kth_kernel(codes, starts, counts, n, k, firsts, kths, none, SKIP: tl.constexpr, CHUNK: tl.constexpr):
    """The smallest and the k-th smallest order code of each row's segment of ``codes`` (int32
    signed codes) with more than ``SKIP`` codes (``row_kth_small_kernel`` takes the others), by a
    radix select over the code's four bytes, most significant first: a 256-bin histogram of the
    byte among the codes that share the bytes chosen so far, and the bin where the running count
    reaches the rank left. Rows with fewer than k codes get ``none``. Programs stride over the
    rows: most rows of a graph's held survivors are short, and skipping them costs a load each
    instead of a program each."""
    for row in range(tl.program_id(0), n, tl.num_programs(0)):
        count = tl.load(counts + row)
        if count > SKIP:
            start = tl.load(starts + row)
            todo = tl.where(count >= k, count, 0)
            bins = tl.arange(0, 256)
            prefix = tl.full([], 0, tl.int64)
            rank = tl.full([], 0, tl.int64) + k
            first = tl.full([], 4294967296, tl.int64)
            for step in tl.static_range(4):
                shift = 24 - 8 * step
                hist = tl.zeros((256,), dtype=tl.int32)
                for c0 in range(0, todo, CHUNK):
                    j = c0 + tl.arange(0, CHUNK)
                    ok = j < todo
                    u = tl.load(codes + start + j, mask=ok, other=0).to(tl.int64) + 2147483648
                    if step == 0:
                        first = tl.minimum(first, tl.min(tl.where(ok, u, 4294967296), axis=0))
                    match = ok & ((u >> (shift + 8)) == (prefix >> (shift + 8)))
                    digit = tl.where(match, (u >> shift) & 255, 0).to(tl.int32)
                    # Codes that do not match were counted in bin 0: take them out again.
                    missed = CHUNK - tl.sum(match.to(tl.int32), axis=0)
                    hist += tl.histogram(digit, 256) - tl.where(bins == 0, missed, 0)
                below = tl.cumsum(hist, 0)
                chosen = tl.sum((below < rank).to(tl.int32), axis=0)
                rank -= tl.sum(tl.where(bins < chosen, hist, 0), axis=0).to(tl.int64)
                prefix += chosen.to(tl.int64) << shift
            full = count >= k
            tl.store(firsts + row, tl.where(full, first, none))
            tl.store(kths + row, tl.where(full, prefix, none))


@triton.jit
def row_kth_bisect_kernel(codes, starts, counts, n, k, firsts, kths, none, SKIP: tl.constexpr,
                          WIDTH: tl.constexpr):
    """``row_kth_kernel`` for the rows of more than ``SKIP`` and at most ``WIDTH`` codes, one row a
    program: its segment whole in registers, the k-th by bisection over the codes (the smallest
    code c with at least k codes ≤ c: 32 halvings of [smallest − 1, largest], as
    ``kth_of_rows_kernel``). One pass over the segment instead of the radix select's four.
    Rows with fewer than k codes get ``none``; other rows are left to the other kernels."""
    row = tl.program_id(0)
    count = tl.load(counts + row)
    if (count > SKIP) & (count <= WIDTH):
        start = tl.load(starts + row)
        j = tl.arange(0, WIDTH)
        ok = j < count
        code = tl.load(codes + start + j, mask=ok, other=0).to(tl.int64)
        lo = tl.min(tl.where(ok, code, 2147483647), axis=0)
        first = lo
        lo = lo - 1  # fewer than k codes ≤ lo (none); at least k ≤ hi (all, where count ≥ k)
        hi = tl.max(tl.where(ok, code, -2147483648), axis=0)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            enough = tl.sum((ok & (code <= mid)).to(tl.int32), axis=0) >= k
            hi = tl.where(enough, mid, hi)
            lo = tl.where(enough, lo, mid)
        full = count >= k
        tl.store(firsts + row, tl.where(full, first + 2147483648, none))
        tl.store(kths + row, tl.where(full, hi + 2147483648, none))


@triton.jit
def row_kth_small_kernel(codes, starts, counts, n, k, firsts, kths, none, ROWS: tl.constexpr,
                         WIDTH: tl.constexpr):
    """``row_kth_kernel`` for the rows of at most ``WIDTH`` codes, ``ROWS`` rows a program: each
    row's segment padded to WIDTH and sorted in registers; the smallest and the k-th are read
    off. Rows with more codes are left to ``row_kth_kernel``."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    count = tl.load(counts + r, mask=r < n, other=WIDTH + 1)
    small = (r < n) & (count <= WIDTH)
    start = tl.load(starts + r, mask=small, other=0)
    j = tl.arange(0, WIDTH)
    ok = small[:, None] & (j[None, :] < count[:, None])
    u = tl.load(codes + start[:, None] + j[None, :], mask=ok, other=0).to(tl.int64) + 2147483648
    u = tl.sort(tl.where(ok, u, 4294967296), dim=1)
    first = tl.min(u, axis=1)
    kth = tl.sum(tl.where(j[None, :] == k - 1, u, 0), axis=1)  # none where k > WIDTH: no row is full
    full = count >= k
    tl.store(firsts + r, tl.where(full, first, none), mask=small)
    tl.store(kths + r, tl.where(full, kth, none), mask=small)


@triton.jit
def row_kth_rounds_kernel(codes, starts, counts, n, firsts, kths, none, K: tl.constexpr, ROWS: tl.constexpr,
                          SKIP: tl.constexpr, WIDTH: tl.constexpr):
    """``row_kth_small_kernel`` for a small rank K (a constant) and the rows of more than SKIP
    (which that kernel takes) and at most WIDTH codes: each row's segment in registers,
    ``ROWS`` rows a program, and K − 1 rounds that take one occurrence of the smallest out (its
    first position gets the int32 maximum, at least every code); the smallest left is then the
    k-th. No sort: at K = 10 a graph's rows of ~80 held pairs went through the radix select,
    1.8 ms of a 200k-point graph's first tightening. Rows with more codes are left to
    ``row_kth_kernel``."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    count = tl.load(counts + r, mask=r < n, other=WIDTH + 1)
    small = (r < n) & (count > SKIP) & (count <= WIDTH)
    start = tl.load(starts + r, mask=small, other=0)
    j = tl.arange(0, WIDTH)
    ok = small[:, None] & (j[None, :] < count[:, None])
    top = 2147483647
    x = tl.where(ok, tl.load(codes + start[:, None] + j[None, :], mask=ok, other=0), top)
    first = tl.min(x, axis=1)
    for _ in tl.static_range(K - 1):
        at = tl.argmin(x, axis=1, tie_break_left=True)
        x = tl.where(j[None, :] == at[:, None], top, x)
    kth = tl.min(x, axis=1)
    full = count >= K
    tl.store(firsts + r, tl.where(full, first.to(tl.int64) + 2147483648, none), mask=small)
    tl.store(kths + r, tl.where(full, kth.to(tl.int64) + 2147483648, none), mask=small)


@triton.jit(do_not_specialize=["width", "k"])  # sizes of the data: see DATA_SIZES
def row_order_kernel(idx, dist, width, k, order, W: tl.constexpr, J: tl.constexpr):
    """Row ``program_id``'s first k positions by (distance, index, position) among its ``width``
    entries (row-major (rows, width) ``idx``/``dist``; index −1 marks an empty entry, ordered
    after every other as if its distance were +inf and its index the largest; NaN distances
    after +inf): each entry's rank is the number of entries before it, so ``order[row, rank] =
    position`` for the ranks below k. The key is a strict total order, so the ranks are a
    permutation and every slot below min(k, width) is written."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, W)
    ok_i = i < width
    xi = tl.load(idx + row * width + i, mask=ok_i, other=-1)
    di = tl.load(dist + row * width + i, mask=ok_i, other=0.0)
    ni = (di != di) & (xi >= 0)  # NaN
    di = tl.where((xi >= 0) & (di == di), di, float("inf"))
    xi = tl.where(xi >= 0, xi, 9223372036854775807)
    rank = tl.zeros((W,), dtype=tl.int32)
    for j0 in range(0, width, J):
        j = j0 + tl.arange(0, J)
        ok_j = j < width
        xj = tl.load(idx + row * width + j, mask=ok_j, other=-1)
        dj = tl.load(dist + row * width + j, mask=ok_j, other=0.0)
        nj = (dj != dj) & (xj >= 0)
        dj = tl.where((xj >= 0) & (dj == dj), dj, float("inf"))
        xj = tl.where(xj >= 0, xj, 9223372036854775807)
        same_d = (nj[None, :] == ni[:, None]) & (dj[None, :] == di[:, None])
        tie = (xj[None, :] < xi[:, None]) | ((xj[None, :] == xi[:, None]) & (j[None, :] < i[:, None]))
        before = (nj[None, :] < ni[:, None]) | ((nj[None, :] == ni[:, None]) & (dj[None, :] < di[:, None]))
        before = (before | (same_d & tie)) & ok_j[None, :]
        rank += tl.sum(before.to(tl.int32), axis=1)
    tl.store(order + row * k + rank, i.to(tl.int64), mask=ok_i & (rank < k))


@triton.jit(do_not_specialize=["width", "head"])  # sizes of the data: see DATA_SIZES
def row_head_kernel(idx, dist, width, head, codes, order, W: tl.constexpr):
    """Row ``program_id``'s first ``head`` positions in a stable sort of its float32 keys, and
    their keys' :func:`_signed_code` (row-major (rows, width) ``idx``/``dist``; index −1 marks
    an empty entry, keyed +inf): ``torch.sort(key32, stable=True)``'s first ``head`` of
    ``row_order._sorted_order``. Each key is rounded to float32 (to nearest), −0 taken as +0 so
    that equal codes are equal keys, and packed above its position into one int64 whose order
    is (key, position): one sort in registers, no ties left for it to break."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, W)
    ok = i < width
    x = tl.load(idx + row * width + i, mask=ok, other=-1)
    d = tl.load(dist + row * width + i, mask=ok, other=0.0)
    key = tl.where(x >= 0, d, float("inf")).to(tl.float32)
    key = tl.where(key == 0.0, 0.0, key)
    packed = (_signed_code(key).to(tl.int64) << 32) | i.to(tl.int64)
    packed = tl.sort(tl.where(ok, packed, 9223372036854775807))
    keep = i < head
    tl.store(order + row * head + i, packed & 0xFFFFFFFF, mask=keep)
    tl.store(codes + row * head + i, (packed >> 32).to(tl.int32), mask=keep)


# ------------------------------------------------------------------ unfolding duplicate groups
@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _unfold_list(jj, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku, HAS_OWN: tl.constexpr):
    """Candidate list ``jj`` of a row (``duplicates._CandidateLists``): with HAS_OWN list 0 is the
    row's own group ``own_g`` at its ``own_dist`` and list j ≥ 1 column j − 1 of row ``source``
    of ``idx``/``dist``; else list j is column j. Its group (−1: none) and distance (+inf)."""
    col = jj
    if HAS_OWN:
        col = jj - 1
    ok = (col >= 0) & (col < ku)
    grp = tl.load(idx + source * stride_idx + col, mask=ok, other=-1)
    dd = tl.load(dist + source * stride_dist + col, mask=ok, other=float("inf"))
    if HAS_OWN:
        grp = tl.where(jj == 0, own_g, grp)
        dd = tl.where(jj == 0, tl.load(own_dist + own_g), dd)
    return grp, dd


@triton.jit
def unfold_rows_kernel(own_group, idx, dist, own_dist, sizes, starts, members, reps, position, out_idx, out_dist,
                       unordered, k, ku, stride_idx, stride_dist, HAS_OWN: tl.constexpr, DROP_SELF: tl.constexpr,
                       BL: tl.constexpr, BK: tl.constexpr):
    """Row ``program_id``'s first k candidates with its lists laid end to end, as
    ``duplicates._unfold_by_slots``: each list's length cut to the members that can rank below k
    (k − the members of the lists at smaller distances), its start the lengths before it, slot s
    member s − start of the list whose span holds it, the row itself skipped in its own list
    (DROP_SELF, its place from ``position``). BL ≥ the lists, BK ≥ k. ``unordered[row]`` = 1
    where consecutive lists at one distance interleave by index (the caller sorts that row
    instead); −1 and +inf past the row's candidates."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BL)
    own_g = row * 0
    source = row
    if HAS_OWN:
        own_g = tl.load(own_group + row)
        source = own_g
    grp, dd = _unfold_list(j, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku, HAS_OWN)
    present = grp >= 0
    grp = tl.where(present, grp, 0)
    size = tl.load(sizes + grp, mask=present, other=0)
    place = tl.full([], -1, tl.int64)
    if DROP_SELF:
        size = tl.where(j == 0, size - 1, size)
        place = tl.load(position + row) - tl.load(starts + own_g)
    _, dd_before = _unfold_list(j - 1, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku, HAS_OWN)
    run = (j == 0) | (dd != dd_before)
    ahead = tl.associative_scan(tl.where(run, tl.cumsum(size, 0) - size, 0), 0, _larger)
    length = tl.minimum(size, tl.maximum(k - ahead, 0))
    ends = tl.cumsum(length, 0)
    start = ends - length
    # Slots: each list with members before slot k marks its first slot with its number (in the
    # row's own output, as scratch), and a running maximum over the slots gives each slot its
    # list and that list's first slot.
    s = tl.arange(0, BK)
    in_row = s < k
    tl.store(out_idx + row * k + s, -1, mask=in_row)
    tl.debug_barrier()
    tl.store(out_idx + row * k + start, j.to(tl.int64), mask=(length > 0) & (start < k))
    tl.debug_barrier()
    mark = tl.load(out_idx + row * k + s, mask=in_row, other=-1)
    tl.debug_barrier()
    which = tl.associative_scan(mark, 0, _larger)
    offset = s - tl.associative_scan(tl.where(mark >= 0, s, 0), 0, _larger)
    filled = in_row & (s < tl.sum(length, axis=0))
    slot_group, slot_dist = _unfold_list(which, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku,
                                         HAS_OWN)
    if DROP_SELF:
        offset += ((which == 0) & (offset >= place)).to(tl.int64)
    slot_group = tl.where(filled, slot_group, 0)
    member = tl.load(members + tl.load(starts + slot_group, mask=filled, other=0) + offset, mask=filled, other=-1)
    tl.store(out_idx + row * k + s, member, mask=in_row)
    tl.store(out_dist + row * k + s, tl.where(filled, slot_dist, float("inf")), mask=in_row)
    # Order: list j against list j + 1.
    grp_next, dd_next = _unfold_list(j + 1, source, own_g, idx, dist, own_dist, stride_idx, stride_dist, ku,
                                     HAS_OWN)
    next_present = grp_next >= 0
    first_next = tl.load(reps + tl.where(next_present, grp_next, 0), mask=next_present, other=0)
    last_offset = length - 1
    if DROP_SELF:
        last_offset += ((j == 0) & (last_offset >= place)).to(tl.int64)
    has = length > 0
    last = tl.load(members + tl.load(starts + grp, mask=has, other=0) + last_offset, mask=has, other=-1)
    wrong = has & next_present & (start < k) & (dd == dd_next) & (last > first_next)
    tl.store(unordered + row, tl.max(wrong.to(tl.int32), axis=0))


@triton.jit
def smallest_of_rows_kernel(keys, cols, out_values, out_cols, m, width, stride, K: tl.constexpr,
                            ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """Each row's K smallest of its ``width`` float32 keys (ROWS rows a program, a row whole in
    registers: WIDTH ≥ width, a power of two), ascending by (key, position), and the ``cols``
    entries at their positions: K rounds of an argmin over the keys' signed codes
    (:func:`_signed_code`: −0 just below +0), whose ties go to the smaller position; a taken
    position's code becomes the int32 maximum, at least every key's, so that no position is
    taken twice. NaN keys are not expected (the strip minima report none)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    at = tl.arange(0, WIDTH)
    row_ok = rows < m
    ok = row_ok[:, None] & (at < width)[None, :]
    base = rows.to(tl.int64) * stride
    taken = 2147483647
    code = tl.where(ok, _signed_code(tl.load(keys + base[:, None] + at[None, :], mask=ok, other=0.0)), taken)
    for j in tl.static_range(K):
        pos = tl.argmin(code, axis=1, tie_break_left=True)
        tl.store(out_values + rows * K + j, tl.load(keys + base + pos, mask=row_ok), mask=row_ok)
        tl.store(out_cols + rows * K + j, tl.load(cols + base + pos, mask=row_ok), mask=row_ok)
        code = tl.where(at[None, :] == pos[:, None], taken, code)


@triton.jit(do_not_specialize=["m", "width", "stride", "k"])  # sizes of the data: see DATA_SIZES
def kth_of_rows_kernel(keys, m, width, stride, k, firsts, kths, counts, no_code, ROWS: tl.constexpr,
                       WIDTH: tl.constexpr):
    """Each row's smallest and k-th smallest of its ``width`` float32 keys (no NaN) as
    ``row_kth.ordered_code`` values, and ``width`` as its count (ROWS rows a program, a row
    whole in registers: WIDTH ≥ width, a power of two). The k-th by bisection over the keys'
    signed codes (:func:`_signed_code`): the smallest code c with at least k codes ≤ c, 32
    halvings of [smallest − 1, largest]. Rows of fewer than k keys get ``no_code`` for both."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    at = tl.arange(0, WIDTH)
    row_ok = rows < m
    ok = row_ok[:, None] & (at < width)[None, :]
    base = rows.to(tl.int64) * stride
    # int32 codes, the padding at the largest (above every key's: +inf's is 0x7F800000), so that
    # each halving compares and counts 32-bit words only; the range's ends and middle are int64
    # per row (their difference may pass 2³¹) and the middle fits int32 (first − 1 ≥ −inf's code − 1).
    code = tl.where(ok, _signed_code(tl.load(keys + base[:, None] + at[None, :], mask=ok, other=0.0)), 2147483647)
    lo = tl.min(code, axis=1).to(tl.int64)
    first = lo
    lo = lo - 1  # fewer than k codes ≤ lo (none); at least k ≤ hi (all of them, where width ≥ k)
    hi = tl.max(tl.where(ok, code, -2147483648), axis=1).to(tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        enough = tl.sum((code <= mid.to(tl.int32)[:, None]).to(tl.int32), axis=1) >= k
        hi = tl.where(enough, mid, hi)
        lo = tl.where(enough, lo, mid)
    full = width >= k
    tl.store(firsts + rows, tl.where(full, first + 2147483648, no_code), mask=row_ok)
    tl.store(kths + rows, tl.where(full, hi + 2147483648, no_code), mask=row_ok)
    tl.store(counts + rows, tl.zeros((ROWS,), tl.int64) + width, mask=row_ok)


@triton.jit(do_not_specialize=["m", "width", "stride"])  # sizes of the data: see DATA_SIZES
def tile_pairs_kernel(keys, thr, m, width, stride, counts, cursor, rows_out, SCATTER: tl.constexpr,
                      ROWS: tl.constexpr, TILES: tl.constexpr):
    """The (row, tile) pairs with ``keys[row, tile] <= thr[row]`` (NaN passes nothing), grouped by
    tile, over a block of ROWS × TILES: without SCATTER each tile's pairs are added to ``counts``;
    with it each pair's row goes to ``rows_out`` at its tile's ``cursor`` (which starts at the
    tile's first slot and is advanced by one atomic a tile and program; rows of one tile are in
    no particular order)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    t = tl.program_id(1) * TILES + tl.arange(0, TILES)
    r_ok = r < m
    t_ok = t < width
    ok = r_ok[:, None] & t_ok[None, :]
    key = tl.load(keys + r.to(tl.int64)[:, None] * stride + t[None, :], mask=ok, other=float("inf"))
    th = tl.load(thr + r, mask=r_ok, other=float("-inf"))
    passed = (ok & (key <= th[:, None])).to(tl.int32)
    per_tile = tl.sum(passed, axis=0)
    if SCATTER:
        base = tl.atomic_add(cursor + t, per_tile, mask=t_ok & (per_tile > 0))
        slot = base[None, :] + tl.cumsum(passed, axis=0) - passed
        tl.store(rows_out + slot, tl.broadcast_to(r[:, None], (ROWS, TILES)), mask=passed != 0)
    else:
        tl.atomic_add(counts + t, per_tile, mask=t_ok & (per_tile > 0))
