"""Integer rows (precision ``int8``): integer data screened with exact int8 products and exact keys.

Data whose every value is an integer and whose every column spans at most 255 (uint8 pixels,
photon counts) are centred on an integer point of each column's range, so that every value is an
int8; the product of two rows is then an exact int32 sum, and the key q + r − 2·aᵀb — the squared
distance itself — an exact int32 too, rounded to float32 once. Checked here: the rule at its
limits (a column spanning 255 and 256, d at the int32 limit), the reference's and the interpreted
kernel's keys against exact integer arithmetic (bit for bit), graphs of adversarial integer data
against the float64 oracle (flat regions, duplicates, negative values, huge offsets, keys past
2²⁴ where float32 rounds them, k = 1 and k = n − 1), the planner's choice and the clear error
where the data do not fit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from knng.engine import screen
from knng.engine.common import CorpusStats, LatticeExtent, integer_extent_of
from knng.engine.kernels import fused
from knng.engine.kernels.capabilities import DeviceCapabilities
from knng.engine.plan import make_graph_plan
from knng._inputs import as_input
from knng.metrics import (
    INTEGER_HIGH, INTEGER_LOW, INTEGER_MAGNITUDE, INTEGER_MAX_D, PRECISIONS, IntegerExtent, get_metric, integer_centre,
    integer_rows_fit, integer_terms,
)
from oracle import assert_exact, oracle_graph, oracle_search, smooth_image_patches

# Duplicate-heavy integer data: every row reaches the engine.
pytestmark = pytest.mark.unfolded

INT8 = PRECISIONS["int8"]
METRIC = get_metric("sqeuclidean")


def _rows(x: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    integer = METRIC.__class__(**{**METRIC.__dict__, "integers": True})
    return integer.prepare(x, centre, side="corpus", symmetric=True, dtype=torch.int8).vectors


def _exact_keys(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared distances of integer rows in int64 arithmetic, rounded to float32 once (as float64)."""
    a64, b64 = a.to(torch.int64), b.to(torch.int64)
    d2 = (a64 * a64).sum(1)[:, None] + (b64 * b64).sum(1)[None, :] - 2 * (a64 @ b64.T)
    return d2.to(torch.float32).to(torch.float64)


def _extreme(rng: np.random.Generator, m: int, d: int) -> torch.Tensor:
    """Values at both ends of a column's 255 range (0 and 255), and some in between."""
    x = rng.choice(np.array([0, 255, 1, 254, 128]), size=(m, d), p=[0.4, 0.4, 0.05, 0.05, 0.1])
    return torch.from_numpy(x.astype(np.float64))


def test_the_rule_at_its_limits():
    low = torch.zeros(4)
    assert integer_rows_fit(4, torch.tensor([255.0, 0.0, 3.0, 255.0]), low)
    assert not integer_rows_fit(4, torch.tensor([256.0, 0.0, 3.0, 0.0]), low)
    assert not integer_rows_fit(3, None, None)  # not integers
    assert integer_rows_fit(INTEGER_MAX_D, torch.full((INTEGER_MAX_D,), 255.0), torch.zeros(INTEGER_MAX_D))
    assert not integer_rows_fit(INTEGER_MAX_D + 1, torch.full((INTEGER_MAX_D + 1,), 255.0),
                                torch.zeros(INTEGER_MAX_D + 1))
    # Values beyond int32's reach (the rows are made in int32 arithmetic), at either end.
    f64 = dict(dtype=torch.float64)
    assert integer_rows_fit(4, torch.full((4,), 3.0, **f64), torch.full((4,), INTEGER_MAGNITUDE - 3.0, **f64))
    assert not integer_rows_fit(4, torch.full((4,), 3.0, **f64), torch.full((4,), INTEGER_MAGNITUDE - 2.0, **f64))
    assert not integer_rows_fit(4, torch.full((4,), 3.0, **f64), torch.full((4,), -INTEGER_MAGNITUDE - 1.0, **f64))
    assert INTEGER_MAX_D * 255**2 < 2**31 <= (INTEGER_MAX_D + 1) * 255**2


