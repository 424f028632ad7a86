"""The committed ONNX test models (testdata/*.onnx), for tests to parametrize over.

``ONNX_MODELS`` lists them, each with the ``read_onnx`` options (``--batch-size``
/ ``--dim``) it needs and where its weights are; the models themselves are
described in testdata/README.md and made by testdata/generate_onnx.py, whose
``MODELS`` table this reads (importing it imports neither torch nor
TensorFlow)::

    from onnxmodels import ONNX_MODELS, onnx_model

    @pytest.mark.parametrize("model", ONNX_MODELS, ids=str)
    def test_reads(model):
        graph = read_onnx(str(model.path), **model.read_options)

    onnx_model("torch_transformer").cli_args  # ["--batch-size", "8", "--dim", "seq=128"]

Models with ``external=True`` keep their weights in ``<name>.onnx.data``
next to the graph; that file is git-ignored and absent from a fresh clone
(``make testdata`` writes it), so check ``weights_present`` before running one.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any, NamedTuple

TESTDATA = pathlib.Path(__file__).resolve().parent.parent / "testdata"
_GENERATE = TESTDATA / "generate_onnx.py"


@functools.cache
def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("baechi_testdata_generate_onnx", _GENERATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class OnnxModel(NamedTuple):
    name: str
    source: str  # "torch" (torch.onnx.export) or "keras" (tf2onnx)
    external: bool  # weights in <name>.onnx.data (git-ignored), else inline
    batch_size: int | None  # for a symbolic batch dim; None: the shapes are fixed
    dims: dict[str, int]  # other symbolic dims

    def __str__(self) -> str:  # pytest ids
        return self.name

    @property
    def path(self) -> pathlib.Path:
        return TESTDATA / f"{self.name}.onnx"

    @property
    def data_path(self) -> pathlib.Path | None:
        """The external weight file, or None when the weights are inline."""
        return TESTDATA / f"{self.name}.onnx.data" if self.external else None

    @property
    def weights_present(self) -> bool:
        """True when onnxruntime can run it: inline weights, or the external file exists."""
        return self.data_path is None or self.data_path.exists()

    @property
    def read_options(self) -> dict[str, Any]:
        """Keyword arguments for ``read_onnx`` (empty for fixed shapes)."""
        options: dict[str, Any] = {}
        if self.batch_size is not None:
            options["batch_size"] = self.batch_size
        if self.dims:
            options["dims"] = dict(self.dims)
        return options

    @property
    def cli_args(self) -> list[str]:
        """The same options for ``baechi place``."""
        args = [] if self.batch_size is None else ["--batch-size", str(self.batch_size)]
        for dim, value in self.dims.items():
            args += ["--dim", f"{dim}={value}"]
        return args


def _models() -> tuple[OnnxModel, ...]:
    models = []
    for name, spec in _generator().MODELS.items():
        source = "torch" if "torch" in spec.modules else "keras"
        models.append(OnnxModel(name, source, spec.external, spec.batch_size, dict(spec.dims or {})))
    return tuple(models)


ONNX_MODELS: tuple[OnnxModel, ...] = _models()
ONNX_MODEL_NAMES: tuple[str, ...] = tuple(m.name for m in ONNX_MODELS)


def onnx_model(name: str) -> OnnxModel:
    """The model called ``name``; KeyError for an unknown one."""
    for model in ONNX_MODELS:
        if model.name == name:
            return model
    raise KeyError(f"unknown ONNX test model {name!r}; known: {', '.join(ONNX_MODEL_NAMES)}")


def zero_weights_beside(proto: Any, directory: pathlib.Path) -> None:
    """Write an all-zero stand-in for each external weight file ``proto`` refers to, in ``directory``.

    The checker's full check wants the files to exist; a sparse file of the
    right length takes no disk. Use it for models whose weights are absent.
    """
    from onnx import external_data_helper

    ends: dict[str, int] = {}
    for t in proto.graph.initializer:
        if external_data_helper.uses_external_data(t):
            info = external_data_helper.ExternalDataInfo(t)
            ends[info.location] = max(ends.get(info.location, 0), info.offset + info.length)
    for location, end in ends.items():
        with open(directory / location, "wb") as f:
            f.truncate(end)
