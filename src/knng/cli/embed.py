"""``knng embed``: a diffusion map (knng.DiffusionMap) on the exact k-NN graph of DATA."""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from knng.cli.console import device_text, say
from knng.cli.errors import CliError
from knng.cli.inputs import InputFile, metric_for, open_input
from knng.cli.runs import device_and_budget, metadata, output_folder, progress_wanted, refuse_existing, report_dict
from knng.io import METADATA_FILE, OutputFolder, ResultSet

__all__ = ["run", "EMBED_FILES"]

#: The files `knng embed` writes (the PNG only when matplotlib imports).
EMBED_FILES = ("embedding.npy", "eigenvalues.npy", METADATA_FILE, "embedding.png")


def read_labels(spec: str, n: int) -> np.ndarray:
    """One label per point from a .npy file or a text file (one a line); checked against n."""
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--labels: no file {spec}")
    if path.suffix == ".npy":
        labels = np.load(path, allow_pickle=False).ravel()
    else:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        labels = np.array([line for line in lines if line])
        try:
            labels = labels.astype(np.float64)
        except ValueError:
            pass  # category names
    if labels.shape[0] != n:
        raise CliError(f"--labels {spec} holds {labels.shape[0]:,} labels but DATA has {n:,} points")
    return labels


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run ``knng embed`` as parsed into ``args``; returns the exit status."""
    from knng.manifold import check_metric

    data = open_input(args.data)
    metric = check_metric(metric_for(args, data))
    n = data.shape[0]
    if args.k is not None and args.k > n - 1:
        raise ValueError(f"-k {args.k} must be less than the number of points ({n:,}): each point's neighbours "
                         "are the others")
    if args.components > n - 1:
        raise ValueError(f"--components {args.components} must be less than the number of points ({n:,})")
    if args.color_by is not None and args.color_by > args.components:
        raise CliError(f"--color-by {args.color_by}: there are only {args.components} coordinates")
    labels = read_labels(args.labels, n) if args.labels is not None else None
    dev, _ = device_and_budget(args.device, args.memory_budget)
    out = Path(args.out)
    refuse_existing(out, EMBED_FILES, args.overwrite)
    expected = n * args.components * 8 + (1 << 20)
    with output_folder(out, args, expected, argv) as folder:
        return _embed_one_process(args, argv, data, metric, dev, folder, labels)


def _embed_one_process(args: argparse.Namespace, argv: Sequence[str], data: InputFile, metric: str, dev: Any,
                       folder: OutputFolder, labels: np.ndarray | None) -> int:
    import knng
    from knng.manifold import DiffusionMap
    from knng.reports import last_report

    t0 = time.perf_counter()
    dm = DiffusionMap(n_components=args.components, n_neighbors=args.k, metric=metric, epsilon=args.epsilon,
                      alpha=args.alpha, t=args.t, sigma_neighbor=args.sigma_neighbor, eigen_solver=args.eigen_solver,
                      device=args.device, progress=progress_wanted(args))
    # The graph streams DATA from its file; the diffusion map then needs only the graph, with as
    # many columns as DiffusionMap.fit(X) would compute.
    graph = knng.graph(data.array, dm.graph_neighbors(data.shape[0]), metric=metric, device=args.device,
                       memory_budget=args.memory_budget, progress=progress_wanted(args))
    graph_s = time.perf_counter() - t0
    graph_report = last_report()
    with warnings.catch_warnings(record=True):  # said below, from the report
        warnings.simplefilter("always")
        dm.fit(graph)
    report = dm.report_
    report.seconds["graph"] = graph_s
    n = graph.n_points
    meta = metadata("embed", argv, {"data": data}, k=report.n_neighbors, components=args.components, metric=metric,
                    device=str(dev), timings_s=dict(report.seconds), diffusion=report.as_dict(),
                    graph_report=report_dict(graph_report))
    results = ResultSet(folder)
    results.add_array("embedding.npy", dm.embedding_)
    results.add_array("eigenvalues.npy", dm.eigenvalues_)
    plot_note = _embed_plot(results, dm, labels, args)
    meta["plot"] = plot_note or "embedding.png"
    out = results.commit(meta)

    say(f"knng embed: {n:,} points, d={data.shape[1]}, k={report.n_neighbors}, metric {metric}: diffusion map, "
        f"{args.components} coordinates")
    eps = "self-tuning σᵢσⱼ" if report.epsilon is None else f"ε = {report.epsilon:.4g} ({report.epsilon_rule})"
    parts = ("one connected component" if report.components == 1 else
             f"{report.components:,} connected components, each embedded on its own (sizes "
             f"{', '.join(f'{v:,}' for v in report.component_sizes[:5])}{', …' if report.components > 5 else ''})")
    say(f"  kernel: {eps}, α = {report.alpha:g}, t = {report.t:g}; {report.kernel_entries:,} entries "
        f"({report.kernel_neighbors} neighbours a point), {parts}")
    for note in report.warnings:
        say(f"  warning: {note}")
    values = ", ".join(f"{v:.6f}" for v in report.eigenvalues[1:args.components + 1])
    say(f"  eigenvalues λ₁…λ_{args.components}: {values}; spectral gap 1 − λ₁ = {report.spectral_gap:.3g}"
        + (f", gap after λ_{args.components}: {report.eigengap:.3g}" if report.eigengap is not None else ""))
    say(f"  solver {report.solver}: largest residual {max(report.residuals):.1e}, trivial pair off by "
        f"{report.trivial_eigenvalue_error:.1e}")
    sec = report.seconds
    say(f"  device {device_text(dev)}: graph {sec['graph']:.2f} s, kernel {sec['kernel']:.2f} s, eigensolver "
        f"{sec['eigensolver']:.2f} s")
    written = ["embedding.npy", "eigenvalues.npy", METADATA_FILE] + ([] if plot_note else ["embedding.png"])
    say(f"  wrote {out / written[0]}, {', '.join(written[1:])}" + (f" (no plot: {plot_note})" if plot_note else ""))
    return 0


def _embed_plot(results: ResultSet, dm: Any, labels: np.ndarray | None, args: argparse.Namespace) -> str | None:
    """Add the embedding's plot to ``results``; returns why there is none, or None."""
    from knng.plotting import colour_values, embedding_figure, matplotlib_missing

    missing = matplotlib_missing()
    if missing is not None:
        return missing
    names = None
    if labels is not None:
        colour, names = colour_values(labels)
        label = f"labels ({Path(args.labels).name})"
    else:
        j = args.color_by or min(3, dm.embedding_.shape[1])
        colour, label = dm.embedding_[:, j - 1], f"ψ{j}"
    title = (f"knng embed {Path(args.data).name}: diffusion map, k = {dm.n_neighbors_}, α = {args.alpha:g}, "
             f"t = {args.t:g}")
    fig = embedding_figure(dm.embedding_, colour, title=title, colour_label=label, names=names)
    results.add_file("embedding.png", lambda path: fig.savefig(path, format="png", dpi=110))
    return None
