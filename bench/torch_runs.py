"""Plans that run: every pipeline plan baechi makes for real models, trained in PyTorch on gloo ranks.

For each of the bench harness's seven models (framework.py, --quick sizes) and the model zoo's
(zoo.py, --quick sizes), at batch 8, with the loss ``out.float().pow(2).mean()``:

1. the model is exported with ``torch.export`` and saved as a ``.pt2``;
2. ``baechi place MODEL.pt2 --training --objective throughput --microbatches 4`` plans it under
   each schedule (``gpipe``, ``1f1b`` on 4 devices; ``interleaved``, ``zbv`` on 2 devices, 4
   stages) and under the default (``--schedule`` left out), on devices that are this machine's
   CPU on one thread (``baechi devices calibrate --torch cpu --threads 1``, once per run, or
   ``--devices FILE``: a spec it wrote before) joined by a fast interconnect, so that splitting
   pays and the plans have several stages (``spec``): a rank of ``verify`` runs on one thread, so
   the predicted stage times are those of the machine that runs them;
3. ``baechi verify --torch`` builds each plan (:mod:`baechi_cli.runtime`), trains one step on one
   gloo process per device and compares the loss and every gradient with one process.

It writes ``torch_runs.json`` and ``torch_runs.md``: per model and plan, the stages, whether it
trained, the worst gradient's relative L2, the values threaded and weights tied, each rank's
measured peak against the predicted one and the slowest stage's compute over the mean, measured
and predicted. Nothing here is timed against a target.

    python bench/torch_runs.py [--models a,b] [--plans 1f1b,zbv] [--out bench/torch_runs.md]
    python bench/torch_runs.py --measure   # plans on measured costs: bench/torch_runs_measured.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from typing import Any

from baechi_cli.costs.measured import cpu_model

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# The calibrated CPU on a fast interconnect: a split pays, so plans have several stages.
INTERCONNECT = {"mode": "parallel", "latency": "1us", "bandwidth": "100GB/s"}
PLANS = (("1f1b", 4), ("gpipe", 4), ("interleaved", 2), ("zbv", 2), ("auto", 4), ("makespan", 4))
BATCH = 8
MICROBATCHES = 4


def log(text: str) -> None:
    print(f"[torch_runs {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def models(names: set[str] | None) -> list[tuple[str, str, Any]]:
    """(name, family, builder) for the harness's and the zoo's models."""
    import framework as fw
    import zoo

    out: list[tuple[str, str, Any]] = []
    for case in fw.CASES:
        out.append((f"{case.name} (harness)", f"harness {case.kind}", lambda case=case: harness_model(case)))
    for case in zoo.CASES:
        if case.config.get("experts_implementation") == "eager":
            # torch.export cannot trace transformers' eager experts loop (its sizes follow the
            # routing); the plans run on transformers' default experts, the grouped product
            case = replace(case, config={**case.config, "experts_implementation": "grouped_mm"})
            family = f"{case.family} (grouped_mm experts)"
        else:
            family = case.family
        out.append((case.name, family, lambda case=case: zoo_model(case)))
    return [m for m in out if names is None or m[0] in names or m[0].split(" ")[0] in names]


def with_loss(model: Any) -> Any:
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.inner(*inputs).float().pow(2).mean()

    return WithLoss(model)


def harness_model(case: Any) -> tuple[Any, tuple[Any, ...]]:
    import framework as fw
    import torch

    model, x = fw.build(case, quick=True)
    generator = torch.Generator().manual_seed(1)
    shape = (BATCH, *case.quick_input[1:])
    if case.kind == "image":
        x = torch.randn(shape, generator=generator)
    else:
        x = torch.randint(0, int(x.max()) + 1, shape, generator=generator)
    return with_loss(model), (x,)


def zoo_model(case: Any) -> tuple[Any, tuple[Any, ...]]:
    import zoo

    model, _ = zoo.build(case, quick=True)
    shape = (BATCH, *zoo.input_shape(case, quick=True)[1:])
    config = model.model.config
    return with_loss(model), zoo.make_inputs(case, config, shape)


def spec(allow_noisy: bool) -> dict[str, Any]:
    """One device of this machine's CPU on one thread, calibrated (its YAML mapping, 64 GiB); a
    noisy calibration is retried twice, then kept (the run's log says so)."""
    import yaml

    from baechi_cli.app.calibrate import calibrate_torch
    from baechi_cli.core.errors import NoisyMeasurementError

    for attempt in range(3):  # a one-thread conv backward's repeats spread on a shared VM: retry
        try:
            result = calibrate_torch(
                "cpu",
                count=1,
                threads=1,
                allow_noisy=allow_noisy or attempt == 2,
                command="bench/torch_runs.py",
            )
            break
        except NoisyMeasurementError as err:
            log(f"calibration refused ({err}); again")
    if result.noise.noisy:
        log(f"keeping a noisy calibration: {result.noise.summary()}")
    return _first_device(yaml.safe_load(result.yaml))


def read_device(path: str) -> dict[str, Any]:
    """The device of ``path``: a devices YAML's first (64 GiB), or a torch_runs.json's."""
    import yaml

    with open(path) as f:
        return json.load(f)["device"] if path.endswith(".json") else _first_device(yaml.safe_load(f))


def _first_device(spec: dict[str, Any]) -> dict[str, Any]:
    """A devices spec's first device as the bench's device: its name dropped, 64 GiB."""
    return {**{k: v for k, v in spec["devices"][0].items() if k != "name"}, "memory": "64GiB"}


def devices_yaml(device: dict[str, Any], count: int) -> str:
    import yaml

    return yaml.safe_dump(
        {"devices": {"count": count, **device}, "interconnect": INTERCONNECT}, sort_keys=False
    )


def measured_profile(pt2: str, folder: str, name: str) -> str:
    """``baechi profile PT2 --training --measure --threads 1 -o ...``: the training step's ops
    timed in torch on one thread, as a rank runs them; the profile's path."""
    from baechi_cli.app.profile import profile_model
    from baechi_cli.core.devices import parse_devices

    out = os.path.join(folder, f"{name.split(' ')[0]}.profile.json")
    profile_model(pt2, parse_devices("1x64GB"), training="sgd", measure=True, threads=1, output=out)
    return out


def run_plan(
    pt2: str,
    folder: str,
    schedule: str,
    count: int,
    model: Any,
    inputs: tuple,
    device: dict[str, Any],
    profile: str | None = None,
) -> dict[str, Any]:
    from baechi_cli.app.place import place_model
    from baechi_cli.app.report import build_report
    from baechi_cli.core.devices import parse_devices
    from baechi_cli.runtime.launch import verify_torch
    from baechi_cli.search.candidates import PlaceOptions

    spec = os.path.join(folder, f"devices{count}.yaml")
    with open(spec, "w") as f:
        f.write(devices_yaml(device, count))
    if schedule == "makespan":  # --algo auto's plan for one step's time, run op for op
        options = PlaceOptions(training=True, profile=profile)
    else:
        options = PlaceOptions(
            training=True,
            objective="throughput",
            microbatches=MICROBATCHES,
            schedule=schedule,
            profile=profile,
        )
    t0 = time.perf_counter()
    try:
        outcome = place_model(pt2, parse_devices(spec), options)
    except Exception as err:  # noqa: BLE001 - a plan baechi cannot make is a row too
        return {"placed": False, "error": f"place: {str(err).splitlines()[0]}"}
    report = build_report(outcome, options)
    placed_s = time.perf_counter() - t0
    pipeline = report.get("pipeline")
    row: dict[str, Any] = {"placed": True, "place_s": round(placed_s, 3)}
    if pipeline is not None:
        row["schedule"] = pipeline["schedule"]["name"]
        row["predicted_speedup"] = pipeline["schedule"]["speedup_vs_one_device"]
    else:
        row["schedule"] = "makespan"
        row["devices_used"] = len(set(report["graph_devices"].values()))
    t0 = time.perf_counter()
    try:
        result = verify_torch(model, inputs, report, steps=1, timeout_s=600)
    except Exception as err:  # noqa: BLE001
        row.update(ran=False, error=f"verify: {str(err).splitlines()[0]}")
        return row
    row.update(
        stages=result["stages"],
        ran=result["ran"],
        gradients_match=result["gradients_match"],
        worst=result["worst"],
        error=result["error"],
        threaded=len(result["threaded"]),
        whole_backward=result.get("whole_backward", []),
        tied=[t["parameter"] for t in result["tied"]],
        per_rank=result["per_rank"],
        compute_imbalance=result["compute_imbalance"],
        per_stage=result["per_stage"],
        as_placed=result.get("as_placed"),
        split_nodes=len(result.get("split_nodes") or []),
        displaced_nodes=len(result.get("displaced_nodes") or []),
        minibatch_us=result.get("minibatch_us"),
        verify_s=round(time.perf_counter() - t0, 3),
    )
    return row


def run_model(
    name: str,
    builder: Any,
    plans: list[tuple[str, int]],
    folder: str,
    device: dict[str, Any],
    measure: bool = False,
) -> dict[str, Any]:
    import torch

    model, inputs = builder()
    entry: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "plans": {}}
    pt2 = os.path.join(folder, f"{name}.pt2")
    try:
        torch.export.save(torch.export.export(model, inputs), pt2)
    except Exception as err:  # noqa: BLE001
        entry["error"] = f"export: {str(err).splitlines()[0]}"
        return entry
    profile = None
    if measure:
        t0 = time.perf_counter()
        profile = measured_profile(pt2, folder, name)
        entry["profile_s"] = round(time.perf_counter() - t0, 2)
    for schedule, count in plans:
        log(f"{name}: {schedule} on {count} devices")
        try:
            entry["plans"][schedule] = run_plan(pt2, folder, schedule, count, model, inputs, device, profile)
        except Exception:  # noqa: BLE001 - a bench bug must not lose the other rows
            entry["plans"][schedule] = {"placed": False, "error": traceback.format_exc().splitlines()[-1]}
        row = entry["plans"][schedule]
        log(
            f"{name}: {schedule}: ran {row.get('ran')} match {row.get('gradients_match')} {row.get('error') or ''}"
        )
    return entry


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if not row.get("placed"):
        return "not placed"
    if not row.get("ran"):
        return f"**fails** ({row.get('stages')} st)"
    worst = row["worst"]["relative_l2"]
    mark = "ok" if row["gradients_match"] else "**differs**"
    if row.get("as_placed") is False:
        mark += f" **not as placed** ({not_placed(row)})"
    return f"{mark} {row['stages']} st, {worst:.0e}" if worst is not None else f"{mark} {row['stages']} st"


