"""Reading and writing files: the input formats and their registry (:mod:`.formats`; TensorFlow
GraphDef, ONNX, workload JSON), the placed model writers, Chrome traces, the GraphDef sidecar, the
PyTorch module paths of an ONNX export, and TensorFlow's run-time helpers (imported lazily). Nothing
here places or judges a plan.
"""
