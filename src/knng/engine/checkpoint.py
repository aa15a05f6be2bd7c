"""Checkpoints of a graph or a search: what a run saves, and how a killed run goes on.

A run with a checkpoint folder (:class:`knng.io.workarea.WorkArea`) records, at intervals,
everything it needs to continue:

- **a graph**: the step it reached in its fixed sequence of blocks (the parts' own blocks, then
  the blocks S(I, J), I < J, in the frames' order) and the candidate stores of every row after
  that step (candidates, thresholds, report counters);
- **a search**: how many query rows are finished; their results go into growing arrays of the
  folder as each chunk completes.

Resuming restores that state and skips the steps done. The answer is the same bit for bit as
an uninterrupted run's: each row's answer is its exact top k by (distance, index), which does
not depend on when its threshold tightened or which pairs it screened; only the report's
counters (survivors, exact evaluations) may differ a little, as the stores take in their
pending pairs at each checkpoint. The plan is saved at the start and reused on resuming, so
the parts and block sequence are the ones the steps refer to.

The fingerprint of a run (the inputs' identity, k, metric, screen precision, knng version,
device kind) is saved when the folder is created; resuming with any of them changed is
refused (:class:`knng.io.workarea.CheckpointMismatchError`). A checkpoint whose files do not
match their checksums, or whose step lies outside the plan, is refused as damaged
(:class:`knng.io.workarea.CheckpointDamagedError`).

A run that fails keeps its checkpoint only where a later run can use it (:meth:`Checkpoint.running`):
an error in the input found mid-run, or a failure before any progress was saved, removes it, so
that nothing blocks the next run into the same folder; an interruption or another failure after
progress keeps it for ``resume``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from knng._inputs import InputArray
from knng.engine.plan import EnginePlan
from knng.io.workarea import (
    CheckpointDamagedError, CheckpointError, CheckpointMismatchError, CheckpointWriteError, WorkArea, damaged_error,
)

__all__ = ["STATE_FORMAT", "Checkpoint", "input_fingerprint", "checkpoint_bytes", "DEFAULT_INTERVAL", "FULL_HASH_BYTES",
           "useless_after"]

#: What a saved store's keys mean, in the fingerprint beside the version: raised whenever a
#: metric's keys change form, so that a checkpoint of the older form is refused, not misread.
#: 2: cosine and Pearson keys are ‖x̂ − ŷ‖² of centred unit vectors (before: −x̂ᵀŷ).
STATE_FORMAT = 2

#: Seconds between checkpoints at least (a run shorter than this writes only its start).
DEFAULT_INTERVAL = 60.0
#: A checkpoint waits at least this many times its own last duration: at most 1/OVERHEAD of
#: the run's time goes to checkpoints, whatever the size of the state.
OVERHEAD = 50.0
#: Inputs up to this size are hashed whole; larger ones by :data:`SAMPLE_BLOCKS` row blocks
#: spread over the whole input (plus, for files, their size and modification time).
FULL_HASH_BYTES = 1 << 30
SAMPLE_BLOCKS = 256
_HASH_BLOCK_BYTES = 16 << 20
_SAMPLE_BLOCK_BYTES = 1 << 20


def checkpoint_bytes(operation: str, rows: int, k: int, capacity: int) -> int:
    """Disk a run's checkpoints may take at their largest.

    A graph's checkpoint holds every row's store (keys, radii, ids and distances: 32 bytes a
    candidate, ``capacity`` a row, plus 33 bytes of per-row counters), and two generations
    coexist for a moment while the newer replaces the older; a search's holds the finished rows'
    indices and distances and two per-row counters.
    """
    if operation == "graph":
        return 2 * rows * (32 * capacity + 33)
    return rows * (16 * k + 16)


def input_fingerprint(x: InputArray) -> dict[str, Any]:
    """The identity of an input: shape, dtype, its file (if any) and a hash of its content."""
    info: dict[str, Any] = {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", "")}
    path = _file_of(x.source)
    if path is not None:
        st = os.stat(path)
        info.update(file=os.path.realpath(path), size=st.st_size, mtime_ns=st.st_mtime_ns)
    info["content"] = content_hash(x)
    return info


def content_hash(x: InputArray) -> str:
    """BLAKE2b of the input's bytes: all of them up to :data:`FULL_HASH_BYTES`, else
    :data:`SAMPLE_BLOCKS` blocks of rows spread evenly from the first row to the last."""
    digest = hashlib.blake2b(digest_size=16)
    row_bytes = max(1, x.d * x.dtype.itemsize)
    step = max(1, _HASH_BLOCK_BYTES // row_bytes)
    if x.n * row_bytes <= FULL_HASH_BYTES:
        ranges = [(s, min(x.n, s + step)) for s in range(0, x.n, step)]
    else:
        rows = max(1, min(_SAMPLE_BLOCK_BYTES // row_bytes, x.n // SAMPLE_BLOCKS))
        starts = np.linspace(0, x.n - rows, SAMPLE_BLOCKS).astype(np.int64)
        ranges = [(int(s), int(s) + rows) for s in starts]
        digest.update(b"sampled")
    for start, stop in ranges:
        block = x.rows(start, stop).detach().contiguous().cpu()
        digest.update(block.view(torch.uint8).numpy().tobytes() if block.numel() else b"")
    return digest.hexdigest()


def _file_of(source: Any) -> str | None:
    """The file behind a lazy input: a NumPy memory map's (a str, or a Path when it was opened
    with one), or an h5py dataset's."""
    name = getattr(source, "filename", None)
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if isinstance(name, str) and os.path.isfile(name):
        return name
    file = getattr(source, "file", None)
    name = getattr(file, "filename", None)
    if isinstance(name, str) and os.path.isfile(name):
        return name
    return None


