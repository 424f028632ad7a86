"""The sidecar of a GraphDef: what ``baechi verify --run`` and ``baechi profile --measure`` feed and fetch.

Written by ``testdata/generate.py`` beside each test model as ``<stem>.json``::

    {"inputs": [{"name": "x:0", "dtype": "float32", "shape": [64, 784], "range": [-1.0, 1.0]},
                {"name": "labels:0", "dtype": "int64", "shape": [64], "range": [0, 10]}],
     "loss": "loss:0", "train_op": "train", "init_op": "init", "seed": 20200101, ...}

Schema, checked by :func:`validate_sidecar` for both of its readers (other
keys are ignored):

* ``inputs``: a list; each entry an object with a non-empty string
  ``name`` (a tensor, ``x:0``, or a node, ``x``, meaning ``x:0``; no two
  entries name the same tensor), a ``dtype`` among :data:`FEEDABLE_DTYPES`
  (TensorFlow's names) and a ``shape``, a list of integers >= 0 (-1, an
  unknown dim, only where the caller allows it: the profiler fills it from
  the batch size) whose tensor holds fewer than 2**63 bytes.
* ``range`` (optional, per input) ``[low, high)``, where values are drawn
  uniformly: for an integer dtype two integers within the dtype's values
  and int64's, as which they are drawn (``high`` may be the largest + 1);
  for a float dtype two finite numbers whose difference is finite. ``low <
  high`` in both cases. Other dtypes (bool, complex, string) take no range.
* ``loss``, ``train_op``, ``init_op``: tensor or node names, strings (null
  is the same as absent); ``batch_size`` an integer >= 1; ``seed`` an
  integer in ``[0, 2**32)`` (what ``numpy.random.RandomState`` takes).
  Which keys are required is the caller's: ``verify --run`` needs
  :data:`RUN_KEYS`, the profiler none.

:func:`load_sidecar` reads and validates one; :func:`default_sidecar` finds
``verify``'s: ``<stem>.json`` beside the original, or beside the placed file
without one. Every problem is an :class:`~baechi_cli.core.errors.InputError`
naming the file (and the input, where there is one) on one line.

:func:`range_values` draws an input's values from its range; both feed
builders (``verify --run``'s and the profiler's, which differ in what they
feed an input without a range) use it, so a range means the same to both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from baechi_cli.core.errors import OP_NAME_LIMIT, InputError, truncate

if TYPE_CHECKING:
    import numpy as np

#: The keys ``verify --run`` needs (the profiler needs none).
RUN_KEYS = ("inputs", "loss", "train_op", "init_op")

#: Float dtypes, whose range is [low, high) of finite numbers.
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
_INTEGER_BITS = {f"{sign}int{bits}": bits for sign in ("", "u") for bits in (8, 16, 32, 64)}
#: Integer dtypes -> their [smallest, largest + 1) values, which bound a range.
INTEGER_BOUNDS: dict[str, tuple[int, int]] = {
    name: ((0, 2**bits) if name.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1)))
    for name, bits in _INTEGER_BITS.items()
}
#: Every dtype a sidecar input may have: a synthetic value can be made for each.
FEEDABLE_DTYPES = FLOAT_DTYPES | INTEGER_BOUNDS.keys() | {"bool", "complex64", "complex128", "string"}

# numpy.random.RandomState draws integers as int64 and takes seeds below 2**32.
_INT64_BOUNDS = (-(2**63), 2**63)
_SEED_LIMIT = 2**32
_MAX_BYTES = 2**63 - 1  # numpy's (and TensorFlow's) largest tensor
# Bytes per element; a string counts 1 (its size is not in its shape).
_ITEM_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1, "complex64": 8}
_ITEM_BYTES |= {"complex128": 16, "string": 1} | {name: bits // 8 for name, bits in _INTEGER_BITS.items()}


def load_sidecar(
    path: str, *, required: Sequence[str] = RUN_KEYS, unknown_dims: bool = False
) -> dict[str, Any]:
    """Read and validate the sidecar JSON at ``path`` (see the module docstring).

    ``required`` keys must be present (and not null); ``unknown_dims``
    allows -1 in shapes. Returns the parsed object; raises InputError naming
    the file.
    """
    try:
        data = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a JSON sidecar", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot read the sidecar: {exc.strerror}", path=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not a readable JSON sidecar: {exc.msg} at line {exc.lineno} column {exc.colno}", path=path
        ) from None
    except (ValueError, RecursionError):  # undecodable bytes; absurdly deep nesting
        raise InputError(
            "not a readable JSON sidecar (undecodable or too deeply nested)", path=path
        ) from None
    return validate_sidecar(data, path, required=required, unknown_dims=unknown_dims)


def validate_sidecar(
    data: Any, path: str, *, required: Sequence[str] = RUN_KEYS, unknown_dims: bool = False
) -> dict[str, Any]:
    """``data`` (a parsed sidecar) when it follows the schema of the module docstring, else InputError.

    ``path`` names the file in errors. O(inputs + dims).
    """
    if not isinstance(data, dict):
        raise InputError("a sidecar must be a JSON object", path=path)
    for key in required:
        if data.get(key) is None:
            raise InputError(f"sidecar lacks '{key}'", path=path)
    inputs = data.get("inputs", [])
    if not isinstance(inputs, list):
        raise InputError("sidecar 'inputs' must be a list", path=path)
    seen: set[str] = set()
    for k, entry in enumerate(inputs):
        tensor = _check_input(entry, k, path, unknown_dims)
        if tensor in seen:
            raise InputError(
                f"sidecar input '{truncate(entry['name'], OP_NAME_LIMIT)}' is listed twice", path=path
            )
        seen.add(tensor)
    for key in ("loss", "train_op", "init_op"):
        if data.get(key) is not None and (not isinstance(data[key], str) or not data[key]):
            raise InputError(f"sidecar '{key}' must be a node or tensor name (a non-empty string)", path=path)
    for key, low, high in (("batch_size", 1, None), ("seed", 0, _SEED_LIMIT)):
        value = data.get(key)
        if value is not None and not (_is_int(value) and value >= low and (high is None or value < high)):
            bound = f" and below {high}" if high is not None else ""
            raise InputError(f"sidecar '{key}' must be an integer of at least {low}{bound}", path=path)
    return data


def _check_input(entry: Any, k: int, path: str, unknown_dims: bool) -> str:
    """Check sidecar input #k; return the tensor it names (``x`` -> ``x:0``)."""
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and entry["name"]
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and all(_is_int(d) for d in entry["shape"])
    ):
        shown = json.dumps(entry, ensure_ascii=False)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise InputError(
            f"sidecar input #{k} ({shown}) needs a name, a dtype and a shape (a list of integers)", path=path
        )
    name, dtype, shape = entry["name"], entry["dtype"], entry["shape"]
    where = f"sidecar input '{truncate(name, OP_NAME_LIMIT)}'"
    if dtype not in FEEDABLE_DTYPES:
        raise InputError(
            f"{where}: dtype {_show(dtype)} is not one of {', '.join(sorted(FEEDABLE_DTYPES))}", path=path
        )
    least = -1 if unknown_dims else 0
    if any(d < least for d in shape):
        allowed = "-1 (unknown) or more" if unknown_dims else "0 or more"
        raise InputError(
            f"{where}: shape {_show(shape)} has a dim below {least}; dims are {allowed}", path=path
        )
    if math.prod(d for d in shape if d > 0) * _ITEM_BYTES[dtype] > _MAX_BYTES:
        raise InputError(f"{where}: shape {_show(shape)} of {dtype} holds more than 2**63 bytes", path=path)
    if entry.get("range") is not None:
        _check_range(entry["range"], dtype, where, path)
    return name if ":" in name else f"{name}:0"


