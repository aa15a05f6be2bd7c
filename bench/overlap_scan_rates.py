"""The finish's interval scan (``store._overlapping_sorted``) along the rows against the scan of
their transpose, on shapes of graph and search finishes. Usage (GPU machine)::

    PYTHONPATH=src python bench/overlap_scan_rates.py

It set ``store.SCAN_TRANSPOSED_ROWS`` (H200, 2026-11-26: 582,150 × 18 12.65 ms along the rows
against 0.89 transposed; 10,000 × 1,250 0.75 against 1.62).
"""

import torch


def along_rows(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    inf = torch.full_like(low[:, :1], torch.inf)
    prev_hi = torch.cat([-inf, torch.cummax(high, dim=1).values[:, :-1]], dim=1)
    next_lo = torch.cat([torch.flip(torch.cummin(torch.flip(low, [1]), dim=1).values, [1])[:, 1:], inf], dim=1)
    return (prev_hi >= low) | (next_lo <= high)


def transposed(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """The same scans along the first dimension of the transposes (the store's form on a GPU)."""
    low, high = low.t().contiguous(), high.t().contiguous()
    inf = torch.full_like(low[:1], torch.inf)
    prev_hi = torch.cat([-inf, torch.cummax(high, dim=0).values[:-1]], dim=0)
    next_lo = torch.cat([torch.flip(torch.cummin(torch.flip(low, [0]), dim=0).values, [0])[1:], inf], dim=0)
    return ((prev_hi >= low) | (next_lo <= high)).t()


def median_ms(fn, repeats: int = 10) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    for m, w in ((582150, 18), (582150, 40), (300000, 125), (100000, 136), (10000, 1250)):
        mid = torch.sort(torch.randn(m, w, device="cuda", dtype=torch.float64), dim=1).values
        r = torch.rand(m, w, device="cuda", dtype=torch.float64) * 0.01
        low, high = mid - r, mid + r
        low[:, w // 2:] = torch.inf
        high[:, w // 2:] = torch.inf
        assert torch.equal(along_rows(low, high), transposed(low, high))
        print(f"{m:,} x {w:,}: along the rows {median_ms(lambda: along_rows(low, high)):.2f} ms, "
              f"transposed {median_ms(lambda: transposed(low, high)):.2f} ms", flush=True)


if __name__ == "__main__":
    main()
