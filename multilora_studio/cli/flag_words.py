"""Error messages in the words the user typed: option fields (EngineConfig, SamplingParams, ...) as flags.

The engine raises ValueErrors that name its fields (``max_loras must be ...``); the command
line says the same with the flag (``--max-loras must be ...``) and marks a value the user
did not type as the default, so that ``max_cpu_loras (1) must be >= max_loras (8)`` reads
``--max-cpu-loras (1) must be >= --max-loras (8, the default)``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

# field name -> the flag that sets it (a field is translated only where the command has its flag)
FLAGS = {
    "max_loras": "--max-loras",
    "max_lora_rank": "--max-lora-rank",
    "max_cpu_loras": "--max-cpu-loras",
    "cpu_lora_memory_fraction": "--cpu-lora-memory-fraction",
    "max_model_len": "--max-model-len",
    "max_token_tables": "--max-token-tables",
    "token_table_memory_gb": "--token-table-gb",
    "cpu_threads": "--cpu-threads",
    "max_num_seqs": "--max-num-seqs",
    "kv_cache_memory_gb": "--kv-cache-gb",
    "adapter_loader": "--adapter-loader",
    "adapter_load_workers": "--load-workers",
    "device": "--device",
    "dtype": "--dtype",
    "model": "--model",
    "max_tokens": "--max-tokens",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "seed": "--seed",
    "replicas": "--replicas",  # RayServeOptions
    "devices": "--devices",  # deploy.parse_devices
}


def typed_flags(argv: Sequence[str]) -> set[str]:
    """The long flags in a command line, with or without ``=VALUE``."""
    return {item.partition("=")[0] for item in argv if item.startswith("--")}


def in_flag_words(message: str, args: argparse.Namespace, typed: set[str]) -> str:
    """``message`` with each field name the command has a flag for replaced by that flag.

    Names with an underscore are replaced wherever they stand; plain words (``device``,
    ``model``) only as the subject of ``... must be``, so prose keeps its words. A value
    next to a flag the user did not type, ``--max-loras (8)`` or ``--max-lora-rank=16``, is
    marked as the default. Where the command takes ``--name``, a name the library refuses
    points at it.
    """
    if getattr(args, "name_flag", False):
        message = message.replace("choose another name", "choose another with --name")
    for field, flag in FLAGS.items():
        if not hasattr(args, flag[2:].replace("-", "_")):
            continue
        word = rf"(?<![\w-]){field}(?![\w-])" if "_" in field else rf"(?<![\w-]){field}(?= must )"
        message = re.sub(word, flag, message)
        if not any(flag.startswith(item) for item in typed):  # argparse takes unique prefixes
            message = re.sub(rf"{flag} \(([^(),]+)\)", rf"{flag} (\1, the default)", message)
            message = re.sub(rf"{flag}=([\w.]+)", rf"{flag}=\1 (the default)", message)
    return message
