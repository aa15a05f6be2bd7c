"""Interruptions: SIGINT and SIGTERM as one exception, and a way to hold them off.

Python turns SIGINT into :class:`KeyboardInterrupt` and leaves SIGTERM to kill the process on the
spot, skipping every ``finally`` (staging folders, locks, work areas). :func:`install` makes both
raise :class:`Interrupted` (a :class:`KeyboardInterrupt`, so code that already handles Ctrl-C
handles a SIGTERM too) carrying the signal, whose exit status is 128 + its number (130 for
SIGINT, 143 for SIGTERM), as a shell reports a process the signal killed.

:func:`deferred` holds interruptions off for a short critical section (starting child processes:
a KeyboardInterrupt between two ``Popen`` calls would leave the first child running unwatched)
and raises the one that arrived, if any, when the section ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ["Interrupted", "install", "handlers", "restore", "deferred", "SIGNALS"]

#: The signals that interrupt a run.
SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was interrupted by ``signum`` (SIGINT: Ctrl-C, or SIGTERM)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        """128 + the signal's number."""
        return 128 + self.signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def install() -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in SIGNALS:
        signal.signal(signum, _raise)


def handlers() -> dict[int, object]:
    """The handlers of :data:`SIGNALS` now (for :func:`restore`)."""
    return {signum: signal.getsignal(signum) for signum in SIGNALS}


def restore(saved: dict[int, object]) -> None:
    """Put back handlers returned by :func:`handlers` (main thread only; None entries, handlers
    not installed from Python, are left as they are)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in saved.items():
        if handler is not None:
            signal.signal(signum, handler)  # type: ignore[arg-type]


@contextlib.contextmanager
def deferred() -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM off inside the block; raise :class:`Interrupted` for the first
    one that arrived when it ends. Yields the list of signals received so far (a loop inside the
    block may look at it and stop early). Outside the main thread, holds nothing off."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in SIGNALS}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise Interrupted(received[0])
