"""Lazy readers for the vector files users already have.

Every reader returns an array-like that reads rows on demand: a ``np.memmap`` (``.npy``,
TEXMEX ``.fvecs``/``.ivecs``/``.bvecs``, big-ann-benchmarks ``.fbin``/``.u8bin``/``.i8bin``/
``.ibin``) or an ``h5py.Dataset`` (ann-benchmarks ``.hdf5``). Nothing here reads a whole
file into memory; :func:`take_rows` and :func:`iter_row_blocks` are the two ways the engine
turns such a source into in-memory arrays, a few rows or one block at a time.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np

from knng._options import get_options

__all__ = [
    "BIN_DTYPES",
    "FORMATS",
    "HDF5_DATASETS",
    "HDF5_SUFFIXES",
    "HEADER_DTYPE",
    "TEXMEX_DTYPES",
    "VectorSource",
    "describe",
    "iter_row_blocks",
    "read_vectors",
    "take_rows",
]

#: What :func:`read_vectors` may return: a plain array, a read-only memory map or an
#: ``h5py.Dataset`` (typed loosely so that importing this module does not import h5py).
VectorSource = Union[np.ndarray, np.memmap, Any]

PathLike = Union[str, "os.PathLike[str]"]

#: Supported suffixes and a one-line description each (used by ``--help`` texts).
FORMATS: Mapping[str, str] = {
    ".npy": "NumPy array, memory-mapped",
    ".fvecs": "TEXMEX float32 vectors (int32 d, then d values, per row)",
    ".ivecs": "TEXMEX int32 vectors (int32 d, then d values, per row)",
    ".bvecs": "TEXMEX uint8 vectors (int32 d, then d bytes, per row)",
    ".fbin": "big-ann-benchmarks float32 (int32 n, int32 d, then n*d values)",
    ".u8bin": "big-ann-benchmarks uint8 (int32 n, int32 d, then n*d values)",
    ".i8bin": "big-ann-benchmarks int8 (int32 n, int32 d, then n*d values)",
    ".ibin": "big-ann-benchmarks int32 (int32 n, int32 d, then n*d values)",
    ".hdf5": "ann-benchmarks HDF5 (datasets train/test/neighbors/distances); "
    "pick one with 'file.hdf5:test'",
    ".h5": "same as .hdf5",
}

#: The datasets of an ann-benchmarks HDF5 file; ``train`` is the default.
HDF5_DATASETS: tuple[str, ...] = ("train", "test", "neighbors", "distances")

# Value dtype per format. Both layouts are little-endian on disk; spelling the byte order
# out keeps the readers correct on a big-endian host too.
#: Value dtype of each TEXMEX suffix (rows of int32 d, then d values).
TEXMEX_DTYPES: dict[str, np.dtype] = {
    ".fvecs": np.dtype("<f4"),
    ".ivecs": np.dtype("<i4"),
    ".bvecs": np.dtype("u1"),
}
#: Value dtype of each big-ann-benchmarks suffix (int32 n, int32 d, then n*d values).
BIN_DTYPES: dict[str, np.dtype] = {
    ".fbin": np.dtype("<f4"),
    ".u8bin": np.dtype("u1"),
    ".i8bin": np.dtype("i1"),
    ".ibin": np.dtype("<i4"),
}
#: Suffixes of ann-benchmarks HDF5 files.
HDF5_SUFFIXES: tuple[str, ...] = (".hdf5", ".h5")

#: dtype of the int32 dimension / count header fields of the TEXMEX and .bin layouts.
HEADER_DTYPE = np.dtype("<i4")
_BIN_HEADER_BYTES = 8  # int32 n, int32 d

# Checking every TEXMEX row header touches every page of the file when rows are shorter
# than a page, i.e. it reads the whole file. Below this size that is cheap and catches any
# corrupt row (Options.header_check_bytes); above it we check a sample of rows plus the size
# arithmetic instead.
_HEADER_SAMPLES = 64


# --------------------------------------------------------------------------------------
# Paths and formats
# --------------------------------------------------------------------------------------


def _supported() -> str:
    return ", ".join(FORMATS)


def format_of(path: PathLike) -> str:
    """Return the lower-case suffix of ``path`` if it is a supported format.

    Parameters
    ----------
    path : str or os.PathLike
        A file name; it need not exist.

    Returns
    -------
    str
        The suffix, such as ``".fvecs"``.

    Raises
    ------
    ValueError
        If the suffix is not one of :data:`FORMATS`; the message names the path and lists
        the supported suffixes.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"{os.fspath(path)}: unsupported vector file suffix {suffix or '(none)'!r}; "
            f"supported: {_supported()}"
        )
    return suffix


