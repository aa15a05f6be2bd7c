"""Each row's first k entries by (distance, index) (``knng.engine.kernels.row_order``): ranked by a kernel
(narrow rows) or by one sort with ties settled again (wider rows), against the two stable sorts
of its reference, and the reference against Python's own sort of each row.

The kernel runs in Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, as CI runs it) and on
the GPU in ``test_gpu_fused.py``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from knng.engine import kernels
from knng.engine import stages
from knng.engine.kernels import row_order

pytest.importorskip("triton", reason="the kernel runs in Triton's interpreter")


def order_cases(seed: int = 0, wide: bool = False):
    """(label, idx, dist, k): random rows, ties of distance across indices, repeated (distance,
    index) entries, distances that only float32 rounding ties, distances past float32's range,
    empty entries (index −1, whatever their distance), NaN and ±inf distances,
    all-empty rows, widths that are not powers of two, k = 1, k = width, k > width, one entry,
    the widest row the kernel takes and wider ones (``wide``)."""
    gen = np.random.default_rng(seed)
    for width in (1, 5, 16, 37, row_order.MAX_WIDTH - 1, row_order.MAX_WIDTH) + (
            (row_order.MAX_WIDTH + 1, 150, 300) if wide else ()):
        rows = 23
        idx = gen.integers(0, 10 * width, (rows, width))
        dist = gen.standard_normal((rows, width)) ** 2
        dist[:, ::3] = np.round(dist[:, ::3], 1)  # ties across indices
        idx[1::4, :] = idx[1::4, ::-1]
        if width > 1:
            idx[2, 1:], dist[2, 1:] = idx[2, 0], dist[2, 0]  # one (distance, index) repeated
            dist[3, : width // 2] = 0.25  # a row of equal distances
        empty = gen.random((rows, width)) < 0.2
        empty[4] = True  # no entry at all
        idx[empty] = -1
        dist[empty & (gen.random((rows, width)) < 0.5)] = np.nan  # an empty entry's distance is ignored
        dist[5, ::7] = np.nan
        dist[6, ::5] = np.inf
        # distinct in float64, equal once rounded to float32 (the one sort's key), decreasing
        # along the row; and finite distances past float32's range
        dist[7, :] = 1.0 + np.arange(width)[::-1] * 1e-12
        dist[8, ::4] = 1e300 * (1 + np.arange(len(dist[8, ::4])) % 3)
        for k in sorted({1, 3, width // 2 or 1, width, width + 4}):
            yield f"width={width} k={k}", torch.from_numpy(idx), torch.from_numpy(dist), k


def python_order(idx: torch.Tensor, dist: torch.Tensor, k: int) -> tuple[list, list]:
    """Each row's first k (index, distance) by Python's sort of (NaN?, distance, index, position),
    empties as (+inf, the largest index)."""
    out_idx, out_dist = [], []
    for row_i, row_d in zip(idx.tolist(), dist.tolist()):
        keyed = []
        for pos, (x, d) in enumerate(zip(row_i, row_d)):
            if x < 0:
                keyed.append(((False, math.inf, math.inf, pos), x, math.inf))
            else:
                nan = math.isnan(d)
                keyed.append(((nan, math.inf if nan else d, x, pos), x, d))
        keyed.sort(key=lambda e: e[0])
        out_idx.append([e[1] for e in keyed[:k]])
        out_dist.append([e[2] for e in keyed[:k]])
    return out_idx, out_dist


def same(got: torch.Tensor, want: list) -> bool:
    return np.array_equal(got.numpy(), np.array(want, dtype=got.numpy().dtype).reshape(got.shape), equal_nan=True)


def assert_kernel_is_reference(device: torch.device, wide: bool = False, ranked: bool = True) -> int:
    """``top_by_distance`` (the rank kernel where it applies, else the one sort; with ``ranked``
    false the one sort at every width) against the reference."""
    cases = 0
    for label, idx, dist, k in order_cases(wide=wide):
        idx, dist = idx.to(device), dist.to(device)
        carry = torch.arange(idx.numel(), device=device).view(idx.shape)
        assert row_order.row_order_runs(idx) == (ranked and idx.shape[1] <= row_order.MAX_WIDTH
                                                 and kernels.triton_runs(device)), label
        got = row_order.top_by_distance(idx, dist, k, carry)
        want = row_order.top_by_distance_reference(idx, dist, k, carry)
        for name, g, w in zip(("idx", "dist", "carry"), got, want):
            assert g.shape == w.shape == (idx.shape[0], min(k, idx.shape[1])), (label, name)
            assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num()), (label, name)
        cases += 1
    return cases


def test_reference_is_python_order():
    for label, idx, dist, k in order_cases(1, wide=True):
        want_idx, want_dist = python_order(idx, dist, k)
        got_idx, got_dist = row_order.top_by_distance_reference(idx, dist, k)
        assert same(got_idx, want_idx) and same(got_dist, want_dist), label


def test_kernel_is_the_reference(set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert assert_kernel_is_reference(torch.device("cpu")) == 28


@pytest.mark.slow
def test_sort_kernel_is_the_reference(set_options):
    # Every row (the rank kernel's narrow ones too, here) sorted once by the sort kernel, the
    # rows with a tie or a NaN in their first k + 1 again by the reference.
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    set_options(sort_interpreted=True)
    set_options(kernels={"row_order": False})
    with stages.recording() as sorted_rows:
        assert assert_kernel_is_reference(torch.device("cpu"), wide=True, ranked=False) == 43
    # every case but those whose k passes ROUNDED_KEY_MAX_K (torch's sort)
    want = [idx.shape[1] for _, idx, _, k in order_cases(wide=True)
            if min(k, idx.shape[1]) <= row_order.ROUNDED_KEY_MAX_K]
    assert sorted_rows["finish.sort_kernel"] == len(want) == 41


def test_sort_kernel_codes_order_as_the_keys():
    # The kernel's codes: equal exactly where the float32 keys are (−0 and +0 equal), ordered as
    # they are; its positions a stable sort's.
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    dist = torch.tensor([[0.5, -0.0, 0.0, 1e-300, -1e-300, 3.0, 1.0 + 1e-12, 1.0, float("inf"), 2.0]],
                        dtype=torch.float64)
    idx = torch.tensor([[4, 2, 7, 1, 3, 0, 9, 8, -1, 5]])
    codes, order = row_order._sorted_head(idx, dist, 10)
    key = torch.where(idx >= 0, dist, torch.inf).to(torch.float32)
    want = torch.sort(key + 0.0, stable=True)
    assert torch.equal(order, want.indices)
    c = codes[0].tolist()
    assert c == sorted(c) and c[0] == c[1] == c[2] == c[3]  # -1e-300, -0, +0, 1e-300 all round to ±0
    assert c[4] < c[5] == c[6] < c[7] < c[8] < c[9]


def test_one_sort_is_the_reference():
    # Without the kernel (a CPU, or rows wider than it takes) rows are sorted once by distance
    # and those with a tie or a NaN in their first k + 1 sorted again by the reference.
    assert assert_kernel_is_reference(torch.device("cpu"), wide=True) == 43


def test_wide_rows_take_the_sorts(monkeypatch, set_options):
    set_options(kernels={"triton": True})
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as on a GPU
    wide = torch.zeros((3, row_order.MAX_WIDTH + 1), dtype=torch.int64)
    assert not row_order.row_order_runs(wide) and row_order.row_sort_runs(wide, 10)
    assert not row_order.row_order_runs(torch.zeros((0, 8), dtype=torch.int64))
    widest = torch.zeros((3, row_order.SORT_MAX_WIDTH), dtype=torch.int64)
    assert row_order.row_sort_runs(widest, 10) and not row_order.row_sort_runs(widest, 257)
    assert not row_order.row_sort_runs(torch.zeros((3, row_order.SORT_MAX_WIDTH + 1), dtype=torch.int64), 10)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter: torch's sort unless asked
    assert not row_order.row_sort_runs(wide, 10)
