"""Predictions against a real run: 2-stage plans on two CPU ranks of one thread each.

1. ``baechi devices calibrate --torch cpu --threads 1 --count 2``: a spec for a one-thread rank;
   its interconnect is what two gloo processes on this machine measure (a ping-pong of 4 B to
   16 MB, ``t = latency + bytes / bandwidth`` fitted with relative weights, so the small messages
   set the latency);
2. per model (the harness's, at ``MEDIUM`` sizes: a microbatch's forward and backward take tens of
   milliseconds on one thread, as a stage worth pipelining does; at ``--quick`` sizes a stage is
   about a millisecond and torch's per-action overhead is most of it):
   ``baechi place MODEL.pt2 --training --objective throughput --microbatches 4 --schedule 1f1b``
   on those two devices;
3. ``baechi verify --torch`` trains it (``STEPS`` steps, one thread a rank), checks every gradient
   against one process, and measures each minibatch (every rank starts it together; the slowest
   rank's time; the median after the first step), each rank's first-step peak and each stage's
   forward and backward on one microbatch.

Writes ``torch_accuracy.md`` and ``.json``: per model the stages, the simulated minibatch against
the measured one (target: within 25%), each rank's peak against the predicted one (15%) and the
slowest stage over the mean, measured against predicted (20%). Run it on an idle machine: it
refuses a noisy calibration.

    python bench/torch_accuracy.py [--models a,b] [--out bench/torch_accuracy.md] [--allow-noisy] [--measure]

``--measure`` plans on each model's training step measured op for op on one thread (``baechi profile
MODEL.pt2 --training --measure --threads 1``) and writes ``torch_accuracy_measured.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# The harness's models (framework.py) at sizes between --quick and full: a microbatch's forward and
# backward take tens of milliseconds on one thread, as a stage of a plan worth pipelining does.
MEDIUM: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "gpt2": ({"n_embd": 256, "n_layer": 4, "n_head": 4, "n_positions": 128}, (8, 128)),
    "bert_base": (
        {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
        (8, 128),
    ),
    "vit_b16": (
        {
            "image_size": 64,
            "patch_size": 8,
            "hidden_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "intermediate_size": 1024,
        },
        (8, 3, 64, 64),
    ),
    "resnet50": (
        {"embedding_size": 32, "hidden_sizes": [64, 128, 256, 512], "depths": [1, 1, 1, 1]},
        (8, 3, 128, 128),
    ),
    "convnext_tiny": (
        {"num_stages": 3, "hidden_sizes": [64, 128, 256], "depths": [1, 1, 1]},
        (8, 3, 128, 128),
    ),
}
MODELS = tuple(MEDIUM)
SIZES = (4, 4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
TOLERANCE = 0.25  # minibatch time
PEAK_TOLERANCE = 0.15
BALANCE_TOLERANCE = 0.20
STEPS = 5


def _pingpong(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    times = {}
    for size in SIZES:
        t = torch.zeros(size // 4)
        samples = []
        for _ in range(12):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            samples.append((time.perf_counter() - t0) / 2)
        times[size] = sorted(samples[2:])[len(samples[2:]) // 2]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def interconnect() -> tuple[float, float]:
    """(latency µs, bandwidth bytes/s) of a one-way gloo send between two processes here."""
    import torch.multiprocessing as mp

    from baechi_cli.costs.comm import fit_transfer_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pingpong.json")
        mp.start_processes(_pingpong, args=(port, out), nprocs=2, start_method="spawn")
        with open(out) as f:
            times = {int(k): v for k, v in json.load(f).items()}
    # Relative weighting: the small messages fix the latency, the large ones the bandwidth.
    fit = fit_transfer_model(sorted(times), [times[n] * 1e6 for n in sorted(times)], weighting="relative")
    return fit.latency_us, fit.bandwidth_bytes_per_us * 1e6


def spec(folder: str, allow_noisy: bool = False) -> tuple[str, dict[str, Any]]:
    import yaml

    from baechi_cli.app.calibrate import calibrate_torch

    result = calibrate_torch(
        "cpu", count=2, threads=1, allow_noisy=allow_noisy, command="bench/torch_accuracy.py"
    )
    latency_us, bandwidth = interconnect()
    doc = yaml.safe_load(result.yaml)
    doc["interconnect"] = {
        "mode": "parallel",
        "latency": f"{latency_us:.1f}us",
        "bandwidth": f"{bandwidth / 1e9:.3f}GB/s",
    }
    path = os.path.join(folder, "cpu1.yaml")
    with open(path, "w") as f:
        f.write(f"# {result.yaml.splitlines()[0].lstrip('# ')}\n")
        yaml.safe_dump(doc, f, sort_keys=False)
    return path, {
        "latency_us": round(latency_us, 1),
        "bandwidth_GBps": round(bandwidth / 1e9, 3),
        "noise": result.noise.summary() if result.noise.noisy else None,
        "yaml": doc,
    }


def medium_model(name: str) -> tuple[Any, tuple[Any, ...]]:
    """The harness model ``name`` at its MEDIUM size, with the loss, and its seeded batch."""
    import framework as fw
    import torch_runs

    case = fw.CASE_BY_NAME[name]
    overrides, shape = MEDIUM[name]
    return torch_runs.harness_model(
        dataclasses.replace(case, quick={**case.quick, **overrides}, quick_input=shape)
    )


def run(name: str, devices: str, folder: str, measure: bool = False) -> dict[str, Any]:
    import torch

    from baechi_cli.app.place import place_model
    from baechi_cli.app.report import build_report
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.runtime.launch import verify_torch
    from baechi_cli.search.candidates import PlaceOptions

    model, inputs = medium_model(name)
    pt2 = os.path.join(folder, f"{name}.pt2")
    torch.export.save(torch.export.export(model, inputs), pt2)
    profile = None
    if measure:  # the step timed op for op on one thread, as a rank runs it
        from baechi_cli.app.profile import profile_model

        profile = os.path.join(folder, f"{name}.profile.json")
        profile_model(pt2, parse_devices(devices), training="sgd", measure=True, threads=1, output=profile)
    options = PlaceOptions(
        training=True, objective="throughput", microbatches=4, schedule="1f1b", profile=profile
    )
    report = build_report(place_model(pt2, parse_devices(devices), options), options)
    schedule = report["pipeline"]["schedule"]
    result = verify_torch(model, inputs, report, steps=STEPS, threads=1)
    measured, predicted = result["minibatch_us"]["measured"], schedule["minibatch_us"]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "stages": len(report["pipeline"]["stages"]),
        "ran": result["ran"],
        "gradients_match": result["gradients_match"],
        "predicted_us": predicted,
        "measured_us": measured,
        "ratio": round(measured / predicted, 3) if measured and predicted else None,
        "peaks": [
            (r["peak_bytes"], r["predicted_peak_bytes"])
            for r in result["per_rank"]
            if r["peak_bytes"] and r["predicted_peak_bytes"]
        ],
        "stage_compute_us": [(s["compute_us"], s["predicted_compute_us"]) for s in result["per_stage"]],
        "imbalance": result["compute_imbalance"],
        "error": result["error"],
    }


def _within(measured: float | None, predicted: float | None, tolerance: float) -> bool:
    return bool(measured and predicted) and abs(measured / predicted - 1) <= tolerance


def render(results: dict[str, Any]) -> str:
    link = results["interconnect"]
    lines = [
        "# Predictions against a real run: 2-stage plans on two CPU ranks of one thread each",
        "",
        "Made by `python bench/torch_accuracy.py` (docstring: the method). The harness's models at",
        f"medium sizes (`MEDIUM`), 1F1B, 4 microbatches, batch 8, {STEPS} steps; gloo between the ranks",
        f"measured at {link['latency_us']} µs + {link['bandwidth_GBps']} GB/s. Costs: "
        + (
            "measured (`baechi profile MODEL.pt2 --training --measure --threads 1`), the plans made on them."
            if results.get("costs") == "measured"
            else "analytic, from the calibrated one-thread spec."
        ),
        f"Machine: {os.cpu_count()} cores, load {results['load']:.2f} at the start, "
        f"{results.get('load_end', 0):.2f} at the end.",
        *(
            [f"**The calibration measured noise** ({link['noise']}): the simulated times are suspect."]
            if link.get("noise")
            else []
        ),
        "",
        "| model | params | stages | gradients | minibatch simulated | measured | measured / simulated "
        "| peak measured / predicted, per rank | slowest / mean stage, measured | predicted |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    hits = {"time": 0, "peak": 0, "peaks": 0, "balance": 0}
    for name, r in results["models"].items():
        if "measured_us" not in r:
            lines.append(f"| {name} | - | - | {r.get('error')} | - | - | - | - | - | - |")
            continue
        two = r["stages"] == 2
        hits["time"] += two and _within(r["measured_us"], r["predicted_us"], TOLERANCE)
        ratios = [m / p for m, p in r["peaks"]]
        hits["peak"] += sum(abs(x - 1) <= PEAK_TOLERANCE for x in ratios)
        hits["peaks"] += len(ratios)
        imb = r["imbalance"]
        hits["balance"] += _within(imb["measured"], imb["predicted"], BALANCE_TOLERANCE)
        lines.append(
            f"| {name} | {r['params']:,} | {r['stages']} | {'equal' if r['gradients_match'] else 'DIFFER'} | "
            f"{r['predicted_us'] / 1e3:.1f} ms | {(r['measured_us'] or 0) / 1e3:.1f} ms | {r['ratio']} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | {imb['measured']} | {imb['predicted']} |"
        )
    n = len(results["models"])
    lines += [
        "",
        f"- **{hits['time']} of {n} 2-stage plans' minibatch within {TOLERANCE:.0%} of the simulated one** "
        "(target: at least 3).",
        f"- **{hits['peak']} of {hits['peaks']} ranks' peak within {PEAK_TOLERANCE:.0%} of the predicted one.**",
        f"- **{hits['balance']} of {n} plans' slowest/mean stage within {BALANCE_TOLERANCE:.0%} of the "
        "predicted ratio.**",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--out", help="default bench/torch_accuracy.md; with --measure torch_accuracy_measured.md"
    )
    parser.add_argument(
        "--measure", action="store_true", help="plan on each model's measured step (baechi profile --measure)"
    )
    parser.add_argument(
        "--allow-noisy",
        action="store_true",
        help="keep a calibration that measured noise (the table says so)",
    )
    args = parser.parse_args(argv)
    args.out = args.out or os.path.join(
        HERE, "torch_accuracy_measured.md" if args.measure else "torch_accuracy.md"
    )
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_accuracy: needs torch; skipped", file=sys.stderr)
        return 0
    results: dict[str, Any] = {
        "load": os.getloadavg()[0],
        "costs": "measured" if args.measure else "analytic",
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="baechi-timing-") as folder:
        devices, results["interconnect"] = spec(folder, args.allow_noisy)
        for name in args.models.split(","):
            print(f"[torch_accuracy] {name}", file=sys.stderr, flush=True)
            try:
                results["models"][name] = run(name, devices, folder, args.measure)
            except Exception as err:  # noqa: BLE001 - a row, not a lost table
                results["models"][name] = {"error": str(err).splitlines()[0]}
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    results["load_end"] = os.getloadavg()[0]
    with open(args.out, "w") as f:
        f.write(render(results))
    print(f"[torch_accuracy] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