def _split_dataset(path: PathLike, dataset: str | None) -> tuple[Path, str | None]:
    """Split ``"file.hdf5:test"`` into the file and the dataset name.

    The split happens at the last ``':'`` and only when the whole string is not itself an
    existing file but the part left of the colon is, so names containing colons and
    Windows drive letters keep working.
    """
    text = os.fspath(path)
    if ":" in text and not os.path.exists(text):
        left, _, right = text.rpartition(":")
        if right and os.path.isfile(left):
            if dataset is not None and dataset != right:
                raise ValueError(
                    f"dataset={dataset!r} conflicts with {right!r} given in path {text!r}"
                )
            return Path(left), right
    return Path(text), dataset


def _check_exists(path: Path) -> None:
    if not path.is_file():
        if path.exists():
            raise IsADirectoryError(errno.EISDIR, "Not a vector file", str(path))
        raise FileNotFoundError(errno.ENOENT, "No such vector file", str(path))


def _resolve(path: PathLike, dataset: str | None) -> tuple[Path, str, str | None]:
    """Return the file, its format and the (HDF5-only) dataset name, all validated."""
    file, dataset = _split_dataset(path, dataset)
    suffix = format_of(file)
    _check_exists(file)
    if suffix in HDF5_SUFFIXES:
        return file, suffix, dataset or "train"
    if dataset is not None:
        raise ValueError(
            f"dataset={dataset!r} only applies to HDF5 files, not to {suffix} file {file}"
        )
    return file, suffix, None


# --------------------------------------------------------------------------------------
# Per-format readers
# --------------------------------------------------------------------------------------


