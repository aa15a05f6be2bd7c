"""Start N ranks of a knng command on this host: ``knng graph DATA -k K --gpus N``.

The launcher hosts the rendezvous store itself (so the job's store outlives any rank, rank 0
included), starts ``python -m knng ARGS`` N times with the environment that ``torchrun`` would
give (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE``), and watches them.

Why not torch's elastic agent (what ``torchrun`` runs): when one rank fails, it terminates the
others within a tenth of a second, before they can say which rank failed and what it was doing.
This launcher gives the survivors ``grace`` seconds to notice through knng's store and stop with
that message, then terminates whatever is left. Across hosts, use ``torchrun`` itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

from knng._interrupts import deferred

__all__ = ["launch", "die_with_launcher", "LAUNCH_DEVICE_ENV", "LAUNCHER_PID_ENV", "STOP_SECONDS"]

#: Tells a launched rank which kind of device it is for ("cuda" or "cpu").
LAUNCH_DEVICE_ENV = "KNNG_LAUNCH_DEVICE"
#: The launcher's pid, so that its ranks end with it (:func:`die_with_launcher`).
LAUNCHER_PID_ENV = "KNNG_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """In a rank that :func:`launch` started: be terminated when the launcher dies (Linux).

    The launcher hosts the job's rendezvous store; a rank that outlives it (the launcher
    killed, say) would only fail on the lost store with torch's C++ stack frames (60 lines a
    rank). SIGTERM ends it silently instead, and the output folder's protocol keeps the results
    folder whole. Elsewhere (no ``prctl``) the rank fails as before.
    """
    pid = os.environ.get(LAUNCHER_PID_ENV)
    if not pid or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(pid):  # the launcher died before the prctl took effect
        os._exit(1)


def launch(args: list[str], nprocs: int, device: str, grace: float = 30.0) -> int:
    """Run ``python -m knng *args`` as ``nprocs`` ranks; return the job's exit status.

    Parameters
    ----------
    args : list of str
        The knng command line for every rank (without the launcher's own options).
    nprocs : int
        Ranks to start.
    device : {"cuda", "cpu"}
        "cuda": rank r uses GPU r (NCCL); "cpu": CPU processes (Gloo).
    grace : float
        Seconds the other ranks get to stop on their own (and report why) after one fails.

    Returns
    -------
    int
        0 if every rank succeeded; else the first failing rank's status (2 stays 2: bad input).

    Raises
    ------
    knng._interrupts.Interrupted
        SIGINT or SIGTERM reached the launcher: every rank was stopped first.

    Notes
    -----
    Each rank runs in a session of its own, so a Ctrl-C at the terminal reaches the launcher
    alone; the launcher stops every rank (SIGTERM to its process group, SIGKILL after
    :data:`STOP_SECONDS`) and then raises. Interruptions are held off from the first instant
    of this call (while torch is imported and the ranks are started) and acted on at once after.
    """
    with deferred() as received:
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, timeout=timedelta(seconds=60),
                         wait_for_workers=False)
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), WORLD_SIZE=str(nprocs),
                   LOCAL_WORLD_SIZE=str(nprocs), TORCHELASTIC_USE_AGENT_STORE="True",
                   **{LAUNCH_DEVICE_ENV: device, LAUNCHER_PID_ENV: str(os.getpid())})
        if device == "cpu":
            # N processes share the cores: one thread pool each would oversubscribe them.
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nprocs)))
        procs: list[subprocess.Popen] = []
        try:
            for r in range(nprocs):
                if received:
                    break
                procs.append(subprocess.Popen([sys.executable, "-m", "knng", *args],
                                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), start_new_session=True))
            status = None if received else _watch(procs, received, grace, nprocs)
        finally:
            _stop([p for p in procs if p.poll() is None])
            del store
    assert status is not None  # an interruption raised when the block ended
    return status


def _watch(procs: list[subprocess.Popen], received: list[int], grace: float, nprocs: int) -> int | None:
    """Wait for the ranks; None as soon as an interruption is ``received``."""
    first: tuple[int, int] | None = None  # (rank, status)
    deadline = None
    while not received:
        codes = [p.poll() for p in procs]
        failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
        if failed and first is None:
            first, deadline = (failed[0], codes[failed[0]]), time.monotonic() + grace
        if len(failed) >= 2:
            # Ranks that saw the failure have reported it and left; whoever is still running
            # after a moment more is the hung one.
            deadline = min(deadline, time.monotonic() + 3.0)
        if all(c is not None for c in codes):
            break
        if deadline is not None and time.monotonic() > deadline:
            _stop([p for p in procs if p.poll() is None])
            break
        time.sleep(0.05)
    if received:
        return None
    if first is None:
        return 0
    rank, code = first
    hung = [r for r, p in enumerate(procs) if p.returncode is not None and p.returncode < 0 and r != rank]
    why = f"signal {-code}" if code < 0 else f"status {code}"
    stopped = (f"; rank {hung[0]} was" if len(hung) == 1 else f"; ranks {', '.join(map(str, hung))} were")
    print(f"knng: rank {rank} of {nprocs} exited with {why}" + (stopped + " stopped by the launcher" if hung else ""),
          file=sys.stderr, flush=True)
    return 2 if code == 2 else 1


#: Seconds ranks get to end after SIGTERM before they are killed.
STOP_SECONDS = 5.0


def _stop(procs: list[subprocess.Popen], wait: float = STOP_SECONDS) -> None:
    """End ``procs`` and whatever they started: SIGTERM to each one's process group (each rank
    leads one), SIGKILL to the groups still there after ``wait`` seconds."""
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    end = time.monotonic() + wait
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(p.pid, signum)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signum)
