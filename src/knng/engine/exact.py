"""Exact float64 distances from the input vectors, the order of an exact answer, and its
distances rounded to float32 as their exact values round.

The engine's screen (``engine/screen.py``) and stores (``engine/store/``) decide which pairs
a row's proof needs; the pairs are evaluated here, by differences (``Metric.exact``), and an
answer is ordered by (distance, index).

Rounded as exact. knng returns float32 distances: the exact distance, evaluated in float64 by
differences, rounded to the nearest float32. A float64 evaluation errs by a few float64 steps, in
a direction that depends on the order of its sum, which differs between devices (torch's CPU
sum, the GPU's pair kernel, a BLAS). That matters only where the exact value lies within those
steps of a midpoint between two float32 values, and there it decides which float32 comes out.
Off a lattice that is rare (about d · 2⁻²⁷ of the values); on a lattice it is structural: two
flat image patches of 16 grey levels L/255 lie exactly 4·|Δ| apart, Δ the difference of two
float32 inputs, which can be a float32 midpoint itself (0.47058825194835663, between 0.47058824
and 0.47058827: the CPU's sum gave the first, an H200's pair kernel the second).

:func:`round_as_exact` finds the values of an answer that lie that close to a midpoint and
settles each from its pair's inputs, on the answer's device: the squared differences as exact
float64 products and their errors (Dekker), summed pairwise in double-double arithmetic (about
2⁻¹⁰⁰ relative), which tells the side of the midpoint (or of its square) wherever the sum is not
within that accuracy of it, and everywhere its every step was error-free (then the sum is the
exact one: exact midpoints of grey levels and integer counts are decided there too). The rest —
sums that rounded near the midpoint, and pairs whose differences float64 cannot hold — are
compared exactly on the host, as rationals, in one copy. The value becomes the exact distance's nearest float64, moved one step
off the midpoint toward the exact value where it rounded onto it; an exact midpoint stays one,
and float32 rounding takes it to the even neighbour, as IEEE rounds the exact value. Rows whose
values moved are ordered again by (distance, index). Metrics: the Euclidean family (the
similarity family and the inner product keep their float64 evaluation's rounding).
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np
import torch

from knng._inputs import InputArray
from knng.engine import stages
from knng.engine.kernels import pair_kernel_runs, pair_values
from knng.metrics import Metric

__all__ = ["ExactStats", "exact_pairs", "exact_pairs_of", "sort_by_distance_then_index", "flat_top_by_distance",
           "round_as_exact", "near_midpoints", "ROUNDED_METRICS"]

#: Bytes for gathered float64 vectors in one exact re-rank chunk: on a GPU large launches, on a
#: CPU chunks that stay in cache (640k pairs at d = 64 on 2 cores: 0.10 s in 16 MiB chunks,
#: 0.26 s in 256 MiB ones, which go through memory three times).
EXACT_CHUNK_BYTES = 256 * 2**20
EXACT_CHUNK_BYTES_CPU = 16 * 2**20


@dataclass
class ExactStats:
    """Counters for reports and tests: rows answered and exact evaluations made."""

    rows: int = 0
    exact_evaluations: int = 0

    def add(self, other: "ExactStats") -> None:
        self.rows += other.rows
        self.exact_evaluations += other.exact_evaluations


def sort_by_distance_then_index(dist: torch.Tensor, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest by (distance, index): ties go to the smaller index."""
    order = torch.argsort(idx, dim=1)
    idx = torch.gather(idx, 1, order)
    dist = torch.gather(dist, 1, order)
    dist, order = torch.sort(dist, dim=1, stable=True)
    idx = torch.gather(idx, 1, order)
    return idx[:, :k], dist[:, :k]


