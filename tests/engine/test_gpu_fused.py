"""GPU tests of the fused screen kernel: its contract, its rounding bound on the hardware, and the
engine's exactness in every fused precision.

Run on a GPU machine with ``pytest -m gpu tests/engine/test_gpu_fused.py``. Skipped without CUDA and
Triton; the CPU tests of the same kernel (``test_fused.py``) run it in Triton's interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from knng.engine import kernels
from knng.engine.kernels import capabilities, fused
from knng.metrics import PRECISIONS, get_metric
from oracle import assert_exact_chunked, assert_screen_contract, smooth_image_patches

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not capabilities.triton_installed(),
                       reason="needs a CUDA GPU and Triton"),
]

#: Every precision a kernel screens: the fused kernel's and the digit kernel's (int8x4).
FUSED = [name for name, p in PRECISIONS.items() if p.fused or p.digits]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed % 2**63)


def _scaled_block(g: torch.Generator, m: int, n: int, d: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scaled float16 rows of a symmetric block far from the origin (drawn from ``g``), ten
    duplicated: the first m as rows and first n as columns, and their float32 terms (the
    columns' a copy to edit)."""
    x = torch.randn((max(m, n), d), generator=g, device="cuda", dtype=torch.float64) * 3 + 100
    x[10:20] = x[:10]
    p = get_metric("sqeuclidean").prepare(x - x.mean(0), None, side="corpus", symmetric=True, dtype=torch.float16)
    return p.vectors[:m], p.vectors[:n], p.terms.float()[:m].contiguous(), p.terms.float()[:n].clone()


def _prepare(x64: torch.Tensor, metric_name: str, precision: str, side: str, symmetric: bool):
    """Prepared vectors in the precision's storage, their float64 twins, norms and terms."""
    metric = get_metric(metric_name)
    p = PRECISIONS[precision]
    low = metric.prepare(x64, None, side=side, symmetric=symmetric, dtype=p.storage)
    exact = metric.prepare(x64, None, side=side, symmetric=symmetric, dtype=torch.float64)
    return low, exact


def _kernel_keys(a, b, d, precision, row_terms=None, col_terms=None):
    """Every key of the block from the kernel (thresholds +inf), as a dense float64 matrix."""
    m, n = a.shape[0], b.shape[0]
    inf = torch.full((m,), torch.inf, device="cuda")
    out, _ = fused.screen_block(a, b, d, inf, None, row_terms, col_terms, precision, capacity_hint=m * n)
    assert out.keys.numel() == m * n
    dense = torch.full((m, n), torch.nan, dtype=torch.float64, device="cuda")
    dense[out.owner, out.other] = out.keys.double()
    assert not torch.isnan(dense).any(), "an entry was not written"
    return dense


# ------------------------------------------------------------------------------ the bound
def _adversarial(kind: str, m: int, d: int, g: torch.Generator) -> torch.Tensor:
    """Float64 inputs built to stress one part of the bound."""
    if kind == "gaussian":
        return torch.randn((m, d), generator=g, device="cuda", dtype=torch.float64)
    if kind == "positive":  # all products of one sign: the accumulation error adds up
        return torch.rand((m, d), generator=g, device="cuda", dtype=torch.float64) + 0.5
    if kind == "midpoints":  # just under half a step of bfloat16 / float16, or a whole TF32 step: the
        # worst rounding (and truncation) of the inputs
        base = 1.0 + torch.randint(0, 128, (m, d), generator=g, device="cuda").double() / 128
        deltas = torch.tensor([2.0**-8, 2.0**-11, 2.0**-10], dtype=torch.float64, device="cuda") - 2.0**-30
        delta = deltas[torch.randint(0, 3, (m, d), generator=g, device="cuda")]
        sign = torch.where(torch.rand((m, d), generator=g, device="cuda") < 0.5, -1.0, 1.0).double()
        return sign * (base + delta)
    if kind == "huge":
        return torch.randn((m, d), generator=g, device="cuda", dtype=torch.float64) * 1e15
    if kind == "tiny":  # below float32's normal range in places: flushed inputs and products
        return torch.randn((m, d), generator=g, device="cuda", dtype=torch.float64) * 1e-20
    if kind == "flat":  # image-like: long runs of one value, a few outliers
        x = torch.full((m, d), 0.6, dtype=torch.float64, device="cuda")
        x[:, ::7] += torch.rand((m, (d + 6) // 7), generator=g, device="cuda", dtype=torch.float64)
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("precision", FUSED)
@pytest.mark.parametrize("metric_name", ["sqeuclidean", "inner_product"])
@pytest.mark.parametrize("kind", ["gaussian", "positive", "midpoints", "huge", "tiny", "flat"])
def test_bound_holds_on_the_hardware(precision, metric_name, kind, seed):
    """|s̃ − s| ≤ E for every one of millions of pairs (2048 × 2048 per case, d up to 1024)."""
    g = _gen(seed)
    worst = 0.0
    for d in (64, 1024):
        x = _adversarial(kind, 2048, d, g)
        y = _adversarial(kind, 2048, d, g)
        metric = get_metric(metric_name)
        qa, qe = _prepare(x, metric_name, precision, "query", symmetric=True)
        ca, ce = _prepare(y, metric_name, precision, "corpus", symmetric=True)
        rt = None if qe.terms is None else qe.terms.float()
        ct = None if ce.terms is None else ce.terms.float()
        got = _kernel_keys(qa.vectors, ca.vectors, d, precision, rt, ct)
        exact = qe.vectors[:, :d] @ ce.vectors[:, :d].T  # float64 from the unrounded prepared values
        if qe.terms is not None:
            exact = exact + ce.terms[None, :] + qe.terms[:, None]
        # The stored vectors' norms: a digit row's are its bound norms (≥ the float64 norms).
        bound = metric.pair_bound(d, qa.norms[:, None], ca.norms[None, :],
                                  None if qe.terms is None else qe.terms[:, None],
                                  None if ce.terms is None else ce.terms[None, :], precision=PRECISIONS[precision])
        ratio = ((got - exact).abs() / bound).max().item()
        worst = max(worst, ratio)
        assert ratio <= 1.0, f"{precision} {kind} d={d}: |s̃ − s| reached {ratio:.3f} × E"
    print(f"\n{precision} {metric_name} {kind}: max |s̃ − s| / E = {worst:.3g}")


# --------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("precision", FUSED)
@pytest.mark.parametrize("symmetric", [False, True])
def test_kernel_keeps_what_the_bound_says(precision, symmetric, seed):
    """Everything certainly under a threshold is kept, nothing certainly over it is."""
    g = _gen(seed)
    m, n, d = 1000, 3001, 77  # not tile multiples
    metric = get_metric("sqeuclidean")
    x = torch.randn((m, d), generator=g, device="cuda", dtype=torch.float64)
    y = torch.randn((n, d), generator=g, device="cuda", dtype=torch.float64)
    y[100:200] = y[:100]  # duplicate columns (thresholds may sit on their score)
    qa, qe = _prepare(x, "sqeuclidean", precision, "query", symmetric=True)
    ca, ce = _prepare(y, "sqeuclidean", precision, "corpus", symmetric=True)
    exact = qe.vectors[:, :d] @ ce.vectors[:, :d].T + ce.terms[None, :] + qe.terms[:, None]
    bound = metric.pair_bound(d, qa.norms[:, None], ca.norms[None, :], qe.terms[:, None], ce.terms[None, :],
                              precision=PRECISIONS[precision])
    row_thr = exact.kthvalue(20, dim=1).values
    col_thr = exact.kthvalue(5, dim=0).values if symmetric else None
    by_row, by_col = fused.screen_block(qa.vectors, ca.vectors, d, row_thr.float(),
                                        None if col_thr is None else col_thr.float(), qe.terms.float(),
                                        ce.terms.float(), precision, capacity_hint=16)
    assert_screen_contract(by_row, by_col, exact, bound, row_thr, col_thr)
    for rows, cols, keys in [(by_row.owner, by_row.other, by_row.keys)] + (
            [(by_col.other, by_col.owner, by_col.keys)] if symmetric else []):
        assert bool(((keys.double() - exact[rows, cols]).abs() <= bound[rows, cols]).all())
    if symmetric:
        # Each side's list holds exactly its side's pairs, by the kernel's own keys: a pair
        # kept by both is in both lists, with one key.
        keys = torch.full(exact.shape, torch.nan, dtype=torch.float32, device="cuda")
        keys[by_row.owner, by_row.other] = by_row.keys
        both = ~torch.isnan(keys[by_col.other, by_col.owner])
        assert torch.equal(keys[by_col.other, by_col.owner][both], by_col.keys[both])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(1000, 1537), (17, 3000), (2048, 5)])
