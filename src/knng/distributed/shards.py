"""The exact merge of per-shard results, and the common centre and rows of every rank.

A rank's shard (its contiguous corpus rows in a search) is handed to the single-device engine as
an input that reads only those rows (:func:`knng._inputs.rows_subset`), so a memory-mapped or
HDF5 file is never read whole by one rank.

Merging per-shard top-k lists must give exactly the single-device answer. Each shard's list is
exact, its float64 distances pinned down to the float32 they round to; two entries from
different shards that round to the *same* float32 may still be in the wrong order (their screen
values are not compared against each other anywhere), so :func:`merge_exact` evaluates exactly
those entries from the input vectors and orders them by (distance, index), as the single-device
engine does for entries it cannot tell apart.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist

from knng._inputs import InputArray
from knng.distributed.comm import Comm, agree
from knng.engine.exact import exact_pairs_of, sort_by_distance_then_index
from knng.metrics import Metric
from knng.engine.kernels import finite_column_sums

__all__ = ["merge_exact", "merge_across_ranks", "common_centre", "all_gather_rows"]


def merge_exact(values: torch.Tensor, ids: torch.Tensor, k: int, rows: InputArray, corpus: InputArray,
                metric: Metric, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of per-shard exact lists laid side by side, in the single-device order.

    A pair in several lists (shares of a graph that all screened it) is kept once. Its copies'
    values may differ by the rounding of their evaluations, never past the float32 they round
    to, and entries that round to the same float32 are settled below.

    Parameters
    ----------
    values : torch.Tensor
        float64 (m, c): distances of the shards' results (+inf where a shard had fewer).
    ids : torch.Tensor
        int64 (m, c): their global indices (−1 where a shard had fewer).
    k : int
        How many to keep (c ≥ k).
    rows : InputArray
        The m rows' input vectors (for exact evaluations; read only where needed).
    corpus : InputArray
        The whole corpus (any row may be read).

    Returns
    -------
    (indices int64 (m, k), distances float64 (m, k))
    """
    values = torch.where(ids >= 0, values, torch.inf)
    idx, dist = _sorted_without_repeats(values, ids)
    valid = idx >= 0
    f32 = dist.to(torch.float32)
    same = f32[:, 1:] == f32[:, :-1]
    no = torch.zeros_like(same[:, :1])
    tied = (torch.cat([no, same], 1) | torch.cat([same, no], 1)) & valid
    # Only ties at or before the k-th value can change which entries are kept, or their order.
    tied &= f32 <= f32[:, k - 1:k]
    at, cols = torch.nonzero(tied, as_tuple=True)
    if at.numel():
        dist = dist.clone()
        dist[at, cols] = exact_pairs_of(metric, rows, at, corpus, idx[at, cols], device)
        touched = torch.unique(at)
        re_idx, re_dist = sort_by_distance_then_index(dist[touched], idx[touched], idx.shape[1])
        idx, dist = idx.clone(), dist
        idx[touched], dist[touched] = re_idx, re_dist
    return idx[:, :k], dist[:, :k]


def _sorted_without_repeats(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's entries by (distance, index), a pair's later copies made empty (−1, +inf).

    One sort by index finds the repeats (adjacent equal indices) and, the distance sort after
    it being stable, orders equal distances by index: what
    :func:`~knng.engine.exact.sort_by_distance_then_index` does, without its own index sort.
    Empty entries (−1, +inf) all come last and are alike.
    """
    order = torch.argsort(ids, dim=1, stable=True)
    ids = ids.gather(1, order)
    values = values.gather(1, order)
    repeat = torch.zeros_like(ids, dtype=torch.bool)
    repeat[:, 1:] = (ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] >= 0)
    values = torch.where(repeat, torch.inf, values)
    ids = torch.where(repeat, -1, ids)
    values, order = torch.sort(values, dim=1, stable=True)
    return ids.gather(1, order), values


def merge_across_ranks(values: torch.Tensor, ids: torch.Tensor, k: int, rows: InputArray,
                       corpus: InputArray, metric: Metric, comm: "Comm", device: torch.device, what: str,
                       exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's per-shard lists for the same rows, all-gathered and merged by :func:`merge_exact`.

    ``values``/``ids`` (m, w) are this rank's float64 distances and global indices (+inf / −1
    where it has fewer than w); every rank passes the same m and w; ``rows``: the m rows' input
    vectors. With ``exclude`` (m,), each row drops that index (a graph row's own point). Returns
    the k best, the same on every rank.
    """
    m, w = values.shape
    pack = torch.cat([values, ids.to(torch.float64)], dim=1)
    gathered = torch.empty((comm.world * m, 2 * w), dtype=torch.float64, device=device)
    comm.wait(comm.all_gather(gathered, pack, what))
    per = gathered.view(comm.world, m, 2 * w)
    values = per[:, :, :w].permute(1, 0, 2).reshape(m, comm.world * w)
    ids = per[:, :, w:].permute(1, 0, 2).reshape(m, comm.world * w).to(torch.int64)
    if exclude is not None:
        own = ids == exclude[:, None]
        values, ids = torch.where(own, torch.inf, values), torch.where(own, -1, ids)
    return merge_exact(values, ids, k, rows, corpus, metric, device)


def common_centre(blocks: Iterable[tuple[int, torch.Tensor]], n: int, d: int, name: str, metric: Metric,
                  comm: "Comm", device: torch.device) -> torch.Tensor | None:
    """Finite check and the float64 mean of all ranks' rows together, as ``metric`` centres them
    (``Metric.needs_centre`` of a search; the mean of the unit vectors, ``Metric.unit_rows``,
    for cosine and Pearson).

    ``blocks`` yields this rank's rows as (global index of the first row, rows). Every rank raises
    the same ``ValueError`` naming the first non-finite row of the whole input (an all-reduced
    minimum), so a bad value in one rank's rows stops every rank alike.
    """
    need_mean = metric.needs_centre(False)
    total = torch.zeros(d, dtype=torch.float64, device=device)
    first_bad = n
    for start, block in blocks:
        block = block.to(device, non_blocking=True)
        sums, bad = finite_column_sums(block, sums=need_mean and not metric.normalize)
        if bad is not None:
            first_bad = min(first_bad, start + bad)
        elif need_mean and metric.normalize:
            sums = metric.unit_rows(block.to(torch.float64)).sum(dim=0)
        if sums is not None:
            total += sums
    bad = torch.tensor([float(first_bad)], dtype=torch.float64, device=device)
    comm.wait(comm.all_reduce(bad, "the finite check", op=dist.ReduceOp.MIN))
    if int(bad.item()) < n:
        raise ValueError(f"{name} contains NaN or Inf (first in row {int(bad.item())}); knng needs finite values")
    if not need_mean:
        return None
    comm.wait(comm.all_reduce(total, "the sum for the common centre"))
    return total / n


def all_gather_rows(local: torch.Tensor, comm: "Comm", device: torch.device, what: str) -> torch.Tensor:
    """Every rank's rows of ``local`` (a different number on each rank), concatenated in rank order."""
    counts = agree(comm, device, {"rows": local.shape[0]})["rows"]
    most = max(counts)
    pad = torch.zeros((most, *local.shape[1:]), dtype=local.dtype, device=device)
    pad[:local.shape[0]] = local
    out = torch.empty((comm.world * most, *local.shape[1:]), dtype=local.dtype, device=device)
    comm.wait(comm.all_gather(out, pad, what))
    keep = torch.cat([torch.arange(r * most, r * most + c, device=device) for r, c in enumerate(counts)])
    return out[keep]
