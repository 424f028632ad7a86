"""Timelines (``--trace``): a simulated step as Chrome trace-event JSON.

``build_trace(graph, devices, sim, title=...)`` turns a :class:`SimResult` into
the JSON object form of the Trace Event Format, ``{"traceEvents": [...],
"displayTimeUnit": "ms", "otherData": {...}}``, which Perfetto
(ui.perfetto.dev) and chrome://tracing open. ``write_trace`` writes it as
compact JSON, atomically; the same input gives the same bytes.

Times are in microseconds (the format's unit), rounded to whole nanoseconds.
Both ends of every interval go through the same monotone rounding, so
intervals that do not overlap in the simulation do not overlap in the trace.

Each device is a process; its threads (``tid`` unique across the trace, as Perfetto
identifies threads by ``tid`` alone) are ``compute`` (one ``X`` slice per op that takes
time), ``0 µs ops`` (zero-length slices on a track of their own, so they do not capture
the flow arrows meant for real ops; after :data:`MAX_STACK` coincident ones a new track),
transfer tracks (``channel`` in sequential mode; ``recv 1``, ``recv 2``, ... by greedy
interval partitioning in parallel mode, so no track holds two overlapping slices) and
``memory`` counter events. Flow arrows link each producer to its transfer and each
transfer to the ops it feeds; they are legacy ``s``/``f`` flow events, since the newer
``bind_id`` fields allow one arrow per slice. Timestamps and the file's order are chosen so
that Perfetto binds every flow to the right slice. The full layout and why each choice
binds: docs/formats.md, "Timelines".

The output is linear in ops, edges and transfers; building it takes
O((V + E) log V + T log T) time for V ops, E edges and T transfers.
"""

from __future__ import annotations

import gc
import heapq
import json
from typing import TYPE_CHECKING, Any

from baechi_cli import __version__
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.graph import CONTROL_PORT, OpGraph
from baechi_cli.io.files import write_atomic

if TYPE_CHECKING:
    from baechi_cli.evaluator.sim import SimResult

# Coincident 0 µs ops stacked on one track before the next one is opened
# (Perfetto's slice tracker drops slices nested deeper than 512).
MAX_STACK = 500

Event = dict[str, Any]


def build_trace(graph: OpGraph, devices: DeviceSpec, sim: SimResult, *, title: str = "") -> dict[str, Any]:
    """The trace of ``sim``, a simulation of ``graph`` on ``devices`` (see the module docstring)."""
    # A large trace is millions of small acyclic dicts; the cyclic collector would
    # rescan them again and again as they pile up (nearly half the build time).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(graph, devices, sim, title)
    finally:
        if enabled:
            gc.enable()


