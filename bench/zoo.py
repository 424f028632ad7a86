"""A model zoo: every architecture people train, measured in PyTorch beside baechi's predictions.

`make bench` runs this after framework.py (issue 37, item 3). Each model is a transformers class
built from a config in code (random weights, seed 0, then framework.py's ``distinct_values`` so
that the exporter does not merge equal initializers; no downloads), wrapped to return one float
tensor (``logits`` or ``last_hidden_state``), every dropout probability 0, the step run in
``train()`` mode. Most are small (hidden 128, 2 layers, 4x128 tokens, 4-8 images of 64-128
pixels) so the whole zoo runs in minutes on a 2-core CPU; two are real size, as issue 37 names
them: EfficientNet-B0 and Swin-T, 8 images of 224x224.

Inputs: a decoder takes ``(input_ids, attention_mask)`` with an all-ones mask (the legacy
exporter needs an explicit mask); an encoder takes the same with padding zeros at the end of
some rows; an encoder-decoder ``(input_ids, attention_mask, decoder_input_ids,
decoder_attention_mask)``; a vision model ``(pixel_values,)``.

For each model:

1. **measured**, per optimizer (SGD, Adam): framework.py's ``measure`` (the step
   ``model(*inputs).float().pow(2).mean().backward(); opt.step()``, its median time after
   warm-up, its peak, resident and boundary bytes from ``torch.profiler``'s memory records) and
   what autograd saved for backward (``saved_by_node``);
2. **exported** by each source in :data:`SOURCES` into ``--cache`` (git-ignored):
   ``onnx-legacy``, framework.py's ``export_onnx`` (the TorchScript exporter: ``dynamo=False,
   opset_version=17, training=PRESERVE, do_constant_folding=False`` in ``eval()`` mode), and
   ``onnx-dynamo``, ``torch.onnx.export(model.train(), ..., dynamo=True, opset_version=18,
   optimize=False, external_data=False)`` (onnxscript; ``optimize=False`` leaves out its
   optimizer, which folds constants; the model in ``train()`` mode, as the step runs). An
   exporter's failure is recorded by its first line;
3. **predicted** from each export, per optimizer, as ``baechi place MODEL --training
   --optimizer O --algo single --devices SPEC`` would (``place_model``; framework.py's
   ``prediction`` of the outcome), with the number of outputs whose size ONNX shape inference
   left unknown (the ``_size_unknown`` attrs of the graph's forward ops; counted as one element
   each by the reader), on SPEC: ``--devices``, else ``baechi devices calibrate --torch cpu``
   run on this machine just before (and again after, to show how far its speed moved);
4. **split** (framework.py's ``split_attempt``): ``--algo auto`` on 2 and 4 devices of SPEC's
   rates whose memories add up to 1.3x the *measured* peak: placed (every device's simulated
   peak within its memory), or the error's first line.

It writes ``zoo.md`` (the targets: 100% of the models export with at least one exporter and
place; one-device peak within +-15% of the measured peak on >= 95% of the (model, optimizer)
rows; step within +-25% on >= 80%; per exporter) and ``zoo.json`` (raw numbers) into ``--out``
(default bench/). The tables are driven by column tables (:data:`MODEL_COLUMNS`,
:data:`SOURCE_COLUMNS`, :data:`ROW_COLUMNS`, :data:`SOURCE_ROW_COLUMNS`) over the models (keyed
by name) and their results by source, so a later source (a ``.pt2`` reader) or column (whether
the plan runs under torch) is one entry.

Flags: ``--quick`` (tiny configs and inputs, 2 timed steps, a temporary ``--out`` and cache),
``--models a,b``, ``--devices FILE|SPEC``, ``--cache DIR``, ``--out DIR``, ``--only predict``
(steps 3 and 4 again from ``--out``'s zoo.json and the cached exports, without torch: the
predictions move as baechi's shape inference and memory rules do, and re-predicting is cheap;
the spec is zoo.json's unless ``--devices`` is given). Without torch and transformers a full
run prints the install hint, notes it at the top of an existing zoo.md and exits 0. The
targets are reported, not enforced: the script exits 0 either way.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import framework as fw
from benchlib import BENCH, ROOT, Run, log, rel, scrub, table, write_json, write_text

from baechi_cli.app.place import place_model
from baechi_cli.core.devices import DeviceSpec
from baechi_cli.core.errors import BaechiError
from baechi_cli.search.candidates import PlaceOptions

MD_NAME, JSON_NAME = "zoo.md", "zoo.json"
TITLE = "# Model zoo: PyTorch training steps beside baechi's predictions"
INSTALL_HINT = "pip install -e '.[bench]'  (torch==2.13.0 CPU build, transformers and onnxscript)"
OPTIMIZERS = fw.OPTIMIZERS
PEAK_TOLERANCE, TIME_TOLERANCE = fw.PEAK_TOLERANCE, fw.TIME_TOLERANCE
PEAK_TARGET, STEP_TARGET = 0.95, 0.80  # the share of (model, optimizer) rows within the tolerance
FIT_RATIO = fw.FIT_RATIO
DEVICE_COUNTS = fw.DEVICE_COUNTS
CACHE = os.path.join(BENCH, "cache", "zoo")


# ---------------------------------------------------------------- the models


@dataclass(frozen=True)
class ZooCase:
    """One model: its transformers classes and config, what it is fed, what the table says of it."""

    name: str
    family: str  # decoder, encoder, encoder-decoder, vision transformer, CNN
    features: str  # what it exercises, for the table
    config_class: str
    model_class: str
    config: dict[str, Any]  # config overrides (the small model; real size for the two real ones)
    # the input: text (batch, tokens); encoder-decoders (batch, source tokens, target tokens);
    # images (batch, 3, H, W)
    shape: tuple[int, ...]
    quick: dict[str, Any] = field(default_factory=dict)  # --quick: further overrides
    quick_shape: tuple[int, ...] | None = None  # --quick's input (default: by kind)
    output: str = "logits"
    model_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """decoder (all-ones mask), encoder (padding in the mask), seq2seq, or image."""
        if self.family == "encoder-decoder":
            return "seq2seq"
        if self.family in ("decoder", "encoder"):
            return self.family
        return "image"


VOCAB = 4096
TOKENS = (4, 128)
SEQ2SEQ = (4, 64, 32)
QUICK_TOKENS = (2, 16)
QUICK_SEQ2SEQ = (2, 16, 8)
QUICK_IMAGES = (2, 3, 32, 32)
DECODER = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2}
DECODER |= {"num_attention_heads": 4, "max_position_embeddings": 256}
ENCODER = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2}
ENCODER |= {"num_attention_heads": 4, "max_position_embeddings": 256}
BART_LIKE = {"vocab_size": VOCAB, "d_model": 128, "encoder_layers": 2, "decoder_layers": 2}
BART_LIKE |= {"encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 512}
BART_LIKE |= {"decoder_ffn_dim": 512, "max_position_embeddings": 256}
VIT = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512}
VIT |= {"image_size": 64, "patch_size": 8, "num_labels": 10}
IMAGES = (8, 3, 64, 64)

CASES: tuple[ZooCase, ...] = (
    # ---- decoders
    ZooCase(
        "llama",
        "decoder",
        "rotary, RMSNorm, SwiGLU, grouped-query attention (4 heads, 2 KV), untied head",
        "LlamaConfig",
        "LlamaForCausalLM",
        {**DECODER, "num_key_value_heads": 2, "tie_word_embeddings": False},
        TOKENS,
    ),
    ZooCase(
        "llama_tied",
        "decoder",
        "Llama with a tied head, multi-head attention, 4 layers",
        "LlamaConfig",
        "LlamaForCausalLM",
        {**DECODER, "num_hidden_layers": 4, "tie_word_embeddings": True},
        TOKENS,
    ),
    ZooCase(
        "mistral",
        "decoder",
        "rotary, grouped-query attention (4 heads, 1 KV), sliding window 32 of 128 tokens",
        "MistralConfig",
        "MistralForCausalLM",
        {**DECODER, "num_key_value_heads": 1, "sliding_window": 32},
        TOKENS,
    ),
    ZooCase(
        "qwen2",
        "decoder",
        "rotary, QKV bias, grouped-query attention (4 heads, 2 KV), sliding window 32 in layer 2, tied head",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {
            **DECODER,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
            "use_sliding_window": True,
            "sliding_window": 32,
            "max_window_layers": 1,
        },
        TOKENS,
    ),
    ZooCase(
        "mixtral",
        "decoder",
        "mixture of experts (4 experts, top 2; transformers' eager experts: a loop over the experts hit, "
        "tokens picked by torch.where), grouped-query attention, rotary",
        "MixtralConfig",
        "MixtralForCausalLM",
        {
            **DECODER,
            "intermediate_size": 256,
            "num_key_value_heads": 2,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "experts_implementation": "eager",
        },
        TOKENS,
    ),
    ZooCase(
        "qwen2_moe",
        "decoder",
        "mixture of experts (8 experts, top 2; batched_mm experts: each token's expert weights gathered) "
        "with a shared expert, QKV bias",
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **DECODER,
            "num_key_value_heads": 4,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 256,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "experts_implementation": "batched_mm",
        },
        TOKENS,
    ),
    ZooCase(
        "gpt2",
        "decoder",
        "learned positions, GELU (tanh), Conv1D layers, tied head",
        "GPT2Config",
        "GPT2LMHeadModel",
        {"vocab_size": VOCAB, "n_embd": 128, "n_layer": 2, "n_head": 4, "n_positions": 256},
        TOKENS,
    ),
    ZooCase(
        "gpt_neo",
        "decoder",
        "global and local attention (window 32) alternating, tied head",
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 128,
            "num_layers": 2,
            "num_heads": 4,
            "max_position_embeddings": 256,
            "attention_types": [[["global", "local"], 1]],
            "window_size": 32,
        },
        TOKENS,
    ),
    ZooCase(
        "opt",
        "decoder",
        "learned positions (offset 2), ReLU, tied head",
        "OPTConfig",
        "OPTForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 128,
            "ffn_dim": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "word_embed_proj_dim": 128,
            "max_position_embeddings": 256,
        },
        TOKENS,
    ),
    ZooCase(
        "phi",
        "decoder",
        "partial rotary (half the head), parallel attention and MLP, untied head with bias",
        "PhiConfig",
        "PhiForCausalLM",
        {**DECODER, "intermediate_size": 512, "partial_rotary_factor": 0.5},
        TOKENS,
    ),
    ZooCase(
        "gemma",
        "decoder",
        "multi-query attention (1 KV head), GeGLU, RMSNorm (1 + w), scaled embedding, tied head",
        "GemmaConfig",
        "GemmaForCausalLM",
        {**DECODER, "intermediate_size": 512, "num_key_value_heads": 1, "head_dim": 32},
        TOKENS,
    ),
    ZooCase(
        "falcon",
        "decoder",
        "new decoder architecture: grouped-query (4 heads, 2 KV), parallel attention, rotary, tied head",
        "FalconConfig",
        "FalconForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_kv_heads": 2,
            "new_decoder_architecture": True,
            "max_position_embeddings": 256,
            "ffn_hidden_size": 512,
        },
        TOKENS,
    ),
    # ---- encoders (padding in the attention mask)
    ZooCase(
        "bert",
        "encoder",
        "masked-LM head tied to the embedding, absolute positions",
        "BertConfig",
        "BertForMaskedLM",
        ENCODER,
        TOKENS,
    ),
    ZooCase(
        "roberta",
        "encoder",
        "sequence classification (pooled first token), positions offset by padding",
        "RobertaConfig",
        "RobertaForSequenceClassification",
        {**ENCODER, "max_position_embeddings": 258},
        TOKENS,
    ),
    ZooCase(
        "distilbert",
        "encoder",
        "no token types, 3 layers, last hidden state",
        "DistilBertConfig",
        "DistilBertModel",
        {
            "vocab_size": VOCAB,
            "dim": 128,
            "hidden_dim": 512,
            "n_layers": 3,
            "n_heads": 4,
            "max_position_embeddings": 256,
        },
        TOKENS,
        output="last_hidden_state",
    ),
    ZooCase(
        "electra",
        "encoder",
        "discriminator head, embedding 64 projected to hidden 128",
        "ElectraConfig",
        "ElectraForPreTraining",
        {**ENCODER, "embedding_size": 64},
        TOKENS,
    ),
    ZooCase(
        "deberta_v2",
        "encoder",
        "disentangled attention (relative positions, content-to-position and back)",
        "DebertaV2Config",
        "DebertaV2Model",
        {
            **ENCODER,
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "max_relative_positions": 64,
            "position_buckets": 32,
        },
        TOKENS,
        output="last_hidden_state",
    ),
    ZooCase(
        "albert",
        "encoder",
        "shared layers (4 layers, one set of weights), factorized embedding 64",
        "AlbertConfig",
        "AlbertModel",
        {**ENCODER, "num_hidden_layers": 4, "embedding_size": 64, "num_hidden_groups": 1},
        TOKENS,
        output="last_hidden_state",
        model_kwargs={"add_pooling_layer": False},
    ),
    # ---- encoder-decoders
    ZooCase(
        "t5",
        "encoder-decoder",
        "relative position buckets, RMSNorm, tied head scaled by d_model^-0.5",
        "T5Config",
        "T5ForConditionalGeneration",
        {
            "vocab_size": VOCAB,
            "d_model": 128,
            "d_ff": 512,
            "d_kv": 32,
            "num_layers": 2,
            "num_decoder_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 32,
        },
        SEQ2SEQ,
    ),
    ZooCase(
        "bart",
        "encoder-decoder",
        "learned positions, post-norm, tied head, final-logits bias",
        "BartConfig",
        "BartForConditionalGeneration",
        BART_LIKE,
        SEQ2SEQ,
    ),
    ZooCase(
        "marian",
        "encoder-decoder",
        "sinusoidal positions, scaled embedding, shared embeddings",
        "MarianConfig",
        "MarianMTModel",
        {
            **BART_LIKE,
            "decoder_vocab_size": VOCAB,
            "pad_token_id": 1,
            "eos_token_id": 2,
            "decoder_start_token_id": 1,
        },
        SEQ2SEQ,
    ),
    ZooCase(
        "pegasus",
        "encoder-decoder",
        "sinusoidal positions, pre-norm with final layer norms",
        "PegasusConfig",
        "PegasusForConditionalGeneration",
        BART_LIKE,
        SEQ2SEQ,
    ),
    # ---- vision transformers
    ZooCase(
        "vit",
        "vision transformer",
        "patch 8, class token, 2 layers",
        "ViTConfig",
        "ViTForImageClassification",
        VIT,
        IMAGES,
    ),
    ZooCase(
        "deit",
        "vision transformer",
        "class and distillation tokens",
        "DeiTConfig",
        "DeiTForImageClassification",
        VIT,
        IMAGES,
    ),
    ZooCase(
        "beit",
        "vision transformer",
        "relative position bias per layer, layer scale, mean pooling",
        "BeitConfig",
        "BeitForImageClassification",
        {**VIT, "use_relative_position_bias": True, "use_mean_pooling": True},
        IMAGES,
    ),
    ZooCase(
        "dinov2",
        "vision transformer",
        "layer scale, position embedding interpolated to the input",
        "Dinov2Config",
        "Dinov2ForImageClassification",
        {**VIT, "mlp_ratio": 4},
        IMAGES,
    ),
    ZooCase(
        "swin_t",
        "vision transformer",
        "Swin-T (SwinConfig defaults): shifted windowed attention, patch merging",
        "SwinConfig",
        "SwinForImageClassification",
        {"num_labels": 1000},
        (8, 3, 224, 224),
        quick={
            "image_size": 32,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [1, 2],
            "window_size": 4,
            "num_labels": 10,
        },
    ),
    ZooCase(
        "segformer",
        "vision transformer",
        "hierarchical Mix Transformer: overlapping patches, reduced "
        "key/value (efficient attention), Mix-FFN with depthwise conv",
        "SegformerConfig",
        "SegformerForImageClassification",
        {
            "hidden_sizes": [32, 64, 128, 160],
            "depths": [1, 1, 1, 1],
            "num_attention_heads": [1, 2, 4, 5],
            "num_labels": 10,
        },
        (8, 3, 128, 128),
    ),
    # ---- CNNs
    ZooCase(
        "convnextv2",
        "CNN",
        "ConvNeXt-V2, a ConvNet of transformer design: depthwise 7x7, LayerNorm, GELU, global response norm",
        "ConvNextV2Config",
        "ConvNextV2ForImageClassification",
        {"hidden_sizes": [32, 64, 128, 256], "depths": [1, 1, 2, 1], "num_labels": 10},
        (8, 3, 128, 128),
    ),
    ZooCase(
        "efficientnet_b0",
        "CNN",
        "EfficientNet-B0: depthwise convs, squeeze-excitation, SiLU (swish)",
        "EfficientNetConfig",
        "EfficientNetForImageClassification",
        {
            "width_coefficient": 1.0,
            "depth_coefficient": 1.0,
            "image_size": 224,
            "hidden_dim": 1280,
            "num_labels": 1000,
        },
        (8, 3, 224, 224),
        quick={
            "width_coefficient": 0.5,
            "depth_coefficient": 0.5,
            "image_size": 32,
            "hidden_dim": 640,
            "num_labels": 10,
        },
    ),
    ZooCase(
        "mobilenet_v1",
        "CNN",
        "depthwise-separable, tf_padding=True (pads computed from the input)",
        "MobileNetV1Config",
        "MobileNetV1ForImageClassification",
        {"depth_multiplier": 0.5, "tf_padding": True, "image_size": 128, "num_labels": 10},
        (8, 3, 128, 128),
    ),
    ZooCase(
        "mobilenet_v2",
        "CNN",
        "inverted residuals, depthwise, tf_padding=True (pads computed from the input)",
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        {"depth_multiplier": 0.5, "tf_padding": True, "image_size": 128, "num_labels": 10},
        (8, 3, 128, 128),
    ),
    ZooCase(
        "regnet",
        "CNN",
        "RegNetY: grouped convs, squeeze-excitation",
        "RegNetConfig",
        "RegNetForImageClassification",
        {"hidden_sizes": [32, 64, 128, 256], "depths": [1, 1, 2, 1], "groups_width": 16, "num_labels": 10},
        (8, 3, 128, 128),
    ),
    ZooCase(
        "resnet",
        "CNN",
        "ResNet with basic blocks, batch norm",
        "ResNetConfig",
        "ResNetForImageClassification",
        {
            "embedding_size": 32,
            "hidden_sizes": [32, 64, 128, 256],
            "depths": [1, 1, 1, 1],
            "layer_type": "basic",
            "num_labels": 10,
        },
        (8, 3, 128, 128),
    ),
)
CASE_BY_NAME = {c.name: c for c in CASES}


def no_dropout(config: Any) -> None:
    """Every dropout, drop-path and layer-drop probability of ``config`` set to 0 (the key names
    vary by model; every float whose name has "drop" in it is one)."""
    for key, value in config.to_dict().items():
        if "drop" in key and isinstance(value, float):
            setattr(config, key, 0.0)


def config_of(case: ZooCase, quick: bool) -> Any:
    import transformers

    overrides = {**case.config, **(case.quick if quick else {})}
    config = getattr(transformers, case.config_class)(**overrides)
    no_dropout(config)
    config._attn_implementation = "eager"  # the softmax probabilities a tensor, as in the ONNX graph
    if quick and case.kind == "image" and not case.quick and hasattr(config, "image_size"):
        config.image_size = (case.quick_shape or QUICK_IMAGES)[-1]
    return config


def input_shape(case: ZooCase, quick: bool) -> tuple[int, ...]:
    if not quick:
        return case.shape
    if case.quick_shape is not None:
        return case.quick_shape
    return {"seq2seq": QUICK_SEQ2SEQ, "image": QUICK_IMAGES}.get(case.kind, QUICK_TOKENS)


def padding_mask(batch: int, tokens: int) -> Any:
    """An attention mask with padding zeros at the end of every other row (row i of the odd ones
    keeps ``tokens - (i + 1) * tokens // (2 * batch)`` tokens)."""
    import torch

    mask = torch.ones(batch, tokens, dtype=torch.long)
    for i in range(1, batch, 2):
        mask[i, tokens - (i + 1) * tokens // (2 * batch) :] = 0
    return mask


def make_inputs(case: ZooCase, config: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """The seeded inputs, in the order the wrapper's forward takes them."""
    import torch

    generator = torch.Generator().manual_seed(1)
    if case.kind == "image":
        return (torch.randn(shape, generator=generator),)
    vocab = config.vocab_size
    # ids from 3 on: clear of the special tokens (padding, start, end) some models treat apart
    if case.kind == "seq2seq":
        batch, source, target = shape
        ids = torch.randint(3, vocab, (batch, source), generator=generator)
        decoder_ids = torch.randint(3, vocab, (batch, target), generator=generator)
        return ids, padding_mask(batch, source), decoder_ids, torch.ones(batch, target, dtype=torch.long)
    ids = torch.randint(3, vocab, shape, generator=generator)
    mask = padding_mask(*shape) if case.kind == "encoder" else torch.ones(shape, dtype=torch.long)
    return ids, mask


KEYWORDS = {
    "decoder": ("input_ids", "attention_mask"),
    "encoder": ("input_ids", "attention_mask"),
    "seq2seq": ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask"),
    "image": ("pixel_values",),
}


def build(case: ZooCase, quick: bool) -> tuple[Any, tuple[Any, ...]]:
    """The model (positional inputs in, one float tensor out) with seeded random weights made
    distinct (framework.py's ``distinct_values``), and its seeded inputs."""
    import torch
    import transformers

    class OneOutput(torch.nn.Module):
        """The model called with keywords, its output object reduced to the tensor the loss is taken of."""

        def __init__(self, model: torch.nn.Module, keywords: tuple[str, ...], field_name: str) -> None:
            super().__init__()
            self.model = model
            self.keywords = keywords
            self.field_name = field_name

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return getattr(self.model(**dict(zip(self.keywords, inputs))), self.field_name)

    config = config_of(case, quick)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    torch.manual_seed(0)
    model = OneOutput(
        getattr(transformers, case.model_class)(config, **case.model_kwargs), KEYWORDS[case.kind], case.output
    )
    fw.distinct_values(model)
    return model, make_inputs(case, config, input_shape(case, quick))


def describe(case: ZooCase) -> str:
    """The model as built, for the table: ``Class(Config(overrides))``."""
    args = ", ".join(f"{k}={v!r}" for k, v in case.config.items())
    kwargs = "".join(f", {k}={v!r}" for k, v in case.model_kwargs.items())
    return f"{case.model_class}({case.config_class}({args}){kwargs}), {case.output}"


def input_text(case: ZooCase, shape: tuple[int, ...]) -> str:
    if case.kind == "image":
        return "x".join(map(str, shape))
    if case.kind == "seq2seq":
        return f"{shape[0]}x{shape[1]} -> {shape[2]} tokens"
    return f"{shape[0]}x{shape[1]} tokens" + (", padded" if case.kind == "encoder" else "")


# ---------------------------------------------------------------- the sources


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(error: BaseException) -> str:
    """What an exporter's exception says first: its type, and the first non-blank line of the
    exception that caused it (the dynamo exporter wraps the real one in a page of advice), with
    terminal colours dropped and this checkout's paths made relative."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = [line.strip() for line in ANSI.sub("", scrub(str(cause))).splitlines() if line.strip()]
    names = type(error).__name__ + ("" if cause is error else f": {type(cause).__name__}")
    return f"{names}: {lines[0] if lines else ''}"[:300]


def export_legacy(model: Any, inputs: tuple[Any, ...], path: str) -> None:
    """framework.py's export (README.md's): the TorchScript exporter, ``eval()`` mode, PRESERVE."""
    fw.export_onnx(model, inputs, path)


def export_dynamo(model: Any, inputs: tuple[Any, ...], path: str) -> None:
    """``torch.onnx.export(dynamo=True)``: torch.export then onnxscript, opset 18, the model in
    ``train()`` mode (the step's graph: batch norm on batch statistics), without the onnxscript
    optimizer (it folds constants), weights inside the file."""
    import logging

    import torch

    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [logger.level for logger in quiet]
    try:
        for logger in quiet:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model.train(),
                inputs,
                path,
                dynamo=True,
                opset_version=18,
                optimize=False,
                external_data=False,
                verbose=False,
            )
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)
        model.train()


def export_pt2(model: Any, inputs: tuple[Any, ...], path: str) -> None:
    """``torch.export.export`` of the model in ``train()`` mode, saved with ``torch.export.save``:
    PyTorch's own graph, which baechi reads as a ``.pt2`` (``--training`` traces its step)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(torch.export.export(model.train(), inputs), path)


@dataclass(frozen=True)
class Source:
    """One way of giving baechi the model: its key in zoo.json, its title in the tables, the
    exporter (model, inputs, path) and the file suffix."""

    key: str
    title: str
    export: Callable[[Any, tuple[Any, ...], str], None]
    suffix: str


SOURCES: tuple[Source, ...] = (
    Source("onnx-legacy", "legacy", export_legacy, ".onnx"),
    Source("onnx-dynamo", "dynamo", export_dynamo, ".dynamo.onnx"),
    Source("pt2", "torch.export", export_pt2, ".pt2"),
)
SOURCE_BY_KEY = {s.key: s for s in SOURCES}


def export_path(cache: str, case_name: str, source: Source, quick: bool) -> str:
    return os.path.join(cache, f"{case_name}{'-quick' if quick else ''}{source.suffix}")


def run_export(source: Source, model: Any, inputs: tuple[Any, ...], path: str) -> dict[str, Any]:
    """Export once: ``path`` (repository-relative), ``export_s``, ``bytes``; or ``error``."""
    t0 = time.perf_counter()
    if os.path.exists(path):
        os.remove(path)  # a stale file must not pass for this export
    try:
        # A copy each: an exporter may change the model it traces (the TorchScript one leaves
        # Swin's window size a traced tensor, which torch.export then cannot guard on).
        source.export(copy.deepcopy(model), inputs, path)
    except Exception as err:  # any exporter failure is a result here
        log(f"  {source.key}: export failed: {first_line(err)}")
        return {"path": rel(path), "error": first_line(err), "export_s": time.perf_counter() - t0}
    return {"path": rel(path), "export_s": time.perf_counter() - t0, "bytes": os.path.getsize(path)}


def unknown_sizes(graph: Any) -> int:
    """Outputs of forward ops whose size ONNX shape inference left unknown (the reader's
    ``_size_unknown`` attrs; each counted as one element in the predictions)."""
    return sum(
        len(graph.attrs[v].get("_size_unknown", ())) for v in range(graph.num_ops) if not graph.is_backward[v]
    )


# What the library takes besides the defaults, where it takes them (PlaceOptions' fields): a
# graph whose sizes stay unknown is refused by default; these say how far off it would be.
RETRIES = (
    ("allowing_unknown", "unknown_sizes", True),  # --allow-unknown-sizes: unknown dims count as 1
    ("infer_shapes_run", "infer_shapes", "run"),  # --infer-shapes run: sizes from one onnxruntime run
)


def predict(path: str, devices: DeviceSpec, optimizer: str) -> dict[str, Any]:
    """``baechi place PATH --training --optimizer O --algo single``: framework.py's record of the
    outcome (peak, resident, boundary, times by phase, notes) with ``unknown_sizes``; or ``error``
    (the first line), and then, where the library takes them, the same with each of
    :data:`RETRIES` (``peak_bytes``, ``step_s``, ``unknown_sizes``; or ``error``)."""
    options = PlaceOptions(algo="single", training=True, optimizer=optimizer)
    t0 = time.perf_counter()
    try:
        outcome = place_model(path, devices, options)
    except BaechiError as err:
        record: dict[str, Any] = {"error": fw.problem_line(err), "seconds": time.perf_counter() - t0}
        taken = {f.name for f in fields(PlaceOptions)}
        for key, name, value in RETRIES:
            if name not in taken:
                continue
            try:
                retried = place_model(path, devices, replace(options, **{name: value}))
            except BaechiError as again:
                record[key] = {"error": fw.problem_line(again)}
                continue
            record[key] = {
                "peak_bytes": max(retried.sim.peak_bytes),
                "step_s": retried.sim.step_time_us / 1e6,
                "unknown_sizes": unknown_sizes(retried.graph),
            }
        if "unknown_sizes" in record.get("allowing_unknown", {}):
            record["unknown_sizes"] = record["allowing_unknown"]["unknown_sizes"]
        return record
    record = fw.prediction(outcome, t0)
    record["unknown_sizes"] = unknown_sizes(outcome.graph)
    record["notes"] = [scrub(n) for n in record["notes"]]
    return record


def split(
    path: str, model: str, optimizer: str, peak: int, devices: DeviceSpec, cache: str, counts: tuple[int, ...]
) -> dict[str, Any]:
    """framework.py's auto split on each of ``counts`` devices of ``FIT_RATIO`` x ``peak`` in all,
    by device count (as a string, for JSON)."""
    folder = os.path.join(cache, fw.SPLITS_FOLDER)
    os.makedirs(folder, exist_ok=True)
    row = {"model": model, "optimizer": optimizer, "onnx": rel(path), "measured": {"peak_bytes": peak}}
    result = {}
    for count in counts:
        try:
            result[str(count)] = fw.split_attempt(row, count, devices, folder, "auto", FIT_RATIO)
        except BaechiError as err:
            result[str(count)] = {"verdict": "MISS", "placed": False, "error": fw.problem_line(err)}
    return result


def predict_source(
    record: dict[str, Any],
    name: str,
    measured: dict[str, Any],
    devices: DeviceSpec,
    args: argparse.Namespace,
) -> None:
    """Steps 3 and 4 for one export (``record``, a source's entry): ``predicted`` and ``splits``
    (on ``args.split_devices``, specs under ``args.cache``) by optimizer, and the export's
    ``unknown_sizes``."""
    if "error" in record:
        return
    path = os.path.join(ROOT, record["path"])
    record["predicted"], record["splits"] = {}, {}
    for optimizer in OPTIMIZERS:
        log(f"{name} {optimizer}: predicting from {record['path']}")
        record["predicted"][optimizer] = predict(path, devices, optimizer)
        peak = measured[optimizer]["peak_bytes"]
        record["splits"][optimizer] = split(
            path, name, optimizer, peak, devices, args.cache, args.split_devices
        )
    first = record["predicted"][OPTIMIZERS[0]]
    record["unknown_sizes"] = first.get("unknown_sizes")
    if path.endswith(".pt2"):
        record["on_measured_costs"] = {}
        for optimizer in OPTIMIZERS:
            log(f"{name} {optimizer}: measuring {record['path']}'s step op for op")
            record["on_measured_costs"][optimizer] = on_measured_costs(path, devices, optimizer)


def on_measured_costs(path: str, devices: DeviceSpec, optimizer: str) -> dict[str, Any]:
    """``baechi profile PATH --training --optimizer O --measure``: the one-device step simulated on
    the training step's ops timed in torch (this process's threads, as the eager step's), or
    ``error``."""
    from baechi_cli.app.profile import profile_model

    t0 = time.perf_counter()
    try:
        outcome = profile_model(path, devices, training=optimizer, measure=True)
    except BaechiError as err:
        return {"error": fw.problem_line(err)}
    totals = outcome.profile.totals
    return {
        "step_s": totals.single_device_step_us / 1e6,
        "measured_ops": totals.measured_ops,
        "seconds": time.perf_counter() - t0,
    }


# ---------------------------------------------------------------- one model


def run_model(case: ZooCase, args: argparse.Namespace, devices: DeviceSpec) -> dict[str, Any]:
    """Build, measure, export and predict one model."""
    t0 = time.perf_counter()
    model, inputs = build(case, args.quick)
    shape = input_shape(case, args.quick)
    entry: dict[str, Any] = {
        "family": case.family,
        "features": case.features,
        "source": describe(case),
        "input": input_text(case, shape),
        "params": sum(p.numel() for p in model.parameters()),
        "sources": {},
    }
    for source in SOURCES:
        log(f"{case.name}: exporting ({source.key})")
        entry["sources"][source.key] = run_export(
            source, model, inputs, export_path(args.cache, case.name, source, args.quick)
        )
    model.train()
    resident = fw.storage_bytes([*model.parameters(), *model.buffers(), *inputs])[1]
    entry["saved_by_node"] = fw.saved_by_node(model, inputs, resident)
    entry["measured"] = {}
    for optimizer in OPTIMIZERS:
        log(f"{case.name} {optimizer}: measuring")
        entry["measured"][optimizer] = fw.measure(model, inputs, optimizer, "cpu", args.warmup, args.steps)
        for p in model.parameters():
            p.grad = None
    del model, inputs
    for source in SOURCES:
        predict_source(entry["sources"][source.key], case.name, entry["measured"], devices, args)
    entry["seconds"] = time.perf_counter() - t0
    log(f"{case.name}: done in {entry['seconds']:.0f} s")
    return entry


# ---------------------------------------------------------------- verdicts


def consented(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """A prediction, or, where it was refused for sizes left unknown, the same placed with the
    user's consent (``--allow-unknown-sizes``: what a user who reads the refusal does next)."""
    if p and "error" in p and "error" not in p.get("allowing_unknown", {"error": 1}):
        return p["allowing_unknown"]
    return p


def ratio(entry: dict[str, Any], key: str, optimizer: str, field_name: str) -> float | None:
    """Predicted over measured ``field_name`` (peak_bytes, step_s) of one source and optimizer."""
    p = consented(entry["sources"].get(key, {}).get("predicted", {}).get(optimizer))
    if not p or "error" in p:
        return None
    return p[field_name] / entry["measured"][optimizer][field_name]


def within(value: float | None, tolerance: float) -> bool:
    return value is not None and abs(value - 1) <= tolerance


def places(entry: dict[str, Any], key: str) -> bool:
    """The source exported and baechi placed its training step with every optimizer (with
    ``--allow-unknown-sizes`` where it refused for unknown sizes: :func:`consented`)."""
    record = entry["sources"].get(key, {})
    predicted = {o: consented(p) for o, p in record.get("predicted", {}).items()}
    return "error" not in record and all(o in predicted and "error" not in predicted[o] for o in OPTIMIZERS)


def with_consent(entry: dict[str, Any], key: str) -> bool:
    """The source placed only with ``--allow-unknown-sizes``."""
    predicted = entry["sources"].get(key, {}).get("predicted", {})
    return any("error" in p and consented(p) is not p for p in predicted.values())


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The targets' counts, overall and by source."""
    models = results["models"]
    rows = [(name, o) for name in models for o in OPTIMIZERS]
    by_source = {}
    for source in results["sources"]:
        key = source["key"]
        by_source[key] = {
            "exported": sum("error" not in m["sources"].get(key, {"error": 1}) for m in models.values()),
            "placed": sum(places(m, key) for m in models.values()),
            "with_unknown_sizes": sorted(
                n for n, m in models.items() if (m["sources"].get(key, {}).get("unknown_sizes") or 0) > 0
            ),
            "with_consent": sorted(n for n, m in models.items() if with_consent(m, key)),
            "peak_pass": sum(within(ratio(models[n], key, o, "peak_bytes"), PEAK_TOLERANCE) for n, o in rows),
            "step_pass": sum(within(ratio(models[n], key, o, "step_s"), TIME_TOLERANCE) for n, o in rows),
            "splits": {},  # device count -> [placed, tried] over the rows
        }
        for n, o in rows:
            for count, record in models[n]["sources"].get(key, {}).get("splits", {}).get(o, {}).items():
                tally = by_source[key]["splits"].setdefault(count, [0, 0])
                tally[0] += record["verdict"] == "PASS"
                tally[1] += 1
    keys = [s["key"] for s in results["sources"]]
    return {
        "models": len(models),
        "rows": len(rows),
        "export_and_place": sum(any(places(m, k) for k in keys) for m in models.values()),
        "by_source": by_source,
    }


# ---------------------------------------------------------------- the tables


def fmt_ratio(value: float | None, tolerance: float) -> str:
    return "-" if value is None else fw.verdict(value, tolerance)


def export_cell(entry: dict[str, Any], key: str) -> str:
    record = entry["sources"].get(key)
    if record is None:
        return "-"
    if "error" in record:
        return "failed"
    return f"{record['export_s']:.1f} s"


def unknown_cell(entry: dict[str, Any], key: str) -> str:
    record = entry["sources"].get(key, {})
    if "error" in record or record.get("unknown_sizes") is None:
        return "-"
    return str(record["unknown_sizes"])


def peak_cell(entry: dict[str, Any], key: str, optimizer: str) -> str:
    p = entry["sources"].get(key, {}).get("predicted", {}).get(optimizer)
    if p is None:
        return "-"
    if "error" in p and consented(p) is not p:
        unknown = p.get("unknown_sizes")
        cell = fmt_ratio(ratio(entry, key, optimizer, "peak_bytes"), PEAK_TOLERANCE)
        return f"{cell}, {unknown} unknown, `--allow-unknown-sizes`"
    if "error" in p:
        unknown = p.get("unknown_sizes")
        return f"refused ({unknown} unknown)" if unknown else "not placed"
    return fmt_ratio(ratio(entry, key, optimizer, "peak_bytes"), PEAK_TOLERANCE)


def step_cell(entry: dict[str, Any], key: str, optimizer: str) -> str:
    p = consented(entry["sources"].get(key, {}).get("predicted", {}).get(optimizer))
    if p is None or "error" in p:
        return "-"
    return fmt_ratio(ratio(entry, key, optimizer, "step_s"), TIME_TOLERANCE)


def split_cell(count: int) -> Callable[[dict[str, Any], str, str], str]:
    def cell(entry: dict[str, Any], key: str, optimizer: str) -> str:
        record = entry["sources"].get(key, {}).get("splits", {}).get(optimizer, {}).get(str(count))
        if record is None:
            return "-"
        if record["verdict"] == "PASS":
            return f"placed ({record['algorithm']})"
        if record.get("placed"):
            return f"over memory ({max(record['peak_bytes']) / record['memory_bytes']:.2f})"
        return "not placed"

    return cell


@dataclass(frozen=True)
class Column:
    """A table column: its title and its cell; source columns get the source's title in front."""

    title: str
    cell: Callable[..., str]


# Per model: (name, entry) -> cell
MODEL_COLUMNS: tuple[Column, ...] = (
    Column("model", lambda name, e: name),
    Column("family", lambda name, e: e["family"]),
    Column("features", lambda name, e: e["features"]),
    Column("input", lambda name, e: e["input"]),
    Column("params", lambda name, e: f"{e['params']:,}"),
)
# Per model and source: (entry, source key) -> cell
SOURCE_COLUMNS: tuple[Column, ...] = (
    Column("export", export_cell),
    Column("unknown sizes", unknown_cell),
)
# Per (model, optimizer) row: (name, entry, optimizer) -> cell
ROW_COLUMNS: tuple[Column, ...] = (
    Column("model", lambda name, e, o: name),
    Column("optimizer", lambda name, e, o: o),
    Column("measured peak", lambda name, e, o: fw.fmt_bytes(e["measured"][o]["peak_bytes"])),
    Column("measured step", lambda name, e, o: fw.fmt_s(e["measured"][o]["step_s"])),
)
# Per row and source: (entry, source key, optimizer) -> cell
SOURCE_ROW_COLUMNS: tuple[Column, ...] = (
    Column("peak", peak_cell),
    Column("step", step_cell),
    *(Column(f"{c}-dev", split_cell(c)) for c in DEVICE_COUNTS),
)


def source_titles(results: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["key"], s["title"]) for s in results["sources"]]


def models_table(results: dict[str, Any]) -> list[str]:
    sources = source_titles(results)
    header = [c.title for c in MODEL_COLUMNS] + [f"{t} {c.title}" for _, t in sources for c in SOURCE_COLUMNS]
    body = [
        [c.cell(name, e) for c in MODEL_COLUMNS] + [c.cell(e, k) for k, _ in sources for c in SOURCE_COLUMNS]
        for name, e in results["models"].items()
    ]
    return table(header, body)


def targets_table(results: dict[str, Any]) -> list[str]:
    sources = source_titles(results)
    header = [c.title for c in ROW_COLUMNS] + [
        f"{t} {c.title}" for _, t in sources for c in SOURCE_ROW_COLUMNS
    ]
    body = [
        [c.cell(name, e, o) for c in ROW_COLUMNS]
        + [c.cell(e, k, o) for k, _ in sources for c in SOURCE_ROW_COLUMNS]
        for name, e in results["models"].items()
        for o in OPTIMIZERS
    ]
    return table(header, body)


def framework_row(name: str, entry: dict[str, Any], key: str, optimizer: str) -> dict[str, Any]:
    """A framework.json-shaped row, for framework.py's ``components`` and miss reasons."""
    return {
        "model": name,
        "optimizer": optimizer,
        "measured": entry["measured"][optimizer],
        "predicted": entry["sources"][key]["predicted"][optimizer],
        "saved_by_node": entry["saved_by_node"],
    }


def placed_rows(results: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any], str]]:
    return [
        (name, e, o)
        for name, e in results["models"].items()
        for o in OPTIMIZERS
        if "error" not in e["sources"].get(key, {}).get("predicted", {}).get(o, {"error": 1})
    ]


def memory_table(results: dict[str, Any], key: str) -> list[str]:
    body = []
    for name, e, o in placed_rows(results, key):
        row = framework_row(name, e, key, o)
        body.append(
            [
                name,
                o,
                fw.pair(
                    fw.fmt_bytes(row["measured"]["peak_bytes"]), fw.fmt_bytes(row["predicted"]["peak_bytes"])
                ),
            ]
            + [fw.pair(fw.fmt_bytes(m), fw.fmt_bytes(p)) for _, m, p in fw.components(row)]
            + [fw.pair(fw.fmt_s(row["measured"]["step_s"]), fw.fmt_s(row["predicted"]["step_s"]))]
            + [
                f"{fw.fmt_s(min(row['measured']['step_s_all']))} - {fw.fmt_s(max(row['measured']['step_s_all']))}"
            ]
        )
    header = ["model", "optimizer", "peak", "resident", "activations", "above", "step", "measured range"]
    return table(header, body)


def misses(results: dict[str, Any], key: str) -> list[str]:
    """Each row of ``key`` outside a tolerance, with framework.py's reason (the component of the
    peak that differs most; the step's phases), and the unknown sizes behind it if any."""
    lines = []
    for name, e, o in placed_rows(results, key):
        row = framework_row(name, e, key, o)
        unknown = e["sources"][key].get("unknown_sizes") or 0
        behind = f" ({unknown} outputs of unknown size, counted as 1 element each)" if unknown else ""
        peak = row["predicted"]["peak_bytes"] / row["measured"]["peak_bytes"]
        step = row["predicted"]["step_s"] / row["measured"]["step_s"]
        if not within(peak, PEAK_TOLERANCE):
            lines.append(f"- **{name} {o}, peak {peak:.2f}**{behind}: {fw.peak_reason(row)}.")
        if not within(step, TIME_TOLERANCE):
            lines.append(f"- **{name} {o}, step {step:.2f}**{behind}: {fw.time_reason(row)}.")
    return lines or ["No misses."]


ERROR_CHARS = 240  # an error's first line in zoo.md (zoo.json keeps it whole)


def short(text: str) -> str:
    return f"`{text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + '...'}`"


def retry_text(entry: dict[str, Any], p: dict[str, Any], optimizer: str) -> str:
    """What the retries of a refused prediction (:data:`RETRIES`) gave, against the measured step."""
    m = entry["measured"][optimizer]
    parts = []
    for key, name, value in RETRIES:
        if key not in p:
            continue
        flag = f"--{name.replace('_', '-')} {value}" if value is not True else "--allow-unknown-sizes"
        r = p[key]
        parts.append(
            f"with `{flag}`: "
            + (
                f"not placed ({short(r['error'])})"
                if "error" in r
                else f"peak {r['peak_bytes'] / m['peak_bytes']:.2f}, step {r['step_s'] / m['step_s']:.2f}"
                + (f", {r['unknown_sizes']} unknown" if r.get("unknown_sizes") else "")
            )
        )
    return "; ".join(parts)


def failures(results: dict[str, Any], key: str) -> list[str]:
    """Exports that failed, placements refused and splits not placed, with the first line of why
    (a split refused for the reason the one-device placement was is not repeated)."""
    lines = []
    for name, e in results["models"].items():
        record = e["sources"].get(key, {})
        if "error" in record:
            lines.append(f"- {name}: export failed: {short(record['error'])}")
            continue
        for o in OPTIMIZERS:
            p = record.get("predicted", {}).get(o, {})
            if "error" in p:
                retried = retry_text(e, p, o)
                lines.append(
                    f"- {name} {o}: not placed on one device: {short(p['error'])}"
                    + (f". {retried[0].upper()}{retried[1:]}" if retried else "")
                )
            for count, s in record.get("splits", {}).get(o, {}).items():
                if s["verdict"] == "PASS" or s.get("error") == p.get("error"):
                    continue
                why = s.get("error") or (
                    f"placed by {s.get('algorithm')}, a device's simulated peak "
                    f"{max(s['peak_bytes']) / s['memory_bytes']:.2f}x its memory"
                )
                lines.append(f"- {name} {o}, {count} devices of {FIT_RATIO:g} x P: {short(why)}")
    return lines or ["None."]


def percent(n: int, d: int) -> str:
    return f"{n} of {d} ({n / d:.0%})" if d else "0 of 0"


def summary_lines(results: dict[str, Any]) -> list[str]:
    s = summary(results)
    ok = s["export_and_place"] == s["models"]
    lines = [
        f"- **Export with at least one exporter and place** (target 100%): {percent(s['export_and_place'], s['models'])} "
        f"models: **{'PASS' if ok else 'MISS'}**.",
    ]
    for key, title in source_titles(results):
        b = s["by_source"][key]
        peak_ok = b["peak_pass"] >= PEAK_TARGET * s["rows"]
        step_ok = b["step_pass"] >= STEP_TARGET * s["rows"]
        unknown = ", ".join(b["with_unknown_sizes"]) or "none"
        splits = "; ".join(
            f"{count} devices placed {percent(placed, tried)}"
            for count, (placed, tried) in b["splits"].items()
        )
        lines += [
            f"- **{title}** (`{key}`): exported {b['exported']} of {s['models']}, placed {b['placed']}; "
            f"peak within ±{PEAK_TOLERANCE:.0%} on {percent(b['peak_pass'], s['rows'])} rows (target "
            f"≥{PEAK_TARGET:.0%}): **{'PASS' if peak_ok else 'MISS'}**; step within ±{TIME_TOLERANCE:.0%} on "
            f"{percent(b['step_pass'], s['rows'])} (target ≥{STEP_TARGET:.0%}): **{'PASS' if step_ok else 'MISS'}**; "
            f"models with outputs of unknown size: {unknown}"
            + (
                f" (placed with `--allow-unknown-sizes`, the user's consent: {', '.join(b['with_consent'])}); "
                if b.get("with_consent")
                else "; "
            )
            + (f"at {FIT_RATIO:g} x P, auto: {splits}." if splits else "no splits run."),
        ]
    return lines


def method_lines(results: dict[str, Any]) -> list[str]:
    info = results["machine"]
    others = results.get("other_cores")
    load = results.get("load")
    busy = others is not None and others > fw.BUSY_CORES
    lines = [
        f"Measured on {results['date']} with torch {info['torch']}, transformers {info['transformers']}, "
        f"onnxscript {info.get('onnxscript', '-')} and onnx {info['onnx']}, on the CPU ({info['cpu']}, "
        f"{info['cores']} cores, `torch.set_num_threads({info['threads']})`): {results['warmup']} warm-up steps, "
        f"then the median of {results['steps']} steps"
        + (" (**--quick**: tiny models, a smoke run)" if results["quick"] else "")
        + f". The run took {results['wall_s'] / 60:.1f} minutes"
        + ("" if load is None else f" ({load})")
        + (
            ""
            if others is None
            else f"; other processes used {others:.2f} of the {info['cores']} cores on average"
            + (
                f" (over {fw.BUSY_CORES}): **the times, measured and calibrated, are suspect**"
                if busy
                else ""
            )
        )
        + ".",
    ]
    if results.get("predicted_date") and results["predicted_date"] != results["date"]:
        lines += ["", f"Predictions re-run on {results['predicted_date']} (`--only predict`)."]
    lines += [
        "",
        "Method: bench/zoo.py's module docstring. Each model is a transformers class built from a config in "
        "code with random weights (seed 0, then made distinct as framework.py does), dropout 0, `train()` "
        "mode, eager attention; the step is framework.py's (`opt.zero_grad(set_to_none=True); "
        "model(*inputs).float().pow(2).mean().backward(); opt.step()`, SGD lr 0.01 and Adam lr 0.001), its "
        "peak from `torch.profiler`'s memory records. Exports: **legacy** = `torch.onnx.export(model.eval(), "
        "inputs, f, dynamo=False, opset_version=17, training=TrainingMode.PRESERVE, do_constant_folding=False)`; "
        "**dynamo** = `torch.onnx.export(model.train(), inputs, f, dynamo=True, opset_version=18, "
        "optimize=False, external_data=False)`. Predictions: `baechi place EXPORT --training --optimizer O "
        "--algo single --devices SPEC` (the library's `place_model`). *unknown sizes*: outputs of forward ops "
        "whose size ONNX shape inference could not determine (counted as one element each). *2-dev*, *4-dev*: "
        f"`--algo auto` on 2 or 4 devices of SPEC's rates with memories adding up to {FIT_RATIO:g} x the "
        "measured peak P: *placed (placer)* when every device's simulated peak is within its memory.",
        "",
        "The device spec (`--devices`; by default `baechi devices calibrate --torch cpu` run just before):",
        "",
        "```yaml",
        *results["devices"].rstrip().splitlines(),
        "```",
        *fw.drift_lines(results.get("calibration_drift")),
    ]
    if results.get("calibration_noisy"):
        lines += [
            "",
            f"**The calibration {' and '.join(results['calibration_noisy'])} the measurements was noisy**: "
            f"`baechi devices calibrate` refused it {fw.CALIBRATION_TRIES} times (other processes busy, or its "
            "repeats spread wide), and it was taken with `--allow-noisy`: the predicted steps are suspect.",
        ]
    return lines


AGREEMENT = 0.05  # issue 38: the same plan's predicted step from the .pt2 and from ONNX, within 5%
PHASES = ("forward", "backward", "optimizer")


def ratio_text(a: float, b: float) -> str:
    """``a / b`` to two places; ``-`` when both are 0 (an optimizer without a step of its own)."""
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}"


