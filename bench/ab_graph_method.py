"""A/B of a GPU graph's method (``plan.graph_method``): symmetric blocks against rows searched.

Both methods in one process, alternating (symmetric, rows, symmetric, rows, ...), on the same
data, after one warm-up call of each; from the repository root on a GPU machine
(``.carry/pictures.npz``: the pictures saved by ``bench/bench_patches.py --save-images``)::

    PYTHONPATH=src:tests python bench/ab_graph_method.py gauss200000x128:10,100 patches8:10,100

Arguments: SHAPE:K[,K...] groups; SHAPE is ``gaussNxD`` (N Gaussian points of dimension D),
``patches8`` (582,150 × 64) or ``patches16`` (249,551 × 256); ``--repeats R`` (default 3).

Prints, per shape and k, each method's minimum and median over its calls, its screen precision,
pairs screened and exactly evaluated per row (median / p99), whether the two methods returned the
same indices and distances, and whether 128 rows of the rows method are exact against the
float64 oracle by differences (``tests/oracle.py``).
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "bench")
import knng  # noqa: E402
import knng.engine.plan as plan  # noqa: E402
from bench_patches import patches  # noqa: E402
from oracle import assert_exact_chunked  # noqa: E402

METHODS = {"symmetric": False, "rows": True}


def data(name: str, gen: torch.Generator) -> torch.Tensor:
    if name.startswith("patches"):
        side, stride = {"patches8": (8, 2), "patches16": (16, 3)}[name]
        return torch.from_numpy(patches(dict(np.load(".carry/pictures.npz")), side, stride, 12)).cuda()
    n, d = (int(v) for v in name.removeprefix("gauss").split("x"))
    return torch.randn(n, d, device="cuda", generator=gen)


def run(x: torch.Tensor, k: int, method: str) -> tuple[float, knng.Graph]:
    plan.rows_method_wins = lambda *args, rows=METHODS[method]: rows
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    g = knng.graph(x, k)
    torch.cuda.synchronize()
    assert g.report.plan.graph_method == method, g.report.plan.graph_method
    return time.perf_counter() - t0, g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("groups", nargs="+")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for group in args.groups:
        name, ks = group.split(":")
        x = data(name, gen)
        for k in (int(v) for v in ks.split(",")):
            times = {m: [] for m in METHODS}
            graphs = {m: run(x, k, m)[1] for m in METHODS}  # warm-up, and the answers compared
            for _ in range(args.repeats):
                for m in METHODS:
                    times[m].append(run(x, k, m)[0] * 1e3)
            same_idx = torch.equal(torch.as_tensor(graphs["symmetric"].indices), torch.as_tensor(graphs["rows"].indices))
            same_dist = torch.equal(torch.as_tensor(graphs["symmetric"].distances),
                                    torch.as_tensor(graphs["rows"].distances))
            rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(k))[:128].to(x.device)
            try:
                assert_exact_chunked(x, x, [graphs["rows"]], "euclidean", exclude_self=True, rows=rows)
                exact = "exact"
            except AssertionError as exc:
                exact = "NOT EXACT " + str(exc)[:200]
            parts = []
            for m in METHODS:
                r = graphs[m].report
                s, e = r.screened_per_row, r.evaluations_per_row
                parts.append(f"{m} min {min(times[m]):7.1f} med {statistics.median(times[m]):7.1f} ms "
                             f"({r.plan.screen_precision}, chunks {r.parts}, screened {s.get('median', 0):.0f}/"
                             f"{s.get('p99', 0):.0f}, evaluated {e.get('median', 0):.0f}/{e.get('p99', 0):.0f})")
            print(f"{name} {tuple(x.shape)} k={k}: " + " | ".join(parts)
                  + f" | same idx {same_idx} dist {same_dist} | rows {exact}", flush=True)
            del graphs
            torch.cuda.empty_cache()
        del x


if __name__ == "__main__":
    main()
