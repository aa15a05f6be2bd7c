"""knng.graph against the float64 oracle, and against knng.search; duplicates, self-exclusion
by index, symmetric parts under tiny budgets, OOM retries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from oracle import (
    DTYPES, KINDS, METRICS, assert_exact, assert_output_kind, kind_supports, oracle_graph, random_values,
)

#: The options' defaults: the sizes the planner takes unless told otherwise.
DEFAULTS = knng.Options()

CASES = [(kind, dtype) for kind in KINDS for dtype in DTYPES if kind_supports(kind, dtype)]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("kind,dtype", CASES)
def test_graph_matches_oracle(metric, kind, dtype, rng, seed, as_kind, screen):
    data = as_kind(random_values(rng, (250, 20), dtype), kind, dtype, "data")
    g = knng.graph(data, 8, metric=metric)
    assert isinstance(g, knng.Graph) and g.include_self is False
    assert_output_kind(g, data, k=8)
    assert_exact(g, oracle_graph(data, 8, metric), context=f"seed={seed} {kind} {dtype}")


@pytest.mark.parametrize("metric", METRICS)
def test_graph_nested_lists(metric, rng, seed):
    data = rng.standard_normal((9, 3)).round(1).tolist()
    g = knng.graph(data, 3, metric=metric)
    assert_output_kind(g, np.zeros(1), k=3)
    assert_exact(g, oracle_graph(data, 3, metric), context=f"seed={seed}")


def _drop_self(idx: np.ndarray, dist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """search(x, x, k+1) rows minus each point itself (by index), or minus the last column
    where the point is not among its own k+1 (inner product, duplicates ahead of it)."""
    n, k1 = idx.shape
    own = idx == np.arange(n)[:, None]
    drop = np.where(own.any(axis=1), own.argmax(axis=1), k1 - 1)
    keep = np.ones_like(own)
    keep[np.arange(n), drop] = False
    return idx[keep].reshape(n, k1 - 1), dist[keep].reshape(n, k1 - 1)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dups", [False, True])
def test_graph_equals_search_minus_self(metric, dups, rng, seed, screen):
    x = rng.standard_normal((400, 12)).astype(np.float32)
    if dups:
        x[300:] = x[rng.integers(0, 300, 100)]
    k = 9
    g = knng.graph(x, k, metric=metric)
    s = knng.search(x, x, k + 1, metric=metric)
    idx, dist = _drop_self(s.indices, s.distances)
    np.testing.assert_array_equal(g.indices, idx, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(g.distances, dist, err_msg=f"seed={seed}")
    assert_exact(g, oracle_graph(x, k, metric), context=f"seed={seed}")


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("k", [1, 11, 400])
def test_graph_include_self_equals_search(metric, k, rng, seed, screen):
    x = rng.standard_normal((400, 12)).astype(np.float32)
    x[350:] = x[:50]  # duplicates too
    g = knng.graph(x, k, metric=metric, include_self=True)
    assert g.include_self is True
    s = knng.search(x, x, k, metric=metric)
    np.testing.assert_array_equal(g.indices, s.indices, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(g.distances, s.distances, err_msg=f"seed={seed}")
    assert_exact(g, oracle_graph(x, k, metric, include_self=True), context=f"seed={seed}")


# --------------------------------------------------------------------------------- budgets
@pytest.mark.parametrize("metric,kind", [("euclidean", "memmap"), ("sqeuclidean", "numpy"), ("cosine", "numpy"),
                                         ("pearson", "memmap"), ("inner_product", "numpy")])
def test_graph_identical_across_budgets_many_parts(metric, kind, rng, seed, as_kind, screen, set_options):
    set_options(graph_method="symmetric")  # the blocks' pipeline (an inner product's graph goes by rows)
    n, k = 211, 10
    data = as_kind(random_values(rng, (n, 16), "float32") + 2.0, kind, "float32")
    outs, reports = [], []
    for budget in ("12KB", "150KB", None):
        outs.append(knng.graph(data, k, metric=metric, memory_budget=budget))
        reports.append(last_report())
    assert reports[0].parts > 1 and reports[0].plan.corpus_resident is False, reports[0]
    assert reports[2].plan.corpus_resident is True
    # The default budget holds the whole score matrix (mirrored blocks, one selection per
    # row); the tiny one takes the blocked path (row and column selections, merges).
    assert reports[0].parts != reports[2].parts or reports[0].part_size != reports[2].part_size
    assert reports[0].blocks_computed == reports[0].parts * (reports[0].parts + 1) // 2
    assert reports[0].pairs_saving > 0.3
    for g in outs[1:]:
        np.testing.assert_array_equal(g.indices, outs[0].indices)
        np.testing.assert_array_equal(g.distances.view(np.int32), outs[0].distances.view(np.int32))
    assert_exact(outs[0], oracle_graph(data, k, metric), context=f"seed={seed}")


@pytest.mark.parametrize("n,k", [(397, 1), (199, 198), (401, 37), (64, 63)])
def test_graph_tiny_budget_edge_k(n, k, rng, seed, screen):
    x = rng.standard_normal((n, 5))
    g = knng.graph(x, k, memory_budget="32KB")
    assert_exact(g, oracle_graph(x, k), context=f"seed={seed}")


# ------------------------------------------------------------------------------ duplicates
@pytest.mark.parametrize("metric", METRICS)
def test_many_duplicates(metric, rng, seed, screen):
    base = rng.standard_normal((60, 10))
    x = np.concatenate([base] + [base[:5]] * 30)  # rows 0..4 have 30 extra copies each
    perm = rng.permutation(len(x))
    x = x[perm]
    k = 12
    g = knng.graph(x, k, metric=metric, memory_budget="64KB")
    oracle = oracle_graph(x, k, metric)
    assert_exact(g, oracle, context=f"seed={seed}")
    # A point with ≥ k copies: all neighbours are copies (distance 0 in the Euclidean family),
    # the smallest indices among them, never itself.
    group = oracle.dup_group
    for i in np.nonzero(np.bincount(group)[group] > k)[0][:20]:
        copies = np.nonzero(group == group[i])[0]
        copies = copies[copies != i]
        if metric != "inner_product":
            np.testing.assert_array_equal(g.indices[i], copies[:k], err_msg=f"seed={seed} row {i}")
            if metric in ("euclidean", "sqeuclidean", "cosine", "pearson"):
                assert (g.distances[i] == 0).all()


@pytest.mark.parametrize("metric", METRICS)
def test_all_points_identical(metric, rng, seed, screen):
    x = np.tile(rng.standard_normal((1, 7)), (50, 1)).astype(np.float32)
    g = knng.graph(x, 49, metric=metric)
    expect = np.array([np.delete(np.arange(50), i) for i in range(50)])
    np.testing.assert_array_equal(g.indices, expect)
    assert len(set(g.distances.ravel().tolist())) == 1
    assert_exact(g, oracle_graph(x, 49, metric), context=f"seed={seed}")
    gs = knng.graph(x, 50, metric=metric, include_self=True)
    np.testing.assert_array_equal(gs.indices, np.tile(np.arange(50), (50, 1)))


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("n", [2, 3, 97])
def test_k_n_minus_one_and_include_self_k_n(metric, n, rng, seed, screen):
    x = rng.standard_normal((n, 4))
    g = knng.graph(x, n - 1, metric=metric)
    assert_exact(g, oracle_graph(x, n - 1, metric), context=f"seed={seed}")
    gs = knng.graph(x, n, metric=metric, include_self=True)
    assert_exact(gs, oracle_graph(x, n, metric, include_self=True), context=f"seed={seed}")


@pytest.mark.parametrize("n,d", [(997, 1), (1009, 3), (503, 129)])
@pytest.mark.parametrize("metric", METRICS)
def test_graph_odd_shapes(n, d, metric, rng, seed, screen):
    x = rng.standard_normal((n, d)).astype(np.float32)
    g = knng.graph(x, 5, metric=metric)
    assert_exact(g, oracle_graph(x, 5, metric), context=f"seed={seed}")


@pytest.mark.parametrize("bands", [2, 3, 8])
@pytest.mark.parametrize("metric", METRICS)
def test_own_blocks_in_row_bands(bands, metric, rng, seed, set_options):
    """A part's own block materialised in row bands, the lower part mirrored (``Options.symmetric_bands``,
    forced on small blocks): the same block but for rounding, every entry
    left of its band's diagonal block the transposed entry bit for bit; and graphs in float32 and
    float64 screens exact on ties, duplicates, far-off data, k = 1 and k = n − 1."""
    from knng.engine import screen
    from knng.metrics import PRECISIONS, get_metric

    set_options(symmetric_bands=bands)
    set_options(symmetric_min_rows=1)
    set_options(graph_method="symmetric")  # own blocks (an inner product's graph goes by rows)
    x = (1e4 + rng.standard_normal((301, 6))).astype(np.float32)
    x[150:170] = x[:20]  # duplicates in other bands
    m = get_metric(metric)
    for dtype, name in ((torch.float64, "float64"), (torch.float32, "float32")):
        xt = torch.from_numpy(x).to(dtype)
        a = m.prepare(xt, None, side="query", symmetric=True, dtype=dtype).vectors
        b = m.prepare(xt, None, side="corpus", symmetric=True, dtype=dtype).vectors
        banded = screen.block_scores(a, b, 6, PRECISIONS[name], symmetric=True)
        whole = screen.block_scores(a, b, 6, PRECISIONS[name])
        # Rounding on the scale of the products (the layouts' norms), not of the scores, which
        # cancel to nearly nothing for unit vectors of data far from the origin.
        scale = float(torch.linalg.vector_norm(a.double(), dim=1).max() * torch.linalg.vector_norm(b.double(), dim=1).max())
        assert torch.allclose(banded, whole, rtol=0, atol=64 * torch.finfo(dtype).eps * max(scale, float(whole.abs().max())))
        edges = [301 * i // bands for i in range(bands + 1)]
        band = torch.bucketize(torch.arange(301), torch.tensor(edges[1:]), right=True)
        below = band[:, None] > band[None, :]
        assert torch.equal(banded[below], banded.T[below])
        for k in (1, 7, 300):
            set_options(screen_precision=name)
            g = knng.graph(x, k, metric=metric, device="cpu")
            assert last_report().screen_dtype == name and last_report().parts == 1
            assert last_report().stages.get("screen.banded_product")
            assert_exact(g, oracle_graph(x, k, metric), context=f"seed={seed} {name} k={k} bands={bands}")


def test_graph_integer_ties_broken_by_index(rng, seed, screen):
    x = rng.integers(0, 3, size=(300, 3)).astype(np.int8)
    for metric in ("euclidean", "sqeuclidean", "inner_product"):
        g = knng.graph(x, 30, metric=metric, memory_budget="200KB")
        oracle = oracle_graph(x, 30, metric)
        assert last_report().parts > 1
        np.testing.assert_array_equal(g.indices, oracle.indices, err_msg=f"seed={seed} {metric}")
        assert_exact(g, oracle, context=f"seed={seed} {metric}")


def test_graph_to_scipy_roundtrip(rng):
    x = rng.standard_normal((120, 5))
    g = knng.graph(x, 4)
    a = g.to_scipy()
    assert a.shape == (120, 120) and a.nnz == 480
    assert (a.diagonal() == 0).all()


# ----------------------------------------------------------------------------- out of memory
def _oom_on_call(monkeypatch, which: set[int]):
    """Selection calls numbered in ``which`` (1-based) raise a device out-of-memory error.

    Returns the state: ``state["n"]`` counts calls; reset it and edit ``state["which"]`` to
    re-arm between runs.
    """
    import knng.engine.thresholds as thresholds  # the seeding selection of τ lives there

    real = thresholds.resolve
    state = {"n": 0, "which": which}

    def resolve(*args, **kwargs):
        fn = real(*args, **kwargs)

        def select(scores, k, **kw):
            state["n"] += 1
            if state["n"] in state["which"]:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            return fn(scores, k, **kw)

        return select

    monkeypatch.setattr(thresholds, "resolve", resolve)
    return state


def test_graph_oom_retry_on_row_selection(monkeypatch, rng, seed, screen):
    x = rng.standard_normal((600, 16)).astype(np.float32)
    state = _oom_on_call(monkeypatch, {1})
    g = knng.graph(x, 10, memory_budget="2MB")
    report = last_report()
    assert state["n"] > 1 and report.parts > 1
    assert report.oom_retries == 1
    assert_exact(g, oracle_graph(x, 10), context=f"seed={seed}")


def test_graph_oom_in_a_block_is_retried_without_counting_twice(monkeypatch, rng, seed, screen):
    # A block's product and screen change nothing; an out-of-memory error raised when its
    # survivors reach the store (or before) retries the block whole, and nothing is counted twice.
    from knng.engine.store import CandidateStore

    x = rng.standard_normal((600, 16)).astype(np.float32)
    real_add = CandidateStore.add
    state = {"n": 0, "fail": None}

    def add(self, rows, cols, keys, norms=None):
        state["n"] += 1
        if state["n"] == state["fail"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
        return real_add(self, rows, cols, keys, norms)

    monkeypatch.setattr(CandidateStore, "add", add)
    knng.graph(x, 10, memory_budget="2MB")
    report = last_report()
    assert report.parts > 1
    for fail in (1, report.parts + 1):  # a diagonal block, then the first off-diagonal one
        state["n"], state["fail"] = 0, fail
        g = knng.graph(x, 10, memory_budget="2MB")
        assert g.report.oom_retries == 1, g.report
        assert_exact(g, oracle_graph(x, 10), context=f"seed={seed} fail={fail}")


def test_a_graph_out_of_memory_after_its_retries_is_planned_again_smaller(monkeypatch, rng, seed):
    # An out-of-memory error the blocks' retries did not overcome never escapes a graph that could
    # run with a smaller budget: the planner plans it again with half (then a quarter of) the
    # budget, the report records each plan, and the answer is exact. Below MIN_REPLAN_BUDGET, and
    # for other errors, the error is the caller's.
    import knng.api as api

    x = rng.standard_normal((500, 8)).astype(np.float32)
    x[200:220] = x[:20]
    real = api.exact_graph
    budgets: list[int] = []

    def exact_graph(*args, plan, **kwargs):
        budgets.append(plan.budget)
        if len(budgets) <= 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, plan=plan, **kwargs)

    monkeypatch.setattr(api, "exact_graph", exact_graph)
    g = knng.graph(x, 9, memory_budget="256MB", device="cpu")
    assert budgets[1] == budgets[0] // 2 and budgets[2] == budgets[0] // 4
    assert [p.budget for p in g.report.replans] == budgets[1:]
    assert_exact(g, oracle_graph(x, 9), context=f"seed={seed}")
    budgets.clear()
    with pytest.raises(torch.OutOfMemoryError):
        knng.graph(x, 9, memory_budget=3 * api.MIN_REPLAN_BUDGET, device="cpu")
    assert len(budgets) == 2  # planned again once, at half; a quarter would be below the floor

    def fails(*args, **kwargs):
        raise RuntimeError("not a memory error")

    monkeypatch.setattr(api, "exact_graph", fails)
    with pytest.raises(RuntimeError, match="not a memory error"):
        knng.graph(x, 9, device="cpu")


@pytest.mark.parametrize("held_limit", [0, 500])
@pytest.mark.parametrize("fail", [1, 2, 5])
def test_held_survivors_taken_in_after_an_out_of_memory_error_are_not_lost(monkeypatch, rng, seed, fail,
                                                                          held_limit, set_options):
    # A holding store over its limit takes its held survivors in a step at a time (a flush's
    # worth, 200, where the limit is 0; the limit, 500, where it is more: HoldingStore._take_held);
    # an out-of-memory error in one of those updates leaves what was not taken in pending, the
    # block is retried, and the graph is exact.
    from knng.engine.store import CandidateStore

    set_options(hold_on=frozenset({"cpu", "cuda"}), screen_precision="tf32", cpu_max_part=70,
                pending_cpu=200, held_limit=held_limit)
    x = rng.standard_normal((333, 6))
    x[100:150] = x[:50]
    real_take = CandidateStore._take
    state = {"n": 0}

    def take(self, *args, **kwargs):
        state["n"] += 1
        if state["n"] == fail:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 512.00 MiB")
        return real_take(self, *args, **kwargs)

    monkeypatch.setattr(CandidateStore, "_take", take)
    g = knng.graph(x, 7, device="cpu")
    assert g.report.oom_retries == 1 and "store.take_held" in g.report.stages, g.report.stages
    assert_exact(g, oracle_graph(x, 7), context=f"seed={seed} fail={fail}")


def test_held_survivors_are_taken_in_by_the_limit_where_the_budget_holds_them():
    from knng.engine.plan import TAKE_IN_PAIR_BYTES, held_take_in_step

    limit, pending = 40_000_000, 4_194_304
    assert held_take_in_step(limit, pending, 83 * 2**30) == limit  # one merge of the tables
    four = held_take_in_step(limit, pending, 4 * 2**30)  # an eighth of the budget's worth
    assert pending < four < limit and four * TAKE_IN_PAIR_BYTES <= 4 * 2**30 // 8
    assert held_take_in_step(limit, pending, 2**20) == pending  # never less than a flush
    assert held_take_in_step(0, 200, 2**40) == 200


def test_graphs_that_hold_their_survivors_plan_a_float64_search_for_escalated_rows(set_options):
    # Planning only: a GPU graph screened by a kernel with its stores on the device holds its
    # survivors, so rows that hold too many are escalated (n·d / 32,768 pairs, at least 16 × the
    # store's capacity) and searched in float64 for k + 1 neighbours; integer rows (exact keys),
    # stores off the device and graphs by rows plan none; Options.escalate_pairs overrides.
    from knng.engine.kernels.capabilities import DeviceCapabilities
    from knng.engine.plan import ESCALATE_PER_CAPACITY, ESCALATE_VALUES_PER_PAIR, make_graph_plan

    hopper = DeviceCapabilities("cuda", (9, 0), triton=True, cupy=True, wgmma=True)

    def plan(n=582_150, d=64, k=10, **changes):
        return make_graph_plan(n=n, d=d, k=k, metric="euclidean", device=torch.device("cuda"), budget=80 * 2**30,
                               include_self=False, capabilities=hopper, method="symmetric", **changes)

    for k in (10, 100):
        p = plan(k=k)
        assert p.screen_precision == "float16" and p.escalation is not None
        assert p.escalate_pairs == max(ESCALATE_PER_CAPACITY * p.capacity, 582_150 * 64 // ESCALATE_VALUES_PER_PAIR)
        assert p.escalation.screen_precision == "float64" and p.escalation.k == k + 1
        assert not p.escalation.direct and p.escalation.operation == "search"
    assert plan(k=10).escalate_pairs == 582_150 * 64 // ESCALATE_VALUES_PER_PAIR  # 1,137 > 16 × 18
    assert plan(k=100).escalate_pairs == ESCALATE_PER_CAPACITY * plan(k=100).capacity
    assert plan(screen_dtype="int8").escalation is None
    assert plan(n=20_000, d=8, screen_dtype="float64").escalation is None  # no kernel screen: nothing held
    cpu = make_graph_plan(n=5_000, d=8, k=10, metric="euclidean", device=torch.device("cpu"), budget=2**30,
                          include_self=False)
    assert cpu.escalation is None and cpu.escalate_pairs == 0  # a CPU does not hold (Options.hold_on)
    set_options(escalate_pairs=0)
    assert plan().escalation is None and plan().escalate_pairs == 0
    set_options(escalate_pairs=77)
    assert plan().escalate_pairs == 77
    made = plan()  # (one plan: two calls may see different free host memory)
    again = type(made).from_dict(made.as_dict())  # a checkpoint's record keeps the escalation's plan
    assert again == made and again.escalation == made.escalation


def test_graph_parts_use_the_budget():
    # Planning only (no GPU needed): what exact_graph would do on a GPU.
    from knng.engine.plan import make_graph_plan

    n, d, k, budget = 1_000_000, 128, 10, 4 * 2**30
    plan = make_graph_plan(n=n, d=d, k=k, metric="euclidean", device=torch.device("cuda"), budget=budget,
                           include_self=False, screen_dtype=torch.float32)
    b = plan.part_size
    # A b × b float32 block with the selection's workspace (~12 bytes per entry) should take a
    # fair share of the budget left after the corpus and the candidate lists (> 1 GB here).
    assert b * b * 12 >= 2**28, f"part size {b}: {-(-n // b)} parts for n = {n}"


@pytest.mark.parametrize("budget", [None, "8MB"])
def test_every_registered_selection_graph(budget, rng, seed, screen):
    from knng.select import available

    x = rng.standard_normal((2500, 6)).astype(np.float32)
    x[2000:] = x[:500]
    oracle = oracle_graph(x, 5)
    base = knng.graph(x, 5, select="topk", memory_budget=budget)
    assert_exact(base, oracle, context=f"seed={seed}")
    if budget is not None:  # the blocked path: row and column selections, merges
        assert last_report().parts > 1
    for name in available():
        g = knng.graph(x, 5, select=name, memory_budget=budget)
        np.testing.assert_array_equal(g.indices, base.indices, err_msg=f"seed={seed} select={name}")
        np.testing.assert_array_equal(g.distances, base.distances, err_msg=f"seed={seed} select={name}")


# ------------------------------------------------------------------ batch index sorting
def _graph_data(rng: np.random.Generator, n: int, data: str) -> np.ndarray:
    """Normals with a quarter of the points duplicated, or small integers (exact ties)."""
    if data == "integer_ties":
        return rng.integers(0, 3, size=(n, 3)).astype(np.int8)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    x[n - n // 4:] = x[rng.integers(0, n - n // 4, n // 4)]
    return x


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("data", ["duplicates", "integer_ties"])
@pytest.mark.parametrize("n,k,budget", [(211, 10, "12KB"), (397, 1, "32KB"), (300, 30, "200KB")])
def test_graph_batch_sort_matches_oracle(metric, data, n, k, budget, rng, seed, screen):
    # The batch index sort seeds the diagonal blocks' thresholds; the answer must not depend on it.
    x = _graph_data(rng, n, data)
    g = knng.graph(x, k, metric=metric, select="batch_sort", memory_budget=budget)
    report = last_report()
    assert report.parts > 1, report
    oracle = oracle_graph(x, k, metric)
    assert_exact(g, oracle, context=f"seed={seed} {data}")
    if oracle.exact_ties:
        np.testing.assert_array_equal(g.indices, oracle.indices, err_msg=f"seed={seed} {data}")


@pytest.mark.parametrize("how", ["held", "flat", "taken", "checkpoint", "finish tightens", "escalated"])
@pytest.mark.parametrize("data,k", [("gaussian", 1), ("gaussian", 9), ("duplicates", 6), ("offset", 5),
                                    ("integers", 12), ("all", 299), ("patches", 7), ("flat patches", 10)])
def test_graph_holding_its_survivors_is_exact(data, k, how, rng, seed, tmp_path, set_options):
    # A GPU graph in a low precision holds its survivors back (Options.hold_on, store.Holding):
    # tightened by selection every `pending` pairs, finished from what is left; over the
    # holding's limit (or for a checkpoint) the store takes them in. Blocks of one centre
    # tighten against the corpus's maxima; image patches, whose principal slabs centre each
    # block on its own part, hold every survivor with its block's norms (Holding.pairs) and
    # tighten with their own radii. Rows that hold more than Options.escalate_pairs are
    # escalated: τ = −∞, their pairs dropped, their rows searched again in float64 at the end
    # (a checkpointed run takes its survivors in and escalates none). Here on the CPU with the reference screen of
    # a fused precision, across parts of sizes that are not multiples of anything: ties,
    # duplicates, huge offsets, integer data, flat image regions, k = 1 and k = n - 1.
    from oracle import smooth_image_patches

    set_options(hold_on=frozenset({"cpu", "cuda"}))
    set_options(screen_precision="tf32")
    set_options(cpu_max_part=70)
    set_options(pending_cpu=300)  # several tightenings
    if how == "taken":
        set_options(held_limit=0)
    if how == "finish tightens":  # as a large run's finish does (a small one evaluates its pairs whole)
        set_options(finish_untightened_pairs=0)
    if how == "flat":  # the finish orders the flat lists, no row padded
        set_options(finish_padded_entries=0, finish_padding=0)
    set_options(escalate_pairs=k + 2 if how == "escalated" else 0)
    x = rng.standard_normal((300 if data == "all" else 333, 6))
    if data == "duplicates":
        x[100:200] = x[:100]
        x[250:260] = x[3]
    elif data == "offset":
        x = x + 1e5
    elif data == "integers":
        x = np.round(2 * x)
    elif data.endswith("patches"):
        x = smooth_image_patches(rng, 333, side=3)
        if data == "flat patches":
            # Near-ties, not folded. Escalated: 60 rows, so that some always escalate (30 left
            # one draw in a dozen with none, their rows just over k + 2 held pairs); held: 30,
            # which stay within the holding's limit (60 outgrow it, and are taken in).
            tied = 60 if how == "escalated" else 30
            x[40:40 + tied] = x[40] + 1e-3 * rng.standard_normal((tied, x.shape[1]))
    options = dict(checkpoint=tmp_path / "ck", checkpoint_interval=0, keep_checkpoint=True) if how == "checkpoint" else {}
    g = knng.graph(x, k, device="cpu", **options)
    report = last_report()
    assert (report.parts > 1 or data == "all") and report.screen_dtype == "tf32"
    calls = report.stages
    assert calls.get("store.hold", 0) + calls.get("store.hold_pairs", 0) > 0, calls
    assert ("graph.escalated_rows" in calls) == (report.rows_escalated > 0), (calls, report.rows_escalated)
    # Near-ties and duplicates hold more than k + 2 pairs a row; nothing escalates otherwise.
    assert report.rows_escalated == 0 or how == "escalated", report.rows_escalated
    assert report.rows_escalated > 0 or not (how == "escalated" and data in ("duplicates", "integers", "flat patches")), \
        report.rows_escalated
    if report.rows_escalated:  # the command line's summary says so
        from knng.cli.console import exact_line

        assert f"{report.rows_escalated:,} rows of near-ties searched again" in exact_line(report)
    held = how in ("held", "flat", "finish tightens", "escalated")
    assert ("store.finish_held" in calls) == held and ("store.take_held" in calls) != held, calls
    if data.endswith("patches"):  # blocks centred on their own parts: pairs with their norms
        assert knng.get_options().hold_pairs and last_report().plan.frames == "principal"
        assert "store.tighten_held_pairs" in calls or how in ("taken", "checkpoint"), calls
    assert_exact(g, oracle_graph(x, k), context=f"seed={seed} {data} {how}")
    if how == "checkpoint":
        again = knng.graph(x, k, device="cpu", checkpoint=tmp_path / "ck", resume=True)
        np.testing.assert_array_equal(again.indices, g.indices)
        np.testing.assert_array_equal(again.distances, g.distances)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("include_self", [False, True])
@pytest.mark.parametrize("k", [1, 7, "all"])
def test_escalated_rows_are_exact_in_every_metric(metric, include_self, k, rng, seed, set_options):
    # Escalation with most rows over a tiny escalate_pairs: every metric (the inner product runs
    # by rows, which escalates nothing), the point itself kept or not, k = 1 to every point;
    # near-ties of a flat region, unfolded copies and data far from the origin.
    from oracle import smooth_image_patches

    set_options(hold_on=frozenset({"cpu", "cuda"}), screen_precision="tf32", cpu_max_part=60, pending_cpu=200,
                fold_duplicates=False)
    n = 257
    x = smooth_image_patches(rng, n, side=3).astype(np.float64)
    x[30:90] = x[30] + 1e-4 * rng.standard_normal((60, x.shape[1]))
    x[200:230] = x[:30]
    x[230:] += 1e3
    k = (n if include_self else n - 1) if k == "all" else k
    set_options(escalate_pairs=max(1, k // 2))
    g = knng.graph(x, k, metric=metric, include_self=include_self, device="cpu")
    assert (last_report().rows_escalated > 0) == (last_report().plan.graph_method == "symmetric"), last_report()
    assert_exact(g, oracle_graph(x, k, metric, include_self=include_self), context=f"seed={seed} {metric} k={k}")


def test_own_part_seed_positions_are_distinct_and_span_the_part():
    # The own parts' sample columns: evenly spaced, first and last included, distinct without a
    # ``unique`` (integer steps of at least one), all of a part smaller than the sample.
    from knng.engine.graph.blocks import _evenly_spaced  # a helper of the own blocks' seeds

    for m in (1, 2, 3, 10, 8191, 8192, 8193, 28_672):
        for count in (1, 2, 5, 8192):
            at = _evenly_spaced(m, count, torch.device("cpu"))
            assert at.numel() == min(m, count) and int(at[0]) == 0 and int(at.max()) < m
            assert bool((at.diff() > 0).all())
            if 1 < count:
                assert int(at[-1]) == m - 1


def test_held_pairs_are_taken_in_beyond_the_stores_own_entries():
    # A GPU graph's holding store takes its held survivors in beyond as many as its own entries,
    # and never below four flushes' worth, whatever the budget: taking them in sooner costs more
    # memory than holding them (plan.held_pairs_limit).
    import knng.engine.plan as plan

    pending = 1 << 22
    assert plan.held_pairs_limit(10**6, 18, pending) == 18 * 10**6  # the store's size
    assert plan.held_pairs_limit(10**5, 18, pending) == 4 * pending


@pytest.mark.parametrize("select", ["topk", "qms", "batch_sort"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("width", [1, 5, 40, 64])
def test_survivors_of_smallest_equal_the_whole_compare(select, dtype, width, rng, seed):
    """Survivors taken from each row's smallest entries (``screen.survivors_of_smallest``) are
    the whole block's compare (``row_survivors``), as sets: on rows with ties across the
    selection's edge, keys that differ below float32 rounding, thresholds exactly on a key,
    between floats, above every key and infinite, and a selection of every column."""
    from knng.engine import screen, thresholds

    m, cols = 12, 64
    scores = torch.from_numpy(rng.standard_normal((m, cols))).to(dtype)
    scores[1] = 0.5  # one value across the row: every entry tied
    scores[2, ::2] = 1.0 + 2.0**-40  # equal in float32, not in float64
    scores[2, 1::2] = 1.0
    scores[3, :20] = -3.0  # a block of ties at the bottom
    kth = torch.sort(scores, dim=1).values[:, min(width, cols) - 1].to(torch.float64)
    thr = kth.clone()
    thr[4] = torch.inf
    thr[5] = kth[5] + 1e-12  # between floats of either dtype
    thr[6] = -torch.inf
    thr[7] = float(scores[7].max())
    thr[8] = torch.nextafter(kth[8], torch.tensor(-torch.inf, dtype=torch.float64))
    values, positions = thresholds.smallest_candidates(scores, width, select, torch.device("cpu"))
    kept, rest = screen.survivors_of_smallest(scores, values, positions, thr)
    whole = screen.row_survivors(scores, thr)
    r, c = torch.nonzero(kept, as_tuple=True)
    assert not set(r.tolist()) & set(rest.owner.tolist())  # a row is taken from its selection or compared whole
    found = sorted(zip(r.tolist(), positions[r, c].tolist(), values[r, c].tolist()))
    found += zip(rest.owner.tolist(), rest.other.tolist(), rest.keys.tolist())
    assert sorted(found) == sorted(zip(whole.owner.tolist(), whole.other.tolist(), whole.keys.tolist())), \
        f"seed={seed} width={width} dtype={dtype} select={select}"


@pytest.mark.parametrize("data", ["gaussian", "duplicates", "shell", "offset", "integers", "flat"])
@pytest.mark.parametrize("name", ["float64", "float32"])
def test_graph_survivors_from_each_rows_smallest_is_exact(data, name, monkeypatch, rng, seed, set_options):
    """A whole own block whose rows' survivors come from their smallest entries
    (``Options.whole_by_smallest_on``, a GPU's, forced on the CPU from k = 1) and go into the
    store in place (``CandidateStore.take_whole_rows``): exact on ties, duplicates past the
    selection's margin, a row whose tied survivors fit its selection but not the store's
    capacity, huge offsets, integer data and a flat region, at k = 1, a k whose margin takes
    every column, and k = n − 1, in one part and in several."""
    from knng.engine.store import CandidateStore

    set_options(whole_by_smallest_on=frozenset({"cpu"}))
    set_options(whole_by_smallest_min_k=1)
    set_options(screen_precision=name)
    widest = []
    real_take = CandidateStore.take_whole_rows

    def take(store, rows, cols, keys, rad, kept):
        widest.append(int(kept.sum(dim=1).max()) - store.capacity)
        return real_take(store, rows, cols, keys, rad, kept)

    monkeypatch.setattr(CandidateStore, "take_whole_rows", take)
    n = 263
    x = rng.standard_normal((n, 5))
    if data == "duplicates":
        x[100:200] = x[0]  # 101 copies of one point: more than any margin
    elif data == "shell":
        # 53 distinct points at one distance from the origin (three coordinates ±1): at k = 40
        # the origin's selection of 56 holds them all and a farther point, its store only 50.
        shell = np.array([v for v in np.ndindex(3, 3, 3, 3, 3) if sum(c != 1 for c in v) == 3], dtype=float) - 1
        x = 10 * x
        x[0] = 0.0
        x[1:54] = shell[:53]
        x = x + 1e5
    elif data == "integers":
        x = np.round(2 * x)
    elif data == "flat":
        x[:150] = 0.25
    for k, budget in ((1, None), (9, None), (40, None), (40, "40KB"), (250, None), (n - 1, None)):
        widest.clear()
        g = knng.graph(x, k, memory_budget=budget, device="cpu")
        assert last_report().screen_dtype == name and last_report().stages.get("screen.whole_by_smallest")
        assert_exact(g, oracle_graph(x, k), context=f"seed={seed} {data} {name} k={k} budget={budget}")
        if data == "shell" and k == 40 and budget is None:
            assert max(widest) > 0  # the origin's row went through the store's merge


def test_the_device_peak_is_stated_on_gpus_only(rng):
    # torch does not count host memory: a CPU run states no device peak rather than a wrong one
    # (the GPU's figure: tests/engine/test_gpu.py).
    x = rng.standard_normal((300, 8)).astype(np.float32)
    for result in (knng.graph(x, 5, device="cpu"), knng.search(x[:20], x, 5, device="cpu")):
        assert result.report.device_peak is None and not result.report.device_peak_is_bound
