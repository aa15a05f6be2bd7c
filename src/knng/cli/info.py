"""``knng info``: what a vector file holds, read from its header, and what knng would do with it:
the device, the budgets, and the engine's plan for its k-NN graph (and for an ann-benchmarks
file, the search of `test` in `train`)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from knng._inputs import as_input
from knng.cli.console import device_text, fmt_bytes, say, shape_text
from knng.cli.inputs import ANN_METRICS, NATIVE_DTYPES, explicit_dataset, open_input
from knng.cli.runs import device_and_budget
from knng.io.readers import HDF5_SUFFIXES

__all__ = ["run", "plan_lines"]


def _make_plan(*, n_queries: int, n_corpus: int, d: int, k: int, metric: str, dev: Any, budget: int,
               memory_budget: str | None, host_memory: str | None, symmetric: bool, data: Any = None) -> Any:
    """The engine's plan for this shape: the very planner ``knng.search`` / ``knng.graph`` call
    (a graph's with a look at a sample of ``data``, as ``knng.graph`` plans it), for a run that
    records checkpoints, as the command line's ``graph`` and ``search`` do (so never the direct
    path of small calls)."""
    from knng.engine.common import integer_extent_of
    from knng.engine.graph import slab_gain_of
    from knng.engine.plan import (
        budget_source, host_budget_source, make_graph_plan, make_search_plan, resolve_host_budget,
    )
    from knng.metrics import get_metric

    hosts = dict(source=budget_source(memory_budget, dev), host_budget=resolve_host_budget(host_memory),
                 host_source=host_budget_source(host_memory))
    if symmetric:
        # What the run's planner knows of integer data (uint8 and int8 files by their type).
        integers = None if data is None else integer_extent_of(data, get_metric(metric), dev)
        return make_graph_plan(n=n_corpus, d=d, k=k, metric=metric, device=dev, budget=budget, include_self=False,
                               slab_gain=None if data is None else slab_gain_of(data, dev), recorded=True,
                               integers=integers, **hosts)
    return make_search_plan(n_queries=n_queries, n_corpus=n_corpus, d=d, k=k, metric=metric, device=dev,
                            budget=budget, recorded=True, **hosts)


def plan_lines(title: str, plan: Any) -> list[str]:
    """A plan of :mod:`knng.engine.plan` in words."""
    lines = [title,
             f"  screen          {plan.screen_precision} matrix products (unit roundoff {plan.unit_roundoff:.3g}); "
             f"stores of {plan.capacity} candidates per row; exact float64 finish",
             f"  thresholds      {plan.thresholds}"]
    if plan.operation == "graph" and plan.graph_method == "rows":
        lines.append(f"  rows            {plan.parts:,} chunk{'s' if plan.parts != 1 else ''} of ≤{plan.query_rows:,} "
                     f"points, each searched against all the data for k + 1 (itself dropped): every pair "
                     f"screened from both sides by the non-symmetric kernel, no candidate stores (on this "
                     f"device and k it beats the symmetric blocks; image-like data keep those)")
        lines.append(f"  score blocks    {plan.query_rows:,} points × {plan.corpus_cols:,} columns, "
                     "nothing materialised")
    elif plan.operation == "graph":
        lines.append(f"  symmetry        {plan.parts:,} part{'s' if plan.parts != 1 else ''} of ≤{plan.part_size:,} "
                     f"points: {plan.blocks:,} of {plan.parts * plan.parts:,} blocks computed "
                     f"({1 - plan.blocks / (plan.parts * plan.parts):.0%} of the pair work skipped)")
        group = plan.group_parts
        lines.append(f"  score blocks    {plan.part_size:,} × {plan.part_size:,}" + (
            f"; a screen kernel takes up to {group} column parts ({group * plan.part_size:,} columns) "
            "per launch" if group > 1 else ""))
        lines.append("  frames          " + (
            "principal: parts are slabs along the first principal direction, each block centred on its "
            "row part; blocks (and block edges) no point can need are skipped" if plan.frames == "principal"
            else "global: one centre, every block computed"))
    else:
        lines.append(f"  score blocks    {plan.query_rows:,} queries × {plan.corpus_cols:,} corpus vectors")
    lines.append("  data            " + ("resident on the device (prepared once)" if plan.corpus_resident
                                       else "streamed: prepared tile by tile")
                 + f"; files read {plan.read_rows:,} rows at a time, two reads ahead")
    if plan.operation == "graph":
        lines.append("  lists           " + {
            "device": "every point's candidate store on the device",
            "host": f"in pinned host memory; the graph runs in {plan.bands} bands of {plan.band_parts} parts, "
                    "two bands' stores on the device at a time",
            "disk": f"in a memory-mapped file (the work area); the graph runs in {plan.bands} bands of "
                    f"{plan.band_parts} parts, two bands' stores on the device at a time"}[plan.lists])
    lines.append(f"  memory          ~{fmt_bytes(plan.bytes_expected)} expected on the device; "
                 f"~{fmt_bytes(plan.host_bytes_expected)} of host memory (budget {fmt_bytes(plan.host_budget)}, "
                 f"{plan.host_budget_source})")
    if plan.host_budget_note:
        lines.append(f"  warning         {plan.host_budget_note}")
    if plan.metric != "inner_product":
        # Groups of identical rows are found as the run reads the data, which this plan has not.
        lines.append("  duplicates      groups of identical rows, where the run finds some worth folding, are "
                     "searched as one row each: the run then plans for those rows (its knng.json records that plan)")
    out_bytes = plan.n_queries * plan.k * (8 + 4)
    lines.append(f"  outputs         {plan.n_queries:,} × {plan.k} neighbours: indices int64 + distances float32 "
                 f"= {fmt_bytes(out_bytes)}")
    return lines


def _access_text(info: dict[str, Any]) -> str:
    """How knng reads the file, for ``knng info``."""
    if not all(info["shape"]):
        return "empty: no vectors to read"
    if info["memory_mapped"]:
        return "memory-mapped: rows are read on demand"
    if info["format"] in HDF5_SUFFIXES:
        return "read lazily in row blocks (HDF5)"
    return "read into memory"


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``knng info`` as parsed into ``args``; returns the exit status."""
    from knng.io import describe

    info = describe(args.file)
    shape = tuple(info["shape"])
    lines = [
        f"file            {info['path']}",
        f"format          {info['format']}: {info['description']}",
        f"file size       {fmt_bytes(info['file_bytes'])} ({info['file_bytes']:,} bytes)",
    ]
    if info["format"] in HDF5_SUFFIXES:
        lines.append(f"dataset         {info['dataset']}")
    lines += [
        f"shape           {shape} ({shape_text(shape)})",
        f"dtype           {info['dtype']}, {info['bytes_per_vector']:,} bytes per vector",
        "access          " + _access_text(info),
    ]
    if info["format"] in HDF5_SUFFIXES:
        lines.append("datasets:")
        for name, ds in sorted(info["datasets"].items()):
            lines.append(f"  {name:<14}{tuple(ds['shape'])} {ds['dtype']}")
        distance = info.get("distance")
        lines.append(f"distance        {distance!r}" + (
            f" → knng metric {ANN_METRICS[str(distance).lower()]}"
            if distance is not None and str(distance).lower() in ANN_METRICS else
            (" (not supported by knng: pass --metric)" if distance is not None else "")))
    if info["dtype"] not in NATIVE_DTYPES:
        lines.append("note            knng converts these values to float64 as it reads them (exact)")

    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        say("\n".join(lines) + "\n\nknng needs a 2-D array of at least one vector; nothing to plan.")
        return 0
    if args.k < 1:
        raise ValueError(f"k must be at least 1, got {args.k}")
    dev, _ = device_and_budget(args.device, args.memory_budget)
    from knng.engine.plan import budget_source, resolve_budget

    budget = resolve_budget(args.memory_budget, dev)
    n, d = shape
    metric = args.metric or "euclidean"
    common = dict(d=d, metric=metric, dev=dev, budget=budget, memory_budget=args.memory_budget,
                  host_memory=args.host_memory)
    plans = {}
    if n >= 2:
        # The graph's plan reads a sample of the rows (whether principal frames pay), as knng graph's does.
        rows = as_input(open_input(args.file).array, "data")
        plans["plan"] = _make_plan(n_queries=n, n_corpus=n, k=min(args.k, n - 1), symmetric=True, data=rows, **common)
    if (info["format"] in HDF5_SUFFIXES and not explicit_dataset(args.file)
            and {"train", "test"} <= set(info["datasets"])):
        test = tuple(info["datasets"]["test"]["shape"])
        if len(test) == 2 and test[1] == d:
            plans["search_plan"] = _make_plan(n_queries=test[0], n_corpus=n, k=min(args.k, n), symmetric=False,
                                              **common)
    if args.json:
        from knng.io import json_default

        # "plan" is what `knng graph FILE -k K` records in knng.json on this machine.
        print(json.dumps({"file": info, **{key: p.as_dict() for key, p in plans.items()}}, default=json_default,
                         indent=1))
        return 0
    say("\n".join(lines))
    out = ["", "what knng would do:",
           f"  device          {device_text(dev)}" + ("  (--device auto)" if args.device == "auto" else ""),
           f"  memory budget   {fmt_bytes(budget)} (" + ("from --memory-budget" if args.memory_budget else
                                                         budget_source(None, dev)) + ")"]
    first = next(iter(plans.values()), None)
    if first is not None:
        if first.budget < budget:
            out[-1] += f"; {fmt_bytes(first.budget)} planned (the host budget's share)"
        out.append(f"  host memory     {fmt_bytes(first.host_budget)} (" + (
            "from --host-memory" if args.host_memory else first.host_budget_source) + ")")
    if "plan" in plans:
        out += plan_lines(f"k-NN graph, k={plans['plan'].k}:", plans["plan"])
    else:
        out.append("  (a graph needs at least 2 vectors)")
    if "search_plan" in plans:
        out += plan_lines(f"search of `test` ({plans['search_plan'].n_queries:,} queries) in `train`, "
                           f"k={plans['search_plan'].k}:", plans["search_plan"])
    say("\n".join(out))
    return 0
