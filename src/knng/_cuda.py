"""Compiling and launching CUDA C kernels through CuPy: the one build helper of knng's kernels.

Kernels are CUDA C sources inside the package (the k-selection kernels of ``knng/select/cuda``, the
engine's fused screen in ``knng/engine/kernels/cuda``), compiled at first use by NVRTC through CuPy
(``cupy.RawModule``; CuPy caches the binaries on disk) for the GPU in hand. CuPy is the one extra
a GPU user installs (``pip install "knng[cuda13]"`` or ``"knng[cuda12]"``, matching the CUDA of
their PyTorch). Kernels run on PyTorch's current stream of the tensor's device, on
PyTorch-allocated memory: nothing is copied or synchronised here.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["available", "device_capability", "source_kernel", "launch_kernel", "ptr", "opt_in_shared", "with_includes"]


def available() -> bool:
    """True when CUDA kernels can run here: a CUDA device and CuPy."""
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


#: Compute capabilities already asked for, by (device index, the function that answered):
#: every GPU call asks a few dozen times, and torch's answer costs ~30 µs of host time.
_CAPABILITIES: dict[tuple[int, object], tuple[int, int]] = {}


def device_capability(device: torch.device) -> tuple[int, int]:
    """The compute capability of CUDA ``device``, asked of torch once per device index (keyed by
    the asking function too, so that a test's stand-in for it is asked in its turn). A device
    without an index (the current one, which may change) is asked every time."""
    query = torch.cuda.get_device_capability
    if device.index is None:
        return tuple(query(device))
    key = (device.index, query)
    found = _CAPABILITIES.get(key)
    if found is None:
        found = _CAPABILITIES[key] = tuple(query(device))
    return found


@functools.cache
def source_kernel(path: str, name: str, device_index: int, defines: tuple[str, ...] = (),
                  arch: str | None = None) -> Any:
    """The kernel ``name`` of the CUDA C file ``path`` (another package's, e.g. the engine's
    fused screen), compiled once per device (and ``-D`` ``defines``) like this folder's, allowed
    all the shared memory a block gets.

    ``#include "file"`` lines naming a file beside ``path`` are pasted in (so that CuPy's cache
    key covers them). ``arch`` (e.g. ``"sm_90a"``, for the instructions of one chip only, such as
    Hopper's ``wgmma``) is passed to NVRTC besides the ``-arch`` of the device that CuPy adds, and
    NVRTC 13 compiles for the ``a`` target when given both (seen on 13.0; a kernel that does not
    compile raises CuPy's ``CompileException``).
    """
    import cupy

    options = ("-std=c++17",) + tuple(f"-D{d}" for d in defines) + (() if arch is None else (f"-arch={arch}",))
    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=with_includes(Path(path)), options=options)
        module.compile()
    return opt_in_shared(module.get_function(name), device_index)


def with_includes(path: Path) -> str:
    """The text of ``path`` with each ``#include "name"`` of a file beside it replaced by that file."""
    return re.sub(r'^#include "([^"/]+)"[^\n]*$', lambda m: (path.parent / m.group(1)).read_text(), path.read_text(),
                  flags=re.M)


def opt_in_shared(fn: Any, device_index: int) -> Any:
    """``fn`` allowed all the dynamic shared memory a block gets (above 48 KiB a kernel must opt in)."""
    import cupy

    optin = cupy.cuda.Device(device_index).attributes["MaxSharedMemoryPerBlockOptin"]
    fn.max_dynamic_shared_size_bytes = optin - fn.shared_size_bytes
    return fn


def launch_kernel(fn: Any, device: torch.device, grid: "int | tuple[int, ...]", block: int, args: tuple,
                  shared_bytes: int = 0) -> None:
    """Launch the compiled kernel ``fn`` on ``device``'s current PyTorch stream (see :func:`launch`);
    ``grid``: blocks, or a tuple of up to three grid dimensions."""
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _cupy_stream(torch.cuda.current_stream(index).cuda_stream, index)
    with cupy.cuda.Device(index), stream:
        fn(grid if isinstance(grid, tuple) else (grid,), (block,), args, shared_mem=shared_bytes)


def ptr(t: torch.Tensor | None) -> np.uint64:
    """A tensor's device address as a kernel argument (0 for None)."""
    return np.uint64(0 if t is None else t.data_ptr())


@functools.cache
def _cupy_stream(handle: int, device_index: int) -> Any:
    """CuPy's view of a PyTorch stream (made once per stream)."""
    import warnings

    import cupy

    with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external for protocol objects
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device_index)

