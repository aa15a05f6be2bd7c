"""k-selection benchmarks: the experiments of Komarov, Dashti & D'Souza (2014) and issue 3's bar.

The paper ("Fast k-NNG construction with GPU-based quick multi-select", PLoS ONE 9(5): e92409)
times selection alone on blocks of uniformly random float32 values, Q rows (queries) × n columns
(corpus points). The experiments, by the names ``bench/bench_select.py --experiments`` takes:

``table2``
    Q = 8192, n = 2¹³ … 2¹⁶, k = 64 … 512: mean time and % std, next to the paper's Table 2.
``speedup``
    Speed-up over the one-thread-per-row insertion sort of Garcia et al. (``"insertion"``):
    (a) Q = 8192, n = 2¹³ … 2¹⁶ (paper Fig. 5); (b) n = 65 536, Q = 2¹³ … 2¹⁶ (Fig. 6).
``product``
    n · Q = 2²⁷ fixed, log₂(n/Q) = −3, −1, …, 19 (odd, so that n and Q stay powers of two),
    k = 2 … 512 (k ≤ n): speed-up over the per-row truncated bitonic sort (``"bitonic"``; the
    paper's Fig. 7 compares with Sismanis et al.'s implementation of it).
``fixed-n``
    n = 2²⁰, Q = 8 … 256: time per query (paper Fig. 9).
``bar``
    8192 × 65 536, k = 64 … 2048, sorted output: ``"qms"`` against ``torch.topk`` — identical
    values and indices, effective bandwidth, and the floor set by the device's copy bandwidth.

How a cell (algorithm, rows, cols, k) is measured: two warm-up calls (the first pays any
compilation; the second, timed by the wall clock, estimates one call), then ``trials`` calls
timed with CUDA events (``time.perf_counter`` on a CPU, which is for smoke runs only). A cell
whose calls would overrun its time budget gets fewer trials (at least one); a call over the hard
cap is recorded on its own and the algorithm's remaining cells in that experiment are skipped.
Blocks smaller than four times the L2 cache are generated several times over and the calls
alternate between the copies, so that repeated calls do not time the cache. Blocks over 40 % of
free memory are skipped, out-of-memory errors are recorded per cell, and algorithms that are not
registered or whose GPU backend is unavailable are reported as skipped.

:func:`run` runs the chosen experiments and, after each one, writes ``select.json``,
``select.md`` and a PNG per experiment (when matplotlib imports) atomically into its output
folder, so that a long run keeps what it has finished.

This harness lives outside the installed package (``bench/``) and uses knng's public names only:
``knng.select.available``/``get``, ``knng.io.atomic_write``/``json_default`` and
``knng.__version__`` (``tests/test_layering.py`` checks it). ``bench/bench_select.py`` is its
command line.
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
import numbers
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import knng
from knng.io import atomic_write, json_default
from knng.select import available, get

__all__ = [
    "EXPERIMENTS", "Algorithm", "Bench", "Shape", "bar", "buffer_count", "check_trials", "fixed_n",
    "fixed_product", "load_algorithm", "measure_copy_bandwidth", "parse_algorithms", "parse_experiments",
    "render_markdown", "run", "speedup_insertion", "table2", "time_calls", "timing_stats", "write_outputs",
]

#: Experiment names, in the order ``all`` runs them.
EXPERIMENTS = ("table2", "speedup", "product", "fixed-n", "bar")
#: Layout version of ``select.json``.
SCHEMA = "knng.bench.select/1"
#: Peer libraries' block k-selects: name → (module, function), both with pylibraft's signature.
PEERS: dict[str, tuple[str, str]] = {"cuvs": ("cuvs.matrix", "select_k"), "raft": ("pylibraft.matrix", "select_k")}
#: Algorithms compared in every paper experiment: the quick multi-select (knng's single pass, sampled first pivot, one
#: block per row, one warp per row), torch.topk, and the peers where they import.
COMPARED = ("qms", "qms_sampled", "qms_block", "qms_warp", "topk", *PEERS)
DEFAULT_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "table2": COMPARED,
    "speedup": ("insertion", *COMPARED),
    "product": ("bitonic", *COMPARED),
    "fixed-n": COMPARED,
    "bar": ("qms", "topk", *PEERS),
}
#: The algorithm each experiment measures the others against; always run, even when not asked for.
REFERENCES = {"speedup": "insertion", "product": "bitonic", "bar": "topk"}

TITLES = {
    "table2": "Table 2: execution time and its variation",
    "speedup": "Speed-up over the insertion-sort baseline (Garcia et al.)",
    "product": "Fixed n · Q: speed-up over the truncated bitonic sort",
    "fixed-n": "Fixed n = 2^20: time per query",
    "bar": "Issue 3's bar: qms against torch.topk, sorted output",
}
#: Table 2 of the paper, verbatim (n → k → (mean, % std)); the paper states no unit.
PAPER_TABLE2: dict[int, dict[int, tuple[str, str]]] = {
    2**13: {64: ("138.03", "0.37"), 128: ("144.4", "0.27"), 256: ("151.36", "0.24"), 512: ("159.35", "0.31")},
    2**14: {64: ("163.55", "0.33"), 128: ("170.04", "0.311"), 256: ("177.27", "0.25"), 512: ("185.91", "0.27")},
    2**15: {64: ("208.83", "0.29"), 128: ("215.3", "0.37"), 256: ("222.97", "0.28"), 512: ("232.10", "0.245")},
    2**16: {64: ("288.44", "0.29"), 128: ("294.85", "0.28"), 256: ("302.34", "0.27"), 512: ("311.8", "0.26")},
}
PAPER_TABLE2_ROWS = 8192
PAPER_SPEEDUP = {
    "a": "Fig. 5: about 130× at k = 512, n = 2^16 (Q = 8192); flat in n except at k = 512.",
    "b": "Fig. 6: about 80× at Q = 2^16, k = 512 (n = 65536); the speed-up falls as Q grows.",
}
PAPER_CLAIMS = {
    "table2": "Table 2: Q = 2^13, mean and % std over about 1000 trials on a Tesla C2050; the paper "
              "states no unit and reports % std below 0.5 % everywhere.",
    "speedup": f"{PAPER_SPEEDUP['a']} {PAPER_SPEEDUP['b']}",
    "product": "Fig. 7 (speed-up over Sismanis et al.'s truncated bitonic sort, n · Q = 2^27, 2 ≤ k ≤ 512): "
               "peaks at log2(n/Q) = 7, flat to 11, falls from 13, where Q < 128.",
    "fixed-n": "Fig. 9 (n = 2^20, Q = 8 … 256): the time per query falls with Q and flattens at Q = 128.",
    "bar": "No paper value: issue 3's acceptance test (identical sorted output to torch.topk, and the "
           "time against the copy-bandwidth floor).",
}

FULL_GRIDS: dict[str, dict[str, Any]] = {
    "table2": {"rows": 8192, "cols": (2**13, 2**14, 2**15, 2**16), "k": (64, 128, 256, 512)},
    "speedup": {"rows": 8192, "cols": (2**13, 2**14, 2**15, 2**16), "fixed_cols": 65536,
                "sweep_rows": (2**13, 2**14, 2**15, 2**16), "k": (64, 128, 256, 512)},
    "product": {"log2_product": 27, "log2_ratios": tuple(range(-3, 20, 2)),
                "k": (2, 4, 8, 16, 32, 64, 128, 256, 512)},
    "fixed-n": {"cols": 2**20, "rows": (8, 16, 32, 64, 128, 256), "k": (8, 32, 128, 512)},
    "bar": {"rows": 8192, "cols": 65536, "k": (64, 256, 512, 1024, 2048)},
}
#: Tiny grids (rows ≤ 64, cols ≤ 2048, k ≤ 32), two points per axis, for smoke runs on a CPU.
QUICK_GRIDS: dict[str, dict[str, Any]] = {
    "table2": {"rows": 64, "cols": (256, 2048), "k": (4, 32)},
    "speedup": {"rows": 64, "cols": (256, 2048), "fixed_cols": 2048, "sweep_rows": (8, 64), "k": (4, 32)},
    "product": {"log2_product": 15, "log2_ratios": (3, 7), "k": (2, 32)},
    "fixed-n": {"cols": 2048, "rows": (8, 64), "k": (4, 32)},
    "bar": {"rows": 64, "cols": 2048, "k": (4, 32)},
}

DEFAULT_TRIALS = 20
DEFAULT_OUT = "bench-results/select"
#: Seconds of timed calls one cell may take, and the longest single call, by ``quick``.
CELL_BUDGET_S = {False: 30.0, True: 0.2}
HARD_CAP_S = {False: 20.0, True: 2.0}
#: A cell's input copies may take at most this share of free memory.
MEMORY_FRACTION = 0.4
#: Inputs are replicated until they span this many L2 caches, with at most MAX_BUFFERS copies.
L2_MULTIPLE = 4
MAX_BUFFERS = 8
#: Size and repeats of the copy that measures the memory bandwidth, by ``quick``.
COPY_BYTES = {False: 2**30, True: 16 * 2**20}
COPY_TRIALS = 10
#: Row keys every cell has (None where they do not apply).
ROW_KEYS = ("experiment", "algorithm", "rows", "cols", "k", "status", "reason", "buffers", "timer",
            "trials_requested", "trials", "mean_ms", "std_pct", "median_ms", "min_ms", "max_ms")


# --------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------


def _names_of(value: str | Iterable[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(item).strip() for item in items if str(item).strip()]


def parse_experiments(value: str | Iterable[str]) -> list[str]:
    """Experiment names from ``"table2,bar"``, ``"all"`` or a sequence of names.

    Raises
    ------
    ValueError
        If no name is given or a name is unknown (the message names ``experiments``).
    """
    names = _names_of(value)
    choices = f"choose from {', '.join(EXPERIMENTS)} or all"
    if not names:
        raise ValueError(f"experiments must name at least one experiment ({choices}), got {value!r}")
    unknown = [name for name in names if name not in (*EXPERIMENTS, "all")]
    if unknown:
        raise ValueError(f"experiments: unknown experiment {unknown[0]!r}; {choices}")
    return list(EXPERIMENTS) if "all" in names else list(dict.fromkeys(names))


def parse_algorithms(value: str | Iterable[str]) -> list[str]:
    """Algorithm names from ``"qms,topk"`` or a sequence; names that are not registered are
    kept (they are reported as skipped), an empty list is refused."""
    names = _names_of(value)
    if not names:
        raise ValueError(f"algorithms must name at least one algorithm, got {value!r}")
    return list(dict.fromkeys(names))


def check_trials(trials: Any) -> int:
    """``trials`` as an int ≥ 1, or a ValueError naming it."""
    if isinstance(trials, bool) or not isinstance(trials, numbers.Integral) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    return int(trials)


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def timing_stats(times_s: Sequence[float]) -> dict[str, float | int]:
    """Summarise per-call times given in seconds.

    Parameters
    ----------
    times_s : sequence of float
        One wall or event time per call, in seconds.

    Returns
    -------
    dict
        ``mean_ms``, ``std_pct`` (100 · sample standard deviation / mean, the paper's "% std";
        0 for a single call), ``median_ms``, ``min_ms``, ``max_ms`` and ``trials``.
    """
    if not times_s:
        raise ValueError("times_s must hold at least one time")
    ms = [1e3 * t for t in times_s]
    mean = statistics.fmean(ms)
    std = statistics.stdev(ms) if len(ms) > 1 else 0.0
    return {"mean_ms": mean, "std_pct": 100.0 * std / mean if mean > 0 else 0.0,
            "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "trials": len(ms)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timer_name(device: torch.device) -> str:
    return "cuda events" if device.type == "cuda" else "perf_counter"


def wall_time(call: Callable[[torch.Tensor], Any], x: torch.Tensor, device: torch.device) -> float:
    """Seconds one synchronised ``call(x)`` takes by the wall clock."""
    _sync(device)
    start = time.perf_counter()
    call(x)
    _sync(device)
    return time.perf_counter() - start


def time_calls(call: Callable[[torch.Tensor], Any], inputs: Sequence[torch.Tensor], trials: int,
               device: torch.device) -> list[float]:
    """Seconds per call of ``trials`` calls, cycling through ``inputs``.

    On a GPU each call sits between two CUDA events on the device's current stream and the
    device is synchronised once, after the last call; on a CPU each call is timed with
    ``time.perf_counter``.
    """
    if device.type != "cuda":
        times = []
        for i in range(trials):
            start = time.perf_counter()
            call(inputs[i % len(inputs)])
            times.append(time.perf_counter() - start)
        return times
    stream = torch.cuda.current_stream(device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    _sync(device)
    for i in range(trials):
        starts[i].record(stream)
        call(inputs[i % len(inputs)])
        ends[i].record(stream)
    _sync(device)
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]


# --------------------------------------------------------------------------------------
# Memory and bandwidth
# --------------------------------------------------------------------------------------


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` (the current GPU, else the CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; a bad name
    is a ValueError naming ``device``."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} asks for a GPU but torch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a device out-of-memory error (recorded per cell, the run goes on)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def available_ram() -> int:
    """Bytes of host memory available now (``MemAvailable``), or a guess of 8 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30


