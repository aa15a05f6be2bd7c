"""What a reliability battery and a new user found, each reproduced: knng deletes nothing it did not
create, never resumes a damaged checkpoint into a wrong answer, fails a refused write in one line
with the old results intact, leaves nothing behind that blocks the next run, and stops a run
(one process or several) on Ctrl-C or SIGTERM at any instant with one message and no traceback.

Runs are real ``knng`` subprocesses; answers are compared with an uninterrupted run and the
float64 oracle.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import knng
from knng.io import (
    CheckpointDamagedError, CheckpointExistsError, NotAWorkAreaError, OutputFolder, OutputWriteError, ResultSet,
    WorkArea, write_neighbors,
)
from knng.io.workarea import CheckpointInUseError
from oracle import assert_exact_chunked
from output_folders import processes_naming, run_knng, saved_step, siblings, steps_saved, work_area


@pytest.fixture
def points(tmp_path, rng):
    """17,000 clustered points with duplicates: 9 parts of a CPU graph, 45 steps to checkpoint."""
    centres = rng.standard_normal((30, 12)) * 4
    x = (centres[rng.integers(0, 30, 17000)] + rng.standard_normal((17000, 12))).astype(np.float32)
    x[100:140] = x[7]
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


def _digest(state: dict) -> str:
    """The checksum a work area's JSON files carry: SHA-256 of the compact, key-sorted JSON."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- data loss
def test_a_folder_of_the_users_given_as_checkpoint_is_refused_and_left_as_it_was(tmp_path, monkeypatch, rng):
    x = rng.standard_normal((300, 5)).astype(np.float32)
    mine = tmp_path / "userdir"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("three years of notes")
    (mine / "sub" / "data.csv").write_text("1,2,3")
    before = _tree(mine)
    with pytest.raises(NotAWorkAreaError, match="notes.txt") as refused:
        knng.graph(x, 4, device="cpu", checkpoint=mine)
    assert "did not make" in str(refused.value)
    with pytest.raises(NotAWorkAreaError):
        knng.search(x, x, 4, device="cpu", checkpoint=mine, resume=True)
    assert _tree(mine) == before
    # The current folder, as checkpoint=".": refused, nothing in it touched.
    monkeypatch.chdir(mine)
    with pytest.raises(NotAWorkAreaError):
        knng.graph(x, 4, device="cpu", checkpoint=".")
    assert _tree(mine) == before
    # A file is not a folder.
    with pytest.raises(NotAWorkAreaError, match="not a folder"):
        knng.graph(x, 4, device="cpu", checkpoint=mine / "notes.txt")
    # An empty folder is taken for the run and left, empty, when the run is done.
    empty = tmp_path / "empty"
    empty.mkdir()
    graph = knng.graph(x, 4, device="cpu", checkpoint=empty, checkpoint_interval=0)
    np.testing.assert_array_equal(graph.indices, knng.graph(x, 4, device="cpu").indices)
    assert empty.is_dir() and list(empty.iterdir()) == []
    assert _tree(mine) == before


def test_a_work_area_in_use_by_another_run_is_refused(tmp_path, rng):
    x = rng.standard_normal((300, 5)).astype(np.float32)
    holder = WorkArea(tmp_path / "ck")
    holder.start({"run": "another"}, resume=False)
    holder.save({"step": 3, "progress": "3 of 9"})
    with pytest.raises(CheckpointInUseError, match="in use by another run"):
        knng.graph(x, 4, device="cpu", checkpoint=tmp_path / "ck", resume=True)
    holder.close()
    with pytest.raises(CheckpointExistsError):  # released: now it is an earlier run's checkpoint
        knng.graph(x, 4, device="cpu", checkpoint=tmp_path / "ck")


# --------------------------------------------------------------------- damaged checkpoints
def _rewrite_state(area: Path, change) -> None:
    path = area / "state.json"
    state = json.loads(path.read_text())
    state.pop("sha256")
    change(state)
    path.write_text(json.dumps(dict(state, sha256=_digest(state))))  # a consistent forgery


def _generation(area: Path) -> Path:
    return area / f"g{json.loads((area / 'state.json').read_text())['generation']}"


