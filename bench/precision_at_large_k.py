"""GPU searches (and the wide graph) at large k in each screen precision, forced, in one process.

Which precision the planner should take where k is a large share of the corpus
(``knng.engine.plan.choose_screen_precision``): 10k queries against Gaussian corpora, each
precision forced in turn, min of 3 after one, every answer checked exact on 16 rows against the
float64 oracle; then the 16,384 × 4,096 graph at k = 1,024. Usage (GPU machine)::

    PYTHONPATH=src:tests python bench/precision_at_large_k.py [--precisions float16,float64]

H200, 2026-11-27 (``docs/BENCHMARKS.md``, eleventh session): float16 beat float64 in every search
(1M × 128, k = 16,384: 252 against 709 ms); the graph won in float64 (58 ms against 110 by rows
in float16).
"""

import argparse
import sys

import torch

import knng

sys.path.insert(0, "tests")
sys.path.insert(0, "bench")
from ab_exact_calls import timed  # noqa: E402
from oracle import assert_exact_chunked  # noqa: E402

#: (d, corpus points, k) of the searches.
SEARCHES = ((128, 1_000_000, 16384), (960, 1_000_000, 4096), (960, 1_000_000, 2048), (128, 200_000, 4096),
            (512, 200_000, 1024), (512, 200_000, 2048), (128, 100_000, 8192), (128, 50_000, 8192),
            (256, 20_000, 4096), (128, 20_000, 2000), (4096, 16_384, 1024))


def min_ms(call, repeats: int = 3):
    """The call's result and its fastest time in ms, of ``repeats`` after one."""
    result, times = timed(call, repeats)
    return result, min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="float16,float64")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for d, n, k in SEARCHES:
        x = torch.randn((n, d), device="cuda", generator=gen)
        q = torch.randn((10_000, d), device="cuda", generator=gen)
        line = f"search {n:,} × {d}, k = {k:,} (k/n {k / n:.3f}):"
        for precision in precisions:
            with knng.options(screen_precision=precision):
                res, ms = min_ms(lambda: knng.search(q, x, k))
            assert_exact_chunked(q, x, [(res.indices, res.distances)],
                                 rows=torch.arange(0, 10_000, 625, device="cuda"))
            line += f" {precision} {ms:.0f} ms"
            del res
        print(line + " (exact)", flush=True)
        del x, q
        torch.cuda.empty_cache()
    x = torch.randn((16_384, 4_096), device="cuda", generator=gen)
    line = "graph 16,384 × 4,096, k = 1,024:"
    for precision in precisions:
        with knng.options(screen_precision=precision):
            res, ms = min_ms(lambda: knng.graph(x, 1024), 2)
        assert_exact_chunked(x, x, [(res.indices, res.distances)], exclude_self=True,
                             rows=torch.arange(0, 16_384, 1_024, device="cuda"))
        line += f" {precision} {ms:.0f} ms"
    print(line + " (exact)", flush=True)


if __name__ == "__main__":
    main()
