"""Tests for knng.results: the Neighbors / Graph result types and the graph file format.

Graphs are built by hand from a float64 brute-force k-NN (differences, then a stable
sort so ties go to the smaller index) and checked against scikit-learn as an independent
oracle; knng's own search is deliberately not used here.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse
from sklearn.neighbors import NearestNeighbors, kneighbors_graph

import knng.results as results
from knng.results import FORMAT_VERSION, Graph, Neighbors, load_graph


def brute_knn(x: np.ndarray, k: int, include_self: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Exact k-NN of every row of ``x`` among the rows of ``x``, float64 by differences."""
    diff = x[:, None, :] - x[None, :, :]
    dist = np.sqrt((diff * diff).sum(-1))
    if not include_self:
        np.fill_diagonal(dist, np.inf)
    # Stable sort: equal distances keep index order, i.e. ties go to the smaller index.
    idx = np.argsort(dist, axis=1, kind="stable")[:, :k].astype(np.int64)
    return idx, np.take_along_axis(dist, idx, axis=1).astype(np.float32)


def brute_graph(x: np.ndarray, k: int, include_self: bool = False) -> Graph:
    idx, dist = brute_knn(x, k, include_self)
    return Graph(idx, dist, include_self=include_self)


def exact_distances(x: np.ndarray) -> np.ndarray:
    diff = x[:, None, :] - x[None, :, :]
    return np.sqrt((diff * diff).sum(-1))


def with_duplicates(rng: np.random.Generator, n: int, d: int, n_dup: int) -> np.ndarray:
    """Random points where the last ``n_dup`` rows copy earlier rows (distance exactly 0)."""
    x = rng.standard_normal((n, d))
    x[n - n_dup:] = x[rng.choice(n - n_dup, size=n_dup, replace=False)]
    return x


def assert_sorted_rows(a: scipy.sparse.csr_matrix) -> None:
    for i in range(a.shape[0]):
        row = a.indices[a.indptr[i]:a.indptr[i + 1]]
        assert np.all(np.diff(row) > 0), f"row {i} not strictly sorted: {row}"


# --------------------------------------------------------------------------- basics


def test_unpacking_and_properties():
    rng = np.random.default_rng(101)
    idx = rng.integers(0, 50, size=(7, 3), dtype=np.int64)
    dist = np.sort(rng.random((7, 3), dtype=np.float32), axis=1)
    nb = Neighbors(idx, dist)
    i, d = nb
    assert i is idx and d is dist
    assert nb.k == 3 and nb.n_queries == 7 and nb.metric == "euclidean"
    g = Graph(idx, dist, metric="cosine", include_self=True)
    assert g.n_points == 7 and g.k == 3 and g.metric == "cosine" and g.include_self
    with pytest.raises(ValueError):
        a, b, c = g  # exactly two items, not three


def test_frozen():
    g = Graph(np.zeros((2, 1), np.int64), np.zeros((2, 1), np.float32))
    with pytest.raises(AttributeError):
        g.metric = "cosine"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("indices", "distances", "exc", "name"),
    [
        (np.zeros(4, np.int64), np.zeros(4, np.float32), ValueError, "indices"),
        (np.zeros((2, 2), np.int64), np.zeros((2, 2, 1), np.float32), ValueError, "distances"),
        (np.zeros((2, 2), np.int64), np.zeros((2, 3), np.float32), ValueError, "distances"),
        ([[0, 1]], np.zeros((1, 2), np.float32), TypeError, "indices"),
        (np.zeros((1, 2), np.int64), [[0.0, 1.0]], TypeError, "distances"),
    ],
)
def test_bad_fields_name_the_field(indices, distances, exc, name):
    with pytest.raises(exc, match=name):
        Neighbors(indices, distances)
    with pytest.raises(exc, match=name):
        Graph(indices, distances)


def test_bad_metric_and_include_self():
    idx, dist = np.zeros((2, 1), np.int64), np.zeros((2, 1), np.float32)
    with pytest.raises(TypeError, match="metric"):
        Neighbors(idx, dist, metric=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="include_self"):
        Graph(idx, dist, include_self="yes")  # type: ignore[arg-type]


def test_numpy_from_torch_keeps_class_and_values():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(202)
    idx = rng.integers(0, 9, size=(9, 4), dtype=np.int64)
    dist = rng.random((9, 4), dtype=np.float32)
    d_t = torch.from_numpy(dist.copy()).requires_grad_(True)  # needs detach() to convert
    g = Graph(torch.from_numpy(idx), d_t, metric="sqeuclidean", include_self=True)
    i, d = g  # unpacking works on tensors too
    assert isinstance(i, torch.Tensor)
    h = g.numpy()
    assert type(h) is Graph
    assert isinstance(h.indices, np.ndarray) and isinstance(h.distances, np.ndarray)
    np.testing.assert_array_equal(h.indices, idx)
    np.testing.assert_array_equal(h.distances, dist)
    assert h.metric == "sqeuclidean" and h.include_self is True
    nb = Neighbors(torch.from_numpy(idx), torch.from_numpy(dist)).numpy()
    assert type(nb) is Neighbors and isinstance(nb.indices, np.ndarray)


