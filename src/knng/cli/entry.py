"""``main``: parse the arguments, run the command's module, report failures.

Bad input (a missing file, a k out of range, an unknown metric, ...) ends with
``knng: error: <message>`` on standard error and exit status 2, without a traceback; a failed or
hung rank of a distributed run with status 1 and a message naming it; anything unexpected
propagates so that its traceback reaches the user.
"""

from __future__ import annotations

import importlib
import os
import sys

from knng.cli.errors import EXIT_USAGE, INPUT_ERRORS, message
from knng.cli.parser import build_parser

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``knng`` command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors (argparse printed them)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    if getattr(args, "command_module", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    command = importlib.import_module(f"knng.cli.{args.command_module}")
    try:
        return int(command.run(args, argv))
    except INPUT_ERRORS as exc:
        print(f"{_prog()}: error: {message(exc)}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except _distributed_error() as exc:
        print(f"{_prog()}: error: {exc}", file=sys.stderr, flush=True)
        if _is_rank():
            # The process group is broken: leave now rather than hang in its teardown.
            sys.stdout.flush()
            os._exit(1)
        return 1
    except KeyboardInterrupt:
        print("knng: interrupted (results are written only at the end, so none were)"
              if args.command in ("search", "graph", "embed") else "knng: interrupted", file=sys.stderr, flush=True)
        return 130


def _is_rank() -> bool:
    from knng.cli.ranks import is_rank

    return is_rank()


def _prog() -> str:
    """``knng``, or ``knng[rank R]`` in one rank of a distributed job."""
    from knng.cli.ranks import rank_of_job

    rank = rank_of_job()
    return "knng" if rank is None else f"knng[rank {rank}]"


def _distributed_error() -> type[BaseException]:
    from knng.distributed.comm import DistributedError

    return DistributedError
