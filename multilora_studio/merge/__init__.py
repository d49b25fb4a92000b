"""Merging adapters into their base and combining adapters with weights (no Qt, no HTTP)."""

from multilora_studio.merge.export import (
    OUTPUT_DTYPES,
    MergeCancelled,
    MergedModel,
    MergeRequest,
    merge_and_export,
    parse_shard_size,
)
from multilora_studio.merge.merged_weights import MergeError
from multilora_studio.merge.model_card import AdapterSource, BaseSource
from multilora_studio.merge.weighted_adapters import COMBINATIONS, combine_adapters

__all__ = [
    "COMBINATIONS",
    "OUTPUT_DTYPES",
    "AdapterSource",
    "BaseSource",
    "MergeCancelled",
    "MergeError",
    "MergeRequest",
    "MergedModel",
    "combine_adapters",
    "merge_and_export",
    "parse_shard_size",
]
