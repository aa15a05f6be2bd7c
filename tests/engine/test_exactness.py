"""The exactness promise under stress: far-from-origin data, adversarial near-ties that the
float32 screen cannot separate, far-away queries whose screen error dwarfs the gaps, zero and
constant vectors, widely varying norms; and unit tests of the rounding-error bound behind the
screen (``Metric.pair_bound``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from knng.metrics import METRICS as KNNG_METRICS
from oracle import (
    METRICS, assert_exact, assert_exact_chunked, float32_expansion_search, oracle_graph, oracle_search,
    smooth_image_patches,
)


def _far_gauss(rng, n, d, offset, dtype):
    return (offset + rng.standard_normal((n, d))).astype(dtype)


# --------------------------------------------------------------------------- far from origin
FAR_DATA = {
    # 1000 + N(0, 1) in 128-d: where the float32 expansion returns almost nothing right.
    "gauss1000": lambda rng, n: _far_gauss(rng, n, 128, 1000.0, np.float32),
    # raw-intensity image patches: un-centred, near-duplicates, flat regions.
    "patches_uint8": lambda rng, n: smooth_image_patches(rng, n),
    # 1e6 + N(0, 1) in float64: beyond float32 altogether.
    "gauss1e6_f64": lambda rng, n: _far_gauss(rng, n, 32, 1e6, np.float64),
}


@pytest.mark.parametrize("data", list(FAR_DATA))
@pytest.mark.parametrize("metric", METRICS)
def test_far_from_origin_search(data, metric, rng, seed, screen):
    x = FAR_DATA[data](rng, 1300)
    corpus, queries = x[:1200], x[1200:]
    res = knng.search(queries, corpus, 10, metric=metric)
    assert_exact(res, oracle_search(queries, corpus, 10, metric), context=f"seed={seed} {data}")


@pytest.mark.parametrize("data", list(FAR_DATA))
@pytest.mark.parametrize("metric", METRICS)
def test_far_from_origin_graph(data, metric, rng, seed, screen):
    x = FAR_DATA[data](rng, 500)
    g = knng.graph(x, 10, metric=metric)
    assert_exact(g, oracle_graph(x, 10, metric), context=f"seed={seed} {data}")


def test_float32_expansion_fails_where_knng_is_exact(rng, seed):
    x = _far_gauss(rng, 2200, 128, 1000.0, np.float32)
    corpus, queries = x[:2000], x[2000:]
    k = 10
    oracle = oracle_search(queries, corpus, k)
    naive = float32_expansion_search(queries, corpus, k)
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(naive, oracle.indices)])
    rows_right = np.mean([set(a) == set(b) for a, b in zip(naive, oracle.indices)])
    assert rows_right < 0.1 and recall < 0.5, f"seed={seed}: float32 expansion recall {recall:.3f}"
    res = knng.search(queries, corpus, k)
    assert_exact(res, oracle, context=f"seed={seed}")
    np.testing.assert_array_equal(res.indices, oracle.indices)


# ------------------------------------------------------- adversarial near-ties, exact evaluation
def _far_clusters(rng, n, d):
    """Two clusters at ±1e4 (so centring cannot help) with 1e-3 perturbations: the float32
    rounding of the centred values (~1e-3 at 1e4) is as large as the gaps between points."""
    sign = rng.choice([-1.0, 1.0], size=(n, 1))
    return 1e4 * sign + 1e-3 * rng.standard_normal((n, d))


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "inner_product"])
def test_adversarial_clusters_search_falls_back_and_stays_exact(metric, rng, seed, screen):
    corpus = _far_clusters(rng, 800, 16)
    queries = corpus[:40] + 1e-3 * rng.standard_normal((40, 16))
    res = knng.search(queries, corpus, 10, metric=metric)
    report = last_report()
    assert_exact(res, oracle_search(queries, corpus, 10, metric), context=f"seed={seed}")
    # (the inner product, dominated by the cluster, may be certified by a float64 screen)
    assert report.store.tightenings > 0 or (metric == "inner_product" and screen == "float64"), report


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "inner_product"])
def test_adversarial_clusters_graph_falls_back_and_stays_exact(metric, rng, seed, screen):
    x = _far_clusters(rng, 300, 16)
    g = knng.graph(x, 10, metric=metric)
    report = last_report()
    assert_exact(g, oracle_graph(x, 10, metric), context=f"seed={seed}")
    assert report.store.tightenings > 0 or (metric == "inner_product" and screen == "float64"), report


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_adversarial_sphere_shell(metric, rng, seed, screen):
    # Every corpus point at distance 1 + j·1e-10 from the query: far below the float32
    # screen's resolution, so only the exact evaluation of the stores orders them.
    n, d = 600, 16
    u = rng.standard_normal((n, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    radius = 1.0 + 1e-10 * rng.permutation(n)
    corpus = u * radius[:, None]
    queries = np.zeros((3, d))
    queries[:, 0] = [1e-12, -1e-12, 0.0]
    res = knng.search(queries, corpus, 10, metric=metric)
    report = last_report()
    oracle = oracle_search(queries, corpus, 10, metric)
    assert_exact(res, oracle, context=f"seed={seed}")
    np.testing.assert_array_equal(res.indices[2], np.argsort(radius)[:10])
    if screen == "float32":  # a float64 screen resolves 1e-10 gaps by itself
        # every row's near-ties were evaluated exactly (by the finish, or where they overflowed
        # the store's capacity before it, then)
        assert report.evaluations_per_row["median"] == n, report


@pytest.mark.parametrize("metric", METRICS)
def test_far_away_queries(metric, rng, seed, screen):
    # Corpus rows sum to zero; queries are corpus rows + 1e4 in every coordinate, i.e. far
    # away along a direction orthogonal to all the corpus variation. The screen's error
    # (∝ ‖query‖) then dwarfs the O(1) gaps between corpus points: the rows' near-ties are
    # evaluated exactly (by the finish, or where they overflow a store before it, then).
    corpus = rng.standard_normal((1000, 32))
    corpus -= corpus.mean(axis=1, keepdims=True)
    queries = corpus[:40] + 1e4
    res = knng.search(queries, corpus, 10, metric=metric)
    report = last_report()
    assert_exact(res, oracle_search(queries, corpus, 10, metric), context=f"seed={seed}")
    if screen == "float32" and metric in ("euclidean", "sqeuclidean", "inner_product"):
        assert report.evaluations_per_row["median"] > 10, report


@pytest.mark.parametrize("metric", METRICS)
def test_far_duplicates(metric, rng, seed, screen):
    base = _far_gauss(rng, 200, 24, 1000.0, np.float32)
    x = np.concatenate([base, base[:20], base[:20]])
    g = knng.graph(x, 5, metric=metric)
    assert_exact(g, oracle_graph(x, 5, metric), context=f"seed={seed}")


# ------------------------------------------------------------- zero / constant / wide norms
@pytest.mark.parametrize("metric", ["cosine", "pearson"])
def test_zero_vectors_are_at_distance_one(metric, rng, seed, screen):
    corpus = rng.standard_normal((300, 8))
    zero_rows = [0, 17, 150, 299]
    corpus[zero_rows] = 0.0 if metric == "cosine" else np.array([3.0, 0.5, -2.0, 7.0])[:, None]
    queries = rng.standard_normal((20, 8))
    queries[[0, 5]] = 0.0 if metric == "cosine" else 4.0  # zero / constant queries
    res = knng.search(queries, corpus, 300, metric=metric)
    oracle = oracle_search(queries, corpus, 300, metric)
    assert_exact(res, oracle, context=f"seed={seed}")
    # A zero (constant) query is at distance exactly 1 from everything: order = index order.
    np.testing.assert_array_equal(res.indices[0], np.arange(300))
    assert (res.distances[[0, 5]] == 1.0).all()
    # Zero (constant) corpus vectors sit at distance exactly 1 from every query.
    for r in range(20):
        pos = np.isin(res.indices[r], zero_rows)
        assert (res.distances[r][pos] == 1.0).all()
    g = knng.graph(corpus, 12, metric=metric)
    assert_exact(g, oracle_graph(corpus, 12, metric), context=f"seed={seed}")
    # zero rows: all at distance 1, so they take the smallest other indices
    np.testing.assert_array_equal(g.indices[17], [i for i in range(13) if i != 17][:12])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float32])
def test_pearson_constant_vectors_integer_types(dtype, rng, seed):
    x = rng.integers(0, 100, size=(200, 6)).astype(dtype)
    x[[3, 50, 51]] = np.array([7, 7, 0])[:, None].astype(dtype)
    g = knng.graph(x, 8, metric="pearson")
    assert_exact(g, oracle_graph(x, 8, "pearson"), context=f"seed={seed}")
    assert (g.distances[3] == 1.0).all()


@pytest.mark.parametrize("value", [0.1, 0.7, 0.2])  # means inexact in float64 (d = 3)
def test_pearson_float_constant_vectors(value, rng, seed):
    x = rng.standard_normal((20, 3))
    x[0] = value
    g = knng.graph(x, 4, metric="pearson")
    np.testing.assert_array_equal(g.indices[0], [1, 2, 3, 4], err_msg=f"seed={seed}")
    res = knng.search(x[:1], x[1:], 5, metric="pearson")
    np.testing.assert_array_equal(res.indices[0], [0, 1, 2, 3, 4], err_msg=f"seed={seed}")


def test_inner_product_widely_varying_norms(rng, seed, screen):
    x = rng.standard_normal((800, 16)) * 10.0 ** rng.uniform(-3, 3, size=(800, 1))
    q = rng.standard_normal((50, 16)) * 10.0 ** rng.uniform(-3, 3, size=(50, 1))
    res = knng.search(q, x, 25, metric="inner_product")
    assert_exact(res, oracle_search(q, x, 25, "inner_product"), context=f"seed={seed}")
    g = knng.graph(x.astype(np.float32), 7, metric="inner_product")
    assert_exact(g, oracle_graph(x.astype(np.float32), 7, "inner_product"), context=f"seed={seed}")


@pytest.mark.parametrize("metric", METRICS)
def test_wide_dynamic_range(metric, rng, seed, screen):
    # Tiny and huge vectors together (norms 1e-6 … 1e6) in float64.
    x = rng.standard_normal((500, 8)) * 10.0 ** rng.uniform(-6, 6, size=(500, 1))
    res = knng.search(x[:30], x, 9, metric=metric)
    assert_exact(res, oracle_search(x[:30], x, 9, metric), context=f"seed={seed}")


# ------------------------------------------------------------------- rounding-error bounds
def _bound_data(rng, kind, m, d):
    if kind == "gauss":
        return rng.standard_normal((m, d))
    if kind == "offset":  # cancellation-heavy: large common offset, small variation
        return 1e3 + rng.standard_normal((m, d))
    if kind == "midpoint":
        # Every component just below a float32 rounding midpoint: each rounds by ~u, and all
        # errors point the same way, so the product's input error is as large as it gets.
        base = rng.uniform(1.0, 2.0, size=(m, d)).astype(np.float32).astype(np.float64)
        return base + (0.5 - 1e-6) * 2.0**-23 * np.sign(rng.standard_normal((m, 1)))
    if kind == "alternating":  # Σ|a_i b_i| huge, aᵀb ~ 0
        signs = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
        return 1e2 * (1.0 + 1e-4 * rng.standard_normal((m, d))) * signs
    if kind == "outliers":
        x = rng.standard_normal((m, d))
        x[:: max(1, m // 4)] *= 1e4
        return x
    raise ValueError(kind)


BOUND_CASES = [("gauss", 16), ("gauss", 1024), ("offset", 64), ("offset", 4096), ("midpoint", 512),
               ("midpoint", 4096), ("alternating", 1000), ("outliers", 128)]


def _prepared_pair(metric, q, c, *, symmetric, centred, dtype):
    mt = KNNG_METRICS[metric]
    qt, ct = torch.from_numpy(q), torch.from_numpy(c)
    # The engine's centre: the mean of the rows as the metric compares them (cosine's and
    # Pearson's unit vectors).
    centre = mt.unit_rows(ct).mean(0) if centred and mt.needs_centre(symmetric) else None
    if symmetric:
        pq = mt.prepare(qt, centre, side="corpus", symmetric=True, dtype=dtype)
        pc = mt.prepare(ct, centre, side="corpus", symmetric=True, dtype=dtype)
        rows = mt.query_layout(pq.vectors, q.shape[1])
        row_terms = pq.terms
    else:
        pq = mt.prepare(qt, centre, side="query", symmetric=False, dtype=dtype)
        pc = mt.prepare(ct, centre, side="corpus", symmetric=False, dtype=dtype)
        rows = pq.vectors
        row_terms = None
    return mt, rows, pc.vectors, pq.norms, pc.norms, row_terms, pc.terms


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("centred", [False, True])
@pytest.mark.parametrize("kind,d", BOUND_CASES)
def test_pair_bound_holds_for_float32_screen(metric, symmetric, centred, kind, d, rng, seed):
    q = _bound_data(rng, kind, 24, d)
    c = _bound_data(rng, kind, 40, d)
    if symmetric:
        c = np.concatenate([q, c])
        q = c
    mt, r32, c32, rn, cn, rt, ct = _prepared_pair(metric, q, c, symmetric=symmetric, centred=centred,
                                                  dtype=torch.float32)
    _, r64, c64, *_ = _prepared_pair(metric, q, c, symmetric=symmetric, centred=centred, dtype=torch.float64)
    s32 = (r32 @ c32.T).to(torch.float64)
    s64 = r64 @ c64.T
    bound = mt.pair_bound(d, rn[:, None], cn[None, :], None if rt is None else rt[:, None],
                          None if ct is None else ct[None, :])
    err = (s32 - s64).abs()
    worst = float((err / bound).max())
    assert worst <= 1.0, f"seed={seed}: float32 screen error exceeds pair_bound by ×{worst:.3g}"
    assert worst > 1e-6 or kind == "gauss", f"bound uselessly loose? ratio {worst:.3g}"


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind,d", [("offset", 256), ("midpoint", 1024), ("alternating", 512), ("outliers", 64)])
def test_pair_bound_holds_for_float64_screen(metric, symmetric, kind, d, rng, seed):
    """The same bounds with u = 2⁻⁵³ (the float64 screen), against long-double products."""
    q = _bound_data(rng, kind, 12, d)
    c = _bound_data(rng, kind, 20, d)
    if symmetric:
        c = np.concatenate([q, c])
        q = c
    mt, r64, c64, rn, cn, rt, ct = _prepared_pair(metric, q, c, symmetric=symmetric, centred=True,
                                                  dtype=torch.float64)
    s64 = r64 @ c64.T
    ref = r64.numpy().astype(np.longdouble) @ c64.numpy().astype(np.longdouble).T
    if np.finfo(np.longdouble).eps >= 2.0**-52:
        pytest.skip("long double is not wider than double here")
    u64 = 2.0**-53
    bound = mt.pair_bound(d, rn[:, None], cn[None, :], None if rt is None else rt[:, None],
                          None if ct is None else ct[None, :], unit_roundoff=u64)
    err = np.abs(s64.numpy().astype(np.longdouble) - ref).astype(np.float64)
    assert (err <= bound.numpy()).all(), f"seed={seed}: float64 screen error exceeds pair_bound"


# ------------------------------------------- the chunked torch oracle used by the GPU tests
@pytest.mark.parametrize("metric", METRICS)
def test_chunked_torch_oracle_accepts_exact_and_catches_wrong(metric, rng, seed):
    x = (3.0 + rng.standard_normal((700, 12))).astype(np.float32)
    x[650:] = x[:50]
    q = torch.from_numpy(x[:90])
    res = [knng.search(q, x, k, metric=metric) for k in (1, 7, 40)]
    assert_exact_chunked(q, x, res, metric, row_chunk=32, chunk_elems=50_000, context=f"seed={seed}")
    g = knng.graph(x, 9, metric=metric)
    assert_exact_chunked(x, x, [g], metric, exclude_self=True, rows=np.arange(0, 700, 3), row_chunk=64)
    exact = oracle_search(x[:90], x, 8, metric)
    idx, dist = exact.indices.copy(), exact.distances.astype(np.float32)
    wrong_idx = idx.copy()
    wrong_idx[5, 7] = oracle_search(x[5:6], x, 9, metric).indices[0, 8]
    wrong_dist = dist.copy()
    wrong_dist[11, 3] = np.nextafter(dist[11, 3], np.float32(np.inf))
    swapped = idx.copy()
    swapped[20, [2, 6]] = swapped[20, [6, 2]]
    repeated = idx.copy()
    repeated[30, 4] = repeated[30, 3]
    for bad in [(wrong_idx, dist), (idx, wrong_dist), (swapped, dist), (repeated, dist)]:
        with pytest.raises(AssertionError):
            assert_exact_chunked(x[:90], x, [bad], metric, row_chunk=16)
    assert_exact_chunked(x[:90], x, [(idx, dist)], metric, row_chunk=16)


# ------------------------------------------------------ global matmul precision settings
_PRECISION_CHILD = r"""
import sys, warnings
sys.path.insert(0, TESTS)
import numpy as np, torch
import knng
from oracle import assert_exact, oracle_search

