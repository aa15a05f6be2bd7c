"""The kernel backend: the engine's one door to its Triton, CUDA C and torch kernels.

What runs where is answered in one place, :mod:`~knng.engine.kernels.runs`, from a device's
:class:`~knng.engine.kernels.capabilities.DeviceCapabilities` (asked once per device, passed
to the planner), the block's precision, dimension and k, and ``Options.kernels``. Every
launcher here has a torch reference that runs where its kernel does not, with the same contract;
the tests hold each kernel to its reference (under Triton's interpreter on a CPU, and on a GPU).

The rest of the engine imports kernels from this package only (``tests/test_layering.py``
checks it), never from its modules. By topic, each launcher beside its kernels:

==================== =================================================================
``capabilities``     a device's facts; whether Triton's kernels run (``triton_runs``)
``compiling``        the kinds of call whose kernels are compiled; the background worker
                     that compiles the others (a small first call runs without them)
``runs``             what runs here: the screen's kernels, the triangle, strip and tile
                     minima, tiles first, k-th seeds
``fused``            the fused screen (product, threshold test, survivor lists) in Triton,
                     or the CUDA C kernel of ``cuda_screen`` (``cuda/*.cu``) for float16
``preparation``      the corpus pass and the scaled float16 rows
``radius``           threshold radii of rows and pairs; tightening and seeding τ
``row_kth``          order statistics per row (a row's first and k-th key, its k smallest)
``row_order``        a row's order by (distance, index)
``pairs``            exact values of pairs (the finish's evaluations)
``unfold``           duplicate groups unfolded into rows
``triton_*``         the Triton kernels of each topic, imported on first use
==================== =================================================================

Sizes of the data. Triton compiles a kernel again for each new combination of its integer
arguments' divisibility by 16 (and equality to 1). Sizes that follow the data (pairs held or
evaluated, a finish's widest row) take new values in every call, so a process could pay a
compile, or a load from the disk cache, in a call long after its first. Those arguments are not
specialised (``do_not_specialize``); sizes the plan fixes (parts, blocks, dimensions) still are.
A graph of new points every call with empty caches compiled 4 kernels in its seventh call
(445 ms against 40) before; none after the first since.
"""

from knng.engine.kernels.capabilities import (
    DeviceCapabilities, block_width, capabilities_of, device_capabilities, interpreting, kernels_installed,
    triton_runs,
)
from knng.engine.kernels.compiling import (
    compile_failures, compile_in_background, compiling, in_background, kind_ready, mark_ready, wait_for_kernels,
)
from knng.engine.kernels.fused import (
    Survivors, block_epilogue, group_tile_pairs, integer_block, screen_block, screen_tiles, select_block, strip_minima,
    tile_minima,
)
from knng.engine.kernels.pairs import pair_kernel_runs, pair_values
from knng.engine.kernels.preparation import (
    column_sums, finite_column_sums, lattice_extent, preparation_runs, prepare_rows,
)
from knng.engine.kernels.radius import block_radius, pair_radius, pair_radius_runs, radius_runs, seed_rows, tighten_rows
from knng.engine.kernels.row_kth import (
    KTH_ROW_MAX_WIDTH, NO_CODE, decoded, float32_up, kth_of_rows, kth_of_rows_reference, ordered_code, row_ends,
    row_kth_runs, row_slots, smallest_of_rows, SMALL_ROW_MAX_K, SMALL_ROW_MAX_WIDTH,
)
from knng.engine.kernels.row_order import row_order_runs, row_sort_runs, top_by_distance
from knng.engine.kernels.runs import (
    TILE, cuda_screen_runs, gathered_runs, kth_seeds_run, screen_kernel_runs, strip_minima_runs,
    strip_seeds_run, strip_width, tiles_first_runs, triangle_runs, wgmma_runs,
)
from knng.engine.kernels.unfold import unfold_rows, unfold_runs

__all__ = [
    # what runs here
    "DeviceCapabilities", "device_capabilities", "capabilities_of", "interpreting", "triton_runs", "cuda_screen_runs", "wgmma_runs",
    "triangle_runs", "strip_minima_runs", "gathered_runs", "screen_kernel_runs", "strip_seeds_run",
    "tiles_first_runs", "kth_seeds_run", "preparation_runs", "radius_runs", "pair_radius_runs", "row_kth_runs",
    "row_order_runs", "row_sort_runs", "unfold_runs", "strip_width", "TILE", "block_width", "kernels_installed",
    # kernels compiled in the background
    "kind_ready", "mark_ready", "compiling", "in_background", "compile_in_background", "wait_for_kernels",
    "compile_failures",
    # the screen
    "Survivors", "screen_block", "select_block", "strip_minima", "tile_minima", "screen_tiles", "group_tile_pairs",
    "block_epilogue", "integer_block",
    # preparation
    "column_sums", "finite_column_sums", "lattice_extent", "prepare_rows",
    # radii
    "block_radius", "pair_radius", "tighten_rows", "seed_rows",
    # order statistics and order of rows
    "NO_CODE", "decoded", "float32_up", "ordered_code", "row_ends", "row_slots", "smallest_of_rows", "kth_of_rows",
    "kth_of_rows_reference", "KTH_ROW_MAX_WIDTH", "SMALL_ROW_MAX_K", "SMALL_ROW_MAX_WIDTH", "top_by_distance",
    # exact pairs, duplicates
    "pair_kernel_runs", "pair_values", "unfold_rows",
]
