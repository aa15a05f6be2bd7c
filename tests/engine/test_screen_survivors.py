"""The CPU screen's survivors (``knng.engine.screen``): chunks filtered by their minima, the last
and shorter chunk too, give the same pairs and keys as comparing the whole block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from knng.engine import screen


def _as_set(found: screen.Survivors) -> list[tuple[int, int, float]]:
    return sorted(zip(found.owner.tolist(), found.other.tolist(), found.keys.tolist()))


def _whole(scores: torch.Tensor, thr: torch.Tensor, by_rows: bool) -> list[tuple[int, int, float]]:
    """The reference: every entry compared with its owner's threshold rounded up to the block's
    float32 (the screen's contract: a threshold's rounding never drops a survivor, so an entry
    between it and its rounding up is kept; a quantile interpolated within one ulp of the next
    score kept that score)."""
    near = thr.to(torch.float32)
    up = torch.where(near.double() < thr, torch.nextafter(near, torch.tensor(torch.inf)), near).double()
    mask = scores.double() <= (up[:, None] if by_rows else up[None, :])
    r, c = torch.nonzero(mask, as_tuple=True)
    owner, other = (r, c) if by_rows else (c, r)
    return sorted(zip(owner.tolist(), other.tolist(), scores[r, c].tolist()))


@pytest.mark.parametrize("shape", [(130, 1016), (1016, 77), (5, 63), (3, 1), (64, 64), (33, 200), (200, 33)])
@pytest.mark.parametrize("density", ["sparse", "dense", "ties"])
def test_chunked_survivors_equal_the_whole_compare(shape, density, rng, seed):
    # Lengths that are and are not multiples of the chunks (64 along rows, 32 across): the tail
    # chunk is filtered by its minima like the others, or compared whole where most hit.
    m, n = shape
    scores = torch.from_numpy(rng.standard_normal((m, n)).astype(np.float32))
    if density == "ties":  # integer scores: entries equal to their threshold are kept
        scores = scores.mul(2).round()
    quantile = {"sparse": 0.01, "dense": 0.6, "ties": 0.2}[density]
    for by_rows in (True, False):
        owners = m if by_rows else n
        values = scores if by_rows else scores.T
        thr = torch.quantile(values.double(), quantile, dim=1) if values.shape[1] > 1 else values[:, 0].double()
        thr[rng.integers(0, owners, max(1, owners // 7))] = -np.inf  # owners that keep nothing
        found = screen.row_survivors(scores, thr) if by_rows else screen.column_survivors(scores, thr)
        assert _as_set(found) == _whole(scores, thr, by_rows), f"seed={seed} by_rows={by_rows}"
