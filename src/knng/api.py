"""The public entry points: :func:`search`, :func:`graph` and :func:`radius`.

Each validates its arguments (:mod:`knng.arguments`, shared with :mod:`knng.distributed`),
resolves the device, metric, selection algorithm and memory budget, runs the single-device engine
and wraps the result in the user's array kind. :func:`last_report` and :func:`report_as_dict` are
re-exported from :mod:`knng.reports`, :func:`wait_for_kernels` from ``knng.engine.kernels``.

The first call of a kind on a GPU may run without compiled kernels while they compile in the
background (:func:`_first_calls_compile`; ``docs/STARTUP.md``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import replace
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from knng._inputs import InputArray, as_input, as_output
from knng._options import get_options, options
from knng.arguments import check_checkpoint_arguments, check_k, check_select, graph_arguments
from knng.engine import duplicates
from knng.engine.checkpoint import DEFAULT_INTERVAL, STATE_FORMAT, Checkpoint, input_fingerprint
from knng.engine.common import DevicePeak, EngineReport, integer_extent_of, is_out_of_memory, place_input, resolve_device
from knng.engine.exact import ExactStats, exact_pairs_of, round_as_exact
from knng.engine.graph import GraphReport, exact_graph, slab_gain_of
from knng.engine.kernels import compile_in_background, mark_ready, wait_for_kernels
from knng.engine.plan import (
    LISTS_ON_DISK, EnginePlan, KnngPerformanceWarning, budget_source, call_kind, direct_applies,
    first_call_uncompiled, host_budget_source, make_graph_plan, make_radius_plan, make_search_plan, resolve_budget, resolve_host_budget,
)
from knng.engine.search import RADIUS_METRICS, exact_radius, exact_search, radius_product_dtype
from knng.io.workarea import WorkArea
from knng.metrics import Metric, get_metric

# Re-exported: knng.api.last_report and knng.api.report_as_dict are public, and
# knng.api._LAST_REPORT is the very same holder dict as knng.reports.LAST_REPORT.
from knng.reports import LAST_REPORT as _LAST_REPORT  # noqa: F401
from knng.reports import last_report, report_as_dict, set_last_report
from knng.results import Graph, Neighbors, RadiusNeighbors

__all__ = ["search", "graph", "radius", "wait_for_kernels", "last_report", "report_as_dict"]


def _open_checkpoint(folder: Any, resume: Any, interval: Any, keep: Any, *, operation: str,
                     inputs: dict[str, InputArray], k: int, metric: str, plan: EnginePlan,
                     **fields: Any) -> Checkpoint | None:
    """The run's checkpoint in ``folder`` (None without one), its fingerprint checked."""
    check_checkpoint_arguments(folder, resume, interval, keep)
    if folder is None:
        return None
    from knng._version import VERSION as __version__

    fingerprint = {"knng": __version__, "state_format": STATE_FORMAT, "operation": operation, "k": k,
                   "metric": metric, "screen_precision": plan.screen_precision,
                   "device": torch.device(plan.device).type,
                   "inputs": {name: input_fingerprint(x) for name, x in inputs.items()}, **fields}
    return Checkpoint(WorkArea(folder), fingerprint, resume, float(interval))


def _no_distributed_host_budget(host_memory_budget: Any) -> None:
    if host_memory_budget is not None:
        raise ValueError("host_memory_budget is not supported with distributed=True yet: each rank reads only the "
                         "parts it needs; pass memory_budget for the GPUs")


def _running(ckpt: Checkpoint | None) -> contextlib.AbstractContextManager[None]:
    """The engine's run: a failure removes the checkpoint where it cannot help a later run."""
    return contextlib.nullcontext() if ckpt is None else ckpt.running()


def _close_checkpoint(ckpt: Checkpoint | None, keep: bool) -> None:
    """After success: the checkpoint folder is no longer needed (unless the caller keeps it)."""
    if ckpt is not None:
        if keep:
            ckpt.area.close()
        else:
            ckpt.area.remove()


