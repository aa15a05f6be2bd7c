"""The preparation kernels (the corpus pass and scaled float16 rows) against their references.

Their contract (``knng.engine.kernels.preparation``): the float16 rows, scales and α of
:meth:`Metric.prepare` bit for bit, its norms, terms and offsets to the last bits of float64
(sums in another order), and the corpus pass's float64 column sums and non-finite count. On a
CPU they run in Triton's interpreter (``TRITON_INTERPRET=1``, chosen by conftest.py); on a GPU
(``pytest -m gpu``) the compiled kernels run the same checks.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import knng
from knng._inputs import as_input
from knng.api import last_report
from knng.engine import common
from knng.engine.kernels import preparation
from knng.metrics import get_metric, scaled_alphas, scaled_scales
from oracle import assert_exact, oracle_search, smooth_image_patches

pytest.importorskip("triton", reason="the kernels run in Triton's interpreter off a GPU")


@pytest.fixture
def device(kernel_device) -> torch.device:
    return kernel_device


def _inputs(rng: np.random.Generator, kind: str, m: int, d: int) -> np.ndarray:
    """Inputs that stress one step: offsets far from zero, flat rows, tiny and huge values."""
    x = rng.standard_normal((m, d))
    if kind == "offset":  # a large common offset: the shift rounds, the scale follows the rest
        x = x + 3e5
    elif kind == "flat":  # image-like: duplicate and constant rows, exact zeros
        x[: m // 3] = 7.25
        x[m // 3: m // 2] = 0.0
        x[m // 2: m // 2 + 3] = x[:3]
    elif kind == "tiny":  # scales at the clamp 2⁻¹²⁵ and float16 subnormals
        x = x * 1e-39
        x[::3, 0] = 1e-30
    elif kind == "wide":  # values spanning many binades in one row (float16 underflows some)
        x = x * np.exp2(rng.integers(-30, 30, size=(m, d)))
    return x


def _assert_prepared_alike(got, want):
    assert got.vectors.shape == want.vectors.shape and got.vectors.dtype == want.vectors.dtype
    assert torch.equal(got.vectors.view(torch.int16), want.vectors.view(torch.int16)), "float16 rows differ"
    torch.testing.assert_close(got.norms, want.norms, rtol=1e-14, atol=0.0)
    for mine, theirs in ((got.terms, want.terms), (got.offsets, want.offsets)):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            torch.testing.assert_close(mine, theirs, rtol=1e-13, atol=1e-300)


@pytest.mark.parametrize("kind", ["gaussian", "offset", "flat", "tiny", "wide"])
@pytest.mark.parametrize("m,d", [(37, 11), (64, 128), (5, 130), (1, 1), (0, 9)])
@pytest.mark.parametrize("metric_name,side,symmetric", [
    ("euclidean", "corpus", False), ("euclidean", "query", False), ("sqeuclidean", "query", True),
    ("inner_product", "corpus", False), ("inner_product", "query", False),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaled_rows_match_the_reference(device, rng, kind, m, d, metric_name, side, symmetric, dtype):
    metric = get_metric(metric_name)
    raw = torch.from_numpy(_inputs(rng, kind, m, d)).to(device=device, dtype=dtype)
    centre = raw.to(torch.float64).mean(dim=0) if m else torch.zeros(d, dtype=torch.float64, device=device)
    for mu in (centre, None):
        got = preparation.prepare_rows(metric, raw, mu, side=side, symmetric=symmetric, dtype=torch.float16)
        want = metric.prepare(raw, mu, side=side, symmetric=symmetric, dtype=torch.float16)
        _assert_prepared_alike(got, want)
        assert torch.equal(scaled_scales(got.vectors), scaled_scales(want.vectors))
        assert torch.equal(scaled_alphas(got.vectors), scaled_alphas(want.vectors))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.uint8])
def test_scaled_rows_from_narrow_inputs(device, rng, dtype):
    """Image bytes and half-precision inputs convert to float64 exactly, as in the reference."""
    metric = get_metric("euclidean")
    raw = torch.from_numpy(rng.integers(0, 256, size=(45, 70))).to(device=device, dtype=dtype)
    centre = raw.to(torch.float64).mean(dim=0)
    got = preparation.prepare_rows(metric, raw, centre, side="corpus", symmetric=True, dtype=torch.float16)
    _assert_prepared_alike(got, metric.prepare(raw, centre, side="corpus", symmetric=True, dtype=torch.float16))


def test_non_contiguous_rows(device, rng):
    metric = get_metric("euclidean")
    raw = torch.from_numpy(rng.standard_normal((40, 60))).to(device)[:, ::2]
    got = preparation.prepare_rows(metric, raw, None, side="corpus", symmetric=False, dtype=torch.float16)
    _assert_prepared_alike(got, metric.prepare(raw, None, side="corpus", symmetric=False, dtype=torch.float16))


@pytest.mark.parametrize("metric_name,dtype", [("cosine", torch.float16), ("euclidean", torch.float32),
                                               ("pearson", torch.float16)])
def test_other_layouts_take_the_reference(device, rng, metric_name, dtype):
    metric = get_metric(metric_name)
    raw = torch.from_numpy(rng.standard_normal((20, 9))).to(device)
    got = preparation.prepare_rows(metric, raw, None, side="query", symmetric=False, dtype=dtype)
    want = metric.prepare(raw, None, side="query", symmetric=False, dtype=dtype)
    assert torch.equal(got.vectors, want.vectors) and torch.equal(got.norms, want.norms)


@pytest.mark.parametrize("m,d", [(1, 1), (100, 7), (300, 33), (0, 5)])
def test_column_sums(device, rng, m, d):
    x = rng.standard_normal((m, d)) * 10.0 ** rng.integers(-3, 4, size=(m, d))
    sums, nonfinite = preparation.column_sums(torch.from_numpy(x).to(device=device, dtype=torch.float32))
    want = x.astype(np.float32).astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(sums.cpu().numpy(), want, rtol=1e-12, atol=1e-12)
    assert int(nonfinite) == 0


def test_column_sums_count_nan_and_inf(device):
    x = torch.zeros((200, 6), device=device)
    x[3, 1], x[150, 5], x[199, 0] = torch.nan, torch.inf, -torch.inf
    sums, nonfinite = preparation.column_sums(x)
    assert int(nonfinite) == 3
    assert torch.isfinite(sums).all()


def test_corpus_pass_names_the_first_bad_row(device):
    x = torch.ones((500, 4), device=device)
    x[321, 2] = torch.nan
    with pytest.raises(ValueError, match=r"data contains NaN or Inf \(first in row 321\)"):
        common.corpus_stats(as_input(x, "data"), get_metric("euclidean"), device, symmetric=True,
                            block_rows=128)


def test_search_prepared_by_the_kernels(device, rng, set_options):
    """A float16 search whose corpus and queries the kernels prepared (screened by the
    interpreted Triton kernel, or on a GPU by the CUDA one) is exact; far from the origin, with ties."""

    set_options(screen_precision="float16")
    c = smooth_image_patches(rng, 300, side=4).astype(np.float32) + 1000.0
    c[200:220] = c[:20]
    q = c[::7] + rng.standard_normal((len(c[::7]), 16)).astype(np.float32)
    data = (torch.from_numpy(q).to(device), torch.from_numpy(c).to(device))
    got = knng.search(*data, 9, device=device, memory_budget="4MB")
    assert last_report().stages.get("prepare.kernel", 0) > 0 and last_report().screen_dtype == "float16"
    assert_exact(got, oracle_search(q, c, 9))


@pytest.mark.parametrize("dtype,bits", [(torch.float16, torch.int16), (torch.float32, torch.int32)])
@pytest.mark.parametrize("metric_name", ["euclidean", "cosine", "inner_product"])
def test_resident_corpus_prepared_in_blocks_equals_one_block(device, rng, dtype, bits, metric_name):
    """A resident corpus prepared block by block into its one buffer (the kernels writing their
    slice, or the metric's own preparation copied in) holds the rows, norms and terms of one
    block's preparation, bit for bit; its rows are not a multiple of the block."""
    x = torch.from_numpy(_inputs(rng, "offset", 203, 21).astype(np.float32)).to(device)
    x[100:140] = x[0]  # flat rows across a block boundary
    metric = get_metric(metric_name)
    centre = x.double().mean(dim=0)
    kw = dict(resident=True, symmetric=False, dtype=dtype)
    one = common.PreparedCorpus(as_input(x, "corpus"), metric, centre, device, block_rows=1024, **kw)
    blocks = common.PreparedCorpus(as_input(x, "corpus"), metric, centre, device, block_rows=64, **kw)
    assert blocks.resident.shape == one.resident.shape and blocks.resident.dtype == dtype
    assert torch.equal(blocks.resident.view(bits), one.resident.view(bits))
    assert torch.equal(blocks.norms, one.norms)
    assert (blocks.terms is None) == (one.terms is None)
    if one.terms is not None:
        assert torch.equal(blocks.terms, one.terms)


def test_prepare_refuses_an_output_of_another_shape(device, rng):
    x = torch.from_numpy(rng.standard_normal((9, 5)).astype(np.float32)).to(device)
    metric = get_metric("euclidean")
    wrong = torch.empty((9, 3), dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="out must be"):
        preparation.prepare_rows(metric, x, None, side="corpus", symmetric=False, dtype=torch.float16, out=wrong)
