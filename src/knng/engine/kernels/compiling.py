"""GPU kernels compiled in the background: which kinds of call have theirs, and the one worker
that compiles the others.

knng's GPU kernels (Triton's, and the CUDA C screens through CuPy's NVRTC) are compiled the
first time a kind of call runs them in a process: several seconds on a machine whose kernel
caches are empty (H200: a first search of 10,000 queries in 1M × 128 took 8.4 s, every later
one 12 ms), about a second to load them back from warm caches. A small first call should not
pay that. So the first call of a *kind* (the operation, device, dimension, dtype, metric and
k: what the kernels' specialisations follow) that the planner finds small enough
(``knng.engine.plan.first_call_uncompiled``) runs with torch's operations only
(``Options(compiled_kernels=False)``: nothing to compile), and the same call is run again here,
in a background thread, with the kernels, which compiles them; once that run ends, calls of the
kind use the kernels. The run in the background gives the same answer; it is discarded.

One worker thread runs the compilations one after another (each holds a call's memory while it
runs). At the interpreter's exit the run in progress is waited for, so that no compiler is cut
off while it writes its cache; runs not yet started are dropped. :func:`wait_for_kernels` waits
for them all (a benchmark, a test, a program about to time its calls).

This is the state of the process, not a setting: the settings are ``Options.background_compile``
and ``Options.uncompiled_max_scores``.
"""

from __future__ import annotations

import atexit
import contextvars
import queue
import threading
from collections.abc import Callable, Hashable

from knng._options import options

__all__ = ["kind_ready", "mark_ready", "compiling", "in_background", "compile_in_background", "wait_for_kernels", "compile_failures"]

_LOCK = threading.Lock()
#: Kinds whose kernels this process has compiled (or tried to: a failed run is not retried).
_READY: set[Hashable] = set()
#: Kinds whose compiling run is queued or running, and the event set when it ends.
_PENDING: dict[Hashable, threading.Event] = {}
#: Why a compiling run failed, by kind (the foreground call of the kind then compiles, and reports it).
_FAILURES: dict[Hashable, str] = {}
#: The worker's queue of (kind, context, run); a daemon thread takes them one at a time.
_QUEUE: "queue.SimpleQueue[tuple[Hashable, contextvars.Context, Callable[[], object]]]" = queue.SimpleQueue()
_WORKER: threading.Thread | None = None
#: The job the worker is running, if any (what the exit waits for).
_RUNNING = threading.Event()
_IDLE = threading.Condition(_LOCK)
_EXITING = False


def kind_ready(kind: Hashable) -> bool:
    """Whether calls of ``kind`` run with compiled kernels: their kernels were compiled (or a
    compiled call of the kind ran) in this process."""
    return kind in _READY


def mark_ready(kind: Hashable) -> None:
    """Record that a call of ``kind`` ran with its kernels (they are compiled now)."""
    with _LOCK:
        _READY.add(kind)


def in_background() -> bool:
    """Whether this thread is the background worker (a call run again to compile its kernels,
    beside the caller's own work: it must leave the process's settings as they are)."""
    return _WORKER is not None and threading.current_thread() is _WORKER


def compiling(kind: Hashable) -> bool:
    """Whether ``kind``'s kernels are being compiled (queued or running)."""
    return kind in _PENDING


def compile_in_background(kind: Hashable, run: Callable[[], object]) -> None:
    """Run ``run`` (the call of ``kind`` again, with compiled kernels) in the background worker,
    unless ``kind`` is ready or already compiling; then ``kind`` is ready.

    ``run`` runs in a copy of the caller's context (its options), with compiled kernels and no
    further background compilation. Its result is discarded; an exception it raises is kept
    (:func:`compile_failures`) and the kind is marked ready anyway, so that the next call of the
    kind compiles in the foreground and reports the error itself.
    """
    global _WORKER
    with _LOCK:
        if _EXITING or kind in _READY or kind in _PENDING:
            return
        _PENDING[kind] = threading.Event()
        _QUEUE.put((kind, contextvars.copy_context(), run))
        if _WORKER is None:
            # A daemon: the interpreter's exit does not wait for queued runs (see _at_exit).
            _WORKER = threading.Thread(target=_work, name="knng-compile", daemon=True)
            _WORKER.start()


def _work() -> None:
    while True:
        kind, context, run = _QUEUE.get()
        with _LOCK:
            if _EXITING:
                return
            _RUNNING.set()
        try:
            context.run(_compile, run)
        except BaseException as exc:  # noqa: BLE001 - kept for the caller to read; the foreground call reports it
            _FAILURES[kind] = f"{type(exc).__name__}: {exc}"
        finally:
            with _LOCK:
                _READY.add(kind)
                _PENDING.pop(kind).set()
                _RUNNING.clear()
                _IDLE.notify_all()


def _compile(run: Callable[[], object]) -> None:
    with options(compiled_kernels=True, background_compile=False):
        run()


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Wait until the GPU kernels being compiled in the background are ready.

    The first call of a kind (operation, dimension, dtype, metric, k) in a process runs without
    compiled kernels where it is small, and its kernels compile in a background thread; later
    calls of the kind use them once they are ready (``docs/STARTUP.md``). A program about to
    time its calls, or to run many of one kind, may wait for them here.

    Parameters
    ----------
    timeout : float, optional
        Seconds to wait at most (None: until they are ready).

    Returns
    -------
    bool
        True when no compilation is left queued or in progress.
    """
    with _IDLE:
        return _IDLE.wait_for(lambda: not _PENDING, timeout=timeout)


def compile_failures() -> dict[Hashable, str]:
    """The background compilations that failed in this process: kind → the error's text."""
    return dict(_FAILURES)


@atexit.register
def _at_exit() -> None:
    """Drop the runs not started and wait for the one in progress: a compiler cut off while the
    interpreter shuts down could crash it, or leave a cache the next process trips on."""
    global _EXITING
    with _IDLE:
        _EXITING = True
        _IDLE.wait_for(lambda: not _RUNNING.is_set())
