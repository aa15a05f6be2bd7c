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
    wherever its candidates fit in shared memory (4.1–6.1× faster than ``torch.topk`` on
    8192 × 65536 blocks for k ≤ 1024 on an H100); else the grouped filter where it applies
    (small k next to the row length); else ``torch.topk``. On a CPU ``torch.topk`` (its partial
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
        if cuda.available() and qms.filter_applies(cols, k):  # type: ignore[attr-defined]
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
