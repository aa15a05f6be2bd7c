"""The fused screen kernel (Triton): product tile, threshold test and compact survivors in one pass.

One program computes a tile S̃[I, J] = A[I] · B[J]ᵀ on the tensor cores (bfloat16, float16, TF32,
split TF32 "tf32x3", or IEEE float32 inputs; float32 accumulation), adds the per-vector terms
in float32 (so that ‖b‖² never passes through a low-precision input), and compares every entry
with its row's threshold — and, in a symmetric graph block, with its column's. Survivors are
appended to one compact list (row, column, key, side) through a single atomic add per tile; the
score block is never written to memory. Most tiles keep nothing once the thresholds are tight,
so the compaction (a prefix sum over the tile) runs only in tiles that found something.

Contract (what :func:`screen_block` returns, checked against the CPU reference
:func:`knng.engine.screen.split_scores`): every pair whose key s̃ᵢⱼ ≤ tᵢ (or, symmetric,
s̃ᵢⱼ ≤ tⱼ) with s̃ the float32 key of the kernel's own product, at most ``E`` (the bound of the
plan's precision, ``docs/EXACTNESS.md``) from the exact score. The order of the list is not
defined (tiles append as they finish).

Triton is imported lazily: the module imports on machines without it, and
:func:`fused_available` says whether the kernel can run. Under ``TRITON_INTERPRET=1`` the same
kernel runs on CPU tensors (the CI tests do that; bfloat16 products are not trustworthy there).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

__all__ = ["fused_available", "screen_block", "BlockSurvivors", "DOT_PRECISION"]

#: Triton's ``input_precision`` for each screen precision with float32 storage; the
#: 16-bit precisions store their inputs in that type and need none.
DOT_PRECISION = {"float32": "ieee", "tf32": "tf32", "tf32x3": "tf32x3", "bfloat16": "ieee", "float16": "ieee"}

#: Most entries one survivor list holds: slots are int32 in the kernel (and the counter could
#: wrap past 2³¹); a block that keeps more is reported as out of memory, so the engine retries
#: it in smaller pieces.
MAX_LIST = 2**31 - 2**24

#: Survivor-list entries allocated per launch before the first overflow retry, per row of A.
INITIAL_PER_ROW = 64


def triton_installed() -> bool:
    """Whether Triton can be imported here (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def fused_available(device: torch.device) -> bool:
    """Whether the fused kernel can run on ``device`` (a CUDA GPU with Triton installed)."""
    return device.type == "cuda" and triton_installed() and _cuda_capability_ok(device)


def _cuda_capability_ok(device: torch.device) -> bool:
    # tl.dot on tensor cores with bfloat16 inputs needs Ampere (sm_80) or newer.
    return torch.cuda.get_device_capability(device) >= (8, 0)


@dataclass
class BlockSurvivors:
    """Pairs a block kept: positions in A and B, float32 keys and which test admitted each.

    ``side`` bit 1: the row's threshold; bit 2: the column's (symmetric blocks only).
    """

    rows: torch.Tensor
    cols: torch.Tensor
    keys: torch.Tensor
    side: torch.Tensor


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _kernel(interpret: bool):
    """The jitted kernel (built on first use: Triton reads ``TRITON_INTERPRET`` when it jits)."""
    import triton
    import triton.language as tl

    @triton.jit
    def screen_kernel(
        A, B, row_terms, col_terms, row_thr, col_thr,
        out_rows, out_cols, out_keys, out_side, counter,
        m, n, K, stride_a, stride_b, capacity, diag,
        HAS_ROW_TERMS: tl.constexpr, HAS_COL_TERMS: tl.constexpr, SYMMETRIC: tl.constexpr,
        EXCLUDE_DIAG: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):
        # Grouped tile order: GROUP_M row tiles sweep the columns together, so B's tiles are
        # re-read from L2 rather than from memory.
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(m, BLOCK_M)
        tiles_n = tl.cdiv(n, BLOCK_N)
        per_group = GROUP_M * tiles_n
        group = pid // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % size_m
        pid_n = (pid % per_group) // size_m

        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        row_ok = rm < m
        col_ok = rn < n
        a_ptr = A + rm[:, None].to(tl.int64) * stride_a + rk[None, :]
        b_ptr = B + rn[None, :].to(tl.int64) * stride_b + rk[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptr, mask=row_ok[:, None] & (rk[None, :] + k0 < K), other=0.0)
            b = tl.load(b_ptr, mask=col_ok[None, :] & (rk[:, None] + k0 < K), other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
            a_ptr += BLOCK_K
            b_ptr += BLOCK_K
        # The terms are added in float32, after the product (the bound's c_term).
        if HAS_COL_TERMS:
            acc += tl.load(col_terms + rn, mask=col_ok, other=0.0)[None, :]
        if HAS_ROW_TERMS:
            acc += tl.load(row_terms + rm, mask=row_ok, other=0.0)[:, None]
        valid = row_ok[:, None] & col_ok[None, :]
        if EXCLUDE_DIAG:
            valid = valid & (rm[:, None] != rn[None, :] + diag)
        t_row = tl.load(row_thr + rm, mask=row_ok, other=float("-inf"))
        by_row = valid & (acc <= t_row[:, None])
        keep = by_row
        if SYMMETRIC:
            t_col = tl.load(col_thr + rn, mask=col_ok, other=float("-inf"))
            by_col = valid & (acc <= t_col[None, :])
            keep = keep | by_col
        found = tl.sum(keep.to(tl.int32))
        if found > 0:
            base = tl.atomic_add(counter, found)
            # Reserve the tile's room with one atomic, then place each kept entry at its rank
            # in the tile (a prefix sum over the flattened tile). Per-row scans along the
            # tile's own axes measured 10–25 % slower in TF32 and int64 slots spilled.
            flat_keep = tl.reshape(keep, (BLOCK_M * BLOCK_N,))
            rank = tl.cumsum(flat_keep.to(tl.int32), axis=0) - 1
            slot = base + rank  # int32: the list holds < 2³¹ entries (see screen_block)
            ok = flat_keep & (slot < capacity) & (slot >= 0)  # >= 0: a wrapped counter writes nothing
            rows2 = tl.reshape(tl.broadcast_to(rm[:, None], (BLOCK_M, BLOCK_N)), (BLOCK_M * BLOCK_N,))
            cols2 = tl.reshape(tl.broadcast_to(rn[None, :], (BLOCK_M, BLOCK_N)), (BLOCK_M * BLOCK_N,))
            tl.store(out_rows + slot, rows2, mask=ok)
            tl.store(out_cols + slot, cols2, mask=ok)
            tl.store(out_keys + slot, tl.reshape(acc, (BLOCK_M * BLOCK_N,)), mask=ok)
            if SYMMETRIC:
                side = by_row.to(tl.int8) + 2 * by_col.to(tl.int8)
                tl.store(out_side + slot, tl.reshape(side, (BLOCK_M * BLOCK_N,)), mask=ok)

    return screen_kernel


def _tile_config(precision: str, interpret: bool) -> dict:
    """Tile shapes, measured on an H100 (``bench/bench_fused.py --part kernel``, 2026-11-22).

    bfloat16: 128 × 128 tiles, K steps of 64, 3 stages (163 TFLOP/s at d = 128, 408 at d = 960
    with no survivors). 128 × 256 tiles were 10 % faster with no survivors but 5–10× slower in
    tiles that keep something (14 kept per row of 1M columns: 160 ms instead of 15; the
    compaction's registers spill). Float32 storage (TF32, tf32x3): 128 × 128, K steps of 32.
    Appending survivors with one atomic per kept entry instead of one per tile ran 2–5× slower
    (predicated atomics cost even where nothing is kept).
    """
    if interpret:
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=4, num_warps=4, num_stages=1)
    if precision in ("bfloat16", "float16"):
        return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)