def _warn_of_slow_plan(plan: EnginePlan, stacklevel: int) -> None:
    """The plan's host-budget note (a host_memory_budget that makes it much slower), once per call,
    as a KnngPerformanceWarning pointing ``stacklevel`` frames up (the caller of knng.search/graph)."""
    if plan.host_budget_note:
        warnings.warn(plan.host_budget_note, KnngPerformanceWarning, stacklevel=stacklevel + 1)


#: Frames from :func:`_warn_of_slow_plan`'s caller (``run`` in :func:`search`, :func:`graph`) to
#: the user's code: run, :func:`_first_calls_compile`, the public function, the user's line.
_USER_FRAME = 4
#: The smallest budget a graph that ran out of memory is planned again with (halving from its
#: own): below it the error is the caller's to see.
MIN_REPLAN_BUDGET = 16 << 20

Result = TypeVar("Result", Neighbors, Graph, RadiusNeighbors)
ReportT = TypeVar("ReportT", bound=EngineReport)


def _first_calls_compile(kind: tuple, scores: int, dev: torch.device, recorded: bool,
                         run: Callable[[bool], Result]) -> Result:
    """``run(False)``: the call, without compiled kernels where it is the first of its ``kind``
    in the process and small (:func:`~knng.engine.plan.first_call_uncompiled`); then its kernels
    compile in the background by ``run(True)`` (the same call again, with them, its answer
    discarded: ``knng.engine.kernels.compiling``). A call that ran with its kernels on a GPU
    marks its kind's compiled."""
    if not first_call_uncompiled(kind, scores=scores, device=dev, recorded=recorded):
        found = run(False)
        if dev.type == "cuda" and get_options().compiled_kernels:
            mark_ready(kind)
        return found
    with options(compiled_kernels=False):
        found = run(False)
    compile_in_background(kind, lambda: run(True))
    return found


def _check_distributed(distributed: Any) -> bool:
    if not isinstance(distributed, bool):
        raise TypeError(f"distributed must be True or False, got {distributed!r}")
    return distributed


