"""Exact radius queries (``knng.radius``, ``knng.engine.radius``): every corpus vector within the
radius, each once, none beyond it, against the float64 oracle by differences, on random and
adversarial data (ties at the radius, duplicates, flat patches, points far from the origin,
radius 0, rows with no neighbour, per-query radii, float64 and integer inputs, files, budgets
that stream the corpus), on the CPU and a GPU (``-m gpu``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from oracle import assert_radius_exact


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    return request.param


def _data(rng: np.random.Generator, name: str, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    if name == "duplicates":
        x[n // 2: n // 2 + 40] = x[3]
    elif name == "offset":
        x = x + 1e4
    elif name == "flat":
        x = np.clip(np.round(x * 20 + 128), 0, 255)
        x[: n // 3] = 128
        x /= 255.0
    return x.astype(np.float32)


@pytest.mark.parametrize("name", ["gauss", "duplicates", "offset", "flat"])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "pearson"])
def test_radius_is_exact(rng, seed, name, metric, device):
    c = _data(rng, name, 900, 7)
    q = np.concatenate([_data(rng, name, 30, 7), c[:6]])  # some queries are corpus points
    if metric == "cosine":  # a zero vector (distance 1 from everything) and scaled copies (distance 0)
        c[11] = 0.0
        c[40:50] = c[7] * 3.0
        q[2] = 0.0
    elif metric == "pearson":  # constant vectors (distance 1) and scaled, shifted copies (distance 0)
        c[11] = 5.0
        c[40:50] = c[7] * 3.0 - 2.0
        q[2] = -1.0
    # A radius near the 20th neighbour's distance of the first query: rows of a few to many.
    d0 = np.sort(np.linalg.norm(c.astype(np.float64) - q[0].astype(np.float64), axis=1))
    r = float(d0[20]) * 1.5 + 1e-3
    if metric == "sqeuclidean":
        r = r * r
    elif metric == "cosine":
        r = 0.02 if name != "offset" else 1e-9
    elif metric == "pearson":
        r = 0.3
    got = knng.radius(q, c, r, metric=metric, device=device)
    assert got.report.pairs_found == got.indices.shape[0]
    assert_radius_exact(got, q, c, r, metric, context=f"{name} seed={seed}")


def test_pairs_at_exactly_the_radius_are_in(rng, device):
    """Integer points: squared distances are exact integers, and a radius equal to one of them
    holds its pairs (scikit-learn's ``<=``); radius 0 holds exact duplicates only."""
    c = np.round(rng.standard_normal((600, 3)) * 2).astype(np.float32)
    q = c[:25]
    sq = ((q[:, None, :].astype(np.int64) - c[None, :, :].astype(np.int64)) ** 2).sum(-1)
    for r in (4.0, 9.0, 0.0):
        got = knng.radius(q, c, r, metric="sqeuclidean", device=device)
        for i in range(q.shape[0]):
            idx, _ = got.row(i)
            want = np.nonzero(sq[i] <= r)[0]
            np.testing.assert_array_equal(np.sort(idx), want)
        assert_radius_exact(got, q, c, r, "sqeuclidean")


def test_per_query_radii_and_empty_rows(rng, device):
    c = _data(rng, "gauss", 700, 5)
    q = _data(rng, "gauss", 40, 5) + 1.0  # off the corpus's centre
    radii = np.linspace(0.0, 4.0, 40)
    got = knng.radius(q, c, radii, device=device)
    counts = np.diff(got.indptr)
    assert counts[0] == 0 and counts[-1] > 0
    assert_radius_exact(got, q, c, radii)


def test_unsorted_rows_come_by_index(rng, device):
    c = _data(rng, "gauss", 500, 4)
    got = knng.radius(c[:20], c, 1.5, sort_results=False, device=device)
    assert_radius_exact(got, c[:20], c, 1.5, sorted_rows=False)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.uint8])
def test_input_types(rng, dtype, device):
    x = rng.standard_normal((400, 6)) * (1 if np.dtype(dtype).kind == "f" else 30)
    x = (np.abs(x) if dtype == np.uint8 else x).astype(dtype)
    r = 1.5 if np.dtype(dtype).kind == "f" else 40.0
    got = knng.radius(x[:30], x, r, device=device)
    assert_radius_exact(got, x[:30].astype(np.float64), x.astype(np.float64), r)


