"""The corpus pass and the scaled float16 rows as Triton kernels on a GPU.

Their references are the torch steps they replace, which every other device runs:
:func:`knng.engine.common.corpus_stats`' float64 column sums and finite check, and
:meth:`knng.metrics.Metric.prepare` for scaled float16 rows. In torch, preparing a 1M × 128
float32 corpus went through float64 copies of the whole block about ten times (converted,
shifted, two norms, divided, rounded: 3.7 ms on an H100, and 2.5 ms more for the corpus pass);
the kernels read the input three times and write the float16 rows once, keeping the float64
values in registers.

What they compute is the reference's, value for value: the shift x − μ rounds once in float64,
the scale comes from the same rule (:func:`knng.metrics.scaled_row_scales`) applied to the same
float64 maxima, the division by a power of two is exact, and the float16 values take the same
two round-to-nearest-even conversions (float64 → float32 → float16) torch's copy makes. Only the
float64 sums (a column's total, a row's sum of squares) add in another order; the centre is
any fixed vector as far as exactness goes, and a norm's last-bit rounding is within the bound's
safety factor (``docs/EXACTNESS.md``).
"""

from __future__ import annotations

import torch

from knng._inputs import first_nonfinite_row
from knng._options import kernel_forced
from knng.engine import stages
from knng.engine.kernels.capabilities import block_width, ieee_options, interpreting, triton_runs
from knng.metrics import (
    INTEGER_RANGE_MESSAGE, INTEGER_TAIL, SCALED_TAIL, Metric, Prepared, integer_prepared, integer_width,
    scaled_alphas, scaled_row_scales, scaled_scales, scaled_width,
)

__all__ = ["preparation_runs", "column_sums", "finite_column_sums", "lattice_extent", "prepare_rows"]


def _triton():
    """This module's Triton kernels (:mod:`knng.engine.kernels.triton_preparation`), imported on first use
    (Triton must be installed)."""
    from knng.engine.kernels import triton_preparation

    return triton_preparation


#: Rows per program of the corpus pass, the tile each program walks them in, and its widest
#: column block (a power of two ≥ d where d is narrower). 1M × 960 float32 on an H200: tiles of
#: 32 × 128 read it at 1.8 TB/s (2.12 ms), tiles of 64 × 256 at 3.1 TB/s (1.25 ms); 1M × 128
#: 0.39 → 0.33 ms (``bench/preparation_blocks.py``, 2026-11-27, docs/FINDINGS.md).
SUM_ROWS, SUM_TILE_ROWS, SUM_COLUMN_BLOCK = 2048, 64, 256
#: Rows per program of the lattice pass: its float64 divisions and roundings are latency-bound,
#: so it wants many programs (a program of SUM_ROWS rows a multiprocessor, 98 of them for 200k
#: rows, took 1.0 ms of an H200 for a 200k × 128 block), and the tile each program walks.
LATTICE_ROWS, LATTICE_TILE_ROWS, LATTICE_COLUMN_BLOCK = 256, 32, 128
#: Rows per program of the row passes, and the columns each step of a program loads: steps of
#: 64 columns (was 128) prepared 1M × 960 in 2.96 ms (was 3.83) and 1M × 128 in 0.80 (0.89).
ROW_BLOCK, COLUMN_BLOCK = 32, 64
#: The same in Triton's interpreter (CPU tests), whose cost is per step, not per value.
_INTERPRETED = dict(SUM_ROWS=64, SUM_TILE_ROWS=16, SUM_COLUMN_BLOCK=16, LATTICE_ROWS=64, LATTICE_TILE_ROWS=16,
                    LATTICE_COLUMN_BLOCK=16, ROW_BLOCK=16, COLUMN_BLOCK=16)


def preparation_runs(device: torch.device) -> bool:
    """Whether the kernels run on ``device``: a GPU where the fused screen kernel can run (or,
    in the tests, any device on which that has been made to answer yes: the interpreter)."""
    forced = kernel_forced("preparation")
    return triton_runs(device) if forced is None else forced


def _sizes() -> dict[str, int]:
    if interpreting():
        return _INTERPRETED
    return dict(SUM_ROWS=SUM_ROWS, SUM_TILE_ROWS=SUM_TILE_ROWS, SUM_COLUMN_BLOCK=SUM_COLUMN_BLOCK,
                LATTICE_ROWS=LATTICE_ROWS, LATTICE_TILE_ROWS=LATTICE_TILE_ROWS,
                LATTICE_COLUMN_BLOCK=LATTICE_COLUMN_BLOCK, ROW_BLOCK=ROW_BLOCK, COLUMN_BLOCK=COLUMN_BLOCK)


