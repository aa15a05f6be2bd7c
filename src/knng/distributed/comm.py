"""The communication layer of the distributed engine: collectives that fail loudly.

Every collective the engine issues goes through :class:`Comm`, asynchronously, and every wait
for one is a polling loop in Python that also watches the other ranks through the process
group's key-value store (the one ``torchrun`` or ``init_process_group`` set up). Each rank posts
there

* ``status/<rank>``: what it is doing ("screening block (3, 5)"), updated at every step;
* ``done/<rank>``: a progress counter (blocks and row chunks finished);
* ``seq/<rank>``: how many collectives it has issued;
* ``hb/<rank>``: a heartbeat counter, bumped every second by a background thread;
* ``error/<rank>``: the error that stopped it, if one did.

So a rank that waits for a collective can tell, and say, why it does not complete: a peer
posted an error (it stops at once and repeats that error), a peer's heartbeat stopped (the
process died: it stops after ``heartbeat_timeout`` seconds), or a peer that has not reached the
collective made no progress for ``timeout`` seconds (it hangs). The error names the rank and
what it was last doing. NCCL itself would wait for ten minutes and then abort the process
without saying why.

Rank 0 also turns the progress counters of all ranks into one progress bar for the whole job.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["Comm", "CommStats", "DistributedError", "Pending", "DEFAULT_TIMEOUT", "DEFAULT_HEARTBEAT_TIMEOUT",
           "agree", "check_agreement"]

#: Seconds a peer may go without progress while others wait for it, before they give up.
DEFAULT_TIMEOUT = 300.0
#: Seconds without a heartbeat after which a peer counts as dead.
DEFAULT_HEARTBEAT_TIMEOUT = 10.0
#: Seconds between heartbeats (and between updates of rank 0's progress bar).
HEARTBEAT_INTERVAL = 0.5
#: Seconds between looks at the store while waiting for a collective.
CHECK_INTERVAL = 0.2
#: Environment variable for fault injection in tests: ``RANK:POINT:COUNT:ACTION``, e.g.
#: ``1:block:2:exit`` makes rank 1 exit at its second "block" point. Actions: exit, hang, raise.
FAULT_ENV = "KNNG_FAULT_INJECT"

_RUN_COUNTER = itertools.count()


class DistributedError(RuntimeError):
    """A distributed run stopped because a rank failed, died or hung; the message says which.

    Attributes
    ----------
    rank : int or None
        The rank that failed (None when it could not be told).
    """

    def __init__(self, message: str, rank: int | None = None, *, relayed: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        # Read from another rank's posted error: it is on the store already, and posting it
        # again as this rank's would make it this rank's own failure when it names this rank.
        self.relayed = relayed


@dataclass
class CommStats:
    """What the collectives of one rank cost.

    Attributes
    ----------
    collectives : int
        Collectives issued.
    bytes : int
        Bytes this rank contributed to them.
    wait_seconds : float
        Time this rank's host thread was blocked waiting for collectives (late peers included).
    waits : list of (str, float, float)
        Every wait of a millisecond or more: what, seconds, and when it began (seconds since
        the Comm was made) — where a rank lost time, for profiles.
    ops : list of tuple
        Every collective as (kind, input shape, dtype name, output shape or None, root or
        None), for :func:`replay`.
    """

    collectives: int = 0
    bytes: int = 0
    wait_seconds: float = 0.0
    waits: list = field(default_factory=list)
    ops: list = field(default_factory=list)



@dataclass
class Pending:
    """An issued collective: wait for it with :meth:`Comm.wait`."""

    work: Any
    what: str
    seq: int
    nbytes: int
    done: bool = False


def _all_gather_into(out: torch.Tensor, inp: torch.Tensor, group: Any) -> Any:
    # torch ≥ 2.13 renamed all_gather_into_tensor to all_gather_single; GPU machines run 2.11.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=True)


class Comm:
    """One rank's side of a distributed run: collectives, status, failure detection, progress.

    Use as a context manager around the run; leaving it with an exception posts that error
    for the other ranks (unless it came from them).

    Parameters
    ----------
    group : ProcessGroup, optional
        The process group (default: the default group, which must be initialised).
    timeout : float
        Seconds a peer may make no progress while this rank waits for it.
    heartbeat_timeout : float
        Seconds without a heartbeat after which a peer counts as dead.
    progress : bool
        Whether rank 0 shows a progress bar for the whole job (once
        :meth:`set_progress_total` has told it the total).
    desc : str
        Label of the progress bar.
    """

    def __init__(self, group: Any = None, *, timeout: float = DEFAULT_TIMEOUT,
                 heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, progress: bool = False,
                 desc: str = "knng") -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("knng's distributed engine needs an initialised torch.distributed process group "
                               "(torchrun, or knng.distributed.init())")
        if not timeout > 0 or not heartbeat_timeout > 0:
            raise ValueError(f"timeout and heartbeat_timeout must be positive, got {timeout} and {heartbeat_timeout}")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout, self.heartbeat_timeout = float(timeout), float(heartbeat_timeout)
        from torch.distributed import distributed_c10d

        base = distributed_c10d._get_default_store()  # the rendezvous store every rank already shares
        self.store = dist.PrefixStore(f"knng/run{next(_RUN_COUNTER)}", base)
        self.stats = CommStats()
        self._created = time.monotonic()
        self._seq = 0
        self._status = "starting"
        self._seen: dict[str, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress, self._progress_total, self._desc = progress, None, desc
        self._fault = _parse_fault(os.environ.get(FAULT_ENV), self.rank)
        self._fault_counts: dict[str, int] = {}
        self._closed = False
        self._blocked: tuple[str, float, int] | None = None  # a collective call that has not returned
        self._fatal: DistributedError | None = None  # set by the watchdog: raised at the next call
        self._noticed = threading.Event()  # the main thread has raised it
        self._next_watch = 0.0
        self._last_activity = time.monotonic()  # the main thread's last call into this object
        self._store_call(lambda: (self.store.set(f"status/{self.rank}", self._status),
                                  self.store.add(f"hb/{self.rank}", 1),
                                  self.store.add(f"done/{self.rank}", 0),
                                  self.store.add(f"seq/{self.rank}", 0)), "starting")

    # ---------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Comm":
        self._thread = threading.Thread(target=self._background, name=f"knng-heartbeat-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.post_error(exc)
        self.close()

    def close(self) -> None:
        """Stop the heartbeat and the progress bar (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._noticed.set()  # the main thread has left: the watchdog must not end the process
        if self._thread is not None:
            self._thread.join(timeout=5)

    def post_error(self, exc: BaseException) -> None:
        """Tell the other ranks that this one stopped, and why (and whose failure it saw, if it
        stopped because of another rank: the others then name that one, not this one)."""
        if getattr(exc, "relayed", False):
            return
        culprit = exc.rank if isinstance(exc, DistributedError) and exc.rank is not None else self.rank
        text = f"{type(exc).__name__}: {exc}" if culprit == self.rank else str(exc)
        try:
            # The culprit first: a rank that finds this error key reads it at once, and without
            # it took this rank for the culprit (a relayed failure named the wrong rank).
            self.store.set(f"culprit/{self.rank}", str(culprit))
            self.store.set(f"error/{self.rank}", text)
            self.store.add("errors", 1)
        except Exception:  # noqa: BLE001 - the store may be gone with rank 0; nothing more to tell
            pass

    # ------------------------------------------------------------------------------ status
    def _raise_if_fatal(self) -> None:
        self._last_activity = time.monotonic()
        if self._fatal is not None:
            self._noticed.set()
            raise self._fatal

    def status(self, what: str) -> None:
        """Post what this rank is doing now (shown in the others' errors if it stops)."""
        self._raise_if_fatal()
        self._status = what
        self._store_call(lambda: self.store.set(f"status/{self.rank}", what), what)
        self.fault_point(what.split(" ", 1)[0])

    def set_progress_total(self, total: int) -> None:
        """The job's total progress units (every rank's ticks together), for rank 0's bar."""
        self._progress_total = int(total)

    def tick(self, n: int = 1) -> None:
        """Count ``n`` units of finished work (rank 0's progress bar; proof of life for hang checks)."""
        self._raise_if_fatal()
        self._store_call(lambda: self.store.add(f"done/{self.rank}", n), self._status)

    # ------------------------------------------------------------------------- collectives
    def _issue(self, what: str, nbytes: int, start: Callable[[], Any], op: tuple = ()) -> Pending:
        self._raise_if_fatal()
        self._seq += 1
        self.stats.ops.append(op)
        self._store_call(lambda: self.store.add(f"seq/{self.rank}", 1), what)
        self.stats.collectives += 1
        self.stats.bytes += nbytes
        # NCCL may block the host right here (a lazy connection to a peer that never answers);
        # the background thread watches calls that do not return.
        self._blocked = (what, time.monotonic(), self._seq)
        try:
            work = start()
        except Exception as exc:  # noqa: BLE001 - a broken group: say what we were doing
            if self._fatal is not None:
                self._noticed.set()
                raise self._fatal from exc
            self._diagnose(what, 0.0)
            raise DistributedError(f"rank {self.rank}: {what} failed: {exc}", self.rank) from exc
        finally:
            self._blocked = None
        return Pending(work, what, self._seq, nbytes)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, what: str) -> Pending:
        """``out`` (world · m, …) ← every rank's ``inp`` (m, …), in rank order."""
        return self._issue(what, inp.numel() * inp.element_size(), lambda: _all_gather_into(out, inp, self.group),
                           ("all_gather", tuple(inp.shape), str(inp.dtype), tuple(out.shape), None))

    def gather(self, inp: torch.Tensor, outs: list[torch.Tensor] | None, dst: int, what: str) -> Pending:
        """``outs`` on rank ``dst`` ← every rank's ``inp``."""
        return self._issue(what, inp.numel() * inp.element_size(),
                           lambda: dist.gather(inp, outs if self.rank == dst else None, dst=dst, group=self.group,
                                               async_op=True),
                           ("gather", tuple(inp.shape), str(inp.dtype), None, dst))

    def scatter(self, out: torch.Tensor, chunks: list[torch.Tensor] | None, src: int, what: str) -> Pending:
        """``out`` on rank r ← ``chunks[r]`` of rank ``src``."""
        return self._issue(what, sum(c.numel() * c.element_size() for c in chunks) if chunks else 0,
                           lambda: dist.scatter(out, chunks if self.rank == src else None, src=src, group=self.group,
                                                async_op=True),
                           ("scatter", tuple(out.shape), str(out.dtype), None, src))

    def broadcast(self, tensor: torch.Tensor, src: int, what: str) -> Pending:
        """``tensor`` on every rank ← ``tensor`` on rank ``src``, in place."""
        return self._issue(what, tensor.numel() * tensor.element_size() if self.rank == src else 0,
                           lambda: dist.broadcast(tensor, src=src, group=self.group, async_op=True),
                           ("broadcast", tuple(tensor.shape), str(tensor.dtype), None, src))

    def all_reduce(self, tensor: torch.Tensor, what: str, op: Any = None) -> Pending:
        """``tensor`` ← the sum (or ``op``) over ranks, in place."""
        op = dist.ReduceOp.SUM if op is None else op
        return self._issue(what, tensor.numel() * tensor.element_size(),
                           lambda: dist.all_reduce(tensor, op=op, group=self.group, async_op=True),
                           ("all_reduce", tuple(tensor.shape), str(tensor.dtype), None, None))

    def connect_pairs(self, device: torch.device) -> None:
        """Make NCCL set up its point-to-point connections between every pair of ranks now.

        NCCL connects two ranks for gathers and scatters lazily, inside the first call, and
        that call blocks the host until the peer answers: a peer that died later would leave
        it blocked where no wait can see it. Here every rank is known alive. (Gloo connects
        every pair when the group is made.)
        """
        if not _is_nccl_device(self.group, device):
            return
        token = torch.zeros(1, device=device)
        for root in range(self.world):
            outs = [torch.empty_like(token) for _ in range(self.world)] if self.rank == root else None
            self.wait(self.gather(token, outs, root, "the connection of every rank pair (gather)"))
            chunks = [token.clone() for _ in range(self.world)] if self.rank == root else None
            self.wait(self.scatter(torch.empty_like(token), chunks, root, "the connection of every rank pair (scatter)"))

    def wait(self, pending: Pending) -> None:
        """Block until ``pending`` completes; raise :class:`DistributedError` if a peer fails."""
        if pending.done:
            return
        t0 = time.monotonic()
        next_check = t0 + CHECK_INTERVAL
        nap = 5e-5
        try:
            while not pending.work.is_completed():
                self._raise_if_fatal()
                now = time.monotonic()
                if now >= next_check:
                    self._check_peers(pending, now - t0)
                    next_check = now + CHECK_INTERVAL
                time.sleep(nap)
                nap = min(nap * 2, 5e-4)
            pending.work.wait()
        except DistributedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the collective broke: find out who broke it
            if self._fatal is not None:  # the watchdog aborted the group, and knows why
                self._noticed.set()
                raise self._fatal from exc
            self._diagnose(pending.what, time.monotonic() - t0)
            raise DistributedError(f"rank {self.rank}: {pending.what} failed: {exc}") from exc
        finally:
            waited = time.monotonic() - t0
            self.stats.wait_seconds += waited
            if waited >= 1e-3:
                self.stats.waits.append((pending.what, waited, t0 - self._created))
        pending.done = True

    def barrier(self, what: str) -> None:
        """Every rank reaches this point (a one-element all-reduce on the group's device)."""
        dev = torch.device("cuda", torch.cuda.current_device()) if _is_nccl(self.group) else torch.device("cpu")
        self.wait(self.all_reduce(torch.zeros(1, device=dev), what))

    # -------------------------------------------------------------------- failure detection
    def _store_call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - the store lives with rank 0 (or the launcher)
            raise DistributedError(
                f"rank {self.rank} lost the rendezvous store while {what} ({exc}); the rank or launcher "
                "that hosts it (rank 0 under knng's launcher) has probably died", None) from exc

    def _peer_status(self, r: int) -> str:
        key = f"status/{r}"
        try:
            if self.store.check([key]):
                return self.store.get(key).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001
            pass
        return "unknown (it never reported)"

    def _changed(self, key: str, value: int, now: float) -> float:
        """Seconds since the counter ``key`` last changed (as seen by this rank)."""
        old = self._seen.get(key)
        if old is None or old[0] != value:
            self._seen[key] = (value, now)
            return 0.0
        return now - old[1]

    def _check_failures(self, doing: str) -> None:
        """Raise if a peer posted an error or its heartbeat stopped (``doing``: what this rank does)."""
        now = time.monotonic()
        store = self.store
        if self._store_call(lambda: store.add("errors", 0), doing):
            self._raise_posted_error(doing)
        for r in range(self.world):
            if r == self.rank:
                continue
            beats = self._store_call(lambda r=r: store.add(f"hb/{r}", 0), doing)
            silent = self._changed(f"hb/{r}", beats, now)
            if silent > self.heartbeat_timeout:
                raise DistributedError(
                    f"rank {r} stopped responding (no heartbeat for {silent:.0f} s; it has probably died) "
                    f"while {self._peer_status(r)}; rank {self.rank} was {doing}", r)

    def _check_peers(self, pending: Pending, waited: float, blame_network: bool = True) -> None:
        now = time.monotonic()
        store = self.store
        self._check_failures(f"waiting for {pending.what}")
        laggards = []
        for r in range(self.world):
            if r == self.rank:
                continue
            progress = self._store_call(lambda r=r: store.add(f"done/{r}", 0), "waiting")
            still = self._changed(f"done/{r}", progress, now)
            seq = self._store_call(lambda r=r: store.add(f"seq/{r}", 0), "waiting")
            if seq < pending.seq:
                laggards.append((r, still))
        if waited > self.timeout:
            for r, still in laggards:
                if still > self.timeout:
                    raise DistributedError(
                        f"rank {r} made no progress for {still:.0f} s (timeout {self.timeout:g} s) while "
                        f"{self._peer_status(r)}; it has not reached {pending.what}, which rank {self.rank} "
                        "waits for: stopping", r)
            if not laggards and blame_network:
                # Every rank reached it: a peer that died just after issuing it is the likelier
                # cause than the network, if its heartbeat has already fallen silent.
                silent = {r: now - self._seen[f"hb/{r}"][1] for r in range(self.world)
                          if r != self.rank and f"hb/{r}" in self._seen}
                quiet = max(silent, key=silent.get, default=None)
                if quiet is not None and silent[quiet] > 4 * HEARTBEAT_INTERVAL:
                    raise DistributedError(
                        f"rank {quiet} stopped responding (no heartbeat for {silent[quiet]:.0f} s; it has probably "
                        f"died) while {self._peer_status(quiet)}; rank {self.rank} was waiting for {pending.what}",
                        quiet)
                raise DistributedError(
                    f"{pending.what} has not completed after {waited:.0f} s (timeout {self.timeout:g} s) although "
                    "every rank reached it: a network or NCCL problem", None)

    def _raise_posted_error(self, what: str) -> None:
        posted = []
        for r in range(self.world):
            key = f"error/{r}"
            if r != self.rank and self.store.check([key]):
                message = self.store.get(key).decode("utf-8", "replace")
                culprit = int(self.store.get(f"culprit/{r}")) if self.store.check([f"culprit/{r}"]) else r
                posted.append((r, culprit, message))
        for r, culprit, message in posted:  # a rank's own failure first
            if culprit == r:
                raise DistributedError(f"rank {r} failed while {self._peer_status(r)}: {message}", r, relayed=True)
        for r, culprit, message in posted:  # else what a rank that stopped because of it saw
            raise DistributedError(f"{message} (as rank {r} reported)", culprit, relayed=True)

    def _diagnose(self, what: str, waited: float) -> None:
        """After a collective broke: raise the most telling error the store can give."""
        try:
            if self.store.add("errors", 0):
                self._raise_posted_error(what)
        except DistributedError:
            raise
        except Exception:  # noqa: BLE001 - store unreachable: the caller reports the broken collective
            return
        # Gloo notices a dead peer at once (its socket closes); name the peers whose
        # heartbeat stops within the next moments.
        deadline = time.monotonic() + min(self.heartbeat_timeout, 3 * HEARTBEAT_INTERVAL + 1.0)
        start = {}
        for r in range(self.world):
            if r != self.rank:
                try:
                    start[r] = self.store.add(f"hb/{r}", 0)
                except Exception:  # noqa: BLE001
                    return
        while time.monotonic() < deadline:
            time.sleep(HEARTBEAT_INTERVAL)
            for r, beats in start.items():
                try:
                    now_beats = self.store.add(f"hb/{r}", 0)
                except Exception:  # noqa: BLE001
                    return
                if now_beats != beats:
                    start[r] = -1  # alive
            if self.store.add("errors", 0):
                self._raise_posted_error(what)
        dead = [r for r, beats in start.items() if beats != -1]
        if dead:
            r = dead[0]
            raise DistributedError(
                f"rank {r} stopped responding (its heartbeat stopped; it has probably died) while "
                f"{self._peer_status(r)}; rank {self.rank} was waiting for {what}", r)

    # ------------------------------------------------------------------ heartbeat, progress
    def _background(self) -> None:
        bar = None
        shown = 0
        try:
            while not self._stop.wait(HEARTBEAT_INTERVAL):
                try:
                    self.store.add(f"hb/{self.rank}", 1)
                    self._watch()
                    if bar is None and self._progress and self.rank == 0 and self._progress_total:
                        from tqdm.auto import tqdm

                        bar = tqdm(total=self._progress_total, desc=self._desc, unit="step", dynamic_ncols=True,
                                   leave=False)
                    if bar is not None:
                        total = sum(self.store.add(f"done/{r}", 0) for r in range(self.world))
                        if total > shown:
                            bar.update(total - shown)
                            shown = total
                except Exception:  # noqa: BLE001 - the store is gone; the main thread will say so
                    return
        finally:
            if bar is not None:
                bar.close()

    def _watch(self) -> None:
        """The watchdog, once a second from the background thread.

        The main thread checks its peers only while it waits for a collective; with NCCL it can
        also block elsewhere on a dead peer (a collective call that never returns, or a CUDA
        call that waits for memory held by a stuck collective). So: whatever the main thread
        does, a peer that posted an error or whose heartbeat stopped — or, while the main
        thread is stuck inside a collective call, one that made no progress for ``timeout`` —
        ends the run. The error is posted for the others, the process group is aborted (which
        frees calls stuck in NCCL; they return with errors that the main thread turns into this
        one) and, if the main thread has not raised it within a few seconds, this process
        prints it and exits.
        """
        now = time.monotonic()
        if self._fatal is not None or now < self._next_watch or self._stop.is_set():
            return
        self._next_watch = now + 1.0
        blocked = self._blocked
        try:
            if blocked is not None and now - blocked[1] >= 1.0:
                self._check_peers(Pending(None, blocked[0], blocked[2], 0), now - blocked[1])
            elif now - self._last_activity > self.timeout:
                # Stuck outside any collective call (a CUDA call waiting for a stuck collective):
                # the peers that have not reached this rank's last collective are the suspects.
                self._check_peers(Pending(None, f"its own work after {self._status}", self._seq, 0),
                                  now - self._last_activity, blame_network=False)
            else:
                self._check_failures(self._status)
            return
        except DistributedError as exc:
            self._fatal = exc
        self.post_error(self._fatal)
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            threading.Thread(target=_quietly, args=(abort, self.group), daemon=True).start()
        if not self._noticed.wait(5.0):  # nothing freed the main thread: the process must go
            import sys

            print(f"knng[rank {self.rank}]: error: {self._fatal}", file=sys.stderr, flush=True)
            os._exit(1)

    # ------------------------------------------------------------------- fault injection
    def fault_point(self, point: str) -> None:
        """Test hook: act on ``KNNG_FAULT_INJECT`` when this rank reaches ``point``."""
        if self._fault is None or self._fault[0] != point:
            return
        count = self._fault_counts.get(point, 0) + 1
        self._fault_counts[point] = count
        if count != self._fault[1]:
            return
        action = self._fault[2]
        if action == "exit":
            os._exit(17)
        if action == "hang":
            while True:  # heartbeats go on (the thread lives): a hang, not a death
                time.sleep(3600)
        raise RuntimeError(f"injected fault at {point} #{count}")


