"""From screened candidates to the exact answer: certificate, exact re-rank, fall-back.

The screen gives each row its ``kc`` smallest float32 scores s̃ (kc = k + margin). With the
per-pair rounding-error bound E from :mod:`knng.metrics`:

* τ_i, the k-th smallest upper bound s̃ + E among a row's candidates, is at least the true
  k-th smallest score;
* a candidate whose lower bound s̃ − E exceeds τ_i cannot be in the top k, so only the others
  are re-ranked, exactly, in float64, from the input vectors;
* every column the screen did not keep has s̃ ≥ T_i (the largest kept score); if the metric's
  lower bound for such columns exceeds τ_i, the row is **certified**: its exact re-rank is
  provably the exact answer.

Rows that fail the certificate (dense near-ties, duplicates, far-away queries) are settled by the
fall-back. After a float32 screen they are first screened again, alone, in float64 (the same
blocked pipeline, 2²⁹ times tighter bounds); rows that fail even that — more exact ties than the
margin holds — take the complete method: a float64 screen of the row against the whole corpus
in two passes, every column whose float64 lower bound is ≤ the float64 τ re-ranked exactly. That
set is complete by the same argument, so every row ends exact; the fall-back costs only what
those rows need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from typing import TYPE_CHECKING, Callable

from knng._inputs import InputArray
from knng.metrics import UNIT_ROUNDOFF_FP32, Metric

if TYPE_CHECKING:
    from knng.engine.common import PreparedCorpus

__all__ = ["Candidates", "finish_rows", "ExactStats", "exact_pairs", "exact_pairs_of", "sort_by_distance_then_index"]

UNIT_ROUNDOFF_FP64 = 2.0**-53
#: Bytes for gathered float64 vectors in one exact re-rank chunk.
EXACT_CHUNK_BYTES = 256 * 2**20


@dataclass
class Candidates:
    """Screened candidates for a chunk of rows.

    Attributes
    ----------
    values : torch.Tensor
        float32 (m, kc) screened scores (any order within a row).
    indices : torch.Tensor
        int64 (m, kc) corpus indices of the candidates.
    row_norms : torch.Tensor
        float64 (m,) norms of the rows' prepared vectors.
    row_terms : torch.Tensor or None
        float64 (m,) the rows' own score terms (graphs of the Euclidean family), or None.
    row_offsets : torch.Tensor
        float64 (m,) what turns a row's score into its distance (see ``Prepared.offsets``).
    floor : torch.Tensor or None
        float64 (m,): every screened score not kept is ≥ this (see ``select_block``); None
        when selection was exact, so the largest kept score is the bound.
    """

    values: torch.Tensor
    indices: torch.Tensor
    row_norms: torch.Tensor
    row_terms: torch.Tensor | None
    row_offsets: torch.Tensor
    floor: torch.Tensor | None = None


@dataclass
class ExactStats:
    """Counters for reports and tests: rows, rows that needed the fall-back, exact evaluations."""

    rows: int = 0
    fallback_rows: int = 0  # rows that failed the screen's certificate
    exact_evaluations: int = 0
    complete_rows: int = 0  # rows settled by the complete two-pass float64 fall-back

    def add(self, other: "ExactStats") -> None:
        self.rows += other.rows
        self.fallback_rows += other.fallback_rows
        self.exact_evaluations += other.exact_evaluations
        self.complete_rows += other.complete_rows


def sort_by_distance_then_index(dist: torch.Tensor, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest by (distance, index): ties go to the smaller index."""
    order = torch.argsort(idx, dim=1)
    idx = torch.gather(idx, 1, order)
    dist = torch.gather(dist, 1, order)
    dist, order = torch.sort(dist, dim=1, stable=True)
    idx = torch.gather(idx, 1, order)
    return idx[:, :k], dist[:, :k]


