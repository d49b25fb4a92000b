"""The schema of a PEFT ``adapter_config.json``: what we read, what we refuse, and why.

Unknown keys are ignored (PEFT adds fields every release); known keys must have
the right type, and every feature we cannot serve is named in the error.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from multilora_studio.adapters.adapter_files import AdapterError, AdapterOverLimit, read_adapter_file
from multilora_studio.adapters.module_patterns import (
    ADAPTER_BUDGET_S,
    MAX_KEY_CHARS,
    PatternMatcher,
    PatternTimeout,
)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ADDED_TOKENS_FILE = "added_tokens.json"
DEFAULT_MAX_LORA_RANK = 16  # EngineConfig.max_lora_rank's default, named here for the flags without torch
PROJECTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# fused projections (phi3's checkpoint names) -> the projections whose outputs they stack, in row
# order: one A shared by the parts, B split by rows (exactly the fused module's LoRA term)
FUSED_TARGETS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
SUPPORTED_TARGETS = (*PROJECTION_TARGETS, *FUSED_TARGETS)
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")
# a mixture-of-experts layer's router and experts (Qwen3-MoE's and Mixtral's module names)
EXPERT_TARGETS = ("gate", "experts", "w1", "w2", "w3")
MAX_CONFIG_BYTES = 1 << 20
MAX_ADAPTER_BYTES = 8 << 30  # adapter_model.safetensors
# Config keys whose truthy value means the adapter holds something we cannot serve.
UNSUPPORTED_FLAGS = {
    "layer_replication": "layer replication",
    "use_qalora": "QA-LoRA",
    "fan_in_fan_out": "fan_in_fan_out (transposed Conv1D weights)",
    "target_parameters": "LoRA on raw parameters (target_parameters)",
    "arrow_config": "Arrow routing (arrow_config)",
}
# Targets that exist in Llama-family models but change the vocabulary side.
VOCAB_TARGETS = {
    "embed_tokens": "embedding LoRA",
    "lm_head": "lm_head LoRA",
}
SERVABLE_TASKS = (None, "CAUSAL_LM")
# The vocabulary modules served whole (``modules_to_save``) or by rows (trainable tokens).
TOKEN_MODULES = ("embed_tokens", "lm_head")


@dataclass(frozen=True)
class AdapterConfig:
    """The fields of ``adapter_config.json`` that decide how the factors are served."""

    rank: int
    alpha: float
    targets: tuple[str, ...] | None  # None: a regex; the tensors decide
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    use_rslora: bool
    base_model: str | None
    use_dora: bool = False  # each target's output scaled per row by magnitude / ||W + scale B A||
    lora_bias: bool = False  # lora_B has a bias (scaled like the LoRA term)
    modules_to_save: tuple[str, ...] = ()  # of TOKEN_MODULES: saved whole
    # TOKEN_MODULES -> the token ids whose rows were retrained (PEFT's trainable_token_indices)
    trainable_tokens: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # activated LoRA (PEFT's alora_invocation_tokens): the token ids from whose last occurrence
    # in a prompt on the adapter applies; () for every other adapter
    invocation_tokens: tuple[int, ...] = ()
    budget: list[float] = field(default_factory=lambda: [ADAPTER_BUDGET_S], compare=False, repr=False)

    @property
    def kind(self) -> str:
        """What the library shows of the factors: "DoRA", "LoRA" or "aLoRA" (activated LoRA),
        either "with bias" (the vocabulary side is ``TokenTables.label``)."""
        if self.use_dora:
            return "DoRA"
        return ("aLoRA" if self.invocation_tokens else "LoRA") + (" with bias" if self.lora_bias else "")

    @cached_property
    def _matchers(self) -> dict[str, PatternMatcher]:
        return {
            "rank_pattern": PatternMatcher("rank_pattern", self.rank_pattern, self.budget),
            "alpha_pattern": PatternMatcher("alpha_pattern", self.alpha_pattern, self.budget),
        }

    def rank_of(self, layer: int, module: str, decoder: str) -> int:
        """The rank of ``decoder.layers.{layer}``'s ``module`` (``decoder``: the path of the
        model's decoder in the tensor names, as PEFT names the module)."""
        return int(self._value("rank_pattern", layer, module, self.rank, decoder))

    def scale_of(self, layer: int, module: str, rank: int, decoder: str) -> float:
        alpha = float(self._value("alpha_pattern", layer, module, self.alpha, decoder))
        return alpha / (math.sqrt(rank) if self.use_rslora else rank)

    def _value(self, name: str, layer: int, module: str, default: float, decoder: str) -> float:
        """PEFT's rank/alpha patterns: a key matches a dotted suffix (a regex) of the module's name."""
        block = "self_attn" if module in ATTENTION_TARGETS else "mlp"
        try:
            return self._matchers[name].value(f"{decoder}.layers.{layer}.{block}.{module}", default)
        except PatternTimeout as error:
            raise AdapterError(str(error)) from None


