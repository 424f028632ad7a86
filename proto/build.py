"""Regenerate the committed artefacts derived from schemas and from TensorFlow.

Usage (from anywhere)::

    python proto/build.py            # rewrite what is stale
    python proto/build.py --check    # exit 1 if anything is stale; write nothing

Artefacts:

``baechi_cli/proto_gen/<name>_pb2.py`` and ``.pyi``
    compiled from every ``proto/*.proto`` with ``python -m grpc_tools.protoc``
    (the grpcio-tools version pinned in pyproject.toml's dev extra: the
    generated code names the protobuf version it needs at run time). They are
    committed so that installing baechi needs no protoc.
``baechi_cli/io/tf_op_registry.json``
    op type -> declared input and output arguments, taken from the op registry
    of the installed TensorFlow; skipped (with a note) when TensorFlow is not
    installed. Format: see :func:`op_registry_table`.

tests/test_proto.py runs the same functions and fails when a committed
artefact differs from what they produce.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTO_GEN_DIR = ROOT / "baechi_cli" / "proto_gen"
OP_REGISTRY_PATH = ROOT / "baechi_cli" / "io" / "tf_op_registry.json"
OP_REGISTRY_SCHEMA = "baechi.tf_op_registry/v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi")


def generate_protos(out_dir: Path) -> dict[str, bytes]:
    """Compile every ``proto/*.proto`` into ``out_dir``; return {file name: bytes}.

    Raises ImportError when grpc_tools is not installed and RuntimeError when
    protoc fails.
    """
    import grpc_tools  # noqa: F401  (fail early with ImportError, not a protoc usage text)

    sources = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    # Relative source names, so the names registered in the descriptor pool
    # (and written into the generated code) do not depend on the checkout path.
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *sources,
    ]
    done = subprocess.run(cmd, cwd=PROTO_DIR, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed: {done.stderr.strip()}")
    return {p.name: p.read_bytes() for p in sorted(out_dir.iterdir()) if p.name.endswith(GENERATED_SUFFIXES)}


def committed_protos() -> dict[str, bytes]:
    """The generated proto modules currently committed under baechi_cli/proto_gen."""
    return {
        p.name: p.read_bytes() for p in sorted(PROTO_GEN_DIR.iterdir()) if p.name.endswith(GENERATED_SUFFIXES)
    }


def _arg_entry(arg: Any) -> dict[str, Any]:
    """One OpDef.ArgDef as {type | type_attr | type_list_attr, number_attr, is_ref}."""
    from tensorflow.python.framework import dtypes

    entry: dict[str, Any] = {}
    if arg.type_list_attr:
        entry["type_list_attr"] = arg.type_list_attr
    elif arg.type_attr:
        entry["type_attr"] = arg.type_attr
    else:
        entry["type"] = dtypes.as_dtype(arg.type).name
    if arg.number_attr:
        entry["number_attr"] = arg.number_attr
    if arg.is_ref:
        entry["is_ref"] = True
    return entry


def _default_value(attr_def: Any) -> Any:
    """The default of a type, list(type) or int attr as JSON (None when it has none)."""
    from tensorflow.python.framework import dtypes

    if not attr_def.HasField("default_value"):
        return None
    value = attr_def.default_value
    if attr_def.type == "type":
        return dtypes.as_dtype(value.type).name
    if attr_def.type == "list(type)":
        return [dtypes.as_dtype(t).name for t in value.list.type]
    if attr_def.type == "int":
        return int(value.i)
    return None


def op_registry_table() -> dict[str, Any]:
    """The op table of the installed TensorFlow (imports TensorFlow).

    ``{"schema", "tensorflow": version, "ops": {op type: {"inputs": [arg],
    "outputs": [arg], "defaults": {attr: value}}}}`` where ``arg`` is
    ``{"type": dtype name} | {"type_attr": attr} | {"type_list_attr": attr}``
    plus optional ``"number_attr": attr`` and ``"is_ref": true``, and
    ``defaults`` holds the default values of the attrs those arguments name
    (dtype names, lists of them, ints), so a NodeDef written with default
    attrs stripped still resolves.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from tensorflow.core.framework import op_def_pb2
    from tensorflow.python.client import pywrap_tf_session as c_api

    # The C registry lists every op linked into TensorFlow, including the ones
    # no Python module has wrapped yet (op_def_registry only caches on demand).
    buf = c_api.TF_GetAllOpList()
    try:
        op_list = op_def_pb2.OpList.FromString(c_api.TF_GetBuffer(buf))
    finally:
        c_api.TF_DeleteBuffer(buf)
    ops: dict[str, Any] = {}
    for op in sorted(op_list.op, key=lambda o: o.name):
        args = list(op.input_arg) + list(op.output_arg)
        named = {a.type_attr for a in args} | {a.type_list_attr for a in args} | {a.number_attr for a in args}
        defaults = {}
        for attr_def in op.attr:
            if attr_def.name in named:
                value = _default_value(attr_def)
                if value is not None:
                    defaults[attr_def.name] = value
        entry: dict[str, Any] = {
            "inputs": [_arg_entry(a) for a in op.input_arg],
            "outputs": [_arg_entry(a) for a in op.output_arg],
        }
        if defaults:
            entry["defaults"] = defaults
        ops[op.name] = entry
    return {"schema": OP_REGISTRY_SCHEMA, "tensorflow": tf.__version__, "ops": ops}


def dump_op_registry(table: dict[str, Any]) -> bytes:
    """Serialize the table with one op per line, so upgrades diff readably."""
    lines = [
        "{",
        f'"schema": {json.dumps(table["schema"])},',
        f'"tensorflow": {json.dumps(table["tensorflow"])},',
        '"ops": {',
    ]
    items = sorted(table["ops"].items())
    for i, (name, entry) in enumerate(items):
        comma = "," if i + 1 < len(items) else ""
        lines.append(f"{json.dumps(name)}: {json.dumps(entry, sort_keys=True, separators=(',', ':'))}{comma}")
    lines += ["}", "}", ""]
    return "\n".join(lines).encode()


def _write_if_changed(path: Path, data: bytes, check: bool) -> bool:
    """Write ``data`` to ``path`` unless equal; return whether it was stale."""
    if path.exists() and path.read_bytes() == data:
        return False
    if not check:
        path.write_bytes(data)
    print(f"{'stale' if check else 'wrote'}: {path.relative_to(ROOT)}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale artefacts, write nothing")
    args = parser.parse_args(argv)

    stale = False
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate_protos(Path(tmp))
    for name, data in fresh.items():
        stale |= _write_if_changed(PROTO_GEN_DIR / name, data, args.check)
    for name in sorted(set(committed_protos()) - set(fresh)):
        stale = True
        print(f"{'stale' if args.check else 'removed'}: {(PROTO_GEN_DIR / name).relative_to(ROOT)}")
        if not args.check:
            (PROTO_GEN_DIR / name).unlink()

    try:
        table = op_registry_table()
    except ImportError:
        print(f"skipped {OP_REGISTRY_PATH.relative_to(ROOT)}: TensorFlow is not installed")
    else:
        stale |= _write_if_changed(OP_REGISTRY_PATH, dump_op_registry(table), args.check)
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