def screen_block(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_thr: torch.Tensor,
                 col_thr: torch.Tensor | None, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None,
                 precision: str, exclude_diagonal: int | None = None,
                 capacity_hint: int | None = None) -> BlockSurvivors:
    """Survivors of the block ``A[:, :k_dims] · B[:, :k_dims]ᵀ (+ terms)`` against the thresholds.

    Parameters
    ----------
    a, b : torch.Tensor
        (m, ≥k_dims) and (n, ≥k_dims) prepared vectors (rows contiguous), float32 or the
        precision's 16-bit type; A carries the metric's scale α.
    k_dims : int
        Columns of the product (the input dimension d; the layout's term columns are skipped).
    row_thr, col_thr : torch.Tensor
        float32 thresholds on the float32 key, per row of A and (symmetric blocks) per row of B.
    row_terms, col_terms : torch.Tensor or None
        float32 terms added to each row / column of the product.
    precision : str
        A key of :data:`DOT_PRECISION`.
    exclude_diagonal : int or None
        Drop entries with ``row == col + exclude_diagonal`` (a point and itself).
    capacity_hint : int or None
        Expected survivors; the list grows (one relaunch) when a block keeps more.
    """
    interpret = _interpreting()
    kernel = _kernel(interpret)
    m, n = a.shape[0], b.shape[0]
    device = a.device
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("screen_block needs rows stored contiguously")
    cfg = dict(_tile_config(precision, interpret))
    num_warps, num_stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    grid = (-(-m // cfg["BLOCK_M"]) * -(-n // cfg["BLOCK_N"]),)
    capacity = max(1024, capacity_hint if capacity_hint is not None else INITIAL_PER_ROW * m)
    capacity = min(capacity, MAX_LIST)
    symmetric = col_thr is not None
    dummy = row_thr
    while True:
        counter = torch.zeros(1, dtype=torch.int32, device=device)
        out_rows = torch.empty(capacity, dtype=torch.int32, device=device)
        out_cols = torch.empty(capacity, dtype=torch.int32, device=device)
        out_keys = torch.empty(capacity, dtype=torch.float32, device=device)
        out_side = torch.empty(capacity if symmetric else 1, dtype=torch.int8, device=device)
        extra = {} if interpret else dict(num_warps=num_warps, num_stages=num_stages)
        kernel[grid](
            a, b, row_terms if row_terms is not None else dummy, col_terms if col_terms is not None else dummy,
            row_thr, col_thr if symmetric else dummy,
            out_rows, out_cols, out_keys, out_side, counter,
            m, n, k_dims, a.stride(0), b.stride(0), capacity,
            0 if exclude_diagonal is None else exclude_diagonal,
            HAS_ROW_TERMS=row_terms is not None, HAS_COL_TERMS=col_terms is not None, SYMMETRIC=symmetric,
            EXCLUDE_DIAG=exclude_diagonal is not None, PRECISION=DOT_PRECISION[precision],
            **cfg, **extra,
        )
        found = int(counter.item())
        if found <= capacity:
            break
        if found < 0 or found > MAX_LIST:
            raise RuntimeError(f"CUDA out of memory: a screen block kept more pairs than one list holds "
                               f"({MAX_LIST}); smaller blocks are needed")
        capacity = found  # the same thresholds keep the same pairs: one relaunch fits them all
    side = (out_side[:found] if symmetric
            else torch.ones(found, dtype=torch.int8, device=device))
    return BlockSurvivors(rows=out_rows[:found].long(), cols=out_cols[:found].long(), keys=out_keys[:found],
                          side=side)
