"""Kernels compiled during repeated graph calls: whether a call after a workload's first still pays
for a compile (Triton specialises a kernel on its integer arguments' divisibility by 16; CuPy
compiles each variant of the CUDA C screens once).

Empty Triton and CuPy caches (temporary folders) for the process; each call is timed and the
caches' new entries counted (Triton's ``.cubin`` files, CuPy's cache files). A workload is
``NAME:K:CALLS`` with ``gN`` N thousand Gaussian points in 128 dimensions or ``p8``/``p16``
image patches (``.carry/pictures.npz``, ``bench/bench_patches.py``); ``NAME:K:CALLS:fresh``
draws new Gaussian points for every call (the sizes that follow the data change, as between a
user's calls on different data). Usage (GPU machine,
repository root)::

    PYTHONPATH=src:tests python bench/jit_compiles.py g200k:10:4 g150k:10:3 g200k:100:3 p16:10:3

H200, 2026-11-27 (``docs/BENCHMARKS.md``, eleventh session): nothing was compiled after a
workload's first call; the first call on empty caches took 22 s (15 Triton and 4 CuPy kernels).
"""

import os
import sys
import tempfile
import time

TRITON_CACHE = tempfile.mkdtemp(prefix="knng-triton-")
CUPY_CACHE = tempfile.mkdtemp(prefix="knng-cupy-")
os.environ["TRITON_CACHE_DIR"] = TRITON_CACHE  # before Triton or CuPy read them
os.environ["CUPY_CACHE_DIR"] = CUPY_CACHE

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, "bench")
import knng  # noqa: E402
from bench_patches import patches  # noqa: E402


def cached() -> tuple[int, int]:
    """Compiled kernels in the two caches: Triton's cubins, CuPy's files."""
    triton = sum(1 for _, _, files in os.walk(TRITON_CACHE) for f in files if f.endswith(".cubin"))
    cupy = sum(len(files) for _, _, files in os.walk(CUPY_CACHE))
    return triton, cupy


def data(name: str, seed: int = 0) -> torch.Tensor:
    if name in ("p8", "p16"):
        side, stride = (8, 2) if name == "p8" else (16, 3)
        return torch.from_numpy(patches(dict(np.load(".carry/pictures.npz")), side, stride, 12)).cuda()
    thousands = int(name[1:].rstrip("k"))
    gen = torch.Generator(device="cuda").manual_seed(thousands + 1000 * seed)
    return torch.randn((thousands * 1000, 128), device="cuda", generator=gen)


def main() -> None:
    for spec in sys.argv[1:]:
        name, k, calls, *fresh = spec.split(":")
        x = data(name)
        line = []
        for call in range(int(calls)):
            if fresh and call:
                x = data(name, call)
            before = cached()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            knng.graph(x, int(k))
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            after = cached()
            line.append(f"{ms:.1f} ms (+{after[0] - before[0]} Triton, +{after[1] - before[1]} CuPy)")
        print(f"{spec}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
