"""Complete shapes: baechi's propagation after ONNX's inference, ``--infer-shapes run``, and the
refusal of a model whose sizes stay unknown.

The oracle for every completed shape is onnxruntime running the same model.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from baechi_cli.cli.commands import main
from baechi_cli.io.onnx import read_onnx_with_notes

ort = pytest.importorskip("onnxruntime")


def ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def windowed(height: int, width: int, window: int) -> onnx.ModelProto:
    """Swin's window partition as the TorchScript exporter writes it: pad H and W up to a multiple
    of ``window`` with pads computed from the input's shape, then reshape into windows."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, height, width, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["windows", "area", "channels"])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["h"], axis=0),
        helper.make_node("Gather", ["shape", "two"], ["w"], axis=0),
        # pad = (window - size % window) % window, for H and W
        helper.make_node("Mod", ["h", "win"], ["h_mod"]),
        helper.make_node("Sub", ["win", "h_mod"], ["h_left"]),
        helper.make_node("Mod", ["h_left", "win"], ["pad_h"]),
        helper.make_node("Mod", ["w", "win"], ["w_mod"]),
        helper.make_node("Sub", ["win", "w_mod"], ["w_left"]),
        helper.make_node("Mod", ["w_left", "win"], ["pad_w"]),
        helper.make_node("Unsqueeze", ["pad_h", "zero_axis"], ["pad_h1"]),
        helper.make_node("Unsqueeze", ["pad_w", "zero_axis"], ["pad_w1"]),
        helper.make_node("Concat", ["zeros4", "zero1", "pad_h1", "pad_w1", "zero1"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["padded"]),
        helper.make_node("Relu", ["padded"], ["act"]),
        # windows: (B, H/win, win, W/win, win, C) -> (B * H/win * W/win, win * win, C)
        helper.make_node("Shape", ["act"], ["pshape"]),
        helper.make_node("Gather", ["pshape", "one"], ["ph"], axis=0),
        helper.make_node("Gather", ["pshape", "two"], ["pw"], axis=0),
        helper.make_node("Div", ["ph", "win"], ["nh"]),
        helper.make_node("Div", ["pw", "win"], ["nw"]),
        helper.make_node("Unsqueeze", ["nh", "zero_axis"], ["nh1"]),
        helper.make_node("Unsqueeze", ["nw", "zero_axis"], ["nw1"]),
        helper.make_node("Concat", ["minus1", "nh1", "win1", "nw1", "win1", "c1"], ["wshape"], axis=0),
        helper.make_node("Reshape", ["act", "wshape"], ["split"]),
        helper.make_node("Transpose", ["split"], ["moved"], perm=[0, 1, 3, 2, 4, 5]),
        helper.make_node("Reshape", ["moved", "flat"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
        numpy_helper.from_array(np.array(window, np.int64), "win"),
        ints("zero_axis", [0]),
        ints("zeros4", [0, 0, 0, 0]),
        ints("zero1", [0]),
        ints("minus1", [-1]),
        ints("win1", [window]),
        ints("c1", [8]),
        ints("flat", [-1, window * window, 8]),
    ]
    graph = helper.make_graph(nodes, "windows", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def data_dependent() -> onnx.ModelProto:
    """NonZero: an output whose size depends on the input's values, which no inference can know."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count"])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("NonZero", ["r"], ["idx"]),
        helper.make_node("Transpose", ["idx"], ["rows"]),
        helper.make_node("GatherND", ["x", "rows"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "nonzero", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ort_shapes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Every node output's shape when onnxruntime runs ``model``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [o for n in m.graph.node for o in n.output]
    for name in names:
        if name not in {o.name for o in m.graph.output}:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return {n: tuple(np.shape(v)) for n, v in zip(names, session.run(names, feeds))}


def baechi_shapes(path: str, **kwargs) -> tuple[dict[str, tuple[int, ...] | None], list[str], set[str]]:
    """Each node output's shape as read (by ONNX value name), the notes, and the unknown ones."""
    read = read_onnx_with_notes(path, **kwargs)
    g, model = read.graph, onnx.load(path)
    shapes, unknown = {}, set()
    for node_index, node in enumerate(model.graph.node):
        v = next(v for v, a in enumerate(g.attrs) if a.get("_onnx_node") == node_index)
        for port, name in enumerate(node.output):
            shapes[name] = g.output_shapes[v][port]
            if port in (g.attrs[v].get("_size_unknown") or []):
                unknown.add(name)
    return shapes, read.notes, unknown


def test_onnx_inference_alone_leaves_the_windows_unknown(tmp_path):
    """The case this exists for: after the computed Pad, ONNX's inference knows nothing."""
    inferred = onnx.shape_inference.infer_shapes(windowed(7, 9, 4), data_prop=True)
    typed = {v.name: v.type for v in inferred.graph.value_info}
    dims = typed["padded"].tensor_type.shape.dim
    assert not all(d.HasField("dim_value") for d in dims)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 17), st.integers(1, 17), st.integers(1, 7))
def test_completed_shapes_are_what_onnxruntime_computes(tmp_path_factory, height, width, window):
    model = windowed(height, width, window)
    path = str(tmp_path_factory.mktemp("w") / "windows.onnx")
    onnx.save(model, path)
    shapes, notes, unknown = baechi_shapes(path)
    x = np.zeros((2, height, width, 8), np.float32)
    assert unknown == set()
    assert shapes == ort_shapes(model, {"x": x})
    assert any("computed by baechi's shape propagation" in n for n in notes)


def place(*args: str):
    return CliRunner().invoke(main, ["place", *args], catch_exceptions=False)


def test_a_size_left_unknown_is_refused_naming_the_op(tmp_path):
    path = tmp_path / "nonzero.onnx"
    onnx.save(data_dependent(), str(path))
    out = tmp_path / "placed.onnx"
    result = place(str(path), "-d", "2x1GB", "-o", str(out))
    assert result.exit_code == 3
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"error: {path}: op 'NonZero_")
    assert "--infer-shapes run" in line and "--allow-unknown-sizes" in line
    assert not out.exists()