def _exact_for(metric: Metric, x: torch.Tensor, corpus: InputArray, idx: torch.Tensor,
               device: torch.device) -> torch.Tensor:
    """Exact float64 distances between rows ``x`` (m, d) and corpus rows ``idx`` (m, c)."""
    m, c = idx.shape
    out = torch.empty((m, c), dtype=torch.float64, device=device)
    per_row = max(1, c * corpus.d * 8 * 2)
    step = max(1, EXACT_CHUNK_BYTES // per_row)
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        y = corpus.take(idx[r0:r1]).to(device, non_blocking=True)
        out[r0:r1] = metric.exact(x[r0:r1].to(device), y)
    return out


def finish_rows(
    cands: Candidates,
    row_ids: torch.Tensor,
    raw_rows: torch.Tensor,
    pcorpus: "PreparedCorpus",
    metric: Metric,
    k: int,
    available: int,
    exclude_self: bool,
    device: torch.device,
    refine: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, "ExactStats"]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, ExactStats]:
    """Certify, re-rank exactly and (for failing rows) fall back; returns exact top-k.

    Parameters
    ----------
    cands : Candidates
        The screen's candidates for ``m`` rows (float32 or float64 screen).
    row_ids : torch.Tensor
        int64 (m,) global ids of the rows (used to exclude a point from its own graph row).
    raw_rows : torch.Tensor
        (m, d) the rows' input vectors, any supported dtype.
    pcorpus : PreparedCorpus
        The corpus: the user's input (exact distances come from it), per-vector norms and
        terms of its prepared form, the largest norm and the centre.
    available : int
        How many corpus vectors a row may choose from (n, or n − 1 without self).
    refine : callable, optional
        ``refine(raw_rows, row_ids) -> (indices, distances, stats)`` for rows that fail the
        certificate: after a float32 screen, a float64 screen of just those rows. Without it
        (after a float64 screen) failing rows take the complete two-pass :func:`fallback`.

    Returns
    -------
    indices : torch.Tensor
        int64 (m, k).
    distances : torch.Tensor
        float64 (m, k), exact.
    stats : ExactStats

    Notes
    -----
    A candidate's distance is taken from the screen when the screen is precise enough to
    pin it down: its error interval must round to a single float32 and must not overlap a
    neighbour's interval (so its rank is certain too). That is the usual case for a float64
    screen. All other needed candidates — every one of them after a float32 screen, and
    duplicates or exact ties after a float64 one — are evaluated from the input vectors by
    differences, so exact ties stay exact and break by index.
    """
    corpus = pcorpus.corpus
    d = corpus.d
    m, kc = cands.values.shape
    u = UNIT_ROUNDOFF_FP64 if cands.values.dtype == torch.float64 else UNIT_ROUNDOFF_FP32
    stats = ExactStats(rows=m)
    # One sort by screened score; everything after works in that order.
    valid = (cands.indices >= 0) & torch.isfinite(cands.values)
    vals64, order = torch.sort(torch.where(valid, cands.values.to(torch.float64), torch.inf), dim=1)
    idx = torch.gather(cands.indices, 1, order)
    valid = torch.gather(valid, 1, order)
    safe_idx = idx.clamp_min(0)
    col_norms = pcorpus.norms[safe_idx]
    bound = metric.pair_bound(
        d, cands.row_norms[:, None], col_norms,
        None if cands.row_terms is None else cands.row_terms[:, None],
        None if pcorpus.terms is None else pcorpus.terms[safe_idx],
        unit_roundoff=u,
    )
    # τ: the k best-screened candidates all score at most max(s̃ + E) over them, so at least k
    # true scores are ≤ τ (a sound, marginally larger stand-in for the k-th smallest s̃ + E).
    tau = (vals64[:, :k] + bound[:, :k]).max(dim=1).values
    needed = valid & (vals64 - bound <= tau[:, None])

    if kc >= available:
        certified = torch.ones(m, dtype=torch.bool, device=device)
    else:
        threshold = torch.where(valid, vals64, -torch.inf).max(dim=1).values
        if cands.floor is not None:
            threshold = torch.minimum(threshold, cands.floor)
        unselected = metric.unselected_lower_bound(d, threshold, cands.row_norms, cands.row_terms,
                                                   pcorpus.max_norm, unit_roundoff=u)
        certified = unselected > tau

    # Distances from the screen, with intervals that hold the real value and any float64
    # evaluation of it.
    offsets = cands.row_offsets[:, None]
    approx = vals64 + offsets
    err = (bound + 2.0 * UNIT_ROUNDOFF_FP64 * (vals64.abs() + offsets.abs())
           + metric.oracle_error(approx, cands.row_norms[:, None], col_norms, d, pcorpus.centre_norm))
    low = torch.where(needed, metric.to_distance(approx - err), torch.inf)
    high = torch.where(needed, metric.to_distance(approx + err), torch.inf)
    dist = torch.where(needed, metric.to_distance(approx), torch.inf)
    ambiguous = needed & ((low.to(torch.float32) != high.to(torch.float32)) | _overlapping_sorted(low, high))
    rows, cols = torch.nonzero(ambiguous, as_tuple=True)
    stats.exact_evaluations += int(rows.numel())
    out_idx, out_dist = idx[:, :k].clone(), dist[:, :k].clone()
    if rows.numel():
        dist[rows, cols] = exact_pairs(metric, raw_rows, rows, corpus, idx[rows, cols], device)
        # Only rows with recomputed entries can change order (their intervals overlap only
        # each other's); every other row is already sorted by distinct values.
        touched = torch.unique(rows)
        out_idx[touched], out_dist[touched] = sort_by_distance_then_index(dist[touched], idx[touched], k)

    failing = torch.nonzero(~certified).flatten()
    if failing.numel():
        stats.fallback_rows += int(failing.numel())
        failing_raw = raw_rows[failing.to(raw_rows.device)]
        if refine is not None:
            f_idx, f_dist, f_stats = refine(failing_raw, row_ids[failing])
            stats.exact_evaluations += f_stats.exact_evaluations
            stats.complete_rows += f_stats.fallback_rows
        else:
            stats.complete_rows += int(failing.numel())
            f_idx, f_dist, f_evals = fallback(failing_raw, row_ids[failing], corpus, metric, k, pcorpus.centre,
                                              exclude_self, device)
            stats.exact_evaluations += f_evals
        out_idx[failing] = f_idx
        out_dist[failing] = f_dist
    return out_idx, out_dist, stats