def search(
    queries: Any,
    corpus: Any,
    k: int,
    *,
    metric: str = "euclidean",
    device: str | torch.device = "auto",
    select: str = "auto",
    memory_budget: int | str | None = None,
    host_memory_budget: int | str | None = None,
    progress: bool = False,
    distributed: bool = False,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    checkpoint_interval: float = DEFAULT_INTERVAL,
    keep_checkpoint: bool = False,
) -> Neighbors:
    """Exact k nearest neighbours in ``corpus`` of every vector in ``queries``.

    Parameters
    ----------
    queries : array-like, shape (n_queries, d)
        NumPy array or memory map, torch tensor (CPU or GPU), DLPack-capable array, or a
        row-sliceable dataset (``h5py.Dataset``). dtypes: float16, bfloat16, float32, float64,
        uint8, int8.
    corpus : array-like, shape (n_corpus, d)
        Same kinds and dtypes. Memory maps and datasets stream through in tiles. Identical
        rows of the corpus (in memory or read from a file, checkpointed or not) are folded into
        one for the run where a group is large enough to matter (the answer is the same;
        ``report.duplicates_folded``).
    k : int
        Neighbours per query, 1 ≤ k ≤ n_corpus.
    metric : {"euclidean", "sqeuclidean", "cosine", "pearson", "inner_product"}
        ``cosine`` is 1 − cosine similarity, ``pearson`` 1 − correlation, ``inner_product``
        is −xᵀy (ascending = most similar).
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device
        Where to compute. "auto": where a GPU input lives, else a GPU if present, else the CPU.
    select : str
        k-selection algorithm (see ``knng.select.available()``); "auto" picks the fastest
        measured for the shape.
    memory_budget : int or str, optional
        Bytes the engine may use on the device (e.g. ``"4GB"``). Default: a safe share of free
        GPU memory, or of available RAM on a CPU. On a GPU a corpus in host memory or in a file
        that takes at most half of it is copied there once, first (a file read by several
        threads), and counts in it (``report.plan.budget_source`` says so).
    host_memory_budget : int or str, optional
        Bytes of host memory the engine may hold besides the results (e.g. ``"20MB"``):
        file-backed inputs (memory maps, datasets) are read in blocks that fit it, through
        background reads that overlap the work; on a CPU it caps ``memory_budget``; a graph's
        candidate stores move to pinned host memory or to a memory-mapped file when they do
        not fit the device (see ``knng info``). Default: 75 % of the RAM available. Pages the
        operating system caches for memory-mapped files are its own, not counted.
    progress : bool
        Show a progress bar on standard error.
    distributed : bool
        Compute with every rank of the initialised ``torch.distributed`` process group (one
        process per GPU, started by ``torchrun`` or ``knng --gpus``): the corpus is sharded
        across ranks, every rank must make this call, and every rank gets the whole result.
        See :func:`knng.distributed.search` for the options of that mode.
    checkpoint : str or os.PathLike, optional
        A folder where the run records its progress (finished query rows), so that a run killed
        part-way can continue with ``resume=True``; deleted when the call returns, unless
        ``keep_checkpoint``. With ``distributed``, every rank keeps its own part in a sub-folder
        (the folder must be on a file system every rank reaches) and resuming needs the same
        number of ranks (see :func:`knng.distributed.graph`).
    resume : bool, default False
        Continue the run recorded in ``checkpoint`` (from the beginning if there is none). The
        result is the same, bit for bit, as an uninterrupted run's. A checkpoint written with
        other inputs, k, metric, screen precision, knng version or kind of device is refused.
        Without ``resume``, a checkpoint found in the folder is an error (it is never discarded
        silently).
    checkpoint_interval : float, default 60
        Seconds between checkpoints at least (each also waits 50 times its own duration, so
        checkpoints cost at most 2 % of the run); 0 saves after every step, whatever that costs.
    keep_checkpoint : bool, default False
        Keep the folder after success (with the run complete in it: a ``resume=True`` call
        then returns at once); ``knng search``/``knng graph`` delete it once their results
        are written.

    Returns
    -------
    Neighbors
        ``indices`` (int64) and ``distances`` (float32), both (n_queries, k), ascending, ties
        by the smaller index; exact in the sense of ``docs/EXACTNESS.md``. NumPy in gives
        NumPy out; torch in gives torch out on the queries' device.

    Raises
    ------
    ValueError, TypeError
        For bad input (NaN/Inf, k out of range, mismatched dimensions, empty arrays,
        unsupported dtypes); the message names the argument.
    """
    if _check_distributed(distributed):
        from knng import distributed as _distributed

        _no_distributed_host_budget(host_memory_budget)
        return _distributed.search(queries, corpus, k, metric=metric, device=device, select=select,
                                   memory_budget=memory_budget, progress=progress, checkpoint=checkpoint,
                                   resume=resume, checkpoint_interval=checkpoint_interval,
                                   keep_checkpoint=keep_checkpoint)
    m = get_metric(metric)
    q, c = _queries_and_corpus(queries, corpus)
    k = check_k(k, c.n, "the corpus size")
    select = check_select(select)
    dev = resolve_device(device, q, c)

    def run(replay: bool) -> Neighbors:  # replay: again in the background, to compile its kernels
        peak = DevicePeak.begin(dev)  # before the input's copy to the device, which the budget holds too
        budget = resolve_budget(memory_budget, dev)
        host_budget = resolve_host_budget(host_memory_budget)  # read once: the default reads /proc/meminfo
        rows, budget = place_input(c, dev, budget, host_budget)  # rows: what the engine reads
        # A small call takes the direct path, which needs no folding (near-ties go to the pipeline).
        direct = direct_applies(n_queries=q.n, n_corpus=rows.n, d=c.d, metric=m.name, device=dev, budget=budget, k=k,
                                host_budget=host_budget, recorded=checkpoint is not None)
        groups = None if direct else _duplicate_groups(rows, m, k, dev, host_memory_budget)
        # Folded, the engine searches the groups' representatives (see knng.engine.duplicates).
        reps = rows if groups is None else duplicates.representatives(rows, groups)
        k_reps = min(k, reps.n)
        plan = make_search_plan(n_queries=q.n, n_corpus=reps.n, d=c.d, k=k_reps, metric=m.name, device=dev,
                                budget=budget, source=_source_of_budget(memory_budget, dev, c, rows),
                                host_budget=host_budget,
                                host_source=host_budget_source(host_memory_budget), recorded=checkpoint is not None,
                                integers=integer_extent_of(rows, m, dev, also=q))
        ckpt = _open_checkpoint(checkpoint, resume, checkpoint_interval, keep_checkpoint,
                                operation="search", inputs={"queries": q, "corpus": c}, k=k, metric=m.name, plan=plan,
                                **({} if groups is None else {"folded_to": reps.n}))
        if ckpt is not None:
            plan = ckpt.plan(plan)
        if not replay:
            _warn_of_slow_plan(plan, stacklevel=_USER_FRAME)
        with _running(ckpt):
            idx, dist, report = exact_search(q, reps, k_reps, m, dev, select, plan.budget, progress and not replay,
                                             plan=plan,
                                             checkpoint=ckpt, keep_checkpoint=keep_checkpoint)
        if groups is not None:
            idx, dist = duplicates.unfold_search(groups.to(dev), idx.to(dev), dist.to(dev), k)
            report = replace(report, duplicates_folded=c.n - reps.n)
        if not report.rounded_as_exact:
            round_as_exact(m, q, None, rows, idx, dist)
        _close_checkpoint(ckpt, keep_checkpoint)
        report = _with_device_peak(report, peak)
        out_idx, out_dist = as_output(q, idx, dist)
        return Neighbors(indices=out_idx, distances=out_dist, metric=m.name, report=report)

    found = _first_calls_compile(call_kind("search", dev, c.d, c.dtype, m.name, k), q.n * c.n, dev,
                                 checkpoint is not None, run)
    set_last_report(found.report)
    return found


