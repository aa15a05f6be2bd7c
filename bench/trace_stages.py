"""A chrome trace (torch.profiler) of one TF32 search of 1M × 128 Gaussian points, 10k queries
(or, with ``--graph N --precision P``, one graph of N × 128 points), with the stores' ``flush``,
``finish``, ``_take_last`` and ``_evaluate_rows`` marked (``STAGE_flush``, ...), and a summary of each marked stage:
host time, GPU kernel time and launches inside it, the torch operations that took the most
host time and the GPU kernels that took the most time. Usage (GPU machine)::

    PYTHONPATH=src python bench/trace_stages.py K OUT_DIR [--d 960] [--graph 200000 --precision float32]
    PYTHONPATH=src python bench/trace_stages.py K OUT_DIR --patches 8 --precision auto

It showed that at k = 10 the store's update is about 400 launches and a dozen synchronisations
for 1.3 ms of GPU work (``docs/BENCHMARKS.md``, "Store updates by one sort").
"""

import argparse
import collections
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import knng
import knng.engine.plan as plan
import knng.engine.store as store


#: The GPU kernels listed per stage, those that took the most time first.
KERNELS_SHOWN = 4


def marked(name: str, owner: object = store.CandidateStore) -> None:
    fn = getattr(owner, name)

    def wrapped(*args, **kwargs):
        with record_function("STAGE_" + name):
            return fn(*args, **kwargs)

    setattr(owner, name, wrapped)


def mark_graph_stages() -> None:
    """Mark a graph's own stages too: the corpus pass, each part's own block, each off-diagonal
    block's product, screen and store hand-over, and the store's seeds."""
    import knng.engine.graph as graph

    import knng.api as api
    import knng.engine.duplicates as duplicates

    marked("corpus_stats", graph)
    marked("screen_own_part", graph)
    marked("screen_own_parts_together", graph)
    marked("PreparedCorpus", graph)
    marked("_graph_report", graph)
    marked("_holding", graph)
    marked("when_uniform", graph._SharedThresholds)
    for name in ("strip_minima", "strip_candidates", "screen_own_later"):
        marked(name, graph)
    marked("slab_gain", plan)
    marked("_hold")
    marked("_duplicate_groups", api)
    marked("find_duplicates", duplicates)
    for name in ("make_graph_plan", "as_output", "resolve_device", "resolve_budget", "exact_graph"):
        marked(name, api)
    for name in ("start", "screen", "add"):
        marked(name, graph._OffDiagonalBlock)
    marked("seed")


def mark_search_stages(api_too: bool = True) -> None:
    """Mark a search's own stages: the corpus pass and preparation, the sample, the seeds, each
    tile's screen and tightening, the finish, and (``api_too``) the API's planning and output
    around them. A graph by rows is a search: its trace marks these too, not the API's twice."""
    import knng.engine.search as search

    import knng.api as api

    for name in ("prepare_corpus", "seed_sample", "_seed_from_sample", "screen_rows", "_screen_chunk",
                 "exact_pairs", "summarize_per_row_each"):
        marked(name, search)
    for name in ("tighten", "tighten_held", "_finish_held"):
        marked(name)
    if api_too:
        for name in ("make_search_plan", "as_output", "resolve_device", "resolve_budget", "exact_search",
                     "_duplicate_groups"):
            marked(name, api)


