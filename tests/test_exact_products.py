"""Exact products for integer data (``knng.metrics.with_exact_products``): when every value is an
integer and the columns' extents are small enough, scaled float16 rows hold the centred values
exactly and their float32 sums never round, so the screen's bound keeps only the terms'
roundings; grey levels divided by 255 lie on a lattice of unit fl(1/255), stored as integer
numbers of units. Checked here: the rule at its limits, the keys of the torch reference and of the
interpreted kernel against exact integer arithmetic at those limits, and graphs of integer data
(pixels, negative int8 values, huge offsets, the limit itself and just past it) against the
float64 oracle, with fewer pairs screened than the same data shifted off the integers.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import knng
from knng.engine import kernels
from knng.api import last_report
from knng.engine import screen
from knng.engine.kernels import fused
from knng._inputs import as_input
from knng.engine.common import LATTICE_UNITS, CorpusStats, corpus_stats
from knng.metrics import EXACT_SUM_LIMIT, PRECISIONS, SAFETY, UNIT_ROUNDOFF_FP32, get_metric, with_exact_products
from oracle import assert_exact, oracle_graph, smooth_image_patches

# The screen's arithmetic on duplicate-heavy integer data: every row reaches the engine.
pytestmark = pytest.mark.unfolded

F16 = PRECISIONS["float16"]


def _spread(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_exact_products_only_where_the_data_allow():
    assert with_exact_products(F16, None) is F16
    assert with_exact_products(PRECISIONS["tf32"], _spread(1.0)) is PRECISIONS["tf32"]
    patches16 = with_exact_products(F16, torch.full((256,), 255.0))  # 16×16 uint8 patches: 16,646,400 < 2²⁴
    assert patches16.exact_products and patches16.name == "float16" and patches16.scaled
    assert patches16.input_roundoff == 0.0 and patches16.accumulate_roundoff == 0.0
    assert with_exact_products(F16, _spread(2048.0)).exact_products  # float16 holds 2¹¹ exactly
    assert not with_exact_products(F16, _spread(2049.0)).exact_products
    assert with_exact_products(F16, torch.full((4,), 2047.0)).exact_products  # Σ = 16,760,836
    assert not with_exact_products(F16, torch.full((4,), 2048.0)).exact_products  # Σ = 2²⁴ exactly
    assert with_exact_products(F16, torch.zeros(3)).exact_products  # constant columns
    assert with_exact_products(patches16, None) is patches16


def test_corpus_stats_round_the_centre_only_for_exact_products():
    centre = torch.tensor([0.5, 2.4, -3.6], dtype=torch.float64)
    precision, used, unit = CorpusStats(centre, _spread(3.0, 1.0, 0.0)).screen(F16)
    assert precision.exact_products and unit == 1.0
    assert torch.equal(used, torch.tensor([0.0, 2.0, -4.0], dtype=torch.float64))
    precision, used, unit = CorpusStats(centre, None).screen(F16)
    assert precision is F16 and used is centre and unit is None
    precision, used, unit = CorpusStats(centre, _spread(3000.0, 1.0, 0.0)).screen(F16)
    assert precision is F16 and used is centre
    grey = LATTICE_UNITS[1]
    precision, used, unit = CorpusStats(centre, _spread(255.0, 9.0, 1.0), grey, 2.0**-30).screen(F16)
    assert precision.exact_products and precision.lattice_error == 2.0**-30 and unit == grey
    assert torch.equal(used, torch.round(centre / grey) * grey)
    # A lattice error that a nonzero lattice vector could not outgrow: no exact products.
    assert CorpusStats(centre, _spread(1.0, 1.0, 1.0), grey, grey).screen(F16)[0] is F16


def _stats(x: np.ndarray, block_rows: int = 64) -> CorpusStats:
    return corpus_stats(as_input(x, "data"), get_metric("euclidean"), torch.device("cpu"), symmetric=True,
                        block_rows=block_rows, integers=True)


def test_corpus_pass_finds_the_lattice(rng):
    pixels = rng.integers(0, 256, (300, 7)).astype(np.uint8)
    stats = _stats(pixels)
    assert stats.lattice == 1.0 and stats.lattice_error == 0.0
    assert torch.equal(stats.integer_spread, torch.from_numpy(pixels.max(0).astype(np.float64) - pixels.min(0)))
    grey = (pixels / 255.0).astype(np.float32)  # skimage.img_as_float32, torchvision's ToTensor
    stats = _stats(grey)
    assert stats.lattice == LATTICE_UNITS[1] and 0 < stats.lattice_error < 2.0**-23
    assert torch.equal(stats.integer_spread, torch.from_numpy(pixels.max(0).astype(np.float64) - pixels.min(0)))
    noisy = pixels + rng.uniform(-1e-5, 1e-5, pixels.shape)  # integers give or take 10⁻⁵
    stats = _stats(noisy)
    assert stats.lattice == 1.0 and 0 < stats.lattice_error <= 1e-5
    assert _stats(rng.standard_normal((300, 7))).integer_spread is None
    assert _stats(pixels + 0.5).integer_spread is None


@pytest.mark.parametrize("block_rows", [64, 3000])
def test_a_value_off_the_lattice_past_the_probe_is_found(rng, block_rows):
    """Each block's first rows are probed (LATTICE_PROBE_ROWS) before the whole block is checked:
    a value off the lattice further on still takes the lattice away."""
    late = rng.integers(0, 256, (3000, 5)).astype(np.float32)
    assert _stats(late, block_rows).lattice == 1.0
    late[2500, 3] = 0.25
    assert _stats(late, block_rows).integer_spread is None
    assert _stats(late / 255, block_rows).integer_spread is None


def test_lattice_kernel_matches_the_torch_pass(kernel_device, rng, spy):
    # The corpus pass's lattice check in one kernel read per block (on a GPU) against the torch
    # passes (probe, then float64 passes): each column's extent and the largest distance from a
    # lattice point, in units and absolutely, on integers as floats, grey levels / 255 (float32
    # and float64), integers give or take 10⁻⁵, ±0, a value far from the others, sizes that are
    # not tile multiples; data off the lattice (Gaussian, exact halves) found off it by both.
    from knng.engine import common

    pixels = rng.integers(0, 256, (301, 19)).astype(np.float64)
    pixels[5, 3], pixels[6, 3] = -0.0, 0.0
    pixels[7, 4] = 2.0**20
    cases = {"integers": pixels.astype(np.float32), "grey": (pixels / 255.0).astype(np.float32),
             "grey64": pixels / 255.0, "noisy": pixels + rng.uniform(-1e-5, 1e-5, pixels.shape),
             "gaussian": rng.standard_normal((77, 9)), "halves": pixels + 0.5}
    launches = spy(common, "lattice_extent")  # the kernels' launcher, as the corpus pass calls it
    for name, values in cases.items():
        for unit in LATTICE_UNITS:
            block = torch.from_numpy(values)
            on = common.LatticeExtent(unit, block.shape[1], kernel_device)
            on.add(block.to(kernel_device))
            with knng.options(kernels={"preparation": False}):
                ref = common.LatticeExtent(unit, block.shape[1], torch.device("cpu"))
                ref.add(block)
            found, want = on.found(), ref.found()
            assert (found is None) == (want is None), (name, unit)
            if want is not None:
                assert torch.equal(found[0].cpu(), want[0]) and found[1] == want[1], (name, unit)
                assert torch.equal(on.low.cpu(), ref.low) and torch.equal(on.high.cpu(), ref.high)
    assert len(launches) == len(cases) * len(LATTICE_UNITS)


def test_exact_bound_keeps_only_the_terms_roundings():
    metric = get_metric("sqeuclidean")
    exact = with_exact_products(F16, _spread(255.0))
    c_dot, c_term, c_flush = metric.bound_coefficients(64, precision=exact)
    assert c_dot == SAFETY * 2.0 * 4.0 * UNIT_ROUNDOFF_FP32
    c_dot16, c_term16, c_flush16 = metric.bound_coefficients(64, precision=F16)
    assert c_dot16 > 1000 * c_dot and (c_term, c_flush) == (c_term16, c_flush16)


def _limit_rows(rng: np.random.Generator, m: int, d: int) -> torch.Tensor:
    """Integer rows at the limit: ±255 everywhere (every product the largest, |sums| up to
    d·255² < 2²⁴ for d ≤ 256), some rows with odd entries of 1 and 0 among them, so that a sum
    near 2²⁴ must keep its last bit."""
    x = rng.choice([-255.0, 255.0], size=(m, d))
    x[::3, ::5] = 1.0
    x[1::4, ::7] = 0.0
    x[2::5] = 255.0
    return torch.from_numpy(x)


def _exact_keys(a64: torch.Tensor, b64: torch.Tensor) -> torch.Tensor:
    return -2.0 * (a64 @ b64.T)  # integers below 2⁵³: exact in float64


def test_lattice_error_widens_the_flush_term():
    metric = get_metric("sqeuclidean")
    exact = with_exact_products(F16, _spread(255.0), 2.0**-24, LATTICE_UNITS[1])
    c_dot, _, c_flush = metric.bound_coefficients(64, precision=exact)
    c_dot0, _, c_flush0 = metric.bound_coefficients(64, precision=with_exact_products(F16, _spread(255.0)))
    assert c_dot == c_dot0 and c_flush == pytest.approx(c_flush0 + SAFETY * 2.0 * 8.0 * 2.0 * 2.0**-24)


@pytest.mark.parametrize("d", [64, 200, 256])
def test_reference_keys_of_integer_rows_are_exact(rng, d):
    assert d * 255.0**2 < EXACT_SUM_LIMIT
    metric = get_metric("sqeuclidean")
    a64, b64 = _limit_rows(rng, 70, d), _limit_rows(rng, 90, d)
    a = metric.prepare(a64, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    b = metric.prepare(b64, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    keys = screen.block_scores(a, b, d, F16, None, None)
    assert torch.equal(keys.double(), _exact_keys(a64, b64))


@pytest.fixture
def interpret():
    from knng.engine.kernels import fused as fused_mod

    if not fused_mod.interpreting():
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")


@pytest.mark.parametrize("d", [64, 256])
def test_interpreted_kernel_keys_of_integer_rows_are_exact(interpret, rng, d):
    metric = get_metric("sqeuclidean")
    a64, b64 = _limit_rows(rng, 37, d), _limit_rows(rng, 45, d)
    a = metric.prepare(a64, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    b = metric.prepare(b64, None, side="corpus", symmetric=True, dtype=torch.float16).vectors
    inf = torch.full((37,), torch.inf)
    out, _ = fused.screen_block(a, b, d, inf, None, None, None, "float16", capacity_hint=37 * 45)
    dense = torch.full((37, 45), torch.nan, dtype=torch.float64)
    dense[out.owner.long(), out.other.long()] = out.keys.double()
    assert torch.equal(dense, _exact_keys(a64, b64))


def _grey_rows(rng: np.random.Generator, m: int, d: int):
    """The limit rows divided by 255 in float32 (grey levels as ``img_as_float32`` gives them), as
    float64, prepared on the lattice of unit fl(1/255); with the precision that certifies them
    (|h| ≤ 255 per value: Σ|h_a h_b| ≤ d·255² < 2²⁴) and their lattice error."""
    grey = LATTICE_UNITS[1]
    x = torch.from_numpy((_limit_rows(rng, m, d).numpy() / 255.0).astype(np.float32).astype(np.float64))
    error = float((x - torch.round(x / grey) * grey).abs().max())
    metric = replace(get_metric("sqeuclidean"), lattice=grey)
    prep = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)
    precision = with_exact_products(F16, torch.full((d,), 255.0), error, grey)
    assert precision.exact_products and error > 0
    return x, prep, precision, metric


@pytest.mark.parametrize("d", [64, 256])
def test_grey_level_keys_are_within_the_exact_bound(rng, d, interpret_if_available):
    """Keys of rows on the 1/255 lattice (scales not powers of two: the products' scalings round,
    each value sits a little off its lattice point) against the true scores, within the bound of
    exact products; the interpreted kernel's keys where Triton runs here."""
    a64, pa, precision, metric = _grey_rows(rng, 40, d)
    b64, pb, _, _ = _grey_rows(rng, 50, d)
    true = -2.0 * (a64 @ b64.T)
    bound = metric.pair_bound(d, pa.norms[:, None], pb.norms[None, :], None, None, precision=precision)
    keys = screen.block_scores(pa.vectors, pb.vectors, d, precision, None, None).double()
    assert ((keys - true).abs() <= bound).all()
    assert ((keys - true).abs() > 0).any()  # the scalings did round: the test has teeth
    if interpret_if_available:
        inf = torch.full((40,), torch.inf)
        out, _ = fused.screen_block(pa.vectors, pb.vectors, d, inf, None, None, None, "float16", capacity_hint=2000)
        dense = torch.full((40, 50), torch.nan, dtype=torch.float64)
        dense[out.owner.long(), out.other.long()] = out.keys.double()
        assert ((dense - true).abs() <= bound).all()