def test_the_integer_centre_puts_every_value_in_int8(rng):
    low = torch.from_numpy(rng.integers(-1000, 1000, 50).astype(np.float64))
    spread = torch.from_numpy(rng.integers(0, 256, 50).astype(np.float64))
    spread[:3] = torch.tensor([0.0, 255.0, 255.0])
    mean = low + spread * torch.from_numpy(rng.choice([0.0, 0.01, 0.5, 0.99, 1.0], 50))
    centre = integer_centre(mean, low, low + spread)
    assert torch.equal(centre, torch.round(centre))
    assert ((low - centre) >= INTEGER_LOW).all() and ((low + spread - centre) <= INTEGER_HIGH).all()


def test_corpus_stats_find_integer_rows(rng):
    x = torch.from_numpy(rng.integers(0, 256, (40, 7)).astype(np.float32))
    lattice = LatticeExtent(1.0, 7, torch.device("cpu"))
    lattice.add(x)
    stats = CorpusStats.of(x.double().mean(0), [lattice])
    assert stats.integers
    centre = stats.integer_centre()
    assert ((x.double() - centre) >= INTEGER_LOW).all() and ((x.double() - centre) <= INTEGER_HIGH).all()
    wide = x.clone()
    wide[0, 3] = 300.0  # a column spanning more than 255
    lattice = LatticeExtent(1.0, 7, torch.device("cpu"))
    lattice.add(wide)
    stats = CorpusStats.of(wide.double().mean(0), [lattice])
    assert not stats.integers
    with pytest.raises(ValueError, match="screen_dtype='int8' screens integer data only"):
        stats.integer_centre()


@pytest.mark.parametrize("d", [1, 5, 64, 200, 4099])
def test_reference_keys_are_exact_integers_rounded_once(rng, d):
    a, b = _extreme(rng, 37, d), _extreme(rng, 29, d)
    centre = torch.full((d,), 128.0)
    pa, pb = _rows(a, centre), _rows(b, centre)
    assert pa.dtype == torch.int8 and pa.shape[1] % 16 == 0
    assert torch.equal(integer_terms(pa).long(), ((a - centre) ** 2).sum(1).long())
    keys = screen.block_scores(pa, pb, d, INT8)
    assert keys.dtype == torch.float32
    assert torch.equal(keys.double(), _exact_keys(a - centre, b - centre))
    if d == 4099:
        assert (keys.double() >= 2**24).any()  # some keys past float32's integers: rounded once


def test_reference_keys_at_the_int32_limit(rng):
    """d = INTEGER_MAX_D with values at both ends: squared distances just below 2³¹."""
    d = INTEGER_MAX_D
    a = torch.zeros((3, d), dtype=torch.float64)
    b = torch.full((2, d), 255.0, dtype=torch.float64)
    a[1, ::2] = 255.0
    a[2] = torch.from_numpy(rng.integers(0, 256, d).astype(np.float64))
    centre = torch.full((d,), 128.0)
    keys = screen.block_scores(_rows(a, centre), _rows(b, centre), d, INT8)
    assert float(keys[0, 0]) == float(np.float32(d * 255**2))
    assert torch.equal(keys.double(), _exact_keys(a - centre, b - centre))


def test_values_out_of_int8_range_are_refused():
    x = torch.tensor([[0.0, 1.0], [256.0, 1.0]])
    with pytest.raises(ValueError, match=r"\[-128, 127\]"):
        _rows(x, torch.zeros(2))


@pytest.fixture
def interpret():
    if not fused.interpreting():
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")


@pytest.mark.parametrize("d", [3, 64, 300])
@pytest.mark.parametrize("symmetric", [False, True])
def test_interpreted_kernel_keys_are_the_reference(interpret, rng, d, symmetric):
    a, b = _extreme(rng, 37, d), _extreme(rng, 45, d)
    centre = torch.full((d,), 128.0)
    pa, pb = _rows(a, centre), _rows(b, centre)
    inf_rows, inf_cols = torch.full((37,), torch.inf), torch.full((45,), torch.inf)
    by_row, by_col = fused.screen_block(pa, pb, d, inf_rows, inf_cols if symmetric else None, None, None, "int8",
                                        capacity_hint=37 * 45)
    expect = screen.block_scores(pa, pb, d, INT8).double()
    for found, transpose in [(by_row, False)] + ([(by_col, True)] if symmetric else []):
        dense = torch.full((37, 45), torch.nan, dtype=torch.float64)
        rows, cols = (found.other, found.owner) if transpose else (found.owner, found.other)
        dense[rows.long(), cols.long()] = found.keys.double()
        assert torch.equal(dense, expect)


