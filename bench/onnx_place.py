"""Benchmark of ONNX placement: the committed ONNX models, inference and training, and the
training pass at scale.

`make bench` runs this after bench/profile_costs.py (the name keeps it from shadowing the onnx
package: bench/ is sys.path[0]). It writes bench/onnx.md (tables,
committed) and bench/onnx.json (raw numbers). Three sections:

1. **The ONNX test models** (tests/onnxmodels.py), each placed as
   ``baechi place MODEL --devices SPEC [--training --optimizer O]`` would
   (``place_model`` with ``--algo auto``), on ``4x8GB`` and on four devices
   of 3/4 of the adam training step's one-device peak (so that step must be
   split; an infeasible case is a row with its error): ops before and after synthesis, seconds per stage (median of
   ``REPEAT`` runs), the chosen algorithm, its step against one device and
   the lower bound, and how many modules the module map names.
2. **The training pass at scale**: :func:`synthesize_training` on the
   synthetic layered DAGs of bench/synthetic.py (a third of the ops own
   parameters), 1k to 100k ops, median of ``REPEAT`` calls. Target: 100k
   ops in under 5 s (O(V + E); the placers then take longer on the graph
   it returns).
3. **Synthesized against real**: the same Keras ResNet50 and InceptionV3 as
   an inference ONNX model with ``--training --optimizer momentum`` and as
   TensorFlow's own training graph (testdata/resnet50.pb, inception_v3.pb:
   Momentum, batch 32), both costed analytically, all passes off, on one
   device: persistent bytes, backward/forward compute ratio, one-device
   step and peak memory. (tf2onnx folds batch norm into the convolutions,
   so the ONNX forward pass is the smaller one.)

Targets are reported, not enforced: the script exits 0 either way.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchlib import BENCH, TESTDATA, log, ms, scrub, table, tests_module, write_json, write_text
from synthetic import layered_dag

from baechi_cli.app.place import place_model, prepare
from baechi_cli.app.report import build_report
from baechi_cli.core.devices import parse_devices
from baechi_cli.core.errors import InfeasibleError
from baechi_cli.passes.training import synthesize_training
from baechi_cli.search.candidates import PlaceOptions

REPEAT = 5
SCALE_OPS = (1_000, 5_000, 20_000, 100_000)
SCALE_TARGET_S = 5.0
MODES = (("inference", None), ("training, sgd", "sgd"), ("training, adam", "adam"))


def mode_name(optimizer: str | None) -> str:
    return "inference" if optimizer is None else f"training, {optimizer}"


def place_once(model: Any, devices: str, optimizer: str | None) -> dict[str, Any]:
    options = PlaceOptions(
        batch_size=model.batch_size,
        dims=dict(model.dims) or None,
        training=optimizer is not None,
        optimizer=optimizer or "sgd",
    )
    runs = []
    try:
        for _ in range(REPEAT):
            runs.append(place_model(str(model.path), parse_devices(devices), options))
    except InfeasibleError as err:
        return {
            "model": model.name,
            "devices": devices,
            "mode": mode_name(optimizer),
            "error": scrub(str(err)),
        }
    outcome = runs[-1]
    prepared, sim = outcome.prepared, outcome.sim
    report = build_report(outcome, options)
    return {
        "model": model.name,
        "devices": devices,
        "mode": mode_name(optimizer),
        "model_ops": prepared.model_ops,
        "ops": prepared.graph.num_ops,
        "placer_nodes": prepared.placement_graph.num_ops,
        "seconds": {
            stage: statistics.median(r.timings.get(stage, 0.0) for r in runs)
            for stage in ("load", "profile", "passes", "place", "total")
        },
        "algorithm": outcome.algorithm,
        "step_us": sim.step_time_us,
        "single_us": prepared.single_device.step_time_us if prepared.single_device else None,
        "lower_bound_us": prepared.lower_bound_us,
        "peak_bytes": max(sim.peak_bytes),
        "modules": len(report["module_map"]["modules"]) if "module_map" in report else None,
    }


def split_spec(model: Any, optimizer: str) -> str:
    """Four devices of 3/4 of the training step's one-device peak: it must be split."""
    options = PlaceOptions(
        algo="single",
        batch_size=model.batch_size,
        dims=dict(model.dims) or None,
        training=True,
        optimizer=optimizer,
    )
    outcome = place_model(str(model.path), parse_devices("1x1000GB"), options)
    return f"4x{max(outcome.sim.peak_bytes) * 3 // 4}"


