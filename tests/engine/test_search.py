"""knng.search against the float64 oracle: every metric × input dtype × input kind, output
kinds, tile and memory-budget independence, edge shapes, selection registry, OOM retries."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from knng.select import available
from oracle import (
    DTYPES, KINDS, METRICS, assert_exact, assert_output_kind, kind_supports, oracle_search,
    random_values,
)

CASES = [(kind, dtype) for kind in KINDS for dtype in DTYPES if kind_supports(kind, dtype)]


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("kind,dtype", CASES)
def test_search_matches_oracle(metric, kind, dtype, rng, seed, as_kind, screen):
    d = 24
    corpus = as_kind(random_values(rng, (300, d), dtype), kind, dtype, "corpus")
    queries = as_kind(random_values(rng, (37, d), dtype), kind, dtype, "queries")
    res = knng.search(queries, corpus, 9, metric=metric)
    assert_output_kind(res, queries, k=9)
    assert_exact(res, oracle_search(queries, corpus, 9, metric), context=f"seed={seed} {kind} {dtype}")


@pytest.mark.parametrize("metric", METRICS)
def test_search_nested_lists(metric, rng, seed):
    corpus = rng.standard_normal((12, 3)).round(2).tolist()
    queries = rng.standard_normal((2, 3)).round(2).tolist()
    res = knng.search(queries, corpus, 4, metric=metric)
    assert_output_kind(res, np.zeros(1), k=4)
    assert_exact(res, oracle_search(queries, corpus, 4, metric), context=f"seed={seed}")


@pytest.mark.parametrize("qkind,ckind", [("numpy", "torch"), ("torch", "memmap"), ("h5py", "numpy_view"),
                                         ("torch_view", "h5py")])
def test_output_follows_queries_kind(qkind, ckind, rng, seed, as_kind):
    corpus = as_kind(random_values(rng, (200, 16), "float32"), ckind, "float32", "corpus")
    queries = as_kind(random_values(rng, (10, 16), "float32"), qkind, "float32", "queries")
    res = knng.search(queries, corpus, 5)
    assert_output_kind(res, queries, k=5)
    assert_exact(res, oracle_search(queries, corpus, 5), context=f"seed={seed}")


@pytest.mark.parametrize("qdtype,cdtype", [("float16", "uint8"), ("int8", "float64"), ("bfloat16", "float32"),
                                           ("uint8", "int8")])
@pytest.mark.parametrize("metric", METRICS)
def test_mixed_dtypes(qdtype, cdtype, metric, rng, seed, as_kind):
    corpus = as_kind(random_values(rng, (150, 12), cdtype), "torch", cdtype)
    queries = as_kind(random_values(rng, (20, 12), qdtype), "torch", qdtype)
    res = knng.search(queries, corpus, 6, metric=metric)
    assert_exact(res, oracle_search(queries, corpus, 6, metric), context=f"seed={seed}")


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "auto"])
def test_explicit_cpu_device(device, rng, seed):
    x = rng.standard_normal((100, 8)).astype(np.float32)
    res = knng.search(x[:5], x, 3, device=device)
    assert_output_kind(res, x, k=3)
    assert_exact(res, oracle_search(x[:5], x, 3), context=f"seed={seed}")


def test_progress_bar_runs(rng, capsys):
    x = rng.standard_normal((100, 8)).astype(np.float32)
    res = knng.search(x, x, 2, progress=True)
    assert (res.indices[:, 0] == np.arange(100)).all()


# ------------------------------------------------------------------------ tiles and budgets
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("corpus_kind", ["numpy", "memmap"])
def test_results_identical_across_budgets(metric, corpus_kind, rng, seed, as_kind, screen):
    n, d, k = 1009, 32, 10
    corpus = as_kind(random_values(rng, (n, d), "float32") + 3.0, corpus_kind, "float32")
    queries = random_values(rng, (211, d), "float32") + 3.0
    outs, plans = [], []
    for budget in ("64KB", "1MB", None):
        res = knng.search(queries, corpus, k, metric=metric, memory_budget=budget)
        outs.append(res)
        plans.append(last_report().plan)
    # Tiny budgets really do stream the corpus in small tiles; the default keeps it resident.
    assert plans[0].corpus_resident is False and plans[2].corpus_resident is True, plans
    assert plans[0].corpus_cols < n and plans[0].query_rows < len(queries), plans[0]
    assert len({(p.query_rows, p.corpus_cols) for p in plans}) == 3, plans
    for res in outs[1:]:
        np.testing.assert_array_equal(res.indices, outs[0].indices)
        np.testing.assert_array_equal(res.distances.view(np.int32), outs[0].distances.view(np.int32))
    assert_exact(outs[0], oracle_search(queries, corpus, k, metric), context=f"seed={seed}")


@pytest.mark.parametrize("k", [1, 30, 1009])
def test_tiny_budget_any_k(k, rng, seed, screen):
    x = rng.standard_normal((1009, 5))
    q = rng.standard_normal((13, 5))
    res = knng.search(q, x, k, memory_budget="16KB")
    assert last_report().plan.corpus_resident is False
    assert_exact(res, oracle_search(q, x, k), context=f"seed={seed}")


# ----------------------------------------------------------------------------- edge shapes
@pytest.mark.parametrize("n,d,k", [(997, 3, 1), (1009, 129, 17), (997, 1, 5), (101, 7, 101), (1, 4, 1),
                                   (2, 2, 2), (1031, 64, 200)])
@pytest.mark.parametrize("metric", METRICS)
def test_edge_shapes(n, d, k, metric, rng, seed, screen):
    corpus = rng.standard_normal((n, d)).astype(np.float32)
    queries = rng.standard_normal((7, d)).astype(np.float32)
    res = knng.search(queries, corpus, k, metric=metric)
    assert_exact(res, oracle_search(queries, corpus, k, metric), context=f"seed={seed}")


@pytest.mark.parametrize("metric", METRICS)
def test_single_query(metric, rng, seed, screen):
    corpus = rng.standard_normal((500, 10))
    q = corpus[123:124] + 1e-3
    res = knng.search(q, corpus, 7, metric=metric)
    assert res.indices.shape == (1, 7)
    assert_exact(res, oracle_search(q, corpus, 7, metric), context=f"seed={seed}")


def test_k_equals_n_returns_whole_corpus_sorted(rng, seed, screen):
    corpus = rng.standard_normal((64, 6))
    q = rng.standard_normal((5, 6))
    res = knng.search(q, corpus, 64)
    assert (np.sort(res.indices, axis=1) == np.arange(64)).all()
    assert_exact(res, oracle_search(q, corpus, 64), context=f"seed={seed}")


def test_integer_exact_ties_broken_by_index(rng, seed, screen):
    # Values 0..2 in 4-d: integer distances, hundreds of exact ties in every row.
    corpus = rng.integers(0, 3, size=(600, 4)).astype(np.uint8)
    q = rng.integers(0, 3, size=(50, 4)).astype(np.uint8)
    for metric in ("euclidean", "sqeuclidean", "inner_product"):
        res = knng.search(q, corpus, 40, metric=metric)
        oracle = oracle_search(q, corpus, 40, metric)
        assert oracle.exact_ties
        assert_exact(res, oracle, context=f"seed={seed} {metric}")
        np.testing.assert_array_equal(res.indices, oracle.indices)


# ------------------------------------------------------------------------ selection registry
def test_selection_registry():
    names = available()
    assert "auto" in names and "topk" in names


@pytest.mark.parametrize("metric", METRICS)
def test_select_topk_equals_auto(metric, rng, seed):
    x = rng.standard_normal((400, 16)).astype(np.float32)
    q = rng.standard_normal((30, 16)).astype(np.float32)
    a = knng.search(q, x, 12, metric=metric, select="auto")
    b = knng.search(q, x, 12, metric=metric, select="topk")
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.distances, b.distances)
    assert_exact(b, oracle_search(q, x, 12, metric), context=f"seed={seed}")


# ----------------------------------------------------------------------------- out of memory
@pytest.mark.parametrize("message", [None, "CUDA out of memory. Tried to allocate 20.00 MiB"])
def test_search_oom_retry(message, oom_once, rng, seed, screen):
    x = rng.standard_normal((700, 16)).astype(np.float32)
    q = rng.standard_normal((300, 16)).astype(np.float32)
    calls = oom_once(message)
    res = knng.search(q, x, 10)
    report = last_report()
    assert calls["n"] > 1
    assert report.oom_retries == 1
    # The report keeps the plan made first and the one the planner made after the error (half
    # the rows or half the columns), on which the search finished.
    first, (after,) = report.plan, report.replans
    assert (after.query_rows, after.corpus_cols) in ((max(8, first.query_rows // 2), first.corpus_cols),
                                                     (first.query_rows, max(10, first.corpus_cols // 2)))
    assert after.query_rows < 300 or after.corpus_cols < 700
    assert_exact(res, oracle_search(q, x, 10), context=f"seed={seed}")


def test_search_other_errors_are_not_retried(oom_once, rng):
    x = rng.standard_normal((50, 4)).astype(np.float32)
    oom_once("some other runtime failure")
    with pytest.raises(RuntimeError, match="some other runtime failure"):
        knng.search(x, x, 3)


@pytest.mark.parametrize("k", [1, 10, 64])
def test_every_registered_selection_is_exact(k, rng, seed, screen):
    # "grouped" (the GPU default for small k) runs on the CPU too when asked for by name.
    x = rng.standard_normal((6000, 8)).astype(np.float32)
    x[5000:] = x[:1000]  # exact ties
    q = rng.standard_normal((40, 8)).astype(np.float32)
    oracle = oracle_search(q, x, k)
    base = knng.search(q, x, k, select="topk")
    assert_exact(base, oracle, context=f"seed={seed}")
    for name in available():
        res = knng.search(q, x, k, select=name)
        np.testing.assert_array_equal(res.indices, base.indices, err_msg=f"seed={seed} select={name}")
        np.testing.assert_array_equal(res.distances, base.distances, err_msg=f"seed={seed} select={name}")


# ------------------------------------------------------------------- thresholds between tiles
@pytest.mark.parametrize("data,k", [("gaussian", 1), ("gaussian", 9), ("duplicates", 9), ("offset", 5),
                                    ("integers", 40)])
def test_tile_thresholds_never_cut_a_true_neighbour(data, k, monkeypatch, rng, seed, screen, set_options):
    # After each corpus tile the store's thresholds tighten from that tile's survivors alone
    # (CandidateStore.tighten); every τ must stay at or above the row's true k-th key, for
    # ties, duplicated points, huge offsets and integer data, and must actually tighten.
    from knng.engine.store import CandidateStore

    x = rng.standard_normal((1500, 6))
    q = rng.standard_normal((11, 6))
    if data == "duplicates":
        x[500:1000] = x[:500]
        q[:5] = x[:5]
    elif data == "offset":
        x, q = x + 1e4, q + 1e4
    elif data == "integers":
        x, q = np.round(4 * x), np.round(4 * q)
    oracle = oracle_search(q, x, k)
    kth = torch.from_numpy(oracle.distances[:, -1].copy())
    seen = {"calls": 0, "tightened": 0}
    chunks: list = []  # (store, its first query row): chunks run in order, one store each
    real = CandidateStore.tighten

    def checked(store, rows, keys, *maxima):
        before = store.tau.clone()
        real(store, rows, keys, *maxima)
        seen["calls"] += 1
        seen["tightened"] += int((store.tau < before).sum())
        if not chunks or chunks[-1][0] is not store:
            chunks.append((store, chunks[-1][1] + chunks[-1][0].n if chunks else 0))
        q0 = chunks[-1][1]
        every = torch.arange(store.n)
        key, slack = store.errors.exact_key(every, kth[q0:q0 + store.n].to(store.tau))
        assert bool((store.tau >= key - slack).all()), (store.tau - key)[store.tau < key - slack]

    monkeypatch.setattr(CandidateStore, "tighten", checked)
    set_options(tighten_on=frozenset({"cpu", "cuda"}))  # by default on GPUs only
    res = knng.search(q, x, k, memory_budget="64KB")
    assert last_report().plan.corpus_cols < 1500
    assert seen["calls"] > 0, seen
    if data != "integers":  # there, the sample's thresholds already sit on the k-th value's ties
        assert seen["tightened"] > 0, seen
    assert_exact(res, oracle, context=f"seed={seed} {data}")


@pytest.mark.parametrize("data", ["gaussian", "duplicates", "offset", "integers"])
def test_kth_strip_seeds_never_cut_a_true_neighbour(data, monkeypatch, rng, seed, screen, set_options):
    # Above k = 32 a GPU search seeds each row's τ from its k-th strip minimum alone
    # (thresholds.kth_of_rows, CandidateStore.tighten_ends with the corpus's largest norm). Forced
    # here on the CPU (strip minima and k-th by their references): every seeded τ must stay at or
    # above the row's true k-th key, and the search must stay exact, on ties, duplicates, huge
    # offsets and integer data.
    from knng.engine.store import CandidateStore
    from knng.metrics import PRECISIONS

    k = 40
    x = rng.standard_normal((5000, 6))
    q = rng.standard_normal((9, 6))
    if data == "duplicates":
        x[2000:4000] = x[:2000]
        q[:4] = x[:4]
    elif data == "offset":
        x, q = x + 1e4, q + 1e4
    elif data == "integers":
        x, q = np.round(3 * x), np.round(3 * q)
    oracle = oracle_search(q, x, k)
    kth = torch.from_numpy(oracle.distances[:, -1].copy())
    seeded = []
    real = CandidateStore.tighten_ends

    def checked(store, first, kth_code, counts, *maxima, counted=True):
        real(store, first, kth_code, counts, *maxima, counted=counted)
        if not counted:
            seeded.append(store.n)
            key, slack = store.errors.exact_key(torch.arange(store.n), kth[:store.n].to(store.tau))
            assert bool((store.tau >= key - slack).all()), (store.tau - key)[store.tau < key - slack]
            assert bool(store.tau.isfinite().all())

    monkeypatch.setattr(CandidateStore, "tighten_ends", checked)
    set_options(cpu_sample=4096)  # 64 strips of 64 sample columns: 2k and more
    set_options(kernels={"strip_seeds": True, "kth_seeds": True})
    res = knng.search(q, x, k)
    # The digit screens seed from a float32 sample with its own norms (search.SeedSample), not here.
    digits = PRECISIONS[last_report().plan.screen_precision].digits
    assert seeded == ([] if digits else [q.shape[0]]), seeded
    assert_exact(res, oracle, context=f"seed={seed} {data}")


@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("data,k", [("gaussian", 1), ("duplicates", 9), ("flat", 7), ("offset", 4),
                                    ("integers", 30), ("all", 300)])
def test_held_survivors_finish_exact(data, k, spill, rng, seed, screen, set_options):
    # Where the tiles tighten the thresholds (GPU searches), the store holds the survivors back,
    # re-screens them against the tightened thresholds after every tile, and its finish
    # evaluates every one left exactly (CandidateStore._finish_held); held lists over their
    # limit are taken into the store, which then finishes them. Both must be exact on ties,
    # duplicates, flat regions, huge offsets, integer data and k = n; tiles of sizes that are
    # not multiples of anything (a small budget).

    x = rng.standard_normal((300 if data == "all" else 1700, 5))
    q = rng.standard_normal((13, 5))
    if data == "duplicates":
        x[600:1200] = x[:600]
        q[:4] = x[:4]
    elif data == "flat":  # a flat region: hundreds of points a hair apart, queries inside it
        x[:900] = 3.0 + rng.integers(0, 2, (900, 5)) * 1e-3
        q[:6] = 3.0
    elif data == "offset":
        x, q = x + 1e5, q + 1e5
    elif data == "integers":
        x, q = np.round(2 * x), np.round(2 * q)
    if spill:  # held lists over their limit at the first tile: the store takes them in
        set_options(held_limit=0)
    set_options(tighten_on=frozenset({"cpu", "cuda"}))
    res = knng.search(q, x, k, memory_budget="64KB")
    calls = last_report().stages
    assert ("store.finish_held" not in calls) == spill and ("store.take_held" in calls) == spill, calls
    assert_exact(res, oracle_search(q, x, k), context=f"seed={seed} {data} spill={spill}")
    report = last_report()
    assert report.screened_per_row["median"] >= k
    assert report.evaluations_per_row["median"] >= (0 if spill else k)


def test_key_codes_sort_as_the_keys(rng):
    # CandidateStore.tighten selects each row's k-th key by its order code: the code must order
    # like the float32 key and decode to the same bits; float64 keys are rounded up.
    from knng.engine.kernels.row_kth import decoded, float32_up, ordered_code

    special = [-np.inf, -3.4e38, -1.0, -1e-40, -0.0, 0.0, 1e-45, 1e-40, 1.0, 3.4e38, np.inf]
    x = torch.from_numpy(np.concatenate([special, rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)])
                         .astype(np.float32))
    codes = ordered_code(x)
    assert int(codes.min()) >= 0 and int(codes.max()) < 2**32
    assert torch.equal(decoded(codes).view(torch.int32), x.view(torch.int32))
    assert torch.equal(x[torch.argsort(codes, stable=True)], torch.sort(x, stable=True).values)
    wide = torch.from_numpy(rng.standard_normal(5000) * 1e3)
    up = float32_up(wide)
    assert up.dtype == torch.float32 and bool((up.double() >= wide).all())
    assert bool((torch.nextafter(up, torch.full_like(up, -np.inf)).double() < wide).all())  # the least such


@pytest.mark.parametrize("shift", [1, 15, 21, 33])
def test_wide_key_codes_sort_and_round_up(rng, shift):
    # A store update sorts (row, upper bound) pairs as one int64 with the row in the top bits:
    # the bound's code keeps 64 − shift bits, in order, and a code rounds up (never down).
    from knng.engine.store.entries import code64_up, rounded_up

    special = [-np.inf, -1.7e308, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1e-300, 1.0, 1.7e308, np.inf]
    x = torch.from_numpy(np.concatenate([special, rng.standard_normal(20000) * 10.0 ** rng.integers(-300, 300, 20000),
                                         1.0 + np.arange(2000) * 2.0**-52]))
    codes = code64_up(x, shift)
    assert int(codes.min()) >= 0 and int(codes.max()) < 2**(64 - shift)
    order = torch.argsort(x, stable=True)
    assert bool((codes[order][1:] >= codes[order][:-1]).all())  # sorted keys give sorted codes
    up = rounded_up(x, shift)
    assert bool((up >= x).all()) and torch.equal(code64_up(up, shift), codes)
    # The packed (row, code) sorts by row first.
    rows = torch.from_numpy(rng.integers(0, 2**(shift - 1), x.numel()))
    packed = rows * 2**(64 - shift) + codes
    assert int(packed.min()) >= 0
    assert torch.equal(packed >> (64 - shift), rows)


@pytest.mark.parametrize("cols", [64 * 32, 64 * 32 + 17, 5000])
@pytest.mark.parametrize("k", [1, 10])
def test_seed_candidates_are_chunk_minima(rng, cols, k):
    # Seeds by chunk minima: k distinct columns per row, the block's own values, each the
    # smallest of its strided chunk (or a column of the ragged tail), and none of the other
    # chunks' minima (or tail entries) smaller than the largest picked one.
    from knng.engine.thresholds import SEED_CHUNK, seed_candidates

    scores = torch.from_numpy(rng.standard_normal((37, cols)))
    scores[:, ::7] = 0.25  # ties
    values, positions = seed_candidates(scores, k, "auto", torch.device("cpu"))
    assert positions.shape == (37, k)
    assert torch.equal(values, scores.gather(1, positions))
    chunks = cols // SEED_CHUNK
    keys = scores.to(torch.float32)
    minima = keys[:, :chunks * SEED_CHUNK].view(37, SEED_CHUNK, chunks).amin(dim=1)
    pool = torch.cat([minima, keys[:, chunks * SEED_CHUNK:]], dim=1)
    for r in range(37):
        assert len(set(positions[r].tolist())) == k
        for c in positions[r].tolist():
            if c < chunks * SEED_CHUNK:
                assert float(keys[r, c]) == float(minima[r, c % chunks])
        assert int((pool[r] < keys[r, positions[r]].max()).sum()) < k


@pytest.mark.parametrize("how", ["held", "flat", "tightened", "finish tightens", "finish takes in", "taken", "state"])
def test_a_holding_store_finishes_exactly(how, rng, set_options):
    # A holding store finishes from its held survivors alone (every one evaluated, ordered by
    # distance then index: ties here); one that took pairs in (over its limit, or a checkpoint's
    # state, or the finish's own tightening over the limit) finishes through the store, and
    # answers the same.
    from knng.engine.store import HoldingStore, Holding, PairErrors
    from knng.metrics import PRECISIONS, get_metric

    x = torch.from_numpy(rng.standard_normal((6, 4)))
    y = torch.from_numpy(rng.standard_normal((40, 4)))
    y[20:] = y[:20]  # every distance twice: ties broken by the smaller index
    errors = PairErrors(metric=get_metric("sqeuclidean"), d=4, precision=PRECISIONS["float32"],
                        row_norms=x.norm(dim=1), row_terms=None, row_offsets=torch.zeros(6, dtype=torch.float64),
                        col_norms=y.norm(dim=1), col_terms=None, centre_norm=0.0)

    def evaluate(rows, cols):  # pairs, or (row, columns) batches
        left = x[rows] if cols.dim() == 1 else x[rows][:, None]
        return ((left - y[cols]) ** 2).sum(-1)

    exact = ((x[:, None] - y[None]) ** 2).sum(-1)
    keys = (exact - (x.norm(dim=1) ** 2)[:, None]).to(torch.float32)  # the screen's key: ‖y‖² − 2xᵀy
    order = torch.randperm(6 * 40, generator=torch.Generator().manual_seed(1))
    rows, cols = torch.arange(6).repeat_interleave(40)[order], torch.arange(40).repeat(6)[order]
    maxima = (float(y.norm(dim=1).max()), 0.0)
    limit = {"taken": 0, "finish takes in": 1}.get(how)
    store = HoldingStore(6, 3, 8, errors, evaluate, torch.device("cpu"),
                         pending=10**6 if how == "finish takes in" else 50, holding=Holding(maxima=maxima, limit=limit))
    for p0 in range(0, rows.numel(), 37):
        store.add(rows[p0:p0 + 37], cols[p0:p0 + 37], keys[rows[p0:p0 + 37], cols[p0:p0 + 37]])
        if how == "tightened":
            store.tighten_held()
    if how == "state":
        store.state()  # takes the held pairs in
    if how == "flat":  # the finish orders the flat lists, no row padded
        store.rebuild_entries = 0
        set_options(finish_padding=0)
    if how in ("finish tightens", "finish takes in"):  # as a large run's finish does (a small one evaluates its pairs whole)
        set_options(finish_untightened_pairs=0)
    assert store._taken_in == (how in ("taken", "state"))
    idx, dist = store.finish()
    want = torch.sort(exact, dim=1, stable=True)
    assert torch.equal(idx, want.indices[:, :3]) and torch.equal(dist, want.values[:, :3])
    assert torch.equal(store.screened_per_row(), torch.full((6,), 40))
    part = store.finish(torch.arange(2, 5))
    assert torch.equal(part[0], idx[2:5]) and torch.equal(part[1], dist[2:5])


@pytest.mark.parametrize("work_bytes", [None, 1 << 20, 2_000])
def test_the_last_take_in_fits_the_work_bytes(work_bytes, rng):
    # The finish takes its pending survivors in by one sort of every pending and held entry
    # where their temporaries fit the store's work bytes; where they do not, it flushes them by
    # ranges of rows without sorting any at once (a 40,000-point CPU graph under 32 MB peaked at
    # 83 MB sorting them, then flushed anyway). The answers are the same, exact, ties by index.
    from knng.engine import stages
    from knng.engine.store import CandidateStore, PairErrors
    from knng.metrics import PRECISIONS, get_metric

    x = torch.from_numpy(rng.standard_normal((30, 4)))
    y = torch.from_numpy(rng.standard_normal((60, 4)))
    y[40:] = y[:20]  # ties
    errors = PairErrors(metric=get_metric("sqeuclidean"), d=4, precision=PRECISIONS["float32"],
                        row_norms=x.norm(dim=1), row_terms=None, row_offsets=torch.zeros(30, dtype=torch.float64),
                        col_norms=y.norm(dim=1), col_terms=None, centre_norm=0.0)

    def evaluate(rows, cols):
        left = x[rows] if cols.dim() == 1 else x[rows][:, None]
        return ((left - y[cols]) ** 2).sum(-1)

    exact = ((x[:, None] - y[None]) ** 2).sum(-1)
    keys = (exact - (x.norm(dim=1) ** 2)[:, None]).to(torch.float32)
    store = CandidateStore(30, 4, 8, errors, evaluate, torch.device("cpu"), pending=10**6, work_bytes=work_bytes)
    rows, cols = torch.arange(30).repeat_interleave(60), torch.arange(60).repeat(30)
    store.add(rows, cols, keys[rows, cols])  # 1,800 pending entries: 100 KB of temporaries
    with stages.recording() as counts:
        idx, dist = store.finish()
    want = torch.sort(exact, dim=1, stable=True)
    assert torch.equal(idx, want.indices[:, :4]) and torch.equal(dist, want.values[:, :4])
    sorted_at_once = work_bytes is None or work_bytes == 1 << 20
    assert counts.get("store.finish_widened", 0) == int(sorted_at_once), dict(counts)
    assert counts.get("store.finish_flushed", 0) == int(not sorted_at_once), dict(counts)


@pytest.mark.parametrize("pairs", [False, True])
def test_held_survivors_tighten_no_sooner_than_the_last_tightening_kept(pairs, rng, monkeypatch):
    # A holding store tightens every `pending` fresh pairs, and waits for as many fresh ones as
    # its last tightening kept (each tightening reads them all): here pending = 10, and the
    # pairs a tightening keeps soon outnumber it. Held with maxima (one centre) or with each
    # pair's own norms (Holding.pairs); the answer is exact either way.
    from knng.engine.store import HoldingStore, Holding, PairErrors, PairNorms
    from knng.metrics import PRECISIONS, get_metric

    x = torch.from_numpy(rng.standard_normal((5, 3)))
    y = torch.from_numpy(rng.standard_normal((300, 3)))
    norms = (x.norm(dim=1), y.norm(dim=1))
    errors = PairErrors(metric=get_metric("sqeuclidean"), d=3, precision=PRECISIONS["tf32"],
                        row_norms=None if pairs else norms[0], row_terms=None,
                        row_offsets=torch.zeros(5, dtype=torch.float64),
                        col_norms=None if pairs else norms[1], col_terms=None, centre_norm=0.0)
    exact = ((x[:, None] - y[None]) ** 2).sum(-1)
    keys = (exact - (norms[0] ** 2)[:, None]).to(torch.float32)
    holding = Holding(pairs=True) if pairs else Holding(maxima=(float(norms[1].max()), 0.0))
    store = HoldingStore(5, 4, 8, errors, lambda r, c: ((x[r] if c.dim() == 1 else x[r][:, None]) - y[c]).pow(2).sum(-1),
                         torch.device("cpu"), pending=10, holding=holding)
    seen = []
    real = HoldingStore.tighten_held
    monkeypatch.setattr(HoldingStore, "tighten_held",
                        lambda self, *a: seen.append((self._held_fresh, self._held_kept)) or real(self, *a))
    rows, cols = torch.arange(5).repeat_interleave(300), torch.arange(300).repeat(5)
    order = torch.randperm(rows.numel(), generator=torch.Generator().manual_seed(3))
    rows, cols = rows[order], cols[order]
    for p0 in range(0, rows.numel(), 7):
        r, c = rows[p0:p0 + 7], cols[p0:p0 + 7]
        store.add(r, c, keys[r, c], PairNorms(norms[0][r], norms[1][c], None, None) if pairs else None)
    assert len(seen) >= 3 and all(fresh >= max(10, kept) for fresh, kept in seen), seen
    assert any(kept > 10 for _, kept in seen), seen  # the rule waited longer than pending at least once
    idx, dist = store.finish()
    want = torch.sort(exact, dim=1, stable=True)
    assert torch.equal(idx, want.indices[:, :4]) and torch.equal(dist, want.values[:, :4])


@pytest.mark.parametrize("n", [1, 2, 99, 100, 101, 1000])
def test_per_row_summaries_on_the_device_equal_the_hosts(n, rng, set_options):
    # Median (the lower of an even count), 99th percentile and maximum by the device's sort, as
    # NumPy's partition on the host gives them: ties, several lists, sizes either side of 100.
    import knng.engine.store.stats as store

    counts = [torch.from_numpy(rng.integers(0, 7, size=m)) for m in (n // 3, n - n // 3)]
    host = store.summarize_per_row(counts)
    set_options(device_summary_on=frozenset({"cpu"}))
    set_options(device_summary_rows=1)
    assert store.summarize_per_row(counts) == host
    every = np.sort(np.concatenate([c.numpy() for c in counts]))
    assert host == {"median": float(every[(n + 1) // 2 - 1]), "p99": float(every[max(1, int(np.ceil(0.99 * n))) - 1]),
                    "max": float(every[-1])}


def test_summaries_in_one_copy_equal_each_alone(rng, set_options):
    # Several summaries read in one copy (some sorted on the device, some on the host, some
    # empty) are each the summary of its own counts.
    import knng.engine.store.stats as store

    groups = [[torch.from_numpy(rng.integers(0, 9, size=m)) for m in sizes]
              for sizes in ((5, 0, 17), (), (0,), (1,), (150,), (40, 61))]
    alone = [store.summarize_per_row(counts) for counts in groups]
    assert store.summarize_per_row_each(groups) == alone
    assert alone[1] == {} and alone[2] == {} and alone[3]["max"] == alone[3]["median"]
    set_options(device_summary_on=frozenset({"cpu"}))
    set_options(device_summary_rows=100)  # the larger groups sorted "on the device"
    assert store.summarize_per_row_each(groups) == alone


@pytest.mark.parametrize("data", ["gaussian", "duplicates", "offset", "integers", "flat"])
def test_tiles_first_never_cuts_a_true_neighbour(data, monkeypatch, rng, seed, screen, set_options):
    # On a Hopper GPU a search of at most 4,096 corpus tiles (a 200k graph by rows)
    # takes τ from the k-th smallest of each row's 128-column tile minima and screens only the
    # tiles whose minimum is within the row's threshold (search._screen_tiles_first). Forced here
    # on the CPU with the references (screen.tile_minima, screen.screen_tiles, kth_of_rows):
    # every seeded τ must stay at or above the row's true k-th key, every dropped tile must hold
    # no pair within its row's threshold, and the answer must be exact, on ties, duplicates,
    # huge offsets, integer data and a flat region (many equal keys across tiles). k = n
    # (every tile passes) and a corpus that is not a multiple of the tile run too.
    from knng.engine import plan as plan_mod
    from knng.engine import screen as screen_mod
    from knng.engine.search import knn as search  # the module whose names the search looks up
    from knng.engine.store import CandidateStore

    k = 17
    x = rng.standard_normal((5003, 6))  # 40 tiles, the last of 11 columns
    q = rng.standard_normal((9, 6))
    if data == "duplicates":
        x[2000:4000] = x[:2000]
        q[:4] = x[:4]
    elif data == "offset":
        x, q = x + 1e4, q + 1e4
    elif data == "integers":
        x, q = np.round(3 * x), np.round(3 * q)
    elif data == "flat":
        x[:3000] = 0.25
        q[:5] = 0.25
    oracle = oracle_search(q, x, k)
    kth = torch.from_numpy(oracle.distances[:, -1].copy())
    seeded, dropped = [], []
    real_ends, real_tiles = CandidateStore.tighten_ends, screen_mod.screen_tiles

    def checked_ends(store, first, kth_code, counts, *maxima, counted=True):
        real_ends(store, first, kth_code, counts, *maxima, counted=counted)
        if not counted:
            seeded.append(store.n)
            key, slack = store.errors.exact_key(torch.arange(store.n), kth[:store.n].to(store.tau))
            assert bool((store.tau >= key - slack).all()), (store.tau - key)[store.tau < key - slack]

    def checked_tiles(a, b, d, tile_keys, thresholds, precision, capacity_hint=None, **terms):
        found = real_tiles(a, b, d, tile_keys, thresholds, precision, capacity_hint=capacity_hint, **terms)
        whole = screen_mod.screen_rows(a, b, d, thresholds, precision, **terms)
        # The full screen keeps nothing the tiles' screen does not.
        assert found.owner.numel() == whole.owner.numel()
        dropped.append(int((tile_keys > thresholds[:, None]).sum()))
        return found

    monkeypatch.setattr(CandidateStore, "tighten_ends", checked_ends)
    monkeypatch.setattr(search, "screen_tiles", checked_tiles)
    set_options(tighten_on=frozenset({"cpu", "cuda"}))  # by default on GPUs only
    set_options(kernels={"tiles_first": True})  # the wgmma kernel's: GPUs only
    res = knng.search(q, x, k)
    plan = last_report().plan  # every screen precision runs the path by its references here
    assert plan.tiles_first and plan.thresholds == plan_mod.TILES_FIRST_THRESHOLDS and plan.sample_size == 0
    assert seeded == [q.shape[0]], seeded
    assert dropped and dropped[0] > 0, dropped  # most tiles are above a row's threshold
    assert_exact(res, oracle, context=f"seed={seed} {data}")
    # k past the tiles' count (3 tiles; forced past the planner's own rule, plan.tiles_first): no
    # k-th minimum, so no seed and every tile screened; still exact.
    monkeypatch.setattr(plan_mod, "tiles_first", lambda plan, device: True)
    res = knng.search(q[:3], x[:300], 7)
    assert_exact(res, oracle_search(q[:3], x[:300], 7), context=f"seed={seed} {data} small")
    assert last_report().plan.tiles_first
