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

from typing import Any

import numpy as np
import torch

from knng._inputs import InputArray
from knng.engine.exact import _exact_pairs, _sort_by_value_then_index
from knng.metrics import Metric

__all__ = ["rows_subset", "merge_exact", "RangesSource"]


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
    idx, dist = _sort_by_value_then_index(values, ids, values.shape[1])
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
        dist[rows, cols] = _exact_pairs(metric, raw_rows, rows, corpus, idx[rows, cols], device)
        touched = torch.unique(rows)
        re_idx, re_dist = _sort_by_value_then_index(dist[touched], idx[touched], idx.shape[1])
        idx, dist = idx.clone(), dist
        idx[touched], dist[touched] = re_idx, re_dist
    return idx[:, :k], dist[:, :k]
