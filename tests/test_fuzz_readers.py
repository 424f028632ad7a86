"""The fuzz harness's CI tier: a few thousand fixed mutated inputs through every reader and the CLI.

Each reader (tests/fuzz/targets.py) gets its own number of cases, sized so
that every test takes a few seconds; the cases are those ``make fuzz
--seed 1`` starts with, so a failure here is replayed with ``PYTHONPATH=tests
python -m fuzz --seed 1 --targets TARGET --replay INDEX``. The oracle
(tests/fuzz/oracle.py): the reader returns a well-formed result or raises a
one-line BaechiError naming the input, within 5 s and 2 GiB more address
space. Below, the oracle itself is checked on readers that misbehave.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fuzz.cli_slice import check_cli, make_cli_case
from fuzz.mutators import dump_json, mutate_bytes, mutate_document
from fuzz.oracle import Target, check, check_case, make_case, memory_limit
from fuzz.targets import TARGETS

from baechi_cli.core.errors import InputError
from baechi_cli.core.graph import GraphBuilder

CI_SEED = 1
# Cases per reader: each test a few seconds on one core of a 2-core machine.
CI_CASES = {
    "graphdef": 500,
    "pbtxt": 120,
    "onnx": 300,
    "workload": 150,
    "sidecar": 600,
    "devices": 200,
    "devspec": 800,
    "profile": 120,
}
CI_CLI_CASES = 80


# Readers that may call TensorFlow's shape inference: import it before the timed cases.
NEEDS_TENSORFLOW = ("graphdef", "pbtxt")


@pytest.fixture(scope="module")
def tensorflow_imported() -> None:
    pytest.importorskip("tensorflow")


def test_every_reader_is_fuzzed():
    assert set(CI_CASES) == set(TARGETS)


@pytest.mark.parametrize("target", sorted(CI_CASES))
def test_reader_survives_mutated_inputs(target, tmp_path, request):
    if target in NEEDS_TENSORFLOW:
        request.getfixturevalue("tensorflow_imported")
    failures = []
    with memory_limit():
        for index in range(CI_CASES[target]):
            verdict = check_case(make_case(target, CI_SEED, index), tmp_path)
            if verdict.failure is not None:
                failures.append(f"#{index}: {verdict.failure}")
    assert not failures, f"{len(failures)} of {CI_CASES[target]} {target} cases failed:\n" + "\n".join(
        failures[:20]
    )


def test_cli_survives_mutated_inputs(tmp_path, tensorflow_imported):
    failures = []
    with memory_limit():
        for index in range(CI_CLI_CASES):
            failure = check_cli(make_cli_case(CI_SEED, index), tmp_path)
            if failure is not None:
                failures.append(f"#{index}: {failure}")
    assert not failures, "\n".join(failures[:20])


def test_cases_are_reproducible():
    for target in TARGETS:
        assert make_case(target, 3, 17) == make_case(target, 3, 17)
    assert make_case("onnx", 3, 17).data != make_case("onnx", 4, 17).data


def test_mutations_stay_deterministic_and_reach_deep_nesting():
    import random

    assert mutate_bytes(random.Random(5), b"0123456789") == mutate_bytes(random.Random(5), b"0123456789")
    deep = dump_json({"a": "\x00deep:5000"}, random.Random(0))
    assert deep.count(b"[") == 5000 and b'"a": [[[' in deep
    doc = {"nodes": [{"id": 1}], "edges": []}
    assert mutate_document(random.Random(2), doc) is not None


# --- the oracle on readers that misbehave ---------------------------------------------


def _target(read) -> Target:
    return Target("fake", "fake.bin", lambda: [], lambda rng, seed: b"", lambda path, options: read(path))


def _graph(nbytes: int):
    b = GraphBuilder()
    b.add_op("x", "Placeholder", [nbytes])
    return b.build()


def _hang(path: str) -> None:
    time.sleep(10)


def _clean_error(path: str) -> None:
    raise InputError("bad header", path=path)


def _multi_line_error(path: str) -> None:
    raise InputError("bad op", path=f"{path}\nsecond line")  # the problem and op are squashed; a path is not


def _anonymous_error(path: str) -> None:
    raise InputError("bad header")


def _long_error(path: str) -> None:
    raise InputError("x" * 5000, path=path)


def _key_error(path: str) -> None:
    raise KeyError("x")


def _recursion(path: str) -> None:
    raise RecursionError


@pytest.mark.parametrize(
    "read, failure",
    [
        (lambda path: _graph(8), None),
        (_clean_error, None),
        (_key_error, "KeyError at"),
        (_recursion, "RecursionError at"),
        (_multi_line_error, "multi-line error"),
        (_anonymous_error, "error not naming the input"),
        (_long_error, "error of 5"),
        (lambda path: _graph(-8), "output bytes [-8]"),
        (_hang, "hang: the reader ran past 0.2 s"),
        (lambda path: bytearray(1 << 34), "MemoryError"),
    ],
    ids=[
        "graph",
        "clean-error",
        "keyerror",
        "recursion",
        "multi-line",
        "anonymous",
        "long",
        "negative",
        "hang",
        "memory",
    ],
)
def test_the_oracle_flags_what_a_reader_must_not_do(tmp_path: Path, read, failure):
    with memory_limit(1 << 30):
        verdict = check(_target(read), str(tmp_path / "fake.bin"), {}, time_limit_s=0.2)
    if failure is None:
        assert verdict.failure is None and verdict.accepted == (read not in (_clean_error,))
    else:
        assert verdict.failure is not None and failure in verdict.failure
