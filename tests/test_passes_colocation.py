from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import dags

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder
from baechi_cli.core.unionfind import UnionFind
from baechi_cli.passes.colocation import colocate, colocation_pairs


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


# ------------------------------------------------------------ properties

DTYPES = ("float32", "resource", "float32_ref", "int32")
OP_TYPES = ("X", "ReadVariableOp", "Assign", "IdentityN")


@st.composite
def tf_graphs(draw):
    """A drawn DAG with TensorFlow's colocation sources: handle and reference outputs,
    declared input types (some shorter than the inputs), exempt op types and ``_class`` names."""
    g = draw(dags(1, 16, max_ports=2, control_p=0.15, repeat_p=0.1, group_p=0.15, relabel=True))
    n = g.num_ops
    op_types, dtypes, attrs, colocate_with = [], [], [], []
    for v in range(n):
        op_types.append(draw(st.sampled_from(OP_TYPES)))
        dtypes.append([draw(st.sampled_from(DTYPES)) for _ in g.output_bytes[v]])
        data_inputs = sum(1 for e in g.in_edges[v] if g.edge_port[e] != CONTROL_PORT)
        declared = draw(st.one_of(st.none(), st.lists(st.sampled_from(DTYPES), max_size=data_inputs)))
        attrs.append({} if declared is None else {"_input_types": declared})
        others = draw(st.lists(st.integers(0, n - 1), max_size=2, unique=True))
        colocate_with.append(tuple(g.names[u] for u in others))
    return g.replace(op_types=op_types, output_dtypes=dtypes, attrs=attrs, colocate_with=colocate_with)


def expected_pairs(g) -> Counter:
    """The colocation rules of the module docstring, read off the graph's columns."""
    pairs: Counter = Counter()
    index = g.index()
    for v in range(g.num_ops):
        for name in g.colocate_with[v]:
            pairs[(v, index[name], "_class")] += 1
        if g.op_types[v] == "IdentityN":
            continue
        declared = g.attrs[v].get("_input_types", [])
        data = [e for e in g.in_edges[v] if g.edge_port[e] != CONTROL_PORT]
        for k, e in enumerate(data):
            u = g.edge_src[e]
            dtype = declared[k] if k < len(declared) else g.output_dtypes[u][g.edge_port[e]]
            if dtype == "resource" or dtype.endswith("_ref"):
                pairs[(v, u, dtype)] += 1
    return pairs


@settings(max_examples=60, deadline=None)
@given(tf_graphs())
def test_colocation_merges_exactly_the_pairs_tensorflow_colocates(g):
    assert Counter(colocation_pairs(g)) == expected_pairs(g)
    out = colocate(g)
    uf = UnionFind(g.group)
    for v, u, _ in expected_pairs(g):
        uf.union(v, u)
    assert out.group == uf.roots()  # groups only merge, canonically named by their smallest op
    for v in range(g.num_ops):
        assert out.group[v] == out.group[g.group[v]]
    assert colocate(out).group == out.group  # idempotent
    assert (out.names, out.edge_src, out.edge_dst) == (g.names, g.edge_src, g.edge_dst)
