"""Bad input gets a ValueError / TypeError whose message names the offending argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng

X = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
Q = X[:5].copy()


def _raises(exc, name, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert name in str(info.value), f"message does not name {name!r}: {info.value}"
    return info


# ------------------------------------------------------------------------------ NaN / Inf
def _with_bad(x: np.ndarray, row: int, value: float) -> np.ndarray:
    x = x.copy()
    x[row, 2] = value
    return x


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("row", [0, 3])
def test_nan_inf_in_queries(value, row):
    info = _raises(ValueError, "queries", knng.search, _with_bad(Q, row, value), X, 3)
    assert f"row {row}" in str(info.value)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("row", [0, 37])
def test_nan_inf_in_corpus(value, row):
    info = _raises(ValueError, "corpus", knng.search, Q, _with_bad(X, row, value), 3)
    assert f"row {row}" in str(info.value)


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("include_self", [False, True])
def test_nan_inf_in_graph_data(value, include_self):
    info = _raises(ValueError, "data", knng.graph, _with_bad(X, 41, value), 3, include_self=include_self)
    assert "row 41" in str(info.value)


@pytest.mark.parametrize("row", [1, 4500, 9999])
def test_nan_in_memmap_far_row(row, tmp_path):
    # 10 000 rows: the engine reads memory maps in blocks of ≥ 4096 rows, so rows 4500 and
    # 9999 sit in later blocks; the message must give the global row number.
    big = np.random.default_rng(1).standard_normal((10000, 4)).astype(np.float32)
    big[row, 3] = np.nan
    np.save(tmp_path / "c.npy", big)
    corpus = np.load(tmp_path / "c.npy", mmap_mode="r")
    info = _raises(ValueError, "corpus", knng.search, Q, corpus, 3)
    assert f"row {row}" in str(info.value)
    info = _raises(ValueError, "data", knng.graph, corpus, 3)
    assert f"row {row}" in str(info.value)
    # Memory-mapped queries are checked in one pass before any screening.
    info = _raises(ValueError, "queries", knng.search, corpus, X[:8], 3)
    assert f"row {row}" in str(info.value)


def test_nan_in_other_kinds(tmp_path):
    import h5py

    bad = _with_bad(X, 20, np.nan)
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("x", data=bad)
    with h5py.File(tmp_path / "d.h5", "r") as f:
        _raises(ValueError, "corpus", knng.search, Q, f["x"], 3)
    _raises(ValueError, "corpus", knng.search, Q, torch.from_numpy(bad), 3)
    _raises(ValueError, "queries", knng.search, torch.from_numpy(bad).to(torch.bfloat16), X, 3)
    _raises(ValueError, "data", knng.graph, torch.from_numpy(bad).to(torch.float16), 3)
    wide = np.repeat(bad, 2, axis=1)[:, ::2]  # non-contiguous view
    _raises(ValueError, "data", knng.graph, wide, 3)
    f16 = X.astype(np.float16)
    f16[7, 0] = np.float16(np.inf)
    _raises(ValueError, "data", knng.graph, f16, 3)
    _raises(ValueError, "queries", knng.search, [[0.0, 1.0, float("nan"), 2.0]], X, 3)


# ------------------------------------------------------------------------------------- k
@pytest.mark.parametrize("k", [0, -1, 51, 10**9])
def test_search_k_out_of_range(k):
    _raises(ValueError, "k", knng.search, Q, X, k)


@pytest.mark.parametrize("k", [2.5, 3.0, True, False, "3", None, np.float64(3)])
def test_k_not_an_integer(k):
    _raises(TypeError, "k", knng.search, Q, X, k)
    _raises(TypeError, "k", knng.graph, X, k)


def test_k_numpy_integer_is_fine():
    res = knng.search(Q, X, np.int64(3))
    assert res.indices.shape == (5, 3)
    assert knng.graph(X, np.int32(49)).indices.shape == (50, 49)


@pytest.mark.parametrize("k,include_self", [(0, False), (-1, False), (50, False), (51, True), (0, True)])
def test_graph_k_out_of_range(k, include_self):
    _raises(ValueError, "k", knng.graph, X, k, include_self=include_self)


def test_graph_of_one_point():
    _raises(ValueError, "data", knng.graph, X[:1], 1)
    assert knng.graph(X[:1], 1, include_self=True).indices.tolist() == [[0]]


# --------------------------------------------------------------------------- shape, dtype
def test_mismatched_dimensions():
    info = _raises(ValueError, "queries", knng.search, Q[:, :3], X, 3)
    assert "corpus" in str(info.value)
    _raises(ValueError, "corpus", knng.search, torch.from_numpy(Q), torch.from_numpy(X[:, :2]), 3)


@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (0, 0)])
def test_empty_arrays(shape):
    empty = np.zeros(shape, dtype=np.float32)
    _raises(ValueError, "queries", knng.search, empty, X, 1)
    _raises(ValueError, "corpus", knng.search, Q, empty, 1)
    _raises(ValueError, "data", knng.graph, empty, 1)
    _raises(ValueError, "data", knng.graph, torch.from_numpy(empty), 1)
    _raises(ValueError, "queries", knng.search, [], X, 1)


@pytest.mark.parametrize("shape", [(4,), (2, 5, 4), ()])
def test_wrong_number_of_dimensions(shape):
    bad = np.ones(shape, dtype=np.float32)
    _raises(ValueError, "queries", knng.search, bad, X, 1)
    _raises(ValueError, "corpus", knng.search, Q, bad, 1)
    _raises(ValueError, "data", knng.graph, bad, 1)
    _raises(ValueError, "data", knng.graph, torch.from_numpy(bad), 1)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex64, np.uint16, np.int16, object])
def test_unsupported_numpy_dtypes(dtype):
    bad = X.astype(dtype)
    _raises(TypeError, "queries", knng.search, bad[:5], X, 1)
    _raises(TypeError, "corpus", knng.search, Q, bad, 1)
    _raises(TypeError, "data", knng.graph, bad, 1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.int16])
def test_unsupported_torch_dtypes(dtype):
    bad = torch.from_numpy(X).to(dtype)
    _raises(TypeError, "queries", knng.search, bad[:5], torch.from_numpy(X), 1)
    _raises(TypeError, "data", knng.graph, bad, 1)


@pytest.mark.parametrize("bad", [None, "abc", 3.0, {"a": 1}, [["a", "b"]], [[1.0, 2.0], [3.0]]])
def test_not_an_array(bad):
    _raises(TypeError, "queries", knng.search, bad, X, 1)
    _raises(TypeError, "data", knng.graph, bad, 1)


# --------------------------------------------------------------------------- other arguments
@pytest.mark.parametrize("metric", ["l2", "Euclidean ", "", None, 3, "manhattan"])
def test_bad_metric(metric):
    _raises(ValueError, "metric", knng.search, Q, X, 3, metric=metric)
    _raises(ValueError, "metric", knng.graph, X, 3, metric=metric)


@pytest.mark.parametrize("device", ["gpu", "tpu", "meta", "cuda:abc", "", None, 3.5]
                         + ([] if torch.cuda.is_available() else ["cuda", "cuda:0"]))
def test_bad_device(device):
    _raises(ValueError, "device", knng.search, Q, X, 3, device=device)
    _raises(ValueError, "device", knng.graph, X, 3, device=device)


@pytest.mark.parametrize("select", ["nope", "", None, 3, "AUTO"])
def test_bad_select(select):
    with pytest.raises((ValueError, TypeError)) as info:
        knng.search(Q, X, 3, select=select)
    assert "select" in str(info.value)
    with pytest.raises((ValueError, TypeError)) as info:
        knng.graph(X, 3, select=select)
    assert "select" in str(info.value)


@pytest.mark.parametrize("budget,exc", [("lots", ValueError), (-1, ValueError), (0, ValueError), ("0MB", ValueError),
                                        ("-5MB", ValueError), ("12 parsecs", ValueError), (0.5, ValueError),
                                        (True, TypeError), ([1], TypeError), ("1e9", ValueError)])
def test_bad_memory_budget(budget, exc):
    _raises(exc, "memory_budget", knng.search, Q, X, 3, memory_budget=budget)
    _raises(exc, "memory_budget", knng.graph, X, 3, memory_budget=budget)


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_memory_budget(budget):
    with pytest.raises((ValueError, TypeError)) as info:
        knng.search(Q, X, 3, memory_budget=budget)
    assert "memory_budget" in str(info.value)


@pytest.mark.parametrize("budget", ["4MB", "4 MiB", 10**7, 1e7, "512kb"])
def test_good_memory_budgets(budget):
    assert knng.search(Q, X, 3, memory_budget=budget).indices.shape == (5, 3)


@pytest.mark.parametrize("include_self", [1, 0, "yes", None, np.int64(1)])
def test_include_self_not_bool(include_self):
    _raises(TypeError, "include_self", knng.graph, X, 3, include_self=include_self)


def test_inputs_are_not_modified():
    q, x = Q.copy(), X.copy()
    knng.search(q, x, 4, metric="pearson")
    knng.graph(x, 4, metric="cosine")
    np.testing.assert_array_equal(q, Q)
    np.testing.assert_array_equal(x, X)
    t = torch.from_numpy(X.copy())
    knng.graph(t, 3, metric="inner_product")
    np.testing.assert_array_equal(t.numpy(), X)


def test_nan_in_lazy_queries_is_found_before_any_screening(tmp_path, monkeypatch, rng):
    """A NaN in the last row of memory-mapped queries is reported before the corpus is screened."""
    import knng.engine.search.knn as search_module

    q = rng.random((3000, 8)).astype(np.float32)
    q[-1, 3] = np.nan
    np.save(tmp_path / "q.npy", q)
    queries = np.load(tmp_path / "q.npy", mmap_mode="r")
    corpus = rng.random((400, 8)).astype(np.float32)

    def no_screening(*args, **kwargs):
        raise AssertionError("screened a chunk before the queries were checked")

    monkeypatch.setattr(search_module, "_screen_chunk", no_screening)
    with pytest.raises(ValueError, match=r"queries.*row 2999"):
        knng.search(queries, corpus, 3, memory_budget="64KB")


def test_read_ahead_yields_every_range_in_order_and_stops_cleanly(tmp_path, rng):
    # File-backed inputs are read ahead by a background thread (double buffering): the blocks
    # must be the same, in the same order, whatever the read-ahead; a consumer that stops early
    # leaves no thread behind; a read that fails raises in the consumer.
    import threading

    from knng._inputs import as_input

    x = rng.standard_normal((1000, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    m = as_input(np.load(tmp_path / "x.npy", mmap_mode="r"), "data")
    ranges = [(0, 7), (7, 300), (300, 301), (301, 1000)]
    for ahead in (0, 1, 2, 5):
        got = list(m.iter_ranges(ranges, read_ahead=ahead))
        assert [(a, b) for a, b, _ in got] == ranges
        for a, b, block in got:
            np.testing.assert_array_equal(block.numpy(), x[a:b])
    blocks = m.iter_blocks(64, read_ahead=2)
    next(blocks)
    blocks.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("knng-read")]

    class Failing:
        shape, dtype = (100, 5), np.dtype(np.float32)

        def __getitem__(self, index):
            if isinstance(index, slice) and index.start >= 50:
                raise OSError("disk gone")
            return x[index]

    failing = as_input(Failing(), "data")
    with pytest.raises(OSError, match="disk gone"):
        list(failing.iter_blocks(25, read_ahead=2))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu])])
def test_read_to_copies_every_kind_of_input_whole(tmp_path, rng, device):
    # A file is read whole by several threads in chunks (into a GPU through pinned buffers on
    # side streams): every row arrives once, in place, in its own dtype, whatever the chunk
    # (one row, a partial last chunk, more chunks than threads) and the file's layout.
    import threading

    from knng._inputs import as_input

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = rng.standard_normal((1001, 7)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "be.npy", x.astype(">f8"))
    np.save(tmp_path / "u8.npy", (x * 40 + 100).astype(np.uint8))
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")

    class Rows:  # a row-sliceable dataset (h5py-like): read through InputArray.rows
        shape, dtype = x.shape, np.dtype(np.float32)

        def __getitem__(self, index):
            return x[index]

    cases = {
        "memmap": (mapped, x),
        "strided memmap": (mapped[:, ::2], x[:, ::2]),
        "big-endian float64": (np.load(tmp_path / "be.npy", mmap_mode="r"), x.astype(np.float64)),
        "uint8": (np.load(tmp_path / "u8.npy", mmap_mode="r"), (x * 40 + 100).astype(np.uint8)),
        "rows": (Rows(), x),
        "in memory": (x, x),
    }
    for name, (source, want) in cases.items():
        data = as_input(source, "data")
        for chunk, threads in ((1, 3), (7 * 8 * 100, 4), (1 << 20, 8)):
            got = data.read_to(torch.device(device), chunk_bytes=chunk, threads=threads)
            assert got.in_memory and got.tensor.device.type == device and got.shape == want.shape, name
            assert got.tensor.dtype == data.dtype, name
            if device == "cuda":
                torch.cuda.synchronize()
            np.testing.assert_array_equal(got.tensor.cpu().numpy(), want, err_msg=f"{name}, chunk {chunk}")
    assert not [t for t in threading.enumerate() if t.name.startswith("knng-read")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_first_nonfinite_row_whatever_the_sum(dtype):
    # The first row holding a NaN or an Inf, found whether the block's sum is NaN, infinite or
    # (+inf and -inf together) NaN; finite values whose sum overflows are not refused.
    from knng._inputs import first_nonfinite_row

    big = torch.finfo(dtype).max
    x = torch.full((64, 5), big / 2, dtype=dtype)  # finite, but their sum overflows
    assert first_nonfinite_row(x) is None
    assert first_nonfinite_row(torch.zeros((0, 5), dtype=dtype)) is None
    for bad in ((float("nan"),), (float("inf"),), (-float("inf"),), (float("inf"), -float("inf"))):
        y = torch.zeros((64, 5), dtype=dtype)
        for offset, value in enumerate(bad):
            y[17 + 20 * offset, offset] = value
        assert first_nonfinite_row(y) == 17
        y[40:] = big / 2
        assert first_nonfinite_row(y) == 17
