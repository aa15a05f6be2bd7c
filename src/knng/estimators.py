"""scikit-learn estimators on knng's exact brute-force search.

:class:`NearestNeighbors`, :class:`KNeighborsClassifier`, :class:`KNeighborsRegressor` and
:class:`KNeighborsTransformer` follow the contracts of their namesakes in
:mod:`sklearn.neighbors` (constructor parameters and their validation, methods, fitted
attributes, the layout of ``kneighbors_graph``, the rule for excluding a training point from its
own neighbours) and add knng's own ``device``, ``select`` and ``memory_budget``. They are
``KNeighborsMixin`` instances, so :func:`sklearn.neighbors.kneighbors_graph` takes them.

What differs from scikit-learn, on purpose:

- Neighbours are exact in knng's sense: the k smallest float64 distances computed by
  differences, ties broken by the smaller index. Distances are float64 when the training data
  or the queries are float64 (or integers, which scikit-learn converts to float64), float32
  otherwise; ``kneighbors_graph`` stores them as float64 like scikit-learn.
- ``algorithm``, ``leaf_size`` and ``n_jobs`` are accepted and have no effect: every
  ``algorithm`` runs knng's exact brute force.
- Metrics are knng's: ``"minkowski"`` with ``p=2`` (= ``"euclidean"``, ``"l2"``),
  ``"sqeuclidean"``, ``"cosine"``, ``"correlation"`` (= ``"pearson"``), ``"inner_product"`` and
  ``"precomputed"``; any other (``p=1``, ``"manhattan"``, callables) is refused at ``fit`` with
  scikit-learn's ``InvalidParameterError`` (a ValueError) naming it and listing these.
- Exactly tied neighbours (duplicate points, integer data) come in index order; scikit-learn's
  order among them depends on its ``algorithm``. Its rule for dropping each training point from
  its own neighbours (``kneighbors()`` with ``X=None``) is followed as it is.
- ``fit`` also takes a fitted knng or scikit-learn neighbours estimator, a ``KDTree`` or a
  ``BallTree``, and uses its training data (no tree is built or kept).
- Training data stay where the user put them: a torch tensor (on any device) is kept as that
  tensor, NumPy input as a validated NumPy array. ``kneighbors`` answers in the kind of the
  queries (torch in, torch out on the same device). ``predict``, ``predict_proba`` and
  ``transform`` always answer with NumPy / SciPy objects, as scikit-learn does.
- ``metric="precomputed"`` takes dense distance matrices (NumPy or torch), not sparse graphs.
- Sparse input is refused (knng is a dense engine); ``radius_neighbors`` is not offered.
- ``weights`` also accepts ``"inverse_square"`` (1/d², the weighting of the k-NN classifier of
  the system knng implements), with the same exact-match rule as ``"distance"``.
"""

from __future__ import annotations

import numbers
from numbers import Integral, Real
from typing import Any, Callable, ClassVar

import numpy as np
import scipy.sparse
import torch
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    ClassNamePrefixFeaturesOutMixin,
    RegressorMixin,
    TransformerMixin,
    _fit_context,
    is_classifier,
)
from sklearn.exceptions import DataConversionWarning
from sklearn.neighbors import BallTree, KDTree

# scikit-learn exports neither KNeighborsMixin nor NeighborsBase from a public module; both have
# lived in sklearn.neighbors._base since 0.22. KNeighborsMixin is what
# sklearn.neighbors.kneighbors_graph checks for; NeighborsBase is only recognised (a fitted
# scikit-learn estimator can be fitted from), never inherited (see _KNNGNeighborsBase).
from sklearn.neighbors._base import KNeighborsMixin, NeighborsBase, RadiusNeighborsMixin
from sklearn.utils._param_validation import Interval, InvalidParameterError, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from knng._inputs import as_input
from knng.api import graph as knng_graph
from knng.api import radius as knng_radius
from knng.api import search as knng_search
from knng.engine.exact import exact_pairs_of, sort_by_distance_then_index
from knng.engine.search import RADIUS_METRICS
from knng.metrics import METRICS, get_metric

__all__ = [
    "NearestNeighbors",
    "KNeighborsClassifier",
    "KNeighborsRegressor",
    "KNeighborsTransformer",
    "RadiusNeighborsClassifier",
    "RadiusNeighborsRegressor",
    "RadiusNeighborsTransformer",
]

# NumPy dtypes knng computes with natively; anything else (ints, bools) becomes float64, like
# scikit-learn's own conversion. float64 comes first: it is the conversion target.
_NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.uint8, np.int8]
_TORCH_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int8)
_WEIGHTS = ("uniform", "distance", "inverse_square")
_MODES = ("connectivity", "distance")
_ALGORITHMS = ("auto", "ball_tree", "kd_tree", "brute")

#: scikit-learn's names for knng's metrics ("minkowski" is one only with p = 2, see
#: :func:`_resolve_metric`). scipy's "correlation" is 1 − Pearson correlation, knng's "pearson".
_METRIC_ALIASES = {"l2": "euclidean", "correlation": "pearson"}

#: Constraints shared by the four estimators, checked by scikit-learn's own parameter
#: validation at ``fit`` (so a bad value raises its ``InvalidParameterError``, a ValueError and
#: a TypeError). ``metric`` is only typed here: the names knng accepts depend on ``p`` and get
#: a message of their own (:func:`_resolve_metric`).
_COMMON_CONSTRAINTS: dict[str, list[Any]] = {
    "n_neighbors": [Interval(Integral, 1, None, closed="left"), None],
    "algorithm": [StrOptions(set(_ALGORITHMS))],
    "leaf_size": [Interval(Integral, 1, None, closed="left")],
    "metric": [str, callable],
    "p": [Interval(Real, 0, None, closed="right"), None],
    "metric_params": [dict, None],
    "n_jobs": [Integral, None],
    "device": [str, torch.device],
    "select": [str],
    "memory_budget": [Interval(Real, 0, None, closed="neither"), str, None],
}

WeightsType = str | Callable[[np.ndarray], np.ndarray] | None


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _to_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array (torch tensors are detached and copied to the host)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _get_weights(dist: np.ndarray | None, weights: WeightsType) -> np.ndarray | None:
    """Neighbour weights from distances, with scikit-learn's semantics.

    Parameters
    ----------
    dist : numpy.ndarray of shape (n_queries, k) or None
        Neighbour distances (float64).
    weights : {"uniform", "distance", "inverse_square"}, callable or None
        ``"distance"`` is 1/d and ``"inverse_square"`` 1/d². For both, a row holding a zero
        distance (the query coincides with training points) gets weight 1 for those
        neighbours and 0 for the others, exactly as ``sklearn.neighbors._base._get_weights``.
        A callable receives ``dist`` and returns an array of the same shape.

    Returns
    -------
    numpy.ndarray or None
        ``None`` for uniform weights.
    """
    if weights in (None, "uniform"):
        return None
    if callable(weights):
        return weights(dist)
    assert dist is not None
    power = 1.0 if weights == "distance" else 2.0
    with np.errstate(divide="ignore", over="ignore"):
        w = 1.0 / dist if power == 1.0 else 1.0 / (dist * dist)
    # scikit-learn marks exact matches by 1/d being infinite; for 1/d² that would also catch
    # tiny non-zero distances whose square underflows, so zero distance itself is the mark.
    exact = np.isinf(w) if power == 1.0 else (dist == 0)
    rows = np.any(exact, axis=1)
    w[rows] = exact[rows]
    return w


def _check_n_neighbors(n_neighbors: Any, name: str = "n_neighbors") -> int:
    if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, numbers.Integral):
        raise TypeError(f"{name} does not take {type(n_neighbors).__name__} value, enter integer value")
    if n_neighbors <= 0:
        raise ValueError(f"Expected {name} > 0. Got {n_neighbors}")
    return int(n_neighbors)