@pytest.fixture
def interpret_if_available():
    return kernels.interpreting()


@pytest.fixture
def float16_screen(set_options):
    """Graphs screened in scaled float16 on the CPU (the torch reference of the kernel)."""
    set_options(screen_precision="float16")
    set_options(cpu_max_part=64)  # several parts: off-diagonal blocks too


def _graph(x, k: int, include_self: bool = False):
    g = knng.graph(x, k, include_self=include_self)
    report = last_report()
    assert report.screen_dtype == "float16"
    assert_exact(g, oracle_graph(x, k, include_self=include_self))
    return report


@pytest.mark.parametrize("k,include_self", [(1, False), (5, False), (5, True)])
def test_pixel_graphs_screen_with_exact_products(float16_screen, rng, k, include_self):
    x = smooth_image_patches(rng, 300, side=4)  # uint8, flat regions, near-duplicates
    assert _graph(x, k, include_self).exact_products
    assert _graph(x.astype(np.float32), k, include_self).exact_products
    assert _graph((x / 255.0).astype(np.float32), k, include_self).exact_products  # img_as_float32
    assert _graph(x / 255.0, k, include_self).exact_products  # float64 grey levels


def test_exact_products_let_fewer_pairs_through(float16_screen, rng):
    """The same patches moved by half a grey level have the same distances and the same
    answer, but are not integers: the float16 bound then lets more pairs through."""
    x = smooth_image_patches(rng, 400, side=4).astype(np.float64)
    exact = _graph(x, 5)
    shifted = _graph(x + 0.5, 5)
    assert exact.exact_products and not shifted.exact_products
    assert exact.store.survivors < shifted.store.survivors


