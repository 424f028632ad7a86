"""A pipeline plan in the formats other tools read: torchtitan's module lists, torch's schedule CSV and
Megatron-Core's layout string.

A plan is a split of a PyTorch model's ops into stages, contiguous in program order, and a schedule.
``paths[i]`` is the innermost ``nn.Module`` path of the i-th op in program order (dotted FQN, ``""``
the root, None: none; :func:`baechi_cli.io.torch_modules.module_paths`) and ``stage_of[i]`` its
stage. Ops with path None (graph inputs, shape arithmetic) are ignored, their stages too; over the
others the stages are non-negative integers that never decrease, or :class:`InputError`.

- :func:`torchtitan_module_lists`: per stage, the module FQNs it holds, torchtitan's
  ``parallelism.module_fqns_per_model_part`` (``_pipeline_module_split`` builds one stage from each).
- :func:`schedule_csv`: what each rank runs, in the CSV ``torch.distributed.pipelining``'s
  ``_PipelineScheduleRuntime._load_csv(path, format="compute_only")`` reads (torchtitan's
  ``parallelism.pipeline_parallel_schedule_csv``).
- :func:`megatron_layout`: Megatron-Core's ``--pipeline-model-parallel-layout``, for a model whose
  body is one stack of identical layers.

Pure Python: nothing here imports torch. Complexity: O(N x D) for N ops and module depth D; the CSV
O(S·M) for S stages and M microbatches.

Example:
    >>> paths = ["tok_embeddings", "layers.0.attention", "layers.0", "layers.1.attention",
    ...          "layers.1", "norm", "output"]
    >>> torchtitan_module_lists(paths, [0, 0, 0, 1, 1, 1, 1])
    [['tok_embeddings', 'layers.0'], ['layers.1', 'norm', 'output']]
    >>> megatron_layout(paths, [0, 0, 0, 1, 1, 1, 1])
    'E,t|t,L'
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Sequence

from baechi_cli.core.errors import InputError
from baechi_cli.pipeline.schedules import device_orders


def torchtitan_module_lists(paths: Sequence[str | None], stage_of: Sequence[int]) -> list[list[str]]:
    """Per stage, the FQNs of the modules it holds: torchtitan's ``module_fqns_per_model_part``.

    Contract. A module M (not the root) *covers* op i when ``paths[i]`` is M
    or starts with ``M + "."``. Stage s lists each module whose ops all lie
    in s and none of whose enclosing modules (the root aside) does, in the
    order of their first ops there. A module whose ops straddle stages is
    not listed: its submodules are, recursively; one that has none (a
    module called from two stages, a shared activation, say) is listed in
    each stage that calls it, and each holds a copy of its weights, as
    torch's ``pipeline()`` copies a weight two stages read. Neither is a
    *stack* listed, a module with no op of its own whose submodules are all
    named by integers (an ``nn.ModuleList``/``ModuleDict`` of layers): its
    items are, as torchtitan writes ``layers.0``, ``layers.1`` even when one
    stage holds them all. Ops at the root, or directly in a module that
    straddles, are in no listed module: the stage whose copy of the model
    runs them keeps them in its ``forward``. The result has one list per
    stage, up to the last stage an op is in (a stage that holds no listed
    module: ``[]``). ``[]`` when no op has a path.

    Applying the lists as torchtitan does (each stage a copy of the model
    with the modules it does not list deleted) gives every parameter of a
    listed module to exactly one stage when stages begin where a module
    call begins (:func:`baechi_cli.pipeline.torch_split.stage_boundaries`)
    and no module is called from two. torchtitan's own splitter
    (``torchtitan.distributed.pipeline_parallel._split_module``, 0.3.0)
    reads only top-level modules and items of a top-level ModuleList or
    ModuleDict: ``layers.3`` and ``norm`` work there, ``layers.3.attention``
    (a cut inside a layer) and ``transformer.h.3`` (a nested stack) need a
    model-specific split.

    Raises :class:`InputError` when the sequences differ in length or a
    stage is not a non-negative integer or decreases. O(N x D).

    >>> paths = [None, "tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3.attention",
    ...          "layers.3", "norm", "output"]
    >>> torchtitan_module_lists(paths, [0, 0, 0, 0, 1, 1, 1, 1, 1])
    [['tok_embeddings', 'layers.0', 'layers.1'], ['layers.2', 'layers.3', 'norm', 'output']]
    >>> torchtitan_module_lists(paths, [0, 0, 0, 0, 0, 0, 1, 1, 1])
    [['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3.attention'], ['norm', 'output']]
    """
    ops = _checked(paths, stage_of)
    if not ops:
        return []
    modules: dict[str, dict[int, int]] = {}  # per module: its first op in each stage it is in
    direct: set[str] = set()  # modules with an op of their own
    for index, path, stage in ops:
        for module in _enclosing(path):
            modules.setdefault(module, {}).setdefault(stage, index)
        direct.add(path)
    children: dict[str, set[str]] = {}
    for module in modules:
        parent, _, name = module.rpartition(".")
        if parent:
            children.setdefault(parent, set()).add(name)
    stacks = {m for m, names in children.items() if m not in direct and all(n.isdigit() for n in names)}
    split = {m for m, stages in modules.items() if len(stages) > 1 or m in stacks}
    listed: list[tuple[int, int, str]] = []  # (first op there, stage, module)
    for module, stages in modules.items():
        if all(a in split for a in _enclosing(module)[:-1]):
            if module not in split or module not in children:  # whole, or a leaf called from several
                listed += [(index, stage, module) for stage, index in stages.items()]
    lists: list[list[str]] = [[] for _ in range(ops[-1][2] + 1)]
    for _, stage, module in sorted(listed):
        lists[stage].append(module)
    return lists


def schedule_csv(schedule: str, num_stages: int, num_devices: int, microbatches: int) -> str:
    """What each rank runs under ``schedule``, as torch's compute-only pipeline schedule CSV.

    Contract. One line per device (rank) in rank order, its ops in the order
    baechi simulated them (:func:`baechi_cli.pipeline.schedules.device_orders`
    of a training step), comma-separated, each as torch's ``_Action`` writes
    it: stage, kind, microbatch (``0F0``, ``3B1``; under ``zbv`` ``I`` and
    ``W`` for a backward's input- and weight-gradient parts). No padding:
    torch's runtime waits on its receives, not on slots. Load it with
    ``_PipelineScheduleRuntime(stages, microbatches, ...)._load_csv(path)``
    (torchtitan: ``parallelism.pipeline_parallel_schedule_csv``); the rank
    that runs a stage is read from the file, so each rank builds the stages
    of its line (:func:`baechi_cli.pipeline.schedules.stage_devices`).

    Raises :class:`InputError` for an unknown schedule, counts that are not
    positive integers, or stages the schedule cannot lay on the devices.
    O(S·M).

    >>> print(schedule_csv("1f1b", 2, 2, 3), end="")
    0F0,0F1,0B0,0F2,0B1,0B2
    1F0,1B0,1F1,1B1,1F2,1B2
    >>> print(schedule_csv("zbv", 4, 2, 2), end="")
    0F0,0F1,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1
    1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,2I1,2W1,1I1,1W1
    """
    for name, value in (("num_stages", num_stages), ("num_devices", num_devices)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    orders = device_orders(schedule, num_stages, num_devices, microbatches, training=True)
    return "".join(",".join(f"{s}{kind}{m}" for kind, s, m in order) + "\n" for order in orders)


def megatron_layout(paths: Sequence[str | None], stage_of: Sequence[int]) -> str | None:
    """Megatron-Core's ``--pipeline-model-parallel-layout`` of the split, or None where it has none.

    Contract. The model's body must be a *stack*: the module P with no op of
    its own whose submodules are ``P.0`` .. ``P.<L-1>`` (``layers.3``,
    ``transformer.h.3``, ``model.layers.3``), each layer's ops contiguous, in
    index order, with the same sequence of paths relative to their layer,
    and no op with a path between the first layer's first op and the last
    layer's last op outside the stack. Of several such modules none of which
    is inside another, the one with the most layers (None on a tie). What
    runs before the stack is the embedding ``E``, what runs after it the
    loss ``L`` (final norm, head and loss: Megatron builds the final norm on
    the loss's stage); each must lie in one stage (without ops, ``E`` goes to
    the first layer's stage, ``L`` to the last's). A layer is ``t``.

    The string lists the stages in order, ``|`` between them, each as ``E``,
    ``t`` or ``t*k`` for k layers, and ``L``, comma-separated (Megatron drops
    commas); a stage with nothing is empty (``E||t|L``). Megatron's stage
    ``v·D + r`` runs on rank ``r`` of ``D`` (pass
    ``--pipeline-model-parallel-size D``): baechi's ``interleaved`` and
    one-stage-per-device placements, not ``zbv``'s V. None when there is no
    such stack or a stage boundary falls inside a layer, ``E`` or ``L``.
    Errors as :func:`torchtitan_module_lists`. O(N x D).

    >>> paths = ["model.embed_tokens", "model.layers.0.self_attn", "model.layers.0.mlp",
    ...          "model.layers.1.self_attn", "model.layers.1.mlp", "model.layers.2.self_attn",
    ...          "model.layers.2.mlp", "model.norm", "lm_head"]
    >>> megatron_layout(paths, [0, 0, 0, 0, 0, 1, 1, 1, 1]), megatron_layout(paths, [0] * 9)
    ('E,t*2|t,L', 'E,t*3,L')
    >>> megatron_layout(paths, [0, 0, 1, 1, 1, 1, 1, 1, 1]) is None  # a cut inside layer 0
    True
    """
    ops = _checked(paths, stage_of)
    found = _stack(ops)
    if found is None:
        return None
    prefix, layers = found
    layer_stage: list[set[int]] = [set() for _ in range(layers)]
    before: set[int] = set()
    after: set[int] = set()
    start = len(prefix) + 1
    for _, path, stage in ops:
        if path.startswith(prefix + "."):
            layer_stage[int(path[start:].partition(".")[0])].add(stage)
        elif layer_stage[-1]:
            after.add(stage)
        elif not layer_stage[0]:
            before.add(stage)
        else:
            return None  # between two layers, outside the stack
    if any(len(stages) != 1 for stages in layer_stage) or len(before) > 1 or len(after) > 1:
        return None
    per_layer = [stages.pop() for stages in layer_stage]
    embedding = before.pop() if before else per_layer[0]
    loss = after.pop() if after else per_layer[-1]
    held = Counter(per_layer)
    parts = []
    for stage in range(loss + 1):
        count = held[stage]
        tokens = ["E"] if stage == embedding else []
        tokens += [] if count == 0 else ["t"] if count == 1 else [f"t*{count}"]
        tokens += ["L"] if stage == loss else []
        parts.append(",".join(tokens))
    return "|".join(parts)


# ----------------------------------------------------------------- internals


def _checked(paths: Sequence[str | None], stage_of: Sequence[int]) -> list[tuple[int, str, int]]:
    """(index, path, stage) of each op with a path, in program order; InputError for bad input."""
    if isinstance(paths, str) or isinstance(stage_of, str):
        raise InputError("paths and stage_of must be sequences, one entry per op")
    if len(paths) != len(stage_of):
        raise InputError(f"{len(paths)} module paths but {len(stage_of)} stages: one of each per op")
    ops = []
    last = 0
    for i, (path, stage) in enumerate(zip(paths, stage_of)):
        if path is None:
            continue
        if not isinstance(path, str):
            raise InputError(f"op {i}: a module path must be a string or None, got {path!r}")
        if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or stage < 0:
            raise InputError(f"op {i}: a stage must be a non-negative integer, got {stage!r}")
        if stage < last:
            raise InputError(
                f"op {i}: in stage {stage} after an op in stage {last}: stages never decrease in "
                "program order"
            )
        last = int(stage)
        ops.append((i, path, last))
    return ops


def _enclosing(path: str) -> list[str]:
    """The modules covering an op of ``path``, outermost first, the root left out."""
    if not path:
        return []
    atoms = path.split(".")
    return [".".join(atoms[:k]) for k in range(1, len(atoms) + 1)]


def _stack(ops: list[tuple[int, str, int]]) -> tuple[str, int] | None:
    """The model's stack of identical layers (:func:`megatron_layout`): its path and layer count."""
    direct = {path for _, path, _ in ops}
    children: dict[str, set[str]] = {}
    # per container with an integer-named submodule, per item: the paths of its ops relative to the
    # item, and their positions among the ops
    relative: dict[str, dict[str, list[str]]] = {}
    positions: dict[str, dict[str, list[int]]] = {}
    for position, (_, path, _) in enumerate(ops):
        atoms = path.split(".") if path else []
        for k in range(1, len(atoms)):
            container, item = ".".join(atoms[:k]), atoms[k]
            children.setdefault(container, set()).add(item)
            if item.isdigit():
                relative.setdefault(container, {}).setdefault(item, []).append(".".join(atoms[k + 1 :]))
                positions.setdefault(container, {}).setdefault(item, []).append(position)
    candidates = []
    for container, by_item in relative.items():
        count = len(by_item)
        if container in direct or children[container] != {str(k) for k in range(count)}:
            continue
        spans = [positions[container][str(k)] for k in range(count)]
        contiguous = all(p[-1] - p[0] + 1 == len(p) for p in spans)
        in_order = all(a[-1] < b[0] for a, b in zip(spans, spans[1:]))
        identical = all(by_item[str(k)] == by_item["0"] for k in range(count))
        if contiguous and in_order and identical:
            candidates.append((container, count))
    outermost = [(c, n) for c, n in candidates if not any(c.startswith(o + ".") for o, _ in candidates)]
    if not outermost:
        return None
    most = max(n for _, n in outermost)
    best = [(c, n) for c, n in outermost if n == most]
    return best[0] if len(best) == 1 else None
