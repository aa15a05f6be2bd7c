"""The first thresholds: k candidates per row, before the full screen, that bound its k-th.

Any k columns' largest certified upper bound s̃ + E is at least a row's k-th smallest true
score, so the k best-screened columns of any subset give a valid τ. A search takes them from a
random sample of columns; a graph from each point's own part (the diagonal blocks, which it
computes anyway). The stores tighten τ from there as the screen runs.
"""

from __future__ import annotations

import torch

from knng.select import resolve

__all__ = ["sample_columns", "seed_candidates"]


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


#: Columns per chunk of a CPU seed (see :func:`seed_candidates`).
SEED_CHUNK = 32


def seed_candidates(scores: torch.Tensor, k: int, select: str, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct candidates per row of a block to seed τ, about the k smallest.

    Any k columns give a valid bound, so a float64 block is selected on float32 keys (every
    algorithm takes them) and the block's own values are returned. On a GPU the k smallest,
    selected by ``select``. On a CPU, with at least 2k chunks of :data:`SEED_CHUNK` columns,
    the smallest entry of each chunk and the k smallest of those: k distinct columns, whose
    k-th is about the row's 11th smallest for k = 10 (Gaussian 2,048² block: median rank 11)
    at half of ``torch.topk``'s time over the whole row (about 3 ms against 6.7 ms, 2 cores).
    """
    keys = scores if scores.dtype == torch.float32 else scores.to(torch.float32)
    m, cols = keys.shape
    chunks = cols // SEED_CHUNK
    if device.type != "cuda" and chunks >= 2 * k:
        body = keys[:, :chunks * SEED_CHUNK].view(m, chunks, SEED_CHUNK)
        tail = keys[:, chunks * SEED_CHUNK:]
        minima = body.amin(dim=2)  # values only: min() with indices ran 9× slower
        pool = torch.cat([minima, tail], dim=1) if tail.shape[1] else minima
        _, pick = torch.topk(pool, k, dim=1, largest=False, sorted=False)
        chunk = pick.clamp_max(chunks - 1)
        picked = body[torch.arange(m, device=body.device)[:, None], chunk]  # the k chunks' entries
        positions = torch.where(pick < chunks, chunk * SEED_CHUNK + picked.argmin(dim=2),
                                pick - chunks + chunks * SEED_CHUNK)
        return scores.gather(1, positions), positions
    selector = resolve(select, rows=m, cols=cols, k=k, device=device)
    _, positions = selector(keys, k)
    return scores.gather(1, positions), positions