def _with_device_peak(report: ReportT, peak: DevicePeak | None) -> ReportT:
    """``report`` with the call's device peak (:class:`~knng.engine.common.DevicePeak`) on a GPU."""
    if peak is None:
        return report
    used, is_bound = peak.end()
    return replace(report, device_peak=used, device_peak_is_bound=is_bound)


def _source_of_budget(memory_budget: Any, dev: torch.device, given: InputArray, rows: InputArray) -> str:
    """Where the plan's budget comes from, and what the input's copy on the device took of it."""
    source = budget_source(memory_budget, dev)
    return source if rows is given else f"{source}, less {given.nbytes:,} bytes of the input copied to the device"


def _duplicate_groups(x: InputArray, m: "Metric", k: int, dev: torch.device, host_memory_budget: Any
                      ) -> "duplicates.DuplicateGroups | None":
    """The groups of identical rows of ``x`` (the rows the engine reads) where folding them
    applies and pays (``Options.fold_duplicates``), else None. Inputs read from files are looked
    through in blocks (:func:`~knng.engine.duplicates.find_duplicates_in`)."""
    if not duplicates.folds(m):
        return None
    if x.in_memory:
        return duplicates.find_duplicates_in(x, k, dev)
    if host_memory_budget is not None:
        # A file folded under a budget of the caller's: the folded run held about 1 MB beyond
        # its plan (a 6,000 × 1,000 file under 4 MB: 3.7 MB against 2.6 MB unfolded; the cause
        # is not yet found), so a bound the caller set is kept by not folding.
        return None
    return duplicates.find_duplicates_in(x, k, dev, host_budget=resolve_host_budget(host_memory_budget))


