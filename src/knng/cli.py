"""The ``knng`` command line: ``search``, ``graph``, ``embed``, ``info``, ``demo`` and ``bench select``.

Every subcommand reads vector files lazily through :mod:`knng.io`, calls the public API
(:func:`knng.search`, :func:`knng.graph`) and writes its results atomically, only once the
computation has finished. Bad input (a missing file, a k out of range, an unknown metric, ...)
ends with ``knng: error: <message>`` on standard error and exit status 2, without a traceback;
anything unexpected propagates so that its traceback reaches the user.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from knng.engine.checkpoint import checkpoint_bytes
from knng.engine.plan import store_capacity
from knng.io.outputs import OutputFolder, OutputFolderError
from knng.io.workarea import CheckpointExistsError, WorkArea

__all__ = ["main", "build_parser"]

#: Exit status for bad input and usage errors (argparse uses the same).
EXIT_USAGE = 2
#: Exceptions that mean "the input is wrong", reported without a traceback.
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
    OutputFolderError, CheckpointExistsError,
)
#: ann-benchmarks ``distance`` attribute → knng metric.
ANN_METRICS = {"euclidean": "euclidean", "angular": "cosine"}
#: dtypes the engine computes with directly; other integer/bool data is converted on read.
_NATIVE_DTYPES = {"float16", "float32", "float64", "uint8", "int8", "bfloat16"}
_HDF5 = (".hdf5", ".h5")


class CliError(Exception):
    """A usage problem found by the command line itself (reported like bad input)."""


# --------------------------------------------------------------------------------------
# Help texts
# --------------------------------------------------------------------------------------


def _formats_text() -> str:
    from knng.io import FORMATS

    width = max(len(s) for s in FORMATS)
    lines = ["supported file formats (by suffix):"]
    for suffix, text in FORMATS.items():
        lines.append(f"  {suffix:<{width}}  {text}")
    return "\n".join(lines)


_MAIN_DESCRIPTION = """\
knng: exact k-nearest-neighbour search and exact k-NN graphs, brute force, on a GPU or the CPU.
Exact means: the k neighbours are those of the float64 distances computed directly from your
vectors, ties going to the smaller index. Start with `knng demo --quick`, look at a file with
`knng info FILE`, then run `knng search` or `knng graph`.
"""

_MAIN_EPILOG = """\
examples:
  knng demo --quick                         # built-in data, verified against an oracle
  knng info sift-128-euclidean.hdf5         # what is in a file, and how knng would run it
  knng search sift-128-euclidean.hdf5 -k 10 --check
  knng search base.fvecs queries.fvecs -k 100 -o results/
  knng graph vectors.npy -k 15 --format npz
  knng embed images.npy -k 32 --components 10 -o embedding/   # diffusion map
  knng bench select --experiments bar --trials 20

Run `knng COMMAND --help` for the options of each command.
"""

_SEARCH_DESCRIPTION = """\
Find, for every vector in QUERIES, its k nearest vectors in CORPUS, exactly. Results go to
DIR/indices.npy (int64, n_queries × k, row numbers into CORPUS), DIR/distances.npy (float32,
ascending) and DIR/knng.json (what was run, timings and the engine's report); they are written
only when the computation has finished. An ann-benchmarks HDF5 file on its own searches its
`test` set in its `train` set with the file's metric (angular → cosine); add --check to
compare with the file's ground truth `neighbors`.
"""

_SEARCH_EXAMPLES = """\
examples:
  knng search glove-100-angular.hdf5 -k 10 --check
  knng search base.fvecs queries.fvecs -k 100 -o results/
  knng search data.hdf5:train data.hdf5:test -k 10 --metric inner_product --device cuda:1
"""

_GRAPH_DESCRIPTION = """\
Build the exact k-nearest-neighbour graph of DATA: row i lists the k nearest other points of
point i (the point itself is excluded by index, duplicates stay; --include-self counts it).
Only about half of the distance matrix is computed, since it is symmetric. Results go to
DIR/indices.npy, DIR/distances.npy and DIR/knng.json, or with --format npz to DIR/graph.npz
(load it with knng.load_graph) and DIR/knng.json.
"""

_GRAPH_EXAMPLES = """\
examples:
  knng graph vectors.npy -k 15
  knng graph mnist-784-euclidean.hdf5 -k 10 --format npz -o mnist-graph/
"""

_EMBED_DESCRIPTION = """\
Embed DATA with a diffusion map (knng.DiffusionMap) on its exact k-NN graph: a kernel exp(−d²/ε)
on the union of the k-NN relations (ε chosen by the Berry–Giannakis–Harlim criterion unless
given), the α normalisation (1: Laplace–Beltrami, the default) and the leading non-trivial
eigenvectors ψ of the diffusion matrix, scaled by λᵗ, as coordinates (docs/MANIFOLD.md). Results
go to DIR/embedding.npy (float64, n × M), DIR/eigenvalues.npy (λ₁ … λ_M), DIR/knng.json (what
was run; the report: ε, every computed eigenvalue with its residual, the spectral gap, the time
split graph / kernel / eigensolver) and DIR/embedding.png (ψ₁ against ψ₂ and ψ₃, coloured by
--labels or by a coordinate; needs matplotlib), committed together once all are computed.
"""

_EMBED_EXAMPLES = """\
examples:
  knng embed images.npy -k 32 --components 10 -o embedding/
  knng embed vectors.fvecs -k 15 --components 3 --labels labels.txt --epsilon self_tuning
  knng embed data.hdf5:train -k 64 --components 5 --alpha 0.5 --t 2 --device cuda
"""

_INFO_DESCRIPTION = """\
Describe a vector file without reading its data: shape, dtype, size, format and whether it is
memory-mapped (HDF5: every dataset and the distance attribute). Then say what knng would do
with it: the device that --device auto picks, the memory budget, the tile plan for a k-NN graph
(and for ann-benchmarks files the search of `test` in `train`), whether the data stays resident
or streams through in tiles, and how large the outputs will be.
"""

_INFO_EXAMPLES = """\
examples:
  knng info base.fvecs
  knng info sift-128-euclidean.hdf5 -k 100 --memory-budget 8GB
  knng info data.hdf5:test
"""

_DEMO_DESCRIPTION = """\
Build exact k=10 graphs of two built-in real data sets (scikit-learn's digits and the 8×8
patches of scikit-image's camera photograph), time them, verify every row (or a random sample
of 2000 rows on large data) against a float64 oracle computed by differences, and show how many
rows the plain float32 expansion ‖x‖²+‖y‖²−2xᵀy gets wrong on the same data. Needs no files;
the patches need scikit-image (pip install knng[demo]). With --embed: the diffusion-map demo
instead (snapshots of a rotated picture come out as a circle whose angle is the rotation, a swiss
roll unrolls), with its checks and plots.
"""

_DEMO_EXAMPLES = """\
examples:
  knng demo --quick
  knng demo --device cuda -o /tmp/knng-demo
  knng demo --embed
"""


_BENCH_DESCRIPTION = """\
Benchmarks. `knng bench select` times the k-selection algorithms on the experiments of
Komarov, Dashti & D'Souza (2014) and on issue 3's acceptance bar.
"""

_BENCH_SELECT_DESCRIPTION = """\
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
matplotlib: pip install 'knng[bench]'), rewritten after each experiment; the markdown
summary is printed at the end. docs/SELECT_BENCH.md describes every experiment.
"""

_BENCH_SELECT_EXAMPLES = """\
examples:
  knng bench select --quick --device cpu            # tiny shapes, a smoke run
  knng bench select --experiments all --trials 20
  knng bench select --experiments table2,bar --algorithms qms,qms_warp,topk -o results/
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


def _version() -> str:
    import knng
    import torch

    gpu = "CUDA available" if torch.cuda.is_available() else "no CUDA device"
    return f"knng {knng.__version__} (torch {torch.__version__}, {gpu})"


