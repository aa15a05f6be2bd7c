"""Tile plans: how big the score blocks may be, given a memory budget.

The engine's working set is dominated by one score block (``rows × cols`` float32) and what the
selection needs beside it. The budget also decides whether the prepared corpus (float32) stays
resident on the device or streams through in tiles from host memory or a memory map.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from knng._inputs import READ_AHEAD
from knng._units import parse_bytes
from knng.metrics import (
    INTEGER_TAIL, PRECISIONS, IntegerExtent, ScreenPrecision, get_metric, get_precision, scaled_width,
)
from knng._options import get_options
from knng.engine.kernels import (
    KTH_ROW_MAX_WIDTH, TILE, DeviceCapabilities, capabilities_of, kernels_installed, kind_ready, strip_seeds_run,
    tiles_first_runs, triangle_runs, triton_runs, strip_width, wgmma_runs,
)

__all__ = [
    "EnginePlan", "make_search_plan", "make_graph_plan", "direct_applies", "DIRECT_METRICS",
    "RadiusPlan", "make_radius_plan",
    "choose_screen_precision", "budget_source",
    "TilePlan", "plan_tiles", "default_budget", "resolve_budget", "store_capacity", "search_capacity",
    "available_ram", "allocator_stat", "INPUT_COPY_SHARE", "copies_input",
    "resolve_precision", "pending_pairs", "PRINCIPAL_FRAMES", "GLOBAL_FRAMES", "resolve_host_budget",
    "SEED_STRIPS_PER_K", "strip_seed_count", "held_pairs_limit", "held_take_in_step",
    "host_budget_source", "LISTS_ON_DEVICE", "LISTS_IN_HOST", "LISTS_ON_DISK", "READ_AHEAD", "GRAPH_SYMMETRIC",
    "GRAPH_ROWS", "graph_search_k", "KnngPerformanceWarning", "HOST_BUDGET_SLOWDOWN", "HOST_BUDGET_WITHIN",
    "PlanWork", "plan_work", "estimated_seconds", "host_budget_note", "budget_text", "share_rows",
    "with_share", "call_kind", "first_call_uncompiled",
]

#: :attr:`EnginePlan.frames` values (see :mod:`knng.engine.graph.frames`).
PRINCIPAL_FRAMES = "principal"
GLOBAL_FRAMES = "global"
#: :attr:`EnginePlan.graph_method` values. ``"symmetric"``: blocks S(I, J), I ≤ J, each pair
#: screened once for both its points (:func:`knng.engine.graph.exact_graph`). ``"rows"``: chunks
#: of rows, each screened against the whole data as a search is (every pair screened from both
#: sides, by the non-symmetric kernel, its survivors held back and evaluated whole; see
#: ``Options.graph_rows_min_k``).
GRAPH_SYMMETRIC = "symmetric"
GRAPH_ROWS = "rows"

#: Bytes per score-block element: the block itself, the selection's workspace (torch.topk's
#: radix select and sort need up to about one block-size more) and the exactness pass.
BLOCK_BYTES_PER_ELEMENT = 4 * 3
#: Share of free GPU memory used by default: leaves room for the CUDA context, other tensors
#: in the user's process and allocator fragmentation.
GPU_FREE_SHARE = 0.6
#: Share of available RAM used by default on a CPU; the CPU does not gain from huge tiles.
CPU_AVAILABLE_SHARE = 0.25
CPU_BUDGET_CAP = 2 * 2**30
#: Smallest tile edge the planner will shrink to before giving up.
MIN_TILE = 8
#: Query rows a GPU search's chunk should hold at least, its column tiles narrowed for them
#: where the budget would leave fewer beside the widest tiles: a 582k-point graph's 287k rows
#: escalated under a 4 GB budget (a float64 search, 6 MB of scores a row at 262,144 columns)
#: ran in 3,641 chunks of 79 rows, 6 ms each, most of the call's 23 s.
GPU_SEARCH_MIN_ROWS = 4096
#: Share of available RAM the host-memory budget defaults to.
HOST_AVAILABLE_SHARE = 0.75
#: Share of the host budget the planner gives to what it models (stores, blocks, read buffers,
#: pending pairs); the rest covers what it does not (the prepared rows of a tile, survivor lists,
#: allocator slack): 50,000 × 1,000 float32 graph, 20 MB budget, planned with the whole budget,
#: peaked at 22.7 MB of anonymous memory.
HOST_PLAN_SHARE = 0.6
#: :attr:`EnginePlan.lists` values: where every row's candidate store lives between the blocks
#: that need it. Off the device, a graph works in bands of parts (see knng.engine.store.lists).
LISTS_ON_DEVICE = "device"
LISTS_IN_HOST = "host"
LISTS_ON_DISK = "disk"
#: Bytes per input value the planner assumes for read buffers (float64, the widest input type).
READ_VALUE_BYTES = 8
#: Rows per read of the corpus passes, when no budget asks for fewer.
READ_ROWS = 4096


@dataclass(frozen=True)
class TilePlan:
    """Sizes for one run of the engine.

    Attributes
    ----------
    query_rows : int
        Queries screened together against one corpus tile (rows of a score block).
    corpus_cols : int
        Corpus vectors per tile (columns of a score block).
    corpus_resident : bool
        Whether the prepared corpus is kept whole on the device.
    budget : int
        The memory budget in bytes the plan was made for.
    """

    query_rows: int
    corpus_cols: int
    corpus_resident: bool
    budget: int



def available_ram() -> int:
    """Bytes of host memory available now (``MemAvailable``), or a guess of 8 GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_budget(device: torch.device) -> int:
    """A safe share of free GPU memory, or of available RAM on a CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # Memory torch's caching allocator holds but no tensor uses is free to us too: without
        # it a second call in one process (results of the first freed, blocks still cached)
        # planned with a fraction of the card (seen: 1.6 GB of an 80 GB H100). Read from the
        # allocator's nested statistics: memory_reserved and memory_allocated flatten all of
        # them each, in Python (0.6 ms of every GPU call's host time, H200).
        stats = torch.cuda.memory_stats_as_nested_dict(device)
        cached = allocator_stat(stats, "reserved_bytes") - allocator_stat(stats, "allocated_bytes")
        return int((free + max(0, cached)) * GPU_FREE_SHARE)
    return int(min(CPU_BUDGET_CAP, available_ram() * CPU_AVAILABLE_SHARE))


#: A host input (an array in memory or a file) is copied whole to a GPU, once, where it takes
#: at most this share of the budget; the engine then reads it as data handed over on the
#: device, and plans with what the copy leaves. Read in blocks instead, a memory-mapped
#: 2M × 128 graph took 11.5 s against 2.3 s from the same array in host memory with the same
#: plan, and 16.1 s under a 4 GB budget against 2.6 s from a tensor on the device (one H200):
#: the rest of a budget the copy halves still holds a plan of parts as large.
INPUT_COPY_SHARE = 2


def copies_input(*, nbytes: int, on_device: bool, device: torch.device, budget: int) -> bool:
    """Whether a host input of ``nbytes`` is copied whole to ``device`` (a GPU) before the run
    (:data:`INPUT_COPY_SHARE`). Never on a CPU: a memory map's blocks are read from the page
    cache, which is host memory already, and a copy would take the plan's budget (a 40,000 ×
    32 file under a 32 MB budget: 52 parts and 6.1–6.3 s copied, 40 parts and 5.0 s read in
    blocks, 2 cores)."""
    if on_device or device.type != "cuda":
        return False
    return nbytes * INPUT_COPY_SHARE <= budget


def allocator_stat(stats: dict, name: str, which: str = "current") -> int:
    """``which`` ("current" or "peak") bytes of one of the caching allocator's nested statistics
    (``torch.cuda.memory_stats_as_nested_dict``; 0 before any use)."""
    return int(stats.get(name, {}).get("all", {}).get(which, 0))


def resolve_budget(memory_budget: int | float | str | None, device: torch.device) -> int:
    """Bytes the engine may use on ``device``: the user's ``memory_budget`` or the default."""
    if memory_budget is None:
        return default_budget(device)
    return parse_bytes(memory_budget, "memory_budget")


