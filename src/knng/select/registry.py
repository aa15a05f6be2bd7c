"""The registry of k-selection algorithms (the choice behind ``select="auto"`` is
:mod:`knng.select.choice`)."""

from __future__ import annotations

from typing import Callable, Protocol

import torch

__all__ = ["SelectFn", "register", "get", "available", "select_columns"]


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
    """Return the algorithm registered as ``name`` (not ``"auto"``: see
    :func:`knng.select.choice.resolve`)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"select must be one of {available()}, got {name!r}") from None


def select_columns(fn: SelectFn, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of every *column* of ``scores``, as (columns, k) arrays.

    Algorithms may provide a ``columns`` attribute that works on the block as it lies in
    memory (the graph's column candidates); otherwise the transposed view is selected by rows.
    """
    columns = getattr(fn, "columns", None)
    if columns is not None:
        return columns(scores, k)
    return fn(scores.T, k)
