"""The direct path of small calls (``knng.engine.search.direct_neighbours``): one product, each row's k + m best,
a certificate, the exact finish; rows the certificate cannot vouch for go through the plan's
pipeline.

Every answer is checked against the float64 oracle by differences, and against the block
pipeline's answer (``Options.direct_max_scores = 0``) bit for bit: the direct path must change
nothing but the time.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import knng
from knng._inputs import as_input
from knng.engine import search as engine_search
from knng.engine.plan import direct_applies, make_graph_plan, make_search_plan
from knng.engine.stages import recording as stages_recording
from knng.metrics import get_metric
from oracle import assert_exact, oracle_graph, oracle_search

pytestmark = pytest.mark.direct

PIPELINE = {"direct_max_scores": 0, "direct_max_scores_gpu": 0}


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Where the call runs: the CPU, or a GPU (``-m gpu``), whose product is TF32's."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    return request.param


def _cases(rng: np.random.Generator, name: str, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d))
    if name == "ties":  # integer points: many equal distances, more than the margin at the k-th
        x = np.round(2 * x)
    elif name == "duplicates":  # groups of identical rows, one larger than k + m
        x[n // 2: n // 2 + 40] = x[3]
        x[1::7] = x[0::7][: len(x[1::7])]
    elif name == "offset":  # far from the origin: the float32 expansion's rounding is large
        x = x + 1e4
    elif name == "flat":  # image patches with flat regions on the grey lattice
        x = np.clip(np.round(x * 20 + 128), 0, 255)
        x[: n // 3] = 128
        x /= 255.0
    return x.astype(np.float32)


def _both(call):
    """``call()`` on the direct path and through the pipeline, and the direct run's report."""
    got = call()
    report = got.report
    with knng.options(**PIPELINE):
        ref = call()
    assert not ref.report.plan.direct
    return got, ref, report


@pytest.mark.parametrize("name", ["gauss", "ties", "duplicates", "offset", "flat"])
@pytest.mark.parametrize("k, include_self", [(1, False), (7, False), (7, True), (30, False)])
def test_graph_is_exact_and_the_pipelines(rng, seed, name, k, include_self, device):
    x = _cases(rng, name, 601, 9)
    got, ref, report = _both(lambda: knng.graph(x, k, include_self=include_self, device=device))
    assert report.plan.direct and report.stages.get("direct") == 1, report.stages
    assert_exact(got, oracle_graph(x, k, include_self=include_self), context=f"{name} seed={seed}")
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)


@pytest.mark.parametrize("name", ["gauss", "ties", "duplicates", "offset", "flat"])
@pytest.mark.parametrize("k", [1, 10, 64])
def test_search_is_exact_and_the_pipelines(rng, seed, name, k, device):
    c = _cases(rng, name, 1003, 12)
    q = np.concatenate([_cases(rng, name, 37, 12), c[:5]])  # some queries are corpus points
    got, ref, report = _both(lambda: knng.search(q, c, k, device=device))
    assert report.plan.direct and report.stages.get("direct") == 1, report.stages
    assert_exact(got, oracle_search(q, c, k), context=f"{name} seed={seed}")
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)


def test_ties_past_the_margin_take_a_wider_pass(rng, device):
    """Integer points whose k-th distance is shared by more than m others cannot be certified
    with k + m candidates: those rows, and only those, go through a second pass with
    ``DIRECT_WIDER`` times as many, which certifies them."""
    x = _cases(rng, "ties", 500, 3)
    got, ref, report = _both(lambda: knng.graph(x, 5, device=device))
    assert report.stages.get("direct.wider") == 1 and "direct.uncertified" not in report.stages, report.stages
    width = 5 + engine_search.DIRECT_MARGIN
    summary = report.evaluations_per_row
    assert summary["median"] == width and summary["max"] == width * (1 + engine_search.DIRECT_WIDER), summary
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)
    assert_exact(got, oracle_graph(x, 5))


