"""A/B of ``knng.graph`` on one GPU: the patches of ``bench/bench_patches.py`` and their Gaussian twins.

Whichever knng is on PYTHONPATH; min of the repeats per shape and k, the store's counters, and
on request a checksum of every answer (old and new code must agree bit for bit), the host
synchronisations by source line (``torch.cuda.set_sync_debug_mode``) and the kernel time and
launches of one more run (``torch.profiler``). Run each version twice, alternating, in one
session on one machine, from the repository root (``.carry/pictures.npz``: the pictures saved by
``bench_patches.py --save-images``)::

    # TAG OUTDIR [shapes] [ks] [repeats] [checksum 0/1] [syncs 0/1] [profile 0/1]
    for i in 1 2; do PYTHONPATH=old/src python bench/ab_patches.py old out patches8,gauss8,patches16,gauss16 10,100 2
                     PYTHONPATH=src python bench/ab_patches.py new out patches8,gauss8,patches16,gauss16 10,100 2 1; done

This is the script of the A/B in ``docs/BENCHMARKS.md`` ("GPU graph: host-side work per block"),
as it ran there.
"""
import sys, os, time, json, hashlib, warnings, collections, numpy as np, torch
sys.path.insert(0, "bench")
import knng
from bench_patches import patches
tag, out_dir = sys.argv[1], sys.argv[2]
shapes = sys.argv[3].split(",") if len(sys.argv) > 3 else ["patches8", "gauss8", "patches16", "gauss16"]
ks = [int(v) for v in sys.argv[4].split(",")] if len(sys.argv) > 4 else [10, 100]
repeats = int(sys.argv[5]) if len(sys.argv) > 5 else 2
do_hash = len(sys.argv) > 6 and sys.argv[6] == "1"
do_syncs = len(sys.argv) > 7 and sys.argv[7] == "1"
do_prof = len(sys.argv) > 8 and sys.argv[8] == "1"
pics = dict(np.load(".carry/pictures.npz"))
data = {}
for side, stride in ((8, 2), (16, 3)):
    real = patches(pics, side, stride, 12)
    data[f"patches{side}"] = real
    data[f"gauss{side}"] = np.random.default_rng(0).standard_normal(real.shape).astype(np.float32)
data = {k: torch.from_numpy(v).cuda() for k, v in data.items() if k in shapes}
first = data[shapes[0]]
t0 = time.perf_counter(); knng.graph(first, max(ks)); torch.cuda.synchronize()
print(f"{tag:6} warm-up {time.perf_counter() - t0:.2f} s  ({knng.__file__})", flush=True)
res = []
for name in shapes:
    x = data[name]
    for k in ks:
        ts = []
        for _ in range(repeats):
            torch.cuda.synchronize(); t = time.perf_counter(); g = knng.graph(x, k); torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        r = g.report
        row = dict(tag=tag, shape=name, k=k, min=min(ts), all=ts, store=[r.store.survivors, r.store.tightenings,
                   r.store.exact_evaluations, r.store.overflow_rows], skipped=r.blocks_skipped)
        if do_hash:
            h = hashlib.sha1(g.indices.cpu().numpy().tobytes()); h.update(g.distances.cpu().numpy().tobytes())
            row["sha1"] = h.hexdigest()[:16]
        if do_syncs:
            torch.cuda.set_sync_debug_mode(1)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                knng.graph(x, k); torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode(0)
            cnt = collections.Counter((os.path.basename(v.filename), v.lineno) for v in w if "synchroniz" in str(v.message))
            row["syncs"] = sum(cnt.values()); row["sync_top"] = cnt.most_common(12)
        if do_prof:
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                knng.graph(x, k); torch.cuda.synchronize()
            ka = prof.key_averages()
            table = ka.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=55)
            with open(os.path.join(out_dir, f"prof-{tag}-{name}-{k}.txt"), "w") as f:
                f.write(table)
            row["kernel_s"] = [l for l in table.splitlines() if "Self CUDA time total" in l]
            row["launches"] = sum(e.count for e in ka if "LaunchKernel" in e.key)
            row["stream_syncs"] = sum(e.count for e in ka if "StreamSynchronize" in e.key)
            print(f"       {name} k={k} profiler: {row['kernel_s']} launches {row['launches']} syncs {row['stream_syncs']}", flush=True)
        res.append(row)
        print(f"{tag:6} {name:9} k={k:<4} min {min(ts):.3f} s  all {[round(v, 3) for v in ts]}  store {row['store']}"
              + (f"  sha1 {row['sha1']}" if do_hash else "") + (f"  syncs {row['syncs']}" if do_syncs else ""), flush=True)
with open(os.path.join(out_dir, f"ab-{tag}.json"), "a") as f:
    f.write(json.dumps(res) + "\n")
