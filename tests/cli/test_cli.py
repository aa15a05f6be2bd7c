"""Tests for the ``knng`` command line (knng.cli) and the demo (knng.demo).

``rng`` comes from ``conftest.py``: a fresh seed per run, printed for reproduction.

Every run goes through ``main([...])`` in-process on small random files in ``tmp_path``; the
results read back from disk are compared with a float64 oracle computed by differences, ties
going to the smaller index (where indices differ, only distances tied to 1e-12 are accepted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

import knng
from knng.cli import main
from knng.io import FORMATS, write_hdf5, write_vectors
from oracle import oracle_search

N, NQ, D, K = 300, 40, 16, 10

# Suffix → dtype its files hold.
FORMAT_DTYPES = {
    ".npy": np.float32,
    ".fvecs": np.float32,
    ".ivecs": np.int32,
    ".bvecs": np.uint8,
    ".fbin": np.float32,
    ".u8bin": np.uint8,
    ".i8bin": np.int8,
    ".ibin": np.int32,
    ".hdf5": np.float32,
    ".h5": np.float64,
}


def _random(rng: np.random.Generator, dtype: type, n: int, d: int = D) -> np.ndarray:
    """Random values of ``dtype``, never all zeros; floats far from the origin on purpose."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return (100.0 + rng.standard_normal((n, d))).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -(10**6)), min(info.max, 10**6)
    return rng.integers(lo, hi, size=(n, d), endpoint=True).astype(dtype)


# --- the oracle ---------------------------------------------------------------------------


def _oracle_distances(queries: np.ndarray, corpus: np.ndarray, metric: str = "euclidean") -> np.ndarray:
    q = np.asarray(queries, dtype=np.float64)
    c = np.asarray(corpus, dtype=np.float64)
    if metric == "euclidean":
        return np.sqrt(((q[:, None, :] - c[None, :, :]) ** 2).sum(axis=-1))
    if metric == "cosine":
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        cn = c / np.linalg.norm(c, axis=1, keepdims=True)
        return 1.0 - (qn[:, None, :] * cn[None, :, :]).sum(axis=-1)
    raise AssertionError(metric)


def _assert_exact(indices: np.ndarray, distances: np.ndarray, dist: np.ndarray, k: int,
                  dist_rtol: float = 1e-6) -> None:
    """Check results against the full oracle distance matrix ``dist`` (self already excluded)."""
    assert indices.dtype == np.int64 and distances.dtype == np.float32
    assert indices.shape == distances.shape == (dist.shape[0], k)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]  # ties → smaller index
    ref = np.take_along_axis(dist, order, axis=1)
    for r in np.flatnonzero((indices != order).any(axis=1)):
        mine = dist[r, indices[r]]
        assert len(set(indices[r].tolist())) == k, f"row {r} repeats a neighbour"
        np.testing.assert_allclose(np.sort(mine), ref[r], rtol=1e-12, atol=0,
                                   err_msg=f"row {r} differs from the oracle beyond ties")
    np.testing.assert_allclose(distances, ref, rtol=dist_rtol, atol=1e-6)


