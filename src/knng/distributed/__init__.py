"""Exact k-NN graphs and search on several GPUs, hosts or CPU processes, on torch.distributed.

Run inside an initialised process group (``torchrun``, Slurm, or :func:`init`), one process per
GPU; every rank calls the same function with the same arguments::

    import knng, knng.distributed as kd
    kd.init()                                    # from torchrun's / Slurm's environment
    data = np.load("vectors.npy", mmap_mode="r")   # each rank reads only the rows it needs
    g = kd.graph(data, k=10)                     # the whole graph on every rank
    kd.graph_to_files(data, 10, "graph/")        # or: each rank writes its rows to shared files

``knng.graph(..., distributed=True)`` and ``knng.search(..., distributed=True)`` are the same
calls. Results are identical, bit for bit, to the single-device ``knng.graph`` / ``knng.search``
whatever the number of ranks. How the work is split: ``docs/DISTRIBUTED.md``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from knng.distributed.comm import DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_TIMEOUT, Comm, DistributedError
from knng.distributed.rendezvous import apply_environment, is_launched, local_rank
from knng.engine.checkpoint import DEFAULT_INTERVAL

__all__ = ["init", "graph", "search", "graph_to_files", "DistributedError", "is_launched", "local_rank"]


def init(device: str = "auto", timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Initialise the default process group from the environment, unless it already is.

    Reads what ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``) or Slurm's ``srun`` (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
    ``SLURM_LOCALID``, the first host of ``SLURM_STEP_NODELIST`` and a port from ``SLURM_JOB_ID``:
    :mod:`knng.distributed.rendezvous`) provide. On a GPU host each process takes GPU
    ``LOCAL_RANK``; GPU tensors go through NCCL and CPU tensors through Gloo. ``device="cpu"``
    uses Gloo only.

    Returns
    -------
    bool
        True if this call initialised the group, False if it was initialised already.
    """
    if dist.is_initialized():
        return False
    apply_environment()
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"cannot start a distributed run: {', '.join(missing)} not set. Start the processes with "
            "`torchrun --nproc-per-node N -m knng ...`, `knng ... --gpus N`, or `srun --ntasks N knng ...` "
            "(docs/DISTRIBUTED.md)")
    use_cuda = device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
    # The group's own timeout is a backstop only: knng's collectives report a failed or hung
    # rank after `timeout`, with its name, well before this.
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=2 * timeout + 60))
    return True


def _require_group() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "distributed=True needs an initialised torch.distributed process group: start the processes with "
            "`torchrun --nproc-per-node N script.py` (or srun) and call knng.distributed.init() first, or use "
            "`knng graph ... --gpus N` on the command line")


def _device(device: Any, group: Any) -> torch.device:
    from knng.engine.common import resolve_device

    backend = str(dist.get_backend(group))
    if isinstance(device, str) and device == "auto":
        if torch.cuda.is_available() and "nccl" in backend:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    dev = resolve_device(device)
    if dev.type == "cuda" and "nccl" not in backend:
        raise ValueError(f"device={device!r} needs a process group with the NCCL backend, got {backend!r}")
    if dev.type == "cpu" and "gloo" not in backend and "mpi" not in backend:
        raise ValueError(f"device={device!r} needs a process group with the Gloo backend, got {backend!r}")
    return dev


def _run_graph(data: Any, k: int, metric: str, include_self: bool, device: Any, select: str, memory_budget: Any,
               progress: bool, timeout: float, heartbeat_timeout: float, group: Any, consume,
               checkpoint: Any = None, resume: bool = False, checkpoint_interval: float = DEFAULT_INTERVAL,
               keep_checkpoint: bool = False, gathered: bool = True):
    from knng.arguments import check_checkpoint_arguments, graph_arguments
    from knng.distributed.graph_shares import distributed_graph
    from knng.distributed.checkpoint import open_checkpoint
    from knng.distributed.folding import fold, graph_of_one_group, unfold_graph_rows
    from knng.engine.exact import round_as_exact
    from knng.engine.plan import resolve_budget
    from knng.reports import set_last_report

    check_checkpoint_arguments(checkpoint, resume, checkpoint_interval, keep_checkpoint)
    _require_group()
    m, x, k, select = graph_arguments(data, k, metric, include_self, select)
    dev = _device(device, group)
    budget = resolve_budget(memory_budget, dev)
    with Comm(group, timeout=timeout, heartbeat_timeout=heartbeat_timeout, desc="knng graph",
              progress=progress) as comm:
        # Folded, the ranks compute the graph of the groups' representatives and each unfolds
        # its own rows of the answer (knng.distributed.folding). A graph `gathered` on every rank
        # holds the whole answer anyway; one written to files by every rank folds only where the
        # representatives' graph, gathered, fits the budget.
        folding = fold(x, k, m, comm, dev, budget=None if gathered else budget)
        reps = x if folding is None else folding.reps
        k_reps = k if folding is None else min(k, reps.n - 1)
        ckpt = open_checkpoint(checkpoint, resume, checkpoint_interval, comm, dev, operation="graph",
                               inputs={"data": x}, k=k, metric=m.name, include_self=include_self, independent=True,
                               **({} if folding is None else {"folded_to": reps.n}))
        with contextlib.nullcontext() if ckpt is None else ckpt.running():
            if folding is None or k_reps >= 1:
                rows, report = distributed_graph(reps, k_reps, m, dev, select, budget, comm,
                                                 include_self=include_self and folding is None, checkpoint=ckpt,
                                                 keep_checkpoint=keep_checkpoint)
            else:  # one group: every row's neighbours are its twins
                rows, report = graph_of_one_group(folding, comm)
            if folding is not None:
                rows, report = unfold_graph_rows(rows, report, folding, k_reps, k, include_self, m, comm, dev)
            for (a, b), idx, dist_ in zip(rows.parts, rows.indices, rows.distances):
                round_as_exact(m, x, torch.arange(a, b, device=idx.device), x, idx, dist_)
            result = consume(comm, rows, report, x, k, m, dev)
        if ckpt is not None:
            ckpt.close(keep_checkpoint)
    set_last_report(report)
    return result


