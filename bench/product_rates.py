"""The dense products an exact 16,384 × 4,096 graph could be built on, timed on one GPU.

Times ``x @ x.T`` for 16,384 Gaussian rows of 4,096 values in float64 (cuBLAS's FP64 tensor
cores), float16, bfloat16, float32 and int8 (``torch._int_mm``, cuBLASLt), and one 2,048-row band
of the float64 and int8 products (a symmetric block's band), best of 5 after a warm-up. They
bound what any exact method can cost here (``docs/BENCHMARKS.md``, "Session 18"). Usage (GPU)::

    PYTHONPATH=src python bench/product_rates.py
"""

from __future__ import annotations

import torch


def best_ms(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    n, d = 16384, 4096
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn((n, d), device="cuda", generator=gen)
    x64, x16, xb = x.double(), x.half(), x.bfloat16()
    xi = torch.randint(-127, 128, (n, d), device="cuda", dtype=torch.int8, generator=gen)
    print(torch.cuda.get_device_name())
    for name, fn in (("float64", lambda: x64 @ x64.T), ("float16", lambda: x16 @ x16.T),
                     ("bfloat16", lambda: xb @ xb.T), ("float32", lambda: x @ x.T),
                     ("int8", lambda: torch._int_mm(xi, xi.T))):
        ms = best_ms(fn)
        print(f"{name}: {ms:.2f} ms, {2 * n * n * d / ms / 1e9:.1f} T op/s")
    band = 2048
    for name, fn in (("float64 band", lambda: x64[:band] @ x64.T),
                     ("int8 band", lambda: torch._int_mm(xi[:band], xi.T))):
        ms = best_ms(fn)
        print(f"{name} ({band} rows): {ms:.3f} ms, {2 * band * n * d / ms / 1e9:.1f} T op/s")


if __name__ == "__main__":
    main()