SETTING
def state():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = []
        for read in (torch.get_float32_matmul_precision,
                     lambda: getattr(torch.backends.cuda.matmul, "fp32_precision", None),
                     lambda: getattr(torch.backends.mkldnn.matmul, "fp32_precision", None)):
            try:
                out.append(read())
            except Exception as exc:
                out.append(type(exc).__name__)
        return out
before = state()
rng = np.random.default_rng(SEED)
x = (1000.0 + rng.standard_normal((600, 64))).astype(np.float32)
res = knng.search(x[:50], x, 10)
assert_exact(res, oracle_search(x[:50], x, 10))
assert state() == before, (before, state())
print("OK")
"""


@pytest.mark.parametrize("setting", [
    "torch.set_float32_matmul_precision('medium')",
    "torch.backends.fp32_precision = 'tf32'",
    "torch.backends.mkldnn.matmul.fp32_precision = 'bf16'",
])
def test_user_matmul_precision_setting(setting, seed):
    """knng must run, stay exact and leave the user's setting alone whatever it is (fresh
    interpreter: these are process-wide switches that cannot always be undone)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (_PRECISION_CHILD.replace("SETTING", setting).replace("SEED", str(seed))
            .replace("TESTS", repr(str(Path(__file__).resolve().parents[1]))))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(knng.__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_tiny_capacity_forces_tightening_and_overflow(metric, rng, seed, set_options):
    # Stores of exactly k: every row
    # tightens many times, and duplicated points overflow into exact evaluation.

    set_options(store_extra=0)
    set_options(graph_method="symmetric")  # the blocks' stores (an inner product's graph goes by rows)
    x = rng.integers(0, 4, size=(700, 6)).astype(np.float32)  # integer data: dense exact ties
    x[600:] = x[:100]  # and duplicates
    for k in (1, 5, 40):
        g = knng.graph(x, k, metric=metric, device="cpu", memory_budget="64KB")
        assert g.report.store.tightenings > 0 and g.report.plan.parts > 1, g.report
        assert_exact(g, oracle_graph(x, k, metric), context=f"seed={seed} graph k={k}")
        s = knng.search(x[:50] + 0.5, x, k, metric=metric, device="cpu")
        assert_exact(s, oracle_search(x[:50] + 0.5, x, k, metric), context=f"seed={seed} search k={k}")
    assert g.report.store.overflow_rows > 0, g.report


@pytest.mark.parametrize("flush", ["every add", "never before finish"])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_store_flush_size_changes_nothing(flush, metric, rng, seed, set_options):
    # Survivors wait in the store until enough are pending; the answer may not depend on when
    # they are taken in (thresholds only tighten later), on image-like ties or duplicates.

    size = 1 if flush == "every add" else 1 << 40
    set_options(pending_cpu=size)
    set_options(pending_pair_bytes=1)
    x = smooth_image_patches(rng, 900, side=4).astype(np.float32)
    x[800:] = x[:100]
    for k in (1, 7, 899):
        g = knng.graph(x, k, metric=metric, device="cpu", memory_budget="96KB")
        assert g.report.plan.parts > 1 or k == 899, g.report  # k = n − 1 needs one part
        assert_exact(g, oracle_graph(x, k, metric), context=f"seed={seed} flush={flush} k={k}")
    s = knng.search(x[:40] + 0.25, x, 9, metric=metric, device="cpu", memory_budget="96KB")
    assert_exact(s, oracle_search(x[:40] + 0.25, x, 9, metric), context=f"seed={seed} flush={flush} search")


@pytest.mark.parametrize("pending", [300, 1 << 40])
@pytest.mark.parametrize("widen", [True, False])
def test_search_finish_takes_the_last_survivors_in(pending, widen, rng, seed, set_options):
    # The finish of a search takes the pending survivors in without the capacity (the store
    # widens to its widest row), after earlier flushes or none; where the widest row would not
    # fit the store's padded entries it flushes them as before, and so it does where the entries
    # it would sort do not fit the budget's work bytes (``test_the_last_take_in_fits_the_work_bytes``:
    # the widened runs here have a budget that holds them). Exact either way, on image-like
    # near-ties and queries that equal corpus points that are there twice.

    set_options(pending_cpu=pending)
    set_options(pending_pair_bytes=1)
    set_options(store_extra=0)  # rows must widen
    if not widen:
        set_options(rebuild_entries_cpu=64)
    flushed = []
    x = smooth_image_patches(rng, 900, side=4).astype(np.float32)
    x[800:] = x[:100]
    q = x[:60] + 0.25 * rng.standard_normal((60, 16)).astype(np.float32)
    q[:5] = x[:5]
    for k in (1, 9, 900):
        s = knng.search(q, x, k, device="cpu", memory_budget="64MB" if widen else "96KB")
        assert_exact(s, oracle_search(q, x, k), context=f"seed={seed} pending={pending} widen={widen} k={k}")
        flushed.append((s.report.stages.get("store.finish_widened", 0), s.report.stages.get("store.finish_flushed", 0)))
    widened, then_flushed = (any(column) for column in zip(*flushed))
    assert widened and not then_flushed if widen else then_flushed, flushed


def test_store_tightens_wide_rows_in_groups(rng, seed, set_options):
    # A store update sorts at most REBUILD_ENTRIES entries at once and near-ties are evaluated
    # in padded groups of similar widths; a tiny size forces many ranges and groups (rows of very
    # different widths: a cluster of near-ties among spread points) and the answer stays exact.
    from knng.engine.store.entries import rebuild_groups

    set_options(rebuild_entries_cpu=64)
    set_options(pending_cpu=1 << 40)
    set_options(pending_pair_bytes=1)
    set_options(store_extra=2)
    # A float32 screen, whose radii make the cluster's rows overflow every time. The planner now
    # screens this graph in float64 (k ≥ n/100 on a CPU), whose near-ties left no row overflowing
    # in 4 of 20 draws (float32: none in 40).
    set_options(screen_precision="float32")
    x = rng.standard_normal((500, 8)).astype(np.float32)
    x[:150] = x[0] + rng.integers(-1, 2, size=(150, 8)).astype(np.float32) * 1e-3  # near-tie cluster
    g = knng.graph(x, 5, device="cpu", memory_budget="64KB")
    assert g.report.store.tightenings > 0 and g.report.store.overflow_rows > 0, g.report
    assert_exact(g, oracle_graph(x, 5), context=f"seed={seed}")
    groups = rebuild_groups(torch.tensor([1, 50, 2, 3, 40, 1]), 4)
    assert sorted(torch.cat(groups).tolist()) == list(range(6)) and len(groups) > 1
    assert all(bool((g[1:] > g[:-1]).all()) for g in groups)


def test_store_oom_during_a_flush_loses_nothing(monkeypatch, rng, seed, set_options):
    # An out-of-memory error while pending survivors are taken in is retried with its block;
    # the pending survivors of earlier blocks are not dropped.
    import knng.engine.store.candidates as store

    set_options(pending_cpu=2000)
    real_take = store.CandidateStore._take
    state = {"n": 0}

    def take(self, rows, cols, keys, rad):
        state["n"] += 1
        if state["n"] in (2, 3):
            half = rows.numel() // 2
            real_take(self, rows[:half], cols[:half], keys[:half], rad[:half])
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
        return real_take(self, rows, cols, keys, rad)

    monkeypatch.setattr(store.CandidateStore, "_take", take)
    x = rng.standard_normal((900, 12)).astype(np.float32)
    g = knng.graph(x, 10, device="cpu", memory_budget="96KB")
    assert state["n"] > 3 and g.report.oom_retries >= 1, (state, g.report)
    assert_exact(g, oracle_graph(x, 10), context=f"seed={seed}")


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "pearson", "inner_product"])
def test_batched_exact_evaluation_equals_pairs(metric, rng):
    # The store evaluates a row's candidates as one (row, columns) batch or pair by pair;
    # both must give the same float64 value bit for bit (ranks and runs must agree).
    from knng._inputs import as_input
    from knng.engine.exact import exact_pairs, exact_pairs_of

    m = KNNG_METRICS[metric]
    x = as_input(rng.standard_normal((300, 33)).astype(np.float32), "X")
    rows = torch.from_numpy(rng.integers(0, 300, 40))
    cols = torch.from_numpy(rng.integers(0, 300, (40, 17)))
    batched = exact_pairs_of(m, x, rows, x, cols, torch.device("cpu"))
    pairs = exact_pairs_of(m, x, rows.repeat_interleave(17), x, cols.reshape(-1), torch.device("cpu"))
    assert batched.shape == (40, 17) and torch.equal(batched.reshape(-1), pairs)
    raw = torch.from_numpy(rng.standard_normal((50, 33)).astype(np.float32))
    q_rows = torch.from_numpy(rng.integers(0, 50, 40))
    assert torch.equal(exact_pairs(m, raw, q_rows, x, cols, torch.device("cpu")).reshape(-1),
                       exact_pairs(m, raw, q_rows.repeat_interleave(17), x, cols.reshape(-1), torch.device("cpu")))


