"""A/B of a search's threshold sample (``plan.GPU_MIN_SAMPLE`` .. ``plan.GPU_SAMPLE``): one size per process.

Fresh processes alternating, two rounds, one machine, from the repository root::

    for i in 1 2; do for s in 0 8192 16384 32768; do PYTHONPATH=src python bench/ab_sample.py $s; done; done

``0`` keeps the planner's sizes; any other value fixes the sample at that many columns for every k.
Cases: 10k queries against 1M Gaussian points, d = 960 at k = 10 and 100, d = 128 at k = 100; min
and median of 5 calls after a warm-up, the sample size and the pairs screened per row.
"""
import sys
import time

import torch

import knng
import knng.api
import knng.engine.plan as plan

size = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if size:
    plan.GPU_SAMPLE = plan.GPU_MIN_SAMPLE = size
dev = torch.device("cuda")
gen = torch.Generator(device=dev).manual_seed(0)
data = {}
for d in (960, 128):
    data[d] = (torch.randn((1_000_000, d), device=dev, generator=gen), torch.randn((10_000, d), device=dev, generator=gen))
for d, k in ((960, 10), (960, 100), (128, 100)):
    x, q = data[d]
    call = lambda: knng.search(q, x, k)  # noqa: E731
    call()
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    r = knng.api.last_report()
    print(f"sample {size or 'auto':>6} d={d:<4} k={k:<4} min {min(times) * 1e3:7.1f} ms  median "
          f"{sorted(times)[2] * 1e3:7.1f}  ({r.screen_dtype}, sample {r.plan.sample_size}, screened/row "
          f"{r.screened_per_row})", flush=True)
