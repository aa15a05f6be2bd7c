"""Tests for knng.io: lazy readers, atomic writers, row gathering and result files."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from knng.io import (
    FORMATS,
    atomic_write,
    describe,
    iter_row_blocks,
    read_vectors,
    take_rows,
    write_hdf5,
    write_neighbors,
    write_vectors,
)


@pytest.fixture
def rng() -> np.random.Generator:
    # A fresh, unseeded generator per test: round trips must hold for any data. The seed
    # is printed so that a failure can be replayed.
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def _random(rng: np.random.Generator, dtype: np.dtype, n: int, d: int) -> np.ndarray:
    """Random non-trivial values spanning the dtype's range (never all zeros)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal((n, d)) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=(n, d), endpoint=True, dtype=dtype)


def _shape(rng: np.random.Generator) -> tuple[int, int]:
    return int(rng.integers(3, 60)), int(rng.integers(1, 40))


# --- hand-written byte layouts, independent of the writers under test ----------------------


def _hand_texmex(path: Path, x: np.ndarray) -> None:
    n, d = x.shape
    header = np.full((n, 1), d, dtype="<i4")
    if x.dtype.itemsize == 4:  # fvecs / ivecs: header and values are both 4-byte columns
        np.hstack([header, x.view("<i4")]).tofile(path)
    else:  # bvecs: the int32 header is four byte columns
        np.hstack([header.view(np.uint8), x]).tofile(path)


