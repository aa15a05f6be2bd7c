"""NumPy references of the historical k-selection baselines, step by step as the GPU kernels run.

* :func:`insertion_reference` — every row keeps a sorted list of k entries and inserts each new
  entry that beats the list's last one (Garcia et al. 2008, the kernel Nolan 2009 describes);
* :func:`bitonic_reference` — every row sorts chunks of K = 2^⌈log₂ k⌉ entries with the bitonic
  network and merges each into a running best K (Sismanis et al. 2012; Nolan 2009, section 4.4.3);
* :func:`batch_sort_reference` — the whole block sorted by value, then stably by row and by column
  index (Dashti 2013, section 3.3); :mod:`knng.select.batch_sort` is the torch version.

All of them compare the 64-bit composite keys of :mod:`knng.select.keys` (ordered float bits in the
upper half, the column in the lower), so they follow its total order — NaN largest, −0.0 before
+0.0, ties by smaller index — and return exactly :func:`~knng.select.keys.select_reference`'s
answer. The loops follow the kernels (over columns, list slots, network stages) and vectorize
over rows, one row per GPU thread (insertion) or thread block (bitonic).
"""

from __future__ import annotations

import numpy as np

from knng.select.keys import composite_keys, ordered_bits

__all__ = ["insertion_reference", "bitonic_reference", "bitonic_sort", "bitonic_merge", "batch_sort_reference",
           "SENTINEL"]

#: Key of an empty list slot and of padding: above every real composite key (a real key's lower
#: half is a column index, below 2³² − 1).
SENTINEL = np.uint64(np.iinfo(np.uint64).max)

_COLUMN_BITS = np.uint64(0xFFFFFFFF)


def _as_block(values: np.ndarray, k: int, length: int | None = None, name: str = "k") -> np.ndarray:
    """``values`` as a 2-D float32 array, after checking 0 ≤ k ≤ length (default: the columns)."""
    v = np.asarray(values, dtype=np.float32)
    if v.ndim != 2:
        raise ValueError(f"values must be 2-D (rows × columns), got shape {v.shape}")
    length = v.shape[1] if length is None else length
    if not 0 <= k <= length:
        raise ValueError(f"{name} must lie in [0, {length}], got {k}")
    return v


