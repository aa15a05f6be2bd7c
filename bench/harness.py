"""The benchmark harness: what every suite in ``bench/`` times, runs on and compares with.

One module, imported by the suites (``sys.path`` gets ``bench/`` and ``tests/`` as in the
scripts' usage lines)::

    PYTHONPATH=src:tests python bench/<suite>.py ...

It holds

* **the timer** (:func:`time_call`): CUDA events around a synchronised call on a GPU, the
  host's ``time.perf_counter`` on a CPU; warm-up calls, then repeats; every time, the minimum
  and the median (:class:`Timing`);
* **the data sets** (:data:`DATASETS`, :func:`load_dataset`), each made deterministically from
  a seed: Gaussian N(0, 1) points, the benchmark's image patches (grey levels of
  scikit-image pictures, :func:`patches`; :func:`save_pictures` writes them to a ``.npz`` for
  a machine without scikit-image or a network) and held-out real-data-like sets: patches off
  the 1/255 lattice, integer (uint8) patches, dense gradient descriptors, embeddings compared
  by cosine, 3-D point clouds and photon counts on a 126 × 126 detector;
* **the peers**, each optional and run in the same process (:func:`peers`): FAISS on the GPU
  (``faiss.knn_gpu`` with ``faiss.contrib.torch_utils``), cuVS's brute force, faiss-cpu,
  scikit-learn's ``NearestNeighbors(algorithm="brute")`` and torch's mm + topk on the float32
  expansion (the baseline of most GPU code), with :func:`recall` of their answers;
* **the oracle check** (:func:`check_exact`): ``tests/oracle.py``'s ``assert_exact_chunked``
  on a sample of rows;
* **option sets** (:data:`OPTION_SETS`, :func:`parse_option_set`, :func:`alternate`): knng's
  behaviour is configured by ``knng.options(**changes)``; a named or inline option set is a
  dict of such changes, and :func:`alternate` times one call under several sets, alternating
  call by call after a warm-up of each, in one process;
* **reports** (:func:`report_summary`, :func:`format_stages`): the figures of a result's
  ``report`` (pairs screened and evaluated per row, its plan, ``report.stages``), read
  defensively so that an older knng on ``PYTHONPATH`` (an old-against-new A/B) still runs.

Only knng's public API is used (``tests/test_layering.py``, rule (e)); no module attribute of
knng is ever set: what a benchmark varies, it varies through ``knng.options``.

``python bench/harness.py --save-images .carry/pictures.npz`` writes the pictures (needs
scikit-image); ``python bench/harness.py --list`` lists the data sets, option sets and the
peers importable here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT / "tests", ROOT / "bench"):  # tests/oracle.py; the suites beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import knng  # noqa: E402

__all__ = [
    "ROOT", "Timing", "time_call", "resolve_device", "synchronize", "release", "gpu_or_exit",
    "PICTURES", "PATCH_SHAPES", "DEFAULT_PICTURES", "save_pictures", "load_pictures", "patches",
    "gaussian", "dense_descriptors", "embeddings", "point_cloud", "manifold", "photon_counts", "camera_patches",
    "DataSet", "DATASETS", "load_dataset", "dataset_on", "flat_rows",
    "Peer", "peers", "peer_graph", "recall", "torch_search",
    "oracle_rows", "check_exact",
    "OPTION_SETS", "parse_option_set", "option_context", "alternate",
    "report_summary", "format_stages", "environment", "write_json", "common_arguments", "apply_threads",
]


# ------------------------------------------------------------------------------ devices


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """The device a suite runs on.

    Parameters
    ----------
    name : str, torch.device or None
        ``"auto"`` (or None): the first GPU where there is one, else the CPU; any other
        value is passed to :class:`torch.device`.

    Returns
    -------
    torch.device
    """
    if name is None or str(name) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device | str | None = None) -> None:
    """Collect garbage and hand the allocator's cached GPU blocks back, so that the next library
    or data set starts from an empty cache as in a fresh process (a peer's 40 GB of cached score
    blocks once slowed knng's next call by a fifth)."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.empty_cache()


def gpu_or_exit(script: str) -> None:
    """End a GPU-only suite cleanly (exit status 0, one line saying why) on a machine without
    a CUDA device."""
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device here; this suite runs on a GPU only (nothing was run).")
        raise SystemExit(0)


# -------------------------------------------------------------------------------- timer


@dataclass
class Timing:
    """The times of the timed calls of one function, and the last call's result.

    Attributes
    ----------
    times : list of float
        Seconds of each timed call, in order (the warm-up calls are not in it).
    result : object
        What the last call returned.
    timer : str
        ``"cuda-events"`` or ``"perf_counter"``.
    """

    times: list[float]
    result: Any = None
    timer: str = "perf_counter"

    @property
    def min(self) -> float:
        """The fastest call, seconds."""
        return min(self.times)

    @property
    def median(self) -> float:
        """The median call, seconds."""
        return statistics.median(self.times)

    def ms(self) -> list[float]:
        """Every time in milliseconds, rounded to 0.01 ms."""
        return [round(t * 1e3, 2) for t in self.times]

    def as_dict(self) -> dict[str, Any]:
        """The times as JSON values (milliseconds)."""
        return {"min_ms": self.min * 1e3, "median_ms": self.median * 1e3, "times_ms": self.ms(), "timer": self.timer}


def _wait_for_kernels() -> None:
    """After warm-ups: a first call of its kind on a GPU (a graph of at most
    ``Options.uncompiled_max_scores`` scores) ran without compiled kernels, which compile in the
    background; the timed calls run with them (an older tree has no such wait)."""
    getattr(knng, "wait_for_kernels", lambda: True)()


def time_call(call: Callable[[], Any], *, device: torch.device | str | None = "auto", warmup: int = 1,
              repeats: int = 3, before: Callable[[], Any] | None = None) -> Timing:
    """Time ``call``: ``warmup`` untimed calls, then ``repeats`` timed ones.

    On a GPU each timed call sits between two CUDA events recorded on the current stream, the
    device synchronised before the first and after the second, so a call's time is the span
    from its start to the end of the last work it queued (host work included: the stream waits
    for it). On a CPU it is the host clock (``time.perf_counter``) around the call.

    Parameters
    ----------
    call : callable
        The function to time, without arguments.
    device : torch.device, str or None
        Where the call's work runs (``"auto"``: :func:`resolve_device`).
    warmup : int
        Untimed calls first (compilation, caches, the allocator's growth); after them, the
        kernels compiling in the background are waited for (``knng.wait_for_kernels``).
    repeats : int
        Timed calls.
    before : callable or None
        Run (untimed) before every call, warm-up calls included: a barrier, a cache drop.

    Returns
    -------
    Timing
    """
    dev = resolve_device(device)
    result = None
    for _ in range(warmup):
        if before is not None:
            before()
        result = call()
    if warmup:
        _wait_for_kernels()
    synchronize(dev)
    times: list[float] = []
    cuda = dev.type == "cuda"
    for _ in range(repeats):
        if before is not None:
            before()
        synchronize(dev)
        if cuda:
            with torch.cuda.device(dev):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            result = call()
            times.append(time.perf_counter() - t0)
    return Timing(times=times, result=result, timer="cuda-events" if cuda else "perf_counter")


# ------------------------------------------------------------------------------ pictures

#: scikit-image's pictures whose grey levels make the benchmark's patches (in this order).
PICTURES = ("astronaut", "brick", "camera", "cat", "chelsea", "clock", "coffee", "coins", "grass", "gravel",
            "moon", "page", "rocket", "text")
#: Patch sets of the benchmark: name -> (patch side, stride, pictures used); about 582k × 64
#: and 250k × 256 on the pictures above.
PATCH_SHAPES = {"p8": (8, 2, 12), "p16": (16, 3, 12)}
#: Where the suites look for the pictures first (``--save-images`` writes it).
DEFAULT_PICTURES = ROOT / ".carry" / "pictures.npz"


def save_pictures(path: str | os.PathLike[str]) -> None:
    """Write the grey levels of :data:`PICTURES` as uint8 arrays to one ``.npz`` (for a machine
    without scikit-image or a network, such as the GPU machine). Needs scikit-image."""
    from skimage import color, data, img_as_ubyte

    arrays = {}
    for name in PICTURES:
        img = getattr(data, name)()
        if img.ndim == 3:
            img = color.rgb2gray(img[..., :3])
        arrays[name] = img_as_ubyte(img)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


_PICTURE_CACHE: dict[str, dict[str, np.ndarray]] = {}


def load_pictures(path: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """The pictures' grey levels (uint8), by name.

    Parameters
    ----------
    path : path or None
        A ``.npz`` written by :func:`save_pictures`. None: :data:`DEFAULT_PICTURES` where it
        exists, else the pictures straight from scikit-image.

    Raises
    ------
    SystemExit
        Neither the file nor scikit-image is at hand.
    """
    key = str(path)
    if key in _PICTURE_CACHE:
        return _PICTURE_CACHE[key]
    if path is None and DEFAULT_PICTURES.exists():
        path = DEFAULT_PICTURES
    if path is not None:
        pictures = dict(np.load(path))
    else:
        try:
            from skimage import color, data, img_as_ubyte
        except ImportError:
            raise SystemExit(f"the image patches need the pictures: run `python bench/harness.py --save-images "
                             f"{DEFAULT_PICTURES.relative_to(ROOT)}` where scikit-image is installed, and carry "
                             "the file here (or pass --pictures FILE)") from None
        pictures = {}
        for name in PICTURES:
            img = getattr(data, name)()
            pictures[name] = img_as_ubyte(color.rgb2gray(img[..., :3]) if img.ndim == 3 else img)
    _PICTURE_CACHE[key] = pictures
    return pictures


def patches(pictures: Mapping[str, np.ndarray], side: int, stride: int, count: int,
            pixels: str = "unit") -> np.ndarray:
    """Every ``side × side`` patch at ``stride`` of the first ``count`` pictures, one row each.

    Parameters
    ----------
    pictures : mapping of str to numpy.ndarray
        :func:`load_pictures`' grey levels.
    side, stride, count : int
        Patch side, step between patches, pictures used (of :data:`PICTURES`).
    pixels : {"unit", "uint8", "linear", "standardised"}
        ``"unit"``: float32 grey levels divided by 255 (on the 1/255 lattice: knng screens
        them with exact products); ``"uint8"``: the grey levels themselves (integer images);
        ``"linear"``: float32 linear-light intensities (the sRGB curve undone), off every
        lattice, with the flat regions' ties kept; ``"standardised"``: each patch of grey
        levels less its mean, divided by its standard deviation (as patch-based methods
        prepare them: off every lattice, contrast removed; flat patches become zero rows).

    Returns
    -------
    numpy.ndarray
        (patches, side²), C-contiguous.
    """
    from numpy.lib.stride_tricks import sliding_window_view

    out = []
    for name in PICTURES[:count]:
        grey = pictures[name]
        if pixels == "uint8":
            img = grey
        elif pixels == "unit":
            img = grey.astype(np.float32) / 255.0
        elif pixels == "linear":
            v = grey.astype(np.float64) / 255.0
            img = np.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4).astype(np.float32)
        elif pixels == "standardised":
            img = grey.astype(np.float64)
        else:
            raise ValueError(f"pixels must be 'unit', 'uint8', 'linear' or 'standardised', got {pixels!r}")
        rows = sliding_window_view(img, (side, side))[::stride, ::stride].reshape(-1, side * side)
        if pixels == "standardised":
            rows = rows - rows.mean(axis=1, keepdims=True)
            spread = rows.std(axis=1, keepdims=True)
            rows = np.divide(rows, spread, out=np.zeros_like(rows), where=spread > 0).astype(np.float32)
        out.append(rows)
    return np.ascontiguousarray(np.concatenate(out))


def daisy_descriptors(pictures: Mapping[str, np.ndarray], step: int = 6) -> np.ndarray:
    """Dense DAISY descriptors of the pictures (scikit-image's ``skimage.feature.daisy``,
    radius 15, three rings of eight histograms of eight orientations: 200 values a row,
    normalised per histogram), every ``step`` pixels of every picture of :data:`PICTURES`.
    Float32, non-negative, un-centred; flat regions give zero histograms.

    Returns
    -------
    numpy.ndarray
        (points, 200) float32.
    """
    from skimage.feature import daisy

    out = []
    for name in PICTURES:
        grid = daisy(pictures[name].astype(np.float64) / 255.0, step=step, radius=15, rings=3, histograms=8,
                     orientations=8)
        out.append(grid.reshape(-1, grid.shape[-1]).astype(np.float32))
    return np.ascontiguousarray(np.concatenate(out))


def camera_patches() -> np.ndarray:
    """The 64,009 8×8 patches (stride 2) of scikit-image's ``camera`` that ``knng demo`` uses,
    float32 in [0, 1] (``knng.demo.camera_patches``): the CPU benchmark's data. Needs
    scikit-image."""
    from knng.demo import camera_patches as demo_patches

    return demo_patches(2, None).astype(np.float32)


# ----------------------------------------------------------------------------- data sets


def gaussian(n: int, d: int, seed: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    """N(0, 1) points, float32 (n, d), drawn on ``device`` by torch's generator of that device
    from ``seed`` (the same numbers on every GPU: Philox)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn((n, d), generator=gen, device=device, dtype=torch.float32)


def _box_sums(maps: np.ndarray, size: int) -> np.ndarray:
    """Sums over every ``size × size`` window of each map (channels first), by integral images."""
    c = np.zeros((maps.shape[0], maps.shape[1] + 1, maps.shape[2] + 1), dtype=np.float64)
    c[:, 1:, 1:] = maps.cumsum(1).cumsum(2)
    return c[:, size:, size:] - c[:, :-size, size:] - c[:, size:, :-size] + c[:, :-size, :-size]


def dense_descriptors(pictures: Mapping[str, np.ndarray], stride: int = 4, cell: int = 4,
                      bins: int = 8) -> np.ndarray:
    """Dense gradient-orientation descriptors of the pictures (SIFT-like, 128 values a row).

    On every 16 × 16 window at ``stride`` of every picture of :data:`PICTURES`: the window's
    4 × 4 cells of ``cell`` pixels, in each the gradient magnitudes summed by orientation into
    ``bins`` bins; the 128 values are normalised to unit length, clipped at 0.2 and normalised
    again (Lowe's recipe). Non-negative, un-centred float32; flat windows give zero rows
    (exact duplicates), textured ones near-duplicates along smooth edges.

    Returns
    -------
    numpy.ndarray
        (windows, 16 · bins) float32.
    """
    out = []
    span = 4 * cell
    offsets = cell * np.arange(4)
    for name in PICTURES:
        img = pictures[name].astype(np.float32) / 255.0
        gy, gx = np.gradient(img)
        magnitude = np.hypot(gx, gy)
        which = np.minimum((np.mod(np.arctan2(gy, gx), 2 * np.pi) / (2 * np.pi) * bins).astype(np.int64), bins - 1)
        maps = np.stack([np.where(which == b, magnitude, 0.0) for b in range(bins)])
        cells = _box_sums(maps, cell)  # (bins, H - cell + 1, W - cell + 1)
        cells[cells < 1e-9] = 0.0  # the integral images' cancellations
        ys = np.arange(0, img.shape[0] - span + 1, stride)
        xs = np.arange(0, img.shape[1] - span + 1, stride)
        yy = ys[:, None, None, None] + offsets[None, None, :, None]
        xx = xs[None, :, None, None] + offsets[None, None, None, :]
        desc = cells[:, yy, xx]  # (bins, Y, X, 4, 4)
        out.append(desc.transpose(1, 2, 3, 4, 0).reshape(-1, 16 * bins))
    x = np.concatenate(out)
    x[np.linalg.norm(x, axis=1) < 1e-6] = 0.0  # flat windows: zero rows
    x = np.minimum(x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12), 0.2)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(x.astype(np.float32))


def embeddings(n: int, d: int = 384, seed: int = 0, clusters: int = 64, rank: int = 16) -> np.ndarray:
    """Sentence-embedding-like vectors, compared by cosine.

    Every vector is a shared mean direction (norm 0.8: real embeddings are far from centred) plus
    its cluster's centre (norm 0.5; cluster sizes Zipf-like) plus a rank-``rank`` offset in its
    cluster's own subspace (norm about 0.35) plus isotropic noise (norm about 0.1), its length
    scaled by a log-normal factor (σ = 0.1).

    Returns
    -------
    numpy.ndarray
        (n, d) float32.
    """
    rng = np.random.default_rng(seed)
    mean = rng.standard_normal(d)
    mean *= 0.8 / np.linalg.norm(mean)
    centres = rng.standard_normal((clusters, d))
    centres *= 0.5 / np.linalg.norm(centres, axis=1, keepdims=True)
    bases = np.stack([np.linalg.qr(rng.standard_normal((d, rank)))[0] for _ in range(clusters)])
    weights = 1.0 / np.arange(1, clusters + 1) ** 0.8
    out = np.empty((n, d), dtype=np.float32)
    for r0 in range(0, n, 1 << 16):
        m = min(n, r0 + (1 << 16)) - r0
        which = rng.choice(clusters, size=m, p=weights / weights.sum())
        z = rng.standard_normal((m, rank)) * (0.35 / math.sqrt(rank))
        offset = np.einsum("mr,mdr->md", z, bases[which])
        noise = rng.standard_normal((m, d)) * (0.1 / math.sqrt(d))
        scale = rng.lognormal(0.0, 0.1, (m, 1))
        out[r0:r0 + m] = (mean + centres[which] + offset + noise) * scale
    return out


def manifold(n: int, d: int = 64, seed: int = 0, noise: float = 0.01) -> np.ndarray:
    """``n`` points of a smooth 3-D manifold in ``d`` dimensions (random Fourier features of
    uniform points in the unit cube, plus N(0, noise²) in every coordinate), float32: the data
    ``bench_diffusion.py`` embeds, and a point cloud whose k-NN radii are all about equal."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0.0, 2.0, (3, d))
    phases = rng.uniform(0.0, 2 * np.pi, d)
    out = np.empty((n, d), dtype=np.float32)
    for r0 in range(0, n, 1 << 18):  # in blocks: 1M × 64 float64 intermediates would be 0.5 GB
        u = rng.uniform(size=(min(n, r0 + (1 << 18)) - r0, 3))
        out[r0:r0 + len(u)] = np.cos(u @ weights + phases) + rng.normal(0.0, noise, (len(u), d))
    return out


def point_cloud(n: int, seed: int = 0, noise: float = 0.002, quantum: float = 0.001,
                origin: tuple[float, float, float] = (1000.0, 2000.0, 50.0)) -> np.ndarray:
    """A scanned scene's 3-D points: 40 planes, spheres and cylinders in a 100 m × 100 m × 20 m
    site whose corner is at ``origin`` (far from 0, as site coordinates are), points sampled
    uniformly on the surfaces (by area), Gaussian noise of ``noise`` m, rounded to ``quantum``
    (millimetres, as scanners store them).

    Returns
    -------
    numpy.ndarray
        (n, 3) float32.
    """
    rng = np.random.default_rng(seed)
    shapes = []
    for _ in range(40):
        kind = rng.choice(["plane", "sphere", "cylinder"], p=[0.5, 0.25, 0.25])
        centre = rng.uniform([0, 0, 0], [100, 100, 20])
        if kind == "plane":
            u, v = np.linalg.qr(rng.standard_normal((3, 2)))[0].T
            w, h = rng.uniform(2, 30, 2)
            shapes.append((kind, centre, (u, v, w, h), w * h))
        elif kind == "sphere":
            r = rng.uniform(0.5, 5)
            shapes.append((kind, centre, r, 4 * np.pi * r * r))
        else:
            r, h = rng.uniform(0.2, 3), rng.uniform(2, 15)
            shapes.append((kind, centre, (r, h), 2 * np.pi * r * h))
    areas = np.array([s[3] for s in shapes])
    counts = rng.multinomial(n, areas / areas.sum())
    parts = []
    for (kind, centre, size, _), m in zip(shapes, counts):
        if kind == "plane":
            u, v, w, h = size
            a, b = rng.uniform(-0.5, 0.5, (2, m))
            pts = centre + (a * w)[:, None] * u + (b * h)[:, None] * v
        elif kind == "sphere":
            dirs = rng.standard_normal((m, 3))
            pts = centre + size * dirs / np.linalg.norm(dirs, axis=1, keepdims=True)
        else:
            r, h = size
            t, z = rng.uniform(0, 2 * np.pi, m), rng.uniform(0, h, m)
            pts = centre + np.stack([r * np.cos(t), r * np.sin(t), z], axis=1)
        parts.append(pts)
    pts = np.concatenate(parts)[rng.permutation(n)]
    pts = pts + rng.normal(0.0, noise, pts.shape) + np.asarray(origin)
    return (np.round(pts / quantum) * quantum).astype(np.float32)


def photon_counts(n: int, seed: int = 0, side: int = 126, atoms: int = 24, photons: float = 2000.0,
                  device: torch.device | None = None) -> np.ndarray | torch.Tensor:
    """Diffraction snapshots of one molecule in random orientations: photon counts on a
    ``side × side`` detector (the thesis's 126 × 126 = 15,876-pixel images; the data lie on a
    3-dimensional manifold, the orientations).

    The molecule is ``atoms`` point scatterers in a unit ball; an image is the intensity
    |Σⱼ exp(i q·R rⱼ)|² on a flat grid of q (|q| ≤ 40), times a form factor exp(−|q|²/400),
    scaled to about ``photons`` photons an image, with a beam stop of radius 3 pixels, then
    Poisson counts. Integer values in float32 (knng screens integer data with exact products).

    ``device``: a GPU makes the images there (the intensities, then Poisson counts drawn by a
    torch generator on it, seeded with ``seed``): the same molecule and orientations as on the
    CPU and the same distribution, other draws, in seconds where NumPy's draws take minutes at
    10⁵ images. Every GPU of one kind draws the same counts from one seed.

    Returns
    -------
    numpy.ndarray or torch.Tensor
        (n, side²) float32 of integers (a tensor on ``device`` when one is given).
    """
    rng = np.random.default_rng(seed)
    pos = rng.standard_normal((atoms, 3))
    pos *= rng.uniform(0, 1, (atoms, 1)) ** (1 / 3) / np.linalg.norm(pos, axis=1, keepdims=True)
    q = np.linspace(-40.0, 40.0, side)
    qq = q[:, None] ** 2 + q[None, :] ** 2
    form = np.exp(-qq / 400.0)
    form[qq < (3 * (q[1] - q[0])) ** 2] = 0.0  # the beam stop
    scale = photons / (atoms * form.sum())  # E|F|² = atoms away from q = 0
    quats = rng.standard_normal((n, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    w, x, y, z = quats.T
    rot = np.stack([np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
                    np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1)], 1)  # (n, 2, 3)
    on_gpu = device is not None and torch.device(device).type == "cuda"
    where = torch.device(device) if on_gpu else torch.device("cpu")
    gen = torch.Generator(device=where).manual_seed(seed) if on_gpu else None
    out = torch.empty((n, side * side), dtype=torch.float32, device=where) if on_gpu else \
        np.empty((n, side * side), dtype=np.float32)
    qt = torch.from_numpy(q).float().to(where)
    form_t = torch.from_numpy(form * scale).float().to(where)
    one = torch.ones((), dtype=torch.float32, device=where)
    step = 4096 if on_gpu else 512
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        p = torch.from_numpy(np.einsum("bij,aj->bia", rot[r0:r1], pos)).float().to(where)  # (b, 2, atoms): x, y
        ex = torch.polar(one, qt[None, :, None] * p[:, 0, None, :])  # (b, side, atoms)
        ey = torch.polar(one, qt[None, :, None] * p[:, 1, None, :])
        intensity = torch.bmm(ex, ey.transpose(1, 2)).abs() ** 2 * form_t
        if on_gpu:
            out[r0:r1] = torch.poisson(intensity, generator=gen).reshape(r1 - r0, -1)
        else:
            out[r0:r1] = rng.poisson(intensity.numpy()).reshape(r1 - r0, -1)
    return out


@dataclass(frozen=True)
class DataSet:
    """One data set of :data:`DATASETS`.

    Attributes
    ----------
    name : str
        Its name on the command lines.
    metric : str
        The metric it is compared by (a name of ``knng.metrics.METRICS``).
    description : str
        What it is, in a line.
    make : callable
        ``make(n, d, seed, pictures)`` → numpy array (n may be None: the set's own size).
    size : int or None
        Rows when no size is asked for (None: the whole set, for picture-made sets).
    pictures : bool
        Whether it is made from the pictures (:func:`load_pictures`).
    make_on : callable or None
        ``make_on(n, seed, device)`` → a tensor of the same set made on ``device`` (a GPU draws
        what a CPU takes minutes for), or None: :func:`dataset_on` copies ``make``'s array.
    """

    name: str
    metric: str
    description: str
    make: Callable[[int | None, int, int, Any], np.ndarray]
    size: int | None
    pictures: bool = False
    make_on: Callable[[int, int, torch.device], torch.Tensor] | None = None


def _patch_set(key: str, pixels: str) -> Callable[[int | None, int, int, Any], np.ndarray]:
    side, stride, count = PATCH_SHAPES[key]
    return lambda n, d, seed, pictures: patches(load_pictures(pictures), side, stride, count, pixels)


#: The data sets by name. Gaussian points take any (n, d); the others have their own d.
DATASETS: dict[str, DataSet] = {s.name: s for s in (
    DataSet("gauss", "euclidean", "N(0, 1) points, float32 (n × d)",
            lambda n, d, seed, pictures: gaussian(n, d or 128, seed).numpy(), 200_000),
    DataSet("camera", "euclidean", "knng demo's 64,009 8×8 camera patches, stride 2, grey / 255 (scikit-image)",
            lambda n, d, seed, pictures: camera_patches(), None),
    DataSet("patches8", "euclidean", "8×8 patches, stride 2, of 12 pictures, grey / 255 (~582k × 64)",
            _patch_set("p8", "unit"), None, True),
    DataSet("patches16", "euclidean", "16×16 patches, stride 3, of 12 pictures, grey / 255 (~250k × 256)",
            _patch_set("p16", "unit"), None, True),
    DataSet("patches8_u8", "euclidean", "the 8×8 patches as uint8 grey levels (integer images)",
            _patch_set("p8", "uint8"), None, True),
    DataSet("patches16_u8", "euclidean", "the 16×16 patches as uint8 grey levels (integer images)",
            _patch_set("p16", "uint8"), None, True),
    DataSet("patches8_linear", "euclidean", "the 8×8 patches in linear light (sRGB undone): off the 1/255 lattice",
            _patch_set("p8", "linear"), None, True),
    DataSet("patches16_linear", "euclidean", "the 16×16 patches in linear light: off the 1/255 lattice",
            _patch_set("p16", "linear"), None, True),
    DataSet("descriptors", "euclidean", "dense SIFT-like gradient descriptors of the 14 pictures (~162k × 128)",
            lambda n, d, seed, pictures: dense_descriptors(load_pictures(pictures)), None, True),
    DataSet("daisy", "euclidean", "dense DAISY descriptors (scikit-image) of the 14 pictures, every 6 pixels (× 200)",
            lambda n, d, seed, pictures: daisy_descriptors(load_pictures(pictures)), None, True),
    DataSet("patches8_std", "euclidean", "the 8×8 patches standardised (each less its mean, over its spread)",
            _patch_set("p8", "standardised"), None, True),
    DataSet("embeddings", "cosine", "clustered, un-centred embedding-like vectors (d = 384 unless asked), cosine",
            lambda n, d, seed, pictures: embeddings(n, d or 384, seed), 200_000),
    DataSet("points", "euclidean", "3-D points of a scanned scene about 2 km from the origin, millimetre steps",
            lambda n, d, seed, pictures: point_cloud(n, seed), 1_000_000),
    DataSet("manifold", "euclidean", "a smooth 3-D manifold in d dimensions (d = 64 unless asked; bench_diffusion's data)",
            lambda n, d, seed, pictures: manifold(n, d or 64, seed), 1_000_000),
    DataSet("far", "euclidean", "N(1000, 1) points, float32 (n × d): far from the origin (the README's example)",
            lambda n, d, seed, pictures: _far(n, d or 128, seed), 100_000),
    DataSet("far_cosine", "cosine", "the same points compared by cosine (the README's first example)",
            lambda n, d, seed, pictures: _far(n, d or 128, seed), 100_000),
    DataSet("far_pearson", "pearson", "the same points compared by Pearson's correlation",
            lambda n, d, seed, pictures: _far(n, d or 128, seed), 100_000),
    DataSet("far_inner", "inner_product", "the same points compared by inner product (the largest first)",
            lambda n, d, seed, pictures: _far(n, d or 128, seed), 100_000),
    DataSet("photons", "euclidean", "photon counts of diffraction snapshots on a 126 × 126 detector (15,876-d)",
            lambda n, d, seed, pictures: photon_counts(n, seed), 20_000,
            make_on=lambda n, seed, device: photon_counts(n, seed, device=device)),
    DataSet("photons_u8", "euclidean", "the photon counts as uint8 (integer images in their own type)",
            lambda n, d, seed, pictures: _as_uint8(photon_counts(n, seed)), 20_000,
            make_on=lambda n, seed, device: _as_uint8(photon_counts(n, seed, device=device))),
)}


def _far(n: int, d: int, seed: int) -> np.ndarray:
    """N(1000, 1) points in float32, drawn as the README's first example draws them."""
    return np.random.default_rng(seed).normal(1000, 1, (n, d)).astype(np.float32)


def _as_uint8(x: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Integer counts as uint8, refused where a count would not fit."""
    if float(x.max()) > 255 or float(x.min()) < 0:
        raise ValueError("counts outside 0..255 do not fit uint8")
    return x.astype(np.uint8) if isinstance(x, np.ndarray) else x.to(torch.uint8)


def dataset_on(name: str, device: torch.device | str, n: int | None = None, d: int | None = None, seed: int = 0,
               pictures: str | os.PathLike[str] | None = None) -> tuple[torch.Tensor, DataSet]:
    """:func:`load_dataset` as a tensor on ``device``: made there where the set can be
    (``DataSet.make_on``, on a GPU), else made as an array and copied."""
    device = torch.device(device)
    spec = DATASETS.get(name)
    if spec is not None and spec.make_on is not None and device.type == "cuda":
        return spec.make_on(n if n is not None else spec.size, seed, device), spec
    x, spec = load_dataset(name, n=n, d=d, seed=seed, pictures=pictures)
    return torch.from_numpy(x).to(device), spec


def load_dataset(name: str, n: int | None = None, d: int | None = None, seed: int = 0,
                 pictures: str | os.PathLike[str] | None = None) -> tuple[np.ndarray, DataSet]:
    """A data set of :data:`DATASETS` as a numpy array, and its description.

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS`.
    n : int or None
        Rows. A set made from the pictures has its own size: a smaller ``n`` takes a random
        subset of its rows (drawn from ``seed``, kept in their order). None: the set's size.
    d : int or None
        Dimension of the sets that take one (Gaussian points: 128 unless given; embeddings:
        384 unless given).
    seed : int
        Seed of the data (and of the subset).
    pictures : path or None
        The pictures' ``.npz`` (:func:`load_pictures`).

    Returns
    -------
    numpy.ndarray, DataSet
    """
    if name not in DATASETS:
        raise SystemExit(f"unknown data set {name!r}; the data sets are {', '.join(DATASETS)}")
    spec = DATASETS[name]
    rows = n if n is not None else spec.size
    x = spec.make(rows, d, seed, pictures)
    if rows is not None and rows < x.shape[0]:
        keep = np.sort(np.random.default_rng(seed).choice(x.shape[0], rows, replace=False))
        x = np.ascontiguousarray(x[keep])
    return x, spec


def flat_rows(x: torch.Tensor | np.ndarray, limit: int = 64, seed: int | None = None) -> torch.Tensor:
    """Up to ``limit`` rows whose values are all equal within 1e-3 (flat image regions: the
    dense near-ties that cost most), the first ones, or a random choice with ``seed``."""
    t = torch.as_tensor(x)
    spread = (t.max(1).values - t.min(1).values).float()
    flat = torch.nonzero(spread < 1e-3).flatten().cpu()
    if seed is not None and flat.numel() > limit:
        flat = flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(seed))]
    return flat[:limit]


# -------------------------------------------------------------------------------- peers


def torch_search(q: torch.Tensor, c: torch.Tensor, k: int, metric: str = "euclidean",
                 chunk: int = 2048) -> torch.Tensor:
    """The baseline of most GPU code: ‖y‖² − 2xᵀy in float32, one ``addmm`` per chunk of query
    rows, then ``torch.topk`` (cosine: the largest products of the normalised vectors). Not
    exact.

    Returns
    -------
    torch.Tensor
        int64 (queries, k) indices.
    """
    q, c = q.float(), c.float()
    if metric == "cosine":
        q = torch.nn.functional.normalize(q, dim=1)
        c = torch.nn.functional.normalize(c, dim=1)
        terms = torch.zeros(c.shape[0], device=c.device)
    else:
        terms = (c * c).sum(1)
    idx = torch.empty((q.shape[0], k), dtype=torch.int64, device=q.device)
    for i in range(0, q.shape[0], chunk):
        scores = torch.addmm(terms, q[i:i + chunk], c.T, alpha=-2.0)
        idx[i:i + chunk] = torch.topk(scores, k, dim=1, largest=False).indices
    return idx


@dataclass
class Peer:
    """A library knng is compared with, in this process.

    Attributes
    ----------
    name : str
        Its name in tables and JSON keys.
    device : str
        ``"cuda"`` or ``"cpu"``: where it runs and where its inputs must be.
    search : callable
        ``search(queries, corpus, k, metric)`` → indices (int64 torch tensor on ``device``),
        inputs float32 torch tensors on ``device``.
    max_k : int or None
        The largest k it takes (FAISS on a GPU: 2,048).
    """

    name: str
    device: str
    search: Callable[[torch.Tensor, torch.Tensor, int, str], torch.Tensor]
    max_k: int | None = None


def _faiss_gpu() -> Peer:
    import faiss
    import faiss.contrib.torch_utils  # noqa: F401  (torch tensors in, torch tensors out)

    res = faiss.StandardGpuResources()

    def search(q: torch.Tensor, c: torch.Tensor, k: int, metric: str) -> torch.Tensor:
        if metric == "cosine":
            q, c = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(c, dim=1)
            return faiss.knn_gpu(res, q, c, k, metric=faiss.METRIC_INNER_PRODUCT)[1]
        return faiss.knn_gpu(res, q, c, k)[1]

    return Peer("faiss", "cuda", search, max_k=2048)


def _cuvs() -> Peer:
    from cuvs.neighbors import brute_force

    def search(q: torch.Tensor, c: torch.Tensor, k: int, metric: str) -> torch.Tensor:
        if metric == "cosine":
            q, c = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(c, dim=1)
        index = brute_force.build(c.contiguous(), metric="inner_product" if metric == "cosine" else "sqeuclidean")
        _, neighbors = brute_force.search(index, q.contiguous(), k)
        return torch.as_tensor(neighbors, device=q.device).long()

    return Peer("cuvs", "cuda", search)


def _faiss_cpu() -> Peer:
    import faiss

    def search(q: torch.Tensor, c: torch.Tensor, k: int, metric: str) -> torch.Tensor:
        qn, cn = q.numpy(), c.numpy()
        if metric == "cosine":
            qn, cn = qn / np.linalg.norm(qn, axis=1, keepdims=True), cn / np.linalg.norm(cn, axis=1, keepdims=True)
            index = faiss.IndexFlatIP(cn.shape[1])
        else:
            index = faiss.IndexFlatL2(cn.shape[1])
        index.add(np.ascontiguousarray(cn, dtype=np.float32))
        return torch.from_numpy(index.search(np.ascontiguousarray(qn, dtype=np.float32), k)[1])

    return Peer("faiss-cpu", "cpu", search)


def _sklearn() -> Peer:
    from sklearn.neighbors import NearestNeighbors

    def search(q: torch.Tensor, c: torch.Tensor, k: int, metric: str) -> torch.Tensor:
        nn = NearestNeighbors(n_neighbors=k, algorithm="brute", metric=metric, n_jobs=-1).fit(c.numpy())
        return torch.from_numpy(nn.kneighbors(q.numpy(), return_distance=False))

    return Peer("sklearn", "cpu", search)


def _torch(device: str) -> Peer:
    return Peer("torch", device, lambda q, c, k, metric: torch_search(q, c, k, metric))


#: The peers a suite may ask for, by device: name -> maker (raises ImportError where absent).
PEER_MAKERS: dict[str, dict[str, Callable[[], Peer]]] = {
    "cuda": {"faiss": _faiss_gpu, "cuvs": _cuvs, "torch": lambda: _torch("cuda")},
    "cpu": {"faiss-cpu": _faiss_cpu, "sklearn": _sklearn, "torch": lambda: _torch("cpu")},
}


def peers(device: torch.device | str, names: Sequence[str] | None = None) -> tuple[list[Peer], list[str]]:
    """The peers importable here, for ``device``.

    Parameters
    ----------
    device : torch.device or str
        ``cuda``: FAISS (``faiss.knn_gpu``), cuVS (``cuvs.neighbors.brute_force``), torch;
        ``cpu``: faiss-cpu (``IndexFlatL2`` / ``IndexFlatIP``), scikit-learn, torch.
    names : sequence of str or None
        The peers wanted (None: all of the device's).

    Returns
    -------
    list of Peer, list of str
        The peers that import, and a note for each one skipped (and why).
    """
    kind = torch.device(device).type
    makers = PEER_MAKERS[kind]
    found, notes = [], []
    for name in (names if names is not None else list(makers)):
        if name not in makers:
            notes.append(f"{name}: not a {kind} peer (the {kind} peers are {', '.join(makers)})")
            continue
        try:
            found.append(makers[name]())
        except Exception as exc:  # noqa: BLE001 - every peer is optional (ImportError, no GPU resources, ...)
            notes.append(f"{name}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    return found, notes


def peer_graph(peer: Peer, x: torch.Tensor, k: int, metric: str = "euclidean") -> torch.Tensor:
    """A peer's k-NN graph, the usual way: a search of the points against themselves with
    k + 1, each point's own index dropped where it appears (else the last neighbour).

    Returns
    -------
    torch.Tensor
        int64 (n, k) indices.
    """
    idx = peer.search(x, x, k + 1, metric).long()
    own = idx == torch.arange(idx.shape[0], device=idx.device)[:, None]
    keep = torch.where(own.any(1, keepdim=True), ~own, torch.arange(k + 1, device=idx.device)[None, :] < k)
    return idx[keep].view(idx.shape[0], k)


def recall(found: torch.Tensor | np.ndarray, truth: torch.Tensor | np.ndarray, chunk: int = 4096) -> float:
    """Share of the true neighbours (``truth``, an exact answer) that ``found`` holds, row by row.

    Returns
    -------
    float
        In [0, 1].
    """
    f = torch.as_tensor(found).long()
    t = torch.as_tensor(truth).long().to(f.device)
    width = int(max(int(f.max()), int(t.max()))) + 1 if f.numel() else 1
    hits = 0
    for i in range(0, t.shape[0], chunk):
        rows = torch.arange(i, min(t.shape[0], i + chunk), device=f.device)[:, None]
        fk = (rows * width + f[i:i + chunk]).flatten()
        tk = (rows * width + t[i:i + chunk]).flatten()
        hits += int(torch.isin(tk, fk).sum())
    return hits / max(1, t.numel())


# ------------------------------------------------------------------------------- oracle


def oracle_rows(n: int, count: int = 128, seed: int = 0, flat: torch.Tensor | None = None) -> torch.Tensor:
    """Rows to check: ``count`` random rows (from ``seed``) and the rows of ``flat``."""
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count]
    return rows if flat is None or flat.numel() == 0 else torch.cat([rows, flat.cpu()])


def check_exact(queries: Any, corpus: Any, result: Any, metric: str = "euclidean", *, exclude_self: bool = False,
                rows: torch.Tensor | None = None, count: int = 128, seed: int = 0,
                device: torch.device | str | None = None, strict: bool = False) -> tuple[bool | None, str]:
    """Check a result against the float64 oracle by differences on a sample of rows.

    ``tests/oracle.py``'s ``assert_exact_chunked``: the neighbours must be the k smallest
    float64 distances computed from the inputs by differences, ties by the smaller index, the
    distances those values rounded.

    Parameters
    ----------
    queries, corpus : array-like
        The call's inputs (a graph: the data twice).
    result : Neighbors, Graph or (indices, distances)
        The answer.
    metric : str
        The metric of the call.
    exclude_self : bool
        A graph: a point is not its own neighbour.
    rows : torch.Tensor or None
        Rows to check; None: ``count`` random rows from ``seed``.
    device : torch.device, str or None
        Where the oracle computes (None: the queries' device).
    strict : bool
        Raise the oracle's AssertionError instead of returning False.

    Returns
    -------
    bool or None, str
        True and "exact on N rows"; False and the oracle's message; None where
        ``tests/oracle.py`` is not importable.
    """
    try:
        from oracle import assert_exact_chunked
    except ImportError:
        return None, "not checked (tests/oracle.py not importable: PYTHONPATH=src:tests)"
    n = int(queries.shape[0])
    if rows is None:
        rows = oracle_rows(n, count, seed)
    rows = rows.unique()
    try:
        assert_exact_chunked(queries, corpus, [result], metric, exclude_self=exclude_self, rows=rows, device=device)
    except AssertionError as exc:
        if strict:
            raise
        return False, "NOT EXACT: " + str(exc)[:300]
    return True, f"exact on {rows.numel()} rows"


# ---------------------------------------------------------------------------- option sets

#: Named option sets (``knng.options`` changes) the A/B and the suites take by name; ``new``
#: (and ``old``) change nothing. Inline sets are written ``option=value`` and joined with
#: ``+`` (``gpu_sample=16384+gpu_search_cols=131072``, ``kernels.row_kth=off``), and names
#: combine the same way (``mmasync+notri``). ``python bench/ab.py --list`` prints them.
OPTION_SETS: dict[str, dict[str, Any]] = {
    "new": {},
    "old": {},
    "pipeline": {"direct_max_scores": 0, "direct_max_scores_gpu": 0},            # small calls through the block pipeline, not the direct path
    # screens: the CUDA C float16 screen's variants, the Triton kernel, the epilogue
    "mmasync": {"wgmma": False},                      # mma.sync, not the wgmma kernel, on a Hopper GPU
    "mmaminima": {"wgmma_minima": False},             # strip minima on the mma.sync kernel
    "twosets": {"wgmma_one_set": False},              # the wgmma kernel's two accumulator sets at K <= 128
    "nomark": {"mark_candidates": False},             # the pre-test tests a half-tile's entries again
    "notri": {"kernels": {"triangle": False}},                     # a part's own block screened whole, not its triangle
    "triton": {"cuda_screen": False},                 # the Triton kernel instead of the CUDA C screen
    "noepilogue": {"gemm_column_terms": False},       # column terms in a pass of their own
    "notf32sample": {"tf32_sample": False},           # the TF32 screen's sample product in float32
    "norest": {"rest_at_once": False},                # a kernel screen's corpus tile by tile
    # kernels forced off (their reference paths)
    "nominima": {"kernels": {"strip_minima": False}},  # seeds by chunk minima of the materialised block
    "norowkth": {"kernels": {"row_kth": False}},       # each row's k-th held bound by one sort
    "noroworder": {"kernels": {"row_order": False}},   # the finish's row order by torch's sorts
    "topkseeds": {"kernels": {"kth_seeds": False}},    # seeds above k = 32 by torch.topk of the strip minima
    "noradius": {"kernels": {"radius": False, "pair_radius": False}},  # radii by torch's float64 operations
    "nopreparation": {"kernels": {"preparation": False}},  # the corpus pass by torch operations
    # stores
    "store": {"hold_on": frozenset(), "tighten_on": frozenset()},  # survivors taken into the store
    "noholdpairs": {"hold_pairs": False},
    "pending2m": {"pending_gpu": 1 << 21},
    "pending8m": {"pending_gpu": 1 << 23},
    "pending16m": {"pending_gpu": 1 << 24},
    # graph methods and parts
    "sym": {"graph_method": "symmetric"},
    "rows": {"graph_method": "rows"},
    "symk": {"graph_rows_tiles_first": False},        # tiles first, but graphs below k = 64 symmetric
    "notiles": {"tiles_first": False},                # a search from a seed sample and a full screen
    "slabs": {"principal_min_gain": 0.0},             # principal frames whatever the slab gain
    "part32k": {"gpu_triangle_max_part": 32768},
    "part48k": {"gpu_triangle_max_part": 49152},
    "part96k": {"gpu_triangle_max_part": 98304},
    "part128k": {"gpu_triangle_max_part": 131072},
    "part256k": {"gpu_triangle_max_part": 262144},
    "small64k": {"gpu_triangle_max_part_small_k": 65536},
    "seed4k": {"own_part_seed": 4096},
    "seed16k": {"own_part_seed": 16384},
    "seed32k": {"own_part_seed": 32768},
    "s16p96": {"own_part_seed": 16384, "gpu_triangle_max_part": 98304},
    "s16p128": {"own_part_seed": 16384, "gpu_triangle_max_part": 131072},
    "s32p256": {"own_part_seed": 32768, "gpu_triangle_max_part": 262144},
    # searches' samples, tiles and chunks
    "cols64k": {"gpu_search_cols": 1 << 16},
    "cols128k": {"gpu_search_cols": 1 << 17},
    "cols512k": {"gpu_search_cols": 1 << 19},
    "rows64k": {"kernel_search_rows": 1 << 16, "kernel_search_pairs": 1 << 23},
    "rows128k": {"kernel_search_rows": 1 << 17, "kernel_search_pairs": 1 << 24},
    "sample16k": {"gpu_sample": 1 << 14},
    "sample32k": {"gpu_sample": 1 << 15},
    "sample96k": {"gpu_sample": 98304},
    "sample128k": {"gpu_sample": 1 << 17},
    "s32c128": {"gpu_sample": 1 << 15, "gpu_search_cols": 1 << 17},
    "s16c64": {"gpu_sample": 1 << 14, "gpu_search_cols": 1 << 16},
    # duplicates
    "fold": {"fold_duplicates": True},
    "nofold": {"fold_duplicates": False},
    # screen precisions (every one exact; the planner's choice overridden)
    **{p: {"screen_precision": p} for p in ("float64", "float32", "tf32", "tf32x3", "float16", "bfloat16", "int8x4")},
}


def _switch(name: str, text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "on", "yes"):
        return True
    if low in ("0", "false", "off", "no"):
        return False
    raise SystemExit(f"{name} takes on/off, got {text!r}")


def _option_value(name: str, text: str) -> Any:
    """``text`` as the type of option ``name``'s default (``knng.Options``)."""
    defaults = {f.name: f for f in dataclasses.fields(knng.Options)}
    if name not in defaults:
        raise SystemExit(f"unknown option {name!r}; knng's options are {', '.join(sorted(defaults))}")
    f = defaults[name]
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    low = text.lower()
    if low in ("none", "null"):
        return None
    if isinstance(default, bool):
        return _switch(name, text)
    if isinstance(default, frozenset):
        return frozenset(v for v in text.split("|") if v)
    if isinstance(default, float):
        return float(text)
    if isinstance(default, int) or default is None:
        try:
            if "<<" in text:  # 1<<17
                base, shift = text.split("<<")
                return int(base) << int(shift)
            return int(text)
        except ValueError:
            return text if default is None else float(text)
    return text


def parse_option_set(text: str) -> dict[str, Any]:
    """The ``knng.options`` changes of a named or inline option set.

    Parameters
    ----------
    text : str
        Names of :data:`OPTION_SETS` and ``option=value`` items joined with ``+``;
        ``kernels.NAME=on|off`` forces one kernel; set-valued options take ``cuda|cpu`` (or
        nothing: the empty set); integers may be written ``1<<17``. Any other single word is
        a label that changes nothing (``old``, ``new``, a commit).

    Returns
    -------
    dict
        The changes (``kernels`` merged).
    """
    changes: dict[str, Any] = {}
    items = [item for item in text.split("+") if item]
    for item in items:
        if "=" in item:
            name, value = item.split("=", 1)
            if name.startswith("kernels."):
                changes.setdefault("kernels", {})[name.split(".", 1)[1]] = _switch(name, value)
            else:
                changes[name] = _option_value(name, value)
        elif item in OPTION_SETS:
            for name, value in OPTION_SETS[item].items():
                if name == "kernels":
                    changes.setdefault("kernels", {}).update(value)
                else:
                    changes[name] = value
        elif len(items) > 1:
            raise SystemExit(f"unknown option set {item!r} in {text!r} (python bench/ab.py --list)")
    return changes


@contextlib.contextmanager
def option_context(changes: Mapping[str, Any]) -> Iterator[None]:
    """``knng.options(**changes)`` for the block; nothing at all for no changes (so that a knng
    older than ``knng.options`` runs the empty set)."""
    if not changes:
        yield
        return
    if not hasattr(knng, "options"):
        raise SystemExit("this knng has no knng.options: only the empty option set runs on it")
    with knng.options(**changes):
        yield


def alternate(variants: Mapping[str, Mapping[str, Any]], call: Callable[[], Any], *,
              device: torch.device | str | None = "auto", repeats: int = 3, warmup: int = 1) -> dict[str, Timing]:
    """Time ``call`` under several option sets in one process, alternating call by call.

    Each set first runs ``warmup`` untimed calls (one set after the other), then ``repeats``
    rounds run every set once, in turn, so that drift within the process (clocks, the
    allocator, a neighbour on the machine) falls on every set alike.

    Parameters
    ----------
    variants : mapping of str to mapping
        Label -> ``knng.options`` changes (:func:`parse_option_set`).
    call : callable
        The call to time, without arguments.
    device : torch.device, str or None
        Where it runs (:func:`time_call`).
    repeats, warmup : int
        Rounds timed, untimed calls of each set first.

    Returns
    -------
    dict of str to Timing
        Every label's times and its last call's result.
    """
    out: dict[str, Timing] = {}
    for label, changes in variants.items():
        with option_context(changes):
            for _ in range(warmup):
                call()
    if warmup:
        _wait_for_kernels()  # (without it every timed call of a 250k × 256 patch graph ran on torch's products)
    for _ in range(repeats):
        for label, changes in variants.items():
            with option_context(changes):
                timing = time_call(call, device=device, warmup=0, repeats=1)
            if label in out:
                out[label].times += timing.times
                out[label].result = timing.result
            else:
                out[label] = timing
    return out


# ------------------------------------------------------------------------------- reports


def report_summary(result: Any) -> dict[str, Any]:
    """The figures of a knng result's report, as JSON values; fields an older knng lacks are
    left out.

    Returns
    -------
    dict
        ``screened_per_row`` and ``evaluations_per_row`` (median, p99, max), ``screen_dtype``,
        ``graph_method``, ``parts``, ``duplicates_folded``, ``exact_products``, ``rows_escalated``,
        ``stages``, and the plan (``plan``).
    """
    report = getattr(result, "report", None)
    if report is None:
        return {}
    out: dict[str, Any] = {}
    for name in ("screened_per_row", "evaluations_per_row", "stages"):
        value = getattr(report, name, None)
        if isinstance(value, dict):
            out[name] = dict(value)
    for name in ("screen_dtype", "parts", "duplicates_folded", "exact_products", "blocks_skipped", "oom_retries",
                 "rows_escalated"):
        with contextlib.suppress(Exception):
            value = getattr(report, name)
            if isinstance(value, (bool, int, float, str)):
                out[name] = value
    plan = getattr(report, "plan", None)
    if plan is not None:
        out["graph_method"] = getattr(plan, "graph_method", None)
        with contextlib.suppress(Exception):
            out["plan"] = plan.as_dict()
    return out


def format_stages(stages: Mapping[str, int] | None) -> str:
    """``report.stages`` in one line (``screen.kernel 12, store.hold 12``); ``-`` for none."""
    if not stages:
        return "-"
    return ", ".join(f"{name} {count}" for name, count in sorted(stages.items()))


def environment(device: torch.device | str) -> dict[str, Any]:
    """Where and when a suite ran: date (UTC), command, device, host, versions (torch, knng,
    Triton, FAISS, cuVS, scikit-learn where importable)."""
    dev = torch.device(device)
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine()),
        "device_type": dev.type,
        "host": platform.node(),
        "cpu_threads": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "knng": getattr(knng, "__version__", None),
        "knng_path": str(Path(knng.__file__).parent),
    }
    for module in ("triton", "faiss", "cuvs", "sklearn"):
        try:
            info[module] = getattr(__import__(module), "__version__", "?")
        except Exception:  # noqa: BLE001 - optional
            info[module] = None
    return info


def write_json(path: str | os.PathLike[str] | None, doc: Any) -> None:
    """Write ``doc`` as indented JSON to ``path`` (nothing for None); folders are made."""
    if not path:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else str(v)))
    print(f"wrote {path}", flush=True)


def common_arguments(parser: argparse.ArgumentParser, *, repeats: int = 3, device: str = "auto") -> None:
    """The flags every suite takes: ``--device``, ``--repeats``, ``--warmup``, ``--quick``,
    ``--out``, ``--pictures``, ``--seed``, ``--threads`` (:func:`apply_threads`)."""
    parser.add_argument("--device", default=device, help=f"auto, cpu, cuda, cuda:N (default {device})")
    parser.add_argument("--repeats", type=int, default=None, help=f"timed calls after the warm-up (default {repeats})")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 1)")
    parser.add_argument("--quick", action="store_true", help="small shapes: a smoke run of seconds on a CPU")
    parser.add_argument("--out", default=None, help="write the raw results to this JSON file")
    parser.add_argument("--pictures", default=None,
                        help=f"the pictures' .npz (default {DEFAULT_PICTURES.relative_to(ROOT)} if it exists, "
                             "else scikit-image)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data (default 0)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch's CPU threads (default: torch's own; 1 with --quick, since a busy shared CPU "
                             "makes torch's threads wait on each other)")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU threads from ``--threads`` (1 for a ``--quick`` smoke run without it)."""
    threads = getattr(args, "threads", None) or (1 if getattr(args, "quick", False) else None)
    if threads:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """``--save-images PATH`` writes the pictures; ``--list`` lists data sets, option sets and peers."""
    ap = argparse.ArgumentParser(description="The benchmark harness of bench/: write the pictures, list what it has.")
    ap.add_argument("--save-images", metavar="PATH", help="write the pictures' grey levels to this .npz and stop "
                    "(needs scikit-image; carry the file to the GPU machine)")
    ap.add_argument("--list", action="store_true", help="list the data sets, option sets and peers importable here")
    args = ap.parse_args(argv)
    if args.save_images:
        save_pictures(args.save_images)
        print(f"wrote {args.save_images}")
        return 0
    if not args.list:
        ap.print_help()
        return 0
    print("data sets:")
    for s in DATASETS.values():
        print(f"  {s.name:17} {s.metric:9} {s.description}")
    print("option sets (knng.options changes; also inline: option=value[+option=value], kernels.NAME=on|off):")
    for name, changes in OPTION_SETS.items():
        print(f"  {name:13} {changes}")
    for kind in ("cuda", "cpu"):
        if kind == "cuda" and not torch.cuda.is_available():
            print("cuda peers: (no CUDA device here)")
            continue
        found, notes = peers(kind)
        print(f"{kind} peers: {', '.join(p.name for p in found) or 'none'}" + "".join(f"\n  {n}" for n in notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