def _build(graph: OpGraph, devices: DeviceSpec, sim: SimResult, title: str) -> dict[str, Any]:
    n, ndev = graph.num_ops, devices.count
    names, types, dev_names = graph.names, graph.op_types, devices.names
    device_of = sim.device_of
    sequential = devices.interconnect.mode == "sequential"
    start = [round(t * 1000) for t in sim.start]  # ns
    end = [round(t * 1000) for t in sim.end]
    xfers = sim.transfers

    # Transfer slices: (device, ts ns, end ns, cat), one or two per transfer.
    slices: list[tuple[tuple[int, int, int, str], ...]] = []
    for t in xfers:
        recv = (t.dst_device, round(t.recv_start * 1000), round(t.end * 1000))
        if sequential:
            send = (t.src_device, round(t.send_start * 1000), round(t.send_end * 1000))
            slices.append(((*send, "send"), (*recv, "recv")))
        else:
            slices.append(((*recv, "transfer"),))

    # --- tracks -------------------------------------------------------------------
    lane_of, lane_counts = _transfer_lanes(slices, ndev)
    zero_lane = [-1] * n  # stack track of a 0 µs op; -1: the compute track
    zero_counts = [0] * ndev
    coincident: dict[tuple[int, int], int] = {}
    for v in range(n):
        if end[v] == start[v]:
            key = (device_of[v], start[v])
            k = coincident.get(key, 0)
            coincident[key] = k + 1
            zero_lane[v] = k // MAX_STACK
            zero_counts[device_of[v]] = max(zero_counts[device_of[v]], zero_lane[v] + 1)

    meta: list[Event] = []
    compute_tid: list[int] = []
    zero_tids: list[list[int]] = []
    xfer_tids: list[list[int]] = []
    tid = ndev + 1  # no tid equals a pid: Perfetto takes tid == pid for a main thread
    for d in range(ndev):
        threads = ["compute"]
        threads += [f"0 µs ops {i + 1}" if i else "0 µs ops" for i in range(zero_counts[d])]
        if sequential:
            threads += [f"channel {i + 1}" if i else "channel" for i in range(lane_counts[d])]
        else:
            threads += [f"recv {i + 1}" for i in range(lane_counts[d])]
        tids = list(range(tid, tid + len(threads)))
        tid += len(threads)
        compute_tid.append(tids[0])
        zero_tids.append(tids[1 : 1 + zero_counts[d]])
        xfer_tids.append(tids[1 + zero_counts[d] :])
        pid = d + 1
        # Every event names its tid: one without defaults to tid = pid (see above).
        meta.append(_meta("process_name", pid, tids[0], {"name": dev_names[d]}))
        meta.append(_meta("process_sort_index", pid, tids[0], {"sort_index": d}))
        for i, (thread, t_id) in enumerate(zip(threads, tids)):
            meta.append(_meta("thread_name", pid, t_id, {"name": thread}))
            meta.append(_meta("thread_sort_index", pid, t_id, {"sort_index": i}))

    feeds = _feeds(graph, sim)
    out_xfers: list[list[int]] = [[] for _ in range(n)]
    for x, t in enumerate(xfers):
        out_xfers[t.src_op].append(x)
    rank = [0] * n
    for i, v in enumerate(graph.topo_order()):
        rank[v] = i

    # --- events in causal order, each slice followed by its flow events -----------
    events: list[Event] = []
    emit = events.append
    arrows_in: list[list[tuple[int, str]]] = [[] for _ in range(n)]  # (flow id, name) into an op
    first_in = [0] * len(xfers)  # flow id of the arrow from each transfer's producer
    next_id = 1

    def flow(ph: str, fid: int, name: str, ts: int, pid: int, t_id: int) -> None:
        ev: Event = {
            "name": name,
            "cat": "flow",
            "ph": ph,
            "id": fid,
            "ts": ts / 1000,
            "pid": pid,
            "tid": t_id,
        }
        if ph == "f":
            ev["bp"] = "e"
        emit(ev)

    for u in sorted(range(n), key=lambda v: (start[v], rank[v])):
        d = device_of[u]
        pid, t_id = d + 1, compute_tid[d] if zero_lane[u] < 0 else zero_tids[d][zero_lane[u]]
        ts, stop = start[u], end[u]
        emit(
            {
                "name": names[u],
                "cat": types[u],
                "ph": "X",
                "ts": ts / 1000,
                "dur": (stop - ts) / 1000,
                "pid": pid,
                "tid": t_id,
                "args": {"op_type": types[u], "op_id": u, "duration_us": sim.end[u] - sim.start[u]},
            }
        )
        for fid, label in arrows_in[u]:
            flow("f", fid, label, ts, pid, t_id)
        for x in out_xfers[u]:
            first_in[x] = next_id
            flow("s", next_id, _label(names, u, xfers[x].port), _last(ts, stop), pid, t_id)
            next_id += 1
        # This op's transfers follow it, ahead of every op they feed.
        for x in out_xfers[u]:
            t = xfers[x]
            label = _label(names, u, t.port)
            src, dst = dev_names[t.src_device], dev_names[t.dst_device]
            incoming = first_in[x]
            for (dd, xts, xstop, cat), lane in zip(slices[x], lane_of[x]):
                xpid, xtid = dd + 1, xfer_tids[dd][lane]
                emit(
                    {
                        "name": f"{label} <- {src}" if cat == "recv" else f"{label} -> {dst}",
                        "cat": cat,
                        "ph": "X",
                        "ts": xts / 1000,
                        "dur": (xstop - xts) / 1000,
                        "pid": xpid,
                        "tid": xtid,
                        "args": {
                            "bytes": t.nbytes,
                            "producer": names[u],
                            "port": t.port,
                            "src": src,
                            "dst": dst,
                            "transfer_us": t.end - t.recv_start,
                        },
                    }
                )
                flow("f", incoming, label, xts, xpid, xtid)
                if cat == "send":
                    # The receive may start before the send ends: leave from the send's start.
                    incoming = next_id
                    flow("s", next_id, label, xts, xpid, xtid)
                    next_id += 1
                    continue
                for v in feeds[x]:
                    arrows_in[v].append((next_id, label))
                    flow("s", next_id, label, _last(xts, xstop), xpid, xtid)
                    next_id += 1

    for d in range(ndev):
        pid, t_id = d + 1, compute_tid[d]
        for time, level in sim.memory_curve[d]:
            emit(
                {
                    "name": "memory",
                    "ph": "C",
                    "ts": round(time * 1000) / 1000,
                    "pid": pid,
                    "tid": t_id,
                    "args": {"bytes": level},
                }
            )

    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ms",
        "otherData": {
            "title": title,
            "generator": f"baechi {__version__}",
            "comm_mode": devices.interconnect.mode,
            "step_time_us": sim.step_time_us,
            "ops": n,
            "transfers": len(xfers),
        },
    }