def check_tensor(X: torch.Tensor, name: str = "X", min_samples: int = 1) -> torch.Tensor:
    """Validate a torch tensor the way ``check_array`` validates arrays, without leaving torch.

    2-D, at least ``min_samples`` rows and one column, real, finite; dtypes knng does not take
    become float64 (as scikit-learn would make them). Returns the tensor, detached, on its device.
    """
    if X.ndim != 2:
        raise ValueError(
            f"Expected 2D array, got {X.ndim}D tensor instead: reshape your data either using "
            "X.reshape(-1, 1) if your data has a single feature or X.reshape(1, -1) if it "
            "contains a single sample."
        )
    if X.shape[0] < min_samples:
        raise ValueError(f"Found array with {X.shape[0]} sample(s) (shape={tuple(X.shape)}) while a minimum of "
                         f"{min_samples} is required.")
    if X.shape[1] < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape={tuple(X.shape)}) while a minimum of 1 is required.")
    X = X.detach()
    if X.is_complex():
        raise ValueError("Complex data not supported")
    if X.dtype not in _TORCH_DTYPES:
        # ints, bools: float64 like scikit-learn (a copy, as scikit-learn would make).
        X = X.to(torch.float64)
    if X.is_floating_point() and not bool(torch.isfinite(X).all()):
        raise ValueError(f"Input {name} contains NaN or infinity.")
    return X


def _all_zero_row(weights: np.ndarray) -> bool:
    return bool(np.any(np.all(weights == 0, axis=1)))


def _offered_metrics() -> str:
    """knng's metrics and scikit-learn's names for them, for error messages."""
    names = [repr(n) for n in sorted(METRICS)] + ["'minkowski' with p=2", "'precomputed'"]
    names += [f"{a!r} (= {b!r})" for a, b in _METRIC_ALIASES.items()]
    return ", ".join(names)


def _resolve_metric(metric: Any, p: Any, metric_params: dict[str, Any] | None, owner: str) -> str:
    """knng's name for scikit-learn's (``metric``, ``p``, ``metric_params``).

    As in scikit-learn, ``p`` (or ``metric_params["p"]``, which overrides it) only matters for
    ``metric="minkowski"``; there p = 2 is the Euclidean distance. Every other combination is
    an :class:`InvalidParameterError` (a ValueError) naming the metric and listing what knng
    computes: knng's distances come from one matrix product plus norms, which serves p = 2 only.

    Raises
    ------
    InvalidParameterError
        For a metric knng does not compute, a callable, or metric parameters it has no use for.
    """
    params = dict(metric_params or {})
    if callable(metric):
        raise InvalidParameterError(
            f"The 'metric' parameter of {owner}: callable metrics are not offered by knng (its exact "
            f"search evaluates distances through matrix products); knng offers {_offered_metrics()}.")
    if metric == "minkowski":
        p_eff = params.pop("p", p)
        if params:
            raise InvalidParameterError(
                f"The 'metric_params' parameter of {owner}: knng's 'minkowski' takes only 'p', got "
                f"{sorted(params)}.")
        if p_eff == 2 or p_eff is None:  # None: scikit-learn's default p, 2
            return "euclidean"
        named = {1: " (manhattan)", np.inf: " (chebyshev)"}.get(p_eff, "")
        raise InvalidParameterError(
            f"The 'metric' parameter of {owner}: metric='minkowski' with p={p_eff!r}{named} is not offered by "
            f"knng, which computes only p=2 (euclidean); knng offers {_offered_metrics()}.")
    if params:
        raise InvalidParameterError(
            f"The 'metric_params' parameter of {owner}: knng's metric {metric!r} takes no parameters, got "
            f"{sorted(params)}; pass None or {{}}.")
    name = _METRIC_ALIASES.get(metric, metric)
    if name not in METRICS and name != "precomputed":
        raise InvalidParameterError(
            f"The 'metric' parameter of {owner}: metric={metric!r} is not offered by knng; knng offers "
            f"{_offered_metrics()}.")
    return name


def _training_data_of(X: Any) -> Any:
    """The training data held by a fitted estimator or tree, else ``X`` itself.

    scikit-learn fits from a fitted neighbours estimator, a ``KDTree`` or a ``BallTree`` by
    taking its data; knng takes the same data (a knng estimator's torch tensor stays a tensor)
    and builds no tree, so the data then go through the usual validation.
    """
    if isinstance(X, _KNNGNeighborsBase):
        check_is_fitted(X)
        return X._fit_X
    if isinstance(X, NeighborsBase):
        check_is_fitted(X)
        return X._fit_X
    if isinstance(X, (KDTree, BallTree)):
        return np.asarray(X.data)
    return X


def _is_double(x: Any) -> bool:
    """Whether scikit-learn would compute with ``x`` in float64: float64 itself, and integer
    types, which its validation converts to float64 (knng keeps uint8/int8 native for speed)."""
    if isinstance(x, torch.Tensor):
        return x.dtype == torch.float64 or not x.is_floating_point()
    return x.dtype == np.float64 or x.dtype.kind in "iub"


def _exact_float64(metric: str, queries: Any, corpus: Any, indices: Any) -> Any:
    """float64 distances of each query to its neighbours ``indices``, by knng's exact evaluation.

    The engine ranks by these float64 values but hands out float32 (its result type); the
    pairs are evaluated again by the same function (``Metric.exact``, by differences), which
    costs n_queries · k · d, next to nothing beside the search. Same kind and device as
    ``indices``.
    """
    idx = indices if isinstance(indices, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(indices))
    q, c = as_input(queries, "X"), as_input(corpus, "X")
    rows = torch.arange(idx.shape[0], device=idx.device)
    if idx.shape[1] == 0:
        dist = torch.empty(idx.shape, dtype=torch.float64, device=idx.device)
    else:
        dist = exact_pairs_of(get_metric(metric), q, rows, c, idx, idx.device)
    return dist if isinstance(indices, torch.Tensor) else dist.cpu().numpy()


def _check_precomputed(D: Any, name: str = "X") -> Any:
    """A validated distance matrix: finite (checked before), no negative entries, as scikit-learn
    requires of ``metric="precomputed"``; integers become float64 like scikit-learn's. A sparse
    matrix (scikit-learn's precomputed neighbour graphs) is refused: knng takes dense ones."""
    if scipy.sparse.issparse(D):
        raise TypeError(f"{name} is a sparse {type(D).__name__}: with metric='precomputed' knng takes a dense "
                        f"distance matrix; pass {name}.toarray() (absent entries mean no edge in scikit-learn's "
                        "precomputed graphs, which knng does not read)")
    if isinstance(D, torch.Tensor):
        if not D.is_floating_point():
            D = D.to(torch.float64)
        negative = bool((D < 0).any())
    else:
        if D.dtype.kind != "f" or D.dtype == np.float16:
            D = D.astype(np.float64)
        negative = bool((D < 0).any())
    if negative:
        raise ValueError(f"Negative values in data passed to precomputed distance matrix {name}.")
    return D


def _precomputed_neighbors(D: Any, k: int) -> tuple[Any, Any]:
    """Each row's k smallest entries of the distance matrix ``D`` by (distance, index).

    Nothing is computed: the given values are the distances, so the answer is exact by
    definition; a stable sort by value orders ties by the smaller index, knng's total order
    (the engine's ``sort_by_distance_then_index`` for tensors, which stay on their device;
    NumPy's stable argsort for arrays, which reads read-only memory maps without a copy).
    """
    if isinstance(D, torch.Tensor):
        cols = torch.arange(D.shape[1], device=D.device).expand(D.shape[0], -1)
        return sort_by_distance_then_index(D, cols, k)
    ind = np.argsort(D, axis=1, kind="stable")[:, :k].astype(np.int64)
    return ind, np.take_along_axis(D, ind, axis=1)


