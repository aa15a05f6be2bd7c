"""``knng graph/search --procs N``: the launcher, the files every rank writes, and failures.

A rank that dies, hangs or raises (injected through ``KNNG_FAULT_INJECT``) must make the others
stop within the stated timeout, with an error that names the rank and what it was doing, and
must leave the output folder without results (nothing half-written under the final names).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import knng


def _run(args: list[str], cwd: Path, fault: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("KNNG_FAULT_INJECT", None)
    if fault:
        env["KNNG_FAULT_INJECT"] = fault
    return subprocess.run([sys.executable, "-m", "knng", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def data_file(tmp_path: Path, rng) -> Path:
    x = rng.normal(50.0, 1.0, (3000, 12)).astype(np.float32)
    x[2900:] = x[:100]  # duplicates in other parts
    np.save(tmp_path / "x.npy", x)
    return tmp_path / "x.npy"


@pytest.mark.slow
def test_graph_with_three_processes_equals_one(data_file, tmp_path, seed):
    proc = _run(["graph", str(data_file), "-k", "10", "--procs", "3", "-o", "out3", "--no-progress"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 ranks" in proc.stdout and "blocks per rank" in proc.stdout, proc.stdout
    ref = knng.graph(np.load(data_file), 10, device="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "out3/indices.npy"), ref.indices, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(np.load(tmp_path / "out3/distances.npy"), ref.distances, err_msg=f"seed={seed}")
    meta = json.loads((tmp_path / "out3/knng.json").read_text())
    assert meta["world_size"] == 3 and len(meta["report"]["per_rank"]) == 3
    assert sorted(p.name for p in (tmp_path / "out3").iterdir()) == ["distances.npy", "indices.npy", "knng.json"]


@pytest.mark.slow
def test_search_with_two_processes_equals_one(data_file, tmp_path, rng, seed):
    np.save(tmp_path / "q.npy", rng.normal(50.0, 1.0, (64, 12)).astype(np.float32))
    proc = _run(["search", str(data_file), str(tmp_path / "q.npy"), "-k", "5", "--procs", "2", "-o", "s2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    ref = knng.search(np.load(tmp_path / "q.npy"), np.load(data_file), 5, device="cpu")
    np.testing.assert_array_equal(np.load(tmp_path / "s2/indices.npy"), ref.indices, err_msg=f"seed={seed}")
    np.testing.assert_array_equal(np.load(tmp_path / "s2/distances.npy"), ref.distances, err_msg=f"seed={seed}")


def _assert_no_results(folder: Path) -> None:
    if folder.exists():
        names = [p.name for p in folder.iterdir()]
        assert not any(n in ("indices.npy", "distances.npy", "knng.json") for n in names), names


@pytest.mark.parametrize("fault,culprit,says", [
    ("1:screening:2:exit", 1, "stopped responding"),
    ("0:screening:1:exit", 0, "stopped responding"),
    ("1:finishing:1:raise", 1, "failed while finishing part"),
    ("2:finishing:2:exit", 2, "stopped responding"),
])
@pytest.mark.slow
def test_a_rank_that_dies_or_fails_stops_the_others(data_file, tmp_path, fault, culprit, says):
    t0 = time.monotonic()
    proc = _run(["graph", str(data_file), "-k", "10", "--procs", "3", "-o", "out", "--timeout", "30"], tmp_path,
                fault=fault)
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    survivors = [r for r in range(3) if r != culprit]
    for r in survivors:
        assert f"knng[rank {r}]: error: rank {culprit} {says}" in proc.stderr, proc.stderr
    assert "while " in proc.stderr
    assert took < 60, took  # far less than the 30 s timeout plus start-up: the others noticed at once
    _assert_no_results(tmp_path / "out")


@pytest.mark.slow
def test_a_rank_that_hangs_is_named_within_the_timeout(data_file, tmp_path):
    t0 = time.monotonic()
    proc = _run(["graph", str(data_file), "-k", "10", "--procs", "3", "-o", "out", "--timeout", "3"], tmp_path,
                fault="2:screening:2:hang")
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr
    for r in (0, 1):
        assert f"knng[rank {r}]: error: rank 2 made no progress" in proc.stderr, proc.stderr
    assert "screening block" in proc.stderr and "timeout 3 s" in proc.stderr
    assert "rank 2 was stopped by the launcher" in proc.stderr
    assert took < 40, took
    _assert_no_results(tmp_path / "out")


@pytest.mark.slow
def test_failure_while_writing_leaves_no_results(data_file, tmp_path):
    (tmp_path / "out").mkdir()
    proc = _run(["graph", str(data_file), "-k", "4", "--procs", "2", "-o", "out"], tmp_path, fault="1:writing:1:exit")
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 stopped responding" in proc.stderr
    # Rank 0 had created the files under temporary names; they are gone, no final name exists.
    assert list((tmp_path / "out").iterdir()) == []


def test_refuses_before_starting_ranks(data_file, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/indices.npy").write_bytes(b"old")
    proc = _run(["graph", str(data_file), "-k", "4", "--procs", "2", "-o", "out"], tmp_path)
    assert proc.returncode == 2 and "already holds results" in proc.stderr and "rank" not in proc.stderr
    assert (tmp_path / "out/indices.npy").read_bytes() == b"old"
    proc = _run(["graph", str(data_file), "-k", "4", "--procs", "2", "--device", "cuda"], tmp_path)
    assert proc.returncode == 2 and ("--procs N runs CPU processes" in proc.stderr  # on a GPU machine
                                     or "torch sees no CUDA device" in proc.stderr), proc.stderr
    proc = _run(["graph", str(data_file), "-k", "4", "--procs", "2", "--gpus", "2"], tmp_path)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


@pytest.mark.slow
def test_bad_input_is_reported_by_every_rank(tmp_path, rng):
    x = rng.standard_normal((500, 4))
    x[123, 1] = np.inf
    np.save(tmp_path / "bad.npy", x)
    proc = _run(["graph", str(tmp_path / "bad.npy"), "-k", "3", "--procs", "2"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    for r in (0, 1):
        assert f"knng[rank {r}]: error: data contains NaN or Inf (first in row 123)" in proc.stderr, proc.stderr


def test_gpus_without_cuda_is_a_clear_error(data_file, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _run(["graph", str(data_file), "-k", "4", "--gpus", "2"], tmp_path)
    assert proc.returncode == 2 and "--gpus needs CUDA GPUs" in proc.stderr
