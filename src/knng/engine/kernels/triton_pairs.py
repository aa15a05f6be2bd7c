"""The Triton kernel of exact pair values (:mod:`knng.engine.kernels.pairs`).

Imported only where Triton is installed, by this topic's launchers; module-level functions, because a
``triton.jit`` function finds the jitted helpers it calls among its module's globals. Triton reads
``TRITON_INTERPRET`` when this module is imported.
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["P"])  # sizes of the data: see knng.engine.kernels
def pair_squares_kernel(x, rows, y, cols, out, P, d, stride_x, stride_y, BLOCK_P: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """out[p] = Σ (x[rows[p]] − y[cols[p]])² in float64, by differences (both rows converted to
    float64 exactly first, as ``Metric.exact`` does): the exact evaluation of pairs without the
    gathered float64 copies of their rows."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    ok = p < P
    r = tl.load(rows + p, mask=ok, other=0).to(tl.int64)
    c = tl.load(cols + p, mask=ok, other=0).to(tl.int64)
    acc = tl.zeros((BLOCK_P,), dtype=tl.float64)
    for d0 in range(0, d, BLOCK_D):
        dims = d0 + tl.arange(0, BLOCK_D)
        m = ok[:, None] & (dims < d)[None, :]
        a = tl.load(x + r[:, None] * stride_x + dims[None, :], mask=m, other=0).to(tl.float64)
        b = tl.load(y + c[:, None] * stride_y + dims[None, :], mask=m, other=0).to(tl.float64)
        diff = a - b
        acc += tl.sum(diff * diff, axis=1)
    tl.store(out + p, acc, mask=ok)
