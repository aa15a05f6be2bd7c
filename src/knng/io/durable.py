"""Writing files that survive crashes and fail cleanly: flushes, ``.npy`` files written in slices
or allocated whole, system errors in words, and the locks that keep one writer to a folder.

Two ways a write goes wrong without saying why are closed here. ``ndarray.tofile`` (what
``np.save`` uses for a real file) reports a full disk or a file-size limit as "N requested and M
written", without the system's reason: :func:`write_npy` writes through ``write()`` in slices, which
raises ``OSError`` with ``ENOSPC`` or ``EFBIG``. A memory map over a sparse file (what
``np.lib.format.open_memmap`` creates) gets its disk blocks only as pages are first written, and a
full disk then kills the process with SIGBUS: :func:`create_npy` allocates every block first
(``posix_fallocate``), so the disk is found full when the file is made, as an ``OSError``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["fsync_file", "fsync_dir", "array_bytes", "write_npy", "create_npy", "os_error_text", "try_lock",
           "read_holder", "write_holder", "CHUNK_BYTES"]

#: Arrays are written (and hashed) in slices of this many bytes: one pass over memory for both.
CHUNK_BYTES = 16 << 20


def fsync_file(path: Path) -> None:
    """Flush a file's data before it is renamed: otherwise a crash right after the rename can
    leave the final name pointing at an empty file on some file systems."""
    if path.is_file():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def fsync_dir(folder: Path) -> None:
    """Persist renames in ``folder``; a no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def array_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, in order (empty for an empty array)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")


def write_npy(path: Path, array: Any) -> str:
    """Write ``array`` as the ``.npy`` file ``path``, flushed to disk; return the SHA-256 of its
    data (the bytes after the header, C order).

    Raises
    ------
    OSError
        With the system's reason (``ENOSPC``, ``EFBIG``, ``EACCES``, ...); the partial file is
        left for the caller's staging to remove.
    """
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise ValueError("array has dtype object, which .npy files cannot store safely")
    digest = hashlib.sha256()
    with _naming(path), open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
        data = array_bytes(array)
        for start in range(0, len(data), CHUNK_BYTES):
            piece = data[start:start + CHUNK_BYTES]
            f.write(piece)
            digest.update(piece)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """System errors of writes to ``path`` name it (``write()`` and ``posix_fallocate`` do not)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), os.fspath(path)) from exc
        raise


def create_npy(path: Path, shape: tuple[int, ...], dtype: Any) -> np.memmap:
    """A zero-filled ``.npy`` file of ``shape`` and ``dtype`` with every disk block allocated,
    opened as a writable memory map (see the module's note on SIGBUS)."""
    dtype = np.dtype(dtype)
    with _naming(path), open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                 "fortran_order": False, "shape": tuple(int(s) for s in shape)})
        offset = f.tell()
        size = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        f.flush()
        try:
            os.posix_fallocate(f.fileno(), 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            f.truncate(size)  # a file system that cannot allocate ahead: sparse, as np.memmap makes it
        except AttributeError:  # no posix_fallocate (not POSIX)
            f.truncate(size)
    if size == offset:  # nothing to map: an empty array, read as one
        return np.load(path)
    return np.load(path, mmap_mode="r+")


def os_error_text(exc: OSError) -> str:
    """A system error in words: the reason and its code (``No space left on device (ENOSPC)``),
    or the message of an error that has no code."""
    if exc.errno is not None:
        name = errno.errorcode.get(exc.errno)
        return f"{exc.strerror or os.strerror(exc.errno)}" + (f" ({name})" if name else "")
    return str(exc)


def try_lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without waiting; False if another process holds one.

    The kernel drops the lock of a process that dies, so a lock file left behind is simply
    found unlocked.
    """
    try:
        import fcntl
    except ImportError:  # Windows: a byte-range lock on the first byte
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise


def write_holder(fd: int, command: str | None = None) -> None:
    """Record who holds the lock on ``fd`` (pid, host, start time, command), for the message a
    second process gets."""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv) if command is None else command}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))


def read_holder(fd: int) -> str:
    """Who holds the lock on ``fd``, in words (see :func:`write_holder`)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode("utf-8"))
        return f"pid {info['pid']} on {info['host']}, since {info['started']}: {info['command']}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"