def _precomputed_within(D: Any, radius: Any, sort_results: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The entries of the distance matrix ``D`` at most ``radius`` (one, or one a row): flat
    rows, columns and values on the host, each row by index, or by (value, index)."""
    D = _to_numpy(D)
    r = np.asarray(radius, dtype=np.float64)
    rows, cols = np.nonzero(D <= (r[:, None] if r.ndim else r))
    values = D[rows, cols]
    if sort_results:
        order = np.lexsort((cols, values, rows))
        rows, cols, values = rows[order], cols[order], values[order]
    return rows, cols, values


def _object_rows(parts: list[np.ndarray]) -> np.ndarray:
    """A 1-D object array holding each array of ``parts`` (scikit-learn's radius rows)."""
    out = np.empty(len(parts), dtype=object)
    for i, part in enumerate(parts):  # one by one: rows of equal length would make a 2-D array
        out[i] = part
    return out


def _mask_first_duplicates(indices: Any, distances: Any, k: int) -> tuple[Any, Any]:
    """scikit-learn's rule for ``kneighbors(X=None)`` on each point's k + 1 nearest (itself included).

    Drop the point itself; where it is not among its k + 1 nearest (more than k points coincide
    with it, and tied neighbours come first by index), drop the first neighbour instead ("mask
    the first duplicates", ``sklearn.neighbors.KNeighborsMixin.kneighbors``). So
    ``NearestNeighbors(n_neighbors=1).fit(np.ones((3, 1))).kneighbors()[1]`` is ``[[1], [0], [1]]``.
    """
    n = indices.shape[0]
    if isinstance(indices, torch.Tensor):
        mask = indices != torch.arange(n, device=indices.device)[:, None]
        mask[:, 0] &= ~mask.all(dim=1)
    else:
        mask = indices != np.arange(n)[:, None]
        mask[:, 0] &= ~mask.all(axis=1)
    return indices[mask].reshape(n, k), distances[mask].reshape(n, k)


# --------------------------------------------------------------------------------------------
# shared base
# --------------------------------------------------------------------------------------------


class _NeighborsFit(BaseEstimator):
    """Fitting, input handling and tags shared by every estimator (the k-neighbour ones and the
    radius ones). ``NeighborsBase`` is not inherited: scikit-learn's own ``fit`` would then take
    a knng estimator's ``_fit_X`` (possibly a torch tensor on a GPU), ``_tree`` and
    ``_fit_method`` as its own, and its abstract ``__init__``, ``_fit`` and tags would all be
    replaced here anyway.
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        name: rule for name, rule in _COMMON_CONSTRAINTS.items() if name != "n_neighbors"}

    algorithm: str
    leaf_size: int
    metric: str
    p: float | None
    metric_params: dict[str, Any] | None
    n_jobs: int | None
    device: str | torch.device
    memory_budget: int | str | None

    # -- validation ---------------------------------------------------------------------------

    def _check_params(self) -> None:
        """knng's metric for (``metric``, ``p``, ``metric_params``); the other parameters were
        checked against ``_parameter_constraints`` by ``_fit_context`` on ``fit``."""
        self._metric = _resolve_metric(self.metric, self.p, self.metric_params, type(self).__name__)

    def _validate_fit(self, X: Any, y: Any = None) -> tuple[Any, Any]:
        """Validate training data; torch tensors stay torch tensors on their device."""
        requires_y = self.__sklearn_tags__().target_tags.required
        if isinstance(X, torch.Tensor):
            X = check_tensor(X)
            if requires_y:
                # Only y goes through scikit-learn here: X must not be copied to NumPy.
                y = validate_data(
                    self, X="no_validation", y=_to_numpy(y) if isinstance(y, torch.Tensor) else y,
                    multi_output=True, y_numeric=not is_classifier(self),
                )
                if len(y) != X.shape[0]:
                    raise ValueError(
                        f"Found input variables with inconsistent numbers of samples: "
                        f"[{X.shape[0]}, {len(y)}]"
                    )
            elif hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
            self.n_features_in_ = int(X.shape[1])
            return X, y
        if requires_y:
            return validate_data(
                self, X, y, dtype=_NUMPY_DTYPES, order="C", accept_sparse="csr", multi_output=True,
                y_numeric=not is_classifier(self),
            )
        return validate_data(self, X, dtype=_NUMPY_DTYPES, order="C", accept_sparse="csr"), None

    def _validate_query(self, X: Any) -> Any:
        if isinstance(X, torch.Tensor):
            X = check_tensor(X)
            if hasattr(self, "feature_names_in_"):
                # validate_data would warn about the missing names; keep the same behaviour.
                validate_data(self, X="no_validation", reset=False)
            if X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            return X
        return validate_data(self, X, dtype=_NUMPY_DTYPES, order="C", accept_sparse="csr", reset=False)

    # -- fitting --------------------------------------------------------------------------------

    def _fit(self, X: Any, y: Any = None) -> "_KNNGNeighborsBase":
        self._check_params()
        X, y = self._validate_fit(_training_data_of(X), y)
        if y is not None and is_classifier(self):
            y = np.asarray(y)
            if y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1):
                if y.ndim != 1:
                    import warnings

                    warnings.warn(
                        "A column-vector y was passed when a 1d array was expected. Please "
                        "change the shape of y to (n_samples,), for example using ravel().",
                        DataConversionWarning,
                        stacklevel=3,
                    )
                self.outputs_2d_ = False
                y = y.reshape((-1, 1))
            else:
                self.outputs_2d_ = True
            check_classification_targets(y)
            classes = []
            encoded = np.empty(y.shape, dtype=np.intp)
            for j in range(y.shape[1]):
                classes_j, encoded[:, j] = np.unique(y[:, j], return_inverse=True)
                classes.append(classes_j)
            if self.outputs_2d_:
                self.classes_ = classes
                self._y = encoded
            else:
                self.classes_ = classes[0]
                self._y = encoded.ravel()
        elif y is not None:
            self._y = np.asarray(y)
        if self._metric == "precomputed":
            X = _check_precomputed(X)
            if X.shape[0] != X.shape[1]:
                raise ValueError(
                    f"Precomputed matrix must be square. Input is a {X.shape[0]}x{X.shape[1]} matrix.")
        self._fit_X = X
        self.n_samples_fit_ = int(X.shape[0])
        # scikit-learn's record of the algorithm run (read by its tests and tools): knng's
        # exact brute force, whatever ``algorithm`` said.
        self._fit_method = "brute"
        # As scikit-learn: "minkowski" with p = 2 is effectively "euclidean", parameters consumed.
        self.effective_metric_ = self._metric
        self.effective_metric_params_: dict[str, Any] = {}
        return self

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        # Sparse (CSR) data are read dense a block of rows at a time (knng.radius, search and
        # graph take SciPy matrices); a precomputed distance matrix must be dense.
        tags.input_tags.sparse = self.metric != "precomputed"
        tags.input_tags.allow_nan = False
        # scikit-learn's checks then pass square distance matrices, as to its own estimators.
        tags.input_tags.pairwise = self.metric == "precomputed"
        tags.input_tags.positive_only = tags.input_tags.pairwise  # distances are not negative
        tags.target_tags.multi_output = True
        return tags


class _KNNGNeighborsBase(KNeighborsMixin, _NeighborsFit):
    """``kneighbors`` and ``kneighbors_graph``, shared by the four k-neighbour estimators.

    ``KNeighborsMixin`` comes first only to be an instance of it (scikit-learn's
    ``kneighbors_graph(estimator, ...)`` checks that); this class defines every public method
    the mixin has (``kneighbors``, ``kneighbors_graph``), so none of scikit-learn's
    computations runs.
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = dict(_COMMON_CONSTRAINTS)

    n_neighbors: int
    select: str

    # -- queries --------------------------------------------------------------------------------

    def kneighbors(
        self, X: Any = None, n_neighbors: int | None = None, return_distance: bool = True
    ) -> Any:
        """Find the exact K-neighbours of points.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), default=None
            Query points (with ``metric="precomputed"``: their distances to the training
            points, (n_queries, n_samples_fit)). If None, the query points are the training
            points, each without itself, by scikit-learn's rule: of each point's
            ``n_neighbors + 1`` nearest (itself included, tied points ordered by index), the
            point itself is dropped, or, where more than ``n_neighbors`` points coincide with
            it so that it is not among them, the first one ("mask the first duplicates").
        n_neighbors : int, default=None
            Neighbours per query; default ``self.n_neighbors``.
        return_distance : bool, default=True
            Whether to return the distances too.

        Returns
        -------
        neigh_dist : ndarray or torch.Tensor of shape (n_queries, n_neighbors)
            Distances, ascending per row; only when ``return_distance=True``. float64 when the
            queries or the training data are float64 (or integers, which scikit-learn computes
            with in float64): the exact float64 distances. Otherwise float32: those rounded once.
            With ``metric="precomputed"``: the given entries, in the matrix's dtype.
        neigh_ind : ndarray or torch.Tensor of shape (n_queries, n_neighbors)
            int64 indices into the training data; ties are ordered by the smaller index.
            Both follow the kind of the queries (torch in, torch out on the same device).
        """
        check_is_fitted(self)
        if n_neighbors is None:
            n_neighbors = self.n_neighbors
        n_neighbors = _check_n_neighbors(n_neighbors)
        metric = self.effective_metric_
        options = dict(metric=metric, device=self.device, select=self.select, memory_budget=self.memory_budget)
        if X is None:
            if n_neighbors >= self.n_samples_fit_:
                raise ValueError(
                    "Expected n_neighbors < n_samples_fit, but "
                    f"n_neighbors = {n_neighbors}, n_samples_fit = {self.n_samples_fit_}, "
                    f"n_samples = {self.n_samples_fit_}"
                )
            queries = self._fit_X
            # k + 1 with each point counted, then scikit-learn's rule drops one per row: a graph
            # that excludes each point by index would keep a different duplicate than scikit-learn.
            if metric == "precomputed":
                indices, distances = _precomputed_neighbors(queries, n_neighbors + 1)
            else:
                result = knng_graph(queries, n_neighbors + 1, include_self=True, **options)
                indices, distances = result.indices, result.distances
            indices, distances = _mask_first_duplicates(indices, distances, n_neighbors)
        else:
            queries = self._validate_query(X)
            if n_neighbors > self.n_samples_fit_:
                raise ValueError(
                    "Expected n_neighbors <= n_samples_fit, but "
                    f"n_neighbors = {n_neighbors}, n_samples_fit = {self.n_samples_fit_}, "
                    f"n_samples = {queries.shape[0]}"
                )
            if metric == "precomputed":
                indices, distances = _precomputed_neighbors(_check_precomputed(queries), n_neighbors)
            else:
                result = knng_search(queries, self._fit_X, n_neighbors, **options)
                indices, distances = result.indices, result.distances
        if not return_distance:
            return indices
        if metric != "precomputed" and (_is_double(queries) or _is_double(self._fit_X)):
            distances = _exact_float64(metric, queries, self._fit_X, indices)
        return distances, indices

    def kneighbors_graph(
        self, X: Any = None, n_neighbors: int | None = None, mode: str = "connectivity"
    ) -> scipy.sparse.csr_matrix:
        """Compute the (weighted) graph of k-neighbours of points in X.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), default=None
            Query points; None means the training points, each without itself.
        n_neighbors : int, default=None
            Neighbours per query; default ``self.n_neighbors``.
        mode : {"connectivity", "distance"}, default="connectivity"
            Ones, or the distances between neighbouring points.

        Returns
        -------
        A : scipy.sparse.csr_matrix of shape (n_queries, n_samples_fit)
            Row ``i`` holds the neighbours of query ``i`` in ascending order of distance, in
            the layout of scikit-learn's ``kneighbors_graph`` (float64 data).
        """
        check_is_fitted(self)
        if n_neighbors is None:
            n_neighbors = self.n_neighbors
        if mode == "connectivity":
            ind = self.kneighbors(X, n_neighbors, return_distance=False)
            ind = _to_numpy(ind)
            data = np.ones(ind.size, dtype=np.float64)
        elif mode == "distance":
            dist, ind = self.kneighbors(X, n_neighbors, return_distance=True)
            ind = _to_numpy(ind)
            data = _to_numpy(dist).astype(np.float64).ravel()
        else:
            raise ValueError(
                'Unsupported mode, must be one of "connectivity", or "distance" but got '
                f'"{mode}" instead'
            )
        n_queries, k = ind.shape
        indptr = np.arange(n_queries + 1, dtype=np.int64) * k
        return scipy.sparse.csr_matrix(
            (data, ind.astype(np.int64).ravel(), indptr), shape=(n_queries, self.n_samples_fit_)
        )

    def _neighbors_for_vote(self, X: Any, need_distance: bool) -> tuple[np.ndarray | None, np.ndarray]:
        """Neighbour (distances as float64, indices) on the host, for voting and averaging."""
        if need_distance:
            dist, ind = self.kneighbors(X)
            return _to_numpy(dist).astype(np.float64), _to_numpy(ind)
        return None, _to_numpy(self.kneighbors(X, return_distance=False))

_COMMON_PARAMS_DOC = """
    algorithm : {"auto", "ball_tree", "kd_tree", "brute"}, default="auto"
        Accepted for scikit-learn compatibility; every value runs knng's exact brute force
        (the answer is the same for each: exact neighbours, ties by the smaller index).
    leaf_size : int, default=30
        Accepted for scikit-learn compatibility (its trees' leaf size); no effect.
    metric : str, default="minkowski"
        Distance: ``"minkowski"`` with ``p=2``, ``"euclidean"`` or ``"l2"``: Euclidean;
        ``"sqeuclidean"``; ``"cosine"``: 1 - cosine similarity; ``"correlation"`` or
        ``"pearson"``: 1 - Pearson correlation (a constant vector counts as zero: distance 1);
        ``"inner_product"``: -x·y (so that ascending means most similar); ``"precomputed"``:
        ``X`` is a square, non-negative distance matrix at ``fit`` and an
        (n_queries, n_samples_fit) one for queries, whose k smallest entries per row are the
        neighbours (ties by the smaller index). Other scikit-learn metrics and callables raise
        ``InvalidParameterError`` (a ValueError) at ``fit``.
    p : float, default=2
        Power of the Minkowski metric, used only with ``metric="minkowski"`` (as in
        scikit-learn): ``p=2`` is the Euclidean distance; any other ``p`` (1 = manhattan,
        ``inf`` = chebyshev) raises ``InvalidParameterError`` naming the metric, since knng's
        distances come from matrix products, which serve p = 2 only.
    metric_params : dict, default=None
        None or ``{}``; with ``metric="minkowski"`` also ``{"p": p}``, which overrides ``p``
        as in scikit-learn. knng's metrics take no other parameters (``InvalidParameterError``).
    n_jobs : int, default=None
        Accepted for scikit-learn compatibility; no effect on the answer. knng computes with
        torch's threads on a CPU (``torch.set_num_threads``) or on a GPU.
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
        Where to compute: "auto" uses the GPU where a GPU tensor lives, else a GPU if there is
        one, else the CPU. Can be changed after fitting (``set_params(device="cuda")``).
    select : str, default="auto"
        knng's k-selection algorithm (see ``knng.select.available()``).
    memory_budget : int or str, default=None
        Bytes the engine may use on the device (e.g. ``"4GB"``); None: a safe share of free
        memory.
"""


# --------------------------------------------------------------------------------------------
# the estimators
# --------------------------------------------------------------------------------------------


class _RadiusQueries(RadiusNeighborsMixin):
    """``radius_neighbors`` on ``knng.radius``, for :class:`NearestNeighbors` and the radius
    estimators. ``RadiusNeighborsMixin`` is inherited so that scikit-learn recognises them; its
    ``radius_neighbors_graph`` only lays out what this ``radius_neighbors`` returns."""

    radius: float

    def radius_neighbors(self, X: Any = None, radius: Any = None, return_distance: bool = True,
                         sort_results: bool = False) -> Any:
        """Find the exact neighbours within a radius of each point (``knng.radius``).

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), default=None
            Query points (with ``metric="precomputed"``: their distances to the training
            points). If None, the training points, each without itself (by index: its
            duplicates stay, as in scikit-learn).
        radius : float or array-like of shape (n_queries,), default=None
            The radius; default ``self.radius``. A pair at exactly the radius is in.
        return_distance : bool, default=True
            Whether to return the distances too.
        sort_results : bool, default=False
            Each row by (distance, index); else by index. Needs ``return_distance=True``.

        Returns
        -------
        neigh_dist : ndarray of shape (n_queries,) of arrays
            Each query's distances (float64 for float64 or integer data: the exact values;
            float32 otherwise), only when ``return_distance=True``.
        neigh_ind : ndarray of shape (n_queries,) of arrays
            Each query's int64 indices into the training data. Host arrays whatever the
            input's kind (rows of any length).
        """
        check_is_fitted(self)
        if sort_results and not return_distance:
            raise ValueError("return_distance must be True if sort_results is True.")
        radius = self.radius if radius is None else radius
        if radius is None:
            raise ValueError("radius_neighbors needs a radius: this estimator's radius is None")
        metric = self.effective_metric_
        queries = self._fit_X if X is None else self._validate_query(X)
        if metric == "precomputed":
            rows, cols, dist = _precomputed_within(queries if X is None else _check_precomputed(queries), radius,
                                                   sort_results)
        else:
            if metric not in RADIUS_METRICS:
                raise ValueError(f"radius queries serve the metrics {', '.join(map(repr, sorted(RADIUS_METRICS)))} "
                                 f"(and 'precomputed'), not {self.metric!r}")
            found = knng_radius(queries, self._fit_X, radius, metric=metric, device=self.device,
                                memory_budget=self.memory_budget, sort_results=sort_results).numpy()
            rows = np.repeat(np.arange(found.n_queries), np.diff(found.indptr))
            cols, dist = found.indices, found.distances
            if return_distance and (_is_double(queries) or _is_double(self._fit_X)):
                pairs = exact_pairs_of(get_metric(metric), as_input(queries, "X"), torch.from_numpy(rows),
                                       as_input(self._fit_X, "X"), torch.from_numpy(cols), torch.device("cpu"))
                dist = pairs.cpu().numpy()
                if sort_results:  # a GPU's evaluation may order equal distances by a last bit
                    order = np.lexsort((cols, dist, rows))
                    rows, cols, dist = rows[order], cols[order], dist[order]
        if X is None:  # each training point without itself
            keep = cols != rows
            rows, cols, dist = rows[keep], cols[keep], dist[keep]
        n_queries = int(queries.shape[0])
        bounds = np.cumsum(np.bincount(rows, minlength=n_queries))[:-1]
        neigh_ind = _object_rows(np.split(cols.astype(np.int64, copy=False), bounds))
        if not return_distance:
            return neigh_ind
        return _object_rows(np.split(dist, bounds)), neigh_ind

    def _radius_votes(self, X: Any) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """Each query's neighbours (indices) and their weights (None: uniform), for voting and
        averaging."""
        weights_rule = getattr(self, "weights", None)
        if weights_rule in (None, "uniform"):
            return self.radius_neighbors(X, return_distance=False), None
        dist, ind = self.radius_neighbors(X)
        return ind, _row_weights(dist, weights_rule)


class NearestNeighbors(_RadiusQueries, _KNNGNeighborsBase):
    __doc__ = """Unsupervised learner for exact k-nearest-neighbour and radius queries, on CPU or GPU.

    Drop-in for :class:`sklearn.neighbors.NearestNeighbors`. ``RadiusNeighborsMixin`` is
    inherited so that scikit-learn recognises the radius queries (its
    ``radius_neighbors_graph`` method is the mixin's, over :meth:`radius_neighbors`).

    Parameters
    ----------
    n_neighbors : int, default=5
        Neighbours per query for :meth:`kneighbors`.
    radius : float, default=1.0
        The radius of :meth:`radius_neighbors` and :meth:`radius_neighbors_graph` (Euclidean,
        squared Euclidean and cosine metrics, or ``"precomputed"``).
    """ + _COMMON_PARAMS_DOC + """
    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit (only for inputs with string column names).
    n_samples_fit_ : int
        Number of training samples.
    effective_metric_ : str
        The metric computed, by knng's name (``"euclidean"`` for ``"minkowski"`` with
        ``p=2`` and for ``"l2"``, ``"pearson"`` for ``"correlation"``).

    Examples
    --------
    >>> import numpy as np
    >>> from knng.estimators import NearestNeighbors
    >>> X = np.array([[0.0], [1.0], [3.0]])
    >>> nn = NearestNeighbors(n_neighbors=2, device="cpu").fit(X)
    >>> nn.kneighbors([[0.9]])[1]
    array([[1, 0]])
    """

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_KNNGNeighborsBase._parameter_constraints,
        "radius": [Interval(Real, 0, None, closed="both"), None],  # None: as scikit-learn (Isomap passes it)
    }

    def __init__(
        self,
        n_neighbors: int = 5,
        *,
        radius: float = 1.0,
        algorithm: str = "auto",
        leaf_size: int = 30,
        metric: str | Callable[..., Any] = "minkowski",
        p: float | None = 2,
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        select: str = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.select = select
        self.memory_budget = memory_budget

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None) -> "NearestNeighbors":
        """Fit the nearest neighbours estimator from the training data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training data; a torch tensor is kept as it is (same object kind and device).
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self : NearestNeighbors
            The fitted estimator.
        """
        return self._fit(X)

class KNeighborsClassifier(ClassifierMixin, _KNNGNeighborsBase):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_KNNGNeighborsBase._parameter_constraints,
        "weights": [StrOptions(set(_WEIGHTS)), callable, None],
    }

    __doc__ = """Classifier voting among the exact k nearest neighbours, on CPU or GPU.

    Drop-in for :class:`sklearn.neighbors.KNeighborsClassifier`: same predictions and
    probabilities (ties in the vote go to the smallest class label).

    Parameters
    ----------
    n_neighbors : int, default=5
        Number of neighbours that vote.
    weights : {"uniform", "distance", "inverse_square"}, callable or None, default="uniform"
        ``"uniform"``: equal votes. ``"distance"``: 1/d. ``"inverse_square"``: 1/d². With
        either of the last two, a query at distance 0 from some training points takes only
        their votes (weight 1 each). A callable maps the (n_queries, k) float64 distance array
        to weights of the same shape.
    """ + _COMMON_PARAMS_DOC + """
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,) or list of such arrays
        Class labels (one array per output for multi-output y).
    outputs_2d_ : bool
        Whether y was 2-D with more than one column at fit.
    n_features_in_ : int
        Number of features seen during fit.
    n_samples_fit_ : int
        Number of training samples.
    effective_metric_ : str
        The metric computed, by knng's name (see :class:`NearestNeighbors`).

    Examples
    --------
    >>> from knng.estimators import KNeighborsClassifier
    >>> clf = KNeighborsClassifier(n_neighbors=3, device="cpu")
    >>> clf.fit([[0.0], [1.0], [2.0], [3.0]], [0, 0, 1, 1]).predict([[1.1]])
    array([0])
    """

    def __init__(
        self,
        n_neighbors: int = 5,
        *,
        weights: WeightsType = "uniform",
        algorithm: str = "auto",
        leaf_size: int = 30,
        metric: str | Callable[..., Any] = "minkowski",
        p: float | None = 2,
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        select: str = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.select = select
        self.memory_budget = memory_budget

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any) -> "KNeighborsClassifier":
        """Fit the classifier from the training data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training data; a torch tensor is kept as it is.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Target labels (a torch tensor is copied to NumPy).

        Returns
        -------
        self : KNeighborsClassifier
            The fitted classifier.
        """
        return self._fit(X, y)

    def predict_proba(self, X: Any) -> np.ndarray | list[np.ndarray]:
        """Return probability estimates for the test data X.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), or None
            Test samples; None means the training samples, each without itself.

        Returns
        -------
        p : ndarray of shape (n_queries, n_classes), or a list of n_outputs such arrays
            Class probabilities, columns in the order of ``classes_``.
        """
        check_is_fitted(self)
        return self._proba(X)

    def _proba(self, X: Any) -> Any:
        uniform = self.weights in (None, "uniform")
        dist, ind = self._neighbors_for_vote(X, need_distance=not uniform)
        weights = _get_weights(dist, self.weights)
        if weights is None:
            weights = np.ones(ind.shape, dtype=np.float64)
        elif _all_zero_row(weights):
            raise ValueError(
                "All neighbors of some sample is getting zero weights. Please modify 'weights' "
                "to avoid this case if you are using a user-defined function."
            )
        classes = self.classes_ if self.outputs_2d_ else [self.classes_]
        y = self._y if self.outputs_2d_ else self._y.reshape((-1, 1))
        n_queries = ind.shape[0]
        rows = np.arange(n_queries)
        probabilities = []
        for j, classes_j in enumerate(classes):
            labels = y[:, j][ind]
            proba = np.zeros((n_queries, classes_j.size))
            # One column of neighbours at a time, in neighbour order, as scikit-learn sums.
            for i, column in enumerate(labels.T):
                proba[rows, column] += weights[:, i]
            proba /= proba.sum(axis=1)[:, np.newaxis]
            probabilities.append(proba)
        return probabilities if self.outputs_2d_ else probabilities[0]

    def predict(self, X: Any) -> np.ndarray:
        """Predict the class labels for the provided data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), or None
            Test samples; None means the training samples, each without itself.

        Returns
        -------
        y : ndarray of shape (n_queries,) or (n_queries, n_outputs)
            The most voted class of each query; ties go to the smallest label.
        """
        check_is_fitted(self)
        probabilities = self._proba(X)
        if self.outputs_2d_:
            return np.stack(
                [self.classes_[j][np.argmax(p, axis=1)] for j, p in enumerate(probabilities)],
                axis=1,
            )
        return self.classes_[np.argmax(probabilities, axis=1)]

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags


