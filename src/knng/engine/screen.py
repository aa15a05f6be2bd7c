"""The threshold screen of one score block: which pairs a row (or column) must keep.

A pair survives for row i when its screened key s̃ᵢⱼ is ≤ the row's block threshold tᵢ
(τᵢ plus an error radius valid for every column of the block); in a symmetric graph block the
same entry is also tested for column j against tⱼ. Most rows of a block keep nothing once
their thresholds are tight, so on a CPU each side is first filtered by the minima of short
chunks (one cheap reduction that reads the block once) and only chunks that can keep anything
are compared entry by entry.

Two ways to get there, one contract: the torch screen materialises the score block (the
augmented layout of :mod:`knng.metrics`, float32 or float64) and compares it; the fused kernel
(:mod:`knng.engine.kernels.fused`, the precisions with ``fused=True``) never writes the block and
returns the same kind of survivors. :func:`block_scores` is the kernel's reference: the same
split-form scores, materialised in float32 by torch, which is also what runs wherever the
kernel cannot (a CPU, a GPU without Triton). :func:`screen_rows` and :func:`screen_pairs` pick
the path; the engine calls only them.
"""

from __future__ import annotations

from typing import Callable

import torch

from knng.engine import stages
from knng.metrics import (
    DIGIT_BASE, DIGIT_MAX, INTEGER_LOW, ScreenPrecision, digit_blocks, digit_row_factors, digit_scales,
    integer_blocks, integer_terms, scaled_row_factors, scaled_scales, scaled_width,
)
from knng._options import get_options
from knng.engine import kernels
from knng.engine.kernels import (
    TILE, Survivors, block_epilogue, gathered_runs, screen_block, screen_kernel_runs, select_block,
    strip_minima_runs, triangle_runs, triton_runs, strip_width,
)

__all__ = ["Survivors", "ScoreBuffer", "row_survivors", "survivors_of_smallest", "column_survivors",
           "block_survivors", "block_scores", "integer_scores", "screen_rows", "screen_rows_later", "screen_pairs", "screen_pairs_later",
           "pair_scores", "strip_minima", "strip_minima_of", 
           "screen_own_later", "own_block_survivors", "tile_minima", "screen_tiles"]

#: Entries per chunk of the CPU screen: each chunk's minimum decides whether its entries are
#: read. Along a row (contiguous) 64 entries, across rows 32: the reductions that ran fastest
#: on 2,048² blocks (2 cores: 0.34 ms and 0.29 ms; 32 along a row 0.56 ms).
ROW_CHUNK = 64
COLUMN_CHUNK = 32
#: Compare the whole block once at least 1/DENSE_HITS of its chunks can keep something.
DENSE_HITS = 4
# ``Options.gemm_column_terms``: on a GPU, the fused precisions' reference adds the float32
# column terms in the product's epilogue (``torch.addmm`` with the terms as a bias: cuBLAS adds
# them to the float32 accumulator after the sum, one float32 rounding, as the separate addition
# did) instead of a pass over the block: a search's seeds at k = 100 added them to a 10k ×
# 65,536 sample block in 2.2 ms of 4.7 (H100). A CPU's BLAS may start its sums from the bias,
# which the bound's single rounding of each term does not cover, so CPUs add them after the
# product.


