"""``knng demo --embed``: diffusion maps that recover what made the data.

Two data sets whose hidden parameter is known, embedded with :class:`knng.DiffusionMap` (exact
k-NN graph, ε "auto", α = 1) and checked:

1. **rotation** — a 32×32 thumbnail of scikit-image's ``camera`` photograph, cut to a disc (so
   that a rotation maps the picture onto itself) and rotated in-plane by 600 random angles
   through 360°, each snapshot with Gaussian pixel noise (σ = 0.05 on intensities in [0, 1]).
   The snapshots lie on a closed curve in 740-dimensional pixel space; (ψ₁, ψ₂) must come out
   as a circle whose polar angle is the rotation angle: the Fisher–Lee circular correlation
   between the two angles must be at least 0.99 in absolute value (the sign is the circle's
   orientation, which no embedding can know).
2. **swiss roll** — 1 500 points of scikit-learn's ``make_swiss_roll`` (noise 0.05): the first
   coordinate ψ₁ must unroll the roll, Spearman |ρ| ≥ 0.99 with the roll parameter.

It prints what it checked, and writes ``rotation.png`` and ``swiss-roll.png`` when matplotlib is
installed. Both checks are also CI tests (``tests/test_manifold.py``).
"""

from __future__ import annotations

import builtins
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["run_embed_demo", "rotation_snapshots", "swiss_roll", "circular_correlation", "ROTATION_BAR",
           "ROLL_BAR"]

#: Side of the rotated thumbnail, in pixels.
ROTATION_SIZE = 32
#: The acceptance bars of the two checks.
ROTATION_BAR = 0.99
ROLL_BAR = 0.99


