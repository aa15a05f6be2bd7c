"""``select="batch_sort"``: batch index sorting (Dashti 2013, MSc thesis, section 3.3).

Instead of sorting every row and every column separately, the whole score block is sorted at
once, as one flat array of ``rows · cols`` entries, and two *stable* sorts by index then split
that order into rows and into columns:

1. sort the flat entries by their ordered key (:func:`knng.select.keys.ordered_bits_torch`:
   NaN largest, −0.0 before +0.0); the sort is stable, so equal keys stay in flat
   (row-major) order, which is column order within a row and row order within a column;
2. stable-sort that permutation by row index: each row's entries now lie together, still in
   key order, so the first k of each row are its k smallest;
3. stable-sort the same permutation by column index: the first k of each column likewise.

The result is exact in the total order of :mod:`knng.select.keys` (ties by smaller index), and
identical on CPU and CUDA: only integer keys are sorted, never raw floats, whose NaN and
signed-zero handling differs between torch's CPU and CUDA sorts. float16 and bfloat16 blocks
upcast exactly to float32; float64 blocks are ordered on their own 64-bit patterns by the same
rule, never rounded to float32 (which would merge distinct values). The graph engine asks for
:func:`batch_sort_rows_and_columns` on its off-diagonal blocks, where one value sort serves both
the row and the column candidates. The thesis finds it slower than selection for small k; it
is kept as the historical baseline and as an exact reference that runs on the device.

Workspace, in bytes per block entry: computing the keys goes through a few int64 temporaries
inside ``ordered_bits_torch`` (about 33 at once: the peak); the value sort holds the int32 keys,
its sorted keys and its int64 permutation (16); each regrouping sort holds that permutation, the
int32 row or column ids and its own sorted ids and permutation (24), and applying the regrouping
holds three int64 arrays (24). About 32 bytes per entry at the peak, 8 times a float32 block,
plus the scratch of torch's sort (CUDA's radix sort double-buffers its keys and values). A
float64 block has int64 keys: 24 bytes during its value sort.
"""

from __future__ import annotations

import torch

from knng.select.keys import ordered_bits_torch
from knng.select.registry import register

__all__ = ["batch_sort_select", "batch_sort_select_columns", "batch_sort_rows_and_columns"]

#: float64 → int64 key: negative floats have every bit but the sign flipped (larger magnitude,
#: smaller key; −0.0 becomes −1, just below +0.0's 0).
_LOW_63_BITS = 0x7FFFFFFFFFFFFFFF


def _check(scores: torch.Tensor, k: int, axis: int, name: str = "k") -> None:
    """Raise unless ``scores`` is a 2-D float block and 0 ≤ k ≤ its length along ``axis``.

    ``name`` is the caller's parameter holding ``k``, for the message.
    """
    if scores.ndim != 2:
        raise ValueError(f"scores must be 2-D (rows × columns), got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor, got {scores.dtype}")
    length = scores.shape[axis]
    if not 0 <= k <= length:
        raise ValueError(f"{name} must lie in [0, {length}] (the number of {('rows', 'columns')[axis]}), got {k}")


def _float64_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys of float64 values whose signed order is the selection order, exactly.

    The float64 analogue of :func:`~knng.select.keys.ordered_bits_torch` (which is float32
    only): every NaN maps to the largest int64, −0.0 sorts before +0.0. Converting to float32
    instead would merge distinct values and let the index decide between them.
    """
    bits = scores.contiguous().view(torch.int64)
    keys = torch.where(bits < 0, bits ^ _LOW_63_BITS, bits)
    return torch.where(torch.isnan(scores), torch.full_like(keys, torch.iinfo(torch.int64).max), keys)


def _ordered_keys(scores: torch.Tensor) -> torch.Tensor:
    """The block's sort keys, shape (rows, cols), in the order of :mod:`knng.select.keys`.

    float16, bfloat16 and float32 give int32 keys: the float32 ordered bits (float16 and
    bfloat16 upcast exactly) shifted by −2³¹ into the int32 range, which keeps their order and
    halves the passes of a radix sort next to int64 keys. float64 gives :func:`_float64_keys`.
    """
    if scores.dtype == torch.float64:
        return _float64_keys(scores)
    return (ordered_bits_torch(scores.to(torch.float32)) - 2**31).to(torch.int32)


def _value_order(scores: torch.Tensor) -> torch.Tensor:
    """Step 1: flat (row-major) positions of the block's entries, sorted by key, stably."""
    return torch.sort(_ordered_keys(scores).reshape(-1), stable=True).indices


