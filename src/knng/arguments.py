"""Validation of the arguments shared by the public entry points.

:func:`knng.search` / :func:`knng.graph` (:mod:`knng.api`) and their distributed forms
(:mod:`knng.distributed`) check ``k``, ``select`` and a graph's arguments here, so that every
entry point accepts and rejects the same values with the same messages.

Layering: this module sits at the select/engine level (``io < _inputs < metrics < select <
engine < distributed < api < cli``). It may import :mod:`knng.io`, :mod:`knng._inputs`,
:mod:`knng.metrics` and :mod:`knng.select`, and must not import :mod:`knng.distributed`,
:mod:`knng.api` or anything above them (``tests/test_layering.py`` checks it).
"""

from __future__ import annotations

import numbers
from typing import Any

from knng._inputs import InputArray, as_input
from knng.metrics import Metric, get_metric
from knng.select import available as available_selects

__all__ = ["check_k", "check_select", "graph_arguments"]


def check_k(k: Any, limit: int, what: str) -> int:
    """Check that ``k`` is an integer in ``[1, limit]``.

    Parameters
    ----------
    k : object
        The user's ``k``.
    limit : int
        The largest allowed value.
    what : str
        What ``limit`` is, for the error message (e.g. ``"the corpus size"``).

    Returns
    -------
    int
        ``k`` as a Python int.

    Raises
    ------
    TypeError
        ``k`` is not an integer (``bool`` included).
    ValueError
        ``k`` is out of range.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an integer, got {type(k).__name__}")
    k = int(k)
    if k < 1 or k > limit:
        raise ValueError(f"k must be between 1 and {limit} ({what}), got {k}")
    return k


def check_select(select: Any) -> str:
    """Check that ``select`` names a registered k-selection algorithm (or ``"auto"``).

    Parameters
    ----------
    select : object
        The user's ``select``.

    Returns
    -------
    str
        ``select`` unchanged.

    Raises
    ------
    ValueError
        ``select`` is not one of ``knng.select.available()``.
    """
    if not isinstance(select, str) or select not in available_selects():
        raise ValueError(f"select must be one of {available_selects()}, got {select!r}")
    return select


def graph_arguments(data: Any, k: Any, metric: str, include_self: Any,
                    select: Any) -> tuple[Metric, InputArray, int, str]:
    """Validate the arguments of a graph call (:func:`knng.graph`, :func:`knng.distributed.graph`).

    Parameters
    ----------
    data : array-like, shape (n, d)
        The user's data (any kind :func:`knng._inputs.as_input` accepts).
    k : object
        Neighbours per point: 1 ≤ k ≤ n − 1, or ≤ n with ``include_self``.
    metric : str
        A name from :data:`knng.metrics.METRICS`.
    include_self : object
        Must be ``True`` or ``False``.
    select : object
        A k-selection algorithm name, as in :func:`check_select`.

    Returns
    -------
    tuple
        ``(metric, data, k, select)``: the :class:`~knng.metrics.Metric`, the validated
        :class:`~knng._inputs.InputArray`, ``k`` as an int and the algorithm name.

    Raises
    ------
    TypeError, ValueError
        For bad input; the message names the argument.
    """
    m = get_metric(metric)
    x = as_input(data, "data")
    if not isinstance(include_self, bool):
        raise TypeError(f"include_self must be True or False, got {include_self!r}")
    limit = x.n if include_self else x.n - 1
    if limit < 1:
        raise ValueError(f"data has {x.n} point(s): a graph without self-loops needs at least 2")
    k = check_k(k, limit, "n with include_self" if include_self else "n − 1 without self")
    return m, x, k, check_select(select)


def check_checkpoint_arguments(folder: Any, resume: Any, interval: Any, keep: Any) -> None:
    """Check ``checkpoint=``, ``resume=``, ``checkpoint_interval=`` and ``keep_checkpoint=``
    (of :func:`knng.graph`, :func:`knng.search` and their distributed forms)."""
    import os

    for name, value in (("resume", resume), ("keep_checkpoint", keep)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if folder is None:
        if resume or keep:
            raise ValueError(f"{'resume' if resume else 'keep_checkpoint'}=True needs a checkpoint folder "
                             "(checkpoint=PATH)")
        return
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"checkpoint must be a folder path, got {type(folder).__name__}")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval >= 0:
        raise ValueError(f"checkpoint_interval must be a number of seconds ≥ 0, got {interval!r}")
