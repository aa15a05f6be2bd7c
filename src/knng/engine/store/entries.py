"""Flat and padded candidate entries, and the sorts, counts and scans a store update runs on them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from knng._options import get_options

__all__ = ["code64_up", "rounded_up", "Entries", "Block", "rebuild_groups", "sorted_counts", "compact", "pad", "overlapping_sorted"]


_SIGN_FLIP = 2**63 - 1


def code64_up(keys: torch.Tensor, shift: int) -> torch.Tensor:
    """float64 ``keys`` as int64 codes in [0, 2^(64 − shift)) that sort as the keys do, each
    key's order code (−0 just below +0) rounded up to a multiple of 2^shift."""
    bits = keys.view(torch.int64)
    code = torch.where(bits < 0, bits ^ _SIGN_FLIP, bits)
    up = (code & (2**shift - 1)) != 0
    return ((code >> shift) + 2**(63 - shift) + up).clamp_max(2**(64 - shift) - 1)


def rounded_up(keys: torch.Tensor, shift: int) -> torch.Tensor:
    """float64 ``keys`` rounded up to the values :func:`code64_up` codes exactly (≥ ``keys``)."""
    code = ((code64_up(keys, shift) - 2**(63 - shift)) << shift)
    return torch.where(code < 0, code ^ _SIGN_FLIP, code).view(torch.float64)


@dataclass
class Entries:
    """Survivors as flat arrays: store rows, global columns, screened keys and their radii."""

    rows: torch.Tensor
    cols: torch.Tensor
    keys: torch.Tensor
    rad: torch.Tensor


@dataclass
class Block:
    """Candidates of some rows as padded (m, w) matrices; empty slots have index −1."""

    keys: torch.Tensor
    rad: torch.Tensor
    idx: torch.Tensor
    dist: torch.Tensor   # float64 exact distance, NaN while only screened

    @classmethod
    def empty(cls, m: int, width: int, device: torch.device) -> "Block":
        inf = torch.full((m, width), torch.inf, dtype=torch.float64, device=device)
        return cls(inf, inf.clone(), torch.full((m, width), -1, dtype=torch.int64, device=device),
                   torch.full((m, width), torch.nan, dtype=torch.float64, device=device))


def rebuild_groups(extra: torch.Tensor, capacity: int, entries: int | None = None) -> list[torch.Tensor]:
    """Rows to pad together: similar widths (``extra + capacity`` each), at most ``entries``
    (default ``Options.rebuild_entries_cpu``) padded entries per group.

    The rows whose near-ties overflow are evaluated exactly as padded matrices
    (:meth:`CandidateStore._settle_ties`); one flat-region row with thousands of candidates among
    thousands of ordinary rows would otherwise pad them all to its width (the CPU graph of the
    camera patches: 74 s, 28 s in groups). Returns sorted index tensors into ``extra``.
    """
    entries = get_options().rebuild_entries_cpu if entries is None else entries
    widths = extra + capacity
    if int(widths.max()) * extra.numel() <= entries:
        return [torch.arange(extra.numel(), device=extra.device)]
    # Widths in classes (2^(c-1), 2^c], each class cut into groups of Options.rebuild_entries_cpu / 2^c
    # rows: no Python loop over rows (one over 150,000 overflowing rows cost 0.47 s of a GPU
    # graph), and no row padded to more than twice its width.
    classes = torch.ceil(torch.log2(widths.to(torch.float64))).to(torch.int64)
    order = torch.argsort(classes, stable=True)  # ascending row index within a class
    values, counts = torch.unique_consecutive(classes[order], return_counts=True)
    groups, start = [], 0
    for c, count in zip(values.tolist(), counts.tolist()):
        rows = max(1, entries >> c)
        groups.extend(order[s:min(start + count, s + rows)] for s in range(start, start + count, rows))
        start += count
    return groups


def sorted_counts(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Entries per row (int64, (n,)) of ascending store ``rows``.

    On a GPU from where each row starts (:func:`counts_by_starts`): ``index_add_`` of ones
    serialises its atomic adds on sorted rows (a warp's threads add to one counter), and an 8×8
    image-patch graph's store updates at k = 100 spent 25 ms of GPU in it (H200, 2026-11-26). On
    a CPU ``index_add_`` is one pass, where a search of every row's start in a small update is
    n·log of its size."""
    if rows.device.type != "cuda":
        return torch.zeros(n, dtype=torch.int64, device=rows.device).index_add_(0, rows, torch.ones_like(rows))
    return counts_by_starts(rows, n)


def counts_by_starts(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Entries per row of ascending ``rows`` by a search for each row's first entry."""
    bounds = torch.searchsorted(rows, torch.arange(n + 1, device=rows.device, dtype=rows.dtype))
    return bounds[1:] - bounds[:-1]


def compact(mask: torch.Tensor, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The entries of ``tensors`` where ``mask`` holds, in order: one ``nonzero`` for all of them
    (indexing each by the mask finds the positions again, a GPU synchronisation each time)."""
    at = torch.nonzero(mask).flatten()
    return [t[at] for t in tensors]


def pad(t: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    if t.shape[1] >= width:
        return t[:, :width]
    pad = torch.full((t.shape[0], width - t.shape[1]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, pad], 1)


def overlapping_sorted(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Per row, which intervals [low, high] intersect another interval of the same row.

    Rows must be in ascending order of the intervals' centres: interval j meets an earlier one
    iff the running maximum of the earlier ``high`` reaches ``low[j]``, and a later one iff the
    running minimum of the later ``low`` is within ``high[j]``. On a GPU many narrow rows are
    scanned as the columns of their transpose (:data:`SCAN_TRANSPOSED_ROWS`).
    """
    m, w = low.shape
    if low.device.type == "cuda" and m >= SCAN_TRANSPOSED_ROWS * w:
        return overlapping_sorted_columns(low.t().contiguous(), high.t().contiguous()).t()
    return overlaps_along(low, high, 1)


#: :func:`overlapping_sorted` scans the transpose on a GPU from this many rows per entry of a
#: row on: torch's scans along the last dimension take one block per row, along the first one
#: thread per column. H200, 2026-11-26 (``bench/overlap_scan_rates.py``, CUDA events):
#: 582,150 × 18 12.65 ms along the rows, 0.89 transposed; 300,000 × 125 7.45 / 2.47;
#: 100,000 × 136 0.71 / 0.82; 10,000 × 1,250 0.75 / 1.62.
SCAN_TRANSPOSED_ROWS = 1024


def overlapping_sorted_columns(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """:func:`overlapping_sorted` of the columns of ``low`` and ``high`` (each column a row)."""
    return overlaps_along(low, high, 0)


def overlaps_along(low: torch.Tensor, high: torch.Tensor, dim: int) -> torch.Tensor:
    """The scans of :func:`overlapping_sorted` along dimension ``dim`` (0 or 1) of 2-D tensors."""

    def cut(start: int | None, stop: int | None) -> tuple[slice, ...]:
        return (slice(None),) * dim + (slice(start, stop),)

    inf = torch.full_like(low[cut(None, 1)], torch.inf)
    prev_hi = torch.cat([-inf, torch.cummax(high, dim=dim).values[cut(None, -1)]], dim=dim)
    next_lo = torch.cat([torch.flip(torch.cummin(torch.flip(low, [dim]), dim=dim).values, [dim])[cut(1, None)], inf],
                        dim=dim)
    return (prev_hi >= low) | (next_lo <= high)
