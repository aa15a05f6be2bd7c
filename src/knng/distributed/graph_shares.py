"""The distributed exact k-NN graph: every rank runs the one-device engine on its share of the work.

Dashti et al. (2013) deal the blocks S(I, J), I ≤ J, of the symmetric graph to the GPUs of a
cluster. Here the blocks are the one-device engine's (:func:`knng.engine.graph.exact_graph`),
planned once, by rank 0, for one device's budget; every rank runs that plan on its share
(:attr:`knng.engine.plan.EnginePlan.share_index`): every own part S(I, I) (each row's first
threshold), and the groups of off-diagonal blocks whose ordinal is its rank modulo the number
of ranks, nearest first where the parts are slabs (so every rank gets its share of the near
blocks that tighten the thresholds, and of the far ones that are skipped). A graph the planner
runs by rows gives each rank its own rows. So a rank runs exactly the pipeline of one device
— its frames, kernels, held survivors, file reads, bands of stores off the device, checkpoints
— and nothing waits for a peer until the end.

Each rank's rows then hold their exact top k among the pairs it screened, and every pair is
screened by one rank at least (an own part's by all of them). The k best of the ranks' lists of
a row, by (distance, index), are its k nearest: each of those is in the list of a rank that
screened it. So, at the end, rank r gathers the lists of its rows (:func:`knng.engine.plan.share_rows`)
from every rank, a chunk at a time, and merges them (:func:`~knng.distributed.shards.merge_exact`:
a pair several ranks found is kept once, and entries that round to the same float32 are settled
by exact evaluation): the graph of one device, bit for bit.

Nothing waits for a peer outside :class:`~knng.distributed.comm.Comm`, so a rank that dies or
hangs stops the others with an error that names it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

import torch
from torch.distributed import ReduceOp

from knng._inputs import InputArray, rows_subset
from knng.distributed.checkpoint import DistributedCheckpoint
from knng.distributed.comm import Comm, agree, check_agreement
from knng.distributed.shards import all_gather_rows, merge_exact
from knng.engine import stages
from knng.engine.common import Progress, integer_extent_of, place_input
from knng.engine.exact import ExactStats
from knng.engine.graph import exact_graph, slab_gain_of
from knng.engine.plan import (
    GRAPH_ROWS, LISTS_ON_DEVICE, EnginePlan, available_ram, make_graph_plan, share_rows,
    with_share,
)
from knng.engine.store import StoreStats
from knng.metrics import METRICS, Metric
from knng.engine.kernels import triton_runs

__all__ = ["DistributedGraphReport", "RankRows", "distributed_graph", "gather_rows", "gather_rows_with",
           "rank_host_budget"]

#: Bytes of the ranks' lists one merge round gathers to a rank (every rank's (distance, index)
#: pairs of a chunk of its rows).
MERGE_BYTES = 256 << 20
#: Share of available host memory one host's ranks may plan with together.
HOST_SHARE = 0.5
#: Seconds between a rank's posts of its progress while it screens.
TICK_SECONDS = 0.5


@dataclass
class RankRows:
    """The finished rows one rank owns: ``parts[i]`` = (start, stop) with its results."""

    parts: list[tuple[int, int]]
    indices: list[torch.Tensor]
    distances: list[torch.Tensor]


@dataclass
class DistributedGraphReport:
    """How a distributed graph run went (the same on every rank: per-rank figures are gathered).

    ``plan`` is rank 0's share of the one plan every rank ran; ``blocks_computed`` counts the
    blocks S(I, J) screened by any rank (own parts once), ``blocks_full`` the P² blocks of the
    whole matrix; ``per_rank`` holds each rank's seconds, time waiting on peers, bytes sent,
    blocks and rows.
    """

    world: int
    part_size: int
    parts: int
    blocks_computed: int
    blocks_full: int
    capacity: int  # candidates a row's store keeps before it tightens its threshold
    screen_dtype: str
    method: str  # the plan's graph method: "symmetric" or "rows"
    exact: ExactStats
    store: StoreStats
    oom_retries: int
    seconds: float
    plan: EnginePlan | None = None
    per_rank: list[dict[str, float]] = field(default_factory=list)
    #: Where a resumed run started, checkpoints saved and their seconds (the slowest rank's).
    checkpoints: dict[str, float] = field(default_factory=dict)
    #: This rank's collectives (for :func:`knng.distributed.comm.replay`) and longest waits.
    comm_ops: list = field(default_factory=list, repr=False)
    waits: list = field(default_factory=list, repr=False)
    #: This rank's pipeline stages and how often they ran (:mod:`knng.engine.stages`).
    stages: dict[str, int] = field(default_factory=dict)
    #: Rows folded into their group's representative (``knng.distributed.folding``).
    duplicates_folded: int = 0
    #: Data on a lattice screened with exact products (:func:`knng.metrics.with_exact_products`).
    exact_products: bool = False
    #: Rows searched again in float64 by the rank that escalated most (each rank's in
    #: ``per_rank``; a row escalated on one rank is escalated on all that take its τ = −∞).
    rows_escalated: int = 0

    @property
    def pairs_saving(self) -> float:
        """Share of the n² score entries the symmetric plan skips."""
        return 1.0 - self.blocks_computed / self.blocks_full if self.blocks_full else 0.0

    @property
    def wait_share(self) -> float:
        """Largest share of a rank's time spent blocked on peers and collectives."""
        return max((r["wait_s"] / r["seconds"] for r in self.per_rank if r["seconds"] > 0), default=0.0)


