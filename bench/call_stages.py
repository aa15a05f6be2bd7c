"""Where a whole graph call's time goes, without a profiler: host and GPU time of its stages,
and its synchronisations counted by call site.

Each stage (the API's folding, planning, engine, unfolding and output; the engine's own parts,
blocks, seeds, held-pair tightenings and finish) is wrapped to record a CUDA event and the host
clock on entry and exit, so the call runs at its own speed; ``torch.profiler`` (as in
``bench/trace_stages.py``) stretches the host's share. Then one more call runs under
``torch.cuda.set_sync_debug_mode`` and every synchronising torch operation is counted by its
three innermost ``knng`` frames. Usage (GPU machine, repository root; ``p8``/``p16`` are
``bench/bench_patches.py``'s patches from ``.carry/pictures.npz``, ``gN`` N thousand Gaussian
points in 128 dimensions)::

    PYTHONPATH=src:tests python bench/call_stages.py p16:100 p8:10 g200k:10

It found the unfolding of folded duplicates at 42.8 ms of an 8×8 patch graph at k = 100
(``docs/BENCHMARKS.md``, "Unfolding folded duplicates without sorting"). It replaces
``bench/count_syncs.py`` (the census alone, Gaussian points: its ``200000 10`` is ``g200k:10``
here); ``bench/stage_times.py`` synchronises around each stage instead, and covers searches.
"""

import collections
import sys
import time
import traceback
import warnings

import numpy as np
import torch

sys.path.insert(0, "bench")

import knng  # noqa: E402
import knng.api as api  # noqa: E402
import knng.engine.duplicates as duplicates  # noqa: E402
import knng.engine.graph as graph  # noqa: E402
import knng.engine.plan as plan  # noqa: E402
import knng.engine.store as store  # noqa: E402
from bench_patches import patches  # noqa: E402

#: (name, host start, host end, start event, end event, nesting depth) of the stages run.
STAGES: list = []
_DEPTH = [0]
#: Synchronisations by call site.
SYNCS: collections.Counter = collections.Counter()


def marked(owner: object, name: str) -> None:
    """Wrap ``owner.name`` to record its host and GPU span in :data:`STAGES`."""
    fn = getattr(owner, name)

    def wrapped(*args, **kwargs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        _DEPTH[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            t1 = time.perf_counter()
            end.record()
            STAGES.append((name, t0, t1, start, end, _DEPTH[0]))

    setattr(owner, name, wrapped)


def mark_stages() -> None:
    for name in ("_duplicate_groups", "make_graph_plan", "exact_graph", "exact_pairs_of", "as_output",
                 "resolve_budget"):
        marked(api, name)
    marked(duplicates, "unfold_graph")
    marked(plan, "slab_gain")
    # The own parts' steps (seeds from strip minima, the triangles' launches) and the frames.
    for name in ("screen_own_parts_together", "corpus_stats", "_graph_report", "strip_minima", "strip_candidates",
                 "screen_own_later", "PreparedCorpus", "_holding"):
        marked(graph, name)
    marked(graph._SharedThresholds, "when_uniform")
    for name in ("start", "screen", "add"):
        marked(graph._OffDiagonalBlock, name)
    for name in ("seed", "tighten_held", "_finish_held", "finish", "_hold", "screen_thresholds", "tighten"):
        marked(store.CandidateStore, name)


def _count_sync(message, category, filename, lineno, file=None, line=None) -> None:
    if "synchronizing" not in str(message):
        return
    frames = [f for f in traceback.extract_stack()[:-1] if "/knng/" in f.filename]
    SYNCS[" < ".join(f"{f.filename.split('/knng/')[-1]}:{f.lineno}:{f.name}" for f in frames[::-1][:3])] += 1


def workload(name: str, pictures: dict) -> torch.Tensor:
    if name in ("p8", "p16"):
        side, stride = (8, 2) if name == "p8" else (16, 3)
        return torch.from_numpy(patches(pictures, side, stride, 12)).cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn((int(name[1:].rstrip("k")) * 1000, 128), device="cuda", generator=gen)


def main() -> None:
    mark_stages()
    pictures = dict(np.load(".carry/pictures.npz")) if any(a.startswith("p") for a in sys.argv[1:]) else {}
    for spec in sys.argv[1:]:
        name, k = spec.split(":")
        x = workload(name, pictures)
        call = lambda: knng.graph(x, int(k))  # noqa: E731
        call()
        times = []
        for _ in range(3):
            torch.cuda.synchronize()
            STAGES.clear()
            t = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) * 1e3)
        print(f"== {spec}: {[round(t, 1) for t in times]} ms; the last call's stages:")
        spans = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for stage, t0, t1, start, end, depth in STAGES:
            span = spans[(depth, stage)]
            span[0] += 1
            span[1] += (t1 - t0) * 1e3
            span[2] += start.elapsed_time(end)
        for (depth, stage), (count, host, gpu) in sorted(spans.items()):
            print(f"  {'  ' * depth}{stage} ×{count}: host {host:.1f} ms, GPU span {gpu:.1f} ms")
        SYNCS.clear()
        shown = warnings.showwarning
        warnings.showwarning = _count_sync
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode(1)
            try:
                call()
            finally:
                torch.cuda.set_sync_debug_mode(0)
                warnings.showwarning = shown
        print(f"  synchronisations: {sum(SYNCS.values())}")
        for site, count in SYNCS.most_common(25):
            print(f"    {count:5d}  {site}")


if __name__ == "__main__":
    main()
