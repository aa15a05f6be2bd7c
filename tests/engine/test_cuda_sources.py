"""The CUDA C sources as NVRTC sees them, checked on a CPU (no CuPy, no GPU needed).

``knng._cuda.source_kernel`` pastes the headers a kernel includes into its text, so that
NVRTC needs no include path and CuPy's cache key (the source text) changes when a header does;
the float16 screen's two kernels share ``screen_common.cuh`` that way. The launcher's shared
memory sizes must cover what the kernels lay out.
"""

from pathlib import Path

import pytest

from knng.engine.kernels import cuda_screen
from knng import _cuda as cuda

CUDA_DIR = Path(cuda_screen.__file__).parent / "cuda"


@pytest.mark.parametrize("name", ["screen.cu", "screen_wg.cu"])
def test_headers_are_pasted_into_the_source(name):
    text = cuda.with_includes(CUDA_DIR / name)
    assert not any(line.startswith("#include") for line in text.splitlines())
    assert "namespace screen_common" in text
    assert (CUDA_DIR / "screen_common.cuh").read_text() in text


def test_a_source_without_headers_is_unchanged(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('// #include "nothing.cuh" in a comment\nextern "C" __global__ void k() {}\n')
    assert cuda.with_includes(src) == src.read_text()


@pytest.mark.parametrize("k_dims", [16, 64, 80, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_wgmma_shared_memory_fits_one_block(k_dims, symmetric):
    """A's panels and four B tiles of 64-column chunks, the column and row vectors, the warps'
    buffers and 1 KB of alignment: within a Hopper block's 227 KB at every K the kernel takes."""
    cfg = cuda_screen.CONFIGS["wg128x128"]
    chunks = -(-k_dims // 64)
    size = cuda_screen.shared_bytes(k_dims, cfg, True, True, symmetric)
    assert size <= 227 * 1024
    assert size >= chunks * 128 * 128 + cfg.stages * chunks * 128 * 128 + 1024
    assert cfg.threads == 256


@pytest.mark.parametrize("k_dims", [144, 200, 256])
@pytest.mark.parametrize("symmetric", [False, True])
def test_wgmma_two_tile_ring_fits_one_block_to_k_256(k_dims, symmetric):
    """Past K = 128 four B tiles do not fit with A's panels; the two-tile ring does, and its
    column vectors keep three slots (a tile multiplied, one screened, one loading)."""
    four, two = cuda_screen.CONFIGS["wg128x128"], cuda_screen.CONFIGS["wg128x128b2"]
    chunks = -(-k_dims // 64)
    assert cuda_screen.shared_bytes(k_dims, four, True, True, symmetric) > 227 * 1024
    size = cuda_screen.shared_bytes(k_dims, two, True, True, symmetric)
    assert chunks * 128 * 128 + 2 * chunks * 128 * 128 + 1024 <= size <= 227 * 1024
    assert two.stages == 3 and two.b_stages == 2


@pytest.mark.parametrize("k_dims", [16, 64, 80, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_wgmma_one_set_fits_two_blocks_a_multiprocessor(k_dims, symmetric):
    """The one-set configuration (K ≤ 128): A's panels, two B tiles, two slots of column vectors
    and warps' buffers of 32 survivors a side, so that two blocks (each with the 1 KB the system
    keeps) share a Hopper multiprocessor's 228 KB, as its ``__launch_bounds__`` asks of the
    registers; its defines say one set and buffers of 32."""
    cfg = cuda_screen.CONFIGS["wg128x128s1"]
    chunks = -(-k_dims // 64)
    size = cuda_screen.shared_bytes(k_dims, cfg, True, True, symmetric)
    assert 2 * (size + 1024) <= 228 * 1024
    assert size >= chunks * 128 * 128 * 3 + 8 * 32 * 12 * (2 if symmetric else 1)
    assert cfg.sets == 1 and cfg.stages == cfg.b_stages == 2 and cfg.min_blocks == 2 and cfg.warp_buffer == 32
    defines = cuda_screen._defines(cfg, True, True, symmetric, False, k_dims=k_dims)
    assert "SCREEN_SETS=1" in defines and "SCREEN_WBUF=32" in defines
    assert cuda_screen.CONFIGS["wg128x128"].warp_buffer == 64


def test_without_a_device_the_mma_sync_kernel_is_chosen():
    for k_dims in (16, 128, 256, 960):
        for symmetric in (False, True):
            assert not cuda_screen.choose_config(k_dims, symmetric).startswith("wg")


@pytest.mark.parametrize("row_blocks", [1, 2, 7, 40, 245, 487, 1953])
@pytest.mark.parametrize("resident", [114, 132])
def test_triangle_blocks_cover_the_upper_tiles_once(row_blocks, resident):
    """``cuda/screen_wg.cu``'s triangle sweep, mirrored: block (x, y) takes tiles x + y·c … up to
    x + (y + 1)·c, c = ⌈tiles / splits⌉, so every row block's tiles x … tiles − 1 are swept once;
    a small triangle is split so that its blocks fill the multiprocessors, a large one less."""
    splits = cuda_screen._triangle_splits(row_blocks, resident)
    chunk = -(-row_blocks // splits)
    for x in range(row_blocks):
        swept = [t for y in range(splits) for t in range(x + y * chunk, min(x + (y + 1) * chunk, row_blocks))]
        assert swept == list(range(x, row_blocks))
    tiles = row_blocks * (row_blocks + 1) // 2
    blocks = sum(-(-(row_blocks - x) // chunk) for x in range(row_blocks))
    if tiles >= 4 * resident:
        assert blocks >= resident
    assert chunk <= tiles / resident + 2  # no block outlasts the work per multiprocessor
