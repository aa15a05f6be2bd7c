"""A graph streamed from a file on local disk under a host-memory budget smaller than the file,
against the same graph of the same data held in host memory (issue 13's GPU check).

Writes an (n, d) float32 ``.npy`` of clustered data to ``--dir`` (local disk), measures the disk's
cold sequential read bandwidth, then times, in one process:

* ``in-memory``: ``knng.graph(array in RAM)`` (the file read first, not timed);
* ``streamed``: ``knng.graph(np.load(path, mmap_mode="r"), host_memory_budget=...)`` with the
  file's pages dropped from the page cache first (``posix_fadvise(DONTNEED)``), so that its reads
  come from the disk.

The streamed run's extra time over the in-memory one, against the time its reads alone take at
the measured bandwidth, gives the share of the reading the work hid (the overlap).

Usage::

    PYTHONPATH=src python bench/bench_streamed.py --n 1000000 --d 960 --k 10 --host-memory 1GB --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

import knng
import knng.api


def make_file(path: str, n: int, d: int, seed: int = 0) -> None:
    """Clustered float32 data (1,000 centres, unit noise), written block by block."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    centres = torch.randn(1000, d, device="cuda", generator=gen) * 2
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    for r0 in range(0, n, 65536):
        r1 = min(n, r0 + 65536)
        which = torch.randint(0, 1000, (r1 - r0,), device="cuda", generator=gen)
        out[r0:r1] = (centres[which] + torch.randn(r1 - r0, d, device="cuda", generator=gen)).cpu().numpy()
    out.flush()
    del out


def drop_cache(path: str) -> None:
    """Drop the file's pages from the page cache, so that the next reads come from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_bandwidth(path: str, block: int = 64 << 20) -> float:
    """Cold sequential read bandwidth of the file, bytes per second."""
    drop_cache(path)
    buf = bytearray(block)
    t0 = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                break
            total += got
    return total / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=960)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--host-memory", default="1GB")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    path = os.path.join(args.dir, f"streamed_{args.n}x{args.d}.npy")
    t0 = time.perf_counter()
    if not os.path.exists(path):
        make_file(path, args.n, args.d)
    size = os.path.getsize(path)
    print(f"file {path}: {size / 1e9:.2f} GB ({time.perf_counter() - t0:.1f} s to write)", flush=True)
    bandwidth = read_bandwidth(path)
    print(f"cold sequential read: {bandwidth / 1e9:.2f} GB/s ({size / bandwidth:.2f} s for the file)", flush=True)
    knng.graph(np.load(path, mmap_mode="r")[:20000], args.k)  # warm-up: CUDA context, kernels
    x = np.load(path)
    torch.cuda.synchronize()
    t = time.perf_counter()
    g_mem = knng.graph(x, args.k)
    t_mem = time.perf_counter() - t
    mem_plan = knng.api.last_report().plan
    print(f"in-memory: {t_mem:.2f} s (frames {mem_plan.frames}, parts {mem_plan.parts})", flush=True)
    del x
    drop_cache(path)
    t = time.perf_counter()
    g_str = knng.graph(np.load(path, mmap_mode="r"), args.k, host_memory_budget=args.host_memory)
    t_str = time.perf_counter() - t
    plan = knng.api.last_report().plan
    same = bool(np.array_equal(g_mem.indices, g_str.indices) and np.array_equal(g_mem.distances, g_str.distances))
    reads = 2  # the corpus passes: finite check and centre, then the prepared (sorted) copy
    read_s = reads * size / bandwidth
    hidden = 1 - max(0.0, t_str - t_mem) / read_s
    print(f"streamed (host budget {args.host_memory}, reads of {plan.read_rows:,} rows, lists {plan.lists}): "
          f"{t_str:.2f} s = {t_str / t_mem:.3f}× in-memory; identical: {same}", flush=True)
    print(f"reads: {reads} passes, {reads * size / 1e9:.1f} GB, {read_s:.2f} s at the cold bandwidth; "
          f"{hidden:.0%} of that hidden by the work", flush=True)
    figures = dict(device=torch.cuda.get_device_name(), n=args.n, d=args.d, k=args.k, file_gb=size / 1e9,
                   read_gbps=bandwidth / 1e9, in_memory_s=t_mem, streamed_s=t_str, ratio=t_str / t_mem,
                   identical=same, hidden_share=hidden, host_memory=args.host_memory, read_rows=plan.read_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