def summary(results: dict[str, Any]) -> list[str]:
    """The targets' counts: ranks whose measured peak is within 15% of the predicted one
    (pipeline plans and makespan plans apart), plans whose slowest/mean stage compute is within 20%
    of the predicted ratio."""
    peaks = {"pipeline": [0, 0], "makespan": [0, 0]}
    balance = [0, 0]
    for entry in results["models"].values():
        for kind, row in entry.get("plans", {}).items():
            count = peaks["makespan" if kind == "makespan" else "pipeline"]
            for rank in row.get("per_rank") or []:
                if rank.get("peak_bytes") and rank.get("predicted_peak_bytes"):
                    count[1] += 1
                    count[0] += abs(rank["peak_bytes"] / rank["predicted_peak_bytes"] - 1) <= 0.15
            imbalance = row.get("compute_imbalance") or {}
            if imbalance.get("measured") and imbalance.get("predicted"):
                balance[1] += 1
                balance[0] += abs(imbalance["measured"] / imbalance["predicted"] - 1) <= 0.2
    return [
        f"Ranks' measured peak within 15% of the predicted: {peaks['pipeline'][0]} of {peaks['pipeline'][1]} "
        f"under pipeline schedules, {peaks['makespan'][0]} of {peaks['makespan'][1]} under makespan plans. "
        f"Slowest / mean stage compute within 20% of the predicted ratio: {balance[0]} of {balance[1]} plans."
    ]