def agreement_lines(results: dict[str, Any]) -> list[str]:
    """The predicted one-device step from PyTorch's own graph over the one from the legacy ONNX
    export, per model and optimizer (issue 38's target: within 5% where both are complete)."""
    keys = {s["key"] for s in results["sources"]}
    if not {"pt2", "onnx-legacy"} <= keys:
        return []
    rows, agree, both = [], 0, 0
    for name, entry in results["models"].items():
        for o in OPTIMIZERS:
            a = consented(entry["sources"].get("pt2", {}).get("predicted", {}).get(o))
            b = entry["sources"].get("onnx-legacy", {}).get("predicted", {}).get(o)
            if not a or not b or "error" in a or "error" in b or b.get("unknown_sizes"):
                continue
            r = a["step_s"] / b["step_s"]
            both += 1
            agree += abs(r - 1) <= AGREEMENT
            peak = a["peak_bytes"] / b["peak_bytes"]
            phases = {p: a[f"{p}_s"] - b[f"{p}_s"] for p in PHASES}
            where = max(phases, key=lambda p: abs(phases[p]))
            measured = entry["measured"][o]["step_s"]
            nearer = "pt2" if abs(a["step_s"] - measured) <= abs(b["step_s"] - measured) else "legacy"
            rows.append(
                [
                    name,
                    o,
                    f"{r:.2f}",
                    *(ratio_text(a[f"{p}_s"], b[f"{p}_s"]) for p in PHASES),
                    f"{where} ({phases[where] * 1e3:+.2f} ms)",
                    f"{a['ops']:,} / {b['ops']:,}",
                    nearer,
                    f"{peak:.2f}",
                ]
            )
    return [
        "## torch.export against ONNX",
        "",
        f"The one-device training step predicted from the `.pt2` over the one predicted from the legacy "
        f"ONNX export, where both are complete: within ±{AGREEMENT:.0%} on {percent(agree, both)} rows. "
        "They differ where the graphs differ: the `.pt2` step is autograd's own (its backward ops, their "
        "temporaries and order), the ONNX one is synthesized from per-op rules; and an export's ops are "
        "not eager's (the legacy exporter decomposes ops PyTorch runs as one kernel). Per row: the "
        "ratio per phase, the phase whose predicted time differs most (pt2 less legacy), the ops each "
        "graph has, and which prediction is nearer PyTorch's measured step.",
        "",
        *table(
            [
                "model",
                "optimizer",
                "step pt2 / legacy",
                *(f"{p} pt2 / legacy" for p in PHASES),
                "differs most in",
                "ops pt2 / legacy",
                "nearer PyTorch",
                "peak pt2 / legacy",
            ],
            rows,
        ),
    ]


