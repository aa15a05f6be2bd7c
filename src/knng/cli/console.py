"""What the commands print: lines, sizes, shapes, devices and the engine's exactness summary."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["say", "say_err", "fmt_bytes", "shape_text", "device_text", "exact_line"]


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def say_err(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def fmt_bytes(n: float) -> str:
    """Binary units, like the budget defaults (``2 GiB``) and ``--memory-budget 4GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def shape_text(shape: Sequence[int]) -> str:
    return " × ".join(f"{s:,}" for s in shape)


def device_text(dev: Any) -> str:
    """``cuda:0 (NVIDIA H100 ...)`` or ``cpu (N threads)``."""
    import torch

    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def exact_line(report: Any) -> str:
    """The exact evaluations of a run (and its resumption, if any) in one or two lines."""
    screen = getattr(report, "screen_dtype", None)
    per_row = getattr(report, "evaluations_per_row", None) or {}
    text = f"  exact: {report.exact.exact_evaluations:,} exact evaluations for {report.exact.rows:,} rows"
    if per_row:
        text += f" (per row: median {per_row['median']:.0f}, p99 {per_row['p99']:.0f}, max {per_row['max']:.0f})"
    exact_products = " with exact products (integer data)" if getattr(report, "exact_products", False) else ""
    text = (text + (f"; {screen} screen{exact_products}" if screen else "")
            + (f"; {report.oom_retries} out-of-memory retries" if getattr(report, "oom_retries", 0) else ""))
    escalated = getattr(report, "rows_escalated", 0)
    if escalated:
        text += f"\n  {escalated:,} rows of near-ties searched again with a float64 screen (escalated)"
    checkpoints = getattr(report, "checkpoints", None) or {}
    if checkpoints.get("resumed_from"):
        from knng.distributed.graph_shares import DistributedGraphReport

        # Steps are blocks (a graph, or a rank's share of one), rows (a graph by rows) or query rows.
        by_rows = getattr(getattr(report, "plan", None), "graph_method", "") == "rows"
        unit = ("rows" if by_rows else "blocks" if getattr(report, "blocks_skipped", None) is not None
                or isinstance(report, DistributedGraphReport) else "queries")
        text += (f"\n  resumed from a checkpoint with {checkpoints['resumed_from']:,} {unit} done; "
                 f"{checkpoints['saves']} checkpoints saved since ({checkpoints['seconds']:.2f} s)")
    peak = getattr(report, "device_peak", None)
    plan = getattr(report, "plan", None)
    if peak is not None and plan is not None:  # a GPU's: torch does not count host memory
        text += (f"\n  device memory: {'at most ' if report.device_peak_is_bound else ''}{peak / 2**30:.2f} GiB at "
                 f"the peak beyond what was allocated before (a copy of the input included); the plan's budget "
                 f"{plan.budget / 2**30:.2f} GiB")
    return text
