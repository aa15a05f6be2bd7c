"""Small and medium calls: ``knng.graph`` and ``knng.search`` against the peers a user would pick
for them, in one process, on Gaussian points in 128 dimensions (k = 10).

Where a call is mostly fixed cost (planning, preparation, seeds, stores: a few hundred small
operations whatever the size), knng loses to a plain product and top-k; this shows where it
starts to win. On a GPU the peer is torch's mm + topk on the ‖x‖² + ‖y‖² − 2xᵀy expansion
(inexact, no exactness machinery: the floor of a call's fixed cost); on a CPU faiss-cpu's
``IndexFlatL2`` (optional) and scikit-learn's brute-force ``NearestNeighbors``. A graph is the
points against themselves (k + 1, self included, for the peers); a search is 1,000 queries
(GPU) or 200 (CPU) against the points. Median of ``--repeats`` calls after one; every knng
answer is checked exact on 32 rows against the float64 oracle (``tests/oracle.py``). Usage
(repository root)::

    PYTHONPATH=src:tests python bench/small_calls.py --device cuda --sizes 2000,20000,100000
    PYTHONPATH=src:tests python bench/small_calls.py --device cpu --sizes 500,2000,10000
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

import knng

sys.path.insert(0, "tests")
from oracle import assert_exact_chunked  # noqa: E402


def median_ms(call, repeats: int, device: torch.device):
    result = call()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return result, times[len(times) // 2]


def mm_topk(queries: torch.Tensor, corpus: torch.Tensor, k: int, rows: int = 16384):
    """k smallest of ‖q‖² + ‖x‖² − 2qᵀx per query, ``rows`` queries at a time."""
    norms = (corpus * corpus).sum(1)[None]
    values, indices = [], []
    for q in queries.split(rows):
        found = torch.topk((q * q).sum(1)[:, None] + norms - 2 * q @ corpus.T, k, dim=1, largest=False)
        values.append(found.values)
        indices.append(found.indices)
    return torch.cat(values), torch.cat(indices)


def peers(device: torch.device):
    """name -> (graph(x, k), search(q, x, k)) of the peers on ``device``."""
    if device.type == "cuda":
        return {"torch mm+topk": (lambda x, k: mm_topk(x, x, k + 1), mm_topk)}
    from sklearn.neighbors import NearestNeighbors

    out = {"scikit-learn": (
        lambda x, k: NearestNeighbors(n_neighbors=k + 1, algorithm="brute").fit(x).kneighbors(x),
        lambda q, x, k: NearestNeighbors(n_neighbors=k, algorithm="brute").fit(x).kneighbors(q))}
    try:
        import faiss
    except ImportError:
        return out

    def flat(x):
        index = faiss.IndexFlatL2(x.shape[1])
        index.add(x)
        return index

    out["faiss-cpu"] = (lambda x, k: flat(x).search(x, k + 1), lambda q, x, k: flat(x).search(q, k))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", default="2000,20000,100000")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    device, k = torch.device(args.device), args.k
    gen = torch.Generator(device=device).manual_seed(0)
    others = peers(device)
    for n in (int(s) for s in args.sizes.split(",")):
        x = torch.randn((n, 128), device=device, generator=gen)
        q = torch.randn((1000 if device.type == "cuda" else 200, 128), device=device, generator=gen)
        xs, qs = (x, q) if device.type == "cuda" else (x.numpy(), q.numpy())
        g, graph_ms = median_ms(lambda: knng.graph(xs, k, device=device), args.repeats, device)
        s, search_ms = median_ms(lambda: knng.search(qs, xs, k, device=device), args.repeats, device)
        rows = torch.arange(0, n, max(1, n // 32), device=device)
        assert_exact_chunked(x, x, [(torch.as_tensor(g.indices), torch.as_tensor(g.distances))], exclude_self=True,
                             rows=rows)
        assert_exact_chunked(q, x, [(torch.as_tensor(s.indices), torch.as_tensor(s.distances))],
                             rows=torch.arange(0, q.shape[0], max(1, q.shape[0] // 32), device=device))
        line = f"n = {n:>7,}: knng graph {graph_ms:8.2f} ms, search {search_ms:7.2f} ms (exact)"
        for name, (graph, search) in others.items():
            _, peer_graph = median_ms(lambda: graph(xs, k), args.repeats, device)
            _, peer_search = median_ms(lambda: search(qs, xs, k), args.repeats, device)
            line += f"; {name} {peer_graph:8.2f} / {peer_search:7.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
