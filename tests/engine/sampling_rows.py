"""Sampling batches for the tests: one row per parameters, with its history, stream and EOS."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from multilora_studio.engine.sampling.sampling_batch import SamplingBatch, SamplingRow
from multilora_studio.engine.sampling_params import SamplingParams


def batch_of(
    params: Sequence[SamplingParams],
    histories: Sequence[tuple[list[int], list[int]]] | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
    eos: Sequence[int] = (),
) -> SamplingBatch:
    """Rows of ``params`` with their (prompt, output) ``histories`` (none: empty) and
    ``generators`` (none: greedy only), every row with the EOS tokens ``eos``."""
    histories = histories if histories is not None else [([], [])] * len(params)
    generators = generators if generators is not None else [None] * len(params)
    rows = [
        SamplingRow(p, generator, prompt, output, eos)
        for p, (prompt, output), generator in zip(params, histories, generators, strict=True)
    ]
    return SamplingBatch(rows)
