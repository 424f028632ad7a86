"""Synthetic layered DAGs for benchmarks: deterministic for a given seed.

Each layer holds ``width`` ops; every op reads 1-3 ops of the previous two
layers. Costs are drawn so that communication and compute are of the same
order as in real training graphs (10-500 µs ops, 4 KB-4 MB tensors).
"""

from __future__ import annotations

import random

from baechi_cli.graph import GraphBuilder, OpGraph


def layered_dag(num_ops: int, width: int = 16, seed: int = 0) -> OpGraph:
    rng = random.Random(seed)
    b = GraphBuilder()
    for v in range(num_ops):
        b.add_op(
            f"op{v}",
            "Synthetic",
            [rng.choice((4096, 65536, 1 << 20, 4 << 20))],
            compute_us=rng.uniform(10.0, 500.0),
            persistent_bytes=rng.choice((0, 0, 0, 1 << 20)),
        )
    for v in range(width, num_ops):
        layer = v // width
        lo = max(0, (layer - 2) * width)
        hi = layer * width
        for u in sorted(rng.sample(range(lo, hi), k=rng.randint(1, 3))):
            b.add_edge(u, v)
    return b.build()
