"""Single-device exact search: one threshold screen of the corpus per query chunk.

Flow (one way): corpus pass (finite check, centre) → prepared corpus (resident or streamed)
→ for each query chunk: prepare queries → thresholds τ from a random sample of columns →
for each corpus tile: one matrix product → threshold screen → the rows' candidate stores
(tightening as they fill) → exact finish of each row's store → results.

Tiles first (``plan.tiles_first``: a resident corpus of at most 16,384 tiles of 128 columns
on the wgmma kernel, ``plan.tiles_first``): no sample; each row's minimum key in
every corpus tile, τ from the k-th smallest of them, then only the tiles whose minimum is within
the row's threshold are screened (:func:`_screen_tiles_first`).

The direct path (``plan.direct``, small calls: :func:`~knng.engine.search.direct.direct_neighbours`):
every score in one product, each row's k + m best, a certificate that they hold its k nearest,
the exact finish; a small graph runs it too (``knng.engine.graph.rows.direct_graph``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import numpy as np
import torch

from knng._inputs import READ_AHEAD, InputArray, check_finite, rows_on
from knng.engine import stages
from knng.engine.checkpoint import Checkpoint
from knng.engine.common import (
    MAX_SCREEN_NORM, EngineReport, PreparedCorpus, Progress, corpus_stats, device_block_rows, full_precision,
    on_device, recover_from_oom, TF32_EXACT_SAMPLES, tf32_products,
)
from knng.engine.exact import ExactStats, exact_pairs
from knng.engine.plan import EnginePlan, after_out_of_memory, make_search_plan
from knng.engine.search.direct import direct_neighbours
from knng.engine.screen import (
    block_scores, screen_rows, screen_tiles, strip_minima, tile_minima,
)
from knng.engine.store import (
    CandidateStore, Holding, HoldingStore, PairErrors, StoreStats, candidate_store, summarize_per_row_each,
)
from knng.engine.thresholds import sample_columns, seed_candidates, strip_candidates
from knng.metrics import PRECISIONS, Metric, Prepared, ScreenPrecision
from knng._options import get_options
from knng.engine.kernels import (
    kth_of_rows, kth_seeds_run, prepare_rows, screen_kernel_runs, strip_seeds_run, strip_width,
)

__all__ = ["SearchReport", "SeedSample", "exact_search", "prepare_corpus", "seed_sample"]

# ``Options.tf32_sample``: the sample's product of a TF32 screen runs on TF32 tensor cores: its
# keys need only the TF32 bound, which the store's radii use anyway (1M × 128, 10k queries,
# k = 10, H100: 6.5 → 3.4 ms). Taking each tile's survivors into the store before the next tile
# (tighter thresholds sooner: 220 → 85 pairs screened per row) and tiles growing from a quarter
# width were measured too and lost: the store's updates cost more (5.6 → 26–32 ms) than the
# screen saved (47 → 35 ms).
#
# ``Options.tighten_on``: device types on which the screen tightens the thresholds itself: the
# store holds the survivors back (:class:`~knng.engine.store.Holding`), after every corpus tile
# τ of each row becomes the k-th key among the survivors of the tiles so far (plus a radius,
# :meth:`CandidateStore.tighten_held`), the survivors are re-screened against it, and the
# finish evaluates every one left exactly instead of taking them through the store. The k-th
# of a tile of 262,144 columns bounds tighter than the sample's 65,536 (1M × 128, 10k queries,
# TF32, H100: 220 → 105 pairs screened per row at k = 10); re-screening what the
# tiles let through leaves a little more than k per row (float16, H100: 213 → 13
# at k = 10, 8,016 → 1,248 at k = 1,024), and with the finish without the store k = 10 / 100 /
# 1,024 / 2,048 went from 25–31 / 36–40 / 109–113 / 196–202 ms to 22–25 / 28–32 / 66–70 /
# 104–105 (``bench/ab_search.py``, docs/FINDINGS.md, "Stores and survivors"). On a CPU
# (64k × 64, 10k queries) the tiles are narrower than the sample and the store's capacity keeps
# rows small as they fill, so the CPU keeps the store's path.
#
# ``Options.rest_at_once``: after the first tile, a kernel screen (no score block) takes the rest
# of a resident corpus in one launch instead of tiles of the plan's width: each tile costs its
# thresholds, its lists and a synchronisation (1M × 128, 10k queries, float16, H100: four tiles
# of 2¹⁸ took 10–12 ms of screen where the kernel alone takes 7.6).


@dataclass
class SearchReport(EngineReport):
    """How a search went (see :class:`EngineReport`)."""


@stages.recorded
def exact_search(
    queries: InputArray,
    corpus: InputArray,
    k: int,
    metric: Metric,
    device: torch.device,
    select: str,
    budget: int,
    progress: "bool | Progress" = False,
    screen_dtype: "torch.dtype | str | None" = None,
    prepared: PreparedCorpus | None = None,
    plan: EnginePlan | None = None,
    checkpoint: Checkpoint | None = None,
    keep_checkpoint: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, SearchReport]:
    """Exact k nearest corpus vectors of every query; returns (indices, float64 distances, report).

    ``prepared`` reuses a corpus already prepared for this metric and screen precision (the
    distributed search prepares each shard once for all query chunks). ``checkpoint``: where
    finished query rows are recorded, and how many a resumed run has already
    (:mod:`knng.engine.checkpoint`); ``keep_checkpoint``: also record the last rows, so that a
    run killed after this call returns (before its results are written) resumes at once.
    """
    if plan is None:
        plan = make_search_plan(n_queries=queries.n, n_corpus=corpus.n, d=corpus.d, k=k, metric=metric.name,
                                device=device, budget=budget, screen_dtype=screen_dtype)
    if plan.direct:
        found = _direct_search(queries, corpus, k, metric, device, select, plan, progress)
        if found is not None:
            return found
        plan = replace(plan, direct=False)  # an input that is not finite: the pipeline names it
    with on_device(device), full_precision():
        if not queries.in_memory:
            # Lazy queries (memory maps, datasets) are checked up front, so that a NaN in the
            # last row is reported before the work rather than after it.
            for start, block in queries.iter_blocks(plan.read_rows, read_ahead=READ_AHEAD):
                check_finite(block, queries.name, start)
        pcorpus = prepared or prepare_corpus(corpus, metric, device, plan.precision, plan.corpus_resident,
                                             block_rows=plan.read_rows, queries=queries)
        metric = pcorpus.metric  # integer rows: the metric that prepares them
        if plan.tiles_first:
            if pcorpus.resident is None:
                raise ValueError("a tiles-first plan needs the corpus prepared on the device (a resident corpus)")
            sample = None
        else:
            sample = seed_sample(corpus, pcorpus, metric, plan.precision, plan.sample_size, device)
        out_idx = torch.empty((queries.n, k), dtype=torch.int64, device=device)
        out_dist = torch.empty((queries.n, k), dtype=torch.float64, device=device)
        exact_stats, store_stats = ExactStats(), StoreStats()
        per_row: list[torch.Tensor] = []
        screened: list[torch.Tensor] = []
        retries = 0
        planned, replans = plan, []
        bar = Progress.of(progress, total=queries.n, desc="knng search")
        q0 = 0
        finished = None if checkpoint is None else _FinishedRows(checkpoint, queries.n, k, keep_checkpoint)
        if finished is not None and checkpoint is not None and checkpoint.resumed:
            with checkpoint.restoring():
                q0, retries = finished.restore(out_idx, out_dist, exact_stats, store_stats, per_row, screened)
            bar.update(q0)
        resumed_from = q0
        while q0 < queries.n:
            q1 = min(queries.n, q0 + plan.query_rows)
            try:
                raw = queries.rows(q0, q1).to(device, non_blocking=True)
                check_finite(raw, queries.name, q0)
                store = _screen_chunk(raw, pcorpus, sample, metric, k, plan, select, device)
                idx, dist = store.finish()
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried, with smaller tiles
                smaller = after_out_of_memory(plan)
                recover_from_oom(exc, device, can_retry=smaller is not None)
                plan = smaller
                replans.append(plan)
                retries += 1
                continue
            out_idx[q0:q1] = idx
            out_dist[q0:q1] = dist
            exact_stats.rows += q1 - q0
            exact_stats.exact_evaluations += store.stats.exact_evaluations
            store_stats.add(store.stats)
            per_row.append(store.evaluations_per_row())
            screened.append(store.screened_per_row())
            if finished is not None:
                finished.record(q0, q1, idx, dist, per_row[-1], screened[-1], exact_stats, store_stats, retries)
            bar.update(q1 - q0)
            q0 = q1
        bar.close()
    evaluated, screened_summary = summarize_per_row_each([per_row, screened])
    return out_idx, out_dist, SearchReport(planned, retries, exact_stats, store_stats, evaluated, screened_summary,
                                         {} if finished is None else finished.checkpoint.summary(resumed_from),
                                         replans=replans)


def _direct_search(queries: InputArray, corpus: InputArray, k: int, metric: Metric, device: torch.device, select: str,
                   plan: EnginePlan, progress: "bool | Progress"
                   ) -> tuple[torch.Tensor, torch.Tensor, SearchReport] | None:
    """A search by the direct path (:func:`direct_neighbours`); the rows it cannot certify go
    through the rest of the plan. None where an input is not finite."""
    with on_device(device), full_precision():
        found = direct_neighbours(queries, corpus, k, metric, device, plan.work_bytes, select)
    if found is None:
        return None
    per_row = found.per_row()
    report = SearchReport(plan, 0, found.stats, evaluations_per_row=per_row, screened_per_row=per_row,
                          rounded_as_exact=found.rounded)
    if found.failed.numel():
        rows = found.failed
        idx, dist, rest = exact_search(rows_on(queries, device, rows), corpus, k, metric, device, select, plan.budget, progress,
                                       plan=replace(plan, direct=False, n_queries=rows.numel()))
        found.indices[rows], found.distances[rows] = idx.to(device), dist.to(device)
        report.exact.add(rest.exact)
        report = replace(report, store=rest.store, replans=rest.replans, oom_retries=rest.oom_retries)
    return found.indices, found.distances, report


#: The plan's account of a search's thresholds when its tiles go first.

def prepare_corpus(corpus: InputArray, metric: Metric, device: torch.device, precision: ScreenPrecision,
                   resident: bool, block_rows: int, queries: InputArray | None = None) -> PreparedCorpus:
    """One pass for the finite check and the centre, then the corpus in the layout of the screen
    of ``precision``.

    A corpus that already lies on the GPU and stays there goes in the larger blocks of
    :func:`~knng.engine.common.device_block_rows`, not the plan's reads. Integer rows
    (``int8``) are centred on an integer point that puts the corpus's and the ``queries``'
    values in int8's range (a clear error where they do not fit), and prepared by the metric
    with ``integers`` (the prepared corpus's ``metric``, which the queries' preparation takes).
    """
    if resident:
        block_rows = device_block_rows(corpus, device, block_rows)
    stats = corpus_stats(corpus, metric, device, symmetric=False, block_rows=block_rows,
                         integers=precision.integers, also=queries if precision.integers else None)
    centre = stats.centre
    if precision.integers:
        centre = stats.integer_centre()
        metric = replace(metric, integers=True)
    return PreparedCorpus(corpus, metric, centre, device, resident=resident, block_rows=block_rows,
                          symmetric=False, dtype=precision.storage)


@dataclass
class SeedSample:
    """The random corpus columns whose k best screened keys seed a search's thresholds.

    ``vectors`` are prepared for the screen of ``precision``: the search's own, except for the
    digit screens, whose sample is prepared and screened in float32 (one cuBLAS product; the
    digit products of a 10k × 65k sample took 28 ms on an H100 where the float32 one takes
    5). Seeds need only a certified upper bound of k columns' keys, so their radii come from
    the sample's own precision and norms (``norms``, ``terms``: float64, per sample column;
    None where the store's own radii apply).
    """

    columns: torch.Tensor
    vectors: torch.Tensor
    terms32: torch.Tensor | None
    precision: ScreenPrecision
    norms: torch.Tensor | None = None
    terms: torch.Tensor | None = None


def seed_sample(corpus: InputArray, pcorpus: PreparedCorpus, metric: Metric, precision: ScreenPrecision, size: int,
                device: torch.device) -> SeedSample:
    """Draw ``size`` random corpus columns and prepare them for the seeds' product (see :class:`SeedSample`)."""
    columns = sample_columns(corpus.n, size, device)
    if not precision.digits:
        return SeedSample(columns, pcorpus.take(columns), None if pcorpus.terms32 is None else pcorpus.terms32[columns],
                          precision)
    prep = metric.prepare(corpus.take(columns).to(device), pcorpus.centre, side="corpus", symmetric=False,
                          dtype=torch.float32)
    return SeedSample(columns, prep.vectors, None, PRECISIONS["float32"], prep.norms, prep.terms)


