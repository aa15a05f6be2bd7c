"""Candidate stores off the device: every row's store in host memory or a memory-mapped file.

A graph whose stores do not fit its device budget (``EnginePlan.lists`` is ``"host"`` or
``"disk"``) keeps them here and runs in bands of parts: the stores of two bands are on the device
at a time (:meth:`ListHome.load` before a band's blocks, :meth:`ListHome.save` after). A GPU's
home is pinned, so that the copies are direct; a disk home is a set of ``.npy`` files opened as
memory maps, whose pages the kernel writes back and drops as it needs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from knng.engine.plan import LISTS_IN_HOST, LISTS_ON_DISK
from knng.engine.store.candidates import CandidateStore

__all__ = ["ListHome"]

#: Rows a disk home initialises at a time (its files are written once, in bounded memory).
_FILL_ROWS = 1 << 16


class ListHome:
    """Every row's candidate store, kept in host memory or on disk between the bands that use it.

    Parameters
    ----------
    n : int
        Rows.
    empty : dict of str to torch.Tensor
        One row of each array as a fresh store holds it (``CandidateStore.rows_state`` of one
        row): the names, shapes, types and initial values of the home's arrays.
    where : {"host", "disk"}
        Host memory (pinned when ``pin``) or memory-mapped files in ``folder``.
    folder : str or Path, optional
        Where a disk home writes its files (a folder of its own is made inside, and deleted by
        :meth:`close`); default: the system's temporary folder (``TMPDIR``).
    pin : bool
        Pin a host home (for copies to and from a GPU).
    """

    def __init__(self, n: int, empty: dict[str, torch.Tensor], where: str, *, folder: str | Path | None = None,
                 pin: bool = False) -> None:
        if where not in (LISTS_IN_HOST, LISTS_ON_DISK):
            raise ValueError(f"a list home is in host memory or on disk, not {where!r}")
        self.n, self.where = n, where
        self.folder: Path | None = None
        self.arrays: dict[str, torch.Tensor] = {}
        if where == LISTS_ON_DISK:
            if folder is not None:
                Path(folder).mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="knng-lists-", dir=folder))
        for name, row in empty.items():
            row = row.detach().cpu()
            shape = (n, *row.shape[1:])
            if self.folder is not None:
                array = np.lib.format.open_memmap(self.folder / f"{name}.npy", mode="w+", dtype=row.numpy().dtype,
                                                  shape=shape)
                tensor = torch.from_numpy(array)
                for r0 in range(0, n, _FILL_ROWS):
                    tensor[r0:r0 + _FILL_ROWS] = row
            else:
                tensor = torch.empty(shape, dtype=row.dtype, pin_memory=pin)
                tensor[:] = row
            self.arrays[name] = tensor

    def nbytes(self) -> int:
        """Bytes the home holds."""
        return sum(t.numel() * t.element_size() for t in self.arrays.values())

    def load(self, store: CandidateStore, slots: slice, rows: slice) -> None:
        """Copy the stores of ``rows`` into store rows ``slots`` (on the store's device)."""
        store.load_rows(slots, {name: a[rows] for name, a in self.arrays.items()})

    def save(self, store: CandidateStore, slots: slice, rows: slice) -> None:
        """Copy store rows ``slots`` back into the stores of ``rows``."""
        for name, tensor in store.rows_state(slots).items():
            self.arrays[name][rows].copy_(tensor)

    def results(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Arrays for the run's results, (n, k) int64 indices and float64 distances, beside the
        stores: in host memory, or memory-mapped files of a disk home (they outlive
        :meth:`close`, which only unlinks them)."""
        if self.folder is None:
            return (torch.empty((self.n, k), dtype=torch.int64), torch.empty((self.n, k), dtype=torch.float64))
        indices, distances = (
            torch.from_numpy(np.lib.format.open_memmap(self.folder / f"result_{name}.npy", mode="w+", dtype=dtype,
                                                       shape=(self.n, k)))
            for name, dtype in (("indices", np.int64), ("distances", np.float64)))
        return indices, distances

    def state(self) -> dict[str, torch.Tensor]:
        """Every row's arrays (views, not copies): what a checkpoint saves."""
        return dict(self.arrays)

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Take the arrays a checkpoint saved (copied in blocks of rows: they may be memory maps)."""
        for name, mine in self.arrays.items():
            saved = arrays[name]
            if tuple(saved.shape) != tuple(mine.shape):
                raise ValueError(f"checkpoint lists {name!r}: {tuple(saved.shape)}, expected {tuple(mine.shape)}")
            for r0 in range(0, self.n, _FILL_ROWS):
                mine[r0:r0 + _FILL_ROWS] = torch.from_numpy(np.array(saved[r0:r0 + _FILL_ROWS]))

    def close(self) -> None:
        """Release the arrays (and delete a disk home's files)."""
        self.arrays.clear()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> "ListHome":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
