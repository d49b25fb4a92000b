"""The batched multi-LoRA engine (no Qt, no HTTP)."""

from multilora_studio.engine.config import EngineConfig
from multilora_studio.engine.engine import Engine
from multilora_studio.engine.errors import EngineStopped, GrammarFailure, InvalidRequest, UnknownAdapter
from multilora_studio.engine.loop.requests import RequestStream
from multilora_studio.engine.outputs import EngineMetrics, RequestOutput, TokenDelta, TokenLogprob
from multilora_studio.engine.residency.adapter_catalog import AdapterInfo
from multilora_studio.engine.residency.host_tier_size import least_host_capacity
from multilora_studio.engine.sampling.structured import StructuredOutput
from multilora_studio.engine.sampling_params import MAX_ADAPTER_SCALE, MAX_LOGPROBS, MAX_SEED, SamplingParams
from multilora_studio.engine.serving_engine import ParkableEngine, ServingEngine
from multilora_studio.engine.step.device_setup import resolve_device, resolve_dtype
from multilora_studio.engine.text.prompts import Prompt

__all__ = [
    "MAX_ADAPTER_SCALE",
    "MAX_LOGPROBS",
    "MAX_SEED",
    "AdapterInfo",
    "Engine",
    "EngineConfig",
    "EngineMetrics",
    "EngineStopped",
    "GrammarFailure",
    "InvalidRequest",
    "ParkableEngine",
    "Prompt",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "ServingEngine",
    "StructuredOutput",
    "TokenDelta",
    "TokenLogprob",
    "UnknownAdapter",
    "least_host_capacity",
    "resolve_device",
    "resolve_dtype",
]
