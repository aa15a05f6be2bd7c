"""ann-benchmarks HDF5 files: search `test` in `train`, and recall against `neighbors` (``--check``)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from knng.cli.errors import CliError
from knng.cli.inputs import ANN_METRICS, AsFloat64Rows, InputFile, explicit_dataset, open_input
from knng.io.readers import HDF5_SUFFIXES

__all__ = ["search_inputs", "ground_truth", "metric_warning", "check_results", "recall", "TIE_RULE"]


def search_inputs(args: argparse.Namespace) -> tuple[InputFile, InputFile, bool]:
    """Open CORPUS and QUERIES; returns (corpus, queries, ann_mode): an ann-benchmarks file alone
    searches its `test` set in its `train` set."""
    from knng.io import describe

    if args.queries is not None:
        return open_input(args.corpus), open_input(args.queries), False
    info = describe(args.corpus)
    if info["format"] not in HDF5_SUFFIXES or explicit_dataset(args.corpus):
        raise CliError(
            f"no QUERIES given: `knng search CORPUS QUERIES -k K` needs a query file (only an "
            f"ann-benchmarks HDF5 file brings its own `test` queries); for the k-NN graph of "
            f"{args.corpus} itself use `knng graph {args.corpus} -k K`"
        )
    missing = [name for name in ("train", "test") if name not in info["datasets"]]
    if missing:
        raise CliError(
            f"{args.corpus} has no {' and no '.join(repr(m) for m in missing)} dataset, so it is not an "
            f"ann-benchmarks file (datasets: {', '.join(sorted(info['datasets']))}); give QUERIES, "
            "e.g. `knng search FILE.hdf5:base FILE.hdf5:queries -k K`"
        )
    return open_input(args.corpus, "train"), open_input(args.corpus, "test"), True


def ground_truth(corpus: InputFile, queries: InputFile) -> Any:
    """The file's `neighbors` dataset for --check, validated (read lazily).

    Its `distances` dataset is not read: whether a differing row is a tie is decided from the
    vectors themselves (:func:`recall`), never from distances the file merely claims.
    """
    from knng.io import read_vectors

    if not (corpus.is_hdf5 and queries.is_hdf5 and corpus.info["path"] == queries.info["path"]
            and queries.info["dataset"] == "test" and "neighbors" in corpus.info["datasets"]):
        raise CliError(
            "--check needs an ann-benchmarks HDF5 file with `train`, `test` and `neighbors` "
            "datasets, searched as a whole (e.g. `knng search FILE.hdf5 -k 10 --check`)"
        )
    path = corpus.info["path"]
    neighbors = read_vectors(path, dataset="neighbors")
    if len(neighbors.shape) != 2 or neighbors.shape[0] != queries.shape[0]:
        raise CliError(f"{path}: `neighbors` has shape {tuple(neighbors.shape)} but `test` has "
                       f"{queries.shape[0]} rows")
    return neighbors


#: knng metrics that rank neighbours as each ann-benchmarks distance does (squared Euclidean
#: orders points as Euclidean), so that the file's ground truth is the right one to compare with.
_SAME_NEIGHBOURS = {"euclidean": ("euclidean", "sqeuclidean"), "angular": ("cosine",)}


def metric_warning(args: argparse.Namespace, corpus: InputFile, metric: str) -> str | None:
    """Why --check would not measure exactness when --metric overrides the file's distance, or None."""
    declared = corpus.info.get("distance") if corpus.is_hdf5 else None
    if args.metric is None or declared is None:
        return None  # the file's own metric, or a file that declares none
    name = str(declared).lower()
    if metric in _SAME_NEIGHBOURS.get(name, ()):
        return None
    known = ANN_METRICS.get(name)
    what = "" if known == name else f" (knng's {known})" if known else " (not a knng metric)"
    return (f"--check compares with the file's ground truth, computed for its distance {str(declared)!r}{what}; "
            f"this run uses {metric}, so the recall does not measure exactness")


def check_results(ours_idx: np.ndarray, neighbors: Any, corpus: InputFile, queries: InputFile, metric: str,
                  warning: str | None) -> dict[str, Any]:
    """knng.json's ``check``: :func:`recall` plus the metrics compared and the warning, if any."""
    check = recall(ours_idx, neighbors, queries.array, corpus.array, metric)
    distance = corpus.info.get("distance")
    check.update(metric=metric, file_distance=None if distance is None else str(distance),
                 metric_warning=warning)
    return check


