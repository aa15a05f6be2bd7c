"""Single-device exact search: queries × corpus, tile by tile, then the exact finish.

Flow (one way): corpus pass (finite check, centre) → prepared corpus (resident or streamed)
→ for each query chunk: prepare queries → for each corpus tile: one matrix product → select
→ merge → exact finish (certificate, re-rank, fall-back) → results.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from knng._inputs import InputArray, check_finite
from knng.engine.common import (
    MAX_SCREEN_NORM,
    PreparedCorpus, Progress, choose_screen_dtype, corpus_stats, full_precision, is_out_of_memory,
    merge_topk, select_block,
)
from knng.engine.exact import Candidates, ExactStats, finish_rows
from knng.engine.plan import TilePlan, candidate_count, plan_tiles
from knng.metrics import Metric
from knng.select import resolve

__all__ = ["SearchReport", "exact_search", "prepare_corpus", "Float64Refiner"]


@dataclass
class SearchReport:
    """How a run went: the plan used, OOM retries, and the exactness counters."""

    plan: TilePlan
    oom_retries: int
    exact: ExactStats
    candidates_per_row: int
    screen_dtype: str = "float32"


def exact_search(
    queries: InputArray,
    corpus: InputArray,
    k: int,
    metric: Metric,
    device: torch.device,
    select: str,
    budget: int,
    progress: bool = False,
    screen_dtype: torch.dtype | None = None,
    prepared: PreparedCorpus | None = None,
) -> tuple[torch.Tensor, torch.Tensor, SearchReport]:
    """Exact k nearest corpus vectors of every query; returns (indices, float64 distances, report).

    ``prepared`` reuses a corpus already prepared for this metric and screen precision (the
    float64 re-screen of failing rows prepares it once for all query chunks).
    """
    dtype = screen_dtype or choose_screen_dtype(device, corpus.n, corpus.d, k)
    kc = candidate_count(k, corpus.n, dtype)
    plan = plan_tiles(n_queries=queries.n, n_corpus=corpus.n, d=corpus.d, k_cand=kc, budget=budget,
                      device=device, element_bytes=dtype.itemsize)
    with full_precision():
        if not queries.in_memory:
            # Lazy queries (memory maps, datasets) are checked up front, so that a NaN in the
            # last row is reported before the work rather than after it.
            for start, block in queries.iter_blocks(max(plan.query_rows, 4096)):
                check_finite(block, queries.name, start)
        pcorpus = prepared or prepare_corpus(corpus, metric, device, dtype, plan.corpus_resident,
                                             block_rows=max(plan.corpus_cols, 4096))
        out_idx = torch.empty((queries.n, k), dtype=torch.int64, device=device)
        out_dist = torch.empty((queries.n, k), dtype=torch.float64, device=device)
        exact_stats = ExactStats()
        retries = 0
        # After a float32 screen, rows that fail the certificate get a float64 screen of their own.
        refine = None if dtype == torch.float64 else Float64Refiner(queries.name, corpus, k, metric, device,
                                                                     select, budget)
        bar = Progress(progress, total=queries.n, desc="knng search")
        q0 = 0
        while q0 < queries.n:
            q1 = min(queries.n, q0 + plan.query_rows)
            try:
                raw = queries.rows(q0, q1).to(device, non_blocking=True)
                check_finite(raw, queries.name, q0)
                cands = _screen_chunk(raw, pcorpus, metric, kc, plan, select, device)
                idx, dist, st = finish_rows(cands, torch.arange(q0, q1, device=device), raw, pcorpus, metric,
                                            k, corpus.n, exclude_self=False, device=device, refine=refine)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
                if not is_out_of_memory(exc):
                    raise
                plan = plan.shrunk()
                retries += 1
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            out_idx[q0:q1] = idx
            out_dist[q0:q1] = dist
            exact_stats.add(st)
            bar.update(q1 - q0)
            q0 = q1
        bar.close()
    return out_idx, out_dist, SearchReport(plan, retries, exact_stats, kc, str(dtype).replace("torch.", ""))


def prepare_corpus(corpus: InputArray, metric: Metric, device: torch.device, dtype: torch.dtype,
                   resident: bool, block_rows: int) -> PreparedCorpus:
    """One pass for the finite check and the centre, then the corpus in the screen's layout."""
    stats = corpus_stats(corpus, metric, device, symmetric=False, block_rows=block_rows)
    return PreparedCorpus(corpus, metric, stats.centre, device, resident=resident, block_rows=block_rows,
                          symmetric=False, dtype=dtype)


