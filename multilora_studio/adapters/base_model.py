"""The base model adapters are checked against: its identity (name, weights digest) and shapes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multilora_studio.adapters.adapter_config import SUPPORTED_TARGETS


@dataclass(frozen=True)
class BaseModelRef:
    """What validation and the library need to know about a base model, without its weights.

    ``digest`` identifies the weights (``checkpoint_files.checkpoint_digest``: the SHA-256
    of ``model.safetensors``, or of every shard's name and SHA-256; "" when unknown);
    ``shapes[module] = (out_features, in_features)`` for every LoRA-targetable projection.
    """

    name: str
    digest: str
    num_layers: int
    vocab_size: int
    shapes: Mapping[str, tuple[int, int]]

    def shape_of(self, module: str) -> tuple[int, int]:
        return self.shapes[module]

    @classmethod
    def of_engine(cls, engine: Any) -> BaseModelRef:
        """The base model a running engine serves (``model_name``, ``base_digest``, ``spec``)."""
        spec = engine.spec
        return cls(
            name=engine.model_name,
            digest=engine.base_digest,
            num_layers=spec.num_layers,
            vocab_size=spec.vocab_size,
            shapes={module: spec.projection_shape(module) for module in SUPPORTED_TARGETS},
        )