# ------------------------------------------------------------------------ to_scipy


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("mode", ["distance", "connectivity"])
@pytest.mark.parametrize("include_self", [False, True])
def test_to_scipy_matches_sklearn(seed, mode, include_self):
    rng = np.random.default_rng(seed)
    n, d, k = int(rng.integers(30, 80)), int(rng.integers(2, 9)), int(rng.integers(1, 8))
    x = rng.standard_normal((n, d))  # continuous random data: no ties
    got = brute_graph(x, k, include_self).to_scipy(mode)
    want = kneighbors_graph(x, k, mode=mode, include_self=include_self)
    assert isinstance(got, scipy.sparse.csr_matrix)
    assert got.shape == want.shape == (n, n)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)  # same in-row (distance) order
    if mode == "distance":
        # Ours went through float32, sklearn stays float64.
        np.testing.assert_allclose(got.data, want.data, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got.data, want.data)
    if not include_self:
        est = NearestNeighbors(n_neighbors=k, algorithm="brute").fit(x)
        want2 = est.kneighbors_graph(mode=mode)
        np.testing.assert_array_equal(got.indices, want2.indices)
        np.testing.assert_array_equal(got.indptr, want2.indptr)
        assert got.dtype == want2.dtype


def test_to_scipy_keeps_explicit_zeros_for_duplicates():
    rng = np.random.default_rng(21)
    n, k = 40, 4
    x = with_duplicates(rng, n, 3, n_dup=8)
    g = brute_graph(x, k)
    n_zero = int((g.distances == 0).sum())
    assert n_zero >= 16  # each duplicate pair gives two zero edges
    for mode in ("distance", "connectivity"):
        a = g.to_scipy(mode)
        assert a.nnz == n * k
        np.testing.assert_array_equal(np.diff(a.indptr), np.full(n, k))
        np.testing.assert_array_equal(a.indices, g.indices.ravel())
    a = g.to_scipy("distance")
    assert int((a.data == 0).sum()) == n_zero
    np.testing.assert_array_equal(a.data, g.distances.ravel().astype(np.float64))


def test_to_scipy_from_torch_equals_numpy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(22)
    g = brute_graph(rng.standard_normal((25, 4)), 5)
    gt = Graph(torch.from_numpy(g.indices), torch.from_numpy(g.distances))
    for mode in ("distance", "connectivity"):
        a, b = g.to_scipy(mode), gt.to_scipy(mode)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.data, b.data)
    for how in ("union", "mutual"):
        assert (g.symmetrize(how) != gt.symmetrize(how)).nnz == 0


def test_to_scipy_rejects_out_of_range_indices():
    idx = np.array([[1], [2], [-1]], dtype=np.int64)
    g = Graph(idx, np.ones((3, 1), np.float32))
    with pytest.raises(ValueError, match="indices"):
        g.to_scipy()
    g = Graph(np.array([[1], [3], [0]], dtype=np.int64), np.ones((3, 1), np.float32))
    with pytest.raises(ValueError, match="indices"):
        g.symmetrize()


def test_empty_graphs():
    g = Graph(np.zeros((5, 0), np.int64), np.zeros((5, 0), np.float32))
    assert g.to_scipy().shape == (5, 5) and g.to_scipy().nnz == 0
    assert g.symmetrize("mutual").shape == (5, 5) and g.symmetrize().nnz == 0
    g = Graph(np.zeros((0, 3), np.int64), np.zeros((0, 3), np.float32))
    assert g.to_scipy().shape == (0, 0) and g.symmetrize().shape == (0, 0)


@pytest.mark.parametrize(("method", "kwargs", "name"), [
    ("to_scipy", {"mode": "distances"}, "mode"),
    ("symmetrize", {"how": "intersection"}, "how"),
    ("symmetrize", {"mode": "weights"}, "mode"),
])
def test_bad_arguments_name_the_argument(method, kwargs, name):
    g = Graph(np.array([[1], [0]], np.int64), np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=name):
        getattr(g, method)(**kwargs)


# ---------------------------------------------------------------------- symmetrize


