"""Which quantization a base checkpoint has (config.json's ``quantization_config``), which ones the
engine serves, and what ``EngineConfig.quantization`` makes of it.

Served (``docs/dev/engine.md``, "Quantized bases"):

* FP8 e4m3 weights with per-channel or per-tensor scales: ``quant_method`` ``fp8`` (vLLM's /
  AutoFP8's checkpoints) or ``compressed-tensors`` with ``float-quantized`` (or
  ``naive-quantized``) 8-bit float weights, strategy ``channel`` or ``tensor``, symmetric;
* 4-bit weight-only AWQ (AutoAWQ's GEMM layout, ``version: gemm``, zero points), group size 128;
* 4-bit weight-only GPTQ (``checkpoint_format`` gptq or gptq_v2), group size 128, with or
  without act-order (``desc_act``).

Everything else is refused with a ValueError that names it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.engine.model.model_spec import PROJECTIONS, ModelSpec, spec_from_config
from multilora_studio.kernels.quant_weight import GROUP_SIZE

QUANTIZATIONS = ("fp8", "int4", "awq", "gptq")  # EngineConfig.quantization (vLLM's names, and int4)
AT_LOAD = ("fp8", "int4")  # what a float checkpoint can be quantized to when it loads
SUPPORTED_METHODS = ("fp8", "compressed-tensors", "awq", "gptq")
FP8_CT_FORMATS = ("float-quantized", "naive-quantized")
FP8_STRATEGIES = ("channel", "tensor")
GPTQ_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> zero offset (v1 stores zero - 1)
LABELS = {"fp8": "FP8 (e4m3)", "int4": "4-bit (groups of 128)", "awq": "AWQ 4-bit", "gptq": "GPTQ 4-bit"}
BITS = {"fp8": 8, "int4": 4, "awq": 4, "gptq": 4}


@dataclass(frozen=True)
class Quantization:
    """A base's quantization: the method served, where it comes from and its layout details.

    ``at_load``: a float checkpoint quantized when it is loaded (``EngineConfig.quantization``),
    not a quantized checkpoint. ``source``: the checkpoint's ``quant_method``.
    """

    method: str  # "fp8", "int4" (at load only), "awq" or "gptq"
    source: str = ""
    at_load: bool = False
    act_order: bool = False  # gptq desc_act
    zero_offset: int = 0  # gptq: 1 for the gptq format, 0 for gptq_v2

    @property
    def label(self) -> str:
        """How the window and the logs name it: "FP8 (e4m3)", "AWQ 4-bit, quantized at load"."""
        return LABELS[self.method] + (", quantized at load" if self.at_load else "")

    @property
    def bits(self) -> int:
        return BITS[self.method]


def _refuse(what: str) -> ValueError:
    return ValueError(
        f"{what} is not supported (served: FP8 with per-channel or per-tensor scales, AWQ (GEMM) "
        "and GPTQ 4-bit with group size 128)"
    )


def _int4_common(method: str, config: dict) -> None:
    bits = config.get("bits", config.get("w_bit"))
    if bits != 4:
        raise _refuse(f"{method.upper()} with {bits} bits")
    group = config.get("group_size", config.get("q_group_size"))
    if group != GROUP_SIZE:
        raise _refuse(f"{method.upper()} with group size {group}")


def _awq(config: dict) -> Quantization:
    _int4_common("awq", config)
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse(f"AWQ version {version!r} (its packed layout)")
    if not config.get("zero_point", True):
        raise _refuse("AWQ without zero points (zero_point: false)")
    return Quantization("awq", "awq")


def _gptq(config: dict) -> Quantization:
    _int4_common("gptq", config)
    if config.get("is_marlin_format"):
        raise _refuse("GPTQ in Marlin's repacked layout (is_marlin_format)")
    fmt = config.get("checkpoint_format") or "gptq"
    if fmt not in GPTQ_FORMATS:
        raise _refuse(f"GPTQ checkpoint_format {fmt!r}")
    desc_act = bool(config.get("desc_act", False))
    return Quantization("gptq", "gptq", act_order=desc_act, zero_offset=GPTQ_FORMATS[fmt])


def _fp8(config: dict) -> Quantization:
    if config.get("weight_block_size"):
        raise _refuse(f"block-wise FP8 (weight_block_size {config['weight_block_size']})")
    fmt = config.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _refuse(f"FP8 format {fmt!r}")
    return Quantization("fp8", "fp8")


def _compressed_tensors(config: dict) -> Quantization:
    for field in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if config.get(field):
            raise _refuse(f"compressed-tensors with {field}")
    groups = config.get("config_groups") or {}
    if not groups:
        raise ValueError("a compressed-tensors quantization_config without config_groups")
    for name, group in groups.items():
        fmt = group.get("format") or config.get("format")
        weights = group.get("weights") or {}
        described = (
            f"compressed-tensors group {name!r} ({fmt}, {weights.get('num_bits')}-bit "
            f"{weights.get('type')} weights, strategy {weights.get('strategy')})"
        )
        if fmt not in FP8_CT_FORMATS or weights.get("type") != "float" or weights.get("num_bits") != 8:
            raise _refuse(described)
        if weights.get("strategy") not in FP8_STRATEGIES or not weights.get("symmetric", True):
            raise _refuse(described)
        if weights.get("dynamic"):
            raise _refuse(f"{described} with dynamic weight scales")
        if group.get("output_activations"):
            raise _refuse(f"compressed-tensors group {name!r} with quantized output activations")
    return Quantization("fp8", "compressed-tensors")


PARSERS = {"fp8": _fp8, "compressed-tensors": _compressed_tensors, "awq": _awq, "gptq": _gptq}


def checkpoint_quantization(config: dict) -> Quantization | None:
    """The quantization config.json declares (None: float weights); ValueError for a method or
    variant the engine does not serve, naming it."""
    quant = config.get("quantization_config")
    if quant is None and isinstance(config.get("text_config"), dict):
        quant = config["text_config"].get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, dict):
        raise ValueError("config.json's quantization_config must be an object")
    method = str(quant.get("quant_method", "")).lower()
    if method not in PARSERS:
        raise ValueError(
            f"quantization method {method!r} is not supported; supported: {', '.join(SUPPORTED_METHODS)}"
        )
    return PARSERS[method](quant)


def served_quantization(
    requested: str | None, checkpoint: Quantization | None, random_model: bool
) -> Quantization | None:
    """What the engine serves for ``EngineConfig.quantization`` = ``requested`` over a checkpoint
    of ``checkpoint``'s quantization (``random_model``: random weights of a named shape).

    None: the checkpoint as it is. "fp8": an FP8 checkpoint as it is, a float one quantized at
    load (per channel). "int4": a float checkpoint quantized to 4 bits at load (asymmetric,
    groups of 128, round to nearest). "awq" / "gptq": a checkpoint of that method (random shapes
    are quantized at load, for benchmarks). Anything else is a ValueError naming both.
    """
    if requested is None or (checkpoint is not None and checkpoint.method == requested):
        return checkpoint
    if checkpoint is not None:
        raise ValueError(
            f"quantization {requested!r} was asked for, but the checkpoint is {checkpoint.label} "
            f"(quant_method {checkpoint.source!r}); leave quantization unset to serve it as it is"
        )
    if requested in AT_LOAD or random_model:
        return Quantization(requested, "", at_load=True, zero_offset=1 if requested == "gptq" else 0)
    raise ValueError(
        f"quantization {requested!r} needs a checkpoint quantized so ({LABELS[requested]}, in config.json's "
        "quantization_config); 'fp8' and 'int4' quantize a float base when it is loaded"
    )


def projection_bytes(spec: ModelSpec, quantization: Quantization | None) -> tuple[int, int]:
    """(bytes of every layer's projections in bf16, bytes as ``quantization`` stores them): FP8
    one byte a weight and a float32 scale per output channel; 4-bit half a byte a weight and,
    per group of 128 inputs and output column, a 16-bit scale and a 4-bit zero. Embeddings,
    norms and the LM head stay float either way."""
    shapes = [spec.projection_shape(module) for module in PROJECTIONS]
    weights = spec.num_layers * sum(n * k for n, k in shapes)
    dense = 2 * weights
    if quantization is None:
        return dense, dense
    if quantization.method == "fp8":
        return dense, weights + 4 * spec.num_layers * sum(n for n, _ in shapes)
    return dense, weights // 2 + weights * 5 // (2 * GROUP_SIZE)  # and 2.5 bytes per 128 weights


def quantization_summary(folder: Path | None, requested: str | None) -> tuple[str, tuple[int, int] | None]:
    """What the window's model picker says of the base at ``folder`` (None: the embedded float
    model) served with ``EngineConfig.quantization`` = ``requested``: (how it is served, or why it
    would be refused, or "" when the folder cannot be read; ``projection_bytes`` of it, or None)."""
    try:
        if folder is None:
            checkpoint, spec = None, None
        else:
            config = json.loads((Path(folder).expanduser() / "config.json").read_text())
            checkpoint, spec = checkpoint_quantization(config), spec_from_config(config)
        served = served_quantization(requested, checkpoint, random_model=False)
    except ValueError as refused:
        return f"Not served: {refused}", None
    except (OSError, json.JSONDecodeError):
        return "", None
    label = "Float weights (no quantization)" if served is None else served.label
    return label, None if spec is None else projection_bytes(spec, served)