def _overlapping_sorted(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Per row, which intervals [low, high] intersect another of the same row.

    The rows must be in ascending order of the intervals' centres (any order works for the
    test itself: interval j meets an earlier one iff the running maximum of the earlier
    ``high`` reaches ``low[j]``, and a later one iff the running minimum of the later ``low``
    is within ``high[j]``).
    """
    inf = torch.full_like(low[:, :1], torch.inf)
    prev_hi = torch.cat([-inf, torch.cummax(high, dim=1).values[:, :-1]], dim=1)
    next_lo = torch.cat([torch.flip(torch.cummin(torch.flip(low, [1]), dim=1).values, [1])[:, 1:], inf], dim=1)
    return (prev_hi >= low) | (next_lo <= high)


def exact_pairs(metric: Metric, raw_rows: torch.Tensor, rows: torch.Tensor, corpus: InputArray,
                cols: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Exact float64 distances for the pairs (raw_rows[rows[p]], corpus[cols[p]])."""
    out = torch.empty(rows.numel(), dtype=torch.float64, device=device)
    step = max(1, EXACT_CHUNK_BYTES // (corpus.d * 8 * 3))
    for p0 in range(0, rows.numel(), step):
        p1 = min(rows.numel(), p0 + step)
        x = raw_rows[rows[p0:p1].to(raw_rows.device)].to(device)
        y = corpus.take(cols[p0:p1]).to(device, non_blocking=True)
        out[p0:p1] = metric.exact(x, y[:, None, :])[:, 0]
    return out


def exact_pairs_of(metric: Metric, left: InputArray, rows: torch.Tensor, right: InputArray, cols: torch.Tensor,
                   device: torch.device) -> torch.Tensor:
    """Exact float64 distances for the pairs (left[rows[p]], right[cols[p]]), both by id."""
    out = torch.empty(rows.numel(), dtype=torch.float64, device=device)
    step = max(1, EXACT_CHUNK_BYTES // (left.d * 8 * 3))
    for p0 in range(0, rows.numel(), step):
        p1 = min(rows.numel(), p0 + step)
        x = left.take(rows[p0:p1]).to(device, non_blocking=True)
        y = right.take(cols[p0:p1]).to(device, non_blocking=True)
        out[p0:p1] = metric.exact(x, y[:, None, :])[:, 0]
    return out


def fallback(
    raw_rows: torch.Tensor,
    row_ids: torch.Tensor,
    corpus: InputArray,
    metric: Metric,
    k: int,
    centre: torch.Tensor | None,
    exclude_self: bool,
    device: torch.device,
    block_cols: int = 16384,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Exact top-k for a few rows: a float64 screen over the whole corpus and a complete set.

    Two passes over the corpus: the first finds τ (the k-th smallest float64 upper bound), the
    second collects every column whose float64 lower bound is ≤ τ; those are re-ranked exactly.
    """
    d = corpus.d
    f = raw_rows.shape[0]
    x = raw_rows.to(device)
    rows = metric.prepare(x, centre, side="query", symmetric=False, dtype=torch.float64)
    self_ids = row_ids.to(device)

    def blocks():
        for start in range(0, corpus.n, block_cols):
            stop = min(corpus.n, start + block_cols)
            prep = metric.prepare(corpus.rows(start, stop).to(device), centre, side="corpus",
                                  symmetric=False, dtype=torch.float64)
            scores = rows.vectors @ prep.vectors.T
            bound = metric.pair_bound(d, rows.norms[:, None], prep.norms[None, :], None,
                                      None if prep.terms is None else prep.terms[None, :],
                                      unit_roundoff=UNIT_ROUNDOFF_FP64)
            cols = torch.arange(start, stop, device=device)
            if exclude_self:
                own = self_ids[:, None] == cols[None, :]
            else:
                own = torch.zeros_like(scores, dtype=torch.bool)
            yield cols, scores, bound, own

    # Pass 1: τ = k-th smallest upper bound per row.
    best: torch.Tensor | None = None
    for _cols, scores, bound, own in blocks():
        upper = torch.where(own, torch.inf, scores + bound)
        kk = min(k, upper.shape[1])
        part = torch.topk(upper, kk, dim=1, largest=False).values
        best = part if best is None else torch.topk(torch.cat([best, part], 1), min(k, best.shape[1] + kk),
                                                    dim=1, largest=False).values
    tau = best.max(dim=1).values

    # Pass 2: every column that could be in the top k.
    pair_rows, pair_cols = [], []
    for cols, scores, bound, own in blocks():
        keep = (scores - bound <= tau[:, None]) & ~own
        r, c = torch.nonzero(keep, as_tuple=True)
        pair_rows.append(r)
        pair_cols.append(cols[c])
    pr = torch.cat(pair_rows)
    pc = torch.cat(pair_cols)

    # Pad the ragged candidate sets into a matrix and re-rank exactly.
    counts = torch.bincount(pr, minlength=f)
    width = int(counts.max())
    order = torch.argsort(pr, stable=True)
    pr, pc = pr[order], pc[order]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(pr.numel(), device=device) - starts[pr]
    cand = torch.full((f, width), -1, dtype=torch.int64, device=device)
    cand[pr, slot] = pc
    valid = cand >= 0
    exact = _exact_for(metric, x, corpus, cand.clamp_min(0), device)
    exact = torch.where(valid, exact, torch.inf)
    idx, dist = sort_by_distance_then_index(exact, cand, k)
    return idx, dist, int(pr.numel())