class Float64Refiner:
    """Exact top-k of rows that failed the float32 certificate, by a float64 screen of their own.

    Called once per chunk with failing rows; the corpus is prepared in float64 on the first call
    and reused. With ``exclude`` (a graph's own row ids) it asks for k + 1 and drops each row's
    own index: the first k of the rest are the row's k nearest others, duplicates included.
    """

    def __init__(self, name: str, corpus: InputArray, k: int, metric: Metric, device: torch.device,
                 select: str, budget: int, exclude_self: bool = False) -> None:
        self.name, self.corpus, self.k, self.metric = name, corpus, k, metric
        self.device, self.select, self.budget, self.exclude_self = device, select, budget, exclude_self
        self.prepared: PreparedCorpus | None = None

    def __call__(self, rows: torch.Tensor, row_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, ExactStats]:
        corpus = self.corpus
        if self.prepared is None:
            resident = corpus.n * (corpus.d * 8 + 24) <= self.budget // 4
            self.prepared = prepare_corpus(corpus, self.metric, self.device, torch.float64, resident,
                                           block_rows=4096)
        sub = InputArray(self.name, "torch", (rows.shape[0], corpus.d), rows.dtype, rows.device, tensor=rows)
        kk = self.k + 1 if self.exclude_self else self.k
        idx, dist, report = exact_search(sub, corpus, kk, self.metric, self.device, self.select, self.budget,
                                         screen_dtype=torch.float64, prepared=self.prepared)
        if self.exclude_self:
            own = idx == row_ids.to(idx.device)[:, None]
            order = torch.argsort(own.to(torch.int8), dim=1, stable=True)  # others first, in order
            idx = torch.gather(idx, 1, order)[:, :self.k]
            dist = torch.gather(dist, 1, order)[:, :self.k]
        return idx, dist, report.exact


def _screen_chunk(raw: torch.Tensor, pcorpus: PreparedCorpus, metric: Metric, kc: int, plan: TilePlan,
                  select: str, device: torch.device) -> Candidates:
    """Screen one chunk of queries against every corpus tile; keep kc candidates per row."""
    prep = metric.prepare(raw, pcorpus.centre, side="query", symmetric=False, dtype=pcorpus.dtype)
    if float(prep.norms.max()) > MAX_SCREEN_NORM:
        raise ValueError(f"queries have vectors of norm up to {float(prep.norms.max()):.3g} (after centring): "
                         f"too large to screen in float32 (limit {MAX_SCREEN_NORM:.0e}); rescale the data")
    n = pcorpus.corpus.n
    vals = idx = None
    floor = torch.full((raw.shape[0],), torch.inf, dtype=torch.float64, device=device)
    for c0 in range(0, n, plan.corpus_cols):
        c1 = min(n, c0 + plan.corpus_cols)
        scores = prep.vectors @ pcorpus.tile(c0, c1).T
        kt = min(kc, c1 - c0)
        selector = resolve(select, rows=scores.shape[0], cols=scores.shape[1], k=kt, device=device)
        v, i, block_floor = select_block(selector, scores, kt)
        if block_floor is not None and kt < c1 - c0:
            floor = torch.minimum(floor, block_floor)
        vals, idx = merge_topk(vals, idx, v, i + c0, kc)
    return Candidates(values=vals, indices=idx, row_norms=prep.norms, row_terms=None, row_offsets=prep.offsets,
                      floor=floor)