def _hand_bin(path: Path, x: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.array(x.shape, dtype="<i4").tofile(f)
        x.tofile(f)


TEXMEX = {".fvecs": np.float32, ".ivecs": np.int32, ".bvecs": np.uint8}
BIN = {".fbin": np.float32, ".u8bin": np.uint8, ".i8bin": np.int8, ".ibin": np.int32}


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", list(TEXMEX) + list(BIN))
def test_binary_round_trip_matches_hand_layout(tmp_path, rng, suffix):
    dtype = {**TEXMEX, **BIN}[suffix]
    x = _random(rng, dtype, *_shape(rng))
    hand, ours = tmp_path / f"hand{suffix}", tmp_path / f"ours{suffix}"
    (_hand_texmex if suffix in TEXMEX else _hand_bin)(hand, x)
    assert write_vectors(ours, x) == ours

    assert hand.read_bytes() == ours.read_bytes()  # the writer produces the reference layout
    for path in (hand, ours):
        got = read_vectors(path)
        assert isinstance(got, np.memmap)  # lazy, not loaded
        assert got.dtype == dtype and got.shape == x.shape
        np.testing.assert_array_equal(got, x)


def test_npy_round_trip(tmp_path, rng):
    x = _random(rng, np.float64, *_shape(rng))
    hand, ours = tmp_path / "hand.npy", tmp_path / "ours.npy"
    np.save(hand, x)
    write_vectors(ours, x)
    for path in (hand, ours):
        got = read_vectors(path)
        assert isinstance(got, np.memmap)
        np.testing.assert_array_equal(got, x)
    assert not list(tmp_path.glob(".*"))  # np.save did not leave an oddly named temp


def test_hdf5_round_trip_and_dataset_selection(tmp_path, rng):
    n, d = _shape(rng)
    train, test = _random(rng, np.float32, n, d), _random(rng, np.float32, 5, d)
    nbr = rng.integers(0, n, size=(5, 3), dtype=np.int32)
    dist = rng.random((5, 3), dtype=np.float32)
    hand, ours = tmp_path / "hand.hdf5", tmp_path / "ours.hdf5"
    with h5py.File(hand, "w") as f:
        f.attrs["distance"] = "euclidean"
        for name, a in dict(train=train, test=test, neighbors=nbr, distances=dist).items():
            f.create_dataset(name, data=a)
    write_hdf5(ours, train=train, test=test, neighbors=nbr, distances=dist, distance="euclidean")

    for path in (hand, ours):
        got = read_vectors(path)
        assert isinstance(got, h5py.Dataset)  # lazy, not an ndarray
        np.testing.assert_array_equal(got[:], train)
        np.testing.assert_array_equal(read_vectors(path, dataset="test")[:], test)
        np.testing.assert_array_equal(read_vectors(f"{path}:neighbors")[:], nbr)
        np.testing.assert_array_equal(read_vectors(f"{path}:distances")[:], dist)
    with h5py.File(ours, "r") as f:
        assert f.attrs["distance"] == "euclidean"
        assert f["neighbors"].dtype == np.int32
    with pytest.raises(ValueError, match="nope"):
        read_vectors(ours, dataset="nope")
    with pytest.raises(ValueError, match="conflicts"):
        read_vectors(f"{ours}:test", dataset="train")


def test_hdf5_dataset_keeps_file_open(tmp_path, rng):
    x = _random(rng, np.float32, 20, 4)
    write_vectors(tmp_path / "a.h5", x, dataset="test")
    ds = read_vectors(tmp_path / "a.h5", dataset="test")
    gc.collect()  # the h5py.File object made inside read_vectors is gone by now
    np.testing.assert_array_equal(ds[3:7], x[3:7])


def test_write_vectors_streams_memmap_and_hdf5_sources(tmp_path, rng, set_options):
    # Tiny blocks force the block-wise copy path through several iterations.
    set_options(write_block_bytes=64)
    x = _random(rng, np.float32, *_shape(rng))
    _hand_texmex(tmp_path / "src.fvecs", x)
    src = read_vectors(tmp_path / "src.fvecs")
    for target in ("out.fbin", "out.npy", "out.hdf5", "again.fvecs"):
        write_vectors(tmp_path / target, src)
        np.testing.assert_array_equal(read_vectors(tmp_path / target)[:], x)
    write_vectors(tmp_path / "from_h5.npy", read_vectors(tmp_path / "out.hdf5"))
    np.testing.assert_array_equal(np.load(tmp_path / "from_h5.npy"), x)


def test_write_vectors_accepts_torch(tmp_path, rng):
    torch = pytest.importorskip("torch")
    x = _random(rng, np.float32, *_shape(rng))
    write_vectors(tmp_path / "t.fvecs", torch.from_numpy(x))
    np.testing.assert_array_equal(read_vectors(tmp_path / "t.fvecs"), x)


# --- dtype checks in the writers -----------------------------------------------------------


def test_writer_dtype_checks(tmp_path, rng):
    floats = _random(rng, np.float32, 4, 3)
    with pytest.raises(ValueError, match="array"):
        write_vectors(tmp_path / "x.bvecs", floats)
    with pytest.raises(ValueError, match="array"):
        write_vectors(tmp_path / "x.ibin", floats)
    with pytest.raises(ValueError, match="array"):
        write_vectors(tmp_path / "x.u8bin", np.array([[1, 256]], dtype=np.int64))
    with pytest.raises(ValueError, match="array"):
        write_vectors(tmp_path / "x.fvecs", floats[0])  # 1-D
    assert not list(tmp_path.iterdir())  # no temp or partial file survived

    ints = rng.integers(-(2**31), 2**31, size=(6, 2), dtype=np.int64)
    write_vectors(tmp_path / "ok.ivecs", ints)  # int64 whose values fit int32 is fine
    np.testing.assert_array_equal(read_vectors(tmp_path / "ok.ivecs"), ints)
    doubles = rng.standard_normal((5, 3))
    write_vectors(tmp_path / "ok.fbin", doubles)  # float64 -> float32, the usual rounding
    np.testing.assert_array_equal(read_vectors(tmp_path / "ok.fbin"), doubles.astype(np.float32))
    with pytest.raises(ValueError, match="dataset"):
        write_vectors(tmp_path / "x.npy", floats, dataset="train")


# --- errors from the readers ---------------------------------------------------------------


@pytest.mark.parametrize("suffix", list(TEXMEX))
def test_texmex_corruption_is_reported_with_path(tmp_path, rng, suffix):
    x = _random(rng, TEXMEX[suffix], 7, int(rng.integers(2, 20)))
    path = tmp_path / f"bad{suffix}"
    _hand_texmex(path, x)
    raw = path.read_bytes()

    path.write_bytes(raw[:-3])  # truncated
    with pytest.raises(ValueError, match=str(path)):
        read_vectors(path)

    row_bytes = len(raw) // 7
    wrong = np.array([x.shape[1] + 1], dtype="<i4").tobytes()
    path.write_bytes(raw[: 4 * row_bytes] + wrong + raw[4 * row_bytes + 4 :])
    with pytest.raises(ValueError, match=rf"{path}.*row 4"):
        read_vectors(path)

    path.write_bytes(np.array([-5], "<i4").tobytes() + raw[4:])
    with pytest.raises(ValueError, match=str(path)):
        read_vectors(path)


def test_texmex_header_check_samples_large_files(tmp_path, rng, set_options):
    # Above the full-check size only sampled rows (always the first and last) are checked.
    set_options(header_check_bytes=0)
    x = _random(rng, np.float32, 500, 3)
    path = tmp_path / "big.fvecs"
    _hand_texmex(path, x)
    np.testing.assert_array_equal(read_vectors(path), x)
    raw = bytearray(path.read_bytes())
    raw[-16:-12] = np.array([9], "<i4").tobytes()  # header of the last row
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="row 499"):
        read_vectors(path)


