"""``knng demo``: exact graphs of built-in data verified against an oracle (:mod:`knng.demo`), or
with ``--embed`` the diffusion-map demo (:mod:`knng.demo_embed`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from knng.cli.runs import device_and_budget

__all__ = ["run"]


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``knng demo`` as parsed into ``args``; returns the exit status."""
    device_and_budget(args.device, None)  # a bad --device fails here, before any work
    if args.embed:
        from knng.demo_embed import run_embed_demo

        return 0 if run_embed_demo(out_dir=args.out, device=args.device)["passed"] else 1
    from knng.demo import run_demo

    run_demo(out_dir=args.out, device=args.device, quick=args.quick)
    return 0
