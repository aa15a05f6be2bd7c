"""A run's work area: the checkpoints that let a killed run continue where it stopped.

A work area is a folder that belongs to one run, described by a *fingerprint* (a JSON object
of everything the result depends on: the inputs' identity, k, the metric, the precision, the
knng version, ...). It holds:

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

The area knows nothing of the engine: :mod:`knng.engine.checkpoint` decides what a state is.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from knng.io.outputs import fsync_dir, fsync_file

__all__ = ["WorkArea", "CheckpointExistsError", "CheckpointMismatchError", "remove_stale"]

#: Test hook: a checkpoint step at which the process kills itself (``os._exit``), as a crash would
#: (``generation-written`` or ``state-written``, optionally ``:N`` for the N-th time).
CRASH_ENV = "KNNG_TEST_CRASH_AT"
_GENERATION = re.compile(r"^g(\d+)$")


class CheckpointExistsError(RuntimeError):
    """A work area holds the checkpoint of an interrupted run and this run was not asked to resume it."""


class CheckpointMismatchError(ValueError):
    """A checkpoint was written by a run that differs from this one (input, k, metric, ...)."""


class WorkArea:
    """The checkpoint folder of one run.

    Parameters
    ----------
    path : str or os.PathLike
        The folder (created by :meth:`start`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._arrays: dict[str, np.memmap] = {}

    # ------------------------------------------------------------------------------ opening
    def exists(self) -> bool:
        """Whether a run's work area is there (its fingerprint was written)."""
        return (self.path / "fingerprint.json").is_file()

    def start(self, fingerprint: dict[str, Any], resume: bool, describe: str = "this run") -> dict[str, Any] | None:
        """Open the area for a run with ``fingerprint``; return the saved state to resume from.

        Parameters
        ----------
        fingerprint : dict
            Plain JSON values; a resumed run must match the saved one exactly.
        resume : bool
            Continue a checkpoint found here. Without it, a checkpoint found here is an error (it
            would be lost); with it and none found, the run starts from the beginning.
        describe : str
            How messages name the way to resume or discard (``"--resume"``, ``"resume=True"``).

        Returns
        -------
        dict or None
            The state of the last checkpoint, or None to start from the beginning.

        Raises
        ------
        CheckpointExistsError
            A checkpoint is here and ``resume`` is false.
        CheckpointMismatchError
            ``resume`` and the checkpoint here was written by a different run.
        """
        remove_stale(self.path)
        if self.exists():
            saved = _read_json(self.path / "fingerprint.json")
            state = self.state()
            if not resume:
                raise CheckpointExistsError(
                    f"{self.path} holds the checkpoint of an earlier run that did not finish writing its results ({_progress_text(state)}); "
                    f"pass {describe} to continue it, or delete that folder to start again")
            differences = _differences(saved, fingerprint)
            if differences:
                raise CheckpointMismatchError(
                    f"cannot resume from {self.path}: the checkpoint was written by a different run "
                    f"({'; '.join(differences)}); delete that folder to start again")
            return state
        if self.path.exists():
            # A folder without a fingerprint: a kill before the fingerprint was renamed in.
            shutil.rmtree(self.path)
        staging = self.path.with_name(f"{self.path.name}.new-{os.getpid()}-{secrets.token_hex(4)}")
        staging.mkdir(parents=True)
        _write_json(staging / "fingerprint.json", fingerprint)
        fsync_dir(staging)
        os.rename(staging, self.path)
        fsync_dir(self.path.parent)
        return None

    def state(self) -> dict[str, Any] | None:
        """The last checkpoint's state, or None if none was saved."""
        path = self.path / "state.json"
        return _read_json(path) if path.is_file() else None

    # ------------------------------------------------------------------------------- saving
    def save(self, state: dict[str, Any], arrays: dict[str, np.ndarray] | None = None,
             keep: tuple[int, ...] = ()) -> dict[str, Any]:
        """Record a checkpoint: ``arrays`` as a new generation (if any), growing arrays flushed,
        then ``state`` (plain JSON values) renamed in. Older generations are deleted after that,
        except those numbered in ``keep`` (a distributed rank keeps the one its previous state
        names until every rank has saved the new step: :mod:`knng.distributed.checkpoint`).

        Returns the state as recorded: ``state`` with the generation of its arrays and the time
        (what :meth:`state` reads back, and what a later save's ``keep`` must name)."""
        state = dict(state)
        state["saved"] = time.strftime("%Y-%m-%d %H:%M:%S")
        old = self._generations()
        if arrays:
            number = (max(old) + 1) if old else 1
            folder = self.path / f"g{number}"
            shutil.rmtree(folder, ignore_errors=True)  # a kill left it half-written
            folder.mkdir()
            for name, array in arrays.items():
                np.save(folder / f"{name}.npy", np.ascontiguousarray(array))
                fsync_file(folder / f"{name}.npy")
            fsync_dir(folder)
            state["generation"] = number
            _crash_point("generation-written")
        elif "generation" not in state:
            last = self.state()
            if last is not None and "generation" in last:
                state["generation"] = last["generation"]
        for array in self._arrays.values():
            array.flush()
            fsync_file(Path(array.filename))
        _write_json(self.path / "state.json", state)
        fsync_dir(self.path)
        _crash_point("state-written")
        kept = {state.get("generation"), *keep}
        for number in old:
            if number not in kept:
                shutil.rmtree(self.path / f"g{number}", ignore_errors=True)
        return state

    def load(self, state: dict[str, Any]) -> dict[str, np.ndarray]:
        """The arrays of the generation ``state`` names (empty if it names none)."""
        number = state.get("generation")
        if number is None:
            return {}
        folder = self.path / f"g{number}"
        return {p.stem: _open_array(p) for p in sorted(folder.glob("*.npy"))}

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        """A growing array of the area (created on first use, reopened when resuming)."""
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
                array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))
            self._arrays[name] = array
        return self._arrays[name]

    def remove(self) -> None:
        """Delete the area (the run's results are committed; nothing here is needed any more)."""
        self._arrays.clear()
        if self.path.exists():
            trash = self.path.with_name(f"{self.path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            os.rename(self.path, trash)  # one rename: a kill during the deletion leaves no half area
            fsync_dir(self.path.parent)
            shutil.rmtree(trash, ignore_errors=True)

    def _generations(self) -> list[int]:
        if not self.path.is_dir():
            return []
        return sorted(int(m.group(1)) for m in map(_GENERATION.match, os.listdir(self.path)) if m)


def _open_array(path: Path) -> np.ndarray:
    """A saved array as a read-only memory map (a store kept on disk, ``knng.engine.lists``, may be
    larger than host memory); read whole where it cannot be mapped (an empty array)."""
    try:
        return np.load(path, mmap_mode="r")
    except ValueError:
        return np.load(path)


def remove_stale(path: str | os.PathLike[str]) -> None:
    """Remove the leftovers of a work area at ``path`` that kills interrupted while it was being
    created or deleted (``NAME.new-*``, ``NAME.old-*``)."""
    path = Path(os.path.abspath(os.fspath(path)))
    if not path.parent.is_dir():
        return
    for name in os.listdir(path.parent):
        if name.startswith(f"{path.name}.new-") or name.startswith(f"{path.name}.old-"):
            shutil.rmtree(path.parent / name, ignore_errors=True)


def _progress_text(state: dict[str, Any] | None) -> str:
    if state is None:
        return "no checkpoint saved yet"
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


def _read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1, sort_keys=True)
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