@pytest.mark.parametrize("hint", [7, None])
def test_select_block_on_the_hardware(seed, dtype, shape, hint):
    # Both sides of a block in memory, each in its own list: exactly the entries a compare
    # keeps for their row and for their column, each once, with their keys; many ties at the
    # thresholds, a row that keeps all and one that keeps none; hint 7 forces the relaunch.
    g = _gen(seed)
    m, n = shape
    scores = torch.randint(0, 40, shape, generator=g, device="cuda").to(dtype)
    row_thr = torch.randint(-1, 6, (m,), generator=g, device="cuda").to(dtype)
    col_thr = torch.randint(-1, 4, (n,), generator=g, device="cuda").to(dtype)
    row_thr[0], row_thr[1] = torch.inf, -torch.inf
    by_row, by_col = fused.select_block(scores, row_thr, col_thr, capacity_hint=hint)
    for (owner, other, keys), expect in ((by_row, scores <= row_thr[:, None]),
                                         (by_col, (scores <= col_thr[None, :]).T)):
        kept = torch.zeros_like(expect)
        kept[owner, other] = True
        assert int(kept.sum()) == owner.numel(), f"seed={seed}: an entry was listed twice"
        assert torch.equal(kept, expect), f"seed={seed}"
        block = scores if expect.shape == scores.shape else scores.T
        assert torch.equal(keys, block[owner, other])


def test_kernel_excludes_the_diagonal(seed):
    g = _gen(seed)
    x = torch.randn((700, 40), generator=g, device="cuda")
    a = x * -2.0
    inf = torch.full((700,), torch.inf, device="cuda")
    out, _ = fused.screen_block(a[100:300], x, 40, inf[:200], None, None, None, "bfloat16", exclude_diagonal=-100)
    assert out.owner.numel() == 200 * 700 - 200
    assert not bool((out.owner + 100 == out.other).any())


# ------------------------------------------------------------------------- the engine, exact
#: How the float16 kernel tests run the CUDA screen on a Hopper GPU: the wgmma kernel with one
#: accumulator set (two blocks a multiprocessor, the default to K = 128) or two, or mma.sync.
WGMMA_MODES = ["one set", "two sets", False]


def _wgmma_mode(mode: "str | bool", set_options) -> None:
    """Screens on the wgmma kernel in ``mode`` (see :data:`WGMMA_MODES`), or on mma.sync."""
    set_options(wgmma=bool(mode), wgmma_one_set=mode == "one set")


@pytest.fixture(params=FUSED)
def fused_precision(request, set_options):

    set_options(screen_precision=request.param)
    yield request.param
    assert last_report().screen_dtype == request.param


def _check(q, c, results, metric="euclidean", **kw):
    assert_exact_chunked(q, c, results, metric, device="cuda", **kw)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "inner_product"])
def test_search_exact(fused_precision, metric, seed):
    g = _gen(seed)
    c = torch.randn((200_003, 96), generator=g, device="cuda") + 5.0  # un-centred
    q = torch.randn((3000, 96), generator=g, device="cuda") + 5.0
    res = [knng.search(q, c, k, metric=metric) for k in (1, 10, 300)]
    _check(q, c, res, metric, rows=torch.randperm(3000, device="cuda")[:512])


def test_search_image_patches_and_duplicates(fused_precision, seed):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(smooth_image_patches(rng, 60_000)).cuda()
    x[30_000:31_000] = x[:1000]  # exact duplicates: ties broken by index
    res = [knng.search(x[:2000], x, k) for k in (1, 10, 100)]
    _check(x[:2000], x, res, rows=torch.arange(0, 2000, 3, device="cuda"))


def test_search_huge_offset_and_k_equals_n(fused_precision, seed):
    g = _gen(seed)
    c = (torch.randn((3000, 50), generator=g, device="cuda", dtype=torch.float64) + 1e6).float()
    q = (torch.randn((400, 50), generator=g, device="cuda", dtype=torch.float64) + 1e6).float()
    _check(q, c, [knng.search(q, c, 3000), knng.search(q, c, 7)])