def scale_rows() -> list[dict[str, Any]]:
    rows = []
    devices = parse_devices("4x8GB")
    for n in SCALE_OPS:
        g = layered_dag(n)
        g = g.replace(
            output_dtypes=[["float32"] * len(b) for b in g.output_bytes],
            persistent_bytes=[4096 if v % 3 == 0 else 0 for v in range(n)],
        )
        g.topo_order()
        kinds = ["flops"] * n
        times = []
        for _ in range(REPEAT):
            t0 = time.perf_counter()
            out = synthesize_training(g, devices, kinds, "adam")
            times.append(time.perf_counter() - t0)
        rows.append(
            {
                "ops": n,
                "edges": g.num_edges,
                "out_ops": out.num_ops,
                "out_edges": out.num_edges,
                "seconds": statistics.median(times),
            }
        )
        log(f"training pass {n} ops: {rows[-1]['seconds']:.3f} s")
    return rows


SAME_MODEL = (("keras_resnet50", "resnet50.pb"), ("keras_inception_v3", "inception_v3.pb"))


def synthesized_vs_real() -> list[dict[str, Any]]:
    devices = parse_devices("1x1000GB")
    bare = {"algo": "single", "coplace": False, "fusion": False, "forward_only": False}
    rows = []
    for onnx_name, pb in SAME_MODEL:
        onnx_path = os.path.join(TESTDATA, f"{onnx_name}.onnx")
        synthesized = prepare(
            onnx_path, devices, PlaceOptions(**bare, training=True, optimizer="momentum"), lambda _: None
        )
        real = prepare(
            os.path.join(TESTDATA, pb), devices, PlaceOptions(**bare, batch_size=32), lambda _: None
        )
        row: dict[str, Any] = {"model": onnx_name, "tensorflow": pb}
        for key, p, forward in (
            ("onnx", synthesized, [v < synthesized.model_ops for v in range(synthesized.graph.num_ops)]),
            ("tf", real, [not b for b in real.graph.is_backward]),
        ):
            g = p.graph
            fwd = sum(c for c, f in zip(g.compute_us, forward, strict=True) if f)
            row[key] = {
                "ops": g.num_ops,
                "persistent_bytes": sum(g.persistent_bytes),
                "forward_us": fwd,
                "step_us": p.single_device.step_time_us,
                "train_over_forward": sum(g.compute_us) / fwd,
                "peak_bytes": max(p.single_device.peak_bytes),
            }
        rows.append(row)
        log(
            f"{onnx_name}: synthesized x{row['onnx']['train_over_forward']:.2f}, real x{row['tf']['train_over_forward']:.2f}"
        )
    return rows


