"""The digit screen (``int8x4``): its digits, its integer products and its bound.

Each prepared vector is stored as int8 digits of its own scale, v ≈ s·(h + l/254); the four
integer products are exact and the float32 scaling after them is counted in
``Metric.bound_coefficients``, which multiplies the *bound norms* digit rows come with. The engine's exactness with this screen is tested by every test
that takes the ``screen`` fixture (conftest); here are its parts, on adversarial inputs: values
at the digits' rounding midpoints, single-spike vectors (the largest value is the whole norm,
the bound's worst case), tiny values below the smallest normal float32 scale, huge norms, zero
vectors, dimensions that are not multiples of the digit blocks' alignment.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from knng.engine.screen import _integer_products, block_scores, digit_scores
from knng.metrics import (DIGIT_BASE, DIGIT_MAX, DIGIT_REFERENCE_ERROR, FLUSH, PRECISIONS, digit_alphas,
                          digit_blocks, digit_scales, get_metric)
from oracle import METRICS

# The screen's arithmetic on duplicate-heavy integer data: every row reaches the engine.
pytestmark = pytest.mark.unfolded

DIGITS = PRECISIONS["int8x4"]


def _digit_data(rng: np.random.Generator, kind: str, m: int, d: int) -> np.ndarray:
    if kind == "gauss":
        return rng.standard_normal((m, d))
    if kind == "offset":  # far from the origin: centring first
        return 1e4 + rng.standard_normal((m, d))
    if kind == "spike":  # one value carries the whole norm: max|v| = ‖v‖
        x = np.zeros((m, d))
        x[np.arange(m), rng.integers(0, d, m)] = rng.uniform(0.5, 2.0, m) * rng.choice([-1, 1], m)
        return x
    if kind == "midpoints":  # every value at a rounding midpoint of its hi or lo digit
        scale = rng.uniform(0.5, 2.0, (m, 1))
        hi = rng.integers(-126, 127, (m, d))
        lo = rng.integers(-126, 127, (m, d)) + 0.5
        x = scale * (hi + np.where(rng.random((m, d)) < 0.5, 0.5, lo / DIGIT_BASE))
        x[:, 0] = DIGIT_MAX * scale[:, 0]  # the row's maximum sets s = scale
        return x
    if kind == "tiny":  # below the smallest normal float32 scale
        return 1e-40 * rng.standard_normal((m, d))
    if kind == "huge":
        return 1e15 * rng.standard_normal((m, d))
    if kind == "zeros":
        x = rng.standard_normal((m, d))
        x[::3] = 0.0
        return x
    if kind == "integers":  # pixels: many exact ties
        return rng.integers(0, 4, (m, d)).astype(np.float64)
    raise ValueError(kind)


KINDS = ["gauss", "offset", "spike", "midpoints", "tiny", "huge", "zeros", "integers"]


def _decoded(rows: torch.Tensor, d: int) -> torch.Tensor:
    """The float64 values s·(h + l/B) of prepared digit rows."""
    w = digit_blocks(rows)
    h, lo = rows[:, :d].to(torch.float64), rows[:, w:w + d].to(torch.float64)
    return digit_scales(rows).to(torch.float64)[:, None] * (h + lo / DIGIT_BASE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("d", [1, 13, 64, 200])
def test_digits_reconstruct_within_their_error(kind, d, rng, seed):
    x = torch.from_numpy(_digit_data(rng, kind, 50, d))
    metric = get_metric("sqeuclidean")
    prep = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.int8)
    rows = prep.vectors
    w = digit_blocks(rows)
    assert rows.dtype == torch.int8 and rows.shape[1] == 3 * w + 16 and w % 16 == 0 and w >= d
    assert torch.equal(rows[:, :w], rows[:, 2 * w:3 * w]), "the third block repeats h"
    assert rows[:, :3 * w].abs().max() <= DIGIT_MAX
    assert bool((rows[:, d:w] == 0).all()) and bool((rows[:, w + d:2 * w] == 0).all()), "padding must be zero"
    assert bool((digit_alphas(rows) == metric.alpha).all())
    s = digit_scales(rows).to(torch.float64)
    assert bool((s >= FLUSH).all())
    err = (x - _decoded(rows, d)).abs()
    per_value = s[:, None] * (1.0 / (2 * DIGIT_BASE) + 2.0**-45)
    assert bool((err <= per_value).all()), f"seed={seed}: a digit errs by more than s/(2B)"
    # The relative error the bound assumes (max|v| ≤ ‖v‖), absolute below the smallest scale.
    rho = math.sqrt(d) * (1.0 / (2 * DIGIT_BASE * DIGIT_MAX) + 2.0**-45 / DIGIT_MAX) * (1 + 2.0**-23)
    norms = torch.linalg.vector_norm(x, dim=1)
    # The norms a digit row comes with are the bound's: at least ‖v‖ plus its error over r₀.
    own_error = torch.linalg.vector_norm(x - _decoded(rows, d), dim=1)
    assert bool((prep.norms >= norms + own_error / DIGIT_REFERENCE_ERROR).all())
    assert bool((torch.linalg.vector_norm(x - _decoded(rows, d), dim=1)
                 <= rho * norms * (1 + 1e-12) + math.sqrt(d) * FLUSH).all())
    # Rows with no value above the smallest scale's range are the only ones it does not fit.
    fitted = norms > 0
    if kind != "tiny":
        top = x.abs().amax(dim=1)
        assert bool((s[fitted] <= top[fitted] / DIGIT_MAX * (1 + 2.0**-22)).all()), "scales as small as they can be"


@pytest.mark.parametrize("kind", KINDS)
def test_digits_are_the_rounded_quotients(kind, rng, seed):
    # An independent statement of the digits, in NumPy: h = round(x / s), l = round(254 (x / s − h)),
    # halves to even, for the row's float32 scale s; the prepared rows must hold exactly these.
    d = 29
    x = _digit_data(rng, kind, 60, d)
    rows = get_metric("sqeuclidean").prepare(torch.from_numpy(x), None, side="corpus", symmetric=False,
                                             dtype=torch.int8).vectors
    s = digit_scales(rows).to(torch.float64).numpy()[:, None]
    t = x / s
    hi = np.round(t)
    lo = np.round((t - hi) * DIGIT_BASE)
    w = digit_blocks(rows)
    assert np.array_equal(rows[:, :d].numpy(), hi) and np.array_equal(rows[:, w:w + d].numpy(), lo)


def test_integer_products_are_exact(rng):
    for m, k, n in [(1, 8, 1), (17, 24, 33), (300, 136, 250)]:
        a = torch.from_numpy(rng.choice([-127, -126, 0, 126, 127], (m, k))).to(torch.int8)
        b = torch.from_numpy(rng.choice([-127, -1, 1, 127], (n, k))).to(torch.int8)
        got = _integer_products(a, b).to(torch.float64)
        assert torch.equal(got, a.to(torch.float64) @ b.to(torch.float64).T)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("kind,d", [("gauss", 16), ("gauss", 1024), ("offset", 64), ("spike", 32), ("midpoints", 100),
                                    ("tiny", 8), ("huge", 50), ("zeros", 20), ("integers", 64)])
def test_digit_screen_within_pair_bound(metric, symmetric, kind, d, rng, seed):
    mt = get_metric(metric)
    q = _digit_data(rng, kind, 24, d)
    c = _digit_data(rng, kind, 40, d)
    if symmetric:
        c = np.concatenate([q, c])
        q = c
    qt, ct = torch.from_numpy(q), torch.from_numpy(c)
    centre = ct.mean(0) if mt.needs_centre(symmetric) else None
    side = "corpus" if symmetric else "query"
    p8 = [mt.prepare(t, centre, side=s, symmetric=symmetric, dtype=torch.int8) for t, s in ((qt, side), (ct, "corpus"))]
    p64 = [mt.prepare(t, centre, side=s, symmetric=symmetric, dtype=torch.float64) for t, s in ((qt, side), (ct, "corpus"))]
    rows64 = mt.query_layout(p64[0].vectors, d) if symmetric else p64[0].vectors
    exact = rows64 @ p64[1].vectors.T  # α·aᵀb + terms, float64 (the same prepared values)
    row_terms = p8[0].terms.to(torch.float32) if symmetric and p8[0].terms is not None else None
    col_terms = None if p8[1].terms is None else p8[1].terms.to(torch.float32)
    screened = block_scores(mt.query_layout(p8[0].vectors, d), p8[1].vectors, d, DIGITS, row_terms=row_terms,
                            col_terms=col_terms).to(torch.float64)
    bound = mt.pair_bound(d, p8[0].norms[:, None], p8[1].norms[None, :],
                          None if row_terms is None else p8[0].terms[:, None],
                          None if p8[1].terms is None else p8[1].terms[None, :], precision=DIGITS)
    # float64 products of the prepared values err by ~d·2⁻⁵³ relative, far inside the bound.
    err = (screened - exact).abs()
    worst = float((err / bound).max())
    assert worst <= 1.0, f"seed={seed}: digit screen error exceeds pair_bound by ×{worst:.3g}"
    if kind == "spike" and metric in ("euclidean", "sqeuclidean"):  # the bound's own worst case
        assert worst > 1e-3, f"bound uselessly loose? ratio {worst:.3g}"


def test_digit_scores_follow_the_stated_arithmetic(rng):
    """digit_scores is the contract a kernel must meet: recompute it step by step in float32."""
    mt = get_metric("euclidean")
    x = torch.from_numpy(rng.standard_normal((30, 21)))
    rows = mt.prepare(x, x.mean(0), side="corpus", symmetric=True, dtype=torch.int8).vectors
    w = digit_blocks(rows)
    h, lo = rows[:, :w].to(torch.float64), rows[:, w:2 * w].to(torch.float64)
    hh = (h @ h.T).to(torch.float32)
    cross = (h @ lo.T + lo @ h.T).to(torch.float32)
    ll = (lo @ lo.T).to(torch.float32)
    s = digit_scales(rows)
    factor = (s.to(torch.float64) * mt.alpha / DIGIT_BASE**2).to(torch.float32)
    expected = (((hh * DIGIT_BASE + cross) * DIGIT_BASE + ll) * factor[:, None]) * s[None, :]
    assert torch.equal(digit_scores(rows, rows), expected)


# ----------------------------------------------------------------- the digit kernel, interpreted
@pytest.fixture
def interpret():
    """The digit kernel runs in Triton's interpreter (chosen at start on a machine without a GPU)."""
    pytest.importorskip("triton", reason="the kernel tests run Triton's interpreter")
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (the GPU tests run there)")


