"""What every computing command does around its computation: check the device and budget, lock
and check the output folder before any work, keep checkpoints in its work area, and describe the
run in ``knng.json``."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from knng.cli.console import say_err
from knng.cli.errors import CliError
from knng.cli.inputs import InputFile
from knng.io.outputs import OutputFolder
from knng.io.workarea import CheckpointError, WorkArea
from knng.io.writers import METADATA_FILE

__all__ = ["device_and_budget", "refuse_existing", "output_folder", "checkpoint_options", "metadata",
           "report_dict", "progress_wanted", "command_line", "after_interrupt"]


def device_and_budget(device: str, memory_budget: str | None) -> tuple[Any, int | None]:
    """Validate the device and an explicit budget before any work, as the API will.

    The default budget is left to the engine, which resolves it once, when it plans the run
    (the plan it records in ``knng.json`` says which budget it took and where from).
    """
    from knng._units import parse_bytes
    from knng.engine.common import resolve_device

    dev = resolve_device(device)
    return dev, None if memory_budget is None else parse_bytes(memory_budget, "memory_budget")


def refuse_existing(out: Path, names: Sequence[str], overwrite: bool) -> None:
    """Fail before any work if ``out`` holds results and --overwrite was not given."""
    if out.exists() and not out.is_dir():
        raise CliError(f"output folder {out} exists and is not a folder")
    existing = [name for name in names if os.path.lexists(out / name)]
    if existing and not overwrite:
        raise FileExistsError(
            f"{out} already holds results ({', '.join(existing)}); pass --overwrite to replace "
            "them, or choose another folder with -o"
        )


def command_line(argv: Sequence[str]) -> str:
    """The command as typed, quoted for a shell."""
    return "knng " + " ".join(shlex.quote(a) for a in argv)


def output_folder(out: Path, args: argparse.Namespace, expected_bytes: int, argv: Sequence[str],
                  checkpoints: int = 0) -> OutputFolder:
    """The output folder, locked and checked before any computing (:class:`knng.io.outputs.OutputFolder`);
    ``checkpoints``: the bytes a one-process run's checkpoints may take beside it."""
    return OutputFolder(out, overwrite=args.overwrite, expected_bytes=expected_bytes + checkpoints,
                        command="knng " + " ".join(argv),
                        space_for="the results and the run's checkpoints" if checkpoints else "the results")


def checkpoint_options(args: argparse.Namespace, work_area: Path, discard_old: bool = True) -> dict[str, Any]:
    """Checkpoints in the output folder's work area, kept until the results are committed.

    ``discard_old``: whether this process may remove an earlier run's checkpoint on --overwrite
    (one process, or rank 0 before any collective: the other ranks touch the area only after it).
    """
    if discard_old and args.overwrite and not args.resume and WorkArea(work_area).exists():
        # --overwrite replaces what the folder holds, an earlier run's unfinished work included.
        say_err(f"knng: --overwrite: discarding the checkpoint of an earlier run in {work_area}")
        WorkArea(work_area).remove()
    options: dict[str, Any] = {"checkpoint": work_area, "resume": args.resume, "keep_checkpoint": True}
    if args.checkpoint_interval is not None:
        options["checkpoint_interval"] = args.checkpoint_interval
    return options


def progress_wanted(args: argparse.Namespace) -> bool:
    return not args.no_progress and sys.stderr.isatty()


def report_dict(report: Any) -> dict[str, Any]:
    from knng.reports import report_as_dict

    return report_as_dict(report)


def metadata(command: str, argv: Sequence[str], inputs: Mapping[str, InputFile], **fields: Any) -> dict[str, Any]:
    """The ``knng.json`` of a run: versions, the command, when, its inputs, and ``fields``."""
    import torch

    from knng._version import VERSION

    return {
        "knng_version": VERSION,
        "torch_version": torch.__version__,
        "command": command,
        "argv": command_line(argv),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {name: src.summary() for name, src in inputs.items()},
        **fields,
    }


def after_interrupt(out: str | os.PathLike[str], started: float, tidy: bool) -> str:
    """What an interrupted run into ``out`` left, in words, for the one line the command prints.

    ``tidy``: first remove what the run left beside the folder that nothing can use (staging
    folders, a work area without progress; :meth:`knng.io.outputs.OutputFolder.tidy`), which only
    a process whose job has ended may do (a lone process, or the launcher of ``--gpus``/``--procs``
    once its ranks are stopped). ``started``: when the command started, to tell the results it
    wrote from an earlier run's.
    """
    folder = OutputFolder(out)
    if tidy:
        folder.tidy()
    with contextlib.suppress(OSError):
        if os.stat(folder.path / METADATA_FILE).st_mtime >= started:
            return f"the results in {folder.path} had been written in full before it"
    area = WorkArea(folder.work_area)
    if not (area.exists() and area.has_progress()):
        return "no results were written"
    try:
        state = area.state()
    except CheckpointError:
        state = None
    saved = f" ({state.get('progress', 'progress unknown')}, saved {state.get('saved', '?')})" if state else ""
    return f"no results were written; the checkpoint{saved} is kept: run the same command with --resume to continue it"
