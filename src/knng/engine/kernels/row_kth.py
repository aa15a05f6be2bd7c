"""Each row's smallest and k-th smallest key among unsorted (row, key) pairs, without a sort.

:meth:`knng.engine.store.CandidateStore.tighten` bounds a row's k-th true key from the k-th
smallest screen key among a block's survivors. The survivors come as one unsorted list of
(row, key) pairs, so the reference (:func:`row_ends_reference`, which every device without the
kernels runs) sorts them all once: the row above 32 bits of the key's order code, one int64
radix sort. A GPU search lets 8,000 / 16,000 pairs per row through at k = 1,024 / 2,048 (10k
queries, 1M × 128), and its two tightenings sorted 80M and 105M pairs: 19 ms of radix sort and 8 ms
of elementwise passes forming the int64 keys, of a 108 ms search (H100, 2026-11-25).

Only two order statistics per row are needed, so :func:`row_ends` on a GPU groups the pairs by row
instead of sorting them (a count per row and one slot per pair, both by atomics, order within a
row left arbitrary) and selects in each row's segment: the smallest code, and the k-th by a
radix select over the code's four bytes (a 256-bin histogram of the current byte among the codes
that share the bytes chosen so far, four passes over the segment), or, in a segment of at most
:data:`SMALL_WIDTH` codes, by sorting it in registers (at k ≤ :data:`ROUNDS_MAX_K` a segment
of up to :data:`ROUNDS_WIDTH` by k − 1 rounds that take the smallest out), and in one of at
most :data:`BISECT_WIDTH` by bisection over its codes in registers. All are
integer order statistics of the same codes, so the results are the reference's exactly,
whatever order the atomics gave.

:func:`row_slots` gives each pair its slot in its row by the same atomics (a stable sort is its
reference): the store's finish places its pairs in padded rows with it and orders them after.

Codes: :func:`ordered_code` maps a float32 key to an int64 in [0, 2³²) that orders as the keys
do (−0 just below +0); float64 keys are first rounded up to float32 (:func:`float32_up`), which
only raises the k-th.
"""

from __future__ import annotations

import torch

from knng._options import get_options, kernel_forced
from knng.engine.kernels.capabilities import block_width, interpreting, triton_runs

__all__ = ["float32_up", "ordered_code", "decoded", "row_ends", "row_ends_reference", "row_slots",
           "row_slots_reference", "row_kth_runs", "NO_CODE", "smallest_of_rows", "kth_of_rows",
           "kth_of_rows_reference", "SMALL_ROW_MAX_K", "SMALL_ROW_MAX_WIDTH", "KTH_ROW_MAX_WIDTH"]


def _triton():
    """This module's Triton kernels (:mod:`knng.engine.kernels.triton_rows`), imported on first use
    (Triton must be installed)."""
    from knng.engine.kernels import triton_rows

    return triton_rows


#: The code given where a row has fewer than k pairs (that of +0.0): such rows are not tightened.
NO_CODE = 2**31

#: Pairs per program of the counting and grouping kernels.
BLOCK = 1024
#: Codes of one row read per step of the selection kernel at most: each step's histogram costs
#: the whole chunk, so rows short of it pay for codes they do not have. The chunk is the power
#: of two from 4k up, between MIN_CHUNK and CHUNK (:func:`chunk_for`): the rows the radix
#: select takes hold more than k codes, mostly a few k. H200, 2026-11-26, rows of ~200 / ~400 /
#: ~300 pairs at k = 100: 21.3 / 31.1 / 10.5 ms with chunks of 1,024, 17.3 / 27.1 / 8.7 with
#: 512; 200k rows of ~20 at k = 10 0.86 → 0.68 ms (256); 10k rows of 8,000 at k = 1,024 8.5 ms
#: with 1,024, 8.8 with 512.
CHUNK = 1024
MIN_CHUNK = 256
#: Rows of at most SMALL_WIDTH pairs are selected by a sort in registers, SMALL_ROWS rows a
#: program; the radix select, one row at a time, takes only the longer ones. A GPU graph holds
#: about 15–25 survivors for each of its 1M rows, and one radix program per row (four passes
#: of a 256-bin histogram each) took 12 ms a tightening (H100, 2026-11-25).
SMALL_WIDTH = 64
SMALL_ROWS = 16
#: Up to rank ROUNDS_MAX_K, rows of more than SMALL_WIDTH and at most ROUNDS_WIDTH pairs
#: (ROUNDS_ROWS a program) are selected by k − 1 rounds that take the smallest out, in registers
#: (no radix passes): a 200k-point graph at k = 10 holds ~80 pairs a row after its own parts,
#: which went to the radix select. H200, 2026-11-27, ``bench/row_kth_rates.py default,norounds``:
#: 200k rows of ~80 pairs at k = 10 2.01 ms against 3.30; rows of ~20 (all in the sort kernel)
#: were 1.07 against 0.75 while the rounds took every row up to ROUNDS_WIDTH, hence SMALL_WIDTH
#: below them.
ROUNDS_MAX_K = 16
ROUNDS_WIDTH = 256
ROUNDS_ROWS = 16
#: Above rank ROUNDS_MAX_K, rows of more than SMALL_WIDTH and at most BISECT_WIDTH codes are
#: selected by bisection over their codes (one row a warp, the row in registers: one pass over
#: the segment instead of the radix select's four). H200, 2026-11-27, ``bench/row_kth_rates.py
#: default,nobisect``: 200k rows of ~391 pairs at k = 101 (a graph by rows at k = 100) 7.61 ms
#: against 8.79, rows of ~200 / ~300 at k = 100 14.2 / 7.4 against 17.5 / 8.7; at k = 10,
#: where the rounds take the rows up to 256, its one program a row cost 0.1–0.2 ms for nothing.
BISECT_WIDTH = 512