def _decode(values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The block's own entries and int64 column indices named by composite ``keys``."""
    indices = (keys & _COLUMN_BITS).astype(np.int64)
    return np.take_along_axis(values, indices, axis=1), indices


# ------------------------------------------------------------------------------ insertion
def _insert(best: np.ndarray, key: np.ndarray) -> None:
    """One step of every row: ``key`` enters the row's sorted list if it beats the last entry.

    As in the kernel, a moving row walks its list from the end: each entry above the key moves
    one slot right (the last one falls off) until the key finds its slot. ``best`` is updated in
    place.
    """
    moving = key < best[:, -1]  # the one compare most entries stop at
    for j in range(best.shape[1] - 1, 0, -1):
        if not moving.any():
            return
        shift = moving & (best[:, j - 1] > key)
        best[:, j] = np.where(shift, best[:, j - 1], np.where(moving, key, best[:, j]))
        moving = shift
    best[moving, 0] = key[moving]


def insertion_reference(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k smallest entries by truncated insertion sort, the historical GPU baseline.

    Parameters
    ----------
    values : np.ndarray
        (rows, cols) block, converted to float32.
    k : int
        Entries per row, 0 ≤ k ≤ cols.

    Returns
    -------
    values : np.ndarray
        (rows, k) float32, the block's own entries, ascending in the order of
        :mod:`knng.select.keys`.
    indices : np.ndarray
        (rows, k) int64 column indices.

    Notes
    -----
    Garcia et al. (2008) give each row (query) to one thread, which keeps a sorted list of k
    composite keys, starting from sentinels, and reads the row in column order; an entry whose
    key is below the list's last one is inserted, the larger entries shifting one slot right
    (Nolan 2009, section 4.4.1, sorts the first k entries first, which is the same sequence of
    insertions). Every composite key is distinct, so the result is the order's unique answer.

    Cost per row of ``cols`` entries: one comparison per entry against the list's tail, plus
    up to k compare-and-moves per insertion. In random order the i-th entry is inserted with
    probability min(1, k / i), about k·(1 + ln(cols / k)) insertions in all, so the expected work
    is cols + O(k²·log(cols / k)); a descending row inserts everything, cols·k. Memory traffic
    is one read of the block (4 bytes per entry); the list is 8·k bytes per row, in registers
    or local memory, which is what limits k. Rows whose insertions differ diverge within a warp.
    """
    v = _as_block(values, k)
    best = np.full((v.shape[0], k), SENTINEL)
    if k:
        keys = composite_keys(v)
        for c in range(v.shape[1]):
            _insert(best, keys[:, c])
    return _decode(v, best)


# -------------------------------------------------------------------------------- bitonic
def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _compare_exchange(x: np.ndarray, stride: int, ascending: np.ndarray) -> None:
    """One stage of the network on the last axis of the C-contiguous ``x``, in place.

    Position i meets its partner i ^ stride; the pair (the smaller position first) is put in
    ascending order where ``ascending[i]``, descending elsewhere. The pairs are the two halves
    of every run of 2·stride positions, so a reshape reaches them without fancy indexing.
    """
    n = x.shape[-1]
    runs = x.reshape(*x.shape[:-1], n // (2 * stride), 2, stride)  # a view: x is contiguous
    a, b = runs[..., 0, :], runs[..., 1, :]
    up = ascending.reshape(n // (2 * stride), 2, stride)[:, 0, :]
    swap = np.where(up, a > b, a < b)
    a[...], b[...] = np.where(swap, b, a), np.where(swap, a, b)


def bitonic_sort(keys: np.ndarray) -> np.ndarray:
    """Sort the last axis of ``keys`` (a power of two long) ascending with the bitonic network.

    The iterative network of Nolan (2009), section 4.4.3: for size = 2, 4, …, n and stride =
    size/2, …, 1, position i compare-exchanges with i ^ stride, ascending where ``i & size`` is
    0 and descending elsewhere, so each stage turns bitonic runs of ``size`` into sorted ones.
    (n/2)·log₂n·(log₂n + 1)/2 compare-exchanges, whatever the data. Returns a sorted copy.
    """
    n = keys.shape[-1]
    if not _is_power_of_two(n):
        raise ValueError(f"the bitonic network sorts a power-of-two length, got {n}")
    x = np.array(keys, order="C")  # a contiguous copy, sorted in place
    positions = np.arange(n)
    size = 2
    while size <= n:
        ascending = (positions & size) == 0
        stride = size // 2
        while stride:
            _compare_exchange(x, stride, ascending)
            stride //= 2
        size *= 2
    return x


def bitonic_merge(keys: np.ndarray) -> np.ndarray:
    """Sort a bitonic last axis (a power of two long) ascending: the strides n/2, …, 1.

    (n/2)·log₂n compare-exchanges. Returns a sorted copy.
    """
    n = keys.shape[-1]
    if not _is_power_of_two(n):
        raise ValueError(f"the bitonic merge sorts a power-of-two length, got {n}")
    x = np.array(keys, order="C")  # a contiguous copy, merged in place
    ascending = np.ones(n, dtype=bool)
    stride = n // 2
    while stride:
        _compare_exchange(x, stride, ascending)
        stride //= 2
    return x


def _chunks(keys: np.ndarray, width: int) -> np.ndarray:
    """(rows, ⌈cols / width⌉, width) view of the rows, the last chunk padded with sentinels."""
    rows, cols = keys.shape
    n_chunks = -(-cols // width)
    padded = np.full((rows, n_chunks * width), SENTINEL)
    padded[:, :cols] = keys
    return padded.reshape(rows, n_chunks, width)


def bitonic_reference(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k smallest entries by truncated bitonic sort, the bitonic GPU baseline.

    Parameters
    ----------
    values : np.ndarray
        (rows, cols) block, converted to float32.
    k : int
        Entries per row, 0 ≤ k ≤ cols.

    Returns
    -------
    values : np.ndarray
        (rows, k) float32, the block's own entries, ascending in the order of
        :mod:`knng.select.keys`.
    indices : np.ndarray
        (rows, k) int64 column indices.

    Notes
    -----
    With K = 2^⌈log₂ k⌉, each row keeps its best K composite keys, sorted (sentinels at first).
    The row is read in chunks of K columns (the last padded with sentinels); each chunk is sorted
    ascending by :func:`bitonic_sort`, then ``best[i] = min(best[i], chunk[K − 1 − i])`` — the
    first half-cleaner of a merge of ``best`` with the reversed chunk — leaves the K smallest of
    both as a bitonic sequence, which :func:`bitonic_merge` sorts. The first k of ``best`` are
    the answer. Chunks are independent, so this reference sorts them all at once; the kernel
    sorts each as it arrives.

    Cost per row: ⌈cols / K⌉ chunks of (K/2)·log₂K·(log₂K + 1)/2 compare-exchanges for the sort
    and K + (K/2)·log₂K for the merge, about cols·(log₂²K + 3·log₂K + 4)/4 in all, independent of
    the data (no divergence), against cols compares for a pass of insertion; K < 2k, so k just
    above a power of two nearly doubles the work. Memory traffic is one read of the block; the
    chunk and the best list take 16·K bytes of shared memory per row.
    """
    v = _as_block(values, k)
    rows = v.shape[0]
    if k == 0:
        return _decode(v, np.empty((rows, 0), dtype=np.uint64))
    width = 1 << (k - 1).bit_length()
    chunks = bitonic_sort(_chunks(composite_keys(v), width))
    best = np.full((rows, width), SENTINEL)
    for c in range(chunks.shape[1]):
        best = bitonic_merge(np.minimum(best, chunks[:, c, ::-1]))
    return _decode(v, best[:, :k])


# ----------------------------------------------------------------------------- batch sort
def batch_sort_reference(values: np.ndarray, k_rows: int, k_cols: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row and column lists of a block by batch index sorting: one value sort, two index sorts.

    Parameters
    ----------
    values : np.ndarray
        (rows, cols) block, converted to float32.
    k_rows : int
        Entries kept per row, 0 ≤ k_rows ≤ cols.
    k_cols : int
        Entries kept per column, 0 ≤ k_cols ≤ rows.

    Returns
    -------
    row_values, row_indices : np.ndarray
        (rows, k_rows): each row's smallest entries (float32, the block's own) and int64 column
        indices, ascending in the order of :mod:`knng.select.keys`.
    col_values, col_indices : np.ndarray
        (cols, k_cols): each column's smallest entries and int64 row indices, ascending.

    Notes
    -----
    Dashti (2013), section 3.3: the row-major block is sorted as one array by its ordered
    float bits, stably, so equal values keep their row-major order — column order within a
    row, row order within a column. Stable sorts of that permutation by row index and by
    column index then lay every row's and every column's entries out together, still in value
    order, and the first k of each are its answer: both lists of a graph block, from the block
    as it lies in memory.

    Cost: three sorts of rows·cols entries, whatever k — radix sorts on a GPU, a few passes
    over 4 to 8 bytes of key plus an 8-byte index per entry each — and a workspace of a few
    index arrays of the block's size. Every row and column comes out fully ordered, far more
    than k entries of each, which is why the thesis finds quick select faster for small k.
    """
    v = _as_block(values, k_rows, name="k_rows")
    rows, cols = v.shape
    _as_block(v, k_cols, length=rows, name="k_cols")
    order = np.argsort(ordered_bits(v).reshape(-1), kind="stable")
    # With cols = 0 the arrays are empty: no division by zero is evaluated.
    by_row = order[np.argsort(order // cols, kind="stable")].reshape(rows, cols)
    by_col = order[np.argsort(order % cols, kind="stable")].reshape(cols, rows)
    row_idx = (by_row[:, :k_rows] % cols).astype(np.int64)
    col_idx = (by_col[:, :k_cols] // cols).astype(np.int64)
    return (np.take_along_axis(v, row_idx, axis=1), row_idx,
            np.take_along_axis(v.T, col_idx, axis=1), col_idx)
