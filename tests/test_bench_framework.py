"""bench/framework.py: its memory measurement checked against bytes computed by hand, and a smoke run.

The measurement tests need torch (and the smoke run transformers): ``pip install
-e '.[bench]'``; without them they are skipped. The no-torch path runs everywhere.
"""

from __future__ import annotations

import json
import os

import pytest
from benchmodules import bench_module

from baechi_cli.core.devices import devices_from_yaml, dump_devices_yaml, load_devices_yaml, parse_devices

bench_module("benchlib")
framework = bench_module("framework")

F32 = 4
SCALARS = 64  # the loss and a few 0-d tensors autograd and the optimizer allocate on the way


@pytest.fixture
def linear():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    batch, n_in, n_out = 64, 1024, 512
    return torch.nn.Linear(n_in, n_out), torch.randn(batch, n_in), (batch, n_in, n_out)


def test_sgd_peak_of_a_linear_layer_is_computed_by_hand(linear):
    model, x, (batch, n_in, n_out) = linear
    m = framework.measure(model, x, "sgd", "cpu", warmup=1, steps=1)
    params = F32 * (n_in * n_out + n_out)
    assert m["resident_bytes"] == params  # SGD keeps no state
    assert m["input_bytes"] == F32 * batch * n_in
    # The peak is at the layer's backward: dW and db while the gradient of its output is live
    # (the output itself, saved by pow, is freed by then).
    expected = params + F32 * batch * n_in + params + F32 * batch * n_out
    assert expected <= m["peak_bytes"] <= expected + SCALARS
    # At the boundary: the output (pow saved it; its square was freed once mean had read it).
    boundary = params + F32 * batch * n_in + F32 * batch * n_out
    assert boundary <= m["boundary_bytes"] <= boundary + SCALARS
    assert m["end_minus_grads_bytes"] == 0  # every allocation and free of the step was seen
    assert m["step_s"] > 0 and m["forward_s"] > 0


def test_adam_peak_of_a_linear_layer_is_computed_by_hand(linear):
    model, x, (batch, n_in, n_out) = linear
    m = framework.measure(model, x, "adam", "cpu", warmup=1, steps=1)
    params = F32 * (n_in * n_out + n_out)
    assert m["optimizer_state_bytes"] >= 2 * params  # exp_avg, exp_avg_sq (+ 0-d step counters)
    assert m["resident_bytes"] == params + m["optimizer_state_bytes"]
    # torch's single-tensor Adam (the CPU default) computes the weight's denominator as
    # exp_avg_sq.sqrt() / bias_correction2_sqrt: two weight-sized temporaries beside all gradients.
    expected = m["resident_bytes"] + F32 * batch * n_in + params + 2 * F32 * n_in * n_out
    assert expected <= m["peak_bytes"] <= expected + SCALARS
    assert m["end_minus_grads_bytes"] == 0


def test_saved_tensors_of_a_linear_layer(linear):
    model, x, (batch, _, n_out) = linear
    _, resident = framework.storage_bytes([*model.parameters(), x])
    saved = framework.saved_by_node(model, x, resident)
    # pow saves its input (the layer's output); addmm's saved tensors are the input and the weight.
    assert saved == {"PowBackward0": F32 * batch * n_out}


