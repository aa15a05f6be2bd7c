"""Tile shapes of the digit kernel (int8x4) on a GPU: time per shape and what the compiler made of it.

Times ``fused.screen_block(..., "int8x4")`` on a 10,000 × 1M × 128 block whose thresholds keep
nothing (the products and the compare, no compaction), for several tile configurations, and
counts the tensor-core instructions in the PTX of each (``wgmma`` on Hopper, ``mma`` before):
a kernel that spills or misses the tensor cores shows it here first. TF32 alone for reference.

Usage (GPU machine, repository root)::

    PYTHONPATH=src python bench/digit_kernel_tiles.py [--n 1000000] [--d 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fused import cuda_ms  # noqa: E402 - the same CUDA-event timing
from knng.engine import fused  # noqa: E402
from knng.metrics import get_metric  # noqa: E402

CONFIGS = [
    dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=10_000)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=128)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(1)
    a32 = torch.randn((args.m, args.d), generator=g, device="cuda")
    b32 = torch.randn((args.n, args.d), generator=g, device="cuda")
    metric = get_metric("sqeuclidean")
    q8 = metric.prepare(a32.double(), None, side="query", symmetric=False, dtype=torch.int8).vectors
    b8 = metric.prepare(b32.double(), None, side="corpus", symmetric=False, dtype=torch.int8).vectors
    terms = (b32.double() ** 2).sum(1).float()
    none = torch.full((args.m,), -1e30, device="cuda")
    tf32 = cuda_ms(lambda: fused.screen_block(a32 * -2.0, b32, args.d, none, None, None, terms, "tf32"))
    print(f"tf32 (current tiles): {tf32:.2f} ms")
    from knng.engine import _triton_kernels

    for cfg in CONFIGS:
        fused._digit_tile_config = lambda interpret, cfg=cfg: dict(cfg)
        try:
            ms = cuda_ms(lambda: fused.screen_block(q8, b8, args.d, none, None, None, terms, "int8x4"))
        except Exception as exc:  # noqa: BLE001 - a shape the compiler refuses is reported, not fatal
            print(f"{cfg}: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        ptx = ""
        try:  # the newest compiled variant (Triton 3.x keeps them per device, in order)
            for cache in _triton_kernels.digit_kernel.device_caches.values():
                for compiled in cache[0].values():
                    ptx = compiled.asm.get("ptx", "")
        except Exception:  # noqa: BLE001 - Triton's internals differ between versions
            ptx = ""
        counts = {op: ptx.count(op) for op in ("wgmma.mma_async", "mma.sync", "ld.local", "st.local")}
        print(f"{cfg}: {ms:.2f} ms; ptx {counts}", flush=True)


if __name__ == "__main__":
    main()