def float32_up(keys: torch.Tensor) -> torch.Tensor:
    """``keys`` as float32, each rounded up (float32 keys are returned as they are)."""
    if keys.dtype == torch.float32:
        return keys
    down = keys.to(torch.float32)
    return torch.where(down.to(keys.dtype) < keys, torch.nextafter(down, torch.full_like(down, torch.inf)), down)


def ordered_code(keys: torch.Tensor) -> torch.Tensor:
    """float32 ``keys`` as int64 codes in [0, 2³²) that sort as the keys do (−0 just below +0)."""
    bits = keys.view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -bits - 1, bits + 2**31)


def decoded(code: torch.Tensor) -> torch.Tensor:
    """The float32 keys of :func:`ordered_code`'s codes."""
    bits = torch.where(code < 2**31, -code - 1, code - 2**31)
    return bits.to(torch.int32).view(torch.float32)


def row_kth_runs(rows: torch.Tensor) -> bool:
    """Whether :func:`row_ends` selects with the kernels here: where the fused screen kernel runs
    (a GPU with Triton; in the tests, the interpreter)."""
    forced = kernel_forced("row_kth")
    return triton_runs(rows.device) if forced is None else forced


def row_ends(rows: torch.Tensor, keys: torch.Tensor, n: int, k: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's smallest and k-th smallest key code among the pairs ``rows``/``keys``.

    Parameters
    ----------
    rows : torch.Tensor
        int64 row of each pair, in [0, n).
    keys : torch.Tensor
        The pairs' keys (float32, or float64 rounded up to float32).
    n, k : int
        Rows, and the rank wanted (k ≥ 1).

    Returns
    -------
    first, kth, counts : torch.Tensor
        int64, (n,): the :func:`ordered_code` of each row's smallest and k-th smallest key, and
        its number of pairs; where a row has fewer than k pairs, both codes are :data:`NO_CODE`.
    """
    if rows.numel() == 0 or not row_kth_runs(rows):
        return row_ends_reference(rows, keys, n, k)
    keys = float32_up(keys).contiguous()
    rows = rows.contiguous()
    p = rows.numel()
    device = rows.device
    kernels = _triton()
    options = {} if interpreting() else dict(num_warps=4)
    counts = torch.zeros(n, dtype=torch.int32, device=device)
    grid = (-(-p // BLOCK),)
    kernels.row_count_kernel[grid](rows, p, counts, BLOCK=BLOCK, **options)
    counts64 = counts.to(torch.int64)
    starts = torch.cumsum(counts64, 0) - counts64
    cursor = torch.zeros(n, dtype=torch.int32, device=device)
    grouped = torch.empty(p, dtype=torch.int32, device=device)
    kernels.group_rows_kernel[grid](rows, keys, p, starts, cursor, grouped, BLOCK=BLOCK, **options)
    first = torch.empty(n, dtype=torch.int64, device=device)
    kth = torch.empty(n, dtype=torch.int64, device=device)
    kernels.row_kth_small_kernel[(-(-n // SMALL_ROWS),)](grouped, starts, counts64, n, k, first, kth, NO_CODE,
                                                        ROWS=SMALL_ROWS, WIDTH=SMALL_WIDTH, **options)
    skip = SMALL_WIDTH
    if k <= ROUNDS_MAX_K:
        kernels.row_kth_rounds_kernel[(-(-n // ROUNDS_ROWS),)](grouped, starts, counts64, n, first, kth, NO_CODE, K=k,
                                                              ROWS=ROUNDS_ROWS, SKIP=skip, WIDTH=ROUNDS_WIDTH,
                                                              **options)
        skip = ROUNDS_WIDTH
    if skip < BISECT_WIDTH and k > ROUNDS_MAX_K:  # (at smaller k the rows past the rounds' are rare)
        kernels.row_kth_bisect_kernel[(n,)](grouped, starts, counts64, n, k, first, kth, NO_CODE, SKIP=skip,
                                            WIDTH=BISECT_WIDTH, **({} if interpreting() else dict(num_warps=1)))
        skip = BISECT_WIDTH
    kernels.row_kth_kernel[(min(n, get_options().row_kth_max_programs),)](grouped, starts, counts64, n, k, first, kth, NO_CODE,
                                                  SKIP=skip, CHUNK=chunk_for(k), **options)
    return first, kth, counts64


def row_slots(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Each pair's slot within its row: row r's pairs get 0 … (its count − 1), each once.

    On a GPU by atomics (one pass, no sort; the order within a row is whatever they gave), else
    by :func:`row_slots_reference`. Callers that order each row's entries afterwards (the
    store's finish, by distance and index) get the same result from either.

    Parameters
    ----------
    rows : torch.Tensor
        int64 row of each pair, in [0, n).
    n : int
        Rows.

    Returns
    -------
    torch.Tensor
        int64 slot of each pair.
    """
    if rows.numel() == 0 or not row_kth_runs(rows):
        return row_slots_reference(rows, n)
    rows = rows.contiguous()
    p = rows.numel()
    cursor = torch.zeros(n, dtype=torch.int32, device=rows.device)
    slots = torch.empty(p, dtype=torch.int64, device=rows.device)
    options = {} if interpreting() else dict(num_warps=4)
    _triton().row_slots_kernel[(-(-p // BLOCK),)](rows, p, cursor, slots, BLOCK=BLOCK, **options)
    return slots


def row_slots_reference(rows: torch.Tensor, n: int) -> torch.Tensor:
    """:func:`row_slots` by one stable sort: a row's pairs get their slots in the order they come."""
    p = rows.numel()
    by_row = torch.sort(rows.to(torch.int32) if n < 2**31 else rows, stable=True).indices
    counts = torch.zeros(n, dtype=torch.int64, device=rows.device).index_add_(0, rows, torch.ones_like(rows))
    starts = torch.cumsum(counts, 0) - counts
    slots = torch.empty(p, dtype=torch.int64, device=rows.device)
    slots[by_row] = torch.arange(p, device=rows.device) - starts[rows[by_row]]
    return slots


def chunk_for(k: int) -> int:
    """Codes a step of the radix select reads for rank ``k``: the power of two from 4k up, within
    [:data:`MIN_CHUNK`, :data:`CHUNK`]."""
    return max(MIN_CHUNK, min(CHUNK, 1 << max(0, 4 * k - 1).bit_length()))


def row_ends_reference(rows: torch.Tensor, keys: torch.Tensor, n: int, k: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`row_ends` by one int64 sort of (row · 2³² + code): the reference of the kernels."""
    device = rows.device
    counts = torch.zeros(n, dtype=torch.int64, device=device).index_add_(0, rows, torch.ones_like(rows))
    p = rows.numel()
    if p == 0:
        none = torch.full((n,), NO_CODE, dtype=torch.int64, device=device)
        return none, none.clone(), counts
    pairs = torch.sort(rows.to(torch.int64) * 2**32 + ordered_code(float32_up(keys))).values
    starts = torch.cumsum(counts, 0) - counts
    full = counts >= k
    first = torch.where(full, pairs[starts.clamp_max(p - 1)] & 0xFFFFFFFF, NO_CODE)
    kth = torch.where(full, pairs[(starts + k - 1).clamp_max(p - 1)] & 0xFFFFFFFF, NO_CODE)
    return first, kth, counts


#: Largest k and number of strips a row whose k smallest strip minima ``thresholds.strip_candidates``
#: takes with a kernel (``triton_rows.smallest_of_rows_kernel``: the row in registers, k
#: rounds of a minimum) instead of ``torch.topk``. H200, 2026-11-27,
#: ``bench/strip_candidates_rates.py``: 66,667 rows of 128 strips at k = 10 0.092 ms against
#: 0.415 for ``torch.topk`` (0.447 for a sort), 200,000 rows 0.246 against 1.155, 66,667 rows of
#: 256 at k = 16 0.338 against 0.815: about 1 ms of the 200k × 128 graph's seeds at k = 10.
SMALL_ROW_MAX_K = 32
SMALL_ROW_MAX_WIDTH = 1024


def smallest_of_rows(keys: torch.Tensor, cols: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest float32 ``keys`` (no NaN) ascending by (key, position), and the
    ``cols`` at their positions, by ``triton_rows.smallest_of_rows_kernel``; rows of at most
    :data:`SMALL_ROW_MAX_WIDTH` keys. Its reference is a stable sort of each row."""
    m, width = keys.shape
    keys, cols = keys.contiguous(), cols.contiguous()
    assert cols.shape == keys.shape and width <= SMALL_ROW_MAX_WIDTH
    wide = block_width(width, 16)
    rows = max(1, min(16, 4096 // wide))  # 16 rows of 128 or 256 measured fastest (32 and 64 slower)
    values = torch.empty((m, k), dtype=keys.dtype, device=keys.device)
    picked = torch.empty((m, k), dtype=cols.dtype, device=keys.device)
    options = {} if interpreting() else dict(num_warps=4)
    _triton().smallest_of_rows_kernel[(-(-m // rows),)](keys, cols, values, picked, m, width, keys.stride(0),
                                                              K=k, ROWS=rows, WIDTH=wide, **options)
    return values, picked


#: Widest row whose k-th smallest strip minimum :func:`kth_of_rows` takes with its kernel (the
#: row whole in registers, spread over more warps the wider it is: :data:`KTH_WIDE_WARPS`);
#: wider rows go to ``torch.topk``. 16,384 tile minima are a search's of 2M corpus points.
KTH_ROW_MAX_WIDTH = 16384


#: Rows a program of :func:`kth_of_rows`'s kernel takes (of width up to 1,024; fewer for wider
#: rows), and its warps: one row to one warp, whose counts need no barrier. H200, 2026-11-27,
#: ``bench/strip_candidates_rates.py --layouts``, 200,000 rows of 1,024 at k = 101: 2.58 ms
#: against 2.79 (one row, two warps), 3.03 (one, four), 3.56 (four rows, four warps) and 5.85
#: for ``torch.topk``.
KTH_ROWS = 1
KTH_WARPS = 1
#: Warps of a program whose row is wider than 1,024 keys (a search's tile minima, up to
#: :data:`KTH_ROW_MAX_WIDTH`): at least this many, else one for each 1,024 keys (32 codes a
#: lane; 16 for 16,384), where one warp would hold 64 or more a lane. H200, 2026-11-27, 200,000 rows of 1,563
#: at k = 101 (``bench/tiles_first_rates.py --warps``): 1 / 2 / 4 / 8 warps 3.89 / 2.89 / 3.14 ms on
#: int32 codes (5.86 / 5.27 / 5.66 / 6.31 on int64).
KTH_WIDE_WARPS = 2


def kth_of_rows(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's smallest and k-th smallest of its ``keys`` (no NaN; float64 rounded up to
    float32), as
    ``ordered_code`` values, and its count of keys: what ``row_kth.row_ends`` gives for
    the pairs of a dense block, for :meth:`~knng.engine.store.CandidateStore.tighten_ends`.

    By ``triton_rows.kth_of_rows_kernel`` (rows of at most :data:`KTH_ROW_MAX_WIDTH` keys)
    where Triton runs; else (and as its reference) :func:`kth_of_rows_reference`.
    """
    m, width = keys.shape
    if not (triton_runs(keys.device) and width <= KTH_ROW_MAX_WIDTH and m and keys.dtype == torch.float32):
        return kth_of_rows_reference(keys, k)
    keys = keys.contiguous()
    wide = block_width(width, 16)
    rows = max(1, KTH_ROWS * 1024 // max(1024, wide))
    firsts, kths, counts = (torch.empty(m, dtype=torch.int64, device=keys.device) for _ in range(3))
    warps = KTH_WARPS if wide <= 1024 else min(16, max(KTH_WIDE_WARPS, wide // 1024))
    options = {} if interpreting() else dict(num_warps=warps)
    _triton().kth_of_rows_kernel[(-(-m // rows),)](keys, m, width, keys.stride(0), k, firsts, kths, counts,
                                                        NO_CODE, ROWS=rows, WIDTH=wide, **options)
    return firsts, kths, counts


def kth_of_rows_reference(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`kth_of_rows` by a sort of each row's order codes (float64 keys rounded up to
    float32 first, as ``row_kth.row_ends`` does)."""
    m, width = keys.shape
    counts = torch.full((m,), width, dtype=torch.int64, device=keys.device)
    if width < k or m == 0:
        none = torch.full((m,), NO_CODE, dtype=torch.int64, device=keys.device)
        return none, none.clone(), counts
    codes = torch.sort(ordered_code(float32_up(keys)), dim=1).values
    return codes[:, 0].contiguous(), codes[:, k - 1].contiguous(), counts
