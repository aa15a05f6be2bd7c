"""The first thresholds: k candidates per row, before the full screen, that bound its k-th.

Any k columns' largest certified upper bound s̃ + E is at least a row's k-th smallest true
score, so the k best-screened columns of any subset give a valid τ. A search takes them from a
random sample of columns; a graph from each point's own part (the diagonal blocks, which it
computes anyway). The stores tighten τ from there as the screen runs.
"""

from __future__ import annotations

import torch

from knng.engine import stages
from knng.select import resolve
from knng.engine.kernels import SMALL_ROW_MAX_K, SMALL_ROW_MAX_WIDTH, smallest_of_rows, triton_runs

__all__ = ["sample_columns", "seed_candidates", "smallest_candidates", "strip_candidates"]


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
            and triton_runs(keys.device)):
        return smallest_of_rows(keys, cols, k)
    values, pick = torch.topk(keys, k, dim=1, largest=False, sorted=False)
    return values, cols.gather(1, pick)