def rank_host_budget(world: int) -> int:
    """Bytes of host memory one rank may plan with: :data:`HOST_SHARE` of what is available,
    split between the ranks of one host (``LOCAL_WORLD_SIZE``, else the GPUs it has)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", min(world, max(1, torch.cuda.device_count()))))
    return int(available_ram() * HOST_SHARE / max(1, local))


@stages.recorded
def distributed_graph(data: InputArray, k: int, metric: Metric, device: torch.device, select: str, budget: int,
                      comm: Comm, include_self: bool = False, screen_dtype: "torch.dtype | str | None" = None,
                      part_size: int | None = None, checkpoint: DistributedCheckpoint | None = None,
                      keep_checkpoint: bool = False) -> tuple[RankRows, DistributedGraphReport]:
    """This rank's rows of the exact k-NN graph of ``data``; see the module docstring.

    Every rank calls it with the same arguments (``data`` may be a different object per rank,
    e.g. the same file opened by each). ``budget`` is this rank's device budget (the smallest of
    the ranks' is planned with). Returns the rows this rank owns, exact, with float64 distances,
    and a report that is the same on every rank.

    ``checkpoint``: every rank records its own share's progress, as one device does
    (:class:`knng.engine.checkpoint.Checkpoint`, in its own folder), and a resumed rank goes on
    from its own last save: the ranks exchange nothing before the merge, so their saves need no
    agreement. ``keep_checkpoint``: also save the end of the blocks, so that a run killed later
    resumes with only the finishes and the merge to do.
    """
    t_start = time.perf_counter()
    n, d, world, rank = data.n, data.d, comm.world, comm.rank
    comm.status("agreeing on the input and the plan")
    host_budget = rank_host_budget(world)
    table = agree(comm, device, {"n": n, "d": d, "k": k, "metric": list(METRICS).index(metric.name),
                                 "include_self": int(include_self), "cuda": int(device.type == "cuda"),
                                 "itemsize": torch.empty(0, dtype=data.dtype).element_size(),
                                 "budget": budget, "host": host_budget, "triton": int(triton_runs(device))})
    check_agreement({key: table[key] for key in ("n", "d", "k", "metric", "include_self", "cuda", "itemsize")},
                    {"n": "number of points", "d": "dimension", "k": "k", "metric": "metric (index into "
                     f"{list(METRICS)})", "include_self": "include_self", "cuda": "kind of device (1: a GPU)",
                     "itemsize": "bytes per value of the data"})
    # One plan everywhere, for the smallest budgets: rank 0 makes it. Where some rank has no
    # Triton, none screens with a kernel it would lack (the float32 screen runs everywhere).
    budget, host_budget = min(table["budget"]), min(table["host"])
    if screen_dtype is None and len(set(table["triton"])) > 1:
        screen_dtype = "float32"
    rows, budget = place_input(data, device, budget, host_budget)  # what this rank's engine reads
    plan = None
    if rank == 0:
        plan = make_graph_plan(n=n, d=d, k=k, metric=metric.name, device=device, budget=budget,
                               include_self=include_self, source=f"the smallest of {world} ranks' budgets",
                               screen_dtype=screen_dtype, part_size=part_size, host_budget=host_budget,
                               host_source=f"{HOST_SHARE:.0%} of available memory shared by a host's ranks",
                               slab_gain=slab_gain_of(rows, device),
                               integers=integer_extent_of(rows, metric, device))
    plan = with_share(_broadcast_plan(plan, comm, device), rank, world)
    local = None if checkpoint is None else checkpoint.local
    if local is not None:
        plan = local.plan(plan)  # a resumed rank runs the plan it saved
    by_rows = plan.graph_method == GRAPH_ROWS
    # Rank 0's bar: every rank's blocks (each counts the groups it deals, its own or not), or
    # every rank's own rows by rows.
    comm.set_progress_total(n if by_rows else world * plan.blocks)
    ticks = _RankProgress(comm, f"screening blocks of share {rank} of {world}" if not by_rows
                          else f"screening rows {share_rows(n, rank, world)} of the graph by rows")

    def smallest_thresholds(tau: torch.Tensor) -> torch.Tensor:
        comm.status("exchanging the first thresholds of the own parts")
        comm.wait(comm.all_reduce(tau, "the exchange of the first thresholds", op=ReduceOp.MIN))
        return tau

    idx, dist, report = exact_graph(rows, k, metric, device, select, plan.budget, include_self=include_self,
                                    progress=ticks, plan=plan, checkpoint=local, keep_checkpoint=keep_checkpoint,
                                    lists_folder=None if local is None else os.fspath(local.area.path),
                                    share_thresholds=smallest_thresholds)
    ticks.close()
    # Every rank waits here for the slowest share, in one collective: a rank that stopped while
    # screening is named by all the others (not by those waiting on a rank waiting on it).
    comm.barrier(f"the end of every rank's share ({'rows' if by_rows else 'blocks'} screened)")
    owned = share_rows(n, rank, world)
    comm.status(f"finishing part {rank} (rows {owned[0]:,}–{owned[1]:,}): merging every rank's lists")
    if plan.graph_method == GRAPH_ROWS:  # a rank's share is its own rows: nothing to merge
        merged = (idx[owned[0]:owned[1]].to(device), dist[owned[0]:owned[1]].to(device))
    else:
        merged = _merge_lists(idx, dist, n, k, rows, metric, comm, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t_start
    out = _report(comm, plan, report, seconds, device)
    if checkpoint is not None:
        out.checkpoints = checkpoint.summary()
    return RankRows(parts=[owned], indices=[merged[0]], distances=[merged[1]]), out


class _RankProgress(Progress):
    """The engine's blocks (or rows) done, as this rank's ticks and status (proof of life for
    the ranks waiting on it; rank 0's bar), posted at most every :data:`TICK_SECONDS`."""

    def __init__(self, comm: Comm, doing: str) -> None:
        super().__init__(False, 0, "")
        self.comm, self.doing, self.done, self.posted, self.last = comm, doing, 0, 0, 0.0
        comm.status(doing)

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= TICK_SECONDS or self.posted == 0:
            self.close()
            self.comm.status(f"{self.doing}: {self.done:,} done")
            self.last = now

    def close(self) -> None:
        if self.done > self.posted:
            self.comm.tick(self.done - self.posted)
            self.posted = self.done


def _broadcast_plan(plan: EnginePlan | None, comm: Comm, device: torch.device) -> EnginePlan:
    """Rank 0's plan on every rank (its JSON, broadcast as bytes)."""
    text = b"" if plan is None else json.dumps(plan.as_dict()).encode("utf-8")
    size = torch.tensor([len(text)], dtype=torch.int64, device=device)
    comm.wait(comm.broadcast(size, 0, "the broadcast of the plan's size"))
    buf = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    if comm.rank == 0:
        buf.copy_(torch.frombuffer(bytearray(text), dtype=torch.uint8))
    comm.wait(comm.broadcast(buf, 0, "the broadcast of the plan"))
    return EnginePlan.from_dict(json.loads(bytes(buf.cpu().numpy()).decode("utf-8")))


def _merge_lists(idx: torch.Tensor, dist: torch.Tensor, n: int, k: int, data: InputArray, metric: Metric,
                 comm: Comm, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's lists of this rank's rows, gathered a chunk at a time and merged."""
    world, rank = comm.world, comm.rank
    chunk = max(1, MERGE_BYTES // (world * 2 * max(1, k) * 8))
    ranges = [share_rows(n, r, world) for r in range(world)]
    rounds = max(-(-(b - a) // chunk) for a, b in ranges)
    a, b = ranges[rank]
    out_idx = torch.empty((b - a, k), dtype=torch.int64, device=device)
    out_dist = torch.empty((b - a, k), dtype=torch.float64, device=device)
    for step in range(rounds):
        for owner, (o0, o1) in enumerate(ranges):
            c0, c1 = min(o1, o0 + step * chunk), min(o1, o0 + (step + 1) * chunk)
            if c1 <= c0:
                continue
            pack = torch.cat([dist[c0:c1].to(device), idx[c0:c1].to(device, torch.float64)], dim=1)
            what = f"the gather of rows {c0:,}–{c1:,}'s lists to rank {owner}"
            if owner != rank:
                comm.wait(comm.gather(pack, None, owner, what))
                continue
            comm.status(f"finishing part {rank}: merging the lists of rows {c0:,}–{c1:,}")
            parts = [torch.empty_like(pack) for _ in range(world)]
            comm.wait(comm.gather(pack, parts, owner, what))
            values = torch.cat([p[:, :k] for p in parts], dim=1)
            ids = torch.cat([p[:, k:] for p in parts], dim=1).to(torch.int64)
            out_idx[c0 - a:c1 - a], out_dist[c0 - a:c1 - a] = merge_exact(
                values, ids, k, rows_subset(data, [(c0, c1)]), data, metric, device)
    return out_idx, out_dist


def _report(comm: Comm, plan: EnginePlan, report, seconds: float, device: torch.device) -> DistributedGraphReport:
    """Gather every rank's figures into one report (the same on every rank)."""
    symmetric = plan.graph_method != GRAPH_ROWS
    # Own parts: each rank's (part p on rank p mod R) where the stores stay on the device (the
    # thresholds are exchanged), every part on every rank where the graph runs in bands.
    split = plan.lists == LISTS_ON_DEVICE
    own = (len(range(comm.rank, plan.parts, comm.world)) if split else plan.parts) if symmetric else 0
    off_diagonal = plan.parts * (plan.parts - 1) // 2 - report.blocks_skipped if symmetric else plan.parts
    rows = report.exact.rows if plan.graph_method == GRAPH_ROWS else plan.n_corpus
    store = report.store
    local = torch.tensor([seconds, comm.stats.wait_seconds, comm.stats.bytes, off_diagonal + own, rows,
                          store.survivors, report.exact.exact_evaluations, store.tightenings, report.oom_retries,
                          store.overflow_rows, report.rows_escalated], dtype=torch.float64,
                         device=device)
    out = torch.empty(comm.world * local.numel(), dtype=torch.float64, device=device)
    comm.wait(comm.all_gather(out, local, "the gather of the run's figures"))
    table = out.view(comm.world, -1).cpu().tolist()
    per_rank = [{"rank": r, "seconds": row[0], "wait_s": row[1], "bytes": int(row[2]),
                 "blocks": int(row[3]), "rows": int(row[4]), "rows_escalated": int(row[10])}
                for r, row in enumerate(table)]
    own_once = plan.parts if symmetric else 0
    off_diagonal_all = int(sum(r[3] for r in table)) - (own_once if split else comm.world * own_once)
    exact = ExactStats(rows=plan.n_corpus, exact_evaluations=int(sum(r[6] for r in table)))
    stores = StoreStats(survivors=int(sum(r[5] for r in table)), tightenings=int(sum(r[7] for r in table)),
                        exact_evaluations=exact.exact_evaluations, overflow_rows=int(sum(r[9] for r in table)))
    return DistributedGraphReport(
        world=comm.world, part_size=plan.part_size, parts=plan.parts,
        blocks_computed=own_once + off_diagonal_all, blocks_full=plan.parts ** 2, capacity=plan.capacity,
        screen_dtype=plan.screen_precision, method=plan.graph_method, exact=exact, store=stores,
        oom_retries=int(sum(r[8] for r in table)), seconds=max(r[0] for r in table), plan=plan, per_rank=per_rank,
        comm_ops=list(comm.stats.ops), waits=sorted(comm.stats.waits, key=lambda w: -w[1])[:8],
        exact_products=report.exact_products, rows_escalated=max(int(r[10]) for r in table))


def gather_rows(rows: RankRows, n: int, k: int, comm: Comm, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's owned rows, assembled into the whole (n, k) result on every rank."""
    indices, distances, _ = gather_rows_with(rows, n, k, comm, device)
    return indices, distances


def gather_rows_with(rows: RankRows, n: int, k: int, comm: Comm, device: torch.device,
                     extra: list[torch.Tensor] | None = None, width: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`gather_rows`, with ``width`` more float64 columns of each owned part (``extra``: one
    (rows, width) tensor a part, in the order of ``rows.parts``) gathered beside them into
    (n, width)."""
    comm.status("gathering the results")
    if extra is None:
        extra = [torch.empty((b - a, 0), dtype=torch.float64, device=device) for a, b in rows.parts]
    pack = torch.cat([torch.cat([idx.to(torch.float64), dist, more.to(torch.float64),
                                 torch.arange(a, b, device=device, dtype=torch.float64)[:, None]], dim=1)
                      for (a, b), idx, dist, more in zip(rows.parts, rows.indices, rows.distances, extra)]
                     or [torch.empty((0, 2 * k + width + 1), dtype=torch.float64, device=device)])
    out = all_gather_rows(pack, comm, device, "the all-gather of the results")
    order = out[:, 2 * k + width].to(torch.int64)
    indices = torch.empty((n, k), dtype=torch.int64, device=device)
    distances = torch.empty((n, k), dtype=torch.float64, device=device)
    columns = torch.empty((n, width), dtype=torch.float64, device=device)
    indices[order] = out[:, :k].to(torch.int64)
    distances[order] = out[:, k:2 * k]
    columns[order] = out[:, 2 * k:2 * k + width]
    return indices, distances, columns
