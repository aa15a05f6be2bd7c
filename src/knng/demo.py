"""``knng demo``: exact k-NN graphs of two built-in real data sets, checked against an oracle.

The demo needs no files and no network:

1. **digits** — scikit-learn's 1 797 handwritten digits (8×8 images, values 0..16), float32;
2. **camera patches** — every 8×8 patch (stride 2, or 4 with ``quick``) of scikit-image's
   ``camera`` photograph as raw, uncentred intensities in [0, 1] (float32, as
   ``skimage.img_as_float32`` gives them): ~64 000 vectors that sit far from the origin
   compared with the distances between neighbours, the case where the usual float32
   distance expansion goes wrong.

   Why float32 in [0, 1] and not the uint8 bytes: for uint8 data in 64 dimensions every
   quantity of the expansion (‖x‖² ≤ 64·255², xᵀy, their sums) is an integer below 2²⁴,
   so float32 computes it *exactly* and there would be nothing to show.

For each it builds the exact k = 10 graph with :func:`knng.graph`, times it, and checks it
against an independent oracle: float64 Euclidean distances computed *by differences* (never by
the ‖x‖² + ‖y‖² − 2xᵀy expansion) on the CPU, each point excluded from its own list by index,
the k smallest taken with ties going to the smaller index. Then it shows what the plain float32
expansion (what a straightforward GPU implementation computes) gets wrong on the same data.
"""

from __future__ import annotations

import builtins
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import knng
from knng.engine.common import resolve_device

__all__ = ["run_demo"]

K = 10
#: Relative tolerance under which two oracle distances count as tied.
TIE_RTOL = 1e-12
#: Rows checked against the oracle when checking them all would take too long.
DEFAULT_SAMPLE_ROWS = 2000
#: Rows of the float32-expansion contrast on a CPU (a random sample when there are more points).
CONTRAST_ALL_ROWS = 8192
#: Rows per oracle chunk: a (chunk × n) float64 distance block (~130 MB for n = 64 000).
ORACLE_CHUNK = 256


# --------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------


def _digits() -> np.ndarray:
    from sklearn.datasets import load_digits

    # Values 0..16 stored as float64; float32 holds them exactly.
    return np.ascontiguousarray(load_digits().data.astype(np.float32))


def camera_patches(stride: int, max_points: int | None) -> np.ndarray:
    """Every 8×8 patch of ``skimage.data.camera()`` at ``stride``: float32 rows of 64 in [0, 1]."""
    from skimage import data, img_as_float32  # ImportError without scikit-image: caller handles it
    from numpy.lib.stride_tricks import sliding_window_view

    image = img_as_float32(data.camera())  # 512×512, uint8 / 255
    windows = sliding_window_view(image, (8, 8))[::stride, ::stride]
    patches = np.ascontiguousarray(windows.reshape(-1, 64))
    if max_points is not None and max_points < len(patches):
        patches = np.ascontiguousarray(patches[:max_points])
    return patches


# --------------------------------------------------------------------------------------
# The oracle: float64 distances by differences, ties by the smaller index
# --------------------------------------------------------------------------------------


