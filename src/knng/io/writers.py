"""Writers for vector files and k-NN results, all of them atomic.

Every vector file is first written under a temporary name in its destination folder and only
``os.replace``-d into place once complete (:func:`atomic_write`), so a reader never sees a
half-written file and an interrupted run leaves the previous file (or nothing) behind.

A run's results are written by one writer, :class:`ResultSet`: arrays as ``.npy`` files (or
filled in place by several processes), other files (``graph.npz``, a plot) and the run's
``knng.json`` last, staged in a :class:`knng.io.outputs.OutputFolder` and committed whole.
:func:`write_neighbors`, every ``knng`` command and the distributed layer go through it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from knng._options import get_options
from knng.io.durable import create_npy, fsync_dir, fsync_file, write_npy
from knng.io.outputs import OutputFolder
from knng.io.readers import (
    BIN_DTYPES,
    HDF5_SUFFIXES,
    HEADER_DTYPE,
    TEXMEX_DTYPES,
    format_of,
    iter_row_blocks,
)

__all__ = [
    "METADATA_FILE",
    "NEIGHBOR_FILES",
    "ResultSet",
    "atomic_write",
    "json_default",
    "metadata_json",
    "write_hdf5",
    "write_neighbors",
    "write_vectors",
]

PathLike = Union[str, "os.PathLike[str]"]

#: The run's description beside its results: what was run, timings, the engine's report.
METADATA_FILE = "knng.json"
#: File names written by :func:`write_neighbors` inside its folder.
NEIGHBOR_FILES: dict[str, str] = {
    "indices": "indices.npy",
    "distances": "distances.npy",
    "metadata": METADATA_FILE,
}

_INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------


def _side_name(path: Path, tag: str) -> Path:
    """A hidden sibling of ``path``, unique per process and call (``.x.npy.tmp-123-ab12``)."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _refuse_existing(finals: Sequence[Path]) -> None:
    existing = [p for p in finals if os.path.lexists(p)]
    if existing:
        raise FileExistsError(
            errno.EEXIST,
            f"refusing to overwrite {', '.join(str(p) for p in existing)} "
            "(pass overwrite=True)",
            str(existing[0]),
        )


def atomic_write(
    path: PathLike, write_fn: Callable[[Path], Any], *, overwrite: bool = True
) -> Path:
    """Create ``path`` atomically: ``write_fn(temp_path)`` writes, then it is renamed.

    Parameters
    ----------
    path : str or os.PathLike
        Final file name; its folder must exist.
    write_fn : callable
        Called with a temporary path in the same folder; must create that file completely.
    overwrite : bool, default True
        If False and ``path`` exists, raise FileExistsError.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    final = Path(path)
    if not overwrite:
        _refuse_existing([final])
    temp = _side_name(final, "tmp")
    try:
        write_fn(temp)
        if not overwrite:
            _refuse_existing([final])
        fsync_file(temp)
        os.replace(temp, final)  # one file: the rename itself is atomic
    finally:
        _unlink_quietly(temp)  # only left after a failure
    fsync_dir(final.parent)
    return final


# --------------------------------------------------------------------------------------
# Array conversion and checks
# --------------------------------------------------------------------------------------


def _as_source(x: Any, name: str) -> Any:
    """Return ``x`` as something with ``shape``, ``dtype`` and row slicing.

    Torch tensors become NumPy (duck-typed, so this module never imports torch); memmaps
    and h5py datasets pass through unchanged so that they are streamed, not loaded.
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        if str(getattr(x, "dtype", "")) == "torch.bfloat16":  # NumPy has no bfloat16
            x = x.float()
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray) or type(x).__module__.startswith("h5py"):
        return x
    try:
        return np.asarray(x)
    except Exception as exc:
        raise TypeError(f"{name} must be an array, got {type(x).__name__}") from exc


def _check_2d(x: Any, name: str) -> None:
    if len(x.shape) != 2:
        raise ValueError(f"{name} must be 2-D (n, d), got shape {tuple(x.shape)}")