@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("method", ["symmetric", "rows"])
def test_graph_exact(fused_precision, include_self, method, seed, set_options):
    """Both graph methods (``plan.graph_method``) on the kernels: symmetric parts of 8,192 (the last
    one short) in launches of 3 column parts; or chunks of rows searched against the data (the
    last one short). Duplicates: 500 points twice, and 21 copies of point 7 (more than k of
    smaller index than most of them: the point itself falls out of its k + 1 nearest)."""

    set_options(gpu_max_part=8192)  # several parts, the last one short
    set_options(gpu_kernel_max_part=8192)
    set_options(gpu_triangle_max_part=8192)  # own blocks as triangles (Hopper) too
    set_options(gpu_kernel_group_columns=3 * 8192)  # launches of 3 column parts, one short
    set_options(graph_rows_min_k=1 if method == "rows" else 10**9)
    set_options(graph_rows_tiles_first=method == "rows")
    set_options(kernel_search_rows=8192)  # several chunks of rows (7 of 7,143 and 7,142)
    g = _gen(seed)
    x = torch.randn((50_001, 64), generator=g, device="cuda") * 3 + 7
    x[40_000:40_500] = x[:500]
    x[45_000:45_020] = x[7]
    res = [knng.graph(x, k, include_self=include_self) for k in (1, 10, 64)]
    rep = last_report()
    if method == "rows" and PRECISIONS[fused_precision].fused:
        assert rep.plan.graph_method == "rows" and rep.parts == -(-50_001 // rep.plan.query_rows) > 1
    else:
        assert rep.plan.graph_method == "symmetric" and rep.parts == 7 and rep.plan.group_parts == 3
    rows = torch.cat([torch.randperm(50_001, device="cuda")[:1024], torch.arange(45_000, 45_020, device="cuda")])
    _check(x, x, res, exclude_self=not include_self, rows=rows)


@pytest.mark.parametrize("method", ["symmetric", "rows"])
def test_graph_image_patches(fused_precision, method, seed, set_options):
    """Image patches (flat regions: near-ties by the hundred) by both graph methods (the planner
    keeps such data symmetric; the rows method is forced here, around one centre)."""

    set_options(graph_rows_min_k=1 if method == "rows" else 10**9)
    set_options(graph_rows_tiles_first=method == "rows")
    if method == "rows":  # around one centre (no principal frames) and by rows, whatever the data's slabs
        set_options(principal_min_gain=float("inf"), local_centre_gain=float("inf"))
    set_options(kernel_search_rows=16384)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(smooth_image_patches(rng, 80_000)).cuda()
    res = [knng.graph(x, k) for k in (10, 100)]
    rep = last_report()
    assert rep.screened_per_row, rep
    if method == "rows" and PRECISIONS[fused_precision].fused:
        assert rep.plan.graph_method == "rows" and rep.parts > 1
    _check(x, x, res, exclude_self=True, rows=torch.arange(0, 80_000, 97, device="cuda"))


@pytest.mark.parametrize("frames", ["principal", "one centre"])
def test_graph_rows_escalated_on_the_kernels(fused_precision, frames, seed, set_options):
    """Hard rows escalated on a GPU (``Options.escalate_pairs`` low, so that the near-ties of
    flat patches and of a few hundred unfolded copies outgrow it): τ = −∞ reaches the screen
    kernels, the held pairs and the windows of principal frames; the escalated rows are searched
    again in float64. Every answer exact, and the same bit for bit as without escalation."""

    set_options(fold_duplicates=False)  # copies that stay rows of their own: thousands of near-ties
    set_options(graph_method="symmetric")  # (small data would run by rows: a search, which holds no pairs)
    set_options(gpu_max_part=16384, gpu_kernel_max_part=16384, gpu_triangle_max_part=16384,
                gpu_triangle_max_part_small_k=16384)  # several parts: slabs for principal frames
    if frames == "one centre":
        set_options(principal_min_gain=float("inf"), local_centre_gain=float("inf"))
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(smooth_image_patches(rng, 60_000)).cuda()
    x[50_000:50_300] = x[11]
    runs = {}
    for escalate in (0, 64):
        set_options(escalate_pairs=escalate)
        runs[escalate] = [knng.graph(x, k) for k in (10, 40)]
        rep = last_report()
        assert (rep.rows_escalated > 0) == (escalate > 0 and rep.plan.escalation is not None), rep.rows_escalated
        if escalate and fused_precision == "float16":  # the planner's precision for patches holds and escalates
            assert rep.rows_escalated >= 300, (rep.rows_escalated, rep.plan.graph_method, rep.plan.frames)
    for a, b in zip(runs[0], runs[64]):
        torch.testing.assert_close(a.indices, b.indices, rtol=0, atol=0)
        torch.testing.assert_close(a.distances, b.distances, rtol=0, atol=0)
    rows = torch.cat([torch.arange(0, 60_000, 113, device="cuda"), torch.arange(50_000, 50_300, 7, device="cuda")])
    _check(x, x, runs[64], exclude_self=True, rows=rows)


def test_graph_high_dimension_large_k(fused_precision, seed):
    g = _gen(seed)
    x = torch.randn((6000, 2048), generator=g, device="cuda")
    res = knng.graph(x, 1024)
    _check(x, x, [res], exclude_self=True, rows=torch.arange(0, 6000, 11, device="cuda"))


# ------------------------------------------------------------- the float16 kernels, side by side
@pytest.mark.skipif(not torch.cuda.is_available() or not __import__("knng.engine.kernels").engine.kernels
                    .cuda_screen_runs(torch.device("cuda")), reason="needs CuPy for the CUDA C screen")
@pytest.mark.parametrize("shape", [(1, 1, 5), (7, 127, 16), (129, 129, 100), (1000, 5000, 128), (250, 1100, 200),
                                   (700, 2000, 256), (300, 777, 960)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("diag", [None, 0, -40])
@pytest.mark.parametrize("wgmma", WGMMA_MODES)
def test_cuda_and_triton_float16_kernels_keep_the_same_pairs(shape, symmetric, diag, wgmma, seed, set_options):
    """The CUDA C kernels (warp votes; with ``wgmma``, on a Hopper GPU and K ≤ 256,
    ``cuda/screen_wg.cu``'s asynchronous warpgroup products, one accumulator set or two at
    K ≤ 128, else ``cuda/screen.cu``'s mma.sync) and the Triton kernel on the same scaled
    float16 rows: the contract against the
    float64 scores of the stored values (ties at the thresholds, duplicate columns, rows of
    several magnitudes, sizes that are not tile multiples, the diagonal), and every pair kept by
    one and not the other within float32 rounding of its threshold."""
    from knng.metrics import scaled_row_factors, scaled_scales, scaled_width

    _wgmma_mode(wgmma, set_options)
    g = _gen(seed)
    m, n, d = shape
    metric = get_metric("sqeuclidean")
    x = torch.randn((m, d), generator=g, device="cuda", dtype=torch.float64)
    x *= 10.0 ** torch.randint(-3, 4, (m, 1), generator=g, device="cuda")
    y = torch.randn((n, d), generator=g, device="cuda", dtype=torch.float64) + 3
    y[n // 2:n // 2 + min(5, n // 4)] = y[:min(5, n // 4)]
    qa = metric.prepare(x, None, side="query", symmetric=symmetric, dtype=torch.float16)
    ca = metric.prepare(y, None, side="corpus", symmetric=True, dtype=torch.float16)
    rt = qa.terms.float() if symmetric else None
    ct = ca.terms.float()
    k = scaled_width(d)
    exact = (qa.vectors[:, :k].double() @ ca.vectors[:, :k].double().T)
    exact = exact * scaled_row_factors(qa.vectors).double()[:, None] * scaled_scales(ca.vectors).double()[None, :]
    exact = exact + ct.double()[None, :] + (rt.double()[:, None] if rt is not None else 0)
    if diag is not None:
        r = torch.arange(m, device="cuda")
        c = r - diag
        ok = (c >= 0) & (c < n)
        exact[r[ok], c[ok]] = torch.inf
    finite_keys = exact[torch.isfinite(exact)]
    top = float(finite_keys.abs().max()) if finite_keys.numel() else 1.0
    radius = 2e-5 * (1 + top)
    # Thresholds on ties (the k-th key), finite even where a row's only entry is the excluded
    # one; excluded entries stand at 1e30, certainly over every threshold.
    row_thr = exact.kthvalue(min(n, 3), dim=1).values.clamp(max=top)
    col_thr = exact.kthvalue(min(m, 2), dim=0).values.clamp(max=top) if symmetric else None
    outs = []
    for use_cuda in (True, False):
        set_options(cuda_screen=use_cuda)
        by_row, by_col = fused.screen_block(qa.vectors, ca.vectors, d, row_thr.float(),
                                            None if col_thr is None else col_thr.float(), rt, ct, "float16",
                                            exclude_diagonal=diag, capacity_hint=7)  # 7: the relaunch
        finite = torch.where(torch.isfinite(exact), exact, 1e30)
        assert_screen_contract(by_row, by_col, finite, radius, row_thr, col_thr)
        assert torch.allclose(by_row.keys.double(), exact[by_row.owner, by_row.other], rtol=1e-5,
                              atol=float(radius))
        outs.append(by_row)
    (a_row, b_row) = outs
    pairs = {tuple(p) for p in torch.stack([a_row.owner, a_row.other], 1).tolist()}
    other = {tuple(p) for p in torch.stack([b_row.owner, b_row.other], 1).tolist()}
    for r, c in pairs ^ other:
        assert abs(float(exact[r, c]) - float(row_thr[r])) <= float(radius), "the kernels differ away from a tie"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hopper_screens_run_the_wgmma_kernel():
    """On compute capability 9.0 a screen of K ≤ 256 runs the wgmma kernel (it compiles there:
    one accumulator set and two blocks a multiprocessor up to K = 128, or four B tiles in its
    ring with two sets where the one set is off; two tiles past it), a wider one or one with
    the wgmma option off the mma.sync kernel; elsewhere always the latter."""
    from knng.engine.kernels import cuda_screen

    if not kernels.cuda_screen_runs(torch.device("cuda")):
        pytest.skip("needs CuPy")
    hopper = torch.cuda.get_device_capability() == (9, 0)
    index = torch.cuda.current_device()
    for symmetric in (False, True):
        assert (cuda_screen.choose_config(128, symmetric, index) == "wg128x128s1") == hopper
        assert cuda_screen.choose_config(64, symmetric, index).startswith("wg") == hopper
        assert (cuda_screen.choose_config(256, symmetric, index) == "wg128x128b2") == hopper
        assert (cuda_screen.choose_config(144, symmetric, index) == "wg128x128b2") == hopper
        assert not cuda_screen.choose_config(272, symmetric, index).startswith("wg")
    with knng.options(wgmma_one_set=False):
        assert (cuda_screen.choose_config(128, False, index) == "wg128x128") == hopper
    with knng.options(wgmma=False):
        assert not cuda_screen.choose_config(128, False, index).startswith("wg")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,d", [(1, 16), (2, 16), (127, 64), (128, 128), (129, 100), (700, 128), (2500, 64),
                                 (1300, 256), (4200, 128)])
@pytest.mark.parametrize("exclude", [False, True])
@pytest.mark.parametrize("keep", [3, 40, "all"])
def test_wgmma_triangle_keeps_the_pairs_of_the_whole_block(n, d, exclude, keep, seed):
    """A part's own block screened as its upper triangle (``screen_own_later`` on a Hopper GPU)
    against its reference (``own_block_survivors``: entry (i, j), i ≤ j, for both pairs) and the
    float64 scores: every pair certainly under its point's threshold kept, none certainly over,
    none twice, none with itself where excluded, and the keys within float32 rounding of the
    pair's score. Ties (duplicate points, thresholds on the k-th key), rows of several
    magnitudes, sizes that are not tile multiples (the diagonal tile cut by n), one tile and
    many. The rows screen of the whole block keeps the same pairs but for those within rounding
    of a threshold."""
    from knng.engine.screen import block_scores, own_block_survivors, screen_own_later
    from knng.metrics import get_precision

    if not kernels.wgmma_runs(torch.device("cuda"), d):
        pytest.skip("needs the wgmma kernel (compute capability 9.0, CuPy)")
    g = _gen(seed)
    metric = get_metric("sqeuclidean")
    x = torch.randn((n, d), generator=g, device="cuda", dtype=torch.float64)
    x *= 10.0 ** torch.randint(-1, 2, (n, 1), generator=g, device="cuda")
    x[n // 2:n // 2 + min(7, n // 4)] = x[:min(7, n // 4)]  # duplicates across tiles
    p = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)
    queries = metric.prepare(x, None, side="query", symmetric=True, dtype=torch.float16).vectors
    t = p.terms.float()
    precision = get_precision("float16")
    keys = block_scores(queries, p.vectors, d, precision, t, t).double()
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device="cuda"))
    exact = torch.where(upper, keys, keys.T)  # one score a pair, whichever side screens it
    if exclude:
        exact.fill_diagonal_(torch.inf)
    top = float(exact[torch.isfinite(exact)].abs().max()) if n > 1 or not exclude else 1.0
    # float32 rounding of sums as large as the terms (a point's key with itself cancels them to
    # about 0: the largest key alone can be far smaller than what was rounded)
    radius = 2e-5 * (1 + max(top, float(t.abs().max())))
    if keep == "all":  # over every score, under the excluded diagonal's stand-in below
        thr = torch.full((n,), 2 * top + 1, device="cuda", dtype=torch.float64)
    else:
        thr = exact.kthvalue(min(n, keep), dim=1).values.clamp(max=top)  # on ties
    found = screen_own_later(queries, p.vectors, d, thr, precision, terms=t, exclude_diagonal=exclude)()
    reference = own_block_survivors(keys.float(), thr, exclude_diagonal=exclude)
    assert_screen_contract(found, None, torch.where(torch.isfinite(exact), exact, 1e30), radius, thr)
    assert torch.allclose(found.keys.double(), exact[found.owner, found.other], rtol=1e-5, atol=radius)
    if exclude:
        assert not bool((found.owner == found.other).any())
    if keep == "all":
        assert found.owner.numel() == n * (n - int(exclude))
    kept = {tuple(q) for q in torch.stack([found.owner, found.other], 1).tolist()}
    expected = {tuple(q) for q in torch.stack([reference.owner, reference.other], 1).tolist()}
    for r, c in kept ^ expected:
        assert abs(float(exact[r, c]) - float(thr[r])) <= radius, "the triangle differs away from a tie"
    with knng.options(kernels={"triangle": False}):
        rows = screen_own_later(queries, p.vectors, d, thr, precision, terms=t, exclude_diagonal=exclude)()
    by_rows = {tuple(q) for q in torch.stack([rows.owner, rows.other], 1).tolist()}
    for r, c in kept ^ by_rows:
        assert abs(float(exact[r, c]) - float(thr[r])) <= radius, "rows and triangle differ away from a tie"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("wgmma", WGMMA_MODES)
