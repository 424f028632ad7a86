"""PyTorch programs: the graph of ``torch.export`` (a ``.pt2`` archive) as an OpGraph.

:func:`read_pt2_with_notes` reads a ``torch.export.save`` archive without importing torch and
without unpickling anything: the program is the archive's ``models/model.json`` (torch's
export schema, plain JSON), and nothing else in the file is opened (the weights' bytes are not
needed, their sizes are in the program; the sample inputs are a pickle and are never read).
:func:`program_json` turns an in-process ``ExportedProgram`` into the same JSON (with torch),
so a Python caller plans exactly what a file would give.

The graph: one ``Input`` op per user input, then one op per node whose outputs include a
tensor, in node order, of type ``aten.<op>`` (the overload packet: ``aten.addmm``; another
namespace likewise, ``mylib.fused``), named as the node. ``attrs``: ``_target`` (the full target,
``torch.ops.aten.add.Tensor``), ``_input_shapes``/``_input_dtypes`` (one entry per tensor
argument, in schema order), ``_args`` (the other arguments by schema name), ``_module`` (the
innermost ``nn_module_stack`` path), ``_source`` (the program node it runs; a traced step's forward
op: the node it was traced from). Parameters, buffers and constants are not ops: their bytes
are persistent bytes of their first reader, and readers of one share a colocation group, as for
ONNX initializers. Sizes are the program's own; a symbolic size is bound by ``--dim NAME=VALUE``
(the program's symbol, ``s77``) or, on axis 0 of a user input, ``--batch-size``, and left unbound
it is an InputError naming the tensor. The caller holds the user inputs and outputs. Deterministic.

Example:
    >>> import io, json, zipfile, tempfile, os
    >>> t = lambda n: {"dtype": 7, "sizes": [{"as_int": 2}, {"as_int": n}]}
    >>> program = {"graph_module": {"graph": {
    ...     "inputs": [{"as_tensor": {"name": "w"}}, {"as_tensor": {"name": "x"}}],
    ...     "outputs": [{"as_tensor": {"name": "mm"}}],
    ...     "nodes": [{"name": "mm", "target": "torch.ops.aten.mm.default", "metadata": {},
    ...                "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "x"}}},
    ...                           {"name": "mat2", "arg": {"as_tensor": {"name": "w"}}}],
    ...                "outputs": [{"as_tensor": {"name": "mm"}}]}],
    ...     "tensor_values": {"w": t(2), "x": t(2), "mm": t(2)}},
    ...   "signature": {"input_specs": [
    ...     {"parameter": {"arg": {"name": "w"}, "parameter_name": "w"}},
    ...     {"user_input": {"arg": {"as_tensor": {"name": "x"}}}}]}}}
    >>> path = os.path.join(tempfile.mkdtemp(), "mm.pt2")
    >>> with zipfile.ZipFile(path, "w") as z: z.writestr("mm/models/model.json", json.dumps(program))
    >>> g = read_pt2_with_notes(path).graph
    >>> g.names, g.op_types, g.output_bytes, g.persistent_bytes
    (['x', 'mm'], ['Input', 'aten.mm'], [[16], [16]], [0, 16])
"""

from __future__ import annotations

import ast
import json
import math
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from baechi_cli.core.errors import InputError, one_line
from baechi_cli.core.graph import CONTROL_PORT, GraphBuilder, OpGraph
from baechi_cli.io.aliasing import tensor_names
from baechi_cli.io.initializers import Initializer, own_initializers

