"""A/B of ``knng.graph`` on one GPU: whichever knng is on PYTHONPATH, min of 3 repeats per shape.

Run it twice per version, alternating, on the same machine (two source trees, e.g. a
``git worktree`` of the old commit copied into an ignored folder)::

    for i in 1 2; do PYTHONPATH=old/src python bench/ab_graph.py old; PYTHONPATH=src python bench/ab_graph.py new; done

Shapes: the graphs of ``bench/bench_engine.py`` (200k × 128 at k = 10 and 100, 16,384 × 4,096 at
k = 1,024) and 582,150 × 64 Gaussian points from the host (the Gaussian twin of the 8×8 patches
of ``bench/bench_patches.py``).
"""

import sys
import time

import torch

import knng

tag = sys.argv[1] if len(sys.argv) > 1 else "knng"
knng.graph(torch.randn(20000, 64, device="cuda"), 10)
gen = torch.Generator(device="cuda").manual_seed(0)
cases = [("200k x 128", torch.randn(200_000, 128, device="cuda", generator=gen), (10, 100)),
         ("16384 x 4096", torch.randn(16_384, 4096, device="cuda", generator=gen), (1024,)),
         ("582k x 64 numpy", torch.randn(582_150, 64, device="cuda", generator=gen).cpu().numpy(), (10, 100))]
for name, x, ks in cases:
    for k in ks:
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            knng.graph(x, k)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        print(f"{tag:4} {name:16} k={k:<5} min {min(ts) * 1e3:8.1f} ms  all {[round(t * 1e3) for t in ts]}",
              flush=True)
