"""The protocol buffer wire format: where a serialized message's fields lie, without parsing them.

A placed ONNX model differs from its source only in its nodes and two model
fields; the weights, most of a real model's bytes, can be copied from the
source file as they are (:func:`baechi_cli.io.onnx.write_placed_onnx`).
Parsing and serializing them instead costs two copies of the model in
memory and the time to make them.

:func:`fields` lists the fields of one message level (tag, value span) in
file order; a length-delimited field's payload can be listed in turn.
Complexity: O(fields at that level), each varint read in Python.

Example:
    >>> from onnx import ModelProto
    >>> data = ModelProto(ir_version=10, producer_name="x").SerializeToString()
    >>> [(f.number, f.wire_type, bytes(data[f.payload : f.end])) for f in fields(data)]
    [(1, 0, b'\\n'), (2, 2, b'x')]
    >>> message_field(2, b"y") == tag(2, LENGTH_DELIMITED) + varint(1) + b"y" == b"\\x12\\x01y"
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
_FIXED_SIZE = {FIXED64: 8, FIXED32: 4}


@dataclass(frozen=True, slots=True)
class Field:
    """One field occurrence: ``buf[start:end]`` is the whole field, ``buf[payload:end]`` its value
    (a varint's bytes, a fixed value, or a length-delimited field's bytes after the length)."""

    number: int
    wire_type: int
    start: int
    payload: int
    end: int


def fields(buf: Any, start: int = 0, end: int | None = None) -> list[Field]:
    """The fields of the message in ``buf[start:end]`` (bytes, mmap or memoryview), in order.

    ValueError for bytes that are not a message: a truncated field, a varint
    over 10 bytes, or a group or unknown wire type (proto3 and ONNX's proto2
    schema have no groups).
    """
    stop = len(buf) if end is None else end
    out = []
    pos = start
    while pos < stop:
        key, at = _read_varint(buf, pos, stop)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            _, after = _read_varint(buf, at, stop)
            payload = at
        elif wire == LENGTH_DELIMITED:
            length, payload = _read_varint(buf, at, stop)
            after = payload + length
        elif wire in _FIXED_SIZE:
            payload, after = at, at + _FIXED_SIZE[wire]
        else:
            raise ValueError(f"wire type {wire} at byte {pos}")
        if after > stop:
            raise ValueError(f"field {number} at byte {pos} runs past the end")
        out.append(Field(number, wire, pos, payload, after))
        pos = after
    return out


def read_varint(buf: Any, field: Field) -> int:
    """The value of a varint field."""
    return _read_varint(buf, field.payload, field.end)[0]


def _read_varint(buf: Any, pos: int, stop: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(pos, min(stop, pos + 10)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise ValueError(f"a truncated or overlong varint at byte {pos}")


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    """A field's key."""
    return varint(number << 3 | wire_type)


def message_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number`` holding ``payload`` (a serialized message, bytes)."""
    return tag(number, LENGTH_DELIMITED) + varint(len(payload)) + payload
