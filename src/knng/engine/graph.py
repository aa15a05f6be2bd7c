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
    EngineReport, PreparedCorpus, Progress, corpus_stats, full_precision, is_out_of_memory,
)
from knng.engine.exact import ExactStats, exact_pairs_of
from knng.engine.plan import EnginePlan, make_graph_plan
from knng.engine.screen import block_scores, row_survivors, screen_pairs, screen_rows, use_kernel
from knng.engine.store import CandidateStore, PairErrors, summarize_per_row
from knng.engine.thresholds import seed_candidates
from knng.metrics import Metric, ScreenPrecision

__all__ = ["GraphReport", "exact_graph", "retry_on_oom", "screen_own_part", "OWN_PART_SEED"]

#: Columns of a part that seed its rows' thresholds when the fused kernel screens the part's own
#: block (the torch screen seeds from the whole block it materialises anyway).
OWN_PART_SEED = 4096


@dataclass
class GraphReport(EngineReport):
    """How a graph run went: the report of a search plus the symmetric saving."""

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
    screen_dtype: "torch.dtype | str | None" = None,
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
        precision = plan.precision
        errors = PairErrors(metric=metric, d=d, precision=precision, row_norms=pdata.norms,
                            row_terms=pdata.terms, row_offsets=offsets, col_norms=pdata.norms, col_terms=pdata.terms,
                            centre_norm=pdata.centre_norm)

        def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
            return exact_pairs_of(metric, data, rows, data, cols, device)

        store = CandidateStore(n, k, plan.capacity, errors, evaluate, device, pending=plan.pending_pairs)
        maxima = [pdata.maxima(i0, i1) for i0, i1 in parts]
        retries = 0
        bar = Progress(progress, total=plan.blocks, desc="knng graph")
        for pi, (i0, i1) in enumerate(parts):
            retries += retry_on_oom(lambda: screen_own_part(pdata.tile(i0, i1), d, metric, store, i0, i0, k,
                                                            include_self, select, maxima[pi], device,
                                                            precision=precision, terms=_part(pdata.terms32, i0, i1)),
                                    device)
            bar.update()
        for pi, (i0, i1) in enumerate(parts):
            rows_prep = None
            for pj in range(pi + 1, len(parts)):
                j0, j1 = parts[pj]
                if rows_prep is None:
                    rows_prep = metric.query_layout(pdata.tile(i0, i1), d)
                retries += retry_on_oom(lambda: _off_diagonal_block(pdata, store, rows_prep, i0, i1, j0, j1,
                                                                    maxima[pi], maxima[pj], precision, device), device)
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
                         evaluations_per_row=summarize_per_row([store.evaluations_per_row()]),
                         screened_per_row=summarize_per_row([store.screened_per_row()]))
    return out_idx, out_dist, report


def screen_own_part(prep: torch.Tensor, d: int, metric: Metric, store: CandidateStore, store_base: int,
                    col_base: int, k: int, include_self: bool, select: str, maxima: tuple[float, float],
                    device: torch.device, sub_rows: int | None = None, *, precision: ScreenPrecision,
                    terms: torch.Tensor | None = None) -> None:
    """Block S(J, J) of one part: seed its rows' thresholds from their own part, then screen it.

    ``prep`` is the part in the corpus layout (input dimension ``d``); its row t is store row
    ``store_base + t`` and column id ``col_base + t``; ``terms`` its float32 terms (fused
    precisions). Rows go ``sub_rows`` at a time; each step changes the store only after its
    product and screen, so it may be retried whole.

    The torch screen materialises the block once: the k best of each row seed its threshold
    and the same block is screened. The fused kernel never materialises it, so the seeds come
    from at most :data:`OWN_PART_SEED` evenly spaced columns of the part (a product of the
    reference form), and the kernel screens the whole block against them.
    """
    m = prep.shape[0]
    queries = metric.query_layout(prep, d)
    step = m if sub_rows is None else max(1, sub_rows)
    ks = min(k, m if include_self else m - 1)
    whole = not (use_kernel(precision, device) and m > OWN_PART_SEED)
    if whole:
        seed_cols, seed_prep, seed_terms = torch.arange(m, device=device), prep, terms
    else:
        seed_cols = torch.linspace(0, m - 1, OWN_PART_SEED, device=device).round().long().unique()
        seed_prep, seed_terms = prep[seed_cols], None if terms is None else terms[seed_cols]
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        local = torch.arange(r0, r1, device=device)
        rows = local + store_base
        row_terms = None if terms is None else terms[r0:r1]
        scores = block_scores(queries[r0:r1], seed_prep, d, precision, row_terms, seed_terms)
        if not include_self:
            # By index, not by distance: duplicates stay.
            if whole:
                scores[local - r0, local] = torch.inf
            else:
                scores.masked_fill_(seed_cols[None, :] == local[:, None], torch.inf)
        if ks >= 1:
            values, positions = seed_candidates(scores, min(ks, scores.shape[1]), select, device)
            store.seed(rows, seed_cols[positions] + col_base, values)
        if whole:
            found = row_survivors(scores, store.screen_thresholds(rows, *maxima))
            owner, other, keys = found.owner + r0, found.other, found.keys
            if not include_self:
                keep = owner != other
                owner, other, keys = owner[keep], other[keep], keys[keep]
        else:
            del scores
            found = screen_rows(queries[r0:r1], prep, d, store.screen_thresholds(rows, *maxima), precision,
                                row_terms=row_terms, col_terms=terms,
                                exclude_diagonal=None if include_self else -r0)
            owner, other, keys = found.owner + r0, found.other, found.keys
        store.add(owner + store_base, other + col_base, keys)


def _part(values: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    return None if values is None else values[start:stop]


def _off_diagonal_block(pdata: PreparedCorpus, store: CandidateStore, rows_prep: torch.Tensor, i0: int, i1: int,
                        j0: int, j1: int, maxima_i: tuple[float, float], maxima_j: tuple[float, float],
                        precision: ScreenPrecision, device: torch.device) -> None:
    """Block S(I, J), I < J: each entry tested for its row (part I) and its column (part J)."""
    rows = torch.arange(i0, i1, device=device)
    cols = torch.arange(j0, j1, device=device)
    by_row, by_col = screen_pairs(rows_prep, pdata.tile(j0, j1), pdata.corpus.d,
                                  store.screen_thresholds(rows, *maxima_j), store.screen_thresholds(cols, *maxima_i),
                                  precision, row_terms=_part(pdata.terms32, i0, i1),
                                  col_terms=_part(pdata.terms32, j0, j1))
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