def _check_range(value_range: Any, dtype: str, where: str, path: str) -> None:
    """InputError unless ``value_range`` is a valid [low, high) for ``dtype`` (module docstring)."""
    if dtype in INTEGER_BOUNDS:
        smallest, limit = _integer_range_bounds(dtype)
        if not (
            isinstance(value_range, list)
            and len(value_range) == 2
            and all(_is_int(v) for v in value_range)
            and smallest <= value_range[0] < value_range[1] <= limit
        ):
            raise InputError(
                f"{where}: range must be [low, high) integers with {smallest} <= low < high <= {limit} "
                f"({dtype}), not {_show(value_range)}",
                path=path,
            )
    elif dtype in FLOAT_DTYPES:
        if not (
            isinstance(value_range, list)
            and len(value_range) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value_range)
            and _finite_interval(*value_range)
        ):
            raise InputError(
                f"{where}: range must be [low, high) of finite numbers with low < high ({dtype}), "
                f"not {_show(value_range)}",
                path=path,
            )
    else:
        raise InputError(
            f"{where}: a {dtype} input takes no range (ranges are for integer and float inputs)", path=path
        )


def _integer_range_bounds(dtype: str) -> tuple[int, int]:
    """The [smallest low, largest high] of an integer range: the dtype's values, drawn as int64."""
    smallest, limit = INTEGER_BOUNDS[dtype]
    return max(smallest, _INT64_BOUNDS[0]), min(limit, _INT64_BOUNDS[1])


