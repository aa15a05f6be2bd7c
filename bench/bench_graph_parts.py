"""How the symmetric graph's part size trades matrix-product savings against selection and merge
overheads, next to the unsymmetric row sweep (knng.search(x, x, k + 1)) of the same engine.

    PYTHONPATH=src python bench/bench_graph_parts.py 200000 128 10 --parts 8192,16384,25000,50000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import knng
from knng._inputs import as_input
from knng.engine.graph import exact_graph
from knng.engine.plan import resolve_budget
from knng.metrics import get_metric


def timed(fn, repeats=3):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int)
    ap.add_argument("d", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--parts", default="")
    args = ap.parse_args()
    dev = torch.device("cuda")
    x = torch.randn((args.n, args.d), device=dev)
    data = as_input(x, "data")
    budget = resolve_budget(None, dev)
    metric = get_metric("euclidean")
    print(f"{args.n}x{args.d} k={args.k} on {torch.cuda.get_device_name()}")
    print(f"  knng.graph (auto)            {timed(lambda: knng.graph(x, args.k)):8.1f} ms")
    for b in [int(p) for p in args.parts.split(",") if p]:
        ms = timed(lambda: exact_graph(data, args.k, metric, dev, "auto", budget, part_size=b))
        print(f"  symmetric, part size {b:6d}  {ms:8.1f} ms")
    print(f"  row sweep search(x,x,k+1)   {timed(lambda: knng.search(x, x, args.k + 1)):8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
