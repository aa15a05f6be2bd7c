"""The graph by rows (``plan.graph_method == "rows"``): the data searched against themselves.

Where the symmetric blocks cost more than they save (a GPU, k ≥ ``Options.graph_rows_min_k``,
data without principal slabs, or small data whose search takes its tiles first), each point's
k nearest other points come from a search of the data for k + 1 neighbours.

A small graph (``plan.direct``) goes by rows too, on the direct path (:func:`direct_graph`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from knng._inputs import InputArray, rows_on, rows_subset
from knng.engine.checkpoint import Checkpoint
from knng.engine.common import Progress, full_precision, on_device
from knng.engine.plan import EnginePlan, graph_search_k, share_rows
from knng.engine.search import SearchReport, direct_neighbours, exact_search
from knng.engine.graph.report import GraphReport
from knng.metrics import Metric

__all__ = ["direct_graph", "graph_by_rows", "search_points", "without_self"]


def graph_by_rows(data: InputArray, k: int, metric: Metric, device: torch.device, select: str, plan: EnginePlan,
                   include_self: bool, progress: "bool | Progress", checkpoint: Checkpoint | None, keep_checkpoint: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, GraphReport]:
    """The graph by the rows method (``plan.graph_method == "rows"``): the data searched against
    themselves for k + 1 neighbours (k with ``include_self``), each point then dropped from its
    own row.

    Exact by the search's proof: a row's k + 1 nearest by (distance, index) hold its k nearest
    other points, whether or not the point itself is among them (a point with more than k
    duplicates of smaller index may not be; then its first k are the answer). A checkpoint
    records finished chunks of rows, as a search's does.
    """
    k_search = graph_search_k(k, include_self)
    assert plan.search is not None and plan.search.k == k_search, "a graph by rows is planned with its search"
    n = data.n
    # A share searches its own rows; the others' stay empty (−1, +inf) for the shares' merge.
    start, stop = share_rows(n, plan.share_index, plan.share_count)
    queries = data if (start, stop) == (0, n) else rows_subset(data, [(start, stop)])
    idx, dist, report = exact_search(queries, data, k_search, metric, device, select, plan.budget, progress=progress,
                                     plan=plan.search, checkpoint=checkpoint, keep_checkpoint=keep_checkpoint)
    if not include_self:
        idx, dist = without_self(idx, dist, k, first=start)
    if (start, stop) != (0, n):
        whole_idx = torch.full((n, k), -1, dtype=idx.dtype, device=idx.device)
        whole_dist = torch.full((n, k), torch.inf, dtype=dist.dtype, device=dist.device)
        whole_idx[start:stop], whole_dist[start:stop] = idx, dist
        idx, dist = whole_idx, whole_dist
    # All n² entries computed, each pair once from each side: no symmetric saving (pairs_screened
    # counts a symmetric block's entries once per side, so n² entries here count 2n²).
    return idx, dist, GraphReport(plan=plan, oom_retries=report.oom_retries, exact=report.exact, store=report.store,
                                  evaluations_per_row=report.evaluations_per_row,
                                  screened_per_row=report.screened_per_row, pairs_screened=2 * (stop - start) * n,
                                  checkpoints=report.checkpoints, replans=report.replans)


def direct_graph(data: InputArray, k: int, metric: Metric, device: torch.device, select: str, plan: EnginePlan,
                 include_self: bool, progress: "bool | Progress"
                 ) -> tuple[torch.Tensor, torch.Tensor, GraphReport] | None:
    """A small graph by the direct path (:func:`knng.engine.search.direct_neighbours`: each row against every point,
    its own pair left out unless ``include_self``); the rows it cannot certify are searched by
    ``plan.search`` for k + 1 neighbours and the point dropped, as :func:`graph_by_rows` does.
    None where the data are not finite (the pipeline names the row)."""
    with on_device(device), full_precision():
        found = direct_neighbours(data, data, k, metric, device, plan.work_bytes, select,
                                  exclude_self=not include_self)
    if found is None:
        return None
    idx, dist, exact, store, replans, retries = found.indices, found.distances, found.stats, None, [], 0
    if found.failed.numel():
        points = found.failed
        assert plan.search is not None, "a direct graph is planned with the search of its uncertified rows"
        idx[points], dist[points], report = search_points(data, points, k, metric, device, select, plan.search,
                                                          include_self, progress)
        exact.add(report.exact)
        store, replans, retries = report.store, report.replans, report.oom_retries
    extra = {} if store is None else {"store": store}
    per_row = found.per_row()
    return idx, dist, GraphReport(plan=plan, oom_retries=retries, exact=exact, replans=replans,
                                  evaluations_per_row=per_row, screened_per_row=per_row,
                                  pairs_screened=2 * data.n * data.n,
                                  rounded_as_exact=found.rounded and not found.failed.numel(), **extra)


def search_points(data: InputArray, points: torch.Tensor, k: int, metric: Metric, device: torch.device, select: str,
                  search: EnginePlan, include_self: bool, progress: "bool | Progress" = False
                  ) -> tuple[torch.Tensor, torch.Tensor, SearchReport]:
    """The graph's rows of ``points`` (int64, on ``device``): those points searched against the
    data by ``search`` (a plan for k + 1 neighbours, or k with ``include_self``), each point
    then dropped from its own row, as :func:`graph_by_rows` does. Returns (indices, float64
    distances) on ``device`` and the search's report. What a direct graph's uncertified rows
    and a symmetric graph's escalated rows (``EnginePlan.escalation``) run."""
    assert search.k == graph_search_k(k, include_self), "the rows' search is planned for k + 1 neighbours"
    idx, dist, report = exact_search(rows_on(data, device, points), data, search.k, metric, device, select,
                                     search.budget, progress=progress,
                                     plan=replace(search, n_queries=points.numel()))
    if not include_self:
        idx, dist = without_self(idx, dist, k, points=points)
    return idx.to(device), dist.to(device), report


def without_self(idx: torch.Tensor, dist: torch.Tensor, k: int, first: int = 0,
                 points: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's first k entries other than the row's own index (rows of k + 1 entries; row i
    is point ``first + i``, or ``points[i]``)."""
    n = idx.shape[0]
    if points is None:
        points = torch.arange(first, first + n, device=idx.device)
    own = idx == points.to(idx.device)[:, None]
    keep = ~own
    keep[:, -1] &= own.any(dim=1)  # a row without itself drops its last entry
    return idx[keep].view(n, k), dist[keep].view(n, k)
