"""Replay the fuzz regression corpus: every input that ever made a reader fail now gets a clean outcome.

``tests/fuzz_corpus/<target>/`` holds, per reader of tests/fuzz/targets.py,
the minimised inputs the fuzzer (or a review of its findings) caught: each
made that reader crash, hang, allocate without bound, return a malformed
graph or print an unusable error before its fix. ``NAME.options``, when
present, holds the reader options as JSON (a profile's model, relative to
the repository). The oracle is the fuzzer's (tests/fuzz/oracle.py).
:data:`CLI_REGRESSIONS` are the command lines the CLI slice
(tests/fuzz/cli_slice.py) caught exiting 70, an internal error.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from fuzz.oracle import check, memory_limit
from fuzz.targets import TARGETS

from baechi_cli.cli.commands import main

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
ENTRIES = sorted(p for p in CORPUS.glob("*/*") if p.suffix != ".options")


# Generous: these check the outcome, not the speed (a hang still fails), and may import TensorFlow.
TIME_LIMIT_S = 30.0


def test_the_corpus_covers_known_targets_only():
    assert ENTRIES and {p.parent.name for p in ENTRIES} <= set(TARGETS)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corpus_entry_reads_cleanly(entry: Path, tmp_path: Path) -> None:
    target = TARGETS[entry.parent.name]
    options_file = entry.with_name(entry.name + ".options")
    options = json.loads(options_file.read_text()) if options_file.exists() else {}
    if "model" in options:
        options["model"] = str(REPO / options["model"])
    path = tmp_path / target.filename  # the name the reader is fuzzed under: the format follows it
    shutil.copy(entry, path)
    with memory_limit():
        verdict = check(target, str(path), options, TIME_LIMIT_S)
    assert verdict.failure is None, verdict.failure


# name -> (command line, output files it must not leave behind); paths relative to the repository.
CLI_REGRESSIONS = {
    # A batch size beyond int32 read fine, then failed writing the profile's int32 field.
    "profile-batch-size-beyond-int32": (
        ["profile", "testdata/mlp.pb", "-q", "--batch-size", "1099511627776", "-o", "{tmp}/costs.json"],
        ["costs.json"],
    ),
}


@pytest.mark.parametrize("name", sorted(CLI_REGRESSIONS))
def test_cli_regression_is_a_one_line_input_error(name, tmp_path, monkeypatch):
    args, outputs = CLI_REGRESSIONS[name]
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(main, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert not any((tmp_path / output).exists() for output in outputs)