def free_memory_bytes(device: torch.device) -> int:
    """Free memory on ``device`` (after returning torch's cached blocks), or available RAM."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(device)[0])
    return available_ram()


def l2_cache_bytes(device: torch.device) -> int | None:
    """The GPU's L2 cache size, or None (a CPU, or a torch that does not report it)."""
    if device.type != "cuda":
        return None
    size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None)
    return int(size) if size else None


def buffer_count(block_bytes: int, l2_bytes: int | None) -> int:
    """How many copies of a block to alternate between so that calls do not time the cache.

    One when the block is at least ``L2_MULTIPLE`` L2 caches; otherwise enough copies to span
    that much (at least 2, at most ``MAX_BUFFERS``); 2 when the cache size is unknown.
    """
    if l2_bytes is None:
        return 2
    if block_bytes >= L2_MULTIPLE * l2_bytes:
        return 1
    return min(MAX_BUFFERS, max(2, math.ceil(L2_MULTIPLE * l2_bytes / block_bytes)))


def measure_copy_bandwidth(device: torch.device, nbytes: int, trials: int = COPY_TRIALS) -> dict[str, Any]:
    """Time ``dst.copy_(src)`` of ``nbytes`` bytes on ``device``.

    Returns
    -------
    dict
        ``read_plus_write_bytes_per_s`` counts the bytes read *and* the bytes written
        (2 · ``nbytes`` per copy) per median copy time; ``read_bytes_per_s`` is half of it.
    """
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    times = time_calls(dst.copy_, [src], trials, device)
    median_s = statistics.median(times)
    return {"bytes_per_copy": nbytes, "trials": trials, "median_ms": 1e3 * median_s,
            "read_plus_write_bytes_per_s": 2 * nbytes / median_s, "read_bytes_per_s": nbytes / median_s,
            "counted": "bytes read + bytes written per second of a device-to-device copy (2 × bytes_per_copy "
                       "per median copy time); read_bytes_per_s is half of it"}


