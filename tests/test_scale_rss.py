"""Heavy case (marker `slow`): a 200k-op workload through `baechi place`, within its share of 8 GB.

The scale target (bench/scale.md) is a 1M-op graph placed by m-TOPO and m-ETF
within 8 GB peak RSS. This places a fifth of that in a child process and
holds it to a fifth of the memory, measured as the child's own peak
resident set: ``VmHWM`` of ``/proc/self/status``, read by the child as it
exits. (Not ``ru_maxrss``: Linux carries the parent's peak over into the
child's at exec, so from a big pytest worker it reports the worker's size.)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from benchmodules import bench_module

write_workload_json = bench_module("synthetic").write_workload_json

pytestmark = pytest.mark.slow

OPS = 200_000
RSS_LIMIT_BYTES = 8 * 10**9 * OPS // 1_000_000  # 1.6 GB: the 1M-op target, pro rata


@pytest.mark.parametrize("devices", ["4x2TB", f"4x{200_000 * OPS}"])  # memory ample, and counted
def test_200k_ops_place_with_topo_within_a_fifth_of_8_gb(tmp_path, devices):
    path, report = tmp_path / "layered.json", tmp_path / "report.json"
    write_workload_json(str(path), OPS)
    peak_file = tmp_path / "vmhwm"
    code = (
        "import atexit, pathlib\n"
        "def peak():\n"
        "    status = pathlib.Path('/proc/self/status').read_text()\n"
        "    kib = next(line.split()[1] for line in status.splitlines() if line.startswith('VmHWM:'))\n"
        f"    pathlib.Path({str(peak_file)!r}).write_text(kib)\n"
        "atexit.register(peak)\n"
        "from baechi_cli.cli.commands import main; main()"
    )
    argv = [sys.executable, "-c", code, "place", str(path), "--devices", devices, "--algo", "topo"]
    proc = subprocess.run([*argv, "--report", str(report), "-q"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    peak = int(peak_file.read_text()) * 1024  # KiB
    assert peak <= RSS_LIMIT_BYTES, f"peak RSS {peak / 1e9:.2f} GB over {RSS_LIMIT_BYTES / 1e9:.2f} GB"
    doc = json.loads(report.read_text())
    assert doc["input"]["ops"] == OPS and len(doc["placement"]) == OPS
    assert doc["result"]["feasible"] and math.isfinite(doc["result"]["step_time_us"])
