"""The simulated schedule against a real one: 2-stage plans on two CPU ranks of one thread each.

1. ``baechi devices calibrate --torch cpu --threads 1 --count 2``: a spec for a one-thread rank;
   its interconnect is what two gloo processes on this machine measure (a ping-pong of 4 KB to
   16 MB, latency and bandwidth fitted by least squares);
2. per model: ``baechi place MODEL.pt2 --training --objective throughput --microbatches 4
   --schedule 1f1b`` on those two devices;
3. ``baechi verify --torch`` trains it (5 steps, one thread a rank) and times each minibatch
   (every rank starts it together; the slowest rank's time; the median after the first step).

Writes ``torch_timing.md``: per model the stages, the simulated minibatch and the measured one,
and whether they agree within 25%. Run it on an idle machine: it refuses a noisy calibration.

    python bench/torch_timing.py [--models a,b] [--out bench/torch_timing.md]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODELS = ("gpt2", "bert_base", "vit_b16", "resnet50", "convnext_tiny")  # harness, --quick sizes
SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
TOLERANCE = 0.25


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
    import numpy as np
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pingpong.json")
        mp.start_processes(_pingpong, args=(port, out), nprocs=2, start_method="spawn")
        with open(out) as f:
            times = {int(k): v for k, v in json.load(f).items()}
    sizes = np.array(sorted(times), dtype=float)
    seconds = np.array([times[int(s)] for s in sizes])
    slope, intercept = np.polyfit(sizes, seconds, 1)
    return max(intercept, 1e-6) * 1e6, 1.0 / slope


def spec(folder: str, allow_noisy: bool = False) -> tuple[str, dict[str, Any]]:
    import yaml

    from baechi_cli.app.calibrate import calibrate_torch

    result = calibrate_torch(
        "cpu", count=2, threads=1, allow_noisy=allow_noisy, command="bench/torch_timing.py"
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
        "yaml": doc,
    }


def run(name: str, devices: str, folder: str) -> dict[str, Any]:
    import framework as fw
    import torch
    import torch_runs

    from baechi_cli.app.place import place_model
    from baechi_cli.app.report import build_report
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.runtime.launch import verify_torch
    from baechi_cli.search.candidates import PlaceOptions

    model, inputs = torch_runs.harness_model(fw.CASE_BY_NAME[name])
    pt2 = os.path.join(folder, f"{name}.pt2")
    torch.export.save(torch.export.export(model, inputs), pt2)
    options = PlaceOptions(training=True, objective="throughput", microbatches=4, schedule="1f1b")
    report = build_report(place_model(pt2, parse_devices(devices), options), options)
    schedule = report["pipeline"]["schedule"]
    result = verify_torch(model, inputs, report, steps=5, threads=1)
    measured, predicted = result["minibatch_us"]["measured"], schedule["minibatch_us"]
    return {
        "stages": len(report["pipeline"]["stages"]),
        "ran": result["ran"],
        "gradients_match": result["gradients_match"],
        "predicted_us": predicted,
        "measured_us": measured,
        "ratio": round(measured / predicted, 3) if measured and predicted else None,
        "error": result["error"],
    }


def render(results: dict[str, Any]) -> str:
    link = results["interconnect"]
    lines = [
        "# The simulated schedule against a real one (2 CPU ranks, one thread each)",
        "",
        "Made by `python bench/torch_timing.py` (docstring: the method). 1F1B, 4 microbatches, batch 8;",
        f"gloo between the ranks measured at {link['latency_us']} µs + {link['bandwidth_GBps']} GB/s.",
        f"Machine: {os.cpu_count()} cores, load {results['load']:.2f} at the start.",
        *(
            [f"**The calibration measured noise** ({link['noise']}): the simulated times are suspect."]
            if link.get("noise")
            else []
        ),
        "",
        "| model | stages | simulated minibatch | measured | measured / simulated | within 25% |",
        "|---|---|---|---|---|---|",
    ]
    hits = 0
    for name, r in results["models"].items():
        if "measured_us" not in r:
            lines.append(f"| {name} | - | - | - | - | {r.get('error')} |")
            continue
        ok = r["ratio"] is not None and r["stages"] == 2 and abs(r["ratio"] - 1) <= TOLERANCE
        hits += ok
        lines.append(
            f"| {name} | {r['stages']} | {r['predicted_us'] / 1e3:.2f} ms | "
            f"{(r['measured_us'] or 0) / 1e3:.2f} ms | {r['ratio']} | {'yes' if ok else 'no'} |"
        )
    lines += ["", f"**{hits} of {len(results['models'])} 2-stage plans within 25%** (target: at least 3)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=os.path.join(HERE, "torch_timing.md"))
    parser.add_argument(
        "--allow-noisy",
        action="store_true",
        help="keep a calibration that measured noise (the table says so)",
    )
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch_timing: needs torch; skipped", file=sys.stderr)
        return 0
    results: dict[str, Any] = {"load": os.getloadavg()[0], "models": {}}
    with tempfile.TemporaryDirectory(prefix="baechi-timing-") as folder:
        devices, results["interconnect"] = spec(folder, args.allow_noisy)
        for name in args.models.split(","):
            print(f"[torch_timing] {name}", file=sys.stderr, flush=True)
            try:
                results["models"][name] = run(name, devices, folder)
            except Exception as err:  # noqa: BLE001 - a row, not a lost table
                results["models"][name] = {"error": str(err).splitlines()[0]}
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1, default=str)
    with open(args.out, "w") as f:
        f.write(render(results))
    print(f"[torch_timing] wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
