"""Does running FAISS or torch first slow knng down in the same process? (GPU machine, peer pack.)

Times ``knng.search`` (10k queries against 1M × 128 N(0, 1) points, k = 10 and 100; median and
min of 5 calls after a warm-up) fresh, right after three ``faiss.knn_gpu`` calls, two seconds
later, right after three torch mm + topk searches, after ``torch.cuda.empty_cache()`` and two
seconds later. Usage::

    . .peers/env.sh; PYTHONPATH=src:tests:$PYTHONPATH python bench/same_process_peers.py

It showed (H100, 2026-11-25) no lasting effect of either peer: the differences are call to call
(``docs/BENCHMARKS.md``, "Thresholds in one launch").
"""
import os
import statistics
import sys
import time

import torch

import knng

sys.path.insert(0, os.path.dirname(__file__))
from bench_engine import torch_search  # noqa: E402 - the same baseline as bench_fused.py


def main() -> None:
    import faiss
    import faiss.contrib.torch_utils  # noqa: F401 - lets knn_gpu take torch tensors

    res = faiss.StandardGpuResources()
    g = torch.Generator(device="cuda").manual_seed(2)
    c = torch.randn((1_000_000, 128), generator=g, device="cuda")
    q = torch.randn((10_000, 128), generator=g, device="cuda")

    def timed_knng(label: str, k: int) -> None:
        out = []
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            knng.search(q, c, k)
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        print(f"{label:<28} k={k:<4} min {min(out[1:]) * 1e3:6.1f} median {statistics.median(out[1:]) * 1e3:6.1f}",
              flush=True)

    for k in (10, 100):
        timed_knng("fresh", k)
        for _ in range(3):
            faiss.knn_gpu(res, q, c, k)
        torch.cuda.synchronize()
        timed_knng("after faiss", k)
        time.sleep(2)
        timed_knng("after faiss + 2 s", k)
        for _ in range(3):
            torch_search(q, c, k)
        torch.cuda.synchronize()
        timed_knng("after torch", k)
        torch.cuda.empty_cache()
        timed_knng("after torch + empty_cache", k)
        time.sleep(2)
        timed_knng("after torch + 2 s", k)


if __name__ == "__main__":
    main()
