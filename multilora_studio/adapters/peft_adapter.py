"""Read and validate a PEFT LoRA folder into host tensors, before anything reaches a device.

Only safetensors are read: pickle files (``.bin``, ``.pt``) can run code when
loaded and are refused. The config schema, the safetensors header (every
declared size, dtype and shape against the base model) and the tensor names are
checked before any tensor data is read; the values are checked for NaN/Inf after.
Every problem raises ``AdapterError`` with a message a person can act on.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from multilora_studio.adapters.adapter_config import (
    ADDED_TOKENS_FILE,
    CONFIG_FILE,
    FUSED_TARGETS,
    MAX_ADAPTER_BYTES,
    PROJECTION_TARGETS,
    SUPPORTED_TARGETS,
    UNSUPPORTED_FLAGS,
    WEIGHTS_FILE,
    AdapterConfig,
    AdapterError,
    expert_lora_refusal,
    parse_adapter_config,
    read_adapter_config,
)
from multilora_studio.adapters.adapter_files import (
    AdapterOverLimit,
    open_adapter_file,
    opened_adapter_file,
    read_adapter_file,
)
from multilora_studio.adapters.adapter_tokenizer import TOKENIZER_FILE_CAPS
from multilora_studio.adapters.safetensors_header import FLOAT_DTYPES, TensorEntry, read_header
from multilora_studio.adapters.token_tables import (
    TokenTables,
    is_token_tensor,
    plan_token_tables,
    read_token_tables,
)
from multilora_studio.adapters.vocab_shape import VocabShape

__all__ = [
    "CONFIG_FILE",
    "MAX_ADAPTER_BYTES",
    "SUPPORTED_TARGETS",
    "UNSUPPORTED_FLAGS",
    "WEIGHTS_FILE",
    "AdapterError",
    "HostAdapter",
    "load_peft_adapter",
    "parse_factor_key",
    "read_adapter_config",
]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# decoder path (a causal LM's, or gemma3's image-text model's, either naming), layer, block,
# module, A|B
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(model|model\.language_model|language_model\.model)\.layers\.(\d+)\."
    r"(self_attn|mlp)\.(\w+)\.(lora_A|lora_B|lora_magnitude_vector)(?:\.default)?(?:\.(weight|bias))?$"
)
# (PEFT tensor, suffix) -> factor kind: A [r, in], B [out, r], B's bias [out] (lora_bias), DoRA's
# magnitude [out]
_KINDS = {
    ("lora_A", "weight"): "A",
    ("lora_B", "weight"): "B",
    ("lora_B", "bias"): "bias",
    ("lora_magnitude_vector", None): "magnitude",
    ("lora_magnitude_vector", "weight"): "magnitude",
}
# An image-text model's image path (gemma3's vision tower and projector): its LoRA changes
# image inputs only, which the engine does not take, so text outputs are the same without it
_IMAGE_PATH = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(?:vision_tower|multi_modal_projector)\.")
_TENSOR_NAMES = {
    "A": "lora_A",
    "B": "lora_B",
    "bias": "lora_B bias",
    "magnitude": "lora_magnitude_vector (DoRA)",
}
# Tensor names PEFT writes for contents we cannot serve, and how to name them.
_UNSUPPORTED_TENSORS = (("lora_embedding_", "embedding LoRA (embed_tokens)"),)
# a mixture-of-experts layer's router (``mlp.gate``, ``block_sparse_moe.gate``) or experts (one
# expert's projection, or the fused expert parameters)
_EXPERT_MODULE = re.compile(r"\.(mlp|block_sparse_moe)\.(gate|experts)(\.|$)")

ShapeOf = Callable[[str], tuple[int, int]]
# The largest gain lora_gain allows: an activation of float16's largest value (65504) through
# the adapter still fits float32.
MAX_LORA_GAIN = torch.finfo(torch.float32).max / torch.finfo(torch.float16).max
Factor = tuple[int, str, str]  # (layer, module, "A" | "B" | "bias" | "magnitude")


@dataclass
class HostAdapter:
    """One adapter's LoRA factors in host memory, scale folded into B.

    ``weights[(layer, module)] = (A [rank, in], B_scaled [out, rank])``; with ``lora_bias``,
    ``biases[(layer, module)]`` = B's bias times the scale [out]; with DoRA,
    ``magnitudes[(layer, module)]`` [out] (the output is scaled per row by magnitude / the row
    norm of W + B_scaled A, computed once against the base weights when a slot is filled);
    ``tokens``: the embedding and LM-head rows it replaces (modules_to_save, trainable or added
    tokens), None when it has none; ``invocation_tokens``: an activated LoRA's (aLoRA) invocation
    (``AdapterConfig.invocation_tokens``), () for any other adapter.
    """

    name: str
    path: Path
    rank: int
    alpha: float
    targets: tuple[str, ...]
    base_model: str | None
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    kind: str = "LoRA"  # AdapterConfig.kind
    biases: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict, repr=False)
    magnitudes: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict, repr=False)
    tokens: TokenTables | None = field(default=None, repr=False)
    invocation_tokens: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        vectors = sum(t.nbytes for t in (*self.biases.values(), *self.magnitudes.values()))
        tables = self.tokens.nbytes if self.tokens is not None else 0
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values()) + vectors + tables


FLOAT32_MAX = torch.finfo(torch.float32).max  # scale x B past it overflows, whatever A is


def peak(tensor: torch.Tensor) -> float:
    """The largest |value| of ``tensor``, NaN or Inf when it holds one: one min/max pass (NaN
    propagates), ~13x faster than isfinite().all(); 0 when empty."""
    if tensor.numel() == 0:
        return 0.0
    low, high = torch.aminmax(tensor)
    return max(abs(float(low)), abs(float(high))) if math.isfinite(low) and math.isfinite(high) else math.nan


def lora_gain(a: torch.Tensor, peak_a: float, peak_b: float, scale: float) -> float:
    """A bound on |x @ A.T @ (scale B).T| for |x| <= 1, from the factors' peaks."""
    rank, inputs = a.shape  # a: [rank, in], b: [out, rank]
    return peak_a * inputs * peak_b * abs(scale) * rank


