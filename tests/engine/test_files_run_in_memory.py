"""A corpus from a file gives the answer of the same array in memory, bit for bit, on every device
and under every budget; on a GPU a file that fits half the budget is copied there once first.

Grey levels L/255 (float32 sums that float64 rounds, many near-ties), flat rows (duplicates
folded), a budget tight enough that the corpus is not resident, k = 1 and a k near n.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from oracle import assert_exact, oracle_graph, oracle_search


def _grey(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    levels = rng.integers(0, 16, (n, d)) * 17  # 16 grey levels: ties and near-ties everywhere
    levels[: n // 10] = 255  # a flat region: identical rows
    return (levels / 255).astype(np.float32)


def _same(a, b) -> bool:
    return bool(np.array_equal(np.asarray(torch.as_tensor(a.indices).cpu()), np.asarray(torch.as_tensor(b.indices).cpu()))
                and np.array_equal(np.asarray(torch.as_tensor(a.distances).cpu()),
                                   np.asarray(torch.as_tensor(b.distances).cpu())))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu])])
@pytest.mark.parametrize("k", [1, 7])
def test_a_files_graph_and_search_are_the_arrays(tmp_path, rng, device, k):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = _grey(rng, 603, 24)
    np.save(tmp_path / "x.npy", x)
    on_file = np.load(tmp_path / "x.npy", mmap_mode="r")
    queries = _grey(rng, 51, 24)
    nbytes = x.nbytes
    # The default budget, one that holds the file twice (a GPU copies it), and one that does not
    # (the corpus streams from the file, parts of a few rows).
    for budget in (None, 2 * nbytes, nbytes // 3):
        options = {} if budget is None else {"memory_budget": budget}
        want = knng.graph(x, k, device=device, **options)
        got = knng.graph(on_file, k, device=device, **options)
        assert _same(got, want), (budget, k)
        copied = "copied to the device" in got.report.plan.budget_source
        assert copied == (device == "cuda" and (budget is None or budget >= 2 * nbytes)), got.report.plan.budget_source
        want_s = knng.search(queries, x, k, device=device, **options)
        got_s = knng.search(queries, on_file, k, device=device, **options)
        assert _same(got_s, want_s), (budget, k)
    assert_exact(got, oracle_graph(x, k))
    assert_exact(got_s, oracle_search(queries, x, k))
