"""bench/zoo.py: tiny zoo models exported and placed, and the ``--quick`` path end to end.

They need torch and transformers (``pip install -e '.[bench]'``); without them they are skipped,
except the no-torch path, which runs everywhere.
"""

from __future__ import annotations

import json

import pytest
from benchmodules import bench_module

from baechi_cli.core.devices import parse_devices

bench_module("benchlib")
bench_module("framework")
zoo = bench_module("zoo")


def test_the_zoo_covers_what_issue_37_names():
    assert len(zoo.CASES) >= 25
    families = {c.family for c in zoo.CASES}
    assert families == {"decoder", "encoder", "encoder-decoder", "vision transformer", "CNN"}
    features = " ".join(c.features for c in zoo.CASES)
    for feature in (
        "rotary",
        "grouped-query",
        "untied head",
        "tied head",
        "sliding window",
        "mixture of experts",
    ):
        assert feature in features, feature
    for feature in ("depthwise", "squeeze-excitation", "tf_padding=True", "shared layers", "window"):
        assert feature in features, feature
    real = {c.name: c.shape for c in zoo.CASES}
    assert real["efficientnet_b0"] == real["swin_t"] == (8, 3, 224, 224)


@pytest.mark.parametrize("name", ["llama", "bert", "mobilenet_v2"])
def test_a_tiny_zoo_model_exports_and_places_with_every_size_known(tmp_path, name):
    """A decoder (rotary, grouped-query), an encoder with padding in its mask and a depthwise CNN
    whose pads are computed from the input (tf_padding): the legacy export places, no size unknown."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    case = zoo.CASE_BY_NAME[name]
    model, inputs = zoo.build(case, quick=True)
    if case.kind == "encoder":
        assert 0 < int(inputs[1].sum()) < inputs[1].numel()  # some padding
    path = str(tmp_path / f"{name}.onnx")
    record = zoo.run_export(zoo.SOURCE_BY_KEY["onnx-legacy"], model, inputs, path)
    assert "error" not in record, record
    p = zoo.predict(path, parse_devices("1x1TB"), "sgd")
    assert "error" not in p, p["error"]
    assert p["unknown_sizes"] == 0
    params = 4 * sum(t.numel() for t in model.parameters())
    assert p["resident_bytes"] >= params and p["peak_bytes"] > p["resident_bytes"] and p["step_s"] > 0


def test_an_exporter_failure_is_its_cause_first_line():
    try:
        try:
            raise ValueError("\x1b[96mdata-dependent\x1b[0m expression\nmore")
        except ValueError as inner:
            raise RuntimeError("Failed to export. Next steps: ...") from inner
    except RuntimeError as err:
        assert zoo.first_line(err) == "RuntimeError: ValueError: data-dependent expression"


def test_quick_run_of_one_model_writes_the_tables(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = ["--quick", "--models", "vit", "--devices", "1x1TB", "--warmup", "1", "--steps", "1"]
    assert zoo.main([*argv, "--split-devices", "2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "zoo.json").read_text())
    entry = results["models"]["vit"]
    assert set(entry["measured"]) == {"sgd", "adam"}
    assert entry["measured"]["sgd"]["end_minus_grads_bytes"] == 0
    legacy = entry["sources"]["onnx-legacy"]
    assert legacy["unknown_sizes"] == 0
    assert "error" not in entry["sources"]["onnx-dynamo"]  # onnxscript installed with the bench extra
    for optimizer in ("sgd", "adam"):
        assert abs(zoo.ratio(entry, "onnx-legacy", optimizer, "peak_bytes") - 1) < 0.15
        assert legacy["splits"][optimizer]["2"]["verdict"] in ("PASS", "MISS")
    assert results["summary"]["export_and_place"] == 1
    text = (tmp_path / "zoo.md").read_text()
    assert "## Summary" in text and "| vit | sgd |" in text and "legacy peak" in text
    assert entry["sources"]["pt2"]["predicted"]["adam"]["optimizer_s"] > 0  # the traced update phase
    assert "differs most in" in text and "| vit | adam |" in text.split("## torch.export against ONNX")[1]
    # --only predict: again from zoo.json and the cached exports, the measurements kept
    repredict = [
        "--only",
        "predict",
        "--split-devices",
        "none",
        "--out",
        str(tmp_path),
        "--cache",
        str(tmp_path),
    ]
    assert zoo.main(repredict) == 0
    again = json.loads((tmp_path / "zoo.json").read_text())
    assert again["models"]["vit"]["measured"] == entry["measured"]
    assert again["models"]["vit"]["sources"]["onnx-legacy"]["unknown_sizes"] == 0


def test_without_torch_it_notes_that_and_exits_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(zoo.importlib.util, "find_spec", lambda name: None)
    assert zoo.main(["--out", str(tmp_path)]) == 0
    lines = (tmp_path / "zoo.md").read_text().splitlines()
    assert lines[0] == zoo.TITLE and "torch and transformers" in lines[2]
    assert "pip install -e '.[bench]'" in capsys.readouterr().err


def test_only_predict_without_a_zoo_json_says_so(tmp_path):
    assert zoo.main(["--only", "predict", "--out", str(tmp_path)]) == 2


def test_each_exporter_traces_a_model_no_other_exporter_changed(tmp_path):
    """The TorchScript exporter leaves Swin's clamped window size a traced tensor on the model;
    the exporters after it then fail on a data-dependent guard unless each gets its own copy."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    model, inputs = zoo.build(zoo.CASE_BY_NAME["swin_t"], quick=True)
    for source in zoo.SOURCES:
        record = zoo.run_export(source, model, inputs, str(tmp_path / f"swin{source.suffix}"))
        assert "error" not in record, (source.key, record["error"])