def _seed_from_sample(store: CandidateStore, raw: torch.Tensor, prep: Prepared, pcorpus: PreparedCorpus,
                      sample: SeedSample, metric: Metric, k: int, select: str, device: torch.device) -> None:
    """Seed every row's threshold from the k best-screened columns of the sample."""
    rows = torch.arange(raw.shape[0], device=device)
    precision, d = sample.precision, pcorpus.corpus.d
    queries, norms = prep.vectors, None
    if sample.norms is not None:
        own = metric.prepare(raw, pcorpus.centre, side="query", symmetric=False, dtype=sample.vectors.dtype)
        queries, norms = own.vectors, own.norms
    if norms is None and strip_seeds_run(device, precision, sample.columns.numel(), k):
        # The kernel's strip minima of the sample: no block is written (10k queries × 65,536
        # columns at k = 100: 2.6 GB of keys, their terms and a selection over them).
        kth = kth_seeds_run(device, raw.shape[0], -(-sample.columns.numel() // strip_width()), k)
        # Where each row's k-th strip minimum alone seeds it, its radius takes the corpus's
        # largest norm and term (the sample's columns are the corpus's), read before the
        # sample's product is queued: a read after it would wait for it (a one-tile screen asks
        # for the same range next).
        maxima = pcorpus.maxima(0, pcorpus.corpus.n) if kth else None
        keys, cols = strip_minima(queries, sample.vectors, d, precision, col_terms=sample.terms32)
        if maxima is not None:  # no k columns gathered
            store.tighten_ends(*kth_of_rows(keys, k), *maxima, counted=False)
            return
        values, positions = strip_candidates(keys, cols, k)
    else:
        # The sample's product of a TF32 screen runs on TF32 tensor cores (Options.tf32_sample).
        tf32 = get_options().tf32_sample and precision.name in TF32_EXACT_SAMPLES and device.type == "cuda"
        with tf32_products() if tf32 else contextlib.nullcontext():
            scores = block_scores(queries, sample.vectors, d, precision, col_terms=sample.terms32)
        values, positions = seed_candidates(scores, min(k, scores.shape[1]), select, device)
        del scores
    rad = None
    if norms is not None:  # the sample's own precision and norms (see SeedSample)
        pair_rows = rows[:, None].expand_as(positions)
        rad = replace(store.errors, precision=precision).radius(
            norms[pair_rows], sample.norms[positions], None, None if sample.terms is None else sample.terms[positions],
            values, pair_rows)
    store.seed(rows, sample.columns[positions], values, rad)


def _screen_chunk(raw: torch.Tensor, pcorpus: PreparedCorpus, sample: SeedSample | None, metric: Metric, k: int,
                  plan: EnginePlan, select: str, device: torch.device) -> CandidateStore:
    """Screen one chunk of queries against every corpus tile into a store of candidates (where
    the tiles tighten the thresholds, ``Options.tighten_on``, one that holds them back). Without a
    ``sample``, tiles first (``plan.tiles_first``)."""
    prep = prepare_rows(metric, raw, pcorpus.centre, side="query", symmetric=False, dtype=pcorpus.dtype)
    if float(prep.norms.max()) > MAX_SCREEN_NORM:
        raise ValueError(f"queries have vectors of norm up to {float(prep.norms.max()):.3g} (after centring): "
                         f"too large to screen in float32 (limit {MAX_SCREEN_NORM:.0e}); rescale the data")
    corpus = pcorpus.corpus
    m = raw.shape[0]
    precision = plan.precision
    errors = PairErrors(metric=metric, d=corpus.d, precision=precision, row_norms=prep.norms,
                        row_terms=None, row_offsets=prep.offsets, col_norms=pcorpus.norms, col_terms=pcorpus.terms,
                        centre_norm=pcorpus.centre_norm)

    def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        return exact_pairs(metric, raw, rows, corpus, cols, device, plan.work_bytes)

    # Where the tiles tighten the thresholds themselves, the store holds the survivors back and
    # this loop tightens after each tile, against the columns screened so far.
    tightening = device.type in get_options().tighten_on
    store = candidate_store(m, k, plan.capacity, errors, evaluate, device, pending=plan.pending_pairs,
                            work_bytes=plan.work_bytes, holding=Holding(limit=get_options().held_limit) if tightening else None)
    rows = torch.arange(m, device=device)
    if sample is None:
        _screen_tiles_first(store, rows, prep, pcorpus, precision)
        return store
    # Thresholds: the k best-screened columns of a random sample bound each row's k-th.
    _seed_from_sample(store, raw, prep, pcorpus, sample, metric, k, select, device)
    terms = pcorpus.terms32
    # A kernel screen writes no score block: once the first tile's survivors have tightened the
    # thresholds, the rest of a resident corpus goes in one launch (Options.rest_at_once).
    rest_at_once = get_options().rest_at_once and screen_kernel_runs(device, precision) and tightening
    seen = (0.0, 0.0)  # the largest norm and |term| of the columns screened so far
    for c0, c1, tile in pcorpus.tiles(plan.corpus_cols, rest_at_once=rest_at_once):
        maxima = pcorpus.maxima(c0, c1)
        found = screen_rows(prep.vectors, tile, corpus.d, store.screen_thresholds(rows, *maxima), precision,
                            col_terms=None if terms is None else terms[c0:c1])
        store.add(found.owner, found.other + c0, found.keys)
        if isinstance(store, HoldingStore):
            seen = (max(seen[0], maxima[0]), max(seen[1], maxima[1]))
            store.tighten_held(seen)
    return store


def _screen_tiles_first(store: CandidateStore, rows: torch.Tensor, prep: Prepared, pcorpus: PreparedCorpus,
                        precision: ScreenPrecision) -> None:
    """A chunk's screen of a resident corpus, tiles first (``plan.tiles_first``): each row's
    smallest key in every corpus tile (``screen.tile_minima``); τ from the k-th smallest of them
    (k distinct columns; the radius takes the corpus's largest norm and term:
    :meth:`~knng.engine.store.CandidateStore.tighten_ends`); then only the tiles whose minimum is
    within the row's screen threshold (``screen.screen_tiles``, which keeps every pair the full
    screen would). The held survivors are not tightened: about 1.3 k a row are left, and the
    finish evaluating them all is cheaper than selecting the k-th of each row and compacting
    (H200, 200k × 128 graph by rows, k = 64 / 100 / 300: 44.4 / 50.2 / 87.6 ms against 47.1 /
    53.6 / 93.0 with the tightening). ``rows``: the store's rows, 0 … m − 1."""
    corpus, vectors = pcorpus.corpus, pcorpus.resident
    assert vectors is not None
    maxima = pcorpus.maxima(0, corpus.n)
    terms = pcorpus.terms32
    keys = tile_minima(prep.vectors, vectors, corpus.d, precision, col_terms=terms)
    store.tighten_ends(*kth_of_rows(keys, store.k), *maxima, counted=False)
    # About 1.3 k survivors a row (a 200k graph by rows at k = 100: 128 for 101).
    found = screen_tiles(prep.vectors, vectors, corpus.d, keys, store.screen_thresholds(rows, *maxima), precision,
                         col_terms=terms, capacity_hint=2 * store.k * store.n)
    del keys
    store.add(found.owner, found.other, found.keys)


class _FinishedRows:
    """A search's finished query rows in a checkpoint: results go into growing arrays of the
    work area chunk by chunk; a checkpoint records how many rows are final (and the counters)."""

    def __init__(self, checkpoint: Checkpoint, n: int, k: int, keep: bool) -> None:
        self.checkpoint, self.keep = checkpoint, keep
        self.idx = checkpoint.growing("indices", (n, k), "int64")
        self.dist = checkpoint.growing("distances", (n, k), "float64")
        self.evaluations = checkpoint.growing("evaluations", (n,), "int64")
        self.screened = checkpoint.growing("screened", (n,), "int64")

    def record(self, q0: int, q1: int, idx: torch.Tensor, dist: torch.Tensor, evaluations: torch.Tensor,
               screened: torch.Tensor, exact_stats: ExactStats, store_stats: StoreStats, retries: int) -> None:
        """Rows ``q0:q1`` are final; save a checkpoint if one is due (or these are the last of a
        checkpoint that is kept)."""
        self.idx[q0:q1] = idx.cpu().numpy()
        self.dist[q0:q1] = dist.cpu().numpy()
        self.evaluations[q0:q1] = evaluations.cpu().numpy()
        self.screened[q0:q1] = screened.cpu().numpy()
        n = self.idx.shape[0]
        if self.checkpoint.due() or (q1 == n and self.keep):
            self.checkpoint.save({"step": q1, "progress": f"{q1:,} of {n:,} queries done", "retries": retries,
                                  "exact": vars(exact_stats), "store": vars(store_stats)}, final_rows=q1)

    def restore(self, out_idx: torch.Tensor, out_dist: torch.Tensor, exact_stats: ExactStats,
                store_stats: StoreStats, per_row: list[torch.Tensor], screened: list[torch.Tensor]) -> tuple[int, int]:
        """Copy the saved rows into the outputs and counters; returns (rows done, retries)."""
        state = self.checkpoint.state
        assert state is not None
        q0 = self.checkpoint.check_step(self.idx.shape[0])
        device = out_idx.device
        out_idx[:q0] = torch.from_numpy(np.array(self.idx[:q0])).to(device)
        out_dist[:q0] = torch.from_numpy(np.array(self.dist[:q0])).to(device)
        per_row.append(torch.from_numpy(np.array(self.evaluations[:q0])).to(device))
        screened.append(torch.from_numpy(np.array(self.screened[:q0])).to(device))
        for field, value in state["exact"].items():
            setattr(exact_stats, field, int(value))
        for field, value in state["store"].items():
            setattr(store_stats, field, int(value))
        return q0, int(state["retries"])
