"""The same batch workloads through HF transformers + PEFT mixed batches (``adapter_names=``).

One left-padded greedy ``generate`` call per batch; rows without an adapter use PEFT's
``__base__`` name. Every row produces the batch's longest output length, and all those
tokens are counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from multilora_studio.engine.model.model_source import RANDOM_PREFIX, RANDOM_SHAPES, describe_model
from multilora_studio.engine.model.model_spec import ModelSpec

log = logging.getLogger(__name__)
PEFT_BASE = "__base__"


def hf_config(spec: ModelSpec) -> Any:
    """A transformers config of the same shape as ``spec`` (for random-weight baselines)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        spec.model_type,
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        rms_norm_eps=spec.rms_norm_eps,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=spec.rope.theta,
        pad_token_id=0,
    )


def load_hf_model(model: str | None, dtype: torch.dtype, device: torch.device) -> Any:
    """The HF model for ``model`` (a folder, None = embedded, or random:<shape> with random weights)."""
    from transformers import AutoModelForCausalLM

    built: Any
    if model is not None and model.startswith(RANDOM_PREFIX):
        spec = RANDOM_SHAPES[model[len(RANDOM_PREFIX) :]]
        with torch.device(device):
            built = AutoModelForCausalLM.from_config(hf_config(spec), dtype=dtype)
    else:
        folder = describe_model(model).folder
        built = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        built = built.to(device)
    return built.eval()


class PeftBaseline:
    """A PEFT model holding the adapters a workload uses."""

    def __init__(self, model: str | None, dtype: torch.dtype, device: torch.device) -> None:
        self.device = device
        self.base = load_hf_model(model, dtype, device)
        self.model: Any = None
        self.loaded: set[str] = set()

    def load_adapters(self, adapters: dict[str, Path]) -> None:
        from peft import PeftModel

        for name, folder in adapters.items():
            if name in self.loaded:
                continue
            if self.model is None:
                self.model = PeftModel.from_pretrained(self.base, str(folder), adapter_name=name).eval()
            else:
                self.model.load_adapter(str(folder), adapter_name=name)
            self.loaded.add(name)

    def run_batch(
        self, prompts: Sequence[list[int]], adapters: Sequence[str | None], output_lens: Sequence[int]
    ) -> dict[str, float]:
        """One mixed-adapter ``generate``; output tokens, seconds and tokens/s."""
        model = self.model if self.model is not None else self.base
        width = max(len(p) for p in prompts)
        new_tokens = max(output_lens)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        extra = {}
        if self.model is not None:
            extra["adapter_names"] = [PEFT_BASE if a is None else a for a in adapters]
        self._sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                **extra,
            )
        self._sync()
        seconds = time.perf_counter() - start
        tokens = (out.shape[1] - width) * len(prompts)
        return {"output_tokens": tokens, "seconds": seconds, "output_tok_s": tokens / seconds}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.model = self.base = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