@pytest.mark.parametrize("suffix", list(BIN))
def test_bin_corruption_is_reported_with_path(tmp_path, rng, suffix):
    x = _random(rng, BIN[suffix], 6, 5)
    path = tmp_path / f"bad{suffix}"
    _hand_bin(path, x)
    raw = path.read_bytes()
    for broken in (raw[:-1], raw + b"\0" * 4, raw[:5], np.array([7, 5], "<i4").tobytes() + raw[8:]):
        path.write_bytes(broken)
        with pytest.raises(ValueError, match=str(path)):
            read_vectors(path)


def test_unknown_suffix_missing_file_and_stray_dataset(tmp_path, rng):
    odd = tmp_path / "vectors.csv"
    odd.write_text("1,2\n")
    with pytest.raises(ValueError, match=r"vectors\.csv.*\.fvecs.*\.hdf5"):
        read_vectors(odd)
    missing = tmp_path / "missing.fvecs"
    with pytest.raises(FileNotFoundError, match="missing.fvecs"):
        read_vectors(missing)
    with pytest.raises(FileNotFoundError):
        describe(missing)
    write_vectors(tmp_path / "x.npy", _random(rng, np.float32, 3, 2))
    with pytest.raises(ValueError, match="dataset"):
        read_vectors(tmp_path / "x.npy", dataset="train")
    assert set(FORMATS) >= {".npy", ".fvecs", ".ivecs", ".bvecs", ".fbin", ".u8bin", ".i8bin",
                            ".ibin", ".hdf5"}


def test_empty_and_malformed_files(tmp_path, rng):
    (tmp_path / "empty.fvecs").write_bytes(b"")  # no vectors, not even a dimension
    assert read_vectors(tmp_path / "empty.fvecs").shape == (0, 0)
    _hand_bin(tmp_path / "empty.fbin", np.empty((0, 7), np.float32))
    assert read_vectors(tmp_path / "empty.fbin").shape == (0, 7)
    np.save(tmp_path / "flat.npy", _random(rng, np.float32, 1, 5)[0])
    with pytest.raises(ValueError, match="flat.npy.*2-D"):
        read_vectors(tmp_path / "flat.npy")
    (tmp_path / "fake.hdf5").write_bytes(b"not hdf5 at all")
    with pytest.raises(ValueError, match="fake.hdf5"):
        read_vectors(tmp_path / "fake.hdf5")
    (tmp_path / "dir.fvecs").mkdir()
    with pytest.raises(OSError, match="dir.fvecs"):
        read_vectors(tmp_path / "dir.fvecs")


# --- describe ------------------------------------------------------------------------------


def test_describe(tmp_path, rng):
    x = _random(rng, np.float32, 11, 6)
    _hand_texmex(tmp_path / "a.fvecs", x)
    info = describe(tmp_path / "a.fvecs")
    assert info["format"] == ".fvecs" and info["shape"] == (11, 6) and info["dtype"] == "float32"
    assert info["file_bytes"] == 11 * 7 * 4 and info["bytes_per_vector"] == 24
    assert info["memory_mapped"] is True
    assert {"path", "description"} <= set(info)

    write_hdf5(tmp_path / "a.hdf5", train=x, test=x[:2].astype(np.float64), distance="angular")
    info = describe(f"{tmp_path / 'a.hdf5'}:test")
    assert info["dataset"] == "test" and info["shape"] == (2, 6) and info["dtype"] == "float64"
    assert info["distance"] == "angular" and info["memory_mapped"] is False
    assert info["datasets"] == {
        "train": {"shape": (11, 6), "dtype": "float32"},
        "test": {"shape": (2, 6), "dtype": "float64"},
    }
    assert info["file_bytes"] == (tmp_path / "a.hdf5").stat().st_size


# --- take_rows and iter_row_blocks ---------------------------------------------------------


def _sources(tmp_path: Path, x: np.ndarray) -> dict[str, object]:
    _hand_texmex(tmp_path / "s.fvecs", x)  # a strided memmap view
    _hand_bin(tmp_path / "s.fbin", x)
    write_hdf5(tmp_path / "s.hdf5", train=x)
    return {
        "ndarray": x,
        "fvecs": read_vectors(tmp_path / "s.fvecs"),
        "fbin": read_vectors(tmp_path / "s.fbin"),
        "hdf5": read_vectors(tmp_path / "s.hdf5"),
    }


