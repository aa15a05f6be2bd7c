"""What a store reports: its counters, and summaries of per-row counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from knng._options import get_options

__all__ = ["StoreStats", "summarize_per_row", "summarize_per_row_each"]


@dataclass
class StoreStats:
    """Counters of one store: survivors taken in, tightenings, exact evaluations."""

    survivors: int = 0
    tightenings: int = 0
    exact_evaluations: int = 0
    overflow_rows: int = 0  # rows whose near-ties overflowed the capacity and were evaluated

    def add(self, other: "StoreStats") -> None:
        self.survivors += other.survivors
        self.tightenings += other.tightenings
        self.exact_evaluations += other.exact_evaluations
        self.overflow_rows += other.overflow_rows




def summarize_per_row(counts: list[torch.Tensor]) -> dict[str, float]:
    """Median, 99th percentile and maximum of per-row counts (e.g. exact evaluations).

    The median is the lower one of an even count. :func:`summarize_per_row_each` has the details;
    this is one summary of it."""
    return summarize_per_row_each([counts])[0]


def summarize_per_row_each(summaries: list[list[torch.Tensor]]) -> list[dict[str, float]]:
    """:func:`summarize_per_row` of each list of per-row counts in ``summaries``, with one copy
    from the device for them all (a report's two summaries were two synchronisations).

    Few rows are summarised on the host: on a GPU, ``kthvalue`` and ``max`` were about ten
    launches and a synchronisation per summary (two summaries 1.1 ms of a 10k-query search's
    host time, H100), where NumPy partitions 10k rows in microseconds. From
    ``Options.device_summary_rows`` rows on, counts on a GPU are sorted there and the three ranks
    read in the one copy: NumPy's partition of 200k rows took 3.5 ms of host time per summary
    (cProfile of a 200k-point graph, H100 host, 2026-11-25), a GPU sort a few launches.
    """
    flat = [torch.cat([c.reshape(-1).to(torch.int64) for c in counts]) if counts else None for counts in summaries]
    # What each summary contributes to the one copy: its three ranks, sorted on the device, or
    # all its counts, for the host.
    pieces: list[torch.Tensor] = []
    for allc in flat:
        if allc is None or allc.numel() == 0:
            continue
        n = allc.numel()
        if allc.device.type in get_options().device_summary_on and n >= get_options().device_summary_rows:
            median, p99 = _summary_ranks(n)
            ranked = torch.sort(allc).values  # (its ranks by views: an index copied from the host would wait)
            pieces.append(torch.stack([ranked[median], ranked[p99], ranked[n - 1]]))
        else:
            pieces.append(allc)
    if len({p.device for p in pieces}) == 1:
        copied = iter(np.split(torch.cat(pieces).cpu().numpy(), np.cumsum([p.numel() for p in pieces])[:-1]))
    else:  # counts on several devices: a copy each
        copied = iter([p.cpu().numpy() for p in pieces])
    out: list[dict[str, float]] = []
    for allc in flat:
        if allc is None or allc.numel() == 0:
            out.append({})
            continue
        n = allc.numel()
        host = next(copied)
        median, p99 = _summary_ranks(n)
        if allc.device.type in get_options().device_summary_on and n >= get_options().device_summary_rows:
            values = [float(v) for v in host]
        else:
            part = np.partition(host, sorted({median, p99}))
            values = [float(part[median]), float(part[p99]), float(host.max())]
        out.append({"median": values[0], "p99": values[1], "max": values[2]})
    return out


def summarize_levels(levels: list[tuple[int, int]]) -> dict[str, float]:
    """:func:`summarize_per_row` of counts given as ``(count, rows)`` pairs (``rows`` rows have
    ``count``), on the host: the direct path's rows have one of two widths."""
    levels = sorted((c, r) for c, r in levels if r > 0)
    n = sum(r for _, r in levels)
    if n == 0:
        return {}

    def at(rank: int) -> float:
        for count, rows in levels:
            if rank < rows:
                return float(count)
            rank -= rows
        return float(levels[-1][0])

    median, p99 = _summary_ranks(n)
    return {"median": at(median), "p99": at(p99), "max": float(levels[-1][0])}


def _summary_ranks(n: int) -> tuple[int, int]:
    """0-based ranks of the (lower) median and the 99th percentile of n counts."""
    return (n + 1) // 2 - 1, max(1, min(n, math.ceil(0.99 * n))) - 1
