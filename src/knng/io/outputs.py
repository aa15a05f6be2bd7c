"""Result folders that cannot lose results: one writer at a time, checked before computing,
committed whole.

A run's results (``indices.npy``, ``distances.npy`` and ``knng.json``, or ``graph.npz`` and
``knng.json``) are a *set*: a reader must never see new indices beside old distances, or a
``knng.json`` that describes files no longer there. :class:`OutputFolder` gives a folder that
guarantee:

1. **One writer.** An exclusive lock, ``.NAME.knng-lock`` beside the folder (an ``flock`` on a
   file that records the holder's pid, host, start time and command). A second run fails at once
   with a message naming the holder; the kernel drops the lock of a process that dies, so a stale
   lock file is recognised by simply being unlocked.
2. **Checks first.** Before any computing: existing results without ``overwrite``, a path that is
   not a folder, a folder holding sub-folders knng did not write, no permission to write beside
   it, too little free space for the expected bytes.
3. **Staged, then switched whole.** The new set is written into a hidden sibling folder
   (``.NAME.knng-new-*``; files of the old folder that knng did not write are hard-linked
   into it), flushed, renamed ``.NAME.knng-ready-*`` once complete, and exchanged with the
   folder in one atomic ``renameat2(RENAME_EXCHANGE)``; the old set, now at the sibling name,
   is deleted. Where the file system cannot exchange, the folder is moved aside and the ready
   one renamed into its place; a kill between those two renames leaves no folder but a ready
   sibling, which the next run over the folder renames in.
4. **Crashes cleaned up.** At the next open, under the lock: a ready sibling without its folder
   is committed, every other sibling of an earlier run is removed, and so are the
   ``.*.tmp-*``/``.*.bak-*`` files that earlier versions left inside the folder. The one sibling
   kept is the work area ``.NAME.knng-work``: the checkpoints a killed run resumes from
   (``--resume``), deleted by the commit of the run's results.

So a kill at any instant leaves the folder with either the old complete set or the new one
(or, on file systems without the exchange, a ready set that the next run commits).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from knng._interrupts import deferred
from knng.io.durable import fsync_dir, fsync_file, os_error_text, read_holder, try_lock, write_holder
from knng.io.workarea import WorkArea

__all__ = ["OutputFolder", "OutputFolderError", "OutputWriteError", "RESULT_NAMES"]

#: The files a knng run writes into its output folder (any format; ``knng embed`` writes the last three).
RESULT_NAMES = frozenset({"indices.npy", "distances.npy", "knng.json", "graph.npz", "embedding.npy",
                          "eigenvalues.npy", "embedding.png"})
#: Free space kept beyond the expected bytes (file-system metadata, the JSON).
SPACE_MARGIN = 1 << 20
#: Test hook: a commit step at which the process kills itself (``os._exit``), as a crash would.
CRASH_ENV = "KNNG_TEST_CRASH_AT"
#: Test hook: the free bytes the space check sees (a full disk cannot be mounted in CI).
FREE_BYTES_ENV = "KNNG_TEST_FREE_BYTES"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_OLD_TEMP = re.compile(r"^\..+\.(tmp|bak)-\d+-[0-9a-f]+$")


class OutputFolderError(RuntimeError):
    """The output folder cannot take this run's results (checked before computing)."""


class OutputWriteError(OutputFolderError, OSError):
    """Writing the results failed (a full disk, a file-size limit, a folder that refuses
    changes): the staged files are removed and the folder keeps what it held before. An
    ``OSError`` too, as the failure it reports."""