def _group_ids(order: torch.Tensor, cols: int, by_row: bool) -> torch.Tensor:
    """Row (or column) id of every flat position in ``order``, as int32.

    Ids are below 2³¹, and 32-bit keys halve the radix passes of the regrouping sort.
    """
    ids = order // cols if by_row else order % cols
    return ids.to(torch.int32)


def _first_of_groups(order: torch.Tensor, shape: tuple[int, int], k: int, by_row: bool) -> torch.Tensor:
    """Steps 2 / 3: regroup the key order by row (or column), keep each group's first k.

    Returns the flat positions of the first k entries of every row, shape (rows, k), or of
    every column, shape (cols, k). Each group holds exactly as many entries as the other side
    of the block, so the regrouped order reshapes into (groups, size).
    """
    rows, cols = shape
    regroup = torch.sort(_group_ids(order, cols, by_row), stable=True).indices
    groups, size = (rows, cols) if by_row else (cols, rows)
    return order[regroup].view(groups, size)[:, :k]


def _rows(scores: torch.Tensor, order: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest (values, column indices) from the step-1 order."""
    cols = scores.shape[1]
    col_idx = _first_of_groups(order, scores.shape, k, by_row=True) % cols
    return torch.gather(scores, 1, col_idx), col_idx


def _columns(scores: torch.Tensor, order: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each column's k smallest (values, row indices), shape (cols, k), from the step-1 order."""
    cols = scores.shape[1]
    row_idx = _first_of_groups(order, scores.shape, k, by_row=False) // cols
    return torch.gather(scores.T, 1, row_idx), row_idx


@register("batch_sort")
def batch_sort_select(scores: torch.Tensor, k: int, *, sorted: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each row of ``scores``, by batch index sorting.

    Parameters
    ----------
    scores : torch.Tensor
        (rows, cols) float block (float16, bfloat16, float32 or float64), any strides, any device.
    k : int
        How many per row, 0 ≤ k ≤ cols.
    sorted : bool
        Accepted for the common signature; the result is always ascending (the sorts give it).

    Returns
    -------
    values : torch.Tensor
        (rows, k), the block's own entries (dtype, −0.0 and NaN payloads kept).
    indices : torch.Tensor
        (rows, k) int64 column indices, in the order of :mod:`knng.select.keys`.
    """
    _check(scores, k, axis=1)
    return _rows(scores, _value_order(scores), k)


def batch_sort_select_columns(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each *column*: ``(cols, k)`` values and int64 row indices.

    Works on the block as it lies in memory (no transposed copy); ascending, exact.
    """
    _check(scores, k, axis=0)
    return _columns(scores, _value_order(scores), k)


def batch_sort_rows_and_columns(scores: torch.Tensor, k_rows: int, k_cols: int
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and column lists of one block from a single value sort (the thesis's three sorts).

    Parameters
    ----------
    scores : torch.Tensor
        (rows, cols) float block, any strides, any device.
    k_rows : int
        Entries kept per row, 0 ≤ k_rows ≤ cols.
    k_cols : int
        Entries kept per column, 0 ≤ k_cols ≤ rows.

    Returns
    -------
    row_values, row_indices : torch.Tensor
        (rows, k_rows): each row's smallest entries and their column indices (int64), ascending.
    col_values, col_indices : torch.Tensor
        (cols, k_cols): each column's smallest entries and their row indices (int64), ascending.

    Notes
    -----
    The workspace is the module's: about 32 bytes per block entry at the peak, plus the
    scratch of torch's sort; the value sort is shared, so this costs one sort less than
    :func:`batch_sort_select` followed by :func:`batch_sort_select_columns`.
    """
    _check(scores, k_rows, axis=1, name="k_rows")
    _check(scores, k_cols, axis=0, name="k_cols")
    order = _value_order(scores)
    return (*_rows(scores, order, k_rows), *_columns(scores, order, k_cols))


batch_sort_select.columns = batch_sort_select_columns  # type: ignore[attr-defined]
batch_sort_select.rows_and_columns = batch_sort_rows_and_columns  # type: ignore[attr-defined]