def test_symmetrize_hand_built():
    # 0 <-> 1 mutual (distances differ in float32 rounding), 2 -> 1, 3 -> 2 at distance 0.
    idx = np.array([[1], [0], [1], [2]], dtype=np.int64)
    dist = np.array([[1.0], [np.nextafter(np.float32(1), np.float32(2))], [2.0], [0.0]], np.float32)
    g = Graph(idx, dist)
    union = g.symmetrize("union")
    assert union.nnz == 6
    assert_sorted_rows(union)
    np.testing.assert_array_equal(union.indptr, [0, 1, 3, 5, 6])
    np.testing.assert_array_equal(union.indices, [1, 0, 2, 1, 3, 2])
    # min of the two directions for {0, 1}; the zero edge {2, 3} is kept explicitly.
    np.testing.assert_array_equal(union.data, [1.0, 1.0, 2.0, 2.0, 0.0, 0.0])
    assert union.dtype == np.float64

    mutual = g.symmetrize("mutual")
    assert mutual.nnz == 2
    np.testing.assert_array_equal(mutual.indptr, [0, 1, 2, 2, 2])
    np.testing.assert_array_equal(mutual.indices, [1, 0])
    np.testing.assert_array_equal(mutual.data, [1.0, 1.0])

    conn = g.symmetrize("union", mode="connectivity")
    np.testing.assert_array_equal(conn.indices, union.indices)
    np.testing.assert_array_equal(conn.data, np.ones(6))
    assert conn.dtype == np.float64
    np.testing.assert_array_equal(g.symmetrize("mutual", "connectivity").data, [1.0, 1.0])


@pytest.mark.parametrize("seed", [31, 32, 33])
@pytest.mark.parametrize("how", ["union", "mutual"])
def test_symmetrize_matches_dense_oracle(seed, how):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(20, 60)), int(rng.integers(1, 7))
    x = rng.standard_normal((n, int(rng.integers(2, 6))))
    g = brute_graph(x, k)
    # Independent edge sets from scikit-learn's directed graph.
    c = kneighbors_graph(x, k, mode="connectivity").toarray().astype(bool)
    mask = (c | c.T) if how == "union" else (c & c.T)
    a = g.symmetrize(how)
    assert a.shape == (n, n) and a.dtype == np.float64
    assert a.nnz == mask.sum()
    assert_sorted_rows(a)
    assert a.has_canonical_format
    dense = a.toarray()
    np.testing.assert_array_equal(dense != 0, mask)  # no zero distances in this data
    np.testing.assert_allclose(dense[mask], exact_distances(x)[mask], rtol=1e-6)
    np.testing.assert_array_equal(dense, dense.T)  # exactly symmetric
    conn = g.symmetrize(how, mode="connectivity")
    np.testing.assert_array_equal(conn.toarray(), mask.astype(np.float64))


@pytest.mark.parametrize("how", ["union", "mutual"])
def test_symmetrize_keeps_zero_distance_edges(how):
    rng = np.random.default_rng(41)
    n, k = 50, 3
    x = with_duplicates(rng, n, 4, n_dup=10)
    g = brute_graph(x, k)
    c = np.zeros((n, n), dtype=bool)
    c[np.repeat(np.arange(n), k), g.indices.ravel()] = True
    mask = (c | c.T) if how == "union" else (c & c.T)
    a = g.symmetrize(how)
    assert a.nnz == mask.sum()
    stored = np.zeros((n, n), dtype=bool)
    rows = np.repeat(np.arange(n), np.diff(a.indptr))
    stored[rows, a.indices] = True
    np.testing.assert_array_equal(stored, mask)  # structure includes the zero edges
    zero_pairs = mask & (exact_distances(x) == 0)
    assert zero_pairs.sum() >= 20  # every duplicate pair is mutual nearest at distance 0
    assert int((a.data == 0).sum()) == zero_pairs.sum()
    conn = g.symmetrize(how, mode="connectivity")
    np.testing.assert_array_equal(conn.toarray(), mask.astype(np.float64))


@pytest.mark.parametrize("how", ["union", "mutual"])
def test_symmetrize_include_self_keeps_diagonal_once(how):
    rng = np.random.default_rng(51)
    n, k = 30, 4
    x = rng.standard_normal((n, 3))
    g = brute_graph(x, k, include_self=True)
    assert np.all(g.indices[:, 0] == np.arange(n))
    a = g.symmetrize(how)
    rows = np.repeat(np.arange(n), np.diff(a.indptr))
    diag = rows == a.indices
    assert diag.sum() == n  # one self edge per point, not two
    np.testing.assert_array_equal(a.data[diag], np.zeros(n))  # explicit zeros
    assert_sorted_rows(a)
    c = kneighbors_graph(x, k, mode="connectivity", include_self=True).toarray().astype(bool)
    mask = (c | c.T) if how == "union" else (c & c.T)
    assert a.nnz == mask.sum()
    # And without include_self no diagonal appears.
    b = brute_graph(x, k - 1).symmetrize(how)
    assert not np.any(np.repeat(np.arange(n), np.diff(b.indptr)) == b.indices)


