"""``knng demo``: exact graphs of built-in data verified against an oracle (:mod:`knng.demo`), or
with ``--embed`` the diffusion-map demo (:mod:`knng.demo_embed`)."""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from knng.cli.errors import CliError
from knng.cli.runs import device_and_budget
from knng.io.durable import os_error_text

__all__ = ["run"]


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``knng demo`` as parsed into ``args``; returns the exit status."""
    device_and_budget(args.device, None)  # a bad --device fails here, before any work
    _check_writable(Path(args.out))  # and a folder it cannot write to, before the graphs
    if args.embed:
        from knng.demo_embed import run_embed_demo

        return 0 if run_embed_demo(out_dir=args.out, device=args.device)["passed"] else 1
    from knng.demo import run_demo

    run_demo(out_dir=args.out, device=args.device, quick=args.quick)
    return 0


def _check_writable(out: Path) -> None:
    """The demo writes its graphs and plots into ``out``: make it and try a file there first."""
    probe = out / f".knng-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise CliError(f"cannot write the demo's files into {out}: {os_error_text(exc)}; choose a folder you can "
                       "write to with -o") from exc