def column_sums(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 column sums of the finite values of a 2-D ``block`` and the number of non-finite
    values (an int32 tensor on the device: reading it is the caller's one synchronisation)."""
    kernels = _triton()
    sizes = _sizes()
    m, d = block.shape
    block = block if block.stride(1) == 1 else block.contiguous()
    programs = max(1, -(-m // sizes["SUM_ROWS"]))
    partial = torch.empty((programs, d), dtype=torch.float64, device=block.device)
    nonfinite = torch.zeros(1, dtype=torch.int32, device=block.device)
    if m and d:
        block_d = min(sizes["SUM_COLUMN_BLOCK"], block_width(d, 16))
        grid = (programs, -(-d // block_d))
        kernels.column_sums_kernel[grid](block, partial, nonfinite, m, d, block.stride(0), ROWS=sizes["SUM_ROWS"],
                                         BLOCK_R=sizes["SUM_TILE_ROWS"], BLOCK_D=block_d)
    else:
        partial.zero_()
    return partial.sum(dim=0), nonfinite[0]


def lattice_extent(block: torch.Tensor, unit: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One read of a 2-D float ``block`` for the lattice of ``unit``: each column's smallest and
    largest lattice point in units (float64, (d,)), and the largest distance of a value from its
    point in units and absolutely (float64 scalars on the device; reading them is the caller's
    synchronisation). ``common.LatticeExtent`` holds the torch reference."""
    kernels = _triton()
    sizes = _sizes()
    m, d = block.shape
    block = block if block.stride(1) == 1 else block.contiguous()
    programs, column_blocks = max(1, -(-m // sizes["LATTICE_ROWS"])), max(1, -(-d // sizes["LATTICE_COLUMN_BLOCK"]))
    low = torch.full((programs, d), torch.inf, dtype=torch.float64, device=block.device)
    high = torch.full((programs, d), -torch.inf, dtype=torch.float64, device=block.device)
    off = torch.zeros((programs, column_blocks), dtype=torch.float64, device=block.device)
    err = torch.zeros((programs, column_blocks), dtype=torch.float64, device=block.device)
    if m and d:
        kernels.lattice_extent_kernel[(programs, column_blocks)](
            block, low, high, off, err, m, d, block.stride(0), unit, ROWS=sizes["LATTICE_ROWS"],
            BLOCK_R=sizes["LATTICE_TILE_ROWS"], BLOCK_D=sizes["LATTICE_COLUMN_BLOCK"], **ieee_options())
    return low.amin(dim=0), high.amax(dim=0), off.max(), err.max()


def finite_column_sums(block: torch.Tensor, *, sums: bool) -> tuple[torch.Tensor | None, int | None]:
    """The corpus pass over one block: its float64 column sums (None unless ``sums``) and its
    first row with a NaN or Inf (None if there is none).

    Through :func:`column_sums` where :func:`preparation_runs` (one read of the block, the bad
    row looked for only when there is one), else torch's float64 sum and finite check (a
    float64 copy of the block and two reads: 2.5 ms for 1M × 128 on an H100).
    """
    if preparation_runs(block.device) and block.dim() == 2:
        totals, nonfinite = column_sums(block)
        return (totals if sums else None), (first_nonfinite_row(block) if int(nonfinite) else None)
    return (block.to(torch.float64).sum(dim=0) if sums else None), first_nonfinite_row(block)


def _scaled_kernel_applies(metric: Metric, x: torch.Tensor, dtype: torch.dtype) -> bool:
    # Normalised and row-centred metrics rescale rows before the shift, and rows on a lattice
    # store multiples of its unit: their reference only.
    return (dtype == torch.float16 and not metric.normalize and not metric.centre_rows and metric.lattice is None
            and x.dim() == 2
            and not x.is_complex() and preparation_runs(x.device))


def prepare_rows(metric: Metric, x: torch.Tensor, centre: torch.Tensor | None, *, side: str, symmetric: bool,
                 dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> Prepared:
    """:meth:`Metric.prepare`, through the kernels where they apply (scaled float16 rows of a
    metric that neither normalises nor centres rows, on a device where :func:`preparation_runs`),
    else the metric's own; the arguments are that method's. ``out``: where the prepared rows go
    ((m, ``metric.width(d, device, dtype)``) of ``dtype``, rows of unit column stride: a slice of
    a whole prepared corpus), which the kernels write directly."""
    stages.count("prepare")
    if out is not None and (out.shape != (x.shape[0], metric.width(x.shape[1], x.device, dtype))
                            or out.dtype != dtype or out.stride(1) != 1):
        raise ValueError(f"out must be ({x.shape[0]}, {metric.width(x.shape[1], x.device, dtype)}) {dtype} rows, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if dtype == torch.int8 and metric.integers and x.dim() == 2 and preparation_runs(x.device):
        return _integer_rows(metric, x, centre, side=side, symmetric=symmetric, out=out)
    if not _scaled_kernel_applies(metric, x, dtype):
        prep = metric.prepare(x, centre, side=side, symmetric=symmetric, dtype=dtype)
        if out is None:
            return prep
        out.copy_(prep.vectors)
        return Prepared(vectors=out, norms=prep.norms, terms=prep.terms, offsets=prep.offsets)
    stages.count("prepare.kernel")
    kernels = _triton()
    sizes = _sizes()
    x = x if x.stride(1) == 1 else x.contiguous()
    m, d = x.shape
    shift = metric.shifts(side, symmetric) and centre is not None
    mu = centre.to(device=x.device, dtype=torch.float64).contiguous() if shift else x.new_zeros(1, dtype=torch.float64)
    sumsq = torch.empty(m, dtype=torch.float64, device=x.device)
    top = torch.empty(m, dtype=torch.float64, device=x.device)
    width = scaled_width(d)
    if out is None:
        out = torch.empty((m, width + SCALED_TAIL), dtype=torch.float16, device=x.device)
    grid = (max(1, -(-m // sizes["ROW_BLOCK"])),)
    if m:
        kernels.row_extent_kernel[grid](x, mu, sumsq, top, m, d, x.stride(0), HAS_CENTRE=shift,
                                        BLOCK_R=sizes["ROW_BLOCK"], BLOCK_D=sizes["COLUMN_BLOCK"])
    scale = scaled_row_scales(top)
    if m:
        kernels.scaled_rows_kernel[grid](x, mu, scale, out, m, d, width, x.stride(0), out.stride(0),
                                         HAS_CENTRE=shift, BLOCK_R=sizes["ROW_BLOCK"], BLOCK_D=sizes["COLUMN_BLOCK"])
    out[:, width:].zero_()
    scaled_scales(out).copy_(scale)
    scaled_alphas(out).fill_(metric.alpha)
    norms = torch.sqrt(sumsq)
    terms, offsets = metric.terms_and_offsets(x, norms, centre, side=side, symmetric=symmetric)
    return Prepared(vectors=out, norms=norms, terms=terms, offsets=offsets)


def _integer_rows(metric: Metric, x: torch.Tensor, centre: torch.Tensor | None, *, side: str, symmetric: bool,
                  out: torch.Tensor | None) -> Prepared:
    """Integer rows (``Metric.prepare`` of a metric with ``integers``, its reference) in one
    read of the input and one write of the rows: int32 arithmetic throughout, the values' range
    checked on the device (one synchronisation reads the count). The torch reference converts
    to int32, shifts, checks and squares in int64 in half a dozen passes (300k × 15,876 photon
    images: about 150 ms of an H200's time)."""
    stages.count("prepare.integer_kernel")
    metric.check_integer_rows(side, symmetric, centre)
    assert centre is not None
    sizes = _sizes()
    x = x if x.stride(1) == 1 else x.contiguous()
    m, d = x.shape
    width = integer_width(d)
    if out is None:
        out = torch.empty((m, width + INTEGER_TAIL), dtype=torch.int8, device=x.device)
    squares = torch.empty(m, dtype=torch.int32, device=x.device)
    bad = torch.zeros(1, dtype=torch.int32, device=x.device)
    if m:
        c = centre.to(device=x.device, dtype=torch.int32).contiguous()
        _triton().integer_rows_kernel[(-(-m // sizes["ROW_BLOCK"]),)](
            x, c, out, squares, bad, m, d, width, x.stride(0), out.stride(0), BLOCK_R=sizes["ROW_BLOCK"],
            BLOCK_D=sizes["COLUMN_BLOCK"])
        if int(bad):
            raise ValueError(INTEGER_RANGE_MESSAGE)
    return integer_prepared(out, squares, side)
