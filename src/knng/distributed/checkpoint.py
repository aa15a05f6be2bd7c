"""Checkpoints of a distributed run: every rank saves its own state in its own folder.

A distributed graph's ranks save independently (``independent=True``: each rank's share runs
as one device's graph and resumes from its own last save). A sharded search's ranks save at
steps they all agree on, as below.

A distributed run's work area (one folder, on a file system every rank can reach, like the
output of :func:`knng.distributed.graph_to_files`) holds:

- ``fingerprint.json``: the run's identity (inputs, k, metric, knng version, kind of device)
  **and the number of ranks**, written by rank 0; a run with other inputs, or with another
  number of ranks, is refused (a rank's state is its share of the graph's or the sharded search's plan,
  which depends on the number of ranks);
- ``rank-<r>-of-<R>/``: rank r's own :class:`~knng.io.workarea.WorkArea`, written through an
  engine :class:`~knng.engine.checkpoint.Checkpoint` (generations, growing arrays, the state
  renamed in atomically);
- ``state.json``: the last step every rank has saved (for messages only; written by rank 0).

Saving is a two-phase step. The ranks agree to save at a step (an all-reduce of "a checkpoint
is due" on any rank, issued a few steps ahead so that it costs no wait; with an interval of 0
every step saves and no agreement is needed), each rank writes its state for that step while
its previous state and generation stay on disk, then a barrier: no rank writes the next step
before every rank has written this one. So at any instant the ranks' last saved steps differ by
at most one save, and every rank still holds the state of the older one. A resumed run takes
the newest step that every rank has completed (the smallest of the ranks' last steps), each
rank going back one save where it had got ahead: a kill between the ranks' saves never mixes
steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from knng._inputs import InputArray
from knng._version import VERSION
from knng.distributed.comm import Comm
from knng.engine.checkpoint import DEFAULT_INTERVAL, Checkpoint, input_fingerprint, useless_after
from knng.io.workarea import (
    CheckpointDamagedError, CheckpointError, CheckpointExistsError, CheckpointMismatchError, NotAWorkAreaError,
    WorkArea,
)

__all__ = ["DistributedCheckpoint", "open_checkpoint", "rank_folder"]

#: Errors a rank may meet while opening its checkpoint; the others raise the same, with its message.
_ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (
    CheckpointExistsError, CheckpointMismatchError, CheckpointDamagedError, NotAWorkAreaError, ValueError)}


def rank_folder(folder: str | Path, rank: int, world: int) -> Path:
    """Rank ``rank``'s sub-area of a distributed work area ``folder``."""
    return Path(folder) / f"rank-{rank}-of-{world}"


