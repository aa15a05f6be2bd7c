"""The fused float16 screen as a CUDA C kernel (``cuda/screen.cu``), compiled through CuPy.

Same contract as the Triton kernel of :mod:`knng.engine.kernels.fused` for scaled float16 rows
(``knng.metrics``, precision ``"float16"``): every entry of ``A · Bᵀ`` (tensor cores, float16
inputs, float32 accumulation) multiplied by α·s_a and then s_b, the float32 terms added (the
column's first), each step rounded as the reference rounds it, and compared with its row's
threshold (and, in a symmetric block, its column's); survivors go to one compact list per side.

What the CUDA C kernel does that the Triton one does not (``cuda/screen.cu`` has the details):
each block keeps one block of A's rows in shared memory and sweeps a range of column tiles
(persistent and row-stationary: B streams once from memory, then from L2, and the next tiles'
copies are in flight during a tile's epilogue); a non-symmetric block tests a one-rounding
bound first (two float operations an entry, the exact key only for its few candidates); and
survivors are appended by warp votes into per-warp buffers in shared memory, so a tile that
keeps nothing costs one vote per 16 rows and one that keeps a few costs no global atomic.
H100, 10,000 × 2^20, K = 128, ~0 / ~15 / ~200 pairs kept per row: 7.6 / 8.3 / 10.1 ms
(Triton, bfloat16: 19.8 / 22.4 / 41.0); the header of ``cuda/screen.cu`` has the other shapes.

On a Hopper GPU (compute capability 9.0) a block of K ≤ 256 runs ``cuda/screen_wg.cu`` instead:
the same epilogue (``cuda/screen_common.cuh``) after asynchronous warpgroup products
(``wgmma``, sm_90a). To K = 128 each warpgroup multiplies a tile into its one set of
accumulators and then screens it, two blocks sharing a multiprocessor so that one block's
products run while the other's warps screen (``wg128x128s1``); past it, where one block is all
that fits, a warpgroup screens one tile while the tensor cores multiply the next into a second
set. H200, 28,672² block, K = 128, nothing kept: 426 TFLOP/s non-symmetric and 306 symmetric
(two sets: 350 and 251; mma.sync 286–310 and 216–248), and 21–31 % faster than two sets with
survivors (``docs/FINDINGS.md``, "Screen precision and kernels"); H100, K = 256 (two
sets, two B tiles in its ring): 437 against 256 non-symmetric, 379 against 301 symmetric.
Its symmetric variant also screens a graph part's own block as its upper triangle
(``triangle``: each pair once, against both points' thresholds): H200, 28,672², nothing kept,
0.50 against 0.69 ms for the rows screen of the whole block at K = 128, 0.73 against 1.16 at
K = 256 ("A part's own block as its upper triangle").

Two more wgmma variants serve a search whose tiles go first (``knng.engine.search``): the tile
minima (:func:`launch_tile_minima`: each row's smallest key in every 128-column tile, 200k ×
200k at K = 128 in ~22 ms on an H200) and the screen of gathered rows
(:func:`launch_gathered_screen`: only the (row, tile) pairs whose minimum is within the row's
threshold, ~123 of 1,563 tiles a row at k = 100 in ~4.8 ms).

The kernel is compiled once per device and variant (tile configuration, which terms are
present, symmetric or not: each a ``-D`` define, so the common path has no run-time tests),
by NVRTC through CuPy (``knng._cuda.source_kernel``; CuPy caches the binaries on disk).
``fused.screen_block`` launches it inside its list sizing and relaunch wherever CuPy is
installed; elsewhere the Triton kernel runs the same rows. Nothing here synchronises.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from knng._options import get_options
from knng import _cuda as cuda

__all__ = ["launch_screen", "launch_strip_minima", "launch_tile_minima", "launch_gathered_screen",
           "STRIP", "TILE", "Config", "CONFIGS", "choose_config", "shared_bytes", "BLOCK_K", "WGMMA_MAX_K",
           "wgmma_compiles"]

_SOURCE = str(Path(__file__).parent / "cuda" / "screen.cu")
_SOURCE_WG = str(Path(__file__).parent / "cuda" / "screen_wg.cu")

#: Columns of one pipeline chunk (the kernel's ``BK``: 128 bytes of a float16 row), fixed in
#: the kernel.
BLOCK_K = 64


class Config(NamedTuple):
    """A tile configuration of ``cuda/screen.cu`` (its ``SCREEN_*`` defines).

    ``bm`` × ``bn`` is a block's tile, ``wm`` × ``wn`` its warps (each a ``bm/wm`` × ``bn/wn``
    part), ``stages`` the depth of the copy ring, ``resident`` whether A's block stays in shared
    memory for the whole sweep (else its chunks stream with B's), ``min_blocks`` the blocks per
    multiprocessor the register allocation must allow (``__launch_bounds__``), ``pretest``
    whether a non-symmetric block tests a one-rounding bound first (``SCREEN_PRE``: two float
    operations an entry instead of three or four, exact keys only for its candidates),
    ``wgmma`` whether it is ``cuda/screen_wg.cu``'s Hopper kernel (two warpgroups of 64 rows,
    ``stages`` tiles of column vectors in its ring and ``b_stages`` B tiles, ``stages`` if 0;
    compute capability 9.0 only, K ≤ 256), ``sets`` its accumulator sets (1: a tile multiplied
    then screened, two blocks a multiprocessor; 2: one tile screened while the next is
    multiplied, one block).
    """

    bm: int
    bn: int
    wm: int
    wn: int
    stages: int
    resident: bool
    min_blocks: int
    pretest: bool = True
    wgmma: bool = False
    b_stages: int = 0
    sets: int = 2

    @property
    def threads(self) -> int:
        return 32 * self.wm * self.wn

    @property
    def warp_buffer(self) -> int:
        """Survivors a warp buffers per side (``screen_common``'s ``WBUF``): 32 where two blocks
        must share a multiprocessor's shared memory, else 64."""
        return 32 if self.wgmma and self.sets == 1 else 64


#: Configurations the benchmark compares (``bench/cuda_screen_kernel.py``); "r": A resident,
#: "s": A streamed; warps of 64 × 64 unless named otherwise; "np": without the pre-test. H100,
#: 10,000 × 2^20, ~0 / ~15 / ~200 kept per row (2026-11-24): K = 128 r128x128 7.64 / 8.29 /
#: 10.10 ms, r128x128np 8.52 / 9.06 / 10.75, r128x128w32 8.09 / 8.52 / 9.66, r256x128 8.19 /
#: 8.84 / 11.08, s128x128 8.34 / 8.89 / 10.73; K = 256 r256x128 14.47 / 14.84 / 16.72, s128x128
#: 15.71 / 15.66 / 16.76, r128x128 (one block per SM) 18.55 / 18.96 / 22.73; K = 960 s128x128
#: 54.3 / 56.7 / 57.6, s128x256 53.4 / 55.9 / 56.7. Symmetric 16,384² (K = 128): r256x128 0.42 /
#: 0.65 / 0.90, r128x128 0.40 / 0.78 / 0.93. Also measured and dropped: 128 × 256 tiles with A
#: resident (8 warps, one block per SM) 5–12 % slower than 128 × 128, 256 × 128 streamed 2–9 %.
CONFIGS: dict[str, Config] = {
    "r128x128": Config(128, 128, 2, 2, 4, True, 2),
    "r128x128np": Config(128, 128, 2, 2, 4, True, 2, pretest=False),
    "r256x128": Config(256, 128, 4, 2, 4, True, 1),
    "r128x128w32": Config(128, 128, 2, 4, 4, True, 2),  # 8 warps of 64 × 32
    "s128x128": Config(128, 128, 2, 2, 3, False, 2),
    "s128x256": Config(128, 256, 2, 4, 3, False, 1),
    "wg128x128": Config(128, 128, 8, 1, 4, True, 1, wgmma=True),
    "wg128x128np": Config(128, 128, 8, 1, 4, True, 1, pretest=False, wgmma=True),
    # K ≤ 256: A's 64 KB and two B tiles of 64 KB, one tile loading while one is multiplied.
    # H100, 28,672² at K = 256, ~0 / ~4 / ~52 kept per row (2026-11-26): 0.96 / 1.14 / 1.47 ms
    # (mma.sync r128x128 1.65 / 1.84 / 2.56), symmetric 1.11 / 1.46 / 1.88 (r256x128 1.40 /
    # 1.72 / 2.23); at K = 128 level with wg128x128 (0.59 / 0.73 / 1.11 against 0.60 / 0.73 / 1.23).
    "wg128x128b2": Config(128, 128, 8, 1, 3, True, 1, wgmma=True, b_stages=2),
    # K ≤ 128: one accumulator set, rings of two tiles, two blocks a multiprocessor (≤ 128
    # registers a thread, 104–108 KB of shared memory a block). H200, 28,672² at K = 128, ~0 /
    # ~2 / ~36 kept per row (2026-11-27, against wg128x128 in the same process): non-symmetric
    # 0.569 / 0.632 / 0.919 ms (0.663 / 0.798 / 1.217), symmetric 0.745 / 0.886 / 1.348 (0.888 /
    # 1.257 / 1.887), triangle 0.484 / 0.547 / 0.833 (0.498 / 0.707 / 1.057).
    "wg128x128s1": Config(128, 128, 8, 1, 2, True, 2, wgmma=True, b_stages=2, sets=1),
}
#: Largest K of the wgmma kernel (A's block and two B tiles of K = 256 in shared memory).
WGMMA_MAX_K = 256
#: Largest K of the wgmma configuration with four B tiles in its ring (two loading).
_WGMMA_FOUR_TILES_K = 128
#: Largest K of the one-set configuration (A's block and two B tiles in half a multiprocessor's
#: shared memory).
_WGMMA_ONE_SET_K = 128
# Options (``knng.options``) that benchmarks turn off to compare: ``wgmma`` (the wgmma kernel
# where it runs), ``wgmma_one_set`` (its one-set configuration for K ≤ 128, two blocks a
# multiprocessor), ``mark_candidates`` (its pre-test marks its candidates, ``SCREEN_MARK``,
# instead of testing a half-tile's entries again where one passed), ``wgmma_minima`` (strip
# minima on it too) and ``triangle`` (a part's own block screened as its upper triangle).

#: Shared memory a multiprocessor has for two blocks of ~113 KB each (H100: 228 KB, of which
#: 1 KB per block is reserved): a resident A block is used while two blocks still fit.
_TWO_BLOCKS = 113 * 1024


#: Shared memory one block may have (H100: 227 KB).
_ONE_BLOCK = 227 * 1024


def choose_config(k_dims: int, symmetric: bool = False, device_index: int | None = None) -> str:
    """The configuration for K = ``k_dims`` (measurements at :data:`CONFIGS`): on a Hopper GPU
    (``device_index`` of compute capability 9.0) the wgmma kernel up to K = 256; else 128-row
    blocks with A resident while two blocks fit in a multiprocessor (K <= 128) for a
    non-symmetric block, 256-row blocks with A resident while one fits (K <= 256: half the reads
    of B per product; in a symmetric block, whose two tests have no pre-test, 8 warps a block
    also hide the survivors' path better), else A streamed with B."""
    if get_options().wgmma and device_index is not None and k_dims <= WGMMA_MAX_K and wgmma_compiles(device_index):
        return _wgmma_config(k_dims)
    if not symmetric and shared_bytes(k_dims, CONFIGS["r128x128"], True, True, True) <= _TWO_BLOCKS:
        return "r128x128"
    if shared_bytes(k_dims, CONFIGS["r256x128"], True, True, True) <= _ONE_BLOCK:
        return "r256x128"
    return "s128x128"


def _wgmma_config(k_dims: int) -> str:
    """The wgmma configuration for K = ``k_dims`` (≤ :data:`WGMMA_MAX_K`): one accumulator set and
    two blocks a multiprocessor where they fit (K ≤ 128), else two sets and B tiles in a ring of
    two."""
    if get_options().wgmma_one_set and k_dims <= _WGMMA_ONE_SET_K:
        return "wg128x128s1"
    return "wg128x128" if k_dims <= _WGMMA_FOUR_TILES_K else "wg128x128b2"


@functools.cache
def wgmma_compiles(device_index: int) -> bool:
    """Whether the wgmma kernel runs on this device: compute capability 9.0 (its sm_90a code runs
    on no other) and an NVRTC that compiles it (checked once, on the variant a search of K = 128
    runs)."""
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return False
    try:
        kernel(device_index, CONFIGS[_wgmma_config(128)], False, True, False)
    except Exception as exc:  # noqa: BLE001 - an NVRTC too old for sm_90a: the mma.sync kernel runs
        warnings.warn(f"knng: the wgmma screen does not compile here ({str(exc)[:200]}); using mma.sync")
        return False
    return True




def shared_bytes(k_dims: int, config: Config, row_terms: bool, col_terms: bool, symmetric: bool,
                 gather: bool = False) -> int:
    """Dynamic shared memory of one block (mirrors ``screen::smem_bytes`` of ``cuda/screen.cu``, or
    ``screen_wg::smem_bytes`` of ``cuda/screen_wg.cu``, which check it): A's panels, B's ring, the
    ring's column vectors, the row vectors (``gather``: and the gathered rows' numbers), and the
    warps' survivor buffers (the wgmma kernel's ring holds whole tiles, and 1 KB more lets it
    align its panels to 1,024 bytes)."""
    chunks = -(-k_dims // BLOCK_K)
    panels = chunks if config.resident else config.stages
    ncolv = 1 + int(col_terms) + int(symmetric)
    nrowv = 5 if gather else 4
    sides = 2 if symmetric else 1
    warps = config.wm * config.wn
    ring = config.bn * 128 * ((config.b_stages or config.stages) * chunks if config.wgmma else config.stages)
    return (panels * config.bm * 128 + ring + config.stages * ncolv * config.bn * 4
            + nrowv * config.bm * 4 + sides * warps * config.warp_buffer * 12 + (1024 if config.wgmma else 0))




def _defines(config: Config, row_terms: bool, col_terms: bool, symmetric: bool, bf16: bool,
             minima: bool = False, k_dims: int = 128, triangle: bool = False, tiles: bool = False,
             gather: bool = False) -> tuple[str, ...]:
    if config.wgmma:
        if tiles:  # tile minima: keys only (screen_wg.cu's TILEMIN)
            plain = _defines(config, row_terms, col_terms, symmetric, bf16, False, k_dims)
            return tuple(d for d in plain if not d.startswith(("SCREEN_PRE=", "SCREEN_MARK="))) + (
                "SCREEN_PRE=0", "SCREEN_MARK=0", "SCREEN_MIN=2")
        if gather:
            return _defines(config, row_terms, col_terms, symmetric, bf16, False, k_dims) + ("SCREEN_GATHER=1",)
        return (f"SCREEN_SETS={config.sets}", f"SCREEN_WBUF={config.warp_buffer}",
                f"SCREEN_STAGES={config.stages}", f"SCREEN_BSTAGES={config.b_stages or config.stages}",
                f"SCREEN_KC={-(-k_dims // BLOCK_K)}", f"SCREEN_RT={int(row_terms)}",
                f"SCREEN_CT={int(col_terms)}", f"SCREEN_SYM={int(symmetric)}",
                f"SCREEN_PRE={int(config.pretest and not minima)}", f"SCREEN_WITH_BF16={int(bf16)}",
                f"SCREEN_MARK={int(get_options().mark_candidates)}"
                ) + (("SCREEN_MIN=1",) if minima else ()) + (("SCREEN_TRI=1",) if triangle else ())
    return (f"SCREEN_BM={config.bm}", f"SCREEN_BN={config.bn}", f"SCREEN_WM={config.wm}", f"SCREEN_WN={config.wn}",
            f"SCREEN_STAGES={config.stages}", f"SCREEN_ARES={int(config.resident)}",
            f"SCREEN_MINB={config.min_blocks}", f"SCREEN_RT={int(row_terms)}", f"SCREEN_CT={int(col_terms)}",
            f"SCREEN_SYM={int(symmetric)}", f"SCREEN_PRE={int(config.pretest and not minima)}",
            f"SCREEN_WITH_BF16={int(bf16)}", f"SCREEN_MIN={int(minima)}")


def kernel(device_index: int, config: Config, row_terms: bool, col_terms: bool, symmetric: bool,
           bf16: bool = False, minima: bool = False, k_dims: int = 128, triangle: bool = False,
           tiles: bool = False, gather: bool = False) -> Any:
    """The compiled kernel of one variant (``screen_f16``, or ``screen_bf16`` with ``bf16``; with
    ``minima`` the strip minima of :func:`launch_strip_minima`; ``screen_wg_f16`` /
    ``screen_wg_bf16`` for a wgmma configuration, whose variants also differ by K's 64-column
    chunks and, symmetric, may screen a square block's upper ``triangle``), compiled on first
    use for this device and cached (in memory here, on disk by CuPy or
    :func:`knng._cuda.source_kernel`). ``tiles``: the wgmma kernel's tile minima
    (:func:`launch_tile_minima`); ``gather``: its screen of gathered rows
    (``screen_wg_gather_f16``, :func:`launch_gathered_screen`)."""
    if triangle and not (config.wgmma and symmetric):
        raise ValueError("only the wgmma kernel's symmetric screen takes a triangle")
    if (tiles or gather) and not (config.wgmma and not symmetric and not bf16 and config.pretest):
        raise ValueError("tile minima and gathered rows are the wgmma kernel's, float16, non-symmetric")
    if tiles or gather:
        defines = _defines(config, row_terms, col_terms, False, False, k_dims=k_dims, tiles=tiles, gather=gather)
        name = "screen_wg_gather_f16" if gather else "screen_wg_f16"
        return cuda.source_kernel(_SOURCE_WG, name, device_index, defines, arch="sm_90a")
    if config.wgmma:
        if k_dims > WGMMA_MAX_K or (minima and symmetric):
            raise ValueError(f"the wgmma screen takes K <= {WGMMA_MAX_K}, and strip minima of non-symmetric blocks")
        defines = _defines(config, row_terms, col_terms, symmetric, bf16, minima, k_dims=k_dims, triangle=triangle)
        return cuda.source_kernel(_SOURCE_WG, "screen_wg_bf16" if bf16 else "screen_wg_f16", device_index, defines,
                                  arch="sm_90a")
    defines = _defines(config, row_terms, col_terms, symmetric, bf16, minima)
    return cuda.source_kernel(_SOURCE, "screen_bf16" if bf16 else "screen_f16", device_index, defines)


@functools.cache
def _device_limits(device_index: int) -> tuple[int, int]:
    """Multiprocessors and shared memory per multiprocessor of a device."""
    import cupy

    attrs = cupy.cuda.Device(device_index).attributes
    return attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024)


def _blocks_per_sm(fn: Any, config: Config, smem: int, device_index: int) -> int:
    """Blocks of this kernel a multiprocessor holds at once (registers, shared memory, threads)."""
    _, smem_sm = _device_limits(device_index)
    regs = -(-max(int(fn.num_regs), 1) // 8) * 8  # allocated per warp in units of 256 registers
    by_regs = 65536 // (regs * config.threads)
    by_smem = smem_sm // (smem + 1024)  # 1 KB of each block's shared memory is the system's
    by_threads = 2048 // config.threads
    return max(1, min(by_regs, by_smem, by_threads))


@functools.lru_cache(maxsize=4096)
def _splits(row_blocks: int, col_tiles: int, resident: int) -> int:
    """Column ranges per row block: the grid's row_blocks × splits blocks run in waves of
    ``resident``, each block sweeping col_tiles / splits tiles (plus ~2 tiles' worth of start:
    A's block and the ring's first chunks); the fewest splits of the least estimated time."""
    best, best_cost = 1, float("inf")
    for s in range(1, min(col_tiles, max(1, 8 * resident // max(row_blocks, 1)) + 1, 65535) + 1):
        waves = -(-row_blocks * s // resident)
        cost = waves * (-(-col_tiles // s) + 2)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


@functools.lru_cache(maxsize=4096)
def _triangle_splits(row_blocks: int, resident: int) -> int:
    """Chunks a row's tiles go in for a triangle (:func:`launch_screen`'s ``triangle``): row block
    x sweeps its row_blocks − x tiles ⌈row_blocks / splits⌉ at a time, one block a chunk. Blocks
    start in order of x (the largest first), so a multiprocessor that finishes early takes the
    next, and the time is about the larger of the work per multiprocessor (tiles plus ~2 tiles'
    worth of start a block) and one block's; the fewest splits of the least estimate."""
    tiles = row_blocks * (row_blocks + 1) // 2
    best, best_cost = 1, float("inf")
    for s in range(1, min(row_blocks, max(1, 16 * resident // max(row_blocks, 1))) + 1):
        chunk = -(-row_blocks // s)
        blocks = sum(-(-(row_blocks - x) // chunk) for x in range(row_blocks))
        cost = max((tiles + 2 * blocks) / resident, chunk + 2)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def _check_rows(a: torch.Tensor, b: torch.Tensor, k_dims: int, want: torch.dtype) -> None:
    """The rows' layout the kernel reads: ``want`` values, 16-byte aligned rows, K a multiple of 16."""
    if k_dims % 16 or k_dims <= 0 or a.stride(1) != 1 or b.stride(1) != 1 or a.stride(0) % 8 or b.stride(0) % 8:
        raise ValueError("the CUDA screen needs rows of 16-byte multiples and K a positive multiple of 16")
    if a.shape[1] < k_dims or b.shape[1] < k_dims:
        raise ValueError(f"rows of {a.shape[1]} and {b.shape[1]} columns, K = {k_dims}")
    if a.dtype != want or b.dtype != want:
        raise TypeError(f"the CUDA screen takes {want} rows, got {a.dtype} and {b.dtype}")
    if a.data_ptr() % 16 or b.data_ptr() % 16:
        raise ValueError("the CUDA screen needs 16-byte aligned rows")


def launch_screen(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_factor: torch.Tensor, col_scale: torch.Tensor,
                  row_terms: torch.Tensor | None, col_terms: torch.Tensor | None, row_thr: torch.Tensor,
                  col_thr: torch.Tensor | None, exclude_diagonal: int | None,
                  lists: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], counters: torch.Tensor,
                  capacity: int, *, config: str | Config | None = None, bf16: bool = False,
                  triangle: bool = False) -> None:
    """Launch the screen of the block ``a · bᵀ`` on the current stream.

    Parameters
    ----------
    a, b : torch.Tensor
        (m, ≥k_dims) and (n, ≥k_dims) float16 CUDA tensors, rows contiguous and 16-byte
        aligned (row strides multiples of 8). Columns from ``k_dims`` on are never read.
    k_dims : int
        Columns of the product, a multiple of 16 (the scaled rows' zero-padded value block).
    row_factor, col_scale : torch.Tensor
        float32 α·s per row of ``a`` and s per row of ``b`` (contiguous).
    row_terms, col_terms : torch.Tensor or None
        float32 terms added after the scaling (columns' first).
    row_thr, col_thr : torch.Tensor or None
        float32 thresholds per row of ``a`` and, for a symmetric block, per row of ``b``.
    exclude_diagonal : int or None
        Drop entries with ``row == col + exclude_diagonal``.
    lists : list of (owner, other, keys)
        One list per side (int32, int32, float32, each of ``capacity`` entries at least).
    counters : torch.Tensor
        int32 (2,) zeros: the entries each side found (also those past the capacity).
    capacity : int
        Entries a list holds; a slot past it writes nothing.
    config : str or Config, optional
        A key of :data:`CONFIGS` or a configuration (default: :func:`choose_config`); for
        benchmarks and tests.
    bf16 : bool
        Take ``a`` and ``b`` as bfloat16 (the comparison variant ``screen_bf16``).
    triangle : bool
        A symmetric square block whose rows and columns are the same points in the same order
        (``exclude_diagonal`` None or 0): screen only its upper triangle, each pair i ≤ j once
        as entry (i, j) against both thresholds (the wgmma kernel; see ``cuda/screen_wg.cu``).
    """
    m, n = a.shape[0], b.shape[0]
    _check_rows(a, b, k_dims, torch.bfloat16 if bf16 else torch.float16)
    vectors = (row_factor, col_scale, row_terms, col_terms, row_thr, col_thr)
    if any(v is not None and v.dtype != torch.float32 for v in vectors):
        raise TypeError("the CUDA screen's factors, terms and thresholds are float32")
    if m == 0 or n == 0:
        return
    if m >= 2**31 - 256 or n >= 2**31 - 256:
        raise ValueError("int32 positions: blocks of fewer than 2³¹ rows")
    device = a.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    symmetric = col_thr is not None
    cfg = config if isinstance(config, Config) else CONFIGS[config or choose_config(k_dims, symmetric, index)]
    if triangle and (m != n or not symmetric or exclude_diagonal not in (None, 0)):
        raise ValueError("a triangle is a symmetric square block, its diagonal excluded or not")
    has_rt, has_ct = row_terms is not None, col_terms is not None
    fn = kernel(index, cfg, has_rt, has_ct, symmetric, bf16, k_dims=k_dims, triangle=triangle)
    smem = shared_bytes(k_dims, cfg, has_rt, has_ct, symmetric)
    row_blocks, col_tiles = -(-m // cfg.bm), -(-n // cfg.bn)
    resident = _blocks_per_sm(fn, cfg, smem, index) * _device_limits(index)[0]
    splits = _triangle_splits(row_blocks, resident) if triangle else _splits(row_blocks, col_tiles, resident)
    # Contiguous float32 vectors (no-ops for the engine's own): the kernel indexes them by row.
    row_factor, col_scale, row_thr = (v.contiguous() for v in (row_factor, col_scale, row_thr))
    row_terms, col_terms, col_thr = (None if v is None else v.contiguous() for v in (row_terms, col_terms, col_thr))
    # The pre-test's bound on the column terms, max |col_terms| (NaN and inf included: the
    # kernel then tests every entry exactly); read on the device, so no synchronisation.
    bound = (torch.linalg.vector_norm(col_terms, ord=float("inf")).reshape(1)
             if has_ct and cfg.pretest and not symmetric else None)
    row_list, col_list = lists[0], lists[-1]
    i32 = np.int32
    args = (cuda.ptr(a), cuda.ptr(b), i32(m), i32(n), i32(k_dims), i32(a.stride(0)), i32(b.stride(0)),
            cuda.ptr(row_factor), cuda.ptr(col_scale), cuda.ptr(row_terms), cuda.ptr(col_terms),
            cuda.ptr(row_thr), cuda.ptr(col_thr), cuda.ptr(bound), cuda.ptr(row_list[0]), cuda.ptr(row_list[1]),
            cuda.ptr(row_list[2]), cuda.ptr(col_list[0]), cuda.ptr(col_list[1]), cuda.ptr(col_list[2]),
            cuda.ptr(counters), i32(capacity), i32(exclude_diagonal or 0), i32(exclude_diagonal is not None),
            cuda.ptr(None), cuda.ptr(None), i32(0))
    cuda.launch_kernel(fn, device, (row_blocks, splits), cfg.threads, args, smem)


#: Configurations of the strip minima (:func:`launch_strip_minima`) where the wgmma kernel does
#: not run them (on a Hopper GPU it does up to K = 256: its warps' 64-column halves are the
#: strips), the first whose shared memory fits one block: 128 × 128 tiles with A resident, else
#: streamed (K = 960); warps of 64 × 64 in both, so strips of :data:`STRIP` columns.
MINIMA_CONFIGS = ("r128x128", "s128x128")
#: Columns of one strip of :func:`launch_strip_minima` (a warp's columns).
STRIP = 64
assert all(CONFIGS[name].bn // CONFIGS[name].wn == STRIP for name in MINIMA_CONFIGS)


def launch_strip_minima(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_factor: torch.Tensor,
                        col_scale: torch.Tensor, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's smallest key in every strip of :data:`STRIP` consecutive columns of the block.

    The keys are the screen's (:func:`launch_screen`'s arguments, without thresholds): float16
    products on the tensor cores, float32 accumulation, each step rounded as the reference
    rounds it. Ties go to the smaller column; a NaN key is never the smallest (a strip of NaN
    and +inf keys reports +inf and its first column). No block of keys is materialised.

    Returns
    -------
    keys : torch.Tensor
        float32 (m, ⌈n / STRIP⌉): the minima.
    cols : torch.Tensor
        int32 (m, ⌈n / STRIP⌉): their columns (rows of ``b``).
    """
    m, n = a.shape[0], b.shape[0]
    strips = -(-n // STRIP)
    keys = torch.empty((m, strips), dtype=torch.float32, device=a.device)
    cols = torch.empty((m, strips), dtype=torch.int32, device=a.device)
    if m == 0 or n == 0:
        return keys, cols
    _check_rows(a, b, k_dims, torch.float16)
    if m >= 2**31 - 256 or n >= 2**31 - 256:
        raise ValueError("int32 positions: blocks of fewer than 2³¹ rows")
    device = a.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    has_rt, has_ct = row_terms is not None, col_terms is not None
    if get_options().wgmma and get_options().wgmma_minima and k_dims <= WGMMA_MAX_K and wgmma_compiles(index):
        cfg = CONFIGS[_wgmma_config(k_dims)]  # its halves of 64 columns are the strips
    else:
        fits = [CONFIGS[name] for name in MINIMA_CONFIGS
                if shared_bytes(k_dims, CONFIGS[name], has_rt, has_ct, False) <= _ONE_BLOCK]
        cfg = fits[0] if fits else CONFIGS[MINIMA_CONFIGS[-1]]
    fn = kernel(index, cfg, has_rt, has_ct, False, minima=True, k_dims=k_dims)
    _launch_minima(fn, cfg, index, a, b, k_dims, row_factor, col_scale, row_terms, col_terms, keys, cols, strips)
    return keys, cols


def _launch_minima(fn: Any, cfg: Config, index: int, a: torch.Tensor, b: torch.Tensor, k_dims: int,
                   row_factor: torch.Tensor, col_scale: torch.Tensor, row_terms: torch.Tensor | None,
                   col_terms: torch.Tensor | None, keys: torch.Tensor, cols: torch.Tensor | None, strips: int) -> None:
    """Launch a minima variant ``fn`` of configuration ``cfg`` over the block (strip or tile
    minima into ``keys`` and, where given, ``cols``, ``strips`` of them a row)."""
    m, n = a.shape[0], b.shape[0]
    has_rt, has_ct = row_terms is not None, col_terms is not None
    smem = shared_bytes(k_dims, cfg, has_rt, has_ct, False)
    row_blocks, col_tiles = -(-m // cfg.bm), -(-n // cfg.bn)
    splits = _splits(row_blocks, col_tiles, _blocks_per_sm(fn, cfg, smem, index) * _device_limits(index)[0])
    row_factor, col_scale = row_factor.contiguous(), col_scale.contiguous()
    row_terms, col_terms = (None if v is None else v.contiguous() for v in (row_terms, col_terms))
    i32 = np.int32
    # No survivors: the lists and thresholds are never written (the thresholds' pointer must
    # still be readable: the kernel loads its rows' entries with the other row vectors).
    args = (cuda.ptr(a), cuda.ptr(b), i32(m), i32(n), i32(k_dims), i32(a.stride(0)), i32(b.stride(0)),
            cuda.ptr(row_factor), cuda.ptr(col_scale), cuda.ptr(row_terms), cuda.ptr(col_terms),
            cuda.ptr(row_factor), cuda.ptr(None), cuda.ptr(None), cuda.ptr(None), cuda.ptr(None), cuda.ptr(None),
            cuda.ptr(None), cuda.ptr(None), cuda.ptr(None), cuda.ptr(None), i32(0), i32(0), i32(0),
            cuda.ptr(keys), cuda.ptr(cols), i32(strips))
    cuda.launch_kernel(fn, a.device, (row_blocks, splits), cfg.threads, args, smem)


#: Columns of one tile of :func:`launch_tile_minima` and of a work item of
#: :func:`launch_gathered_screen` (the wgmma kernel's column tile).
TILE = 128




def launch_tile_minima(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_factor: torch.Tensor,
                       col_scale: torch.Tensor, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None
                       ) -> torch.Tensor:
    """Each row's smallest key in every tile of :data:`TILE` consecutive columns of the block:
    :func:`launch_strip_minima` without the columns, over tiles twice as wide (the wgmma
    kernel's ``SCREEN_MIN=2``; :func:`gathered_runs` says where it runs). NaN keys are never
    the smallest; a tile of NaN and +inf keys reports +inf. Returns float32 (m, ⌈n / TILE⌉)."""
    m, n = a.shape[0], b.shape[0]
    tiles = -(-n // TILE)
    keys = torch.empty((m, tiles), dtype=torch.float32, device=a.device)
    if m == 0 or n == 0:
        return keys
    _check_rows(a, b, k_dims, torch.float16)
    if m >= 2**31 - 256 or n >= 2**31 - 256 or m * tiles >= 2**62:
        raise ValueError("int32 positions: blocks of fewer than 2³¹ rows")
    index, cfg, fn = _wgmma_variant(a.device, k_dims, row_terms, col_terms, "tile minima", tiles=True)
    _launch_minima(fn, cfg, index, a, b, k_dims, row_factor, col_scale, row_terms, col_terms, keys, None, tiles)
    return keys


def _wgmma_variant(device: torch.device, k_dims: int, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None,
                   what: str, **variant: bool) -> tuple[int, Config, Any]:
    """The device's index, the wgmma configuration for K = ``k_dims`` and its compiled kernel of
    ``variant`` (``tiles`` or ``gather``), or an error naming ``what`` where it cannot run."""
    if not (get_options().wgmma and k_dims <= WGMMA_MAX_K and device.type == "cuda"
            and wgmma_compiles(device.index if device.index is not None else torch.cuda.current_device())):
        raise RuntimeError(f"{what}: needs the wgmma kernel (a Hopper GPU, K <= {WGMMA_MAX_K})")
    index = device.index if device.index is not None else torch.cuda.current_device()
    cfg = CONFIGS[_wgmma_config(k_dims)]
    return index, cfg, kernel(index, cfg, row_terms is not None, col_terms is not None, False, k_dims=k_dims,
                              **variant)


def launch_gathered_screen(a: torch.Tensor, b: torch.Tensor, k_dims: int, row_factor: torch.Tensor,
                           col_scale: torch.Tensor, row_terms: torch.Tensor | None, col_terms: torch.Tensor | None,
                           row_thr: torch.Tensor, rows: torch.Tensor, item_tile: torch.Tensor,
                           tile_index: torch.Tensor, lists: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                           counters: torch.Tensor, capacity: int) -> None:
    """:func:`launch_screen` (non-symmetric, no excluded diagonal) of chosen (row, tile) pairs,
    grouped by tile: for the T tiles of :data:`TILE` columns of ``b``, ``tile_index`` (int32,
    3T) holds each tile's pairs, the first of them in ``rows`` (int32 rows of ``a``) and the
    running sum of its work items of up to 128 rows (inclusive); ``item_tile`` (int32) names each
    work item's tile, for at least the items there are (more are ignored). Survivors are listed
    under their rows' numbers. Persistent blocks of the wgmma kernel's ``SCREEN_GATHER`` take
    the items in turn, so nothing is read back here (:func:`gathered_runs` says where it runs)."""
    m, n = a.shape[0], b.shape[0]
    _check_rows(a, b, k_dims, torch.float16)
    vectors = (row_factor, col_scale, row_terms, col_terms, row_thr)
    if any(v is not None and v.dtype != torch.float32 for v in vectors):
        raise TypeError("the CUDA screen's factors, terms and thresholds are float32")
    tiles = -(-n // TILE)
    if any(v.dtype != torch.int32 for v in (rows, item_tile, tile_index)) or tile_index.numel() != 3 * tiles:
        raise TypeError(f"gathered rows, item tiles and the tiles' index are int32, the index of 3 × {tiles}")
    if m == 0 or n == 0 or item_tile.numel() == 0:
        return
    if m >= 2**31 - 256 or n >= 2**31 - 256:
        raise ValueError("int32 positions: blocks of fewer than 2³¹ rows")
    index, cfg, fn = _wgmma_variant(a.device, k_dims, row_terms, col_terms, "the gathered screen", gather=True)
    has_rt, has_ct = row_terms is not None, col_terms is not None
    smem = shared_bytes(k_dims, cfg, has_rt, has_ct, False, gather=True)
    resident = _blocks_per_sm(fn, cfg, smem, index) * _device_limits(index)[0]
    row_factor, col_scale, row_thr = (v.contiguous() for v in (row_factor, col_scale, row_thr))
    row_terms, col_terms = (None if v is None else v.contiguous() for v in (row_terms, col_terms))
    rows, item_tile, tile_index = rows.contiguous(), item_tile.contiguous(), tile_index.contiguous()
    bound = torch.linalg.vector_norm(col_terms, ord=float("inf")).reshape(1) if has_ct else None
    owner, other, keys = lists[0]
    i32 = np.int32
    args = (cuda.ptr(a), cuda.ptr(b), i32(m), i32(n), i32(k_dims), i32(a.stride(0)), i32(b.stride(0)),
            cuda.ptr(row_factor), cuda.ptr(col_scale), cuda.ptr(row_terms), cuda.ptr(col_terms),
            cuda.ptr(row_thr), cuda.ptr(None), cuda.ptr(bound), cuda.ptr(owner), cuda.ptr(other), cuda.ptr(keys),
            cuda.ptr(owner), cuda.ptr(other), cuda.ptr(keys), cuda.ptr(counters), i32(capacity), i32(0), i32(0),
            cuda.ptr(None), cuda.ptr(None), i32(tiles), cuda.ptr(rows), cuda.ptr(item_tile), cuda.ptr(tile_index))
    cuda.launch_kernel(fn, a.device, (min(resident, item_tile.numel()), 1), cfg.threads, args, smem)
