"""The sidecar JSON (baechi_cli.io.sidecar): one validator for verify --run and the profiler, and ranges.

Float inputs take a float range [low, high), integer inputs an integer one
within their dtype, other dtypes none; both feed builders (verify's
``_make_feeds`` and the profiler's ``synthetic_feeds``) draw ranged inputs
with ``range_values``, so every value lands in [low, high).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from baechi_cli.core.errors import InputError
from baechi_cli.costs.measured import FeedSpec, _read_sidecar, synthetic_feeds
from baechi_cli.io.sidecar import RUN_KEYS, load_sidecar, range_values, validate_sidecar
from baechi_cli.verify.run import _make_feeds

TESTDATA = Path(__file__).resolve().parent.parent / "testdata"
HAVE_TF = importlib.util.find_spec("tensorflow") is not None
tf_test = pytest.mark.skipif(not HAVE_TF, reason="needs TensorFlow")

RUN = {"loss": "loss:0", "train_op": "train", "init_op": "init"}


def _sidecar(tmp_path: Path, *inputs: dict[str, Any], **keys: Any) -> str:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"inputs": list(inputs), **RUN, **keys}))
    return str(path)


def _error(path: str, **kwargs: Any) -> InputError:
    with pytest.raises(InputError) as info:
        load_sidecar(path, **kwargs)
    err = info.value
    assert err.path == path and err.exit_code == 2 and "\n" not in str(err)
    return err


@pytest.mark.parametrize("name", sorted(p.name for p in TESTDATA.glob("*.json")))
def test_the_committed_sidecars_are_valid(name):
    data = load_sidecar(str(TESTDATA / name))
    assert data["inputs"] and all(k in data for k in RUN_KEYS)


def test_a_float_input_takes_a_float_range(tmp_path):
    path = _sidecar(tmp_path, {"name": "x:0", "dtype": "float32", "shape": [4], "range": [-1.0, 1.0]})
    assert load_sidecar(path)["inputs"][0]["range"] == [-1.0, 1.0]
    # Integers are numbers too, and a float16 input's range may exceed float16's values.
    validate_sidecar(
        {"inputs": [{"name": "x", "dtype": "float64", "shape": [], "range": [0, 10]}]}, "s", required=()
    )
    validate_sidecar(
        {"inputs": [{"name": "x", "dtype": "float16", "shape": [1], "range": [-1e6, 1e6]}]}, "s", required=()
    )


@pytest.mark.parametrize(
    "value_range",
    [
        [1.0, 1.0],
        [2.0, -1.0],
        [math.nan, 1.0],
        [0.0, math.inf],
        [-1e308, 1e308],
        ["0", "1"],
        [0.0],
        [0, 1, 2],
        {"low": 0},
        [True, 2.0],
        [0, 10**400],
    ],
    ids=[
        "empty",
        "reversed",
        "nan",
        "inf",
        "width-overflows",
        "strings",
        "one",
        "three",
        "object",
        "bool",
        "huge-int",
    ],
)
def test_a_bad_float_range_is_refused(tmp_path, value_range):
    path = _sidecar(tmp_path, {"name": "x:0", "dtype": "float32", "shape": [4], "range": value_range})
    err = _error(path)
    assert "sidecar input 'x:0': range must be [low, high) of finite numbers" in str(err)


@pytest.mark.parametrize(
    "dtype, value_range, ok",
    [
        ("int64", [0, 10], True),
        ("uint8", [0, 256], True),
        ("uint8", [0, 257], False),
        ("int8", [-129, 0], False),
        ("int64", [0.0, 10.0], False),
        ("int32", [5, 5], False),
        ("uint64", [0, 2**63], True),  # drawn as int64
        ("uint64", [0, 2**63 + 1], False),
    ],
)
def test_an_integer_input_needs_an_integer_range_within_its_dtype(tmp_path, dtype, value_range, ok):
    path = _sidecar(tmp_path, {"name": "i:0", "dtype": dtype, "shape": [3], "range": value_range})
    if ok:
        load_sidecar(path)
    else:
        assert "range must be [low, high) integers" in str(_error(path))


@pytest.mark.parametrize("dtype", ["bool", "complex64", "string"])
def test_other_dtypes_take_no_range(tmp_path, dtype):
    path = _sidecar(tmp_path, {"name": "m:0", "dtype": dtype, "shape": [2], "range": [0, 1]})
    assert f"sidecar input 'm:0': a {dtype} input takes no range" in str(_error(path))


@pytest.mark.parametrize(
    "sidecar, message",
    [
        ("[]", "must be a JSON object"),
        ("{", "not a readable JSON sidecar: Expecting property name"),
        ("[" * 100_000, "not a readable JSON sidecar"),
        (b"\xff\xfe{", "not a readable JSON sidecar"),
        ({"inputs": []}, "lacks 'loss'"),
        ({**RUN, "inputs": {}}, "'inputs' must be a list"),
        (
            {**RUN, "inputs": [{"name": "x:0"}]},
            'input #0 ({"name": "x:0"}) needs a name, a dtype and a shape',
        ),
        ({**RUN, "inputs": [{"name": "", "dtype": "float32", "shape": []}]}, "needs a name"),
        ({**RUN, "inputs": [{"name": "x", "dtype": "float32", "shape": [1.5]}]}, "needs a name"),
        ({**RUN, "inputs": [{"name": "x", "dtype": "float", "shape": [1]}]}, 'dtype "float" is not one of'),
        ({**RUN, "inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}]}, "dims are 0 or more"),
        (
            {**RUN, "inputs": [{"name": "x", "dtype": "float32", "shape": [2**40, 2**40]}]},
            "more than 2**63 bytes",
        ),
        ({**RUN, "inputs": [{"name": "x", "dtype": "float32", "shape": [1]}] * 2}, "'x' is listed twice"),
        ({**RUN, "inputs": [], "loss": 3}, "'loss' must be a node or tensor name"),
        ({**RUN, "inputs": [], "init_op": ""}, "'init_op' must be a node or tensor name"),
        (
            {**RUN, "inputs": [], "seed": 2**32},
            "'seed' must be an integer of at least 0 and below 4294967296",
        ),
        ({**RUN, "inputs": [], "seed": "7"}, "'seed' must be an integer"),
        ({**RUN, "inputs": [], "batch_size": 0}, "'batch_size' must be an integer of at least 1"),
    ],
    ids=lambda v: None if isinstance(v, str) else "",
)
def test_bad_sidecars_are_one_line_errors_naming_the_file(tmp_path, sidecar, message):
    path = tmp_path / "s.json"
    if isinstance(sidecar, bytes):
        path.write_bytes(sidecar)
    else:
        path.write_text(sidecar if isinstance(sidecar, str) else json.dumps(sidecar))
    assert message in str(_error(str(path)))


def test_missing_and_directory_sidecars(tmp_path):
    assert "no such file" in str(_error(str(tmp_path / "absent.json")))
    assert "is a directory" in str(_error(str(tmp_path)))


def test_what_the_profiler_allows_and_requires(tmp_path):
    # The profiler needs no key and takes -1 dims (the batch size fills them); still not -2.
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 3]}]}))
    load_sidecar(str(path), required=(), unknown_dims=True)
    _error(str(path))  # verify --run's requirements
    path.write_text(json.dumps({"inputs": [{"name": "x", "dtype": "float32", "shape": [-2, 3]}]}))
    assert "dims are -1 (unknown) or more" in str(_error(str(path), required=(), unknown_dims=True))


def test_the_profiler_reads_the_sidecar_beside_the_model_with_the_same_validator(tmp_path):
    model = tmp_path / "m.pb"
    model.write_bytes(b"")
    assert _read_sidecar(str(model)) == (None, None)
    (tmp_path / "m.json").write_text(
        json.dumps({"inputs": [{"name": "x:0", "dtype": "float32", "shape": [2], "range": [0.5, 0.75]}]})
    )
    where, data = _read_sidecar(str(model))
    assert where == str(tmp_path / "m.json") and data["inputs"][0]["range"] == [0.5, 0.75]
    (tmp_path / "m.json").write_text(
        json.dumps({"inputs": [{"name": "b:0", "dtype": "bool", "shape": [2], "range": [0, 1]}]})
    )
    with pytest.raises(InputError) as info:
        _read_sidecar(str(model))
    assert info.value.path == where and "a bool input takes no range" in str(info.value)


# --- feeds --------------------------------------------------------------------------


def test_verify_feeds_honour_float_and_integer_ranges():
    sidecar = {
        "inputs": [
            {"name": "x:0", "dtype": "float32", "shape": [64, 64], "range": [-0.25, 0.5]},
            {"name": "h:0", "dtype": "float16", "shape": [4096], "range": [0, 1]},
            {"name": "labels:0", "dtype": "int64", "shape": [256], "range": [3, 7]},
            {"name": "z:0", "dtype": "float32", "shape": [512]},
        ],
        "seed": 11,
    }
    first, second = _make_feeds(sidecar, 2)
    for batch in (first, second):
        x, h, labels, z = (batch[k] for k in ("x:0", "h:0", "labels:0", "z:0"))
        assert x.dtype == np.float32 and x.min() >= -0.25 and x.max() < 0.5 and x.std() > 0.1
        assert h.dtype == np.float16 and h.min() >= 0 and h.max() < 1
        assert labels.dtype == np.int64 and set(labels.tolist()) == {3, 4, 5, 6}
        assert z.min() < -1 and z.max() > 1  # no range: standard normal, as before
    assert first["x:0"].tobytes() != second["x:0"].tobytes()  # one batch per step
    again = _make_feeds(sidecar, 2)
    assert all(a[k].tobytes() == b[k].tobytes() for a, b in zip(again, [first, second]) for k in a)


def test_verify_feeds_without_ranges_are_drawn_as_before():
    # The losses tests pin depend on these draws: integers in [0, 2) when there is no range.
    sidecar = {
        "inputs": [
            {"name": "x", "dtype": "float32", "shape": [3]},
            {"name": "i", "dtype": "int32", "shape": [4]},
        ]
    }
    (batch,) = _make_feeds(sidecar, 1)
    rng = np.random.RandomState(0)
    assert batch["x"].tobytes() == rng.standard_normal([3]).astype(np.float32).tobytes()
    assert batch["i"].tolist() == rng.randint(0, 2, size=[4]).tolist()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_rounding_never_leaves_the_range(dtype):
    # Most float64 draws in [0, 1) round to 1.0 in a coarse dtype near the top: they are clamped.
    values = range_values(np.random.RandomState(3), "x", dtype, (20_000,), (0.9921875, 1.0))
    as_float = values.astype(np.float64)
    assert str(values.dtype) == dtype and as_float.min() >= 0.9921875 and as_float.max() < 1.0


def test_range_values_refuses_what_the_dtype_cannot_take():
    rng = np.random.RandomState(0)
    with pytest.raises(
        InputError,
        match=r"input 'i:0' is int32: its range must be integers in \[-2147483648, 2147483648\], not \[0.5, 1.5\)",
    ):
        range_values(rng, "i:0", "int32", (2,), (0.5, 1.5))  # a float range on an int placeholder
    with pytest.raises(InputError, match="holds no float16 value"):
        range_values(rng, "h:0", "float16", (2,), (1e5, 1e6))
    with pytest.raises(InputError, match="is too large to make up a value for"):
        range_values(rng, "x:0", "float32", (2**40, 2**40), (0.0, 1.0))


@tf_test
def test_profiler_feeds_honour_float_ranges():
    specs = [FeedSpec("x:0", "float32", (128, 8), (-1.0, 1.0)), FeedSpec("labels:0", "int64", (64,), (0, 3))]
    feeds = synthetic_feeds(specs, 5)
    assert feeds["x:0"].min() >= -1 and feeds["x:0"].max() < 1 and feeds["x:0"].std() > 0.3
    assert set(feeds["labels:0"].tolist()) == {0, 1, 2}
    assert FeedSpec("x:0", "float32", (2,), (-1.0, 1.0)).describe() == "float32[2] in [-1.0, 1.0)"
    with pytest.raises(InputError, match="too large"):
        synthetic_feeds([FeedSpec("x:0", "float32", (2**40, 2**40))], 5)