def measured_costs_lines(results: dict[str, Any]) -> list[str]:
    """The one-device step on the ``.pt2``'s measured op times (``baechi profile --measure``)
    beside the analytic one, both over PyTorch's measured step."""
    rows, hits = [], {"analytic": 0, "measured": 0}
    for name, entry in results["models"].items():
        record = entry["sources"].get("pt2", {})
        for o in OPTIMIZERS:
            on = (record.get("on_measured_costs") or {}).get(o)
            analytic = (record.get("predicted") or {}).get(o)
            step = entry.get("measured", {}).get(o, {}).get("step_s")
            if not on or "error" in on or not analytic or "error" in analytic or not step:
                continue
            a, m = analytic["step_s"] / step, on["step_s"] / step
            hits["analytic"] += abs(a - 1) <= TIME_TOLERANCE
            hits["measured"] += abs(m - 1) <= TIME_TOLERANCE
            rows.append([name, o, fw.fmt_s(step), f"{a:.2f}", f"{m:.2f}", f"{on['seconds']:.1f} s"])
    if not rows:
        return []
    return [
        "## torch.export on measured op times",
        "",
        "The one-device training step simulated on the `.pt2`'s step as `baechi profile MODEL.pt2 --training "
        "--measure` times it (every op run in torch, op for op, on this machine's CPU, as many threads as the "
        f"eager step), over PyTorch's measured step: within ±{TIME_TOLERANCE:.0%} on {hits['measured']} of "
        f"{len(rows)} rows (the analytic prediction: {hits['analytic']} of {len(rows)}). What is left out: the "
        "autograd engine's and the optimizer's Python between ops, and the forward's recording of the autograd "
        "graph (the ops run without it).",
        "",
        *table(
            [
                "model",
                "optimizer",
                "measured step",
                "analytic / measured",
                "on measured op times / measured",
                "profile took",
            ],
            rows,
        ),
    ]