def _block_rows(x: Any) -> int:
    row_bytes = max(1, int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize)
    return max(1, get_options().write_block_bytes // row_bytes)


def _target_dtype(x: Any, target: np.dtype, suffix: str, name: str) -> None:
    """Raise ValueError if ``x``'s dtype cannot be stored as ``target`` in ``suffix``.

    Floating targets take any float (rounded, the usual float64 -> float32 conversion) and
    integers that convert exactly; integer targets take only integers, whose values are
    range-checked while writing (see :func:`_convert_block`).
    """
    kind = x.dtype.kind
    if target.kind == "f":
        ok = kind == "f" or (kind in "iub" and np.can_cast(x.dtype, target, "safe"))
    else:
        ok = kind in "iub"
    if not ok:
        raise ValueError(
            f"{name} has dtype {x.dtype}, which does not fit {suffix} ({target.name} values)"
        )


def _convert_block(block: np.ndarray, target: np.dtype, name: str, suffix: str) -> np.ndarray:
    """Cast one block to ``target``, refusing integers that would wrap around."""
    if target.kind in "iu" and block.size and not np.can_cast(block.dtype, target, "safe"):
        info = np.iinfo(target)
        lo, hi = block.min(), block.max()
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"{name} holds values in [{lo}, {hi}], outside the {target.name} range of "
                f"{suffix} [{info.min}, {info.max}]"
            )
    return block.astype(target, copy=False)


# --------------------------------------------------------------------------------------
# Per-format writers (each writes one complete file to an already-temporary path)
# --------------------------------------------------------------------------------------


def _write_npy(temp: Path, x: Any) -> None:
    if x.dtype.hasobject:
        raise ValueError("array has dtype object, which .npy files cannot store safely")
    if isinstance(x, np.ndarray) and (x.flags.c_contiguous or x.size == 0):
        write_npy(temp, x)
        return
    # h5py datasets and strided arrays (TEXMEX memmaps): copying whole would load the former
    # whole and write the latter one element at a time, so copy blocks into a mapped .npy
    # whose disk blocks are allocated first (a full disk is an error here, not a SIGBUS later).
    out = create_npy(temp, tuple(x.shape), x.dtype)
    for start, block in iter_row_blocks(x, _block_rows(x)):
        out[start : start + len(block)] = block
    out.flush()
    del out


def _write_texmex(temp: Path, x: Any, suffix: str) -> None:
    target = TEXMEX_DTYPES[suffix]
    d = int(x.shape[1])
    header_cols = HEADER_DTYPE.itemsize // target.itemsize  # 1 for float32/int32, 4 for uint8
    header = np.array([d], dtype=HEADER_DTYPE).view(target)  # d's bytes, as `target` columns
    with open(temp, "wb") as f:
        for _, block in iter_row_blocks(x, _block_rows(x)):
            rows = np.empty((len(block), header_cols + d), dtype=target)
            # Set the header through an int32 view: assigning an int32 bit pattern as a
            # float could in principle be normalised on the way.
            rows.view(np.uint8)[:, : HEADER_DTYPE.itemsize] = header.view(np.uint8)
            rows[:, header_cols:] = _convert_block(block, target, "array", suffix)
            rows.tofile(f)


def _write_bin(temp: Path, x: Any, suffix: str) -> None:
    target = BIN_DTYPES[suffix]
    n, d = (int(s) for s in x.shape)
    with open(temp, "wb") as f:
        np.array([n, d], dtype=HEADER_DTYPE).tofile(f)
        for _, block in iter_row_blocks(x, _block_rows(x)):
            _convert_block(block, target, "array", suffix).tofile(f)