def test_cuda_float16_kernel_keeps_everything_and_nothing(wgmma, seed, set_options):
    """+inf thresholds keep all m·n pairs (lists sized to hold them all after one relaunch),
    −inf none; the keys equal the Triton kernel's within float32 rounding (both CUDA kernels)."""

    if not kernels.cuda_screen_runs(torch.device("cuda")):
        pytest.skip("needs CuPy")
    _wgmma_mode(wgmma, set_options)
    g = _gen(seed)
    x = torch.randn((300, 64), generator=g, device="cuda", dtype=torch.float64)
    metric = get_metric("sqeuclidean")
    p = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)
    t = p.terms.float()
    inf = torch.full((300,), torch.inf, device="cuda")
    keys = []
    for use_cuda in (True, False):
        with knng.options(cuda_screen=use_cuda):
            out, col = fused.screen_block(p.vectors, p.vectors, 64, inf, inf, t, t, "float16", capacity_hint=10)
            none, _ = fused.screen_block(p.vectors, p.vectors, 64, -inf, None, t, t, "float16")
        assert out.owner.numel() == col.owner.numel() == 300 * 300 and none.owner.numel() == 0
        dense = torch.full((300, 300), torch.nan, dtype=torch.float64, device="cuda")
        dense[out.owner, out.other] = out.keys.double()
        assert not torch.isnan(dense).any()
        keys.append(dense)
    assert torch.allclose(keys[0], keys[1], rtol=1e-5, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,n,d", [(1, 1, 16), (129, 63, 64), (300, 65, 128), (1000, 8229, 128), (77, 700, 200),
                                   (400, 3000, 256), (50, 300, 960)])
