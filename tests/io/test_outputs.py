"""The output protocol (knng.io.outputs): one writer per folder, checks before computing, the
whole result set committed at once, and crashes at any step leaving the old set or the new one.

Crashes are real ones: a ``knng graph`` subprocess killed by ``os._exit`` at each named step of
the commit (the ``KNNG_TEST_CRASH_AT`` hook), and ``kill -9`` at random instants.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from knng.cli import main
from knng.io import OutputFolder, OutputFolderError, write_neighbors
from knng.io.outputs import CRASH_ENV, FREE_BYTES_ENV

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _data(tmp_path: Path, rng: np.random.Generator, n: int = 400) -> Path:
    path = tmp_path / "x.npy"
    np.save(path, rng.standard_normal((n, 8)).astype(np.float32))
    return path


def _knng(*argv: str, env: dict[str, str] | None = None, wait: bool = True):
    full_env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    cmd = [sys.executable, "-m", "knng", *argv, "--no-progress"]
    if not wait:
        return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=300)


def _result_set(out: Path) -> tuple[str, int] | None:
    """Which complete set the folder holds: ("npy" | "npz", k), or None for no results.

    Fails on anything else: a mix of files, a knng.json that does not describe them, leftovers.
    """
    if not out.exists():
        return None
    names = sorted(p.name for p in out.iterdir())
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.knng-")]
    assert not [n for n in names if n.startswith(".")], f"hidden leftovers in {out}: {names}"
    if names == []:
        return None
    meta = json.loads((out / "knng.json").read_text())
    if names == ["distances.npy", "indices.npy", "knng.json"]:
        idx, dist = np.load(out / "indices.npy"), np.load(out / "distances.npy")
        assert idx.shape == dist.shape and idx.shape[1] == meta["k"], (idx.shape, meta["k"])
        return "npy", meta["k"]
    assert names == ["graph.npz", "knng.json"], f"not one result set: {names} (siblings {leftovers})"
    return "npz", meta["k"]


# --- one writer ---------------------------------------------------------------------------


def test_a_second_writer_fails_at_once_naming_the_holder(tmp_path, rng):
    data = _data(tmp_path, rng)
    out = tmp_path / "out"
    with OutputFolder(out, command="the first run"):
        t0 = time.perf_counter()
        proc = _knng("graph", str(data), "-k", "3", "-o", str(out))
        assert proc.returncode == 2, proc.stderr
        assert "in use by another knng run" in proc.stderr and f"pid {os.getpid()}" in proc.stderr
        assert "the first run" in proc.stderr and "Traceback" not in proc.stderr
        with pytest.raises(OutputFolderError, match="in use"):
            write_neighbors(out, np.zeros((2, 1), np.int64), np.zeros((2, 1)))
        assert time.perf_counter() - t0 < 60
    assert not out.exists()  # the holder committed nothing
    assert _knng("graph", str(data), "-k", "3", "-o", str(out)).returncode == 0  # released
    assert _result_set(out) == ("npy", 3)


def test_a_stale_lock_of_a_dead_process_is_recognised(tmp_path, rng):
    out = tmp_path / "out"
    lock = tmp_path / ".out.knng-lock"
    lock.write_text(json.dumps({"pid": 999999, "host": "gone", "started": "yesterday", "command": "killed"}))
    write_neighbors(out, np.zeros((2, 1), np.int64), np.zeros((2, 1)), metadata={"k": 1})
    assert _result_set(out) == ("npy", 1) and not lock.exists()


def test_concurrent_runs_never_both_succeed_into_one_folder(tmp_path, rng):
    data = _data(tmp_path, rng, n=3000)
    out = tmp_path / "out"
    procs = [_knng("graph", str(data), "-k", str(k), "-o", str(out), wait=False) for k in (3, 4)]
    codes = [p.wait(timeout=300) for p in procs]
    errors = [p.stderr.read() for p in procs]
    # The later one is refused: by the lock while the first runs, by the results after it.
    assert sorted(codes) == [0, 2], errors
    result = _result_set(out)
    winner = 3 if codes[0] == 0 else 4
    assert result == ("npy", winner)
    loser = errors[1 - codes.index(0)]
    assert "in use by another knng run" in loser or "already holds results" in loser


# --- checks before computing ----------------------------------------------------------------


def test_no_space_is_refused_before_computing(tmp_path, rng):
    data = _data(tmp_path, rng)
    out = tmp_path / "out"
    proc = _knng("graph", str(data), "-k", "3", "-o", str(out), env={FREE_BYTES_ENV: "1000"})
    assert proc.returncode == 2 and "not enough free space" in proc.stderr, proc.stderr
    assert "knng graph:" not in proc.stdout + proc.stderr  # nothing was computed
    assert not out.exists() and not list(tmp_path.glob(".out.knng-*"))


def test_an_output_path_under_a_file_is_refused(tmp_path, rng):
    data = _data(tmp_path, rng)
    (tmp_path / "plain").write_text("not a folder")
    proc = _knng("graph", str(data), "-k", "3", "-o", str(tmp_path / "plain" / "out"))
    assert proc.returncode == 2 and "is not a folder" in proc.stderr and "Traceback" not in proc.stderr


def test_a_folder_with_subfolders_is_refused_and_foreign_files_are_kept(tmp_path, rng):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    with pytest.raises(OutputFolderError, match="folders knng did not write"):
        write_neighbors(out, np.zeros((2, 1), np.int64), np.zeros((2, 1)))
    (out / "sub").rmdir()
    (out / "notes.txt").write_text("mine")
    write_neighbors(out, np.zeros((2, 1), np.int64), np.zeros((2, 1)))
    write_neighbors(out, np.ones((2, 1), np.int64), np.zeros((2, 1)), overwrite=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert np.load(out / "indices.npy").tolist() == [[1], [1]]


# --- whole sets ------------------------------------------------------------------------------


def test_a_format_switch_replaces_the_whole_set(tmp_path, rng, capsys):
    data = _data(tmp_path, rng)
    out = tmp_path / "out"
    assert main(["graph", str(data), "-k", "3", "-o", str(out), "--no-progress"]) == 0
    assert _result_set(out) == ("npy", 3)
    assert main(["graph", str(data), "-k", "4", "-o", str(out), "--format", "npz", "--overwrite",
                 "--no-progress"]) == 0
    assert _result_set(out) == ("npz", 4)
    assert main(["graph", str(data), "-k", "5", "-o", str(out), "--overwrite", "--no-progress"]) == 0
    assert _result_set(out) == ("npy", 5)


def test_stale_temporaries_of_earlier_crashes_are_removed(tmp_path, rng):
    out = tmp_path / "out"
    write_neighbors(out, np.zeros((2, 1), np.int64), np.zeros((2, 1)), metadata={"k": 1})
    (out / ".indices.npy.tmp-123-abcd1234").write_bytes(b"x" * 100)  # an earlier version's
    (out / ".distances.npy.bak-123-abcd1234").write_bytes(b"x")
    (tmp_path / ".out.knng-new-123-abcd1234").mkdir()  # a crashed run's staging copy
    (tmp_path / ".out.knng-new-123-abcd1234" / "indices.npy").write_bytes(b"partial")
    write_neighbors(out, np.zeros((3, 2), np.int64), np.zeros((3, 2)), metadata={"k": 2}, overwrite=True)
    assert _result_set(out) == ("npy", 2)


# --- crashes ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("step", ["staged", "ready", "switched"])
def test_a_crash_at_each_commit_step_leaves_one_whole_set(tmp_path, rng, step):
    data = _data(tmp_path, rng)
    out = tmp_path / "out"
    assert _knng("graph", str(data), "-k", "3", "-o", str(out)).returncode == 0
    proc = _knng("graph", str(data), "-k", "4", "-o", str(out), "--overwrite", env={CRASH_ENV: step})
    assert proc.returncode == 137
    expected = ("npy", 4) if step == "switched" else ("npy", 3)
    assert _result_set_allowing_leftovers(out) == expected
    proc = _knng("graph", str(data), "-k", "5", "-o", str(out), "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert _result_set(out) == ("npy", 5)
    assert not list(tmp_path.glob(".out.knng-*"))


def _result_set_allowing_leftovers(out: Path):
    """The set a reader sees right after a crash (siblings of the crashed run may remain)."""
    names = sorted(p.name for p in out.iterdir())
    assert names == ["distances.npy", "indices.npy", "knng.json"], names
    meta = json.loads((out / "knng.json").read_text())
    assert np.load(out / "indices.npy").shape[1] == meta["k"] == np.load(out / "distances.npy").shape[1]
    return "npy", meta["k"]


@pytest.mark.parametrize("step", ["ready", "moved-aside", "switched"])
def test_without_an_atomic_exchange_a_crash_is_finished_by_the_next_run(tmp_path, step):
    # File systems without renameat2(RENAME_EXCHANGE): the folder is moved aside, then the new
    # set renamed in; a crash between leaves no folder, and the next open commits the ready set.
    out = tmp_path / "out"
    write_neighbors(out, np.zeros((2, 3), np.int64), np.zeros((2, 3)), metadata={"k": 3})
    script = (
        "import numpy as np, knng.io.outputs as o\n"
        "o._exchange = lambda a, b: False\n"
        "from knng.io import write_neighbors\n"
        f"write_neighbors({str(out)!r}, np.ones((2, 4), np.int64), np.ones((2, 4)), metadata={{'k': 4}},"
        " overwrite=True)\n")
    env = dict(os.environ, PYTHONPATH=SRC, **{CRASH_ENV: step})
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, proc.stderr
    with OutputFolder(out, overwrite=True):
        pass  # opening recovers: commits a ready set whose folder is missing, removes the rest
    assert _result_set(out) == ("npy", 3 if step == "ready" else 4)
    assert not list(tmp_path.glob(".out.knng-*"))


@pytest.mark.slow
def test_kill_at_random_instants_never_leaves_a_mixed_folder(tmp_path, rng):
    data = _data(tmp_path, rng, n=2000)
    out = tmp_path / "out"
    assert _knng("graph", str(data), "-k", "3", "-o", str(out)).returncode == 0
    seen = set()
    gen = np.random.default_rng(int(rng.integers(1 << 31)))
    for k in range(4, 10):
        proc = _knng("graph", str(data), "-k", str(k), "-o", str(out), "--overwrite", wait=False)
        time.sleep(float(gen.uniform(0.2, 3.0)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        result = _result_set_allowing_leftovers(out)
        assert result[1] in (3, *range(4, k + 1))
        seen.add(result[1])
    assert _knng("graph", str(data), "-k", "12", "-o", str(out), "--overwrite").returncode == 0
    assert _result_set(out) == ("npy", 12)


@pytest.mark.slow
def test_a_distributed_run_checks_the_folder_before_starting_its_ranks(tmp_path, rng):
    data = _data(tmp_path, rng)
    out = tmp_path / "out"
    proc = _knng("graph", str(data), "-k", "3", "-o", str(out), "--procs", "2", env={FREE_BYTES_ENV: "10"})
    assert proc.returncode == 2 and "not enough free space" in proc.stderr and "rank" not in proc.stderr
    with OutputFolder(out):
        proc = _knng("graph", str(data), "-k", "3", "-o", str(out), "--procs", "2")
        assert proc.returncode == 2 and "in use by another knng run" in proc.stderr
    proc = _knng("graph", str(data), "-k", "3", "-o", str(out), "--procs", "2")
    assert proc.returncode == 0, proc.stderr
    assert _result_set(out) == ("npy", 3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux-only")
def test_ranks_end_quietly_with_a_killed_launcher(tmp_path, rng):
    data = _data(tmp_path, rng, n=60_000)
    out = tmp_path / "out"
    proc = _knng("graph", str(data), "-k", "10", "-o", str(out), "--procs", "2", wait=False)
    deadline = time.monotonic() + 120
    ranks: list[int] = []
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.2)
        found = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ranks = [int(p) for p in found]
    assert len(ranks) == 2, "the ranks did not start"
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    end = time.monotonic() + 30
    while time.monotonic() < end and any(_alive(pid) for pid in ranks):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in ranks), "ranks outlived their launcher"
    err = proc.stderr.read()  # the ranks wrote into the launcher's stderr
    assert "frame #" not in err and "Traceback" not in err, err[-3000:]
    assert _result_set_or_nothing(out)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def _result_set_or_nothing(out: Path) -> bool:
    return not out.exists() or _result_set(out) in (None, ("npy", 10))
