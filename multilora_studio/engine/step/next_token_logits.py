"""Next-token logits of a base model, or of one adapter on it, for a set of prompts, without an
engine around it: what comparing a quantized base with its float twin needs
(``benchmarks/quant_gpu.py``, ``evaluate/quant_drift.py``)."""

from __future__ import annotations

from pathlib import Path

import torch

from multilora_studio.adapters.peft_adapter import load_peft_adapter
from multilora_studio.engine.batch.block_manager import BlockManager
from multilora_studio.engine.batch.scheduler import ScheduledChunk, StepPlan
from multilora_studio.engine.batch.sequence import Sequence
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.model_source import resolve_model
from multilora_studio.engine.residency.adapter_packing import pack_adapter
from multilora_studio.engine.sampling_params import SamplingParams
from multilora_studio.engine.step.device_setup import resolve_device, resolve_dtype
from multilora_studio.engine.step.lora_plan_builder import build_lora_plan
from multilora_studio.engine.step.quant_plan_builder import base_quantization, build_quant_plan
from multilora_studio.engine.step.runner import ModelRunner

__all__ = ["next_token_logits"]

PROMPTS_PER_STEP = 16


@torch.inference_mode()
def next_token_logits(
    config: EngineConfig, prompts: list[list[int]], adapter: Path | None = None
) -> torch.Tensor:
    """Logits [P, V] float32 (on the CPU) at the last position of each prompt, the base model of
    ``config`` loaded as an engine would load it (its quantization and GEMM paths), with the
    PEFT adapter at ``adapter`` on every row (None: the base alone)."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    quantization = base_quantization(config)
    quant_plan = build_quant_plan(device, dtype, config.batch_invariant)
    base = resolve_model(config.model, dtype, device, None, 0, quantization, quant_plan)
    lora_plan = build_lora_plan(config, device, dtype, quantized=quantization is not None)
    longest = max(len(p) for p in prompts)
    block_size = config.block_size
    num_blocks = PROMPTS_PER_STEP * -(-longest // block_size) + 1
    runner = ModelRunner(config, base.spec, base.weights, num_blocks, device, dtype, lora_plan, quant_plan)
    name: str | None = None
    slots: dict[str | None, int] = {None: -1}
    if adapter is not None:
        spec = base.spec
        host = load_peft_adapter(
            "measured",
            adapter,
            spec.num_layers,
            spec.projection_shape,
            config.max_lora_rank,
            spec.vocab,
            dtype,
        )
        runner.lora.upload(0, pack_adapter(host, spec, dtype, pin=False))
        name, slots = "measured", {None: -1, "measured": 0}
    rows = []
    for start in range(0, len(prompts), PROMPTS_PER_STEP):
        blocks = BlockManager(num_blocks, block_size)
        seqs = []
        for i, prompt in enumerate(prompts[start : start + PROMPTS_PER_STEP]):
            seq = Sequence(f"p{start + i}", list(prompt), name, SamplingParams(), 0)
            blocks.grow(seq, seq.num_tokens)
            seqs.append(seq)
        plan = StepPlan([ScheduledChunk(s, 0, s.num_tokens) for s in seqs])
        logits, _ = runner.run(runner.prepare(plan, blocks, slots))
        rows.append(logits.float().cpu())
    return torch.cat(rows)
