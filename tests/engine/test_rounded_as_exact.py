"""Distances rounded to float32 as their exact values round (knng.engine.exact).

The exact value of a pair is computed here with Python fractions, independently of the module's
integer scaling, and its float32 rounding decided from the squares of float32 midpoints.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import knng
from knng._inputs import as_input
from knng.engine import stages
from knng.engine.exact import near_midpoints, round_as_exact
from knng.metrics import get_metric
from oracle import assert_exact, oracle_graph


def _exact_square(x: np.ndarray, y: np.ndarray) -> Fraction:
    return sum(((Fraction(float(a)) - Fraction(float(b))) ** 2 for a, b in zip(x, y)), Fraction(0))


def _float32_of(value: Fraction, root: bool) -> np.float32:
    """IEEE's float32 of ``value`` (of its square root with ``root``): the float32 whose rounding
    interval holds it, ties to the even significand."""
    if value == 0:
        return np.float32(0.0)
    guess = np.float32(np.sqrt(float(value)) if root else float(value))
    for f in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))):
        lo = (Fraction(float(f)) + Fraction(float(np.nextafter(f, np.float32(-np.inf))))) / 2
        hi = (Fraction(float(f)) + Fraction(float(np.nextafter(f, np.float32(np.inf))))) / 2
        lo, hi = (lo * lo, hi * hi) if root else (lo, hi)
        if lo < value < hi or ((value == lo or value == hi) and int(np.float32(f).view(np.int32)) % 2 == 0):
            return f
    raise AssertionError(f"no float32 found for {value}")


def _rounded(metric: str, data, pairs: np.ndarray, dist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer of ``pairs`` (row i's columns) at float64 distances ``dist``, ordered by
    distance, after :func:`round_as_exact` (rows given as None: the data's first rows, as the
    API passes them; the tests below give rows by id)."""
    order = torch.argsort(dist, dim=1, stable=True)
    idx, dist = torch.from_numpy(pairs).gather(1, order), dist.gather(1, order)
    round_as_exact(get_metric(metric), data, None, data, idx, dist)
    return idx, dist


def _grey_flat_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    """Flat patches of grey levels / 255: pairs 4·|Δ| apart, which can be float32 midpoints."""
    levels = rng.integers(0, 256, size=(n, 1))
    return np.repeat(levels / 255, d, axis=1).astype(np.float32)


@pytest.mark.parametrize("d", [1, 16, 960])
def test_near_midpoints_flags_every_value_within_the_tolerance(rng, d):
    """Values at random offsets from float32 midpoints (of magnitudes from 10⁻³⁰ to 10³⁰, the
    offsets up to 1.3 tolerances, and exactly one tolerance away): every value within the
    tolerance 2·γ_{d+8}·|value| of its nearest midpoint is flagged, and none beyond 1.0625 of it
    and an ulp (the widened interval whose float64 ends are rounded); infinities and NaN never."""
    count = 20_000
    v32 = torch.from_numpy((rng.random(count) * 10.0 ** rng.integers(-30, 30, count)).astype(np.float32))
    mid = (v32.double() + torch.nextafter(v32, torch.full_like(v32, torch.inf)).double()) / 2
    tol = 4.0 * (d + 8) * 2.0**-53 * mid.abs()
    offsets = torch.from_numpy(rng.uniform(-1.3, 1.3, count)) * tol
    dist = torch.cat([mid + offsets, mid + tol, mid - tol, mid])
    centre = torch.cat([mid, mid, mid, mid])
    gap = (dist - centre).abs()
    flagged = near_midpoints(dist, d)
    within = gap <= 4.0 * (d + 8) * 2.0**-53 * dist.abs()
    assert bool(flagged[within].all()), int((within & ~flagged).sum())
    beyond = gap > 4.0 * (d + 8) * 2.0**-53 * dist.abs() * (1 + 1 / 16) + 2.0**-52 * dist.abs()
    # Another midpoint may lie within the tolerance of a value only where float32's spacing is
    # that small: subnormal float32 values, which the magnitudes above reach.
    normal = dist.abs() > 1e-37
    assert not bool(flagged[beyond & normal].any()), int((flagged & beyond & normal).sum())
    assert not near_midpoints(torch.tensor([torch.inf, -torch.inf, torch.nan], dtype=torch.float64), d).any()


