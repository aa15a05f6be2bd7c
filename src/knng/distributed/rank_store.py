"""One rank's share of the distributed graph's blocks: where their rows come from and where their
candidates go.

:class:`RankColumns` is the source of a rank's :class:`~knng.engine.graph.GlobalFrames`: the row
part of the block row in progress (gathered from every rank) and the rank's owned column parts
(kept prepared, kept as read, or read again per block). :func:`rank_store` makes the rank's one
candidate store, its rows laid out by :class:`RankSlots`: the row part's slots, then the owned
parts'. The engine's block steps (:mod:`knng.engine.graph`) run on both, as on one device.
"""

from __future__ import annotations

import bisect
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from knng._inputs import InputArray
from knng.distributed.plan import BlockPlan
from knng.engine.exact import exact_pairs_of
from knng.engine.graph import holding_for
from knng.engine.kernels import prepare_rows
from knng.engine.plan import pending_pairs
from knng.engine.store import CandidateStore, PairErrors, candidate_store
from knng.metrics import Metric, ScreenPrecision

__all__ = ["RankColumns", "RankSlots", "rank_store"]


class RankSlots:
    """Where a rank's store keeps each part's rows: slots ``0:`` the row part of the block row in
    progress (each block row's part in turn, its candidates sent to the part's owner after the
    row), then the owned parts one after the other (their column candidates, kept to the end)."""

    def __init__(self, parts: tuple[tuple[int, int], ...], owned: list[int], device: torch.device) -> None:
        self.parts, self.device = parts, device
        self.row_width = max(p1 - p0 for p0, p1 in parts)
        self._first: dict[int, int] = {}
        at = self.row_width
        for j in owned:
            self._first[j] = at
            at += parts[j][1] - parts[j][0]
        self.n = at
        #: Every slot's point (the row slots: the row part's, once it is taken).
        self.ids = torch.full((at,), -1, dtype=torch.int64, device=device)
        for j in owned:
            self.ids[self.owned(j)] = torch.arange(*parts[j], device=device)
        self.every_owned = slice(self.row_width, at)
        self.row = slice(0, 0)
        self._row_part = -1
        self._store: CandidateStore | None = None

    def attach(self, store: CandidateStore) -> None:
        """The store whose rows these are (its norms per slot follow :meth:`take_row_part`)."""
        self._store = store

    def owned(self, part: int) -> slice:
        """The slots of owned part ``part``."""
        p0, p1 = self.parts[part]
        return slice(self._first[part], self._first[part] + p1 - p0)

    def of(self, part: int) -> torch.Tensor:
        """The slots of ``part``'s points: the row slots for the row part, else its owned slots."""
        if part == self._row_part:
            return torch.arange(self.row.stop, device=self.device)
        at = self.owned(part)
        return torch.arange(at.start, at.stop, device=self.device)

    def take_row_part(self, part: int, tau: torch.Tensor) -> None:
        """The row slots take ``part``'s points, emptied, with thresholds ``tau``."""
        assert self._store is not None
        p0, p1 = self.parts[part]
        m = p1 - p0
        errors = self._store.errors
        self.ids[:m] = torch.arange(p0, p1, device=self.device)
        errors.row_norms[:m] = errors.col_norms[p0:p1]
        if errors.row_terms is not None and errors.col_terms is not None:
            errors.row_terms[:m] = errors.col_terms[p0:p1]
        first = torch.full((self.row_width,), torch.inf, dtype=torch.float64, device=self.device)
        first[:m] = tau
        self._store.flush()  # survivors of the previous blocks (owned parts' own blocks) go in first
        self._store.clear_rows(slice(0, self.row_width), first)
        self.row, self._row_part = slice(0, m), part


