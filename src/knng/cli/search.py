"""``knng search``: the exact k nearest neighbours of QUERIES in CORPUS, written to DIR."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from knng.cli.ann_benchmarks import check_results, ground_truth, metric_warning, search_inputs
from knng.cli.console import device_text, exact_line, say, say_err
from knng.cli.inputs import InputFile, metric_for
from knng.cli.ranks import (
    LAUNCH_DEVICE_ENV, check_output_before_launch, is_rank, launch_if_asked, rank_checkpoint_options, rank_of_job,
    ranks_line, refuse_distributed_host_memory, start_rank,
)
from knng.cli.runs import (
    checkpoint_options, device_and_budget, metadata, output_folder, progress_wanted, refuse_existing, report_dict,
)
from knng.io import NEIGHBOR_FILES, OutputFolder, write_neighbors

__all__ = ["run"]


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``knng search`` as parsed into ``args``; returns the exit status."""
    from knng.arguments import check_k
    from knng.engine.checkpoint import checkpoint_bytes

    corpus, queries, ann_mode = search_inputs(args)
    metric = metric_for(args, corpus)
    # Before any size is estimated from k: an absurd k is a bad k, not a lack of disk space.
    check_k(args.k, corpus.shape[0], "the corpus size")
    dev, _ = device_and_budget(args.device, args.memory_budget)
    out = Path(args.out)
    refuse_existing(out, list(NEIGHBOR_FILES.values()), args.overwrite)
    truth = ground_truth(corpus, queries) if args.check else None
    warning = metric_warning(args, corpus, metric) if args.check else None
    if truth is not None:
        truth = (truth, warning)
    refuse_distributed_host_memory(args)
    result_bytes = queries.shape[0] * args.k * 12
    rows_bytes = checkpoint_bytes("search", queries.shape[0], args.k, 0)
    # Every rank of a sharded search checkpoints its shard's top k of every query.
    check_output_before_launch(out, args, result_bytes, argv, checkpoints=lambda world: world * rows_bytes)
    if warning is not None and _prints_warnings():
        say_err(f"knng: warning: {warning}")
    launched = launch_if_asked(args, argv)
    if launched is not None:
        return launched
    if is_rank():
        return _search_distributed(args, argv, corpus, queries, metric, out, ann_mode, truth)
    with output_folder(out, args, result_bytes, argv, checkpoints=rows_bytes) as folder:
        return _search_one_process(args, argv, corpus, queries, ann_mode, metric, dev, truth, folder)


def _prints_warnings() -> bool:
    """Whether this process tells the user: one process, knng's launcher of the ranks, or rank 0
    of a job started without it (torchrun, srun); not the ranks knng's launcher started."""
    rank = rank_of_job()
    return rank is None or (rank == 0 and not os.environ.get(LAUNCH_DEVICE_ENV))


def _check(indices: np.ndarray, truth: Any, corpus: InputFile, queries: InputFile, metric: str) -> Any:
    if truth is None:
        return None
    neighbors, warning = truth
    return check_results(indices, neighbors, corpus, queries, metric, warning)


def _check_line(check: dict[str, Any]) -> str:
    line = f"  check: recall@{check['k']} = {check['recall']:.6f} against the file's ground truth"
    differ, ties, others = check["rows_differ"], check["rows_differ_ties"], check["rows_differ_not_ties"]
    if not differ:
        return line
    # A row that is no tie: either a point the file lists, missing from knng's answer, is closer
    # than knng's k-th (knng's answer is not exact), or knng's sorted distances are below the file's.
    ours_wrong = check["rows_file_closer"]
    theirs_wrong = others - ours_wrong
    parts = ([f"in {theirs_wrong:,} the file's answer is not exact in {check['metric']}"] if theirs_wrong else []) + (
        [f"in {ours_wrong:,} knng's is not (the file lists a point closer than knng's k-th)"] if ours_wrong else [])
    if not ties:
        return line + f"; {differ:,} rows differ, none by ties: " + ", ".join(parts)
    line += (f"; {differ:,} rows differ: {ties:,} of them an equally exact answer (the same exact distances, "
             "ties broken differently)")
    return line + (f", {others:,} not: " + ", ".join(parts) if others else "")