def _read_npy(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: empty file (0 bytes), not a .npy array")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:  # object arrays, corrupt or truncated headers and data
        raise ValueError(f"{path}: not a readable .npy array ({exc or 'the file ends early'})") from exc
    if array.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array of vectors, got shape {array.shape}")
    return array


def _read_texmex(path: Path, suffix: str) -> np.ndarray:
    dtype = TEXMEX_DTYPES[suffix]
    size = path.stat().st_size
    if size == 0:
        # An empty file holds no vectors and does not even say their dimension.
        return np.empty((0, 0), dtype=dtype)
    if size < HEADER_DTYPE.itemsize:
        raise ValueError(f"{path}: truncated {suffix} file ({size} bytes, no row header)")
    d = int(np.fromfile(path, dtype=HEADER_DTYPE, count=1)[0])
    if d <= 0:
        raise ValueError(f"{path}: corrupt {suffix} file, first row has dimension {d}")
    row_bytes = HEADER_DTYPE.itemsize + d * dtype.itemsize
    if size % row_bytes:
        raise ValueError(
            f"{path}: corrupt or truncated {suffix} file: size {size} bytes is not a "
            f"multiple of the row size {row_bytes} bytes (dimension {d})"
        )
    n = size // row_bytes
    if dtype.itemsize == HEADER_DTYPE.itemsize:
        # float32/int32 rows: one column of header, d columns of values.
        rows = np.memmap(path, dtype=dtype, mode="r", shape=(n, 1 + d))
        headers = rows[:, :1].view(HEADER_DTYPE)[:, 0]
        values = rows[:, 1:]
    else:
        # uint8 rows: the int32 header spans the first four byte columns.
        rows = np.memmap(path, dtype=dtype, mode="r", shape=(n, HEADER_DTYPE.itemsize + d))
        headers = _BvecsHeaders(rows)
        values = rows[:, HEADER_DTYPE.itemsize:]
    _check_texmex_headers(path, suffix, headers, n, d, size)
    return values


class _BvecsHeaders:
    """Row headers of a ``.bvecs`` memmap, decoded from bytes only for the rows asked for."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def __getitem__(self, index: Any) -> np.ndarray:
        raw = np.ascontiguousarray(self._rows[index, : HEADER_DTYPE.itemsize])
        return raw.view(HEADER_DTYPE).reshape(raw.shape[:-1])


def _check_texmex_headers(
    path: Path, suffix: str, headers: Any, n: int, d: int, size: int
) -> None:
    """Raise ValueError if a row header differs from the first row's dimension ``d``."""
    if size <= get_options().header_check_bytes:
        rows = np.arange(n)
    else:
        # Evenly spaced rows always including the last: a file glued together from parts
        # of different dimensions almost surely shows up here or in the size check.
        rows = np.unique(np.linspace(0, n - 1, num=min(n, _HEADER_SAMPLES)).astype(np.int64))
    found = np.asarray(headers[rows])
    bad = np.flatnonzero(found != d)
    if bad.size:
        row = int(rows[bad[0]])
        raise ValueError(
            f"{path}: corrupt {suffix} file: row {row} has dimension header "
            f"{int(found[bad[0]])}, expected {d} like row 0"
        )


def _read_bin(path: Path, suffix: str) -> np.ndarray:
    dtype = BIN_DTYPES[suffix]
    size = path.stat().st_size
    if size < _BIN_HEADER_BYTES:
        raise ValueError(f"{path}: truncated {suffix} file ({size} bytes, header needs 8)")
    n, d = (int(v) for v in np.fromfile(path, dtype=HEADER_DTYPE, count=2))
    if n < 0 or d <= 0:
        raise ValueError(f"{path}: corrupt {suffix} header: n={n}, d={d}")
    expected = _BIN_HEADER_BYTES + n * d * dtype.itemsize
    if size != expected:
        raise ValueError(
            f"{path}: corrupt or truncated {suffix} file: header says {n} x {d} "
            f"{dtype.name} ({expected} bytes with header) but the file has {size} bytes"
        )
    return np.memmap(path, dtype=dtype, mode="r", offset=_BIN_HEADER_BYTES, shape=(n, d))


def _open_hdf5(path: Path) -> Any:
    import h5py  # deferred: h5py is only needed for HDF5 files

    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise ValueError(f"{path}: not a readable HDF5 file ({exc})") from exc


def _read_hdf5(path: Path, dataset: str) -> Any:
    import h5py

    handle = _open_hdf5(path)
    node = handle.get(dataset)
    if not isinstance(node, h5py.Dataset):
        available = sorted(k for k, v in handle.items() if isinstance(v, h5py.Dataset))
        handle.close()
        raise ValueError(
            f"{path}: no dataset {dataset!r} (dataset=...); available: {available}"
        )
    # The h5py.Dataset keeps the file's id alive after `handle` goes out of scope, so the
    # file stays open exactly as long as the caller holds the dataset.
    return node


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def read_vectors(path: PathLike, *, dataset: str | None = None) -> VectorSource:
    """Open a vector file lazily.

    Parameters
    ----------
    path : str or os.PathLike
        A file with one of the suffixes in :data:`FORMATS`. For HDF5 the dataset may be
        appended after a colon, as in ``"glove-100-angular.hdf5:test"``.
    dataset : str, optional
        HDF5 only: which dataset to return (``train``, ``test``, ``neighbors`` or
        ``distances``; default ``train``). Must be None for the other formats.

    Returns
    -------
    numpy.memmap or h5py.Dataset
        A 2-D array-like of shape ``(n, d)`` that reads rows on demand. TEXMEX files give
        a strided, read-only view that skips each row's header; an empty TEXMEX file gives
        an empty ``(0, 0)`` array since it does not record a dimension.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the suffix is unknown, the file is truncated or corrupt (the message names the
        path), the HDF5 dataset is missing, or ``dataset`` is given for a non-HDF5 file.
    """
    file, suffix, name = _resolve(path, dataset)
    if suffix == ".npy":
        return _read_npy(file)
    if suffix in TEXMEX_DTYPES:
        return _read_texmex(file, suffix)
    if suffix in BIN_DTYPES:
        return _read_bin(file, suffix)
    assert name is not None
    return _read_hdf5(file, name)


def _hdf5_attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def describe(path: PathLike) -> dict[str, Any]:
    """Summarise a vector file for ``knng info`` without reading its data.

    Parameters
    ----------
    path : str or os.PathLike
        As for :func:`read_vectors`, including the ``"file.hdf5:test"`` form.

    Returns
    -------
    dict
        ``path``, ``format`` (the suffix), ``description``, ``file_bytes``, ``shape``,
        ``dtype`` (a string), ``bytes_per_vector`` (``d * itemsize``, the in-memory size of
        one row) and ``memory_mapped`` for every format. HDF5 files add ``dataset`` (the one
        ``shape``/``dtype`` describe), ``datasets`` (``{name: {"shape", "dtype"}}`` for
        every dataset in the file) and ``distance`` (the file's ``distance`` attribute, or
        None).
    """
    file, suffix, name = _resolve(path, None)
    info: dict[str, Any] = {
        "path": str(file),
        "format": suffix,
        "description": FORMATS[suffix],
        "file_bytes": file.stat().st_size,
    }
    if name is not None:  # HDF5; _resolve defaulted the dataset to "train"
        info.update(_describe_hdf5(file, name))
        return info
    array = read_vectors(file)
    info["shape"] = tuple(int(s) for s in array.shape)
    info["dtype"] = array.dtype.name
    info["bytes_per_vector"] = int(array.shape[1] * array.dtype.itemsize)
    info["memory_mapped"] = isinstance(array, np.memmap)
    return info


def _describe_hdf5(path: Path, dataset: str) -> dict[str, Any]:
    import h5py

    with _open_hdf5(path) as handle:
        datasets: dict[str, dict[str, Any]] = {}

        def visit(name: str, node: Any) -> None:
            if isinstance(node, h5py.Dataset):
                datasets[name] = {"shape": tuple(node.shape), "dtype": node.dtype.name}

        handle.visititems(visit)  # metadata only: no dataset is read
        distance = handle.attrs.get("distance")
    if dataset not in datasets:
        raise ValueError(
            f"{path}: no dataset {dataset!r} (dataset=...); available: {sorted(datasets)}"
        )
    shape = datasets[dataset]["shape"]
    itemsize = np.dtype(datasets[dataset]["dtype"]).itemsize
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return {
        "dataset": dataset,
        "shape": shape,
        "dtype": datasets[dataset]["dtype"],
        "bytes_per_vector": row * itemsize,
        # h5py reads rows lazily through the HDF5 library, not through a memory map.
        "memory_mapped": False,
        "datasets": datasets,
        "distance": None if distance is None else _hdf5_attr(distance),
    }


def _is_hdf5(source: Any) -> bool:
    # Duck-typed on the class's module so that plain arrays never import h5py.
    return type(source).__module__.startswith("h5py")


def _is_file_backed(source: Any) -> bool:
    return isinstance(source, np.memmap) or _is_hdf5(source)


def take_rows(source: VectorSource, idx: np.ndarray) -> np.ndarray:
    """Gather arbitrary rows of ``source`` into a new in-memory array.

    Parameters
    ----------
    source : numpy.ndarray, numpy.memmap or h5py.Dataset
        What :func:`read_vectors` returned, or any 2-D array.
    idx : numpy.ndarray
        Integer row numbers of any shape, in any order, repeats allowed; each must lie in
        ``[0, len(source))``.

    Returns
    -------
    numpy.ndarray
        Shape ``idx.shape + source.shape[1:]``, C-contiguous, equal to ``source[idx]`` as
        NumPy fancy indexing would give it.

    Raises
    ------
    IndexError
        If an index is out of range.
    TypeError
        If ``idx`` is not integer.
    """
    idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        if idx.size == 0:  # np.asarray([]) is float64; an empty gather is still fine
            idx = idx.astype(np.int64)
        else:
            raise TypeError(f"idx must hold integers, got dtype {idx.dtype}")
    n = int(source.shape[0])
    flat = idx.reshape(-1)
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= n):
        bad = flat[(flat < 0) | (flat >= n)][0]
        raise IndexError(f"row index {int(bad)} out of range for a source of {n} rows")
    tail = tuple(source.shape[1:])
    if flat.size == 0:
        return np.empty(idx.shape + tail, dtype=source.dtype)
    if not _is_file_backed(source):
        return np.ascontiguousarray(np.asarray(source)[flat]).reshape(idx.shape + tail)
    # File-backed: read each distinct row once, in file order (sequential I/O, and h5py
    # accepts only increasing unique indices), then expand back to the requested order.
    uniq, inverse = np.unique(flat, return_inverse=True)
    if _is_hdf5(source):
        rows = _take_rows_hdf5(source, uniq)
    else:
        rows = np.asarray(source[uniq])
    return np.ascontiguousarray(rows[inverse.reshape(-1)]).reshape(idx.shape + tail)


