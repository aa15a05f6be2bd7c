"""A/B of folding identical rows (``knng.options(fold_duplicates=...)``) on image patches, one process.

The 8×8 patches (stride 2) of scikit-image's astronaut and camera pictures, 128,018 × 64, whose
astronaut part holds 4,561 identical patches: ``knng.graph`` with folding off and on,
alternating, each call timed; the first round checks 150 random rows and 50 rows of the
largest flat group against the float64 oracle by differences (``tests/oracle.py``). From the
repository root, after ``bench/bench_patches.py --save-images .carry/pictures.npz``::

    PYTHONPATH=src python bench/fold_duplicates_cpu.py K [ROUNDS]
"""
import sys
import time

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

import knng
from knng.api import last_report

sys.path.insert(0, "tests")
from oracle import assert_exact_chunked  # noqa: E402


def main() -> None:
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    pictures = dict(np.load(".carry/pictures.npz"))
    x = np.ascontiguousarray(np.concatenate([
        sliding_window_view(pictures[name].astype(np.float32) / 255.0, (8, 8))[::2, ::2].reshape(-1, 64)
        for name in ("astronaut", "camera")]))
    _, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    print(x.shape, "largest group of identical rows", counts.max())
    times: dict[bool, list[float]] = {}
    for round_ in range(rounds):
        for fold in (False, True):
            t0 = time.perf_counter()
            with knng.options(fold_duplicates=fold):
                g = knng.graph(x, k)
            times.setdefault(fold, []).append(time.perf_counter() - t0)
            r = last_report()
            print(f"fold={fold} {times[fold][-1]:.2f} s, rows folded {r.duplicates_folded}, exact evaluations per row "
                  f"{r.evaluations_per_row}, in all {r.exact.exact_evaluations:,}", flush=True)
            if round_ == 0:
                rows = np.r_[np.random.default_rng(1).choice(x.shape[0], 150, replace=False),
                             np.flatnonzero(inverse == np.argmax(counts))[:50]]
                assert_exact_chunked(torch.from_numpy(x), torch.from_numpy(x), [g], "euclidean", exclude_self=True,
                                     rows=torch.from_numpy(rows))
    print({fold: [round(t, 2) for t in ts] for fold, ts in times.items()})


if __name__ == "__main__":
    main()
