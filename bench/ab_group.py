"""A/B of the columns one launch of a kernel-screened graph screens (``plan.GPU_KERNEL_GROUP_COLUMNS``).

One setting per process (fresh allocator and caches), so run the settings alternating, twice,
on one machine, from the repository root (``.carry/pictures.npz``: the pictures saved by
``bench/bench_patches.py --save-images``)::

    for i in 1 2; do for c in 32768 131072 262144; do
        PYTHONPATH=src python bench/ab_group.py $c gauss200k,gauss1M,patches16,patches8 10; done; done

Arguments: COLUMNS [SHAPES [KS [REPEATS [PRECISION [OWN_SEED [PART [PENDING [REBUILD]]]]]]]]; SHAPES also takes ``gaussNxD``
(N Gaussian points of dimension D); PRECISION (e.g. float16; ``auto``: the planner's) overrides
the planner's choice, to compare precisions the same way; OWN_SEED sets ``graph.OWN_PART_SEED``
(0: as it is), PART ``plan.GPU_KERNEL_MAX_PART`` and ``plan.GPU_TRIANGLE_MAX_PART``, PENDING ``plan.PENDING_GPU`` and REBUILD
``store.REBUILD_ENTRIES_GPU``.

Prints, per shape and k, the minimum of ``repeats`` runs, all runs, launches per graph, the
store's counters and a checksum of the answer (every setting must give the same bits).
"""
import hashlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "bench")
import knng  # noqa: E402
import knng.engine.plan as plan  # noqa: E402
from bench_patches import patches  # noqa: E402

columns = int(sys.argv[1])
shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["gauss200k", "gauss1M", "patches16", "patches8"]
ks = [int(v) for v in sys.argv[3].split(",")] if len(sys.argv) > 3 else [10]
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
precision = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "auto" else None  # default: the planner's
own_seed = int(sys.argv[6]) if len(sys.argv) > 6 else 0  # columns seeding a part's own block
part = int(sys.argv[7]) if len(sys.argv) > 7 else 0  # rows of a kernel-screened graph's parts
pending = int(sys.argv[8]) if len(sys.argv) > 8 else 0  # survivors the stores let wait
rebuild = int(sys.argv[9]) if len(sys.argv) > 9 else 0  # entries one store update sorts at a time
plan.GPU_KERNEL_GROUP_COLUMNS = columns
if rebuild:
    import knng.engine.store as store
    store.REBUILD_ENTRIES_GPU = rebuild
if pending:
    plan.PENDING_GPU = pending
if part:
    plan.GPU_KERNEL_MAX_PART = plan.GPU_TRIANGLE_MAX_PART = part
if own_seed:
    import knng.engine.graph as graph
    graph.OWN_PART_SEED = own_seed
if precision:
    knng.options(screen_precision=precision).__enter__()  # for the rest of the process

gen = torch.Generator(device="cuda").manual_seed(0)
makers = {
    "gauss200k": lambda: torch.randn(200_000, 128, device="cuda", generator=gen),
    "gauss1M": lambda: torch.randn(1_000_000, 128, device="cuda", generator=gen),
}
pics = None
for side, stride in ((8, 2), (16, 3)):
    def make(side=side, stride=stride):
        global pics
        pics = pics if pics is not None else dict(np.load(".carry/pictures.npz"))
        return torch.from_numpy(patches(pics, side, stride, 12)).cuda()
    makers[f"patches{side}"] = make
knng.graph(torch.randn(40_000, 64, device="cuda"), 10)  # compile and warm up
for name in shapes:
    if name not in makers:  # gaussNxD: N Gaussian points of dimension D
        n, d = (int(v) for v in name.removeprefix("gauss").split("x"))
        makers[name] = lambda n=n, d=d: torch.randn(n, d, device="cuda", generator=gen)
    x = makers[name]()
    for k in ks:
        ts = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t = time.perf_counter()
            g = knng.graph(x, k)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        r = g.report
        h = hashlib.sha1(torch.as_tensor(g.indices).cpu().numpy().tobytes())
        h.update(torch.as_tensor(g.distances).cpu().numpy().tobytes())
        print(f"cols {columns:7d} {name:9} {tuple(x.shape)} k={k:<4} min {min(ts) * 1e3:8.1f} ms  "
              f"all {[round(v * 1e3, 1) for v in ts]}  {r.plan.screen_precision} parts {r.parts} "
              f"group {r.plan.group_parts} computed {r.blocks_computed} survivors {r.store.survivors} "
              f"exact {r.store.exact_evaluations} sha1 {h.hexdigest()[:12]}", flush=True)
    del x
    torch.cuda.empty_cache()
