"""An independent float64 oracle for knng's exactness promise, and the comparison helpers.

Nothing here imports knng: the oracle is written from the definition in DESIGN.md
("Exactness is the promise"):

* euclidean / sqeuclidean: by differences, ``((x - y) ** 2).sum()`` in float64
  (``scipy.spatial.distance.cdist`` sums differences in C, in float64);
* cosine: ½‖x̂ − ŷ‖² with x̂ = x/‖x‖; a zero vector is at distance 1 from everything
  (itself included);
* pearson: cosine of the per-vector-centred vectors (a vector whose entries are all equal counts as zero);
* inner_product: −xᵀy;

ordered by (distance, index) with ``np.lexsort``; a graph excludes each point by index.

Two float64 implementations that sum in different orders differ in the last bits, so the
oracle also returns, for every (query, corpus) pair, an *uncertainty*: a bound on how far
another correct float64 evaluation of the same definition may lie from the oracle's.
:func:`assert_exact` lets results differ from the oracle only inside those bounds: a
returned neighbour may swap with another only when the two are tied within their
uncertainties, and distances must equal the oracle's value rounded to float32 up to half a
float32 ulp plus the uncertainty. The uncertainties are ~1e-13 relative, far below any real
gap between neighbours, so a wrong neighbour is caught.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial.distance import cdist

__all__ = [
    "METRICS", "to_float64", "oracle_search", "oracle_graph", "Oracle", "assert_exact",
    "assert_output_kind", "float32_expansion_search", "DTYPES", "KINDS", "TORCH_KINDS", "kind_supports",
    "random_values", "smooth_image_patches", "assert_exact_chunked",
]

METRICS = ("euclidean", "sqeuclidean", "cosine", "pearson", "inner_product")

#: float64 unit roundoff.
U64 = 2.0**-53
#: Half a float32 ulp, relative (round to nearest): |fl32(v) − v| ≤ 2⁻²⁴·|v| for normal v.
HALF_ULP32 = 2.0**-24
#: Smallest positive float32 subnormal: absolute floor of the float32 rounding error.
TINY32 = 2.0**-149


def to_float64(x: Any) -> np.ndarray:
    """The input's stored values as a float64 NumPy array (exact: every supported dtype fits).

    Accepts NumPy arrays and memory maps (any strides), torch tensors (any device and dtype,
    bfloat16 included), h5py datasets and nested lists.
    """
    if type(x).__module__.split(".", 1)[0] == "torch":
        import torch

        return x.detach().to("cpu", torch.float64).numpy()
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):  # h5py
        x = x[()]
    return np.array(x, dtype=np.float64, copy=True)


def _normalise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    norm = np.sqrt((x * x).sum(axis=1))
    return x / np.where(norm > 0, norm, 1.0)[:, None], norm


def _pairwise(q: np.ndarray, c: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Full (nq, n) float64 distances and their uncertainties, by the definition."""
    d = q.shape[1]
    # A generous multiple of the worst-case float64 error of a d-term sum (γ_d ≈ d·u).
    g = 8.0 * (d + 2) * U64
    if metric in ("euclidean", "sqeuclidean"):
        sq = cdist(q, c, "sqeuclidean")  # Σ (x_i − y_i)², by differences
        if metric == "sqeuclidean":
            return sq, g * sq
        return np.sqrt(sq), g * np.sqrt(sq)
    if metric == "inner_product":
        dist = -(q @ c.T)
        # |error| ≤ γ_d Σ|x_i y_i| ≤ γ_d ‖x‖‖y‖ for any summation order.
        scale = np.sqrt((q * q).sum(1))[:, None] * np.sqrt((c * c).sum(1))[None, :]
        return dist, g * scale
    if metric in ("cosine", "pearson"):
        kq = np.ones(q.shape[0])
        kc = np.ones(c.shape[0])
        if metric == "pearson":
            # Centring a vector far from the origin loses digits: another implementation's
            # mean may differ by ~d·u·|mean|, a relative error of the centred vector of
            # κ·d·u with κ = ‖x‖ / ‖x − mean‖ (its condition number).
            nq_raw = np.sqrt((q * q).sum(1))
            nc_raw = np.sqrt((c * c).sum(1))
            # A vector whose entries are all equal counts as zero (correlation 0, distance 1).
            q = np.where((q.max(1) == q.min(1))[:, None], 0.0, q - q.mean(axis=1, keepdims=True))
            c = np.where((c.max(1) == c.min(1))[:, None], 0.0, c - c.mean(axis=1, keepdims=True))
            nq_c = np.sqrt((q * q).sum(1))
            nc_c = np.sqrt((c * c).sum(1))
            kq = np.where(nq_c > 0, nq_raw / np.where(nq_c > 0, nq_c, 1.0), 1.0)
            kc = np.where(nc_c > 0, nc_raw / np.where(nc_c > 0, nc_c, 1.0), 1.0)
        qh, nq_ = _normalise(q)
        ch, nc_ = _normalise(c)
        dist = 0.5 * cdist(qh, ch, "sqeuclidean")
        zero = (nq_ == 0)[:, None] | (nc_ == 0)[None, :]
        dist[zero] = 1.0
        # Unit vectors carry a relative error ≲ d·u·κ from the normalisation (and centring);
        # ½‖x̂−ŷ‖² then has an absolute error ≲ ‖x̂−ŷ‖·d·u·κ, plus the relative error of the sum.
        # The floor covers vectors that are parallel up to rounding (distance ~u²).
        cond = kq[:, None] + kc[None, :]
        unc = g * dist + g * cond * np.sqrt(2.0 * dist) + 4.0 * (g * cond) ** 2
        unc[zero] = 0.0
        return dist, unc
    raise ValueError(f"unknown metric {metric!r}")


