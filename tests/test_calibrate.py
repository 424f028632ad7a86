"""`baechi devices calibrate`: the measurements, the YAML and its round trip, per-class efficiency in the
cost model, the noise check (a busy machine, repeats that spread: warned, refused, allowed), and every
error path -- without torch, through a stand-in runner and a stand-in CPU clock -- plus one real, quick
calibration of the CPU where torch is installed."""

from __future__ import annotations

import math
import os
import pathlib
import sys
import time
import types
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from baechi_cli.app import calibrate as cal
from baechi_cli.app.calibrate import (
    BUSY_CORES,
    CALIBRATE_STAGES,
    WIDE_SPREAD,
    Add,
    Conv,
    Copy,
    CpuSample,
    Gemm,
    Kernel,
    Launch,
    Matmul,
    Norm,
    TorchRunner,
    calibrate,
    cpu_sample,
    gemm_flops,
    matmul_count,
    norm_count,
    parse_targets,
    plan_for,
)
from baechi_cli.cli.commands import main
from baechi_cli.core.devices import (
    COMPUTE_CLASSES,
    Device,
    DeviceSpec,
    devices_from_yaml,
    dump_devices_yaml,
    parse_devices,
)
from baechi_cli.core.errors import EXIT_NOISY, InputError, MissingDependencyError, NoisyMeasurementError
from baechi_cli.core.graph import GraphBuilder
from baechi_cli.costs.analytic import estimate_costs, op_time_us
from baechi_cli.costs.registry import COMPUTE_CLASS_OF, OpCount, name_table, rule_for
from baechi_cli.io.onnx import read_onnx

TESTDATA = pathlib.Path(__file__).parents[1] / "testdata"
QUICK = plan_for("cpu", quick=True)
WHEN = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)


class FakeRunner:
    """Times every kernel as baechi's formula would: compute at a rate -- square GEMMs ``gemm``
    FLOP/s (half of it below n = 256), model-shaped ones ``matmul``, conv ``conv_forward``/
    ``conv_backward`` (a depthwise one ``depthwise`` both ways), the add ``gemm`` -- and memory at
    ``bandwidth`` bytes/s, the bytes and FLOPs as the rules count them, their max (their sum
    unless ``overlap``); a training step ``launch`` s per op it is charged; copies ``latency``
    s + bytes / ``link`` bytes/s (``links`` overrides per (src, dst)). ``broken`` maps a kernel
    type to the time its runs return instead; ``slowdown`` to factors its runs take in turn
    (warm-up runs included), as other processes sharing the cores would make them."""

    def __init__(self, **overrides: object) -> None:
        self.gemm, self.conv_forward, self.conv_backward, self.depthwise = 1e11, 6e10, 4e10, 5e9
        self.norm = 2e9
        self.matmul, self.overlap = 8e10, True
        self.bandwidth, self.launch, self.memory = 2e10, 2e-6, 16 * 10**9
        self.latency, self.link, self.links = 10e-6, 1e10, {}
        self.broken: dict[type, float] = {}
        self.slowdown: dict[type, list[float]] = {}
        self.__dict__.update(overrides)
        self.prepared: list[tuple[str, Kernel]] = []

    def describe(self) -> str:
        return "fake 1.0, 1 thread"

    def label(self, target: str) -> str:
        return f"fake {target}"

    def memory_bytes(self, target: str) -> int:
        return self.memory

    def roofline(self, count: OpCount, rate: float) -> float:
        compute, memory = count.flops / rate, (count.bytes_read + count.bytes_written) / self.bandwidth
        return max(compute, memory) if self.overlap else compute + memory

    def seconds(self, target: str, kernel: Kernel) -> float:
        if isinstance(kernel, Gemm):
            rate = self.gemm if kernel.n >= 256 else self.gemm / 2
            return self.roofline(matmul_count(kernel.n, kernel.n, kernel.n), rate)
        if isinstance(kernel, Matmul):
            return self.roofline(matmul_count(kernel.m, kernel.k, kernel.n), self.matmul)
        if isinstance(kernel, Conv):
            count = kernel.shape.backward_count() if kernel.backward else kernel.shape.forward_count()
            if kernel.shape.depthwise:
                return self.roofline(count, self.depthwise)
            return self.roofline(count, self.conv_backward if kernel.backward else self.conv_forward)
        if isinstance(kernel, Add):
            n = kernel.elements
            return self.roofline(OpCount(flops=n, bytes_read=8 * n, bytes_written=4 * n), self.gemm)
        if isinstance(kernel, Norm):
            return self.roofline(norm_count(kernel.shape), self.norm)
        if isinstance(kernel, Launch):
            return kernel.ops() * self.launch
        latency, link = self.links.get((target, kernel.dst), (self.latency, self.link))
        return latency + kernel.nbytes / link

    def prepare(self, target: str, kernel: Kernel) -> Callable[[], float]:
        self.prepared.append((target, kernel))
        value = self.broken.get(type(kernel), self.seconds(target, kernel))
        factors = iter(self.slowdown.get(type(kernel), []) * 100)
        return lambda: value * next(factors, 1.0)


