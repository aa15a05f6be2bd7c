"""Result types: :class:`Neighbors` (k-NN search), :class:`Graph` (k-NN graph) and
:class:`RadiusNeighbors` (radius query: rows of any length, in the compressed sparse row layout).

Both are thin, immutable wrappers around two ``(n_queries, k)`` arrays, ``indices``
(int64) and ``distances`` (float32, ascending per row, ties broken by the smaller index).
The arrays are kept in whatever kind the search produced (NumPy array, or torch tensor on
any device) so that results never cross devices behind the user's back; :meth:`Neighbors.numpy`
is the one explicit way to bring them to the host.

:class:`Graph` adds the conversions that graph users need: the scikit-learn sparse layout
(:meth:`Graph.to_scipy`), an undirected version (:meth:`Graph.symmetrize`) and a crash-safe
``.npz`` file format (:meth:`Graph.save`, :func:`load_graph`).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from knng.io.writers import atomic_write

if TYPE_CHECKING:
    import scipy.sparse

__all__ = ["Neighbors", "Graph", "RadiusNeighbors", "load_graph", "FORMAT_VERSION"]

#: Version of the ``.npz`` layout written by :meth:`Graph.save`. Bump it when the layout
#: changes in a way old readers cannot handle; :func:`load_graph` refuses unknown versions
#: rather than guessing.
FORMAT_VERSION = 1

# Keys every graph file must hold; used both to write and to recognise a knng file.
_FILE_KEYS = ("format_version", "indices", "distances", "metric", "include_self")

_SYMMETRIZE_HOW = ("union", "mutual")
_MODES = ("distance", "connectivity")


def _is_torch(x: Any) -> bool:
    # Checked by module name so that this module never imports torch itself: NumPy-only
    # users (and load_graph) should not pay torch's import time.
    return type(x).__module__.split(".", 1)[0] == "torch"


def _to_numpy(x: Any) -> np.ndarray:
    """Return ``x`` as a NumPy array (a torch tensor is detached and copied to the host)."""
    if _is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


@dataclass(frozen=True, eq=False)
class Neighbors:
    """The k nearest neighbours of each query.

    Iterating yields ``indices`` then ``distances``, so ``idx, dist = knng.search(...)``
    works like a tuple.

    Parameters
    ----------
    indices : numpy.ndarray or torch.Tensor
        ``(n_queries, k)`` int64 indices of the neighbours in the searched data, row ``q``
        in ascending order of distance to query ``q``.
    distances : numpy.ndarray or torch.Tensor
        ``(n_queries, k)`` float32 distances matching ``indices``, ascending per row; ties
        are ordered by the smaller index.
    metric : str, default "euclidean"
        Name of the metric the distances are measured in.

    Raises
    ------
    TypeError
        If ``indices`` or ``distances`` is not an array or tensor, or ``metric`` is not a
        string.
    ValueError
        If ``indices`` or ``distances`` is not 2-D, or their shapes differ.

    Notes
    -----
    Equality is identity (``eq=False``): element-wise ``==`` on arrays has no single truth
    value, so a generated ``__eq__`` would raise or mislead.
    """

    indices: Any
    distances: Any
    metric: str = "euclidean"
    #: The engine's report on the run that made this result (its plan, exactness counters), or
    #: None for a result built by hand or loaded from a file.
    report: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # Only shapes are checked: a scan of the data (dtypes aside) would cost a pass over
        # memory that may live on a GPU, on every result ever built.
        shapes = {}
        for name in ("indices", "distances"):
            value = getattr(self, name)
            shape = getattr(value, "shape", None)
            if shape is None or not hasattr(value, "ndim"):
                raise TypeError(
                    f"{name} must be a NumPy array or a torch tensor, got {type(value).__name__}"
                )
            if value.ndim != 2:
                raise ValueError(f"{name} must be 2-D (n_queries, k), got shape {tuple(shape)}")
            shapes[name] = tuple(shape)
        if shapes["indices"] != shapes["distances"]:
            raise ValueError(
                f"indices and distances must have the same shape, got indices "
                f"{shapes['indices']} and distances {shapes['distances']}"
            )
        if not isinstance(self.metric, str):
            raise TypeError(f"metric must be a string, got {type(self.metric).__name__}")

    @property
    def k(self) -> int:
        """Number of neighbours per query (``indices.shape[1]``)."""
        return int(self.indices.shape[1])

    @property
    def n_queries(self) -> int:
        """Number of queries (``indices.shape[0]``)."""
        return int(self.indices.shape[0])

    def __iter__(self) -> Iterator[Any]:
        # Tuple-style unpacking, the form most k-NN APIs (scikit-learn, faiss) return.
        yield self.indices
        yield self.distances

    def numpy(self) -> "Neighbors":
        """Return a copy of this result with both fields as NumPy arrays.

        Returns
        -------
        Neighbors
            Same class as ``self`` (a :class:`Graph` stays a :class:`Graph`); torch tensors
            are detached and copied to the host, NumPy arrays are reused as they are.
        """
        return replace(self, indices=_to_numpy(self.indices), distances=_to_numpy(self.distances))


@dataclass(frozen=True, eq=False)
class RadiusNeighbors:
    """Every neighbour within a radius of each query, rows of any length (``knng.radius``).

    The layout is scipy's compressed sparse rows: query ``i``'s neighbours are
    ``indices[indptr[i]:indptr[i + 1]]`` at ``distances[indptr[i]:indptr[i + 1]]``. Iterating
    yields ``indptr``, ``indices`` then ``distances``.

    Parameters
    ----------
    indptr : numpy.ndarray or torch.Tensor
        ``(n_queries + 1,)`` int64 row offsets, from 0 to the number of pairs.
    indices : numpy.ndarray or torch.Tensor
        ``(pairs,)`` int64 indices of the neighbours in the searched corpus.
    distances : numpy.ndarray or torch.Tensor
        ``(pairs,)`` float32 distances matching ``indices``: within a row ascending with ties
        by the smaller index, or by index where the query was asked unsorted.
    n_corpus : int
        Vectors in the searched corpus (the columns of :meth:`to_scipy`).
    metric : str, default "euclidean"
        Name of the metric the distances are measured in.

    Raises
    ------
    TypeError
        If a field is not an array or tensor, or ``metric`` is not a string.
    ValueError
        If a field is not 1-D, ``indices`` and ``distances`` differ in length, or ``indptr``
        does not end at their length.
    """

    indptr: Any
    indices: Any
    distances: Any
    n_corpus: int
    metric: str = "euclidean"
    #: The engine's report on the run that made this result, or None.
    report: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("indptr", "indices", "distances"):
            value = getattr(self, name)
            if getattr(value, "shape", None) is None or not hasattr(value, "ndim"):
                raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(value).__name__}")
            if value.ndim != 1:
                raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}")
        if self.indices.shape != self.distances.shape:
            raise ValueError(f"indices and distances must have the same length, got {tuple(self.indices.shape)} "
                             f"and {tuple(self.distances.shape)}")
        if self.indptr.shape[0] < 1 or int(self.indptr[-1]) != self.indices.shape[0]:
            raise ValueError("indptr must end at the number of pairs")
        if not isinstance(self.metric, str):
            raise TypeError(f"metric must be a string, got {type(self.metric).__name__}")

    @property
    def n_queries(self) -> int:
        """Number of queries (``len(indptr) - 1``)."""
        return int(self.indptr.shape[0]) - 1

    def __iter__(self) -> Iterator[Any]:
        yield self.indptr
        yield self.indices
        yield self.distances

    def row(self, i: int) -> tuple[Any, Any]:
        """Query ``i``'s neighbours: ``(indices, distances)`` views."""
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        return self.indices[a:b], self.distances[a:b]

    def numpy(self) -> "RadiusNeighbors":
        """A copy with every field as NumPy arrays (torch tensors copied to the host)."""
        return replace(self, indptr=_to_numpy(self.indptr), indices=_to_numpy(self.indices),
                       distances=_to_numpy(self.distances))

    def to_scipy(self, mode: str = "distance") -> "scipy.sparse.csr_matrix":
        """The ``(n_queries, n_corpus)`` sparse matrix of the neighbours, scikit-learn's
        ``radius_neighbors_graph`` layout.

        Parameters
        ----------
        mode : {"distance", "connectivity"}
            Stored values: the distances, or ones.

        Returns
        -------
        scipy.sparse.csr_matrix
            float32 distances (a neighbour at distance 0 is stored, not dropped) or float64 ones.
        """
        import scipy.sparse

        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        indptr, indices = _to_numpy(self.indptr), _to_numpy(self.indices)
        data = _to_numpy(self.distances) if mode == "distance" else np.ones(indices.shape[0])
        return scipy.sparse.csr_matrix((data, indices, indptr), shape=(self.n_queries, self.n_corpus))


