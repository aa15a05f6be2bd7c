"""What a device offers knng's kernels, asked once per device and handed to the planner.

A :class:`DeviceCapabilities` record holds the facts every "does this kernel run here?" question
starts from: the device's type and compute capability, whether Triton and CuPy are installed,
and whether the wgmma variant of the CUDA C screen compiles there. :func:`device_capabilities`
asks them of the machine once per device; the planner takes the record as an argument, so a
test plans for an H100 on a CPU by passing one (:meth:`DeviceCapabilities.hopper`), not by
patching torch.

Whether Triton runs in its interpreter (``TRITON_INTERPRET=1``, CPU tensors: the CI tests) is
read from the environment at each question (:func:`interpreting`), since Triton reads it when
its kernels' modules are imported.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

from knng import _cuda
from knng._options import get_options, kernel_forced
from knng.engine.kernels import cuda_screen

__all__ = ["DeviceCapabilities", "device_capabilities", "triton_installed", "interpreting", "triton_runs",
           "capabilities_of", "block_width", "ieee_options", "kernels_installed"]


@dataclass(frozen=True)
class DeviceCapabilities:
    """What one device offers the kernels.

    Attributes
    ----------
    device_type : str
        ``"cuda"`` or ``"cpu"`` (or another torch device type: no kernel runs there).
    compute_capability : tuple of int
        The GPU's (major, minor); (0, 0) off a GPU.
    triton : bool
        Triton is installed (its kernels compile for this device, or run in its interpreter).
    cupy : bool
        CuPy is installed and a CUDA device is present: the CUDA C kernels compile (NVRTC).
    wgmma : bool
        The wgmma variants of the CUDA C screen run here: compute capability 9.0 and an NVRTC
        that compiles them.
    """

    device_type: str
    compute_capability: tuple[int, int] = (0, 0)
    triton: bool = False
    cupy: bool = False
    wgmma: bool = False

    @property
    def tensor_cores(self) -> bool:
        """A GPU of compute capability 8.0 or newer (``mma.sync`` with 16-bit inputs, ``cp.async``)."""
        return self.device_type == "cuda" and self.compute_capability >= (8, 0)

    @classmethod
    def hopper(cls) -> "DeviceCapabilities":
        """An H100/H200 with Triton and CuPy: what a test passes to plan for one off a GPU."""
        return cls("cuda", (9, 0), triton=True, cupy=True, wgmma=True)

    @classmethod
    def cpu(cls) -> "DeviceCapabilities":
        """A CPU (Triton's kernels only in its interpreter, where ``Options.kernels`` forces them)."""
        return cls("cpu", triton=triton_installed())


@functools.cache
def triton_installed() -> bool:
    """Whether Triton can be imported here (without importing it; looked up once)."""
    return importlib.util.find_spec("triton") is not None


def kernels_installed() -> bool:
    """Whether any of knng's GPU kernels can compile here: Triton or CuPy is installed (looked
    up without importing either)."""
    return triton_installed() or _cupy_installed()


@functools.cache
def _cupy_installed() -> bool:
    return importlib.util.find_spec("cupy") is not None


def interpreting() -> bool:
    """Whether Triton's kernels run in its interpreter (``TRITON_INTERPRET=1``: CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


#: Capabilities found, by device index (a GPU's facts do not change within a process).
_FOUND: dict[int, DeviceCapabilities] = {}


def device_capabilities(device: torch.device) -> DeviceCapabilities:
    """The capabilities of ``device``, asked of the machine once per GPU (a CPU's are cheap).

    On a Hopper GPU with CuPy the first call compiles the wgmma screen once (the variant a
    search of K = 128 runs) to learn whether this NVRTC can. With
    ``Options.compiled_kernels`` off, a GPU offers neither Triton nor CuPy (nothing compiles,
    nothing is probed).
    """
    if device.type != "cuda":
        return _off_gpu(device.type)
    if not get_options().compiled_kernels:
        if not torch.cuda.is_available():
            return DeviceCapabilities("cuda")
        index = torch.cuda.current_device() if device.index is None else device.index
        return DeviceCapabilities("cuda", _cuda.device_capability(torch.device("cuda", index)))
    index = device.index
    found = None if index is None else _FOUND.get(index)  # the engine asks per block: a lookup
    if found is not None:
        return found
    if not torch.cuda.is_available():  # a plan for a GPU this machine lacks: no kernel of ours runs
        return DeviceCapabilities("cuda")
    index = torch.cuda.current_device() if index is None else index
    found = _FOUND.get(index)
    if found is None:
        capability = _cuda.device_capability(torch.device("cuda", index))
        cupy = _cuda.available()
        found = _FOUND[index] = DeviceCapabilities(
            "cuda", capability, triton=triton_installed(), cupy=cupy,
            wgmma=cupy and capability == (9, 0) and cuda_screen.wgmma_compiles(index))
    return found


@functools.cache
def _off_gpu(device_type: str) -> DeviceCapabilities:
    """A CPU's (or another non-CUDA device's) capabilities, made once."""
    return DeviceCapabilities.cpu() if device_type == "cpu" else DeviceCapabilities(device_type)


def capabilities_of(where: "DeviceCapabilities | torch.device") -> DeviceCapabilities:
    """``where`` itself, or the capabilities of the device ``where``; a GPU's without Triton and
    CuPy where ``Options.compiled_kernels`` is off."""
    if not isinstance(where, DeviceCapabilities):
        return device_capabilities(where)
    if where.device_type == "cuda" and not get_options().compiled_kernels:
        return DeviceCapabilities("cuda", where.compute_capability)
    return where


def triton_runs(where: "DeviceCapabilities | torch.device") -> bool:
    """Whether knng's Triton kernels run on ``where``: a GPU of compute capability 8.0 or newer
    with Triton installed (``tl.dot`` with 16-bit inputs needs Ampere), or wherever
    ``Options.kernels={"triton": ...}`` forces the answer (on a CPU the interpreter runs them)."""
    forced = kernel_forced("triton")
    if forced is not None:
        return forced
    caps = capabilities_of(where)
    return caps.tensor_cores and caps.triton


def block_width(n: int, at_least: int = 1) -> int:
    """The power of two from ``n`` up, and at least ``at_least``: a Triton block's width
    (``tl.arange`` spans powers of two)."""
    return max(at_least, 1 << max(0, n - 1).bit_length())


def ieee_options() -> dict:
    """Launch options of the Triton kernels whose values must be their torch reference's bit for
    bit: no fused multiply-adds (none to give in Triton's interpreter)."""
    return {} if interpreting() else dict(num_warps=4, enable_fp_fusion=False)
