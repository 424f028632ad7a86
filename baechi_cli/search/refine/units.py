"""The units a refinement moves and what ranking their moves needs, fixed for the whole search.

A *unit* is one colocation group of the graph (``graph.group_members()``, in order of the group's
first op): the search moves units, never single ops of a group. :class:`Units` holds, per unit,
its ops, its compute on each kind of device, and the tensors it sends to and gets from other
units with their transfer µs (a tensor's measured time, else the interconnect's latency plus its
bytes over the bandwidth), and, per pair of units that talk, the transfer µs between them.

Complexity: O(V + E + D) to build (D devices; each kind's compute column summed once); the numpy
pairs of :meth:`Units.tensor_pairs` O(P) over the P (tensor, consuming unit) pairs, on first use.
"""

from __future__ import annotations

import numpy as np

from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import OpGraph


class Units:
    """The units of ``graph`` and their costs on ``devices``."""

    def __init__(self, graph: OpGraph, devices: DeviceSpec) -> None:
        n = graph.num_ops
        self.ndev = devices.count
        # One unit per colocation group, in order of the group's first op.
        self.unit_ops: list[list[int]] = list(graph.group_members().values())
        self.unit_of = [0] * n
        for u, ops in enumerate(self.unit_ops):
            for v in ops:
                self.unit_of[v] = u
        self._build_costs(graph, devices)

    def _build_costs(self, g: OpGraph, devices: DeviceSpec) -> None:
        """Per-unit compute on each device; the transfer µs between each pair of units that talk."""
        nunits = len(self.unit_ops)
        kind_index: dict[str, int] = {}
        self.kind_columns: list[list[float]] = []  # per kind, in order of first device: each unit's compute
        self.kind_of: list[int] = []  # per device: its kind's index
        self.comp: list[list[float]] = []  # per device: its kind's column
        for d in devices.devices:
            k = kind_index.get(d.kind)
            if k is None:
                k = kind_index[d.kind] = len(kind_index)
                dur = g.durations(d.kind)
                self.kind_columns.append([sum(map(dur.__getitem__, ops)) for ops in self.unit_ops])
            self.kind_of.append(k)
            self.comp.append(self.kind_columns[k])
        # Empty devices are interchangeable when every device is alike.
        self.homogeneous = len(kind_index) == 1 and not devices.interconnect.links
        ic = devices.interconnect
        t = g.tensors
        unit_of = self.unit_of
        consumers: list[dict[int, None]] = [{} for _ in range(len(t.src))]
        for tid, w in zip(t.edge_tensor, g.edge_dst):
            consumers[tid][unit_of[w]] = None
        # Per tensor: producer unit, the other units consuming it, its transfer µs.
        self.t_prod: list[int] = []
        self.t_cons: list[list[int]] = []
        self.t_len: list[float] = []
        self.made: list[list[int]] = [[] for _ in range(nunits)]  # tensors a unit sends to others
        self.used: list[list[int]] = [[] for _ in range(nunits)]  # tensors a unit gets from others
        # For closing clusters: a tensor counts once per consuming unit, what it costs if that
        # unit is elsewhere (it overcounts a tensor that several units there share).
        adj: list[dict[int, float]] = [{} for _ in range(nunits)]
        made, used, latency, bandwidth = self.made, self.used, ic.latency_us, ic.bandwidth_bytes_per_us
        for tid, (src, m, nbytes, reading) in enumerate(zip(t.src, t.measured_us, t.nbytes, consumers)):
            p = unit_of[src]
            length = m if m is not None else latency + nbytes / bandwidth
            cons = [c for c in reading if c != p]
            self.t_prod.append(p)
            self.t_cons.append(cons)
            self.t_len.append(length)
            if cons:
                made[p].append(tid)
                out = adj[p]
                for c in cons:
                    used[c].append(tid)
                    out[c] = out.get(c, 0.0) + length
                    adj[c][p] = adj[c].get(p, 0.0) + length
        self.adj = adj
        self.degree = [len(m) + len(u) for m, u in zip(self.made, self.used)]
        # For big clusters in numpy: each kind's column, each device's kind.
        self.kind_array = np.array(self.kind_columns, dtype=np.float64)
        self.kind_of_array = np.array(self.kind_of, dtype=np.int64)
        self.pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see tensor_pairs
        self.total_compute = sum(self.comp[0])
        self.adj_total = [sum(a.values()) for a in adj]

    def __len__(self) -> int:
        return len(self.unit_ops)

    def tensor_pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (tensor, consuming unit) pair in numpy, as (tensor, consumer, producer unit), in
        tensor order, each tensor's consumers in :attr:`t_cons`'s order (made on first use, with
        :attr:`t_prod_array` and :attr:`t_len_array`)."""
        if self.pairs is None:
            t_cons = self.t_cons
            tensor = np.fromiter((t for t, cons in enumerate(t_cons) for _ in cons), dtype=np.int64)
            consumer = np.fromiter((c for cons in t_cons for c in cons), dtype=np.int64)
            self.t_prod_array = np.array(self.t_prod, dtype=np.int64)
            self.t_len_array = np.array(self.t_len, dtype=np.float64)
            self.pairs = tensor, consumer, self.t_prod_array[tensor]
        return self.pairs

    def loads(self, dev: list[int]) -> list[float]:
        """Each device's compute µs when unit ``u`` is on device ``dev[u]``."""
        loads = [0.0] * self.ndev
        for u, d in enumerate(dev):
            loads[d] += self.comp[d][u]
        return loads

    def op_devices(self, dev: list[int]) -> list[int]:
        """The device of each op when unit ``u`` is on device ``dev[u]``."""
        device_of = [0] * len(self.unit_of)
        for u, ops in enumerate(self.unit_ops):
            for v in ops:
                device_of[v] = dev[u]
        return device_of
