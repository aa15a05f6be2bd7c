"""knng.radius against the peers a user would pick for radius queries, in one process.

On a CPU the peers are scikit-learn (``NearestNeighbors(algorithm="brute").radius_neighbors``)
and faiss-cpu (``IndexFlatL2.range_search``, whose test is strict: ``<``), on a GPU torch's
float32 expansion, a matrix product and a compare by blocks of queries (inexact), and FAISS's
GPU emulation ``faiss.contrib.exhaustive_search.range_search_gpu`` (``faiss-gpu``: a GPU k-NN
search with k the power of 2 above the 99th percentile of a row's neighbour count, at most
2,048, rows it cannot settle by FAISS's CPU range search; FAISS has no GPU range search); torch on a CPU on request (``--peers``). The radius of each data set is the median distance of its queries'
``--neighbours``-th nearest corpus vector (``knng.search`` of 256 of them), so that a query has
about that many neighbours.

knng's answer is checked against the float64 oracle by differences (``tests/oracle.py``,
``assert_radius_exact``) on its first ``--check-rows`` queries; each peer's recall is the share
of knng's exact pairs it returns, its excess the pairs it returns beyond them (rounding at the
radius). Times: ``harness.time_call`` (CUDA events on a GPU), median and min of ``--repeats``.

Usage (repository root)::

    PYTHONPATH=src:tests python bench/bench_radius.py --device cpu --corpus 100000 --d 64 --queries 1000
    PYTHONPATH=src:tests python bench/bench_radius.py --device cpu --sets descriptors,points --queries 500
    PYTHONPATH=src:tests python bench/bench_radius.py --device cuda --corpus 1000000 --d 128 --queries 10000
    PYTHONPATH=src:tests python bench/bench_radius.py --device cuda --peers torch,faiss-gpu --sets gauss,patches8
    PYTHONPATH=src:tests python bench/bench_radius.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import knng  # noqa: E402
from oracle import assert_radius_exact  # noqa: E402


def radius_for(queries: torch.Tensor, corpus: torch.Tensor, neighbours: int) -> float:
    """The median distance of 256 queries' ``neighbours``-th nearest corpus vector."""
    found = knng.search(queries[:256], corpus, neighbours)
    return float(torch.as_tensor(found.distances)[:, -1].median())


def pair_set(indptr: np.ndarray, indices: np.ndarray) -> set[tuple[int, int]]:
    """The (query, corpus) pairs of a CSR answer."""
    rows = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return set(zip(rows.tolist(), np.asarray(indices).tolist()))


