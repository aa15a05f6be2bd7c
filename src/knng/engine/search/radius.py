"""Exact radius queries: every corpus vector within a radius of each query.

A radius query is a screen whose per-row threshold is fixed by the radius instead of found: every
pair whose score could be within it is evaluated exactly, and kept where its exact distance is.
Flow, a chunk of query rows against a block of corpus columns at a time (:class:`RadiusPlan`):

1. the rows centred on the mean of a sample of the corpus, in the product's type (float32 for
   float32, float16 and bfloat16 inputs, float64 otherwise), as the direct path of small calls
   centres them (:func:`~knng.engine.search.direct.direct_neighbours`): the rounding bound grows with
   the norms;
2. the scores ``s = ‖c‖² − 2 q·c`` of the block in one product, and each pair's candidacy
   ``s ≤ r² − ‖q‖² + E``, with ``E`` the product's rounding bound for the row against the block's
   largest norm (:func:`~knng.engine.search.direct.direct_rounding_bound`): no pair within the radius is
   left out;
3. the candidates' exact float64 distances (the engine's own evaluation, by differences), kept
   where at most the radius; each row's neighbours ordered by (distance, index) on request.

Euclidean and squared Euclidean distances (the expansion's bound is theirs), and cosine on float64
unit vectors (:data:`UNIT_VECTOR_SLACK`). The pairs found are
held on the device until the end; beyond :attr:`RadiusPlan.max_pairs` (a share of the budget) the
query stops with an error that says how many were found: a radius that takes most of the corpus
for every query is a dense graph, better asked as one (``knng.graph`` with a k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from knng._inputs import InputArray, check_finite
from knng.engine import stages
from knng.engine.common import full_precision, on_device
from knng.engine.exact import ExactStats, exact_pairs_of
from knng.engine.plan import RadiusPlan
from knng.engine.search.direct import DIRECT_CENTRE_SAMPLE, direct_rounding_bound, product_dtype
from knng.metrics import Metric

__all__ = ["RADIUS_METRICS", "RadiusReport", "exact_radius", "radius_product_dtype"]

#: Metrics radius queries serve: their score is the expansion ‖c‖² − 2 q·c, whose rounding the
#: bound covers (cosine's on unit vectors: its distance is half their squared distance).
RADIUS_METRICS = frozenset({"euclidean", "sqeuclidean", "cosine"})
#: Cosine's screen takes the rows as float64 unit vectors, each within about (d + 2)·u₆₄ of the
#: exact one; their squared distance then moves by at most 4·(δ_q + δ_c) + (δ_q + δ_c)² (both
#: unit vectors, at most 2 apart). This many times (d + 4)·u₆₄ covers that, generously: the
#: screen only leaves out pairs surely beyond the radius, the exact evaluation decides.
UNIT_VECTOR_SLACK = 16



def radius_product_dtype(queries: InputArray, corpus: InputArray, metric: Metric) -> torch.dtype:
    """The type a radius query screens in: the direct path's (:func:`~knng.engine.search.direct.product_dtype`),
    float64 under cosine (its unit vectors are normalised in float64)."""
    return torch.float64 if metric.name == "cosine" else product_dtype(queries, corpus)


@dataclass
class RadiusReport:
    """What a radius query did: its plan, the pairs screened and evaluated exactly, the pairs
    found, and the pipeline's stage counts (``stages``, filled in by the API)."""

    plan: RadiusPlan
    exact: ExactStats
    pairs_screened: int = 0
    pairs_found: int = 0
    stages: dict[str, int] | None = None