def graph(
    data: Any,
    k: int,
    *,
    metric: str = "euclidean",
    include_self: bool = False,
    device: str | torch.device = "auto",
    select: str = "auto",
    memory_budget: int | str | None = None,
    host_memory_budget: int | str | None = None,
    progress: bool = False,
    distributed: bool = False,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    checkpoint_interval: float = DEFAULT_INTERVAL,
    keep_checkpoint: bool = False,
) -> Graph:
    """Exact k-nearest-neighbour graph of ``data``.

    Each point's own row excludes the point itself by index (duplicates of it stay
    neighbours at distance 0) unless ``include_self`` is true. Only the blocks S(I, J) with
    I ≤ J of the distance matrix are computed; each serves the rows of part I and the columns
    of part J. On a GPU, from k = 64, data without principal slabs (not image-like) are
    instead searched against themselves in chunks of rows, which costs less there than the
    symmetric blocks' candidate stores (``report.plan.graph_method``, ``docs/EXACTNESS.md``).

    Parameters
    ----------
    data : array-like, shape (n, d)
        As ``queries`` in :func:`search`.
    k : int
        Neighbours per point, 1 ≤ k ≤ n − 1 (≤ n with ``include_self``).
    metric, device, select, memory_budget, progress
        As in :func:`search`.
    include_self : bool
        Count each point among its own neighbours.

        Identical rows (flat image regions, repeated records) are folded into one for the run
        where a group is large enough to matter, whatever the data's source (a file is looked
        through in blocks), and unfolded after: the answer is the same
        (``docs/EXACTNESS.md``, "Identical rows folded into one"); ``report.duplicates_folded``
        says how many rows were folded away.
    distributed : bool
        Compute with every rank of the initialised ``torch.distributed`` process group, as in
        ``docs/DISTRIBUTED.md``: each rank runs the one-device engine on its share of one plan
        and the ranks' exact lists are merged; every rank must make this call, and every rank
        gets the whole graph, identical to the one-device result. See :func:`knng.distributed.graph`.
    host_memory_budget
        As in :func:`search`. Candidate stores kept on disk go into the ``checkpoint`` folder
        when there is one, else into the temporary folder (``TMPDIR``).
    checkpoint, resume, checkpoint_interval, keep_checkpoint
        As in :func:`search`; a graph records the blocks it finished and every point's
        candidates (about ``32 · capacity`` bytes a point, see ``knng info``).

    Returns
    -------
    Graph
        ``indices`` and ``distances`` (n, k) with ``to_scipy()``, ``symmetrize()``, ``save()``.
    """
    if _check_distributed(distributed):
        from knng import distributed as _distributed

        _no_distributed_host_budget(host_memory_budget)
        return _distributed.graph(data, k, metric=metric, include_self=include_self, device=device, select=select,
                                  memory_budget=memory_budget, progress=progress, checkpoint=checkpoint,
                                  resume=resume, checkpoint_interval=checkpoint_interval,
                                  keep_checkpoint=keep_checkpoint)
    m, x, k, select = graph_arguments(data, k, metric, include_self, select)
    dev = resolve_device(device, x)

    def run(replay: bool) -> Graph:  # replay: again in the background, to compile its kernels
        peak = DevicePeak.begin(dev)  # before the input's copy to the device, which the budget holds too
        budget = resolve_budget(memory_budget, dev)
        host_budget = resolve_host_budget(host_memory_budget)  # read once: the default reads /proc/meminfo
        rows, budget = place_input(x, dev, budget, host_budget)  # rows: what the engine reads
        direct = direct_applies(n_queries=x.n, n_corpus=x.n, d=x.d, metric=m.name, device=dev, budget=budget, k=k,
                                host_budget=host_budget, graph=True, recorded=checkpoint is not None)
        integers = integer_extent_of(rows, m, dev)  # what the planner may know of integer data
        groups = None if direct else _duplicate_groups(rows, m, k, dev, host_memory_budget)
        # Folded, the engine makes the graph of the groups' representatives (knng.engine.duplicates).
        reps = rows if groups is None else duplicates.representatives(rows, groups)
        k_reps = k if groups is None else min(k, reps.n - 1)

        def graph_plan() -> EnginePlan:
            return make_graph_plan(n=reps.n, d=x.d, k=max(1, k_reps), metric=m.name, device=dev, budget=budget,
                                   include_self=include_self and groups is None,
                                   source=_source_of_budget(memory_budget, dev, x, rows),
                                   host_budget=host_budget, host_source=host_budget_source(host_memory_budget),
                                   slab_gain=slab_gain_of(reps, dev), recorded=checkpoint is not None,
                                   integers=integers)

        plan = graph_plan()
        if groups is not None and plan.lists == LISTS_ON_DISK:
            # Unfolding holds every row's k neighbours in memory at once, which stores that must go
            # to disk say may not fit: the graph of every row, its results beside the stores.
            groups, reps, k_reps = None, rows, k
            plan = graph_plan()
        ckpt = _open_checkpoint(checkpoint, resume, checkpoint_interval, keep_checkpoint, operation="graph",
                                inputs={"data": x}, k=k, metric=m.name, plan=plan, include_self=include_self,
                                **({} if groups is None else {"folded_to": reps.n}))
        if ckpt is not None:
            plan = ckpt.plan(plan)
        if not replay:
            _warn_of_slow_plan(plan, stacklevel=_USER_FRAME)
        with _running(ckpt):
            if k_reps >= 1:
                replans: list[EnginePlan] = []
                while True:
                    try:
                        idx, dist, report = exact_graph(
                            reps, k_reps, m, dev, select, plan.budget, include_self=include_self and groups is None,
                            progress=progress and not replay, plan=plan, checkpoint=ckpt,
                            keep_checkpoint=keep_checkpoint,
                            lists_folder=None if ckpt is None else os.fspath(ckpt.area.path))
                        break
                    except Exception as exc:  # noqa: BLE001 - only out-of-memory is planned again
                        # What the blocks' own retries did not overcome (memory another part of
                        # the process took meanwhile, survivors beyond the plan's): the planner
                        # plans the graph again with half the budget, from the start (smaller
                        # parts; in the end the stores off the device). A checkpoint's plan is
                        # the checkpoint's.
                        if not is_out_of_memory(exc) or ckpt is not None or budget // 2 < MIN_REPLAN_BUDGET:
                            raise
                        if dev.type == "cuda":
                            torch.cuda.empty_cache()
                        budget //= 2
                        plan = graph_plan()
                        replans.append(plan)
                if replans:
                    report = replace(report, replans=replans + list(report.replans))
            else:  # one group: every row's neighbours are its twins
                idx = torch.empty((reps.n, 0), dtype=torch.int64, device=dev)
                dist = torch.empty((reps.n, 0), dtype=torch.float64, device=dev)
                report = GraphReport(plan=plan, oom_retries=0, exact=ExactStats(rows=reps.n))
        if groups is not None:
            every = torch.arange(reps.n, device=dev)
            self_dist = exact_pairs_of(m, reps, every, reps, every, dev)
            idx, dist = duplicates.unfold_graph(groups.to(dev), idx.to(dev), dist.to(dev), self_dist, k,
                                                include_self)
            report = replace(report, duplicates_folded=x.n - reps.n)
        if not report.rounded_as_exact:
            round_as_exact(m, rows, None, rows, idx, dist)
        _close_checkpoint(ckpt, keep_checkpoint)
        report = _with_device_peak(report, peak)
        out_idx, out_dist = as_output(x, idx, dist)
        return Graph(indices=out_idx, distances=out_dist, metric=m.name, include_self=include_self, report=report)

    found = _first_calls_compile(call_kind("graph", dev, x.d, x.dtype, m.name, k), x.n * x.n, dev,
                                 checkpoint is not None, run)
    set_last_report(found.report)
    return found


