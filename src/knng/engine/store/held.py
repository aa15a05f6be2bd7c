"""A store that holds its survivors back as flat lists, and tightens and finishes from them.

A GPU's search and graph screen in a low precision, whose survivors are many; taking each batch
into the per-row tables (:class:`~knng.engine.store.candidates.CandidateStore`) is a sort and a
dozen synchronisations. A :class:`HoldingStore` keeps them as they come instead: a tightening
selects each row's k-th key among them (no sort, no capacity) and marks what can no longer pass
(dropped at the lists' next use, so that nothing is read back from the device while the next
block's launch queues), and the finish evaluates every one left exactly. Where the held lists
outgrow their limit, or a checkpoint needs the state, they are taken into the tables, which
bound the memory with their capacity (the store's other mode, inherited).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from knng._options import get_options
from knng.engine import stages
from knng.engine.exact import flat_top_by_distance
from knng.engine.kernels import decoded, row_ends, row_slots, top_by_distance
from knng.engine.store.candidates import DEFAULT_PENDING, CandidateStore, Evaluator
from knng.engine.store.errors import PairErrors, PairNorms

__all__ = ["Holding", "HoldingStore", "candidate_store"]


@dataclass(frozen=True)
class Holding:
    """How a :class:`HoldingStore` holds its survivors back instead of taking them in.

    ``maxima``: the largest prepared norm and |term| of every column the screen may hand in;
    with them the store tightens by itself whenever ``pending`` new survivors are held (without
    them the caller does, :meth:`HoldingStore.tighten_held`, with the maxima of the columns
    screened so far). ``limit``: held survivors beyond which they are taken into the store,
    whose capacity and exact evaluation of near-ties bound its memory (thousands of duplicates
    per row); None for no limit. ``step``: held survivors taken in at a time (at least the
    store's ``pending``; None: ``pending``). ``pairs``: every survivor comes with the norms its block was
    prepared with (:class:`~knng.engine.graph.frames.PrincipalFrames`, blocks centred on their own
    parts; :meth:`CandidateStore.add`'s ``norms``); each is held with its error radius,
    computed from them as it comes, and the held pairs tighten with their own radii, not
    against maxima. ``escalate``: a row that keeps more held survivors than this after a
    tightening is escalated (:meth:`HoldingStore.escalated_rows`); None or 0: never.
    """

    maxima: tuple[float, float] | None = None
    limit: int | None = None
    pairs: bool = False
    step: int | None = None
    escalate: int | None = None

    @property
    def tightens(self) -> bool:
        """Whether the store tightens its held survivors by itself (maxima, or pairs' own radii)."""
        return self.maxima is not None or self.pairs


class HoldingStore(CandidateStore):
    """A :class:`~knng.engine.store.candidates.CandidateStore` that holds its survivors back.

    Parameters are the base store's, and ``holding`` (:class:`Holding`): how the survivors are
    held, tightened and taken in. Pairs whose norms the store knows (one centre) need the rows'
    and columns' norms in ``errors``; pairs that bring their own need ``Holding(pairs=True)``.
    Survivors that arrive otherwise than the holding says are taken in as by the base store.
    """

    holds_back = True

    def __init__(self, n: int, k: int, capacity: int, errors: PairErrors, evaluate: Evaluator,
                 device: torch.device, pending: int = DEFAULT_PENDING, work_bytes: int | None = None, *,
                 holding: Holding) -> None:
        if not holding.pairs and (errors.row_norms is None or errors.col_norms is None):
            raise ValueError("a holding store needs the rows' and columns' norms (pairs of one centre), "
                             "or survivors that bring theirs (Holding(pairs=True))")
        super().__init__(n, k, capacity, errors, evaluate, device, pending=pending, work_bytes=work_bytes)
        self.holding = holding
        # Held survivors: (store rows, global columns, screen keys, their float64 error radii
        # where Holding.pairs, else None) lists, how many in all, how many came since the last
        # tightening, how many that tightening kept.
        self._held: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self._held_size = self._held_fresh = self._held_kept = 0
        # Which of the first held list's pairs the last tightening kept, where they are not yet
        # compacted (:meth:`_settle_held`): the held sizes are known once they are.
        self._held_keep: torch.Tensor | None = None
        self._finished: tuple[torch.Tensor, torch.Tensor] | None = None  # every row's answer, once finished
        self._every: torch.Tensor | None = None  # arange(n), for thresholds of every row

    # ------------------------------------------------------------------ the base store's steps
    def add(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, norms: "PairNorms | None" = None
            ) -> None:
        """Hold survivors back (those whose norms come as the holding says; others are handed to
        the base store's :meth:`~knng.engine.store.candidates.CandidateStore.add`)."""
        if rows.numel() and (norms is not None) == self.holding.pairs:
            stages.count("store.add")
            self._hold(rows, cols, keys, norms)
            return
        super().add(rows, cols, keys, norms)

    def take_whole_rows(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor,
                        kept: torch.Tensor) -> bool:
        """Never: a holding store's survivors go through :meth:`add` (returns False)."""
        return False

    def would_flush(self, pairs: int) -> bool:
        """Whether :meth:`add` of ``pairs`` survivors would tighten the held ones (which changes τ)."""
        return pairs > 0 and self._tighten_due(pairs)

    def flush(self) -> None:
        """Take every held and pending survivor into the store (tightening rows that overflow)."""
        self._settle_held()
        if self._held:
            self._take_held()
        super().flush()

    def clear_rows(self, slots: slice, tau: torch.Tensor) -> None:
        """The base store's :meth:`~knng.engine.store.candidates.CandidateStore.clear_rows`;
        nothing may be held."""
        if self._held:
            raise RuntimeError("clear_rows with survivors held: flush first")
        super().clear_rows(slots, tau)

    def finish(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact top k of ``rows`` (default all): int64 indices, float64 distances, (m, k).

        A store that took nothing in finishes every row from its held survivors at the first call
        (:meth:`_finish_held`) and answers later calls from those results; else the held
        survivors are taken in and the base store finishes.
        """
        holding = self.holding
        self._settle_held()
        if (self._finished is None and self._held_fresh and holding.tightens
                and self._held_size > get_options().finish_untightened_pairs):
            self.tighten_held()
            self._settle_held()  # (which may take them in, over the holding's limit: decided here)
        if self._finished is not None or not self._taken_in:
            stages.count("store.finish")
            if self._finished is None:
                self._finished = self._finish_held()
            idx, dist = self._finished
            return (idx, dist) if rows is None else (idx[rows], dist[rows])
        if self._held:
            self._take_held()
        return super().finish(rows)

    # ---------------------------------------------------------------------------- the held lists
    def _hold(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, norms: "PairNorms | None") -> None:
        """Hold survivors back (a holding store's :meth:`add`); pairs that bring their norms are
        held with their radii (one float64 each instead of four)."""
        stages.count("store.hold" if norms is None else "store.hold_pairs")
        rad = None if norms is None else self.errors.radius(*norms, keys.to(torch.float64), rows)
        self._settle_held()
        self._screened.index_add_(0, rows, torch.ones_like(rows))
        self._held.append((rows, cols, keys, rad))
        self._held_size += rows.numel()
        self._held_fresh += rows.numel()
        self.pairs_handed_in += rows.numel()
        if self._tighten_due(0):
            self.tighten_held()

    def _tighten_due(self, pairs: int) -> bool:
        """Whether the held survivors tighten once ``pairs`` more come: every ``pending`` fresh
        pairs, and no sooner than as many fresh ones as the last tightening kept. Each
        tightening reads every held pair, so waiting that long keeps their work within twice
        the pairs held (an 8×8 patch graph at k = 100 holds ~10⁸ pairs; 23 tightenings every
        2²² fresh ones took 376 ms of an H100's time)."""
        if not self.holding.tightens:
            return False
        self._settle_held()
        return self._held_fresh + pairs >= max(self.flush_size, self._held_kept)

    def tighten_held(self, maxima: tuple[float, float] | None = None) -> None:
        """Tighten every row's τ from all its held survivors, then drop those that can no longer
        pass the store's test (marked now, compacted at their next use: :meth:`_settle_held`;
        nothing is read back from the device here).

        ``maxima``: the largest norm and |term| of the columns held so far (default the
        holding's). A row's held pairs have distinct columns (each pair is screened once per
        side), so :meth:`tighten` applies to all of them at once: τᵢ becomes at most the k-th
        smallest held key plus a radius. The store's test keeps a pair when s̃ − E ≤ τ; E is at
        most the radius of the thresholds for columns within ``maxima``
        (:meth:`screen_thresholds`), so a pair above those thresholds can never pass it, now or
        after τ tightens further. What is left is a little more than k per row (1M × 128, 10k
        queries: about 8,000 pairs per row after the first tile at k = 1,024, 1,248 after this).
        """
        self._settle_held()
        if not self._held:
            return
        if self.holding.pairs:
            self._tighten_held_pairs()
            return
        maxima = maxima if maxima is not None else self.holding.maxima
        if maxima is None:
            raise ValueError("tighten_held needs the columns' maxima (the holding has none)")
        held = self._held
        rows, cols, keys = (torch.cat([h[f] for h in held]) if len(held) > 1 else held[0][f] for f in range(3))
        # The lists just joined are released before the tightening's temporaries are made.
        self._held = [(rows, cols, keys, None)]
        del held
        self.tighten(rows, keys, *maxima)
        if self._every is None or self._every.device != rows.device:
            self._every = torch.arange(self.n, device=rows.device)
        keep = keys <= self.screen_thresholds(self._every, *maxima)[rows]
        self._escalate(rows, keep)
        self._held_keep = keep
        self._held_fresh = 0

    def _tighten_held_pairs(self) -> None:
        """:meth:`tighten_held` for survivors held with their own error radii E
        (``Holding.pairs``; computed from the norms they brought, as :meth:`add`'s pending
        pairs get theirs). A row's held pairs have distinct columns, so the k-th smallest
        certified upper bound s̃ + E among them (rounded up to float32) bounds its k-th true
        key: τ becomes at most that. Then the pairs that fail the store's own test s̃ − E ≤ τ
        are dropped: τ only falls, so they never pass it later."""
        stages.count("store.tighten_held_pairs")
        held = self._held
        rows, cols, keys, rad = (torch.cat([h[f] for h in held]) if len(held) > 1 else held[0][f] for f in range(4))
        # The memory of these steps is the graph's peak (an 8×8 patch graph at k = 100 holds
        # up to 72M pairs here, 28 bytes each): the joined lists are released first, and each
        # float64 temporary is made when it is needed, in place where it can be.
        self._held = [(rows, cols, keys, rad)]
        del held
        if rows.numel() >= self.k:
            _, kth, counts = row_ends(rows, keys.to(torch.float64).add_(rad), self.n, self.k)
            upper = decoded(kth).to(torch.float64)
            upper = torch.where((counts >= self.k) & ~upper.isnan(), upper, torch.inf)
            torch.minimum(self.tau, upper, out=self.tau)
            self.updates += 1
        keep = keys.to(torch.float64).sub_(rad) <= self.tau[rows]
        self._escalate(rows, keep)
        self._held_keep = keep
        self._held_fresh = 0

    def _escalate(self, rows: torch.Tensor, keep: torch.Tensor) -> None:
        """Escalate the rows that keep more than ``Holding.escalate`` held pairs (``keep``: which
        of the held pairs, of store ``rows``, the tightening keeps; updated in place).

        An escalated row's τ becomes −∞: no screen lets a pair through for it again, its held
        pairs are dropped here, and pairs a block finds for its partner still go to the
        partner. Its answer comes from a search of its own at the end (the graph's
        ``EnginePlan.escalation``, :meth:`escalated_rows`); τ = −∞ is how a checkpoint or a
        share's merged thresholds carry that. Nothing is read back from the device."""
        limit = self.holding.escalate
        if not limit or rows.numel() <= limit:
            return
        kept = torch.zeros(self.n, dtype=torch.int64, device=rows.device).index_add_(0, rows, keep.to(torch.int64))
        hard = kept > limit
        self.tau.masked_fill_(hard, -torch.inf)
        keep &= ~hard[rows]

    def _settle_held(self) -> None:
        """Compact the held pairs the last tightening kept, if not yet done (then take them in
        where they exceed the holding's limit).

        A tightening only marks what it keeps: compacting needs their count on the host (a
        synchronisation), and done there it left the GPU idle while the host prepared the next
        block's launch, which needs only the new τ, already on the device. Done at the next use
        of the held pairs instead (the next block's hand-over, the finish), after the
        synchronisation that reads that block's survivors.
        """
        keep, self._held_keep = self._held_keep, None
        if keep is None:
            return
        # Every hand-over settles first, so the tightened list is still the only one.
        assert len(self._held) == 1
        rows, cols, keys, rad = self._held[0]
        at = torch.nonzero(keep).flatten()
        self._held = [(rows[at], cols[at], keys[at], None if rad is None else rad[at])]
        self._held_size = self._held_kept = at.numel()
        self._over_limit()

    def _over_limit(self) -> None:
        """Take the held survivors in where they exceed the holding's limit."""
        limit = self.holding.limit
        if limit is not None and self._held_size > limit:
            self._take_held()

    def _take_held(self) -> None:
        """Take every held survivor into the store (as :meth:`add` does without holding), the
        holding's ``step`` at a time (at least a flush's worth, ``pending``).

        Not all at once where the budget is short: an update copies what it takes in several
        times, and tens of millions of held pairs taken in at once made an 8×8 patch graph's peak
        (k = 100, 31M pairs under an 8 GB budget: 14.6 GB, one H200). Not a flush's worth at a time
        where it is not: every update merges the whole table
        (:func:`~knng.engine.plan.held_take_in_step`)."""
        stages.count("store.take_held")
        self._settle_held()
        held, self._held = self._held, []
        self._held_size = self._held_fresh = self._held_kept = 0
        self._taken_in = True
        step = max(self.flush_size, self.holding.step or 0)
        # A flush's worth of each list at a time (views: nothing is copied until taken in).
        parts = [(rows[a:a + step], cols[a:a + step], keys[a:a + step], None if rad is None else rad[a:a + step])
                 for rows, cols, keys, rad in held for a in range(0, rows.numel(), step)]
        del held
        waiting = 0  # parts handed to the pending list

        def wait(rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor, rad: torch.Tensor | None) -> None:
            keys64 = keys.to(torch.float64)  # (what may fail comes before the store changes)
            # Their rows were counted as screened when they were held.
            self._screened.index_add_(0, rows, torch.full_like(rows, -1))
            self._pending.append((rows, cols, keys64, rad))
            self._pending_size += rows.numel()

        try:
            for part in parts:
                wait(*part)
                waiting += 1
                if self._pending_size >= step:
                    CandidateStore.flush(self)
            CandidateStore.flush(self)
        except BaseException:
            # As the base store's flush leaves its pending pairs after an error (out of memory),
            # what was not taken in waits for the next flush, which the retried step makes.
            for part in parts[waiting:]:
                wait(*part)
            raise

    def _finish_held(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's exact top k from its held survivors alone (nothing taken in): each one
        evaluated exactly, then ordered by (distance, index) within its row.

        Rows padded to the widest one where that takes at most ``Options.finish_padding`` times the
        pairs (or ``rebuild_entries`` entries): each pair goes to its row's slot
        (:func:`~knng.engine.kernels.row_kth.row_slots`) and the rows are ordered (a search: 10k rows of
        about 1,250 pairs at k = 1,024). Else three stable
        sorts of the flat lists order everything by (row, distance, index), no row padded (a
        graph's million rows of 15–25 pairs, or a few rows of thousands of near-ties).
        """
        stages.count("store.finish_held")
        # Settled by finish, before it chose this path: compacting may take them all in.
        assert self._held_keep is None
        held, self._held = self._held, []
        self._held_size = self._held_fresh = self._held_kept = 0
        k, n, device = self.k, self.n, self.device
        keys = None
        if held:
            rows, cols = (torch.cat([h[f] for h in held]) if len(held) > 1 else held[0][f] for f in range(2))
            if self.errors.precision.integers:  # (their keys are the exact scores: _held_distances)
                keys = torch.cat([h[2] for h in held]) if len(held) > 1 else held[0][2]
        else:
            rows = cols = torch.zeros(0, dtype=torch.int64, device=device)
        # The held keys and radii are released before the finish's temporaries are made
        # (12 of the 28 bytes a held pair takes).
        del held
        p = rows.numel()
        per_row = torch.zeros(n, dtype=torch.int64, device=device).index_add_(0, rows, torch.ones_like(rows))
        self.stats.survivors += p
        self.updates += 1
        width = max(k, int(per_row.max()) if p else 0)  # the one synchronisation
        # The pairs are evaluated in the order the screen found them (a tile's pairs share their
        # vectors). Before, a stable sort by row and two gathers grouped them first (68M pairs in
        # an 8×8 patch graph at k = 100).
        dist = self._held_distances(keys, rows, cols, per_row) if p else torch.zeros(0, dtype=torch.float64,
                                                                                      device=device)
        del keys
        options = get_options()
        padded = self.rebuild_entries if options.finish_padded_entries is None else options.finish_padded_entries
        if width * n <= max(padded, options.finish_padding * p):
            # Each pair's slot in its row, by atomics on a GPU (the order within a row does not
            # matter: the rows are ordered by distance and index next).
            slot = row_slots(rows, n)
            idx = torch.full((n, width), -1, dtype=torch.int64, device=device)
            out = torch.full((n, width), torch.inf, dtype=torch.float64, device=device)
            idx[rows, slot] = cols
            out[rows, slot] = dist
            idx, out = top_by_distance(idx, out, k)
            self._count_tile_tightenings()  # read once the finish's launches are queued
            return idx, out
        # Radix sorts take as many passes as their keys have bytes: rows and columns as int32
        # where the columns are known to fit (one norm each; survivors that brought their own
        # norms come from a graph, whose columns are its n rows).
        columns = n if self.errors.col_norms is None else self.errors.col_norms.numel()
        narrow = max(n, columns) < 2**31
        idx, out = flat_top_by_distance(rows, cols, dist, n, k, per_row=per_row, narrow=narrow)
        self._count_tile_tightenings()
        return idx, out

    def _held_distances(self, keys: torch.Tensor | None, rows: torch.Tensor, cols: torch.Tensor,
                        per_row: torch.Tensor) -> torch.Tensor:
        """The exact distances of the held pairs (``rows``, ``cols``, and their screen ``keys``
        where the screen's products are exact; ``per_row``: how many each store row holds),
        counted as evaluations: each pair evaluated, except where its key is the exact score
        (integer rows, ``PairErrors.exact_keys``), whose distance is that key's, as the
        evaluation would give it."""
        if keys is None:
            self.stats.exact_evaluations += rows.numel()
            self._evaluations += per_row
            return self.evaluate(rows, cols)
        dist = self.errors.metric.to_distance(keys.to(torch.float64) + self.errors.row_offsets[rows])
        evaluated = torch.nonzero(~self.errors.exact_keys(keys)).flatten()
        self.stats.exact_evaluations += evaluated.numel()
        if evaluated.numel():
            dist[evaluated] = self.evaluate(rows[evaluated], cols[evaluated])
            self._evaluations.index_add_(0, rows[evaluated], torch.ones_like(evaluated))
        return dist


def candidate_store(n: int, k: int, capacity: int, errors: PairErrors, evaluate: Evaluator, device: torch.device,
                    pending: int = DEFAULT_PENDING, work_bytes: int | None = None, *,
                    holding: Holding | None = None) -> CandidateStore:
    """A store of ``n`` rows: a :class:`HoldingStore` where ``holding`` says how to hold the
    survivors back, else a :class:`~knng.engine.store.candidates.CandidateStore` (parameters as theirs)."""
    if holding is None:
        return CandidateStore(n, k, capacity, errors, evaluate, device, pending=pending, work_bytes=work_bytes)
    return HoldingStore(n, k, capacity, errors, evaluate, device, pending=pending, work_bytes=work_bytes,
                        holding=holding)