def _write_hdf5_file(temp: Path, datasets: dict[str, Any], attrs: dict[str, Any]) -> None:
    import h5py  # deferred: only needed for HDF5

    with h5py.File(temp, "w") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        for name, x in datasets.items():
            ds = f.create_dataset(name, shape=tuple(x.shape), dtype=x.dtype)
            if len(x.shape) == 0:
                ds[()] = x[()]
                continue
            for start, block in iter_row_blocks(x, _block_rows(x)):
                ds[start : start + len(block)] = block


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def write_vectors(
    path: PathLike,
    array: Any,
    *,
    dataset: str | None = None,
    overwrite: bool = True,
) -> Path:
    """Write a 2-D array in the format given by the suffix of ``path``, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination; its suffix picks the format (see ``knng.io.FORMATS``). Its folder
        must exist.
    array : array-like, numpy.memmap, h5py.Dataset or torch.Tensor
        Shape ``(n, d)``. File-backed inputs are streamed block by block, so converting
        a file larger than memory works. Dtype rules: ``.npy``/HDF5 keep the dtype;
        ``.fvecs``/``.fbin`` take floats (stored as float32) and integers that float32
        holds exactly; ``.ivecs``/``.ibin``/``.bvecs``/``.u8bin``/``.i8bin`` take integers
        whose values fit int32/uint8/int8.
    dataset : str, optional
        HDF5 only: the dataset name (default ``train``); the file holds just this one
        dataset, use :func:`write_hdf5` for several.
    overwrite : bool, default True
        Like ``np.save``, replace an existing file; False raises FileExistsError.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        If ``array`` is not 2-D or its dtype or values do not fit the format (the message
        names ``array``), or if ``dataset`` is given for a non-HDF5 file.
    """
    suffix = format_of(path)
    if suffix in HDF5_SUFFIXES:
        return write_hdf5(path, overwrite=overwrite, **{dataset or "train": array})
    if dataset is not None:
        raise ValueError(f"dataset={dataset!r} only applies to HDF5 files, not to {path}")
    x = _as_source(array, "array")
    _check_2d(x, "array")
    if suffix == ".npy":
        return atomic_write(path, lambda temp: _write_npy(temp, x), overwrite=overwrite)
    n, d = (int(s) for s in x.shape)
    if d == 0:
        raise ValueError(f"array has 0 columns, which {suffix} files cannot record")
    if d > _INT32_MAX or (suffix in BIN_DTYPES and n > _INT32_MAX):
        raise ValueError(f"array of shape {(n, d)} exceeds the int32 header of {suffix}")
    if suffix in TEXMEX_DTYPES:
        _target_dtype(x, TEXMEX_DTYPES[suffix], suffix, "array")
        writer = _write_texmex
    else:
        _target_dtype(x, BIN_DTYPES[suffix], suffix, "array")
        writer = _write_bin
    return atomic_write(path, lambda temp: writer(temp, x, suffix), overwrite=overwrite)


def write_hdf5(
    path: PathLike,
    *,
    distance: str | None = None,
    overwrite: bool = True,
    **datasets: Any,
) -> Path:
    """Write an HDF5 file in the ann-benchmarks layout, atomically.

    Parameters
    ----------
    path : str or os.PathLike
        Destination (``.hdf5`` or ``.h5``).
    distance : str, optional
        Stored as the file attribute ``distance`` (e.g. ``"euclidean"``, ``"angular"``).
    overwrite : bool, default True
        Replace an existing file; False raises FileExistsError.
    **datasets : array-like, numpy.memmap, h5py.Dataset or torch.Tensor
        Datasets by name, usually ``train``, ``test``, ``neighbors`` and ``distances``;
        each keeps its dtype and is streamed in blocks.

    Returns
    -------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> write_hdf5("sift.hdf5", train=x, test=q, neighbors=i, distances=dd,
    ...            distance="euclidean")  # doctest: +SKIP
    """
    suffix = format_of(path)
    if suffix not in HDF5_SUFFIXES:
        raise ValueError(f"{path}: write_hdf5 needs a .hdf5 or .h5 file name")
    if not datasets:
        raise ValueError("write_hdf5 needs at least one dataset, e.g. train=array")
    arrays = {name: _as_source(x, name) for name, x in datasets.items()}
    for name, x in arrays.items():
        if x.dtype.hasobject:
            raise ValueError(f"{name} has dtype object, which HDF5 cannot store")
    attrs: dict[str, Any] = {"type": "dense"}
    if distance is not None:
        attrs["distance"] = str(distance)
    train = arrays.get("train")
    if train is not None and len(train.shape) == 2:
        attrs["dimension"] = int(train.shape[1])  # what ann-benchmarks loaders read
    return atomic_write(
        path, lambda temp: _write_hdf5_file(temp, arrays, attrs), overwrite=overwrite
    )


