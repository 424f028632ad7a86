import pytest

from baechi_cli.core.devices import (
    PRESETS,
    Device,
    devices_from_yaml,
    dump_devices_yaml,
    parse_devices,
    parse_size,
)
from baechi_cli.core.errors import InputError


def test_counts_and_sizes():
    spec = parse_devices("2x16GB,2x8GiB")
    assert [d.memory_bytes for d in spec.devices] == [16 * 10**9] * 2 + [8 * 2**30] * 2
    assert spec.names == [f"/device:GPU:{i}" for i in range(4)]
    assert spec.interconnect.mode == "parallel"
    assert parse_devices("8GB").count == 1


def test_default_comm_model_is_baechis_pcie_fit():
    ic = parse_devices("2x8GB").interconnect
    # 0.0001754 us/byte + 134 us
    assert ic.transfer_time(10**6, 0, 1) == pytest.approx(134 + 175.4)
    assert ic.transfer_time(10**6, 1, 1) == 0.0


@pytest.mark.parametrize(
    "text, expected",
    [("8GB", 8 * 10**9), ("8GiB", 8 * 2**30), ("512MB", 512 * 10**6), ("1.5KiB", 1536), (1000, 1000)],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["4x8QB", "", "0x8GB", "4x", "x8GB", "-8GB", "4x0GB", "eight"])
def test_bad_specs_are_one_line_input_errors(bad):
    with pytest.raises(InputError) as info:
        parse_devices(bad)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_presets():
    for name, (spec, doc) in PRESETS.items():
        parsed = parse_devices(name)
        assert parsed.count == spec.count and doc
    assert parse_devices("rtx2080x4").interconnect.mode == "sequential"
    assert parse_devices("rtx2080x4").devices[0].memory_bytes == 8 * 2**30