@pytest.mark.parametrize("wgmma", WGMMA_MODES)
def test_cuda_strip_minima_are_the_screen_keys_reduced(m, n, d, wgmma, seed, set_options):
    """The CUDA kernel's strip minima equal the reference reduction (``strip_minima_of``) of
    every key the screen kernel computes for the same block, bit for bit (the same products
    and roundings), columns too: duplicate rows (ties go to the smaller column), NaN column
    terms (never the smallest; a strip of them reports +inf), sizes that are not tile or strip
    multiples, K of one chunk and several (A resident, and streamed at K = 960); on a Hopper GPU
    from the wgmma kernel (K <= 256: one accumulator set or two to K = 128, two past it) and
    from the mma.sync one."""
    from knng.engine import screen

    if not kernels.cuda_screen_runs(torch.device("cuda")):
        pytest.skip("needs CuPy")
    set_options(wgmma_minima=bool(wgmma))
    set_options(wgmma_one_set=wgmma == "one set")
    a, b, rt, ct = _scaled_block(_gen(seed + m + n), m, n, d)
    ct[5:5 + kernels.strip_width()] = torch.nan  # a whole strip (where n allows) of NaN keys
    keys, cols = fused.strip_minima(a, b, d, rt, ct, "float16")
    dense = _kernel_keys(a, b, d, "float16", rt, ct.nan_to_num(nan=torch.inf))
    dense[:, 5:5 + kernels.strip_width()] = torch.nan
    want_keys, want_cols = screen.strip_minima_of(dense.float())
    assert keys.shape == (m, -(-n // kernels.strip_width())) and cols.dtype == torch.int32
    assert torch.equal(keys, want_keys) and torch.equal(cols.long(), want_cols)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,n,d", [(1, 1, 16), (129, 63, 64), (300, 1000, 128), (1000, 8229, 128), (77, 700, 200),
                                   (400, 3000, 256)])
