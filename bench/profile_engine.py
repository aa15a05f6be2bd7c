"""Where does the time of one knng call go? Runs torch.profiler around a search or a graph and
prints the top CUDA kernels and CPU ops. Usage::

    PYTHONPATH=src python bench/profile_engine.py graph 200000 128 10
    PYTHONPATH=src python bench/profile_engine.py search 1000000 128 10 --queries 10000 --precision tf32

The engine's stages (corpus preparation, seeding, the screen, the store's add and finish) are
wrapped in ``record_function`` ranges by this script, so the tables show each stage's total
beside the kernels and ops it ran.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import knng


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("task", choices=["search", "graph"])
    ap.add_argument("n", type=int)
    ap.add_argument("d", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--select", default="auto")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--precision", default=None, help="override the planner's screen precision")
    args = ap.parse_args()
    if args.precision:

        knng.options(screen_precision=args.precision).__enter__()  # for the rest of the process
    _wrap_stages()
    dev = torch.device("cuda")
    x = torch.randn((args.n, args.d), device=dev)
    q = torch.randn((args.queries, args.d), device=dev)
    run = (lambda: knng.graph(x, args.k, select=args.select)) if args.task == "graph" else \
        (lambda: knng.search(q, x, args.k, select=args.select))
    import time

    t0 = time.perf_counter()
    result = run()
    torch.cuda.synchronize()
    print(f"wall {time.perf_counter() - t0:.3f} s; store {result.report.store}; "
          f"evaluations per row {result.report.evaluations_per_row}")
    t0 = time.perf_counter()
    run()
    torch.cuda.synchronize()
    print(f"second call, no profiler: {1e3 * (time.perf_counter() - t0):.1f} ms; "
          f"screened per row {result.report.screened_per_row}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(table.table(sort_by="cpu_time_total", row_limit=args.rows, max_name_column_width=50))
    print(table.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=50))
    return 0


def _wrap_stages() -> None:
    """Put every engine stage inside a named profiler range."""
    import functools

    from torch.profiler import record_function

    import knng.engine.graph as graph
    import knng.engine.search as search
    import knng.engine.store as store

    def ranged(name, fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            with record_function(name):
                return fn(*a, **k)
        return inner

    for module, names in ((search, ["prepare_corpus", "block_scores", "screen_rows", "seed_candidates",
                                    "sample_columns"]),
                          (graph, ["block_scores", "screen_rows", "screen_pairs", "seed_candidates",
                                   "corpus_stats", "PreparedCorpus"])):
        for name in names:
            setattr(module, name, ranged(f"knng::{module.__name__.split('.')[-1]}.{name}", getattr(module, name)))
    for name in ["add", "finish", "seed", "screen_thresholds", "_rebuild", "_evaluate_all", "_evaluate"]:
        if hasattr(store.CandidateStore, name):
            setattr(store.CandidateStore, name, ranged(f"knng::store.{name}", getattr(store.CandidateStore, name)))


if __name__ == "__main__":
    raise SystemExit(main())
