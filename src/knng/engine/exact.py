"""Exact float64 distances from the input vectors, and the order of an exact answer.

The engine's screen (``engine/screen.py``) and stores (``engine/store/``) decide which pairs
a row's proof needs; the pairs are evaluated here, by differences (``Metric.exact``), and an
answer is ordered by (distance, index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from knng._inputs import InputArray
from knng.engine import stages
from knng.engine.kernels import pair_values
from knng.metrics import Metric

__all__ = ["ExactStats", "exact_pairs", "exact_pairs_of", "sort_by_distance_then_index", "flat_top_by_distance"]

#: Bytes for gathered float64 vectors in one exact re-rank chunk: on a GPU large launches, on a
#: CPU chunks that stay in cache (640k pairs at d = 64 on 2 cores: 0.10 s in 16 MiB chunks,
#: 0.26 s in 256 MiB ones, which go through memory three times).
EXACT_CHUNK_BYTES = 256 * 2**20
EXACT_CHUNK_BYTES_CPU = 16 * 2**20


@dataclass
class ExactStats:
    """Counters for reports and tests: rows answered and exact evaluations made."""

    rows: int = 0
    exact_evaluations: int = 0

    def add(self, other: "ExactStats") -> None:
        self.rows += other.rows
        self.exact_evaluations += other.exact_evaluations


def sort_by_distance_then_index(dist: torch.Tensor, idx: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest by (distance, index): ties go to the smaller index."""
    order = torch.argsort(idx, dim=1)
    idx = torch.gather(idx, 1, order)
    dist = torch.gather(dist, 1, order)
    dist, order = torch.sort(dist, dim=1, stable=True)
    idx = torch.gather(idx, 1, order)
    return idx[:, :k], dist[:, :k]


def flat_top_by_distance(rows: torch.Tensor, cols: torch.Tensor, dist: torch.Tensor, n: int, k: int,
                         per_row: torch.Tensor | None = None, narrow: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of ``n`` rows' k first pairs by (distance, index) from flat pairs (``rows``,
    ``cols``, ``dist``): (n, k) indices and distances, −1 and +inf past a row's pairs.

    Three stable sorts order everything by (row, distance, index), and a row's first k go to
    their slots by one scatter (the others to a spare slot cut off after: no mask, no
    synchronisation). ``per_row``: each row's pair count where the caller has it; ``narrow``:
    rows and columns fit int32, whose radix sorts take half the passes.
    """
    device = rows.device
    if per_row is None:
        per_row = torch.bincount(rows, minlength=n)
    starts = torch.cumsum(per_row, 0) - per_row
    order = torch.argsort(cols.to(torch.int32) if narrow else cols, stable=True)
    order = order[torch.argsort(dist[order], stable=True)]
    order = order[torch.argsort((rows.to(torch.int32) if narrow else rows)[order], stable=True)]
    rows, cols, dist = rows[order], cols[order], dist[order]
    rank = torch.arange(rows.numel(), device=device) - starts[rows]
    slot = torch.where(rank < k, rows * k + rank, n * k)
    idx = torch.full((n * k + 1,), -1, dtype=torch.int64, device=device).scatter_(0, slot, cols)
    out = torch.full((n * k + 1,), torch.inf, dtype=torch.float64, device=device).scatter_(0, slot, dist)
    return idx[:-1].view(n, k), out[:-1].view(n, k)


def exact_pairs(metric: Metric, raw_rows: torch.Tensor, rows: torch.Tensor, corpus: InputArray,
                cols: torch.Tensor, device: torch.device, chunk_bytes: int | None = None) -> torch.Tensor:
    """Exact float64 distances for the pairs (raw_rows[rows[p]], corpus[cols[p]]).

    ``cols`` may also be (m, w): row ``rows[i]`` against each of ``cols[i]``, an (m, w) result
    (each row vector gathered once). ``chunk_bytes``: gathered float64 vectors per chunk at most
    (default :data:`EXACT_CHUNK_BYTES` or, on a CPU, :data:`EXACT_CHUNK_BYTES_CPU`).
    """
    by_kernel = pair_values(metric, raw_rows, rows, corpus.tensor, cols, device)
    if by_kernel is not None:
        return by_kernel
    return _evaluate(metric, lambda r: raw_rows[r.to(raw_rows.device)].to(device), rows, corpus, cols, device,
                     chunk_bytes)


def exact_pairs_of(metric: Metric, left: InputArray, rows: torch.Tensor, right: InputArray, cols: torch.Tensor,
                   device: torch.device, chunk_bytes: int | None = None) -> torch.Tensor:
    """Exact float64 distances for the pairs (left[rows[p]], right[cols[p]]), both by id; ``cols``
    may be (m, w) and ``chunk_bytes`` bounds the chunks, as in :func:`exact_pairs`."""
    stages.count("finish.exact")
    by_kernel = pair_values(metric, left.tensor, rows, right.tensor, cols, device)
    if by_kernel is not None:
        return by_kernel
    return _evaluate(metric, lambda r: left.take(r).to(device, non_blocking=True), rows, right, cols, device,
                     chunk_bytes)


def _evaluate(metric: Metric, take_rows: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor,
              right: InputArray, cols: torch.Tensor, device: torch.device, chunk_bytes: int | None = None
              ) -> torch.Tensor:
    """Pairs (``cols`` (p,)) or row batches (``cols`` (m, w)), in chunks of bounded memory;
    ``take_rows(ids)`` gives the left vectors on ``device``."""
    batched = cols.dim() == 2
    width = cols.shape[1] if batched else 1
    out = torch.empty(cols.shape, dtype=torch.float64, device=device)
    budget = EXACT_CHUNK_BYTES_CPU if device.type == "cpu" else EXACT_CHUNK_BYTES
    budget = budget if chunk_bytes is None else min(budget, chunk_bytes)
    step = max(1, budget // (right.d * 8 * (width + 2)))
    for p0 in range(0, rows.numel(), step):
        p1 = min(rows.numel(), p0 + step)
        x = take_rows(rows[p0:p1])
        y = right.take(cols[p0:p1].reshape(-1)).to(device, non_blocking=True).view(p1 - p0, width, right.d)
        if batched and metric.name == "inner_product":
            # A batched product sums in an order that depends on the batch's width (BLAS
            # blocking); pair by pair, every pair is summed alike wherever it is evaluated.
            values = metric.exact(x.repeat_interleave(width, 0), y.reshape(-1, 1, right.d)).view(p1 - p0, width)
        else:
            values = metric.exact(x, y)
        out[p0:p1] = values if batched else values[:, 0]
    return out
