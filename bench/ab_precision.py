"""One screen precision, whole calls, in a process of its own: run it alternately with another.

The first precision measured in a process pays for allocator growth and first launches that a
warm-up call does not absorb (float16 graphs of 200k × 128 at k = 10: 400 ms first in their
process, 286 ms after float32 had run), so two precisions are compared in alternating fresh
processes::

    for i in 1 2; do for p in float32 float16; do PYTHONPATH=src python bench/ab_precision.py graph 200000 128 10 $p; done; done

Prints ``task n d k precision min median`` (ms) of 5 calls after one warm-up call; Gaussian
data from a fixed seed (10,000 queries for a search).
"""

import argparse
import statistics
import time

import torch

import knng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task", choices=["search", "graph"])
    ap.add_argument("n", type=int)
    ap.add_argument("d", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("precision")
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((args.n, args.d), device=dev, generator=gen)
    q = torch.randn((10_000, args.d), device=dev, generator=gen)
    knng.options(screen_precision=args.precision).__enter__()  # for the rest of the process
    call = (lambda: knng.graph(x, args.k)) if args.task == "graph" else (lambda: knng.search(q, x, args.k))
    call()
    times = []
    for _ in range(args.calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    print(f"{args.task} {args.n} {args.d} {args.k} {args.precision} {min(times):.1f} {statistics.median(times):.1f}",
          flush=True)


if __name__ == "__main__":
    main()
