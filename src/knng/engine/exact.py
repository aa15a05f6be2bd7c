"""Exact float64 distances from the input vectors, and the order of an exact answer.

The engine's screen (``engine/screen.py``) and stores (``engine/store.py``) decide which pairs
a row's proof needs; the pairs are evaluated here, by differences (``Metric.exact``), and an
answer is ordered by (distance, index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from knng._inputs import InputArray
from knng.engine import fused, stages
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
    by_kernel = _by_kernel(metric, raw_rows, rows, corpus.tensor, cols, device)
    if by_kernel is not None:
        return by_kernel
    return _evaluate(metric, lambda r: raw_rows[r.to(raw_rows.device)].to(device), rows, corpus, cols, device,
                     chunk_bytes)


def exact_pairs_of(metric: Metric, left: InputArray, rows: torch.Tensor, right: InputArray, cols: torch.Tensor,
                   device: torch.device, chunk_bytes: int | None = None) -> torch.Tensor:
    """Exact float64 distances for the pairs (left[rows[p]], right[cols[p]]), both by id; ``cols``
    may be (m, w) and ``chunk_bytes`` bounds the chunks, as in :func:`exact_pairs`."""
    stages.count("finish.exact")
    by_kernel = _by_kernel(metric, left.tensor, rows, right.tensor, cols, device)
    if by_kernel is not None:
        return by_kernel
    return _evaluate(metric, lambda r: left.take(r).to(device, non_blocking=True), rows, right, cols, device,
                     chunk_bytes)


#: Metrics whose exact values the pair kernel computes: sums of squared differences (the
#: Euclidean distance is their square root, taken by torch, correctly rounded).
KERNEL_METRICS = frozenset({"euclidean", "sqeuclidean"})
#: Pairs per program of the pair kernel, and dimensions per step (in the interpreter: smaller).
PAIR_BLOCK, PAIR_DIMS = 16, 128


def _by_kernel(metric: Metric, left: torch.Tensor | None, rows: torch.Tensor, right: torch.Tensor | None,
               cols: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The pairs' exact values from the pair kernel (``_triton_kernels.pair_squares_kernel``),
    or None where it does not apply: a metric outside :data:`KERNEL_METRICS`, either side not a
    tensor on ``device``, or no kernel there (``fused.fused_available``).

    The reference gathers both rows of every pair as float64 copies and sums their squared
    differences (``Metric.exact``): at d = 960, 10k queries and k = 100 about 15 GB through
    memory. The kernel reads each input row where it lies and keeps the float64 values in
    registers; the sums differ from the reference's only in their order, within the float64
    evaluation's error bound (``Metric.oracle_error``) that the stores' radii already carry.
    """
    stages.count("finish.exact_kernel")
    if metric.name not in KERNEL_METRICS or left is None or right is None or not fused.fused_available(device):
        return None
    if left.device != device or right.device != device or left.dim() != 2 or right.dim() != 2:
        return None
    shape = cols.shape
    pair_rows = (rows[:, None].expand(shape) if cols.dim() == 2 else rows).reshape(-1).to(device).contiguous()
    pair_cols = cols.reshape(-1).to(device).contiguous()
    left = left if left.stride(1) == 1 else left.contiguous()
    right = right if right.stride(1) == 1 else right.contiguous()
    out = torch.empty(pair_cols.numel(), dtype=torch.float64, device=device)
    block, dims = (16, 16) if fused.interpreting() else (PAIR_BLOCK, PAIR_DIMS)
    if out.numel():
        fused.kernels().pair_squares_kernel[(-(-out.numel() // block),)](
            left, pair_rows, right, pair_cols, out, out.numel(), left.shape[1], left.stride(0), right.stride(0),
            BLOCK_P=block, BLOCK_D=dims)
    if metric.name == "euclidean":
        out = torch.sqrt(out)
    return out.view(shape)


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
