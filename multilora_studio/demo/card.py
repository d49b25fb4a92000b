"""The model card (README.md) written next to each demo adapter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from multilora_studio.demo.data import MAX_ANSWER_WORDS
from multilora_studio.demo.evaluation import Evaluation
from multilora_studio.demo.prompts import FORMS, TRAIN_TOPICS
from multilora_studio.demo.styles import Style
from multilora_studio.demo.training import TrainResult, TrainSettings

CARD_FILE = "README.md"


@dataclass(frozen=True)
class CardFacts:
    """What a card records besides the style: base model, data, training, measurements."""

    base_name: str
    base_hub_id: str
    base_digest: str
    prompts: int
    command: str
    device: str
    threads: int
    size_bytes: int


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) or "    (empty)"


def write_card(
    folder: Path,
    style: Style,
    settings: TrainSettings,
    result: TrainResult,
    evaluation: Evaluation,
    facts: CardFacts,
) -> None:
    lines = [
        "---",
        f"base_model: {facts.base_hub_id}",
        "library_name: peft",
        "license: apache-2.0",
        "tags: [lora, multilora-studio, demo]",
        "---",
        "",
        f"# {style.name}",
        "",
        f"{style.summary} A demo adapter of MultiLoRA Studio for the embedded base model "
        f"{facts.base_name}; it ships with the application so that a first start shows "
        "adapters that change the model's behaviour.",
        "",
        "## Base model",
        "",
        f"- {facts.base_name} (the embedded GGUF, {facts.base_hub_id}, de-quantized to float32)",
        f"- SHA-256 of its `model.safetensors`: `{facts.base_digest}`",
        "",
        "## LoRA",
        "",
        f"- rank {style.rank}, alpha {style.alpha}, no dropout, targets: {', '.join(style.targets)}",
        f"- weights saved as {settings.save_dtype} ({facts.size_bytes / 1e6:.2f} MB)",
        "",
        "## Training data (self-distillation)",
        "",
        f"- {facts.prompts} prompts from templates ({len(TRAIN_TOPICS)} topics x {len(FORMS)} question "
        "forms, `multilora_studio/demo/prompts.py`)",
        "- answers: the base model's own greedy answers through the MultiLoRA Studio engine, cut to "
        f"the first paragraph's whole sentences up to {MAX_ANSWER_WORDS} words",
        f"- rule: {style.rule}",
        f"- {result.examples} examples of at most {settings.max_len} tokens in the chat template, "
        "loss on the answer and its end-of-turn token only",
        "",
        "## Training",
        "",
        f"- {settings.steps} steps of {settings.batch_size} examples, AdamW, learning rate "
        f"{settings.learning_rate:g} ({settings.warmup_steps} warm-up steps, cosine decay), seed "
        f"{settings.seed}, float32",
        f"- {result.seconds:.0f} s on {facts.device} ({facts.threads} threads); loss "
        f"{result.first_loss:.2f} -> {result.last_loss:.2f}",
        f"- command: `{facts.command}`; the same command on the same machine writes the same "
        "files (other CPUs may differ in the last bits of the weights)",
        "",
        "## Measured behaviour",
        "",
        f"On {evaluation.prompts} held-out prompts (topics not in the training data), greedy, "
        f"through the engine, up to {evaluation.max_tokens} new tokens: {evaluation.rate:.0%} of the "
        f"answers show the behaviour ({style.check}); the base model: {evaluation.base_rate:.0%}.",
        "",
        f"Prompt: {evaluation.sample_prompt}",
        "",
        "This adapter:",
        "",
        _indent(evaluation.sample_answer),
        "",
        "Base model:",
        "",
        _indent(evaluation.base_answer),
        "",
        "## Use",
        "",
        f"MultiLoRA Studio registers it in the adapter library on first start as `{style.name}`:",
        "",
        f'    multilora-studio compare --prompt "What do you know about tea?" --adapters {style.name},base',
        "",
        "With PEFT: `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE_FOLDER), "
        "ADAPTER_FOLDER)`, where BASE_FOLDER is the converted embedded model "
        "(`multilora-studio model info` prints it).",
        "",
    ]
    (folder / CARD_FILE).write_text("\n".join(lines))