#: Bytes of float64 vectors gathered at a time to recompute the exact distances of differing rows.
_EXACT_BATCH_BYTES = 32 << 20
#: What ``rows_differ_ties`` counts, recorded beside it.
TIE_RULE = ("a differing row is a tie when the exact float64 distances (from the vectors, in the run's "
            "metric) of the neighbours the file lists equal knng's as multisets and none of the file's "
            "points is closer than knng's k-th")


def recall(ours_idx: np.ndarray, gt_idx: Any, queries: Any, corpus: Any, metric: str) -> dict[str, Any]:
    """recall@k of ``ours_idx`` against the ground truth ``gt_idx``, and a verdict on each row that differs.

    Where a row's neighbours differ from the file's, the exact distances (float64, from the
    vectors, by knng's own definition in ``metric``) from the query to both lists are
    recomputed: the row is a tie (``rows_differ_ties``) when the file's list is an equally
    exact answer, the same multiset of distances with other points among equals;
    otherwise (``rows_differ_not_ties``) the file's ground truth is not exact in this metric,
    or knng's answer is not. ``rows_file_closer`` counts the rows where the file lists a point
    absent from knng's answer and strictly closer than knng's k-th: there knng's answer is
    provably not exact.
    """
    k = min(ours_idx.shape[1], int(gt_idx.shape[1]))
    hits = differ = ties = closer = 0
    chunk = 2048
    for r0 in range(0, ours_idx.shape[0], chunk):
        r1 = min(ours_idx.shape[0], r0 + chunk)
        mine = np.asarray(ours_idx[r0:r1, :k]).astype(np.int64)
        truth = np.asarray(gt_idx[r0:r1, :k]).astype(np.int64)
        found = (mine[:, :, None] == truth[:, None, :]).any(axis=2).sum(axis=1)
        hits += int(found.sum())
        rows = np.flatnonzero(found < k)
        differ += int(rows.size)
        if rows.size:
            t, c = _judge(r0 + rows, mine[rows], truth[rows], queries, corpus, metric)
            ties, closer = ties + t, closer + c
    n = ours_idx.shape[0]
    return {"k": k, "recall": hits / (n * k) if n else 1.0, "rows_differ": differ, "rows_differ_ties": ties,
            "rows_differ_not_ties": differ - ties, "rows_file_closer": closer, "tie_rule": TIE_RULE}


def _judge(rows: np.ndarray, mine: np.ndarray, theirs: np.ndarray, queries: Any, corpus: Any,
           metric: str) -> tuple[int, int]:
    """(ties, rows with a closer file point) among ``rows`` (increasing), whose lists differ."""
    import torch

    from knng.metrics import get_metric

    exact = get_metric(metric).exact
    n, d, k = int(corpus.shape[0]), int(corpus.shape[1]), mine.shape[1]
    listed = (theirs >= 0) & (theirs < n)  # ids a malformed file may hold out of range
    ordered = np.sort(theirs, axis=1)
    valid = listed.all(axis=1) & (ordered[:, 1:] != ordered[:, :-1]).all(axis=1)  # a list repeats no point
    batch = max(1, _EXACT_BATCH_BYTES // (2 * k * max(d, 1) * 8))
    ties = closer = 0
    for b0 in range(0, rows.size, batch):
        b = slice(b0, b0 + batch)
        ids = np.concatenate([mine[b], np.where(listed[b], theirs[b], 0)], axis=1)
        x = torch.from_numpy(_rows64(queries, rows[b]))
        y = torch.from_numpy(_rows64(corpus, ids))
        dist = exact(x, y).numpy()
        ours_d, file_d = dist[:, :k], dist[:, k:]
        absent = ~(theirs[b][:, :, None] == mine[b][:, None, :]).any(axis=2)
        nearer = (listed[b] & absent & (file_d < ours_d.max(axis=1, keepdims=True))).any(axis=1)
        same = valid[b] & (np.sort(ours_d, axis=1) == np.sort(file_d, axis=1)).all(axis=1) & ~nearer
        ties += int(same.sum())
        closer += int(nearer.sum())
    return ties, closer


def _rows64(source: Any, idx: np.ndarray) -> np.ndarray:
    """Rows ``idx`` (any shape) of a vector source as float64, each distinct row read once, in order."""
    from knng.io import take_rows

    if isinstance(source, AsFloat64Rows):  # integers the engine reads as float64: read the file's own
        source = source.source
    return np.asarray(take_rows(source, idx), dtype=np.float64)
