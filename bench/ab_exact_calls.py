"""A/B of whole calls in fresh processes, each answer checked against the float64 oracle.

Image-patch graphs (``bench/bench_patches.py``'s 8×8 and 16×16 patches, k = 10 and 100), the
200k × 128 and (``g1m``) 1M × 128 Gaussian graphs (k = 10; ``g200kK``, ``g1mK`` at k = K), 10k
queries against 200k × 128 points (``s200kK``, k = K, 100 by default) and 1M (``s1mK``), N × D points at k = K
(``gN_D_K``), 10k queries against N × D points at k = K (``qN_D_K``), the
16,384 × 4,096 graph at k = 1,024 (``wide``) and the 1M × 128 search (10k queries, k = 10 and 100): min and all of 3 calls after a warm-up (5 for
searches), then the oracle on 192 rows of a graph (128 random, 64 flat patches) or 128 of a
search, and the report's pairs screened and evaluated per row. Whichever knng is on PYTHONPATH;
run the versions alternating, twice, on one
machine, from the repository root (``.carry/pictures.npz``: ``bench_patches.py --save-images``)::

    for i in 1 2; do
      PYTHONPATH=old/src:tests python bench/ab_exact_calls.py old p8,p16,g200k,s128
      PYTHONPATH=src:tests python bench/ab_exact_calls.py new p8,p16,g200k,s128
    done

Variant ``seedN`` (e.g. ``seed16384``) sets ``graph.OWN_PART_SEED`` first. The A/Bs of
``docs/BENCHMARKS.md``'s "Pair radii in one launch, …" section ran this script.

Fresh H100 processes of the same code have run at one of two speeds (e.g. ~108 and ~127 ms on
16×16 patches at k = 10), steady within a process. Variants that are settings of this tree (the
names of :data:`SETTINGS`, "new" for none) are therefore better compared in one process: a tag
of several names joined by "/" times them alternating, call by call, after a warm-up of each::

    PYTHONPATH=src:tests python bench/ab_exact_calls.py new/wg128 p16
"""

import contextlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "bench")
sys.path.insert(0, "tests")

import knng  # noqa: E402
import knng.engine.graph as graph  # noqa: E402
from knng.engine import cuda_screen, plan, row_kth, row_order, thresholds  # noqa: E402
from bench_patches import patches  # noqa: E402
from oracle import assert_exact_chunked  # noqa: E402


def timed(call, repeats: int, warm: bool = True):
    if warm:
        call()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        result = call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return result, times


