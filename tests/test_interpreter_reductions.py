"""tests/conftest.py runs the Triton interpreter's reductions and scans with custom combine
functions slice by slice; here interpreted kernels give the same bits that way as by the
interpreter's own element-by-element loop, and what NumPy gives.

The kernels of the engine depend on these through ``tl.sort`` (a bitonic sort whose swaps are
``xor_sum`` reductions) and ``tl.associative_scan`` with a running maximum; the cases add a fold
whose order shows (a non-associative float combine), tuple combines, a reversed scan, axis None
and keep_dims.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton", reason="the kernels run in Triton's interpreter")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton's interpreter is chosen at start only without a GPU")


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _lopsided(a, b):
    # Not associative: the value depends on the order of the fold.
    return a * 0.5 + b


@triton.jit
def _min_and_where(a, ia, b, ib):
    take_b = (b < a) | ((b == a) & (ib < ia))
    return tl.where(take_b, b, a), tl.where(take_b, ib, ia)


@triton.jit
def reductions_kernel(ints, floats, sorted_ints, sorted_floats, xors, xor_rows, xor_all, maxes, maxes_back,
                      folded, fold_scan, low, low_at, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    c = tl.arange(0, C)
    at = r[:, None] * C + c[None, :]
    x = tl.load(ints + at)
    f = tl.load(floats + at)
    tl.store(sorted_ints + at, tl.sort(x, dim=1))
    tl.store(sorted_floats + at, tl.sort(f, dim=1, descending=True))
    tl.store(xors + c, tl.xor_sum(x, axis=0))
    tl.store(xor_rows + at, tl.broadcast_to(tl.xor_sum(x, axis=1, keep_dims=True), (R, C)))
    tl.store(xor_all, tl.xor_sum(x))
    tl.store(maxes + at, tl.associative_scan(x, 1, _larger))
    tl.store(maxes_back + at, tl.associative_scan(x, 0, _larger, reverse=True))
    tl.store(folded + r, tl.reduce(f, 1, _lopsided))
    tl.store(fold_scan + at, tl.associative_scan(f, 1, _lopsided))
    value, where = tl.reduce((f, at), 1, _min_and_where)
    tl.store(low + r, value)
    tl.store(low_at + r, where)


def _run(ints: torch.Tensor, floats: torch.Tensor) -> dict[str, torch.Tensor]:
    rows, cols = ints.shape
    out = {
        "sorted_ints": torch.empty_like(ints), "sorted_floats": torch.empty_like(floats),
        "xors": torch.empty(cols, dtype=ints.dtype), "xor_rows": torch.empty_like(ints),
        "xor_all": torch.empty(1, dtype=ints.dtype), "maxes": torch.empty_like(ints),
        "maxes_back": torch.empty_like(ints), "folded": torch.empty(rows, dtype=floats.dtype),
        "fold_scan": torch.empty_like(floats), "low": torch.empty(rows, dtype=floats.dtype),
        "low_at": torch.empty(rows, dtype=torch.int32),
    }
    reductions_kernel[(1,)](ints, floats, *out.values(), R=rows, C=cols)
    return out


@pytest.mark.parametrize("rows, cols", [(1, 2), (4, 8), (16, 64)])
def test_slicewise_reductions_equal_the_interpreters_loop_and_numpy(monkeypatch, rng, seed, rows, cols):
    from triton.runtime.interpreter import ReduceOps, ScanOps

    assert ReduceOps.generic_reduce is not ReduceOps.elementwise_generic_reduce  # the shortcut is on
    ints = rng.integers(-2**62, 2**62, (rows, cols))
    ints[:, ::3] = ints[:, :1]  # ties
    ints.flat[::5] = np.iinfo(np.int64).min
    floats = (rng.standard_normal((rows, cols)) * 10.0 ** rng.integers(-20, 20, (rows, cols))).astype(np.float32)
    floats.flat[::7] = -0.0
    floats.flat[1::11] = 0.0
    floats.flat[2::13] = np.inf
    floats[:, -1] = floats[:, 0]
    ints, floats = torch.from_numpy(ints), torch.from_numpy(floats)

    fast = _run(ints, floats)
    monkeypatch.setattr(ReduceOps, "generic_reduce", ReduceOps.elementwise_generic_reduce)
    monkeypatch.setattr(ScanOps, "generic_scan", ScanOps.elementwise_generic_scan)
    slow = _run(ints, floats)
    for name in fast:
        a, b = fast[name], slow[name]
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)
        assert torch.equal(a, b), (name, seed)

    x, f = ints.numpy(), floats.numpy()
    np.testing.assert_array_equal(fast["sorted_ints"].numpy(), np.sort(x, axis=1))
    np.testing.assert_array_equal(fast["sorted_floats"].numpy(), -np.sort(-f, axis=1))
    np.testing.assert_array_equal(fast["xors"].numpy(), np.bitwise_xor.reduce(x, axis=0))
    np.testing.assert_array_equal(fast["xor_rows"].numpy()[:, 0], np.bitwise_xor.reduce(x, axis=1))
    assert fast["xor_all"].item() == np.bitwise_xor.reduce(x, axis=None)
    np.testing.assert_array_equal(fast["maxes"].numpy(), np.maximum.accumulate(x, axis=1))
    np.testing.assert_array_equal(fast["maxes_back"].numpy(), np.maximum.accumulate(x[::-1], axis=0)[::-1])
    fold = f[:, 0].copy()
    scan = [fold.copy()]
    for j in range(1, cols):
        fold = (fold * np.float32(0.5) + f[:, j]).astype(np.float32)
        scan.append(fold.copy())
    np.testing.assert_array_equal(fast["folded"].numpy(), fold)
    np.testing.assert_array_equal(fast["fold_scan"].numpy(), np.stack(scan, axis=1))
    lowest = np.lexsort((np.arange(cols)[None, :].repeat(rows, 0), f), axis=1)[:, 0]
    np.testing.assert_array_equal(fast["low"].numpy(), f[np.arange(rows), lowest])
    np.testing.assert_array_equal(fast["low_at"].numpy(), np.arange(rows) * cols + lowest)