def radius(
    queries: Any,
    corpus: Any,
    radius: Any,
    *,
    metric: str = "euclidean",
    device: str | torch.device = "auto",
    memory_budget: int | str | None = None,
    sort_results: bool = True,
) -> RadiusNeighbors:
    """Every corpus vector within ``radius`` of each query, exactly.

    A pair is in where its distance, computed in float64 directly from the input vectors (by
    differences, as :func:`search` ranks), is at most the radius (scikit-learn's ``<=``). The
    products only screen: every pair whose rounded score could be within the radius is
    evaluated exactly (``knng.engine.radius``), on the CPU or a GPU.

    Parameters
    ----------
    queries, corpus : array-like, shape (n_queries, d) and (n, d)
        As in :func:`search`.
    radius : float or array-like of shape (n_queries,)
        The radius, in the metric's units (a squared distance for ``"sqeuclidean"``), one for
        every query or one each; at least 0 (``inf``: every corpus vector).
    metric : {"euclidean", "sqeuclidean", "cosine", "pearson"}
        The distance (the expansion's rounding bound serves these; cosine's and Pearson's on
        unit vectors, Pearson's centred on each vector's own mean first).
    device, memory_budget
        As in :func:`search`. The pairs found are held on the device until the end, in a quarter
        of the budget.
    sort_results : bool, default True
        Each row by (distance, index); False: by index.

    Returns
    -------
    RadiusNeighbors
        ``indptr``, ``indices`` (int64) and ``distances`` (float32: the exact float64 values
        rounded, as :func:`search` returns them) in the compressed sparse row layout;
        ``to_scipy()`` gives scikit-learn's ``radius_neighbors_graph`` matrix. NumPy in gives
        NumPy out; torch in gives torch out on the queries' device.

    Raises
    ------
    ValueError, TypeError
        For bad input (NaN/Inf in the data, a negative or NaN radius, a radius array of the wrong
        length, mismatched dimensions, a metric radius queries do not serve); where the pairs
        found exceed what the memory budget holds. The message names the argument.
    """
    m = get_metric(metric)
    if m.name not in RADIUS_METRICS:
        raise ValueError(f"metric={metric!r}: radius queries serve {', '.join(sorted(RADIUS_METRICS))}")
    q, c = _queries_and_corpus(queries, corpus)
    if not isinstance(sort_results, bool):
        raise TypeError(f"sort_results must be True or False, got {sort_results!r}")
    radii = _radii(radius, q.n)
    dev = resolve_device(device, q, c)

    def run(replay: bool) -> RadiusNeighbors:  # replay: again in the background, to compile its kernels
        budget = resolve_budget(memory_budget, dev)
        element = torch.finfo(radius_product_dtype(q, c, m)).bits // 8
        plan = make_radius_plan(n_queries=q.n, n_corpus=c.n, d=c.d, device=dev, budget=budget, element_bytes=element)
        indptr, idx, dist, report = exact_radius(q, c, radii, m, dev, plan, sort_results=sort_results)
        if idx.numel():
            # Each distance on its exact value's side of a float32 midpoint (pairs as rows of one).
            rows = torch.repeat_interleave(torch.arange(q.n, device=idx.device), indptr.diff())
            pairs_idx, pairs_dist = idx[:, None].clone(), dist[:, None].clone()
            round_as_exact(m, q, rows, c, pairs_idx, pairs_dist)
            dist = pairs_dist[:, 0]
            if sort_results:  # values that moved may change a row's order
                order = torch.argsort(idx, stable=True)
                order = order[torch.argsort(dist[order], stable=True)]
                order = order[torch.argsort(rows[order], stable=True)]
                idx, dist = idx[order], dist[order]
        out_idx, out_dist = as_output(q, idx, dist)
        indptr = indptr.cpu().numpy() if q.kind in ("numpy", "rows") else indptr.to(q.device)
        return RadiusNeighbors(indptr=indptr, indices=out_idx, distances=out_dist, n_corpus=c.n, metric=m.name,
                               report=report)

    found = _first_calls_compile(call_kind("radius", dev, c.d, c.dtype, m.name, 0), q.n * c.n, dev, False, run)
    set_last_report(found.report)
    return found


