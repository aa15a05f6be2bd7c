"""The total order every selection kernel follows, and the oracle that defines it.

Floats are not totally ordered (NaN, −0.0 = +0.0), so "the k smallest" needs a rule before two
kernels can be held to *identical* results. knng orders a float32 block the way a radix sort
of its bit patterns does — the order ``torch.topk`` and ``torch.sort`` use on CUDA:

* every NaN is larger than +inf (so NaNs are picked last, never first);
* −0.0 comes before +0.0 (their bit patterns differ);
* equal bit patterns are ordered by column index, smaller first.

Each entry therefore has a distinct 64-bit *composite key* ``(ordered bits << 32) | column``,
and a row's k smallest entries are the k smallest composite keys: one answer, whatever the
algorithm, the thread count or the pivots. The CUDA kernels compare these keys (or their
upper halves) and :func:`select_reference` is the float64-free oracle the tests compare with.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ordered_bits", "ordered_bits_torch", "composite_keys", "decode_bits", "select_reference",
           "NAN_BITS"]

#: The ordered key every NaN maps to: above all other floats, +inf included.
NAN_BITS = 0xFFFFFFFF


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """Map float32 values to uint32 keys whose unsigned order is the selection order."""
    v = np.ascontiguousarray(values, dtype=np.float32)
    u = v.view(np.uint32)
    mask = np.where(u & np.uint32(0x80000000), np.uint32(0xFFFFFFFF), np.uint32(0x80000000))
    keys = u ^ mask
    return np.where(np.isnan(v), np.uint32(NAN_BITS), keys).astype(np.uint32)


def ordered_bits_torch(values: torch.Tensor) -> torch.Tensor:
    """:func:`ordered_bits` for a float32 tensor, as int64 (torch has no uint32 arithmetic).

    The result lies in [0, 2³²) and orders like the uint32 keys, on any device.
    """
    u = values.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    keys = torch.where(u >= 0x80000000, u ^ 0xFFFFFFFF, u ^ 0x80000000)
    return torch.where(torch.isnan(values), torch.full_like(keys, NAN_BITS), keys)


def decode_bits(keys: np.ndarray) -> np.ndarray:
    """Invert :func:`ordered_bits` (NaN keys decode to a quiet NaN)."""
    k = np.asarray(keys, dtype=np.uint32)
    u = np.where(k & np.uint32(0x80000000), k ^ np.uint32(0x80000000), ~k).astype(np.uint32)
    out = u.view(np.float32).copy()
    out[k == np.uint32(NAN_BITS)] = np.nan
    return out


def composite_keys(values: np.ndarray) -> np.ndarray:
    """``(ordered bits << 32) | column`` for every entry of a 2-D float32 array, as uint64."""
    v = np.asarray(values, dtype=np.float32)
    cols = np.arange(v.shape[-1], dtype=np.uint64)
    return (ordered_bits(v).astype(np.uint64) << np.uint64(32)) | cols


def select_reference(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Oracle: each row's k smallest entries in the selection order, ascending.

    Returns ``(values, indices)`` with the block's own values (−0.0 and NaN payloads kept) and
    int64 column indices. Every algorithm's *sorted* output must equal this exactly.
    """
    v = np.asarray(values, dtype=np.float32)
    if v.ndim != 2:
        raise ValueError(f"values must be 2-D, got shape {v.shape}")
    if not 0 <= k <= v.shape[1]:
        raise ValueError(f"k must lie in [0, {v.shape[1]}], got {k}")
    order = np.argsort(composite_keys(v), axis=1, kind="stable")[:, :k].astype(np.int64)
    return np.take_along_axis(v, order, axis=1), order
