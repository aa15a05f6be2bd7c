"""Pieces shared by the search and graph loops: device choice, precision guard, the corpus
pass, prepared-corpus access, out-of-memory detection, progress and the run report."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from knng._inputs import READ_AHEAD, READ_CHUNK_BYTES, READ_THREADS, InputArray, check_finite
from knng.engine.exact import ExactStats
from knng.engine.plan import EnginePlan, allocator_stat, copies_input
from knng.engine.store import StoreStats
from knng.metrics import (
    INTEGER_MAX_D, IntegerExtent, Metric, Prepared, ScreenPrecision, integer_centre, integer_rows_fit,
    lattice_point, with_exact_products,
)
from knng.engine.kernels import finite_column_sums, in_background, lattice_extent, preparation_runs, prepare_rows

__all__ = [
    "resolve_device", "place_input", "on_device", "device_block_rows", "full_precision", "CorpusStats", "corpus_stats",
    "integer_extent_of",
    "PreparedCorpus", "is_out_of_memory", "Progress", "EngineReport", "DevicePeak", "TF32_EXACT_SAMPLES", "tf32_products",
    "LATTICE_UNITS", "LATTICE_TOLERANCE", "LatticeExtent",
]


def resolve_device(device: str | torch.device, *inputs: InputArray) -> torch.device:
    """The compute device for ``device=`` ("auto", "cpu", "cuda", "cuda:1" or a torch.device).

    "auto" computes where a GPU tensor input lives, else on the first GPU if there is one,
    else on the CPU.
    """
    if isinstance(device, str) and device == "auto":
        for arr in inputs:
            if arr.device.type == "cuda":
                return arr.device
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} asks for a GPU but torch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise ValueError(f"device must be 'auto', 'cpu' or a CUDA device, got {device!r}")
    return dev


def place_input(x: InputArray, device: torch.device, budget: int, host_budget: int) -> tuple[InputArray, int]:
    """The rows the engine reads and the budget left to plan: ``x`` copied whole to ``device``
    where :func:`~knng.engine.plan.copies_input` says so (a file read once, its reads overlapped:
    :meth:`~knng._inputs.InputArray.read_to`, two pinned staging buffers a reading thread within
    a quarter of ``host_budget``), else ``x`` as it is and the whole budget."""
    if not copies_input(nbytes=x.nbytes, on_device=x.in_memory and x.device == device, device=device,
                        budget=budget):
        return x, budget
    chunk = max(1 << 16, min(READ_CHUNK_BYTES, host_budget // (8 * READ_THREADS)))
    return x.read_to(device, chunk_bytes=chunk), budget - x.nbytes


@contextlib.contextmanager
def on_device(device: torch.device) -> Iterator[None]:
    """Make a CUDA ``device`` torch's current device while the engine runs (nothing for a CPU).

    Triton launches a kernel on the *current* device's current stream, whatever device its
    tensors are on: a search on ``cuda:1`` while ``cuda:0`` was current ran its Triton kernels
    from ``cuda:0``, reading ``cuda:1``'s memory unordered with the stream that wrote it (a wrong
    answer once in a test run on two GPUs, 2026-11-26). torch's own operations and the CUDA C
    kernels (launched on the tensors' device explicitly) are not affected.
    """
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        yield


#: Bytes of float64 rows per block when data already on the GPU are read (see device_block_rows).
DEVICE_BLOCK_BYTES = 2**31


def device_block_rows(data: InputArray, device: torch.device, block_rows: int) -> int:
    """Rows per block for a pass over ``data``: where the data already lie on the (CUDA) device the
    pass reads, blocks of up to :data:`DEVICE_BLOCK_BYTES` of float64 rows (a preparation's
    widest temporaries) instead of the plan's reads (``block_rows``), which size the host's
    read-ahead buffers: each block costs a dozen launches per pass (1M × 128 took four, a
    200k-point graph's passes seven blocks each, and the corpus statistics a synchronisation
    a block)."""
    already_there = data.tensor is not None and torch.device(data.tensor.device).type == device.type
    if already_there and device.type == "cuda":
        return max(block_rows, min(data.n, DEVICE_BLOCK_BYTES // (8 * max(1, data.d))))
    return block_rows


class _MatmulPrecision:
    """torch's float32 product precision, one process-wide setting, shared by the threads that run
    knng (a caller's threads; not the background compilations, ``knng.engine.kernels.compiling``,
    which leave it alone).

    The first thread in saves the user's setting and sets IEEE products; the last one out
    restores it, so that runs overlapping in several threads never restore each other's IEEE
    setting as the user's. A TF32 section (:func:`tf32_products`) turns TF32 on only while its
    thread is the only one inside; a thread that comes in meanwhile waits for the section's end,
    so that its products never run in TF32.
    """

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.depth: dict[int, int] = {}  # thread ident -> nesting depth inside full_precision
        self.saved: tuple | None = None  # the user's setting while any thread is inside
        self.tf32_owner: int | None = None

    @staticmethod
    def read() -> tuple:
        try:
            return "legacy", torch.get_float32_matmul_precision()
        except RuntimeError:  # the user set the newer per-backend API; the legacy getter refuses
            return "backends", (torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)

    @staticmethod
    def write(setting: tuple) -> None:
        api, value = setting
        if api == "legacy":
            torch.set_float32_matmul_precision(value)
        else:
            torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = value

    def ieee(self) -> tuple:
        return ("legacy", "highest") if self.saved is not None and self.saved[0] == "legacy" else \
            ("backends", ("ieee", "ieee"))

    def tf32(self) -> tuple:
        return ("legacy", "high") if self.saved is not None and self.saved[0] == "legacy" else \
            ("backends", ("tf32", torch.backends.mkldnn.matmul.fp32_precision))

    def enter(self) -> None:
        me = threading.get_ident()
        with self.changed:
            self.changed.wait_for(lambda: self.tf32_owner is None or self.tf32_owner == me)
            if not self.depth:
                self.saved = self.read()
                self.write(self.ieee())
            self.depth[me] = self.depth.get(me, 0) + 1

    def leave(self) -> None:
        me = threading.get_ident()
        with self.changed:
            self.depth[me] -= 1
            if not self.depth[me]:
                del self.depth[me]
            if not self.depth and self.saved is not None:
                self.write(self.saved)
                self.saved = None
            self.changed.notify_all()

    def enter_tf32(self) -> bool:
        me = threading.get_ident()
        with self.changed:
            if set(self.depth) != {me} or self.tf32_owner is not None:
                return False  # another thread's products need IEEE: these stay IEEE (exact all the same)
            self.tf32_owner = me
            self.write(self.tf32())
            return True

    def leave_tf32(self) -> None:
        with self.changed:
            self.write(self.ieee())
            self.tf32_owner = None
            self.changed.notify_all()


_MATMUL = _MatmulPrecision()

#: The screens whose seed products (a search's sample, a graph part's sampled own block) may run
#: on TF32 tensor cores: TF32's own, and scaled float16, whose stored values (11 significant
#: bits, scaled by powers of two) TF32 holds exactly, so that its products are the reference's.
TF32_EXACT_SAMPLES = frozenset({"tf32", "float16"})


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Force IEEE float32 matrix products (no TF32/bf16 shortcuts) while the engine runs.

    The rounding-error bound assumes float32 inputs; a user's global
    ``torch.set_float32_matmul_precision("high")`` (or ``fp32_precision = "tf32"`` in the newer
    API) would silently void it. Whichever API the user set is restored afterwards, once no
    thread runs knng any more (:class:`_MatmulPrecision`). A run in the background (a call run
    again to compile its kernels, its answer discarded) leaves the setting alone: the caller's
    own code runs beside it, with the caller's setting.
    """
    if in_background():
        yield
        return
    _MATMUL.enter()
    try:
        yield
    finally:
        _MATMUL.leave()


@contextlib.contextmanager
def tf32_products() -> Iterator[None]:
    """Let float32 matrix products on a GPU run in TF32 inside :func:`full_precision`.

    Only for products whose error the plan's bound already covers with TF32's input roundoff
    (a TF32 screen's own blocks); IEEE products are within it too, and run instead where another
    thread is inside knng (:class:`_MatmulPrecision`). A background run changes nothing.
    """
    owner = not in_background() and _MATMUL.enter_tf32()
    try:
        yield
    finally:
        if owner:
            _MATMUL.leave_tf32()


#: The lattices a corpus's values are tried on, finest last: integers, and grey levels divided by
#: 255 (``skimage.img_as_float``, torchvision's ``ToTensor``), whose unit is float32's 1/255.
LATTICE_UNITS = (1.0, float(torch.tensor(1 / 255, dtype=torch.float32)))
#: A corpus lies on a lattice when every value is within this many units of a lattice point (its
#: actual distance, measured, is what the bound counts: ``ScreenPrecision.lattice_error``).
LATTICE_TOLERANCE = 2.0**-10
#: Rows of each block checked first where the passes are torch's (a CPU): data off every
#: lattice (most float data) cost a look at these, not float64 passes over the whole corpus. A
#: GPU reads each block once in a kernel (``lattice_extent``) and probes nothing.
LATTICE_PROBE_ROWS = 1024


@dataclass(frozen=True)
class CorpusStats:
    """What one pass over the corpus learns: the common centre (or None) and, where asked for,
    whether its values lie on a lattice (:data:`LATTICE_UNITS`): the unit, each column's extent
    in units (largest minus smallest lattice point, float64) and the largest distance of a value
    from its lattice point (None and 0.0 off every lattice)."""

    centre: torch.Tensor | None
    integer_spread: torch.Tensor | None = None
    lattice: float = 1.0
    lattice_error: float = 0.0
    integer_low: torch.Tensor | None = None  # each column's smallest lattice point, in units

    @staticmethod
    def of(centre: torch.Tensor | None, lattices: "list[LatticeExtent]") -> "CorpusStats":
        """The statistics of a corpus of common centre ``centre`` whose blocks went into
        ``lattices`` (none: lattices not looked for): the first lattice they lie on, if any."""
        for lattice in lattices:
            found = lattice.found()
            if found is not None:
                spread, error = found
                return CorpusStats(centre=centre, integer_spread=spread, lattice=lattice.unit, lattice_error=error,
                                   integer_low=lattice.low)
        return CorpusStats(centre=centre)

    def screen(self, precision: ScreenPrecision) -> tuple[ScreenPrecision, torch.Tensor | None, float | None]:
        """The precision, centre and lattice unit a screen of this corpus runs with: ``precision``
        with exact products (:func:`knng.metrics.with_exact_products`) around the centre rounded
        to a lattice point, and the lattice's unit, when the corpus lies on a lattice small
        enough; else ``precision`` around :attr:`centre`, and None."""
        if precision.integers:
            return precision, self.integer_centre(), 1.0
        if self.centre is None:
            return precision, self.centre, None
        exact = with_exact_products(precision, self.integer_spread, self.lattice_error, self.lattice)
        if not exact.exact_products:
            return precision, self.centre, None
        # The rounded mean is a lattice point inside the data's bounding box: every centred
        # value stays within its column's extent (c·m is exact in float64: 24 + 11 bits).
        return exact, lattice_point(self.centre, self.lattice), self.lattice

    @property
    def integers(self) -> bool:
        """Whether the corpus fits integer rows (precision ``int8``): every value an integer,
        every column spanning at most 255 (:func:`knng.metrics.integer_rows_fit`)."""
        return (self.centre is not None and self.lattice == 1.0 and self.lattice_error == 0.0
                and integer_rows_fit(self.centre.numel(), self.integer_spread, self.integer_low))

    def integer_centre(self) -> torch.Tensor:
        """The integer point integer rows are centred on (:func:`knng.metrics.integer_centre`);
        a clear error where the corpus does not fit them."""
        if not self.integers:
            raise ValueError("screen_dtype='int8' screens integer data only: every value an integer and every "
                             f"column spanning at most 255, in at most {INTEGER_MAX_D:,} dimensions")
        assert self.centre is not None and self.integer_spread is not None and self.integer_low is not None
        return integer_centre(self.centre, self.integer_low, self.integer_low + self.integer_spread)


#: Host rows that :func:`integer_extent_of` looks at, at most, for a GPU (copied there and read) or
#: a CPU (larger host data keep the planner's other choices).
INTEGER_LOOK_HOST_BYTES = 64 * 2**20


def integer_extent_of(data: InputArray, metric: Metric, device: torch.device,
                      also: InputArray | None = None) -> IntegerExtent | None:
    """What the planner may know of ``data`` (and ``also``: a search's queries, taken together
    with them) as integers under ``metric`` on ``device`` (:class:`knng.metrics.IntegerExtent`),
    found cheaply and certainly before planning: uint8 and int8 data are bounded by their type,
    without a look; data of other types are looked at in one read where they already lie on the
    GPU or are small host arrays (:data:`INTEGER_LOOK_HOST_BYTES`), after a probe of their first
    rows: every value an integer, and each column's extent; other data (from a file, large host
    arrays) are not (None: the screen keeps the planner's other choices). None without a look
    for metrics that are not translation-invariant and on devices that are neither a GPU nor a
    CPU."""
    arrays = [data] if also is None else [data, also]
    if device.type not in ("cuda", "cpu") or not metric.translation_invariant or not 0 < data.d <= INTEGER_MAX_D:
        return None
    if len({a.dtype for a in arrays}) == 1:
        bound = IntegerExtent.of_dtype(data.d, data.dtype)
        if bound is not None:
            return bound
    # Most float data are not integers, which their first rows show: one small look (one
    # synchronisation for both arrays) and no pass over the whole (a 1M × 128 corpus's pass
    # takes milliseconds of a search).
    probes = []
    for array in arrays:
        tensor = array.tensor
        if (tensor is None or tensor.is_complex()
                or (tensor.device.type != "cuda" and array.nbytes > INTEGER_LOOK_HOST_BYTES)):
            return None
        probe = tensor[:LATTICE_PROBE_ROWS].to(device, non_blocking=True)
        if probe.is_floating_point():
            probes.append((probe == torch.round(probe)).all())
    if probes and not all(torch.stack(probes).tolist()):
        return None
    lattice = LatticeExtent(1.0, data.d, device)
    for array in arrays:
        tensor = array.tensor
        assert tensor is not None
        step = device_block_rows(array, device, 1) if tensor.device.type == "cuda" else array.n
        for start in range(0, array.n, step):
            lattice.add(tensor[start:start + step].to(device, non_blocking=True))
    found = lattice.found()
    if found is None or found[1] != 0.0:  # off the integers, or near them only
        return None
    return IntegerExtent.of(found[0], lattice.low)


def corpus_stats(corpus: InputArray, metric: Metric, device: torch.device, *, symmetric: bool,
                 block_rows: int, integers: bool = False, also: InputArray | None = None) -> CorpusStats:
    """Check the corpus is finite and, where the metric centres, compute its float64 mean.

    ``integers``: also find whether the values lie on a lattice (:class:`CorpusStats`), for a
    screen that may run with exact products (a translation-invariant metric whose both sides
    are centred: the caller's to say). ``also``: other rows (a search's queries) whose values
    join the lattice's extents, not the mean: a centre found from the extents then suits them too.
    """
    need_mean = metric.needs_centre(symmetric)
    total = torch.zeros(corpus.d, dtype=torch.float64, device=device)
    lattices = LatticeExtent.every(corpus.d, device) if integers and need_mean else []
    for start, block in corpus.iter_blocks(block_rows, read_ahead=READ_AHEAD, pin=device.type == "cuda"):
        block = block.to(device, non_blocking=True)
        sums, bad = finite_column_sums(block, sums=need_mean and not metric.normalize)
        if bad is not None:
            check_finite(block, corpus.name, start)  # raises, naming the first bad row
        if need_mean and metric.normalize:  # the mean of the unit vectors
            sums = metric.unit_rows(block.to(torch.float64)).sum(dim=0)
        if sums is not None:
            total += sums
        LatticeExtent.add_to(lattices, block)
    if lattices and also is not None:
        for _, block in also.iter_blocks(block_rows, read_ahead=READ_AHEAD, pin=device.type == "cuda"):
            LatticeExtent.add_to(lattices, block.to(device, non_blocking=True))
    return CorpusStats.of(total / corpus.n if need_mean else None, lattices)


class LatticeExtent:
    """Blocks of values on the lattice of one unit: each column's smallest and largest lattice
    point (in units), the largest distance of a value from its point in units and absolutely
    (on the device, read once at the end). :func:`corpus_stats` keeps one per unit of
    :data:`LATTICE_UNITS`; a distributed run keeps them per rank and combines them
    (:meth:`combine`)."""

    @staticmethod
    def every(d: int, device: torch.device) -> list["LatticeExtent"]:
        """One extent per unit of :data:`LATTICE_UNITS`, finest last."""
        return [LatticeExtent(unit, d, device) for unit in LATTICE_UNITS]

    @staticmethod
    def add_to(lattices: list["LatticeExtent"], block: torch.Tensor) -> None:
        """Add ``block`` (on the extents' device) to each of ``lattices`` (integers: the unit
        lattice only)."""
        for lattice in lattices if block.is_floating_point() else lattices[:1]:
            lattice.add(block)

    def combine(self, reduce: Callable[[torch.Tensor, str], None]) -> None:
        """Combine with the same unit's extents of other processes: ``reduce(tensor, op)``
        reduces ``tensor`` in place over them, ``op`` "min" or "max" (an all-reduce); afterwards
        every process holds the extent of all their blocks."""
        lows = torch.stack([self.low, -self.high])
        reduce(lows, "min")
        flags = torch.stack([self.off, self.error, torch.tensor(float(self.seen), dtype=torch.float64,
                                                                device=self.off.device),
                             torch.tensor(float(self.off_lattice), dtype=torch.float64, device=self.off.device)])
        reduce(flags, "max")
        self.low, self.high = lows[0], -lows[1]
        self.off, self.error = flags[0], flags[1]
        self.seen, self.off_lattice = bool(flags[2] > 0), bool(flags[3] > 0)

    def __init__(self, unit: float, d: int, device: torch.device) -> None:
        self.unit = unit
        self.low = torch.full((d,), torch.inf, dtype=torch.float64, device=device)
        self.high = torch.full((d,), -torch.inf, dtype=torch.float64, device=device)
        self.off = torch.zeros((), dtype=torch.float64, device=device)  # in units
        self.error = torch.zeros((), dtype=torch.float64, device=device)  # absolute
        self.seen = False
        self.off_lattice = False

    def add(self, block: torch.Tensor) -> None:
        if not block.numel() or self.off_lattice:
            return
        self.seen = True
        if not block.is_floating_point():  # integers: on the unit lattice exactly
            low, high = torch.aminmax(block, dim=0)
        elif preparation_runs(block.device) and block.dim() == 2:
            # One read of the block, no probe and no synchronisation (the float64 passes below
            # were 2.8 ms of GPU time for the 16×16 image patches, with one probe per block).
            low, high, off, error = lattice_extent(block, self.unit)
            torch.maximum(self.off, off, out=self.off)
            torch.maximum(self.error, error, out=self.error)
        elif self._off(block[:LATTICE_PROBE_ROWS]) > LATTICE_TOLERANCE:
            self.off_lattice = True  # one synchronisation, as the finite check's
            return
        else:
            x = block.to(torch.float64)
            units = x / self.unit  # exact for unit 1.0, as is points·unit below
            points = torch.round(units)
            torch.maximum(self.off, (units - points).abs().max(), out=self.off)
            torch.maximum(self.error, (x - points * self.unit).abs().max(), out=self.error)
            low, high = torch.aminmax(points, dim=0)
        torch.minimum(self.low, low.to(torch.float64), out=self.low)
        torch.maximum(self.high, high.to(torch.float64), out=self.high)

    def _off(self, rows: torch.Tensor) -> float:
        units = rows.to(torch.float64) / self.unit
        return float((units - torch.round(units)).abs().max())

    def found(self) -> tuple[torch.Tensor, float] | None:
        """(extents in units, largest distance from a lattice point) if the values lie on the
        lattice (within :data:`LATTICE_TOLERANCE` units), else None."""
        if not self.seen or self.off_lattice or float(self.off) > LATTICE_TOLERANCE:
            return None
        return self.high - self.low, float(self.error)


#: Largest prepared-vector norm whose squares and products stay far from float32 overflow.
MAX_SCREEN_NORM = 1e18


class PreparedCorpus:
    """The corpus in the screen's layout, resident on the device or prepared tile by tile.

    Also holds, for every corpus vector, the float64 norm and term the per-pair error bound
    needs (n floats each, always resident).
    """

    def __init__(self, corpus: InputArray, metric: Metric, centre: torch.Tensor | None,
                 device: torch.device, *, resident: bool, block_rows: int, symmetric: bool,
                 dtype: torch.dtype = torch.float32) -> None:
        self.corpus, self.metric, self.centre, self.device = corpus, metric, centre, device
        self.symmetric, self.dtype = symmetric, dtype
        self.centre_norm = 0.0 if centre is None else float(torch.linalg.vector_norm(centre))
        self.resident: torch.Tensor | None = None
        norms = torch.empty(corpus.n, dtype=torch.float64, device=device)
        terms = torch.empty(corpus.n, dtype=torch.float64, device=device) if metric.uses_terms else None
        # A resident corpus of several blocks is prepared into its one buffer, block by block (a
        # concatenation of the blocks held the prepared corpus twice, and copied it: 1.0 ms of
        # a 1M × 960 search on an H200).
        whole = None
        if resident and corpus.n > block_rows:
            whole = torch.empty((corpus.n, metric.width(corpus.d, device, dtype)), dtype=dtype, device=device)
        for start, raw in corpus.iter_blocks(block_rows, read_ahead=READ_AHEAD, pin=device.type == "cuda"):
            stop = start + raw.shape[0]
            prep = self._prepare(raw, None if whole is None else whole[start:stop])
            norms[start:stop] = prep.norms
            if terms is not None:
                terms[start:stop] = prep.terms
            if resident and whole is None:
                whole = prep.vectors
        if resident:
            self.resident = whole
        self._set_norms(norms, terms)

    @classmethod
    def from_norms(cls, corpus: InputArray, metric: Metric, centre: torch.Tensor | None, device: torch.device,
                   norms: torch.Tensor, terms: torch.Tensor | None, *, symmetric: bool,
                   dtype: torch.dtype = torch.float32) -> "PreparedCorpus":
        """A non-resident prepared corpus whose per-vector norms and terms are already known.

        No pass over ``corpus``: the distributed engine computes each rank's share of the norms
        and gathers them, so the exact finish can bound any candidate without reading its vector.
        Tiles are prepared from ``corpus`` on demand.
        """
        self = cls.__new__(cls)
        self.corpus, self.metric, self.centre, self.device = corpus, metric, centre, device
        self.symmetric, self.dtype = symmetric, dtype
        self.centre_norm = 0.0 if centre is None else float(torch.linalg.vector_norm(centre))
        self.resident = None
        self._set_norms(norms, terms)
        return self

    def _set_norms(self, norms: torch.Tensor, terms: torch.Tensor | None) -> None:
        self.norms, self.terms = norms, terms
        # The fused kernel adds the terms in float32 after its product (the bound's c_term).
        self.terms32 = None if terms is None else terms.to(torch.float32)
        self._maxima: dict[tuple[int, int], tuple[float, float]] = {}
        self.max_norm = float(norms.max())
        if self.max_norm > MAX_SCREEN_NORM:
            raise ValueError(
                f"{self.corpus.name} has vectors of norm up to {self.max_norm:.3g} (after centring): too large "
                f"to screen in float32 (limit {MAX_SCREEN_NORM:.0e}); rescale the data")

    def _prepare(self, raw: torch.Tensor, out: torch.Tensor | None = None) -> Prepared:
        return prepare_rows(self.metric, raw.to(self.device, non_blocking=True), self.centre,
                                   side="corpus", symmetric=self.symmetric, dtype=self.dtype, out=out)

    def maxima(self, start: int, stop: int) -> tuple[float, float]:
        """Largest norm and largest |term| of rows ``start:stop`` (a block's error radius).

        Remembered per range: a search asks for every corpus tile once per query chunk.
        """
        key = (start, stop)
        if key not in self._maxima:
            norm = float(self.norms[start:stop].max())
            term = float(self.terms[start:stop].abs().max()) if self.terms is not None else 0.0
            self._maxima[key] = (norm, term)
        return self._maxima[key]

    def take(self, index: torch.Tensor) -> torch.Tensor:
        """Prepared rows at ``index`` (corpus layout) on the device."""
        if self.resident is not None:
            return self.resident[index.to(self.device)]
        return self._prepare(self.corpus.take(index)).vectors

    def tile(self, start: int, stop: int) -> torch.Tensor:
        """Prepared rows ``start:stop`` (corpus layout) on the device."""
        if self.resident is not None:
            return self.resident[start:stop]
        return self._prepare(self.corpus.rows(start, stop)).vectors

    def tiles(self, step: int, rest_at_once: bool = False) -> Iterator[tuple[int, int, torch.Tensor]]:
        """Every tile of ``step`` rows in order, ``(start, stop, prepared rows)``: a streamed
        corpus is read :data:`READ_AHEAD` tiles ahead by a background thread, so that the
        reads overlap the screen of the tiles before. ``rest_at_once``: a resident corpus
        comes as its first tile and then everything after it as one."""
        ranges = [(start, min(self.corpus.n, start + step)) for start in range(0, self.corpus.n, step)]
        if rest_at_once and self.resident is not None and len(ranges) > 2:
            ranges = [ranges[0], (ranges[1][0], self.corpus.n)]
        if self.resident is not None:
            for start, stop in ranges:
                yield start, stop, self.resident[start:stop]
            return
        for start, stop, raw in self.corpus.iter_ranges(ranges, read_ahead=READ_AHEAD,
                                                        pin=self.device.type == "cuda"):
            yield start, stop, self._prepare(raw).vectors


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a device out-of-memory error that smaller tiles may avoid."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def recover_from_oom(exc: BaseException, device: torch.device, *, can_retry: bool) -> None:
    """The one policy for a failed step: re-raise ``exc`` unless it is a device out-of-memory
    error and the caller can retry (smaller, or once more); then free the allocator's cache.

    Callers (the search's chunks, the graph's blocks, the distributed graph's row strips) choose
    what to shrink; this decides whether they may, and makes the memory available again.
    """
    if not is_out_of_memory(exc) or not can_retry:
        raise exc
    if device.type == "cuda":
        torch.cuda.empty_cache()


class Progress:
    """A progress bar on standard error (tqdm) that costs nothing when disabled."""

    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="blk", dynamic_ncols=True, leave=False)

    @classmethod
    def of(cls, progress: "bool | Progress", total: int, desc: str) -> "Progress":
        """``progress`` itself where the caller passes its own (a rank's ticks), else a bar
        when ``progress`` is true."""
        return progress if isinstance(progress, Progress) else cls(progress, total, desc)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass(frozen=True)
