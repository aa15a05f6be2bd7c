"""Exact duplicate rows, folded into one before a graph and unfolded after.

Image data repeat themselves: the 8×8 patches of twelve standard pictures (582,150 rows) hold a
flat region of 4,561 identical patches, and 71,177 rows have a twin. Every row of such a group
has as many neighbours at distance 0 as the group has other members, and every row near it sees
the whole group at one distance: ties that no screen can separate, which the exact finish
evaluates one by one (p99 5,641 exact evaluations per row on those patches, against 13 on
Gaussian data of the same shape). Folded, a group is one row.

Why the unfolded answer is exact. Let G be the group of row i and the other groups ranked for
i's representative by (distance, representative's index), each representative the smallest index
of its group. A point p of another group R among the k nearest of i by (distance, index): every
representative ranked before R is itself ranked before p (its distance is at most p's and its
index breaks a tie with R's representative, which is at most p), so at most k − 1 groups precede
R: R is among the k nearest groups, and p among R's first k members by index. A point of G among
the k nearest is among G's first k. So the k nearest of i are among G's first k members and the
first k members of its k nearest groups; sorted by (distance, index) and cut at k, those are the
answer. Members of a group share its representative's distances (the same input values), and a
row's distance to its own group is the metric's exact distance of the representative to itself.
This needs d(x, x) ≤ d(x, y) for all y (:func:`applies`: not the inner product).
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from knng._inputs import InputArray, as_input, check_finite
from knng._options import get_options
from knng.engine.kernels import unfold_rows, unfold_runs
from knng.engine.exact import flat_top_by_distance
from knng.metrics import Metric

__all__ = ["DuplicateGroups", "find_duplicates", "find_duplicates_in", "representatives", "applies", "folds",
           "unfold_graph", "unfold_search", "fingerprints", "groups_of_keys", "equal_rows", "repeats_in_sample",
           "read_rows", "GROUP_MIN", "SAMPLE_BLOCKS", "SAMPLE_ROWS"]

#: Fold only where some group has more rows than this and more than k + 1: smaller groups
#: create no ties beyond a row's k nearest, and folding costs a pass over the data and the
#: unfolding sorts.
GROUP_MIN = 16
#: Runs of consecutive rows (of :data:`SAMPLE_ROWS` at most) a file is sampled in before it is
#: read through for groups (:func:`find_duplicates_in`; files of more than four samples' rows).
SAMPLE_BLOCKS = 16
SAMPLE_ROWS = 256
#: The blocks a file is read in for groups take at most this share of the host budget.
HOST_SHARE = 16


@dataclass(frozen=True)
class DuplicateGroups:
    """Rows grouped by identical values.

    ``reps``: (u,) int64, each group's smallest row index, ascending (so a group's position
    orders as its representative does); ``group``: (n,) int64, each row's group; ``members``:
    (n,) int64, the rows ordered by (group, index); ``starts``: (u + 1,) int64 offsets of each
    group in ``members``.
    """

    reps: torch.Tensor
    group: torch.Tensor
    members: torch.Tensor
    starts: torch.Tensor

    @property
    def sizes(self) -> torch.Tensor:
        return self.starts[1:] - self.starts[:-1]

    def to(self, device: torch.device) -> "DuplicateGroups":
        """The same groups with their tensors on ``device``."""
        return DuplicateGroups(*(t.to(device) for t in (self.reps, self.group, self.members, self.starts)))


def applies(metric: Metric) -> bool:
    """Whether folding is exact for ``metric``: every point at least as near itself as any other
    (the Euclidean family, cosine and Pearson distances; not the inner product)."""
    return metric.name != "inner_product"


def folds(metric: Metric) -> bool:
    """Whether a run of ``metric`` folds identical rows: the options ask for it
    (``Options.fold_duplicates``) and it is exact for the metric (:func:`applies`). Every path
    asks this one question (one device, files, several ranks)."""
    return get_options().fold_duplicates and applies(metric)


def find_duplicates(x: torch.Tensor, k: int) -> DuplicateGroups | None:
    """The groups of identical rows of ``x`` where folding them pays (a group of more than
    :data:`GROUP_MIN` and more than k + 1 rows), else None.

    Rows are keyed by a fingerprint (their product with two fixed random vectors), sorted by
    it, and every row is checked equal (by value) to its key group's first row; a row that is
    not (a collision) stays a group of its own, and twins whose fingerprints happen to differ
    (a product's rounding may depend on a row's place in the block) stay apart: either only
    forgoes a fold. 582,150 × 64 float32 on 2 CPU cores: about 0.3 s.
    """
    if x.shape[0] < 2:
        return None
    return groups_of_keys(fingerprints(x), k, lambda rows, firsts: (x[rows] == x[firsts]).all(dim=1))


def find_duplicates_in(data: InputArray, k: int, device: torch.device, *, host_budget: int | None = None,
                       block_rows: int | None = None) -> DuplicateGroups | None:
    """:func:`find_duplicates` of an input read in blocks (a memory map, a dataset): the
    fingerprints block by block on ``device``, then only the rows whose key group has another
    row read again and compared with their group's first row (on the device). Data of more
    than four samples' rows, in memory or in a file, are looked through only where a sample of
    them repeats a row (:func:`repeats_in_sample`). ``host_budget``: the bytes of host memory
    the run may hold, which bounds the blocks read (:func:`read_rows`); ``block_rows``: rows a
    block instead."""
    if data.tensor is None and block_rows is None:
        block_rows = read_rows(data.d, host_budget)
    sample_rows = SAMPLE_ROWS if block_rows is None else min(SAMPLE_ROWS, block_rows)
    if data.n > 4 * SAMPLE_BLOCKS * sample_rows and not repeats_in_sample(data, device, sample_rows):
        # In memory too: the whole check was about a fifth of a small search on a CPU (100
        # queries in 100,000 × 64: 9 of 43 ms, every call), and groups that pay for folding
        # show in the sample (a group of 300 rows among 100,000 escapes it with odds of 10⁻⁴).
        return None
    if data.tensor is not None:
        rows = data.tensor.to(device)
        groups = find_duplicates(rows, k)
        if groups is not None:  # folded, the engine's own check would number the representatives
            check_finite(rows, data.name, 0)
        return groups
    if data.n < 2:
        return None
    assert block_rows is not None
    keys = []
    for start, block in data.iter_blocks(block_rows):
        block = block.to(device)
        check_finite(block, data.name, start)
        keys.append(fingerprints(block))
    return groups_of_keys(torch.cat(keys), k, lambda rows, firsts: equal_rows(data, rows, firsts, device, block_rows))


def read_rows(d: int, host_budget: int | None) -> int:
    """Rows a block of a file read for groups: its copies (as read, on the device, as float, the
    next read waiting) within 1/:data:`HOST_SHARE` of ``host_budget`` (None: no bound), and at
    most 65,536."""
    if host_budget is None:
        return 1 << 16
    return int(max(1, min(1 << 16, host_budget // HOST_SHARE // (8 * max(1, d)))))


def repeats_in_sample(data: InputArray, device: torch.device, run_rows: int) -> bool:
    """Whether :data:`SAMPLE_BLOCKS` runs of ``run_rows`` consecutive rows spread over ``data``
    hold two rows of one fingerprint: data are looked through for groups only then. Groups that pay for
    their folding are large (each row's ties grow with its group), and a large group shows in such a
    sample; a file without them is then read once less (2M × 128 float32 from a memory map on an
    H200: the whole pass cost 1.4 s of a 15.5 s graph)."""
    stride = data.n // SAMPLE_BLOCKS
    keys = torch.cat([fingerprints(data.rows(s, s + run_rows).to(device))
                      for s in range(0, stride * SAMPLE_BLOCKS, stride)])
    ordered = keys[_lexicographic_order(keys)]
    return bool((ordered[1:] == ordered[:-1]).all(dim=1).any())


def equal_rows(data: InputArray, rows: torch.Tensor, firsts: torch.Tensor, device: torch.device,
                block_rows: int) -> torch.Tensor:
    """Whether each of ``rows`` of ``data`` equals the row ``firsts`` at its place, read again."""
    same = torch.empty(rows.numel(), dtype=torch.bool, device=device)
    for r0 in range(0, rows.numel(), block_rows):
        r1 = min(rows.numel(), r0 + block_rows)
        same[r0:r1] = (data.take(rows[r0:r1]).to(device) == data.take(firsts[r0:r1]).to(device)).all(dim=1)
    return same


def groups_of_keys(keys: torch.Tensor, k: int, equal: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
               ) -> DuplicateGroups | None:
    """The groups of :func:`find_duplicates` from the rows' fingerprints (n, 2); ``equal(rows,
    firsts)``: whether each row's values equal those of the first row of its key group."""
    n, device = keys.shape[0], keys.device
    order = _lexicographic_order(keys)
    sorted_keys = keys[order]
    # The sorted keys hold a run of more than `most` equal keys iff some key equals the one
    # `most` places on: one comparison and one synchronisation, where most data fold nothing
    # (a cummax of the runs' starts took 2.7 ms of a 1M-row search on an H200; a bincount
    # synchronises to size its output).
    most = max(GROUP_MIN, k + 1)
    if n <= most or not bool((sorted_keys[most:] == sorted_keys[:-most]).all(dim=1).any()):
        return None
    starts_key = torch.ones(n, dtype=torch.bool, device=device)
    starts_key[1:] = (sorted_keys[1:] != sorted_keys[:-1]).any(dim=1)
    key_group = torch.empty(n, dtype=torch.int64, device=device)
    key_group[order] = torch.cumsum(starts_key, 0) - 1
    # Each key group's first row; rows not equal to it are groups of their own.
    first = torch.full((int(key_group.max()) + 1,), n, dtype=torch.int64, device=device)
    first.scatter_reduce_(0, key_group, torch.arange(n, device=device), reduce="amin")
    rows = torch.arange(n, device=device)
    firsts = first[key_group]
    rep_of = rows.clone()
    twins = torch.nonzero(firsts != rows).flatten()  # a row is its own group's first
    rep_of[twins] = torch.where(equal(twins, firsts[twins]), firsts[twins], twins)
    reps, group = torch.unique(rep_of, sorted=True, return_inverse=True)
    counts = torch.bincount(group, minlength=reps.numel())
    if int(counts.max()) <= max(GROUP_MIN, k + 1):
        return None
    members = torch.argsort(group, stable=True)
    starts = torch.zeros(reps.numel() + 1, dtype=torch.int64, device=device)
    starts[1:] = torch.cumsum(counts, 0)
    return DuplicateGroups(reps=reps, group=group, members=members, starts=starts)


