"""Several processes: ``--gpus N`` / ``--procs N`` start the ranks, each rank joins the job
(started by knng, ``torchrun`` or Slurm's ``srun``), and rank 0 says how it went."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from knng.cli.console import device_text
from knng.cli.errors import EXIT_USAGE, CliError
from knng.cli.runs import checkpoint_options, output_folder
from knng.io.outputs import OutputFolder
from knng.io.workarea import CheckpointError, WorkArea

__all__ = ["LAUNCH_DEVICE_ENV", "is_rank", "rank_of_job", "launch_if_asked", "start_rank", "rank_checkpoint_options",
           "refuse_distributed_host_memory", "check_output_before_launch", "ranks_line", "wait_line"]

#: Variables without which this process cannot be a rank: checked before importing torch.
_JOB_VARIABLES = ("RANK", "SLURM_PROCID")
#: Tells a rank started by ``--gpus``/``--procs`` which kind of device it is for: a copy of
#: ``knng.distributed.launch.LAUNCH_DEVICE_ENV`` (importing knng.distributed imports torch, which a
#: plain run must not pay to ask; tests/cli/test_cli.py checks that the two agree).
LAUNCH_DEVICE_ENV = "KNNG_LAUNCH_DEVICE"


def rank_of_job() -> int | None:
    """This process's rank in a distributed job (knng's launcher, torchrun, Slurm), or None."""
    if not any(name in os.environ for name in _JOB_VARIABLES):
        return None
    from knng.distributed.rendezvous import job_rank

    return job_rank()


def is_rank() -> bool:
    """Whether this process is one rank of a distributed job."""
    return rank_of_job() is not None


def _started_by_knng() -> bool:
    return bool(os.environ.get(LAUNCH_DEVICE_ENV))


def launch_if_asked(args: argparse.Namespace, argv: Sequence[str]) -> int | None:
    """With --gpus/--procs, start the ranks (each runs this same command) and return their status."""
    n = args.gpus or args.procs
    if n is None or _started_by_knng():  # none asked, or we are one of the ranks
        return None
    if is_rank():
        raise CliError("--gpus/--procs start the ranks themselves: leave them out under torchrun or srun")
    if args.gpus:
        import torch

        if not torch.cuda.is_available():
            raise CliError("--gpus needs CUDA GPUs and torch sees none; --procs N runs N CPU processes")
        if args.gpus > torch.cuda.device_count():
            raise CliError(f"--gpus {args.gpus}: this host has {torch.cuda.device_count()} GPU(s)")
        if args.device not in ("auto", "cuda"):
            raise CliError("--gpus N puts rank r on GPU r: leave out --device")
    elif args.device not in ("auto", "cpu"):
        raise CliError("--procs N runs CPU processes: leave out --device, or use --gpus N")
    from knng.distributed.comm import DEFAULT_HEARTBEAT_TIMEOUT
    from knng.distributed.launch import launch

    out = OutputFolder(args.out)
    had_checkpoint = WorkArea(out.work_area).exists()
    # The ranks get this invocation's argv unchanged: they ignore --gpus/--procs.
    status = launch(list(argv), n, "cuda" if args.gpus else "cpu", grace=DEFAULT_HEARTBEAT_TIMEOUT + 20)
    if status == EXIT_USAGE and not had_checkpoint:
        # Bad input found by a rank mid-run: a checkpoint of these inputs fails the same way
        # again, and other inputs cannot resume it. Nothing of it may block the next run.
        area = WorkArea(out.work_area)
        with contextlib.suppress(CheckpointError, OSError):
            if area.exists():
                area.remove()
    if status != 0:
        out.tidy()
    return status


def start_rank(args: argparse.Namespace) -> tuple[int, int, str]:
    """Join the job; returns (rank, world size, device)."""
    import torch.distributed as dist

    import knng.distributed as kd
    from knng.distributed.comm import DEFAULT_TIMEOUT
    from knng.distributed.launch import die_with_launcher

    die_with_launcher()  # a rank of --gpus/--procs ends with its launcher
    device = "cpu" if os.environ.get(LAUNCH_DEVICE_ENV) == "cpu" else args.device
    kd.init(device=device, timeout=args.timeout or DEFAULT_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), device


def rank_checkpoint_options(args: argparse.Namespace, out: Path, rank: int) -> dict[str, Any]:
    """A rank's checkpoint options: every rank's part in the output folder's work area, kept until
    rank 0 commits the results (the commit removes it)."""
    work_area = OutputFolder(out).work_area  # a path only: rank 0 locks the folder when it commits
    return checkpoint_options(args, work_area, discard_old=rank == 0)


def refuse_distributed_host_memory(args: argparse.Namespace) -> None:
    if args.host_memory is not None and (args.gpus or args.procs or is_rank()):
        raise CliError("--host-memory works for one process only for now: rerun without --gpus/--procs/torchrun, "
                       "or without --host-memory (each rank reads only the parts it needs)")


def check_output_before_launch(out: Path, args: argparse.Namespace, expected_bytes: int,
                               argv: Sequence[str], checkpoints: "Callable[[int], int]" = lambda world: 0) -> None:
    """Before --gpus/--procs start their ranks: the folder is free, writable and has the space
    for the results and ``checkpoints(world)`` bytes of the ranks' checkpoints in its work area.

    Rank 0 locks it again to commit (the launcher cannot hold the lock for its children); a run
    that took the folder in between makes that commit fail, it never replaces results silently.
    """
    world = args.gpus or args.procs
    if world and not _started_by_knng() and not is_rank():
        with output_folder(out, args, expected_bytes, argv, checkpoints=checkpoints(world)):
            pass


def ranks_line(world: int, dev: Any, seconds: float, n: int, unit: str) -> str:
    return (f"  {world} rank{'s' if world != 1 else ''} on {device_text(dev)}"
            + ("" if dev.type == "cpu" else " (one GPU each)")
            + f": {seconds:.2f} s, {n / max(seconds, 1e-9):,.0f} {unit}/s")


def wait_line(report: Any) -> str:
    gb = sum(r.get("bytes", 0) for r in report.per_rank) / 1e9
    return (f"  communication: at most {report.wait_share:.0%} of a rank's time blocked on collectives and peers"
            + (f", {gb:.2f} GB sent" if gb else ""))