def rank_store(data: InputArray, metric: Metric, precision: ScreenPrecision, plan: BlockPlan, owned: list[int],
                norms: torch.Tensor, terms: torch.Tensor | None, centre_norm: float, k: int, capacity: int,
                budget: int, device: torch.device) -> tuple[CandidateStore, RankSlots]:
    """The one store of a rank's blocks (rows: :class:`RankSlots`), holding its survivors where
    the single-device graph's would (:func:`~knng.engine.graph.holding_for`)."""
    slots = RankSlots(plan.parts, owned, device)
    slot_norms = norms[slots.ids.clamp_min(0)]
    slot_terms = None if terms is None else terms[slots.ids.clamp_min(0)]
    errors = PairErrors(metric=metric, d=data.d, precision=precision, row_norms=slot_norms, row_terms=slot_terms,
                        row_offsets=torch.full_like(slot_norms, 1.0 if metric.normalize else 0.0),
                        col_norms=norms, col_terms=terms, centre_norm=centre_norm)
    ids = slots.ids

    def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        return exact_pairs_of(metric, data, ids[rows], data, cols, device)

    holding = holding_for(precision, norms, terms, device, n=slots.n, capacity=capacity,
                          pending=pending_pairs(device, budget), budget=budget)
    # A store that takes its survivors in as it goes waits for more of them at a time.
    pending = pending_pairs(device, budget) if holding is not None else pending_pairs(device, budget, updates=True)
    store = candidate_store(slots.n, k, capacity, errors, evaluate, device, pending=pending, holding=holding)
    slots.attach(store)
    return store, slots


class RankColumns:
    """The prepared rows a rank's blocks read: the source of its
    :class:`~knng.engine.graph.GlobalFrames`.

    The row part of the block row in progress (gathered from every rank's piece) and the owned
    column parts, kept where :data:`COLUMN_TIERS` says (prepared, or as read and prepared per
    block) or read again from the input for every block, the next block's read issued while
    this one runs.
    """

    def __init__(self, data: InputArray, metric: Metric, parts: tuple[tuple[int, int], ...],
                 centre: torch.Tensor | None, device: torch.device, dtype: torch.dtype,
                 kept: dict[int, torch.Tensor], *, prepared: bool, reader: ThreadPoolExecutor,
                 norms: torch.Tensor, terms: torch.Tensor | None) -> None:
        self.corpus, self.metric, self.parts, self.centre = data, metric, parts, centre
        self.device, self.dtype, self.kept, self.prepared, self.reader = device, dtype, kept, prepared, reader
        self.norms, self.terms = norms, terms
        self.terms32 = None if terms is None else terms.to(torch.float32)
        self._starts = [p0 for p0, _ in parts]
        self._row: tuple[int, torch.Tensor] | None = None
        self._order: list[int] = []
        self._streamed: dict[int, Future] = {}

    def prepare(self, raw: torch.Tensor) -> torch.Tensor:
        """Rows as read, in the screen's layout around the common centre."""
        return prepare_rows(self.metric, raw.to(self.device, non_blocking=True), self.centre, side="corpus",
                            symmetric=True, dtype=self.dtype).vectors

    def start_row(self, part: int, rows: torch.Tensor, columns: list[int]) -> None:
        """Part ``part``'s prepared rows have arrived; its blocks read ``columns``, in this order."""
        self._row, self._order = (part, rows), columns
        self._prefetch(0)

    def tile(self, start: int, stop: int) -> torch.Tensor:
        """Prepared rows ``start:stop`` (within one part)."""
        part = bisect.bisect_right(self._starts, start) - 1
        p0 = self.parts[part][0]
        if self._row is not None and self._row[0] == part:
            return self._row[1][start - p0:stop - p0]
        return self.column(part)[start - p0:stop - p0]

    def column(self, part: int) -> torch.Tensor:
        """Owned part ``part``, prepared."""
        if self.prepared:
            return self.kept[part]
        if part in self.kept:
            raw = self.kept[part]
        else:
            fetched = self._streamed.pop(part, None)
            raw = fetched.result() if fetched is not None else self.corpus.rows(*self.parts[part])
        if part in self._order:
            self._prefetch(self._order.index(part) + 1)
        return self.prepare(raw)

    def _prefetch(self, position: int) -> None:
        if position < len(self._order):
            part = self._order[position]
            if part not in self.kept and part not in self._streamed:
                self._streamed[part] = self.reader.submit(self.corpus.rows, *self.parts[part])
