"""Each row's first k entries by (distance, index), ranked instead of sorted.

The exact finish of a store orders every row's evaluated candidates by (distance, index) and
keeps the first k (:func:`top_by_distance`). The reference (:func:`top_by_distance_reference`,
which every device without the kernel runs, and every row wider than :data:`MAX_WIDTH`) is two
stable sorts along the rows, by index and then by distance: on a GPU, torch's segmented sorts,
which cost about as much for a graph's rows of a dozen entries as for rows ten times wider.

The kernel (``row_order_kernel``) ranks instead: each entry's rank in its row is the number of
entries that come before it by (distance, index, position), counted by comparing it with every
entry of the row (W² comparisons a row, W the width rounded up to a power of two). The key is a
strict total order, so the ranks are a permutation and the result is the stable sorts' exactly,
ties, empty entries (index −1) and NaN included. H200, 2026-11-26 (``bench/row_order_rates.py``,
CUDA events, median of 7): 200,000 rows of 26 (a 200k-point graph at k = 10)
0.67 ms against 2.73 for the sorts; 65,536 rows of 153 (a rows-method graph at k = 100) 7.2
against 6.0; 10,000 rows of 500 16.5 against 1.3. Hence the kernel for narrow rows only.
"""

from __future__ import annotations

import torch

from knng.engine import fused

__all__ = ["top_by_distance", "top_by_distance_reference", "kernel_applies", "MAX_WIDTH"]

_INT64_MAX = torch.iinfo(torch.int64).max
#: The kernel ranks rows of at most this many entries; wider rows take the sorts, which are
#: faster from about a hundred entries on (see above).
MAX_WIDTH = 64
#: Entries of the row compared with all of it at a time.
CHUNK = 32


def kernel_applies(idx: torch.Tensor) -> bool:
    """Whether :func:`top_by_distance` ranks with the kernel: where the fused kernels run (a GPU
    with Triton; in the tests, the interpreter) and the rows are at most :data:`MAX_WIDTH` wide."""
    return 0 < idx.shape[1] <= MAX_WIDTH and idx.shape[0] > 0 and fused.fused_available(idx.device)


def top_by_distance(idx: torch.Tensor, dist: torch.Tensor, k: int, *carry: torch.Tensor
                    ) -> tuple[torch.Tensor, ...]:
    """Each row's first k entries by (distance, index), empty entries (index −1) last.

    Parameters
    ----------
    idx : torch.Tensor
        int64 (rows, width): each entry's index, −1 where the entry is empty.
    dist : torch.Tensor
        float64 (rows, width): each entry's distance (ignored where ``idx`` is −1).
    k : int
        Entries kept per row (min(k, width) are returned).
    *carry : torch.Tensor
        (rows, width) tensors reordered along with them.

    Returns
    -------
    tuple of torch.Tensor
        ``idx``, ``dist`` (+inf where empty) and every ``carry`` tensor, (rows, min(k, width))
        each, in that order.
    """
    if not kernel_applies(idx):
        return top_by_distance_reference(idx, dist, k, *carry)
    rows, width = idx.shape
    kk = min(k, width)
    order = torch.empty((rows, kk), dtype=torch.int64, device=idx.device)
    options = {} if fused.interpreting() else dict(num_warps=4)
    fused.kernels().row_order_kernel[(rows,)](idx.contiguous(), dist.contiguous(), width, kk, order,
                                              W=max(16, 1 << (width - 1).bit_length()), J=CHUNK, **options)
    dist = torch.where(idx >= 0, dist, torch.inf)
    return tuple(t.gather(1, order) for t in (idx, dist, *carry))


def top_by_distance_reference(idx: torch.Tensor, dist: torch.Tensor, k: int, *carry: torch.Tensor
                              ) -> tuple[torch.Tensor, ...]:
    """:func:`top_by_distance` by two stable sorts along the rows: by index, then by distance."""
    dist = torch.where(idx >= 0, dist, torch.inf)
    by_index = torch.argsort(torch.where(idx >= 0, idx, _INT64_MAX), dim=1, stable=True)
    by_distance = torch.argsort(dist.gather(1, by_index), dim=1, stable=True)[:, :k]
    order = by_index.gather(1, by_distance)
    return tuple(t.gather(1, order) for t in (idx, dist, *carry))
