"""``knng graph``: the exact k-NN graph of DATA, written to DIR as .npy files or one graph.npz."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from knng.cli.console import device_text, exact_line, say
from knng.cli.inputs import InputFile, metric_for, open_input
from knng.cli.ranks import (
    check_output_before_launch, is_rank, launch_if_asked, rank_checkpoint_options, ranks_line,
    refuse_distributed_host_memory, start_rank, wait_line,
)
from knng.cli.runs import (
    checkpoint_options, device_and_budget, metadata, output_folder, progress_wanted, refuse_existing, report_dict,
)
from knng.io import METADATA_FILE, NEIGHBOR_FILES, OutputFolder, ResultSet, write_neighbors

__all__ = ["run", "GRAPH_NPZ"]

#: The file of ``--format npz`` (``knng.load_graph`` reads it).
GRAPH_NPZ = "graph.npz"


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``knng graph`` as parsed into ``args``; returns the exit status."""
    from knng.arguments import check_k
    from knng.engine.checkpoint import checkpoint_bytes
    from knng.engine.plan import store_capacity

    data = open_input(args.data)
    metric = metric_for(args, data)
    # Before any size is estimated from k, with knng.graph's messages: an absurd k is a bad k.
    limit = data.shape[0] if args.include_self else data.shape[0] - 1
    if limit < 1:
        raise ValueError(f"data has {data.shape[0]} point(s): a graph without self-loops needs at least 2")
    check_k(args.k, limit, "n with include_self" if args.include_self else "n − 1 without self")
    dev, _ = device_and_budget(args.device, args.memory_budget)
    out = Path(args.out)
    names = list(NEIGHBOR_FILES.values()) if args.format == "npy" else [GRAPH_NPZ, METADATA_FILE]
    refuse_existing(out, names, args.overwrite)
    refuse_distributed_host_memory(args)
    n = data.shape[0]
    capacity = store_capacity(args.k, n if args.include_self else n - 1)
    # The ranks' checkpoints hold every point's store once, like one process's.
    store_bytes = checkpoint_bytes("graph", n, args.k, capacity)
    check_output_before_launch(out, args, n * args.k * 12, argv, checkpoints=lambda world: store_bytes)
    launched = launch_if_asked(args, argv)
    if launched is not None:
        return launched
    if is_rank():
        return _graph_distributed(args, argv, data, metric, out)
    with output_folder(out, args, n * args.k * 12, argv, checkpoints=store_bytes) as folder:
        return _graph_one_process(args, argv, data, metric, dev, folder)


def _write_npz(folder: OutputFolder, graph: Any, meta: dict[str, Any]) -> list[Path]:
    """graph.npz (through Graph.save) and knng.json, committed as one set."""
    results = ResultSet(folder)
    results.add_file(GRAPH_NPZ, graph.save)
    out = results.commit(meta)
    return [out / GRAPH_NPZ, out / METADATA_FILE]


