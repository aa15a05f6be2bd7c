"""Quick multi-select: ``select="qms"``, ``"qms_sampled"``, ``"qms_block"`` and ``"qms_warp"``.

* ``qms_warp`` / ``qms_block`` — the paper's GPU quick multi-select (Komarov, Dashti & D'Souza
  2014), one warp or one thread block per row, random pivots, partitions written to two
  auxiliary arrays of 8-byte keys per row (16 bytes of workspace per score, taken in batches of
  rows that fit ``workspace_bytes``).
* ``qms_sampled`` — ``qms_block`` whose first pivot comes from a sample, set to keep about
  k(1+ε) entries, so the first pass already discards almost the whole row.
* ``qms`` — knng's single-pass variant: the sampled pivot, *one* read of the row that gathers
  the ≈k(1+ε) candidates in shared memory, and a bitonic sort there; no auxiliary arrays. A row
  whose candidates do not fit (many ties, or a sample far off) is flagged and finished by
  ``qms_block``, so the result is exact for every input.

All follow the order of :mod:`knng.select.keys` (NaN largest, ties by column), so their sorted
outputs equal :func:`knng.select.keys.select_reference` exactly; ``qms`` returns sorted rows
always (the sort is its last step anyway). On a CPU tensor they run the references of
:mod:`knng.select.reference.qms` (slow: tests and small blocks only). Float32 blocks; float16
and bfloat16 are widened exactly; float64 blocks reach these kernels as float32 keys through
the engine (``engine.thresholds.seed_candidates``) and are refused when passed directly.
"""

from __future__ import annotations

import numpy as np
import torch

from knng.select import cuda
from knng.select.keys import ordered_bits_torch
from knng.select.reference import qms as ref
from knng.select.registry import register

__all__ = ["qms_select", "qms_block_select", "qms_sampled_select", "qms_warp_select", "sort_rows",
           "check_block", "empty_selection"]

#: Threads per row in ``qms_block`` and rows per block in ``qms_warp`` (qms.cu's WARP_ROWS).
BLOCK_THREADS, WARP_ROWS = 512, 8
#: Seed of the pivot hash: fixed, so runs repeat exactly (the result never depends on it).
SEED = 0x5EED
#: Workspace for the auxiliary arrays of the paper's variants, unless the caller gives one.
DEFAULT_WORKSPACE = 2 << 30


def check_block(scores: torch.Tensor, k: int, algorithm: str) -> torch.Tensor:
    """Validate a score block for a float32 kernel; return it float32 with unit column stride."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(f"scores must be a 2-D tensor for select={algorithm!r}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= scores.shape[1]:
        raise ValueError(f"k must be an integer in [0, {scores.shape[1]}] for select={algorithm!r}, got {k!r}")
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    if scores.dtype != torch.float32:
        raise TypeError(f"select={algorithm!r} selects float32 scores, got {scores.dtype} "
                        "(the engine passes float64 blocks as float32 keys)")
    if scores.shape[1] >= 2**31 - 1:
        raise ValueError(f"select={algorithm!r} handles rows of fewer than 2^31 - 1 entries")
    if scores.stride(1) != 1 or scores.stride(0) < scores.shape[1]:
        scores = scores.contiguous()
    return scores


def sort_rows(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row of a selection by the composite key (ordered bits, then column)."""
    if values.numel() == 0:
        return values, indices
    composite = ((ordered_bits_torch(values) - 2**31) << 32) | indices
    order = torch.argsort(composite, dim=1)
    return torch.gather(values, 1, order), torch.gather(indices, 1, order)


