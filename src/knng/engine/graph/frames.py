"""Frames of a graph's blocks: where each block is centred, and which pairs it can skip.

The screen's rounding bound (``docs/EXACTNESS.md``) grows with the norms of the prepared
vectors, so it is only as tight as the vectors are close to the centre they are prepared
around. One centre for the whole corpus leaves flat image regions (thousands of patches a few
grey levels apart, far from the mean) with hundreds of candidates inside the bound of their
k-th neighbour, every one of which must then be evaluated exactly. Distances do not change
under translation, so each block may be prepared around its own centre.

:class:`PrincipalFrames` orders the points along the corpus's first principal direction u
and cuts the order into parts (slabs of similar points: on the camera patches of ``knng demo``
u carries 93 % of the variance, mostly brightness). Block S(I, J) is prepared around the mean
of part I, which makes the bound of near pairs nearly relative (measured on those patches:
candidates inside the bound of the k-th, per row, mean 166 → 12, p99 888 → 18).

The same order gives a certified lower bound for free: |uᵀx − uᵀy| ≤ ‖x − y‖ for a unit u.
A row whose threshold cannot reach a part along u has nothing to find there; within a block
S(I, J), I < J, of the sorted order only a suffix of I's rows and a prefix of J's columns can
hold a pair that either side needs (:meth:`PrincipalFrames.window`), and often nothing does.

:class:`GlobalFrames` is the single-centre layout of :class:`~knng.engine.common.PreparedCorpus`
(metrics that are not translation invariant, corpora that stream from disk): every block
whole, nothing skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import torch

from knng._inputs import READ_AHEAD, InputArray, as_input
from knng._options import get_options
from knng.engine.exact import exact_pairs_of
from knng.engine.thresholds import sample_columns
from knng.metrics import Metric, lattice_point


__all__ = ["Tile", "GlobalFrames", "PrincipalFrames", "principal_direction", "slab_gain", "slab_gain_of", "Window",
           "span_window"]

#: Rows of the sample the principal direction is estimated from (any unit vector is a valid
#: bound; a better one only skips more).
DIRECTION_SAMPLE = 8192
#: Power iterations on the sample.
POWER_ITERATIONS = 40
#: On a GPU, dimensions up to this take the power iteration by squaring the Gram matrix
#: (:func:`_leading_direction`): 2·d³ operations a squaring, 0.2 GFLOP of float64 at d = 1,024.
SQUARING_MAX_D = 1024
#: Squarings of the Gram matrix: as many power iterations as 2^SQUARINGS = 64 (more than
#: POWER_ITERATIONS).
SQUARINGS = 6
#: Relative slack on a threshold's square root before it is compared along u: covers the
#: float64 roundings of the square root, of ‖u‖ and of the exact evaluation (≤ 1e-10 for
#: d ≤ 10⁵).
REACH_SLACK = 1e-6
_FP64_U = 2.0**-53


@dataclass
class Tile:
    """Rows of a part prepared around one centre: what a block needs of one side.

    ``vectors`` are in the corpus layout of :mod:`knng.metrics` (screen storage type);
    ``norms`` and ``terms`` (float64) are the prepared vectors' norms and terms, which the
    error radii of the block's pairs are computed from; ``terms32`` the float32 terms the
    fused kernel adds.
    """

    vectors: torch.Tensor
    norms: torch.Tensor
    terms: torch.Tensor | None
    terms32: torch.Tensor | None = None
    _maxima: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    _queries: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.terms32 is None and self.terms is not None:
            self.terms32 = self.terms.to(torch.float32)

    @property
    def rows(self) -> int:
        return self.vectors.shape[0]

    def maxima(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Largest norm and largest |term|: a radius valid for every row of the tile.

        0-dim float64 tensors on the tile's device: reading them on the host synchronised a GPU
        twice per tile, four times per graph block.
        """
        if self._maxima is None:
            zero = self.norms.new_zeros(())
            if self.rows == 0:
                self._maxima = (zero, zero)
            else:
                self._maxima = (self.norms.max(), self.terms.abs().max() if self.terms is not None else zero)
        return self._maxima

    def queries(self, metric: Metric, d: int) -> torch.Tensor:
        """The tile in the query layout (kept: a part is the row side of many blocks)."""
        if self._queries is None:
            self._queries = metric.query_layout(self.vectors, d)
        return self._queries

    def slice(self, start: int, stop: int) -> "Tile":
        return Tile(self.vectors[start:stop], self.norms[start:stop],
                    None if self.terms is None else self.terms[start:stop],
                    None if self.terms32 is None else self.terms32[start:stop],
                    _queries=None if self._queries is None else self._queries[start:stop])


