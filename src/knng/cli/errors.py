"""How the command line reports failure: exit statuses, and which exceptions mean bad input."""

from __future__ import annotations

from knng.io.outputs import OutputFolderError
from knng.io.workarea import CheckpointError

__all__ = ["EXIT_USAGE", "INPUT_ERRORS", "CliError", "message"]

#: Exit status for bad input and usage errors (argparse uses the same).
EXIT_USAGE = 2


class CliError(Exception):
    """A usage problem found by the command line itself (reported like bad input)."""


#: Exceptions that mean "the input is wrong", reported without a traceback.
INPUT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
    OutputFolderError, CheckpointError, CliError,
)


def message(exc: BaseException) -> str:
    """A one-line message, in the command line's words: a refused checkpoint says which options
    continue or discard it; OSErrors get their file name, which str() alone may lack."""
    if isinstance(exc, CheckpointError):
        return exc.message(command_line=True)
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc)
