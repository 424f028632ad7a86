"""A table of named entries, as the objective, schedule and pass registries keep them.

A :class:`Registry` is a dict from name to entry, in registration order, whose :meth:`~Registry.add`
refuses an empty, taken or reserved name (ValueError: a programming error) and whose
:meth:`~Registry.find` turns an unknown name into the one-line :class:`~baechi_cli.core.errors.InputError`
a user sees. Both are O(1).

>>> table = Registry("schedule", reserved=("auto",))
>>> table.add("1f1b", "one forward, one backward")
'one forward, one backward'
>>> table.find("gpipe")
Traceback (most recent call last):
    ...
baechi_cli.core.errors.InputError: unknown schedule 'gpipe': expected one of 1f1b
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from baechi_cli.core.errors import InputError

T = TypeVar("T")


class Registry(dict[str, T]):
    """Named entries of one ``kind`` (the word the messages use); ``reserved`` names are never entries."""

    def __init__(self, kind: str, reserved: Iterable[str] = ()) -> None:
        super().__init__()
        self.kind = kind
        self.reserved = frozenset(reserved)

    def add(self, name: str, entry: T) -> T:
        """Add ``entry`` as ``name`` and return it; ValueError for an empty, taken or reserved name."""
        if not name or name in self or name in self.reserved:
            raise ValueError(f"{self.kind} name {name!r} is empty or taken")
        self[name] = entry
        return entry

    def find(self, name: str) -> T:
        """The entry called ``name``; InputError naming the known ones otherwise."""
        if name not in self:
            raise InputError(f"unknown {self.kind} {name!r}: expected one of {', '.join(self)}")
        return self[name]
