"""The placer registry, and docs/ADDING_A_PLACER.md's example placer run end to end.

The example's two code blocks are taken from the document itself, so the
document cannot drift from what works: a subprocess loads the module block
as ``baechi_cli.placers.least_loaded``, runs the registry-entry block in
``baechi_cli.placers`` and then the real CLI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from baechi_cli import placers
from baechi_cli.app.place import PlaceOptions, place_model
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InputError
from baechi_cli.evaluator.evaluate import evaluate
from baechi_cli.placers import sct_lp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "ADDING_A_PLACER.md")
CNN = os.path.join(ROOT, "testdata", "cnn.pb")
GNMT = os.path.join(ROOT, "testdata", "workloads", "throughput_LayerGraphs_gnmt_training.json")

RUNNER = """
import importlib.util, sys
import baechi_cli.placers as placers
spec = importlib.util.spec_from_file_location("baechi_cli.placers.least_loaded", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
exec(open(sys.argv[2]).read(), vars(placers))
from baechi_cli.cli.commands import main
main(sys.argv[3:], prog_name="baechi")
"""


def doc_block(marker: str) -> str:
    """The fenced python block right after ``<!-- marker -->`` in the document."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    found = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", text, re.S)
    assert found, f"{marker} block missing from {DOC}"
    return found.group(1)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """Run the CLI with the document's example placer registered."""
    tmp = tmp_path_factory.mktemp("example")
    module, entry, runner = tmp / "least_loaded.py", tmp / "entry.py", tmp / "runner.py"
    module.write_text(doc_block("example-placer-module"))
    entry.write_text(doc_block("example-placer-entry"))
    runner.write_text(RUNNER)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(runner), str(module), str(entry), *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )

    return run


def test_the_example_placer_is_about_twenty_lines():
    code = [line for line in doc_block("example-placer-module").splitlines() if line.strip()]
    assert len(code) <= 25


def test_example_placer_places_and_is_judged_by_the_evaluator(example, tmp_path):
    report = tmp_path / "r.json"
    r = example(
        "place", CNN, "--devices", "4x8GB", "--algo", "least", "--no-coplace", "--report", str(report)
    )
    assert r.returncode == 0, r.stderr
    assert "least-loaded: step" in r.stdout  # the registered title in the summary
    doc = json.loads(report.read_text())
    assert doc["algorithm"] == "least"
    assert doc["result"]["feasible"]
    used = {device for device in doc["placement"].values()}
    assert len(used) == 4  # least-loaded spreads groups over every device
    assert [c["algorithm"] for c in doc["candidates"]] == ["least"]


def test_example_placer_in_compare_and_auto(example, tmp_path):
    r = example("compare", GNMT, "--devices", "4x16GB", "--algos", "least,etf", "--json")
    assert r.returncode == 0, r.stderr
    results = {x["algorithm"]: x for x in json.loads(r.stdout)["results"]}
    assert set(results) == {"least", "etf"} and results["least"]["step_time_us"] > 0

    report = tmp_path / "auto.json"
    r = example("place", GNMT, "--devices", "4x16GB", "--report", str(report), "-q")
    assert r.returncode == 0, r.stderr
    candidates = json.loads(report.read_text())["candidates"]
    # First every placer under the options given, by auto_priority; then under other settings.
    assert [c["algorithm"] for c in candidates[:5]] == ["single", "etf", "sct", "topo", "least"]
    assert all(c["options"] is None for c in candidates[:1]) and "least" in {
        c["algorithm"] for c in candidates[5:] if c["options"] is not None
    }


def test_example_placer_is_refused_by_name_when_not_registered(example):
    r = subprocess.run(
        [sys.executable, "-m", "baechi_cli", "place", CNN, "--devices", "2x8GB", "--algo", "least"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "least" in r.stderr


def test_registry_contract():
    assert placers.names() == ("topo", "etf", "sct", "single", "exact", "pipeline")
    assert placers.get("sct").options is placers.SCTOptions
    with pytest.raises(InputError, match="unknown algorithm 'nope'"):
        placers.get("nope")
    assert placers.title("nope") == "nope"  # never a KeyError in a summary
    with pytest.raises(ValueError, match="already registered"):
        placers.register(placers.PlacerSpec("etf", "other", "", "baechi_cli.placers.etf"))
    with pytest.raises(ValueError, match="already registered"):
        placers.register(placers.PlacerSpec("auto", "auto", "", "baechi_cli.placers.etf"))
    sct = placers.get("sct")
    assert sct.make_options({"solver_time_limit": 5.0, "unrelated": 1}) == placers.SCTOptions(5.0)
    assert placers.SCTOptions().sct_threshold == sct_lp.DEFAULT_THRESHOLD


def test_every_candidate_is_judged_by_the_evaluator():
    """auto ranks candidates by evaluate()'s judgement of their expanded placements, in both comm modes."""
    for comm in ("parallel", "sequential"):
        outcome = place_model(GNMT, parse_devices("4x16GB"), PlaceOptions(comm=comm, forward_only=False))
        prepared = outcome.prepared
        judged = [c for c in outcome.candidates if c.ok]
        assert {c.algorithm for c in judged} >= {"single", "topo", "etf", "sct"}
        for c in judged:
            fresh = evaluate(prepared.graph, prepared.devices, c.placement)
            assert fresh.value_us == c.evaluation.value_us
            assert fresh.timeline.peak_bytes == c.sim.peak_bytes
        assert outcome.chosen.evaluation.value_us == min(c.evaluation.value_us for c in judged)