def graph(data: Any, k: int, *, metric: str = "euclidean", include_self: bool = False, device: Any = "auto",
          select: str = "auto", memory_budget: Any = None, progress: bool = False, timeout: float = DEFAULT_TIMEOUT,
          heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, group: Any = None,
          checkpoint: str | os.PathLike[str] | None = None, resume: bool = False,
          checkpoint_interval: float = DEFAULT_INTERVAL, keep_checkpoint: bool = False):
    """Exact k-NN graph of ``data`` computed by every rank of the process group together.

    Every rank must call it with the same arguments; each reads only the rows it needs from
    ``data`` (pass a memory map, an ``h5py.Dataset`` or another lazy array for data larger than
    one host). The whole graph is returned on every rank.

    Parameters
    ----------
    data, k, metric, include_self, select, memory_budget, progress
        As in :func:`knng.graph`; ``memory_budget`` is per rank (the smallest over the ranks is
        used), ``progress`` shows one bar for the whole job on rank 0.
    device : {"auto", "cpu", "cuda", "cuda:N"} or torch.device
        This rank's device; "auto" is the GPU the process group set (``LOCAL_RANK``) under NCCL,
        else the CPU.
    timeout : float
        Seconds a rank may make no progress while the others wait for it; then they stop with
        a :class:`DistributedError` naming it and what it was doing.
    heartbeat_timeout : float
        Seconds without a heartbeat after which a rank counts as dead (the others stop).
    group : ProcessGroup, optional
        Default: the default group.
    checkpoint : str or os.PathLike, optional
        A folder where every rank records its progress (a sub-folder each, ``rank-R-of-N``),
        so that a job killed part-way continues with ``resume=True``; it must be on a file
        system every rank reaches. Deleted when the call returns, unless ``keep_checkpoint``.
    resume : bool, default False
        Continue the run recorded in ``checkpoint`` (from the beginning if there is none), with
        the **same number of ranks** (another number is refused, naming both). The result is
        the same, bit for bit, as an uninterrupted run's. A checkpoint of other inputs, k,
        metric, knng version or kind of device is refused; without ``resume``, a checkpoint
        found in the folder is an error.
    checkpoint_interval : float, default 60
        Seconds between checkpoints at least (each also waits 50 times its own duration); the
        ranks agree to save at the same step. 0: after every step (block row of the graph, query
        chunk of the search), whatever that costs.
    keep_checkpoint : bool, default False
        Keep the folder after success (a ``resume=True`` call then only finishes).

    Returns
    -------
    Graph
        Identical to ``knng.graph(data, k, ...)`` on one device.

    Raises
    ------
    DistributedError
        When another rank failed, died or hung; the message names it.
    ValueError, TypeError
        For bad input, on every rank alike.
    """
    from knng._inputs import as_output
    from knng.distributed.graph_shares import gather_rows
    from knng.results import Graph

    def consume(comm, rows, report, x, k, m, dev):
        idx, dist_ = gather_rows(rows, x.n, k, comm, dev)
        out_idx, out_dist = as_output(x, idx, dist_)
        return Graph(indices=out_idx, distances=out_dist, metric=m.name, include_self=include_self)

    return _run_graph(data, k, metric, include_self, device, select, memory_budget, progress, timeout,
                      heartbeat_timeout, group, consume, checkpoint, resume, checkpoint_interval, keep_checkpoint)