def test_quick_run_writes_the_tables(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    argv = ["--quick", "--models", "resnet50", "--devices", "1x1TB", "--warmup", "1", "--steps", "1"]
    assert framework.main([*argv, "--out", str(tmp_path), "--cache", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "framework.json").read_text())
    assert [(r["model"], r["optimizer"]) for r in results["rows"]] == [
        ("resnet50", "sgd"),
        ("resnet50", "adam"),
    ]
    for row in results["rows"]:
        m, p = row["measured"], row["predicted"]
        assert m["end_minus_grads_bytes"] == 0
        assert m["resident_bytes"] < m["boundary_bytes"] <= m["peak_bytes"]
        assert p["resident_bytes"] < p["peak_bytes"] and p["step_s"] > 0
        assert p["live_explained_bytes"] == p["boundary_bytes"] - p["resident_bytes"]
    adam = results["rows"][1]["measured"]["optimizer_state_bytes"] - 2 * F32 * results["rows"][1]["params"]
    assert 0 <= adam <= F32 * 1000  # exp_avg and exp_avg_sq, and a 0-d step counter per parameter
    inference = results["rows"][0]["inference"]
    m, p = inference["measured"], inference["predicted"]
    assert m["resident_bytes"] + m["input_bytes"] < m["peak_bytes"] and m["step_s"] > 0
    assert p["resident_bytes"] < p["peak_bytes"] and p["step_s"] > 0
    # a forward pass holds less than a training step does
    assert m["peak_bytes"] < results["rows"][0]["measured"]["peak_bytes"]
    assert p["peak_bytes"] < results["rows"][0]["predicted"]["peak_bytes"]
    text = (tmp_path / "framework.md").read_text()
    assert "## Targets" in text and "| resnet50 | adam |" in text
    assert "### Inference" in text and "| resnet50 | 2x3x64x64 | " in text.split("### Inference")[1]


def test_a_rate_calibrated_again_off_by_more_than_the_drift_marks_the_step_verdicts_suspect():
    yaml = "devices:\n  - {{name: cpu, memory: 1GB, flops: {flops}, memory_bandwidth: {bw}, efficiency: {{conv: 0.5}}}}\n"
    before = devices_from_yaml(yaml.format(flops="100G", bw="40GB/s"), "before.yaml")
    steady = framework.drift(before, devices_from_yaml(yaml.format(flops="110G", bw="40GB/s"), "after.yaml"))
    assert steady == pytest.approx({"matmul": 1.1, "conv": 1.1, "memory bandwidth": 1.0})
    assert "held its speed" in framework.drift_lines(steady)[-1]
    slower = framework.drift(before, devices_from_yaml(yaml.format(flops="100G", bw="30GB/s"), "after.yaml"))
    line = framework.drift_lines(slower)[-1]
    assert "memory bandwidth 0.75x" in line and "The memory bandwidth moved" in line and "suspect" in line
    assert framework.drift_lines(None) == []  # --devices given: nothing calibrated, nothing to recheck


def test_without_torch_it_notes_that_and_keeps_the_tables(tmp_path, monkeypatch, capsys):
    md = tmp_path / "framework.md"
    md.write_text("# Title\n\nintro\n\n| table |\n")
    monkeypatch.setattr(framework.importlib.util, "find_spec", lambda name: None)
    assert framework.main(["--out", str(tmp_path)]) == 0
    assert framework.main(["--out", str(tmp_path)]) == 0  # a second run replaces the note
    lines = md.read_text().splitlines()
    assert lines[:2] == ["# Title", ""] and lines[3:] == ["", "intro", "", "| table |"]
    assert lines[2].startswith(framework.NOTE_PREFIX) and "torch and transformers" in lines[2]
    assert "pip install -e '.[bench]'" in capsys.readouterr().err


def test_split_devices_share_ratio_times_the_peak_among_copies_of_the_first_device():
    base = devices_from_yaml(
        "devices: [{name: /device:CPU:0, memory: 1GB, flops: 185.4G, memory_bandwidth: 33.54GB/s,"
        " launch_overhead: 1.235us, efficiency: {conv: 0.744}}, {name: other, memory: 2GB}]\n"
        "interconnect: {mode: sequential, latency: 10us, links: [{a: 0, b: 1, bandwidth: 1GB/s}]}",
        "base.yaml",
    )
    peak = 846_589_424
    for ratio in (framework.FIT_RATIO, framework.ALGORITHMS_RATIO):
        for count in framework.DEVICE_COUNTS:
            spec = framework.split_devices(base, peak, ratio, count)
            assert spec.names == [f"/device:CPU:{i}" for i in range(count)]
            assert ratio * peak - count < spec.total_memory <= ratio * peak
            assert len({d.memory_bytes for d in spec.devices}) == 1
            assert {d.kind for d in spec.devices} == {base.devices[0].kind}  # its rates and efficiency
            assert spec.interconnect.mode == "sequential" and spec.interconnect.latency_us == 10
            assert spec.interconnect.links == {}  # base's links name base's devices
            yaml_text = dump_devices_yaml(spec)
            assert devices_from_yaml(yaml_text, "split.yaml").devices == spec.devices


def test_splits_place_each_row_on_every_device_count_and_render_the_counts(tmp_path):
    peak = 8_226_528  # about the one-device training peak of testdata/keras_cnn.onnx with SGD
    row = {
        "model": "cnn",
        "optimizer": "sgd",
        "onnx": "testdata/keras_cnn.onnx",
        "measured": {"peak_bytes": peak},
    }
    splits = framework.run_splits([row], parse_devices("1x1TB"), str(tmp_path))
    assert [r["devices"] for r in splits["rows"]] == list(framework.DEVICE_COUNTS)
    for r in splits["rows"]:
        for key, ratio in (("auto", framework.FIT_RATIO), ("placers", framework.ALGORITHMS_RATIO)):
            spec = load_devices_yaml(os.path.join(framework.ROOT, r[key]["spec"]))
            assert spec.count == r["devices"] and spec.devices[0].memory_bytes == r[key]["memory_bytes"]
            assert r[key]["memory_bytes"] == int(ratio * peak) // r["devices"]
        auto = r["auto"]
        assert auto["verdict"] == ("PASS" if auto["placed"] and auto["peak_over_memory"] <= 1 else "MISS")
        by_algorithm = r["placers"]["by_algorithm"]
        assert list(by_algorithm) == list(framework.SPLIT_ALGORITHMS)
        assert r["placers"]["verdict"] == (
            "PASS" if all(p["placed"] for p in by_algorithm.values()) else "MISS"
        )
        for record in [auto, *by_algorithm.values()]:
            assert ("error" in record) != record["placed"]
            if record["placed"]:
                assert len(record["peak_bytes"]) == r["devices"] and record["peak_over_memory"] <= 1
    text = "\n".join(framework.render_splits(splits))
    passes = sum(r["auto"]["verdict"] == "PASS" for r in splits["rows"])
    assert f"1.3 x P, auto: {passes} PASS, {len(splits['rows']) - passes} MISS" in text
    assert text.count("\n| cnn | sgd |") == 2 * len(framework.DEVICE_COUNTS)


def test_only_splits_needs_a_measured_framework_json(tmp_path, capsys):
    assert framework.main(["--only", "splits", "--out", str(tmp_path)]) == 2
    assert "run bench/framework.py without --only first" in capsys.readouterr().err


def test_h100_bench_places_on_one_preset_device_and_judges_both_ways():
    h100 = bench_module("h100")

    device = h100.one_device()
    assert (
        device.count == 1
        and device.devices[0].flops == 67e12
        and device.devices[0].memory_bandwidth == 3.35e12
    )
    row = {"model": "gpt2", "run": "SGD", "export": "g.onnx", "measured_step_ms": 100.0, "output_bytes": 1e9,
           "measured_peak_bytes": 10e9, "peak_bytes": 8.4e9, "step_ms": 126.0}  # fmt: skip
    text = h100.render({"date": "2026-11-24", "rows": [row]})
    assert (
        "| gpt2 | SGD | `g.onnx` | 10.000 / 8.400 GB | MISS (0.84) | 100.0 / 126.0 ms | MISS (1.26) |" in text
    )
    row |= {"peak_bytes": 8.6e9, "step_ms": 124.0}
    assert "PASS (0.86) | 100.0 / 124.0 ms | PASS (1.24)" in h100.render({"date": "d", "rows": [row]})