def _graph_one_process(args: argparse.Namespace, argv: Sequence[str], data: InputFile, metric: str, dev: Any,
                       folder: OutputFolder) -> int:
    import knng
    from knng.reports import last_report

    out = folder.path
    t0 = time.perf_counter()
    graph = knng.graph(data.array, args.k, metric=metric, include_self=args.include_self,
                       device=args.device, select=args.select, memory_budget=args.memory_budget,
                       host_memory_budget=args.host_memory, progress=progress_wanted(args),
                       **checkpoint_options(args, folder.work_area))
    seconds = time.perf_counter() - t0
    report = last_report()
    graph = graph.numpy()
    n = graph.n_points

    meta = metadata(
        "graph", argv, {"data": data}, k=args.k, metric=metric, include_self=args.include_self,
        device=str(dev), select=args.select, memory_budget_bytes=report.plan.budget, format=args.format,
        timings_s={"graph": seconds}, throughput_points_per_s=n / seconds if seconds > 0 else None,
        report=report_dict(report),
    )
    t1 = time.perf_counter()
    if args.format == "npz":
        written = [str(p) for p in _write_npz(folder, graph, meta)]
    else:
        write_neighbors(folder, graph.indices, graph.distances, metadata=meta, overwrite=args.overwrite)
        written = [str(out / NEIGHBOR_FILES["indices"]), NEIGHBOR_FILES["distances"], NEIGHBOR_FILES["metadata"]]
    write_s = time.perf_counter() - t1

    say(f"knng graph: {n:,} points, d={data.shape[1]}, k={args.k}, metric {metric}"
        + (", self included" if args.include_self else ""))
    say(f"  device {device_text(dev)}: {seconds:.2f} s, {n / max(seconds, 1e-9):,.0f} points/s")
    if report is not None and getattr(report.plan, "graph_method", "") == "rows":
        say(f"  rows plan: {report.parts} chunk{'s' if report.parts != 1 else ''} of ≤{report.part_size:,} points, "
            "each searched against all the data")
        say(exact_line(report))
    elif report is not None:
        say(f"  symmetric plan: {report.parts} part{'s' if report.parts != 1 else ''} of ≤{report.part_size:,} points, "
            f"{report.blocks_computed:,} of {report.blocks_full:,} blocks computed "
            f"({report.pairs_saving:.0%} of the pair work skipped)")
        say(exact_line(report))
    say(f"  wrote {', '.join(written)} ({n:,} × {args.k}; {write_s:.2f} s)")
    return 0


def _graph_distributed(args: argparse.Namespace, argv: Sequence[str], data: InputFile, metric: str,
                       out: Path) -> int:
    import torch.distributed as dist

    import knng.distributed as kd
    from knng.distributed.comm import DEFAULT_TIMEOUT
    from knng.reports import last_report

    rank, world, device = start_rank(args)
    dev, budget = device_and_budget(device, args.memory_budget)
    timeout = args.timeout or DEFAULT_TIMEOUT
    meta = metadata("graph", argv, {"data": data}, k=args.k, metric=metric, include_self=args.include_self,
                    device=str(dev), select=args.select, memory_budget_bytes=budget, format=args.format,
                    world_size=world)
    t0 = time.perf_counter()
    common = dict(metric=metric, include_self=args.include_self, device=device, select=args.select,
                  memory_budget=args.memory_budget, progress=progress_wanted(args), timeout=timeout,
                  **rank_checkpoint_options(args, out, rank))
    if args.format == "npy":
        report = kd.graph_to_files(data.array, args.k, out, metadata=meta, overwrite=args.overwrite, **common)
        written = [str(out / NEIGHBOR_FILES["indices"]), NEIGHBOR_FILES["distances"], NEIGHBOR_FILES["metadata"]]
    else:
        graph = kd.graph(data.array, args.k, **common)
        report = last_report()
        written = []
        if rank == 0:
            meta.update(report=report_dict(report), timings_s={"graph": report.seconds})
            with output_folder(out, args, data.shape[0] * args.k * 12, argv) as folder:
                written = [str(p) for p in _write_npz(folder, graph.numpy(), meta)]
    seconds = time.perf_counter() - t0
    dist.destroy_process_group()
    if rank == 0:
        n = data.shape[0]
        say(f"knng graph: {n:,} points, d={data.shape[1]}, k={args.k}, metric {metric}"
            + (", self included" if args.include_self else ""))
        say(ranks_line(world, dev, seconds, n, "points"))
        blocks = [r["blocks"] for r in report.per_rank]
        if report.method == "rows":
            say(f"  rows plan: {report.parts} chunks of ≤{report.part_size:,} points, each rank its own rows")
        else:
            say(f"  shared plan: {report.parts} parts of ≤{report.part_size:,} points, {report.blocks_computed:,} "
                f"of {report.blocks_full:,} blocks computed ({report.pairs_saving:.0%} of the pair work skipped), "
                f"{min(blocks)}–{max(blocks)} blocks per rank")
        say(wait_line(report))
        say(exact_line(report))
        say(f"  wrote {', '.join(written)}")
    return 0
