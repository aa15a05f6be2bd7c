"""Where the time of one GPU search or graph goes, stage by stage.

Wraps the engine's stages (corpus preparation, sample product and seeds, the screen, the
stores' updates and finish) in functions that synchronise the GPU before and after, then runs
each configuration twice (the first warms the kernels) and prints the stage totals of the
second. Usage::

    PYTHONPATH=src python bench/stage_times.py search 1000000 128 tf32,float32 10,100
    PYTHONPATH=src python bench/stage_times.py graph 200000 128 float32 10

Arguments: task, n, d, screen precisions (the planner's choice is overridden), k values, and
for a search optionally the number of queries (default 10,000). Gaussian data. ``--calls N``
prints the stages of N timed calls each, not only one (how the sample drawn on the host made
one search in three 40 ms slower showed up).
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

import knng
import knng.api as api
import knng.engine.graph as graph
import knng.engine.search as search
import knng.engine.store as store

TOTALS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def synced(owner, name: str) -> None:
    """Replace ``owner.name`` by a version that adds its synchronised time to TOTALS."""
    fn = getattr(owner, name)

    def timed(*args, **kwargs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        TOTALS[name] += time.perf_counter() - t0
        CALLS[name] += 1
        return out

    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", choices=["search", "graph"])
    ap.add_argument("n", type=int)
    ap.add_argument("d", type=int)
    ap.add_argument("precisions")
    ap.add_argument("ks")
    ap.add_argument("queries", type=int, nargs="?", default=10_000)
    ap.add_argument("--calls", type=int, default=1, help="timed calls per configuration")
    args = ap.parse_args()
    if args.task == "search":
        stages = [(search, "prepare_corpus"), (search, "sample_columns"), (search, "block_scores"),
                  (search, "seed_candidates"), (search, "screen_rows"), (store.CandidateStore, "screen_thresholds"),
                  (store.CandidateStore, "tighten")]
    else:
        # Top-level stages of a GPU graph first (they add up to about the call), then stages
        # inside them (their times are also in their callers').
        stages = [(api, "_duplicate_groups"), (api, "make_graph_plan"), (graph, "corpus_stats"),
                  (graph, "PrincipalFrames"), (graph, "PreparedCorpus"), (graph._SharedThresholds, "when_uniform"),
                  (graph, "screen_own_parts_together"), (graph, "screen_own_part"), (graph, "_off_diagonal_blocks"),
                  (graph, "_graph_by_rows"), (graph, "pair_scores"), (graph, "screen_pairs"),
                  (graph._OffDiagonalBlock, "start"), (graph._OffDiagonalBlock, "screen"),
                  (graph._OffDiagonalBlock, "add"), (store.CandidateStore, "tighten_held")]
    for owner, name in stages + [(store.CandidateStore, "seed"), (store.CandidateStore, "flush"),
                                 (store.CandidateStore, "finish")]:
        synced(owner, name)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((args.n, args.d), device=dev, generator=gen)
    q = torch.randn((args.queries, args.d), device=dev, generator=gen)
    for precision in args.precisions.split(","):
        knng.options(screen_precision=precision).__enter__()  # for the rest of the process
        for k in [int(v) for v in args.ks.split(",")]:
            run = (lambda: knng.search(q, x, k)) if args.task == "search" else (lambda: knng.graph(x, k))
            run()
            for _ in range(args.calls):
                torch.cuda.synchronize()
                TOTALS.clear()
                CALLS.clear()
                t0 = time.perf_counter()
                result = run()
                torch.cuda.synchronize()
                wall = time.perf_counter() - t0
                p = result.report.plan
                print(f"{args.task} {args.n}×{args.d} {precision} k={k}: {1e3 * wall:.1f} ms; tiles {p.query_rows} × "
                      f"{p.corpus_cols}; screened per row {result.report.screened_per_row}; "
                      f"evaluated {result.report.evaluations_per_row}")
                print("   " + "; ".join(f"{name} {1e3 * s:.1f} ms/{CALLS[name]}"
                                        for name, s in sorted(TOTALS.items(), key=lambda kv: -kv[1])), flush=True)
                if args.task == "graph":
                    top = ("_duplicate_groups", "make_graph_plan", "corpus_stats", "PrincipalFrames", "PreparedCorpus",
                           "when_uniform", "screen_own_parts_together", "screen_own_part", "_off_diagonal_blocks",
                           "_graph_by_rows", "finish")
                    print(f"   not in a top-level stage: {1e3 * (wall - sum(TOTALS[n] for n in top)):.1f} ms")


if __name__ == "__main__":
    main()
