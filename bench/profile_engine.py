"""Where does the time of one knng call go? Runs torch.profiler around a search or a graph and
prints the top CUDA kernels and CPU ops. Usage::

    PYTHONPATH=src python bench/profile_engine.py graph 200000 128 10
    PYTHONPATH=src python bench/profile_engine.py search 1000000 128 10 --queries 10000
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
    args = ap.parse_args()
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
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
