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
    cost 17 ms a call); a fixed seed keeps runs reproducible.
    """
    if size >= n:
        return torch.arange(n, device=device)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.arange(size + 1, dtype=torch.int64) * n // size
    jitter = (torch.rand(size, generator=gen, dtype=torch.float64) * (starts[1:] - starts[:-1])).long()
    return (starts[:-1] + jitter).to(device)


def seed_candidates(scores: torch.Tensor, k: int, select: str, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidates per row of a block to seed τ: the k smallest, selected by ``select``.

    Any k columns give a valid bound, so a float64 block is selected on float32 keys (every
    algorithm takes them) and the block's own values are returned.
    """
    selector = resolve(select, rows=scores.shape[0], cols=scores.shape[1], k=k, device=device)
    keys = scores if scores.dtype == torch.float32 else scores.to(torch.float32)
    _, positions = selector(keys, k)
    return scores.gather(1, positions), positions