@dataclass(frozen=True, eq=False)
class Graph(Neighbors):
    """A directed k-NN graph: row ``i`` holds the k nearest neighbours of point ``i``.

    Parameters
    ----------
    indices : numpy.ndarray or torch.Tensor
        ``(n, k)`` int64 neighbour indices into the same ``n`` points, ascending distance.
    distances : numpy.ndarray or torch.Tensor
        ``(n, k)`` float32 distances matching ``indices``.
    metric : str, default "euclidean"
        Name of the metric the distances are measured in.
    include_self : bool, default False
        Whether each point counts as its own neighbour (then ``i`` is normally in row ``i``
        at distance 0).

    See Also
    --------
    load_graph : Read a graph written by :meth:`Graph.save`.
    """

    include_self: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        # np.bool_ is accepted: it is what a round trip through a .npz file gives back.
        if not isinstance(self.include_self, (bool, np.bool_)):
            raise TypeError(f"include_self must be a bool, got {type(self.include_self).__name__}")

    @property
    def n_points(self) -> int:
        """Number of points (nodes) in the graph (equal to :attr:`n_queries`)."""
        return self.n_queries

    def _host_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(indices, distances)`` as NumPy, with indices checked to be in range."""
        indices = _to_numpy(self.indices)
        distances = _to_numpy(self.distances)
        n = indices.shape[0]
        # scipy's constructor does not check index contents, so an out-of-range or negative
        # index (for example a -1 "no neighbour" pad) would silently build a corrupt matrix.
        # One min/max pass is small next to building the matrix.
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            raise ValueError(
                f"indices must lie in [0, {n}) for a graph of {n} points, got values in "
                f"[{indices.min()}, {indices.max()}]"
            )
        return indices, distances

    def to_scipy(self, mode: str = "distance") -> scipy.sparse.csr_matrix:
        """Return the graph as an ``n x n`` sparse matrix in scikit-learn's layout.

        The layout is exactly that of :func:`sklearn.neighbors.kneighbors_graph`: row ``i``
        holds its k neighbours in ascending order of distance (so the column indices within
        a row are *not* sorted), ``indptr = arange(0, n*k + 1, k)``, int64 index arrays and
        float64 data.

        Parameters
        ----------
        mode : {"distance", "connectivity"}, default "distance"
            ``"distance"`` stores the distances, ``"connectivity"`` stores ones.

        Returns
        -------
        scipy.sparse.csr_matrix
            ``n x n`` matrix with exactly ``k`` stored entries per row. Zero distances
            (duplicate points, self edges) are kept as explicit zeros: they are real edges.

        Raises
        ------
        ValueError
            If ``mode`` is not one of the two names, or an index is out of range.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be 'distance' or 'connectivity', got {mode!r}")
        import scipy.sparse  # here, not at import: scipy takes a noticeable part of a CLI start

        indices, distances = self._host_arrays()
        n, k = indices.shape
        # arange(n + 1) * k rather than arange(0, n*k + 1, k): the latter fails for k == 0.
        indptr = np.arange(n + 1, dtype=np.int64) * k
        if mode == "distance":
            # float64 like scikit-learn, whatever the input precision.
            data = distances.astype(np.float64).ravel()
        else:
            data = np.ones(n * k, dtype=np.float64)
        # Built straight from (data, indices, indptr): no conversion step that could sum
        # duplicates or drop the explicit zeros of duplicate points.
        return scipy.sparse.csr_matrix(
            (data, indices.astype(np.int64).ravel(), indptr), shape=(n, n)
        )

    def symmetrize(self, how: str = "union", mode: str = "distance") -> scipy.sparse.csr_matrix:
        """Return the undirected graph as a symmetric sparse matrix.

        Parameters
        ----------
        how : {"union", "mutual"}, default "union"
            ``"union"`` keeps the edge ``{i, j}`` if ``j`` is a neighbour of ``i`` *or*
            ``i`` a neighbour of ``j``; ``"mutual"`` keeps it only if both hold.
        mode : {"distance", "connectivity"}, default "distance"
            ``"distance"`` stores the distance of each edge, ``"connectivity"`` stores ones.

        Returns
        -------
        scipy.sparse.csr_matrix
            Symmetric ``n x n`` float64 matrix with sorted column indices within each row
            and one entry per edge and direction. Self edges (present when the graph
            includes self) are stored once, on the diagonal. Zero distances are kept as
            explicit zeros.

        Raises
        ------
        ValueError
            If ``how`` or ``mode`` is not one of its names, or an index is out of range.

        Notes
        -----
        When both directions of an edge exist their distances agree up to float32
        rounding; the smaller one is used, so the result does not depend on which row
        was seen first.
        """
        if how not in _SYMMETRIZE_HOW:
            raise ValueError(f"how must be 'union' or 'mutual', got {how!r}")
        if mode not in _MODES:
            raise ValueError(f"mode must be 'distance' or 'connectivity', got {mode!r}")
        import scipy.sparse

        indices, distances = self._host_arrays()
        n, k = indices.shape
        if n * k == 0:
            return scipy.sparse.csr_matrix((n, n), dtype=np.float64)
        rows = np.repeat(np.arange(n, dtype=np.int64), k)
        cols = indices.astype(np.int64).ravel()
        weights = distances.astype(np.float64).ravel()

        # Edges are handled as scalar keys i*n + j (row-major order, so sorting the keys
        # sorts by row then column) and deduplicated by hand. Sparse arithmetic such as
        # A.maximum(A.T) is avoided on purpose: it may drop the explicit zeros of
        # duplicate points, which are real edges.
        if how == "union":
            keys = np.concatenate([rows * n + cols, cols * n + rows])
            weights = np.concatenate([weights, weights])
            keys, weights = _unique_min(keys, weights)
        else:
            keys, weights = _unique_min(rows * n + cols, weights)
            # An edge i->j is mutual when its reverse j->i is also among the (sorted,
            # unique) directed keys; look the reverses up by binary search.
            reverse = (keys % n) * n + keys // n
            pos = np.minimum(np.searchsorted(keys, reverse), keys.size - 1)
            found = keys[pos] == reverse
            keys = keys[found]
            # Both directions of a mutual edge take the smaller of the two distances, so
            # the result is exactly symmetric.
            weights = np.minimum(weights[found], weights[pos[found]])

        out_rows, out_cols = np.divmod(keys, n)
        if mode == "connectivity":
            weights = np.ones(keys.size, dtype=np.float64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(out_rows, minlength=n), out=indptr[1:])
        matrix = scipy.sparse.csr_matrix((weights, out_cols, indptr), shape=(n, n))
        # Keys were sorted and unique, so the matrix is canonical; telling scipy spares
        # a later re-sort and documents the promise.
        matrix.has_sorted_indices = True
        return matrix

    def to_umap(self) -> tuple[np.ndarray, np.ndarray]:
        """The graph as UMAP's ``precomputed_knn``: ``umap.UMAP(precomputed_knn=g.to_umap())``.

        UMAP's own nearest neighbours list each point first, at distance 0, then its others; so
        does this. A graph built without ``include_self`` gets that column prepended: ``(n, k + 1)``
        arrays, to use with ``n_neighbors`` up to ``k + 1`` (UMAP keeps the first ``n_neighbors``
        columns). A graph built with ``include_self=True`` is returned as it is.

        Returns
        -------
        indices : numpy.ndarray
            ``(n, k + 1)`` int64 (``(n, k)`` with ``include_self``).
        distances : numpy.ndarray
            ``(n, k + 1)`` float32, ascending per row.

        Examples
        --------
        >>> import umap                                                    # doctest: +SKIP
        >>> g = knng.graph(X, k=14)
        >>> Y = umap.UMAP(n_neighbors=15, precomputed_knn=g.to_umap()).fit_transform(X)

        UMAP then warns that it has no search index, so ``transform`` of new points is
        unavailable; ``fit`` and ``fit_transform`` are exactly as with its own neighbours.
        """
        indices, distances = self._host_arrays()
        indices, distances = indices.astype(np.int64), distances.astype(np.float32)
        if self.include_self:
            return indices, distances
        n = indices.shape[0]
        own = np.arange(n, dtype=np.int64)[:, None]
        return (np.ascontiguousarray(np.concatenate([own, indices], axis=1)),
                np.ascontiguousarray(np.concatenate([np.zeros((n, 1), np.float32), distances], axis=1)))

    @classmethod
    def from_scipy(cls, matrix: Any, *, metric: str = "euclidean") -> "Graph":
        """A graph from a sparse ``n x n`` distance matrix with the same number of neighbours
        per row: scikit-learn's ``kneighbors_graph`` / ``KNeighborsTransformer`` layout, or
        scanpy's ``adata.obsp["distances"]``.

        Stored entries on the diagonal (a point listed as its own neighbour, as
        ``KNeighborsTransformer`` does) are dropped; every row must then hold the same number
        ``k`` of entries, which are sorted by distance (ties by smaller index).

        Parameters
        ----------
        matrix : scipy.sparse matrix or array
            Square, one row per point; stored values are distances (explicit zeros included).
        metric : str, default "euclidean"
            The metric the distances are in.

        Returns
        -------
        Graph
            ``include_self=False``, NumPy arrays, float32 distances.

        Raises
        ------
        ValueError
            If ``matrix`` is not square, rows hold different numbers of neighbours, or a
            distance is negative or not finite; the message names ``matrix``.

        Examples
        --------
        >>> sc.pp.neighbors(adata, transformer=knng.KNeighborsTransformer(n_neighbors=15))  # doctest: +SKIP
        >>> g = knng.Graph.from_scipy(adata.obsp["distances"])
        >>> dm = knng.DiffusionMap(n_components=10, n_neighbors=g.k).fit(g)
        """
        import scipy.sparse

        csr = scipy.sparse.csr_matrix(matrix)
        n = csr.shape[0]
        if csr.shape != (n, n):
            raise ValueError(f"matrix must be square (one row and column per point), got shape {csr.shape}")
        csr.sort_indices()
        rows = np.repeat(np.arange(n), np.diff(csr.indptr))
        keep = csr.indices != rows
        cols, values, rows = csr.indices[keep].astype(np.int64), csr.data[keep].astype(np.float64), rows[keep]
        counts = np.bincount(rows, minlength=n)
        if n and counts.min() != counts.max():
            raise ValueError(f"matrix rows must hold the same number of neighbours (besides the point itself), "
                             f"got between {counts.min()} and {counts.max()}")
        if values.size and not (np.isfinite(values).all() and values.min() >= 0):
            raise ValueError("matrix must hold finite distances ≥ 0")
        k = int(counts[0]) if n else 0
        order = np.lexsort((cols, values, rows))  # by row, then distance, then index
        return cls(indices=cols[order].reshape(n, k), distances=values[order].astype(np.float32).reshape(n, k),
                   metric=metric, include_self=False)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the graph to a ``.npz`` file, atomically.

        The data is written to a temporary file in the destination folder, flushed to
        disk, then renamed onto the final name with :func:`os.replace`, so a crash leaves
        either the old file or the new one, never a half-written file.

        Parameters
        ----------
        path : str or os.PathLike
            Destination; ``.npz`` is appended when missing, as :func:`numpy.savez` does.

        Returns
        -------
        pathlib.Path
            The path actually written.
        """
        final = Path(os.fspath(path))
        if not final.name.endswith(".npz"):
            final = final.with_name(final.name + ".npz")
        indices, distances = _to_numpy(self.indices), _to_numpy(self.distances)
        arrays = {
            "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
            "indices": indices,
            "distances": distances,
            # Strings are stored as NumPy unicode arrays, not objects, so loading never
            # needs allow_pickle.
            "metric": np.array(self.metric),
            "include_self": np.array(bool(self.include_self)),
        }
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a handle: np.savez would append ".npz" to the temp name
                np.savez(f, **arrays)

        # Temporary name in the same folder, flushed, renamed: the one atomic-write helper.
        atomic_write(final, write)
        return final


def _unique_min(keys: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the sorted unique ``keys`` with, for each, the smallest of its ``weights``."""
    # lexsort sorts by the last key first: by edge key, then by weight, so the first entry
    # of each run of equal keys carries the minimum weight.
    order = np.lexsort((weights, keys))
    keys, weights = keys[order], weights[order]
    first = np.ones(keys.size, dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    return keys[first], weights[first]


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """Read a graph written by :meth:`Graph.save`.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file. If ``path`` does not exist but ``path + ".npz"`` does, that file
        is read, mirroring how :meth:`Graph.save` names its output.

    Returns
    -------
    Graph
        The graph, with ``indices`` and ``distances`` as NumPy arrays.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file is not a knng graph file or has an unknown ``format_version``; the
        message names ``path``.
    """
    file = Path(os.fspath(path))
    if not file.exists() and not file.name.endswith(".npz"):
        with_suffix = file.with_name(file.name + ".npz")
        if with_suffix.exists():
            file = with_suffix
    if not file.exists():
        raise FileNotFoundError(f"no knng graph file at path {str(file)!r}")
    not_graph = f"path {str(file)!r} is not a knng graph file"
    try:
        loaded = np.load(file, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        # np.load raises ValueError for pickles or text, OSError/EOFError/BadZipFile for
        # unreadable or truncated data.
        raise ValueError(f"{not_graph} ({exc})") from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(f"{not_graph} (it holds a single array, not an .npz archive)")
    with loaded:
        missing = [key for key in _FILE_KEYS if key not in loaded.files]
        if missing:
            raise ValueError(f"{not_graph} (missing {', '.join(missing)})")
        try:
            # Members are read eagerly: the archive is closed on leaving this block.
            version, indices, distances, metric, include_self = (loaded[key] for key in _FILE_KEYS)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise ValueError(f"{not_graph} ({exc})") from exc
    if version.shape != () or version.dtype.kind not in "iu":
        raise ValueError(f"{not_graph} (format_version is not an integer scalar)")
    if int(version) != FORMAT_VERSION:
        raise ValueError(
            f"path {str(file)!r} has knng graph format_version {int(version)}, but this "
            f"version of knng reads only format_version {FORMAT_VERSION}"
        )
    if indices.dtype.kind not in "iu" or distances.dtype.kind != "f":
        raise ValueError(
            f"{not_graph} (indices must be integers and distances floats, got "
            f"{indices.dtype} and {distances.dtype})"
        )
    if metric.shape != () or metric.dtype.kind != "U" or include_self.shape != ():
        raise ValueError(f"{not_graph} (metric or include_self is malformed)")
    try:
        return Graph(indices, distances, metric=str(metric), include_self=bool(include_self))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{not_graph} ({exc})") from exc
