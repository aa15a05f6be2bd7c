"""A model of the distributed k-NN graph's time, fitted to measured runs, and its predictions.

Reads the JSON of ``bench/bench_distributed.py`` runs, fits

* τ, the per-GPU screening throughput in pair-dimensions per second (a "pair-dimension" is one
  coordinate of one of the n²(P+1)/(2P) pairs the symmetric plan computes; two flops), from the
  run whose shape is closest to the target (same d and k),
* ε(R), the measured overhead of R ranks over one distributed rank, T(R)·R/T(1) − 1, taken from
  the runs with the most parts (the target's regime: its own parts are a sliver of its blocks),

and predicts the time of the target graph (default: the papers' 20M × 15,876, k = 256) on 1, 8
and 64 GPUs of the measured kind, under stated disk and network bandwidths. Prints markdown.
Every GPU runs the one-device plan (``knng.engine.plan.make_graph_plan`` for an H200 and the
budgets given) on its share (``knng.distributed.graph_shares``): every own part, 1/R of the
off-diagonal blocks, reading the input itself (whole where the plan keeps it resident, else a
column part for each of its blocks), then the ranks' lists merged over the network.

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

from knng.engine.kernels import DeviceCapabilities  # noqa: E402
from knng.engine.plan import make_graph_plan  # noqa: E402

#: An H200 with every kernel knng has (what the planner is asked to plan for).
H200 = DeviceCapabilities("cuda", compute_capability=(9, 0), triton=True, cupy=True, wgmma=True)


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
                      "tau": tau, "eps": eps, "file": r["file"], "parts": r["report"]["parts"]})
    return base, table


def predict(n: int, d: int, k: int, worlds: list[int], tau: float, eps: float, budget: float, disk_node: float,
            net_gpu: float, gpus_per_node: int, host_node: float, pcie: float) -> list[dict]:
    out = []
    for world in worlds:
        gpn = min(world, gpus_per_node)
        plan = make_graph_plan(n=n, d=d, k=k, metric="euclidean", device=torch.device("cuda"), budget=int(budget),
                               include_self=False, host_budget=int(host_node * 0.5 / gpn), capabilities=H200)
        parts, b = plan.parts, plan.part_size
        off_diagonal = parts * (parts - 1) // 2
        per_rank_blocks = parts + math.ceil(off_diagonal / world)
        raw = d * 4  # float32 input vectors
        # Every own part on every rank (n·b pairs), 1/R of the others.
        pairs = n * b + (pairs_computed(n, parts) - n * b) / world
        compute = pairs * d / tau * (1.0 + (eps if world > 1 else 0.0))
        nodes = max(1, math.ceil(world / gpus_per_node))
        # A node's storage (or page cache) serves its GPUs; past the node's memory, from disk.
        disk_share = disk_node / gpn
        if plan.corpus_resident:
            stream = n * raw / min(disk_share, pcie)
        else:  # a row part once per block row, a column part for every block
            stream = (n + per_rank_blocks * b) * raw / min(disk_share if n * raw > host_node else pcie, pcie)
        # Each rank's lists of every row (k distances and indices) to their owners, (R−1)/R of them.
        lists = n * k * 16 * (world - 1) / world / net_gpu if nodes > 1 else 0.0
        total = max(compute, stream) + lists
        out.append({"world": world, "nodes": nodes, "parts": parts, "part_size": b, "blocks_per_rank": per_rank_blocks,
                    "resident": plan.corpus_resident, "lists": plan.lists, "compute_s": compute, "disk_s": stream,
                    "net_s": lists, "total_s": total})
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
                   "H200); half of it is the ranks' host budget, and a file that fits it is read from the page cache")
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
    # The overhead of the runs nearest the target's regime: the most parts (the target's own
    # parts are counted in the hundreds; a few parts leave each rank's own parts most of its work).
    several = [t for t in table if t["world"] > 1]
    most = max(t["parts"] for t in several)
    eps = max(t["eps"] for t in several if t["parts"] == most)
    print(f"\nFitted: τ = {tau:.3g} pair-dims/s per GPU (d = {pick[0]['d']}, k = {pick[0]['k']}; the slower run), "
          f"ε = {eps:+.3f} (the overhead of the runs with the most parts, {most}, held for every R > 1).\n")
    worlds = [int(w) for w in args.worlds.split(",")]
    preds = predict(args.n, args.d, args.k, worlds, tau, eps, args.budget_gb * 1e9, args.disk_gbps * 1e9,
                    args.net_gbps * 1e9, args.gpus_per_node, args.host_gb * 1e9, args.pcie_gbps * 1e9)
    print(f"Prediction: {args.n:,} × {args.d}, k = {args.k}, budget {args.budget_gb:.0f} GB per GPU, "
          f"disk {args.disk_gbps:g} GB/s per node, network {args.net_gbps:g} GB/s per GPU, "
          f"{args.gpus_per_node} GPUs per node, {args.host_gb:g} GB of host memory per node:\n")
    print("| GPUs | nodes | parts (size) | blocks per GPU | input | candidate stores | screen (compute) "
          "| reads | network (lists) | predicted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in preds:
        print(f"| {r['world']} | {r['nodes']} | {r['parts']} ({r['part_size']:,}) | {r['blocks_per_rank']:,} | "
              f"{'resident' if r['resident'] else 'streamed'} | {r['lists']} | {fmt_time(r['compute_s'])} | "
              f"{fmt_time(r['disk_s'])} | {fmt_time(r['net_s'])} | **{fmt_time(r['total_s'])}** |")


if __name__ == "__main__":
    main()
