"""knng inside the tools users meet it through: scanpy, UMAP, scikit-learn's t-SNE.

Each test compares with the package's own result: scanpy's connectivities and distances from its
own exact (brute-force) neighbours, UMAP and t-SNE fed the exact neighbours of the float64
oracle (``tests/oracle.py``, which imports nothing from knng) in the same layout and with the
same seed. The packages come with the ``interop`` extra (part of ``test``); the data are small
(300 points) because UMAP's first call compiles with numba.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse

import knng
from oracle import oracle_graph

N, D = 300, 10


@pytest.fixture(scope="module")
def cells() -> np.ndarray:
    """A one-dimensional trajectory (a swiss roll) in 10 dimensions with noise: connected, no ties."""
    rng = np.random.default_rng(14)
    t = np.sort(rng.uniform(1.5 * np.pi, 4.5 * np.pi, N))
    roll = np.column_stack([t * np.cos(t), 10 * rng.uniform(size=N), t * np.sin(t)])
    rotation, _ = np.linalg.qr(rng.normal(size=(D, D)))
    return (np.pad(roll, ((0, 0), (0, D - 3))) @ rotation + 0.05 * rng.normal(size=(N, D)))


def _same_sparse(a: scipy.sparse.spmatrix, b: scipy.sparse.spmatrix, rtol: float) -> None:
    a, b = scipy.sparse.csr_matrix(a, copy=True), scipy.sparse.csr_matrix(b, copy=True)  # sorted below
    a.sort_indices()
    b.sort_indices()
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_allclose(a.data, b.data, rtol=rtol, atol=1e-6 if rtol >= 1e-6 else 0)


def _oracle_transform(x: np.ndarray, n_neighbors: int) -> scipy.sparse.csr_matrix:
    """scikit-learn's KNeighborsTransformer(mode="distance").fit_transform layout from the oracle:
    each row the point itself (distance 0) and its n_neighbors nearest others, with the exact
    distances (float64 for float64 data, as knng's transformer gives them; float32 otherwise)."""
    oracle = oracle_graph(x, n_neighbors + 1, include_self=True)
    n, k = oracle.indices.shape
    data = oracle.distances if x.dtype == np.float64 else oracle.distances.astype(np.float32)
    data = data.astype(np.float64).ravel()
    return scipy.sparse.csr_matrix((data, oracle.indices.ravel(), np.arange(n + 1) * k), shape=(n, n))


# --- scanpy -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_scanpy_neighbors_through_the_knng_transformer(cells: np.ndarray) -> None:
    sc = pytest.importorskip("scanpy", reason="pip install 'knng[interop]'")
    import anndata
    from sklearn.neighbors import KNeighborsTransformer

    def neighbors(transformer) -> anndata.AnnData:
        adata = anndata.AnnData(cells.copy())
        sc.pp.neighbors(adata, n_neighbors=15, use_rep="X", transformer=transformer)
        return adata

    ours = neighbors(knng.KNeighborsTransformer(n_neighbors=15))
    default = neighbors(None)  # scanpy's own choice on small data: exact brute force
    brute = neighbors(KNeighborsTransformer(n_neighbors=15, algorithm="brute"))  # the same path as ours
    assert ours.uns["neighbors"]["params"]["n_neighbors"] == 15
    # The connectivities are scanpy's own, to the last bit.
    _same_sparse(ours.obsp["connectivities"], default.obsp["connectivities"], rtol=0)
    # The distances hold each cell (at 0) and its 15 neighbours, as with scikit-learn's transformer
    # (whose float64 expansion puts up to 4e-7 where the cell's own distance is 0) ...
    _same_sparse(ours.obsp["distances"], brute.obsp["distances"], rtol=1e-6)
    # ... and scanpy's default keeps the 14 nearest others of each: the same values.
    mine, theirs = ours.obsp["distances"].tocsr(), default.obsp["distances"].tocsr()
    rows, cols = theirs.nonzero()
    np.testing.assert_allclose(np.asarray(mine[rows, cols]).ravel(), np.asarray(theirs[rows, cols]).ravel(),
                               rtol=1e-6)
    assert theirs.nnz == N * 14


def test_diffusion_map_on_scanpys_neighbours(cells: np.ndarray) -> None:
    sc = pytest.importorskip("scanpy", reason="pip install 'knng[interop]'")
    import anndata

    adata = anndata.AnnData(cells.copy())
    sc.pp.pca(adata, n_comps=5, dtype="float64")  # float32 PCs would test sklearn's float32 distances
    sc.pp.neighbors(adata, n_neighbors=16, use_rep="X_pca")  # exact: 15 per row besides the cell
    graph = knng.Graph.from_scipy(adata.obsp["distances"])
    assert graph.k == 15
    on_scanpys = knng.DiffusionMap(n_components=3, n_neighbors=15).fit(graph)
    # By default a graph passed to fit gives the kernel all its columns (up to 40).
    by_default = knng.DiffusionMap(n_components=3).fit(graph)
    assert by_default.n_neighbors_ == 15
    np.testing.assert_array_equal(by_default.embedding_, on_scanpys.embedding_)
    on_its_own = knng.DiffusionMap(n_components=3, n_neighbors=15).fit(adata.obsm["X_pca"])
    np.testing.assert_allclose(on_scanpys.eigenvalues_, on_its_own.eigenvalues_, rtol=1e-5)
    np.testing.assert_allclose(on_scanpys.embedding_, on_its_own.embedding_, rtol=1e-4, atol=1e-6)
    # And back into scanpy: the embedding is a representation like any other.
    adata.obsm["X_diffmap_knng"] = on_scanpys.embedding_
    sc.pp.neighbors(adata, n_neighbors=10, use_rep="X_diffmap_knng", key_added="diffmap_knng",
                    transformer=knng.KNeighborsTransformer(n_neighbors=10))
    assert adata.obsp["diffmap_knng_connectivities"].shape == (N, N)


# --- UMAP -------------------------------------------------------------------------------------


def test_the_readmes_scanpy_recipe_on_pbmc68k_reduced() -> None:
    # The README's recipe, as a new user runs it on scanpy's bundled data set (its stored graph
    # has 9 neighbours a cell): a diffusion map on those neighbours, with no failure, no warning,
    # no eigenvalue at 1 (a degenerate spectrum must never come back silently), 2 and 10
    # coordinates.
    sc = pytest.importorskip("scanpy", reason="pip install 'knng[interop]'")
    import warnings

    adata = sc.datasets.pbmc68k_reduced()
    graph = knng.Graph.from_scipy(adata.obsp["distances"])
    for m in (2, 10):
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            dm = knng.DiffusionMap(n_components=m).fit(graph)
        assert dm.n_neighbors_ == graph.k and dm.report_.components == 1
        assert np.all(np.isfinite(dm.embedding_)) and dm.embedding_.shape == (adata.n_obs, m)
        assert 1.0 - dm.eigenvalues_[0] > 1e-3 and np.all(np.diff(dm.eigenvalues_) <= 0)


def test_umap_from_a_knng_graph_equals_umap_with_exact_neighbours(cells: np.ndarray) -> None:
    umap = pytest.importorskip("umap", reason="pip install 'knng[interop]'")

    graph = knng.graph(cells, 14)
    indices, distances = graph.to_umap()
    oracle = oracle_graph(cells, 15, include_self=True)
    np.testing.assert_array_equal(indices, oracle.indices)

    def embed(precomputed_knn) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(knn_search_index|n_jobs value).*")
            model = umap.UMAP(n_neighbors=15, n_epochs=100, random_state=0, precomputed_knn=precomputed_knn)
            return model.fit_transform(cells)

    np.testing.assert_array_equal(embed((indices, distances)), embed((oracle.indices, oracle.distances)))


def test_to_umap_layout() -> None:
    graph = knng.Graph(indices=np.array([[1], [0], [1]]), distances=np.array([[1.0], [1.0], [2.0]], np.float32))
    indices, distances = graph.to_umap()
    np.testing.assert_array_equal(indices, [[0, 1], [1, 0], [2, 1]])
    np.testing.assert_array_equal(distances, [[0, 1], [0, 1], [0, 2]])
    assert indices.dtype == np.int64 and distances.dtype == np.float32
    with_self = knng.Graph(indices=indices, distances=distances, include_self=True)
    assert all(np.array_equal(a, b) for a, b in zip(with_self.to_umap(), (indices, distances)))


# --- t-SNE ------------------------------------------------------------------------------------


def test_tsne_on_the_knng_transformer_equals_tsne_on_exact_neighbours(cells: np.ndarray) -> None:
    from sklearn.manifold import TSNE

    perplexity = 10
    n_neighbors = 3 * perplexity + 1  # what TSNE needs
    ours = knng.KNeighborsTransformer(n_neighbors=n_neighbors).fit_transform(cells)
    exact = _oracle_transform(cells, n_neighbors)
    _same_sparse(ours, exact, rtol=1e-14)  # float64 data: float64 distances, to the oracle's rounding

    def embed(distances: scipy.sparse.csr_matrix) -> np.ndarray:
        return TSNE(metric="precomputed", perplexity=perplexity, init="random", max_iter=250,
                    random_state=0).fit_transform(distances)

    np.testing.assert_array_equal(embed(ours), embed(exact))


# --- Graph.from_scipy -------------------------------------------------------------------------


def test_from_scipy_round_trips_and_drops_the_points_themselves(cells: np.ndarray) -> None:
    from sklearn.neighbors import KNeighborsTransformer

    graph = knng.graph(cells, 8)
    again = knng.Graph.from_scipy(graph.to_scipy())
    np.testing.assert_array_equal(again.indices, graph.indices)
    np.testing.assert_array_equal(again.distances, graph.distances)
    theirs = knng.Graph.from_scipy(KNeighborsTransformer(n_neighbors=8).fit_transform(cells))
    np.testing.assert_array_equal(theirs.indices, graph.indices)


@pytest.mark.parametrize(("matrix", "says"), [
    (scipy.sparse.csr_matrix(np.ones((2, 3))), "square"),
    (scipy.sparse.csr_matrix(np.array([[0, 1, 2], [1, 0, 0], [2, 1, 0]], float)), "same number"),
    (scipy.sparse.csr_matrix(np.array([[0, -1.0], [1, 0]])), "finite distances"),
])
def test_from_scipy_names_bad_input(matrix, says: str) -> None:
    with pytest.raises(ValueError, match=f"matrix.*{says}|{says}.*"):
        knng.Graph.from_scipy(matrix)