def _take_rows_hdf5(source: Any, uniq: np.ndarray) -> np.ndarray:
    """Read the sorted, unique rows ``uniq`` of an h5py dataset.

    Where the wanted rows are dense, one contiguous slice and an in-memory pick beats an
    h5py point selection by far; where they are sparse, the selection avoids reading the
    gaps. Work proceeds in windows of at most ``Options.hdf5_span_bytes`` of file rows.
    """
    row_bytes = max(1, int(np.prod(source.shape[1:], dtype=np.int64)) * source.dtype.itemsize)
    span_rows = max(1, get_options().hdf5_span_bytes // row_bytes)
    out = np.empty((uniq.size,) + tuple(source.shape[1:]), dtype=source.dtype)
    pos = 0
    while pos < uniq.size:
        lo = int(uniq[pos])
        end = max(pos + 1, int(np.searchsorted(uniq, lo + span_rows, side="left")))
        piece = uniq[pos:end]
        span = int(piece[-1]) - lo + 1
        if span <= 4 * piece.size:
            out[pos:end] = source[lo : lo + span][piece - lo]
        else:
            out[pos:end] = source[piece]
        pos = end
    return out


def iter_row_blocks(
    source: VectorSource, block_rows: int
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield consecutive blocks of rows as in-memory, C-contiguous arrays.

    Parameters
    ----------
    source : numpy.ndarray, numpy.memmap or h5py.Dataset
        What :func:`read_vectors` returned, or any array.
    block_rows : int
        Rows per block (the last block may be shorter).

    Yields
    ------
    start : int
        Row number of the block's first row.
    block : numpy.ndarray
        ``source[start:start + block_rows]``. Blocks of file-backed sources are fresh,
        writeable copies (so ``torch.from_numpy`` accepts them and no page of the file
        stays referenced); blocks of in-memory arrays are copied only if not contiguous.

    Raises
    ------
    ValueError
        If ``block_rows`` is not a positive integer.
    """
    if isinstance(block_rows, bool) or int(block_rows) != block_rows or block_rows <= 0:
        raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
    block_rows = int(block_rows)
    copy = isinstance(source, np.memmap)
    n = int(source.shape[0])
    for start in range(0, n, block_rows):
        block = source[start : start + block_rows]
        if copy:
            block = np.array(block, order="C", copy=True)
        else:
            block = np.ascontiguousarray(block)
        yield start, block