def main() -> None:
    records = []
    for model in tests_module("onnxmodels").ONNX_MODELS:
        specs = ["4x8GB", split_spec(model, "adam")]
        for devices in specs:
            for mode, optimizer in MODES:
                record = place_once(model, devices, optimizer)
                records.append(record)
                log(
                    f"{model.name} {devices} {mode}: {record.get('algorithm')} {ms(record.get('step_us'))} ms"
                )
    scale = scale_rows()
    same = synthesized_vs_real()

    lines = [
        "# ONNX placement",
        "",
        "Written by `bench/onnx_place.py` (`make bench`); see its docstring for the method.",
        f"Seconds are medians of {REPEAT} runs in one process on this machine "
        f"({os.cpu_count()} CPUs); step times are the simulator's, analytic costs.",
        "",
        "## The ONNX test models",
        "",
        "`ops`: the model's ops (graph inputs included) -> the plan's, with backward and optimizer ops;"
        " `nodes`: what the placers saw after the passes. The split spec is four devices of 3/4 of"
        " the adam training step's one-device peak.",
        "",
    ]
    rows = []
    for r in records:
        if "error" in r:
            rows.append([r["model"], r["devices"], r["mode"], *["-"] * 7, "infeasible", *["-"] * 5])
            continue
        s = r["seconds"]
        rows.append(
            [
                r["model"],
                r["devices"],
                r["mode"],
                f"{r['model_ops']} -> {r['ops']}",
                str(r["placer_nodes"]),
                f"{s['load']:.3f}",
                f"{s['profile']:.3f}",
                f"{s['passes']:.3f}",
                f"{s['place']:.3f}",
                f"{s['total']:.3f}",
                r["algorithm"],
                ms(r["step_us"]),
                ms(r["single_us"]),
                ms(r["lower_bound_us"]),
                f"{r['peak_bytes'] / 1e6:.1f}",
                "-" if r["modules"] is None else str(r["modules"]),
            ]
        )
    lines += table(
        [
            "model",
            "devices",
            "mode",
            "ops",
            "nodes",
            "load s",
            "cost+train s",
            "passes s",
            "place s",
            "total s",
            "auto chose",
            "step ms",
            "one device ms",
            "bound ms",
            "peak MB",
            "modules",
        ],
        rows,
    )
    slowest = max(r["seconds"]["total"] for r in records if "error" not in r)
    lines += [
        "",
        f"Slowest end to end: {slowest:.3f} s (target: about a second, as for GraphDefs): "
        + ("PASS" if slowest < 1.5 else "MISS"),
        "",
        "## The training pass at scale",
        "",
        "`synthesize_training` on bench/synthetic.py's layered DAGs, a third of the ops owning parameters, adam.",
        "",
    ]
    lines += table(
        ["ops", "edges", "training ops", "training edges", "seconds"],
        [
            [
                f"{r['ops']:,}",
                f"{r['edges']:,}",
                f"{r['out_ops']:,}",
                f"{r['out_edges']:,}",
                f"{r['seconds']:.3f}",
            ]
            for r in scale
        ],
    )
    largest = scale[-1]
    lines += [
        "",
        f"Target: {SCALE_OPS[-1]:,} ops in under {SCALE_TARGET_S:g} s: {largest['seconds']:.2f} s, "
        + ("PASS" if largest["seconds"] < SCALE_TARGET_S else "MISS"),
        "",
    ]
    lines += [
        "## Synthesized against real",
        "",
        "The same Keras model as an inference ONNX model placed with `--training --optimizer momentum`,"
        " and as TensorFlow's own Momentum training graph (batch 32); analytic costs, passes off,"
        " one device. tf2onnx folds batch norm into the convolutions, so the ONNX forward pass is smaller;"
        " the ratio (whole step / forward ops) is what the backward multipliers decide.",
        "",
    ]
    same_rows = []
    for r in same:
        for key, label in (
            ("onnx", f"{r['model']}.onnx, synthesized"),
            ("tf", f"{r['tensorflow']}, TensorFlow's"),
        ):
            x = r[key]
            same_rows.append(
                [
                    label,
                    f"{x['ops']:,}",
                    f"{x['persistent_bytes'] / 1e6:.1f}",
                    ms(x["forward_us"]),
                    ms(x["step_us"]),
                    f"{x['train_over_forward']:.2f}",
                    f"{x['peak_bytes'] / 1e9:.2f}",
                ]
            )
    lines += table(
        ["graph", "ops", "persistent MB", "forward ms", "step ms", "step / forward", "peak GB"], same_rows
    )
    lines.append("")
    write_text(os.path.join(BENCH, "onnx.md"), "\n".join(lines))
    write_json(
        os.path.join(BENCH, "onnx.json"), {"models": records, "scale": scale, "synthesized_vs_real": same}
    )
    log("wrote bench/onnx.md, bench/onnx.json")


if __name__ == "__main__":
    main()