@pytest.mark.parametrize("shape", [(70, 45, 19), (33, 97, 16), (1, 40, 3), (64, 64, 40)])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("few", [0, 4, 10**6])
def test_digit_kernel_matches_its_reference(interpret, rng, shape, symmetric, few, set_options):
    """Same survivors, same keys bit for bit: the interpreter rounds each float32 step as
    digit_scores does (a GPU may fuse a multiply and an add: one rounding fewer, within the bound)."""
    from knng.engine.kernels import fused

    set_options(few_per_tile=few)
    m, n, d = shape
    mt = get_metric("sqeuclidean")
    x = torch.from_numpy(rng.standard_normal((m, d)) + 5)
    y = torch.from_numpy(rng.standard_normal((n, d)) + 5)
    y[n // 2:n // 2 + min(5, n // 4)] = y[:min(5, n // 4)]  # duplicate columns
    side = "corpus" if symmetric else "query"
    qa = mt.prepare(x, None, side=side, symmetric=symmetric, dtype=torch.int8)
    ca = mt.prepare(y, None, side="corpus", symmetric=True, dtype=torch.int8)
    rt = qa.terms.float() if symmetric else None
    ct = ca.terms.float()
    scores = block_scores(qa.vectors, ca.vectors, d, DIGITS, row_terms=rt, col_terms=ct)
    row_thr = scores.kthvalue(min(n, 4), dim=1).values
    col_thr = scores.kthvalue(min(m, 3), dim=0).values if symmetric else None
    by_row, by_col = fused.screen_block(qa.vectors, ca.vectors, d, row_thr, col_thr, rt, ct, "int8x4",
                                        capacity_hint=8)

    def expected(keep: torch.Tensor) -> set:
        r, c = torch.nonzero(keep, as_tuple=True)
        return set(zip(r.tolist(), c.tolist(), scores[r, c].tolist()))

    got = set(zip(by_row.owner.tolist(), by_row.other.tolist(), by_row.keys.tolist()))
    assert got == expected(scores <= row_thr[:, None])
    if symmetric:
        got = set(zip(by_col.other.tolist(), by_col.owner.tolist(), by_col.keys.tolist()))
        assert got == expected(scores <= col_thr[None, :])


@pytest.mark.parametrize("task", ["search", "graph"])
def test_engine_with_the_interpreted_digit_kernel(interpret, rng, task, set_options):
    import knng
    from knng.api import last_report
    from oracle import assert_exact, oracle_graph, oracle_search, smooth_image_patches

    set_options(kernels={"triton": True})
    set_options(screen_precision="int8x4")
    set_options(cpu_max_part=64)  # several parts: off-diagonal blocks
    set_options(own_part_seed=48)
    x = smooth_image_patches(rng, 200, side=3)
    x[150:160] = x[:10]
    if task == "search":
        q = x[:37] + rng.standard_normal((37, x.shape[1])).astype(x.dtype)
        assert_exact(knng.search(q, x, 7, memory_budget="2MB"), oracle_search(q, x, 7))
    else:
        assert_exact(knng.graph(x, 5), oracle_graph(x, 5))
    assert last_report().screen_dtype == "int8x4"
    assert last_report().stages.get("screen.digits"), "the digit kernel did not run"


@pytest.mark.parametrize("kind", ["gauss", "offset", "spike", "midpoints", "huge", "integers", "zeros"])
@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "cosine", "pearson", "inner_product"])
def test_digit_search_seeds_from_a_float32_sample_bound_every_rows_kth(kind, metric, rng, seed, monkeypatch, set_options):
    # A digit search seeds its thresholds from a sample screened in float32 (one cuBLAS product
    # instead of three integer ones), with the float32 bound's radii: every seeded τᵢ must still
    # be at least the row's k-th exact key, and the search exact.
    import knng
    from knng.engine.store import CandidateStore
    from oracle import assert_exact, oracle_search

    set_options(screen_precision="int8x4")
    set_options(cpu_sample=64)  # a sample narrower than the corpus
    seeded = []
    real_seed = CandidateStore.seed

    def seed_and_record(self, rows, cols, keys, rad=None):
        assert rad is not None and keys.dtype == torch.float32, "digit seeds come from the float32 sample"
        real_seed(self, rows, cols, keys, rad)
        seeded.append((self.tau.clone(), self.errors.row_offsets.clone(), self.errors.metric))

    monkeypatch.setattr(CandidateStore, "seed", seed_and_record)
    x = _digit_data(rng, kind, 400, 24)
    q = _digit_data(rng, kind, 30, 24)
    k = 5
    oracle = oracle_search(q, x, k, metric=metric)
    assert_exact(knng.search(q, x, k, metric=metric), oracle)
    assert len(seeded) == 1
    tau, offsets, m = seeded[0]
    kth = m.from_distance(torch.from_numpy(np.asarray(oracle.distances)[:, k - 1]).to(torch.float64))
    slack = 1e-12 * (tau.abs() + offsets.abs() + kth.abs())
    assert bool((tau + offsets >= kth - slack).all()), "a seeded threshold fell below its row's k-th"
