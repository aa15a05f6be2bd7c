"""ann-benchmarks HDF5 files: search `test` in `train`, and recall against `neighbors` (``--check``)."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from knng.cli.errors import CliError
from knng.cli.inputs import InputFile, explicit_dataset, open_input
from knng.io.readers import HDF5_SUFFIXES

__all__ = ["search_inputs", "ground_truth", "recall"]


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


def ground_truth(corpus: InputFile, queries: InputFile) -> tuple[Any, Any]:
    """The file's (neighbors, distances-or-None) datasets for --check, validated."""
    from knng.io import read_vectors

    if not (corpus.is_hdf5 and queries.is_hdf5 and corpus.info["path"] == queries.info["path"]
            and queries.info["dataset"] == "test" and "neighbors" in corpus.info["datasets"]):
        raise CliError(
            "--check needs an ann-benchmarks HDF5 file with `train`, `test` and `neighbors` "
            "datasets, searched as a whole (e.g. `knng search FILE.hdf5 -k 10 --check`)"
        )
    path = corpus.info["path"]
    neighbors = read_vectors(path, dataset="neighbors")
    if neighbors.shape[0] != queries.shape[0]:
        raise CliError(f"{path}: `neighbors` has {neighbors.shape[0]} rows but `test` has {queries.shape[0]}")
    distances = read_vectors(path, dataset="distances") if "distances" in corpus.info["datasets"] else None
    return neighbors, distances


def recall(ours_idx: np.ndarray, ours_dist: np.ndarray, gt_idx: Any, gt_dist: Any) -> dict[str, Any]:
    """recall@k against ground truth; how many rows differ, and of those how many share the
    file's k-th distance (ground-truth files may break ties differently)."""
    k = min(ours_idx.shape[1], int(gt_idx.shape[1]))
    hits = 0
    differ = tied = 0
    chunk = 2048
    for r0 in range(0, ours_idx.shape[0], chunk):
        r1 = min(ours_idx.shape[0], r0 + chunk)
        mine = ours_idx[r0:r1, :k]
        truth = np.asarray(gt_idx[r0:r1, :k]).astype(np.int64)
        found = (mine[:, :, None] == truth[:, None, :]).any(axis=2).sum(axis=1)
        hits += int(found.sum())
        rows = found < k
        differ += int(rows.sum())
        if gt_dist is not None and rows.any():
            theirs = np.asarray(gt_dist[r0:r1, k - 1], dtype=np.float64)[rows]
            mine_kth = ours_dist[r0:r1, k - 1].astype(np.float64)[rows]
            tied += int((np.abs(mine_kth - theirs) <= 1e-4 * np.maximum(np.abs(theirs), 1e-6)).sum())
    n = ours_idx.shape[0]
    return {"k": k, "recall": hits / (n * k) if n else 1.0, "rows_differ": differ,
            "rows_differ_same_kth_distance": tied if gt_dist is not None else None}
