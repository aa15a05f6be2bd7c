"""The Triton kernels of threshold radii (:mod:`knng.engine.kernels.radius`).

Imported only where Triton is installed, by this topic's launchers; module-level functions, because a
``triton.jit`` function finds the jitted helpers it calls among its module's globals. Triton reads
``TRITON_INTERPRET`` when this module is imported.
"""

import triton
import triton.language as tl


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


@triton.jit(do_not_specialize=["p"])  # sizes of the data: see knng.engine.kernels
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
