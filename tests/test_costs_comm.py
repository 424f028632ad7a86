"""Communication calibration (baechi_cli.costs.comm): the fit, the YAML, the measurement."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest
import yaml

from baechi_cli.core.devices import load_devices_yaml, parse_devices
from baechi_cli.core.errors import InputError, MissingDependencyError
from baechi_cli.costs import comm
from baechi_cli.costs.comm import (
    CommFit,
    TransferSample,
    choose_device_pair,
    fit_samples,
    fit_transfer_model,
    interconnect_yaml,
    measure_transfers,
    normalize_device,
)

SIZES = [2**e for e in range(29)]  # the default sweep, 1 B .. 256 MiB
BAECHI_LAT, BAECHI_US_PER_BYTE = 134.0, 0.0001754


# --- the fit ----------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["ols", "relative"])
def test_exact_data_recovers_latency_and_bandwidth(weighting):
    times = [BAECHI_LAT + BAECHI_US_PER_BYTE * b for b in SIZES]
    fit = fit_transfer_model(SIZES, times, weighting=weighting)
    assert fit.latency_us == pytest.approx(BAECHI_LAT, rel=1e-9)
    assert fit.us_per_byte == pytest.approx(BAECHI_US_PER_BYTE, rel=1e-12)
    assert fit.bandwidth_gb_per_s == pytest.approx(5.701254, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.note == "" and fit.weighting == weighting
    assert fit.transfer_time_us(10**6) == pytest.approx(134 + 175.4)


def test_noisy_data():
    rng = np.random.default_rng(7)
    x = np.array(SIZES * 5, dtype=float)
    clean = 20.0 + x / 12_000.0  # 20 us + 12 GB/s
    noisy = clean * rng.normal(1.0, 0.02, x.size) + rng.normal(0.0, 2.0, x.size)
    ols = fit_transfer_model(x.astype(int).tolist(), noisy.tolist())
    assert ols.bandwidth_gb_per_s == pytest.approx(12.0, rel=0.02)
    assert 0.995 < ols.r2 < 1.0
    # The relative fit is the one that pins the latency down: 2% of 23 ms swamps 20 us in OLS.
    rel = fit_transfer_model(x.astype(int).tolist(), np.abs(noisy).tolist(), weighting="relative")
    assert rel.latency_us == pytest.approx(20.0, rel=0.1)
    assert rel.bandwidth_gb_per_s == pytest.approx(12.0, rel=0.05)
    assert 0.99 < rel.r2 <= ols.r2  # OLS maximises the plain R²


def test_fit_samples_uses_the_medians_and_keeps_the_samples():
    samples = [TransferSample(b, (t, t + 1000.0, t - 1.0)) for b, t in ((0, 10.0), (10**6, 110.0))]
    fit = fit_samples(samples, src="/device:CPU:0", dst="/device:CPU:1", method="cpu-memcpy")
    assert fit.latency_us == pytest.approx(10.0) and fit.bandwidth_gb_per_s == pytest.approx(10.0)
    assert fit.samples == tuple(samples)
    data = fit.to_json()
    assert data["src"] == "/device:CPU:0" and data["method"] == "cpu-memcpy"
    assert [s["median_us"] for s in data["samples"]] == [10.0, 110.0]
    assert data["samples"][1]["predicted_us"] == pytest.approx(110.0)
    assert data["samples"][0]["times_us"] == [10.0, 1010.0, 9.0]


def test_negative_latency_is_clamped_and_said():
    x = [0, 10**6, 2 * 10**6, 3 * 10**6]
    y = [0.0, 20.0, 150.0, 290.0]  # convex: the straight line crosses below zero
    raw = np.polyfit(x, y, 1)
    assert raw[1] < 0
    fit = fit_transfer_model(x, y)
    assert fit.latency_us == 0.0
    xa, ya = np.array(x, float), np.array(y)
    assert fit.us_per_byte == pytest.approx((xa * ya).sum() / (xa * xa).sum())
    assert "negative" in fit.note and "clamped to 0" in fit.note
    pred = xa * fit.us_per_byte
    assert fit.r2 == pytest.approx(1 - ((ya - pred) ** 2).sum() / ((ya - ya.mean()) ** 2).sum())
    assert "# note: fitted latency" in interconnect_yaml(fit)


@pytest.mark.parametrize(
    "nbytes, times, match",
    [
        (SIZES, [200.0] * len(SIZES), "did not grow with size"),  # CPU rendezvous: no copy at all
        ([1, 2**20, 2**24], [300.0, 250.0, 200.0], "did not grow with size"),
        ([1024, 1024, 1024], [1.0, 2.0, 3.0], "two different sizes"),
        ([1, 2], [1.0], "pair up"),
        ([1, 2], [1.0, -2.0], "negative"),
        ([1, 2], [1.0, float("nan")], "finite"),
        ([], [], "two different sizes"),
    ],
)
def test_degenerate_data_is_a_one_line_input_error(nbytes, times, match):
    with pytest.raises(InputError, match=match) as info:
        fit_transfer_model(nbytes, times)
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_bad_weighting():
    with pytest.raises(InputError, match="unknown weighting"):
        fit_transfer_model([1, 2], [1.0, 2.0], weighting="huber")
    with pytest.raises(InputError, match="positive times"):
        fit_transfer_model([1, 2], [0.0, 2.0], weighting="relative")


# --- YAML --------------------------------------------------------------------


def _measured_fit(**kw) -> CommFit:
    times = [15.25 + b / 10_781.3 for b in SIZES]
    return fit_transfer_model(
        SIZES, times, src="/device:CPU:0", dst="/device:CPU:1", method="cpu-memcpy", **kw
    )


def test_yaml_block_alone_pastes_into_a_device_file(tmp_path):
    fit = _measured_fit()
    text = interconnect_yaml(fit)
    doc = yaml.safe_load(text)
    assert list(doc) == ["interconnect"]
    assert doc["interconnect"]["mode"] == "sequential"
    assert "/device:CPU:0 -> /device:CPU:1" in text and "R^2 1.0000" in text
    path = tmp_path / "devices.yaml"
    path.write_text("devices: {count: 2, memory: 8GiB}\n" + text)
    spec = load_devices_yaml(str(path))
    assert spec.count == 2
    assert spec.interconnect.mode == "sequential"
    assert spec.interconnect.latency_us == pytest.approx(fit.latency_us, rel=1e-6)
    assert spec.interconnect.bandwidth_bytes_per_us == pytest.approx(fit.bandwidth_bytes_per_us, rel=1e-6)
    assert spec.interconnect.transfer_time(2**28, 0, 1) == pytest.approx(
        fit.transfer_time_us(2**28), rel=1e-6
    )
    parallel = yaml.safe_load(interconnect_yaml(fit, mode="parallel"))
    assert parallel["interconnect"]["mode"] == "parallel"


@pytest.mark.parametrize("devices", ["2x16GB,2x8GB", "v100x4", "rtx2080x4"])
def test_yaml_with_devices_round_trips(tmp_path, devices):
    spec = parse_devices(devices)
    fit = _measured_fit()
    path = tmp_path / "calibrated.yaml"
    path.write_text(interconnect_yaml(fit, spec))
    back = load_devices_yaml(str(path))
    assert back.devices == spec.devices  # names, memory, flops, memory bandwidth, launch overhead
    assert back.interconnect.mode == spec.interconnect.mode  # mode defaults to the spec's
    assert back.interconnect.latency_us == pytest.approx(fit.latency_us, rel=1e-6)
    assert back.interconnect.bandwidth_bytes_per_us == pytest.approx(fit.bandwidth_bytes_per_us, rel=1e-6)
    path.write_text(interconnect_yaml(fit, spec, mode="parallel"))
    assert load_devices_yaml(str(path)).interconnect.mode == "parallel"


def test_yaml_with_devices_keeps_links_and_odd_numbers(tmp_path):
    source = tmp_path / "source.yaml"
    source.write_text(
        "devices:\n"
        "  - {name: /device:GPU:0, memory: 12345678901, flops: 1.234567891e13, launch_overhead: 3.3us}\n"
        "  - {name: /device:GPU:1, memory: 8GiB, memory_bandwidth: 900GB/s}\n"
        "  - {name: /job:worker/task:1/device:GPU:0, memory: 16GB}\n"
        "interconnect:\n"
        "  mode: parallel\n"
        "  links:\n"
        "    - {a: /device:GPU:0, b: /job:worker/task:1/device:GPU:0, latency: 1.5ms, bandwidth: 1.25GB/s}\n"
    )
    spec = load_devices_yaml(str(source))
    fit = fit_transfer_model([0, 10**9], [0.123456789, 0.123456789 + 1e9 / 333_333.333])
    path = tmp_path / "calibrated.yaml"
    path.write_text(interconnect_yaml(fit, spec))
    back = load_devices_yaml(str(path))
    assert back.devices == spec.devices
    assert back.interconnect.links.keys() == spec.interconnect.links.keys() == {(0, 2)}
    assert back.interconnect.links[(0, 2)] == pytest.approx(spec.interconnect.links[(0, 2)])
    assert back.interconnect.links[(0, 2)] == pytest.approx((1500.0, 1250.0))
    assert back.interconnect.mode == "parallel"
    assert back.interconnect.latency_us == pytest.approx(0.123456789, rel=1e-6)
    assert back.interconnect.bandwidth_bytes_per_us == pytest.approx(333_333.333, rel=1e-6)


def test_yaml_rejects_an_unknown_mode():
    with pytest.raises(InputError, match="unknown communication mode 'ring'"):
        interconnect_yaml(_measured_fit(), mode="ring")


# --- devices and arguments (no TensorFlow needed) --------------------------------


def test_device_pair_and_names():
    assert choose_device_pair(8) == ("/device:GPU:0", "/device:GPU:1")
    assert choose_device_pair(1) == ("/device:GPU:0", "/device:CPU:0")
    assert choose_device_pair(0) == ("/device:CPU:0", "/device:CPU:1")
    assert normalize_device("/job:localhost/replica:0/task:0/device:CPU:1") == ("CPU", 1)
    assert normalize_device("/gpu:3") == ("GPU", 3)
    with pytest.raises(InputError):
        normalize_device("/device:GPU:x")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_exp": 31}, "need 0 <= min < max <= 30"),
        ({"min_exp": 5, "max_exp": 5}, "need 0 <= min < max"),
        ({"repeats": 0}, "repeats must be at least 1"),
        ({"weighting": "l1"}, "unknown weighting"),
    ],
)
def test_bad_arguments_fail_before_tensorflow(monkeypatch, kwargs, match):
    monkeypatch.setattr(comm, "_import_tensorflow", lambda: pytest.fail("imported TensorFlow"))
    with pytest.raises(InputError, match=match):
        measure_transfers(**kwargs)


def test_missing_tensorflow_is_exit_5(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorflow" else real(name, *a)
    )
    with pytest.raises(MissingDependencyError, match=r"pip install 'baechi\[tf\]'") as info:
        measure_transfers(max_exp=4)
    assert info.value.exit_code == 5


# --- the measurement (TensorFlow) --------------------------------------------------


@pytest.mark.tf
def test_the_cpu_consumer_really_copies_the_bytes():
    """The timed consumer leaves dst's own buffer holding src's bytes (no aliasing)."""
    tf = pytest.importorskip("tensorflow")
    graph = tf.Graph()
    with graph.as_default():
        size, setup, consumer = comm._build_graph(tf, "/device:CPU:0", "/device:CPU:1", "cpu-memcpy")
        dst_var = setup[1].inputs[0]
        with tf.device("/device:CPU:1"):
            dst_bytes = tf.raw_ops.ReadVariableOp(resource=dst_var, dtype=tf.uint8)
    with tf.compat.v1.Session(graph=graph, config=comm._session_config(tf, 2, True)) as session:
        session.run(setup, {size: 4096})
        assert session.run(dst_bytes).sum() == 0
        session.run(consumer)
        out = session.run(dst_bytes)
    assert out.shape == (1, 4096) and (out == 1).all()


@pytest.mark.tf
def test_measure_small_sweep():
    pytest.importorskip("tensorflow")
    calls = []
    started = time.perf_counter()
    # Up to 4 MiB: big enough that the bytes, not the timer's noise on a busy machine, set the fit.
    fit = measure_transfers(max_exp=22, repeats=3, progress=lambda done, total: calls.append((done, total)))
    assert time.perf_counter() - started < 20
    assert calls == [(i, 23) for i in range(1, 24)]
    assert [s.nbytes for s in fit.samples] == [2**e for e in range(23)]
    assert all(len(s.times_us) == comm.runs_for_size(s.nbytes, 3) for s in fit.samples)
    if fit.method == "cpu-memcpy":  # no GPU here
        assert (fit.src, fit.dst) == ("/device:CPU:0", "/device:CPU:1")
    assert fit.us_per_byte > 0  # the time grows with size: bytes were copied
    assert fit.latency_us >= 0
    assert fit.r2 > 0.5, fit.to_json()
    # 4 MiB costs more than 1 byte, and neither costs seconds.
    assert fit.samples[-1].median_us > fit.samples[0].median_us
    assert all(0 <= s.median_us < 1e5 for s in fit.samples)
    yaml.safe_load(interconnect_yaml(fit))


@pytest.mark.tf
def test_measure_rejects_devices_it_cannot_time():
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(InputError, match="two different devices"):
        measure_transfers("CPU:0", "/device:CPU:0", max_exp=2)
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(InputError, match="does not exist here"):
            measure_transfers("/device:GPU:0", "/device:CPU:0", max_exp=2)


@pytest.mark.tf
@pytest.mark.slow
def test_measure_full_default_sweep():
    pytest.importorskip("tensorflow")
    fit = measure_transfers()
    assert [s.nbytes for s in fit.samples] == SIZES
    assert 0.1 < fit.bandwidth_gb_per_s < 5000
    assert 0 <= fit.latency_us < 10_000
    # Loose: other processes on a shared CI machine can bend a few sizes' medians.
    assert fit.r2 > 0.5, fit.to_json()
    assert fit.wall_s < 60
