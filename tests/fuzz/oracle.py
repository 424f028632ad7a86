"""Cases and the oracle: what a reader may do with a mutated input.

A case (:func:`make_case`) is a pure function of (run seed, target, index):
one generator, seeded with those three, picks a seed file and its
mutations, so any case can be regenerated from its number to be replayed
or saved.

The oracle (:func:`check`): the reader, called in-process as the CLI calls
it, must within :data:`TIME_LIMIT_S` either

* return a well-formed result (an OpGraph whose columns agree, with no
  negative or non-finite sizes and times, no dangling edge, unique names;
  a DeviceSpec with devices; a sidecar dict), or
* raise a :class:`~baechi_cli.core.errors.BaechiError` whose message is one line
  of at most :data:`MESSAGE_LIMIT` characters naming the input, with exit
  code 2 (bad input) or 5 (a missing optional dependency).

Anything else is a failure, described on one line: another exception (its
type and the innermost baechi_cli frame), a multi-line or anonymous
message, a hang (:class:`CaseTimeout`, raised by a SIGALRM timer), or a
MemoryError (the process's address space is capped, :func:`memory_limit`,
so a declared-huge shape that gets allocated fails fast instead of
swapping). :func:`signature` reduces a failure to what identifies the bug.
"""

from __future__ import annotations

import math
import random
import re
import resource
import signal
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baechi_cli.core.errors import EXIT_BAD_INPUT, EXIT_MISSING_DEPENDENCY, BaechiError
from fuzz.mutators import mutate_bytes
from fuzz.targets import TARGETS, Target

#: Seconds one reader call may take.
TIME_LIMIT_S = 5.0
#: Longest acceptable error message (a mutated node name may be long; the message should still be short).
MESSAGE_LIMIT = 2000
#: Address space a case may add to the process (RLIMIT_AS), in bytes.
MEMORY_HEADROOM = 2 << 30


class CaseTimeout(BaseException):
    """A case ran past its time limit (a BaseException: readers' ``except Exception`` must not catch it)."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` in the main thread after ``seconds`` (SIGALRM)."""

    def expire(signum: int, frame: Any) -> None:
        raise CaseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _address_space() -> int:
    """This process's virtual memory size in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextmanager
def memory_limit(headroom: int = MEMORY_HEADROOM) -> Iterator[None]:
    """Cap the address space at its current size plus ``headroom`` (the soft RLIMIT_AS), then restore it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + headroom
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@dataclass(frozen=True)
class Case:
    """One generated input: its bytes, the reader options, and how it was made (for reports)."""

    target: str
    index: int
    seed: str
    how: str
    data: bytes
    options: dict[str, Any]


def case_rng(run_seed: int, target: str, index: int) -> random.Random:
    """The generator of case ``index`` of ``target`` in run ``run_seed`` (str seeds hash stably)."""
    return random.Random(f"{run_seed}:{target}:{index}")


def make_case(target_name: str, run_seed: int, index: int) -> Case:
    """Case ``index``: a weighted seed, then structure-aware mutations, byte mutations, or both."""
    target = TARGETS[target_name]
    rng = case_rng(run_seed, target_name, index)
    seeds = target.seeds()
    seed = rng.choices(seeds, weights=[s.weight for s in seeds])[0]
    # Structure-aware mutations reach the checks past parsing; byte mutations mostly test parsing.
    how = rng.choices(("structure", "structure+bytes", "bytes"), weights=(60, 15, 25))[0]
    data = seed.data
    if how != "bytes":
        try:
            data = target.structure(rng, seed)
        except RecursionError:  # a document nested too deeply to re-serialize: mutate its bytes instead
            how = "bytes"
    if how != "structure":
        data = mutate_bytes(rng, data, [s.data for s in rng.sample(seeds, min(2, len(seeds)))])
    return Case(target_name, index, seed.name, how, data, target.options(rng, dict(seed.options)))


def _frame(err: BaseException) -> str:
    """``file:line`` of the innermost traceback frame in baechi_cli (else the innermost of all)."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "baechi_cli" in f.filename] or frames
    if not ours:
        return "?"
    f = ours[-1]
    return f"{f.filename.split('baechi_cli/')[-1]}:{f.lineno}"


@dataclass(frozen=True)
class Verdict:
    """The oracle's verdict on one case."""

    failure: str | None  # None: the reader behaved; else what it did wrong, on one line
    accepted: bool = False  # the reader returned a result (else it refused the input, or failed)


def check(target: Target, path: str, options: dict[str, Any], time_limit_s: float = TIME_LIMIT_S) -> Verdict:
    """Run ``target``'s reader on ``path`` and judge what it did (see the module docstring)."""
    try:
        with time_limit(time_limit_s):
            result = target.read(path, options)
    except BaechiError as err:
        return Verdict(_check_error(err, target, path))
    except CaseTimeout:
        return Verdict(f"hang: the reader ran past {time_limit_s:g} s")
    except MemoryError:
        return Verdict("MemoryError: the reader allocated past the memory cap")
    except Exception as err:  # everything else is a bug in the reader
        return Verdict(f"{type(err).__name__} at {_frame(err)}: {' '.join(str(err).split())[:200]}")
    return Verdict(check_result(result), accepted=True)