def rotation_snapshots(n: int = 600, size: int = ROTATION_SIZE, noise: float = 0.05,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy snapshots of ``camera`` rotated in-plane by random angles.

    Returns
    -------
    (snapshots, angles)
        ``snapshots`` (n, pixels of the disc) float32, ``angles`` (n,) in radians in [0, 2π).

    Raises
    ------
    ImportError
        Without scikit-image.
    """
    from skimage import data, img_as_float32, transform

    # Anti-aliased down-sampling: the thumbnail is smooth, so small rotations move it little.
    image = transform.resize(img_as_float32(data.camera()), (size, size), anti_aliasing=True)
    disc = _disc(size)
    rng = np.random.default_rng(seed)
    degrees = rng.uniform(0.0, 360.0, n)
    snapshots = np.stack([transform.rotate(image, a, order=1)[disc] for a in degrees]).astype(np.float32)
    snapshots += rng.normal(0.0, noise, snapshots.shape).astype(np.float32)
    return snapshots, np.deg2rad(degrees)


def swiss_roll(n: int = 1500, noise: float = 0.05, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's swiss roll: points (n, 3) and the roll parameter (n,)."""
    from sklearn.datasets import make_swiss_roll

    return make_swiss_roll(n, noise=noise, random_state=seed)


def circular_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """The Fisher–Lee (1983) circular correlation of two angle samples, in [−1, 1].

    ``det(Σ u_i v_iᵀ) / sqrt(det(Σ u_i u_iᵀ) det(Σ v_i v_iᵀ))`` with u, v the unit vectors of the
    angles: +1 when b = a + c, −1 when b = −a + c, for any constant c. Unlike the
    Jammalamadaka–SenGupta coefficient it needs no mean direction, which angles spread evenly
    round the circle do not have.
    """
    ca, sa, cb, sb = np.cos(a), np.sin(a), np.cos(b), np.sin(b)
    cross = (ca @ cb) * (sa @ sb) - (ca @ sb) * (sa @ cb)
    own_a = (ca @ ca) * (sa @ sa) - (ca @ sa) ** 2
    own_b = (cb @ cb) * (sb @ sb) - (cb @ sb) ** 2
    return float(cross / np.sqrt(own_a * own_b))


def _embed(x: np.ndarray, device: str) -> Any:
    from knng.manifold import DiffusionMap

    return DiffusionMap(n_components=2, device=device).fit(x)  # the defaults, as a new user's first call


def _rotation(out: Path, device: str, emit: Callable[..., Any], n: int, seed: int, plots: bool) -> dict[str, Any]:
    x, angles = rotation_snapshots(n, seed=seed)
    emit(f"\n== rotation: {n} snapshots of skimage camera (32×32, disc of {x.shape[1]} pixels) rotated through "
         "360°, pixel noise σ=0.05 ==")
    t0 = time.perf_counter()
    dm = _embed(x, device)
    seconds = time.perf_counter() - t0
    e = dm.embedding_
    recovered = np.arctan2(e[:, 1], e[:, 0])
    rho = circular_correlation(angles, recovered)
    radius = np.hypot(e[:, 0], e[:, 1])
    report = dm.report_
    emit(f"DiffusionMap(k={report.n_neighbors}, ε auto = {report.epsilon:.3g}, α=1): {seconds:.2f} s; eigenvalues λ₁, λ₂ = "
         f"{dm.eigenvalues_[0]:.6f}, {dm.eigenvalues_[1]:.6f} (a near-degenerate pair: cos θ and sin θ), "
         f"residuals ≤ {max(report.residuals):.1e}")
    emit(f"check: the polar angle of (ψ₁, ψ₂) against the rotation angle: circular correlation "
         f"{rho:+.4f} (|ρ| ≥ {ROTATION_BAR}: {'passed' if abs(rho) >= ROTATION_BAR else 'FAILED'}); radius "
         f"spread {radius.std() / radius.mean():.1%} of its mean")
    result = {"name": "rotation", "n": n, "seconds": seconds, "circular_correlation": rho,
              "passed": abs(rho) >= ROTATION_BAR, "eigenvalues": dm.eigenvalues_.tolist(), "epsilon": report.epsilon}
    if plots:
        result["plot"] = str(_plot_rotation(out / "rotation.png", x, angles, e, rho))
    return result


def _roll(out: Path, device: str, emit: Callable[..., Any], n: int, seed: int, plots: bool) -> dict[str, Any]:
    from scipy.stats import spearmanr

    x, t = swiss_roll(n, seed=seed)
    emit(f"\n== swiss roll: {n} points of sklearn make_swiss_roll (noise 0.05) ==")
    t0 = time.perf_counter()
    dm = _embed(x, device)
    seconds = time.perf_counter() - t0
    rho = float(spearmanr(dm.embedding_[:, 0], t).statistic)
    emit(f"DiffusionMap(k={dm.report_.n_neighbors}, ε auto = {dm.report_.epsilon:.3g}, α=1): {seconds:.2f} s; λ₁, λ₂ = "
         f"{dm.eigenvalues_[0]:.6f}, {dm.eigenvalues_[1]:.6f}")
    emit(f"check: ψ₁ against the roll parameter: Spearman ρ {rho:+.4f} (|ρ| ≥ {ROLL_BAR}: "
         f"{'passed' if abs(rho) >= ROLL_BAR else 'FAILED'})")
    result = {"name": "swiss-roll", "n": n, "seconds": seconds, "spearman": rho, "passed": abs(rho) >= ROLL_BAR,
              "eigenvalues": dm.eigenvalues_.tolist(), "epsilon": dm.report_.epsilon}
    if plots:
        result["plot"] = str(_plot_roll(out / "swiss-roll.png", x, t, dm.embedding_, rho))
    return result


def _plot_rotation(path: Path, x: np.ndarray, angles: np.ndarray, e: np.ndarray, rho: float) -> Path:
    from matplotlib.figure import Figure

    from knng.plotting import scatter_embedding, write_figure

    fig = Figure(figsize=(11, 4.6), layout="constrained")
    fig.suptitle("Diffusion map of rotated snapshots: (ψ₁, ψ₂) is a circle whose angle is the rotation "
                 f"(circular correlation {rho:+.3f})", fontsize="medium")
    grid = fig.add_gridspec(2, 6)
    ax = fig.add_subplot(grid[:, 2:])
    scatter_embedding(ax, e, np.rad2deg(angles), cmap="twilight", colour_label="rotation angle (°)")
    ax.set_aspect("equal", adjustable="datalim")
    disc = _disc(ROTATION_SIZE)  # to put the disc's pixels back on a square
    for i, q in enumerate(np.linspace(0, 2 * np.pi, 4, endpoint=False)):
        j = int(np.argmin(np.abs(np.angle(np.exp(1j * (angles - q))))))
        image = np.full(disc.shape, np.nan)
        image[disc] = x[j]
        sub = fig.add_subplot(grid[i // 2, i % 2])
        sub.imshow(image, cmap="gray")
        sub.set_title(f"{np.rad2deg(angles[j]):.0f}°", fontsize="small")
        sub.axis("off")
    return write_figure(fig, path)


def _disc(size: int) -> np.ndarray:
    """The pixels of a size × size square inside its inscribed circle."""
    centre = (size - 1) / 2
    yy, xx = np.mgrid[:size, :size]
    return (yy - centre) ** 2 + (xx - centre) ** 2 <= centre**2


def _plot_roll(path: Path, x: np.ndarray, t: np.ndarray, e: np.ndarray, rho: float) -> Path:
    from matplotlib.figure import Figure

    from knng.plotting import scatter_embedding, write_figure

    fig = Figure(figsize=(11, 4.6), layout="constrained")
    fig.suptitle(f"Diffusion map of a swiss roll: ψ₁ unrolls it (Spearman ρ {rho:+.3f} with the roll parameter)",
                 fontsize="medium")
    ax = fig.add_subplot(1, 2, 1, projection="3d")
    ax.scatter(x[:, 0], x[:, 1], x[:, 2], c=t, s=4, cmap="viridis", linewidths=0)
    ax.set_title("data (colour: roll parameter)", fontsize="small")
    scatter_embedding(fig.add_subplot(1, 2, 2), e, t, colour_label="roll parameter")
    return write_figure(fig, path)


def run_embed_demo(out_dir: str | Path = "knng-demo", device: str = "auto",
                   print: Callable[..., Any] = builtins.print, *, n_rotations: int = 600, n_roll: int = 1500,
                   seed: int = 0) -> dict[str, Any]:
    """Embed the two data sets of the module docstring, check them, plot them.

    Parameters
    ----------
    out_dir : str or Path
        Folder for ``rotation.png`` and ``swiss-roll.png`` (created if missing).
    device : str
        As for :class:`knng.DiffusionMap`.
    print : callable
        Where the report lines go.
    n_rotations, n_roll : int
        Sizes of the two data sets.
    seed : int
        Seed of the angles, the noise and the roll.

    Returns
    -------
    dict
        ``results`` (one dict per data set with its check and ``passed``), ``skipped`` (with the
        reason), ``plots_skipped`` (the reason there are no plots, or None), ``seconds``.
    """
    import knng
    from knng.plotting import matplotlib_missing

    emit = print
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    missing = matplotlib_missing()
    emit(f"knng {knng.__version__} diffusion-map demo: exact k-NN graph → kernel exp(−d²/ε) → α = 1 "
         "(Laplace–Beltrami) → leading eigenvectors")
    results, skipped = [], {}
    try:
        results.append(_rotation(out, device, emit, n_rotations, seed, missing is None))
    except ImportError:
        skipped["rotation"] = "scikit-image is not installed (pip install scikit-image)"
        emit(f"\n== rotation: skipped, {skipped['rotation']} ==")
    results.append(_roll(out, device, emit, n_roll, seed, missing is None))
    total = time.perf_counter() - start
    passed = all(r["passed"] for r in results)
    emit("")
    emit(f"{sum(r['passed'] for r in results)}/{len(results)} checks passed; total {total:.1f} s; "
         + (f"plots in {out}/ ({', '.join(Path(r['plot']).name for r in results)})" if missing is None
            else f"no plots: {missing}"))
    return {"results": results, "skipped": skipped, "plots_skipped": missing, "passed": passed, "seconds": total}
