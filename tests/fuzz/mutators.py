"""Mutations of reader inputs: byte-level for any file, structure-aware for protobuf, JSON and YAML.

Every function draws only from the ``random.Random`` it is given, so a case
is a pure function of its seed file and that generator's seed (the harness
seeds one generator per case, :func:`fuzz.cases.case_rng`).

* :func:`mutate_bytes`: bit flips, interesting bytes, truncation, chunk
  deletion, insertion of random bytes, duplicated chunks, splices with
  another seed, and, in text, numbers replaced by extreme ones.
* :func:`mutate_message`: a protobuf message (GraphDef, ModelProto), in
  place: a field reached by random descent gets an extreme or wrong value,
  is cleared, or has elements deleted, duplicated or reordered.
* :func:`mutate_document`: a parsed JSON or YAML document: a value reached
  by random descent is replaced (wrong types, NaN, infinities, 1e308,
  integers beyond 64 bits, unicode, empty and very long strings, deep
  nesting), deleted, duplicated or renamed. :func:`dump_json` serialises
  the result, deep nesting included (which ``json.dumps`` could not).

The format-specific graph mutations (cycles, dangling inputs, duplicate
names, huge declared shapes) are in :mod:`fuzz.targets`, next to the readers
they aim at.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

# --------------------------------------------------------------------------- bytes

_INTERESTING_BYTES = (0x00, 0x01, 0x08, 0x0A, 0x12, 0x1A, 0x22, 0x7F, 0x80, 0xFF, 0x5B, 0x7B, 0x3A)
_INTERESTING_NUMBERS = (
    b"0",
    b"-1",
    b"-2",
    b"4294967296",
    b"9223372036854775807",
    b"18446744073709551616",
    b"1e308",
    b"-1e308",
    b"1e400",
    b"NaN",
    b"Infinity",
    b"-0",
    b"0.5",
    b"99999999999999999999999999999999",
)
_NUMBER_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _span(rng: random.Random, size: int) -> int:
    """A chunk length for ``size`` bytes: mostly short, sometimes long (1 .. size)."""
    return max(1, min(size, 1 << rng.randint(0, max(0, size.bit_length() - 1))))


def _flip_bits(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _interesting_bytes(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] = rng.choice(_INTERESTING_BYTES)
    return bytes(out)


def _truncate(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    return data[: rng.randrange(len(data))]


def _delete_chunk(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    n = _span(rng, len(data))
    i = rng.randrange(len(data) - n + 1)
    return data[:i] + data[i + n :]


def _insert_random(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    i = rng.randrange(len(data) + 1)
    return data[:i] + rng.randbytes(rng.randint(1, 64)) + data[i:]


def _duplicate_chunk(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    n = _span(rng, len(data))
    i = rng.randrange(len(data) - n + 1)
    j = rng.randrange(len(data) + 1)
    return data[:j] + data[i : i + n] * rng.choice((1, 1, 2, 16)) + data[j:]


def _splice(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    other = rng.choice(others) if others else data
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]


def _overwrite_chunk(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    n = _span(rng, len(data))
    src, dst = rng.randrange(len(data) - n + 1), rng.randrange(len(data) - n + 1)
    return data[:dst] + data[src : src + n] + data[dst + n :]


def _replace_number(rng: random.Random, data: bytes, others: Sequence[bytes]) -> bytes:
    # Text formats (pbtxt, JSON, YAML): a number becomes an extreme one.
    found = list(_NUMBER_RE.finditer(data[: 1 << 20]))
    if not found:
        return _interesting_bytes(rng, data, others)
    m = rng.choice(found)
    return data[: m.start()] + rng.choice(_INTERESTING_NUMBERS) + data[m.end() :]


_BYTE_OPS: tuple[Callable[[random.Random, bytes, Sequence[bytes]], bytes], ...] = (
    _flip_bits,
    _interesting_bytes,
    _truncate,
    _delete_chunk,
    _insert_random,
    _duplicate_chunk,
    _splice,
    _overwrite_chunk,
    _replace_number,
)


def mutate_bytes(rng: random.Random, data: bytes, others: Sequence[bytes] = ()) -> bytes:
    """``data`` after 1 to 4 byte-level mutations; ``others`` are splice partners."""
    for _ in range(rng.choice((1, 1, 1, 2, 4))):
        data = rng.choice(_BYTE_OPS)(rng, data, others) if data else rng.randbytes(rng.randint(0, 16))
    return data


# --------------------------------------------------------------------------- values

INTERESTING_INTS = (
    0,
    1,
    -1,
    2,
    3,
    7,
    255,
    256,
    2**31 - 1,
    -(2**31),
    2**32,
    2**40,
    2**62,
    2**63 - 1,
    -(2**63),
)
INTERESTING_FLOATS = (math.nan, math.inf, -math.inf, 1e308, -1e308, 0.0, -0.0, 5e-324, 1e-300, 0.5, -1.5)
INTERESTING_STRINGS = (
    "",
    "x",
    "^",
    ":",
    ":0",
    "a:b",
    "a:-1",
    "a:99999999999999999999",
    "ünïcødé/💥",
    "\x00",
    "\u202e\ufeff",
    "loc:@",
    "a" * 10_000,
    "../../etc/passwd",
)


def interesting_int(rng: random.Random, current: int = 0) -> int:
    """An extreme integer, or one derived from ``current`` (negated, off by one, scaled)."""
    derived = (-current, current + 1, current - 1, current * 2**20, current * 2**40)
    return rng.choice(INTERESTING_INTS + derived)


def interesting_float(rng: random.Random, current: float = 0.0) -> float:
    """A non-finite, extreme or tiny float, or one derived from ``current``."""
    derived = (-current, current * 1e10, current + 0.5)
    return rng.choice(INTERESTING_FLOATS + derived)


def interesting_string(rng: random.Random, names: Sequence[str] = ()) -> str:
    """An odd string, or one of ``names`` (a duplicate), maybe with a port or control mark."""
    if names and rng.random() < 0.5:
        name = rng.choice(names)
        return rng.choice((name, f"^{name}", f"{name}:{rng.choice((0, 1, 7, 2**40))}", name + "x"))
    return rng.choice(INTERESTING_STRINGS)


# --------------------------------------------------------------------------- protobuf


def _is_map(fd: Any) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _messages_of_type(root: Any, full_name: str, limit: int = 64) -> list[Any]:
    """Up to ``limit`` messages of type ``full_name`` in ``root`` (breadth first), for copying."""
    found: list[Any] = []
    queue = [root]
    while queue and len(found) < limit:
        msg = queue.pop(0)
        if msg.DESCRIPTOR.full_name == full_name:
            found.append(msg)
        for fd, value in msg.ListFields():
            if fd.message_type is None:
                continue
            if _is_map(fd):
                if fd.message_type.fields_by_name["value"].message_type is not None:
                    queue.extend(value.values())
            elif fd.is_repeated:
                queue.extend(value[:8])
            else:
                queue.append(value)
    return found


def _set_scalar(rng: random.Random, msg: Any, fd: Any, names: Sequence[str]) -> Any:
    """A new value for scalar field ``fd`` of ``msg`` (its current value steers some choices)."""
    current = getattr(msg, fd.name) if not fd.is_repeated else None
    t = fd.type
    if t == fd.TYPE_STRING:
        return interesting_string(rng, names)
    if t == fd.TYPE_BYTES:
        return rng.choice((b"", rng.randbytes(rng.randint(1, 32)), interesting_string(rng, names).encode()))
    if t == fd.TYPE_BOOL:
        return not current if current is not None else rng.random() < 0.5
    if t in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
        return interesting_float(rng, current or 0.0)
    if t == fd.TYPE_ENUM:
        return rng.choice((0, 1, 2, 99, -1, 2**31 - 1, rng.randint(0, 40)))
    return interesting_int(rng, current or 0)


def _assign(msg: Any, fd: Any, value: Any, index: int | None) -> None:
    """Set field ``fd`` (element ``index`` of a repeated one, or append when None); ValueError when
    the value is out of the field's range (the caller tries another)."""
    if fd.is_repeated:
        field = getattr(msg, fd.name)
        if index is None or index >= len(field):
            field.append(value)
        else:
            field[index] = value
    else:
        setattr(msg, fd.name, value)