def _check_error(err: BaechiError, target: Target, path: str) -> str | None:
    message = str(err)
    where = _frame(err)
    if err.exit_code not in (EXIT_BAD_INPUT, EXIT_MISSING_DEPENDENCY):
        return f"{type(err).__name__} with exit code {err.exit_code} at {where}: {message[:200]}"
    if "\n" in message or "\r" in message:
        return f"multi-line error at {where}: {message[:200]!r}"
    if len(message) > MESSAGE_LIMIT:
        return f"error of {len(message)} characters at {where}: {message[:200]}"
    if not target.names_input(message, path):
        return f"error not naming the input at {where}: {message[:200]}"
    return None


def check_result(result: Any) -> str | None:
    """None when the reader's result is well formed (see the module docstring), else the problem."""
    from baechi_cli.core.devices import DeviceSpec
    from baechi_cli.core.graph import OpGraph

    if isinstance(result, OpGraph):
        return check_graph(result)
    if isinstance(result, DeviceSpec):
        if not result.devices or any(d.memory_bytes <= 0 for d in result.devices):
            return f"device spec without devices or memory: {result.source!r}"
        return None
    if isinstance(result, dict):  # a sidecar
        return None
    return f"the reader returned a {type(result).__name__}"


def _bad_amount(x: Any) -> bool:
    return not isinstance(x, (int, float)) or isinstance(x, bool) or not (0 <= x < math.inf)


def check_graph(g: Any) -> str | None:
    """The problem with OpGraph ``g`` that a later stage would trip over, or None. O(V + E)."""
    from baechi_cli.core.graph import CONTROL_PORT

    n = g.num_ops
    per_op = ("op_types", "output_bytes", "compute_us", "persistent_bytes", "temporary_bytes", "group")
    per_op += ("is_backward", "forward_op", "output_shapes", "output_dtypes", "attrs", "colocate_with")
    for column in per_op:
        if len(getattr(g, column)) != n:
            return f"graph column {column} has {len(getattr(g, column))} entries for {n} ops"
    if len(set(g.names)) != n:
        return "graph op names are not unique"
    for v in range(n):
        name = g.names[v]
        if any(_bad_amount(b) for b in g.output_bytes[v]):
            return f"op '{name}': output bytes {g.output_bytes[v]}"
        for column in ("compute_us", "persistent_bytes", "temporary_bytes"):
            if _bad_amount(getattr(g, column)[v]):
                return f"op '{name}': {column} {getattr(g, column)[v]!r}"
        if not 0 <= g.group[v] < n or not -1 <= g.forward_op[v] < n:
            return f"op '{name}': group {g.group[v]} or forward_op {g.forward_op[v]} out of range"
        if len(g.output_shapes[v]) != len(g.output_bytes[v]) or len(g.output_dtypes[v]) != len(
            g.output_bytes[v]
        ):
            return f"op '{name}': {len(g.output_bytes[v])} ports but shapes/dtypes of another length"
        for shape in g.output_shapes[v]:
            if shape is not None and any(not isinstance(d, int) or d < 0 for d in shape):
                return f"op '{name}': output shape {shape}"
    for e in range(g.num_edges):
        src, dst, port = g.edge_src[e], g.edge_dst[e], g.edge_port[e]
        if not (0 <= src < n and 0 <= dst < n):
            return f"edge {e} joins ops {src} -> {dst} of {n}"
        if port != CONTROL_PORT and not 0 <= port < len(g.output_bytes[src]):
            return f"edge {e} reads port {port} of '{g.names[src]}', which has {len(g.output_bytes[src])}"
        if _bad_amount(g.edge_bytes[e]):
            return f"edge {e}: bytes {g.edge_bytes[e]!r}"
        us = g.edge_transfer_us[e]
        if us is not None and _bad_amount(us):
            return f"edge {e}: transfer time {us!r}"
    return None


def check_case(case: Case, workdir: Path, time_limit_s: float = TIME_LIMIT_S) -> Verdict:
    """Write ``case`` into ``workdir`` as its target's file and :func:`check` it."""
    target = TARGETS[case.target]
    path = workdir / target.filename
    path.write_bytes(case.data)
    return check(target, str(path), case.options, time_limit_s)


def signature(failure: str) -> str:
    """What identifies the bug behind ``failure``: its kind and place (``ValueError at io/onnx.py:12``),
    or for a malformed result the problem without names and numbers."""
    head = failure.split(": ", 1)[0]
    if " at " in head or head in ("hang", "MemoryError"):
        return head
    return re.sub(r"'[^']*'|-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", "_", failure)[:120]
