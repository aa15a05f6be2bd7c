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
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Options", "options", "get_options", "SCREEN_PRECISIONS"]

#: The names :attr:`Options.screen_precision` takes (``knng.metrics``' precisions).
SCREEN_PRECISIONS = frozenset({"float64", "float32", "tf32", "tf32x3", "float16", "bfloat16", "int8x4"})


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
        else as the Triton kernel (``knng.engine.fused``).
    wgmma : bool, default True
        On a Hopper GPU, the CUDA C screen's asynchronous warpgroup products (``wgmma``) up to
        K = 256, else ``mma.sync`` (``knng.engine.cuda_screen``).
    wgmma_one_set : bool, default True
        Screens of K ≤ 128 take the wgmma kernel's one-set configuration (two blocks a
        multiprocessor).
    wgmma_minima : bool, default True
        Strip minima run on the wgmma kernel too.
    mark_candidates : bool, default True
        The wgmma kernel's pre-test marks its candidates as it tests them, instead of testing a
        half-tile's entries again where one passed.
    triangle : bool, default True
        A graph part's own block is screened as its upper triangle where the wgmma kernel runs.
    sort_interpreted : bool, default False
        In Triton's interpreter (a CPU without a GPU), the finish's row sort runs the Triton
        kernel instead of torch's sort (tests of the kernel; ``knng.engine.row_order``).
    """

    fold_duplicates: bool = True
    screen_precision: str | None = None
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
    triangle: bool = True
    sort_interpreted: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "screen_precision":
                if value is not None and value not in SCREEN_PRECISIONS:
                    raise ValueError(f"screen_precision must be None or one of {sorted(SCREEN_PRECISIONS)}, "
                                     f"got {value!r}")
            elif f.name in ("tighten_on", "hold_on"):
                if not isinstance(value, (set, frozenset)) or not all(isinstance(v, str) for v in value):
                    raise TypeError(f"{f.name} must be a set of device types (e.g. {{'cuda'}}), got {value!r}")
                object.__setattr__(self, f.name, frozenset(value))
            elif not isinstance(value, bool):
                raise TypeError(f"{f.name} must be True or False, got {value!r}")


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
        :class:`Options` fields and their values; the others keep the values in force.

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
    current = dataclasses.replace(_CURRENT.get(), **changes)
    token = _CURRENT.set(current)
    try:
        yield current
    finally:
        _CURRENT.reset(token)
