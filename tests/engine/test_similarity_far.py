"""Cosine, Pearson and the inner product on data far from the origin (issue 57).

Unit vectors of N(1000, 1) points all but coincide, and so did the rows of an uncentred inner
product: their screens' bounds, relative to norms that the offset inflates, once let nearly
every pair through (cosine: every pair; the README's first example ran for an hour on a 2-core
CPU). Cosine and Pearson are now the Euclidean distance of unit vectors centred on their mean,
and an inner-product graph runs by rows with its corpus centred. Checked: the answers against
the float64 oracle on adversarial data (zero and constant vectors, duplicates, k = 1 and
k = n − 1), and that these metrics evaluate about as many pairs a row as the Euclidean metric
on the same data.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.engine.kernels.capabilities import DeviceCapabilities
from knng.engine.plan import make_graph_plan
from oracle import assert_exact, oracle_graph, oracle_search


def _far(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    return rng.normal(1000, 1, (n, d)).astype(np.float32)


@pytest.mark.parametrize("metric", ["cosine", "pearson", "inner_product"])
def test_far_data_evaluate_about_as_many_pairs_as_euclidean(metric, rng):
    x = _far(rng, 3000, 32)
    euclidean = knng.graph(x, 10, device="cpu").report.evaluations_per_row
    g = knng.graph(x, 10, metric=metric, device="cpu")
    assert g.report.evaluations_per_row["p99"] <= 2 * euclidean["p99"] + 2, (g.report.evaluations_per_row, euclidean)
    assert_exact(g, oracle_graph(x, 10, metric))
    q = _far(rng, 200, 32)
    found = knng.search(q, x, 10, metric=metric, device="cpu")
    assert found.report.evaluations_per_row["p99"] <= 2 * euclidean["p99"] + 2
    assert_exact(found, oracle_search(q, x, 10, metric))


@pytest.mark.parametrize("metric", ["cosine", "pearson"])
@pytest.mark.parametrize("k", [1, 7, 299])
def test_zero_constant_and_duplicate_vectors(metric, k, rng):
    """Zero vectors (cosine) and constant ones (Pearson) are at distance 1 from everything,
    each other included, through the term a zero unit vector takes; duplicates at 0."""
    x = _far(rng, 300, 9)
    x[10:14] = 0.0
    x[20:23] = 7.0  # constant: Pearson's zero vector
    x[30:40] = x[5]
    x[50] = -x[51]  # opposite directions: distance 2
    g = knng.graph(x, k, metric=metric, device="cpu")
    assert_exact(g, oracle_graph(x, k, metric))
    gs = knng.graph(x, k, metric=metric, device="cpu", include_self=True)
    assert_exact(gs, oracle_graph(x, k, metric, include_self=True))


def test_an_inner_product_graph_runs_by_rows():
    """The inner product centres one side only, so its graph runs by rows on a CPU and a GPU."""
    kw = dict(n=100_000, d=128, k=15, budget=8 * 2**30, include_self=False)
    assert make_graph_plan(metric="inner_product", device=torch.device("cpu"), **kw).graph_method == "rows"
    gpu = dict(device=torch.device("cuda"), capabilities=DeviceCapabilities.hopper())
    assert make_graph_plan(metric="inner_product", **gpu, **kw).graph_method == "rows"
    assert make_graph_plan(metric="cosine", device=torch.device("cpu"), **kw).graph_method == "symmetric"
    forced = make_graph_plan(metric="inner_product", device=torch.device("cpu"), method="symmetric", **kw)
    assert forced.graph_method == "symmetric"
