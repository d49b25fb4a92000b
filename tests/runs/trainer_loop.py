"""A real LoRA training loop on the tiny model that writes its output folder the way HF Trainer does.

Every ``save_steps`` optimizer steps it writes ``checkpoint-N/`` (the PEFT adapter, then
``trainer_state.json`` last), each file in slow pieces so that a poll can see it half-written;
with ``save_total_limit`` it deletes the oldest checkpoints; at the end it saves the final adapter
and ``trainer_state.json`` in the run folder. ``resume_from`` restarts from a checkpoint: its
weights, its ``log_history`` and its step.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

TEXTS = (
    "Once upon a time there was a cat.",
    "The capital of France is Paris.",
    "Two plus two is four.",
    "The sky is blue today.",
)
CHUNKS = 3  # pieces each file is written in


@dataclass
class TrainerLoop:
    base_dir: Path
    output_dir: Path
    max_steps: int
    save_steps: int
    save_total_limit: int | None = None
    piece_delay_s: float = 0.02  # the pause between a file's pieces
    learning_rate: float = 3e-2
    seed: int = 0
    resume_from: Path | None = None
    stop_after_saves: int | None = None  # stop early (a run that is killed) after this many saves

    def run(self) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(self.seed)
        tokenizer = AutoTokenizer.from_pretrained(str(self.base_dir))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(str(self.base_dir), dtype=torch.float32)
        history: list[dict] = []
        step = 0
        if self.resume_from is not None:
            peft_model = PeftModel.from_pretrained(model, str(self.resume_from), is_trainable=True)
            state = json.loads((self.resume_from / "trainer_state.json").read_text())
            history, step = list(state["log_history"]), state["global_step"]
        else:
            config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
            peft_model = get_peft_model(model, config)
        optimizer = torch.optim.AdamW(
            [p for p in peft_model.parameters() if p.requires_grad], lr=self.learning_rate
        )
        batch = tokenizer(list(TEXTS), return_tensors="pt", padding=True)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        saves = 0
        self.output_dir.mkdir(parents=True, exist_ok=True)
        while step < self.max_steps:
            loss = peft_model(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            history.append({"step": step, "loss": loss.item(), "learning_rate": self.learning_rate})
            if step % self.save_steps == 0:
                history.append({"step": step, "eval_loss": loss.item() + 0.1})
                self._save(peft_model, self.output_dir / f"checkpoint-{step}", step, history)
                self._rotate()
                saves += 1
                if self.stop_after_saves is not None and saves >= self.stop_after_saves:
                    return
        self._save(peft_model, self.output_dir, step, history)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="trainer-loop", daemon=True)
        thread.start()
        return thread

    def _save(self, model, target: Path, step: int, history: list[dict]) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            model.save_pretrained(scratch, safe_serialization=True)
            target.mkdir(parents=True, exist_ok=True)
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                self._write_slowly(target / name, (Path(scratch) / name).read_bytes())
        state = {"global_step": step, "log_history": history, "max_steps": self.max_steps}
        self._write_slowly(target / "trainer_state.json", json.dumps(state).encode())

    def _write_slowly(self, path: Path, data: bytes) -> None:
        piece = max(1, len(data) // CHUNKS + 1)
        with path.open("wb") as handle:
            for begin in range(0, len(data), piece):
                handle.write(data[begin : begin + piece])
                handle.flush()
                time.sleep(self.piece_delay_s)

    def _rotate(self) -> None:
        if self.save_total_limit is None:
            return
        folders = sorted(self.output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for old in folders[: max(0, len(folders) - self.save_total_limit)]:
            shutil.rmtree(old)
