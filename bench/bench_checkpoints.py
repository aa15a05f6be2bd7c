"""What checkpoints cost: ``knng.graph`` / ``knng.search`` with and without a checkpoint folder.

Runs each configuration alternately in one process (min of ``--repeats``) and prints the
wall time, the checkpoints saved and the seconds spent saving them. The interval of 0 saves
after every step (the tests' setting); the default (60 s) saves once at the start of a run
this short; 1 s shows the cost per save on a run of a few seconds.

Usage (from the repository root)::

    PYTHONPATH=src python bench/bench_checkpoints.py --device cpu --out bench-results/checkpoints.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import knng


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, default=64009)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal((args.n, args.d)).astype(np.float32)
    queries = x[:10000] + 0.01
    work = Path(tempfile.mkdtemp(prefix="knng-ckpt-"))
    rows = []
    try:
        for op in ("graph", "search"):
            for interval in (None, 60.0, 1.0, 0.0):
                best = None
                for _ in range(args.repeats):
                    folder = work / "ck"
                    shutil.rmtree(folder, ignore_errors=True)
                    options = {} if interval is None else {"checkpoint": folder, "checkpoint_interval": interval}
                    t0 = time.perf_counter()
                    if op == "graph":
                        result = knng.graph(x, args.k, device=args.device, **options)
                    else:
                        result = knng.search(queries, x, args.k, device=args.device, **options)
                    seconds = time.perf_counter() - t0
                    if best is None or seconds < best[0]:
                        best = (seconds, dict(result.report.checkpoints))
                saved = {f"checkpoint_{key}": value for key, value in best[1].items()}
                row = {"operation": op, "interval_s": interval, "seconds": best[0], **saved}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "device": args.device,
                                              "shape": [args.n, args.d], "k": args.k, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
