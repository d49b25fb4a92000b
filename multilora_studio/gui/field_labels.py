"""Engine setting names in the window's words: the Settings view's labels for EngineConfig's fields.

Messages from the library and the engine name settings by their field names (``max_lora_rank``),
which the command line turns into its flags; the window shows them as the labels a person sees.
"""

from __future__ import annotations

import re

# EngineConfig's field names -> the Settings view's field labels
FIELD_LABELS = {
    "max_loras": "GPU adapter slots",
    "max_lora_rank": "Largest adapter rank",
    "max_cpu_loras": "Adapters kept in CPU RAM",
    "cpu_threads": "CPU threads of the engine",
    "device": "Device",
    "dtype": "Data type",
    "batch_invariant": "Batch-invariant outputs",
    "quantization": "Quantization",
    "model": "Base model",
    "devices": "Engine replicas on",
    "dispatch_margin": "Dispatch margin",
    "max_resident_bases": "Bases loaded at once",
    "keep_alive": "Unload a base idle for",
    "kv_cache_memory_gb": "KV cache per base (GB)",
}


def in_field_labels(message: str, where: str = " in Settings") -> str:
    """``message`` with each setting's field name replaced by its quoted label and ``where``.

    Names with an underscore are replaced wherever they stand (``max_lora_rank=16`` becomes
    ``'Largest adapter rank' in Settings (16)``); plain words only as the subject of ``... must``.
    """
    for field, label in FIELD_LABELS.items():
        if "_" in field:
            message = re.sub(rf"(?<![\w-]){field}=([\w.]+)", rf"'{label}'{where} (\1)", message)
            message = re.sub(rf"(?<![\w'-]){field}(?![\w-])", f"'{label}'{where}", message)
        else:
            message = re.sub(rf"^{field}(?= must )", f"'{label}'", message)
    return message
