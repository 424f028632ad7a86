"""Reading inputs with one-line errors, and writing outputs whole or not at all."""

from __future__ import annotations

import os
import tempfile

from baechi_cli.errors import InputError


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers never see a partial file.

    The temporary file lives in the target's directory so ``os.replace`` is a
    rename on one file system. Raises InputError (naming the path) when the
    directory cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".baechi-", suffix=".tmp", dir=directory)
    except OSError as err:
        raise InputError(f"cannot write output: {err.strerror}", path=path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; give the file the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(err, OSError):
            raise InputError(f"cannot write output: {err.strerror}", path=path) from None
        raise


def read_input(path: str, kind: str) -> bytes:
    """The bytes of input file ``path``; ``kind`` names what it should be in errors.

    Raises InputError for a missing, unreadable, directory or empty file.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except IsADirectoryError:
        raise InputError(f"is a directory, not a {kind} file", path=path) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", path=path) from None
    if not data.strip():
        raise InputError("the file is empty", path=path)
    return data
