"""One :class:`Metric` per name: how inputs are prepared for the fast screen, how a dot-product
block becomes screening scores, how large the screen's rounding error can be, and the exact
float64 distance.

Every metric is screened in the same form (float32 inputs, float32 accumulation)::

    s̃_ij = fl( α · a_iᵀ b_j + r_j [+ q_i] )

where ``a``/``b`` are the prepared query/corpus vectors, ``α`` is −2 (Euclidean family, cosine
and Pearson) or −1 (the inner product) and ``r``/``q`` are optional per-vector terms (‖b‖² and
‖a‖²). The row term ``q`` only shifts a row by a constant, so search omits it; the graph keeps
it so that the block is symmetric and one block serves rows and columns alike.

Why preparation matters: the float32 expansion ‖x‖² + ‖y‖² − 2xᵀy cancels catastrophically far
from the origin. Euclidean distances ignore translation, so both sides are centred on the corpus
mean (computed in float64) before rounding to float32. Cosine and Pearson distances are half the
squared Euclidean distance of the unit vectors (Pearson's centred on their own means first),
which are screened the same way, centred on the unit vectors' mean: data far from the origin,
whose unit vectors all but coincide, then screen as sharply as under the Euclidean metric. The
inner product is centred on the corpus side only, which shifts each query row by the constant
xᵀμ and leaves its ranking unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

__all__ = ["Metric", "get_metric", "METRICS", "UNIT_ROUNDOFF_FP32", "ScreenPrecision", "PRECISIONS", "get_precision",
           "DIGIT_BASE", "DIGIT_MAX", "DIGIT_REFERENCE_ERROR", "digit_width", "digit_blocks", "digit_scales",
           "digit_alphas", "digit_row_factors", "SCALED_TAIL", "SCALED_TOP", "scaled_width", "scaled_scales",
           "scaled_alphas", "scaled_row_factors", "scaled_row_scales", "TINY", "ORACLE_RELATIVE", "ORACLE_CONSTANT",
           "ORACLE_NORMS", "FLOAT16_EXACT_INTEGER", "EXACT_SUM_LIMIT", "with_exact_products", "lattice_point",
           "INTEGER_LOW", "INTEGER_HIGH", "INTEGER_MAX_D", "INTEGER_MAGNITUDE", "INTEGER_TAIL", "integer_width",
           "integer_blocks", "integer_terms", "integer_rows_fit", "integer_centre", "IntegerExtent",
           "INTEGER_RANGE_MESSAGE", "integer_prepared"]

#: Unit roundoff of IEEE float32 (round to nearest).
UNIT_ROUNDOFF_FP32 = 2.0**-24
#: Multiplier on the first-order rounding-error bound. The bound below is a worst case for any
#: summation order with round-to-nearest; the factor covers hardware that truncates, the
#: second-order terms dropped in the derivation and the float64 preparation steps.
SAFETY = 2.0
#: An absolute floor on the bound so that underflowing products cannot escape it.
TINY = 2.0**-100
#: The forms of :meth:`Metric.oracle_error` (:meth:`Metric.oracle_form`).
ORACLE_RELATIVE, ORACLE_CONSTANT, ORACLE_NORMS = 0, 1, 2
#: Smallest normal float32 (and bfloat16): tensor cores may flush anything below it to zero.
FLUSH = 2.0**-126
#: Digit screens (``int8x4``): each prepared vector v is v ≈ s_v·(h + l/DIGIT_BASE) with
#: integer digits |h|, |l| ≤ DIGIT_MAX and its own scale s_v (``docs/EXACTNESS.md``).
DIGIT_BASE = 254
DIGIT_MAX = 127
#: The relative digit error r₀ the digit screen's bound is balanced at (``_bound_norms``):
#: about what a vector's digits err by relative to its norm when its largest value is a few
#: times its root-mean-square (2.7·10⁻⁵ for Gaussian data, any d).
DIGIT_REFERENCE_ERROR = 2.0**-15
#: Each digit block of a prepared row is padded to a multiple of this many columns, and the
#: row's float32 scale and the metric's α (float32) follow the three blocks in this many more
#: bytes (8 used): rows of a multiple of 16 bytes let the GPU kernel load 16 bytes at a time.
#: H100, 10,000 × 1M × 128, nothing kept: rows of 392 bytes (blocks and tail of 8) 150 ms,
#: of 400 bytes 37 ms (the best tiles: 28.7 ms). Zero digits add exact zeros.
DIGIT_ALIGN = 16
#: Scaled float16 rows (``float16``): the d values of x/s (s = 2^e, the row's own power of two),
#: zero-padded to a multiple of 16, then a tail of this many float16 slots holding s and the
#: metric's α as two float32 (8 bytes used; 16 slots keep rows a multiple of 16 values, which
#: Triton specialises and CUDA loads 16 bytes at a time).
SCALED_TAIL = 16
#: A scaled row's largest |x/s| lies in [SCALED_TOP / 2, SCALED_TOP), and its float16 value in
#: [SCALED_TOP / 2, SCALED_TOP]: above 2¹⁴ float16's spacing is 16, so x/s ≥ 32,760 rounds to 2¹⁵.
#: 2¹⁵ is the largest power of two below float16's 65,504, so nothing overflows and the row uses
#: all 11 bits.
SCALED_TOP = 2.0**15
#: What an input flushed or rounded in float16's subnormal range errs by, absolutely, in the
#: scaled row's units: at most the smallest normal float16, 2⁻¹⁴; with the row's largest value
#: ≥ 2¹⁴ that is ≤ √d·2⁻²⁸ of its norm (``Metric.bound_coefficients``).
SCALED_SUBNORMAL = 2.0**-28
#: The largest integer magnitude float16 holds exactly (11-bit significands): a scaled float16 row
#: of integers up to this, scaled by a power of two, is stored without rounding.
FLOAT16_EXACT_INTEGER = 2048
#: Integer sums whose terms' absolute values add up to less than this are exact in float32 in any
#: order and under round-to-nearest or truncation: every product and partial sum is an integer
#: with at most 24 significant bits, so aligning the terms to the largest one drops no set bit
#: (``docs/EXACTNESS.md``, "Integer data"; ``tests/engine/test_gpu_fused.py`` checks it at the limit).
EXACT_SUM_LIMIT = 2**24
#: Integer rows (precision ``int8``): each centred value is an integer in [INTEGER_LOW,
#: INTEGER_HIGH], stored as int8, so a column's values may span up to 255 (uint8 pixels, photon
#: counts up to 255 above a column's smallest).
INTEGER_LOW, INTEGER_HIGH = -128, 127
#: Largest d of integer rows: the squared distance of two of them is at most d·255², an int32
#: below 2³¹ (and every intermediate of the kernel's q + r − 2·aᵀb, at most d·2¹⁵, fits too).
INTEGER_MAX_D = (2**31 - 1) // 255**2
#: Largest magnitude of a value of integer rows' inputs: centred in int32 arithmetic, with room
#: for a centre 255 away.
INTEGER_MAGNITUDE = 2**31 - 256
#: Integer rows end in a tail of this many bytes: the row's squared norm as an int32 (4 used),
#: keeping rows a multiple of 16 bytes for 16-byte loads.
INTEGER_TAIL = 16


@dataclass(frozen=True)
class ScreenPrecision:
    """How the screen's products are computed, as far as the rounding bound is concerned.

    Attributes
    ----------
    name : str
        The plan's name for it (``EnginePlan.screen_precision``).
    storage : torch.dtype
        The type the prepared vectors are stored in.
    input_roundoff : float
        Relative error of each input of the product as the multiplier sees it (bfloat16 2⁻⁸ plus
        the float64 → float32 → bfloat16 double rounding; TF32 2⁻¹⁰, which covers hardware that
        truncates rather than rounds the float32 inputs; tf32x3 keeps the hi + lo parts of each
        input and drops lo·lo, about 2·2⁻²⁰).
    accumulate_roundoff : float
        Unit roundoff of the float32 accumulation (2⁻²³ for tensor cores, which may truncate;
        three times that for tf32x3, whose three products go into one accumulator).
    exact_products : bool
        True where the data make the products exact (:func:`with_exact_products`): integer
        vectors, centred on an integer point, whose float16 values and float32 sums never
        round. Then ``input_roundoff`` and ``accumulate_roundoff`` are 0 and only the float32
        additions of the terms round.
    lattice_error : float
        With ``exact_products``: the largest distance of an input value from its lattice point
        (``Metric.lattice``), absolutely (0 for integers). It enters the bound like a flushed
        input: at most 2·√d·η·(‖a‖ + ‖b‖) on a dot product.
    fused : bool
        True for the split form of the fused kernel (``knng.engine.kernels.fused``): the product runs
        over the d input columns only and the per-vector terms are added afterwards in float32.
        False for the augmented form of the torch screen, where the terms are product columns.
    digits : bool
        True for the digit screen: each vector stored as int8 digits (h, l) of its own scale,
        the four products h·h, h·l, l·h, l·l as exact integers, then scaled and the terms added
        in float32. Its ``input_roundoff`` is unused (0): each vector's digit error rides in the
        norms its rows come with (``_bound_norms``).
    scaled : bool
        True for float16 rows with a power-of-two scale of their own (``float16``): each vector
        v is stored as v/s rounded to float16, with s = 2^e chosen so that its largest value is
        in [2¹⁴, 2¹⁵) before that rounding (no overflow, no needless subnormals); the kernel multiplies each product
        by α·s_a and s_b, exactly (powers of two). Its ``input_roundoff`` is float16's 2⁻¹¹ (plus
        the float64 → float32 → float16 double rounding); the subnormal range adds √d·2⁻²⁸ in
        :meth:`Metric.bound_coefficients`. float16 has TF32's bound at bfloat16's speed.
    integers : bool
        True for integer rows (``int8``): data whose every value is an integer and whose
        every column spans at most 255 (:func:`integer_rows_fit`), centred on an integer point
        of each column's range so that every value is an int8. The int8 tensor cores' products
        are summed in int32, exactly, and the kernel forms the key q + r − 2·aᵀb (the squared
        distance itself, q = ‖a‖² included on both sides) in int32, exactly: the float32 key is
        that integer rounded once, exact below 2²⁴, and within :attr:`key_roundoff` of it
        above. No product bound: ``Metric.bound_coefficients`` are 0.
    """

    name: str
    storage: torch.dtype
    input_roundoff: float
    accumulate_roundoff: float
    fused: bool
    digits: bool = False
    scaled: bool = False
    exact_products: bool = False
    lattice_error: float = 0.0
    integers: bool = False

    @property
    def kernel(self) -> bool:
        """Whether a kernel of ``knng.engine.kernels.fused`` screens it (the fused, digit and
        integer kernels) where Triton runs, rather than torch's product of augmented layouts."""
        return self.fused or self.digits or self.integers

    @property
    def key_roundoff(self) -> float:
        """How far a screened key may sit from the exact score relative to the key itself: 2u₃₂
        for integer rows (|fl(D) − D| ≤ u₃₂·D ≤ 2u₃₂·fl(D)), else 0 (their bound is in the
        norms). The error model adds it to the keys' conversion slack."""
        return 2.0 * UNIT_ROUNDOFF_FP32 if self.integers else 0.0