def render(results: dict[str, Any]) -> str:
    lines = [
        TITLE,
        "",
        "Written by `python bench/zoo.py` (`make bench`; needs `pip install -e '.[bench]'`). Do not edit by hand.",
        "",
        *method_lines(results),
        "",
        "## Summary",
        "",
        f"Targets (issue 37): every model exports with at least one exporter and places; one-device peak within "
        f"±{PEAK_TOLERANCE:.0%} of PyTorch's on ≥{PEAK_TARGET:.0%} of the (model, optimizer) rows; step within "
        f"±{TIME_TOLERANCE:.0%} on ≥{STEP_TARGET:.0%}.",
        "",
        *summary_lines(results),
        "",
        "## Models",
        "",
        "*export*: the exporter's seconds, or failed (why: below); *unknown sizes*: see the method.",
        "",
        *models_table(results),
        "",
        "## Targets",
        "",
        "Per model and optimizer, per source: predicted / measured peak (PASS within "
        f"±{PEAK_TOLERANCE:.0%}) and step (PASS within ±{TIME_TOLERANCE:.0%}); the splits at {FIT_RATIO:g} x P.",
        "",
        *targets_table(results),
        "",
        *agreement_lines(results),
        "",
        *measured_costs_lines(results),
    ]
    for key, title in source_titles(results):
        lines += [
            "",
            f"## {title} (`{key}`)",
            "",
            "### Memory and step",
            "",
            "Each cell is measured / predicted. *activations*: the live bytes at the forward/backward boundary "
            "less resident; *above*: peak - boundary.",
            "",
            *memory_table(results, key),
            "",
            "### Why each miss misses",
            "",
            *misses(results, key),
            "",
            "### Not exported, not placed",
            "",
            *failures(results, key),
        ]
        notes = sorted(
            {
                (name, n)
                for name, e in results["models"].items()
                for p in e["sources"].get(key, {}).get("predicted", {}).values()
                for n in p.get("notes", ())
            }
        )
        if notes:
            lines += ["", "### baechi's notes", "", *(f"- {name}: {n}" for name, n in notes)]
    lines += [
        "",
        "## Models as built",
        "",
        *(f"- {n}: `{e['source']}`" for n, e in results["models"].items()),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def note_missing(out: str, missing: str) -> None:
    """Say at the top of an existing zoo.md that this run measured nothing (the tables stay)."""
    path = os.path.join(out, MD_NAME)
    note = f"{fw.NOTE_PREFIX} {missing} was not installed at the last run ({time.strftime('%Y-%m-%d')}); `{INSTALL_HINT}`."
    lines = [TITLE, ""]
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if len(lines) > 2 and lines[2].startswith(fw.NOTE_PREFIX):
            del lines[2:4]
    os.makedirs(out, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join([*lines[:2], note, "", *lines[2:]]).rstrip("\n") + "\n")


def calibrate(args: argparse.Namespace, suffix: str = "") -> tuple[DeviceSpec, str, bool]:
    """framework.py's :func:`~framework.calibrated_until_quiet` on the CPU: its spec, its YAML and
    whether it was noisy (zoo.md then says so)."""
    return fw.calibrated_until_quiet(args.cache, "cpu", args.threads, args.quick, suffix)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help=f"comma-separated, of: {', '.join(CASE_BY_NAME)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny models, few steps: a smoke run")
    parser.add_argument(
        "--devices",
        help="baechi device spec (e.g. 1x1TB) or YAML file (default: baechi devices calibrate, now)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads")
    parser.add_argument("--warmup", type=int, default=fw.WARMUP)
    parser.add_argument(
        "--steps", type=int, help=f"timed steps (default {fw.STEPS}, --quick {fw.QUICK_STEPS})"
    )
    parser.add_argument(
        "--out", help="folder for zoo.md and zoo.json (default bench/; --quick: a temp folder)"
    )
    parser.add_argument(
        "--cache", help="folder for the exports and split specs (default bench/cache/zoo; --quick: --out)"
    )
    parser.add_argument(
        "--only",
        choices=("predict",),
        help="predict: re-predict (and split) from --out's zoo.json and the cached exports, without torch",
    )
    parser.add_argument(
        "--split-devices",
        default=",".join(map(str, DEVICE_COUNTS)),
        help=f"device counts of the auto splits at {FIT_RATIO:g} x P, comma-separated, or none "
        f"(default {','.join(map(str, DEVICE_COUNTS))})",
    )
    args = parser.parse_args(argv)
    try:
        args.split_devices = tuple(
            int(n) for n in args.split_devices.split(",") if n and args.split_devices != "none"
        )
    except ValueError:
        parser.error(f"--split-devices takes counts such as 2,4 or none, not {args.split_devices!r}")
    names = args.models.split(",") if args.models else list(CASE_BY_NAME)
    unknown = [n for n in names if n not in CASE_BY_NAME]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(CASE_BY_NAME)}")
    args.cases = [CASE_BY_NAME[n] for n in names]
    args.steps = args.steps or (fw.QUICK_STEPS if args.quick else fw.STEPS)
    args.out = args.out or (tempfile.mkdtemp(prefix="baechi-zoo-") if args.quick else BENCH)
    args.cache = args.cache or (args.out if args.quick else CACHE)
    return args


