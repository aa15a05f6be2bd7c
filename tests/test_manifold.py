"""knng.manifold (DiffusionMap), ``knng embed`` and ``knng demo --embed``.

The reference is written here, independently of the module: a dense float64 kernel matrix built
from the graph's own distances (union of the k-NN relations, the diagonal, exp(−s/ε) or the
self-tuning form), its α normalisation and symmetric conjugate, ``numpy.linalg.eigh``, and the
eigenvectors of P as ψ = v/√π with the largest-magnitude entry positive.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.utils.estimator_checks import parametrize_with_checks

import knng
from knng import manifold
from knng.cli import main
from knng.manifold import DiffusionMap

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

RTOL = 1e-8


# ------------------------------------------------------------------------------------------
# the reference
# ------------------------------------------------------------------------------------------


def dense_reference(graph: knng.Graph, *, epsilon: float | None, alpha: float, m: int,
                    sigma_neighbor: int | None = None, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (m + 1, the trivial first) and ψ (n, m + 1) of P, densely, from the graph's
    first ``width`` columns (all by default)."""
    idx = np.asarray(graph.indices)[:, :width]
    dist = np.asarray(graph.distances, dtype=np.float64)[:, :width]
    n, k = idx.shape
    sq = dist * dist if graph.metric == "euclidean" else 2.0 * dist  # cosine: squared chord
    s = np.full((n, n), np.inf)
    rows = np.repeat(np.arange(n), k)
    s[rows, idx.ravel()] = sq.ravel()
    s = np.minimum(s, s.T)  # union of the relations
    np.fill_diagonal(s, 0.0)
    if sigma_neighbor is None:
        kernel = np.exp(-s / epsilon)
    else:
        sigma = np.sqrt(sq[:, sigma_neighbor - 1])
        kernel = np.exp(-s / np.outer(sigma, sigma))
    q = kernel.sum(axis=1)
    weighted = kernel / np.outer(q, q) ** alpha
    d = weighted.sum(axis=1)
    conjugate = weighted / np.sqrt(np.outer(d, d))
    values, vectors = np.linalg.eigh(conjugate)
    values, vectors = values[::-1][: m + 1], vectors[:, ::-1][:, : m + 1]
    psi = vectors / np.sqrt(d / d.sum())[:, None]
    top = np.argmax(np.abs(psi), axis=0)
    psi *= np.sign(psi[top, np.arange(m + 1)])
    return values, psi


def blob(rng: np.random.Generator, n: int = 240, d: int = 3) -> np.ndarray:
    """Uniform points in a box of unequal sides: no outliers (a connected graph whose spectral gaps
    stay wide: at least 3e-4 over 120 fits of 240 points) and no symmetric pair of directions (no
    repeated eigenvalues, so eigenvectors can be compared one by one)."""
    return rng.uniform(size=(n, d)) * np.r_[1.0, 0.62, np.full(d - 2, 0.15)]


