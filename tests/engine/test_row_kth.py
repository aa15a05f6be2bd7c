"""Each row's smallest and k-th key without a sort (``knng.engine.kernels.row_kth``) against its sort.

The kernels run in Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, as CI runs them) and on
the GPU in ``test_gpu_fused.py``; the reference is the one int64 sort of (row, key code) pairs,
and both are checked against NumPy's own order of the keys.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import knng
from knng.engine.kernels import row_kth

#: The options' defaults: the sizes the planner takes unless told otherwise.
DEFAULTS = knng.Options()

pytest.importorskip("triton", reason="the kernels run in Triton's interpreter")


def key_cases(seed: int = 0):
    """(label, rows, keys, n, k): random keys, ties, duplicates, ±0, ±inf, huge and tiny keys,
    rows with fewer than k pairs and rows with none, k = 1, k = a row's whole count, rows short
    enough to be sorted in registers (k = their width: full rows of exactly that width) and
    rows longer than the kernel's chunk, float64 keys; at a rank the rounds kernel takes, rows
    up to and just past its width, and NaN keys whose codes reach the int32 maximum it marks
    taken codes with; rows up to and just past the bisection's width (k = 101)."""
    gen = np.random.default_rng(seed)
    n = 40
    for k in (1, 3, row_kth.ROUNDS_MAX_K, row_kth.SMALL_WIDTH, 101, 1500):
        wide = {row_kth.ROUNDS_MAX_K: row_kth.ROUNDS_WIDTH + 40, 101: row_kth.BISECT_WIDTH + 40}
        counts = gen.integers(0, wide.get(k, 2 * k + 5), n)
        counts[::7] = 0
        counts[1::9] = k  # exactly k: the k-th is the row's largest
        counts[2] = 2500  # more than one chunk
        counts[3], counts[4] = row_kth.ROUNDS_WIDTH, row_kth.ROUNDS_WIDTH + 1
        counts[5], counts[6] = row_kth.BISECT_WIDTH, row_kth.BISECT_WIDTH + 1
        rows = np.repeat(np.arange(n), counts)
        gen.shuffle(rows)
        keys = (gen.standard_normal(rows.size) * 10.0 ** gen.integers(-30, 30, rows.size)).astype(np.float32)
        keys[::5] = 1.5  # ties across and within rows
        keys[1::23] = -0.0
        keys[2::23] = 0.0
        keys[3::31] = np.inf
        keys[4::37] = -np.inf
        keys[5::41] = -3.4e38
        keys.view(np.int32)[6::43] = 0x7FFFFFFF  # NaN, the largest code
        keys.view(np.int32)[7::47] = 0x7FC00000  # NaN
        yield f"k={k}", torch.from_numpy(rows), torch.from_numpy(keys), n, k
    rows = torch.from_numpy(gen.integers(0, 10, 3000))
    wide = torch.from_numpy(gen.standard_normal(3000) * 1e3)  # float64 keys: rounded up to float32
    yield "float64", rows, wide, 12, 17
    yield "one row, k = n", torch.zeros(900, dtype=torch.int64), torch.from_numpy(gen.standard_normal(900).astype(np.float32)), 1, 900


def numpy_ends(rows: torch.Tensor, keys: torch.Tensor, n: int, k: int) -> tuple[list[int], list[int], list[int]]:
    """Each row's smallest and k-th key code from NumPy's sort of the row's keys."""
    codes = row_kth.ordered_code(row_kth.float32_up(keys)).numpy()
    rows = rows.numpy()
    first, kth, counts = [], [], []
    for r in range(n):
        mine = np.sort(codes[rows == r])
        counts.append(mine.size)
        first.append(int(mine[0]) if mine.size >= k else row_kth.NO_CODE)
        kth.append(int(mine[k - 1]) if mine.size >= k else row_kth.NO_CODE)
    return first, kth, counts


def assert_kernels_are_reference(device: torch.device) -> int:
    cases = 0
    for label, rows, keys, n, k in key_cases():
        rows, keys = rows.to(device), keys.to(device)
        want = row_kth.row_ends_reference(rows, keys, n, k)
        got = row_kth.row_ends(rows, keys, n, k)
        for name, g, w in zip(("first", "kth", "counts"), got, want):
            assert g.dtype == torch.int64 and torch.equal(g.cpu(), w.cpu()), (label, name)
        first, kth, counts = numpy_ends(rows.cpu(), keys.cpu(), n, k)
        assert want[0].tolist() == first and want[1].tolist() == kth and want[2].tolist() == counts, label
        cases += 1
    return cases


def test_reference_is_numpy_order():
    for label, rows, keys, n, k in key_cases(1):
        first, kth, counts = numpy_ends(rows, keys, n, k)
        got = row_kth.row_ends_reference(rows, keys, n, k)
        assert (got[0].tolist(), got[1].tolist(), got[2].tolist()) == (first, kth, counts), label


@pytest.mark.parametrize("programs", [DEFAULTS.row_kth_max_programs, 3])
def test_kernels_are_the_reference(programs, set_options):
    # Rows of at most SMALL_WIDTH pairs are sorted in registers, those up to BISECT_WIDTH (past
    # the rounds kernel's) bisected, the longer ones radix-selected by programs that stride over
    # the rows (here also 3 programs for 40 rows).
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    set_options(row_kth_max_programs=programs)
    assert row_kth.row_kth_runs(torch.zeros(1, dtype=torch.int64))
    assert assert_kernels_are_reference(torch.device("cpu")) == 8


def test_no_pairs():
    first, kth, counts = row_kth.row_ends(torch.zeros(0, dtype=torch.int64), torch.zeros(0), 3, 2)
    assert first.tolist() == kth.tolist() == [row_kth.NO_CODE] * 3 and counts.tolist() == [0, 0, 0]


def assert_row_slots_are_permutations(device: torch.device) -> int:
    """Each row's slots from :func:`row_kth.row_slots` are 0 … its count − 1, each once, as the
    reference's are (the key cases' rows: empty rows, long rows, shuffled order)."""
    cases = 0
    for label, rows, _, n, _ in key_cases(2):
        rows = rows.to(device)
        for slots in (row_kth.row_slots(rows, n), row_kth.row_slots_reference(rows, n)):
            assert slots.dtype == torch.int64 and slots.shape == rows.shape, label
            counts = torch.bincount(rows, minlength=n)
            # (row, slot) pairs are distinct and each slot is below its row's count
            assert torch.unique(rows * (rows.numel() + 1) + slots).numel() == rows.numel(), label
            assert bool((slots >= 0).all()) and bool((slots < counts[rows]).all()), label
        cases += 1
    return cases


def test_row_slots_reference_keeps_the_order_within_a_row():
    rows = torch.tensor([2, 0, 2, 2, 0, 5])
    assert row_kth.row_slots_reference(rows, 6).tolist() == [0, 0, 1, 2, 1, 0]


def test_row_slots_kernel_gives_each_row_its_slots(set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert assert_row_slots_are_permutations(torch.device("cpu")) == 8