#: Every screen precision the engine knows. float32 and float64 run as torch products of the
#: augmented layout (CPU, or a GPU without Triton); the others run in the fused kernel.
PRECISIONS: dict[str, ScreenPrecision] = {
    "float64": ScreenPrecision("float64", torch.float64, 2.0**-53, 2.0**-53, fused=False),
    "float32": ScreenPrecision("float32", torch.float32, 2.0**-24, 2.0**-24, fused=False),
    "tf32x3": ScreenPrecision("tf32x3", torch.float32, 2.0**-19, 3 * 2.0**-23, fused=True),
    "tf32": ScreenPrecision("tf32", torch.float32, 2.0**-10, 2.0**-23, fused=True),
    "bfloat16": ScreenPrecision("bfloat16", torch.bfloat16, 2.0**-8 + 2.0**-23, 2.0**-23, fused=True),
    "float16": ScreenPrecision("float16", torch.float16, 2.0**-11 + 2.0**-23, 2.0**-23, fused=True, scaled=True),
    # Integer products are exact: the digits are the error (relative, d-dependent: see
    # Metric.bound_coefficients); float32 for the scaling after the products.
    "int8x4": ScreenPrecision("int8x4", torch.int8, 0.0, 2.0**-24, fused=False, digits=True),
    # Integer data: exact int8 products and an exact int32 key, rounded once to float32.
    "int8": ScreenPrecision("int8", torch.int8, 0.0, 0.0, fused=False, exact_products=True, integers=True),
}


