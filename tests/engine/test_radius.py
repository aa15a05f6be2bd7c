"""The threshold radius kernel (``knng.engine.kernels.radius``) against its torch reference, bit for bit.

On a CPU the kernel runs in Triton's interpreter (NumPy float64, one IEEE operation at a time);
the GPU test in ``test_gpu_fused.py`` runs the same cases on the device, launched without fused
multiply-adds. Every metric, every precision, maxima as numbers, 0-dim tensors and one per row,
the store's own rows or rows given per position, τ infinite, negative and huge, offsets far
from the origin.
"""

from __future__ import annotations

import os

import pytest
import torch

import knng
from knng.engine import kernels
from knng.engine import stages
from knng.engine.kernels import radius
from knng.engine.store import CandidateStore, PairErrors
from knng.metrics import METRICS, PRECISIONS, get_metric

pytest.importorskip("triton", reason="the kernel runs in Triton's interpreter")

#: Columns of the cases' corpus (seeds gather their norms and terms by global id).
N_COLS = 5000


def radius_cases(device: torch.device, seed: int = 0):
    """(errors, rows, tau, maxima, row norms/terms or None) for every metric and precision."""
    gen = torch.Generator().manual_seed(seed)
    n, m, d = 3000, 1500, 96

    def vec(size, scale=1.0):
        return (torch.rand(size, generator=gen, dtype=torch.float64) * scale).to(device)

    for name in METRICS:
        metric = get_metric(name)
        for precision in PRECISIONS.values():
            offsets = (torch.randn(n, generator=gen, dtype=torch.float64) * 1e6).to(device)
            errors = PairErrors(metric=metric, d=d, precision=precision, row_norms=vec(n, 30.0),
                                row_terms=vec(n, 900.0) - 450.0 if metric.uses_terms else None, row_offsets=offsets,
                                col_norms=vec(N_COLS, 35.0), col_terms=vec(N_COLS, 1000.0) if metric.uses_terms else None,
                                centre_norm=12.5)
            rows = torch.randperm(n, generator=gen)[:m].to(device)
            tau = (torch.randn(n, generator=gen, dtype=torch.float64) * 100.0).to(device)
            tau[::7] = torch.inf
            tau[3::11] = -1e12
            maxima = [(31.5, 800.0), (torch.tensor(17.25, dtype=torch.float64, device=device),
                                      torch.tensor(3.0, dtype=torch.float64, device=device)),
                      (vec(m, 40.0), vec(m, 600.0))]
            own = [None, (vec(m, 25.0), vec(m, 500.0) - 250.0 if metric.uses_terms else None)]
            for max_norm, max_term in maxima:
                for given in own:
                    yield f"{name}-{precision.name}", errors, rows, tau, max_norm, max_term, given


def reference(errors: PairErrors, rows, tau, max_norm, max_term, given, add_tau: bool) -> torch.Tensor:
    """The torch steps of ``PairErrors.block_err`` (plus τ)."""
    t = tau[rows] if add_tau else tau[: rows.numel()]
    if given is None:
        norms = errors.row_norms[rows]
        terms = None if errors.row_terms is None else errors.row_terms[rows]
    else:
        norms, terms = given
    rad = errors._block_err_reference(rows, t, max_norm, max_term, norms, terms)
    return t + rad if add_tau else rad


def kernel(errors: PairErrors, rows, tau, max_norm, max_term, given, add_tau: bool) -> torch.Tensor:
    if add_tau:
        return errors.block_thresholds(rows, tau, max_norm, max_term, *(given or (None, None)))
    return errors.block_err(rows, tau[: rows.numel()], max_norm, max_term, *(given or (None, None)))


def assert_kernel_is_reference(device: torch.device) -> int:
    """Every case's kernel values equal the reference's, bit for bit; returns the cases run."""
    cases = 0
    for label, errors, rows, tau, max_norm, max_term, given in radius_cases(device):
        assert radius.radius_runs(tau, errors.row_norms, errors.row_offsets)
        for add_tau in (False, True):
            want = reference(errors, rows, tau, max_norm, max_term, given, add_tau)
            got = kernel(errors, rows, tau, max_norm, max_term, given, add_tau)
            assert got.dtype == torch.float64 and got.shape == want.shape, label
            same = (got == want) | (torch.isinf(got) & torch.isinf(want) & (got.sign() == want.sign()))
            assert bool(same.all()), (label, add_tau, (got - want).abs().max().item())
            cases += 1
    return cases


