"""What runs here: the one place that answers which kernel serves a block.

Every question is asked of a device, or of the :class:`~knng.engine.kernels.capabilities.DeviceCapabilities`
a planner was given, with the block's precision, dimension and k; the planner asks them once
when it makes a plan, the engine once per block. ``Options.kernels`` forces any answer on or off
(:func:`knng._options.kernel_forced`); forced on off the kernels' devices, the kernels'
references (or Triton's interpreter) run in their place.

The kernels' own limits on a call's shapes (a row's width, a list's length) stay with their
launchers, which ask :func:`~knng.engine.kernels.capabilities.triton_runs` for the device.
"""

from __future__ import annotations

import torch

from knng._options import get_options, kernel_forced
from knng.engine.kernels import cuda_screen, row_kth
from knng.engine.kernels.capabilities import DeviceCapabilities, capabilities_of, interpreting, triton_runs
from knng.metrics import ScreenPrecision, get_precision, scaled_width

__all__ = ["cuda_screen_runs", "wgmma_runs", "triangle_runs", "strip_minima_runs", "gathered_runs",
           "screen_kernel_runs", "strip_seeds_run", "tiles_first_runs", "kth_seeds_run", "strip_width", "TILE"]

#: Columns of one tile of the tile minima and of the gathered screen (the wgmma kernel's tile).
TILE = cuda_screen.TILE

def strip_width() -> int:
    """Columns of one strip of the strip minima (the CUDA kernel's: a warp's columns). Read from
    the kernel's module at each call: a test runs the minima's reference in narrower strips."""
    return cuda_screen.STRIP


def _precision(precision: "ScreenPrecision | str") -> ScreenPrecision:
    return precision if isinstance(precision, ScreenPrecision) else get_precision(precision)


def cuda_screen_runs(where: DeviceCapabilities | torch.device) -> bool:
    """Whether the CUDA C screen (:mod:`~knng.engine.kernels.cuda_screen`) runs on ``where``: a GPU
    of compute capability 8.0 or newer with CuPy to compile it, ``Options.cuda_screen`` on, and
    Triton not in its interpreter (whose tests run the Triton kernel in its place)."""
    caps = capabilities_of(where)
    return get_options().cuda_screen and not interpreting() and caps.cupy and caps.tensor_cores


def wgmma_runs(where: DeviceCapabilities | torch.device, k_dims: int) -> bool:
    """Whether the CUDA C screen's wgmma variants run for K = ``k_dims`` (scaled float16 columns)
    on ``where``: a Hopper GPU whose NVRTC compiles them, K ≤ ``cuda_screen.WGMMA_MAX_K``, and
    ``Options.wgmma`` on."""
    caps = capabilities_of(where)
    return get_options().wgmma and k_dims <= cuda_screen.WGMMA_MAX_K and cuda_screen_runs(caps) and caps.wgmma


def triangle_runs(where: DeviceCapabilities | torch.device, precision: "ScreenPrecision | str", k_dims: int) -> bool:
    """Whether a square block's upper triangle is screened (each pair once, against both points'
    thresholds) for ``precision`` and input dimension ``k_dims``: scaled float16 rows and the
    wgmma kernel."""
    forced = kernel_forced("triangle")
    if forced is not None:
        return forced
    return _precision(precision).scaled and wgmma_runs(where, scaled_width(k_dims))


def strip_minima_runs(where: DeviceCapabilities | torch.device, precision: "ScreenPrecision | str") -> bool:
    """Whether the CUDA kernel's strip minima run for ``precision``: scaled float16 rows and the
    CUDA C screen (the Triton kernels have no minima epilogue)."""
    forced = kernel_forced("strip_minima")
    if forced is not None:
        return forced
    return _precision(precision).scaled and cuda_screen_runs(where)


def gathered_runs(where: DeviceCapabilities | torch.device, precision: "ScreenPrecision | str", k_dims: int) -> bool:
    """Whether the tile minima and the screen of gathered rows run their kernels for
    ``precision`` and input dimension ``k_dims``: scaled float16 rows and the wgmma kernel."""
    return _precision(precision).scaled and wgmma_runs(where, scaled_width(k_dims))


def screen_kernel_runs(where: DeviceCapabilities | torch.device, precision: "ScreenPrecision | str") -> bool:
    """Whether a kernel (the fused one, the digit one or the integer one) runs ``precision``'s screen."""
    p = _precision(precision)
    return p.kernel and triton_runs(where)


def strip_seeds_run(where: DeviceCapabilities | torch.device, precision: "ScreenPrecision | str", columns: int,
                    k: int) -> bool:
    """Whether k seeds per row from ``columns`` sample columns come from the kernel's strip
    minima: where the CUDA kernel finds them and the sample has 2k strips or more (k distinct
    columns near each row's k smallest); else from the materialised block."""
    forced = kernel_forced("strip_seeds")
    if forced is not None:
        return forced
    return 2 * k <= -(-columns // strip_width()) and strip_minima_runs(where, precision)


def tiles_first_runs(where: DeviceCapabilities | torch.device, precision: "ScreenPrecision | str", d: int) -> bool:
    """Whether a search may take its tiles first for ``precision`` and dimension ``d``: where the
    tile minima and the gathered screen run their kernels, or where ``Options.kernels`` forces
    them on (then, off the kernels' devices, their references run in their place)."""
    forced = kernel_forced("tiles_first")
    return gathered_runs(where, precision, d) if forced is None else forced


def kth_seeds_run(where: DeviceCapabilities | torch.device, rows: int, strips: int, k: int) -> bool:
    """Whether a search's seeds take each row's k-th strip minimum alone
    (``row_kth.kth_of_rows``) rather than its k smallest and their columns: for ``rows`` rows of
    ``strips`` strip minima, above the register kernel's k, where Triton runs. Decided from the
    shape, before the strip minima are computed.

    The k-th smallest of k distinct columns' keys plus an error radius valid for every key up
    to it bounds a row's k-th true key, as a store's tightening does, so no column is needed.
    ``torch.topk`` of 101 of 1,024 strip minima took 5.85 ms for 200,000 rows, the kernel 2.58
    (H200, 200k × 128 graph by rows at k = 100: 80.5 → 77.6 ms)."""
    forced = kernel_forced("kth_seeds")
    if forced is False:
        return False
    return (row_kth.SMALL_ROW_MAX_K < k <= strips <= row_kth.KTH_ROW_MAX_WIDTH and rows > 0
            and bool(forced or triton_runs(where)))