def _queries_and_corpus(queries: Any, corpus: Any) -> tuple[InputArray, InputArray]:
    """The validated queries and corpus of a search or radius query, of one dimension."""
    q = as_input(queries, "queries")
    c = as_input(corpus, "corpus")
    if q.d != c.d:
        raise ValueError(f"queries and corpus must have the same dimension: queries has {q.d}, corpus has {c.d}")
    return q, c


def _radii(radius: Any, n_queries: int) -> torch.Tensor:
    """``radius`` as one float64 value a query (host tensor), checked: finite, at least 0, one or
    ``n_queries`` of them."""
    if isinstance(radius, bool):
        raise TypeError("radius must be a number or an array of numbers, got a bool")
    if isinstance(radius, torch.Tensor):
        values = radius.detach().to("cpu", torch.float64).reshape(-1)
    else:
        try:
            values = torch.from_numpy(np.asarray(radius, dtype=np.float64).reshape(-1).copy())
        except (TypeError, ValueError) as exc:
            raise TypeError(f"radius must be a number or an array of numbers, got {type(radius).__name__}") from exc
    if values.numel() == 1:
        values = values.expand(n_queries).clone()
    elif values.numel() != n_queries:
        raise ValueError(f"radius must be one number or one per query ({n_queries}), got {values.numel()}")
    if bool(torch.isnan(values).any()) or bool((values < 0).any()):
        raise ValueError("radius must be at least 0 (+inf: every vector), not NaN")
    return values
