"""The base model adapters are checked against: its identity (name, weights digest) and shapes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multilora_studio.adapters.adapter_config import SUPPORTED_TARGETS
from multilora_studio.adapters.vocab_shape import VocabShape


@dataclass(frozen=True)
class BaseModelRef:
    """What validation and the library need to know about a base model, without its weights.

    ``digest`` identifies the weights (``checkpoint_files.checkpoint_digest``: the SHA-256
    of ``model.safetensors``, or of every shard's name and SHA-256; "" when unknown);
    ``shapes[module] = (out_features, in_features)`` for every LoRA-targetable projection;
    ``hidden_size`` and ``tied_embeddings`` check an adapter's embedding / LM-head tensors;
    ``model_type`` and the head counts place its factors in a GGUF file ("" and 0 when unknown).
    """

    name: str
    digest: str
    num_layers: int
    vocab_size: int
    shapes: Mapping[str, tuple[int, int]]
    hidden_size: int
    tied_embeddings: bool
    model_type: str = ""
    num_heads: int = 0
    num_kv_heads: int = 0

    def shape_of(self, module: str) -> tuple[int, int]:
        return self.shapes[module]

    @property
    def vocab(self) -> VocabShape:
        return VocabShape(self.vocab_size, self.hidden_size, self.tied_embeddings)

    @classmethod
    def of_engine(cls, engine: Any) -> BaseModelRef:
        """The base model a running engine serves (``model_name``, ``base_digest``, ``spec``)."""
        return cls.of_spec(engine.model_name, engine.base_digest, engine.spec)

    @classmethod
    def of_spec(cls, name: str, digest: str, spec: Any) -> BaseModelRef:
        """The base model of a model spec (the engine's ``ModelSpec``) with its name and digest."""
        return cls(
            name=name,
            digest=digest,
            num_layers=spec.num_layers,
            vocab_size=spec.vocab_size,
            shapes={module: spec.projection_shape(module) for module in SUPPORTED_TARGETS},
            hidden_size=spec.hidden_size,
            tied_embeddings=spec.tie_word_embeddings,
            model_type=spec.model_type,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
        )
