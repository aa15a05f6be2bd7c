"""CPU tests of the quick multi-select reference (``knng.select.reference.qms``), step by step,
and of the registered kernels' CPU paths. The GPU kernels are held to these references in
``tests/select/test_gpu_select.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from knng.select import get
from knng.select.keys import composite_keys, ordered_bits, select_reference
from knng.select.reference import qms as ref


def _keys(rng, n, *, ties=False):
    values = rng.integers(0, 5, n).astype(np.float32) if ties else rng.standard_normal(n).astype(np.float32)
    return composite_keys(values[None, :])[0], values


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(ordered_bits(a), ordered_bits(b))


# ----------------------------------------------------------------------------- one step
@pytest.mark.parametrize("length", [32, 17, 64, 96, 512])
def test_partition_step_ballots_slots_and_staging(rng, length):
    keys, _ = _keys(rng, length, ties=length == 17)
    pivot = int(keys[rng.integers(length)])
    step = ref.partition_step(keys, pivot)
    width = len(step.staging)
    for w, (bl, br) in enumerate(zip(step.left_ballots, step.right_ballots)):
        lanes = keys[32 * w: 32 * w + 32]
        assert bl == sum(1 << i for i, c in enumerate(lanes) if c < pivot)
        assert br == sum(1 << i for i, c in enumerate(lanes) if c > pivot)
        assert bl & br == 0
    assert step.n_left == int((keys < pivot).sum()) and step.n_right == int((keys > pivot).sum())
    # Left side from the left end in lane order; right side from the right end, last lane first.
    assert np.array_equal(step.staging[: step.n_left], keys[keys < pivot])
    assert np.array_equal(step.staging[width - step.n_right:], keys[keys > pivot][::-1])
    assert (step.staging[step.n_left: width - step.n_right] == np.uint64(2**64 - 1)).all()


@pytest.mark.parametrize("width", [32, 64, 512])
@pytest.mark.parametrize("length", [1, 31, 33, 1000, 4097])
def test_partition_pass_is_width_independent(rng, width, length):
    """Whatever the step width: lefts in order, a hole for the pivot, rights reversed."""
    keys, _ = _keys(rng, length, ties=True)
    pivot = int(keys[rng.integers(length)])
    out, L, R, E = ref.partition(keys, pivot, width)
    assert E == 1 and L + R + E == length
    assert np.array_equal(out[:L], keys[keys < pivot])
    assert np.array_equal(out[length - R:], keys[keys > pivot][::-1])


def test_partition_rejects_a_width_that_is_not_whole_warps(rng):
    keys, _ = _keys(rng, 64)
    with pytest.raises(ValueError, match="width"):
        ref.partition(keys, int(keys[0]), 48)


# ----------------------------------------------------------------------------- the loop
@pytest.mark.parametrize("kind", ["normal", "ties", "equal", "nan", "sorted"])
def test_quick_multi_select_finds_the_k_smallest(rng, kind):
    n = 3001
    values = rng.standard_normal(n).astype(np.float32)
    if kind == "ties":
        values = rng.integers(0, 4, n).astype(np.float32)
    elif kind == "equal":
        values[:] = 1.25
    elif kind == "nan":
        values[rng.integers(0, n, 300)] = np.nan
        values[:7] = -0.0
    elif kind == "sorted":
        values.sort()
    for k in (0, 1, 2, 100, n - 1, n):
        trace = ref.Trace()
        keys = ref.quick_multi_select(values, k, row=3, seed=11, trace=trace)
        got = np.sort(keys)
        want = np.sort(composite_keys(values[None, :])[0])[:k]
        assert np.array_equal(got, want), (kind, k)
        sizes = [hi - lo for _, lo, hi, *_ in trace.passes]
        assert all(b < a for a, b in zip(sizes, sizes[1:])), "every pass must shrink the segment"


def test_quick_multi_select_stack_flush(monkeypatch, rng):
    """A small stack is flushed to the output mid-way; the result must not change."""
    values = rng.standard_normal(5000).astype(np.float32)
    full = ref.quick_multi_select(values, 2500, row=1, seed=5)
    monkeypatch.setattr(ref, "STACK_SIZE", 1)
    assert np.array_equal(ref.quick_multi_select(values, 2500, row=1, seed=5), full)


def test_sampled_first_pass_keeps_about_k(rng):
    n, k = 200_000, 500
    values = rng.random(n).astype(np.float32)
    rank, cap = ref.filter_plan(n, k)
    trace = ref.Trace()
    keys = ref.quick_multi_select(values, k, row=0, seed=1, sampled_rank=rank, trace=trace)
    assert np.array_equal(np.sort(keys), np.sort(composite_keys(values[None, :])[0])[:k])
    _, _, _, pivot, L, R, E = trace.passes[0]
    assert E == 0 and pivot & 0xFFFFFFFF == 0xFFFFFFFF  # a value no entry equals
    # The pivot's sample rank leaves fewer than k entries only with a tiny probability, so it
    # keeps k(1+ε) on average (≈ 3k here, with a spread of ±0.5k); the kernel's shared memory
    # holds `cap` candidates, sized several deviations above that. (A bound of 4k failed for
    # about 9 % of random inputs.)
    assert k <= L <= cap, "the sampled pivot keeps at least k entries and no more than the kernel holds"


def test_pivot_positions_stay_inside_the_segment():
    for row in (0, 1, 2**31 - 1):
        for p in range(50):
            pos = ref.pivot_position(7, row, p, 100, 37)
            assert 100 <= pos < 137
    assert ref.mix32(0) == 0 and ref.mix32(1) != 1 and 0 <= ref.mix32(2**40) < 2**32


# ----------------------------------------------------------------------------- sampling and plan
def test_sample_is_chunks_of_32_inside_each_stratum(rng):
    n = 100_003
    values = rng.standard_normal(n).astype(np.float32)
    sample = ref.sample_keys(values, row=5, seed=9)
    s = ref.FILTER_THREADS * ref.SAMPLE_PER_THREAD
    assert len(sample) == s
    bits = ordered_bits(values)
    stratum = n // (s // 32)
    for c in range(s // 32):
        chunk = sample[32 * c: 32 * c + 32]
        start = int(np.nonzero(bits[c * stratum: (c + 1) * stratum] == chunk[0])[0][0]) + c * stratum
        assert np.array_equal(bits[start: start + 32], chunk)
        assert start + 32 <= (c + 1) * stratum
    assert ref.sample_pivot(values, row=5, seed=9, rank=10) == int(np.sort(sample)[10])
    short = values[:1000]
    assert np.array_equal(np.sort(ref.sample_keys(short, row=0, seed=0)), np.sort(ordered_bits(short)))


@pytest.mark.parametrize("n", [1, 100, 2048, 2049, 4096, 65_536, 1_000_000])
def test_filter_plan_is_consistent(n):
    for k in sorted({1, 10, 64, 512, 2048, 8192, n}):
        if k > n:
            continue
        plan = ref.filter_plan(n, k)
        if plan is None:
            assert k >= 1024  # only large k leave the filter
            continue
        rank, cap = plan
        assert cap & (cap - 1) == 0 and cap <= ref.MAX_CAP
        if rank < 0:
            assert cap >= n  # every entry is a candidate
        else:
            s = min(n, ref.FILTER_THREADS * ref.SAMPLE_PER_THREAD)
            assert 0 <= rank < s and (rank + 1) * n / s >= k  # expected candidates ≥ k
            assert cap >= min(n, k)


def test_filter_select_exact_and_falls_back_on_ties(rng):
    values = rng.standard_normal((6, 70_000)).astype(np.float32)
    values[1] = rng.integers(0, 3, 70_000)  # tens of thousands of ties at the k-th value
    v, i, fell_back = ref.filter_select(values, 300)
    rv, ri = select_reference(values, 300)
    assert np.array_equal(i, ri) and _same(v, rv)
    assert fell_back[1] and not fell_back[0]


# ----------------------------------------------------------------------------- registered CPU paths
NAMES = ["qms", "qms_sampled", "qms_block", "qms_warp", "insertion", "bitonic", "batch_sort"]


@pytest.mark.parametrize("name", NAMES)
def test_registered_cpu_path_equals_oracle(name, rng):
    cols = 300 if name == "insertion" else 2500  # the insertion reference is O(n·k) per row
    x = rng.standard_normal((5, cols)).astype(np.float32)
    x[2] = rng.integers(0, 3, cols)
    x[3, ::7] = np.nan
    for k in (1, 64, cols):
        v, i = get(name)(torch.from_numpy(x), k, sorted=True)
        rv, ri = select_reference(x, k)
        assert np.array_equal(i.numpy(), ri), (name, k)
        assert _same(v.numpy(), rv), (name, k)
        uv, ui = get(name)(torch.from_numpy(x), k, sorted=False)
        assert np.array_equal(np.sort(ui.numpy(), axis=1), np.sort(ri, axis=1)), (name, k)


@pytest.mark.parametrize("name", ["qms", "qms_block", "insertion", "bitonic"])
def test_registered_kernels_check_their_input(name):
    x = torch.rand(3, 40)
    with pytest.raises(ValueError, match="k"):
        get(name)(x, 41)
    with pytest.raises(ValueError, match="k"):
        get(name)(x, -1)
    with pytest.raises(TypeError, match="float32"):
        get(name)(x.double(), 3)
    with pytest.raises(ValueError, match="2-D"):
        get(name)(x[0], 3)
    v, i = get(name)(x.half(), 5, sorted=True)  # widened exactly
    rv, ri = select_reference(x.half().float().numpy(), 5)
    assert np.array_equal(i.numpy(), ri)
