"""``main``: parse the arguments, run the command's module, report failures.

Bad input (a missing file, a k out of range, an unknown metric, ...) and what the system refuses
(a read-only folder, a full disk) end with ``knng: error: <message>`` on standard error and exit
status 2, without a traceback; a failed or hung rank of a distributed run with status 1 and a
message naming it; anything unexpected propagates so that its traceback reaches the user.

Interruptions (Ctrl-C, SIGTERM) are handled from the first line of :func:`main`: one line on
standard error saying what was kept (a checkpoint that ``--resume`` continues) and exit status
128 + the signal (130, 143). The ranks that ``--gpus``/``--procs`` start leave both signals to
their default, so the launcher that stops them speaks for the job alone.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import signal
import sys
import time
import warnings

from knng import _interrupts
from knng.cli.errors import EXIT_USAGE, INPUT_ERRORS, message
from knng.cli.parser import build_parser

__all__ = ["main"]

#: System errors that say the machine refused (permissions, space, a read-only file system), not
#: that knng failed: reported in one line, exit status 2, like bad input.
REFUSALS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EFBIG, errno.EDQUOT,
                      errno.ENAMETOOLONG, errno.ELOOP, errno.EMFILE, errno.ENFILE})
#: Exit status of a process whose output pipe closed (128 + SIGPIPE, as the shell reports it).
EXIT_BROKEN_PIPE = 128 + 13


def main(argv: list[str] | None = None, *, ending: bool = False) -> int:
    """Run the ``knng`` command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    ``ending``: the process exits right after (:func:`knng.cli.program`): SIGINT and SIGTERM are
    then ignored rather than given back to Python's handlers, which would turn one that comes
    during the interpreter's shutdown into a traceback or a death by the signal.
    """
    previous = _interrupts.handlers()
    if _launched_rank():
        # A rank of --gpus/--procs: the launcher stops it with SIGTERM and speaks for the job.
        for signum in _interrupts.SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
    else:
        _interrupts.install()
    try:
        return _main(argv)
    finally:
        if ending:
            # Ignored, not blocked: a mask holds only this thread, and the interpreter's shutdown
            # gives signals it handled back to their default (death) for any thread to take.
            for signum in _interrupts.SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
        else:
            _interrupts.restore(previous)  # main() also runs inside other programs (tests, notebooks)


def _main(argv: list[str] | None) -> int:
    started = time.time()
    args: argparse.Namespace | None = None
    try:
        # knng.cli.main held both signals back while the modules loaded; one that came is raised
        # here. (Before any child process starts: children inherit the mask.)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_interrupts.SIGNALS))
        argv = list(sys.argv[1:] if argv is None else argv)
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version and usage errors (argparse printed them)
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
        if getattr(args, "command_module", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        with _interrupts.deferred():
            # torch's initialisation is not safe to interrupt (an exception raised inside it can
            # abort the interpreter): an interruption waits for it, and every command needs it.
            importlib.import_module("torch")
            command = importlib.import_module(f"knng.cli.{args.command_module}")
            from knng._options import options  # not at module level: `knng --help` imports nothing heavy
        # A command's process ends after its call: kernels compiled in the background (for the
        # calls after a first one, knng.engine.kernels.compiling) would only delay its exit.
        with warnings.catch_warnings(), options(background_compile=False):
            warnings.showwarning = _show_warning
            return int(command.run(args, argv))
    except KeyboardInterrupt as exc:
        return _interrupted(exc, args, started)
    except BrokenPipeError:
        return _broken_pipe()
    except INPUT_ERRORS as exc:
        _error(message(exc))
        return EXIT_USAGE
    except OSError as exc:
        if exc.errno not in REFUSALS:
            raise
        _error(message(exc))
        return EXIT_USAGE
    except _distributed_error() as exc:
        _error(str(exc))
        if _is_rank():
            # The process group is broken: leave now rather than hang in its teardown.
            sys.stdout.flush()
            os._exit(1)
        return 1


def _error(text: str) -> None:
    print(f"{_prog()}: error: {text}", file=sys.stderr, flush=True)


#: The Python arguments that warnings name, as the command line's options.
_OPTION_NAMES = {"no host_memory_budget": "no --host-memory", "host_memory_budget=": "--host-memory ",
                 "memory_budget=": "--memory-budget "}


def _show_warning(msg: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                  line: str | None = None) -> None:
    """Python warnings as the command line's own lines: ``knng: warning: <message>``, in its words."""
    text = str(msg)
    for argument, option in _OPTION_NAMES.items():
        text = re.sub(rf"(?<![\w-]){re.escape(argument)}", option, text)
    print(f"{_prog()}: warning: {text}", file=sys.stderr, flush=True)


def _interrupted(exc: KeyboardInterrupt, args: argparse.Namespace | None, started: float) -> int:
    """One line saying what the interruption left (rank 0 or a lone process only), and 128 + signal."""
    status = exc.exit_status if isinstance(exc, _interrupts.Interrupted) else 130
    what = "terminated" if status == 128 + signal.SIGTERM else "interrupted"
    rank = _rank_of_job()
    if rank not in (None, 0) or _launched_rank():  # the launcher speaks for its ranks
        return status
    text = f"knng: {what}"
    out = getattr(args, "out", None)
    if args is not None and out is not None and args.command in ("search", "graph", "embed"):
        from knng.cli.runs import after_interrupt

        text += "; " + after_interrupt(out, started, args.command != "embed" and rank is None)
    print(text, file=sys.stderr, flush=True)
    return status


def _broken_pipe() -> int:
    """The reader of standard output left (``knng info X --json | head``): stop quietly. Python
    would still try to flush the closed pipe at exit; point standard output at /dev/null first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return EXIT_BROKEN_PIPE


def _launched_rank() -> bool:
    """Whether this process is a rank that knng's own launcher started (not torchrun's or srun's)."""
    if "RANK" not in os.environ:  # the common case decided without importing anything
        return False
    from knng.cli.ranks import LAUNCH_DEVICE_ENV

    return bool(os.environ.get(LAUNCH_DEVICE_ENV))


def _is_rank() -> bool:
    from knng.cli.ranks import is_rank

    return is_rank()


def _rank_of_job() -> int | None:
    from knng.cli.ranks import rank_of_job

    return rank_of_job()


def _prog() -> str:
    """``knng``, or ``knng[rank R]`` in one rank of a distributed job."""
    rank = _rank_of_job()
    return "knng" if rank is None else f"knng[rank {rank}]"


def _distributed_error() -> type[BaseException]:
    from knng.distributed.comm import DistributedError

    return DistributedError
