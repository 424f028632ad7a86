"""The GraphDef schema (proto/tf_graph.proto) and the artefacts generated from it.

* The committed modules under baechi_cli/proto_gen and the committed op table
  are what proto/build.py produces now (stale -> fail).
* Every field we declare matches TensorFlow's (number, name, type, label), and
  every TensorFlow field reachable from GraphDef is declared or explicitly
  allowed to be missing.
* Messages round-trip: TensorFlow bytes/text -> our schema -> TensorFlow, equal.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import tempfile
from pathlib import Path

import pytest

from baechi_cli.proto_gen import tf_graph_pb2

ROOT = Path(__file__).resolve().parent.parent

# TensorFlow fields reachable from GraphDef that our schema leaves out, by full
# name, each with the reason. Protobuf keeps a field it does not know as an
# unknown field when parsing binary and writes it back unchanged, so a binary
# GraphDef still round-trips; text format drops unknown fields. Empty: we
# declare everything reachable.
OMITTED_TF_FIELDS: dict[str, str] = {}


def _load_build():
    spec = importlib.util.spec_from_file_location("baechi_proto_build", ROOT / "proto" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def build():
    return _load_build()


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return pytest.importorskip("tensorflow")


# --------------------------------------------------------- generated files


def test_generated_modules_are_up_to_date(build):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (dev extra) is needed to run protoc")
    with tempfile.TemporaryDirectory() as tmp:
        fresh = build.generate_protos(Path(tmp))
    committed = build.committed_protos()
    assert sorted(fresh) == sorted(committed), "run `python proto/build.py`"
    for name, data in fresh.items():
        assert committed[name] == data, f"baechi_cli/proto_gen/{name} is stale: run `python proto/build.py`"


@pytest.mark.tf
def test_op_registry_table_matches_installed_tensorflow(build, tf):
    fresh = build.op_registry_table()
    committed = json.loads(build.OP_REGISTRY_PATH.read_bytes())
    # Only the ops count: another patch release of TensorFlow with the same ops is fine.
    assert committed["ops"] == fresh["ops"], (
        "baechi_cli/io/tf_op_registry.json is stale: run `python proto/build.py`"
    )
    assert committed["schema"] == build.OP_REGISTRY_SCHEMA
    # The committed file is exactly what build.py writes (one op per line, sorted).
    assert build.dump_op_registry(committed) == build.OP_REGISTRY_PATH.read_bytes()


def test_package_does_not_clash_with_tensorflow():
    # Both schemas share the default descriptor pool when TensorFlow is imported.
    assert tf_graph_pb2.DESCRIPTOR.package == "baechi.tf"
    assert tf_graph_pb2.GraphDef.DESCRIPTOR.full_name == "baechi.tf.GraphDef"


# ------------------------------------------------------ schema vs TensorFlow


def _reachable(descriptor):
    """Message descriptors reachable from ``descriptor`` (itself included), by full name."""
    seen = {}
    todo = [descriptor]
    while todo:
        m = todo.pop()
        if m.full_name in seen:
            continue
        seen[m.full_name] = m
        todo.extend(f.message_type for f in m.fields if f.message_type is not None)
    return seen


def _real_oneof(field):
    """The field's oneof, unless it is the synthetic one of a proto3 ``optional``."""
    oneof = field.containing_oneof
    if oneof is None or (len(oneof.fields) == 1 and oneof.name == f"_{field.name}"):
        return None
    return oneof


def _ours(tf_full_name: str) -> str:
    assert tf_full_name.startswith("tensorflow.")
    return "baechi.tf." + tf_full_name[len("tensorflow.") :]


@pytest.mark.tf
def test_fields_match_tensorflow(tf):
    from tensorflow.core.framework import graph_pb2

    theirs = _reachable(graph_pb2.GraphDef.DESCRIPTOR)
    ours = _reachable(tf_graph_pb2.GraphDef.DESCRIPTOR)
    assert sorted(ours) == sorted(_ours(name) for name in theirs)
    for name, tf_message in theirs.items():
        message = ours[_ours(name)]
        assert message.GetOptions().map_entry == tf_message.GetOptions().map_entry, name
        tf_fields = {f.name: f for f in tf_message.fields}
        for field in message.fields:
            tf_field = tf_fields.get(field.name)
            assert tf_field is not None, f"{field.full_name} is not a TensorFlow field"
            assert field.number == tf_field.number, field.full_name
            assert field.type == tf_field.type, field.full_name
            assert field.is_repeated == tf_field.is_repeated, field.full_name
            assert field.is_required == tf_field.is_required, field.full_name
            assert field.has_presence == tf_field.has_presence or message.GetOptions().map_entry, (
                field.full_name
            )
            assert field.is_packed == tf_field.is_packed, field.full_name
            if tf_field.message_type is not None:
                assert field.message_type.full_name == _ours(tf_field.message_type.full_name)
            if tf_field.enum_type is not None:
                assert field.enum_type.full_name == _ours(tf_field.enum_type.full_name)
            tf_oneof, oneof = _real_oneof(tf_field), _real_oneof(field)
            assert (oneof and oneof.name) == (tf_oneof and tf_oneof.name), field.full_name
        declared = {f.name for f in message.fields}
        for tf_field in tf_message.fields:
            if tf_field.name not in declared:
                assert tf_field.full_name in OMITTED_TF_FIELDS, (
                    f"{tf_field.full_name} missing from our schema"
                )