def test_ties_past_the_wider_pass_go_through_the_pipeline(rng, device):
    """A group of 300 identical rows: a member's k nearest are its twins, at distance 0 with more
    twins than either pass keeps; those rows, and only those, are answered by the plan's
    pipeline."""
    x = _cases(rng, "gauss", 900, 4)
    x[100:400] = x[100]
    got, ref, report = _both(lambda: knng.graph(x, 5, device=device))
    assert report.stages.get("direct.uncertified") == 1, report.stages
    assert report.exact.rows >= 600
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)
    assert_exact(got, oracle_graph(x, 5))


def test_near_ties_within_float32s_reach_are_certified(rng, device):
    """Ten points at distance 1 from the queries, forty at 1 + 10⁻⁴, the rest at 3: the float32
    product's bound separates the k-th from the w-th (a TF32 product's would not), and no row
    reaches the pipeline."""
    d = 8
    directions = rng.standard_normal((600, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radius = np.full(600, 3.0)
    radius[:10], radius[10:50] = 1.0, 1.0 + 1e-4
    c = (directions * radius[:, None]).astype(np.float32)
    q = np.zeros((4, d), dtype=np.float32)
    got, ref, report = _both(lambda: knng.search(q, c, 10, device=device))
    assert report.plan.direct and "direct.uncertified" not in report.stages, report.stages
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)
    assert_exact(got, oracle_search(q, c, 10))


def test_every_candidate_kept_needs_no_certificate(rng):
    """k = n − 1 (a graph) and k = n (a search): every vector is a candidate."""
    x = _cases(rng, "ties", 40, 2)
    g = knng.graph(x, 39, device="cpu")
    assert g.report.plan.direct and "direct.uncertified" not in g.report.stages
    assert_exact(g, oracle_graph(x, 39))
    s = knng.search(x[:3], x, 40, device="cpu")
    assert_exact(s, oracle_search(x[:3], x, 40))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.uint8, np.int8])
def test_input_types(rng, dtype, device):
    """float64 and integer inputs are multiplied in float64, float16 in float32 (exactly; TF32 on a GPU)."""
    x = rng.standard_normal((300, 6)) * (1 if np.dtype(dtype).kind == "f" else 40)
    x = (np.abs(x) if dtype == np.uint8 else x).astype(dtype)
    got, ref, report = _both(lambda: knng.graph(x, 8, device=device))
    assert report.plan.direct
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)
    assert_exact(got, oracle_graph(x.astype(np.float64), 8))


def test_sqeuclidean(rng):
    c = _cases(rng, "gauss", 800, 5)
    got, ref, report = _both(lambda: knng.search(c[:50] + 0.01, c, 6, metric="sqeuclidean", device="cpu"))
    assert report.plan.direct
    np.testing.assert_array_equal(got.indices, ref.indices)
    assert_exact(got, oracle_search(c[:50] + 0.01, c, 6, metric="sqeuclidean"))


@pytest.mark.parametrize("where", ["corpus", "queries"])
def test_not_finite_input_is_named(rng, where, device):
    c = _cases(rng, "gauss", 200, 4)
    q = c[:10].copy()
    (c if where == "corpus" else q)[7, 2] = np.nan
    with pytest.raises(ValueError, match=where):
        knng.search(q, c, 3, device=device)


def test_scores_that_could_overflow_go_through_the_pipeline(rng, device):
    """float32 rows of norm 10²⁰ are finite, their squares are not: the direct path declines and
    the pipeline gives its verdict (an error that says what to do), as it would without it."""
    x = (rng.standard_normal((300, 4)) * 1e20).astype(np.float32)
    with pytest.raises(ValueError, match="rescale the data"):
        knng.graph(x, 3, device=device)
    with pytest.raises(ValueError, match="rescale the data"):
        knng.search(x[:5], x, 3, device=device)
    # Every point a candidate (k = n − 1): no certificate is asked, so the overflow must be
    # caught before the product.
    with pytest.raises(ValueError, match="rescale the data"):
        knng.graph(x[:12], 11, device=device)


