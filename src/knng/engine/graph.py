"""Single-device exact k-NN graph using the symmetry of the distance matrix.

The data are split into P parts; only the blocks S(I, J) with I ≤ J are computed. Each block
gives the row candidates of part I and the column candidates of part J (a column of S(I, J) is a
row of S(J, I)), so every pair is screened once for each of its two points and the matrix
products halve. The screening score is the full symmetric form q_i + r_j + α·a_iᵀa_j (one
matrix product thanks to the augmented layout of :mod:`knng.metrics`), so one block serves both
directions. Then every point's candidates go through the same exact finish as a search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from knng._inputs import InputArray
from knng.engine.common import (
    PreparedCorpus, Progress, choose_screen_dtype, corpus_stats, full_precision, is_out_of_memory,
    CandidateLists, select_block,
)
from knng.engine.exact import Candidates, ExactStats, finish_rows
from knng.engine.plan import TilePlan, candidate_count, plan_tiles
from knng.engine.search import Float64Refiner
from knng.metrics import Metric
from knng.select import resolve

__all__ = ["GraphReport", "exact_graph", "screen_block", "BlockCandidates", "finish_graph_rows", "choose_part_size"]


@dataclass
class GraphReport:
    """How a graph run went, including the symmetric saving."""

    plan: TilePlan
    part_size: int
    parts: int
    blocks_computed: int
    blocks_full: int
    oom_retries: int
    exact: ExactStats
    candidates_per_row: int
    screen_dtype: str = "float32"
    mirrored: bool = False  # whole score matrix held: blocks mirrored, rows selected once

    @property
    def pairs_saving(self) -> float:
        """Share of the n² score entries (and matrix-product work) the symmetric plan skips."""
        return 1.0 - self.blocks_computed / self.blocks_full if self.blocks_full else 0.0


def exact_graph(
    data: InputArray,
    k: int,
    metric: Metric,
    device: torch.device,
    select: str,
    budget: int,
    include_self: bool = False,
    progress: bool = False,
    part_size: int | None = None,
    screen_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, GraphReport]:
    """Exact k-NN graph of ``data``; returns (indices, float64 distances, report)."""
    n = data.n
    available = n if include_self else n - 1
    dtype = screen_dtype or choose_screen_dtype(device, n, data.d, k)
    kc = candidate_count(k, available, dtype)
    plan = plan_tiles(n_queries=n, n_corpus=n, d=data.d, k_cand=kc, budget=budget, device=device,
                      symmetric=True, element_bytes=dtype.itemsize)
    dense = plan.corpus_resident and n * n * dtype.itemsize <= budget // 4
    b = part_size or choose_part_size(n, kc, plan, mirrored=dense)
    parts = [(s, min(n, s + b)) for s in range(0, n, b)]
    with full_precision():
        stats = corpus_stats(data, metric, device, symmetric=True, block_rows=max(b, 4096))
        pdata = PreparedCorpus(data, metric, stats.centre, device, resident=plan.corpus_resident,
                               block_rows=max(b, 4096), symmetric=True, dtype=dtype)
        retries = 0
        pairs = [(i, j) for i in range(len(parts)) for j in range(i, len(parts))]
        if dense:
            try:
                vals, idx, floor = _mirrored_candidates(pdata, metric, parts, pairs, kc, include_self, select,
                                                        device, plan.query_rows, progress)
            except Exception as exc:  # noqa: BLE001 - out of memory: take the blocked path instead
                if not is_out_of_memory(exc):
                    raise
                dense, retries = False, retries + 1
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if not dense:
            vals, idx, floor, blocked_retries = _blocked_candidates(
                pdata, metric, parts, pairs, kc, include_self, select, device, min(b, plan.query_rows), progress)
            retries += blocked_retries
        # After a float32 screen, rows that fail the certificate get a float64 screen of their own.
        refine = None if dtype == torch.float64 else Float64Refiner(
            data.name, data, k, metric, device, select, budget, exclude_self=not include_self)
        out_idx, out_dist, exact_stats, finish_retries = finish_graph_rows(
            data, 0, n, vals, idx, floor, pdata, metric, k, available, include_self, device, refine,
            chunk=plan.query_rows)
        retries += finish_retries
    report = GraphReport(plan=plan, part_size=b, parts=len(parts), blocks_computed=len(pairs),
                         blocks_full=len(parts) ** 2, oom_retries=retries, exact=exact_stats,
                         candidates_per_row=kc, screen_dtype=str(dtype).replace("torch.", ""),
                         mirrored=dense)
    return out_idx, out_dist, report


def _retry_on_oom(step, device: torch.device, attempts: int = 3) -> int:
    """Run an idempotent ``step``; after an out-of-memory error free the cache and retry."""
    for attempt in range(attempts):
        try:
            step()
            return attempt
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
            if not is_out_of_memory(exc) or attempt == attempts - 1:
                raise
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return attempts


def finish_graph_rows(
    data: InputArray, r0: int, r1: int, vals: torch.Tensor, idx: torch.Tensor, floor: torch.Tensor,
    pdata: PreparedCorpus, metric: Metric, k: int, available: int, include_self: bool, device: torch.device,
    refine: Callable | None, chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, ExactStats, int]:
    """The exact finish of graph rows ``r0:r1`` from their screened candidates.

    ``vals``/``idx``/``floor`` hold the candidates of exactly those rows (row ``r0`` first);
    ``pdata`` supplies the norms and terms of every point (candidates are global ids) and the
    data for the exact re-rank. Works in row chunks, halving a chunk after an out-of-memory
    error. Returns (indices, float64 distances, stats, out-of-memory retries).
    """
    m = r1 - r0
    row_norms, row_terms = pdata.norms[r0:r1], None if pdata.terms is None else pdata.terms[r0:r1]
    row_offsets = torch.zeros(m, dtype=torch.float64, device=device)
    if metric.normalize:
        row_offsets += 1.0  # distance 1 − cos = 1 + score
    out_idx = torch.empty((m, k), dtype=torch.int64, device=device)
    out_dist = torch.empty((m, k), dtype=torch.float64, device=device)
    stats = ExactStats()
    retries = 0
    chunk = max(1, min(m, chunk))
    q0 = 0
    while q0 < m:
        q1 = min(m, q0 + chunk)
        cands = Candidates(vals[q0:q1], idx[q0:q1], row_norms[q0:q1],
                           None if row_terms is None else row_terms[q0:q1], row_offsets[q0:q1], floor[q0:q1])
        try:
            raw = data.rows(r0 + q0, r0 + q1).to(device, non_blocking=True)
            o_i, o_d, st = finish_rows(cands, torch.arange(r0 + q0, r0 + q1, device=device), raw, pdata, metric,
                                       k, available, exclude_self=not include_self, device=device, refine=refine)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried, in smaller chunks
            if not is_out_of_memory(exc) or chunk == 1:
                raise
            chunk, retries = max(1, chunk // 2), retries + 1
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        out_idx[q0:q1], out_dist[q0:q1] = o_i, o_d
        stats.add(st)
        q0 = q1
    return out_idx, out_dist, stats, retries


#: Fewest parts of a graph. Mirrored (whole matrix held): only the products depend on P, and 8
#: parts compute 36 of 64 blocks (44 % saved). Blocked: every block also pays selections and
#: merges, so fewer, larger blocks win as long as the symmetry still saves (4 parts: 10 of 16).
MIN_PARTS_MIRRORED = 8
MIN_PARTS_BLOCKED = 4
#: Smallest part worth a separate block (kernel launches and merges cost per block).
MIN_PART = 2048


def choose_part_size(n: int, kc: int, plan: TilePlan, mirrored: bool = False) -> int:
    """Rows per part: the plan's square block side, but at least the minimum number of parts.

    Measured on an H100 (200 000 × 128, k = 10, blocked): parts of 16 384 rows 483 ms, 25 000
    428 ms, 33 334 382 ms, 50 000 355 ms (``bench/bench_graph_parts.py``).
    """
    parts = MIN_PARTS_MIRRORED if mirrored else MIN_PARTS_BLOCKED
    b = min(plan.query_rows, plan.corpus_cols, max(MIN_PART, -(-n // parts)))
    return max(1, min(n, max(b, kc)))  # a part must offer at least kc columns


def _blocked_candidates(pdata: PreparedCorpus, metric: Metric, parts: list[tuple[int, int]],
                        pairs: list[tuple[int, int]], kc: int, include_self: bool, select: str,
                        device: torch.device, sub_rows: int, progress: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Candidates from the blocks S(I, J), I ≤ J: row lists for part I, column lists for part J."""
    n = pdata.corpus.n
    lists = CandidateLists(n, kc, pdata.dtype, device)
    floor = torch.full((n,), torch.inf, dtype=torch.float64, device=device)
    retries = 0
    bar = Progress(progress, total=len(pairs), desc="knng graph")
    for pi, pj in pairs:
        (i0, i1), (j0, j1) = parts[pi], parts[pj]
        col_block = pdata.tile(j0, j1)
        r0 = i0
        while r0 < i1:
            r1 = min(i1, r0 + sub_rows)
            try:
                _screen_block(pdata, metric, col_block, r0, r1, j0, j1, pi == pj, include_self, kc,
                              select, device, lists, floor)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
                if not is_out_of_memory(exc) or sub_rows <= 8:
                    raise
                sub_rows = max(8, sub_rows // 2)
                retries += 1
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            r0 = r1
        retries += _retry_on_oom(lists.flush_due, device)
        bar.update()
    bar.close()
    _retry_on_oom(lists.finalize, device)
    return lists.values, lists.indices, floor, retries


def _mirrored_candidates(pdata: PreparedCorpus, metric: Metric, parts: list[tuple[int, int]],
                         pairs: list[tuple[int, int]], kc: int, include_self: bool, select: str,
                         device: torch.device, chunk_rows: int, progress: bool
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidates when the whole n × n score matrix fits the budget.

    Only the blocks S(I, J) with I ≤ J are multiplied; each is written to its place and,
    transposed, to the mirror place (a copy at memory speed instead of a second product). Then
    every row is selected once over its full length: no column selections and no merges.
    """
    n, d = pdata.corpus.n, pdata.corpus.d
    full = torch.empty((n, n), dtype=pdata.dtype, device=device)
    bar = Progress(progress, total=len(pairs), desc="knng graph")
    for pi, pj in pairs:
        (i0, i1), (j0, j1) = parts[pi], parts[pj]
        torch.mm(metric.query_layout(pdata.tile(i0, i1), d), pdata.tile(j0, j1).T, out=full[i0:i1, j0:j1])
        if pi != pj:
            full[j0:j1, i0:i1] = full[i0:i1, j0:j1].T
        bar.update()
    bar.close()
    if not include_self:
        full.diagonal().fill_(torch.inf)  # by index, not by distance: duplicates stay
    vals = torch.empty((n, kc), dtype=pdata.dtype, device=device)
    idx = torch.empty((n, kc), dtype=torch.int64, device=device)
    floor = torch.full((n,), torch.inf, dtype=torch.float64, device=device)
    selector = resolve(select, rows=min(n, chunk_rows), cols=n, k=kc, device=device)
    for r0 in range(0, n, chunk_rows):
        r1 = min(n, r0 + chunk_rows)
        v, i, row_floor = select_block(selector, full[r0:r1], kc)
        vals[r0:r1], idx[r0:r1] = v, i
        if row_floor is not None and kc < n:
            floor[r0:r1] = row_floor
    return vals, idx, floor


@dataclass
class BlockCandidates:
    """Candidates from one block S(I, J), rows r0:r1 of part I against all of part J.

    Row lists are for the block's rows (global ids of part-J points), column lists for part
    J's points (global ids of the block's rows; None for a diagonal block, whose rows are its
    columns). A floor is None where the selection was exact or kept every entry.
    """

    row_values: torch.Tensor
    row_ids: torch.Tensor
    row_floor: torch.Tensor | None
    col_values: torch.Tensor | None = None
    col_ids: torch.Tensor | None = None
    col_floor: torch.Tensor | None = None


def screen_block(rows: torch.Tensor, col_block: torch.Tensor, metric: Metric, d: int, r0: int, j0: int,
                 diagonal: bool, include_self: bool, kc: int, select: str, device: torch.device
                 ) -> BlockCandidates:
    """Screen prepared rows (global ids r0, r0 + 1, …) against the prepared part starting at j0.

    Both arguments are in the corpus layout of :mod:`knng.metrics`. Pure: nothing outside is
    changed, so a block that runs out of memory can simply be retried.
    """
    r1, j1 = r0 + rows.shape[0], j0 + col_block.shape[0]
    scores = metric.query_layout(rows, d) @ col_block.T  # (r1 - r0) × (j1 - j0)
    if diagonal and not include_self:
        # Exclude each point from its own list by index, not by distance: duplicates stay.
        local = torch.arange(r1 - r0, device=device)
        scores[local, local + (r0 - j0)] = torch.inf
    kt, kr = min(kc, j1 - j0), min(kc, r1 - r0)
    selector = resolve(select, rows=scores.shape[0], cols=scores.shape[1], k=kt, device=device)
    # Column candidates: each column of S(I, J) is a row of S(J, I).
    both = getattr(selector, "rows_and_columns", None)
    if both is not None and not diagonal and scores.dtype == torch.float32:
        # One sort of the block serves both lists; exact on float32, so no floors.
        v, i, cv, ci = both(scores, kt, kr)
        return BlockCandidates(v, i + j0, None, cv, ci + r0, None)
    v, i, row_floor = select_block(selector, scores, kt)
    if kt == j1 - j0:
        row_floor = None  # every entry kept: nothing left out to bound
    if diagonal:
        return BlockCandidates(v, i + j0, row_floor)
    cv, ci, col_floor = select_block(selector, scores, kr, columns=True)
    if kr == r1 - r0:
        col_floor = None
    return BlockCandidates(v, i + j0, row_floor, cv, ci + r0, col_floor)


def _screen_block(pdata: PreparedCorpus, metric: Metric, col_block: torch.Tensor, r0: int, r1: int,
                  j0: int, j1: int, diagonal: bool, include_self: bool, kc: int, select: str,
                  device: torch.device, lists: CandidateLists, floor: torch.Tensor) -> None:
    """Screen rows r0:r1 of part I against part J; merge row and (off-diagonal) column candidates."""
    block = screen_block(pdata.tile(r0, r1), col_block, metric, pdata.corpus.d, r0, j0, diagonal, include_self,
                         kc, select, device)
    # Floors first: taking a minimum twice is harmless if the block is retried.
    if block.row_floor is not None:
        floor[r0:r1] = torch.minimum(floor[r0:r1], block.row_floor)
    if block.col_floor is not None:
        floor[j0:j1] = torch.minimum(floor[j0:j1], block.col_floor)
    # The adds are all or nothing, so a retried block is never counted twice.
    lists.add(r0, r1, block.row_values, block.row_ids)
    if block.col_values is not None:
        try:
            lists.add(j0, j1, block.col_values, block.col_ids)
        except BaseException:
            lists.discard_last(r0, r1)
            raise
