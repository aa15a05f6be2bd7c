"""The Triton kernels of :mod:`knng.engine.fused` (imported only where Triton is installed).

Module-level functions, because a ``triton.jit`` function finds the jitted helpers it calls
among its module's globals. Triton reads ``TRITON_INTERPRET`` when this module is imported.
"""

import triton
import triton.language as tl


@triton.jit
def _test_sides(acc, valid, rm, rn, row_ok, col_ok, row_thr, col_thr, SYMMETRIC: tl.constexpr):
    """Which entries of a tile to keep: those ≤ their row's threshold (``by_row``) or, in a
    symmetric block, ≤ their column's (``by_col``; the same as ``by_row`` otherwise)."""
    t_row = tl.load(row_thr + rm, mask=row_ok, other=float("-inf"))
    by_row = valid & (acc <= t_row[:, None])
    by_col = by_row
    keep = by_row
    if SYMMETRIC:
        t_col = tl.load(col_thr + rn, mask=col_ok, other=float("-inf"))
        by_col = valid & (acc <= t_col[None, :])
        keep = by_row | by_col
    return keep, by_row, by_col


@triton.jit
def _append(keep, by_row, by_col, acc, rm, rn, out_rows, out_cols, out_keys, out_side, counter, capacity,
            SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Append a tile's kept entries (row, column, key and, symmetric, which side kept it)."""
    found = tl.sum(keep.to(tl.int32))
    if found > 0:
        base = tl.atomic_add(counter, found)
        # Reserve the tile's room with one atomic, then place each kept entry at its rank
        # in the tile (a prefix sum over the flattened tile). Per-row scans along the
        # tile's own axes measured 10–25 % slower in TF32 and int64 slots spilled.
        flat_keep = tl.reshape(keep, (BLOCK_M * BLOCK_N,))
        rank = tl.cumsum(flat_keep.to(tl.int32), axis=0) - 1
        slot = base + rank  # int32: the list holds < 2³¹ entries (see screen_block)
        ok = flat_keep & (slot < capacity) & (slot >= 0)  # >= 0: a wrapped counter writes nothing
        rows2 = tl.reshape(tl.broadcast_to(rm[:, None], (BLOCK_M, BLOCK_N)), (BLOCK_M * BLOCK_N,))
        cols2 = tl.reshape(tl.broadcast_to(rn[None, :], (BLOCK_M, BLOCK_N)), (BLOCK_M * BLOCK_N,))
        tl.store(out_rows + slot, rows2, mask=ok)
        tl.store(out_cols + slot, cols2, mask=ok)
        tl.store(out_keys + slot, tl.reshape(acc, (BLOCK_M * BLOCK_N,)), mask=ok)
        if SYMMETRIC:
            side = by_row.to(tl.int8) + 2 * by_col.to(tl.int8)
            tl.store(out_side + slot, tl.reshape(side, (BLOCK_M * BLOCK_N,)), mask=ok)


@triton.jit
def _append_by_rows(keep, by_row, by_col, acc, rm, rn, out_rows, out_cols, out_keys, out_side, counter, capacity,
                    SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """As :func:`_append`, each entry's slot from two short scans: its rank in its row, after
    the rows above. In the select kernel this ran 1.3–1.5× faster than one scan of the flattened
    tile (H100, 16 × 128 tiles); in the screen kernel's accumulator layout it was slower."""
    k32 = keep.to(tl.int32)
    per_row = tl.sum(k32, axis=1)
    found = tl.sum(per_row, axis=0)
    if found > 0:
        base = tl.atomic_add(counter, found)
        row_start = tl.cumsum(per_row, axis=0) - per_row
        slot = base + row_start[:, None] + tl.cumsum(k32, axis=1) - 1
        ok = keep & (slot < capacity) & (slot >= 0)  # >= 0: a wrapped counter writes nothing
        tl.store(out_rows + slot, tl.broadcast_to(rm[:, None], (BLOCK_M, BLOCK_N)), mask=ok)
        tl.store(out_cols + slot, tl.broadcast_to(rn[None, :], (BLOCK_M, BLOCK_N)), mask=ok)
        tl.store(out_keys + slot, acc, mask=ok)
        if SYMMETRIC:
            tl.store(out_side + slot, by_row.to(tl.int8) + 2 * by_col.to(tl.int8), mask=ok)


@triton.jit
def _append_pairs(keep, owner, other, acc, out_owner, out_other, out_keys, counter, capacity):
    """Append a tile's kept entries as (owner, other, key) to one list, each slot from two short
    scans as in :func:`_append_by_rows`; ``owner`` and ``other`` are the tile's positions,
    broadcast to its shape."""
    k32 = keep.to(tl.int32)
    per_row = tl.sum(k32, axis=1)
    found = tl.sum(per_row, axis=0)
    if found > 0:
        base = tl.atomic_add(counter, found)
        row_start = tl.cumsum(per_row, axis=0) - per_row
        slot = base + row_start[:, None] + tl.cumsum(k32, axis=1) - 1
        ok = keep & (slot < capacity) & (slot >= 0)  # >= 0: a wrapped counter writes nothing
        tl.store(out_owner + slot, owner, mask=ok)
        tl.store(out_other + slot, other, mask=ok)
        tl.store(out_keys + slot, acc, mask=ok)


@triton.jit
def screen_kernel(
    A, B, row_terms, col_terms, row_thr, col_thr,
    out_rows, out_cols, out_keys, out_side, counter,
    m, n, K, stride_a, stride_b, capacity, diag,
    HAS_ROW_TERMS: tl.constexpr, HAS_COL_TERMS: tl.constexpr, SYMMETRIC: tl.constexpr,
    EXCLUDE_DIAG: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    # Grouped tile order: GROUP_M row tiles sweep the columns together, so B's tiles are
    # re-read from L2 rather than from memory.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(m, BLOCK_M)
    tiles_n = tl.cdiv(n, BLOCK_N)
    per_group = GROUP_M * tiles_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm < m
    col_ok = rn < n
    a_ptr = A + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
    b_ptr = B + rn[None, :].to(tl.int64) * stride_b + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr, mask=row_ok[:, None] & (rk[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptr, mask=col_ok[None, :] & (rk[:, None] + k0 < K), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptr += BLOCK_K
        b_ptr += BLOCK_K
    # The terms are added in float32, after the product (the bound's c_term).
    if HAS_COL_TERMS:
        acc += tl.load(col_terms + rn, mask=col_ok, other=0.0)[None, :]
    if HAS_ROW_TERMS:
        acc += tl.load(row_terms + rm, mask=row_ok, other=0.0)[:, None]
    valid = row_ok[:, None] & col_ok[None, :]
    if EXCLUDE_DIAG:
        valid = valid & (rm[:, None] != rn[None, :] + diag)
    keep, by_row, by_col = _test_sides(acc, valid, rm, rn, row_ok, col_ok, row_thr, col_thr, SYMMETRIC)
    _append(keep, by_row, by_col, acc, rm, rn, out_rows, out_cols, out_keys, out_side, counter, capacity,
            SYMMETRIC, BLOCK_M, BLOCK_N)


@triton.jit
def _load_tile(S, stride_s, m, n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # This program's tile of a score block in memory (row-major tiles), with its row and
    # column positions and which of them lie inside the block.
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(n, BLOCK_N)
    rm = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rm < m
    col_ok = rn < n
    valid = row_ok[:, None] & col_ok[None, :]
    acc = tl.load(S + rm[:, None].to(tl.int64) * stride_s + rn[None, :], mask=valid, other=0.0)
    return acc, rm, rn, row_ok, col_ok, valid


@triton.jit
def select_kernel(
    S, stride_s, row_thr, col_thr, out_rows, out_cols, out_keys, out_side, counter, m, n, capacity,
    SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # The same test and compaction as screen_kernel, on a score block already in memory
    # (a cuBLAS product): one read of the block, no mask and no nonzero.
    acc, rm, rn, row_ok, col_ok, valid = _load_tile(S, stride_s, m, n, BLOCK_M, BLOCK_N)
    keep, by_row, by_col = _test_sides(acc, valid, rm, rn, row_ok, col_ok, row_thr, col_thr, SYMMETRIC)
    _append_by_rows(keep, by_row, by_col, acc, rm, rn, out_rows, out_cols, out_keys, out_side, counter, capacity,
                    SYMMETRIC, BLOCK_M, BLOCK_N)


@triton.jit
def select_sides_kernel(
    S, stride_s, row_thr, col_thr, row_owner, row_other, row_keys, col_owner, col_other, col_keys, counters,
    m, n, capacity, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # select_kernel's test of both sides, each side appended to a list of its own (counters[0]
    # and counters[1]): the pairs kept by their row as (row, column), those kept by their
    # column as (column, row). The engine wants the two apart, and splitting one list by its
    # side flags on the host cost six boolean-mask gathers, each a synchronisation, per block.
    acc, rm, rn, row_ok, col_ok, valid = _load_tile(S, stride_s, m, n, BLOCK_M, BLOCK_N)
    _, by_row, by_col = _test_sides(acc, valid, rm, rn, row_ok, col_ok, row_thr, col_thr, True)
    rows = tl.broadcast_to(rm[:, None], (BLOCK_M, BLOCK_N))
    cols = tl.broadcast_to(rn[None, :], (BLOCK_M, BLOCK_N))
    _append_pairs(by_row, rows, cols, acc, row_owner, row_other, row_keys, counters, capacity)
    _append_pairs(by_col, cols, rows, acc, col_owner, col_other, col_keys, counters + 1, capacity)
