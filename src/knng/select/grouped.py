"""``select="grouped"``: a two-stage exact filter for small k.

Split each row into groups of g consecutive columns and take every group's minimum (one
coalesced pass over the block). The k groups with the smallest minima hold the k smallest
entries: any entry outside them is at least its own group's minimum, which is at least the
largest chosen minimum, and the chosen groups already hold k entries no larger than that.
So a ``torch.topk`` over the k·g gathered entries (plus the ragged tail of the row) gives the
exact k smallest values. The block is read about once instead of the several radix passes
``torch.topk`` makes, which pays when k·g is small next to the row length.
"""

from __future__ import annotations

import torch

from knng.select.registry import register

#: Group sizes tried, largest first: 32 float32 values make one 128-byte memory transaction.
GROUP_SIZES = (32, 16, 8)
#: The filter is used only when the gathered entries are at most this share of the row.
MAX_GATHER_SHARE = 1 / 8


def choose_group(cols: int, k: int) -> int:
    """The group size for rows of ``cols`` entries, or 0 when plain top-k is the better choice."""
    for g in GROUP_SIZES:
        if k * g <= cols * MAX_GATHER_SHARE:
            return g
    return 0


@register("grouped")
def grouped_select(scores: torch.Tensor, k: int, *, sorted: bool = False,
                   group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each row of ``scores`` with their column indices."""
    rows, cols = scores.shape
    g = choose_group(cols, k) if group is None else group
    full_groups = cols // g if g else 0
    if g <= 1 or full_groups <= k:
        return torch.topk(scores, k, dim=-1, largest=False, sorted=sorted)
    if not scores.is_contiguous():
        scores = scores.contiguous()  # e.g. the column view of a graph block
    body = scores[:, : full_groups * g].view(rows, full_groups, g)
    minima = body.amin(dim=2)
    _, group_ids = torch.topk(minima, k, dim=1, largest=False, sorted=False)
    offsets = torch.arange(g, device=scores.device)
    columns = (group_ids[:, :, None] * g + offsets).reshape(rows, k * g)
    tail = cols - full_groups * g
    if tail:
        tail_cols = torch.arange(full_groups * g, cols, device=scores.device).expand(rows, tail)
        columns = torch.cat([columns, tail_cols], dim=1)
    values, pos = torch.topk(torch.gather(scores, 1, columns), k, dim=1, largest=False, sorted=sorted)
    return values, torch.gather(columns, 1, pos)
