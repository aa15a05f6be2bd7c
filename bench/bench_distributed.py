"""Scaling of the distributed k-NN graph (or sharded search) over the GPUs of one host, against one GPU.

For each world size W (default 1, 2, 4) the script starts W processes (NCCL, one GPU each);
every rank makes the same data on its GPU from one seed (torch's Philox generator gives the
same numbers on every GPU), runs ``knng.distributed.graph`` once to warm up, then ``--repeats``
timed runs (wall clock from a barrier to the returned graph on every rank, synchronised). The
W = 1 process also times the single-device ``knng.graph`` on the same data: the baseline every
speed-up is measured against. Each run's result is hashed, and the hashes of every W must equal
the single-device one (bit-identical graphs).

Also reported, per shape and W: the largest share of a rank's time spent blocked on collectives
and peers ("waiting"), and the time the run's collectives take when replayed alone, one after
another between barriers, as a share of the run ("communicating (alone)": in the run they
overlap the computation), and each rank's longest waits.

Times: ``harness.time_call`` (CUDA events on a GPU, the host clock on a CPU) from a barrier
(untimed) to the returned graph, after one warm-up run.

With ``--queries Q`` each Gaussian shape is a corpus instead: ``knng.distributed.search`` of Q
Gaussian queries (the corpus sharded over the ranks) against ``knng.search`` on one GPU. The
photon images (``photons@n``) are made on each rank's GPU (``harness.photon_counts``' device
draws).

    PYTHONPATH=src:tests python bench/bench_distributed.py --out bench-dist.json          # 1, 2, 4 GPUs
    PYTHONPATH=src:tests python bench/bench_distributed.py --queries 100000 --shapes 20000000x128:10
    PYTHONPATH=src:tests python bench/bench_distributed.py --quick                        # CPU (gloo), seconds

Prints a markdown table and writes JSON (``--out``: the device, the date, the command, every run).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

SHAPES = "1000000x128:10,200000x960:100"


def parse_shapes(text: str) -> list[tuple[int, int, int, str | None]]:
    """``n×d:k`` items (Gaussian points) or ``NAME:k`` / ``NAME@n:k`` items (a data set of
    ``harness.DATASETS``, its own size or n rows; n and d filled in when it is loaded: 0 here)."""
    out: list[tuple[int, int, int, str | None]] = []
    for item in text.split(","):
        nd, k = item.split(":")
        name, _, rows = nd.partition("@")
        if name in harness.DATASETS:
            out.append((int(rows or 0), 0, int(k), name))
            continue
        n, d = nd.lower().split("x")
        out.append((int(n), int(d), int(k), None))
    return out


def digest(indices: torch.Tensor, distances: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(indices.cpu().numpy().tobytes())
    h.update(distances.to(torch.float32).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def make_data(n: int, d: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn((n, d), generator=gen, device=device, dtype=torch.float32)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out_file: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    import torch.distributed as dist

    import knng
    import knng.distributed as kd
    from knng.api import last_report

    kd.init(device=args.device)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device != "cpu" else torch.device("cpu")
    results = []
    for n, d, k, name in parse_shapes(args.shapes):
        row: dict = {"n": n, "d": d, "k": k, "world": world, "data": name or "gauss"}
        try:
            if name is None:
                x = make_data(n, d, args.seed, device)
            elif name == "photons" and device.type == "cuda":  # NumPy's Poisson draws take minutes at 10⁵
                x = harness.photon_counts(n or 20_000, args.seed, device=device)
                row["n"], row["d"] = x.shape
            else:  # every rank loads the same set (deterministic in the seed)
                x = torch.from_numpy(harness.load_dataset(name, n=n or None, seed=args.seed)[0]).to(device)
                row["n"], row["d"] = x.shape
            if args.queries:  # a search of a corpus sharded over the ranks
                q = make_data(args.queries, x.shape[1], args.seed + 1, device)
                row["queries"] = args.queries

                def run(x=x, q=q):
                    return kd.search(q, x, k, device=device, timeout=600)

                def single(x=x, q=q):
                    return knng.search(q, x, k, device=device)
            else:
                def run(x=x):
                    return kd.graph(x, k, device=device, timeout=600)

                def single(x=x):
                    return knng.graph(x, k, device=device)
            timing = harness.time_call(run, device=device, warmup=1, repeats=args.repeats, before=dist.barrier)
            g, report = timing.result, last_report()
            row["times_s"] = timing.times
            row["median_s"] = timing.median
            row["timer"] = timing.timer
            row["digest"] = digest(g.indices, g.distances)
            if args.queries:
                row["report"] = {"shard_rows": report.shard_rows, "per_rank": report.per_rank,
                                 "wait_share": max(r["wait_s"] / r["seconds"] for r in report.per_rank),
                                 "screen_dtype": report.screen_dtype}
            else:
                # The same collectives alone, with nothing to overlap: the communication time.
                from knng.distributed.comm import replay

                alone = replay(report.comm_ops, device)
                gathered = [None] * world
                dist.all_gather_object(gathered, {"alone_s": alone, "waits": report.waits})
                row["comm_alone_s"] = [g["alone_s"] for g in gathered]
                row["waits"] = [g["waits"] for g in gathered]
                row["report"] = {"parts": report.parts, "part_size": report.part_size,
                                 "blocks_per_rank": [r["blocks"] for r in report.per_rank],
                                 "wait_share": report.wait_share, "per_rank": report.per_rank,
                                 "screen_dtype": report.screen_dtype, "store": vars(report.store),
                                 "duplicates_folded": getattr(report, "duplicates_folded", 0)}
            del g
            if world == 1 and not args.no_baseline:
                base = harness.time_call(single, device=device, warmup=1, repeats=args.repeats)
                ref = base.result
                row["single_device_times_s"] = base.times
                row["single_device_median_s"] = base.median
                row["single_device_digest"] = digest(ref.indices, ref.distances)
                row["single_device_parts"] = getattr(last_report(), "parts", None)
                del ref
            del x
        except Exception as exc:  # noqa: BLE001 - record and go on with the next shape
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()
        results.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if rank == 0:
            Path(out_file).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(rows: list[dict]) -> str:
    def key_of(r: dict) -> tuple:
        return r.get("data", "gauss"), r["n"], r["d"], r["k"]

    def name_of(r: dict) -> str:
        data = r.get("data", "gauss")
        search = f"search of {r['queries']:,} queries in " if r.get("queries") else ""
        return search + f"{r['n']:,} × {r['d']}" + ("" if data == "gauss" else f" ({data})")

    base = {key_of(r): r for r in rows if r["world"] == 1 and "single_device_median_s" in r}
    lines = ["| graph | k | GPUs | time (s) | speed-up vs 1 GPU | vs distributed W=1 | waiting | communicating "
             "(alone) | blocks per rank | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        key = key_of(r)
        if "error" in r:
            lines.append(f"| {name_of(r)} | {r['k']} | {r['world']} | error: {r['error'][:60]} |||||||")
            continue
        b = base.get(key)
        w1 = next((x for x in rows if x["world"] == 1 and key_of(x) == key and "median_s" in x), None)
        if r["world"] == 1 and b is not None:
            lines.append(f"| {name_of(r)} | {r['k']} | 1 (knng.{'search' if r.get('queries') else 'graph'}) | {b['single_device_median_s']:.3f} "
                         f"| 1.00× | | | | | {b['single_device_digest']} |")
        sp = f"{b['single_device_median_s'] / r['median_s']:.2f}×" if b else ""
        sw = f"{w1['median_s'] / r['median_s']:.2f}×" if w1 else ""
        same = "yes" if b and r["digest"] == b["single_device_digest"] else ("?" if not b else "NO")
        rep = r["report"]
        alone = max(r.get("comm_alone_s", [0.0])) / r["median_s"]
        work = (f"{min(rep['blocks_per_rank'])}–{max(rep['blocks_per_rank'])} of {rep['parts']} parts"
                if "blocks_per_rank" in rep else f"shards of {min(rep['shard_rows']):,}–{max(rep['shard_rows']):,} rows")
        lines.append(f"| {name_of(r)} | {r['k']} | {r['world']} | {r['median_s']:.3f} | {sp} | {sw} "
                     f"| {rep['wait_share']:.1%} | {alone:.1%} | {work} | {same} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES, help=f"n×d:k or DATASET:k list (default {SHAPES}; data sets: "
                   "bench/harness.py's, e.g. patches8:10)")
    p.add_argument("--worlds", default="1,2,4", help="world sizes (default 1,2,4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="cuda: one GPU a rank (NCCL); cpu: gloo (default auto: cuda where there is a GPU)")
    p.add_argument("--queries", type=int, default=0,
                   help="time searches of this many Gaussian queries in each shape's points (knng.distributed.search: "
                        "the corpus sharded over the ranks; baseline knng.search) instead of graphs")
    p.add_argument("--no-baseline", action="store_true", help="skip the single-device knng.graph runs")
    p.add_argument("--quick", action="store_true", help="worlds 1, 2 of a 4,000 × 16 graph, k = 5, one repeat: a smoke run")
    p.add_argument("--out", default=None, help="write the figures to this JSON file")
    args = p.parse_args()
    import torch.multiprocessing as mp

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        args.worlds, args.shapes, args.repeats = "1,2", "4000x16:5", 1
    worlds = [int(w) for w in args.worlds.split(",")]
    if args.device == "cuda":
        skipped = [w for w in worlds if w > torch.cuda.device_count()]
        if skipped:
            print(f"worlds {skipped} skipped: {torch.cuda.device_count()} GPU(s) here", file=sys.stderr)
        worlds = [w for w in worlds if w <= torch.cuda.device_count()]
    all_rows: list[dict] = []
    started = time.time()
    parts = Path(tempfile.mkdtemp(prefix="knng-bench-dist-"))
    for world in worlds:
        part = str(parts / f"w{world}.json")
        t0 = time.time()
        mp.spawn(worker, args=(world, free_port(), args, part), nprocs=world)
        rows = json.loads(Path(part).read_text())
        for r in rows:
            r["process_wall_s"] = time.time() - t0
        all_rows += rows
        print(f"world {world}: done in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    shutil.rmtree(parts, ignore_errors=True)
    all_rows.sort(key=lambda r: (r.get("data", "gauss"), r["n"], r["d"], r["k"], r["world"]))
    doc = {
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
        "gpus": torch.cuda.device_count() if args.device == "cuda" else 0,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else None,
        "seconds": time.time() - started,
        "rows": all_rows,
    }
    harness.write_json(args.out, doc)
    print(table(all_rows))
    for r in all_rows:
        for rank, waits in enumerate(r.get("waits", [])):
            top = "; ".join(f"{w[0]} {1e3 * w[1]:.1f} ms at {w[2]:.2f} s" for w in waits[:4])
            print(f"{r.get('data', 'gauss')} {r['n']}x{r['d']} W={r['world']} rank {rank} longest waits: {top}",
                  file=sys.stderr)
    for r in all_rows:
        if "traceback" in r:
            print(r["traceback"], file=sys.stderr)


if __name__ == "__main__":
    main()