def test_interpreted_kernel_tests_thresholds_and_the_diagonal(interpret, rng):
    d = 20
    x = _extreme(rng, 40, d)
    p = _rows(x, torch.full((d,), 128.0))
    keys = screen.block_scores(p, p, d, INT8)
    thr = keys.kthvalue(5, dim=1).values  # ties included: ≤ keeps them all
    by_row, _ = fused.screen_block(p, p, d, thr, None, None, None, "int8", exclude_diagonal=0, capacity_hint=1600)
    keep = keys <= thr[:, None]
    keep.fill_diagonal_(False)
    expect = sorted(zip(*(t.tolist() for t in torch.nonzero(keep, as_tuple=True))))
    assert sorted(zip(by_row.owner.tolist(), by_row.other.tolist())) == expect


@pytest.fixture
def int8_screen(set_options):
    """Graphs screened with integer rows on the CPU (the torch reference of the kernel), in
    several parts: off-diagonal blocks too."""
    set_options(screen_precision="int8", cpu_max_part=64)


def _graph(x, k: int, include_self: bool = False):
    g = knng.graph(x, k, include_self=include_self)
    report = last_report()
    assert report.screen_dtype == "int8"
    assert_exact(g, oracle_graph(x, k, include_self=include_self))
    return report


@pytest.mark.parametrize("k,include_self", [(1, False), (7, False), (7, True)])
def test_pixel_graphs(int8_screen, rng, k, include_self):
    x = smooth_image_patches(rng, 300, side=4)  # uint8, flat regions, near-duplicates
    _graph(x, k, include_self)
    _graph(x.astype(np.float32), k, include_self)


@pytest.mark.parametrize("name", ["int8", "offset", "duplicates", "flat", "past_2_24", "odd"])
def test_integer_graphs(int8_screen, rng, name):
    n = 230
    if name == "int8":  # negative values, the full int8 range
        x = rng.integers(-128, 128, (n, 6)).astype(np.int8)
    elif name == "offset":  # integers far from the origin
        x = (1e6 + rng.integers(0, 256, (n, 5))).astype(np.float64)
    elif name == "duplicates":  # many exact ties
        x = rng.integers(0, 3, (n, 4)).astype(np.uint8)
        x[50:120] = x[3]
    elif name == "flat":  # one value everywhere but a few rows
        x = np.full((n, 9), 200, dtype=np.uint8)
        x[::17, 2] = 0
    elif name == "past_2_24":  # keys up to 700·255²: float32 rounds them, the finish evaluates
        x = (255 * rng.integers(0, 2, (n, 700))).astype(np.uint8)
        x[:, :3] = rng.integers(0, 256, (n, 3))
    else:  # odd sizes
        x = rng.integers(0, 256, (97, 33)).astype(np.uint8)
    _graph(x, 5)
    _graph(x, 1)


def test_k_is_every_other_point(int8_screen, rng):
    x = smooth_image_patches(rng, 70, side=3)
    _graph(x, 69)


@pytest.mark.parametrize("held", [False, True])
def test_exact_keys_need_no_evaluation(int8_screen, rng, set_options, held):
    """Keys below 2²⁴ are the exact squared distances: the finish takes them as they are, in the
    store's tables and from survivors held back (a GPU's way, here on the CPU)."""
    if held:
        set_options(hold_on=frozenset({"cpu"}))
    x = rng.integers(0, 256, (300, 16)).astype(np.uint8)  # distinct rows, no ties at the k-th
    report = _graph(x, 5)
    assert report.store.exact_evaluations == 0
    assert bool(report.stages.get("store.finish_held")) == held
    wide = (255 * rng.integers(0, 2, (300, 700))).astype(np.uint8)  # keys past 2²⁴: evaluated
    assert _graph(wide, 5).store.exact_evaluations > 0