class OutputFolder:
    """An output folder locked for one run, whose results are committed as one set.

    Parameters
    ----------
    path : str or os.PathLike
        The folder (created at the commit if missing; its parents now).
    overwrite : bool, default False
        Replace results already in the folder; otherwise their presence raises
        :class:`FileExistsError` when the folder is opened.
    expected_bytes : int, default 0
        What the results will take; the file system beside the folder must have that much free.
    command : str, optional
        Recorded in the lock, for the message a second run gets.
    space_for : str, default "the results"
        What ``expected_bytes`` is for, in the message of the free-space check.

    Examples
    --------
    >>> with OutputFolder("out", overwrite=True, expected_bytes=8 << 20) as folder:  # doctest: +SKIP
    ...     result = compute()                     # the folder is locked and checked already
    ...     np.save(folder.staging / "indices.npy", result.indices)
    ...     folder.commit()                        # the whole set appears at once
    """

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False, expected_bytes: int = 0,
                 command: str | None = None, space_for: str = "the results") -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self.overwrite = overwrite
        self.expected_bytes = max(0, int(expected_bytes))
        self.space_for = space_for
        self.command = command if command is not None else " ".join(sys.argv)
        self._lock_fd: int | None = None
        self._staging: Path | None = None
        self.committed = False

    # ------------------------------------------------------------------------------ opening
    def __enter__(self) -> "OutputFolder":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open(self) -> "OutputFolder":
        """Lock the folder, finish or clean up earlier crashes, check it, and prepare the staging."""
        if self._lock_fd is not None:
            raise RuntimeError(f"output folder {self.path} is already open")
        if self.path.is_symlink():
            self.path = Path(os.path.realpath(self.path))
        parent = self.path.parent
        if parent.exists() and not parent.is_dir():
            raise OutputFolderError(f"cannot write results to {self.path}: {parent} is not a folder")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputFolderError(f"cannot create {parent} for the results: {exc.strerror or exc}") from exc
        self._lock()
        try:
            self._recover()
            self._check_folder()
            self._staging = self._sibling("new")
            try:
                self._staging.mkdir()
                probe = self._staging / ".knng-probe"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as exc:
                raise OutputFolderError(_unwritable(self.path, exc)) from exc
            self._check_space()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def work_area(self) -> Path:
        """Where the run keeps its checkpoints (:class:`knng.io.workarea.WorkArea`): a hidden sibling,
        ``.NAME.knng-work``, under the folder's lock, kept across crashes and deleted by the
        commit."""
        return self.path.with_name(f".{self.path.name}.knng-work")

    @property
    def staging(self) -> Path:
        """The folder to write the new results into (under their final names)."""
        if self._staging is None:
            raise RuntimeError("the output folder is not open")
        return self._staging

    def _sibling(self, kind: str) -> Path:
        return self.path.with_name(f".{self.path.name}.knng-{kind}-{os.getpid()}-{secrets.token_hex(4)}")

    def _siblings(self) -> list[Path]:
        prefix = f".{self.path.name}.knng-"
        try:
            names = os.listdir(self.path.parent)
        except OSError:
            return []
        keep = {f".{self.path.name}.knng-lock", self.work_area.name}
        return [self.path.parent / name for name in names if name.startswith(prefix) and name not in keep]

    # ------------------------------------------------------------------------------ the lock
    def _lock_path(self) -> Path:
        return self.path.with_name(f".{self.path.name}.knng-lock")

    def _lock(self) -> None:
        path = self._lock_path()
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise OutputFolderError(_unwritable(self.path, exc)) from exc
            if not try_lock(fd):
                holder = read_holder(fd)
                os.close(fd)
                raise OutputFolderError(f"output folder {self.path} is in use by another knng run ({holder}); "
                                        "wait for it to finish, or choose another folder with -o")
            # The holder before us unlinks the file as it releases it: make sure we hold the
            # lock on the file that is there now, not on an unlinked one.
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        write_holder(fd, self.command)
        self._lock_fd = fd

    def close(self) -> None:
        """Remove an uncommitted staging folder and release the lock (idempotent)."""
        if self._staging is not None and not self.committed:
            shutil.rmtree(self._staging, ignore_errors=True)
        self._staging = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._lock_path())
            os.close(self._lock_fd)
            self._lock_fd = None

    # --------------------------------------------------------------------------- the checks
    def _recover(self) -> None:
        """Commit a ready set whose folder a crash left missing; remove every other leftover."""
        siblings = self._siblings()
        ready = sorted((p for p in siblings if ".knng-ready-" in p.name), key=lambda p: p.stat().st_mtime)
        if not os.path.lexists(self.path) and ready:
            os.rename(ready[-1], self.path)
            fsync_dir(self.path.parent)
            siblings = self._siblings()
        for leftover in siblings:
            shutil.rmtree(leftover, ignore_errors=True)
        if self.path.is_dir():
            for name in os.listdir(self.path):
                if _OLD_TEMP.match(name):
                    with contextlib.suppress(OSError):
                        os.unlink(self.path / name)

    def _check_folder(self) -> None:
        if not os.path.lexists(self.path):
            return
        if not self.path.is_dir():
            raise OutputFolderError(f"output folder {self.path} exists and is not a folder")
        if os.path.ismount(self.path):
            raise OutputFolderError(f"output folder {self.path} is a mount point: knng commits its results by "
                                    "switching in a new folder beside it; choose a folder inside it")
        names = os.listdir(self.path)
        existing = sorted(n for n in names if n in RESULT_NAMES)
        if existing and not self.overwrite:
            raise FileExistsError(errno.EEXIST, f"{self.path} already holds results ({', '.join(existing)}); "
                                  "pass --overwrite (overwrite=True) to replace them, or choose another folder",
                                  str(self.path))
        folders = sorted(n for n in names if (self.path / n).is_dir() and not (self.path / n).is_symlink())
        if folders:
            raise OutputFolderError(
                f"output folder {self.path} holds folders knng did not write ({', '.join(folders)}): knng commits "
                "its results by switching in a whole new folder, so it needs a folder of its own")
        mode = stat.S_IMODE(os.stat(self.path).st_mode)
        if not mode & stat.S_IWUSR:
            raise OutputFolderError(
                f"output folder {self.path} is read-only (mode {mode:04o}): knng does not replace a folder that "
                f"was made read-only; make it writable (chmod u+w {self.path}) or choose another folder")
        probe = self.path / f".knng-probe-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise OutputFolderError(
                f"cannot change output folder {self.path} ({os_error_text(exc)}): knng replaces the folder's "
                "results as a whole; make it writable to you (an immutable folder: chattr -i) or choose another "
                "folder") from exc

    def _check_space(self) -> None:
        env = os.environ.get(FREE_BYTES_ENV)
        free = int(env) if env else shutil.disk_usage(self.path.parent).free
        need = self.expected_bytes + SPACE_MARGIN
        if free < need:
            raise OutputFolderError(f"not enough free space for {self.space_for} in {self.path.parent}: "
                                    f"{need / 1e6:,.1f} MB needed, {free / 1e6:,.1f} MB free")

    # ------------------------------------------------------------------------------ commit
    def writing(self) -> contextlib.AbstractContextManager[None]:
        """A block that writes into :attr:`staging`: a system error there (a full disk, a file-size
        limit, no permission) becomes :class:`OutputWriteError` naming the folder and the cause."""
        return _writing(self)

    def commit(self) -> Path:
        """Switch the staged results in as one set; returns the folder.

        Files of the old folder that are not knng results are carried over (hard links, or
        copies where the file system has none); the old results are deleted. The new folder
        takes the old one's permissions.

        Raises
        ------
        OutputWriteError
            The set could not be flushed or switched in; the folder holds what it held before.
        """
        # An interruption waits for the switch to complete (a few flushes and renames): the
        # folder then holds the new set and its checkpoint is gone, never a half of the two.
        with deferred(), self.writing():
            return self._commit()

    def _commit(self) -> Path:
        staging = self.staging
        if os.path.isdir(self.path):
            for name in os.listdir(self.path):
                if name in RESULT_NAMES or _OLD_TEMP.match(name) or (staging / name).exists():
                    continue
                try:
                    os.link(self.path / name, staging / name)
                except OSError:
                    shutil.copy2(self.path / name, staging / name)
        for name in os.listdir(staging):
            fsync_file(staging / name)
        if os.path.isdir(self.path):
            os.chmod(staging, stat.S_IMODE(os.stat(self.path).st_mode))
        fsync_dir(staging)
        _crash_point("staged")
        ready = self._sibling("ready")
        os.rename(staging, ready)
        self._staging = ready
        fsync_dir(self.path.parent)
        _crash_point("ready")
        if os.path.lexists(self.path):
            if not _exchange(ready, self.path):
                aside = self._sibling("old")
                os.rename(self.path, aside)
                _crash_point("moved-aside")
                os.rename(ready, self.path)
                ready = aside
        else:
            os.rename(ready, self.path)
            ready = None
        self.committed = True
        fsync_dir(self.path.parent)
        _crash_point("switched")
        if ready is not None:
            shutil.rmtree(ready, ignore_errors=True)
        self._staging = None
        # The checkpoints of this run: its results are in, nothing there is needed any more.
        with contextlib.suppress(OSError):
            WorkArea(self.work_area).remove()
        return self.path

    def tidy(self) -> bool:
        """After a run was interrupted or failed, computing nothing: under the folder's lock (not
        waited for), commit or remove what crashed runs left beside it (:meth:`open`'s recovery)
        and remove a work area that holds no progress. False if another run holds the folder."""
        if not self.path.parent.is_dir():
            return True
        try:
            self._lock()
        except OutputFolderError:
            return False
        try:
            self._recover()
            area = WorkArea(self.work_area)
            if area.exists() and not area.has_progress():
                area.remove()
        except OSError:
            pass  # tidying is a courtesy: the next run's open recovers the same way
        finally:
            self.close()
        return True


@contextlib.contextmanager
def _writing(folder: OutputFolder) -> Iterator[None]:
    try:
        yield
    except OutputWriteError:
        raise
    except OSError as exc:
        raise OutputWriteError(
            f"could not write the results into {folder.path}: {os_error_text(exc)}"
            + (f" ({Path(exc.filename).name})" if exc.filename and exc.errno is not None else "")
            + "; the folder holds what it held before and nothing else was written") from exc


def _unwritable(path: Path, exc: OSError) -> str:
    return (f"cannot write beside {path} ({exc.strerror or exc}): knng locks and stages its results next "
            f"to the output folder, so {path.parent} must be writable; choose a folder inside one you can write to")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
        return False
    raise OSError(code, f"cannot switch the results into {b}: {os.strerror(code)}")


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_ENV) == step:
        os._exit(137)
