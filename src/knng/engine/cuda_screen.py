"""The fused float16 screen as a CUDA C kernel (``cuda/screen.cu``), compiled through CuPy.

Same contract as the Triton kernel of :mod:`knng.engine.fused` for scaled float16 rows
(``knng.metrics``, precision ``"float16"``): a 128 × 128 tile of ``A · Bᵀ`` on the tensor cores
(``mma.sync`` m16n8k16, float16 inputs, float32 accumulation, K in steps of
:data:`BLOCK_K` through a 3-stage ``cp.async`` pipeline), each sum multiplied by α·s_a and then
s_b (exact), the float32
terms added, column's first, and every entry compared with its row's threshold (and, in a
symmetric block, its column's). What CUDA C has and Triton does not: warp votes. A warp that
keeps nothing in its 64 × 32 part of the tile skips the append after one ``__any_sync``; one that
keeps something appends with one ``__ballot_sync`` per accumulator and one atomic per warp and
vote, so survivors cost a few instructions each instead of reductions over the tile.

``fused.screen_block`` launches it (inside its list sizing and relaunch) wherever CuPy is
installed; elsewhere the Triton kernel runs the same rows. Nothing here synchronises.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from knng.select import cuda

__all__ = ["available", "launch_screen", "TILE", "THREADS", "BLOCK_K", "shared_bytes"]

_SOURCE = str(Path(__file__).parent / "cuda" / "screen.cu")
#: The kernel's tile (BM = BN) and threads per block: the constants of ``cuda/screen.cu``.
TILE, THREADS = 128, 256
#: K step of the kernel's pipeline (its ``BK``, compiled in): 3 stages of a 128 × BLOCK_K slice
#: of A and of B. H100, 10,000 × 1M, nothing / ~15 / ~200 kept per row, 32 against 64: d = 128
#: 14.3 / 15.9 / 25.6 against 14.6 / 16.6 / 26.8 ms, d = 960 68.3 against 68.9; 32 needs 126
#: registers and no spill, 64 spills 36 bytes (``nvcc -arch=sm_90 -Xptxas -v -DBK=64``).
BLOCK_K = 32


def shared_bytes(block_k: int) -> int:
    """Dynamic shared memory of one block: 3 stages of A's and B's float16 slices."""
    return 3 * (TILE + TILE) * block_k * 2


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: a CUDA GPU of compute capability ≥ 8.0
    (``mma.sync`` with float16, ``cp.async``) and CuPy to compile it."""
    if device.type != "cuda" or not cuda.available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def launch_screen(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_factor: torch.Tensor, col_scale: torch.Tensor,
                  row_terms: torch.Tensor | None, col_terms: torch.Tensor | None, row_thr: torch.Tensor,
                  col_thr: torch.Tensor | None, exclude_diagonal: int | None,
                  lists: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], counters: torch.Tensor,
                  capacity: int) -> None:
    """Launch the screen of the block ``a · bᵀ`` on the current stream.

    Parameters
    ----------
    a, b : torch.Tensor
        (m, ≥k_dims) and (n, ≥k_dims) float16 CUDA tensors, rows contiguous and 16-byte aligned.
    k_dims : int
        Columns of the product, a multiple of 16 (the scaled rows' zero-padded value block).
    row_factor, col_scale : torch.Tensor
        float32 α·s per row of ``a`` and s per row of ``b``.
    row_terms, col_terms : torch.Tensor or None
        float32 terms added after the scaling (columns' first).
    row_thr, col_thr : torch.Tensor or None
        float32 thresholds per row of ``a`` and, for a symmetric block, per row of ``b``.
    exclude_diagonal : int or None
        Drop entries with ``row == col + exclude_diagonal``.
    lists : list of (owner, other, keys)
        One list per side (int32, int32, float32, each of ``capacity`` entries at least).
    counters : torch.Tensor
        int32 (2,) zeros: the entries each side found (also those past the capacity).
    capacity : int
        Entries a list holds; a slot past it writes nothing.
    """
    m, n = a.shape[0], b.shape[0]
    if k_dims % 16 or a.stride(1) != 1 or b.stride(1) != 1 or a.stride(0) % 8 or b.stride(0) % 8:
        raise ValueError("the CUDA screen needs float16 rows of 16-byte multiples and K a multiple of 16")
    if a.dtype != torch.float16 or b.dtype != torch.float16:
        raise TypeError(f"the CUDA screen takes float16 rows, got {a.dtype} and {b.dtype}")
    device = a.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    fn = cuda.source_kernel(_SOURCE, "screen_f16", index, (f"BK={BLOCK_K}",))
    row_list, col_list = lists[0], lists[-1]
    grid = -(-m // TILE) * -(-n // TILE)
    i32 = np.int32
    args = (cuda.ptr(a), cuda.ptr(b), i32(m), i32(n), i32(k_dims), i32(a.stride(0)), i32(b.stride(0)),
            cuda.ptr(row_factor), cuda.ptr(col_scale), cuda.ptr(row_terms), cuda.ptr(col_terms),
            cuda.ptr(row_thr), cuda.ptr(col_thr), cuda.ptr(row_list[0]), cuda.ptr(row_list[1]),
            cuda.ptr(row_list[2]), cuda.ptr(col_list[0]), cuda.ptr(col_list[1]), cuda.ptr(col_list[2]),
            cuda.ptr(counters), i32(capacity), i32(exclude_diagonal or 0), i32(exclude_diagonal is not None))
    cuda.launch_kernel(fn, device, grid, THREADS, args, shared_bytes(BLOCK_K))
