"""What baechi knows about TensorFlow at run time: device names, error messages, session settings.

Shared by the cost model (:mod:`baechi_cli.costs.measured`, :mod:`baechi_cli.costs.comm`)
and ``baechi verify`` (:mod:`baechi_cli.verify`), which must not depend on each other.
Importing this module never imports TensorFlow: the device-name and message
helpers are pure string functions, :func:`require_tensorflow` only looks for the
package, and :func:`as_written_config` takes the imported ``tf`` module from its
caller, who decides when (and with which environment) TensorFlow is imported.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from baechi_cli.core.errors import MissingDependencyError, one_line

#: TensorFlow messages are cut to this many characters unless a caller asks for fewer.
MESSAGE_LIMIT = 400

# "/device:GPU:1", "/GPU:1", "/gpu:1", "/job:localhost/replica:0/task:0/device:GPU:1", "CPU:0".
_DEVICE_RE = re.compile(
    r"^(?:/job:(?P<job>[^/]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"/?(?:device:)?(?P<type>[A-Za-z_]+):(?P<index>\d+)$"
)
_LOCAL = ("localhost", 0, 0)
# Lines of a TensorFlow error that say where, not what.
_BOILERPLATE = ("[[", "Detected at node", "Node:", "Graph execution error")
_TRAILING_NODE_RE = re.compile(r"\s*\[\[.*\]\]\s*$")
_NODE_REF_RE = re.compile(r"\{\{(?:node|colocation_node) ([^}]*)\}\}")


# --- device names ---------------------------------------------------------------


def normalize_device(device: str) -> str:
    """One spelling per device: ``/device:TYPE:i``, with ``/job:.../replica:.../task:...``
    in front only when it is not the local ``localhost/0/0``; "" for none.

    Strings that do not name one device (``/job:ps``, ``/device:GPU:*``) come
    back stripped but otherwise unchanged.

    >>> normalize_device("/gpu:1"), normalize_device("/job:localhost/replica:0/task:0/device:GPU:1")
    ('/device:GPU:1', '/device:GPU:1')
    >>> normalize_device("/job:worker/task:1/GPU:0")
    '/job:worker/replica:0/task:1/device:GPU:0'
    """
    device = device.strip()
    match = _DEVICE_RE.match(device)
    if match is None:
        return device
    where = (match["job"] or "localhost", int(match["replica"] or 0), int(match["task"] or 0))
    prefix = "" if where == _LOCAL else f"/job:{where[0]}/replica:{where[1]}/task:{where[2]}"
    return f"{prefix}/device:{match['type'].upper()}:{int(match['index'])}"


def device_index(device: str) -> int | None:
    """The index ``i`` of a local ``GPU:i`` or ``CPU:i``; None for any other device.

    >>> device_index("/device:GPU:3"), device_index("/job:worker/task:1/GPU:0"), device_index("TPU:0")
    (3, None, None)
    """
    match = _DEVICE_RE.match(device.strip())
    if match is None or match["type"].upper() not in ("GPU", "CPU"):
        return None
    where = (match["job"] or "localhost", int(match["replica"] or 0), int(match["task"] or 0))
    return int(match["index"]) if where == _LOCAL else None


def map_device(device: str) -> str:
    """The CPU device that stands in for ``device`` when GPUs are emulated; "" when unconstrained.

    ``/device:GPU:i`` and ``/device:CPU:i`` both become ``/device:CPU:i`` (in
    any spelling TensorFlow accepts); other strings are returned unchanged so
    that TensorFlow reports them.

    >>> map_device("/gpu:2"), map_device("/device:TPU:0")
    ('/device:CPU:2', '/device:TPU:0')
    """
    if not device:
        return ""
    match = _DEVICE_RE.match(device.strip())
    if match is None or match["type"].upper() not in ("GPU", "CPU"):
        return device
    return f"/device:CPU:{int(match['index'])}"


# --- messages -------------------------------------------------------------------


def shorten_tf_message(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """The informative line of a TensorFlow error message, on one line of at most ``limit`` characters.

    Skips the lines that only say where (``Graph execution error:``,
    ``Detected at node ...``, ``Node: ...``, ``[[...]]``), drops the ``[[{{node x}}]]``
    TensorFlow appends and unwraps ``{{node x}}`` to ``x``; then :func:`~baechi_cli.core.errors.one_line`.
    A message with no such line is squashed whole.

    >>> shorten_tf_message("Graph execution error:\\n\\nNode: 'a'\\nCannot colocate {{node a}}\\n [[{{node a}}]]")
    'Cannot colocate a'
    """
    for line in message.splitlines():
        line = line.strip()
        if not line or line.startswith(_BOILERPLATE):
            continue
        return one_line(_NODE_REF_RE.sub(r"\1", _TRAILING_NODE_RE.sub("", line)), limit)
    return one_line(message, limit)


# --- TensorFlow itself ----------------------------------------------------------


def import_tensorflow() -> Any:
    """``import tensorflow`` with OR-Tools' solvers loaded first; ImportError as ``import`` raises it.

    Observed with TensorFlow 2.21 and OR-Tools 9.15: in a process that
    imported TensorFlow first, HiGHS (m-SCT's LP) and CP-SAT (``--algo
    exact``, auto's exact stage) die with SIGSEGV; the other order works. A
    GraphDef without ``_output_shapes`` makes the reader import TensorFlow
    for shape inference before any placer runs, so every import goes here.
    """
    import ortools.linear_solver.pywraplp  # noqa: F401
    import ortools.sat.python.cp_model  # noqa: F401
    import tensorflow as tf

    return tf


def require_tensorflow(message: str) -> None:
    """Raise MissingDependencyError (exit 5) with ``message`` unless TensorFlow is installed.

    Never imports it: importing is the caller's, who may need to set the
    environment first.
    """
    if importlib.util.find_spec("tensorflow") is None:
        raise MissingDependencyError(message)


def as_written_config(tf: Any, cpus: int | None = None) -> Any:
    """A TF1 ``ConfigProto`` under which a session runs a graph as written.

    No soft placement (an impossible placement is an error, not a silent
    move), all of grappler off (``disable_meta_optimizer``: its remapper
    fuses ops across devices, its constant folding replaces nodes) and the
    classic graph optimizer at ``L0`` (no constant folding, no CSE), so the
    nodes that run are the GraphDef's, under their own names. ``cpus`` sets
    ``device_count["CPU"]``: that many logical CPU devices. Callers add
    their own settings (threads, GPU memory) to the returned proto.
    """
    config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    if cpus is not None:
        config.device_count["CPU"] = cpus
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return config
