"""Benchmark the k-selection algorithms: the quick multi-select paper's experiments and issue 3's bar.

The command line of :mod:`select_harness` (``knng bench select`` before the harness left the
installed package). Experiments (``docs/SELECT_BENCH.md`` describes each):

- ``table2``: Q = 8192 rows, n = 2^13 … 2^16, k = 64 … 512, mean and % std next to the paper's Table 2;
- ``speedup``: speed-up over the insertion-sort baseline, n swept (Fig. 5) and Q swept (Fig. 6);
- ``product``: n · Q = 2^27, log2(n/Q) = −3 … 19, speed-up over the bitonic baseline (Fig. 7);
- ``fixed-n``: n = 2^20, Q = 8 … 256, time per query (Fig. 9);
- ``bar``: 8192 × 65536, k = 64 … 2048, qms against torch.topk (identical sorted output, GB/s,
  % of the copy-bandwidth floor).

Writes ``select.json``, ``select.md`` and ``select-*.png`` (with matplotlib) to ``--out``
(default ``bench-results/select``) after each experiment and prints the markdown summary.

Usage (from the repository root; with knng installed, or ``PYTHONPATH=src``)::

    python bench/bench_select.py --experiments all --trials 20      # on a GPU
    python bench/bench_select.py --experiments bar --algorithms qms,topk
    python bench/bench_select.py --quick --device cpu               # CPU smoke run
    python bench/bench_select.py --help                             # every option
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # select_harness, beside this file

import select_harness as harness  # noqa: E402
from knng.cli.argtypes import argument_type, positive_int, positive_seconds  # noqa: E402

PROG = "bench_select.py"

DESCRIPTION = """\
Time the k-selection algorithms (knng.select) on blocks of uniformly random float32 scores:
  table2   Q = 8192 rows, n = 2^13 … 2^16, k = 64 … 512: mean and % std (paper Table 2)
  speedup  speed-up over the insertion-sort baseline, Q = 8192 with n swept and n = 65536
           with Q swept (paper Figs. 5 and 6)
  product  n·Q = 2^27, log2(n/Q) = −3 … 19, k = 2 … 512: speed-up over the bitonic
           baseline (paper Fig. 7)
  fixed-n  n = 2^20, Q = 8 … 256: time per query (paper Fig. 9)
  bar      8192 × 65536, k = 64 … 2048: qms against torch.topk, sorted; identical
           output, GB/s and the copy-bandwidth floor
Each cell is timed with CUDA events after two warm-up calls (the wall clock on a CPU, for
smoke runs). Results go to DIR/select.json, DIR/select.md and DIR/select-*.png (plots need
matplotlib), rewritten after each experiment; the markdown summary is printed at the end.
docs/SELECT_BENCH.md describes every experiment.
"""

EXAMPLES = """\
examples:
  python bench/bench_select.py --quick --device cpu            # tiny shapes, a smoke run
  python bench/bench_select.py --experiments all --trials 20
  python bench/bench_select.py --experiments table2,bar --algorithms qms,qms_warp,topk -o results/
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", default="all", type=argument_type(harness.parse_experiments), metavar="LIST",
                   help=f"comma-separated: {', '.join(harness.EXPERIMENTS)}, or all (default: all)")
    p.add_argument("--trials", type=argument_type(positive_int), default=harness.DEFAULT_TRIALS, metavar="N",
                   help=f"timed calls per cell, after two warm-up calls (default: {harness.DEFAULT_TRIALS})")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (a GPU if there is one), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--algorithms", default=None, type=argument_type(harness.parse_algorithms), metavar="LIST",
                   help="comma-separated algorithms to compare instead of each experiment's defaults; "
                        "the experiment's reference (insertion, bitonic, topk) is always added, names "
                        "that are not registered are reported as skipped")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes (rows ≤ 64, cols ≤ 2048, k ≤ 32): a smoke run of a few seconds")
    p.add_argument("-o", "--out", default=harness.DEFAULT_OUT, metavar="DIR",
                   help=f"output folder, created if missing (default: {harness.DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--cell-budget", type=argument_type(positive_seconds), default=None, metavar="SECONDS",
                   help=f"seconds of timed calls per cell before trials are cut (default: "
                        f"{harness.CELL_BUDGET_S[False]:g}, {harness.CELL_BUDGET_S[True]:g} with --quick)")
    p.add_argument("--hard-cap", type=argument_type(positive_seconds), default=None, metavar="SECONDS",
                   help=f"a single call longer than this skips the algorithm's remaining cells in the "
                        f"experiment (default: {harness.HARD_CAP_S[False]:g}, {harness.HARD_CAP_S[True]:g} "
                        "with --quick)")
    p.add_argument("--no-progress", action="store_true", help="no per-cell progress lines on standard error")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with ``argv`` (default: ``sys.argv[1:]``); return the exit status (2: bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help and usage errors (argparse printed them)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        results = harness.run(args.experiments, device=args.device, trials=args.trials, quick=args.quick,
                              out_dir=args.out, algorithms=args.algorithms, progress=not args.no_progress,
                              seed=args.seed, cell_budget_s=args.cell_budget, hard_cap_s=args.hard_cap,
                              command=shlex.join(["python", "bench/bench_select.py", *argv]))
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(harness.render_markdown(results), flush=True)
    out = Path(args.out)
    print(f"wrote {', '.join(str(out / name) for name in ('select.json', 'select.md', *results['plots'].values()))}",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
