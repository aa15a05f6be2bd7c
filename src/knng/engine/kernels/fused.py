"""The fused screen kernel (Triton): product tile, threshold test and compact survivors in one pass.

One program computes a tile S̃[I, J] = A[I] · B[J]ᵀ on the tensor cores (bfloat16, float16, TF32,
split TF32 "tf32x3", or IEEE float32 inputs; float32 accumulation), adds the per-vector terms
in float32 (so that ‖b‖² never passes through a low-precision input), and compares every entry
with its row's threshold — and, in a symmetric graph block, with its column's. Each side's
survivors go to a compact list of their own (owner, other, key); the score block is never
written to memory. Most tiles keep nothing once the thresholds are tight, and those that keep
something mostly keep a few: the compaction (``triton_screen._append``) takes a few out one
by one and many with one atomic each, and costs nothing in a tile that keeps nothing.

Contract (what :func:`screen_block` returns, checked against the CPU reference
:func:`knng.engine.screen.block_scores`): every pair whose key s̃ᵢⱼ ≤ tᵢ (or, symmetric,
s̃ᵢⱼ ≤ tⱼ) with s̃ the float32 key of the kernel's own product, at most ``E`` (the bound of the
plan's precision, ``docs/EXACTNESS.md``) from the exact score. The order of a list is not
defined (tiles append as they finish). :func:`select_block` is the same test and lists on a
score block already in memory (the float32 and float64 screens, whose products are cuBLAS's).

Scaled float16 rows (precision ``float16``) run the CUDA C kernel of
:mod:`knng.engine.kernels.cuda_screen` where CuPy is installed (same contract, survivors appended by warp
votes into shared buffers, A's rows resident: 10,000 × 1M × 128 in 7.6 ms where this module's
take 20), and this module's kernel, multiplying by the rows' factors after the product, elsewhere.

The digit screen (``int8x4``, :data:`DIGIT_PRECISIONS`) has a kernel of its own with the same
test and lists: rows of int8 digits, four exact integer products, then the float32 steps of its
reference :func:`knng.engine.screen.digit_scores` (``docs/EXACTNESS.md``).

Triton is imported lazily: the module imports on machines without it, and
``knng.engine.kernels.capabilities.triton_runs`` says whether the kernel can run. Under ``TRITON_INTERPRET=1`` the same
kernel runs on CPU tensors (the CI tests do that; bfloat16 products are not trustworthy there).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from knng._options import get_options
from knng.engine import stages
from knng.engine.kernels import cuda_screen
from knng.engine.kernels.capabilities import ieee_options, interpreting, triton_runs
from knng.engine.kernels.runs import TILE, cuda_screen_runs, gathered_runs, strip_minima_runs, triangle_runs
from knng.metrics import (
    digit_blocks, digit_row_factors, digit_scales, get_precision, integer_blocks, integer_terms, scaled_row_factors,
    scaled_scales, scaled_width,
)

__all__ = ["screen_block", "select_block", "strip_minima", "Survivors", "DOT_PRECISION", "SELECT_TILE",
           "tile_minima", "screen_tiles", "group_tile_pairs", "block_epilogue", "integer_block"]

#: Triton's ``input_precision`` for each screen precision with float32 storage; the
#: 16-bit precisions store their inputs in that type and need none.
DOT_PRECISION = {"float32": "ieee", "tf32": "tf32", "tf32x3": "tf32x3", "bfloat16": "ieee", "float16": "ieee"}

#: Most entries one survivor list holds: slots are int32 in the kernel (and the counter could
#: wrap past 2³¹); a block that keeps more is reported as out of memory, so the engine retries
#: it in smaller pieces.
MAX_LIST = 2**31 - 2**24

# Scaled float16 screens run the CUDA C kernel of :mod:`knng.engine.kernels.cuda_screen` (mma.sync or
# wgmma tensor-core tiles, survivors appended by warp votes) where CuPy can compile it and
# ``Options.cuda_screen`` is on, and the Triton kernel elsewhere; both keep what the same bound
# says (``tests/engine/test_gpu_fused.py``).

#: Survivor-list entries allocated per launch before the first overflow retry, per row of A.
INITIAL_PER_ROW = 64

#: Entries a list has at least on a GPU (12 bytes each: 200 MB): a list that overflows runs
#: the whole kernel again, and a search's first tiles keep many pairs (k = 100 and 1,024 on
#: 1M × 128, 10k queries: two relaunches a call with lists sized from the last launch).
LIST_FLOOR = 2**24

#: Tile of :func:`select_block`, measured on an H100 (2026-11-23) on a 16,384² float32 block
#: keeping about 3,300 / 320,000 pairs, slots by per-row scans: 16 × 128, 4 warps 0.59 / 1.48 ms;
#: 32 × 128 0.71 / 1.72; 64 × 128 0.71 / 2.00; 16 × 256 0.79 / 2.16; 32 × 128 with one scan of
#: the flattened tile 0.79 / 2.16 (torch's compare and ``nonzero``: 2.31 / 2.33 ms; reading the
#: block alone, 0.36 ms).
SELECT_TILE = dict(BLOCK_M=16, BLOCK_N=128, num_warps=4)






class Survivors(NamedTuple):
    """Pairs kept by one side of a block: positions in the block and their screened keys.

    ``owner`` are the block positions of the rows (or, for the column side of a symmetric
    block, the columns) whose threshold admitted the pair, ``other`` the positions on the other
    axis; ``keys`` the screened scores. int64 positions.
    """

    owner: torch.Tensor
    other: torch.Tensor
    keys: torch.Tensor










def _triton():
    """This module's Triton kernels (:mod:`knng.engine.kernels.triton_screen`), imported on first
    use (Triton must be installed)."""
    from knng.engine.kernels import triton_screen

    return triton_screen


@functools.lru_cache(maxsize=None)
def _kernel(interpret: bool):
    """The jitted kernels (screen, select, digit), imported on first use: Triton reads
    ``TRITON_INTERPRET`` when it jits, so the interpreter is chosen before the first call."""
    triton_screen = _triton()
    return triton_screen.screen_kernel, triton_screen.select_kernel, triton_screen.digit_kernel, \
        triton_screen.integer_kernel, triton_screen.integer_block_kernel


def _tile_config(precision: str, interpret: bool) -> dict:
    """Tile shapes, measured on an H100 (``bench/bench_fused.py --part kernel``, 2026-11-22).

    bfloat16: 128 × 128 tiles, K steps of 64, 3 stages (163 TFLOP/s at d = 128, 408 at d = 960
    with no survivors). 128 × 256 tiles were 10 % faster with no survivors but 5–10× slower in
    tiles that keep something (14 kept per row of 1M columns: 160 ms instead of 15; the
    compaction's registers spill). Float32 storage (TF32, tf32x3): 128 × 128, K steps of 32.
    Appending survivors with one atomic per kept entry instead of one per tile ran 2–5× slower
    (predicated atomics cost even where nothing is kept).
    """
    if interpret:
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=4, num_warps=4, num_stages=1)
    if precision in ("bfloat16", "float16"):
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)


def _launch_shape(config: dict, m: int, n: int, interpret: bool) -> tuple[dict, tuple[int], dict]:
    """A product kernel's tile constants, its grid over an m × n block and the launch options
    (none in the interpreter) from a tile configuration."""
    cfg = dict(config)
    num_warps, num_stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    grid = (-(-m // cfg["BLOCK_M"]) * -(-n // cfg["BLOCK_N"]),)
    return cfg, grid, {} if interpret else dict(num_warps=num_warps, num_stages=num_stages)




def screen_block(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_thr: torch.Tensor,
                 col_thr: torch.Tensor | None, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None,
                 precision: str, exclude_diagonal: int | None = None,
                 capacity_hint: int | None = None, later: bool = False, triangle: bool = False):
    """Survivors of the block ``A[:, :k_dims] · B[:, :k_dims]ᵀ (+ terms)`` against the thresholds.

    Parameters
    ----------
    a, b : torch.Tensor
        (m, ≥k_dims) and (n, ≥k_dims) prepared vectors (rows contiguous), float32 or the
        precision's 16-bit type; A carries the metric's scale α.
    k_dims : int
        Columns of the product (the input dimension d; the layout's term columns are skipped).
    row_thr, col_thr : torch.Tensor
        float32 thresholds on the float32 key, per row of A and (symmetric blocks) per row of B.
    row_terms, col_terms : torch.Tensor or None
        float32 terms added to each row / column of the product.
    precision : str
        A key of :data:`DOT_PRECISION`.
    exclude_diagonal : int or None
        Drop entries with ``row == col + exclude_diagonal`` (a point and itself).
    capacity_hint : int or None
        Expected survivors per side; the lists grow (one relaunch) when a block keeps more.
    later : bool
        Return a function that gives the result when called (its lists sized then, see
        ``_collect``); nothing the block reads may change until then.
    triangle : bool
        A symmetric square block of one set of points (rows and columns the same, in the same
        order): only its upper triangle, each pair i ≤ j scored once as entry (i, j) and tested
        against both thresholds; where :func:`triangle_runs` only.

    Returns
    -------
    by_row, by_col : Survivors, Survivors or None
        The pairs kept by their row, as (row, column, key), and in a symmetric block (with
        ``col_thr``) those kept by their column, as (column, row, key); a pair kept by both
        is in both lists.
    """
    stages.count("screen.kernel")
    if triangle and not triangle_runs(a.device, precision, k_dims):
        raise ValueError("screen_block: a triangle needs the wgmma kernel (see triangle_runs)")
    if precision in DIGIT_PRECISIONS:
        result = _screen_digits(a, b, row_thr, col_thr, row_terms, col_terms, exclude_diagonal, capacity_hint)
        return (lambda: result) if later else result
    if precision in INTEGER_PRECISIONS:
        return _screen_integers(a, b, row_thr, col_thr, exclude_diagonal, capacity_hint, later)
    interpret = interpreting()
    m, n = a.shape[0], b.shape[0]
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("screen_block needs rows stored contiguously")
    symmetric = col_thr is not None
    dummy = row_thr
    scaled = get_precision(precision).scaled
    if scaled:
        # Scaled float16 rows: the product of the zero-padded value blocks, then × α·s_a × s_b.
        k_dims = scaled_width(k_dims)
        row_factor, col_scale = scaled_row_factors(a), scaled_scales(b).contiguous()
        if cuda_screen_runs(a.device):
            def launch_cuda(lists, counters, capacity):
                cuda_screen.launch_screen(a, b, k_dims, row_factor, col_scale, row_terms, col_terms, row_thr, col_thr,
                                          exclude_diagonal, lists, counters, capacity, triangle=triangle)

            return _collect(launch_cuda, "screen", m, n, capacity_hint, symmetric, torch.float32, a.device, later)
    else:
        row_factor = col_scale = dummy
    kernel = _kernel(interpret)[0]
    cfg, grid, extra = _launch_shape(_tile_config(precision, interpret), m, n, interpret)

    def launch(lists, counters, capacity):
        kernel[grid](
            a, b, row_factor, col_scale, row_terms if row_terms is not None else dummy,
            col_terms if col_terms is not None else dummy, row_thr, col_thr if symmetric else dummy,
            *lists[0], *lists[-1], counters, m, n, k_dims, a.stride(0), b.stride(0), capacity,
            0 if exclude_diagonal is None else exclude_diagonal,
            HAS_ROW_TERMS=row_terms is not None, HAS_COL_TERMS=col_terms is not None, SYMMETRIC=symmetric,
            EXCLUDE_DIAG=exclude_diagonal is not None, SCALED=scaled, PRECISION=DOT_PRECISION[precision],
            FEW=get_options().few_per_tile, **cfg, **extra,
        )

    return _collect(launch, "screen", m, n, capacity_hint, symmetric, torch.float32, a.device, later)








def strip_minima(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_terms: torch.Tensor | None,
                 col_terms: torch.Tensor | None, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's smallest key in every strip of :data:`STRIP` consecutive columns of the block
    ``A[:, :k_dims] · B[:, :k_dims]ᵀ (+ terms)``, the keys :func:`screen_block` compares, and
    its column (int32); ties to the smaller column, NaN never the smallest. Where
    :func:`strip_minima_runs` says; ``knng.engine.screen.strip_minima`` is the reference."""
    if not strip_minima_runs(a.device, precision):
        raise ValueError(f"strip minima run on the CUDA kernel only (precision {precision!r}, {a.device})")
    return cuda_screen.launch_strip_minima(a, b, scaled_width(k_dims), scaled_row_factors(a),
                                           scaled_scales(b).contiguous(), row_terms, col_terms)


#: Rows of A a work item of :func:`screen_tiles` gathers for its tile (the kernel's block).
GATHER_ROWS = 128




def tile_minima(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_terms: torch.Tensor | None,
                col_terms: torch.Tensor | None, precision: str) -> torch.Tensor:
    """Each row's smallest key in every tile of :data:`TILE` consecutive columns of the block
    ``A[:, :k_dims] · B[:, :k_dims]ᵀ (+ terms)``, the keys :func:`screen_block` compares (NaN
    never the smallest), float32 (m, ⌈n / TILE⌉). Where :func:`gathered_runs` says;
    ``knng.engine.screen.tile_minima`` is the reference."""
    if not gathered_runs(a.device, precision, k_dims):
        raise ValueError(f"tile minima run on the wgmma kernel only (precision {precision!r}, {a.device})")
    return cuda_screen.launch_tile_minima(a, b, scaled_width(k_dims), scaled_row_factors(a),
                                          scaled_scales(b).contiguous(), row_terms, col_terms)


#: Rows a program of the grouping kernel (``triton_screen.tile_pairs_kernel``) takes, and tiles.
GROUP_BLOCK = dict(ROWS=64, TILES=64)


def group_tile_pairs(tile_keys: torch.Tensor, row_thr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (row, tile) pairs with ``tile_keys[row, tile] <= row_thr[row]`` (float32; NaN: none),
    grouped by tile: ``rows`` (int32; its first ``counts.sum()`` entries hold, for each tile in
    turn, its pairs' rows in no particular order), ``counts`` and ``first`` (int32 per tile: its
    pairs, and where they start in ``rows``). Two passes of ``triton_screen.tile_pairs_kernel``
    (counts, then each row at its tile's cursor); nothing is read back."""
    device, (m, width) = tile_keys.device, tile_keys.shape
    if m * width >= 2**31:
        raise ValueError(f"group_tile_pairs: {m} rows of {width} tiles; int32 positions take fewer than 2³¹ pairs")
    tile_keys, row_thr = tile_keys.contiguous(), row_thr.contiguous()
    counts = torch.zeros(width, dtype=torch.int32, device=device)
    rows = torch.empty(max(1, m * width), dtype=torch.int32, device=device)  # at most every pair
    if m == 0 or width == 0:
        return rows, counts, counts.clone()
    block = dict(ROWS=16, TILES=16) if interpreting() else GROUP_BLOCK
    grid = (-(-m // block["ROWS"]), -(-width // block["TILES"]))
    group = _triton().tile_pairs_kernel
    group[grid](tile_keys, row_thr, m, width, tile_keys.stride(0), counts, counts, rows, SCATTER=False, **block)
    first = torch.cumsum(counts, 0, dtype=torch.int32) - counts
    group[grid](tile_keys, row_thr, m, width, tile_keys.stride(0), counts, first.clone(), rows, SCATTER=True, **block)
    return rows, counts, first


def screen_tiles(a: torch.Tensor, b: torch.Tensor, k_dims: int, tile_keys: torch.Tensor, row_thr: torch.Tensor,
                 row_terms: torch.Tensor | None, col_terms: torch.Tensor | None, precision: str,
                 capacity_hint: int | None = None) -> Survivors:
    """Survivors of :func:`screen_block`'s keys and row test in the tiles of :data:`TILE`
    consecutive columns of B whose ``tile_keys`` (m × ⌈n / TILE⌉, float32) are within the row's
    threshold ``row_thr`` (float32; NaN: none); the other tiles are not computed. Returns (row,
    column, key) as :func:`screen_block`'s by_row list. Where :func:`gathered_runs` says.

    The pairs (row, tile) are grouped by tile in two passes of a Triton kernel (counts, then
    each row at its tile's cursor), then persistent blocks of the wgmma kernel take work items
    of one tile and up to :data:`GATHER_ROWS` of its rows, gathered
    (``cuda_screen.launch_gathered_screen``): nothing is read back before the one
    synchronisation that sizes the list."""
    if not gathered_runs(a.device, precision, k_dims):
        raise ValueError(f"the gathered screen runs on the wgmma kernel only (precision {precision!r}, {a.device})")
    device, (m, width) = a.device, tile_keys.shape
    if width != -(-b.shape[0] // TILE) or m != a.shape[0]:
        raise ValueError(f"tile keys of shape {tuple(tile_keys.shape)} for a block of {a.shape[0]} × {b.shape[0]}")
    if m == 0 or width == 0:
        none = torch.empty(0, dtype=torch.int64, device=device)
        return Survivors(none, none.clone(), torch.empty(0, dtype=torch.float32, device=device))
    rows, counts, first = group_tile_pairs(tile_keys, row_thr)
    ends = torch.cumsum(-(-counts // GATHER_ROWS), 0, dtype=torch.int32)
    tile_index = torch.cat([counts, first, ends])
    # Each possible work item's tile (items past the last are ignored by the kernel).
    most = -(-m * width // GATHER_ROWS) + width
    item_tile = torch.searchsorted(ends, torch.arange(most, device=device, dtype=torch.int32), right=True)
    item_tile = item_tile.clamp_(max=width - 1).to(torch.int32)
    k_dims = scaled_width(k_dims)
    row_factor, col_scale = scaled_row_factors(a), scaled_scales(b).contiguous()

    def launch(lists, counters, capacity):
        cuda_screen.launch_gathered_screen(a, b, k_dims, row_factor, col_scale, row_terms, col_terms, row_thr,
                                           rows, item_tile, tile_index, lists, counters, capacity)

    return _collect(launch, "gathered", m, b.shape[0], capacity_hint, False, torch.float32, device)[0]


#: Screen precisions whose rows are int8 digits (``knng.metrics``, the digit layout): the digit kernel.
DIGIT_PRECISIONS = frozenset({"int8x4"})


def _digit_tile_config(interpret: bool) -> dict:
    """Tiles of the digit kernel, measured on an H100 (``bench/digit_kernel_tiles.py``,
    2026-11-23, 10,000 × 1M × 128, nothing kept; TF32 kernel 23.8 ms): 64 × 128 × 64, 4 warps,
    4 stages 28.7 ms; 128 × 128 × 64 (8 warps, 3 stages) 30.9; 128 × 128 × 128 33.0; 64 × 64 ×
    128 35.5; 128 × 64 × 64 37.1; 128 × 256 × 64 175 (three int32 accumulators)."""
    if interpret:
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=4, num_warps=4, num_stages=1)
    return dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)


def _screen_digits(a: torch.Tensor, b: torch.Tensor, row_thr: torch.Tensor, col_thr: torch.Tensor | None,
                   row_terms: torch.Tensor | None, col_terms: torch.Tensor | None, exclude_diagonal: int | None,
                   capacity_hint: int | None) -> tuple[Survivors, Survivors | None]:
    """:func:`screen_block` for digit rows ``[h | l | h | s α]``: the digit kernel, whose float32
    steps are :func:`knng.engine.screen.digit_scores`' (its reference)."""
    stages.count("screen.digits")
    interpret = interpreting()
    kernel = _kernel(interpret)[2]
    m, n = a.shape[0], b.shape[0]
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("screen_block needs rows stored contiguously")
    # The per-row factor α·s/B² and the column scales, as the reference rounds them (float32).
    row_factor = digit_row_factors(a)
    col_scale = digit_scales(b).contiguous()
    cfg, grid, extra = _launch_shape(_digit_tile_config(interpret), m, n, interpret)
    symmetric = col_thr is not None
    dummy = row_thr

    def launch(lists, counters, capacity):
        kernel[grid](
            a, b, row_factor, col_scale, row_terms if row_terms is not None else dummy,
            col_terms if col_terms is not None else dummy, row_thr, col_thr if symmetric else dummy,
            *lists[0], *lists[-1], counters, m, n, digit_blocks(a), a.stride(0), b.stride(0), capacity,
            0 if exclude_diagonal is None else exclude_diagonal,
            HAS_ROW_TERMS=row_terms is not None, HAS_COL_TERMS=col_terms is not None, SYMMETRIC=symmetric,
            EXCLUDE_DIAG=exclude_diagonal is not None, FEW=get_options().few_per_tile, **cfg, **extra,
        )

    return _collect(launch, "digits", m, n, capacity_hint, symmetric, torch.float32, a.device)


#: Screen precisions of integer rows (``knng.metrics``, the integer layout): the integer kernel.
INTEGER_PRECISIONS = frozenset({"int8"})


def _integer_tile_config(interpret: bool) -> dict:
    """Tiles of the integer kernel: int8 operands, so K steps of 128 bytes as float16's 64."""
    if interpret:
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1)
    return dict(INTEGER_TILE)


#: The integer kernel's tiles on a GPU (``_integer_tile_config``).
INTEGER_TILE = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)


def _screen_integers(a: torch.Tensor, b: torch.Tensor, row_thr: torch.Tensor, col_thr: torch.Tensor | None,
                     exclude_diagonal: int | None, capacity_hint: int | None, later: bool):
    """:func:`screen_block` for integer rows ``[v | ‖v‖² | 0…]``: the integer kernel, whose keys
    are :func:`knng.engine.screen.integer_scores`' bit for bit (the terms are the rows' own)."""
    stages.count("screen.integers")
    interpret = interpreting()
    kernel = _kernel(interpret)[3]
    m, n = a.shape[0], b.shape[0]
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("screen_block needs rows stored contiguously")
    row_terms, col_terms = integer_terms(a), integer_terms(b)
    cfg, grid, extra = _launch_shape(_integer_tile_config(interpret), m, n, interpret)
    symmetric = col_thr is not None
    dummy = row_thr

    def launch(lists, counters, capacity):
        kernel[grid](
            a, b, row_terms, col_terms, row_thr, col_thr if symmetric else dummy,
            *lists[0], *lists[-1], counters, m, n, integer_blocks(a), a.stride(0), b.stride(0), capacity,
            0 if exclude_diagonal is None else exclude_diagonal,
            SYMMETRIC=symmetric, EXCLUDE_DIAG=exclude_diagonal is not None, FEW=get_options().few_per_tile,
            **cfg, **extra,
        )

    return _collect(launch, "integers", m, n, capacity_hint, symmetric, torch.float32, a.device, later)


def integer_block(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 keys of every pair of prepared integer rows ``a`` × ``b``, as a block (m, n):
    the integer kernel's keys, bit for bit, written instead of tested (a graph part's seeds).
    ``knng.engine.screen.integer_scores`` is the reference; cuBLASLt's int8 product took 55 ms
    for a part's 32,768-row seed block of photon images where a Triton tile runs near the int8
    tensor cores' peak. ``out``: a float32 block of unit column stride to write."""
    stages.count("screen.integer_block")
    interpret = interpreting()
    m, n = a.shape[0], b.shape[0]
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("integer_block needs rows stored contiguously")
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=a.device)
    if m and n:
        cfg, grid, extra = _launch_shape(_integer_tile_config(interpret), m, n, interpret)
        _kernel(interpret)[4][grid](a, b, integer_terms(a), integer_terms(b), out, m, n, integer_blocks(a),
                                    a.stride(0), b.stride(0), out.stride(0), **cfg, **extra)
    return out


def select_block(scores: torch.Tensor, row_thr: torch.Tensor, col_thr: torch.Tensor | None,
                 capacity_hint: int | None = None) -> tuple[Survivors, Survivors | None]:
    """Survivors of a score block already in memory: entries ≤ their row's (or column's) threshold.

    The compare and the lists of :func:`screen_block` without its product: one read of the
    block where torch compares it against each side into masks and ``nonzero`` reads those
    again. ``row_thr``/``col_thr`` are in the block's dtype (float32 or float64); the keys come
    back in it. Rows of ``scores`` must be contiguous. Returns ``(by_row, by_col)`` as
    :func:`screen_block` does (``by_col`` None without ``col_thr``).
    """
    interpret = interpreting()
    kernel = _kernel(interpret)[1]
    m, n = scores.shape
    if m and n and scores.stride(1) != 1:
        raise ValueError("select_block needs rows stored contiguously")
    cfg = dict(BLOCK_M=16, BLOCK_N=32) if interpret else dict(SELECT_TILE)
    num_warps = cfg.pop("num_warps", 4)
    grid = (-(-m // cfg["BLOCK_M"]) * -(-n // cfg["BLOCK_N"]),)
    extra = {} if interpret else dict(num_warps=num_warps)
    symmetric = col_thr is not None

    def launch(lists, counters, capacity):
        kernel[grid](scores, scores.stride(0), row_thr, col_thr if symmetric else row_thr, *lists[0], *lists[-1],
                     counters, m, n, capacity, SYMMETRIC=symmetric, FEW=get_options().few_per_tile, **cfg, **extra)

    return _collect(launch, "select", m, n, capacity_hint, symmetric, scores.dtype, scores.device)


#: Survivors per side the last launch of each kind found on each device, by block shape and
#: whatever the shape. The next block's lists start a quarter larger than the last of its shape
#: found, or than the last of any shape: k = 100 graph blocks keep more than INITIAL_PER_ROW
#: pairs per row early on, and each overflow ran the kernel twice (71 of 666 blocks of a 582k ×
#: 64 graph). By shape, because a search's two launches differ: its first tile of 262,144
#: columns kept more at k ≥ 1,024 than a quarter above what the rest of the corpus had kept
#: just before, and ran twice in every call.
_last_found: dict[tuple, int] = {}


def _capacity_hint(kind: str, device: torch.device, m: int, n: int) -> int:
    """Where a launch's lists start (see :data:`_last_found`)."""
    last = _last_found.get((kind, device, m, n), _last_found.get((kind, device), 0))
    return max(INITIAL_PER_ROW * m, last * 5 // 4)


def _collect(launch, kind: str, m: int, n: int, capacity_hint: int | None, symmetric: bool, key_dtype: torch.dtype,
             device: torch.device, later: bool = False):
    """Run ``launch(lists, counters, capacity)`` over an m × n block into one list per side, once
    more with room for all if the first overflowed; one synchronisation reads the sizes.

    ``later``: return a function that reads the sizes (and relaunches if need be) when called,
    instead of its result: launches of several blocks then queue back to back, and on a GPU
    reading one block's sizes waits for that launch only (its counters are copied to pinned
    memory right behind it), so the host can work on a block while the next one runs. The
    block's inputs and thresholds must not change before the call (a relaunch reads them
    again)."""
    sides = 2 if symmetric else 1
    if m == 0 or n == 0:
        none = torch.empty(0, dtype=torch.int64, device=device)
        empty = [Survivors(none, none.clone(), torch.empty(0, dtype=key_dtype, device=device)) for _ in range(sides)]
        result = (empty[0], empty[1] if symmetric else None)
        return (lambda: result) if later else result
    if capacity_hint is None:
        capacity_hint = _capacity_hint(kind, device, m, n)
    floor = 1024 if interpreting() else min(m * n, LIST_FLOOR)

    def run(capacity: int) -> tuple[list, torch.Tensor]:
        counters = torch.zeros(2, dtype=torch.int32, device=device)
        lists = [(torch.empty(capacity, dtype=torch.int32, device=device),
                  torch.empty(capacity, dtype=torch.int32, device=device),
                  torch.empty(capacity, dtype=key_dtype, device=device)) for _ in range(sides)]
        launch(lists, counters, capacity)
        return lists, counters

    capacity = min(max(floor, capacity_hint), MAX_LIST)
    lists, counters = run(capacity)
    # Sized later on a GPU: the counters' copy is queued right behind the launch, so that
    # reading it waits for this launch only, not for whatever was queued after it.
    early, copied = None, None
    if later and device.type == "cuda":
        early = torch.empty(2, dtype=torch.int32, pin_memory=True)
        early.copy_(counters, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

    def sized() -> tuple[Survivors, Survivors | None]:
        nonlocal lists, counters, capacity, early
        while True:
            if early is not None and copied is not None:
                copied.synchronize()
                found, early = early.tolist()[:sides], None
            else:
                found = counters.tolist()[:sides]
            if max(found) <= capacity and min(found) >= 0:
                break
            if min(found) < 0 or max(found) > MAX_LIST:
                raise RuntimeError(f"CUDA out of memory: a screen block kept more pairs than one list holds "
                                   f"({MAX_LIST}); smaller blocks are needed")
            capacity = max(found)  # the same thresholds keep the same pairs: one relaunch fits them all
            lists, counters = run(capacity)
        if len(_last_found) > 4096:  # a long process of many block shapes
            _last_found.clear()
        _last_found[(kind, device)] = _last_found[(kind, device, m, n)] = max(found)
        out = [Survivors(owner[:f].long(), other[:f].long(), keys[:f]) for (owner, other, keys), f in zip(lists, found)]
        return out[0], out[1] if symmetric else None

    return sized if later else sized()


#: Rows and columns of a score block each program of :func:`block_epilogue`'s kernel takes.
_EPILOGUE_BLOCK = (32, 128)


def block_epilogue(scores: torch.Tensor, scales: tuple[torch.Tensor, torch.Tensor] | None,
                   col_terms: torch.Tensor | None, row_terms: torch.Tensor | None, *,
                   kernel: bool | None = None) -> torch.Tensor:
    """In place on a float32 score block: each entry times its row's factor, then its column's
    scale (``scales``: float32 (row factors, column scales), or None), then plus its column's
    term, then its row's (float32, where given), each step rounded to float32 in that order.

    Torch's in-place operations are the reference and the CPU's path. On a GPU one Triton launch
    does the same IEEE operations in the same order (no fused multiply-adds), reading and writing
    the block once instead of up to four times: the exact-products seed blocks of an 8×8 patch
    graph at k = 100 (34k × 8,192, 17 parts) took ~70 ms of an H100's time in four passes.
    ``kernel``: whether the Triton launch does it (default: where the fused kernels run; True
    under Triton's interpreter tests it on a CPU).
    """
    m, n = scores.shape
    bm, bn = _EPILOGUE_BLOCK
    if kernel is None:
        kernel = triton_runs(scores.device)
    if kernel and scores.dtype == torch.float32 and scores.stride(1) == 1 and -(-n // bn) < 65536:
        if m and n and (scales is not None or col_terms is not None or row_terms is not None):
            row_factors, col_scales = scales if scales is not None else (scores, scores)
            _triton().block_epilogue_kernel[(-(-m // bm), -(-n // bn))](
                scores, row_factors.contiguous(), col_scales.contiguous(),
                scores if col_terms is None else col_terms.contiguous(),
                scores if row_terms is None else row_terms.contiguous(), m, n, scores.stride(0),
                SCALE=scales is not None, COL_TERMS=col_terms is not None, ROW_TERMS=row_terms is not None,
                BLOCK_M=bm, BLOCK_N=bn, **ieee_options())
        return scores
    if scales is not None:
        scores.mul_(scales[0][:, None]).mul_(scales[1][None, :])
    if col_terms is not None:
        scores += col_terms[None, :]
    if row_terms is not None:
        scores += row_terms[:, None]
    return scores
