"""Per-row candidate stores: what each row's proof needs, kept while the screen runs.

Every row i carries a threshold τᵢ that is provably at least the score of its k-th true
neighbour, and a small store of the candidates whose certified lower bound is ≤ τᵢ. The screen
hands in survivors (pairs whose lower bound passed the row's threshold); the store keeps them
until its capacity is reached, then **tightens**: τᵢ becomes the k-th smallest certified upper
bound among what it holds and everything above τᵢ is dropped. A row whose near-ties still
overflow the capacity (duplicates, flat image regions, integer data) has its candidates
evaluated exactly, from the input vectors, in float64; exact candidates beyond the k-th by
(distance, index) can never come back, so the row fits again. No row is ever re-screened
against the corpus.

The finish takes, for every row, the candidates whose lower bound is ≤ the final τᵢ (a
superset of the true top k: every pair left out had a lower bound above some earlier, larger
τᵢ), evaluates those it cannot order from the screen alone, and sorts by (distance, index).

Units: *keys* are scores in the screen's units (the distance is
``metric.to_distance(key + offset)``); exact entries keep their float64 distance beside the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from knng.metrics import Metric, ScreenPrecision

__all__ = ["PairErrors", "CandidateStore", "StoreStats", "summarize_per_row"]

UNIT_ROUNDOFF_FP64 = 2.0**-53
#: Relative slack for quantities rounded a few times in float64 (key ↔ distance conversions).
CONVERSION_SLACK = 8 * UNIT_ROUNDOFF_FP64
_INT64_MAX = torch.iinfo(torch.int64).max

#: ``evaluate(rows, cols) -> float64 distances`` for store-local rows and global column ids.
Evaluator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class PairErrors:
    """How far a screened key may sit from the float64 exact value of its pair.

    For a screen key s̃ of the pair (row i, column j) the interval ``s̃ ± err`` holds the key
    of the exact distance as knng evaluates it (float64, by differences): the screen's
    rounding bound E of ``docs/EXACTNESS.md`` plus the float64 roundings of the conversion and
    of the exact evaluation itself (``Metric.oracle_error``).
    """

    metric: Metric
    d: int
    precision: ScreenPrecision
    row_norms: torch.Tensor     # float64 (rows,)
    row_terms: torch.Tensor | None
    row_offsets: torch.Tensor   # float64 (rows,): distance = to_distance(key + offset)
    col_norms: torch.Tensor     # float64 (n_cols,), indexed by global column id
    col_terms: torch.Tensor | None
    centre_norm: float

    def err(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Error radius of screened ``keys`` for store rows ``rows`` and global columns ``cols``."""
        a = self.row_norms[rows]
        b = self.col_norms[cols]
        bound = self.metric.pair_bound(self.d, a, b, None if self.row_terms is None else self.row_terms[rows],
                                       None if self.col_terms is None else self.col_terms[cols],
                                       precision=self.precision)
        return self._add_float64(bound, keys.to(torch.float64), self.row_offsets[rows], a, b)

    def block_err(self, rows: torch.Tensor, tau: torch.Tensor, max_col_norm: float,
                  max_col_term: float) -> torch.Tensor:
        """An error radius valid for every column of a block (norms ≤ the block's maxima)."""
        a = self.row_norms[rows]
        b = torch.full_like(a, max_col_norm)
        bound = self.metric.pair_bound(self.d, a, b, None if self.row_terms is None else self.row_terms[rows],
                                       torch.full_like(a, max_col_term) if self.col_terms is not None else None,
                                       precision=self.precision)
        return self._add_float64(bound, tau, self.row_offsets[rows], a, b)

    def _add_float64(self, bound: torch.Tensor, keys: torch.Tensor, offsets: torch.Tensor,
                     a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        finite = torch.where(torch.isfinite(keys), keys, torch.zeros_like(keys))
        value = finite + offsets
        return (bound + CONVERSION_SLACK * (finite.abs() + offsets.abs())
                + self.metric.oracle_error(value, a, b, self.d, self.centre_norm))

    def exact_key(self, rows: torch.Tensor, dist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys of exact distances, and the radius their conversion may have rounded by."""
        value = self.metric.from_distance(dist)
        offsets = self.row_offsets[rows]
        key = value - offsets
        return key, CONVERSION_SLACK * (value.abs() + offsets.abs())


@dataclass
class StoreStats:
    """Counters of one store: survivors taken in, tightenings, exact evaluations."""

    survivors: int = 0
    tightenings: int = 0
    exact_evaluations: int = 0
    overflow_rows: int = 0  # rows whose near-ties overflowed the capacity and were evaluated

    def add(self, other: "StoreStats") -> None:
        self.survivors += other.survivors
        self.tightenings += other.tightenings
        self.exact_evaluations += other.exact_evaluations
        self.overflow_rows += other.overflow_rows


def summarize_per_row(counts: list[torch.Tensor]) -> dict[str, float]:
    """Median, 99th percentile and maximum of per-row counts (e.g. exact evaluations).

    Order statistics by ``kthvalue`` where the counts are (a host quantile sorted 200,000
    rows in 25 ms); the median is the lower one of an even count.
    """
    if not counts:
        return {}
    allc = torch.cat([c.to(torch.float64) for c in counts])
    n = allc.numel()
    if n == 0:
        return {}
    median = allc.kthvalue((n + 1) // 2).values
    p99 = allc.kthvalue(max(1, min(n, math.ceil(0.99 * n)))).values
    top = allc.max()
    values = torch.stack([median, p99, top]).tolist()
    return {"median": values[0], "p99": values[1], "max": values[2]}


class CandidateStore:
    """Candidates of ``n`` rows, at most ``capacity`` each, with a threshold per row.

    Parameters
    ----------
    n, k, capacity : int
        Rows, neighbours wanted, and candidates kept per row (``capacity ≥ k``).
    errors : PairErrors
        The per-pair error model of the screen (rows indexed like the store).
    evaluate : callable
        ``evaluate(rows, cols)``: exact float64 distances of store rows and global columns.
    device : torch.device
    """

    def __init__(self, n: int, k: int, capacity: int, errors: PairErrors, evaluate: Evaluator,
                 device: torch.device) -> None:
        if capacity < k:
            raise ValueError(f"capacity {capacity} < k {k}")
        self.n, self.k, self.capacity = n, k, capacity
        self.errors, self.evaluate, self.device = errors, evaluate, device
        self.keys = torch.full((n, capacity), torch.inf, dtype=torch.float64, device=device)
        self.idx = torch.full((n, capacity), -1, dtype=torch.int64, device=device)
        self.dist = torch.full((n, capacity), torch.nan, dtype=torch.float64, device=device)
        self.count = torch.zeros(n, dtype=torch.int64, device=device)
        self.tau = torch.full((n,), torch.inf, dtype=torch.float64, device=device)
        self.stats = StoreStats()
        # Rows whose store has been evaluated exactly at least once (a report counter).
        self._overflowed = torch.zeros(n, dtype=torch.bool, device=device)
        self._evaluations = torch.zeros(n, dtype=torch.int64, device=device)
        # Pairs the screen handed in per row, before the store's own test (a report counter:
        # how selective the screen's precision was).
        self._screened = torch.zeros(n, dtype=torch.int64, device=device)

    # ------------------------------------------------------------------------------- exchange
    def pack(self) -> torch.Tensor:
        """The whole store as one float64 (n, 3·capacity + 1) array: keys, ids, distances, τ.

        Column ids stay exact in float64 (below 2⁵³). :meth:`from_packs` rebuilds a store from
        several packs of the same rows (a distributed graph gathers a part's stores so).
        """
        return torch.cat([self.keys, self.idx.to(torch.float64), self.dist, self.tau[:, None]], dim=1)

    @classmethod
    def from_packs(cls, packs: list[torch.Tensor], k: int, errors: PairErrors, evaluate: Evaluator,
                   device: torch.device) -> "CandidateStore":
        """One store holding every candidate of several packs of the same rows, τ the smallest.

        Each pack's candidates passed that pack's τ, which is ≥ the merged one, so the merged
        store keeps all a row's proof needs; :meth:`finish` prunes against the merged τ.
        """
        widths = [(p.shape[1] - 1) // 3 for p in packs]
        n = packs[0].shape[0]
        store = cls(n, k, max(k, sum(widths)), errors, evaluate, device)
        keys, idx, dist = [], [], []
        for p, w in zip(packs, widths):
            keys.append(p[:, :w])
            idx.append(p[:, w:2 * w].to(torch.int64))
            dist.append(p[:, 2 * w:3 * w])
            store.tau = torch.minimum(store.tau, p[:, 3 * w])
        store.keys, store.idx, store.dist = torch.cat(keys, 1), torch.cat(idx, 1), torch.cat(dist, 1)
        store.count = (store.idx >= 0).sum(dim=1)
        return store

    # ------------------------------------------------------------------------------ thresholds
    def screen_thresholds(self, rows: torch.Tensor, max_col_norm: float, max_col_term: float) -> torch.Tensor:
        """Per-row thresholds on raw screen keys for a block: keep s̃ ≤ τ + err(block)."""
        tau = self.tau[rows]
        return tau + self.errors.block_err(rows, tau, max_col_norm, max_col_term)

    def seed(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor) -> None:
        """Tighten τ of ``rows`` from k screened candidates each (``cols``/``keys``: (m, k)).

        Any k columns' largest certified upper bound is at least the k-th smallest true key,
        so the seeds need not be kept: the full screen finds them again.
        """
        if cols.shape[1] < self.k:
            return
        hi = keys.to(torch.float64) + self.errors.err(rows[:, None].expand_as(cols), cols, keys)
        hi = torch.where(cols >= 0, hi, torch.inf)
        self.tau[rows] = torch.minimum(self.tau[rows], hi.max(dim=1).values)

    # ------------------------------------------------------------------------------------ add
    def add(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor) -> None:
        """Take in screen survivors: store rows ``rows``, global columns ``cols``, screen ``keys``."""
        if rows.numel() == 0:
            return
        self._screened.index_add_(0, rows, torch.ones_like(rows))
        keys = keys.to(torch.float64)
        lo = keys - self.errors.err(rows, cols, keys)
        keep = lo <= self.tau[rows]
        rows, cols, keys = rows[keep], cols[keep], keys[keep]
        if rows.numel() == 0:
            return
        self.stats.survivors += int(rows.numel())
        order = torch.argsort(rows, stable=True)
        rows, cols, keys = rows[order], cols[order], keys[order]
        targets, per_target = torch.unique_consecutive(rows, return_counts=True)
        starts = torch.cumsum(per_target, 0) - per_target
        rank = torch.arange(rows.numel(), device=rows.device) - torch.repeat_interleave(starts, per_target)
        new_count = self.count[targets] + per_target
        over = new_count > self.capacity
        if bool(over.any()):
            over_rows = targets[over]
            mask = torch.isin(rows, over_rows)
            self._rebuild(over_rows, rows[mask], cols[mask], keys[mask])
            fits = ~mask
            rows, cols, keys, rank = rows[fits], cols[fits], keys[fits], rank[fits]
            targets, per_target = targets[~over], per_target[~over]
        if rows.numel():
            slot = self.count[rows] + rank
            self.keys[rows, slot] = keys
            self.idx[rows, slot] = cols
            self.dist[rows, slot] = torch.nan
            self.count[targets] += per_target

    def _rebuild(self, rows: torch.Tensor, extra_rows: torch.Tensor, extra_cols: torch.Tensor,
                 extra_keys: torch.Tensor) -> None:
        """Tighten rows that would overflow: merge their store with the extra survivors."""
        keys, idx, dist = self._gather_with(rows, extra_rows, extra_cols, extra_keys)
        self.stats.tightenings += int(rows.numel())
        keys, idx, dist, count = self._prune(rows, keys, idx, dist)
        over = count > self.capacity
        if bool(over.any()):
            # Near-ties beyond the capacity: evaluate them and keep the exact top k.
            sub = torch.nonzero(over).flatten()
            self._overflowed[rows[sub]] = True
            self.stats.overflow_rows += int(sub.numel())
            s_keys, s_idx, s_dist = self._evaluate_all(rows[sub], keys[sub], idx[sub], dist[sub])
            s_keys, s_idx, s_dist, _ = self._prune(rows[sub], s_keys, s_idx, s_dist)
            s_idx, s_dist, s_keys = _top_by_distance(s_idx, s_dist, s_keys, self.k)
            width = keys.shape[1]
            keys[sub] = _pad(s_keys, width, torch.inf)
            idx[sub] = _pad(s_idx, width, -1)
            dist[sub] = _pad(s_dist, width, torch.nan)
            count[sub] = (s_idx >= 0).sum(dim=1)
        self.keys[rows] = keys[:, :self.capacity]
        self.idx[rows] = idx[:, :self.capacity]
        self.dist[rows] = dist[:, :self.capacity]
        self.count[rows] = count

    def _gather_with(self, rows: torch.Tensor, extra_rows: torch.Tensor, extra_cols: torch.Tensor,
                     extra_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stored candidates of ``rows`` side by side with extra ones (padded matrices)."""
        m = rows.numel()
        keys, idx, dist = self.keys[rows], self.idx[rows], self.dist[rows]
        if extra_rows.numel() == 0:
            return keys, idx, dist
        # extra_rows is sorted and holds only members of rows (also sorted, unique).
        local = torch.searchsorted(rows, extra_rows)
        per = torch.bincount(local, minlength=m)
        width = int(per.max())
        starts = torch.cumsum(per, 0) - per
        rank = torch.arange(local.numel(), device=local.device) - starts[local]
        e_keys = torch.full((m, width), torch.inf, dtype=torch.float64, device=self.device)
        e_idx = torch.full((m, width), -1, dtype=torch.int64, device=self.device)
        e_keys[local, rank] = extra_keys
        e_idx[local, rank] = extra_cols
        e_dist = torch.full((m, width), torch.nan, dtype=torch.float64, device=self.device)
        return torch.cat([keys, e_keys], 1), torch.cat([idx, e_idx], 1), torch.cat([dist, e_dist], 1)

    def _bounds(self, rows: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, dist: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Certified (lo, hi) of every entry; empty slots get (+inf, +inf)."""
        valid = idx >= 0
        exact = valid & ~torch.isnan(dist)
        row_ids = rows[:, None].expand_as(idx)
        err = self.errors.err(row_ids, idx.clamp_min(0), keys)
        e_key, e_err = self.errors.exact_key(row_ids, torch.where(exact, dist, torch.zeros_like(dist)))
        mid = torch.where(exact, e_key, keys)
        rad = torch.where(exact, e_err, err)
        lo = torch.where(valid, mid - rad, torch.inf)
        hi = torch.where(valid, mid + rad, torch.inf)
        return lo, hi

    def _prune(self, rows: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, dist: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """τ ← min(τ, k-th smallest upper bound); drop what lies above; pack kept entries first."""
        lo, hi = self._bounds(rows, keys, idx, dist)
        if hi.shape[1] >= self.k:
            kth = torch.kthvalue(hi, self.k, dim=1).values
            self.tau[rows] = torch.minimum(self.tau[rows], kth)
        keep = lo <= self.tau[rows][:, None]
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
        keys = torch.where(keep, keys, torch.inf).gather(1, order)
        idx = torch.where(keep, idx, -1).gather(1, order)
        dist = torch.where(keep, dist, torch.nan).gather(1, order)
        return keys, idx, dist, keep.sum(dim=1)

    def _evaluate_all(self, rows: torch.Tensor, keys: torch.Tensor, idx: torch.Tensor, dist: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Evaluate every stored, not yet exact entry of ``rows``; their keys become exact."""
        todo = (idx >= 0) & torch.isnan(dist)
        r, c = torch.nonzero(todo, as_tuple=True)
        if r.numel():
            dist = dist.clone()
            dist[r, c] = self._evaluate(rows[r], idx[r, c])
        return keys, idx, dist

    # --------------------------------------------------------------------------------- finish
    def finish(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact top k of ``rows`` (default all): int64 indices, float64 distances, (m, k)."""
        rows = torch.arange(self.n, device=self.device) if rows is None else rows
        keys, idx, dist = self.keys[rows], self.idx[rows], self.dist[rows]
        lo, hi = self._bounds(rows, keys, idx, dist)
        k = self.k
        tau = torch.minimum(self.tau[rows], torch.kthvalue(hi, k, dim=1).values) if hi.shape[1] >= k else self.tau[rows]
        needed = lo <= tau[:, None]
        # A screened entry whose interval rounds to one float32 distance and meets no other
        # needed entry's interval has a certain value and rank (common after a float64
        # screen); every other needed entry is evaluated exactly.
        metric = self.errors.metric
        offsets = self.errors.row_offsets[rows][:, None]
        mid = (lo + hi) / 2
        order = torch.argsort(torch.where(needed, mid, torch.inf), dim=1, stable=True)
        keys, idx, dist, lo, hi, needed = (t.gather(1, order) for t in (keys, idx, dist, lo, hi, needed))
        low = torch.where(needed, metric.to_distance(lo + offsets), torch.inf)
        high = torch.where(needed, metric.to_distance(hi + offsets), torch.inf)
        exact = ~torch.isnan(dist)
        ambiguous = needed & ~exact & ((low.to(torch.float32) != high.to(torch.float32))
                                       | _overlapping_sorted(low, high))
        r, c = torch.nonzero(ambiguous, as_tuple=True)
        if r.numel():
            dist = dist.clone()
            dist[r, c] = self._evaluate(rows[r], idx[r, c])
        screened = needed & torch.isnan(dist)
        dist = torch.where(screened, metric.to_distance(keys + offsets), dist)
        dist = torch.where(needed, dist, torch.inf)
        idx, dist, _ = _top_by_distance(torch.where(needed, idx, -1), dist, dist, dist.shape[1])
        # A pair offered twice (a block retried after running out of memory part-way through
        # the store's update) has one value, so its copies sit side by side: keep one.
        repeat = torch.zeros_like(idx, dtype=torch.bool)
        repeat[:, 1:] = (idx[:, 1:] == idx[:, :-1]) & (idx[:, 1:] >= 0)
        if bool(repeat.any()):
            idx, dist, _ = _top_by_distance(torch.where(repeat, -1, idx), dist, dist, dist.shape[1])
        return idx[:, :k], dist[:, :k]

    def _evaluate(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        self.stats.exact_evaluations += int(rows.numel())
        self._evaluations.index_add_(0, rows, torch.ones_like(rows))
        return self.evaluate(rows, cols)

    def screened_per_row(self) -> torch.Tensor:
        """Pairs the screen let through for each row (int64, (n,))."""
        return self._screened

    def evaluations_per_row(self) -> torch.Tensor:
        """Exact evaluations each row needed (int64, (n,))."""
        return self._evaluations

    @property
    def rows_evaluated_on_overflow(self) -> int:
        """Rows whose near-ties overflowed the capacity at least once."""
        return int(self._overflowed.sum())


def _top_by_distance(idx: torch.Tensor, dist: torch.Tensor, keys: torch.Tensor, k: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's first k entries by (distance, index); empty entries (index −1) last."""
    sort_idx = torch.where(idx >= 0, idx, _INT64_MAX)
    dist = torch.where(idx >= 0, dist, torch.inf)
    order = torch.argsort(sort_idx, dim=1, stable=True)
    dist, idx, keys, sort_idx = dist.gather(1, order), idx.gather(1, order), keys.gather(1, order), sort_idx.gather(1, order)
    order = torch.argsort(dist, dim=1, stable=True)[:, :k]
    return idx.gather(1, order), dist.gather(1, order), keys.gather(1, order)


def _pad(t: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    if t.shape[1] >= width:
        return t[:, :width]
    pad = torch.full((t.shape[0], width - t.shape[1]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], 1)


def _overlapping_sorted(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Per row, which intervals [low, high] intersect another interval of the same row.

    Rows must be in ascending order of the intervals' centres: interval j meets an earlier one
    iff the running maximum of the earlier ``high`` reaches ``low[j]``, and a later one iff the
    running minimum of the later ``low`` is within ``high[j]``.
    """
    inf = torch.full_like(low[:, :1], torch.inf)
    prev_hi = torch.cat([-inf, torch.cummax(high, dim=1).values[:, :-1]], dim=1)
    next_lo = torch.cat([torch.flip(torch.cummin(torch.flip(low, [1]), dim=1).values, [1])[:, 1:], inf], dim=1)
    return (prev_hi >= low) | (next_lo <= high)
