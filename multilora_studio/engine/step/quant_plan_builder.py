"""The engine's base quantization and how its quantized GEMMs run: decided once at start-up.

``base_quantization`` reads what the checkpoint declares (config.json's
``quantization_config``) and what ``EngineConfig.quantization`` asks; ``build_quant_plan`` picks
the GEMM path from the device (``kernels/quant_linear.py``, ``QuantPlan``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.model_source import RANDOM_PREFIX
from multilora_studio.engine.model.quantization import (
    Quantization,
    checkpoint_quantization,
    served_quantization,
)
from multilora_studio.kernels.gemlite_support import GEMLITE_MISSING, gemlite_available
from multilora_studio.kernels.quant_linear import QuantPlan
from multilora_studio.util import extra_install_hint

log = logging.getLogger(__name__)


def folder_quantization(folder: Path) -> Quantization | None:
    """The quantization a model folder's config.json declares (None: float or no config.json)."""
    path = Path(folder).expanduser() / "config.json"
    if not path.is_file():
        return None
    return checkpoint_quantization(json.loads(path.read_text()))


def base_quantization(config: EngineConfig) -> Quantization | None:
    """What the engine's base is served as: the checkpoint's quantization, or the one
    ``config.quantization`` applies at load (ValueError naming a mismatch or an unsupported one).
    The embedded default model is a float checkpoint."""
    model = config.model
    random_model = model is not None and model.startswith(RANDOM_PREFIX)
    checkpoint = None if model is None or random_model else folder_quantization(Path(model))
    return served_quantization(config.quantization, checkpoint, random_model)


def build_quant_plan(device: torch.device, dtype: torch.dtype, batch_invariant: bool = False) -> QuantPlan:
    """How quantized weights are multiplied on ``device`` in ``dtype``.

    CPU: dequantized once at load (the dense oneDNN GEMMs are the fastest path there; a
    per-call dequantize measured 8-30x slower a GEMM, docs/dev/engine.md). CUDA: the weights stay
    quantized; gemlite's kernels for decode-sized GEMMs and cuBLAS for prefill (FP8 tensor cores,
    or a 4-bit weight dequantized first), as measured side by side (docs/BENCHMARKS.md). Without
    gemlite installed, or in batch-invariant mode (gemlite's split-K partials are added by
    atomics, in an order that varies), every size goes to cuBLAS.
    """
    if device.type != "cuda":
        return QuantPlan(dequantize_at_load=True)
    if batch_invariant:
        return QuantPlan(dequantize_at_load=False, fp8="cublas", int4="cublas")
    if not gemlite_available():
        log.warning(
            "%s: %s; until then quantized bases decode through cuBLAS, slower",
            GEMLITE_MISSING, extra_install_hint("cuda"),
        )  # fmt: skip
        return QuantPlan(dequantize_at_load=False, fp8="cublas", int4="cublas")
    return QuantPlan(dequantize_at_load=False, fp8="gemlite", int4="gemlite")