# ---------------------------------------------------------------------- save / load


def _assert_same_graph(loaded: Graph, idx: np.ndarray, dist: np.ndarray, metric: str, include_self: bool):
    assert type(loaded) is Graph
    assert isinstance(loaded.indices, np.ndarray) and isinstance(loaded.distances, np.ndarray)
    assert loaded.indices.dtype == np.int64 and loaded.distances.dtype == np.float32
    np.testing.assert_array_equal(loaded.indices, idx)
    np.testing.assert_array_equal(loaded.distances, dist)
    assert loaded.metric == metric and type(loaded.metric) is str
    assert loaded.include_self is include_self


def test_save_load_round_trip_numpy(tmp_path):
    rng = np.random.default_rng(61)
    x = with_duplicates(rng, 40, 5, n_dup=4)
    g = Graph(*brute_knn(x, 6, include_self=True), metric="cosine", include_self=True)
    out = g.save(tmp_path / "graph")
    assert out == tmp_path / "graph.npz" and out.is_file()
    _assert_same_graph(load_graph(out), g.indices, g.distances, "cosine", True)
    _assert_same_graph(load_graph(str(tmp_path / "graph")), g.indices, g.distances, "cosine", True)
    # A name already ending in .npz is kept; overwriting an existing file works.
    assert g.save(str(out)) == out
    with np.load(out) as raw:
        assert int(raw["format_version"]) == FORMAT_VERSION == 1
        assert set(raw.files) == {"format_version", "indices", "distances", "metric", "include_self"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.npz"]  # no temp files left


def test_save_load_round_trip_torch(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(62)
    idx, dist = brute_knn(rng.standard_normal((33, 3)), 5)
    g = Graph(torch.from_numpy(idx), torch.from_numpy(dist).requires_grad_(True))
    out = g.save(tmp_path / "t.npz")
    assert out == tmp_path / "t.npz"
    loaded = load_graph(out)
    _assert_same_graph(loaded, idx, dist, "euclidean", False)
    np.testing.assert_array_equal(loaded.to_scipy().data, g.to_scipy().data)


def test_save_is_atomic(tmp_path, monkeypatch):
    rng = np.random.default_rng(63)
    g = Graph(*brute_knn(rng.standard_normal((20, 2)), 3))
    old = Graph(*brute_knn(rng.standard_normal((10, 2)), 2), metric="old")
    old.save(tmp_path / "kept.npz")

    def crash(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(results.os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        g.save(tmp_path / "new.npz")
    with pytest.raises(OSError, match="simulated"):
        g.save(tmp_path / "kept.npz")
    monkeypatch.undo()
    # No final file, no stray temporary, and the existing file is untouched.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.npz"]
    assert load_graph(tmp_path / "kept.npz").metric == "old"


def test_save_writes_via_temp_in_same_folder(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.fspath(src), os.fspath(dst)))
        assert os.path.getsize(src) > 0  # fully written before the rename
        real_replace(src, dst)

    monkeypatch.setattr(results.os, "replace", spy)
    out = Graph(np.array([[1], [0]], np.int64), np.ones((2, 1), np.float32)).save(tmp_path / "g")
    assert len(seen) == 1
    src, dst = seen[0]
    assert dst == os.fspath(out) and os.path.dirname(src) == os.fspath(tmp_path) and src != dst


def test_load_rejects_non_graph_files(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("hello, not a graph")
    npy = tmp_path / "array.npy"
    np.save(npy, np.arange(4))
    other = tmp_path / "other.npz"
    np.savez(other, a=np.arange(3))
    truncated = tmp_path / "truncated.npz"
    Graph(np.array([[1], [0]], np.int64), np.ones((2, 1), np.float32)).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:40])
    for path in (text, npy, other, truncated):
        with pytest.raises(ValueError, match="not a knng graph file") as info:
            load_graph(path)
        assert str(path) in str(info.value)


def test_load_rejects_unknown_format_version(tmp_path):
    path = tmp_path / "future.npz"
    np.savez(
        path, format_version=np.array(2), indices=np.zeros((2, 1), np.int64),
        distances=np.zeros((2, 1), np.float32), metric=np.array("euclidean"),
        include_self=np.array(False),
    )
    with pytest.raises(ValueError, match="format_version") as info:
        load_graph(path)
    assert str(path) in str(info.value)


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_graph(tmp_path / "nope.npz")
