"""The exact k-NN graph of one device's data: :func:`exact_graph`, by symmetric blocks.

The data are split into P parts; only the blocks S(I, J) with I ≤ J are computed. Each block
gives the row candidates of part I and the column candidates of part J (a column of S(I, J) is a
row of S(J, I)), so every pair is screened once for each of its two points and the matrix
products halve. The screening score is the full symmetric form q_i + r_j + α·a_iᵀa_j (one
matrix product thanks to the augmented layout of :mod:`knng.metrics`), so one block serves both
directions. Then every point's candidates go through the same exact finish as a search.

Where that costs more than it saves (a GPU, k ≥ ``Options.graph_rows_min_k``, data without principal
slabs: ``plan.graph_method == "rows"``), the graph runs by rows instead: the data searched
against themselves (:mod:`knng.engine.graph.rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from knng._inputs import InputArray
from knng.engine import stages
from knng.engine.checkpoint import Checkpoint
from knng.engine.common import (
    PreparedCorpus, Progress, corpus_stats, device_block_rows, full_precision, on_device,
)
from knng.engine.graph.frames import GlobalFrames, PrincipalFrames, slab_gain_of
from knng.engine.graph.report import GraphReport
from knng.engine.graph.rows import direct_graph, graph_by_rows, search_points
from knng.engine.plan import (
    GRAPH_ROWS, LISTS_ON_DEVICE, PRINCIPAL_FRAMES, EnginePlan, make_graph_plan,
    pending_pairs,
)
from knng.engine.screen import (
    ScoreBuffer,
)
from knng.engine.store import (
    PairErrors, candidate_store,
)
from knng.metrics import Metric
from knng.engine.graph.bands import graph_in_bands
from knng.engine.graph.blocks import (
    STORE_ARRAYS, BlockCounts, BlockDealer, SharedThresholds, finish_rows, graph_report, holding_for, off_diagonal_blocks,
    own_parts_together, retry_on_oom, screen_own_part, screen_own_parts_together,
)

__all__ = ["exact_graph"]


@stages.recorded
def exact_graph(
    data: InputArray,
    k: int,
    metric: Metric,
    device: torch.device,
    select: str,
    budget: int,
    include_self: bool = False,
    progress: "bool | Progress" = False,
    part_size: int | None = None,
    screen_dtype: "torch.dtype | str | None" = None,
    plan: EnginePlan | None = None,
    checkpoint: Checkpoint | None = None,
    keep_checkpoint: bool = False,
    lists_folder: str | None = None,
    share_thresholds: "Callable[[torch.Tensor], torch.Tensor] | None" = None,
) -> tuple[torch.Tensor, torch.Tensor, GraphReport]:
    """Exact k-NN graph of ``data``; returns (indices, float64 distances, report).

    A ``plan`` of a share of the graph (:attr:`~knng.engine.plan.EnginePlan.share_index`) runs
    that share: every row then holds its exact top k among the pairs this share screened (−1
    and +inf past them), and the shares' rows merged by (distance, index) give the graph.
    ``share_thresholds``: where the
    shares run together (the ranks of a distributed graph), each screens only its own parts
    (part p goes to share p modulo the count) and then calls this with its thresholds τ (n,);
    it must return every point's smallest τ over the shares (an all-reduce), which this share
    then takes. Every share calls it exactly once, resumed or not. Without it, every share
    screens every own part (each row's first threshold).

    When the plan keeps the candidate stores off the device (``plan.lists``), the run goes in
    bands of parts (:func:`graph_in_bands`), its stores in a :class:`~knng.engine.store.lists.ListHome`
    (a disk home's files in ``lists_folder``, default the temporary folder), and the results
    come back in host memory (memory-mapped files beside the stores for a disk home).

    ``checkpoint``: where the run records its progress, and the state to resume from
    (:mod:`knng.engine.checkpoint`; ``plan`` must be the checkpoint's); ``keep_checkpoint``:
    also record the end of the loop over blocks, so that a run killed after this call
    returns (before its results are written) resumes with only the finish to do.

    Blocks S(I, I) come first: each point's own part seeds its threshold (the k best-screened
    of its part, by their certified upper bounds) and is screened against it. Then every block
    S(I, J), I < J, at most once: each entry is tested against the row's τᵢ and the column's
    τⱼ, and a survivor goes to the store of the point whose test it passed. With principal
    frames (:mod:`knng.engine.graph.frames`) the parts are slabs along the principal direction, each
    block is centred on its row part, blocks go nearest first and only the window of a block
    that either side can still need is screened.
    """
    n, d = data.n, data.d
    if plan is None:
        plan = make_graph_plan(n=n, d=d, k=k, metric=metric.name, device=device, budget=budget,
                               include_self=include_self, screen_dtype=screen_dtype, part_size=part_size,
                               slab_gain=slab_gain_of(data, device))
    if plan.direct:
        found = direct_graph(data, k, metric, device, select, plan, include_self, progress)
        if found is not None:
            return found
        plan = replace(plan, direct=False)  # data that are not finite: the pipeline names the row
    if plan.graph_method == GRAPH_ROWS:
        return graph_by_rows(data, k, metric, device, select, plan, include_self, progress, checkpoint,
                              keep_checkpoint)
    out_idx, out_dist, report, escalated = _symmetric_blocks(
        data, k, metric, device, select, plan, include_self, progress, checkpoint, keep_checkpoint, lists_folder,
        share_thresholds)
    # (The blocks' frames and stores are gone: the escalated rows' search prepares the data again.)
    if escalated is not None and escalated.numel():
        # Rows whose survivors outgrew plan.escalate_pairs took nothing more from the blocks:
        # their answer is a float64-screened search of their own.
        assert plan.escalation is not None, "rows escalated by a plan without an escalation search"
        stages.count("graph.escalated_rows")
        out_idx[escalated], out_dist[escalated], found = search_points(
            data, escalated, k, metric, device, select, plan.escalation, include_self)
        report.exact.exact_evaluations += found.exact.exact_evaluations
        report.rows_escalated = escalated.numel()
    return out_idx, out_dist, report


def _symmetric_blocks(data: InputArray, k: int, metric: Metric, device: torch.device, select: str, plan: EnginePlan,
                      include_self: bool, progress: "bool | Progress", checkpoint: Checkpoint | None,
                      keep_checkpoint: bool, lists_folder: str | None,
                      share_thresholds: "Callable[[torch.Tensor], torch.Tensor] | None"
                      ) -> tuple[torch.Tensor, torch.Tensor, GraphReport, torch.Tensor | None]:
    """:func:`exact_graph`'s symmetric blocks: (indices, distances, report, the store rows it
    escalated, or None for a run in bands). Its frames and stores live only here."""
    n, d = data.n, data.d
    b = plan.part_size
    parts = [(s, min(n, s + b)) for s in range(0, n, b)]
    with on_device(device), full_precision():
        # Data already on the GPU are read in a few large blocks; the parts' tiles are cut
        # from them whatever the blocks.
        read_rows = device_block_rows(data, device, plan.read_rows) if plan.corpus_resident else plan.read_rows
        stats = corpus_stats(data, metric, device, symmetric=True, block_rows=read_rows,
                             integers=(plan.precision.scaled or plan.precision.integers)
                             and metric.translation_invariant)
        offsets = torch.zeros(n, dtype=torch.float64, device=device)  # a graph's keys carry both terms
        # Data on a lattice (integers, grey levels / 255): exact products around lattice points
        # (CorpusStats.screen), the rows holding the values in the lattice's units.
        precision, centre, unit = stats.screen(plan.precision)
        if unit is not None and (unit != 1.0 or precision.lattice_error > 0):
            # Rows rounded onto the lattice (exact integers, centred on integers, already are).
            metric = replace(metric, lattice=unit)
        if precision.integers:
            metric = replace(metric, integers=True)  # int8 rows hold the centred integers
        frames: GlobalFrames | PrincipalFrames
        if plan.frames == PRINCIPAL_FRAMES:
            assert centre is not None
            frames = PrincipalFrames(data, metric, centre, device, b, plan.screen_torch_dtype, read_rows=read_rows,
                                     lattice=unit)
        else:
            pdata = PreparedCorpus(data, metric, centre, device, resident=plan.corpus_resident,
                                   block_rows=read_rows, symmetric=True, dtype=plan.screen_torch_dtype)
            frames = GlobalFrames(pdata, parts)
        if plan.lists != LISTS_ON_DEVICE:
            assert isinstance(frames, GlobalFrames)
            out_idx, out_dist, store, counts, done = graph_in_bands(
                frames, plan, metric, precision, centre, include_self, select, device, progress, checkpoint,
                keep_checkpoint, lists_folder)
            return out_idx, out_dist, graph_report(plan, store, counts, checkpoint, done, precision), None
        # One centre for every block: the store's norms give every pair's radius. Blocks centred
        # on their row part: every survivor brings the norms of its block (PairNorms).
        shared = frames.shared_norms()
        norms, terms = shared if shared is not None else (None, None)
        errors = PairErrors(metric=metric, d=d, precision=precision, row_norms=norms, row_terms=terms,
                            row_offsets=offsets, col_norms=norms, col_terms=terms,
                            centre_norm=0.0 if centre is None else float(torch.linalg.vector_norm(centre)))

        def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
            return frames.evaluate(metric, rows, cols, device, plan.work_bytes)

        holding = holding_for(plan.precision, norms, terms, device, n=plan.n_corpus, capacity=plan.capacity,
                              pending=plan.pending_pairs, budget=plan.budget,
                              escalate=plan.escalate_pairs if plan.escalation is not None else 0)
        # A store that takes its survivors in as it goes waits for more of them at a time.
        pending = plan.pending_pairs if holding is not None else pending_pairs(device, plan.budget, updates=True)
        store = candidate_store(n, k, plan.capacity, errors, evaluate, device, pending=pending,
                                work_bytes=plan.work_bytes, holding=holding)
        thresholds = None if shared is None else SharedThresholds.when_uniform(store, norms, terms,
                                                                                 [frames.ids(p) for p in range(len(parts))])
        buffer = ScoreBuffer() if device.type == "cpu" else None
        counts = BlockCounts()
        done = 0  # steps of a checkpoint's run already done (own parts, then blocks in order)
        if checkpoint is not None and checkpoint.resumed:
            saved = checkpoint.state
            assert saved is not None
            with checkpoint.restoring():
                arrays = checkpoint.arrays()
                done = checkpoint.check_step(plan.blocks)
                store.load_state({name: arrays[f"store_{name}"] for name in STORE_ARRAYS}, saved["store"])
                counts = BlockCounts(*(int(saved[f]) for f in ("retries", "computed", "screened")))
        step = 0

        def checkpoint_after(step: int, force: bool = False) -> None:
            if checkpoint is not None and (force or checkpoint.due()):
                tensors, counters = store.state()
                checkpoint.save({"step": step, "progress": f"{step:,} of {plan.blocks:,} blocks done",
                                 "retries": counts.retries, "computed": counts.computed,
                                 "screened": counts.screened, "store": counters},
                                {f"store_{name}": t for name, t in tensors.items()})

        bar = Progress.of(progress, total=plan.blocks, desc="knng graph")
        # A share that exchanges thresholds screens its own parts only (part p: share p mod count).
        split = share_thresholds is not None and plan.share_count > 1
        own = [p for p in range(len(parts)) if not split or p % plan.share_count == plan.share_index]
        if checkpoint is None and own_parts_together(frames, store, precision, device, k, include_self):
            handed: set[int] = set()  # kept across a retry: no part's survivors go in twice
            counts.retries += retry_on_oom(lambda: screen_own_parts_together(frames, d, metric, store, k, include_self,
                                                                             precision, select, parts=own,
                                                                             handed=handed), device)
            counts.screened += sum((parts[p][1] - parts[p][0]) ** 2 for p in own)
            step = len(parts)
            bar.update(len(parts))
        for pi in range(step, len(parts)):
            ids = frames.ids(pi)
            if step >= done and pi in own:
                counts.retries += retry_on_oom(lambda: screen_own_part(frames.own(pi), d, metric, store, ids, ids, k,
                                                                       include_self, select, device,
                                                                       precision=precision, carry_norms=shared is None,
                                                                       buffer=buffer), device)
                counts.screened += ids.numel() ** 2
                checkpoint_after(step + 1)
            step += 1
            bar.update()
        if split:
            assert share_thresholds is not None
            store.lower_thresholds(slice(None), share_thresholds(store.tau.clone()))
        step = off_diagonal_blocks(frames, store, metric, precision, thresholds, device, carry_norms=shared is None,
                                    buffer=buffer, bar=bar, counts=counts, first_step=step, done=done,
                                    checkpoint_after=None if checkpoint is None else checkpoint_after,
                                    checkpoint_due=None if checkpoint is None else checkpoint.due,
                                    group=plan.group_parts, dealer=BlockDealer.of(plan, own_parts_split=split))
        bar.close()
        if checkpoint is not None and keep_checkpoint and step > done:
            checkpoint_after(step, force=True)  # only the finish is left to a run that resumes this
        out_idx = torch.empty((n, k), dtype=torch.int64, device=device)
        out_dist = torch.empty((n, k), dtype=torch.float64, device=device)
        chunk = finish_rows(plan, device)
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            out_idx[r0:r1], out_dist[r0:r1] = store.finish(torch.arange(r0, r1, device=device))
        return out_idx, out_dist, graph_report(plan, store, counts, checkpoint, done, precision), store.escalated_rows()