def write_results(results: dict[str, Any], out: str) -> None:
    write_json(os.path.join(out, JSON_NAME), results)
    write_text(os.path.join(out, MD_NAME), render(results))
    log(f"wrote {os.path.join(out, MD_NAME)} and {JSON_NAME}")


def repredict(args: argparse.Namespace) -> int:
    """``--only predict``: steps 3 and 4 again for ``--models`` of ``--out``'s zoo.json, from the
    cached exports; the measurements kept. 2 when zoo.json is missing."""
    path = os.path.join(args.out, JSON_NAME)
    if not os.path.exists(path):
        log(f"bench/zoo.py --only predict: no {path}; run bench/zoo.py without --only first")
        return 2
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    if args.devices:
        devices, results["devices"] = fw.devices_from(args.devices)
    else:
        devices = fw.devices_of_text(results["devices"])
    names = {case.name for case in args.cases}
    for name, entry in results["models"].items():
        if name not in names:
            continue
        for record in entry["sources"].values():
            if "error" in record:
                continue
            if not os.path.exists(os.path.join(ROOT, record["path"])):
                log(f"bench/zoo.py --only predict: {record['path']} missing; run without --only to export")
                return 2
            predict_source(record, name, entry["measured"], devices, args)
    results["predicted_date"] = time.strftime("%Y-%m-%d")
    results["summary"] = summary(results)
    write_results(results, args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only == "predict":
        return repredict(args)
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        log(f"bench/zoo.py: {' and '.join(missing)} not installed, nothing measured; {INSTALL_HINT}")
        note_missing(args.out, " and ".join(missing))
        return 0
    import torch

    run = Run()
    torch.set_num_threads(args.threads)
    os.makedirs(args.cache, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    start = fw.cpu_clock()
    noisy = []
    if args.devices:
        devices, devices_text = fw.devices_from(args.devices)
    else:
        devices, devices_text, was_noisy = calibrate(args)
        noisy += ["before"] * was_noisy
    models = {}
    for case in args.cases:
        models[case.name] = run_model(case, args, devices)
    rates_drift = None
    if not args.devices:
        again, _, was_noisy = calibrate(args, "-after")
        noisy += ["after"] * was_noisy
        rates_drift = fw.drift(devices, again)
    run.stop()
    machine = fw.machine("cpu", args.threads)
    machine["onnxscript"] = (
        importlib.metadata.version("onnxscript") if importlib.util.find_spec("onnxscript") else None
    )
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "predicted_date": time.strftime("%Y-%m-%d"),
        "wall_s": run.seconds,
        "other_cores": fw.other_cores(start, fw.cpu_clock()),
        "load": run.load_text(),
        "calibration_drift": rates_drift,
        "calibration_noisy": noisy,  # the calibrations (before, after the measurements) taken with --allow-noisy
        "machine": machine,
        "quick": args.quick,
        "warmup": args.warmup,
        "steps": args.steps,
        "devices": devices_text,
        "peak_tolerance": PEAK_TOLERANCE,
        "time_tolerance": TIME_TOLERANCE,
        "fit_ratio": FIT_RATIO,
        "sources": [{"key": s.key, "title": s.title} for s in SOURCES],
        "models": models,
    }
    results["summary"] = summary(results)
    write_results(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