class ScoreBuffer:
    """One score block's memory, reused by every block of a run on a CPU.

    A fresh 2,048² float32 block per product costs its page faults: the same product into a
    reused block ran 4.0–4.2 ms against 4.5–5.6 ms (2 cores). Survivors' keys are copies, so
    nothing outlives the block that wrote them. GPUs need none (the caching allocator reuses
    blocks, and a held block could not be released after an out-of-memory error).
    """

    def __init__(self) -> None:
        self._flat: torch.Tensor | None = None

    def take(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """An uninitialised (rows, cols) block, valid until the next call."""
        need = rows * cols
        flat = self._flat
        if flat is None or flat.numel() < need or flat.dtype != dtype or flat.device != device:
            flat = self._flat = torch.empty(need, dtype=dtype, device=device)
        return flat[:need].view(rows, cols)


def _banded_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``a · bᵀ`` for the layouts of one set of points (m × m, symmetric but for rounding), in
    ``Options.symmetric_bands`` row bands: band I's product with the columns from band I on, and
    its entries left of the band mirrored from the bands above. A mirrored entry (i, j) is
    the sum of the same products as entry (j, i) in another order (the augmented layouts give
    a_iᵀb_j and a_jᵀb_i the same terms), so the rounding bound that covers one covers it: a
    valid score of the pair, as the whole product's is."""
    stages.count("screen.banded_product")
    m = a.shape[0]
    if out is None:
        out = torch.empty((m, m), dtype=torch.result_type(a, b), device=a.device)
    bands = get_options().symmetric_bands
    edges = [m * i // bands for i in range(bands + 1)]
    for i0, i1 in zip(edges, edges[1:]):
        if i1 > i0:
            torch.mm(a[i0:i1], b[i0:].T, out=out[i0:i1, i0:])
            out[i1:, i0:i1] = out[i0:i1, i1:].T
    return out


def row_survivors(scores: torch.Tensor, thresholds: torch.Tensor) -> Survivors:
    """Entries of each row of ``scores`` at or below the row's (float64) threshold."""
    # Rounding the float64 threshold to the block's dtype must not drop a survivor.
    thr = _round_up(thresholds.to(scores.dtype), thresholds)
    if scores.device.type == "cuda":
        if triton_runs(scores.device):
            return select_block(scores, thr, None)[0]
        # A pass of minima costs as much as the compare itself on a GPU (see block_survivors).
        r, c = torch.nonzero(scores <= thr[:, None], as_tuple=True)
        return Survivors(owner=r, other=c, keys=scores[r, c])
    return _chunked_survivors(scores, thr, by_rows=True)


def survivors_of_smallest(scores: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                          thresholds: torch.Tensor) -> tuple[torch.Tensor, Survivors]:
    """:func:`row_survivors` of ``scores`` from each row's smallest entries (``values`` at
    ``positions``, (m, w), selected by float32 key: :func:`knng.engine.thresholds.smallest_candidates`).

    Every entry left out has a float32 key at least the largest selected one. Rounding to
    nearest keeps order, so an entry at or below its row's threshold has a key at or below the
    threshold's rounded up: where the largest selected key lies above that, the row's survivors
    are among its selection, and only the other rows (near-ties past the selection: duplicates,
    flat regions) are compared whole. A row whose selection is every column is complete.

    Returns which selected entries survive (m, w; none in the rows compared whole) and the
    survivors of the rows compared whole.
    """
    stages.count("screen.whole_by_smallest")
    m, cols = scores.shape
    thr = _round_up(thresholds.to(scores.dtype), thresholds)
    if positions.shape[1] >= cols:
        complete = torch.ones(m, dtype=torch.bool, device=scores.device)
    else:
        largest = values.to(torch.float32).amax(dim=1)
        complete = largest > _round_up(thresholds.to(torch.float32), thresholds)
    kept = (values <= thr[:, None]) & complete[:, None]
    rest = torch.nonzero(~complete).flatten()
    if rest.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64, device=scores.device)
        return kept, Survivors(owner=empty, other=empty, keys=scores.new_empty(0))
    scanned = row_survivors(scores[rest], thresholds[rest])
    return kept, Survivors(owner=rest[scanned.owner], other=scanned.other, keys=scanned.keys)


def column_survivors(scores: torch.Tensor, thresholds: torch.Tensor) -> Survivors:
    """Entries of each column of ``scores`` at or below the column's threshold."""
    thr = _round_up(thresholds.to(scores.dtype), thresholds)
    if scores.device.type == "cuda":
        c, r = torch.nonzero(scores.T <= thr[:, None], as_tuple=True)
        return Survivors(owner=c, other=r, keys=scores[r, c])
    return _chunked_survivors(scores, thr, by_rows=False)


def _chunked_survivors(scores: torch.Tensor, thr: torch.Tensor, by_rows: bool) -> Survivors:
    """The CPU screen of one side: minima of short chunks first, entries of hit chunks after.

    On a CPU torch's compares into boolean masks and ``nonzero`` run at a fraction of the
    speed of float reductions (1,024² block, 2 cores: compare 0.45 ms, ``nonzero`` 1.1 ms,
    ``amin`` 0.05–0.09 ms). Tight thresholds leave a row a survivor or two per block, so the
    chunks' minima (one float reduction along the contiguous axis, or across rows for the
    column side) find the few chunks that hold any, and only those are gathered and compared.
    Measured on a 1,024² block: 0.35–1.1 ms per side against 1.5 ms for compare + ``nonzero``.
    """
    rows_axis = 0 if by_rows else 1
    owners = scores.shape[rows_axis]
    length = scores.shape[1 - rows_axis]
    chunk = ROW_CHUNK if by_rows else COLUMN_CHUNK
    chunks = length // chunk
    owner_parts, other_parts, key_parts = [], [], []
    if chunks:
        if by_rows:
            body = scores[:, :chunks * chunk].unflatten(1, (chunks, chunk))
            hit_owner, hit_chunk = torch.nonzero(body.amin(2) <= thr[:, None], as_tuple=True)
        else:
            body = scores[:chunks * chunk].unflatten(0, (chunks, chunk))
            hit_chunk, hit_owner = torch.nonzero(body.amin(1) <= thr[None, :], as_tuple=True)
        if hit_owner.numel() * DENSE_HITS >= owners * chunks:
            # Most chunks hold a survivor (loose thresholds): compare the whole block once.
            return _compare_whole(scores, thr, by_rows)
        if by_rows:
            # One contiguous chunk per hit: index_select copies rows (3–4× faster than [i, j]).
            entries = body.reshape(owners * chunks, chunk).index_select(0, hit_owner * chunks + hit_chunk)
        else:
            entries = body[hit_chunk, :, hit_owner]
        i, j = torch.nonzero(entries <= thr[hit_owner, None], as_tuple=True)
        owner_parts.append(hit_owner[i])
        other_parts.append(hit_chunk[i] * chunk + j)
        key_parts.append(entries[i, j])
    if chunks * chunk < length:
        tail = scores[:, chunks * chunk:] if by_rows else scores[chunks * chunk:]
        found = _compare_whole(tail, thr, by_rows)
        owner_parts.append(found.owner)
        other_parts.append(found.other + chunks * chunk)
        key_parts.append(found.keys)
    if len(owner_parts) == 1:
        return Survivors(owner=owner_parts[0], other=other_parts[0], keys=key_parts[0])
    return Survivors(owner=torch.cat(owner_parts), other=torch.cat(other_parts), keys=torch.cat(key_parts))


def _compare_whole(scores: torch.Tensor, thr: torch.Tensor, by_rows: bool) -> Survivors:
    """Every entry compared with its row's (``by_rows``) or column's threshold."""
    if by_rows:
        r, c = torch.nonzero(scores <= thr[:, None], as_tuple=True)
        return Survivors(owner=r, other=c, keys=scores[r, c])
    r, c = torch.nonzero(scores <= thr[None, :], as_tuple=True)
    return Survivors(owner=c, other=r, keys=scores[r, c])


def block_survivors(scores: torch.Tensor, row_thresholds: torch.Tensor, col_thresholds: torch.Tensor | None
                    ) -> tuple[Survivors, Survivors | None]:
    """Both sides of a block: the pairs kept by their row and those kept by their column.

    On a CPU each side is filtered by chunk minima first (cache-resident blocks: the reductions
    are cheap and most chunks keep nothing). On a GPU every pass over a 1 GiB block costs as
    much as the product: with Triton, one kernel reads the block once, tests both sides and
    appends each side's survivors to a list of its own (:func:`knng.engine.kernels.fused.select_block`);
    without, the block is compared once against both thresholds and ``nonzero`` finds the
    survivors, split afterwards.
    """
    if col_thresholds is None:
        return row_survivors(scores, row_thresholds), None
    if scores.device.type != "cuda":
        return row_survivors(scores, row_thresholds), column_survivors(scores, col_thresholds)
    # Both sides rounded in one pass (each step is a launch on a GPU).
    both = torch.cat([row_thresholds, col_thresholds])
    both_thr = _round_up(both.to(scores.dtype), both)
    row_thr, col_thr = both_thr[:row_thresholds.numel()], both_thr[row_thresholds.numel():]
    if triton_runs(scores.device):
        return select_block(scores, row_thr, col_thr)
    mask = scores <= row_thr[:, None]
    mask |= scores <= col_thr[None, :]
    r, c = torch.nonzero(mask, as_tuple=True)
    keys = scores[r, c]
    by_row = keys <= row_thr[r]
    by_col = keys <= col_thr[c]
    return (Survivors(owner=r[by_row], other=c[by_row], keys=keys[by_row]),
            Survivors(owner=c[by_col], other=r[by_col], keys=keys[by_col]))


def block_scores(a: torch.Tensor, b: torch.Tensor, d: int, precision: ScreenPrecision,
                 row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None,
                 buffer: ScoreBuffer | None = None, symmetric: bool = False) -> torch.Tensor:
    """The score block ``a · bᵀ`` as the screen of ``precision`` sees it, materialised.

    Digit precisions (``int8x4``): the exact integer products of the digit layouts, combined
    and scaled in float32 (:func:`digit_scores`), then the float32 terms added. Scaled float16
    rows (``float16``): the float32 product of the stored values times α·s_a and s_b (exact:
    each product of two float16 values is exact in float32, the factors are powers of two),
    then the terms. Non-fused
    precisions: one product of the augmented layouts (terms inside). Fused ones: the
    split form of the kernel — the d input columns of the stored (rounded) vectors multiplied in
    IEEE float32, then the float32 terms added, columns' first; its rounding stays within the
    kernel's bound, so it is the kernel's reference and its stand-in off the GPU. ``buffer``:
    where to write the block (else a new tensor). ``symmetric``: ``a`` and ``b`` are the query
    and corpus layouts of the same points (a graph part's own block), so that a non-fused
    block is symmetric but for rounding; it is then computed in row bands from
    ``Options.symmetric_min_rows`` rows (:func:`_banded_product`).
    """
    stages.count("screen.product")
    if precision.integers:
        # The terms are inside the integer key (the rows' own int32 squared norms).
        return integer_scores(a, b, buffer)
    if not precision.kernel:
        out = None if buffer is None else buffer.take(a.shape[0], b.shape[0], a.dtype, a.device)
        options = get_options()
        if symmetric and a.shape[0] >= options.symmetric_min_rows and options.symmetric_bands > 1:
            return _banded_product(a, b, out)
        return a @ b.T if out is None else torch.mm(a, b.T, out=out)
    if precision.digits:
        scores = digit_scores(a, b, buffer)
    else:
        after = precision.scaled and precision.exact_products
        if after:
            # Exact products (knng.metrics.with_exact_products): the scales may not be powers of
            # two (a lattice of unit 1/255), so the product of the stored values comes first,
            # exactly, then its two scalings in the kernel's order, each rounded as there.
            k = scaled_width(d)
            a32, b32 = a[:, :k].to(torch.float32), b[:, :k].to(torch.float32)
        elif precision.scaled:
            # The factors α·s_a and s_b go into the operands, not onto the block (two passes over
            # a 10k × 65k sample block cost 7 ms on an H100): scaling by powers of two commutes
            # with every rounding of the product, so the keys are the kernel's (its scaling after
            # the sum), bit for bit, barring float32 underflow (within the bound's flush term).
            k = scaled_width(d)
            a32 = a[:, :k].to(torch.float32).mul_(scaled_row_factors(a)[:, None])
            b32 = b[:, :k].to(torch.float32).mul_(scaled_scales(b)[:, None])
        else:
            a32, b32 = a[:, :d].to(torch.float32), b[:, :d].to(torch.float32)
        out = None if buffer is None else buffer.take(a.shape[0], b.shape[0], torch.float32, a.device)
        if after:
            scores = torch.mm(a32, b32.T, out=out)
            return block_epilogue(scores, (scaled_row_factors(a), scaled_scales(b)), col_terms, row_terms)
        if col_terms is not None and a.device.type == "cuda" and get_options().gemm_column_terms:
            # The column terms in the product's epilogue (see Options.gemm_column_terms above).
            scores = torch.addmm(col_terms, a32, b32.T, out=out)
            col_terms = None
        else:
            scores = torch.mm(a32, b32.T, out=out)
    return block_epilogue(scores, None, col_terms, row_terms)




def digit_scores(a: torch.Tensor, b: torch.Tensor, buffer: ScoreBuffer | None = None) -> torch.Tensor:
    """The digit screen's float32 products (before terms) of prepared digit rows ``[h | l | h | s α]``.

    score = ((B·hh + (h_a·l_b + l_a·h_b))·B + l_a·l_b) · (α·s_a/B²) · s_b, the integer products
    exact and each step below one float32 rounding, the ones ``Metric.bound_coefficients``
    counts for digits: this is the arithmetic a digit kernel must reproduce (or round less).
    """
    w = digit_blocks(a)
    if buffer is None:
        scores = torch.empty((a.shape[0], b.shape[0]), dtype=torch.float32, device=a.device)
    else:
        scores = buffer.take(a.shape[0], b.shape[0], torch.float32, a.device)
    scores.copy_(_integer_products(a[:, :w], b[:, :w]))
    scores.mul_(DIGIT_BASE).add_(_integer_products(a[:, :2 * w], b[:, w:3 * w]))
    scores.mul_(DIGIT_BASE).add_(_integer_products(a[:, w:2 * w], b[:, w:2 * w]))
    scores.mul_(digit_row_factors(a)[:, None]).mul_(digit_scales(b)[None, :])
    return scores


def integer_scores(a: torch.Tensor, b: torch.Tensor, buffer: ScoreBuffer | None = None, *,
                   kernel: bool | None = None) -> torch.Tensor:
    """The integer screen's float32 keys of prepared integer rows ``[v | ‖v‖² | 0…]``
    (``knng.metrics``, precision ``int8``): q_i + r_j − 2·a_iᵀb_j computed exactly in int32 (the
    product's sums, q + r and 2·aᵀb are below 2³¹ for d ≤ ``INTEGER_MAX_D``, and so is the
    squared distance they give), then rounded to float32 once. This is the arithmetic the
    integer kernel does, bit for bit. ``kernel``: whether the block kernel writes the block
    (``knng.engine.kernels.integer_block``; default: where Triton runs); the torch steps here
    are its reference."""
    if kernel is None:
        kernel = triton_runs(a.device)
    if kernel:
        out = None if buffer is None else buffer.take(a.shape[0], b.shape[0], torch.float32, a.device)
        return kernels.integer_block(a, b, out)
    w = integer_blocks(a)
    keys = _integer_products(a[:, :w], b[:, :w], largest=-INTEGER_LOW).to(torch.int32)
    keys.mul_(-2).add_(integer_terms(b)[None, :]).add_(integer_terms(a)[:, None])
    if buffer is None:
        return keys.to(torch.float32)
    out = buffer.take(a.shape[0], b.shape[0], torch.float32, a.device)
    return out.copy_(keys)


#: Whether ``torch._int_mm`` ran on this kind of device (a failure falls back to float64 products,
#: once per process and device type).
_INT_MM_WORKS: dict[str, bool] = {}


def _integer_products(a: torch.Tensor, b: torch.Tensor, largest: int = DIGIT_MAX) -> torch.Tensor:
    """``a · bᵀ`` of int8 matrices whose values are at most ``largest`` in magnitude, exactly:
    int32 from ``torch._int_mm`` (oneDNN on a CPU, cuBLASLt on a GPU), or float64 products of
    the digits where it cannot run (small or unaligned GPU blocks, builds without it, sums that
    could pass 2³¹): every partial sum is an integer below 2⁵³."""
    kind = a.device.type
    fits = kind == "cpu" or (a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[0] % 8 == 0)
    fits = fits and a.shape[1] * largest**2 < 2**31  # int32 sums cannot wrap
    if fits and _INT_MM_WORKS.get(kind, True):
        try:
            # A GPU's int8 product is given plain row-major operands (the digit blocks are
            # column slices of wider rows); oneDNN takes the strided views as they are.
            return torch._int_mm(a, b.T) if kind == "cpu" else torch._int_mm(a.contiguous(), b.T.contiguous())
        except RuntimeError as exc:  # an int8 product this build or device does not offer
            if "out of memory" in str(exc).lower():
                raise
            _INT_MM_WORKS[kind] = False
    return a.to(torch.float64) @ b.to(torch.float64).T




def strip_minima(a: torch.Tensor, b: torch.Tensor, d: int, precision: ScreenPrecision, *,
                 row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's smallest key in every strip of ``kernels.strip_width()`` consecutive columns of the block
    ``a · bᵀ`` (:func:`block_scores`' keys), and its column.

    Any k of them bound a row's k-th smallest key from above, which is what seeds need, and
    2k strips or more give k distinct columns near the row's k smallest. The CUDA kernel finds
    them without writing the block (:func:`knng.engine.kernels.fused.strip_minima`, where
    :func:`~knng.engine.kernels.runs.strip_minima_runs`); elsewhere the block is materialised and
    reduced (:func:`strip_minima_of`, the kernel's reference). Returns float32-or-wider keys
    (m, ⌈n / strip⌉) and int64 columns, ``strip`` the kernel's (``kernels.strip_width()``).
    """
    if strip_minima_runs(a.device, precision):
        keys, cols = kernels.strip_minima(a, b, d, row_terms, col_terms, precision.name)
        return keys, cols.long()
    return strip_minima_of(block_scores(a, b, d, precision, row_terms, col_terms))




def strip_minima_of(scores: torch.Tensor, strip: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`strip_minima` of a materialised block: per row and strip of ``strip`` columns the
    smallest value (NaN counted as +inf; ties to the smaller column) and its column (``strip``:
    default the kernel's)."""
    strip = strip_width() if strip is None else strip
    m, n = scores.shape
    strips = -(-n // strip)
    keys = torch.full((m, strips * strip), torch.inf, dtype=scores.dtype, device=scores.device)
    keys[:, :n] = torch.nan_to_num(scores, nan=torch.inf, posinf=torch.inf, neginf=-torch.inf)
    values, at = keys.view(m, strips, strip).min(dim=2)  # the first of equal minima
    return values, at + strip * torch.arange(strips, device=scores.device)




def tile_minima(a: torch.Tensor, b: torch.Tensor, d: int, precision: ScreenPrecision, *,
                row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's smallest key in every tile of ``kernels.TILE`` consecutive columns of the block
    ``a · bᵀ`` (:func:`block_scores`' keys; NaN counted as +inf), (m, ⌈n / TILE⌉).

    The k-th smallest of a row's tile minima bounds its k-th smallest key from above (k
    distinct columns), and a tile whose minimum is above the row's screen threshold holds no
    pair the screen keeps (:func:`screen_tiles`). The wgmma kernel finds them without writing
    the block (``kernels.gathered_runs``); elsewhere (its reference) the block is materialised.
    """
    if gathered_runs(a.device, precision, d):
        return kernels.tile_minima(a, b, d, row_terms, col_terms, precision.name)
    return strip_minima_of(block_scores(a, b, d, precision, row_terms, col_terms), TILE)[0]


def screen_tiles(a: torch.Tensor, b: torch.Tensor, d: int, tile_keys: torch.Tensor, thresholds: torch.Tensor,
                 precision: ScreenPrecision, *, row_terms: torch.Tensor | None = None,
                 col_terms: torch.Tensor | None = None, capacity_hint: int | None = None) -> Survivors:
    """:func:`screen_rows` of the block ``a · bᵀ`` in only the tiles of ``kernels.TILE`` columns
    whose smallest key (``tile_keys``, :func:`tile_minima` of the same block) is within the
    row's threshold; the other tiles are not computed.

    Exact whatever either computation rounded: a screen's threshold is τ plus an error radius
    valid for every pair of the block, so a pair whose true key is within τ has a screened key
    within the threshold in any screen, and so has its tile's minimum. A graph of 200k points by
    rows at k = 100 screens about 123 of a row's 1,563 tiles this way.

    The wgmma kernel gathers each tile's rows (``fused.screen_tiles``, where
    ``kernels.gathered_runs``; ``capacity_hint``: the survivors expected); elsewhere (its
    reference) the block is computed whole and the pairs of the other tiles dropped.
    """
    if gathered_runs(a.device, precision, d):
        thr32 = _round_up(thresholds.to(torch.float32), thresholds)
        return kernels.screen_tiles(a, b, d, tile_keys.to(torch.float32), thr32, row_terms, col_terms, precision.name,
                                  capacity_hint)
    found = row_survivors(block_scores(a, b, d, precision, row_terms, col_terms), thresholds)
    named = tile_keys[found.owner, found.other // TILE] <= thresholds[found.owner]
    return Survivors(found.owner[named], found.other[named], found.keys[named])


def screen_rows(a: torch.Tensor, b: torch.Tensor, d: int, thresholds: torch.Tensor, precision: ScreenPrecision, *,
                row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None,
                exclude_diagonal: int | None = None, buffer: ScoreBuffer | None = None) -> Survivors:
    """Pairs of the block ``a · bᵀ`` kept by their row's (float64) threshold.

    ``exclude_diagonal``: drop the entries ``(t, t − exclude_diagonal)`` (a point and itself).
    ``row_terms``/``col_terms`` are the float32 terms of the split form (fused precisions);
    ``buffer``: where a materialised block is written.
    """
    if screen_kernel_runs(a.device, precision):
        return _kernel_rows(a, b, d, thresholds, precision, row_terms, col_terms, exclude_diagonal)
    scores = block_scores(a, b, d, precision, row_terms, col_terms, buffer)
    if exclude_diagonal is not None:
        t = torch.arange(scores.shape[0], device=scores.device)
        c = t - exclude_diagonal
        ok = (c >= 0) & (c < scores.shape[1])
        scores[t[ok], c[ok]] = torch.inf
    return row_survivors(scores, thresholds)


def screen_rows_later(a: torch.Tensor, b: torch.Tensor, d: int, thresholds: torch.Tensor,
                      precision: ScreenPrecision, *, row_terms: torch.Tensor | None = None,
                      col_terms: torch.Tensor | None = None,
                      exclude_diagonal: int | None = None) -> Callable[[], Survivors]:
    """:func:`screen_rows` whose survivors are read when the returned function is called.

    A kernel screen is launched now and its lists sized then (``fused.screen_block``'s
    ``later``), so that several blocks' launches queue back to back and one synchronisation
    sizes them all; elsewhere the screen runs now. Nothing the block reads (``a``, ``b``,
    ``thresholds``, the terms) may change before the call: a list that overflowed is filled by
    a second launch then.
    """
    if screen_kernel_runs(a.device, precision):
        return _kernel_rows(a, b, d, thresholds, precision, row_terms, col_terms, exclude_diagonal, later=True)
    found = screen_rows(a, b, d, thresholds, precision, row_terms=row_terms, col_terms=col_terms,
                        exclude_diagonal=exclude_diagonal)
    return lambda: found


def screen_own_later(a: torch.Tensor, b: torch.Tensor, d: int, thresholds: torch.Tensor,
                     precision: ScreenPrecision, *, terms: torch.Tensor | None = None,
                     exclude_diagonal: bool = False) -> Callable[[], Survivors]:
    """The pairs of a square block ``a · bᵀ`` of one set of points (``a`` its rows as queries,
    ``b`` the same points as columns, in the same order; ``terms`` both sides' float32 terms)
    kept by their row's threshold, read when the returned function is called (as
    :func:`screen_rows_later`). ``exclude_diagonal``: not a point with itself.

    Where the wgmma kernel runs (:func:`knng.engine.kernels.runs.triangle_runs`) only the upper triangle
    is screened, each pair i ≤ j once as entry (i, j) against both points' thresholds: half the
    products of a rows screen of the whole block, which scores each pair twice. Pair (j, i) then
    carries entry (i, j)'s key, which is as valid a screened key of it (the same bound covers
    both); :func:`own_block_survivors` is this contract's reference. Elsewhere the whole block
    is screened by rows.
    """
    if screen_kernel_runs(a.device, precision) and triangle_runs(a.device, precision, d):
        thr = _round_up(thresholds.to(torch.float32), thresholds)
        found = screen_block(a, b, d, thr, thr, terms, terms, precision.name,
                                   exclude_diagonal=0 if exclude_diagonal else None, later=True, triangle=True)

        def union() -> Survivors:
            by_row, by_col = found()
            assert by_col is not None
            return Survivors(torch.cat([by_row.owner, by_col.owner]), torch.cat([by_row.other, by_col.other]),
                             torch.cat([by_row.keys, by_col.keys]))

        return union
    return screen_rows_later(a, b, d, thresholds, precision, row_terms=terms, col_terms=terms,
                             exclude_diagonal=0 if exclude_diagonal else None)


def own_block_survivors(scores: torch.Tensor, thresholds: torch.Tensor, exclude_diagonal: bool = False
                        ) -> Survivors:
    """The reference of :func:`screen_own_later`'s triangle: the square block ``scores`` read
    from its upper triangle only (entry (j, i) below the diagonal replaced by (i, j)), each row
    then kept against its threshold (not the diagonal, with ``exclude_diagonal``)."""
    n = scores.shape[0]
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=scores.device))
    found = row_survivors(torch.where(upper, scores, scores.T), thresholds)
    if not exclude_diagonal:
        return found
    keep = found.owner != found.other
    return Survivors(found.owner[keep], found.other[keep], found.keys[keep])


def screen_pairs_later(a: torch.Tensor, b: torch.Tensor, d: int, row_thresholds: torch.Tensor,
                       col_thresholds: torch.Tensor, precision: ScreenPrecision, *,
                       row_terms: torch.Tensor | None = None,
                       col_terms: torch.Tensor | None = None) -> Callable[[], tuple[Survivors, Survivors]]:
    """:func:`screen_pairs` whose survivors are read when the returned function is called (see
    :func:`screen_rows_later`: a kernel screen launched now, sized then; elsewhere run now)."""
    if screen_kernel_runs(a.device, precision):
        return _kernel_pairs(a, b, d, row_thresholds, col_thresholds, precision, row_terms, col_terms, later=True)
    found = screen_pairs(a, b, d, row_thresholds, col_thresholds, precision, row_terms=row_terms,
                         col_terms=col_terms)
    return lambda: found


def pair_scores(a: torch.Tensor, b: torch.Tensor, d: int, precision: ScreenPrecision, *,
                row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None,
                buffer: ScoreBuffer | None = None) -> torch.Tensor | None:
    """The block :func:`screen_pairs` would materialise (its ``scores``), or None where the fused
    kernel screens it without one."""
    if screen_kernel_runs(a.device, precision):
        return None
    return block_scores(a, b, d, precision, row_terms, col_terms, buffer)


def screen_pairs(a: torch.Tensor, b: torch.Tensor, d: int,
                 row_thresholds: "torch.Tensor | Callable[[], tuple[torch.Tensor, torch.Tensor]]",
                 col_thresholds: torch.Tensor | None, precision: ScreenPrecision, *,
                 row_terms: torch.Tensor | None = None, col_terms: torch.Tensor | None = None,
                 buffer: ScoreBuffer | None = None, scores: torch.Tensor | None = None
                 ) -> tuple[Survivors, Survivors]:
    """Both sides of a symmetric block ``a · bᵀ``: pairs kept by their row, and by their column.

    ``row_thresholds`` may be a function returning both sides' thresholds (``col_thresholds``
    None): a materialised block's product is then issued first, and on a GPU the thresholds'
    few dozen small launches queue behind it instead of keeping the GPU idle before it.
    ``buffer``: where a materialised block is written; ``scores``: the block from
    :func:`pair_scores`, if already issued."""
    if screen_kernel_runs(a.device, precision):
        if callable(row_thresholds):
            row_thresholds, col_thresholds = row_thresholds()
        assert col_thresholds is not None
        return _kernel_pairs(a, b, d, row_thresholds, col_thresholds, precision, row_terms, col_terms)
    if scores is None:
        scores = block_scores(a, b, d, precision, row_terms, col_terms, buffer)
    if callable(row_thresholds):
        row_thresholds, col_thresholds = row_thresholds()
    assert col_thresholds is not None
    by_row, by_col = block_survivors(scores, row_thresholds, col_thresholds)
    assert by_col is not None
    return by_row, by_col


def _kernel_rows(a: torch.Tensor, b: torch.Tensor, d: int, thresholds: torch.Tensor, precision: ScreenPrecision,
                 row_terms: torch.Tensor | None, col_terms: torch.Tensor | None, exclude_diagonal: int | None,
                 later: bool = False):
    """The kernel's screen of rows (:func:`screen_rows`): float32 thresholds rounded up, so that
    the kernel keeps every pair the float64 ones keep; with ``later`` a function that sizes the
    lists when called (``fused.screen_block``)."""
    found = screen_block(a, b, d, _round_up(thresholds.to(torch.float32), thresholds), None, row_terms,
                               col_terms, precision.name, exclude_diagonal=exclude_diagonal, later=later)
    return (lambda: found()[0]) if later else found[0]


def _kernel_pairs(a: torch.Tensor, b: torch.Tensor, d: int, row_thresholds: torch.Tensor,
                  col_thresholds: torch.Tensor, precision: ScreenPrecision, row_terms: torch.Tensor | None,
                  col_terms: torch.Tensor | None, later: bool = False):
    """The kernel's screen of a symmetric block (:func:`screen_pairs`), as :func:`_kernel_rows`."""
    found = screen_block(a, b, d, _round_up(row_thresholds.to(torch.float32), row_thresholds),
                               _round_up(col_thresholds.to(torch.float32), col_thresholds), row_terms, col_terms,
                               precision.name, later=later)

    def both() -> tuple[Survivors, Survivors]:
        by_row, by_col = found() if later else found
        assert by_col is not None
        return by_row, by_col

    return both if later else both()


def _round_up(rounded: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``rounded`` nudged up one step wherever the rounding went below ``exact``."""
    if rounded.dtype == exact.dtype:
        return rounded
    below = rounded.to(exact.dtype) < exact
    return torch.where(below, torch.nextafter(rounded, torch.full_like(rounded, torch.inf)), rounded)

