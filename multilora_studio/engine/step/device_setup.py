"""The engine's device, dtype and KV cache size, and the base model loaded onto the device.

``load_on_device`` runs on the worker thread, which owns the device from then on.
"""

from __future__ import annotations

import logging
import time

import torch

from multilora_studio.engine.batch.block_manager import BlockManager, blocks_needed
from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.model.lora_weights import row_buffer_bytes
from multilora_studio.engine.model.model_source import BaseModel, resolve_model
from multilora_studio.engine.model.model_spec import ModelSpec
from multilora_studio.engine.residency.host_threads import quiet_host_threads, size_step_threads
from multilora_studio.engine.step.lora_plan_builder import build_lora_plan, shrink_in_gemm_rows
from multilora_studio.engine.step.quant_plan_builder import base_quantization, build_quant_plan
from multilora_studio.engine.step.runner import ModelRunner
from multilora_studio.kernels.jit_watch import install as install_compile_watch
from multilora_studio.util import ProgressCallback

log = logging.getLogger(__name__)

CPU_KV_CACHE_CAP_BYTES = 512 << 20


def resolve_device(name: str) -> torch.device:
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was requested but no CUDA GPU is available")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def token_table_bytes(config: EngineConfig) -> int:
    """The device memory of the adapters' token tables (``EngineConfig.token_table_memory_gb``)."""
    return int(config.token_table_memory_gb * (1 << 30)) if config.max_token_tables else 0


def kv_bytes_per_block(spec: ModelSpec, block_size: int, dtype: torch.dtype) -> int:
    """Device bytes of one KV block: keys and values of ``block_size`` tokens in every layer."""
    return 2 * spec.num_layers * block_size * spec.kv_size * torch.empty((), dtype=dtype).element_size()


def kv_cache_blocks(
    config: EngineConfig, spec: ModelSpec, device: torch.device, dtype: torch.dtype, own_bytes: int = 0
) -> int:
    """KV blocks for ``max_num_seqs`` sequences of ``max_model_len``, within the memory budget.

    ``own_bytes``: device memory this engine holds already (its weights), counted against its
    ``device_memory_share`` of the GPU."""
    per_block = kv_bytes_per_block(spec, config.block_size, dtype)
    per_seq = blocks_needed(config.max_model_len, config.block_size)
    wanted = config.max_num_seqs * per_seq
    if config.kv_cache_memory_gb is not None:
        budget = int(config.kv_cache_memory_gb * (1 << 30))
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # besides the KV cache: the token tables, and the per-row buffers of DoRA and lora_bias
        # adapters (made by the warm-up for its pass, kept from the first such adapter on)
        others = token_table_bytes(config) + row_buffer_bytes(spec, config.max_loras, dtype)
        budget = int(free * 0.85) - (2 << 30) - others
        if config.device_memory_share < 1:
            share = int(total * config.device_memory_share * 0.85) - own_bytes - (2 << 30)
            budget = min(budget, share - others)
    else:
        budget = CPU_KV_CACHE_CAP_BYTES
    blocks = min(wanted, budget // per_block)
    if blocks < per_seq:
        raise ValueError(
            f"the KV cache ({budget / 2**30:.2f} GiB) cannot hold one sequence of max_model_len="
            f"{config.max_model_len} tokens ({per_seq * per_block / 2**30:.2f} GiB); lower "
            "max_model_len or raise kv_cache_memory_gb"
        )
    return blocks


def load_on_device(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, progress: ProgressCallback | None
) -> tuple[BaseModel, ModelRunner, BlockManager]:
    """The base model, its runner (weights, KV cache, LoRA slots, graphs) and the KV blocks' manager."""
    started = time.perf_counter()
    quiet_host_threads()
    size_step_threads(config.cpu_threads_for(device.type))
    held_before = 0
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # The worker thread's own stream: engines sharing a GPU (replicas) neither serialize on the
        # legacy default stream nor wait for each other's work when one synchronizes.
        torch.cuda.set_stream(torch.cuda.Stream(device))
        install_compile_watch()
        held_before = torch.cuda.memory_allocated(device)  # other engines' of this process
    quantization = base_quantization(config)  # the checkpoint's, or one applied at load
    quant_plan = build_quant_plan(device, dtype, config.batch_invariant)  # how quantized GEMMs run
    plan = build_lora_plan(config, device, dtype, quantization is not None)  # how the LoRA term runs
    lora_rows = shrink_in_gemm_rows(config, plan)  # A rows reserved after every GEMM weight
    base = resolve_model(config.model, dtype, device, progress, lora_rows, quantization, quant_plan)
    loaded = time.perf_counter() - started  # the device's context too, created on first use
    if config.max_model_len > base.spec.max_position_embeddings:
        log.warning(
            "max_model_len %d exceeds the model's max_position_embeddings %d",
            config.max_model_len,
            base.spec.max_position_embeddings,
        )
    own = torch.cuda.memory_allocated(device) - held_before if device.type == "cuda" else 0
    num_blocks = kv_cache_blocks(config, base.spec, device, dtype, own)
    runner = ModelRunner(config, base.spec, base.weights, num_blocks, device, dtype, plan, quant_plan)
    runner.startup_seconds = {"device and model load": loaded, **runner.startup_seconds}
    return base, runner, BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
