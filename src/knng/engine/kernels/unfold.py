"""Unfolding duplicate groups into rows on the GPU (``triton_unfold.unfold_rows_kernel``).

Rows found for the groups of identical points (:mod:`knng.engine.duplicates`) hold lists of
groups; each row's first k slots are their members in (distance, index) order. The kernel fills
them a program a row; the torch path in :mod:`knng.engine.duplicates` is its reference.
"""

from __future__ import annotations

import torch

from knng.engine.kernels.capabilities import block_width, interpreting, triton_runs

__all__ = ["unfold_rows", "unfold_runs", "KERNEL_MAX_WIDTH"]


def _triton():
    """This module's Triton kernel (:mod:`knng.engine.kernels.triton_unfold`), imported on first
    use (Triton must be installed)."""
    from knng.engine.kernels import triton_unfold

    return triton_unfold


#: The unfolding kernel holds a row's lists and its k slots in one program each: up to
#: KERNEL_MAX_WIDTH of either (tested on the GPU up to k = 1,024 with 1,001 lists a row); larger
#: k unfold by ``duplicates._unfold_by_slots``.
KERNEL_MAX_WIDTH = 1024


def unfold_runs(device: torch.device, lists: int, k: int) -> bool:
    """Whether :func:`unfold_rows` unfolds ``lists`` lists a row into k slots on ``device``."""
    return triton_runs(device) and 1 <= lists and max(lists, k) <= KERNEL_MAX_WIDTH


def unfold_rows(sizes: torch.Tensor, starts: torch.Tensor, members: torch.Tensor, reps: torch.Tensor,
                own_group: torch.Tensor | None, idx: torch.Tensor, dist: torch.Tensor, k: int,
                own: torch.Tensor | None, position: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``duplicates._unfold_by_slots`` of every row in one launch, a program a row (the lists read from
    ``idx``/``dist`` as they are, nothing (m, lists) materialised: 8×8 image patches at k = 100
    formed a dozen int64 arrays of 582,150 × 101 entries): (m, k) indices, distances, and the
    rows to sort (int32, (m,))."""
    m, device = idx.shape[0] if own_group is None else own_group.numel(), idx.device
    out_idx = torch.empty((m, k), dtype=torch.int64, device=device)
    out_dist = torch.empty((m, k), dtype=torch.float64, device=device)
    unordered = torch.empty(m, dtype=torch.int32, device=device)
    if m == 0:
        return out_idx, out_dist, unordered
    lists = idx.shape[1] + (own_group is not None)
    dummy = starts
    idx, dist = idx.to(torch.int64).contiguous(), dist.to(torch.float64).contiguous()
    options = {} if interpreting() else dict(num_warps=4)
    _triton().unfold_rows_kernel[(m,)](
        dummy if own_group is None else own_group, idx, dist, dummy if own is None else own, sizes,
        starts, members, reps, dummy if position is None else position, out_idx, out_dist,
        unordered, k, idx.shape[1], idx.stride(0), dist.stride(0), HAS_OWN=own_group is not None,
        DROP_SELF=position is not None, BL=block_width(lists), BK=block_width(k), **options)
    return out_idx, out_dist, unordered