class DevicePeak:
    """The peak of torch's allocations on a CUDA device during a call, read without resetting
    the caller's statistics (``torch.cuda.reset_peak_memory_stats`` would lose the peak a
    training loop or a profiler is keeping).

    :meth:`begin` notes what was allocated when the call started and the process's peak until
    then; :meth:`end` reads the peak again. Where it rose, the call reached a new peak and
    ``peak − start`` is exactly the most the call held at once beyond what was allocated before
    it (allocations of other threads meanwhile included: the allocator counts per device). Where
    it did not, the process had held more before, and ``peak before − start`` is only a bound.
    """

    device: torch.device
    allocated_at_start: int
    peak_before: int

    @classmethod
    def begin(cls, device: torch.device) -> "DevicePeak | None":
        """Start measuring on ``device``; None on a CPU (host memory is not counted by torch)."""
        if device.type != "cuda":
            return None
        allocated, peak = _allocated_bytes(device)
        return cls(device, allocated, peak)

    def end(self) -> tuple[int, bool]:
        """(bytes, is_bound): the call's peak above its start, and whether that is only a bound."""
        _, peak = _allocated_bytes(self.device)
        if peak > self.peak_before:
            return peak - self.allocated_at_start, False
        return self.peak_before - self.allocated_at_start, True


