"""Diffusion maps end to end: knng's DiffusionMap at scale, and the peers at a size they handle.

Two parts, in one process:

1. **knng at scale** — ``DiffusionMap(n_components=M, n_neighbors=K)`` on ``n`` points (default
   1M, K = 32, M = 10) on the chosen device, timed as a whole and split into the report's
   stages: exact k-NN graph, kernel (ε "auto", α = 1, connectivity check), eigensolver.
2. **the same task, smaller** (``--compare-n``, default 20 000): knng on the device and on the
   CPU, scikit-learn's ``SpectralEmbedding`` (``affinity="nearest_neighbors"``, the same K and M,
   ARPACK) on the CPU, and pydiffmap (k = K, ε "bgh", α = 1) when it is installed. Each
   peer's wall time is for ``fit_transform`` from the raw points.

The data: ``n`` points of a smooth 3-dimensional manifold in ``d`` dimensions (default 64),
random Fourier features ``cos(W u + b)`` of u uniform in [0, 1]³, plus a little Gaussian noise;
the same generator and seed for every part. A GPU run first embeds 2 000 points to warm up.

Times: ``harness.time_call``, one call each (CUDA events on a GPU, the host clock on a CPU).

Usage::

    PYTHONPATH=src:tests python bench/bench_diffusion.py --out diffusion.json    # 1M, k=32, 10 components
    PYTHONPATH=src:tests python bench/bench_diffusion.py --quick                 # 2,000 and 1,000 points: a smoke run

Prints a markdown table and writes the figures as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import knng  # noqa: E402
from knng.manifold import DiffusionMap  # noqa: E402


def manifold_data(n: int, d: int, seed: int = 0, noise: float = 0.01) -> np.ndarray:
    """n points of a 3-D manifold in d dimensions (random Fourier features), float32."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0.0, 2.0, (3, d))
    phases = rng.uniform(0.0, 2 * np.pi, d)
    out = np.empty((n, d), dtype=np.float32)
    for r0 in range(0, n, 1 << 18):  # in blocks: 1M × 64 float64 intermediates would be 0.5 GB
        u = rng.uniform(size=(min(n, r0 + (1 << 18)) - r0, 3))
        out[r0:r0 + len(u)] = np.cos(u @ weights + phases) + rng.normal(0.0, noise, (len(u), d))
    return out


def knng_run(x: np.ndarray, k: int, m: int, device: str, solver: str) -> dict[str, Any]:
    """One DiffusionMap fit, timed whole and by the report's stages."""
    timing = harness.time_call(lambda: DiffusionMap(n_components=m, n_neighbors=k, device=device,
                                                    eigen_solver=solver).fit(x), device=device, warmup=0, repeats=1)
    dm, wall = timing.result, timing.min
    r = dm.report_
    return {"library": f"knng ({device})", "n": len(x), "seconds": wall, "stages": dict(r.seconds),
            "solver": r.solver, "epsilon": r.epsilon, "eigenvalues": r.eigenvalues, "max_residual": max(r.residuals),
            "matvecs": r.matvecs, "restarts": r.restarts, "spectral_gap": r.spectral_gap, "eigengap": r.eigengap,
            "kernel_entries": r.kernel_entries}


def timed_peer(name: str, fit: Callable[[], Any], n: int) -> dict[str, Any]:
    try:
        timing = harness.time_call(fit, device="cpu", warmup=0, repeats=1)
    except Exception as exc:  # a peer that fails is reported, not fatal
        return {"library": name, "n": n, "seconds": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"library": name, "n": n, "seconds": timing.min}


def sklearn_run(x: np.ndarray, k: int, m: int) -> dict[str, Any]:
    from sklearn.manifold import SpectralEmbedding

    model = SpectralEmbedding(n_components=m, affinity="nearest_neighbors", n_neighbors=k, eigen_solver="arpack",
                              random_state=0, n_jobs=-1)
    return timed_peer("scikit-learn SpectralEmbedding (CPU)", lambda: model.fit_transform(x), len(x))


def pydiffmap_run(x: np.ndarray, k: int, m: int) -> dict[str, Any] | None:
    try:
        from pydiffmap import diffusion_map
    except ImportError:
        return None
    model = diffusion_map.DiffusionMap.from_sklearn(n_evecs=m, k=k, epsilon="bgh", alpha=1.0)
    return timed_peer("pydiffmap (CPU)", lambda: model.fit_transform(x.astype(np.float64)), len(x))


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| library | n | total (s) | graph (s) | kernel (s) | eigensolver (s) | solver | max residual |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st = r.get("stages", {})
        total = "failed: " + r["error"][:60] if r.get("seconds") is None else f"{r['seconds']:.2f}"
        cells = [r["library"], f"{r['n']:,}", total] + [f"{st[s]:.2f}" if s in st else "" for s in
                                                        ("graph", "kernel", "eigensolver")]
        cells += [r.get("solver", ""), f"{r['max_residual']:.1e}" if "max_residual" in r else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="points of the large run (default 1,000,000)")
    ap.add_argument("--d", type=int, default=64, help="dimension of the data (default 64)")
    ap.add_argument("--k", type=int, default=32, help="neighbours (default 32)")
    ap.add_argument("--components", type=int, default=10, help="coordinates (default 10)")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda (default auto)")
    ap.add_argument("--eigen-solver", default="auto", choices=("auto", "scipy", "torch"))
    ap.add_argument("--compare-n", type=int, default=20_000,
                    help="size of the comparison with the CPU peers (default 20,000; 0 skips it)")
    ap.add_argument("--quick", action="store_true", help="2,000 points and a comparison at 1,000: a smoke run")
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default torch's; 1 with --quick)")
    ap.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = ap.parse_args()
    if args.quick:
        args.n, args.compare_n = 2000, 1000
    harness.apply_threads(args)
    device = str(harness.resolve_device(args.device))
    info = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
            "torch": torch.__version__, "knng": knng.__version__, "threads": torch.get_num_threads(),
            "date": datetime.date.today().isoformat(), "args": vars(args)}
    print(f"# diffusion maps: n={args.n:,}, d={args.d}, k={args.k}, {args.components} components on {info['device']}")
    if device.startswith("cuda"):
        knng_run(manifold_data(2000, args.d, seed=1), args.k, args.components, device, args.eigen_solver)

    rows = [knng_run(manifold_data(args.n, args.d), args.k, args.components, device, args.eigen_solver)]
    print(table(rows), flush=True)
    if args.compare_n:
        x = manifold_data(args.compare_n, args.d)
        rows.append(knng_run(x, args.k, args.components, device, args.eigen_solver))
        if device != "cpu":
            rows.append(knng_run(x, args.k, args.components, "cpu", "scipy"))
        rows.append(sklearn_run(x, args.k, args.components))
        peer = pydiffmap_run(x, args.k, args.components)
        if peer is not None:
            rows.append(peer)
    print()
    print(table(rows))
    harness.write_json(args.out, {"info": info, "results": rows})


if __name__ == "__main__":
    main()
