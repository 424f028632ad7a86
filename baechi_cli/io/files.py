"""Reading inputs with one-line errors, and writing outputs whole or not at all."""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from baechi_cli.core.errors import InputError

# A mapped file this small is read whole to tell a blank one ("the file is empty") as read_input does;
# a bigger one is not blank for any format read this way.
_BLANK_CHECKED = 1 << 16


def write_atomic(path: str, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or parts written in turn as they come) to ``path`` so that readers
    never see a partial file.

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
            for part in [data] if isinstance(data, bytes) else data:
                f.write(part)
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


@contextmanager
def mapped_input(path: str, kind: str) -> Iterator[mmap.mmap]:
    """:func:`read_input`'s file mapped read-only rather than read (the same errors): parts of
    it can then be copied to an output without passing through memory of their own."""
    with _open_input(path, kind) as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise InputError("the file is empty", path=path)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if len(mapped) <= _BLANK_CHECKED and not mapped[:].strip():
                raise InputError("the file is empty", path=path)
            yield mapped


def _open_input(path: str, kind: str) -> BinaryIO:
    """``path`` opened for reading, or the InputError that says why it cannot be."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except IsADirectoryError:
        raise InputError(f"is a directory, not a {kind} file", path=path) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", path=path) from None


def read_input(path: str, kind: str) -> bytes:
    """The bytes of input file ``path``; ``kind`` names what it should be in errors.

    Raises InputError for a missing, unreadable, directory or empty file.
    """
    with _open_input(path, kind) as f:
        try:
            data = f.read()
        except OSError as err:
            raise InputError(f"cannot read: {err.strerror}", path=path) from None
    if not data.strip():
        raise InputError("the file is empty", path=path)
    return data
