"""``knng bench``: says where the benchmark harnesses went (``bench/`` of the source repository).

They time knng against its peers and the papers' tables on a GPU machine; they are tools for the
people who develop knng, not part of what a user installs, so they live outside the package and
import only its public names (``tests/test_layering.py`` checks it).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from knng.cli.console import say_err
from knng.cli.errors import EXIT_USAGE
from knng.cli.texts import BENCH_DESCRIPTION

__all__ = ["run"]


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Print where the harness is; exit status 2, since nothing ran."""
    asked = " ".join(["knng", "bench", *args.benchmark])
    say_err(f"{asked}: nothing was run.\n\n{BENCH_DESCRIPTION}".rstrip())
    return EXIT_USAGE
