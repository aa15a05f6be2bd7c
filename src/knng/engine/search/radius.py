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

Euclidean and squared Euclidean distances (the expansion's bound is theirs), and cosine and Pearson
on float64 unit vectors (:data:`UNIT_VECTOR_SLACK`; Pearson's rows centred on their own means
first, whose rounding grows with a row's mean against its spread). The pairs found are
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
#: bound covers (cosine's and Pearson's on unit vectors: the distance is half their squared
#: distance).
RADIUS_METRICS = frozenset({"euclidean", "sqeuclidean", "cosine", "pearson"})
#: Cosine's screen takes the rows as float64 unit vectors, each within δ = (d + 4)/2·u₆₄ of the
#: exact one (Pearson's: plus its centring's error, :func:`_unit_rows`); their squared distance
#: then moves by at most 4·(δ_q + δ_c) + (δ_q + δ_c)² (both unit vectors, at most 2 apart), and
#: the exact evaluation's value, from unit vectors of its own, by as much again. This many times
#: δ_q + δ_c covers that, generously: the screen only leaves out pairs surely beyond the radius,
#: the exact evaluation decides.
UNIT_VECTOR_SLACK = 16



def radius_product_dtype(queries: InputArray, corpus: InputArray, metric: Metric) -> torch.dtype:
    """The type a radius query screens in: the direct path's (:func:`~knng.engine.search.direct.product_dtype`),
    float64 under cosine and Pearson (their unit vectors are made in float64)."""
    return torch.float64 if metric.normalize else product_dtype(queries, corpus)


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
        # Cosine and Pearson screen float64 unit vectors (not centred on a common point: their
        # norms are 1), against twice the radius (the distance is half their squared distance); a
        # zero vector (or a constant one under Pearson) stays zero, whose screened ½ is below its
        # distance of 1 (a candidate wherever it could be in).
        unit = metric.normalize
        dtype = radius_product_dtype(queries, corpus, metric)
        radii64 = radii.to(device, torch.float64)
        squared = 2 * radii64 if unit else metric.from_distance(radii64)
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
            resident = _prepared_block(corpus, 0, n, mean, dtype, device, metric) if plan.corpus_resident else None
            found = 0
            for q0 in range(0, nq, plan.query_rows):
                q1 = min(nq, q0 + plan.query_rows)
                raw = queries.rows(q0, q1).to(device, non_blocking=True)
                check_finite(raw, queries.name, q0)
                q, q_error = _screen_rows(raw, mean, dtype, metric)
                q_norms = torch.linalg.vector_norm(q, dim=1).double()
                _check_scale(float(q_norms.max()), queries.name, dtype)
                q_scaled = q * -2  # exactly: the squares go in as the product's 1-D bias
                room = squared[q0:q1] - q_norms ** 2
                for c0 in range(0, n, plan.corpus_cols):
                    c1 = min(n, c0 + plan.corpus_cols)
                    c, c_norms, c_max, c_error = resident if resident is not None else \
                        _prepared_block(corpus, c0, c1, mean, dtype, device, metric)
                    if resident is not None:  # its largest norm and error: the whole corpus's
                        c, c_norms = c[c0:c1], c_norms[c0:c1]
                    scores = torch.addmm(c_norms.to(dtype) ** 2, q_scaled, c.T)
                    bound = direct_rounding_bound(c_max, q_norms, corpus.d, dtype)
                    if unit:
                        bound = bound + UNIT_VECTOR_SLACK * (q_error + c_error)
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


def _screen_rows(raw: torch.Tensor, mean: torch.Tensor, dtype: torch.dtype, metric: Metric
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows as the screen takes them: centred on ``mean`` in ``dtype``, or, for a normalising
    metric, as float64 unit vectors (:func:`_unit_rows`) with each one's error bound (None for
    the others)."""
    if metric.normalize:
        return _unit_rows(raw, metric)
    return raw.to(dtype) - mean, None


def _unit_rows(raw: torch.Tensor, metric: Metric) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 unit vectors of ``raw`` as ``metric`` compares them (:meth:`Metric.unit_rows`:
    Pearson's centred on their own means first; zero and constant vectors stay zero), and for
    each a bound δ on its distance to the exact unit vector: (d + 4)/2 roundings for the
    scaling, and under Pearson the centring's, whose error is that of the mean, √d·d·u₆₄·max|x|,
    against the centred vector's norm (large for rows far from the origin with little spread:
    their screen widens, the evaluation decides)."""
    x = raw.to(torch.float64)
    centred = metric.centred_rows(x)
    norms = torch.linalg.vector_norm(centred, dim=1, keepdim=True)
    unit = centred / torch.where(norms > 0, norms, torch.ones_like(norms))
    d = x.shape[1]
    u = 2.0**-53
    error = torch.full((x.shape[0],), (d + 4) / 2 * u, dtype=torch.float64, device=x.device)
    if metric.centre_rows and x.shape[0]:
        spread = norms[:, 0]
        ratio = x.abs().amax(dim=1) / torch.where(spread > 0, spread, torch.ones_like(spread))
        # A relative error ε of a vector moves its direction by at most 2ε.
        error = error + 2 * ((d + 2) * d**0.5 * u * ratio + u)
    return unit, torch.where(norms[:, 0] > 0, error, torch.zeros_like(error))


def _prepared_block(corpus: InputArray, c0: int, c1: int, mean: torch.Tensor, dtype: torch.dtype,
                    device: torch.device, metric: Metric) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """Corpus rows ``c0:c1`` as the screen takes them (:func:`_screen_rows`) on ``device``, their
    norms, the largest of them and the largest unit-vector error (0 unless the metric
    normalises; both synchronisations)."""
    raw = corpus.rows(c0, c1).to(device, non_blocking=True)
    check_finite(raw, corpus.name, c0)
    c, errors = _screen_rows(raw, mean, dtype, metric)
    norms = torch.linalg.vector_norm(c, dim=1)
    largest = float(norms.max()) if norms.numel() else 0.0
    _check_scale(largest, corpus.name, dtype)
    largest_error = float(errors.max()) if errors is not None and errors.numel() else 0.0
    return c, norms, largest, largest_error


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