class FakeClock:
    """CPU readings as if other processes kept ``others`` cores busy and this one 1 core, 1 s apart;
    ``None``: a machine without /proc/stat."""

    def __init__(self, others: float | None) -> None:
        self.others = others
        self.readings = 0

    def __call__(self) -> CpuSample | None:
        if self.others is None:
            return None
        t = float(self.readings)
        self.readings += 1
        return CpuSample(wall_s=t, busy_s=1000.0 + t * (self.others + 1.0), own_s=5.0 + t)


QUIET = 0.05  # cores other processes use on an idle machine


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Every calibration here reads a quiet machine's clock unless a test says otherwise: the suite
    runs beside other tests, whose load is not what these tests are about."""
    monkeypatch.setattr(cal, "cpu_sample", FakeClock(QUIET))


def run_cli(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stdout, result.stderr


# --- measurements and the YAML ---------------------------------------------------------


def test_one_device_yaml_reads_back_as_the_measured_spec(tmp_path):
    result = calibrate(
        ("cpu",), FakeRunner(), QUICK, command="baechi devices calibrate --torch cpu", when=WHEN
    )
    (m,) = result.measured
    assert m.gemm_flops == pytest.approx(1e11) and m.rates.gemm_n == 256
    conv_flops = sum(s.forward_flops() + s.backward_flops() for s in QUICK.conv)
    conv_s = sum(s.forward_flops() / 6e10 + s.backward_flops() / 4e10 for s in QUICK.conv)
    assert m.rates.conv_flops == pytest.approx(conv_flops / conv_s)
    assert m.bandwidth == pytest.approx(2e10) and m.launch_us == pytest.approx(2.0)
    assert m.rates.matmul_flops == pytest.approx(8e10) and m.overlap and m.rates.matmul_spread < 1e-9

    (d,) = result.spec.devices
    assert d.name == "/device:CPU:0" and d.memory_bytes == 16 * 10**9
    assert (d.flops, d.memory_bandwidth, d.launch_overhead_us, d.overlap) == (1e11, 2e10, 2.0, True)
    conv = round(conv_flops / conv_s / 1e11, 3)
    assert d.efficiency == (("conv", conv), ("depthwise", 0.05), ("gemm", 0.8), ("norm", 0.02))
    assert m.rates.depthwise_flops == pytest.approx(5e9)
    assert result.spec.interconnect == DeviceSpec((d,)).interconnect  # one device: the default

    # What the command writes is what `baechi place --devices FILE` reads.
    path = tmp_path / "cpu.yaml"
    path.write_text(result.yaml)
    loaded = parse_devices(str(path))
    assert loaded.devices == result.spec.devices and loaded.interconnect == result.spec.interconnect
    # Writing the spec again gives the same YAML (the numbers survive the round trip).
    body = result.yaml.split("devices:", 1)[1]
    assert dump_devices_yaml(loaded).split("devices:", 1)[1] == body

    header = result.yaml.split("devices:", 1)[0]
    assert header.startswith("# baechi devices calibrate --torch cpu\n")
    assert "2026-01-02 03:04 UTC with fake 1.0, 1 thread" in header
    assert "interconnect: not measured" in header
    assert all(line.startswith("#") for line in header.splitlines())


def test_a_device_whose_kernels_add_compute_and_memory_is_found_and_its_rates_recovered(tmp_path):
    result = calibrate(("cpu",), FakeRunner(overlap=False), QUICK)
    (m,) = result.measured
    assert not m.overlap and m.other.overlap
    assert m.rates.matmul_spread < 1e-9 < m.other.matmul_spread
    # each rate is the kernel's time less its other term: what the sum gives back
    r = m.rates
    assert (r.gemm_flops, r.matmul_flops, r.bandwidth) == pytest.approx((1e11, 8e10, 2e10))
    assert r.conv_forward_flops == pytest.approx(6e10) and r.conv_backward_flops == pytest.approx(4e10)
    assert r.depthwise_flops == pytest.approx(5e9)
    # the max would have read the same runs as slower kernels
    assert m.other.gemm_flops < 1e11 and m.other.bandwidth < 2e10
    (d,) = result.spec.devices
    assert not d.overlap and d.kind.endswith("/sum") and dict(d.efficiency)["gemm"] == 0.8
    assert "\n  overlap: false\n" in result.yaml
    assert "#   overlap: false: the matmuls' compute rates spread 0.0% with the sum" in result.yaml
    assert "(compute: each run's time less its bytes at memory_bandwidth)" in result.yaml
    path = tmp_path / "cpu.yaml"
    path.write_text(result.yaml)
    assert parse_devices(str(path)).devices == result.spec.devices


def test_the_overlap_key_reads_back_and_only_booleans_are_taken():
    spec = devices_from_yaml("devices: {count: 2, memory: 1GB, overlap: false}", "d.yaml")
    assert [d.overlap for d in spec.devices] == [False, False]
    assert "overlap: false" in dump_devices_yaml(spec)
    plain = devices_from_yaml("devices: [{memory: 1GB}]", "d.yaml").devices[0]
    assert plain.overlap and "overlap" not in dump_devices_yaml(DeviceSpec((plain,)))
    assert plain.kind != replace(plain, overlap=False).kind
    for bad in ("'no'", "0", "maybe"):
        with pytest.raises(InputError, match=r"d.yaml: devices\[0\].overlap .* must be true or false"):
            devices_from_yaml(f"devices: [{{memory: 1GB, overlap: {bad}}}]", "d.yaml")


def test_launch_ops_are_the_ops_a_training_step_charges_for_the_launch_model(tmp_path):
    """Launch's divisor is what baechi's --training charges for the same model: its ONNX export
    (Gemm, Tanh per layer) placed on a device where every op costs its launch alone."""
    from onnx import TensorProto, helper, save

    from baechi_cli.app.place import place_model
    from baechi_cli.search.candidates import PlaceOptions

    width, layers = cal.LAUNCH_WIDTH, 6
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"], name=f"fc{i}", transB=1))
        nodes.append(helper.make_node("Tanh", [f"g{i}"], [f"t{i}"], name=f"tanh{i}"))
        inits.append(
            helper.make_tensor(f"w{i}", TensorProto.FLOAT, [width, width], [0.1 * (i + 1)] * width**2)
        )
        inits.append(helper.make_tensor(f"b{i}", TensorProto.FLOAT, [width], [0.01 * (i + 1)] * width))
        x = f"t{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, width])],
        inits,
    )
    path = tmp_path / "mlp.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    launch_only = DeviceSpec((Device("d", 10**9, flops=1e30, memory_bandwidth=1e30, launch_overhead_us=1.0),))
    outcome = place_model(str(path), launch_only, PlaceOptions(algo="single", training=True))
    g = outcome.graph
    step = [v for v in range(g.num_ops) if not g.names[v].startswith("optimizer/")]
    assert sum(g.compute_us[v] for v in step) == pytest.approx(Launch(layers).ops())


def test_the_best_gemm_rate_is_kept_and_numbers_are_rounded_to_four_digits():
    runner = FakeRunner(gemm=123456789012.0, bandwidth=9.87654321e9, launch=1.234567e-6)
    (d,) = calibrate(("cpu",), runner, QUICK).spec.devices
    assert (d.flops, d.memory_bandwidth, d.launch_overhead_us) == (1.235e11, 9.877e9, 1.235)


def test_stages_are_reported_in_order():
    stages: list[str] = []
    steps: list[tuple[int, int]] = []
    calibrate(
        ("cuda:0", "cuda:1"), FakeRunner(), QUICK, progress=stages.append, steps=lambda *s: steps.append(s)
    )
    per_device = [s for s in CALIBRATE_STAGES if s != "transfers"]
    assert stages == per_device * 2 + ["transfers"]
    assert steps[-1] == (len(QUICK.transfer_exps), len(QUICK.transfer_exps))


def test_two_cuda_devices_measure_and_fit_the_interconnect():
    runner = FakeRunner(latency=8e-6, link=25e9)
    result = calibrate(("cuda:0", "cuda:1"), runner, QUICK)
    assert result.spec.names == ["/device:GPU:0", "/device:GPU:1"]
    ic = result.spec.interconnect
    assert ic.latency_us == pytest.approx(8.0) and ic.bandwidth_bytes_per_us == pytest.approx(25e3)
    assert ic.links == {} and ic.mode == "parallel"
    (fit,) = result.fits
    assert (fit.src, fit.dst, fit.method) == ("cuda:0", "cuda:1", "torch-copy") and fit.r2 == pytest.approx(1)
    copies = [k for t, k in runner.prepared if isinstance(k, Copy)]
    assert [k.nbytes for k in copies] == [2**e for e in QUICK.transfer_exps]
    assert "cuda:0 -> cuda:1: latency 8 us, bandwidth 25 GB/s" in result.yaml


def test_three_cuda_devices_get_a_link_per_pair():
    slow = {("cuda:1", "cuda:2"): (20e-6, 5e9)}
    result = calibrate(("cuda:0", "cuda:1", "cuda:2"), FakeRunner(links=slow), QUICK)
    ic = result.spec.interconnect
    assert sorted(ic.links) == [(0, 1), (0, 2), (1, 2)]
    assert ic.transfer_time(10**6, 2, 1) == pytest.approx(20 + 10**6 / 5e3)
    assert ic.transfer_time(10**6, 0, 2) == pytest.approx(10 + 10**6 / 10e3)
    # the defaults are the pairs' medians
    assert ic.latency_us == pytest.approx(10.0) and ic.bandwidth_bytes_per_us == pytest.approx(10e3)


def test_count_copies_the_measured_device():
    result = calibrate(("cuda:2",), FakeRunner(), QUICK, count=3)
    assert result.spec.names == ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]
    assert result.spec.homogeneous and "3 devices like cuda:2" in result.yaml
    assert calibrate(("cuda:2",), FakeRunner(), QUICK).spec.names == ["/device:GPU:2"]


def test_conv_flops_are_the_conv2d_rules_counts():
    shape = QUICK.conv[0]
    window = shape.kernel * shape.kernel * shape.cin
    assert shape.forward_flops() == 2 * shape.batch * shape.size**2 * shape.cout * window
    assert shape.backward_flops() == 2 * shape.forward_flops()
    assert gemm_flops(64) == 2 * 64**3


def test_target_names():
    assert parse_targets("CUDA:1 ,cuda:0") == ("cuda:1", "cuda:0")
    assert parse_targets("cpu:0") == ("cpu",)
    for bad, fragment in [
        ("tpu", "'tpu': not a device"),
        ("cuda:x", "'cuda:x': not a device"),
        ("cuda:0,cuda:0", "listed twice"),
        ("cpu,cuda:0", "cpu is measured alone"),
        ("cuda:0,", "'': not a device"),
    ]:
        with pytest.raises(InputError, match=fragment):
            parse_targets(bad)


# --- efficiency in the cost model ------------------------------------------------------


def test_rules_carry_their_compute_class_and_onnx_aliases_take_it():
    tf = name_table("tensorflow")
    # norm is not a rule's class: op_compute_class gives it to a batch norm in training mode
    assert set(COMPUTE_CLASS_OF) <= set(tf) and set(COMPUTE_CLASS_OF.values()) == set(COMPUTE_CLASSES) - {
        "norm"
    }
    for op_type, entry in tf.items():
        assert entry.compute_class == COMPUTE_CLASS_OF.get(op_type, "")
    expected = {
        "Conv": "conv",
        "ConvTranspose": "conv",
        "QLinearConv": "conv",
        "Gemm": "gemm",
        "MatMul": "gemm",
        "Einsum": "gemm",
        "Relu": "",
        "Attention": "",
    }
    assert {t: rule_for(t, "onnx").compute_class for t in expected} == expected
    for entry in name_table("onnx").values():
        assert entry.compute_class == COMPUTE_CLASS_OF.get(entry.shares, "")


def test_op_time_applies_the_class_efficiency_to_the_compute_bound_only():
    d = Device("d", 1, flops=1e12, memory_bandwidth=1e11, launch_overhead_us=3.0, efficiency=(("conv", 0.5),))
    compute_bound, memory_bound = OpCount(flops=1e9, bytes_read=1000), OpCount(flops=1e3, bytes_read=10**8)
    assert op_time_us(compute_bound, d) == pytest.approx(1e3 + 3.0)
    assert op_time_us(compute_bound, d, compute_class="conv") == pytest.approx(2e3 + 3.0)
    assert op_time_us(compute_bound, d, compute_class="gemm") == pytest.approx(1e3 + 3.0)
    assert op_time_us(memory_bound, d, compute_class="conv") == pytest.approx(1e3 + 3.0)
    assert op_time_us(compute_bound, d, launches_kernel=False, compute_class="conv") == 0.0


def test_onnx_model_times_scale_by_class_and_nothing_else_changes():
    graph = read_onnx(str(TESTDATA / "torch_resnet.onnx"))
    plain = Device("/device:CPU:0", 8 * 10**9, flops=1e11, memory_bandwidth=2e10, launch_overhead_us=2.0)
    tuned = replace(plain, efficiency=(("conv", 0.5), ("gemm", 0.25)))
    base, report = estimate_costs(graph, DeviceSpec((plain,)), op_set="onnx")
    costed, _ = estimate_costs(graph, DeviceSpec((tuned,)), op_set="onnx")
    factor = {"Conv": 0.5, "Gemm": 0.25}
    changed = set()
    for v, t in enumerate(graph.op_types):
        if base.compute_us[v] == 0:  # no kernel (the graph input)
            continue
        compute = report.flops[v] / (1e11 * factor.get(t, 1.0))
        memory = report.bytes_accessed[v] / 2e10
        assert costed.compute_us[v] == pytest.approx(max(compute, memory) * 1e6 + 2.0), graph.names[v]
        if costed.compute_us[v] != base.compute_us[v]:
            changed.add(t)
    assert changed == {"Conv", "Gemm"}
    assert costed.compute_us_by_kind == {tuned.kind: costed.compute_us} and tuned.kind != plain.kind


def test_a_grouped_onnx_conv_runs_at_the_depthwise_rate_or_the_conv_rate_without_one(tmp_path):
    from onnx import TensorProto, helper, save

    # x -> depthwise 3x3 (group 16) -> dense 1x1, as MobileNetV2's blocks
    nodes = [
        helper.make_node("Conv", ["x", "wd"], ["d"], name="depthwise", group=16, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d", "wp"], ["y"], name="pointwise"),
    ]
    graph = helper.make_graph(
        nodes,
        "blocks",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32, 32, 32])],
        [
            helper.make_tensor("wd", TensorProto.FLOAT, [16, 1, 3, 3], [0.0] * 144),
            helper.make_tensor("wp", TensorProto.FLOAT, [32, 16, 1, 1], [0.0] * 512),
        ],
    )
    path = tmp_path / "blocks.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    g = read_onnx(str(path))
    depthwise, pointwise = g.names.index("depthwise"), g.names.index("pointwise")
    slow = 1e6  # FLOP/s: compute-bound at every rate below
    plain = Device("/device:CPU:0", 8 * 10**9, flops=slow, memory_bandwidth=1e15, launch_overhead_us=0.0)
    costed = {}
    for name, efficiency in (
        ("conv only", (("conv", 0.5),)),
        ("calibrated", (("conv", 0.5), ("depthwise", 0.05))),
    ):
        costed[name], report = estimate_costs(
            g, DeviceSpec((replace(plain, efficiency=efficiency),)), op_set="onnx"
        )
    for name, factor in (("conv only", 0.5), ("calibrated", 0.05)):
        assert costed[name].compute_us[depthwise] == pytest.approx(
            report.flops[depthwise] / (slow * factor) * 1e6
        )
        assert costed[name].compute_us[pointwise] == pytest.approx(
            report.flops[pointwise] / (slow * 0.5) * 1e6
        )
    # TensorFlow's depthwise op types are the class by name
    assert rule_for("DepthwiseConv2dNative").compute_class == "depthwise"


def test_a_calibrated_spec_times_convolutions_slower_than_matmuls(tmp_path):
    result = calibrate(("cpu",), FakeRunner(), QUICK)
    path = tmp_path / "cpu.yaml"
    path.write_text(result.yaml)
    spec = parse_devices(str(path))
    b = GraphBuilder()
    x = b.add_op("x", "Placeholder", [4 * 8 * 32 * 32 * 64], output_shapes=[(8, 32, 32, 64)])
    w = b.add_op("w", "Const", [4 * 3 * 3 * 64 * 64], output_shapes=[(3, 3, 64, 64)])
    c = b.add_op("conv", "Conv2D", [4 * 8 * 32 * 32 * 64], output_shapes=[(8, 32, 32, 64)])
    b.add_edge(x, c)
    b.add_edge(w, c)
    costed, report = estimate_costs(b.build(), spec)
    d = spec.devices[0]
    expected = report.flops[c] / (d.flops * dict(d.efficiency)["conv"]) * 1e6 + d.launch_overhead_us
    assert costed.compute_us[c] == pytest.approx(expected)


# --- noise ------------------------------------------------------------------------------


def noisy_cli(monkeypatch, runner: FakeRunner, others: float | None, args: list[str]) -> tuple[int, str, str]:
    """``baechi devices calibrate --torch cpu --quick ARGS`` measuring with ``runner`` while other
    processes keep ``others`` cores busy."""
    monkeypatch.setattr(cal.TorchRunner, "open", classmethod(lambda cls, t: runner))
    monkeypatch.setattr(cal, "cpu_sample", FakeClock(others))
    return run_cli(["devices", "calibrate", "--torch", "cpu", "--quick", *args])


def test_a_quiet_machine_is_recorded_and_not_noisy():
    result = calibrate(("cpu",), FakeRunner(), QUICK, clock=FakeClock(QUIET))
    noise = result.noise
    assert noise.other_cores == pytest.approx(QUIET) and not noise.noisy
    assert noise.widest is not None and noise.widest.value == 0.0  # the stand-in times every run alike
    header = result.yaml.split("devices:", 1)[0]
    assert f"# noise: other processes used 0.05 of {noise.cores} cores; widest spread of repeats: " in header
    assert "NOISY" not in header


def test_other_processes_on_the_cores_make_a_cpu_calibration_noisy():
    result = calibrate(("cpu",), FakeRunner(), QUICK, clock=FakeClock(1.5))
    assert result.noise.busy and result.noise.noisy and not result.noise.wide
    assert result.noise.other_cores == pytest.approx(1.5)
    assert f"other processes used 1.50 of {result.noise.cores} cores (over {BUSY_CORES:g})" in result.yaml
    assert "# NOISY: written with --allow-noisy" in result.yaml
    assert not calibrate(("cpu",), FakeRunner(), QUICK, clock=FakeClock(BUSY_CORES - 0.01)).noise.noisy


def test_a_cuda_calibration_leaves_all_but_one_core_to_others(monkeypatch):
    monkeypatch.setattr(cal.os, "cpu_count", lambda: 8)
    calm = calibrate(("cuda:0",), FakeRunner(), QUICK, clock=FakeClock(6.5)).noise
    assert calm.busy_limit == 7 + BUSY_CORES and not calm.noisy
    assert calibrate(("cuda:0",), FakeRunner(), QUICK, clock=FakeClock(7.5)).noise.busy


def test_repeats_that_spread_wide_name_the_widest_kernel():
    # each matmul's runs (1 warm-up, 3 timed) are slowed in the last two timed ones: the first size names it
    runner = FakeRunner(slowdown={Gemm: [1.0, 1.0, 1.5, 3.0]})
    noise = calibrate(("cpu",), runner, QUICK, clock=FakeClock(QUIET)).noise
    assert noise.wide and noise.noisy and not noise.busy
    assert noise.widest is not None and noise.widest.value == pytest.approx(0.5)
    assert noise.widest.kernel == Gemm(128) and noise.widest.target == "cpu"
    assert noise.summary().endswith(
        f"widest spread of repeats: a 128x128 matmul on cpu, its median run 50% above its fastest "
        f"(over {WIDE_SPREAD:.0%})"
    )


def test_one_slow_run_is_not_noise():
    runner = FakeRunner(slowdown={Gemm: [1.0, 1.0, 1.0, 9.0]})  # the median ignores it
    assert not calibrate(("cpu",), runner, QUICK, clock=FakeClock(QUIET)).noise.noisy


def test_without_proc_stat_only_the_spread_decides():
    quiet = calibrate(("cpu",), FakeRunner(), QUICK, clock=FakeClock(None)).noise
    assert quiet.other_cores is None and not quiet.noisy
    assert "other processes' load not measured (no /proc/stat)" in quiet.summary()
    spread = FakeRunner(slowdown={Add: [1.0, 1.0, 2.0, 2.0]})
    assert calibrate(("cpu",), spread, QUICK, clock=FakeClock(None)).noise.noisy


@pytest.mark.parametrize("to_file", [True, False])
def test_cli_refuses_a_noisy_calibration_with_exit_6_and_writes_nothing(monkeypatch, tmp_path, to_file):
    out = tmp_path / "cpu.yaml"
    args = ["-o", str(out)] if to_file else []
    code, stdout, stderr = noisy_cli(monkeypatch, FakeRunner(), 1.5, args)
    assert code == EXIT_NOISY == NoisyMeasurementError.exit_code == 6
    assert os.listdir(tmp_path) == [] and (to_file or stdout == "")
    assert stderr.count("\n") == 1 and stderr.startswith(
        "error: the machine was too noisy to calibrate: other processes used 1.50 of "
    )
    assert "nothing was written" in stderr and "--allow-noisy" in stderr


def test_cli_refuses_wide_repeats_naming_the_kernel(monkeypatch, tmp_path):
    out = tmp_path / "cpu.yaml"
    runner = FakeRunner(slowdown={Launch: [1.0, 1.0, 2.0, 2.0]})
    code, _, stderr = noisy_cli(monkeypatch, runner, QUIET, ["-o", str(out)])
    assert code == EXIT_NOISY and not out.exists()
    assert (
        "a training step of 20 tiny layers on cpu, its median run 100% above its fastest (over 30%)" in stderr
    )


def test_cli_allow_noisy_warns_and_writes_the_numbers_marked(monkeypatch, tmp_path):
    out = tmp_path / "cpu.yaml"
    code, stdout, stderr = noisy_cli(monkeypatch, FakeRunner(), 1.5, ["--allow-noisy", "-q", "-o", str(out)])
    assert code == 0 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith(
        "warning: the calibration measured noise: other processes used 1.50 of "
    )
    text = out.read_text()
    assert text.startswith("# baechi devices calibrate --torch cpu -o ")
    assert (
        "--allow-noisy\n" in text.splitlines(keepends=True)[0]
        and "# NOISY: written with --allow-noisy" in text
    )
    assert parse_devices(str(out)).devices[0].flops == 1e11


def test_cli_on_a_quiet_machine_says_nothing_about_noise(monkeypatch, tmp_path):
    out = tmp_path / "cpu.yaml"
    code, _, stderr = noisy_cli(monkeypatch, FakeRunner(), QUIET, ["-q", "-o", str(out)])
    assert code == 0 and stderr == "" and "# noise: other processes used 0.05 of" in out.read_text()


def test_the_real_clock_counts_this_process_apart():
    start = cpu_sample()
    if start is None:
        pytest.skip("no /proc/stat")
    # Busy on one core until the clock has counted 0.1 s of this process's own time (others'
    # processes sharing the cores only make that take longer; 10 s of wall time is the limit).
    deadline = time.perf_counter() + 10.0
    end = cpu_sample()
    while end is not None and end.own_s - start.own_s < 0.1 and time.perf_counter() < deadline:
        for _ in range(10_000):
            pass
        end = cpu_sample()
    assert end is not None and end.own_s - start.own_s >= 0.1 and end.busy_s >= start.busy_s
    others = cal.other_cores(start, end)
    assert others is not None and 0 <= others <= (os.cpu_count() or 1)


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", [Gemm, Matmul, Conv, Add, Launch, Copy])
@pytest.mark.parametrize("bad", [0.0, -1e-3, math.nan, math.inf])
def test_a_broken_timer_is_an_error_naming_the_device_and_kernel(kernel, bad):
    runner = FakeRunner(broken={kernel: bad})
    with pytest.raises(InputError) as info:
        calibrate(("cuda:0", "cuda:1"), runner, QUICK)
    message = str(info.value)
    assert message.startswith("cuda:0: timing ") and "the timer is broken" in message and "\n" not in message


def test_a_device_without_memory_is_an_error():
    with pytest.raises(InputError, match="cpu: the device reports 0 bytes of memory"):
        calibrate(("cpu",), FakeRunner(memory=0), QUICK)


def test_copies_that_do_not_grow_with_size_name_the_pair():
    runner = FakeRunner(link=math.inf)  # every copy takes the latency alone
    with pytest.raises(InputError, match=r"^cuda:0 -> cuda:1: the transfer time did not grow"):
        calibrate(("cuda:0", "cuda:1"), runner, QUICK)


def test_count_with_several_devices_is_an_error():
    with pytest.raises(InputError, match="--count copies one measured device"):
        calibrate(("cuda:0", "cuda:1"), FakeRunner(), QUICK, count=2)


def fake_torch(available: bool, count: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    torch.cuda = types.SimpleNamespace(is_available=lambda: available, device_count=lambda: count)
    return torch


@pytest.mark.parametrize(
    "torch_module, devices, fragment",
    [
        (fake_torch(False, 0), "cuda:0", "--torch cuda:0: torch 0.0-fake sees no CUDA device here"),
        (fake_torch(True, 1), "cuda:3", "--torch cuda:3: torch sees 1 CUDA device(s) here (cuda:0..cuda:0)"),
        (fake_torch(True, 2), "cuda:0,cuda:2", "--torch cuda:2: torch sees 2 CUDA device(s)"),
    ],
)
def test_a_device_torch_cannot_see_is_an_input_error(monkeypatch, torch_module, devices, fragment):
    monkeypatch.setitem(sys.modules, "torch", torch_module)
    with pytest.raises(InputError) as info:
        TorchRunner.open(parse_targets(devices))
    assert str(info.value).startswith(fragment)


def test_cli_without_torch_exits_5_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(MissingDependencyError):
        TorchRunner.open(("cpu",))
    out = tmp_path / "cpu.yaml"
    code, stdout, stderr = run_cli(["devices", "calibrate", "--torch", "cpu", "-o", str(out)])
    assert code == 5 and stdout == "" and not out.exists()
    assert stderr == "error: calibration measures with PyTorch, which is not installed: pip install torch\n"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--torch", "tpu"], "error: --torch 'tpu': not a device calibration can measure"),
        (["--torch", "cuda:0,cuda:1", "--count", "2"], "error: --count copies one measured device"),
    ],
)
def test_cli_bad_devices_exit_2_and_write_nothing(tmp_path, args, fragment):
    out = tmp_path / "d.yaml"
    code, stdout, stderr = run_cli(["devices", "calibrate", *args, "-o", str(out)])
    assert code == 2 and stdout == "" and not out.exists()
    assert stderr.startswith(fragment) and stderr.count("\n") == 1


def test_cli_broken_timer_exits_2_and_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(cal.TorchRunner, "open", classmethod(lambda cls, t: FakeRunner(broken={Add: 0.0})))
    out = tmp_path / "cpu.yaml"
    code, stdout, stderr = run_cli(["devices", "calibrate", "--torch", "cpu", "--quick", "-o", str(out)])
    assert code == 2 and not out.exists()
    assert (
        stderr.startswith("error: cpu: timing a + b of 4194304 elements gave 0.0 s")
        and stderr.count("\n") == 1
    )


def test_cli_prints_the_yaml_or_writes_it(monkeypatch, tmp_path):
    monkeypatch.setattr(cal.TorchRunner, "open", classmethod(lambda cls, t: FakeRunner()))
    code, stdout, _ = run_cli(["devices", "calibrate", "--torch", "cpu", "--quick"])
    assert code == 0 and stdout.startswith("# baechi devices calibrate --torch cpu --quick\n")
    assert devices_from_yaml(stdout, "stdout").devices[0].flops == 1e11

    out = tmp_path / "cpu.yaml"
    code, stdout, _ = run_cli(
        ["devices", "calibrate", "--torch", "cpu", "--quick", "--count", "2", "-o", str(out)]
    )
    assert code == 0 and parse_devices(str(out)).count == 2
    assert "cpu (fake cpu): GEMM 100 GFLOP/s" in stdout and f"wrote {out}: 2 device(s)" in stdout
    code, stdout, _ = run_cli(["devices", "calibrate", "--torch", "cpu", "--quick", "-q", "-o", str(out)])
    assert code == 0 and stdout == ""


def test_help_lists_the_devices_group():
    code, stdout, _ = run_cli(["devices", "--help"])
    assert code == 0 and "calibrate" in stdout


# --- the real thing ------------------------------------------------------------------------


def test_real_quick_cpu_calibration(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.yaml"
    # --allow-noisy: the suite's other tests share the cores, so the repeats may spread
    args = ["devices", "calibrate", "--torch", "cpu", "--quick", "-q", "--allow-noisy", "-o", str(out)]
    for _ in range(3):  # --quick's three runs a kernel, on cores the suite shares: up to three tries
        code, _, stderr = run_cli(args)
        assert code == 0, stderr
        (d,) = parse_devices(str(out)).devices
        if d.flops_for("depthwise") < d.flops_for("conv"):
            break
    assert d.name == "/device:CPU:0" and d.memory_bytes > 2**30
    assert d.flops > 1e8 and d.memory_bandwidth > 1e8 and 0 < d.launch_overhead_us < 1e4
    assert [name for name, _ in d.efficiency] == ["conv", "depthwise", "gemm", "norm"]
    # a real depthwise kernel moves a few bytes per FLOP: it never reaches the dense convolutions' rate
    assert d.flops_for("depthwise") < d.flops_for("conv")
    assert "with torch " in out.read_text()


def test_batch_norms_in_training_run_at_norms_rate():
    """efficiency.norm applies to a batch norm in training mode, in every op set, and nowhere else;
    --training puts an ONNX export's batch norms (exported in eval mode) in training mode."""
    from baechi_cli.costs.registry import op_compute_class

    bn = rule_for("BatchNormalization", "onnx")
    assert op_compute_class(bn, {"training_mode": 1}) == "norm" and op_compute_class(bn, {}) != "norm"
    fused = rule_for("FusedBatchNormV3", "tensorflow")
    assert op_compute_class(fused, {}) == "norm" and op_compute_class(fused, {"is_training": False}) != "norm"
    aten = rule_for("aten._native_batch_norm_legit_functional", "aten")
    assert op_compute_class(aten, {"_args": {"training": True}}) == "norm"
    assert op_compute_class(rule_for("Relu", "onnx"), {"training_mode": 1}) != "norm"

    from baechi_cli.app.place import place_model
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.search.candidates import PlaceOptions

    model = os.path.join(os.path.dirname(__file__), "..", "testdata", "torch_resnet.onnx")
    plain = parse_devices("1x1GB")
    slow_norms = DeviceSpec((replace(plain.devices[0], efficiency=(("norm", 0.001),)),), plain.interconnect)
    options = PlaceOptions(algo="single", training=True)
    times = [place_model(model, spec, options).sim.step_time_us for spec in (plain, slow_norms)]
    assert times[1] > 1.5 * times[0]
    inference = PlaceOptions(algo="single")
    assert place_model(model, slow_norms, inference).sim.step_time_us == pytest.approx(
        place_model(model, plain, inference).sim.step_time_us
    )