def _zero_distances(area: Path) -> str:
    path = _generation(area) / "store_dist.npy"
    a = np.load(path)
    np.save(path, np.zeros_like(a))  # same size, valid header
    return "store_dist.npy"


def _permute_ids(area: Path) -> str:
    path = _generation(area) / "store_idx.npy"
    a = np.load(path)
    np.save(path, a[np.random.default_rng(0).permutation(len(a))])
    return "store_idx.npy"


def _step_beyond_the_plan(area: Path) -> str:
    _rewrite_state(area, lambda s: s.update(step=10**6))
    return "outside the plan"


def _step_edited(area: Path) -> str:
    path = area / "state.json"
    path.write_text(path.read_text().replace('"step": ', '"step": 1', 1))
    return "state.json does not match"


def _json_cut(area: Path) -> str:
    path = area / "state.json"
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    return "state.json cannot be read"


def _generation_missing(area: Path) -> str:
    import shutil

    generation = _generation(area)
    shutil.rmtree(generation)
    return f"{generation.name}/"


def _fingerprint_cut(area: Path) -> str:
    (area / "fingerprint.json").write_text("{")
    return "fingerprint.json"


@pytest.fixture
def small(tmp_path, rng):
    """5,000 points: a CPU graph of 3 parts, 6 steps."""
    x = rng.standard_normal((5000, 8)).astype(np.float32)
    x[10:20] = x[3]
    path = tmp_path / "small.npy"
    np.save(path, x)
    return path, x


@pytest.mark.parametrize("damage", [_zero_distances, _permute_ids, _step_beyond_the_plan, _step_edited, _json_cut,
                                    _generation_missing, _fingerprint_cut])
def test_a_damaged_graph_checkpoint_is_refused_naming_the_file(tmp_path, small, damage):
    _, x = small
    folder = tmp_path / "ck"
    knng.graph(x, 6, device="cpu", checkpoint=folder, checkpoint_interval=0, keep_checkpoint=True)
    named = damage(folder)
    with pytest.raises(CheckpointDamagedError) as refused:
        knng.graph(x, 6, device="cpu", checkpoint=folder, resume=True)
    message = str(refused.value)
    assert "is damaged" in message and named in message and f"delete {folder}" in message
    assert folder.is_dir()  # refused, not deleted: the user decides


@pytest.mark.slow
def test_a_damaged_checkpoint_on_the_command_line_says_how_to_start_again(tmp_path, small):
    data, x = small
    out = tmp_path / "out"
    argv = ("graph", str(data), "-k", "6", "-o", str(out), "--checkpoint-interval", "0")
    crashed = run_knng(*argv, env={"KNNG_TEST_CRASH_AT": "state-written:3"})
    assert crashed.returncode == 137, crashed.stderr
    _zero_distances(work_area(out))
    refused = run_knng(*argv, "--resume")
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1
    assert "is damaged" in refused.stderr and "store_dist.npy" in refused.stderr and "--overwrite" in refused.stderr
    assert not out.exists()
    # The way out it names: --overwrite discards it and starts again, to the right answer.
    done = run_knng(*argv, "--overwrite")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(out / "indices.npy"), knng.graph(x, 6, device="cpu").indices)
    assert siblings(out) == []


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 3)


def _zero_rows(path: Path) -> None:
    a = np.load(path, mmap_mode="r+")
    a[:40] = 0
    a.flush()


@pytest.mark.parametrize("damage", [_truncate, _zero_rows])
def test_a_damaged_search_checkpoint_is_refused(tmp_path, points, rng, damage):
    _, x = points
    queries = rng.standard_normal((9000, 12)).astype(np.float32)
    folder = tmp_path / "ck"
    with pytest.raises(RuntimeError, match="stopped"):
        _search_stopped_after_saves(queries, x, folder, saves=3)
    assert saved_step_of(folder) > 0
    damage(folder / "indices.npy")
    with pytest.raises(CheckpointDamagedError, match="indices.npy") as refused:
        knng.search(queries, x, 9, device="cpu", checkpoint=folder, resume=True, memory_budget="16MB")
    assert f"delete {folder}" in str(refused.value)
    assert folder.is_dir()  # refused, not deleted: the user decides


def saved_step_of(folder: Path) -> int:
    return json.loads((folder / "state.json").read_text())["step"]


