"""knng.estimators: the scikit-learn contract, and the same answers as scikit-learn's brute force.

Comparisons with scikit-learn allow for ties: scikit-learn orders tied (or nearly tied, within
its float64 expansion's rounding) neighbours its own way, knng by the smaller index. So sorted
distances must agree to float32 precision, neighbours strictly inside the k-th distance must
be the same set, and predictions are compared on the queries whose neighbour sets agree
(required to be the large majority).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.sparse
import torch
from sklearn import datasets
from sklearn import neighbors as skn
from sklearn.manifold import Isomap, SpectralEmbedding
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from knng.estimators import (
    KNeighborsClassifier,
    KNeighborsRegressor,
    KNeighborsTransformer,
    NearestNeighbors,
)

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------------------
# scikit-learn's estimator contract
# ------------------------------------------------------------------------------------------


@parametrize_with_checks(
    [
        NearestNeighbors(),
        KNeighborsClassifier(),
        KNeighborsClassifier(n_neighbors=3, weights="distance", metric="cosine"),
        KNeighborsRegressor(),
        KNeighborsRegressor(weights="inverse_square", metric="sqeuclidean"),
        KNeighborsTransformer(),
        KNeighborsTransformer(mode="connectivity", metric="pearson"),
    ]
)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def _load(name: str) -> tuple[np.ndarray, np.ndarray]:
    return getattr(datasets, f"load_{name}")(return_X_y=True)


def _split(name: str):
    X, y = _load(name)
    return train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)


def _assert_same_neighbors(d_ours, i_ours, d_sk, i_sk) -> np.ndarray:
    """Distances equal to float32 precision, neighbour sets equal modulo ties at the k-th.

    Returns a mask of the rows whose whole neighbour sets agree.
    """
    d_ours = np.asarray(d_ours, dtype=np.float64)
    scale = max(1.0, float(np.abs(d_sk).max()))
    tol = 1e-5 * scale
    np.testing.assert_allclose(d_ours, d_sk, rtol=1e-5, atol=tol)
    # ascending, and ties by the smaller index (exact float32 equality)
    assert np.all(np.diff(d_ours, axis=1) >= 0)
    same = np.empty(len(i_ours), dtype=bool)
    for row in range(len(i_ours)):
        inside_ours = set(i_ours[row][d_ours[row] < d_ours[row, -1] - tol].tolist())
        inside_sk = set(i_sk[row][d_sk[row] < d_sk[row, -1] - tol].tolist())
        assert inside_ours == inside_sk, f"row {row}: {i_ours[row]} vs {i_sk[row]}"
        same[row] = set(i_ours[row].tolist()) == set(i_sk[row].tolist())
    return same


SK_METRICS = ["euclidean", "sqeuclidean", "cosine"]
DATASETS = ["digits", "iris", "wine", "breast_cancer"]


# ------------------------------------------------------------------------------------------
# same answers as scikit-learn's brute force
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DATASETS)
@pytest.mark.parametrize("metric", SK_METRICS)
def test_classifier_matches_sklearn(name, metric):
    X_train, X_test, y_train, y_test = _split(name)
    for k in (1, 5, 11):
        # Neighbours, for the test queries and for the training set without self.
        ours = NearestNeighbors(n_neighbors=k, metric=metric).fit(X_train)
        ref = skn.NearestNeighbors(n_neighbors=k, metric=metric, algorithm="brute").fit(X_train)
        d, i = ours.kneighbors(X_test)
        assert d.dtype == np.float64 and i.dtype == np.int64  # float64 data: float64 distances
        same = _assert_same_neighbors(d, i, *ref.kneighbors(X_test))
        # Whole-set agreement differs only where scikit-learn breaks ties at the k-th its own way
        # (iris repeats points); the order itself is checked against the oracle elsewhere.
        assert same.mean() > 0.8, f"only {same.mean():.0%} of rows with the same neighbours"
        same_train = _assert_same_neighbors(*ours.kneighbors(), *ref.kneighbors())
        # Rows differ only where scikit-learn breaks ties at the k-th differently (iris has
        # duplicate points); knng's own order is checked against the oracle elsewhere.
        assert same_train.mean() > 0.8
        g_ours = ours.kneighbors_graph(X_test, mode="distance")
        g_ref = ref.kneighbors_graph(X_test, mode="distance")
        assert g_ours.shape == g_ref.shape and g_ours.format == "csr"
        np.testing.assert_array_equal(g_ours.indptr, g_ref.indptr)
        # same neighbour sets (order within ties may differ), same distances per row
        rows_ours, rows_ref = g_ours.indices.reshape(-1, k), g_ref.indices.reshape(-1, k)
        np.testing.assert_array_equal(np.sort(rows_ours[same], 1), np.sort(rows_ref[same], 1))
        np.testing.assert_allclose(g_ours.data, g_ref.data, rtol=1e-5, atol=1e-5 * max(1.0, g_ref.data.max()))

        for weights in ("uniform", "distance"):
            clf = KNeighborsClassifier(n_neighbors=k, weights=weights, metric=metric).fit(X_train, y_train)
            sk = skn.KNeighborsClassifier(
                n_neighbors=k, weights=weights, metric=metric, algorithm="brute"
            ).fit(X_train, y_train)
            np.testing.assert_array_equal(clf.classes_, sk.classes_)
            p, p_sk = clf.predict_proba(X_test), sk.predict_proba(X_test)
            np.testing.assert_allclose(p[same], p_sk[same], rtol=1e-4, atol=1e-6)
            top2 = np.sort(p_sk, axis=1)[:, -2:]
            clear = same & (top2[:, 1] - top2[:, 0] > 1e-4)
            pred = clf.predict(X_test)
            np.testing.assert_array_equal(pred[clear], sk.predict(X_test)[clear])
            assert clf.score(X_test, y_test) == pytest.approx(np.mean(pred == y_test))


@pytest.mark.parametrize("metric", SK_METRICS)
def test_regressor_matches_sklearn(metric):
    X, y = datasets.load_diabetes(return_X_y=True)
    X_train, X_test, y_train, _ = train_test_split(X, y, test_size=0.25, random_state=0)
    for k in (1, 7):
        for weights in ("uniform", "distance"):
            ours = KNeighborsRegressor(n_neighbors=k, weights=weights, metric=metric).fit(X_train, y_train)
            ref = skn.KNeighborsRegressor(
                n_neighbors=k, weights=weights, metric=metric, algorithm="brute"
            ).fit(X_train, y_train)
            np.testing.assert_allclose(ours.predict(X_test), ref.predict(X_test), rtol=1e-5)
            # multi-output y keeps its columns
            Y = np.column_stack([y_train, -y_train])
            ours.fit(X_train, Y)
            ref.fit(X_train, Y)
            np.testing.assert_allclose(ours.predict(X_test), ref.predict(X_test), rtol=1e-5)


@pytest.mark.parametrize("mode", ["distance", "connectivity"])
def test_transformer_matches_sklearn(mode):
    # Continuous data: no ties, so the graphs must be identical up to float32 distances.
    rng = np.random.default_rng(0)
    X, X_new = rng.normal(size=(300, 8)), rng.normal(size=(50, 8))
    ours = KNeighborsTransformer(n_neighbors=6, mode=mode)
    ref = skn.KNeighborsTransformer(n_neighbors=6, mode=mode, algorithm="brute")
    for a, b in ((ours.fit_transform(X), ref.fit_transform(X)), (ours.transform(X_new), ref.transform(X_new))):
        assert scipy.sparse.issparse(a) and a.format == "csr" and a.dtype == np.float64
        assert a.shape == b.shape
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_allclose(a.data, b.data, rtol=1e-6, atol=1e-6)
    # sklearn's convention: n_neighbors + 1 entries per row in distance mode, self included
    g = ours.fit_transform(X)
    assert g.indptr[1] == (7 if mode == "distance" else 6)
    if mode == "distance":
        np.testing.assert_array_equal(g.indices[:: 7], np.arange(300))


def _same_up_to_sign(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    signs = np.sign(np.sum(a * b, axis=0))
    np.testing.assert_allclose(a * signs, b, atol=atol)


def test_pipeline_isomap_same_embedding():
    X, _ = datasets.make_swiss_roll(n_samples=400, random_state=0)
    k = 10
    ours = make_pipeline(
        KNeighborsTransformer(n_neighbors=k, mode="distance"),
        Isomap(n_neighbors=k, n_components=2, metric="precomputed", eigen_solver="dense"),
    ).fit_transform(X)
    ref = make_pipeline(
        skn.KNeighborsTransformer(n_neighbors=k, mode="distance", algorithm="brute"),
        Isomap(n_neighbors=k, n_components=2, metric="precomputed", eigen_solver="dense"),
    ).fit_transform(X)
    _same_up_to_sign(ours, ref, atol=1e-4 * np.abs(ref).max())


def test_pipeline_spectral_embedding_same_embedding():
    X = datasets.load_wine().data
    X = (X - X.mean(0)) / X.std(0)
    k = 8
    kwargs = dict(n_components=2, affinity="precomputed_nearest_neighbors", n_neighbors=k,
                  random_state=0, eigen_solver="arpack")
    ours = make_pipeline(KNeighborsTransformer(n_neighbors=k, mode="connectivity"),
                         SpectralEmbedding(**kwargs)).fit_transform(X)
    ref = make_pipeline(skn.KNeighborsTransformer(n_neighbors=k, mode="connectivity", algorithm="brute"),
                        SpectralEmbedding(**kwargs)).fit_transform(X)
    _same_up_to_sign(ours, ref, atol=1e-5 * np.abs(ref).max())


# ------------------------------------------------------------------------------------------
# weights
# ------------------------------------------------------------------------------------------


def test_exact_match_weights():
    X = np.array([[0.0], [0.0], [1.0], [2.0], [3.0]])
    y = np.array([0, 1, 1, 1, 1])
    for weights in ("distance", "inverse_square"):
        clf = KNeighborsClassifier(n_neighbors=4, weights=weights).fit(X, y)
        # the query coincides with points 0 and 1: only those vote, with weight 1 each
        np.testing.assert_allclose(clf.predict_proba([[0.0]]), [[0.5, 0.5]])
        assert clf.predict([[0.0]])[0] == 0  # tie goes to the smaller label
        reg = KNeighborsRegressor(n_neighbors=4, weights=weights).fit(X, y.astype(float))
        np.testing.assert_allclose(reg.predict([[0.0]]), [0.5])


def test_inverse_square_and_callable_weights():
    rng = np.random.default_rng(1)
    X, Xq = rng.normal(size=(200, 5)), rng.normal(size=(40, 5))
    y = rng.integers(0, 3, size=200)
    inv_sq = lambda d: 1.0 / d**2  # noqa: E731  (no zero distances here)
    ours = KNeighborsClassifier(n_neighbors=7, weights="inverse_square").fit(X, y)
    ref = skn.KNeighborsClassifier(n_neighbors=7, weights=inv_sq, algorithm="brute").fit(X, y)
    np.testing.assert_allclose(ours.predict_proba(Xq), ref.predict_proba(Xq), rtol=1e-5)
    mine = KNeighborsClassifier(n_neighbors=7, weights=inv_sq).fit(X, y)
    np.testing.assert_allclose(mine.predict_proba(Xq), ref.predict_proba(Xq), rtol=1e-5)
    zero = KNeighborsClassifier(n_neighbors=3, weights=lambda d: np.zeros_like(d)).fit(X, y)
    with pytest.raises(ValueError, match="zero weights"):
        zero.predict(Xq)


# ------------------------------------------------------------------------------------------
# input kinds, pickling, errors
# ------------------------------------------------------------------------------------------


def test_torch_input_stays_torch():
    rng = np.random.default_rng(2)
    X_np, Xq_np = rng.normal(size=(150, 6)).astype(np.float32), rng.normal(size=(20, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=150)
    X = torch.from_numpy(X_np)
    clf = KNeighborsClassifier(n_neighbors=5, weights="distance").fit(X, torch.from_numpy(y))
    assert isinstance(clf._fit_X, torch.Tensor)
    assert clf._fit_X.data_ptr() == X.data_ptr()  # no copy
    d, i = clf.kneighbors(torch.from_numpy(Xq_np))
    assert isinstance(d, torch.Tensor) and isinstance(i, torch.Tensor)
    ref = KNeighborsClassifier(n_neighbors=5, weights="distance").fit(X_np, y)
    assert isinstance(ref._fit_X, np.ndarray)
    np.testing.assert_array_equal(i.numpy(), ref.kneighbors(Xq_np)[1])
    np.testing.assert_array_equal(clf.predict(torch.from_numpy(Xq_np)), ref.predict(Xq_np))
    np.testing.assert_array_equal(clf.predict(Xq_np), ref.predict(Xq_np))  # mixed kinds
    di, ii = clf.kneighbors()  # training set without self, torch out
    assert isinstance(ii, torch.Tensor)
    np.testing.assert_array_equal(ii.numpy(), ref.kneighbors()[1])
    with pytest.raises(ValueError, match="X has 5 features"):
        clf.predict(torch.zeros(3, 5))
    bad = X.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        KNeighborsClassifier().fit(bad, y)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_pickle_round_trip(kind):
    rng = np.random.default_rng(3)
    X, Xq = rng.normal(size=(100, 4)), rng.normal(size=(10, 4))
    y = rng.integers(0, 2, size=100)
    fit_X = torch.from_numpy(X) if kind == "torch" else X
    for est in (KNeighborsClassifier(n_neighbors=3).fit(fit_X, y),
                KNeighborsRegressor(n_neighbors=3).fit(fit_X, y.astype(float)),
                KNeighborsTransformer(n_neighbors=3).fit(fit_X),
                NearestNeighbors(n_neighbors=3).fit(fit_X)):
        back = pickle.loads(pickle.dumps(est))
        assert type(back._fit_X) is type(est._fit_X)
        if hasattr(est, "predict"):
            np.testing.assert_array_equal(back.predict(Xq), est.predict(Xq))
        np.testing.assert_array_equal(back.kneighbors(Xq)[1], est.kneighbors(Xq)[1])


def test_errors():
    X = np.random.default_rng(4).normal(size=(10, 3))
    nn = NearestNeighbors(n_neighbors=3).fit(X)
    with pytest.raises(ValueError, match="n_neighbors < n_samples_fit"):
        nn.kneighbors(n_neighbors=10)
    with pytest.raises(ValueError, match="n_neighbors <= n_samples_fit"):
        nn.kneighbors(X, n_neighbors=11)
    with pytest.raises(ValueError, match="n_neighbors > 0"):
        nn.kneighbors(X, n_neighbors=0)
    with pytest.raises(ValueError, match="Unsupported mode"):
        nn.kneighbors_graph(X, mode="weird")
    with pytest.raises(ValueError, match="metric"):
        NearestNeighbors(metric="manhattan").fit(X)
    with pytest.raises(ValueError, match="weights"):
        KNeighborsClassifier(weights="bogus").fit(X, np.arange(10) % 2)
    with pytest.raises(TypeError, match="sparse.*precomputed"):
        NearestNeighbors(metric="precomputed").fit(scipy.sparse.csr_matrix(np.abs(X[:, :1] - X[:, :1].T)))
    assert nn.kneighbors(n_neighbors=9)[1].shape == (10, 9)


def test_sparse_data_give_the_dense_answer():
    """CSR data (fit and queries) are read dense a block at a time: the dense data's answer."""
    rng = np.random.default_rng(5)
    X = scipy.sparse.random(300, 40, density=0.1, format="csr", random_state=3)
    dense = X.toarray()
    for est in (NearestNeighbors(n_neighbors=4, radius=0.9, device="cpu"),):
        d1, i1 = est.fit(X).kneighbors(X[:20])
        d2, i2 = est.fit(dense).kneighbors(dense[:20])
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(d1, d2)
        r1 = est.fit(X).radius_neighbors(X[:20])
        r2 = est.fit(dense).radius_neighbors(dense[:20])
        for a, b in zip(r1[1], r2[1]):
            np.testing.assert_array_equal(a, b)
    y = rng.integers(0, 3, 300)
    clf_sparse = KNeighborsClassifier(n_neighbors=5, device="cpu").fit(X, y).predict(X[:50])
    np.testing.assert_array_equal(clf_sparse, KNeighborsClassifier(n_neighbors=5, device="cpu").fit(dense, y)
                                  .predict(dense[:50]))


