"""Single-device exact k-NN graph using the symmetry of the distance matrix.

The data are split into P parts; only the blocks S(I, J) with I ≤ J are computed. Each block
gives the row candidates of part I and the column candidates of part J (a column of S(I, J) is a
row of S(J, I)), so every pair is screened once for each of its two points and the matrix
products halve. The screening score is the full symmetric form q_i + r_j + α·a_iᵀa_j (one
matrix product thanks to the augmented layout of :mod:`knng.metrics`), so one block serves both
directions. Then every point's candidates go through the same exact finish as a search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from knng._inputs import InputArray
from knng.engine.common import PreparedCorpus, Progress, corpus_stats, full_precision, is_out_of_memory, select_block
from knng.engine.exact import Candidates, ExactStats, exact_pairs_of, finish_rows
from knng.engine.plan import EnginePlan, TilePlan, make_graph_plan
from knng.engine.screen import block_survivors, row_survivors
from knng.engine.store import CandidateStore, PairErrors, StoreStats, summarize_per_row
from knng.engine.thresholds import seed_candidates
from knng.metrics import Metric
from knng.select import resolve

__all__ = ["GraphReport", "exact_graph", "retry_on_oom", "screen_block", "BlockCandidates", "finish_graph_rows",
           "choose_part_size"]


@dataclass
class GraphReport:
    """How a graph run went: the plan it ran, the symmetric saving, the exactness counters."""

    plan: EnginePlan
    oom_retries: int
    exact: ExactStats
    store: StoreStats = field(default_factory=StoreStats)
    evaluations_per_row: dict[str, float] = field(default_factory=dict)

    @property
    def screen_dtype(self) -> str:
        return self.plan.screen_precision

    @property
    def parts(self) -> int:
        return self.plan.parts

    @property
    def part_size(self) -> int:
        return self.plan.part_size

    @property
    def blocks_computed(self) -> int:
        return self.plan.blocks

    @property
    def blocks_full(self) -> int:
        return self.plan.parts ** 2

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
    plan: EnginePlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor, GraphReport]:
    """Exact k-NN graph of ``data``; returns (indices, float64 distances, report).

    Blocks S(I, I) come first: each point's own part seeds its threshold (the k best-screened
    of its part, by their certified upper bounds) and is screened against it. Then every block
    S(I, J), I < J, once: each entry is tested against the row's τᵢ and the column's τⱼ, and a
    survivor goes to the store of the point whose test it passed.
    """
    n, d = data.n, data.d
    if plan is None:
        plan = make_graph_plan(n=n, d=d, k=k, metric=metric.name, device=device, budget=budget,
                               include_self=include_self, screen_dtype=screen_dtype, part_size=part_size)
    b = plan.part_size
    parts = [(s, min(n, s + b)) for s in range(0, n, b)]
    with full_precision():
        stats = corpus_stats(data, metric, device, symmetric=True, block_rows=max(b, 4096))
        pdata = PreparedCorpus(data, metric, stats.centre, device, resident=plan.corpus_resident,
                               block_rows=max(b, 4096), symmetric=True, dtype=plan.screen_torch_dtype)
        offsets = torch.full((n,), 1.0 if metric.normalize else 0.0, dtype=torch.float64, device=device)
        errors = PairErrors(metric=metric, d=d, unit_roundoff=plan.unit_roundoff, row_norms=pdata.norms,
                            row_terms=pdata.terms, row_offsets=offsets, col_norms=pdata.norms, col_terms=pdata.terms,
                            centre_norm=pdata.centre_norm)

        def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
            return exact_pairs_of(metric, data, rows, data, cols, device)

        store = CandidateStore(n, k, plan.capacity, errors, evaluate, device)
        maxima = [pdata.maxima(i0, i1) for i0, i1 in parts]
        retries = 0
        bar = Progress(progress, total=plan.blocks, desc="knng graph")
        for pi, (i0, i1) in enumerate(parts):
            retries += retry_on_oom(lambda: _diagonal_block(pdata, metric, store, i0, i1, k, include_self, select,
                                                            maxima[pi], device), device)
            bar.update()
        for pi, (i0, i1) in enumerate(parts):
            rows_prep = None
            for pj in range(pi + 1, len(parts)):
                j0, j1 = parts[pj]
                if rows_prep is None:
                    rows_prep = metric.query_layout(pdata.tile(i0, i1), d)
                retries += retry_on_oom(lambda: _off_diagonal_block(pdata, store, rows_prep, i0, i1, j0, j1,
                                                                    maxima[pi], maxima[pj], device), device)
                bar.update()
        bar.close()
        out_idx = torch.empty((n, k), dtype=torch.int64, device=device)
        out_dist = torch.empty((n, k), dtype=torch.float64, device=device)
        chunk = max(1, min(n, (64 << 20) // max(1, plan.capacity * 64)))
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            out_idx[r0:r1], out_dist[r0:r1] = store.finish(torch.arange(r0, r1, device=device))
    exact = ExactStats(rows=n, exact_evaluations=store.stats.exact_evaluations)
    report = GraphReport(plan=plan, oom_retries=retries, exact=exact, store=store.stats,
                         evaluations_per_row=summarize_per_row([store.evaluations_per_row()]))
    return out_idx, out_dist, report


def _diagonal_block(pdata: PreparedCorpus, metric: Metric, store: CandidateStore, i0: int, i1: int, k: int,
                    include_self: bool, select: str, maxima: tuple[float, float], device: torch.device) -> None:
    """Block S(I, I): seed the part's thresholds from its own k best, then screen it."""
    prep = pdata.tile(i0, i1)
    scores = metric.query_layout(prep, pdata.corpus.d) @ prep.T
    m = i1 - i0
    if not include_self:
        scores.diagonal().fill_(torch.inf)  # by index, not by distance: duplicates stay
    rows = torch.arange(i0, i1, device=device)
    ks = min(k, m if include_self else m - 1)
    if ks >= 1:
        values, positions = seed_candidates(scores, ks, select, device)
        store.seed(rows, positions + i0, values)
    found = row_survivors(scores, store.screen_thresholds(rows, *maxima))
    owner, other, keys = found.owner, found.other, found.keys
    if not include_self:
        keep = owner != other
        owner, other, keys = owner[keep], other[keep], keys[keep]
    store.add(owner + i0, other + i0, keys)


def _off_diagonal_block(pdata: PreparedCorpus, store: CandidateStore, rows_prep: torch.Tensor, i0: int, i1: int,
                        j0: int, j1: int, maxima_i: tuple[float, float], maxima_j: tuple[float, float],
                        device: torch.device) -> None:
    """Block S(I, J), I < J: each entry tested for its row (part I) and its column (part J)."""
    scores = rows_prep @ pdata.tile(j0, j1).T
    rows = torch.arange(i0, i1, device=device)
    cols = torch.arange(j0, j1, device=device)
    by_row, by_col = block_survivors(scores, store.screen_thresholds(rows, *maxima_j),
                                     store.screen_thresholds(cols, *maxima_i))
    store.add(torch.cat([by_row.owner + i0, by_col.owner + j0]), torch.cat([by_row.other + j0, by_col.other + i0]),
              torch.cat([by_row.keys, by_col.keys]))


def retry_on_oom(step: Callable[[], None], device: torch.device, attempts: int = 3) -> int:
    """Run ``step``; after a device out-of-memory error free the allocator's cache and run it again.

    Returns the number of retries. ``step`` must be safe to repeat after a failure: the graph's
    block steps compute their product and screen before they change the store.
    """
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
