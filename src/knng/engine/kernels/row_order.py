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
−1) and NaN included. Wider rows are sorted once, stably, by distance alone (rounded to float32
up to k = 256, a monotone rounding), and the rows where that can differ from the reference (a
tie of the sort's keys or a NaN among their first k + 1) are sorted again by the reference. The
one sort is a kernel up to :data:`SORT_MAX_WIDTH` entries (``row_head_kernel``: each key's
order code packed above its position into an int64, the row sorted in registers by one warp),
else (on a CPU, in Triton's interpreter unless ``Options.sort_interpreted``, or at larger k)
torch's segmented sort.

``bench/row_order_rates.py`` (H200, CUDA events, median of 7; 2026-11-26 and 2026-11-27):
rows of 26 (a 200k-point graph at k = 10) ranked 0.60 ms, the sort kernel 0.72, torch's sort
1.23, the two sorts 2.74; rows of 64 ranked 1.96, the sort kernel 0.63, torch's sort 1.82;
200,000 rows of 153 at k = 101 (a graph by rows at k = 100) the sort kernel 2.20, torch's sort
6.35 (the whole graph 77.2 → 74.2 ms); of 400 3.99 against 8.23; 10,000 rows of 500 at
k = 100 0.83 against 1.17, but of 1,300 at k = 256 4.07 against 1.57 (too few rows for one
program a row). On 2 CPU cores the one sort takes about half the reference's time (64,009 rows
of 26: 58 against 122 ms).
"""

from __future__ import annotations

import torch

from knng.engine import stages
from knng.engine.kernels.capabilities import block_width, interpreting, triton_runs
from knng._options import get_options, kernel_forced

__all__ = ["top_by_distance", "top_by_distance_reference", "row_order_runs", "row_sort_runs", "MAX_WIDTH"]


def _triton():
    """This module's Triton kernels (:mod:`knng.engine.kernels.triton_rows`), imported on first use
    (Triton must be installed)."""
    from knng.engine.kernels import triton_rows

    return triton_rows


_INT64_MAX = torch.iinfo(torch.int64).max
#: The kernel ranks rows of at most this many entries; wider rows take the one sort, whose
#: kernel is faster from about 32 entries on (see above).
MAX_WIDTH = 32
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
#: Rows up to this wide are sorted by a kernel (one program a row, the row in registers) in
#: place of torch's segmented sort (see :func:`row_sort_runs`).
SORT_MAX_WIDTH = 512
#: Warps of the sort kernel's program: one was fastest at every width from 26 to 400 on 200,000
#: rows (two to sixteen took 1.0–1.8× as long; H200, ``bench/row_order_rates.py --warps``).
SORT_WARPS = 1
# ``Options.sort_interpreted``: whether Triton's interpreter runs the sort kernel too. It runs
# one program at a time, and a row's sort network is hundreds of NumPy steps: engine tests that
# interpret the kernels ran 1.8× as long with it (CI from ~12 to ~15 min), so there torch sorts,
# and the kernel's own tests (``tests/engine/test_row_order.py``) set the option.


def row_order_runs(idx: torch.Tensor) -> bool:
    """Whether :func:`top_by_distance` ranks with the kernel: where the fused kernels run (a GPU
    with Triton; in the tests, the interpreter) and the rows are at most :data:`MAX_WIDTH` wide."""
    if kernel_forced("row_order") is False:
        return False
    return 0 < idx.shape[1] <= MAX_WIDTH and idx.shape[0] > 0 and triton_runs(idx.device)


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
    order = _ranked_order(idx, dist, k) if row_order_runs(idx) else _sorted_order(idx, dist, k)
    dist = torch.where(idx >= 0, dist, torch.inf)
    return tuple(t.gather(1, order) for t in (idx, dist, *carry))


def _ranked_order(idx: torch.Tensor, dist: torch.Tensor, k: int) -> torch.Tensor:
    """Each row's first min(k, width) positions by the rank kernel (rows of at most MAX_WIDTH)."""
    rows, width = idx.shape
    kk = min(k, width)
    order = torch.empty((rows, kk), dtype=torch.int64, device=idx.device)
    options = {} if interpreting() else dict(num_warps=4)
    _triton().row_order_kernel[(rows,)](idx.contiguous(), dist.contiguous(), width, kk, order,
                                              W=block_width(width, 16), J=CHUNK, **options)
    return order


def row_sort_runs(idx: torch.Tensor, k: int) -> bool:
    """Whether :func:`_sorted_order` sorts with the kernel (``row_head_kernel``): where the fused
    kernels run, rows of at most :data:`SORT_MAX_WIDTH` entries and float32 keys (k up to
    :data:`ROUNDED_KEY_MAX_K`)."""
    return (0 < idx.shape[1] <= SORT_MAX_WIDTH and idx.shape[0] > 0 and SORT_KEY == torch.float32
            and min(k, idx.shape[1]) <= ROUNDED_KEY_MAX_K and triton_runs(idx.device)
            and (get_options().sort_interpreted or not interpreting()))


def _sorted_head(idx: torch.Tensor, dist: torch.Tensor, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's first ``head`` (codes of the float32 keys, positions) of the one stable sort,
    by ``row_head_kernel``: one program a row, the row sorted in registers."""
    stages.count("finish.sort_kernel")
    rows, width = idx.shape
    codes = torch.empty((rows, head), dtype=torch.int32, device=idx.device)
    order = torch.empty((rows, head), dtype=torch.int64, device=idx.device)
    w = block_width(width, 16)
    options = {} if interpreting() else dict(num_warps=SORT_WARPS)
    _triton().row_head_kernel[(rows,)](idx.contiguous(), dist.contiguous(), width, head, codes, order, W=w,
                                             **options)
    return codes, order


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
    head = min(kk + 1, width)
    if row_sort_runs(idx, k):
        # The kernel's codes are equal where the float32 keys are (−0 taken as +0).
        ordered, order = _sorted_head(idx, dist, head)
    else:
        key = torch.where(real, dist, torch.inf)
        ordered, order = torch.sort(key.to(SORT_KEY if kk <= ROUNDED_KEY_MAX_K else key.dtype), dim=1, stable=True)
    real_head = real.gather(1, order[:, :head])
    tie = (ordered[:, 1:head] == ordered[:, :head - 1]) & (real_head[:, 1:] | real_head[:, :-1])
    order = order[:, :kk].contiguous()
    again = torch.nonzero(tie.any(dim=1) | (real & dist.isnan()).any(dim=1)).flatten()
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
