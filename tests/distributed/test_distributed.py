"""The distributed engine on Gloo with 2 and 3 CPU processes: identical to one process.

One process group per world size runs the whole battery of ``distributed_worker.py`` (starting
processes costs seconds); each test then compares one scenario's results, from every rank, with
the single-device engine (bit for bit) and the float64 oracle. The plan and the exact merge of
shard lists are tested directly, without processes.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import replace
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import knng
from distributed_worker import CASES, make_data
from knng.engine.plan import share_rows
from oracle import assert_exact, oracle_graph, oracle_search

WORLDS = (2, 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_battery(tmp_path_factory: pytest.TempPathFactory, worlds: tuple[int, ...], device: str = "cpu"):
    """world → (seed, [results of rank 0, rank 1, …], folder) for the whole battery; the seed is
    fresh each run, or ``KNNG_TEST_SEED`` to replay a failure's."""
    seed = int(os.environ.get("KNNG_TEST_SEED") or np.random.SeedSequence().entropy % 2**31)
    out = {}
    worker = Path(__file__).with_name("distributed_worker.py")
    for world in worlds:
        folder = tmp_path_factory.mktemp(f"world{world}")
        proc = subprocess.run([sys.executable, str(worker), str(world), str(free_port()), str(folder), str(seed),
                               device], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"seed={seed} world={world}\n{proc.stdout}\n{proc.stderr}"
        ranks = []
        for r in range(world):
            with open(folder / f"rank{r}.pkl", "rb") as f:
                ranks.append(pickle.load(f))
        out[world] = (seed, ranks, folder)
    return out


# The battery runs once, in one test process, for every test of this module.
pytestmark = pytest.mark.xdist_group("distributed_battery")


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory):
    return run_battery(tmp_path_factory, WORLDS)


def _reference(name: str, seed: int):
    case = CASES[name]
    if case["kind"] == "search":
        queries, corpus = make_data(case.get("data", "search"), seed)
        return knng.search(queries, corpus, case["k"], metric=case["metric"], device="cpu"), (queries, corpus)
    x = make_data(case["data"], seed)
    kw = {key: v for key, v in case.get("kw", {}).items() if key == "include_self"}
    return knng.graph(x, case["k"], metric=case["metric"], device="cpu", **kw), x


RESULT_CASES = [name for name, case in CASES.items() if case["kind"] in ("graph", "search")]


@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", RESULT_CASES)
def test_identical_to_one_process(battery, world, name):
    seed, ranks, _ = battery[world]
    ref, inputs = _reference(name, seed)
    case = CASES[name]
    for r, results in enumerate(ranks):
        got = results[name]
        assert "error" not in got, f"seed={seed} world={world} rank {r}: {got.get('error')}"
        np.testing.assert_array_equal(got["indices"], ref.indices, err_msg=f"seed={seed} world={world} rank {r}")
        np.testing.assert_array_equal(got["distances"], ref.distances, err_msg=f"seed={seed} world={world} rank {r}")
    got = ranks[0][name]
    if case["kind"] == "search":
        queries, corpus = inputs
        assert_exact(knng.Neighbors(got["indices"], got["distances"]),
                     oracle_search(queries, corpus, case["k"], case["metric"]), context=f"seed={seed}")
    else:
        include_self = case["kw"].get("include_self", False)
        assert_exact(knng.Graph(got["indices"], got["distances"], include_self=include_self),
                     oracle_graph(inputs, case["k"], case["metric"], include_self=include_self),
                     context=f"seed={seed}")
        if "precision" in case:  # the forced screen ran (exact answers are the same in any)
            assert got["precision"] == case["precision"], got["precision"]


