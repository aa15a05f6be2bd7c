"""The baseline k-selections — NumPy insertion, bitonic and batch-sort references, and the torch
``select="batch_sort"`` — against the oracle :func:`knng.select.keys.select_reference`.

Every sorted answer must equal the oracle exactly: values bit for bit (−0.0 and NaN payloads
included) and indices, on random and adversarial blocks (ties, signed zeros, infinities, NaN,
huge offsets, subnormals) of awkward shapes.
"""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import pytest
import torch

from knng.select import available, get, resolve, select_columns
from knng.select.batch_sort import batch_sort_rows_and_columns, batch_sort_select, batch_sort_select_columns
from knng.select.keys import select_reference
from knng.select.reference.baselines import (
    batch_sort_reference, bitonic_merge, bitonic_reference, bitonic_sort, insertion_reference,
)

RowSelect = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def _nan(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


#: NaNs of both signs, quiet and signalling, with payloads: all rank last, ordered by index.
NANS = [_nan(0x7FC00000), _nan(0xFFC00000), _nan(0x7FC00123), _nan(0x7F800001)]


def _from_pool(rng: np.random.Generator, shape: tuple[int, int], pool: list[float]) -> np.ndarray:
    """Random normals with a third of the entries drawn from ``pool`` (the special values)."""
    x = rng.standard_normal(shape).astype(np.float32)
    special = rng.random(shape) < 1 / 3
    x[special] = np.array(pool, dtype=np.float32)[rng.integers(0, len(pool), special.sum())]
    return x


#: Block generators ``(rng, shape) -> float32 array``; none is all zeros.
BLOCKS: dict[str, Callable[[np.random.Generator, tuple[int, int]], np.ndarray]] = {
    "normal": lambda rng, s: rng.standard_normal(s).astype(np.float32),
    "integer_ties": lambda rng, s: rng.integers(-2, 3, s).astype(np.float32),
    "equal_rows": lambda rng, s: np.broadcast_to(rng.integers(1, 4, (s[0], 1)) * 1.5, s).astype(np.float32),
    "signed_zeros": lambda rng, s: _from_pool(rng, s, [-0.0, 0.0, -0.0, 0.0, 1.0, -1.0]),
    "infinities": lambda rng, s: _from_pool(rng, s, [np.inf, -np.inf, np.inf, -np.inf, 1.0]),
    "nan": lambda rng, s: _from_pool(rng, s, [*NANS, np.inf, -np.inf, -0.0]),
    "huge_offset": lambda rng, s: (np.float32(1e30) + rng.integers(-3, 4, s) * np.float32(2.0**76)
                                   + rng.standard_normal(s) * np.float32(1e23)).astype(np.float32),
    "subnormal": lambda rng, s: (rng.integers(-4, 5, s) * np.float32(2.0**-149)).astype(np.float32),
}

#: Single rows and columns, more rows than columns and vice versa, widths not a multiple of
#: 32 nor of the bitonic chunk.
SHAPES = [(1, 1), (1, 37), (37, 1), (6, 100), (100, 6), (7, 33), (3, 64), (5, 129)]


def _ks(cols: int) -> list[int]:
    """k = 1, k = cols, and k between (not a power of two where the row allows)."""
    return sorted({1, cols, max(1, cols // 2), min(cols, 5), min(cols, 17)})


def _torch_rows(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    v, i = batch_sort_select(torch.from_numpy(values), k, sorted=True)
    return v.numpy(), i.numpy()


def _torch_columns_of_transpose(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    # The columns of the (non-contiguous) transpose are the rows of ``values``.
    v, i = batch_sort_select_columns(torch.from_numpy(values.T), k)
    return v.numpy(), i.numpy()


#: Every way to get a row's k smallest, each as ``fn(values, k) -> (values, indices)``.
ROW_SELECTS: dict[str, RowSelect] = {
    "insertion": insertion_reference,
    "bitonic": bitonic_reference,
    "batch_sort_reference_rows": lambda v, k: batch_sort_reference(v, k, 0)[:2],
    "batch_sort_reference_columns": lambda v, k: batch_sort_reference(v.T, 0, k)[2:],
    "batch_sort_torch_rows": _torch_rows,
    "batch_sort_torch_columns": _torch_columns_of_transpose,
}


def assert_same(got: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray], context: str) -> None:
    """Equal values bit for bit and equal int64 indices."""
    values, indices = (np.asarray(a) for a in got)
    assert indices.dtype == np.int64, f"[{context}] indices are {indices.dtype}"
    assert values.dtype == np.float32, f"[{context}] values are {values.dtype}"
    assert values.shape == expected[0].shape, f"[{context}] shape {values.shape}, expected {expected[0].shape}"
    np.testing.assert_array_equal(indices, expected[1], err_msg=context)
    assert np.array_equal(values.view(np.uint32), expected[0].view(np.uint32)), f"[{context}] values differ"


def _as_numpy(pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    return pair[0].numpy(), pair[1].numpy()


# ------------------------------------------------------------------------------- rows
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("algorithm", ROW_SELECTS)
def test_rows_equal_oracle(algorithm, block, rng, seed):
    fn = ROW_SELECTS[algorithm]
    for shape in SHAPES:
        x = BLOCKS[block](rng, shape)
        for k in _ks(shape[1]):
            assert_same(fn(x, k), select_reference(x, k), f"seed={seed} {algorithm} {block} {shape} k={k}")


@pytest.mark.parametrize("algorithm", ROW_SELECTS)
def test_rows_edge_blocks(algorithm, rng):
    fn = ROW_SELECTS[algorithm]
    x = rng.standard_normal((4, 9)).astype(np.float32)
    for block, k in [(x, 0), (x[:0], 0), (x[:0], 9), (x[:, :0], 0)]:
        assert_same(fn(block, k), select_reference(block, k), f"{algorithm} {block.shape} k={k}")


@pytest.mark.parametrize("algorithm", ROW_SELECTS)
def test_bad_k_raises(algorithm):
    fn = ROW_SELECTS[algorithm]
    x = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    for k in (-1, 5):
        with pytest.raises(ValueError, match=r"\bk\w* must lie in \[0, 4\]"):
            fn(x, k)


def test_bad_input_raises():
    for fn in (insertion_reference, bitonic_reference):
        with pytest.raises(ValueError, match="2-D"):
            fn(np.ones(5, dtype=np.float32), 1)
    with pytest.raises(ValueError, match="k_cols"):
        batch_sort_reference(np.ones((3, 4), dtype=np.float32), 2, 4)
    with pytest.raises(ValueError, match="2-D"):
        batch_sort_select(torch.ones(5), 1)
    with pytest.raises(TypeError, match="floating-point"):
        batch_sort_select(torch.ones((3, 4), dtype=torch.int64), 1)
    with pytest.raises(ValueError, match=r"\bk must lie in \[0, 3\]"):
        batch_sort_select_columns(torch.ones((3, 4)), 4)
    with pytest.raises(ValueError, match=r"\bk_cols must lie in \[0, 3\]"):
        batch_sort_rows_and_columns(torch.ones((3, 4)), 2, 4)
    with pytest.raises(ValueError, match=r"\bk_rows must lie in \[0, 4\]"):
        batch_sort_rows_and_columns(torch.ones((3, 4)), -1, 2)


# ------------------------------------------------------------------------ the network
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_bitonic_network_sorts_every_binary_input(n):
    # The 0/1 principle: a comparator network that sorts every 0/1 input sorts every input.
    inputs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(np.uint64)
    np.testing.assert_array_equal(bitonic_sort(inputs), np.sort(inputs, axis=1))
    # Ascending half + descending half is bitonic: the merge alone must sort it.
    half = n // 2
    bitonic = np.concatenate([np.sort(inputs[:, :half], axis=1), np.sort(inputs[:, half:], axis=1)[:, ::-1]], axis=1)
    np.testing.assert_array_equal(bitonic_merge(bitonic), np.sort(inputs, axis=1))


def test_bitonic_network_sorts_every_permutation_of_8():
    perms = np.array(list(itertools.permutations(range(8))), dtype=np.uint64)
    np.testing.assert_array_equal(bitonic_sort(perms), np.broadcast_to(np.arange(8, dtype=np.uint64), perms.shape))


def test_bitonic_network_needs_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        bitonic_sort(np.zeros((2, 6), dtype=np.uint64) + 1)
    with pytest.raises(ValueError, match="power-of-two"):
        bitonic_merge(np.zeros((2, 3), dtype=np.uint64) + 1)


# ---------------------------------------------------------------- batch sort, rows and columns
@pytest.mark.parametrize("block", ["normal", "integer_ties", "nan", "signed_zeros"])
def test_batch_sort_rows_and_columns_equal_reference_and_oracle(block, rng, seed):
    for shape in SHAPES:
        x = BLOCKS[block](rng, shape)
        for kr, kc in [(1, 1), (shape[1], shape[0]), (min(5, shape[1]), min(3, shape[0]))]:
            ctx = f"seed={seed} {block} {shape} k_rows={kr} k_cols={kc}"
            got = [t.numpy() for t in batch_sort_rows_and_columns(torch.from_numpy(x), kr, kc)]
            ref = batch_sort_reference(x, kr, kc)
            assert_same(got[:2], ref[:2], ctx + " rows, torch against numpy")
            assert_same(got[2:], ref[2:], ctx + " columns, torch against numpy")
            assert_same(got[:2], select_reference(x, kr), ctx + " rows")
            assert_same(got[2:], select_reference(x.T, kc), ctx + " columns")


def test_batch_sort_registered_and_columns_through_registry(rng, seed):
    assert "batch_sort" in available()
    fn = get("batch_sort")
    assert fn is batch_sort_select
    assert resolve("batch_sort", rows=7, cols=33, k=3, device=torch.device("cpu")) is fn
    x = BLOCKS["integer_ties"](rng, (7, 33))
    assert_same(_as_numpy(select_columns(fn, torch.from_numpy(x), 4)), select_reference(x.T, 4), f"seed={seed}")


def test_batch_sort_non_contiguous(rng, seed):
    wide = torch.from_numpy(BLOCKS["nan"](rng, (12, 50)))
    for view in (wide[:, ::2], wide.T, wide[1::3, 3:40]):
        assert not view.is_contiguous()
        x = view.numpy()
        assert_same(_as_numpy(batch_sort_select(view, 4)), select_reference(x, 4), f"seed={seed} rows")
        assert_same(_as_numpy(batch_sort_select_columns(view, 3)), select_reference(x.T, 3), f"seed={seed} cols")


@pytest.mark.parametrize("shape,k_rows,k_cols", [((0, 5), 3, 0), ((4, 0), 0, 4), ((3, 5), 0, 0), ((1, 1), 1, 1)])
def test_batch_sort_empty_blocks_and_zero_k(shape, k_rows, k_cols):
    x = np.arange(1, 1 + shape[0] * shape[1], dtype=np.float32).reshape(shape)
    rv, ri, cv, ci = batch_sort_rows_and_columns(torch.from_numpy(x), k_rows, k_cols)
    assert_same(_as_numpy((rv, ri)), select_reference(x, k_rows), f"{shape} rows")
    assert_same(_as_numpy((cv, ci)), select_reference(x.T, k_cols), f"{shape} columns")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_batch_sort_half_precision_upcasts_exactly(dtype, rng, seed):
    x = torch.from_numpy(BLOCKS["nan"](rng, (9, 40))).to(dtype)
    v, i = batch_sort_select(x, 11)
    upcast = x.to(torch.float32).numpy()
    _, ref_i = select_reference(upcast, 11)
    assert v.dtype == dtype
    np.testing.assert_array_equal(i.numpy(), ref_i, err_msg=f"seed={seed}")
    assert torch.equal(v.view(torch.int16), torch.gather(x, 1, i).view(torch.int16))


def test_batch_sort_float64_keeps_full_precision(rng, seed):
    # Neighbours 1e-12 apart are one float32: the float64 order, not the index, must decide.
    x = 1.0 + rng.integers(-50, 50, (6, 70)) * 1e-12
    v, i = batch_sort_select(torch.from_numpy(x), 20)
    order = np.lexsort((np.broadcast_to(np.arange(70), x.shape), x), axis=1)[:, :20]
    np.testing.assert_array_equal(i.numpy(), order, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(v.numpy(), np.take_along_axis(x, order, axis=1))


def test_batch_sort_float64_special_values_follow_the_order():
    row = [np.nan, 1.0, -0.0, np.inf, 0.0, -np.inf, -1.0, 5e-324, -5e-324, -np.nan, 1.0, -1.0 - 2**-52, -0.0]
    x = torch.tensor([row], dtype=torch.float64)
    _, i = batch_sort_select(x, len(row))
    assert i.tolist() == [[5, 11, 6, 8, 2, 12, 4, 7, 1, 10, 3, 0, 9]]
    # Values a float32 holds exactly order as in float32.
    f32 = BLOCKS["nan"](np.random.default_rng(0), (5, 30))
    _, i64 = batch_sort_select_columns(torch.from_numpy(f32).double(), 5)  # NumPy warns on signalling NaNs
    np.testing.assert_array_equal(i64.numpy(), select_reference(f32.T, 5)[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("block", BLOCKS)
def test_batch_sort_cuda_equals_cpu(block, rng, seed):
    x = torch.from_numpy(BLOCKS[block](rng, (300, 257)))
    cpu = batch_sort_rows_and_columns(x, 17, 33)
    gpu = batch_sort_rows_and_columns(x.cuda(), 17, 33)
    for c, g in zip(cpu, gpu):
        c, g = (t.view(torch.int32) if t.dtype == torch.float32 else t for t in (c, g.cpu()))
        assert torch.equal(c, g), f"seed={seed} {block}"
