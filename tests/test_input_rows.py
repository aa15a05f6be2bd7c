"""Rows gathered from every kind of input (``InputArray.take``): the same rows as NumPy's
indexing, in the order asked, with repeats, from arrays, memory maps (strided ones too), files of
swapped bytes and HDF5 datasets; negative ids count from the end; the result's shape follows the
ids'."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from knng._inputs import as_input
from knng.io import read_vectors


def _sources(tmp_path, x: np.ndarray) -> dict[str, object]:
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "be.npy", x.astype(x.dtype.newbyteorder(">")))
    with_headers = np.empty((x.shape[0], x.shape[1] + 1), dtype=np.float32)  # a .fvecs-like layout
    with_headers[:, 0], with_headers[:, 1:] = 0, x
    np.save(tmp_path / "headers.npy", with_headers)
    with h5py.File(tmp_path / "x.hdf5", "w") as f:
        f["train"] = x
    return {
        "memory map": np.load(tmp_path / "x.npy", mmap_mode="r"),
        "memory map, big-endian": read_vectors(tmp_path / "be.npy"),
        "strided memory map": np.load(tmp_path / "headers.npy", mmap_mode="r")[:, 1:],
        "hdf5": h5py.File(tmp_path / "x.hdf5", "r")["train"],
        "transposed array": np.asfortranarray(x),
    }


@pytest.mark.parametrize("pin", [False, True])
def test_take_gives_numpys_rows_from_every_source(tmp_path, rng, pin):
    x = rng.standard_normal((300, 7)).astype(np.float32)
    ids = rng.integers(0, 300, size=(23, 5))
    ids[0, :4] = [299, 0, 299, 17]  # the ends and a repeat
    for name, source in _sources(tmp_path, x).items():
        data = as_input(source, "x")
        got = data.take(torch.from_numpy(ids), pin=pin)
        assert got.shape == (23, 5, 7) and got.dtype == torch.float32, name
        np.testing.assert_array_equal(got.numpy(), x[ids], err_msg=name)
        np.testing.assert_array_equal(data.take(torch.tensor([4, -1])).numpy(), x[[4, -1]], err_msg=name)
        assert data.take(torch.empty(0, dtype=torch.int64)).shape == (0, 7), name
        if isinstance(source, np.ndarray):
            with pytest.raises(IndexError):
                data.take(torch.tensor([3, 300]))
