"""The threshold screen of one score block: which pairs a row (or column) must keep.

A pair survives for row i when its screened key s̃ᵢⱼ is ≤ the row's block threshold tᵢ
(τᵢ plus an error radius valid for every column of the block); in a symmetric graph block the
same entry is also tested for column j against tⱼ. Most rows of a block keep nothing once
their thresholds are tight, so each side is first filtered by its minimum (one cheap reduction
that reads the block once) and only rows/columns that can keep anything are compared entry by
entry.

Two ways to get there, one contract: the torch screen materialises the score block (the
augmented layout of :mod:`knng.metrics`, float32 or float64) and compares it; the fused kernel
(:mod:`knng.engine.fused`, the precisions with ``fused=True``) never writes the block and
returns the same kind of survivors. :func:`block_scores` is the kernel's reference: the same
split-form scores, materialised in float32 by torch, which is also what runs wherever the
kernel cannot (a CPU, a GPU without Triton). :func:`screen_rows` and :func:`screen_pairs` pick
the path; the engine calls only them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from knng.engine import fused
from knng.metrics import ScreenPrecision

__all__ = ["Survivors", "row_survivors", "column_survivors", "block_survivors", "block_scores", "screen_rows",
           "screen_pairs", "use_kernel"]

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
    if scores.device.type == "cuda":
        # A pass of minima costs as much as the compare itself on a GPU (see block_survivors).
        r, c = torch.nonzero(scores <= thr[:, None], as_tuple=True)
        return Survivors(owner=r, other=c, keys=scores[r, c])
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


def block_survivors(scores: torch.Tensor, row_thresholds: torch.Tensor, col_thresholds: torch.Tensor | None
                    ) -> tuple[Survivors, Survivors | None]:
    """Both sides of a block: the pairs kept by their row and those kept by their column.

    On a CPU each side is filtered by its minima first (cache-resident blocks: the reductions
    are cheap and most rows keep nothing). On a GPU the block is compared once against both
    thresholds and the survivors are split afterwards: every pass over a 1 GiB block costs as
    much as the product, so one compare and one ``nonzero`` beat two minima, two compares and
    a strided gather.
    """
    if col_thresholds is None:
        return row_survivors(scores, row_thresholds), None
    if scores.device.type != "cuda":
        return row_survivors(scores, row_thresholds), column_survivors(scores, col_thresholds)
    row_thr = _round_up(row_thresholds.to(scores.dtype), row_thresholds)
    col_thr = _round_up(col_thresholds.to(scores.dtype), col_thresholds)
    mask = scores <= row_thr[:, None]
    mask |= scores <= col_thr[None, :]
    r, c = torch.nonzero(mask, as_tuple=True)
    keys = scores[r, c]
    by_row = keys <= row_thr[r]
    by_col = keys <= col_thr[c]
    return (Survivors(owner=r[by_row], other=c[by_row], keys=keys[by_row]),
            Survivors(owner=c[by_col], other=r[by_col], keys=keys[by_col]))


def block_scores(a: torch.Tensor, b: torch.Tensor, d: int, precision: ScreenPrecision,
                 row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None) -> torch.Tensor:
    """The score block ``a · bᵀ`` as the screen of ``precision`` sees it, materialised.

    Non-fused precisions: one product of the augmented layouts (terms inside). Fused ones: the
    split form of the kernel — the d input columns of the stored (rounded) vectors multiplied in
    IEEE float32, then the float32 terms added, columns' first; its rounding stays within the
    kernel's bound, so it is the kernel's reference and its stand-in off the GPU.
    """
    if not precision.fused:
        return a @ b.T
    scores = a[:, :d].to(torch.float32) @ b[:, :d].to(torch.float32).T
    if col_terms is not None:
        scores += col_terms[None, :]
    if row_terms is not None:
        scores += row_terms[:, None]
    return scores


def use_kernel(precision: ScreenPrecision, device: torch.device) -> bool:
    """Whether the fused kernel runs this precision's screen on ``device``."""
    return precision.fused and fused.fused_available(device)


def screen_rows(a: torch.Tensor, b: torch.Tensor, d: int, thresholds: torch.Tensor, precision: ScreenPrecision, *,
                row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None,
                exclude_diagonal: int | None = None) -> Survivors:
    """Pairs of the block ``a · bᵀ`` kept by their row's (float64) threshold.

    ``exclude_diagonal``: drop the entries ``(t, t − exclude_diagonal)`` (a point and itself).
    ``row_terms``/``col_terms`` are the float32 terms of the split form (fused precisions).
    """
    if use_kernel(precision, a.device):
        out = fused.screen_block(a, b, d, _round_up(thresholds.to(torch.float32), thresholds), None, row_terms,
                                 col_terms, precision.name, exclude_diagonal=exclude_diagonal)
        return Survivors(owner=out.rows, other=out.cols, keys=out.keys)
    scores = block_scores(a, b, d, precision, row_terms, col_terms)
    if exclude_diagonal is not None:
        t = torch.arange(scores.shape[0], device=scores.device)
        c = t - exclude_diagonal
        ok = (c >= 0) & (c < scores.shape[1])
        scores[t[ok], c[ok]] = torch.inf
    return row_survivors(scores, thresholds)


def screen_pairs(a: torch.Tensor, b: torch.Tensor, d: int, row_thresholds: torch.Tensor,
                 col_thresholds: torch.Tensor, precision: ScreenPrecision, *, row_terms: torch.Tensor | None = None,
                 col_terms: torch.Tensor | None = None) -> tuple[Survivors, Survivors]:
    """Both sides of a symmetric block ``a · bᵀ``: pairs kept by their row, and by their column."""
    if use_kernel(precision, a.device):
        out = fused.screen_block(a, b, d, _round_up(row_thresholds.to(torch.float32), row_thresholds),
                                 _round_up(col_thresholds.to(torch.float32), col_thresholds), row_terms, col_terms,
                                 precision.name)
        by_row = (out.side & 1) != 0
        by_col = (out.side & 2) != 0
        return (Survivors(owner=out.rows[by_row], other=out.cols[by_row], keys=out.keys[by_row]),
                Survivors(owner=out.cols[by_col], other=out.rows[by_col], keys=out.keys[by_col]))
    by_row, by_col = block_survivors(block_scores(a, b, d, precision, row_terms, col_terms), row_thresholds,
                                     col_thresholds)
    assert by_col is not None
    return by_row, by_col


def _round_up(rounded: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``rounded`` nudged up one step wherever the rounding went below ``exact``."""
    if rounded.dtype == exact.dtype:
        return rounded
    below = rounded.to(exact.dtype) < exact
    return torch.where(below, torch.nextafter(rounded, torch.full_like(rounded, torch.inf)), rounded)


def _empty(device: torch.device, dtype: torch.dtype) -> Survivors:
    none = torch.empty(0, dtype=torch.int64, device=device)
    return Survivors(owner=none, other=none.clone(), keys=torch.empty(0, dtype=dtype, device=device))
