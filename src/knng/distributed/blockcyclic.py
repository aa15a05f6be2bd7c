"""The distributed exact k-NN graph: the block-cyclic scheme of Dashti et al. (2013) on torch.distributed.

Flow on every rank (one way, as in the single-device engine):

1. agree on the input and the plan (one small all-gather; a mismatch is a ``ValueError`` on
   every rank);
2. read the owned parts only: finite check and float64 sums (all-reduced into the common
   centre), then the prepared owned parts (kept on the device when they fit) and their norms
   (all-reduced into every point's norm, which the exact finish needs for any candidate);
3. for each block row I: the all-gather of A_I (every rank reads and prepares 1/R of it; issued
   ``lookahead`` rows ahead, so reads and transfers overlap the products), the blocks S(I, J)
   of the owned columns J ≥ I — row candidates for part I, column candidates for part J kept
   locally — then the row candidates gathered to part I's owner;
4. the owner of part I, once that gather has arrived, merges it with part I's column
   candidates and runs the single-device exact finish (certificate, exact re-rank) on part I;
5. rows that fail the certificate are settled together at the end by a distributed float64
   search of just those rows against every rank's owned parts;
6. the caller gathers the owned rows to every rank (:func:`gather_rows`) or writes them to a
   shared file (:mod:`knng.distributed.output`).

Nothing waits for a peer outside :class:`~knng.distributed.comm.Comm`, so a rank that dies or
hangs stops the others with an error that names it.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from knng._inputs import InputArray
from knng.distributed.comm import Comm
from knng.distributed.plan import BlockPlan
from knng.distributed.shards import all_gather_rows, common_centre, merge_across_ranks, rows_subset
from knng.engine.common import CandidateLists, PreparedCorpus, choose_screen_dtype, full_precision, is_out_of_memory
from knng.engine.exact import ExactStats
from knng.engine.graph import finish_graph_rows, screen_block
from knng.engine.plan import BLOCK_BYTES_PER_ELEMENT, MIN_TILE, candidate_count
from knng.engine.search import exact_search
from knng.metrics import METRICS, Metric

__all__ = ["DistributedGraphReport", "RankRows", "distributed_graph", "gather_rows", "agree"]

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
    candidates_per_row: int
    screen_dtype: str
    columns: str  # where the owned column parts are kept: see COLUMN_TIERS
    exact: ExactStats
    refined_rows: int
    oom_retries: int
    seconds: float
    per_rank: list[dict[str, float]] = field(default_factory=list)
    #: This rank's collectives (for :func:`knng.distributed.comm.replay`) and longest waits.
    comm_ops: list = field(default_factory=list, repr=False)
    waits: list = field(default_factory=list, repr=False)

    @property
    def pairs_saving(self) -> float:
        """Share of the n² score entries the symmetric plan skips."""
        return 1.0 - self.blocks_computed / self.blocks_full if self.blocks_full else 0.0

    @property
    def wait_share(self) -> float:
        """Largest share of a rank's time spent blocked on peers and collectives."""
        return max((r["wait_s"] / r["seconds"] for r in self.per_rank if r["seconds"] > 0), default=0.0)


def agree(comm: Comm, device: torch.device, values: dict[str, int]) -> dict[str, list[int]]:
    """All-gather a few integers from every rank; returns name → list over ranks."""
    names = list(values)
    local = torch.tensor([int(values[k]) for k in names], dtype=torch.int64, device=device)
    out = torch.empty(comm.world * len(names), dtype=torch.int64, device=device)
    comm.wait(comm.all_gather(out, local, "the agreement on inputs and plan"))
    table = out.view(comm.world, len(names)).cpu().tolist()
    return {name: [row[i] for row in table] for i, name in enumerate(names)}


def check_agreement(table: dict[str, list[int]], describe: dict[str, str]) -> None:
    """Raise ValueError (on every rank alike) if the ranks were given different inputs."""
    for name, values in table.items():
        if len(set(values)) > 1:
            what = describe.get(name, name)
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(f"every rank must be given the same {what}; got {listing}")


#: Where a rank keeps the column parts it owns, best first: prepared on the device; as read
#: (the input's dtype, half the bytes of a float64 screen's layout) on the device, prepared per
#: block; as read in (pinned) host memory, copied and prepared per block; or not at all, read
#: again from the input for every block (prefetched while the previous block runs).
COLUMN_TIERS = ("prepared on the device", "raw on the device", "raw in host memory", "read per block")
#: Share of available host memory the raw column parts of all of a host's ranks may take.
HOST_SHARE = 0.5


