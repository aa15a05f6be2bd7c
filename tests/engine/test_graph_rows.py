"""A graph's rows method (``plan.graph_method == "rows"``): chunks of rows searched against the
data for k + 1 neighbours, each point dropped from its own row; and the planner's choice
between it and the symmetric blocks (``knng.engine.plan.rows_method_wins``).

On a CPU the planner never takes the rows method; these tests force it (the same engine runs on
a GPU, where ``tests/engine/test_gpu_fused.py`` runs it on the kernels).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import knng
import knng.api
from knng.engine import kernels
from knng._inputs import as_input
from knng.engine import plan as plan_mod
from knng.engine.graph.frames import slab_gain
from oracle import assert_exact, assert_exact_chunked, oracle_graph, smooth_image_patches

#: The capabilities of an H100/H200, for which these tests plan on a machine without one.
HOPPER = kernels.DeviceCapabilities.hopper()

#: The options' defaults: the sizes the planner takes unless told otherwise.
DEFAULTS = knng.Options()


def _graph(x, k, method=plan_mod.GRAPH_ROWS, **kw):
    """``knng.graph`` on the CPU, planned with ``method``."""
    with knng.options(graph_method=method):
        return knng.graph(x, k, device="cpu", **kw)


def _data(rng, n: int = 3000, d: int = 8) -> np.ndarray:
    """Gaussian points far from the origin with duplicates: 100 points twice, and 25 copies of
    point 5 at rows 300–324 (for most of them more than k + 1 points at distance 0 have smaller
    indices, so that the point itself is not among its k + 1 nearest)."""
    x = (rng.standard_normal((n, d)) + 100).astype(np.float32)
    x[n - 100:] = x[:100]
    x[300:325] = x[5]
    return x


@pytest.mark.slow
@pytest.mark.parametrize("k, include_self", [(1, False), (10, False), (2999, False), (3000, True), (25, True)])
def test_the_rows_method_is_exact_and_equals_the_symmetric_graph(k, include_self, rng, seed):
    x = _data(rng)
    g = _graph(x, k, include_self=include_self)
    report = g.report
    assert report.plan.graph_method == "rows" and report.parts == -(-3000 // report.plan.query_rows) > 1
    assert report.blocks_computed == report.parts and report.pairs_saving == 0.0
    assert_exact(g, oracle_graph(x, k, include_self=include_self), context=f"seed={seed}")
    if not include_self:  # the copies of point 5 nearest to row 324: the others, by index
        others = np.r_[5, 300:324][:k]
        np.testing.assert_array_equal(g.indices[324, :len(others)], others)
    sym = _graph(x, k, plan_mod.GRAPH_SYMMETRIC, include_self=include_self)
    assert sym.report.plan.graph_method == "symmetric"
    np.testing.assert_array_equal(g.indices, sym.indices)
    np.testing.assert_array_equal(g.distances, sym.distances)


@pytest.mark.parametrize("metric", ["sqeuclidean", "cosine", "inner_product"])
def test_the_rows_method_in_every_metric(metric, rng):
    x = smooth_image_patches(rng, 2500, side=4).astype(np.float32)
    x[2000:2100] = x[:100]
    g = _graph(x, 12, metric=metric)
    assert g.report.plan.graph_method == "rows"
    assert_exact(g, oracle_graph(x, 12, metric=metric), context=metric)


def test_a_rows_graph_interrupted_mid_run_resumes_bit_for_bit(tmp_path, rng, interrupt_after_saves):
    # An error right after the second save (two chunks of rows done), then a resume: it starts
    # from the third chunk, and the answer is the uninterrupted one.
    x = _data(rng, n=5000)
    ref = _graph(x, 6)
    assert ref.report.parts >= 4
    saves = interrupt_after_saves(2)
    folder = tmp_path / "ck"
    with pytest.raises(RuntimeError, match="interrupted"):
        _graph(x, 6, checkpoint=folder, checkpoint_interval=0)
    interrupt_after_saves.undo()
    again = _graph(x, 6, checkpoint=folder, resume=True)
    assert again.report.checkpoints["resumed_from"] == saves[-1] == 2 * ref.report.plan.query_rows
    np.testing.assert_array_equal(again.indices, ref.indices)
    np.testing.assert_array_equal(again.distances, ref.distances)
    assert_exact_chunked(x, x, [(again.indices, again.distances)], exclude_self=True, rows=np.arange(0, 5000, 37))
    # A resumed run keeps its checkpoint's plan: the symmetric planner now would not matter.
    assert again.report.plan.graph_method == "rows"


def test_bad_method_is_refused():
    with pytest.raises(ValueError, match="method"):
        plan_mod.make_graph_plan(n=100, d=4, k=5, metric="euclidean", device=torch.device("cpu"), budget=1 << 26,
                                 include_self=False, method="diagonal")


# ------------------------------------------------------------------------------ the planner
class GpuPlanner:
    """Plans graphs of 200k × 128 points (by default) for an H100 on this machine, describing the
    data by a slab gain the test sets (``value``) and counting how often the planner asks for it."""

    def __init__(self) -> None:
        self.value, self.calls = 1.0, 0

    def slab_gain(self, parts: int) -> float:
        self.calls += 1
        return self.value

    def plan(self, k: int, *, n: int = 200_000, metric: str = "euclidean", budget: int = 60 * 2**30, **kw):
        return plan_mod.make_graph_plan(n=n, d=128, k=k, metric=metric, device=torch.device("cuda", 0),
                                        capabilities=HOPPER, budget=budget, include_self=False,
                                        host_budget=64 * 2**30, slab_gain=self.slab_gain, **kw)


@pytest.fixture
def gpu_planner(set_options) -> GpuPlanner:
    """A :class:`GpuPlanner`; the CUDA kernel's strip minima forced on (off a GPU they are off)."""
    set_options(kernels={"strip_minima": True})
    return GpuPlanner()


