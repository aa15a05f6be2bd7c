"""A/B of whole knng calls: option sets in one process, or two source trees in alternating processes.

Every answer is checked against the float64 oracle by differences (``tests/oracle.py``) on 192
rows of a graph (128 random, 64 of flat patches where there are) or 128 of a search, and every
variant prints one line::

    AB <variant> <case> k=<k>: min <ms> ms all [<ms>, ...] exact on <rows> rows; screened/row <median>/<p99>/<max>, evaluated p99 <p99>, escalated <rows>

**Option sets of this tree, in one process** (the way to compare settings: fresh processes of
the same code have run at one of two speeds, steady within a process). A TAG of names joined by
``/`` times the call under each set, alternating call by call after a warm-up of each::

    PYTHONPATH=src:tests python bench/ab.py new/mmasync/notri p16,g200k
    PYTHONPATH=src:tests python bench/ab.py float16/float32 g200k10 --stages
    PYTHONPATH=src:tests python bench/ab.py new/gpu_sample=16384+gpu_search_cols=131072 s1m100

A set is a name of ``harness.OPTION_SETS`` (``--list`` prints them), or ``option=value`` items
of ``knng.options`` joined with ``+`` (``kernels.row_kth=off`` forces one kernel off). A TAG
without ``/`` is one set, run alone (a name or an inline set applies its options; any other
word, such as ``old`` or ``new``, is only a label).

**Two source trees** (an old commit's ``src/`` copied into an ignored folder): the same script,
run alternately with each tree on ``PYTHONPATH``, twice, on one machine, from the repository
root::

    for i in 1 2; do
      PYTHONPATH=.carry/old/src:tests python bench/ab.py old p8,p16,g200k10,s1m100
      PYTHONPATH=src:tests python bench/ab.py new p8,p16,g200k10,s1m100
    done

CASES (comma-separated; default ``p8,p16,g200k,s128``):

* ``p8``, ``p16``: graphs of the benchmark's 8×8 / 16×16 image patches (``harness.patches``;
  the pictures from ``.carry/pictures.npz``: ``python bench/harness.py --save-images``), k = 10, 100;
* ``g200kK``, ``g1mK``: graphs of 200k / 1M × 128 Gaussian points at k = K (10 by default);
* ``s200kK``, ``s1mK``: 10k queries against 200k (K = 100 by default) / 1M × 128 points at k = K;
* ``gN_D_K``: a graph of N × D Gaussian points at k = K; ``qN_D_K``: 10k queries against them;
* ``wide``: the 16,384 × 4,096 graph at k = 1,024;
* ``SET[@N]:K[,K...]``: a graph of a data set of ``harness.DATASETS`` (its metric), e.g.
  ``descriptors:10,100``, ``photons@5000:10``, ``embeddings@200000:10`` (photons, and the same counts as
  uint8, ``photons_u8``, are drawn on the GPU there);
* any other name (``s128``): 10k queries against 1M × 128 points at k = 10 and 100.

Min and all of 3 calls after a warm-up (5 for searches; ``--repeats``). ``--stages`` adds the
report's pipeline stages (``result.report.stages``), ``--checksum`` a hash of each answer
(variants must agree bit for bit), ``--syncs`` the host synchronisations of one more call by
knng call site, ``--profile DIR`` a ``torch.profiler`` table and chrome trace of one more call.
Those extras go on lines of their own, after the ``AB`` line. On a CPU (``--device cpu``,
``--quick``) every option set runs too; the GPU options change nothing there.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import knng  # noqa: E402

DEFAULT_CASES = "p8,p16,g200k,s128"
#: Settings of the old ``bench/ab_exact_calls.py`` that were module constants, not knng options:
#: bench/ sets no module attribute, so they are gone (``norowkth`` / ``noroworder`` force the
#: row kernels off as a whole; ``topkseeds`` is now the ``kth_seeds`` kernel forced off).
DROPPED = {"wg128": "cuda_screen.WGMMA_MAX_K", "nobisect": "row_kth.BISECT_WIDTH",
           "norounds": "row_kth.ROUNDS_MAX_K", "chunk1024": "row_kth.MIN_CHUNK", "sortslots": "row_kth.row_slots",
           "finish512m": "graph.FINISH_BYTES_GPU", "torchsort": "row_order.SORT_MAX_WIDTH"}
QUICK_CASES = "g3000_32_10,q3000_32_10"


def case_inputs(name: str, device: torch.device, pictures: str | None, queries: int
                ) -> list[tuple[int, Any, Any, str]]:
    """The (k, data, queries or None, metric) of one case name (see the module's docstring)."""
    def gauss(n: int, d: int, seed: int = 0) -> torch.Tensor:
        return harness.gaussian(n, d, seed, device)

    if ":" in name:  # SET[@N]:K[,K...]
        head, ks = name.split(":", 1)
        set_name, _, size = head.partition("@")
        xt, spec = harness.dataset_on(set_name, device, n=int(size) if size else None, pictures=pictures)
        return [(int(k), xt, None, spec.metric) for k in ks.split(",")]
    if name in harness.PATCH_SHAPES:
        side, stride, count = harness.PATCH_SHAPES[name]
        x = torch.from_numpy(harness.patches(harness.load_pictures(pictures), side, stride, count)).to(device)
        return [(k, x, None, "euclidean") for k in (10, 100)]
    if name.startswith("q") and name.count("_") == 2:
        n, d, k = (int(v) for v in name[1:].split("_"))
        return [(k, gauss(n, d), gauss(queries, d, 1), "euclidean")]
    if name.startswith("g") and name.count("_") == 2:
        n, d, k = (int(v) for v in name[1:].split("_"))
        return [(k, gauss(n, d), None, "euclidean")]
    if name.startswith("g200k"):
        return [(int(name[5:] or 10), gauss(200_000, 128), None, "euclidean")]
    if name.startswith("g1m"):
        return [(int(name[3:] or 10), gauss(1_000_000, 128), None, "euclidean")]
    if name.startswith("s1m"):
        return [(int(name[3:]), gauss(1_000_000, 128), gauss(queries, 128, 1), "euclidean")]
    if name.startswith("s200k"):
        return [(int(name[5:] or 100), gauss(200_000, 128), gauss(queries, 128, 1), "euclidean")]
    if name == "wide":
        return [(1024, gauss(16_384, 4_096), None, "euclidean")]
    x, q = gauss(1_000_000, 128), gauss(queries, 128, 1)
    return [(10, x, q, "euclidean"), (100, x, q, "euclidean")]


def split_cases(text: str) -> list[str]:
    """The comma-separated case names, a data set's further k joined to it
    (``descriptors:10,100,p8`` → ``["descriptors:10,100", "p8"]``)."""
    cases: list[str] = []
    for item in text.split(","):
        if item.isdigit() and cases and ":" in cases[-1]:
            cases[-1] += f",{item}"
        else:
            cases.append(item)
    return cases


def checksum(result: Any) -> str:
    """A hash of an answer's indices and distances (equal answers, equal hashes)."""
    h = hashlib.sha1(torch.as_tensor(result.indices).cpu().numpy().tobytes())
    h.update(torch.as_tensor(result.distances).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def count_syncs(call: Callable[[], Any], frames: int = 3) -> collections.Counter:
    """Host synchronisations of one call (``torch.cuda.set_sync_debug_mode``), by the innermost
    ``frames`` knng frames of each."""
    sites: collections.Counter = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001
        if "synchroniz" not in str(message):
            return
        stack = [f for f in traceback.extract_stack()[:-1] if "/knng/" in f.filename]
        sites[" < ".join(f"{f.filename.split('/knng/')[-1]}:{f.lineno}:{f.name}"
                         for f in stack[::-1][:frames])] += 1

    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            try:
                call()
                torch.cuda.synchronize()
            finally:
                torch.cuda.set_sync_debug_mode(0)
    finally:
        warnings.showwarning = shown
    return sites


def profile_once(call: Callable[[], Any], out_dir: Path, label: str, device: torch.device) -> str:
    """One call under ``torch.profiler``: the table of its heaviest operations and kernels and a
    chrome trace written to ``out_dir``; a one-line summary returned."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        harness.synchronize(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    averages = prof.key_averages()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = averages.table(sort_by=sort, row_limit=30, max_name_column_width=60)
    (out_dir / f"prof-{label}.txt").write_text(table)
    prof.export_chrome_trace(str(out_dir / f"trace-{label}.json"))
    launches = sum(e.count for e in averages if "LaunchKernel" in e.key)
    syncs = sum(e.count for e in averages if "Synchronize" in e.key)
    totals = [line.strip() for line in table.splitlines() if "time total" in line]
    return f"{'; '.join(totals)}; launches {launches}, synchronisations {syncs}; {out_dir}/prof-{label}.txt"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tag", nargs="?", help="a label, an option set, or option sets joined by '/' (alternated)")
    ap.add_argument("cases", nargs="?", default=None, help=f"comma-separated cases (default {DEFAULT_CASES})")
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls (default 3 for graphs, 5 for searches)")
    ap.add_argument("--queries", type=int, default=10_000, help="queries of the search cases (default 10,000)")
    ap.add_argument("--pictures", default=None, help="the pictures' .npz (default .carry/pictures.npz)")
    ap.add_argument("--stages", action="store_true", help="print each answer's report.stages")
    ap.add_argument("--checksum", action="store_true", help="print a hash of each answer")
    ap.add_argument("--syncs", action="store_true", help="count one more call's synchronisations by call site (GPU)")
    ap.add_argument("--profile", metavar="DIR", default=None, help="profile one more call, tables and traces to DIR")
    ap.add_argument("--quick", action="store_true", help=f"small Gaussian cases ({QUICK_CASES}), 2 calls: a smoke run")
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default torch's; 1 with --quick)")
    ap.add_argument("--out", default=None, help="write every variant's times and figures to this JSON file")
    ap.add_argument("--list", action="store_true", help="list the option sets and data sets, and stop")
    args = ap.parse_args(argv)
    if args.list:
        return harness.main(["--list"])
    if not args.tag:
        ap.error("a TAG is needed (e.g. new, or new/mmasync)")
    harness.apply_threads(args)
    device = harness.resolve_device(args.device)
    names = args.tag.split("/") if "/" in args.tag else [args.tag]
    for name in names:
        for item in name.split("+"):
            if item in DROPPED:
                ap.error(f"{item!r} set {DROPPED[item]}, a module constant and no knng option: it is gone "
                         "(--list shows the option sets)")
            if len(names) > 1 and "=" not in item and item not in harness.OPTION_SETS:
                ap.error(f"unknown option set {item!r} (--list shows them; a label that changes nothing runs alone, "
                         "or as new/old)")
    variants = {name: harness.parse_option_set(name) for name in names}
    which = split_cases(args.cases or (QUICK_CASES if args.quick else DEFAULT_CASES))
    records = []
    for name in which:
        # Each case from an empty allocator cache: the default budget is a share of the free
        # memory, so a case run after a larger one would be planned for less.
        x = q = call = runs = timing = result = report = None  # noqa: F841 - the last case's tensors go
        harness.release(device)
        for k, x, q, metric in case_inputs(name, device, args.pictures, args.queries):
            if q is None:
                call = lambda x=x, k=k, metric=metric: knng.graph(x, k, metric=metric)  # noqa: E731
                repeats = 3
                flat = harness.flat_rows(x)
                rows = harness.oracle_rows(x.shape[0], 128, seed=k, flat=flat)
            else:
                call = lambda x=x, q=q, k=k, metric=metric: knng.search(q, x, k, metric=metric)  # noqa: E731
                repeats = 5
                rows = harness.oracle_rows(q.shape[0], 128, seed=k)
            repeats = args.repeats or (2 if args.quick else repeats)
            runs = harness.alternate(variants, call, device=device, repeats=repeats)
            for variant, timing in runs.items():
                result = timing.result
                if q is None:
                    harness.check_exact(x, x, result, metric, exclude_self=True, rows=rows.to(x.device), strict=True)
                else:
                    harness.check_exact(q, x, result, metric, rows=rows.to(q.device), strict=True)
                report = result.report
                screened, evaluated = report.screened_per_row, report.evaluations_per_row
                times = timing.times
                print(f"AB {variant} {name} k={k}: min {min(times) * 1e3:.1f} ms all "
                      f"{[round(t * 1e3, 1) for t in times]} exact on {rows.numel()} rows; screened/row "
                      f"{screened.get('median')}/{screened.get('p99')}/{screened.get('max')}, evaluated p99 "
                      f"{evaluated.get('p99')}, escalated {getattr(report, 'rows_escalated', 0)}", flush=True)
                record = {"variant": variant, "options": variants[variant], "case": name, "k": k,
                          "shape": list(x.shape), "queries": None if q is None else q.shape[0], "metric": metric,
                          **timing.as_dict(), "exact_rows": rows.numel(), **harness.report_summary(result)}
                extras = []
                if args.stages:
                    extras.append("stages " + harness.format_stages(getattr(report, "stages", None)))
                if args.checksum:
                    record["sha1"] = checksum(result)
                    extras.append(f"sha1 {record['sha1']}")
                with harness.option_context(variants[variant]):
                    if args.syncs and device.type == "cuda":
                        sites = count_syncs(call)
                        record["syncs"] = sum(sites.values())
                        extras.append(f"synchronisations {record['syncs']}: " + "; ".join(
                            f"{count} {site}" for site, count in sites.most_common(8)))
                    if args.profile:
                        label = f"{variant}-{name}-k{k}".replace("/", "_").replace("=", "-").replace("+", "_")
                        extras.append("profile: " + profile_once(call, Path(args.profile), label, device))
                if extras:
                    print(f"   {variant} {name} k={k}: " + " | ".join(extras), flush=True)
                records.append(record)
            del runs
            harness.release(device)
        harness.release(device)
    if args.out:
        harness.write_json(args.out, {**harness.environment(device), "tag": args.tag, "cases": which,
                                      "results": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