def test_tf32_products_last_only_for_their_block():
    """The TF32 sample product of a TF32 search switches TF32 on inside the engine's IEEE
    setting and back to IEEE after, not to the user's setting nor left on."""
    from knng.engine.common import full_precision, tf32_products

    with full_precision():
        before = torch.get_float32_matmul_precision()
        with tf32_products():
            assert torch.get_float32_matmul_precision() == "high"
        assert torch.get_float32_matmul_precision() == before == "highest"


@pytest.mark.parametrize("api", ["legacy", "backends"])
def test_runs_overlapping_in_threads_keep_ieee_products_and_restore_the_users_setting(api):
    """knng in two threads at once (a caller's threads, or a compilation in the background beside
    the caller's call): the user's TF32 setting comes back only when both have left, and one
    thread's TF32 section never turns TF32 on while the other is inside (its products then stay
    IEEE); a thread that comes in during a TF32 section waits for its end."""
    import threading

    from knng.engine.common import full_precision, tf32_products

    def setting():
        return torch.get_float32_matmul_precision() if api == "legacy" else torch.backends.cuda.matmul.fp32_precision

    def user(tf32: bool):
        if api == "legacy":
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
        else:
            torch.backends.cuda.matmul.fp32_precision = "tf32" if tf32 else "ieee"

    ieee, tf32 = ("highest", "high") if api == "legacy" else ("ieee", "tf32")
    user(True)
    try:
        inside, leave, seen = threading.Event(), threading.Event(), {}

        def other():
            with full_precision():
                inside.set()
                assert leave.wait(30)

        thread = threading.Thread(target=other)
        with full_precision():
            thread.start()
            assert inside.wait(30)
            with tf32_products():  # the other thread is inside: no TF32
                seen["shared"] = setting()
            leave.set()
            thread.join(30)
            assert setting() == ieee  # the other thread left: not the user's setting yet
            with tf32_products():  # alone now
                seen["alone"] = setting()
            seen["after"] = setting()
        assert seen == {"shared": ieee, "alone": tf32, "after": ieee}
        assert setting() == tf32  # the user's, once both left

        # A thread that comes in during another's TF32 section waits for its end.
        order = []

        def comes_in():
            with full_precision():
                order.append(("in", setting()))

        with full_precision():
            with tf32_products():
                late = threading.Thread(target=comes_in)
                late.start()
                late.join(0.2)
                order.append("tf32 section ends")
            late.join(30)
        assert order == ["tf32 section ends", ("in", ieee)]
        assert setting() == tf32
    finally:
        user(False)
        if api == "legacy":
            torch.set_float32_matmul_precision("highest")