# HDF5 gathers read dense index sets as one slice and sparse ones as a selection, in
# windows of _HDF5_SPAN_BYTES: cover dense, sparse and many tiny windows.
@pytest.mark.parametrize(
    ("span_bytes", "shape"), [(2**26, (17, 9)), (2**26, (2, 3)), (40, (17, 9))]
)
def test_take_rows_matches_fancy_indexing(tmp_path, rng, span_bytes, shape, set_options):
    set_options(hdf5_span_bytes=span_bytes)
    x = _random(rng, np.float32, 200, 5)
    idx = rng.integers(0, 200, size=shape)  # unsorted, with repeats, 2-D
    idx[0, :3] = [199, 0, 199]
    for name, source in _sources(tmp_path, x).items():
        got = take_rows(source, idx)
        assert type(got) is np.ndarray and got.flags.c_contiguous, name
        np.testing.assert_array_equal(got, x[idx], err_msg=name)
        np.testing.assert_array_equal(take_rows(source, idx[0]), x[idx[0]], err_msg=name)
        assert take_rows(source, np.array([], dtype=np.int64)).shape == (0, 5)
        with pytest.raises(IndexError):
            take_rows(source, np.array([3, 200]))


def test_iter_row_blocks(tmp_path, rng):
    x = _random(rng, np.float32, 50, 3)
    for name, source in _sources(tmp_path, x).items():
        blocks = list(iter_row_blocks(source, 16))
        assert [s for s, _ in blocks] == [0, 16, 32, 48], name
        assert all(type(b) is np.ndarray and b.flags.c_contiguous for _, b in blocks)
        if name != "ndarray":
            assert all(b.flags.writeable for _, b in blocks)  # copies, not read-only views
        np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), x)
    with pytest.raises(ValueError, match="block_rows"):
        next(iter_row_blocks(x, 0))


# --- write_neighbors and atomicity -----------------------------------------------------------


