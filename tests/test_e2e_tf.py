"""End to end: place the committed CNN with the CLI, then train it in TensorFlow as placed.

TensorFlow runs in a subprocess with as many logical CPU devices as the spec
has GPUs (GPU:i mapped to CPU:i); the check re-applies the devices after
import, uses strict placement and compares the step stats with the request.
"""

import os

import pytest
from click.testing import CliRunner

from baechi_cli.cli import main

pytest.importorskip("tensorflow")

TESTDATA = os.path.join(os.path.dirname(__file__), "..", "testdata")


@pytest.mark.parametrize("name, algo", [("cnn", "topo"), ("cnn", "etf"), ("mlp", "sct")])
@pytest.mark.parametrize("num_devices", [2, 4])
def test_placed_graph_trains_as_placed(tmp_path, name, algo, num_devices):
    from baechi_cli.verify import verify_placed_graph

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
