"""Sweep the preparation kernels' block sizes (``knng.engine.preparation``) on 1M × 128 and
1M × 960 float32: the corpus pass's column sums (rows per program, tile rows, column block)
and the scaled float16 rows (rows per program, column step); CUDA events, median of 10, the
prepared rows checked bit for bit against those of the module's present sizes. Usage (GPU
machine, repository root)::

    PYTHONPATH=src python bench/preparation_blocks.py

It chose the sizes of 2026-11-27 (``docs/results/2026-11-27-h200-session12-preparation-sweep.txt``;
that run swept one shared column block, before the corpus pass got its own).
"""

import itertools
import statistics

import torch

from bench_fused import cuda_ms as median_ms  # the same CUDA-event timing
from knng.engine import preparation
from knng.metrics import get_metric

SIZES = ("SUM_ROWS", "SUM_TILE_ROWS", "SUM_COLUMN_BLOCK", "ROW_BLOCK", "COLUMN_BLOCK")


def main() -> None:
    metric = get_metric("euclidean")
    gen = torch.Generator(device="cuda").manual_seed(0)
    present = {name: getattr(preparation, name) for name in SIZES}
    print("present sizes:", present)

    def use(**sizes: int) -> None:
        for name, value in {**present, **sizes}.items():
            setattr(preparation, name, value)

    for d in (128, 960):
        x = torch.randn((1_000_000, d), device="cuda", generator=gen) + 3.0
        centre = x.double().mean(dim=0)

        def prepared() -> torch.Tensor:
            return preparation.prepare(metric, x, centre, side="corpus", symmetric=False, dtype=torch.float16).vectors

        want = prepared().view(torch.int16).clone()
        sums = []
        for rows, tile, block in itertools.product((1024, 2048, 4096), (16, 32, 64), (64, 128, 256)):
            use(SUM_ROWS=rows, SUM_TILE_ROWS=tile, SUM_COLUMN_BLOCK=block)
            sums.append((median_ms(lambda: preparation.column_sums(x)), f"rows {rows}, tile {tile}, block {block}"))
        preps = []
        for rows, block in itertools.product((8, 16, 32, 64), (64, 128, 256)):
            use(ROW_BLOCK=rows, COLUMN_BLOCK=block)
            same = torch.equal(prepared().view(torch.int16), want)
            preps.append((median_ms(prepared), f"rows {rows}, block {block}, same rows {same}"))
        use()
        print(f"d = {d}: column sums, fastest: " + "; ".join(f"{t:.3f} ms {s}" for t, s in sorted(sums)[:4]))
        print(f"d = {d}: scaled rows, fastest: " + "; ".join(f"{t:.3f} ms {s}" for t, s in sorted(preps)[:4]))
        print(f"d = {d}: present sizes: column sums {median_ms(lambda: preparation.column_sums(x)):.3f} ms, "
              f"scaled rows {median_ms(prepared):.3f} ms")
        del x


if __name__ == "__main__":
    main()