def load_peft_adapter(
    name: str,
    folder: Path,
    num_layers: int,
    shape_of: ShapeOf,
    max_rank: int,
    vocab: VocabShape | None = None,
    dtype: torch.dtype = torch.float32,
) -> HostAdapter:
    """Validate the PEFT folder and return its factors (scale folded into B).

    Factors stored in ``dtype`` stay in it (the scale multiplies in float32 and rounds once,
    as it would through float32); others are returned as float32. ``vocab``, when given,
    checks the embedding / LM-head tensors and added tokens against the base's vocabulary;
    without it, an adapter that has them is refused (nothing to check them against).
    """
    folder = Path(folder)
    config = parse_adapter_config(read_adapter_config(folder), folder, max_rank)
    with opened_adapter_file(weights_file(folder), MAX_ADAPTER_BYTES) as weights_path:
        header = read_header(weights_path)
        token_plan = plan_token_tables(folder, header, config, vocab)
        _check_invocation(folder, config, token_plan is not None, vocab)
        if vocab is not None:
            _check_added_tokens(folder, token_plan.vocab_size if token_plan else vocab.vocab_size)
        elif token_plan is not None:
            raise AdapterError(
                f"{folder}: its embed_tokens / lm_head tensors need the base's vocabulary to check"
            )
        factors, decoder = _plan_factors(folder, header, config, num_layers, shape_of, max_rank)
        tensors = _read_factors(weights_path, factors, dtype)
        tokens = None
        if token_plan is not None and vocab is not None:
            tokens = read_token_tables(weights_path, token_plan, vocab, dtype)
    weights, biases, magnitudes = {}, {}, {}
    for (layer, module), found in sorted(tensors.items()):
        a, b = found["A"], found["B"]
        peaks = {which: peak(tensor) for which, tensor in found.items()}
        if not all(map(math.isfinite, peaks.values())):
            raise AdapterError(f"{folder}: layer {layer} {module} holds NaN or Inf weights")
        scale = config.scale_of(layer, module, a.shape[0], decoder)
        b_scaled = b * scale  # [out, rank]
        gain = lora_gain(a, peaks["A"], peaks["B"], scale) if math.isfinite(scale) else math.inf
        if not (gain <= MAX_LORA_GAIN and peaks["B"] * abs(scale) <= FLOAT32_MAX):
            raise AdapterError(
                f"{folder}: layer {layer} {module}: lora_alpha (or its alpha_pattern) gives scale "
                f"{scale:g}, and the scaled factors overflow float32; lora_alpha is too large"
            )
        for part, b_part in _split_fused(module, b_scaled, shape_of):
            weights[(layer, part)] = (a.contiguous(), b_part.contiguous())
        if "bias" in found:  # scaled as PEFT scales lora_B's output, bias included
            for part, bias in _split_fused(module, found["bias"] * scale, shape_of):
                biases[(layer, part)] = bias.contiguous()
        if "magnitude" in found:
            for part, magnitude in _split_fused(module, found["magnitude"], shape_of):
                magnitudes[(layer, part)] = magnitude.contiguous()
    return HostAdapter(
        name=name,
        path=folder,
        rank=max(a.shape[0] for a, _ in weights.values()),
        alpha=config.alpha,
        targets=tuple(sorted({module for _, module in weights}, key=PROJECTION_TARGETS.index)),
        base_model=config.base_model,
        weights=weights,
        kind=config.kind,
        biases=biases,
        magnitudes=magnitudes,
        tokens=tokens,
        invocation_tokens=config.invocation_tokens,
    )