@dataclass
class Oracle:
    """The exact answer for a set of queries, plus what the comparison needs.

    Iterates as ``(indices, distances)`` like knng's results.

    Attributes
    ----------
    indices : (nq, k) int64, distances : (nq, k) float64
        The k smallest by (distance, index).
    full : (nq, n) float64
        Every distance (by corpus index); +inf on a graph's own point.
    unc : (nq, n) float64
        Per-pair uncertainty of another correct float64 evaluation.
    exact_ties : bool
        Whether equal oracle distances are real ties that any correct implementation
        reproduces bit for bit (integer data under the Euclidean family or inner product:
        every sum is exact), so the smaller index must come first.
    dup_group : (n,) int64
        Id of each corpus vector's group of identical vectors: ties between identical
        vectors are always real ties.
    exclude_self : bool
    k : int
    """

    indices: np.ndarray
    distances: np.ndarray
    full: np.ndarray
    unc: np.ndarray
    exact_ties: bool
    dup_group: np.ndarray
    exclude_self: bool
    k: int
    metric: str

    def __iter__(self):
        yield self.indices
        yield self.distances


def _integer_valued(x: np.ndarray) -> bool:
    return bool(np.all(x == np.round(x))) and float(np.abs(x).max(initial=0.0)) < 2**20


def oracle_search(queries: Any, corpus: Any, k: int, metric: str = "euclidean",
                  exclude_self: bool = False) -> Oracle:
    """Exact k-NN of every query in ``corpus`` (float64, by the definition).

    With ``exclude_self`` (a graph: queries are the corpus) row i never holds i.
    """
    q = to_float64(queries)
    c = to_float64(corpus)
    assert q.ndim == 2 and c.ndim == 2 and q.shape[1] == c.shape[1]
    full, unc = _pairwise(q, c, metric)
    if exclude_self:
        assert q.shape[0] == c.shape[0]
        np.fill_diagonal(full, np.inf)
    nq, n = full.shape
    cols = np.broadcast_to(np.arange(n), full.shape)
    # lexsort: the last key is the primary one: by distance, then by index.
    order = np.lexsort((cols, full), axis=1)
    indices = order[:, :k]
    distances = np.take_along_axis(full, indices, axis=1)
    exact_ties = metric in ("euclidean", "sqeuclidean", "inner_product") and _integer_valued(q) \
        and _integer_valued(c)
    _, dup_group = np.unique(c, axis=0, return_inverse=True)
    return Oracle(indices, distances, full, unc, exact_ties, dup_group.reshape(-1).astype(np.int64),
                  exclude_self, k, metric)


def oracle_graph(data: Any, k: int, metric: str = "euclidean", include_self: bool = False) -> Oracle:
    """Exact k-NN graph: each point's k nearest others (itself too with ``include_self``)."""
    return oracle_search(data, data, k, metric, exclude_self=not include_self)