def merge_traces(traces: list[dict[str, Any]]) -> dict[str, Any]:
    """Several timelines in one file (``baechi compare --trace``): one group of processes each.

    Each trace's processes, threads and flow ids are shifted past the previous
    trace's, and its process names get the trace's title as a prefix, so the
    placements show one under another in Perfetto.
    """
    events: list[Event] = []
    pid_base = tid_base = id_base = 0
    for trace in traces:
        title = trace["otherData"].get("title", "")
        own = trace["traceEvents"]
        max_pid = max((e["pid"] for e in own), default=0)
        max_tid = max((e["tid"] for e in own), default=0)
        max_id = max((e["id"] for e in own if "id" in e), default=0)
        for e in own:
            e = dict(e, pid=e["pid"] + pid_base, tid=e["tid"] + tid_base)
            if "id" in e:
                e["id"] += id_base
            if e["ph"] == "M" and e["name"] == "process_name" and title:
                e["args"] = {"name": f"{title}: {e['args']['name']}"}
            elif e["ph"] == "M" and e["name"] == "process_sort_index":
                e["args"] = {"sort_index": e["args"]["sort_index"] + pid_base}
            events.append(e)
        pid_base += max_pid
        tid_base += max_tid
        id_base += max_id
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": f"baechi {__version__}",
            "titles": [t["otherData"].get("title", "") for t in traces],
        },
    }


def write_trace(path: str, trace: dict[str, Any]) -> None:
    """Write ``trace`` as compact UTF-8 JSON, atomically.

    Nothing follows the closing brace: Perfetto's reader can take trailing
    bytes for data after the end of the trace and fail.
    """
    text = json.dumps(trace, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    write_atomic(path, text.encode("utf-8"))


def _label(names: list[str], op: int, port: int) -> str:
    return f"^{names[op]}" if port == CONTROL_PORT else f"{names[op]}:{port}"


def _last(ts: int, stop: int) -> int:
    """The latest nanosecond that still lies inside the slice [ts, stop)."""
    return stop - 1 if stop > ts else ts


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> Event:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _feeds(graph: OpGraph, sim: SimResult) -> list[list[int]]:
    """The ops each transfer delivers to, grouped the way ``sim`` groups edges into transfers."""
    device_of = sim.device_of
    by_key: dict[tuple[int, int, int], list[int]] = {}
    for x, t in enumerate(sim.transfers):
        by_key.setdefault((t.src_op, t.port, t.dst_device), []).append(x)
    consumers: dict[tuple[int, int, int], list[int]] = {}
    for u, port, v in zip(graph.edge_src, graph.edge_port, graph.edge_dst):
        if device_of[u] != device_of[v]:
            consumers.setdefault((u, port, device_of[v]), []).append(v)
    feeds: list[list[int]] = [[] for _ in sim.transfers]
    for key, group in by_key.items():
        ops = consumers.get(key, [])
        if len(group) == 1:
            feeds[group[0]] = sorted(set(ops))
        else:  # simulated without caching: one transfer per edge, in edge order
            for x, v in zip(group, ops):
                feeds[x] = [v]
    return feeds


def _transfer_lanes(
    slices: list[tuple[tuple[int, int, int, str], ...]], ndev: int
) -> tuple[list[list[int]], list[int]]:
    """Lane of every transfer slice on its device, and the number of lanes per device."""
    intervals: list[list[tuple[int, int]]] = [[] for _ in range(ndev)]
    owners: list[list[tuple[int, int]]] = [[] for _ in range(ndev)]  # (transfer, slice)
    for x, parts in enumerate(slices):
        for k, (d, ts, stop, _) in enumerate(parts):
            # In half-nanoseconds, a 0-length slice widened to half a nanosecond:
            # then "overlap" is what one track cannot show (a 0-length slice where
            # another starts or sits), while slices that merely touch may share.
            intervals[d].append((2 * ts, 2 * stop if stop > ts else 2 * ts + 1))
            owners[d].append((x, k))
    lane_of = [[0] * len(parts) for parts in slices]
    counts = [0] * ndev
    for d in range(ndev):
        lanes = _partition(intervals[d])
        counts[d] = max(lanes, default=-1) + 1
        for (x, k), lane in zip(owners[d], lanes):
            lane_of[x][k] = lane
    return lane_of, counts


def _partition(intervals: list[tuple[int, int]]) -> list[int]:
    """Lane of each half-open interval: greedy by start, lowest free lane first.

    Uses as many lanes as intervals overlap at the worst instant (optimal for
    interval graphs); deterministic; O(k log k).
    """
    lanes = [0] * len(intervals)
    busy: list[tuple[int, int]] = []  # (end, lane)
    free: list[int] = []
    count = 0
    for i in sorted(range(len(intervals)), key=intervals.__getitem__):
        lo, hi = intervals[i]
        while busy and busy[0][0] <= lo:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lanes[i] = heapq.heappop(free)
        else:
            lanes[i] = count
            count += 1
        heapq.heappush(busy, (hi, lanes[i]))
    return lanes