#: The steps every run of the pipeline takes, whatever feeds it (a tensor, a file read in blocks,
#: a rank's shard): rows prepared, thresholds seeded from a sample, blocks screened, survivors
#: taken into the stores, the exact finish (``report.stages``).
PIPELINE = frozenset({"prepare", "seeds.from_block", "screen.product", "store.add", "store.finish"})


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", ["graph-normal-euclidean", "graph-memmap", "search-k10", "search-memmap"])
def test_every_source_runs_the_pipeline(battery, world, name, tmp_path):
    """A distributed run, an in-memory run and a run from a file read in blocks (a budget that
    streams the data) take the pipeline's steps; the ranks of a graph together take every step
    the in-memory graph took (its shared thresholds too), but for the finish's widening of
    survivors still pending."""
    seed, ranks, _ = battery[world]
    case = CASES[name]
    path = tmp_path / "data.npy"
    # One device's pipeline (these calls are small enough for the direct path, which a rank's
    # share never takes).
    with knng.options(direct_max_scores=0, direct_max_scores_gpu=0):
        ref, inputs = _reference(name, seed)
        if case["kind"] == "search":
            queries, corpus = inputs
            np.save(path, corpus)
            from_file = knng.search(queries, np.load(path, mmap_mode="r"), case["k"], metric=case["metric"],
                                    device="cpu", memory_budget="256KB")
        else:
            np.save(path, inputs)
            from_file = knng.graph(np.load(path, mmap_mode="r"), case["k"], metric=case["metric"], device="cpu",
                                   memory_budget="256KB")
            assert from_file.report.parts > 1
    in_memory = set(ref.report.stages)
    np.testing.assert_array_equal(from_file.indices, ref.indices)
    # A graph's ranks share its blocks: a small graph's parts may leave a rank none, so the
    # ranks' steps are taken together.
    together = set().union(*(results[name]["stages"] for results in ranks))
    for source, stages in [("in memory", in_memory), ("from a file", set(from_file.report.stages)),
                           ("the ranks together", together)]:
        assert PIPELINE <= stages, f"{name}, {source}: {sorted(PIPELINE - stages)} missing from {sorted(stages)}"
    if case["kind"] == "graph":
        assert "graph.shared_thresholds" in in_memory
        missing = in_memory - {"store.finish_widened"} - together
        assert not missing, f"{name}, the ranks together: {sorted(missing)} missing"


@pytest.mark.parametrize("world", WORLDS)
def test_balanced_blocks(battery, world):
    """The groups of blocks are dealt to the ranks by load: their blocks differ by less than a group."""
    seed, ranks, _ = battery[world]
    got = ranks[0]["graph-offset-k10"]
    assert max(got["per_rank_blocks"]) - min(got["per_rank_blocks"]) <= got["group"], got["per_rank_blocks"]


@pytest.mark.parametrize("world", WORLDS)
def test_small_budgets_stream_the_data(battery, world):
    """Budgets below the data's size make every rank's plan stream it (the results, checked in
    test_identical_to_one_process, must not change)."""
    _, ranks, _ = battery[world]
    assert ranks[0]["graph-offset-k10"]["resident"]
    for name in ("graph-columns-raw", "graph-columns-read"):
        assert all(r[name]["resident"] is False for r in ranks), [r[name]["resident"] for r in ranks]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", ["files", "files-flat", "files-flat-budget"])
def test_files_written_by_every_rank(battery, world, name):
    seed, ranks, folder = battery[world]
    assert all("error" not in r[name] for r in ranks), [r[name] for r in ranks]
    case = CASES[name]
    x = make_data(case["data"], seed)
    with knng.options(direct_max_scores=0, direct_max_scores_gpu=0):  # one device's pipeline folds (its direct path need not)
        ref = knng.graph(x, case["k"], device="cpu")
    out = folder / f"{name}-out"
    np.testing.assert_array_equal(np.load(out / "indices.npy"), ref.indices)
    np.testing.assert_array_equal(np.load(out / "distances.npy"), ref.distances)
    assert sorted(p.name for p in out.iterdir()) == ["distances.npy", "indices.npy", "knng.json"]
    folded = 0 if name == "files-flat-budget" else ref.report.duplicates_folded
    assert all(r[name]["duplicates_folded"] == folded for r in ranks), [r[name] for r in ranks]
    if name.startswith("files-flat"):
        assert ref.report.duplicates_folded > 0
        assert_exact(knng.Graph(np.load(out / "indices.npy"), np.load(out / "distances.npy")),
                     oracle_graph(x, case["k"], case["metric"]), context=f"seed={seed}")


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", ["graph-lattice", "graph-lattice-sq"])
def test_a_lattice_is_screened_with_exact_products_on_every_rank(battery, world, name):
    """Grey levels / 255 are found on their lattice by the ranks together (each looks at its own
    parts; the extents are all-reduced), as on one device: exact products around a lattice point
    (answers: see test_identical_to_one_process)."""
    seed, ranks, _ = battery[world]
    case = CASES[name]
    with knng.options(screen_precision=case["precision"]):
        ref = knng.graph(make_data(case["data"], seed), case["k"], metric=case["metric"], device="cpu")
    assert ref.report.exact_products
    for r, results in enumerate(ranks):
        assert "error" not in results[name], f"seed={seed} rank {r}: {results[name].get('error')}"
        assert results[name]["exact_products"], (r, results[name]["precision"])


