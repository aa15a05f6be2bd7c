"""Diffusion maps on the exact k-NN graph: :class:`DiffusionMap`.

The application the GPU-cluster k-NN graph papers were built for: an affinity kernel from the
exponential of the k-NN distances, the α ("Laplace–Beltrami") normalisation, the diffusion
(Markov) matrix and its leading eigenvectors as coordinates. ``docs/MANIFOLD.md`` has the maths,
the choices below and where they depart from the papers. In short:

- **kernel** on the union of the w-NN relations plus the diagonal:
  ``K_ij = exp(-s_ij / ε)`` (or ``exp(-s_ij / (σ_i σ_j))``, self-tuning) when ``j`` is among the
  ``w`` nearest of ``i`` or ``i`` among those of ``j``, ``K_ii = 1``; ``s`` is the squared distance
  (``2 d`` for cosine and Pearson: the squared chord of the unit vectors). The width ``w`` follows
  ε: the fewest columns (at most ``n_neighbors``, 40 by default) for which what a row leaves out
  is below ``kernel_tol`` of its largest entry;
- **ε "auto"**: the 0.97 quantile of the points' squared 5th-neighbour distances, or where larger
  the ε at which a typical row's kernel keeps e⁻⁵ of its nearest's weight at its widest column
  (the Berry–Giannakis–Harlim slope, which locks onto the noise floor of noisy data, is ``"bgh"``);
- **α**: ``K⁽ᵅ⁾ = K / (q_i q_j)^α`` with ``q = K 1``; ``P = D⁻¹ K⁽ᵅ⁾`` with ``D = diag(K⁽ᵅ⁾ 1)``;
  α = 1 (Laplace–Beltrami, the papers' choice) by default;
- **eigenproblem** on the symmetric conjugate ``A = D^(-1/2) K⁽ᵅ⁾ D^(-1/2)`` (same eigenvalues as
  ``P``; ``ψ = D^(-1/2) v`` normalised so that ``ψ₀ ≡ 1`` and ``Σ_i π_i ψ_k(i)² = 1``): SciPy's
  ``eigsh`` (ARPACK) on the CPU, a thick-restart Lanczos with full reorthogonalisation in torch on
  a GPU (:func:`lanczos_eigsh`, also runnable on CPU tensors), dense ``eigh`` for tiny sets; where
  the iteration does not converge, shift-invert about 1 (:func:`shift_invert_eigsh`); true
  residuals ``‖A v − λ v‖`` are checked and reported, and embedded eigenvalues at 1 are warned of;
- the trivial pair (λ₀ = 1, ψ₀ constant) is computed, checked, reported and left out of the
  embedding; each eigenvector's entry of largest magnitude is made positive;
- unconnected data are embedded component by component (``component_labels_``), with a warning
  that says whether the k-NN graph or the kernel fell apart;
- ``transform`` is the Nyström extension ``ψ_k(x) = λ_k⁻¹ Σ_j p(x, j) ψ_k(j)``, the new points'
  kernel rows found with :func:`knng.search`.
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from knng.api import graph as knng_graph
from knng.api import search as knng_search
from knng.engine.common import resolve_device
from knng.estimators import check_tensor
from knng.metrics import get_metric
from knng.results import Graph

__all__ = [
    "DiffusionMap", "DiffusionKernel", "DiffusionReport", "EigenResult", "diffusion_kernel", "auto_epsilon",
    "quantile_epsilon", "reach_epsilon", "default_epsilon", "kernel_width", "lanczos_eigsh", "shift_invert_eigsh",
    "solve_eigenproblem",
    "DisconnectedWarning", "DegenerateSpectrumWarning", "METRICS", "EPSILON_RULES", "EIGEN_SOLVERS",
]

#: Metrics whose values are distances (``inner_product`` is not: it can be negative).
METRICS = ("euclidean", "sqeuclidean", "cosine", "pearson")
#: The named bandwidth rules ``epsilon`` accepts besides a positive number.
EPSILON_RULES = ("auto", "bgh", "self_tuning")
#: ``epsilon="auto"``: ε is the :data:`EPSILON_QUANTILE` quantile of the points' squared distances
#: to their :data:`EPSILON_NEIGHBOR`-th neighbour, so that all points but the sparsest 3 % see
#: that many neighbours within √ε. Chosen on rotations of five pictures, swiss rolls of 1,500
#: points and tori sampled 9× unevenly (docs/MANIFOLD.md §1 has the grid and what each
#: choice breaks): a larger ε short-circuits the swiss roll's layers, a smaller one strands the
#: torus's sparse half.
EPSILON_QUANTILE = 0.97
EPSILON_NEIGHBOR = 5
#: ``epsilon="auto"`` is also at least the median over points of (s_iw − s_i1) / this, with w the
#: kernel's widest column (``n_neighbors``, at most :data:`DEFAULT_N_NEIGHBORS`) and s_i1 the nearest neighbour's squared
#: distance: in a typical row the kernel's last column keeps e⁻⁵ (0.7 %) of the nearest's weight,
#: so ε does not make the kernel narrower than the width cap lets it be. Where distances grow
#: fast with the neighbour's rank (rotations of smooth pictures: the kernel fell to e⁻⁶–e⁻⁹ by
#: the 40th column) the quantile alone left the embedding at 0.997–0.998; data whose kernel
#: still holds e⁻¹–e⁻⁵ there (sharp pictures, the rolls, the uneven torus) keep the quantile's
#: ε, which a larger one would over-smooth (docs/MANIFOLD.md §1).
EPSILON_REACH = 5.0
#: Default ``kernel_tol``: every kernel entry left out of a row is below this fraction of the row's
#: largest off-diagonal entry (when ``n_neighbors`` allows).
DEFAULT_KERNEL_TOL = 1e-4
#: Default ``n_neighbors``: the most neighbours a row of the kernel takes to reach ``kernel_tol``
#: (the graph is computed with this many when fitting from X). A cap, measured (docs/MANIFOLD.md
#: §1) between two failures: a global ε wide enough for the sparse half of an unevenly sampled
#: torus over-smooths its dense half when the kernel keeps its whole Gaussian tail (256 columns:
#: concentration 0.63–0.98 over three samples; 24 columns: 0.95; 40: 0.98), and on rotations of
#: ``hubble_deep_field`` 64 columns reach across to other angles (0.991, against 0.9994 at
#: 24–48). Also the widest column :data:`EPSILON_REACH` is read at when ``n_neighbors`` is larger.
DEFAULT_N_NEIGHBORS = 40
#: Default ``saturation``: the kernel's columns stop where a typical row's squared distance passes
#: this fraction of the median squared distance between unrelated points (random pairs). A
#: picture whose fine detail decorrelates within a few degrees of rotation has its neighbours'
#: distances near those of unrelated rotations long before the 40th column (500 rotations of
#: ``hubble_deep_field``: the median row's 40th at 90 % of them), and such columns say nothing of
#: where along the manifold a point lies: the leading coordinates mixed the angle with other
#: modes (0.08–0.17), and stopping at half gave 0.996–0.999 (docs/MANIFOLD.md §1). Where the
#: distances grow slowly (the rolls, the torus, smooth pictures: the 40th column at 2–50 % of
#: unrelated pairs) nothing changes.
DEFAULT_SATURATION = 0.5
#: Random pairs :func:`unrelated_distance` measures, and the values it copies at a time.
UNRELATED_PAIRS = 4096
UNRELATED_CHUNK_VALUES = 1 << 22
#: Eigenvalues within this distance of 1 beyond the trivial one mean a kernel that is
#: numerically disconnected (parts joined by weights at the rounding level): never returned silently.
DEGENERATE_GAP = 1e-9
#: ``eigen_solver`` names: "auto" is "torch" on a CUDA device, "scipy" on the CPU.
EIGEN_SOLVERS = ("auto", "scipy", "torch")
#: Grid step of the "auto" ε search, in octaves (a factor 2^(1/4) between candidates).
EPSILON_GRID_STEP = 0.25
#: Entries of the kernel the "auto" ε sums over at most (an even stride through them beyond):
#: S(ε) is a sum, a regular sample of 2M terms estimates its log-slope to far better than the
#: grid's resolution, and bounds the cost at 1M × k = 32 points to a fraction of the kernel's.
EPSILON_MAX_TERMS = 1 << 21
#: Default eigen_tol: the largest residual ‖A v − λ v‖ accepted (‖A‖ ≤ 1, so it is relative).
#: Eigenvectors are then accurate to about eigen_tol / (the gap to the rest of the spectrum).
DEFAULT_EIGEN_TOL = 1e-10
#: Default restarts of the Krylov subspace (ARPACK's ``maxiter`` counts the same thing).
DEFAULT_MAX_ITER = 1000
#: Seed of the start vector of both iterative eigensolvers: results do not depend on it beyond
#: eigen_tol, but a fixed one makes every run bit-reproducible on a device.
START_SEED = 0


# --------------------------------------------------------------------------------------------
# Argument checks (each names its argument)
# --------------------------------------------------------------------------------------------


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _check_real(value: Any, name: str, *, lower: float, lower_open: bool, upper: float | None = None) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    bad = not math.isfinite(value) or value < lower or (lower_open and value == lower) or (
        upper is not None and value > upper)
    if bad:
        where = f"{'>' if lower_open else '≥'} {lower:g}" + (f" and ≤ {upper:g}" if upper is not None else "")
        raise ValueError(f"{name} must be a finite number {where}, got {value!r}")
    return value


def check_epsilon(epsilon: Any) -> float | str:
    """``epsilon`` as given: one of :data:`EPSILON_RULES`, or a finite number > 0."""
    if isinstance(epsilon, str):
        if epsilon not in EPSILON_RULES:
            raise ValueError(f"epsilon must be 'auto', 'bgh', 'self_tuning' or a number > 0, got {epsilon!r}")
        return epsilon
    return _check_real(epsilon, "epsilon", lower=0.0, lower_open=True)


def check_metric(metric: Any) -> str:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)} for a diffusion map (a kernel of "
                         f"distances), got {metric!r}")
    return str(metric)


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


def squared_distances(distances: torch.Tensor, metric: str) -> torch.Tensor:
    """The squared distance the Gaussian kernel takes, float64, from k-NN distances.

    Euclidean: d². sqeuclidean: d itself. Cosine and Pearson: 2 d, the squared chord between the
    (centred) unit vectors, ‖x̂ − ŷ‖² = 2 (1 − cos), so that the kernel stays Gaussian in a
    Euclidean distance rather than in its square.
    """
    d = distances.to(torch.float64)
    if metric == "euclidean":
        return d * d
    if metric == "sqeuclidean":
        return d.clamp_min(0.0)
    return 2.0 * d.clamp_min(0.0)  # rounding can leave -0.0 or a tiny negative for equal vectors


def union_edges(indices: torch.Tensor, sq: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The symmetric kernel pattern: ``{i, j}`` when either is a k-NN of the other, plus ``(i, i)``.

    Returns ``(rows, cols, sq)`` sorted by row then column, one entry per edge and direction;
    where both directions were found, the smaller squared distance is kept (both are the same
    exact float64 distance rounded to float32, so they agree; the rule only makes the choice
    independent of order).
    """
    dev = indices.device
    k = indices.shape[1]
    src = torch.arange(n, device=dev).repeat_interleave(k)
    dst = indices.reshape(-1).to(torch.int64)
    s = sq.reshape(-1)
    diag = torch.arange(n, device=dev)
    rows = torch.cat([src, dst, diag])
    cols = torch.cat([dst, src, diag])
    values = torch.cat([s, s, torch.zeros(n, dtype=s.dtype, device=dev)])
    keys = rows * n + cols
    # Smallest value per key: a stable sort by value, then a stable sort by key, keeps each key's
    # smallest value first.
    order = torch.argsort(values, stable=True)
    keys, values = keys[order], values[order]
    order = torch.argsort(keys, stable=True)
    keys, values = keys[order], values[order]
    first = torch.ones(keys.numel(), dtype=torch.bool, device=dev)
    first[1:] = keys[1:] != keys[:-1]
    keys, values = keys[first], values[first]
    return keys // n, keys % n, values


