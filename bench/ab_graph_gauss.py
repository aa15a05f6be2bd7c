"""A/B of ``knng.graph`` on Gaussian points (whichever knng is on PYTHONPATH): by default 200k × 128
at k = 10 and 100, 1M × 128 at k = 10 (or ``N:K`` cases, d = 128, as the second argument); min of 3
calls after a warm-up, 128 rows checked against the float64 oracle by differences
(``tests/oracle.py``). Two source trees alternating on one GPU machine::

    for i in 1 2; do PYTHONPATH=old/src:tests python bench/ab_graph_gauss.py old; PYTHONPATH=src:tests python bench/ab_graph_gauss.py new; done

or one tree's variants in fresh processes (a first argument that names none is only a label):

* ``store``: a graph's survivors taken into its store as before it held them (the ``hold_on`` option empty);
* ``p2`` / ``p8`` / ``p16``: held survivors tightened every 2²¹ / 2²³ / 2²⁴ new ones instead of
  ``plan.PENDING_GPU``;
* ``chunks``: own parts' seeds by chunk minima of the materialised sample block, as before the
  kernel's strip minima (``fused.strip_minima_runs`` false);
* ``mmasync``: the float16 screen in ``cuda/screen.cu``'s mma.sync kernel on a Hopper GPU too
  (the ``wgmma`` option off), as before the wgmma kernel;
* ``perpart``: each part's own block seeded and screened in a pass of its own (``screen_own_part``),
  as before ``screen_own_parts_together``;
* ``sorts``: the finish's rows ordered by two stable sorts, as before the rank kernel
  (``row_order.MAX_WIDTH`` 0);
* ``cols65536`` / ``cols131072``: a rows-method graph's (and a search's) column tiles of 2¹⁶ / 2¹⁷
  instead of ``plan.GPU_SEARCH_COLS`` (the thresholds tighten between tiles);
* ``sample16384`` / ``sample32768`` / ``sample131072``: threshold samples of at most 2¹⁴ / 2¹⁵ / 2¹⁷ columns instead of
  ``plan.GPU_SAMPLE``;
* ``mmaminima``: strip minima (seeds) by ``cuda/screen.cu``'s mma.sync kernel on a Hopper GPU
  too, as before the wgmma kernel ran them (the ``wgmma_minima`` option off);
* ``f64sort``: the finish's wide rows sorted once by their float64 distances, as before the
  float32 keys (``row_order.SORT_KEY``);
* ``seed16384`` / ``seed24576``: own parts seeded from 16,384 / 24,576 of their columns instead of
  ``plan.OWN_PART_SEED`` (tighter seeds, now that strip minima write no block).
"""
import sys
import time

import torch

import knng
import knng.engine.graph as graph
from knng.engine import fused, row_order
import knng.engine.plan as plan

sys.path.insert(0, "tests")
from oracle import assert_exact_chunked  # noqa: E402

VARIANTS = {
    "store": lambda: knng.options(hold_on=frozenset()).__enter__(),
    "p2": lambda: setattr(plan, "PENDING_GPU", 1 << 21),
    "p8": lambda: setattr(plan, "PENDING_GPU", 1 << 23),
    "p16": lambda: setattr(plan, "PENDING_GPU", 1 << 24),
    "chunks": lambda: setattr(fused, "strip_minima_runs", lambda precision, device: False),
    "seed16384": lambda: setattr(graph, "OWN_PART_SEED", 16384),
    "seed24576": lambda: setattr(graph, "OWN_PART_SEED", 24576),
    "mmasync": lambda: knng.options(wgmma=False).__enter__(),
    "perpart": lambda: setattr(graph, "_own_parts_together", lambda *a: False),
    "sorts": lambda: setattr(row_order, "MAX_WIDTH", 0),
    "f64sort": lambda: setattr(row_order, "SORT_KEY", torch.float64),
    "mmaminima": lambda: knng.options(wgmma_minima=False).__enter__(),
    "cols65536": lambda: setattr(plan, "GPU_SEARCH_COLS", 1 << 16),
    "cols131072": lambda: setattr(plan, "GPU_SEARCH_COLS", 1 << 17),
    "sample16384": lambda: setattr(plan, "GPU_SAMPLE", 1 << 14),
    "sample32768": lambda: setattr(plan, "GPU_SAMPLE", 1 << 15),
    "sample131072": lambda: setattr(plan, "GPU_SAMPLE", 1 << 17),
}


def main() -> None:
    tag = sys.argv[1]
    VARIANTS.get(tag, lambda: None)()
    cases = ([tuple(int(v) for v in c.split(":")) for c in sys.argv[2].split(",")] if len(sys.argv) > 2
             else [(200_000, 10), (1_000_000, 10), (200_000, 100)])
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in cases:
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