class DistributedCheckpoint:
    """One rank's side of a distributed run's checkpoints; collective (every rank makes each call).

    Parameters
    ----------
    folder : str or os.PathLike
        The run's work area, shared by every rank.
    fingerprint : callable
        Returns the run's identity (plain JSON values); called on rank 0 only, so that only one
        rank hashes the inputs.
    resume : bool
        Continue the checkpoint found in ``folder`` (from the beginning if there is none);
        without it, a checkpoint found there is an error.
    interval : float
        Seconds between checkpoints at least (as :class:`~knng.engine.checkpoint.Checkpoint`);
        0: every step.
    comm : Comm
        The run's collectives.
    device : torch.device
        Where the agreement's tensors live (the process group's device).
    independent : bool
        The ranks' steps are their own (the distributed graph: a rank's share runs as one
        device's graph, its checkpoints the engine's, in its own folder): no agreement on when
        to save, and each rank resumes from its own last save. Otherwise (the sharded search)
        the ranks save the same steps (below).

    Attributes
    ----------
    step : int
        The step resumed from (0: the beginning).
    state : dict or None
        This rank's saved state of that step (None: start from the beginning).
    """

    def __init__(self, folder: Any, fingerprint: Callable[[], dict[str, Any]], resume: bool, comm: Comm,
                 device: torch.device, interval: float = DEFAULT_INTERVAL, independent: bool = False) -> None:
        self.comm, self.device = comm, device
        self.top = WorkArea(folder)
        self._decisions: deque = deque()
        world, rank = comm.world, comm.rank
        run = ""
        error: BaseException | None = None
        if rank == 0:
            try:
                shared = dict(fingerprint(), world=world)
                _refuse_other_world(self.top, world)
                self.top.start(shared, resume)
                run = hashlib.blake2b(json.dumps(shared, sort_keys=True).encode(), digest_size=16).hexdigest()
                comm.store.set("checkpoint/run", run)
            except (CheckpointError, ValueError) as exc:
                error = exc
        _agree_on_errors(comm, device, error, "opening")
        if rank != 0:
            run = comm.store.get("checkpoint/run").decode("utf-8")
        sub = rank_folder(self.top.path, rank, world)
        mine = {"run": run, "rank": rank, "world": world}
        try:
            # resume=True: the shared fingerprint has been checked (and a fresh area has no
            # sub-areas); what is here belongs to this run.
            self.local = Checkpoint(WorkArea(sub), mine, True, interval)
        except (CheckpointError, ValueError) as exc:
            error = exc
        _agree_on_errors(comm, device, error, "opening its own part")
        if independent:  # each rank's steps are its own: it resumes from its own last save
            self.state = self.local.state if self.local.resumed else None
            self.step = 0 if self.state is None else int(self.state.get("step", 0))
            return
        state = self.local.state
        last = -1 if state is None else int(state.get("step", -1))
        steps = _all_gather_ints(comm, device, [last], "the agreement on the step to resume from")
        self.step = max(0, min(row[0] for row in steps))
        if min(row[0] for row in steps) < 0:
            if state is not None:  # this rank saved, another never did: start again, cleanly
                self.local.area.remove()
                self.local = Checkpoint(WorkArea(sub), mine, True, interval)
            self.state = None
        else:
            try:
                self.local.rewind(min(row[0] for row in steps))
            except CheckpointError as exc:
                error = exc
            _agree_on_errors(comm, device, error, "going back to the step every rank saved")
            self.state = self.local.state

    @property
    def resumed(self) -> bool:
        """Whether this run continues saved work (past the start)."""
        return self.step > 0

    def check_step(self, steps: int) -> int:
        """The step resumed from, checked against the plan's ``steps`` (see
        :meth:`knng.engine.checkpoint.Checkpoint.check_step`)."""
        return self.local.check_step(steps)

    def restoring(self) -> Any:
        """Reading this rank's saved state back (see :meth:`knng.engine.checkpoint.Checkpoint.restoring`)."""
        return self.local.restoring()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The run's work: where it fails, rank 0 removes a work area that cannot help a later run
        (:func:`~knng.engine.checkpoint.useless_after`: judged by the last step every rank saved);
        the error goes on. The other ranks may still be failing: only a run without saved progress,
        or stopped by its own bad input, is removed."""
        try:
            yield
        except BaseException as exc:
            self.local.area.close()
            if self.comm.rank == 0 and useless_after(exc, self.top.has_progress()):
                with contextlib.suppress(OSError):
                    self.top.remove()
            else:
                self.top.close()
            raise

    def plan(self, planned: dict[str, Any]) -> dict[str, Any]:
        """The plan to run: the saved one when resuming, else ``planned`` (recorded as step 0)."""
        if self.state is not None and self.state.get("plan") is not None:
            return dict(self.state["plan"])
        self.local.state = self.local.area.save({"plan": planned, "step": 0, "progress": "started"})
        self.state = self.local.state
        return planned

    def propose(self) -> None:
        """Issue this step's agreement on whether a checkpoint is due (on any rank); nothing to
        agree on with an interval of 0 (every step saves)."""
        if self.local.interval == 0:
            return
        flag = torch.tensor([1.0 if self.local.due() else 0.0], dtype=torch.float64, device=self.device)
        self._decisions.append((self.comm.all_reduce(flag, "the agreement on a checkpoint", op=dist.ReduceOp.MAX),
                                flag))

    def decided(self, lag: int) -> bool:
        """Whether the ranks agreed, ``lag`` steps ago, to save now (every rank gets the same
        answer at the same step; waiting ``lag`` steps lets a rank run ahead of its peers)."""
        if self.local.interval == 0:
            return True
        if len(self._decisions) <= lag:
            return False
        pending, flag = self._decisions.popleft()
        self.comm.wait(pending)
        return bool(flag.item())

    def settle(self) -> None:
        """Wait for the agreements still in flight (their collectives must complete)."""
        while self._decisions:
            self.comm.wait(self._decisions.popleft()[0])

    def save(self, step: int, state: dict[str, Any], arrays: dict[str, torch.Tensor] | None, progress: str,
             final_rows: int | None = None) -> None:
        """Save this rank's ``state`` of ``step`` (collective: every rank saves the same step);
        ``final_rows``: the leading rows of the growing arrays that are final.

        No collective may be in flight that changes what is saved.
        """
        self.comm.status(f"saving the checkpoint of step {step}")
        self.local.save(dict(state, step=step, progress=progress), arrays, keep_previous=True, final_rows=final_rows)
        self.state = self.local.state
        # Phase two: no rank goes on (and saves a later step) before every rank has this one.
        self.comm.barrier(f"the checkpoint of step {step} (every rank's state written)")
        if self.comm.rank == 0:
            self.top.save({"step": step, "progress": progress})

    def arrays(self) -> dict[str, np.ndarray]:
        """This rank's saved arrays of the step resumed from."""
        return self.local.arrays()

    def growing(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        """A growing array of this rank's area (a search's finished rows)."""
        return self.local.growing(name, shape, dtype)

    def summary(self) -> dict[str, float]:
        """What a report records: where the run resumed, checkpoints saved and their seconds
        (this rank's; the slowest rank's seconds in the report)."""
        seconds = _all_gather_floats(self.comm, self.device, [self.local.seconds], "the gather of checkpoint times")
        return {"resumed_from": self.step, "saves": self.local.saves, "seconds": round(max(r[0] for r in seconds), 3)}

    def close(self, keep: bool) -> None:
        """After success: remove the work area (rank 0, once every rank is done with it) unless
        ``keep`` (the command line keeps it until its results are committed)."""
        self.local.area.close()
        if keep:
            self.top.close()
            return
        self.comm.barrier("the end of every rank's use of the checkpoint")
        if self.comm.rank == 0:
            self.top.remove()


def open_checkpoint(folder: Any, resume: bool, interval: float, comm: Comm, device: torch.device, *,
                    operation: str, inputs: dict[str, InputArray], k: int, metric: str, independent: bool = False,
                    **fields: Any) -> DistributedCheckpoint | None:
    """The run's checkpoint in ``folder`` (None without one; collective): every rank must pass
    the same folder (or none) and ``resume``. The fingerprint (made on rank 0) names the inputs,
    ``operation``, ``k``, ``metric``, the knng version, the kind of device, ``fields`` and the
    number of ranks."""
    flags = _all_gather_ints(comm, device, [int(folder is not None), int(bool(resume))],
                             "the agreement on checkpoint and resume")
    for i, name in enumerate(("checkpoint", "resume")):
        if len({row[i] for row in flags}) > 1:
            listing = ", ".join(f"rank {r}: {'given' if row[i] else 'not given'}" for r, row in enumerate(flags))
            raise ValueError(f"every rank must be given the same {name} argument; got {listing}")
    if folder is None:
        return None

    def fingerprint() -> dict[str, Any]:
        return {"knng": VERSION, "operation": operation, "k": k, "metric": metric, "device": device.type,
                "inputs": {name: input_fingerprint(x) for name, x in inputs.items()}, **fields}

    return DistributedCheckpoint(folder, fingerprint, resume, comm, device, float(interval), independent=independent)


def _refuse_other_world(area: WorkArea, world: int) -> None:
    """A checkpoint of another number of ranks (or of one process) cannot be resumed: say so."""
    path = area.path / "fingerprint.json"
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("world")
    except (OSError, ValueError):
        return
    if saved == world:
        return
    then = "one process (not distributed)" if saved is None else f"{saved} ranks"
    raise CheckpointMismatchError(
        f"cannot resume from {area.path}: its checkpoint was written by a run of {then}, and this run has "
        f"{world} ranks; a distributed checkpoint resumes only with the same number of ranks", path=area.path,
        remedy=(f"run {saved} processes" if saved else "resume it in one process") + f", or delete {area.path} to "
        "start again",
        cli_remedy=("resume it without --gpus/--procs" if saved is None else
                    f"resume it with --procs {saved}, --gpus {saved} or {saved} processes under torchrun")
        + ", or run with --overwrite to discard it and start again")


def _agree_on_errors(comm: Comm, device: torch.device, error: BaseException | None, phase: str) -> None:
    """Raise on every rank alike if any rank met an error (the first failing rank's message)."""
    if error is not None:
        fields = error.fields() if isinstance(error, CheckpointError) else {"problem": str(error)}
        comm.store.set(f"checkpoint/error/{phase}/{comm.rank}", json.dumps([type(error).__name__, fields]))
    failed = [r for r, row in enumerate(_all_gather_ints(comm, device, [int(error is not None)],
                                                          "the agreement on opening the checkpoint")) if row[0]]
    if not failed:
        return
    if error is not None and failed[0] == comm.rank:
        raise error
    name, fields = json.loads(comm.store.get(f"checkpoint/error/{phase}/{failed[0]}").decode("utf-8"))
    cls = _ERRORS.get(name, RuntimeError)
    if issubclass(cls, CheckpointError):
        raise cls(fields.pop("problem"), **fields)
    raise cls(fields["problem"])


def _all_gather_ints(comm: Comm, device: torch.device, values: list[int], what: str) -> list[list[int]]:
    local = torch.tensor(values, dtype=torch.int64, device=device)
    out = torch.empty(comm.world * len(values), dtype=torch.int64, device=device)
    comm.wait(comm.all_gather(out, local, what))
    return out.view(comm.world, len(values)).cpu().tolist()


def _all_gather_floats(comm: Comm, device: torch.device, values: list[float], what: str) -> list[list[float]]:
    local = torch.tensor(values, dtype=torch.float64, device=device)
    out = torch.empty(comm.world * len(values), dtype=torch.float64, device=device)
    comm.wait(comm.all_gather(out, local, what))
    return out.view(comm.world, len(values)).cpu().tolist()

