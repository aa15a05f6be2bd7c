"""Tile plans: how big the score blocks may be, given a memory budget.

The engine's working set is dominated by one score block (``rows × cols`` float32) and what the
selection needs beside it. The budget also decides whether the prepared corpus (float32) stays
resident on the device or streams through in tiles from host memory or a memory map.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import torch

from knng._units import parse_bytes

__all__ = ["TilePlan", "plan_tiles", "default_budget", "resolve_budget", "candidate_count"]

#: Bytes per score-block element: the block itself, the selection's workspace (torch.topk's
#: radix select and sort need up to about one block-size more) and the exactness pass.
BLOCK_BYTES_PER_ELEMENT = 4 * 3
#: Share of free GPU memory used by default: leaves room for the CUDA context, other tensors
#: in the user's process and allocator fragmentation.
GPU_FREE_SHARE = 0.6
#: Share of available RAM used by default on a CPU; the CPU does not gain from huge tiles.
CPU_AVAILABLE_SHARE = 0.25
CPU_BUDGET_CAP = 2 * 2**30
#: Smallest tile edge the planner will shrink to before giving up.
MIN_TILE = 8


@dataclass(frozen=True)
class TilePlan:
    """Sizes for one run of the engine.

    Attributes
    ----------
    query_rows : int
        Queries screened together against one corpus tile (rows of a score block).
    corpus_cols : int
        Corpus vectors per tile (columns of a score block).
    corpus_resident : bool
        Whether the prepared corpus is kept whole on the device.
    budget : int
        The memory budget in bytes the plan was made for.
    """

    query_rows: int
    corpus_cols: int
    corpus_resident: bool
    budget: int

    def shrunk(self) -> "TilePlan":
        """A plan with half-size score blocks, for a retry after running out of memory."""
        if self.query_rows <= MIN_TILE and self.corpus_cols <= MIN_TILE:
            raise MemoryError("out of memory even with the smallest tiles")
        if self.query_rows >= self.corpus_cols and self.query_rows > MIN_TILE:
            return replace(self, query_rows=max(MIN_TILE, self.query_rows // 2))
        return replace(self, corpus_cols=max(MIN_TILE, self.corpus_cols // 2))


def candidate_count(k: int, available: int, screen_dtype: torch.dtype = torch.float32) -> int:
    """How many screened candidates per row to keep for the exact re-rank: k plus a margin.

    The margin lets the certificate prove most rows without a fall-back pass; rows where
    near-ties exceed it are settled by the fall-back (see ``engine/exact.py``). A float64
    screen is 2²⁹ times more precise, so only exact ties need room beyond k.
    """
    margin = max(16, k // 8) if screen_dtype == torch.float32 else max(16, k // 64)
    return min(available, k + margin)


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_budget(device: torch.device) -> int:
    """A safe share of free GPU memory, or of available RAM on a CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * GPU_FREE_SHARE)
    return int(min(CPU_BUDGET_CAP, _available_ram() * CPU_AVAILABLE_SHARE))


def resolve_budget(memory_budget: int | float | str | None, device: torch.device) -> int:
    """Bytes the engine may use on ``device``: the user's ``memory_budget`` or the default."""
    if memory_budget is None:
        return default_budget(device)
    return parse_bytes(memory_budget, "memory_budget")


def plan_tiles(
    *, n_queries: int, n_corpus: int, d: int, k_cand: int, budget: int, device: torch.device,
    symmetric: bool = False, element_bytes: int = 4,
) -> TilePlan:
    """Choose tile sizes so that the working set stays inside ``budget`` bytes.

    The prepared corpus (plus norms) stays resident when it takes at most half the budget;
    otherwise it streams in tiles. Running candidate lists (value and index per candidate) for
    all rows are kept on the device too. Score blocks get what remains: for a search, rows of
    up to a per-device number of columns (many on a GPU to amortise launches and merges,
    cache-sized on a CPU); for a graph, square blocks b × b (``query_rows == corpus_cols == b``).
    """
    vector_bytes = d * element_bytes + 24
    block_bytes = BLOCK_BYTES_PER_ELEMENT * element_bytes // 4
    corpus_bytes = n_corpus * vector_bytes
    # Running lists plus what waits to be merged into them (graphs merge lazily).
    lists_bytes = n_queries * k_cand * (8 + element_bytes) * (4 if symmetric else 2)
    query_bytes = 0 if symmetric else n_queries * vector_bytes
    resident = corpus_bytes <= budget // 2
    remaining = budget - lists_bytes - query_bytes - (corpus_bytes if resident else 0)
    remaining = max(remaining, budget // 8)
    if device.type == "cuda":
        max_rows, max_cols, max_side = 16384, 1 << 20, 1 << 16
    else:
        max_rows, max_cols, max_side = 1024, 8192, 2048
    if symmetric:
        # Two parts' prepared vectors stream beside a block when the data are not resident.
        side = math.isqrt(max(1, remaining // block_bytes))
        if not resident:
            side = min(side, max(MIN_TILE, remaining // 4 // vector_bytes))
        side = int(min(n_corpus, max_side, max(side, MIN_TILE, min(n_corpus, k_cand))))
        return TilePlan(query_rows=side, corpus_cols=side, corpus_resident=resident, budget=budget)
    min_cols = min(n_corpus, k_cand)  # a tile must offer at least the candidates it yields
    if not resident:
        # Every query chunk re-reads the whole corpus, so chunks get as many rows as possible
        # and the streamed tiles are narrowed instead (three quarters of what remains for the
        # blocks, the rest for the tile itself).
        rows = min(n_queries, max_rows)
        cols = (remaining * 3 // 4) // (rows * block_bytes)
        if cols < min_cols:
            cols = min_cols
            rows = max(1, (remaining * 3 // 4) // (cols * block_bytes))
        cols = int(min(cols, max_cols, max(min_cols, remaining // 4 // vector_bytes)))
        return TilePlan(query_rows=int(min(rows, n_queries)), corpus_cols=max(1, cols), corpus_resident=False,
                        budget=budget)
    cols = max(min(n_corpus, max_cols), min_cols)
    rows = int(min(n_queries, max_rows, max(1, remaining // (cols * block_bytes))))
    while rows < MIN_TILE and cols > max(MIN_TILE, k_cand) and rows < n_queries:
        cols = max(MIN_TILE, k_cand, cols // 2)
        rows = int(min(n_queries, max_rows, max(1, remaining // (cols * block_bytes))))
    return TilePlan(query_rows=max(1, rows), corpus_cols=max(1, cols), corpus_resident=True, budget=budget)