@stages.recorded
def exact_radius(queries: InputArray, corpus: InputArray, radii: torch.Tensor, metric: Metric,
                 device: torch.device, plan: RadiusPlan, *, sort_results: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RadiusReport]:
    """Every corpus vector within ``radii[i]`` (distance units, float64, one per query) of query i.

    Returns ``(indptr, indices, distances, report)``: row i's neighbours are
    ``indices[indptr[i]:indptr[i + 1]]`` (int64) at ``distances[...]`` (float64, exact), ordered
    by (distance, index) where ``sort_results``, else by index. A pair at exactly the radius is
    in (as scikit-learn's ``<=``).
    """
    if metric.name not in RADIUS_METRICS:
        raise ValueError(f"radius queries serve the metrics {sorted(RADIUS_METRICS)}, got {metric.name!r}")
    nq, n = queries.n, corpus.n
    report = RadiusReport(plan=plan, exact=ExactStats())
    with on_device(device), full_precision():
        stages.count("radius.query")
        # Cosine screens float64 unit vectors (not centred: their norms are 1), against twice the
        # radius (its distance is half their squared distance); a zero vector stays zero, whose
        # screened ½ is below its distance of 1 (a candidate wherever it could be in).
        unit = metric.name == "cosine"
        dtype = radius_product_dtype(queries, corpus, metric)
        radii64 = radii.to(device, torch.float64)
        squared = 2 * radii64 if unit else metric.from_distance(radii64)
        slack = UNIT_VECTOR_SLACK * (corpus.d + 4) * 2.0**-53 if unit else 0.0
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        found_rows: list[torch.Tensor] = []
        found_cols: list[torch.Tensor] = []
        found_dist: list[torch.Tensor] = []
        if nq and n:
            if unit:
                mean = torch.zeros(corpus.d, dtype=dtype, device=device)
            else:
                sample = torch.arange(0, n, max(1, n // DIRECT_CENTRE_SAMPLE), device="cpu")
                mean = corpus.take(sample).to(device).to(dtype).mean(dim=0)
            resident = _prepared_block(corpus, 0, n, mean, dtype, device, unit) if plan.corpus_resident else None
            found = 0
            for q0 in range(0, nq, plan.query_rows):
                q1 = min(nq, q0 + plan.query_rows)
                raw = queries.rows(q0, q1).to(device, non_blocking=True)
                check_finite(raw, queries.name, q0)
                q = _screen_rows(raw, mean, dtype, unit)
                q_norms = torch.linalg.vector_norm(q, dim=1).double()
                _check_scale(float(q_norms.max()), queries.name, dtype)
                q_scaled = q * -2  # exactly: the squares go in as the product's 1-D bias
                room = squared[q0:q1] - q_norms ** 2
                for c0 in range(0, n, plan.corpus_cols):
                    c1 = min(n, c0 + plan.corpus_cols)
                    c, c_norms, c_max = resident if resident is not None else \
                        _prepared_block(corpus, c0, c1, mean, dtype, device, unit)
                    if resident is not None:
                        c, c_norms = c[c0:c1], c_norms[c0:c1]
                    scores = torch.addmm(c_norms.to(dtype) ** 2, q_scaled, c.T)
                    bound = direct_rounding_bound(c_max, q_norms, corpus.d, dtype) + slack
                    # Rounded up into the scores' type, so that the compare keeps every pair the
                    # float64 test would.
                    limit = _rounded_up(room + bound, dtype)
                    rows, cols = torch.nonzero(scores <= limit[:, None], as_tuple=True)
                    del scores
                    report.pairs_screened += (q1 - q0) * (c1 - c0)
                    if rows.numel() == 0:
                        continue
                    rows, cols = rows + q0, cols + c0
                    dist = exact_pairs_of(metric, queries, rows, corpus, cols, device)
                    report.exact.exact_evaluations += dist.numel()
                    keep = dist <= radii64[rows]
                    rows, cols, dist = rows[keep], cols[keep], dist[keep]
                    found += rows.numel()
                    if found > plan.max_pairs:
                        raise ValueError(
                            f"radius: more than {plan.max_pairs:,} pairs within the radius (the most the memory "
                            f"budget of {plan.budget:,} bytes holds), {found:,} found by query {q1} of {nq}; "
                            "ask for a smaller radius or a larger memory_budget, or use knng.graph with a k")
                    found_rows.append(rows)
                    found_cols.append(cols)
                    found_dist.append(dist)
            report.exact.rows = nq
        rows = torch.cat(found_rows) if found_rows else empty
        cols = torch.cat(found_cols) if found_cols else empty
        dist = torch.cat(found_dist) if found_dist else torch.zeros(0, dtype=torch.float64, device=device)
        # Ordered by (row, distance, index), or by (row, index): stable sorts, the last key first.
        order = torch.argsort(cols, stable=True)
        if sort_results:
            order = order[torch.argsort(dist[order], stable=True)]
        order = order[torch.argsort(rows[order], stable=True)]
        cols, dist = cols[order], dist[order]
        counts = torch.bincount(rows, minlength=nq)
        indptr = torch.zeros(nq + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=indptr[1:])
        report.pairs_found = int(cols.numel())
    return indptr, cols, dist, report


def _screen_rows(raw: torch.Tensor, mean: torch.Tensor, dtype: torch.dtype, unit: bool) -> torch.Tensor:
    """Rows as the screen takes them: centred on ``mean`` in ``dtype``, or (``unit``) as unit
    vectors (a zero row stays zero)."""
    x = raw.to(dtype)
    if unit:
        norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        return x / torch.where(norms > 0, norms, torch.ones_like(norms))
    return x - mean


def _prepared_block(corpus: InputArray, c0: int, c1: int, mean: torch.Tensor, dtype: torch.dtype,
                    device: torch.device, unit: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Corpus rows ``c0:c1`` as the screen takes them (:func:`_screen_rows`) on ``device``, their
    norms and the largest of them (a synchronisation)."""
    raw = corpus.rows(c0, c1).to(device, non_blocking=True)
    check_finite(raw, corpus.name, c0)
    c = _screen_rows(raw, mean, dtype, unit)
    norms = torch.linalg.vector_norm(c, dim=1)
    largest = float(norms.max()) if norms.numel() else 0.0
    _check_scale(largest, corpus.name, dtype)
    return c, norms, largest


def _check_scale(largest: float, name: str, dtype: torch.dtype) -> None:
    """Refuse vectors whose scores could overflow ``dtype`` (every score is at most (‖q‖ + ‖c‖)²)."""
    if not largest * largest * 4 < torch.finfo(dtype).max:
        raise ValueError(f"{name} has vectors of norm up to {largest:.3g} (after centring): too large for "
                         f"exact radius queries in {str(dtype).replace('torch.', '')}; rescale the data")


def _rounded_up(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float64) in ``dtype``, each rounded up where the cast rounded it down."""
    cast = values.to(dtype)
    below = cast.to(torch.float64) < values
    return torch.where(below, torch.nextafter(cast, torch.full_like(cast, torch.inf)), cast)
