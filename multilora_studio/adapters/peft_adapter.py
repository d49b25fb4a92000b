"""Read and validate a PEFT LoRA folder into host tensors, before anything reaches a device.

Only safetensors are read: pickle files (``.bin``, ``.pt``) can run code when
loaded and are refused. Every problem raises ``AdapterError`` with a message a
person can act on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
SUPPORTED_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_ADAPTER_BYTES = 8 << 30
_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)
UNSUPPORTED_FLAGS = {
    "use_dora": "DoRA",
    "modules_to_save": "modules_to_save (fully trained extra modules)",
    "trainable_token_indices": "trainable token embeddings",
    "layer_replication": "layer replication",
    "use_qalora": "QA-LoRA",
    "lora_bias": "LoRA bias terms",
}


class AdapterError(ValueError):
    """An adapter that cannot be used, with the reason."""


@dataclass
class HostAdapter:
    """One adapter's LoRA factors in host memory, scale folded into B.

    ``weights[(layer, module)] = (A [rank, in], B_scaled [out, rank])``
    """

    name: str
    path: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    base_model: str | None
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


ShapeOf = Callable[[str], tuple[int, int]]


def read_adapter_config(folder: Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise AdapterError(f"{folder} is not a folder")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise AdapterError(f"{folder} has no {CONFIG_FILE}; is it a PEFT adapter folder?")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    return config


def _check_config(config: dict, folder: Path, max_rank: int) -> tuple[int, float, tuple[str, ...]]:
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterError(f"{folder}: only LoRA adapters are supported, this one is {peft_type}")
    unsupported = [label for key, label in UNSUPPORTED_FLAGS.items() if config.get(key)]
    if unsupported:
        raise AdapterError(f"{folder}: unsupported adapter contents: {', '.join(unsupported)}")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{folder}: 'r' must be a positive integer, got {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"{folder}: 'lora_alpha' must be a number, got {alpha!r}")
    ranks = [rank, *config.get("rank_pattern", {}).values()]
    if max(ranks) > max_rank:
        raise AdapterError(
            f"{folder}: rank {max(ranks)} exceeds max_lora_rank={max_rank}; "
            "restart the engine with a larger max_lora_rank"
        )
    targets = config.get("target_modules")
    if isinstance(targets, str):
        raise AdapterError(
            f"{folder}: regex target_modules ({targets!r}) are not supported; list module names"
        )
    if not isinstance(targets, list) or not targets:
        raise AdapterError(f"{folder}: target_modules must be a non-empty list")
    unknown = sorted(set(targets) - set(SUPPORTED_TARGETS))
    if unknown:
        raise AdapterError(
            f"{folder}: LoRA on {', '.join(unknown)} is not supported "
            f"(supported: {', '.join(SUPPORTED_TARGETS)})"
        )
    return rank, float(alpha), tuple(sorted(targets, key=SUPPORTED_TARGETS.index))


def load_peft_adapter(
    name: str,
    folder: Path,
    num_layers: int,
    shape_of: ShapeOf,
    max_rank: int,
) -> HostAdapter:
    """Validate the PEFT folder and return its factors (float32, scale folded into B)."""
    folder = Path(folder)
    config = read_adapter_config(folder)
    _, alpha, targets = _check_config(config, folder, max_rank)
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        pickles = [p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        if pickles:
            raise AdapterError(
                f"{folder}: only pickle weights ({', '.join(pickles)}) found; pickle files can run "
                "code when loaded and are refused. Re-save the adapter with safe_serialization=True"
            )
        raise AdapterError(f"{folder} has no {WEIGHTS_FILE}")
    if weights_path.stat().st_size > MAX_ADAPTER_BYTES:
        raise AdapterError(f"{weights_path} is larger than {MAX_ADAPTER_BYTES >> 30} GiB")
    alpha_pattern = config.get("alpha_pattern", {}) or {}
    use_rslora = bool(config.get("use_rslora"))
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(weights_path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118
                match = _KEY.match(key)
                if match is None:
                    raise AdapterError(
                        f"{folder}: unsupported tensor {key!r} (only LoRA factors of "
                        f"{', '.join(SUPPORTED_TARGETS)} can be served)"
                    )
                layer, _, module, which = int(match[1]), match[2], match[3], match[4]
                if module not in targets:
                    raise AdapterError(f"{folder}: tensor {key!r} targets {module}, not in target_modules")
                if layer >= num_layers:
                    raise AdapterError(
                        f"{folder}: tensor {key!r} is for layer {layer}, the base model has {num_layers} "
                        "layers; was it trained on another base model?"
                    )
                pairs.setdefault((layer, module), {})[which] = handle.get_tensor(key)
    except SafetensorError as error:
        raise AdapterError(f"{weights_path} is corrupt or truncated: {error}") from None
    if not pairs:
        raise AdapterError(f"{weights_path} holds no LoRA tensors")
    weights = {}
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            missing = "A" if "A" not in pair else "B"
            raise AdapterError(f"{folder}: layer {layer} {module} lacks its lora_{missing} tensor")
        a, b = pair["A"].to(torch.float32), pair["B"].to(torch.float32)
        out_features, in_features = shape_of(module)
        r = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape != (out_features, r):
            raise AdapterError(
                f"{folder}: layer {layer} {module} has A {tuple(a.shape)} and B {tuple(b.shape)}; the base "
                f"model needs A [r, {in_features}] and B [{out_features}, r]. "
                "The adapter was trained on a different base model"
            )
        if r > max_rank:
            raise AdapterError(f"{folder}: layer {layer} {module} has rank {r} > max_lora_rank={max_rank}")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"{folder}: layer {layer} {module} holds NaN or Inf weights")
        module_alpha = float(_pattern_value(alpha_pattern, layer, module, alpha))
        scale = module_alpha / (math.sqrt(r) if use_rslora else r)
        weights[(layer, module)] = (a.contiguous(), (b * scale).contiguous())
    return HostAdapter(
        name=name,
        path=folder,
        rank=max(a.shape[0] for a, _ in weights.values()),
        alpha=alpha,
        targets=targets,
        base_model=config.get("base_model_name_or_path"),
        weights=weights,
    )


def _pattern_value(pattern: dict, layer: int, module: str, default: float) -> float:
    """PEFT's alpha_pattern: keys are module-name suffixes or regexes."""
    block = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    full = f"model.layers.{layer}.{block}.{module}"
    for key, value in pattern.items():
        if full.endswith(key) or re.fullmatch(key, full):
            return value
    return default