def assert_tightening_is_reference(device: torch.device) -> int:
    """``CandidateStore.tighten`` through its kernel and through torch: the same thresholds and
    the same count of rows tightened, bit for bit (rows with fewer than k survivors, with none,
    with ties, negative and huge keys; every metric and precision)."""
    cases = 0
    gen = torch.Generator().manual_seed(5)
    # In the interpreter the row kernels cost per row; test_row_kth.py tests them.
    with knng.options(kernels={"row_kth": False} if kernels.interpreting() else {}):
        for label, errors, rows, tau, max_norm, max_term, given in radius_cases(device):
            if isinstance(max_norm, torch.Tensor) or given is not None:
                continue
            n, k = errors.row_norms.numel(), 7
            owner = torch.randint(0, n // 2, (40_000,), generator=gen).to(device)  # rows past n/2 get none
            keys = (torch.randn(40_000, generator=gen) * 50.0).to(torch.float32).to(device)
            keys[::13] = keys[0]  # ties
            keys[5::17] = -3e30
            results = []
            for use_kernel in (True, False):
                store = CandidateStore(n, k, 2 * k, errors, lambda r, c: None, device)
                store.tau.copy_(tau)
                with knng.options(kernels={} if use_kernel else {"radius": False}), stages.recording() as calls:
                    store.tighten(owner, keys, max_norm, max_term)
                assert calls["radius.tighten_rows"] == use_kernel, "the kernel did not run"
                results.append((store.tau.clone(), int(store._tile_tightenings)))
            (tau_k, count_k), (tau_r, count_r) = results
            assert count_k == count_r > 0, label
            assert torch.equal(tau_k, tau_r), (label, (tau_k - tau_r).abs().max().item())
            assert bool((tau_k < tau).any()), label
            cases += 1
    return cases


def assert_seeding_is_reference(device: torch.device) -> int:
    """``CandidateStore.seed`` through its kernel and through torch: the same thresholds, bit for
    bit (seeds with −1 columns, keys negative and huge, every metric and precision)."""
    cases = 0
    gen = torch.Generator().manual_seed(9)
    for label, errors, rows, tau, max_norm, max_term, given in radius_cases(device):
        if isinstance(max_norm, torch.Tensor) or given is not None:  # one case per metric and precision
            continue
        n, k = errors.row_norms.numel(), 5
        width = 9 if cases % 2 else 300  # one step of the kernel's seeds, and several with a ragged last
        cols = torch.randint(0, N_COLS, (rows.numel(), width), generator=gen).to(device)
        cols[::5, 3] = -1
        keys = (torch.randn((rows.numel(), width), generator=gen) * 40.0).to(torch.float32).to(device)
        keys[::7, 0] = -2e30
        keys[1::7, width - 1] = 3e30  # the largest in the last, ragged step
        results = []
        for use_kernel in (True, False):
            store = CandidateStore(n, k, 2 * k, errors, lambda r, c: None, device)
            store.tau.copy_(tau)
            off = {} if use_kernel else {"radius": False, "pair_radius": False}
            with knng.options(kernels=off), stages.recording() as calls:
                store.seed(rows, cols, keys)
            assert calls["radius.seed_rows"] == use_kernel, "the kernel did not run"
            results.append(store.tau.clone())
        assert torch.equal(results[0], results[1]), (label, (results[0] - results[1]).abs().max().item())
        assert bool((results[0] < tau).any()), label
        cases += 1
    return cases


def assert_pair_radius_is_reference(device: torch.device) -> int:
    """``PairErrors.err`` and ``PairErrors.radius`` through the pair radius kernel against
    :meth:`PairErrors.radius_reference`, bit for bit: the store's norms gathered, norms given per
    pair (with and without terms), flat and (rows, seeds) shapes, float32 and float64 keys,
    infinite, NaN, negative and huge keys, every metric and precision."""
    cases = 0
    gen = torch.Generator().manual_seed(13)
    for label, errors, rows, tau, max_norm, max_term, given in radius_cases(device):
        if isinstance(max_norm, torch.Tensor) or given is not None:  # one case per metric and precision
            continue
        n, p = errors.row_norms.numel(), 7_001  # not a multiple of the kernel's block
        pair_rows = torch.randint(0, n, (p,), generator=gen).to(device)
        cols = torch.randint(0, N_COLS, (p,), generator=gen).to(device)
        keys = (torch.randn(p, generator=gen, dtype=torch.float64) * 300.0).to(device)
        keys[::9] = torch.inf
        keys[1::9] = -torch.inf
        keys[2::9] = torch.nan
        keys[3::9] = -3e300
        keys[4::9] = 2e290
        for key_type in (torch.float64, torch.float32):
            k = keys.to(key_type)
            want = errors.radius_reference(*errors.norms_of(pair_rows, cols), k, pair_rows)
            got = errors.err(pair_rows, cols, k)
            assert got.dtype == torch.float64 and got.shape == want.shape, label
            assert torch.equal(got, want), (label, key_type, (got - want).abs().max().item())
            a, b = errors.row_norms[pair_rows] * 1.5, errors.col_norms[cols] * 0.75
            terms = [(None, None)]
            if errors.row_terms is not None:
                terms += [(errors.row_terms[pair_rows] - 1.0, errors.col_terms[cols] + 2.0),
                          (None, errors.col_terms[cols])]
            for at, bt in terms:
                want = errors.radius_reference(a, b, at, bt, k, pair_rows)
                got = errors.radius(a, b, at, bt, k, pair_rows)
                assert torch.equal(got, want), (label, key_type, at is None, (got - want).abs().max().item())
            # (rows, seeds) shapes, the rows broadcast along each row's seeds (as a seed's radii).
            grid_rows = pair_rows[:500, None].expand(500, 14)
            grid_cols, grid_keys = cols[:7000].view(500, 14), k[:7000].view(500, 14)
            want = errors.radius_reference(*errors.norms_of(grid_rows, grid_cols), grid_keys, grid_rows)
            assert torch.equal(errors.err(grid_rows, grid_cols, grid_keys), want), label
            # One row's seeds: its row broadcast along them flattens to a view of stride 0 (a
            # store of one row; the kernel must not read past that row's one value).
            one_row = pair_rows[:1, None].expand(1, 60)
            one_cols, one_keys = cols[:60].view(1, 60), k[:60].view(1, 60)
            want = errors.radius_reference(*errors.norms_of(one_row, one_cols), one_keys, one_row)
            assert torch.equal(errors.err(one_row, one_cols, one_keys), want), label
            cases += 1
    return cases


@pytest.mark.slow
def test_pair_radius_kernel_is_its_reference(set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    with stages.recording() as calls:
        assert assert_pair_radius_is_reference(torch.device("cpu")) > 20
    assert calls["radius.pair_kernel"] > 100, "the kernel did not run"


def test_pair_radius_is_the_reference_without_the_kernel(set_options):
    """Without the kernel (a CPU, no Triton) the radii are the torch reference's."""
    set_options(kernels={"triton": False})
    assert assert_pair_radius_is_reference(torch.device("cpu")) > 20


def test_radius_kernel_is_its_reference(set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert assert_kernel_is_reference(torch.device("cpu")) > 100


def test_tightening_kernel_is_its_reference(set_options):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    set_options(kernels={"triton": True})
    assert assert_tightening_is_reference(torch.device("cpu")) > 20
    assert assert_seeding_is_reference(torch.device("cpu")) > 20


def test_reference_where_the_kernel_does_not_run(set_options):
    """Without the kernel (a CPU, no Triton) block_err is the torch reference."""
    set_options(kernels={"triton": False})
    for label, errors, rows, tau, max_norm, max_term, given in radius_cases(torch.device("cpu")):
        for add_tau in (False, True):
            assert torch.equal(kernel(errors, rows, tau, max_norm, max_term, given, add_tau),
                               reference(errors, rows, tau, max_norm, max_term, given, add_tau)), label
        break


def test_one_maximum_per_row_must_match_the_rows(set_options):
    set_options(kernels={"triton": True})
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs the interpreter")
    label, errors, rows, tau, *_ = next(radius_cases(torch.device("cpu")))
    with pytest.raises(ValueError, match="one value per row|per row"):
        errors.block_err(rows, tau[: rows.numel()], torch.ones(rows.numel() + 1, dtype=torch.float64), 0.0)


@pytest.mark.parametrize("metric_name", ["euclidean", "cosine", "inner_product"])
def test_a_store_merged_from_one_row_packs_has_the_reference_radii(metric_name, set_options):
    """The distributed graph's merge (``CandidateStore.from_packs``) of a rank's one-row slice:
    its radii through the pair radius kernel equal the torch reference's. The row broadcast
    along its entries once reached the kernel as a view of stride 0, read past its one value
    (an illegal address on two GPUs)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is chosen at start only without a GPU (test_gpu_fused.py runs there)")
    gen = torch.Generator().manual_seed(5)
    metric, n_cols, width = get_metric(metric_name), 50, 12

    def vec(size, scale):
        return torch.rand(size, generator=gen, dtype=torch.float64) * scale

    errors = PairErrors(metric=metric, d=16, precision=PRECISIONS["float16"], row_norms=vec(1, 3.0),
                        row_terms=vec(1, 9.0) if metric.uses_terms else None, row_offsets=vec(1, 1e3),
                        col_norms=vec(n_cols, 3.0), col_terms=vec(n_cols, 9.0) if metric.uses_terms else None,
                        centre_norm=2.0)
    packs = []
    for _ in range(2):  # two ranks' packs of the same row
        keys = torch.randn((1, width), generator=gen, dtype=torch.float64) * 5.0
        idx = torch.randint(0, n_cols, (1, width), generator=gen).to(torch.float64)
        idx[0, -2:] = -1  # empty entries
        dist = torch.full((1, width), torch.nan, dtype=torch.float64)
        dist[0, 0] = 0.75  # an entry already evaluated exactly
        packs.append(torch.cat([keys, idx, dist, torch.full((1, 1), 4.0, dtype=torch.float64)], dim=1))

    def evaluate(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a merge evaluates nothing")

    set_options(kernels={"triton": True})
    with stages.recording() as calls:
        got = CandidateStore.from_packs(packs, 3, errors, evaluate, torch.device("cpu")).rad
    assert calls["radius.pair_kernel"], "the kernel did not run"
    set_options(kernels={"triton": False})
    want = CandidateStore.from_packs(packs, 3, errors, evaluate, torch.device("cpu")).rad
    assert got.shape == (1, 2 * width) and torch.equal(got, want)
