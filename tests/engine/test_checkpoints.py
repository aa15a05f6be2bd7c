"""Checkpoints and resuming (knng.engine.checkpoint, knng.io.workarea): a run killed at any
instant continues with ``--resume`` / ``resume=True`` and gives the uninterrupted result bit for
bit; a checkpoint of a different run is refused; a checkpoint is never dropped silently.

Crashes are real ones: ``knng`` subprocesses killed by ``os._exit`` at named checkpoint steps
(the ``KNNG_TEST_CRASH_AT`` hook) and by ``kill -9`` at random instants. Every final answer is
also checked against the float64 oracle.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import knng
from knng.io import CheckpointExistsError, CheckpointMismatchError, WorkArea
from knng.io.workarea import CRASH_ENV, CheckpointInUseError
from oracle import assert_exact_chunked
from output_folders import saved_step, siblings, work_area

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _knng(*argv: str, env: dict[str, str] | None = None, wait: bool = True):
    full_env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    cmd = [sys.executable, "-m", "knng", *argv, "--no-progress", "--device", "cpu"]
    if not wait:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def points(tmp_path, rng):
    """Clustered data with exact duplicates: 9 parts of a CPU graph (2,048 rows each), 45 blocks."""
    centres = rng.standard_normal((30, 12)) * 4
    x = (centres[rng.integers(0, 30, 17000)] + rng.standard_normal((17000, 12))).astype(np.float32)
    x[100:140] = x[7]  # duplicates: ties broken by index
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


def test_the_python_api_resumes_a_graph_and_a_search_bit_for_bit(tmp_path, points):
    _, x = points
    ref = knng.graph(x, 7, device="cpu")
    folder = tmp_path / "ck"
    kept = knng.graph(x, 7, device="cpu", checkpoint=folder, checkpoint_interval=0, keep_checkpoint=True)
    state = json.loads((folder / "state.json").read_text())
    # Steps: every part's own block, then the blocks in order until the frames skip the rest.
    assert 0 < state["step"] <= kept.report.plan.blocks and state["plan"] == kept.report.plan.as_dict()
    # Everything is done: resuming only runs the finish, and gives the same answer.
    again = knng.graph(x, 7, device="cpu", checkpoint=folder, resume=True)
    assert again.report.checkpoints["resumed_from"] == state["step"]
    for g in (kept, again):
        np.testing.assert_array_equal(g.indices, ref.indices)
        np.testing.assert_array_equal(g.distances, ref.distances)
    assert not folder.exists()  # deleted after success
    # resume=True with no checkpoint starts from the beginning.
    fresh = knng.search(x[:3000], x, 5, device="cpu", checkpoint=folder, resume=True)
    np.testing.assert_array_equal(fresh.indices, knng.search(x[:3000], x, 5, device="cpu").indices)
    # A run shorter than the interval saves no checkpoint beyond its start (and its folder goes).
    assert fresh.report.checkpoints == {"resumed_from": 0, "saves": 0, "seconds": 0.0}


@pytest.mark.slow
@pytest.mark.parametrize("step", ["generation-written", "state-written:4", "state-written:9"])
def test_a_graph_killed_at_each_checkpoint_step_resumes_to_the_same_answer(tmp_path, points, step):
    data, x = points
    out = tmp_path / "out"
    argv = ("graph", str(data), "-k", "6", "-o", str(out), "--checkpoint-interval", "0")
    crashed = _knng(*argv, env={CRASH_ENV: step})
    assert crashed.returncode == 137, crashed.stderr
    assert not out.exists() and work_area(out).is_dir()
    if step == "generation-written":
        # Killed before its first state with progress: nothing to lose, nothing to resume. The
        # next run into the folder starts again, not refused.
        assert saved_step(out) == 0
        done = _knng(*argv)
        assert done.returncode == 0, done.stderr
        assert siblings(out) == []
        np.testing.assert_array_equal(np.load(out / "indices.npy"), knng.graph(x, 6, device="cpu").indices)
        return
    refused = _knng(*argv)  # not asked to resume: the checkpoint is kept, the run refused
    assert refused.returncode == 2 and "--resume" in refused.stderr and "Traceback" not in refused.stderr
    assert "resume=True" not in refused.stderr  # the command line's words, not Python's
    done = _knng(*argv, "--resume")
    assert done.returncode == 0, done.stderr
    assert "resumed from a checkpoint" in done.stdout
    assert siblings(out) == []  # the lock and the work area are gone
    idx, dist = np.load(out / "indices.npy"), np.load(out / "distances.npy")
    ref = knng.graph(x, 6, device="cpu")
    np.testing.assert_array_equal(idx, ref.indices)
    np.testing.assert_array_equal(dist, ref.distances)
    meta = json.loads((out / "knng.json").read_text())
    assert meta["report"]["checkpoints"]["saves"] >= 1
    assert_exact_chunked(x, x, [(idx, dist)], exclude_self=True, rows=np.arange(0, len(x), 41))


@pytest.mark.slow
def test_kill_9_at_random_instants_then_resume_gives_the_uninterrupted_graph(tmp_path, points):
    # Six kills, each at a random instant after the run has saved a step it had not saved before
    # (so every kill lands on a run that made progress), then one run left to finish. The number
    # of kills does not depend on the machine's speed: a loaded machine only makes it slower.
    data, x = points
    out = tmp_path / "out"
    argv = ("graph", str(data), "-k", "6", "-o", str(out), "--checkpoint-interval", "0")
    rand = random.Random(7)
    kills = 0
    proc = None
    for attempt in range(6):
        before = saved_step(out)
        proc = _knng(*argv, *(["--resume"] if attempt else []), wait=False)
        t0 = time.monotonic()
        while proc.poll() is None and saved_step(out) == before and time.monotonic() - t0 < 300:
            time.sleep(0.01)
        time.sleep(rand.uniform(0.0, 0.3 if attempt < 2 else 1.5))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if (out / "indices.npy").exists():
            break  # killed after its results were committed: they are checked below
        # Never an inconsistent folder: no results yet, a readable state naming arrays that exist.
        state = json.loads((work_area(out) / "state.json").read_text())
        if state["step"] > 0:
            assert WorkArea(work_area(out)).load(state).keys() >= {"store_keys", "store_idx", "store_tau"}
        proc = None
    if proc is None:  # the last run was killed: one more, left to finish
        proc = _knng(*argv, "--resume", wait=False)
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode in (0, -signal.SIGKILL), stderr
    assert kills >= 2, "the kills came too late to test anything"
    ref = knng.graph(x, 6, device="cpu")
    np.testing.assert_array_equal(np.load(out / "indices.npy"), ref.indices)
    np.testing.assert_array_equal(np.load(out / "distances.npy"), ref.distances)
    assert proc.returncode != 0 or siblings(out) == []


@pytest.mark.slow
def test_a_search_killed_part_way_resumes_from_its_finished_rows(tmp_path, points, rng):
    data, x = points
    queries = rng.standard_normal((9000, 12)).astype(np.float32)
    queries[:50] = x[:50]
    qpath = tmp_path / "q.npy"
    np.save(qpath, queries)
    out = tmp_path / "out"
    argv = ("search", str(data), str(qpath), "-k", "9", "-o", str(out), "--checkpoint-interval", "0",
            "--memory-budget", "16MB")
    crashed = _knng(*argv, env={CRASH_ENV: "state-written:3"})
    assert crashed.returncode == 137, crashed.stderr
    done_rows = saved_step(out)
    assert 0 < done_rows < len(queries)
    done = _knng(*argv, "--resume")
    assert done.returncode == 0, done.stderr
    assert f"resumed from a checkpoint with {done_rows:,} queries done" in done.stdout
    ref = knng.search(queries, x, 9, device="cpu")
    idx, dist = np.load(out / "indices.npy"), np.load(out / "distances.npy")
    np.testing.assert_array_equal(idx, ref.indices)
    np.testing.assert_array_equal(dist, ref.distances)
    assert_exact_chunked(queries, x, [(idx, dist)], rows=np.r_[0:60, 60:len(queries):97])
    assert siblings(out) == []


@pytest.mark.slow
def test_a_checkpoint_of_a_different_run_is_refused(tmp_path, points):
    data, x = points
    folder = tmp_path / "ck"
    knng.graph(x, 5, device="cpu", checkpoint=folder, keep_checkpoint=True)
    with pytest.raises(CheckpointExistsError, match="resume=True"):
        knng.graph(x, 5, device="cpu", checkpoint=folder)
    with pytest.raises(CheckpointMismatchError, match="k: 5 then, 6 now"):
        knng.graph(x, 6, device="cpu", checkpoint=folder, resume=True)
    with pytest.raises(CheckpointMismatchError, match="metric: euclidean then, cosine now"):
        knng.graph(x, 5, metric="cosine", device="cpu", checkpoint=folder, resume=True)
    with pytest.raises(CheckpointMismatchError, match="operation"):
        knng.search(x, x, 5, device="cpu", checkpoint=folder, resume=True)
    changed = x.copy()
    changed[-1, -1] += 1.0  # one value of the last row: the content hash sees it
    with pytest.raises(CheckpointMismatchError, match="inputs"):
        knng.graph(changed, 5, device="cpu", checkpoint=folder, resume=True)
    with pytest.raises(CheckpointMismatchError, match="float64"):
        knng.graph(x.astype(np.float64), 5, device="cpu", checkpoint=folder, resume=True)
    import knng._version as version

    original = version.VERSION  # the version a run's fingerprint records (knng.__version__ too)
    try:
        version.VERSION = "99.0"
        with pytest.raises(CheckpointMismatchError, match="knng: 0.1.0 then, 99.0 now"):
            knng.graph(x, 5, device="cpu", checkpoint=folder, resume=True)
    finally:
        version.VERSION = original
    assert folder.is_dir()  # nothing refused was lost
    # On the command line: a changed file (same shape) is refused with exit 2, before computing.
    out = tmp_path / "out"
    assert _knng("graph", str(data), "-k", "5", "-o", str(out), env={CRASH_ENV: "state-written:2"},
                 ).returncode == 137
    np.save(data, changed)
    proc = _knng("graph", str(data), "-k", "5", "-o", str(out), "--resume")
    assert proc.returncode == 2 and "different run" in proc.stderr and "Traceback" not in proc.stderr
    assert "content" in proc.stderr or "mtime_ns" in proc.stderr
    # --overwrite replaces what the folder holds: the old run's checkpoint is discarded, said so.
    proc = _knng("graph", str(data), "-k", "5", "-o", str(out), "--overwrite")
    assert proc.returncode == 0 and "discarding the checkpoint" in proc.stderr
    np.testing.assert_array_equal(np.load(out / "indices.npy"), knng.graph(changed, 5, device="cpu").indices)
    assert siblings(out) == []


def test_checkpoint_arguments_are_checked(tmp_path, points):
    data, x = points
    with pytest.raises(ValueError, match="needs a checkpoint folder"):
        knng.graph(x, 3, device="cpu", resume=True)
    with pytest.raises(ValueError, match="checkpoint_interval"):
        knng.graph(x, 3, device="cpu", checkpoint=tmp_path / "c", checkpoint_interval=-1)
    with pytest.raises(TypeError, match="resume must be True or False"):
        knng.graph(x, 3, device="cpu", checkpoint=tmp_path / "c", resume="yes")
    with pytest.raises(TypeError, match="checkpoint must be a folder path"):
        knng.search(x, x, 3, device="cpu", checkpoint=3)
    with pytest.raises(TypeError, match="resume must be True or False"):  # checked before the process group
        knng.graph(x, 3, checkpoint=tmp_path / "c", resume=1, distributed=True)
    proc = _knng("graph", str(data), "-k", "3", "-o", str(tmp_path / "o"), "--host-memory", "20MB", "--procs", "2")
    assert proc.returncode == 2 and "one process only" in proc.stderr
    proc = _knng("graph", str(data), "-k", "3", "-o", str(tmp_path / "o"), "--checkpoint-interval", "-5")
    assert proc.returncode == 2 and "--checkpoint-interval" in proc.stderr


def test_a_work_area_saves_whole_generations_and_growing_arrays(tmp_path):
    area = WorkArea(tmp_path / "w")
    assert area.start({"a": 1}, resume=False) is None
    rows = area.array("rows", (4, 2), "int64")
    rows[:2] = [[1, 2], [3, 4]]
    area.save({"step": 2}, {"store": np.arange(6.0)})
    area.save({"step": 3}, {"store": np.arange(6.0) * 2})
    state = area.state()
    assert state["step"] == 3 and state["generation"] == 2
    assert sorted(p.name for p in area.path.iterdir() if p.is_dir()) == ["g2"]  # the older one deleted
    np.testing.assert_array_equal(area.load(state)["store"], np.arange(6.0) * 2)
    with pytest.raises(CheckpointInUseError):  # one run at a time in an area
        WorkArea(tmp_path / "w").start({"a": 1}, resume=True)
    area.close()
    again = WorkArea(tmp_path / "w")
    assert again.start({"a": 1}, resume=True)["step"] == 3
    np.testing.assert_array_equal(again.array("rows", (4, 2), "int64")[:2], [[1, 2], [3, 4]])
    again.close()
    with pytest.raises(CheckpointMismatchError, match="a: 1 then, 2 now"):
        WorkArea(tmp_path / "w").start({"a": 2}, resume=True)
    again.remove()
    assert not (tmp_path / "w").exists() and list(tmp_path.iterdir()) == []


def test_the_free_space_check_counts_the_checkpoints(tmp_path, points):
    # Room for the results (17,000 × 6 × 12 bytes + 1 MiB) but not for two generations of the
    # stores (2 × 17,000 × (32 · 14 + 33) bytes, 16 MB): refused before computing, saying why.
    from knng.io.outputs import FREE_BYTES_ENV

    data, _ = points
    out = tmp_path / "out"
    proc = _knng("graph", str(data), "-k", "6", "-o", str(out), env={FREE_BYTES_ENV: str(4 << 20)})
    assert proc.returncode == 2, proc.stderr
    assert "not enough free space for the results and the run's checkpoints" in proc.stderr
    assert not out.exists() and siblings(out) == []
    assert _knng("graph", str(data), "-k", "6", "-o", str(out), env={FREE_BYTES_ENV: str(40 << 20)}).returncode == 0


@pytest.mark.slow
def test_the_launchers_free_space_check_counts_the_ranks_checkpoints(tmp_path, points):
    # The same room, with --procs 2: refused before any rank starts, for the ranks' checkpoints
    # (a distributed graph's stores hold every point once; a search's every rank's top k).
    from knng.io.outputs import FREE_BYTES_ENV

    data, _ = points
    out = tmp_path / "out"
    proc = _knng("graph", str(data), "-k", "6", "-o", str(out), "--procs", "2", env={FREE_BYTES_ENV: str(4 << 20)})
    assert proc.returncode == 2, proc.stderr
    assert "not enough free space for the results and the run's checkpoints" in proc.stderr
    assert "rank" not in proc.stderr  # no rank started
    assert not out.exists() and siblings(out) == []
    # A search's ranks each checkpoint every query's k: 2 × 17,000 × (16 · 6 + 16) bytes (3.8 MB)
    # do not fit in 5 MiB beside the results and the margin (1.2 MB + 1 MiB), one process's
    # 1.9 MB do.
    room = {FREE_BYTES_ENV: str(5 << 20)}
    proc = _knng("search", str(data), str(data), "-k", "6", "-o", str(out), "--procs", "2", env=room)
    assert proc.returncode == 2 and "the run's checkpoints" in proc.stderr, proc.stderr
    assert _knng("search", str(data), str(data), "-k", "6", "-o", str(out), env=room).returncode == 0


def test_a_checkpoint_rewound_by_one_save_finds_that_saves_arrays(tmp_path):
    # A distributed rank keeps its previous save until every rank has saved the next step; a
    # run killed in between rewinds to it. Saved in one process (not read back from disk), the
    # previous state must still name its generation, and that generation must still be there.
    import torch

    from knng.engine.checkpoint import Checkpoint

    checkpoint = Checkpoint(WorkArea(tmp_path / "w"), {"a": 1}, resume=False, interval=0)
    for step in (1, 2, 3):
        checkpoint.save({"step": step}, {"store": torch.full((3,), float(step))}, keep_previous=True)
    checkpoint.rewind(2)
    np.testing.assert_array_equal(checkpoint.arrays()["store"], [2.0, 2.0, 2.0])
    checkpoint.area.close()
    resumed = Checkpoint(WorkArea(tmp_path / "w"), {"a": 1}, resume=True, interval=0)
    resumed.rewind(2)
    np.testing.assert_array_equal(resumed.arrays()["store"], [2.0, 2.0, 2.0])


@pytest.mark.slow
def test_a_graph_of_grouped_launches_interrupted_mid_run_resumes_bit_for_bit(tmp_path, points,
                                                                           interrupt_after_saves, set_options):
    # Launches of 3 column parts (plan.group_parts; 9 parts: groups that do not divide the row
    # parts' columns), an error raised right after the 12th save (9 own parts and 3 groups
    # done), then a resume: it continues from a group boundary with the saved plan's groups
    # (the planner would now choose single blocks) and gives the uninterrupted answer.

    _, x = points
    set_options(group_parts=3)
    ref = knng.graph(x, 6, device="cpu")
    assert ref.report.plan.group_parts == 3 and ref.report.parts == 9
    saves = interrupt_after_saves(12)
    folder = tmp_path / "ck"
    with pytest.raises(RuntimeError, match="interrupted"):
        knng.graph(x, 6, device="cpu", checkpoint=folder, checkpoint_interval=0)
    interrupt_after_saves.undo()
    set_options(group_parts=1)
    again = knng.graph(x, 6, device="cpu", checkpoint=folder, resume=True)
    resumed = again.report.checkpoints["resumed_from"]
    assert resumed == saves[-1] > ref.report.parts  # past the own parts, inside the blocks
    assert again.report.plan.group_parts == 3
    np.testing.assert_array_equal(again.indices, ref.indices)
    np.testing.assert_array_equal(again.distances, ref.distances)
    # Which far blocks principal frames skip depends on when each band's reach was refreshed from
    # τ, and a resumed run refreshes at other moments: the count may differ, never the answer. No
    # block is counted twice (the restored count plus the groups after the checkpoint).
    off_diagonal = ref.report.parts * (ref.report.parts - 1) // 2
    assert 0 <= again.report.blocks_skipped < off_diagonal
    assert_exact_chunked(x, x, [(again.indices, again.distances)], exclude_self=True, rows=np.arange(0, len(x), 37))
