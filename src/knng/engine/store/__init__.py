"""The candidate stores: each row's candidates, their thresholds, and the exact finish.

``candidates``  :class:`CandidateStore` (the screen's survivors per row, τ, the finish) and the
                error radii of its pairs (:class:`PairErrors`)
``lists``       where a graph's stores live when they do not fit the device (:class:`ListHome`:
                pinned host memory or memory-mapped files, a band of parts at a time)

The rest of the engine imports this package's names, never its modules (``tests/test_layering.py``).
"""

from knng.engine.store.candidates import (
    CandidateStore, Holding, PairErrors, PairNorms, StoreStats, summarize_per_row, summarize_per_row_each,
)
from knng.engine.store.lists import ListHome

__all__ = ["CandidateStore", "Holding", "PairErrors", "PairNorms", "StoreStats", "summarize_per_row",
           "summarize_per_row_each", "ListHome"]