class KNeighborsRegressor(RegressorMixin, _KNNGNeighborsBase):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_KNNGNeighborsBase._parameter_constraints,
        "weights": [StrOptions(set(_WEIGHTS)), callable, None],
    }

    __doc__ = """Regression by the mean target of the exact k nearest neighbours, on CPU or GPU.

    Drop-in for :class:`sklearn.neighbors.KNeighborsRegressor`.

    Parameters
    ----------
    n_neighbors : int, default=5
        Number of neighbours averaged.
    weights : {"uniform", "distance", "inverse_square"}, callable or None, default="uniform"
        As in :class:`KNeighborsClassifier`.
    """ + _COMMON_PARAMS_DOC + """
    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    n_samples_fit_ : int
        Number of training samples.
    effective_metric_ : str
        The metric computed, by knng's name (see :class:`NearestNeighbors`).

    Examples
    --------
    >>> from knng.estimators import KNeighborsRegressor
    >>> reg = KNeighborsRegressor(n_neighbors=2, device="cpu")
    >>> reg.fit([[0.0], [1.0], [2.0], [3.0]], [0.0, 0.0, 1.0, 1.0]).predict([[1.6]])
    array([0.5])
    """

    def __init__(
        self,
        n_neighbors: int = 5,
        *,
        weights: WeightsType = "uniform",
        algorithm: str = "auto",
        leaf_size: int = 30,
        metric: str | Callable[..., Any] = "minkowski",
        p: float | None = 2,
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        select: str = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.select = select
        self.memory_budget = memory_budget

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any) -> "KNeighborsRegressor":
        """Fit the regressor from the training data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training data; a torch tensor is kept as it is.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets (a torch tensor is copied to NumPy).

        Returns
        -------
        self : KNeighborsRegressor
            The fitted regressor.
        """
        return self._fit(X, y)

    def predict(self, X: Any) -> np.ndarray:
        """Predict the target for the provided data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), or None
            Test samples; None means the training samples, each without itself.

        Returns
        -------
        y : ndarray of shape (n_queries,) or (n_queries, n_outputs)
            (Weighted) mean target of the neighbours, float64.
        """
        check_is_fitted(self)
        uniform = self.weights in (None, "uniform")
        dist, ind = self._neighbors_for_vote(X, need_distance=not uniform)
        weights = _get_weights(dist, self.weights)
        y = self._y.reshape((-1, 1)) if self._y.ndim == 1 else self._y
        if weights is None:
            y_pred = np.mean(y[ind], axis=1)
        else:
            y_pred = np.empty((ind.shape[0], y.shape[1]), dtype=np.float64)
            denom = np.sum(weights, axis=1)
            for j in range(y.shape[1]):
                y_pred[:, j] = np.sum(y[ind, j] * weights, axis=1) / denom
        if self._y.ndim == 1:
            y_pred = y_pred.ravel()
        return y_pred