def _allocated_bytes(device: torch.device) -> tuple[int, int]:
    """(current, peak) bytes torch's caching allocator has handed out on ``device``."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    return allocator_stat(stats, "allocated_bytes"), allocator_stat(stats, "allocated_bytes", "peak")


@dataclass
class EngineReport:
    """How a run went: the plan it ran, out-of-memory retries and the exactness counters."""

    plan: EnginePlan
    oom_retries: int
    exact: ExactStats
    store: StoreStats = field(default_factory=StoreStats)
    evaluations_per_row: dict[str, float] = field(default_factory=dict)
    #: Pairs the screen let through per row (median, p99, max): the price of its precision.
    screened_per_row: dict[str, float] = field(default_factory=dict)
    #: A checkpointed run's ``resumed_from`` (steps or query rows a resumed run found done),
    #: ``saves`` and ``seconds`` spent saving (:mod:`knng.engine.checkpoint`); empty without.
    checkpoints: dict[str, float] = field(default_factory=dict)
    #: Rows (a graph's data, a search's corpus) that were exact duplicates of an earlier row and
    #: were folded into it for the run (:mod:`knng.engine.duplicates`); the other figures then
    #: describe the run over the rows that remained.
    duplicates_folded: int = 0
    #: The pipeline's stages the run went through and how often (:mod:`knng.engine.stages`):
    #: ``{"screen.kernel": 12, "store.hold": 12, ...}``.
    stages: dict[str, int] = field(default_factory=dict)
    #: Plans the planner made after out-of-memory errors, in order (``plan`` is the one made
    #: first, as ``knng info`` prints it; the run finished on the last of these). A graph by
    #: rows lists its search's plans.
    replans: list[EnginePlan] = field(default_factory=list)
    #: On a GPU: the most device memory the call held at once beyond what was allocated when it
    #: started (torch's allocations, :class:`DevicePeak`), a host input's copy to the device
    #: included, so to set against the budget the call was given (``plan.budget`` is what the
    #: copy left of it); None on a CPU. ``device_peak_is_bound``: the process had held more before the call than at
    #: any time during it, so ``device_peak`` is only an upper bound of the call's own.
    device_peak: int | None = None
    device_peak_is_bound: bool = False
    #: The run put its distances on their exact values' sides itself (the direct path reads
    #: whether any lies near a float32 midpoint with its certificate: none did), so the caller
    #: need not look again (``knng.engine.exact.round_as_exact``, one synchronisation).
    rounded_as_exact: bool = False

    @property
    def screen_dtype(self) -> str:
        return self.plan.screen_precision