def plan_tiles(
    *, n_queries: int, n_corpus: int, d: int, k_cand: int, budget: int, device: torch.device,
    element_bytes: int = 4, max_cols: int | None = None, k: int | None = None,
) -> TilePlan:
    """Choose a search's tile sizes so that the working set stays inside ``budget`` bytes.

    The prepared corpus (plus norms) stays resident when it takes at most half the budget;
    otherwise it streams in tiles. Every query's answer (``k`` neighbours, default ``k_cand``:
    an int64 index and a float64 distance each) is held through the call; a chunk of queries
    has its own store of ``k_cand`` candidates a row and its queries raw and prepared (a
    streamed corpus is charged every query's lists and prepared row instead: below). Score
    blocks get what remains: rows of up to a per-device number of columns (many on a GPU to
    amortise launches and merges, cache-sized on a CPU), narrowed on a GPU where fewer than
    :data:`GPU_SEARCH_MIN_ROWS` rows would fit beside them.
    """
    vector_bytes = d * element_bytes + 24
    block_bytes = BLOCK_BYTES_PER_ELEMENT * element_bytes // 4
    corpus_bytes = n_corpus * vector_bytes
    resident = corpus_bytes <= budget // 2
    if resident:
        held = n_queries * (k_cand if k is None else k) * 16 + corpus_bytes
    else:
        # A streamed corpus's reads, its tiles' preparation and the exact evaluation's gathers
        # are not modelled: every query's candidate lists and prepared row are charged instead,
        # which kept a 4 MB host budget's streamed search within it (each chunk's own charged
        # below, it held 4.4 MB).
        held = n_queries * (k_cand * (8 + element_bytes) * 2 + vector_bytes)
    remaining = max(budget - held, budget // 8)
    # A chunk's row besides its scores: its query raw and prepared, and (resident) its store.
    row_bytes = 2 * vector_bytes + (_store_bytes(1, k_cand) if resident else 0)
    if device.type == "cuda":
        max_rows, widest, fewest_rows = 16384, 1 << 20, GPU_SEARCH_MIN_ROWS
    else:
        max_rows, widest, fewest_rows = 1024, 8192, MIN_TILE
    max_cols = min(widest, max_cols or widest)
    min_cols = min(n_corpus, k_cand)  # a tile must offer at least the candidates it yields
    # A chunk's queries and store take at most a quarter of what remains.
    max_rows = int(min(max_rows, max(1, remaining // 4 // row_bytes)))
    if not resident:
        # Every query chunk re-reads the whole corpus, so chunks get as many rows as possible
        # and the streamed tiles are narrowed instead (three quarters of what remains for the
        # blocks, the rest for the tile itself).
        rows = min(n_queries, max_rows)
        cols = (remaining * 3 // 4) // (rows * block_bytes)
        if cols < min_cols:
            cols = min_cols
            rows = max(1, (remaining * 3 // 4) // (cols * block_bytes))
        cols = int(min(cols, max_cols, max(min_cols, remaining // 4 // vector_bytes)))
        return TilePlan(query_rows=int(min(rows, n_queries)), corpus_cols=max(1, cols), corpus_resident=False,
                        budget=budget)

    def rows_beside(cols: int) -> int:
        return int(min(n_queries, max_rows, max(1, remaining // (cols * block_bytes + row_bytes))))

    cols = max(min(n_corpus, max_cols), min_cols)
    rows = rows_beside(cols)
    # Every chunk pays a fixed price (its sample's seeds, its store's finish: ~6 ms on an H200)
    # where a column tile pays a few launches: narrower tiles for taller chunks.
    while rows < min(n_queries, fewest_rows) and cols > max(MIN_TILE, k_cand):
        cols = max(MIN_TILE, k_cand, cols // 2)
        rows = rows_beside(cols)
    return TilePlan(query_rows=max(1, rows), corpus_cols=max(1, cols), corpus_resident=True, budget=budget)


# ------------------------------------------------------------------------------ the one plan
#: Compute capabilities whose float64 matrix products are about as fast as float32 ones.
FAST_FP64_CAPABILITIES = {(8, 0), (9, 0), (10, 0)}
TRIANGLE_SMALL_K = 16
#: Strips per neighbour in the scattered sample whose strip minima seed a part's own block
#: (``knng.engine.graph``; at least Options.own_part_seed columns, at most the part): with 4k strips
#: about k/8 of a row's k nearest share a strip with a nearer one, so the k-th strip minimum is
#: near the sample's k-th key. At k = 100 a part's sample grows from 8,192 columns (too few
#: strips: a materialised block, its four float32 passes and a selection of 100 among 8,192
#: per row) to 25,600.
SEED_STRIPS_PER_K = 4


def strip_seed_count(m: int, k: int) -> int:
    """Columns of a part of ``m`` whose strip minima seed its rows' k thresholds: at least
    ``Options.own_part_seed``, and :data:`SEED_STRIPS_PER_K` strips per neighbour (the whole part
    at most). Strip minima cost a fraction of a materialised sample (no block written, no
    selection of k among thousands), so at large k the sample grows instead."""
    return min(m, max(get_options().own_part_seed, SEED_STRIPS_PER_K * k * strip_width()))


SAMPLE_PER_K = 16
#: On a GPU the sample grows with k from GPU_MIN_SAMPLE to Options.gpu_sample (GPU_SAMPLE_PER_K columns
#: per neighbour): at small k the first tile's tightening (the k-th of 262,144 columns) makes up
#: for a looser start, and the sample's product and selection cost in proportion to its width.
#: 1M × 128, 10k queries, float16, k = 10, H100 (2026-11-24): 16,384 columns let 220 pairs per
#: row through instead of 82 and the call took 26.7–28.5 ms instead of 28.9–34.5; at k = 100 a
#: 16,384-column sample let 2,156 pairs per row through and lost (61.6 ms against 55.3).
GPU_MIN_SAMPLE = 16384
GPU_SAMPLE_PER_K = 1024


@dataclass(frozen=True)
class EnginePlan:
    """Everything the engine decided before it ran: printed by ``knng info``, saved in ``knng.json``.

    Attributes
    ----------
    operation : {"search", "graph"}
    n_queries, n_corpus, d, k : int
        The shape of the problem (a graph has ``n_queries == n_corpus``).
    metric : str
    device : str
    screen_precision : {"float32", "float64", "tf32", "tf32x3", "float16", "bfloat16", "int8x4", "int8"}
        Precision of the matrix products of the screen (:data:`knng.metrics.PRECISIONS`): it
        changes the rounding bound, hence how many pairs reach the exact finish, never the
        result (``int8``: integer data only). tf32, tf32x3, float16 and bfloat16 run in the fused
        kernel, int8x4 and int8 in kernels of their own (``knng.engine.kernels.fused``).
    unit_roundoff : float
        The screen's input unit roundoff in the bound of ``docs/EXACTNESS.md``.
    thresholds : str
        How each row's first threshold τ is found before the full screen.
    sample_size : int
        Columns of the random sample that seeds a search's thresholds (0 for a graph).
    capacity : int
        Candidates a row keeps before it tightens its threshold.
    pending_pairs : int
        Screen survivors the candidate stores let wait before they take them in.
    query_rows, corpus_cols : int
        Rows and columns of one score block of a search; a graph's blocks are parts × parts.
    corpus_resident : bool
        Whether the prepared corpus stays whole on the device (else it streams in tiles).
    parts, part_size, blocks : int
        A graph's parts, rows per part and blocks S(I, J), I ≤ J, planned (0 for a search).
    frames : str
        How a graph's blocks are centred (:mod:`knng.engine.graph.frames`): ``"principal"`` (parts
        are slabs along the principal direction, each block centred on its row part, blocks
        no row can need skipped) or ``"global"`` (one centre, every block).
    bytes_expected : int
        Peak bytes the plan expects to hold on the device.
    budget : int
        The memory budget in bytes.
    budget_source : str
        Where the budget came from.
    host_budget : int
        Bytes of host memory the run may hold (its results excepted): read buffers, and the
        candidate stores when they live in host memory. The planner gives
        :data:`HOST_PLAN_SHARE` of it to what it models; on a CPU the device budget never
        exceeds that share.
    host_budget_source : str
        Where the host budget came from.
    read_rows : int
        Rows per read of a file-backed input (read :data:`READ_AHEAD` blocks ahead).
    lists : {"device", "host", "disk"}
        Where every row's candidate store lives: on the device, in (pinned) host memory, or in
        a memory-mapped file (``knng.engine.store.lists``). Off the device a graph runs in bands.
    band_parts : int
        Parts per band of a graph whose stores live off the device: the stores of two bands
        are on the device at a time (0 when the stores stay on the device).
    host_bytes_expected : int
        Peak bytes the plan expects to hold in host memory (results and memory-mapped pages
        of input files excepted).
    group_parts : int
        Consecutive column parts a graph screens against a row part in one launch
        (:func:`group_parts`; 1 for a search).
    graph_method : {"symmetric", "rows"}
        How a graph runs: blocks S(I, J), I ≤ J, each pair screened once for both its points;
        or ``parts`` chunks of ``part_size`` rows, each screened against the whole data as a
        search of ``k + 1`` neighbours is (the point itself dropped; ``Options.graph_rows_min_k``).
        The rows method's other fields are its search's (``query_rows``, ``sample_size``, ...).
    host_budget_note : str
        Empty, or why ``host_budget`` makes this plan much slower than the default host budget
        would and which budget avoids it (:func:`host_budget_note`); ``knng.search`` and
        ``knng.graph`` issue it as a :class:`KnngPerformanceWarning`.
    tiles_first : bool
        A search (or a graph by rows) takes each row's threshold from every corpus tile's
        minimum and screens only the tiles within it, with no sample (:func:`tiles_first`).
    search : EnginePlan or None
        A graph by rows: the plan of the search of the data against themselves it runs.
    share_index, share_count : int
        A graph run as one of ``share_count`` shares of the work (the ranks of a distributed
        graph): this run screens every own part (each row's first
        threshold) but only the groups of off-diagonal blocks whose ordinal is ``share_index``
        modulo ``share_count`` (by rows: only its rows, :func:`share_rows`), and returns every
        row's exact top k among the pairs it screened. The shares' lists merged give the graph.
        ``0, 1``: the whole graph.
    direct : bool
        A small call runs the direct path (:func:`knng.engine.search.direct_neighbours`, :func:`direct_applies`):
        every score in one product, each row's best few, a certificate, the exact finish. Rows
        whose certificate fails (near-ties past the few) run the rest of this plan: a search's
        rows its pipeline, a graph's rows a search by ``search``.
    uncompiled : bool
        On a GPU, the run uses torch's operations only, none of knng's compiled kernels
        (``Options.compiled_kernels`` off): the first call of its kind in the process, whose
        kernels compile in the background meanwhile (:func:`first_call_uncompiled`).
    escalate_pairs : int
        A symmetric graph whose store holds its survivors back: a row holding more than this
        many after a tightening stops taking survivors from the blocks and is searched again
        by ``escalation`` at the end (:func:`escalate_pairs`); 0: never.
    escalation : EnginePlan or None
        The float64-screened search of the escalated rows against the data (for k + 1
        neighbours, the point then dropped, as a graph by rows does).
    """

    operation: str
    n_queries: int
    n_corpus: int
    d: int
    k: int
    metric: str
    device: str
    screen_precision: str
    unit_roundoff: float
    thresholds: str
    sample_size: int
    capacity: int
    pending_pairs: int
    query_rows: int
    corpus_cols: int
    corpus_resident: bool
    parts: int
    part_size: int
    blocks: int
    frames: str
    bytes_expected: int
    budget: int
    budget_source: str
    host_budget: int = 0
    host_budget_source: str = ""
    read_rows: int = READ_ROWS
    lists: str = LISTS_ON_DEVICE
    band_parts: int = 0
    host_bytes_expected: int = 0
    group_parts: int = 1
    graph_method: str = GRAPH_SYMMETRIC
    host_budget_note: str = ""
    tiles_first: bool = False
    search: "EnginePlan | None" = None
    share_index: int = 0
    share_count: int = 1
    direct: bool = False
    uncompiled: bool = False
    escalate_pairs: int = 0
    escalation: "EnginePlan | None" = None

    @property
    def work_bytes(self) -> int:
        """Bytes the engine's temporary steps (a store's tightening, an exact re-rank chunk) may
        take: a sixteenth of the budget."""
        return max(1 << 16, self.budget // 16)

    @property
    def bands(self) -> int:
        """Bands of parts a graph runs in (1 when the stores stay on the device)."""
        if not self.band_parts or not self.parts:
            return 1
        return -(-self.parts // self.band_parts)

    @property
    def precision(self) -> ScreenPrecision:
        """The screen precision's rounding model (:data:`knng.metrics.PRECISIONS`)."""
        return PRECISIONS[self.screen_precision]

    @property
    def screen_torch_dtype(self) -> torch.dtype:
        """The type the prepared vectors are stored in."""
        return self.precision.storage

    def as_dict(self) -> dict:
        """Plain JSON values (what ``knng.json`` records and ``knng info --json`` prints)."""
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "EnginePlan":
        """The plan :meth:`as_dict` recorded (a checkpoint's), its graph's searches included."""
        nested = {name: None if values.get(name) is None else cls.from_dict(values[name])
                  for name in ("search", "escalation")}
        return cls(**{**values, **nested})


#: Below FLOAT16_SEARCH_MIN_D a search screens in TF32 (the fused kernel) when k ≤
#: FUSED_SEARCH_MAX_K. Measured on an H100 (2026-11-23, 10k queries against 1M Gaussian points,
#: one call each, ``bench/stage_times.py``; TF32 / float32 ms), before float16 took d ≥ 64 over:
#: d = 64, k = 32 66 / 97, k = 100 90 / 87, k = 300 121 / 117; d = 128, k = 32 78 / 103, k = 100
#: 111 / 115, k = 300 143 / 170; d = 256, k = 32 90 / 187, k = 100 116 / 173, k = 300 200 / 199;
#: d = 960, k = 100 249 / 504 (``docs/FINDINGS.md``, "Screen precision and kernels").
#: Below d = 64 nothing was measured. Graphs were slower in TF32 at every k measured (200k ×
#: 128: 360 / 320 ms at k = 10, 1,088 / 597 at k = 100).
FUSED_SEARCH_MAX_K = 16
#: Where the fused rule above holds, scaled float16 instead of TF32 from this dimension on: its
#: bound is half of TF32's (fewer pairs screened), its CUDA C kernel (``engine/kernels/cuda_screen.py``)
#: screens 10,000 × 1M × 128 in 14.6 ms where TF32's Triton kernel takes 22.9, and its survivors
#: cost a vote each. H100, 2026-11-24, 1M points, 10k queries (``bench/bench_fused.py --part
#: engine``; float16 / TF32 ms): d = 128, k = 100 86.3 / 110.2; d = 960, k = 10 151.8 / 177.8,
#: k = 100 203.9 / 258.7. Below d = 64 nothing was measured. From this dimension a search
#: screens in float16 at every k: once the finish took the last survivors in without the
#: store's capacity, it beat float32 at large k too (1M × 128, 10k queries, H100, 2026-11-24,
#: alternating fresh processes, ``bench/ab_precision.py``; float16 / float32 ms): k = 1,024 150,
#: 149 / 270, 272; k = 2,048 258, 256 / 400, 396; k = 4,096 500, 504 / 653, 652. It lost to float64
#: at k = 16,384 then (1,887 against 1,578 ms), and the float64 rule (k·d ≥ 2n) came first; with
#: today's holding stores it wins there and wherever that rule held (10k queries, H200,
#: 2026-11-27, one process, min of 3, every answer exact on 16 rows; float16 / float64 ms):
#: 1M × 128 k = 16,384 252 / 709; 1M × 960 k = 4,096 200 / 711; 200k × 128 k = 4,096 54 / 131;
#: 200k × 512 k = 1,024 30 / 93, k = 2,048 42 / 121; 100k × 128 k = 8,192 70 / 119; 50k × 128
#: k = 8,192 67 / 100; 20k × 256 k = 4,096 39 / 52; 20k × 128 k = 2,000 19 / 25; 16,384 × 4,096
#: k = 1,024 68 / 94.
FLOAT16_SEARCH_MIN_D = 64
#: Graphs screen in float16 up to this k and from this d, float32 otherwise. Their stores take in
#: every survivor of both sides (at k = 100 float16's 801 per row against float32's 409; on 8×8
#: image patches, whose flat regions let thousands through, p99 3,250 against 125), and with one
#: launch per block float16 lost at k = 100 and on the 8×8 patches. H100, 2026-11-24, min of calls,
#: float32 / float16 ms: Gaussian 200k × 128 in alternating fresh processes
#: (``bench/ab_precision.py``) k = 10 327.6, 337.4 / 279.2, 270.0, k = 100 620.9, 618.3 /
#: 758.8, 787.1; patches (``bench/bench_patches.py``'s, one process, alternating) 582k × 64,
#: k = 10 1,585, 1,457 / 1,585, 1,904; 250k × 256, k = 10 609, 587 / 544, 493.
#: With launches over several column parts (``Options.gpu_kernel_group_columns``) float16 won more widely
#: (H100, 2026-11-24, alternating fresh processes, ``bench/ab_group.py``, float32 / float16 ms):
#: 8×8 patches (582k × 64) k = 10 1,545, 1,487 / 798, 847, k = 100 2,021, 1,905 / 1,637, 1,562;
#: 200k × 128 k = 100 552, 549 / 492, 514, k = 300 1,174, 1,149 / 1,107, 1,053, k = 1,000 2,757,
#: 2,696 / 3,447, 3,451; 16×16 patches k = 100 758, 683 / 638, 613; 500k × 32, k = 10 1,130,
#: 1,104 / 476, 437. Below d = 32 nothing was measured.
FLOAT16_GRAPH_MAX_K = 300
FLOAT16_GRAPH_MIN_D = 32


#: On a CPU the screen is float64 where k ≥ n / this: a float64 product costs twice a float32 one
#: per row (n·d operations), a float32 screen leaves about k candidates per row to evaluate from
#: the input vectors (k·d values gathered), so the dimension cancels and k/n decides. 2 cores,
#: 2026-11-27, min of 3, graph / search of 500 queries, ms (every answer checked exact): d = 128,
#: n = 2,000 k = 100 float64 55 / 17 against float32 79 / 20; n = 10,000 k = 100 876 / 49 against
#: 909 / 48; k = 10 at n = 5,000 / 10,000 / 20,000 float32 103 / 275 / 742 against 115 / 334 /
#: 962; d = 512, n = 2,048 k = 100 float64 91 / 33 against 139 / 50; n = 10,000 k = 10 float32
#: 709 / 71 against 947 / 110; d = 960, n = 4,000 k = 10 float32 311 / 51 against 377 / 63. (The
#: rule before, float64 from k·d ≥ n/8, screened all of these k = 10 rows in float64.)
CPU_FLOAT64_ROWS_PER_K = 100


#: Smallest d from which a CPU screens integer data as integer rows (oneDNN's int8 products, exact
#: keys, no evaluation). 2-core CPU (AMX), 2026-11-30, graphs at k = 10 of uint8 patches of the
#: pictures (15,000 rows) and Gaussian values rounded to uint8, float32 screen against int8:
#: d = 64 0.35 / 0.42 s, 144 0.50 / 0.50, 128 (Gaussian) 0.59 / 0.46, 256 0.81 / 0.55, 512
#: (Gaussian) 0.57 / 0.20, 576 2.06 / 0.62, photon images (3,000 × 15,876) 5.13 / 3.78; searches
#: of 1,000 queries in 60,000 patches: d = 64 0.163 / 0.193 s, 128 0.184 / 0.150, 256 0.364 /
#: 0.283, 576 0.938 / 0.538.
CPU_INTEGER_MIN_D = 128


def choose_screen_precision(device: torch.device, n_corpus: int, d: int, k: int, operation: str = "search",
                            capabilities: DeviceCapabilities | None = None,
                            integers: IntegerExtent | None = None) -> str:
    """The screen precision that makes the exact answer cheapest.

    ``integers``: what is known of integer data under a translation-invariant metric
    (:class:`knng.metrics.IntegerExtent`; None for other data). Where they fit integer rows, on
    a GPU where the fused kernel runs, ``int8`` (exact products on the int8 tensor cores, exact
    keys: no bound, no evaluation below keys of 2²⁴) — except where the planner's choice for
    other data is scaled float16, the wgmma kernel runs at this d and float16 holds these
    products exactly (``IntegerExtent.exact_in_float16``): that tuned kernel won there. H200,
    2026-11-30 (``.carry`` experiment, graphs of uint8 patches of real pictures): 8×8 and 16×16
    patches at k = 10 / 100, exact float16 163 / 291 and 70 / 131 ms against int8 897 / 1,778
    and 269 / 432; 24×24 (d = 576) 208 / 250 against int8 112 / 198; 32×32 114 / 180 against 76
    / 110; 48×48 39 / 80 against 38 / 44; 300k photon-count images (d = 15,876) at k = 100,
    float64 28.2 s against int8 3.2 s. On a CPU, ``int8`` from d = :data:`CPU_INTEGER_MIN_D`.

    On a GPU where the fused kernel runs, scaled float16 for a search from d ≥
    :data:`FLOAT16_SEARCH_MIN_D`, at any k. Otherwise float64 on GPUs whose float64 products run
    at the float32 rate (A100, H100/H200, B200) once k·d outweighs the row length n — after a
    float32 screen every candidate a row keeps is evaluated from the input vectors (k·d values
    read per row), while a float64 screen pins most distances down by itself (the 16,384 × 4,096
    graph at k = 1,024: 58 ms against 110 by rows in float16 and 139 in float32, H200, 2026-11-27). Else,
    where the fused kernel runs, TF32 for a search below d = 64 with k ≤
    :data:`FUSED_SEARCH_MAX_K`; float16 for a graph with k ≤ :data:`FLOAT16_GRAPH_MAX_K` at
    d ≥ :data:`FLOAT16_GRAPH_MIN_D`; float32 otherwise. On a CPU float64
    from k ≥ n / :data:`CPU_FLOAT64_ROWS_PER_K` (its products cost twice float32 ones; see there),
    else float32.

    Why not more of the fused precisions (``knng.engine.kernels.fused``, ``docs/FINDINGS.md``, "Screen
    precision and kernels"): their kernel screens a 1M × 128 search in 20–35 ms of TF32 where the float32
    product and its select take ~80, but the wider bound lets 1.5–3× more pairs through to the
    candidate stores, whose bookkeeping then costs more than the product saved — except for
    searches at small k or large d. bfloat16 (4× the bound of TF32) lost everywhere measured.
    The digit screen (int8x4, float32's selectivity on int8 tensor cores) won only in parts of
    the range (d = 128, k = 100: 97 ms against TF32's 111; d = 256, k = 32 and 100: 110 and
    124 against 90 and 116), so the planner does not choose it.

    ``capabilities``: the device's (default: asked of ``device``; a test passes a GPU's).
    """
    caps = device if capabilities is None else capabilities  # asked of the device only where needed
    if device.type == "cuda":
        if integers is not None and integers.fit_integer_rows(d) and triton_runs(caps):
            other = choose_screen_precision(device, n_corpus, d, k, operation, capabilities)
            tuned = PRECISIONS[other].scaled and wgmma_runs(caps, scaled_width(d)) and integers.exact_in_float16()
            return other if tuned else "int8"
        # A search from d = 64 screens in float16 at any k (FLOAT16_SEARCH_MIN_D: measured
        # against float64 where the float64 rule held); the float64 rule is for the rest.
        if operation == "search" and d >= FLOAT16_SEARCH_MIN_D and triton_runs(caps):
            return "float16"
        if capabilities_of(caps).compute_capability in FAST_FP64_CAPABILITIES and k * d >= 2 * n_corpus:
            return "float64"
        if operation == "search" and k <= FUSED_SEARCH_MAX_K and triton_runs(caps):
            return "tf32"
        if operation == "graph" and k <= FLOAT16_GRAPH_MAX_K and d >= FLOAT16_GRAPH_MIN_D and triton_runs(caps):
            return "float16"
        return "float32"
    if integers is not None and integers.fit_integer_rows(d) and d >= CPU_INTEGER_MIN_D:
        return "int8"
    return "float64" if CPU_FLOAT64_ROWS_PER_K * k >= n_corpus else "float32"


def resolve_precision(screen_dtype: "torch.dtype | str | None", device: torch.device, n_corpus: int, d: int,
                      k: int, operation: str = "search", capabilities: DeviceCapabilities | None = None,
                      integers: IntegerExtent | None = None) -> str:
    """The precision a plan runs: the caller's (a name or torch dtype), ``Options.screen_precision``,
    or the planner's choice (``integers``: as :func:`choose_screen_precision`)."""
    if screen_dtype is None:
        screen_dtype = get_options().screen_precision
    if screen_dtype is None:
        return choose_screen_precision(device, n_corpus, d, k, operation=operation, capabilities=capabilities,
                                       integers=integers)
    return get_precision(screen_dtype).name


def resolve_host_budget(host_memory_budget: int | float | str | None) -> int:
    """Bytes of host memory the engine may hold: the user's ``host_memory_budget``, or
    :data:`HOST_AVAILABLE_SHARE` of the RAM available now."""
    if host_memory_budget is None:
        return int(available_ram() * HOST_AVAILABLE_SHARE)
    return parse_bytes(host_memory_budget, "host_memory_budget")


def host_budget_source(host_memory_budget: int | float | str | None) -> str:
    """Where :func:`resolve_host_budget` takes the budget from, in words."""
    if host_memory_budget is not None:
        return f"host_memory_budget={host_memory_budget!r}"
    return f"default: {HOST_AVAILABLE_SHARE:.0%} of available RAM"


def _read_rows(host_budget: int, d: int, largest: int) -> int:
    """Rows per read of a file-backed input: ``largest`` at most, and the read-ahead buffers
    (:data:`READ_AHEAD` blocks waiting, one being used, one being prepared) within an eighth
    of the host budget."""
    fit = host_budget // 8 // ((READ_AHEAD + 2) * max(1, d) * READ_VALUE_BYTES)
    return int(max(1, min(largest, fit)))


def budget_source(memory_budget: int | float | str | None, device: torch.device) -> str:
    """Where :func:`resolve_budget` takes the budget from, in words."""
    if memory_budget is not None:
        return f"memory_budget={memory_budget!r}"
    if device.type == "cuda":
        return f"default: {GPU_FREE_SHARE:.0%} of the free memory of {device}"
    return f"default: {CPU_AVAILABLE_SHARE:.0%} of available RAM, at most {CPU_BUDGET_CAP / 2**30:.0f} GiB"


def store_capacity(k: int, available: int) -> int:
    """Candidates per row before a tightening: room for k and the usual near-ties.

    Small is fast: a full store tightens its threshold, and a tight threshold lets fewer pairs
    through every later block. Measured on 2 CPU cores, 32,000 × 64, k = 10 (Gaussian / camera
    patches): capacity k + 8 3.9 s / 4.9 s, 2k + 16 4.6 s / 6.0 s, 4k + 16 4.9 s / 7.1 s.
    """
    extra = get_options().store_extra
    return int(min(available, k + (max(8, k // 4) if extra is None else extra)))


#: A search's store capacity on a GPU: GPU_SEARCH_CAPACITY_PER_K·k + GPU_SEARCH_CAPACITY_EXTRA. A
#: GPU's store update costs its launches, not its width; with room for the near-ties no row
#: has to evaluate them exactly before the finish (1M × 128, 10k queries, float16, k = 10,
#: H100, 2026-11-24: k + 8 left 17 rows overflowing, 2k + 16 none; 28.9–29.7 ms against
#: 34.5–36.9; 4k + 32 30.2–33.1).
GPU_SEARCH_CAPACITY_PER_K = 2
GPU_SEARCH_CAPACITY_EXTRA = 16


def search_capacity(k: int, available: int, device: torch.device) -> int:
    """A search's candidates per row: :func:`store_capacity` on a CPU, wider on a GPU."""
    if device.type == "cuda":
        return int(min(available, GPU_SEARCH_CAPACITY_PER_K * k + GPU_SEARCH_CAPACITY_EXTRA))
    return store_capacity(k, available)


#: Survivors a GPU graph's store lets wait when it takes them in as it goes (blocks centred on
#: their own parts: image patches in principal slabs, whose stores cannot hold survivors back;
#: ``knng.engine.graph``), where Options.pending_gpu is how often a holding store tightens. H200,
#: 2026-11-26, one process, alternating, min of 2 (2²² / 2²³ / 2²⁴ / 2²⁵, ms): 8×8 patches
#: (582k × 64) k = 10 440, 449 / 415, 429 / 397, 403 / 392, 397; k = 100 905, 904 / 876, 875 /
#: 871, 875 / 871, 866; 16×16 patches (250k × 256) k = 10 224, 222 / 213, 212 / 206, 203 / 221,
#: 199 (22 store updates of ~515 launches each at 2²² on the 8×8 patches).
PENDING_GPU_UPDATES = 1 << 24


#: A GPU search lets its survivors wait for the finish, within 1/SEARCH_PENDING_SHARE of the
#: budget: its tiles tighten the thresholds themselves (``Options.tighten_on``), so a
#: store update in between changes no threshold a launch uses; it would only sort everything the
#: rows hold again, where the finish's last take-in sorts each pair once and needs no capacity
#: (1M × 128, 10k queries, k = 1,024: three updates of about 40M pairs, 51 ms of GPU time, before
#: held survivors; 109–113 → 103–106 ms). None: the graphs' Options.pending_gpu.
SEARCH_PENDING_SHARE: int | None = 4


def pending_pairs(device: torch.device, budget: int, search: bool = False, updates: bool = False) -> int:
    """Survivors a store may hold pending: the device's measured best, within 1/8 of the budget
    (a GPU search: as many as 1/:data:`SEARCH_PENDING_SHARE` of the budget holds; ``updates``:
    a GPU graph store that takes its survivors in as it goes, :data:`PENDING_GPU_UPDATES`)."""
    if search and device.type == "cuda" and SEARCH_PENDING_SHARE:
        return int(max(1024, budget // SEARCH_PENDING_SHARE // get_options().pending_pair_bytes))
    best = (PENDING_GPU_UPDATES if updates else get_options().pending_gpu) if device.type == "cuda" else get_options().pending_cpu
    return int(max(1024, min(best, budget // 8 // get_options().pending_pair_bytes)))


#: Survivors a GPU graph's store holds back (``knng.engine.graph``) take at most this share of
#: the budget (``Options.pending_pair_bytes`` each: the pair, its radius, and their copies while
#: they tighten); beyond it they are taken into the store, whose capacity bounds them.
HELD_SHARE = 4


def holds_survivors(device: torch.device, precision: ScreenPrecision) -> bool:
    """Whether a graph's store on ``device`` holds its survivors back: a kernel's screen
    (``precision.kernel``) on a device of ``Options.hold_on``
    (:func:`knng.engine.graph.holding_for`; the planner's escalation reads the same rule)."""
    return device.type in get_options().hold_on and precision.kernel


def held_pairs_limit(n: int, capacity: int, pending: int) -> int:
    """Held survivors beyond which a graph's holding store takes them in: as many as its own
    entries (``n`` rows of ``capacity``), and never fewer than four flushes' worth (``pending``
    each). What the limit bounds is a row's near-ties (thousands of duplicates), which the
    store's tables keep to a row's capacity.

    Not a share of the budget: where the held survivors are about as
    many as the store's entries, taking them in costs more memory and time than holding them
    (the tables, 32 bytes an entry, and each update's copies). One H200, ``bench/bench_memory.py``,
    the limit a quarter of the budget against this one: 582k 8×8 patches at k = 100 under
    8 GB peaked at 14.6 GB in 0.44 s (8.6 GB in 0.56–0.65 s with the take-in a flush at a time)
    against 6.0 GB in 0.32–0.36 s; 1M × 128 Gaussian points at k = 10 under 1 GB 3.3 GB in
    1.15 s against 2.7 GB in 0.70 s."""
    return int(max(4 * pending, n * capacity))


#: Bytes a held survivor costs while it is taken into the tables (its float64 key, the update's
#: sorted copies and the merge): 1M points of a 3-D manifold in 64 dimensions at k = 32 (40M held
#: survivors over the limit) peaked 3.7 GiB higher taking them in at once than a flush's 4.2M at
#: a time (one H200, ``bench/bench_memory.py --data manifold``).
TAKE_IN_PAIR_BYTES = 100


def held_take_in_step(limit: int, pending: int, budget: int) -> int:
    """Held survivors a graph's holding store takes into its tables at a time: its ``limit`` (the
    store's own entries, :func:`held_pairs_limit`) where an eighth of the ``budget`` holds them at
    :data:`TAKE_IN_PAIR_BYTES` each, else what it holds, and never less than a flush's worth
    (``pending``).

    Every update merges the whole table, so steps of a flush cost time: the manifold graph above
    took 1.55 s in steps of its limit and 1.88 s in flushes (−18 %; at k = 10 1.08 against 1.21 s),
    peaking at 11.8 against 8.1 GiB; under a 4 GB budget the step is a flush's worth again."""
    return int(max(pending, min(limit, budget // 8 // TAKE_IN_PAIR_BYTES)))


#: Held survivors of one row above which a graph escalates it, at least, per candidate its
#: store keeps (:func:`escalate_pairs`): a row at k = 100 holds hundreds by itself.
ESCALATE_PER_CAPACITY = 16
#: Values of the data (n · d) per held survivor at which a row's float64 search costs about as
#: much as keeping its survivors (:func:`escalate_pairs`).
ESCALATE_VALUES_PER_PAIR = 32768


def escalate_pairs(n: int, d: int, capacity: int) -> int:
    """Held survivors above which a graph's row is escalated: searched again at the end with a
    float64 screen (``EnginePlan.escalation``) instead of taking every survivor of every block.

    A row of near-duplicates off a lattice (dark image patches in linear light) passes a
    float16 screen with thousands of neighbours, each held, tightened, taken into the tables and
    evaluated; its float64 search costs 2·n·d products on the float64 units and leaves it a
    few. The count is the larger of :data:`ESCALATE_PER_CAPACITY` times the store's
    ``capacity`` and n·d / :data:`ESCALATE_VALUES_PER_PAIR`; ``Options.escalate_pairs``
    overrides (0: never)."""
    given = get_options().escalate_pairs
    if given is not None:
        return max(0, int(given))
    return int(max(ESCALATE_PER_CAPACITY * capacity, n * d // ESCALATE_VALUES_PER_PAIR))


#: Bytes a held survivor takes while the held lists tighten (the joined lists, 28 bytes; the
#: float64 upper bounds and their float32 rounding; the float64 keys of the keep test): the
#: 582k-point patch graph at k = 100 peaked at 6.0 GB holding 72M pairs, 3.6 GB of it theirs.
HELD_PAIR_BYTES = 56


def _store_bytes(rows: int, capacity: int) -> int:
    return rows * (capacity * 25 + 40)  # key, index, distance (8 B each), flags


@dataclass(frozen=True)
class RadiusPlan:
    """How a radius query (:func:`knng.engine.radius.exact_radius`) runs within its budget.

    Attributes
    ----------
    query_rows, corpus_cols : int
        A chunk's queries and a block's corpus vectors: their score block and its candidacy mask
        take at most a quarter of the budget.
    corpus_resident : bool
        Whether the centred corpus is kept on the device (it takes at most a quarter of the
        budget); else each query chunk reads the corpus again, block by block.
    max_pairs : int
        Pairs found that the budget holds (a quarter of it, 24 bytes each: row, column,
        distance); a query that finds more stops with an error.
    budget : int
        The memory budget in bytes the plan was made for.
    """

    query_rows: int
    corpus_cols: int
    corpus_resident: bool
    max_pairs: int
    budget: int


#: Bytes of a radius query's score block per entry: the score, the mask, and the compare's
#: temporaries.
RADIUS_BLOCK_BYTES = 16
#: Scores of a radius query's block on a CPU at most: blocks that stay in the caches.
RADIUS_CPU_BLOCK_SCORES = 1 << 21


def make_radius_plan(*, n_queries: int, n_corpus: int, d: int, device: torch.device, budget: int,
                     element_bytes: int = 4) -> RadiusPlan:
    """The plan of a radius query of ``n_queries`` against ``n_corpus`` vectors of dimension
    ``d`` (the product's ``element_bytes`` a value) within ``budget`` bytes (:class:`RadiusPlan`).

    On a GPU, query chunks as long as its search chunks at most (16,384 rows) against corpus
    blocks of up to 65,536 columns. On a CPU, blocks of :data:`RADIUS_CPU_BLOCK_SCORES` scores
    that stay in the caches, as many queries as possible (1,024) against few columns: chunks of
    few queries read the whole corpus from memory again for each (1,000 queries against
    100,000 × 64 in chunks of 20: 444 ms, 208 of them the products; scikit-learn 266).
    """
    vector_bytes = d * element_bytes + 8
    resident = n_corpus * vector_bytes <= budget // 4
    block = max(1, budget // 4 // RADIUS_BLOCK_BYTES)
    if device.type == "cuda":
        rows = max(1, min(n_queries, 16384, block // max(1, min(n_corpus, 1 << 16))))
    else:
        block = min(block, RADIUS_CPU_BLOCK_SCORES)
        rows = max(1, min(n_queries, 1024, block))
    cols = max(1, min(n_corpus, block // rows))
    return RadiusPlan(query_rows=rows, corpus_cols=cols, corpus_resident=resident,
                      max_pairs=max(1, budget // 4 // 24), budget=budget)


#: Metrics the direct path serves: their score is the expansion ‖c‖² − 2 q·c, whose rounding
#: its certificate bounds.
DIRECT_METRICS = frozenset({"euclidean", "sqeuclidean"})
#: Bytes of the budget the direct path's copies of the corpus (read whole, then centred: at most
#: 8 B a value each) may take, as a share: the rest is for the score chunks
#: (:attr:`EnginePlan.work_bytes`).
DIRECT_INPUT_SHARE = 4


def direct_applies(*, n_queries: int, n_corpus: int, d: int, metric: str, device: torch.device, budget: int,
                   host_budget: int | None = None, graph: bool = False,
                   screen_dtype: "torch.dtype | str | None" = None, part_size: int | None = None,
                   method: str | None = None, recorded: bool = False, k: int = 1) -> bool:
    """Whether a call runs the direct path (:attr:`EnginePlan.direct`): at most
    ``Options.direct_max_scores`` scores on a CPU, ``direct_max_scores_gpu`` on a GPU (a ``graph``: n²), a
    metric of :data:`DIRECT_METRICS`, the corpus within a :data:`DIRECT_INPUT_SHARE`-th of the
    budget in float64, and of the share of the host budget a plan may hold (``host_budget``,
    default :func:`resolve_host_budget`'s: the direct path reads the whole corpus). Not where the
    caller steered the pipeline: a screen precision (``screen_dtype`` or
    ``Options.screen_precision``), a graph's part size or method (``method`` or
    ``Options.graph_method``), nor where a checkpoint records the run (``recorded``: the caller
    asked for steps saved as it goes; the command line always records). Not on a GPU where k·d ≥
    2·n_corpus: there the pipeline screens in float64 (:func:`choose_screen_precision`), which
    pins most distances by itself, while the direct path evaluates every one of its k + m
    candidates a row from the inputs (the 16,384 × 4,096 graph at k = 1,024, H200: 143–148 ms by
    the direct path on 2026-11-30 against 46–48 by the pipeline on 2026-11-29). Integer data take
    it as any data (the same rule; the API asks it before it looks for integer data). The API
    asks it before folding duplicates, which a direct call skips."""
    options = get_options()
    steered = screen_dtype is not None or options.screen_precision is not None or \
        (graph and (part_size is not None or method is not None or options.graph_method is not None))
    if steered or recorded or metric not in DIRECT_METRICS:
        return False
    if device.type == "cuda" and k * d >= 2 * n_corpus:
        return False
    most = options.direct_max_scores if device.type == "cpu" else options.direct_max_scores_gpu
    host = int((resolve_host_budget(None) if host_budget is None else host_budget) * HOST_PLAN_SHARE)
    return 0 < n_queries * n_corpus <= most and \
        n_corpus * d * 8 * DIRECT_INPUT_SHARE <= min(budget, host)


def _uncompiled(device: torch.device) -> bool:
    """Whether a plan for ``device`` runs without compiled kernels (:attr:`EnginePlan.uncompiled`)."""
    return device.type == "cuda" and not get_options().compiled_kernels


def call_kind(operation: str, device: torch.device, d: int, dtype: object, metric: str, k: int) -> tuple:
    """What decides which kernels (and which of their specialisations) a call compiles on
    ``device``: its kind, for :func:`first_call_uncompiled` and ``knng.engine.kernels.compiling``.
    Sizes are left out: the kernels do not specialise on sizes that follow the data
    (``knng.engine.kernels``), and those the plan fixes seldom change what compiles."""
    return operation, str(device), int(d), str(dtype), metric, int(k)


def first_call_uncompiled(kind: tuple, *, scores: int, device: torch.device, recorded: bool = False) -> bool:
    """Whether a call of ``kind`` with ``scores`` scores (queries × corpus rows) runs without
    compiled kernels (``Options.compiled_kernels`` off), its kernels compiled in the background
    (``knng.engine.kernels.compiling``): on a GPU where knng's kernels are installed, the first
    call of its kind in the process (none compiled, none ran), up to
    ``Options.uncompiled_max_scores`` scores, where ``Options.background_compile`` is on and
    no checkpoint records the run (a resumed run must take the recorded plan).

    A first call compiles its kernels before it runs, otherwise: several seconds with empty
    kernel caches, about one second to load them from warm ones (``docs/STARTUP.md``), where
    torch's operations take about ten times the kernels' time.
    """
    options = get_options()
    return (device.type == "cuda" and not recorded and options.background_compile and options.compiled_kernels
            and 0 < scores <= options.uncompiled_max_scores and kernels_installed()
            and not kind_ready(kind))


def make_search_plan(*, n_queries: int, n_corpus: int, d: int, k: int, metric: str, device: torch.device,
                     budget: int, source: str = "", screen_dtype: "torch.dtype | str | None" = None,
                     host_budget: int | None = None, host_source: str = "",
                     capabilities: DeviceCapabilities | None = None, recorded: bool = False,
                     integers: IntegerExtent | None = None) -> EnginePlan:
    """The plan of a search of ``n_queries`` against ``n_corpus`` vectors of dimension ``d``.

    ``integers``: what is known of the queries and the corpus together as integer data
    (:class:`knng.metrics.IntegerExtent`; None for other data), as in :func:`make_graph_plan`:
    where :func:`choose_screen_precision` takes integer rows, no direct path.

    ``host_budget``: bytes of host memory (default :func:`resolve_host_budget`'s); on a CPU it
    caps ``budget``, on a GPU it caps the streamed tiles (read through pinned buffers). Where it
    makes the search much slower than the default host budget would, the plan's
    ``host_budget_note`` says so (:func:`host_budget_note`). ``capabilities``: the device's
    (default: asked of ``device`` once; a test plans for a GPU it does not have by passing them).
    """
    same = dict(n_queries=n_queries, n_corpus=n_corpus, d=d, k=k, metric=metric, device=device, budget=budget,
                source=source, screen_dtype=screen_dtype, host_source=host_source,
                capabilities=capabilities, integers=integers if get_metric(metric).translation_invariant else None)
    plan = _search_plan(host_budget=host_budget, **same)
    if direct_applies(n_queries=n_queries, n_corpus=n_corpus, d=d, metric=metric, device=device, budget=budget,
                      k=k, host_budget=host_budget,
                      screen_dtype=screen_dtype, recorded=recorded):
        plan = replace(plan, direct=True)
    if host_budget is None:  # the default: nothing to compare with
        return plan
    return _with_host_budget_note(plan, lambda host: _search_plan(host_budget=host, **same))


def _search_plan(*, n_queries: int, n_corpus: int, d: int, k: int, metric: str, device: torch.device,
                 budget: int, capabilities: DeviceCapabilities | None, source: str = "",
                 screen_dtype: "torch.dtype | str | None" = None, host_budget: int | None = None,
                 host_source: str = "", integers: IntegerExtent | None = None) -> EnginePlan:
    """:func:`make_search_plan` without its host budget's note."""
    if host_budget is None:
        host_budget, host_source = resolve_host_budget(None), host_budget_source(None)
    given_host, host_budget = host_budget, int(host_budget * HOST_PLAN_SHARE)
    if device.type == "cpu":
        budget = min(budget, host_budget)
    caps = device if capabilities is None else capabilities  # asked of the device only where needed
    precision = resolve_precision(screen_dtype, device, n_corpus, d, k, capabilities=capabilities,
                                  integers=integers)
    element = 8 if precision == "float64" else 4  # score blocks are float32 below float64
    capacity = search_capacity(k, n_corpus, device)
    max_cols = get_options().gpu_search_cols if device.type == "cuda" else None
    if device.type == "cuda":
        # A streamed corpus's tiles pass through pinned host buffers (READ_AHEAD + 1 of them).
        max_cols = max(MIN_TILE, min(max_cols, _read_rows(host_budget, d, max_cols)))
    tiles = plan_tiles(n_queries=n_queries, n_corpus=n_corpus, d=d, k_cand=capacity, budget=budget, device=device,
                       element_bytes=element, max_cols=max_cols, k=k)
    kernel = device.type == "cuda" and (PRECISIONS[precision].fused or PRECISIONS[precision].integers) \
        and triton_runs(caps)
    base = min(get_options().gpu_sample, max(GPU_MIN_SAMPLE, GPU_SAMPLE_PER_K * k)) if device.type == "cuda" else get_options().cpu_sample
    vector = d * element + 24
    # The sample's prepared vectors and its score block take at most an eighth of the budget. The
    # kernel's strip minima write no score block, only a key and a column per row and strip
    # (seeds, search.py): a graph's rows method at k = 100 (chunks of 50,000 rows) took 42,545
    # columns where a score block was counted and 65,536 without.
    # (Decided on the fewest columns the sample can then have, as the search decides on its own.)
    strips = (kernel and tiles.corpus_resident
              and strip_seeds_run(caps, PRECISIONS[precision], min(n_corpus, base), k))
    if kernel and tiles.corpus_resident:  # no score block: chunks of more rows (Options.kernel_search_rows)
        rows = min(n_queries, get_options().kernel_search_rows, get_options().kernel_search_pairs // max(1, k))
        # No more rows than let the whole sample's seeds fit their eighth of the budget: a
        # smaller sample would start every row's threshold looser.
        row_bytes = 8 / strip_width() if strips else element
        rows = min(rows, max(1, int((budget // 8 // min(n_corpus, base) - vector) / row_bytes)))
        rows = max(tiles.query_rows, rows)
        # Chunks of equal size: each pays the same fixed price, and a tail of a few rows would
        # pay it for nothing (200k rows in chunks of 65,536 left a last chunk of 3,392).
        rows = -(-n_queries // -(-n_queries // rows))
        tiles = TilePlan(query_rows=rows, corpus_cols=tiles.corpus_cols, corpus_resident=True, budget=budget)
    read_rows = _read_rows(host_budget, d, max(READ_ROWS, tiles.corpus_cols))
    column_bytes = -(-tiles.query_rows * 8 // strip_width()) if strips else tiles.query_rows * element
    fit = budget // 8 // (vector + column_bytes)
    sample = int(min(n_corpus, max(min(base, fit), SAMPLE_PER_K * k)))
    pending = pending_pairs(device, budget, search=True)
    # A kernel screen holds survivors (a few k per row) where a torch screen holds its score block.
    block = (tiles.query_rows * k * 4 * get_options().pending_pair_bytes if kernel and tiles.corpus_resident else
             tiles.query_rows * tiles.corpus_cols * element * 3)
    expected = (_store_bytes(tiles.query_rows, capacity) + block + pending * get_options().pending_pair_bytes
                + (n_corpus * vector if tiles.corpus_resident else tiles.corpus_cols * vector)
                + sample * vector + n_corpus * 16)
    reads = (READ_AHEAD + 2) * d * READ_VALUE_BYTES * max(read_rows, 0 if tiles.corpus_resident else tiles.corpus_cols)
    host = reads + (expected if device.type == "cpu" else 0)
    plan = EnginePlan(
        operation="search", n_queries=n_queries, n_corpus=n_corpus, d=d, k=k, metric=metric, device=str(device),
        screen_precision=precision, unit_roundoff=PRECISIONS[precision].input_roundoff,
        thresholds=f"k-th best certified upper bound among {sample} random columns, then tightened as rows fill",
        sample_size=sample, capacity=capacity, pending_pairs=pending, query_rows=tiles.query_rows,
        corpus_cols=tiles.corpus_cols, corpus_resident=tiles.corpus_resident, parts=0, part_size=0, blocks=0,
        frames=GLOBAL_FRAMES, bytes_expected=int(expected), budget=budget, budget_source=source or "given",
        host_budget=given_host, host_budget_source=host_source or "given", read_rows=read_rows,
        host_bytes_expected=int(host), uncompiled=_uncompiled(device))
    # Tiles first where the screen tightens its own thresholds (a GPU's: Options.tighten_on) and
    # the tiles pay (tiles_first): then no sample.
    if device.type in get_options().tighten_on and tiles_first(plan, caps):
        plan = replace(plan, sample_size=0, thresholds=TILES_FIRST_THRESHOLDS, tiles_first=True)
    return plan


#: A tiles-first search's thresholds (:attr:`EnginePlan.thresholds`).
TILES_FIRST_THRESHOLDS = ("k-th smallest of the rows' minima over every 128-column corpus tile; then only the tiles "
                          "within each row's threshold screened, and every survivor evaluated exactly")


#: Share of the device budget the stores of two bands may take when the stores live off the device.
BAND_SHARE = 4
#: Bytes per row a band's slot adds beside its store: the rows' norms, terms and offsets.
SLOT_BYTES = 32


def _seed_row_bytes(caps: "DeviceCapabilities | torch.device", precision: str, k: int, m: int | None = None) -> int:
    """Bytes a row of a part of ``m`` (unbounded: None) takes while a kernel seeds its own
    block: the keys and columns of its strip minima where they seed it, else a float32 sample
    block of ``Options.own_part_seed`` columns."""
    count = strip_seed_count(m or (1 << 62), k)
    if strip_seeds_run(caps, precision, count, k):
        return 8 * -(-count // strip_width())
    return min(m or (1 << 62), get_options().own_part_seed) * BLOCK_BYTES_PER_ELEMENT


def _kernel_side(room: int, caps: "DeviceCapabilities | torch.device", precision: str, k: int, stream: int,
                 limit: int) -> int:
    """The largest part, at most ``limit``, whose own block's seed and ``stream`` bytes a row fit
    ``room``: seeded by strip minima where a part that large has 2k strips, else by a float32
    sample block of ``Options.own_part_seed`` columns (the whole part where it is narrower)."""
    side = min(limit, room // (_seed_row_bytes(caps, precision, k) + stream))
    if side * (_seed_row_bytes(caps, precision, k, side) + stream) <= room:
        return side
    sample = get_options().own_part_seed
    wide = room // (sample * BLOCK_BYTES_PER_ELEMENT + stream)
    return min(limit, wide if wide >= sample else math.isqrt(room // BLOCK_BYTES_PER_ELEMENT))


def group_parts(*, kernel: bool, resident: bool, lists: str, parts: int, part_size: int) -> int:
    """Column parts one off-diagonal launch of a graph screens (``Options.gpu_kernel_group_columns``
    columns): only where a kernel screens (nothing is materialised, so a launch's memory does
    not grow with its columns), the prepared corpus is resident (a group's columns are one
    slice of it) and the stores stay on the device; else one."""
    forced = get_options().group_parts
    if forced is not None:
        return forced
    if not (kernel and resident and lists == LISTS_ON_DEVICE):
        return 1
    return int(max(1, min(parts - 1, get_options().gpu_kernel_group_columns // max(1, part_size))))


def make_graph_plan(*, n: int, d: int, k: int, metric: str, device: torch.device, budget: int, include_self: bool,
                    source: str = "", screen_dtype: "torch.dtype | str | None" = None,
                    part_size: int | None = None, host_budget: int | None = None,
                    host_source: str = "", method: str | None = None,
                    slab_gain: Callable[[int], float] | None = None,
                    capabilities: DeviceCapabilities | None = None,
                    share: tuple[int, int] = (0, 1), recorded: bool = False,
                    integers: IntegerExtent | None = None) -> EnginePlan:
    """The plan of the k-NN graph of ``n`` vectors: parts, blocks, stores and both budgets.

    ``integers``: what is known of integer data (:class:`knng.metrics.IntegerExtent`,
    ``knng.engine.common.integer_extent_of`` looks; None for other data): under a
    translation-invariant metric, where :func:`choose_screen_precision` takes integer rows
    (``int8``), the graph runs by symmetric blocks around one integer centre.

    ``method``: :data:`GRAPH_SYMMETRIC` or :data:`GRAPH_ROWS` (see :attr:`EnginePlan.graph_method`);
    default ``Options.graph_method``, else the planner's choice (:func:`rows_method_wins`). Where principal frames could run,
    ``slab_gain`` — the data's description: how much slabs of a given number of parts shrink the
    squared norms, from a look at a sample (``knng.engine.graph.frames.slab_gain_of``) — decides
    whether they do (``Options.principal_min_gain``) and whether the rows method may replace
    them; it is asked only there.

    The candidate stores of all rows stay on the device when they take at most half its budget
    (on a CPU: half the host budget, results included). Otherwise they live in pinned host
    memory (a GPU, when half the host budget holds them) or in a memory-mapped file, and the
    graph runs in bands of parts whose stores, two bands at a time, fit a quarter of the device
    budget. ``host_budget`` (default :func:`resolve_host_budget`'s) caps a CPU's ``budget``
    and, on any device, the read buffers of a file-backed input. Where it makes the graph much
    slower than the default host budget would, the plan's ``host_budget_note`` says so
    (:func:`host_budget_note`). ``capabilities``: the device's (default: asked of ``device`` once;
    a test plans for a GPU it does not have by passing them).
    """
    if method is None:
        method = get_options().graph_method
    same = dict(n=n, d=d, k=k, metric=metric, device=device, budget=budget, include_self=include_self, source=source,
                screen_dtype=screen_dtype, part_size=part_size, host_source=host_source, method=method,
                capabilities=capabilities,
                integers=integers if get_metric(metric).translation_invariant else None)
    index, count = _checked_share(share)
    direct = count == 1 and direct_applies(n_queries=n, n_corpus=n, d=d, metric=metric, device=device, budget=budget,
                                           k=k, host_budget=host_budget, graph=True,
                                           screen_dtype=screen_dtype, part_size=part_size, method=method,
                                           recorded=recorded)
    # A direct graph's blocks never run: it takes no look at the data for principal frames.
    plan = _graph_plan(host_budget=host_budget, slab_gain=None if direct else slab_gain, direct=direct, **same)
    if direct:
        # The rows the direct path cannot certify are searched (k + 1, the point then dropped,
        # as the rows method does) by this plan.
        search = plan.search or replace(make_search_plan(
            n_queries=n, n_corpus=n, d=d, k=graph_search_k(k, include_self), metric=metric, device=device,
            budget=budget, host_budget=host_budget, host_source=host_source, capabilities=capabilities),
            direct=False)
        plan = replace(plan, direct=True, search=search)
    if host_budget is not None:
        # The plans it is compared with look at no sample of the data (frames change no estimate).
        plan = _with_host_budget_note(plan, lambda host: _graph_plan(host_budget=host, **same))
    return with_share(plan, index, count)


def with_share(plan: EnginePlan, index: int, count: int) -> EnginePlan:
    """``plan`` (of a whole graph, or of any share of it) run as share ``index`` of ``count``
    (:attr:`EnginePlan.share_index`): a graph by rows searches that share's rows only."""
    index, count = _checked_share((index, count))
    start, stop = share_rows(plan.n_corpus, index, count)
    if ((index, count) == (plan.share_index, plan.share_count) and (count == 1 or not plan.direct)
            and (plan.search is None or plan.search.n_queries == stop - start)):
        return plan  # already so (every one-device plan: a copy costs a small call 30 µs)
    search = None if plan.search is None else replace(plan.search, n_queries=stop - start)
    # A share screens its part of the blocks: never the direct path's every pair.
    return replace(plan, share_index=index, share_count=count, search=search, direct=plan.direct and count == 1)


def _checked_share(share: tuple[int, int]) -> tuple[int, int]:
    index, count = (int(v) for v in share)
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"share must be (index, count) with 0 <= index < count, got {share!r}")
    return index, count


def share_rows(n: int, index: int, count: int) -> tuple[int, int]:
    """Rows ``start:stop`` of share ``index`` of ``count`` of a graph by rows (nearly equal,
    contiguous)."""
    return n * index // count, n * (index + 1) // count



def _graph_plan(*, n: int, d: int, k: int, metric: str, device: torch.device, budget: int, include_self: bool,
                capabilities: DeviceCapabilities | None, source: str = "",
                screen_dtype: "torch.dtype | str | None" = None,
                part_size: int | None = None, host_budget: int | None = None,
                host_source: str = "", method: str | None = None,
                slab_gain: Callable[[int], float] | None = None,
                integers: IntegerExtent | None = None, direct: bool = False) -> EnginePlan:
    """:func:`make_graph_plan` without its host budget's note. ``direct``: the blocks of a direct
    graph's plan, which run only where the inputs are not finite (to name the first bad row):
    the symmetric blocks, without an escalation search or a comparison with the rows method,
    which would cost a small call two more plans of its host time."""
    if host_budget is None:
        host_budget, host_source = resolve_host_budget(None), host_budget_source(None)
    given_host, host_budget = host_budget, int(host_budget * HOST_PLAN_SHARE)
    if device.type == "cpu":
        budget = min(budget, host_budget)
    available = n if include_self else n - 1
    caps = device if capabilities is None else capabilities  # asked of the device only where needed
    precision = resolve_precision(screen_dtype, device, n, d, k, operation="graph", capabilities=capabilities,
                                  integers=integers)
    element = 8 if precision == "float64" else 4  # score blocks are float32 below float64
    capacity = store_capacity(k, available)
    integer_rows = PRECISIONS[precision].integers
    vector = d + INTEGER_TAIL + 16 if integer_rows else d * element + 24
    store = _store_bytes(n, capacity)
    results = n * k * 16  # the engine's int64 indices and float64 distances
    if device.type == "cuda":
        lists = (LISTS_ON_DEVICE if store <= budget // 2 else
                 LISTS_IN_HOST if store + results <= host_budget // 2 else LISTS_ON_DISK)
    else:
        lists = LISTS_ON_DEVICE if store + results <= host_budget // 4 else LISTS_ON_DISK
    working = store if lists == LISTS_ON_DEVICE else budget // BAND_SHARE
    corpus_bytes = n * vector
    resident = corpus_bytes + working <= budget // 2
    remaining = max(budget - working - (corpus_bytes if resident else 0), budget // 8)
    kernel = PRECISIONS[precision].kernel
    kernel = kernel and device.type == "cuda" and triton_runs(caps)
    ks = min(k, available)
    side = n  # bounded by what each part holds beside its block
    if lists != LISTS_ON_DEVICE:
        # Stores paged in bands: a band of one part, two at a time, fits the band's share.
        side = min(side, max(MIN_TILE, working // (2 * (capacity * 25 + 40 + SLOT_BYTES))))
    if not resident:
        side = min(side, max(MIN_TILE, remaining // 4 // vector))
        # Every block reads its column part through a host buffer.
        side = min(side, max(MIN_TILE, host_budget // 4 // (2 * d * READ_VALUE_BYTES)))
    if kernel:
        # A kernel writes no block: what grows with a part is the seed of its own block, per
        # row a sample of columns (or its strip minima), and the two parts' prepared rows that
        # stream beside a block where the corpus is not resident; the survivors held back take
        # their own share.
        side = _kernel_side(max(1, remaining - budget // HELD_SHARE), caps, precision, ks,
                            0 if resident else 2 * vector, side)
    else:
        side = min(side, math.isqrt(max(1, remaining // (BLOCK_BYTES_PER_ELEMENT * element // 4))))
    if device.type != "cuda":
        cap = get_options().cpu_max_part
    elif not kernel:
        cap = get_options().gpu_max_part
    else:
        cap = get_options().gpu_kernel_max_part
        if triangle_runs(caps, precision, d):
            cap = get_options().gpu_triangle_max_part_small_k if k <= TRIANGLE_SMALL_K else get_options().gpu_triangle_max_part
    b = part_size or int(min(n, cap, max(side, MIN_TILE)))
    b = max(1, min(n, max(b, k + 1 if not include_self else k)))  # the diagonal block seeds τ
    parts = -(-n // b)
    band_parts = 0
    if lists != LISTS_ON_DEVICE:
        per_part = 2 * b * (capacity * 25 + 40 + SLOT_BYTES)
        band_parts = int(max(1, (budget // BAND_SHARE) // per_part))
        if 2 * band_parts >= parts:  # two bands hold everything: no need to page
            lists, band_parts, working = LISTS_ON_DEVICE, 0, store
    pending = pending_pairs(device, budget)
    # Principal frames keep, beside the prepared parts, their query layouts and a sorted copy
    # of the inputs (at most as large as the prepared corpus again); their windows read every
    # row's threshold, so the stores must stay on the device.
    # (Not for integer rows: they need one integer centre that puts every value in int8's range.)
    slabs = (parts > 1 and get_metric(metric).translation_invariant and lists == LISTS_ON_DEVICE
             and not integer_rows)
    principal = slabs and 3 * corpus_bytes + store <= budget // 2
    # Where a sample of the data says their slabs gain little (Gaussian-like data), one centre
    # and the parts in their own order (``Options.principal_min_gain``). Read also where the
    # budget denies the slabs: the rows method's choice needs it (:func:`rows_method_wins`).
    gain = slab_gain(parts) if slabs and slab_gain is not None else None
    principal = principal and (gain is None or gain >= get_options().principal_min_gain)
    frames = PRINCIPAL_FRAMES if principal else GLOBAL_FRAMES
    slots = store if lists == LISTS_ON_DEVICE else 2 * band_parts * b * (capacity * 25 + 40 + SLOT_BYTES)
    # A kernel screen materialises no block but the float32 sample block that seeds a part's own
    # block (its whole own block when the part is no wider than the sample).
    blocks_bytes = b * _seed_row_bytes(caps, precision, ks, b) if kernel else b * b * element * 3
    # Principal frames whose blocks are centred on their own parts take survivors in as they go
    # where their stores do not hold them (Options.hold_pairs).
    waiting = pending_pairs(device, budget, updates=True) if principal else pending
    # A GPU graph screened by a kernel holds its survivors back, up to held_pairs_limit.
    # Its store's tables are made only where the held survivors outgrow them (near-ties): the
    # held pairs or the tables, not both.
    held = held_pairs_limit(n, capacity, pending) if kernel and lists == LISTS_ON_DEVICE else 0
    pairs_bytes = max(pending, waiting) * get_options().pending_pair_bytes
    expected = (max(slots, held * HELD_PAIR_BYTES) + (corpus_bytes if resident else 2 * b * vector) + blocks_bytes
                + pairs_bytes + (2 * corpus_bytes if principal else 0))
    read_rows = _read_rows(host_budget, d, max(b, READ_ROWS))
    reads = (READ_AHEAD + 2) * d * READ_VALUE_BYTES * read_rows
    off_device = store if lists == LISTS_IN_HOST else 0
    host = reads + off_device + (expected if device.type == "cpu" else 0)
    symmetric = EnginePlan(
        operation="graph", n_queries=n, n_corpus=n, d=d, k=k, metric=metric, device=str(device),
        screen_precision=precision, unit_roundoff=PRECISIONS[precision].input_roundoff,
        thresholds="k-th best certified upper bound within each point's own part (the diagonal blocks, "
                   "computed first), then tightened as rows fill",
        sample_size=0, capacity=capacity, pending_pairs=pending, query_rows=b, corpus_cols=b,
        corpus_resident=resident, parts=parts, part_size=b, blocks=parts * (parts + 1) // 2, frames=frames,
        bytes_expected=int(expected), budget=budget, budget_source=source or "given", host_budget=given_host,
        host_budget_source=host_source or "given", read_rows=read_rows, lists=lists, band_parts=band_parts,
        host_bytes_expected=int(host),
        group_parts=group_parts(kernel=kernel, resident=resident, lists=lists, parts=parts, part_size=b),
        uncompiled=_uncompiled(device))
    # Held survivors (a kernel's screen, stores on the device: ``holding_for``) of a bound that
    # is not exact: rows that hold too many are searched again in float64 (``escalate_pairs``).
    holds = lists == LISTS_ON_DEVICE and holds_survivors(device, PRECISIONS[precision])
    escalate = escalate_pairs(n, d, capacity) if holds and not PRECISIONS[precision].integers else 0
    if direct:
        return symmetric
    if escalate:
        escalation = _search_plan(capabilities=caps, n_queries=n, n_corpus=n, d=d, k=graph_search_k(k, include_self),
                                  metric=metric, device=device, budget=budget, source=source, screen_dtype="float64",
                                  host_budget=given_host, host_source=host_source)
        symmetric = replace(symmetric, escalate_pairs=escalate, escalation=escalation)
    # A metric that centres one side only (the inner product) cannot prepare a symmetric block's
    # two sides alike but uncentred, whose bound then grows with the data's distance from the
    # origin (N(1000, 1) points at k = 15: 81 evaluations a row against 8 by rows); by rows, its
    # corpus side is centred as in a search, on a CPU as on a GPU.
    one_sided = get_metric(metric).centre_corpus and not get_metric(metric).needs_centre(True)
    if method == GRAPH_SYMMETRIC or (method is None and lists != LISTS_ON_DEVICE):
        return symmetric
    if method is None and not one_sided and (device.type != "cuda" or integer_rows):
        return symmetric
    if method not in (None, GRAPH_ROWS):
        raise ValueError(f"method must be {GRAPH_SYMMETRIC!r} or {GRAPH_ROWS!r}, got {method!r}")
    by_rows = _search_plan(capabilities=caps, n_queries=n, n_corpus=n, d=d, k=graph_search_k(k, include_self),
                           metric=metric, device=device, budget=budget, source=source, screen_dtype=screen_dtype,
                           host_budget=given_host, host_source=host_source)
    if method is None and not one_sided and not rows_method_wins(by_rows, symmetric, caps, gain):
        return symmetric
    chunks = -(-n // by_rows.query_rows)
    thresholds = (by_rows.thresholds if by_rows.tiles_first else
                  f"k-th best certified upper bound among {by_rows.sample_size} random points, then "
                  "tightened by every tile's survivors (each chunk of rows as a search of the data)")
    return replace(by_rows, operation="graph", k=k, graph_method=GRAPH_ROWS, parts=chunks,
                   part_size=by_rows.query_rows, blocks=chunks, thresholds=thresholds, search=by_rows)


def after_out_of_memory(plan: EnginePlan) -> EnginePlan | None:
    """The plan of a search (or a graph by rows) to run after an out-of-memory error: half its
    query rows (while they are at least its corpus columns, and more than 8), else half its
    corpus columns (not below k); None where neither can shrink."""
    rows, cols = plan.query_rows, plan.corpus_cols
    if rows >= cols and rows > 8:
        return replace(plan, query_rows=max(8, rows // 2))
    if cols > max(8, plan.k):
        return replace(plan, corpus_cols=max(8, plan.k, cols // 2))
    return None


def graph_search_k(k: int, include_self: bool) -> int:
    """Neighbours a graph's rows method searches for: k, and the point itself unless it counts."""
    return k if include_self else k + 1



def tiles_first(plan: EnginePlan, where: DeviceCapabilities | torch.device) -> bool:
    """Whether the search of ``plan`` (a graph's rows method included) takes its tiles first: a
    resident corpus of 2k to :data:`~knng.engine.kernels.row_kth.KTH_ROW_MAX_WIDTH` tiles of
    ``kernels.TILE`` columns (each row's k-th tile minimum by one kernel), the wgmma kernel's tile
    minima and gathered screen for its precision and d (``kernels.tiles_first_runs``), and a
    chunk's minima and grouped pairs (4 bytes each a row and tile) within an eighth of the budget
    and fewer than 2³¹ of them. Decided from the plan alone, so that the graph's planner knows it
    too (:func:`rows_method_wins`). ``Options.tiles_first`` turns it off (to compare).

    H200 (``bench/ab_exact_calls.py new/notiles``, docs/FINDINGS.md, "Tiles, parts and a graph's method"):
    a graph of 200k × 128 points by rows at k = 64 / 100 / 300 44.4 / 50.2 / 87.6 ms against
    63.1 / 70.1 / 121.0 from a seed sample and a full screen; 10k queries against 200k points at
    k = 100 8.1 against 10.2 ms."""
    tiles = -(-plan.n_corpus // TILE)
    return (get_options().tiles_first and plan.corpus_resident and 2 * plan.k <= tiles <= KTH_ROW_MAX_WIDTH
            and plan.query_rows * tiles * 8 <= plan.budget // 8
            and plan.query_rows * tiles < 2**31  # the grouped pairs' int32 positions
            and tiles_first_runs(where, plan.precision, plan.d))


#: A graph of at most this many values (n · d) runs by rows at any k where its search takes its
#: tiles first (:func:`tiles_first`; from ``Options.graph_rows_min_k`` otherwise), unless
#: ``Options.graph_rows_tiles_first`` is off (to compare). The rows method screens every pair
#: twice where the symmetric blocks screen it once, but its tiles-first thresholds leave ~1.3 k
#: pairs a row where the symmetric blocks' own-part seeds leave 10–30 k at small k, and it has no
#: stores to update: H200, one process (``bench/ab_exact_calls.py new/symk``, min of 3, rows /
#: symmetric ms, k = 10 unless named): 20k × 64 6.0 / 7.2, 50k × 128 8.1 / 10.2, 100k × 128 at
#: k = 32 14.9 / 22.5, 200k × 128 34.0 / 42.8; but 249,551 × 256 92.4 / 85.2 and 500k × 128
#: 184.6 / 173.0, where the doubled product outweighs them.
GRAPH_ROWS_TILES_FIRST_MAX_ND = 1 << 25


def rows_method_wins(by_rows: EnginePlan, symmetric: EnginePlan, where: DeviceCapabilities | torch.device,
                     gain: float | None) -> bool:
    """Whether the planner takes the rows method (from ``Options.graph_rows_min_k``, or at any k where
    its search takes its tiles first and the data are small: :data:`GRAPH_ROWS_TILES_FIRST_MAX_ND`): ``by_rows`` is the
    search it would run, ``symmetric`` the symmetric plan it would replace. The data's slab gain
    (``knng.engine.graph.frames.slab_gain``, None where no sample was read) says whether they are
    image-like: those keep the symmetric blocks, centred on their row parts, and also where the
    budget leaves them one centre: the rows method's one centre and loose first thresholds let
    thousands of pairs a row through (582k 8×8 patches at k = 100 under 4 GB, one H200: by rows
    3.2 s and a 53 GB peak, 690M survivors in one chunk's store; symmetric blocks about one
    centre 0.44 s and 6.9 GB; 16×16 patches under 2 GB 0.58 against 0.17 s). A graph the
    graph's rule screens in float64 keeps its blocks: the rows
    method's search would screen in float16 (searches take it at every k from d = 64) where the
    graph's rule found float64 cheaper (the 16,384 × 4,096 graph at k = 1,024: 58 ms against 110
    by rows in float16)."""
    kernel = by_rows.device.startswith("cuda") and by_rows.precision.fused and triton_runs(where)
    tiles = (get_options().graph_rows_tiles_first and by_rows.n_corpus * by_rows.d <= GRAPH_ROWS_TILES_FIRST_MAX_ND
             and tiles_first(by_rows, where))
    from_k = symmetric.k >= get_options().graph_rows_min_k or tiles
    if not (kernel and by_rows.corpus_resident and from_k):
        return False
    if symmetric.screen_precision == "float64":
        return False
    return gain is None or gain < get_options().local_centre_gain


# ------------------------------------------------------------------ what a host budget costs
class KnngPerformanceWarning(UserWarning):
    """A call whose plan runs much slower than a modestly different setting would (today: a
    ``host_memory_budget`` too small, :func:`host_budget_note`). Its own category, so that it can
    be filtered: ``warnings.simplefilter("ignore", knng.KnngPerformanceWarning)``."""


#: The planner's estimate of a plan's running time (seconds of one CPU core; only the ratio of
#: two plans' estimates is used, :func:`estimated_seconds`): every pair screened (its product, d
#: multiply-adds, and its comparison and selection), every score block (a fixed price: the
#: block's calls, thresholds and store update), every value read from the input again for a
#: streamed corpus (read, converted and prepared: a graph's column part for every block, a
#: search's whole corpus for every chunk of queries) and every pair of bands of candidate stores
#: loaded and saved off the device. Fitted (least squares of the relative error) to 35 runs on
#: one CPU thread (``torch.set_num_threads(1)``, process time), k = 10, Gaussian
#: data in memory-mapped .npy files, host budgets from 512 KB to none: every estimate within
#: 0.63–1.33× of its run, 27 of 35 within ±15 %. Graphs (``host_memory_budget`` none / 16MB /
#: 4MB / 2MB / 1MB, s): 16,384 × 64 1.22 / 1.68 / 3.49 / 5.78 / 14.35 (113 parts of 146 points:
#: 6,441 score blocks instead of 36, the data read 58 times, stores on disk in 113 bands);
#: 8,192 × 128 0.63 / 0.73 / 2.08 / – / 14.83; 32,768 × 32 3.17 / 4.50 / 9.91 / – / 30.09;
#: 4,096 × 256 0.41 / 0.48 / 1.38 / – / 7.76; 1,024 × 1,000 0.13 / 0.11 / 0.50 / 1.17 / 2.64;
#: 65,536 × 16 9.8 / 18.1. A search of 2,000 queries in the 16,384 × 64 file (none / 16MB / 4MB
#: / 2MB / 1MB / 512KB): 0.30 / 0.42 / 0.61 / 2.42 / 8.06 / 24.38. Two threads on two cores that
#: other processes also used make small blocks far dearer still (every operation waits for both
#: threads): the 16,384 × 64 graph took 12.5 s without a host budget and 66 s with 1MB (a
#: reliability battery saw 8 s and 782 s), a 2,048 × 64 graph at 1MB 2.7–3.0 s against 0.58 s
#: on one thread. So the estimate understates the slowdown there, and on a GPU too, where the
#: pairs cost far less next to the fixed prices (nothing was measured there).
COST_PAIR_PRODUCT = 0.109e-9  # a multiply-add of a pair's product
COST_PAIR = 2.17e-9  # a pair's comparison with its thresholds and its selection
COST_BLOCK = 0.379e-3
COST_READ_VALUE = 22.4e-9
COST_BAND_PAIR = 1.55e-3
#: A host budget whose plan's estimate exceeds the default host budget's this many times gets a
#: note (:func:`host_budget_note`). The measured plans (above) took 2.0–3.8× at 4MB, 4.7–9× at
#: 2MB and 9.5–81× at 1MB and below: 4× leaves the first alone (a tolerable slowdown, within the
#: estimate's error) and names the rest.
HOST_BUDGET_SLOWDOWN = 4.0
#: The note also names the smallest budget that keeps the estimate within this factor.
HOST_BUDGET_WITHIN = 2.0
#: Budgets the note suggests: these mantissas times a power of ten (about 25 % apart).
_SUGGESTED_MANTISSAS = (10, 12, 15, 20, 25, 30, 40, 50, 60, 80)


@dataclass(frozen=True)
class PlanWork:
    """What a plan's running time grows with, in the terms of :func:`estimated_seconds`.

    Attributes
    ----------
    pairs : int
        Pairs screened (a symmetric graph's blocks S(I, J), I ≤ J, each once).
    blocks : int
        Score blocks (a search's chunks of queries × corpus tiles).
    block_rows, block_cols : int
        The shape of one score block.
    reads : float
        Times the input is read again after its first pass (a streamed corpus; 0 when resident).
    bands, band_pairs : int
        Bands of candidate stores off the device and the pairs of them loaded and saved (0, 0
        when the stores stay on the device).
    """

    pairs: int
    blocks: int
    block_rows: int
    block_cols: int
    reads: float
    bands: int
    band_pairs: int


def plan_work(plan: EnginePlan) -> PlanWork:
    """What ``plan`` will do, counted from its fields (:class:`PlanWork`)."""
    if plan.operation == "search" or plan.graph_method == GRAPH_ROWS:
        chunks = -(-plan.n_queries // max(1, plan.query_rows))
        tiles = -(-plan.n_corpus // max(1, plan.corpus_cols))
        return PlanWork(pairs=plan.n_queries * plan.n_corpus, blocks=chunks * tiles, block_rows=plan.query_rows,
                        block_cols=plan.corpus_cols, reads=0.0 if plan.corpus_resident else float(chunks),
                        bands=0, band_pairs=0)
    n, b, parts = plan.n_corpus, plan.part_size, plan.parts
    banded = plan.lists != LISTS_ON_DEVICE and plan.band_parts > 0
    bands = plan.bands if banded else 0
    # Each row part I reads its own part and the column parts J > I: (parts + 1) / 2 passes.
    return PlanWork(pairs=(n * n + n * b) // 2, blocks=plan.blocks, block_rows=b, block_cols=b,
                    reads=0.0 if plan.corpus_resident else (parts + 1) / 2, bands=bands,
                    band_pairs=bands * (bands + 1) // 2)


def estimated_seconds(plan: EnginePlan) -> float:
    """The planner's estimate of ``plan``'s running time on one CPU core (see
    :data:`COST_BLOCK`): only the ratio of two plans' estimates means anything."""
    w = plan_work(plan)
    return (w.pairs * (plan.d * COST_PAIR_PRODUCT + COST_PAIR) + w.blocks * COST_BLOCK
            + w.reads * plan.n_corpus * plan.d * COST_READ_VALUE + w.band_pairs * COST_BAND_PAIR)


def budget_text(nbytes: int) -> str:
    """``nbytes`` as a ``host_memory_budget`` / ``--host-memory`` value that parses back to it
    exactly: ``"2.5MB"``, ``"64MiB"``, else the byte count."""
    for units in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)), \
            (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        for name, size in units:
            if nbytes >= size and (nbytes * 10) % size == 0:
                value = nbytes / size
                text = f"{value:.0f}{name}" if nbytes % size == 0 else f"{value:.1f}{name}"
                if parse_bytes(text) == nbytes:
                    return text
    return str(nbytes)


def _suggested_budgets(above: int, up_to: int) -> list[int]:
    """Round budgets (:data:`_SUGGESTED_MANTISSAS` × 10ᵉ) between ``above`` and ``up_to``,
    ascending, then ``up_to``."""
    out: list[int] = []
    scale = 10 ** max(0, len(str(max(1, above))) - 2)  # mantissa 10 × scale ≤ above
    while 10 * scale < up_to:
        out += [m * scale for m in _SUGGESTED_MANTISSAS if above < m * scale < up_to]
        scale *= 10
    return out + [up_to]


def host_budget_note(plan: EnginePlan, reference: EnginePlan, smallest: int, within: int) -> str:
    """Why ``plan`` (made with a host budget) runs much slower than ``reference`` (the same call
    with the default host budget), and which budgets avoid that: ``smallest`` (the smallest whose
    plan gets no note: :data:`HOST_BUDGET_SLOWDOWN`, ``Options.host_budget_min_seconds``), ``within``
    (within :data:`HOST_BUDGET_WITHIN`); either may be the default host budget itself
    (``reference.host_budget``)."""
    slow = estimated_seconds(plan) / estimated_seconds(reference)
    w, r = plan_work(plan), plan_work(reference)
    what = "graph" if plan.operation == "graph" else "search"
    reasons = []
    if w.blocks > r.blocks:
        reasons.append(f"{w.blocks:,} score blocks of {w.block_rows:,} × {w.block_cols:,} instead of {r.blocks:,} "
                       f"of {r.block_rows:,} × {r.block_cols:,}")
    if w.reads > r.reads:
        source = "the data" if what == "graph" else "the corpus"
        reasons.append(f"{source} read {1 + w.reads:,.0f} times over instead of "
                       + ("once" if r.reads == 0 else f"{1 + r.reads:,.0f} times"))
    if w.band_pairs > r.band_pairs:
        where = "on disk" if plan.lists == LISTS_ON_DISK else "in host memory"
        reasons.append(f"candidate stores {where} in {w.bands:,} bands ({w.band_pairs:,} band pairs loaded and "
                       "saved)")
    default = reference.host_budget

    def setting(nbytes: int) -> str:
        return "no host_memory_budget" if nbytes >= default else f"host_memory_budget={budget_text(nbytes)} or more"

    times = f"{slow:.0f}" if slow >= 10 else f"{slow:.1f}"
    text = (f"host_memory_budget={budget_text(plan.host_budget)} makes this {what} about {times}× slower than "
            f"the default host budget ({default / 1e9:.3g} GB, {HOST_AVAILABLE_SHARE:.0%} of the available RAM) "
            f"would, by the planner's estimate: " + ("; ".join(reasons) or "smaller blocks") + ". ")
    if within <= smallest:
        return text + f"{setting(within)} keeps it within {HOST_BUDGET_WITHIN:g}×."
    return text + (f"{setting(smallest)} avoids this warning; {setting(within)} keeps it within "
                   f"{HOST_BUDGET_WITHIN:g}×.")


def _with_host_budget_note(plan: EnginePlan, replan: Callable[[int], EnginePlan]) -> EnginePlan:
    """``plan`` with its :attr:`~EnginePlan.host_budget_note` where its host budget (below the
    default one) makes it more than :data:`HOST_BUDGET_SLOWDOWN` times and
    ``Options.host_budget_min_seconds`` slower than the default host budget's plan, by
    :func:`estimated_seconds`; ``replan(host_budget)`` makes the same call's plan with another
    host budget (a few dozen plans, ~20 µs each)."""
    if plan.host_budget_source == host_budget_source(None):
        return plan  # the default host budget itself
    default = resolve_host_budget(None)
    if plan.host_budget >= default:
        return plan
    reference = replan(default)
    base = estimated_seconds(reference)

    def too_slow(seconds: float) -> bool:
        return seconds > HOST_BUDGET_SLOWDOWN * base and seconds - base >= get_options().host_budget_min_seconds

    if not too_slow(estimated_seconds(plan)):
        return plan
    smallest = within = default
    for candidate in _suggested_budgets(plan.host_budget, default):
        seconds = estimated_seconds(replan(candidate))
        if smallest == default and not too_slow(seconds):
            smallest = candidate
        if seconds <= HOST_BUDGET_WITHIN * base:
            within = candidate
            break
    return replace(plan, host_budget_note=host_budget_note(plan, reference, smallest, within))