def test_the_certificate_bounds_the_rounding(rng):
    """Scores computed as the direct path computes them (rows centred on the corpus's mean in
    float32, or as they are, then the float32 expansion), plus the row's own squared norm,
    against the float64 squared distances of the original rows: every error is within the
    certificate's bound, on points far from the origin and near it."""
    for offset, centred in ((1e4, True), (0.0, True), (0.0, False), (0.2, False)):
        c = torch.from_numpy((rng.standard_normal((500, 16)) + offset).astype(np.float32))
        q = c[:60] + torch.from_numpy(rng.standard_normal((60, 16)).astype(np.float32)) * 1e-3
        mean = c.mean(dim=0) if centred else torch.zeros(16)
        cc, qc = c - mean, q - mean
        c_norms, q_norms = torch.linalg.vector_norm(cc, dim=1), torch.linalg.vector_norm(qc, dim=1)
        scores = torch.addmm((c_norms ** 2)[None, :], qc, cc.T, beta=1, alpha=-2).double()
        got = scores + (qc.double() ** 2).sum(1)[:, None]
        exact = ((q.double()[:, None, :] - c.double()[None, :, :]) ** 2).sum(-1)  # by differences
        bound = engine_search.direct_rounding_bound(float(c_norms.max()), q_norms.double(), 16, torch.float32)
        # The direct path computes it on the device from the largest norm as a tensor: the same.
        on_device = engine_search.direct_rounding_bound(c_norms.max().double(), q_norms.double(), 16, torch.float32)
        torch.testing.assert_close(on_device, bound, rtol=1e-15, atol=0)
        assert ((got - exact).abs() <= bound[:, None]).all(), offset
        assert ((got - exact).abs().amax(dim=1) > bound / 1000).any(), offset  # not loose by 1000×


def test_the_planner_takes_the_direct_path_only_where_it_applies():
    cpu = torch.device("cpu")
    common = dict(d=16, k=10, device=cpu, budget=1 << 30)
    assert make_search_plan(n_queries=100, n_corpus=10_000, metric="euclidean", **common).direct
    assert make_graph_plan(n=2000, metric="euclidean", include_self=False, **common).direct
    # The search of a direct graph's uncertified rows is planned under the graph's host budget,
    # and says where it came from as the graph's plan does.
    budgeted = make_graph_plan(n=2000, metric="euclidean", include_self=False, host_budget=1 << 30,
                               host_source="the caller's host_memory_budget", **common)
    assert budgeted.direct and budgeted.search.host_budget_source == budgeted.host_budget_source
    assert budgeted.search.host_budget == budgeted.host_budget
    assert not make_search_plan(n_queries=100, n_corpus=10_000, metric="cosine", **common).direct
    assert not make_search_plan(n_queries=100, n_corpus=10_000, metric="euclidean", screen_dtype="float64",
                                **common).direct
    assert not make_graph_plan(n=2000, metric="euclidean", include_self=False, part_size=1000, **common).direct
    assert not make_graph_plan(n=2000, metric="euclidean", include_self=False, share=(0, 2), **common).direct
    assert not make_graph_plan(n=2000, metric="euclidean", include_self=False, recorded=True, **common).direct
    assert not make_graph_plan(n=3000, metric="euclidean", include_self=False, **common).direct  # 9M scores > 2²²
    with knng.options(direct_max_scores=0):
        assert not make_search_plan(n_queries=100, n_corpus=10_000, metric="euclidean", **common).direct
    assert not direct_applies(n_queries=10, n_corpus=10_000, d=1000, metric="euclidean", device=cpu, budget=1 << 20)
    # The whole corpus is read into memory: a host budget that cannot hold it keeps the pipeline.
    assert not direct_applies(n_queries=10, n_corpus=6000, d=1000, metric="euclidean", device=cpu, budget=1 << 30,
                              host_budget=4 << 20)
    assert not make_search_plan(n_queries=10, n_corpus=6000, metric="euclidean", host_budget=4 << 20,
                                **{**common, "d": 1000}).direct
    gpu = torch.device("cuda", 0)  # planned for, not used: a GPU's limit is its own
    assert direct_applies(n_queries=100, n_corpus=1_000_000, d=16, metric="euclidean", device=gpu, budget=1 << 33)
    assert not direct_applies(n_queries=1000, n_corpus=1_000_000, d=16, metric="euclidean", device=gpu,
                              budget=1 << 33)
    with knng.options(direct_max_scores_gpu=0):
        assert not direct_applies(n_queries=100, n_corpus=10_000, d=16, metric="euclidean", device=gpu,
                                  budget=1 << 30)
    with knng.options(direct_max_scores=0):
        assert direct_applies(n_queries=100, n_corpus=10_000, d=16, metric="euclidean", device=gpu, budget=1 << 30)
    # Where k·d outweighs the row length a GPU's pipeline screens in float64 and evaluates few
    # pairs; the direct path would evaluate all its k + m candidates a row.
    wide = dict(n_queries=16_384, n_corpus=16_384, d=4_096, metric="euclidean", device=gpu, budget=1 << 36, graph=True)
    assert not direct_applies(k=1_024, **wide)
    assert direct_applies(k=1, **wide)
    small = {**wide, "n_queries": 2_000, "n_corpus": 2_000, "device": cpu}
    assert direct_applies(k=1_024, **small)  # a CPU's direct path was measured without this rule