#: torch's export schema ScalarType value -> (numpy-style dtype name, bits per element).
DTYPES: dict[int, tuple[str, int]] = {
    1: ("uint8", 8),
    2: ("int8", 8),
    3: ("int16", 16),
    4: ("int32", 32),
    5: ("int64", 64),
    6: ("float16", 16),
    7: ("float32", 32),
    8: ("float64", 64),
    9: ("complex32", 32),
    10: ("complex64", 64),
    11: ("complex128", 128),
    12: ("bool", 8),
    13: ("bfloat16", 16),
    28: ("uint16", 16),
    29: ("float8_e4m3fn", 8),
    30: ("float8_e5m2", 8),
    31: ("float8_e4m3fnuz", 8),
    32: ("float8_e5m2fnuz", 8),
    33: ("float8_e8m0fnu", 8),
    34: ("uint32", 32),
    35: ("uint64", 64),
}
INPUT_OP = "Input"
_PROGRAM = "models/model.json"  # the program's entry in an archive, under its top folder
_MAX_JSON = 1 << 31  # bytes: a larger program entry is refused before it is read
# A sympy size expression's functions that evaluate on integers (torch prints sizes with srepr).
_SIZE_FUNCTIONS = {
    "Add": lambda *a: sum(a),
    "Mul": lambda *a: math.prod(a),
    "Pow": lambda a, b: a**b,
    "FloorDiv": lambda a, b: a // b,
    "CleanDiv": lambda a, b: a // b,
    "Mod": lambda a, b: a % b,
    "PythonMod": lambda a, b: a % b,
    "Max": max,
    "Min": min,
    "floor": math.floor,
    "ceiling": math.ceil,
    "FloorToInt": math.floor,
    "CeilToInt": math.ceil,
    "Integer": int,
    "Rational": lambda p, q: p / q,
}


class Pt2Read(NamedTuple):
    graph: OpGraph
    notes: list[str]


class _Tensor(NamedTuple):
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def read_pt2_with_notes(
    path: str,
    *,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
    training: str | None = None,
) -> Pt2Read:
    """Read the ``torch.export`` archive at ``path`` (module docstring); InputError naming the
    file (and the node or tensor) when it is not one or cannot be sized. ``training``, an
    optimizer's name, reads the training step autograd traces instead
    (:func:`~baechi_cli.io.pt2_joint.joint_program`)."""
    try:
        return read_program(_load_program(path), batch_size=batch_size, dims=dims, training=training)
    except InputError as err:
        raise err.with_path(path) from None


def program_json(exported: Any) -> dict[str, Any]:
    """An in-process ``torch.export.ExportedProgram`` as the program JSON a ``.pt2`` archive holds
    (needs torch); :func:`read_program` reads it."""
    from torch._export.serde.serialize import serialize

    return json.loads(serialize(exported).exported_program.decode("utf-8"))


def export(model: Any, args: tuple[Any, ...]) -> Any:
    """``torch.export.export(model, args)``, torch's prints silenced; its refusal as a one-line
    InputError with its reason. Needs torch."""
    import contextlib
    import io

    import torch

    said = io.StringIO()  # torch prints the graph it gave up on: the reason is in the error
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            return torch.export.export(model, args)
    except Exception as err:  # torch's many export errors: the user's model, said in one line
        raise InputError(f"torch.export cannot export the model: {_reason(err)}{_hint(model)}") from None


def _hint(model: Any) -> str:
    """What makes a model that torch.export refused export, where baechi knows: transformers'
    eager mixture-of-experts loop (its tokens per expert are data-dependent sizes) has
    export-friendly implementations the model's config selects."""
    configs = [getattr(m, "config", None) for m in model.modules()] if hasattr(model, "modules") else []
    if any(getattr(c, "_experts_implementation", None) == "eager" for c in configs):
        return (
            "; the model runs transformers' eager experts loop, whose sizes depend on the routing: "
            "config._experts_implementation = 'batched_mm' exports"
        )
    return ""