def _parse_fault(spec: str | None, rank: int) -> tuple[str, int, str] | None:
    if not spec:
        return None
    try:
        r, point, count, action = spec.split(":")
        if int(r) != rank:
            return None
        if action not in ("exit", "hang", "raise"):
            raise ValueError(action)
        return point, int(count), action
    except ValueError:
        raise ValueError(f"{FAULT_ENV} must look like RANK:POINT:COUNT:(exit|hang|raise), got {spec!r}") from None


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - best effort
        pass


def _is_nccl_device(group: Any, device: torch.device) -> bool:
    return device.type == "cuda" and "nccl" in str(_backend(group))


def _backend(group: Any) -> str:
    try:
        return str(dist.get_backend(group))
    except Exception:  # noqa: BLE001
        return ""


def _is_nccl(group: Any) -> bool:
    try:
        return dist.get_backend(group) == "nccl"
    except Exception:  # noqa: BLE001
        return False


def replay(ops: list[tuple], device: torch.device, group: Any = None) -> float:
    """Seconds the collectives ``ops`` (a :class:`CommStats` record) take alone, one after another.

    Collective: every rank must replay the same record. Each collective is timed between a
    barrier and its completion on the device, so the sum is the communication time of a run
    with no computation to overlap and no late peers: what "the share of time spent
    communicating" is measured with.
    """
    rank = dist.get_rank(group)
    total = 0.0
    token = torch.zeros(1, device=device)
    buffers: dict[tuple, torch.Tensor] = {}

    def buffer(shape: tuple, dtype: str) -> torch.Tensor:
        key = (shape, dtype)
        if key not in buffers:
            buffers[key] = torch.zeros(shape, dtype=getattr(torch, dtype.replace("torch.", "")), device=device)
        return buffers[key]

    for kind, shape, dtype, out_shape, root in ops:
        inp = buffer(shape, dtype)
        dist.all_reduce(token, group=group)
        _sync(device)
        t0 = time.perf_counter()
        if kind == "all_gather":
            _all_gather_into(buffer(out_shape, dtype), inp, group).wait()
        elif kind == "gather":
            outs = [torch.empty_like(inp) for _ in range(dist.get_world_size(group))] if rank == root else None
            dist.gather(inp, outs, dst=root, group=group)
        elif kind == "scatter":
            chunks = [torch.empty_like(inp) for _ in range(dist.get_world_size(group))] if rank == root else None
            dist.scatter(inp, chunks, src=root, group=group)
        elif kind == "broadcast":
            dist.broadcast(inp, src=root, group=group)
        else:
            dist.all_reduce(inp, group=group)
        _sync(device)
        total += time.perf_counter() - t0
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def agree(comm: Comm, device: torch.device, values: dict[str, int]) -> dict[str, list[int]]:
    """All-gather a few integers from every rank; returns name → list over ranks."""
    names = list(values)
    local = torch.tensor([int(values[k]) for k in names], dtype=torch.int64, device=device)
    out = torch.empty(comm.world * len(names), dtype=torch.int64, device=device)
    comm.wait(comm.all_gather(out, local, "the agreement on inputs and plan"))
    table = out.view(comm.world, len(names)).cpu().tolist()
    return {name: [row[i] for row in table] for i, name in enumerate(names)}


def check_agreement(table: dict[str, list[int]], describe: dict[str, str]) -> None:
    """Raise ValueError (on every rank alike) if the ranks were given different inputs."""
    for name, values in table.items():
        if len(set(values)) > 1:
            what = describe.get(name, name)
            listing = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(f"every rank must be given the same {what}; got {listing}")