def auto_epsilon(sq: torch.Tensor, n: int, *, step: float = EPSILON_GRID_STEP,
                 max_terms: int = EPSILON_MAX_TERMS) -> tuple[float, float]:
    """The bandwidth ε that maximises ``d log S / d log ε`` (Berry, Giannakis & Harlim 2015).

    ``S(ε) = Σ_ij exp(−s_ij / ε)`` over the kernel's entries: ``n`` diagonal ones plus the
    off-diagonal squared distances ``sq``. On the scales where the kernel resolves the manifold,
    S grows like ε^(m/2) for an m-dimensional manifold; far below, only the diagonal is left, far
    above, every entry is 1: the slope falls to 0 at both ends and its maximum picks the scale.

    Parameters
    ----------
    sq : torch.Tensor
        Squared distances of the off-diagonal kernel entries (each edge in both directions).
    n : int
        Number of points (the diagonal's contribution).
    step : float
        Grid step in octaves; the maximum is refined by a parabola through its neighbours.
    max_terms : int
        Positive entries summed at most (an even stride through them beyond, scaled up).

    Returns
    -------
    (epsilon, dimension) : tuple of float
        The chosen ε and twice the maximum slope, the criterion's estimate of the manifold's
        dimension. ε is 1.0 (and the dimension 0) when every distance is zero.
    """
    positive = sq[sq > 0]
    constant = float(n + (sq.numel() - positive.numel()))  # the diagonal and zero distances: always 1
    if positive.numel() == 0:
        return 1.0, 0.0
    scale = 1.0
    if positive.numel() > max_terms:
        stride = -(-positive.numel() // max_terms)
        scale = positive.numel() / positive[::stride].numel()
        positive = positive[::stride]
    lo = math.floor(math.log2(float(positive.min())) / step) * step - 2.0
    hi = math.ceil(math.log2(float(positive.max())) / step) * step + 2.0
    grid = torch.arange(lo, hi + step / 2, step, dtype=torch.float64)
    sums = torch.stack([torch.exp(-positive / 2.0 ** float(g)).sum() for g in grid]).cpu()
    log_s = torch.log(constant + scale * sums)
    slope = torch.diff(log_s) / (step * math.log(2.0))  # d log S / d log ε at the midpoints
    i = int(torch.argmax(slope))
    where = float(grid[i]) + step / 2
    if 0 < i < slope.numel() - 1:  # parabola through the maximum and its neighbours
        a, b, c = (float(v) for v in slope[i - 1:i + 2])
        curvature = a - 2 * b + c
        if curvature < 0:
            where += step * 0.5 * (a - c) / curvature
    return float(2.0 ** where), 2.0 * float(slope[i])


def self_tuning_sigma(sq_graph: torch.Tensor, neighbor: int) -> torch.Tensor:
    """σ_i: the distance from each point to its ``neighbor``-th nearest other point.

    Zero distances (a point with that many duplicates) get the smallest positive σ, so that
    ``exp(−s/(σ_i σ_j))`` stays defined; if every σ is zero the data are one point repeated.
    """
    sigma = sq_graph[:, neighbor - 1].sqrt()
    positive = sigma[sigma > 0]
    if positive.numel() == 0:
        raise ValueError(f"epsilon='self_tuning': every point's {neighbor}-th neighbour is at distance 0 "
                         "(sigma_neighbor); the points coincide, there is nothing to embed")
    return torch.where(sigma > 0, sigma, positive.min())


def _csr(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    """A torch CSR matrix from (row-sorted) COO entries, without the beta-state warnings."""
    crow = torch.zeros(n + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=n), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta state"
        return torch.sparse_csr_tensor(crow, cols, values, size=(n, n), check_invariants=False)


def _row_sums(matrix: torch.Tensor) -> torch.Tensor:
    # A sparse product rather than index_add_: index_add_ uses atomics on a GPU, whose order
    # (and so the rounding of each sum) changes from run to run; the CSR product does not.
    ones = torch.ones(matrix.shape[1], 1, dtype=matrix.dtype, device=matrix.device)
    return (matrix @ ones).reshape(-1)


@dataclass(frozen=True, eq=False)
class DiffusionKernel:
    """The diffusion kernel of a k-NN graph and its α-normalised symmetric conjugate.

    All tensors live on one device; entries are row-sorted COO (``rows``, ``cols``), the kernel's
    pattern being symmetric. ``kernel`` is K, ``conjugate`` is A = D^(-1/2) K⁽ᵅ⁾ D^(-1/2);
    ``density`` is q = K 1 and ``degree`` is D's diagonal, K⁽ᵅ⁾ 1.
    """

    n: int
    rows: torch.Tensor
    cols: torch.Tensor
    kernel: torch.Tensor
    conjugate: torch.Tensor
    density: torch.Tensor
    degree: torch.Tensor
    alpha: float
    epsilon: float | None
    sigma: torch.Tensor | None
    #: 2 × the maximal log-log slope when ε was chosen automatically, else None.
    dimension_estimate: float | None
    #: Off-diagonal entries that underflowed to 0 and were dropped.
    dropped: int
    #: Graph columns the kernel took (the union of the ``width``-NN relations).
    width: int = 0
    #: Largest bound over rows of an entry left out, relative to the row's largest off-diagonal
    #: entry (:func:`kernel_width`); 0 when nothing was left out, None with self-tuning.
    tail: float | None = None
    #: Rows whose bound is above ``kernel_tol`` (the graph had too few columns for them).
    rows_over_tol: int = 0

    @property
    def nnz(self) -> int:
        return int(self.rows.numel())

    @property
    def stationary(self) -> torch.Tensor:
        """π = d / Σ d, the stationary distribution of the diffusion P = D⁻¹ K⁽ᵅ⁾."""
        return self.degree / self.degree.sum()

    def conjugate_csr(self) -> torch.Tensor:
        """A as a torch sparse CSR matrix on the kernel's device."""
        return _csr(self.rows, self.cols, self.conjugate, self.n)

    def to_scipy(self, which: str = "conjugate") -> Any:
        """``"kernel"`` (K), ``"conjugate"`` (A) or ``"transition"`` (P) as a SciPy CSR matrix."""
        import scipy.sparse

        rows, cols = self.rows.cpu().numpy(), self.cols.cpu().numpy()
        if which == "kernel":
            values = self.kernel
        elif which == "conjugate":
            values = self.conjugate
        elif which == "transition":  # P_ij = A_ij sqrt(d_j / d_i)
            values = self.conjugate * (self.degree[self.cols] / self.degree[self.rows]).sqrt()
        else:
            raise ValueError(f"which must be 'kernel', 'conjugate' or 'transition', got {which!r}")
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=self.n), out=indptr[1:])
        return scipy.sparse.csr_matrix((values.cpu().numpy(), cols, indptr), shape=(self.n, self.n))


def quantile_epsilon(sq_graph: torch.Tensor, n_neighbors: int, quantile: float = EPSILON_QUANTILE) -> float:
    """ε = the ``quantile`` of the points' squared distances to their ``n_neighbors``-th neighbour.

    A global bandwidth at the scale of the sparse regions but the last few %: there every point
    still has about ``n_neighbors`` neighbours within √ε, so the kernel graph stays connected
    with weights well above rounding, where a rule fitted to the typical point strands the
    sparse parts (their eigenvectors then localise there). Measured against the
    Berry–Giannakis–Harlim slope, which on noisy data locks onto the noise floor, in
    docs/MANIFOLD.md §1. Zero distances (duplicates) fall back to the largest positive one.

    Parameters
    ----------
    sq_graph : torch.Tensor
        (n, k) squared distances of the k-NN graph, each row ascending, ``k ≥ n_neighbors``.
    n_neighbors : int
        Which neighbour's distance: column ``n_neighbors − 1``.
    quantile : float
        In (0, 1].

    Returns
    -------
    float
        ε > 0 (1.0 when every distance is zero).
    """
    kth = sq_graph[:, n_neighbors - 1].to(torch.float64).cpu().numpy()
    eps = float(np.quantile(kth, quantile))
    if eps > 0:
        return eps
    top = float(sq_graph.max())
    return top if top > 0 else 1.0


def reach_epsilon(sq_graph: torch.Tensor, reach: float = EPSILON_REACH) -> float:
    """The ε at which a typical row's kernel keeps e^−``reach`` of its nearest neighbour's weight
    at its last column: the median over rows of (s_iw − s_i1) / ``reach`` for the (n, w) squared
    distances ``sq_graph`` (each row ascending). ``epsilon="auto"`` takes at least this (see
    :data:`EPSILON_REACH`); 0 for a graph of one column."""
    if sq_graph.shape[1] < 2 or sq_graph.shape[0] == 0:
        return 0.0
    spread = (sq_graph[:, -1] - sq_graph[:, 0]).to(torch.float64)
    return float(spread.median()) / reach


