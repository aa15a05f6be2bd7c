"""The distributed exact k-NN graph: the block-cyclic scheme of Dashti et al. (2013) on torch.distributed.

Flow on every rank (one way, as in the single-device engine):

1. agree on the input and the plan (one small all-gather; a mismatch is a ``ValueError`` on
   every rank);
2. read the owned parts only: finite check and float64 sums (all-reduced into the common
   centre), then the prepared owned parts (kept on the device when they fit) and their norms
   (all-reduced into every point's norm, which the exact finish needs for any candidate);
3. for each block row I: the all-gather of A_I (every rank reads and prepares 1/R of it; issued
   ``lookahead`` rows ahead, so reads and transfers overlap the products), the blocks S(I, J)
   of the owned columns J > I, each screened once for both sides by the single-device engine's
   block step (:func:`~knng.engine.graph.off_diagonal_blocks`, with its shared thresholds and
   held survivors) into the rank's one store — row candidates in the row slots, column
   candidates in the owned parts' slots (:class:`RankSlots`) — then the row candidates
   gathered to part I's owner;
4. the owner of part I, once that gather has arrived, merges it with part I's column
   candidates (one store, the smallest τ) and runs the single-device exact finish on part I;
5. the caller gathers the owned rows to every rank (:func:`gather_rows`) or writes them to a
   shared file (:mod:`knng.distributed.output`).

Nothing waits for a peer outside :class:`~knng.distributed.comm.Comm`, so a rank that dies or
hangs stops the others with an error that names it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from knng._inputs import InputArray
from knng.distributed.checkpoint import DistributedCheckpoint
from knng.distributed.comm import Comm, agree, check_agreement
from knng.distributed.plan import BlockPlan
from knng.distributed.rank_store import RankColumns, RankSlots, rank_store
from knng.distributed.shards import all_gather_rows, common_centre
from knng.engine import stages
from knng.engine.common import CorpusStats, LatticeExtent, full_precision
from knng.engine.exact import ExactStats, exact_pairs_of
from knng.engine.graph import (
    BlockCounts, GlobalFrames, SharedThresholds, Tile, off_diagonal_blocks, retry_on_oom, screen_own_part,
)
from knng.engine.plan import (
    BLOCK_BYTES_PER_ELEMENT, MIN_TILE, resolve_precision, store_capacity,
)
from knng.engine.screen import ScoreBuffer
from knng.engine.store import CandidateStore, PairErrors, StoreStats
from knng.metrics import METRICS, PRECISIONS, Metric, ScreenPrecision
from knng.engine.kernels import prepare_rows, screen_kernel_runs

__all__ = ["DistributedGraphReport", "RankRows", "RankSizes", "distributed_graph", "gather_rows", "gather_rows_with",
           "rank_host_budget", "rank_sizes"]

#: Block rows whose all-gather is issued ahead of the one being computed (double buffering, and
#: room for a rank whose block rows hold fewer blocks to run ahead of its peers without waiting).
LOOKAHEAD = 3
#: Largest part (block side) on a GPU / a CPU, as in the single-device planner.
MAX_PART = {"cuda": 1 << 16, "cpu": 2048}
#: Largest screen tile height on a GPU / a CPU.
MAX_SUB_ROWS = {"cuda": 1 << 16, "cpu": 1024}


@dataclass
class RankRows:
    """The finished rows one rank owns: ``parts[i]`` = (start, stop) with its results."""

    parts: list[tuple[int, int]]
    indices: list[torch.Tensor]
    distances: list[torch.Tensor]


@dataclass
class DistributedGraphReport:
    """How a distributed graph run went (the same on every rank: per-rank figures are gathered)."""

    world: int
    part_size: int
    parts: int
    blocks_computed: int
    blocks_full: int
    capacity: int  # candidates a row's store keeps before it tightens its threshold
    screen_dtype: str
    columns: str  # where the owned column parts are kept: see COLUMN_TIERS
    exact: ExactStats
    store: StoreStats
    oom_retries: int
    seconds: float
    per_rank: list[dict[str, float]] = field(default_factory=list)
    #: Where a resumed run started (block rows done), checkpoints saved and their seconds.
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

    @property
    def pairs_saving(self) -> float:
        """Share of the n² score entries the symmetric plan skips."""
        return 1.0 - self.blocks_computed / self.blocks_full if self.blocks_full else 0.0

    @property
    def wait_share(self) -> float:
        """Largest share of a rank's time spent blocked on peers and collectives."""
        return max((r["wait_s"] / r["seconds"] for r in self.per_rank if r["seconds"] > 0), default=0.0)