def peer_calls(names: list[str], device: torch.device, queries: torch.Tensor, corpus: torch.Tensor,
               radius: float, gpu_k: int = 1024
               ) -> tuple[dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]], list[str]]:
    """Each available peer's radius query as a call returning CSR ``(indptr, indices)``; ``gpu_k``:
    the k of FAISS's GPU emulation (rows whose k-th neighbour is within the radius go to its CPU
    range search)."""
    calls: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {}
    notes = []
    q_np, c_np = queries.cpu().numpy(), corpus.cpu().numpy()
    if "sklearn" in names:
        try:
            from sklearn.neighbors import NearestNeighbors

            fitted = NearestNeighbors(radius=radius, algorithm="brute").fit(c_np)

            def sklearn_call() -> tuple[np.ndarray, np.ndarray]:
                graph = fitted.radius_neighbors_graph(q_np, mode="connectivity")
                return graph.indptr, graph.indices

            calls["sklearn"] = sklearn_call
        except ImportError:
            notes.append("scikit-learn not importable")
    if "faiss" in names:
        try:
            import faiss

            index = faiss.IndexFlatL2(c_np.shape[1])
            index.add(np.ascontiguousarray(c_np))

            def faiss_call() -> tuple[np.ndarray, np.ndarray]:
                lims, _, ids = index.range_search(np.ascontiguousarray(q_np), radius * radius)
                return lims.astype(np.int64), ids.astype(np.int64)

            calls["faiss"] = faiss_call
        except ImportError:
            notes.append("faiss not importable")
    if "faiss-gpu" in names:
        try:
            import faiss
            from faiss.contrib.exhaustive_search import range_search_gpu

            resources = faiss.StandardGpuResources()
            on_gpu = faiss.GpuIndexFlatL2(resources, c_np.shape[1])
            on_gpu.add(np.ascontiguousarray(c_np))
            on_host = faiss.IndexFlatL2(c_np.shape[1])
            on_host.add(np.ascontiguousarray(c_np))

            def faiss_gpu_call() -> tuple[np.ndarray, np.ndarray]:
                lims, _, ids = range_search_gpu(np.ascontiguousarray(q_np), radius * radius, on_gpu, on_host,
                                                gpu_k=gpu_k)
                return lims.astype(np.int64), ids.astype(np.int64)

            calls["faiss-gpu"] = faiss_gpu_call
        except (ImportError, AttributeError) as exc:
            notes.append(f"faiss-gpu not usable: {exc}")
    if "torch" in names:
        squares = (corpus * corpus).sum(1)

        def torch_call() -> tuple[np.ndarray, np.ndarray]:
            rows, cols = [], []
            for q0 in range(0, queries.shape[0], 1024):
                q = queries[q0:q0 + 1024]
                scores = torch.addmm(squares, q * -2, corpus.T) + (q * q).sum(1)[:, None]
                r, c = torch.nonzero(scores <= radius * radius, as_tuple=True)
                rows.append(r + q0)
                cols.append(c)
            r, c = torch.cat(rows).cpu().numpy(), torch.cat(cols).cpu().numpy()
            indptr = np.zeros(queries.shape[0] + 1, dtype=np.int64)
            np.cumsum(np.bincount(r, minlength=queries.shape[0]), out=indptr[1:])
            return indptr, c[np.lexsort((c, r))]

        calls["torch"] = torch_call
    return calls, notes


