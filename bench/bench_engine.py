"""Benchmark knng.search / knng.graph against torch matmul + topk, in one process.

The baseline is what most GPU code does: the float32 expansion ‖x‖² + ‖y‖² − 2xᵀy in one
matrix product per chunk of rows, then ``torch.topk`` — not exact (it also reports how many of
knng's exact neighbours it finds), and for graphs it computes the whole n × n matrix.

Usage (on a GPU machine, from the repository root)::

    PYTHONPATH=src python bench/bench_engine.py --out bench-results.json
    PYTHONPATH=src python bench/bench_engine.py --quick          # small shapes, a smoke run

Prints a markdown table and writes JSON with every timing, the device and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time

import torch

import knng
from knng.api import last_report


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> tuple[list[float], object]:
    """Warm up once, then time ``repeats`` calls (wall clock around a synchronised call)."""
    result = fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times, result


def torch_search(q: torch.Tensor, c: torch.Tensor, k: int, chunk: int = 2048):
    """Baseline search: float32 expansion + torch.topk, in query chunks."""
    cn = (c * c).sum(1)
    idx = torch.empty((q.shape[0], k), dtype=torch.int64, device=q.device)
    for i in range(0, q.shape[0], chunk):
        d = torch.addmm(cn, q[i:i + chunk], c.T, alpha=-2.0)
        idx[i:i + chunk] = torch.topk(d, k, dim=1, largest=False).indices
    return idx


def torch_graph(x: torch.Tensor, k: int, chunk: int = 4096):
    """Baseline graph: the full n × n float32 expansion in row chunks, self masked, topk."""
    xn = (x * x).sum(1)
    n = x.shape[0]
    idx = torch.empty((n, k), dtype=torch.int64, device=x.device)
    for i in range(0, n, chunk):
        j = min(n, i + chunk)
        d = torch.addmm(xn, x[i:j], x.T, alpha=-2.0)
        d += xn[i:j, None]
        r = torch.arange(j - i, device=x.device)
        d[r, r + i] = torch.inf
        idx[i:j] = torch.topk(d, k, dim=1, largest=False).indices
    return idx


def recall(found: torch.Tensor, truth: torch.Tensor) -> float:
    """Share of the true neighbours present in ``found`` (row-wise set overlap)."""
    hits = 0
    for i in range(0, truth.shape[0], 4096):
        f, t = found[i:i + 4096], truth[i:i + 4096]
        hits += int((f[:, :, None] == t[:, None, :]).any(2).sum())
    return hits / truth.numel()


def report_dict() -> dict:
    rep = last_report()
    out = {"exact_evaluations": rep.exact.exact_evaluations, "evaluations_per_row": rep.evaluations_per_row,
           "oom_retries": rep.oom_retries, "plan": rep.plan.as_dict()}
    if hasattr(rep, "parts"):
        out.update(parts=rep.parts, part_size=rep.part_size, blocks_computed=rep.blocks_computed,
                   blocks_full=rep.blocks_full, pairs_saving=rep.pairs_saving)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["search", "graph"], default=None)
    ap.add_argument("--selects", default="topk,grouped", help="knng select= variants to time")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(int(time.time()))
    selects = args.selects.split(",")
    if args.quick:
        search_cases = [(100_000, 1_000, 128, k) for k in (10, 100)]
        graph_cases = [(20_000, 128, 10), (2048, 512, 100)]
    else:
        search_cases = [(1_000_000, 10_000, 128, k) for k in (10, 100, 1024)]
        graph_cases = [(200_000, 128, 10), (16_384, 4096, 1024)]
    rows = []
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
            "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "command": " ".join([sys.executable.split("/")[-1], *sys.argv]), "results": rows}
    print(f"# {meta['device']}  {meta['date']}  torch {meta['torch']}", flush=True)

    if args.only in (None, "search"):
        for n, nq, d, k in search_cases:
            c = torch.randn((n, d), generator=gen, device=dev)
            q = torch.randn((nq, d), generator=gen, device=dev)
            base_t, base_idx = timed(lambda: torch_search(q, c, k), args.repeats)
            row = {"task": "search", "n": n, "nq": nq, "d": d, "k": k,
                   "baseline_ms": 1e3 * statistics.median(base_t), "variants": {}}
            for sel in selects:
                t, res = timed(lambda: knng.search(q, c, k, select=sel), args.repeats)
                row["variants"][sel] = {"ms": 1e3 * statistics.median(t), "times_ms": [1e3 * x for x in t],
                                        **report_dict()}
            row["baseline_recall_vs_exact"] = recall(base_idx, res.indices)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del c, q
            torch.cuda.empty_cache() if dev.type == "cuda" else None

    if args.only in (None, "graph"):
        for n, d, k in graph_cases:
            x = torch.randn((n, d), generator=gen, device=dev)
            base_t, base_idx = timed(lambda: torch_graph(x, k), args.repeats)
            row = {"task": "graph", "n": n, "d": d, "k": k,
                   "baseline_ms": 1e3 * statistics.median(base_t), "variants": {}}
            for sel in selects:
                t, res = timed(lambda: knng.graph(x, k, select=sel), args.repeats)
                row["variants"][sel] = {"ms": 1e3 * statistics.median(t), "times_ms": [1e3 * x for x in t],
                                        **report_dict()}
            # The same exact engine without the symmetry: every point searched against all points.
            t, _ = timed(lambda: knng.search(x, x, k + 1), args.repeats)
            row["unsymmetric_exact_ms"] = 1e3 * statistics.median(t)
            row["baseline_recall_vs_exact"] = recall(base_idx, res.indices)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del x
            torch.cuda.empty_cache() if dev.type == "cuda" else None

    print("\n| task | shape | k | torch mm+topk (ms) | " + " | ".join(f"knng {s} (ms)" for s in selects)
          + " | best speed-up | baseline recall |")
    print("|---|---|---|---|" + "---|" * len(selects) + "---|---|")
    for r in rows:
        shape = f"{r['n']}×{r['d']}" + (f", {r['nq']} queries" if r["task"] == "search" else "")
        best = min(v["ms"] for v in r["variants"].values())
        print(f"| {r['task']} | {shape} | {r['k']} | {r['baseline_ms']:.1f} | "
              + " | ".join(f"{r['variants'][s]['ms']:.1f}" for s in selects)
              + f" | {r['baseline_ms'] / best:.2f}× | {r['baseline_recall_vs_exact']:.4f} |")
    graphs = [r for r in rows if r["task"] == "graph"]
    if graphs:
        print("\n| graph | k | knng.search(x, x, k+1) (ms) | knng.graph (ms) | symmetric saving |")
        print("|---|---|---|---|---|")
        for r in graphs:
            best = min(v["ms"] for v in r["variants"].values())
            print(f"| {r['n']}×{r['d']} | {r['k']} | {r['unsymmetric_exact_ms']:.1f} | {best:.1f} | "
                  f"{1 - best / r['unsymmetric_exact_ms']:.0%} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