def _mutate_field(rng: random.Random, root: Any, msg: Any, fd: Any, names: Sequence[str]) -> None:
    """One mutation of field ``fd`` of ``msg`` (set or not)."""
    if _is_map(fd):
        mapping = getattr(msg, fd.name)
        keys = list(mapping.keys())
        if keys and rng.random() < 0.5:
            del mapping[rng.choice(keys)]
        elif keys:  # the same value under a new key
            value_fd = fd.message_type.fields_by_name["value"]
            old = mapping[rng.choice(keys)]
            key = interesting_string(rng, names) if isinstance(keys[0], str) else interesting_int(rng)
            try:
                if value_fd.message_type is not None:
                    mapping[key].CopyFrom(old)
                else:
                    mapping[key] = old
            except (TypeError, ValueError):
                pass
        return
    if fd.is_repeated:
        field = getattr(msg, fd.name)
        op = rng.randrange(6)
        if op == 0 and len(field):
            del field[rng.randrange(len(field))]
        elif op == 1 and len(field):  # duplicate an element
            item = field[rng.randrange(len(field))]
            if fd.message_type is not None:
                field.add().CopyFrom(item)
            else:
                field.append(item)
        elif op == 2:
            del field[rng.randrange(len(field) + 1) :]
        elif op == 3 and len(field) > 1:  # swap two elements
            i, j = rng.randrange(len(field)), rng.randrange(len(field))
            if fd.message_type is not None:
                a, b = type(field[i])(), type(field[j])()
                a.CopyFrom(field[i])
                b.CopyFrom(field[j])
                field[i].CopyFrom(b)
                field[j].CopyFrom(a)
            else:
                field[i], field[j] = field[j], field[i]
        elif fd.message_type is not None:
            donors = _messages_of_type(root, fd.message_type.full_name)
            item = field.add()
            if donors and rng.random() < 0.7:
                item.CopyFrom(rng.choice(donors))
        else:
            for _ in range(8):
                try:
                    _assign(msg, fd, _set_scalar(rng, msg, fd, names), rng.choice((None, 0)))
                    break
                except (TypeError, ValueError):
                    continue
        return
    if fd.message_type is not None:
        if rng.random() < 0.5:
            msg.ClearField(fd.name)
        else:
            donors = _messages_of_type(root, fd.message_type.full_name)
            if donors:
                getattr(msg, fd.name).CopyFrom(rng.choice(donors))
        return
    for _ in range(8):  # some values are out of the field's range (uint32, enum)
        try:
            _assign(msg, fd, _set_scalar(rng, msg, fd, names), None)
            return
        except (TypeError, ValueError):
            continue


