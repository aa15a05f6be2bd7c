"""The pipeline stages a run went through, counted, and recorded in its report.

Which path a call takes (a kernel or its reference, the store holding survivors or taking them
in, frames, folded duplicates, a graph by rows) depends on the data, the device and the
options. The engine counts each stage where it runs (:func:`count`); the engine's entry points
run inside :func:`recording` and put the counts in their report (``EngineReport.stages``), so a
user, a benchmark or a test reads what ran from the result instead of instrumenting the code,
and runs from memory, files and several processes can be compared stage by stage.

Stage names are ``"area.step"`` (``"screen.kernel"``, ``"store.hold"``, ``"finish.exact_kernel"``);
the counts are launches or calls of that step, not pairs. A run nested in another (a graph by
rows is a search of the data against themselves) adds its counts to the outer run's too.

This module imports nothing of knng: every part of the engine may count.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["count", "recording", "recorded", "uncounted"]

Run = TypeVar("Run", bound=Callable[..., tuple])

_RUN: ContextVar["Counter[str] | None"] = ContextVar("knng_stages", default=None)


def count(stage: str, times: int = 1) -> None:
    """Count ``times`` runs of ``stage`` in the run in progress (nothing outside a run)."""
    stages = _RUN.get()
    if stages is not None:
        stages[stage] += times


@contextlib.contextmanager
def recording() -> Iterator["Counter[str]"]:
    """Count the stages of the block's run; yields the counter, which fills as the run goes.

    On the way out the counts are added to those of the run this one is nested in, if any.
    """
    outer = _RUN.get()
    stages: Counter[str] = Counter()
    token = _RUN.set(stages)
    try:
        yield stages
    finally:
        _RUN.reset(token)
        if outer is not None:
            outer.update(stages)


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Count nothing of the block's stages (work run only to set something up: a warm-up)."""
    token = _RUN.set(None)
    try:
        yield
    finally:
        _RUN.reset(token)


def recorded(run: Run) -> Run:
    """An engine entry point that records its stages: ``run`` returns a tuple whose last item
    is its report, and the report's ``stages`` get the run's counts."""

    @functools.wraps(run)
    def recording_run(*args: Any, **kwargs: Any) -> tuple:
        with recording() as stages:
            result = run(*args, **kwargs)
        result[-1].stages = dict(sorted(stages.items()))
        return result

    return recording_run  # type: ignore[return-value]