def _as_numpy(x: Any) -> np.ndarray:
    if type(x).__module__.split(".", 1)[0] == "torch":
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_radius_exact(result: Any, queries: Any, corpus: Any, radius: Any, metric: str = "euclidean",
                        sorted_rows: bool = True, context: str = "") -> None:
    """Assert that a radius query's answer (``knng.radius``'s :class:`RadiusNeighbors`, or an
    ``(indptr, indices, distances)`` triple) is exact: each row holds every corpus vector whose
    float64 distance (by the definition) is within the radius beyond its uncertainty, none
    beyond it, each once; its distances are the float32 roundings of the oracle's values; its
    order is (distance, index) where ``sorted_rows``, else by index."""
    q, c = to_float64(queries), to_float64(corpus)
    full, unc = _pairwise(q, c, metric)
    radii = np.broadcast_to(np.asarray(radius, dtype=np.float64), (q.shape[0],))
    fields = (result.indptr, result.indices, result.distances) if hasattr(result, "indptr") else tuple(result)
    indptr, indices, distances = (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v) for v in fields)
    pre = f"[{context}] " if context else ""
    # Real ties, as in oracle_search: identical vectors, or any where the float64 arithmetic is exact.
    exact_ties = metric in ("euclidean", "sqeuclidean") and _integer_valued(q) and _integer_valued(c)
    assert indptr.shape == (q.shape[0] + 1,) and indptr[0] == 0 and indptr[-1] == indices.shape[0], pre + "indptr"
    for i in range(q.shape[0]):
        idx, dist = indices[indptr[i]:indptr[i + 1]], distances[indptr[i]:indptr[i + 1]].astype(np.float64)
        where = pre + f"row {i}: "
        assert np.unique(idx).size == idx.size, where + "a neighbour repeats"
        assert ((idx >= 0) & (idx < c.shape[0])).all(), where + "index out of range"
        surely_in = np.nonzero(full[i] + unc[i] < radii[i])[0]
        missing = np.setdiff1d(surely_in, idx)
        assert missing.size == 0, where + f"misses {missing[:5].tolist()} at {full[i][missing[:5]].tolist()} <= {radii[i]}"
        outside = idx[full[i][idx] - unc[i][idx] > radii[i]]
        assert outside.size == 0, where + f"holds {outside[:5].tolist()} beyond the radius {radii[i]}"
        lo = (full[i][idx] - unc[i][idx]).astype(np.float32).astype(np.float64)
        hi = (full[i][idx] + unc[i][idx]).astype(np.float32).astype(np.float64)
        off = (dist < lo) | (dist > hi)
        assert not off.any(), where + f"distances off: got {dist[off][:3].tolist()}, exact {full[i][idx][off][:3].tolist()}"
        if sorted_rows:
            true = full[i][idx]
            wrong = true[:-1] > true[1:] + unc[i][idx][:-1] + unc[i][idx][1:]
            assert not wrong.any(), where + "not ascending"
            # Ordered by the float64 values, which two float32 roundings may hide: ties are the
            # oracle's real ones (identical vectors, and integer data under the Euclidean family,
            # tie in every order of summation; two cosine distances equal in one order may not be
            # in another).
            tie = (true[:-1] == true[1:]) & (idx[:-1] > idx[1:])
            if not exact_ties:
                tie &= (c[idx[:-1]] == c[idx[1:]]).all(axis=1)
            assert not tie.any(), where + "equal distances not ordered by index"
        else:
            assert (np.diff(idx) > 0).all(), where + "not ordered by index"


