"""The Triton kernels of the fused screen (:mod:`knng.engine.kernels.fused`): product tile, threshold
test and compact survivor lists; the selection of a block in memory, the digit screen, the scaled
epilogue and the grouping of (row, tile) pairs.

Imported only where Triton is installed, by this topic's launchers; module-level functions, because a
``triton.jit`` function finds the jitted helpers it calls among its module's globals. Triton reads
``TRITON_INTERPRET`` when this module is imported.

Every screen ends in :func:`_append`: the entries of its tile that one side's test kept go to that
side's compact list (owner, other, key) in global memory.
"""

import triton
import triton.language as tl


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


@triton.jit
def _integer_keys(A, B, row_terms, col_terms, rm, rn, row_ok, col_ok, K, stride_a, stride_b,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A tile's keys of integer rows (knng.engine.screen.integer_scores is the reference): int8
    rows of K values, their product summed in int32 (exact), the key q + r − 2·aᵀb formed in
    int32 (exact: every intermediate is below 2³¹ for K ≤ INTEGER_MAX_D) and rounded to float32
    once."""
    rk = tl.arange(0, BLOCK_K)
    a_ptr = A + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
    b_ptr = B + rn[None, :].to(tl.int64) * stride_b + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr, mask=row_ok[:, None] & (rk[None, :] + k0 < K), other=0)
        b = tl.load(b_ptr, mask=col_ok[None, :] & (rk[:, None] + k0 < K), other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    q = tl.load(row_terms + rm, mask=row_ok, other=0)
    r = tl.load(col_terms + rn, mask=col_ok, other=0)
    return ((q[:, None] + r[None, :]) - 2 * acc).to(tl.float32)


@triton.jit
def integer_kernel(
    A, B, row_terms, col_terms, row_thr, col_thr,
    row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters,
    m, n, K, stride_a, stride_b, capacity, diag,
    SYMMETRIC: tl.constexpr, EXCLUDE_DIAG: tl.constexpr, FEW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # The integer screen: a tile's exact keys (_integer_keys), then the test and the lists of
    # screen_kernel.
    row0, col0, rm, rn, row_ok, col_ok = _tile(m, n, BLOCK_M, BLOCK_N, GROUP_M)
    key = _integer_keys(A, B, row_terms, col_terms, rm, rn, row_ok, col_ok, K, stride_a, stride_b,
                        BLOCK_M, BLOCK_N, BLOCK_K)
    valid = row_ok[:, None] & col_ok[None, :]
    if EXCLUDE_DIAG:
        valid = valid & (rm[:, None] != rn[None, :] + diag)
    _test_and_append(key, valid, row0, col0, rm, rn, row_ok, col_ok, row_thr, col_thr,
                     row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters, capacity,
                     SYMMETRIC, FEW, BLOCK_M, BLOCK_N)


@triton.jit
def integer_block_kernel(A, B, row_terms, col_terms, out, m, n, K, stride_a, stride_b, stride_out,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # integer_kernel's keys written to a score block (a graph part's seed sample): no test, no lists.
    row0, col0, rm, rn, row_ok, col_ok = _tile(m, n, BLOCK_M, BLOCK_N, GROUP_M)
    key = _integer_keys(A, B, row_terms, col_terms, rm, rn, row_ok, col_ok, K, stride_a, stride_b,
                        BLOCK_M, BLOCK_N, BLOCK_K)
    tl.store(out + rm[:, None].to(tl.int64) * stride_out + rn[None, :], key, mask=row_ok[:, None] & col_ok[None, :])


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


@triton.jit(do_not_specialize=["m", "width", "stride"])  # sizes of the data: see knng.engine.kernels
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
