"""Exact duplicate rows folded before a graph and unfolded after (``knng.engine.duplicates``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
import knng.api as api
from knng.api import last_report
from knng.engine import duplicates
from oracle import assert_exact, oracle_graph, oracle_search, smooth_image_patches

pytestmark = pytest.mark.folds


def _with_groups(rng, n: int, d: int, sizes: tuple[int, ...], offset: float = 0.0, integers: bool = False):
    """n rows, the first len(sizes) groups of identical rows scattered among them."""
    x = rng.integers(-3, 4, size=(n, d)).astype(np.float32) if integers else rng.standard_normal((n, d))
    x = (x + offset).astype(np.float32)
    order = rng.permutation(n)
    at = 0
    for size in sizes:
        rows = order[at:at + size]
        x[rows] = x[rows[-1]]  # the group's value is its last (not its first) row's
        at += size
    return x


@pytest.mark.parametrize("case", ["groups", "one_value", "all_equal", "offset", "integers", "patches"])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine"])
@pytest.mark.parametrize("include_self", [False, True])
def test_folded_graph_is_exact(case, metric, include_self, rng):
    n = 240
    if case == "all_equal":  # one group: no engine run, every row's neighbours are its twins
        x = np.repeat(rng.standard_normal((1, 3)).astype(np.float32), n, axis=0)
    elif case == "groups":
        x = _with_groups(rng, n, 6, (60, 25, 2, 2))
    elif case == "one_value":
        x = np.repeat(rng.standard_normal((1, 4)).astype(np.float32), n, axis=0)
        x[::37] += 1.0  # a few other rows
    elif case == "offset":
        x = _with_groups(rng, n, 5, (40, 30), offset=1e6)
    elif case == "integers":  # ties at equal distances between groups too
        x = _with_groups(rng, n, 3, (50, 20, 20), integers=True)
    else:  # flat image regions: many identical patches
        x = smooth_image_patches(rng, n, side=3).astype(np.float32)
        x[rng.permutation(n)[:70]] = x[0]
    for k in (1, 7, 40, n - 1):
        g = knng.graph(x, k, metric=metric, include_self=include_self)
        assert_exact(g, oracle_graph(x, k, metric=metric, include_self=include_self), context=f"k={k}")
        big = np.unique(x, axis=0, return_counts=True)[1].max()
        folds = big > max(duplicates.GROUP_MIN, k + 1)
        assert (last_report().duplicates_folded > 0) == folds, (k, big)


@pytest.mark.parametrize("case", ["groups", "one_value", "integers"])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_folded_search_is_exact(case, metric, rng):
    # The corpus folded: queries equal to a group's rows, next to it, and elsewhere.
    n = 230
    if case == "groups":
        c = _with_groups(rng, n, 5, (70, 30))
    elif case == "one_value":
        c = np.repeat(rng.standard_normal((1, 5)).astype(np.float32), n, axis=0)
        c[::41] -= 0.5
    else:
        c = _with_groups(rng, n, 3, (60, 25), integers=True)
    q = np.concatenate([c[rng.integers(0, n, 20)], c[rng.integers(0, n, 20)] + 1e-3,
                        rng.standard_normal((20, c.shape[1])).astype(np.float32)]).astype(np.float32)
    for k in (1, 9, 80, n):
        res = knng.search(q, c, k, metric=metric)
        assert_exact(res, oracle_search(q, c, k, metric), context=f"k={k}")
        big = np.unique(c, axis=0, return_counts=True)[1].max()
        assert (last_report().duplicates_folded > 0) == (big > max(duplicates.GROUP_MIN, k + 1))


def test_folding_only_where_it_is_exact_and_pays(rng):
    x = _with_groups(rng, 200, 4, (50,))
    knng.graph(x, 5, metric="inner_product")  # a point is not nearest itself: never folded
    assert last_report().duplicates_folded == 0
    knng.graph(x, 60)  # no group of more than k + 1 rows
    assert last_report().duplicates_folded == 0
    knng.graph(x, 5)
    assert last_report().duplicates_folded == 49


def test_duplicate_groups_are_the_identical_rows(rng):
    # The groups equal NumPy's grouping of identical rows, representatives the smallest index,
    # members by index, in float32, float64, float16 and integer rows (odd byte counts too).
    for dtype in (np.float32, np.float64, np.float16, np.uint8):
        x = _with_groups(rng, 300, 3, (40, 7, 2), integers=dtype == np.uint8).astype(dtype)
        if dtype == np.uint8:
            x = (x + 3).astype(np.uint8)
        groups = duplicates.find_duplicates(torch.from_numpy(x), 5)
        assert groups is not None
        _, first, inverse = np.unique(x, axis=0, return_index=True, return_inverse=True)
        reps = np.sort(first)
        assert np.array_equal(groups.reps.numpy(), reps)
        assert np.array_equal(groups.reps.numpy()[groups.group.numpy()], first[inverse.ravel()])
        for g in range(reps.size):
            members = groups.members[groups.starts[g]:groups.starts[g + 1]].numpy()
            assert np.array_equal(members, np.flatnonzero(groups.group.numpy() == g))
    assert duplicates.find_duplicates(torch.from_numpy(rng.standard_normal((100, 3))), 5) is None


def test_a_fingerprint_collision_only_forgoes_a_fold(rng, monkeypatch):
    # Rows whose fingerprints collide are checked against their key group's first row: rows
    # that differ from it stay groups of their own. Here every fingerprint collides: only the
    # rows identical to row 0 are grouped, every other row (other twins too) stands alone.
    x = _with_groups(rng, 120, 4, (30, 25))
    x[rng.permutation(np.arange(1, 120))[:20]] = x[0]  # row 0 has 20 twins
    monkeypatch.setattr(duplicates, "_fingerprints", lambda rows: torch.zeros((rows.shape[0], 2)))
    groups = duplicates.find_duplicates(torch.from_numpy(x), 5)
    assert groups is not None
    twins = np.flatnonzero((x == x[0]).all(1))
    assert np.array_equal(groups.members[groups.starts[0]:groups.starts[1]].numpy(), twins)
    assert int(groups.sizes.max()) == twins.size and int((groups.sizes > 1).sum()) == 1
    g = knng.graph(x, 5)
    assert last_report().duplicates_folded == twins.size - 1
    assert_exact(g, oracle_graph(x, 5))


def test_nan_rows_are_still_refused(rng):
    x = _with_groups(rng, 100, 3, (40,))
    x[5] = np.nan
    with pytest.raises(ValueError, match="data"):
        knng.graph(x, 3)


def test_folding_can_be_turned_off(rng, monkeypatch):
    x = _with_groups(rng, 150, 3, (60,))
    monkeypatch.setattr(api, "FOLD_DUPLICATES", False)
    g = knng.graph(x, 4)
    assert last_report().duplicates_folded == 0
    assert_exact(g, oracle_graph(x, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["numpy", "cuda"])
def test_folding_on_the_gpu(kind, rng):
    # The GPU's way: the rows copied to the device (numpy in) or there already, the groups found
    # and the answer unfolded there; a graph and a search, exact against the float64 oracle, and
    # data without groups taking the engine's own path from the device copy.
    n = 20_000
    x = _with_groups(rng, n, 16, (3_000, 400, 40), offset=5.0)
    data = x if kind == "numpy" else torch.from_numpy(x).cuda()
    g = knng.graph(data, 10, device="cuda")
    assert last_report().duplicates_folded == 3_000 + 400 + 40 - 3
    assert_exact(g, oracle_graph(x, 10))
    q = np.concatenate([x[:50], x[:50] + 1e-2]).astype(np.float32)
    res = knng.search(q if kind == "numpy" else torch.from_numpy(q).cuda(), data, 25, device="cuda")
    assert last_report().duplicates_folded > 0
    assert_exact(res, oracle_search(q, x, 25))
    plain = rng.standard_normal((5_000, 16)).astype(np.float32)
    g = knng.graph(plain if kind == "numpy" else torch.from_numpy(plain).cuda(), 5, device="cuda")
    assert last_report().duplicates_folded == 0
    assert_exact(g, oracle_graph(plain, 5))
