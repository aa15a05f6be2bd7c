"""Launching knng's CUDA selection kernels (the CUDA C sources in this folder).

Compiled and launched by :mod:`knng._cuda` (NVRTC through CuPy, on PyTorch's current stream).
Without CuPy the kernels' names still resolve, and calling them on a CUDA tensor raises an error
that says what to install.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from knng._cuda import opt_in_shared, available, launch_kernel, ptr

__all__ = ["available", "require", "kernel", "launch", "ptr"]

_HERE = Path(__file__).parent
_SOURCES = ("qms.cu", "baselines.cu")


def require(algorithm: str) -> None:
    """Raise a clear error when ``algorithm``'s CUDA kernel cannot run."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise RuntimeError(
            f"select={algorithm!r} runs a CUDA kernel compiled through CuPy, which is not installed: "
            "pip install cupy-cuda13x (or cupy-cuda12x, matching torch.version.cuda)") from None


def _source(name: str) -> str:
    common = (_HERE / "common.cuh").read_text()
    return (_HERE / name).read_text().replace('#include "common.cuh"', common)


@functools.cache
def _module(name: str, device_index: int) -> Any:
    import cupy

    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=_source(name), options=("-std=c++17",))
        module.compile()
    return module


@functools.cache
def kernel(source: str, name: str, device_index: int) -> Any:
    """The kernel ``name`` of ``source`` (e.g. ``"qms.cu"``), allowed all the shared memory a block gets."""
    if source not in _SOURCES:
        raise ValueError(f"unknown kernel source {source!r}")
    return opt_in_shared(_module(source, device_index).get_function(name), device_index)


def launch(source: str, name: str, device: torch.device, grid: int, block: int, args: tuple,
           shared_bytes: int = 0) -> None:
    """Launch ``name`` on ``device``'s current PyTorch stream.

    ``args`` must be NumPy scalars of the kernel's parameter types (``np.int32`` for ``int``,
    ``np.int64`` for ``long long``, ``np.uint32`` for ``unsigned``, :func:`ptr` for pointers):
    CuPy packs arguments by their own type, not by the kernel's signature.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    launch_kernel(kernel(source, name, index), device, grid, block, args, shared_bytes)
