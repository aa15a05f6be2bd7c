"""Checkpoints of distributed runs (knng.distributed.checkpoint): a job killed at any instant
continues with ``--resume`` / ``resume=True`` on the same number of ranks and gives the
uninterrupted answer bit for bit; another number of ranks, or other inputs, are refused; the
output folder never holds a half-written set.

Crashes are real ones: ranks killed by ``os._exit`` at named checkpoint steps (the
``KNNG_TEST_CRASH_AT`` hook, reached by every rank, so the ranks die at different steps) and the
whole launched job (launcher and ranks, one process group) killed by SIGKILL at random instants.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import knng
from knng.io.workarea import CRASH_ENV
from oracle import assert_exact_chunked
from output_folders import ranks_saved_steps, siblings, work_area

HERE = Path(__file__).resolve().parent  # tests/distributed/: the worker beside this file
SRC = str(HERE.parents[1] / "src")
RESULT_NAMES = {"indices.npy", "distances.npy", "knng.json"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, "KNNG_FAULT_INJECT")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return dict(env, **extra)


def _knng(*argv: str, crash: str | None = None, wait: bool = True):
    cmd = [sys.executable, "-m", "knng", *argv, "--no-progress"]
    env = _env(**({CRASH_ENV: crash} if crash else {}))
    if not wait:  # its own process group: the launcher and its ranks are killed together
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _assert_whole_or_none(out: Path) -> bool:
    """The folder holds the complete result set or none of it (and nothing else of ours)."""
    names = {p.name for p in out.iterdir()} if out.exists() else set()
    assert names in (set(), RESULT_NAMES), names
    return bool(names)


@pytest.fixture
def points(tmp_path, rng):
    """Clustered points with exact duplicates."""
    centres = rng.standard_normal((20, 10)) * 3
    x = (centres[rng.integers(0, 20, 4000)] + rng.standard_normal((4000, 10))).astype(np.float32)
    x[3900:3930] = x[:30]
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


def _graph_argv(data: Path, out: Path, *extra: str) -> tuple[str, ...]:
    # A small budget: 21 parts, so a few hundred blocks to save after (interval 0: every one).
    return ("graph", str(data), "-k", "6", "-o", str(out), "--memory-budget", "2MB", "--checkpoint-interval", "0",
            *extra)


def _assert_graph(out: Path, x: np.ndarray) -> None:
    idx, dist = np.load(out / "indices.npy"), np.load(out / "distances.npy")
    ref = knng.graph(x, 6, device="cpu")
    np.testing.assert_array_equal(idx, ref.indices)
    np.testing.assert_array_equal(dist, ref.distances)
    assert_exact_chunked(x, x, [(idx, dist)], exclude_self=True, rows=np.arange(0, len(x), 37))


@pytest.mark.slow
def test_the_python_api_resumes_a_killed_distributed_graph_and_search_bit_for_bit(tmp_path, seed):
    """Ranks killed (os._exit) during a search, then during a graph; each resumed from its checkpoint."""
    sys.path.insert(0, str(HERE))
    from distributed_checkpoint_worker import make_data

    from distributed_checkpoint_worker import SEARCH_CRASH_ENV

    def job(phase: str, port: int, crash: str | None, env: str = CRASH_ENV) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(HERE / "distributed_checkpoint_worker.py"), "2", str(port),
                               str(tmp_path), str(seed), phase], env=_env(**({env: crash} if crash else {})),
                              capture_output=True, text=True, timeout=240)

    port = 29000 + seed % 1000
    # Rank 0 reaches the search's 6th state write (the graph finished and removed its folder).
    assert job("first", port, "state-written:6", SEARCH_CRASH_ENV).returncode != 0
    assert not (tmp_path / "graph-ck").exists() and sorted(p.name for p in (tmp_path / "search-ck").iterdir()) == [
        ".knng-lock", ".knng-work-area", "fingerprint.json", "rank-0-of-2", "rank-1-of-2", "state.json"]
    # The graph runs again from the beginning and dies at its 4th (rank 0) / 4th (rank 1) state write.
    assert job("again", port + 1, "state-written:4").returncode != 0
    assert (tmp_path / "graph-ck" / "rank-1-of-2").is_dir()
    done = job("resume", port + 2, None)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "resume.pkl", "rb") as f:
        results = pickle.load(f)
    x, q = make_data(seed)
    g, s = knng.graph(x, 6, device="cpu"), knng.search(q, x, 5, device="cpu")
    idx, dist, report = results["graph"]
    assert report["checkpoints"]["resumed_from"] > 0 and report["parts"] > 2
    np.testing.assert_array_equal(idx, g.indices)
    np.testing.assert_array_equal(dist, g.distances)
    assert_exact_chunked(x, x, [(idx, dist)], exclude_self=True, rows=np.arange(0, len(x), 29))
    idx, dist, report = results["search"]
    assert report["checkpoints"]["resumed_from"] > 0
    np.testing.assert_array_equal(idx, s.indices)
    np.testing.assert_array_equal(dist, s.distances)
    assert not (tmp_path / "graph-ck").exists() and not (tmp_path / "search-ck").exists()


@pytest.mark.slow
def test_a_killed_procs_job_resumes_on_the_same_number_of_ranks_only(tmp_path, points):
    data, x = points
    out = tmp_path / "out"
    crashed = _knng(*_graph_argv(data, out, "--procs", "2"), crash="state-written:6")
    assert crashed.returncode != 0, crashed.stderr
    assert not out.exists() or not _assert_whole_or_none(out)
    work = work_area(out)
    assert {p.name for p in work.iterdir()} >= {"fingerprint.json", "rank-0-of-2", "rank-1-of-2"}
    assert json.loads((work / "fingerprint.json").read_text())["world"] == 2
    # Another number of ranks: refused, naming both.
    refused = _knng(*_graph_argv(data, out, "--procs", "3", "--resume"))
    assert refused.returncode == 2, refused.stderr
    assert "2 ranks" in refused.stderr and "this run has 3 ranks" in refused.stderr and "--procs 2" in refused.stderr
    # Not asked to resume: the checkpoint is kept, the run refused.
    refused = _knng(*_graph_argv(data, out, "--procs", "2"))
    assert refused.returncode == 2 and "--resume" in refused.stderr and "Traceback" not in refused.stderr
    # One process on a distributed checkpoint: refused too.
    refused = _knng(*_graph_argv(data, out, "--resume"))
    assert refused.returncode == 2 and "different run" in refused.stderr, refused.stderr
    done = _knng(*_graph_argv(data, out, "--procs", "2", "--resume"))
    assert done.returncode == 0, done.stderr
    assert re.search(r"resumed from a checkpoint with \d+ blocks done", done.stdout), done.stdout
    assert siblings(out) == []  # the lock and the work area are gone
    _assert_graph(out, x)


@pytest.mark.slow
def test_a_changed_input_is_refused_and_overwrite_discards_the_checkpoint(tmp_path, points):
    data, x = points
    out = tmp_path / "out"
    assert _knng(*_graph_argv(data, out, "--procs", "2"), crash="state-written:5").returncode != 0
    changed = x.copy()
    changed[5] += 1.0
    np.save(data, changed)
    refused = _knng(*_graph_argv(data, out, "--procs", "2", "--resume"))
    assert refused.returncode == 2 and "different run" in refused.stderr and "inputs" in refused.stderr, refused.stderr
    done = _knng(*_graph_argv(data, out, "--procs", "2", "--overwrite"))
    assert done.returncode == 0 and "discarding the checkpoint" in done.stderr, done.stderr
    assert siblings(out) == []
    _assert_graph(out, changed)


@pytest.mark.slow
def test_a_distributed_search_killed_while_saving_resumes(tmp_path, points, rng):
    data, x = points
    q = rng.standard_normal((300, 10)).astype(np.float32) * 3
    np.save(tmp_path / "q.npy", q)
    out = tmp_path / "s"
    argv = ("search", str(data), str(tmp_path / "q.npy"), "-k", "5", "-o", str(out), "--procs", "2",
            "--checkpoint-interval", "0")
    # Every rank dies right after writing its state of the last chunk, before the commit.
    assert _knng(*argv, crash="state-written:2").returncode != 0
    assert not out.exists() and work_area(out).is_dir()
    done = _knng(*argv, "--resume")
    assert done.returncode == 0, done.stderr
    assert siblings(out) == []
    ref = knng.search(q, x, 5, device="cpu")
    np.testing.assert_array_equal(np.load(out / "indices.npy"), ref.indices)
    np.testing.assert_array_equal(np.load(out / "distances.npy"), ref.distances)


@pytest.mark.slow
def test_kill_9_of_the_whole_job_at_random_instants_then_resume(tmp_path, points):
    data, x = points
    out = tmp_path / "out"
    rand = random.Random(11)
    kills = 0
    # A rank saves after every block (interval 0) and resumes from its own last save: an attempt
    # gets a random part of the job done before its kill.
    for attempt in range(30):
        before = ranks_saved_steps(out, 2)
        proc = _knng(*_graph_argv(data, out, "--procs", "2", *(["--resume"] if attempt else [])), wait=False)
        t0 = time.monotonic()
        # After the ranks have started (a new step saved, or results), at a random instant.
        while proc.poll() is None and ranks_saved_steps(out, 2) == before and not (out / "knng.json").exists() and (
                time.monotonic() - t0 < 120):
            time.sleep(0.01)
        time.sleep(rand.uniform(0.0, 0.4 if attempt < 2 else 2.5))
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        kills += 1
        if _assert_whole_or_none(out):
            break  # killed after its results were committed
        # Every rank's state is whole, of its own last save (the ranks' steps are their own).
        for r, step in enumerate(ranks_saved_steps(out, 2)):
            assert step is None or (isinstance(step, int) and step >= 0), (r, step)
    else:
        pytest.fail("the job never finished")
    if proc.returncode is not None and proc.returncode >= 0:
        stdout, stderr = proc.communicate()
        assert proc.returncode == 0, stderr
        assert siblings(out) == []
    assert kills >= 2, "the kills came too late to test anything"
    _assert_whole_or_none(out)
    _assert_graph(out, x)
