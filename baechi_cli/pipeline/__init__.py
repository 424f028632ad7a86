"""Pipeline parallelism under one name: the max-load model (:mod:`.maxload`), the optimal throughput
split (:mod:`.throughput`), the latency split (:mod:`.latency`), the microbatch schedules (GPipe, 1F1B,
interleaved, zero-bubble; :mod:`.schedules`), the ``--algo pipeline`` placer that drives them
(:mod:`.placer`), and the split of a PyTorch model into the stages a plan names (:mod:`.torch_split`).
"""
