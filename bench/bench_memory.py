"""GPU memory of a graph against its budget: the peak, the time, and what is allocated at the peak.

For each budget (issue 55: "memory that follows need"), a warm-up call, then ``--repeats`` timed
calls; each reports its peak (``torch.cuda.max_memory_allocated`` less what was allocated before
the call: the input and the caller's tensors are not counted), the plan and its time. With
``--sites N`` the last call also records the allocator's history and prints the N call sites
whose blocks were live at the peak (replayed from ``torch.cuda.memory._snapshot``), the way to
see what a change should go after. ``--held GB`` first allocates that much of the card as the
caller's own tensors, as a program sharing the GPU would (issue 55, item 2). Every answer is
compared with the first budget's, bit for bit::

    PYTHONPATH=src:tests python bench/bench_memory.py --data patches8 --k 100 --budgets ,8GB,4GB --sites 6
    PYTHONPATH=src:tests python bench/bench_memory.py --data gauss --n 1000000 --budgets , --held 100
    PYTHONPATH=src:tests python bench/bench_memory.py --budgets 4GB --options graph_method=symmetric

A budget of "" is the default (``memory_budget=None``). Old and new trees: run the script with each
tree's ``src`` first on ``PYTHONPATH`` (it imports knng from there).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import torch

import knng

import harness


def peak_sites(snapshot: dict, top: int) -> list[tuple[float, int, str]]:
    """The ``top`` call sites (knng's frames) with the most bytes live at the peak of
    ``snapshot``'s first device trace: (GiB, blocks, site)."""
    live: dict[int, dict] = {}
    current = best = 0
    at_peak: dict[int, dict] = {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
            if current > best:
                best, at_peak = current, dict(live)
        elif event["action"] == "free_requested":
            freed = live.pop(event["addr"], None)
            if freed is not None:
                current -= freed["size"]
    size: collections.Counter[str] = collections.Counter()
    blocks: collections.Counter[str] = collections.Counter()
    for event in at_peak.values():
        frames = [f for f in event.get("frames", []) if "knng" in f["filename"]]
        site = " < ".join(f"{f['filename'].split('knng/')[-1]}:{f['line']}:{f['name']}" for f in frames[:3])
        size[site] += event["size"]
        blocks[site] += 1
    return [(s / 2**30, blocks[site], site) for site, s in size.most_common(top)]


def measure(x: torch.Tensor, k: int, budget: str | None, sites: int) -> tuple[dict, knng.Graph]:
    """One call's peak, time and plan (and its peak's sites where ``sites``)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    if sites:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    start = time.perf_counter()
    graph = knng.graph(x, k, memory_budget=budget)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - before
    found = []
    if sites:
        found = peak_sites(torch.cuda.memory._snapshot(), sites)
        torch.cuda.memory._record_memory_history(enabled=None)
    plan = graph.report.plan
    # The report's own figure (None from trees before it had one), which should equal ``peak``.
    report_peak = getattr(graph.report, "device_peak", None)
    row = dict(budget=budget or "default", planned_budget=plan.budget, seconds=seconds, peak=peak,
               report_peak=report_peak,
               method=plan.graph_method, parts=plan.parts, part_size=plan.part_size,
               bytes_expected=plan.bytes_expected, oom_retries=graph.report.oom_retries,
               sites=[dict(gib=g, blocks=b, site=s) for g, b, s in found])
    return row, graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="patches8", help="a data set of harness.DATASETS (default patches8)")
    parser.add_argument("--n", type=int, default=None, help="rows (default: the set's size)")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--budgets", default=",8GB", help="comma-separated; empty for the default budget")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sites", type=int, default=0, help="call sites live at the peak to print (last call)")
    parser.add_argument("--held", type=float, default=0.0, help="GB of the card the caller holds first")
    parser.add_argument("--options", default="", help="an option set of bench/harness.py (ab.py --list), "
                        "e.g. graph_method=symmetric")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_memory needs a GPU")
    data, _ = harness.load_dataset(args.data, args.n)
    x = torch.from_numpy(data).cuda()
    held = torch.empty(int(args.held * 1e9), dtype=torch.uint8, device="cuda") if args.held else None
    rows: list[dict] = []
    with harness.option_context(harness.parse_option_set(args.options)):
        run_budgets(args, x, rows)
    del held
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, options=args.options,
                           rows=rows), f, indent=1)


def run_budgets(args: argparse.Namespace, x: torch.Tensor, rows: list[dict]) -> None:
    """Every budget of ``args``: a warm-up, then the measured calls (their rows appended to ``rows``)."""
    reference = None
    for budget in (b.strip() or None for b in args.budgets.split(",")):
        knng.graph(x, args.k, memory_budget=budget)  # warm-up: kernels, caches
        knng.wait_for_kernels()
        torch.cuda.empty_cache()
        for repeat in range(args.repeats):
            row, graph = measure(x, args.k, budget, args.sites if repeat == args.repeats - 1 else 0)
            if reference is None:
                reference = graph
            row["same_as_first"] = bool(torch.equal(graph.indices, reference.indices)
                                        and torch.equal(graph.distances, reference.distances))
            row.update(data=args.data, n=x.shape[0], d=x.shape[1], k=args.k, held_gb=args.held, options=args.options)
            rows.append(row)
            print(f"MEM {args.data} k={args.k} budget={row['budget']} ({row['planned_budget'] / 2**30:.1f} GiB planned)"
                  f": {row['seconds']:.3f} s, peak {row['peak'] / 2**30:.2f} GiB"
                  + ("" if row["report_peak"] is None else f" (report: {row['report_peak'] / 2**30:.2f})")
                  + f"; {row['method']}, {row['parts']} parts"
                  f" of {row['part_size']}, expected {row['bytes_expected'] / 2**30:.2f} GiB, "
                  f"retries {row['oom_retries']}, same as the first: {row['same_as_first']}", flush=True)
            for site in row["sites"]:
                print(f"MEM   {site['gib']:6.2f} GiB in {site['blocks']:3d} blocks  {site['site']}", flush=True)
            del graph
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
