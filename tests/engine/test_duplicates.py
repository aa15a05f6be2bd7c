"""Exact duplicate rows folded before a graph and unfolded after (``knng.engine.duplicates``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import knng
from knng.api import last_report
from knng.engine import duplicates
from knng.engine.kernels.unfold import KERNEL_MAX_WIDTH
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fingerprint_order_sorts_keys_of_every_sign(dtype, rng):
    # Keys of both signs, signed zeros, subnormals and infinities, many repeated: the order
    # sorts by (first, second) key (float32 keys go through one sort of their bit patterns).
    values = torch.tensor([-np.inf, -7.0, -3.5, -1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, 2.0, 7.0, np.inf])
    for trial in range(40):
        n = int(rng.integers(2, 400))
        if trial % 2:
            keys = values[torch.from_numpy(rng.integers(0, values.numel(), (n, 2)))]
        else:
            keys = torch.from_numpy(rng.standard_normal((n, 2)) * 10.0 ** rng.integers(-30, 30))
        keys = keys.to(dtype)
        order = duplicates._lexicographic_order(keys)
        assert sorted(order.tolist()) == list(range(n))
        a, b = keys[order][:-1], keys[order][1:]
        assert bool(((a[:, 0] < b[:, 0]) | ((a[:, 0] == b[:, 0]) & (a[:, 1] <= b[:, 1]))).all())


def test_groups_fold_from_one_row_past_the_limit(rng):
    # A group of max(GROUP_MIN, k + 1) rows is not folded; one row more is.
    k = 5
    limit = max(duplicates.GROUP_MIN, k + 1)
    for size, folds in ((limit, False), (limit + 1, True)):
        x = _with_groups(rng, 200, 4, (size,))
        assert (duplicates.find_duplicates(torch.from_numpy(x), k) is not None) == folds


def _random_groups(rng, n: int, big: tuple[int, ...]) -> duplicates.DuplicateGroups:
    """Groups of n rows: ``big`` groups of those sizes, the rest single rows, members scattered."""
    label = np.arange(n)
    order = rng.permutation(n)
    at = 0
    for size in big:
        label[order[at:at + size]] = order[at]
        at += size
    reps, group = np.unique(label, return_inverse=True)
    reps = np.array([np.flatnonzero(group == g).min() for g in range(reps.size)])
    order = np.argsort(reps)  # groups numbered by their smallest row, as find_duplicates does
    group = np.argsort(order)[group]
    members = np.argsort(group, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(group))])
    return duplicates.DuplicateGroups(*(torch.from_numpy(np.asarray(a, dtype=np.int64))
                                        for a in (reps[order], group, members, starts)))


def _ranked_groups(rng, rows: int, u: int, width: int, levels: int, exclude: np.ndarray | None,
                   short: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, width) other groups of each row by (distance, group) at ``levels`` integer distances
    (ties everywhere), the last ``short`` columns −1 / +inf in a few rows (fewer candidates)."""
    idx = np.full((rows, width), -1, dtype=np.int64)
    dist = np.full((rows, width), np.inf)
    for r in range(rows):
        pool = np.setdiff1d(np.arange(u), [] if exclude is None else [exclude[r]])
        chosen = rng.choice(pool, size=width, replace=False)
        d = rng.integers(1, levels + 1, size=width).astype(np.float64)
        order = np.lexsort((chosen, d))
        idx[r], dist[r] = chosen[order], d[order]
        if short and r % 5 == 0:
            idx[r, width - short:], dist[r, width - short:] = -1, np.inf
    return torch.from_numpy(idx), torch.from_numpy(dist)


def _unfolded(groups: duplicates.DuplicateGroups, own_group, idx, dist, k: int, own, drop_self: bool):
    """The unfolding's reference, row by row: every member of the row's own group and of each
    group in its row of ``idx``, sorted by (distance, index), cut at k."""
    members = [groups.members[groups.starts[g]:groups.starts[g + 1]].tolist() for g in range(groups.reps.numel())]
    m = idx.shape[0] if own_group is None else own_group.numel()
    out_idx = np.full((m, k), -1, dtype=np.int64)
    out_dist = np.full((m, k), np.inf)
    for r in range(m):
        if own_group is None:
            ranked, cand = idx[r].tolist(), []
            cand_dist = dist[r].tolist()
        else:
            g = int(own_group[r])
            ranked = idx[g].tolist()
            cand = [(float(own[g]), j) for j in members[g] if not (drop_self and j == r)]
            cand_dist = dist[g].tolist()
        cand += [(dd, j) for grp, dd in zip(ranked, cand_dist) if grp >= 0 for j in members[grp]]
        cand.sort()
        for s, (dd, j) in enumerate(cand[:k]):
            out_idx[r, s], out_dist[r, s] = j, dd
    return torch.from_numpy(out_idx), torch.from_numpy(out_dist)


