"""Real image patches against Gaussian data of the same shape: knng.graph and faiss.knn_gpu.

The issue's GPU check: on 8×8 and 16×16 patches of a dozen scikit-image pictures (float32 in
[0, 1]; flat regions give dense near-ties) ``knng.graph`` should cost about what it costs on
Gaussian points of the same shape, and beat ``faiss.knn_gpu`` (a search of X against itself
with k + 1, FAISS's usual way to a k-NN graph) on the same patches. Every library runs in this
process on the same device; the exact evaluations per row show what the proof needed.

Usage (GPU machine without scikit-image: save the pictures here first)::

    python bench/bench_patches.py --save-images .carry/pictures.npz        # here, needs scikit-image
    PYTHONPATH=src:tests python bench/bench_patches.py --images .carry/pictures.npz --out patches.json
    PYTHONPATH=src:tests python bench/bench_patches.py --images .carry/pictures.npz --pixels both --no-gaussian

``--pixels uint8`` hands knng the grey levels themselves (integers: exact products), ``both``
runs each picture's patches both ways; FAISS gets float32 copies of the same values.

Every knng graph is checked against the float64 oracle (``tests/oracle.py``, hence ``tests`` on
the path) on 256 random rows and 64 rows of flat patches.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import time

import numpy as np
import torch

import knng

PICTURES = ("astronaut", "brick", "camera", "cat", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
            "moon", "page", "rocket", "text")
#: (patch side, stride, pictures used): about 600k × 64 and 260k × 256 on the pictures above.
SHAPES = ((8, 2, 12), (16, 3, 12))


def save_pictures(path: str) -> None:
    """The grey-level pictures as uint8 arrays in one .npz (for machines without scikit-image)."""
    from skimage import color, data, img_as_ubyte

    arrays = {}
    for name in PICTURES:
        img = getattr(data, name)()
        if img.ndim == 3:
            img = color.rgb2gray(img[..., :3])
        arrays[name] = img_as_ubyte(img)
    np.savez_compressed(path, **arrays)


def patches(pictures: dict[str, np.ndarray], side: int, stride: int, count: int, pixels: str = "unit") -> np.ndarray:
    """Every side × side patch at ``stride`` of the first ``count`` pictures: float32 in [0, 1]
    (``pixels="unit"``, the grey levels divided by 255) or the uint8 grey levels themselves
    (``"uint8"``, which knng screens with exact products: ``knng.metrics.with_exact_products``)."""
    from numpy.lib.stride_tricks import sliding_window_view

    out = []
    for name in PICTURES[:count]:
        img = pictures[name] if pixels == "uint8" else pictures[name].astype(np.float32) / 255.0
        windows = sliding_window_view(img, (side, side))[::stride, ::stride]
        out.append(windows.reshape(-1, side * side))
    return np.ascontiguousarray(np.concatenate(out))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn, repeats: int) -> tuple[float, object]:
    out = fn()
    _sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def check_exact(x: torch.Tensor, g: "knng.Graph", seed: int) -> bool | None:
    """The graph against the float64 oracle by differences (``tests/oracle.py``, on the PYTHONPATH)
    on 256 random rows and 64 rows of flat patches (every value equal: the near-ties that cost
    most); None where the oracle is not importable."""
    try:
        from oracle import assert_exact_chunked
    except ImportError:
        return None
    gen = torch.Generator().manual_seed(seed)
    flat = torch.nonzero(x.std(dim=1).cpu() == 0)[:, 0]
    rows = torch.cat([torch.randperm(x.shape[0], generator=gen)[:256],
                      flat[torch.randperm(flat.numel(), generator=gen)[:64]]]).unique()
    try:
        assert_exact_chunked(x, x, [g], "euclidean", exclude_self=True, rows=rows, device=x.device)
        return True
    except AssertionError as exc:
        print("NOT EXACT:", str(exc)[:300], flush=True)
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", help=".npz written by --save-images (else scikit-image is used)")
    parser.add_argument("--save-images", help="write the pictures to this .npz and stop")
    parser.add_argument("--ks", default="10,100")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--pixels", choices=("unit", "uint8", "both"), default="unit",
                        help="patches as float32 grey levels / 255 (unit), as uint8 grey levels, or both")
    parser.add_argument("--no-gaussian", action="store_true", help="skip the Gaussian twins")
    parser.add_argument("--sides", default="8,16", help="patch sides to run (8, 16)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.save_images:
        save_pictures(args.save_images)
        return
    if args.images:
        pictures = dict(np.load(args.images))
    else:
        save_pictures("/tmp/knng-pictures.npz")
        pictures = dict(np.load("/tmp/knng-pictures.npz"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        import faiss
        import faiss.contrib.torch_utils  # noqa: F401  (torch tensors in, torch tensors out)
        res = faiss.StandardGpuResources() if device.type == "cuda" else None
    except ImportError:
        faiss = res = None
    rows = []
    sides = {int(v) for v in args.sides.split(",")}
    for side, stride, count in (shape for shape in SHAPES if shape[0] in sides):
        datasets = []
        for pixels in ("unit", "uint8"):
            if args.pixels in (pixels, "both"):
                label = f"{side}×{side} patches" + (" (uint8)" if pixels == "uint8" else "")
                datasets.append((label, patches(pictures, side, stride, count, pixels)))
        if not args.no_gaussian:
            shape = datasets[0][1].shape
            datasets.append(("gaussian", np.random.default_rng(0).standard_normal(shape).astype(np.float32)))
        for label, x_np in datasets:
            if device.type == "cuda":
                # Each dataset from an empty allocator cache, as in a fresh process (see main's note).
                gc.collect()
                torch.cuda.empty_cache()
            x = torch.from_numpy(x_np).to(device)
            xf = x if x.is_floating_point() else x.float()  # FAISS takes float32: the same values
            for k in (int(v) for v in args.ks.split(",")):
                row = {"data": label, "shape": list(x.shape), "k": k}
                row["knng_s"], g = _time(lambda: knng.graph(x, k), args.repeats)
                row["evaluations_per_row"] = g.report.evaluations_per_row
                row["screened_per_row"] = g.report.screened_per_row
                row["exact_products"] = getattr(g.report, "exact_products", False)
                row["duplicates_folded"] = getattr(g.report, "duplicates_folded", 0)
                row["exact"] = check_exact(xf, g, seed=k)
                row["plan"] = g.report.plan.as_dict()
                if res is not None:
                    row["faiss_s"], (_, fi) = _time(lambda: faiss.knn_gpu(res, xf, xf, k + 1), args.repeats)
                    # FAISS's graph: drop each point's own index where it appears, else the last.
                    fi = fi.cpu().numpy()
                    own = fi == np.arange(len(fi))[:, None]
                    keep = np.where(own.any(1, keepdims=True), ~own, np.arange(k + 1) < k)
                    fi = fi[keep].reshape(len(fi), k)
                    ours = g.indices.cpu().numpy()
                    row["faiss_recall"] = float(np.mean([len(set(a) & set(b)) for a, b in zip(fi, ours)]) / k)
                rows.append(row)
                print(f"{label:16s} {x.shape[0]:>7,} × {x.shape[1]:<3} k={k:<4} knng {row['knng_s']:.3f} s  "
                      f"faiss {row.get('faiss_s', float('nan')):.3f} s  faiss recall {row.get('faiss_recall', 0):.4f}  "
                      f"evaluations/row {g.report.evaluations_per_row}  screened/row {row['screened_per_row']}  "
                      f"exact products {row['exact_products']}  folded {row['duplicates_folded']:,}  "
                      f"exact {row['exact']}", flush=True)
            del x, xf
    meta = {"date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "faiss": getattr(faiss, "__version__", None), "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
