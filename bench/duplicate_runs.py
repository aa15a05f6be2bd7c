"""``find_duplicates`` on data with nothing to fold (1M × 128, 1M × 960, 200k × 128 Gaussian
rows on a GPU), against the test it replaced: the longest run of equal fingerprints from a
cummax of the runs' starts (2.7 ms of a 1M-row search). Median of 15 CUDA-event timings, ms
(the figures of 2026-11-27 were timed by the host's clock around synchronisations). Usage (GPU
machine, repository root)::

    PYTHONPATH=src python bench/duplicate_runs.py
"""

import torch

from bench_fused import cuda_ms  # median of CUDA-event timings after two warm-ups
from knng.engine import duplicates


def folds_nothing_by_cummax(x: torch.Tensor, k: int) -> bool:
    """The replaced test: whether the longest run of equal sorted fingerprints is too short to fold."""
    keys = duplicates._fingerprints(x)
    sorted_keys = keys[duplicates._lexicographic_order(keys)]
    n = x.shape[0]
    starts = torch.ones(n, dtype=torch.bool, device=x.device)
    starts[1:] = (sorted_keys[1:] != sorted_keys[:-1]).any(dim=1)
    position = torch.arange(n, device=x.device)
    run_start = torch.cummax(torch.where(starts, position, 0), dim=0).values
    return int((position - run_start).max()) + 1 <= max(duplicates.GROUP_MIN, k + 1)


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, d in ((1_000_000, 128), (1_000_000, 960), (200_000, 128)):
        x = torch.randn((n, d), device="cuda", generator=gen)
        assert duplicates.find_duplicates(x, 10) is None and folds_nothing_by_cummax(x, 10)
        print(f"{n}x{d}: find_duplicates {cuda_ms(lambda: duplicates.find_duplicates(x, 10), 15):.2f} ms, "
              f"with the cummax test {cuda_ms(lambda: folds_nothing_by_cummax(x, 10), 15):.2f} ms, "
              f"fingerprints alone {cuda_ms(lambda: duplicates._fingerprints(x), 15):.2f} ms")


if __name__ == "__main__":
    main()