def connected_blob(rng: np.random.Generator, n: int, d: int, k: int) -> np.ndarray:
    """:func:`blob` redrawn until its k-NN graph is one component (a few draws in a hundred of
    120 points at k = 5 are not: a handful of points can have all their neighbours among
    themselves)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    while True:
        x = blob(rng, n, d)
        sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
        np.fill_diagonal(sq, np.inf)
        nearest = np.argsort(sq, axis=1)[:, :k]
        edges = coo_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), nearest.ravel())), shape=(n, n))
        if connected_components(edges, directed=False)[0] == 1:
            return x


def assert_close_relative(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL, what: str = "") -> None:
    scale = np.abs(expected).max()
    err = np.abs(actual - expected).max()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol:g} × {scale:.3g}"


# ------------------------------------------------------------------------------------------
# against the dense float64 reference
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("solver", ["scipy", "torch"])
@pytest.mark.parametrize("epsilon, alpha", [(0.05, 1.0), ("auto", 0.5), ("self_tuning", 0.0), ("auto", 1.0)])
def test_equals_dense_reference(solver, epsilon, alpha, rng, seed) -> None:
    m = 4
    # Eigenvectors are determined to about residual / gap: the gaps (the one after ψ_m too) must
    # be wide for a 1e-8 comparison to mean anything. A blob's are, mostly (one seed in a few
    # hundred gave 3.5e-5): a narrow one draws the next blob from the same generator.
    for _ in range(5):
        x = blob(rng)
        dm = DiffusionMap(n_components=m, n_neighbors=8, epsilon=epsilon, alpha=alpha, t=2, eigen_solver=solver,
                          eigen_tol=1e-13, device="cpu").fit(x)
        gaps = np.abs(np.diff(dm.report_.eigenvalues))
        if gaps.min() > 1e-4:
            break
    assert gaps.min() > 1e-4, f"seed {seed}: near-degenerate spectra ({gaps.min():.2g}), the test needs wide gaps"
    values, psi = dense_reference(dm.graph_, epsilon=dm.epsilon_, alpha=alpha, m=m, width=dm.kernel_neighbors_,
                                  sigma_neighbor=7 if epsilon == "self_tuning" else None)
    assert_close_relative(dm.eigenvalues_, values[1:], what="eigenvalues")
    assert_close_relative(np.array(dm.report_.eigenvalues[: m + 1]), values, what="eigenvalues with λ₀")
    assert_close_relative(dm.eigenvectors_, psi[:, 1:], what=f"eigenvectors (seed {seed})")
    assert_close_relative(dm.embedding_, psi[:, 1:] * values[1:] ** 2, what="embedding = λᵗ ψ")
    report = dm.report_
    assert report.trivial_eigenvalue_error < 1e-12 and report.trivial_vector_error < 1e-8
    assert max(report.residuals) <= 1e-12
    assert report.spectral_gap == pytest.approx(1 - values[1], abs=1e-12)
    assert report.eigengap == pytest.approx(report.eigenvalues[m] - report.eigenvalues[m + 1])


def test_cosine_kernel_uses_the_squared_chord(rng) -> None:
    x = blob(rng, 200, 6) + 3.0
    dm = DiffusionMap(n_components=3, n_neighbors=10, metric="cosine", epsilon=1e-3, eigen_tol=1e-13,
                      device="cpu").fit(x)
    values, psi = dense_reference(dm.graph_, epsilon=1e-3, alpha=1.0, m=3, width=dm.kernel_neighbors_)
    assert_close_relative(dm.eigenvalues_, values[1:])
    assert_close_relative(dm.eigenvectors_, psi[:, 1:])


def test_dense_path_for_tiny_sets(rng) -> None:
    # 20 points: the Krylov basis would span the space, so both solvers solve densely.
    x = blob(rng, 20, 3)
    a = DiffusionMap(n_components=3, n_neighbors=19, epsilon=0.1, device="cpu", eigen_solver="scipy").fit(x)
    b = DiffusionMap(n_components=3, n_neighbors=19, epsilon=0.1, device="cpu", eigen_solver="torch").fit(x)
    values, psi = dense_reference(a.graph_, epsilon=0.1, alpha=1.0, m=3, width=a.kernel_neighbors_)
    assert "dense" in a.report_.solver and "dense" in b.report_.solver
    assert_close_relative(a.embedding_, psi[:, 1:] * values[1:])
    assert_close_relative(b.embedding_, a.embedding_)


def test_bgh_epsilon_maximises_the_log_log_slope(rng) -> None:
    x = blob(rng, 300, 3)
    # A kernel_tol no row reaches keeps the kernel on the 10-NN union the criterion is computed over.
    dm = DiffusionMap(n_neighbors=10, epsilon="bgh", kernel_tol=1e-300, device="cpu").fit(x)
    d = np.asarray(dm.graph_.distances, dtype=np.float64)[:, :10]
    s = np.full((300, 300), np.inf)
    s[np.repeat(np.arange(300), 10), np.asarray(dm.graph_.indices)[:, :10].ravel()] = (d * d).ravel()
    s = np.minimum(s, s.T)
    off = s[np.isfinite(s)]
    log_eps = np.linspace(np.log(off.min()) - 1, np.log(off.max()) + 1, 4000)
    total = np.array([300 + np.exp(-off / np.exp(e)).sum() for e in log_eps])
    slope = np.gradient(np.log(total), log_eps)
    best = np.exp(log_eps[np.argmax(slope)])
    # The module searches a grid of 2^(1/4) steps and refines by a parabola.
    assert abs(np.log2(dm.epsilon_ / best)) < 0.25
    assert dm.report_.dimension_estimate == pytest.approx(2 * slope.max(), rel=0.02)


# ------------------------------------------------------------------------------------------
# the two eigensolvers
# ------------------------------------------------------------------------------------------


def test_torch_solver_on_cpu_equals_scipy(rng) -> None:
    x = blob(rng, 400, 5)
    g = knng.graph(x, 10, device="cpu")
    kernel = manifold.diffusion_kernel(g, epsilon="auto", device="cpu")
    a = manifold.solve_eigenproblem(kernel, 6, solver="scipy", tol=1e-13)
    b = manifold.solve_eigenproblem(kernel, 6, solver="torch", tol=1e-13)
    assert "ARPACK" in a.solver and "Lanczos" in b.solver and b.restarts >= 1
    np.testing.assert_allclose(b.values, a.values, rtol=0, atol=1e-12)
    va = manifold.fix_signs(a.vectors)
    vb = manifold.fix_signs(b.vectors.numpy())
    assert_close_relative(vb, va, what="eigenvectors")
    assert max(b.residuals) <= 1e-12


def test_lanczos_on_a_dense_operator_with_an_invariant_start(rng) -> None:
    # A block-diagonal matrix and a start vector inside one block: the Krylov space closes after
    # a few steps and the solver must go on from a fresh direction to find the other block.
    n = 120
    a = rng.standard_normal((n, n))
    a = (a + a.T) / 2
    a[:60, 60:] = a[60:, :60] = 0.0
    matrix = torch.from_numpy(a)
    v0 = torch.zeros(n, dtype=torch.float64)
    v0[:3] = 1.0
    closed = torch.from_numpy(np.diag(np.r_[np.arange(5.0), np.zeros(n - 5)]))
    values, vectors, _, _, converged = manifold.lanczos_eigsh(lambda v: closed @ v, v0, 3, ncv=12)
    assert converged
    np.testing.assert_allclose(values.numpy(), [4.0, 3.0, 2.0], atol=1e-10)
    values, vectors, _, _, converged = manifold.lanczos_eigsh(lambda v: matrix @ v, torch.from_numpy(
        rng.standard_normal(n)), 5, tol=1e-12)
    assert converged
    np.testing.assert_allclose(values.numpy(), np.linalg.eigvalsh(a)[::-1][:5], atol=1e-10)
    residual = (matrix @ vectors - vectors * values).norm(dim=0)
    assert float(residual.max()) < 1e-10


def test_signs_are_deterministic(rng) -> None:
    x = blob(rng)
    a = DiffusionMap(n_components=3, n_neighbors=8, device="cpu").fit(x)
    b = DiffusionMap(n_components=3, n_neighbors=8, device="cpu", eigen_solver="torch").fit(x)
    for psi in (a.eigenvectors_, b.eigenvectors_):
        top = np.argmax(np.abs(psi), axis=0)
        assert np.all(psi[top, np.arange(3)] > 0)
    np.testing.assert_allclose(b.embedding_, a.embedding_, atol=1e-7 * np.abs(a.embedding_).max())


# ------------------------------------------------------------------------------------------
# what the embedding recovers (the demo's data)
# ------------------------------------------------------------------------------------------


def test_rotation_comes_out_as_a_circle_whose_angle_is_the_rotation(tmp_path) -> None:
    pytest.importorskip("skimage")
    from knng.demo_embed import circular_correlation, rotation_snapshots

    x, angles = rotation_snapshots(600, seed=1)
    e = DiffusionMap(n_components=2, n_neighbors=20, device="cpu").fit_transform(x)
    rho = circular_correlation(angles, np.arctan2(e[:, 1], e[:, 0]))
    assert abs(rho) >= 0.99, rho


def test_circular_correlation() -> None:
    from knng.demo_embed import circular_correlation

    a = np.linspace(0, 2 * np.pi, 50, endpoint=False)
    assert circular_correlation(a, a + 1.0) == pytest.approx(1.0)
    assert circular_correlation(a, -a + 2.0) == pytest.approx(-1.0)
    assert abs(circular_correlation(a, np.random.default_rng(0).uniform(0, 2 * np.pi, 50))) < 0.5


def test_swiss_roll_unrolls(seed) -> None:
    from knng.demo_embed import swiss_roll

    x, t = swiss_roll(1500, seed=seed % 2**31)
    e = DiffusionMap(n_components=2, n_neighbors=15, device="cpu").fit_transform(x)
    rho = spearmanr(e[:, 0], t).statistic
    assert abs(rho) >= 0.99, f"seed {seed}: Spearman {rho}"


def test_demo(tmp_path, capsys) -> None:
    pytest.importorskip("skimage")
    from knng.demo_embed import run_embed_demo

    lines: list[str] = []
    result = run_embed_demo(tmp_path, device="cpu", print=lines.append, n_rotations=400, n_roll=1500)
    assert result["passed"] and [r["name"] for r in result["results"]] == ["rotation", "swiss-roll"]
    assert any("circular correlation" in line for line in lines)
    assert any("Spearman" in line for line in lines)
    if result["plots_skipped"] is None:
        assert (tmp_path / "rotation.png").stat().st_size > 0 and (tmp_path / "swiss-roll.png").exists()
    else:
        assert "pip install matplotlib" in lines[-1]


def test_demo_cli_embed(tmp_path, monkeypatch) -> None:
    import knng.demo_embed

    seen = {}
    monkeypatch.setattr(knng.demo_embed, "run_embed_demo", lambda **kw: seen.update(kw) or {"passed": True})
    assert main(["demo", "--embed", "--device", "cpu", "-o", str(tmp_path)]) == 0
    assert seen == {"out_dir": str(tmp_path), "device": "cpu"}


# ------------------------------------------------------------------------------------------
# issue 58: the default ε, the kernel's width, data it failed on
# ------------------------------------------------------------------------------------------

#: Pictures that no choice of the default was tuned on (cat is chelsea, a tuned one).
HELD_OUT_PICTURES = ("immunohistochemistry", "hubble_deep_field", "retina", "page", "text", "moon", "clock", "coins")


def picture_rotations(name: str, n: int, rng: np.random.Generator, size: int = 48,
                      noise: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """n noisy in-plane rotations of a scikit-image picture (grey = channel mean, the centre
    square at size × size, the inscribed disc): (pixels, angles)."""
    from skimage import data, transform

    image = np.asarray(getattr(data, name)(), dtype=np.float64)
    image = image[..., :3].mean(axis=2) if image.ndim == 3 else image
    image = image / (255.0 if image.max() > 1 else 1.0)
    h, w = image.shape
    side = min(h, w)
    image = transform.resize(image[(h - side) // 2:(h + side) // 2, (w - side) // 2:(w + side) // 2], (size, size),
                             anti_aliasing=True)
    yy, xx = np.mgrid[:size, :size]
    disc = (yy - (size - 1) / 2) ** 2 + (xx - (size - 1) / 2) ** 2 <= (size / 2) ** 2
    degrees = rng.uniform(0.0, 360.0, n)
    x = np.stack([transform.rotate(image, a, order=1)[disc] for a in degrees])
    return (x + rng.normal(0.0, noise, x.shape)).astype(np.float32), np.deg2rad(degrees)


def concentration(truth: np.ndarray, e: np.ndarray) -> float:
    """|mean exp(i(θ̂ ∓ θ))| of the polar angle θ̂ of (e₀, e₁), the better sign."""
    estimate = np.arctan2(e[:, 1], e[:, 0])
    return float(max(abs(np.mean(np.exp(1j * (estimate - truth)))), abs(np.mean(np.exp(1j * (estimate + truth))))))


def _held_out_shortfalls(rng: np.random.Generator) -> list[str]:
    """One draw of test_held_out_rotations_at_any_n_neighbors: what fell short, if anything."""
    from sklearn.manifold import SpectralEmbedding

    name = HELD_OUT_PICTURES[int(rng.integers(len(HELD_OUT_PICTURES)))]
    # 900 rotations, the sampling (sparser sets are the benchmark's: at 500 rotations
    # `saturation` is what keeps hubble_deep_field's first modes apart, docs/MANIFOLD.md §1).
    x, angles = picture_rotations(name, 900, rng)
    k = int(rng.integers(10, 41))
    spectral = concentration(angles, SpectralEmbedding(n_components=2, n_neighbors=k, random_state=0).fit_transform(x))
    short = []
    for params in ({}, {"n_neighbors": k}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                dm = DiffusionMap(n_components=2, device="cpu", **params).fit(x)
            except Warning as warning:
                short.append(f"{name}, {params}: {type(warning).__name__}: {warning}")
                continue
        got = concentration(angles, dm.embedding_)
        if not (got >= 0.99 and got >= spectral - 0.002):
            short.append(f"{name}, {params}: {got:.4f} (SpectralEmbedding {spectral:.4f})")
    return short


def test_held_out_rotations_at_any_n_neighbors(rng) -> None:
    # A picture no default was tuned on, drawn by the seed, at a random n_neighbors in 10–40 and
    # at the defaults: no failure, no warning, the angle recovered as well as SpectralEmbedding
    # recovers it (minus 0.002) and to at least 0.99. Random angles leave, now and then, a gap of
    # ten spacings or more that a narrow kernel barely crosses: about one draw in fifty fell short
    # (text at 17 neighbours 0.9925 against SpectralEmbedding's 0.9959, where the largest gap was
    # 11.6 spacings; clock at 10 neighbours 0.956 against 0.957), which issue 58's bar does not
    # excuse (docs/BENCHMARKS.md, its quality tables). A second, independent draw is taken then:
    # a regression falls short on both.
    pytest.importorskip("skimage")
    first = _held_out_shortfalls(rng)
    if first:
        second = _held_out_shortfalls(rng)
        assert not second, f"two draws fell short: {first}; {second}"


def test_auto_epsilon_is_at_least_what_the_width_reaches(rng) -> None:
    # epsilon="auto" is the larger of the 5th neighbour's 0.97 quantile and the median of
    # (s_iw − s_i1) / EPSILON_REACH over the kernel's widest column w: here squared distances
    # grow with the rank (s_ij = j², plus a per-point offset), so the second is the larger one.
    from knng.manifold import EPSILON_REACH, quantile_epsilon, reach_epsilon

    n, w = 300, 40
    sq = torch.arange(1, w + 1, dtype=torch.float64)[None, :] ** 2 + torch.from_numpy(rng.uniform(0, 1, (n, 1)))
    assert reach_epsilon(sq) == pytest.approx((w * w - 1) / EPSILON_REACH)
    assert quantile_epsilon(sq, 5) < reach_epsilon(sq)
    assert reach_epsilon(sq[:, :1]) == 0.0
    x = rng.standard_normal((n, 3))
    graph = knng.graph(x, w)
    dm = DiffusionMap(n_components=2, device="cpu").fit(graph)
    squares = torch.as_tensor(graph.distances, dtype=torch.float64) ** 2
    assert dm.report_.epsilon == pytest.approx(max(quantile_epsilon(squares, 5), reach_epsilon(squares)))


def test_smooth_pictures_use_the_whole_width(rng) -> None:
    # Rotations of a smooth picture, whose squared distances grow fast with a neighbour's rank:
    # with the quantile alone the kernel fell to e⁻⁹ by its 40th column and the angle came out
    # at 0.9974; with ε reaching the width, above SpectralEmbedding's best setting.
    pytest.importorskip("skimage")
    from sklearn.manifold import SpectralEmbedding

    x, angles = picture_rotations("coffee", 900, rng)
    got = concentration(angles, DiffusionMap(n_components=2, device="cpu").fit(x).embedding_)
    spectral = concentration(angles, SpectralEmbedding(n_components=2, n_neighbors=20, random_state=0).fit_transform(x))
    assert got >= 0.999 and got > spectral, (got, spectral)


@pytest.mark.slow  # 3,000 points: 0.6 s with one torch thread, 8 s with two on a busy 2-core CPU
def test_uneven_torus(rng) -> None:
    # A flat torus in R⁴ sampled 9× more densely on the half θ < π: both angles come out (each
    # from the best pair of the four coordinates), where the old ε fitted the dense half only.
    n = 3000
    theta = np.where(rng.uniform(size=n) < 0.9, rng.uniform(0, np.pi, n), rng.uniform(np.pi, 2 * np.pi, n))
    phi = rng.uniform(0, 2 * np.pi, n)
    x = np.c_[np.cos(theta), np.sin(theta), 0.6 * np.cos(phi), 0.6 * np.sin(phi)]
    e = DiffusionMap(n_components=4, device="cpu").fit_transform(x)
    for truth in (theta, phi):
        best = max(concentration(truth, e[:, [i, j]]) for i in range(4) for j in range(i + 1, 4))
        assert best >= 0.95, best


def test_n_neighbors_decides_how_local_the_kernel_is(rng) -> None:
    # A closed curve that nearly covers a circle twice: the point at θ + π lies 2δ = 0.2 from
    # the point at θ, farther than its 10 nearest along the curve (5 steps of 4π/900 each
    # side) but nearer than its 40th. With 10 neighbours the kernel follows the curve and the
    # leading pair gives θ; with 40 it jumps across and gives 2θ (rotations of a picture
    # nearly symmetric under a half turn behave so: docs/MANIFOLD.md).
    n = 900
    theta = rng.permutation((np.arange(n) + rng.uniform(size=n)) * (2 * np.pi / n))
    x = np.c_[np.cos(2 * theta), np.sin(2 * theta), 0.1 * np.cos(theta), 0.1 * np.sin(theta)]
    local = DiffusionMap(n_neighbors=10, device="cpu").fit(x)
    assert local.graph_.k == 10 and local.kernel_neighbors_ <= 10 and local.n_neighbors_ == 10
    assert concentration(theta, local.embedding_) >= 0.99
    wide = DiffusionMap(device="cpu").fit(x)
    assert wide.graph_.k == manifold.DEFAULT_N_NEIGHBORS == wide.n_neighbors_
    assert concentration(2 * theta, wide.embedding_) >= 0.99


def test_kernel_tol_never_cuts_the_data_into_pieces(rng) -> None:
    # Two rings of 20 points (spacing 1) stacked 4.5 apart: every point's 25-NN reach the other
    # ring (its twin at s = 20.25 is its 9th), but with ε = 1.2 a row's entries fall below
    # kernel_tol at its 7th neighbour (s = 14.4), so the fewest columns kernel_tol allows leave
    # the rings apart. A truncation must not cut the data into pieces: the kernel takes the
    # fewest columns that join them (the twin's 9th or a little later with the noise), one
    # component (joined by entries of ~1e-7, no degenerate spectrum), no warning.
    angles = 2 * np.pi * np.arange(20) / 20
    ring = np.c_[np.cos(angles), np.sin(angles), np.zeros(20)] * (20 / (2 * np.pi))
    x = np.r_[ring, ring + np.array([0, 0, 4.5])] + rng.normal(0, 1e-3, (40, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm = DiffusionMap(n_neighbors=25, epsilon=1.2, device="cpu").fit(x)
    width = dm.kernel_neighbors_
    assert 9 <= width < 25 and dm.report_.components == 1
    assert "ARPACK" in dm.report_.solver  # 40 points: iterative, not the dense solve
    narrower = manifold.diffusion_kernel(dm.graph_, n_neighbors=25, epsilon=1.2)
    assert narrower.width < 9 and manifold.connected_components(narrower)[0] == 2
    one_fewer = manifold.diffusion_kernel(dm.graph_, n_neighbors=width - 1, epsilon=1.2, min_width=width - 1)
    assert manifold.connected_components(one_fewer)[0] == 2  # the fewest that join them


@pytest.mark.parametrize("k", [3, 12, 40, 55])
def test_a_wider_graph_gives_the_kernel_its_first_n_neighbors(k, rng) -> None:
    # fit(graph) with more columns than n_neighbors equals fit(X): the kernel, ε and the width
    # are read from the first n_neighbors columns only; by default from all, up to 40.
    x = blob(rng, int(rng.integers(150, 250)), 3) + rng.normal(0, 0.01, (1, 3))
    graph = knng.graph(x, 60, device="cpu")
    # (saturation=None: fit(X) may stop the kernel's columns where a blob's 55th neighbour is
    # nearly as far as unrelated points, which a Graph alone has no vectors to tell.)
    on_graph = DiffusionMap(n_components=3, n_neighbors=k, device="cpu").fit(graph)
    on_points = DiffusionMap(n_components=3, n_neighbors=k, saturation=None, device="cpu").fit(x)
    assert on_points.graph_.k == k and on_graph.kernel_neighbors_ == on_points.kernel_neighbors_ <= k
    assert on_graph.epsilon_ == on_points.epsilon_
    assert_close_relative(on_graph.embedding_, on_points.embedding_, rtol=1e-9, what="graph of 60 against fit(X)")
    if k == 40:
        default = DiffusionMap(n_components=3, device="cpu").fit(graph)
        assert default.n_neighbors_ == 40 and default.epsilon_ == on_graph.epsilon_
        np.testing.assert_array_equal(default.embedding_, on_graph.embedding_)


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "pearson"])
def test_unrelated_distance_of_equidistant_points(metric, rng) -> None:
    # Scaled unit vectors (shuffled): every pair is √2·c apart, and orthogonal (cos 0); Pearson's
    # centred rows of a scaled identity have correlation −1/(d − 1) for every pair.
    d, c = int(rng.integers(20, 60)), float(rng.uniform(0.5, 3.0))
    x = c * np.eye(d)[rng.permutation(d)]
    expected = {"euclidean": 2 * c * c, "sqeuclidean": 2 * c * c, "cosine": 2.0,
                "pearson": 2.0 * (1.0 + 1.0 / (d - 1))}[metric]
    assert manifold.unrelated_distance(x, metric) == pytest.approx(expected, rel=1e-12)
    assert manifold.unrelated_distance(torch.from_numpy(x), metric) == pytest.approx(expected, rel=1e-12)


def test_saturation_width_reads_the_median_row() -> None:
    sq = torch.tensor([[1.0, 2.0, 3.0, 9.0, 9.5, 9.9],
                       [1.0, 2.0, 4.0, 4.5, 9.5, 9.9],
                       [0.5, 3.0, 4.9, 5.5, 9.0, 9.9]], dtype=torch.float64)
    # Column medians 1, 2, 4, 5.5, 9.5, 9.9 against half of 10: the first three.
    assert manifold.saturation_width(sq, 10.0, 0.5, fewest=1) == 3
    assert manifold.saturation_width(sq, 10.0, 0.5, fewest=5) == 5  # at least the fewest
    assert manifold.saturation_width(sq, 100.0, 0.5) == 6  # nothing saturates: every column
    assert manifold.saturation_width(sq, 0.0, 0.5) == 6  # no scale (one point repeated)


def _concentration(truth: np.ndarray, embedding: np.ndarray) -> float:
    angle = np.arctan2(embedding[:, 1], embedding[:, 0])
    return float(max(abs(np.mean(np.exp(1j * (angle - truth)))), abs(np.mean(np.exp(1j * (angle + truth))))))


def test_a_sparsely_sampled_curve_whose_distances_saturate(rng) -> None:
    # A closed curve of random Fourier features (frequencies 1–16 in 300 dimensions), 500 random
    # angles: the 40th neighbour is nearly as far as unrelated points, and a 40-column kernel
    # mixes the angle with other modes (in about half of the draws, concentration 0.07–0.8: all
    # three draws pass 0.9 in one run in eight); the kernel stops where the distances saturate
    # and recovers it (300 draws: 0.948–0.9997).
    for _ in range(3):
        n, d = 500, 300
        theta = rng.uniform(0, 2 * np.pi, n)
        x = np.cos(np.outer(theta, rng.integers(1, 17, d)) + rng.uniform(0, 2 * np.pi, d))
        x += rng.normal(0, 0.05, (n, d))
        dm = DiffusionMap(n_components=2, device="cpu").fit(x)
        assert dm.report_.saturation_columns < 40 and dm.kernel_neighbors_ <= dm.report_.saturation_columns
        assert _concentration(theta, dm.embedding_) >= 0.9, dm.report_
    unlimited = DiffusionMap(n_components=2, saturation=None, device="cpu").fit(x)
    assert unlimited.report_.saturation_columns is None and unlimited.kernel_neighbors_ == 40


def test_auto_epsilon_is_the_quantile_of_the_fifth_neighbour(rng) -> None:
    x = blob(rng, int(rng.integers(200, 400)), 3)
    dm = DiffusionMap(n_neighbors=int(rng.integers(5, 30)), device="cpu").fit(x)
    fifth = np.asarray(dm.graph_.distances, dtype=np.float64)[:, 4] ** 2
    assert dm.epsilon_ == pytest.approx(np.quantile(fifth, manifold.EPSILON_QUANTILE), rel=1e-12)
    assert "0.97 quantile of the squared distances to the 5th neighbour and the width's reach" in dm.report_.epsilon_rule
    # Fewer neighbours than 5: the n_neighbors-th.
    dm = DiffusionMap(n_neighbors=3, device="cpu").fit(x)
    third = np.asarray(dm.graph_.distances, dtype=np.float64)[:, 2] ** 2
    assert dm.epsilon_ == pytest.approx(np.quantile(third, manifold.EPSILON_QUANTILE), rel=1e-12)


@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-8])
def test_kernel_width_leaves_out_only_what_kernel_tol_allows(tol, rng) -> None:
    x = blob(rng, 300, 3) + rng.normal(0, 0.01, (300, 3))
    cap = int(rng.integers(8, 120))
    dm = DiffusionMap(n_neighbors=cap, kernel_tol=tol, device="cpu").fit(x)
    w, eps = dm.kernel_neighbors_, dm.epsilon_
    sq = np.asarray(dm.graph_.distances, dtype=np.float64) ** 2
    assert 1 <= w <= cap and dm.graph_.k == min(299, cap)
    bound = np.exp(-(sq[:, w - 1] - sq[:, 0]) / eps)  # what row i leaves out, relative to its nearest
    assert dm.report_.kernel_tail == pytest.approx(bound.max(), rel=1e-9)
    assert dm.report_.kernel_rows_over_tol == int((bound > tol).sum())
    # The columns the kernel could take: n_neighbors, or fewer where the blob's far neighbours
    # are nearly as far apart as unrelated points (``saturation``).
    limit = min(cap, dm.report_.saturation_columns)
    if w < limit:  # the tolerance was reached, and not one column earlier
        assert bound.max() <= tol
        earlier = np.exp(-(sq[:, w - 2] - sq[:, 0]) / eps)
        assert w == 1 or earlier.max() > tol
    else:
        assert dm.report_.kernel_rows_over_tol >= 0
    assert dm.report_.kernel_entries >= 300 + 300 * w  # at least the diagonal and the w-NN


def test_shift_invert_takes_over_where_arpack_stalls(rng) -> None:
    # A long thin strip: its leading eigenvalues crowd against 1 (1 − c j²/L²), and with one
    # restart ARPACK (and the Lanczos) cannot reach eigen_tol; shift-invert about 1 must give
    # the dense answer.
    n = 400
    x = np.c_[rng.uniform(0, 30, n), rng.uniform(0, 0.3, n), rng.uniform(0, 0.1, n)]
    # 40 neighbours: the strip's 10-NN graph falls apart at its random gaps in some draws.
    with warnings.catch_warnings():
        warnings.simplefilter("error", manifold.DisconnectedWarning)
        ref = DiffusionMap(n_components=3, n_neighbors=40, eigen_tol=1e-13, device="cpu").fit(x)
    for solver in ("scipy", "torch"):
        dm = DiffusionMap(n_components=3, n_neighbors=40, eigen_solver=solver, max_iter=1, eigen_tol=1e-12,
                          device="cpu").fit(x)
        assert "shift-invert" in dm.report_.solver, dm.report_.solver
        np.testing.assert_allclose(dm.eigenvalues_, ref.eigenvalues_, rtol=0, atol=1e-10)
        assert_close_relative(np.abs(dm.embedding_), np.abs(ref.embedding_), rtol=1e-6, what=solver)
        assert max(dm.report_.residuals) < 1e-8


@pytest.mark.parametrize("data", [pytest.param("graph", marks=pytest.mark.slow), "knn_distances"])
def test_the_scanpy_recipe(data, rng) -> None:
    # README: DiffusionMap(n_neighbors=15).fit(knng.Graph.from_scipy(adata.obsp["distances"])) on
    # scanpy's pbmc68k_reduced (where the old ε raised ARPACK's error, and with n_components=10
    # returned eight eigenvalues of 1). Without scanpy, the same from a k-NN distance matrix of
    # clustered data in 50 dimensions, as scanpy's neighbours would hold it.
    import scipy.sparse

    if data == "graph":
        sc = pytest.importorskip("scanpy")
        adata = sc.datasets.pbmc68k_reduced()
        sc.pp.neighbors(adata, transformer=knng.KNeighborsTransformer(n_neighbors=15))
        distances = adata.obsp["distances"]
    else:
        u = rng.uniform(size=(700, 2))  # a 2-D manifold in 50 dimensions (random Fourier features)
        x = np.cos(u @ rng.normal(0, 3, (2, 50)) + rng.uniform(0, 2 * np.pi, 50)) + rng.normal(0, 0.05, (700, 50))
        g = knng.graph(x, 15, device="cpu")
        rows = np.repeat(np.arange(700), 15)
        distances = scipy.sparse.csr_matrix((np.asarray(g.distances).ravel(), (rows, np.asarray(g.indices).ravel())),
                                            shape=(700, 700))
    graph = knng.Graph.from_scipy(distances)
    for m in (2, 10):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # neither degenerate nor disconnected
            dm = DiffusionMap(n_neighbors=15, n_components=m).fit(graph)
        assert np.all(np.isfinite(dm.embedding_)) and dm.report_.components == 1
        assert 1.0 - dm.eigenvalues_[0] > 1e-6 and np.all(np.diff(dm.eigenvalues_) <= 0)
        assert max(dm.report_.residuals) <= 1e-9


# ------------------------------------------------------------------------------------------
# transform (Nyström)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [
    {}, {"epsilon": "self_tuning", "alpha": 0.5, "t": 3}, {"alpha": 0.0, "t": 0}, {"metric": "cosine"},
])
def test_transform_of_the_training_points_gives_their_embedding(params, rng) -> None:
    from knng.demo_embed import swiss_roll

    if params.get("metric") == "cosine":
        x = blob(rng, 800, 5) + 2.0  # directions that spread evenly (a swiss roll's do not)
    else:
        x, _ = swiss_roll(800, seed=int(rng.integers(2**31)))
    dm = DiffusionMap(n_components=3, n_neighbors=10, device="cpu", **params).fit(x)
    assert_close_relative(dm.transform(x), dm.embedding_, rtol=1e-9, what="transform(X_train)")
    # Subsets and single rows give the same rows (every row is embedded on its own).
    assert_close_relative(dm.transform(x[5:9]), dm.embedding_[5:9], rtol=1e-9)


def test_transform_of_new_points_is_close_to_their_neighbours(rng) -> None:
    from knng.demo_embed import swiss_roll

    x, t = swiss_roll(2000, seed=int(rng.integers(2**31)))
    # The default width: a kernel cut where its entries are still large (at 15 columns a row
    # leaves out entries up to 0.76 of its largest) jumps where a moved point's neighbours
    # change: 0.011–0.016 of the scale, against 0.001 at the default 40.
    dm = DiffusionMap(n_components=2, device="cpu").fit(x[:1500])
    e_new = dm.transform(x[1500:])
    # The unrolled coordinate of new points follows the roll parameter as the training one does.
    assert abs(spearmanr(e_new[:, 0], t[1500:]).statistic) >= 0.98
    # A point moved by a hair lands next to where it was.
    moved = dm.transform(x[:20] + 1e-4)
    assert np.abs(moved - dm.embedding_[:20]).max() < 1e-2 * np.abs(dm.embedding_).max()


def test_torch_input_and_a_precomputed_graph(rng) -> None:
    x = blob(rng)
    ref = DiffusionMap(n_components=3, n_neighbors=8, device="cpu").fit(x)
    tensor = DiffusionMap(n_components=3, n_neighbors=8, device="cpu").fit(torch.from_numpy(x))
    np.testing.assert_array_equal(tensor.embedding_, ref.embedding_)
    np.testing.assert_allclose(tensor.transform(torch.from_numpy(x[:7])), ref.embedding_[:7], atol=1e-9)
    # fit(X) computes graph_neighbors(n) columns (the kernel's reserve); a graph with more gives
    # the same kernel, its first columns being the same exact neighbours.
    width = ref.graph_neighbors(len(x))
    assert ref.graph_.k == width and ref.kernel_neighbors_ <= width
    g = knng.graph(x, min(width + 5, len(x) - 1), device="cpu")
    from_graph = DiffusionMap(n_components=3, n_neighbors=8, device="cpu").fit(g)
    np.testing.assert_array_equal(from_graph.embedding_, ref.embedding_)
    with pytest.raises(ValueError, match="training vectors"):
        from_graph.transform(x)
    both = DiffusionMap(n_components=3, n_neighbors=8, device="cpu").fit(x, graph=g)
    np.testing.assert_allclose(both.transform(x[:5]), ref.embedding_[:5], atol=1e-9)
    assert not hasattr(from_graph, "n_features_in_") and both.n_features_in_ == 3


def test_report_as_dict_is_json(rng) -> None:
    dm = DiffusionMap(n_components=2, n_neighbors=8, device="cpu").fit(blob(rng))
    report = json.loads(json.dumps(dm.report_.as_dict()))
    assert set(report["seconds"]) == {"graph", "kernel", "eigensolver"}
    assert report["components"] == 1 and len(report["eigenvalues"]) == len(report["residuals"]) == 4
    assert report["epsilon_rule"].startswith("auto") and report["epsilon"] == dm.epsilon_
    assert dm.n_iter_ >= 1 and dm.report_.matvecs == dm.n_iter_


# ------------------------------------------------------------------------------------------
# bad input: errors that name the argument
# ------------------------------------------------------------------------------------------


def test_unconnected_manifolds_are_embedded_component_by_component(rng) -> None:
    # Two blobs far apart (sizes drawn fresh, the smaller one second or first at random) and a
    # few isolated points: no k-NN edge crosses between them.
    sizes = rng.integers(150, 260, 2)
    a, b = blob(rng, int(sizes[0])), blob(rng, int(sizes[1])) + 50.0
    lone = rng.uniform(size=(2, 3)) + np.array([[200.0, 0, 0], [-200.0, 0, 0]])
    x = np.r_[a, b, lone] if rng.uniform() < 0.5 else np.r_[b, lone, a]
    # The lone points' k-NN edges reach a blob (every point has k neighbours) but underflow in
    # the kernel: the graph has 2 components, the kernel 4, and the warning says which is which.
    with pytest.warns(manifold.DisconnectedWarning, match=r"kernel falls into 4 connected components.*k-NN graph "
                      r"it is built on .* falls into 2 components"):
        dm = DiffusionMap(n_components=3, n_neighbors=8, device="cpu").fit(x)
    assert np.all(np.isfinite(dm.embedding_)) and dm.embedding_.shape == (len(x), 3)
    report = dm.report_
    assert report.components == 4 and report.graph_components == 2
    assert report.component_sizes == sorted(report.component_sizes, reverse=True) == [
        int(max(sizes)), int(min(sizes)), 1, 1]
    assert len(report.warnings) == 1 and len(report.component_eigenvalues) == 4
    labels = dm.component_labels_
    assert np.bincount(labels).tolist() == report.component_sizes
    # Each blob's coordinates are its own diffusion map: those of the blob fitted alone with the
    # same ε and kernel width (both are global: set from every point).
    for blob_points in (a, b):
        rows = np.flatnonzero((np.abs(x[:, None, :] - blob_points[None]).sum(axis=2) == 0).any(axis=1))
        assert len(set(labels[rows])) == 1
        alone = DiffusionMap(n_components=3, n_neighbors=dm.kernel_neighbors_, epsilon=dm.epsilon_,
                             kernel_tol=1e-300, device="cpu").fit(blob_points)
        assert_close_relative(np.abs(dm.embedding_[rows]), np.abs(alone.embedding_), rtol=1e-6,
                              what="a component's coordinates against the component fitted alone")
    # The lone points have no coordinates (a component of one point): zeros, not NaN.
    assert np.all(dm.embedding_[labels >= 2] == 0.0)
    # transform keeps a new point in its nearest training point's component.
    assert_close_relative(dm.transform(x[:20]), dm.embedding_[:20], rtol=1e-9, what="transform")


def test_a_kernel_that_underflows_is_blamed_and_the_advice_works(rng) -> None:
    # The k-NN graph is connected; ε so small that its entries underflow makes the kernel fall
    # apart. The warning must blame the kernel (not the graph) and the ε it advises must work.
    x = connected_blob(rng, 120, 3, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = DiffusionMap(n_neighbors=5, epsilon=1e-6, device="cpu").fit(x)
    disconnected = [w for w in caught if issubclass(w.category, manifold.DisconnectedWarning)]
    assert len(disconnected) == 1
    text = str(disconnected[0].message)
    assert re.search(r"the kernel falls into .* but the k-NN graph .* is connected: .* underflowed to 0 with "
                     r"epsilon=1e-06\. Use epsilon='auto' \(ε = \S+ on this graph\), or at least any epsilon ≥ "
                     r"\S+, which keeps every entry", text), text
    assert dm.report_.graph_components == 1 and dm.report_.components > 1
    assert np.all(np.isfinite(dm.embedding_))
    auto = float(re.search(r"ε = (\S+) on this graph", text).group(1))
    keeps = float(re.search(r"any epsilon ≥ (\S+),", text).group(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither disconnected nor degenerate
        fixed = DiffusionMap(n_neighbors=5, epsilon=auto, device="cpu").fit(dm.graph_)
    assert fixed.report_.components == 1 and fixed.report_.kernel_entries_underflowed == 0
    assert fixed.epsilon_ == pytest.approx(DiffusionMap(n_neighbors=5, device="cpu").fit(dm.graph_).epsilon_, rel=1e-3)
    with warnings.catch_warnings(record=True):  # may be degenerate (entries near rounding), not disconnected
        warnings.simplefilter("always")
        kept = DiffusionMap(n_neighbors=5, epsilon=keeps * 1.001, device="cpu").fit(dm.graph_)
    assert kept.report_.components == 1 and kept.report_.kernel_entries_underflowed == 0


@pytest.mark.parametrize("solver", ["scipy", "torch"])
def test_a_degenerate_spectrum_is_never_silent(solver, rng) -> None:
    # Two clusters joined only by entries near the rounding level (connected as a graph, but
    # their kernel weights are ~1e-140): λ₁ = 1 to rounding, which must be said. A Krylov solver
    # left to find the trivial pair itself saw one eigenvalue 1 of the two in some draws (its
    # start vector sees one direction of the eigenspace), and said nothing.
    a = blob(rng, 150)
    x = np.r_[a, a[:60] + np.array([4.0, 0, 0])]  # 60 points: with k = 70 each reaches the other cluster
    g = knng.graph(x, 70, device="cpu")
    sq = np.asarray(g.distances, dtype=np.float64) ** 2
    eps = sq.max() / 600  # no entry underflows (s/ε ≤ 600) ...
    assert sq[sq > 4].min() / eps > 60  # ... and the bridges weigh below e⁻⁶⁰
    with pytest.warns(manifold.DegenerateSpectrumWarning, match="equal 1 to within"):
        dm = DiffusionMap(n_components=2, n_neighbors=70, epsilon=eps, eigen_solver=solver, device="cpu").fit(g)
    assert dm.report_.components == 1 and dm.report_.warnings
    assert 1.0 - dm.eigenvalues_[0] < manifold.DEGENERATE_GAP
    assert dm.report_.solver.startswith(solver)  # iterative, not the dense solve of tiny sets
    assert dm.report_.trivial_vector_error < 1e-9  # ψ₀ ≡ 1, not a mixture of the two clusters


@pytest.mark.parametrize("params, match", [
    ({"epsilon": 0.0}, "epsilon"), ({"epsilon": -1.0}, "epsilon"), ({"epsilon": "median"}, "epsilon"),
    ({"epsilon": float("nan")}, "epsilon"), ({"n_components": 0}, "n_components"),
    ({"n_components": 30}, "n_components=30.*n_samples=30"),
    ({"n_neighbors": 0}, "n_neighbors"), ({"n_neighbors": 2.5}, "n_neighbors"), ({"alpha": 1.5}, "alpha"),
    ({"alpha": -0.1}, "alpha"), ({"t": -1}, "t must"), ({"metric": "inner_product"}, "metric"),
    ({"eigen_solver": "lobpcg"}, "eigen_solver"), ({"eigen_tol": 0}, "eigen_tol"), ({"max_iter": 0}, "max_iter"),
    ({"sigma_neighbor": 0}, "sigma_neighbor"), ({"kernel_tol": 0.0}, "kernel_tol"), ({"kernel_tol": 2.0}, "kernel_tol"),
])
def test_bad_parameters_name_the_argument(params, match, rng) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        DiffusionMap(device="cpu", **params).fit(blob(rng, 30, 3))


def test_nan_and_bad_graphs_are_refused(rng) -> None:
    x = blob(rng, 50, 3)
    x[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        DiffusionMap(device="cpu").fit(x)
    with pytest.raises(ValueError, match="NaN"):
        DiffusionMap(device="cpu").fit(torch.from_numpy(x))
    x = blob(rng, 50, 3)
    with pytest.raises(ValueError, match="include_self"):
        DiffusionMap(n_neighbors=5, device="cpu").fit(knng.graph(x, 5, include_self=True, device="cpu"))
    with pytest.raises(ValueError, match="n_neighbors=9 is more than the graph's k=5"):
        DiffusionMap(n_neighbors=9, device="cpu").fit(knng.graph(x, 5, device="cpu"))
    with pytest.raises(ValueError, match="metric"):
        DiffusionMap(n_neighbors=5, device="cpu").fit(knng.graph(x, 5, metric="cosine", device="cpu"))
    with pytest.raises(ValueError, match="features"):
        DiffusionMap(n_neighbors=5, device="cpu").fit(x).transform(x[:, :2])


# ------------------------------------------------------------------------------------------
# scikit-learn's contract and the package's import rules
# ------------------------------------------------------------------------------------------


# Larger n_neighbors than the default: check_estimator fits iris, whose setosa class is a
# component of its own in the 15-NN graph (and is refused as disconnected, on purpose).
@parametrize_with_checks([DiffusionMap(n_neighbors=60, device="cpu")])
def test_sklearn_estimator_checks(estimator, check) -> None:
    check(estimator)


def test_import_knng_does_not_import_sklearn_or_scipy() -> None:
    code = ("import sys, knng; assert 'sklearn' not in sys.modules and 'scipy' not in sys.modules, 'eager'; "
            "knng.DiffusionMap; assert 'sklearn' in sys.modules; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PYTHONPATH": str(Path(knng.__file__).parents[1])})
    assert result.stdout.strip() == "ok", result.stderr


def test_cli_copies_of_the_names_agree() -> None:
    from knng.cli import choices

    assert choices.EMBED_METRICS == manifold.METRICS
    assert choices.EMBED_EPSILON_RULES == manifold.EPSILON_RULES
    assert choices.EMBED_EIGEN_SOLVERS == manifold.EIGEN_SOLVERS


# ------------------------------------------------------------------------------------------
# knng embed
# ------------------------------------------------------------------------------------------


def _roll_file(tmp_path: Path, n: int = 600) -> tuple[str, np.ndarray, np.ndarray]:
    from knng.demo_embed import swiss_roll

    x, t = swiss_roll(n, seed=3)
    x = x.astype(np.float32)
    np.save(tmp_path / "roll.npy", x)
    return str(tmp_path / "roll.npy"), x, t


def test_embed_command_without_k_takes_the_default(tmp_path, capsys) -> None:
    data, x, _ = _roll_file(tmp_path)
    out = tmp_path / "out"
    assert main(["embed", data, "-o", str(out), "--no-progress", "--device", "cpu"]) == 0, capsys.readouterr().out
    ref = DiffusionMap(device="cpu").fit(x)
    np.testing.assert_array_equal(np.load(out / "embedding.npy"), ref.embedding_)
    meta = json.loads((out / "knng.json").read_text())
    assert meta["k"] == manifold.DEFAULT_N_NEIGHBORS == ref.n_neighbors_
    assert f"k={manifold.DEFAULT_N_NEIGHBORS}," in capsys.readouterr().out


def test_embed_command_writes_the_set(tmp_path, capsys) -> None:
    data, x, t = _roll_file(tmp_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join("inner" if v < 9 else "outer" for v in t) + "\n")
    out = tmp_path / "out"
    code = main(["embed", data, "-k", "10", "--components", "3", "-o", str(out), "--labels", str(labels),
                 "--no-progress", "--device", "cpu"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    embedding, eigenvalues = np.load(out / "embedding.npy"), np.load(out / "eigenvalues.npy")
    ref = DiffusionMap(n_components=3, n_neighbors=10, device="cpu").fit(x)
    np.testing.assert_array_equal(embedding, ref.embedding_)
    np.testing.assert_array_equal(eigenvalues, ref.eigenvalues_)
    meta = json.loads((out / "knng.json").read_text())
    assert meta["command"] == "embed" and meta["k"] == 10 and meta["components"] == 3
    assert set(meta["timings_s"]) == {"graph", "kernel", "eigensolver"}
    assert meta["diffusion"]["eigenvalues"][1:4] == pytest.approx(list(eigenvalues))
    if meta["plot"] == "embedding.png":
        assert (out / "embedding.png").stat().st_size > 0 and "embedding.png" in stdout
    else:
        assert "pip install matplotlib" in meta["plot"] and "no plot: matplotlib is not installed" in stdout
    assert "eigenvalues λ₁…λ_3" in stdout and "graph" in stdout and "eigensolver" in stdout
    # The folder holds results now: a second run needs --overwrite.
    assert main(["embed", data, "-k", "10", "-o", str(out), "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_embed_command_without_matplotlib(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib…` fail
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    data, _, _ = _roll_file(tmp_path, 300)
    out = tmp_path / "out"
    assert main(["embed", data, "-k", "10", "-o", str(out), "--no-progress", "--device", "cpu"]) == 0
    assert "no plot: matplotlib is not installed (pip install matplotlib)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["eigenvalues.npy", "embedding.npy", "knng.json"]


def test_embed_command_with_matplotlib_draws_the_plot(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    data, _, _ = _roll_file(tmp_path, 300)
    labels = tmp_path / "labels.npy"
    np.save(labels, np.arange(300) % 3)
    out = tmp_path / "out"
    assert main(["embed", data, "-k", "10", "--components", "2", "-o", str(out), "--no-progress", "--labels",
                 str(labels)]) == 0
    assert (out / "embedding.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, match", [
    (["--epsilon", "0"], "--epsilon"), (["--epsilon", "wide"], "--epsilon"), (["--components", "600"], "--components"),
    (["--metric", "inner_product"], "--metric"), (["--alpha", "2"], "--alpha"), (["--t", "-1"], "--t"),
    (["-k", "0"], "-k"),
    (["--color-by", "5"], "--color-by"),
])
def test_embed_command_bad_arguments(argv, match, tmp_path, capsys) -> None:
    data, _, _ = _roll_file(tmp_path, 600)
    args = ["embed", data, "-k", "10", "-o", str(tmp_path / "out"), "--no-progress", *argv]
    assert main(args) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_embed_command_labels_must_match(tmp_path, capsys) -> None:
    data, _, _ = _roll_file(tmp_path, 300)
    (tmp_path / "few.txt").write_text("1\n2\n")
    assert main(["embed", data, "-k", "10", "-o", str(tmp_path / "out"), "--labels", str(tmp_path / "few.txt")]) == 2
    assert "--labels" in capsys.readouterr().err


def test_embed_help(capsys) -> None:
    assert main(["embed", "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "embedding.npy" in out and "Berry" in out


# ------------------------------------------------------------------------------------------
# GPU (run with -m gpu on a GPU machine)
# ------------------------------------------------------------------------------------------


@gpu
@needs_cuda
def test_gpu_torch_solver_equals_the_cpu_scipy_path(rng) -> None:
    x = blob(rng, 3000, 8)
    cpu = DiffusionMap(n_components=6, n_neighbors=15, eigen_tol=1e-12, device="cpu").fit(x)
    cuda = DiffusionMap(n_components=6, n_neighbors=15, eigen_tol=1e-12, device="cuda").fit(x)
    assert "Lanczos" in cuda.report_.solver and cuda.report_.device.startswith("cuda")
    assert cuda.epsilon_ == pytest.approx(cpu.epsilon_, rel=1e-12)
    np.testing.assert_allclose(cuda.eigenvalues_, cpu.eigenvalues_, rtol=0, atol=1e-11)
    assert_close_relative(cuda.embedding_, cpu.embedding_, rtol=1e-7, what="GPU vs CPU embedding")
    assert_close_relative(cuda.transform(x[:100]), cpu.embedding_[:100], rtol=1e-7, what="GPU transform")


@gpu
@needs_cuda
def test_gpu_kernel_equals_the_cpu_kernel(rng) -> None:
    x = blob(rng, 2000, 8)
    g = knng.graph(x, 12, device="cpu")
    for epsilon in ("auto", "self_tuning", 3.0):
        a = manifold.diffusion_kernel(g, epsilon=epsilon, device="cpu")
        b = manifold.diffusion_kernel(g, epsilon=epsilon, device="cuda")
        assert torch.equal(a.rows, b.rows.cpu()) and torch.equal(a.cols, b.cols.cpu())
        torch.testing.assert_close(b.conjugate.cpu(), a.conjugate, rtol=1e-13, atol=0)


@gpu
@needs_cuda
def test_gpu_torch_tensor_input_stays_on_the_device(rng) -> None:
    x = torch.from_numpy(blob(rng, 1500, 6)).cuda()
    dm = DiffusionMap(n_components=3, n_neighbors=10).fit(x)
    assert dm.report_.device.startswith("cuda")
    assert_close_relative(dm.transform(x[:50]), dm.embedding_[:50], rtol=1e-9)
