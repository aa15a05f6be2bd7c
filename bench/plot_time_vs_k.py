"""Time against k for one search shape, knng (best precision and each one) against FAISS, cuVS and torch.

Reads the JSON that ``bench/bench_peers.py`` writes (or the older ``bench_fused.py --part
engine`` files in ``docs/results/``; one or several files, e.g. a run at small k and one at
large k) and draws the Gaussian search rows of one dimension on log-log axes. Usage::

    PYTHONPATH=src:tests python bench/bench_peers.py --searches 1000000x128 --ks 10,100,1024,2048 \\
        --precisions auto,float16,float32 --out search-k.json                       # on a GPU
    python bench/plot_time_vs_k.py search-k.json --d 128 --out docs/images/search-time-vs-k.png

Needs matplotlib (``pip install knng[bench]``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict


def search_rows(paths: list[str], d: int) -> tuple[list[dict], str]:
    """The search rows of dimension ``d`` from every file, by k, and the device they ran on."""
    rows, devices = [], set()
    for path in paths:
        with open(path) as fh:
            run = json.load(fh)
        devices.add(f"{run['device']}, {run['date']}")
        rows += [r for r in run["results"] if r["task"] == "search" and r["d"] == d and r.get("data", "gauss") == "gauss"]
    return sorted(rows, key=lambda r: r["k"]), "; ".join(sorted(devices))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, device = search_rows(args.files, args.d)
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    labels: list[tuple[int, float, str]] = []
    for r in rows:
        for name, key in (("FAISS knn_gpu (float32)", "faiss_ms"), ("cuVS brute force (float32)", "cuvs_ms"),
                          ("torch mm + topk (float32)", "torch_ms")):
            value = r.get(key)
            if value is not None and not math.isnan(value):
                series[name].append((r["k"], value))
        for precision, run in r["knng"].items():
            # "auto": the planner's precision, which can change with k (each point is labelled).
            name = "knng, the planner's screen (exact)" if precision == "auto" else f"knng, {precision} screen (exact)"
            series[name].append((r["k"], run["ms"]))
            if precision == "auto":
                labels.append((r["k"], run["ms"], run.get("screen_dtype", "")))
    fig, ax = plt.subplots(figsize=(7, 5))
    for name, points in series.items():
        ks, ms = zip(*sorted(points))
        ax.plot(ks, ms, marker="o", label=name, linestyle="--" if not name.startswith("knng") else "-")
    for k, ms, dtype in labels:
        ax.annotate(dtype, (k, ms), textcoords="offset points", xytext=(4, -10), fontsize=7)
    shape = rows[0]
    ax.set(xscale="log", yscale="log", xlabel="k", ylabel="time (ms)",
           title=f"search {shape['n']:,} × {args.d}, {shape['nq']:,} queries\n{device}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}: {', '.join(f'{n} ({len(p)} k)' for n, p in series.items())}")


if __name__ == "__main__":
    main()
