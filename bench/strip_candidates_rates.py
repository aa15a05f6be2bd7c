"""The k smallest strip minima of each row (a graph part's seeds, ``thresholds.strip_candidates``):
the kernel (``thresholds.smallest_of_rows``) against ``torch.topk`` and ``torch.sort``, CUDA-event
means of 20 calls after one, on rows of random float32 keys, each answer checked against a stable
sort. Usage (GPU machine, repository root)::

    PYTHONPATH=src python bench/strip_candidates_rates.py [--layouts]

Shapes: the 200k × 128 graph's three parts (66,667 rows, 128 strips of its 8,192-column sample,
k = 10), two parts of 98,304, all 200,000 rows at once, and 256 strips at k = 16. Then a search's
seeds above k = 32 (``thresholds.kth_of_rows``: each row's k-th strip minimum alone) against
``torch.topk``: the 200k × 128 graph by rows at k = 100 (1,024 strips of its 65,536-column sample,
k + 1 = 101) in one chunk and in chunks of 66,667, and 10k queries at k = 100.
"""

import sys

import torch

from knng.engine import row_kth, thresholds


def ms(call, repeats: int = 20) -> float:
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m, width, k in ((66_667, 128, 10), (98_304, 128, 10), (200_000, 128, 10), (66_667, 256, 16)):
        keys = torch.randn((m, width), device="cuda", generator=gen)
        cols = torch.arange(width, device="cuda").repeat(m, 1)
        values, picked = thresholds.smallest_of_rows(keys, cols, k)
        order = torch.sort(row_kth.ordered_code(keys), dim=1, stable=True).indices[:, :k]
        assert torch.equal(values, keys.gather(1, order)) and torch.equal(picked, order)
        kernel = ms(lambda: thresholds.smallest_of_rows(keys, cols, k))
        topk = ms(lambda: torch.topk(keys, k, dim=1, largest=False, sorted=False))
        sort = ms(lambda: torch.sort(keys, dim=1))
        print(f"{m:,} rows × {width} strips, k = {k}: kernel {kernel:.3f} ms, torch.topk {topk:.3f}, "
              f"torch.sort {sort:.3f} (kernel {topk / kernel:.1f}× topk)", flush=True)
    for m, width, k in ((200_000, 1024, 101), (66_667, 1024, 101), (10_000, 1024, 100)):
        keys = torch.randn((m, width), device="cuda", generator=gen)
        for got, want in zip(thresholds.kth_of_rows(keys, k), thresholds.kth_of_rows_reference(keys, k)):
            assert torch.equal(got, want)
        kernel = ms(lambda: thresholds.kth_of_rows(keys, k))
        topk = ms(lambda: torch.topk(keys, k, dim=1, largest=False, sorted=False))
        print(f"{m:,} rows × {width} strips, k-th of k = {k}: kernel {kernel:.3f} ms, torch.topk {topk:.3f} "
              f"(kernel {topk / kernel:.1f}× topk)", flush=True)
        if len(sys.argv) > 1 and sys.argv[1] == "--layouts":  # the kernel's rows a program and warps
            layout = thresholds.KTH_ROWS, thresholds.KTH_WARPS
            for rows, warps in ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (1, 4), (2, 4), (8, 4), (8, 8)):
                thresholds.KTH_ROWS, thresholds.KTH_WARPS = rows, warps
                for got, want in zip(thresholds.kth_of_rows(keys, k), thresholds.kth_of_rows_reference(keys, k)):
                    assert torch.equal(got, want)
                print(f"    {rows} rows a program, {warps} warps: {ms(lambda: thresholds.kth_of_rows(keys, k)):.3f} ms",
                      flush=True)
            thresholds.KTH_ROWS, thresholds.KTH_WARPS = layout


if __name__ == "__main__":
    main()
