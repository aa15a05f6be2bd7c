"""The thresholds' float64 arithmetic as Triton kernels on a GPU: one launch where torch takes dozens.

Before every corpus tile a search asks each row for τᵢ + E(block), and each tightening asks again
(:meth:`knng.engine.store.CandidateStore.screen_thresholds`, :meth:`~knng.engine.store.PairErrors.block_err`):
the rounding bound of ``Metric.pair_bound`` with the block's largest column norm and term, the
float64 conversion slack and ``Metric.oracle_error``, about 25 elementwise float64 operations on
vectors of one value per row. The tightening decodes and widens each row's first and k-th keys
before that (:meth:`~knng.engine.store.CandidateStore.tighten`), and the seeds take every seed's
own radius and each row's largest bound (:meth:`~knng.engine.store.CandidateStore.seed`). On a
GPU each operation is a launch of a few microseconds of work, and the host's launches, not the
GPU, set the pace: in a search of 10k queries (1M × 128, H100) the two tightenings were 299
launches for 2.5 ms of GPU work. :func:`block_radius`, :func:`tighten_rows` and
:func:`seed_rows` do the same arithmetic in one launch each, and :func:`pair_radius` the radius
of every survivor a store takes in (``PairErrors.radius``: a store update of 2²⁴ survivors of
an image-patch graph ran it as ~25 launches over 16M float64 values, ~2.5 ms of GPU a flush).

Their reference is the torch code of those methods, which every other device runs: the kernels
perform the same IEEE float64 operations in the same order (``triton_radius._row_radius``) and
are launched without fused multiply-adds (``enable_fp_fusion=False``), so their values are the
reference's bit for bit (``tests/engine/test_radius.py`` checks every metric and precision in Triton's
interpreter, and ``tests/engine/test_gpu_fused.py`` on the GPU).
"""

from __future__ import annotations

import torch

from knng._options import kernel_forced
from knng.engine import stages
from knng.engine.kernels.capabilities import ieee_options, interpreting, triton_runs
from knng.metrics import TINY, Metric, ScreenPrecision

__all__ = ["radius_runs", "pair_radius_runs", "block_radius", "pair_radius", "tighten_rows", "seed_rows"]


def _triton():
    """This module's Triton kernels (:mod:`knng.engine.kernels.triton_radius`), imported on first use
    (Triton must be installed)."""
    from knng.engine.kernels import triton_radius

    return triton_radius


#: Rows per program (the interpreter's cost is per program).
BLOCK = 1024
#: The seed kernel's rows per program and seeds per step on a GPU. One program per 1,024 rows,
#: each walking its rows' seeds one at a time (strided loads), kept ten programs busy for 10k
#: queries: 5.1 / 10.1 ms at k = 1,024 / 2,048 (H100, 2026-11-25).
SEED_TILE = (16, 128)


def radius_runs(*tensors: torch.Tensor) -> bool:
    """Whether this module's kernels run on these tensors' device: where the fused screen
    kernel can (a GPU with Triton; in the tests, the interpreter), for float64 vectors (None
    entries, absent terms, are skipped)."""
    first = tensors[0]
    if kernel_forced("radius") is False:
        return False
    return (triton_runs(first.device)
            and all(t.dtype == torch.float64 and t.dim() <= 1 for t in tensors if t is not None))


def _scalar_or_tensor(value: "float | torch.Tensor", m: int) -> tuple[float, torch.Tensor | None, int]:
    """A block maximum as the kernel takes it: a number, or a float64 tensor of one value (0-dim)
    or one per row, with its stride."""
    if not isinstance(value, torch.Tensor):
        return float(value), None, 0
    if value.dim() == 0 or value.numel() == 1:
        return 0.0, value.reshape(1).to(torch.float64), 0
    if value.shape != (m,):
        raise ValueError(f"a block maximum per row must have shape ({m},), got {tuple(value.shape)}")
    return 0.0, value.to(torch.float64).contiguous(), 1


