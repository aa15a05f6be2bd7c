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

from dataclasses import dataclass

import torch

from knng.engine.exact import flat_top_by_distance
from knng.metrics import Metric

__all__ = ["DuplicateGroups", "find_duplicates", "applies", "unfold_graph", "unfold_search", "GROUP_MIN"]

#: Fold only where some group has more rows than this and more than k + 1: smaller groups
#: create no ties beyond a row's k nearest, and folding costs a pass over the data and the
#: unfolding sorts.
GROUP_MIN = 16


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


def applies(metric: Metric) -> bool:
    """Whether folding is exact for ``metric``: every point at least as near itself as any other
    (the Euclidean family, cosine and Pearson distances; not the inner product)."""
    return metric.name != "inner_product"


def find_duplicates(x: torch.Tensor, k: int) -> DuplicateGroups | None:
    """The groups of identical rows of ``x`` where folding them pays (a group of more than
    :data:`GROUP_MIN` and more than k + 1 rows), else None.

    Rows are keyed by a fingerprint (their product with two fixed random vectors), sorted by
    it, and every row is checked equal (by value) to its key group's first row; a row that is
    not (a collision) stays a group of its own, and twins whose fingerprints happen to differ
    (a product's rounding may depend on a row's place in the block) stay apart: either only
    forgoes a fold. 582,150 × 64 float32 on 2 CPU cores: about 0.3 s.
    """
    n = x.shape[0]
    if n < 2:
        return None
    keys = _fingerprints(x)
    order = torch.argsort(keys[:, 1], stable=True)
    order = order[torch.argsort(keys[order, 0], stable=True)]
    sorted_keys = keys[order]
    starts_key = torch.ones(n, dtype=torch.bool, device=x.device)
    starts_key[1:] = (sorted_keys[1:] != sorted_keys[:-1]).any(dim=1)
    key_group = torch.empty(n, dtype=torch.int64, device=x.device)
    key_group[order] = torch.cumsum(starts_key, 0) - 1
    key_counts = torch.bincount(key_group)
    if int(key_counts.max()) <= max(GROUP_MIN, k + 1):
        return None
    # Each key group's first row; rows not equal to it are groups of their own.
    first = torch.full((key_counts.numel(),), n, dtype=torch.int64, device=x.device)
    first.scatter_reduce_(0, key_group, torch.arange(n, device=x.device), reduce="amin")
    same = (x == x[first[key_group]]).all(dim=1)
    rep_of = torch.where(same, first[key_group], torch.arange(n, device=x.device))
    reps, group = torch.unique(rep_of, sorted=True, return_inverse=True)
    counts = torch.bincount(group, minlength=reps.numel())
    if int(counts.max()) <= max(GROUP_MIN, k + 1):
        return None
    members = torch.argsort(group, stable=True)
    starts = torch.zeros(reps.numel() + 1, dtype=torch.int64, device=x.device)
    starts[1:] = torch.cumsum(counts, 0)
    return DuplicateGroups(reps=reps, group=group, members=members, starts=starts)


def _fingerprints(x: torch.Tensor) -> torch.Tensor:
    """(n, 2) keys of the rows, equal for rows of equal values wherever the product rounds
    alike: the rows times two fixed random vectors (float64 rows in float64, others float32)."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(17)
    r = torch.randn((x.shape[1], 2), generator=gen, dtype=torch.float64).to(x.device, dtype)
    return x.to(dtype) @ r


def unfold_graph(groups: DuplicateGroups, idx: torch.Tensor, dist: torch.Tensor, self_dist: torch.Tensor, k: int,
                 include_self: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The graph of every row from the graph of the groups' representatives.

    ``idx``/``dist``: (u, k_u) the representatives' nearest other representatives (positions in
    ``groups.reps``), float64 distances; ``self_dist``: (u,) each representative's exact
    distance to itself. Returns (n, k) int64 row indices and float64 distances, ascending by
    (distance, index); each row's own index only with ``include_self``.
    """
    return _unfold(groups, groups.group, idx, dist, k, own=self_dist, drop_self=not include_self)


def unfold_search(groups: DuplicateGroups, idx: torch.Tensor, dist: torch.Tensor, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A search's answer over every corpus row from its answer over the groups' representatives
    (``idx``/``dist``: (m, k_u), positions in ``groups.reps``): (m, k) corpus row indices and
    float64 distances, ascending by (distance, index)."""
    return _unfold(groups, None, idx, dist, k)


def _unfold(groups: DuplicateGroups, own_group: torch.Tensor | None, idx: torch.Tensor, dist: torch.Tensor, k: int,
            own: torch.Tensor | None = None, drop_self: bool = False, rows_per_chunk: int = 65536
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each answer row's candidates — the first k + 1 members (by index) of its own group
    (``own_group[row]``, at distance ``own[group]``; graphs only) and of each group in its row of
    ``idx`` (−1: none) at the distance in ``dist`` — sorted by (distance, index), the row itself
    dropped with ``drop_self``, cut at k (see the module's proof)."""
    m, device = idx.shape[0] if own_group is None else own_group.numel(), idx.device
    sizes = groups.sizes
    out_idx = torch.empty((m, k), dtype=torch.int64, device=device)
    out_dist = torch.empty((m, k), dtype=torch.float64, device=device)
    for r0 in range(0, m, rows_per_chunk):
        rows = torch.arange(r0, min(m, r0 + rows_per_chunk), device=device)
        if own_group is not None and drop_self and idx.shape[1] >= k:
            # A row alone in its group whose k nearest groups are single rows too: its answer is
            # its representative's row as it is (each group's one member is its representative,
            # ordered by (distance, index) already). Most rows of image patches (88 % have no
            # twin): the merge below sorts every candidate, (k + 1)² a row at most.
            g = own_group[rows]
            near = idx[g, :k]
            alone = (sizes[g] == 1) & ((near >= 0) & (sizes[near.clamp_min(0)] == 1)).all(dim=1)
            out_idx[rows], out_dist[rows] = groups.reps[near.clamp_min(0)], dist[g, :k]
            rows = rows[~alone]
            if rows.numel() == 0:
                continue
        if own_group is None:
            cand_group, cand_dist = idx[rows], dist[rows]
        else:
            g = own_group[rows]
            assert own is not None
            cand_group = torch.cat([g[:, None], idx[g]], dim=1)
            cand_dist = torch.cat([own[g][:, None], dist[g]], dim=1)
        take = torch.where(cand_group >= 0, sizes[cand_group.clamp_min(0)].clamp_max(k + 1), 0)
        flat_take = take.reshape(-1)
        total = int(flat_take.sum())
        owner = torch.repeat_interleave(torch.arange(rows.numel(), device=device), take.sum(1))
        slot = torch.repeat_interleave(torch.arange(flat_take.numel(), device=device), flat_take)
        offset = torch.arange(total, device=device) - torch.repeat_interleave(torch.cumsum(flat_take, 0) - flat_take,
                                                                               flat_take)
        member = groups.members[groups.starts[cand_group.reshape(-1).clamp_min(0)[slot]] + offset]
        d = cand_dist.reshape(-1)[slot]
        if drop_self:
            keep = member != rows[owner]
            owner, member, d = owner[keep], member[keep], d[keep]
        out_idx[rows], out_dist[rows] = flat_top_by_distance(owner, member, d, rows.numel(), k,
                                                             narrow=groups.members.numel() < 2**31)
    return out_idx, out_dist
