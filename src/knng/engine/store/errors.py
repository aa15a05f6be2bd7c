"""The error model of a screened pair: how far its key may sit from the float64 exact value.

:class:`PairErrors` gives each screened key an interval that holds the key of the exact distance
(the screen's rounding bound of ``docs/EXACTNESS.md`` plus the float64 roundings of the
conversion and of the exact evaluation); the stores test, tighten and finish with those intervals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from knng.metrics import Metric, ScreenPrecision
from knng.engine.kernels import block_radius, pair_radius, pair_radius_runs, radius_runs

__all__ = ["PairErrors", "PairNorms", "CONVERSION_SLACK"]

UNIT_ROUNDOFF_FP64 = 2.0**-53
#: Relative slack for quantities rounded a few times in float64 (key ↔ distance conversions).
CONVERSION_SLACK = 8 * UNIT_ROUNDOFF_FP64
#: Integer keys below this are exact in float32 (24-bit significands).
EXACT_INTEGER_KEY = 2.0**24


@dataclass
class PairErrors:
    """How far a screened key may sit from the float64 exact value of its pair.

    For a screen key s̃ of the pair (row i, column j) the interval ``s̃ ± err`` holds the key
    of the exact distance as knng evaluates it (float64, by differences): the screen's
    rounding bound E of ``docs/EXACTNESS.md`` plus the float64 roundings of the conversion and
    of the exact evaluation itself (``Metric.oracle_error``).
    """

    metric: Metric
    d: int
    precision: ScreenPrecision
    # float64 (rows,); None where every pair's radius comes with it (blocks prepared around
    # centres of their own, knng.engine.graph.frames)
    row_norms: torch.Tensor | None
    row_terms: torch.Tensor | None
    row_offsets: torch.Tensor   # float64 (rows,): distance = to_distance(key + offset)
    col_norms: torch.Tensor | None  # float64 (n_cols,), indexed by global column id
    col_terms: torch.Tensor | None
    centre_norm: float

    @property
    def slack(self) -> float:
        """The relative slack on a screened key and its offset: the float64 conversions', plus
        the screen's own rounding of the key where it is relative to the key
        (``ScreenPrecision.key_roundoff``: integer rows)."""
        return CONVERSION_SLACK + self.precision.key_roundoff

    def exact_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Which screened ``keys`` are their pair's exact score: integer rows' keys below 2²⁴
        (an exact integer rounded to float32 is itself there), none for other precisions."""
        if not self.precision.integers:
            return torch.zeros_like(keys, dtype=torch.bool)
        return (keys >= 0) & (keys < EXACT_INTEGER_KEY)

    def err(self, rows: torch.Tensor, cols: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Error radius of screened ``keys`` for store rows ``rows`` and global columns ``cols``."""
        if (self.row_norms is not None and self.col_norms is not None
                and pair_radius_runs(self.row_norms, self.col_norms, self.row_terms, self.col_terms,
                                               self.row_offsets)):
            # The norms gathered and the radius computed in one launch (knng.engine.kernels.radius).
            return pair_radius(self.metric, self.d, self.precision, self.centre_norm, self.slack, rows,
                                      keys, self.row_offsets, self.row_norms, self.col_norms, self.row_terms,
                                      self.col_terms, cols=cols)
        return self.radius(*self.norms_of(rows, cols), keys, rows)

    def norms_of(self, rows: torch.Tensor, cols: torch.Tensor) -> "PairNorms":
        """The norms and terms of pairs (store rows ``rows``, global columns ``cols``) as this
        model holds them (one centre for every pair)."""
        if self.row_norms is None or self.col_norms is None:
            raise RuntimeError("these pairs were screened in frames of their own: their norms must come with them")
        return PairNorms(self.row_norms[rows], self.col_norms[cols],
                         None if self.row_terms is None else self.row_terms[rows],
                         None if self.col_terms is None else self.col_terms[cols])

    def radius(self, a: torch.Tensor, b: torch.Tensor, a_terms: torch.Tensor | None, b_terms: torch.Tensor | None,
               keys: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Error radius of screened ``keys`` whose pairs were prepared with norms ``a``, ``b`` and
        terms ``a_terms``, ``b_terms`` (float64; a block prepared around its own centre has its
        own), for store rows ``rows``: one launch where the radius kernel runs
        (:func:`knng.engine.kernels.radius.pair_radius`, the same values), else :meth:`radius_reference`."""
        if pair_radius_runs(a, b, a_terms, b_terms, self.row_offsets):
            return pair_radius(self.metric, self.d, self.precision, self.centre_norm, self.slack, rows,
                                      keys, self.row_offsets, a, b, a_terms, b_terms)
        return self.radius_reference(a, b, a_terms, b_terms, keys, rows)

    def radius_reference(self, a: torch.Tensor, b: torch.Tensor, a_terms: torch.Tensor | None,
                         b_terms: torch.Tensor | None, keys: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """:meth:`radius` in torch (the pair radius kernel's reference)."""
        bound = self.metric.pair_bound(self.d, a, b, a_terms, b_terms, precision=self.precision)
        return self._add_float64(bound, keys.to(torch.float64), self.row_offsets[rows], a, b)

    def block_err(self, rows: torch.Tensor, tau: torch.Tensor, max_col_norm: "float | torch.Tensor",
                  max_col_term: "float | torch.Tensor", row_norms: torch.Tensor | None = None,
                  row_terms: torch.Tensor | None = None) -> torch.Tensor:
        """An error radius valid for every column of a block (norms ≤ the block's maxima).

        ``max_col_norm``/``max_col_term``: numbers, or float64 tensors that broadcast to the rows
        (a 0-dim tensor, or one value per row where rows of several blocks go together);
        ``row_norms``/``row_terms``: the rows' prepared norms and terms in the block's frame
        (default: the store's own).
        """
        return self._block_err(rows, tau, False, max_col_norm, max_col_term, row_norms, row_terms, add_tau=False)

    def block_thresholds(self, rows: torch.Tensor, tau: torch.Tensor, max_col_norm: "float | torch.Tensor",
                         max_col_term: "float | torch.Tensor", row_norms: torch.Tensor | None = None,
                         row_terms: torch.Tensor | None = None) -> torch.Tensor:
        """``tau[rows] + block_err(rows, tau[rows], ...)``: a block's thresholds from the
        store's whole τ (``tau``, one per store row), in one launch where the radius kernel runs."""
        return self._block_err(rows, tau, True, max_col_norm, max_col_term, row_norms, row_terms, add_tau=True)

    def _block_err(self, rows: torch.Tensor, tau: torch.Tensor, tau_indexed: bool,
                   max_col_norm: "float | torch.Tensor", max_col_term: "float | torch.Tensor",
                   row_norms: torch.Tensor | None, row_terms: torch.Tensor | None, add_tau: bool) -> torch.Tensor:
        """:meth:`block_err` (plus τ where ``add_tau``; ``tau`` per store row where
        ``tau_indexed``, else per position of ``rows``): the radius kernel where it runs
        (:mod:`knng.engine.kernels.radius`, the same values in one launch), else the torch reference."""
        indexed = row_norms is None
        if indexed:
            if self.row_norms is None:
                raise RuntimeError("block thresholds need the rows' norms in the block's frame")
            row_norms, row_terms = self.row_norms, self.row_terms
        if radius_runs(tau, row_norms, row_terms, self.row_offsets):
            return block_radius(self.metric, self.d, self.precision, self.centre_norm, self.slack, rows,
                                       tau, tau_indexed, row_norms, row_terms, indexed, self.row_offsets,
                                       max_col_norm, max_col_term, add_tau)
        if tau_indexed:
            tau = tau[rows]
        if indexed:
            row_norms = row_norms[rows]
            row_terms = None if row_terms is None else row_terms[rows]
        rad = self._block_err_reference(rows, tau, max_col_norm, max_col_term, row_norms, row_terms)
        return tau + rad if add_tau else rad

    def _block_err_reference(self, rows: torch.Tensor, tau: torch.Tensor, max_col_norm: "float | torch.Tensor",
                             max_col_term: "float | torch.Tensor", row_norms: torch.Tensor,
                             row_terms: torch.Tensor | None) -> torch.Tensor:
        """:meth:`block_err` in torch (the radius kernel's reference): rows' norms and terms per position."""
        a = row_norms
        b = _filled(a, max_col_norm)
        col_terms = _filled(a, max_col_term) if self.metric.uses_terms else None
        bound = self.metric.pair_bound(self.d, a, b, row_terms, col_terms, precision=self.precision)
        return self._add_float64(bound, tau, self.row_offsets[rows], a, b)

    def _add_float64(self, bound: torch.Tensor, keys: torch.Tensor, offsets: torch.Tensor,
                     a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        finite = torch.where(torch.isfinite(keys), keys, torch.zeros_like(keys))
        value = finite + offsets
        return (bound + self.slack * (finite.abs() + offsets.abs())
                + self.metric.oracle_error(value, a, b, self.d, self.centre_norm))

    def exact_key(self, rows: torch.Tensor, dist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys of exact distances, and the radius their conversion may have rounded by."""
        value = self.metric.from_distance(dist)
        offsets = self.row_offsets[rows]
        key = value - offsets
        return key, CONVERSION_SLACK * (value.abs() + offsets.abs())


def _filled(like: torch.Tensor, value: "float | torch.Tensor") -> torch.Tensor:
    """``value`` in the shape of ``like``: a number filled in, a tensor broadcast (no copy)."""
    if isinstance(value, torch.Tensor):
        return value.expand_as(like)
    return torch.full_like(like, value)


class PairNorms(NamedTuple):
    """What a pair's error radius is computed from: the norms (float64) of its two prepared
    vectors and their terms (None for metrics without terms), one entry per pair."""

    row: torch.Tensor
    col: torch.Tensor
    row_terms: torch.Tensor | None
    col_terms: torch.Tensor | None

    @staticmethod
    def cat(parts: "list[PairNorms]") -> "PairNorms":
        """The norms of several batches of pairs as one (each field concatenated)."""
        return PairNorms(*(None if parts[0][f] is None else torch.cat([p[f] for p in parts]) for f in range(4)))