def summary(trace: Path) -> None:
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    cpu = [e for e in events if e.get("cat") == "cpu_op"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    print(f"GPU busy {sum(e['dur'] for e in gpu) / 1e3:.1f} ms of "
          f"{(max(e['ts'] + e['dur'] for e in cpu) - min(e['ts'] for e in cpu)) / 1e3:.1f} ms")
    # record_function ranges are "user_annotation" events, not "cpu_op" ones. Stages of one name
    # are summed (a graph has one per block), nested stages counted in each.
    stages = collections.defaultdict(list)
    for e in events:
        if e["name"].startswith("STAGE_") and e.get("cat") != "gpu_user_annotation":
            stages[e["name"]].append(e)
    for name, spans in stages.items():
        ops, by_kernel = collections.Counter(), collections.Counter()
        host = gpu_ms = launches = 0
        for stage in spans:
            a, b = stage["ts"], stage["ts"] + stage["dur"]
            host += stage["dur"]
            for e in cpu:
                if a <= e["ts"] < b and e["name"].startswith("aten::"):
                    ops[e["name"]] += e["dur"]
            for e in gpu:
                if a <= e["ts"] < b:
                    gpu_ms += e["dur"]
                    launches += 1
                    by_kernel[e["name"][:60]] += e["dur"]
        top = ", ".join(f"{n} {d / 1e3:.1f}" for n, d in ops.most_common(5))
        heavy = ", ".join(f"{n} {d / 1e3:.1f}" for n, d in by_kernel.most_common(KERNELS_SHOWN))
        print(f"{name} ×{len(spans)}: host {host / 1e3:.1f} ms, GPU {gpu_ms / 1e3:.1f} ms in {launches} launches; "
              f"host ops: {top}; kernels: {heavy}")


def idle_gaps(trace: Path, count: int = 12) -> None:
    """The longest stretches with no GPU work, each with the innermost marked stage and the
    torch operations the host ran during it (where the host kept the GPU waiting)."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    cpu = [e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")]
    stages = [e for e in events if e["name"].startswith("STAGE_") and e.get("cat") != "gpu_user_annotation"]
    gaps = []
    end = gpu[0]["ts"] + gpu[0]["dur"]
    for e in gpu[1:]:
        if e["ts"] > end:
            gaps.append((e["ts"] - end, end, e["ts"]))
        end = max(end, e["ts"] + e["dur"])
    print(f"GPU idle between kernels: {sum(g[0] for g in gaps) / 1e3:.1f} ms in {len(gaps)} gaps; longest:")
    for dur, a, b in sorted(gaps, reverse=True)[:count]:
        inner = [st for st in stages if st["ts"] <= a <= st["ts"] + st["dur"]]
        name = min(inner, key=lambda st: st["dur"])["name"] if inner else "-"
        ops = collections.Counter(e["name"] for e in cpu if a <= e["ts"] < b)
        print(f"  {dur / 1e3:6.2f} ms in {name}: " + ", ".join(f"{n} ×{c}" for n, c in ops.most_common(6)))


def idle_by_stage(trace: Path, count: int = 25) -> None:
    """GPU idle time summed by the innermost marked stage open when each gap began (where the
    host, not the GPU, set the pace), with the gaps' count."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    stages = [e for e in events if e["name"].startswith("STAGE_") and e.get("cat") != "gpu_user_annotation"]
    by_stage: collections.Counter = collections.Counter()
    gaps: collections.Counter = collections.Counter()
    end = gpu[0]["ts"] + gpu[0]["dur"]
    for e in gpu[1:]:
        if e["ts"] > end:
            inner = [st for st in stages if st["ts"] <= end <= st["ts"] + st["dur"]]
            name = min(inner, key=lambda st: st["dur"])["name"] if inner else "-"
            by_stage[name] += e["ts"] - end
            gaps[name] += 1
        end = max(end, e["ts"] + e["dur"])
    print("GPU idle by innermost stage:")
    for name, idle in by_stage.most_common(count):
        print(f"  {idle / 1e3:6.2f} ms in {gaps[name]:4d} gaps: {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("k", type=int)
    ap.add_argument("out", type=Path)
    ap.add_argument("--graph", type=int, default=0, help="trace a graph of this many points instead")
    ap.add_argument("--precision", default="tf32", help="a screen precision, or auto (the planner's)")
    ap.add_argument("--d", type=int, default=128, help="dimension of the points")
    ap.add_argument("--kernels", type=int, default=4, help="GPU kernels listed per stage")
    ap.add_argument("--stacks", type=int, default=0,
                    help="also print the GPU time of the torch operations grouped by this many Python frames")
    ap.add_argument("--patches", type=int, choices=(8, 16), default=0,
                    help="trace a graph of image patches of this side (.carry/pictures.npz, bench/bench_patches.py)")
    args = ap.parse_args()
    k, out = args.k, args.out
    global KERNELS_SHOWN
    KERNELS_SHOWN = args.kernels
    for name in ("flush", "finish", "_take_last", "_evaluate_rows"):
        marked(name)
    if args.graph or args.patches:
        mark_graph_stages()
        mark_search_stages(api_too=False)
    else:
        mark_search_stages()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    if args.precision != "auto":
        knng.options(screen_precision=args.precision).__enter__()  # for the rest of the process
    if args.patches:
        import sys

        import numpy as np
        sys.path.insert(0, "bench")
        from bench_patches import patches

        stride = {8: 2, 16: 3}[args.patches]
        x = torch.from_numpy(patches(dict(np.load(".carry/pictures.npz")), args.patches, stride, 12)).to(dev)
        call, tag = (lambda: knng.graph(x, k)), f"patches{args.patches}"
    elif args.graph:
        x = torch.randn((args.graph, args.d), device=dev, generator=gen)
        call, tag = (lambda: knng.graph(x, k)), f"graph{args.graph}"
    else:
        x = torch.randn((1_000_000, args.d), device=dev, generator=gen)
        q = torch.randn((10_000, args.d), device=dev, generator=gen)
        call, tag = (lambda: knng.search(q, x, k)), f"search{args.d}"
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=args.stacks > 0) as prof:
        with record_function("STAGE_call"):
            call()
            torch.cuda.synchronize()
    trace = out / f"trace_{tag}_{args.precision}_k{k}.json"
    prof.export_chrome_trace(str(trace))
    summary(trace)
    idle_gaps(trace)
    idle_by_stage(trace)
    if args.stacks:
        print(prof.key_averages(group_by_stack_n=args.stacks).table(sort_by="self_cuda_time_total", row_limit=30,
                                                                    max_name_column_width=60))


if __name__ == "__main__":
    main()
