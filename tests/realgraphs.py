"""Real-model TensorFlow training graphs for slow tests and bench/.

``real_graph(name)`` returns the path of ``<name>.pb`` (its sidecar is the
``.json`` next to it): the committed file in testdata/ when there is one, else
the one cached in ``testdata/cache/<TensorFlow version>/``, generated on first
use by testdata/generate.py (in a subprocess; needs TensorFlow, and tf_keras
for the Keras models; can take a minute). See testdata/README.md.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
from types import ModuleType

REAL_GRAPHS = ("inception_v3", "resnet50", "gnmt_static", "gnmt_dynamic", "transformer")

_GENERATE = pathlib.Path(__file__).resolve().parent.parent / "testdata" / "generate.py"


@functools.cache
def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("baechi_testdata_generate", _GENERATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def real_graph(name: str) -> pathlib.Path:
    """Path of the GraphDef ``<name>.pb`` (committed, or cached and generated if missing).

    Raises ModuleNotFoundError when the graph must be generated and TensorFlow
    (or tf_keras) is missing, so callers can skip; see ``ensure`` in
    testdata/generate.py for the other errors.
    """
    return _generator().ensure(name)
