"""A run's work area: the checkpoints that let a killed run continue where it stopped.

A work area is a folder that belongs to one run, described by a *fingerprint* (a JSON object
of everything the result depends on: the inputs' identity, k, the metric, the precision, the
knng version, ...). It holds:

- ``.knng-work-area``, the marker knng writes when it creates the area (or takes an empty
  folder for one). knng deletes nothing that lacks it: a folder of the user's given as a
  checkpoint folder is refused, never emptied;
- ``fingerprint.json``, written once when the area is created;
- ``state.json``, the progress of the last checkpoint (replaced atomically: written under a
  temporary name, flushed, renamed, the folder flushed);
- *generations* ``g<N>/``: arrays saved whole at one checkpoint (a graph's candidate stores).
  A generation is complete and flushed before the ``state.json`` that names it is renamed in,
  and older generations are deleted only after that, so a kill at any instant leaves a state
  whose arrays are all there;
- *growing arrays* (``<name>.npy`` memory maps): results written row range by row range (a
  search's finished query chunks); ``state.json`` says how many rows are final, and only those
  are read back.

Nothing is trusted before it is checked. Every JSON file carries the SHA-256 of its own content,
``state.json`` records the shape, dtype and SHA-256 of every array of its generation and of every
range of final rows of the growing arrays, and :meth:`WorkArea.start` checks all of them before
it returns a state to resume from: a damaged or edited checkpoint is refused
(:class:`CheckpointDamagedError`, naming the file), never resumed into a wrong answer.

The area knows nothing of the engine: :mod:`knng.engine.checkpoint` decides what a state is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from knng.io.durable import (
    CHUNK_BYTES, array_bytes, create_npy, fsync_dir, fsync_file, os_error_text, read_holder, try_lock, write_holder,
    write_npy,
)

__all__ = ["WorkArea", "CheckpointError", "CheckpointExistsError", "CheckpointMismatchError",
           "CheckpointDamagedError", "CheckpointInUseError", "CheckpointWriteError", "NotAWorkAreaError", "damaged_error", "remove_stale", "MARKER"]

#: Test hook: a checkpoint step at which the process kills itself (``os._exit``), as a crash would
#: (``generation-written`` or ``state-written``, optionally ``:N`` for the N-th time).
CRASH_ENV = "KNNG_TEST_CRASH_AT"
#: The file that makes a folder a work area: written by knng, first, into every area it makes.
MARKER = ".knng-work-area"
#: The lock a run holds on its area while it uses it (two runs in one area would mix their states).
LOCK = ".knng-lock"
_GENERATION = re.compile(r"^g(\d+)$")


class CheckpointError(Exception):
    """A checkpoint folder that cannot be used as asked.

    The message is ``problem`` then what to do, in the words of the caller: :attr:`remedy` for
    the Python API (``str(exc)``), :attr:`cli_remedy` for the command line
    (:meth:`message` with ``command_line=True``).
    """

    def __init__(self, problem: str, *, path: str | os.PathLike[str] | None = None, remedy: str = "",
                 cli_remedy: str | None = None) -> None:
        self.problem, self.remedy = problem, remedy
        self.cli_remedy = remedy if cli_remedy is None else cli_remedy
        self.path = None if path is None else os.fspath(path)
        super().__init__(self.message())

    def message(self, command_line: bool = False) -> str:
        """The problem and what to do about it (on the command line: its options)."""
        remedy = self.cli_remedy if command_line else self.remedy
        return f"{self.problem}; {remedy}" if remedy else self.problem

    def fields(self) -> dict[str, Any]:
        """What rebuilds this error in another process (a distributed run's other ranks)."""
        return {"problem": self.problem, "path": self.path, "remedy": self.remedy, "cli_remedy": self.cli_remedy}


class CheckpointExistsError(CheckpointError, RuntimeError):
    """A work area holds the checkpoint of an interrupted run and this run was not asked to resume it."""


class CheckpointInUseError(CheckpointError, RuntimeError):
    """Another process is using the work area now."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint was written by a run that differs from this one (input, k, metric, ...)."""


class CheckpointDamagedError(CheckpointError, ValueError):
    """A checkpoint whose files do not match the checksums written with them (or cannot be read)."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (a full disk, a file-size limit); the one before it is intact."""


class NotAWorkAreaError(CheckpointError, ValueError):
    """The checkpoint folder exists and is not one knng made: knng neither writes into it nor deletes it."""


def damaged_error(area: str | os.PathLike[str], problem: str) -> CheckpointDamagedError:
    """The error that refuses the checkpoint in ``area`` because of ``problem``."""
    return CheckpointDamagedError(
        f"the checkpoint in {area} is damaged: {problem}, so it cannot be resumed",
        path=area, remedy=f"delete {area} to start the run again without it",
        cli_remedy="run the command again with --overwrite instead of --resume to discard it and start again")


class WorkArea:
    """The checkpoint folder of one run.

    Parameters
    ----------
    path : str or os.PathLike
        The folder: created by :meth:`start` (an empty folder that exists is taken over; any
        other existing folder that knng did not make is refused).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._arrays: dict[str, np.memmap] = {}
        self._last: dict[str, Any] | None = None  # the state the next save builds on
        self._release: weakref.finalize | None = None  # closes the lock's file descriptor

    # ------------------------------------------------------------------------------ opening
    def exists(self) -> bool:
        """Whether a run's work area is here: the marker knng writes, or the fingerprint of an
        area written before knng wrote markers."""
        return (self.path / MARKER).is_file() or _legacy(self.path)

    def start(self, fingerprint: dict[str, Any], resume: bool) -> dict[str, Any] | None:
        """Open the area for a run with ``fingerprint``; return the saved state to resume from.

        Parameters
        ----------
        fingerprint : dict
            Plain JSON values; a resumed run must match the saved one exactly.
        resume : bool
            Continue a checkpoint found here. Without it, a checkpoint found here is an error (it
            would be lost); with it and none found, the run starts from the beginning.

        Returns
        -------
        dict or None
            The state of the last checkpoint (every file it names checked against its checksum),
            or None to start from the beginning.

        Raises
        ------
        CheckpointExistsError
            A checkpoint is here and ``resume`` is false.
        CheckpointMismatchError
            ``resume`` and the checkpoint here was written by a different run.
        CheckpointDamagedError
            A file of the checkpoint does not match its checksum, or cannot be read.
        NotAWorkAreaError
            The folder exists, is not empty and knng did not make it.
        """
        remove_stale(self.path)
        if (self.path / MARKER).is_file() and set(os.listdir(self.path)) == {MARKER}:
            # An empty folder taken over by a run killed before it wrote its fingerprint.
            (self.path / MARKER).unlink()
        if self.exists():
            if not (self.path / MARKER).is_file():
                raise damaged_error(self.path, "it was written by an earlier knng that recorded no checksums, so "
                                               "nothing in it can be verified")
            self._lock(self.path)
            saved = self._read_json("fingerprint.json")
            state = self.state()
            if not self._progress(state):
                # An area whose run saved no progress (killed or failed early): nothing in it
                # would be lost, nothing in it can be resumed. It is not kept in the way.
                self.remove()
                return self.start(fingerprint, resume)
            if not resume:
                raise CheckpointExistsError(
                    f"{self.path} holds the checkpoint of an earlier run that did not finish writing its results "
                    f"({_progress_text(state)})",
                    path=self.path, remedy=f"pass resume=True to continue it, or delete {self.path} to start again",
                    cli_remedy="run the same command with --resume to continue it, or with --overwrite to discard it "
                               "and start again")
            differences = _differences(saved, fingerprint)
            if differences:
                raise CheckpointMismatchError(
                    f"cannot resume from {self.path}: the checkpoint was written by a different run "
                    f"({'; '.join(differences)})",
                    path=self.path, remedy=f"delete {self.path} to start again",
                    cli_remedy="run the command with --overwrite instead of --resume to discard it and start again")
            if state is not None:
                self.verify(state)
            self._last = state
            return state
        if os.path.lexists(self.path):
            self._adopt(fingerprint)
            return None
        staging = self.path.with_name(f"{self.path.name}.new-{os.getpid()}-{secrets.token_hex(4)}")
        staging.mkdir(parents=True)
        _write_json(staging / MARKER, {"knng_work_area": 1, "adopted": False})
        _write_json(staging / "fingerprint.json", fingerprint)
        self._lock(staging)  # the descriptor stays valid through the rename
        fsync_dir(staging)
        os.rename(staging, self.path)
        fsync_dir(self.path.parent)
        return None

    def _adopt(self, fingerprint: dict[str, Any]) -> None:
        """Make the existing folder the area if it is an empty folder; refuse anything else."""
        if not self.path.is_dir() or self.path.is_symlink():
            raise NotAWorkAreaError(f"checkpoint folder {self.path} exists and is not a folder",
                                    path=self.path, remedy="give a path that does not exist yet (knng creates it)")
        names = sorted(os.listdir(self.path))
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            raise NotAWorkAreaError(
                f"checkpoint folder {self.path} exists, holds files knng did not write ({shown}) and is not a "
                "knng checkpoint: knng neither writes into nor deletes a folder it did not make",
                path=self.path, remedy="give a path that does not exist yet (knng creates the folder and deletes it "
                                       "when the run is done) or an empty folder")
        # The marker first: whatever happens next, the folder is recognised as an area again.
        _write_json(self.path / MARKER, {"knng_work_area": 1, "adopted": True})
        self._lock(self.path)
        _write_json(self.path / "fingerprint.json", fingerprint)
        fsync_dir(self.path)

    def _lock(self, folder: Path) -> None:
        """Hold the area's lock until :meth:`close` or :meth:`remove` (or this process ends)."""
        if self._release is not None:
            return
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            free = try_lock(fd)
        except OSError:  # a file system without locks (some network mounts): go on unlocked
            free = True
        if not free:
            holder = read_holder(fd)
            os.close(fd)
            raise CheckpointInUseError(f"checkpoint folder {self.path} is in use by another run ({holder})",
                                       path=self.path, remedy="wait for it to finish, or give another folder")
        write_holder(fd)
        self._release = weakref.finalize(self, os.close, fd)

    def close(self) -> None:
        """Release the area's lock (the area stays, for a later run to resume)."""
        self._arrays.clear()
        if self._release is not None:
            self._release()
            self._release = None

    def state(self) -> dict[str, Any] | None:
        """The last checkpoint's state (its checksum checked), or None if none was saved."""
        return self._read_json("state.json") if (self.path / "state.json").is_file() else None

    def verify(self, state: dict[str, Any]) -> None:
        """Check every file ``state`` names against the shape, dtype and checksum recorded for it:
        its generation's arrays and the final rows of the growing arrays.

        Raises
        ------
        CheckpointDamagedError
            Naming the first file that is missing, unreadable or different.
        """
        if state.get("generation") is not None:
            folder = f"g{state['generation']}"
            for name, record in state.get("arrays", {}).items():
                path = self.path / folder / f"{name}.npy"
                array = self._open_checked(path, record)
                if _sha256_of(array) != record["sha256"]:
                    raise damaged_error(self.path, f"{folder}/{name}.npy does not match the checksum saved with it")
        for name, record in state.get("growing", {}).items():
            path = self.path / f"{name}.npy"
            array = self._open_checked(path, record)
            for start, stop, digest in record["ranges"]:
                if _sha256_of(array[start:stop]) != digest:
                    raise damaged_error(self.path, f"rows {start:,} to {stop:,} of {name}.npy do not match the checksum "
                                              "saved with them")

    def _open_checked(self, path: Path, record: dict[str, Any]) -> np.ndarray:
        name = path.relative_to(self.path)
        if not path.is_file():
            raise damaged_error(self.path, f"{name} is missing")
        try:
            array = _open_array(path)
        except (OSError, ValueError) as exc:
            raise damaged_error(self.path, f"{name} cannot be read ({exc})") from exc
        if list(array.shape) != list(record["shape"]) or str(array.dtype) != record["dtype"]:
            raise damaged_error(self.path, f"{name} holds a {array.dtype} array of shape {tuple(array.shape)}, not the "
                                      f"{record['dtype']} array of shape {tuple(record['shape'])} saved")
        return array

    def continue_from(self, state: dict[str, Any]) -> None:
        """Build the next save on ``state`` (a distributed rank going back one save: its growing
        arrays' final rows are those of ``state``); checks ``state``'s files first."""
        self.verify(state)
        self._last = state

    # ------------------------------------------------------------------------------- saving
    def save(self, state: dict[str, Any], arrays: dict[str, np.ndarray] | None = None,
             keep: tuple[int, ...] = (), final_rows: int | None = None) -> dict[str, Any]:
        """Record a checkpoint: ``arrays`` as a new generation (if any), growing arrays flushed,
        then ``state`` (plain JSON values) renamed in. Older generations are deleted after that,
        except those numbered in ``keep`` (a distributed rank keeps the one its previous state
        names until every rank has saved the new step: :mod:`knng.distributed.checkpoint`).

        ``final_rows``: the leading rows of every growing array that are final now (their
        checksums are recorded; rows past them are never read back). None: as in the last save.

        Returns the state as recorded: ``state`` with its arrays' generation and checksums and
        the time (what :meth:`state` reads back, and what a later save's ``keep`` must name).

        Raises
        ------
        CheckpointWriteError
            The system refused a write (``ENOSPC``, ``EFBIG``, ...): the new generation is
            removed and the last checkpoint stays as it was.
        """
        try:
            return self._save(state, arrays, keep, final_rows)
        except OSError as exc:
            if isinstance(exc, CheckpointWriteError):
                raise
            for number in set(self._generations()) - {(self._last or {}).get("generation"), *keep}:
                shutil.rmtree(self.path / f"g{number}", ignore_errors=True)
            raise self._write_error(exc) from exc

    def _write_error(self, exc: OSError) -> CheckpointWriteError:
        where = f" ({Path(exc.filename).name})" if exc.filename else ""
        return CheckpointWriteError(
            f"could not save a checkpoint in {self.path}: {os_error_text(exc)}{where}; the checkpoint before it "
            "is intact", path=self.path,
            remedy="make room (or lift the file-size limit) and call again with resume=True to continue",
            cli_remedy="make room (or lift the file-size limit) and run the same command with --resume to continue")

    def _save(self, state: dict[str, Any], arrays: dict[str, np.ndarray] | None, keep: tuple[int, ...],
              final_rows: int | None) -> dict[str, Any]:
        state = dict(state)
        state["saved"] = time.strftime("%Y-%m-%d %H:%M:%S")
        last = self._last
        old = self._generations()
        if arrays:
            number = (max(old) + 1) if old else 1
            folder = self.path / f"g{number}"
            shutil.rmtree(folder, ignore_errors=True)  # a kill left it half-written
            folder.mkdir()
            state["arrays"] = {name: _write_array(folder / f"{name}.npy", array) for name, array in arrays.items()}
            fsync_dir(folder)
            state["generation"] = number
            _crash_point("generation-written")
        elif "generation" not in state and last is not None and "generation" in last:
            state["generation"], state["arrays"] = last["generation"], last.get("arrays", {})
        growing: dict[str, Any] = {}
        for name, array in self._arrays.items():
            array.flush()
            fsync_file(Path(array.filename))
            record = (last or {}).get("growing", {}).get(name, {"ranges": []})
            ranges = [list(r) for r in record["ranges"] if final_rows is None or r[1] <= final_rows]
            done = ranges[-1][1] if ranges else 0
            if final_rows is not None and final_rows > done:
                ranges.append([done, final_rows, _sha256_of(array[done:final_rows])])
            growing[name] = {"shape": list(array.shape), "dtype": str(array.dtype), "ranges": ranges}
        if growing:
            state["growing"] = growing
        _write_json(self.path / "state.json", state)
        fsync_dir(self.path)
        _crash_point("state-written")
        self._last = state
        kept = {state.get("generation"), *keep}
        for number in old:
            if number not in kept:
                shutil.rmtree(self.path / f"g{number}", ignore_errors=True)
        return state

    def load(self, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The arrays of the generation ``state`` names (empty if it names none), as saved (checked
        by :meth:`start` or :meth:`continue_from`)."""
        number = state.get("generation")
        if number is None:
            return {}
        folder = self.path / f"g{number}"
        return {name: _open_array(folder / f"{name}.npy") for name in state.get("arrays", {})}

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        """A growing array of the area (created on first use, reopened when resuming: its final
        rows were checked by :meth:`start`)."""
        if name not in self._arrays:
            path = self.path / f"{name}.npy"
            dtype = np.dtype(dtype)
            array = None
            if path.is_file():
                with contextlib.suppress(ValueError, OSError):
                    found = np.load(path, mmap_mode="r+")
                    if found.shape == tuple(shape) and found.dtype == dtype:
                        array = found
            if array is None:
                try:
                    array = create_npy(path, tuple(shape), dtype)
                except OSError as exc:
                    raise self._write_error(exc) from exc
            self._arrays[name] = array
        return self._arrays[name]

    def remove(self) -> None:
        """Delete the area (the run's results are committed, or it holds nothing worth keeping).

        Only a folder knng made or took over (its marker, or an older knng's fingerprint) is
        touched; one it took over empty is emptied and left in place.
        """
        self._arrays.clear()
        if not self.exists():
            self.close()
            return
        if _adopted(self.path):
            for name in os.listdir(self.path):
                if name != MARKER:
                    target = self.path / name
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            target.unlink()
            with contextlib.suppress(FileNotFoundError):
                (self.path / MARKER).unlink()  # last: until then the folder is still known as an area
            fsync_dir(self.path)
            self.close()
            return
        trash = self.path.with_name(f"{self.path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.rename(self.path, trash)  # one rename: a kill during the deletion leaves no half area
        fsync_dir(self.path.parent)
        self.close()
        shutil.rmtree(trash, ignore_errors=True)

    def has_progress(self) -> bool:
        """Whether the area records work done: its last state, or that of an area nested in it
        (a distributed run's ranks each save their own, ahead of the shared state), is past the
        start. A damaged area counts as progress: not ours to judge (it is reported when resumed)."""
        try:
            return self._progress(self.state())
        except CheckpointDamagedError:
            return True

    def _progress(self, state: dict[str, Any] | None) -> bool:
        if state is not None and int(state.get("step", 0) or 0) > 0:
            return True
        nested = (self.path / name for name in os.listdir(self.path)) if self.path.is_dir() else ()
        return any((p / MARKER).is_file() and WorkArea(p).has_progress() for p in nested)

    def _generations(self) -> list[int]:
        if not self.path.is_dir():
            return []
        return sorted(int(m.group(1)) for m in map(_GENERATION.match, os.listdir(self.path)) if m)

    def _read_json(self, name: str) -> dict[str, Any]:
        """A JSON file of the area, its checksum checked."""
        try:
            value = json.loads((self.path / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise damaged_error(self.path, f"{name} is missing") from None
        except (OSError, ValueError) as exc:
            raise damaged_error(self.path, f"{name} cannot be read ({exc})") from exc
        if not isinstance(value, dict) or value.pop("sha256", None) != _json_digest(value):
            raise damaged_error(self.path, f"{name} does not match the checksum written with it (edited or damaged)")
        return value


def _legacy(path: Path) -> bool:
    """A work area written before knng wrote markers: a fingerprint naming the knng version."""
    try:
        return "knng" in json.loads((path / "fingerprint.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _adopted(path: Path) -> bool:
    try:
        return bool(json.loads((path / MARKER).read_text(encoding="utf-8")).get("adopted"))
    except (OSError, ValueError, AttributeError):
        return False


def _open_array(path: Path) -> np.ndarray:
    """A saved array as a read-only memory map (a store kept on disk, ``knng.engine.store.lists``, may be
    larger than host memory); read whole where it cannot be mapped (an empty array)."""
    try:
        return np.load(path, mmap_mode="r")
    except ValueError:
        return np.load(path)


def _sha256_of(array: np.ndarray) -> str:
    """SHA-256 of an array's bytes in C order, read in slices (a memory map is not read whole)."""
    digest = hashlib.sha256()
    if array.ndim == 0:
        digest.update(array_bytes(array))
        return digest.hexdigest()
    rows = max(1, CHUNK_BYTES // max(1, array[:1].nbytes))
    for start in range(0, len(array), rows):
        digest.update(array_bytes(array[start:start + rows]))
    return digest.hexdigest()


def _write_array(path: Path, array: np.ndarray) -> dict[str, Any]:
    """Write ``array`` as a ``.npy`` file, flushed; returns its shape, dtype and SHA-256."""
    array = np.ascontiguousarray(array)
    return {"shape": list(array.shape), "dtype": str(array.dtype), "sha256": write_npy(path, array)}


def remove_stale(path: str | os.PathLike[str]) -> None:
    """Remove the leftovers of a work area at ``path`` that kills interrupted while it was being
    created or deleted (``NAME.new-*``, ``NAME.old-*``: names only knng gives)."""
    path = Path(os.path.abspath(os.fspath(path)))
    if not path.parent.is_dir():
        return
    for name in os.listdir(path.parent):
        if name.startswith(f"{path.name}.new-") or name.startswith(f"{path.name}.old-"):
            shutil.rmtree(path.parent / name, ignore_errors=True)


def _progress_text(state: dict[str, Any] | None) -> str:
    if state is None:
        return "saved by its parts"
    return f"{state.get('progress', 'progress unknown')}, saved {state.get('saved', '?')}"


def _differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words."""
    out = []
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            out.append(f"{key}: {_short(saved.get(key))} then, {_short(now.get(key))} now")
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def _json_digest(value: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` with its own checksum (``"sha256"``), atomically: a temporary file, flushed,
    renamed over ``path``."""
    content = dict(value, sha256=_json_digest(value))
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(content, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


_CRASH_COUNTS: dict[str, int] = {}


def _crash_point(step: str) -> None:
    """Test hook: ``KNNG_TEST_CRASH_AT=STEP`` or ``STEP:N`` kills the process at the first (or
    N-th) time it reaches ``step``."""
    wanted = os.environ.get(CRASH_ENV, "")
    name, _, count = wanted.partition(":")
    if name != step:
        return
    _CRASH_COUNTS[step] = _CRASH_COUNTS.get(step, 0) + 1
    if _CRASH_COUNTS[step] >= (int(count) if count else 1):
        os._exit(137)