def test_small_budget_streams_the_corpus_in_blocks(rng, tmp_path, device):
    """A 64 KB budget: the corpus is not resident and is read block by block for every chunk
    of queries, here from a memory-mapped file; the answer is the same."""
    c = _data(rng, "duplicates", 3000, 16)
    path = tmp_path / "c.npy"
    np.save(path, c)
    mapped = np.load(path, mmap_mode="r")
    got = knng.radius(c[:300], mapped, 2.5, memory_budget="64KB", device=device)
    plan = got.report.plan
    assert not plan.corpus_resident and plan.corpus_cols < 3000
    ref = knng.radius(c[:300], c, 2.5, device=device)
    for a, b in zip(got.numpy(), ref.numpy()):
        np.testing.assert_array_equal(a, b)
    assert_radius_exact(got, c[:300], c, 2.5)


def test_torch_in_torch_out_and_to_scipy(rng, device):
    c = torch.from_numpy(_data(rng, "gauss", 300, 5)).to(device)
    got = knng.radius(c[:10], c, 1.2)
    assert isinstance(got.indices, torch.Tensor) and got.indices.device.type == device
    assert got.distances.dtype == torch.float32 and got.indptr.dtype == torch.int64
    m = got.to_scipy()
    assert m.shape == (10, 300) and m.nnz == got.indices.shape[0]
    cm = got.to_scipy(mode="connectivity")
    assert cm.data.min() == 1.0 and cm.nnz == m.nnz
    for i in range(10):  # each point is at distance 0 from itself, and stored
        assert i in got.row(i)[0].tolist()


def test_too_many_pairs_for_the_budget_is_an_error(rng):
    c = _data(rng, "gauss", 2000, 4)
    with pytest.raises(ValueError, match="memory_budget"):
        knng.radius(c, c, 100.0, memory_budget="256KB", device="cpu")


@pytest.mark.parametrize("radius, match", [(-1.0, "at least 0"), (float("nan"), "NaN"), (np.ones(3), "one per query"),
                                           ("far", "radius"), (True, "radius")])
def test_bad_radius_is_named(rng, radius, match):
    c = _data(rng, "gauss", 50, 3)
    with pytest.raises((ValueError, TypeError), match=match):
        knng.radius(c[:5], c, radius, device="cpu")


def test_bad_input_is_named(rng):
    c = _data(rng, "gauss", 50, 3)
    with pytest.raises(ValueError, match="inner_product"):
        knng.radius(c[:5], c, 1.0, metric="inner_product", device="cpu")
    bad = c.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="corpus"):
        knng.radius(c[:5], bad, 1.0, device="cpu")
    with pytest.raises(ValueError, match="queries"):
        knng.radius(bad, c, 1.0, device="cpu")
    with pytest.raises(ValueError, match="dimension"):
        knng.radius(c[:5, :2], c, 1.0, device="cpu")


def test_an_infinite_radius_holds_every_vector(rng, device):
    c = _data(rng, "gauss", 200, 3)
    got = knng.radius(c[:7], c, np.inf, device=device)
    assert (np.diff(np.asarray(torch.as_tensor(got.indptr).cpu())) == 200).all()
    assert_radius_exact(got, c[:7], c, np.inf)


def test_cosine_zero_vectors_are_at_distance_one(rng, device):
    """A zero vector is at cosine distance 1 from everything (itself included): in every row of
    radius 1, in none below it."""
    c = _data(rng, "gauss", 300, 5)
    c[17] = 0.0
    q = np.concatenate([c[:4], np.zeros((1, 5), np.float32)])
    for r, held in ((1.0, True), (0.999, False)):
        got = knng.radius(q, c, r, metric="cosine", device=device)
        for i in range(q.shape[0]):
            assert (17 in np.asarray(torch.as_tensor(got.row(i)[0]).cpu()).tolist()) == held, (r, i)
        assert_radius_exact(got, q, c, r, "cosine")


def test_pearson_rows_far_from_the_origin_with_little_spread(rng, device):
    """Rows of mean 10⁶ and spread 10⁻³ (a relative spread of 10⁻⁹): their centring's rounding is
    far above float64's, the screen widens by it and the answer stays exact, constant rows
    (distance 1 from everything) included; a radius of 1 holds them, one below it does not."""
    c = 1e6 + rng.standard_normal((400, 16)) * 1e-3
    c[5] = 1e6
    q = np.concatenate([c[:8], 1e6 + rng.standard_normal((4, 16)) * 1e-3])
    for r in (0.05, 0.999, 1.0):
        got = knng.radius(q, c, r, metric="pearson", device=device)
        assert_radius_exact(got, q, c, r, "pearson", context=f"r={r}")
        held = [5 in np.asarray(torch.as_tensor(got.row(i)[0]).cpu()).tolist() for i in range(q.shape[0])]
        assert all(held) == (r >= 1.0) and (any(held) == (r >= 1.0)), (r, held)
