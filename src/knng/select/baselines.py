"""The historical baselines: ``select="insertion"`` and ``select="bitonic"``.

Kept for the comparisons the papers make (``bench/bench_select.py``), not for speed: one thread per
row inserting into a sorted k-list in global memory (Garcia et al. 2008, Nolan 2009), and a
per-row truncated bitonic sort in shared memory (Sismanis et al. 2012). Both return sorted rows
in the order of :mod:`knng.select.keys`; on a CPU tensor they run the numpy references of
:mod:`knng.select.reference.baselines`.
"""

from __future__ import annotations

import numpy as np
import torch

from knng.select import cuda
from knng.select.qms import check_block, empty_selection
from knng.select.reference import baselines as ref
from knng.select.reference.qms import next_pow2
from knng.select.registry import register

__all__ = ["insertion_select", "bitonic_select", "BITONIC_MAX_K"]

#: Threads per block of the insertion kernel (one row each).
INSERTION_THREADS = 128
#: The bitonic kernel keeps 2·K keys of 8 bytes in shared memory: K ≤ 8192 is 128 KiB.
BITONIC_MAX_K = 8192


def _cpu(reference, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = reference(scores.numpy(), k)
    return torch.from_numpy(np.ascontiguousarray(values)), torch.from_numpy(np.ascontiguousarray(indices))


@register("insertion")
def insertion_select(scores: torch.Tensor, k: int, *, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest, ascending: one thread per row, insertion into a sorted k-list."""
    x = check_block(scores, k, "insertion")
    rows, n = x.shape
    if x.device.type != "cuda":
        return _cpu(ref.insertion_reference, x, k)
    out_v, out_i = empty_selection(rows, k, x.device)
    if rows == 0 or k == 0:
        return out_v, out_i
    cuda.require("insertion")
    lists = torch.empty((k, rows), dtype=torch.int64, device=x.device)
    args = (cuda.ptr(x), np.int64(x.stride(0)), np.int32(n), np.int32(k), np.int32(rows), cuda.ptr(lists),
            cuda.ptr(out_v), cuda.ptr(out_i), np.int64(k))
    cuda.launch("baselines.cu", "insertion_select", x.device, -(-rows // INSERTION_THREADS), INSERTION_THREADS,
                args)
    return out_v, out_i


@register("bitonic")
def bitonic_select(scores: torch.Tensor, k: int, *, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest, ascending: one block per row, truncated bitonic sort (k ≤ 8192)."""
    x = check_block(scores, k, "bitonic")
    rows, n = x.shape
    if k > BITONIC_MAX_K:
        raise ValueError(f"select='bitonic' keeps its list in shared memory: k must be ≤ {BITONIC_MAX_K}, got {k}")
    if x.device.type != "cuda":
        return _cpu(ref.bitonic_reference, x, k)
    out_v, out_i = empty_selection(rows, k, x.device)
    if rows == 0 or k == 0:
        return out_v, out_i
    cuda.require("bitonic")
    K = max(2, next_pow2(k))
    threads = max(32, min(1024, K // 2))
    args = (cuda.ptr(x), np.int64(x.stride(0)), np.int32(n), np.int32(k), np.int32(K), cuda.ptr(out_v),
            cuda.ptr(out_i), np.int64(k))
    cuda.launch("baselines.cu", "bitonic_select", x.device, rows, threads, args, shared_bytes=16 * K)
    return out_v, out_i
