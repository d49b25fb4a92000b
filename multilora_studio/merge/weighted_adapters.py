"""Several LoRA adapters of one base combined with weights into one new PEFT adapter.

The two combinations of PEFT's ``add_weighted_adapter``, with its semantics (``s_i``: adapter
i's LoRA scale of that layer and module, ``w_i`` its weight):

* ``linear``: ``A = sum_i sign(w_i s_i) sqrt(|w_i s_i|) A_i``, ``B = sum_i sqrt(|w_i s_i|) B_i``
  (every adapter of the same rank; the cross terms make it not the sum of the deltas);
* ``cat``: ``A = [w_1 s_1 A_1; w_2 s_2 A_2; ...]``, ``B = [B_1, B_2, ...]`` of rank
  ``sum_i r_i``, which is exactly ``sum_i w_i s_i B_i A_i``.

The new adapter's ``lora_alpha`` equals its rank (scale 1 without rsLoRA), as PEFT sets it.
Every (layer, module) that any input trains gets factors (zeros where an input has none), so
the folder loads in PEFT whatever its ``init_lora_weights``. Inputs are plain LoRA: DoRA,
``lora_bias``, activated LoRA (aLoRA) and vocabulary changes have no weighted combination and
are refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from multilora_studio.adapters.adapter_config import (
    ATTENTION_TARGETS,
    CONFIG_FILE,
    FUSED_TARGETS,
    MAX_ADAPTER_BYTES,
    AdapterConfig,
    parse_adapter_config,
    read_adapter_config,
)
from multilora_studio.adapters.adapter_files import opened_adapter_file
from multilora_studio.adapters.peft_adapter import WEIGHTS_FILE, parse_factor_key, weights_file
from multilora_studio.merge.merged_weights import MergeError

COMBINATIONS = ("linear", "cat")
MAX_RANK = 1 << 16  # only shapes bound a combined rank; the engine's max_lora_rank applies when served


@dataclass(frozen=True)
class _Input:
    """One input adapter: its config, its decoder path and its (layer, module) -> (A, B) raw."""

    folder: Path
    raw_config: dict
    config: AdapterConfig
    decoder: str
    factors: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def max_rank(self) -> int:
        return max(a.shape[0] for a, _ in self.factors.values())

    def scale(self, layer: int, module: str) -> float:
        return self.config.scale_of(layer, module, self.factors[(layer, module)][0].shape[0], self.decoder)


def combine_adapters(
    folders: Sequence[Path], weights: Sequence[float], combination: str, out: Path, num_layers: int
) -> Path:
    """Write the weighted combination of ``folders`` as a PEFT folder at ``out`` (made here).

    ``num_layers``: the base's layer count (the layers every trained module gets factors for).
    MergeError (a ValueError) names what cannot be combined.
    """
    if combination not in COMBINATIONS:
        raise MergeError(f"unknown combination {combination!r}; choose one of {', '.join(COMBINATIONS)}")
    if len(folders) != len(weights) or not folders:
        raise MergeError(f"{len(folders)} adapters and {len(weights)} weights: give one weight per adapter")
    if not all(math.isfinite(w) for w in weights):
        raise MergeError("weights must be finite numbers")
    inputs = [_read_input(Path(folder)) for folder in folders]
    if len({item.decoder for item in inputs}) > 1:
        raise MergeError("the adapters name the model's modules differently; are they for one base?")
    modules = sorted({module for item in inputs for _, module in item.factors})
    _refuse_overlaps(modules)
    ranks = [item.max_rank for item in inputs]
    if combination == "linear":
        all_ranks = {a.shape[0] for item in inputs for a, _ in item.factors.values()}
        if len(all_ranks) != 1:
            raise MergeError(
                f"a linear combination needs every adapter at one rank (found ranks "
                f"{', '.join(map(str, sorted(all_ranks)))}); use the cat combination"
            )
    new_rank = ranks[0] if combination == "linear" else sum(ranks)
    tensors: dict[str, torch.Tensor] = {}
    decoder = inputs[0].decoder
    for layer in range(num_layers):
        for module in modules:
            a, b = _combined(inputs, weights, combination, layer, module, new_rank)
            prefix = f"base_model.model.{decoder}.layers.{layer}.{_block(module)}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    out.mkdir(parents=True, exist_ok=False)
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(_new_config(inputs, new_rank, modules), indent=2) + "\n")
    return out


def _read_input(folder: Path) -> _Input:
    raw = read_adapter_config(folder)
    config = parse_adapter_config(raw, folder, MAX_RANK)
    if (
        config.use_dora
        or config.lora_bias
        or config.invocation_tokens
        or config.modules_to_save
        or config.trainable_tokens
    ):
        vocabulary = (
            " with embedding / LM-head changes" if config.modules_to_save or config.trainable_tokens else ""
        )
        raise MergeError(
            f"{folder}: it is {config.kind}{vocabulary}; only plain LoRA adapters have a weighted combination"
        )
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    decoders = set()
    with (
        opened_adapter_file(weights_file(folder), MAX_ADAPTER_BYTES) as path,
        safe_open(str(path), framework="pt") as handle,
    ):
        for key in handle.keys():  # noqa: SIM118
            parsed = parse_factor_key(key)
            if parsed is None or parsed[3] not in ("A", "B"):
                raise MergeError(f"{folder}: tensor {key!r} is not a LoRA factor this combination supports")
            decoder, layer, module, kind = parsed
            decoders.add(decoder)
            found.setdefault((layer, module), {})[kind] = handle.get_tensor(key).float()
    if len(decoders) != 1:
        raise MergeError(f"{folder}: its LoRA tensors are under {len(decoders)} model paths")
    factors = {}
    for key, pair in found.items():
        if set(pair) != {"A", "B"}:
            raise MergeError(f"{folder}: layer {key[0]} {key[1]} lacks its lora_A or lora_B")
        factors[key] = (pair["A"], pair["B"])
    return _Input(folder, raw, config, decoders.pop(), factors)


def _refuse_overlaps(modules: list[str]) -> None:
    for fused, parts in FUSED_TARGETS.items():
        both = [part for part in parts if part in modules]
        if fused in modules and both:
            raise MergeError(
                f"one adapter trains {fused} and another {both[0]}, a part of it; they cannot be combined"
            )


def _combined(
    inputs: list[_Input], weights: Sequence[float], combination: str, layer: int, module: str, new_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [new_rank, in], B [out, new_rank]) of one module, zeros where no input trains it."""
    present = [(item, w) for item, w in zip(inputs, weights, strict=True) if (layer, module) in item.factors]
    out_features, in_features = _module_dims(inputs, module)
    a_new = torch.zeros(new_rank, in_features)
    b_new = torch.zeros(out_features, new_rank)
    row = 0
    for item, weight in present:
        a, b = item.factors[(layer, module)]  # [r, in], [out, r]
        scaled = weight * item.scale(layer, module)
        if combination == "linear":
            root = math.sqrt(abs(scaled))
            a_new += math.copysign(root, scaled) * a
            b_new += root * b
        else:
            rank = a.shape[0]
            a_new[row : row + rank] = scaled * a
            b_new[:, row : row + rank] = b
            row += rank
    return a_new, b_new


def _module_dims(inputs: list[_Input], module: str) -> tuple[int, int]:
    """(out_features, in_features) of ``module``, from the first input that trains it."""
    for item in inputs:
        for (_, found), (a, b) in item.factors.items():
            if found == module:
                return b.shape[0], a.shape[1]
    raise MergeError(f"no adapter trains {module}")


def _block(module: str) -> str:
    return "self_attn" if module in ATTENTION_TARGETS else "mlp"


def _new_config(inputs: list[_Input], new_rank: int, modules: list[str]) -> dict:
    """The first input's config with PEFT's changes: rank, alpha = rank, the modules trained, no
    rank or alpha patterns, every layer."""
    config = dict(inputs[0].raw_config)
    config.update(
        r=new_rank,
        lora_alpha=new_rank,
        target_modules=modules,
        rank_pattern={},
        alpha_pattern={},
        layers_to_transform=None,
        layers_pattern=None,
    )
    return config
