"""Query rows per chunk of a kernel-screened GPU search (``plan.KERNEL_SEARCH_ROWS``), measured on
the data searched against themselves (k + 1, each point dropped from its own row: a graph by
the rows method), against ``knng.graph`` in the same process.

From the repository root on a GPU machine::

    PYTHONPATH=src:tests python bench/ab_search_rows.py 200000:128:10,200000:128:100,1000000:128:10

For each N:D:K: ``knng.graph`` (the planner's method), then the search at chunks of 16,384 /
65,536 / 131,072 rows (the sample kept within 2³⁰ score entries, as the planner's eighth of the
budget does), median of 3 after a warm-up, whether each gives the graph's answer bit for bit,
and whether 128 rows of the graph are exact against the float64 oracle (``tests/oracle.py``).
It measured the chunk sizes quoted at ``plan.KERNEL_SEARCH_ROWS`` (2026-11-25, H100).
"""
import dataclasses
import statistics
import sys
import time

import torch

import knng
import knng.api
from oracle import assert_exact_chunked

ROWS = (16384, 65536, 131072)
chunk_rows = 0  # 0: the planner's own chunks
planner = knng.api.make_search_plan


def chunked_plan(**kw):
    plan = planner(**kw)
    if chunk_rows:
        rows = min(chunk_rows, kw["n_queries"])
        sample = max(min(plan.sample_size, (1 << 30) // rows), 16 * kw["k"])
        plan = dataclasses.replace(plan, query_rows=rows, sample_size=min(sample, kw["n_corpus"]))
    return plan


knng.api.make_search_plan = chunked_plan


def graph_by_search(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    nn = knng.search(x, x, k + 1)
    idx, dist = torch.as_tensor(nn.indices), torch.as_tensor(nn.distances)
    n = idx.shape[0]
    keep = idx != torch.arange(n, device=idx.device)[:, None]
    keep[keep.all(dim=1), k] = False
    return idx[keep].view(n, k), dist[keep].view(n, k)


def timed(fn, repeats: int = 3):
    out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, out


def main() -> None:
    global chunk_rows
    dev = torch.device("cuda")
    for spec in sys.argv[1].split(","):
        n, d, k = (int(v) for v in spec.split(":"))
        x = torch.randn((n, d), device=dev, generator=torch.Generator(device=dev).manual_seed(n + d))
        chunk_rows = 0
        t_graph, g = timed(lambda: knng.graph(x, k))
        gi, gd = torch.as_tensor(g.indices), torch.as_tensor(g.distances)
        line = f"n={n} d={d} k={k}: graph {t_graph:7.1f} ms ({g.report.plan.graph_method})"
        for rows in ROWS:
            if rows > 16384 and rows // 2 >= n:
                continue
            chunk_rows = rows
            t, (si, sd) = timed(lambda: graph_by_search(x, k))
            same = torch.equal(si, gi) and torch.equal(sd, gd.to(sd.dtype))
            line += f" | rows {rows} {t:7.1f} ms same={same}"
        check = torch.randperm(n, generator=torch.Generator().manual_seed(k))[:128].to(dev)
        assert_exact_chunked(x, x, [g], "euclidean", exclude_self=True, rows=check, device=dev)
        print(line + " | graph exact", flush=True)


if __name__ == "__main__":
    main()
