"""Where an activated LoRA (aLoRA) starts applying in a request, by PEFT's rule.

PEFT (``tuners/lora/variants.py``, ``calculate_alora_offsets`` and ``ALoraLinearVariant``)
applies an aLoRA adapter from the start of the last occurrence of its invocation tokens in the
prompt on, the invocation included, and to every generated token; the positions before run as
the base model, so their KV is the base's. A prompt without the invocation runs the base model
throughout, generated tokens included.
"""

from __future__ import annotations

import sys

# Sequence.adapter_start of an aLoRA request whose prompt lacks the invocation: beyond any position
NEVER = sys.maxsize


def adapter_start(prompt: list[int], invocation: tuple[int, ...]) -> int:
    """The first position of ``prompt``'s request that its adapter applies to: 0 without an
    ``invocation`` (plain LoRA, or the base), else where the invocation's last occurrence starts;
    ``NEVER`` when the prompt lacks it."""
    if not invocation:
        return 0
    width, first, target = len(invocation), invocation[0], list(invocation)
    for start in range(len(prompt) - width, -1, -1):
        if prompt[start] == first and prompt[start : start + width] == target:
            return start
    return NEVER
