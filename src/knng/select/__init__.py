"""k-selection algorithms: each picks the k smallest entries of every row of a score block.

Every algorithm has one signature, ``fn(scores, k, *, sorted=False) -> (values, indices)``:
``scores`` is a 2-D float tensor (rows × columns), ``k ≤ columns``; the result holds each row's
k smallest values and their column indices (int64), ascending when ``sorted`` is true and in
any order otherwise. Ties at the k-th value may be resolved either way: the engine's exact
re-rank, not the selection, decides ties.

Algorithms register by name with :func:`register`; ``select="auto"`` asks :func:`resolve` for the
fastest one measured for the shape and device.
"""

from knng.select.registry import SelectFn, available, get, register, select_columns
from knng.select.choice import resolve
from knng.select import baselines as _baselines  # noqa: F401  (registers "insertion", "bitonic")
from knng.select import batch_sort as _batch_sort  # noqa: F401  (registers "batch_sort")
from knng.select import grouped as _grouped  # noqa: F401  (registers "grouped")
from knng.select import qms as _qms  # noqa: F401  (registers "qms", "qms_sampled", "qms_block", "qms_warp")
from knng.select import topk as _topk  # noqa: F401  (registers "topk")

__all__ = ["SelectFn", "available", "get", "register", "resolve", "select_columns"]