#: Marks a setting that is one of knng's options (``knng.options``), not a module attribute.
OPTIONS = "options"
#: Settings of this tree an in-process A/B alternates: name -> (module, attribute, value) each, or
#: (OPTIONS, option, value).
SETTINGS = {
    "new": (),
    # the wgmma screen only to K = 128 (as before its two-tile ring): d = 256 on mma.sync
    "wg128": ((cuda_screen, "WGMMA_MAX_K", 128),),
    "mmasync": ((OPTIONS, "wgmma", False),),
    # the wgmma kernel's pre-test not marking its candidates: a half-tile with one tests again
    "nomark": ((OPTIONS, "mark_candidates", False),),
    # the wgmma screen with two accumulator sets and one block a multiprocessor at K <= 128
    "twosets": ((OPTIONS, "wgmma_one_set", False),),
    # a holding store that tightens every 2^21 / 2^23 / 2^24 fresh survivors (2^22 now)
    "pending2m": ((plan, "PENDING_GPU", 1 << 21),),
    "pending8m": ((plan, "PENDING_GPU", 1 << 23),),
    "pending16m": ((plan, "PENDING_GPU", 1 << 24),),
    # no bisection kernel: held rows of more than the rounds kernel's width to the radix select
    "nobisect": ((row_kth, "BISECT_WIDTH", 0),),
    # no rounds kernel: rows of more than row_kth.SMALL_WIDTH pairs to the radix select at every k
    "norounds": ((row_kth, "ROUNDS_MAX_K", 0),),
    # the radix select's chunks of 1,024 codes at every k (as before chunk_for)
    "chunk1024": ((row_kth, "MIN_CHUNK", 1024),),
    # the finish's slots in each row by a stable sort (as the reference), not by atomics
    "sortslots": ((row_kth, "row_slots", getattr(row_kth, "row_slots_reference", None)),),
    # a graph part's own block screened whole by rows, not as its upper triangle
    "notri": ((OPTIONS, "triangle", False),),
    # graphs whose own blocks are triangles in parts of up to 32,768 / 49,152 / 98,304 rows (65,536 now)
    "part32k": ((plan, "GPU_TRIANGLE_MAX_PART", 32768),),
    "part48k": ((plan, "GPU_TRIANGLE_MAX_PART", 49152),),
    "part96k": ((plan, "GPU_TRIANGLE_MAX_PART", 98304),),
    "part128k": ((plan, "GPU_TRIANGLE_MAX_PART", 131072),),
    # parts for k <= 16 of up to 65,536 rows (98,304 now; the budget's block side may bound them first)
    "small64k": ((plan, "GPU_TRIANGLE_MAX_PART_SMALL_K", 65536),),
    "part256k": ((plan, "GPU_TRIANGLE_MAX_PART", 262144),),
    # own parts seeded from 4,096 / 16,384 sample columns (8,192 now): with parts of 65,536 the
    # own blocks' first thresholds are looser than with 32,768 (200k graph: 113 pairs screened
    # a row against 84), which a larger sample would tighten at its own cost
    "seed4k": ((graph, "OWN_PART_SEED", 4096),),
    "seed16k": ((graph, "OWN_PART_SEED", 16384),),
    "seed32k": ((graph, "OWN_PART_SEED", 32768),),
    "s16p96": ((graph, "OWN_PART_SEED", 16384), (plan, "GPU_TRIANGLE_MAX_PART", 98304)),
    "s16p128": ((graph, "OWN_PART_SEED", 16384), (plan, "GPU_TRIANGLE_MAX_PART", 131072)),
    "s32p256": ((graph, "OWN_PART_SEED", 32768), (plan, "GPU_TRIANGLE_MAX_PART", 262144)),
    # the symmetric method at every k (the planner takes the rows method from k = 64)
    "sym": ((plan, "GRAPH_ROWS_MIN_K", 1 << 30),),
    # principal frames whatever the data's slab gain (Gaussian points keep one centre now)
    "slabs": ((plan, "PRINCIPAL_MIN_GAIN", 0.0),),
    # the graph's finish in chunks of 512 MiB on a GPU (2 GiB now)
    "finish512m": ((graph, "FINISH_BYTES_GPU", 512 << 20),),
    # a search's (and a graph by rows') corpus tiles of at most 65,536 / 131,072 columns (262,144 now)
    "cols64k": ((plan, "GPU_SEARCH_COLS", 1 << 16),),
    "cols128k": ((plan, "GPU_SEARCH_COLS", 1 << 17),),
    # a search's (and a graph by rows') query chunks of up to 65,536 / 131,072 rows (262,144 now)
    "rows64k": ((plan, "KERNEL_SEARCH_ROWS", 1 << 16), (plan, "KERNEL_SEARCH_PAIRS", 1 << 23)),
    "rows128k": ((plan, "KERNEL_SEARCH_ROWS", 1 << 17), (plan, "KERNEL_SEARCH_PAIRS", 1 << 24)),
    # a search's seeds above k = 32 by torch.topk of the strip minima and their columns (not each row's k-th alone)
    "topkseeds": ((thresholds, "KTH_ROW_MAX_WIDTH", 0),),
    # seed samples of up to 98,304 / 131,072 columns (65,536 now)
    "sample96k": ((plan, "GPU_SAMPLE", 98304),),
    "sample128k": ((plan, "GPU_SAMPLE", 1 << 17),),
    # a finish's rows wider than 32 (row_order.MAX_WIDTH) ordered by torch's segmented sort, not the sort kernel
    "torchsort": ((row_order, "SORT_MAX_WIDTH", 0),),
    # seed samples of at most 16,384 / 32,768 columns (65,536 now)
    "sample16k": ((plan, "GPU_SAMPLE", 1 << 14),),
    "sample32k": ((plan, "GPU_SAMPLE", 1 << 15),),
    "s32c128": ((plan, "GPU_SAMPLE", 1 << 15), (plan, "GPU_SEARCH_COLS", 1 << 17)),
    "s16c64": ((plan, "GPU_SAMPLE", 1 << 14), (plan, "GPU_SEARCH_COLS", 1 << 16)),
    # a search (and a graph by rows) from a seed sample and a full screen, not tiles first (graphs
    # below k = 64 symmetric again)
    "notiles": ((OPTIONS, "tiles_first", False),),
    # tiles first, but graphs below k = 64 symmetric (not by rows)
    "symk": ((OPTIONS, "graph_rows_tiles_first", False),),
}


@contextlib.contextmanager
def setting(name: str):
    """The settings of ``name`` applied, and undone after."""
    options = {attr: value for module, attr, value in SETTINGS[name] if module is OPTIONS}
    patched = [(module, attr, value) for module, attr, value in SETTINGS[name] if module is not OPTIONS]
    saved = [(module, attr, getattr(module, attr)) for module, attr, _ in patched]
    for module, attr, value in patched:
        setattr(module, attr, value)
    try:
        # (a tree before knng.options runs the settings without options)
        with knng.options(**options) if options else contextlib.nullcontext():
            yield
    finally:
        for module, attr, value in saved:
            setattr(module, attr, value)


