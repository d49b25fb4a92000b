"""What the sampling rows of one step need: each row's parameters, random stream and tokens so
far (``SamplingRow``), gathered once per step with the rows' grammar masks (``SamplingBatch``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from multilora_studio.engine.sampling.grammar import DeviceMasks
from multilora_studio.engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One request's sampling data, made once when it is added.

    The token lists are the request's own: its output list grows as tokens are appended, so
    a step always sees the history so far (for penalties, bans and ``min_tokens``).
    """

    params: SamplingParams
    generator: torch.Generator | None  # None for greedy
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    eos_token_ids: Sequence[int]  # banned before ``min_tokens`` (the base's and the adapter's)


@dataclass(frozen=True)
class SamplingBatch:
    """The sampling rows of one step, in the order of the logits' rows."""

    rows: Sequence[SamplingRow]
    masks: DeviceMasks | None = None  # the token masks of the rows under a grammar