def mutate_message(rng: random.Random, root: Any, names: Sequence[str] = ()) -> None:
    """Mutate protobuf ``root`` in place: descend to a random field, then change it.

    At each level the descent stops with probability 0.3, or picks a field:
    mostly one that is set, sometimes any field of the message (so unset
    ones get values too); a repeated or map field of messages continues into
    a random element. ``names`` are strings to duplicate (node names).
    """
    msg = root
    for _ in range(24):
        set_fields = msg.ListFields()
        if set_fields and rng.random() < 0.85:
            fd, _ = rng.choice(set_fields)
        else:
            fd = rng.choice(msg.DESCRIPTOR.fields)
        if fd.message_type is not None and rng.random() > 0.3:
            value = getattr(msg, fd.name)
            if _is_map(fd):
                inner = fd.message_type.fields_by_name["value"]
                if inner.message_type is not None and len(value):
                    msg = value[rng.choice(list(value.keys()))]
                    continue
            elif fd.is_repeated:
                if len(value):
                    msg = value[rng.randrange(len(value))]
                    continue
            elif msg.HasField(fd.name):
                msg = value
                continue
        _mutate_field(rng, root, msg, fd, names)
        return
    _mutate_field(rng, root, msg, rng.choice(msg.DESCRIPTOR.fields), names)


# --------------------------------------------------------------------------- JSON / YAML

_DEEP = "\x00deep:"  # a string dump_json replaces with deeply nested brackets


def interesting_value(rng: random.Random, current: Any = None, others: Sequence[Any] = ()) -> Any:
    """A JSON-ish value of another type or an extreme one; a marker for deep nesting sometimes."""
    choices: list[Any] = [
        None,
        True,
        False,
        interesting_int(rng, current if type(current) is int else 0),
        10**400,
        -(10**400),
        interesting_float(rng, current if type(current) is float else 0.0),
        interesting_string(rng),
        [],
        {},
        [current],
        {"": current},
        str(current),
        f"{_DEEP}{rng.choice((64, 1000, 100_000))}",
    ]
    if others:
        choices.append(rng.choice(others))
    return rng.choice(choices)


def _container_path(rng: random.Random, doc: Any) -> list[tuple[Any, Any]]:
    """A random descent from ``doc``: (container, key or index) pairs, outermost first."""
    path: list[tuple[Any, Any]] = []
    node = doc
    while isinstance(node, (dict, list)) and node and (not path or rng.random() < 0.75):
        key = rng.choice(list(node.keys())) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    return path


def mutate_document(rng: random.Random, doc: Any, extra: Sequence[Any] = ()) -> Any:
    """``doc`` (parsed JSON or YAML) with one value replaced, deleted, duplicated or renamed.

    Returns the new document (the old one may be changed in place).
    ``extra`` are values worth trying for this format (YAML dates, say).
    """
    path = _container_path(rng, doc)
    if not path:
        return interesting_value(rng, doc, extra)
    container, key = path[-1]
    value = container[key]
    op = rng.randrange(10)
    if op < 5:
        container[key] = interesting_value(rng, value, list(extra))
    elif op == 5:
        del container[key]
    elif op == 6 and isinstance(container, list):
        container.insert(rng.randrange(len(container) + 1), value)
    elif op == 6:  # rename a key (an unknown key, or a duplicate of a known one's content)
        container[interesting_string(rng, [str(k) for k in container])] = container.pop(key)
    elif op == 7 and isinstance(container, list) and len(container) > 1:
        j = rng.randrange(len(container))
        container[key], container[j] = container[j], container[key]
    elif op == 7:  # many copies of a scalar, two of a container (a thousand would be megabytes)
        container[key] = [value] * (2 if isinstance(value, (dict, list)) else rng.choice((2, 1000)))
    elif op == 8 and isinstance(value, (int, float)) and not isinstance(value, bool):
        container[key] = -value if rng.random() < 0.5 else value * 2**40
    else:
        container.clear()
    return doc


def dump_json(doc: Any, rng: random.Random) -> bytes:
    """``doc`` as JSON text (NaN and Infinity written bare, as Python does); deep-nesting markers
    become that many nested lists."""
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5, indent=rng.choice((None, 1)))

    def nest(m: re.Match) -> str:
        depth = int(m.group(1))
        return "[" * depth + "]" * depth

    return re.sub(r'"\\u0000deep:(\d+)"', nest, text).encode("utf-8", "surrogatepass")
