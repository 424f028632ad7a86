"""The CLI through click's runner: happy path, --json, and every kind of bad input."""

import json
import os

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main
from baechi_cli.proto_gen import tf_graph_pb2 as pb

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata")
CNN = os.path.join(TESTDATA, "cnn.pb")
MLP_TXT = os.path.join(TESTDATA, "mlp.pbtxt")


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_version_and_help():
    r = run("--version")
    assert r.exit_code == 0 and r.output.startswith("baechi ")
    r = run("place", "--help")
    assert r.exit_code == 0 and "--devices" in r.output and "--batch-size" in r.output


def test_place_writes_placed_graph_and_report(tmp_path):
    out, rep = tmp_path / "placed.pb", tmp_path / "report.json"
    r = run("place", CNN, "--devices", "4x8GB", "-o", str(out), "--report", str(rep))
    assert r.exit_code == 0, r.output
    assert "step" in r.stdout and "/device:GPU:3" in r.stdout and "wrote" in r.stdout
    report = json.loads(rep.read_text())
    assert report["schema"] == "baechi.report/v1"
    assert report["input"]["format"] == "graphdef" and report["input"]["ops"] > 100
    assert report["result"]["feasible"] is True
    assert report["result"]["step_time_us"] >= report["result"]["lower_bound_us"] > 0
    assert len(report["per_device"]) == 4
    assert set(report["placement"].values()) <= {f"/device:GPU:{i}" for i in range(4)}
    graph = pb.GraphDef()
    graph.ParseFromString(out.read_bytes())
    assert all(n.device == report["placement"][n.name] for n in graph.node)


def test_json_prints_only_the_report_on_stdout(tmp_path):
    r = run("place", CNN, "--devices", "2x8GB", "--json")
    assert r.exit_code == 0
    report = json.loads(r.stdout)
    assert report["options"]["algo"] == "auto" and report["options"]["comm"] == "parallel"
    tried = report["candidates"]
    assert {c["algorithm"] for c in tried} >= {"single", "topo", "etf", "sct"}
    best = min((c for c in tried if c["feasible"]), key=lambda c: c["step_time_us"])
    assert [c for c in tried if c["chosen"]] == [best]
    assert report["algorithm"] == best["algorithm"]
    assert report["result"]["lower_bound_us"] == report["bounds"]["best_us"] > 0
    assert best["gap"] == report["result"]["step_time_us"] / report["bounds"]["best_us"] - 1
    assert report["result"]["step_time_us"] == best["step_time_us"] <= report["result"]["single_device_us"]


def without_timings(doc):
    """The report minus what may differ between runs: timings_s and every key ending in "seconds"."""
    if isinstance(doc, dict):
        return {
            k: without_timings(v) for k, v in doc.items() if not k.endswith("seconds") and k != "timings_s"
        }
    if isinstance(doc, list):
        return [without_timings(v) for v in doc]
    return doc


def test_same_input_same_output(tmp_path):
    reports = []
    for i in range(2):
        out, rep = tmp_path / f"p{i}.pb", tmp_path / f"r{i}.json"
        assert run("place", CNN, "--devices", "3x8GB", "-o", str(out), "--report", str(rep)).exit_code == 0
        reports.append(without_timings(json.loads(rep.read_text())))
    assert reports[0] == reports[1]
    assert (tmp_path / "p0.pb").read_bytes() == (tmp_path / "p1.pb").read_bytes()


def test_text_graphdef_and_sequential_comm(tmp_path):
    out = tmp_path / "placed.pbtxt"
    r = run("place", MLP_TXT, "--devices", "2x8GB", "--comm", "sequential", "-o", str(out), "-q")
    assert r.exit_code == 0 and r.output == ""
    assert 'device: "/device:GPU:' in out.read_text()


def test_single_device_note_explains_idle_devices():
    r = run("place", CNN, "--devices", "2x8GB", "--algo", "single")
    assert r.exit_code == 0
    assert "/device:GPU:1 runs no ops" in r.stdout


# --- bad input: one line, distinct exit code, no traceback, nothing written ---


def node(name, op, inputs=(), dtype=pb.DT_FLOAT, shape=(4,)):
    n = pb.NodeDef(name=name, op=op, input=list(inputs))
    n.attr["T" if op not in ("Placeholder", "Const") else "dtype"].type = dtype
    s = n.attr["_output_shapes"].list.shape.add()
    for d in shape:
        s.dim.add(size=d)
    return n


def graph_file(tmp_path, nodes, name="bad.pb"):
    g = pb.GraphDef(node=nodes)
    path = tmp_path / name
    path.write_bytes(g.SerializeToString())
    return str(path)


BAD_INPUTS = {
    "missing file": (lambda t: str(t / "nope.pb"), "no such file"),
    "not a graphdef": (lambda t: _write(t, b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4), ""),
    "truncated": (lambda t: _write(t, open(CNN, "rb").read()[: os.path.getsize(CNN) // 2]), ""),
    "empty graph": (lambda t: _write(t, b""), "empty"),
    "missing input": (
        lambda t: graph_file(t, [node("a", "Placeholder"), node("b", "Relu", ["ghost"])]),
        "ghost",
    ),
    "duplicate names": (
        lambda t: graph_file(t, [node("a", "Placeholder"), node("a", "Relu")]),
        "a",
    ),
    "cycle": (
        lambda t: graph_file(
            t, [node("x", "Placeholder"), node("p", "AddV2", ["x", "q"]), node("q", "Relu", ["p"])]
        ),
        "cycle",
    ),
    "unknown dtype": (
        lambda t: graph_file(t, [node("a", "Placeholder", dtype=999), node("b", "Relu", ["a"])]),
        "dtype",
    ),
}


def _write(tmp_path, data):
    path = tmp_path / "bad.pb"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input(tmp_path, case):
    make, fragment = BAD_INPUTS[case]
    path = make(tmp_path)
    out, rep = tmp_path / "placed.pb", tmp_path / "report.json"
    r = CliRunner().invoke(main, ["place", path, "--devices", "2x8GB", "-o", str(out), "--report", str(rep)])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and path in lines[0], r.stderr
    assert fragment in lines[0]
    assert "Traceback" not in r.stderr
    assert not out.exists() and not rep.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".baechi-")]  # no temp files left


def test_devices_too_small_exits_3(tmp_path):
    out = tmp_path / "placed.pb"
    r = CliRunner().invoke(main, ["place", CNN, "--devices", "4x100KB", "-o", str(out)])
    assert r.exit_code == 3
    line = r.stderr.strip()
    assert "\n" not in line and "needs at least" in line and "devices give" in line
    assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "args, code",
    [
        (["--devices", "4x8QB"], 2),
        (["--devices", "4x8GB", "--algo", "magic"], 2),
        (["--devices", "4x8GB", "--comm", "ring"], 2),
        (["--devices", "4x8GB", "--batch-size", "0"], 2),
        ([], 2),
    ],
)
def test_usage_errors(args, code):
    r = CliRunner().invoke(main, ["place", CNN, *args])
    assert r.exit_code == code
    assert "Traceback" not in r.output


def test_output_directory_missing(tmp_path):
    r = CliRunner().invoke(main, ["place", CNN, "--devices", "2x8GB", "-o", str(tmp_path / "no" / "p.pb")])
    assert r.exit_code == 2 and "output directory does not exist" in r.stderr
