"""The registry of k-selection algorithms, and the choice behind ``select="auto"``."""

from __future__ import annotations

from typing import Callable, Protocol

import torch

__all__ = ["SelectFn", "register", "get", "available", "resolve", "select_columns"]


class SelectFn(Protocol):
    """``fn(scores, k, *, sorted=False) -> (values, indices)`` along the last dimension."""

    def __call__(
        self, scores: torch.Tensor, k: int, *, sorted: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


_REGISTRY: dict[str, SelectFn] = {}
#: Rows longer than this count as "long" for ``select="auto"`` (see :func:`resolve`).
LONG_ROW = 1 << 18


def register(name: str) -> Callable[[SelectFn], SelectFn]:
    """Decorator: register a selection function under ``name``."""

    def wrap(fn: SelectFn) -> SelectFn:
        if name in _REGISTRY or name == "auto":
            raise ValueError(f"a selection algorithm named {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return wrap


def available() -> list[str]:
    """Names accepted by ``select=``: ``"auto"`` and every registered algorithm."""
    return ["auto", *sorted(_REGISTRY)]


def get(name: str) -> SelectFn:
    """Return the algorithm registered as ``name`` (not ``"auto"``: see :func:`resolve`)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"select must be one of {available()}, got {name!r}") from None


def resolve(name: str, *, rows: int, cols: int, k: int, device: torch.device) -> SelectFn:
    """Return the function for ``select=name`` on a block of ``rows × cols`` with this ``k``.

    ``"auto"`` picks the fastest algorithm measured for the shape (``docs/BENCHMARKS.md``): on a
    GPU with the CUDA kernels available (CuPy), knng's single-pass quick multi-select ``qms``
    wherever its candidates fit in shared memory (3.4–5.6× faster than ``torch.topk`` on
    8192 × 65536 blocks, k = 64 … 2048, H100), except on rows longer than ``LONG_ROW`` with
    k ≤ 128, where the grouped filter measured a little faster; else the grouped filter where
    it applies (small k next to the row length); else ``torch.topk``. On a CPU ``torch.topk`` (its partial
    sort beats every reference there).
    """
    if not isinstance(name, str):
        raise TypeError(f"select must be a string naming an algorithm, got {type(name).__name__}")
    if name == "auto":
        if device.type != "cuda":
            return _REGISTRY["topk"]
        from knng.select import cuda
        from knng.select.grouped import choose_group

        qms = _REGISTRY["qms"]
        # On rows of a million the grouped filter streams as fast and wins for small k (search
        # 1M × 128, k = 10: 98 against 103 ms); qms wins for larger k (k = 1024: 151 against 166).
        long_rows_small_k = cols > LONG_ROW and k <= 128 and choose_group(cols, k)
        if cuda.available() and qms.filter_applies(cols, k) and not long_rows_small_k:  # type: ignore[attr-defined]
            return qms
        if choose_group(cols, k):
            return _REGISTRY["grouped"]
        return _REGISTRY["topk"]
    return get(name)


def select_columns(fn: SelectFn, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of every *column* of ``scores``, as (columns, k) arrays.

    Algorithms may provide a ``columns`` attribute that works on the block as it lies in
    memory (the graph's column candidates); otherwise the transposed view is selected by rows.
    """
    columns = getattr(fn, "columns", None)
    if columns is not None:
        return columns(scores, k)
    return fn(scores.T, k)