class Checkpoint:
    """A run's checkpoints in a work area: when to save, and what was saved.

    Parameters
    ----------
    area : WorkArea
        The folder.
    fingerprint : dict
        The run's identity (see :func:`input_fingerprint`); a resumed run must match it.
    resume : bool
        Continue the checkpoint found in the folder (if none is there, start from the beginning).
    interval : float
        Seconds between checkpoints at least; a checkpoint also waits :data:`OVERHEAD` times the
        duration of the last one. 0: after every step, whatever it costs (for tests).

    Attributes
    ----------
    state : dict or None
        The saved state to resume from (None: start from the beginning).
    """

    def __init__(self, area: WorkArea, fingerprint: dict[str, Any], resume: bool,
                 interval: float = DEFAULT_INTERVAL) -> None:
        if interval < 0:
            raise ValueError(f"checkpoint_interval must be ≥ 0 seconds, got {interval}")
        self.area = area
        self.interval = float(interval)
        self.state = area.start(fingerprint, resume)
        self.saves = 0
        self.seconds = 0.0  # spent saving
        self._last = time.monotonic()
        self._cost = 0.0

    @property
    def resumed(self) -> bool:
        """Whether this run continues a saved one."""
        return self.state is not None and self.state.get("step", 0) > 0

    def plan(self, planned: EnginePlan) -> EnginePlan:
        """The plan to run: the saved one when resuming, else ``planned`` (then recorded)."""
        if self.state is not None and "plan" in self.state:
            saved = EnginePlan.from_dict(self.state["plan"])
            if torch.device(saved.device).type != torch.device(planned.device).type:
                raise CheckpointMismatchError(
                    f"cannot resume on {planned.device}: the checkpoint in {self.area.path} was made on {saved.device}",
                    path=self.area.path, remedy="resume on the same kind of device",
                    cli_remedy="resume on the same kind of device (--device), or run with --overwrite to start again")
            return saved
        self.state = self.area.save({"plan": planned.as_dict(), "step": 0, "progress": "started"})
        return planned

    def due(self) -> bool:
        """Whether enough time has passed since the last checkpoint to save another."""
        if self.interval == 0:
            return True
        return time.monotonic() - self._last >= max(self.interval, OVERHEAD * self._cost)

    def check_step(self, steps: int) -> int:
        """The saved step, checked against the plan's ``steps`` (a step outside ``[0, steps]``
        cannot have been saved by this plan: the checkpoint is refused as damaged)."""
        step = 0 if self.state is None else self.state.get("step", 0)
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= steps:
            raise self.damaged(f"state.json records step {step!r}, outside the plan's 0 to {steps:,} steps")
        return step

    def damaged(self, problem: str) -> CheckpointDamagedError:
        """The error refusing this checkpoint because of ``problem``."""
        return damaged_error(self.area.path, problem)

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """Reading the saved state back: a state that does not fit the plan (a missing field, an
        array of another shape) is a damaged checkpoint, not bad input."""
        try:
            yield
        except (KeyError, ValueError, TypeError, IndexError) as exc:
            if isinstance(exc, CheckpointError):
                raise
            raise self.damaged(f"its state does not fit the plan ({type(exc).__name__}: {exc})") from exc

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The run's work: if it fails, the area is removed where it cannot help a later run
        (:func:`useless_after`), kept otherwise; the error goes on."""
        try:
            yield
        except BaseException as exc:
            if useless_after(exc, self.area.has_progress()):
                self.area.remove()
            else:
                self.area.close()
            raise

    def save(self, state: dict[str, Any], arrays: dict[str, torch.Tensor] | None = None,
             keep_previous: bool = False, final_rows: int | None = None) -> None:
        """Record ``state`` (plain JSON values; the plan is kept) and ``arrays`` (a new generation);
        ``final_rows``: how many leading rows of the growing arrays are final (:meth:`growing`).

        ``keep_previous``: the new state also carries the one it replaces (as ``"previous"``),
        whose generation stays on disk, so that :meth:`rewind` can go back one save (one rank
        of a distributed run, killed before every rank has saved the same step).
        """
        t0 = time.monotonic()
        full = dict(state, plan=self.state["plan"] if self.state else None)
        keep: tuple[int, ...] = ()
        if keep_previous and self.state is not None:
            full["previous"] = {key: value for key, value in self.state.items() if key not in ("previous", "plan")}
            if "generation" in self.state:
                keep = (int(self.state["generation"]),)
        # The recorded state names its arrays' generation: the next save's "previous" (and its
        # kept generation) must too, or a rank rewound to it would find no arrays.
        self.state = self.area.save(full, None if arrays is None else {k: _numpy(v) for k, v in arrays.items()},
                                    keep=keep, final_rows=final_rows)
        now = time.monotonic()
        self._cost = now - t0
        self.seconds += self._cost
        self.saves += 1
        self._last = now

    def rewind(self, step: int) -> None:
        """Go back to the saved state of ``step``: the last one, or the one before it (saved
        with ``keep_previous``). Raises ValueError if neither is that step."""
        state = self.state
        if state is not None and state.get("step") == step:
            return
        previous = None if state is None else state.get("previous")
        if previous is None or previous.get("step") != step:
            have = "none" if state is None else f"{state.get('step')} and {None if previous is None else previous.get('step')}"
            raise self.damaged(f"it holds no state of step {step} (it has {have}), the last step every rank saved")
        self.state = dict(previous, plan=state.get("plan"))
        self.area.continue_from(self.state)

    def summary(self, resumed_from: int) -> dict[str, float]:
        """What a report records: where the run resumed, checkpoints saved and their seconds."""
        return {"resumed_from": resumed_from, "saves": self.saves, "seconds": round(self.seconds, 3)}

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the saved state."""
        return self.area.load(self.state) if self.state else {}

    def growing(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        """A growing array of the folder (a search's finished rows)."""
        return self.area.array(name, shape, dtype)


def useless_after(error: BaseException, progress: bool) -> bool:
    """Whether a run's checkpoint is of no use once ``error`` ended the run.

    A refused checkpoint (:class:`~knng.io.workarea.CheckpointError`) is the user's to decide
    on: kept; one that could not be written leaves the one before it, kept if it recorded progress. Bad input found mid-run (``ValueError``, ``TypeError``: a NaN in the last rows of a
    file) fails again from any checkpoint of these inputs, and other inputs cannot resume it:
    useless. Anything else (an interruption, a device or disk failure) leaves a checkpoint that
    ``resume`` continues, if it recorded ``progress``.
    """
    if isinstance(error, CheckpointWriteError):
        return not progress  # the checkpoint before it is intact
    if isinstance(error, CheckpointError):
        return False
    if isinstance(error, (ValueError, TypeError)):
        return True
    return not progress


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