def test_the_planner_takes_rows_for_large_k_on_data_without_slabs(gpu_planner):
    rows = gpu_planner.plan(100)
    assert rows.graph_method == "rows" and rows.screen_precision == "float16" and rows.k == 100
    chunks = -(-200_000 // DEFAULTS.kernel_search_rows)  # chunks of equal size, none over the limit
    assert rows.query_rows == -(-200_000 // chunks) and rows.parts == chunks
    assert rows.operation == "graph" and rows.sample_size > 0
    assert gpu_planner.plan(DEFAULTS.graph_rows_min_k - 1).graph_method == "symmetric"
    assert gpu_planner.plan(10).frames == "global"  # Gaussian-like data: one centre, no slabs
    # Image-like data (slabs that shrink the squared norms) keep principal frames.
    gpu_planner.value = 2 * DEFAULTS.local_centre_gain
    sym = gpu_planner.plan(100)
    assert sym.graph_method == "symmetric" and sym.frames == "principal"
    # Metrics whose blocks have one centre anyway need no sample of the data.
    calls = gpu_planner.calls
    assert gpu_planner.plan(100, metric="cosine").graph_method == "rows" and gpu_planner.calls == calls


def test_image_like_data_keep_the_blocks_where_the_budget_denies_their_slabs(gpu_planner):
    # Principal frames need the corpus three times and the stores within half the budget; under
    # less, image-like data still keep the symmetric blocks (about one centre), which beat the
    # rows method's one centre on them in time and memory (plan.rows_method_wins). Data without
    # slabs go by rows as before.
    gpu_planner.value = 2 * DEFAULTS.local_centre_gain
    roomy, tight = gpu_planner.plan(100, n=582_150), gpu_planner.plan(100, n=582_150, budget=4 * 2**30)
    assert roomy.graph_method == "symmetric" and roomy.frames == "principal"
    assert tight.graph_method == "symmetric" and tight.frames == "global"
    gpu_planner.value = 1.0
    assert gpu_planner.plan(100, n=582_150, budget=4 * 2**30).graph_method == "rows"


def test_the_planner_takes_rows_at_small_k_where_their_tiles_go_first(gpu_planner, set_options):
    # Where the search takes its tiles first (plan.tiles_first: the wgmma kernel, 2k to 4,096
    # tiles of 128 columns, the budget) a graph of at most GRAPH_ROWS_TILES_FIRST_MAX_ND values
    # runs by rows at any k; larger data, image-like data and k past the tiles keep the blocks.
    set_options(kernels={"tiles_first": True})
    small = gpu_planner.plan(10)  # 200k × 128: 25.6M values, 1,563 tiles
    assert small.graph_method == "rows" and plan_mod.tiles_first(replace(small, operation="search", k=11),
                                                                 torch.device("cuda", 0))
    assert gpu_planner.plan(10, n=500_000).graph_method == "symmetric"  # 64M values: the halved product wins
    assert gpu_planner.plan(100, n=500_000).graph_method == "rows"  # from GRAPH_ROWS_MIN_K, as before
    assert gpu_planner.plan(10, n=2_000).graph_method == "symmetric"  # 16 tiles < 2 (k + 1)
    set_options(graph_rows_tiles_first=False)
    assert gpu_planner.plan(10).graph_method == "symmetric"
    set_options(graph_rows_tiles_first=True)
    gpu_planner.value = 2 * DEFAULTS.local_centre_gain  # principal slabs: blocks centred on their parts
    assert gpu_planner.plan(10).graph_method == "symmetric"


def test_tiles_first_is_decided_from_the_plan(gpu_planner, set_options):
    set_options(kernels={"tiles_first": True})
    cuda = torch.device("cuda", 0)

    def search(n_corpus: int, k: int, budget: int = 60 * 2**30, **kw):
        return plan_mod.make_search_plan(n_queries=10_000, n_corpus=n_corpus, d=128, k=k, metric="euclidean",
                                         device=cuda, capabilities=HOPPER, budget=budget, host_budget=64 * 2**30, **kw)

    assert plan_mod.tiles_first(search(200_000, 100), HOPPER)
    widest = plan_mod.KTH_ROW_MAX_WIDTH  # the k-th kernel's widest row
    assert plan_mod.tiles_first(search(widest * 128, 10), HOPPER)
    assert not plan_mod.tiles_first(search(widest * 128 + 1, 10), HOPPER)
    assert not plan_mod.tiles_first(search(200_000, 782), HOPPER)  # 1,563 tiles < 2k
    assert plan_mod.tiles_first(search(200_000, 781), HOPPER)
    with knng.options(kernels={"tiles_first": False}):  # float32: no wgmma kernel
        assert not plan_mod.tiles_first(search(200_000, 100, screen_dtype="float32"), HOPPER)
    tight = search(200_000, 100, budget=2**26)
    assert tight.query_rows * 1_563 * 8 > tight.budget // 8 and not plan_mod.tiles_first(tight, HOPPER)
    # 2¹⁷ rows × 16,384 tiles: 2³¹ grouped pairs, past their int32 positions, in a budget they fit.
    huge = replace(search(1 << 21, 10, budget=300 * 2**30), query_rows=1 << 17)
    assert huge.query_rows * 16_384 * 8 <= huge.budget // 8 and not plan_mod.tiles_first(huge, HOPPER)
    assert plan_mod.tiles_first(replace(huge, query_rows=(1 << 17) - 1), HOPPER)
    set_options(tiles_first=False)
    assert not plan_mod.tiles_first(search(200_000, 100), HOPPER)


def test_the_planner_keeps_symmetric_where_rows_cannot_run(gpu_planner):
    assert gpu_planner.plan(100, screen_dtype="float32").graph_method == "symmetric"  # no kernel: score blocks
    assert gpu_planner.plan(100, method="symmetric").graph_method == "symmetric"
    # Candidate stores that do not fit the device: bands of parts, symmetric.
    assert gpu_planner.plan(100, n=4_000_000, budget=2 * 2**30).graph_method == "symmetric"


def test_a_graph_screened_in_float64_keeps_its_symmetric_blocks(gpu_planner):
    # The 16,384 × 4,096 graph at k = 1,024: the graph's rule screens it in float64 and
    # keeps the symmetric blocks, although a search of the same shape now screens in float16.
    kw = dict(d=4096, k=1024, metric="euclidean", device=torch.device("cuda", 0),
              capabilities=HOPPER, budget=60 * 2**30,
              host_budget=64 * 2**30)
    wide = plan_mod.make_graph_plan(n=16_384, include_self=False, **kw)
    assert wide.screen_precision == "float64" and wide.graph_method == "symmetric"
    assert plan_mod.make_search_plan(n_queries=16_384, n_corpus=16_384, **kw).screen_precision == "float16"
    assert plan_mod.make_graph_plan(n=16_384, include_self=False, method="rows", **kw
                                    ).graph_method == "rows"  # asked for, it runs


def test_kernel_searches_take_larger_query_chunks(gpu_planner):
    def search(k: int, budget: int = 60 * 2**30, **kw):
        return plan_mod.make_search_plan(n_queries=200_000, n_corpus=1_000_000, d=128, k=k, metric="euclidean",
                                         device=torch.device("cuda", 0), capabilities=HOPPER, budget=budget,
                                         host_budget=64 * 2**30,
                                         **kw)

    def balanced(limit: int) -> int:  # chunks of equal size, none over the limit
        return -(-200_000 // -(-200_000 // limit))

    assert search(10).query_rows == balanced(DEFAULTS.kernel_search_rows)
    # Survivors grow with k: fewer rows, but never fewer than a score block's.
    assert 16384 <= search(1024).query_rows == balanced(DEFAULTS.kernel_search_pairs // 1024) < search(10).query_rows
    # A small budget: no more rows than let the whole sample's strip minima fit an eighth of it.
    small = search(100, budget=2**30)
    assert small.sample_size == DEFAULTS.gpu_sample and small.query_rows < search(100).query_rows
    assert search(10, screen_dtype="float32").query_rows <= 16384


def test_an_escalation_search_under_a_budget_takes_tall_chunks(gpu_planner):
    # A graph's escalated rows are searched in float64 with the plan made for every row of the
    # graph. Each chunk pays a fixed price, so under a budget the columns narrow until a chunk
    # holds GPU_SEARCH_MIN_ROWS rows: 582k 8×8 patches at k = 100 under 4 GB were planned 79
    # rows a chunk (every row's candidate lists charged at once), 287k escalated rows 23 s.
    def escalation(budget: int):
        plan = plan_mod.make_graph_plan(n=582_150, d=64, k=100, metric="euclidean", device=torch.device("cuda", 0),
                                        capabilities=HOPPER, budget=budget, include_self=False,
                                        host_budget=64 * 2**30, slab_gain=lambda parts: 100.0)
        assert plan.escalation is not None and plan.escalation.screen_precision == "float64"
        return plan.escalation

    roomy, tight = escalation(80 * 10**9), escalation(4 * 10**9)
    assert roomy.corpus_cols == DEFAULTS.gpu_search_cols and roomy.query_rows > plan_mod.GPU_SEARCH_MIN_ROWS
    assert tight.query_rows >= plan_mod.GPU_SEARCH_MIN_ROWS and tight.corpus_cols < roomy.corpus_cols
    # Its score blocks (three float64 values an entry) and every row's answer within the budget.
    blocks = tight.query_rows * tight.corpus_cols * 8 * 3
    assert blocks + 582_150 * 101 * 16 <= tight.budget
    # A search of fewer queries narrows its columns only until they fit one chunk; a CPU keeps
    # its cache-sized chunks.
    few = plan_mod.make_search_plan(n_queries=2_000, n_corpus=582_150, d=64, k=100, metric="euclidean",
                                    device=torch.device("cuda", 0), capabilities=HOPPER, budget=4 * 10**9,
                                    host_budget=64 * 2**30, screen_dtype="float64")
    assert few.query_rows == 2_000 and few.corpus_cols < DEFAULTS.gpu_search_cols
    cpu = plan_mod.make_search_plan(n_queries=10_000, n_corpus=100_000, d=64, k=10, metric="euclidean",
                                    device=torch.device("cpu"), budget=2**31, host_budget=2**33)
    assert cpu.query_rows == 1024 and cpu.corpus_cols == 8192


def test_slab_gain_tells_image_patches_from_gaussian_points(rng):
    patches = as_input(smooth_image_patches(rng, 20_000, side=4).astype(np.float32), "data")
    gauss = as_input(rng.standard_normal((20_000, 16)).astype(np.float32), "data")
    cpu = torch.device("cpu")
    assert slab_gain(patches, 8, cpu) >= DEFAULTS.local_centre_gain
    assert 1.0 <= slab_gain(gauss, 8, cpu) < 1.3
    assert slab_gain(patches, 1, cpu) == 1.0


@pytest.mark.parametrize("parts", [2, 3, 7, 8192, 20_000])
def test_slab_gain_is_its_definition(parts, rng):
    # The gain is the sample's sum of squares about its mean over that about each slab's own
    # mean (slabs of equal size along the direction, in its order), here computed directly in
    # NumPy from the same sample and direction: more slabs than rows, slabs of one row (no
    # spread within: an infinite gain), a direction with clusters along it.
    from knng.engine.graph import frames

    x = rng.standard_normal((5_000, 12)).astype(np.float32)
    x[:, 0] += 6.0 * rng.integers(0, 4, 5_000)  # four clusters along the first axis
    data = as_input(x, "data")
    cpu = torch.device("cpu")
    rows = frames._direction_sample(data, cpu)
    rows = (rows - rows.mean(dim=0)).numpy()
    u = frames._leading_direction(torch.from_numpy(rows)).numpy()
    ordered = rows[np.argsort(rows @ u, kind="stable")]
    m = ordered.shape[0]
    slab = np.arange(m) * min(parts, m) // m
    within = sum(((ordered[slab == s] - ordered[slab == s].mean(axis=0)) ** 2).sum() for s in np.unique(slab))
    total = (rows * rows).sum()
    got = slab_gain(data, parts, cpu)
    if within <= total * 1e-12:
        assert got == float("inf")
    else:
        assert got == pytest.approx(total / within, rel=1e-9)
        assert got > 2.0  # the clusters are the slabs


def test_knng_info_describes_a_rows_plan(gpu_planner):
    from knng.cli.info import plan_lines

    text = "\n".join(plan_lines("graph", gpu_planner.plan(100, n=600_000)))
    assert "3 chunks of ≤200,000 points, each searched against all the data" in text
    assert "1 chunk of ≤200,000 points" in "\n".join(plan_lines("graph", gpu_planner.plan(100)))
    assert "symmetry" not in text
    assert "symmetry" in "\n".join(plan_lines("graph", gpu_planner.plan(10)))


def test_a_resumed_rows_graph_reports_rows(rng, tmp_path):
    from knng.cli.console import exact_line

    x = _data(rng, n=2500)
    g = _graph(x, 4, checkpoint=tmp_path / "ck", checkpoint_interval=0, keep_checkpoint=True)
    again = _graph(x, 4, checkpoint=tmp_path / "ck", resume=True)
    assert again.report.checkpoints["resumed_from"] == 2500
    assert "resumed from a checkpoint with 2,500 rows done" in exact_line(again.report)
    np.testing.assert_array_equal(again.indices, g.indices)


def test_strip_seeds_take_their_whole_sample(gpu_planner, set_options):
    # The kernel's strip minima write no score block, so a rows chunk of all 200,000 points takes
    # the planner's whole sample; a screen whose seeds materialise the block keeps the whole
    # sample too, in chunks of fewer rows, its block within an eighth of the budget.

    set_options(kernels={"strip_minima": True})
    whole = min(DEFAULTS.gpu_sample, plan_mod.GPU_SAMPLE_PER_K * 101)
    strips = gpu_planner.plan(100)
    assert strips.sample_size == whole and strips.query_rows == 200_000
    set_options(kernels={"strip_minima": False})
    block = gpu_planner.plan(100)
    assert block.sample_size == whole and block.query_rows < strips.query_rows
    assert block.sample_size * block.query_rows * 4 <= 60 * 2**30 // 8


def test_stores_that_take_survivors_in_wait_for_more(gpu_planner):
    # A GPU graph store that cannot hold survivors back (blocks centred on their own parts, in
    # principal frames) lets PENDING_GPU_UPDATES wait; the plan's memory counts them.
    cuda = torch.device("cuda", 0)
    assert plan_mod.pending_pairs(cuda, 60 * 2**30, updates=True) == plan_mod.PENDING_GPU_UPDATES
    assert plan_mod.pending_pairs(cuda, 60 * 2**30) == DEFAULTS.pending_gpu
    assert plan_mod.pending_pairs(torch.device("cpu"), 60 * 2**30, updates=True) == DEFAULTS.pending_cpu
    assert plan_mod.pending_pairs(cuda, 2**30, updates=True) == 2**30 // 8 // DEFAULTS.pending_pair_bytes
    gpu_planner.value = 2 * DEFAULTS.local_centre_gain  # image-like data: principal frames
    sym = gpu_planner.plan(10)
    assert sym.frames == "principal"
    assert sym.bytes_expected >= plan_mod.PENDING_GPU_UPDATES * DEFAULTS.pending_pair_bytes


def test_strip_seeds_are_planned_only_where_the_search_runs_them(gpu_planner, set_options):
    # A corpus with fewer than 2k strips is seeded from a materialised sample block even where
    # the kernel's minima run: the plan must then fit that block in its eighth of the budget.

    set_options(kernels={"strip_minima": True})
    budget = 16 * 2**30
    p = plan_mod.make_search_plan(n_queries=200_000, n_corpus=50_000, d=128, k=500, metric="euclidean",
                                  device=torch.device("cuda", 0), capabilities=HOPPER, budget=budget,
                                  host_budget=64 * 2**30)
    assert 2 * 500 > -(-50_000 // kernels.strip_width())
    assert p.sample_size * p.query_rows * 4 <= budget // 8 or p.sample_size == 500 * plan_mod.SAMPLE_PER_K


def test_a_kernel_plan_under_a_budget_keeps_its_parts_and_stays_within_it(gpu_planner):
    # A kernel writes no score block: under a budget its parts are bounded by the seed of their
    # own block (strip minima, or a float32 sample where parts are too small for 2k strips),
    # the held survivors, the streamed parts and the stores' bands, and the plan fits the budget.
    kw = dict(n=2_000_000, d=128, metric="euclidean", device=torch.device("cuda", 0), capabilities=HOPPER,
              include_self=False, host_budget=64 * 2**30)
    roomy = plan_mod.make_graph_plan(k=10, budget=100 * 2**30, **kw)
    tight = plan_mod.make_graph_plan(k=10, budget=3 * 10**9, **kw)  # 4 GB less a 1 GB input's copy
    assert tight.part_size == roomy.part_size and tight.parts == roomy.parts
    for k in (10, 100):
        for budget in (3 * 10**9, 512 * 10**6, 256 * 10**6, 64 * 10**6):
            plan = plan_mod.make_graph_plan(k=k, budget=budget, **kw)
            assert plan.bytes_expected <= budget, (k, budget, plan.parts, plan.bytes_expected)


def test_a_host_input_is_copied_to_a_gpu_where_it_takes_half_its_budget():
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    share = plan_mod.INPUT_COPY_SHARE
    assert plan_mod.copies_input(nbytes=10**9, on_device=False, device=cuda, budget=share * 10**9)
    assert not plan_mod.copies_input(nbytes=10**9 + 1, on_device=False, device=cuda, budget=share * 10**9)
    assert not plan_mod.copies_input(nbytes=10**9, on_device=True, device=cuda, budget=10**12)
    assert not plan_mod.copies_input(nbytes=10**3, on_device=False, device=cpu, budget=10**12)  # the page cache