def test_a_flat_pair_on_a_float32_midpoint_rounds_to_even():
    # 0.16470589 and 0.04705882 (grey levels 42 and 12, float32) lie 4·Δ = 0.47058825194835663
    # apart: exactly the midpoint of 0.47058824 and 0.47058827; IEEE takes the even one.
    x = np.repeat(np.array([[42 / 255], [12 / 255]], dtype=np.float32), 16, axis=1)
    exact = _exact_square(x[0], x[1])
    want = _float32_of(exact, root=True)
    for value in (0.4705882519483566, 0.47058825194835663, 0.4705882519483567):  # sums in other orders
        idx = torch.tensor([[1]])
        dist = torch.tensor([[value]], dtype=torch.float64)
        assert bool(near_midpoints(dist, 16).all())
        data = as_input(x, "data")
        round_as_exact(get_metric("euclidean"), data, torch.tensor([0]), data, idx, dist)
        assert np.float32(dist.item()) == want, (value, dist.item(), want)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_values_near_midpoints_take_their_exact_side(rng, metric, dtype):
    # Pairs of random rows whose float64 distance is moved onto (or a step beside) the float32
    # midpoint nearest it: whatever the float64 value, the float32 is the exact value's.
    m, d = 40, int(rng.integers(1, 40))
    x = rng.standard_normal((m, d)).astype(dtype)
    x[m // 2:] = np.round(x[m // 2:] * 8) / 8  # values on a lattice: exact midpoints happen
    pairs = rng.integers(0, m, size=(m, 3))
    data = as_input(x, "data")
    exact = [[_exact_square(x[i], x[j]) for j in row] for i, row in enumerate(pairs)]
    root = metric == "euclidean"
    for shift in (-1, 0, 1):
        dist = torch.tensor([[float(np.sqrt(float(e))) if root else float(e) for e in row] for row in exact],
                            dtype=torch.float64)
        # Move every value onto its float32 midpoint, then `shift` float64 steps beside it.
        v32 = dist.to(torch.float32)
        mid = (v32.double() + torch.nextafter(v32, torch.full_like(v32, torch.inf)).double()) / 2
        for _ in range(abs(shift)):
            mid = torch.nextafter(mid, torch.full_like(mid, np.inf * shift))
        near = (dist - mid).abs() <= 4.0 * (d + 8) * 2.0**-53 * dist.abs()
        dist = torch.where(near, mid, dist)
        idx, dist = _rounded(metric, data, pairs, dist)
        for i in range(m):
            for slot in range(3):
                j = int(idx[i, slot])
                want = _float32_of(_exact_square(x[i], x[j]), root)
                assert np.float32(dist[i, slot].item()) == want, (shift, i, j, dist[i, slot].item(), want)
        assert bool((dist[:, 1:] >= dist[:, :-1]).all())


def test_the_kernel_and_the_cpu_sum_give_one_graph_on_grey_levels(rng, set_options):
    # The pair kernel (run by the Triton interpreter here) and torch's CPU sum add the squares in
    # other orders; flat grey patches sit on float32 midpoints; both now return IEEE's float32.
    x = np.concatenate([_grey_flat_rows(rng, 60, 16), (rng.integers(0, 256, (140, 16)) / 255).astype(np.float32)])
    with knng.options(screen_precision="float16"):
        reference = knng.graph(x, 8, device="cpu")
    set_options(screen_precision="float16", kernels={"triton": True})
    by_kernel = knng.graph(x, 8, device="cpu")
    np.testing.assert_array_equal(by_kernel.indices, reference.indices)
    np.testing.assert_array_equal(by_kernel.distances, reference.distances)
    assert_exact(reference, oracle_graph(x, 8))
    for i in range(0, 60, 7):  # the flat rows' distances are IEEE's float32 of the exact ones
        for slot in range(8):
            j = int(reference.indices[i, slot])
            assert reference.distances[i, slot] == _float32_of(_exact_square(x[i], x[j]), root=True)


def test_other_metrics_and_far_values_are_left_alone():
    x = np.eye(3, dtype=np.float32)
    data = as_input(x, "data")
    idx = torch.tensor([[1, 2]])
    dist = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    before = dist.clone()
    round_as_exact(get_metric("cosine"), data, torch.tensor([0]), data, idx, dist)
    round_as_exact(get_metric("euclidean"), data, torch.tensor([0]), data, idx, dist)  # 1.0 is a float32
    assert torch.equal(dist, before)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_differences_float64_rounds_are_settled_by_rationals(metric):
    # 1 − 1e-30 (float32 inputs) is no float64: the differences round, and the pair is settled
    # by exact rationals instead of the float64 products' exact sum.
    x = np.array([[1.0, 1e-30, 3.0], [1e-30, 1.0, 3.0]], dtype=np.float32)
    data = as_input(x, "data")
    exact = _exact_square(x[0], x[1])
    root = metric == "euclidean"
    want = _float32_of(exact, root)
    value = float(np.sqrt(float(exact))) if root else float(exact)
    v32 = np.float32(value)
    mid = (float(v32) + float(np.nextafter(v32, np.float32(np.inf)))) / 2
    dist = torch.tensor([[mid]], dtype=torch.float64)  # an evaluation on the midpoint
    with stages.recording() as counts:
        round_as_exact(get_metric(metric), data, torch.tensor([0]), data, torch.tensor([[1]]), dist)
    assert np.float32(dist.item()) == want
    assert counts["finish.midpoints_by_rationals"] == 1, counts


def test_an_integer_distance_on_a_midpoint_goes_to_the_even_float32():
    # 4096² + 1 = 2²⁴ + 1 lies between the float32 values 2²⁴ and 2²⁴ + 2: IEEE takes 2²⁴.
    x = np.array([[4096, 1], [0, 0]], dtype=np.float32)
    data = as_input(x, "data")
    dist = torch.tensor([[16777217.0]], dtype=torch.float64)
    round_as_exact(get_metric("sqeuclidean"), data, torch.tensor([0]), data, torch.tensor([[1]]), dist)
    assert np.float32(dist.item()) == np.float32(16777216.0)
    g = knng.graph(x, 1, metric="sqeuclidean", device="cpu")
    assert g.distances[0, 0] == np.float32(16777216.0)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_photon_counts_of_many_pixels(rng, metric):
    # Integer counts over 3,000 pixels (the papers' images have 15,876): values moved onto their
    # float32 midpoints are settled in double-double arithmetic, exact midpoints on the host.
    m, d = 10, 3000
    x = rng.poisson(3.0, size=(m, d)).astype(np.float32)
    pairs = (np.arange(m)[:, None] + np.arange(1, 4)[None, :]) % m
    data = as_input(x, "data")
    root = metric == "euclidean"
    # Integer counts: the squares' sum is an integer, exact in float64 (so is the oracle here).
    exact = {(i, int(j)): Fraction(int(((x[i].astype(np.int64) - x[j].astype(np.int64)) ** 2).sum()))
             for i, row in enumerate(pairs) for j in row}
    dist = torch.tensor([[float(np.sqrt(float(exact[i, int(j)]))) if root else float(exact[i, int(j)]) for j in row]
                         for i, row in enumerate(pairs)], dtype=torch.float64)
    v32 = dist.to(torch.float32)
    mid = (v32.double() + torch.nextafter(v32, torch.full_like(v32, torch.inf)).double()) / 2
    dist = torch.where(torch.arange(3)[None, :] == 1, mid, dist)  # every middle entry on a midpoint
    idx, dist = _rounded(metric, data, pairs, dist)
    for i in range(m):
        for slot in range(3):
            j = int(idx[i, slot])
            assert np.float32(dist[i, slot].item()) == _float32_of(exact[i, j], root), (i, j)
        assert bool((dist[i, 1:] >= dist[i, :-1]).all())


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_exact_midpoints_of_grey_levels_are_decided_without_rationals(rng, metric):
    """Flat grey patches (levels / 255, float32; integer counts above 2²⁴ for squared distances)
    whose distance lies exactly on a float32 midpoint: every step of the double-double sum is
    error-free there, so the pair is decided on its device, as exactly as the host's rationals
    decide it (which are not asked)."""
    if metric == "euclidean":
        x = _grey_flat_rows(rng, 400, 16)
        x[200:] += rng.integers(-3, 4, size=(200, 16)).astype(np.float32) / 255  # textured rows too
    else:  # odd squared distances above 2²⁴ lie on float32 midpoints
        x = rng.integers(0, 2000, size=(400, 16)).astype(np.float32)
    data = as_input(x, "data")
    pairs = (np.arange(400)[:, None] + np.arange(1, 9)[None, :]) % 400
    exact = [[_exact_square(x[i], x[j]) for j in row] for i, row in enumerate(pairs)]
    root = metric == "euclidean"
    want = np.array([[_float32_of(e, root) for e in row] for row in exact])
    dist = torch.tensor([[float(np.sqrt(float(e))) if root else float(e) for e in row] for row in exact],
                        dtype=torch.float64)
    v32 = dist.to(torch.float32)
    mid = (v32.double() + torch.nextafter(v32, torch.full_like(v32, torch.inf)).double()) / 2
    on_midpoint = torch.tensor([[(Fraction(float(m)) ** 2 if root else Fraction(float(m))) == e
                                 for m, e in zip(mrow, erow)] for mrow, erow in zip(mid.tolist(), exact)])
    assert int(on_midpoint.sum()) > 0  # the data hold exact midpoints
    dist = torch.where(torch.arange(8)[None, :] % 2 == 0, mid, dist)  # half the entries moved onto a midpoint
    with stages.recording() as counts:
        idx, dist = _rounded(metric, data, pairs, dist)
    assert counts["finish.midpoints"] >= 400 and counts["finish.midpoints_by_rationals"] == 0, counts
    got = {(i, int(j)): np.float32(v) for i in range(400) for j, v in zip(idx[i].tolist(), dist[i].tolist())}
    for i, row in enumerate(pairs):
        for j, w in zip(row, want[i]):
            assert got[i, int(j)] == w, (i, int(j), got[i, int(j)], w)
