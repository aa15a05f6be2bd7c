"""The direct path of small calls: every score in one product, each row's k + m best, a
certificate that they hold its k nearest, the exact finish (``plan.direct``).

A search runs it from :func:`knng.engine.search.exact_search`, a small graph from
``knng.engine.graph.rows.direct_graph``; radius queries take its centring and rounding bound
(``knng.engine.search.radius``).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

from knng._inputs import InputArray, rows_on
from knng._options import get_options
from knng.engine import stages
from knng.engine.exact import (
    ROUNDED_METRICS,
    ExactStats,
    exact_pairs_of,
    near_midpoints,
    sort_by_distance_then_index,
)
from knng.engine.kernels import in_background
from knng.engine.store import summarize_levels
from knng.metrics import Metric
from knng.select import resolve as resolve_select

__all__ = ["DirectRows", "direct_neighbours", "release_captured", "direct_rounding_bound", "product_dtype", "DIRECT_MARGIN",
           "DIRECT_SLACK", "DIRECT_WIDER", "DIRECT_CENTRE_SAMPLE", "DIRECT_CENTRE_FAR"]


# ---------------------------------------------------------------------------- the direct path
# Small calls in one product: every score, each row's best few, a certificate, the exact finish.
#
# Below a few million scores on a CPU, a hundred million on a GPU (``Options.direct_max_scores``,
# ``direct_max_scores_gpu``), the block pipeline's planning, preparation, sampling and per-block
# steps cost more than the call's arithmetic (a 5,000 × 64 graph on a 2-core CPU: tens of
# milliseconds of them; a 5,000 × 128 graph on an H200: 5 ms against 2 of the direct path). A
# call the planner marks :attr:`~knng.engine.plan.EnginePlan.direct` runs here instead, a chunk
# of rows at a time:
#
# 1. the scores ``s = ‖c‖² − 2 q·c`` of every row against every corpus vector, in one product
#    (float32 for float32, float16 and bfloat16 inputs, float64 otherwise), a graph's own pair
#    set to +inf where it is not counted;
# 2. each row's ``w = k + m`` smallest scores (:data:`DIRECT_MARGIN`), by the call's ``select``;
# 3. a certificate: every score is within ``E`` of its exact value (the product's rounding,
#    below), so where the ``w``-th score exceeds the k-th by more than ``2E``, every vector left
#    out is farther than k of the candidates, and the row's exact k nearest are among them;
# 4. the candidates' exact distances (:func:`~knng.engine.exact.exact_pairs_of`, the engine's own
#    evaluation) and the k first by (distance, index), the engine's order.
#
# Rows whose certificate fails (more than ``m`` near-ties at the k-th score: duplicates, integer
# ties) are returned for the rest of the plan to answer. Non-finite inputs are left to the
# pipeline too, which names the first bad row. A call synchronises with the host twice: on a
# sample of the corpus, before any large work is queued (whether to centre, below), and at the
# end, for whether the inputs were finite and which rows failed. Nothing in between waits for
# the GPU: the bound is computed there from the largest norm, so the host queues the product,
# the selection and the finish while the GPU runs them (a small call's host time, its launches,
# is longer than its GPU time: a synchronisation in the middle left the GPU idle meanwhile).
#
# The rows are centred first, on the mean of a sample of the corpus (:data:`DIRECT_CENTRE_SAMPLE`
# rows, in the product's type: one more rounding of each coordinate, in the bound), where that
# mean is far from the origin next to the sample's spread (:data:`DIRECT_CENTRE_FAR`): the
# rounding bound grows with the norms, and data far from the origin (3-d points 2 km away) would
# otherwise certify no row. Near the origin centring widens nothing much and costs a pass over
# the corpus and its copy (0.38 ms of a 100 × 1M × 128 search on an H200), so the rows are
# multiplied as they are. Any centre serves the bound, which takes the norms of the rows
# multiplied.
#
# The rounding bound. With ``u`` the unit roundoff of the product's type and ``γ_d = d·u / (1 −
# d·u)``, a product's dot product is within ``γ_d ‖q‖ ‖c‖`` of the exact one in any order of
# summation (Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1); ``‖c‖²`` comes
# from its norm in the product's type, squared (within ``(γ_d + 4u) ‖c‖²``: the sum of squares,
# the root, the square), and the sum is rounded once more, so
# ``|fl(s) − s| ≤ (γ_d + 5u) ‖c‖² + 2(γ_d + u) ‖q‖ ‖c‖`` up to terms of order u², which
# :data:`DIRECT_SLACK` covers (:func:`direct_rounding_bound`). The bound of a row takes the
# corpus's largest ``‖c‖``. The product runs in IEEE arithmetic (``full_precision``: no TF32,
# which measured slower here: the rows its wider bound left uncertified needed a second,
# float32 pass, ``docs/FINDINGS.md``).

#: Candidates a row keeps beyond its k: ``m = DIRECT_MARGIN + k // 8``. A row fails its certificate only
#: where more than m scores lie within 2E above its k-th.
DIRECT_MARGIN = 8
#: The second pass's candidates a row, as a multiple of the first's (k + m): a 100 × 1M search
#: at k = 10 keeps 19 candidates a row, its uncertified rows 304.
DIRECT_WIDER = 16
#: Factor on the first-order rounding bound, for its terms of order u².
DIRECT_SLACK = 1.25
#: Scores one chunk of rows holds at most, by device type, besides the plan's work bytes. On a
#: CPU a chunk's scores stay in the cache for the selection: a 5,000 × 64 graph's product and
#: selection took 50 ms in chunks of 256–512 rows against 90 ms whole, a search of 100 queries
#: in 100,000 × 64 24 ms in chunks of 50 rows against 32 ms (2-core CPU, 2026-11-30, torch 2.13).
DIRECT_CHUNK_SCORES = {"cpu": 1 << 21}
#: Elsewhere (a GPU): one launch of each step for up to this many scores (512 MB of float32).
DIRECT_CHUNK_SCORES_DEVICE = 1 << 27
#: Rows of the corpus whose mean is the centre (every ``n // DIRECT_CENTRE_SAMPLE``-th row): the
#: whole corpus's mean took 1 ms of a 13 ms search of 200 queries in 10,000 × 128 on a 2-core CPU,
#: 0.3 ms of a 100 × 1M × 128 search on an H200; any centre serves the bound.
DIRECT_CENTRE_SAMPLE = 4096
#: The rows are centred where the sample's mean has a squared norm above this share of the
#: sample's mean squared distance from it: below, the largest norm the bound takes grows by at
#: most about a quarter of the spread (the bound by about 1.6×), less than a pass over the corpus
#: costs a small call.
DIRECT_CENTRE_FAR = 1 / 16

_SMALL_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
#: Half the square root of float64's largest value: rows of norms below it give finite squares of
#: every score's magnitude, (‖q‖ + ‖c‖)².
_HALF_ROOT_OF_LARGEST = math.sqrt(torch.finfo(torch.float64).max) / 2


def product_dtype(queries: InputArray, corpus: InputArray) -> torch.dtype:
    """The type the direct path (and a radius query) multiplies in: float32 where both inputs
    are float32, float16 or bfloat16 (exact in it), float64 otherwise."""
    return torch.float32 if queries.dtype in _SMALL_FLOATS and corpus.dtype in _SMALL_FLOATS else torch.float64


def direct_rounding_bound(c_max: "float | torch.Tensor", q_norms: torch.Tensor, d: int, dtype: torch.dtype,
                          times: float = 1.0) -> torch.Tensor:
    """Each row's bound E on ``|fl(s) + ‖q‖² − ‖q − c‖²|`` for the direct path's scores of
    centred rows (the section's comment), multiplied by ``times``: ``c_max`` the largest norm of
    the centred corpus (a number, or a float64 tensor of one on the rows' device), ``q_norms``
    the centred rows' (float64), ``dtype`` the product's. Rows multiplied as they are take the
    same bound with their own norms (it then counts a centring's rounding that did not happen).

    The product's rounding: ``‖c‖²`` is its norm in ``dtype``, squared (within ``(γ_d + 4u)
    ‖c‖²``), the dot product within ``γ_d ‖q‖ ‖c‖``, the sum rounded once. The centring's: each
    coordinate of ``q − μ`` and ``c − μ`` is rounded once, which moves a distance by at most
    ``η = u (‖q‖ + ‖c‖) / (1 − u)`` and its square by ``η (2 (‖q‖ + ‖c‖) + η) = κ (‖q‖ +
    ‖c‖)²`` with ``κ = u/(1 − u) · (2 + u/(1 − u))``. The sum, ``‖q‖ (κ ‖q‖ + b ‖c‖) + a ‖c‖²``,
    takes a few operations on the rows' device (each a launch on a GPU, where a small call's
    host time is its launches).
    """
    unit = torch.finfo(dtype).eps / 2
    gamma = d * unit / (1 - d * unit)
    shift = unit / (1 - unit)
    kappa = shift * (2 + shift)
    scale = DIRECT_SLACK * times
    bound = torch.add(q_norms * (scale * kappa), c_max, alpha=scale * 2 * (gamma + unit + kappa))
    bound *= q_norms
    bound += c_max * c_max * (scale * (gamma + 5 * unit + kappa))
    return bound


class DirectRows:
    """What :func:`direct_neighbours` found: every row's k nearest (−1 / +inf where a row failed
    its certificate), the rows that failed, the exact evaluations made, the candidates a row
    kept in each pass (``widths``: the first pass's, and the wider second pass's where one ran),
    how many rows the second pass took (``widened``) and whether the distances are known to be
    on their exact values' sides already (``rounded``: :func:`~knng.engine.exact.round_as_exact`
    would move none)."""

    def __init__(self, indices: torch.Tensor, distances: torch.Tensor, failed: torch.Tensor, stats: ExactStats,
                 widths: list[int], widened: int, rounded: bool = False):
        self.indices, self.distances, self.failed, self.stats = indices, distances, failed, stats
        self.widths, self.widened, self.rounded = widths, widened, rounded

    def per_row(self) -> dict[str, float]:
        """The report's per-row summary (median, p99, max) of the candidates each row screened and
        evaluated: the first pass's width, plus the second's for the rows it took (a row that
        failed both counts its direct passes only)."""
        rows = self.indices.shape[0]
        if len(self.widths) == 1:
            return summarize_levels([(self.widths[0], rows)])
        return summarize_levels([(self.widths[0], rows - self.widened), (sum(self.widths), self.widened)])


@dataclass
class _Prepared:
    """What a pass multiplies and bounds with: the rows in the product's type (centred or not),
    the corpus's squared norms (the product's bias), the rows' float64 norms, the corpus's
    largest norm (float64, on the device) and whether the inputs are finite (a device flag)."""

    q: torch.Tensor
    c: torch.Tensor
    squares: torch.Tensor
    q_norms64: torch.Tensor
    c_max: torch.Tensor
    finite: torch.Tensor


def _prepare(queries: InputArray, corpus: InputArray, dtype: torch.dtype, centred: bool,
             exclude_self: bool) -> _Prepared:
    """The rows as the product takes them (the section's comment): no synchronisation."""
    c = corpus.tensor.to(dtype)
    q = c if exclude_self else queries.tensor.to(dtype)
    if centred:
        # The sample's mean again (the decision's was read before): a capture recomputes it from
        # the corpus where it lies, so a corpus changed in place is centred on its own mean.
        mean = c[::max(1, corpus.n // DIRECT_CENTRE_SAMPLE)].mean(dim=0)
        c = c - mean
        q = c if exclude_self else q - mean
    c_norms = torch.linalg.vector_norm(c, dim=1)  # in the product's type (float64's took 11 ms of 100k × 64)
    q_norms = c_norms if exclude_self else torch.linalg.vector_norm(q, dim=1)
    c_max = c_norms.max()
    largest = c_max if exclude_self else torch.maximum(c_max, q_norms.max())
    # Non-finite inputs (or a centre that overflows), and scores that could overflow, go to the
    # pipeline: every score is at most (‖q‖ + ‖c‖)² ≤ (2 max(‖q‖, ‖c‖))² in magnitude (compared
    # in the norms' type: float32's limit is infinite there, and NaN compares false). Read with
    # the certificate, at the end: such inputs cost a small call's work for nothing, the others
    # wait for nothing.
    finite = largest < _HALF_ROOT_OF_LARGEST
    # The scores come out of one product with the squares as its bias, the rows scaled by −2
    # (exactly: a power of two): a 1-D bias with unit factors is added in the product's epilogue
    # (cuBLASLt), where a broadcast one is first copied into the output (0.24 ms of a 100 × 1M
    # search on an H200).
    return _Prepared(q, c, c_norms ** 2, q_norms.double(), c_max.double(), finite)


def _certify(prep: _Prepared, queries: InputArray, corpus: InputArray, rows: torch.Tensor | None, w: int, k: int,
             metric: Metric, device: torch.device, dtype: torch.dtype, chunk: int, select: str,
             exclude_self: bool, out_idx: torch.Tensor, out_dist: torch.Tensor) -> tuple[torch.Tensor, int]:
    """One pass over ``rows`` (all where None) keeping ``w`` candidates a row: their k nearest
    written into ``out_idx``/``out_dist``. Returns which of the rows it certified (a device
    flag a row) and the exact evaluations it made; it does not wait for the device."""
    count = queries.n if rows is None else rows.numel()
    available = corpus.n - 1 if exclude_self else corpus.n
    twice_bound = direct_rounding_bound(prep.c_max, prep.q_norms64 if rows is None else prep.q_norms64[rows],
                                        corpus.d, dtype, times=2.0)
    sure = torch.ones(count, dtype=torch.bool, device=device)
    # qms and the grouped filter select float32 keys (float64 scores go to torch.topk),
    # and a small call's selection must not wait for the host (qms reads back the rows it
    # failed).
    pick = resolve_select(select if dtype == torch.float32 else "topk", rows=min(chunk, count), cols=corpus.n, k=w,
                          device=device, without_sync=True)
    evaluations = 0
    for r0 in range(0, count, chunk):
        r1 = min(count, r0 + chunk)
        ids = torch.arange(r0, r1, device=device) if rows is None else rows[r0:r1]
        scores = torch.addmm(prep.squares, (prep.q[r0:r1] if rows is None else prep.q[ids]) * -2, prep.c.T)
        if exclude_self:
            scores.scatter_(1, ids[:, None], torch.inf)
        values, cand = pick(scores, w, sorted=True)
        del scores
        if w < available:  # the w-th and k-th scores' difference, exact in float64
            sure[r0:r1] = (values[:, w - 1].double() - values[:, k - 1].double()) > twice_bound[r0:r1]
        exact = exact_pairs_of(metric, queries, ids, corpus, cand, device)
        evaluations += exact.numel()
        if rows is None:
            out_idx[r0:r1], out_dist[r0:r1] = sort_by_distance_then_index(exact, cand, k)
        else:
            out_idx[ids], out_dist[ids] = sort_by_distance_then_index(exact, cand, k)
    return sure, evaluations


@dataclass
class _FirstPass:
    """The first pass's results: every row's k nearest, which rows it certified, the flags read
    at its end (the inputs finite, every row certified, any distance near a float32 midpoint),
    the prepared rows a second pass reuses, and the exact evaluations it made."""

    prep: _Prepared
    out_idx: torch.Tensor
    out_dist: torch.Tensor
    sure: torch.Tensor
    flags: torch.Tensor
    evaluations: int


def _first_pass(queries: InputArray, corpus: InputArray, k: int, w: int, metric: Metric, device: torch.device,
                dtype: torch.dtype, chunk: int, select: str, exclude_self: bool, centred: bool) -> _FirstPass:
    prep = _prepare(queries, corpus, dtype, centred, exclude_self)
    out_idx = torch.empty((queries.n, k), dtype=torch.int64, device=device)
    out_dist = torch.empty((queries.n, k), dtype=torch.float64, device=device)
    sure, evaluations = _certify(prep, queries, corpus, None, w, k, metric, device, dtype, chunk, select,
                                 exclude_self, out_idx, out_dist)
    # Whether any answer lies near a float32 midpoint (what :func:`round_as_exact` would settle),
    # read with the certificate instead of by a synchronisation of its own.
    near = near_midpoints(out_dist, corpus.d) if metric.name in ROUNDED_METRICS else torch.zeros_like(sure)
    return _FirstPass(prep, out_idx, out_dist, sure, torch.stack([prep.finite, sure.all(), near.any()]), evaluations)


# ------------------------------------------------------------------ the first pass, replayed
# A small call's host work is its launches: about a hundred operations of ~10–20 µs each
# (H200 host, torch 2.11), against 0.7 ms of GPU work for a 5,000 × 128 graph. Repeated calls
# of one shape — a service's batches of queries against one corpus, a loop of small graphs —
# replay the first pass as a CUDA graph instead: one launch.
#
# The second call of a kind (below) captures the pass (the first ran it as it is, so that
# cuBLAS and the kernels are set up), later ones replay it. A capture reads the corpus where it
# lies: its address, shape, strides and type are part of the kind, so a replay reads whatever
# that memory holds then — the same tensor, changed in place or not, or another of the same
# layout put there since; everything derived from it (centring, norms) is recomputed inside.
# A search's queries are copied into the capture's own buffer (a few rows). The centring
# decision (the first synchronisation, on a sample) is taken before, as always, and is part of
# the kind. The options in force are too (the object: a new ``knng.options`` block is a new kind).
#
# A capture holds its memory (the scores, the prepared rows) in a private pool while it is
# kept: at most ``Options.direct_graphs`` captures, least recently used first out, of at most
# ``Options.direct_graph_max_bytes`` scores and copies each. Only on a GPU, never in the
# background compilation's thread. Calls from several threads take turns on a capture (a
# lock, and an event the next call's stream waits for). A capture that fails is not tried
# again for its kind: the pass runs as it is.

@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    queries: torch.Tensor | None  # a search's queries are copied here before a replay
    result: _FirstPass
    stages: Counter
    options: object  # the options the kind was captured under (kept alive: their id is in the kind)
    # One call at a time uses a capture's tensors (calls from several threads): the host waits
    # for the lock, the next call's stream for the event recorded where the last call's work on
    # them ended.
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: "torch.cuda.Event | None" = None


_CAPTURED: "OrderedDict[tuple, _Captured | None]" = OrderedDict()
_SEEN: "OrderedDict[tuple, None]" = OrderedDict()
_SEEN_KEPT = 64
_CAPTURING = threading.Lock()
#: The stream captures are made on, one per device (taken under ``_CAPTURING``): cuBLAS keeps a
#: workspace for each stream it has run on (32 MB), so a new stream per capture would leave one
#: behind each time.
_CAPTURE_STREAMS: "dict[int, torch.cuda.Stream]" = {}


def release_captured() -> None:
    """Drop every captured first pass and its memory (the next calls run as the first of their kind)."""
    with _CAPTURING:
        _CAPTURED.clear()
        _SEEN.clear()


def _capture_kind(queries: InputArray, corpus: InputArray, k: int, w: int, metric: Metric, device: torch.device,
                  dtype: torch.dtype, chunk: int, select: str, exclude_self: bool, centred: bool) -> tuple | None:
    """The kind of a first pass that may be captured, or None where it may not."""
    options = get_options()
    if device.type != "cuda" or options.direct_graphs <= 0 or in_background():
        return None
    c = corpus.tensor
    element = torch.finfo(dtype).bits // 8
    held = queries.n * corpus.n * element + (corpus.n * corpus.d * element if centred or c.dtype != dtype else 0)
    if held > options.direct_graph_max_bytes:
        return None
    q = queries.tensor
    return (device.index, id(options), dtype, c.data_ptr(), tuple(c.shape), tuple(c.stride()), c.dtype,
            None if exclude_self else (tuple(q.shape), q.dtype), k, w, metric.name, chunk, select, centred)


def _captured(kind: tuple, queries: InputArray, corpus: InputArray, args: tuple,
              exclude_self: bool) -> tuple[_Captured | None, bool]:
    """The capture of ``kind`` (made now where the kind ran once before) and whether it was made
    now; None where the pass runs as it is."""
    with _CAPTURING:
        if kind in _CAPTURED:
            _CAPTURED.move_to_end(kind)
            return _CAPTURED[kind], False
        if kind not in _SEEN:
            _SEEN[kind] = None
            while len(_SEEN) > _SEEN_KEPT:
                _SEEN.popitem(last=False)
            return None, False
        entry = _CAPTURED[kind] = _capture(queries, corpus, args, exclude_self)
        while len(_CAPTURED) > get_options().direct_graphs:
            _CAPTURED.popitem(last=False)
        return entry, True


@contextlib.contextmanager
def _replayed(kind: tuple | None, queries: InputArray, corpus: InputArray, args: tuple,
              exclude_self: bool) -> Iterator[_FirstPass | None]:
    """The first pass replayed for ``kind``, its outputs copied out, for the block's use of it
    (the prepared rows stay the capture's: the block holds the capture); None where the pass
    runs as it is."""
    entry, captured_now = (None, False) if kind is None else _captured(kind, queries, corpus, args, exclude_self)
    if entry is None:
        yield None
        return
    stream = torch.cuda.current_stream(args[3])
    with entry.lock:
        if entry.done is not None:
            stream.wait_event(entry.done)
        if entry.queries is not None:
            entry.queries.copy_(queries.tensor)
        entry.graph.replay()
        if not captured_now:  # the capture counted its stages as it recorded them
            for name, times in entry.stages.items():
                stages.count(name, times)
        stages.count("direct.replayed")
        found = entry.result
        try:
            # The capture's answers are rewritten by its next replay: the caller gets copies (its
            # flags are read within the block, under the lock).
            yield replace(found, out_idx=found.out_idx.clone(), out_dist=found.out_dist.clone())
        finally:
            entry.done = torch.cuda.Event()
            entry.done.record(stream)


def _capture(queries: InputArray, corpus: InputArray, args: tuple, exclude_self: bool) -> _Captured | None:
    """The first pass captured as a CUDA graph (not yet run), or None where capturing failed."""
    device = args[3]
    static = None if exclude_self else queries.tensor.clone(memory_format=torch.contiguous_format)
    rows = corpus if exclude_self else InputArray(queries.name, "torch", queries.shape, static.dtype, device,
                                                 tensor=static)
    graph = torch.cuda.CUDAGraph()
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
    side = _CAPTURE_STREAMS[index]
    side.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(side):
            # Once as it is on the capture's stream first: cuBLAS makes its handle for this thread
            # and stream at the first product, which a capture may not (a thread's first capture
            # failed so, where the kind's first call had run in another thread).
            with stages.uncounted():
                _first_pass(rows, corpus, *args)
        with torch.cuda.stream(side), stages.recording() as counted:
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                result = _first_pass(rows, corpus, *args)
            finally:
                graph.capture_end()
    except Exception:  # noqa: BLE001 - an operation that cannot be captured: the pass runs as it is
        return None
    finally:
        torch.cuda.current_stream(device).wait_stream(side)
    return _Captured(graph, static, result, counted, get_options())


def direct_neighbours(queries: InputArray, corpus: InputArray, k: int, metric: Metric, device: torch.device,
                      work_bytes: int, select: str = "auto", exclude_self: bool = False) -> DirectRows | None:
    """Each query's exact k nearest corpus vectors by the direct path (the section's comment).

    ``exclude_self``: a graph (``queries`` is ``corpus``) without each point's own pair. Returns
    None where an input is not finite (the pipeline reports it). ``work_bytes`` bounds a chunk's
    scores (and :data:`DIRECT_CHUNK_SCORES`); ``select`` picks each row's candidates
    (:func:`knng.select.resolve`). On a GPU, repeated calls of one kind replay their first pass
    as a CUDA graph (the comment above :class:`_Captured`).
    """
    stages.count("direct")
    nq, n = queries.n, corpus.n
    available = n - 1 if exclude_self else n
    dtype = product_dtype(queries, corpus)
    # The inputs as tensors on the device (views where they already are): the exact finish
    # gathers its candidates' rows from them.
    corpus = rows_on(corpus, device)
    queries = corpus if exclude_self else rows_on(queries, device)
    if n == 0:
        return None
    sample = corpus.tensor[::max(1, n // DIRECT_CENTRE_SAMPLE)].to(dtype)
    mean = sample.mean(dim=0)
    # The first synchronisation: the sample's root sum of squares and its mean's norm (whose
    # difference of squares, the spread, may cancel far from the origin: a rule's input, not a
    # bound's).
    total, offset = torch.stack([torch.linalg.vector_norm(sample), torch.linalg.vector_norm(mean)]).tolist()
    centred = offset ** 2 > DIRECT_CENTRE_FAR * (total ** 2 / sample.shape[0] - offset ** 2)
    if centred:
        stages.count("direct.centred")
    most = DIRECT_CHUNK_SCORES.get(device.type, DIRECT_CHUNK_SCORES_DEVICE)
    chunk = max(1, min(nq, most // max(1, n), work_bytes // max(1, 3 * n * torch.finfo(dtype).bits // 8)))
    w = min(available, k + DIRECT_MARGIN + k // 8)
    args = (k, w, metric, device, dtype, chunk, select, exclude_self, centred)
    with _replayed(_capture_kind(queries, corpus, *args), queries, corpus, args, exclude_self) as first:
        return _finish(first or _first_pass(queries, corpus, *args), queries, corpus, args, available)


def _finish(first: _FirstPass, queries: InputArray, corpus: InputArray, args: tuple, available: int
            ) -> DirectRows | None:
    """:func:`direct_neighbours` after its first pass: the flags read (the last synchronisation),
    the rows it could not certify through a second, wider pass."""
    k, w, metric, device, dtype, chunk, select, exclude_self, _ = args
    nq = queries.n
    stats = ExactStats()
    prep, out_idx, out_dist = first.prep, first.out_idx, first.out_dist
    stats.exact_evaluations += first.evaluations
    # The last synchronisation: whether the inputs were finite, and whether every row holds.
    inputs_finite, all_sure, near = first.flags.tolist()
    if not inputs_finite:
        return None
    if w >= available or all_sure:
        bad = torch.empty(0, dtype=torch.int64, device=device)
    else:
        bad = torch.nonzero(~first.sure).flatten()
    # The rows that failed (most calls: none) go through a second pass with
    # :data:`DIRECT_WIDER` candidates, which settles the ties of real data (zero descriptors,
    # integer photon counts, flat patches) short of the largest groups; the rows it cannot
    # certify either go to the rest of the plan.
    widths, widened = [w], int(bad.numel())
    if widened:
        widths.append(min(available, DIRECT_WIDER * w))
        stages.count("direct.wider")
        sure, evaluations = _certify(prep, queries, corpus, bad, widths[-1], k, metric, device, dtype, chunk, select,
                                     exclude_self, out_idx, out_dist)
        stats.exact_evaluations += evaluations
        if widths[-1] < available and not bool(sure.all()):
            bad = bad[torch.nonzero(~sure).flatten()]
        else:
            bad = torch.empty(0, dtype=torch.int64, device=device)
    if bad.numel():
        out_idx[bad], out_dist[bad] = -1, torch.inf
        stages.count("direct.uncertified")
    stats.rows = nq - int(bad.numel())
    # Answers of the first pass alone, none near a midpoint, are on their exact values' sides
    # already: the caller need not look again (:func:`round_as_exact`'s own synchronisation).
    return DirectRows(out_idx, out_dist, bad, stats, widths, widened, rounded=not widened and not near)