@pytest.mark.parametrize("world", WORLDS)
def test_hard_rows_escalate_on_the_ranks(battery, world):
    """Rows that hold more survivors than escalate_pairs are escalated on a rank (τ = −∞, which
    the ranks' merged thresholds carry) and searched again; the graph is one device's, bit for
    bit (answers: see test_identical_to_one_process)."""
    seed, ranks, _ = battery[world]
    for r, results in enumerate(ranks):
        assert "error" not in results["graph-escalated"], f"seed={seed} rank {r}: {results['graph-escalated']}"
    assert any("graph.escalated_rows" in results["graph-escalated"]["stages"] for results in ranks), \
        [results["graph-escalated"]["stages"] for results in ranks]
    # The report (the same on every rank) counts them, and no other graph of the battery escalates.
    assert all(results["graph-escalated"]["rows_escalated"] > 0 for results in ranks)
    assert all(got.get("rows_escalated", 0) == 0 for results in ranks for name, got in results.items()
               if name != "graph-escalated")


@pytest.mark.parametrize("world", WORLDS)
def test_integer_rows_on_every_rank(battery, world):
    """uint8 data are screened as integer rows on every rank, the plan rank 0 made knowing their
    type (answers: see test_identical_to_one_process)."""
    seed, ranks, _ = battery[world]
    for r, results in enumerate(ranks):
        got = results["graph-integer-rows"]
        assert "error" not in got, f"seed={seed} rank {r}: {got.get('error')}"
        assert got["precision"] == "int8", (r, got["precision"])


FOLDED = ["graph-flat", "graph-flat-self", "graph-flat-cosine", "graph-flat-memmap", "graph-one-group",
          "search-flat", "search-flat-memmap"]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", FOLDED)
def test_identical_rows_fold_on_every_rank(battery, world, name):
    """Groups of identical rows fold on several ranks as on one device (answers: see
    test_identical_to_one_process), whatever the source: every rank reports the same fold."""
    seed, ranks, _ = battery[world]
    with knng.options(direct_max_scores=0, direct_max_scores_gpu=0):  # one device's pipeline folds (its direct path need not)
        ref, _ = _reference(name, seed)
    assert ref.report.duplicates_folded > 0, name
    for r, results in enumerate(ranks):
        assert "error" not in results[name], f"seed={seed} rank {r}: {results[name].get('error')}"
        assert results[name]["duplicates_folded"] == ref.report.duplicates_folded, (r, results[name])


@pytest.mark.parametrize("world", WORLDS)
def test_bad_input_is_a_value_error_on_every_rank(battery, world):
    seed, ranks, _ = battery[world]
    for results in ranks:
        assert results["nan"]["error"].startswith("ValueError: data contains NaN or Inf (first in row 301)"), results
        if world == 1:  # one rank cannot disagree with itself
            continue
        assert results["mismatch"]["error"].startswith("ValueError: every rank must be given the same number of "
                                                       "points"), results["mismatch"]