def _finite_interval(low: float, high: float) -> bool:
    """``low < high``, both and their difference finite (an int too large for a float is not)."""
    try:
        low, high = float(low), float(high)
    except OverflowError:
        return False
    return math.isfinite(low) and math.isfinite(high) and low < high and math.isfinite(high - low)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a :data:`FEEDABLE_DTYPES` name (``bfloat16`` from ml_dtypes, ``string`` object)."""
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(object if dtype == "string" else dtype)


def range_values(
    rng: np.random.RandomState,
    name: str,
    dtype: str,
    shape: Sequence[int],
    value_range: Sequence[float],
) -> np.ndarray:
    """Input ``name``'s values, of ``dtype`` (a TensorFlow dtype name) and ``shape``, uniform in ``[low, high)``.

    Integers: ``rng.randint(low, high)`` as int64, cast. Floats:
    ``rng.uniform(low, high)`` rounded to the dtype; a value that rounding
    moved onto ``high`` or below ``low`` is clamped to the dtype's nearest
    value inside the range, so every value is in ``[low, high)``. Raises
    InputError naming the input when the range does not suit the dtype (the
    profiler feeds a placeholder's own dtype, which may differ from the
    sidecar's), or the tensor cannot be allocated.
    """
    import numpy as np

    low, high = value_range
    name = truncate(name, OP_NAME_LIMIT)  # for messages
    try:
        if dtype in INTEGER_BOUNDS:
            smallest, limit = _integer_range_bounds(dtype)
            if not (_is_int(low) and _is_int(high) and smallest <= low < high <= limit):
                raise InputError(
                    f"input '{name}' is {dtype}: its range must be integers in [{smallest}, {limit}], "
                    f"not [{low}, {high})"
                )
            return rng.randint(low, high, size=tuple(shape), dtype=np.int64).astype(numpy_dtype(dtype))
        if dtype not in FLOAT_DTYPES or not _finite_interval(low, high):
            raise InputError(f"input '{name}' is {dtype}, which takes no range [{low}, {high})")
        target = numpy_dtype(dtype)
        # Bounds beyond the dtype's largest value round to infinity, which clamping undoes.
        with np.errstate(over="ignore"):
            inside_low, inside_high = _representable_bounds(float(low), float(high), target)
            if inside_low is None:
                raise InputError(f"input '{name}': range [{low}, {high}) holds no {dtype} value")
            value = np.asarray(rng.uniform(low, high, size=tuple(shape))).astype(target)
        return np.clip(value, inside_low, inside_high).astype(target, copy=False)
    except (MemoryError, ValueError):  # numpy: "array is too big", or no memory for it
        raise InputError(
            f"input '{name}' of shape {list(shape)} is too large to make up a value for"
        ) from None


def _representable_bounds(low: float, high: float, dtype: np.dtype) -> tuple[Any, Any]:
    """The smallest ``dtype`` value >= low and the largest < high, or (None, None) when none is between."""
    import numpy as np

    first = np.asarray(low).astype(dtype)
    if float(first) < low:
        first = np.nextafter(first, np.asarray(math.inf).astype(dtype))
    last = np.asarray(high).astype(dtype)
    while float(last) >= high:
        last = np.nextafter(last, np.asarray(-math.inf).astype(dtype))
    if not float(first) <= float(last):
        return None, None
    return first, last


def default_sidecar(placed: str, original: str | None = None) -> str:
    """``<stem>.json`` beside the original (beside ``placed`` without one); InputError when absent."""
    model = original if original is not None else placed
    candidate = Path(model).with_suffix(".json")
    if not candidate.is_file():
        raise InputError(
            f"--run needs a sidecar JSON (inputs, loss, train_op, init_op) and there is no {candidate} "
            "beside it; pass --sidecar",
            path=model,
        )
    return str(candidate)
