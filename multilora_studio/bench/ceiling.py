"""The weight-bandwidth ceiling of decoding: every step reads all weights once.

A decode step of ``batch`` sequences reads every projection, the norms, the LM head
(the embedding table only where it is tied to the head: otherwise a step reads just
``batch`` rows of it) and the A and B of each distinct adapter in the batch. At memory
bandwidth ``bw`` the step cannot be faster than bytes / bw, so the batch cannot produce
more than ``batch * bw / bytes`` tokens per second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from multilora_studio.engine.model.model_spec import ModelSpec


@dataclass(frozen=True)
class Ceiling:
    base_bytes: int
    adapter_bytes: int  # one adapter's A and B
    bandwidth_bytes_s: float | None
    bandwidth_source: str  # "given", "measured" or "unknown"

    def tokens_per_second(self, batch: int, distinct_adapters: int = 0) -> float | None:
        if not self.bandwidth_bytes_s:
            return None
        step = self.base_bytes + distinct_adapters * self.adapter_bytes
        return batch * self.bandwidth_bytes_s / step


def step_weight_bytes(spec: ModelSpec, dtype: torch.dtype) -> int:
    """Bytes of base weights one decode step reads."""
    embed = spec.vocab_size * spec.hidden_size
    untied_embedding = 0 if spec.tie_word_embeddings else embed
    return (spec.num_parameters() - untied_embedding) * _itemsize(dtype)


def adapter_bytes(spec: ModelSpec, rank: int, targets: tuple[str, ...], dtype: torch.dtype) -> int:
    """Bytes of one adapter's A and B over all layers."""
    per_layer = sum(rank * sum(spec.projection_shape(m)) for m in targets)
    return spec.num_layers * per_layer * _itemsize(dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def copy_bandwidth(device: torch.device, size_bytes: int = 1 << 30, iters: int = 10) -> float:
    """Bytes/s of a device-to-device (or host) copy of ``size_bytes``, read + write counted."""
    numel = size_bytes // 2
    src = torch.empty(numel, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize(device)
        seconds = start.elapsed_time(end) / 1e3
    else:
        began = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        seconds = time.perf_counter() - began
    src_itemsize = src.element_size()
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * numel * src_itemsize * iters / seconds
