"""The threshold screen of one score block: which pairs a row (or column) must keep.

A pair survives for row i when its screened key s̃ᵢⱼ is ≤ the row's block threshold tᵢ
(τᵢ plus an error radius valid for every column of the block); in a symmetric graph block the
same entry is also tested for column j against tⱼ. Most rows of a block keep nothing once
their thresholds are tight, so each side is first filtered by its minimum (one cheap reduction
that reads the block once) and only rows/columns that can keep anything are compared entry by
entry. The CPU reference and the GPU path are the same torch code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Survivors", "row_survivors", "column_survivors"]

#: Compare the whole block once at least 1/DENSE_HITS of its rows (or columns) can keep something.
DENSE_HITS = 4


@dataclass
class Survivors:
    """Pairs kept by one side of a block: positions in the block and their screened keys.

    ``owner`` are the block positions of the rows (or columns) whose threshold admitted the
    pair, ``other`` the positions on the other axis; ``keys`` the screened scores.
    """

    owner: torch.Tensor
    other: torch.Tensor
    keys: torch.Tensor


def row_survivors(scores: torch.Tensor, thresholds: torch.Tensor) -> Survivors:
    """Entries of each row of ``scores`` at or below the row's (float64) threshold."""
    # Rounding the float64 threshold to the block's dtype must not drop a survivor.
    thr = _round_up(thresholds.to(scores.dtype), thresholds)
    hit = torch.nonzero(scores.amin(dim=1) <= thr).flatten()
    if hit.numel() == 0:
        return _empty(scores.device, scores.dtype)
    if hit.numel() * DENSE_HITS >= scores.shape[0]:
        # Many rows can keep something: one compare of the whole block beats a gather.
        r, c = torch.nonzero(scores <= thr[:, None], as_tuple=True)
        return Survivors(owner=r, other=c, keys=scores[r, c])
    sub = scores.index_select(0, hit)
    r, c = torch.nonzero(sub <= thr[hit, None], as_tuple=True)
    return Survivors(owner=hit[r], other=c, keys=sub[r, c])


def column_survivors(scores: torch.Tensor, thresholds: torch.Tensor) -> Survivors:
    """Entries of each column of ``scores`` at or below the column's threshold.

    The rows of the transposed view (no copy): its gathers are strided, which is why the
    whole-block compare takes over from few hits on.
    """
    return row_survivors(scores.T, thresholds)


def _round_up(rounded: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``rounded`` nudged up one step wherever the rounding went below ``exact``."""
    if rounded.dtype == exact.dtype:
        return rounded
    below = rounded.to(exact.dtype) < exact
    return torch.where(below, torch.nextafter(rounded, torch.full_like(rounded, torch.inf)), rounded)


def _empty(device: torch.device, dtype: torch.dtype) -> Survivors:
    none = torch.empty(0, dtype=torch.int64, device=device)
    return Survivors(owner=none, other=none.clone(), keys=torch.empty(0, dtype=dtype, device=device))