def flat_top_by_distance(rows: torch.Tensor, cols: torch.Tensor, dist: torch.Tensor, n: int, k: int,
                         per_row: torch.Tensor | None = None, narrow: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of ``n`` rows' k first pairs by (distance, index) from flat pairs (``rows``,
    ``cols``, ``dist``): (n, k) indices and distances, −1 and +inf past a row's pairs.

    Three stable sorts order everything by (row, distance, index), and a row's first k go to
    their slots by one scatter (the others to a spare slot cut off after: no mask, no
    synchronisation). ``per_row``: each row's pair count where the caller has it; ``narrow``:
    rows and columns fit int32, whose radix sorts take half the passes.
    """
    device = rows.device
    if per_row is None:
        per_row = torch.bincount(rows, minlength=n)
    starts = torch.cumsum(per_row, 0) - per_row
    order = torch.argsort(cols.to(torch.int32) if narrow else cols, stable=True)
    order = order[torch.argsort(dist[order], stable=True)]
    order = order[torch.argsort((rows.to(torch.int32) if narrow else rows)[order], stable=True)]
    rows, cols, dist = rows[order], cols[order], dist[order]
    rank = torch.arange(rows.numel(), device=device) - starts[rows]
    slot = torch.where(rank < k, rows * k + rank, n * k)
    idx = torch.full((n * k + 1,), -1, dtype=torch.int64, device=device).scatter_(0, slot, cols)
    out = torch.full((n * k + 1,), torch.inf, dtype=torch.float64, device=device).scatter_(0, slot, dist)
    return idx[:-1].view(n, k), out[:-1].view(n, k)


def exact_pairs(metric: Metric, raw_rows: torch.Tensor, rows: torch.Tensor, corpus: InputArray,
                cols: torch.Tensor, device: torch.device, chunk_bytes: int | None = None) -> torch.Tensor:
    """Exact float64 distances for the pairs (raw_rows[rows[p]], corpus[cols[p]]).

    ``cols`` may also be (m, w): row ``rows[i]`` against each of ``cols[i]``, an (m, w) result
    (each row vector gathered once). ``chunk_bytes``: gathered float64 vectors per chunk at most
    (default :data:`EXACT_CHUNK_BYTES` or, on a CPU, :data:`EXACT_CHUNK_BYTES_CPU`).
    """
    by_kernel = pair_values(metric, raw_rows, rows, corpus.tensor, cols, device)
    if by_kernel is not None:
        return by_kernel
    return _evaluate(metric, lambda r: raw_rows[r.to(raw_rows.device)].to(device), rows, corpus, cols, device,
                     chunk_bytes)


def exact_pairs_of(metric: Metric, left: InputArray, rows: torch.Tensor, right: InputArray, cols: torch.Tensor,
                   device: torch.device, chunk_bytes: int | None = None) -> torch.Tensor:
    """Exact float64 distances for the pairs (left[rows[p]], right[cols[p]]), both by id; ``cols``
    may be (m, w) and ``chunk_bytes`` bounds the chunks, as in :func:`exact_pairs`."""
    stages.count("finish.exact")
    by_kernel = pair_values(metric, left.tensor, rows, right.tensor, cols, device)
    if by_kernel is not None:
        return by_kernel
    pin = device.type == "cuda"  # rows read from the host come pinned: their copies do not wait
    return _evaluate(metric, lambda r: left.take(r, pin=pin).to(device, non_blocking=True), rows, right, cols,
                     device, chunk_bytes)


def _evaluate(metric: Metric, take_rows: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor,
              right: InputArray, cols: torch.Tensor, device: torch.device, chunk_bytes: int | None = None
              ) -> torch.Tensor:
    """Pairs (``cols`` (p,)) or row batches (``cols`` (m, w)), in chunks of bounded memory;
    ``take_rows(ids)`` gives the left vectors on ``device``."""
    batched = cols.dim() == 2
    width = cols.shape[1] if batched else 1
    out = torch.empty(cols.shape, dtype=torch.float64, device=device)
    budget = EXACT_CHUNK_BYTES_CPU if device.type == "cpu" else EXACT_CHUNK_BYTES
    budget = budget if chunk_bytes is None else min(budget, chunk_bytes)
    step = max(1, budget // (right.d * 8 * (width + 2)))
    # The pair kernel where it runs, as for rows in memory: its sums, in its order, are the
    # answer's whatever the rows were read from (a file's graph is the array's, bit for bit).
    by_kernel = pair_kernel_runs(metric, device)
    for p0 in range(0, rows.numel(), step):
        p1 = min(rows.numel(), p0 + step)
        x = take_rows(rows[p0:p1])
        y = right.take(cols[p0:p1].reshape(-1), pin=device.type == "cuda").to(device, non_blocking=True)
        y = y.view(p1 - p0, width, right.d)
        values = None
        if by_kernel:
            pairs = torch.arange((p1 - p0) * width, device=device)
            values = pair_values(metric, x, torch.arange(p1 - p0, device=device), y.view(-1, right.d),
                                 pairs.view(p1 - p0, width) if batched else pairs, device)
        if values is not None:
            out[p0:p1] = values
        elif batched and metric.name == "inner_product":
            # A batched product sums in an order that depends on the batch's width (BLAS
            # blocking); pair by pair, every pair is summed alike wherever it is evaluated.
            out[p0:p1] = metric.exact(x.repeat_interleave(width, 0), y.reshape(-1, 1, right.d)).view(p1 - p0, width)
        else:
            values = metric.exact(x, y)
            out[p0:p1] = values if batched else values[:, 0]
    return out

#: The metrics whose answers :func:`round_as_exact` rounds as their exact values.
ROUNDED_METRICS = frozenset({"euclidean", "sqeuclidean"})
#: Digits of the decimal square root a Euclidean distance is computed with before it is rounded
#: to float64 (far beyond float64's 17: the float64 is the exact root's nearest but for a
#: double rounding that would need the root within 10⁻⁴⁰ of a float64 midpoint, and the side of
#: the float32 midpoint is decided exactly anyway).
SQRT_DIGITS = 60
#: Float64 values a chunk of the pairs to settle gathers (both sides' vectors).
PAIR_VALUES = 1 << 22
#: Dekker's splitting constant, 2²⁷ + 1, and the magnitude below which splitting cannot overflow.
SPLITTER = 134217729.0
SPLIT_LIMIT = 2.0**995
#: Differences above which a square's rounding error (Dekker's e, 2⁻¹⁰⁶ of it and below) cannot
#: fall under float64's least subnormal.
SQUARE_EXACT_LIMIT = 2.0**-480


#: The tolerance's margin in :func:`near_midpoints`: a sixteenth more than twice the evaluation's
#: bound, which covers the rounding of the interval's float64 ends (at most half an ulp of the
#: value, under a sixteenth of a tolerance of at least 36 ulps).
NEAR_MIDPOINT_MARGIN = 1 + 1 / 16


def near_midpoints(dist: torch.Tensor, d: int) -> torch.Tensor:
    """Where float64 distances ``dist`` lie so near a float32 rounding midpoint that another
    float64 evaluation of the same exact value (a sum of ``d`` squares in another order) may
    round to the other float32: within 2·γ_{d+8}·|value| of it (twice the evaluation's bound).

    Every such distance is flagged, and a few a little farther: the interval around the value,
    widened by :data:`NEAR_MIDPOINT_MARGIN` so that its float64 ends hold the unwidened
    interval, rounds to two float32 values exactly where it holds a midpoint. Seven operations
    (each a launch on a GPU: small calls' host time), where finding each value's midpoint took
    eighteen. Not finite distances compare false (NaN ends)."""
    tolerance = dist.abs() * (4.0 * (d + 8) * 2.0**-53 * NEAR_MIDPOINT_MARGIN)
    return (dist - tolerance).to(torch.float32) < (dist + tolerance).to(torch.float32)


def _float32_midpoints(values: torch.Tensor) -> torch.Tensor:
    """The midpoint between each float64 value's float32 rounding and the float32 on the value's
    other side (exact in float64)."""
    v32 = values.to(torch.float32)
    toward = torch.where(values >= v32.to(torch.float64), torch.full_like(v32, torch.inf),
                         torch.full_like(v32, -torch.inf))
    return (v32.to(torch.float64) + torch.nextafter(v32, toward).to(torch.float64)) / 2


def round_as_exact(metric: Metric, left: InputArray, rows: torch.Tensor | None, right: InputArray,
                   idx: torch.Tensor, dist: torch.Tensor, chunk_entries: int = 1 << 22) -> None:
    """Put an answer's distances on their exact values' sides, in place: ``idx``/``dist`` (m, k)
    of rows ``left[rows]`` (None: ``left``'s first m rows) against ``right`` (−1: none),
    ascending by (distance, index); every
    distance near a float32 midpoint goes to the side of its exact value (see the module's
    docstring) and its row is ordered again. Rows are looked at ``chunk_entries`` entries at a
    time (an answer kept on disk stays there)."""
    if metric.name not in ROUNDED_METRICS or dist.numel() == 0:
        return
    step = max(1, chunk_entries // max(1, dist.shape[1]))
    for r0 in range(0, dist.shape[0], step):
        r1 = min(dist.shape[0], r0 + step)
        _round_rows(metric, left, r0 if rows is None else rows[r0:r1], right, idx[r0:r1], dist[r0:r1])


def _round_rows(metric: Metric, left: InputArray, rows: "torch.Tensor | int", right: InputArray, idx: torch.Tensor,
                dist: torch.Tensor) -> None:
    """:func:`round_as_exact` of one chunk of rows (views of the answer, written in place):
    rows ``left[rows]``, or ``left``'s rows from ``rows`` on where it is a number."""
    near = near_midpoints(dist, left.d) & (idx >= 0)
    if not bool(near.any()):  # the one synchronisation of most chunks
        return
    r, c = torch.nonzero(near, as_tuple=True)
    device = dist.device
    mid = _float32_midpoints(dist[r, c])
    settled = torch.empty_like(mid)
    step = max(1, PAIR_VALUES // max(1, left.d))
    for p0 in range(0, mid.numel(), step):
        p1 = min(mid.numel(), p0 + step)
        chunk_rows = r[p0:p1] + rows if isinstance(rows, int) else rows[r[p0:p1]].to(torch.int64)
        x = left.take(chunk_rows).to(device)
        y = right.take(idx[r[p0:p1], c[p0:p1]]).to(device)
        nearest, side, decided = _settled_double_double(metric.name, x, y, mid[p0:p1])
        undecided = torch.nonzero(~decided).flatten()
        stages.count("finish.midpoints", p1 - p0)
        if undecided.numel():  # differences float64 cannot hold, or sums too near: exactly, on the host
            stages.count("finish.midpoints_by_rationals", int(undecided.numel()))
            # float64 holds every input dtype's values exactly (bfloat16 has no NumPy type); the
            # pairs go to the host together (one copy, not one a pair).
            xs, ys = (v[undecided].to(torch.float64).cpu().numpy() for v in (x, y))
            mids = mid[p0:p1][undecided].cpu().tolist()
            exact = [_settled_exactly(metric.name, xs[i], ys[i], mids[i]) for i in range(len(mids))]
            nearest[undecided] = torch.tensor([e[0] for e in exact], dtype=nearest.dtype).to(device)
            side[undecided] = torch.tensor([float(e[1]) for e in exact], dtype=side.dtype).to(device)
        settled[p0:p1] = _off_midpoint(nearest, mid[p0:p1], side)
    dist[r, c] = settled
    moved = torch.unique(r)
    # Ordered again by (distance, index): by index first, then stably by distance.
    by_index = torch.argsort(torch.where(idx[moved] >= 0, idx[moved], torch.iinfo(torch.int64).max), dim=1,
                             stable=True)
    order = by_index.gather(1, torch.argsort(dist[moved].gather(1, by_index), dim=1, stable=True))
    idx[moved], dist[moved] = idx[moved].gather(1, order), dist[moved].gather(1, order)


def _settled_double_double(name: str, x: torch.Tensor, y: torch.Tensor, mid: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pairs (x[p], y[p]) against the float32 midpoints ``mid`` near their distances, on their
    device, in double-double arithmetic: the squared differences as exact products and errors
    (Dekker), summed pairwise with error-free additions (about 2⁻¹⁰⁰ relative). Returns each
    distance's nearest float64, the side of the midpoint its exact value lies on (−1, 0, +1), and
    whether the pair was decided: not where a difference is no float64, nor where the sum lies
    too near the midpoint for that accuracy to tell its side — unless every step was error-free
    (each addition's error 0, no square's error underflowing), where the sum is exact and its
    side is known, 0 on an exact midpoint."""
    a, b = x.to(torch.float64), y.to(torch.float64)
    diff = a - b
    # The difference is exact where undoing it gives both inputs back; its square is exactly
    # p + e (Dekker) where neither overflows nor e underflows.
    size = diff.abs()
    exact = (((diff + b) == a) & ((a - diff) == b) & (size < SPLIT_LIMIT)).all(dim=1)
    squares_exact = exact & ((size == 0) | (size > SQUARE_EXACT_LIMIT)).all(dim=1)
    hi, lo, sum_exact = _pairwise_sum(*_two_product_t(diff, diff))
    if name == "sqeuclidean":
        t_hi, t_lo = mid, torch.zeros_like(mid)
    else:
        t_hi, t_lo = _two_product_t(mid, mid)
    gap_hi, gap_lo = _two_sum_t(hi, -t_hi)
    low, e1 = _two_sum_t(lo, -t_lo)
    rest, e2 = _two_sum_t(gap_lo, low)
    gap, e3 = _two_sum_t(gap_hi, rest)
    # Every step error-free: the gap is the exact square's distance from the midpoint's, its
    # sign exact even where it is 0 (a distance exactly on the midpoint: flat grey patches).
    all_exact = squares_exact & sum_exact & (e1 == 0) & (e2 == 0) & (e3 == 0) & torch.isfinite(gap)
    bound = (math.log2(max(2, a.shape[1])) + 8) * 2.0**-100 * hi.abs()
    decided = exact & ((gap.abs() > bound) | all_exact) & torch.isfinite(hi)
    nearest = hi + lo if name == "sqeuclidean" else torch.sqrt(hi + lo)
    return nearest, torch.sign(gap), decided


def _off_midpoint(nearest: torch.Tensor, mid: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
    """``nearest`` moved one float64 step off the float32 midpoint ``mid`` toward its exact
    value's ``side`` (+1 above, −1 below) where it is not on that side already; ``mid`` itself
    where the exact value is the midpoint (side 0)."""
    above = torch.nextafter(mid, torch.full_like(mid, torch.inf))
    below = torch.nextafter(mid, torch.full_like(mid, -torch.inf))
    out = torch.where((side > 0) & (nearest <= mid), above, torch.where((side < 0) & (nearest >= mid), below, nearest))
    return torch.where(side == 0, mid, out)


def _two_product_t(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a·b as p + e exactly (Dekker), on tensors."""
    p = a * b
    c = SPLITTER * a
    a_hi = c - (c - a)
    a_lo = a - a_hi
    c = SPLITTER * b
    b_hi = c - (c - b)
    b_lo = b - b_hi
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _two_sum_t(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a + b as s + e exactly (Knuth), on tensors."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _pairwise_sum(hi: torch.Tensor, lo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row sums of the double-doubles (hi, lo) (m, d), halving the columns at each step, and
    whether each row's sum is exact (no addition of its low parts rounded)."""
    exact = torch.ones(hi.shape[0], dtype=torch.bool, device=hi.device)
    while hi.shape[1] > 1:
        if hi.shape[1] % 2:
            hi = torch.nn.functional.pad(hi, (0, 1))
            lo = torch.nn.functional.pad(lo, (0, 1))
        s, err = _two_sum_t(hi[:, 0::2], hi[:, 1::2])
        low, e1 = _two_sum_t(lo[:, 0::2], lo[:, 1::2])
        t, e2 = _two_sum_t(low, err)
        hi, lo = _two_sum_t(s, t)
        exact &= ((e1 == 0) & (e2 == 0)).all(dim=1)
    return hi[:, 0], lo[:, 0], exact


def _settled_exactly(name: str, x: np.ndarray, y: np.ndarray, mid: float) -> tuple[float, int]:
    """One pair (float64 rows) against the float32 midpoint ``mid`` by exact rationals: its
    distance's nearest float64 and the side of ``mid`` its exact value lies on."""
    square = _exact_square(x, y)
    target = Fraction(mid) if name == "sqeuclidean" else Fraction(mid) ** 2
    side = (square > target) - (square < target)
    if name == "sqeuclidean":
        return float(square), side
    with decimal.localcontext() as context:
        context.prec = SQRT_DIGITS
        return float((decimal.Decimal(square.numerator) / decimal.Decimal(square.denominator)).sqrt()), side


def _exact_square(x: np.ndarray, y: np.ndarray) -> Fraction:
    """Σ (x_t − y_t)² exactly for float64 rows: every float is m·2^e with an integer m, so scaled
    by 2^−q (q the least exponent) the values are integers, summed as Python integers."""
    mantissa, exponent = np.frexp(np.concatenate([x, y]))
    whole = (mantissa * 2.0**53).astype(np.int64).tolist()
    exponent = (exponent - 53).tolist()
    q = min((e for m, e in zip(whole, exponent) if m), default=0)
    values = [m << (e - q) if m else 0 for m, e in zip(whole, exponent)]
    d = x.shape[0]
    total = sum((a - b) * (a - b) for a, b in zip(values[:d], values[d:]))
    return Fraction(total) * Fraction(2) ** (2 * q)
