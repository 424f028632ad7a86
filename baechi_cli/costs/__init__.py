"""What each op costs: per-op FLOP and byte rules in a registry (:mod:`.registry`, the TensorFlow
and ONNX tables), the analytic model that turns them into times on a device spec, memory rules,
measured profiles (``baechi profile``) and the communication fit. Counting is apart from device
rates, as in XLA's HloCostAnalysis.
"""