def representatives(data: InputArray, groups: DuplicateGroups) -> InputArray:
    """The groups' representative rows as an input of their own: a tensor of them where ``data``
    is one, else a lazy view that reads only them from ``data``'s file."""
    reps = groups.reps
    if data.tensor is not None:
        return as_input(data.tensor[reps.to(data.tensor.device)], data.name)
    source = _RowsAt(data.source, reps.cpu().numpy())
    return InputArray(data.name, "rows", (reps.numel(), data.d), data.dtype, data.device, source=source,
                      bf16_view=data.bf16_view)


class _RowsAt:
    """Rows ``rows`` (ascending) of a row source (a memory map, a dataset), indexed like one."""

    def __init__(self, base: Any, rows: np.ndarray) -> None:
        self.base, self.rows = base, rows
        self.shape = (rows.size, *base.shape[1:])
        self.dtype = base.dtype
        #: Rows in any order, repeats allowed, read in one index (``InputArray.take``), as a
        #: NumPy array (a memory map) reads them; a dataset wants ascending rows.
        self.any_rows = isinstance(base, np.ndarray)

    def __len__(self) -> int:
        return int(self.rows.size)

    def __getitem__(self, key: Any) -> np.ndarray:
        # Ascending rows in, ascending rows out: what h5py's fancy indexing needs.
        return np.asarray(self.base[self.rows[key]])