def read_adapter_config(folder: Path) -> dict:
    """The raw JSON object of ``folder/adapter_config.json``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AdapterError(f"{folder} is not a folder")
    path = folder / CONFIG_FILE
    if not os.path.lexists(path):
        raise AdapterError(f"{folder} has no {CONFIG_FILE}; is it a PEFT adapter folder?")
    data = read_adapter_file(path, MAX_CONFIG_BYTES)
    try:
        config = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise AdapterError(f"{path} is not valid JSON: {error}") from None
    except RecursionError:
        raise AdapterError(f"{path}: JSON nested too deeply") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    return config


def parse_adapter_config(config: dict, where: Path | str, max_rank: int) -> AdapterConfig:
    """Check the schema and the features of a raw config; AdapterError names the first problem."""
    peft_type = _field(config, "peft_type", (str,), where, "a string", "LORA")
    if peft_type.upper() != "LORA":
        raise AdapterError(f"{where}: only LoRA adapters are supported, this one is {peft_type}")
    task = _field(config, "task_type", (str, type(None)), where, "a string or null", None)
    if task not in SERVABLE_TASKS:
        raise AdapterError(
            f"{where}: task_type {task} is not supported; only CAUSAL_LM (text generation) adapters "
            "can be served"
        )
    parameters = config.get("target_parameters")
    if isinstance(parameters, list) and any("experts" in str(p) for p in parameters):
        raise AdapterError(f"{where}: {expert_lora_refusal(', '.join(map(str, parameters)))}")
    unsupported = [label for key, label in UNSUPPORTED_FLAGS.items() if config.get(key)]
    if unsupported:
        raise AdapterError(f"{where}: unsupported adapter contents: {', '.join(unsupported)}")
    rank: Any = config.get("r")
    if not _is_int(rank) or rank < 1:
        raise AdapterError(f"{where}: 'r' must be a positive integer, got {rank!r}")
    alpha: Any = config.get("lora_alpha", rank)
    if not _is_number(alpha) or not math.isfinite(alpha):
        raise AdapterError(f"{where}: 'lora_alpha' must be a finite number, got {alpha!r}")
    rank_pattern = _pattern(config, "rank_pattern", where, _is_rank, "positive integers")
    alpha_pattern = _pattern(config, "alpha_pattern", where, _is_finite, "finite numbers")
    largest = max([rank, *rank_pattern.values()])
    if largest > max_rank:
        raise AdapterOverLimit(
            "{where}: rank {rank} exceeds {max_lora_rank:=}; raise {max_lora_rank} to use this adapter",
            {"max_lora_rank": max_rank},
            {"where": where, "rank": largest},
        )
    use_rslora = _field(config, "use_rslora", (bool, type(None)), where, "true or false", False)
    use_dora = _field(config, "use_dora", (bool, type(None)), where, "true or false", False)
    lora_bias = _field(config, "lora_bias", (bool, type(None)), where, "true or false", False)
    if use_dora and lora_bias:
        raise AdapterError(f"{where}: lora_bias with DoRA (use_dora) is not a PEFT adapter: PEFT refuses it")
    invocation_tokens = _invocation_tokens(config.get("alora_invocation_tokens"), where)
    modules_to_save = _modules_to_save(config.get("modules_to_save"), where)
    trainable_tokens = _trainable_tokens(config.get("trainable_token_indices"), where)
    if invocation_tokens and use_dora:
        raise AdapterError(
            f"{where}: activated LoRA (alora_invocation_tokens) with DoRA (use_dora) is not a PEFT "
            "adapter: PEFT refuses it"
        )
    if invocation_tokens and (modules_to_save or trainable_tokens):
        raise AdapterError(
            f"{where}: activated LoRA (alora_invocation_tokens) with embedding / LM-head rows "
            "(modules_to_save, trainable_token_indices) is not served: they would change the "
            "tokens before the invocation, which an aLoRA request runs as the base model"
        )
    base_model = _field(config, "base_model_name_or_path", (str, type(None)), where, "a string or null", None)
    layers = config.get("layers_to_transform")
    if not (layers is None or _is_int(layers) or (isinstance(layers, list) and all(map(_is_int, layers)))):
        raise AdapterError(f"{where}: 'layers_to_transform' must be an integer or a list of integers")
    return AdapterConfig(
        modules_to_save=modules_to_save,
        trainable_tokens=trainable_tokens,
        invocation_tokens=invocation_tokens,
        rank=rank,
        alpha=float(alpha),
        targets=_targets(config.get("target_modules"), where),
        rank_pattern=rank_pattern,
        alpha_pattern={k: float(v) for k, v in alpha_pattern.items()},
        use_rslora=bool(use_rslora),
        base_model=base_model,
        use_dora=bool(use_dora),
        lora_bias=bool(lora_bias),
    )


def _targets(targets: object, where: Path | str) -> tuple[str, ...] | None:
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as error:
            raise AdapterError(f"{where}: target_modules {targets!r} is not a valid regex: {error}") from None
        return None
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterError(f"{where}: target_modules must be a non-empty list of module names")
    names = {t.rsplit(".", 1)[-1] for t in targets}
    vocab = sorted(names & set(VOCAB_TARGETS))
    unknown = sorted(names - set(SUPPORTED_TARGETS))
    experts = [t for t in targets if t.rsplit(".", 1)[-1] in EXPERT_TARGETS]
    if experts:
        raise AdapterError(f"{where}: {expert_lora_refusal(', '.join(experts))}")
    if unknown:
        kinds = f" ({', '.join(VOCAB_TARGETS[v] for v in vocab)})" if vocab else ""
        raise AdapterError(
            f"{where}: LoRA on {', '.join(unknown)} is not supported{kinds} "
            f"(supported: {', '.join(SUPPORTED_TARGETS)})"
        )
    return tuple(sorted(names, key=SUPPORTED_TARGETS.index))


def expert_lora_refusal(modules: str) -> str:
    """Why LoRA on ``modules`` (a mixture-of-experts layer's experts or router) is refused."""
    return (
        f"LoRA on {modules} (a mixture-of-experts layer's experts or router): expert LoRA is not "
        f"served yet; LoRA on the attention projections ({', '.join(ATTENTION_TARGETS)}) is"
    )


def _invocation_tokens(value: object, where: Path | str) -> tuple[int, ...]:
    """PEFT's ``alora_invocation_tokens``: null (not an aLoRA) or a non-empty list of token ids."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value or not all(_is_int(i) and i >= 0 for i in value):
        raise AdapterError(
            f"{where}: 'alora_invocation_tokens' must be a non-empty list of token ids (>= 0) or "
            f"null, got {str(value)[:80]}"
        )
    return tuple(value)


def _token_module(name: object, key: str, where: Path | str) -> str:
    """The TOKEN_MODULES entry a module name of ``key`` ends with; AdapterError naming others."""
    last = name.rsplit(".", 1)[-1] if isinstance(name, str) else None
    if last not in TOKEN_MODULES:
        raise AdapterError(
            f"{where}: {key} names {name!r}; only {' and '.join(TOKEN_MODULES)} are served "
            "(other fully trained modules are not)"
        )
    return last


def _modules_to_save(value: object, where: Path | str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise AdapterError(f"{where}: 'modules_to_save' must be a list of module names or null")
    names = {_token_module(name, "modules_to_save", where) for name in value}
    return tuple(sorted(names, key=TOKEN_MODULES.index))


def _trainable_tokens(value: object, where: Path | str) -> dict[str, tuple[int, ...]]:
    """PEFT's ``trainable_token_indices``: a list of ids (for embed_tokens) or module -> ids."""
    if value is None or value == []:
        return {}
    by_module = {"embed_tokens": value} if isinstance(value, list) else value
    if not isinstance(by_module, dict):
        raise AdapterError(f"{where}: 'trainable_token_indices' must be a list of token ids or a dict")
    tokens: dict[str, tuple[int, ...]] = {}
    for name, ids in by_module.items():
        module = _token_module(name, "trainable_token_indices", where)
        if not isinstance(ids, list) or not ids or not all(_is_int(i) and i >= 0 for i in ids):
            raise AdapterError(f"{where}: trainable_token_indices of {name!r} must be token ids (>= 0)")
        if len(set(ids)) != len(ids):
            raise AdapterError(f"{where}: trainable_token_indices of {name!r} repeats a token id")
        tokens[module] = tuple(ids)
    return tokens


def _field(
    config: dict, key: str, kinds: tuple[type, ...], where: Path | str, expected: str, default: Any
) -> Any:
    value = config.get(key, default)
    if not isinstance(value, kinds):
        raise AdapterError(f"{where}: '{key}' must be {expected}, got {value!r}")
    return default if value is None else value


def _pattern(
    config: dict, key: str, where: Path | str, valid: Callable[[object], bool], expected: str
) -> dict:
    pattern = config.get(key) or {}
    if not isinstance(pattern, dict) or not all(isinstance(k, str) and valid(v) for k, v in pattern.items()):
        raise AdapterError(f"{where}: '{key}' must map module names to {expected}")
    for name in pattern:
        if len(name) > MAX_KEY_CHARS:
            raise AdapterError(
                f"{where}: {key} key {name[:40]!r}... is longer than {MAX_KEY_CHARS} characters"
            )
    return pattern


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_rank(value: object) -> bool:
    return _is_int(value) and value >= 1  # type: ignore[operator]


def _is_finite(value: object) -> bool:
    return _is_number(value) and math.isfinite(value)  # type: ignore[arg-type]
