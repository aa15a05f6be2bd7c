"""Identical rows folded into one for a distributed run, found by the ranks together.

The single-device engine folds groups of identical rows before a graph or a search and unfolds
the answer after (:mod:`knng.engine.duplicates`, whose proof shows the unfolded answer exact).
Several ranks fold the same way, with the work shared:

1. each rank reads its own contiguous share of the rows once: the finite check (all-reduced,
   so that every rank raises the same error) and the rows' fingerprints;
2. the fingerprints (16 bytes a row) are all-gathered, so every rank forms the same key groups;
3. each rank compares the twins of its share with their key group's first row by value, and
   the answers are all-gathered: every rank then holds the same groups;
4. the run computes the graph of the groups' representatives (or searches them), every rank
   reading only the representatives' rows it needs;
5. the answer is unfolded: a whole graph or search on every rank, or a rank's own contiguous
   rows for :func:`knng.distributed.graph_to_files`, from the representatives' graph gathered
   with each representative's exact distance to itself (computed by its owner).

Every decision is collective, and the groups are the same on every rank, so the answer is the
one the single-device engine gives, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from knng._inputs import InputArray, first_nonfinite_row
from knng.distributed.graph_shares import (
    DistributedGraphReport, RankRows, gather_rows_with, rank_host_budget)
from knng.distributed.comm import Comm, agree, check_agreement
from knng.engine.plan import share_rows
from knng.distributed.shards import all_gather_rows
from knng.engine import duplicates
from knng.engine.exact import ExactStats, exact_pairs_of
from knng.engine.store import StoreStats
from knng.metrics import Metric

__all__ = ["Folding", "fold", "graph_of_one_group", "unfold_graph_rows", "unfold_search"]


@dataclass(frozen=True)
class Folding:
    """A run's input folded: ``reps`` (the groups' representatives, what the engine reads) and the
    ``groups`` of rows of the original input of ``n`` rows."""

    groups: duplicates.DuplicateGroups
    reps: InputArray
    n: int

    @property
    def folded_away(self) -> int:
        """Rows the run did not compute: ``n`` less the representatives."""
        return self.n - self.reps.n


#: A folded graph is unfolded from the representatives' graph gathered on every rank (at most
#: n rows of 2k + 2 float64 values, packed and unpacked): folding is declined where that would
#: take more than this share of the device budget (the graph, gathered on every rank anyway,
#: or written to files by each rank for its own rows so that nothing that large is gathered).
GATHER_SHARE = 4


def fold(data: InputArray, k: int, metric: Metric, comm: Comm, device: torch.device, *,
         budget: int | None = None) -> Folding | None:
    """The folding of ``data`` for a run with ``k`` neighbours, the same on every rank (collective),
    or None where folding does not apply or pay (:func:`knng.engine.duplicates.folds`, and
    :func:`~knng.engine.duplicates.find_duplicates`' rule on group sizes). ``budget``: a graph's
    device budget, which the gathered representatives' graph must fit (:data:`GATHER_SHARE`)."""
    if not duplicates.folds(metric):
        return None
    if budget is not None and 2 * data.n * (2 * k + 2) * 8 * GATHER_SHARE > budget:
        return None
    table = agree(comm, device, {"n": data.n, "d": data.d})
    check_agreement(table, {"n": "number of points", "d": "dimension"})
    groups = shared_groups(data, k, comm, device)
    if groups is None:
        return None
    return Folding(groups=groups, reps=duplicates.representatives(data, groups), n=data.n)


def shared_groups(data: InputArray, k: int, comm: Comm, device: torch.device) -> duplicates.DuplicateGroups | None:
    """:func:`knng.engine.duplicates.find_duplicates_in` by every rank together: each reads and
    fingerprints its share of the rows, and checks the twins of its share (collective; the same
    groups on every rank)."""
    n, d = data.n, data.d
    if n < 2:
        return None
    block_rows = duplicates.read_rows(d, rank_host_budget(comm.world))
    sample_rows = min(duplicates.SAMPLE_ROWS, block_rows)
    if not data.in_memory and n > 4 * duplicates.SAMPLE_BLOCKS * sample_rows:
        # A file is read through only where a sample repeats a row; the ranks decide together,
        # so that a rounding that differs between devices cannot split them.
        repeats = duplicates.repeats_in_sample(data, device, sample_rows)
        if not any(agree(comm, device, {"repeats": int(repeats)})["repeats"]):
            return None
    a, b = share_rows(n, comm.rank, comm.world)
    dtype = torch.float64 if data.dtype == torch.float64 else torch.float32
    keys, bad = [torch.empty((0, 2), dtype=dtype, device=device)], n
    for start in range(a, b, block_rows):
        block = data.rows(start, min(b, start + block_rows)).to(device, non_blocking=True)
        row = first_nonfinite_row(block) if bad == n else None
        if row is not None:
            bad = start + row
        keys.append(duplicates.fingerprints(block))
    first_bad = torch.tensor([bad], dtype=torch.int64, device=device)
    comm.wait(comm.all_reduce(first_bad, "the finite check", op=dist.ReduceOp.MIN))
    if int(first_bad.item()) < n:
        raise ValueError(f"{data.name} contains NaN or Inf (first in row {int(first_bad.item())}); "
                         "knng needs finite values")
    every_key = all_gather_rows(torch.cat(keys), comm, device, "the all-gather of the rows' fingerprints")

    def equal(rows: torch.Tensor, firsts: torch.Tensor) -> torch.Tensor:
        # `rows` ascend: this rank's twins are one run of them.
        lo, hi = torch.searchsorted(rows, torch.tensor([a, b], dtype=rows.dtype, device=rows.device)).tolist()
        mine = duplicates.equal_rows(data, rows[lo:hi], firsts[lo:hi], device, block_rows)
        return all_gather_rows(mine.to(torch.uint8)[:, None], comm, device,
                               "the all-gather of the twins' checks")[:, 0].bool()

    return duplicates.groups_of_keys(every_key, k, equal)


def graph_of_one_group(folding: Folding, comm: Comm) -> tuple[RankRows, DistributedGraphReport]:
    """The representatives' graph where every row is in one group: no neighbours to compute
    (every row's are its twins)."""
    device = folding.groups.reps.device
    empty = [torch.empty((1, 0), dtype=dt, device=device) for dt in (torch.int64, torch.float64)]
    rows = RankRows(parts=[(0, 1)], indices=[empty[0]], distances=[empty[1]]) if comm.rank == 0 else \
        RankRows(parts=[], indices=[], distances=[])
    report = DistributedGraphReport(world=comm.world, part_size=1, parts=1, blocks_computed=0, blocks_full=1,
                                    capacity=0, screen_dtype="none", method="none", exact=ExactStats(rows=1),
                                    store=StoreStats(), oom_retries=0, seconds=0.0)
    return rows, report


def unfold_graph_rows(rows: RankRows, report: DistributedGraphReport, folding: Folding, k_reps: int, k: int,
                      include_self: bool, metric: Metric, comm: Comm, device: torch.device
                      ) -> tuple[RankRows, DistributedGraphReport]:
    """This rank's contiguous share of the rows of the graph, unfolded from the representatives'
    graph (each rank's ``rows`` of it; collective); what the rank gathers or writes to files, as
    an unfolded run's owned rows. The representatives' graph is gathered on every rank
    (``u × k_reps`` entries, with each representative's exact distance to itself, computed by the
    rank that owns it)."""
    reps = folding.reps
    self_dist = [exact_pairs_of(metric, reps, torch.arange(a, b, device=device), reps,
                                torch.arange(a, b, device=device), device)[:, None] for a, b in rows.parts]
    idx, dist, own = gather_rows_with(rows, reps.n, k_reps, comm, device, self_dist, width=1)
    groups = folding.groups.to(device)
    a, b = share_rows(folding.n, comm.rank, comm.world)
    out_idx, out_dist = duplicates.unfold_graph(groups, idx, dist, own[:, 0], k, include_self, rows=slice(a, b))
    unfolded = RankRows(parts=[(a, b)], indices=[out_idx], distances=[out_dist])
    return unfolded, replace(report, duplicates_folded=folding.folded_away)


def unfold_search(idx: torch.Tensor, dist: torch.Tensor, folding: Folding, k: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """A search's answer over every corpus row from its answer over the representatives."""
    return duplicates.unfold_search(folding.groups.to(device), idx.to(device), dist.to(device), k)