def fingerprints(x: torch.Tensor) -> torch.Tensor:
    """(n, 2) keys of the rows, equal for rows of equal values wherever the product rounds
    alike: the rows times two fixed random vectors (float64 rows in float64, others float32)."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.to(dtype) @ _fingerprint_vectors(x.shape[1], x.device, dtype)


@functools.lru_cache(maxsize=64)
def _fingerprint_vectors(d: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The two fixed random vectors of :func:`fingerprints`, drawn on the host and copied once
    per device (a copy from the host is a synchronisation on a GPU)."""
    gen = torch.Generator(device="cpu").manual_seed(17)
    return torch.randn((d, 2), generator=gen, dtype=torch.float64).to(device, dtype)


def _lexicographic_order(keys: torch.Tensor) -> torch.Tensor:
    """An order of the rows of (n, 2) ``keys`` that sorts them by (first, second) key (rows of
    equal keys in any order). float32 keys go in one sort of an int64 built from both keys'
    order-preserving bit patterns (two equal keys have equal patterns; a NaN key sorts by its
    bits, and its row's values never equal another's); float64 keys in two stable sorts."""
    if keys.dtype == torch.float32:
        # + 0.0 makes -0.0 the +0.0 it equals (equal keys, equal patterns).
        bits = (keys + 0.0).contiguous().view(torch.int32).to(torch.int64)
        # Negative floats order in reverse of their bits: flip all but the sign bit. Then the
        # signed 32-bit patterns order as the floats: the first key's, signed, in the high
        # half; the second's, made unsigned, in the low one.
        ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        return torch.argsort((ordered[:, 0] << 32) | (ordered[:, 1] + 2**31))
    order = torch.argsort(keys[:, 1], stable=True)
    return order[torch.argsort(keys[order, 0], stable=True)]


