"""Each row's first k by (distance, index) (``knng.engine.row_order``): the rank kernel, the one
stable sort with ties sorted again (torch's by float32 keys, the sort kernel's, and torch's by the
float64 distances), and the two stable sorts of the reference, on random rows of
several widths (10 % empty entries), CUDA-event medians of 7 after one call, and whether they
agree. Usage (GPU machine)::

    PYTHONPATH=src python bench/row_order_rates.py [--warps]

``--warps``: the sort kernel alone, with 1 … 16 warps a program (``row_order.SORT_WARPS``).

Figures: ``knng/engine/row_order.py``'s docstring (they set ``row_order.MAX_WIDTH``).
"""
import statistics
import sys

import torch

from knng.engine import row_order

#: (rows, width, k): a 200k-point graph's finish at k = 10; a rows-method graph's chunk at
#: k = 100 and its whole finish; a search's 10k rows of a few hundred candidates.
SHAPES = ((200_000, 26, 10), (200_000, 64, 10), (65_536, 153, 101), (200_000, 153, 101), (200_000, 256, 101),
          (200_000, 400, 101), (10_000, 500, 100), (10_000, 1_300, 256))


def _with_warps(fn, warps: int):
    def call(idx, dist, k):
        saved, row_order.SORT_WARPS = row_order.SORT_WARPS, warps
        try:
            return fn(idx, dist, k)
        finally:
            row_order.SORT_WARPS = saved
    return call


def main() -> None:
    warps = "--warps" in sys.argv
    g = torch.Generator(device="cuda").manual_seed(0)
    sort_max = row_order.SORT_MAX_WIDTH

    def ranked(idx, dist, k):
        row_order.MAX_WIDTH = 1 << 20  # the kernel at every width
        return row_order.top_by_distance(idx, dist, k)

    def sorted_once(idx, dist, k):  # torch's segmented sort
        row_order.MAX_WIDTH, row_order.SORT_MAX_WIDTH = 0, 0
        try:
            return row_order.top_by_distance(idx, dist, k)
        finally:
            row_order.SORT_MAX_WIDTH = sort_max

    def sorted_by_kernel(idx, dist, k):  # the sort kernel (one program a row)
        row_order.MAX_WIDTH = 0
        return row_order.top_by_distance(idx, dist, k)

    def sorted_once_f64(idx, dist, k):  # the one sort by the float64 distances themselves
        row_order.MAX_WIDTH, row_order.SORT_KEY = 0, torch.float64  # (the sort kernel takes float32 only)
        try:
            return row_order.top_by_distance(idx, dist, k)
        finally:
            row_order.SORT_KEY = torch.float32

    for rows, width, k in SHAPES:
        idx = torch.randint(0, 200_000, (rows, width), device="cuda", generator=g)
        dist = torch.rand((rows, width), device="cuda", generator=g, dtype=torch.float64)
        idx[torch.rand(idx.shape, device="cuda", generator=g) < 0.1] = -1
        line = []
        variants = (("kernel", ranked), ("one sort", sorted_once), ("sort kernel", sorted_by_kernel),
                    ("one float64 sort", sorted_once_f64),
                    ("two sorts", row_order.top_by_distance_reference))
        if width > 256:  # the rank kernel's W² comparisons: far behind from here on
            variants = variants[1:]
        if warps:  # the sort kernel with each number of warps a program
            variants = tuple((f"sort kernel, {w} warps", _with_warps(sorted_by_kernel, w)) for w in (1, 2, 4, 8, 16))
        for name, fn in variants:
            fn(idx, dist, k)
            torch.cuda.synchronize()
            times = []
            for _ in range(7):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn(idx, dist, k)
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1))
            line.append(f"{name} {statistics.median(times):7.3f} ms")
        want = row_order.top_by_distance_reference(idx, dist, k)
        same = all(all(torch.equal(a, b) for a, b in zip(fn(idx, dist, k), want))
                   for fn in (ranked, sorted_once, sorted_by_kernel, sorted_once_f64))
        print(f"{rows:>7} rows × {width:>3}, k = {k:>3}: " + ", ".join(line) + f"; same: {same}", flush=True)


if __name__ == "__main__":
    main()
