"""The first thresholds: k candidates per row, before the full screen, that bound its k-th.

Any k columns' largest certified upper bound s̃ + E is at least a row's k-th smallest true
score, so the k best-screened columns of any subset give a valid τ. A search takes them from a
random sample of columns; a graph from each point's own part (the diagonal blocks, which it
computes anyway). The stores tighten τ from there as the screen runs.
"""

from __future__ import annotations

import torch

from knng._options import kernel_forced
from knng.engine import fused, row_kth, stages
from knng.select import resolve

__all__ = ["kth_of_rows", "kth_of_rows_reference", "kth_seeds_run", "sample_columns", "seed_candidates",
           "smallest_candidates", "smallest_of_rows", "strip_candidates"]


def sample_columns(n: int, size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``size`` distinct, sorted column ids: one at random in each of ``size`` equal strata.

    Stratified rather than a permutation of all n ids (a 1M-element ``randperm`` on the host
    cost 17 ms a call); a fixed seed keeps runs reproducible on one kind of device. Drawn on
    ``device``: drawn on the host and copied, it took 1–2 ms, or 43–47 ms in one call of
    three (H100 host, 2026-11-23).
    """
    if size >= n:
        return torch.arange(n, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    starts = torch.arange(size + 1, dtype=torch.int64, device=device) * n // size
    jitter = torch.rand(size, generator=gen, dtype=torch.float64, device=device) * (starts[1:] - starts[:-1])
    return starts[:-1] + jitter.long()


#: Columns per chunk of a seed by chunk minima (see :func:`seed_candidates`).
SEED_CHUNK = 32
#: Largest k whose seeds come from chunk minima on a GPU (any k on a CPU). H100, 2026-11-24,
#: alternating fresh processes (``bench/ab_calls.py``, ``bench/ab_group.py``), ``select``'s pass
#: → chunk minima (with TF32 products for graph parts' seeds), ms: graph 200k × 128, k = 10 181,
#: 184 → 163, 163; 1M × 128 1,475, 1,487 → 1,339, 1,396; 16×16 patches 373, 387 → 337, 375;
#: search 1M × 960, 10k queries, k = 10 85.4, 83.2 → 81.0, 81.8; 1M × 128 k = 10 32.3, 34.7 →
#: 32.4, 31.5; but k = 100 39.9, 43.7 → 45.6, 45.3 (a top-100 of 2,048 chunk minima per row, and
#: seeds a little looser).
GPU_CHUNK_SEED_MAX_K = 16


def seed_candidates(scores: torch.Tensor, k: int, select: str, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct candidates per row of a block to seed τ, about the k smallest.

    Any k columns give a valid bound, so a float64 block is selected on float32 keys (every
    algorithm takes them) and the block's own values are returned. With at least 2k chunks of
    :data:`SEED_CHUNK` (strided) columns, the smallest entry of each chunk and the k smallest of
    those: k distinct columns, whose k-th is about the row's 11th smallest for k = 10 (Gaussian 2,048²
    block: median rank 11), in a few launches and no synchronisation: on a CPU at half of
    ``torch.topk``'s time over the whole row (about 3 ms against 6.7 ms, 2 cores), on a GPU
    faster than ``select``'s pass over the block up to k = :data:`GPU_CHUNK_SEED_MAX_K`.
    Otherwise the k smallest, selected by ``select``.
    """
    stages.count("seeds.from_block")
    m, cols = scores.shape
    chunks = cols // SEED_CHUNK
    if not (chunks >= 2 * k and (device.type != "cuda" or k <= GPU_CHUNK_SEED_MAX_K)):
        return smallest_candidates(scores, k, select, device)
    keys = scores if scores.dtype == torch.float32 else scores.to(torch.float32)
    # Chunk c holds the strided columns c, c + chunks, c + 2·chunks, ...: the minima are an
    # outer reduction, whose reads are coalesced on a GPU (contiguous chunks of 32, an inner
    # one, read a graph part's 32,768 × 8,192 seed block at about 450 GB/s on an H100).
    body = keys[:, :chunks * SEED_CHUNK].view(m, SEED_CHUNK, chunks)
    tail = keys[:, chunks * SEED_CHUNK:]
    minima = body.amin(dim=1)  # values only: min() with indices ran 9× slower
    pool = torch.cat([minima, tail], dim=1) if tail.shape[1] else minima
    _, pick = torch.topk(pool, k, dim=1, largest=False, sorted=False)
    chunk = pick.clamp_max(chunks - 1)
    picked = keys.gather(1, (chunk[:, :, None] + chunks * torch.arange(SEED_CHUNK, device=keys.device)).view(m, -1))
    offset = picked.view(m, k, SEED_CHUNK).argmin(dim=2)  # the k chunks' smallest entries
    positions = torch.where(pick < chunks, chunk + chunks * offset, pick - chunks + chunks * SEED_CHUNK)
    return scores.gather(1, positions), positions


def smallest_candidates(scores: torch.Tensor, width: int, select: str, device: torch.device
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``width`` smallest entries of a block by their float32 keys (the block's own
    values, rounded to nearest where it is float64), selected by ``select``: (values, positions),
    in no particular order within a row.

    Unlike :func:`seed_candidates` the selection is exact on the keys: every other entry's key
    is at least the largest selected one, which :func:`knng.engine.screen.survivors_of_smallest`
    uses to take a row's survivors from its selection alone.
    """
    keys = scores if scores.dtype == torch.float32 else scores.to(torch.float32)
    m, cols = keys.shape
    width = min(width, cols)
    selector = resolve(select, rows=m, cols=cols, k=width, device=device)
    _, positions = selector(keys, width)
    return scores.gather(1, positions), positions


#: Largest k and number of strips a row whose k smallest strip minima :func:`strip_candidates`
#: takes with a kernel (``_triton_kernels.smallest_of_rows_kernel``: the row in registers, k
#: rounds of a minimum) instead of ``torch.topk``. H200, 2026-11-27,
#: ``bench/strip_candidates_rates.py``: 66,667 rows of 128 strips at k = 10 0.092 ms against
#: 0.415 for ``torch.topk`` (0.447 for a sort), 200,000 rows 0.246 against 1.155, 66,667 rows of
#: 256 at k = 16 0.338 against 0.815: about 1 ms of the 200k × 128 graph's seeds at k = 10.
SMALL_ROW_MAX_K = 32
SMALL_ROW_MAX_WIDTH = 1024


def strip_candidates(keys: torch.Tensor, cols: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct candidates per row from its strip minima (``knng.engine.screen.strip_minima``):
    the k smallest minima and their columns. Strips are disjoint, so the columns are distinct;
    with at least 2k strips the k-th is near the row's k-th smallest key of the block (the
    chunk minima of :func:`seed_candidates`, with the kernel's contiguous strips).

    On a GPU with Triton, rows of at most :data:`SMALL_ROW_MAX_WIDTH`
    strips and k ≤ :data:`SMALL_ROW_MAX_K` go through a kernel that takes the k smallest by
    (key, strip), ascending; elsewhere ``torch.topk`` (the same values; among equal keys it may
    pick other strips, which bound τ as well)."""
    m, width = keys.shape
    if k > width:
        raise ValueError(f"{k} candidates from {width} strips")
    if (k <= SMALL_ROW_MAX_K and width <= SMALL_ROW_MAX_WIDTH and keys.dtype == torch.float32 and m
            and fused.fused_available(keys.device)):
        return smallest_of_rows(keys, cols, k)
    values, pick = torch.topk(keys, k, dim=1, largest=False, sorted=False)
    return values, cols.gather(1, pick)


def smallest_of_rows(keys: torch.Tensor, cols: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest float32 ``keys`` (no NaN) ascending by (key, position), and the
    ``cols`` at their positions, by ``_triton_kernels.smallest_of_rows_kernel``; rows of at most
    :data:`SMALL_ROW_MAX_WIDTH` keys. Its reference is a stable sort of each row."""
    m, width = keys.shape
    keys, cols = keys.contiguous(), cols.contiguous()
    assert cols.shape == keys.shape and width <= SMALL_ROW_MAX_WIDTH
    wide = fused.block_width(width, 16)
    rows = max(1, min(16, 4096 // wide))  # 16 rows of 128 or 256 measured fastest (32 and 64 slower)
    values = torch.empty((m, k), dtype=keys.dtype, device=keys.device)
    picked = torch.empty((m, k), dtype=cols.dtype, device=keys.device)
    options = {} if fused.interpreting() else dict(num_warps=4)
    fused.kernels().smallest_of_rows_kernel[(-(-m // rows),)](keys, cols, values, picked, m, width, keys.stride(0),
                                                              K=k, ROWS=rows, WIDTH=wide, **options)
    return values, picked


#: Widest row whose k-th smallest strip minimum :func:`kth_of_rows` takes with its kernel (the
#: row whole in registers, spread over more warps the wider it is: :data:`KTH_WIDE_WARPS`);
#: wider rows go to ``torch.topk``. 16,384 tile minima are a search's of 2M corpus points.
KTH_ROW_MAX_WIDTH = 16384


def kth_seeds_run(rows: int, strips: int, k: int, device: torch.device) -> bool:
    """Whether a search's seeds take each row's k-th strip minimum alone (:func:`kth_of_rows`)
    rather than its k smallest and their columns (:func:`strip_candidates`): for ``rows`` rows
    of ``strips`` strip minima, above the register kernel's k, on a GPU with Triton. Decided
    from the shape, before the strip minima are computed.

    The k-th smallest of k distinct columns' keys plus an error radius valid for every key up
    to it bounds a row's k-th true key, as a store's tightening does, so no column is needed.
    ``torch.topk`` of 101 of 1,024 strip minima took 5.85 ms for 200,000 rows, the kernel 2.58
    (H200, 2026-11-27, ``bench/strip_candidates_rates.py``; the 200k × 128 graph by rows at
    k = 100 went 80.5 → 77.6 ms)."""
    forced = kernel_forced("kth_seeds")
    if forced is False:
        return False
    return (SMALL_ROW_MAX_K < k <= strips <= KTH_ROW_MAX_WIDTH and rows > 0
            and (forced or fused.fused_available(device)))


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
    ``row_kth.ordered_code`` values, and its count of keys: what ``row_kth.row_ends`` gives for
    the pairs of a dense block, for :meth:`~knng.engine.store.CandidateStore.tighten_ends`.

    By ``_triton_kernels.kth_of_rows_kernel`` (rows of at most :data:`KTH_ROW_MAX_WIDTH` keys)
    where Triton runs; else (and as its reference) :func:`kth_of_rows_reference`.
    """
    m, width = keys.shape
    if not (fused.fused_available(keys.device) and width <= KTH_ROW_MAX_WIDTH and m and keys.dtype == torch.float32):
        return kth_of_rows_reference(keys, k)
    keys = keys.contiguous()
    wide = fused.block_width(width, 16)
    rows = max(1, KTH_ROWS * 1024 // max(1024, wide))
    firsts, kths, counts = (torch.empty(m, dtype=torch.int64, device=keys.device) for _ in range(3))
    warps = KTH_WARPS if wide <= 1024 else min(16, max(KTH_WIDE_WARPS, wide // 1024))
    options = {} if fused.interpreting() else dict(num_warps=warps)
    fused.kernels().kth_of_rows_kernel[(-(-m // rows),)](keys, m, width, keys.stride(0), k, firsts, kths, counts,
                                                        row_kth.NO_CODE, ROWS=rows, WIDTH=wide, **options)
    return firsts, kths, counts


def kth_of_rows_reference(keys: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`kth_of_rows` by a sort of each row's order codes (float64 keys rounded up to
    float32 first, as ``row_kth.row_ends`` does)."""
    m, width = keys.shape
    counts = torch.full((m,), width, dtype=torch.int64, device=keys.device)
    if width < k or m == 0:
        none = torch.full((m,), row_kth.NO_CODE, dtype=torch.int64, device=keys.device)
        return none, none.clone(), counts
    codes = torch.sort(row_kth.ordered_code(row_kth.float32_up(keys)), dim=1).values
    return codes[:, 0].contiguous(), codes[:, k - 1].contiguous(), counts
