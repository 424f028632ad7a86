"""The protocol buffer wire reader (baechi_cli.io.protowire): fields located as protobuf parses them."""

from __future__ import annotations

import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from baechi_cli.io import protowire
from baechi_cli.io.protowire import fields, read_varint, tag, varint


def _model_bytes() -> bytes:
    import numpy as np

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    helper.set_model_props(model, {"k": "v"})
    return model.SerializeToString()


def test_fields_tile_the_message_and_each_level_parses_as_its_message():
    data = _model_bytes()
    top = fields(data)
    assert b"".join(data[f.start : f.end] for f in top) == data
    by_number = {f.number: f for f in top}
    assert read_varint(data, by_number[1]) == 9
    graph = by_number[7]
    inner = fields(data, graph.payload, graph.end)
    assert b"".join(data[f.start : f.end] for f in inner) == data[graph.payload : graph.end]
    (node,) = [f for f in inner if f.number == 1]
    assert onnx.NodeProto.FromString(data[node.payload : node.end]).name == "mm"
    (weight,) = [f for f in inner if f.number == 5]
    assert onnx.TensorProto.FromString(data[weight.payload : weight.end]).name == "w"


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_a_truncated_message_is_a_value_error(cut):
    data = _model_bytes()
    with pytest.raises(ValueError):
        fields(data[:-cut])


def test_groups_and_field_zero_are_refused():
    with pytest.raises(ValueError, match="wire type 3"):
        fields(tag(1, 3) + tag(1, 4))
    with pytest.raises(ValueError, match="field number 0"):
        fields(b"\x00\x01")


@given(st.integers(0, 2**64 - 1))
def test_varints_round_trip(value):
    data = tag(5, protowire.VARINT) + varint(value)
    (f,) = fields(data)
    assert (f.number, f.wire_type, read_varint(data, f)) == (5, protowire.VARINT, value)