def test_integers_beyond_int32_take_another_screen(int8_screen, rng):
    x = 3e9 + rng.integers(0, 5, (100, 4)).astype(np.float64)  # integers, a narrow extent, too large
    with pytest.raises(ValueError, match="screen_dtype='int8' screens integer data only"):
        knng.graph(x, 3)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "float32", "float64"])
def test_the_preparation_kernel_is_the_reference(kernel_device, rng, dtype):
    """Integer rows made by the kernel (Triton's interpreter on a CPU, or a GPU) are the
    reference's, byte for byte, norms and terms included; values out of range are refused."""
    low, high = {"uint8": (0, 256), "int8": (-128, 128), "float32": (-70, 186), "float64": (10**6, 10**6 + 256)}[dtype]
    x = torch.from_numpy(rng.integers(low, high, (77, 45)).astype(dtype)).to(kernel_device)
    centre = torch.full((45,), float((low + high) // 2), dtype=torch.float64, device=kernel_device)
    integer = get_metric("euclidean").__class__(**{**get_metric("euclidean").__dict__, "integers": True})
    from knng.engine.kernels.preparation import prepare_rows

    for side, symmetric in [("corpus", True), ("query", False), ("corpus", False)]:
        got = prepare_rows(integer, x, centre, side=side, symmetric=symmetric, dtype=torch.int8)
        want = integer.prepare(x, centre, side=side, symmetric=symmetric, dtype=torch.int8)
        assert torch.equal(got.vectors, want.vectors) and torch.equal(got.norms, want.norms)
        assert torch.equal(got.terms, want.terms)
        assert (got.offsets is None) == (want.offsets is None)
    wide = x.to(torch.float64)
    wide[3, 7] = high + 1  # out of int8's range around the centre, above and below
    wide[4, 8] = low - 2
    with pytest.raises(ValueError, match=r"\[-128, 127\]"):
        prepare_rows(integer, wide, centre, side="corpus", symmetric=True, dtype=torch.int8)


def test_data_that_do_not_fit_are_refused(int8_screen, rng):
    x = rng.integers(0, 256, (100, 4)).astype(np.float32)
    x[0, 0], x[1, 0] = 256.0, 0.0  # a column spanning 256
    with pytest.raises(ValueError, match="screen_dtype='int8' screens integer data only"):
        knng.graph(x, 3)
    with pytest.raises(ValueError, match="screen_dtype='int8' screens integer data only"):
        knng.graph(x[:, 1:] + 0.5, 3)  # not integers


HOPPER = DeviceCapabilities.hopper()
CUDA = torch.device("cuda")


U8 = IntegerExtent.of_dtype  # uint8 data: 255 a column, known without a look


def _plan(n: int, d: int, k: int, metric: str = "euclidean", integers: IntegerExtent | None = None):
    return make_graph_plan(n=n, d=d, k=k, metric=metric, device=CUDA, budget=64 * 2**30, include_self=False,
                           capabilities=HOPPER, integers=integers)


@pytest.mark.parametrize("n,d,k", [(300_000, 15_876, 100), (16_384, 4_096, 1_024), (130_000, 576, 10),
                                   (30_000, 2_304, 100)])
def test_the_planner_takes_integer_rows_where_the_data_fit(n, d, k):
    plan = _plan(n, d, k, integers=U8(d, torch.uint8))
    assert plan.screen_precision == "int8" and plan.graph_method == "symmetric" and plan.frames == "global"
    assert not plan.direct
    assert _plan(n, d, k).screen_precision != "int8"  # not known to be integers
    # Not translation-invariant: the integers do not help.
    assert _plan(n, d, k, "cosine", integers=U8(d, torch.uint8)).screen_precision != "int8"


@pytest.mark.parametrize("n,d,k", [(580_000, 64, 10), (250_000, 256, 100)])
def test_exact_float16_keeps_its_tuned_kernel(n, d, k, monkeypatch):
    """uint8 data of d ≤ 258 have exact float16 products (d·255² < 2²⁴), which the wgmma kernel
    screens faster than integer rows at d ≤ 256; wider extents than float16 holds take int8."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # planned for a Hopper GPU, whose CUDA kernels run
    assert _plan(n, d, k, integers=U8(d, torch.uint8)).screen_precision == "float16"
    wide = IntegerExtent(255.0, 2.0**24)  # the squared extents at float16's limit
    assert _plan(n, d, k, integers=wide).screen_precision == "int8"


def test_integer_rows_have_limits():
    assert _plan(1000, INTEGER_MAX_D + 1, 5, integers=IntegerExtent(1.0, INTEGER_MAX_D + 1.0)).screen_precision != "int8"
    assert _plan(1000, 600, 5, integers=IntegerExtent(256.0, 600 * 256.0**2)).screen_precision != "int8"
    assert IntegerExtent.of_dtype(8, torch.float32) is None
    assert IntegerExtent.of(torch.tensor([3.0, 4.0]), torch.tensor([-7.0, 1.0])) == IntegerExtent(4.0, 25.0, 7.0)
    assert not IntegerExtent.of(torch.tensor([3.0, 4.0])).fit_integer_rows(2)  # magnitude unknown


def test_the_look_before_planning(rng):
    """uint8 data by their type; integer-valued floats by a look; other floats after a probe of
    their first rows; nothing for a metric that is not translation-invariant."""
    cpu, euclidean = torch.device("cpu"), get_metric("euclidean")
    x = rng.integers(0, 256, (3000, 4)).astype(np.uint8)
    assert integer_extent_of(as_input(x, "data"), euclidean, cpu) == IntegerExtent.of_dtype(4, torch.uint8)
    found = integer_extent_of(as_input(x.astype(np.float32) - 300, "data"), euclidean, cpu)
    assert found is not None and found.largest <= 255 and found.magnitude == 300
    late = x.astype(np.float64)
    late[2500, 1] += 0.5  # past the probe's rows: the whole look finds it
    assert integer_extent_of(as_input(late, "data"), euclidean, cpu) is None
    assert integer_extent_of(as_input(x + 0.25, "data"), euclidean, cpu) is None
    assert integer_extent_of(as_input(x, "data"), get_metric("cosine"), cpu) is None
    queries = np.full((5, 4), 255.0, dtype=np.float32)
    queries[0] = -1.0  # a query past 255 from the corpus's values
    both = integer_extent_of(as_input(x.astype(np.float32), "data"), euclidean, cpu, also=as_input(queries, "queries"))
    assert both is not None and both.largest == 256 and not both.fit_integer_rows(4)


def test_a_cpu_takes_integer_rows_from_d_128():
    cpu = torch.device("cpu")
    for d, expect in [(64, False), (127, False), (128, True), (576, True)]:
        plan = make_graph_plan(n=20_000, d=d, k=10, metric="euclidean", device=cpu, budget=2**30, include_self=False,
                               integers=U8(d, torch.uint8))
        assert (plan.screen_precision == "int8") == expect, (d, plan.screen_precision)


def test_graphs_through_the_kernel(kernel_device, set_options, rng):
    """The whole engine with the integer kernel (Triton's interpreter on a CPU, or a GPU)."""
    set_options(screen_precision="int8", cpu_max_part=64, gpu_kernel_max_part=64)
    x = smooth_image_patches(rng, 200, side=4)
    x[40:60] = x[3]
    for k in (1, 6):
        g = knng.graph(torch.from_numpy(x).to(kernel_device), k)
        assert last_report().screen_dtype == "int8"
        assert_exact(g, oracle_graph(x, k))


@pytest.mark.gpu
def test_a_gpu_screens_integer_data_with_integer_rows(rng):
    """No option: uint8 data, and integer-valued float32 data already on the GPU, take integer
    rows; the same values off the integers do not."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = smooth_image_patches(rng, 3000, side=24)  # d = 576: float16 cannot hold the products exactly
    for data, expect in [(x, "int8"), (torch.from_numpy(x).cuda(), "int8"),
                         (torch.from_numpy(x).float().cuda(), "int8"),
                         (torch.from_numpy(x).float().cuda() + 0.5, None)]:
        g = knng.graph(data, 10)
        report = last_report()
        assert (report.screen_dtype == "int8") == (expect == "int8"), report.screen_dtype
        assert_exact(g, oracle_graph(x if expect else x + 0.5, 10))


@pytest.fixture
def int8_search(set_options):
    set_options(screen_precision="int8", cpu_sample=64)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_searches(int8_search, rng, k):
    """Queries centred on the corpus's integer point: their values may lie outside the corpus's
    own extents (within 255 of every corpus value), which the centre then makes room for."""
    corpus = smooth_image_patches(rng, 400, side=4)
    corpus[100:140] = corpus[7]
    queries = rng.integers(0, 256, (57, 16)).astype(np.uint8)
    queries[:5] = corpus[7]  # ties among the corpus's copies
    queries[5:8] = 0
    queries[8:11] = 255
    found = knng.search(queries, corpus, k)
    assert last_report().screen_dtype == "int8"
    assert_exact(found, oracle_search(queries, corpus, k))
    as_float = knng.search(queries.astype(np.float32) - 1000, corpus.astype(np.float64) - 1000, k)
    assert_exact(as_float, oracle_search(queries.astype(np.float32) - 1000, corpus.astype(np.float64) - 1000, k))


def test_searches_whose_queries_do_not_fit_are_refused(int8_search, rng):
    corpus = rng.integers(100, 200, (300, 5)).astype(np.float32)
    queries = corpus[:10].copy()
    queries[0, 0] = -60.0  # 259 below the corpus's largest value of that column
    corpus[0, 0] = 199.0
    with pytest.raises(ValueError, match="screen_dtype='int8' screens integer data only"):
        knng.search(queries, corpus, 3)


def test_the_search_planner_takes_integer_rows(monkeypatch):
    from knng.engine.plan import make_search_plan

    kw = dict(n_queries=10_000, n_corpus=1_000_000, d=784, k=10, metric="euclidean", device=CUDA,
              budget=64 * 2**30, capabilities=HOPPER)
    plan = make_search_plan(**kw, integers=U8(784, torch.uint8))
    assert plan.screen_precision == "int8" and not plan.direct and not plan.tiles_first
    assert make_search_plan(**kw).screen_precision != "int8"
    small = make_search_plan(**{**kw, "n_queries": 10, "n_corpus": 1000}, integers=U8(784, torch.uint8))
    assert small.screen_precision == "int8" and not small.direct


@pytest.mark.parametrize("d", [7, 130])
def test_the_block_kernel_is_the_reference(kernel_device, rng, d):
    """A part's seed block by the integer block kernel (interpreted, or on a GPU) is the torch
    reference's, bit for bit, keys past 2²⁴ included."""
    a, b = _extreme(rng, 41, d).to(kernel_device), _extreme(rng, 53, d).to(kernel_device)
    centre = torch.full((d,), 128.0, dtype=torch.float64, device=kernel_device)
    pa, pb = _rows(a, centre), _rows(b, centre)
    got = screen.integer_scores(pa, pb, kernel=True)
    want = screen.integer_scores(pa, pb, kernel=False)
    assert torch.equal(got, want)
    assert torch.equal(want.double().cpu(), _exact_keys((a - centre).cpu(), (b - centre).cpu()))


def test_a_graph_read_from_a_file_in_parts(int8_screen, rng, tmp_path):
    """A memory-mapped uint8 file under a small budget: its parts prepared from the file as the
    screen reads them (no resident corpus), the same exact graph."""
    x = smooth_image_patches(rng, 2000, side=8)
    np.save(tmp_path / "x.npy", x)
    g = knng.graph(np.load(tmp_path / "x.npy", mmap_mode="r"), 6, memory_budget=200_000)
    report = last_report()
    assert report.screen_dtype == "int8" and not report.plan.corpus_resident
    assert_exact(g, oracle_graph(x, 6))


def test_a_graph_resumes_from_its_checkpoint(int8_screen, rng, tmp_path):
    x = smooth_image_patches(rng, 300, side=4)
    first = knng.graph(x, 5, checkpoint=tmp_path / "ck", keep_checkpoint=True)
    again = knng.graph(x, 5, checkpoint=tmp_path / "ck", resume=True)
    assert last_report().screen_dtype == "int8"
    np.testing.assert_array_equal(first.indices, again.indices)
    assert_exact(again, oracle_graph(x, 5))