def _check_unfolding(rng, levels: int, n: int, big: tuple[int, ...], widths, ks, device: str = "cpu") -> list:
    """Unfold random groups and ranked lists (:func:`_random_groups`, :func:`_ranked_groups`) of
    ``n`` rows for a graph and a search, each k, on ``device``, against :func:`_unfolded`; the
    sizes of the batches of rows sorted instead of laid end to end."""
    groups = _random_groups(rng, n, big)
    u = groups.reps.numel()
    on = duplicates.DuplicateGroups(*(t.to(device) for t in (groups.reps, groups.group, groups.members, groups.starts)))
    sorted_rows = []
    sort = duplicates._unfold_by_sort

    def counted(groups, lists, k, total=None):
        sorted_rows.append(lists.group.shape[0])
        return sort(groups, lists, k, total)

    for width in widths:  # 0: one group only, every row's neighbours its twins
        idx, dist = _ranked_groups(rng, u, u, width, levels, np.arange(u), short=max(0, min(width - 1, 3)))
        for own_value in (0.0, 1.0):
            own = torch.full((u,), own_value, dtype=torch.float64)
            for k in ks:
                for drop_self in (True, False):
                    with pytest.MonkeyPatch.context() as mp:
                        mp.setattr(duplicates, "_unfold_by_sort", counted)
                        got = duplicates._unfold(on, on.group, idx.to(device), dist.to(device), k, own=own.to(device),
                                                 drop_self=drop_self, rows_per_chunk=97)
                    want = _unfolded(groups, groups.group, idx, dist, k, own, drop_self)
                    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), (
                        width, own_value, k, drop_self)
                    # A range of the rows only (a rank's share of a distributed graph).
                    a, b = sorted(int(v) for v in rng.integers(0, n + 1, 2))
                    part = duplicates.unfold_graph(on, idx.to(device), dist.to(device), own.to(device), k,
                                                   include_self=not drop_self, rows=slice(a, b))
                    assert torch.equal(part[0].cpu(), want[0][a:b]) and torch.equal(part[1].cpu(), want[1][a:b]), (
                        width, own_value, k, drop_self, a, b)
        if width == 0:
            continue
        # A search: each query's row of groups (no own group).
        qidx, qdist = _ranked_groups(rng, n // 3, u, width, levels, None, short=max(0, min(width - 1, 2)))
        for k in ks + (4 * max(ks),):
            got = duplicates._unfold(on, None, qidx.to(device), qdist.to(device), k, rows_per_chunk=64)
            want = _unfolded(groups, None, qidx, qdist, k, None, False)
            assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1]), (width, k)
    return sorted_rows


@pytest.mark.parametrize("levels", [1, 3, 50])
def test_unfolding_by_slots_matches_the_sort(levels, rng, set_options):
    # Unfolding lays each row's candidate groups end to end and sorts only the rows whose order
    # that gets wrong: the answer equals sorting every member of every candidate group, row by
    # row, on groups of 1 to 40 rows whose members interleave by index, distances with ties
    # everywhere (one level: every candidate tied), own groups at the first neighbour's distance
    # (as a cosine distance of 0 to another direction), rows with fewer candidates than k, k = 1
    # to more than the candidates, several chunks (with every distance tied, chunks of a few
    # rows and sorts of a few dozen candidates: a row's own count whatever it is).
    if levels == 1:
        set_options(duplicate_list_entries=300)
        set_options(duplicate_sort_entries=50)
    sorted_rows = _check_unfolding(rng, levels, 400, (40, 25, 9, 3, 2, 2), (0, 1, 6, 30), (1, 2, 5, 31, 90))
    assert sorted_rows and sum(sorted_rows) < 0.9 * 400 * 4 * 2 * 5 * 2  # both ways taken


