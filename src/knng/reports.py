"""The engine's report on the most recent call, and reports as plain JSON values.

Every call of :func:`knng.search` / :func:`knng.graph` (one device or distributed) records its
report here with :func:`set_last_report`; :func:`last_report` gives it back (a convenience:
every result also carries its own ``result.report``). :mod:`knng.api` re-exports
:func:`last_report` and :func:`report_as_dict`, and keeps ``knng.api._LAST_REPORT`` as the
very same holder object as :data:`LAST_REPORT`.

Layering: this module sits at the select/engine level (``io < _inputs < metrics < select <
engine < distributed < api < cli``): it imports nothing from knng at run time, so
:mod:`knng.distributed` and :mod:`knng.api` can both use it; it must never import
:mod:`knng.api` (``tests/test_layering.py`` checks it).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

__all__ = ["LAST_REPORT", "last_report", "set_last_report", "report_as_dict"]

#: Holder of the last call's report: a one-entry dict ``{"report": report or None}``, one
#: object for the whole process (tests reset it with ``LAST_REPORT["report"] = None``).
LAST_REPORT: dict[str, Any] = {"report": None}


def last_report() -> Any:
    """The engine's report on the most recent call in this process.

    Returns
    -------
    SearchReport, GraphReport, DistributedSearchReport, DistributedGraphReport or None
        None before the first call. Every result also carries its own ``result.report``.
    """
    return LAST_REPORT["report"]


def set_last_report(report: Any) -> None:
    """Record ``report`` as the most recent call's (what :func:`last_report` returns next).

    Parameters
    ----------
    report : object
        The engine's report on the call that just finished.
    """
    LAST_REPORT["report"] = report


def report_as_dict(report: Any) -> dict[str, Any]:
    """An engine report as plain JSON values (what ``knng.json`` records).

    Parameters
    ----------
    report : object or None
        A report of the one-device or distributed engine.

    Returns
    -------
    dict
        ``rows``, ``exact_evaluations``, the plan and store (as dicts), the
        per-rank figures of a distributed run, and every other scalar field or property of the
        report; empty for ``None``.
    """
    if report is None:
        return {}
    out: dict[str, Any] = {
        "rows": report.exact.rows,
        "exact_evaluations": report.exact.exact_evaluations,
    }
    plan = getattr(report, "plan", None)
    if plan is not None:
        out["plan"] = plan.as_dict() if hasattr(plan, "as_dict") else asdict(plan)
    if hasattr(report, "per_rank"):
        out["per_rank"] = report.per_rank
    store = getattr(report, "store", None)
    if store is not None:
        out["store"] = asdict(store)
    replans = getattr(report, "replans", None)
    if replans:  # the plans made after out-of-memory errors, beside the one made first
        out["replans"] = [p.as_dict() if hasattr(p, "as_dict") else asdict(p) for p in replans]
    # Every other scalar field or property of the report (oom_retries, screen_dtype, the
    # graph's parts and blocks, ...), so new fields reach knng.json without a CLI change.
    for name in dir(report):
        if name.startswith("_") or name in ("exact", "plan", "store"):
            continue
        value = getattr(report, name)
        if isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif name in ("evaluations_per_row", "checkpoints", "stages") and isinstance(value, dict):
            out[name] = value
    return out