def test_a_checkpointed_call_runs_the_pipeline(rng, tmp_path):
    """A caller who asks for checkpoints gets the steps saved (the command line always asks)."""
    x = _cases(rng, "gauss", 400, 5)
    g = knng.graph(x, 5, device="cpu", checkpoint=tmp_path / "ckpt")
    assert not g.report.plan.direct and "direct" not in g.report.stages
    assert_exact(g, oracle_graph(x, 5))


@pytest.mark.parametrize("include_self", [False, True])
def test_rows_in_chunks(rng, include_self):
    """A budget of 1 MB leaves the scores 64 KB a chunk: the rows go about nine at a time."""
    x = _cases(rng, "duplicates", 601, 9)
    got, ref, report = _both(lambda: knng.graph(x, 6, include_self=include_self, device="cpu", memory_budget="1MB"))
    assert report.plan.direct and report.plan.work_bytes // (3 * 601 * 4) < 601
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)
    assert_exact(got, oracle_graph(x, 6, include_self=include_self))


@pytest.mark.parametrize("offset, centred", [(0.0, False), (0.1, False), (0.5, True), (3.0, True), (1e4, True)])
def test_rows_are_centred_only_far_from_the_origin(rng, offset, centred, device):
    """The direct path centres the rows where a sample's mean lies far from the origin next to
    its spread (``DIRECT_CENTRE_FAR``: N(offset, 1) in 16 dimensions passes at offset 0.25) and
    multiplies them as they are near it; exact either way, and the pipeline's answer bit for bit,
    near the rule's edge too."""
    x = (rng.standard_normal((700, 16)) + offset).astype(np.float32)
    q = x[:40] + (rng.standard_normal((40, 16)) * 0.3).astype(np.float32)
    got, ref, report = _both(lambda: knng.graph(x, 6, device=device))
    assert report.plan.direct and (report.stages.get("direct.centred") == 1) == centred, report.stages
    assert_exact(got, oracle_graph(x, 6))
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_array_equal(got.distances, ref.distances)
    found, ref, report = _both(lambda: knng.search(q, x, 9, device=device))
    assert report.plan.direct and (report.stages.get("direct.centred") == 1) == centred, report.stages
    assert_exact(found, oracle_search(q, x, 9))
    np.testing.assert_array_equal(found.indices, ref.indices)


def _synchronisations(call):
    """``call()``'s result and how often each of knng's sites made the host wait for the GPU
    (torch's sync debug mode; turning it off warns of itself, from torch.cuda: not counted)."""
    sites: Counter = Counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            found = call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            sites[str(w.filename)] += 1
    return found, {site: count for site, count in sites.items() if "/knng/" in site}