def json_default(obj: Any) -> Any:
    """JSON fallback for the metadata knng writes: pass as ``json.dumps(..., default=json_default)``.

    Parameters
    ----------
    obj : object
        A value :mod:`json` cannot serialise by itself.

    Returns
    -------
    object
        A JSON value: NumPy scalars become Python scalars, NumPy arrays lists, paths strings,
        and anything else (``torch.device``, ``torch.dtype``, ...) its ``str()``.

    Examples
    --------
    >>> import json
    >>> import numpy as np
    >>> json.dumps({"n": np.int64(3)}, default=json_default)
    '{"n": 3}'
    """
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    # Metadata is descriptive (torch.device, torch.dtype, ...): a readable string beats
    # failing after an hours-long run.
    return str(obj)


def write_neighbors(
    folder: "PathLike | OutputFolder",
    indices: Any,
    distances: Any,
    *,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Save k-NN results as ``indices.npy``, ``distances.npy`` and ``knng.json``.

    The folder is locked for the call and the new set is committed whole
    (:class:`knng.io.outputs.OutputFolder`): the folder holds either the complete new results
    or whatever it held before, never a mix, and results of another format (``graph.npz``)
    or a ``knng.json`` of an earlier run do not survive an overwrite.

    Parameters
    ----------
    folder : str, os.PathLike or knng.io.outputs.OutputFolder
        Output folder, created (with parents) if missing; or an open :class:`OutputFolder`
        (locked and checked earlier, e.g. before a long computation), which is committed.
    indices : array-like or torch.Tensor
        Integer neighbour ids, shape ``(n, k)``; stored as int64.
    distances : array-like or torch.Tensor
        Distances, shape ``(n, k)``; stored as float32.
    metadata : dict, optional
        Written as ``knng.json`` (NumPy scalars and other objects become JSON values or
        strings). Without it, a ``knng.json`` left by an earlier run is removed when
        overwriting, since it would describe other results.
    overwrite : bool, default False
        Replace existing outputs; otherwise their presence raises FileExistsError.

    Returns
    -------
    pathlib.Path
        ``folder``.

    Raises
    ------
    FileExistsError
        If any output file exists and ``overwrite`` is False; the message names the folder.
    knng.io.outputs.OutputFolderError
        If another run holds the folder, or it cannot take the results (not a folder, holds
        sub-folders, not writable, too little free space); nothing is written.
    ValueError
        If the arrays are not 2-D, differ in shape, or ``indices`` is not integer.
    """
    idx = _as_source(indices, "indices")
    dist = _as_source(distances, "distances")
    _check_2d(idx, "indices")
    _check_2d(dist, "distances")
    if tuple(idx.shape) != tuple(dist.shape):
        raise ValueError(
            f"indices and distances must have the same shape, got {tuple(idx.shape)} "
            f"and {tuple(dist.shape)}"
        )
    if idx.dtype.kind not in "iu":
        raise ValueError(f"indices must hold integers, got dtype {idx.dtype}")
    if dist.dtype.kind not in "fiu":
        raise ValueError(f"distances must hold real numbers, got dtype {dist.dtype}")
    # Serialise before touching the disk, so a bad metadata value fails with nothing written.
    text = None if metadata is None else metadata_json(metadata)

    if isinstance(folder, OutputFolder):
        _write_neighbor_set(ResultSet(folder), idx, dist, text)
        return folder.path
    n, k = (int(v) for v in idx.shape)
    expected = n * k * 12 + (len(text) if text is not None else 0)
    with OutputFolder(folder, overwrite=overwrite, expected_bytes=expected) as out:
        _write_neighbor_set(ResultSet(out), idx, dist, text)
    return Path(folder)


def _write_neighbor_set(results: "ResultSet", idx: Any, dist: Any, text: str | None) -> None:
    results.add_array(NEIGHBOR_FILES["indices"], idx, np.int64)
    results.add_array(NEIGHBOR_FILES["distances"], dist, np.float32)
    results.commit_text(text)


def metadata_json(metadata: Mapping[str, Any]) -> str:
    """The text of a ``knng.json``: sorted keys, indented, NumPy values and paths converted.

    Parameters
    ----------
    metadata : mapping
        What the run records (any value :func:`json_default` can convert).

    Returns
    -------
    str
        The JSON text, ending with a newline.
    """
    return json.dumps(metadata, indent=2, sort_keys=True, default=json_default) + "\n"


class ResultSet:
    """One run's results, staged in an open :class:`~knng.io.outputs.OutputFolder` and committed
    whole, with the run's ``knng.json``: the one writer of knng's result folders.

    Parameters
    ----------
    folder : knng.io.outputs.OutputFolder
        The output folder, open (locked and checked, typically before the computation).

    Examples
    --------
    >>> with OutputFolder("out", overwrite=True) as folder:           # doctest: +SKIP
    ...     results = ResultSet(folder)
    ...     results.add_array("embedding.npy", embedding)
    ...     results.add_file("graph.npz", graph.save)
    ...     results.commit({"command": "embed", "k": 15})             # knng.json, then the switch
    """

    def __init__(self, folder: OutputFolder) -> None:
        self.folder = folder
        self.names: list[str] = []

    def _path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith(".") or name == METADATA_FILE:
            raise ValueError(f"name must be a plain file name other than {METADATA_FILE}, got {name!r}")
        if name in self.names:
            raise ValueError(f"{name} is already part of this result set")
        self.names.append(name)
        return self.folder.staging / name

    def add_array(self, name: str, array: Any, dtype: Any = None) -> Path:
        """Write ``array`` (NumPy, torch, memory map, h5py dataset) as the ``.npy`` file ``name``,
        converted to ``dtype`` if given; returns its staged path."""
        x = _as_source(array, name)
        if dtype is not None:
            x = np.asarray(x, dtype=dtype)
        path = self._path(name)
        with self.folder.writing():
            _write_npy(path, x)
        return path

    def add_empty_array(self, name: str, shape: tuple[int, ...], dtype: Any) -> Path:
        """Create the ``.npy`` file ``name`` of ``shape`` and ``dtype``, zero-filled, for writers
        that fill it in place (``np.load(path, mmap_mode="r+")``: each rank its own rows);
        returns its staged path, which every writer must reach."""
        path = self._path(name)
        with self.folder.writing():
            create_npy(path, tuple(shape), dtype).flush()
        return path

    def add_file(self, name: str, write: Callable[[Path], Any]) -> Path:
        """Add a file of another format: ``write(path)`` creates it (``Graph.save``, a figure's
        ``savefig``); returns its staged path."""
        path = self._path(name)
        with self.folder.writing():
            write(path)
        return path

    def commit(self, metadata: Mapping[str, Any] | None) -> Path:
        """Write ``knng.json`` from ``metadata`` (none if None) and switch the whole set in;
        returns the folder."""
        return self.commit_text(None if metadata is None else metadata_json(metadata))

    def commit_text(self, text: str | None) -> Path:
        """:meth:`commit` with the ``knng.json`` text already serialised."""
        if text is not None:
            with self.folder.writing():
                (self.folder.staging / METADATA_FILE).write_text(text, encoding="utf-8")
        return self.folder.commit()
