"""knng.graph on one GPU with inputs on the host (NumPy) and on the device, 8×8 patches and Gaussian.

Usage (the pictures as for ``bench/bench_patches.py``; a tag names the code under test)::

    PYTHONPATH=src python bench/host_inputs_gpu.py after   # from the repository root
"""
import sys, time, numpy as np, torch, knng
sys.path.insert(0, "bench")
from bench_patches import patches
pics = dict(np.load(sys.argv[2] if len(sys.argv) > 2 else ".carry/pictures.npz"))
x8 = patches(pics, 8, 2, 12)
g8 = np.random.default_rng(0).standard_normal(x8.shape).astype(np.float32)
knng.graph(x8[:20000], 10)
for name, x in (("patches8 numpy", x8), ("gauss numpy", g8), ("patches8 cuda", torch.from_numpy(x8).cuda())):
    for k in (10, 100):
        ts = []
        for _ in range(2):
            torch.cuda.synchronize(); t = time.perf_counter(); g = knng.graph(x, k); torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        r = g.report
        print(f"{sys.argv[1]} {name:15} k={k:<4} {min(ts):.3f} s  all {[round(t, 3) for t in ts]} skipped {r.blocks_skipped} "
              f"saving {r.pairs_saving:.3f} evals {r.store.exact_evaluations}", flush=True)
