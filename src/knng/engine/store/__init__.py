"""The candidate stores: each row's candidates, their thresholds, and the exact finish.

``errors``      the error radii of screened pairs (:class:`PairErrors`, :class:`PairNorms`)
``entries``     flat and padded candidate entries and the sorts, counts and scans on them
``candidates``  :class:`CandidateStore`: the screen's survivors taken into per-row tables of a
                capacity, τ per row, the exact finish
``held``        :class:`HoldingStore`: survivors held back as flat lists, tightened and finished
                from them (a GPU's low-precision screen); :func:`candidate_store` picks the mode
``stats``       a store's counters and summaries of per-row counts
``lists``       where a graph's stores live when they do not fit the device (:class:`ListHome`:
                pinned host memory or memory-mapped files, a band of parts at a time)

The rest of the engine imports this package's names, never its modules (``tests/test_layering.py``).
"""

from knng.engine.store.candidates import CandidateStore
from knng.engine.store.errors import PairErrors, PairNorms
from knng.engine.store.held import Holding, HoldingStore, candidate_store
from knng.engine.store.lists import ListHome
from knng.engine.store.stats import StoreStats, summarize_levels, summarize_per_row, summarize_per_row_each

__all__ = ["CandidateStore", "HoldingStore", "Holding", "candidate_store", "PairErrors", "PairNorms", "StoreStats",
           "summarize_per_row", "summarize_per_row_each", "summarize_levels", "ListHome"]
