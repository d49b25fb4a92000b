"""Reference outputs from HF transformers + PEFT (the implementation our engine must match)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch


def greedy_tokens(model, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation by full forward passes (no cache, no stopping at EOS)."""
    ids = torch.tensor([prompt_ids], device=model.device)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=ids).logits[0, -1]
            token = int(logits.argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]], device=ids.device)], dim=1)
    return out


class PeftReference:
    """The base model and each adapter through HF + PEFT, loaded once (float32 on the CPU unless
    told), with transformers' eager attention: the model's own math in every version (its SDPA
    path drops Gemma 2's attention soft-cap in some)."""

    def __init__(
        self,
        base_dir: Path,
        adapters: dict[str, Path],
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
    ) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype, attn_implementation="eager")
        base = base.to(device).eval()
        self.base = base
        names = list(adapters)
        self.model = PeftModel.from_pretrained(base, str(adapters[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            self.model.load_adapter(str(adapters[name]), adapter_name=name)
        self.model.eval()

    @contextmanager
    def strength(self, adapter: str, factor: float) -> Iterator[None]:
        """The adapter with every layer's PEFT ``scaling`` (alpha / r) multiplied by ``factor``."""
        layers = [
            m
            for m in self.model.modules()
            if isinstance(getattr(m, "scaling", None), dict) and adapter in m.scaling
        ]
        if not layers:
            raise ValueError(f"no PEFT layer of adapter {adapter!r}")
        saved = [m.scaling[adapter] for m in layers]
        for module in layers:
            module.scaling[adapter] *= factor
        try:
            yield
        finally:
            for module, value in zip(layers, saved, strict=True):
                module.scaling[adapter] = value

    def greedy(
        self, adapter: str | None, prompt_ids: list[int], new_tokens: int, adapter_scale: float = 1.0
    ) -> list[int]:
        if adapter is None:
            with self.model.disable_adapter():
                return greedy_tokens(self.model, prompt_ids, new_tokens)
        self.model.set_adapter(adapter)
        with self.strength(adapter, adapter_scale):
            return greedy_tokens(self.model, prompt_ids, new_tokens)

    def logprobs(self, adapter: str | None, ids: list[int], adapter_scale: float = 1.0) -> torch.Tensor:
        """[len(ids), V] float32: log_softmax of the logits at every position of ``ids``."""
        batch = torch.tensor([ids], device=self.model.device)
        with torch.no_grad():
            if adapter is None:
                with self.model.disable_adapter():
                    logits = self.model(input_ids=batch).logits[0]
            else:
                self.model.set_adapter(adapter)
                with self.strength(adapter, adapter_scale):
                    logits = self.model(input_ids=batch).logits[0]
        return torch.log_softmax(logits.float(), dim=-1).cpu()

    def generated(
        self, adapter: str | None, prompt_ids: list[int], new_tokens: int
    ) -> tuple[list[int], torch.Tensor]:
        """PEFT's own ``generate`` (greedy, with its KV cache, no stop at EOS): the new tokens and
        each step's log_softmax [new_tokens, V] float32. An activated LoRA (aLoRA) applies where
        PEFT's generate places it."""
        ids = torch.tensor([prompt_ids], device=self.model.device)
        settings = dict(
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with torch.no_grad():
            if adapter is None:
                with self.model.disable_adapter():
                    out = self.model.generate(input_ids=ids, **settings)
            else:
                self.model.set_adapter(adapter)
                out = self.model.generate(input_ids=ids, **settings)
        logits = torch.stack(out.logits)[:, 0].float()  # [new_tokens, V]
        return out.sequences[0, len(prompt_ids) :].tolist(), torch.log_softmax(logits, dim=-1).cpu()
