"""How far an adapter's (or a base's) next-token distributions move when its base is served
quantized: each of a fixed set of texts, cut at four points, is scored by the float base and by
the quantized one, and the two distributions at each cut are compared: the mean KL divergence
(float || quantized, in nats) and how often both put the same token first.

The quantized base is the float checkpoint quantized at load (``fp8``, ``int4``) or a quantized
checkpoint of the same model (AWQ, GPTQ, FP8); each base is loaded in turn, so the GPU never
holds both.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multilora_studio.engine import EngineConfig
from multilora_studio.engine.step.next_token_logits import next_token_logits

__all__ = ["DRIFT_TEXTS", "Drift", "drift_positions", "measure_drift"]

DRIFT_TEXTS = (
    "The river rose through the night, and by morning the low fields along its banks were under water.",
    "To reverse a linked list in place, walk it once while pointing each node back at the one before it.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the chloroplasts.",
    "Dear team, the release is moved to Thursday so that the last migration can be tested on staging.",
    "In 1969 two astronauts walked on the Moon while a third orbited above them in the command module.",
    "A good espresso needs finely ground beans, water just below boiling and about nine bars of pressure.",
    "The function returns None when the key is missing, so callers must check before using the result.",
    "Interest compounds: a balance that grows five percent a year doubles in a little over fourteen years.",
    "She tuned the violin, lifted the bow and played the opening bars of the sonata from memory.",
    "Vaccines train the immune system to recognise a pathogen without causing the disease itself.",
    "SELECT name, count(*) FROM orders GROUP BY name HAVING count(*) > 10 ORDER BY 2 DESC;",
    "The museum opens at nine on weekdays and at ten on Sundays; it is closed on public holidays.",
    "Glaciers carve U-shaped valleys, leaving moraines of rock and gravel where their ice finally melts.",
    "Translate into French: the cat sleeps on the warm windowsill while the rain falls outside.",
    "A binary search halves the interval at every step, so a million sorted items take twenty comparisons.",
    "The committee approved the budget after a long debate about the cost of repairing the old bridge.",
)
CUTS = (0.25, 0.5, 0.75, 1.0)  # where each text is cut: the next token after each prefix is scored


@dataclass(frozen=True)
class Drift:
    """The quantized base's next-token distributions against the float base's."""

    mean_kl: float  # nats, KL(float || quantized) averaged over the positions
    top1_agreement: float  # the share of positions where both put the same token first
    positions: int

    def describe(self) -> str:
        return (
            f"mean KL {self.mean_kl:.4f} nats, top-1 agreement {self.top1_agreement:.1%} "
            f"over {self.positions} positions"
        )


def drift_positions(token_ids: list[list[int]]) -> list[list[int]]:
    """Every text's prefixes at ``CUTS`` of its length (at least two tokens each)."""
    return [ids[: max(2, round(len(ids) * cut))] for ids in token_ids for cut in CUTS]


def compare(reference: torch.Tensor, other: torch.Tensor) -> Drift:
    """Two sets of logits [P, V] at the same positions -> their ``Drift``."""
    p = torch.log_softmax(reference.double(), dim=-1)  # [P, V]
    q = torch.log_softmax(other.double(), dim=-1)
    kl = (p.exp() * (p - q)).sum(-1)  # [P]
    agree = (p.argmax(-1) == q.argmax(-1)).double().mean()
    return Drift(float(kl.mean()), float(agree), int(p.shape[0]))


def measure_drift(
    float_config: EngineConfig, quantized_config: EngineConfig, tokenizer: Any, adapter: Path | None = None
) -> Drift:
    """The ``Drift`` of ``adapter`` (None: the base alone) from the base of ``float_config`` to the
    quantized one of ``quantized_config`` over ``DRIFT_TEXTS`` (tokenized by ``tokenizer``)."""
    prompts = drift_positions([tokenizer.encode(text) for text in DRIFT_TEXTS])
    logits = []
    for config in (float_config, quantized_config):
        logits.append(next_token_logits(dataclasses.replace(config, max_loras=1), prompts, adapter))
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return compare(*logits)