class _GraphTransformer(ClassNamePrefixFeaturesOutMixin, TransformerMixin):
    """``fit`` and ``fit_transform`` of the two graph transformers (their ``transform`` differs:
    k neighbours, or those within a radius)."""

    n_samples_fit_: int

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None) -> Any:
        """Fit the transformer from the training data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training data; a torch tensor is kept as it is.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self
            The fitted transformer.
        """
        self._fit(X)  # type: ignore[attr-defined]
        self._n_features_out = self.n_samples_fit_
        return self

    def fit_transform(self, X: Any, y: Any = None) -> scipy.sparse.csr_matrix:
        """Fit to X, then transform X (each point's row includes itself, at distance 0).

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training set.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        Xt : scipy.sparse.csr_matrix of shape (n_samples, n_samples)
            The neighbour graph of the training set.
        """
        return self.fit(X).transform(X)  # type: ignore[attr-defined]


class KNeighborsTransformer(_GraphTransformer, _KNNGNeighborsBase):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_KNNGNeighborsBase._parameter_constraints,
        "mode": [StrOptions(set(_MODES))],
    }

    __doc__ = """Transform X into the sparse graph of its exact k nearest neighbours.

    Drop-in for :class:`sklearn.neighbors.KNeighborsTransformer`, to feed estimators that take
    a precomputed neighbour graph (``Isomap(metric="precomputed")``, ``TSNE``, ``DBSCAN``,
    ``SpectralEmbedding(affinity="precomputed_nearest_neighbors")``, ...). As in scikit-learn,
    with ``mode="distance"`` each row holds ``n_neighbors + 1`` neighbours of the query
    (counting a training point that coincides with it, such as itself in ``fit_transform``);
    with ``mode="connectivity"`` it holds ``n_neighbors``.

    Parameters
    ----------
    mode : {"distance", "connectivity"}, default="distance"
        Distances, or ones.
    n_neighbors : int, default=5
        Neighbours per sample (one more in ``"distance"`` mode, see above).
    """ + _COMMON_PARAMS_DOC + """
    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    n_samples_fit_ : int
        Number of training samples (the number of columns of the output).
    effective_metric_ : str
        The metric computed, by knng's name (see :class:`NearestNeighbors`).

    Examples
    --------
    >>> import numpy as np
    >>> from knng.estimators import KNeighborsTransformer
    >>> X = np.random.default_rng(0).normal(size=(20, 3))
    >>> KNeighborsTransformer(n_neighbors=4, device="cpu").fit_transform(X).shape
    (20, 20)
    """

    def __init__(
        self,
        *,
        mode: str = "distance",
        n_neighbors: int = 5,
        algorithm: str = "auto",
        leaf_size: int = 30,
        metric: str | Callable[..., Any] = "minkowski",
        p: float | None = 2,
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        select: str = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.mode = mode
        self.n_neighbors = n_neighbors
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.select = select
        self.memory_budget = memory_budget

    def transform(self, X: Any) -> scipy.sparse.csr_matrix:
        """Compute the (weighted) graph of neighbours for points in X.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples_transform, n_features)
            Sample data.

        Returns
        -------
        Xt : scipy.sparse.csr_matrix of shape (n_samples_transform, n_samples_fit)
            ``Xt[i, j]`` is the weight of the edge from i to j; only neighbours are stored.
        """
        check_is_fitted(self)
        add_one = self.mode == "distance"
        return self.kneighbors_graph(X, mode=self.mode, n_neighbors=self.n_neighbors + add_one)


# --------------------------------------------------------------------------------------------
# radius estimators
# --------------------------------------------------------------------------------------------

_RADIUS_CONSTRAINTS: dict[str, list[Any]] = {
    **_NeighborsFit._parameter_constraints,
    "radius": [Interval(Real, 0, None, closed="both")],
}

_RADIUS_PARAMS_DOC = """
    radius : float, default=1.0
        The radius of the queries: every training point within it (``<=``) is a neighbour,
        exactly (``knng.radius``). The metric must be Euclidean (``"minkowski"`` with ``p=2``,
        ``"euclidean"``, ``"l2"``), ``"sqeuclidean"`` (a squared radius), ``"cosine"`` or
        ``"precomputed"``.
"""


#: The parameters' documentation of the radius estimators: the common one without ``select``
#: (a radius query selects nothing).
_RADIUS_FIT_PARAMS_DOC = _COMMON_PARAMS_DOC.replace(
    _COMMON_PARAMS_DOC[_COMMON_PARAMS_DOC.index("    select :"):_COMMON_PARAMS_DOC.index("    memory_budget :")], "")


def _row_weights(dist: np.ndarray, weights: WeightsType) -> list[np.ndarray] | None:
    """:func:`_get_weights` of each row of an object array of distance rows (None: uniform)."""
    if weights in (None, "uniform"):
        return None
    return [_get_weights(np.asarray(row, dtype=np.float64)[None, :], weights)[0] for row in dist]


class RadiusNeighborsClassifier(ClassifierMixin, _RadiusQueries, _NeighborsFit):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_RADIUS_CONSTRAINTS,
        "weights": [StrOptions(set(_WEIGHTS)), callable, None],
        "outlier_label": [Integral, str, "array-like", None],
    }

    __doc__ = """Classifier voting among the exact neighbours within a radius, on CPU or GPU.

    Drop-in for :class:`sklearn.neighbors.RadiusNeighborsClassifier`: the same predictions and
    probabilities (ties in the vote go to the smallest class label).

    Parameters
    ----------""" + _RADIUS_PARAMS_DOC + """    weights : {"uniform", "distance", "inverse_square"}, callable or None, default="uniform"
        As in :class:`KNeighborsClassifier`.
    outlier_label : {manual label, "most_frequent"} or None, default=None
        The label of a query without a neighbour: a label (or one per output), the most
        frequent training label, or None: such a query raises ``ValueError``.""" + _RADIUS_FIT_PARAMS_DOC + """
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,) or list of such arrays
        Class labels (one array per output).
    outlier_label_ : list
        The label given to queries without neighbours, one per output (None: an error).
    outputs_2d_ : bool
        Whether y was 2-D with more than one column at fit.
    n_samples_fit_ : int
        Number of training samples.
    effective_metric_ : str
        The metric computed, by knng's name.

    Examples
    --------
    >>> from knng.estimators import RadiusNeighborsClassifier
    >>> clf = RadiusNeighborsClassifier(radius=1.5, device="cpu")
    >>> clf.fit([[0.0], [1.0], [2.0], [3.0]], [0, 0, 1, 1]).predict([[0.4]])
    array([0])
    """

    def __init__(
        self,
        radius: float = 1.0,
        *,
        weights: WeightsType = "uniform",
        algorithm: str = "auto",
        leaf_size: int = 30,
        p: float | None = 2,
        metric: str | Callable[..., Any] = "minkowski",
        outlier_label: Any = None,
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.radius = radius
        self.weights = weights
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.p = p
        self.metric = metric
        self.outlier_label = outlier_label
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.memory_budget = memory_budget

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any) -> "RadiusNeighborsClassifier":
        """Fit the classifier from the training data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training data; a torch tensor is kept as it is.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Target labels.

        Returns
        -------
        self : RadiusNeighborsClassifier
            The fitted classifier.
        """
        self._fit(X, y)
        classes = self.classes_ if self.outputs_2d_ else [self.classes_]
        if self.outlier_label is None:
            labels: list[Any] | None = None
        elif isinstance(self.outlier_label, str) and self.outlier_label == "most_frequent":
            y2 = self._y if self.outputs_2d_ else self._y.reshape((-1, 1))
            labels = [classes[j][np.bincount(y2[:, j]).argmax()] for j in range(len(classes))]
        else:
            given = self.outlier_label
            if np.ndim(given) == 0 or isinstance(given, str):
                labels = [given] * len(classes)
            else:
                labels = list(given)
                if len(labels) != len(classes):
                    raise ValueError(f"The length of outlier_label: {given} is inconsistent with the output "
                                     f"length: {len(classes)}")
            for label, classes_j in zip(labels, classes):
                if not (np.ndim(label) == 0 or isinstance(label, str)):
                    raise TypeError(f"The outlier_label of classes {classes_j} is supposed to be a scalar, got "
                                    f"{label}.")
                if np.append(classes_j, label).dtype != classes_j.dtype:
                    raise TypeError(f"The dtype of outlier_label {label} is inconsistent with classes {classes_j} "
                                    "in y.")
        self.outlier_label_ = labels
        return self

    def predict_proba(self, X: Any) -> np.ndarray | list[np.ndarray]:
        """Return probability estimates for the test data X.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), or None
            Test samples; None means the training samples, each without itself.

        Returns
        -------
        p : ndarray of shape (n_queries, n_classes), or a list of n_outputs such arrays
            Class probabilities, columns in the order of ``classes_``; a query without
            neighbours has probability 1 for the outlier label (0 everywhere where that label
            is not a training class, with a warning).
        """
        check_is_fitted(self)
        ind, weights = self._radius_votes(X)
        n_queries = len(ind)
        outliers = np.flatnonzero([len(row) == 0 for row in ind])
        if self.outlier_label_ is None and outliers.size:
            raise ValueError(f"No neighbors found for test samples {outliers!r}, you can try using larger radius, "
                             "giving a label for outliers, or considering removing them from your dataset.")
        classes = self.classes_ if self.outputs_2d_ else [self.classes_]
        y = self._y if self.outputs_2d_ else self._y.reshape((-1, 1))
        probabilities = []
        for j, classes_j in enumerate(classes):
            proba = np.zeros((n_queries, classes_j.size))
            for i, row in enumerate(ind):
                if len(row):
                    proba[i] = np.bincount(y[row, j], None if weights is None else weights[i],
                                           minlength=classes_j.size)
            if outliers.size:
                label = self.outlier_label_[j]
                at = np.flatnonzero(classes_j == label)
                if at.size == 1:
                    proba[outliers, at[0]] = 1.0
                else:
                    import warnings

                    warnings.warn(f"Outlier label {label} is not in training classes. All class probabilities of "
                                  "outliers will be assigned with 0.", stacklevel=2)
            norm = proba.sum(axis=1)[:, np.newaxis]
            norm[norm == 0.0] = 1.0
            probabilities.append(proba / norm)
        return probabilities if self.outputs_2d_ else probabilities[0]

    def predict(self, X: Any) -> np.ndarray:
        """Predict the class labels for the provided data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), or None
            Test samples; None means the training samples, each without itself.

        Returns
        -------
        y : ndarray of shape (n_queries,) or (n_queries, n_outputs)
            The most voted class of each query (ties: the smallest label); queries without
            neighbours get the outlier label.
        """
        probabilities = self.predict_proba(X)
        classes = self.classes_ if self.outputs_2d_ else [self.classes_]
        probs = probabilities if self.outputs_2d_ else [probabilities]
        n_queries = probs[0].shape[0]
        y_pred = np.empty((n_queries, len(classes)), dtype=classes[0].dtype)
        for j, (proba, classes_j) in enumerate(zip(probs, classes)):
            y_pred[:, j] = classes_j.take(proba.argmax(axis=1))
            empty = np.flatnonzero((proba == 0).all(axis=1))
            if empty.size:
                y_pred[empty, j] = self.outlier_label_[j]
        return y_pred if self.outputs_2d_ else y_pred.ravel()

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags


