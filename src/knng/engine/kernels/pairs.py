"""Exact values of pairs on the GPU: the pair kernel (``triton_pairs.pair_squares_kernel``).

The finish's exact evaluations (:mod:`knng.engine.exact`) read each pair's two rows where they
lie and sum their squared differences in float64 registers, instead of gathering float64 copies
of both rows of every pair.
"""

from __future__ import annotations

import torch

from knng.engine import stages
from knng.engine.kernels.capabilities import interpreting, triton_runs
from knng.metrics import Metric

__all__ = ["pair_values", "pair_kernel_runs", "KERNEL_METRICS"]


def _triton():
    """This module's Triton kernel (:mod:`knng.engine.kernels.triton_pairs`), imported on first use
    (Triton must be installed)."""
    from knng.engine.kernels import triton_pairs

    return triton_pairs


#: Metrics whose exact values the pair kernel computes: sums of squared differences (the
#: Euclidean distance is their square root, taken by torch, correctly rounded).
KERNEL_METRICS = frozenset({"euclidean", "sqeuclidean"})
#: Pairs per program of the pair kernel, and dimensions per step (in the interpreter: smaller).
PAIR_BLOCK, PAIR_DIMS = 16, 128


def pair_kernel_runs(metric: Metric, device: torch.device) -> bool:
    """Whether the pair kernel computes ``metric``'s exact values on ``device``."""
    return metric.name in KERNEL_METRICS and triton_runs(device)


def pair_values(metric: Metric, left: torch.Tensor | None, rows: torch.Tensor, right: torch.Tensor | None,
               cols: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The pairs' exact values from the pair kernel (``triton_pairs.pair_squares_kernel``),
    or None where it does not apply: a metric outside :data:`KERNEL_METRICS`, either side not a
    tensor on ``device``, or no kernel there (:func:`~knng.engine.kernels.capabilities.triton_runs`).

    The reference gathers both rows of every pair as float64 copies and sums their squared
    differences (``Metric.exact``): at d = 960, 10k queries and k = 100 about 15 GB through
    memory. The kernel reads each input row where it lies and keeps the float64 values in
    registers; the sums differ from the reference's only in their order, within the float64
    evaluation's error bound (``Metric.oracle_error``) that the stores' radii already carry.
    """
    if left is None or right is None or not pair_kernel_runs(metric, device):
        return None
    if device.type == "cuda" and device.index is None:  # "cuda": the current device, as tensors name it
        device = torch.device("cuda", torch.cuda.current_device())
    if left.device != device or right.device != device or left.dim() != 2 or right.dim() != 2:
        return None
    shape = cols.shape
    pair_rows = (rows[:, None].expand(shape) if cols.dim() == 2 else rows).reshape(-1).to(device).contiguous()
    pair_cols = cols.reshape(-1).to(device).contiguous()
    left = left if left.stride(1) == 1 else left.contiguous()
    right = right if right.stride(1) == 1 else right.contiguous()
    out = torch.empty(pair_cols.numel(), dtype=torch.float64, device=device)
    stages.count("finish.exact_kernel")
    block, dims = (16, 16) if interpreting() else (PAIR_BLOCK, PAIR_DIMS)
    if out.numel():
        _triton().pair_squares_kernel[(-(-out.numel() // block),)](
            left, pair_rows, right, pair_cols, out, out.numel(), left.shape[1], left.stride(0), right.stride(0),
            BLOCK_P=block, BLOCK_D=dims)
    if metric.name == "euclidean":
        out = torch.sqrt(out)
    return out.view(shape)
