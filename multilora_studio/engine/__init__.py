"""The batched multi-LoRA engine (no Qt, no HTTP)."""

from multilora_studio.engine.config import EngineConfig, SamplingParams
from multilora_studio.engine.engine import AdapterInfo, Engine
from multilora_studio.engine.outputs import EngineMetrics, RequestOutput, TokenDelta

__all__ = [
    "AdapterInfo",
    "Engine",
    "EngineConfig",
    "EngineMetrics",
    "RequestOutput",
    "SamplingParams",
    "TokenDelta",
]
