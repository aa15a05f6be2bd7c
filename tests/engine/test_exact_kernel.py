"""The pair kernel of the exact evaluation against ``Metric.exact`` (its reference).

Its contract (``knng.engine.exact``): for the Euclidean family, each pair's float64 sum of
squared differences of the two input rows, as the reference computes it up to the order of the
sum (so within the float64 evaluation's own error bound, ``Metric.oracle_error``, which the
stores' radii carry), from any input dtype, in pair or row-batch form. On a CPU it runs in
Triton's interpreter; on a GPU (``pytest -m gpu``) compiled.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng._inputs import as_input
from knng.api import last_report
from knng.engine import exact
from knng.metrics import get_metric
from oracle import assert_exact, oracle_graph, oracle_search, smooth_image_patches


def _reference(metric, x, rows, y, cols):
    xs = x[rows]
    ys = y[cols]
    if cols.dim() == 1:
        return metric.exact(xs, ys[:, None, :])[:, 0]
    return metric.exact(xs, ys)


@pytest.mark.parametrize("metric_name", ["euclidean", "sqeuclidean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.uint8])
@pytest.mark.parametrize("d", [1, 17, 130])
@pytest.mark.parametrize("batched", [False, True])
def test_pairs_match_the_reference(kernel_device, rng, metric_name, dtype, d, batched):
    metric = get_metric(metric_name)
    raw = rng.standard_normal((60, d)) * 50 + 1e4 if dtype != torch.uint8 else rng.integers(0, 256, (60, d))
    # Copies: Triton's interpreter cannot take two arguments that share memory but not storage.
    x = torch.from_numpy(raw[:23]).to(kernel_device, dtype).clone()
    y = torch.from_numpy(raw).to(kernel_device, dtype).clone()
    y[40:45] = y[:5]  # duplicates: distance exactly 0 to the same query rows
    if batched:
        rows = torch.arange(23, device=kernel_device)
        cols = torch.from_numpy(rng.integers(0, 60, (23, 9))).to(kernel_device)
    else:
        rows = torch.from_numpy(rng.integers(0, 23, 77)).to(kernel_device)
        cols = torch.from_numpy(rng.integers(0, 60, 77)).to(kernel_device)
    got = exact.exact_pairs(metric, x, rows, as_input(y, "corpus"), cols, kernel_device)
    want = _reference(metric, x, rows, y, cols)
    assert got.shape == want.shape and got.dtype == torch.float64
    bound = metric.oracle_error(want, torch.zeros_like(want), torch.zeros_like(want), d, 0.0)
    assert bool(((got - want).abs() <= bound).all()), float(((got - want).abs() - bound).max())
    same = (x[rows] if cols.dim() == 1 else x[rows][:, None, :].expand(*cols.shape, d)) == y[cols]
    assert bool((got[same.all(dim=-1)] == 0).all()), "a duplicate pair is not at distance exactly 0"


def test_other_metrics_take_the_reference(kernel_device, rng):
    x = torch.from_numpy(rng.standard_normal((10, 6))).to(kernel_device)
    rows, cols = torch.arange(10, device=kernel_device), torch.arange(10, device=kernel_device)
    for name in ("cosine", "inner_product", "pearson"):
        metric = get_metric(name)
        got = exact.exact_pairs(metric, x, rows, as_input(x, "corpus"), cols, kernel_device)
        assert torch.equal(got, _reference(metric, x, rows, x, cols))


@pytest.mark.parametrize("metric_name", ["euclidean", "sqeuclidean"])
def test_rows_read_from_a_file_are_summed_as_rows_in_memory(kernel_device, rng, tmp_path, metric_name):
    # Grey levels L/255: sums of squares that float64 rounds, so another order of the sum gives
    # other last bits and ties broken otherwise. Rows gathered from a file go through the same
    # kernel as rows in memory: the same values, bit for bit (a file's graph is the array's).
    metric = get_metric(metric_name)
    grey = (rng.integers(0, 256, (300, 64)) / 255).astype(np.float32)
    np.save(tmp_path / "grey.npy", grey)
    on_file = as_input(np.load(tmp_path / "grey.npy", mmap_mode="r"), "data")
    in_memory = as_input(torch.from_numpy(grey).to(kernel_device), "data")
    rows = torch.from_numpy(rng.integers(0, 300, 200)).to(kernel_device)
    cols = torch.from_numpy(rng.integers(0, 300, 200)).to(kernel_device)
    for c in (cols, cols.view(40, 5)):
        r = rows if c.dim() == 1 else rows[:40]
        want = exact.exact_pairs_of(metric, in_memory, r, in_memory, c, kernel_device)
        for chunk in (None, 64 * 8 * 7 * 16):  # chunks of several pairs, as a tight budget makes them
            got = exact.exact_pairs_of(metric, on_file, r, on_file, c, kernel_device, chunk_bytes=chunk)
            assert torch.equal(got, want)
            got = exact.exact_pairs(metric, in_memory.tensor, r, on_file, c, kernel_device, chunk_bytes=chunk)
            assert torch.equal(got, want)


def test_search_and_graph_evaluated_by_the_kernel(kernel_device, rng, spy, set_options):
    """Near-ties far from the origin (every row's candidates evaluated), duplicates: exact."""

    set_options(screen_precision="float32")
    calls = spy(exact, "pair_values")
    c = smooth_image_patches(rng, 400, side=4).astype(np.float32) + 5e3
    c[300:330] = c[:30]
    q = c[::9] + rng.standard_normal((len(c[::9]), 16)).astype(np.float32)
    cq, cc = torch.from_numpy(q).to(kernel_device), torch.from_numpy(c).to(kernel_device)
    assert_exact(knng.search(cq, cc, 7, device=kernel_device), oracle_search(q, c, 7))
    assert last_report().exact.exact_evaluations > 0 and calls
    assert_exact(knng.graph(cc, 5, device=kernel_device), oracle_graph(c, 5))
