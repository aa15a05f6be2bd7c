"""A/B of ``knng.graph`` on Gaussian points (whichever knng is on PYTHONPATH): 200k × 128 at k = 10
and 100, 1M × 128 at k = 10; min of 3 calls after a warm-up, 128 rows checked against the float64
oracle by differences (``tests/oracle.py``). Two source trees alternating on one GPU machine::

    for i in 1 2; do PYTHONPATH=old/src:tests python bench/ab_graph_gauss.py old; PYTHONPATH=src:tests python bench/ab_graph_gauss.py new; done
"""
import sys
import time

import torch

import knng

sys.path.insert(0, "tests")
from oracle import assert_exact_chunked  # noqa: E402


def main() -> None:
    tag = sys.argv[1]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in [(200_000, 10), (1_000_000, 10), (200_000, 100)]:
        x = torch.randn(n, 128, device="cuda", generator=gen)
        g = knng.graph(x, k)
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(k))[:128].cuda()
        try:
            assert_exact_chunked(x, x, [g], "euclidean", exclude_self=True, rows=rows)
            verdict = "exact"
        except AssertionError as exc:
            verdict = "NOT EXACT " + str(exc)[:200]
        ts = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g = knng.graph(x, k)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        r = g.report
        print(f"{tag:4} graph {n}x128 k={k}: min {min(ts):7.1f} ms all {[round(t) for t in ts]} "
              f"({r.plan.screen_precision}, {r.plan.graph_method}, screened {r.screened_per_row.get('median')}, {verdict})", flush=True)
        del x, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
