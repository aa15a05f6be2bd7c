"""The ``knng`` command line: ``search``, ``graph``, ``embed``, ``info``, ``demo`` and ``bench``.

One module per job: :mod:`~knng.cli.parser` (the argument tree, from :mod:`~knng.cli.texts`,
:mod:`~knng.cli.choices` and :mod:`~knng.cli.argtypes`), :mod:`~knng.cli.entry` (``main``: dispatch
and error reporting), one module per command (:mod:`~knng.cli.search`, :mod:`~knng.cli.graph`,
:mod:`~knng.cli.embed`, :mod:`~knng.cli.info`, :mod:`~knng.cli.demo`, :mod:`~knng.cli.bench`), and
what they share: :mod:`~knng.cli.inputs` (opening vector files), :mod:`~knng.cli.ann_benchmarks`
(train/test files and recall), :mod:`~knng.cli.ranks` (several processes), :mod:`~knng.cli.runs`
(output folders, checkpoints, ``knng.json``) and :mod:`~knng.cli.console` (what is printed).

Building the parser imports neither torch nor scikit-learn: ``knng --help`` costs what Python
and argparse cost. A command's module, and what it needs, is imported only when it runs.

This file imports nothing: :func:`main` first holds SIGINT and SIGTERM back (a blocked signal
waits in the kernel), then imports the rest, and :func:`knng.cli.entry.main` lets them through
once its handlers are in place. So a Ctrl-C while the modules load ends the run like any other
interruption, in one line, instead of in a traceback from inside an import.
"""

from __future__ import annotations

import signal
import sys
from typing import Any, NoReturn

__all__ = ["main", "program", "build_parser"]


def main(argv: list[str] | None = None) -> int:
    """Run the ``knng`` command line with ``argv`` (see :func:`knng.cli.entry.main`); return its
    exit status. The signals' handlers are as they were when it returns."""
    _hold_signals()
    from knng.cli.entry import main as run

    return run(argv)


def program() -> NoReturn:
    """The ``knng`` program (``python -m knng``, the ``knng`` script): the command line, then exit.

    Unlike :func:`main` it does not give SIGINT and SIGTERM back to Python's defaults when the
    command is done: they are ignored until the process exits, so one that arrives as the process
    ends neither kills it by the signal nor prints a traceback from the interpreter's shutdown
    (the work is done, and the exit status says how it went).
    """
    _hold_signals()
    from knng.cli.entry import main as run

    sys.exit(run(None, ending=True))


def _hold_signals() -> None:
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from knng.cli.parser import build_parser

        return build_parser
    raise AttributeError(f"module 'knng.cli' has no attribute {name!r}")