def assert_exact(result: Any, oracle: Oracle, rtol: float | None = None, context: str = "") -> None:
    """Assert that ``result`` (Neighbors, Graph or an (indices, distances) pair) is exact.

    Parameters
    ----------
    result
        knng's answer; NumPy or torch.
    oracle : Oracle
        From :func:`oracle_search` / :func:`oracle_graph`.
    rtol : float, optional
        Relative tolerance on distances. Default (None): the distance must be the float32
        rounding of the oracle's value, or of another value within the float64 uncertainty.
    context : str
        Added to failure messages (the random seed, the case).

    What is checked, row by row:

    1. shapes (nq, k), indices in range, distinct, and never the row's own point in a graph;
    2. distances: d is the float32 rounding of D ± unc, where D is the oracle's float64 value
       at the same rank (sorted values agree position by position even across ties);
    3. order: true distances of consecutive neighbours ascend (within uncertainties), and
       real ties (identical vectors, or exact integer arithmetic) are ordered by index;
    4. completeness: no neighbour that was left out is closer than the k-th returned one
       (beyond the uncertainties), and among real ties at the boundary the smaller indices
       were kept.
    """
    idx, dist = (result.indices, result.distances) if hasattr(result, "indices") else result
    idx = _as_numpy(idx).astype(np.int64)
    dist = _as_numpy(dist).astype(np.float64)
    nq, n = oracle.full.shape
    k = oracle.k
    pre = f"[{context}] " if context else ""
    assert idx.shape == (nq, k), f"{pre}indices shape {idx.shape}, expected {(nq, k)}"
    assert dist.shape == (nq, k), f"{pre}distances shape {dist.shape}, expected {(nq, k)}"
    assert (idx >= 0).all() and (idx < n).all(), f"{pre}indices out of range [0, {n})"
    srt = np.sort(idx, axis=1)
    dup_rows = np.nonzero((srt[:, 1:] == srt[:, :-1]).any(axis=1))[0]
    assert dup_rows.size == 0, f"{pre}rows {dup_rows[:5]} repeat a neighbour, e.g. row {dup_rows[:1]}: {idx[dup_rows[:1]]}"
    if oracle.exclude_self:
        own = np.nonzero((idx == np.arange(nq)[:, None]).any(axis=1))[0]
        assert own.size == 0, f"{pre}graph rows {own[:5]} contain their own point"

    true = np.take_along_axis(oracle.full, idx, axis=1)  # oracle distance of what was returned
    true_unc = np.take_along_axis(oracle.unc, idx, axis=1)
    assert np.isfinite(true).all(), f"{pre}a returned neighbour is excluded (own point)"

    # 2. distances, rank by rank.
    D = oracle.distances
    D_unc = np.take_along_axis(oracle.unc, oracle.indices, axis=1)
    err = np.abs(dist - D)
    U = D_unc + true_unc
    if rtol is None:
        # Rounding to nearest is monotone: a float64 value within U of D rounds to a float32
        # between these two (a single value unless D is within U of a rounding midpoint).
        lo = (D - U).astype(np.float32).astype(np.float64)
        hi = (D + U).astype(np.float32).astype(np.float64)
        bad = (dist < lo) | (dist > hi)
        allowed = np.maximum(D - lo, hi - D)
    else:
        allowed = rtol * np.abs(D) + U + TINY32
        bad = err > allowed
    if bad.any():
        r, j = np.argwhere(bad)[0]
        raise AssertionError(
            f"{pre}{int(bad.sum())} distances differ from the exact float64 value rounded to float32; "
            f"first at row {r}, rank {j}: got {dist[r, j]!r}, exact {D[r, j]!r} "
            f"(float32 {np.float32(D[r, j])!r}), |diff| {err[r, j]:.3g} > allowed {allowed[r, j]:.3g}; "
            f"indices {idx[r, :min(k, 8)]} vs exact {oracle.indices[r, :min(k, 8)]}")

    # 3. order between consecutive neighbours.
    if k > 1:
        a, b = true[:, :-1], true[:, 1:]
        tol = true_unc[:, :-1] + true_unc[:, 1:]
        wrong_order = a > b + tol
        same_group = oracle.dup_group[idx[:, :-1]] == oracle.dup_group[idx[:, 1:]]
        real_tie = (a == b) & (same_group | oracle.exact_ties)
        wrong_tie = real_tie & (idx[:, :-1] > idx[:, 1:])
        for name, mask in (("not ascending", wrong_order), ("tie not broken by the smaller index", wrong_tie)):
            if mask.any():
                r, j = np.argwhere(mask)[0]
                raise AssertionError(
                    f"{pre}{int(mask.sum())} neighbour pairs {name}; first at row {r}, ranks {j},{j + 1}: "
                    f"indices {idx[r, j]}, {idx[r, j + 1]} with exact distances {a[r, j]!r}, {b[r, j]!r}; "
                    f"exact row {oracle.indices[r, :min(k, 8)]}")

    # 4. completeness: what was left out is not closer than the worst returned neighbour.
    returned = np.zeros((nq, n), dtype=bool)
    np.put_along_axis(returned, idx, True, axis=1)
    worst_pos = np.argmax(true, axis=1)
    worst = true[np.arange(nq), worst_pos]
    worst_unc = true_unc[np.arange(nq), worst_pos]
    left = ~returned & np.isfinite(oracle.full)
    closer = left & (oracle.full < worst[:, None] - oracle.unc - worst_unc[:, None])
    if closer.any():
        r = int(np.argwhere(closer)[0, 0])
        missed = np.nonzero(closer[r])[0]
        raise AssertionError(
            f"{pre}{int(closer.any(axis=1).sum())} rows miss a true neighbour; first row {r}: missed "
            f"{missed[:5]} at {oracle.full[r, missed[:5]]}, worst returned {idx[r, worst_pos[r]]} at "
            f"{worst[r]!r}; got {idx[r, :min(k, 8)]}, exact {oracle.indices[r, :min(k, 8)]}")
    # Real ties at the boundary: equal to the worst returned, left out, with a smaller index.
    worst_idx = idx[np.arange(nq), worst_pos]
    tie_left = left & (oracle.full == worst[:, None])
    if not oracle.exact_ties:
        tie_left &= oracle.dup_group[None, :] == oracle.dup_group[worst_idx][:, None]
    smaller = tie_left & (np.arange(n)[None, :] < worst_idx[:, None])
    if smaller.any():
        r = int(np.argwhere(smaller)[0, 0])
        raise AssertionError(
            f"{pre}{int(smaller.any(axis=1).sum())} rows keep a larger index over a tied smaller one; "
            f"first row {r}: kept {worst_idx[r]}, left out {np.nonzero(smaller[r])[0][:5]} "
            f"(distance {worst[r]!r})")


