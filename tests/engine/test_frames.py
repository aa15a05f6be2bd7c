"""Principal frames of the graph engine (``knng.engine.graph.frames``): parts as slabs along the
principal direction, blocks centred on their row part, and windows that skip what no row or
column can need. Checked against the float64 oracle by differences, on data whose parts are
forced small so that a graph has dozens of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
import knng.engine.graph.frames as frames_mod
import knng.engine.plan as plan_mod
from knng._inputs import as_input
from knng.engine.graph.frames import PrincipalFrames
from knng.metrics import METRICS as KNNG_METRICS
from knng.metrics import PRECISIONS
from oracle import assert_exact, oracle_graph, smooth_image_patches


@pytest.fixture
def small_parts(set_options):
    """Parts of 37 rows on a CPU (not a tile multiple): a few hundred points make many parts.
    Principal frames whatever the data's slab gain (the planner gives Gaussian-like data one
    centre: ``Options.principal_min_gain``), so that every data set here runs in them."""
    set_options(cpu_max_part=37)
    set_options(principal_min_gain=0.0)


def _line(rng, n, d=6, spread=1000.0):
    """Points spread along one direction: far parts can be skipped whole."""
    t = np.sort(rng.uniform(0, spread, n))
    x = rng.standard_normal((n, d)) * 0.5
    x[:, 0] += t
    return x.astype(np.float32)


DATA = {
    "patches": lambda rng, n: smooth_image_patches(rng, n, side=4),
    "offset_gauss": lambda rng, n: (1e4 + rng.standard_normal((n, 8))).astype(np.float32),
    "duplicates": lambda rng, n: np.repeat(rng.integers(0, 4, (n // 4 + 1, 5)), 4, axis=0)[:n].astype(np.float32),
    "line": _line,
    "integers": lambda rng, n: rng.integers(0, 3, (n, 3)).astype(np.float32),
}


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("k", [1, 7])
@pytest.mark.parametrize("local", [True, False])
def test_principal_frames_graph_is_exact(data, k, local, small_parts, rng, seed, screen, set_options):
    set_options(local_centre_gain=1e-12 if local else 1e12)
    x = DATA[data](rng, 401)
    g = knng.graph(x, k, device="cpu")
    assert g.report.plan.frames == "principal" and g.report.parts > 5
    assert_exact(g, oracle_graph(x, k), context=f"seed={seed} {data} local={local} {screen}")


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
def test_principal_frames_every_neighbour_and_self(metric, small_parts, rng, seed):
    x = smooth_image_patches(rng, 150, side=3)
    n = len(x)
    g = knng.graph(x, n - 1, metric=metric, device="cpu")
    assert_exact(g, oracle_graph(x, n - 1, metric), context=f"seed={seed} k=n-1")
    g = knng.graph(x, 5, metric=metric, include_self=True, device="cpu")
    assert_exact(g, oracle_graph(x, 5, metric, include_self=True), context=f"seed={seed} include_self")


def test_far_parts_are_skipped_and_the_graph_stays_exact(small_parts, rng, seed):
    x = _line(rng, 600)
    g = knng.graph(x, 5, device="cpu")
    report = g.report
    assert report.blocks_skipped > report.parts  # most far blocks never computed
    assert report.pairs_saving > 0.8
    assert report.blocks_computed == report.plan.blocks - report.blocks_skipped
    assert_exact(g, oracle_graph(x, 5), context=f"seed={seed}")


def test_plan_chooses_frames():
    cpu = torch.device("cpu")

    def plan(metric="euclidean", n=5000, budget=2**30):
        return plan_mod.make_graph_plan(n=n, d=16, k=10, metric=metric, device=cpu, budget=budget,
                                        include_self=False, part_size=512)

    assert plan().frames == "principal"
    assert plan("sqeuclidean").frames == "principal"
    for metric in ("cosine", "pearson", "inner_product"):  # not translation invariant
        assert plan(metric).frames == "global"
    assert plan(n=400).frames == "global"  # one part: nothing to order
    assert plan(budget=200_000).frames == "global"  # streamed corpus: no sorted copy


def test_plan_reads_the_slab_gain_of_the_data(rng):
    """Given the data, the planner keeps principal frames for data whose slabs shrink the squared
    norms (points along a line, image patches) and gives Gaussian points one centre, without
    reading any sample where principal frames cannot run."""
    cpu = torch.device("cpu")

    def frames(x, metric="euclidean"):
        data = as_input(x, "data")
        return plan_mod.make_graph_plan(n=data.n, d=data.d, k=5, metric=metric, device=cpu, budget=2**30,
                                        include_self=False, part_size=100,
                                        slab_gain=frames_mod.slab_gain_of(data, cpu)).frames

    assert frames(_line(rng, 2000)) == "principal"
    assert frames(smooth_image_patches(rng, 2000, side=4)) == "principal"
    assert frames(rng.standard_normal((2000, 32)).astype(np.float32)) == "global"
    assert frames((1e4 + rng.standard_normal((2000, 8))).astype(np.float32)) == "global"
    assert frames(_line(rng, 2000), "cosine") == "global"


@pytest.mark.parametrize("gain, local", [(1e-12, True), (1e12, False)])
def test_local_centres_follow_the_gain(gain, local, rng, set_options):
    set_options(local_centre_gain=gain)
    x = torch.from_numpy(_line(rng, 300))
    centre = x.to(torch.float64).mean(0)
    f = PrincipalFrames(as_input(x, "data"), KNNG_METRICS["euclidean"], centre, torch.device("cpu"), 50,
                        torch.float32)
    assert f.local is local
    assert bool((f.proj[1:] >= f.proj[:-1]).all())
    assert sorted(f.order.tolist()) == list(range(300))


def test_slab_data_choose_local_centres_and_gaussian_data_do_not(rng):
    for x, local in ((_line(rng, 500), True), (rng.standard_normal((500, 32)).astype(np.float32), False)):
        t = torch.from_numpy(x)
        f = PrincipalFrames(as_input(t, "data"), KNNG_METRICS["euclidean"], t.to(torch.float64).mean(0),
                            torch.device("cpu"), 64, torch.float32)
        assert f.local is local


def _frames_and_distances(x: np.ndarray, part: int) -> tuple[PrincipalFrames, np.ndarray]:
    """Principal frames of ``x`` (parts of ``part`` rows, on the CPU) and its float64 squared
    distances by differences, the diagonal +inf."""
    t = torch.from_numpy(x)
    f = PrincipalFrames(as_input(t, "data"), KNNG_METRICS["euclidean"], t.to(torch.float64).mean(0),
                        torch.device("cpu"), part, torch.float32)
    x64 = x.astype(np.float64)
    d2 = ((x64[:, None, :] - x64[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d2, np.inf)
    return f, d2


@pytest.mark.parametrize("trial", range(4))
def test_window_holds_every_pair_either_side_needs(trial, rng):
    # The contract of PrincipalFrames.window: any pair (i, j) of blocks I < J whose exact squared
    # distance is ≤ τᵢ or ≤ τⱼ lies inside the window. Thresholds are adversarial: the exact
    # k-th distances, exact pair distances (pairs right at the threshold), 0, and +inf.
    n, part = 240, 30
    x = _line(rng, n, d=4, spread=rng.choice([3.0, 30.0, 300.0])) if trial % 2 else \
        rng.standard_normal((n, 5)).astype(np.float32) * np.array([20, 1, 1, 1, 1], dtype=np.float32)
    f, d2 = _frames_and_distances(x, part)
    kth = np.sort(d2, axis=1)[:, rng.integers(1, 6)]
    choice = rng.integers(0, 4, n)
    partner = rng.integers(0, n, n)
    tau = np.where(choice == 0, kth, np.where(choice == 1, d2[np.arange(n), partner], np.where(choice == 2, 0.0,
                                                                                                  np.inf)))
    tau = np.where(np.isfinite(tau) | (choice == 3), tau, kth)
    tau_t = torch.from_numpy(tau)
    order = f.order.numpy()
    for pi in range(len(f.parts)):
        for pj in range(pi + 1, len(f.parts)):
            rows = order[f.parts[pi][0]:f.parts[pi][1]]
            cols = order[f.parts[pj][0]:f.parts[pj][1]]
            block = d2[np.ix_(rows, cols)]
            need = (block <= tau[rows][:, None]) | (block <= tau[cols][None, :])
            window = f.window(pi, pj, tau_t, version=trial)
            if window is None:
                assert not need.any(), (pi, pj)
                continue
            inside = np.zeros_like(need)
            inside[window.r0:window.r1, window.c0:window.c1] = True
            assert not (need & ~inside).any(), (pi, pj, window)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["float32", "float64", "tf32x3", "tf32", "bfloat16"])
@pytest.mark.parametrize("data", ["patches", "line", "offset_gauss"])
def test_principal_frames_on_the_gpu(precision, data, rng, seed, set_options):
    # Slabs of 500 rows on the GPU: the fused kernel (own parts wider than its seed sample and
    # off-diagonal windows) and the torch screen, each precision, against the float64 oracle.
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    set_options(principal_min_gain=0.0)  # Gaussian points in slabs too
    set_options(graph_rows_tiles_first=False)  # not by rows (their search's tiles first)
    set_options(gpu_max_part=500)
    set_options(gpu_kernel_max_part=500)  # the fused precisions' parts too
    set_options(gpu_triangle_max_part=500)  # and theirs where own blocks are triangles
    set_options(gpu_kernel_group_columns=1500)  # their launches: 3 column parts
    set_options(own_part_seed=128)
    set_options(screen_precision=precision)
    x = DATA[data](rng, 4000)
    g = knng.graph(x, 10, device="cuda")
    assert g.report.plan.frames == "principal" and g.report.plan.screen_precision == precision
    assert g.report.parts == 8 and g.report.plan.group_parts == (3 if PRECISIONS[precision].fused else 1)
    assert_exact(g, oracle_graph(x, 10), context=f"seed={seed} {data} {precision}")


def test_outliers_keep_per_block_thresholds_and_stay_exact(small_parts, rng, seed, set_options):
    # Gaussian points (blocks keep one centre) with a few vectors 1,000× larger: one shared
    # threshold per point would be widened by them in every block, so each block's own maxima
    # are used; the graph stays exact either way.

    set_options(local_centre_gain=1e12)
    x = rng.standard_normal((400, 6)).astype(np.float32)
    x[rng.choice(400, 3, replace=False)] *= 1000.0
    g = knng.graph(x, 5, device="cpu")
    assert g.report.plan.frames == "principal" and "graph.shared_thresholds" not in g.report.stages
    assert_exact(g, oracle_graph(x, 5), context=f"seed={seed} outliers")
    x = rng.standard_normal((400, 6))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.9, 1.1, (400, 1))).astype(np.float32)
    g = knng.graph(x, 5, device="cpu")
    assert g.report.stages.get("graph.shared_thresholds")  # alike norms (a shell): one threshold per point
    assert_exact(g, oracle_graph(x, 5), context=f"seed={seed} uniform")


# ------------------------------------------------------------------------ grouped launches
@pytest.mark.parametrize("data,metric", [("patches", "euclidean"), ("duplicates", "euclidean"),
                                         ("line", "sqeuclidean"), ("offset_gauss", "cosine")])
@pytest.mark.parametrize("local", [True, False])
@pytest.mark.parametrize("group", [2, 3, 64])
def test_grouped_launches_give_the_same_exact_graph(data, metric, local, group, small_parts, rng, seed, set_options):
    # Blocks S(I, J) of several consecutive column parts in one launch (plan.group_parts; parts
    # of 37 rows, so 11 parts, groups that do not divide them and one wider than all): the same
    # graph bit for bit as one launch per block, exact against the oracle, every block counted.
    set_options(local_centre_gain=1e-12 if local else 1e12)
    x = DATA[data](rng, 401)
    single = knng.graph(x, 5, metric=metric, device="cpu")
    set_options(group_parts=group)
    grouped = knng.graph(x, 5, metric=metric, device="cpu")
    plan = grouped.report.plan
    assert plan.group_parts == group and plan.parts == 11
    assert plan.frames == ("global" if metric == "cosine" else "principal")
    np.testing.assert_array_equal(grouped.indices, single.indices)
    np.testing.assert_array_equal(grouped.distances, single.distances)
    assert_exact(grouped, oracle_graph(x, 5, metric), context=f"seed={seed} {data} group={group}")
    if plan.frames == "global":  # nothing skipped: every block once, every pair of it screened
        assert grouped.report.blocks_skipped == 0 == single.report.blocks_skipped
        assert grouped.report.pairs_screened == single.report.pairs_screened


@pytest.mark.parametrize("trial", range(3))
def test_a_span_window_holds_its_members_windows(trial, rng):
    # span_window's contract: one window whose columns (from the first member's start) cover every
    # member's window, None only when no member has one, and the live members counted.
    n, part = 300, 25
    x = _line(rng, n, d=4, spread=[3.0, 30.0, 300.0][trial])
    f, d2 = _frames_and_distances(x, part)
    tau = torch.from_numpy(np.sort(d2, axis=1)[:, rng.integers(1, 8, n)].diagonal().copy())
    parts = len(f.parts)
    for pi in range(parts - 1):
        for size in (1, 2, 5, parts):
            cols = range(pi + 1, min(parts, pi + 1 + size))
            found = frames_mod.span_window(f, pi, cols, tau, version=trial)
            members = [(pj, f.window(pi, pj, tau, version=trial)) for pj in cols]
            live = [(pj, w) for pj, w in members if w is not None]
            if not live:
                assert found is None
                continue
            window, count = found
            assert count == len(live)
            base = f.parts[cols[0]][0]
            for pj, w in live:
                offset = f.parts[pj][0] - base
                assert window.r0 <= w.r0 and window.r1 >= w.r1
                assert window.c0 <= offset + w.c0 and window.c1 >= offset + w.c1
            assert window.c1 <= f.parts[cols[-1]][1] - base


@pytest.mark.parametrize("squaring", [True, False])
def test_leading_direction_by_squarings_or_iteration(squaring, rng, set_options):
    # Both ways find the leading principal direction of a sample with one dominant direction
    # (the squarings of the Gram matrix, or the iteration where d is above their limit), and
    # a sample of equal rows gives some unit vector, not NaN.
    from knng.engine.graph import frames

    set_options(squaring_max_d_cpu=512 if squaring else 0)
    d = 24
    axis = rng.standard_normal(d)
    axis /= np.linalg.norm(axis)
    rows = rng.standard_normal((3000, d)) + 6.0 * rng.standard_normal((3000, 1)) * axis
    rows = torch.from_numpy(rows - rows.mean(axis=0))
    u = frames._leading_direction(rows)
    want = torch.linalg.eigh(rows.T @ rows).eigenvectors[:, -1]
    assert abs(float(torch.linalg.vector_norm(u)) - 1.0) < 1e-12
    assert abs(float(u @ want)) > 1 - 1e-9
    flat = frames._leading_direction(torch.zeros((50, d), dtype=torch.float64))
    assert bool(torch.isfinite(flat).all()) and abs(float(torch.linalg.vector_norm(flat)) - 1.0) < 1e-12