def graph_to_files(data: Any, k: int, out: str | os.PathLike[str], *, metric: str = "euclidean",
                   include_self: bool = False, device: Any = "auto", select: str = "auto", memory_budget: Any = None,
                   progress: bool = False, timeout: float = DEFAULT_TIMEOUT,
                   heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, group: Any = None,
                   metadata: dict[str, Any] | None = None, overwrite: bool = False,
                   checkpoint: str | os.PathLike[str] | None = None, resume: bool = False,
                   checkpoint_interval: float = DEFAULT_INTERVAL, keep_checkpoint: bool = False):
    """Like :func:`graph`, but each rank writes its own rows into ``out/indices.npy`` and
    ``out/distances.npy`` (a folder all ranks share), and nothing is gathered.

    The files are created by rank 0 under temporary names, filled by every rank, and renamed
    into place (with ``knng.json`` from ``metadata``) only when every rank has written its rows;
    a failed run leaves the folder as it was. Returns the run's report (the same on every rank).
    ``checkpoint``, ``resume``, ``checkpoint_interval``, ``keep_checkpoint``: as in :func:`graph`
    (the output folder's work area, ``.OUT.knng-work``, is removed by the commit, as the command
    line's is).
    """
    from knng.distributed.output import write_rows
    from knng.reports import report_as_dict

    def consume(comm, rows, report, x, k, m, dev):
        meta = dict(metadata or {})
        meta.setdefault("report", report_as_dict(report))
        meta.setdefault("timings_s", {"graph": report.seconds})
        write_rows(rows, x.n, k, comm, Path(out), meta, overwrite)
        return report

    return _run_graph(data, k, metric, include_self, device, select, memory_budget, progress, timeout,
                      heartbeat_timeout, group, consume, checkpoint, resume, checkpoint_interval, keep_checkpoint,
                      gathered=False)


def search(queries: Any, corpus: Any, k: int, *, metric: str = "euclidean", device: Any = "auto",
           select: str = "auto", memory_budget: Any = None, progress: bool = False, timeout: float = DEFAULT_TIMEOUT,
           heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, group: Any = None,
           checkpoint: str | os.PathLike[str] | None = None, resume: bool = False,
           checkpoint_interval: float = DEFAULT_INTERVAL, keep_checkpoint: bool = False):
    """Exact k nearest neighbours in ``corpus`` of every query, by every rank together.

    The corpus is split into one contiguous shard per rank (each rank reads only its shard),
    every query is searched in every shard, and the shards' lists are merged. Every rank must
    pass the same corpus; ``queries`` may be given on rank 0 only (``None`` elsewhere: rank 0
    sends them to all) or the same on every rank. The whole result is returned on every rank,
    identical to :func:`knng.search` on one device (NumPy on ranks that passed ``None``). Other
    parameters as in :func:`graph`; a search's checkpoints record the finished query chunks (every
    rank keeps the merged rows, as it returns them).
    """
    from knng._inputs import as_input, as_output
    from knng.arguments import check_checkpoint_arguments, check_k, check_select
    from knng.distributed.checkpoint import open_checkpoint
    from knng.distributed.folding import fold, unfold_search
    from knng.engine.exact import round_as_exact
    from knng.distributed.sharded import distributed_search, share_queries
    from knng.engine.plan import resolve_budget
    from knng.metrics import get_metric
    from knng.reports import set_last_report
    from knng.results import Neighbors

    check_checkpoint_arguments(checkpoint, resume, checkpoint_interval, keep_checkpoint)
    _require_group()
    m = get_metric(metric)
    rank = dist.get_rank(group)
    if queries is None and rank == 0:
        raise TypeError("queries must be an array of shape (n, d) on rank 0 (other ranks may pass None)")
    q = None if queries is None else as_input(queries, "queries")
    c = as_input(corpus, "corpus")
    if q is not None and q.d != c.d:
        raise ValueError(f"queries and corpus must have the same dimension: queries has {q.d}, corpus has {c.d}")
    k = check_k(k, c.n, "the corpus size")
    select = check_select(select)
    dev = _device(device, group)
    budget = resolve_budget(memory_budget, dev)
    with Comm(group, timeout=timeout, heartbeat_timeout=heartbeat_timeout, desc="knng search",
              progress=progress) as comm:
        q = share_queries(q, comm, dev)
        # Folded, the ranks search the groups' representatives (knng.distributed.folding).
        folding = fold(c, k, m, comm, dev)
        reps = c if folding is None else folding.reps
        ckpt = open_checkpoint(checkpoint, resume, checkpoint_interval, comm, dev, operation="search",
                               inputs={"queries": q, "corpus": c}, k=k, metric=m.name,
                               **({} if folding is None else {"folded_to": reps.n}))
        with contextlib.nullcontext() if ckpt is None else ckpt.running():
            idx, dist_, report = distributed_search(q, reps, min(k, reps.n), m, dev, select, budget, comm,
                                                    checkpoint=ckpt, keep_checkpoint=keep_checkpoint)
            if folding is not None:
                idx, dist_ = unfold_search(idx, dist_, folding, k, dev)
                report = replace(report, duplicates_folded=folding.folded_away)
            round_as_exact(m, q, None, c, idx, dist_)
        if ckpt is not None:
            ckpt.close(keep_checkpoint)
    set_last_report(report)
    out_idx, out_dist = as_output(q, idx, dist_)
    return Neighbors(indices=out_idx, distances=out_dist, metric=m.name)