def assert_output_kind(result: Any, like: Any, k: int | None = None) -> None:
    """NumPy (or list / dataset) in → NumPy out; torch in → torch out on the same device.

    indices int64, distances float32, both 2-D of the same shape.
    """
    idx, dist = result.indices, result.distances
    if type(like).__module__.split(".", 1)[0] == "torch":
        import torch

        assert isinstance(idx, torch.Tensor) and isinstance(dist, torch.Tensor), (type(idx), type(dist))
        assert idx.device == like.device and dist.device == like.device, (idx.device, like.device)
        assert idx.dtype == torch.int64, idx.dtype
        assert dist.dtype == torch.float32, dist.dtype
    else:
        assert type(idx) is np.ndarray and type(dist) is np.ndarray, (type(idx), type(dist))
        assert idx.dtype == np.int64, idx.dtype
        assert dist.dtype == np.float32, dist.dtype
    assert idx.shape == dist.shape and len(idx.shape) == 2
    if k is not None:
        assert idx.shape[1] == k


def float32_expansion_search(q: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """The common GPU recipe, for contrast: float32 ‖x‖² + ‖y‖² − 2xᵀy, then top-k."""
    import torch

    q32 = torch.from_numpy(np.asarray(q, dtype=np.float32))
    c32 = torch.from_numpy(np.asarray(c, dtype=np.float32))
    s = (q32 * q32).sum(1, keepdim=True) + (c32 * c32).sum(1)[None, :] - 2.0 * q32 @ c32.T
    return torch.topk(s, k, dim=1, largest=False).indices.numpy()


# --------------------------------------------------------------------------------- test data
DTYPES = ("float16", "bfloat16", "float32", "float64", "uint8", "int8")
#: Input kinds: NumPy array, memory map, torch tensor, strided torch view, h5py dataset,
#: strided (non-contiguous) NumPy view. Nested lists are tested separately (tiny, float64).
KINDS = ("numpy", "memmap", "torch", "torch_view", "h5py", "numpy_view")
TORCH_KINDS = ("torch", "torch_view")


def kind_supports(kind: str, dtype: str) -> bool:
    """NumPy has no bfloat16 without ml_dtypes, so bfloat16 comes as torch tensors only."""
    return dtype != "bfloat16" or kind in TORCH_KINDS


def random_values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random values representable in ``dtype`` (as float64 for bfloat16, cast later)."""
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape).astype(np.uint8)
    if dtype == "int8":
        return rng.integers(-128, 128, size=shape).astype(np.int8)
    x = rng.standard_normal(shape)
    if dtype == "bfloat16":
        return x
    return x.astype(dtype)


def smooth_image_patches(rng: np.random.Generator, n: int, side: int = 8, offset: int = 120,
                         spread: float = 60.0) -> np.ndarray:
    """Un-centred, pixel-like uint8 patches: windows of smooth random images plus offsets.

    Overlapping windows of smooth images are near-duplicates of each other, flat regions give
    many ties, and the values sit far from the origin (like raw intensities).
    """
    from scipy.ndimage import gaussian_filter

    patches = []
    per_image = 64
    while sum(p.shape[0] for p in patches) < n:
        img = gaussian_filter(rng.standard_normal((48, 48)), sigma=rng.uniform(1.5, 4.0))
        img = offset + rng.uniform(-40, 40) + spread * img / (img.std() + 1e-12)
        img = np.clip(np.round(img), 0, 255).astype(np.uint8)
        ys = rng.integers(0, 48 - side, per_image)
        xs = rng.integers(0, 48 - side, per_image)
        patches.append(np.stack([img[y:y + side, x:x + side].ravel() for y, x in zip(ys, xs)]))
    return np.concatenate(patches)[:n]


# ------------------------------------------------------------------ chunked oracle in torch
def _torch_pairwise(q, c, metric: str, chunk_elems: int):
    """float64 distances (by the definition, differences materialised in chunks) and their
    uncertainties, for q (m, d) against c (n, d), both float64 on the same device."""
    import torch

    d = q.shape[1]
    g = 8.0 * (d + 2) * U64
    if metric == "inner_product":
        dist = -(q @ c.T)
        return dist, g * torch.linalg.vector_norm(q, dim=1)[:, None] * torch.linalg.vector_norm(c, dim=1)[None, :]
    kq = kc = None
    if metric in ("cosine", "pearson"):
        if metric == "pearson":
            nq_raw, nc_raw = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(c, dim=1)
            # A vector whose entries are all equal counts as zero (correlation 0, distance 1).
            q = torch.where((q.amax(1) == q.amin(1))[:, None], 0.0, q - q.mean(dim=1, keepdim=True))
            c = torch.where((c.amax(1) == c.amin(1))[:, None], 0.0, c - c.mean(dim=1, keepdim=True))
        nq_, nc_ = torch.linalg.vector_norm(q, dim=1), torch.linalg.vector_norm(c, dim=1)
        if metric == "pearson":
            kq = torch.where(nq_ > 0, nq_raw / torch.where(nq_ > 0, nq_, 1.0), 1.0)
            kc = torch.where(nc_ > 0, nc_raw / torch.where(nc_ > 0, nc_, 1.0), 1.0)
        else:
            kq, kc = torch.ones_like(nq_), torch.ones_like(nc_)
        q = q / torch.where(nq_ > 0, nq_, 1.0)[:, None]
        c = c / torch.where(nc_ > 0, nc_, 1.0)[:, None]
    sq = torch.empty((q.shape[0], c.shape[0]), dtype=torch.float64, device=q.device)
    step = max(1, chunk_elems // max(1, q.shape[0] * d))
    for c0 in range(0, c.shape[0], step):
        diff = q[:, None, :] - c[None, c0:c0 + step, :]
        sq[:, c0:c0 + step] = (diff * diff).sum(dim=-1)
        del diff
    if metric == "sqeuclidean":
        return sq, g * sq
    if metric == "euclidean":
        e = torch.sqrt(sq)
        return e, g * e
    dist = 0.5 * sq
    zero = (nq_ == 0)[:, None] | (nc_ == 0)[None, :]
    dist = torch.where(zero, torch.ones_like(dist), dist)
    cond = kq[:, None] + kc[None, :]
    unc = g * dist + g * cond * torch.sqrt(2.0 * dist) + 4.0 * (g * cond) ** 2
    return dist, torch.where(zero, torch.zeros_like(unc), unc)


def assert_exact_chunked(queries, corpus, results, metric: str = "euclidean", *, exclude_self: bool = False,
                         rows=None, device=None, row_chunk: int = 256, chunk_elems: int = 2**26,
                         context: str = "") -> None:
    """The checks of :func:`assert_exact`, in torch, chunk by chunk, on any device.

    For inputs too large for a host oracle: the float64 distances of a chunk of query rows
    against the whole corpus are computed by differences on ``device`` (by default the
    queries' device), and every result in ``results`` (a list of Neighbors / (indices,
    distances) for the same queries, any k) is checked against them. ``rows`` restricts the
    check to a subset of query rows (a LongTensor / array of row numbers). Memory: about
    ``row_chunk × n`` float64 (twice) plus ``chunk_elems`` float64 for the differences.

    Real ties (which must be ordered by index) are, as in :func:`oracle_search`, equal float64
    distances of identical vectors, or of any vectors where the metric's float64 arithmetic is
    exact (the Euclidean family and the inner product on integers). Elsewhere mathematically
    equal distances need not be equal in float64: two saturated uint8 patches that differ from
    a query at different pixels are at one cosine distance, which two summation orders of the
    normalised vectors round apart (an H200 ordered such a pair against the host's sum).
    """
    import torch

    def as_t(x):
        if type(x).__module__.split(".", 1)[0] == "torch":
            return x.detach()
        if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):  # h5py
            x = x[()]
        return torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=np.float64)))

    qt, ct = as_t(queries), as_t(corpus)
    dev = torch.device(device) if device is not None else qt.device
    c64 = ct.to(dev, torch.float64)
    n = c64.shape[0]
    # Only the rows checked need integer queries for exact ties; looked at a chunk at a time
    # (a float64 copy of 300k photon images is 38 GB, and rounding it another).
    q_all = qt if rows is None else qt[torch.as_tensor(rows, device=qt.device).long()]

    def integer_valued(x) -> bool:
        for chunk in x.split(4096):
            chunk = chunk.to(dev, torch.float64)
            if not (bool((chunk == chunk.round()).all()) and float(chunk.abs().max()) < 2**20):
                return False
        return True

    exact_ties = metric in ("euclidean", "sqeuclidean", "inner_product") and integer_valued(q_all) \
        and integer_valued(c64)
    del q_all

    def real_ties(mask, left_cols, right_cols):
        """``mask`` kept where the two columns' vectors tie for real (see the docstring)."""
        if exact_ties or not bool(mask.any()):
            return mask
        r_, j_ = torch.nonzero(mask, as_tuple=True)
        same = (c64[left_cols[r_, j_]] == c64[right_cols[r_, j_]]).all(dim=1)
        out = torch.zeros_like(mask)
        out[r_[same], j_[same]] = True
        return out

    pre = f"[{context}] " if context else ""
    res = []
    for r in results:
        idx, dist = (r.indices, r.distances) if hasattr(r, "indices") else r
        res.append((as_t(idx).to(dev, torch.int64), as_t(dist).to(dev, torch.float64)))
    all_rows = torch.arange(qt.shape[0]) if rows is None else torch.as_tensor(rows, dtype=torch.int64).cpu()
    for s in range(0, all_rows.numel(), row_chunk):
        rr = all_rows[s:s + row_chunk]
        q64 = qt[rr.to(qt.device)].to(dev, torch.float64)
        full, unc = _torch_pairwise(q64, c64, metric, chunk_elems)
        rr_d = rr.to(dev)
        if exclude_self:
            full[torch.arange(rr.numel(), device=dev), rr_d] = torch.inf
        for idx_all, dist_all in res:
            idx, dist = idx_all[rr_d], dist_all[rr_d]
            m, k = idx.shape
            where = f"{pre}rows {int(rr[0])}..{int(rr[-1])}, k={k}: "
            assert bool(((idx >= 0) & (idx < n)).all()), where + "index out of range"
            srt = torch.sort(idx, dim=1).values
            assert not bool((srt[:, 1:] == srt[:, :-1]).any()), where + "a neighbour repeats"
            if exclude_self:
                assert not bool((idx == rr_d[:, None]).any()), where + "a row contains its own point"
            true = torch.gather(full, 1, idx)
            tunc = torch.gather(unc, 1, idx)
            ov, oi = torch.topk(full, k, dim=1, largest=False, sorted=True)
            ounc = torch.gather(unc, 1, oi)
            err = (dist - ov).abs()
            U = ounc + tunc
            lo = (ov - U).to(torch.float32).to(torch.float64)
            hi = (ov + U).to(torch.float32).to(torch.float64)
            bad = (dist < lo) | (dist > hi)
            allowed = torch.maximum(ov - lo, hi - ov)
            if bool(bad.any()):
                r_, j_ = [int(v) for v in torch.nonzero(bad)[0]]
                raise AssertionError(
                    where + f"{int(bad.sum())} distances off; row {int(rr[r_])} rank {j_}: got {float(dist[r_, j_])!r}, "
                    f"exact {float(ov[r_, j_])!r}, diff {float(err[r_, j_]):.3g} > {float(allowed[r_, j_]):.3g}")
            if k > 1:
                a, b = true[:, :-1], true[:, 1:]
                wrong = a > b + tunc[:, :-1] + tunc[:, 1:]
                tie = real_ties((a == b) & (idx[:, :-1] > idx[:, 1:]), idx[:, :-1], idx[:, 1:])
                for name, mask in (("not ascending", wrong), ("tie not broken by index", tie)):
                    if bool(mask.any()):
                        r_, j_ = [int(v) for v in torch.nonzero(mask)[0]]
                        raise AssertionError(where + f"{int(mask.sum())} pairs {name}; row {int(rr[r_])} ranks "
                                             f"{j_},{j_ + 1}: {idx[r_, j_:j_ + 2].tolist()} at "
                                             f"{a[r_, j_]!r}, {b[r_, j_]!r}")
            worst, wpos = true.max(dim=1)
            wunc = torch.gather(tunc, 1, wpos[:, None])[:, 0]
            widx = torch.gather(idx, 1, wpos[:, None])[:, 0]
            left = full.clone()
            left.scatter_(1, idx, torch.inf)
            closer = (left + unc) < (worst - wunc)[:, None]
            if bool(closer.any()):
                r_, c_ = [int(v) for v in torch.nonzero(closer)[0]]
                raise AssertionError(where + f"{int(closer.any(1).sum())} rows miss a neighbour; row {int(rr[r_])} "
                                     f"misses {c_} at {float(full[r_, c_])!r}, worst returned {int(widx[r_])} at "
                                     f"{float(worst[r_])!r}")
            cols = torch.arange(n, device=dev)[None, :]
            tie_left = (left == worst[:, None]) & (cols < widx[:, None])
            tie_left = real_ties(tie_left, cols.expand_as(tie_left), widx[:, None].expand_as(tie_left))
            if bool(tie_left.any()):
                r_, c_ = [int(v) for v in torch.nonzero(tie_left)[0]]
                raise AssertionError(where + f"row {int(rr[r_])} keeps {int(widx[r_])} over the tied smaller "
                                     f"index {c_}")
            del left, true, tunc
        del full, unc


def assert_screen_contract(by_row, by_col, exact, radius, row_thr, col_thr=None) -> None:
    """A fused screen's survivors (``knng.engine.kernels.fused.screen_block``) against their block.

    ``by_row`` lists (row, column, key) of the pairs kept by their row, ``by_col`` (column, row,
    key) of those kept by their column (with ``col_thr``; else None). ``exact`` are the float64
    scores, ``radius`` how far a screened key may sit from them (a tensor or a number). On each
    side every pair certainly under its threshold is kept, none certainly over it, none twice,
    and every key is within its threshold.
    """
    import torch

    m, n = exact.shape
    sides = [(by_row, row_thr, False)] + ([(by_col, col_thr, True)] if col_thr is not None else [])
    assert (by_col is None) == (col_thr is None)
    for found, thr, transposed in sides:
        rows, cols = (found.other, found.owner) if transposed else (found.owner, found.other)
        kept = torch.zeros((m, n), dtype=torch.bool, device=exact.device)
        kept[rows, cols] = True
        assert int(kept.sum()) == rows.numel(), "a pair was listed twice"
        limit = thr[None, :] if transposed else thr[:, None]
        certain = exact + radius <= limit
        possible = exact - radius <= limit
        assert bool((kept | ~certain).all()), "a pair certainly under its threshold was dropped"
        assert bool((~kept | possible).all()), "a pair certainly over its threshold was kept"
        assert bool((found.keys <= thr.float()[found.owner]).all())