def run_set(name: str, corpus: torch.Tensor, queries: torch.Tensor, args: argparse.Namespace,
            device: torch.device, peers: list[str]) -> dict[str, Any]:
    """Time knng.radius and the peers on one data set; check knng; each peer's recall."""
    radius = radius_for(queries, corpus, args.neighbours)
    warmup, repeats = args.warmup or 1, args.repeats or 5
    timing = harness.time_call(lambda: knng.radius(queries, corpus, radius), device=device, warmup=warmup,
                               repeats=repeats)
    found = timing.result
    indptr, indices = (np.asarray(torch.as_tensor(v).cpu()) for v in (found.indptr, found.indices))
    rows = min(args.check_rows, queries.shape[0])
    sub = (indptr[:rows + 1], np.asarray(torch.as_tensor(found.indices).cpu())[:indptr[rows]],
           np.asarray(torch.as_tensor(found.distances).cpu())[:indptr[rows]])
    try:
        assert_radius_exact(sub, queries[:rows].cpu().numpy(), corpus.cpu().numpy(), radius)
        exact = True
    except AssertionError as exc:
        exact, note = False, str(exc)[:200]
        print(f"  knng NOT exact on {name}: {note}")
    truth = pair_set(indptr, indices)
    out: dict[str, Any] = {
        "set": name, "n": int(corpus.shape[0]), "d": int(corpus.shape[1]), "queries": int(queries.shape[0]),
        "radius": radius, "pairs": len(truth), "knng": {"median_ms": statistics.median(timing.times) * 1e3,
                                                       "min_ms": min(timing.times) * 1e3, "exact": exact,
                                                       "stages": found.report.stages}}
    # FAISS's k-NN emulation settles on the GPU the rows with fewer than k neighbours; tuned for
    # it here from knng's answer: k the power of 2 above the 99th percentile of a row's count
    # (at most 2,048, FAISS's GPU limit).
    p99 = int(np.percentile(np.diff(indptr), 99)) if indptr.size > 1 else 0
    gpu_k = min(2048, 1 << max(5, p99.bit_length()))
    out["faiss_gpu_k"] = gpu_k
    calls, notes = peer_calls(peers, device, queries, corpus, radius, gpu_k)
    for peer, call in calls.items():
        t = harness.time_call(call, device=device, warmup=warmup, repeats=repeats)
        got = pair_set(*t.result)
        out[peer] = {"median_ms": statistics.median(t.times) * 1e3, "min_ms": min(t.times) * 1e3,
                     "recall": len(got & truth) / max(1, len(truth)), "excess": len(got - truth)}
    out["notes"] = notes
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.common_arguments(ap, repeats=5)
    ap.add_argument("--corpus", type=int, default=100_000, help="Gaussian corpus vectors (default 100,000)")
    ap.add_argument("--d", type=int, default=64, help="Gaussian dimension (default 64)")
    ap.add_argument("--queries", type=int, default=1000, help="queries (default 1,000)")
    ap.add_argument("--neighbours", type=int, default=20, help="neighbours a query has, about (default 20)")
    ap.add_argument("--sets", default="gauss", help="data sets of harness.DATASETS (default gauss)")
    ap.add_argument("--peers", default=None, help="peers (default: sklearn,faiss on a CPU; torch on a GPU)")
    ap.add_argument("--check-rows", type=int, default=64, help="queries checked against the oracle (default 64)")
    args = ap.parse_args(argv)
    harness.apply_threads(args)
    device = harness.resolve_device(args.device)
    if args.quick:
        args.corpus, args.d, args.queries, args.repeats = 3000, 16, 100, args.repeats or 2
    peers = args.peers.split(",") if args.peers else (["torch"] if device.type == "cuda" else ["sklearn", "faiss"])
    results = []
    for name in args.sets.split(","):
        if name == "gauss":
            corpus = harness.gaussian(args.corpus, args.d, 0, device)
            queries = harness.gaussian(args.queries, args.d, 1, device)
        else:
            data, spec = harness.load_dataset(name, n=args.corpus + args.queries, pictures=args.pictures)
            if spec.metric not in ("euclidean", "sqeuclidean"):
                print(f"{name}: metric {spec.metric}, which radius queries do not serve; skipped")
                continue
            tensor = torch.from_numpy(np.ascontiguousarray(data)).to(device)
            corpus, queries = tensor[args.queries:], tensor[:args.queries]
        r = run_set(name, corpus, queries, args, device, peers)
        results.append(r)
        line = (f"radius {name} {r['queries']:,} queries in {r['n']:,} × {r['d']} (r = {r['radius']:.4g}, "
                f"{r['pairs'] / max(1, r['queries']):.1f} a query): knng {r['knng']['median_ms']:.1f} ms "
                f"({'exact' if r['knng']['exact'] else 'NOT EXACT'})")
        for peer in peers:
            if peer in r:
                p = r[peer]
                line += f"  {peer} {p['median_ms']:.1f} ms recall {p['recall']:.4f} (+{p['excess']})"
        print(line, flush=True)
    print("\n| data | shape | queries | pairs a query | knng (ms) | " + " | ".join(f"{p} (ms)" for p in peers) +
          " | knng vs fastest peer |")
    print("|---|---|---|---|---|" + "---|" * len(peers) + "---|")
    for r in results:
        times = [r[p]["median_ms"] for p in peers if p in r]
        ratio = f"{min(times) / r['knng']['median_ms']:.2f}×" if times else "—"
        print(f"| {r['set']} | {r['n']:,} × {r['d']} | {r['queries']:,} | {r['pairs'] / max(1, r['queries']):.1f} | "
              f"{r['knng']['median_ms']:.1f} | " + " | ".join(f"{r[p]['median_ms']:.1f}" if p in r else "—"
                                                         for p in peers) + f" | {ratio} |")
    harness.write_json(args.out, {**harness.environment(device), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
