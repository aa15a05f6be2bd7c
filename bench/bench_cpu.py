"""CPU benchmark of ``knng.graph`` against faiss-cpu and scikit-learn, in one process.

The issue's shapes: the 64,009 8×8 ``camera`` patches of ``knng demo`` and Gaussian points
of the same shape, k = 10. faiss-cpu (``IndexFlatL2``, search of X against itself, k + 1) and
scikit-learn (``NearestNeighbors(algorithm="brute")``) are what a user would pick instead;
neither is exact on these data in the sense of ``docs/EXACTNESS.md``.

Usage (from the repository root; faiss-cpu optional)::

    PYTHONPATH=src python bench/bench_cpu.py --out bench-results/cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import numpy as np
import torch

import knng
from knng.demo import camera_patches


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    k = args.k
    camera = camera_patches(2, None).astype(np.float32)
    gauss = np.random.default_rng(0).standard_normal(camera.shape).astype(np.float32)
    rows = []
    for name, x in (("camera patches", camera), ("gaussian", gauss)):
        row = {"data": name, "shape": list(x.shape), "k": k}
        t, g = _timed(lambda: knng.graph(x, k, device="cpu"))
        row["knng_s"] = t
        row["knng_evaluations_per_row"] = g.report.evaluations_per_row
        row["knng_store"] = vars(g.report.store)
        try:
            import faiss

            def run_faiss():
                index = faiss.IndexFlatL2(x.shape[1])
                index.add(x)
                return index.search(x, k + 1)

            row["faiss_cpu_s"], _ = _timed(run_faiss)
        except ImportError:
            row["faiss_cpu_s"] = None
        from sklearn.neighbors import NearestNeighbors

        row["sklearn_brute_s"], _ = _timed(
            lambda: NearestNeighbors(n_neighbors=k, algorithm="brute").fit(x).kneighbors())
        rows.append(row)
        print(f"{name:16s} knng {row['knng_s']:.2f} s  faiss-cpu {row['faiss_cpu_s'] or float('nan'):.2f} s  "
              f"sklearn {row['sklearn_brute_s']:.2f} s  evaluations/row {row['knng_evaluations_per_row']}", flush=True)
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
