"""A/B of whole calls on one GPU: whichever knng is on PYTHONPATH; min and median of 5 calls per case.

Run the two source trees alternately on one machine (e.g. the old commit's ``src`` copied into an
ignored folder), so that drift between runs shows::

    for i in 1 2; do PYTHONPATH=old/src python bench/ab_calls.py old; PYTHONPATH=src python bench/ab_calls.py new; done

Cases: searches of 1M × 128 (k = 10, 100) and 1M × 960 (k = 10) Gaussian points with 10k
queries, and a graph of 200k × 128 at k = 10, each in the planner's own precision.
"""

import sys
import time

import torch

import knng
import knng.api

tag = sys.argv[1] if len(sys.argv) > 1 else "knng"
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
x = torch.randn((1_000_000, 128), device=dev, generator=gen)
q = torch.randn((10_000, 128), device=dev, generator=gen)
x960 = torch.randn((1_000_000, 960), device=dev, generator=gen)
q960 = torch.randn((10_000, 960), device=dev, generator=gen)
g = x[:200_000].clone()
cases = [("search128 k=10", lambda: knng.search(q, x, 10)),
         ("search128 k=100", lambda: knng.search(q, x, 100)),
         ("search960 k=10", lambda: knng.search(q960, x960, 10)),
         ("graph200k k=10", lambda: knng.graph(g, 10))]
for name, call in cases:
    call()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(f"{tag} {name:22} min {min(times) * 1e3:7.1f} ms  median {sorted(times)[2] * 1e3:7.1f}  "
          f"({knng.api.last_report().screen_dtype})", flush=True)