@pytest.mark.slow
def test_unfolding_kernel_matches_the_sort(kernel_device, rng):
    # The same on the unfolding kernel (a program a row), in Triton's interpreter (few rows: it
    # runs each program in Python) or on a GPU; k = 100 with 101 lists a row is the 8×8 image
    # patches' shape, k = 128 with 128 the largest the kernel takes.
    if kernel_device.type == "cpu":
        n, widths, ks = 80, (0, 6, 30), (1, 31)
    else:
        n, widths, ks = 600, (0, 6, 100, 127), (1, 31, 100, 128)
    sorted_rows = _check_unfolding(rng, 2, n, (16, 9, 5, 3, 2, 2), widths, ks, kernel_device.type)
    assert sorted_rows
    if kernel_device.type == "cuda":  # the kernel's widest rows: 1,001 lists, k = 1,024
        _check_unfolding(rng, 3, 1300, (16, 9, 5, 3, 2, 2), (1000,), (1000, KERNEL_MAX_WIDTH), "cuda")


def test_a_fingerprint_collision_only_forgoes_a_fold(rng, monkeypatch):
    # Rows whose fingerprints collide are checked against their key group's first row: rows
    # that differ from it stay groups of their own. Here every fingerprint collides: only the
    # rows identical to row 0 are grouped, every other row (other twins too) stands alone.
    x = _with_groups(rng, 120, 4, (30, 25))
    x[rng.permutation(np.arange(1, 120))[:20]] = x[0]  # row 0 has 20 twins
    monkeypatch.setattr(duplicates, "fingerprints", lambda rows: torch.zeros((rows.shape[0], 2)))
    groups = duplicates.find_duplicates(torch.from_numpy(x), 5)
    assert groups is not None
    twins = np.flatnonzero((x == x[0]).all(1))
    assert np.array_equal(groups.members[groups.starts[0]:groups.starts[1]].numpy(), twins)
    assert int(groups.sizes.max()) == twins.size and int((groups.sizes > 1).sum()) == 1
    g = knng.graph(x, 5)
    assert last_report().duplicates_folded == twins.size - 1
    assert_exact(g, oracle_graph(x, 5))


def test_large_data_are_looked_through_for_groups_only_where_a_sample_repeats_a_row(rng, monkeypatch):
    # Data of more than four samples' rows, in memory as in a file, are looked through for groups
    # only where SAMPLE_BLOCKS runs of rows repeat a row: without groups no whole check runs (it
    # was a fifth of a small CPU search); a group large enough to pay for folding shows in the
    # sample, and then every group is found.
    calls: list[int] = []
    real = duplicates.find_duplicates
    monkeypatch.setattr(duplicates, "find_duplicates", lambda rows, k: calls.append(rows.shape[0]) or real(rows, k))
    n = 4 * duplicates.SAMPLE_BLOCKS * duplicates.SAMPLE_ROWS + 1_003
    plain = rng.standard_normal((n, 4)).astype(np.float32)
    q = rng.standard_normal((300, 4)).astype(np.float32)  # 300 × n scores: past the direct path
    res = knng.search(q, plain, 5)
    assert not last_report().plan.direct and calls == [] and last_report().duplicates_folded == 0
    x = plain.copy()
    x[rng.permutation(n)[:400]] = x[7]  # a group of 401 rows (or 400, where row 7 was drawn)
    x[n - 30:] = x[11]  # and one of 31 at the end
    res = knng.search(q, x, 5)
    twins = int((x == x[7]).all(1).sum()) + int((x == x[11]).all(1).sum())
    assert calls == [n] and last_report().duplicates_folded == twins - 2
    assert_exact(res, oracle_search(q, x, 5))


def test_nan_rows_are_still_refused(rng):
    x = _with_groups(rng, 100, 3, (40,))
    x[5] = np.nan
    with pytest.raises(ValueError, match="data"):
        knng.graph(x, 3)


def test_folding_can_be_turned_off(rng, set_options):
    x = _with_groups(rng, 150, 3, (60,))
    set_options(fold_duplicates=False)
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


