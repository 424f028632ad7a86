import pytest

from baechi_cli.errors import InputError
from baechi_cli.graph import CONTROL_PORT, GraphBuilder
from baechi_cli.passes.colocation import colocate


def test_class_attrs_merge_transitively():
    b = GraphBuilder()
    w = b.add_op("w", "VariableV2", [40], output_dtypes=["float32_ref"])
    init = b.add_op("w/Assign", "Assign", [40], colocate_with=["w"])
    b.add_op("w/Momentum", "VariableV2", [40], colocate_with=["w"])
    other = b.add_op("grad", "MatMul", [40], colocate_with=["w/Momentum"])
    free = b.add_op("x", "Relu", [40])
    for s, d in ((w, init), (other, free)):
        b.add_edge(s, d)
    g = colocate(b.build())
    assert g.group == [w, w, w, w, free]


def test_declared_resource_and_ref_inputs_colocate_with_producer():
    b = GraphBuilder()
    h = b.add_op("h", "VarHandleOp", [0], output_dtypes=["resource"])
    read = b.add_op("read", "ReadVariableOp", [40], attrs={"_input_types": ["resource"]})
    ident = b.add_op("id", "IdentityN", [0], attrs={"_input_types": ["resource"]})
    v = b.add_op("v", "VariableV2", [40], output_dtypes=["float32_ref"])
    assign = b.add_op("assign", "Assign", [40], attrs={"_input_types": ["float32_ref", "float32"]})
    snap = b.add_op("snap", "Identity", [40], attrs={"_input_types": ["float32"]})  # a plain read
    b.add_edge(h, read)
    b.add_edge(h, ident)
    b.add_edge(v, assign)
    b.add_edge(read, assign, 0)
    b.add_edge(v, snap)
    b.add_edge(h, snap, CONTROL_PORT)
    g = colocate(b.build())
    assert g.group[read] == h
    assert g.group[ident] == ident  # exempt, as in TensorFlow
    assert g.group[assign] == v and g.group[v] != h
    assert g.group[snap] == snap


def test_unknown_op_types_fall_back_to_producer_output_type():
    b = GraphBuilder()
    h = b.add_op("h", "Placeholder", [0], output_dtypes=["resource"])
    c = b.add_op("custom", "MyCustomOp", [4])
    b.add_edge(h, c)
    assert colocate(b.build()).group == [0, 0]


def test_class_naming_missing_op_is_an_input_error():
    b = GraphBuilder()
    b.add_op("a", "X", [4], colocate_with=["ghost"])
    with pytest.raises(InputError, match="op 'a': .*'ghost'"):
        colocate(b.build())