# ------------------------------------------------------------------------- shares of a graph
@pytest.mark.parametrize("n,count", [(10, 3), (2, 3), (1, 1), (7, 7), (100003, 4)])
def test_share_rows_split_the_rows_in_order(n, count):
    ranges = [share_rows(n, i, count) for i in range(count)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1


def _graph_of_shares(x, k, count, **plan_args):
    """The graph of ``count`` shares run one after another on the CPU, their lists merged as
    the ranks' are (:func:`knng.distributed.shards.merge_exact`); also the blocks each share
    screened, and the last share's plan."""
    from knng._inputs import as_input
    from knng.distributed.shards import merge_exact
    from knng.engine.graph import exact_graph, slab_gain_of
    from knng.engine.plan import make_graph_plan
    from knng.metrics import get_metric

    data, m, dev = as_input(x, "data"), get_metric("euclidean"), torch.device("cpu")
    lists, blocks = [], []
    for index in range(count):
        plan = make_graph_plan(n=data.n, d=data.d, k=k, metric="euclidean", device=dev, include_self=False,
                               share=(index, count), slab_gain=slab_gain_of(data, dev), **plan_args)
        idx, dist, report = exact_graph(data, k, m, dev, "auto", plan.budget, plan=plan)
        lists.append((idx, dist))
        blocks.append(plan.parts * (plan.parts - 1) // 2 - report.blocks_skipped)
    values = torch.cat([dist for _, dist in lists], dim=1)
    ids = torch.cat([idx for idx, _ in lists], dim=1)
    return merge_exact(values, ids, k, data, data, m, dev), blocks, plan


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("case", ["gaussian", "slabs", "duplicates", "lists off the device", "rows"])
def test_shares_of_a_graph_merge_into_the_graph(rng, count, case):
    """Every share screens every own part and its own groups of off-diagonal blocks (by rows:
    its rows); their lists merged are the one-device graph, bit for bit, and exact."""
    from knng._inputs import as_input
    from knng.engine.graph import exact_graph
    from knng.engine.plan import GRAPH_ROWS, LISTS_ON_DEVICE
    from knng.metrics import get_metric

    n, d, k = 1500, 8, 7
    x = rng.standard_normal((n, d))
    plan_args: dict = {"budget": 1 << 30, "part_size": 128}
    if case == "slabs":  # one direction dominates: principal frames, windows, skipped bands
        x[:, 0] *= 200.0
    elif case == "duplicates":  # ties everywhere, pairs found by every share (own parts)
        x = np.round(x, 0)
        x[::3] = x[0]
    elif case == "lists off the device":  # stores in a file: the graph runs in bands
        plan_args = {"budget": 1 << 30, "host_budget": 1 << 20}
    elif case == "rows":
        plan_args = {"budget": 1 << 30, "method": GRAPH_ROWS}
    x = x.astype(np.float32)
    (idx, dist), blocks, plan = _graph_of_shares(x, k, count, **plan_args)
    if case == "rows":
        assert plan.graph_method == GRAPH_ROWS
    elif case == "lists off the device":
        assert plan.lists != LISTS_ON_DEVICE and plan.bands > 1
    else:
        assert plan.lists == LISTS_ON_DEVICE and plan.parts > 4
        assert plan.frames == "principal" or case != "slabs"
    if case != "rows":
        assert all(b > 0 for b in blocks), blocks  # every share screened some blocks
    data, dev = as_input(x, "data"), torch.device("cpu")
    whole_idx, whole_dist, _ = exact_graph(data, k, get_metric("euclidean"), dev, "auto", plan.budget,
                                           plan=replace(plan, share_index=0, share_count=1, search=None if
                                                        plan.search is None else replace(plan.search, n_queries=n)))
    np.testing.assert_array_equal(idx.numpy(), whole_idx.numpy())
    np.testing.assert_array_equal(dist.numpy().astype(np.float32), whole_dist.numpy().astype(np.float32))
    assert_exact((idx.numpy(), dist.numpy().astype(np.float32)), oracle_graph(x, k), context=case)


# ------------------------------------------------------------------------ the exact merge
def test_merge_exact_orders_cross_shard_float32_ties_by_true_distance(rng):
    """Two shards' entries that round to the same float32 are settled exactly, not by their
    screen values: the merge must put the truly nearer one first."""
    from knng._inputs import as_input
    from knng.distributed.shards import merge_exact
    from knng.metrics import get_metric

    corpus = np.zeros((4, 2))
    corpus[0] = [1.0, 0.0]
    corpus[1] = [1.0 + 2.0**-40, 0.0]  # farther by far less than a float32 ulp
    corpus[2] = [5.0, 0.0]
    corpus[3] = [1.0, 0.0]  # an exact duplicate of 0
    q = torch.zeros((1, 2), dtype=torch.float64)
    m = get_metric("euclidean")
    # Screen-like values that order 1 before 0 (both round to 1.0f) and shard lists in odd order.
    values = torch.tensor([[1.0 + 2.0**-45, 5.0, 1.0 + 2.0**-44, 1.0 + 2.0**-43]], dtype=torch.float64)
    ids = torch.tensor([[1, 2, 0, 3]])
    idx, dist = merge_exact(values, ids, 3, as_input(q, "queries"), as_input(corpus, "corpus"), m,
                            torch.device("cpu"))
    assert idx.tolist() == [[0, 3, 1]]
    assert dist[0, 0] == 1.0 and dist[0, 1] == 1.0 and dist[0, 2] > 1.0


def test_rows_subset_reads_only_its_rows(tmp_path, rng):
    from knng._inputs import as_input
    from knng._inputs import rows_subset

    x = rng.standard_normal((50, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    lazy = as_input(np.load(tmp_path / "x.npy", mmap_mode="r"), "data")
    ranges = [(5, 9), (20, 21), (40, 50)]
    sub = rows_subset(lazy, ranges)
    expect = np.concatenate([x[a:b] for a, b in ranges])
    assert sub.n == len(expect) and sub.tensor is None
    np.testing.assert_array_equal(sub.rows(0, sub.n).numpy(), expect)
    np.testing.assert_array_equal(sub.rows(3, 6).numpy(), expect[3:6])
    np.testing.assert_array_equal(sub.take(torch.tensor([[14, 0], [4, 5]])).numpy(), expect[[[14, 0], [4, 5]]])
    dense = rows_subset(as_input(x, "data"), ranges)
    np.testing.assert_array_equal(dense.tensor.numpy(), expect)


def test_distributed_without_a_process_group_says_how_to_start(rng):
    x = rng.standard_normal((50, 3))
    for call in (lambda: knng.graph(x, 3, distributed=True), lambda: knng.search(x, x, 3, distributed=True)):
        with pytest.raises(RuntimeError, match="torchrun"):
            call()
    with pytest.raises(TypeError, match="distributed must be True or False"):
        knng.graph(x, 3, distributed="yes")
