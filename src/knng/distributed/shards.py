"""Row subsets of an input as inputs of their own, and the exact merge of per-shard results.

A rank's shard (its contiguous corpus rows in a search, its owned parts in a graph) is handed to
the single-device engine as an :class:`~knng._inputs.InputArray` that reads only those rows from
the user's input, so a memory-mapped or HDF5 file is never read whole by one rank.

Merging per-shard top-k lists must give exactly the single-device answer. Each shard's list is
exact, its float64 distances pinned down to the float32 they round to; two entries from
different shards that round to the *same* float32 may still be in the wrong order (their screen
values are not compared against each other anywhere), so :func:`merge_exact` evaluates exactly
those entries from the input vectors and orders them by (distance, index), as the single-device
engine does for entries it cannot tell apart.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import torch
import torch.distributed as dist

from knng._inputs import InputArray
from knng.distributed.comm import Comm, agree
from knng.engine.exact import exact_pairs, sort_by_distance_then_index
from knng.metrics import Metric
from knng.engine.kernels import finite_column_sums

__all__ = ["rows_subset", "merge_exact", "merge_across_ranks", "common_centre", "all_gather_rows", "RangesSource"]


class RangesSource:
    """Row-sliceable view of the rows ``ranges`` (ascending (start, stop) pairs) of an input.

    Supports what :class:`InputArray` asks of a lazy source: ``shape``, ``dtype``, slices and
    increasing integer-array indexing.
    """

    def __init__(self, base: InputArray, ranges: list[tuple[int, int]]) -> None:
        self.base = base
        self.ranges = [(int(a), int(b)) for a, b in ranges if b > a]
        lengths = np.array([b - a for a, b in self.ranges], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.starts = np.array([a for a, _ in self.ranges], dtype=np.int64)
        self.shape = (int(self.offsets[-1]), base.d)
        self.dtype = np.dtype(np.uint16) if base.bf16_view else _numpy_dtype(base.source)

    def __len__(self) -> int:
        return self.shape[0]

    def to_global(self, local: np.ndarray) -> np.ndarray:
        """Global row numbers of local rows."""
        which = np.searchsorted(self.offsets, local, side="right") - 1
        return self.starts[which] + (local - self.offsets[which])

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.shape[0])
            if step != 1:
                raise IndexError("RangesSource supports contiguous slices only")
            pieces = []
            for (a, _b), o0, o1 in zip(self.ranges, self.offsets[:-1], self.offsets[1:]):
                lo, hi = max(start, int(o0)), min(stop, int(o1))
                if lo < hi:
                    pieces.append(np.asarray(self.base.source[a + lo - int(o0):a + hi - int(o0)]))
            if not pieces:
                return np.empty((0, self.shape[1]), dtype=self.dtype)
            return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        local = np.asarray(index, dtype=np.int64)
        return np.asarray(self.base.source[self.to_global(local)])


def _numpy_dtype(source: Any) -> np.dtype:
    return np.dtype(source.dtype)


def rows_subset(base: InputArray, ranges: list[tuple[int, int]], name: str | None = None) -> InputArray:
    """The rows ``ranges`` of ``base`` (concatenated in order) as an input of their own.

    In-memory inputs give a tensor (a view for one range, a copy of just these rows otherwise);
    lazy inputs (memory maps, HDF5) give a lazy view that reads only these rows.
    """
    ranges = [(a, b) for a, b in ranges if b > a]
    n = sum(b - a for a, b in ranges)
    name = name or base.name
    if base.tensor is not None:
        if not ranges:
            tensor = base.tensor[:0]
        elif len(ranges) == 1:
            tensor = base.tensor[ranges[0][0]:ranges[0][1]]
        else:
            tensor = torch.cat([base.tensor[a:b] for a, b in ranges])
        return InputArray(name, "torch", (n, base.d), base.dtype, base.device, tensor=tensor)
    source = RangesSource(base, ranges)
    return InputArray(name, "rows", (n, base.d), base.dtype, base.device, source=source, bf16_view=base.bf16_view)


def merge_exact(values: torch.Tensor, ids: torch.Tensor, k: int, raw_rows: torch.Tensor, corpus: InputArray,
                metric: Metric, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of per-shard exact lists laid side by side, in the single-device order.

    Parameters
    ----------
    values : torch.Tensor
        float64 (m, c): distances of the shards' results (+inf where a shard had fewer).
    ids : torch.Tensor
        int64 (m, c): their global indices (−1 where a shard had fewer).
    k : int
        How many to keep (c ≥ k).
    raw_rows : torch.Tensor
        (m, d) the rows' input vectors (for exact evaluations).
    corpus : InputArray
        The whole corpus (any row may be read).

    Returns
    -------
    (indices int64 (m, k), distances float64 (m, k))
    """
    values = torch.where(ids >= 0, values, torch.inf)
    idx, dist = sort_by_distance_then_index(values, ids, values.shape[1])
    valid = idx >= 0
    f32 = dist.to(torch.float32)
    same = f32[:, 1:] == f32[:, :-1]
    no = torch.zeros_like(same[:, :1])
    tied = (torch.cat([no, same], 1) | torch.cat([same, no], 1)) & valid
    # Only ties at or before the k-th value can change which entries are kept, or their order.
    tied &= f32 <= f32[:, k - 1:k]
    rows, cols = torch.nonzero(tied, as_tuple=True)
    if rows.numel():
        dist = dist.clone()
        dist[rows, cols] = exact_pairs(metric, raw_rows, rows, corpus, idx[rows, cols], device)
        touched = torch.unique(rows)
        re_idx, re_dist = sort_by_distance_then_index(dist[touched], idx[touched], idx.shape[1])
        idx, dist = idx.clone(), dist
        idx[touched], dist[touched] = re_idx, re_dist
    return idx[:, :k], dist[:, :k]


def merge_across_ranks(values: torch.Tensor, ids: torch.Tensor, k: int, raw_rows: torch.Tensor,
                       corpus: InputArray, metric: Metric, comm: "Comm", device: torch.device, what: str,
                       exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's per-shard lists for the same rows, all-gathered and merged by :func:`merge_exact`.

    ``values``/``ids`` (m, w) are this rank's float64 distances and global indices (+inf / −1
    where it has fewer than w); every rank passes the same m and w. With ``exclude`` (m,), each
    row drops that index (a graph row's own point). Returns the k best, the same on every rank.
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
    return merge_exact(values, ids, k, raw_rows, corpus, metric, device)


def common_centre(blocks: Iterable[tuple[int, torch.Tensor]], n: int, d: int, name: str, need_mean: bool,
                  comm: "Comm", device: torch.device) -> torch.Tensor | None:
    """Finite check and the float64 mean of all ranks' rows together.

    ``blocks`` yields this rank's rows as (global index of the first row, rows). Every rank raises
    the same ``ValueError`` naming the first non-finite row of the whole input (an all-reduced
    minimum), so a bad value in one rank's rows stops every rank alike.
    """
    total = torch.zeros(d, dtype=torch.float64, device=device)
    first_bad = n
    for start, block in blocks:
        block = block.to(device, non_blocking=True)
        sums, bad = finite_column_sums(block, sums=need_mean)
        if bad is not None:
            first_bad = min(first_bad, start + bad)
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
