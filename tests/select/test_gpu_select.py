"""GPU tests of the selection kernels against their CPU references and the selection oracle.

Every kernel's sorted output must equal :func:`knng.select.keys.select_reference` exactly (values
bit for bit up to NaN payloads, indices), and the paper's quick multi-select must reproduce the
*unsorted* output order of :func:`knng.select.reference.qms.quick_multi_select` — which pins the
ballot/popc partition, the staging and the stack of references, not only the final set.

Run on a GPU machine with ``pytest -m gpu tests/select/test_gpu_select.py``; skipped without CUDA/CuPy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.select import cuda, get
from knng.select.keys import ordered_bits, select_reference
from knng.select.qms import SEED
from knng.select.reference import qms as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda.available(), reason="needs a CUDA GPU and CuPy"),
]

KERNELS = ["qms", "qms_sampled", "qms_block", "qms_warp", "bitonic", "insertion", "batch_sort"]
#: The slow baseline is held to smaller blocks.
SMALL_ONLY = {"insertion"}


def _same(values: np.ndarray, expected: np.ndarray) -> bool:
    """Bitwise equal float32 arrays, NaN payloads aside."""
    return np.array_equal(ordered_bits(values), ordered_bits(expected))


def _assert_selects(name: str, x: torch.Tensor, k: int, context: str = "") -> None:
    values, indices = get(name)(x, k, sorted=True)
    assert values.shape == (x.shape[0], k) and indices.dtype == torch.int64, (name, context)
    rv, ri = select_reference(x.float().cpu().numpy(), k)
    got_i = indices.cpu().numpy()
    bad = np.nonzero((got_i != ri).any(axis=1))[0]
    assert bad.size == 0, f"{name} {context} k={k}: rows {bad[:5]} differ, e.g. {got_i[bad[0], :8]} vs {ri[bad[0], :8]}"
    assert _same(values.cpu().numpy(), rv), f"{name} {context} k={k}: values differ"


def _rand(shape, seed, *, kind="uniform"):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed % 2**63)
    if kind == "uniform":
        return torch.rand(shape, generator=g, device="cuda")
    if kind == "ties":  # a handful of distinct values: thousands of ties at the k-th value
        return torch.randint(0, 7, shape, generator=g, device="cuda").float()
    if kind == "offset":  # huge common offset, tiny spread: many entries round together
        return (1e30 + 1e24 * torch.randn(shape, generator=g, device="cuda", dtype=torch.float64)).float()
    if kind == "sorted":
        return torch.sort(torch.rand(shape, generator=g, device="cuda"), dim=1).values
    if kind == "descending":
        return torch.sort(torch.rand(shape, generator=g, device="cuda"), dim=1, descending=True).values
    if kind == "special":  # NaN, ±inf, ±0 sprinkled over normal values
        x = torch.randn(shape, generator=g, device="cuda")
        pick = torch.randint(0, 12, shape, generator=g, device="cuda")
        for code, value in ((0, float("nan")), (1, float("inf")), (2, float("-inf")), (3, 0.0), (4, -0.0)):
            x = torch.where(pick == code, torch.full_like(x, value), x)
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 31), (5, 32), (7, 1000), (130, 4097), (64, 70_001)])
def test_kernel_equals_oracle_on_random_blocks(name, rows, cols, seed):
    if name in SMALL_ONLY and cols > 1000:
        pytest.skip("baseline too slow for this block")
    x = _rand((rows, cols), seed)
    for k in sorted({min(cols, k) for k in (1, 2, 33, 100, 2048)} | {cols}):
        if name == "bitonic" and k > 8192:
            continue
        _assert_selects(name, x, k, f"{rows}x{cols} seed={seed}")


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("kind", ["ties", "offset", "sorted", "descending", "special"])
def test_kernel_equals_oracle_on_adversarial_blocks(name, kind, seed):
    cols = 1000 if name in SMALL_ONLY else 20_011
    x = _rand((40, cols), seed, kind=kind)
    x[0] = 2.5  # one row all equal
    for k in (1, 64, min(cols, 1500)):
        _assert_selects(name, x, k, f"{kind} seed={seed}")


@pytest.mark.parametrize("name", ["qms_block", "qms_warp", "qms_sampled"])
def test_paper_variants_reproduce_reference_order(name, seed):
    """Unsorted output order equals the reference's: same pivots, partitions and stack."""
    x = _rand((24, 3001), seed, kind="ties" if seed % 2 else "uniform")
    for k in (1, 300, 2999):
        values, indices = get(name)(x, k, sorted=False)
        host = x.cpu().numpy()
        rank = -1
        if name == "qms_sampled":
            rank = ref.filter_plan(3001, k, 512)[0]
        for r in range(x.shape[0]):
            keys = ref.quick_multi_select(host[r], k, row=r, seed=SEED, sampled_rank=rank, threads=512)
            _, want = ref.keys_to_output(keys)
            assert np.array_equal(indices[r].cpu().numpy(), want), f"{name} row {r} k={k} seed={seed}"


def test_qms_falls_back_exactly_on_ties(seed):
    """Rows with more tied candidates than shared memory holds are finished by qms_block."""
    x = _rand((300, 65_536), seed, kind="ties")
    _, _, fell_back = ref.filter_select(x[:4].cpu().numpy(), 512, seed=SEED)
    assert fell_back.all()  # the premise: these rows cannot be finished in shared memory
    _assert_selects("qms", x, 512, f"ties seed={seed}")


def test_qms_on_strided_and_misaligned_rows(seed):
    base = _rand((50, 9001), seed)
    _assert_selects("qms", base[:, 3:8003], 100, "column slice (misaligned rows)")
    _assert_selects("qms", base[::2, :8000], 100, "row stride 2")
    _assert_selects("qms", base.T[:, :40].contiguous().T, 7, "transposed")


def test_qms_bar_shape_identical_to_topk(seed):
    """The issue's bar shape: identical values and indices to torch.topk (ties aside)."""
    x = _rand((8192, 65_536), seed)
    for k in (64, 256, 512, 1024, 2048):
        values, indices = get("qms")(x, k, sorted=True)
        tv, ti = torch.topk(x, k, dim=1, largest=False, sorted=True)
        assert torch.equal(values, tv), k
        same = indices == ti
        # torch.topk orders tied values arbitrarily; every index mismatch must be a tie.
        assert torch.equal(x.gather(1, indices)[~same], x.gather(1, ti)[~same]), k


@pytest.mark.parametrize("select", ["qms", "batch_sort"])
def test_engine_with_kernel_selection_is_exact(select, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed % 2**63)
    data = torch.randn((6000, 64), generator=g, device="cuda") + 100.0
    want = knng.graph(data, 16, select="topk")
    got = knng.graph(data, 16, select=select)
    assert torch.equal(got.indices, want.indices)
    assert torch.equal(got.distances, want.distances)
    res = knng.search(data[:500], data, 33, select=select)
    ref_res = knng.search(data[:500], data, 33, select="topk")
    assert torch.equal(res.indices, ref_res.indices)