def alternated(names: list[str], call, repeats: int) -> dict:
    """``call`` under each setting of ``names`` once (a warm-up), then ``repeats`` rounds of all
    of them in turn: each name's last result and its times."""
    out = {}
    for name in names:
        with setting(name):
            call()
    for _ in range(repeats):
        for name in names:
            with setting(name):
                result, times = timed(call, 1, warm=False)
            out[name] = (result, out.get(name, (None, []))[1] + times)
    return out


def main() -> None:
    tag = sys.argv[1]
    names = tag.split("/") if "/" in tag else None
    which = sys.argv[2].split(",") if len(sys.argv) > 2 else ["p8", "p16", "g200k", "s128"]
    if tag.startswith("seed"):
        graph.OWN_PART_SEED = int(tag[4:])
    pictures = dict(np.load(".carry/pictures.npz")) if {"p8", "p16"} & set(which) else {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in which:
        if name in ("p8", "p16"):
            side, stride = (8, 2) if name == "p8" else (16, 3)
            x = torch.from_numpy(patches(pictures, side, stride, 12)).cuda()
            cases = [(k, x, None) for k in (10, 100)]
        elif name.startswith("q") and name.count("_") == 2:  # qN_D_K: 10k queries against N × D at k = K
            n, d, k = (int(v) for v in name[1:].split("_"))
            x = torch.randn((n, d), device="cuda", generator=gen)
            q = torch.randn((10_000, d), device="cuda", generator=gen)
            cases = [(k, x, q)]
        elif name.startswith("g") and name.count("_") == 2:  # gN_D_K: N × D Gaussian points at k = K
            n, d, k = (int(v) for v in name[1:].split("_"))
            x = torch.randn((n, d), device="cuda", generator=gen)
            cases = [(k, x, None)]
        elif name.startswith("g200k"):
            x = torch.randn((200_000, 128), device="cuda", generator=gen)
            cases = [(int(name[5:] or 10), x, None)]
        elif name.startswith("g1m"):
            x = torch.randn((1_000_000, 128), device="cuda", generator=gen)
            cases = [(int(name[3:] or 10), x, None)]
        elif name.startswith("s1m"):  # 10k queries against 1M points at k = K
            x = torch.randn((1_000_000, 128), device="cuda", generator=gen)
            q = torch.randn((10_000, 128), device="cuda", generator=gen)
            cases = [(int(name[3:]), x, q)]
        elif name.startswith("s200k"):  # 10k queries against 200k points
            x = torch.randn((200_000, 128), device="cuda", generator=gen)
            q = torch.randn((10_000, 128), device="cuda", generator=gen)
            cases = [(int(name[5:] or 100), x, q)]
        elif name == "wide":  # the 16,384 × 4,096 graph at k = 1,024
            x = torch.randn((16_384, 4_096), device="cuda", generator=gen)
            cases = [(1024, x, None)]
        else:
            x = torch.randn((1_000_000, 128), device="cuda", generator=gen)
            q = torch.randn((10_000, 128), device="cuda", generator=gen)
            cases = [(10, x, q), (100, x, q)]
        for k, x, q in cases:
            if q is None:
                call, repeats = (lambda: knng.graph(x, k)), 3
                flat = torch.nonzero((x.max(1).values - x.min(1).values) < 1e-3).flatten().cpu()[:64]
                rows = torch.cat([torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(k))[:128], flat])
            else:
                call, repeats = (lambda: knng.search(q, x, k)), 5
                rows = torch.randperm(q.shape[0], generator=torch.Generator().manual_seed(k))[:128]
            runs = alternated(names, call, repeats) if names else {tag: timed(call, repeats)}
            for variant, (result, times) in runs.items():
                if q is None:
                    assert_exact_chunked(x, x, [result], "euclidean", exclude_self=True, rows=rows.cuda())
                else:
                    assert_exact_chunked(q, x, [result], "euclidean", rows=rows.cuda())
                report = result.report
                screened, evaluated = report.screened_per_row, report.evaluations_per_row
                print(f"AB {variant} {name} k={k}: min {min(times) * 1e3:.1f} ms all "
                      f"{[round(t * 1e3, 1) for t in times]} exact on {rows.numel()} rows; screened/row "
                      f"{screened.get('median')}/{screened.get('p99')}/{screened.get('max')}, evaluated p99 "
                      f"{evaluated.get('p99')}", flush=True)


if __name__ == "__main__":
    main()