def _reason(err: BaseException) -> str:
    """The line of a torch error that says why (not the code it quotes), with the error's type."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    prose = [line for line in lines if not line[0].isspace() and not line.startswith(("def ", "class ", "#"))]
    return one_line(f"{type(err).__name__}: {(prose or lines or [''])[0]}", 300)


def read_program(
    program: Mapping[str, Any],
    *,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
    training: str | None = None,
) -> Pt2Read:
    """:func:`read_pt2_with_notes` on a program already parsed (:func:`program_json`)."""
    reader = _Reader(program, batch_size, dict(dims or {}))
    if training is None:
        return reader.read()
    from baechi_cli.io.pt2_joint import joint_program

    sizes = reader.placeholder_sizes()
    from baechi_cli.io.pt2_cache import cached_joint

    joint = _Reader(cached_joint(program, sizes, training, joint_program), None, {}).read()
    note = (
        f"training step traced by autograd: {sum(joint.graph.is_backward)} of {joint.graph.num_ops} ops "
        f"after the forward pass (loss, backward, {training} update)"
    )
    return Pt2Read(joint.graph, [*reader.notes, note])


def load_program(path: str) -> Mapping[str, Any]:
    """The program JSON of the ``torch.export`` archive at ``path`` (read as :func:`read_pt2_with_notes`
    reads it: no pickle is loaded); InputError naming the file when it is not one."""
    try:
        return _load_program(path)
    except InputError as err:
        raise err.with_path(path) from None


def step_program(
    program: Mapping[str, Any],
    *,
    batch_size: int | None = None,
    dims: Mapping[str, int] | None = None,
    training: str | None = None,
) -> tuple[Mapping[str, Any], dict[str, str], dict[str, tuple[int, ...]]]:
    """What runs of ``program``: its graph (with ``training``, an optimizer's name, the training
    step :func:`read_program` reads, from the same cache), each graph input's kind (parameter,
    buffer, user_input, ...) and its shape, symbols bound as :func:`read_program` binds them. The
    graph's node names are the names :func:`read_program` gives their ops. Tracing a training step
    needs torch."""
    reader = _Reader(program, batch_size, dict(dims or {}))
    sizes = reader.placeholder_sizes()
    if training is not None:
        from baechi_cli.io.pt2_cache import cached_joint
        from baechi_cli.io.pt2_joint import joint_program

        reader = _Reader(cached_joint(program, sizes, training, joint_program), None, {})
        sizes = reader.placeholder_sizes()
    return reader.graph, reader._inputs(), sizes


def _load_program(path: str) -> Mapping[str, Any]:
    try:
        with zipfile.ZipFile(path) as archive:
            entries = [i for i in archive.infolist() if i.filename.endswith(_PROGRAM)]
            if not entries:
                raise InputError(
                    f"not a torch.export archive: no {_PROGRAM} in it (save it with torch.export.save)"
                )
            entry = min(entries, key=lambda i: (i.filename.count("/"), i.filename))
            if entry.file_size > _MAX_JSON:
                raise InputError(f"{entry.filename} is {entry.file_size} bytes, more than a program can be")
            text = archive.read(entry)
    except zipfile.BadZipFile:
        raise InputError("not a torch.export archive (.pt2): not a zip file") from None
    except OSError as err:
        raise InputError(f"cannot read: {one_line(err)}") from None
    try:
        program = json.loads(text)
    except (ValueError, UnicodeDecodeError) as err:
        raise InputError(f"{_PROGRAM} is not JSON: {one_line(err, 200)}") from None
    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise InputError(f"{_PROGRAM} holds no graph_module: not an exported program")
    return program


class _Reader:
    """One program's walk (module docstring)."""

    def __init__(self, program: Mapping[str, Any], batch_size: int | None, binding: dict[str, int]) -> None:
        module = program["graph_module"]
        self.graph = _field(module, "graph", dict)
        self.signature = module.get("signature") or {}
        self.batch_size = batch_size
        self.binding = binding
        self.values: dict[str, Any] = _field(self.graph, "tensor_values", dict)
        self.symbols: set[str] = set()
        self.notes: list[str] = []

    def placeholder_sizes(self) -> dict[str, tuple[int, ...]]:
        """Every input's (parameter, buffer, user input) shape, symbols bound."""
        kinds = self._inputs()
        self._bind_batch(kinds)
        return {name: self._tensor(name, name).shape for name in kinds}

    def read(self) -> Pt2Read:
        kinds = self._inputs()
        self._bind_batch(kinds)
        builder = GraphBuilder()
        # (op, phase, seq_nr, reads a loss or backward op's output, outputs, input tensors) of a
        # traced step's ops
        self.phases: list[_Phase] = []
        self.phase_of: dict[int, str] = {}
        producer: dict[str, tuple[int, int]] = {}
        produced: dict[str, _Tensor] = {}
        consumers: dict[str, list[int]] = {}
        inits: dict[str, Initializer] = {}
        for name, kind in kinds.items():
            t = self._tensor(name, name)
            if kind == "user_input":
                v = builder.add_op(
                    name, INPUT_OP, [t.nbytes], output_shapes=[t.shape], output_dtypes=[t.dtype]
                )
                producer[name], produced[name] = (v, 0), t
            else:
                inits[name] = Initializer(t.nbytes, t.dtype)
        for node in _field(self.graph, "nodes", list):
            self._node(node, builder, producer, produced, inits, consumers)
        unused = sorted(set(self.binding) - self.symbols)
        if unused:
            known = ", ".join(sorted(self.symbols)) or "none"
            raise InputError(
                f"--dim {unused[0]}: the program has no symbolic size of that name (its: {known})"
            )
        for name, kind in kinds.items():
            if kind == "user_input":
                builder.hold(*producer[name])
        for out in self.graph.get("outputs") or []:
            for name in tensor_names(out):
                if name in producer:
                    builder.hold(*producer[name])
        _link_phases(builder, self.phases, consumers)
        _hold_saved(builder, self.phases, producer, self.graph.get("baechi_saved") or [])
        groups = self.graph.get("baechi_write_groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
            raise InputError("the traced step's baechi_write_groups is not a list of node lists")
        takes = self.graph.get("baechi_program_inputs") or {}
        if not isinstance(takes, dict):
            raise InputError("the traced step's baechi_program_inputs is not a mapping of node lists")
        graph = _in_program_order(own_initializers(builder.build(), inits, consumers), takes)
        return Pt2Read(_with_sources_together(graph, groups), self.notes)

    def _inputs(self) -> dict[str, str]:
        """Placeholder name -> its kind (user_input, parameter, buffer, ...), in graph order."""
        kinds: dict[str, str] = {}
        for spec in self.signature.get("input_specs") or []:
            if not isinstance(spec, dict) or len(spec) != 1:
                raise InputError("a malformed input spec in the program's signature")
            ((kind, body),) = spec.items()
            arg = body.get("arg") or {}
            names = tensor_names(arg) if "name" not in arg else [arg["name"]]
            for name in names:
                kinds[name] = kind
        for arg in self.graph.get("inputs") or []:
            for name in tensor_names(arg):
                kinds.setdefault(name, "user_input")
        return kinds

    def _bind_batch(self, kinds: Mapping[str, str]) -> None:
        """``--batch-size``: the symbol of axis 0 of every user input, unless --dim names it."""
        if self.batch_size is None:
            return
        for name, kind in kinds.items():
            sizes = (self.values.get(name) or {}).get("sizes") or []
            if kind == "user_input" and sizes and "as_expr" in sizes[0]:
                symbols = _symbols(sizes[0]["as_expr"].get("expr_str", ""))
                if len(symbols) == 1:
                    self.binding.setdefault(symbols[0], self.batch_size)

    def _node(
        self,
        node: Mapping[str, Any],
        builder: GraphBuilder,
        producer: dict[str, tuple[int, int]],
        produced: dict[str, _Tensor],
        inits: Mapping[str, Initializer],
        consumers: dict[str, list[int]],
    ) -> None:
        name = str(node.get("name", ""))
        target = str(node.get("target", ""))
        outputs = [n for out in node.get("outputs") or [] for n in tensor_names(out, keep_none=True)]
        if not any(outputs):
            return  # symbolic-size arithmetic (sym_size, ...): nothing to place
        tensors = [self._tensor(o, name) if o else None for o in outputs]
        edges: list[tuple[int, int]] = []
        data_inputs: list[int] = []
        used: list[str] = []
        in_shapes: list[tuple[int, ...] | None] = []
        in_dtypes: list[str] = []
        args: dict[str, Any] = {}
        for position, item in enumerate(node.get("inputs") or []):
            arg_name, arg = str(item.get("name", position)), item.get("arg") or {}
            names = tensor_names(arg)
            if not names:
                args[arg_name] = _plain(arg)
                continue
            for value in names:
                if value in producer:
                    edges.append(producer[value])
                    data_inputs.append(len(in_shapes))
                    in_shapes.append(produced[value].shape)
                    in_dtypes.append(produced[value].dtype)
                elif value in inits:
                    if value not in used:
                        used.append(value)
                    t = self._tensor(value, name)
                    in_shapes.append(t.shape)
                    in_dtypes.append(t.dtype)
                else:
                    raise InputError(f"reads '{value}', which no node, input or parameter produces", op=name)
        attrs: dict[str, Any] = {
            "_target": target,
            "_input_shapes": in_shapes,
            "_input_dtypes": in_dtypes,
            "_data_inputs": data_inputs,
            "_args": args,
        }
        module = _module_path((node.get("metadata") or {}).get("nn_module_stack", ""))
        if module is not None:
            attrs["_module"] = module
        if used:
            attrs["_initializers"] = used
        metadata = node.get("metadata") or {}
        phase = metadata.get("baechi_phase", "forward")
        v = builder.add_op(
            name,
            _op_type(target),
            [t.nbytes if t else 0 for t in tensors],
            output_shapes=[t.shape if t else None for t in tensors],
            output_dtypes=[t.dtype if t else "" for t in tensors],
            attrs=attrs,
            is_backward=phase != "forward",
        )
        # The node of the exported program this op runs (a traced step's forward op was traced
        # from one): what a PyTorch runtime cuts (baechi_cli.runtime).
        source = metadata.get("baechi_source") if "baechi_phase" in metadata else name
        if source:
            attrs["_source"] = str(source)
        if metadata.get("baechi_untraced"):
            attrs["_untraced"] = str(metadata["baechi_untraced"]).split(",")
        if "baechi_workspace_bytes" in metadata:  # a traced step's: pt2_joint._cpu_workspace_bytes
            workspace = str(metadata["baechi_workspace_bytes"])
            if not workspace.isdigit():
                raise InputError(f"node {name}: baechi_workspace_bytes {workspace!r} is not a byte count")
            attrs["_workspace_bytes"] = int(workspace)
        if "baechi_phase" in metadata:
            attrs["_phase"] = phase
            self.phase_of[v] = phase
            after = any(self.phase_of.get(src, "forward") != "forward" for src, _ in edges)
            self.phases.append((v, phase, str(metadata.get("seq_nr", "-1")), after, len(tensors), edges))
        for value in used:
            consumers.setdefault(value, []).append(v)
        for port, (out, t) in enumerate(zip(outputs, tensors, strict=True)):
            if out and t is not None:
                producer[out], produced[out] = (v, port), t
        for src, port in edges:
            builder.add_edge(src, v, port)

    def _tensor(self, name: str, op: str) -> _Tensor:
        meta = self.values.get(name)
        if not isinstance(meta, dict):
            raise InputError(f"tensor '{name}' has no entry in the program's tensor_values", op=op)
        dtype, bits = DTYPES.get(meta.get("dtype", 0), (None, 0))
        if dtype is None:
            raise InputError(f"tensor '{name}' has an unknown dtype {meta.get('dtype')}", op=op)
        shape = tuple(self._size(d, name, axis, op) for axis, d in enumerate(meta.get("sizes") or []))
        return _Tensor(shape, dtype, (math.prod(shape) * bits + 7) // 8)

    def _size(self, size: Any, tensor: str, axis: int, op: str) -> int:
        if isinstance(size, dict) and "as_int" in size:
            value = size["as_int"]
        elif isinstance(size, dict) and "as_expr" in size:
            value = self._evaluate(size["as_expr"], tensor, axis, op)
        else:
            raise InputError(f"tensor '{tensor}' has a size of unknown form at axis {axis}", op=op)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"tensor '{tensor}' has a size {value!r} at axis {axis}", op=op)
        return value

    def _evaluate(self, expr: Mapping[str, Any], tensor: str, axis: int, op: str) -> int:
        text = str(expr.get("expr_str", ""))
        symbols = _symbols(text)
        self.symbols.update(symbols)
        missing = [s for s in symbols if s not in self.binding]
        if missing:
            hint = (expr.get("hint") or {}).get("as_int")
            traced = f" (traced with {hint})" if hint is not None else ""
            fix = f"--dim {missing[0]}=VALUE" + (" or --batch-size" if axis == 0 else "")
            raise InputError(
                f"tensor '{tensor}' has symbolic size {missing[0]} at axis {axis}{traced} with no value; pass {fix}",
                op=op,
            )
        try:
            value = _evaluate_size(ast.parse(text, mode="eval").body, self.binding)
        except (SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError):
            raise InputError(
                f"tensor '{tensor}' has a size expression baechi cannot evaluate: {text[:120]}", op=op
            ) from None
        return int(value)


STEP_OP = "OptimizerStep"  # as passes.training names it: opt.step() after backward() returns


_Phase = tuple[int, str, str, bool, int, list[tuple[int, int]]]


def _link_phases(builder: GraphBuilder, phases: list[_Phase], consumers: Mapping[str, list[int]]) -> None:
    """A traced step's structure, as autograd and ``opt.step()`` run it (``consumers``: each
    parameter's reading ops, in order):

    * each backward op's forward op: the first forward op of its autograd sequence number; an op
      of no autograd node (the sum of a value's gradients from its several readers) is of the
      forward op of the backward op or update that reads it, where autograd runs it; an update is
      of its parameter's first forward reader, and the loss of the last forward op a backward op
      is of (the model's end), as :mod:`baechi_cli.passes.training`'s are;
    * a backward op that reads no loss or backward op's output (``pow(x, 1)`` of a pow's
      backward, computed from saved tensors alone) waits, by a control edge, for the loss or
      backward op traced before it: autograd runs it when its node runs, not as soon as it can;
    * the tensors one autograd node's backward makes or reads (its run of ops with one sequence
      number) live until the node's last op ends: a backward formula's temporaries are C++
      locals, and the engine releases its saved tensors and incoming gradient, when it returns
      (``grad * (2 * self.pow(1))`` holds ``self``, ``grad`` and all three results at once);
    * one ``optimizer/step`` op waits for every backward op, and every update waits for it; it
      is of the last forward op a backward op is of (the loss's end of the model), so a pipeline
      keeps it, with the updates, on the stages of the forward ops.
    """
    if not phases:
        return
    first: dict[str, int] = {}
    phase_of: dict[int, str] = {}
    readers: dict[int, list[int]] = {}
    for v, phase, seq, _, _, inputs in phases:
        phase_of[v] = phase
        for src, _ in inputs:
            readers.setdefault(src, []).append(v)
        if phase == "forward" and seq != "-1":
            first.setdefault(seq, v)
    forward_of = {v: first[seq] for v, phase, seq, *_ in phases if phase == "backward" and seq in first}
    for ops in consumers.values():
        owner = next((v for v in ops if phase_of.get(v) == "forward"), None)
        for v in ops:
            if owner is not None and phase_of.get(v) == "update":
                forward_of.setdefault(v, owner)
    for v, phase, *_ in reversed(phases):  # a reader comes after: its forward op is known
        if phase == "backward" and v not in forward_of:
            of = next((forward_of[r] for r in readers.get(v, ()) if r in forward_of), None)
            if of is not None:
                forward_of[v] = of
    last = max(
        (first[seq] for _, phase, seq, *_ in phases if phase == "backward" and seq in first), default=-1
    )
    for v, phase, *_ in phases:
        if phase == "loss" and last >= 0:
            forward_of[v] = last
    for v, forward in forward_of.items():
        builder.set_forward_op(v, forward)
    previous = -1
    run: list[tuple[int, int, list[tuple[int, int]]]] = []  # the current autograd node's ops
    run_seq = None
    for v, phase, seq, after, outputs, inputs in phases:
        if phase in ("loss", "backward"):
            if not after and previous >= 0:
                builder.add_edge(previous, v, CONTROL_PORT)
            previous = v
        if phase != "backward" or seq != run_seq:
            _hold_run(builder, run)
            run, run_seq = [], seq if phase == "backward" else None
        if phase == "backward":
            run.append((v, outputs, inputs))
    _hold_run(builder, run)
    backward = [v for v, phase, *_ in phases if phase in ("loss", "backward")]
    updates = [v for v, phase, *_ in phases if phase == "update"]
    if not updates:
        return
    step = builder.add_op("optimizer/step", STEP_OP, [], is_backward=True, forward_op=last)
    for v in backward:
        builder.add_edge(v, step, CONTROL_PORT)
    for v in updates:
        builder.add_edge(step, v, CONTROL_PORT)


def _hold_saved(
    builder: GraphBuilder, phases: list[_Phase], producer: Mapping[str, tuple[int, int]], saved: Any
) -> None:
    """Give the last backward op of each autograd node an edge from each tensor the node saved
    (``saved``: [tensor name, sequence number], the traced step's ``baechi_saved``) that none of
    its backward ops reads (what they read is held to the last of them, :func:`_hold_run`): the
    engine releases a node's saved tensors when its backward returns, whether the backward reads
    them or only their sizes (a ``gather`` saves its whole input). As the synthesized step's
    saved-tensor edges (:mod:`baechi_cli.passes.training`), the edge keeps the tensor, or its
    copy on the backward op's device, until that op ends. A node whose backward traced no op
    keeps nothing here."""
    if not isinstance(saved, list) or not all(isinstance(s, list) and len(s) == 2 for s in saved):
        raise InputError("the traced step's baechi_saved is not a list of [tensor, sequence number]")
    last: dict[str, int] = {}
    read: dict[str, set[tuple[int, int]]] = {}  # what each node's backward ops read
    for v, phase, seq, *_, inputs in phases:
        if phase == "backward":
            last[seq] = v
            read.setdefault(seq, set()).update(inputs)
    for name, number in saved:
        seq = str(number)
        w, source = last.get(seq), producer.get(str(name))
        if w is not None and source is not None and source not in read[seq]:
            builder.add_edge(source[0], w, source[1])
            read[seq].add(source)


def _hold_run(builder: GraphBuilder, run: list[tuple[int, int, list[tuple[int, int]]]]) -> None:
    """Keep what one autograd node's ops make and read until its last op ends. What they make
    is held where it was made; what they read from outside the node gets an edge to the last op,
    which keeps it, or its copy on the node's device when it was made elsewhere, until then."""
    if len(run) < 2:
        return
    last = run[-1][0]
    mine = {v for v, _, _ in run}
    read_by_last = set(run[-1][2])
    for v, outputs, inputs in run:
        for port in range(outputs if v != last else 0):
            builder.hold_until(v, port, last)
        for src, port in inputs:
            if src in mine:
                builder.hold_until(src, port, last)
            elif (src, port) not in read_by_last:
                builder.add_edge(src, last, port)
                read_by_last.add((src, port))


def _with_sources_together(graph: OpGraph, write_groups: Sequence[Sequence[str]] = ()) -> OpGraph:
    """``graph`` with the ops of one program node in one colocation group: the forward ops traced
    from it (``linear``: ``t``, ``addmm``, ``view``) and, in a traced step, the backward and
    update ops of those forward ops (``forward_op``). A plan then places the program's nodes,
    which the runtime runs whole: autograd runs a node's backward where its forward ran, and a
    weight's bytes (on its first reader, the ``t``) sit where its node runs. The readers of a
    tied weight are in one group already (:func:`~baechi_cli.io.initializers.own_initializers`),
    so their nodes are too: a makespan plan keeps them on one device; a pipeline copies such a
    weight into each stage that reads it instead (maxload's ``tied``). The program nodes of each
    of ``write_groups`` (a tensor written in place and read around the write, which the runtime
    runs in one process: :func:`~baechi_cli.io.aliasing.write_groups`) share one group too, and a
    node reading weights alone shares the group of the one node reading it (:func:`_weight_views`).
    O(V + E)."""
    parent = list(graph.group)

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def union(a: int, b: int) -> None:
        a, b = find(a), find(b)
        if a != b:
            parent[max(a, b)] = min(a, b)

    ops_of = _forward_ops(graph)
    first = {source: ops[0] for source, ops in ops_of.items()}
    for ops in ops_of.values():
        for v in ops[1:]:
            union(ops[0], v)
    for names in write_groups:
        ops = [first[str(n)] for n in names if str(n) in first]
        for v in ops[1:]:
            union(ops[0], v)
    for v, reader in _weight_views(graph).items():
        if reader in first:
            union(v, first[reader])
    for v in range(graph.num_ops):
        forward = graph.forward_op[v]
        if graph.is_backward[v] and forward >= 0 and "_source" in graph.attrs[forward]:
            union(forward, v)
    group = [find(v) for v in range(graph.num_ops)]
    return graph if group == graph.group else graph.replace(group=group)


def _in_program_order(graph: OpGraph, takes: Mapping[str, Any]) -> OpGraph:
    """``graph`` with a control edge from a program node's last forward op to the first of each
    node that takes its tensor (``takes``: node -> the nodes it takes) where their traced ops share
    no edge: a node reading another's tensor for its dtype or size (``type_as``, ``zeros_like``)
    traces ops that do not read it, but the runtime runs the node, which needs the tensor, so a
    plan must not put it before that tensor. O(V + E)."""
    ops_of = _forward_ops(graph)
    linked = {
        (graph.attrs[s].get("_source"), graph.attrs[d].get("_source"))
        for s, d in zip(graph.edge_src, graph.edge_dst, strict=True)
    }
    missing = [
        (ops_of[m][-1], ops_of[n][0])
        for n, makers in sorted(takes.items())
        if n in ops_of
        for m in makers
        if m in ops_of and (m, n) not in linked
    ]
    if not missing:
        return graph
    builder = GraphBuilder.from_graph(graph)
    for src, dst in missing:
        builder.add_edge(src, dst, CONTROL_PORT)
    return builder.build()


def _forward_ops(graph: OpGraph) -> dict[str, list[int]]:
    """Each program node's forward ops in a traced step (``_source``, with a ``_phase``), in order. O(V)."""
    ops_of: dict[str, list[int]] = {}
    for v, attrs in enumerate(graph.attrs):
        source = attrs.get("_source")
        if source is not None and not graph.is_backward[v] and "_phase" in attrs:
            ops_of.setdefault(source, []).append(v)
    return ops_of


def _weight_views(graph: OpGraph) -> dict[int, str]:
    """The forward ops that read weights alone (a parameter's first reader with no input from
    another op: falcon's ``weight.T``) whose output one other program node reads: op -> that node.
    Apart from it, the whole weight would cross to it every microbatch, and its gradient back. O(E)."""
    fed = [False] * graph.num_ops
    readers: dict[int, set[str]] = {}
    for e in range(graph.num_edges):
        src, dst = graph.edge_src[e], graph.edge_dst[e]
        if graph.edge_port[e] == CONTROL_PORT or graph.is_backward[dst]:
            continue
        fed[dst] = True
        readers.setdefault(src, set()).add(graph.attrs[dst].get("_source"))
    out: dict[int, str] = {}
    for v, sources in readers.items():
        own = graph.attrs[v].get("_source")
        others = sources - {own}
        if (
            own is not None
            and not graph.is_backward[v]
            and graph.persistent_bytes[v] > 0
            and not fed[v]
            and len(others) == 1
            and None not in others
        ):
            out[v] = next(iter(others))
    return out


def _field(mapping: Mapping[str, Any], key: str, kind: type) -> Any:
    value = mapping.get(key)
    if not isinstance(value, kind):
        raise InputError(f"the program's {key} is missing or not a {kind.__name__}")
    return value


def _plain(arg: Mapping[str, Any]) -> Any:
    """A non-tensor argument's value (``as_int``, ``as_ints``, ``as_float``, ...), else its kind."""
    if len(arg) != 1:
        return None
    ((kind, value),) = arg.items()
    if kind in (
        "as_int",
        "as_ints",
        "as_float",
        "as_floats",
        "as_bool",
        "as_bools",
        "as_string",
        "as_strings",
    ):
        return value
    if kind == "as_none":
        return None
    return kind


def _op_type(target: str) -> str:
    """``torch.ops.aten.add.Tensor`` -> ``aten.add``; ``torch.ops.mylib.f.default`` -> ``mylib.f``."""
    parts = target.split(".")
    if len(parts) >= 4 and parts[:2] == ["torch", "ops"]:
        return f"{parts[2]}.{parts[3]}"
    return target


def _module_path(stack: str) -> str | None:
    """The innermost module path of an ``nn_module_stack`` string (``key,path,class;...``)."""
    if not stack:
        return None
    last = stack.split(";")[-1].split(",")
    return last[1] if len(last) >= 2 and last[1] else None


def _symbols(text: str) -> list[str]:
    """The symbol names in a srepr size expression, in order of first appearance."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return []
    out: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Symbol"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            name = str(node.args[0].value)
            if name not in out:
                out.append(name)
    return out


def _evaluate_size(node: ast.AST, binding: Mapping[str, int]) -> Any:
    """A srepr size expression on bound symbols; only the calls in :data:`_SIZE_FUNCTIONS`."""
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate_size(node.operand, binding)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "Symbol":
            return binding[str(node.args[0].value)]  # type: ignore[attr-defined]
        fn = _SIZE_FUNCTIONS.get(node.func.id)
        if fn is not None:
            return fn(*(_evaluate_size(a, binding) for a in node.args))
    raise ValueError("not a size expression")