@dataclass(frozen=True)
class IntegerExtent:
    """What a planner knows of data whose every value is an integer: the largest extent of a
    column (largest minus smallest value), the sum of the columns' squared extents and the
    largest magnitude of a value, exact or bounds (uint8 and int8 data by their type,
    :meth:`of_dtype`)."""

    largest: float
    squares: float
    magnitude: float = 0.0

    @staticmethod
    def of(spread: torch.Tensor, low: torch.Tensor | None = None) -> "IntegerExtent":
        """The extent of data whose columns span ``spread`` from ``low`` (float64; sums of squares
        of integers below 2⁵³ are exact in float64). Without ``low`` the magnitude is unknown:
        taken as infinite (no integer rows)."""
        if not spread.numel():
            return IntegerExtent(0.0, 0.0)
        spread = spread.to(torch.float64)
        magnitude = math.inf if low is None else float(torch.maximum(low.abs(), (low + spread).abs()).max())
        return IntegerExtent(float(spread.max()), float((spread * spread).sum()), magnitude)

    @staticmethod
    def of_dtype(d: int, dtype: torch.dtype) -> "IntegerExtent | None":
        """A bound of the extent of any data of ``dtype`` in ``d`` columns, known without a look
        at them (uint8 and int8: 255 a column), or None."""
        if dtype not in (torch.uint8, torch.int8):
            return None
        span = float(INTEGER_HIGH - INTEGER_LOW)
        return IntegerExtent(span, d * span * span, 255.0 if dtype == torch.uint8 else 128.0)

    def fit_integer_rows(self, d: int) -> bool:
        """Whether the data fit integer rows (precision ``int8``): d ≤ :data:`INTEGER_MAX_D`,
        every column spans at most 255, so that an integer centre puts every value in int8's
        range, and every value is below :data:`INTEGER_MAGNITUDE` in magnitude (the rows are
        made in int32 arithmetic)."""
        return (0 < d <= INTEGER_MAX_D and self.largest <= INTEGER_HIGH - INTEGER_LOW
                and self.magnitude <= INTEGER_MAGNITUDE)

    def exact_in_float16(self) -> bool:
        """Whether scaled float16 rows hold the centred values and their products' sums exactly
        (:func:`with_exact_products`): every extent at most 2,048, the squared extents below 2²⁴."""
        return self.largest <= FLOAT16_EXACT_INTEGER and self.squares < EXACT_SUM_LIMIT


#: The error of values that integer rows cannot hold (screen_dtype='int8' forced on other data).
INTEGER_RANGE_MESSAGE = ("integer rows need every centred value in [-128, 127]: these data are not integers whose "
                         "every column spans at most 255 (screen_dtype='int8')")


def integer_prepared(out: torch.Tensor, squares: torch.Tensor, side: str) -> Prepared:
    """Prepared integer rows from their value blocks ``out`` (int8, zero-padded, tail not yet
    written) and each row's squared norm ``squares`` (int32): the norm goes into the tail, and
    the float64 norms and terms (exact) and a query side's zero offsets (the key is the whole
    squared distance) come with them. Every preparation of integer rows ends here."""
    w = integer_blocks(out)
    out[:, w:].zero_()
    out[:, w:w + 4].view(torch.int32)[:, 0] = squares
    terms = squares.to(torch.float64)
    offsets = torch.zeros(out.shape[0], dtype=torch.float64, device=out.device) if side == "query" else None
    return Prepared(vectors=out, norms=torch.sqrt(terms), terms=terms, offsets=offsets)


def integer_rows_fit(d: int, spread: "torch.Tensor | None", low: "torch.Tensor | None") -> bool:
    """Whether data of dimension ``d`` whose every value is an integer, each column spanning
    ``spread`` from ``low`` (None: not known to be integers), fit integer rows
    (:meth:`IntegerExtent.fit_integer_rows`)."""
    return spread is not None and low is not None and IntegerExtent.of(spread, low).fit_integer_rows(d)


