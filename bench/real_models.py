"""Real-size models planned and trained as a user would: export, `baechi place`, `baechi verify --torch`.

The four architectures at a real model's size (Hugging Face configs, random weights): a Qwen2
decoder of 75M parameters (rotary positions, grouped-query attention, a tied embedding), T5-small
(60M, an encoder-decoder with relative position bias and a tied embedding), ResNet-50 (25M) and
ViT-Base/16 (86M), at batch 4 (the text models, 128 and 64/32 tokens) or 8 (the images, 224 px).
Per model, with the commands of the README:

1. ``torch.export.save`` of the model with its loss (``out.pow(2).mean()``);
2. ``baechi place MODEL.pt2 --training --devices 1x64GB``: the one-device training peak P;
3. ``baechi place MODEL.pt2 --training --objective throughput --microbatches 4 -d DEVICES`` on two
   devices of ``SHARE`` x P each (the model does not fit one of them), the schedule left to baechi;
4. ``baechi verify REPORT --torch bench/real_models.py:NAME --steps 2`` on two gloo ranks.

Writes ``real_models.md`` and ``.json``: whether the plan placed and trained with gradients equal
to one process, each rank's measured peak against the predicted one and the device's memory, and
the minibatch, measured against simulated. The devices are this machine's CPU as
``torch_runs.json`` calibrated it, one thread a rank. About 10 minutes on 2 cores.

    python bench/real_models.py [--models qwen2,t5] [--out bench/real_models.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

try:
    from benchlib import BENCH, ROOT, load_averages, log, table, write_json, write_text
except ImportError:  # run by `baechi verify --torch` for its model functions alone (bench/ not on the path)
    pass

SHARE = 0.7  # each device's memory, of the one-device training peak
MICROBATCHES = 4


def _with_loss(model: Any, call: Any) -> Any:
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, *args: Any) -> Any:
            return call(self.m, *args).float().pow(2).mean()

    return WithLoss()


def qwen2() -> tuple[Any, tuple[Any, ...]]:
    """A 75M-parameter Qwen2: 8 layers of width 768, 12 query and 4 key-value heads, tied embedding."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    model = _with_loss(Qwen2ForCausalLM(config).eval(), lambda m, ids: m(input_ids=ids).logits)
    return model, (torch.randint(0, 32000, (4, 128)),)


def t5() -> tuple[Any, tuple[Any, ...]]:
    """T5-small's shape (60M): 6 encoder and 6 decoder layers of width 512."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8, dropout_rate=0.0
    )
    model = _with_loss(
        T5ForConditionalGeneration(config).eval(),
        lambda m, ids, dec: m(input_ids=ids, decoder_input_ids=dec).logits,
    )
    return model, (torch.randint(0, 32128, (4, 64)), torch.randint(0, 32128, (4, 32)))


def resnet50() -> tuple[Any, tuple[Any, ...]]:
    """ResNet-50 (25M), batch norm in training mode."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    config = ResNetConfig(layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048])
    model = _with_loss(ResNetForImageClassification(config), lambda m, x: m(pixel_values=x).logits)
    return model, (torch.randn(8, 3, 224, 224),)


