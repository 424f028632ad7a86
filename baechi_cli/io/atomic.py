"""Write files whole or not at all: a temporary file beside the target, then a rename."""

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