@pytest.mark.gpu
def test_the_direct_path_waits_for_the_gpu_only_before_its_product_and_at_its_end(rng):
    """On a GPU the direct path synchronises with the host twice: on the centring's sample,
    before any large work is queued, and at the end (finite inputs, failed rows). A third in
    between leaves the GPU idle while the host issues the rest of the call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = torch.from_numpy(_cases(rng, "gauss", 3000, 32)).cuda()
    knng.graph(x, 10)  # warm: kernels and the allocator
    data = as_input(x, "x")
    with knng.options(background_compile=False):
        found, ours = _synchronisations(lambda: engine_search.direct_neighbours(
            data, data, 10, get_metric("euclidean"), torch.device("cuda"), 1 << 30, exclude_self=True))
    assert found is not None and found.failed.numel() == 0
    assert sum(ours.values()) == 2 and all(site.endswith("direct.py") for site in ours), ours


@pytest.mark.gpu
def test_a_replayed_pass_waits_for_the_gpu_as_often(rng):
    """A call that replays its first pass (``Options.direct_graphs``) synchronises with the host
    as a call that runs it: on the sample and at the end; the capture's lock, its event and the
    copies out wait for nothing on the host."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    engine_search.direct.release_captured()
    x = torch.from_numpy(_cases(rng, "gauss", 3000, 32)).cuda()
    data = as_input(x, "x")

    def call():
        return engine_search.direct_neighbours(data, data, 10, get_metric("euclidean"), torch.device("cuda"),
                                               1 << 30, exclude_self=True)

    with knng.options(background_compile=False):
        call(), call()  # run as it is, then captured
        with stages_recording() as counted:
            found, ours = _synchronisations(call)
    assert counted.get("direct.replayed") == 1, counted
    assert found is not None and found.failed.numel() == 0
    assert sum(ours.values()) == 2 and all(site.endswith("direct.py") for site in ours), ours


def test_answers_are_contiguous_tensors(rng, device):
    """A direct call's answer is each row's first k of its candidates: returned as tensors of
    their own (contiguous), not views of the candidates' rows, for one chunk of rows and several."""
    x = torch.from_numpy(_cases(rng, "gauss", 500, 8)).to(device)
    for budget in (None, 1 << 20):  # 1 MB: chunks of a few rows (test_rows_in_chunks)
        g = knng.graph(x, 7, memory_budget=budget)
        s = knng.search(x[:33], x, 9, memory_budget=budget)
        assert g.report.plan.direct and s.report.plan.direct
        for t in (g.indices, g.distances, s.indices, s.distances):
            assert isinstance(t, torch.Tensor) and t.is_contiguous() and t.device == x.device


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gauss", "offset", "duplicates"])
def test_repeated_calls_replay_the_first_pass_with_the_same_answers(rng, name):
    """On a GPU a kind's second call captures its first pass as a CUDA graph and later calls
    replay it (``Options.direct_graphs``): every answer equal bit for bit to the pass run as it
    is, for new queries each call, a corpus changed in place between calls (a replay reads the
    memory the capture read), centred rows (``offset``), rows the first pass cannot certify
    (``duplicates``: the second pass runs on the replay's outputs) and on another stream."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    engine_search.direct.release_captured()
    x = torch.from_numpy(_cases(rng, name, 2000, 24)).cuda()

    def same_as_unreplayed(call):
        got = call()
        with knng.options(direct_graphs=0):
            ref = call()
        assert torch.equal(got.indices, ref.indices) and torch.equal(got.distances, ref.distances)
        return got

    def replayed(found) -> int:
        return found.report.stages.get("direct.replayed", 0)

    with knng.options(background_compile=False):  # one options object: one kind for every call
        graphs = [same_as_unreplayed(lambda: knng.graph(x, 10)) for _ in range(4)]
        # The first call runs the pass as it is, the second captures it and replays it.
        assert [replayed(g) for g in graphs] == [0, 1, 1, 1], [g.report.stages for g in graphs]
        stages = [{s: c for s, c in g.report.stages.items() if s != "direct.replayed"} for g in graphs]
        assert all(s == stages[0] for s in stages), stages
        assert_exact(graphs[-1], oracle_graph(x.cpu().numpy(), 10))
        for i in range(5):
            q = torch.from_numpy(_cases(rng, name, 37, 24)).cuda()
            if i == 3:
                x[::3] *= 1.5  # the corpus changed where it lies
            found = same_as_unreplayed(lambda: knng.search(q, x, 9))
            assert replayed(found) == (i >= 1), (i, found.report.stages)
            assert_exact(found, oracle_search(q.cpu().numpy(), x.cpu().numpy(), 9))
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            found = same_as_unreplayed(lambda: knng.search(q, x, 9))
        assert replayed(found) == 1
        assert_exact(found, oracle_search(q.cpu().numpy(), x.cpu().numpy(), 9))


@pytest.mark.gpu
def test_captures_are_bounded(rng):
    """At most ``Options.direct_graphs`` captures are kept (least recently used out), none of a
    pass larger than ``Options.direct_graph_max_bytes``, none with 0."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    direct = engine_search.direct
    direct.release_captured()
    x = torch.from_numpy(_cases(rng, "gauss", 1000, 16)).cuda()
    with knng.options(background_compile=False, direct_graphs=1):
        for _ in range(3):
            for k in (5, 6):
                knng.graph(x, k)
        assert len(direct._CAPTURED) == 1
    direct.release_captured()
    for limits in ({"direct_graph_max_bytes": 1000 * 1000 * 4 - 1}, {"direct_graphs": 0}):
        with knng.options(background_compile=False, **limits):
            reports = [knng.graph(x, 5).report for _ in range(3)]
        assert not any(r.stages.get("direct.replayed") for r in reports) and not direct._CAPTURED


