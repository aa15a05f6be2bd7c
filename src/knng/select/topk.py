"""``select="topk"``: PyTorch's own ``torch.topk`` (radix selection on CUDA, partial sort on CPU)."""

from __future__ import annotations

import torch

from knng.select.registry import register


@register("topk")
def topk_select(scores: torch.Tensor, k: int, *, sorted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each row of ``scores`` with their column indices."""
    return torch.topk(scores, k, dim=-1, largest=False, sorted=sorted)
