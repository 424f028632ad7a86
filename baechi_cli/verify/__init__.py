"""``baechi verify``: check a placed graph statically against its original, and by running it.

Callers import the submodule that owns what they need; this package exports
nothing itself and importing it imports nothing else. By concern:

* :mod:`~baechi_cli.verify.report` -- :func:`~baechi_cli.verify.report.verify_graph`,
  the GraphDef entry the CLI calls, and its ``baechi.verify/v1`` report;
* :mod:`~baechi_cli.verify.static` -- devices and colocation of a placed GraphDef, without TensorFlow;
* :mod:`~baechi_cli.verify.diff` -- what tells a placed graph from its original (GraphDef; shared with ONNX);
* :mod:`~baechi_cli.verify.run` -- training the placed GraphDef in TensorFlow in a subprocess
  (``python -m baechi_cli.verify``, :mod:`baechi_cli.verify.__main__`);
* :mod:`~baechi_cli.io.sidecar` -- the sidecar JSON that says what such a run feeds and fetches;
* :mod:`~baechi_cli.verify.onnx` -- :func:`~baechi_cli.verify.onnx.verify_onnx`, the same for ONNX
  models, run in onnxruntime.

Rendering the reports for a terminal is :mod:`baechi_cli.cli.render.verify`'s.
"""
