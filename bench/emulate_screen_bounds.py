"""How many pairs per row each screen precision's certified bound lets through, on real data.

For a sample of rows of a data set (a graph: every other point is a candidate), this computes
every pair's squared distance in float64 and, for each screen precision, the interval
``d² ± E`` its bound gives (``knng.metrics.Metric.pair_bound``, data centred on the mean as the
engine prepares them). A row keeps the pairs whose lower end is at most its k-th smallest upper
end: the survivors the exact re-rank would have to look at. No screen runs; this is the bound's
price alone, the quantity that decides which precision can pay (docs/BENCHMARKS.md). Every row
is prepared around the one corpus mean: the principal frames of the engine's graphs (each block
around its own centre) shrink the flat-region rows' counts further for the floating-point
precisions, and for per-vector digits, not for one global quantum.

knng's precisions include the digit screen ``int8x4``, whose bound multiplies per-vector
*bound norms* (``docs/EXACTNESS.md``). Besides, the tool emulates digit screens with bounds
the engine does not have: each value split into int8 digits, v ≈ s·(h + l/254) with |h|, |l| ≤ 127, and the integer products
h·h and h·l + l·h (``int8x3``, the dropped l·l/254² bounded by d·s_a·s_b/4) or all four
(``int8x4``). Integer products are exact, so the only error is the digits' own
(|v − s(h + l/254)| ≤ s/508 per value) plus a few float32 roundings when the integer result
is scaled (the bound below carries knng's SAFETY factor like the others), with each vector's
*actual* digit error in the bound. Two ways to choose s: one quantum per side from the largest
|value| ("global"), or one per vector from its own largest |value| ("per vector", as int8x4
does; the engine would carry each vector's error norm as it carries its norm).

Usage::

    PYTHONPATH=src python bench/emulate_screen_bounds.py                 # camera patches, Gaussian
    PYTHONPATH=src python bench/emulate_screen_bounds.py --data x.npy --k 10,100 --rows 400
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from knng.demo import camera_patches
from knng.metrics import PRECISIONS, SAFETY, UNIT_ROUNDOFF_FP32, get_metric

#: Relative time of one product of the precision at an H100's dense tensor-core peak
#: (bfloat16 989 TFLOP/s = 1; TF32 494; int8 1,979 TOP/s; float32 without tensor cores 67).
PEAK_COST = {"float32": 989 / 67, "tf32": 2.0, "tf32x3": 6.0, "bfloat16": 1.0, "int8x4": 2.0,
             "int8x3 global": 1.5, "int8x4 global": 2.0, "int8x3 per vector": 1.5, "int8x4 per vector": 2.0}
BASE, TOP = 254, 127


def _digit_error(x: torch.Tensor, per_vector: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each vector's quantum s and the norm of its digits' error (float64)."""
    scale = x.abs().amax(dim=1) if per_vector else x.abs().max().expand(x.shape[0])
    s = torch.where(scale > 0, scale / TOP, torch.ones_like(scale))[:, None]
    t = x / s
    hi = torch.round(t)
    lo = torch.round((t - hi) * BASE)
    err = (x - s * (hi + lo / BASE)).norm(dim=1)
    return s[:, 0], err


def digit_bound(a: torch.Tensor, b: torch.Tensor, alpha: float, products: int, per_vector: bool) -> torch.Tensor:
    """E_ij of a digit screen on the key α·aᵀb + ‖b‖² (rows a, columns b, float64)."""
    d = a.shape[1]
    s_a, e_a = _digit_error(a, per_vector)
    s_b, e_b = _digit_error(b, per_vector)
    na, nb = a.norm(dim=1)[:, None], b.norm(dim=1)[None, :]
    e_a, e_b, s_a, s_b = e_a[:, None], e_b[None, :], s_a[:, None], s_b[None, :]
    dot = e_a * nb + (na + e_a) * e_b
    if products == 3:
        dot = dot + d * s_a * s_b / 4.0  # the l·l / 254² left out
    half = math.sqrt(d) / 2.0
    rounding = 20 * UNIT_ROUNDOFF_FP32 * (na + half * s_a) * (nb + half * s_b)
    # The same safety factor as knng's own bounds, for a like-for-like comparison.
    return SAFETY * (abs(alpha) * (dot + rounding) + 3 * UNIT_ROUNDOFF_FP32 * nb * nb)


def survivors(x: torch.Tensor, rows: torch.Tensor, k: int) -> dict[str, tuple[float, float, float]]:
    """Per precision: median, 99th percentile and maximum of the pairs a row keeps."""
    metric = get_metric("sqeuclidean")
    x = x - x.mean(dim=0)
    a = x[rows]
    d2 = torch.cdist(a, x) ** 2
    d2[torch.arange(rows.numel()), rows] = torch.inf  # a graph: a point is not its own neighbour
    na, nb = a.norm(dim=1)[:, None], x.norm(dim=1)[None, :]
    bounds = {}
    for name, p in PRECISIONS.items():
        if name == "float64":
            continue
        if p.digits:  # the bound multiplies the norms prepare() gives digit rows (bound norms)
            ra = metric.prepare(a, None, side="corpus", symmetric=True, dtype=p.storage).norms[:, None]
            rb = metric.prepare(x, None, side="corpus", symmetric=True, dtype=p.storage).norms[None, :]
            bounds[name] = metric.pair_bound(x.shape[1], ra, rb, None, nb * nb, precision=p)
        else:
            bounds[name] = metric.pair_bound(x.shape[1], na, nb, None, nb * nb, precision=p)
    for products in (3, 4):
        for per_vector in (False, True):
            label = f"int8x{products} {'per vector' if per_vector else 'global'}"
            bounds[label] = digit_bound(a, x, metric.alpha, products, per_vector)
    out = {}
    for name, e in bounds.items():
        lo, hi = d2 - e, d2 + e
        tau = hi.kthvalue(k, dim=1).values[:, None]
        kept = (lo <= tau).sum(dim=1).to(torch.float64)
        out[name] = (float(kept.median()), float(torch.quantile(kept, 0.99)), float(kept.max()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help=".npy file (default: camera patches and Gaussian data of their shape)")
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--rows", type=int, default=400, help="sampled rows")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.data:
        sets = {args.data: np.load(args.data)}
    else:
        camera = camera_patches(2, None)
        rng = np.random.default_rng(0)
        sets = {"camera 8×8 patches (64,009 × 64)": camera,
                "Gaussian 64,009 × 64": rng.standard_normal(camera.shape),
                "Gaussian 64,009 × 128": rng.standard_normal((camera.shape[0], 128))}
    ks = [int(k) for k in args.k.split(",")]
    for title, data in sets.items():
        x = torch.as_tensor(np.asarray(data), dtype=torch.float64)
        rows = torch.randperm(x.shape[0])[:args.rows]
        results = {k: survivors(x, rows, k) for k in ks}
        print(f"\n{title}, {rows.numel()} rows; pairs kept per row (median / p99 / max)\n")
        print("| precision | relative product cost | " + " | ".join(f"k = {k}" for k in ks) + " |")
        print("|---|---|" + "---|" * len(ks))
        for name in results[ks[0]]:
            cells = " | ".join("{:.0f} / {:.0f} / {:.0f}".format(*results[k][name]) for k in ks)
            print(f"| {name} | {PEAK_COST.get(name, float('nan')):.1f} | {cells} |")


if __name__ == "__main__":
    main()
