"""The first call in a fresh process on a GPU: knng's, FAISS's and torch's, with empty and warm
kernel caches; and the price of a call without compiled kernels.

Each scenario runs in a new interpreter whose Triton and CuPy caches (``TRITON_CACHE_DIR``,
``CUPY_CACHE_DIR``) are a folder of this run: empty ("cold": a fresh machine) or filled by the
cold scenario before it ("warm": a machine where knng ran before). The data are made on the GPU
first (N(0, 1), float32); a call's time runs from the call to its result on the host side
(``torch.cuda.synchronize``), ``import torch`` and the data excluded, knng's import and every
compilation included. knng's scenarios time the first call, the call right after it, and a
third call after ``knng.wait_for_kernels()``; ``foreground`` runs with
``knng.options(background_compile=False)``: the kernels compiled before the first call runs.
FAISS's first call makes its resources and a flat index, adds the corpus and searches; torch's
is one product and ``topk`` in blocks of queries (inexact, for scale). Every knng answer is
compared with the third call's (identical) and, on sampled rows, with the float64 oracle.

``--sizes``: in one process with warm kernels, calls timed with their kernels and without them
(``knng.options(compiled_kernels=False)``, what a first call of a kind runs), to place
``Options.uncompiled_max_scores``.

Usage (repository root, a GPU)::

    PYTHONPATH=src:tests python bench/bench_first_call.py --queries 10000 --corpus 1000000 --d 128 --k 10
    PYTHONPATH=src:tests python bench/bench_first_call.py --sizes search:10000x1000000x128:10,graph:200000x128:10
    PYTHONPATH=src:tests python bench/bench_first_call.py --quick     # exits 0 without a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import knng  # noqa: E402

SCENARIOS = ("cold", "cold_foreground", "warm", "warm_foreground", "faiss", "torch")


def _data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda")
    g.manual_seed(args.seed)
    corpus = torch.randn(args.corpus, args.d, device="cuda", generator=g)
    queries = torch.randn(args.queries, args.d, device="cuda", generator=g)
    torch.cuda.synchronize()
    return queries, corpus


def _timed(call) -> tuple[Any, float]:
    start = time.perf_counter()
    result = call()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


def child(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    """One scenario in this (fresh) process."""
    queries, corpus = _data(args)
    out: dict[str, Any] = {"scenario": scenario}
    if scenario == "faiss":
        def first() -> Any:
            import faiss
            import faiss.contrib.torch_utils  # noqa: F401  (torch tensors in and out)

            resources = faiss.StandardGpuResources()
            index = faiss.GpuIndexFlatL2(resources, args.d)
            index.add(corpus)
            return index.search(queries, args.k)

        _, out["first"] = _timed(first)
        return out
    if scenario == "torch":
        _, out["first"] = _timed(lambda: harness.torch_search(queries, corpus, args.k))
        _, out["second"] = _timed(lambda: harness.torch_search(queries, corpus, args.k))
        return out
    background = not scenario.endswith("foreground")
    with knng.options(background_compile=background):
        first, out["first"] = _timed(lambda: knng.search(queries, corpus, args.k))
        second, out["second"] = _timed(lambda: knng.search(queries, corpus, args.k))
        start = time.perf_counter()
        knng.wait_for_kernels()
        out["wait"] = time.perf_counter() - start
        third, out["third"] = _timed(lambda: knng.search(queries, corpus, args.k))
    out["uncompiled"] = [r.report.plan.uncompiled for r in (first, second, third)]
    out["identical"] = all(torch.equal(r.indices, third.indices) and torch.equal(r.distances, third.distances)
                           for r in (first, second))
    out["exact"], out["exact_note"] = harness.check_exact(queries, corpus, first, "euclidean", count=64)
    return out


def sizes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Calls timed with their kernels and without (warm kernels, one process)."""
    rows = []
    for spec in args.sizes.split(","):
        operation, shape, k = spec.split(":")
        dims = [int(v) for v in shape.split("x")]
        g = torch.Generator(device="cuda")
        g.manual_seed(args.seed)
        if operation == "search":
            n_q, n, d = dims
            corpus = torch.randn(n, d, device="cuda", generator=g)
            queries = torch.randn(n_q, d, device="cuda", generator=g)
            call = lambda: knng.search(queries, corpus, int(k))  # noqa: E731
            scores = n_q * n
        else:
            n, d = dims
            corpus = torch.randn(n, d, device="cuda", generator=g)
            call = lambda: knng.graph(corpus, int(k))  # noqa: E731
            scores = n * n
        compiled = harness.time_call(call, device="cuda", warmup=1, repeats=args.repeats)
        with knng.options(compiled_kernels=False):
            uncompiled = harness.time_call(call, device="cuda", warmup=1, repeats=args.repeats)
            assert uncompiled.result.report.plan.uncompiled
        row = {"call": spec, "scores": scores, "compiled_s": compiled.median, "uncompiled_s": uncompiled.median,
               "ratio": uncompiled.median / compiled.median}
        print(f"{spec:>32}  scores {scores:.2e}  compiled {compiled.median * 1e3:8.1f} ms  "
              f"uncompiled {uncompiled.median * 1e3:8.1f} ms  ({row['ratio']:.1f}x)", flush=True)
        rows.append(row)
        compiled = uncompiled = None  # their results hold GPU memory
        harness.release()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--corpus", type=int, default=1_000_000)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {', '.join(SCENARIOS)} (warm ones need cold before them)")
    parser.add_argument("--sizes", default="", help="operation:shape:k,... (search:QxNxD:k, graph:NxD:k)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a small run (exits 0 without a GPU)")
    parser.add_argument("--out", help="write the figures to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    harness.gpu_or_exit("bench_first_call")
    if args.quick:
        args.queries, args.corpus, args.sizes = 1000, 100_000, "search:1000x100000x64:10"
    results: dict[str, Any] = {"environment": harness.environment("cuda"), "args": vars(args), "scenarios": {}}
    if args.sizes:
        results["sizes"] = sizes(args)
    caches = Path(tempfile.mkdtemp(prefix="knng-first-call-"))
    env = dict(os.environ, TRITON_CACHE_DIR=str(caches / "triton"), CUPY_CACHE_DIR=str(caches / "cupy"))
    same = ["--queries", str(args.queries), "--corpus", str(args.corpus), "--d", str(args.d), "--k", str(args.k),
            "--seed", str(args.seed)]
    for scenario in [s for s in args.scenarios.split(",") if s]:
        if scenario.startswith("cold"):  # a fresh machine: empty caches
            for folder in ("triton", "cupy"):
                subprocess.run(["rm", "-rf", str(caches / folder)], check=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", scenario, *same], env=env, capture_output=True,
                              text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            print(f"{scenario}: failed\n{done.stderr[-3000:]}", flush=True)
            results["scenarios"][scenario] = {"error": done.stderr[-3000:]}
            continue
        found = json.loads(done.stdout.strip().splitlines()[-1])
        found["process_wall"] = wall
        results["scenarios"][scenario] = found
        times = "  ".join(f"{key} {found[key]:.3f} s" for key in ("first", "second", "wait", "third") if key in found)
        print(f"{scenario:>16}: {times}  (process {wall:.1f} s)  {found.get('uncompiled', '')}", flush=True)
    if args.out:
        harness.write_json(args.out, results)


if __name__ == "__main__":
    main()