def unfold_graph(groups: DuplicateGroups, idx: torch.Tensor, dist: torch.Tensor, self_dist: torch.Tensor, k: int,
                 include_self: bool, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """The graph of every row (or of the rows ``rows``) from the graph of the groups' representatives.

    ``idx``/``dist``: (u, k_u) the representatives' nearest other representatives (positions in
    ``groups.reps``), float64 distances; ``self_dist``: (u,) each representative's exact
    distance to itself. Returns (n, k) int64 row indices and float64 distances, ascending by
    (distance, index); each row's own index only with ``include_self``. ``rows``: a range of
    the rows, for a caller that writes only those (a rank of a distributed run).
    """
    return _unfold(groups, groups.group, idx, dist, k, own=self_dist, drop_self=not include_self, answer_rows=rows)


def unfold_search(groups: DuplicateGroups, idx: torch.Tensor, dist: torch.Tensor, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A search's answer over every corpus row from its answer over the groups' representatives
    (``idx``/``dist``: (m, k_u), positions in ``groups.reps``): (m, k) corpus row indices and
    float64 distances, ascending by (distance, index)."""
    return _unfold(groups, None, idx, dist, k)


def _unfold(groups: DuplicateGroups, own_group: torch.Tensor | None, idx: torch.Tensor, dist: torch.Tensor, k: int,
            own: torch.Tensor | None = None, drop_self: bool = False, rows_per_chunk: int = 65536,
            answer_rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
    """Each answer row's candidates — the first members (by index) of its own group
    (``own_group[row]``, at distance ``own[group]``; graphs only) and of each group in its row of
    ``idx`` (−1: none, after the others) at the distance in ``dist`` — sorted by (distance,
    index), the row itself dropped with ``drop_self``, cut at k (see the module's proof).
    ``answer_rows``: the graph rows answered (a range of ``own_group``'s; all by default).

    Most rows are their candidate groups' members laid end to end (on a GPU by one kernel,
    ``kernels.unfold_rows``; else :func:`_unfold_by_slots`: fixed shapes, no sort); the rows
    where that order is wrong (one distance to groups whose members interleave by index) are
    sorted (:func:`_unfold_by_sort`): 33,850 rows of the 582,150 8×8 image patches at k = 100.
    Before, every row that was not alone with single-row neighbours expanded k + 1 members of
    each of its groups and sorted them: 42.8 ms of a 330 ms graph there, 5.5 ms now (H200,
    2026-11-26; 18.4 → 3.2 ms on the 16×16 patches)."""
    device = idx.device
    position = None
    if own_group is not None and drop_self:  # each row's place among its group's members
        position = torch.empty_like(groups.members)
        position[groups.members] = torch.arange(groups.members.numel(), device=device)
        position = position[answer_rows]
    if own_group is not None:  # answer row r is own_group's r-th row of the range
        own_group = own_group[answer_rows]
    m = idx.shape[0] if own_group is None else own_group.numel()
    width = idx.shape[1] + (own_group is not None)
    # Rows a chunk: (rows × lists) arrays of at most Options.duplicate_list_entries entries.
    rows_per_chunk = max(1, min(rows_per_chunk, get_options().duplicate_list_entries // max(1, width)))
    if unfold_runs(device, width, k):
        out_idx, out_dist, unordered = unfold_rows(groups.sizes, groups.starts, groups.members, groups.reps,
                                                   own_group, idx, dist, k, own, position)
        sort = torch.nonzero(unordered).flatten()
        for r0 in range(0, sort.numel(), rows_per_chunk):
            rows = sort[r0:r0 + rows_per_chunk]
            lists = _CandidateLists.of(groups, own_group, idx, dist, k, own, position, rows)
            _sort_into(out_idx, out_dist, rows, groups, lists, k)
        return out_idx, out_dist
    out_idx = torch.empty((m, k), dtype=torch.int64, device=device)
    out_dist = torch.empty((m, k), dtype=torch.float64, device=device)
    for r0 in range(0, m, rows_per_chunk):
        rows = torch.arange(r0, min(m, r0 + rows_per_chunk), device=device)
        lists = _CandidateLists.of(groups, own_group, idx, dist, k, own, position, rows)
        out_idx[rows], out_dist[rows], unordered = _unfold_by_slots(groups, lists, k)
        sort = torch.nonzero(unordered).flatten()
        if sort.numel():
            _sort_into(out_idx, out_dist, rows[sort], groups, lists.rows(sort), k)
    return out_idx, out_dist


# Options.duplicate_list_entries and duplicate_sort_entries bound one chunk: rows whose lists
# all tie (one-hot data: every distance √2) expand up to k members of each list.


def _sort_into(out_idx: torch.Tensor, out_dist: torch.Tensor, rows: torch.Tensor, groups: DuplicateGroups,
               lists: "_CandidateLists", k: int) -> None:
    """:func:`_unfold_by_sort` of ``lists`` (of answer ``rows``) into the outputs, in batches of
    rows that expand at most ``Options.duplicate_sort_entries`` candidates (a row's own count whatever it is)."""
    ends = torch.cumsum(lists.length.sum(dim=1), 0).tolist()  # the one synchronisation
    start = 0
    while start < len(ends):
        before = ends[start - 1] if start else 0
        stop = max(start + 1, bisect.bisect_right(ends, before + get_options().duplicate_sort_entries, lo=start))
        part = slice(start, stop)
        out_idx[rows[part]], out_dist[rows[part]] = _unfold_by_sort(groups, lists.rows(part), k,
                                                                    total=ends[stop - 1] - before)
        start = stop


class _CandidateLists(NamedTuple):
    """Rows' candidate lists in the order :func:`_unfold` reads them: each row's own group (graphs)
    and then its ranked groups, (m, L) each.

    ``group``: the list's group (0 where there is none); ``dist``: its distance; ``length``: its
    members that can be among the row's first k (below); ``start``: the slot of its first member
    with the lists laid end to end (an exclusive cumulative sum of ``length``); ``place``: (m,)
    the row's own place in its group's members, which its own list skips (−1: not skipped).

    A list's members rank after every member of the lists at smaller distances, so of a list at
    the distance of lists with P members before it, only its first k − P can be among the first k
    (0 where P ≥ k): a row next to a flat image region whose nearest group holds 4,561 identical
    patches takes k of them and nothing after, not k + 1 of each of its k groups."""

    group: torch.Tensor
    dist: torch.Tensor
    length: torch.Tensor
    start: torch.Tensor
    place: torch.Tensor

    @staticmethod
    def of(groups: DuplicateGroups, own_group: torch.Tensor | None, idx: torch.Tensor, dist: torch.Tensor, k: int,
           own: torch.Tensor | None, position: torch.Tensor | None, rows: torch.Tensor) -> "_CandidateLists":
        """The lists of answer ``rows``; ``position``: each row's place in ``groups.members``,
        where the row leaves its own list (a graph without its points themselves)."""
        if own_group is None:
            group, lists_dist = idx[rows], dist[rows]
        else:
            assert own is not None
            g = own_group[rows]
            group = torch.cat([g[:, None], idx[g]], dim=1)
            lists_dist = torch.cat([own[g][:, None], dist[g]], dim=1)
        present = group >= 0
        group = group.clamp_min(0)
        length = torch.where(present, groups.sizes[group], 0)
        place = torch.full_like(rows, -1)
        if position is not None:
            length[:, 0] -= 1
            place = position[rows] - groups.starts[group[:, 0]]
        # Members before each list's distance: the members before the first list of its run, the
        # running maximum of those counts at the runs' first lists (they only grow).
        run = torch.ones_like(present)
        run[:, 1:] = lists_dist[:, 1:] != lists_dist[:, :-1]
        before = torch.cumsum(length, dim=1).sub_(length).mul_(run)
        before = torch.cummax(before, dim=1).values
        length = torch.minimum(length, before.neg_().add_(k)).clamp_min_(0)
        return _CandidateLists(group, lists_dist, length, torch.cumsum(length, dim=1).sub_(length), place)

    def rows(self, which: "torch.Tensor | slice") -> "_CandidateLists":
        """The lists of rows ``which`` only."""
        return _CandidateLists(*(t[which] for t in self))


def _member(groups: DuplicateGroups, group: torch.Tensor, list_index: torch.Tensor, offset: torch.Tensor,
            place: torch.Tensor) -> torch.Tensor:
    """The member at ``offset`` of a row's list ``list_index`` of ``group`` (same shapes),
    stepping past the row itself (at ``place``, −1: none) in its own list, list 0."""
    offset = offset + ((list_index == 0) & (place >= 0) & (offset >= place)).to(offset.dtype)
    return groups.members[(groups.starts[group] + offset).clamp_max(groups.members.numel() - 1)]


def _unfold_by_slots(groups: DuplicateGroups, lists: _CandidateLists, k: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_unfold` of the rows of ``lists`` by laying their lists end to end: slot s of a row
    is member s − start of the list whose starts enclose s (a batched binary search, (m, k)
    entries, no sort; two synchronisations find the few rows that need more).

    The lists come in ascending distance, each in ascending index, so this is the order by
    (distance, index) unless two consecutive lists are at one distance and the first's last
    member follows the second's first (its representative, the group's smallest index); ties
    between single rows are in order already (groups rank by their representatives). Only pairs
    whose first list starts before slot k matter: a later list at that distance starts after the
    second's first member, hence after every slot's member. Returns (m, k) indices and distances
    (−1 and +inf past a row's candidates) and the rows whose order is wrong (bool, (m,)), which
    the caller sorts instead."""
    m, width = lists.group.shape
    ends = lists.start + lists.length
    slots = torch.arange(k, device=ends.device).expand(m, k).contiguous()
    which = torch.searchsorted(ends, slots, right=True)
    empty = which >= width
    which = which.clamp_max(max(0, width - 1))
    offset = slots.sub_(lists.start.gather(1, which))
    # The row itself leaves its own list (list 0): only rows whose own group has other members
    # step past it (most rows' own list is empty), so only theirs are adjusted.
    own = torch.nonzero((lists.place >= 0) & (lists.length[:, 0] > 0)).flatten()
    if own.numel():
        offset[own] += ((which[own] == 0) & (offset[own] >= lists.place[own, None])).to(offset.dtype)
    at = groups.starts[lists.group.gather(1, which)].add_(offset).clamp_max_(groups.members.numel() - 1)
    out_idx = torch.where(empty, -1, groups.members[at])
    out_dist = torch.where(empty, torch.inf, lists.dist.gather(1, which))
    # Consecutive lists out of order: both with members, the first starting before k, at one
    # distance (rare: these are the only pairs whose members are read), the first's last member
    # after the second's first.
    rows, first = torch.nonzero((lists.length[:, :-1] > 0) & (lists.length[:, 1:] > 0) & (lists.start[:, :-1] < k)
                                & (lists.dist[:, :-1] == lists.dist[:, 1:]), as_tuple=True)
    last = _member(groups, lists.group[rows, first], first, lists.length[rows, first] - 1, lists.place[rows])
    unordered = torch.zeros(m, dtype=torch.bool, device=ends.device)
    unordered[rows[last > groups.reps[lists.group[rows, first + 1]]]] = True
    return out_idx, out_dist, unordered


def _unfold_by_sort(groups: DuplicateGroups, lists: _CandidateLists, k: int, total: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_unfold` of the rows of ``lists`` by sorting their candidates: every list's members
    expanded, ordered by (row, distance, index), cut at k (the rows :func:`_unfold_by_slots`
    cannot order). ``total``: the candidates, which the caller (:func:`_sort_into`) has counted."""
    m, width = lists.group.shape
    device = lists.group.device
    flat_length = lists.length.reshape(-1)
    flat = torch.repeat_interleave(torch.arange(flat_length.numel(), device=device), flat_length, output_size=total)
    owner, list_index = flat // width, flat % width
    # Each candidate's place in its list: its position less its list's first, the lists laid
    # out row after row.
    offset = torch.arange(total, device=device) - (torch.cumsum(flat_length, 0) - flat_length)[flat]
    member = _member(groups, lists.group.reshape(-1)[flat], list_index, offset, lists.place[owner])
    return flat_top_by_distance(owner, member, lists.dist.reshape(-1)[flat], m, k,
                                narrow=groups.members.numel() < 2**31)