def _neighbors(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n, k = int(rng.integers(2, 30)), int(rng.integers(1, 8))
    return rng.integers(0, 1000, size=(n, k)), rng.random((n, k))


def test_write_neighbors_round_trip(tmp_path, rng):
    idx, dist = _neighbors(rng)
    out = tmp_path / "a" / "b"
    meta = {"k": np.int64(idx.shape[1]), "metric": "sqeuclidean", "source": tmp_path}
    assert write_neighbors(out, idx.astype(np.int32), dist, metadata=meta) == out
    got_i, got_d = np.load(out / "indices.npy"), np.load(out / "distances.npy")
    assert got_i.dtype == np.int64 and got_d.dtype == np.float32
    np.testing.assert_array_equal(got_i, idx)
    np.testing.assert_array_equal(got_d, dist.astype(np.float32))
    meta_back = json.loads((out / "knng.json").read_text())
    assert meta_back == {"k": idx.shape[1], "metric": "sqeuclidean", "source": str(tmp_path)}
    assert sorted(p.name for p in out.iterdir()) == ["distances.npy", "indices.npy", "knng.json"]


def test_write_neighbors_accepts_torch(tmp_path, rng):
    torch = pytest.importorskip("torch")
    idx, dist = _neighbors(rng)
    write_neighbors(tmp_path, torch.from_numpy(idx), torch.from_numpy(dist))
    np.testing.assert_array_equal(np.load(tmp_path / "indices.npy"), idx)
    assert not (tmp_path / "knng.json").exists()


def test_write_neighbors_refuses_then_overwrites(tmp_path, rng):
    idx, dist = _neighbors(rng)
    write_neighbors(tmp_path, idx, dist, metadata={"run": 1})
    idx2, dist2 = _neighbors(rng)
    with pytest.raises(FileExistsError, match=str(tmp_path)):
        write_neighbors(tmp_path, idx2, dist2)
    np.testing.assert_array_equal(np.load(tmp_path / "indices.npy"), idx)  # untouched

    write_neighbors(tmp_path, idx2, dist2, overwrite=True)  # no metadata this time
    np.testing.assert_array_equal(np.load(tmp_path / "indices.npy"), idx2)
    assert not (tmp_path / "knng.json").exists()  # the stale metadata went with the old run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["distances.npy", "indices.npy"]


def test_write_neighbors_validates(tmp_path, rng):
    idx, dist = _neighbors(rng)
    with pytest.raises(ValueError, match="same shape"):
        write_neighbors(tmp_path / "x", idx, dist[:, :-1] if dist.shape[1] > 1 else dist[:-1])
    with pytest.raises(ValueError, match="indices"):
        write_neighbors(tmp_path / "x", idx.astype(np.float32), dist)
    assert not (tmp_path / "x").exists()


def _failing_renames(monkeypatch, fail_at: int) -> list[tuple[str, str]]:
    """Make the ``fail_at``-th rename of the output commit (1-based) raise; the exchange too."""
    import knng.io.outputs as outputs

    real, calls = os.rename, []

    def fake(src, dst, *args, **kwargs):
        calls.append((os.fspath(src), os.fspath(dst)))
        if len(calls) == fail_at:
            raise OSError("simulated failure")
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", fake)
    real_exchange = outputs._exchange

    def exchange(a, b):
        calls.append((os.fspath(a), os.fspath(b)))
        if len(calls) == fail_at:
            raise OSError("simulated failure")
        return real_exchange(a, b)

    monkeypatch.setattr(outputs, "_exchange", exchange)
    return calls


@pytest.mark.parametrize("fail_at", [1, 2])  # staging → ready, ready → the new folder
def test_write_neighbors_is_atomic_in_a_new_folder(tmp_path, rng, monkeypatch, fail_at):
    idx, dist = _neighbors(rng)
    out = tmp_path / "out"
    calls = _failing_renames(monkeypatch, fail_at)
    with pytest.raises(OSError, match="simulated"):
        write_neighbors(out, idx, dist, metadata={"a": 1})
    assert len(calls) == fail_at
    assert not out.exists() and not list(tmp_path.iterdir())  # no folder, no staging, no lock
    monkeypatch.undo()
    write_neighbors(out, idx, dist)  # and the folder is usable afterwards
    np.testing.assert_array_equal(np.load(out / "indices.npy"), idx)


@pytest.mark.parametrize("fail_at", [1, 2])  # staging → ready, the exchange with the old folder
def test_failed_overwrite_keeps_previous_results(tmp_path, rng, monkeypatch, fail_at):
    out = tmp_path / "out"
    idx, dist = _neighbors(rng)
    write_neighbors(out, idx, dist, metadata={"run": "old"})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    new_idx, new_dist = _neighbors(rng)
    _failing_renames(monkeypatch, fail_at)
    with pytest.raises(OSError, match="simulated"):
        write_neighbors(out, new_idx, new_dist, metadata={"run": "new"}, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_write_cleans_up_after_a_failing_writer(tmp_path):
    target = tmp_path / "x.bin"

    def boom(temp: Path) -> None:
        temp.write_bytes(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, boom)
    assert not list(tmp_path.iterdir())

    atomic_write(target, lambda temp: temp.write_bytes(b"done"))
    with pytest.raises(FileExistsError):
        atomic_write(target, lambda temp: temp.write_bytes(b"again"), overwrite=False)
    assert target.read_bytes() == b"done"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


# --- reader mends -------------------------------------------------------------------------


def test_an_empty_npy_file_is_a_clear_error(tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        read_vectors(tmp_path / "empty.npy")
    np.save(tmp_path / "cut.npy", np.zeros((10, 4), np.float32))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:20])  # header cut short
    with pytest.raises(ValueError, match="not a readable .npy"):
        read_vectors(tmp_path / "cut.npy")


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">f2"])
def test_big_endian_npy_files_give_the_native_result(tmp_path, rng, dtype):
    import knng

    x = rng.standard_normal((60, 5)).astype(np.float32)
    np.save(tmp_path / "be.npy", x.astype(dtype))
    mapped = read_vectors(tmp_path / "be.npy")
    native = x.astype(np.dtype(dtype).newbyteorder("="))
    for source in (mapped, np.load(tmp_path / "be.npy")):  # memory-mapped, and in memory
        got, want = knng.graph(source, 4), knng.graph(native, 4)
        np.testing.assert_array_equal(got.indices, want.indices)
        np.testing.assert_array_equal(got.distances, want.distances)


def test_a_closed_hdf5_dataset_is_a_clear_error(tmp_path):
    import knng

    write_hdf5(tmp_path / "a.hdf5", train=np.zeros((10, 3), np.float32))
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        ds = f["train"]
    with pytest.raises(ValueError, match="closed file"):
        knng.graph(ds, 2)