@pytest.mark.parametrize("source", ["memmap", "h5py"])
def test_data_read_from_files_fold_like_data_in_memory(source, rng, tmp_path):
    # The same groups whether the rows come from memory or from a file read in blocks: the same
    # rows folded, the same exact graph and search (with a budget that streams the file too).
    x = _with_groups(rng, 700, 5, (90, 40, 3))
    q = np.concatenate([x[rng.integers(0, 700, 15)], rng.standard_normal((15, 5)).astype(np.float32)])
    if source == "memmap":
        np.save(tmp_path / "x.npy", x)
        data = np.load(tmp_path / "x.npy", mmap_mode="r")
    else:
        h5py = pytest.importorskip("h5py")
        f = h5py.File(tmp_path / "x.h5", "w")
        f.create_dataset("x", data=x)
        data = f["x"]
    for budget in (None, "256KB"):
        g = knng.graph(data, 6, memory_budget=budget)
        assert last_report().duplicates_folded == 89 + 39 + 2
        assert_exact(g, oracle_graph(x, 6), context=f"budget={budget}")
        np.testing.assert_array_equal(g.indices, knng.graph(x, 6).indices)
        res = knng.search(q, data, 6, memory_budget=budget)
        assert last_report().duplicates_folded == 89 + 39 + 2
        assert_exact(res, oracle_search(q, x, 6, "euclidean"), context=f"budget={budget}")


def test_a_file_with_a_bad_row_names_it_as_the_caller_numbers_it(rng, tmp_path):
    # Rows before the bad one fold away: the error still names the row of the file.
    x = _with_groups(rng, 300, 3, (60,))
    x[250] = np.nan
    np.save(tmp_path / "x.npy", x)
    for data in (x, np.load(tmp_path / "x.npy", mmap_mode="r")):
        with pytest.raises(ValueError, match=r"data contains NaN or Inf \(first in row 250\)"):
            knng.graph(data, 3)


def test_checkpointed_runs_fold_and_resume_folded(rng, tmp_path, set_options):
    # A checkpointed graph folds; kept after success, it resumes with only the finish to do,
    # finding the same groups; a run that would not fold may not take that checkpoint over.
    from knng.io.workarea import CheckpointMismatchError

    x = _with_groups(rng, 500, 4, (70, 30))
    ref = knng.graph(x, 5)
    g = knng.graph(x, 5, checkpoint=tmp_path / "ck", keep_checkpoint=True)
    assert last_report().duplicates_folded == 69 + 29
    np.testing.assert_array_equal(g.indices, ref.indices)
    g = knng.graph(x, 5, checkpoint=tmp_path / "ck", resume=True, keep_checkpoint=True)
    assert last_report().checkpoints["resumed_from"] > 0 and last_report().duplicates_folded == 98
    np.testing.assert_array_equal(g.indices, ref.indices)
    np.testing.assert_array_equal(g.distances, ref.distances)
    set_options(fold_duplicates=False)
    with pytest.raises(CheckpointMismatchError):
        knng.graph(x, 5, checkpoint=tmp_path / "ck", resume=True)
    q = x[:40] + 1e-3
    s = knng.search(q, x, 5, checkpoint=tmp_path / "search-ck")  # folding off: every row searched
    assert last_report().duplicates_folded == 0
    np.testing.assert_array_equal(s.indices, knng.search(q, x, 5).indices)


def test_a_large_file_is_read_through_for_groups_only_where_a_sample_repeats_a_row(rng, tmp_path):
    # Past SAMPLE_BLOCKS blocks of rows a file's sample decides: a large group shows in it and
    # is found whole; a file without repeats is not read through (its sample has none).
    n, block = 40_000, 1_000
    x = rng.standard_normal((n, 3)).astype(np.float32)
    np.save(tmp_path / "plain.npy", x)
    plain = knng._inputs.as_input(np.load(tmp_path / "plain.npy", mmap_mode="r"), "data")
    assert duplicates.find_duplicates_in(plain, 5, torch.device("cpu"), block_rows=block) is None
    group = rng.permutation(n)[:4_000]
    x[group] = x[group[0]]
    np.save(tmp_path / "dup.npy", x)
    dup = knng._inputs.as_input(np.load(tmp_path / "dup.npy", mmap_mode="r"), "data")
    groups = duplicates.find_duplicates_in(dup, 5, torch.device("cpu"), block_rows=block)
    assert groups is not None and int(groups.sizes.max()) == 4_000
    big = int(torch.argmax(groups.sizes))
    members = groups.members[groups.starts[big]:groups.starts[big + 1]].numpy()
    np.testing.assert_array_equal(members, np.sort(group))