@dataclass(frozen=True)
class AdapterSummary:
    """What validation learns from the config and the safetensors header, without the weights."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    size_bytes: int
    base_model: str | None
    kind: str = "LoRA"  # AdapterConfig.kind
    tokens: str = ""  # TokenTablePlan.label ("" when the adapter replaces no token rows)
    vocab_size: int | None = None  # the adapter's vocabulary (None: the base's)
    table_values: int = 0  # the values of its whole embed_tokens / lm_head matrices
    invocation_tokens: tuple[int, ...] = ()  # AdapterConfig.invocation_tokens (aLoRA)


def inspect_peft_adapter(
    folder: Path,
    num_layers: int,
    shape_of: ShapeOf,
    max_rank: int,
    vocab: VocabShape | None = None,
) -> AdapterSummary:
    """Every check of ``load_peft_adapter`` that needs no tensor data (NaN/Inf is checked at load)."""
    folder = Path(folder)
    config = parse_adapter_config(read_adapter_config(folder), folder, max_rank)
    with opened_adapter_file(weights_file(folder), MAX_ADAPTER_BYTES) as weights_path:
        header = read_header(weights_path)
        size_bytes = weights_path.stat().st_size
    token_plan = plan_token_tables(folder, header, config, vocab)
    _check_invocation(folder, config, token_plan is not None, vocab)
    if vocab is not None:
        _check_added_tokens(folder, token_plan.vocab_size if token_plan else vocab.vocab_size)
    factors, _ = _plan_factors(folder, header, config, num_layers, shape_of, max_rank)
    ranks = [header[key].shape[0] for key, (_, _, which) in factors.items() if which == "A"]
    modules = {part for _, module, _ in factors.values() for part in FUSED_TARGETS.get(module, (module,))}
    return AdapterSummary(
        rank=max(ranks),
        alpha=config.alpha,
        targets=tuple(sorted(modules, key=PROJECTION_TARGETS.index)),
        size_bytes=size_bytes,
        base_model=config.base_model,
        kind=config.kind,
        tokens=token_plan.label if token_plan is not None else "",
        vocab_size=token_plan.vocab_size if token_plan is not None and vocab is not None else None,
        table_values=sum(math.prod(header[key].shape) for key in token_plan.whole.values())
        if token_plan
        else 0,
        invocation_tokens=config.invocation_tokens,
    )


def _split_fused(module: str, rows: torch.Tensor, shape_of: ShapeOf) -> list[tuple[str, torch.Tensor]]:
    """``[(projection, rows)]``: a fused module's B [sum of parts' out, rank] (or its bias or
    magnitude [sum of parts' out]) cut into its parts' rows (they share its A); a plain
    projection as it is."""
    parts = FUSED_TARGETS.get(module)
    if parts is None:
        return [(module, rows)]
    sizes = [shape_of(part)[0] for part in parts]
    return list(zip(parts, rows.split(sizes), strict=True))


def weights_file(folder: Path) -> Path:
    """The folder's safetensors weights; AdapterError if missing (naming pickles), not a regular
    file (``adapter_files``) or too large."""
    path = folder / WEIGHTS_FILE
    if not os.path.lexists(path):
        pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise AdapterError(
                f"{folder}: only pickle weights ({', '.join(pickles)}) found; pickle files can run "
                "code when loaded and are refused. Re-save the adapter with safe_serialization=True"
            )
        raise AdapterError(f"{folder} has no {WEIGHTS_FILE}")
    os.close(open_adapter_file(path, MAX_ADAPTER_BYTES))  # a link, a pipe or too large: refused
    return path


def _check_invocation(
    folder: Path, config: AdapterConfig, has_tables: bool, vocab: VocabShape | None
) -> None:
    """AdapterError when an activated LoRA's invocation lies outside the base's vocabulary (when
    ``vocab`` is known) or it replaces embedding / LM-head rows (its tokens before the
    invocation would not be the base model's)."""
    invocation = config.invocation_tokens
    if not invocation:
        return
    if has_tables:
        raise AdapterError(
            f"{folder}: activated LoRA (alora_invocation_tokens) with embed_tokens / lm_head tensors "
            "is not served: they would change the tokens before the invocation, which an aLoRA "
            "request runs as the base model"
        )
    if vocab is None:
        return
    outside = [i for i in invocation if i >= vocab.vocab_size]
    if outside:
        raise AdapterError(
            f"{folder}: alora_invocation_tokens has token ids outside the base's vocabulary "
            f"[0, {vocab.vocab_size}): {outside[:5]}; was the adapter trained on another base model?"
        )


def _check_added_tokens(folder: Path, vocab_size: int) -> None:
    """AdapterError when ``added_tokens.json`` has ids outside the adapter's vocabulary."""
    path = folder / ADDED_TOKENS_FILE
    if not os.path.lexists(path):
        return
    data = read_adapter_file(path, TOKENIZER_FILE_CAPS[ADDED_TOKENS_FILE])
    try:
        added = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(f"{path} is not valid JSON: {error}") from None
    except RecursionError:
        raise AdapterError(f"{path}: JSON nested too deeply") from None
    if not isinstance(added, dict):
        raise AdapterError(f"{path} must map token strings to ids")
    new = sorted(t for t, i in added.items() if not isinstance(i, int) or i >= vocab_size)
    if new:
        raise AdapterError(
            f"{folder}: adds tokens ({', '.join(map(repr, new[:5]))}) outside its vocabulary of "
            f"{vocab_size}; an adapter that adds tokens must hold its resized embed_tokens and lm_head "
            "(save it with save_embedding_layers=True)"
        )


def parse_factor_key(key: str) -> tuple[str, int, str, str] | None:
    """(decoder path, layer, module, "A" | "B" | "bias" | "magnitude") of a PEFT LoRA tensor
    name; None for any other name."""
    match = _KEY.match(key)
    kind = _KINDS.get((match[5], match[6])) if match is not None else None
    if match is None or kind is None:
        return None
    return match[1], int(match[2]), match[4], kind


def _plan_factors(
    folder: Path,
    header: dict[str, TensorEntry],
    config: AdapterConfig,
    num_layers: int,
    shape_of: ShapeOf,
    max_rank: int,
) -> tuple[dict[str, Factor], str]:
    """Map tensor names to (layer, module, A|B) after checking names, dtypes and shapes from the
    header; with the decoder path the names share (what rank/alpha pattern keys match against)."""
    factors: dict[str, Factor] = {}
    decoders: set[str] = set()
    unsupported: set[str] = set()
    for key, entry in header.items():
        if _IMAGE_PATH.match(key) or is_token_tensor(key):
            continue
        parsed = parse_factor_key(key)
        if parsed is None or parsed[2] not in SUPPORTED_TARGETS:
            unsupported.add(_describe_unsupported(key))
            continue
        decoder, layer, module, kind = parsed
        factors[key] = (layer, module, kind)
        decoders.add(decoder)
        if entry.dtype not in FLOAT_DTYPES:
            raise AdapterError(f"{folder}: tensor {key!r} has dtype {entry.dtype}; LoRA factors are floats")
    if unsupported:
        raise AdapterError(f"{folder}: unsupported adapter contents: {', '.join(sorted(unsupported))}")
    if not factors:
        raise AdapterError(f"{folder / WEIGHTS_FILE} holds no LoRA tensors")
    if len(decoders) > 1:
        raise AdapterError(
            f"{folder}: LoRA tensors under more than one model path: {', '.join(sorted(decoders))}"
        )
    (decoder,) = decoders
    pairs: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
    for key, (layer, module, which) in factors.items():
        if config.targets is not None and module not in config.targets:
            raise AdapterError(f"{folder}: tensor {key!r} targets {module}, not in target_modules")
        if layer >= num_layers:
            raise AdapterError(
                f"{folder}: tensor {key!r} is for layer {layer}, the base model has {num_layers} "
                "layers; was it trained on another base model?"
            )
        pairs.setdefault((layer, module), {})[which] = header[key].shape
    overlaps = sorted(
        (layer, fused, part)
        for (layer, fused) in pairs
        for part in FUSED_TARGETS.get(fused, ())
        if (layer, part) in pairs
    )
    if overlaps:
        layer, fused, part = overlaps[0]
        raise AdapterError(
            f"{folder}: layer {layer} has LoRA on both {fused} and {part}, which it contains; "
            "an adapter targets either the fused projection or its parts"
        )
    expected = (
        {"A", "B"} | ({"magnitude"} if config.use_dora else set()) | ({"bias"} if config.lora_bias else set())
    )
    for (layer, module), shapes in sorted(pairs.items()):
        if set(shapes) != expected:
            missing = ", ".join(_TENSOR_NAMES[k] for k in sorted(expected - set(shapes)))
            extra = ", ".join(_TENSOR_NAMES[k] for k in sorted(set(shapes) - expected))
            problem = (
                f"lacks its {missing} tensor"
                if missing
                else f"has {extra}, which {CONFIG_FILE} does not declare"
            )
            raise AdapterError(f"{folder}: layer {layer} {module} {problem}")
        _check_pair(
            folder, layer, module, shapes["A"], shapes["B"], shape_of(module), config, max_rank, decoder
        )
        out_features = shape_of(module)[0]
        for kind in ("bias", "magnitude"):
            if kind in shapes and shapes[kind] != (out_features,):
                raise AdapterError(
                    f"{folder}: layer {layer} {module} has a {_TENSOR_NAMES[kind]} of shape "
                    f"{list(shapes[kind])}; the base model needs [{out_features}]. The adapter was "
                    "trained on a different base model"
                )
    return factors, decoder


def _check_pair(
    folder: Path,
    layer: int,
    module: str,
    a: tuple[int, ...],
    b: tuple[int, ...],
    base_shape: tuple[int, int],
    config: AdapterConfig,
    max_rank: int,
    decoder: str,
) -> None:
    out_features, in_features = base_shape
    if len(a) != 2 or len(b) != 2 or a[1] != in_features or b != (out_features, a[0]):
        raise AdapterError(
            f"{folder}: layer {layer} {module} has A {list(a)} and B {list(b)}; the base model needs "
            f"A [r, {in_features}] and B [{out_features}, r]. The adapter was trained on a different "
            "base model"
        )
    rank = a[0]
    if rank > max_rank:
        raise AdapterOverLimit(
            "{folder}: layer {layer} {module} has rank {rank} > {max_lora_rank:=}",
            {"max_lora_rank": max_rank},
            {"folder": folder, "layer": layer, "module": module, "rank": rank},
        )
    declared = config.rank_of(layer, module, decoder)
    if rank != declared:
        raise AdapterError(
            f"{folder}: layer {layer} {module} has rank {rank} but {CONFIG_FILE} declares r={declared}"
        )


def _describe_unsupported(key: str) -> str:
    for marker, label in _UNSUPPORTED_TENSORS:
        if marker in key:
            return label
    if "lm_head" in key and "lora_" in key:
        return "lm_head LoRA"
    if key.endswith(".bias"):
        return f"trained bias terms other than lora_B's ({key})"
    if "lora_" in key:
        module = key.rsplit(".lora_", maxsplit=1)[0]
        if _EXPERT_MODULE.search(module):
            return expert_lora_refusal(module)
        return f"LoRA on {module} (supported: {', '.join(SUPPORTED_TARGETS)})"
    return f"tensor {key!r} (only LoRA factors of {', '.join(SUPPORTED_TARGETS)} can be served)"


def _read_factors(
    path: Path, factors: dict[str, Factor], dtype: torch.dtype
) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    """Each (layer, module)'s tensors by kind ("A", "B", and "bias" or "magnitude" if it has them)."""
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for key, (layer, module, which) in factors.items():
                tensor = handle.get_tensor(key)
                if tensor.dtype != dtype:
                    tensor = tensor.to(torch.float32)
                found.setdefault((layer, module), {})[which] = tensor
    except SafetensorError as error:
        raise AdapterError(f"{path} is corrupt or truncated: {error}") from None
    return found