def _load(out: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    return (np.load(out / "indices.npy"), np.load(out / "distances.npy"),
            json.loads((out / "knng.json").read_text()))


# --- writing inputs -----------------------------------------------------------------------


def _write(path: Path, x: np.ndarray) -> str:
    """Write ``x`` with the knng.io writers; returns the spec the CLI takes."""
    if path.suffix in (".hdf5", ".h5"):
        write_hdf5(path, train=x)
        return f"{path}:train"
    write_vectors(path, x)
    return str(path)


def _hand_fvecs(path: Path, x: np.ndarray) -> None:
    """TEXMEX layout written by hand: per row an int32 dimension then d float32 values."""
    with open(path, "wb") as f:
        for row in x.astype("<f4"):
            f.write(np.int32(len(row)).astype("<i4").tobytes())
            f.write(row.tobytes())


def _hand_u8bin(path: Path, x: np.ndarray) -> None:
    """big-ann-benchmarks layout written by hand: int32 n, int32 d, then n*d bytes."""
    with open(path, "wb") as f:
        f.write(np.array(x.shape, dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(x, dtype=np.uint8).tobytes())


def _run(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- search and graph round trips ------------------------------------------------------------


def test_every_format_is_tested() -> None:
    assert set(FORMAT_DTYPES) == set(FORMATS)


@pytest.mark.parametrize("suffix", sorted(FORMAT_DTYPES))
def test_search_round_trip(suffix: str, tmp_path: Path, rng: np.random.Generator,
                           capsys: pytest.CaptureFixture) -> None:
    x = _random(rng, FORMAT_DTYPES[suffix], N)
    q = _random(rng, FORMAT_DTYPES[suffix], NQ)
    corpus = _write(tmp_path / f"corpus{suffix}", x)
    queries = _write(tmp_path / f"queries{suffix}", q)
    out = tmp_path / "out"
    code, stdout, err = _run(["search", corpus, queries, "-k", str(K), "-o", str(out), "--no-progress"], capsys)
    assert code == 0, err
    indices, distances, meta = _load(out)
    _assert_exact(indices, distances, _oracle_distances(q, x), K)
    assert meta["k"] == K and meta["metric"] == "euclidean" and meta["command"] == "search"
    assert meta["inputs"]["corpus"]["shape"] == [N, D]
    assert meta["inputs"]["queries"]["dtype"] == np.dtype(FORMAT_DTYPES[suffix]).name
    assert meta["report"]["rows"] == NQ and "exact_evaluations" in meta["report"]
    assert meta["report"]["plan"]["query_rows"] >= 1
    assert meta["knng_version"] == knng.__version__
    assert f"{NQ} queries" in stdout and "queries/s" in stdout and "exact evaluations" in stdout


@pytest.mark.parametrize("writer,suffix,dtype", [(_hand_fvecs, ".fvecs", np.float32),
                                                  (_hand_u8bin, ".u8bin", np.uint8)])
def test_search_hand_written_files(writer, suffix: str, dtype: type, tmp_path: Path,
                                   rng: np.random.Generator, capsys: pytest.CaptureFixture) -> None:
    x, q = _random(rng, dtype, N), _random(rng, dtype, NQ)
    writer(tmp_path / f"x{suffix}", x)
    writer(tmp_path / f"q{suffix}", q)
    out = tmp_path / "out"
    code, _, err = _run(["search", str(tmp_path / f"x{suffix}"), str(tmp_path / f"q{suffix}"), "-k", "7",
                         "-o", str(out), "--no-progress"], capsys)
    assert code == 0, err
    indices, distances, _ = _load(out)
    _assert_exact(indices, distances, _oracle_distances(q, x), 7)


@pytest.mark.parametrize("suffix", [".npy", ".bvecs", ".ibin", ".hdf5"])
def test_graph_round_trip(suffix: str, tmp_path: Path, rng: np.random.Generator,
                          capsys: pytest.CaptureFixture) -> None:
    x = _random(rng, FORMAT_DTYPES[suffix], N)
    data = _write(tmp_path / f"data{suffix}", x)
    out = tmp_path / "g"
    code, stdout, err = _run(["graph", data, "-k", str(K), "-o", str(out), "--no-progress"], capsys)
    assert code == 0, err
    indices, distances, meta = _load(out)
    dist = _oracle_distances(x, x)
    np.fill_diagonal(dist, np.inf)  # a graph excludes each point itself, by index
    _assert_exact(indices, distances, dist, K)
    assert meta["command"] == "graph" and meta["include_self"] is False
    assert 0.0 <= meta["report"]["pairs_saving"] < 1.0
    assert "blocks computed" in stdout and "points/s" in stdout


def test_graph_npz_then_load_graph(tmp_path: Path, rng: np.random.Generator,
                                   capsys: pytest.CaptureFixture) -> None:
    x = _random(rng, np.float32, 400)
    src = _write(tmp_path / "x.npy", x)
    out = tmp_path / "g"
    code, _, err = _run(["graph", src, "-k", "5", "--format", "npz", "--include-self",
                         "--memory-budget", "200KB", "-o", str(out), "--no-progress"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["graph.npz", "knng.json"]
    g = knng.load_graph(out / "graph.npz")
    assert g.include_self and g.metric == "euclidean"
    _assert_exact(np.asarray(g.indices), np.asarray(g.distances), _oracle_distances(x, x), 5)
    meta = json.loads((out / "knng.json").read_text())
    assert meta["format"] == "npz" and meta["memory_budget_bytes"] == 200_000
    # A small budget forces several parts, so the symmetric plan skips work.
    assert meta["report"]["parts"] > 1 and meta["report"]["pairs_saving"] > 0
    # Refused the second time, accepted with --overwrite.
    assert main(["graph", src, "-k", "5", "--format", "npz", "-o", str(out), "--no-progress"]) == 2
    assert main(["graph", src, "-k", "5", "--format", "npz", "-o", str(out), "--no-progress",
                 "--overwrite"]) == 0
    assert not knng.load_graph(out / "graph.npz").include_self


# --- ann-benchmarks HDF5 ----------------------------------------------------------------------


def _ann_file(path: Path, x: np.ndarray, q: np.ndarray, distance: str, metric: str, k: int = 20) -> None:
    dist = _oracle_distances(q, x, metric)
    order = np.argsort(dist, axis=1, kind="stable")[:, :k]
    write_hdf5(path, train=x, test=q, neighbors=order.astype(np.int32),
               distances=np.take_along_axis(dist, order, axis=1).astype(np.float32), distance=distance)


def test_ann_benchmarks_file_with_check(tmp_path: Path, rng: np.random.Generator,
                                        capsys: pytest.CaptureFixture) -> None:
    x, q = _random(rng, np.float32, N), _random(rng, np.float32, NQ)
    path = tmp_path / "sift-like-euclidean.hdf5"
    _ann_file(path, x, q, "euclidean", "euclidean")
    out = tmp_path / "out"
    code, stdout, err = _run(["search", str(path), "-k", str(K), "--check", "-o", str(out), "--no-progress"],
                             capsys)
    assert code == 0, err
    indices, distances, meta = _load(out)
    _assert_exact(indices, distances, _oracle_distances(q, x), K)
    assert meta["ann_benchmarks_file"] is True
    assert meta["inputs"]["corpus"]["dataset"] == "train" and meta["inputs"]["queries"]["dataset"] == "test"
    assert meta["check"]["recall"] == 1.0 and meta["check"]["k"] == K
    assert f"recall@{K} = 1.000000" in stdout


def test_check_reports_ties_broken_differently(tmp_path: Path, rng: np.random.Generator,
                                               capsys: pytest.CaptureFixture) -> None:
    x, q = _random(rng, np.float32, N), _random(rng, np.float32, NQ)
    x[5] = x[3]  # a duplicate: query 0 below is at distance 0 from both
    q[0] = x[3]
    path = tmp_path / "ties.hdf5"
    _ann_file(path, x, q, "euclidean", "euclidean")
    with h5py.File(path, "r+") as f:  # ground truth that breaks the tie the other way
        f["neighbors"][0, :2] = [5, 3]
    out = tmp_path / "out"
    code, stdout, err = _run(["search", str(path), "-k", "1", "--check", "-o", str(out), "--no-progress"], capsys)
    assert code == 0, err
    indices, distances, meta = _load(out)
    assert indices[0, 0] == 3 and distances[0, 0] == 0
    check = meta["check"]
    assert check["rows_differ"] == 1 and check["rows_differ_ties"] == 1 and check["rows_differ_not_ties"] == 0
    assert check["recall"] == pytest.approx(1 - 1 / NQ)
    assert "1 rows differ: 1 of them an equally exact answer (the same exact distances, ties broken" in stdout


def test_ann_benchmarks_angular_maps_to_cosine(tmp_path: Path, rng: np.random.Generator,
                                               capsys: pytest.CaptureFixture) -> None:
    x = rng.standard_normal((N, D)).astype(np.float32)
    q = rng.standard_normal((NQ, D)).astype(np.float32)
    path = tmp_path / "glove-like-angular.hdf5"
    _ann_file(path, x, q, "angular", "cosine")
    out = tmp_path / "out"
    code, stdout, err = _run(["search", str(path), "-k", "5", "--check", "-o", str(out), "--no-progress"],
                             capsys)
    assert code == 0, err
    indices, distances, meta = _load(out)
    assert meta["metric"] == "cosine"
    _assert_exact(indices, distances, _oracle_distances(q, x, "cosine"), 5, dist_rtol=1e-5)
    assert meta["check"]["recall"] == 1.0
    # --metric overrides the file's attribute.
    out2 = tmp_path / "out2"
    assert main(["search", str(path), "-k", "5", "--metric", "euclidean", "-o", str(out2), "--no-progress"]) == 0
    _assert_exact(*_load(out2)[:2], _oracle_distances(q, x), 5)


def test_ann_benchmarks_unsupported_distance(tmp_path: Path, rng: np.random.Generator,
                                             capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "kosarak-jaccard.hdf5"
    write_hdf5(path, train=_random(rng, np.float32, 50), test=_random(rng, np.float32, 5), distance="jaccard")
    code, _, err = _run(["search", str(path), "-k", "3", "-o", str(tmp_path / "o"), "--no-progress"], capsys)
    assert code == 2
    assert err.startswith("knng: error:") and "jaccard" in err and "--metric" in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()


def test_check_needs_ground_truth(tmp_path: Path, rng: np.random.Generator,
                                  capsys: pytest.CaptureFixture) -> None:
    x = _write(tmp_path / "x.npy", _random(rng, np.float32, 50))
    q = _write(tmp_path / "q.npy", _random(rng, np.float32, 5))
    code, _, err = _run(["search", x, q, "-k", "3", "--check", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and "--check needs" in err



def _ann_file_with(path: Path, x: np.ndarray, q: np.ndarray, neighbors: np.ndarray, distances: np.ndarray,
                   distance: str = "euclidean") -> None:
    write_hdf5(path, train=x, test=q, neighbors=neighbors.astype(np.int32), distances=distances.astype(np.float32),
               distance=distance)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])  # int32: read through AsFloat64Rows
def test_check_counts_exact_answers_with_other_tied_points_as_ties(dtype: type, tmp_path: Path,
                                                                   rng: np.random.Generator,
                                                                   capsys: pytest.CaptureFixture) -> None:
    # Rows whose ground truth is exact but picks the other copy of a duplicated k-th neighbour.
    k, nq = 5, 20
    x, q = _random(rng, dtype, N), _random(rng, dtype, nq)
    before = oracle_search(q, x, k + 1)
    spare = sorted(set(range(N)) - set(before.indices.ravel().tolist()))
    # Three rows with disjoint neighbourhoods (a copy made for one must not enter another's), and
    # for each a copy of its k-th neighbour at an index that no row came near.
    rows: list[int] = []
    for r in range(nq):
        if len(rows) < 3 and not np.isin(before.indices[r], before.indices[rows]).any():
            rows.append(r)
    for r, m in zip(rows, spare):
        x[m] = x[before.indices[r, k - 1]]
    truth = oracle_search(q, x, k + 1)
    neighbors = truth.indices[:, :k].copy()
    for r, m in zip(rows, spare):
        assert {int(truth.indices[r, k - 1]), int(truth.indices[r, k])} == {int(before.indices[r, k - 1]), m}
        neighbors[r, k - 1] = truth.indices[r, k]  # equally exact: the other copy, at the same distance
    path = tmp_path / "ties.hdf5"
    _ann_file_with(path, x, q, neighbors, truth.distances[:, :k])
    out = tmp_path / "out"
    code, stdout, err = _run(["search", str(path), "-k", str(k), "--check", "-o", str(out), "--no-progress"],
                             capsys)
    assert code == 0, err
    indices, _, meta = _load(out)
    np.testing.assert_array_equal(indices, truth.indices[:, :k])  # ties to the smaller index
    check = meta["check"]
    assert check["rows_differ"] == len(rows)
    assert check["rows_differ_ties"] == len(rows) and check["rows_differ_not_ties"] == 0
    assert check["rows_file_closer"] == 0
    assert check["recall"] == pytest.approx(1 - len(rows) / (nq * k))
    assert f"{len(rows)} rows differ: {len(rows)} of them an equally exact answer" in stdout
    assert "warning" not in err


def test_check_does_not_trust_the_files_distances(tmp_path: Path, rng: np.random.Generator,
                                                  capsys: pytest.CaptureFixture) -> None:
    # Ground truth that is wrong in two rows while its `distances` dataset claims knng's exact
    # distances: the rows differ for real, whatever `distances` says.
    k, nq = 5, 20
    x, q = _random(rng, np.float32, N), _random(rng, np.float32, nq)
    truth = oracle_search(q, x, N)
    neighbors = truth.indices[:, :k].copy()
    neighbors[2, k - 1] = truth.indices[2, k]  # the (k+1)-th neighbour instead of the k-th
    neighbors[5, 0] = truth.indices[5, N - 1]  # the farthest point instead of the nearest
    path = tmp_path / "forged.hdf5"
    _ann_file_with(path, x, q, neighbors, truth.distances[:, :k])  # the exact distances: forged
    out = tmp_path / "out"
    code, stdout, err = _run(["search", str(path), "-k", str(k), "--check", "-o", str(out), "--no-progress"],
                             capsys)
    assert code == 0, err
    indices, _, meta = _load(out)
    np.testing.assert_array_equal(indices, truth.indices[:, :k])
    assert "ties broken differently" not in stdout
    check = meta["check"]
    assert check["rows_differ"] == 2
    assert check["rows_differ_ties"] == 0 and check["rows_differ_not_ties"] == 2
    assert check["rows_file_closer"] == 0  # the file's answer is the farther one, knng's is exact
    assert "2 rows differ, none by ties: in 2 the file's answer is not exact in euclidean" in stdout


def test_check_recall_finds_a_closer_point_in_the_file(rng: np.random.Generator) -> None:
    # recall() itself, given a wrong answer: the file's points closer than its k-th prove it wrong.
    from knng.cli.ann_benchmarks import recall
    from knng.cli.search import _check_line

    k = 4
    x, q = _random(rng, np.float32, 200), _random(rng, np.float32, 30)
    truth = oracle_search(q, x, 200)
    ours = truth.indices[:, :k].copy()
    ours[1, 0] = truth.indices[1, 150]  # not exact: a far point instead of the nearest
    ours[4] = truth.indices[4, [0, 1, 2, 4]]  # not exact: the 5th instead of the 4th
    check = recall(ours, truth.indices[:, :k].astype(np.int32), q, x, "euclidean")
    assert check["rows_differ"] == 2 and check["rows_differ_ties"] == 0
    assert check["rows_differ_not_ties"] == 2 and check["rows_file_closer"] == 2
    check["metric"] = "euclidean"
    assert _check_line(check).endswith("2 rows differ, none by ties: in 2 knng's is not (the file lists a point "
                                       "closer than knng's k-th)")
    # And the same file judged in another metric: its answer is no longer an exact one.
    cos = oracle_search(q, x, k, metric="cosine")
    check = recall(cos.indices, truth.indices[:, :k], q, x, "cosine")
    differ = int((np.sort(cos.indices, axis=1) != np.sort(truth.indices[:, :k], axis=1)).any(axis=1).sum())
    assert check["rows_differ"] == differ > 0 and check["rows_differ_ties"] == 0
    assert check["rows_file_closer"] == 0  # knng's cosine answer is exact
    assert _check_line({**check, "metric": "cosine"}).endswith(
        f"{differ} rows differ, none by ties: in {differ} the file's answer is not exact in cosine")
    # Ties and rows that are not, together.
    mixed = {"k": 4, "recall": 0.5, "rows_differ": 5, "rows_differ_ties": 2, "rows_differ_not_ties": 3,
             "rows_file_closer": 1, "metric": "cosine"}
    assert _check_line(mixed).endswith(
        "5 rows differ: 2 of them an equally exact answer (the same exact distances, ties broken differently), "
        "3 not: in 2 the file's answer is not exact in cosine, in 1 knng's is not (the file lists a point closer "
        "than knng's k-th)")


@pytest.mark.parametrize("distance,metric,warned", [
    ("euclidean", None, False), ("euclidean", "euclidean", False), ("euclidean", "sqeuclidean", False),
    ("euclidean", "cosine", True), ("angular", "cosine", False), ("angular", "euclidean", True),
])
def test_check_warns_when_the_metric_is_not_the_files(distance: str, metric: str | None, warned: bool,
                                                      tmp_path: Path, rng: np.random.Generator,
                                                      capsys: pytest.CaptureFixture) -> None:
    x, q = _random(rng, np.float32, N), _random(rng, np.float32, NQ)
    path = tmp_path / f"file-{distance}.hdf5"
    _ann_file(path, x, q, distance, "cosine" if distance == "angular" else "euclidean")
    out = tmp_path / "out"
    extra = [] if metric is None else ["--metric", metric]
    code, stdout, err = _run(["search", str(path), "-k", "5", "--check", "-o", str(out), "--no-progress", *extra],
                             capsys)
    assert code == 0, err
    check = _load(out)[2]["check"]
    assert check["file_distance"] == distance
    if warned:
        lines = [line for line in err.splitlines() if line.startswith("knng: warning:")]
        assert len(lines) == 1, err
        assert f"'{distance}'" in lines[0] and f"uses {metric}" in lines[0]
        assert "does not measure exactness" in lines[0]
        assert check["metric_warning"] == lines[0].removeprefix("knng: warning: ")
    else:
        assert "warning" not in err and check["metric_warning"] is None
        assert check["recall"] == 1.0


@pytest.mark.parametrize("k", ["1000000000000", "0", "-1"])
@pytest.mark.parametrize("command,extra,limit", [
    ("graph", [], f"between 1 and {N - 1} (n − 1 without self)"),
    ("graph", ["--include-self"], f"between 1 and {N} (n with include_self)"),
    ("search", [], f"between 1 and {N} (the corpus size)"),
])
def test_k_out_of_range_names_k_and_its_range(command: str, extra: list[str], limit: str, k: str, tmp_path: Path,
                                              rng: np.random.Generator, capsys: pytest.CaptureFixture) -> None:
    data = _write(tmp_path / "x.npy", _random(rng, np.float32, N))
    inputs = [data] if command == "graph" else [data, _write(tmp_path / "q.npy", _random(rng, np.float32, 7))]
    out = tmp_path / "out"
    code, stdout, err = _run([command, *inputs, "-k", k, "-o", str(out), "--no-progress", *extra], capsys)
    assert code == 2
    assert err.strip() == f"knng: error: k must be {limit}, got {k}"
    assert "free space" not in err and "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["x.npy"] + (["q.npy"] if command == "search" else []))


def test_k_out_of_range_on_an_ann_benchmarks_file(tmp_path: Path, rng: np.random.Generator,
                                                  capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "a.hdf5"
    _ann_file(path, _random(rng, np.float32, 50), _random(rng, np.float32, 5), "euclidean", "euclidean")
    code, _, err = _run(["search", str(path), "-k", "51", "--check", "-o", str(tmp_path / "o"), "--no-progress"],
                        capsys)
    assert code == 2 and err.strip() == "knng: error: k must be between 1 and 50 (the corpus size), got 51"
    assert not (tmp_path / "o").exists()

# --- info ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", sorted(FORMAT_DTYPES))
def test_info_each_format(suffix: str, tmp_path: Path, rng: np.random.Generator,
                          capsys: pytest.CaptureFixture) -> None:
    dtype = np.dtype(FORMAT_DTYPES[suffix])
    n = int(rng.integers(20, 200))
    path = tmp_path / f"data{suffix}"
    _write(path, _random(rng, dtype, n))
    code, stdout, err = _run(["info", str(path)], capsys)
    assert code == 0, err
    assert f"({n}, {D})" in stdout and dtype.name in stdout and suffix in stdout
    assert f"{D * dtype.itemsize} bytes per vector" in stdout
    assert "what knng would do" in stdout and "k-NN graph, k=10" in stdout
    assert "score blocks" in stdout and "outputs" in stdout and "memory budget" in stdout
    if suffix in (".hdf5", ".h5"):
        assert "datasets:" in stdout and "lazily" in stdout
    else:
        assert "memory-mapped" in stdout


def test_info_ann_benchmarks_file(tmp_path: Path, rng: np.random.Generator,
                                  capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "a.hdf5"
    _ann_file(path, _random(rng, np.float32, N), _random(rng, np.float32, NQ), "angular", "cosine")
    code, stdout, _ = _run(["info", str(path), "-k", "4", "--memory-budget", "1MiB"], capsys)
    assert code == 0
    for name in ("train", "test", "neighbors", "distances"):
        assert name in stdout
    assert "'angular' → knng metric cosine" in stdout
    assert f"search of `test` ({NQ} queries) in `train`, k=4" in stdout
    assert "1.0 MiB (from --memory-budget)" in stdout
    code, stdout, _ = _run(["info", f"{path}:test"], capsys)
    assert code == 0 and f"({NQ}, {D})" in stdout and "dataset         test" in stdout


def test_info_does_not_read_the_data(tmp_path: Path, rng: np.random.Generator,
                                     capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.npy"
    _write(path, _random(rng, np.float32, 100))
    import knng.io

    def fail(*args, **kwargs):
        raise AssertionError("info read rows of the file")

    monkeypatch.setattr(knng.io, "iter_row_blocks", fail)
    monkeypatch.setattr(knng.io, "take_rows", fail)
    assert _run(["info", str(path)], capsys)[0] == 0


# --- errors -------------------------------------------------------------------------------------


def test_overwrite_refused_and_files_untouched(tmp_path: Path, rng: np.random.Generator,
                                               capsys: pytest.CaptureFixture) -> None:
    x = _write(tmp_path / "x.npy", _random(rng, np.float32, 80))
    q = _write(tmp_path / "q.npy", _random(rng, np.float32, 9))
    out = tmp_path / "out"
    assert main(["search", x, q, "-k", "3", "-o", str(out), "--no-progress"]) == 0
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    capsys.readouterr()
    code, stdout, err = _run(["search", x, q, "-k", "5", "-o", str(out), "--no-progress"], capsys)
    assert code == 2 and stdout == ""
    assert err.startswith("knng: error:") and "--overwrite" in err and "Traceback" not in err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    assert main(["search", x, q, "-k", "5", "-o", str(out), "--overwrite", "--no-progress"]) == 0
    assert np.load(out / "indices.npy").shape == (9, 5)
    assert sorted(p.name for p in out.iterdir()) == ["distances.npy", "indices.npy", "knng.json"]


@pytest.mark.parametrize("k", ["0", "81", "-3"])
def test_bad_k(k: str, tmp_path: Path, rng: np.random.Generator, capsys: pytest.CaptureFixture) -> None:
    x = _write(tmp_path / "x.npy", _random(rng, np.float32, 80))
    q = _write(tmp_path / "q.npy", _random(rng, np.float32, 9))
    code, _, err = _run(["search", x, q, "-k", k, "-o", str(tmp_path / "o"), "--no-progress"], capsys)
    assert code == 2 and err.startswith("knng: error:") and "k must" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    code, _, err = _run(["graph", x, "-k", "80", "-o", str(tmp_path / "o")], capsys)  # n − 1 = 79
    assert code == 2 and "k must" in err


def test_missing_file_and_bad_format(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nope.fvecs"
    code, _, err = _run(["search", str(missing), str(missing), "-k", "3"], capsys)
    assert code == 2 and "nope.fvecs" in err and err.startswith("knng: error:") and "Traceback" not in err
    code, _, err = _run(["info", str(missing)], capsys)
    assert code == 2 and "nope.fvecs" in err
    (tmp_path / "x.txt").write_text("1 2 3\n")
    code, _, err = _run(["graph", str(tmp_path / "x.txt"), "-k", "3"], capsys)
    assert code == 2 and ".fvecs" in err  # lists the supported formats


def test_int64_npy_is_converted_exactly(tmp_path: Path, rng: np.random.Generator,
                                        capsys: pytest.CaptureFixture) -> None:
    x = rng.integers(-(10**9), 10**9, size=(N, D))  # int64, as np.save of integers gives
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "g"
    code, _, err = _run(["graph", str(tmp_path / "x.npy"), "-k", "6", "-o", str(out), "--no-progress"], capsys)
    assert code == 0, err
    indices, distances, meta = _load(out)
    dist = _oracle_distances(x, x)
    np.fill_diagonal(dist, np.inf)
    _assert_exact(indices, distances, dist, 6)
    assert meta["inputs"]["data"]["dtype"] == "int64" and "converted_to" in meta["inputs"]["data"]
    np.save(tmp_path / "big.npy", np.full((20, 4), 2**60) + np.arange(80).reshape(20, 4))
    code, _, err = _run(["graph", str(tmp_path / "big.npy"), "-k", "3", "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and "2**53" in err


def test_search_without_queries(tmp_path: Path, rng: np.random.Generator,
                                capsys: pytest.CaptureFixture) -> None:
    x = _write(tmp_path / "x.npy", _random(rng, np.float32, 30))
    code, _, err = _run(["search", x, "-k", "3"], capsys)
    assert code == 2 and "QUERIES" in err and "knng graph" in err


def test_bad_device_and_budget(tmp_path: Path, rng: np.random.Generator,
                               capsys: pytest.CaptureFixture) -> None:
    x = _write(tmp_path / "x.npy", _random(rng, np.float32, 30))
    code, _, err = _run(["graph", x, "-k", "3", "--device", "tpu"], capsys)
    assert code == 2 and "device" in err
    code, _, err = _run(["graph", x, "-k", "3", "--memory-budget", "lots"], capsys)
    assert code == 2 and "memory_budget" in err


def test_usage_errors_return_2(capsys: pytest.CaptureFixture) -> None:
    assert main([]) == 2
    assert main(["search", "x.npy", "-k", "ten"]) == 2
    assert main(["frobnicate"]) == 2
    capsys.readouterr()


@pytest.mark.parametrize("command", [[], ["search"], ["graph"], ["info"], ["demo"]])
def test_help(command: list[str], capsys: pytest.CaptureFixture) -> None:
    code, stdout, _ = _run([*command, "--help"], capsys)
    assert code == 0
    assert "examples:" in stdout and "knng " in stdout
    for suffix in FORMATS:
        assert suffix in stdout


def test_version_subprocess() -> None:
    result = subprocess.run([sys.executable, "-m", "knng", "--version"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"knng {knng.__version__}")


# --- start-up: each command pays only for what it uses --------------------------------------------

_HEAVY = ("torch", "sklearn", "scipy", "matplotlib", "triton", "h5py", "umap", "scanpy", "openTSNE")


def _modules_after(code: str, cwd: Path) -> set[str]:
    """The heavy packages imported once ``code`` ran in a fresh interpreter (this checkout's knng)."""
    script = code + "\nimport sys; print('MODULES:', *(m for m in " + repr(_HEAVY) + " if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(Path(knng.__file__).parents[1])})
    assert result.returncode == 0, result.stderr
    return set(result.stdout.rpartition("MODULES:")[2].split())


@pytest.mark.slow
def test_start_up_imports_only_what_each_command_uses(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((20, 3), np.float32))
    assert _modules_after("import knng", tmp_path) == set()
    assert _modules_after("import knng.cli\ntry:\n    knng.cli.main(['--help'])\nexcept SystemExit:\n    pass",
                          tmp_path) == set()
    assert _modules_after("import knng.cli; knng.cli.main(['info', 'x.npy'])", tmp_path) == {"torch"}  # the plan
    assert "sklearn" in _modules_after("import knng; knng.KNeighborsTransformer", tmp_path)


def test_copied_names_agree_with_their_sources() -> None:
    from knng.cli import choices, ranks
    from knng.distributed import launch
    from knng.metrics import METRICS
    from knng.select import available

    assert choices.METRIC_NAMES == tuple(METRICS)
    assert choices.SELECT_NAMES == tuple(available())
    assert ranks.LAUNCH_DEVICE_ENV == launch.LAUNCH_DEVICE_ENV


# --- demo -----------------------------------------------------------------------------------------


def test_demo_small(tmp_path: Path) -> None:
    pytest.importorskip("skimage")
    from knng.demo import run_demo

    lines: list[str] = []
    result = run_demo(tmp_path / "demo", device="cpu", quick=True, print=lines.append, patch_stride=8)
    by_name = {r["name"]: r for r in result["results"]}
    assert set(by_name) == {"digits", "camera-patches"} and not result["skipped"]
    for r in by_name.values():
        assert r["exact_rows"] == r["checked_rows"] == r["n"] and not r["sampled"]
        assert r["distance_max_rel_error"] < 1e-6
        g = knng.load_graph(r["path"])
        assert g.indices.shape == (r["n"], 10)
    assert by_name["digits"]["n"] == 1797
    patches = by_name["camera-patches"]
    assert patches["n"] == 64 * 64
    assert patches["fp32_wrong_rows"] > 0 and patches["fp32_recall"] < 1.0
    assert any("exact rows" in line for line in lines)
    assert (tmp_path / "demo" / "digits-k10.npz").exists()


def test_demo_samples_when_the_oracle_is_slow(tmp_path: Path) -> None:
    pytest.importorskip("skimage")
    from knng.demo import run_demo

    # A zero time budget forces the sampled check on both data sets.
    lines: list[str] = []
    result = run_demo(tmp_path, device="cpu", print=lines.append, patch_stride=16, max_points=600,
                      oracle_budget_s=0.0, sample_rows=300)
    assert len(result["results"]) == 2
    for r in result["results"]:
        assert r["sampled"] and r["exact_rows"] == r["checked_rows"] == 300
    assert any("random sample of 300 rows" in line for line in lines)


def test_demo_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import knng.demo

    seen = {}
    monkeypatch.setattr(knng.demo, "run_demo", lambda **kw: seen.update(kw) or {})
    assert main(["demo", "--quick", "--device", "cpu", "-o", str(tmp_path)]) == 0
    assert seen == {"out_dir": str(tmp_path), "device": "cpu", "quick": True}


def test_demo_without_scikit_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import knng.demo

    def no_skimage(*args, **kwargs):
        raise ImportError("No module named 'skimage'")

    monkeypatch.setattr(knng.demo, "camera_patches", no_skimage)
    lines: list[str] = []
    result = knng.demo.run_demo(tmp_path, device="cpu", print=lines.append)
    assert [r["name"] for r in result["results"]] == ["digits"]
    assert "pip install scikit-image" in result["skipped"]["camera-patches"]
    assert any("skipped" in line and "scikit-image" in line for line in lines)


@pytest.mark.parametrize("budget", [None, "3MB"])
def test_info_json_plan_is_the_plan_the_graph_records(budget, tmp_path: Path, rng: np.random.Generator,
                                                      capsys: pytest.CaptureFixture, monkeypatch) -> None:
    # One planner: `knng info --json` prints the plan `knng graph` then runs and records. The
    # default budgets follow the RAM available at each call, which moves between two calls on a
    # busy machine (the plan then differs, rightly): hold it still.
    import knng.engine.plan as plan

    monkeypatch.setattr(plan, "available_ram", lambda: 8 << 30)
    data = _write(tmp_path / "x.npy", _random(rng, np.float32, 2500))
    extra = [] if budget is None else ["--memory-budget", budget]
    code, stdout, err = _run(["info", data, "-k", "7", "--json", *extra], capsys)
    assert code == 0, err
    planned = json.loads(stdout)["plan"]
    out = tmp_path / "out"
    code, _, err = _run(["graph", data, "-k", "7", "-o", str(out), "--no-progress", *extra], capsys)
    assert code == 0, err
    _, _, meta = _load(out)
    assert meta["report"]["plan"] == planned
    assert planned["operation"] == "graph" and planned["k"] == 7 and planned["parts"] >= 1


def test_info_json_plan_is_the_plan_recorded_after_an_out_of_memory_retry(tmp_path: Path, rng: np.random.Generator,
                                                                          capsys: pytest.CaptureFixture, oom_once,
                                                                          set_options) -> None:
    # The plan `knng info --json` prints is the one a run records as its plan, also when an
    # out-of-memory error made the planner plan again: knng.json keeps both (a graph by rows
    # is a search of the data: its first chunk's seeding fails once).
    set_options(graph_method="rows")
    data = _write(tmp_path / "x.npy", _random(rng, np.float32, 1500))
    budget = ["--memory-budget", "64MB", "--host-memory", "1GB"]  # held still: no RAM-dependent default
    code, stdout, err = _run(["info", data, "-k", "5", "--json", *budget], capsys)
    assert code == 0, err
    planned = json.loads(stdout)["plan"]
    calls = oom_once()
    out = tmp_path / "out"
    code, _, err = _run(["graph", data, "-k", "5", "-o", str(out), "--no-progress", *budget], capsys)
    assert code == 0, err
    _, _, meta = _load(out)
    report = meta["report"]
    assert calls["n"] > 1 and report["oom_retries"] == 1
    assert report["plan"] == planned and planned["graph_method"] == "rows"
    (after,) = report["replans"]  # the plan of the search the graph runs, made again smaller
    searched = planned["search"]
    assert after["operation"] == "search" and after["k"] == searched["k"] == 6
    assert (after["query_rows"], after["corpus_cols"]) in (
        (max(8, searched["query_rows"] // 2), searched["corpus_cols"]),
        (searched["query_rows"], max(8, 6, searched["corpus_cols"] // 2)))


def test_info_on_an_empty_texmex_file_says_it_is_empty(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty.fvecs").write_bytes(b"")
    code, out, _ = _run(["info", str(tmp_path / "empty.fvecs")], capsys)
    assert code == 0 and "empty: no vectors to read" in out and "HDF5" not in out
