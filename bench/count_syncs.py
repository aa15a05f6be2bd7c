"""Count the GPU synchronisations of one ``knng.graph`` call by the knng lines that caused them
(``torch.cuda.set_sync_debug_mode("warn")``: a warning with a stack at every synchronising
operation), on N × 128 Gaussian points, after one warm-up call. Usage (GPU machine)::

    PYTHONPATH=src python bench/count_syncs.py 200000 10

Prints the total, then each place (its last four knng frames, innermost first) with its count.
Figures: ``docs/BENCHMARKS.md``, "Fewer launches before a graph's screens".
"""
import collections
import sys
import traceback
import warnings

import torch

import knng


def main() -> None:
    n, k = int(sys.argv[1]), int(sys.argv[2])
    x = torch.randn(n, 128, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    knng.graph(x, k)
    torch.cuda.synchronize()
    counts: collections.Counter = collections.Counter()

    def count(message, category, filename, lineno, file=None, line=None):
        stack = [f for f in traceback.extract_stack() if "/knng/" in f.filename]
        counts[" < ".join(f"{f.filename.split('/knng/')[-1]}:{f.lineno}({f.name})" for f in reversed(stack[-4:]))] += 1

    warnings.showwarning = count
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    knng.graph(x, k)
    torch.cuda.set_sync_debug_mode(0)
    print(sum(counts.values()), "synchronisations")
    for place, c in counts.most_common():
        print(f"{c:5d}  {place}")


if __name__ == "__main__":
    main()