def _metric_names() -> tuple[str, ...]:
    from knng.metrics import METRICS

    return tuple(METRICS)


def _add_compute_options(p: argparse.ArgumentParser, *, with_k: bool = True) -> None:
    from knng.select import available

    if with_k:
        p.add_argument("-k", "--k", type=int, required=True, metavar="K",
                       help="neighbours per vector (required)")
    p.add_argument("--metric", choices=_metric_names(), default=None, metavar="M",
                   help=f"{', '.join(_metric_names())}; cosine is 1 − cosine similarity, pearson "
                        "1 − correlation, inner_product −xᵀy (default: euclidean, or what an "
                        "ann-benchmarks HDF5 file declares: angular → cosine)")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (a GPU if there is one, else the CPU), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--select", default="auto", choices=available(), metavar="NAME",
                   help=f"k-selection algorithm: {', '.join(available())} (default: auto)")
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
    ranks.add_argument("--gpus", type=_argument_type(_positive_int), default=None, metavar="N",
                       help="run on N GPUs of this host, one process each (NCCL); across hosts start "
                            "`torchrun --nnodes H --nproc-per-node G -m knng ...` instead")
    ranks.add_argument("--procs", type=_argument_type(_positive_int), default=None, metavar="N",
                       help="run as N CPU processes on this host (Gloo)")
    g.add_argument("--timeout", type=_argument_type(_positive_seconds), default=None, metavar="SECONDS",
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
    p.add_argument("--checkpoint-interval", type=_argument_type(_non_negative_seconds), default=None,
                   metavar="SECONDS", help="seconds between checkpoints at least (default: 60; each also "
                   "waits 50 times its own duration, so checkpoints cost at most 2%%); 0: after every block "
                   "(after every block row / query chunk with several ranks, which agree on when to save)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``knng`` command (exposed for documentation tools)."""
    formats = _formats_text()
    parser = argparse.ArgumentParser(
        prog="knng", description=_MAIN_DESCRIPTION, epilog=_MAIN_EPILOG + "\n" + formats,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def add(name: str, summary: str, description: str, examples: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description,
                              epilog=examples + "\n" + formats, formatter_class=_Formatter)

    p = add("search", "exact k nearest neighbours of queries in a corpus", _SEARCH_DESCRIPTION,
            _SEARCH_EXAMPLES)
    p.add_argument("corpus", metavar="CORPUS", help="vectors to search in (FILE or FILE.hdf5:DATASET)")
    p.add_argument("queries", metavar="QUERIES", nargs="?", default=None,
                   help="query vectors (optional for an ann-benchmarks HDF5 CORPUS: its `test` set)")
    _add_compute_options(p)
    _add_output_options(p)
    p.add_argument("--check", action="store_true",
                   help="report recall@k against the ground truth `neighbors` of an ann-benchmarks file")
    _add_distributed_options(p)
    p.set_defaults(handler=_cmd_search)

    p = add("graph", "exact k-NN graph of one data set", _GRAPH_DESCRIPTION, _GRAPH_EXAMPLES)
    p.add_argument("data", metavar="DATA", help="the points (FILE or FILE.hdf5:DATASET)")
    _add_compute_options(p)
    p.add_argument("--include-self", action="store_true", help="count each point among its own neighbours")
    _add_output_options(p)
    p.add_argument("--format", choices=("npy", "npz"), default="npy",
                   help="npy: indices.npy + distances.npy; npz: one graph.npz for knng.load_graph "
                        "(default: npy)")
    _add_distributed_options(p)
    p.set_defaults(handler=_cmd_graph)

    p = add("embed", "diffusion-map embedding on the exact k-NN graph", _EMBED_DESCRIPTION, _EMBED_EXAMPLES)
    _add_embed_options(p)
    p.set_defaults(handler=_cmd_embed)

    p = add("info", "describe a vector file and how knng would process it", _INFO_DESCRIPTION,
            _INFO_EXAMPLES)
    p.add_argument("file", metavar="FILE", help="a vector file (FILE or FILE.hdf5:DATASET)")
    p.add_argument("-k", "--k", type=int, default=10, metavar="K",
                   help="k to plan for (default: 10)")
    p.add_argument("--metric", choices=_metric_names(), default=None, metavar="M",
                   help="metric to plan for (the plan does not depend on it yet)")
    p.add_argument("--device", default="auto", metavar="DEV", help="device to plan for (default: auto)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE", help="memory budget to plan for")
    p.add_argument("--host-memory", default=None, metavar="SIZE", help="host memory budget to plan for")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: the file's description and the engine's plan (its \"plan\" is "
                        "what `knng graph FILE -k K` records in knng.json)")
    p.set_defaults(handler=_cmd_info)

    p = add("demo", "exact graphs of built-in data, verified against an oracle", _DEMO_DESCRIPTION,
            _DEMO_EXAMPLES)
    p.add_argument("-o", "--out", default="knng-demo", metavar="DIR",
                   help="folder for the demo graphs (default: knng-demo)")
    p.add_argument("--device", default="auto", metavar="DEV", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--quick", action="store_true", help="smaller image-patch set (stride 4, ~16k points)")
    p.add_argument("--embed", action="store_true",
                   help="the diffusion-map demo instead: rotated snapshots → circle, swiss roll unrolled")
    p.set_defaults(handler=_cmd_demo)

    p = sub.add_parser("bench", help="benchmarks: `knng bench select` times the k-selection algorithms",
                       description=_BENCH_DESCRIPTION, epilog=_BENCH_SELECT_EXAMPLES, formatter_class=_Formatter)
    p.set_defaults(handler=_cmd_bench_usage, bench_parser=p)
    benches = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", title="benchmarks")
    _add_bench_select(benches.add_parser(
        "select", help="k-selection experiments of the quick multi-select paper and issue 3's bar",
        description=_BENCH_SELECT_DESCRIPTION, epilog=_BENCH_SELECT_EXAMPLES, formatter_class=_Formatter))
    return parser


def _argument_type(parse: Any) -> Any:
    """An argparse ``type=`` that reports ``parse``'s ValueError as the argument's error."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"must be a number of seconds ≥ 0, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    return value


def _add_bench_select(p: argparse.ArgumentParser) -> None:
    from knng.benchmarks.select import (
        CELL_BUDGET_S, DEFAULT_OUT, DEFAULT_TRIALS, EXPERIMENTS, HARD_CAP_S, parse_algorithms, parse_experiments,
    )

    p.add_argument("--experiments", default="all", type=_argument_type(parse_experiments), metavar="LIST",
                   help=f"comma-separated: {', '.join(EXPERIMENTS)}, or all (default: all)")
    p.add_argument("--trials", type=_argument_type(_positive_int), default=DEFAULT_TRIALS, metavar="N",
                   help=f"timed calls per cell, after two warm-up calls (default: {DEFAULT_TRIALS})")
    p.add_argument("--device", default="auto", metavar="DEV",
                   help="auto (a GPU if there is one), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--algorithms", default=None, type=_argument_type(parse_algorithms), metavar="LIST",
                   help="comma-separated algorithms to compare instead of each experiment's defaults; "
                        "the experiment's reference (insertion, bitonic, topk) is always added, names "
                        "that are not registered are reported as skipped")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes (rows ≤ 64, cols ≤ 2048, k ≤ 32): a smoke run of a few seconds")
    p.add_argument("-o", "--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"output folder, created if missing (default: {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    p.add_argument("--cell-budget", type=_argument_type(_positive_seconds), default=None, metavar="SECONDS",
                   help=f"seconds of timed calls per cell before trials are cut (default: "
                        f"{CELL_BUDGET_S[False]:g}, {CELL_BUDGET_S[True]:g} with --quick)")
    p.add_argument("--hard-cap", type=_argument_type(_positive_seconds), default=None, metavar="SECONDS",
                   help=f"a single call longer than this skips the algorithm's remaining cells in the "
                        f"experiment (default: {HARD_CAP_S[False]:g}, {HARD_CAP_S[True]:g} with --quick)")
    p.add_argument("--no-progress", action="store_true", help="no per-cell progress lines on standard error")
    p.set_defaults(handler=_cmd_bench_select)


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


class _AsFloat64Rows:
    """Row-sliceable view of integer vectors the engine does not take directly (int32 from
    ``.ivecs``/``.ibin``, int16, int64, ...) that converts each block it reads to float64.

    float64 holds every integer up to 2⁵³ exactly, so the conversion changes no distance (wider
    values are refused as they are read), and the file is still read block by block, never whole.
    """

    def __init__(self, source: Any, name: str) -> None:
        self.source, self.name = source, name
        self.shape = tuple(int(s) for s in source.shape)
        self.dtype = np.dtype(np.float64)
        self._wide = np.dtype(source.dtype).itemsize > 4

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        block = np.asarray(self.source[index])
        if self._wide and block.size and int(np.abs(block).max()) > 2**53:
            raise ValueError(f"{self.name} holds integers beyond 2**53, which float64 cannot hold exactly")
        return block.astype(np.float64)


@dataclass
class _Input:
    """One opened input file: what the user typed, what it is, and the array knng gets."""

    spec: str
    info: dict[str, Any]
    array: Any
    converted: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.info["shape"])

    @property
    def is_hdf5(self) -> bool:
        return self.info["format"] in _HDF5

    def summary(self) -> dict[str, Any]:
        out = {"path": self.info["path"], "format": self.info["format"], "shape": list(self.shape),
               "dtype": self.info["dtype"]}
        if self.is_hdf5:
            out["dataset"] = self.info["dataset"]
        if self.converted:
            out["converted_to"] = "float64 (integers, converted exactly)"
        return out


def _explicit_dataset(spec: str) -> bool:
    """Whether ``spec`` names an HDF5 dataset (``file.hdf5:test``) rather than a plain file."""
    return ":" in spec and not os.path.exists(spec)


def _open(spec: str, dataset: str | None = None) -> _Input:
    from knng.io import describe, read_vectors

    if dataset is not None and not _explicit_dataset(spec):
        spec = f"{spec}:{dataset}"
    info = describe(spec)
    array = read_vectors(spec)
    if len(info["shape"]) != 2:
        raise ValueError(f"{spec}: expected a 2-D array of vectors, got shape {tuple(info['shape'])}")
    converted = False
    if info["dtype"] not in _NATIVE_DTYPES and np.dtype(array.dtype).kind in "iub":
        array, converted = _AsFloat64Rows(array, spec), True
    return _Input(spec, info, array, converted)


def _metric_for(args: argparse.Namespace, source: _Input) -> str:
    """The metric: --metric if given, else what an HDF5 file declares, else euclidean."""
    if args.metric is not None:
        return args.metric
    distance = source.info.get("distance") if source.is_hdf5 else None
    if distance is None:
        return "euclidean"
    name = str(distance).lower()
    if name not in ANN_METRICS:
        raise CliError(
            f"{source.info['path']} declares distance {distance!r}, which knng does not support "
            f"(it supports the ann-benchmarks distances {', '.join(ANN_METRICS)}); "
            f"pass --metric with one of {', '.join(_metric_names())} to override"
        )
    return ANN_METRICS[name]


# --------------------------------------------------------------------------------------
# Shared pieces of search and graph
# --------------------------------------------------------------------------------------


def _device_and_budget(device: str, memory_budget: str | None) -> tuple[Any, int | None]:
    """Validate the device and an explicit budget before any work, as the API will.

    The default budget is left to the engine, which resolves it once, when it plans the run
    (the plan it records in ``knng.json`` says which budget it took and where from).
    """
    from knng._units import parse_bytes
    from knng.engine.common import resolve_device

    dev = resolve_device(device)
    return dev, None if memory_budget is None else parse_bytes(memory_budget, "memory_budget")


def _device_text(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def _refuse_existing(out: Path, names: Sequence[str], overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise CliError(f"output folder {out} exists and is not a folder")
    existing = [name for name in names if os.path.lexists(out / name)]
    if existing and not overwrite:
        raise FileExistsError(
            f"{out} already holds results ({', '.join(existing)}); pass --overwrite to replace "
            "them, or choose another folder with -o"
        )


def _progress(args: argparse.Namespace) -> bool:
    return not args.no_progress and sys.stderr.isatty()


def _report_dict(report: Any) -> dict[str, Any]:
    from knng.api import report_as_dict

    return report_as_dict(report)


def _metadata(command: str, argv: Sequence[str], inputs: dict[str, _Input], **fields: Any) -> dict[str, Any]:
    import knng
    import torch

    return {
        "knng_version": knng.__version__,
        "torch_version": torch.__version__,
        "command": command,
        "argv": "knng " + " ".join(shlex.quote(a) for a in argv),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "inputs": {name: src.summary() for name, src in inputs.items()},
        **fields,
    }


def _fmt_bytes(n: float) -> str:
    """Binary units, like the budget defaults (``2 GiB``) and ``--memory-budget 4GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _shape_text(shape: Sequence[int]) -> str:
    return " × ".join(f"{s:,}" for s in shape)


def _exact_line(report: Any) -> str:
    screen = getattr(report, "screen_dtype", None)
    per_row = getattr(report, "evaluations_per_row", None) or {}
    text = f"  exact: {report.exact.exact_evaluations:,} exact evaluations for {report.exact.rows:,} rows"
    if per_row:
        text += f" (per row: median {per_row['median']:.0f}, p99 {per_row['p99']:.0f}, max {per_row['max']:.0f})"
    text = (text + (f"; {screen} screen" if screen else "")
            + (f"; {report.oom_retries} out-of-memory retries" if getattr(report, "oom_retries", 0) else ""))
    checkpoints = getattr(report, "checkpoints", None) or {}
    if checkpoints.get("resumed_from"):
        from knng.distributed.blockcyclic import DistributedGraphReport

        # Steps are blocks (one-process graph), block rows (distributed graph) or query rows.
        unit = ("blocks" if getattr(report, "blocks_skipped", None) is not None
                else "block rows" if isinstance(report, DistributedGraphReport) else "queries")
        text += (f"\n  resumed from a checkpoint with {checkpoints['resumed_from']:,} {unit} done; "
                 f"{checkpoints['saves']} checkpoints saved since ({checkpoints['seconds']:.2f} s)")
    return text


def _say(*parts: Any) -> None:
    print(*parts, flush=True)


def _say_err(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Several ranks (torch.distributed)
# --------------------------------------------------------------------------------------


def _is_rank() -> bool:
    """Whether this process is one rank of a distributed job (knng's launcher, torchrun, Slurm)."""
    from knng.distributed import is_launched

    return is_launched()


def _launch_if_asked(args: argparse.Namespace) -> int | None:
    """With --gpus/--procs, start the ranks (each runs this same command) and return their status."""
    from knng.distributed.launch import LAUNCH_DEVICE_ENV

    n = args.gpus or args.procs
    if n is None or os.environ.get(LAUNCH_DEVICE_ENV):  # none asked, or we are one of the ranks
        return None
    if _is_rank():
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

    return launch(sys.argv[1:] if _LAUNCH_ARGV[0] is None else _LAUNCH_ARGV[0], n, "cuda" if args.gpus else "cpu",
                  grace=DEFAULT_HEARTBEAT_TIMEOUT + 20)


#: The argv of this invocation, handed to the ranks unchanged (they ignore --gpus/--procs).
_LAUNCH_ARGV: list[list[str] | None] = [None]


def _rank_device(args: argparse.Namespace) -> str:
    from knng.distributed.launch import LAUNCH_DEVICE_ENV

    return "cpu" if os.environ.get(LAUNCH_DEVICE_ENV) == "cpu" else args.device


def _start_rank(args: argparse.Namespace) -> tuple[int, int, str]:
    """Join the job; returns (rank, world size, device)."""
    import torch.distributed as dist

    import knng.distributed as kd
    from knng.distributed.comm import DEFAULT_TIMEOUT
    from knng.distributed.launch import die_with_launcher

    die_with_launcher()  # a rank of --gpus/--procs ends with its launcher
    device = _rank_device(args)
    kd.init(device=device, timeout=args.timeout or DEFAULT_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), device


def _ranks_line(world: int, dev: Any, seconds: float, n: int, unit: str) -> str:
    return (f"  {world} rank{'s' if world != 1 else ''} on {_device_text(dev)}"
            + ("" if dev.type == "cpu" else " (one GPU each)")
            + f": {seconds:.2f} s, {n / max(seconds, 1e-9):,.0f} {unit}/s")


def _wait_line(report: Any) -> str:
    gb = sum(r.get("bytes", 0) for r in report.per_rank) / 1e9
    return (f"  communication: at most {report.wait_share:.0%} of a rank's time blocked on collectives and peers"
            + (f", {gb:.2f} GB sent" if gb else ""))


def _graph_distributed(args: argparse.Namespace, argv: Sequence[str], data: _Input, metric: str, out: Path) -> int:
    import torch.distributed as dist

    import knng.distributed as kd
    from knng.api import last_report
    from knng.distributed.comm import DEFAULT_TIMEOUT
    from knng.io import NEIGHBOR_FILES

    rank, world, device = _start_rank(args)
    dev, budget = _device_and_budget(device, args.memory_budget)
    timeout = args.timeout or DEFAULT_TIMEOUT
    meta = _metadata("graph", argv, {"data": data}, k=args.k, metric=metric, include_self=args.include_self,
                     device=str(dev), select=args.select, memory_budget_bytes=budget, format=args.format,
                     world_size=world)
    t0 = time.perf_counter()
    common = dict(metric=metric, include_self=args.include_self, device=device, select=args.select,
                  memory_budget=args.memory_budget, progress=_progress(args), timeout=timeout,
                  **_rank_checkpoint_options(args, out, rank))
    if args.format == "npy":
        report = kd.graph_to_files(data.array, args.k, out, metadata=meta, overwrite=args.overwrite, **common)
        written = [str(out / NEIGHBOR_FILES["indices"]), NEIGHBOR_FILES["distances"], NEIGHBOR_FILES["metadata"]]
    else:
        graph = kd.graph(data.array, args.k, **common)
        report = last_report()
        written = []
        if rank == 0:
            meta.update(report=_report_dict(report), timings_s={"graph": report.seconds})
            with _output_folder(out, args, data.shape[0] * args.k * 12, argv) as folder:
                written = [str(p) for p in _save_graph_npz(folder, graph.numpy(), meta)]
    seconds = time.perf_counter() - t0
    dist.destroy_process_group()
    if rank == 0:
        n = data.shape[0]
        _say(f"knng graph: {n:,} points, d={data.shape[1]}, k={args.k}, metric {metric}"
             + (", self included" if args.include_self else ""))
        _say(_ranks_line(world, dev, seconds, n, "points"))
        blocks = [r["blocks"] for r in report.per_rank]
        _say(f"  block-cyclic plan: {report.parts} parts of ≤{report.part_size:,} points, {report.blocks_computed:,} "
             f"of {report.blocks_full:,} blocks computed ({report.pairs_saving:.0%} of the pair work skipped), "
             f"{min(blocks)}–{max(blocks)} blocks per rank")
        _say(_wait_line(report))
        _say(_exact_line(report))
        _say(f"  wrote {', '.join(written)}")
    return 0


def _search_distributed(args: argparse.Namespace, argv: Sequence[str], corpus: _Input, queries: _Input,
                        metric: str, out: Path, ann_mode: bool, truth: Any) -> int:
    import torch.distributed as dist

    import knng.distributed as kd
    from knng.api import last_report
    from knng.distributed.comm import DEFAULT_TIMEOUT
    from knng.io import NEIGHBOR_FILES, write_neighbors

    rank, world, device = _start_rank(args)
    dev, budget = _device_and_budget(device, args.memory_budget)
    t0 = time.perf_counter()
    result = kd.search(queries.array, corpus.array, args.k, metric=metric, device=device, select=args.select,
                       memory_budget=args.memory_budget, progress=_progress(args),
                       timeout=args.timeout or DEFAULT_TIMEOUT, **_rank_checkpoint_options(args, out, rank))
    seconds = time.perf_counter() - t0
    report = last_report()
    dist.destroy_process_group()
    if rank != 0:
        return 0
    indices, distances = np.asarray(result.indices), np.asarray(result.distances)
    nq = indices.shape[0]
    check = _recall(indices, distances, *truth) if truth is not None else None
    meta = _metadata("search", argv, {"corpus": corpus, "queries": queries}, k=args.k, metric=metric,
                     device=str(dev), select=args.select, memory_budget_bytes=budget, world_size=world,
                     ann_benchmarks_file=ann_mode, timings_s={"search": seconds}, report=_report_dict(report),
                     check=check)
    write_neighbors(out, indices, distances, metadata=meta, overwrite=args.overwrite)
    _say(f"knng search: {nq:,} queries × {corpus.shape[0]:,} corpus vectors, d={corpus.shape[1]}, k={args.k}, "
         f"metric {metric}")
    _say(_ranks_line(world, dev, seconds, nq, "queries"))
    _say(f"  corpus shards of {min(report.shard_rows):,}–{max(report.shard_rows):,} vectors, one per rank")
    if check is not None:
        _say(f"  check: recall@{check['k']} = {check['recall']:.6f} against the file's ground truth")
    _say(f"  wrote {out / NEIGHBOR_FILES['indices']}, {NEIGHBOR_FILES['distances']}, {NEIGHBOR_FILES['metadata']}")
    return 0


# --------------------------------------------------------------------------------------
# search
# --------------------------------------------------------------------------------------


def _search_inputs(args: argparse.Namespace) -> tuple[_Input, _Input, bool]:
    """Open CORPUS and QUERIES; returns (corpus, queries, ann_mode)."""
    from knng.io import describe

    if args.queries is not None:
        return _open(args.corpus), _open(args.queries), False
    info = describe(args.corpus)
    if info["format"] not in _HDF5 or _explicit_dataset(args.corpus):
        raise CliError(
            f"no QUERIES given: `knng search CORPUS QUERIES -k K` needs a query file (only an "
            f"ann-benchmarks HDF5 file brings its own `test` queries); for the k-NN graph of "
            f"{args.corpus} itself use `knng graph {args.corpus} -k K`"
        )
    missing = [name for name in ("train", "test") if name not in info["datasets"]]
    if missing:
        raise CliError(
            f"{args.corpus} has no {' and no '.join(repr(m) for m in missing)} dataset, so it is not an "
            f"ann-benchmarks file (datasets: {', '.join(sorted(info['datasets']))}); give QUERIES, "
            "e.g. `knng search FILE.hdf5:base FILE.hdf5:queries -k K`"
        )
    return _open(args.corpus, "train"), _open(args.corpus, "test"), True


def _ground_truth(args: argparse.Namespace, corpus: _Input, queries: _Input) -> tuple[Any, Any]:
    """The file's (neighbors, distances-or-None) datasets for --check, validated."""
    from knng.io import read_vectors

    if not (corpus.is_hdf5 and queries.is_hdf5 and corpus.info["path"] == queries.info["path"]
            and queries.info["dataset"] == "test" and "neighbors" in corpus.info["datasets"]):
        raise CliError(
            "--check needs an ann-benchmarks HDF5 file with `train`, `test` and `neighbors` "
            "datasets, searched as a whole (e.g. `knng search FILE.hdf5 -k 10 --check`)"
        )
    path = corpus.info["path"]
    neighbors = read_vectors(path, dataset="neighbors")
    if neighbors.shape[0] != queries.shape[0]:
        raise CliError(f"{path}: `neighbors` has {neighbors.shape[0]} rows but `test` has {queries.shape[0]}")
    distances = read_vectors(path, dataset="distances") if "distances" in corpus.info["datasets"] else None
    return neighbors, distances


def _recall(ours_idx: np.ndarray, ours_dist: np.ndarray, gt_idx: Any, gt_dist: Any) -> dict[str, Any]:
    """recall@k against ground truth; how many rows differ, and of those how many share the
    file's k-th distance (ground-truth files may break ties differently)."""
    k = min(ours_idx.shape[1], int(gt_idx.shape[1]))
    hits = 0
    differ = tied = 0
    chunk = 2048
    for r0 in range(0, ours_idx.shape[0], chunk):
        r1 = min(ours_idx.shape[0], r0 + chunk)
        mine = ours_idx[r0:r1, :k]
        truth = np.asarray(gt_idx[r0:r1, :k]).astype(np.int64)
        found = (mine[:, :, None] == truth[:, None, :]).any(axis=2).sum(axis=1)
        hits += int(found.sum())
        rows = found < k
        differ += int(rows.sum())
        if gt_dist is not None and rows.any():
            theirs = np.asarray(gt_dist[r0:r1, k - 1], dtype=np.float64)[rows]
            mine_kth = ours_dist[r0:r1, k - 1].astype(np.float64)[rows]
            tied += int((np.abs(mine_kth - theirs) <= 1e-4 * np.maximum(np.abs(theirs), 1e-6)).sum())
    n = ours_idx.shape[0]
    return {"k": k, "recall": hits / (n * k) if n else 1.0, "rows_differ": differ,
            "rows_differ_same_kth_distance": tied if gt_dist is not None else None}


def _cmd_search(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import knng
    from knng.io import NEIGHBOR_FILES, write_neighbors

    corpus, queries, ann_mode = _search_inputs(args)
    metric = _metric_for(args, corpus)
    dev, _ = _device_and_budget(args.device, args.memory_budget)
    out = Path(args.out)
    _refuse_existing(out, list(NEIGHBOR_FILES.values()), args.overwrite)
    truth = _ground_truth(args, corpus, queries) if args.check else None
    _refuse_distributed_host_memory(args)
    _check_output_before_launch(out, args, queries.shape[0] * args.k * 12, argv)
    launched = _launch_if_asked(args)
    if launched is not None:
        return launched
    if _is_rank():
        return _search_distributed(args, argv, corpus, queries, metric, out, ann_mode, truth)

    with _output_folder(out, args, queries.shape[0] * args.k * 12, argv,
                        checkpoints=checkpoint_bytes("search", queries.shape[0], args.k, 0)) as folder:
        return _search_one_process(args, argv, corpus, queries, ann_mode, metric, dev, out, truth, folder)


def _check_output_before_launch(out: Path, args: argparse.Namespace, expected_bytes: int,
                                argv: Sequence[str]) -> None:
    """Before --gpus/--procs start their ranks: the folder is free, writable and has the space.

    Rank 0 locks it again to commit (the launcher cannot hold the lock for its children); a run
    that took the folder in between makes that commit fail, it never replaces results silently.
    """
    from knng.distributed.launch import LAUNCH_DEVICE_ENV

    if (args.gpus or args.procs) and not os.environ.get(LAUNCH_DEVICE_ENV) and not _is_rank():
        with _output_folder(out, args, expected_bytes, argv):
            pass


def _output_folder(out: Path, args: argparse.Namespace, expected_bytes: int, argv: Sequence[str],
                   checkpoints: int = 0) -> OutputFolder:
    """The output folder, locked and checked before any computing (:class:`knng.io.outputs.OutputFolder`);
    ``checkpoints``: the bytes a one-process run's checkpoints may take beside it."""
    return OutputFolder(out, overwrite=args.overwrite, expected_bytes=expected_bytes + checkpoints,
                        command="knng " + " ".join(argv),
                        space_for="the results and the run's checkpoints" if checkpoints else "the results")


def _checkpoint_options(args: argparse.Namespace, folder: OutputFolder) -> dict[str, Any]:
    """Checkpoints in the output folder's work area, kept until the results are committed."""
    if args.overwrite and not args.resume and WorkArea(folder.work_area).exists():
        # --overwrite replaces what the folder holds, an earlier run's unfinished work included.
        _say_err(f"knng: --overwrite: discarding the checkpoint of an earlier run in {folder.work_area}")
        WorkArea(folder.work_area).remove()
    options: dict[str, Any] = {"checkpoint": folder.work_area, "resume": args.resume, "keep_checkpoint": True}
    if args.checkpoint_interval is not None:
        options["checkpoint_interval"] = args.checkpoint_interval
    return options


def _rank_checkpoint_options(args: argparse.Namespace, out: Path, rank: int) -> dict[str, Any]:
    """A rank's checkpoint options: every rank's part in the output folder's work area, kept until
    rank 0 commits the results (the commit removes it)."""
    work_area = OutputFolder(out).work_area  # a path only: rank 0 locks the folder when it commits
    if rank == 0 and args.overwrite and not args.resume and WorkArea(work_area).exists():
        # Before any collective: the other ranks touch the area only after rank 0 has opened it.
        _say_err(f"knng: --overwrite: discarding the checkpoint of an earlier run in {work_area}")
        WorkArea(work_area).remove()
    options: dict[str, Any] = {"checkpoint": work_area, "resume": args.resume, "keep_checkpoint": True}
    if args.checkpoint_interval is not None:
        options["checkpoint_interval"] = args.checkpoint_interval
    return options


def _refuse_distributed_host_memory(args: argparse.Namespace) -> None:
    if args.host_memory is not None and (args.gpus or args.procs or _is_rank()):
        raise CliError("--host-memory works for one process only for now: rerun without --gpus/--procs/torchrun, "
                       "or without --host-memory (each rank reads only the parts it needs)")


def _search_one_process(args: argparse.Namespace, argv: Sequence[str], corpus: _Input, queries: _Input,
                        ann_mode: bool, metric: str, dev: Any, out: Path, truth: Any, folder: OutputFolder) -> int:
    import knng
    from knng.io import NEIGHBOR_FILES, write_neighbors

    t0 = time.perf_counter()
    result = knng.search(queries.array, corpus.array, args.k, metric=metric, device=args.device,
                         select=args.select, memory_budget=args.memory_budget,
                         host_memory_budget=args.host_memory, progress=_progress(args),
                         **_checkpoint_options(args, folder))
    seconds = time.perf_counter() - t0
    report = knng.api.last_report()
    indices, distances = np.asarray(result.indices), np.asarray(result.distances)
    nq = indices.shape[0]
    check = _recall(indices, distances, *truth) if truth is not None else None

    meta = _metadata(
        "search", argv, {"corpus": corpus, "queries": queries}, k=args.k, metric=metric,
        device=str(dev), select=args.select, memory_budget_bytes=report.plan.budget,
        ann_benchmarks_file=ann_mode, timings_s={"search": seconds},
        throughput_queries_per_s=nq / seconds if seconds > 0 else None,
        report=_report_dict(report), check=check,
    )
    t1 = time.perf_counter()
    write_neighbors(folder, indices, distances, metadata=meta, overwrite=args.overwrite)
    write_s = time.perf_counter() - t1

    _say(f"knng search: {nq:,} queries × {corpus.shape[0]:,} corpus vectors, d={corpus.shape[1]}, "
         f"k={args.k}, metric {metric}" + (" (ann-benchmarks train/test)" if ann_mode else ""))
    _say(f"  device {_device_text(dev)}: {seconds:.2f} s, {nq / max(seconds, 1e-9):,.0f} queries/s")
    if report is not None:
        _say(_exact_line(report))
    if check is not None:
        line = f"  check: recall@{check['k']} = {check['recall']:.6f} against the file's ground truth"
        if check["rows_differ"]:
            line += f"; {check['rows_differ']:,} rows differ"
            if check["rows_differ_same_kth_distance"] is not None:
                line += (f", {check['rows_differ_same_kth_distance']:,} of them with the same k-th "
                         "distance (ties broken differently)")
        _say(line)
    _say(f"  wrote {out / NEIGHBOR_FILES['indices']}, {NEIGHBOR_FILES['distances']}, "
         f"{NEIGHBOR_FILES['metadata']} ({nq:,} × {args.k}; {write_s:.2f} s)")
    return 0


# --------------------------------------------------------------------------------------
# graph
# --------------------------------------------------------------------------------------


def _save_graph_npz(folder: OutputFolder, graph: Any, meta: dict[str, Any]) -> list[Path]:
    """Write graph.npz (through Graph.save) and knng.json into ``folder`` and commit them as one set."""

    from knng.io import json_default

    text = json.dumps(meta, indent=2, sort_keys=True, default=json_default) + "\n"
    graph.save(folder.staging / "graph.npz")
    (folder.staging / "knng.json").write_text(text, encoding="utf-8")
    out = folder.commit()
    return [out / "graph.npz", out / "knng.json"]


def _cmd_graph(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import knng
    from knng.io import NEIGHBOR_FILES, write_neighbors

    data = _open(args.data)
    metric = _metric_for(args, data)
    dev, _ = _device_and_budget(args.device, args.memory_budget)
    out = Path(args.out)
    names = list(NEIGHBOR_FILES.values()) if args.format == "npy" else ["graph.npz", "knng.json"]
    _refuse_existing(out, names, args.overwrite)
    _refuse_distributed_host_memory(args)
    _check_output_before_launch(out, args, data.shape[0] * args.k * 12, argv)
    launched = _launch_if_asked(args)
    if launched is not None:
        return launched
    if _is_rank():
        return _graph_distributed(args, argv, data, metric, out)

    n = data.shape[0]
    capacity = store_capacity(args.k, n if args.include_self else n - 1)
    with _output_folder(out, args, n * args.k * 12, argv,
                        checkpoints=checkpoint_bytes("graph", n, args.k, capacity)) as folder:
        return _graph_one_process(args, argv, data, metric, dev, folder)


def _graph_one_process(args: argparse.Namespace, argv: Sequence[str], data: _Input, metric: str, dev: Any,
                       folder: OutputFolder) -> int:
    import knng
    from knng.io import NEIGHBOR_FILES, write_neighbors

    out = folder.path
    t0 = time.perf_counter()
    graph = knng.graph(data.array, args.k, metric=metric, include_self=args.include_self,
                       device=args.device, select=args.select, memory_budget=args.memory_budget,
                       host_memory_budget=args.host_memory, progress=_progress(args),
                       **_checkpoint_options(args, folder))
    seconds = time.perf_counter() - t0
    report = knng.api.last_report()
    graph = graph.numpy()
    n = graph.n_points

    meta = _metadata(
        "graph", argv, {"data": data}, k=args.k, metric=metric, include_self=args.include_self,
        device=str(dev), select=args.select, memory_budget_bytes=report.plan.budget, format=args.format,
        timings_s={"graph": seconds}, throughput_points_per_s=n / seconds if seconds > 0 else None,
        report=_report_dict(report),
    )
    t1 = time.perf_counter()
    if args.format == "npz":
        written = [str(p) for p in _save_graph_npz(folder, graph, meta)]
    else:
        write_neighbors(folder, graph.indices, graph.distances, metadata=meta, overwrite=args.overwrite)
        written = [str(out / NEIGHBOR_FILES["indices"]), NEIGHBOR_FILES["distances"], NEIGHBOR_FILES["metadata"]]
    write_s = time.perf_counter() - t1

    _say(f"knng graph: {n:,} points, d={data.shape[1]}, k={args.k}, metric {metric}"
         + (", self included" if args.include_self else ""))
    _say(f"  device {_device_text(dev)}: {seconds:.2f} s, {n / max(seconds, 1e-9):,.0f} points/s")
    if report is not None:
        _say(f"  symmetric plan: {report.parts} part{'s' if report.parts != 1 else ''} of ≤{report.part_size:,} points, "
             f"{report.blocks_computed:,} of {report.blocks_full:,} blocks computed "
             f"({report.pairs_saving:.0%} of the pair work skipped)")
        _say(_exact_line(report))
    _say(f"  wrote {', '.join(written)} ({n:,} × {args.k}; {write_s:.2f} s)")
    return 0


# --------------------------------------------------------------------------------------
# embed
# --------------------------------------------------------------------------------------

#: The files `knng embed` writes (the PNG only when matplotlib imports).
EMBED_FILES = ("embedding.npy", "eigenvalues.npy", "knng.json", "embedding.png")
#: knng.manifold's METRICS, EPSILON_RULES and EIGEN_SOLVERS, repeated here because importing that
#: module imports scikit-learn (a second), which building the parser for any command must not
#: pay; tests/test_manifold.py checks that the copies agree.
EMBED_METRICS = ("euclidean", "sqeuclidean", "cosine", "pearson")
EMBED_EPSILON_RULES = ("auto", "self_tuning")
EMBED_EIGEN_SOLVERS = ("auto", "scipy", "torch")


def _epsilon_argument(text: str) -> float | str:
    if text in EMBED_EPSILON_RULES:
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be auto, self_tuning or a number > 0, got {text!r}")
    return value


def _alpha_argument(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be a number in [0, 1], got {text}")
    return value


def _time_argument(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"must be a number ≥ 0, got {text}")
    return value


def _add_embed_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="the points (FILE or FILE.hdf5:DATASET)")
    p.add_argument("-k", "--k", type=_argument_type(_positive_int), required=True, metavar="K",
                   help="neighbours per point in the k-NN graph (required)")
    p.add_argument("--components", type=_argument_type(_positive_int), default=2, metavar="M",
                   help="coordinates ψ₁ … ψ_M (the trivial constant one is left out; default: 2)")
    p.add_argument("--metric", choices=EMBED_METRICS, default=None, metavar="M",
                   help=f"{', '.join(EMBED_METRICS)} (default: euclidean, or what an ann-benchmarks file declares)")
    p.add_argument("--epsilon", type=_argument_type(_epsilon_argument), default="auto", metavar="EPS",
                   help="kernel bandwidth in exp(−d²/ε): auto (Berry–Giannakis–Harlim), self_tuning "
                        "(exp(−d²/σᵢσⱼ), σ the distance to the --sigma-neighbor-th neighbour) or a number "
                        "(default: auto)")
    p.add_argument("--alpha", type=_argument_type(_alpha_argument), default=1.0, metavar="A",
                   help="density normalisation: 0 graph Laplacian, 0.5 Fokker–Planck, 1 Laplace–Beltrami "
                        "(default: 1)")
    p.add_argument("--t", type=_argument_type(_time_argument), default=1.0, metavar="T",
                   help="diffusion time: coordinates λᵗψ (default: 1)")
    p.add_argument("--sigma-neighbor", type=_argument_type(_positive_int), default=7, metavar="J",
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
    p.add_argument("--color-by", type=_argument_type(_positive_int), default=None, metavar="J",
                   help="without --labels, colour the plot by coordinate ψ_J (default: ψ₃, or the last)")
    p.add_argument("-o", "--out", default="knng-embed", metavar="DIR",
                   help="output folder, created if missing (default: knng-embed); locked while the run lasts, "
                        "its results switched in as one set")
    p.add_argument("--overwrite", action="store_true", help="replace results already in DIR")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they are shown when standard error is a terminal)")


def _read_labels(spec: str, n: int) -> np.ndarray:
    """One label per point from a .npy file or a text file (one a line); checked against n."""
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--labels: no file {spec}")
    if path.suffix == ".npy":
        labels = np.load(path, allow_pickle=False).ravel()
    else:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        labels = np.array([line for line in lines if line])
        try:
            labels = labels.astype(np.float64)
        except ValueError:
            pass  # category names
    if labels.shape[0] != n:
        raise CliError(f"--labels {spec} holds {labels.shape[0]:,} labels but DATA has {n:,} points")
    return labels


def _cmd_embed(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from knng.manifold import check_metric

    data = _open(args.data)
    metric = check_metric(_metric_for(args, data))
    n = data.shape[0]
    if args.k > n - 1:
        raise ValueError(f"-k {args.k} must be less than the number of points ({n:,}): each point's neighbours "
                         "are the others")
    if args.components > n - 1:
        raise ValueError(f"--components {args.components} must be less than the number of points ({n:,})")
    if args.color_by is not None and args.color_by > args.components:
        raise CliError(f"--color-by {args.color_by}: there are only {args.components} coordinates")
    labels = _read_labels(args.labels, n) if args.labels is not None else None
    dev, _ = _device_and_budget(args.device, args.memory_budget)
    out = Path(args.out)
    _refuse_existing(out, EMBED_FILES, args.overwrite)
    expected = n * args.components * 8 + (1 << 20)
    with _output_folder(out, args, expected, argv) as folder:
        return _embed_one_process(args, argv, data, metric, dev, folder, labels)


def _embed_one_process(args: argparse.Namespace, argv: Sequence[str], data: _Input, metric: str, dev: Any,
                       folder: OutputFolder, labels: np.ndarray | None) -> int:
    import knng
    from knng.io import json_default
    from knng.manifold import DiffusionMap

    t0 = time.perf_counter()
    # The graph streams DATA from its file; the diffusion map then needs only the graph.
    graph = knng.graph(data.array, args.k, metric=metric, device=args.device, memory_budget=args.memory_budget,
                       progress=_progress(args))
    graph_s = time.perf_counter() - t0
    graph_report = knng.api.last_report()
    dm = DiffusionMap(n_components=args.components, n_neighbors=args.k, metric=metric, epsilon=args.epsilon,
                      alpha=args.alpha, t=args.t, sigma_neighbor=args.sigma_neighbor, eigen_solver=args.eigen_solver,
                      device=args.device, progress=_progress(args)).fit(graph)
    report = dm.report_
    report.seconds["graph"] = graph_s
    n = graph.n_points
    meta = _metadata("embed", argv, {"data": data}, k=args.k, components=args.components, metric=metric,
                     device=str(dev), timings_s=dict(report.seconds), diffusion=report.as_dict(),
                     graph_report=_report_dict(graph_report))
    staging = folder.staging
    np.save(staging / "embedding.npy", dm.embedding_)
    np.save(staging / "eigenvalues.npy", dm.eigenvalues_)
    plot_note = _embed_plot(staging / "embedding.png", dm, labels, args)
    meta["plot"] = plot_note or "embedding.png"
    (staging / "knng.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=json_default) + "\n",
                                       encoding="utf-8")
    out = folder.commit()

    _say(f"knng embed: {n:,} points, d={data.shape[1]}, k={args.k}, metric {metric}: diffusion map, "
         f"{args.components} coordinates")
    eps = "self-tuning σᵢσⱼ" if report.epsilon is None else f"ε = {report.epsilon:.4g} ({report.epsilon_rule})"
    _say(f"  kernel: {eps}, α = {report.alpha:g}, t = {report.t:g}; {report.kernel_entries:,} entries, one "
         "connected component")
    values = ", ".join(f"{v:.6f}" for v in report.eigenvalues[1:args.components + 1])
    _say(f"  eigenvalues λ₁…λ_{args.components}: {values}; spectral gap 1 − λ₁ = {report.spectral_gap:.3g}"
         + (f", gap after λ_{args.components}: {report.eigengap:.3g}" if report.eigengap is not None else ""))
    _say(f"  solver {report.solver}: largest residual {max(report.residuals):.1e}, trivial pair off by "
         f"{report.trivial_eigenvalue_error:.1e}")
    sec = report.seconds
    _say(f"  device {_device_text(dev)}: graph {sec['graph']:.2f} s, kernel {sec['kernel']:.2f} s, eigensolver "
         f"{sec['eigensolver']:.2f} s")
    written = ["embedding.npy", "eigenvalues.npy", "knng.json"] + ([] if plot_note else ["embedding.png"])
    _say(f"  wrote {out / written[0]}, {', '.join(written[1:])}" + (f" (no plot: {plot_note})" if plot_note else ""))
    return 0


def _embed_plot(path: Path, dm: Any, labels: np.ndarray | None, args: argparse.Namespace) -> str | None:
    """Draw the embedding's plot at ``path``; returns why there is none, or None."""
    from knng.plotting import colour_values, embedding_figure, matplotlib_missing

    missing = matplotlib_missing()
    if missing is not None:
        return missing
    names = None
    if labels is not None:
        colour, names = colour_values(labels)
        label = f"labels ({Path(args.labels).name})"
    else:
        j = args.color_by or min(3, dm.embedding_.shape[1])
        colour, label = dm.embedding_[:, j - 1], f"ψ{j}"
    title = (f"knng embed {Path(args.data).name}: diffusion map, k = {args.k}, α = {args.alpha:g}, "
             f"t = {args.t:g}")
    fig = embedding_figure(dm.embedding_, colour, title=title, colour_label=label, names=names)
    fig.savefig(path, format="png", dpi=110)  # in the staging folder: the commit makes it atomic
    return None


# --------------------------------------------------------------------------------------
# info
# --------------------------------------------------------------------------------------


def _make_plan(*, n_queries: int, n_corpus: int, d: int, k: int, metric: str, dev: Any, budget: int,
               memory_budget: str | None, host_memory: str | None, symmetric: bool) -> Any:
    """The engine's plan for this shape: the very planner ``knng.search`` / ``knng.graph`` call."""
    from knng.engine.plan import (
        budget_source, host_budget_source, make_graph_plan, make_search_plan, resolve_host_budget,
    )

    hosts = dict(source=budget_source(memory_budget, dev), host_budget=resolve_host_budget(host_memory),
                 host_source=host_budget_source(host_memory))
    if symmetric:
        return make_graph_plan(n=n_corpus, d=d, k=k, metric=metric, device=dev, budget=budget, include_self=False,
                               **hosts)
    return make_search_plan(n_queries=n_queries, n_corpus=n_corpus, d=d, k=k, metric=metric, device=dev,
                            budget=budget, **hosts)


def _plan_lines(title: str, plan: Any) -> list[str]:
    """A plan of :mod:`knng.engine.plan` in words."""
    lines = [title,
             f"  screen          {plan.screen_precision} matrix products (unit roundoff {plan.unit_roundoff:.3g}); "
             f"stores of {plan.capacity} candidates per row; exact float64 finish",
             f"  thresholds      {plan.thresholds}"]
    if plan.operation == "graph":
        lines.append(f"  symmetry        {plan.parts:,} part{'s' if plan.parts != 1 else ''} of ≤{plan.part_size:,} "
                     f"points: {plan.blocks:,} of {plan.parts * plan.parts:,} blocks computed "
                     f"({1 - plan.blocks / (plan.parts * plan.parts):.0%} of the pair work skipped)")
        lines.append(f"  score blocks    {plan.part_size:,} × {plan.part_size:,}")
        lines.append("  frames          " + (
            "principal: parts are slabs along the first principal direction, each block centred on its "
            "row part; blocks (and block edges) no point can need are skipped" if plan.frames == "principal"
            else "global: one centre, every block computed"))
    else:
        lines.append(f"  score blocks    {plan.query_rows:,} queries × {plan.corpus_cols:,} corpus vectors")
    lines.append("  data            " + ("resident on the device (prepared once)" if plan.corpus_resident
                                       else "streamed: prepared tile by tile")
                 + f"; files read {plan.read_rows:,} rows at a time, two reads ahead")
    if plan.operation == "graph":
        lines.append("  lists           " + {
            "device": "every point's candidate store on the device",
            "host": f"in pinned host memory; the graph runs in {plan.bands} bands of {plan.band_parts} parts, "
                    "two bands' stores on the device at a time",
            "disk": f"in a memory-mapped file (the work area); the graph runs in {plan.bands} bands of "
                    f"{plan.band_parts} parts, two bands' stores on the device at a time"}[plan.lists])
    lines.append(f"  memory          ~{_fmt_bytes(plan.bytes_expected)} expected on the device; "
                 f"~{_fmt_bytes(plan.host_bytes_expected)} of host memory (budget {_fmt_bytes(plan.host_budget)}, "
                 f"{plan.host_budget_source})")
    out_bytes = plan.n_queries * plan.k * (8 + 4)
    lines.append(f"  outputs         {plan.n_queries:,} × {plan.k} neighbours: indices int64 + distances float32 "
                 f"= {_fmt_bytes(out_bytes)}")
    return lines


def _access_text(info: dict[str, Any]) -> str:
    """How knng reads the file, for ``knng info``."""
    if not all(info["shape"]):
        return "empty: no vectors to read"
    if info["memory_mapped"]:
        return "memory-mapped: rows are read on demand"
    if info["format"] in _HDF5:
        return "read lazily in row blocks (HDF5)"
    return "read into memory"


def _cmd_info(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from knng.io import describe

    info = describe(args.file)
    shape = tuple(info["shape"])
    lines = [
        f"file            {info['path']}",
        f"format          {info['format']}: {info['description']}",
        f"file size       {_fmt_bytes(info['file_bytes'])} ({info['file_bytes']:,} bytes)",
    ]
    if info["format"] in _HDF5:
        lines.append(f"dataset         {info['dataset']}")
    lines += [
        f"shape           {shape} ({_shape_text(shape)})",
        f"dtype           {info['dtype']}, {info['bytes_per_vector']:,} bytes per vector",
        "access          " + _access_text(info),
    ]
    if info["format"] in _HDF5:
        lines.append("datasets:")
        for name, ds in sorted(info["datasets"].items()):
            lines.append(f"  {name:<14}{tuple(ds['shape'])} {ds['dtype']}")
        distance = info.get("distance")
        lines.append(f"distance        {distance!r}" + (
            f" → knng metric {ANN_METRICS[str(distance).lower()]}"
            if distance is not None and str(distance).lower() in ANN_METRICS else
            (" (not supported by knng: pass --metric)" if distance is not None else "")))
    if info["dtype"] not in _NATIVE_DTYPES:
        lines.append("note            knng converts these values to float64 as it reads them (exact)")

    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        _say("\n".join(lines) + "\n\nknng needs a 2-D array of at least one vector; nothing to plan.")
        return 0
    if args.k < 1:
        raise ValueError(f"k must be at least 1, got {args.k}")
    dev, _ = _device_and_budget(args.device, args.memory_budget)
    from knng.engine.plan import budget_source, resolve_budget

    budget = resolve_budget(args.memory_budget, dev)
    n, d = shape
    metric = args.metric or "euclidean"
    common = dict(d=d, metric=metric, dev=dev, budget=budget, memory_budget=args.memory_budget,
                  host_memory=args.host_memory)
    plans = {}
    if n >= 2:
        plans["plan"] = _make_plan(n_queries=n, n_corpus=n, k=min(args.k, n - 1), symmetric=True, **common)
    if (info["format"] in _HDF5 and not _explicit_dataset(args.file)
            and {"train", "test"} <= set(info["datasets"])):
        test = tuple(info["datasets"]["test"]["shape"])
        if len(test) == 2 and test[1] == d:
            plans["search_plan"] = _make_plan(n_queries=test[0], n_corpus=n, k=min(args.k, n), symmetric=False,
                                              **common)
    if args.json:
        from knng.io import json_default

        # "plan" is what `knng graph FILE -k K` records in knng.json on this machine.
        print(json.dumps({"file": info, **{key: p.as_dict() for key, p in plans.items()}}, default=json_default,
                         indent=1))
        return 0
    _say("\n".join(lines))
    out = ["", "what knng would do:",
           f"  device          {_device_text(dev)}" + ("  (--device auto)" if args.device == "auto" else ""),
           f"  memory budget   {_fmt_bytes(budget)} (" + ("from --memory-budget" if args.memory_budget else
                                                         budget_source(None, dev)) + ")"]
    first = next(iter(plans.values()), None)
    if first is not None:
        if first.budget < budget:
            out[-1] += f"; {_fmt_bytes(first.budget)} planned (the host budget's share)"
        out.append(f"  host memory     {_fmt_bytes(first.host_budget)} (" + (
            "from --host-memory" if args.host_memory else first.host_budget_source) + ")")
    if "plan" in plans:
        out += _plan_lines(f"k-NN graph, k={plans['plan'].k}:", plans["plan"])
    else:
        out.append("  (a graph needs at least 2 vectors)")
    if "search_plan" in plans:
        out += _plan_lines(f"search of `test` ({plans['search_plan'].n_queries:,} queries) in `train`, "
                           f"k={plans['search_plan'].k}:", plans["search_plan"])
    _say("\n".join(out))
    return 0


# --------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    _device_and_budget(args.device, None)  # a bad --device fails here, before any work
    if args.embed:
        from knng.demo_embed import run_embed_demo

        return 0 if run_embed_demo(out_dir=args.out, device=args.device)["passed"] else 1
    from knng.demo import run_demo

    run_demo(out_dir=args.out, device=args.device, quick=args.quick)
    return 0


# --------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------


def _cmd_bench_usage(args: argparse.Namespace, argv: Sequence[str]) -> int:
    args.bench_parser.print_help(sys.stderr)
    return EXIT_USAGE


def _cmd_bench_select(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from knng.benchmarks.select import render_markdown, run

    results = run(args.experiments, device=args.device, trials=args.trials, quick=args.quick, out_dir=args.out,
                  algorithms=args.algorithms, progress=not args.no_progress, seed=args.seed,
                  cell_budget_s=args.cell_budget, hard_cap_s=args.hard_cap,
                  command="knng " + " ".join(shlex.quote(a) for a in argv))
    _say(render_markdown(results))
    out = Path(args.out)
    _say(f"wrote {', '.join(str(out / name) for name in ('select.json', 'select.md', *results['plots'].values()))}")
    return 0


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the ``knng`` command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors (argparse printed them)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _LAUNCH_ARGV[0] = argv
    prog = f"knng[rank {os.environ['RANK']}]" if "RANK" in os.environ and _is_rank() else "knng"
    try:
        return int(args.handler(args, argv))
    except (CliError, *INPUT_ERRORS) as exc:
        print(f"{prog}: error: {_message(exc)}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except _distributed_error() as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        if _is_rank():
            # The process group is broken: leave now rather than hang in its teardown.
            sys.stdout.flush()
            os._exit(1)
        return 1
    except KeyboardInterrupt:
        print("knng: interrupted (results are written only at the end, so none were)"
              if args.command in ("search", "graph") else "knng: interrupted", file=sys.stderr, flush=True)
        return 130


def _distributed_error() -> type[BaseException]:
    from knng.distributed.comm import DistributedError

    return DistributedError


def _message(exc: BaseException) -> str:
    """A one-line message; OSErrors get their file name, which str() alone may lack."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc)
