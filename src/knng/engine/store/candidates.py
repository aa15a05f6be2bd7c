"""Per-row candidate stores: what each row's proof needs, kept while the screen runs.

Every row i carries a threshold τᵢ that is provably at least the score of its k-th true
neighbour, and a small store of the candidates whose certified lower bound is ≤ τᵢ. The screen
hands in survivors (pairs whose lower bound passed the row's threshold); they wait until enough
are pending (one update per block was most of a CPU graph's time), then the store takes them in
until its capacity is reached, then **tightens**: τᵢ becomes the k-th smallest certified upper
bound among what it holds and everything above τᵢ is dropped. A row whose near-ties still
overflow the capacity (duplicates, flat image regions, integer data) has its candidates
evaluated exactly, from the input vectors, in float64; exact candidates beyond the k-th by
(distance, index) can never come back, so the row fits again. No row is ever re-screened
against the corpus.

A store may instead hold its survivors back as flat lists (:class:`~knng.engine.store.held.HoldingStore`,
a GPU's search and graph); it takes them in here where they outgrow their limit or a checkpoint
needs the state.

The finish takes, for every row, the candidates whose lower bound is ≤ the final τᵢ (a
superset of the true top k: every pair left out had a lower bound above some earlier, larger
τᵢ), evaluates those it cannot order from the screen alone, and sorts by (distance, index).

Units: *keys* are scores in the screen's units (the distance is
``metric.to_distance(key + offset)``); each entry keeps the radius of its key's interval
(the screen's error bound, or the conversion slack once it is exact) and, once evaluated, its
float64 distance.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from knng._options import get_options
from knng.engine import stages
from knng.engine.kernels import (
    decoded, float32_up, kth_of_rows, pair_radius_runs, radius_runs, row_ends, seed_rows, tighten_rows,
    top_by_distance,
)
from knng.engine.store.entries import (
    Block, Entries, code64_up, compact, overlapping_sorted, pad, rebuild_groups, rounded_up, sorted_counts,
)
from knng.engine.store.errors import PairErrors, PairNorms
from knng.engine.store.stats import StoreStats

__all__ = ["CandidateStore", "Evaluator", "DEFAULT_PENDING"]

#: Pending survivors that trigger a store update unless the plan says (see CandidateStore.add).
DEFAULT_PENDING = 1 << 15
#: Evaluate a row's entries as one (row, columns) batch once 1/DENSE_EVALUATION of them need it.
DENSE_EVALUATION = 2

#: ``evaluate(rows, cols) -> float64 distances`` for store-local rows and global column ids:
#: pairs (``rows`` and ``cols`` of one shape (p,)) or batches (``rows`` (m,), ``cols`` (m, w)).
Evaluator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class CandidateStore:
    """Candidates of ``n`` rows, at most ``capacity`` each, with a threshold per row.

    Parameters
    ----------
    n, k, capacity : int
        Rows, neighbours wanted, and candidates kept per row (``capacity ≥ k``).
    errors : PairErrors
        The per-pair error model of the screen (rows indexed like the store).
    evaluate : callable
        ``evaluate(rows, cols)``: exact float64 distances of store rows and global columns.
    device : torch.device
    pending : int
        Survivors that may wait before the store takes them in (:attr:`EnginePlan.pending_pairs`).
    work_bytes : int, optional
        Bytes a tightening's temporaries may take (:attr:`EnginePlan.work_bytes`); default: the
        device's ``Options.rebuild_entries_cpu`` padded entries.
    """

    def __init__(self, n: int, k: int, capacity: int, errors: PairErrors, evaluate: Evaluator,
                 device: torch.device, pending: int = DEFAULT_PENDING, work_bytes: int | None = None,
                 ) -> None:
        if capacity < k:
            raise ValueError(f"capacity {capacity} < k {k}")
        self.n, self.k, self.capacity = n, k, capacity
        self.errors, self.evaluate, self.device = errors, evaluate, device
        entries = get_options().rebuild_entries_cpu if device.type == "cpu" else get_options().rebuild_entries_gpu
        # About 80 bytes of temporaries per entry of a store update's sort (or padded entry of an
        # exact evaluation of near-ties), within four times the work bytes (a quarter of the
        # budget: the CPU's default budget keeps Options.rebuild_entries_cpu).
        room = None if work_bytes is None else 4 * work_bytes // 80
        self.rebuild_entries = entries if room is None else int(max(capacity, min(entries, room)))
        #: Entries whose temporaries the work bytes hold (None: no bound): the finish's last
        #: take-in sorts every entry at once, so it runs only where they fit (:meth:`_take_last`).
        self.room_entries = room
        # The tables (keys, rad, idx, dist: n × capacity each) are made at their first use
        # (:meth:`__getattr__`).
        self.count = torch.zeros(n, dtype=torch.int64, device=device)
        self.tau = torch.full((n,), torch.inf, dtype=torch.float64, device=device)
        self.stats = StoreStats()
        # Rows whose store has been evaluated exactly at least once (a report counter).
        self._overflowed = torch.zeros(n, dtype=torch.bool, device=device)
        self._evaluations = torch.zeros(n, dtype=torch.int64, device=device)
        # Pairs the screen handed in per row, before the store's own test (a report counter:
        # how selective the screen's precision was).
        self._screened = torch.zeros(n, dtype=torch.int64, device=device)
        # Survivors handed in but not yet taken into the store (see add).
        self.flush_size = max(1, pending)
        # Each batch: (rows, cols, float64 keys, the norms the pairs bring, or their radii already
        # computed (held pairs taken in), or None for the store's own norms).
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, PairNorms | torch.Tensor | None]] = []
        self._pending_size = 0
        #: Survivors handed in so far (:meth:`add`), counted once they are the store's, whether
        #: pending, held or taken in: a caller whose hand-over raised (out of memory) reads from
        #: it whether the pairs went in before the error, so that a retry does not hand them twice.
        self.pairs_handed_in = 0
        #: Flushes so far: thresholds change only at a flush or a seed.
        self.updates = 0
        self._interrupted = False  # a flush failed part-way; the next one drops repeats
        self._tile_tightenings = torch.zeros((), dtype=torch.int64, device=device)  # see tighten
        # Whether candidates may have been taken in (add, a checkpoint's state): known on the
        # host, so that a store that holds its survivors back knows at its finish, without reading
        # counts back, whether they are all there is.
        self._taken_in = False

    #: Whether the store holds its survivors back as flat lists (:class:`~knng.engine.store.held.HoldingStore`).
    holds_back = False

    #: The candidate tables, n × capacity each, and what an empty entry holds: ``keys`` (the
    #: screened or exact keys), ``rad`` (each entry's error radius, or an exact key's conversion
    #: slack, kept so that a tightening need not recompute the bounds of what the store holds),
    #: ``idx`` (column ids), ``dist`` (exact distances once evaluated).
    TABLES = {"keys": (torch.inf, torch.float64), "rad": (torch.inf, torch.float64), "idx": (-1, torch.int64),
              "dist": (torch.nan, torch.float64)}

    def __getattr__(self, name: str) -> torch.Tensor:
        """The candidate tables (:data:`TABLES`), made at their first use: 32 bytes an entry,
        which a store that holds its survivors back and finishes from them never uses (2 GB of
        a 582k-point patch graph's peak at k = 100)."""
        if name not in CandidateStore.TABLES or "capacity" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        for table, (empty, dtype) in CandidateStore.TABLES.items():
            setattr(self, table, torch.full((self.n, self.capacity), empty, dtype=dtype, device=self.device))
        return self.__dict__[name]

    # ----------------------------------------------------------------------------- checkpoints
    #: The tensors a checkpoint saves: the candidates, thresholds and per-row report counters.
    STATE_TENSORS = ("keys", "rad", "idx", "dist", "count", "tau", "_screened", "_evaluations", "_overflowed")

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """Everything a resumed run needs to go on as if never stopped (pending pairs taken in
        first): the tensors of :data:`STATE_TENSORS` and the counters, as plain ints."""
        self.flush()
        tensors = {name.lstrip("_"): getattr(self, name) for name in self.STATE_TENSORS}
        counters = dict(vars(self.stats), updates=self.updates)
        return tensors, counters

    def load_state(self, tensors: dict[str, "torch.Tensor"], counters: dict[str, int]) -> None:
        """Restore what :meth:`state` returned (tensors may come from NumPy, any device)."""
        for name in self.STATE_TENSORS:
            mine = getattr(self, name)
            saved = tensors[name.lstrip("_")]
            # A read-only memory map (a checkpoint's file) is copied: torch wants writable memory.
            saved = saved if isinstance(saved, torch.Tensor) else torch.from_numpy(np.array(saved))
            if saved.shape != mine.shape or saved.dtype != mine.dtype:
                raise ValueError(f"checkpoint store {name!r}: {tuple(saved.shape)} {saved.dtype}, "
                                 f"expected {tuple(mine.shape)} {mine.dtype}")
            mine.copy_(saved)
        self.stats = StoreStats(**{f: int(counters[f]) for f in vars(StoreStats())})
        self.updates = int(counters["updates"])
        self._pending, self._pending_size, self._interrupted = [], 0, False
        self._taken_in = True

    def rows_state(self, slots: slice) -> dict[str, torch.Tensor]:
        """The :data:`STATE_TENSORS` of store rows ``slots`` (views; pending pairs taken in first):
        what a store kept off the device (``knng.engine.store.lists``) saves of one band."""
        self.flush()
        return {name.lstrip("_"): getattr(self, name)[slots] for name in self.STATE_TENSORS}

    def load_rows(self, slots: slice, tensors: dict[str, torch.Tensor]) -> None:
        """Put the saved state of one band into store rows ``slots`` (nothing may be pending).

        Thresholds change: :attr:`updates` counts it, so that thresholds cached by callers are
        computed again.
        """
        if self._pending:
            raise RuntimeError("load_rows with survivors pending: flush first")
        for name in self.STATE_TENSORS:
            getattr(self, name)[slots].copy_(tensors[name.lstrip("_")], non_blocking=True)
        self.updates += 1
        self._taken_in = True

    def clear_rows(self, slots: slice, tau: torch.Tensor) -> None:
        """Empty store rows ``slots`` for other points whose thresholds are ``tau`` (bounds proved
        elsewhere, or +inf); nothing may be pending or held (a store whose rows take turns: a
        distributed rank's row part). :attr:`updates` counts it, as :meth:`load_rows` does."""
        if self._pending:
            raise RuntimeError("clear_rows with survivors pending: flush first")
        self.keys[slots] = torch.inf
        self.rad[slots] = torch.inf
        self.idx[slots] = -1
        self.dist[slots] = torch.nan
        self.count[slots] = 0
        self.tau[slots] = tau
        self._screened[slots] = 0
        self._evaluations[slots] = 0
        self._overflowed[slots] = False
        self.updates += 1

    def lower_thresholds(self, slots: slice, tau: torch.Tensor) -> None:
        """τ of store rows ``slots`` ← min(τ, ``tau``): upper bounds of the rows' k-th distances that
        another store proved (another rank's candidates of the same points)."""
        self.tau[slots] = torch.minimum(self.tau[slots], tau)
        self.updates += 1

    # ------------------------------------------------------------------------------- exchange
    def pack(self, slots: slice | None = None) -> torch.Tensor:
        """The store's rows (``slots``, default all) as one float64 (rows, 3·capacity + 1) array:
        keys, ids, distances, τ.

        Column ids stay exact in float64 (below 2⁵³). :meth:`from_packs` rebuilds a store from
        several packs of the same rows (a distributed graph gathers a part's stores so).
        """
        self.flush()
        at = slice(None) if slots is None else slots
        return torch.cat([self.keys[at], self.idx[at].to(torch.float64), self.dist[at], self.tau[at, None]], dim=1)

    @classmethod
    def from_packs(cls, packs: list[torch.Tensor], k: int, errors: PairErrors, evaluate: Evaluator,
                   device: torch.device) -> "CandidateStore":
        """One store holding every candidate of several packs of the same rows, τ the smallest.

        Each pack's candidates passed that pack's τ, which is ≥ the merged one, so the merged
        store keeps all a row's proof needs; :meth:`finish` prunes against the merged τ.
        """
        widths = [(p.shape[1] - 1) // 3 for p in packs]
        n = packs[0].shape[0]
        store = cls(n, k, max(k, sum(widths)), errors, evaluate, device)
        keys, idx, dist = [], [], []
        for p, w in zip(packs, widths):
            keys.append(p[:, :w])
            idx.append(p[:, w:2 * w].to(torch.int64))
            dist.append(p[:, 2 * w:3 * w])
            store.tau = torch.minimum(store.tau, p[:, 3 * w])
        store.keys, store.idx, store.dist = torch.cat(keys, 1), torch.cat(idx, 1), torch.cat(dist, 1)
        store.count = (store.idx >= 0).sum(dim=1)
        store.rad = store._radii(store.keys, store.idx, store.dist)
        store._taken_in = True
        return store

    def _radii(self, keys: torch.Tensor, idx: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
        """Radii of all entries of the padded arrays of every row (a pack carries none)."""
        rows = torch.arange(self.n, device=self.device)[:, None].expand_as(idx)
        exact = ~torch.isnan(dist)
        screened = self.errors.err(rows, idx.clamp_min(0), torch.where(exact, 0.0, keys))
        _, slack = self.errors.exact_key(rows, torch.where(exact, dist, 0.0))
        return torch.where(idx >= 0, torch.where(exact, slack, screened), torch.inf)

    # ------------------------------------------------------------------------------ thresholds
    def screen_thresholds(self, rows: torch.Tensor, max_col_norm: "float | torch.Tensor",
                          max_col_term: "float | torch.Tensor",
                          row_norms: torch.Tensor | None = None, row_terms: torch.Tensor | None = None
                          ) -> torch.Tensor:
        """Per-row thresholds on raw screen keys for a block: keep s̃ ≤ τ + err(block).

        ``row_norms``/``row_terms``: the rows as the block prepared them (its own centre), if
        not the store's.
        """
        return self.errors.block_thresholds(rows, self.tau, max_col_norm, max_col_term, row_norms, row_terms)

    def seed(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor | None = None,
             *, distinct: bool = False) -> None:
        """Tighten τ of ``rows`` from k or more screened candidates each (``cols``/``keys``: (m, w)).

        Any k columns' largest certified upper bound is at least the k-th smallest true key,
        so the seeds need not be kept: the full screen finds them again. ``distinct``: each
        row's columns are distinct, and its k-th smallest upper bound (that of its k smallest),
        rounded up to float32, is taken rather than the largest (by ``kth_of_rows``' bisection:
        16,384 rows of 1,056 float64 bounds took 1.33 ms in ``torch.kthvalue``). ``rad``: the
        keys' error radii, if the block was prepared in a frame of its own (default: the store's).
        """
        if cols.shape[1] < self.k:
            return
        errors = self.errors
        kth = distinct and cols.shape[1] > self.k
        if (rad is None and not kth and errors.row_norms is not None and errors.col_norms is not None
                and radius_runs(self.tau, errors.row_norms, errors.row_terms, errors.row_offsets,
                                          errors.col_norms, errors.col_terms)):
            # The radii, the bounds and the update in one launch (knng.engine.kernels.radius): the same values.
            seed_rows(errors.metric, errors.d, errors.precision, errors.centre_norm, errors.slack, rows, cols,
                             keys, self.tau, errors.row_norms, errors.row_terms, errors.row_offsets, errors.col_norms,
                             errors.col_terms)
            self.updates += 1
            return
        if rad is None:
            rad = self.errors.err(rows[:, None].expand_as(cols), cols, keys)
        hi = keys.to(torch.float64) + rad
        hi = torch.where(cols >= 0, hi, torch.inf)
        if kth:
            bound = decoded(kth_of_rows(float32_up(hi), self.k)[1]).to(torch.float64)
        else:
            bound = hi.max(dim=1).values
        self.tau[rows] = torch.minimum(self.tau[rows], bound)
        self.updates += 1

    def tighten(self, rows: torch.Tensor, keys: torch.Tensor, max_col_norm: "float | torch.Tensor",
                max_col_term: "float | torch.Tensor") -> None:
        """τ ← min(τ, an upper bound of the k-th smallest key among one block's fresh survivors).

        ``rows``/``keys``: the survivors one side of one block kept (store rows, screen keys);
        a row's pairs must have distinct columns, which one block's list has. The block's
        columns have norms and terms at most ``max_col_norm``/``max_col_term`` (as for
        :meth:`screen_thresholds`). The k-th smallest key of a row plus an error radius valid
        for every key up to it bounds k distinct columns' true keys, so it is at least the
        row's k-th true key, as the store's own tightening is; it costs one selection over the
        survivors instead of a store update, so the next blocks of a screen run on thresholds
        that already know this one (a 1M × 128 search at k = 10 let 220 pairs per row through
        with the sample's thresholds alone, 105 with this after its first tile). The pairs are not
        taken in: hand them to :meth:`add` as well.
        """
        stages.count("store.tighten")
        if rows.numel() < self.k:
            return
        # Each row's smallest and k-th key (order codes of the keys rounded up to float32, which
        # only raises the k-th): one int64 sort of the pairs, or on a GPU a selection in each
        # row's segment without one (knng.engine.kernels.row_kth): the same codes.
        first, kth, counts = row_ends(rows, keys, self.n, self.k)
        self.tighten_ends(first, kth, counts, max_col_norm, max_col_term)

    def tighten_ends(self, first: torch.Tensor, kth: torch.Tensor, counts: torch.Tensor,
                     max_col_norm: "float | torch.Tensor", max_col_term: "float | torch.Tensor",
                     counted: bool = True) -> None:
        """:meth:`tighten` after its selection: every store row's smallest and k-th key order
        code among k or more distinct columns' keys, and how many it has (``row_kth.row_ends``;
        fewer than k: not tightened). The columns' norms and terms are at most the maxima.
        ``counted``: count the rows tightened in ``stats.tightenings`` (seeds are not)."""
        errors = self.errors
        tightened = self._tile_tightenings if counted else torch.zeros((), dtype=torch.int64, device=self.device)
        if (errors.row_norms is not None and not isinstance(max_col_norm, torch.Tensor)
                and not isinstance(max_col_term, torch.Tensor)
                and radius_runs(self.tau, errors.row_norms, errors.row_terms, errors.row_offsets)):
            # What follows, in one launch (knng.engine.kernels.radius): the same values.
            tighten_rows(errors.metric, errors.d, errors.precision, errors.centre_norm, errors.slack,
                                first, kth, counts, self.k, self.tau, tightened, errors.row_norms,
                                errors.row_terms, errors.row_offsets, max_col_norm, max_col_term)
        else:
            self._tighten_ends(first, kth, counts, max_col_norm, max_col_term, tightened)
        self.updates += 1

    def _tighten_ends(self, first: torch.Tensor, kth: torch.Tensor, counts: torch.Tensor,
                      max_col_norm: "float | torch.Tensor", max_col_term: "float | torch.Tensor",
                      tightened: torch.Tensor) -> None:
        """:meth:`tighten_ends` by torch (the reference of ``radius.tighten_rows``)."""
        first = decoded(first).to(torch.float64)
        kth = decoded(kth).to(torch.float64)
        # The radius grows with |key + offset|, which is largest at an end of [first, kth]; the
        # ends widen by 2⁻²⁰ to cover float64 keys rounded to float32.
        every = torch.arange(self.n, device=first.device)
        offsets = self.errors.row_offsets
        first, kth = first - first.abs() * 2.0**-20, kth + kth.abs() * 2.0**-20
        far = torch.where((first + offsets).abs() > (kth + offsets).abs(), first, kth)
        rad = self.errors.block_err(every, far, max_col_norm, max_col_term)
        torch.minimum(self.tau, torch.where(counts >= self.k, kth + rad, torch.inf), out=self.tau)
        # Rows tightened, counted on the device (a count read here would be a synchronisation
        # between a search's tiles): the finish adds them to stats.tightenings.
        tightened += (counts >= self.k).sum()

    # ------------------------------------------------------------------------------------ add
    def add(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, norms: "PairNorms | None" = None
            ) -> None:
        """Hand in screen survivors: store rows ``rows``, global columns ``cols``, screen ``keys``.

        ``norms``: the norms and terms the pairs were prepared with, when their block was
        prepared around a centre of its own (:class:`~knng.engine.graph.frames.PrincipalFrames`);
        by default the store's own give the error radii.

        They wait with others until ``pending`` pairs are (see the constructor), then are taken in
        together: the store's update is a few dozen small operations whatever its size, and
        one per block was most of a CPU graph's time (2,016 blocks of 64,009 points: 5.2 s
        of 11.5). Thresholds tighten only at a flush, so the screen meanwhile runs on
        slightly older, still valid, thresholds.
        """
        stages.count("store.add")
        if rows.numel() == 0:
            return
        self._taken_in = True
        self._pending.append((rows, cols, keys.to(torch.float64), norms))
        self._pending_size += rows.numel()
        self.pairs_handed_in += rows.numel()
        if self._pending_size >= self.flush_size:
            self.flush()

    def take_whole_rows(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor,
                        kept: torch.Tensor) -> bool:
        """Take in every survivor of ``rows`` at once, in place, without a flush's sort: the
        ``kept`` entries of (m, w) global columns ``cols``, screen ``keys`` and their error radii
        ``rad`` (a block that holds each row's whole selection: its own part's, materialised).

        Only for rows that hold nothing yet (and a store that takes its survivors in); returns False,
        taking nothing, otherwise (the caller hands the pairs to :meth:`add`). Rows whose
        survivors under τ exceed the capacity go through the flush's merge (ties settled).
        """
        stages.count("store.take_whole_rows")
        if bool((self.count[rows] > 0).any()):
            return False
        self._taken_in = True
        keep = kept & (keys - rad <= self.tau[rows][:, None])
        per_row = keep.sum(dim=1)
        fits = per_row <= self.capacity
        # The rows that fit are counted and written here; the others' pairs go to _take whole,
        # which counts and tests them itself.
        self._screened.index_add_(0, rows, torch.where(fits, kept.sum(dim=1), 0))
        self.stats.survivors += int(torch.where(fits, per_row, 0).sum())
        slot = torch.cumsum(keep, dim=1) - 1
        r, c = torch.nonzero(keep & fits[:, None], as_tuple=True)
        flat = rows[r] * self.capacity + slot[r, c]
        for table, values in ((self.keys, keys[r, c]), (self.rad, rad[r, c]), (self.idx, cols[r, c]),
                              (self.dist, torch.full_like(flat, torch.nan, dtype=torch.float64))):
            table.view(-1).index_copy_(0, flat, values.to(table.dtype))
        self.count[rows] = torch.where(fits, per_row, 0)
        if not bool(fits.all()):
            r, c = torch.nonzero(kept & ~fits[:, None], as_tuple=True)
            self._take(rows[r], cols[r, c], keys[r, c], rad[r, c])
        self.updates += 1
        return True

    def would_flush(self, pairs: int) -> bool:
        """Whether :meth:`add` of ``pairs`` survivors would take the pending ones in (which changes τ)."""
        return pairs > 0 and self._pending_size + pairs >= self.flush_size

    def flush(self) -> None:
        """Take every pending survivor into the store (tightening rows that overflow)."""
        if not self._pending:
            return
        rows, cols, keys, rad = self._pending_pairs()
        # Pending pairs are dropped only once taken in: after an error part-way through (out of
        # memory), the caller retries its block and the whole pending set is offered again,
        # without the pairs the store already took (a pair counted twice among a row's k
        # upper bounds would tighten τ below its k-th distinct candidate).
        self._interrupted = True
        self._take(rows, cols, keys, rad)
        self._interrupted = False
        self._pending, self._pending_size = [], 0
        self.updates += 1


    def _pending_pairs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every pending survivor as flat (rows, cols, float64 keys, error radii), each pair once
        (after an interrupted flush, without those the store already holds)."""
        parts = self._pending
        if all(p[3] is None for p in parts):
            # The store's own norms for every pair: gathered with the radii, for the whole batch.
            rows, cols, keys = (parts[0][f] if len(parts) == 1 else torch.cat([p[f] for p in parts])
                                for f in range(3))
            rad = self.errors.err(rows, cols, keys)
        elif pair_radius_runs(self.errors.row_offsets) or any(isinstance(p[3], torch.Tensor) for p in parts):
            # Each part's radii from its own norms in one launch (no concatenated copies of them),
            # or as they were held.
            rows, cols, keys, rad = (torch.cat(f) for f in zip(*(
                (r, c, k, self.errors.err(r, c, k) if n is None else n if isinstance(n, torch.Tensor)
                 else self.errors.radius(*n, k, r))
                for r, c, k, n in parts)))
        else:
            # torch's radii for the whole batch at once: one part at a time would be ~25
            # operations each, and a CPU update takes many small parts in.
            parts = [(r, c, k, self.errors.norms_of(r, c) if n is None else n) for r, c, k, n in parts]
            rows, cols, keys = (torch.cat([p[f] for p in parts]) for f in range(3))
            norms = PairNorms.cat([p[3] for p in parts])
            rad = self.errors.radius(*norms, keys, rows)
        if self._interrupted:
            rows, cols, keys, rad = self._without_repeats(rows, cols, keys, rad)
        return rows, cols, keys, rad

    def _take_last(self) -> bool:
        """Take the pending survivors in for the finish, widening the store instead of tightening
        rows to its capacity; returns False (and leaves them pending) where that would not fit.

        Nothing comes after the finish, so no row needs to fit its capacity again: one sort of
        everything by (row, certified upper bound) gives each row's τ as its k-th upper bound, and
        the store becomes every entry under its row's τ, as wide as the widest row. The
        capacity's tightenings and the exact evaluation of near-ties that overflow it (about 300
        small operations and a dozen synchronisations on a GPU, 5 ms of a 30 ms search) are left
        to the rows the finish cannot order. Rows too wide for :attr:`rebuild_entries` padded
        entries (flat image regions with thousands of near-ties) take the flush instead; τ keeps
        what this step tightened, which holds whatever follows. So does a store whose entries,
        pending and held, are more than :attr:`room_entries`, before any is sorted.
        """
        if self.room_entries is not None and self._pending_size + self.n * self.capacity > self.room_entries:
            # What it would sort (every pending and held entry, with ~80 bytes of temporaries
            # each) does not fit the work bytes: the flush's merge goes by ranges of rows
            # instead. Building it first and finding it too wide after took a 40,000-point CPU
            # graph under a 32 MB budget to an 83 MB peak (45 MB without) and 0.5 s.
            return False
        rows, cols, keys, rad = self._pending_pairs()
        new = rows.numel()
        rows, cols, keys, rad, dist = self._with_stored(None, rows, cols, keys, rad, torch.full_like(keys, torch.nan))
        fresh = torch.arange(rows.numel(), device=rows.device) < new
        offered = rows[:new]
        rows, cols, keys, rad, dist, fresh = compact(keys - rad <= self.tau[rows], rows, cols, keys, rad, dist, fresh)
        if rows.numel() == 0:
            self._screened.index_add_(0, offered, torch.ones_like(offered))
            self._pending, self._pending_size = [], 0
            return True
        order, shift = self._by_row_and_upper(rows, keys + rad)
        rows, cols, keys, rad, dist, fresh = (t[order] for t in (rows, cols, keys, rad, dist, fresh))
        per_row = sorted_counts(rows, self.n)
        starts = torch.cumsum(per_row, 0) - per_row
        full = per_row >= self.k
        kth = (keys + rad)[(starts + self.k - 1).clamp_max(rows.numel() - 1)]
        torch.minimum(self.tau, torch.where(full, rounded_up(kth, shift), torch.inf), out=self.tau)
        rows, cols, keys, rad, dist, fresh = compact(keys - rad <= self.tau[rows], rows, cols, keys, rad, dist, fresh)
        kept = sorted_counts(rows, self.n)
        width, taken, tightened = torch.stack([kept.max(), fresh.sum(), full.sum()]).tolist()
        if width * self.n > self.rebuild_entries and width > self.capacity:
            return False
        starts = torch.cumsum(kept, 0) - kept
        slot = torch.arange(rows.numel(), device=rows.device) - starts[rows]
        width = max(width, self.capacity)
        # Every table is built before any replaces the store's: an out-of-memory error leaves the
        # store as it was (τ tightened, which holds), and the caller retries the chunk.
        tables = {}
        for name, empty, values in (("keys", torch.inf, keys), ("rad", torch.inf, rad), ("idx", -1, cols),
                                    ("dist", torch.nan, dist)):
            tables[name] = torch.full((self.n, width), empty, dtype=values.dtype, device=self.device)
            tables[name][rows, slot] = values
        for name, table in tables.items():
            setattr(self, name, table)
        self.capacity, self.count = width, kept
        self._screened.index_add_(0, offered, torch.ones_like(offered))
        self.stats.survivors += int(taken)
        self.stats.tightenings += int(tightened)
        self._pending, self._pending_size = [], 0
        self.updates += 1
        return True

    def _without_repeats(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pairs offered once, and not already held by the store."""
        pair = rows * (int(cols.max()) + 1 if cols.numel() else 1) + cols
        pair, order = torch.sort(pair, stable=True)
        first = torch.ones_like(pair, dtype=torch.bool)
        first[1:] = pair[1:] != pair[:-1]
        rows, cols, keys, rad = (t[order][first] for t in (rows, cols, keys, rad))
        held = (self.idx[rows] == cols[:, None]).any(dim=1)
        return rows[~held], cols[~held], keys[~held], rad[~held]

    def _take(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor) -> None:
        # On a GPU every data-dependent size is a synchronisation: each step below gathers by
        # positions from one nonzero (or passes output_size) instead of indexing several
        # tensors by the same mask, which synchronised once per tensor.
        self._screened.index_add_(0, rows, torch.ones_like(rows))
        rows, cols, keys, rad = compact(keys - rad <= self.tau[rows], rows, cols, keys, rad)
        if rows.numel() == 0:
            return
        self.stats.survivors += int(rows.numel())
        new = torch.zeros_like(self.count).index_add_(0, rows, torch.ones_like(rows))
        over = self.count + new > self.capacity
        # A merge sorts the new survivors with everything held by the rows that overflow; rows
        # are cut into ranges of at most rebuild_entries such entries (one range, mostly).
        if rows.numel() + self.n * self.capacity <= self.rebuild_entries:  # a bound known without a synchronisation
            self._merge(rows, cols, keys, rad, new, over)
            return
        merged = torch.cumsum(new + torch.where(over, self.count, 0), 0)
        total = int(merged[-1])
        if total <= self.rebuild_entries:
            self._merge(rows, cols, keys, rad, new, over)
            return
        cuts = torch.searchsorted(merged, torch.arange(self.rebuild_entries, total, self.rebuild_entries,
                                                       device=merged.device), right=True)
        bounds = [0, *sorted(set(cuts.tolist()) - {0, self.n}), self.n]
        for r0, r1 in zip(bounds[:-1], bounds[1:]):
            part = compact((rows >= r0) & (rows < r1), rows, cols, keys, rad)
            in_range = torch.zeros_like(over)
            in_range[r0:r1] = True
            self._merge(*part, torch.where(in_range, new, 0), over & in_range)

    def _with_stored(self, store_rows: torch.Tensor | None, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor,
                   rad: torch.Tensor, dist: torch.Tensor) -> list[torch.Tensor]:
        """Flat entries (rows, cols, keys, rad, dist) followed by every entry the store holds for
        ``store_rows`` (None: all rows)."""
        if store_rows is None:
            held_rows, slot = torch.nonzero(self.idx >= 0, as_tuple=True)
        else:
            r, slot = torch.nonzero(self.idx[store_rows] >= 0, as_tuple=True)
            held_rows = store_rows[r]
        return [torch.cat(pair) for pair in (
            (rows, held_rows), (cols, self.idx[held_rows, slot]), (keys, self.keys[held_rows, slot]),
            (rad, self.rad[held_rows, slot]), (dist, self.dist[held_rows, slot]))]

    def _by_row_and_upper(self, rows: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The order of entries by (row, certified upper bound) from one int64 sort, and the
        ``shift`` their bounds were rounded up by (to the 63 − ⌈log₂ n⌉ bits the row leaves;
        :func:`~knng.engine.store.entries.rounded_up` with it gives the bound a k-th may take)."""
        shift = max(1, (self.n - 1).bit_length()) + 1
        return torch.sort(rows * 2**(64 - shift) + code64_up(upper, shift)).indices, shift

    def _merge(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor,
               new: torch.Tensor, over: torch.Tensor) -> None:
        """Take survivors in (``new`` of them per row); rows flagged ``over`` would overflow and tighten.

        One int64 sort orders the survivors and every entry the overflowing rows hold by (row,
        certified upper bound): a row's τ becomes min(τ, its k-th upper bound), everything whose
        lower bound lies above goes, and the rest is written back in that order. The upper
        bounds are rounded up to the 63 − ⌈log₂ n⌉ bits the row leaves (only raising the k-th).
        A row whose near-ties still exceed the capacity has them evaluated exactly
        (:meth:`_settle_ties`).
        """
        over_rows = torch.nonzero(over).flatten()
        dist = torch.full_like(keys, torch.nan)
        if over_rows.numel():
            self.stats.tightenings += int(over_rows.numel())
            rows, cols, keys, rad, dist = self._with_stored(over_rows, rows, cols, keys, rad, dist)
        order, shift = self._by_row_and_upper(rows, keys + rad)
        rows, cols, keys, rad, dist = rows[order], cols[order], keys[order], rad[order], dist[order]
        if over_rows.numel():
            per_row = sorted_counts(rows, self.n)
            starts = torch.cumsum(per_row, 0) - per_row
            kth = (keys + rad)[starts[over_rows] + self.k - 1]
            self.tau[over_rows] = torch.minimum(self.tau[over_rows], rounded_up(kth, shift))
            rows, cols, keys, rad, dist = compact(~over[rows] | (keys - rad <= self.tau[rows]),
                                                   rows, cols, keys, rad, dist)
        kept = sorted_counts(rows, self.n)
        starts = torch.cumsum(kept, 0) - kept
        slot = torch.where(over, 0, self.count)[rows] + torch.arange(rows.numel(), device=rows.device) - starts[rows]
        ties = over & (kept > self.capacity)
        rewritten = over_rows
        if bool(ties.any()):
            tied = ties[rows]
            self._settle_ties(torch.nonzero(ties).flatten(), Entries(*compact(tied, rows, cols, keys, rad)),
                              dist[tied], kept)
            rows, cols, keys, rad, dist, slot = compact(~tied, rows, cols, keys, rad, dist, slot)
            rewritten = torch.nonzero(over & ~ties).flatten()
        # Fills and copies allocate nothing: an out-of-memory error comes before the store
        # changes (the flush is retried without the pairs it already holds).
        flat = rows * self.capacity + slot
        for name, empty, values in (("keys", torch.inf, keys), ("rad", torch.inf, rad), ("idx", -1, cols),
                                    ("dist", torch.nan, dist)):
            table = getattr(self, name)
            table.index_fill_(0, rewritten, empty)
            table.view(-1).index_copy_(0, flat, values)
        self.count = torch.where(ties, self.count, torch.where(over, kept, self.count + kept))

    def _settle_ties(self, rows: torch.Tensor, entries: Entries, dist: torch.Tensor, per_row: torch.Tensor
                     ) -> None:
        """Rows whose candidates under τ exceed the capacity (near-ties: duplicates, flat image
        regions, integer data): evaluate them exactly and keep the exact top k.

        ``entries``: every candidate of ``rows`` (sorted by row), ``dist`` their float64
        distances where already exact; ``per_row``: candidates per store row. Padded in groups
        of similar widths (:func:`~knng.engine.store.entries.rebuild_groups`).
        """
        self._overflowed[rows] = True
        self.stats.overflow_rows += int(rows.numel())
        widths = per_row[rows]
        starts = torch.cumsum(widths, 0) - widths
        local = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), widths,
                                        output_size=entries.rows.numel())
        rank = torch.arange(local.numel(), device=local.device) - starts[local]
        for members in rebuild_groups(widths, 0, entries=self.rebuild_entries):
            width = int(widths[members].max())
            at = torch.zeros(rows.numel(), dtype=torch.bool, device=rows.device)
            at[members] = True
            pos = torch.full_like(at, -1, dtype=torch.int64)
            pos[members] = torch.arange(members.numel(), device=rows.device)
            sel = torch.nonzero(at[local]).flatten()
            block = Block.empty(members.numel(), width, self.device)
            where = (pos[local[sel]], rank[sel])
            block.keys[where] = entries.keys[sel]
            block.rad[where] = entries.rad[sel]
            block.idx[where] = entries.cols[sel]
            block.dist[where] = dist[sel]
            group = rows[members]
            exact, _ = self._prune(group, self._evaluate_all(group, block))
            idx, dist_k, keys, rad = top_by_distance(exact.idx, exact.dist, self.k, exact.keys, exact.rad)
            cap = self.capacity
            self.keys[group] = pad(keys, cap, torch.inf)
            self.rad[group] = pad(rad, cap, torch.inf)
            self.idx[group] = pad(idx, cap, -1)
            self.dist[group] = pad(dist_k, cap, torch.nan)
            self.count[group] = (idx >= 0).sum(dim=1)

    def _bounds(self, block: Block) -> tuple[torch.Tensor, torch.Tensor]:
        """Certified (lo, hi) of every entry; empty slots get (+inf, +inf)."""
        valid = block.idx >= 0
        lo = torch.where(valid, block.keys - block.rad, torch.inf)
        hi = torch.where(valid, block.keys + block.rad, torch.inf)
        return lo, hi

    def _prune(self, rows: torch.Tensor, block: Block) -> tuple[Block, torch.Tensor]:
        """τ ← min(τ, k-th smallest upper bound); drop what lies above; pack kept entries first."""
        lo, hi = self._bounds(block)
        if hi.shape[1] >= self.k:
            kth = torch.kthvalue(hi, self.k, dim=1).values
            self.tau[rows] = torch.minimum(self.tau[rows], kth)
        keep = lo <= self.tau[rows][:, None]
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
        pruned = Block(torch.where(keep, block.keys, torch.inf).gather(1, order),
                        torch.where(keep, block.rad, torch.inf).gather(1, order),
                        torch.where(keep, block.idx, -1).gather(1, order),
                        torch.where(keep, block.dist, torch.nan).gather(1, order))
        return pruned, keep.sum(dim=1)

    def _evaluate_all(self, rows: torch.Tensor, block: Block) -> Block:
        """Evaluate every stored, not yet exact entry of ``rows``; their keys become exact."""
        todo = (block.idx >= 0) & torch.isnan(block.dist)
        if not bool(todo.any()):
            return block
        dist = torch.where(todo, self._evaluate_rows(rows, block.idx, todo), block.dist)
        return self._exact_block(rows, block, todo, dist)

    def _exact_block(self, rows: torch.Tensor, block: Block, evaluated: torch.Tensor, dist: torch.Tensor
                     ) -> Block:
        """``block`` with the ``evaluated`` entries' distances, keys and radii made exact."""
        key, slack = self.errors.exact_key(rows[:, None].expand_as(dist), torch.where(evaluated, dist, 0.0))
        return Block(torch.where(evaluated, key, block.keys), torch.where(evaluated, slack, block.rad),
                      block.idx, dist)

    # --------------------------------------------------------------------------------- finish
    def finish(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact top k of ``rows`` (default all): int64 indices, float64 distances, (m, k).

        The screen is over once a finish begins: what is pending is taken in as the last step
        (:meth:`_take_last`), or flushed where the widened store would not fit.
        """
        stages.count("store.finish")
        if self._pending:
            if self._take_last():
                stages.count("store.finish_widened")
            else:
                stages.count("store.finish_flushed")
                self.flush()
        self._count_tile_tightenings()
        rows = torch.arange(self.n, device=self.device) if rows is None else rows
        block = Block(self.keys[rows], self.rad[rows], self.idx[rows], self.dist[rows])
        metric = self.errors.metric
        offsets = self.errors.row_offsets[rows][:, None]
        # Keys that are their pair's exact score (integer rows) give the exact distance as the
        # float64 evaluation would: no evaluation, no interval.
        if self.errors.precision.integers:
            known = (block.idx >= 0) & torch.isnan(block.dist) & self.errors.exact_keys(block.keys)
            block = self._exact_block(rows, block, known,
                                      torch.where(known, metric.to_distance(block.keys + offsets), block.dist))
        lo, hi = self._bounds(block)
        k = self.k
        tau = torch.minimum(self.tau[rows], torch.kthvalue(hi, k, dim=1).values) if hi.shape[1] >= k else self.tau[rows]
        needed = lo <= tau[:, None]
        # A screened entry whose interval rounds to one float32 distance and meets no other
        # needed entry's interval has a certain value and rank (common after a float64
        # screen); every other needed entry is evaluated exactly.
        mid = (lo + hi) / 2
        order = torch.argsort(torch.where(needed, mid, torch.inf), dim=1, stable=True)
        # Needed entries come first in every row: the columns past the widest row's needed ones
        # go (a store widened by its last take holds up to twice as many as the finish needs,
        # and a GPU evaluates row batches whole: k = 100, 10k queries, 6.3 ms).
        width = min(needed.shape[1], max(k, int(needed.sum(dim=1).max()) if needed.numel() else 0))
        order = order[:, :width]
        keys, idx, dist, lo, hi, needed = (t.gather(1, order) for t in (block.keys, block.idx, block.dist, lo, hi,
                                                                       needed))
        low = torch.where(needed, metric.to_distance(lo + offsets), torch.inf)
        high = torch.where(needed, metric.to_distance(hi + offsets), torch.inf)
        exact = ~torch.isnan(dist)
        ambiguous = needed & ~exact & ((low.to(torch.float32) != high.to(torch.float32))
                                       | overlapping_sorted(low, high))
        if bool(ambiguous.any()):
            dist = torch.where(ambiguous, self._evaluate_rows(rows, idx, ambiguous), dist)
        screened = needed & torch.isnan(dist)
        dist = torch.where(screened, metric.to_distance(keys + offsets), dist)
        dist = torch.where(needed, dist, torch.inf)
        idx, dist = top_by_distance(torch.where(needed, idx, -1), dist, dist.shape[1])
        # A pair held twice has one value, so its copies sit side by side: keep one. A store
        # takes no pair twice (see flush); this guards stores merged from packs (from_packs).
        repeat = torch.zeros_like(idx, dtype=torch.bool)
        repeat[:, 1:] = (idx[:, 1:] == idx[:, :-1]) & (idx[:, 1:] >= 0)
        if bool(repeat.any()):
            idx, dist = top_by_distance(torch.where(repeat, -1, idx), dist, dist.shape[1])
        return idx[:, :k], dist[:, :k]

    def _count_tile_tightenings(self) -> None:
        """Add the rows :meth:`tighten` tightened (counted on the device) to the stats."""
        self.stats.tightenings += int(self._tile_tightenings)
        self._tile_tightenings.zero_()

    def _evaluate_rows(self, rows: torch.Tensor, idx: torch.Tensor, todo: torch.Tensor) -> torch.Tensor:
        """Exact distances of the ``todo`` entries of the padded ``idx`` of store rows ``rows``.

        Returns an (m, w) float64 matrix, valid where ``todo``. Rows with many entries to
        evaluate go as (row, its columns) batches, which gather each row's vector once and
        run 1.7× faster than pair by pair (2 CPU cores, d = 64); scattered ones go as pairs.
        """
        out = torch.full(idx.shape, torch.nan, dtype=torch.float64, device=idx.device)
        per_row = todo.sum(dim=1)
        self.stats.exact_evaluations += int(per_row.sum())
        self._evaluations.index_add_(0, rows, per_row)
        dense = per_row * DENSE_EVALUATION >= idx.shape[1]
        sub = torch.nonzero(dense).flatten()
        if sub.numel():
            values = self.evaluate(rows[sub], idx[sub].clamp_min(0))
            out[sub] = torch.where(todo[sub], values, torch.nan)
        sparse = todo & ~dense[:, None]
        r, c = torch.nonzero(sparse, as_tuple=True)
        if r.numel():
            out[r, c] = self.evaluate(rows[r], idx[r, c])
        return out

    def escalated_rows(self) -> torch.Tensor:
        """Store rows escalated by a holding store (τ = −∞: nothing screened reaches them; see
        :meth:`~knng.engine.store.held.HoldingStore._escalate`), int64 on the store's device."""
        return torch.nonzero(self.tau == -torch.inf).flatten()

    def screened_per_row(self) -> torch.Tensor:
        """Pairs the screen let through for each row (int64, (n,))."""
        self.flush()
        return self._screened

    def evaluations_per_row(self) -> torch.Tensor:
        """Exact evaluations each row needed (int64, (n,))."""
        return self._evaluations

    @property
    def rows_evaluated_on_overflow(self) -> int:
        """Rows whose near-ties overflowed the capacity at least once."""
        return int(self._overflowed.sum())
