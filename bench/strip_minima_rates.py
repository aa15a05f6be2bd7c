"""The seeds' strip minima (``fused.strip_minima``) by ``cuda/screen.cu``'s mma.sync kernel and by
``cuda/screen_wg.cu``'s wgmma kernel (the ``wgmma_minima`` option), alternating in one process,
CUDA-event median of 9, and whether the two agree bit for bit. Shapes: a rows-method graph's
chunk at k = 100 against its 65,536-column sample, a graph part's own seeds, a search's 10k
queries. Usage (Hopper GPU machine)::

    PYTHONPATH=src python bench/strip_minima_rates.py
"""
import statistics, torch
import knng
from knng.engine import fused
from knng.metrics import get_metric
g = torch.Generator(device="cuda").manual_seed(0)
for m, n in ((50000, 65536), (32768, 8192), (10000, 65536)):
    x = torch.randn((m, 128), device="cuda", generator=g, dtype=torch.float64)
    y = torch.randn((n, 128), device="cuda", generator=g, dtype=torch.float64)
    metric = get_metric("sqeuclidean")
    pa = metric.prepare(x, None, side="corpus", symmetric=True, dtype=torch.float16)
    pb = metric.prepare(y, None, side="corpus", symmetric=True, dtype=torch.float16)
    rt, ct = pa.terms.float().contiguous(), pb.terms.float().contiguous()
    res = {}
    for _ in range(2):
        for wg in (False, True):
            with knng.options(wgmma_minima=wg):
                fused.strip_minima(pa.vectors, pb.vectors, 128, rt, ct, "float16")
    torch.cuda.synchronize()
    times = {False: [], True: []}
    for _ in range(9):
        for wg in (False, True):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with knng.options(wgmma_minima=wg):
                e0.record(); out = fused.strip_minima(pa.vectors, pb.vectors, 128, rt, ct, "float16"); e1.record(); e1.synchronize()
            times[wg].append(e0.elapsed_time(e1)); res[wg] = out
    same = torch.equal(res[False][0], res[True][0]) and torch.equal(res[False][1], res[True][1])
    fl = 2 * m * n * 128
    print(f"strip minima {m} x {n}: mma.sync {statistics.median(times[False]):.3f} ms ({fl/statistics.median(times[False])/1e9:.0f} TFLOP/s), wgmma {statistics.median(times[True]):.3f} ms ({fl/statistics.median(times[True])/1e9:.0f} TFLOP/s), same {same}")