@pytest.mark.tf
def test_enums_match_tensorflow(tf):
    from tensorflow.core.framework import full_type_pb2, types_pb2

    for tf_enum, enum in (
        (types_pb2.DataType.DESCRIPTOR, tf_graph_pb2.DataType.DESCRIPTOR),
        (full_type_pb2.FullTypeId.DESCRIPTOR, tf_graph_pb2.FullTypeId.DESCRIPTOR),
    ):
        assert [(v.name, v.number) for v in enum.values] == [(v.name, v.number) for v in tf_enum.values]


# ------------------------------------------------------------ round trips


def _fill(message, rng: random.Random, depth: int) -> None:
    """Set every field of a TensorFlow message to random non-default values.

    One member per oneof (chosen at random); recursion stops at ``depth``.
    """
    from google.protobuf.descriptor import FieldDescriptor as F

    def scalar(field):
        if field.type == F.TYPE_ENUM:
            return rng.choice([v.number for v in field.enum_type.values if v.number])
        if field.type == F.TYPE_BOOL:
            return True
        if field.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            return rng.choice([0.5, -3.25, 1e30])
        if field.type == F.TYPE_STRING:
            return rng.choice(["a", "ü/x:1", "^node"])
        if field.type == F.TYPE_BYTES:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        signed = field.type in (F.TYPE_INT32, F.TYPE_INT64, F.TYPE_SINT32, F.TYPE_SINT64, F.TYPE_SFIXED32)
        bits = 32 if field.type in (F.TYPE_INT32, F.TYPE_UINT32, F.TYPE_FIXED32, F.TYPE_SINT32) else 64
        low = -(2 ** (bits - 1)) if signed else 1
        high = 2 ** (bits - 1) - 1 if signed else 2**bits - 1
        return rng.choice([low, high, 7])

    oneof_choice = {o.name: rng.choice(o.fields).name for o in message.DESCRIPTOR.oneofs}
    for field in message.DESCRIPTOR.fields:
        oneof = _real_oneof(field)
        if oneof is not None and oneof_choice[oneof.name] != field.name:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            target = getattr(message, field.name)
            for _ in range(2):
                key = scalar(key_field)
                if value_field.message_type is None:
                    target[key] = scalar(value_field)
                elif depth > 0:
                    _fill(target[key], rng, depth - 1)
            continue
        if field.message_type is not None:
            if depth == 0:
                continue
            if field.is_repeated:
                for _ in range(2):
                    _fill(getattr(message, field.name).add(), rng, depth - 1)
            else:
                _fill(getattr(message, field.name), rng, depth - 1)
                if not getattr(message, field.name).ByteSize():
                    getattr(message, field.name).SetInParent()
            continue
        if field.is_repeated:
            getattr(message, field.name).extend(scalar(field) for _ in range(2))
        else:
            setattr(message, field.name, scalar(field))


@pytest.mark.tf
@pytest.mark.parametrize("seed", range(6))
def test_every_field_round_trips_through_our_schema(tf, seed):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    original = graph_pb2.GraphDef()
    _fill(original, random.Random(seed), depth=5)
    data = original.SerializeToString(deterministic=True)
    ours = tf_graph_pb2.GraphDef.FromString(data)
    assert graph_pb2.GraphDef.FromString(ours.SerializeToString(deterministic=True)) == original
    # Text format: what we print TensorFlow parses back equal, and vice versa.
    assert text_format.Parse(text_format.MessageToString(ours), graph_pb2.GraphDef()) == original
    assert text_format.Parse(text_format.MessageToString(original), tf_graph_pb2.GraphDef()) == ours


def _graph_with_library(tf):
    """A TF1-mode graph that calls a tf.function and runs a functional While loop."""

    @tf.function
    def scale(a):
        return a * 2.0 + 1.0

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        y = scale(x)
        v = tf.compat.v1.get_variable("v", [3], use_resource=True)
        tf.while_loop(lambda i, s: i < 3, lambda i, s: (i + 1, s + tf.reduce_sum(y) + v[0]), [0, 0.0])
        tf.constant([[1.5, 2.5]], name="c")
    return graph.as_graph_def(add_shapes=True)


@pytest.mark.tf
def test_real_graphdef_with_library_round_trips(tf):
    from google.protobuf import text_format
    from tensorflow.core.framework import graph_pb2

    original = _graph_with_library(tf)
    assert original.library.function, "the test graph should carry a function library"
    ours = tf_graph_pb2.GraphDef.FromString(original.SerializeToString())
    assert len(ours.node) == len(original.node)
    assert graph_pb2.GraphDef.FromString(ours.SerializeToString(deterministic=True)) == original
    assert text_format.Parse(text_format.MessageToString(ours), graph_pb2.GraphDef()) == original
