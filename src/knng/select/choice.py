"""The choice behind ``select="auto"``: the fastest algorithm measured for the shape and device.

It sits above the registry and the algorithms it chooses among (importing them registers them).
"""

from __future__ import annotations

import torch

from knng._options import get_options
from knng.select import cuda, qms, topk  # noqa: F401  (registered: "qms", "topk")
from knng.select.grouped import choose_group
from knng.select.registry import SelectFn, get

__all__ = ["resolve", "LONG_ROW"]

#: Rows longer than this count as "long" for ``select="auto"`` (see :func:`resolve`).
LONG_ROW = 1 << 18


def resolve(name: str, *, rows: int, cols: int, k: int, device: torch.device, without_sync: bool = False
            ) -> SelectFn:
    """Return the function for ``select=name`` on a block of ``rows × cols`` with this ``k``.

    ``"auto"`` picks the fastest algorithm measured for the shape (``docs/BENCHMARKS.md``): on a
    GPU with the CUDA kernels available (CuPy), knng's single-pass quick multi-select ``qms``
    wherever its candidates fit in shared memory (3.4–5.6× faster than ``torch.topk`` on
    8192 × 65536 blocks, k = 64 … 2048, H100), except on rows longer than ``LONG_ROW`` with
    k ≤ 128, where the grouped filter measured a little faster; else the grouped filter where
    it applies (small k next to the row length); else ``torch.topk``. On a CPU ``torch.topk`` (its partial
    sort beats every reference there).

    ``without_sync``: ``"auto"`` leaves out ``qms``, which reads back the rows its sampled pass
    failed (a synchronisation with the host): a small call's selection must not stall the host's
    launches behind it (a 5,000 × 128 graph by the direct path, H200: 3.1 ms with qms, 2.1 with
    ``torch.topk``). With ``Options.compiled_kernels`` off, ``"auto"`` leaves out qms too.
    """
    if not isinstance(name, str):
        raise TypeError(f"select must be a string naming an algorithm, got {type(name).__name__}")
    if name == "auto":
        if device.type != "cuda":
            return get("topk")
        qms = get("qms")
        # On rows of a million the grouped filter streams as fast and wins for small k (search
        # 1M × 128, k = 10: 98 against 103 ms); qms wins for larger k (k = 1024: 151 against 166).
        long_rows_small_k = cols > LONG_ROW and k <= 128 and choose_group(cols, k)
        fits = qms.filter_applies(cols, k)  # type: ignore[attr-defined]
        compiled = get_options().compiled_kernels  # qms is compiled through CuPy's NVRTC
        if not without_sync and compiled and cuda.available() and fits and not long_rows_small_k:
            return qms
        if choose_group(cols, k):
            return get("grouped")
        return get("topk")
    return get(name)
