"""The engine's options: every setting a user, a test or a benchmark may change, in one frozen
object, set for a block of code and read where it acts.

Nothing else in the package is a mutable switch: code that behaves one way or another reads
:func:`get_options`, and whoever wants the other way sets it for a block, in the manner of
scikit-learn's ``config_context``::

    with knng.options(screen_precision="float64", fold_duplicates=False):
        g = knng.graph(x, 10)          # every call inside runs with these options

Options are held in a :class:`contextvars.ContextVar`: they apply to the thread (and the asyncio
task) that set them and nest; the engine reads them in the calling thread. The defaults are the
configuration users run, measured in ``docs/BENCHMARKS.md``; the others exist to compare with it
(benchmarks) or to reach a path on data too small to take it by itself (tests).

This module imports nothing of knng: every layer may read it. (It is ``knng._options``, not
``knng.options``: the package's ``knng.options`` is the context manager.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Options", "options", "get_options", "kernel_forced", "SCREEN_PRECISIONS", "KERNELS"]

#: The names :attr:`Options.screen_precision` takes (``knng.metrics``' precisions).
SCREEN_PRECISIONS = frozenset({"float64", "float32", "tf32", "tf32x3", "float16", "bfloat16", "int8x4", "int8"})

#: The kernels :attr:`Options.kernels` may force on or off (where the engine asks "does it run
#: here?"): ``triton`` every Triton kernel (on a CPU: in Triton's interpreter,
#: ``TRITON_INTERPRET=1``), the others one kernel each.
KERNELS = frozenset({"triton", "strip_minima", "strip_seeds", "kth_seeds", "tiles_first", "triangle", "row_kth",
                     "row_order", "radius", "pair_radius", "preparation"})

#: The graph methods :attr:`Options.graph_method` may force (``knng.engine.plan``'s).
GRAPH_METHODS = frozenset({"symmetric", "rows"})


@dataclass(frozen=True)
class Options:
    """The engine's settings (see the module's docstring for how they are set).

    Attributes
    ----------
    fold_duplicates : bool, default True
        Fold groups of identical rows into one before a graph, or before a search of an
        in-memory corpus, where a group is large enough to pay (``knng.engine.duplicates``;
        ``docs/EXACTNESS.md``, "Identical rows folded into one"). Runs with a checkpoint,
        distributed runs and data read from files are not folded.
    screen_precision : str or None, default None
        Screen in this precision instead of the planner's choice
        (``knng.engine.plan.choose_screen_precision``): one of :data:`SCREEN_PRECISIONS`. Every
        precision gives the exact answer; only the speed differs.
    graph_method : {"symmetric", "rows"} or None, default None
        Run graphs by this method instead of the planner's choice: symmetric blocks (each
        pair's product once) or by rows (the data searched against themselves). Both give the
        same graph.
    tiles_first : bool, default True
        A search of a resident corpus of 2k to 16,384 tiles takes each row's threshold from every
        corpus tile's minimum and screens only the tiles within it, where the wgmma kernel runs
        (``knng.engine.plan.tiles_first``; H200, 200k × 128 graph by rows at k = 100: 70.1 →
        50.2 ms).
    graph_rows_tiles_first : bool, default True
        A graph of at most 2²⁵ values runs by rows at any k where its search takes its tiles
        first (``knng.engine.plan.rows_method_wins``).
    tf32_sample : bool, default True
        The seed sample's product of a TF32 screen runs on TF32 tensor cores (1M × 128, 10k
        queries, k = 10, H100: 6.5 → 3.4 ms).
    rest_at_once : bool, default True
        After its first tile, a kernel screen takes the rest of a resident corpus in one launch
        (1M × 128, 10k queries, float16, H100: four tiles of 2¹⁸ took 10–12 ms where the kernel
        alone takes 7.6).
    tighten_on : frozenset of str, default {"cuda"}
        Device types on which a search's screen tightens its thresholds itself, the store
        holding the survivors back (``knng.engine.search``: on an H100, 220 → 105 pairs screened
        per row at k = 10; on a CPU the tiles are narrower than the sample, and the store's path
        stays).
    hold_on : frozenset of str, default {"cuda"}
        Device types on which a graph's store holds the survivors of a low-precision screen back
        (``knng.engine.graph``, ``knng.engine.store.Holding``).
    hold_pairs : bool, default True
        A held store also holds the pairs of blocks where its lists do not hold them
        (``knng.engine.graph``).
    gemm_column_terms : bool, default True
        On a GPU, the score block's column terms go into the product's epilogue (one pass
        fewer over the block; ``knng.engine.screen``).
    cuda_screen : bool, default True
        The scaled float16 screen runs as the CUDA C kernel (compiled through CuPy) where it can,
        else as the Triton kernel (``knng.engine.kernels.fused``).
    wgmma : bool, default True
        On a Hopper GPU, the CUDA C screen's asynchronous warpgroup products (``wgmma``) up to
        K = 256, else ``mma.sync`` (``knng.engine.kernels.cuda_screen``).
    wgmma_one_set : bool, default True
        Screens of K ≤ 128 take the wgmma kernel's one-set configuration (two blocks a
        multiprocessor).
    wgmma_minima : bool, default True
        Strip minima run on the wgmma kernel too.
    mark_candidates : bool, default True
        The wgmma kernel's pre-test marks its candidates as it tests them, instead of testing a
        half-tile's entries again where one passed.
    sort_interpreted : bool, default False
        In Triton's interpreter (a CPU without a GPU), the finish's row sort runs the Triton
        kernel instead of torch's sort (tests of the kernel; ``knng.engine.kernels.row_order``).
    kernels : mapping of str to bool, default {}
        Kernels forced on (True) or off (False) where the engine asks whether they run here;
        the names are :data:`KERNELS`. Forced off, the engine takes the reference path the
        kernel replaces. Forced on, the planner and the engine take the kernel's path: the
        Triton kernels (``"triton"``) run in Triton's interpreter on a CPU, and the tiles-first
        screen (``"tiles_first"``) runs its reference where the wgmma kernel cannot run. Tests
        use this to reach those paths on a CPU. ``{"triangle": False}`` screens a graph part's
        own block whole instead of as its upper triangle (to compare).

    compiled_kernels : bool, default True
        On a GPU, the engine runs its compiled kernels (Triton's, and the CUDA C screens through
        CuPy) where they apply. False: it runs as if neither Triton nor CuPy were installed,
        with torch's operations only, which need no compilation (and no probe of what compiles).
        A first call of a kind sets it while its kernels compile in the background.
    background_compile : bool, default True
        The first call of a kind (operation, device, dimension, dtype, metric, k) in a process,
        up to ``uncompiled_max_scores`` scores on a GPU, runs with ``compiled_kernels=False`` and
        its kernels compile in a background thread (``knng.engine.kernels.compiling``; a first
        search of 10,000 queries in 1M × 128 on an H200 with empty kernel caches: 8.4 s with
        its kernels compiled first). False: a first call compiles before it runs.

    The sizes below are the planner's and the engine's measured choices (``docs/FINDINGS.md``
    holds the measurements); tests shrink them to reach a path on small data, benchmarks vary
    them to measure the choice again. Every value gives the same answer.

    direct_max_scores, direct_max_scores_gpu : int, default 2²², 2²⁸
        Calls of at most this many scores (queries × corpus rows; a graph: n²) on a CPU, on a
        GPU, run the direct path (``knng.engine.search.direct_neighbours``: one product, each
        row's k + m best, a certificate, the exact finish) instead of the block pipeline, whose
        planning, preparation and per-block steps cost more than such a call's arithmetic. On a
        2-core CPU it won on five kinds of data up to graphs of 2,000 points and searches of 100
        queries in 20,000, and lost on some at 3,000 points and 50,000. On an H200 it won up to
        graphs of 16,000 × 128 points (2.6 × 10⁸ scores) and searches of 1,000 queries in 200,000,
        and lost from graphs of 22,000 points and searches of 300 queries in 1M (3 × 10⁸)
        (``docs/BENCHMARKS.md``, "Small calls"). 0: never (the engine's tests).
    direct_graphs : int, default 2
        First passes of the direct path kept as CUDA graphs on a GPU: the second call of a kind
        (shapes, the corpus's place in memory, k, metric, these options) captures its first
        pass, later ones replay it in one launch instead of about a hundred
        (``knng.engine.search.direct``, "the first pass, replayed"). Least recently used first
        out; each holds its scores and prepared rows. 0: never.
    direct_graph_max_bytes : int, default 512 MiB
        Largest first pass captured: its scores and prepared copies of the corpus, in bytes.
    uncompiled_max_scores : int, default 2³⁶
        Calls of at most this many scores (queries × corpus rows; a graph: n²) may run their
        first call of a kind without compiled kernels (``background_compile``). Torch's
        operations took 3–13 times the kernels' time (H200: a graph of 262,144 × 64, 2³⁶ scores,
        578 ms against 44; ``docs/STARTUP.md``), under the 1.8–8.6 s a first call with its
        kernels took with warm and empty caches.
    cpu_max_part : int, default 2048
        Largest graph part on a CPU: 2048² float32 blocks (16 MiB) stay in the cache and have a
        quarter of 1024²'s fixed costs.
    gpu_max_part : int, default 16384
        Largest graph part on a GPU whose score block is materialised (16384² float32: 1 GiB).
    gpu_kernel_max_part : int, default 32768
        Largest graph part on a GPU whose screen is a kernel (no score block): larger parts pay
        the per-block host work fewer times, until flat image regions' near-ties make them lose.
    gpu_triangle_max_part : int, default 65536
        The same where a part's own block is screened as its upper triangle (the wgmma kernel):
        no product is done twice, so larger parts win.
    gpu_triangle_max_part_small_k : int, default 98304
        The same for graphs of k ≤ 16 (``knng.engine.plan.TRIANGLE_SMALL_K``).
    gpu_kernel_group_columns : int, default 262144
        Columns one launch of a kernel-screened graph screens against a row part (several
        column parts: one set of thresholds and one hand-over to the stores a launch).
    own_part_seed : int, default 8192
        Columns of a part that seed its rows' thresholds when a kernel screens the part's own
        block (each doubling halves the own blocks' survivors and doubles the seeds' cost).
    symmetric_bands, symmetric_min_rows : int, default 8, 4096
        A part's materialised own block is multiplied in this many row bands, each with its
        columns from the band on (the rest mirrored), from this many rows on.
    graph_rows_min_k : int, default 64
        From this k a GPU graph runs by rows (a search of the data against themselves) where
        its data have no principal frames.
    principal_min_gain : float, default 1.5
        Principal frames where they narrow the data's slabs by at least this factor.
    group_parts : int or None, default None
        Column parts one off-diagonal launch of a graph screens, instead of the planner's
        choice (``gpu_kernel_group_columns`` where a kernel screens a resident corpus).
    whole_by_smallest_on, whole_by_smallest_min_k : frozenset of str, int, default {"cuda"}, 17
        On these devices and from this k, a part's own block, materialised whole, takes each
        row's survivors from its smallest entries (one selection seeds and screens).
    squaring_max_d_cpu : int, default 512
        On a CPU, principal frames' leading directions by squaring the Gram matrix up to this
        dimension (power iteration above: it reads the sample 80 times).
    local_centre_gain : float, default 2.0
        Centre each block on its row part where that divides the sum of squared norms about
        the mean by at least this factor; else every block keeps the corpus mean.
    cpu_sample, gpu_sample : int, default 1024, 65536
        Columns of a search's random sample for the first thresholds (a sample of m columns
        lets about k·c/m pairs a row through a tile of c columns before the stores tighten).
    gpu_search_cols : int, default 2¹⁸
        Widest corpus tile of a GPU search: the stores tighten between tiles.
    kernel_search_rows, kernel_search_pairs : int, default 2¹⁸, 2²⁵
        Query rows per chunk of a GPU search screened by a kernel over a resident corpus, and
        its survivors (rows ≤ pairs / k): fewer, larger chunks amortise each chunk's fixed cost.
    pending_cpu, pending_gpu : int, default 2¹⁵, 2²²
        Survivors a store lets wait before it takes them in (an update costs a few dozen
        operations whatever its size).
    pending_pair_bytes : int, default 96
        Bytes per pending survivor, its copies during an update included (the memory plan).
    store_extra : int or None, default None
        Candidates a store holds per row beyond k before it tightens (None: max(8, k // 4)).
    held_limit : int or None, default None
        Survivors a holding store holds back before it takes them in (None: the planner's,
        as many as the store's own entries for a graph, no limit for a search).
    escalate_pairs : int or None, default None
        Held survivors above which a graph's row stops being screened in the blocks and is
        searched again with a float64 screen at the end (None: the planner's rule,
        :func:`knng.engine.plan.escalate_pairs`; 0: never). Rows whose low-precision bound is
        wider than the gaps between their neighbours (near-duplicates off a lattice) let
        thousands of pairs through; one float64 search of such a row costs 2·n·d products.
    duplicate_list_entries, duplicate_sort_entries : int, default 2²², 2²⁵
        Entries of one chunk's (rows × lists) arrays, and candidates one sort expands, at
        most, when a graph's folded duplicates are unfolded.
    rebuild_entries_cpu, rebuild_entries_gpu : int, default 2²², 2²⁴
        Padded entries (rows × width) of one tightening step; wider groups are split.
    finish_padding : float, default 2.0
        A holding store's finish pads every row to the widest where that takes at most this
        many times the pairs.
    finish_padded_entries : int or None, default None
        ... or up to this many entries (rows × width) whatever the pairs (None: the store's
        tightening group, ``rebuild_entries_*``); 0 with ``finish_padding=0``: never padded.
    finish_untightened_pairs : int, default 2¹⁶
        A holding store's finish evaluates up to this many held pairs without tightening them
        first (a tightening is a dozen launches and a synchronisation).
    device_summary_rows : int, default 65536
        Rows from which per-row counts are summarised on their device (of the types in
        ``device_summary_on``) instead of on the host.
    device_summary_on : frozenset of str, default {"cuda"}
    few_per_tile : int, default 4
        Kept entries a Triton screen tile takes out one at a time before one atomic per entry.
    row_kth_max_programs : int, default 2¹⁶
        Programs of the radix select at most (each strides over its rows).
    host_budget_min_seconds : float, default 1.0
        A plan under a host budget gets a performance note when it is predicted at least this
        many seconds (and several times) slower than the default budget's plan.
    header_check_bytes : int, default 256 MiB
        TEXMEX files up to this size have every row's header checked; larger ones a sample.
    hdf5_span_bytes : int, default 64 MiB
        Window of file rows read at once when gathering rows from HDF5.
    write_block_bytes : int, default 32 MiB
        Rows are converted and written in blocks of about this size (bounded memory for any
        memory-mapped input).
    """

    fold_duplicates: bool = True
    screen_precision: str | None = None
    graph_method: str | None = None
    tiles_first: bool = True
    graph_rows_tiles_first: bool = True
    tf32_sample: bool = True
    rest_at_once: bool = True
    tighten_on: frozenset[str] = field(default_factory=lambda: frozenset({"cuda"}))
    hold_on: frozenset[str] = field(default_factory=lambda: frozenset({"cuda"}))
    hold_pairs: bool = True
    gemm_column_terms: bool = True
    cuda_screen: bool = True
    wgmma: bool = True
    wgmma_one_set: bool = True
    wgmma_minima: bool = True
    mark_candidates: bool = True
    sort_interpreted: bool = False
    kernels: Mapping[str, bool] = field(default_factory=dict)
    compiled_kernels: bool = True
    background_compile: bool = True
    # graph parts and blocks
    direct_max_scores: int = 1 << 22
    direct_max_scores_gpu: int = 1 << 28
    direct_graphs: int = 2
    direct_graph_max_bytes: int = 512 << 20
    uncompiled_max_scores: int = 1 << 36
    cpu_max_part: int = 2048
    gpu_max_part: int = 16384
    gpu_kernel_max_part: int = 32768
    gpu_triangle_max_part: int = 65536
    gpu_triangle_max_part_small_k: int = 98304
    gpu_kernel_group_columns: int = 262144
    own_part_seed: int = 8192
    symmetric_bands: int = 8
    symmetric_min_rows: int = 4096
    graph_rows_min_k: int = 64
    principal_min_gain: float = 1.5
    local_centre_gain: float = 2.0
    # searches' samples and tiles
    cpu_sample: int = 1024
    gpu_sample: int = 65536
    gpu_search_cols: int = 1 << 18
    kernel_search_rows: int = 1 << 18
    kernel_search_pairs: int = 1 << 25
    # stores
    pending_cpu: int = 1 << 15
    pending_gpu: int = 1 << 22
    pending_pair_bytes: int = 96
    rebuild_entries_cpu: int = 1 << 22
    rebuild_entries_gpu: int = 1 << 24
    finish_padding: float = 2.0
    finish_untightened_pairs: int = 1 << 16
    finish_padded_entries: int | None = None
    device_summary_rows: int = 65536
    device_summary_on: frozenset[str] = field(default_factory=lambda: frozenset({"cuda"}))
    group_parts: int | None = None
    whole_by_smallest_on: frozenset[str] = field(default_factory=lambda: frozenset({"cuda"}))
    whole_by_smallest_min_k: int = 17
    squaring_max_d_cpu: int = 512
    # stores' sizes, where a test forces them
    store_extra: int | None = None
    held_limit: int | None = None
    escalate_pairs: int | None = None
    # duplicates
    duplicate_list_entries: int = 1 << 22
    duplicate_sort_entries: int = 1 << 25
    # kernels' launch shapes
    few_per_tile: int = 4
    row_kth_max_programs: int = 1 << 16
    # host budget notes
    host_budget_min_seconds: float = 1.0
    # files
    header_check_bytes: int = 256 * 2**20
    hdf5_span_bytes: int = 64 * 2**20
    write_block_bytes: int = 32 * 2**20

    def __post_init__(self) -> None:
        defaults = {f.name: _default(f) for f in dataclasses.fields(self)}
        for name, default in defaults.items():
            value = getattr(self, name)
            if name == "screen_precision":
                if value is not None and value not in SCREEN_PRECISIONS:
                    raise ValueError(f"screen_precision must be None or one of {sorted(SCREEN_PRECISIONS)}, "
                                     f"got {value!r}")
            elif name == "graph_method":
                if value is not None and value not in GRAPH_METHODS:
                    raise ValueError(f"graph_method must be None or one of {sorted(GRAPH_METHODS)}, got {value!r}")
            elif name == "kernels":
                if not isinstance(value, Mapping) or not all(isinstance(v, bool) for v in value.values()):
                    raise TypeError(f"kernels must map kernel names to True or False, got {value!r}")
                unknown = sorted(set(value) - KERNELS)
                if unknown:
                    raise ValueError(f"kernels: unknown kernel(s) {', '.join(map(repr, unknown))}; "
                                     f"the kernels are {', '.join(sorted(KERNELS))}")
                object.__setattr__(self, name, MappingProxyType(dict(value)))
            elif default is None:  # an int, or None for the planner's
                if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                                          or value < 0):
                    raise TypeError(f"{name} must be None or an integer of at least 0, got {value!r}")
            elif isinstance(default, frozenset):
                if not isinstance(value, (set, frozenset)) or not all(isinstance(v, str) for v in value):
                    raise TypeError(f"{name} must be a set of device types (e.g. {{'cuda'}}), got {value!r}")
                object.__setattr__(self, name, frozenset(value))
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise TypeError(f"{name} must be True or False, got {value!r}")
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                    raise TypeError(f"{name} must be an integer, got {value!r}")
                if value < 0:
                    raise ValueError(f"{name} must be at least 0, got {value!r}")
                object.__setattr__(self, name, int(value))
            elif isinstance(default, float):
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    raise TypeError(f"{name} must be a number, got {value!r}")
                if not value >= 0:
                    raise ValueError(f"{name} must be at least 0, got {value!r}")
                object.__setattr__(self, name, float(value))


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def kernel_forced(kernel: str) -> bool | None:
    """Whether :attr:`Options.kernels` forces ``kernel`` on (True) or off (False); None where
    the device decides. ``kernel`` is one of :data:`KERNELS`."""
    return get_options().kernels.get(kernel)


_CURRENT: ContextVar[Options] = ContextVar("knng_options", default=Options())


def get_options() -> Options:
    """The options in force here (the defaults outside any :func:`options` block)."""
    return _CURRENT.get()


@contextlib.contextmanager
def options(**changes: Any) -> Iterator[Options]:
    """Set options for the block: ``with knng.options(fold_duplicates=False): ...``.

    Parameters
    ----------
    **changes
        :class:`Options` fields and their values; the others keep the values in force
        (``kernels`` is merged with the kernels forced already).

    Yields
    ------
    Options
        The options in force inside the block.

    Raises
    ------
    TypeError
        An unknown option, or a value of the wrong type.
    ValueError
        A value outside the option's range (an unknown screen precision).
    """
    known = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; knng's options are {', '.join(sorted(known))}")
    in_force = _CURRENT.get()
    if isinstance(changes.get("kernels"), Mapping):  # kernels add to those in force
        changes["kernels"] = {**in_force.kernels, **changes["kernels"]}
    current = dataclasses.replace(in_force, **changes)
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)
