"""Each row's first k entries by (distance, index): ranked in narrow rows, sorted once in wide ones.

The exact finish of a store orders every row's evaluated candidates by (distance, index) and
keeps the first k (:func:`top_by_distance`). The reference (:func:`top_by_distance_reference`)
is two stable sorts along the rows, by index and then by distance: on a GPU, torch's segmented
sorts, which cost about as much for a graph's rows of a dozen entries as for rows ten times
wider (16 ms of a 121 ms 200k-point graph at k = 100 by rows, H200, 2026-11-26).

Rows of at most :data:`MAX_WIDTH` entries, where the fused kernels run, are ranked by a kernel
(``row_order_kernel``): each entry's rank is the number of entries that come before it by
(distance, index, position), counted by comparing it with every entry of the row (W²
comparisons, W the width rounded up to a power of two). The key is a strict total order, so the
ranks are a permutation and the result is the reference's exactly, ties, empty entries (index
−1) and NaN included. Wider rows (and every row on a CPU) are sorted once, stably, by distance
alone (rounded to float32 up to k = 256, a monotone rounding), and the rows where that can
differ from the reference (a tie of the sort's keys or a NaN among their first k + 1) are
sorted again by the reference. ``bench/row_order_rates.py`` (H200, 2026-11-26,
CUDA events, median of 7): 200,000 rows of 26 (a 200k-point graph at k = 10) 0.60 ms ranked
against 2.58 for the two sorts; rows of 64 1.90 against 5.63; 65,536 rows of 153 (a rows-method
graph at k = 100) 7.09 ranked against 5.87; 10,000 rows of 500 16.4 ranked against 1.2. On 2
CPU cores the one sort takes about half the reference's time (64,009 rows of 26: 58 against
122 ms).
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
#: The one sort's key up to k = :data:`ROUNDED_KEY_MAX_K`: float32 keys sort in about two
#: thirds of the time of float64 ones (radix passes over half the bits), and the rows whose
#: rounded keys tie are sorted again exactly. H200, 2026-11-26 (``bench/row_order_rates.py``,
#: float32 / float64 keys): 65,536 rows of 153 at k = 101 2.22 / 3.39 ms, 200,000 rows of 64 at
#: k = 10 1.72 / 3.06; a 200k-point graph at k = 100 by rows 107.2, 108.8 / 110.8, 111.5 ms
#: (``bench/ab_graph_gauss.py``).
SORT_KEY = torch.float32
#: Largest k sorted by :data:`SORT_KEY`: a search's rows at k = 1,024 / 2,048 hold ~1,250 /
#: ~2,460 candidates within float32's rounding of each other so often that almost every row
#: was sorted again (39.5 / 59.3 ms against 38.1 / 54.9 with float64 keys, 1M × 128, 10k
#: queries, ``bench/ab_search.py``); at k = 100 the two are level (20.0 / 19.8 ms).
ROUNDED_KEY_MAX_K = 256


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
    if idx.shape[0] == 0 or idx.shape[1] == 0:
        return top_by_distance_reference(idx, dist, k, *carry)
    order = _ranked_order(idx, dist, k) if kernel_applies(idx) else _sorted_order(idx, dist, k)
    dist = torch.where(idx >= 0, dist, torch.inf)
    return tuple(t.gather(1, order) for t in (idx, dist, *carry))


def _ranked_order(idx: torch.Tensor, dist: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's first min(k, width) positions by the rank kernel (rows of at most MAX_WIDTH)."""
    rows, width = idx.shape
    kk = min(k, width)
    order = torch.empty((rows, kk), dtype=torch.int64, device=idx.device)
    options = {} if fused.interpreting() else dict(num_warps=4)
    fused.kernels().row_order_kernel[(rows,)](idx.contiguous(), dist.contiguous(), width, kk, order,
                                              W=fused.block_width(width, 16), J=CHUNK, **options)
    return order


def _sorted_order(idx: torch.Tensor, dist: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's first min(k, width) positions by one stable sort of the distances (rounded to
    :data:`SORT_KEY`, float32, up to k = :data:`ROUNDED_KEY_MAX_K`), rows with a tie among them
    taken again by the reference's two sorts.

    Rounding is monotone (a < b gives round(a) ≤ round(b)), so where a row's first k + 1 rounded
    keys are strictly increasing its first k are the first k of the float64 distances, in their
    order. A stable sort orders equal keys by position where the reference orders equal
    distances by index; only equal keys (between two entries within the first k + 1, not both
    empty: equal distances, or distances within float32's rounding of each other) and NaN
    distances can make the two differ, so those rows (none in most calls; one synchronisation to
    find them) go through the reference. Empty entries (+inf) tied with each other stay in
    position order in both."""
    width = idx.shape[1]
    kk = min(k, width)
    real = idx >= 0
    key = torch.where(real, dist, torch.inf)
    ordered, order = torch.sort(key.to(SORT_KEY if kk <= ROUNDED_KEY_MAX_K else key.dtype), dim=1, stable=True)
    head = min(kk + 1, width)
    real_head = real.gather(1, order[:, :head])
    tie = (ordered[:, 1:head] == ordered[:, :head - 1]) & (real_head[:, 1:] | real_head[:, :-1])
    order = order[:, :kk].contiguous()
    again = torch.nonzero(tie.any(dim=1) | (real & key.isnan()).any(dim=1)).flatten()
    if again.numel():
        order[again] = _reference_order(idx[again], dist[again], kk)
    return order


def top_by_distance_reference(idx: torch.Tensor, dist: torch.Tensor, k: int, *carry: torch.Tensor
                              ) -> tuple[torch.Tensor, ...]:
    """:func:`top_by_distance` by two stable sorts along the rows: by index, then by distance."""
    order = _reference_order(idx, dist, k)
    dist = torch.where(idx >= 0, dist, torch.inf)
    return tuple(t.gather(1, order) for t in (idx, dist, *carry))


def _reference_order(idx: torch.Tensor, dist: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's first min(k, width) positions by two stable sorts: by index, then by distance."""
    dist = torch.where(idx >= 0, dist, torch.inf)
    by_index = torch.argsort(torch.where(idx >= 0, idx, _INT64_MAX), dim=1, stable=True)
    by_distance = torch.argsort(dist.gather(1, by_index), dim=1, stable=True)[:, :k]
    return by_index.gather(1, by_distance)
