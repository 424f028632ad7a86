"""End to end: place the committed CNN with the CLI, then train it in TensorFlow as placed.

TensorFlow runs in a subprocess with as many logical CPU devices as the spec
has GPUs (GPU:i mapped to CPU:i); the check re-applies the devices after
import, uses strict placement and compares the step stats with the request.
"""

import os

import pytest
from click.testing import CliRunner

from baechi_cli.cli.commands import main

pytest.importorskip("tensorflow")

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata")


@pytest.mark.parametrize("name, algo", [("cnn", "topo"), ("cnn", "etf"), ("mlp", "sct")])
@pytest.mark.parametrize("num_devices", [2, 4])
def test_placed_graph_trains_as_placed(tmp_path, name, algo, num_devices):
    from baechi_cli.verify.run import verify_placed_graph

    placed = tmp_path / "placed.pb"
    r = CliRunner().invoke(
        main,
        [
            "place",
            os.path.join(TESTDATA, f"{name}.pb"),
            "--devices",
            f"{num_devices}x8GB",
            "--algo",
            algo,
            "-o",
            str(placed),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    result = verify_placed_graph(str(placed), os.path.join(TESTDATA, f"{name}.json"), num_devices)
    assert result.error is None
    assert result.misplaced == []
    assert result.losses_equal, (result.loss_placed, result.loss_reference)
    assert len([d for d, n in result.devices_used.items() if n > 0]) > 1
    assert result.ok


def test_verify_command_reports_a_silent_re_placement(tmp_path):
    # Move one ReadVariableOp away from its variable: TensorFlow silently runs
    # it on the variable's device, and `baechi verify` must say so (exit 1).
    from baechi_cli.proto_gen import tf_graph_pb2 as pb

    g = pb.GraphDef()
    g.ParseFromString(open(os.path.join(TESTDATA, "cnn.pb"), "rb").read())
    moved = None
    for node in g.node:
        node.device = "/device:GPU:0"
    for node in g.node:
        if node.op == "ReadVariableOp" and "Conv2D" in node.name and moved is None:
            node.device, moved = "/device:GPU:1", node.name
    placed = tmp_path / "bad.pb"
    placed.write_bytes(g.SerializeToString())
    r = CliRunner().invoke(main, ["verify", str(placed), os.path.join(TESTDATA, "cnn.json"), "-d", "2"])
    assert r.exit_code == 1, r.output
    assert moved in r.output