class RadiusNeighborsRegressor(RegressorMixin, _RadiusQueries, _NeighborsFit):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_RADIUS_CONSTRAINTS,
        "weights": [StrOptions(set(_WEIGHTS)), callable, None],
    }

    __doc__ = """Regression by the mean target of the exact neighbours within a radius, on CPU or GPU.

    Drop-in for :class:`sklearn.neighbors.RadiusNeighborsRegressor`.

    Parameters
    ----------""" + _RADIUS_PARAMS_DOC + """    weights : {"uniform", "distance", "inverse_square"}, callable or None, default="uniform"
        As in :class:`KNeighborsClassifier`.""" + _RADIUS_FIT_PARAMS_DOC + """
    Attributes
    ----------
    n_samples_fit_ : int
        Number of training samples.
    effective_metric_ : str
        The metric computed, by knng's name.

    Examples
    --------
    >>> from knng.estimators import RadiusNeighborsRegressor
    >>> reg = RadiusNeighborsRegressor(radius=1.0, device="cpu")
    >>> reg.fit([[0.0], [1.0], [2.0], [3.0]], [0.0, 0.0, 1.0, 1.0]).predict([[1.5]])
    array([0.5])
    """

    def __init__(
        self,
        radius: float = 1.0,
        *,
        weights: WeightsType = "uniform",
        algorithm: str = "auto",
        leaf_size: int = 30,
        p: float | None = 2,
        metric: str | Callable[..., Any] = "minkowski",
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.radius = radius
        self.weights = weights
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.p = p
        self.metric = metric
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.memory_budget = memory_budget

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any) -> "RadiusNeighborsRegressor":
        """Fit the regressor from the training data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features)
            Training data; a torch tensor is kept as it is.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets.

        Returns
        -------
        self : RadiusNeighborsRegressor
            The fitted regressor.
        """
        return self._fit(X, y)

    def predict(self, X: Any) -> np.ndarray:
        """Predict the target for the provided data.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features), or None
            Test samples; None means the training samples, each without itself.

        Returns
        -------
        y : ndarray of shape (n_queries,) or (n_queries, n_outputs)
            (Weighted) mean target of the neighbours, float64; NaN, with a warning, for a query
            without neighbours.
        """
        check_is_fitted(self)
        ind, weights = self._radius_votes(X)
        y = self._y.reshape((-1, 1)) if self._y.ndim == 1 else self._y
        empty = np.full(y.shape[1], np.nan)
        if weights is None:
            rows = [np.mean(y[row, :], axis=0) if len(row) else empty for row in ind]
        else:
            rows = [np.average(y[row, :], axis=0, weights=weights[i]) if len(row) else empty
                    for i, row in enumerate(ind)]
        y_pred = np.array(rows, dtype=np.float64).reshape(len(ind), y.shape[1])
        if np.isnan(y_pred).any():
            import warnings

            warnings.warn("One or more samples have no neighbors within specified radius; predicting NaN.",
                          stacklevel=2)
        return y_pred.ravel() if self._y.ndim == 1 else y_pred


