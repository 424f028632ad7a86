"""Errors that reach the user as one line and a distinct exit code.

Every error names what it can of: the file, the op, and the problem. The CLI
prints ``str(error)`` and exits with ``error.exit_code``; nothing else about an
error is shown, so the message must stand on its own. :func:`one_line` is how
any message (an error's, a library's exception) is put on one line.

Exit codes (documented in docs/exit-codes.md):

====  ===========================================================
0     success
1     a regression gate failed (``baechi compare --baseline``)
2     usage error or bad input (click's own usage errors are 2 too)
3     infeasible placement: the model does not fit the devices
4     a solver failed or ran out of time
5     an optional dependency (TensorFlow) is needed but missing
6     a measurement was noise: the machine was busy (``devices calibrate``)
====  ===========================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_SOLVER = 4
EXIT_MISSING_DEPENDENCY = 5
EXIT_NOISY = 6

#: Characters of an op's name an error message shows (a name in a malformed file may be megabytes).
OP_NAME_LIMIT = 200


def one_line(text: str | BaseException, limit: int | None = None) -> str:
    """``text``, or an exception's message, on one line of at most ``limit`` characters.

    Every run of whitespace (newlines included) becomes one space; an
    exception whose message is empty gives its type's name. Text longer than
    ``limit`` is cut to ``limit`` characters, the last three ``...``
    (:func:`truncate`); ``None`` keeps it whole. O(len(text)).

    >>> one_line("graph.pb:\\n  no such   file")
    'graph.pb: no such file'
    >>> one_line(KeyError()), one_line("abcdefghijkl", limit=8)
    ('KeyError', 'abcde...')
    """
    squashed = " ".join(str(text).split())
    if not squashed and isinstance(text, BaseException):
        squashed = type(text).__name__
    return truncate(squashed, limit)


def truncate(text: str, limit: int | None) -> str:
    """``text`` when it has at most ``limit`` characters, else its start and ``...``, ``limit`` in all.

    >>> truncate("abcdefghijkl", 8), truncate("abc", 8), truncate("abc", None)
    ('abcde...', 'abc', 'abc')
    """
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


class BaechiError(Exception):
    """Base class: a problem the user can act on, reported on one line."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problem: str, *, path: str | None = None, op: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.path = path
        self.op = op

    def with_path(self, path: str) -> BaechiError:
        """Return this error with ``path`` filled in when it was not known yet."""
        if self.path is None:
            self.path = path
        return self

    def __str__(self) -> str:
        """``path: op 'name': problem``, on one line; the op's name cut to :data:`OP_NAME_LIMIT` characters.

        >>> str(InputError("no such file", path="m.pb", op="a" * 300)) == f"m.pb: op '{'a' * 197}...': no such file"
        True
        """
        parts = []
        if self.path:
            parts.append(str(self.path))
        if self.op is not None:
            parts.append(f"op '{one_line(self.op, OP_NAME_LIMIT)}'")
        parts.append(one_line(self.problem))
        return ": ".join(parts)


class InputError(BaechiError):
    """The input file, device spec or options are wrong."""

    exit_code = EXIT_BAD_INPUT


class InfeasibleError(BaechiError):
    """No placement fits the devices' memory."""

    exit_code = EXIT_INFEASIBLE


class SolverError(BaechiError):
    """An LP solver failed, was infeasible or ran out of time."""

    exit_code = EXIT_SOLVER


class MissingDependencyError(BaechiError):
    """An optional dependency is required for what was asked."""

    exit_code = EXIT_MISSING_DEPENDENCY


class NoisyMeasurementError(BaechiError):
    """A measurement was refused as noise: other processes were busy, or its repeats spread wide."""

    exit_code = EXIT_NOISY