def _mixtral(experts: str):
    import dataclasses

    case = zoo.CASE_BY_NAME["mixtral"]
    case = dataclasses.replace(case, config={**case.config, "experts_implementation": experts})
    return zoo.build(case, quick=True)


def test_a_mixture_of_experts_on_transformers_default_experts_plans_its_training_step(tmp_path):
    """transformers' default experts (grouped_mm) export, in float32 on CPU, through its own
    operator ``transformers::grouped_mm_fallback``: tracing the step imports the package that
    registers it, and the grouped product and its backward are costed as matrix products."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from baechi_cli.app.place import place_model
    from baechi_cli.app.report import build_report
    from baechi_cli.search.candidates import PlaceOptions

    model, inputs = _mixtral("grouped_mm")
    path = str(tmp_path / "mixtral.pt2")
    torch.export.save(torch.export.export(model, inputs), path)
    options = PlaceOptions(training=True)
    report = build_report(place_model(path, parse_devices("2x1GB"), options), options)
    uncovered = report["costs"]["uncovered"]
    assert not [op for op in uncovered if "grouped_mm" in op or op == "aten.histc"], uncovered


def test_the_eager_experts_loop_is_refused_with_what_exports():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from baechi_cli.core.errors import InputError
    from baechi_cli.io.pt2 import export

    model, inputs = _mixtral("eager")
    with pytest.raises(InputError) as err:
        export(model, inputs)
    said = str(err.value)
    assert "torch.export cannot export the model" in said and "batched_mm" in said and "\n" not in said


@pytest.mark.slow
def test_a_pipeline_plan_of_transformers_default_experts_trains_on_ranks(tmp_path):
    """Each rank loads the program in a fresh process: the package registering its custom
    operator is imported there too, and the plan trains with one process's gradients."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from baechi_cli.app.place import place_model
    from baechi_cli.app.report import build_report
    from baechi_cli.runtime.launch import verify_torch
    from baechi_cli.search.candidates import PlaceOptions

    class WithLoss(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(*args).float().pow(2).mean()

    inner, inputs = _mixtral("grouped_mm")
    model = WithLoss(inner)
    path = str(tmp_path / "mixtral.pt2")
    torch.export.save(torch.export.export(model, inputs), path)
    options = PlaceOptions(training=True, objective="throughput", microbatches=2, schedule="1f1b")
    report = build_report(place_model(path, parse_devices("2x1GB"), options), options)
    result = verify_torch(model, inputs, report, steps=1)
    assert result["ran"] and result["gradients_match"] and result["as_placed"], result["error"]