#: Where a rank keeps the column parts it owns, best first: prepared on the device; as read
#: (the input's dtype, half the bytes of a float64 screen's layout) on the device, prepared per
#: block; as read in (pinned) host memory, copied and prepared per block; or not at all, read
#: again from the input for every block (prefetched while the previous block runs).
COLUMN_TIERS = ("prepared on the device", "raw on the device", "raw in host memory", "read per block")
#: Share of available host memory the raw column parts of all of a host's ranks may take.
HOST_SHARE = 0.5


@dataclass(frozen=True)
class RankSizes:
    """One rank's sizes: the block plan, the screen tile height, where the owned columns live."""

    plan: BlockPlan
    sub_rows: int
    columns: str


def rank_host_budget(world: int) -> int:
    """Bytes of host memory one rank may use for raw column parts."""
    import os

    from knng.engine.plan import available_ram

    local = int(os.environ.get("LOCAL_WORLD_SIZE", min(world, max(1, torch.cuda.device_count()))))
    return int(available_ram() * HOST_SHARE / max(1, local))


def rank_sizes(n: int, d: int, kc: int, world: int, budget: int, metric: Metric, dtype: torch.dtype,
               device: torch.device, part_size: int | None, input_itemsize: int = 4,
               host_budget: int | None = None, materialised: bool = True) -> RankSizes:
    """Part size, screen tile height and where the owned columns live, from one rank's budgets
    (also what ``bench/scaling_model.py`` replays for worlds it has not run). ``materialised``:
    the screen writes its score blocks (no kernel screens them on some rank)."""
    e = dtype.itemsize
    vec = metric.width(d, device, dtype) * e
    owned_rows = -(-n // world)
    fixed = n * 32 + owned_rows * kc * 25  # every norm, term and first threshold; the owned parts' stores
    raw = owned_rows * d * input_itemsize
    if owned_rows * vec <= budget // 3:
        columns, on_device = COLUMN_TIERS[0], owned_rows * vec
    elif raw <= budget // 3:
        columns, on_device = COLUMN_TIERS[1], raw
    elif device.type == "cuda" and raw <= (rank_host_budget(world) if host_budget is None else host_budget):
        columns, on_device = COLUMN_TIERS[2], 0
    else:
        columns, on_device = COLUMN_TIERS[3], 0
    remaining = max(budget - fixed - on_device, budget // 8)
    # Per row of a part: the A_I buffers in flight, the row store, the gathered stores at the
    # owner (twice: one gather may wait while the next arrives) and a column part prepared for
    # its block (two when they are read from the input, one being prefetched).
    extra = {COLUMN_TIERS[0]: 0, COLUMN_TIERS[1]: vec, COLUMN_TIERS[2]: vec + d * input_itemsize,
             COLUMN_TIERS[3]: 2 * vec}[columns]
    per_row = (LOOKAHEAD + 2) * vec + kc * 25 + (world + 1) * (3 * kc + 1) * 8 * 2 + extra
    on = "cuda" if device.type == "cuda" else "cpu"
    block_bytes = BLOCK_BYTES_PER_ELEMENT * max(4, e) // 4  # score blocks are float32 below float64
    # The engine's block step screens an off-diagonal block whole: where the screen writes it,
    # a block of two parts takes at most half of what the part buffers leave.
    by_block = math.isqrt(max(1, remaining // 4 // block_bytes)) if materialised else MAX_PART[on]
    max_part = max(MIN_TILE, min(MAX_PART[on], remaining // 2 // per_row, by_block))
    plan = BlockPlan(n=n, world=world, part_size=part_size) if part_size else BlockPlan.build(n, world, max_part)
    b = plan.part_size
    # A part's own block gets what the part buffers leave: the whole part at once where it fits
    # (each extra row tile costs another column selection), else equal row tiles.
    room = max(remaining - b * per_row, remaining // 4)
    sub = int(min(b, MAX_SUB_ROWS[on], max(MIN_TILE, room // max(1, b * block_bytes))))
    sub = -(-b // -(-b // sub))
    return RankSizes(plan=plan, sub_rows=sub, columns=columns)


@stages.recorded
def distributed_graph(data: InputArray, k: int, metric: Metric, device: torch.device, select: str, budget: int,
                      comm: Comm, include_self: bool = False, screen_dtype: "torch.dtype | str | None" = None,
                      part_size: int | None = None, checkpoint: DistributedCheckpoint | None = None,
                      keep_checkpoint: bool = False) -> tuple[RankRows, DistributedGraphReport]:
    """This rank's share of the exact k-NN graph of ``data``; see the module docstring.

    Every rank calls it with the same arguments (``data`` may be a different object per rank,
    e.g. the same file opened by each; only the rows a rank needs are read). Returns the rows
    this rank owns, exact, with float64 distances, and a report that is the same on every rank.

    ``checkpoint``: where every rank records its progress, and the step to resume from. Steps
    are block rows: after block row I, once the gathers of the rows to their owners are drained
    (nothing in flight changes what is saved), a rank saves its owned parts' column stores, the
    merged candidates of the owned parts already complete, and the first thresholds; a resumed
    run reuses the saved plan and starts at the next block row. ``keep_checkpoint``: also save
    the end of the block rows, so that a run killed later (writing its results) resumes with only
    the finish to do.
    """
    t_start = time.perf_counter()
    n, d, world, rank = data.n, data.d, comm.world, comm.rank
    available = n if include_self else n - 1
    wanted = resolve_precision(screen_dtype, device, n, d, k, operation="graph")
    comm.status("agreeing on the input and the plan")
    table = agree(comm, device, {"n": n, "d": d, "k": k, "metric": list(METRICS).index(metric.name),
                                 "include_self": int(include_self), "cuda": int(device.type == "cuda"),
                                 "itemsize": torch.empty(0, dtype=data.dtype).element_size(),
                                 "budget": budget, "host": rank_host_budget(world),
                                 "precision": list(PRECISIONS).index(wanted),
                                 # whether a kernel screens blocks (else they are written whole)
                                 "kernel": int(screen_kernel_runs(device, PRECISIONS[wanted])),
                                 "kernel_f32": int(screen_kernel_runs(device, PRECISIONS["float32"]))})
    check_agreement({key: table[key] for key in ("n", "d", "k", "metric", "include_self", "cuda", "itemsize")},
                    {"n": "number of points", "d": "dimension", "k": "k", "metric": "metric (index into "
                     f"{list(METRICS)})", "include_self": "include_self", "cuda": "kind of device (1: a GPU)",
                     "itemsize": "bytes per value of the data"})
    comm.connect_pairs(device)
    # Plans must match everywhere: the smallest budgets and the cheaper screen any rank can run.
    budget = min(table["budget"])
    # One precision everywhere (the screen must be the same on every rank for bit-identical
    # stores); where ranks would choose differently (one lacks Triton) all take float32.
    choices = set(table["precision"])
    precision = PRECISIONS[wanted] if len(choices) == 1 else PRECISIONS["float32"]
    dtype = precision.storage
    capacity = store_capacity(k, available)
    kernels = table["kernel"] if len(choices) == 1 else table["kernel_f32"]
    sizes = rank_sizes(n, d, capacity, world, budget, metric, dtype, device, part_size,
                       input_itemsize=table["itemsize"][0], host_budget=min(table["host"]),
                       materialised=not all(kernels))
    done = 0  # block rows a resumed run had finished
    if checkpoint is not None:
        # The saved plan, when resuming: the state is per part (budgets may have changed since).
        saved = checkpoint.plan({"part_size": sizes.plan.part_size, "sub_rows": sizes.sub_rows,
                                 "columns": sizes.columns, "precision": precision.name})
        sizes = RankSizes(plan=BlockPlan(n=n, world=world, part_size=int(saved["part_size"])),
                       sub_rows=int(saved["sub_rows"]), columns=str(saved["columns"]))
        precision = PRECISIONS[saved["precision"]]
        dtype = precision.storage
        done = checkpoint.check_step(sizes.plan.n_parts)
    plan = sizes.plan
    owned = plan.owned(rank)
    P = plan.n_parts
    # Progress: every rank's off-diagonal blocks, then every part's finish.
    comm.set_progress_total(sum(P - 1 - i for i in range(done, P)) + P)
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knng-read")
    stats = ExactStats()
    counts = BlockCounts()
    try:
        with full_precision():
            metric, precision, centre, norms, terms, kept = _prepare_owned(data, metric, precision, plan, owned,
                                                                           comm, device, sizes.columns)
            source = RankColumns(data, metric, plan.parts, centre, device, dtype, kept,
                                 prepared=sizes.columns == COLUMN_TIERS[0], reader=reader, norms=norms, terms=terms)
            frames = GlobalFrames(source, list(plan.parts))
            centre_norm = 0.0 if centre is None else float(torch.linalg.vector_norm(centre))
            store, slots = rank_store(data, metric, precision, plan, owned, norms, terms, centre_norm, k, capacity,
                                       budget, device)
            results: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (r0, r1) → rows
            width = metric.width(d, device, dtype)
            gathers: dict[int, tuple[Any, torch.Tensor]] = {}
            piece_reads: dict[int, Any] = {}

            def read_piece(part: int) -> None:
                a, b = plan.piece(part, rank)
                piece_reads[part] = reader.submit(data.rows, a, b)

            def start_gather(part: int) -> None:
                s = plan.piece_rows(part)
                a, b = plan.piece(part, rank)
                local = torch.zeros((s, width), dtype=dtype, device=device)
                if b > a:
                    local[:b - a] = source.prepare(piece_reads.pop(part).result())
                else:
                    piece_reads.pop(part, None)
                buf = torch.empty((world * s, width), dtype=dtype, device=device)
                gathers[part] = (comm.all_gather(buf, local, f"the all-gather of part {part}"), buf)

            for part in range(done, min(P, done + LOOKAHEAD + 2)):
                read_piece(part)
            for part in range(done, min(P, done + LOOKAHEAD + 1)):
                start_gather(part)

            offsets = torch.full((n,), 1.0 if metric.normalize else 0.0, dtype=torch.float64, device=device)
            # Thresholds first: every owned part screens its own block S(J, J) (its k best seed
            # τ, as on one device), then one all-reduce gives every rank every point's τ.
            ready: dict[int, torch.Tensor] = {}
            if done:
                with checkpoint.restoring():
                    tau = _restore(checkpoint, store, slots, plan.parts, ready, counts, device)
            else:
                tau = torch.full((n,), torch.inf, dtype=torch.float64, device=device)
            for j in owned if not done else ():
                j0, j1 = plan.parts[j]
                comm.status(f"screening block ({j}, {j}): the first thresholds of part {j}")
                own = Tile(source.column(j), norms[j0:j1], None if terms is None else terms[j0:j1],
                           None if source.terms32 is None else source.terms32[j0:j1])
                counts.retries += retry_on_oom(partial(screen_own_part, own, d, metric, store, slots.of(j),
                                                       torch.arange(j0, j1, device=device), k, include_self, select,
                                                       device, sizes.sub_rows, precision=precision), device)
                counts.screened += (j1 - j0) ** 2
                tau[j0:j1] = store.tau[slots.owned(j)]
            if not done:
                comm.wait(comm.all_reduce(tau, "the exchange of the first thresholds", op=dist.ReduceOp.MIN))
                for j in owned:
                    store.lower_thresholds(slots.owned(j), tau[slice(*plan.parts[j])])
            # Every point's threshold against the corpus's largest norm, for every block (one centre).
            thresholds = SharedThresholds.when_uniform(store, norms, terms, [frames.ids(p) for p in range(P)])
            buffer = ScoreBuffer() if device.type == "cpu" else None
            ticks = _Ticks(comm)
            finishing: deque = deque()  # (part, pending gather, buffers) at the owner, until merged
            sends: deque = deque()  # (pending gather, buffer) kept alive until sent

            def arrive(part: int, pending: Any, bufs: list[torch.Tensor]) -> None:
                """Part ``part``'s candidates are complete: its own store and every rank's row stores."""
                comm.status(f"finishing part {part}: merging its candidates")
                comm.wait(pending)
                ready[part] = store.pack(slots.owned(part))
                for buf in bufs:
                    ready[part] = torch.cat([ready[part][:, :-1], buf[:, :-1],
                                             torch.minimum(ready[part][:, -1:], buf[:, -1:])], dim=1)

            def drain() -> None:
                """Wait for every gather of row candidates to owners, and merge what arrived."""
                while finishing:
                    arrive(*finishing.popleft())
                while sends:
                    comm.wait(sends.popleft()[0])

            def save(step: int) -> None:
                assert checkpoint is not None
                drain()
                # A few arrays, whatever the number of parts (a file costs a flush): the owned
                # parts' store rows and the complete parts' candidates, each stacked by rows.
                arrays: dict[str, torch.Tensor] = {"tau": tau}
                if owned:
                    for name, tensor in store.rows_state(slots.every_owned).items():
                        arrays[f"store_{name}"] = tensor
                if ready:
                    arrays["ready"] = torch.cat([ready[part] for part in sorted(ready)])
                checkpoint.save(step, {"ready_parts": sorted(ready), "store": vars(store.stats),
                                       "retries": counts.retries, "computed": counts.computed,
                                       "screened": counts.screened},
                                arrays, f"{step:,} of {P:,} block rows done")

            saved_at = done
            for i in range(done, P):
                i0, i1 = plan.parts[i]
                comm.status(f"waiting for the all-gather of part {i}")
                pending, buf = gathers.pop(i)
                comm.wait(pending)
                if i + LOOKAHEAD + 2 < P:
                    read_piece(i + LOOKAHEAD + 2)
                if i + LOOKAHEAD + 1 < P:
                    start_gather(i + LOOKAHEAD + 1)
                todo = [j for j in plan.row_blocks(rank, i) if j != i]  # S(I, I) came first
                # The row slots take part I's points, their thresholds the first ones.
                slots.take_row_part(i, tau[i0:i1])
                source.start_row(i, buf[:i1 - i0], todo)
                comm.status(f"screening block row {i} (parts {todo[0]}–{todo[-1]})" if todo
                            else f"block row {i}: no block on this rank")
                off_diagonal_blocks(frames, store, metric, precision, thresholds, device, carry_norms=False,
                                    buffer=buffer, bar=ticks, counts=counts, first_step=0,
                                    order=[(i, j) for j in todo], slots=slots.of)
                # Part I's row candidates from this rank go to part I's owner.
                pack = store.pack(slots.row)
                owner = plan.owner(i)
                what = f"the gather of part {i}'s row candidates to rank {owner}"
                if rank == owner:
                    bufs = [torch.empty_like(pack) for _ in range(world)]
                    finishing.append((i, comm.gather(pack, bufs, owner, what), bufs))
                else:
                    sends.append((comm.gather(pack, None, owner, what), pack))
                # Merge every owned part whose candidates have all arrived (without waiting).
                while finishing and finishing[0][1].work.is_completed():
                    arrive(*finishing.popleft())
                while sends and sends[0][0].work.is_completed():
                    comm.wait(sends.popleft()[0])
                if checkpoint is not None:
                    # Agreed LOOKAHEAD rows ahead: no rank waits for the others to decide.
                    checkpoint.propose()
                    if checkpoint.decided(LOOKAHEAD):
                        save(i + 1)
                        saved_at = i + 1
            drain()
            if checkpoint is not None:
                checkpoint.settle()
                if keep_checkpoint and saved_at < P:
                    save(P)  # only the finish is left to a run that resumes this
            # The exact finish, shared: every part is cut into one slice per rank, so every rank
            # finishes n / R rows and none waits for an owner that finishes whole parts alone
            # (the parts whose blocks come last would otherwise all be finished at the end).
            width = (world + 1) * capacity * 3 + 1
            slices = []
            for part in range(P):
                p0, p1 = plan.parts[part]
                owner = plan.owner(part)
                s_rows = -(-(p1 - p0) // world)
                mine = torch.empty((s_rows, width), dtype=torch.float64, device=device)
                chunks = None
                if rank == owner:
                    full = torch.zeros((world * s_rows, width), dtype=torch.float64, device=device)
                    full[:p1 - p0] = ready.pop(part)
                    chunks = list(full.split(s_rows))
                what = f"the scatter of part {part}'s candidates by rank {owner}"
                slices.append((part, s_rows, mine, chunks, comm.scatter(mine, chunks, owner, what)))
            for part, s_rows, mine, _chunks, pending in slices:
                comm.wait(pending)
                p0, p1 = plan.parts[part]
                a, b = min(p1 - p0, rank * s_rows), min(p1 - p0, (rank + 1) * s_rows)
                if b > a:
                    comm.status(f"finishing rows {p0 + a}–{p0 + b}: exact re-rank")
                    r0, r1 = p0 + a, p0 + b
                    errors = PairErrors(metric=metric, d=d, precision=precision, row_norms=norms[r0:r1],
                                        row_terms=None if terms is None else terms[r0:r1],
                                        row_offsets=offsets[r0:r1], col_norms=norms, col_terms=terms,
                                        centre_norm=centre_norm)

                    def evaluate(rows: torch.Tensor, cols: torch.Tensor, base: int = p0 + a) -> torch.Tensor:
                        return exact_pairs_of(metric, data, rows + base, data, cols, device)

                    merged = CandidateStore.from_packs(_unpack(mine[:b - a], world + 1, capacity), k, errors,
                                                       evaluate, device)
                    o_i, o_d = merged.finish()
                    results[(p0 + a, p0 + b)] = (o_i, o_d)
                    stats.rows += b - a
                    stats.exact_evaluations += merged.stats.exact_evaluations
                    comm.tick()
            del slices
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t_start
    report = replace(_report(comm, plan, sizes, capacity, precision.name, stats, store.stats, counts.retries, seconds,
                             device), exact_products=precision.exact_products)
    if checkpoint is not None:
        report.checkpoints = checkpoint.summary()
    ranges = sorted(results)
    return RankRows(parts=ranges, indices=[results[r][0] for r in ranges],
                    distances=[results[r][1] for r in ranges]), report


class _Ticks:
    """Blocks done, counted to the job's progress (the engine's block loop updates a bar)."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def update(self, n: int = 1) -> None:
        self.comm.tick(n)


def _restore(checkpoint: DistributedCheckpoint, store: CandidateStore, slots: RankSlots,
             parts: tuple[tuple[int, int], ...], ready: dict[int, torch.Tensor], counts: BlockCounts,
             device: torch.device) -> torch.Tensor:
    """A resumed rank's state: its owned parts' store rows and the store's counters, its complete
    owned parts (into ``ready``), its block counters; returns the first thresholds."""
    state, arrays = checkpoint.state, checkpoint.arrays()
    assert state is not None

    def rows_of(name: str, start: int, stop: int) -> torch.Tensor:
        # A copy: the saved arrays are read-only memory maps, and torch wants writable memory.
        return torch.from_numpy(np.array(arrays[name][start:stop])).to(device)

    owned = slots.every_owned
    if owned.stop > owned.start:
        store.load_rows(owned, {name[len("store_"):]: rows_of(name, 0, owned.stop - owned.start)
                                for name in arrays if name.startswith("store_")})
    store.stats = StoreStats(**{f: int(v) for f, v in state["store"].items()})
    row = 0
    for part in state["ready_parts"]:
        p0, p1 = parts[part]
        ready[part] = rows_of("ready", row, row + p1 - p0)
        row += p1 - p0
    counts.retries, counts.computed, counts.screened = (int(state[f]) for f in ("retries", "computed", "screened"))
    return rows_of("tau", 0, len(arrays["tau"]))


def _prepare_owned(data: InputArray, metric: Metric, precision: ScreenPrecision, plan: BlockPlan, owned: list[int],
                   comm: Comm, device: torch.device, columns: str
                   ) -> tuple[Metric, ScreenPrecision, torch.Tensor | None, torch.Tensor, torch.Tensor | None,
                              dict[int, torch.Tensor]]:
    """Finite check, centre and lattice over the owned parts (all-reduced: the same on every
    rank), then their prepared form and every norm. Returns the metric and precision the screen
    runs with: on data on a lattice (integers, grey levels / 255), exact products around a
    lattice point, as on one device (:meth:`knng.engine.common.CorpusStats.screen`)."""
    n, d = data.n, data.d
    dtype = precision.storage
    need_mean = metric.needs_centre(True)
    lattices = LatticeExtent.every(d, device) if precision.scaled and metric.translation_invariant and need_mean \
        else []

    def owned_blocks():
        for j in owned:
            p0, p1 = plan.parts[j]
            comm.status(f"reading part {j} (rows {p0}–{p1}): finite check, sums and lattice")
            for s in range(p0, p1, 1 << 16):
                block = data.rows(s, min(p1, s + (1 << 16))).to(device, non_blocking=True)
                LatticeExtent.add_to(lattices, block)
                yield s, block

    centre = common_centre(owned_blocks(), n, d, data.name, need_mean, comm, device)

    def all_reduce(tensor: torch.Tensor, op: str) -> None:
        reduce_op = dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX
        comm.wait(comm.all_reduce(tensor, "the exchange of the lattice's extents", op=reduce_op))

    for lattice in lattices:
        lattice.combine(all_reduce)
    precision, centre, unit = CorpusStats.of(centre, lattices).screen(precision)
    if unit is not None and (unit != 1.0 or precision.lattice_error > 0):
        # Rows rounded onto the lattice (exact integers, centred on integers, already are).
        metric = replace(metric, lattice=unit)
    norms = torch.zeros(n, dtype=torch.float64, device=device)
    terms = torch.zeros(n, dtype=torch.float64, device=device) if metric.uses_terms else None
    kept: dict[int, torch.Tensor] = {}
    for j in owned:
        p0, p1 = plan.parts[j]
        comm.status(f"preparing part {j} (rows {p0}–{p1})")
        raw = data.rows(p0, p1)
        prep = prepare_rows(metric, raw.to(device, non_blocking=True), centre, side="corpus", symmetric=True,
                                   dtype=dtype)
        norms[p0:p1] = prep.norms
        if terms is not None:
            terms[p0:p1] = prep.terms
        if columns == COLUMN_TIERS[0]:
            kept[j] = prep.vectors
        elif columns == COLUMN_TIERS[1]:
            kept[j] = raw.to(device)  # a view where the input already lives there (never written)
        elif columns == COLUMN_TIERS[2]:
            kept[j] = raw.to("cpu", copy=True).pin_memory() if torch.cuda.is_available() else raw.to("cpu", copy=True)
    both = norms if terms is None else torch.stack([norms, terms])
    comm.wait(comm.all_reduce(both, "the exchange of norms"))
    if terms is None:
        return metric, precision, centre, both, None, kept
    return metric, precision, centre, both[0].contiguous(), both[1].contiguous(), kept


def _report(comm: Comm, plan: BlockPlan, sizes: RankSizes, capacity: int, precision: str, stats: ExactStats,
            store: StoreStats, oom_retries: int, seconds: float, device: torch.device) -> DistributedGraphReport:
    """Gather every rank's figures into one report (the same on every rank)."""
    local = torch.tensor([seconds, comm.stats.wait_seconds, 0.0, comm.stats.bytes,
                          len(plan.blocks(comm.rank)), stats.rows, store.survivors, stats.exact_evaluations,
                          store.tightenings, oom_retries, store.overflow_rows], dtype=torch.float64, device=device)
    out = torch.empty(comm.world * local.numel(), dtype=torch.float64, device=device)
    comm.wait(comm.all_gather(out, local, "the gather of the run's figures"))
    table = out.view(comm.world, -1).cpu().tolist()
    per_rank = [{"rank": r, "seconds": row[0], "wait_s": row[1], "bytes": int(row[3]),
                 "blocks": int(row[4]), "rows": int(row[5])} for r, row in enumerate(table)]
    exact = ExactStats(rows=int(sum(r[5] for r in table)), exact_evaluations=int(sum(r[7] for r in table)))
    stores = StoreStats(survivors=int(sum(r[6] for r in table)), tightenings=int(sum(r[8] for r in table)),
                        exact_evaluations=exact.exact_evaluations, overflow_rows=int(sum(r[10] for r in table)))
    return DistributedGraphReport(
        world=comm.world, part_size=plan.part_size, parts=plan.n_parts, blocks_computed=plan.total_blocks(),
        blocks_full=plan.n_parts ** 2, capacity=capacity, screen_dtype=precision,
        columns=sizes.columns, exact=exact, store=stores,
        oom_retries=int(sum(r[9] for r in table)), seconds=max(r[0] for r in table), per_rank=per_rank,
        comm_ops=list(comm.stats.ops),
        waits=sorted(comm.stats.waits, key=lambda w: -w[1])[:8])


def _unpack(packed: torch.Tensor, count: int, capacity: int) -> list[torch.Tensor]:
    """Split ``count`` stores laid side by side (keys, ids, distances each) plus one τ column."""
    width = 3 * capacity
    tau = packed[:, -1:]
    return [torch.cat([packed[:, s * width:(s + 1) * width], tau], dim=1) for s in range(count)]


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