def test_yaml_list(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(
        """
devices:
  - {name: /device:GPU:0, memory: 8GiB, flops: 13.4T, memory_bandwidth: 448GB/s}
  - {memory: 4GB}
interconnect:
  mode: sequential
  latency: 0.1ms
  bandwidth: 10GB/s
  links:
    - {a: /device:GPU:0, b: 1, latency: 5us, bandwidth: 100GB/s}
"""
    )
    spec = parse_devices(str(f))
    assert spec.devices[0].flops == 13.4e12
    assert spec.devices[0].memory_bandwidth == 448e9
    assert spec.devices[1].name == "/device:GPU:1"
    assert spec.interconnect.mode == "sequential"
    assert spec.interconnect.latency_us == 100.0
    assert spec.interconnect.bandwidth_bytes_per_us == 10e3
    assert spec.interconnect.transfer_time(10**6, 1, 0) == pytest.approx(5 + 10)
    assert not spec.homogeneous


def test_yaml_template(tmp_path):
    f = tmp_path / "d.yml"
    f.write_text("devices: {count: 3, memory: 2GB}\n")
    spec = parse_devices(str(f))
    assert spec.count == 3 and spec.homogeneous and spec.total_memory == 6 * 10**9


@pytest.mark.parametrize(
    "doc, fragment",
    [
        ("devices: [{memory: 8GB, flop: 1T}]", "unknown key 'flop'"),
        ("devices: []", "non-empty"),
        ("devices: [{name: a}]", "'memory' is required"),
        ("devices: [{memory: 8GB, name: a}, {memory: 8GB, name: a}]", "used twice"),
        ("devices: {count: 2, memory: 1GB}\ninterconnect: {mode: ring}", "parallel or sequential"),
        ("devices: [{memory: 8GB}]\ninterconnect: {links: [{a: 0, b: 7}]}", "not a device"),
        ("devices: [{memory: 8GB}\n", "not valid YAML"),
        ("- 1\n- 2\n", "must be a mapping"),
        # zero or negative rates, overheads and efficiencies
        ("devices: [{memory: 8GB, flops: 0}]", "devices[0].flops '0' must be positive"),
        ("devices: [{memory: 8GB, flops: -1T}]", "devices[0].flops '-1T' is not a rate"),
        ("devices: [{memory: 8GB, memory_bandwidth: 0GB/s}]", "devices[0].memory_bandwidth '0GB/s' must be"),
        (
            "devices: [{memory: 8GB, memory_bandwidth: -5}]",
            "devices[0].memory_bandwidth '-5' must be positive",
        ),
        (
            "devices: [{memory: 8GB, launch_overhead: 0us}]",
            "devices[0].launch_overhead '0us' must be positive",
        ),
        (
            "devices: [{memory: 8GB, launch_overhead: -2}]",
            "devices[0].launch_overhead '-2' must be a non-neg",
        ),
        (
            "devices: {count: 2, memory: 8GB, launch_overhead: 0}",
            "devices.launch_overhead '0' must be positive",
        ),
        (
            "devices: [{memory: 8GB, efficiency: {conv: 0}}]",
            "devices[0].efficiency.conv '0' must be positive",
        ),
        ("devices: [{memory: 8GB, efficiency: {gemm: -0.5}}]", "devices[0].efficiency.gemm '-0.5' must be"),
        ("devices: [{memory: 8GB, efficiency: {conv: .nan}}]", "devices[0].efficiency.conv 'nan' must be"),
        ("devices: [{memory: 8GB, efficiency: {conv: 60%}}]", "efficiency.conv '60%' is not a number"),
        ("devices: [{memory: 8GB, efficiency: {conv: true}}]", "efficiency.conv 'True' is not a number"),
        ("devices: [{memory: 8GB, efficiency: {lstm: 0.5}}]", "devices[0].efficiency: unknown key 'lstm'"),
        ("devices: [{memory: 8GB, efficiency: [0.5]}]", "devices[0].efficiency must be a mapping"),
        (
            "devices: [{memory: 8GB}]\ninterconnect: {bandwidth: 0GB/s}",
            "interconnect.bandwidth '0GB/s' must be",
        ),
    ],
)
def test_yaml_errors_name_file_and_key(tmp_path, doc, fragment):
    f = tmp_path / "bad.yaml"
    f.write_text(doc)
    with pytest.raises(InputError) as info:
        parse_devices(str(f))
    msg = str(info.value)
    assert msg.startswith(str(f)) and fragment in msg and "\n" not in msg


def test_missing_yaml_file():
    with pytest.raises(InputError, match="not found"):
        parse_devices("nope.yaml")


def test_comm_mode_override():
    assert parse_devices("2x8GB").with_comm_mode("sequential").interconnect.mode == "sequential"
    with pytest.raises(InputError):
        parse_devices("2x8GB").with_comm_mode("ring")


def test_yaml_efficiency(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("devices: {count: 2, memory: 8GB, flops: 10T, efficiency: {gemm: 0.8, conv: 1.25}}\n")
    spec = parse_devices(str(f))
    d = spec.devices[0]
    assert d.efficiency == (("conv", 1.25), ("gemm", 0.8)) and spec.homogeneous
    assert (d.flops_for("conv"), d.flops_for("gemm"), d.flops_for("")) == (12.5e12, 8e12, 10e12)
    # An efficiency table makes another device kind; an empty one is no table.
    assert d.kind != Device(d.name, d.memory_bytes, d.flops).kind
    f.write_text("devices: [{memory: 8GB, efficiency: }]\n")
    assert parse_devices(str(f)).devices[0] == Device("/device:GPU:0", 8 * 10**9)


def test_dump_reads_back_as_the_same_spec():
    specs = [parse_devices(name) for name in (*PRESETS, "2x16GB,2x8GiB")]
    yaml_text = """
devices:
  - {name: a, memory: 8GiB, flops: 13.4T, memory_bandwidth: 448GB/s, launch_overhead: 3.5us,
     efficiency: {conv: 0.61}}
  - {name: b, memory: 4GB, flops: 123456789, memory_bandwidth: 1.5KB/s}
interconnect:
  mode: sequential
  latency: 0
  bandwidth: 10GB/s
  links: [{a: a, b: 1, latency: 5us, bandwidth: 100GB/s}]
"""
    specs.append(devices_from_yaml(yaml_text, "d.yaml"))
    for spec in specs:
        text = dump_devices_yaml(spec, ["a comment", ""])
        again = devices_from_yaml(text, "again.yaml")
        assert text.startswith("# a comment\n#\n")
        assert again.devices == spec.devices
        assert again.interconnect.mode == spec.interconnect.mode
        for pair in [(0, 1), (1, 0), (0, 0)]:
            assert again.interconnect.transfer_time(12345, *pair) == pytest.approx(
                spec.interconnect.transfer_time(12345, *pair), rel=1e-12
            )
        assert dump_devices_yaml(again) == dump_devices_yaml(spec)
