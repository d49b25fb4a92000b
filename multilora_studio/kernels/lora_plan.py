"""How the LoRA term of every projection runs: one value, decided once, read everywhere.

A :class:`LoRAPlan` says which kernels run at which token counts, whether the shrink runs
inside the base GEMM, which expands are folded into the kernels that read their output,
and how the token-major kernels launch. The engine builds one from its ``EngineConfig``
and device at start-up (``multilora_studio.engine.step.lora_plan_builder``) and passes it to the
model, which passes it to every wrapper in :mod:`multilora_studio.kernels.lora`; a wrapper
called without one uses :meth:`LoRAPlan.for_device`. Tests and benchmarks choose a path by
building a plan (``LoRAPlan(backend="triton", bgmv_max_tokens=0)``: the slot-grouped
kernels at every token count).

The shrink inside the base GEMM ("shrink in GEMM"): every slot's A factors are stored as
extra rows after each base weight's rows, so one GEMM gives the base output and every
token's shrink against every slot; the expand then reads each token's own slot's values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import lora_cpu
from .triton_support import pdl_supported

__all__ = ["BACKENDS", "FOLDED_EXPAND_MAX_RANK", "LoRAPlan"]

# "triton": the Triton kernels (CUDA, or the CPU under TRITON_INTERPRET=1); "torch": torch
# ops; "numba": the compiled float32 CPU kernel for add_lora up to numba_max_tokens tokens,
# torch ops otherwise (and for shrink / expand alone).
BACKENDS = ("triton", "torch", "numba")
# Ranks up to which the kernels that fold an expand in (SiLU-and-mul, residual-add + RMSNorm,
# the q/k/v epilogue) cover the whole rank in one tile; larger ranks take the separate expand.
FOLDED_EXPAND_MAX_RANK = 64


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def _check_power_of_two(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= {low}, got {value!r}")


@dataclass(frozen=True)
class LoRAPlan:
    """Which LoRA kernels run, at which token counts, and how they launch (validated)."""

    backend: str = "torch"
    # Triton: the token-major (BGMV) kernels up to this many tokens, the slot-grouped (SGMV)
    # ones above. On the H200 the token-major kernels were 1.8-2.5x faster with 8-256
    # distinct adapters and as fast or faster with all tokens on one adapter, up to 256
    # tokens (docs/dev/kernels.md). Also the most tokens a step may have for the shrink in GEMM
    # and the folded expands, which use the token-major expand.
    bgmv_max_tokens: int = 256
    # numba: up to this many tokens the compiled kernel beats the torch ops on the default
    # model's shapes (docs/BENCHMARKS.md, the CPU LoRA kernel timings); beyond it the grouped
    # GEMMs use every core.
    numba_max_tokens: int = 64
    # torch: steps of at most this many tokens whose adapters (at least stacked_min_adapters,
    # in consecutive slots) multiply every token by every adapter in a few large ops; on the
    # CPU that won from 3 adapters up to 32 tokens (135M default model, docs/dev/kernels.md).
    stacked_max_tokens: int = 32
    stacked_min_adapters: int = 3
    # The model computes each projection's shrink inside its base GEMM (module docstring) in
    # steps of up to bgmv_max_tokens tokens; the weights must hold the slots' A rows.
    shrink_in_gemm: bool = False
    # With shrink_in_gemm, larger steps (prefill) also compute their shrink in the GEMM when
    # the A rows it appends per slice (the step's slot span times the largest rank) are at
    # most this many, and their expands read its output (slot-grouped): a prompt on an adapter
    # in one of the first slots pays a few GEMM columns instead of a shrink launch reading x
    # (TTFT of 2,048 tokens on one adapter over base 1.180 -> 1.144, prefill of 16 x 1,024
    # over four adapters 0.854 -> 0.868 of base, H100). 0: never.
    grouped_shrink_in_gemm_rows: int = 64
    # The q/k/v expand (with the shrink in GEMM), RoPE and the K/V cache write as one launch.
    fused_qkv: bool = False
    # Token-major kernels launch with programmatic dependent launch (only where
    # triton_support.pdl_supported says the device can).
    pdl: bool = False
    # Token-major tile sizes in elements (rank rows x K columns for the shrink, output columns
    # x rank rows for the expand and the folded expands) and warps. Chosen by the tile sweeps
    # of benchmarks/kernels/lora_bench.py and step_lora_bench.py on the H200 (decode, batch 32,
    # 32 distinct rank-16 adapters): 8192-element expand tiles tie with 16384 after the kernel
    # shrink and beat them after the shrink in GEMM (0.998 vs 1.082 ms a 32-layer step).
    bgmv_shrink_tile: int = 16384
    bgmv_shrink_warps: int = 4
    bgmv_expand_tile: int = 8192
    bgmv_expand_warps: int = 4
    # Batch-invariant mode (EngineConfig.batch_invariant): a row's arithmetic never depends on
    # the batch. The model computes every dense GEMM (and the torch LoRA ops) in tiles of
    # exactly gemm_row_tile rows (kernels/row_tiles.py) and attention in one fixed order for
    # every query (kernels/paged_attention.py); the builder also pins the token-count switches
    # above to one path. 0 = GEMMs take any row count.
    batch_invariant: bool = False
    gemm_row_tile: int = 0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "numba" and not lora_cpu.AVAILABLE:
            raise ValueError("backend='numba' but Numba cannot be imported")
        for name in (
            "bgmv_max_tokens",
            "numba_max_tokens",
            "stacked_max_tokens",
            "stacked_min_adapters",
            "grouped_shrink_in_gemm_rows",
        ):
            _check_count(name, getattr(self, name))
        _check_count("gemm_row_tile", self.gemm_row_tile)
        if self.batch_invariant and not self.gemm_row_tile:
            raise ValueError("a batch-invariant plan needs gemm_row_tile >= 1")
        for name in ("shrink_in_gemm", "fused_qkv", "pdl", "batch_invariant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("bgmv_shrink_tile", "bgmv_expand_tile"):
            _check_power_of_two(name, getattr(self, name), 256)
        for name in ("bgmv_shrink_warps", "bgmv_expand_warps"):
            _check_power_of_two(name, getattr(self, name), 1)

    @classmethod
    def for_device(cls, device: torch.device | str, dtype: torch.dtype = torch.float32) -> LoRAPlan:
        """The kernels' own choice for tensors of ``dtype`` on ``device``: on CUDA the Triton
        kernels, the fused q/k/v epilogue and PDL where supported; on the CPU the Numba kernel
        for float32 (where Numba imports) and torch ops otherwise. No shrink in GEMM."""
        device = torch.device(device)
        if device.type == "cuda":
            return cls(backend="triton", fused_qkv=True, pdl=pdl_supported(device))
        return cls(backend="numba" if lora_cpu.AVAILABLE and dtype == torch.float32 else "torch")

    def uses_bgmv(self, num_tokens: int) -> bool:
        """Whether a step of ``num_tokens`` tokens runs the token-major Triton kernels."""
        return self.backend == "triton" and num_tokens <= self.bgmv_max_tokens

    def uses_numba(self, num_tokens: int) -> bool:
        """Whether ``add_lora`` over ``num_tokens`` tokens runs the compiled CPU kernel."""
        return self.backend == "numba" and num_tokens <= self.numba_max_tokens

    def stacks(self, num_tokens: int, num_adapters: int) -> bool:
        """Whether the torch ops multiply every token by every adapter (given consecutive slots)."""
        return num_tokens <= self.stacked_max_tokens and num_adapters >= self.stacked_min_adapters

    def shrinks_in_gemm(self, num_tokens: int, span_rows: int | None = None) -> bool:
        """Whether a step of ``num_tokens`` tokens computes the shrink inside the base GEMMs;
        ``span_rows``: the A rows per slice its GEMMs would append (slot span x largest rank),
        None where the step does not say (then only up to ``bgmv_max_tokens`` tokens)."""
        if not self.shrink_in_gemm:
            return False
        if num_tokens <= self.bgmv_max_tokens:
            return True
        return span_rows is not None and 0 < span_rows <= self.grouped_shrink_in_gemm_rows

    def folds_expand(self, num_tokens: int, max_rank: int) -> bool:
        """Whether an expand is folded into the kernel that reads its output this call."""
        return self.uses_bgmv(num_tokens) and max_rank <= FOLDED_EXPAND_MAX_RANK