def test_other_metrics_agree_with_knng_search():
    import knng

    rng = np.random.default_rng(5)
    X, Xq = rng.normal(size=(120, 7)), rng.normal(size=(15, 7))
    for metric in ("pearson", "inner_product"):
        d, i = NearestNeighbors(n_neighbors=4, metric=metric).fit(X).kneighbors(Xq)
        ref = knng.search(Xq, X, 4, metric=metric)
        np.testing.assert_array_equal(i, ref.indices)
        # float64 data: the exact float64 distances, which the engine's float32 are the rounding of
        assert d.dtype == np.float64
        np.testing.assert_array_equal(d.astype(np.float32), ref.distances)


# ------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------


@gpu
@needs_cuda
def test_gpu_tensor_fit_and_cpu_fit_gpu_predict():
    rng = np.random.default_rng(6)
    X, Xq = rng.normal(size=(3000, 32)).astype(np.float32), rng.normal(size=(500, 32)).astype(np.float32)
    y = rng.integers(0, 5, size=3000)
    cpu = KNeighborsClassifier(n_neighbors=10, weights="distance", device="cpu").fit(X, y)
    expected_ind = cpu.kneighbors(Xq)[1]
    expected = cpu.predict_proba(Xq)

    # CPU-fitted estimator predicting on the GPU
    cpu_then_gpu = pickle.loads(pickle.dumps(cpu)).set_params(device="cuda")
    np.testing.assert_array_equal(cpu_then_gpu.kneighbors(Xq)[1], expected_ind)
    np.testing.assert_allclose(cpu_then_gpu.predict_proba(Xq), expected, rtol=1e-6)

    # GPU tensors stay on the GPU
    Xg = torch.from_numpy(X).cuda()
    gpu_est = KNeighborsClassifier(n_neighbors=10, weights="distance").fit(Xg, y)
    assert gpu_est._fit_X.is_cuda and gpu_est._fit_X.data_ptr() == Xg.data_ptr()
    d, i = gpu_est.kneighbors(torch.from_numpy(Xq).cuda())
    assert i.is_cuda and d.is_cuda
    np.testing.assert_array_equal(i.cpu().numpy(), expected_ind)
    np.testing.assert_allclose(gpu_est.predict_proba(torch.from_numpy(Xq).cuda()), expected, rtol=1e-6)
    g = KNeighborsTransformer(n_neighbors=5).fit_transform(Xg)
    g_cpu = KNeighborsTransformer(n_neighbors=5, device="cpu").fit_transform(X)
    np.testing.assert_array_equal(g.indices, g_cpu.indices)