def test_store_row_helpers_equal_their_plain_forms(rng):
    """The store's counts of sorted rows and its transposed interval scan give the plain forms'
    values: counts by index_add_, overlaps by scans along the rows (ties of endpoints, empty
    rows, infinite intervals, rows of one entry)."""
    from knng.engine.store.entries import counts_by_starts, overlapping_sorted, overlapping_sorted_columns, sorted_counts

    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    n = 1_000
    rows = torch.sort(torch.randint(0, n, (20_000,), generator=gen)).values
    rows = rows[(rows % 7) != 3]  # rows with no entry
    want = torch.zeros(n, dtype=torch.int64).index_add_(0, rows, torch.ones_like(rows))
    assert torch.equal(counts_by_starts(rows, n), want)
    assert torch.equal(counts_by_starts(rows[:0], n), torch.zeros(n, dtype=torch.int64))
    assert torch.equal(sorted_counts(rows, n), want)
    for m, w in ((500, 1), (300, 7), (64, 40)):
        mid = torch.sort(torch.randint(0, 50, (m, w), generator=gen).double(), dim=1).values
        r = torch.randint(0, 3, (m, w), generator=gen).double() / 2  # touching endpoints tie exactly
        low, high = mid - r, mid + r
        low[:, w // 2 + 1:] = torch.inf
        high[:, w // 2 + 1:] = torch.inf
        got = overlapping_sorted_columns(low.t().contiguous(), high.t().contiguous()).t()
        assert torch.equal(got, overlapping_sorted(low, high)), (m, w)
        assert bool(got.any()) or w == 1
