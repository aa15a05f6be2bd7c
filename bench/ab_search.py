"""A/B of a GPU search's engine settings: one variant per process, fresh processes alternating.

From the repository root on a GPU machine::

    for i in 1 2; do for v in store new; do PYTHONPATH=src:tests python bench/ab_search.py $v; done; done

Variants (each patches module constants before the first call; ``new`` leaves the code as it is):

* ``store``: the survivors a search holds back are taken into the store after its first tile
  and finished there (a holding of no room, ``store.Holding(limit=0)``), as before the finish
  from held survivors existed.
* ``blocks``: a corpus already on the GPU prepared in the plan's read blocks
  (``common.DEVICE_BLOCK_BYTES = 0``), as before.
* ``cols131072``, ``cols524288``: the first corpus tile half / twice the planner's width
  (``plan.GPU_SEARCH_COLS``).
* ``noradius``: the thresholds' radii by torch's float64 operations on every device, as before
  the radius kernel (``knng.engine.radius``).
* ``noepilogue``: the seeds' column terms added to the sample block by a pass of their own, as
  before they went into the product's epilogue (the ``gemm_column_terms`` option).
* ``old``: both of the above.
* ``sort``: each row's first and k-th key for the tightening by one int64 sort of the survivors
  on every device (``row_kth.row_ends_reference``), as before the selection kernels.
* ``oldseed``: the seed kernel one program per 1,024 rows and one seed per step, as before.
* ``anyshape``: a screen launch's lists sized from the last launch of any shape, as before.
* ``before``: all three.
* ``chunks``: the seeds by chunk minima (or a selection) of the materialised sample block, as
  before the kernel's strip minima (``fused.strip_minima_runs`` false).
* ``sample32768``, ``sample65536``: a sample of at least 32,768 / 65,536 columns at every k
  (``plan.GPU_MIN_SAMPLE``; tighter seeds, now that strip minima write no block).
* ``mmaminima``: the seeds' strip minima by the mma.sync kernel on a Hopper GPU too, as before
  the wgmma kernel ran them (the ``wgmma_minima`` option off).
* ``f64sort``: wide rows sorted once by their float64 distances (``row_order.SORT_KEY``).
* ``new``: the code as it is.

Earlier variants (2026-11-24, see ``docs/BENCHMARKS.md``): ``base``, a search's survivors waiting at
most ``plan.PENDING_GPU`` pairs and tightening only after the first tile.

Cases: 10k queries against 1M N(0, 1) points, d = 128 at k = 10, 100, 1,024 and 2,048 and d = 960
at k = 10 and 100 (``CASES`` as ``d:k,d:k``, optional second argument). For each: min and median
of 5 calls after a warm-up, the peak of allocated GPU memory, pairs screened per row, and whether
256 rows are exact against the float64 oracle by differences (``tests/oracle.py``).
"""
import sys
import time

import torch

import knng
import knng.api
import knng.engine.plan as plan
import knng.engine.fused as fused
import knng.engine.common as common
import knng.engine.radius as radius
import knng.engine.row_kth as row_kth
import knng.engine.row_order as row_order
import knng.engine.search as search
import knng.engine.store as store

VARIANTS = {
    # The held survivors taken into the store and finished there, as before they were finished whole.
    "store": lambda: setattr(search, "Holding", lambda: store.Holding(limit=0)),
    # A corpus on the GPU prepared in the plan's read blocks, as before prepare_corpus took it whole.
    "blocks": lambda: setattr(common, "DEVICE_BLOCK_BYTES", 0),
    # The first corpus tile (whose survivors tighten the thresholds the rest is screened against)
    # half / twice the planner's width.
    "cols131072": lambda: setattr(plan, "GPU_SEARCH_COLS", 1 << 17),
    "cols524288": lambda: setattr(plan, "GPU_SEARCH_COLS", 1 << 19),
    "noradius": lambda: setattr(radius, "kernel_applies", lambda *tensors: False),
    "noepilogue": lambda: knng.options(gemm_column_terms=False).__enter__(),
    "old": lambda: (VARIANTS["noradius"](), VARIANTS["noepilogue"]()),
    "sort": lambda: setattr(row_kth, "kernel_applies", lambda rows: False),
    "oldseed": lambda: setattr(radius, "SEED_TILE", (1024, 1)),
    "anyshape": lambda: setattr(fused, "_capacity_hint", lambda kind, device, m, n: max(
        fused.INITIAL_PER_ROW * m, fused._last_found.get((kind, device), 0) * 5 // 4)),
    "before": lambda: (VARIANTS["sort"](), VARIANTS["oldseed"](), VARIANTS["anyshape"]()),
    "chunks": lambda: setattr(fused, "strip_minima_runs", lambda precision, device: False),
    "sample32768": lambda: setattr(plan, "GPU_MIN_SAMPLE", 32768),
    "sample65536": lambda: setattr(plan, "GPU_MIN_SAMPLE", 65536),
    # The float16 screen in the mma.sync kernel (cuda/screen.cu) on a Hopper GPU too.
    "mmasync": lambda: knng.options(wgmma=False).__enter__(),
    # The finish's rows ordered by two stable sorts, as before the rank kernel (row_order).
    "sorts": lambda: setattr(row_order, "MAX_WIDTH", 0),
    # Wide rows sorted once by their float64 distances, as before the float32 keys.
    "f64sort": lambda: setattr(row_order, "SORT_KEY", torch.float64),
    "mmaminima": lambda: knng.options(wgmma_minima=False).__enter__(),
    "new": lambda: None,
}


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "new"
    cases = [tuple(int(v) for v in c.split(":")) for c in
             (sys.argv[2] if len(sys.argv) > 2 else "128:10,128:100,128:1024,128:2048,960:10,960:100").split(",")]
    VARIANTS[variant]()
    from oracle import assert_exact_chunked

    dev = torch.device("cuda")
    data = {}
    for d, k in cases:
        if d not in data:
            gen = torch.Generator(device=dev).manual_seed(d)
            data[d] = (torch.randn((1_000_000, d), device=dev, generator=gen),
                       torch.randn((10_000, d), device=dev, generator=gen))
        x, q = data[d]
        res = knng.search(q, x, k)
        rows = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(k))[:256].to(dev)
        try:
            assert_exact_chunked(q, x, [res], "euclidean", rows=rows, device="cuda")
            exact = "exact"
        except AssertionError as exc:
            exact = "NOT EXACT " + str(exc)[:200]
        del res
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            knng.search(q, x, k)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        r = knng.api.last_report()
        peak = torch.cuda.max_memory_allocated() / 2**30
        print(f"{variant:>6} d={d:<4} k={k:<5} min {min(times) * 1e3:7.1f} ms  median {sorted(times)[2] * 1e3:7.1f}"
              f"  peak {peak:5.1f} GiB  ({r.screen_dtype}, pending {r.plan.pending_pairs:,}, screened/row "
              f"{r.screened_per_row['median']:.0f}, evaluated/row {r.evaluations_per_row['median']:.0f}, {exact})", flush=True)


if __name__ == "__main__":
    main()
