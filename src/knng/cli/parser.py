"""The argument tree of ``knng``: every command, its options and its help.

Building it imports neither torch nor scikit-learn (choices come from :mod:`knng.cli.choices`,
texts from :mod:`knng.cli.texts`), so ``knng --help`` and a usage error are fast. Each command
names the module that runs it (``command_module``); :mod:`knng.cli.entry` imports that module only
once the arguments parsed.
"""

from __future__ import annotations

import argparse
from typing import Any

from knng.cli import texts
from knng.cli.argtypes import (
    alpha, argument_type, diffusion_time, epsilon, non_negative_seconds, positive_int, positive_seconds,
)
from knng.cli.choices import EMBED_EIGEN_SOLVERS, EMBED_METRICS, METRIC_NAMES, SELECT_NAMES

__all__ = ["build_parser"]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


class _VersionAction(argparse.Action):
    """``--version``: knng's, torch's and whether CUDA is there. Imports torch only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print knng's and torch's versions and whether CUDA is available, and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import torch

        from knng._version import VERSION

        gpu = "CUDA available" if torch.cuda.is_available() else "no CUDA device"
        print(f"knng {VERSION} (torch {torch.__version__}, {gpu})")  # stdout, as argparse's own
        parser.exit()


def _add_compute_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-k", "--k", type=int, required=True, metavar="K", help="neighbours per vector (required)")
    p.add_argument("--metric", choices=METRIC_NAMES, default=None, metavar="M",
                   help=f"{', '.join(METRIC_NAMES)}; cosine is 1 − cosine similarity, pearson "
                        "1 − correlation, inner_product −xᵀy (default: euclidean, or what an "
                        "ann-benchmarks HDF5 file declares: angular → cosine)")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (a GPU if there is one, else the CPU), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--select", default="auto", choices=SELECT_NAMES, metavar="NAME",
                   help=f"k-selection algorithm: {', '.join(SELECT_NAMES)} (default: auto)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="memory the engine may use on the device, e.g. 4GB or 512MiB "
                        "(default: 60%% of free GPU memory, or 25%% of free RAM up to 2 GiB)")
    p.add_argument("--host-memory", default=None, metavar="SIZE",
                   help="host memory the engine may hold besides the results, e.g. 20MB: files are "
                        "read in blocks that fit it, overlapping the work, and a graph's candidate "
                        "lists move to disk (in the output's work area) when they do not fit "
                        "(default: 75%% of available RAM; one process only)")


def _add_distributed_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several GPUs or processes (torch.distributed)")
    ranks = g.add_mutually_exclusive_group()
    ranks.add_argument("--gpus", type=argument_type(positive_int), default=None, metavar="N",
                       help="run on N GPUs of this host, one process each (NCCL); across hosts start "
                            "`torchrun --nnodes H --nproc-per-node G -m knng ...` or `srun ... knng ...` "
                            "instead (docs/DISTRIBUTED.md)")
    ranks.add_argument("--procs", type=argument_type(positive_int), default=None, metavar="N",
                       help="run as N CPU processes on this host (Gloo)")
    g.add_argument("--timeout", type=argument_type(positive_seconds), default=None, metavar="SECONDS",
                   help="a rank that makes no progress this long while the others wait for it stops the "
                        "job, with an error naming it (default: 300); a rank whose heartbeat stops for "
                        "10 s counts as dead")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", default="knng-out", metavar="DIR",
                   help="output folder, created if missing (default: knng-out); locked while the run "
                        "lasts, and its results are switched in as one set, so it may hold other files "
                        "but no sub-folders")
    p.add_argument("--overwrite", action="store_true", help="replace results already in DIR (all of them, "
                   "whatever their format)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is shown when standard error is a terminal)")
    p.add_argument("--resume", action="store_true",
                   help="continue a run into DIR that was killed part-way, from its last checkpoint (kept "
                        "in .DIR.knng-work beside DIR until the results are written); the result is the same "
                        "bit for bit; a checkpoint of other inputs, k, metric or knng version is refused; "
                        "with --procs/--gpus/torchrun every rank keeps its own part, and resuming needs the "
                        "same number of ranks)")
    p.add_argument("--checkpoint-interval", type=argument_type(non_negative_seconds), default=None,
                   metavar="SECONDS", help="seconds between checkpoints at least (default: 60; each also "
                   "waits 50 times its own duration, so checkpoints cost at most 2%%); 0: after every block "
                   "(after every block row / query chunk with several ranks, which agree on when to save)")


def _add_embed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="the points (FILE or FILE.hdf5:DATASET)")
    p.add_argument("-k", "--k", type=argument_type(positive_int), default=None, metavar="K",
                   help="the most neighbours a point's kernel row takes: the k of the k-NN graph (default: 40; "
                        "fewer keep the kernel more local)")
    p.add_argument("--components", type=argument_type(positive_int), default=2, metavar="M",
                   help="coordinates ψ₁ … ψ_M (the trivial constant one is left out; default: 2)")
    p.add_argument("--metric", choices=EMBED_METRICS, default=None, metavar="M",
                   help=f"{', '.join(EMBED_METRICS)} (default: euclidean, or what an ann-benchmarks file declares)")
    p.add_argument("--epsilon", type=argument_type(epsilon), default="auto", metavar="EPS",
                   help="kernel bandwidth in exp(−d²/ε): auto (the 0.97 quantile of the squared 5th-neighbour "
                        "distances, or the larger ε that the kernel's widest column reaches), bgh "
                        "(Berry–Giannakis–Harlim), self_tuning (exp(−d²/σᵢσⱼ), σ the distance to the "
                        "--sigma-neighbor-th neighbour) or a number (default: auto)")
    p.add_argument("--alpha", type=argument_type(alpha), default=1.0, metavar="A",
                   help="density normalisation: 0 graph Laplacian, 0.5 Fokker–Planck, 1 Laplace–Beltrami "
                        "(default: 1)")
    p.add_argument("--t", type=argument_type(diffusion_time), default=1.0, metavar="T",
                   help="diffusion time: coordinates λᵗψ (default: 1)")
    p.add_argument("--sigma-neighbor", type=argument_type(positive_int), default=7, metavar="J",
                   help="with --epsilon self_tuning: σᵢ is the distance to the J-th neighbour (default: 7)")
    p.add_argument("--eigen-solver", choices=EMBED_EIGEN_SOLVERS, default="auto",
                   help="scipy (ARPACK, host), torch (Lanczos on the device) or auto: torch on a GPU "
                        "(default: auto)")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (a GPU if there is one, else the CPU), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="memory the k-NN graph may use on the device, e.g. 4GB (default: as knng graph)")
    p.add_argument("--labels", default=None, metavar="FILE",
                   help="colour the plot by these labels: a .npy array or a text file with one label a line, "
                        "one per point")
    p.add_argument("--color-by", type=argument_type(positive_int), default=None, metavar="J",
                   help="without --labels, colour the plot by coordinate ψ_J (default: ψ₃, or the last)")
    p.add_argument("-o", "--out", default="knng-embed", metavar="DIR",
                   help="output folder, created if missing (default: knng-embed); locked while the run lasts, "
                        "its results switched in as one set")
    p.add_argument("--overwrite", action="store_true", help="replace results already in DIR")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they are shown when standard error is a terminal)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``knng`` command (exposed for documentation tools)."""
    formats = texts.formats_text()
    parser = argparse.ArgumentParser(
        prog="knng", description=texts.MAIN_DESCRIPTION, epilog=texts.MAIN_EPILOG + "\n" + formats,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def add(name: str, summary: str, description: str, examples: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=description, epilog=examples + "\n" + formats,
                           formatter_class=_Formatter)
        p.set_defaults(command_module=name)
        return p

    p = add("search", "exact k nearest neighbours of queries in a corpus", texts.SEARCH_DESCRIPTION,
            texts.SEARCH_EXAMPLES)
    p.add_argument("corpus", metavar="CORPUS", help="vectors to search in (FILE or FILE.hdf5:DATASET)")
    p.add_argument("queries", metavar="QUERIES", nargs="?", default=None,
                   help="query vectors (optional for an ann-benchmarks HDF5 CORPUS: its `test` set)")
    _add_compute_options(p)
    _add_output_options(p)
    p.add_argument("--check", action="store_true",
                   help="report recall@k against the ground truth `neighbors` of an ann-benchmarks file")
    _add_distributed_options(p)

    p = add("graph", "exact k-NN graph of one data set", texts.GRAPH_DESCRIPTION, texts.GRAPH_EXAMPLES)
    p.add_argument("data", metavar="DATA", help="the points (FILE or FILE.hdf5:DATASET)")
    _add_compute_options(p)
    p.add_argument("--include-self", action="store_true", help="count each point among its own neighbours")
    _add_output_options(p)
    p.add_argument("--format", choices=("npy", "npz"), default="npy",
                   help="npy: indices.npy + distances.npy; npz: one graph.npz for knng.load_graph "
                        "(default: npy)")
    _add_distributed_options(p)

    p = add("embed", "diffusion-map embedding on the exact k-NN graph", texts.EMBED_DESCRIPTION,
            texts.EMBED_EXAMPLES)
    _add_embed_options(p)

    p = add("info", "describe a vector file and how knng would process it", texts.INFO_DESCRIPTION,
            texts.INFO_EXAMPLES)
    p.add_argument("file", metavar="FILE", help="a vector file (FILE or FILE.hdf5:DATASET)")
    p.add_argument("-k", "--k", type=int, default=10, metavar="K",
                   help="k to plan for (default: 10)")
    p.add_argument("--metric", choices=METRIC_NAMES, default=None, metavar="M",
                   help="metric to plan for (the plan does not depend on it yet)")
    p.add_argument("--device", default="auto", metavar="DEV", help="device to plan for (default: auto)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE", help="memory budget to plan for")
    p.add_argument("--host-memory", default=None, metavar="SIZE", help="host memory budget to plan for")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: the file's description and the engine's plan (its \"plan\" is "
                        "what `knng graph FILE -k K` records in knng.json)")

    p = add("demo", "exact graphs of built-in data, verified against an oracle", texts.DEMO_DESCRIPTION,
            texts.DEMO_EXAMPLES)
    p.add_argument("-o", "--out", default="knng-demo", metavar="DIR",
                   help="folder for the demo graphs (default: knng-demo)")
    p.add_argument("--device", default="auto", metavar="DEV", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--quick", action="store_true", help="smaller image-patch set (stride 4, ~16k points)")
    p.add_argument("--embed", action="store_true",
                   help="the diffusion-map demo instead: rotated snapshots → circle, swiss roll unrolled")

    p = sub.add_parser("bench", help="where the benchmark harnesses are (bench/ in the source repository)",
                       description=texts.BENCH_DESCRIPTION, formatter_class=_Formatter)
    p.set_defaults(command_module="bench")
    p.add_argument("benchmark", nargs=argparse.REMAINDER, metavar="...",
                   help="what used to follow `knng bench` (e.g. select --quick)")
    return parser