def test_the_midpoint_check_is_read_with_the_certificate(rng, device):
    """The direct path reads whether any answer lies near a float32 midpoint with its last
    synchronisation: where none does, the report says the answer is settled already
    (``rounded_as_exact``, the API's own check skipped) and it equals the pipeline's, which
    checks; where one does (an integer distance on a midpoint: 4096² + 1 between the float32
    values 2²⁴ and 2²⁴ + 2), the API settles it on the even float32, the exact value's."""
    x = torch.from_numpy(_cases(rng, "gauss", 400, 16)).to(device)
    found, ref, report = _both(lambda: knng.graph(x, 6))
    assert report.plan.direct and report.rounded_as_exact
    np.testing.assert_array_equal(found.distances.cpu(), ref.distances.cpu())
    on_midpoint = torch.tensor([[4096, 1], [0, 0], [9000, 9000]], dtype=torch.float32, device=device)
    g = knng.graph(on_midpoint, 1, metric="sqeuclidean")
    assert g.report.plan.direct and not g.report.rounded_as_exact
    assert g.distances[0, 0].item() == 16777216.0 and g.distances[1, 0].item() == 16777216.0


@pytest.mark.gpu
def test_threads_take_turns_on_a_capture(rng):
    """Calls of one kind from several threads, each on its own stream, share one capture: each
    gets its own queries' answer (the capture's buffers are used by one call at a time)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    import threading

    from knng.engine.kernels.compiling import wait_for_kernels

    direct = engine_search.direct
    direct.release_captured()
    x = torch.from_numpy(_cases(rng, "gauss", 3000, 32)).cuda()
    queries = [torch.from_numpy(_cases(rng, "gauss", 50, 32)).cuda() for _ in range(6)]
    with knng.options(direct_graphs=0):
        want = [knng.search(q, x, 8) for q in queries]
    failures: list[str] = []
    as_it_is: list[int] = []

    def work(t: int) -> None:  # a thread's options are the defaults: one kind for every thread
        with torch.cuda.stream(torch.cuda.Stream()):
            for i in range(30):
                j = (t + i) % len(queries)
                got = knng.search(queries[j], x, 8)
                if not torch.equal(got.indices, want[j].indices):
                    failures.append(f"thread {t}, call {i}: {got.report.stages}")
                if not got.report.stages.get("direct.replayed"):
                    as_it_is.append(t)

    knng.search(queries[0], x, 8)  # the kind's kernels compiled (this thread's options are the tests')
    wait_for_kernels()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert len(as_it_is) == 1, as_it_is  # the kind's first call in the threads' options; the next captures
    assert len(direct._CAPTURED) == 1