def _oracle_block(x64: torch.Tensor, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Oracle neighbours of ``rows``: returns (distance block, indices (m, k), distances (m, k)).

    ``torch.cdist`` with ``donot_use_mm_for_euclid_dist`` computes sqrt(Σ (x − y)²) directly
    in float64 (no matrix-product expansion). The k smallest with ties to the smaller index
    are what a stable sort of each row (columns in index order) gives; to avoid sorting all
    n columns, the rows whose values ≤ the k-th smallest fit in ``k + 32`` candidates are
    ordered within those candidates (by index, then stably by value), and only rows with
    more ties than that get the full stable sort.
    """
    dist = torch.cdist(x64[rows], x64, compute_mode="donot_use_mm_for_euclid_dist")
    m, n = dist.shape
    local = torch.arange(m)
    dist[local, rows] = math.inf  # exclude each point from its own list, by index
    k2 = min(n, k + 32)
    cand_v, cand_i = torch.topk(dist, k2, dim=1, largest=False, sorted=False)
    kth = torch.topk(dist, k, dim=1, largest=False).values[:, -1]
    fits = (dist <= kth[:, None]).sum(dim=1) <= k2
    # Stable lexicographic (value, index) order within the candidates.
    order = torch.argsort(cand_i, dim=1)
    cand_i, cand_v = cand_i.gather(1, order), cand_v.gather(1, order)
    cand_v, order = torch.sort(cand_v, dim=1, stable=True)
    idx, val = cand_i.gather(1, order)[:, :k], cand_v[:, :k]
    for r in torch.nonzero(~fits).flatten().tolist():
        sorted_v, sorted_i = torch.sort(dist[r], stable=True)
        idx[r], val[r] = sorted_i[:k], sorted_v[:k]
    return dist, idx, val


def _check_rows(dist: torch.Tensor, rows: torch.Tensor, ours: torch.Tensor, o_idx: torch.Tensor,
                o_val: torch.Tensor) -> tuple[int, int]:
    """Compare knng's rows with the oracle's: (rows identical, rows that differ only by ties)."""
    same = (ours == o_idx).all(dim=1)
    ties = 0
    for r in torch.nonzero(~same).flatten().tolist():
        mine = ours[r]
        if mine.unique().numel() != mine.numel() or bool((mine == rows[r]).any()):
            continue  # a repeated neighbour or the point itself: wrong
        # Oracle distances of knng's neighbours (the point itself was set to inf above).
        d_mine = dist[r, mine]
        if not bool((d_mine[1:] >= d_mine[:-1] * (1 - TIE_RTOL)).all()):
            continue  # not in ascending order
        ref = o_val[r]
        if bool((torch.sort(d_mine).values - ref).abs().le(TIE_RTOL * ref.abs().clamp_min(1e-300)).all()):
            ties += 1
    return int(same.sum()), ties


def _verify(x: np.ndarray, graph_idx: np.ndarray, graph_dist: np.ndarray, k: int, *, budget_s: float,
            sample_rows: int, rng: np.random.Generator) -> dict[str, Any]:
    """Check knng's graph against the oracle: every row if that fits ``budget_s``, else a sample."""
    start = time.perf_counter()
    x64 = torch.from_numpy(x).to(torch.float64)
    ours = torch.from_numpy(np.asarray(graph_idx, dtype=np.int64))
    n = len(x)
    exact = ties = 0
    max_rel = 0.0
    plan = torch.arange(n)
    sampled = False
    done = 0
    while done < len(plan):
        rows = plan[done : done + ORACLE_CHUNK]
        t0 = time.perf_counter()
        dist, o_idx, o_val = _oracle_block(x64, rows, k)
        e, t = _check_rows(dist, rows, ours[rows], o_idx, o_val)
        exact, ties = exact + e, ties + t
        # Distances: knng returns the float64 distances rounded to float32.
        ref = o_val.to(torch.float32).to(torch.float64)
        got = torch.from_numpy(np.asarray(graph_dist[rows.numpy()], dtype=np.float64))
        max_rel = max(max_rel, float(((got - ref).abs() / ref.abs().clamp_min(1e-30)).max()))
        done += len(rows)
        if not sampled and done == len(rows) and len(plan) > sample_rows:
            projected = (time.perf_counter() - t0) * len(plan) / len(rows)
            if projected > budget_s:
                # Too slow to check every row here: start over on a random sample.
                plan = torch.from_numpy(np.sort(rng.choice(n, size=sample_rows, replace=False)))
                sampled, done, exact, ties, max_rel = True, 0, 0, 0, 0.0
    return {
        "checked_rows": int(len(plan)),
        "sampled": sampled,
        "exact_rows": exact,
        "tie_rows": ties,
        "distance_max_rel_error": max_rel,
        "seconds": time.perf_counter() - start,
    }


# --------------------------------------------------------------------------------------
# The plain float32 expansion, for contrast
# --------------------------------------------------------------------------------------


def _exact_row_distances(x64: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor, chunk: int = 4096
                         ) -> torch.Tensor:
    """float64 distances, by differences, from each point rows[i] to the points idx[i, :]."""
    out = torch.empty(idx.shape, dtype=torch.float64)
    for c0 in range(0, len(idx), chunk):
        c1 = min(len(idx), c0 + chunk)
        diff = x64[idx[c0:c1]] - x64[rows[c0:c1], None, :]
        out[c0:c1] = diff.square().sum(dim=-1).sqrt()
    return out


def _fp32_expansion(x: np.ndarray, graph_idx: np.ndarray, k: int, device: torch.device,
                    rng: np.random.Generator) -> dict[str, Any]:
    """Graph by D = ‖x‖² + ‖y‖² − 2xᵀy in float32 on the raw data; its errors against the exact graph.

    A neighbour returned by the expansion is wrong when its true (float64) distance exceeds
    the true k-th distance of its row, so ties are never counted as errors. On a CPU, above
    :data:`CONTRAST_ALL_ROWS` points, the rows are a random sample of that many (each still
    against every point): the whole expansion would take longer than the exact graph.
    """
    start = time.perf_counter()
    n = len(x)
    if device.type == "cpu" and n > CONTRAST_ALL_ROWS:
        rows = torch.from_numpy(np.sort(rng.choice(n, CONTRAST_ALL_ROWS, replace=False)))
    else:
        rows = torch.arange(n)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # plain IEEE float32, no TF32
    try:
        x32 = torch.from_numpy(x).to(device=device, dtype=torch.float32)
        sq = (x32 * x32).sum(dim=1)
        found = torch.empty((len(rows), k), dtype=torch.int64)
        chunk = 256 if device.type == "cpu" else 4096
        for c0 in range(0, len(rows), chunk):
            c1 = min(len(rows), c0 + chunk)
            ids = rows[c0:c1].to(device)
            block = torch.addmm(sq[None, :], x32[ids], x32.T, alpha=-2.0)
            block += sq[ids, None]
            block[torch.arange(c1 - c0, device=device), ids] = math.inf
            found[c0:c1] = torch.topk(block, k, dim=1, largest=False).indices.cpu()
    finally:
        torch.set_float32_matmul_precision(previous)
    seconds = time.perf_counter() - start
    x64 = torch.from_numpy(x).to(torch.float64)
    exact_idx = torch.from_numpy(np.asarray(graph_idx, dtype=np.int64))[rows]
    kth = _exact_row_distances(x64, exact_idx, rows).max(dim=1).values
    d_found = _exact_row_distances(x64, found, rows)
    wrong = d_found > kth[:, None] * (1 + TIE_RTOL)
    return {
        "rows": len(rows),
        "wrong_rows": int(wrong.any(dim=1).sum()),
        "recall": float(1.0 - wrong.to(torch.float64).mean()),
        "seconds": seconds,
    }


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


def _fmt_int(v: int) -> str:
    return f"{v:,}"


def _one(name: str, label: str, x: np.ndarray, out: Path, device: str, emit: Callable[..., Any],
         oracle_budget_s: float, sample_rows: int, rng: np.random.Generator) -> dict[str, Any]:
    n, d = x.shape
    emit(f"\n== {label}: {_fmt_int(n)} points × {d} ({x.dtype}), exact k={K} graph, euclidean ==")
    t0 = time.perf_counter()
    g = knng.graph(x, K, device=device)
    seconds = time.perf_counter() - t0
    path = g.save(out / f"{name}-k{K}.npz")
    per_row = g.report.evaluations_per_row
    emit(f"knng.graph: {seconds:.2f} s ({n / seconds:,.0f} points/s), exact evaluations per row: median "
         f"{per_row['median']:.0f}, p99 {per_row['p99']:.0f}, max {per_row['max']:.0f}; saved {path}")

    check = _verify(x, g.indices, g.distances, K, budget_s=oracle_budget_s, sample_rows=sample_rows, rng=rng)
    where = (f"verified on a random sample of {check['checked_rows']} rows" if check["sampled"]
             else "all rows verified")
    emit(f"oracle (float64, by differences): exact rows {check['exact_rows'] + check['tie_rows']}"
         f"/{check['checked_rows']} ({check['tie_rows']} of them equal up to tied distances; {where}; "
         f"{check['seconds']:.1f} s)")

    fp32 = _fp32_expansion(x, g.indices, K, resolve_device(device), rng)
    sample = f" (a random sample of {fp32['rows']:,} rows)" if fp32["rows"] < n else ""
    emit(f"plain float32 expansion ‖x‖²+‖y‖²−2xᵀy: {fp32['wrong_rows']}/{fp32['rows']} rows with a wrong "
         f"neighbour{sample}, recall@{K} {fp32['recall']:.4f} ({fp32['seconds']:.1f} s)")
    return {
        "name": name,
        "label": label,
        "n": n,
        "d": d,
        "dtype": x.dtype.name,
        "k": K,
        "seconds": seconds,
        "points_per_s": n / seconds,
        "evaluations_per_row": per_row,
        "path": str(path),
        "checked_rows": check["checked_rows"],
        "sampled": check["sampled"],
        "exact_rows": check["exact_rows"] + check["tie_rows"],
        "identical_rows": check["exact_rows"],
        "tie_rows": check["tie_rows"],
        "distance_max_rel_error": check["distance_max_rel_error"],
        "oracle_seconds": check["seconds"],
        "fp32_rows": fp32["rows"],
        "fp32_wrong_rows": fp32["wrong_rows"],
        "fp32_recall": fp32["recall"],
        "fp32_seconds": fp32["seconds"],
    }


def _table(results: list[dict[str, Any]]) -> list[str]:
    head = (f"{'data set':<16} {'points':>8} {'dim':>4} {'dtype':<8} {'knng s':>7} {'points/s':>9}  "
            f"{'exact rows':<20} {'fp32 expansion: rows wrong':>27} {'recall@' + str(K):>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        exact = f"{r['exact_rows']}/{r['checked_rows']}" + (" (sample)" if r["sampled"] else "")
        lines.append(
            f"{r['name']:<16} {r['n']:>8,} {r['d']:>4} {r['dtype']:<8} {r['seconds']:>7.2f} "
            f"{r['points_per_s']:>9,.0f}  {exact:<20} {str(r['fp32_wrong_rows']) + '/' + str(r['fp32_rows']):>27} "
            f"{r['fp32_recall']:>9.4f}"
        )
    return lines


def run_demo(
    out_dir: str | Path = "knng-demo",
    device: str = "auto",
    quick: bool = False,
    print: Callable[..., Any] = builtins.print,
    *,
    patch_stride: int | None = None,
    max_points: int | None = None,
    oracle_budget_s: float = 60.0,
    sample_rows: int = DEFAULT_SAMPLE_ROWS,
    seed: int = 0,
) -> dict[str, Any]:
    """Build, time and verify exact k-NN graphs of built-in real data; see the module docstring.

    Parameters
    ----------
    out_dir : str or Path
        Folder for the graphs (``digits-k10.npz``, ``camera-patches-k10.npz``); created if
        missing, existing demo files are replaced.
    device : str
        As for :func:`knng.graph` ("auto", "cpu", "cuda", "cuda:N").
    quick : bool
        Patches at stride 4 (~16 000 points) instead of 2 (~64 000).
    print : callable
        Where the report lines go (``print`` by default).
    patch_stride, max_points : int, optional
        Override the patch stride and cap the number of patches (for tests).
    oracle_budget_s : float
        If checking every row against the oracle is projected to take longer, a random
        sample of ``sample_rows`` rows is checked instead (and the report says so).
    seed : int
        Seed of the row sample.

    Returns
    -------
    dict
        ``results`` (one dict of figures per data set: times, exact rows, float32-expansion
        errors, ...), ``skipped`` (data sets not run, with the reason), ``seconds`` and
        ``device``.
    """
    emit = print
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(device)
    threads = f", {torch.get_num_threads()} threads" if dev.type == "cpu" else ""
    emit(f"knng {knng.__version__} demo on {dev}{threads}: exact k-NN graphs, checked against a "
         "float64 oracle computed by differences")
    if dev.type == "cuda":
        # The first GPU call pays for CUDA context and kernel set-up; keep that out of the timings.
        knng.graph(np.random.default_rng(seed).standard_normal((256, 64)).astype(np.float32), K, device=device)
    rng = np.random.default_rng(seed)
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}

    results.append(_one("digits", "scikit-learn digits", _digits(), out, device, emit,
                        oracle_budget_s, sample_rows, rng))

    stride = patch_stride or (4 if quick else 2)
    try:
        patches = camera_patches(stride, max_points)
    except ImportError:
        reason = "scikit-image is not installed (pip install scikit-image)"
        skipped["camera-patches"] = reason
        emit(f"\n== camera patches: skipped, {reason} ==")
    else:
        results.append(_one("camera-patches", f"8×8 patches of skimage camera, stride {stride}", patches,
                            out, device, emit, oracle_budget_s, sample_rows, rng))

    total = time.perf_counter() - start
    emit("")
    for line in _table(results):
        emit(line)
    emit(f"\nexact rows: knng's neighbours equal the oracle's (ties by the smaller index, or equal up to "
         f"distances tied within {TIE_RTOL:g}). fp32 expansion: rows with at least one neighbour "
         f"farther than the true k-th neighbour. Total {total:.1f} s; graphs in {out}/")
    return {"results": results, "skipped": skipped, "seconds": total, "device": str(dev)}