def vit_base() -> tuple[Any, tuple[Any, ...]]:
    """ViT-Base/16 (86M)."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    model = _with_loss(ViTForImageClassification(ViTConfig()).eval(), lambda m, x: m(pixel_values=x).logits)
    return model, (torch.randn(8, 3, 224, 224),)


MODELS = {"qwen2": qwen2, "t5": t5, "resnet50": resnet50, "vit_base": vit_base}


def _baechi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "baechi_cli", *args], capture_output=True, text=True, cwd=ROOT, check=False
    )


def _devices(folder: str, memory: int, count: int) -> str:
    """The calibrated one-thread CPU of torch_runs.json, ``count`` of them with ``memory`` bytes."""
    with open(os.path.join(BENCH, "torch_runs.json"), encoding="utf-8") as f:
        device = dict(json.load(f)["device"])
    device["memory"] = memory
    path = os.path.join(folder, f"devices{count}.yaml")  # JSON is YAML
    spec = {
        "devices": [{**device, "name": f"/device:CPU:{i}"} for i in range(count)],
        "interconnect": {"mode": "parallel", "latency": "100us", "bandwidth": "3.5GB/s"},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path


def run(name: str, folder: str) -> dict[str, Any]:
    import torch

    model, args = MODELS[name]()
    row: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters())}
    pt2 = os.path.join(folder, f"{name}.pt2")
    torch.export.save(torch.export.export(model, args), pt2)
    one = os.path.join(folder, f"{name}.one.json")
    done = _baechi("place", pt2, "--training", "--devices", "1x64GB", "--report", one, "-q")
    if done.returncode != 0:
        return {**row, "error": f"place (one device): {done.stderr.strip()}"}
    with open(one, encoding="utf-8") as f:
        peak = json.load(f)["per_device"][0]["peak_bytes"]
    memory = int(SHARE * peak)
    report = os.path.join(folder, f"{name}.json")
    t0 = time.perf_counter()
    done = _baechi(
        "place", pt2, "--training", "--objective", "throughput", "--microbatches", str(MICROBATCHES),
        "--devices", _devices(folder, memory, 2), "--report", report, "-q",
    )  # fmt: skip
    row.update(one_device_peak=peak, memory=memory, place_s=round(time.perf_counter() - t0, 1))
    if done.returncode != 0:
        return {**row, "error": f"place: {done.stderr.strip()}"}
    with open(report, encoding="utf-8") as f:
        schedule = json.load(f)["pipeline"]["schedule"]
    out = os.path.join(folder, f"{name}.verify.json")
    t0 = time.perf_counter()
    done = _baechi(
        "verify", report, "--torch", f"{os.path.abspath(__file__)}:{name}", "--steps", "2", "--json", out
    )
    row.update(
        schedule=schedule["name"], verify_s=round(time.perf_counter() - t0, 1), verify_rc=done.returncode
    )
    if not os.path.exists(out):
        return {
            **row,
            "error": f"verify: {done.stdout.strip().splitlines()[-1:]} {done.stderr.strip()[-300:]}",
        }
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    row.update(
        ran=doc["ran"],
        gradients_match=doc["gradients_match"],
        worst=doc["worst"]["relative_l2"],
        within_memory=doc["within_memory"],
        ranks=[(r["peak_bytes"], r["predicted_peak_bytes"]) for r in doc["per_rank"]],
        minibatch=(doc["minibatch_us"]["measured"], doc["minibatch_us"]["predicted"]),
        error=doc["error"],
    )
    return row


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Real-size models planned and trained as a user would",
        "",
        "Made by `python bench/real_models.py` (docstring: the method): each model on two devices of "
        f"{SHARE:.0%} of its one-device training peak, {MICROBATCHES} microbatches, the schedule baechi "
        "picks, trained 2 steps by `baechi verify --torch` on two one-thread gloo ranks.",
        f"Machine: {os.cpu_count()} cores; load {results['load_start']} at the start, {results['load_end']} at the end.",
        "",
    ]
    header = [
        "model", "params", "one-device peak", "device memory", "schedule", "trains, gradients equal",
        "rank peaks, measured / predicted", "within device memory", "minibatch measured / simulated",
    ]  # fmt: skip
    rows = []
    for name, r in results["models"].items():
        if r.get("error") and "ranks" not in r:
            rows.append([name, f"{r['params'] / 1e6:.1f}M", *["-"] * 3, f"no: {r['error']}", "-", "-", "-"])
            continue
        peaks = ", ".join(
            f"{m / 1e6:.1f} / {p / 1e6:.1f} MB ({m / p:.2f}x)" for m, p in r["ranks"] if m and p
        )
        measured, predicted = r["minibatch"]
        rows.append(
            [
                name,
                f"{r['params'] / 1e6:.1f}M",
                f"{r['one_device_peak'] / 1e6:.1f} MB",
                f"{r['memory'] / 1e6:.1f} MB",
                r["schedule"],
                f"{'yes' if r['ran'] and r['gradients_match'] else 'NO'} (worst {r['worst']:.0e})",
                peaks,
                {True: "yes", False: "NO", None: "-"}[r["within_memory"]],
                f"{measured / 1e3:.0f} / {predicted / 1e3:.0f} ms ({measured / predicted:.2f}x)"
                if measured and predicted
                else "-",
            ]
        )
    lines += table(header, rows)
    ok = sum(
        bool(r.get("ran") and r.get("gradients_match") and r.get("within_memory"))
        for r in results["models"].values()
    )
    lines += [
        "",
        f"**{ok} of {len(results['models'])} plans train within their devices' memory, gradients equal to one process.**",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated of " + ",".join(MODELS))
    parser.add_argument("--out", default=os.path.join(BENCH, "real_models.md"))
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print(
            "real_models: needs torch and transformers (pip install -e '.[bench]'); skipped", file=sys.stderr
        )
        return 0
    names = args.models.split(",") if args.models else list(MODELS)
    results: dict[str, Any] = {"load_start": load_averages(), "models": {}}
    with tempfile.TemporaryDirectory(prefix="baechi-real-") as folder:
        for name in names:
            log(f"[real_models] {name}")
            results["models"][name] = run(name, folder)
            log(f"[real_models] {name}: {json.dumps(results['models'][name])[:300]}")
    results["load_end"] = load_averages()
    write_text(args.out, render(results))
    write_json(os.path.splitext(args.out)[0] + ".json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