class RadiusNeighborsTransformer(_GraphTransformer, _RadiusQueries, _NeighborsFit):
    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_RADIUS_CONSTRAINTS,
        "mode": [StrOptions(set(_MODES))],
    }

    __doc__ = """Transform X into a sparse graph of its exact neighbours within a radius, on CPU or GPU.

    Drop-in for :class:`sklearn.neighbors.RadiusNeighborsTransformer`.

    Parameters
    ----------
    mode : {"distance", "connectivity"}, default="distance"
        The stored values: distances, or ones.""" + _RADIUS_PARAMS_DOC + \
        _RADIUS_FIT_PARAMS_DOC + """
    Attributes
    ----------
    n_samples_fit_ : int
        Number of training samples.
    effective_metric_ : str
        The metric computed, by knng's name.

    Examples
    --------
    >>> from knng.estimators import RadiusNeighborsTransformer
    >>> t = RadiusNeighborsTransformer(radius=1.5, device="cpu")
    >>> t.fit_transform([[0.0], [1.0], [3.0]]).toarray()
    array([[0., 1., 0.],
           [1., 0., 0.],
           [0., 0., 0.]])
    """

    def __init__(
        self,
        *,
        mode: str = "distance",
        radius: float = 1.0,
        algorithm: str = "auto",
        leaf_size: int = 30,
        metric: str | Callable[..., Any] = "minkowski",
        p: float | None = 2,
        metric_params: dict[str, Any] | None = None,
        n_jobs: int | None = None,
        device: str | torch.device = "auto",
        memory_budget: int | str | None = None,
    ) -> None:
        self.mode = mode
        self.radius = radius
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.device = device
        self.memory_budget = memory_budget

    def transform(self, X: Any) -> scipy.sparse.csr_matrix:
        """The graph of each point's neighbours within the radius, sorted by distance.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples_transform, n_features)
            Sample data.

        Returns
        -------
        Xt : scipy.sparse.csr_matrix of shape (n_samples_transform, n_samples_fit)
            Only neighbours are stored (a point at distance 0 from itself included).
        """
        check_is_fitted(self)
        return self.radius_neighbors_graph(X, mode=self.mode, sort_results=True)