def test_integers_give_or_take_a_little_are_stored_as_integers(float16_screen, rng):
    """Integers off by up to 10⁻⁴ are on the unit lattice within its tolerance: the rows must hold
    the integers themselves (float16 would round 1 + 10⁻⁴ scaled to a value off the lattice, whose
    sums are no longer exact), the offsets counted by the lattice error."""
    pixels = smooth_image_patches(rng, 300, side=4).astype(np.float64)
    noisy = pixels + rng.uniform(-1e-4, 1e-4, pixels.shape)
    metric = replace(get_metric("euclidean"), lattice=1.0)
    rows = metric.prepare(torch.from_numpy(noisy), torch.zeros(16, dtype=torch.float64), side="corpus",
                          symmetric=True, dtype=torch.float16).vectors
    scale = rows[:, -16:-14].contiguous().view(torch.float32)[:, 0].double()
    assert torch.equal(rows[:, :16].double() * scale[:, None], torch.from_numpy(pixels))
    report = _graph(noisy, 5)
    assert report.exact_products


@pytest.mark.parametrize("name", ["int8", "offset", "limit", "past_limit", "fraction", "ties"])
def test_integer_graphs_at_and_past_the_limits(float16_screen, rng, name):
    n = 250
    if name == "int8":  # negative values, full int8 range
        x, expect = rng.integers(-128, 128, (n, 6)).astype(np.int8), True
    elif name == "offset":  # integers far from the origin: the rounded centre removes the offset
        x, expect = (1e6 + rng.integers(0, 3, (n, 5))).astype(np.float32), True
    elif name == "limit":  # 256 columns of 0 / 255: ‖spread‖² = 16,646,400, just under 2²⁴
        x, expect = (255 * rng.integers(0, 2, (n, 256))).astype(np.uint8), True
    elif name == "past_limit":  # a column's extent of 2,049: float16 would round it
        x = rng.integers(0, 3, (n, 4)).astype(np.float32)
        x[::2, 0] = 2049.0
        expect = False
    elif name == "fraction":  # one value off the integers
        x = rng.integers(0, 9, (n, 4)).astype(np.float32)
        x[17, 2] = 0.25
        expect = False
    else:  # ties everywhere: few distinct integer points, many at equal distances
        x, expect = rng.integers(0, 3, (n, 3)).astype(np.float32), True
    assert _graph(x, 7).exact_products == expect