def block_radius(metric: Metric, d: int, precision: ScreenPrecision, centre_norm: float, slack: float,
                 rows: torch.Tensor, tau: torch.Tensor, tau_indexed: bool, row_norms: torch.Tensor,
                 row_terms: torch.Tensor | None, indexed: bool, offsets: torch.Tensor,
                 max_col_norm: "float | torch.Tensor", max_col_term: "float | torch.Tensor", add_tau: bool
                 ) -> torch.Tensor:
    """``PairErrors.block_err`` (plus τ where ``add_tau``) in one launch; float64, one per row.

    ``rows``: store rows; ``tau``: a key per row, the store's own gathered through ``rows``
    (``tau_indexed``) or one per position; ``row_norms`` and ``row_terms`` likewise
    (``indexed``); ``offsets`` are always gathered; ``slack`` is the relative conversion slack of
    the keys and offsets. The maxima are numbers, or tensors of one value or one per row.
    """
    m = rows.numel()
    out = torch.empty(m, dtype=torch.float64, device=tau.device)
    if m == 0:
        return out
    c_dot, c_term, c_flush, gamma, form, col_terms = _coefficients(metric, d, precision)
    has_row_terms = bool(c_term) and row_terms is not None
    col_norm, col_norms, norm_stride = _scalar_or_tensor(max_col_norm, m)
    col_term, col_term_values, term_stride = _scalar_or_tensor(max_col_term, m) if col_terms else (0.0, None, 0)
    rows = rows.contiguous()
    tau, row_norms, offsets = tau.contiguous(), row_norms.contiguous(), offsets.contiguous()
    dummy = tau
    _triton().block_radius_kernel[(-(-m // BLOCK),)](
        tau, rows, row_norms, row_terms.contiguous() if has_row_terms else dummy, offsets,
        col_norms if col_norms is not None else dummy, col_term_values if col_term_values is not None else dummy,
        out, m, c_dot, c_flush, c_term, slack, gamma, centre_norm, TINY, col_norm, col_term,
        norm_stride, term_stride, INDEXED=indexed, TAU_INDEXED=tau_indexed, COL_NORM_TENSOR=col_norms is not None,
        COL_TERM_TENSOR=col_term_values is not None, COL_TERMS=col_terms, ROW_TERMS=has_row_terms, ORACLE=form,
        ADD_TAU=add_tau, BLOCK=BLOCK, **ieee_options())
    return out


def pair_radius_runs(*tensors: "torch.Tensor | None") -> bool:
    """Whether :func:`pair_radius` runs on these norm and term tensors (any shape, float64; None
    entries skipped): where the fused screen kernel can."""
    first = next(t for t in tensors if t is not None)
    if kernel_forced("pair_radius") is False:
        return False
    return triton_runs(first.device) and all(t.dtype == torch.float64 for t in tensors if t is not None)


def pair_radius(metric: Metric, d: int, precision: ScreenPrecision, centre_norm: float, slack: float,
                rows: torch.Tensor, keys: torch.Tensor, offsets: torch.Tensor, row_norms: torch.Tensor,
                col_norms: torch.Tensor, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None,
                cols: torch.Tensor | None = None) -> torch.Tensor:
    """``PairErrors.radius`` of screened ``keys`` in one launch: float64, the shape of ``keys``.

    ``rows``: the pairs' store rows (``offsets`` are gathered through them); the norms and terms
    are the pairs' own, one per key (shapes broadcast to ``keys``), or, with ``cols`` (the pairs'
    global columns), the store's: rows' gathered through ``rows``, columns' through ``cols``.
    Terms count where the metric's bound has a term coefficient and they are given.
    """
    stages.count("radius.pair_kernel")
    shape = keys.shape
    out = torch.empty(shape, dtype=torch.float64, device=keys.device)
    p = keys.numel()
    if p == 0:
        return out
    c_dot, c_term, c_flush, gamma, form, _ = _coefficients(metric, d, precision)
    # Terms the bound does not count are not read (their pointer is the norms').
    row_terms = row_terms if c_term else None
    col_terms = col_terms if c_term else None

    def flat(t: torch.Tensor) -> torch.Tensor:  # one value per key, contiguous
        # contiguous(): a row broadcast along one row's keys ((1, w), strides (1, 0)) flattens
        # to a view of stride 0, which the kernel would read past its one value.
        return t.expand(shape).reshape(-1).contiguous()

    rows = flat(rows)
    if cols is None:  # the pairs' own norms and terms
        row_norms, col_norms = flat(row_norms), flat(col_norms)
        row_terms, col_terms = (None if t is None else flat(t) for t in (row_terms, col_terms))
    row_norms, col_norms = row_norms.contiguous(), col_norms.contiguous()
    _triton().pair_radius_kernel[(-(-p // BLOCK),)](
        rows, rows if cols is None else flat(cols), flat(keys), row_norms, col_norms,
        row_norms if row_terms is None else row_terms.contiguous(),
        col_norms if col_terms is None else col_terms.contiguous(),
        offsets.contiguous(), out.view(-1), p, c_dot, c_flush, c_term, slack, gamma, centre_norm, TINY,
        GATHER=cols is not None, COL_TERMS=col_terms is not None, ROW_TERMS=row_terms is not None, ORACLE=form,
        BLOCK=BLOCK, **ieee_options())
    return out


def _coefficients(metric: Metric, d: int, precision: ScreenPrecision) -> tuple[float, float, float, float, int, bool]:
    """The bound's and the oracle's coefficients, the oracle's form and whether column terms count."""
    c_dot, c_term, c_flush = metric.bound_coefficients(d, precision=precision)
    form, gamma = metric.oracle_form(d)
    return c_dot, c_term, c_flush, gamma, form, bool(c_term) and metric.uses_terms


def tighten_rows(metric: Metric, d: int, precision: ScreenPrecision, centre_norm: float, slack: float,
                 firsts: torch.Tensor, kths: torch.Tensor, counts: torch.Tensor, k: int, tau: torch.Tensor,
                 tightened: torch.Tensor, row_norms: torch.Tensor, row_terms: torch.Tensor | None,
                 offsets: torch.Tensor, max_col_norm: float, max_col_term: float) -> None:
    """``CandidateStore.tighten``'s steps after its selection, in one launch, in place.

    ``firsts``, ``kths``, ``counts``: each store row's smallest and k-th key order code among
    the survivors and how many it has (``row_kth.row_ends``); ``tau``: the store's thresholds
    (updated); ``tightened``: an int64 counter (0-dim) of the rows tightened; row norms, terms
    and offsets: the store's, one per row; the maxima: numbers.
    """
    stages.count("radius.tighten_rows")
    n = tau.numel()
    if n == 0:
        return
    c_dot, c_term, c_flush, gamma, form, col_terms = _coefficients(metric, d, precision)
    has_row_terms = bool(c_term) and row_terms is not None
    # The kernel reads every tensor as one value per row, contiguous (a stride-0 view reads past
    # its value); τ and the counter are written in place, so they must be so already.
    assert tau.is_contiguous() and tightened.is_contiguous(), "tau and tightened are updated in place"
    row_norms, offsets = row_norms.contiguous(), offsets.contiguous()
    _triton().tighten_kernel[(-(-n // BLOCK),)](
        firsts.contiguous(), kths.contiguous(), counts.contiguous(), k, tau, tightened, row_norms,
        row_terms.contiguous() if has_row_terms else row_norms, offsets, n, c_dot, c_flush, c_term, slack, gamma,
        centre_norm, TINY,
        float(max_col_norm), float(max_col_term) if col_terms else 0.0, COL_TERMS=col_terms, ROW_TERMS=has_row_terms,
        ORACLE=form, BLOCK=BLOCK, **ieee_options())


def seed_rows(metric: Metric, d: int, precision: ScreenPrecision, centre_norm: float, slack: float,
              rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, tau: torch.Tensor, row_norms: torch.Tensor,
              row_terms: torch.Tensor | None, offsets: torch.Tensor, col_norms: torch.Tensor,
              col_terms: torch.Tensor | None) -> None:
    """``CandidateStore.seed`` with the store's own radii, in one launch, in place: τ of store
    rows ``rows`` (distinct) ← min(τ, the largest certified upper bound key + radius of the row's
    seeds ``cols``/``keys`` (m, width), −1 columns left out). Norms, terms and offsets are the
    store's (rows by store row, columns by global id)."""
    stages.count("radius.seed_rows")
    m, width = cols.shape
    if m == 0 or width == 0:
        return
    c_dot, c_term, c_flush, gamma, form, _ = _coefficients(metric, d, precision)
    has_col_terms, has_row_terms = bool(c_term) and col_terms is not None, bool(c_term) and row_terms is not None
    rows_per_program, seeds_per_step = (BLOCK, 64) if interpreting() else SEED_TILE
    assert tau.is_contiguous(), "tau is updated in place"
    row_norms, col_norms = row_norms.contiguous(), col_norms.contiguous()
    _triton().seed_kernel[(-(-m // rows_per_program),)](
        rows.contiguous(), cols.contiguous(), keys.contiguous(), m, width, tau, row_norms,
        row_terms.contiguous() if has_row_terms else row_norms, offsets.contiguous(), col_norms,
        col_terms.contiguous() if has_col_terms else col_norms,
        c_dot, c_flush, c_term, slack, gamma, centre_norm, TINY, COL_TERMS=has_col_terms, ROW_TERMS=has_row_terms,
        ORACLE=form, ROWS=rows_per_program, WIDTH=seeds_per_step, **ieee_options())