def not_placed(row: dict[str, Any]) -> str:
    """Why a plan that ran did not run as placed: nodes it split, nodes the runtime moved."""
    return f"{row.get('split_nodes')} nodes split, {row.get('displaced_nodes', 0)} moved"


def peak_ratios(row: dict[str, Any]) -> str:
    """A plan's ranks' measured peak over the predicted one, comma-separated."""
    return ", ".join(
        f"{r['peak_bytes'] / r['predicted_peak_bytes']:.2f}"
        for r in row["per_rank"]
        if r.get("peak_bytes") and r.get("predicted_peak_bytes")
    )


def makespan_section(results: dict[str, Any]) -> list[str]:
    """Per model, the makespan plan run op for op: its runs, whether it ran as placed and each
    rank's measured peak over the predicted. Its step time is not compared: one step is run,
    under torch's profiler, with four ranks on this machine's cores and gloo over loopback
    against the spec's fast link."""
    rows = []
    for name, entry in results["models"].items():
        row = entry.get("plans", {}).get("makespan")
        if not row or not row.get("ran"):
            continue
        peaks = peak_ratios(row)
        placed = {True: "yes", False: f"**no** ({not_placed(row)})"}.get(row.get("as_placed"), "-")
        rows.append(f"| {name} | {row['stages']} | {row.get('devices_used', '-')} | {placed} | {peaks} |")
    if not rows:
        return []
    return [
        "",
        "## Makespan plans, run op for op",
        "",
        "Each program node on its device, its backward where autograd runs it (with its forward), a "
        "value sent straight to each run that reads it. The step's time is not compared here: one "
        "step runs, under torch's profiler, four ranks on this machine's cores, gloo over loopback "
        "against the spec's 100 GB/s link.",
        "",
        "| model | runs | devices used | as placed | peak measured / predicted, per rank |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _cpu_text(record: dict[str, Any]) -> str:
    return f" ({record['cpu']})" if record.get("cpu") else ""


def _plans_text(record: dict[str, Any]) -> str:
    return f" ({', '.join(record['plans'])} plans)" if record.get("plans") else ""


def render(results: dict[str, Any], plans: list[tuple[str, int]]) -> str:
    lines = [
        "# Plans that run: baechi's pipeline plans trained in PyTorch",
        "",
        "Made by `python bench/torch_runs.py` (docstring: the method). Each cell: whether the plan",
        "trained one step on gloo ranks with every gradient within 1e-5 (relative L2) of one",
        "process's, its stage count, and the worst gradient's relative L2.",
        "",
        f"Machine: {os.cpu_count()} cores{_cpu_text(results)}; load at the start {results['load']}; "
        f"torch {results['torch']}."
        + "".join(
            f" Re-run {', '.join(r['models'])}{_plans_text(r)} ({r['why']}{_cpu_text(r)}; load at the start "
            f"{r['load']})."
            for r in results.get("rerun") or []
        ),
        "",
    ]
    total = ok = 0
    for entry in results["models"].values():
        for row in entry.get("plans", {}).values():
            if row.get("placed"):
                total += 1
                ok += bool(row.get("gradients_match")) and row.get("as_placed") is not False
    lines += [f"**{ok} of {total} plans train as placed, with gradients equal to one process.**", ""]
    lines += [*summary(results), ""]
    lines += [
        f"Devices: this machine's CPU on one thread, calibrated: `{json.dumps(results.get('device'))}`.",
        "",
    ]
    if results.get("costs") == "measured":
        lines += [
            "Costs: measured. Each model's training step was run op for op in torch on one thread "
            "(`baechi profile MODEL.pt2 --training --measure --threads 1`) and every plan was made "
            "on those times (`--profile`); the spec above gives the devices' memory, launch overhead "
            "and interconnect.",
            "",
        ]
    else:
        lines += ["Costs: analytic, from the calibrated spec above. `--measure` plans on measured ones.", ""]
    header = "| model | family | params | " + " | ".join(f"{s} ({c} dev)" for s, c in plans) + " |"
    lines += [header, "|" + "---|" * (3 + len(plans))]
    for name, entry in results["models"].items():
        if "error" in entry:
            lines.append(f"| {name} | {entry['family']} | - | {entry['error']} |")
            continue
        cells = [cell(entry["plans"].get(s)) for s, _ in plans]
        lines.append(f"| {name} | {entry['family']} | {entry['params']:,} | " + " | ".join(cells) + " |")
    lines += ["", "## Memory and balance (the default plan)", ""]
    lines += [
        "| model | stages | threaded | tied | peak measured / predicted, per rank | slowest / mean stage, measured | predicted | stage compute per microbatch, measured / predicted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in results["models"].items():
        row = entry.get("plans", {}).get("auto")
        if not row or not row.get("ran"):
            continue
        peaks = peak_ratios(row)
        imb = row["compute_imbalance"]
        per_stage = ", ".join(
            f"{s['compute_us'] / s['predicted_compute_us']:.2f}"
            for s in row.get("per_stage") or []
            if s.get("compute_us") and s.get("predicted_compute_us")
        )
        lines.append(
            f"| {name} | {row['stages']} ({row['schedule']}) | {row['threaded']} | {len(row['tied'])} | {peaks} | "
            f"{imb['measured']} | {imb['predicted']} | {per_stage or '-'} |"
        )
    lines += makespan_section(results)
    failures = [
        f"- {name} {s}: {row.get('error')}"
        for name, entry in results["models"].items()
        for s, row in entry.get("plans", {}).items()
        if row.get("placed") and not row.get("gradients_match")
    ]
    if failures:
        lines += ["", "## Failures", "", *failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--plans", help="comma-separated schedules of " + ",".join(s for s, _ in PLANS))
    parser.add_argument(
        "--out", help="the table (default bench/torch_runs.md; with --measure bench/torch_runs_measured.md)"
    )
    parser.add_argument(
        "--devices",
        help="instead of calibrating: a one-thread CPU spec (`baechi devices calibrate --torch cpu "
        "--threads 1`'s YAML) or an earlier run's torch_runs.json",
    )
    parser.add_argument("--allow-noisy", action="store_true", help="keep a calibration that measured noise")
    parser.add_argument(
        "--measure",
        action="store_true",
        help="plan on each model's measured costs (`baechi profile --training --measure --threads 1`) "
        "instead of the calibrated spec's analytic ones",
    )
    args = parser.parse_args(argv)
    args.out = args.out or os.path.join(HERE, "torch_runs_measured.md" if args.measure else "torch_runs.md")
    try:
        import torch
    except ImportError:
        print("torch_runs: needs torch (pip install -e '.[bench]'); skipped", file=sys.stderr)
        return 0
    names = set(args.models.split(",")) if args.models else None
    plans = [p for p in PLANS if not args.plans or p[0] in args.plans.split(",")]
    load = os.getloadavg()[0]
    if args.devices:
        device = read_device(args.devices)
    else:
        log("calibrating this machine's CPU on one thread")
        device = spec(args.allow_noisy)
    results: dict[str, Any] = {
        "load": load,
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "device": device,
        "costs": "measured" if args.measure else "analytic",
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="baechi-torch-runs-") as folder:
        for name, family, builder in models(names):
            t0 = time.perf_counter()
            entry = run_model(name, builder, plans, folder, device, args.measure)
            entry["family"] = family
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            results["models"][name] = entry
            with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                json.dump(results, f, indent=1)
            with open(args.out, "w") as f:
                f.write(render(results, plans))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