def empty_selection(rows: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (rows, k) float32 values and int64 indices for a kernel to fill."""
    return (torch.empty((rows, k), dtype=torch.float32, device=device),
            torch.empty((rows, k), dtype=torch.int64, device=device))


def _on_cpu(scores: torch.Tensor, k: int, run) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply a per-row reference (returning composite keys) to a CPU block."""
    x = scores.numpy()
    keys = np.stack([run(x[r], r) for r in range(x.shape[0])]) if x.shape[0] else np.empty((0, k), np.uint64)
    _, idx = ref.keys_to_output(keys)
    values = np.take_along_axis(x, idx, axis=1)
    return torch.from_numpy(values), torch.from_numpy(idx)


def _paper_variant(scores: torch.Tensor, k: int, *, kernel: str, sampled: bool, sorted: bool,
                   rows: torch.Tensor | None = None, workspace_bytes: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``qms_block`` or ``qms_warp`` on all rows (or on ``rows``), in workspace-sized batches."""
    n = scores.shape[1]
    count = scores.shape[0] if rows is None else rows.numel()
    out_v, out_i = empty_selection(count, k, scores.device)
    if count == 0 or k == 0:
        return out_v, out_i
    rank = -1
    if sampled:
        plan = ref.filter_plan(n, k, BLOCK_THREADS)
        rank = plan[0] if plan is not None else -1
    budget = DEFAULT_WORKSPACE if workspace_bytes is None else workspace_bytes
    batch = max(1, min(count, budget // (16 * n)))
    if kernel == "qms_warp":
        batch = max(WARP_ROWS, batch // WARP_ROWS * WARP_ROWS)
    aux = torch.empty((2, min(batch, count), n), dtype=torch.int64, device=scores.device)
    ld, outs = np.int64(scores.stride(0)), np.int64(k)
    for b0 in range(0, count, batch):
        b1 = min(count, b0 + batch)
        ov, oi = out_v[b0:b1], out_i[b0:b1]
        if kernel == "qms_block":
            ids = None if rows is None else rows[b0:b1]
            args = (cuda.ptr(scores), ld, np.int32(n), np.int32(k), cuda.ptr(ids), np.int32(b0),
                    cuda.ptr(aux[0]), cuda.ptr(aux[1]), np.int64(n), cuda.ptr(ov), cuda.ptr(oi), outs,
                    np.uint32(SEED), np.int32(rank))
            cuda.launch("qms.cu", "qms_block", scores.device, b1 - b0, BLOCK_THREADS, args,
                        shared_bytes=8 * BLOCK_THREADS)
        else:
            args = (cuda.ptr(scores), ld, np.int32(n), np.int32(k), np.int32(b0), np.int32(b1 - b0),
                    cuda.ptr(aux[0]), cuda.ptr(aux[1]), np.int64(n), cuda.ptr(ov), cuda.ptr(oi), outs,
                    np.uint32(SEED))
            cuda.launch("qms.cu", "qms_warp", scores.device, -(-(b1 - b0) // WARP_ROWS), 32 * WARP_ROWS, args)
    return sort_rows(out_v, out_i) if sorted else (out_v, out_i)


def _paper_select(algorithm: str, kernel: str, sampled: bool, scores: torch.Tensor, k: int, sorted: bool,
                  workspace_bytes: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One of the paper's variants on any device: the kernel on CUDA, the reference elsewhere."""
    x = check_block(scores, k, algorithm)
    if x.device.type != "cuda":
        rank = -1
        if sampled:
            plan = ref.filter_plan(x.shape[1], k, BLOCK_THREADS)
            rank = plan[0] if plan is not None else -1
        v, i = _on_cpu(x, k, lambda row, r: ref.quick_multi_select(row, k, row=r, seed=SEED, sampled_rank=rank,
                                                                   threads=BLOCK_THREADS))
        return sort_rows(v, i) if sorted else (v, i)
    cuda.require(algorithm)
    return _paper_variant(x, k, kernel=kernel, sampled=sampled, sorted=sorted, workspace_bytes=workspace_bytes)


@register("qms_block")
def qms_block_select(scores: torch.Tensor, k: int, *, sorted: bool = False,
                     workspace_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's quick multi-select, one thread block per row (random pivots)."""
    return _paper_select("qms_block", "qms_block", False, scores, k, sorted, workspace_bytes)


@register("qms_sampled")
def qms_sampled_select(scores: torch.Tensor, k: int, *, sorted: bool = False,
                       workspace_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``qms_block`` with its first pivot taken from a sample (keeps about k(1+ε) entries)."""
    return _paper_select("qms_sampled", "qms_block", True, scores, k, sorted, workspace_bytes)


@register("qms_warp")
def qms_warp_select(scores: torch.Tensor, k: int, *, sorted: bool = False,
                    workspace_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's quick multi-select, one warp per row (random pivots)."""
    return _paper_select("qms_warp", "qms_warp", False, scores, k, sorted, workspace_bytes)


def filter_applies(cols: int, k: int) -> bool:
    """Whether ``qms`` finishes rows of ``cols`` in shared memory (else it runs ``qms_block``)."""
    return ref.filter_plan(cols, k, ref.FILTER_THREADS) is not None


@register("qms")
def qms_select(scores: torch.Tensor, k: int, *, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k smallest entries, ascending: sampled pivot, one read, sort in shared memory."""
    x = check_block(scores, k, "qms")
    rows, n = x.shape
    if rows == 0 or k == 0:
        return empty_selection(rows, k, x.device)
    if x.device.type != "cuda":
        v, i, _ = ref.filter_select(x.numpy(), k, seed=SEED)
        return torch.from_numpy(v), torch.from_numpy(i)
    cuda.require("qms")
    plan = ref.filter_plan(n, k, ref.FILTER_THREADS)
    if plan is None:  # k too large for shared memory: the paper's variant does all rows
        return _paper_variant(x, k, kernel="qms_block", sampled=True, sorted=True)
    rank, cap = plan
    out_v, out_i = empty_selection(rows, k, x.device)
    failed = torch.zeros(rows, dtype=torch.int32, device=x.device)
    args = (cuda.ptr(x), np.int64(x.stride(0)), np.int32(n), np.int32(k), cuda.ptr(out_v), cuda.ptr(out_i),
            np.int64(k), cuda.ptr(failed), np.uint32(SEED), np.int32(rank), np.int32(cap))
    shared = 8 * (cap + ref.next_pow2(k))  # candidates, then the k winners (qms.cu)
    cuda.launch("qms.cu", "qms_filter", x.device, rows, ref.FILTER_THREADS, args, shared_bytes=shared)
    redo = failed.nonzero().flatten().to(torch.int32)  # synchronises: rare rows, exact fallback
    if redo.numel():
        # The sampled first pass discards most of the row at once; random pivots then settle
        # the ties or the unlucky sample that sent the row here.
        v, i = _paper_variant(x, k, kernel="qms_block", sampled=True, sorted=True, rows=redo)
        out_v[redo.long()], out_i[redo.long()] = v, i
    return out_v, out_i


def qms_select_columns(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each *column*'s k smallest (a graph block's column candidates), as ``(cols, k)``.

    Selecting the transposed block by rows needs a transposed copy first; where the grouped
    filter applies it reads the columns in place instead, which costs less than that copy.
    """
    from knng.select.grouped import choose_group, grouped_select_columns

    if scores.is_cuda and choose_group(scores.shape[0], k):
        return grouped_select_columns(scores, k)
    return qms_select(scores.T, k)


qms_select.filter_applies = filter_applies  # type: ignore[attr-defined]
qms_select.columns = qms_select_columns  # type: ignore[attr-defined]
