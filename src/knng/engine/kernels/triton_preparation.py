"""The Triton kernels of the corpus pass and the scaled float16 rows
(:mod:`knng.engine.kernels.preparation`).

Imported only where Triton is installed, by this topic's launchers; module-level functions, because a
``triton.jit`` function finds the jitted helpers it calls among its module's globals. Triton reads
``TRITON_INTERPRET`` when this module is imported.

Values go through float64 exactly as the reference's: the shift x − μ rounds once, division by a
power of two is exact, and float64 → float32 → float16 are the two round-to-nearest-even
conversions torch makes.
"""

import triton
import triton.language as tl


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
    ``common.LatticeExtent``'s torch reference: a value's point is ⌊x/unit + ½⌋, its nearest
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
def integer_rows_kernel(x, centre, out, squares, bad, m, d, width, stride, out_stride, BLOCK_R: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """out[:, :width] = int8(x − c) (zeros past column d) and squares = Σ(x − c)² per row (int32,
    exact: at most d·2¹⁴), for integer inputs and an integer centre ``c`` (int32); ``bad`` counts
    the centred values outside int8's range (none are stored right then: the caller refuses)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < m
    ss = tl.zeros((BLOCK_R,), dtype=tl.int32)
    wrong = tl.zeros((BLOCK_R,), dtype=tl.int32)
    for c0 in range(0, width, BLOCK_D):
        cols = c0 + tl.arange(0, BLOCK_D)
        ok = row_ok[:, None] & (cols < d)[None, :]
        v = tl.load(x + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=ok, other=0).to(tl.int32)
        v = tl.where(ok, v - tl.load(centre + cols, mask=cols < d, other=0)[None, :], 0)
        wrong += tl.sum(((v < -128) | (v > 127)).to(tl.int32), axis=1)
        v = tl.minimum(tl.maximum(v, -128), 127)
        ss += tl.sum(v * v, axis=1)
        tl.store(out + rows[:, None].to(tl.int64) * out_stride + cols[None, :], v.to(tl.int8),
                 mask=row_ok[:, None] & (cols < width)[None, :])
    tl.store(squares + rows, ss, mask=row_ok)
    tl.atomic_add(bad + tl.zeros((BLOCK_R,), tl.int32), wrong, mask=row_ok & (wrong > 0))
