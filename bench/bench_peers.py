"""knng.search and knng.graph against the peers, on one device, in one process.

On a GPU (the default where there is one) the peers are FAISS (``faiss.knn_gpu``), cuVS's
brute force and torch's mm + topk on the float32 expansion; on a CPU (``--device cpu``)
faiss-cpu (``IndexFlatL2``) and scikit-learn (``NearestNeighbors(algorithm="brute")``), torch
on request (``--peers``). Each peer is optional: one that does not import is skipped with a
note. None of them is exact in knng's sense (``docs/EXACTNESS.md``); each one's recall of
knng's exact neighbours is reported. A peer's graph is its search of the points against
themselves with k + 1, each point's own index dropped.

Every knng answer is checked against the float64 oracle by differences (``tests/oracle.py``) on
256 random rows (a graph: and 64 rows of flat patches). Times: CUDA events around a synchronised
call on a GPU, the host clock on a CPU (``harness.time_call``); median and min of ``--repeats``
after ``--warmup`` calls; each library and data set from an empty allocator cache.

The grids (``--searches``, ``--graphs``, ``--sets`` replace them):

* GPU: searches of 10k queries against 1M × 128 (k = 10, 100, 1,024) and 1M × 960 (k = 10, 100)
  Gaussian points; graphs of 200k × 128 (k = 10, 100), 16,384 × 4,096 (k = 1,024) and 1M × 128
  (k = 10) Gaussian points; graphs of the benchmark's 8×8 and 16×16 image patches and their
  Gaussian twins (k = 10, 100); graphs of the held-out sets (k = 10, 100): patches off the 1/255
  lattice (``patches8_linear``), integer patches (``patches8_u8``), dense descriptors, embeddings
  (cosine), a point cloud and photon counts on a 126 × 126 detector (``bench/harness.py --list``);
* CPU: graphs of knng demo's 64,009 8×8 camera patches and their Gaussian twin, k = 10.

Usage (repository root; the pictures: ``python bench/harness.py --save-images .carry/pictures.npz``
where scikit-image is, then carry the file; the peers: ``. .peers/env.sh``, see bench/README.md)::

    PYTHONPATH=src:tests python bench/bench_peers.py --out gpu.json                 # the GPU grid
    PYTHONPATH=src:tests python bench/bench_peers.py --searches 1000000x128 --ks 10,100,1024,2048,4096 \\
        --precisions auto,float16,float32 --out bigk.json
    PYTHONPATH=src:tests python bench/bench_peers.py --device cpu --out cpu.json    # the CPU grid
    PYTHONPATH=src:tests python bench/bench_peers.py --device cpu --graphs 500x128,2000x128,10000x128 \\
        --searches 10000x128:200 --repeats 9                                          # small calls
    PYTHONPATH=src:tests python bench/bench_peers.py --device cpu --graphs 5000x64 --searches 100000x64:100 \\
        --ks 10 --repeats 9 --options pipeline        # small calls through the block pipeline (no direct path)
    PYTHONPATH=src:tests python bench/bench_peers.py --quick                          # seconds, any device

Prints a line per case as it goes and a markdown table last; ``--out`` writes every figure as
JSON (``bench/plot_time_vs_k.py`` draws its searches).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import knng  # noqa: E402

HELD_OUT = ("patches8_linear", "patches8_u8", "descriptors", "embeddings", "points", "photons")


@dataclass
class Case:
    """One workload: a search (queries given) or a graph, on one data set, at several k."""

    task: str
    data: str
    make: Callable[[], tuple[torch.Tensor, torch.Tensor | None]]
    ks: list[int]
    metric: str = "euclidean"
    flat: bool = False  # check the rows of flat patches too
    notes: list[str] = field(default_factory=list)


def shape_spec(text: str) -> tuple[int, int, int | None]:
    """``NxD`` or ``NxD:Q`` as (n, d, queries or None)."""
    shape, _, queries = text.partition(":")
    n, d = (int(v) for v in shape.lower().split("x"))
    return n, d, int(queries) if queries else None


def default_cases(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """The grid of the device (or the shapes and sets asked for)."""
    def gauss_search(n: int, d: int, q: int, ks: list[int]) -> Case:
        return Case("search", "gauss", lambda: (harness.gaussian(n, d, args.seed, device),
                                                harness.gaussian(q, d, args.seed + 1, device)), ks)

    def gauss_graph(n: int, d: int, ks: list[int], label: str = "gauss") -> Case:
        return Case("graph", label, lambda: (harness.gaussian(n, d, args.seed, device), None), ks)

    def set_graph(name: str, ks: list[int], n: int | None = None, twin: bool = False) -> list[Case]:
        spec = harness.DATASETS[name]

        def make() -> tuple[torch.Tensor, None]:
            x, _ = harness.load_dataset(name, n=n, seed=args.seed, pictures=args.pictures)
            return torch.from_numpy(x).to(device), None

        out = [Case("graph", name, make, ks, spec.metric, flat=spec.pictures)]
        if twin:  # Gaussian points of the same shape
            def make_twin() -> tuple[torch.Tensor, None]:
                x, _ = make()
                return harness.gaussian(x.shape[0], x.shape[1], args.seed, device), None
            out.append(Case("graph", f"gauss twin of {name}", make_twin, ks))
        return out

    cases: list[Case] = []
    custom = args.searches or args.graphs or args.sets
    queries = args.queries
    if args.quick:
        q = min(queries, 200)
        cases += [gauss_search(2000, 32, q, [10]), gauss_graph(2000, 32, [10])]
        for name, n in (("embeddings", 2000), ("points", 2000), ("photons", 100), ("descriptors", 2000),
                        ("patches8_linear", 2000)):
            cases += set_graph(name, [10], n)
    elif custom:
        for text in (args.searches.split(",") if args.searches else []):
            n, d, q = shape_spec(text)
            cases.append(gauss_search(n, d, q or queries, [10, 100]))
        for text in (args.graphs.split(",") if args.graphs else []):
            n, d, _ = shape_spec(text)
            cases.append(gauss_graph(n, d, [10, 100]))
        for name in (args.sets.split(",") if args.sets else []):
            cases += set_graph(name, [10, 100], args.n, twin=args.twins)
    elif device.type == "cuda":
        cases += [gauss_search(1_000_000, 128, queries, [10, 100, 1024]), gauss_search(1_000_000, 960, queries, [10, 100]),
                  gauss_graph(200_000, 128, [10, 100]), gauss_graph(16_384, 4096, [1024]),
                  gauss_graph(1_000_000, 128, [10])]
        cases += set_graph("patches8", [10, 100], twin=True) + set_graph("patches16", [10, 100], twin=True)
        for name in HELD_OUT:
            cases += set_graph(name, [10, 100], args.n)
    else:
        cases += set_graph("camera", [10], twin=True)
    if args.ks:
        wanted = [int(k) for k in args.ks.split(",")]
        for case in cases:
            case.ks = wanted
    return cases


def knng_variants(precisions: str, options: str) -> dict[str, dict[str, Any]]:
    """knng's variants of a run: label → ``knng.options`` changes, every screen precision of
    ``precisions`` (comma-separated; ``auto`` the planner's) under every option set of
    ``options`` (``/``-separated, :func:`harness.parse_option_set`; e.g. ``escalate_pairs=0/new``
    times knng with and without a change beside the peers, in one process). A label is the
    precision, the option set, or both joined by ``+`` where both vary."""
    sets = options.split("/") if options else [""]
    out: dict[str, dict[str, Any]] = {}
    for precision in precisions.split(","):
        for text in sets:
            changes = harness.parse_option_set(text) if text else {}
            if precision != "auto":
                changes["screen_precision"] = precision
            label = precision if len(sets) == 1 else text if precision == "auto" else f"{precision}+{text}"
            out[label] = changes
    return out


def run_case(case: Case, args: argparse.Namespace, device: torch.device, peers: list[harness.Peer],
             variants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every k of one case: every knng variant (:func:`knng_variants`), then every peer; one row
    per k."""
    x, q = case.make()
    rows_out = []
    graph = q is None
    xf = x if x.is_floating_point() else x.float()  # the peers take float32: the same values
    qf = None if graph else (q if q.is_floating_point() else q.float())
    flat = harness.flat_rows(x, 64, seed=0) if case.flat and graph else None
    for k in case.ks:
        n = x.shape[0]
        row: dict[str, Any] = {"task": case.task, "data": case.data, "n": n, "d": x.shape[1], "k": k,
                               "metric": case.metric, "dtype": str(x.dtype).replace("torch.", ""),
                               "knng": {}, "peers": {}}
        if not graph:
            row["nq"] = q.shape[0]
        if k >= n:
            print(f"  skipped k = {k}: not below n = {n}", flush=True)
            continue
        check = harness.oracle_rows(n if graph else q.shape[0], args.check_rows, seed=k, flat=flat)
        best = None
        for precision, changes in variants.items():
            if graph:
                call = lambda x=x, k=k: knng.graph(x, k, metric=case.metric, select=args.select)  # noqa: E731
            else:
                call = lambda x=x, q=q, k=k: knng.search(q, x, k, metric=case.metric, select=args.select)  # noqa: E731
            harness.release(device)
            with harness.option_context(changes):
                timing = harness.time_call(call, device=device, warmup=args.warmup, repeats=args.repeats)
            res = timing.result
            exact, message = harness.check_exact(x if graph else q, x, res, case.metric, exclude_self=graph,
                                                 rows=check.to(x.device))
            if exact is False:
                print(f"  {message}", flush=True)
            row["knng"][precision] = {"ms": timing.median * 1e3, **timing.as_dict(), "exact": exact,
                                      **harness.report_summary(res)}
            if best is None or timing.median < best[0]:
                best = (timing.median, torch.as_tensor(res.indices).to(device))
            del res, timing
        truth = best[1]
        for peer in peers:
            kk = k + 1 if graph else k
            if peer.max_k is not None and kk > peer.max_k:
                row["peers"][peer.name] = {"skipped": f"k above {peer.max_k}"}
                continue
            harness.release(device)
            try:
                if graph:
                    call = lambda xf=xf, k=k, peer=peer: harness.peer_graph(peer, xf, k, case.metric)  # noqa: E731
                else:
                    call = lambda xf=xf, qf=qf, k=k, peer=peer: peer.search(qf, xf, k, case.metric)  # noqa: E731
                timing = harness.time_call(call, device=device, warmup=args.warmup, repeats=args.repeats)
            except Exception as exc:  # noqa: BLE001 - a peer that fails is reported, not fatal
                row["peers"][peer.name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            row["peers"][peer.name] = {"ms": timing.median * 1e3, **timing.as_dict(),
                                       "recall": harness.recall(torch.as_tensor(timing.result).to(device), truth)}
            row[f"{peer.name.replace('-', '_')}_ms"] = timing.median * 1e3  # the keys plot_time_vs_k.py reads
            del timing
        rows_out.append(row)
        print(line(row), flush=True)
        del truth, best
    del x, q, xf, qf
    harness.release(device)
    return rows_out


def line(row: dict[str, Any]) -> str:
    """One row as a line of text."""
    shape = f"{row['n']:,} × {row['d']}" + (f", {row['nq']:,} queries" if "nq" in row else "")
    parts = [f"{row['task']} {row['data']} {shape} k={row['k']}:"]
    for p, v in row["knng"].items():
        scr = v.get("screened_per_row", {})
        parts.append(f"knng {p} {v['ms']:.1f} ms ({v.get('screen_dtype', '?')}, screened {scr.get('median', '?')}/"
                     f"{scr.get('p99', '?')}/{scr.get('max', '?')}, {'exact' if v['exact'] else v['exact']})")
    for name, v in row["peers"].items():
        parts.append(f"{name} {v['ms']:.1f} ms recall {v['recall']:.4f}" if "ms" in v
                     else f"{name} {v.get('skipped') or v.get('error')}")
    return "  ".join(parts)


def table(rows: list[dict[str, Any]], precisions: list[str], peer_names: list[str]) -> str:
    """The markdown table of every row."""
    head = (["task", "data", "shape", "k"] + [f"knng {p} (ms)" for p in precisions] + [f"{p} (ms)" for p in peer_names]
            + ["knng vs fastest peer", "screened/row (median, p99, max)", "exact"] + [f"{p} recall" for p in peer_names])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        shape = f"{r['n']:,} × {r['d']}" + (f", {r['nq']:,} q" if "nq" in r else "")
        best_p = min(r["knng"], key=lambda p: r["knng"][p]["ms"])
        best = r["knng"][best_p]
        timed = [v["ms"] for v in r["peers"].values() if "ms" in v]
        vs = f"{min(timed) / best['ms']:.2f}×" if timed else "—"
        scr = best.get("screened_per_row", {})
        cells = [r["task"], r["data"], shape, str(r["k"])]
        cells += [f"{r['knng'][p]['ms']:.1f}" if p in r["knng"] else "" for p in precisions]
        cells += [f"{r['peers'][p]['ms']:.1f}" if "ms" in r["peers"].get(p, {}) else "—" for p in peer_names]
        cells += [vs, f"{scr.get('median', '—')}, {scr.get('p99', '—')}, {scr.get('max', '—')}",
                  "yes" if all(v["exact"] for v in r["knng"].values()) else "NO"]
        cells += [f"{r['peers'][p]['recall']:.4f}" if "recall" in r["peers"].get(p, {}) else "—" for p in peer_names]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.common_arguments(ap)
    ap.add_argument("--searches", default=None, help="Gaussian searches NxD[:Q], comma-separated (Q: queries)")
    ap.add_argument("--graphs", default=None, help="Gaussian graphs NxD, comma-separated")
    ap.add_argument("--sets", default=None, help="graphs of these data sets (bench/harness.py --list), comma-separated")
    ap.add_argument("--twins", action="store_true", help="with --sets: also Gaussian points of each set's shape")
    ap.add_argument("--n", type=int, default=None, help="rows of each --sets data set (default: the set's own)")
    ap.add_argument("--queries", type=int, default=10_000, help="queries of a search (default 10,000)")
    ap.add_argument("--ks", default=None, help="k values for every case (default: the grid's)")
    ap.add_argument("--precisions", default="auto",
                    help="knng's screen precisions, each forced in turn (auto: the planner's; default auto)")
    ap.add_argument("--options", default="", help="knng option sets, each a variant of every knng call, separated "
                    "by '/' (harness.OPTION_SETS names or option=value items joined by '+'; e.g. "
                    "escalate_pairs=0/new: with and without a change, beside the peers)")
    ap.add_argument("--select", default="auto", help="knng's select= (default auto)")
    ap.add_argument("--peers", default=None, help="peers to run (default: faiss,cuvs,torch on a GPU; faiss-cpu,"
                    "sklearn on a CPU; none: no peers)")
    ap.add_argument("--check-rows", type=int, default=256, help="random rows checked against the oracle (default 256)")
    args = ap.parse_args(argv)
    harness.apply_threads(args)
    device = harness.resolve_device(args.device)
    if args.repeats is None:
        args.repeats = 1 if args.quick or device.type == "cpu" else 3
    if args.warmup is None:
        args.warmup = 1 if device.type == "cuda" else 0
    if args.quick:
        args.check_rows = min(args.check_rows, 64)
    if args.peers == "none":
        names: list[str] | None = []
    elif args.peers:
        names = args.peers.split(",")
    else:
        names = None if device.type == "cuda" else ["faiss-cpu", "sklearn"]
    peers, notes = harness.peers(device, names)
    env = harness.environment(device)
    print(f"# {env['device']}, {env['date']}, torch {env['torch']}, knng {env['knng']}; peers: "
          f"{', '.join(p.name for p in peers) or 'none'}", flush=True)
    for note in notes:
        print(f"# {note}", flush=True)
    variants = knng_variants(args.precisions, args.options)
    rows: list[dict[str, Any]] = []
    for case in default_cases(args, device):
        try:
            rows += run_case(case, args, device, peers, variants)
        except SystemExit as exc:  # a data set whose pictures are not at hand
            print(f"# {case.task} {case.data}: skipped ({exc})", flush=True)
    print()
    print(table(rows, list(variants), [p.name for p in peers]))
    harness.write_json(args.out, {**env, "peer_notes": notes, "options": variants, "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
