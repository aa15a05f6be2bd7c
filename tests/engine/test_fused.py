"""The fused screen kernel on a CPU, in Triton's interpreter, against its contract and its reference.

``TRITON_INTERPRET=1`` runs the kernel's own code (loads, ``tl.dot``, the compare, and both ways
of appending survivors: one at a time after one atomic reservation, or one atomic each) with NumPy. Its products are exact float32 ones
(bfloat16 products are not trustworthy there: ``test_gpu_fused.py`` covers them on a GPU), so
these tests use float32 storage ("tf32" precision, whose bound holds a fortiori).
Also here: the rounding model of every fused precision, emulated on a CPU, and the engine run
end to end with the kernel in the interpreter.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from knng.engine import screen
from knng.engine import kernels
from knng.engine.kernels import DeviceCapabilities, cuda_screen, fused
from knng.engine.graph.blocks import OWN_PARTS_IN_FLIGHT
from knng.metrics import (
    PRECISIONS, SCALED_TAIL, get_metric, scaled_alphas, scaled_row_factors, scaled_scales, scaled_width,
)
from oracle import assert_exact, assert_screen_contract, oracle_graph, oracle_search, smooth_image_patches

#: The options' defaults: the sizes the planner takes unless told otherwise.
DEFAULTS = knng.Options()

pytest.importorskip("triton", reason="the kernel tests run Triton's interpreter")


@pytest.fixture
def interpret():
    """The kernel runs in Triton's interpreter (conftest.py chose it at start on a machine without a GPU)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")