def unrelated_distance(X: np.ndarray | torch.Tensor, metric: str, pairs: int = UNRELATED_PAIRS) -> float:
    """The median squared distance (the kernel's ``s``: :func:`squared_distances`) between
    ``pairs`` random pairs of distinct rows of ``X``: how far apart unrelated points are. The
    pairs are drawn with a fixed seed, so a fit is reproducible; rows without a direction (zero
    under cosine, constant under Pearson) are left out; 0 where none is left."""
    n, d = int(X.shape[0]), int(X.shape[1])
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, n, (2, pairs))
    keep = first != second
    first, second = first[keep], second[keep]
    rule = get_metric(metric)
    # In chunks: float64 copies of 4,096 of the papers' 15,876-pixel images take 0.5 GB a side.
    chunk = max(1, UNRELATED_CHUNK_VALUES // max(1, d))
    found = []
    for at in range(0, len(first), chunk):
        a, b = (rule.unit_rows(_rows64(X, index[at:at + chunk])) for index in (first, second))
        sq = ((a - b) ** 2).sum(dim=1)
        zero = rule.zero_rows(a)  # the squared chord of the unit vectors, 2 (1 − cos), needs both
        if zero is not None:
            sq = sq[(zero + rule.zero_rows(b)) == 0]
        found.append(sq)
    sq = torch.cat(found) if found else torch.zeros(0, dtype=torch.float64)
    return float(sq.median()) if sq.numel() else 0.0


def _rows64(X: np.ndarray | torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """Rows ``index`` of ``X`` as a float64 tensor (on ``X``'s device for a tensor)."""
    if isinstance(X, torch.Tensor):
        return X[torch.as_tensor(index, device=X.device)].to(torch.float64)
    return torch.from_numpy(np.asarray(X[index], dtype=np.float64))


def saturation_width(sq_graph: torch.Tensor, unrelated: float, saturation: float,
                     fewest: int = EPSILON_NEIGHBOR) -> int:
    """The leading graph columns a kernel may take before a typical row saturates: those whose
    median squared distance over the rows is at most ``saturation`` times ``unrelated``
    (:func:`unrelated_distance`), and at least ``fewest`` (at most all of ``sq_graph``'s)."""
    k = sq_graph.shape[1]
    if k == 0 or unrelated <= 0:
        return k
    medians = sq_graph.median(dim=0).values  # non-decreasing: every row is
    within = int((medians <= saturation * unrelated).sum())
    return max(min(fewest, k), within)


def default_epsilon(sq_graph: torch.Tensor, n_neighbors: int) -> float:
    """``epsilon="auto"``: the larger of :func:`quantile_epsilon` (the :data:`EPSILON_NEIGHBOR`-th
    neighbour, at most ``n_neighbors``) and :func:`reach_epsilon` at the kernel's widest column,
    ``n_neighbors`` but at most :data:`DEFAULT_N_NEIGHBORS`: a kernel allowed more columns keeps
    the default's ε (on swiss rolls the reach of a 100th column crosses the layers), and so
    spends them on the Gaussian tail that ``kernel_tol`` asks for."""
    return max(quantile_epsilon(sq_graph, min(EPSILON_NEIGHBOR, n_neighbors)),
               reach_epsilon(sq_graph[:, :min(n_neighbors, DEFAULT_N_NEIGHBORS)]))


def kernel_width(sq_graph: torch.Tensor, epsilon: float, tol: float, complete: bool,
                 fewest: int = 1) -> tuple[int, float, int]:
    """How many graph columns the kernel needs so that what it leaves out is below ``tol``.

    Row i leaves out neighbours beyond its ``w``-th, each of kernel value at most
    ``exp(−(s_iw − s_i1)/ε)`` times the row's largest off-diagonal entry ``exp(−s_i1/ε)`` (s_i1
    its nearest neighbour's squared distance: on noisy data every distance carries the noise
    floor, which the normalisation divides out, so the bound is relative to it). The width is
    the smallest ``w ≥ fewest`` for which every row's bound is at most ``tol``, or all the
    columns of ``sq_graph`` (the ``n_neighbors`` the kernel may take) when no width does.

    Returns
    -------
    (width, tail, rows_over)
        The width, the largest bound over rows at that width (0 when the graph is complete: no
        entry is left out), and how many rows are over ``tol``.
    """
    n, k = sq_graph.shape
    if complete:
        return k, 0.0, 0
    excess = (sq_graph - sq_graph[:, :1]) / epsilon
    threshold = math.log(1.0 / tol)
    reached = excess >= threshold
    reached[:, : fewest - 1] = False
    found = reached.any(dim=1)
    if bool(found.all()):
        width = int(reached.to(torch.int8).argmax(dim=1).max()) + 1
    else:
        width = k
    tail_rows = torch.exp(-excess[:, width - 1])
    return width, float(tail_rows.max()), int((tail_rows > tol).sum())


def diffusion_kernel(graph: Graph, *, n_neighbors: int | None = None, epsilon: float | str = "auto",
                     alpha: float = 1.0, sigma_neighbor: int = 7, kernel_tol: float | None = DEFAULT_KERNEL_TOL,
                     min_width: int = 1, device: str | torch.device = "cpu") -> DiffusionKernel:
    """The diffusion kernel of a k-NN graph (see the module docstring and ``docs/MANIFOLD.md``).

    Parameters
    ----------
    graph : knng.Graph
        A k-NN graph without self edges (``include_self=False``), in any metric of :data:`METRICS`.
    n_neighbors : int, optional
        The most graph columns a row of the kernel takes (its first ``n_neighbors``), of which
        ε ("auto") and σ ("self_tuning") are read; default all ``graph.k``.
    epsilon : "auto", "bgh", "self_tuning" or float
        The bandwidth: :func:`default_epsilon`, the Berry–Giannakis–Harlim slope
        (:func:`auto_epsilon`), per-point σ_i σ_j, or this number.
    alpha : float in [0, 1]
        0: graph Laplacian; ½: Fokker–Planck; 1: Laplace–Beltrami.
    sigma_neighbor : int
        With ``epsilon="self_tuning"``: σ_i is the distance to the ``sigma_neighbor``-th neighbour
        (at most ``n_neighbors``).
    kernel_tol : float or None
        The kernel takes the fewest of those columns for which every entry left out of a row is
        below ``kernel_tol`` times the row's largest off-diagonal entry (:func:`kernel_width`);
        None: all ``n_neighbors``. Self-tuning always takes ``n_neighbors``.
    min_width : int
        The fewest columns the kernel takes whatever ``kernel_tol`` allows (:class:`DiffusionMap`
        widens it so where fewer leave the kernel in more pieces than the graph).
    device : str or torch.device
        Where to build it.

    Returns
    -------
    DiffusionKernel
    """
    indices, distances, n, k_all = _graph_arrays(graph, None, device)
    k = k_all if n_neighbors is None else n_neighbors
    if k > k_all:
        raise ValueError(f"n_neighbors={k} is more than the graph's k={k_all}: build the graph with "
                         f"k ≥ n_neighbors or lower n_neighbors")
    sq_graph = squared_distances(distances, graph.metric)
    sigma = dimension = None
    eps: float | None = None
    width, tail, rows_over = k, None, 0
    if epsilon == "self_tuning":
        sigma = self_tuning_sigma(sq_graph[:, :k], min(sigma_neighbor, k))
    else:
        if epsilon == "auto":
            eps = default_epsilon(sq_graph[:, :k], k)
        elif epsilon == "bgh":
            rows_k, cols_k, sq_k = union_edges(indices[:, :k], sq_graph[:, :k], n)
            eps, dimension = auto_epsilon(sq_k[rows_k != cols_k], n)
        else:
            eps = float(epsilon)
        if kernel_tol is not None:
            width, tail, rows_over = kernel_width(sq_graph[:, :k], eps, kernel_tol, complete=k >= n - 1,
                                                  fewest=min(min_width, k))
    rows, cols, sq = union_edges(indices[:, :width], sq_graph[:, :width], n)
    if sigma is not None:
        kernel = torch.exp(-sq / (sigma[rows] * sigma[cols]))
    else:
        kernel = torch.exp(-sq / eps)
    keep = kernel > 0  # underflowed entries add nothing; the diagonal (1) always stays
    dropped = int((~keep).sum())
    if dropped:
        rows, cols, kernel = rows[keep], cols[keep], kernel[keep]
    density = _row_sums(_csr(rows, cols, kernel, n))
    weighted = kernel if alpha == 0 else kernel / (density[rows] * density[cols]) ** alpha
    degree = _row_sums(_csr(rows, cols, weighted, n))
    conjugate = weighted / (degree[rows] * degree[cols]).sqrt()
    return DiffusionKernel(n=n, rows=rows, cols=cols, kernel=kernel, conjugate=conjugate, density=density,
                           degree=degree, alpha=float(alpha), epsilon=eps, sigma=sigma,
                           dimension_estimate=dimension, dropped=dropped, width=width, tail=tail,
                           rows_over_tol=rows_over)


def _graph_arrays(graph: Graph, n_neighbors: int | None,
                  device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The graph's first ``n_neighbors`` columns as torch tensors on ``device``."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a knng.Graph, got {type(graph).__name__}")
    if graph.include_self:
        raise ValueError("graph must exclude each point itself (knng.graph(..., include_self=False)): the "
                         "kernel adds the diagonal on its own")
    check_metric(graph.metric)
    k = graph.k if n_neighbors is None else n_neighbors
    if k > graph.k:
        raise ValueError(f"n_neighbors={k} is more than the graph's k={graph.k}: build the graph with "
                         f"k ≥ n_neighbors or lower n_neighbors")
    if graph.n_points < 2 or k < 1:
        raise ValueError(f"a diffusion map needs at least 2 points and 1 neighbour, got a graph of "
                         f"{graph.n_points} points with k={graph.k}")
    indices = torch.as_tensor(graph.indices)[:, :k].to(device=device, dtype=torch.int64)
    distances = torch.as_tensor(graph.distances)[:, :k].to(device=device)
    n = graph.n_points
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= n):
        raise ValueError(f"graph indices must lie in [0, {n}), got values in [{int(indices.min())}, "
                         f"{int(indices.max())}]")
    if not bool(torch.isfinite(distances).all()):
        raise ValueError("graph distances contain NaN or infinity")
    return indices.contiguous(), distances.contiguous(), n, k


def connected_components(kernel: DiffusionKernel) -> tuple[int, np.ndarray]:
    """Number of connected components of the kernel's graph and each point's label (SciPy, host)."""
    import scipy.sparse
    from scipy.sparse.csgraph import connected_components as components

    n = kernel.n
    # int32 indices halve the copy to the host; the pattern is symmetric, so "weak" = "strong".
    cols = kernel.cols.to(torch.int32).cpu().numpy()
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(kernel.rows.cpu().numpy(), minlength=n), out=indptr[1:])
    pattern = scipy.sparse.csr_matrix((np.ones(cols.size, dtype=np.int8), cols, indptr), shape=(n, n))
    count, labels = components(pattern, directed=False)
    return int(count), labels


class DisconnectedWarning(UserWarning):
    """The data fall into several connected components, each embedded on its own."""


class DegenerateSpectrumWarning(UserWarning):
    """Embedded eigenvalues equal 1 to rounding: the kernel is numerically disconnected."""


def graph_components(graph: Graph, width: int) -> int:
    """Connected components of the union of the first ``width`` k-NN relations (the kernel's
    pattern before any entry underflows)."""
    import scipy.sparse
    from scipy.sparse.csgraph import connected_components as components

    idx = torch.as_tensor(graph.indices)[:, :width].cpu().numpy().astype(np.int64)
    n = graph.n_points
    pattern = scipy.sparse.csr_matrix((np.ones(idx.size, dtype=np.int8), idx.ravel(),
                                       np.arange(0, idx.size + 1, idx.shape[1])), shape=(n, n))
    return int(components(pattern, directed=False)[0])


def _relabel_by_size(labels: np.ndarray) -> np.ndarray:
    """Component labels renumbered largest first (ties: the one holding the smaller point index)."""
    sizes = np.bincount(labels)
    first = np.full(sizes.size, labels.size)
    np.minimum.at(first, labels, np.arange(labels.size))
    order = np.lexsort((first, -sizes))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[labels]


def _subkernel(kernel: DiffusionKernel, members: np.ndarray) -> DiffusionKernel:
    """The kernel restricted to one connected component (``members`` ascending).

    No entry crosses components, and the α normalisation and the degrees are row sums, so the
    restriction is the component's own diffusion kernel, entry for entry.
    """
    dev = kernel.rows.device
    index = torch.full((kernel.n,), -1, dtype=torch.int64, device=dev)
    index[torch.from_numpy(members).to(dev)] = torch.arange(len(members), device=dev)
    inside = index[kernel.rows] >= 0
    local = torch.from_numpy(members).to(dev)
    return DiffusionKernel(
        n=len(members), rows=index[kernel.rows[inside]], cols=index[kernel.cols[inside]],
        kernel=kernel.kernel[inside], conjugate=kernel.conjugate[inside], density=kernel.density[local],
        degree=kernel.degree[local], alpha=kernel.alpha, epsilon=kernel.epsilon,
        sigma=None if kernel.sigma is None else kernel.sigma[local], dimension_estimate=kernel.dimension_estimate,
        dropped=0, width=kernel.width, tail=kernel.tail, rows_over_tol=kernel.rows_over_tol)


def _disconnected_message(count: int, labels: np.ndarray, graph_count: int, n_neighbors: int,
                          kernel: DiffusionKernel, graph: Graph) -> str:
    """What is disconnected — the k-NN graph itself, or the kernel where its entries underflowed —
    and what joins it."""
    sizes = np.bincount(labels)
    shown = ", ".join(f"{s:,}" for s in sizes[:5]) + (", …" if count > 5 else "")
    layout = ("each is embedded on its own (component_labels_ gives each point's component, 0 the largest; "
              "coordinates are not comparable across components, and points of components too small for "
              "the coordinates have 0 there)")
    if graph_count < count and kernel.epsilon is not None:
        # exp(−s/ε) > 0 in float64 while s/ε < 745; 700 leaves a margin. Every entry of the
        # pattern then survives, and the kernel has exactly the graph's components.
        sq = squared_distances(torch.as_tensor(graph.distances)[:, :n_neighbors], graph.metric)
        keeps = float(sq.max()) / 700.0  # of every column the kernel may take: the width grows with ε
        auto = default_epsilon(sq, n_neighbors)
        where = "is connected" if graph_count == 1 else f"falls into {graph_count:,} components"
        return (f"the kernel falls into {count:,} connected components (sizes {shown}), but the k-NN graph it is "
                f"built on ({kernel.width} neighbours a point) {where}: {kernel.dropped:,} kernel entries "
                f"underflowed to 0 with epsilon={kernel.epsilon:g}. Use epsilon='auto' (ε = {auto:.4g} on this "
                f"graph), or at least any epsilon ≥ {keeps:.4g}, which keeps every entry; as it is, {layout}")
    if graph_count < count:
        return (f"the self-tuning kernel falls into {count:,} connected components (sizes {shown}) where the k-NN "
                f"graph has {graph_count:,}: {kernel.dropped:,} entries underflowed to 0; raise sigma_neighbor or "
                f"use epsilon='auto'. As it is, {layout}")
    return (f"the data fall into {count:,} connected components (sizes {shown}) of the k-NN graph with "
            f"{kernel.width} neighbours a point (n_neighbors={n_neighbors}): no diffusion crosses between them, "
            f"so {layout}. If they belong together, raise n_neighbors until the k-NN graph joins them")


def _degenerate_message(count: int, kernel: DiffusionKernel, n_neighbors: int) -> str:
    eps = "self-tuning σᵢσⱼ" if kernel.epsilon is None else f"epsilon={kernel.epsilon:g}"
    return (f"{count} embedded eigenvalue(s) equal 1 to within {DEGENERATE_GAP:g}: the kernel ({eps}, "
            f"n_neighbors={n_neighbors}) is connected only through entries at the rounding level, so these "
            f"coordinates label pieces of the data rather than its geometry. Use a larger epsilon "
            f"(epsilon='auto' sets it from the k-th-neighbour distances) or a larger n_neighbors")


# --------------------------------------------------------------------------------------------
# The eigenproblem
# --------------------------------------------------------------------------------------------


@dataclass
class EigenResult:
    """Leading eigenpairs of the symmetric conjugate, largest first."""

    values: np.ndarray
    #: (n, k) eigenvectors, orthonormal, on the solver's device (torch) or host (NumPy).
    vectors: Any
    residuals: np.ndarray
    solver: str
    #: Products with the sparse matrix (1 for a dense solve).
    matvecs: int = 1
    #: Restarts of the Krylov basis (torch Lanczos only; 0 otherwise).
    restarts: int = 0


def start_vector(n: int) -> torch.Tensor:
    """The iterative solvers' start vector: seeded normal values, the same on every device.

    Random rather than ones: on symmetric data the odd eigenvectors (sin θ on a circle) can be
    orthogonal to a constant start, and a Krylov method never finds what its start lacks.
    """
    gen = torch.Generator().manual_seed(START_SEED)
    return torch.randn(n, dtype=torch.float64, generator=gen)


def krylov_size(n_eigen: int) -> int:
    """Size of the Krylov basis (ARPACK's ``ncv``) for ``n_eigen`` eigenpairs."""
    return max(2 * n_eigen + 1, n_eigen + 32)


def lanczos_eigsh(matvec: Callable[[torch.Tensor], torch.Tensor], v0: torch.Tensor, k: int, *,
                  ncv: int | None = None, tol: float = DEFAULT_EIGEN_TOL, max_restarts: int = DEFAULT_MAX_ITER,
                  on_restart: Callable[[int, float], None] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, int, int, bool]:
    """The ``k`` largest (algebraic) eigenpairs of a symmetric operator, in torch, on any device.

    Thick-restart Lanczos (Wu & Simon 2000; the symmetric Krylov–Schur method of Stewart 2001)
    with full reorthogonalisation (classical Gram–Schmidt, twice): a basis of ``ncv`` vectors is
    built, the Ritz pairs of the projected matrix computed, and the basis restarted from the
    ``k + (ncv − k) // 2`` best Ritz vectors plus the residual direction, until the ``k`` wanted
    Ritz residual estimates ``|β s_last|`` are at most ``tol``. Full reorthogonalisation costs
    O(n · ncv) per step, small next to a sparse product with k-NN rows, and keeps the basis
    orthonormal to rounding, so there are no spurious copies of converged eigenvalues.

    Parameters
    ----------
    matvec : callable
        ``x ↦ A x`` for float64 vectors of length n on ``v0``'s device; A must be symmetric.
    v0 : torch.Tensor
        Start vector (float64, length n, on the device to compute on).
    k : int
        Eigenpairs wanted, ``k < ncv < n``.
    ncv : int, optional
        Basis size (default :func:`krylov_size`).
    tol : float
        Absolute residual bound (relative when ‖A‖ ≤ 1, as for a diffusion conjugate).
    max_restarts : int
        Restarts before giving up.
    on_restart : callable, optional
        Called with (restart number, largest wanted residual estimate) after each restart.

    Returns
    -------
    (values, vectors, matvecs, restarts, converged)
        ``values`` (k,) descending on the host, ``vectors`` (n, k) on the device.
    """
    n = v0.numel()
    m = ncv or krylov_size(k)
    if not k < m < n:
        raise ValueError(f"lanczos_eigsh needs k < ncv < n, got k={k}, ncv={m}, n={n}")
    dev = v0.device
    # One basis vector per row: each is contiguous, and the Gram–Schmidt products are plain GEMVs.
    basis = torch.zeros(m + 1, n, dtype=torch.float64, device=dev)
    # The projected matrix is tiny (m × m): it lives on the host, where its eigh is cheapest.
    proj = torch.zeros(m, m, dtype=torch.float64)
    basis[0] = v0 / v0.norm()
    kept, beta_last, matvecs = 0, 0.0, 0
    fresh = torch.Generator().manual_seed(START_SEED + 1)
    theta = ritz = torch.empty(0)
    converged = False
    restart = 0
    for restart in range(1, max_restarts + 1):
        for j in range(kept, m):
            w = matvec(basis[j])
            matvecs += 1
            q = basis[: j + 1]
            h = q @ w
            w = w - h @ q
            c = q @ w  # the second pass: one pass of classical Gram–Schmidt loses orthogonality
            w = w - c @ q
            h = (h + c).cpu()
            proj[: j + 1, j] = h
            proj[j, : j + 1] = h
            beta = float(w.norm())
            if beta <= 1e-13 * max(float(h.abs().max()), 1.0):
                # An invariant subspace: go on from a new direction, coupled by a zero.
                w = torch.randn(n, dtype=torch.float64, generator=fresh).to(dev)
                for _ in range(2):
                    w = w - (q @ w) @ q
                w, beta = w / w.norm(), 0.0
            else:
                w = w / beta
            basis[j + 1] = w
            if j + 1 < m:
                proj[j + 1, j] = proj[j, j + 1] = beta
            else:
                beta_last = beta
        theta, ritz = torch.linalg.eigh(proj)
        theta, ritz = theta.flip(0), ritz.flip(1)
        estimates = (beta_last * ritz[m - 1, :]).abs()
        worst = float(estimates[:k].max())
        if on_restart is not None:
            on_restart(restart, worst)
        if worst <= tol:
            converged = True
            break
        if restart == max_restarts:
            break
        kept = k + (m - k) // 2
        basis[:kept] = ritz[:, :kept].T.to(dev) @ basis[:m]
        basis[kept] = basis[m]
        arrow = beta_last * ritz[m - 1, :kept]
        proj.zero_()
        proj[range(kept), range(kept)] = theta[:kept]
        proj[kept, :kept] = arrow
        proj[:kept, kept] = arrow
    vectors = (ritz[:, :k].T.to(dev) @ basis[:m]).T.contiguous()
    return theta[:k].clone(), vectors, matvecs, restart, converged


#: What to change when even the shift-invert fallback fails.
_SLOW_HINT = ("Leading eigenvalues packed against 1 mean parts joined by a few weak kernel entries: raise "
              "n_neighbors or epsilon (epsilon='auto' sets it from the k-th-neighbour distances), or raise "
              "max_iter or eigen_tol to let the solver run longer")
#: Shift-invert's σ above 1: the top of A's spectrum (at most 1) maps to 1/(λ − σ), and eigenvalues
#: packed within 1e-6 of 1 come apart by factors instead of by 1e-6.
SHIFT_ABOVE_ONE = 1e-5


def shift_invert_eigsh(matrix: Any, k: int, tol: float, v0: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The ``k`` largest eigenpairs of a sparse symmetric matrix with spectrum ≤ 1, by shift-invert.

    ARPACK on ``(A − σI)⁻¹`` with σ = 1 + :data:`SHIFT_ABOVE_ONE`: the eigenvalues nearest σ, which
    are the largest, become the best separated, so it converges in a few restarts where the plain
    iteration stalls on eigenvalues crowded against 1. The price is a sparse LU factorisation of
    ``A − σI`` (SuperLU), which is why it is the fallback and not the first try.

    Returns
    -------
    (values, vectors, factorisations)
    """
    import scipy.sparse
    from scipy.sparse.linalg import eigsh

    sigma = 1.0 + SHIFT_ABOVE_ONE
    values, vectors = eigsh(scipy.sparse.csc_matrix(matrix), k=k, sigma=sigma, which="LM", v0=v0, tol=tol,
                            ncv=krylov_size(k), maxiter=DEFAULT_MAX_ITER)
    return values, vectors, 1


def trivial_vector(kernel: DiffusionKernel) -> torch.Tensor:
    """√π, the conjugate's eigenvector of eigenvalue 1 (unit length: π sums to 1)."""
    return kernel.stationary.sqrt()


def _with_trivial_pair(matrix_times: Callable[[Any], Any], trivial: Any, values: Any, vectors: Any,
                       cat: Callable[..., Any]) -> tuple[Any, Any]:
    """The known trivial pair (√π, its Rayleigh quotient) ahead of the deflated solver's pairs."""
    value = (trivial * matrix_times(trivial)).sum()
    return cat([value.reshape(1), values]), cat([trivial.reshape(-1, 1), vectors], 1)


def _eigen_scipy(kernel: DiffusionKernel, k: int, tol: float, max_iter: int,
                 on_restart: Callable[[int, float], None] | None) -> EigenResult:
    return _eigen_host(kernel.to_scipy("conjugate"), k, tol, max_iter, on_restart,
                       trivial=trivial_vector(kernel).cpu().numpy())


def _eigen_host(matrix: Any, k: int, tol: float, max_iter: int,
                on_restart: Callable[[int, float], None] | None, first: str = "scipy (ARPACK eigsh)",
                trivial: np.ndarray | None = None) -> EigenResult:
    """ARPACK on the host, then shift-invert where ARPACK does not converge.

    With ``trivial`` (√π) ARPACK looks for the other ``k − 1`` pairs in the deflated operator
    (see :func:`solve_eigenproblem`); shift-invert, which factorises the sparse matrix itself,
    solves for all ``k``.
    """
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    matvecs = [0]
    wanted = k if trivial is None else k - 1
    basis = krylov_size(wanted)
    n = matrix.shape[0]

    def product(x: np.ndarray) -> np.ndarray:
        matvecs[0] += 1
        if on_restart is not None and matvecs[0] % basis == 0:
            on_restart(matvecs[0] // basis, math.nan)  # ARPACK does not say its residuals
        if trivial is None:
            return matrix @ x
        # The projection by an elementwise sum, not ``trivial @ x``: NumPy's BLAS has its own
        # thread pool beside the one ARPACK's BLAS (SciPy's) runs in, and alternating the two
        # every product left each pool's spinning threads in the other's way (30,000 points:
        # 4 ms a product instead of 0.02 on 2 cores, ARPACK 4.1 s against 0.6; 17 s against 1 on 16).
        return matrix @ x - (2.0 * (trivial * x).sum()) * trivial

    # Through an operator that counts the products (ARPACK does not say how many it ran).
    operator = LinearOperator(matrix.shape, matvec=product, dtype=np.float64)
    v0 = start_vector(n).numpy()
    solver = first
    try:
        values, vectors = eigsh(operator, k=wanted, which="LA", v0=v0, tol=tol, ncv=basis, maxiter=max_iter)
    except ArpackNoConvergence as exc:
        trivial = None  # shift-invert below solves for all k
        converged = len(exc.eigenvalues)
        try:
            values, vectors, _ = shift_invert_eigsh(matrix, k, tol, v0)
        except (ArpackNoConvergence, MemoryError, RuntimeError) as again:
            raise RuntimeError(
                f"the eigensolver did not converge: ARPACK did not reach eigen_tol={tol:g} in max_iter={max_iter} "
                f"restarts ({converged} of {k} eigenpairs converged), and shift-invert about 1 failed too "
                f"({type(again).__name__}: {again}). {_SLOW_HINT}") from None
        solver = f"{first} → shift-invert (ARPACK did not converge in max_iter={max_iter})"
    order = np.argsort(-values, kind="stable")
    values, vectors = values[order], vectors[:, order]
    if trivial is not None:  # first, even where a degenerate λ₁ rounds above its λ₀
        values, vectors = _with_trivial_pair(lambda x: matrix @ x, trivial, values, vectors, np.concatenate)
    residuals = np.linalg.norm(matrix @ vectors - vectors * values, axis=0)
    return EigenResult(values, vectors, residuals, solver, matvecs[0])


def _eigen_torch(kernel: DiffusionKernel, k: int, tol: float, max_iter: int,
                 on_restart: Callable[[int, float], None] | None) -> EigenResult:
    matrix = kernel.conjugate_csr()

    def matvec(x: torch.Tensor) -> torch.Tensor:
        return (matrix @ x.unsqueeze(1)).squeeze(1)

    trivial = trivial_vector(kernel)

    def deflated(x: torch.Tensor) -> torch.Tensor:  # see solve_eigenproblem
        return matvec(x) - 2.0 * trivial * (trivial @ x)

    values, vectors, matvecs, restarts, converged = lanczos_eigsh(
        deflated, start_vector(kernel.n).to(kernel.conjugate.device), k - 1, tol=tol, max_restarts=max_iter,
        on_restart=on_restart)
    if converged:
        values, vectors = _with_trivial_pair(matvec, trivial, values.to(trivial.device), vectors, torch.cat)
        values = values.cpu()
    else:
        # The Lanczos stalls where ARPACK does (eigenvalues crowded against 1): finish on the host
        # by shift-invert, and bring the vectors back to the kernel's device.
        host = _eigen_host(kernel.to_scipy("conjugate"), k, tol, 1, None,
                           first=f"torch (thick-restart Lanczos, not converged in max_iter={max_iter})")
        host.vectors = torch.from_numpy(np.ascontiguousarray(host.vectors)).to(kernel.conjugate.device)
        host.matvecs += matvecs
        host.restarts = restarts
        return host
    residuals = (matrix @ vectors - vectors * values.to(vectors.device)).norm(dim=0).cpu().numpy()
    return EigenResult(values.numpy(), vectors, residuals, "torch (thick-restart Lanczos)", matvecs, restarts)


def _eigen_dense(kernel: DiffusionKernel, k: int, use_torch: bool) -> EigenResult:
    """Tiny sets (the Krylov basis would span the whole space): every eigenpair, densely."""
    if use_torch:
        dense = kernel.conjugate_csr().to_dense()
        values, vectors = torch.linalg.eigh(dense)
        values, vectors = values.flip(0)[:k], vectors.flip(1)[:, :k]
        residuals = (dense @ vectors - vectors * values).norm(dim=0).cpu().numpy()
        return EigenResult(values.cpu().numpy(), vectors, residuals, "torch (dense eigh)")
    dense = kernel.to_scipy("conjugate").toarray()
    values, vectors = np.linalg.eigh(dense)
    values, vectors = values[::-1][:k].copy(), vectors[:, ::-1][:, :k].copy()
    residuals = np.linalg.norm(dense @ vectors - vectors * values, axis=0)
    return EigenResult(values, vectors, residuals, "numpy (dense eigh)")


def solve_eigenproblem(kernel: DiffusionKernel, k: int, *, solver: str = "auto", tol: float = DEFAULT_EIGEN_TOL,
                       max_iter: int = DEFAULT_MAX_ITER,
                       on_restart: Callable[[int, float], None] | None = None) -> EigenResult:
    """The ``k`` largest eigenpairs of the kernel's symmetric conjugate (the trivial one first).

    ``solver``: "scipy" (ARPACK ``eigsh`` on the host), "torch" (:func:`lanczos_eigsh` on the
    kernel's device) or "auto" (torch on a CUDA device, SciPy on the CPU). Sets of at most
    :func:`krylov_size` points are solved densely (NumPy or torch ``eigh``) whatever the solver.
    ``on_restart(count, residual)`` follows the iterations: torch calls it after each restart with
    the largest wanted Ritz residual, SciPy every ``ncv`` products with NaN (ARPACK keeps its
    residuals to itself).

    The trivial pair is known before any iteration: A √π = √π (π the stationary distribution), with
    λ₀ = 1. The iterative solvers take it as given and look for the other ``k − 1`` pairs in the
    deflated operator A − 2 √π √πᵀ, where √π has eigenvalue −1, at the bottom. Without it a
    spectrum degenerate at 1 (parts joined only by entries at the rounding level) hides from a
    Krylov method: a single start vector sees one direction of an eigenspace, the solver returns
    one eigenvalue 1 where there are two, and the trivial vector it returns is a mixture of the
    parts, not constant.
    """
    if solver not in EIGEN_SOLVERS:
        raise ValueError(f"eigen_solver must be one of {', '.join(EIGEN_SOLVERS)}, got {solver!r}")
    use_torch = solver == "torch" or (solver == "auto" and kernel.conjugate.device.type == "cuda")
    if kernel.n <= krylov_size(k):
        return _eigen_dense(kernel, k, use_torch)
    if use_torch:
        return _eigen_torch(kernel, k, tol, max_iter, on_restart)
    return _eigen_scipy(kernel, k, tol, max_iter, on_restart)


def fix_signs(vectors: np.ndarray) -> np.ndarray:
    """Each column times ±1 so that its entry of largest magnitude (the first, on ties) is positive."""
    rows = np.argmax(np.abs(vectors), axis=0)
    signs = np.sign(vectors[rows, np.arange(vectors.shape[1])])
    signs[signs == 0] = 1.0
    return vectors * signs


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


@dataclass
class DiffusionReport:
    """How a diffusion map was computed: the bandwidth, the spectrum, the checks and the times.

    ``eigenvalues`` and ``residuals`` hold every computed pair, largest first: the trivial one
    (λ₀ = 1), the ``n_components`` embedded, and one more when the set allows, for ``eigengap``.
    """

    n: int
    n_neighbors: int
    metric: str
    device: str
    solver: str
    epsilon: float | None
    epsilon_rule: str
    dimension_estimate: float | None
    sigma_neighbor: int | None
    alpha: float
    t: float
    kernel_entries: int
    kernel_entries_underflowed: int
    #: Graph columns the kernel took, the largest relative bound of what it left out of a row
    #: (None with self-tuning), and the rows over ``kernel_tol``.
    kernel_neighbors: int
    kernel_tail: float | None
    kernel_rows_over_tol: int
    #: Graph columns the ``saturation`` rule allowed the kernel (None: not applied).
    saturation_columns: int | None
    #: Connected components of the kernel graph (each embedded on its own), their sizes
    #: (largest first; ``component_labels_`` numbers them so), and of the k-NN graph alone.
    components: int
    component_sizes: list[int]
    graph_components: int
    eigenvalues: list[float]
    residuals: list[float]
    #: |λ₀ − 1| and max_i |ψ₀(i) − 1|: how exactly the trivial pair came out. The iterative
    #: solvers take ψ₀ as known (:func:`solve_eigenproblem`), so there its error is rounding and
    #: λ₀ = √πᵀ A √π checks the kernel's normalisation.
    trivial_eigenvalue_error: float
    trivial_vector_error: float
    #: 1 − λ₁: how fast the diffusion mixes; small means slow, well-separated structure.
    spectral_gap: float
    #: λ_m − λ_{m+1} after the last embedded coordinate (None when not computed): a small gap
    #: means the last coordinates mix with the next ones.
    eigengap: float | None
    matvecs: int
    restarts: int
    #: The eigenvalues (trivial first) of every component, largest component first.
    component_eigenvalues: list[list[float]] = field(default_factory=list)
    #: Warnings issued by the fit (disconnected data, a degenerate spectrum), in words.
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# The estimator
# --------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_tensor(X: torch.Tensor, min_samples: int) -> torch.Tensor:
    """A torch tensor validated as the estimators validate one, then in a floating type (the
    kernel and Nyström's arithmetic run in it)."""
    X = check_tensor(X, min_samples=min_samples)
    return X if X.is_floating_point() else X.to(torch.float64)


class DiffusionMap(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Diffusion-map embedding on knng's exact k-NN graph, on the CPU or a GPU.

    The coordinates of point i are ``(λ₁ᵗ ψ₁(i), …, λ_mᵗ ψ_m(i))``, the leading non-trivial
    eigenpairs of the diffusion matrix ``P = D⁻¹ K⁽ᵅ⁾`` built on the exact k-NN graph; see the
    module docstring and ``docs/MANIFOLD.md`` for the maths and its choices.

    Parameters
    ----------
    n_components : int, default=2
        Coordinates m (the trivial constant eigenvector is not one of them); at most n − 1.
    n_neighbors : int, optional
        The most neighbours a point's row of the kernel takes: ``fit(X)`` computes a k-NN graph
        of ``n_neighbors`` columns, of which the kernel takes the fewest that ``kernel_tol``
        asks. Default 40 (:data:`DEFAULT_N_NEIGHBORS`, a measured cap: with a global ε the whole
        Gaussian tail over-smooths densely sampled regions and reaches across a manifold's folds;
        docs/MANIFOLD.md §1), or all the columns of a graph passed to :meth:`fit` with fewer.
        Fewer neighbours keep the kernel more local: rotations of a picture nearly symmetric
        under a half turn give the angle θ at 10 and 2θ at 20–40. Sets of n ≤ n_neighbors points
        use n − 1 (every pair, the classical dense diffusion map). The kernel is symmetric: the
        union of the k-NN relations (an edge when either point is among the other's
        neighbours), plus the diagonal.
    metric : {"euclidean", "sqeuclidean", "cosine", "pearson"}, default="euclidean"
        Distance of the graph. The kernel takes squared Euclidean distances: d², d itself for
        ``sqeuclidean``, and 2d (the squared chord of the unit vectors) for cosine and Pearson.
    epsilon : "auto", "bgh", "self_tuning" or float, default="auto"
        Kernel bandwidth in ``exp(−s/ε)``. "auto": the 0.97 quantile of the points' squared
        distances to their 5th neighbour (robust to pixel noise and to uneven sampling), or,
        where larger, the ε at which a typical row's kernel keeps e⁻⁵ of its nearest's weight at
        its widest column (``n_neighbors``, at most 40; docs/MANIFOLD.md §1). "bgh": the ε
        maximising d log S / d log ε with S(ε) = Σ_ij K_ε(i, j) over the k-NN pairs (Berry, Giannakis & Harlim 2015; the default before: it locks onto the
        noise floor of noisy data). A number: that ε (in squared distance units). "self_tuning":
        ``exp(−s_ij/(σ_i σ_j))``, σ_i the distance to point i's ``sigma_neighbor``-th neighbour
        (Zelnik-Manor & Perona 2004).
    alpha : float in [0, 1], default=1.0
        Density normalisation K⁽ᵅ⁾ = K/(q_i q_j)^α, q = K 1: 0 gives the normalised graph
        Laplacian, ½ the Fokker–Planck operator, 1 the Laplace–Beltrami operator, free of the
        sampling density (the choice of the GPU-cluster papers).
    t : float ≥ 0, default=1
        Diffusion time: coordinates are scaled by λᵗ (t = 0 gives the eigenvectors ψ themselves).
    sigma_neighbor : int, default=7
        The neighbour whose distance is σ_i with ``epsilon="self_tuning"`` (at most n_neighbors).
    kernel_tol : float in (0, 1], default=1e-4
        The kernel takes graph columns until every entry it leaves out of a row is below
        ``kernel_tol`` times the row's largest off-diagonal entry (``report_.kernel_tail`` says
        what it reached), within ``n_neighbors``; where fewer would leave the kernel in more
        connected pieces than the k-NN graph, the fewest that do not.
    saturation : float in (0, 1] or None, default=0.5
        The kernel takes only the leading graph columns whose squared distance, for the median
        row, is at most this fraction of the median squared distance between random pairs of the
        training points: neighbours nearly as far apart as unrelated points say nothing of where
        along the manifold a point lies (sparsely sampled data with fine detail: rotations of a
        textured picture). ``report_.saturation_columns`` says how many it allowed; the kernel
        widens (up to ``n_neighbors``) where fewer would cut it into more pieces than the k-NN
        graph. None: no such limit. Not applied when fitting on a Graph alone (no vectors).
    eigen_solver : {"auto", "scipy", "torch"}, default="auto"
        "scipy": ARPACK on the host. "torch": thick-restart Lanczos on the device (GPU or CPU).
        "auto": torch on a CUDA device, SciPy on the CPU. Tiny sets are solved densely.
    eigen_tol : float, default=1e-10
        Largest residual ‖A v − λ v‖ accepted for every eigenpair.
    max_iter : int, default=1000
        Restarts of the Krylov subspace before the solver turns to shift-invert about 1; only if
        that fails too does ``fit`` raise (RuntimeError, saying what to change).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device, default="auto"
        Where the graph, the kernel and (with the torch solver) the eigenproblem are computed.
    progress : bool, default=False
        Progress bars on standard error (the graph's, then the eigensolver's restarts).

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
        The coordinates λ_kᵗ ψ_k of the training points, float64. With several connected
        components, each point's coordinates in its own component's map (0 where a component
        has fewer than n_components + 1 points).
    eigenvalues_ : ndarray of shape (n_components,)
        λ₁ ≥ … ≥ λ_m, the non-trivial eigenvalues of P (not raised to t); of the largest
        component when there are several (``report_.component_eigenvalues`` has them all).
    component_labels_ : ndarray of shape (n_samples,)
        Each point's connected component, numbered by size (0 the largest); all 0 when connected.
    n_components_found_ : int
        Connected components of the kernel graph, each embedded on its own.
    kernel_neighbors_ : int
        Graph columns the kernel took (its width).
    eigenvectors_ : ndarray of shape (n_samples, n_components)
        ψ₁ … ψ_m, right eigenvectors of P normalised so that Σ_i π_i ψ_k(i)² = 1 (π the stationary
        distribution); the entry of largest magnitude of each is positive.
    epsilon_ : float or None
        The bandwidth used (None with "self_tuning").
    n_neighbors_ : int
        The most neighbours a kernel row could take: ``n_neighbors`` (its default: 40, or the
        columns of a graph passed to :meth:`fit`), at most n − 1.
    n_iter_ : int
        Products with the sparse conjugate the eigensolver ran (1 for a dense solve).
    report_ : DiffusionReport
        Eigenvalues with the trivial one, residuals, spectral gap, components, ε and its rule,
        the time split graph / kernel / eigensolver.
    graph_ : knng.Graph
        The k-NN graph the kernel was built on.
    n_features_in_ : int
        Number of features seen during fit (not set when fitted on a Graph).

    Examples
    --------
    >>> import numpy as np, knng
    >>> angle = np.linspace(0, 2 * np.pi, 200, endpoint=False)
    >>> X = np.c_[np.cos(angle), np.sin(angle)]
    >>> dm = knng.DiffusionMap(n_components=2, n_neighbors=10, device="cpu").fit(X)
    >>> dm.embedding_.shape
    (200, 2)
    """

    def __init__(self, n_components: int = 2, *, n_neighbors: int | None = None, metric: str = "euclidean",
                 epsilon: float | str = "auto", alpha: float = 1.0, t: float = 1.0, sigma_neighbor: int = 7,
                 kernel_tol: float = DEFAULT_KERNEL_TOL, saturation: float | None = DEFAULT_SATURATION,
                 eigen_solver: str = "auto", eigen_tol: float = DEFAULT_EIGEN_TOL, max_iter: int = DEFAULT_MAX_ITER,
                 device: str | torch.device = "auto", progress: bool = False) -> None:
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.epsilon = epsilon
        self.alpha = alpha
        self.t = t
        self.sigma_neighbor = sigma_neighbor
        self.kernel_tol = kernel_tol
        self.saturation = saturation
        self.eigen_solver = eigen_solver
        self.eigen_tol = eigen_tol
        self.max_iter = max_iter
        self.device = device
        self.progress = progress

    # -- validation -------------------------------------------------------------------------------

    def _check_params(self) -> None:
        _check_int(self.n_components, "n_components", 1)
        if self.n_neighbors is not None:
            _check_int(self.n_neighbors, "n_neighbors", 1)
        check_metric(self.metric)
        check_epsilon(self.epsilon)
        _check_real(self.alpha, "alpha", lower=0.0, lower_open=False, upper=1.0)
        _check_real(self.t, "t", lower=0.0, lower_open=False)
        _check_int(self.sigma_neighbor, "sigma_neighbor", 1)
        _check_real(self.kernel_tol, "kernel_tol", lower=0.0, lower_open=True, upper=1.0)
        if self.saturation is not None:
            _check_real(self.saturation, "saturation", lower=0.0, lower_open=True, upper=1.0)
        if self.eigen_solver not in EIGEN_SOLVERS:
            raise ValueError(f"eigen_solver must be one of {', '.join(EIGEN_SOLVERS)}, got {self.eigen_solver!r}")
        _check_real(self.eigen_tol, "eigen_tol", lower=0.0, lower_open=True)
        _check_int(self.max_iter, "max_iter", 1)

    def _device(self, X: Any) -> torch.device:
        if isinstance(self.device, str) and self.device == "auto" and isinstance(X, torch.Tensor) \
                and X.device.type == "cuda":
            return X.device
        return resolve_device(self.device)

    def _n_neighbors_for(self, n: int, graph_k: int | None = None) -> int:
        """``n_neighbors``, or its default (all of a graph's ``graph_k`` columns up to 40), at most n − 1."""
        if self.n_neighbors is not None:
            return min(self.n_neighbors, n - 1)
        default = DEFAULT_N_NEIGHBORS if graph_k is None else min(DEFAULT_N_NEIGHBORS, graph_k)
        return min(default, n - 1)

    def graph_neighbors(self, n_samples: int) -> int:
        """The k of the k-NN graph :meth:`fit` computes for ``n_samples`` points.

        ``n_neighbors`` (default 40), at most ``n_samples − 1``.
        A graph you pass to :meth:`fit` with ``X`` gives the same result when it has at least
        this k (a Graph alone too, but for the ``saturation`` limit, which needs the vectors).

        Parameters
        ----------
        n_samples : int
            Number of training points.

        Returns
        -------
        int
        """
        self._check_params()
        return self._n_neighbors_for(n_samples)

    def _check_n_components(self, n: int) -> None:
        if self.n_components > n - 1:
            raise ValueError(f"n_components={self.n_components} must be less than the number of samples "
                             f"(n_samples={n}): the embedding leaves out the trivial eigenvector")

    # -- fitting ------------------------------------------------------------------------------------

    def fit(self, X: Any, y: Any = None, *, graph: Graph | None = None) -> "DiffusionMap":
        """Compute the embedding of the training points.

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_samples, n_features), or knng.Graph
            Training data (a torch tensor stays on its device), or a precomputed k-NN graph
            (``include_self=False``, metric equal to ``metric``, k ≥ ``n_neighbors``): then
            :meth:`transform` is not available, having no training vectors to search.
        y : Ignored
            Not used, present for API consistency.
        graph : knng.Graph, optional
            The k-NN graph of ``X`` if you have it already (saves computing it).

        Returns
        -------
        self : DiffusionMap
            The fitted estimator.
        """
        self._check_params()
        seconds: dict[str, float] = {}
        t0 = time.perf_counter()
        if isinstance(X, Graph):
            graph, self._fit_X = X, None
            for name in ("n_features_in_", "feature_names_in_"):
                if hasattr(self, name):
                    delattr(self, name)
            n = graph.n_points
            dev = resolve_device(self.device)
        else:
            X = _check_tensor(X, 2) if isinstance(X, torch.Tensor) else validate_data(
                self, X, dtype=[np.float64, np.float32], ensure_min_samples=2)
            if isinstance(X, torch.Tensor):
                self.n_features_in_ = int(X.shape[1])
            n = int(X.shape[0])
            dev = self._device(X)
            self._fit_X = X
        self._check_n_components(n)
        k = self._n_neighbors_for(n, None if graph is None else graph.k)
        if graph is None:
            graph = knng_graph(X, self.graph_neighbors(n), metric=self.metric, device=dev,
                               progress=bool(self.progress))
        else:
            self._check_graph(graph, n)
        _sync(dev)
        seconds["graph"] = time.perf_counter() - t0

        t1 = time.perf_counter()
        columns = self._unsaturated_columns(graph, k, dev)

        def kernel_of(n_columns: int, min_width: int) -> DiffusionKernel:
            return diffusion_kernel(graph, n_neighbors=n_columns, epsilon=self.epsilon, alpha=self.alpha,
                                    sigma_neighbor=self.sigma_neighbor, kernel_tol=self.kernel_tol,
                                    min_width=min_width, device=dev)

        kernel = kernel_of(columns, 1)
        count, labels = connected_components(kernel)
        graph_count = count if count == 1 else graph_components(graph, k)
        if graph_count < count and kernel.width < k:
            # The columns kernel_tol or the saturation left out joined what the narrower kernel
            # leaves apart: a truncation must not cut the data into pieces, so the kernel takes
            # the fewest columns up to n_neighbors that keep it in as many as the k-NN graph
            # (a wider kernel only adds edges; all n_neighbors took sparse rotations back to the
            # saturated columns: 300 rotations of hubble_deep_field, 0.08 against 0.97).
            low, high = kernel.width + 1, k
            while low < high:
                middle = (low + high) // 2
                if connected_components(kernel_of(middle, middle))[0] <= graph_count:
                    high = middle
                else:
                    low = middle + 1
            kernel = kernel_of(high, high)
            count, labels = connected_components(kernel)
        notes: list[str] = []
        if count > 1:
            labels = _relabel_by_size(labels)
            notes.append(_disconnected_message(count, labels, graph_count, k, kernel, graph))
            warnings.warn(notes[-1], DisconnectedWarning, stacklevel=2)
        _sync(dev)
        seconds["kernel"] = time.perf_counter() - t1

        t2 = time.perf_counter()
        parts = []
        with _RestartBar(self.progress) as bar:
            for c in range(count):
                members = np.flatnonzero(labels == c) if count > 1 else None
                part = kernel if members is None else _subkernel(kernel, members)
                n_eigen = min(self.n_components + 2, part.n)  # trivial pair, coordinates, one for the gap
                eig = solve_eigenproblem(part, n_eigen, solver=self.eigen_solver, tol=self.eigen_tol,
                                         max_iter=self.max_iter, on_restart=bar.update) if part.n > 1 else None
                parts.append((members, part, eig))
        _sync(dev)
        seconds["eigensolver"] = time.perf_counter() - t2
        self._set_embedding(graph, kernel, parts, labels, graph_count, k, seconds, str(dev), notes)
        return self

    def _unsaturated_columns(self, graph: Graph, k: int, device: torch.device) -> int:
        """The graph columns the kernel may take: ``k``, or fewer where a typical row's squared
        distance passes ``saturation`` of that between unrelated training points
        (:func:`saturation_width`, read on at most 65,536 evenly spaced rows); ``k`` when fitted
        on a Graph alone (no vectors to draw pairs from) or with ``saturation=None``."""
        if self._fit_X is None or self.saturation is None:
            self._saturation_columns = None
            return k
        unrelated = unrelated_distance(self._fit_X, graph.metric)
        step = max(1, graph.n_points // 65536)
        sample = torch.as_tensor(graph.distances)[::step, :k].to(device)
        columns = saturation_width(squared_distances(sample, graph.metric), unrelated, self.saturation)
        self._saturation_columns = columns
        return columns

    def _check_graph(self, graph: Graph, n: int) -> None:
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a knng.Graph, got {type(graph).__name__}")
        if graph.n_points != n:
            raise ValueError(f"graph has {graph.n_points} points but X has {n} samples")
        if graph.metric != self.metric:
            raise ValueError(f"graph is in metric {graph.metric!r} but metric={self.metric!r}")

    def _set_embedding(self, graph: Graph, kernel: DiffusionKernel, parts: list[Any], labels: np.ndarray,
                       graph_count: int, k: int, seconds: dict[str, float], device: str, notes: list[str]) -> None:
        """Eigenvectors of A → ψ = v / √π with fixed signs, per component; the attributes and the report."""
        m = self.n_components
        n = kernel.n
        t = float(self.t)
        psi_all = np.zeros((n, m + 1))
        point_values = np.ones((n, m))  # λ of each point's component (1 where a tiny one has none)
        component_values: list[list[float]] = []
        first_eig: EigenResult | None = None
        matvecs = restarts = 0
        trivial_vector_error = 0.0
        for members, part, eig in parts:
            if eig is None:  # a single point: ψ₀ ≡ 1 and no coordinates
                psi_all[members, 0] = 1.0
                component_values.append([1.0])
                continue
            vectors = eig.vectors.cpu().numpy() if isinstance(eig.vectors, torch.Tensor) else eig.vectors
            pi = part.stationary.cpu().numpy()
            psi = fix_signs(vectors / np.sqrt(pi)[:, None])
            values = eig.values
            used = min(m, len(values) - 1)  # a component of p ≤ m points has p − 1 coordinates
            if t != int(t) and np.any(values[1:used + 1] < 0):
                raise ValueError(f"t={t:g} is not an integer and some embedded eigenvalues are negative "
                                 f"({values[1:used + 1].min():.3g}): λᵗ is undefined; use an integer t")
            rows = slice(None) if members is None else members
            psi_all[rows, : used + 1] = psi[:, : used + 1]
            point_values[rows, :used] = values[1:used + 1]
            component_values.append([float(v) for v in values])
            matvecs += eig.matvecs
            restarts += eig.restarts
            trivial_vector_error = max(trivial_vector_error, float(np.abs(psi[:, 0] - 1.0).max()))
            if first_eig is None:
                first_eig = eig
        assert first_eig is not None  # the largest component has at least 2 points (n ≥ 2, connected pairs)
        values = first_eig.values
        degenerate = [float(v) for v in values[1:m + 1] if 1.0 - v < DEGENERATE_GAP]
        if degenerate:
            notes.append(_degenerate_message(len(degenerate), kernel, k))
            warnings.warn(notes[-1], DegenerateSpectrumWarning, stacklevel=3)
        self.graph_ = graph
        self.eigenvalues_ = values[1:m + 1].copy()
        if self.eigenvalues_.size < m:  # the largest component is smaller than the coordinates
            self.eigenvalues_ = np.r_[self.eigenvalues_, np.zeros(m - self.eigenvalues_.size)]
        self.eigenvectors_ = psi_all[:, 1:m + 1].copy()
        self.embedding_ = self.eigenvectors_ * point_values ** t
        self.component_labels_ = labels.astype(np.int64) if len(parts) > 1 else np.zeros(n, dtype=np.int64)
        self.n_components_found_ = len(parts)
        self.epsilon_ = kernel.epsilon
        self.n_neighbors_ = k
        self.kernel_neighbors_ = kernel.width
        self.n_iter_ = matvecs
        self._n_features_out = m
        self._point_values = point_values
        # What transform needs: the training densities, σ, and each point's reach (its last kernel
        # neighbour's squared distance: the union rule at the kernel's width).
        self._density = kernel.density.cpu().numpy()
        self._sigma = None if kernel.sigma is None else kernel.sigma.cpu().numpy()
        distances = torch.as_tensor(graph.distances)[:, kernel.width - 1]
        self._reach_sq = squared_distances(distances, graph.metric).cpu().numpy()
        # What transform needs to find reverse neighbours (built here: scikit-learn's contract
        # is that transform changes nothing in the estimator).
        self._reverse_indptr, self._reverse_indices = _reverse_lists(graph, kernel.width)
        rule = {"self_tuning": "self_tuning", "bgh": "bgh (Berry–Giannakis–Harlim max log-log slope)",
                "auto": f"auto (the larger of the {EPSILON_QUANTILE:g} quantile of the squared distances to "
                        f"the {_ordinal(min(EPSILON_NEIGHBOR, k))} neighbour and the width's reach)"
                }.get(self.epsilon, "given") if isinstance(self.epsilon, str) else "given"
        sizes = np.bincount(self.component_labels_, minlength=len(parts))
        self.report_ = DiffusionReport(
            n=kernel.n, n_neighbors=k, metric=graph.metric, device=device, solver=first_eig.solver,
            epsilon=kernel.epsilon, epsilon_rule=rule, dimension_estimate=kernel.dimension_estimate,
            sigma_neighbor=min(self.sigma_neighbor, k) if kernel.sigma is not None else None,
            alpha=float(self.alpha), t=t, kernel_entries=kernel.nnz, kernel_entries_underflowed=kernel.dropped,
            kernel_neighbors=kernel.width, kernel_tail=kernel.tail, kernel_rows_over_tol=kernel.rows_over_tol,
            saturation_columns=self._saturation_columns,
            components=len(parts), component_sizes=[int(v) for v in sizes], graph_components=int(graph_count),
            eigenvalues=[float(v) for v in values], residuals=[float(r) for r in first_eig.residuals],
            trivial_eigenvalue_error=abs(float(values[0]) - 1.0),
            trivial_vector_error=trivial_vector_error,
            spectral_gap=1.0 - float(values[1]) if len(values) > 1 else 0.0,
            eigengap=float(values[m] - values[m + 1]) if len(values) > m + 1 else None,
            matvecs=matvecs, restarts=restarts, component_eigenvalues=component_values, warnings=list(notes),
            seconds=seconds)

    def fit_transform(self, X: Any, y: Any = None, **fit_params: Any) -> np.ndarray:
        """Fit, and return the training points' embedding (``embedding_``).

        Parameters
        ----------
        X : array-like, torch.Tensor or knng.Graph
            As in :meth:`fit`.
        y : Ignored
            Not used, present for API consistency.
        **fit_params
            ``graph=``, as in :meth:`fit`.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        return self.fit(X, y, **fit_params).embedding_

    # -- out of sample -------------------------------------------------------------------------------

    def transform(self, X: Any) -> np.ndarray:
        """Embed new points by the Nyström extension of the eigenvectors.

        A new point x gets the kernel row a training point at its place would have: its
        ``kernel_neighbors_ + 1`` nearest training points (found with :func:`knng.search`; a
        training point finds itself first, at distance 0), plus the training points j that would
        count x among their own ``kernel_neighbors_`` (d(x, j) ≤ j's distance to its last kernel
        column: the union rule),
        looked for among the points that count x's nearest training point among theirs. The row is
        normalised with the training densities, ``p(x, j) = K⁽ᵅ⁾(x, j) / Σ_j K⁽ᵅ⁾(x, j)``, and
        ``ψ_k(x) = λ_k⁻¹ Σ_j p(x, j) ψ_k(j)``. For a training point that row is its row of P, so
        ``transform`` gives back its ``embedding_`` (to the eigensolver's residual).

        Parameters
        ----------
        X : array-like or torch.Tensor of shape (n_queries, n_features)
            New points.

        Returns
        -------
        ndarray of shape (n_queries, n_components)
            Their coordinates, float64.
        """
        check_is_fitted(self)
        if self._fit_X is None:
            raise ValueError("transform needs the training vectors, and this DiffusionMap was fitted on a "
                             "knng.Graph: fit it on the data (fit(X), or fit(X, graph=graph))")
        if isinstance(X, torch.Tensor):
            X = _check_tensor(X, 1)
            if X.shape[1] != self.n_features_in_:
                raise ValueError(f"X has {X.shape[1]} features, but DiffusionMap is expecting "
                                 f"{self.n_features_in_} features as input.")
        else:
            X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        n = self._density.shape[0]
        row_size = min(self.kernel_neighbors_ + 1, n)
        found = knng_search(X, self._fit_X, row_size, metric=self.metric, device=self._device(X))
        queries, cols, sq, first = self._kernel_rows(X, found.indices, found.distances)
        nearest = torch.as_tensor(found.indices)[:, 0].cpu().numpy().astype(np.int64)
        return self._nystrom(queries, cols, sq, first, len(found.indices), nearest)

    def _kernel_rows(self, X: Any, indices: Any, distances: Any
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The new points' kernel rows as flat (query, training point, squared distance) triples.

        ``first`` marks the searched neighbours (members whatever their distance); the others are
        the reverse-neighbour candidates, members when within the training point's reach.
        """
        idx = torch.as_tensor(indices).cpu().numpy().astype(np.int64)
        nq, width = idx.shape
        sq = squared_distances(torch.as_tensor(distances).cpu(), self.metric).numpy()
        # Candidates: the points that have x's nearest training point among their neighbours.
        nearest = idx[:, 0]
        indptr, reverse = self._reverse_indptr, self._reverse_indices
        counts = indptr[nearest + 1] - indptr[nearest]
        cand_q = np.repeat(np.arange(nq), counts)
        starts = np.repeat(indptr[nearest], counts)
        offsets = np.arange(cand_q.size) - np.repeat(np.cumsum(counts) - counts, counts)
        cand_j = reverse[starts + offsets].astype(np.int64)
        # Leave out those the search found already (keys q·n + j, looked up in the sorted set).
        n = self._density.shape[0]
        found_keys = np.sort((np.arange(nq)[:, None] * n + idx).ravel())
        keys = cand_q * n + cand_j
        pos = np.minimum(np.searchsorted(found_keys, keys), found_keys.size - 1)
        new = found_keys[pos] != keys
        cand_q, cand_j = cand_q[new], cand_j[new]
        cand_sq = self._pair_squared_distances(X, cand_q, cand_j)
        within = cand_sq <= self._reach_sq[cand_j]
        queries = np.concatenate([np.repeat(np.arange(nq), width), cand_q[within]])
        cols = np.concatenate([idx.ravel(), cand_j[within]])
        sqs = np.concatenate([sq.ravel(), cand_sq[within]])
        first = np.zeros(queries.size, dtype=bool)
        first[: nq * width] = True
        return queries, cols, sqs, first

    def _pair_squared_distances(self, X: Any, q: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Squared distances of (query, training point) pairs, as the search would return them:
        the metric's exact float64 distance rounded to float32."""
        if q.size == 0:
            return np.zeros(0)
        from knng.metrics import get_metric

        train = torch.as_tensor(self._fit_X)
        queries = torch.as_tensor(X).to(train.device)
        out = np.empty(q.size)
        chunk = 1 << 16
        for c0 in range(0, q.size, chunk):
            qq = torch.from_numpy(q[c0:c0 + chunk]).to(train.device)
            jj = torch.from_numpy(j[c0:c0 + chunk]).to(train.device)
            exact = get_metric(self.metric).exact(queries[qq], train[jj][:, None, :])[:, 0]
            out[c0:c0 + chunk] = squared_distances(exact.to(torch.float32).cpu(), self.metric).numpy()
        return out

    def _nystrom(self, queries: np.ndarray, cols: np.ndarray, sq: np.ndarray, first: np.ndarray,
                 nq: int, nearest: np.ndarray) -> np.ndarray:
        """ψ(x) = λ⁻¹ Σ_j p(x, j) ψ(j) over the flat kernel rows; returns the scaled coordinates.

        With several components a new point belongs to its nearest training point's component:
        only that component's points (and eigenvalues) enter its row, since the coordinates of
        different components are not comparable.
        """
        if self._sigma is None:
            weights = np.exp(-sq / self.epsilon_)
        else:
            # σ_x: the sigma_neighbor-th nearest training point other than x (column 0 is x itself
            # for a training point), as σ_i was for the training points.
            searched = sq[first].reshape(nq, -1)  # the search's block, row by row
            sigma_x = np.sqrt(searched[:, min(self.report_.sigma_neighbor, searched.shape[1] - 1)])
            sigma_x = np.where(sigma_x > 0, sigma_x, self._sigma.min())
            weights = np.exp(-sq / (sigma_x[queries] * self._sigma[cols]))
        if self.n_components_found_ > 1:
            labels = self.component_labels_
            weights = np.where(labels[cols] == labels[nearest][queries], weights, 0.0)
        density = np.bincount(queries, weights=weights, minlength=nq)
        if self.alpha:
            weights = weights / (density[queries] * self._density[cols]) ** self.alpha
        total = np.bincount(queries, weights=weights, minlength=nq)
        if np.any(total <= 0):
            far = int(np.flatnonzero(total <= 0)[0])
            raise ValueError(f"X row {far} is too far from every training point: its kernel row underflows "
                             f"to 0 with epsilon={self.epsilon_:g}, so it has no diffusion coordinates")
        p = weights / total[queries]
        psi = np.zeros((nq, self.n_components))
        np.add.at(psi, queries, p[:, None] * self.eigenvectors_[cols])
        values = self._point_values[nearest]
        with np.errstate(divide="ignore", invalid="ignore"):  # λ = 0 only where ψ is 0 (tiny components)
            scaled = psi * values ** (float(self.t) - 1.0)
        return np.where(np.isfinite(scaled), scaled, 0.0)

    def __sklearn_tags__(self):  # type: ignore[no-untyped-def]
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        return tags


def _ordinal(j: int) -> str:
    return f"{j}{'th' if 10 <= j % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(j % 10, 'th')}"


def _reverse_lists(graph: Graph, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For each point, the points that have it among their first ``k`` neighbours (CSR layout)."""
    # torch's sort, on the graph's device: NumPy's stable argsort of 1M × 32 ids took 10 s.
    targets = torch.as_tensor(graph.indices)[:, :k].reshape(-1).to(torch.int64)
    n = graph.n_points
    order = torch.argsort(targets, stable=True)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=targets.device)
    torch.cumsum(torch.bincount(targets, minlength=n), 0, out=indptr[1:])
    # int32 where it fits: the lists are n·k long, half the memory of int64 for 1M × 32.
    owners = torch.div(order, k, rounding_mode="floor").to(torch.int32 if n < 2**31 else torch.int64)
    return indptr.cpu().numpy(), owners.cpu().numpy()


class _RestartBar:
    """The eigensolver's progress bar (restarts, with the largest residual estimate)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = bool(enabled)
        self.bar: Any = None

    def __enter__(self) -> "_RestartBar":
        return self

    def update(self, restart: int, worst: float) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc="eigensolver", unit="restart", dynamic_ncols=True, leave=False)
        self.bar.update(1)
        if not math.isnan(worst):
            self.bar.set_postfix_str(f"residual {worst:.1e}")

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
