"""Scatter plots of embeddings, for ``knng embed`` and ``knng demo --embed``.

matplotlib is optional (``pip install matplotlib``): :func:`matplotlib_missing` says why a plot
cannot be drawn, and the commands carry on without it. Figures are drawn through
``matplotlib.figure.Figure`` (no pyplot, no global backend) and written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from knng.io import atomic_write

__all__ = [
    "MISSING_MATPLOTLIB", "matplotlib_missing", "colour_values", "scatter_embedding", "embedding_figure",
    "write_figure",
]

#: What to tell the user when matplotlib does not import.
MISSING_MATPLOTLIB = "matplotlib is not installed (pip install matplotlib)"
#: Points drawn at most; beyond, an even stride through them (a 1M-point scatter is a blur that
#: takes minutes to draw, and the sample shows the same shape).
MAX_POINTS = 200_000


def matplotlib_missing() -> str | None:
    """None when matplotlib imports, else :data:`MISSING_MATPLOTLIB`."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return MISSING_MATPLOTLIB
    return None


def colour_values(labels: np.ndarray) -> tuple[np.ndarray, list[str] | None]:
    """Numbers to colour by: numeric labels as they are, others as category codes (with names)."""
    labels = np.asarray(labels).ravel()
    if labels.dtype.kind in "iufb":
        return labels.astype(np.float64), None
    names, codes = np.unique(labels.astype(str), return_inverse=True)
    return codes.astype(np.float64), [str(name) for name in names]


def scatter_embedding(ax: Any, embedding: np.ndarray, colour: np.ndarray, *, columns: tuple[int, int] = (0, 1),
                      cmap: str = "viridis", colour_label: str = "", names: Sequence[str] | None = None) -> None:
    """Scatter two coordinates of ``embedding`` on ``ax``, coloured by ``colour``, with a colour bar."""
    step = max(1, -(-embedding.shape[0] // MAX_POINTS))
    a, b = columns
    size = float(np.clip(4000.0 / max(embedding.shape[0] // step, 1), 0.5, 12.0))
    points = ax.scatter(embedding[::step, a], embedding[::step, b], c=colour[::step], s=size, cmap=cmap,
                        linewidths=0, rasterized=True)
    ax.set_xlabel(f"ψ{a + 1}")
    ax.set_ylabel(f"ψ{b + 1}")
    bar = ax.figure.colorbar(points, ax=ax)
    bar.set_label(colour_label)
    if names is not None and len(names) <= 20:
        bar.set_ticks(np.arange(len(names)), labels=list(names))


def write_figure(fig: Any, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path``, atomically."""
    atomic_write(path, lambda temp: fig.savefig(temp, format="png", dpi=110))
    return path


def embedding_figure(embedding: np.ndarray, colour: np.ndarray, *, title: str, colour_label: str,
                     names: Sequence[str] | None = None, cmap: str = "viridis") -> Any:
    """A figure of (ψ₁, ψ₂) — and (ψ₁, ψ₃) when there is a third coordinate — coloured by ``colour``."""
    from matplotlib.figure import Figure

    if names is not None and len(names) <= 10:
        cmap = "tab10"  # categories: distinct colours, not a ramp that suggests an order
    panels = [(0, 1)] if embedding.shape[1] < 3 else [(0, 1), (0, 2)]
    if embedding.shape[1] == 1:
        embedding = np.c_[embedding, np.zeros(len(embedding))]
    fig = Figure(figsize=(5.2 * len(panels), 4.4), layout="constrained")
    fig.suptitle(title, fontsize="medium")
    for i, columns in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        scatter_embedding(ax, embedding, colour, columns=columns, cmap=cmap, colour_label=colour_label,
                          names=names)
    return fig