def _block(rng: np.random.Generator, m: int, n: int, d: int, symmetric: bool):
    x = torch.from_numpy(rng.standard_normal((m, d)))
    y = torch.from_numpy(rng.standard_normal((n, d)))
    y[n // 2:n // 2 + min(5, n // 4)] = y[:min(5, n // 4)]  # duplicate columns
    metric = get_metric("sqeuclidean")
    qa = metric.prepare(x, None, side="query", symmetric=symmetric, dtype=torch.float32)
    ca = metric.prepare(y, None, side="corpus", symmetric=True, dtype=torch.float32)
    rt = qa.terms.float() if symmetric else None
    ct = ca.terms.float()
    exact = (qa.vectors[:, :d].double() @ ca.vectors[:, :d].double().T) + ct.double()[None, :]
    if rt is not None:
        exact = exact + rt.double()[:, None]
    return qa, ca, rt, ct, exact


@pytest.mark.parametrize("shape", [(70, 45, 19), (33, 97, 16), (1, 40, 3), (64, 64, 32)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("few", [0, 4, 10**6])  # tiles append with atomics only, both ways, one by one only
def test_kernel_contract_in_the_interpreter(interpret, rng, shape, symmetric, few, set_options):
    set_options(few_per_tile=few)
    m, n, d = shape
    qa, ca, rt, ct, exact = _block(rng, m, n, d, symmetric)
    row_thr = exact.kthvalue(min(n, 4), dim=1).values
    col_thr = exact.kthvalue(min(m, 3), dim=0).values if symmetric else None
    by_row, by_col = fused.screen_block(qa.vectors, ca.vectors, d, row_thr.float(),
                                        None if col_thr is None else col_thr.float(), rt, ct, "tf32", capacity_hint=8)
    assert_screen_contract(by_row, by_col, exact, 1e-4 * (1 + exact.abs()), row_thr, col_thr)
    assert torch.allclose(by_row.keys.double(), exact[by_row.owner, by_row.other], rtol=1e-5, atol=1e-4)
    assert by_row.owner.dtype == by_row.other.dtype == torch.int64
    if symmetric:
        assert torch.allclose(by_col.keys.double(), exact[by_col.other, by_col.owner], rtol=1e-5, atol=1e-4)


def _scaled_block(rng: np.random.Generator, m: int, n: int, d: int, symmetric: bool, metric_name: str):
    """Scaled float16 rows of rows that span several orders of magnitude, duplicates and a zero
    row, with the float64 scores of the stored values (what the kernel's float32 sums round)."""
    x = torch.from_numpy(rng.standard_normal((m, d)) * 10.0 ** rng.integers(-3, 4, (m, 1)))
    y = torch.from_numpy(rng.standard_normal((n, d)) * 10.0 ** rng.integers(-3, 4, (n, 1)) + 50)
    y[n // 2:n // 2 + min(5, n // 4)] = y[:min(5, n // 4)]
    y[-1] = 0
    metric = get_metric(metric_name)
    qa = metric.prepare(x, None, side="query", symmetric=symmetric, dtype=torch.float16)
    ca = metric.prepare(y, None, side="corpus", symmetric=True, dtype=torch.float16)
    rt = qa.terms.float() if symmetric and qa.terms is not None else None
    ct = ca.terms.float() if ca.terms is not None else None
    k = scaled_width(d)
    exact = (qa.vectors[:, :k].double() @ ca.vectors[:, :k].double().T)
    exact = exact * scaled_row_factors(qa.vectors).double()[:, None] * scaled_scales(ca.vectors).double()[None, :]
    if ct is not None:
        exact = exact + ct.double()[None, :]
    if rt is not None:
        exact = exact + rt.double()[:, None]
    return qa, ca, rt, ct, exact


@pytest.mark.parametrize("shape", [(70, 45, 19), (33, 97, 16), (1, 40, 3)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("metric_name", ["sqeuclidean", "inner_product"])
def test_scaled_float16_kernel_in_the_interpreter(interpret, rng, shape, symmetric, metric_name):
    """The float16 screen's kernel (scaled rows: × α·s_a × s_b after the product) against the
    float64 scores of its stored values; ties at the thresholds included."""
    m, n, d = shape
    qa, ca, rt, ct, exact = _scaled_block(rng, m, n, d, symmetric, metric_name)
    row_thr = exact.kthvalue(min(n, 4), dim=1).values
    col_thr = exact.kthvalue(min(m, 3), dim=0).values if symmetric else None
    by_row, by_col = fused.screen_block(qa.vectors, ca.vectors, d, row_thr.float(),
                                        None if col_thr is None else col_thr.float(), rt, ct, "float16",
                                        capacity_hint=8)
    radius = 1e-5 * (1 + exact.abs().max())
    assert_screen_contract(by_row, by_col, exact, radius, row_thr, col_thr)
    assert torch.allclose(by_row.keys.double(), exact[by_row.owner, by_row.other], rtol=1e-5, atol=float(radius))
    ref = screen.block_scores(qa.vectors, ca.vectors, d, PRECISIONS["float16"], rt, ct)
    assert torch.allclose(ref.double(), exact, rtol=1e-5, atol=float(radius))


@pytest.mark.parametrize("metric_name", ["euclidean", "cosine", "inner_product", "pearson"])
def test_scaled_float16_rows(rng, metric_name):
    """Scaled rows: largest value in [2¹⁴, 2¹⁵] (x/s below 2¹⁵, rounded), a power-of-two scale, α in the tail, the value
    within float16's rounding of x/s; zero rows, tiny and huge rows; both sides alike."""
    x = torch.from_numpy(rng.standard_normal((9, 21)))
    x[1] *= 1e-30
    x[2] *= 1e15
    x[3] = 0
    x[4] = 0.0
    x[4, 7] = 2.0**-140  # below the smallest scale: the row errs absolutely (c_flush)
    metric = get_metric(metric_name)
    rows = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    other = metric.prepare(x, None, side="query", symmetric=False, dtype=torch.float16).vectors
    assert torch.equal(rows, other) and torch.equal(metric.query_layout(rows, 21), rows)
    assert rows.shape == (9, scaled_width(21) + SCALED_TAIL) and rows.shape[1] % 16 == 0
    ref = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float64).vectors[:, :21]
    scale = scaled_scales(rows).double()
    mantissa, _ = torch.frexp(scale)
    assert bool((mantissa == 0.5).all()), "scales must be powers of two"
    assert bool((scaled_alphas(rows) == metric.alpha).all())
    assert torch.equal(scaled_row_factors(rows), (scaled_alphas(rows) * scaled_scales(rows)))
    assert bool((rows[:, 21:scaled_width(21)] == 0).all())
    values = rows[:, :21].double()
    top = values.abs().amax(dim=1)
    normal = ref.abs().amax(dim=1) > 2.0**-100
    # x/s < 2¹⁵, but float16's spacing there is 16: a largest value from 32,760 rounds to 2¹⁵.
    assert bool(((top >= 2.0**14) & (top <= 2.0**15))[normal].all())
    err = (values * scale[:, None] - ref).abs()
    assert bool((err <= (2.0**-11 + 2.0**-23) * ref.abs() + 2.0**-14 * scale[:, None]).all())
    assert bool((rows[3, :21] == 0).all())


def test_kernel_everything_nothing_and_the_relaunch(interpret, rng):
    """+inf keeps all m·n pairs (more than the first list holds: one relaunch), −inf none."""
    qa, ca, rt, ct, exact = _block(rng, 70, 45, 12, symmetric=True)
    inf = torch.full((70,), torch.inf)
    out, _ = fused.screen_block(qa.vectors, ca.vectors, 12, inf, None, rt, ct, "tf32", capacity_hint=1)
    assert out.owner.numel() == 70 * 45
    dense = torch.full((70, 45), torch.nan, dtype=torch.float64)
    dense[out.owner, out.other] = out.keys.double()
    assert torch.allclose(dense, exact, rtol=1e-5, atol=1e-4)
    none = fused.screen_block(qa.vectors, ca.vectors, 12, -inf, torch.full((45,), -torch.inf), rt, ct, "tf32")
    assert none[0].owner.numel() == 0 and none[1].owner.numel() == 0
    # Sized later: two blocks launched before either is read, the first overflowing its list
    # (relaunched when it is read), each the same pairs as when read at once.
    first = fused.screen_block(qa.vectors, ca.vectors, 12, inf, None, rt, ct, "tf32", capacity_hint=1, later=True)
    half = exact.median(dim=1).values.float()
    second = fused.screen_block(qa.vectors, ca.vectors, 12, half, None, rt, ct, "tf32", later=True)
    now = fused.screen_block(qa.vectors, ca.vectors, 12, half, None, rt, ct, "tf32")[0]
    assert callable(first) and callable(second)
    got, want = second()[0], now
    assert torch.equal(got.owner, want.owner) and torch.equal(got.other, want.other)
    assert torch.equal(got.keys, want.keys) and first()[0].owner.numel() == 70 * 45


def test_kernel_excludes_the_diagonal(interpret, rng):
    x = torch.from_numpy(rng.standard_normal((50, 8))).float()
    inf = torch.full((20,), torch.inf)
    out, _ = fused.screen_block(x[10:30] * -2, x, 8, inf, None, None, None, "tf32", exclude_diagonal=-10)
    assert out.owner.numel() == 20 * 50 - 20
    assert not bool((out.owner + 10 == out.other).any())


def test_kernel_matches_the_reference_screen(interpret, rng):
    """The kernel and :func:`screen.block_scores` (its reference) keep the same pairs away from ties."""
    qa, ca, rt, ct, exact = _block(rng, 40, 90, 24, symmetric=True)
    p = PRECISIONS["tf32"]
    thr = exact.kthvalue(6, dim=1).values + 1e-3
    ref = screen.row_survivors(screen.block_scores(qa.vectors, ca.vectors, 24, p, rt, ct), thr)
    out, _ = fused.screen_block(qa.vectors, ca.vectors, 24, thr.float(), None, rt, ct, "tf32")
    assert sorted(zip(ref.owner.tolist(), ref.other.tolist())) == sorted(zip(out.owner.tolist(), out.other.tolist()))


# ------------------------------------------------------------------------------- the bound
def _emulate(x: torch.Tensor, precision: str) -> torch.Tensor:
    """float64 values the tensor cores would multiply, for a float64 input (worst-case rounding)."""
    if precision == "bfloat16":
        return x.to(torch.float32).to(torch.bfloat16).to(torch.float64)  # torch's double rounding
    if precision == "float16":
        # Each row scaled by its own power of two (largest value in [2¹⁴, 2¹⁵)), double-rounded
        # through float32 to float16, values below float16's smallest normal flushed to zero
        # (the worse of flushing and subnormal rounding), scaled back.
        top = x.abs().amax(dim=1, keepdim=True)
        scale = torch.ldexp(torch.ones_like(top), torch.frexp(top)[1].to(torch.float64) - 15)
        half = (x / scale).to(torch.float32).to(torch.float16).to(torch.float64)
        return torch.where(half.abs() < 2.0**-14, 0.0, half) * scale
    f = x.to(torch.float32)
    bits = f.view(torch.int32)

    def trunc(v: torch.Tensor) -> torch.Tensor:  # TF32 by truncation: the worse of the two roundings
        return (v.view(torch.int32) & ~0x1FFF).view(torch.float32)
    hi = trunc(f)
    if precision == "tf32":
        return hi.to(torch.float64)
    lo = trunc(f - hi)
    del bits
    return hi.to(torch.float64) + lo.to(torch.float64)


@pytest.mark.parametrize("precision", [n for n, p in PRECISIONS.items() if p.fused])
@pytest.mark.parametrize("metric_name", ["sqeuclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("kind", ["gaussian", "positive", "midpoints", "offset", "wide"])
def test_bound_covers_the_emulated_rounding(precision, metric_name, kind, rng):
    """|s̃ − s| ≤ E when the inputs are rounded as the precision's hardware may round them.

    The products and sums are emulated in float64 and rounded to float32 once (the hardware's
    accumulation error is what the GPU test measures); the input rounding, the new part of the
    bound for each precision, is emulated exactly, truncation included.
    """
    m, d = 300, 256
    if kind == "gaussian":
        x, y = rng.standard_normal((m, d)), rng.standard_normal((m, d))
    elif kind == "positive":
        x, y = rng.random((m, d)) + 0.5, rng.random((m, d)) + 0.5
    elif kind == "midpoints":
        base = 1 + rng.integers(0, 128, (2, m, d)) / 128
        delta = rng.choice([2.0**-8, 2.0**-11, 2.0**-10], (2, m, d)) - 2.0**-30
        x, y = base + delta
    elif kind == "wide":  # values of a row over 12 decades: float16's subnormals and flushes
        x, y = rng.standard_normal((2, m, d)) * 10.0 ** rng.uniform(-12, 0, (2, m, d))
    else:
        x, y = rng.standard_normal((m, d)) * 1e-3 + 1e4, rng.standard_normal((m, d)) * 1e-3 + 1e4
    metric = get_metric(metric_name)
    p = PRECISIONS[precision]
    q = metric.prepare(torch.from_numpy(x), None, side="query", symmetric=True, dtype=torch.float64)
    c = metric.prepare(torch.from_numpy(y), None, side="corpus", symmetric=True, dtype=torch.float64)
    a, b = _emulate(q.vectors[:, :d], precision), _emulate(c.vectors[:, :d], precision)
    key = (a @ b.T).to(torch.float32).to(torch.float64)
    exact = q.vectors[:, :d] @ c.vectors[:, :d].T
    if metric.uses_terms:
        key = (key + c.terms.float().double()[None, :]).float().double()
        key = (key + q.terms.float().double()[:, None]).float().double()
        exact = exact + c.terms[None, :] + q.terms[:, None]
    bound = metric.pair_bound(d, q.norms[:, None], c.norms[None, :], None if q.terms is None else q.terms[:, None],
                              None if c.terms is None else c.terms[None, :], precision=p)
    ratio = float(((key - exact).abs() / bound).max())
    assert ratio <= 1.0, f"{precision} {metric_name} {kind}: |s̃ − s| = {ratio:.3f} E"


def test_fused_bound_is_wider_the_coarser_the_precision():
    metric = get_metric("euclidean")
    c = {name: metric.bound_coefficients(128, precision=p)[0] for name, p in PRECISIONS.items()}
    assert c["float64"] < c["float32"] < c["tf32x3"] < c["float16"] < c["tf32"] < c["bfloat16"]


# ------------------------------------------------------------------------------ the engine
@pytest.fixture(params=["tf32", "float16"])
def kernel_on_cpu(interpret, request, set_options):
    """The engine runs the fused kernel (interpreted) on the CPU, screening in "tf32" or in
    scaled "float16" (whose products the interpreter computes exactly too)."""

    set_options(kernels={"triton": True})
    set_options(screen_precision=request.param)
    set_options(own_part_seed=48)  # the sampled seeds of a part's own block
    yield
    assert last_report().screen_dtype == request.param
    assert last_report().stages.get("screen.kernel"), "the kernel did not run"


def _strip_minima_by_reference(monkeypatch, set_options, strip: int = 4) -> list:
    """Seeds from strip minima, as the CUDA kernel gives them, here by their reference
    (``screen.strip_minima_of``) in strips of ``strip`` columns; returns the list of calls."""
    calls: list = []
    set_options(kernels={"strip_minima": True})
    monkeypatch.setattr(cuda_screen, "STRIP", strip)  # kernels.strip_width() reads it at each call

    def reference(a, b, k_dims, row_terms, col_terms, precision):
        calls.append(1)
        keys, cols = screen.strip_minima_of(
            screen.block_scores(a, b, k_dims, PRECISIONS[precision], row_terms, col_terms), strip=strip)
        return keys, cols.to(torch.int32)

    monkeypatch.setattr(kernels, "strip_minima", reference)  # the door the engine calls through
    return calls


@pytest.mark.parametrize("held,strips", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("k", [1, 7, 150])
def test_search_with_the_interpreted_kernel(kernel_on_cpu, rng, k, held, strips, monkeypatch, set_options):
    if held:  # the GPU's way: survivors held back, tightened by the selection kernels
        set_options(tighten_on=frozenset({"cpu", "cuda"}))
    minima = _strip_minima_by_reference(monkeypatch, set_options) if strips else []  # 150 sample columns: 38 strips
    c = rng.standard_normal((150, 11)) + 30
    c[100:110] = c[:10]
    q = rng.standard_normal((37, 11)) + 30
    assert_exact(knng.search(q, c, k, memory_budget="2MB"), oracle_search(q, c, k))
    assert bool(minima) == (strips and 2 * k <= 38)


@pytest.mark.parametrize("include_self,group,held,strips", [(False, 1, False, False), (True, 1, False, False),
                                                            (False, 3, False, False), (False, 1, True, False),
                                                            (True, 3, True, False), (False, 1, True, True),
                                                            (True, 1, False, True)])
def test_graph_with_the_interpreted_kernel(kernel_on_cpu, rng, include_self, group, held, strips, monkeypatch, set_options):


    minima = _strip_minima_by_reference(monkeypatch, set_options) if strips else []  # 48 seed columns: 12 strips
    if held:  # the GPU's way where the blocks share one centre (Gaussian data): survivors held back
        set_options(hold_on=frozenset({"cpu", "cuda"}))
    set_options(cpu_max_part=64)  # several parts: off-diagonal blocks
    set_options(group_parts=group)  # column parts per launch
    x = rng.standard_normal((200, 9)) + 50 if held else smooth_image_patches(rng, 200, side=3)
    x[150:160] = x[:10]
    g = knng.graph(x, 5, include_self=include_self)
    assert last_report().parts > 1 and last_report().plan.group_parts == group
    assert_exact(g, oracle_graph(x, 5, include_self=include_self))
    assert bool(last_report().stages.get("store.hold")) == held and bool(minima) == strips


@pytest.mark.parametrize("include_self,k", [(False, 5), (True, 5), (False, 1), (True, 1), (False, 11)])
def test_graph_own_parts_screened_together(kernel_on_cpu, rng, include_self, k, monkeypatch, set_options):
    """The GPU's held graph seeds every part from its own sample and screens every part's own block
    in one pass (graph.screen_own_parts_together): exact, with duplicates across parts, ties from
    integer data, k = 1, a sample that holds the whole part (OWN_PART_SEED ≥ its size) and a last
    part too small for 2k strips (seeded from a materialised sample instead)."""

    _strip_minima_by_reference(monkeypatch, set_options)
    set_options(hold_on=frozenset({"cpu", "cuda"}))
    set_options(cpu_max_part=100)
    together, materialised = [], []
    # parts of 100, 100, 50 (24 strips of 4 in the first two) and 100, 30 (25 strips)
    for n, seed_cols, integers in ((250, 96, False), (130, 200, True)):
        set_options(own_part_seed=seed_cols)
        x = rng.standard_normal((n, 9)) + 50
        if integers:
            x = np.round(x * 2)
        x[n - 20:n - 10] = x[:10]
        g = knng.graph(x, k, include_self=include_self)
        assert_exact(g, oracle_graph(x, k, include_self=include_self))
        assert last_report().parts > 1
        together.append(last_report().stages.get("graph.own_parts_together"))
        materialised.append(last_report().stages.get("seeds.from_block"))
    assert together == [1, 1], "the parts' own blocks were not screened together"
    assert any(materialised) or k == 1, "no part was too small for its strips"


@pytest.mark.parametrize("include_self,k", [(False, 7), (True, 1)])
def test_patch_graph_own_parts_screened_together(kernel_on_cpu, rng, include_self, k, monkeypatch, set_options):
    """Image patches, whose principal slabs centre each part on itself, screen every part's own
    block in one pass too: seeds with their tiles' radii, survivors held with their tiles' norms
    (Holding.pairs). Exact with near-identical flat patches, duplicates across parts, k = 1."""


    _strip_minima_by_reference(monkeypatch, set_options)
    set_options(hold_on=frozenset({"cpu", "cuda"}))
    set_options(cpu_max_part=100)
    set_options(own_part_seed=96)
    x = smooth_image_patches(rng, 230, side=3)
    x[40:70] = x[40] + 1e-3 * rng.standard_normal((30, x.shape[1]))  # near-ties, not folded
    x[200:210] = x[:10]
    g = knng.graph(x, k, include_self=include_self)
    assert_exact(g, oracle_graph(x, k, include_self=include_self))
    assert last_report().parts > 1 and last_report().plan.frames == "principal"
    stages = last_report().stages
    assert stages.get("graph.own_parts_together") == 1 and stages.get("store.hold_pairs") and not stages.get(
        "store.hold"), "the slabs' own blocks were not screened together with their norms"
    # More parts than launches in flight (graph.blocks.OWN_PARTS_IN_FLIGHT): the later parts are
    # launched as the earlier ones' survivors go in, against the thresholds of the one pass.
    x = smooth_image_patches(rng, 480, side=3)
    x[300:320] = x[:20]
    g = knng.graph(x, k, include_self=include_self)
    assert_exact(g, oracle_graph(x, k, include_self=include_self))
    assert last_report().parts > OWN_PARTS_IN_FLIGHT + 1
    assert last_report().stages.get("graph.own_parts_together") == 1


@pytest.mark.parametrize("where", ["before", "after"])
def test_own_parts_retried_after_an_out_of_memory_error_hand_no_survivor_over_twice(
        kernel_on_cpu, rng, where, monkeypatch, set_options):
    """An out-of-memory error while the own parts' survivors go to the store, part by part, retries
    the step (graph.screen_own_parts_together); the parts already handed over are not handed again
    (a pair held twice would count twice among its row's k upper bounds), whether the error came
    before the failing part's pairs were held or after (in the tightening they started)."""
    from knng.engine.store import HoldingStore

    _strip_minima_by_reference(monkeypatch, set_options)
    set_options(hold_on=frozenset({"cpu", "cuda"}), cpu_max_part=100, own_part_seed=96, pending_cpu=64)
    x = smooth_image_patches(rng, 480, side=3)
    x[300:320] = x[:20]
    state = {"n": 0}
    name, fail = ("_hold", 3) if where == "before" else ("tighten_held", 1)
    real = getattr(HoldingStore, name)

    def failing(self, *args, **kwargs):
        state["n"] += 1
        if state["n"] == fail:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HoldingStore, name, failing)
    g = knng.graph(x, 7)
    assert state["n"] > fail and g.report.oom_retries == 1 and g.report.stages.get("graph.own_parts_together") == 2
    assert_exact(g, oracle_graph(x, 7))


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks of a GPU this machine lacks")
def test_a_gpu_this_machine_lacks_offers_no_kernel():
    """Planning for a GPU the machine lacks asks nothing of CUDA: its capabilities run no kernel of
    ours (a GPU's plan is still made, with torch's screens); an H100's run them all."""
    lacking = kernels.device_capabilities(torch.device("cuda"))
    assert lacking.device_type == "cuda" and not lacking.tensor_cores and not kernels.triton_runs(lacking)
    hopper = DeviceCapabilities.hopper()
    assert hopper.tensor_cores and kernels.triton_runs(hopper)
    assert kernels.screen_kernel_runs(hopper, "float16") and not kernels.screen_kernel_runs(lacking, "float16")
    with knng.options(kernels={"triton": False}):
        assert not kernels.triton_runs(hopper)


def test_kernel_screened_graphs_take_larger_parts(set_options):
    """No score block in memory: a graph screened by a kernel takes parts of GPU_KERNEL_MAX_PART,
    or GPU_TRIANGLE_MAX_PART where its own blocks are triangles (GPU_TRIANGLE_MAX_PART_SMALL_K
    for k ≤ TRIANGLE_SMALL_K)."""
    import knng.engine.plan as plan

    kw = dict(n=1_000_000, d=128, k=10, metric="euclidean", device=torch.device("cuda", 0),
              capabilities=DeviceCapabilities.hopper(), budget=60 * 2**30,
              include_self=False, host_budget=64 * 2**30)
    assert plan.make_graph_plan(**kw).screen_precision == "float16"
    assert plan.make_graph_plan(**kw).part_size == DEFAULTS.gpu_kernel_max_part
    # ... and screens several column parts per launch (nothing materialised), a torch screen one.
    assert plan.make_graph_plan(**kw).group_parts == DEFAULTS.gpu_kernel_group_columns // DEFAULTS.gpu_kernel_max_part > 1
    assert plan.make_graph_plan(**kw, screen_dtype="float32").group_parts == 1
    assert plan.make_graph_plan(**kw, screen_dtype="float32").part_size == DEFAULTS.gpu_max_part
    set_options(kernels={"triton": False})
    assert plan.make_graph_plan(**kw, screen_dtype="float16").part_size == DEFAULTS.gpu_max_part
    # Where own blocks are triangles (the wgmma kernel) parts grow: no pair is scored twice.
    set_options(kernels={"triton": True})
    set_options(kernels={"triangle": True})
    assert plan.make_graph_plan(**kw).part_size > DEFAULTS.gpu_triangle_max_part
    large = {**kw, "budget": 200 * 2**30}  # (a budget whose blocks do not bound the parts first)
    for k in (plan.TRIANGLE_SMALL_K, plan.TRIANGLE_SMALL_K + 1, 32):
        want = DEFAULTS.gpu_triangle_max_part_small_k if k <= plan.TRIANGLE_SMALL_K else DEFAULTS.gpu_triangle_max_part
        assert plan.make_graph_plan(**{**large, "k": k}).part_size == want > DEFAULTS.gpu_kernel_max_part, k
    assert plan.make_graph_plan(**kw, screen_dtype="float32").part_size == DEFAULTS.gpu_max_part


@pytest.mark.parametrize("precision", [n for n, p in PRECISIONS.items() if p.fused])
@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
def test_engine_exact_in_every_fused_precision_off_the_gpu(precision, metric, rng, set_options):
    """Without the kernel the fused precisions run the reference screen; still exact."""

    set_options(screen_precision=precision)
    set_options(cpu_max_part=128)
    x = smooth_image_patches(rng, 600, side=4).astype(np.float32)
    q = x[:50] + rng.standard_normal((50, 16)).astype(np.float32)
    assert_exact(knng.graph(x, 10, metric=metric), oracle_graph(x, 10, metric=metric))
    assert last_report().screen_dtype == precision
    assert_exact(knng.search(q, x, 20, metric=metric), oracle_search(q, x, 20, metric=metric))
    assert last_report().screen_dtype == precision


def test_planner_picks_a_fused_precision_only_for_searches_at_small_k_or_large_d(set_options):
    """The default precision rule of ``engine/plan.py`` (measured: docs/FINDINGS.md, "Screen precision and kernels")."""
    import knng.engine.plan as plan

    gpu = torch.device("cuda", 0)
    hopper = functools.partial(plan.choose_screen_precision, capabilities=DeviceCapabilities.hopper())
    assert hopper(gpu, 1_000_000, 128, 10) == "float16"  # tighter and faster than TF32
    assert hopper(gpu, 1_000_000, 960, 16) == "float16"
    assert hopper(gpu, 1_000_000, 63, 16) == "tf32"  # below the dimensions measured
    assert hopper(gpu, 1_000_000, 128, 100) == "float16"
    assert hopper(gpu, 1_000_000, 64, 128) == "float16"
    assert hopper(gpu, 1_000_000, 63, 17) == "float32"  # below the dimensions measured
    assert hopper(gpu, 1_000_000, 8, 16) == "tf32"
    assert hopper(gpu, 1_000_000, 960, 129) == "float16"
    assert hopper(gpu, 1_000_000, 128, 4096) == "float16"  # any k
    assert hopper(gpu, 1_000_000, 128, 16384) == "float16"  # where float64's rule holds
    assert hopper(gpu, 1_000_000, 63, 32768) == "float64"  # below float16's dimensions
    assert hopper(gpu, 1_000_000, 128, 10, operation="graph") == "float16"
    assert hopper(gpu, 1_000_000, 128, 300, operation="graph") == "float16"
    assert hopper(gpu, 1_000_000, 128, 301, operation="graph") == "float32"
    assert hopper(gpu, 1_000_000, 64, 100, operation="graph") == "float16"  # 8x8 patches
    assert hopper(gpu, 1_000_000, 31, 10, operation="graph") == "float32"  # not measured
    assert hopper(gpu, 16_384, 4096, 1024) == "float16"  # a search
    assert hopper(gpu, 16_384, 4096, 1024, operation="graph") == "float64"
    set_options(kernels={"triton": False})
    assert hopper(gpu, 16_384, 4096, 1024) == "float64"
    assert hopper(gpu, 1_000_000, 128, 10) == "float32"
    assert plan.choose_screen_precision(torch.device("cpu"), 1_000_000, 128, 10) == "float32"


@pytest.mark.parametrize("operation", ["search", "graph"])
def test_cpu_screens_in_float64_from_k_of_one_row_in_a_hundred(operation):
    """On a CPU k/n decides, whatever d (measured: ``plan.CPU_FLOAT64_ROWS_PER_K``)."""
    import knng.engine.plan as plan

    cpu = torch.device("cpu")
    for d in (8, 128, 960):
        assert plan.choose_screen_precision(cpu, 10_000, d, 10, operation=operation) == "float32"
        assert plan.choose_screen_precision(cpu, 10_000, d, 99, operation=operation) == "float32"
        assert plan.choose_screen_precision(cpu, 10_000, d, 100, operation=operation) == "float64"
        assert plan.choose_screen_precision(cpu, 2_048, d, 100, operation=operation) == "float64"
        assert plan.choose_screen_precision(cpu, 500, d, 5, operation=operation) == "float64"


def test_strip_minima_reference_and_candidates(rng):
    # Strip minima of a block: each strip's smallest value and its column, ties to the smaller
    # column, NaN never the smallest (a strip of NaN reports +inf and its first column), a last
    # strip shorter than the others; the k smallest minima are k distinct columns.
    from knng.engine.thresholds import strip_candidates

    for m, n, strip in ((1, 1, 4), (7, 13, 4), (33, 64, 8), (5, 200, 64)):
        scores = torch.from_numpy(rng.integers(0, 6, size=(m, n)).astype(np.float32))  # ties
        scores[0, : min(n, strip)] = np.nan
        if n > strip:
            scores[-1, strip] = np.nan
        keys, cols = screen.strip_minima_of(scores, strip=strip)
        for r in range(m):
            for s_ in range(-(-n // strip)):
                seg = scores[r, s_ * strip:(s_ + 1) * strip].double()
                seg = torch.where(torch.isnan(seg), torch.inf, seg)
                best = float(seg.min())
                assert float(keys[r, s_]) == best
                assert int(cols[r, s_]) == s_ * strip + int(torch.nonzero(seg == best)[0, 0])
        k = max(1, keys.shape[1] // 2)
        values, picked = strip_candidates(keys, cols, k)
        for r in range(m):
            assert len(set(picked[r].tolist())) == k
            assert sorted(values[r].tolist()) == sorted(keys[r].tolist())[:k]
            assert torch.equal(torch.where(torch.isnan(scores[r, picked[r]]), torch.inf, scores[r, picked[r]]),
                               values[r])
    with pytest.raises(ValueError, match="strips"):
        strip_candidates(keys, cols, keys.shape[1] + 1)


def assert_smallest_of_rows_is_a_stable_sort(device: torch.device, rng) -> None:
    """The kernel behind strip_candidates on a GPU: each row's k smallest keys ascending (−0
    below +0, as row_kth's order codes), equal keys (+inf included) by position, and the
    columns at those positions; as a stable sort of the row's codes. Widths that are not
    powers of two, k = 1 and k = the whole row."""
    from knng.engine import thresholds
    from knng.engine.kernels import row_kth

    for m, width, k in ((1, 1, 1), (5, 3, 3), (40, 128, 10), (17, 200, 16), (3, 1024, 32), (9, 37, 1)):
        keys = torch.from_numpy(rng.integers(-3, 4, size=(m, width)).astype(np.float32))  # ties
        keys[0] = torch.inf  # a row of +inf only: still k distinct positions
        keys[-1, 1::5] = -torch.inf
        keys[m // 2, ::2] = 3.4e38
        if m > 2:
            keys[1] = 0.0
            keys[1, 1::3] = -0.0  # a row of zeros: −0 first
        cols = torch.from_numpy(rng.permutation(10 * width)[:width]).repeat(m, 1)
        keys, cols = keys.to(device), cols.to(device)
        values, picked = thresholds.strip_candidates(keys, cols, k)
        order = torch.sort(row_kth.ordered_code(keys), dim=1, stable=True).indices[:, :k]
        assert torch.equal(values.view(torch.int32), keys.gather(1, order).view(torch.int32))  # −0 is not +0
        assert torch.equal(picked, cols.gather(1, order))


def assert_kth_of_rows_is_its_reference(device: torch.device, rng) -> None:
    """Each row's smallest and k-th key code by ``row_kth.kth_of_rows`` (the kernel where
    Triton runs) equals a sort's: ties, a row of +inf, ±inf and the largest float32, −0 below +0
    (as row_kth's order codes), widths that are not powers of two, k = 1, k = the whole row and
    k above it (no code)."""
    from knng.engine.kernels import row_kth

    for m, width, k in ((1, 1, 1), (5, 3, 3), (40, 128, 33), (17, 200, 101), (3, 1024, 1024), (9, 37, 1),
                        (6, 1000, 999), (4, 5, 6), (33, 4096, 2000), (5, 7813, 2048), (4, 16384, 16384)):
        keys = torch.from_numpy(rng.integers(-3, 4, size=(m, width)).astype(np.float32))  # ties
        keys[0] = torch.inf
        keys[-1, 1::5] = -torch.inf
        keys[m // 2, ::2] = 3.4e38
        if m > 2:
            keys[1] = 0.0
            keys[1, 1::3] = -0.0
        if m > 3:
            keys[2] = torch.from_numpy(rng.standard_normal(width).astype(np.float32))  # distinct keys
        keys = keys.to(device)
        got = row_kth.kth_of_rows(keys, k)
        want = row_kth.kth_of_rows_reference(keys, k)
        for g, w, name in zip(got, want, ("first", "kth", "counts")):
            assert torch.equal(g, w), (m, width, k, name)
        if width >= k:
            codes = torch.sort(row_kth.ordered_code(keys), dim=1).values
            assert torch.equal(row_kth.decoded(want[1]).view(torch.int32), row_kth.decoded(codes[:, k - 1]).view(torch.int32))
        else:
            assert bool((want[1] == row_kth.NO_CODE).all())


def assert_tile_pairs_are_grouped(device: torch.device, rng) -> None:
    """``fused.group_tile_pairs`` (the grouping kernel's two passes) lists each tile's passing
    rows, and only those, in the tile's segment: keys equal to the threshold (kept), ±inf keys,
    NaN and ±inf thresholds, rows and tiles that are not multiples of the kernel's blocks, a
    tile of every row and one of none, an empty block."""
    for m, width in ((1, 1), (5, 3), (70, 40), (129, 131), (300, 17), (0, 4)):
        keys = torch.from_numpy(rng.integers(-3, 4, size=(m, width)).astype(np.float32))
        thr = torch.from_numpy(rng.integers(-3, 4, size=m).astype(np.float32))
        if m > 4:
            keys[1, ::3] = torch.inf
            keys[2, ::2] = -torch.inf
            thr[3], thr[4] = torch.nan, torch.inf
            thr[0] = -torch.inf
        if width > 2:
            keys[:, 0] = -5.0  # every row but the NaN and −inf ones
            keys[:, 1] = 7.0  # only the +inf row
        keys, thr = keys.to(device), thr.to(device)
        rows, counts, first = fused.group_tile_pairs(keys, thr)
        passed = keys <= thr[:, None]
        assert torch.equal(counts.long(), passed.sum(0)) and torch.equal(first.long(), torch.cumsum(counts, 0) - counts)
        for t in range(width):
            got = torch.sort(rows[first[t]:first[t] + counts[t]].long()).values
            assert torch.equal(got, torch.nonzero(passed[:, t]).flatten()), (m, width, t)


def test_tile_pairs_kernel_groups_the_pairs(rng, set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert_tile_pairs_are_grouped(torch.device("cpu"), rng)


def test_kth_of_rows_kernel_is_its_reference(rng, set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert_kth_of_rows_is_its_reference(torch.device("cpu"), rng)


def test_smallest_of_rows_kernel_is_a_stable_sort(rng, set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert_smallest_of_rows_is_a_stable_sort(torch.device("cpu"), rng)


@pytest.mark.parametrize("shape", [(1, 1), (31, 33), (64, 64), (130, 97), (257, 1025)])
@pytest.mark.parametrize("density", ["none", "sparse", "dense", "all"])
def test_cpu_chunked_screen_equals_the_whole_compare(shape, density, rng):
    # The CPU screen reads chunk minima first and compares only hit chunks; it must keep
    # exactly the entries a whole-block compare keeps, on both sides, thresholds hit exactly
    # (ties at the threshold), sizes that are not chunk multiples, ±inf thresholds.
    m, n = shape
    scores = torch.from_numpy(rng.integers(0, 40, size=shape).astype(np.float32))
    pick = {"none": -1.0, "sparse": 1.0, "dense": 25.0, "all": np.inf}[density]
    row_thr = torch.full((m,), pick, dtype=torch.float64)
    col_thr = torch.full((n,), pick, dtype=torch.float64)
    if density == "sparse":
        row_thr = scores.amin(1).to(torch.float64)  # ties at the threshold
        col_thr[::3] = -np.inf
    by_row, by_col = screen.block_survivors(scores, row_thr, col_thr)
    for found, mask in ((by_row, scores.to(torch.float64) <= row_thr[:, None]),
                        (by_col, (scores.to(torch.float64) <= col_thr[None, :]).T)):
        expect = torch.nonzero(mask)
        got = torch.stack([found.owner, found.other], 1)
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expect.tolist()))
        block = scores if found is by_row else scores.T
        assert torch.equal(found.keys, block[found.owner, found.other])


def _select_reference(scores: torch.Tensor, row_thr: torch.Tensor, col_thr: torch.Tensor | None) -> set:
    """(row, column, side) of every entry ≤ its row's (side 1) or column's (side 2) threshold."""
    by_row = scores <= row_thr[:, None]
    by_col = scores <= col_thr[None, :] if col_thr is not None else torch.zeros_like(by_row)
    side = by_row.to(torch.int8) + 2 * by_col.to(torch.int8)
    r, c = torch.nonzero(side > 0, as_tuple=True)
    return set(zip(r.tolist(), c.tolist(), side[r, c].tolist()))


def test_select_block_needs_contiguous_rows(interpret):
    scores = torch.zeros((8, 6)).T
    with pytest.raises(ValueError, match="contiguous"):
        fused.select_block(scores, torch.zeros(6), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(37, 70), (16, 32), (1, 5), (50, 1), (0, 9), (9, 0)])
@pytest.mark.parametrize("hint", [3, None])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("few", [0, 4, 10**6])
def test_select_block_in_the_interpreter(interpret, rng, dtype, shape, hint, symmetric, few, set_options):
    set_options(few_per_tile=few)
    # Each side in a list of its own: (row, column) pairs kept by their row, (column, row) pairs
    # kept by their column; together exactly the entries a compare finds, each once per side.
    m, n = shape
    scores = torch.from_numpy(rng.integers(0, 12, size=shape).astype(np.float64)).to(dtype)  # many ties
    row_thr = torch.from_numpy(rng.integers(-1, 6, size=m).astype(np.float64)).to(dtype)
    if m > 2:
        row_thr[0], row_thr[1] = torch.inf, -torch.inf  # a row that keeps all, one that keeps none
    col_thr = torch.from_numpy(rng.integers(-1, 4, size=n).astype(np.float64)).to(dtype) if symmetric else None
    by_row, by_col = fused.select_block(scores, row_thr, col_thr, capacity_hint=hint)  # 3 forces the relaunch
    assert (by_col is None) == (not symmetric)
    got = set()
    for side, (owner, other, keys) in ((1, by_row), (2, by_col)) if symmetric else ((1, by_row),):
        assert keys.dtype == dtype and owner.dtype == other.dtype == torch.int64
        pairs = list(zip(owner.tolist(), other.tolist()))
        assert len(pairs) == len(set(pairs)), "an entry was listed twice"
        rows, cols = (owner, other) if side == 1 else (other, owner)
        assert torch.equal(keys, scores[rows, cols])
        got |= {(r, c, side) for r, c in zip(rows.tolist(), cols.tolist())}
    both = {(r, c) for r, c, s in got if s == 1} & {(r, c) for r, c, s in got if s == 2}
    got = {(r, c, 3 if (r, c) in both else s) for r, c, s in got}
    assert got == _select_reference(scores, row_thr, col_thr)


def _epilogue_case(gen: torch.Generator, m: int, n: int, device: str):
    """A float32 score block with integer products (as exact products give) or arbitrary ones,
    row factors and column scales off powers of two (a lattice of unit 1/255), float32 terms,
    and values whose sums round: every step of the epilogue rounds somewhere."""
    scores = torch.randn((m, n + 3), generator=gen, dtype=torch.float64).mul_(2.0**20).round_().float()[:, :n]
    scores[: m // 2] = torch.randn((m // 2, n), generator=gen).mul_(1e4)  # arbitrary products too
    unit = torch.tensor(1 / 255, dtype=torch.float32)
    factors = (torch.rand(m, generator=gen) * 3 + 0.5).float() * unit
    scales = torch.exp2(torch.randint(-8, 8, (n,), generator=gen).float()) * unit
    col_terms = (torch.randn(n, generator=gen) * 1e5).float()
    row_terms = (torch.randn(m, generator=gen) * 1e5).float()
    return (t.to(device) for t in (scores, factors, scales, col_terms, row_terms))


def assert_block_epilogue_is_its_reference(device: str, kernel: bool) -> int:
    """``fused.block_epilogue`` by the kernel against torch's in-place operations, bit for bit,
    for every combination of scales and terms; a block that is a column slice (rows further
    apart than its width), tiles cut short on both sides, one row, one column."""
    gen = torch.Generator().manual_seed(7)
    cases = 0
    for m, n in [(70, 300), (1, 129), (33, 1), (64, 128)]:
        scores, factors, scales, col_terms, row_terms = _epilogue_case(gen, m, n, device)
        for use_scales in (False, True):
            for ct in (None, col_terms):
                for rt in (None, row_terms):
                    s = (factors, scales) if use_scales else None
                    want = fused.block_epilogue(scores.clone(), s, ct, rt, kernel=False)
                    got = fused.block_epilogue(scores.clone(), s, ct, rt, kernel=kernel)
                    assert torch.equal(got, want), (m, n, use_scales, ct is None, rt is None)
                    cases += 1
        wide = torch.zeros((m, n + 50), dtype=torch.float32, device=device)
        view = wide[:, 10:10 + n]
        view.copy_(scores)
        got = fused.block_epilogue(view, (factors, scales), col_terms, row_terms, kernel=kernel)
        want = fused.block_epilogue(scores.clone(), (factors, scales), col_terms, row_terms, kernel=False)
        assert torch.equal(got, want) and not wide[:, :10].any() and not wide[:, 10 + n:].any()
    return cases


def test_block_epilogue_kernel_in_the_interpreter(interpret):
    assert assert_block_epilogue_is_its_reference("cpu", kernel=True) == 32


def test_block_epilogue_reference_rounds_each_step():
    """The reference is four float32 operations in order (the kernel's), not one float64
    expression rounded once: 1 + 2²⁴ rounds to 2²⁴ (ties to even), then + 1 again, where the
    sum rounded once is 2²⁴ + 2."""
    one = torch.ones(1, dtype=torch.float32)
    got = fused.block_epilogue(one[:, None].clone(), (one, one), one * 2.0**24, one, kernel=False)
    assert float(got) == 2.0**24 and float(torch.tensor(1.0 + 2.0**24 + 1.0, dtype=torch.float32)) == 2.0**24 + 2


@pytest.mark.parametrize("n", [1, 2, 5, 70])
@pytest.mark.parametrize("exclude", [False, True])
def test_own_block_reference_reads_the_upper_triangle(n, exclude, rng):
    """``own_block_survivors``, the triangle's reference: pair (i, j) carries entry (min, max)'s
    key (the block need not be symmetric) and is kept where that is at or under row i's
    threshold (ties at it kept), never with itself where excluded."""
    scores = torch.from_numpy(rng.integers(0, 30, size=(n, n)).astype(np.float32))
    thr = torch.from_numpy(rng.integers(0, 30, size=n).astype(np.float64))
    found = screen.own_block_survivors(scores, thr, exclude_diagonal=exclude)
    expect = {(i, j) for i in range(n) for j in range(n)
              if scores[min(i, j), max(i, j)] <= thr[i] and not (exclude and i == j)}
    assert {tuple(p) for p in torch.stack([found.owner, found.other], 1).tolist()} == expect
    assert found.owner.numel() == len(expect)
    lo, hi = torch.minimum(found.owner, found.other), torch.maximum(found.owner, found.other)
    assert torch.equal(found.keys, scores[lo, hi])