@dataclass(frozen=True)
class _Sizes:
    plan: BlockPlan
    sub_rows: int
    columns: str


def _host_budget(world: int) -> int:
    """Bytes of host memory one rank may use for raw column parts."""
    import os

    from knng.engine.plan import available_ram

    local = int(os.environ.get("LOCAL_WORLD_SIZE", min(world, max(1, torch.cuda.device_count()))))
    return int(available_ram() * HOST_SHARE / max(1, local))


def _plan(n: int, d: int, kc: int, world: int, budget: int, metric: Metric, dtype: torch.dtype,
          device: torch.device, part_size: int | None, input_itemsize: int = 4,
          host_budget: int | None = None) -> _Sizes:
    """Part size, screen tile height and where the owned columns live, from one rank's budgets."""
    e = dtype.itemsize
    vec = metric.width(d) * e
    owned_rows = -(-n // world)
    fixed = n * 16 + owned_rows * kc * (e + 8) * 4  # every norm and term; the owned column lists
    raw = owned_rows * d * input_itemsize
    if owned_rows * vec <= budget // 3:
        columns, on_device = COLUMN_TIERS[0], owned_rows * vec
    elif raw <= budget // 3:
        columns, on_device = COLUMN_TIERS[1], raw
    elif device.type == "cuda" and raw <= (_host_budget(world) if host_budget is None else host_budget):
        columns, on_device = COLUMN_TIERS[2], 0
    else:
        columns, on_device = COLUMN_TIERS[3], 0
    remaining = max(budget - fixed - on_device, budget // 8)
    # Per row of a part: the A_I buffers in flight, the row lists, the gathered lists at the
    # owner (twice: one gather may wait while the next arrives) and a column part prepared for
    # its block (two when they are read from the input, one being prefetched).
    extra = {COLUMN_TIERS[0]: 0, COLUMN_TIERS[1]: vec, COLUMN_TIERS[2]: vec + d * input_itemsize,
             COLUMN_TIERS[3]: 2 * vec}[columns]
    per_row = (LOOKAHEAD + 2) * vec + kc * (e + 8) * 4 + world * (2 * kc + 1) * 8 * 2 + extra
    on = "cuda" if device.type == "cuda" else "cpu"
    max_part = max(MIN_TILE, min(MAX_PART[on], remaining // 2 // per_row))
    plan = BlockPlan(n=n, world=world, part_size=part_size) if part_size else BlockPlan.build(n, world, max_part)
    b = plan.part_size
    # The score block gets what the part buffers leave: whole parts at once where it fits (each
    # extra row tile of a block costs another column selection and more lists to merge), else
    # equal row tiles.
    block_bytes = BLOCK_BYTES_PER_ELEMENT * e // 4
    room = max(remaining - b * per_row, remaining // 4)
    sub = int(min(b, MAX_SUB_ROWS[on], max(MIN_TILE, room // max(1, b * block_bytes))))
    sub = -(-b // -(-b // sub))
    return _Sizes(plan=plan, sub_rows=sub, columns=columns)


class _DeferredRefiner:
    """Collects the rows that fail the certificate, to settle them all at once at the end."""

    def __init__(self, k: int, device: torch.device) -> None:
        self.k, self.device = k, device
        self.rows: list[torch.Tensor] = []
        self.ids: list[torch.Tensor] = []

    def __call__(self, raw: torch.Tensor, row_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, ExactStats]:
        self.rows.append(raw.to(self.device, torch.float64))
        self.ids.append(row_ids.to(self.device))
        f = raw.shape[0]
        return (torch.full((f, self.k), -1, dtype=torch.int64, device=self.device),
                torch.full((f, self.k), torch.nan, dtype=torch.float64, device=self.device), ExactStats())


def distributed_graph(data: InputArray, k: int, metric: Metric, device: torch.device, select: str, budget: int,
                      comm: Comm, include_self: bool = False, screen_dtype: torch.dtype | None = None,
                      part_size: int | None = None) -> tuple[RankRows, DistributedGraphReport]:
    """This rank's share of the exact k-NN graph of ``data``; see the module docstring.

    Every rank calls it with the same arguments (``data`` may be a different object per rank,
    e.g. the same file opened by each; only the rows a rank needs are read). Returns the rows
    this rank owns, exact, with float64 distances, and a report that is the same on every rank.
    """
    t_start = time.perf_counter()
    n, d, world, rank = data.n, data.d, comm.world, comm.rank
    available = n if include_self else n - 1
    dtype = screen_dtype or choose_screen_dtype(device, n, d, k)
    comm.status("agreeing on the input and the plan")
    table = agree(comm, device, {"n": n, "d": d, "k": k, "metric": list(METRICS).index(metric.name),
                                 "include_self": int(include_self), "cuda": int(device.type == "cuda"),
                                 "itemsize": torch.empty(0, dtype=data.dtype).element_size(),
                                 "budget": budget, "host": _host_budget(world), "dtype": dtype.itemsize})
    check_agreement({key: table[key] for key in ("n", "d", "k", "metric", "include_self", "cuda", "itemsize")},
                    {"n": "number of points", "d": "dimension", "k": "k", "metric": "metric (index into "
                     f"{list(METRICS)})", "include_self": "include_self", "cuda": "kind of device (1: a GPU)",
                     "itemsize": "bytes per value of the data"})
    comm.connect_pairs(device)
    # Plans must match everywhere: the smallest budgets and the cheaper screen any rank can run.
    budget = min(table["budget"])
    dtype = torch.float64 if min(table["dtype"]) == 8 else torch.float32
    kc = candidate_count(k, available, dtype)
    sizes = _plan(n, d, kc, world, budget, metric, dtype, device, part_size,
                  input_itemsize=table["itemsize"][0], host_budget=min(table["host"]))
    plan = sizes.plan
    owned = plan.owned(rank)
    steps = sum(-(-(plan.parts[i][1] - plan.parts[i][0]) // sizes.sub_rows)
                for i in range(plan.n_parts) for _ in range(i, plan.n_parts))
    comm.set_progress_total(steps + plan.n_parts)
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knng-read")
    stats = ExactStats()
    oom_retries = 0
    try:
        with full_precision():
            centre, norms, terms, kept = _prepare_owned(data, metric, plan, owned, comm, device, dtype,
                                                        sizes.columns)
            pdata = PreparedCorpus.from_norms(data, metric, centre, device, norms, terms, symmetric=True,
                                              dtype=dtype)
            refiner = _DeferredRefiner(k, device)
            results: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (r0, r1) → rows

            def prepare_rows(a: int, b: int, raw: torch.Tensor | None = None) -> torch.Tensor:
                raw = data.rows(a, b) if raw is None else raw
                return metric.prepare(raw.to(device, non_blocking=True), centre, side="corpus", symmetric=True,
                                      dtype=dtype).vectors

            width = metric.width(d)
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
                    local[:b - a] = prepare_rows(a, b, piece_reads.pop(part).result())
                else:
                    piece_reads.pop(part, None)
                buf = torch.empty((world * s, width), dtype=dtype, device=device)
                gathers[part] = (comm.all_gather(buf, local, f"the all-gather of part {part}"), buf)

            P = plan.n_parts
            for part in range(min(P, LOOKAHEAD + 2)):
                read_piece(part)
            for part in range(min(P, LOOKAHEAD + 1)):
                start_gather(part)

            col_lists = {j: CandidateLists(plan.parts[j][1] - plan.parts[j][0], kc, dtype, device) for j in owned}
            col_floor = {j: torch.full((plan.parts[j][1] - plan.parts[j][0],), torch.inf, dtype=torch.float64,
                                       device=device) for j in owned}
            finishing: deque = deque()  # (part, pending gather, buffers) at the owner, until merged
            sends: deque = deque()  # (pending gather, buffer) kept alive until sent
            streamed: dict[int, Any] = {}

            def column(j: int) -> torch.Tensor:
                if sizes.columns == COLUMN_TIERS[0]:
                    return kept[j]
                if j in kept:
                    return prepare_rows(*plan.parts[j], kept[j])
                fut = streamed.pop(j, None)
                raw = fut.result() if fut is not None else data.rows(*plan.parts[j])
                return prepare_rows(*plan.parts[j], raw)

            def merged(part: int, pending: Any, bufs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
                """Part ``part``'s final candidates: its column lists and every rank's row lists."""
                comm.wait(pending)
                p0, p1 = plan.parts[part]
                lists, floor = col_lists.pop(part), col_floor.pop(part)
                for buf in bufs:
                    lists.add(0, p1 - p0, buf[:, :kc].to(dtype), buf[:, kc:2 * kc].to(torch.int64))
                    floor = torch.minimum(floor, buf[:, 2 * kc])
                vals, idx = lists.finalize()
                return vals, idx, floor

            def finish_rows(r0: int, r1: int, vals: torch.Tensor, idx: torch.Tensor, floor: torch.Tensor) -> None:
                nonlocal oom_retries
                comm.status(f"finishing rows {r0}–{r1}: exact re-rank")
                o_i, o_d, st, retries = finish_graph_rows(data, r0, r1, vals, idx, floor, pdata, metric, k, available,
                                                          include_self, device, refiner, chunk=sizes.sub_rows)
                results[(r0, r1)] = (o_i, o_d)
                stats.add(st)
                oom_retries += retries
                comm.tick()

            def arrive(part: int, pending: Any, bufs: list[torch.Tensor]) -> None:
                """Part ``part``'s candidates are complete: merge them, ready for the finish."""
                comm.status(f"finishing part {part}: merging its candidates")
                ready[part] = merged(part, pending, bufs)

            ready: dict[int, tuple[torch.Tensor, ...]] = {}
            for i in range(P):
                i0, i1 = plan.parts[i]
                comm.status(f"waiting for the all-gather of part {i}")
                pending, buf = gathers.pop(i)
                comm.wait(pending)
                rows_i = buf[:i1 - i0]
                if i + LOOKAHEAD + 2 < P:
                    read_piece(i + LOOKAHEAD + 2)
                if i + LOOKAHEAD + 1 < P:
                    start_gather(i + LOOKAHEAD + 1)
                row_lists = CandidateLists(i1 - i0, kc, dtype, device)
                row_floor = torch.full((i1 - i0,), torch.inf, dtype=torch.float64, device=device)
                todo = plan.row_blocks(rank, i)
                for pos, j in enumerate(todo):
                    j0, j1 = plan.parts[j]
                    cols = column(j)
                    if pos + 1 < len(todo) and todo[pos + 1] not in kept:
                        nxt = todo[pos + 1]
                        streamed[nxt] = reader.submit(data.rows, *plan.parts[nxt])
                    sub = sizes.sub_rows
                    r0 = 0
                    while r0 < i1 - i0:
                        r1 = min(i1 - i0, r0 + sub)
                        comm.status(f"screening block ({i}, {j}), rows {i0 + r0}–{i0 + r1}")
                        try:
                            blk = screen_block(rows_i[r0:r1], cols, metric, d, i0 + r0, j0, i == j, include_self, kc,
                                               select, device)
                        except Exception as exc:  # noqa: BLE001 - out of memory: smaller tiles
                            if not is_out_of_memory(exc) or sub <= MIN_TILE:
                                raise
                            sub, oom_retries = max(MIN_TILE, sub // 2), oom_retries + 1
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                            continue
                        row_lists.add(r0, r1, blk.row_values, blk.row_ids)
                        if blk.row_floor is not None:
                            row_floor[r0:r1] = torch.minimum(row_floor[r0:r1], blk.row_floor)
                        if blk.col_values is not None:
                            col_lists[j].add(0, j1 - j0, blk.col_values, blk.col_ids)
                            if blk.col_floor is not None:
                                col_floor[j] = torch.minimum(col_floor[j], blk.col_floor)
                        row_lists.flush_due()
                        col_lists[j].flush_due()
                        comm.tick()
                        r0 = r1
                    del cols
                # Part I's row candidates from this rank go to part I's owner.
                vals, idx = row_lists.finalize()
                pack = torch.empty((i1 - i0, 2 * kc + 1), dtype=torch.float64, device=device)
                pack[:, :kc], pack[:, kc:2 * kc], pack[:, 2 * kc] = vals, idx, row_floor
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
            while finishing:
                arrive(*finishing.popleft())
            while sends:
                comm.wait(sends.popleft()[0])
            # The exact finish, shared: every part is cut into one slice per rank, so every rank
            # finishes n / R rows and none waits for an owner that finishes whole parts alone
            # (the parts whose blocks come last would otherwise all be finished at the end).
            slices = []
            for part in range(P):
                p0, p1 = plan.parts[part]
                owner = plan.owner(part)
                s_rows = -(-(p1 - p0) // world)
                mine = torch.empty((s_rows, 2 * kc + 1), dtype=torch.float64, device=device)
                chunks = None
                if rank == owner:
                    vals, idx, floor = ready.pop(part)
                    full = torch.zeros((world * s_rows, 2 * kc + 1), dtype=torch.float64, device=device)
                    full[:p1 - p0, :kc], full[:p1 - p0, kc:2 * kc], full[:p1 - p0, 2 * kc] = vals, idx, floor
                    chunks = list(full.split(s_rows))
                what = f"the scatter of part {part}'s candidates by rank {owner}"
                slices.append((part, s_rows, mine, chunks, comm.scatter(mine, chunks, owner, what)))
            for part, s_rows, mine, _chunks, pending in slices:
                comm.wait(pending)
                p0, p1 = plan.parts[part]
                a, b = min(p1 - p0, rank * s_rows), min(p1 - p0, (rank + 1) * s_rows)
                if b > a:
                    finish_rows(p0 + a, p0 + b, mine[:b - a, :kc].to(dtype).contiguous(),
                                mine[:b - a, kc:2 * kc].to(torch.int64), mine[:b - a, 2 * kc].contiguous())
            del slices
            refined = _refine(refiner, results, plan, data, k, metric, device, select, budget, comm, include_self,
                              stats)
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t_start
    report = _report(comm, plan, sizes, kc, dtype, stats, refined, oom_retries, seconds, device)
    ranges = sorted(results)
    return RankRows(parts=ranges, indices=[results[r][0] for r in ranges],
                    distances=[results[r][1] for r in ranges]), report


def _prepare_owned(data: InputArray, metric: Metric, plan: BlockPlan, owned: list[int], comm: Comm,
                   device: torch.device, dtype: torch.dtype, columns: str
                   ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor | None, dict[int, torch.Tensor]]:
    """Finite check and centre over the owned parts, then their prepared form and every norm."""
    n, d = data.n, data.d

    def owned_blocks():
        for j in owned:
            p0, p1 = plan.parts[j]
            comm.status(f"reading part {j} (rows {p0}–{p1}): finite check and sums")
            for s in range(p0, p1, 1 << 16):
                yield s, data.rows(s, min(p1, s + (1 << 16)))

    centre = common_centre(owned_blocks(), n, d, data.name, metric.needs_centre(True), comm, device)
    norms = torch.zeros(n, dtype=torch.float64, device=device)
    terms = torch.zeros(n, dtype=torch.float64, device=device) if metric.uses_terms else None
    kept: dict[int, torch.Tensor] = {}
    for j in owned:
        p0, p1 = plan.parts[j]
        comm.status(f"preparing part {j} (rows {p0}–{p1})")
        raw = data.rows(p0, p1)
        prep = metric.prepare(raw.to(device, non_blocking=True), centre, side="corpus", symmetric=True, dtype=dtype)
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
        return centre, both, None, kept
    return centre, both[0].contiguous(), both[1].contiguous(), kept


def _refine(refiner: _DeferredRefiner, results: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]], plan: BlockPlan,
            data: InputArray, k: int, metric: Metric, device: torch.device, select: str, budget: int, comm: Comm,
            include_self: bool, stats: ExactStats) -> int:
    """Settle every rank's failing rows by one distributed float64 search against the owned parts."""
    rank, d = comm.rank, data.d
    local = torch.cat(refiner.rows) if refiner.rows else torch.empty((0, d), dtype=torch.float64, device=device)
    local_ids = torch.cat(refiner.ids) if refiner.ids else torch.empty(0, dtype=torch.int64, device=device)
    if not any(agree(comm, device, {"rows": local.shape[0]})["rows"]):
        return 0  # no rank has a row to refine
    comm.status("refining the rows that failed the certificate (float64 search)")
    everything = all_gather_rows(torch.cat([local, local_ids.to(torch.float64)[:, None]], dim=1), comm, device,
                                 "the all-gather of rows to refine")
    rows, ids = everything[:, :d].contiguous(), everything[:, d].to(torch.int64)
    f_total = rows.shape[0]
    kk = k if include_self else k + 1
    shard = rows_subset(data, [plan.parts[j] for j in plan.owned(rank)], name=data.name)
    values = torch.full((f_total, kk), torch.inf, dtype=torch.float64, device=device)
    cand = torch.full((f_total, kk), -1, dtype=torch.int64, device=device)
    if shard.n:
        queries = InputArray("rows to refine", "torch", (f_total, d), torch.float64, device, tensor=rows)
        ks = min(kk, shard.n)
        s_idx, s_dist, report = exact_search(queries, shard, ks, metric, device, select, budget,
                                             screen_dtype=torch.float64)
        stats.exact_evaluations += report.exact.exact_evaluations
        stats.complete_rows += report.exact.fallback_rows
        values[:, :ks], cand[:, :ks] = s_dist, _global_of_subset(plan, plan.owned(rank), device)[s_idx]
    idx, dist = merge_across_ranks(values, cand, k, rows, data, metric, comm, device,
                                   "the all-gather of refined candidates", exclude=None if include_self else ids)
    # Each rank patches the rows it finished.
    for (p0, p1), (o_i, o_d) in results.items():
        mine = torch.nonzero((ids >= p0) & (ids < p1)).flatten()
        if mine.numel():
            o_i[ids[mine] - p0] = idx[mine]
            o_d[ids[mine] - p0] = dist[mine]
    comm.tick()
    return f_total


def _global_of_subset(plan: BlockPlan, parts: list[int], device: torch.device) -> torch.Tensor:
    """Global row number of every row of the concatenated ``parts``."""
    return torch.cat([torch.arange(*plan.parts[j], device=device) for j in parts])


def _report(comm: Comm, plan: BlockPlan, sizes: _Sizes, kc: int, dtype: torch.dtype, stats: ExactStats,
            refined: int, oom_retries: int, seconds: float, device: torch.device) -> DistributedGraphReport:
    """Gather every rank's figures into one report (the same on every rank)."""
    local = torch.tensor([seconds, comm.stats.wait_seconds, 0.0, comm.stats.bytes,
                          len(plan.blocks(comm.rank)), stats.rows, stats.fallback_rows, stats.exact_evaluations,
                          stats.complete_rows, oom_retries], dtype=torch.float64, device=device)
    out = torch.empty(comm.world * local.numel(), dtype=torch.float64, device=device)
    comm.wait(comm.all_gather(out, local, "the gather of the run's figures"))
    table = out.view(comm.world, -1).cpu().tolist()
    per_rank = [{"rank": r, "seconds": row[0], "wait_s": row[1], "bytes": int(row[3]),
                 "blocks": int(row[4]), "rows": int(row[5])} for r, row in enumerate(table)]
    exact = ExactStats(rows=int(sum(r[5] for r in table)), fallback_rows=int(sum(r[6] for r in table)),
                       exact_evaluations=int(sum(r[7] for r in table)), complete_rows=int(sum(r[8] for r in table)))
    return DistributedGraphReport(
        world=comm.world, part_size=plan.part_size, parts=plan.n_parts, blocks_computed=plan.total_blocks(),
        blocks_full=plan.n_parts ** 2, candidates_per_row=kc, screen_dtype=str(dtype).replace("torch.", ""),
        columns=sizes.columns, exact=exact, refined_rows=refined,
        oom_retries=int(sum(r[9] for r in table)), seconds=max(r[0] for r in table), per_rank=per_rank,
        comm_ops=list(comm.stats.ops),
        waits=sorted(comm.stats.waits, key=lambda w: -w[1])[:8])


def gather_rows(rows: RankRows, n: int, k: int, comm: Comm, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's owned rows, assembled into the whole (n, k) result on every rank."""
    comm.status("gathering the results")
    pack = torch.cat([torch.cat([idx.to(torch.float64), dist,
                                 torch.arange(a, b, device=device, dtype=torch.float64)[:, None]], dim=1)
                      for (a, b), idx, dist in zip(rows.parts, rows.indices, rows.distances)]
                     or [torch.empty((0, 2 * k + 1), dtype=torch.float64, device=device)])
    out = all_gather_rows(pack, comm, device, "the all-gather of the results")
    order = out[:, 2 * k].to(torch.int64)
    indices = torch.empty((n, k), dtype=torch.int64, device=device)
    distances = torch.empty((n, k), dtype=torch.float64, device=device)
    indices[order] = out[:, :k].to(torch.int64)
    distances[order] = out[:, k:2 * k]
    return indices, distances

