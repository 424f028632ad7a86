"""m-SCT in a process that imported TensorFlow before OR-Tools (HiGHS would crash there)."""

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="needs TensorFlow")

SCRIPT = """
import tensorflow  # first, on purpose
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import SolverError
from baechi_cli.io.workload_json import read_workload_json
from baechi_cli.placers.sct_lp import solve_favorite_lp
g = read_workload_json("testdata/workloads/throughput_LayerGraphs_gnmt_training.json")
r = solve_favorite_lp(g, parse_devices("4x16GB"))
print("default", r.backend, r.status)
try:
    solve_favorite_lp(g, parse_devices("4x16GB"), backend="highs")
except SolverError as err:
    print("highs refused:", err)
"""


def test_falls_back_to_glop_instead_of_crashing():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "default glop OPTIMAL" in out.stdout
    assert "highs refused: LP backend 'highs' crashes" in out.stdout