def test_allow_unknown_sizes_places_and_says_so(tmp_path):
    path = tmp_path / "nonzero.onnx"
    onnx.save(data_dependent(), str(path))
    report = tmp_path / "r.json"
    result = place(str(path), "-d", "2x1GB", "--allow-unknown-sizes", "--report", str(report))
    assert result.exit_code == 0, result.output
    notes = json.loads(report.read_text())["notes"]
    assert any("--allow-unknown-sizes" in n and "under-counted" in n for n in notes)


def test_infer_shapes_run_measures_what_nothing_else_can(tmp_path):
    path = tmp_path / "nonzero.onnx"
    onnx.save(data_dependent(), str(path))
    shapes, notes, unknown = baechi_shapes(str(path), infer_shapes="run")
    assert unknown == set()
    # NonZero of zeros: 2 rows of 0 indices; what onnxruntime gives on zero inputs
    assert shapes["idx"] == (2, 0) and shapes["y"] == (0,)
    assert any("onnxruntime run" in n for n in notes)
    result = place(str(path), "-d", "2x1GB", "--infer-shapes", "run")
    assert result.exit_code == 0, result.output


def test_infer_shapes_run_without_onnxruntime_is_exit_5(tmp_path, monkeypatch):
    import sys

    path = tmp_path / "nonzero.onnx"
    onnx.save(data_dependent(), str(path))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    result = place(str(path), "-d", "2x1GB", "--infer-shapes", "run")
    assert result.exit_code == 5
    assert "pip install 'baechi[onnx]'" in result.output


def test_infer_shapes_is_not_run_when_nothing_is_unknown(tmp_path, monkeypatch):
    """A model ONNX sizes completely never reaches onnxruntime, even with --infer-shapes run."""
    import sys

    path = tmp_path / "windows.onnx"
    onnx.save(windowed(8, 8, 4), str(path))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    result = place(str(path), "-d", "2x1GB", "--infer-shapes", "run")
    assert result.exit_code == 0, result.output