@dataclass(frozen=True)
class Window:
    """The rows ``r0:r1`` of part I and columns ``c0:c1`` of part J a block must screen."""

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def pairs(self) -> int:
        return max(0, self.r1 - self.r0) * max(0, self.c1 - self.c0)


class CorpusLayout(Protocol):
    """What the frames read of a prepared corpus (:class:`knng.engine.common.PreparedCorpus`,
    which sits above this module)."""

    device: torch.device
    corpus: InputArray
    norms: torch.Tensor
    terms: torch.Tensor | None
    terms32: torch.Tensor | None

    def tile(self, start: int, stop: int) -> torch.Tensor: ...


class GlobalFrames:
    """Every block around the corpus's one centre (a :class:`PreparedCorpus`), nothing skipped."""

    def __init__(self, pdata: CorpusLayout, parts: list[tuple[int, int]]) -> None:
        self.pdata, self.parts = pdata, parts
        self.device = pdata.device
        self._own: dict[int, Tile] = {}
        self.n, self.d = pdata.corpus.n, pdata.corpus.d

    def block_groups(self, size: int = 1) -> Iterator[tuple[int, range]]:
        """Blocks (I, J), I < J, row part by row part (a streamed corpus reads part I once), as
        (I, up to ``size`` consecutive column parts J): one screen launch each (see
        :func:`span_window`)."""
        parts = len(self.parts)
        for i in range(parts):
            for j in range(i + 1, parts, size):
                yield i, range(j, min(parts, j + size))

    def note_done(self, row_part: int, col_part: int) -> None:
        """A resumed run passes block (I, J), done before its checkpoint (nothing to note here)."""

    def ids(self, part: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Original ids of rows ``start:stop`` of ``part`` (``stop`` may run on into the parts
        after it)."""
        i0, i1 = self.parts[part]
        return torch.arange(i0 + start, i1 if stop is None else i0 + stop, device=self.device)

    def own(self, part: int) -> Tile:
        if part not in self._own:
            i0, i1 = self.parts[part]
            self._own = {part: self._tile(i0, i1)}  # the row part of the blocks now running
        return self._own[part]

    def column(self, part: int, frame: int, start: int = 0, stop: int | None = None) -> Tile:
        """Rows ``start:stop`` of ``part`` (every frame is the one centre; ``stop`` may run on
        into the parts after it)."""
        j0, j1 = self.parts[part]
        return self._tile(j0 + start, j1 if stop is None else j0 + stop)

    def evaluate(self, metric: Metric, rows: torch.Tensor, cols: torch.Tensor, device: torch.device,
                 chunk_bytes: int | None = None) -> torch.Tensor:
        """Exact float64 distances of pairs of ids, read from the input (``chunk_bytes``: see
        :func:`~knng.engine.exact.exact_pairs`)."""
        data = self.pdata.corpus
        return exact_pairs_of(metric, data, rows, data, cols, device, chunk_bytes)

    def shared_norms(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every point's prepared norm and term by id: every block shares the one centre."""
        return self.pdata.norms, self.pdata.terms

    def window(self, row_part: int, col_part: int, tau: torch.Tensor, version: int) -> Window | None:
        """The whole block, always."""
        i0, i1 = self.parts[row_part]
        j0, j1 = self.parts[col_part]
        return Window(0, i1 - i0, 0, j1 - j0)

    def _tile(self, start: int, stop: int) -> Tile:
        p = self.pdata
        return Tile(p.tile(start, stop), p.norms[start:stop], None if p.terms is None else p.terms[start:stop],
                    None if p.terms32 is None else p.terms32[start:stop])


def principal_direction(data: InputArray, centre: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A float64 unit vector along the first principal direction of a sample of ``data``.

    Power iteration on the centred sample (never its d × d covariance: d may be large). Any
    unit vector gives a valid bound; this one makes the slabs thin where the data allow.
    """
    return _leading_direction(_direction_sample(data, device) - centre)


def slab_gain(data: InputArray, parts: int, device: torch.device) -> float:
    """How much slabs along the principal direction shrink the squared norms the screen's bound
    grows with: their sum about the mean over their sum about each slab's own mean (≥ 1).

    Estimated on the principal direction's own sample (:data:`DIRECTION_SAMPLE` rows, about their
    mean) cut into ``parts`` slabs: a read of a few thousand rows, for the planner's choice of a
    graph's method (``knng.engine.plan``). :class:`PrincipalFrames` centres its blocks on their
    row parts from ``Options.local_centre_gain`` on (measured there on every row); image patches
    give several times that, Gaussian data about 1.
    """
    if parts < 2 or data.n < 2:
        return 1.0
    rows = _direction_sample(data, device)
    rows = rows - rows.mean(dim=0)
    u = _leading_direction(rows)
    # Equal slabs along u (sizes within one, known here: no count read back), each row's from
    # its rank; the sum of squares within them is the total less Σ‖S‖²/size over the slabs'
    # sums S (float64: a gain of 10³ loses about 10⁻¹³ of it). A few dozen launches and one
    # synchronisation (2.5 ms of a 200k-point GPU graph's host time when each slab's mean was
    # gathered back to its rows).
    m = rows.shape[0]
    slabs = min(parts, m)
    order = torch.argsort(rows @ u, stable=True)
    slab = torch.empty_like(order)
    slab[order] = torch.arange(m, device=rows.device) * slabs // m
    sums = torch.zeros((slabs, rows.shape[1]), dtype=rows.dtype, device=rows.device).index_add_(0, slab, rows)
    total, *between = torch.cat([(rows * rows).sum().reshape(1), (sums * sums).sum(dim=1)]).tolist()
    sizes = [-(-(s + 1) * m // slabs) - -(-s * m // slabs) for s in range(slabs)]
    within = total - sum(b / size for b, size in zip(between, sizes))
    if within <= total * 1e-12:  # all within-slab spread lost to rounding: the rows sit on u's line
        return 1.0 if total == 0 else float("inf")
    return total / within


def slab_gain_of(data: InputArray, device: torch.device) -> Callable[[int], float]:
    """The planner's description of ``data``'s slabs: :func:`slab_gain` for a number of parts,
    read (a sample of the data) only if the planner asks."""
    return lambda parts: slab_gain(data, parts, device)


def _direction_sample(data: InputArray, device: torch.device) -> torch.Tensor:
    """The float64 rows (:data:`DIRECTION_SAMPLE` of them, a fixed stratified draw) the principal
    direction is estimated from."""
    # Drawn on the host wherever the rows live, so that a plan made from a file (`knng info`)
    # and one made from its copy on a GPU read the same rows.
    sample = sample_columns(data.n, min(data.n, DIRECTION_SAMPLE), torch.device("cpu"), seed=1)
    return data.take(sample).to(device).to(torch.float64)


def _leading_direction(rows: torch.Tensor) -> torch.Tensor:
    """Power iteration for the leading right singular vector of centred float64 ``rows``.

    For d ≤ :data:`SQUARING_MAX_D` on a GPU (``Options.squaring_max_d_cpu`` elsewhere), by repeated
    squaring of the d × d Gram matrix (:data:`SQUARINGS` products: 2^SQUARINGS iterations' worth)
    instead of one iteration after another: on a GPU a score of launches instead of 240 (40
    iterations, six operations each, all host time: 2–5 ms of a 62 ms 200k-point graph, and as
    much again where the planner estimates the slabs' gain), on a CPU one read of the sample
    instead of 80. Above those the iteration, which never forms the d × d matrix.
    """
    # The start drawn on the rows' device (drawn on the host and copied: a synchronisation).
    gen = torch.Generator(device=rows.device).manual_seed(2)
    v = torch.randn(rows.shape[1], generator=gen, dtype=torch.float64, device=rows.device)
    if rows.shape[1] <= (SQUARING_MAX_D if rows.device.type == "cuda" else get_options().squaring_max_d_cpu):
        g = rows.T @ rows
        # Scaled once by its trace: every eigenvalue in [0, 1], the largest at least 1/d, so
        # the 2^SQUARINGS-th power neither overflows nor underflows (d^-64 ≥ 2^-640 for
        # d ≤ SQUARING_MAX_D); all sample rows equal (g = 0): any direction will do, so v stays.
        # (A rescaling by the largest entry at every squaring was 24 more launches.)
        g = g / torch.trace(g).clamp_min(torch.finfo(torch.float64).tiny)
        for _ in range(SQUARINGS):
            g = g @ g
        w = g @ v
        norm = torch.linalg.vector_norm(w)
        v = torch.where(norm > 0, w / norm, v)
        return v / torch.linalg.vector_norm(v)
    for _ in range(POWER_ITERATIONS):
        w = rows.T @ (rows @ v)
        norm = torch.linalg.vector_norm(w)
        # All sample rows equal (w = 0): any direction will do, so v stays. Tested on the
        # device: a synchronisation per iteration was 4 ms of a 200k-point GPU graph's host time.
        v = torch.where(norm > 0, w / norm, v)
    return v / torch.linalg.vector_norm(v)


class PrincipalFrames:
    """Parts as slabs along the principal direction, each block centred on its row part.

    Parameters
    ----------
    data : InputArray
        The corpus (read once here: projection, order, a sorted copy on the device).
    metric : Metric
        A translation-invariant metric (the Euclidean family).
    centre : torch.Tensor
        float64 corpus mean (the origin of the projections).
    device : torch.device
    part_size : int
        Rows per part.
    dtype : torch.dtype
        The screen's storage type.
    read_rows : int
        Rows per read of ``data`` (read ahead by a background thread).
    lattice : float or None
        Round each part's mean to the nearest point of the lattice of this unit (data on a
        lattice screened with exact products: :meth:`knng.engine.common.CorpusStats.screen`), so
        that every prepared value stays a lattice point within its column's extent.
    """

    def __init__(self, data: InputArray, metric: Metric, centre: torch.Tensor, device: torch.device,
                 part_size: int, dtype: torch.dtype, read_rows: int = 4096, lattice: float | None = None) -> None:
        self.metric, self.device, self.dtype = metric, device, dtype
        self.n, self.d = data.n, data.d
        self._live = False  # some block of the current distance J − I had a window
        u = principal_direction(data, centre, device)
        proj = torch.empty(self.n, dtype=torch.float64, device=device)
        # The inputs go to the device once; the sorted copy is gathered there (a host gather of
        # a 582k × 64 float32 corpus cost ~0.15 s of a 3.5 s GPU graph).
        raw_all = torch.empty((self.n, self.d), dtype=data.dtype, device=device)
        # The largest norm and the sum of squares stay on the device until the last block.
        radius_t = torch.zeros((), dtype=torch.float64, device=device)
        total_t = torch.zeros((), dtype=torch.float64, device=device)
        for start, raw in data.iter_blocks(read_rows, read_ahead=READ_AHEAD, pin=device.type == "cuda"):
            raw = raw.to(device)
            raw_all[start:start + raw.shape[0]] = raw
            x = raw.to(torch.float64) - centre
            proj[start:start + raw.shape[0]] = x @ u
            norms = torch.linalg.vector_norm(x, dim=1)
            radius_t = torch.maximum(radius_t, norms.max())
            total_t = total_t + (norms * norms).sum()
        radius, total = (float(v) for v in torch.stack([radius_t, total_t]).tolist())
        self.proj, self.order = torch.sort(proj, stable=True)
        # |computed uᵀ(x − μ) − uᵀ(x − μ)| ≤ (d + 2)·u₆₄·‖u‖·‖x − μ‖ per projection.
        self.eps = 2.0 * (self.d + 4) * _FP64_U * radius * 1.01 + 1e-300
        self.sorted = raw_all[self.order]
        del raw_all
        #: Sorted position of each original id.
        self.position = torch.empty_like(self.order)
        self.position[self.order] = torch.arange(self.n, device=device)
        self._sorted_input = as_input(self.sorted, data.name)
        self.parts = [(s, min(self.n, s + part_size)) for s in range(0, self.n, part_size)]
        self.centres = [self.sorted[i0:i1].to(torch.float64).mean(dim=0) for i0, i1 in self.parts]
        if lattice is not None:
            self.centres = [lattice_point(c, lattice) for c in self.centres]
        within = float(torch.stack([((self.sorted[i0:i1].to(torch.float64) - c) ** 2).sum()
                                    for (i0, i1), c in zip(self.parts, self.centres)]).sum())
        #: Whether blocks are centred on their row part. Only where that shrinks the squared
        #: norms the bound grows with (by at least Options.local_centre_gain overall): otherwise every
        #: block would prepare its columns again for nothing (Gaussian data: +12 % of a CPU graph).
        self.local = within <= total / get_options().local_centre_gain
        if not self.local:
            self.centres = [centre] * len(self.parts)
        self._own: dict[int, Tile] = {}
        self._whole_tile: Tile | None = None
        # Each part's first and last position along u, as Python floats.
        ends = torch.tensor([[i0, i1 - 1] for i0, i1 in self.parts], device=device)
        self._ends_t = self.proj[ends]
        self._ends = [tuple(e) for e in self._ends_t.tolist()]
        self._starts = ends[:, 0]
        self._lengths = ends[:, 1] - ends[:, 0] + 1
        self._reach_version = -1
        self._since_refresh = 0
        self._ahead = self._behind = self.proj
        self._ahead_range: list[tuple[float, float]] = []
        self._behind_range: list[tuple[float, float]] = []
        self._ranges = self._ahead_max = self._behind_min = self.proj
        self._bands: dict[int, list[list[int]]] = {}

    def evaluate(self, metric: Metric, rows: torch.Tensor, cols: torch.Tensor, device: torch.device,
                 chunk_bytes: int | None = None) -> torch.Tensor:
        """Exact float64 distances of pairs of original ids (``cols`` (p,) or (m, w)), read from
        the sorted copy on the device: the same input values, so the same distances, without
        reading a host array again for every batch of candidates."""
        return exact_pairs_of(metric, self._sorted_input, self.position[rows], self._sorted_input,
                              self.position[cols], device, chunk_bytes)

    def ids(self, part: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Original ids of rows ``start:stop`` of ``part`` (sorted positions → input rows;
        ``stop`` may run on into the parts after it)."""
        i0, i1 = self.parts[part]
        return self.order[i0 + start:i1 if stop is None else i0 + stop]

    def own(self, part: int) -> Tile:
        """``part`` prepared around its own centre (kept: a part is the row side of many blocks).

        With one centre for every block, the parts are slices of one prepared copy of the sorted
        corpus, so that a block's columns may span several parts (:meth:`column`)."""
        if part not in self._own:
            if self.local:
                self._own[part] = self._prepare(part, part)
            else:
                i0, i1 = self.parts[part]
                self._own[part] = self._whole().slice(i0, i1)
        return self._own[part]

    def _whole(self) -> Tile:
        """The sorted corpus prepared around the one centre, part by part into one copy (the
        float64 temporaries of one part at a time)."""
        if self._whole_tile is None:
            first = self._prepare(0, 0)
            vectors = first.vectors.new_empty((self.n, first.vectors.shape[1]))
            norms = first.norms.new_empty(self.n)
            terms = None if first.terms is None else first.terms.new_empty(self.n)
            for part, (i0, i1) in enumerate(self.parts):
                tile = first if part == 0 else self._prepare(part, part)
                vectors[i0:i1], norms[i0:i1] = tile.vectors, tile.norms
                if terms is not None and tile.terms is not None:
                    terms[i0:i1] = tile.terms
            self._whole_tile = Tile(vectors, norms, terms)
        return self._whole_tile

    def shared_norms(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Every point's prepared norm and term by original id when all blocks share one centre
        (then survivors need not carry theirs), else None."""
        if self.local:
            return None
        whole = self._whole()
        norms = torch.empty(self.n, dtype=torch.float64, device=self.device)
        norms[self.order] = whole.norms
        terms = None
        if self.metric.uses_terms and whole.terms is not None:
            terms = torch.empty_like(norms)
            terms[self.order] = whole.terms
        return norms, terms

    def column(self, part: int, frame: int, start: int = 0, stop: int | None = None) -> Tile:
        """Rows ``start:stop`` of ``part`` prepared around the centre of part ``frame`` (``stop``
        may run on into the parts after it, except in ``part``'s own frame)."""
        i0, i1 = self.parts[part]
        stop_at = i1 if stop is None else i0 + stop
        if not self.local:
            return self._whole().slice(i0 + start, stop_at)
        if part == frame:
            return self.own(part).slice(start, stop_at - i0)
        return self._prepare(part, frame, start, stop)

    def block_groups(self, size: int = 1) -> Iterator[tuple[int, range]]:
        """Blocks (I, J), I < J, nearest first (J − I = 1, 2, …), as (I, up to ``size``
        consecutive column parts J) in bands of ``size`` distances: thresholds tighten on the near
        slabs before the far ones are tested. Once every block of one band is skipped, so are all
        further ones (along u they are further still, and thresholds only shrink)."""
        parts = len(self.parts)
        for offset in range(1, parts, size):
            self._live = False
            for i in range(parts - offset):
                yield i, range(i + offset, min(parts, i + offset + size))
            if not self._live:
                return

    def note_done(self, row_part: int, col_part: int) -> None:
        """A resumed run passes block (I, J), done before its checkpoint: count it as live, so that
        the blocks of its distance are never all taken as skipped (conservative: the further
        distances' windows are then tested rather than assumed empty)."""
        self._live = True

    def _prepare(self, part: int, frame: int, start: int = 0, stop: int | None = None) -> Tile:
        i0, i1 = self.parts[part]
        stop_at = i1 if stop is None else i0 + stop
        prep = self.metric.prepare(self.sorted[i0 + start:stop_at], self.centres[frame], side="corpus",
                                   symmetric=True, dtype=self.dtype)
        return Tile(prep.vectors, prep.norms, prep.terms)

    def reach(self, tau: torch.Tensor) -> torch.Tensor:
        """How far along u a row with threshold ``tau`` (squared distance) can find anything."""
        root = torch.sqrt(tau.clamp_min(0.0))
        return root * (1.0 + REACH_SLACK) + 2.0 * self.eps

    def _refresh_reach(self, tau: torch.Tensor, version: int) -> None:
        """Every point's reach along u from ``tau``, and each part's range of it (one sync).

        Also, per part, the running maximum of the rows' furthest reach ahead and the suffix
        minimum of the nearest reach behind: what :meth:`_band` finds windows in.
        """
        reach = self.reach(tau[self.order])
        self._ahead, self._behind = self.proj + reach, self.proj - reach
        parts, size = len(self.parts), self.parts[0][1] - self.parts[0][0]
        pad = parts * size - self.n

        def per_part(values: torch.Tensor, fill: float) -> torch.Tensor:
            return torch.cat([values, values.new_full((pad,), fill)]).view(parts, size)

        ahead_lo, behind_hi = per_part(self._ahead, -torch.inf), per_part(self._behind, torch.inf)
        self._ranges = torch.stack([per_part(self._ahead, torch.inf).amin(1), ahead_lo.amax(1),
                                    behind_hi.amin(1), per_part(self._behind, -torch.inf).amax(1)], dim=1)
        ranges = self._ranges.tolist()
        self._ahead_range = [(r[0], r[1]) for r in ranges]
        self._behind_range = [(r[2], r[3]) for r in ranges]
        # Padding: -inf ahead never reaches, +inf behind never reaches back.
        self._ahead_max = torch.cummax(ahead_lo, dim=1).values
        self._behind_min = torch.flip(torch.cummin(torch.flip(behind_hi, [1]), dim=1).values, [1])
        self._bands = {}
        self._reach_version = version

    def window(self, row_part: int, col_part: int, tau: torch.Tensor, version: int) -> Window | None:
        """The rows of ``row_part`` and columns of ``col_part`` (``row_part < col_part``) that can
        hold a pair either side needs, or None when no pair can.

        ``tau`` holds every point's threshold by original id; ``version`` changes whenever it
        does (older thresholds are larger, so a window from them is merely wider).

        Rows of I and columns of J are sorted along u. Row i needs column j only if
        p_j − p_i ≤ reach(τᵢ) (``reach`` bounds ‖x − y‖ ≥ |uᵀ(x − y)| with the roundings),
        column j needs row i only if p_j − p_i ≤ reach(τⱼ). The pairs that pass either test lie
        in a suffix of I's rows × a prefix of J's columns: rows from the first that reaches
        J's first column, or that a reaching column reaches back to; columns up to the last
        that reaches I's last row, or that a reaching row reaches.
        """
        self._since_refresh += 1
        if self._reach_version != version and (self._reach_version < 0 or self._since_refresh > len(self.parts) // 4):
            # Older thresholds are larger, so their windows are merely wider: refreshing after
            # every store update would cost more than it saves.
            self._refresh_reach(tau, version)
            self._since_refresh = 0
        i0, i1 = self.parts[row_part]
        j0, j1 = self.parts[col_part]
        first_col, last_col, first_row, last_row = self._ends[col_part] + self._ends[row_part]
        least_ahead, most_ahead = self._ahead_range[row_part]
        least_behind, most_behind = self._behind_range[col_part]
        if most_ahead < first_col and least_behind > last_row:
            return None
        self._live = True
        if least_ahead >= last_col or most_behind <= first_row:
            return Window(0, i1 - i0, 0, j1 - j0)  # some side needs the whole block
        offset = col_part - row_part
        if offset not in self._bands:
            self._bands[offset] = self._band(offset)
        r0, c1 = self._bands[offset][row_part]
        return Window(r0, i1 - i0, 0, c1)

    def _band(self, offset: int) -> list[list[int]]:
        """``[r0, c1]`` of the windows of every block (I, I + offset) under the current reach.

        One batched computation and one transfer for a whole band of blocks (per block, its
        few steps and the transfer of their result synchronised a GPU three times). For block
        (I, J): the first row of I whose reach ahead meets J's first column (the first position
        where I's running maximum of it does), or from which the nearest column needing I
        lies ahead; the last column of J whose reach behind meets I's last row (the columns
        whose suffix minimum of it does), or up to the furthest that a needing row reaches.
        """
        parts = len(self.parts)
        rows = torch.arange(parts - offset, device=self.device)
        cols = rows + offset
        first_col, last_row = self._ends_t[cols, 0], self._ends_t[rows, 1]
        least_behind, most_ahead = self._ranges[cols, 2], self._ranges[rows, 1]
        inf = torch.full_like(first_col, torch.inf)
        lowest = torch.where(least_behind <= last_row, least_behind, inf)      # min over needing columns
        furthest = torch.where(most_ahead >= first_col, most_ahead, -inf)      # max over needing rows
        first_needing = torch.minimum(torch.searchsorted(self._ahead_max[rows], first_col[:, None])[:, 0],
                                      self._lengths[rows])
        after_needing = torch.searchsorted(self._behind_min[cols], last_row[:, None], right=True)[:, 0]
        # Positions along u are sorted across parts: a search in the whole order, clipped to a part.
        from_lowest = (torch.searchsorted(self.proj, lowest) - self._starts[rows]).clamp(min=0)
        to_furthest = (torch.searchsorted(self.proj, furthest, right=True) - self._starts[cols]).clamp(min=0)
        r0 = torch.minimum(first_needing, torch.minimum(from_lowest, self._lengths[rows]))
        c1 = torch.maximum(after_needing, torch.minimum(to_furthest, self._lengths[cols]))
        return torch.stack([r0, c1], dim=1).tolist()


def span_window(frames: "GlobalFrames | PrincipalFrames", row_part: int, col_parts: range, tau: torch.Tensor,
                version: int) -> tuple[Window, int] | None:
    """One window over the blocks (``row_part``, J) of consecutive column parts ``col_parts``, and
    how many of them have a window of their own; None when none has.

    Its columns run from the first column any member's window needs to the last (positions
    relative to the first member's start, so past the end of its part), its rows from the
    first any member needs: a superset of the members' windows, which only screens more pairs
    (each against valid thresholds), in one launch instead of one per member.
    """
    base = frames.parts[col_parts[0]][0]
    r0 = r1 = c0 = c1 = -1
    live = 0
    for part in col_parts:
        window = frames.window(row_part, part, tau, version)
        if window is None:
            continue
        offset = frames.parts[part][0] - base
        if live == 0:
            r0, r1, c0 = window.r0, window.r1, offset + window.c0
        r0, r1 = min(r0, window.r0), max(r1, window.r1)
        c1 = offset + window.c1
        live += 1
    return None if live == 0 else (Window(r0, r1, c0, c1), live)