def _search_one_process(args: argparse.Namespace, argv: Sequence[str], corpus: InputFile, queries: InputFile,
                        ann_mode: bool, metric: str, dev: Any, truth: Any, folder: OutputFolder) -> int:
    import knng
    from knng.reports import last_report

    t0 = time.perf_counter()
    result = knng.search(queries.array, corpus.array, args.k, metric=metric, device=args.device,
                         select=args.select, memory_budget=args.memory_budget,
                         host_memory_budget=args.host_memory, progress=progress_wanted(args),
                         **checkpoint_options(args, folder.work_area))
    seconds = time.perf_counter() - t0
    report = last_report()
    indices, distances = np.asarray(result.indices), np.asarray(result.distances)
    nq = indices.shape[0]
    check = _check(indices, truth, corpus, queries, metric)

    meta = metadata(
        "search", argv, {"corpus": corpus, "queries": queries}, k=args.k, metric=metric,
        device=str(dev), select=args.select, memory_budget_bytes=report.plan.budget,
        ann_benchmarks_file=ann_mode, timings_s={"search": seconds},
        throughput_queries_per_s=nq / seconds if seconds > 0 else None,
        report=report_dict(report), check=check,
    )
    t1 = time.perf_counter()
    write_neighbors(folder, indices, distances, metadata=meta, overwrite=args.overwrite)
    write_s = time.perf_counter() - t1

    say(f"knng search: {nq:,} queries × {corpus.shape[0]:,} corpus vectors, d={corpus.shape[1]}, "
        f"k={args.k}, metric {metric}" + (" (ann-benchmarks train/test)" if ann_mode else ""))
    say(f"  device {device_text(dev)}: {seconds:.2f} s, {nq / max(seconds, 1e-9):,.0f} queries/s")
    if report is not None:
        say(exact_line(report))
    if check is not None:
        say(_check_line(check))
    say(f"  wrote {Path(args.out) / NEIGHBOR_FILES['indices']}, {NEIGHBOR_FILES['distances']}, "
        f"{NEIGHBOR_FILES['metadata']} ({nq:,} × {args.k}; {write_s:.2f} s)")
    return 0


def _search_distributed(args: argparse.Namespace, argv: Sequence[str], corpus: InputFile, queries: InputFile,
                        metric: str, out: Path, ann_mode: bool, truth: Any) -> int:
    import torch.distributed as dist

    import knng.distributed as kd
    from knng.distributed.comm import DEFAULT_TIMEOUT
    from knng.reports import last_report

    rank, world, device = start_rank(args)
    dev, budget = device_and_budget(device, args.memory_budget)
    t0 = time.perf_counter()
    result = kd.search(queries.array, corpus.array, args.k, metric=metric, device=device, select=args.select,
                       memory_budget=args.memory_budget, progress=progress_wanted(args),
                       timeout=args.timeout or DEFAULT_TIMEOUT, **rank_checkpoint_options(args, out, rank))
    seconds = time.perf_counter() - t0
    report = last_report()
    dist.destroy_process_group()
    if rank != 0:
        return 0
    indices, distances = np.asarray(result.indices), np.asarray(result.distances)
    nq = indices.shape[0]
    check = _check(indices, truth, corpus, queries, metric)
    meta = metadata("search", argv, {"corpus": corpus, "queries": queries}, k=args.k, metric=metric,
                    device=str(dev), select=args.select, memory_budget_bytes=budget, world_size=world,
                    ann_benchmarks_file=ann_mode, timings_s={"search": seconds}, report=report_dict(report),
                    check=check)
    write_neighbors(out, indices, distances, metadata=meta, overwrite=args.overwrite)
    say(f"knng search: {nq:,} queries × {corpus.shape[0]:,} corpus vectors, d={corpus.shape[1]}, k={args.k}, "
        f"metric {metric}")
    say(ranks_line(world, dev, seconds, nq, "queries"))
    say(f"  corpus shards of {min(report.shard_rows):,}–{max(report.shard_rows):,} vectors, one per rank")
    if check is not None:
        say(_check_line(check))
    say(f"  wrote {out / NEIGHBOR_FILES['indices']}, {NEIGHBOR_FILES['distances']}, {NEIGHBOR_FILES['metadata']}")
    return 0
