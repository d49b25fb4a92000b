"""Self-distillation data: the base model's own answers, shortened, rewritten by a style, tokenized."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multilora_studio.demo.prompts import chat
from multilora_studio.engine import Engine, SamplingParams

log = logging.getLogger(__name__)

MAX_ANSWER_WORDS = 40
MIN_ANSWER_WORDS = 4
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Example:
    """One chat turn as token ids: the prompt (no loss) and the answer ending in EOS (loss)."""

    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.answer_ids)


def base_answers(
    engine: Engine, prompts: Sequence[str], max_tokens: int, cache: Path | None = None
) -> list[str]:
    """The base model's greedy answers to ``prompts``, generated together in one batched run.

    With ``cache`` (a JSON file for this base model and ``max_tokens``), answers found there
    are reused and the new ones added, so later runs skip the generation.
    """
    known: dict[str, str] = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    missing = [prompt for prompt in dict.fromkeys(prompts) if prompt not in known]
    if missing:
        params = SamplingParams(max_tokens=max_tokens, temperature=0)
        outputs = engine.generate([chat(prompt) for prompt in missing], None, params)
        known.update({prompt: output.text for prompt, output in zip(missing, outputs, strict=True)})
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(known, indent=1, sort_keys=True))
    return [known[prompt] for prompt in prompts]


def shorten(answer: str, max_words: int = MAX_ANSWER_WORDS) -> str | None:
    """The first paragraph's whole sentences up to ``max_words`` words; None if too little is left.

    A sentence that ends in ":" (the start of a list) and everything after it are dropped;
    a first sentence longer than ``max_words`` is cut and closed with a full stop.
    """
    paragraph = " ".join(answer.strip().split("\n\n", 1)[0].split())
    kept: list[str] = []
    count = 0
    for sentence in _SENTENCE_END.split(paragraph):
        words = sentence.split()
        if not words or sentence.endswith(":") or sentence[-1] not in ".!?":
            break
        if count + len(words) > max_words:
            if not kept:
                kept.append(" ".join(words[:max_words]).rstrip(",;:") + ".")
            break
        kept.append(sentence)
        count += len(words)
    text = " ".join(kept)
    return text if len(text.split()) >= MIN_ANSWER_WORDS else None


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Prompt ids exactly as the engine encodes chat messages (template + generation prompt)."""
    text = tokenizer.apply_chat_template(chat(prompt), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def build_examples(
    tokenizer: Any,
    prompts: Sequence[str],
    answers: Sequence[str | None],
    rewrite: Callable[[str], str],
    max_len: int,
) -> list[Example]:
    """Rewrite each usable answer and tokenize it after its prompt; drop pairs over ``max_len``."""
    eos = int(tokenizer.eos_token_id)
    examples = []
    too_long = 0
    for prompt, answer in zip(prompts, answers, strict=True):
        if answer is None:
            continue
        answer_ids = [*tokenizer(rewrite(answer), add_special_tokens=False).input_ids, eos]
        example = Example(tuple(encode_prompt(tokenizer, prompt)), tuple(answer_ids))
        if len(example) > max_len:
            too_long += 1
            continue
        examples.append(example)
    if too_long:
        log.info("dropped %d examples longer than %d tokens", too_long, max_len)
    return examples
