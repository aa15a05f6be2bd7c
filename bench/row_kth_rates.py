"""Each row's k-th held bound (``knng.engine.row_kth.row_ends``) at the radix select's chunk
sizes, on the row lengths of the held survivors' tightenings: a patch graph's rows at k = 100
(543,829 rows of ~200 and ~400 pairs, 234,401 of ~300), a 200k graph's at k = 10 (~20), a
search's at k = 1,024 (10,000 rows of ~8,000). Pairs of uniformly random rows with Gaussian
float64 keys; every result equal to the sort's (``row_ends_reference``); best of 5 after one
call, synchronised. Usage (GPU machine)::

    PYTHONPATH=src python bench/row_kth_rates.py [CHUNK,CHUNK,...]

"default" in the list is the shipped rule (``row_kth.chunk_for``); a number fixes the chunk
for every k; "norounds" is the shipped rule without the rounds kernel (``ROUNDS_MAX_K`` 0: rows
of more than ``SMALL_WIDTH`` pairs to the radix select at every k); "nobisect" is the shipped
rule without the bisection kernel (``BISECT_WIDTH`` 0). The 200k graph at k = 10 holds ~80
pairs a row after its own parts; by rows at k = 100 (k + 1 = 101), ~391. Figures: ``docs/BENCHMARKS.md``, "The wgmma screen at K = 256; radix chunks …".
"""
import sys
import time

import torch

from knng.engine import row_kth

CASES = [(543_829, 200, 100), (543_829, 400, 100), (234_401, 300, 100), (200_000, 391, 101), (200_000, 20, 10),
         (200_000, 80, 10), (10_000, 8_000, 1_024)]


def main() -> None:
    chunks = (sys.argv[1] if len(sys.argv) > 1 else "default,1024,512,256").split(",")
    g = torch.Generator(device="cuda").manual_seed(0)
    shipped, rounds, bisect = row_kth.chunk_for, row_kth.ROUNDS_MAX_K, row_kth.BISECT_WIDTH
    for n, per, k in CASES:
        rows = torch.randint(0, n, (n * per,), device="cuda", generator=g)
        keys = torch.randn(n * per, device="cuda", generator=g, dtype=torch.float64)
        want = row_kth.row_ends_reference(rows, keys, n, k)
        times = {}
        for chunk in chunks:
            row_kth.chunk_for = (shipped if chunk in ("default", "norounds", "nobisect")
                                 else (lambda _k, c=int(chunk): c))
            row_kth.ROUNDS_MAX_K = 0 if chunk == "norounds" else rounds
            row_kth.BISECT_WIDTH = 0 if chunk == "nobisect" else bisect
            got = row_kth.row_ends(rows, keys, n, k)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), chunk
            best = float("inf")
            for _ in range(5):
                torch.cuda.synchronize()
                t = time.perf_counter()
                row_kth.row_ends(rows, keys, n, k)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t)
            times[chunk] = best * 1e3
        row_kth.chunk_for, row_kth.ROUNDS_MAX_K, row_kth.BISECT_WIDTH = shipped, rounds, bisect
        print(f"{n:,} rows × ~{per} pairs, k = {k}: " + "  ".join(f"{c}: {t:.2f} ms" for c, t in times.items()),
              flush=True)


if __name__ == "__main__":
    main()
