"""Training one demo adapter with PEFT on the base model (loss on the answer tokens only)."""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.demo.data import Example
from multilora_studio.demo.styles import Style

log = logging.getLogger(__name__)

IGNORE = -100  # label of positions without loss (prompt and padding)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class TrainSettings:
    """How every demo adapter is trained."""

    steps: int = 96
    batch_size: int = 8
    learning_rate: float = 2e-3
    warmup_steps: int = 5
    seed: int = 0
    max_len: int = 160
    save_dtype: str = "float16"


@dataclass(frozen=True)
class TrainResult:
    seconds: float
    first_loss: float
    last_loss: float
    examples: int


def batch_order(examples: Sequence[Example], settings: TrainSettings) -> list[list[int]]:
    """Indices of ``settings.steps`` batches: seeded epochs, similar lengths grouped to save padding."""
    size = settings.batch_size
    if len(examples) < size:
        raise ValueError(f"{len(examples)} training examples are fewer than one batch of {size}")
    rng = random.Random(settings.seed)
    batches: list[list[int]] = []
    while len(batches) < settings.steps:
        order = list(range(len(examples)))
        rng.shuffle(order)
        window = size * 8
        epoch = []
        for start in range(0, len(order) - size + 1, window):
            chunk = sorted(order[start : start + window], key=lambda i: len(examples[i]))
            epoch += [chunk[i : i + size] for i in range(0, len(chunk) - size + 1, size)]
        rng.shuffle(epoch)
        batches += epoch
    return batches[: settings.steps]


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and labels (IGNORE outside the answers)."""
    width = max(len(example) for example in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [batch, width]
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)  # [batch, width]
    mask = torch.zeros((len(examples), width), dtype=torch.long)  # [batch, width]
    for row, example in enumerate(examples):
        prompt, answer = len(example.prompt_ids), len(example.answer_ids)
        ids[row, : prompt + answer] = torch.tensor(example.prompt_ids + example.answer_ids)
        labels[row, prompt : prompt + answer] = torch.tensor(example.answer_ids)
        mask[row, : prompt + answer] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def learning_rate_factor(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to zero."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * progress))


def train_adapter(
    base_dir: Path,
    style: Style,
    examples: Sequence[Example],
    settings: TrainSettings,
    out_dir: Path,
    declared_base: str,
    device: str = "cpu",
) -> TrainResult:
    """Train ``style``'s LoRA on ``examples`` and save it as a PEFT folder in ``out_dir``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(settings.seed)
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(
        r=style.rank,
        lora_alpha=style.alpha,
        target_modules=list(style.targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config).to(device)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, settings))
    pad_id = examples[0].answer_ids[-1]  # EOS; padded positions are masked and carry no loss
    losses: list[float] = []
    start = time.perf_counter()
    for step, indices in enumerate(batch_order(examples, settings)):
        batch = {k: v.to(device) for k, v in collate([examples[i] for i in indices], pad_id).items()}
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 10 == 0 or step == settings.steps - 1:
            log.info(
                "%s step %d/%d loss %.3f (%.0f s)",
                style.name,
                step + 1,
                settings.steps,
                losses[-1],
                time.perf_counter() - start,
            )
    seconds = time.perf_counter() - start
    save_adapter(model, out_dir, declared_base, getattr(torch, settings.save_dtype))
    head, tail = losses[: min(5, len(losses))], losses[-min(5, len(losses)) :]
    return TrainResult(seconds, sum(head) / len(head), sum(tail) / len(tail), len(examples))


def save_adapter(model: Any, out_dir: Path, declared_base: str, dtype: torch.dtype) -> None:
    """Write ``adapter_config.json`` and the LoRA factors as ``dtype`` safetensors."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        name: tensor.detach().to("cpu", dtype).contiguous()
        for name, tensor in get_peft_model_state_dict(model).items()
    }
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    config = copy.copy(model.peft_config["default"])
    config.base_model_name_or_path = declared_base
    config.inference_mode = True
    config.save_pretrained(str(out_dir))
    path = out_dir / CONFIG_FILE  # PEFT keeps target_modules as a set: sorted, for reproducible files
    saved = json.loads(path.read_text())
    saved["target_modules"] = sorted(saved["target_modules"])
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