def integer_centre(mean: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """The integer centre of integer rows (float64, one per column): each column's rounded mean,
    moved into [high − 127, low + 128] so that every value v − c is an int8 (columns spanning at
    most 255: :func:`integer_rows_fit`). Any integer centre gives the same distances; the mean
    keeps the squared norms, and the int32 terms, small."""
    return torch.minimum(torch.maximum(torch.round(mean), high - INTEGER_HIGH), low - INTEGER_LOW)


def with_exact_products(precision: ScreenPrecision, integer_spread: torch.Tensor | None,
                        lattice_error: float = 0.0, unit: float = 1.0) -> ScreenPrecision:
    """``precision`` with exact products where the data allow, else ``precision`` itself.

    ``integer_spread``: for data whose every value is an integer (or, in units of
    ``Metric.lattice``, within ``lattice_error`` of a multiple of the unit), each column's
    largest minus smallest value in units (float64; None for other data). Centred on any integer point of the data's
    bounding box (a rounded mean is one), every prepared value v is an integer with |v_t| ≤
    spread_t. Scaled float16 rows hold such values exactly while spread ≤ 2,048 (a power-of-two
    scale only moves the exponent), their products are exact in float32, and a dot product's
    terms add up to Σ|a_t b_t| ≤ ‖a‖‖b‖ ≤ ‖spread‖² in absolute value: below
    :data:`EXACT_SUM_LIMIT` the float32 sum is exact too, in whatever order the tensor cores add.
    Only the float32 steps after the sum are left to round, so the bound shrinks from about 2⁻⁸
    of ‖a‖‖b‖ to about 2⁻²⁰ (image patches of uint8 pixels: 8×8 and 16×16 both qualify). The caller
    centres on integer points (``torch.round`` of a mean). On a lattice of another unit
    (grey levels divided by 255) the scales are no longer powers of two: the products' two
    scalings round (2u₃₂ more) and each value's distance from its lattice point, at most
    ``lattice_error``, enters as an absolute input error (:meth:`Metric.bound_coefficients`).
    """
    if integer_spread is None or not precision.scaled or precision.exact_products:
        return precision
    spread = integer_spread.to(torch.float64)
    if math.sqrt(max(1, spread.numel())) * lattice_error > unit / 4:
        return precision  # the bound's argument needs every nonzero lattice vector longer than its error
    if not IntegerExtent.of(spread).exact_in_float16():
        return precision
    return replace(precision, input_roundoff=0.0, accumulate_roundoff=0.0, exact_products=True,
                   lattice_error=float(lattice_error))


def lattice_point(x: torch.Tensor, unit: float) -> torch.Tensor:
    """The nearest multiple of ``unit`` to each value of float64 ``x`` (a centre rounded onto the
    data's lattice: for a float32 unit and integers of up to 29 bits, exact in float64)."""
    return torch.round(x / unit) * unit


def get_precision(name: "str | ScreenPrecision | torch.dtype") -> ScreenPrecision:
    """The :class:`ScreenPrecision` called ``name`` (a torch dtype names float32/float64/bfloat16)."""
    if isinstance(name, ScreenPrecision):
        return name
    key = str(name).replace("torch.", "")
    if key not in PRECISIONS:
        raise ValueError(f"screen precision must be one of {sorted(PRECISIONS)}, got {name!r}")
    return PRECISIONS[key]


@dataclass(frozen=True)
class Prepared:
    """A block of prepared vectors, ready for the screen.

    The per-vector terms ride along as extra columns, so that a single matrix product gives
    the whole score ``α·aᵀb + r_j + q_i`` (the Euclidean family's ‖·‖² terms cost no extra
    pass over the score block)::

        query side:   [ α·a , 1 , q ]        corpus side:   [ b , r , 1 ]

    padded with zero columns to a multiple of 4 values (16 on a GPU, :data:`GPU_ROW_MULTIPLE`)
    for aligned matrix products. Zero columns add
    exact zeros; the two term columns are accounted for in the error bound.

    Attributes
    ----------
    vectors : torch.Tensor
        (m, width) in the layout above, in the screen's storage type (float32, float64, bfloat16).
    norms : torch.Tensor
        float64 (m,): Euclidean norms of the unscaled prepared vectors (before rounding); for
        digit rows their *bound norms*, which are larger (``_bound_norms``): what the error
        bound multiplies, and an upper bound wherever else the engine uses a norm.
    terms : torch.Tensor or None
        float64 (m,): the additive term (‖·‖² for the Euclidean family), or None.
    offsets : torch.Tensor or None
        float64 (m,), query side only: what turns a row's score into its distance
        (``distance = to_distance(score + offset)``), e.g. the ‖a‖² a search leaves out.

    Digit screens (storage int8) store each row as ``[h | l | h | s α]``: three digit blocks of
    :func:`digit_width` columns, then the row's scale s and the metric's α as two float32 (in
    16 bytes), the same on both sides (α enters the products' scaling once, from the row side):
    the products h·h, [h | l]·[l | h] and l·l of a block read contiguous column ranges, and every
    copy, gather or exchange of rows carries what its products need. The terms are added after
    the products in float32, as in the fused kernel's split form.
    """

    vectors: torch.Tensor
    norms: torch.Tensor
    terms: torch.Tensor | None
    offsets: torch.Tensor | None = None


#: Columns of a prepared block are a multiple of this many values on a GPU: Triton specialises
#: a kernel for integer arguments divisible by 16, and without it the fused screen loads its
#: rows value by value. 10,000 × 1M × 128 on an H100 (2026-11-23, nothing kept): rows of 128
#: or 144 values 18.7 / 19.1 ms in TF32, 14.8 / 14.7 ms in bfloat16; rows of 132 or 136
#: 32–34 ms and 28–29 ms. On a CPU (torch products only) a multiple of 4 wastes fewer columns.
GPU_ROW_MULTIPLE = 16
CPU_ROW_MULTIPLE = 4


def _aligned_width(d: int, extra: int, multiple: int) -> int:
    return -(-(d + extra) // multiple) * multiple


def digit_width(d: int) -> int:
    """Columns of one digit block (h or l) of a prepared row of dimension ``d``."""
    return _aligned_width(d, 0, DIGIT_ALIGN)


def digit_blocks(rows: torch.Tensor) -> int:
    """Columns of each of the three digit blocks of prepared digit rows."""
    return (rows.shape[1] - DIGIT_ALIGN) // 3


def digit_scales(rows: torch.Tensor) -> torch.Tensor:
    """The float32 scale of every row of prepared digit rows (a view into ``rows``)."""
    w = digit_blocks(rows)
    return rows[:, 3 * w:3 * w + 4].view(torch.float32)[:, 0]


def digit_alphas(rows: torch.Tensor) -> torch.Tensor:
    """The metric's α stored with every row of prepared digit rows (a view into ``rows``)."""
    w = digit_blocks(rows)
    return rows[:, 3 * w + 4:3 * w + 8].view(torch.float32)[:, 0]


def digit_row_factors(rows: torch.Tensor) -> torch.Tensor:
    """float32 α·s / DIGIT_BASE² of every row of prepared digit rows: the row side's factor of
    the digit screen's scaling (rounded once, as its bound counts)."""
    return (digit_scales(rows).to(torch.float64) * digit_alphas(rows).to(torch.float64) / DIGIT_BASE**2
            ).to(torch.float32)


def integer_width(d: int) -> int:
    """Columns of the value block of an integer row of dimension ``d`` (the product's K)."""
    return _aligned_width(d, 0, 16)


def integer_blocks(rows: torch.Tensor) -> int:
    """Columns of the value block of prepared integer rows."""
    return rows.shape[1] - INTEGER_TAIL


def integer_terms(rows: torch.Tensor) -> torch.Tensor:
    """The int32 squared norm of every prepared integer row (a copy, one per row, contiguous)."""
    w = integer_blocks(rows)
    return rows[:, w:w + 4].contiguous().view(torch.int32)[:, 0].contiguous()


def scaled_width(d: int) -> int:
    """Columns of the value block of a scaled float16 row of dimension ``d`` (the product's K)."""
    return _aligned_width(d, 0, 16)


def _scaled_tail(rows: torch.Tensor) -> torch.Tensor:
    """The float32 (s, α) pair of every scaled float16 row (a view into ``rows``)."""
    k = rows.shape[1] - SCALED_TAIL
    return rows[:, k:k + 4].view(torch.float32)


def scaled_scales(rows: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale s of every row of prepared float16 rows (float32, a view)."""
    return _scaled_tail(rows)[:, 0]


def scaled_alphas(rows: torch.Tensor) -> torch.Tensor:
    """The metric's α stored with every row of prepared float16 rows (float32, a view)."""
    return _scaled_tail(rows)[:, 1]


def scaled_row_factors(rows: torch.Tensor) -> torch.Tensor:
    """float32 α·s of every prepared float16 row: the row side's factor of the product, exact
    (a product of powers of two within float32's range)."""
    return scaled_alphas(rows) * scaled_scales(rows)


def scaled_row_scales(top: torch.Tensor) -> torch.Tensor:
    """The power-of-two scale s (float64) of rows whose largest |value| is ``top`` (float64).

    s = 2^(e − 15) where top = f·2^e, f ∈ [½, 1): the row's largest |x/s| is in [2¹⁴, 2¹⁵). A
    zero row gets s = 1; s stays within [2⁻¹²⁵, 2¹²⁵] (rows of tinier values then err
    absolutely, by less than the bound's ``c_flush``; larger ones are refused by the norm limit
    first). The one rule for every preparation of scaled float16 rows (the GPU's kernels too).
    """
    _, exponent = torch.frexp(top)
    shift = torch.where(top > 0, exponent.to(torch.int64) - 15, torch.zeros_like(exponent, dtype=torch.int64))
    shift = shift.clamp(-125, 125)
    return torch.ldexp(torch.ones_like(top), shift.to(torch.float64))


def _scaled_rows(x64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each float64 row's power-of-two scale s (float64, :func:`scaled_row_scales`) and the row
    x/s (exact in float64)."""
    top = torch.linalg.vector_norm(x64, ord=math.inf, dim=1) if x64.shape[1] else x64.new_zeros(x64.shape[0])
    scale = scaled_row_scales(top)
    return scale, x64 / scale[:, None]


def _bound_norms(x64: torch.Tensor, norms: torch.Tensor, scale: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor
                 ) -> torch.Tensor:
    """The norms the digit screen's bound multiplies: N = max(‖v‖, ‖s·h‖ + ‖s·l‖/B) + ε / r₀.

    ε is the vector's own digit error ‖v − s(h + l/B)‖ (computed in float64, widened by its
    rounding), r₀ = :data:`DIGIT_REFERENCE_ERROR`. With c_dot = 2|α|(r₀ + 16u₃₂), c_dot·N_a·N_b
    covers the digits (r₀(‖a‖ + ε_a/r₀)(‖b‖ + ε_b/r₀) ≥ ε_a‖b‖ + ‖a‖ε_b + ε_a·ε_b) and the float32
    scaling, whose every intermediate is at most (‖s h_a‖ + ‖s l_a‖/B)(‖s h_b‖ + ‖s l_b‖/B): a
    product form like every other precision's, from one number per vector, within about twice
    the bound each vector's own error would give. ``norms``: the float64 ‖v‖; ``hi``, ``lo``:
    the digits as :func:`_digits` returns them (float64).
    """
    s = scale.to(torch.float64)[:, None]
    d = x64.shape[1]
    # One buffer for the steps below (a 1M × 128 corpus: 1 GB a pass): in place, each step
    # rounds exactly as its out-of-place form (x − y is −y + x, h + l/B is l/B + h).
    work = lo / DIGIT_BASE
    work.add_(hi).mul_(s)
    err = torch.linalg.vector_norm(torch.sub(x64, work, out=work), dim=1)
    # The float64 steps above err by < 2⁻⁴⁴·s per value (s ≥ max|v| / 127) and (d + 2)·2⁻⁵³
    # relative in the norm.
    err = err * (1.0 + 2.0**-40) + math.sqrt(d) * 2.0**-44 * s[:, 0]
    high = torch.linalg.vector_norm(torch.mul(s, hi, out=work), dim=1)
    digits = high + torch.linalg.vector_norm(torch.mul(s, lo, out=work), dim=1) / DIGIT_BASE
    return (torch.maximum(norms, digits * (1.0 + 2.0**-40)) + err / DIGIT_REFERENCE_ERROR) * (1.0 + 2.0**-50)


def _digits(x64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each float64 row's scale s (float32, exact in float64) and its digits h, l (integers in
    [−DIGIT_MAX, DIGIT_MAX], as float64) with x ≈ s·(h + l / DIGIT_BASE).

    s = max|x| / DIGIT_MAX, rounded up to float32 (so that |x / s| ≤ DIGIT_MAX and h never
    clips; a zero row gets 1, and s is at least the smallest normal float32: rows of tinier
    values then err absolutely, by less than the bound's ``c_flush``). Per value: t = x / s
    rounds by ≤ 2⁻⁵³·|t| ≤ 2⁻⁴⁶, t − h is exact, and l rounds DIGIT_BASE·(t − h) to the nearest
    integer, so |x − s(h + l/B)| ≤ s·(1/(2B) + 2⁻⁴⁵). No clipping is needed: the exact
    quotient |x|/s is at most DIGIT_MAX and rounding is monotone, so |t| ≤ DIGIT_MAX, and
    |t − h| ≤ 1/2 gives |l| ≤ DIGIT_BASE/2 = DIGIT_MAX.
    """
    # max|x| as the ∞-norm: one pass, no |x| temporary.
    top = torch.linalg.vector_norm(x64, ord=math.inf, dim=1) if x64.shape[1] else x64.new_zeros(x64.shape[0])
    scale64 = torch.where(top > 0, (top / DIGIT_MAX).clamp_min(FLUSH), torch.ones_like(top))
    scale = scale64.to(torch.float32)
    scale = torch.where(scale.to(torch.float64) < scale64, torch.nextafter(scale, torch.full_like(scale, torch.inf)),
                        scale)
    t = x64 / scale.to(torch.float64)[:, None]
    hi = torch.round(t)
    return scale, hi, t.sub_(hi).mul_(DIGIT_BASE).round_()


@dataclass(frozen=True)
class Metric:
    """A distance, described by how knng screens and then computes it exactly.

    Attributes
    ----------
    name : str
        The public name (``metric=`` argument).
    alpha : float
        Scale of the dot product in the screening score (−2 or −1; powers of two so that the
        scaling is exact in floating point).
    uses_terms : bool
        Whether scores carry the per-vector squared-norm terms (Euclidean family, cosine and
        Pearson).
    centre_queries, centre_corpus : bool
        Whether each side is shifted by the common centre before rounding to float32.
    normalize : bool
        Whether vectors are scaled to unit length (cosine, Pearson).
    centre_rows : bool
        Whether each vector is centred on its own mean first (Pearson).
    lattice : float or None
        The unit of the data's values where they lie near a lattice (1.0: integers, give or
        take a little; a float32 such as fl(1/255) for grey levels divided by 255): scaled
        float16 rows then store each centred value as its nearest multiple of the unit, an
        integer number of units, and the unit rides in the row's scale
        (:func:`with_exact_products`). None: the rows hold the values as they are (exact
        integers need no rounding either).
    integers : bool
        True where int8 rows are integer rows (precision ``int8``: the centred values
        themselves and the int32 squared norm, :func:`integer_rows_fit`), not digits.
    """

    name: str
    alpha: float
    uses_terms: bool
    centre_queries: bool
    centre_corpus: bool
    normalize: bool = False
    centre_rows: bool = False
    lattice: float | None = None
    integers: bool = False

    # ----------------------------------------------------------------------------- preparation
    def needs_centre(self, symmetric: bool) -> bool:
        """Whether the engine must compute the corpus mean (one float64 pass) first."""
        if symmetric:
            # A graph screens data against itself; both sides must be prepared alike so that
            # the block is symmetric, which rules out the corpus-only shift of inner products.
            return self.centre_queries and self.centre_corpus
        return self.centre_corpus

    @property
    def translation_invariant(self) -> bool:
        """Whether the key is the squared Euclidean distance of the (centred) inputs: then any
        centre gives the same scores, and |uᵀx − uᵀy| ≤ ‖x − y‖ bounds the key along u."""
        return self.uses_terms and self.needs_centre(True) and not self.normalize

    def shifts(self, side: str, symmetric: bool) -> bool:
        """Whether :meth:`prepare` subtracts the common centre from vectors of ``side``."""
        if symmetric:
            return self.needs_centre(True)
        return self.centre_queries if side == "query" else self.centre_corpus

    def width(self, d: int, device: torch.device, dtype: torch.dtype = torch.float32) -> int:
        """Columns of a prepared block for input dimension ``d`` on ``device`` (storage ``dtype``)."""
        if dtype == torch.int8:
            return integer_width(d) + INTEGER_TAIL if self.integers else 3 * digit_width(d) + DIGIT_ALIGN
        if dtype == torch.float16:
            return scaled_width(d) + SCALED_TAIL
        multiple = GPU_ROW_MULTIPLE if device.type == "cuda" else CPU_ROW_MULTIPLE
        return _aligned_width(d, 2 if self.uses_terms else 0, multiple)

    def prepare(
        self,
        x: torch.Tensor,
        centre: torch.Tensor | None,
        *,
        side: str,
        symmetric: bool,
        dtype: torch.dtype = torch.float32,
    ) -> Prepared:
        """Prepare a block of input vectors for the screen.

        Parameters
        ----------
        x : torch.Tensor
            (m, d) input vectors of any supported dtype, on the compute device.
        centre : torch.Tensor or None
            float64 (d,) common centre, or None when the metric does not centre.
        side : {"query", "corpus"}
            Queries are scaled by α and take the query layout; the corpus the corpus layout.
        symmetric : bool
            True for a graph (data against itself): queries also carry the row term q = ‖a‖².
        dtype : torch.dtype
            The screen's storage type (``ScreenPrecision.storage``); int8 for the digit screen,
            or for integer rows where :attr:`integers` (``centre`` then an integer point).
        """
        if dtype == torch.int8 and self.integers:
            return self._integer_rows(x, centre, side=side, symmetric=symmetric)
        x64 = self.unit_rows(x.to(torch.float64))
        zero = self.zero_rows(x64)
        if self.shifts(side, symmetric) and centre is not None:
            x64 = x64 - centre
        m, d = x64.shape
        norms = torch.linalg.vector_norm(x64, dim=1)
        out = torch.zeros((m, self.width(d, x64.device, dtype)), dtype=dtype, device=x64.device)
        terms, offsets = self.terms_and_offsets(x64, norms, centre, side=side, symmetric=symmetric, zero=zero)
        if dtype == torch.int8:
            scale, hi, lo = _digits(x64)
            w = digit_width(d)
            hi8 = hi.to(torch.int8)  # exact: integers within ±DIGIT_MAX
            out[:, :d] = hi8
            out[:, w:w + d] = lo.to(torch.int8)
            out[:, 2 * w:2 * w + d] = hi8
            del hi8
            digit_scales(out).copy_(scale)
            digit_alphas(out).fill_(self.alpha)
            # The bound norms (_bound_norms): every use of a prepared norm is an upper bound that
            # error radii and block thresholds grow with, so a larger one only widens them.
            return Prepared(vectors=out, norms=_bound_norms(x64, norms, scale, hi, lo), terms=terms, offsets=offsets)
        if dtype == torch.float16:
            # Scaled rows, the same on both sides (α rides in the tail): x/s is exact in float64,
            # and its float16 rounding (through float32 in torch) is what the bound counts. On a
            # lattice the rows hold the values' nearest multiples of the unit, as integer numbers
            # of units, and the unit joins the (then maybe not power-of-two) scale.
            if self.lattice is not None:
                scale, values = _scaled_rows(torch.round(x64 / self.lattice))
                scale = scale * self.lattice  # exact: a power of two times a float32
            else:
                scale, values = _scaled_rows(x64)
            out[:, :d] = values
            del values
            scaled_scales(out).copy_(scale)
            scaled_alphas(out).fill_(self.alpha)
            return Prepared(vectors=out, norms=norms, terms=terms, offsets=offsets)
        if side == "query":
            out[:, :d] = x64 * self.alpha  # exact: α is a power of two
            if self.uses_terms:
                out[:, d] = 1.0
                if symmetric:
                    out[:, d + 1] = terms
        else:
            out[:, :d] = x64
            if self.uses_terms:
                out[:, d] = terms
                out[:, d + 1] = 1.0
        return Prepared(vectors=out, norms=norms, terms=terms, offsets=offsets)

    def _integer_rows(self, x: torch.Tensor, centre: torch.Tensor | None, *, side: str, symmetric: bool) -> Prepared:
        """Integer rows ``[v | ‖v‖² (int32) | 0…]`` of integer inputs ``x`` (any dtype, every
        value an integer) centred on the integer point ``centre``: every v an int8, or an error.

        The key is the squared distance itself on both sides (the row term ‖a‖² in the kernel's
        int32 sum), so a search's rows carry their term and no offset."""
        self.check_integer_rows(side, symmetric, centre)
        assert centre is not None
        m, d = x.shape
        # int32 holds every value: the data are integers within 255 of the centre (or refused).
        values = x.to(torch.int32)
        values -= centre.to(device=x.device, dtype=torch.int32)
        if m and d:
            low, high = torch.aminmax(values)
            if int(low) < INTEGER_LOW or int(high) > INTEGER_HIGH:
                raise ValueError(INTEGER_RANGE_MESSAGE)
        squares = values.to(torch.int64).square_().sum(dim=1).to(torch.int32)  # exact: below d·2¹⁴
        out = torch.zeros((m, integer_width(d) + INTEGER_TAIL), dtype=torch.int8, device=x.device)
        out[:, :d] = values
        return integer_prepared(out, squares, side)

    def check_integer_rows(self, side: str, symmetric: bool, centre: torch.Tensor | None) -> None:
        """Refuse integer rows (:attr:`integers`) for a metric that does not shift ``side`` by a
        common centre, or without one: their key is a squared distance around an integer point."""
        if not (self.translation_invariant and self.shifts(side, symmetric)) or centre is None:
            raise ValueError(f"integer rows need a translation-invariant metric and a centre ({self.name})")

    def centred_rows(self, x64: torch.Tensor) -> torch.Tensor:
        """float64 rows each centred on its own mean under Pearson (a constant row exactly zero);
        the rows themselves for the other metrics."""
        return _centre_rows(x64) if self.centre_rows else x64

    def unit_rows(self, x64: torch.Tensor) -> torch.Tensor:
        """float64 rows as the metric compares them before any shift: each vector centred on its
        own mean (Pearson, :meth:`centred_rows`), then scaled to unit length (cosine, Pearson; zero
        vectors stay zero); the rows themselves for the other metrics. The common centre is the
        mean of these."""
        x64 = self.centred_rows(x64)
        if self.normalize:
            norm = torch.linalg.vector_norm(x64, dim=1, keepdim=True)
            x64 = x64 / torch.where(norm > 0, norm, torch.ones_like(norm))
        return x64

    def zero_rows(self, unit: torch.Tensor) -> torch.Tensor | None:
        """For the unit rows of a normalising metric (:meth:`unit_rows`), 1.0 where a row is zero
        (a zero vector, or a constant one under Pearson) and 0.0 elsewhere, float64: added to the
        row's term, it gives a zero vector similarity 0 with everything (distance 1), as
        scikit-learn does: ‖x̂ − ŷ‖² + z_x + z_y = 2 − 2x̂ᵀŷ for rows of norm 0 or 1. None for
        the other metrics."""
        if not self.normalize:
            return None
        return (~unit.ne(0).any(dim=1)).to(torch.float64)

    def terms_and_offsets(self, x: torch.Tensor, norms: torch.Tensor, centre: torch.Tensor | None, *, side: str,
                          symmetric: bool, zero: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The per-vector terms and (query side) offsets of a block (see :class:`Prepared`),
        the same for every storage type: ``norms`` the float64 norms of its prepared vectors,
        ``x`` the vectors (any dtype) where an offset needs them (the query side of an inner
        product, which is never shifted); ``zero`` the zero rows of a normalising metric
        (:meth:`zero_rows`), whose terms and offsets take 1 more."""
        squares = norms * norms if zero is None else norms * norms + zero
        if side != "query":
            return (squares if self.uses_terms else None), None
        terms = None
        offsets = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
        if self.uses_terms:
            if symmetric:
                terms = squares
            else:
                offsets = squares
        elif centre is not None and self.centre_corpus and not symmetric:
            offsets = -(x.to(torch.float64) @ centre)  # −xᵀy = −xᵀ(y − μ) − xᵀμ
        return terms, offsets

    def query_layout(self, corpus_side: torch.Tensor, d: int) -> torch.Tensor:
        """Turn a corpus-layout block into the query layout (for a graph, where data is both).

        Digit blocks (int8) and scaled float16 rows are the same on both sides: α is in the
        products' scaling."""
        if corpus_side.dtype in (torch.int8, torch.float16):
            return corpus_side
        out = torch.zeros_like(corpus_side)
        out[:, :d] = corpus_side[:, :d] * self.alpha
        if self.uses_terms:
            out[:, d] = corpus_side[:, d + 1]
            out[:, d + 1] = corpus_side[:, d]
        return out

    # --------------------------------------------------------------------------------- bounds
    def bound_coefficients(self, d: int, unit_roundoff: float = UNIT_ROUNDOFF_FP32,
                           precision: ScreenPrecision | None = None) -> tuple[float, float, float]:
        """Return ``(c_dot, c_term, c_flush)`` of the per-pair rounding-error bound of the screen.

        ``|s̃_ij − s_ij| ≤ E_ij = c_dot·‖a_i‖‖b_j‖ + c_term·(|r_j| + |q_i|) + c_flush·(‖a_i‖ + ‖b_j‖)
        + TINY``, where ``s_ij`` is the score of the unrounded prepared vectors.

        The augmented form (torch screen, one precision u for inputs and accumulation, given by
        ``unit_roundoff`` or a non-fused ``precision``): over the w = d (+2 term columns)
        entries in any order, rounding the inputs costs 2u on the dot part and u on each term,
        the accumulation γ_w = w·u/(1 − w·u) on the sum of absolute products.

        The split form (fused kernel): inputs rounded by u_in, products of d columns accumulated
        in float32 with u_acc (γ_d), then the terms, rounded to float32, added in two float32
        additions (2·u₃₂ on everything, u₃₂ more on each term). ``c_flush`` covers inputs and
        products flushed to zero below the smallest normal. See ``docs/EXACTNESS.md``.
        """
        alpha = abs(self.alpha)
        if precision is not None and precision.digits:
            return self._digit_coefficients(d)
        if precision is not None and precision.integers:
            # The key is an exact integer rounded once: its error is relative to the key
            # (ScreenPrecision.key_roundoff, in the error model's slack), not to the norms.
            return 0.0, 0.0, 0.0
        if precision is not None and precision.exact_products:
            return self._exact_coefficients(d, precision.lattice_error)
        if precision is not None and precision.fused:
            u_in, u_acc, u32 = precision.input_roundoff, precision.accumulate_roundoff, UNIT_ROUNDOFF_FP32
            if precision.scaled:
                # Values in float16's subnormal range err absolutely (SCALED_SUBNORMAL); the
                # scalings by α·s_a and s_b are exact.
                u_in += math.sqrt(d) * SCALED_SUBNORMAL
            gamma = d * u_acc / (1.0 - d * u_acc)
            c_dot = SAFETY * alpha * (2.0 * u_in + u_in * u_in + gamma * (1.0 + u_in) ** 2 + 2.0 * u32)
            c_term = SAFETY * 3.0 * u32 if self.uses_terms else 0.0
        else:
            u = precision.input_roundoff if precision is not None else unit_roundoff
            w = d + 2 if self.uses_terms else d
            gamma = w * u / (1.0 - w * u)
            c_dot = SAFETY * alpha * (2.0 * u + gamma)
            c_term = SAFETY * (u + gamma) if self.uses_terms else 0.0
        c_flush = SAFETY * alpha * math.sqrt(d) * FLUSH
        return c_dot, c_term, c_flush

    def _exact_coefficients(self, d: int, lattice_error: float) -> tuple[float, float, float]:
        """``(c_dot, c_term, c_flush)`` of a float16 screen with exact products
        (:func:`with_exact_products`, ``docs/EXACTNESS.md``, "Integer data: exact products").

        The sum of the stored values' products is exact; its two scalings (by α·s_a, then s_b)
        round once each where the scales are not powers of two, and the terms' two additions
        round as in the split form: 4u₃₂ on |α|‖a‖‖b‖, 3u₃₂ on each term. Each stored value is
        its input's lattice point, at most η = ``lattice_error`` away: with a = â + r_a,
        |aᵀb − âᵀb̂| ≤ √d·η(‖a‖ + ‖b‖) + ‖r_a‖‖r_b‖ ≤ 2√d·η(‖a‖ + ‖b‖) (‖r_a‖ ≤ ‖a‖ when â = 0,
        else ‖a‖ is at least half a unit), beside the flush term of every precision.
        """
        alpha, u32 = abs(self.alpha), UNIT_ROUNDOFF_FP32
        c_dot = SAFETY * alpha * 4.0 * u32
        c_term = SAFETY * 3.0 * u32 if self.uses_terms else 0.0
        c_flush = SAFETY * alpha * math.sqrt(d) * (FLUSH + 2.0 * lattice_error)
        return c_dot, c_term, c_flush

    def _digit_coefficients(self, d: int) -> tuple[float, float, float]:
        """``(c_dot, c_term, c_flush)`` of the digit screen (``docs/EXACTNESS.md``).

        Applied to the *bound norms* of :func:`_bound_norms`: c_dot = 2|α|(r₀ + 16u₃₂) covers the
        digits' error (the r₀ part) and the float32 scaling of the exact integer products (ten
        roundings on intermediates at most N_a·N_b, two more for the term additions; 16 for
        margin); the terms are added as in the split form. Scales below 2⁻¹²⁶ and underflowing
        scaled products err absolutely, within ``c_flush``.
        """
        alpha, u32 = abs(self.alpha), UNIT_ROUNDOFF_FP32
        c_dot = SAFETY * alpha * (DIGIT_REFERENCE_ERROR + 16.0 * u32)
        c_term = SAFETY * 3.0 * u32 if self.uses_terms else 0.0
        c_flush = SAFETY * alpha * math.sqrt(d) * 16.0 * FLUSH
        return c_dot, c_term, c_flush

    def pair_bound(
        self,
        d: int,
        row_norms: torch.Tensor,
        col_norms: torch.Tensor,
        row_terms: torch.Tensor | None,
        col_terms: torch.Tensor | None,
        unit_roundoff: float = UNIT_ROUNDOFF_FP32,
        precision: ScreenPrecision | None = None,
    ) -> torch.Tensor:
        """Elementwise ``E_ij`` (float64) for broadcastable row/column norms and terms."""
        c_dot, c_term, c_flush = self.bound_coefficients(d, unit_roundoff, precision)
        bound = c_dot * row_norms * col_norms + c_flush * (row_norms + col_norms) + TINY
        if c_term:
            if col_terms is not None:
                bound = bound + c_term * col_terms.abs()
            if row_terms is not None:
                bound = bound + c_term * row_terms.abs()
        return bound

    def to_distance(self, value: torch.Tensor) -> torch.Tensor:
        """Map ``score + offset`` (squared units for the Euclidean family; ‖x̂ − ŷ‖², twice the
        distance, for cosine and Pearson) to the distance."""
        if self.name == "euclidean":
            return torch.sqrt(value.clamp_min(0.0))
        if self.normalize:
            return value.clamp_min(0.0) * 0.5  # exact: a power of two
        return value

    def from_distance(self, dist: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_distance`: a distance back in the units of ``score + offset``."""
        if self.name == "euclidean":
            return dist * dist
        if self.normalize:
            return dist * 2.0
        return dist

    def oracle_error(self, value: torch.Tensor, row_norms: torch.Tensor, col_norms: torch.Tensor,
                     d: int, centre_norm: float) -> torch.Tensor:
        """How far any float64 evaluation of the exact distance may stray from the real one.

        In the units of ``score + offset``. The Euclidean sum of d squares errs by at most
        γ_d relative; the unit-vector form by a few γ_d absolutely (its terms are ≤ 2); the
        inner product by γ_d·‖x‖‖y‖ with ‖y‖ ≤ ‖y − μ‖ + ‖μ‖.
        """
        form, gamma = self.oracle_form(d)
        if form == ORACLE_RELATIVE:
            return gamma * value.abs()
        if form == ORACLE_CONSTANT:
            return torch.full_like(value, gamma)
        return gamma * row_norms * (col_norms + centre_norm)

    def oracle_form(self, d: int) -> tuple[int, float]:
        """The form of :meth:`oracle_error` for this metric and its coefficient: γ·|value|
        (``ORACLE_RELATIVE``), a constant (``ORACLE_CONSTANT``) or γ·‖x‖·(‖y‖ + ‖μ‖)
        (``ORACLE_NORMS``), with γ = γ_d (a few γ_d for the constant). The threshold kernel
        (:mod:`knng.engine.kernels.radius`) computes the same from it."""
        gamma = 2.0 * (d + 8) * 2.0**-53
        if self.normalize:
            # ½‖x̂ − ŷ‖² from float64 unit vectors errs absolutely (each unit vector's rounding),
            # a few γ in distance units, twice that in the units of ‖x̂ − ŷ‖².
            return ORACLE_CONSTANT, 8.0 * gamma
        if self.uses_terms:
            return ORACLE_RELATIVE, gamma
        return ORACLE_NORMS, gamma

    def exact(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Exact float64 distances from each row ``x[i]`` (m, d) to its rows ``y[i]`` (m, c, d).

        Computed from the input values directly: by differences for the Euclidean family
        (``torch.cdist`` without the matrix-product shortcut, which sums (x − y)² in float64
        without materialising the differences) and on unit vectors (½‖x̂ − ŷ‖², equal to
        1 − cos and exactly 0 for duplicates) for the similarity family.
        """
        x64 = x.to(torch.float64)[:, None, :]
        y64 = y.to(torch.float64)
        if self.name == "inner_product":
            return -(y64 @ x64.transpose(1, 2))[:, :, 0]
        if self.name == "euclidean":
            return _cdist(x64, y64)
        if self.name == "sqeuclidean":
            # Not cdist²: squaring a rounded square root moves values that sit exactly on a
            # float32 rounding midpoint (common for float32 and integer inputs) off it.
            return _sum_of_squared_differences(x64, y64)
        if self.centre_rows:
            x64, y64 = _centre_rows(x64), _centre_rows(y64)
        nx = torch.linalg.vector_norm(x64, dim=-1, keepdim=True)
        ny = torch.linalg.vector_norm(y64, dim=-1, keepdim=True)
        half = _cdist(x64 / torch.where(nx > 0, nx, 1.0), y64 / torch.where(ny > 0, ny, 1.0))
        dist = 0.5 * half * half
        zero = (nx[:, :, 0] == 0) | (ny[:, :, 0] == 0)
        return torch.where(zero, torch.ones_like(dist), dist)


def _centre_rows(x: torch.Tensor) -> torch.Tensor:
    """Each vector minus its own mean; exactly zero for a constant vector.

    The float64 mean of a constant vector is not always that constant (0.1 · 3 / 3 ≠ 0.1), so
    centring would leave ±1e-17 noise whose direction then decides the Pearson neighbours. A
    vector whose entries are all equal is set to zero instead: correlation 0, distance 1.
    """
    centred = x - x.mean(dim=-1, keepdim=True)
    constant = x.amax(dim=-1, keepdim=True) == x.amin(dim=-1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centred), centred)


def _sum_of_squared_differences(x: torch.Tensor, y: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Σ (x − y)² for x (m, 1, d) against y (m, c, d), in float64, a few dimensions at a time."""
    out = torch.zeros(y.shape[:2], dtype=torch.float64, device=y.device)
    for c0 in range(0, y.shape[2], chunk):
        diff = y[:, :, c0:c0 + chunk] - x[:, :, c0:c0 + chunk]
        out += (diff * diff).sum(dim=-1)
    return out


def _cdist(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """‖x − y‖ for x (m, 1, d) against y (m, c, d), by differences, as (m, c)."""
    return torch.cdist(x, y, compute_mode="donot_use_mm_for_euclid_dist")[:, 0, :]


METRICS: dict[str, Metric] = {
    "euclidean": Metric("euclidean", alpha=-2.0, uses_terms=True, centre_queries=True, centre_corpus=True),
    "sqeuclidean": Metric("sqeuclidean", alpha=-2.0, uses_terms=True, centre_queries=True, centre_corpus=True),
    # Cosine and Pearson: the Euclidean screen of the unit vectors (½‖x̂ − ŷ‖² = 1 − cos), centred
    # on their mean, so that data far from the origin (whose unit vectors all but coincide)
    # screen as sharply as under the Euclidean metric.
    "cosine": Metric("cosine", alpha=-2.0, uses_terms=True, centre_queries=True, centre_corpus=True,
                     normalize=True),
    "pearson": Metric("pearson", alpha=-2.0, uses_terms=True, centre_queries=True, centre_corpus=True,
                      normalize=True, centre_rows=True),
    "inner_product": Metric("inner_product", alpha=-1.0, uses_terms=False, centre_queries=False,
                            centre_corpus=True),
}


def get_metric(name: str) -> Metric:
    """Return the :class:`Metric` called ``name``.

    Raises
    ------
    ValueError
        If ``name`` is not one of :data:`METRICS`; the message names the argument ``metric``.
    """
    if not isinstance(name, str) or name not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {name!r}")
    return METRICS[name]


def _check_power_of_two(value: float) -> None:
    # α must scale exactly; kept as a guard for anyone adding a metric.
    mantissa, _ = math.frexp(abs(value))
    assert mantissa == 0.5, "alpha must be a power of two"


for _metric in METRICS.values():
    _check_power_of_two(_metric.alpha)