def _search_stopped_after_saves(queries, corpus, folder, saves: int):
    """A search with a checkpoint after every chunk, stopped by an error raised right after the
    ``saves``-th save (as a crash there would)."""
    from knng.engine.checkpoint import Checkpoint

    original, count = Checkpoint.save, []

    def save_then_stop(self, *args, **kwargs):
        original(self, *args, **kwargs)
        count.append(1)
        if len(count) == saves:
            raise RuntimeError("stopped")

    Checkpoint.save = save_then_stop
    try:
        knng.search(queries, corpus, 9, device="cpu", checkpoint=folder, checkpoint_interval=0,
                    memory_budget="16MB")
    finally:
        Checkpoint.save = original


# -------------------------------------------------------------------------- writes refused
def _limited(limit: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_a_file_size_limit_during_the_final_write_fails_in_one_line_with_the_old_results_kept(tmp_path, rng):
    x = rng.standard_normal((4000, 8)).astype(np.float32)
    out = tmp_path / "out"
    write_neighbors(out, np.zeros((3, 2), np.int64), np.zeros((3, 2), np.float32), metadata={"old": True})
    before = _tree(out)
    script = ("import numpy as np, knng.io as io\n"
              f"io.write_neighbors({str(out)!r}, np.ones((4000, 50), np.int64), np.ones((4000, 50), np.float32), "
              "metadata={'new': True}, overwrite=True)\n")
    import sys

    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, preexec_fn=_limited(200_000),
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src")))
    assert proc.returncode == 1 and "OutputWriteError" in proc.stderr
    assert "File too large (EFBIG)" in proc.stderr and str(out) in proc.stderr
    assert _tree(out) == before and siblings(out) == [], siblings(out)
    # The command line: one line, exit 2, nothing half-written, the old results intact.
    data = tmp_path / "x.npy"
    np.save(data, x)
    failed = run_knng("search", str(data), str(data), "-k", "50", "-o", str(out), "--overwrite",
                      preexec_fn=_limited(1_000_000))
    assert failed.returncode == 2, failed.stderr
    assert failed.stderr.startswith("knng: error: could not") and failed.stderr.count("\n") == 1
    assert "File too large (EFBIG)" in failed.stderr
    assert _tree(out) == before and not any(".knng-new-" in name or ".knng-ready-" in name for name in siblings(out))
    assert x.shape == (4000, 8)


def test_a_full_disk_while_writing_results_is_an_output_write_error(tmp_path):
    def fill(path: Path) -> None:
        path.write_bytes(b"x")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with OutputFolder(tmp_path / "out") as folder:
        with pytest.raises(OutputWriteError, match=r"No space left on device \(ENOSPC\)") as failed:
            ResultSet(folder).add_file("graph.npz", fill)
        staging = folder.staging
    assert str(tmp_path / "out") in str(failed.value)
    assert not staging.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_read_only_and_unchangeable_output_folders_are_refused_before_computing(tmp_path, small):
    data, _ = small
    out = tmp_path / "out"
    assert run_knng("graph", str(data), "-k", "3", "-o", str(out)).returncode == 0
    before = _tree(out)
    out.chmod(0o555)
    try:
        t0 = time.monotonic()
        refused = run_knng("graph", str(data), "-k", "4", "-o", str(out), "--overwrite")
        assert refused.returncode == 2 and "read-only" in refused.stderr and "Traceback" not in refused.stderr
        assert _tree(out) == before and oct(out.stat().st_mode & 0o777) == "0o555"
        assert "symmetric plan" not in refused.stdout and time.monotonic() - t0 < 60
    finally:
        out.chmod(0o755)
    # A replaced folder keeps its permissions.
    out.chmod(0o750)
    assert run_knng("graph", str(data), "-k", "4", "-o", str(out), "--overwrite").returncode == 0
    assert out.stat().st_mode & 0o777 == 0o750
    # An immutable folder (where chattr works here): refused before computing, not after.
    if subprocess.run(["chattr", "+i", str(out)], capture_output=True).returncode == 0:
        try:
            refused = run_knng("graph", str(data), "-k", "5", "-o", str(out), "--overwrite")
            assert refused.returncode == 2 and "cannot change output folder" in refused.stderr, refused.stderr
            assert "(EPERM)" in refused.stderr and "symmetric plan" not in refused.stdout
        finally:
            subprocess.run(["chattr", "-i", str(out)], check=True)


def test_the_demo_into_a_folder_it_cannot_write_stops_at_once_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_knng("demo", "--quick", "-o", str(blocker / "demo"), computing=False)
    assert proc.returncode == 2 and proc.stderr.startswith("knng: error: cannot write the demo's files")
    assert "Traceback" not in proc.stderr
    if os.geteuid() != 0:  # root writes into read-only folders
        parent = tmp_path / "ro"
        parent.mkdir(mode=0o555)
        proc = run_knng("demo", "--quick", "-o", str(parent / "demo"), computing=False)
        assert proc.returncode == 2 and "Permission denied" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------- failures leave nothing
@pytest.mark.slow
def test_a_run_failing_on_bad_input_mid_run_leaves_nothing_that_blocks_the_next(tmp_path, small):
    data, x = small
    bad = x.copy()
    bad[-1, 3] = np.nan  # found by the graph's read of the last part, after checkpoints
    bad_path = tmp_path / "bad.npy"
    np.save(bad_path, bad)
    out = tmp_path / "out"
    for extra in ((), ("--procs", "2")):
        failed = run_knng("graph", str(bad_path), "-k", "6", "-o", str(out), "--checkpoint-interval", "0", *extra)
        assert failed.returncode == 2 and "NaN" in failed.stderr, failed.stderr
        assert "Traceback" not in failed.stderr
        assert siblings(out) == [] and not out.exists()
        good = run_knng("graph", str(data), "-k", "6", "-o", str(out), "--overwrite", *extra)
        assert good.returncode == 0, good.stderr
        np.testing.assert_array_equal(np.load(out / "indices.npy"), knng.graph(x, 6, device="cpu").indices)
        assert siblings(out) == []
        out.joinpath("indices.npy").unlink()  # the next round starts from an empty folder
        for name in ("distances.npy", "knng.json"):
            out.joinpath(name).unlink()
        out.rmdir()
    # The API: a checkpoint of a run that met bad input is removed.
    folder = tmp_path / "ck"
    with pytest.raises(ValueError, match="NaN"):
        knng.graph(np.load(bad_path, mmap_mode="r"), 6, device="cpu", checkpoint=folder, checkpoint_interval=0)
    assert not folder.exists()


# ----------------------------------------------------------------------------- interrupts
def _wait_for_module(proc: subprocess.Popen, name: str, seconds: float = 60) -> None:
    """Until ``proc`` has mapped a shared library of ``name`` (it is importing it, or has)."""
    t0 = time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < seconds:
        try:
            if name in Path(f"/proc/{proc.pid}/maps").read_text():
                return
        except OSError:
            pass
        time.sleep(0.002)


def _wait_for_progress(out: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    """Until ``proc`` saves a step past those its work area holds now (a rank's, in a distributed run)."""
    before = steps_saved(out)
    t0 = time.monotonic()
    while proc.poll() is None and not steps_saved(out) > before and time.monotonic() - t0 < seconds:
        time.sleep(0.02)


@pytest.mark.slow
def test_ctrl_c_and_sigterm_stop_one_process_in_one_line_and_resume_continues(tmp_path, points):
    data, x = points
    out = tmp_path / "out"
    argv = ("graph", str(data), "-k", "6", "-o", str(out), "--checkpoint-interval", "0")
    for delay in (0.0, 0.3):  # while knng's modules (NumPy, torch) load
        proc = run_knng(*argv, wait=False)
        _wait_for_module(proc, "numpy")  # knng's first lines ran: Python's own start-up is over
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
        assert not out.exists()
    proc = run_knng(*argv, wait=False)
    _wait_for_progress(out, proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.startswith("knng: interrupted; no results were written; the checkpoint (")
    assert "run the same command with --resume" in stderr and stderr.count("\n") == 1
    assert not out.exists() and saved_step(out) > 0
    proc = run_knng(*argv, "--resume", wait=False)
    _wait_for_progress(out, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode in (143, 0), stderr  # 0: it had finished
    if proc.returncode == 143:
        assert stderr.startswith("knng: terminated;") and "Traceback" not in stderr
        refused = run_knng(*argv)  # a checkpoint with progress: kept, and said how to go on
        assert refused.returncode == 2 and "--resume" in refused.stderr and "resume=True" not in refused.stderr
        assert run_knng(*argv, "--resume").returncode == 0
    idx, dist = np.load(out / "indices.npy"), np.load(out / "distances.npy")
    ref = knng.graph(x, 6, device="cpu")
    np.testing.assert_array_equal(idx, ref.indices)
    np.testing.assert_array_equal(dist, ref.distances)
    assert siblings(out) == []


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_of_a_multi_process_run_with_one_message(tmp_path, points):
    data, x = points
    out = tmp_path / "out"
    argv = ("graph", str(data), "-k", "6", "-o", str(out), "--checkpoint-interval", "0", "--procs", "2")
    for delay in (0.3, 2.5, None):  # the launcher starting, the ranks starting or joining, mid-run
        proc = run_knng(*argv, wait=False)
        if delay is None:
            _wait_for_progress(out, proc)
        else:
            time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, (delay, stderr)
        assert "Traceback" not in stderr and stderr.count("interrupted") == 1 and stderr.count("\n") == 1, stderr
        assert not out.exists()
        time.sleep(0.5)
        assert processes_naming(str(out)) == [], f"ranks left running after a SIGINT at {delay} s"
        leftovers = [name for name in siblings(out) if name != work_area(out).name]
        assert leftovers == [], leftovers
        if WorkArea(work_area(out)).has_progress():
            assert "--resume" in stderr
        else:
            assert not work_area(out).exists()
    done = run_knng(*argv, "--resume")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(out / "indices.npy"), knng.graph(x, 6, device="cpu").indices)
    assert siblings(out) == []


# --------------------------------------------------------------------------- small ones
def test_a_closed_pipe_ends_the_output_quietly(tmp_path, small):
    data, _ = small
    proc = run_knng("info", str(data), "--json", wait=False, computing=False)
    proc.stdout.close()  # `| head` that has read enough
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 141 and stderr == "", stderr


def test_sparse_input_is_read_dense_block_by_block():
    """SciPy sparse matrices (any layout) are densified a block of rows at a time: the same
    answers as their dense arrays, bit for bit, for searches, graphs and radius queries; a
    NaN is named by its row; a torch sparse tensor is refused, naming the argument."""
    import scipy.sparse as sp
    import torch

    x = sp.random(400, 30, density=0.1, format="csr", random_state=0, dtype=np.float32)
    dense = x.toarray()
    for layout in ("csr", "csc", "coo"):
        m = x.asformat(layout)
        for got, want in ((knng.graph(m, 5, device="cpu"), knng.graph(dense, 5, device="cpu")),
                          (knng.search(m[:9] if layout == "csr" else dense[:9], m, 4, metric="cosine", device="cpu"),
                           knng.search(dense[:9], dense, 4, metric="cosine", device="cpu"))):
            np.testing.assert_array_equal(got.indices, want.indices)
            np.testing.assert_array_equal(got.distances, want.distances)
            assert isinstance(got.indices, np.ndarray)
    r, rd = knng.radius(x[:20], x, 0.5, device="cpu"), knng.radius(dense[:20], dense, 0.5, device="cpu")
    for a, b in zip(r, rd):
        np.testing.assert_array_equal(a, b)
    bad = x.tolil()
    bad[123, 4] = np.nan
    with pytest.raises(ValueError, match=r"data.*row 123"):
        knng.graph(bad.tocsr(), 3, device="cpu")
    with pytest.raises(TypeError, match=r"dtype"):
        knng.graph(sp.random(50, 8, density=0.3, format="csr", random_state=0, dtype=np.int64), 3)
    with pytest.raises(TypeError, match=r"queries is a sparse .*to_dense"):
        knng.search(torch.eye(8).to_sparse(), np.eye(8, dtype=np.float32), 3)


def test_exact_answers_after_all_that(tmp_path, points):
    # The graph the tests above compare with is itself exact (the float64 oracle).
    _, x = points
    graph = knng.graph(x, 6, device="cpu")
    assert_exact_chunked(x, x, [(graph.indices, graph.distances)], exclude_self=True, rows=np.arange(0, len(x), 409))