# --------------------------------------------------------------------------------------
# Algorithms
# --------------------------------------------------------------------------------------


SelectCall = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Algorithm:
    """A selection to time: ``fn(scores, k, *, sorted=False) -> (values, indices)``, or why not.

    ``reason`` is set when the algorithm cannot be timed (not registered, not importable, GPU
    backend unavailable); ``sorts`` is False for peers, which are not asked for sorted output.
    """

    name: str
    fn: SelectCall | None
    source: str
    reason: str | None = None
    sorts: bool = True


def _raft_style(select_k: Callable[..., Any]) -> SelectCall:
    """Wrap a pylibraft-style ``select_k`` (CUDA-array-interface inputs and outputs) in the
    registry's signature; each call waits for the library's stream before returning."""
    from pylibraft.common import DeviceResources

    handle = DeviceResources()

    def select(scores: torch.Tensor, k: int, *, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        # ``sorted`` completes the registry's signature; peers are not asked to sort (sorts=False).
        rows = scores.shape[0]
        values = torch.empty((rows, k), dtype=torch.float32, device=scores.device)
        indices = torch.empty((rows, k), dtype=torch.int64, device=scores.device)
        select_k(scores, k, distances=values, indices=indices, select_min=True, handle=handle)
        handle.sync()
        return values, indices

    return select


def _load_peer(name: str, device: torch.device) -> Algorithm:
    module_name, attr = PEERS[name]
    source = f"{module_name}.{attr}"
    if device.type != "cuda":
        return Algorithm(name, None, source, reason="a GPU library: not timed on a CPU", sorts=False)
    try:
        fn = _raft_style(getattr(importlib.import_module(module_name), attr))
    except ImportError as exc:
        return Algorithm(name, None, source, reason=f"not present ({exc})", sorts=False)
    except AttributeError:
        return Algorithm(name, None, source, reason=f"not present ({module_name} has no {attr})", sorts=False)
    return Algorithm(name, fn, source, sorts=False)


def load_algorithm(name: str, device: torch.device) -> Algorithm:
    """The algorithm ``name``: a peer library's select (``PEERS``) or a ``knng.select`` entry."""
    if name in PEERS:
        return _load_peer(name, device)
    registered = [n for n in available() if n != "auto"]
    if name not in registered:
        return Algorithm(name, None, "knng.select",
                         reason=f"not registered in knng.select (registered: {', '.join(registered)})")
    return Algorithm(name, get(name), "knng.select")


def faiss_status() -> str:
    """Whether FAISS imports; it has no Python entry point for a standalone block k-select."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return "not present"
    return ("present, but FAISS has no Python entry point for a standalone block k-select "
            "(its GPU k-selection runs only inside its searches, such as knn_gpu): not timed")


def _backend_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the algorithm cannot run here at all (rather than failed on a cell)."""
    text = str(exc).lower()
    return isinstance(exc, NotImplementedError) or "unavailable" in text or "not available" in text


# --------------------------------------------------------------------------------------
# Cells and sweeps
# --------------------------------------------------------------------------------------


@dataclass
class Shape:
    """A block of ``rows × cols`` timed at every k in ``ks``; ``extra`` goes into its rows."""

    rows: int
    cols: int
    ks: tuple[int, ...]
    extra: dict[str, Any] = field(default_factory=dict)


#: ``check(algorithm, scores, k) -> fields``: run once per timed cell, on the first input copy.
Check = Callable[[Algorithm, torch.Tensor, int], dict[str, Any]]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@dataclass
class Bench:
    """Settings and state of one benchmark run: the device, the trial and time limits, the
    algorithms resolved so far (an algorithm found unavailable stays skipped for the run) and
    the copy bandwidth, measured once."""

    device: torch.device
    trials: int = DEFAULT_TRIALS
    quick: bool = False
    seed: int = 0
    cell_budget_s: float = CELL_BUDGET_S[False]
    hard_cap_s: float = HARD_CAP_S[False]
    progress: bool = False
    algorithms: dict[str, Algorithm] = field(default_factory=dict)
    copy_bandwidth: dict[str, Any] | None = None
    l2_bytes: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.l2_bytes = l2_cache_bytes(self.device)

    def grid(self, experiment: str) -> dict[str, Any]:
        """The shapes and ks of ``experiment`` (the tiny grid when ``quick``)."""
        return (QUICK_GRIDS if self.quick else FULL_GRIDS)[experiment]

    def algorithm(self, name: str) -> Algorithm:
        """The algorithm ``name``, resolved once per run."""
        if name not in self.algorithms:
            self.algorithms[name] = load_algorithm(name, self.device)
        return self.algorithms[name]

    def copy(self) -> dict[str, Any]:
        """The device's copy bandwidth (:func:`measure_copy_bandwidth`), measured on first use."""
        if self.copy_bandwidth is None:
            nbytes = min(COPY_BYTES[self.quick], int(MEMORY_FRACTION * free_memory_bytes(self.device) / 2))
            self.copy_bandwidth = measure_copy_bandwidth(self.device, nbytes)
        return self.copy_bandwidth

    def sweep(self, experiment: str, shapes: Sequence[Shape], names: Sequence[str], *, sort: bool,
              check: Check | None = None) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Time every algorithm of ``names`` on every shape and k.

        Returns the rows (one per cell, skipped cells included) and ``{name: reason}`` for the
        algorithms that were not timed.
        """
        rows: list[dict[str, Any]] = []
        capped: dict[str, str] = {}
        for shape in shapes:
            inputs, no_inputs = self._inputs(shape.rows, shape.cols)
            for name in names:
                alg = self.algorithm(name)
                for k in shape.ks:
                    if alg.reason is not None:
                        break
                    row: dict[str, Any] = {key: None for key in ROW_KEYS}
                    row.update(experiment=experiment, algorithm=name, rows=shape.rows, cols=shape.cols, k=k,
                               **shape.extra)
                    if no_inputs or name in capped:
                        row.update(status="skipped", reason=no_inputs or capped[name])
                    else:
                        row.update(buffers=len(inputs), **self._cell(alg, inputs, k, sort, check))
                        if row["status"] == "over_cap":
                            capped[name] = (f"skipped: a call on {shape.rows}×{shape.cols}, k={k} took "
                                            f"{row['mean_ms'] / 1e3:.1f} s, over the {self.hard_cap_s:g} s hard cap")
                    rows.append(row)
                    self._report(row)
            del inputs
        skipped = {name: self.algorithms[name].reason for name in names if self.algorithms[name].reason}
        return rows, skipped

    def _inputs(self, rows: int, cols: int) -> tuple[list[torch.Tensor], str | None]:
        """Seeded uniform float32 copies of a ``rows × cols`` block, or why there are none."""
        block = 4 * rows * cols
        free = free_memory_bytes(self.device)
        fit = int(MEMORY_FRACTION * free) // block
        if fit < 1:
            return [], (f"the {_fmt_bytes(block)} block exceeds {MEMORY_FRACTION:.0%} of free memory "
                        f"({_fmt_bytes(free)})")
        gen = torch.Generator(device=self.device).manual_seed(self.seed)
        try:
            return [torch.rand((rows, cols), generator=gen, device=self.device)
                    for _ in range(min(fit, buffer_count(block, self.l2_bytes)))], None
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            return [], f"out of memory generating the {_fmt_bytes(block)} inputs"

    def _cell(self, alg: Algorithm, inputs: Sequence[torch.Tensor], k: int, sort: bool,
              check: Check | None) -> dict[str, Any]:
        """Warm up, then time one (algorithm, shape, k) cell within its budget."""
        def call(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return alg.fn(x, k, sorted=sort)

        try:
            estimate = wall_time(call, inputs[0], self.device)  # pays any compilation
            if estimate <= self.hard_cap_s:
                estimate = wall_time(call, inputs[-1], self.device)
            if estimate > self.hard_cap_s:
                return {"status": "over_cap", "timer": "wall clock, one call", "trials_requested": self.trials,
                        **timing_stats([estimate]),
                        "reason": f"one call took {estimate:.1f} s, over the {self.hard_cap_s:g} s hard cap"}
            trials = max(1, min(self.trials, int(self.cell_budget_s / max(estimate, 1e-9))))
            out = {"status": "ok", "timer": _timer_name(self.device), "trials_requested": self.trials,
                   **timing_stats(time_calls(call, inputs, trials, self.device))}
            if trials < self.trials:
                out["reason"] = (f"trials cut to {trials}: one call takes about {estimate:.3g} s and the cell "
                                 f"budget is {self.cell_budget_s:g} s")
            if check is not None:
                out.update(check(alg, inputs[0], k))
            return out
        except (RuntimeError, ValueError) as exc:
            return self._failure(alg, exc)

    def _failure(self, alg: Algorithm, exc: Exception) -> dict[str, Any]:
        """The row fields for a failed cell; an unavailable backend skips the algorithm for the run."""
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if is_out_of_memory(exc):
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return {"status": "oom", "reason": message}
        if _backend_unavailable(exc):
            alg.reason = f"unavailable here ({message})"
            return {"status": "skipped", "reason": alg.reason}
        return {"status": "error", "reason": message}

    def _report(self, row: dict[str, Any]) -> None:
        if not self.progress:
            return
        where = f"[select {row['experiment']}] {row['algorithm']} {row['rows']}×{row['cols']} k={row['k']}"
        if row["status"] == "ok":
            what = f"{row['mean_ms']:.4g} ms ± {_pct(row['std_pct'])} % ({row['trials']} trials)"
        else:
            what = f"{row['status']}: {row['reason']}"
        print(f"{where}: {what}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Experiments
# --------------------------------------------------------------------------------------


def _algorithm_names(experiment: str, algorithms: Sequence[str] | None) -> list[str]:
    """The algorithms to run: the defaults or the caller's, with the experiment's reference first."""
    chosen = list(DEFAULT_ALGORITHMS[experiment] if algorithms is None else algorithms)
    reference = REFERENCES.get(experiment)
    if reference is not None and reference not in chosen:
        chosen.insert(0, reference)
    return list(dict.fromkeys(chosen))


def _experiment(bench: Bench, name: str, shapes: Sequence[Shape], algorithms: Sequence[str] | None, *,
                sort: bool, check: Check | None = None) -> dict[str, Any]:
    names = _algorithm_names(name, algorithms)
    rows, skipped = bench.sweep(name, shapes, names, sort=sort, check=check)
    return {"name": name, "title": TITLES[name], "paper": PAPER_CLAIMS[name], "sorted": sort,
            "reference": REFERENCES.get(name), "algorithms": names, "skipped_algorithms": skipped,
            "grid": bench.grid(name), "rows": rows}


def _add_speedups(rows: list[dict[str, Any]], reference: str) -> None:
    """``speedup`` = the reference's mean time / the row's, on the same sweep, shape and k."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return r.get("sweep"), r["rows"], r["cols"], r["k"]

    base = {key(r): r["mean_ms"] for r in rows if r["algorithm"] == reference and r["mean_ms"] is not None}
    for r in rows:
        b = base.get(key(r))
        r["speedup"] = b / r["mean_ms"] if b is not None and r["mean_ms"] else None


def table2(bench: Bench, algorithms: Sequence[str] | None = None) -> dict[str, Any]:
    """Q = 8192 rows, n = 2¹³ … 2¹⁶, k = 64 … 512: mean time and % std (paper Table 2)."""
    g = bench.grid("table2")
    return _experiment(bench, "table2", [Shape(g["rows"], n, g["k"]) for n in g["cols"]], algorithms, sort=False)


def speedup_insertion(bench: Bench, algorithms: Sequence[str] | None = None) -> dict[str, Any]:
    """Speed-up over ``"insertion"``: (a) Q = 8192, n swept (Fig. 5); (b) n = 65536, Q swept (Fig. 6).

    Rows carry ``sweep`` ("a" or "b") and ``speedup`` (None where either time is missing). The
    shape both sweeps share (8192 × 65536) is timed once and its rows appear in both.
    """
    g = bench.grid("speedup")
    shared = g["fixed_cols"] in g["cols"]
    shapes = ([Shape(g["rows"], n, g["k"], {"sweep": "a"}) for n in g["cols"]]
              + [Shape(q, g["fixed_cols"], g["k"], {"sweep": "b"}) for q in g["sweep_rows"]
                 if not (shared and q == g["rows"])])
    result = _experiment(bench, "speedup", shapes, algorithms, sort=False)
    result["rows"] += [{**r, "sweep": "b"} for r in result["rows"]
                       if shared and r["sweep"] == "a" and r["cols"] == g["fixed_cols"]]
    _add_speedups(result["rows"], REFERENCES["speedup"])
    return result


def fixed_product(bench: Bench, algorithms: Sequence[str] | None = None) -> dict[str, Any]:
    """n · Q fixed (2²⁷), log₂(n/Q) swept, k = 2 … 512 with k ≤ n (paper Fig. 7).

    Rows carry ``log2_ratio`` and ``speedup`` over ``"bitonic"``.
    """
    g = bench.grid("product")
    shapes = []
    for ratio in g["log2_ratios"]:
        log_n = (g["log2_product"] + ratio) // 2
        n, q = 2**log_n, 2 ** (g["log2_product"] - log_n)
        shapes.append(Shape(q, n, tuple(k for k in g["k"] if k <= n), {"log2_ratio": ratio}))
    result = _experiment(bench, "product", shapes, algorithms, sort=False)
    _add_speedups(result["rows"], REFERENCES["product"])
    return result


def fixed_n(bench: Bench, algorithms: Sequence[str] | None = None) -> dict[str, Any]:
    """n = 2²⁰ columns, Q = 8 … 256 rows: time per query (paper Fig. 9); rows carry ``us_per_query``."""
    g = bench.grid("fixed-n")
    result = _experiment(bench, "fixed-n", [Shape(q, g["cols"], g["k"]) for q in g["rows"]], algorithms,
                         sort=False)
    for r in result["rows"]:
        r["us_per_query"] = 1e3 * r["mean_ms"] / r["rows"] if r["mean_ms"] is not None else None
    return result


def _identity_check(alg: Algorithm, scores: torch.Tensor, k: int) -> dict[str, Any]:
    """Sorted output against ``torch.topk(..., sorted=True)``: values and indices, each with torch.equal."""
    if not alg.sorts:
        return {"identical": None, "values_equal": None, "indices_equal": None}
    values, indices = alg.fn(scores, k, sorted=True)
    ref_values, ref_indices = torch.topk(scores, k, dim=1, largest=False, sorted=True)
    values_equal = torch.equal(values, ref_values)
    indices_equal = torch.equal(indices, ref_indices)
    return {"identical": values_equal and indices_equal, "values_equal": values_equal,
            "indices_equal": indices_equal}


def bar(bench: Bench, algorithms: Sequence[str] | None = None) -> dict[str, Any]:
    """Issue 3's acceptance test: 8192 × 65536, k = 64 … 2048, sorted, against torch.topk.

    Rows carry ``identical`` / ``values_equal`` / ``indices_equal`` (None for peers, which are
    not asked to sort), ``gb_per_s`` (block bytes / mean time), ``floor_ms`` (block bytes / the
    copy bandwidth counted as bytes read + written), ``pct_of_floor`` (floor / mean time, in %)
    and ``topk_over_this`` (torch.topk's mean time / this one's).
    """
    g = bench.grid("bar")
    result = _experiment(bench, "bar", [Shape(g["rows"], g["cols"], g["k"])], algorithms, sort=True,
                         check=_identity_check)
    rate = bench.copy()["read_plus_write_bytes_per_s"]
    topk = {r["k"]: r["mean_ms"] for r in result["rows"] if r["algorithm"] == "topk" and r["mean_ms"] is not None}
    for r in result["rows"]:
        for key in ("identical", "values_equal", "indices_equal"):
            r.setdefault(key, None)
        block = 4 * r["rows"] * r["cols"]
        mean = r["mean_ms"]
        r["floor_ms"] = 1e3 * block / rate
        r["gb_per_s"] = block / mean / 1e6 if mean else None
        r["pct_of_floor"] = 100 * r["floor_ms"] / mean if mean else None
        r["topk_over_this"] = topk[r["k"]] / mean if mean and r["k"] in topk else None
    return result


EXPERIMENT_FUNCTIONS: dict[str, Callable[[Bench, Sequence[str] | None], dict[str, Any]]] = {
    "table2": table2, "speedup": speedup_insertion, "product": fixed_product, "fixed-n": fixed_n, "bar": bar,
}


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------


def _num(v: float) -> str:
    if abs(v) >= 100:
        return f"{v:,.1f}"
    return f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


def _pct(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def _pow2(v: int) -> str:
    return f"2^{v.bit_length() - 1}" if v > 0 and v & (v - 1) == 0 else str(v)


def _cell(row: dict[str, Any] | None, key: str = "mean_ms", *, std: bool = False, suffix: str = "") -> str:
    """One table cell: the value, or a mark for a cell that has none."""
    if row is None:
        return ""
    marks = {"skipped": "—", "oom": "OOM", "error": "error"}
    if row["status"] in marks:
        return marks[row["status"]]
    value = row.get(key)
    if value is None:
        return "n/a"
    text = _num(value) + suffix
    if std:
        text += f" ± {_pct(row['std_pct'])} %"
    return text + ("†" if row["status"] == "over_cap" else "")


def _speedup_cell(row: dict[str, Any] | None) -> str:
    text = _cell(row, "speedup", suffix="×")
    if row is not None and row.get("speedup") is not None:
        text += f" ({_num(row['mean_ms'])} ms)"
    return text


def _md_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in body]


def _timed(exp: dict[str, Any]) -> list[str]:
    """Algorithms of ``exp`` that have at least one row."""
    return [a for a in exp["algorithms"] if any(r["algorithm"] == a for r in exp["rows"])]


def _index(rows: Iterable[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[key] for key in keys): r for r in rows}


def _md_table2(exp: dict[str, Any], results: dict[str, Any]) -> list[str]:
    g = exp["grid"]
    idx = _index(exp["rows"], "algorithm", "cols", "k")

    def paper(n: int, k: int) -> str:
        value = PAPER_TABLE2.get(n, {}).get(k) if g["rows"] == PAPER_TABLE2_ROWS else None
        return f"{value[0]} ± {value[1]} %" if value else "n/a"

    out: list[str] = []
    for alg in _timed(exp):
        header = ["n", *(h for k in g["k"] for h in (f"k = {k}", "paper"))]
        body = [[_pow2(n), *(c for k in g["k"] for c in (_cell(idx.get((alg, n, k)), std=True), paper(n, k)))]
                for n in g["cols"]]
        out += ["", f"### {alg}: mean ms ± % std, Q = {g['rows']} (paper: its Table 2, no unit stated)", "",
                *_md_table(header, body)]
    return out


def _md_speedup(exp: dict[str, Any], results: dict[str, Any]) -> list[str]:
    g, ref = exp["grid"], exp["reference"]
    idx = _index(exp["rows"], "sweep", "algorithm", "rows", "cols", "k")
    others = [a for a in _timed(exp) if a != ref]
    sweeps = (("a", f"(a) Q = {g['rows']}, n swept", "n", [(g["rows"], n) for n in g["cols"]]),
              ("b", f"(b) n = {g['fixed_cols']}, Q swept", "Q", [(q, g["fixed_cols"]) for q in g["sweep_rows"]]))
    out: list[str] = []
    for sweep, title, var, shapes in sweeps:
        header = [var, "k", f"{ref} (ms)", *(f"{a}: speed-up (ms)" for a in others)]
        body = [[_pow2(q if var == "Q" else n), str(k), _cell(idx.get((sweep, ref, q, n, k))),
                 *(_speedup_cell(idx.get((sweep, a, q, n, k))) for a in others)]
                for q, n in shapes for k in g["k"]]
        out += ["", f"### {title}", "", *_md_table(header, body), "", f"Paper: {PAPER_SPEEDUP[sweep]}"]
    return out


def _product_shapes(exp: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(log2 ratio, rows, cols) of the product sweep, in order."""
    seen = {r["log2_ratio"]: (r["rows"], r["cols"]) for r in exp["rows"]}
    return [(ratio, *seen[ratio]) for ratio in exp["grid"]["log2_ratios"] if ratio in seen]


def _md_product(exp: dict[str, Any], results: dict[str, Any]) -> list[str]:
    idx = _index(exp["rows"], "algorithm", "log2_ratio", "k")
    ks, ref = exp["grid"]["k"], exp["reference"]
    shapes = _product_shapes(exp)
    out: list[str] = []
    tables = [(a, "mean ms", lambda r: _cell(r)) for a in _timed(exp)]
    tables += [(a, f"speed-up over {ref}", lambda r: _cell(r, "speedup", suffix="×"))
               for a in _timed(exp) if a != ref]
    for alg, what, fmt in tables:
        header = ["log2(n/Q)", "n", "Q", *(f"k = {k}" for k in ks)]
        body = [[str(ratio), _pow2(n), _pow2(q), *(fmt(idx.get((alg, ratio, k))) for k in ks)]
                for ratio, q, n in shapes]
        out += ["", f"### {alg}: {what}, n · Q = 2^{exp['grid']['log2_product']}", "", *_md_table(header, body)]
    return out


def _md_fixed_n(exp: dict[str, Any], results: dict[str, Any]) -> list[str]:
    g = exp["grid"]
    idx = _index(exp["rows"], "algorithm", "rows", "k")
    out: list[str] = []
    for alg in _timed(exp):
        body = [[str(q), *(_cell(idx.get((alg, q, k)), "us_per_query") for k in g["k"])] for q in g["rows"]]
        out += ["", f"### {alg}: µs per query, n = {_pow2(g['cols'])}", "",
                *_md_table(["Q", *(f"k = {k}" for k in g["k"])], body)]
    return out


def _identical_text(row: dict[str, Any]) -> str:
    if row["identical"] is None:
        return "n/a"
    if row["identical"]:
        return "yes"
    return f"**no** (values {'equal' if row['values_equal'] else 'differ'}, " \
           f"indices {'equal' if row['indices_equal'] else 'differ'})"


def _md_bar(exp: dict[str, Any], results: dict[str, Any]) -> list[str]:
    g = exp["grid"]
    copy = results["copy_bandwidth"]
    block = 4 * g["rows"] * g["cols"]
    floor_ms = 1e3 * block / copy["read_plus_write_bytes_per_s"]
    rows = sorted(exp["rows"], key=lambda r: (r["k"], exp["algorithms"].index(r["algorithm"])))
    body = [[str(r["k"]), r["algorithm"], _cell(r, std=True), _cell(r, "topk_over_this", suffix="×"),
             _identical_text(r) if r["status"] == "ok" else _cell(r, "identical"), _cell(r, "gb_per_s"),
             _cell(r, "pct_of_floor", suffix=" %")] for r in rows]
    return ["", f"Block {g['rows']} × {g['cols']} float32 = {_fmt_bytes(block)}. Floor = block bytes / copy "
            f"bandwidth ({copy['read_plus_write_bytes_per_s'] / 1e9:,.0f} GB/s, bytes read + written) = "
            f"{_num(floor_ms)} ms: a selection that streams the block once at the rate the device copies. "
            "Identity: sorted values and indices against torch.topk(sorted=True), each compared with torch.equal.",
            "", *_md_table(["k", "algorithm", "mean ms ± % std", "topk / this", "identical to torch.topk",
                            "GB/s", "% of floor"], body)]


MARKDOWN: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
    "table2": _md_table2, "speedup": _md_speedup, "product": _md_product, "fixed-n": _md_fixed_n, "bar": _md_bar,
}


def _md_header(results: dict[str, Any]) -> list[str]:
    copy = results["copy_bandwidth"]
    skipped = {name: a["reason"] for name, a in results["algorithms"].items() if a["status"] == "skipped"}
    plots = ", ".join(f"`{p}`" for p in results["plots"].values()) or results["plots_note"] or "none"
    return [
        "# k-selection benchmarks (`bench/bench_select.py`)", "",
        f"- Device: {results['device']} ({results['device_type']}); torch {results['torch_version']}, "
        f"CUDA {results['cuda_version'] or 'n/a'}, knng {results['knng_version']}.",
        f"- Date (UTC): {results['date']}. Command: `{results['command']}`.",
        f"- Grid: {'quick (tiny shapes, a smoke run)' if results['quick'] else 'full'}; {results['trials']} timed "
        f"trials per cell after 2 warm-up calls, timed with {results['timer']}; cell budget "
        f"{results['cell_budget_s']:g} s, hard cap {results['hard_cap_s']:g} s per call; seed {results['seed']}.",
        f"- Copy bandwidth: {copy['read_plus_write_bytes_per_s'] / 1e9:,.1f} GB/s counted as bytes read + bytes "
        f"written by a device-to-device copy of {_fmt_bytes(copy['bytes_per_copy'])} (read rate "
        f"{copy['read_bytes_per_s'] / 1e9:,.1f} GB/s).",
        "- Peers: " + "; ".join(f"{name}: {status}" for name, status in results["peers"].items()) + ".",
        "- Skipped algorithms: " + ("; ".join(f"{n} ({r})" for n, r in skipped.items()) or "none") + ".",
        f"- Plots: {plots}.",
        "- Cells: mean ms (± % std = 100 · sample std / mean); — skipped, OOM out of memory, error failed "
        "(reasons in select.json); † a single call over the hard cap, timed by the wall clock, after which "
        "that algorithm's remaining cells in the experiment were skipped.",
    ]


def render_markdown(results: dict[str, Any]) -> str:
    """The summary of ``results`` (as :func:`run` returns it) as markdown tables."""
    lines = _md_header(results)
    for name, exp in results["experiments"].items():
        lines += ["", f"## {exp['title']}", "", f"Paper: {exp['paper']}",
                  "", f"Selection called with sorted={exp['sorted']}"
                  + (f"; reference algorithm: {exp['reference']}." if exp["reference"] else ".")]
        if exp["skipped_algorithms"]:
            lines.append("Not timed: " + "; ".join(f"{n} ({r})" for n, r in exp["skipped_algorithms"].items()) + ".")
        lines += MARKDOWN[name](exp, results)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------


@dataclass
class Panel:
    """One subplot: named lines of (x, y) points."""

    title: str
    xlabel: str
    ylabel: str
    lines: dict[str, tuple[list[float], list[float]]]
    logx: bool = True
    logy: bool = True


def _series(rows: Iterable[dict[str, Any]], where: Callable[[dict[str, Any]], bool],
            label: Callable[[dict[str, Any]], str], x: str, y: str) -> dict[str, tuple[list[float], list[float]]]:
    points: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if where(r) and r.get(y) is not None:
            points.setdefault(label(r), []).append((r[x], r[y]))
    return {name: ([p[0] for p in sorted(pts)], [p[1] for p in sorted(pts)]) for name, pts in points.items()}


def _by_k(r: dict[str, Any]) -> str:
    return f"k={r['k']}"


def _panels_table2(exp: dict[str, Any], results: dict[str, Any]) -> list[Panel]:
    return [Panel(alg, "n (columns)", "mean time (ms)",
                  _series(exp["rows"], lambda r, a=alg: r["algorithm"] == a, _by_k, "cols", "mean_ms"))
            for alg in _timed(exp)]


def _panels_speedup(exp: dict[str, Any], results: dict[str, Any]) -> list[Panel]:
    ref = exp["reference"]
    return [Panel(f"({sweep}) {alg}", var, f"speed-up over {ref}",
                  _series(exp["rows"], lambda r, a=alg, s=sweep: r["algorithm"] == a and r["sweep"] == s,
                          _by_k, x, "speedup"))
            for sweep, var, x in (("a", "n (columns), Q fixed", "cols"), ("b", "Q (rows), n fixed", "rows"))
            for alg in _timed(exp) if alg != ref]


def _panels_product(exp: dict[str, Any], results: dict[str, Any]) -> list[Panel]:
    ref = exp["reference"]
    panels = [Panel(f"{alg}: time", "log2(n/Q)", "mean time (ms)",
                    _series(exp["rows"], lambda r, a=alg: r["algorithm"] == a, _by_k, "log2_ratio", "mean_ms"),
                    logx=False) for alg in _timed(exp)]
    return panels + [Panel(f"{alg}: speed-up over {ref}", "log2(n/Q)", "speed-up",
                           _series(exp["rows"], lambda r, a=alg: r["algorithm"] == a, _by_k, "log2_ratio",
                                   "speedup"), logx=False)
                     for alg in _timed(exp) if alg != ref]


def _panels_fixed_n(exp: dict[str, Any], results: dict[str, Any]) -> list[Panel]:
    return [Panel(alg, "Q (rows)", "time per query (µs)",
                  _series(exp["rows"], lambda r, a=alg: r["algorithm"] == a, _by_k, "rows", "us_per_query"))
            for alg in _timed(exp)]


def _panels_bar(exp: dict[str, Any], results: dict[str, Any]) -> list[Panel]:
    lines = _series(exp["rows"], lambda r: True, lambda r: r["algorithm"], "k", "gb_per_s")
    ks = list(exp["grid"]["k"])
    lines["copy bandwidth (floor)"] = (ks, [results["copy_bandwidth"]["read_plus_write_bytes_per_s"] / 1e9] * len(ks))
    return [Panel(f"{exp['grid']['rows']} × {exp['grid']['cols']}", "k", "effective bandwidth (GB/s)", lines)]


PANELS: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[Panel]]] = {
    "table2": _panels_table2, "speedup": _panels_speedup, "product": _panels_product,
    "fixed-n": _panels_fixed_n, "bar": _panels_bar,
}


def _draw(figure_cls: Any, panels: Sequence[Panel], title: str, path: Path) -> None:
    """Draw ``panels`` in a grid of up to three columns and write the PNG atomically."""
    from matplotlib.ticker import MaxNLocator

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = figure_cls(figsize=(max(6.5, 5 * ncols), 3.8 * nrows + 0.4), layout="constrained")
    fig.suptitle(title, fontsize="medium")
    for i, panel in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for label, (xs, ys) in panel.lines.items():
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
        if panel.logx:
            ax.set_xscale("log", base=2)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if panel.logy:
            ax.set_yscale("log")
        ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    atomic_write(path, lambda temp: fig.savefig(temp, format="png", dpi=110))


def write_plots(results: dict[str, Any], out_dir: Path) -> tuple[dict[str, str], str | None]:
    """One PNG per experiment that has data; returns ``({experiment: file name}, note)``, the
    note saying why there are no plots when matplotlib does not import."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return {}, "none: matplotlib does not import (pip install 'knng[bench]', or matplotlib)"
    written: dict[str, str] = {}
    for name, exp in results["experiments"].items():
        panels = [p for p in PANELS[name](exp, results) if p.lines]
        if panels:
            path = out_dir / f"select-{name}.png"
            _draw(Figure, panels, f"{exp['title']}\n{results['device']}, {results['date']}", path)
            written[name] = path.name
    return written, None


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _peer_status(bench: Bench) -> dict[str, str]:
    status = {name: bench.algorithm(name).reason or f"{bench.algorithm(name).source} present" for name in PEERS}
    status["faiss"] = faiss_status()
    return status


def _algorithm_summary(bench: Bench) -> dict[str, dict[str, Any]]:
    return {name: {"source": alg.source, "status": "skipped" if alg.reason else "available", "reason": alg.reason}
            for name, alg in bench.algorithms.items()}


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    """Write the plots, ``select.json`` and ``select.md`` into ``out_dir``, each atomically."""
    results["plots"], results["plots_note"] = write_plots(results, out_dir)
    text = json.dumps(results, indent=1, default=json_default) + "\n"
    atomic_write(out_dir / "select.json", lambda temp: temp.write_text(text, encoding="utf-8"))
    markdown = render_markdown(results)
    atomic_write(out_dir / "select.md", lambda temp: temp.write_text(markdown, encoding="utf-8"))


def run(experiments: str | Iterable[str] = "all", *, device: str | torch.device = "auto",
        trials: int = DEFAULT_TRIALS, quick: bool = False, out_dir: str | Path = DEFAULT_OUT,
        algorithms: str | Iterable[str] | None = None, progress: bool = True, seed: int = 0,
        cell_budget_s: float | None = None, hard_cap_s: float | None = None,
        command: str | None = None) -> dict[str, Any]:
    """Run k-selection experiments and write their results.

    Parameters
    ----------
    experiments : str or iterable of str, default "all"
        Names from :data:`EXPERIMENTS`, comma-separated or as a sequence, or ``"all"``.
    device : str or torch.device, default "auto"
        ``"auto"`` (a GPU if there is one), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    trials : int, default 20
        Timed calls per cell (fewer where a cell would overrun ``cell_budget_s``).
    quick : bool, default False
        Tiny grids (rows ≤ 64, cols ≤ 2048, k ≤ 32) that run in seconds on a CPU.
    out_dir : str or pathlib.Path, default "bench-results/select"
        Folder, created if missing, for ``select.json``, ``select.md`` and ``select-*.png``.
    algorithms : str or iterable of str, optional
        Algorithms to compare instead of each experiment's defaults (:data:`DEFAULT_ALGORITHMS`);
        each experiment's reference (:data:`REFERENCES`) is always added. Names that are not
        registered are reported as skipped.
    progress : bool, default True
        Print one line per cell on standard error.
    seed : int, default 0
        Seed of the input generator.
    cell_budget_s, hard_cap_s : float, optional
        Seconds of timed calls per cell, and the longest single call before the algorithm's
        remaining cells are skipped (default 30 and 20, or 0.5 and 2 when ``quick``).
    command : str, optional
        The command line to record (default: this process's ``sys.argv``).

    Returns
    -------
    dict
        What ``select.json`` holds (see ``docs/SELECT_BENCH.md`` for the layout).

    Raises
    ------
    ValueError
        For an unknown experiment, a bad ``trials``, ``device``, ``algorithms`` or time limit;
        the message names the argument.
    """
    names = parse_experiments(experiments)
    trials = check_trials(trials)
    quick = bool(quick)
    chosen = None if algorithms is None else parse_algorithms(algorithms)
    budget = _check_seconds("cell_budget_s", CELL_BUDGET_S[quick] if cell_budget_s is None else cell_budget_s)
    cap = _check_seconds("hard_cap_s", HARD_CAP_S[quick] if hard_cap_s is None else hard_cap_s)
    dev = resolve_device(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    bench = Bench(dev, trials=trials, quick=quick, seed=seed, cell_budget_s=budget, hard_cap_s=cap,
                  progress=progress)
    results: dict[str, Any] = {
        "schema": SCHEMA, "device": _device_name(dev), "device_type": dev.type, "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda, "knng_version": knng.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "quick": quick, "trials": trials, "seed": seed, "cell_budget_s": budget, "hard_cap_s": cap,
        "memory_fraction": MEMORY_FRACTION, "timer": _timer_name(dev), "l2_cache_bytes": bench.l2_bytes,
        "copy_bandwidth": bench.copy(), "peers": _peer_status(bench),
        "algorithms": {}, "experiments": {}, "plots": {}, "plots_note": None,
    }
    for name in names:
        results["experiments"][name] = EXPERIMENT_FUNCTIONS[name](bench, chosen)
        results["algorithms"] = _algorithm_summary(bench)
        write_outputs(results, out)
    return results