def test_cuda_tile_minima_are_the_screen_keys_reduced(m, n, d, seed):
    """The wgmma kernel's tile minima (keys only, 128-column tiles) equal the reference reduction
    of every key the screen kernel computes for the same block, bit for bit: duplicate rows,
    NaN column terms (never the smallest; a tile of them reports +inf), sizes that are not
    tile multiples, K of one chunk to four."""
    from knng.engine import screen

    if not kernels.gathered_runs(torch.device("cuda"), "float16", d):
        pytest.skip("needs the wgmma kernel (a Hopper GPU and CuPy)")
    a, b, rt, ct = _scaled_block(_gen(seed + m + n), m, n, d)
    ct[0:kernels.TILE] = torch.nan  # the first tile (where n allows: all of it) of NaN keys
    ct[300:310] = torch.nan
    keys = fused.tile_minima(a, b, d, rt, ct, "float16")
    dense = _kernel_keys(a, b, d, "float16", rt, ct.nan_to_num(nan=torch.inf))
    dense[:, ct.isnan()] = torch.nan
    want = screen.strip_minima_of(dense.float(), kernels.TILE)[0]
    assert keys.shape == (m, -(-n // kernels.TILE)) and keys.dtype == torch.float32
    assert torch.equal(keys, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,n,d", [(1, 1, 16), (300, 1000, 64), (1000, 8229, 128), (77, 700, 200), (700, 3000, 256)])
@pytest.mark.parametrize("thresholds", ["quantiles", "at keys", "everything", "nothing"])
def test_cuda_gathered_screen_is_the_screen_of_its_tiles(m, n, d, thresholds, seed):
    """``fused.screen_tiles`` (the grouping kernel, then the wgmma kernel's screen of gathered
    rows) keeps, for every (row, tile) whose tile key is within the row's threshold, exactly the
    pairs whose screen key is within it (the keys of the whole block's screen, bit for bit), and
    nothing of the other tiles: random choices (some tiles with more than 128 rows: several work
    items; some with none), thresholds between two keys of each row, thresholds equal to keys
    (ties kept), +inf (every tile whole), −inf and NaN (nothing); duplicate rows, sizes that are
    not tile multiples, K of one chunk to four; the survivors' list too small at first."""
    if not kernels.gathered_runs(torch.device("cuda"), "float16", d):
        pytest.skip("needs the wgmma kernel (a Hopper GPU and CuPy)")
    g = _gen(seed + m + n + d)
    a, b, rt, ct = _scaled_block(g, m, n, d)
    dense = _kernel_keys(a, b, d, "float16", rt, ct)
    ordered = torch.sort(dense, dim=1).values
    at = torch.randint(0, max(1, n // 3), (m,), generator=g, device="cuda")
    every = torch.arange(m, device="cuda")
    if thresholds == "quantiles":  # between two keys of the row
        thr = (ordered[every, at] + ordered[every, torch.clamp(at + 1, max=n - 1)]) / 2
    elif thresholds == "at keys":
        thr = ordered[every, at]
    elif thresholds == "everything":
        thr = torch.full((m,), torch.inf, dtype=torch.float64, device="cuda")
    else:
        thr = torch.full((m,), -torch.inf, dtype=torch.float64, device="cuda")
        thr[::2] = torch.nan
    thr32 = thr.float()
    tiles = -(-n // kernels.TILE)
    chosen = torch.rand((m, tiles), generator=g, device="cuda") < 0.4
    chosen[:, 0] = True  # the first tile: every row (m > 128: several work items)
    if tiles > 2:
        chosen[:, 1] = False  # a tile of no row
    # Tile keys that choose: −inf passes any threshold but NaN, +inf only +inf (everything).
    tile_keys = torch.where(chosen, -torch.inf, torch.inf)
    found = fused.screen_tiles(a, b, d, tile_keys, thr32, rt, ct, "float16", capacity_hint=10)  # one relaunch
    passing = tile_keys <= thr32[:, None]
    keep = (dense <= thr32.double()[:, None]) & passing.repeat_interleave(kernels.TILE, dim=1)[:, :n]
    want_r, want_c = torch.nonzero(keep, as_tuple=True)
    got = torch.sort(found.owner * n + found.other).indices
    assert torch.equal((found.owner * n + found.other)[got], want_r * n + want_c)
    assert torch.equal(found.keys[got].double(), dense[want_r, want_c])


# ------------------------------------------------------------------------ threshold radii
def test_radius_kernel_is_its_reference_on_the_hardware():
    """The threshold radius kernel, launched without fused multiply-adds, gives the torch
    reference's float64 values bit for bit on the GPU (every metric, precision and kind of
    maxima: ``test_radius.py``)."""
    from test_radius import (
        assert_kernel_is_reference, assert_pair_radius_is_reference, assert_seeding_is_reference,
        assert_tightening_is_reference,
    )

    assert assert_kernel_is_reference(torch.device("cuda")) > 100
    assert assert_tightening_is_reference(torch.device("cuda")) > 20
    assert assert_seeding_is_reference(torch.device("cuda")) > 20
    assert assert_pair_radius_is_reference(torch.device("cuda")) > 20


def test_block_epilogue_kernel_is_its_reference_on_the_hardware():
    """The score block's scalings and terms in one launch without fused multiply-adds: torch's
    four in-place float32 operations bit for bit (``test_fused.py``'s cases)."""
    from test_fused import assert_block_epilogue_is_its_reference

    assert assert_block_epilogue_is_its_reference("cuda", kernel=True) == 32


def test_strip_candidates_kernel_is_a_stable_sort_on_the_hardware(rng):
    """The k smallest strip minima of each row by the kernel (``row_kth.smallest_of_rows``)
    are a stable sort's, on the adversarial rows of ``test_fused.py`` and on a graph part's
    scale (66,667 rows of 128 strips, k = 10; 66,667 of 256 at k = 16)."""
    from knng.engine import thresholds
    from knng.engine.kernels import row_kth
    from test_fused import assert_smallest_of_rows_is_a_stable_sort

    assert_smallest_of_rows_is_a_stable_sort(torch.device("cuda"), rng)
    for width, k in ((128, 10), (256, 16)):
        keys = torch.randn((66_667, width), device="cuda").round(decimals=1)  # ties
        cols = torch.randperm(10 * width, device="cuda")[:width].repeat(66_667, 1)
        values, picked = thresholds.strip_candidates(keys, cols, k)
        order = torch.sort(row_kth.ordered_code(keys), dim=1, stable=True).indices[:, :k]
        assert torch.equal(values, keys.gather(1, order)) and torch.equal(picked, cols.gather(1, order))


def test_tile_pairs_kernel_groups_the_pairs_on_the_hardware(rng):
    """The grouping kernel of the gathered screen (``fused.group_tile_pairs``) on the GPU, on
    ``test_fused.py``'s cases."""
    from test_fused import assert_tile_pairs_are_grouped

    assert_tile_pairs_are_grouped(torch.device("cuda"), rng)


def test_kth_of_rows_kernel_is_its_reference_on_the_hardware(rng):
    """Each row's smallest and k-th strip minimum by ``row_kth.kth_of_rows``'s kernel equals a
    sort's, on the adversarial rows of ``test_fused.py`` and on the 200k × 128 graph's seeds by
    rows (200,000 rows of 1,024 strips at k = 101)."""
    from knng.engine.kernels import row_kth
    from test_fused import assert_kth_of_rows_is_its_reference

    assert_kth_of_rows_is_its_reference(torch.device("cuda"), rng)
    keys = torch.randn((200_000, 1024), device="cuda").round(decimals=2)  # ties
    for got, want in zip(row_kth.kth_of_rows(keys, 101), row_kth.kth_of_rows_reference(keys, 101)):
        assert torch.equal(got, want)


def test_row_selection_is_its_reference_on_the_hardware():
    """Each row's first and k-th key code by the selection kernels (``row_kth``) equals the
    sort's, on the adversarial cases of ``test_row_kth.py``, on a search's scale (10k rows, 25M
    pairs, k = 2,048) and a graph's (1M rows of about 20 pairs, k = 10), keys with many ties."""
    from knng.engine.kernels import row_kth
    from test_row_kth import assert_kernels_are_reference, assert_row_slots_are_permutations

    assert assert_kernels_are_reference(torch.device("cuda")) == 8
    assert assert_row_slots_are_permutations(torch.device("cuda")) == 8
    g = torch.Generator(device="cuda").manual_seed(3)
    rows = torch.randint(0, 10_000, (25_000_000,), device="cuda", generator=g)
    keys = torch.randn(25_000_000, device="cuda", generator=g) * 100.0 + 5e3
    keys[::3] = keys[::3].round()
    got = row_kth.row_ends(rows, keys, 10_000, 2048)
    want = row_kth.row_ends_reference(rows, keys, 10_000, 2048)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert int((got[2] >= 2048).sum()) == 10_000
    # A graph's held survivors: 1M rows of ~20 pairs (sorted in registers), some of 64 and 65
    # (either side of the register sort's width), a few of thousands (the radix select), k = 10.
    rows = torch.cat([torch.randint(0, 1_000_000, (20_000_000,), device="cuda", generator=g),
                      torch.arange(0, 1_000_000, 99_991, device="cuda").repeat_interleave(3_000),
                      torch.full((row_kth.SMALL_WIDTH,), 7, device="cuda"),
                      torch.full((row_kth.SMALL_WIDTH + 1,), 8, device="cuda")])
    keys = (torch.randn(rows.numel(), device="cuda", generator=g) * 4.0).round()  # ties
    rows[rows == 7], rows[rows == 8] = -1, -1  # rows 7 and 8: only the lists above
    rows[-2 * row_kth.SMALL_WIDTH - 1:-row_kth.SMALL_WIDTH - 1] = 7
    rows[-row_kth.SMALL_WIDTH - 1:] = 8
    keep = rows >= 0
    rows, keys = rows[keep], keys[keep]
    got = row_kth.row_ends(rows, keys, 1_000_000, 10)
    want = row_kth.row_ends_reference(rows, keys, 1_000_000, 10)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[2][7] == row_kth.SMALL_WIDTH and got[2][8] == row_kth.SMALL_WIDTH + 1



def test_row_order_is_its_reference_on_the_hardware():
    """Each row's first k by (distance, index) (``row_order``: ranked by the kernel in narrow rows,
    one sort and the ties again in wider ones, by the sort kernel up to its widest rows) equals
    the two stable sorts, on the adversarial cases of ``test_row_order.py``, on a graph's finish
    (200,000 rows of up to 32 and 40 candidates, k = 10, distances with ties), on a rows-method
    graph's (65,536 rows of 153, k = 101) and on rows of 33 to 512 with and without ties."""
    from knng.engine.kernels import row_order
    from test_row_order import assert_kernel_is_reference

    assert assert_kernel_is_reference(torch.device("cuda"), wide=True) == 43
    g = torch.Generator(device="cuda").manual_seed(4)
    for width in (row_order.MAX_WIDTH, 40):  # ranked, then sorted by the sort kernel
        idx = torch.randint(0, 200_000, (200_000, width), device="cuda", generator=g)
        dist = (torch.rand((200_000, width), device="cuda", generator=g, dtype=torch.float64) * 50).round(decimals=1)
        idx[torch.rand(idx.shape, device="cuda", generator=g) < 0.15] = -1
        assert row_order.row_order_runs(idx) == (width <= row_order.MAX_WIDTH)
        got = row_order.top_by_distance(idx, dist, 10)
        want = row_order.top_by_distance_reference(idx, dist, 10)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    idx = torch.randint(0, 200_000, (65_536, 153), device="cuda", generator=g)
    dist = (torch.rand((65_536, 153), device="cuda", generator=g, dtype=torch.float64) * 1e3).round(decimals=1)
    idx[torch.rand(idx.shape, device="cuda", generator=g) < 0.15] = -1
    assert not row_order.row_order_runs(idx) and row_order.row_sort_runs(idx, 101)
    got = row_order.top_by_distance(idx, dist, 101)
    want = row_order.top_by_distance_reference(idx, dist, 101)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # the sort kernel at every width it takes, rows without ties and with many
    for width, k, decimals in ((33, 10, 6), (256, 101, 6), (300, 101, 1), (512, 256, 9)):
        idx = torch.randint(0, 200_000, (4_096, width), device="cuda", generator=g)
        dist = (torch.rand((4_096, width), device="cuda", generator=g, dtype=torch.float64) * 1e3).round(
            decimals=decimals)
        idx[torch.rand(idx.shape, device="cuda", generator=g) < 0.15] = -1
        assert row_order.row_sort_runs(idx, k)
        got = row_order.top_by_distance(idx, dist, k)
        want = row_order.top_by_distance_reference(idx, dist, k)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (width, k)

@pytest.mark.parametrize("precision", ["tf32", "tf32x3", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1000, 4099, 128), (3, 70000, 20)])
def test_column_terms_in_the_product_epilogue(precision, shape, seed, set_options):
    """``block_scores`` with the column terms as the product's bias (``Options.gemm_column_terms``) keeps
    the screen's contract: every key within the bound of the float64 score, and (the same product,
    the same single float32 rounding of each term) equal to the product plus a separate
    addition, or one float32 rounding from it where cuBLAS picks another algorithm."""
    from knng.engine import screen

    m, n, d = shape
    g = _gen(seed)
    x = torch.randn((m, d), generator=g, device="cuda", dtype=torch.float64) * 3 + 5
    y = torch.randn((n, d), generator=g, device="cuda", dtype=torch.float64) * 3 + 5
    a, a64 = _prepare(x, "sqeuclidean", precision, "query", False)
    b, b64 = _prepare(y, "sqeuclidean", precision, "corpus", False)
    terms = b64.terms.to(torch.float32)
    p = PRECISIONS[precision]
    fused_keys = screen.block_scores(a.vectors, b.vectors, d, p, col_terms=terms)
    set_options(gemm_column_terms=False)
    separate = screen.block_scores(a.vectors, b.vectors, d, p, col_terms=terms)
    exact = a64.vectors[:, :d] @ b64.vectors[:, :d].T + b64.terms[None, :]
    bound = get_metric("sqeuclidean").pair_bound(d, a.norms[:, None], b.norms[None, :], None,
                                                 b64.terms[None, :], precision=p)
    assert bool(((fused_keys.double() - exact).abs() <= bound).all())
    step = torch.finfo(torch.float32).eps * separate.abs().clamp_min(torch.finfo(torch.float32).tiny)
    assert bool(((fused_keys - separate).abs() <= step).all())


def test_blocks_sized_later_keep_the_pairs_of_blocks_sized_at_once(seed):
    """Screens launched with ``later`` (their counters copied to pinned memory right behind each
    launch) and sized afterwards, out of order and one of them overflowing its first list, keep
    the pairs the same screens keep when sized at once (as sets: atomics order the lists)."""
    from knng.metrics import scaled_row_factors, scaled_scales, scaled_width

    g = _gen(seed)
    metric = get_metric("sqeuclidean")
    x = torch.randn((3000, 64), device="cuda", generator=g, dtype=torch.float64)
    qa = metric.prepare(x, None, side="query", symmetric=True, dtype=torch.float16)
    ca = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)
    rt, ct = qa.terms.float(), ca.terms.float()
    k = scaled_width(64)
    keys = (qa.vectors[:, :k].double() @ ca.vectors[:, :k].double().T)
    keys = keys * scaled_row_factors(qa.vectors).double()[:, None] * scaled_scales(ca.vectors).double()[None, :]
    keys = keys + ct.double()[None, :] + rt.double()[:, None]
    thresholds = [keys.kthvalue(q, dim=1).values.float() for q in (5, 40, 2000)]

    def pairs(found):
        return sorted(zip(found.owner.tolist(), found.other.tolist(), found.keys.tolist()))

    later = [fused.screen_block(qa.vectors, ca.vectors, 64, t, t, rt, ct, "float16", capacity_hint=64, later=True)
             for t in thresholds]
    for t, sized in reversed(list(zip(thresholds, later))):
        got = sized()
        want = fused.screen_block(qa.vectors, ca.vectors, 64, t, t, rt, ct, "float16")
        assert pairs(got[0]) == pairs(want[0]) and pairs(got[1]) == pairs(want[1])


def _use_float16_kernel(kernel: str, d: int, set_options) -> None:
    """Screens of K = ``d`` run on ``kernel`` ("wgmma", "mma.sync", "triton"; "tf32" leaves them
    as they are), or the test skips where it cannot run."""
    from knng.engine.kernels import cuda_screen

    if kernel in ("wgmma", "mma.sync") and not kernels.cuda_screen_runs(torch.device("cuda")):
        pytest.skip("needs CuPy for the CUDA C screen")
    if kernel == "wgmma" and (d > cuda_screen.WGMMA_MAX_K
                              or not cuda_screen.choose_config(d, False, torch.cuda.current_device()).startswith("wg")):
        pytest.skip("the wgmma kernel runs on compute capability 9.0, K <= 256")
    set_options(wgmma=kernel == "wgmma")
    set_options(cuda_screen=kernel != "triton")


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("kernel", ["wgmma", "mma.sync", "triton", "tf32"])
def test_integer_products_are_exact_on_the_hardware(d, kernel, seed, set_options):
    """What ``knng.metrics.with_exact_products`` relies on: float16 tensor cores multiply integer
    rows and add the products in float32 without an error while |sums| stay below 2²⁴, in
    whatever order and alignment they add. Rows of ±255 (every product the largest, sums up to
    d·255² = 16,646,400 at d = 256), with odd entries among them so that a sum near the limit
    must keep its last bit, and random integers of [−255, 255]; every key (no terms, no
    threshold) equals −2·aᵀb computed exactly. ``tf32``: the TF32 products of the float16
    values that seed a float16 screen's thresholds (``common.TF32_EXACT_SAMPLES``)."""
    from knng.engine.common import full_precision, tf32_products
    from knng.metrics import scaled_row_factors, scaled_scales, scaled_width

    _use_float16_kernel(kernel, d, set_options)
    g = _gen(seed)

    def rows(m: int) -> torch.Tensor:
        x = torch.where(torch.rand((m, d), generator=g, device="cuda") < 0.5, -255.0, 255.0).double()
        x[::3, ::5] = 1.0
        x[1::4, ::7] = 0.0
        x[2::5] = 255.0
        x[3::6] = torch.randint(-255, 256, (x[3::6].shape[0], d), generator=g, device="cuda").double()
        return x

    metric = get_metric("sqeuclidean")
    a64, b64 = rows(1100), rows(3000)
    a = metric.prepare(a64, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    b = metric.prepare(b64, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    exact = -2.0 * (a64 @ b64.T)  # integers below 2⁵³: exact
    if kernel == "tf32":
        k = scaled_width(d)
        with full_precision(), tf32_products():
            products = a[:, :k].float() @ b[:, :k].float().T
        keys = products.double() * scaled_row_factors(a).double()[:, None] * scaled_scales(b).double()[None, :]
    else:
        keys = _kernel_keys(a, b, d, "float16")
    wrong = (keys != exact).sum().item()
    assert wrong == 0, f"{wrong} of {exact.numel()} integer products not exact ({kernel}, d = {d})"


@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("kernel", ["wgmma", "mma.sync", "triton"])
def test_grey_level_keys_are_within_the_exact_bound_on_the_hardware(d, kernel, seed, set_options):
    """Rows on the lattice of unit fl(1/255) (grey levels divided by 255): the stored values are
    integer numbers of units, their products exact, the scalings by scales that are not powers of
    two round, and each input sits a little off its lattice point; every key of each kernel within
    the bound of exact products (``Metric._exact_coefficients``) of the true score."""
    from dataclasses import replace

    from knng.engine.common import LATTICE_UNITS
    from knng.metrics import with_exact_products

    _use_float16_kernel(kernel, d, set_options)
    g = _gen(seed)
    grey = LATTICE_UNITS[1]
    metric = replace(get_metric("sqeuclidean"), lattice=grey)

    def rows(m: int):
        h = torch.randint(-255, 256, (m, d), generator=g, device="cuda").double()
        h[::4] = torch.where(h[::4] >= 0, 255.0, -255.0)
        x = (h / 255.0).float().double()
        return x, metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)

    (a64, pa), (b64, pb) = rows(1100), rows(3000)
    error = max(float((x - torch.round(x / grey) * grey).abs().max()) for x in (a64, b64))
    precision = with_exact_products(PRECISIONS["float16"], torch.full((d,), 255.0), error, grey)
    assert precision.exact_products
    true = -2.0 * (a64 @ b64.T)
    bound = metric.pair_bound(d, pa.norms[:, None], pb.norms[None, :], None, None, precision=precision)
    keys = _kernel_keys(pa.vectors, pb.vectors, d, "float16")
    ratio = float(((keys - true).abs() / bound).max())
    assert ratio <= 1.0, f"|key − score| / E = {ratio} ({kernel}, d = {d})"


def test_graph_of_grey_levels_divided_by_255(seed, set_options):
    """Image patches as float32 grey levels / 255 (``img_as_float32``): screened with exact products
    on the lattice of unit fl(1/255), exact, and with no near-ties left to evaluate at the median row."""

    set_options(screen_precision="float16")
    set_options(graph_rows_min_k=10**9)  # symmetric: the rows method is a search (float16 bound)
    set_options(graph_rows_tiles_first=False)  # (nor by rows where its tiles go first)
    rng = np.random.default_rng(seed)
    pixels = smooth_image_patches(rng, 80_000)
    grey = torch.from_numpy((pixels / 255.0).astype(np.float32)).cuda()
    res = [knng.graph(grey, k) for k in (10, 100)]
    rep = last_report()
    assert rep.exact_products
    _check(grey, grey, res, exclude_self=True, rows=torch.arange(0, 80_000, 97, device="cuda"))
    assert rep.evaluations_per_row["median"] == 100, rep.evaluations_per_row
