"""Distributed exact search: the corpus sharded across ranks, every query sent to all of them.

Each rank takes a contiguous shard of the corpus rows (reading only those), screens every query
against it with the single-device engine (the common centre all-reduced first, so that every
shard is screened as the whole corpus would be) and keeps its exact top k. The shards' lists are
all-gathered chunk by chunk and merged by :func:`~knng.distributed.shards.merge_exact`, which
settles entries from different shards that round to the same float32 by exact evaluation, so
the result is the single-device result, bit for bit, on every rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from knng._inputs import InputArray, check_finite, rows_subset
from knng.distributed.checkpoint import DistributedCheckpoint
from knng.distributed.comm import Comm, agree, check_agreement
from knng.engine.plan import share_rows
from knng.distributed.shards import common_centre, merge_across_ranks
from knng.engine import stages
from knng.engine.common import PreparedCorpus, device_block_rows, full_precision
from knng.engine.exact import ExactStats
from knng.engine.plan import make_search_plan, resolve_precision
from knng.engine.search import exact_search
from knng.metrics import METRICS, Metric

__all__ = ["DistributedSearchReport", "distributed_search", "share_queries"]

#: Queries screened and merged per round (bounds the all-gathered lists: world · chunk · k).
QUERY_CHUNK = 1 << 16
#: Rows a block of the shard's first pass (finite check and sums) reads from a host or a file.
SHARD_READ_ROWS = 1 << 16


@dataclass
class DistributedSearchReport:
    """How a distributed search went (the same on every rank)."""

    world: int
    shard_rows: list[int]
    screen_dtype: str
    exact: ExactStats
    seconds: float
    per_rank: list[dict[str, float]] = field(default_factory=list)
    #: Where a resumed run started (queries done), checkpoints saved and their seconds.
    checkpoints: dict[str, float] = field(default_factory=dict)
    #: This rank's pipeline stages and how often they ran (:mod:`knng.engine.stages`).
    stages: dict[str, int] = field(default_factory=dict)
    #: Corpus rows folded into their group's representative (``knng.distributed.folding``).
    duplicates_folded: int = 0


@stages.recorded
def distributed_search(queries: InputArray, corpus: InputArray, k: int, metric: Metric, device: torch.device,
                       select: str, budget: int, comm: Comm, checkpoint: DistributedCheckpoint | None = None,
                       keep_checkpoint: bool = False) -> tuple[torch.Tensor, torch.Tensor, DistributedSearchReport]:
    """Exact k nearest corpus vectors of every query; the whole result on every rank.

    ``checkpoint``: every rank records the merged rows of each finished query chunk (growing
    arrays of its own area) and, at the agreed chunks, how many are final; a resumed run reads
    them back and goes on with the next chunk. ``keep_checkpoint``: also record the last chunk.
    """
    t_start = time.perf_counter()
    world, rank = comm.world, comm.rank
    n, d = corpus.n, corpus.d
    comm.status("agreeing on the input")
    table = agree(comm, device, {"n": n, "d": d, "nq": queries.n, "k": k, "metric": list(METRICS).index(metric.name),
                                 "budget": budget})
    check_agreement({key: table[key] for key in ("n", "d", "nq", "k", "metric")},
                    {"n": "corpus size", "d": "dimension", "nq": "number of queries", "k": "k", "metric": "metric"})
    budget = min(table["budget"])
    s0, s1 = share_rows(n, rank, world)
    shard = rows_subset(corpus, [(s0, s1)], name=corpus.name)
    ks = min(k, s1 - s0)
    precision = resolve_precision(None, device, max(1, s1 - s0), d, max(1, ks))
    stats = ExactStats()
    chunk_rows, q_start = QUERY_CHUNK, 0
    if checkpoint is not None:
        saved = checkpoint.plan({"query_chunk": QUERY_CHUNK, "precision": precision})
        chunk_rows, precision = int(saved["query_chunk"]), str(saved["precision"])
        done_idx = checkpoint.growing("indices", (queries.n, k), "int64")
        done_dist = checkpoint.growing("distances", (queries.n, k), "float64")
        if checkpoint.resumed:
            with checkpoint.restoring():
                q_start = checkpoint.check_step(queries.n)
                stats = ExactStats(**{f: int(v) for f, v in checkpoint.state["exact"].items()})
    with full_precision():
        comm.status("reading the shard: finite check and sums")
        # A shard already on the GPU is read in a few large blocks (each block of a pass costs
        # launches and, in the finite check, a synchronisation).
        read_rows = device_block_rows(shard, device, SHARD_READ_ROWS)
        centre = common_centre(((s0 + start, block) for start, block in shard.iter_blocks(read_rows)), n, d,
                               corpus.name, metric, comm, device)
        pshard = None
        if shard.n:
            tiles = make_search_plan(n_queries=min(queries.n, QUERY_CHUNK), n_corpus=shard.n, d=d, k=ks,
                                     metric=metric.name, device=device, budget=budget, screen_dtype=precision)
            comm.status(f"preparing corpus rows {s0}–{s1}")
            block_rows = max(tiles.corpus_cols, 4096)
            if tiles.corpus_resident:
                block_rows = device_block_rows(shard, device, block_rows)
            pshard = PreparedCorpus(shard, metric, centre, device, resident=tiles.corpus_resident,
                                    block_rows=block_rows, symmetric=False, dtype=tiles.screen_torch_dtype)
        out_idx = torch.empty((queries.n, k), dtype=torch.int64, device=device)
        out_dist = torch.empty((queries.n, k), dtype=torch.float64, device=device)
        if q_start:
            out_idx[:q_start] = torch.from_numpy(np.array(done_idx[:q_start])).to(device)
            out_dist[:q_start] = torch.from_numpy(np.array(done_dist[:q_start])).to(device)
        for q0 in range(q_start, queries.n, chunk_rows):
            q1 = min(queries.n, q0 + chunk_rows)
            comm.status(f"searching queries {q0}–{q1} in corpus rows {s0}–{s1}")
            raw = queries.rows(q0, q1).to(device, non_blocking=True)
            check_finite(raw, queries.name, q0)  # on every rank alike, shard or none
            values = torch.full((q1 - q0, k), torch.inf, dtype=torch.float64, device=device)
            ids = torch.full((q1 - q0, k), -1, dtype=torch.int64, device=device)
            chunk = InputArray(queries.name, "torch", (q1 - q0, d), raw.dtype, device, tensor=raw)
            if pshard is not None:
                idx, dist, report = exact_search(chunk, shard, ks, metric, device, select, budget, prepared=pshard,
                                                 plan=tiles)
                stats.add(report.exact)
                values[:, :ks], ids[:, :ks] = dist, idx + s0
            out_idx[q0:q1], out_dist[q0:q1] = merge_across_ranks(
                values, ids, k, chunk, corpus, metric, comm, device, f"the all-gather of the lists of queries {q0}–{q1}")
            comm.tick()
            if checkpoint is not None:
                done_idx[q0:q1] = out_idx[q0:q1].cpu().numpy()
                done_dist[q0:q1] = out_dist[q0:q1].cpu().numpy()
                checkpoint.propose()  # the chunks' merges keep the ranks in step: no lag needed
                if checkpoint.decided(0) or (q1 == queries.n and keep_checkpoint):
                    checkpoint.save(q1, {"exact": vars(stats)}, None, f"{q1:,} of {queries.n:,} queries done",
                                    final_rows=q1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t_start
    local = torch.tensor([seconds, comm.stats.wait_seconds, 0.0, stats.rows, stats.exact_evaluations, s1 - s0],
                         dtype=torch.float64, device=device)
    out = torch.empty(world * local.numel(), dtype=torch.float64, device=device)
    comm.wait(comm.all_gather(out, local, "the gather of the run's figures"))
    rows = out.view(world, -1).cpu().tolist()
    exact = ExactStats(rows=int(sum(r[3] for r in rows)), exact_evaluations=int(sum(r[4] for r in rows)))
    report = DistributedSearchReport(
        world=world, shard_rows=[int(r[5]) for r in rows], screen_dtype=precision, exact=exact,
        seconds=max(r[0] for r in rows),
        per_rank=[{"rank": i, "seconds": r[0], "wait_s": r[1]} for i, r in enumerate(rows)],
        checkpoints={} if checkpoint is None else checkpoint.summary())
    return out_idx, out_dist, report


def share_queries(queries: InputArray | None, comm: Comm, device: torch.device) -> InputArray:
    """Rank 0's queries on every rank that passed none (the others keep their own)."""
    from knng._inputs import SUPPORTED_DTYPES

    codes = list(SUPPORTED_DTYPES)
    have = queries is not None
    table = agree(comm, device, {"have": int(have), "nq": queries.n if have else -1, "d": queries.d if have else -1,
                                 "dtype": codes.index(queries.dtype) if have else -1})
    if all(table["have"]):
        return queries
    nq, d, dtype = table["nq"][0], table["d"][0], codes[table["dtype"][0]]
    comm.status(f"receiving {nq} queries from rank 0")
    # float64 holds every supported dtype exactly, and every backend can send it.
    buf = torch.empty((nq, d), dtype=torch.float64, device=device)
    if comm.rank == 0:
        buf.copy_(queries.rows(0, nq).to(device, torch.float64))
    comm.wait(comm.broadcast(buf, 0, "the broadcast of the queries by rank 0"))
    if have:
        return queries
    tensor = buf.to(dtype)
    return InputArray("queries", "numpy", (nq, d), dtype, device, tensor=tensor)
