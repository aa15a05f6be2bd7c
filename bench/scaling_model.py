"""A model of the distributed k-NN graph's time, fitted to measured runs, and its predictions.

Reads the JSON of ``bench/bench_distributed.py`` runs, fits

* τ, the per-GPU screening throughput in pair-dimensions per second (a "pair-dimension" is one
  coordinate of one of the n²(P+1)/(2P) pairs the symmetric plan computes; two flops), from the
  run whose shape is closest to the target (same d and k),
* ε(R), the measured overhead of R ranks over one distributed rank, T(R)·R/T(1) − 1,

and predicts the time of the target graph (default: the papers' 20M × 15,876, k = 256) on 1, 8
and 64 GPUs of the measured kind, under stated disk and network bandwidths. Prints markdown.
The part sizes are the block-cyclic planner's own (``knng.distributed.blockcyclic.rank_sizes``).

    python bench/scaling_model.py docs/results/distributed/*.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from knng.distributed.blockcyclic import rank_sizes  # noqa: E402
from knng.engine.plan import store_capacity  # noqa: E402
from knng.metrics import get_metric  # noqa: E402


def pairs_computed(n: int, parts: int) -> float:
    """Score entries the symmetric plan computes: P(P+1)/2 blocks of (n/P)²."""
    return n * n * (parts + 1) / (2 * parts)


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for r in doc["rows"]:
            if "median_s" in r:
                rows.append({**r, "device": doc["device"], "file": Path(path).name})
    return rows


def fit(rows: list[dict]) -> tuple[dict, list[dict]]:
    """τ per shape (from W = 1) and ε per (shape, W)."""
    table = []
    base = {}
    for r in rows:
        if r["world"] == 1:
            parts = r["report"]["parts"]
            work = pairs_computed(r["n"], parts) * r["d"]
            base[(r["n"], r["d"], r["k"], r["file"])] = (r["median_s"], work / r["median_s"])
    for r in rows:
        key = (r["n"], r["d"], r["k"], r["file"])
        if key not in base:
            continue
        t1, tau = base[key]
        eps = r["median_s"] * r["world"] / t1 - 1.0
        table.append({"n": r["n"], "d": r["d"], "k": r["k"], "world": r["world"], "seconds": r["median_s"],
                      "tau": tau, "eps": eps, "file": r["file"]})
    return base, table


def predict(n: int, d: int, k: int, worlds: list[int], tau: float, eps: float, budget: float, disk_node: float,
            net_gpu: float, gpus_per_node: int, screen: torch.dtype, host_node: float, pcie: float) -> list[dict]:
    metric = get_metric("euclidean")
    kc = store_capacity(k, n - 1)
    e = screen.itemsize
    width = metric.width(d, torch.device("cuda"))
    out = []
    for world in worlds:
        gpn = min(world, gpus_per_node)
        sizes = rank_sizes(n, d, kc, world, int(budget), metric, screen, torch.device("cuda"), None,
                           host_budget=int(host_node * 0.5 / gpn), materialised=False)
        plan = sizes.plan
        parts = plan.n_parts
        b = plan.part_size
        blocks = plan.total_blocks()
        per_rank_blocks = math.ceil(blocks / world)
        raw = d * 4  # float32 input vectors
        compute = per_rank_blocks * b * b * d / tau
        if sizes.columns == "raw in host memory":  # each block's column part crosses PCIe first
            compute += per_rank_blocks * b * raw / pcie
        compute *= 1.0 + (eps if world > 1 else 0.0)
        nodes = max(1, math.ceil(world / gpus_per_node))
        disk_share = disk_node / gpn  # bytes/s per GPU from its node's storage
        start = n / world * raw / disk_share  # owned parts: finite check, sums, prepare
        if sizes.columns == "read per block":  # every block re-reads its column part (prefetched)
            stream = (n / world + per_rank_blocks * b) * raw / disk_share
        else:
            stream = n / world * raw / disk_share  # the pieces of every A_I, once
        lists_bytes = n * 16 + math.ceil(n / world) * kc * (screen.itemsize + 8) * 4
        # Every GPU receives every prepared part once (the all-gathers); inside one node over
        # NVLink (hundreds of GB/s, negligible), across nodes through the GPU's share of the NICs.
        net = 0.0 if nodes == 1 else n * width * e / net_gpu
        lists = 2 * n / world * (2 * kc + 1) * 8 * world / max(net_gpu, 1.0) if nodes > 1 else 0.0
        total = start + max(compute, stream, net + lists)
        out.append({"world": world, "nodes": nodes, "parts": parts, "part_size": b, "blocks_per_rank": per_rank_blocks,
                    "columns": sizes.columns, "compute_s": compute, "disk_s": start + stream, "net_s": net + lists,
                    "start_s": start, "total_s": total, "lists_gb": lists_bytes / 1e9,
                    "fits": lists_bytes < budget * 0.75})
    return out


def fmt_time(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:.1f} d"
    if s >= 7200:
        return f"{s / 3600:.1f} h"
    if s >= 120:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="JSON files of bench_distributed.py")
    p.add_argument("--n", type=int, default=20_000_000)
    p.add_argument("--d", type=int, default=15876)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--worlds", default="1,8,64")
    p.add_argument("--budget-gb", type=float, default=0.6 * 139, help="per-GPU memory budget (default: knng's "
                   "60%% of an idle H200's free memory)")
    p.add_argument("--disk-gbps", type=float, default=5.0, help="read bandwidth per node, GB/s (default 5)")
    p.add_argument("--net-gbps", type=float, default=25.0, help="inter-node bandwidth per GPU, GB/s (default 25: "
                   "one 200 Gb/s NIC per GPU)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--host-gb", type=float, default=2048.0, help="host memory per node, GB (default 2048, a DGX "
                   "H200); half of it may hold raw column parts")
    p.add_argument("--pcie-gbps", type=float, default=25.0, help="host-to-GPU copy rate, GB/s (default 25)")
    args = p.parse_args()

    rows = load(args.results)
    _base, table = fit(rows)
    print("Measured (per shape: τ from the one-rank distributed run, ε = T(R)·R/T(1) − 1):\n")
    print("| run | shape | k | ranks | s | τ (pair-dims/s per GPU) | ε |")
    print("|---|---|---|---|---|---|---|")
    for t in table:
        print(f"| {t['file']} | {t['n']:,} × {t['d']} | {t['k']} | {t['world']} | {t['seconds']:.3f} | "
              f"{t['tau']:.3g} | {t['eps']:+.3f} |")
    same = [t for t in table if t["d"] == args.d and t["k"] == args.k]
    pick = same or table
    tau = min(t["tau"] for t in pick if t["world"] == 1)
    eps = max(t["eps"] for t in table)
    print(f"\nFitted: τ = {tau:.3g} pair-dims/s per GPU (d = {pick[0]['d']}, k = {pick[0]['k']}; the slower run), "
          f"ε = {eps:+.3f} (the largest overhead measured at any R > 1, held for every R > 1).\n")
    worlds = [int(w) for w in args.worlds.split(",")]
    preds = predict(args.n, args.d, args.k, worlds, tau, eps, args.budget_gb * 1e9, args.disk_gbps * 1e9,
                    args.net_gbps * 1e9, args.gpus_per_node, torch.float64, args.host_gb * 1e9, args.pcie_gbps * 1e9)
    print(f"Prediction: {args.n:,} × {args.d}, k = {args.k}, float64 screen, budget {args.budget_gb:.0f} GB per GPU, "
          f"disk {args.disk_gbps:g} GB/s per node, network {args.net_gbps:g} GB/s per GPU, "
          f"{args.gpus_per_node} GPUs per node, {args.host_gb:g} GB of host memory per node:\n")
    print("| GPUs | nodes | parts (size) | blocks per GPU | owned columns | candidate lists | screen (compute) "
          "| disk | network | predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in preds:
        lists = f"{r['lists_gb']:.0f} GB" + ("" if r["fits"] else " (does not fit)")
        print(f"| {r['world']} | {r['nodes']} | {r['parts']} ({r['part_size']:,}) | {r['blocks_per_rank']:,} | "
              f"{r['columns']} | {lists} | {fmt_time(r['compute_s'])} | {fmt_time(r['disk_s'])} | "
              f"{fmt_time(r['net_s'])} | **{fmt_time(r['total_s'])}** |")


if __name__ == "__main__":
    main()
