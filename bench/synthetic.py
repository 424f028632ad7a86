"""Synthetic layered DAGs for benchmarks: deterministic for a given seed.

Each layer holds ``width`` ops; every op reads 1-3 ops of the previous two
layers. Costs are drawn so that communication and compute are of the same
order as in real training graphs (10-500 µs ops, 4 KB-4 MB tensors).

:func:`layered_dag` builds the graph in memory; :func:`write_workload_json`
writes the same graph (the same draws for the same seed) as a cost-annotated
workload JSON file, streamed, so a million-op file is written without holding
it: what ``baechi place`` reads at scale (bench/scale.py).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from baechi_cli.core.graph import GraphBuilder, OpGraph

_OUTPUT_BYTES = (4096, 65536, 1 << 20, 4 << 20)
_PERSISTENT_BYTES = (0, 0, 0, 1 << 20)


def _ops(rng: random.Random, num_ops: int) -> Iterator[tuple[int, float, int]]:
    """(output bytes, compute µs, persistent bytes) of every op, in id order."""
    for _ in range(num_ops):
        yield rng.choice(_OUTPUT_BYTES), rng.uniform(10.0, 500.0), rng.choice(_PERSISTENT_BYTES)


def _edges(rng: random.Random, num_ops: int, width: int) -> Iterator[tuple[int, int]]:
    """(producer, consumer) of every edge, by consumer then producer."""
    for v in range(width, num_ops):
        layer = v // width
        lo = max(0, (layer - 2) * width)
        hi = layer * width
        for u in sorted(rng.sample(range(lo, hi), k=rng.randint(1, 3))):
            yield u, v


def layered_dag(num_ops: int, width: int = 16, seed: int = 0) -> OpGraph:
    """The layered DAG of ``num_ops`` ops as an OpGraph (one output port per op). O(V)."""
    rng = random.Random(seed)
    b = GraphBuilder()
    for v, (nbytes, compute_us, persistent) in enumerate(_ops(rng, num_ops)):
        b.add_op(f"op{v}", "Synthetic", [nbytes], compute_us=compute_us, persistent_bytes=persistent)
    for u, v in _edges(rng, num_ops, width):
        b.add_edge(u, v)
    return b.build()


def write_workload_json(path: str, num_ops: int, width: int = 16, seed: int = 0) -> int:
    """Write :func:`layered_dag`'s graph as a workload JSON file; returns its edge count. O(V) time.

    Node ``id`` and ``name`` are ``v`` and ``op<v>``; ``fpgaLatency`` is the
    compute time in ms, ``size`` the persistent bytes; an edge's ``size`` is
    its producer's output bytes and it has no ``cost``, so the device spec's
    comm model times it. The workload format gives an op's output no memory
    of its own (its ``size`` holds it; baechi_cli/io/workload_json.py), so
    memory here is the weights plus the copies received from other devices.
    Memory: O(V) small ints for the output sizes, the file is streamed.
    """
    rng = random.Random(seed)
    output_bytes: list[int] = []
    edges = 0
    with open(path, "w", encoding="ascii") as f:
        f.write('{"nodes": [\n')
        for v, (nbytes, compute_us, persistent) in enumerate(_ops(rng, num_ops)):
            output_bytes.append(nbytes)
            node = {"id": v, "name": f"op{v}", "fpgaLatency": compute_us / 1000.0, "size": persistent}
            f.write(("" if v == 0 else ",\n") + json.dumps(node))
        f.write('\n], "edges": [\n')
        for u, v in _edges(rng, num_ops, width):
            edge = {"sourceId": u, "destId": v, "size": output_bytes[u]}
            f.write(("" if edges == 0 else ",\n") + json.dumps(edge))
            edges += 1
        f.write("\n]}\n")
    return edges
